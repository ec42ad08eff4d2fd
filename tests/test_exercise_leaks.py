"""An answer the chapter already prints is not an exercise (issue 25).

For every numeric exercise (a :class:`NumericExercise`, or a
:class:`VariedNumericExercise` with its own ``params``: the exercise as the chapter
states it), the reference answer must not appear among the numbers its own chapter's
stored outputs print (``notebooks/NN_*.ipynb``, the code cells' stream text and
text/plain results). A printed number counts when it has at least 3 significant digits;
it matches when it equals the reference, both rounded to 3 significant figures, at one of
the unit scales a chapter prints: x1; kilo, mega, giga, tera; milli, micro, nano, pico;
and x100 for a number printed as a percentage (followed by %). Cells tagged
``nbval-ignore-output`` print timings of the machine that ran them, different on every
run: they are left out.

A match that is a coincidence (another quantity that happens to share 3 digits: a toy
program's count, an input of a different calculation) is allowed only in ``ALLOWED``,
by exercise, printed number and a piece of its line, with the reason, each checked by
hand.

An answer one obvious step from a printed number (the same bill from printed days, the
same run in other units) is a leak too, but not one digits can find: those found by hand
have a test in their chapter's file (6.10: tests/test_exercises_ch06.py).
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path

import pytest

from scalebook.exercises import chapter_ids, get_exercise
from scalebook.exercises.core import _chapters
from scalebook.exercises.kinds import NumericExercise

ROOT = Path(__file__).resolve().parents[1]
MIN_DIGITS = 3
# scale -> what a printed number is at that scale (the reference times the scale)
SCALES = {1: "as is", 1e3: "x1e3 (k, or ms from s)", 1e6: "x1e6", 1e9: "x1e9",
          1e12: "x1e12", 1e-3: "x1e-3 (kB from bytes, ...)", 1e-6: "x1e-6 (MB from bytes)",
          1e-9: "x1e-9 (GB from bytes)", 1e-12: "x1e-12 (TB from bytes)",
          100: "x100 (a percentage: only a number printed with %)"}
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?")

# (exercise, printed number as printed, a piece of its line) -> why it is not the answer.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("4.14", "1.27e8", "XLA 1.27e8"):
        "section 4.5's toy LLaMA (2 x 64 tokens): XLA's count of its forward FLOPs, not an "
        "MoE's active parameters (1.27e11)",
    ("4.15", "13.4", "attention share at S=8192"):
        "70B's attention share of the forward FLOPs at 8K (13.4%), not the 13.4 MB of "
        "values the weight_dots policy keeps per token",
    ("5.6", "135", "TPU v5e"):
        "the v5e's FSDP x TP critical batch in tokens per chip (the 2D max column), not a "
        "count of pipeline microbatches",
    ("6.6", "190.1", "llama3-8b"):
        "8B's training days at 40% MFU on 256 v5p chips, read as thousandths; the answer "
        "is a bubble fraction, 0.19",
    ("6.1", "4.67", "(DualPipe)"):
        "DeepSeek-V3's DualPipe fill and drain in section 6.3, 4.67 pass pairs, read as "
        "thousands; the answer is a count of chips, 4,672",
    ("7.9", "1.98", "pages"):
        "the paged-admission simulation's median time to first token (1.98 s), not a "
        "speculative-decoding speed-up",
    ("7.14", "1.57", "(1 x 4)"):
        "bytes per chip the weight-stationary layouts move at n = 4 (1.57 MB), not a "
        "multi-token-prediction speed-up",
    ("7.15", "19.8", "tpu-v6e"):
        "70B's time to first token for a 2K prompt on 16 v6e chips, not 8B's "
        "chunked-prefill step on one H100 (both 19.8 ms)",
    ("8.2", "193.9", "tpu-v6e"):
        "tokens/s per chip of 70B in bf16 on 8 v6e chips, read as thousands; the answer "
        "is 405B's cache bytes per token",
    ("8.3", "15.8", "3.50"):
        "DeepSeek-V3's expected experts hit by a batch of 2 (15.8 of 256), read as ms; the "
        "answer is a decode step's memory time",
    ("2.14", "28672", "useful fraction"):
        "70B's d_ff (28,672) in the useful-fraction lines, not the 28,688 tokens of the "
        "answer",
    ("8.15", "13.4", "18.59"):
        "70B's step time on 16 v5e chips at batch 4 (13.4 ms), not the time a prompt's "
        "int8 cache takes over the DCN, which happens to be 13.4 ms too",
}

# Checked by hand and not matched (their answers have fewer than 3 significant digits):
# 2.5 (11 hops on a v5e 4x16; the chapter prints 4x4's and 16x16's diameters, not 4x16's)
# and 2.12 (1.6e-5 s; the chapter prints 1.2 and 30.2 µs for 1 and 30 hops of 10 kB).
# 1.11 (123 x) and 3.8 (10.5 ms) match only if any number x100 counted, not only a
# percentage: "1.23e4 bytes" and "1.05 MB" are coincidences.


def _sig_digits(token: str) -> int:
    mantissa = re.split(r"[eE]", token.replace(",", "").lstrip("+-"))[0]
    digits = mantissa.replace(".", "").lstrip("0")
    if "." not in mantissa:          # 8,192 has 4; 16,000 has 2; 16.0 has 3
        digits = digits.rstrip("0")
    return len(digits)


def _sig3(x: float) -> float:
    return float(f"{abs(x):.3g}")


def _text(x) -> str:
    return "".join(x) if isinstance(x, list) else (x or "")


def numbers_in(line: str) -> list[tuple[float, str, bool]]:
    """(the number to 3 significant figures, as printed, whether a % follows it) for every
    number of at least MIN_DIGITS significant digits in one printed line."""
    found = []
    for m in _NUMBER.finditer(line):
        token = m.group(0)
        if _sig_digits(token) >= MIN_DIGITS:
            percent = line[m.end():].lstrip().startswith("%")
            found.append((_sig3(float(token.replace(",", ""))), token, percent))
    return found


def _same_to_3(x: float, value: float) -> bool:
    """Whether x rounds to value (a number with 3 significant figures); a tie counts, so
    that 81.25 matches both 81.2 and 81.3, whichever way it was printed."""
    if value == 0:
        return False
    half = 0.5 * 10 ** (math.floor(math.log10(value)) - 2)
    return abs(abs(x) - value) <= half * (1 + 1e-9)


def scales_matching(ref: float, value: float, percent: bool) -> list[float]:
    """The scales at which a printed number (3 significant figures) is the answer ref."""
    return [scale for scale in SCALES
            if ref != 0 and _same_to_3(ref * scale, value) and (scale != 100 or percent)]


@lru_cache(maxsize=None)
def printed_lines(chapter: int) -> tuple[str, ...]:
    """The lines the chapter's code cells print (timed cells left out)."""
    (nb,) = (ROOT / "notebooks").glob(f"{chapter:02d}_*.ipynb")
    lines = []
    for cell in json.loads(nb.read_text())["cells"]:
        if cell["cell_type"] != "code" or \
                "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue
        for out in cell.get("outputs", []):
            text = _text(out.get("text")) + _text(out.get("data", {}).get("text/plain"))
            lines += [line.strip() for line in text.splitlines()]
    return tuple(lines)


def matches(ex_id: str) -> list[tuple[str, str, str]]:
    """(printed number, its line, the scale) where the chapter prints ex_id's answer."""
    ref = float(get_exercise(ex_id).reference())
    return [(token, line, SCALES[scale])
            for line in printed_lines(int(ex_id.split(".")[0]))
            for value, token, percent in numbers_in(line)
            for scale in scales_matching(ref, value, percent)]


def _numeric():
    return [i for ch in _chapters() for i in chapter_ids(ch)
            if isinstance(get_exercise(i), NumericExercise)]


def _allowed(ex_id, token, line):
    return any(e == ex_id and t == token and piece in line for e, t, piece in ALLOWED)


@pytest.mark.parametrize("ex_id", _numeric())
def test_the_chapter_does_not_print_the_answer(ex_id):
    leaks = [f"  {token} ({words}) in: {line[:90]}" for token, line, words in matches(ex_id)
             if not _allowed(ex_id, token, line)]
    assert not leaks, (f"exercise {ex_id}'s answer {float(get_exercise(ex_id).reference()):.4g}"
                       f" is printed in its chapter:\n" + "\n".join(leaks))


def test_allowed_coincidences_still_occur_and_say_why():
    """An allow-list entry that no longer matches is stale: remove it."""
    for (ex_id, token, piece), why in ALLOWED.items():
        assert any(t == token and piece in line for t, line, _ in matches(ex_id)), \
            f"stale allow-list entry {ex_id} {token!r} ({piece!r}): remove it"
        assert len(why.split()) >= 6, f"say why {ex_id}'s {token} is a coincidence"


def test_the_matcher_finds_planted_answers_and_only_them():
    """The check itself: 3 significant figures at a printed scale, not fewer digits."""
    assert _sig_digits("8,192") == 4 and _sig_digits("16,000") == 2
    assert _sig_digits("1.00") == 3 and _sig_digits("0.05") == 1
    assert _sig_digits("2.39e+13") == 3 and _sig_digits("0.0125") == 3

    def found(ref, line):
        return [(token, SCALES[s]) for value, token, percent in numbers_in(line)
                for s in scales_matching(ref, value, percent)]

    assert found(1.129e12, "total             1.13 TB  = 16 bytes/parameter") == \
        [("1.13", SCALES[1e-12])]
    assert found(0.8125, "llama3-405b    405,853,388,800   17.7%  81.3%") == \
        [("81.3", SCALES[100])]
    assert found(0.8125, "81.3 ms") == []                    # x100 only for a percentage
    assert found(0.5879, "PCIe 588 ms, DCN 2.82 s") == [("588", SCALES[1e3])]
    assert found(7880, "D >= 7,880") == [("7,880", SCALES[1])]
    assert found(16_000, "16,000 tokens") == []               # 2 significant digits
    assert found(512, "tiles 128x512 on tpu-v5e") == []        # part of a word: not read
