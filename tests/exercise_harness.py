"""The right/wrong harness every tests/test_exercises_chNN.py uses.

A chapter's test file states its cases as data and calls :func:`standard_tests`::

    RIGHT = {"5.1": 1.23e-3, ...}                     # worked by hand in the test file
    WRONG = {"5.1": [2.46e-3, ...], ...}              # typical mistakes: rejected
    HINTS = {"5.1": [(2.46e-3, "factor of 2"), ...]}  # a mistake -> words its hint must contain
    globals().update(standard_tests(5, RIGHT, WRONG, HINTS))

and gets, for the chapter:

* every RIGHT answer accepted, and the numeric ones also when off by 0.9 x the tolerance,
  and rejected when off by 1.1 x the tolerance (both directions);
* every WRONG answer rejected with a hint (not a bare "wrong");
* every HINTS case rejected with the message containing the given words (so a specific hint
  wins over the generic ones) -- and, with ``all_hints=True``, every hint an exercise defines
  reached by at least one case;
* ``...`` reported as not attempted and malformed answers (a string, None, NaN, a list, a
  bool) answered with a message, never an exception, for every exercise of the chapter.

Code and mesh-program exercises are tested in each chapter file on several shapes; the
harness covers what all exercises share.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

import pytest

from scalebook.exercises import NumericExercise, chapter_ids, evaluate, get_exercise
from scalebook.exercises.core import draw_variant
from scalebook.exercises.kinds import (VariedNumericExercise, _is_dimensionless,
                                       _is_size_unit)

MALFORMED = ["0.0012", None, [1, 2], float("nan"), True, {"a": 1}]


def _tolerance_cases(right):
    cases = []
    for ex, answer in sorted(right.items()):
        e = get_exercise(ex)
        if isinstance(e, NumericExercise) and not e.integer and isinstance(answer, (int, float)):
            cases.append((ex, float(answer), e.rtol))
    return cases


def standard_tests(chapter: int, right: dict, wrong: dict, hints: dict | None = None,
                   all_hints: bool = False) -> dict:
    """Test functions for a chapter's exercise checks; put them in the module's globals."""
    hints = hints or {}
    ids = chapter_ids(chapter)
    for ex in list(right) + list(wrong) + list(hints):
        assert ex in ids, f"exercise {ex} is not registered for chapter {chapter}"

    @pytest.mark.parametrize("ex", sorted(right))
    def test_right_answers_are_accepted(ex):
        r = evaluate(ex, right[ex])
        assert r.correct, r

    @pytest.mark.parametrize("ex,answer,rtol", _tolerance_cases(right))
    def test_tolerance_boundary(ex, answer, rtol):
        # The reference, not the hand-worked answer, sets the band; the hand answer is within it.
        ref = float(get_exercise(ex).reference())
        assert math.isclose(answer, ref, rel_tol=rtol), f"hand-worked {answer} vs check {ref}"
        for factor in (1 + 0.9 * rtol, 1 - 0.9 * rtol):
            assert evaluate(ex, ref * factor).correct, (ex, factor)
        for factor in (1 + 1.1 * rtol, 1 - 1.1 * rtol):
            r = evaluate(ex, ref * factor)
            assert not r.correct, (ex, factor, r)

    @pytest.mark.parametrize("ex,answer", [(ex, a) for ex, answers in sorted(wrong.items())
                                           for a in answers])
    def test_wrong_answers_are_rejected_with_a_hint(ex, answer):
        r = evaluate(ex, answer)
        assert r.status == "wrong", r
        assert r.message.startswith("not yet"), r

    @pytest.mark.parametrize("ex,answer,words", [(ex, a, w) for ex, cases in sorted(hints.items())
                                                 for a, w in cases])
    def test_specific_hints(ex, answer, words):
        r = evaluate(ex, answer)
        assert r.status == "wrong" and words in r.message, r

    @pytest.mark.parametrize("ex", ids)
    def test_ellipsis_is_not_attempted(ex):
        assert evaluate(ex, ...).status == "not attempted"

    @pytest.mark.parametrize("ex", ids)
    @pytest.mark.parametrize("bad", MALFORMED, ids=repr)
    def test_malformed_answers_get_a_message(ex, bad):
        r = evaluate(ex, bad)
        assert r.status in ("wrong", "not attempted") and r.message, r
        assert "could not check" not in r.message, r

    tests = {f.__name__: f for f in (
        test_right_answers_are_accepted, test_tolerance_boundary,
        test_wrong_answers_are_rejected_with_a_hint, test_specific_hints,
        test_ellipsis_is_not_attempted, test_malformed_answers_get_a_message)}

    if all_hints:
        @pytest.mark.parametrize("ex", [e for e in ids if getattr(get_exercise(e), "hints", None)
                                        and isinstance(get_exercise(e), NumericExercise)])
        def test_every_hint_is_reached(ex):
            messages = {m for _, m in get_exercise(ex).hints}
            reached = {m for m in messages for answer, _ in hints.get(ex, [])
                       if m in evaluate(ex, answer).message}
            assert reached == messages, f"hints never reached: {messages - reached}"
        tests["test_every_hint_is_reached"] = test_every_hint_is_reached
    pitfalls = {ex: [a for a in [*wrong.get(ex, []), *(a for a, _ in hints.get(ex, []))]
                     if isinstance(a, (int, float)) and not isinstance(a, bool)]
                for ex in set(wrong) | set(hints)
                if isinstance(get_exercise(ex), NumericExercise)}
    tests.update(slip_battery_tests(chapter, pitfalls))
    return tests


# --------------------------------------------------------------------------------------
# The standard slip battery (issue 25). Every numeric exercise's reference, with its own
# numbers and with the variants of a few students, times each typical slip that applies
# to it: x2 and x1/2; x1000 and x1/1000 (a unit prefix); the ring factor (n - 1)/n
# dropped or added, for the group sizes n of the collectives the exercise declares
# (``ring``); x n and x 1/n for the chips it declares (``chips``: per chip vs the whole
# slice); for sizes GB vs GiB and kB vs KiB (1.024**3 and 1.024, both ways) and bits vs
# bytes (x8, x1/8, also for bandwidths); for a fraction, or a ratio up to 10, the
# percentage (x100). A whole-number answer slips to the nearest whole number. A slip the
# check cannot see (inside the tolerance, or rounding to the answer itself) is skipped.
# Every other slip must be rejected, and its message is "own" (one of the exercise's
# hints), "generic" (a generic hint naming a factor, a unit, a prefix, the ring factor,
# the chips or a percentage) or "unspecific" (only too large / too small / far off). A
# generic hint that names another slip than the one made ("misnamed") fails the test, and
# so does an exercise's own hint reached by a unit slip (GB/GiB, kB/KiB, bits/bytes) that
# does not name the unit too (4.15's head, 1.0215x, once took the KiB slip's 1.024x). A
# chapter's known pitfalls (its test file's WRONG and HINTS answers) are run through the
# same classification. tests/test_slip_battery.py asserts the share of specific messages
# over all chapters; tests/conftest.py prints the table at the end of a run, and
# ``tasks.py bench`` too.

BATTERY_SECRET = "scalebook slip battery"
BATTERY_STUDENTS = tuple(f"student-{i}" for i in range(5))
MIN_SPECIFIC_SHARE = 0.60
OUTCOMES = ("own", "generic", "unspecific", "other", "accepted", "misnamed", "skipped")

# Generic messages (kinds.py) that name a slip, and those that do not.
_NAMING = re.compile(r"^(about \d+x too (large|small)|\de\+\d\dx too (large|small)|"
                     r"off by a binary/decimal prefix|.*the ring factor|"
                     r".*the number of chips|.*looks like a percentage|"
                     r"that is the answer rounded to)")
_UNSPECIFIC = re.compile(r"^(too (large|small)|the sign or the size is far off|"
                         r"expected a whole number)")


_UNIT_KINDS = ("GB<->GiB, kB<->KiB", "bits<->bytes")


@dataclass(frozen=True)
class Slip:
    """A typical slip: the answer times ``factor``. A generic message that names it
    contains one of ``names``; ``kind`` groups slips for the summary."""
    name: str
    factor: float
    names: tuple
    kind: str


def _bandwidth(unit: str) -> bool:
    u = unit.lower()
    return u.endswith("/s") and ("byte" in u or u[:-2].endswith("b"))


def standard_slips(ex, reference: float | None = None) -> list[Slip]:
    """The standard slips that apply to numeric exercise ``ex`` (one per distinct
    factor: a slip that is two at once, e.g. x8 as bits and as 8 chips, names both)."""
    ref = float(ex.reference()) if reference is None else reference
    slips = [Slip("x2", 2, ("2x",), "x2, x1/2"), Slip("x1/2", 0.5, ("2x",), "x2, x1/2"),
             Slip("x1000", 1e3, ("1e+03x",), "x1000, x1/1000"),
             Slip("x1/1000", 1e-3, ("1e+03x",), "x1000, x1/1000")]
    for n in ex.ring_sizes():
        words = (f"n = {n}",) + (("2x",) if n == 2 else ())
        slips += [Slip(f"ring {n}/{n - 1} (dropped)", n / (n - 1), words,
                       "ring (n-1)/n"),
                  Slip(f"ring {n - 1}/{n} (added)", (n - 1) / n, words, "ring (n-1)/n")]
    size = _is_size_unit(ex.unit) and not _bandwidth(ex.unit)
    if size:
        slips += [Slip("GB->GiB", 1.024 ** 3, ("GiB",), "GB<->GiB, kB<->KiB"),
                  Slip("GiB->GB", 1.024 ** -3, ("GiB",), "GB<->GiB, kB<->KiB"),
                  Slip("kB->KiB", 1.024, ("KiB",), "GB<->GiB, kB<->KiB"),
                  Slip("KiB->kB", 1 / 1.024, ("KiB",), "GB<->GiB, kB<->KiB")]
    if size or _bandwidth(ex.unit):
        slips += [Slip("bits for bytes", 8, ("bits",), "bits<->bytes"),
                  Slip("bytes for bits", 1 / 8, ("bits",), "bits<->bytes")]
    if ex.unit.startswith("fraction") or (_is_dimensionless(ex.unit)
                                          and abs(ref) <= 10):
        slips.append(Slip("percent", 100, ("percentage",), "percentage"))
    chips = ex.chip_count()
    if chips:
        words = ("chips", f"{chips}x")
        slips += [Slip(f"x {chips} chips", chips, words, "per chip vs slice"),
                  Slip(f"/ {chips} chips", 1 / chips, words, "per chip vs slice")]
    merged: dict[float, Slip] = {}
    for sl in slips:
        key = round(math.log(sl.factor), 9)
        if key in merged:
            m = merged[key]
            merged[key] = Slip(f"{m.name} = {sl.name}", m.factor, m.names + sl.names,
                               m.kind)
        else:
            merged[key] = sl
    return list(merged.values())


def battery_variants(ex) -> list[dict | None]:
    """None (the exercise's own numbers), then the variants of the battery's
    students."""
    out = [None]
    if isinstance(ex, VariedNumericExercise) and ex.choose:
        for student in BATTERY_STUDENTS:
            params = draw_variant(ex.id, BATTERY_SECRET, student)
            if params not in out:
                out.append(params)
    return out


def classify(ex, message: str) -> str:
    """'own' (the exercise's own hint), 'generic' (a generic hint naming a slip),
    'unspecific' (too large / too small / far off) or 'other' for a wrong answer's
    message."""
    text = message.removeprefix("not yet: ")
    if any(text == m for _, m in ex.hints):
        return "own"
    if _NAMING.match(text):
        return "generic"
    if _UNSPECIFIC.match(text):
        return "unspecific"
    return "other"


@dataclass
class Shot:
    """One slip applied to one variant of one exercise, and what the check said."""
    exercise: str
    variant: dict | None
    slip: Slip
    answer: float
    outcome: str          # one of OUTCOMES
    message: str = ""


def run_battery(ex_id: str) -> list[Shot]:
    """Every standard slip on every battery variant of numeric exercise ``ex_id``."""
    shots = []
    base = get_exercise(ex_id)
    for params in battery_variants(base):
        ex = base if params is None else base.with_variant(params)
        ref = float(ex.reference())
        for slip in standard_slips(ex, ref):
            value = ref * slip.factor
            if ex.integer:
                value = float(round(value))
                inside = value == round(ref) or value == 0
            else:
                inside = math.isclose(value, ref, rel_tol=ex.rtol)
            if inside:         # the slip changes nothing the check can see
                shots.append(Shot(ex_id, params, slip, value, "skipped"))
                continue
            r = evaluate(ex_id, value, variant=params)
            if r.correct:
                outcome = "accepted"
            else:
                outcome = classify(ex, r.message)
                # "the answer rounded to 1 significant figure": the slip lands on it
                # exactly
                if outcome == "generic" and "rounded to" not in r.message \
                        and not any(w in r.message for w in slip.names):
                    outcome = "misnamed"
                # an exercise's own hint that a unit slip lands on (GB as GiB, bits for
                # bytes: a coincidence of values, e.g. 8 heads and 8 bits) names the unit
                # slip too, or the first case tells them apart
                if outcome == "own" and slip.kind in _UNIT_KINDS \
                        and not any(w in r.message for w in slip.names):
                    outcome = "misnamed"
            shots.append(Shot(ex_id, params, slip, value, outcome, r.message))
    return shots


def run_pitfalls(ex_id: str, answers) -> list[Shot]:
    """The chapter's known pitfalls of exercise ``ex_id`` (numbers), with its own
    numbers."""
    ex = get_exercise(ex_id)
    pitfall = Slip("known pitfall", 1.0, (), "known pitfalls")
    shots = []
    for a in answers:
        r = evaluate(ex_id, a)
        outcome = "accepted" if r.correct else classify(ex, r.message)
        shots.append(Shot(ex_id, None, pitfall, float(a), outcome, r.message))
    return shots


def battery_counts(shots) -> dict:
    """How many shots had each outcome."""
    counts = dict.fromkeys(OUTCOMES, 0)
    for sh in shots:
        counts[sh.outcome] += 1
    return counts


def tried(counts: dict) -> int:
    return sum(v for k, v in counts.items() if k != "skipped")


def specific_share(counts: dict) -> float:
    """The share of specific messages (own or generic) among the slips the check saw."""
    n = tried(counts)
    return (counts["own"] + counts["generic"]) / n if n else 1.0


def numeric_ids(chapter: int) -> list[str]:
    return [e for e in chapter_ids(chapter)
            if isinstance(get_exercise(e), NumericExercise)]


def _add(total: dict, counts: dict) -> None:
    for k, v in counts.items():
        total[k] = total.get(k, 0) + v


def battery_table(rows: dict, first: str = "chapter") -> str:
    """A table of outcomes: ``rows`` maps a label (a chapter) to (exercises, counts,
    pitfall counts or None); a last row sums them. Columns: the slips the check saw, how
    many got the exercise's own hint, a generic hint naming the slip, only "too large"
    or the like; how many were wrongly handled (accepted, or named as another slip); how
    many the check cannot see (skipped); the share of specific messages (own + generic)
    and of own hints; and the known pitfalls, with the share named."""
    head = (f"{first:>18} {'exerc.':>6} {'slips':>5} {'own':>5} {'generic':>7} "
            f"{'unspec.':>7} {'wrong':>5} {'skipped':>7} {'specific':>8} {'own':>6}")
    if any(p for _, _, p in rows.values()):
        head += f" {'pitfalls':>8} {'named':>6}"
    lines = [head]
    total, ptotal, n_ex = {}, {}, 0

    def line(label, n, c, p):
        bad = c.get("accepted", 0) + c.get("misnamed", 0) + c.get("other", 0)
        own = c["own"] / tried(c) if tried(c) else 1.0
        pit = f" {tried(p):>8} {specific_share(p):>6.0%}" if p and tried(p) else ""
        ex = f"{n:>6}" if n else f"{'':>6}"
        return (f"{label:>18} {ex} {tried(c):>5} {c['own']:>5} {c['generic']:>7} "
                f"{c['unspecific']:>7} {bad:>5} {c['skipped']:>7} "
                f"{specific_share(c):>8.1%} {own:>6.1%}{pit}")
    for label, (n, counts, pits) in rows.items():
        lines.append(line(label, n, counts, pits))
        n_ex += n
        _add(total, counts)
        if pits:
            _add(ptotal, pits)
    if len(rows) > 1:
        lines.append(line("all", n_ex, total, ptotal))
    return "\n".join(lines)


def kind_table(shots) -> str:
    """Outcomes by kind of slip."""
    by_kind: dict[str, dict] = {}
    for sh in shots:
        counts = by_kind.setdefault(sh.slip.kind, dict.fromkeys(OUTCOMES, 0))
        counts[sh.outcome] += 1
    return battery_table({k: (0, c, None) for k, c in by_kind.items()}, first="slip")


def slip_battery_tests(chapter: int, pitfalls: dict | None = None) -> dict:
    """The battery's test for one chapter: each numeric exercise rejects every standard
    slip and every known pitfall in ``pitfalls`` (exercise -> numbers), and no generic
    hint names a slip other than the one made. Each test records its counts (user
    property ``slip_battery``) for the summary tests/conftest.py prints."""
    pitfalls = pitfalls or {}

    @pytest.mark.parametrize("ex", numeric_ids(chapter))
    def test_slip_battery(ex, record_property):
        shots = run_battery(ex)
        pits = run_pitfalls(ex, pitfalls.get(ex, []))
        record_property("slip_battery", json.dumps({
            "chapter": chapter, "exercise": ex, "counts": battery_counts(shots),
            "pitfalls": battery_counts(pits)}))
        bad = [(sh.variant, sh.slip.name, sh.answer, sh.outcome, sh.message)
               for sh in shots + pits
               if sh.outcome in ("accepted", "misnamed", "other")]
        assert not bad, f"slips accepted, or named as another slip: {bad}"
    return {"test_slip_battery": test_slip_battery}


def summary_from_records(records) -> str:
    """The per-chapter table from the tests' ``slip_battery`` records (JSON strings)."""
    rows: dict = {}
    for rec in map(json.loads, records):
        empty = (0, dict.fromkeys(OUTCOMES, 0), dict.fromkeys(OUTCOMES, 0))
        n, counts, pits = rows.setdefault(str(rec["chapter"]), empty)
        _add(counts, rec["counts"])
        _add(pits, rec.get("pitfalls", {}))
        rows[str(rec["chapter"])] = (n + 1, counts, pits)
    return battery_table(dict(sorted(rows.items(), key=lambda kv: int(kv[0]))))


def pitfall_line(records) -> str:
    """One line on the chapters' known pitfalls, from the tests' ``slip_battery``
    records."""
    total = dict.fromkeys(OUTCOMES, 0)
    for rec in map(json.loads, records):
        _add(total, rec.get("pitfalls", {}))
    return (f"Known pitfalls in the chapters' tests that ran: {tried(total)}, "
            f"{specific_share(total):.1%} named by the exercise's own or a generic "
            f"hint, "
            f"{total['accepted']} accepted.")


def full_battery(chapters=None) -> tuple[dict, list]:
    """The battery over ``chapters`` (default: every chapter with exercises): rows for
    :func:`battery_table` (no pitfalls: those live in the chapters' test files) and all
    the shots."""
    from scalebook.exercises import exercise_ids
    if chapters is None:
        chapters = sorted({int(e.split(".")[0]) for e in exercise_ids()})
    rows, shots = {}, []
    for ch in chapters:
        ids = numeric_ids(ch)
        ch_shots = [sh for e in ids for sh in run_battery(e)]
        shots += ch_shots
        rows[str(ch)] = (len(ids), battery_counts(ch_shots), None)
    return rows, shots


def battery_report(chapters=None) -> str:
    """The battery's tables, per chapter and per kind of slip, as text."""
    rows, shots = full_battery(chapters)
    return ("Slip battery (issue 25): share of rejected slips whose message names the "
            "slip\n"
            + battery_table(rows) + "\n\nBy kind of slip:\n" + kind_table(shots))
