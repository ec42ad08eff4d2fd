"""The kinds of exercise answer: a number, a choice, a function, a program on the mesh.

Each kind turns a student's answer into a :class:`~scalebook.exercises.core.Result` and never
raises on the answer itself. Chapters build their exercises from these in ``chNN.py``.
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import math
import numbers
import os
import random
import re
from dataclasses import dataclass, field
from typing import Callable

from .. import hlo
from .core import CORRECT, UNANSWERED, WRONG, Exercise, HintError, Result, strict_checks

__all__ = ["NumericExercise", "VariedNumericExercise", "ChoiceExercise", "CodeExercise",
           "MeshProgramExercise", "NotAttempted", "as_number", "mesh_inputs", "returns_something",
           "is_stub", "dtype_rtol", "same_number", "statement_names"]

NO_RETURN = "your function has no return (it returned None)"


def _hint_applies(predicate, *args) -> bool:
    """Whether a hint's predicate holds. A predicate that raises is a bug in the check: in a
    student's notebook it is skipped (the next hint gets its turn); under the test suite
    (SCALEBOOK_STRICT_HINTS=1, set by tests/conftest.py) it fails loudly."""
    try:
        return bool(predicate(*args))
    except Exception as e:
        if strict_checks():
            raise HintError(f"hint predicate {getattr(predicate, '__qualname__', predicate)} "
                            f"raised {type(e).__name__}: {e}") from e
        return False


def as_number(x):
    """A float from an int/float/NumPy/JAX scalar, or None if ``x`` is not a real number."""
    if isinstance(x, bool):
        return None
    if isinstance(x, numbers.Real):
        try:
            return float(x)
        except OverflowError:            # an int of hundreds of digits: larger than any float
            return math.copysign(math.inf, x)
    shape = getattr(x, "shape", None)
    if shape == () and hasattr(x, "item"):
        try:
            v = x.item()
        except Exception:
            return None
        return as_number(v) if not isinstance(v, bool) else None
    return None


def dtype_rtol(x) -> float:
    """The relative precision of the number type ``x`` came in: 0 for Python numbers and
    64-bit floats and integers (compare at the exercise's tolerance), a few units in the
    last place for float32, float16 and bfloat16 (a right answer computed with jnp in
    float32 is right)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return 0.0
    import numpy as np
    try:
        if np.issubdtype(dtype, np.floating) or "bfloat16" in str(dtype):
            eps = float(np.finfo(dtype).eps) if "bfloat16" not in str(dtype) else 2.0 ** -7
            return 0.0 if eps < 1e-15 else 4 * eps
    except TypeError:
        pass
    return 0.0


def same_number(got, want) -> bool:
    """``got`` equals the exact ``want`` (a count, a whole number) at the precision of the
    type it came in: exact for Python and 64-bit numbers, float32's precision for float32."""
    g = as_number(got)
    if g is None:
        return False
    if g == want:
        return True
    rtol = dtype_rtol(got)
    return bool(rtol) and math.isclose(g, float(want), rel_tol=rtol)


def _too_big(x) -> str | None:
    """A message for an int too large to be a float (10**400), else None."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        try:
            float(x)
        except OverflowError:
            digits = len(str(abs(int(x)))) if abs(int(x)).bit_length() < 20_000 else None
            size = f"an integer of {digits} digits" if digits else "an enormous integer"
            return (f"{size}, too large for any answer here (a float stops near 1.8e308): "
                    f"check the exponent, or for ** written where * was meant.")
    return None


def _pct(rtol: float) -> str:
    """A tolerance in percent without rounding it to 0: 0.05 -> '5%', 0.001 -> '0.1%'."""
    return f"{rtol * 100:.2g}%"


def _rounded_hint(value: float, expected: float, rtol: float) -> str | None:
    """A hint when ``value`` is ``expected`` rounded to one or two significant figures."""
    for figures in (1, 2):
        rounded = float(f"{expected:.{figures - 1}e}")
        if rounded != expected and math.isclose(value, rounded, rel_tol=1e-9):
            return (f"that is the answer rounded to {figures} significant figure"
                    f"{'s' if figures > 1 else ''}; give at least {figures + 1} (the check "
                    f"allows {_pct(rtol)}).")
    return None


def is_stub(fn) -> bool:
    """Whether a function's body does nothing but return None: the exercise template's
    ``...`` (or ``pass``, or a docstring alone). Such a function is *not attempted*; one
    that does work but has no ``return`` is an answer with a mistake. (The grader's stand-in
    for a function run in a student's kernel says which it was: ``scalebook_stub``.)"""
    marked = getattr(fn, "scalebook_stub", None)
    if isinstance(marked, bool):
        return marked
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    if code is None:
        return False
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code)
           if i.opname not in ("RESUME", "NOP", "CACHE")]
    return ops in ([("RETURN_CONST", None)], [("LOAD_CONST", None), ("RETURN_VALUE", None)])


_PATH = re.compile(r"""(?:File\s+)?["']?(?:[A-Za-z]:)?(?:[\\/][^\s"':,()]+)+\.py["']?"""
                   r"""(?:(?:, line |:)\d+)?""")
_INTERNAL = re.compile(r"\b(?:[A-Za-z_][\w]*\.<locals>\.)+")


def _clean_error(text: str) -> str:
    """An error message without file paths or the check's own function names."""
    text = _INTERNAL.sub("", _PATH.sub("", text))
    return re.sub(r"[ \t]{2,}", " ", text)


def _is_size_unit(unit: str) -> bool:
    u = unit.lower()
    return "byte" in u or u.rstrip("/s").endswith(("b", "gib", "mib", "kib"))


def _is_dimensionless(unit: str) -> bool:
    """A fraction or a ratio (no unit, "fraction (0 to 1)", "ratio ..."): an answer that
    a slip can turn into a percentage."""
    return unit == "" or unit.startswith("fraction") or "ratio" in unit


def _ratio_hint(ratio: float, unit: str = "", close=None) -> str | None:
    """A generic hint from answer / expected. The GiB-vs-GB hint is given only for
    sizes. ``close(factor, rtol)`` says whether the answer is the expected one times
    ``factor`` (default: the ratio within ``rtol``; a whole-number answer passes its
    own, which also accepts the product rounded either way)."""
    if close is None:
        def close(factor, rtol):
            return math.isclose(ratio, factor, rel_tol=rtol)
    bits = " (bits vs bytes? a byte is 8 bits)" if _is_size_unit(unit) else ""
    for factor, name in [(2, "2"), (4, "4"), (8, "8")]:
        extra = bits if factor == 8 else ""
        if close(factor, 0.03):
            return f"about {name}x too large{extra}."
        if close(1 / factor, 0.03):
            return f"about {name}x too small{extra}."
    if _is_dimensionless(unit) and close(100, 0.03):
        what = ("as a fraction between 0 and 1 (27% is 0.27)"
                if unit.startswith("fraction")
                else "as a ratio, not a percentage (198% is 1.98, 27% is 0.27)")
        return f"100x too large: that looks like a percentage; give it {what}."
    for k in range(1, 6):
        big = 10.0 ** (3 * k)
        if close(big, 0.1):
            return f"{big:.0e}x too large: check the units (bytes vs GB, s vs ms, FLOPs vs TFLOPs)."
        if close(1 / big, 0.1):
            return f"{big:.0e}x too small: check the units (bytes vs GB, s vs ms, FLOPs vs TFLOPs)."
    prefixes = {1: "KiB is 2**10 bytes, kB is 1e3", 2: "MiB is 2**20 bytes, MB is 1e6",
                3: "GiB is 2**30 bytes, GB is 1e9 bytes"}
    for k in (3, 2, 1) if _is_size_unit(unit) else ():
        if close(1.024 ** k, 0.004) or close(1.024 ** -k, 0.004):
            return f"off by a binary/decimal prefix: {prefixes[k]}."
    return None


def _declared_hint(close, ring: tuple, chips: int | None, unit: str) -> str | None:
    """A hint for the slips an exercise declares it can have: the ring factor (n - 1)/n
    of a collective over n chips dropped or added, and per chip vs all the chips."""
    if chips:
        bits = (" (or bits vs bytes: a byte is 8 bits)"
                if chips == 8 and _is_size_unit(unit) else "")
        if close(chips, 0.03):
            return (f"{chips}x too large, the number of chips: per chip vs all {chips} "
                    f"chips together?{bits}")
        if close(1 / chips, 0.03):
            return (f"{chips}x too small, the number of chips: per chip vs all {chips} "
                    f"chips together?{bits}")
    for n in ring:
        frac = f"{n - 1}/{n}"
        if close(n / (n - 1), 0.003):
            return (f"{n}/{n - 1} of the answer, too large: the ring factor "
                    f"(n - 1)/n = {frac} (n = {n}) left out?")
        if close((n - 1) / n, 0.003):
            return (f"{frac} of the answer, too small: the ring factor (n - 1)/n = "
                    f"{frac} (n = {n}) applied where it does not belong, or twice?")
    return None


def _integer_close(value: float, expected: float):
    """``close`` for a whole-number answer: the ratio within the tolerance, or the
    product ``expected * factor`` rounded down or up when that product is at least one
    away from the answer (so 12 for 11 is not "x 1.024, rounded up") and the answer is
    not one off (2 for 3 is a rounding slip, not "2x too small")."""
    def close(factor, rtol):
        if math.isclose(value / expected, factor, rel_tol=rtol):
            return True
        product = expected * factor
        return (abs(product - expected) >= 1 and abs(value - expected) > 1
                and value in (math.floor(product), math.ceil(product)))
    return close


@dataclass
class NumericExercise(Exercise):
    """An answer that is one number, compared with a relative tolerance.

    ``reference`` computes the answer from scalebook (never a typed-in number).
    ``hints`` is a list of (predicate on the answer, message) for specific mistakes, e.g.
    ``(lambda a: close(a, 2 * ref()), "did you count the weights twice?")``. They are
    tried first; then rounding; then the slips the exercise declares: ``ring=n`` (or a
    tuple of n) for an answer with a collective over n chips, whose ring factor
    (n - 1)/n a slip drops or adds, and ``chips=n`` for one a slip can give per chip
    instead of for all n chips or the reverse (a VariedNumericExercise may give either
    as a function of its parameters); then the unit's generic slips (x2, x4, x8, bits
    and bytes, x1000 prefixes, GB and GiB, a percentage for a fraction or a ratio).
    """

    unit: str = ""
    reference: Callable[[], float] = None
    rtol: float = 0.05
    integer: bool = False
    hints: list = field(default_factory=list)
    # What the generic hints may name besides the unit's slips (a VariedNumericExercise
    # may give each as a function of its parameters): ``ring``, the group size(s) n of
    # the collective(s) the answer involves, whose ring factor (n - 1)/n a slip drops or
    # adds; ``chips``, the number of chips whose per-chip and whole-slice counts a slip
    # confuses.
    ring: object = ()
    chips: object = None

    def _declared(self, value):
        return value() if callable(value) else value

    def ring_sizes(self) -> tuple:
        """The n of each ring factor (n - 1)/n this exercise's answer may involve."""
        n = self._declared(self.ring)
        if not n:
            return ()
        return tuple(sorted({int(k) for k in ((n,) if isinstance(n, numbers.Integral)
                                               else n) if int(k) >= 2}))

    def chip_count(self) -> int | None:
        """The number of chips a per-chip count and a whole-slice count differ by."""
        n = self._declared(self.chips)
        return int(n) if n and int(n) > 1 else None

    def evaluate(self, answer) -> Result:
        if answer is Ellipsis:
            return self._result(UNANSWERED, "not attempted yet: replace ... with your answer.")
        big = _too_big(answer)
        if big:
            return self._result(WRONG, f"not yet: that is {big}")
        value = as_number(answer)
        if value is None:
            return self._result(WRONG, f"expected a number{self._unit_words()}, got "
                                       f"{type(answer).__name__} {answer!r:.60}.")
        if not math.isfinite(value):
            return self._result(WRONG, f"expected a finite number, got {value}.")
        expected = float(self.reference())
        read_as = ""
        if self.integer:
            whole = round(value)
            # 326.00000000033 is 326 written by a float computation; 326.4 is not whole
            if abs(value - whole) > max(1e-9 * max(1.0, abs(value)), dtype_rtol(answer) * abs(value)):
                return self._result(WRONG, f"expected a whole number{self._unit_words()}, got {value}.")
            if value != whole:
                read_as = f" (read {value!r} as {whole})"
            value = float(whole)
            ok = whole == round(expected)
        else:
            rtol = max(self.rtol, dtype_rtol(answer))
            ok = math.isclose(value, expected, rel_tol=rtol, abs_tol=0.0)
        if ok:
            return self._result(CORRECT, "correct." + read_as)
        for predicate, message in self.hints:      # a specific mistake first
            if _hint_applies(predicate, value):
                return self._result(WRONG, "not yet: " + message)
        rounded = None if self.integer else _rounded_hint(value, expected, self.rtol)
        if rounded:                                 # then rounding, before the unit slips
            return self._result(WRONG, "not yet: " + rounded)
        if expected != 0 and value != 0 and (value > 0) == (expected > 0):
            if self.integer:
                close = _integer_close(value, expected)
            else:
                def close(factor, rtol, ratio=value / expected):
                    return math.isclose(ratio, factor, rel_tol=rtol)
            hint = (_declared_hint(close, self.ring_sizes(), self.chip_count(),
                                   self.unit)
                    or _ratio_hint(value / expected, self.unit, close))
            if hint:
                return self._result(WRONG, "not yet: " + hint)
            direction = "large" if value > expected else "small"
            if self.integer:
                return self._result(WRONG, f"not yet: too {direction}.")
            return self._result(WRONG, f"not yet: too {direction} (off by more than {_pct(self.rtol)}).")
        return self._result(WRONG, "not yet: the sign or the size is far off.")

    def _unit_words(self) -> str:
        return f" (in {self.unit})" if self.unit else ""


@dataclass
class VariedNumericExercise(NumericExercise):
    """A numeric exercise whose numbers an assignment can draw per student (opt-in).

    ``params`` are the chapter's own numbers (the exercise as the chapter states it);
    ``choose`` maps some of them to the values a variant may take; ``solve(**params)`` is
    the reference and ``hints_for(**params)`` the hints, for any parameters;
    ``valid(**params)`` refuses draws outside the exercise's meaning; ``statement`` is the
    Markdown statement with ``{name}`` fields, filled from the parameters and from
    ``describe(**params)`` (extra fields, e.g. a chip's display name).

    With its own ``params`` it behaves exactly as a plain :class:`NumericExercise`
    (``reference`` and ``hints`` are derived from them). :meth:`draw` picks a variant from
    a seed (the grader's HMAC of secret, student and exercise: see
    :func:`~scalebook.exercises.core.variant_seed`): never the chapter's own numbers, nor
    numbers whose answer is the chapter's answer (within twice the tolerance).
    """

    params: dict = field(default_factory=dict)
    choose: dict = field(default_factory=dict)
    solve: Callable[..., float] = None
    hints_for: Callable[..., list] = None
    valid: Callable[..., bool] = None
    statement: str = ""
    describe: Callable[..., dict] = None
    variant_title: str = ""     # the title with {fields}, when the title names a number

    def __post_init__(self):
        params = dict(self.params)
        if self.reference is None:
            self.reference = lambda: self.solve(**params)
        if not self.hints and self.hints_for is not None:
            self.hints = list(self.hints_for(**params))

    def _declared(self, value):
        return value(**self.params) if callable(value) else value

    def with_variant(self, params: dict) -> "VariedNumericExercise":
        if not isinstance(params, dict):
            raise TypeError(f"a variant is a dict of parameters, got {type(params).__name__}")
        unknown = set(params) - set(self.params)
        if unknown:
            raise ValueError(f"exercise {self.id} has no parameter {', '.join(sorted(unknown))}")
        merged = {**self.params, **params}
        for name, value in params.items():
            if name in self.choose and value not in self.choose[name] and value != self.params[name]:
                raise ValueError(f"{name}={value!r} is not one of this exercise's values")
        if self.valid is not None and not self.valid(**merged):
            raise ValueError(f"{merged} is not a valid variant of exercise {self.id}")
        return dataclasses.replace(self, params=merged, reference=None, hints=[])

    def draw(self, seed: bytes) -> dict:
        rng = random.Random(int.from_bytes(seed, "big"))
        names = sorted(self.choose)
        own = float(self.solve(**self.params))
        for _ in range(1000):
            params = {**self.params, **{n: rng.choice(list(self.choose[n])) for n in names}}
            if params == self.params or (self.valid is not None and not self.valid(**params)):
                continue
            # The chapter's own answer must not pass: e.g. B and D swapped leave 2BDF alone.
            if math.isclose(float(self.solve(**params)), own, rel_tol=2 * self.rtol):
                continue
            return params
        raise RuntimeError(f"exercise {self.id}: no valid variant found")

    def text(self) -> str:
        """The statement of this variant, in Markdown."""
        extra = self.describe(**self.params) if self.describe else {}
        return self.statement.format(**self.params, **extra)

    def title_text(self) -> str:
        """The title of this variant (``variant_title`` filled in, else the title)."""
        if not self.variant_title:
            return self.title
        extra = self.describe(**self.params) if self.describe else {}
        return self.variant_title.format(**self.params, **extra)


def _spelling(text: str) -> str:
    """A choice as typed, reduced to its words: lower case, leading dashes dropped, and
    spaces, hyphens and underscores all one underscore ("--Latency-hiding scheduler" ->
    "latency_hiding_scheduler")."""
    return re.sub(r"[\s_-]+", "_", text.strip().lower()).strip("_")


@dataclass
class ChoiceExercise(Exercise):
    """An answer that is one of a few words, e.g. "compute" or "memory".

    A choice is recognised whatever its case, and with spaces, hyphens or underscores
    between its words; ``aliases`` maps other accepted spellings (a flag's full name, say)
    to the choice they mean."""

    choices: tuple = ()
    reference: Callable[[], str] = None
    hints: dict = field(default_factory=dict)   # wrong choice -> hint
    aliases: dict = field(default_factory=dict)  # another spelling -> one of the choices

    def choice_of(self, answer) -> str | None:
        """The choice ``answer`` spells, or None."""
        if not isinstance(answer, str):
            return None
        words = _spelling(answer)
        for c in self.choices:
            if words == _spelling(c):
                return c
        for other, c in self.aliases.items():
            if words == _spelling(other):
                return c
        return None

    def evaluate(self, answer) -> Result:
        if answer is Ellipsis:
            return self._result(UNANSWERED, "not attempted yet: replace ... with your answer.")
        a = self.choice_of(answer)
        if a is None:
            return self._result(WRONG, f"answer with one of {', '.join(map(repr, self.choices))}; got {answer!r:.60}.")
        if a == self.reference():
            return self._result(CORRECT, "correct.")
        return self._result(WRONG, "not yet: " + self.hints.get(a, "think again about which time is largest."))


def _case_text(case) -> str:
    """A test input's text, to compare inputs (arrays compare element-wise)."""
    return repr(tuple(case))


@dataclass
class CodeExercise(Exercise):
    """An answer that is a function, run on several inputs and compared with a reference.

    ``cases`` is a list of argument tuples; ``reference`` is the correct function.
    ``generate(rng)`` (a ``random.Random``) draws one more argument tuple at random:
    each check adds ``drawn`` such inputs after the published ones, from a seed of its own
    (a fresh one per call in a notebook, one per student in the grader), so a table of the
    published cases' answers does not pass. Results
    are compared with ``compare(got, want) -> bool`` (default: relative tolerance ``rtol``
    on numbers and on each element of tuples). ``hints`` are (predicate(got, want, args),
    message) pairs, tried in order on the first case that fails (so put the case that tells
    the typical mistakes apart first). ``unit`` is the unit of the numbers the reference
    returns: when no hint applies, a wrong number gets the same unit hints (ms vs s, GiB vs
    GB, bits vs bytes) as a numeric answer. A function whose body is still ``...`` counts as
    not attempted; one that does work but returns None is told it has no return.
    """

    reference: Callable = None
    cases: list = field(default_factory=list)
    rtol: float = 1e-6
    compare: Callable | None = None
    hints: list = field(default_factory=list)
    describe: Callable | None = None     # args -> str, for messages
    unit: str = ""
    generate: Callable | None = None     # random.Random -> args: a test input drawn at random
    drawn: int = 3                       # how many drawn inputs each check adds

    def drawn_cases(self, seed=None, n: int | None = None) -> list:
        """``n`` (default ``drawn``) argument tuples from ``generate``, from ``seed`` (bytes
        or int; None: a fresh random seed). Empty if the exercise has no generator. A draw
        equal to a published case is drawn again (up to 100 times): a table of the
        published answers must earn nothing on the drawn inputs, not a lucky share."""
        if self.generate is None:
            return []
        if seed is None:
            seed = os.urandom(16)
        rng = random.Random(int.from_bytes(seed, "big") if isinstance(seed, bytes) else seed)
        published = {_case_text(c) for c in self.cases}
        out = []
        for _ in range(self.drawn if n is None else n):
            for _ in range(100):
                case = tuple(self.generate(rng))
                if _case_text(case) not in published:
                    break
            out.append(case)
        return out

    def with_cases(self, cases) -> "CodeExercise":
        """This exercise checked on exactly ``cases`` (the grader's: published and drawn)."""
        return dataclasses.replace(self, cases=list(cases), generate=None)

    def _equal(self, got, want) -> bool:
        if self.compare is not None:
            return bool(self.compare(got, want))
        if isinstance(want, tuple):
            if isinstance(got, (str, bytes)) or not hasattr(got, "__len__") or getattr(got, "ndim", 1) != 1:
                return False
            return len(got) == len(want) and all(self._equal(g, w) for g, w in zip(got, want))
        g = as_number(got)
        if g is None:
            return False
        rtol = max(self.rtol, dtype_rtol(got))
        return math.isclose(g, float(want), rel_tol=rtol, abs_tol=1e-300)

    def _unit_hint(self, got, want) -> str | None:
        """The generic ratio hint when every number returned is off by the same factor."""
        if not self.unit:
            return None
        if isinstance(want, tuple):
            if isinstance(got, (str, bytes)) or not hasattr(got, "__len__") or len(got) != len(want):
                return None
            pairs = list(zip(got, want))
        else:
            pairs = [(got, want)]
        found = set()
        for g, w in pairs:
            g, w = as_number(g), as_number(w)
            if g is None or w is None or g == 0 or w == 0 or (g > 0) != (w > 0) \
                    or not math.isfinite(g):
                return None
            found.add(_ratio_hint(g / w, self.unit))
        return found.pop() if len(found) == 1 else None

    def evaluate(self, answer) -> Result:
        if answer is Ellipsis or answer is None:
            return self._result(UNANSWERED, "not attempted yet: write the function, then run this cell.")
        if not callable(answer):
            return self._result(WRONG, f"expected a function, got {type(answer).__name__}.")
        cases = list(self.cases) + self.drawn_cases()
        for i, args in enumerate(cases):
            label = self.describe(*args) if self.describe else repr(args)
            try:
                got = answer(*args)
            except Exception as e:  # the student's code: report, never raise
                return self._result(WRONG, f"your function raised {type(e).__name__}: {e} (inputs: {label}).")
            if got is None:
                if is_stub(answer):      # the template's body, still ``...``
                    return self._result(UNANSWERED, "not attempted yet: your function returns None.")
                where = "" if i == 0 else f" for inputs {label}"
                return self._result(WRONG, f"not yet: {NO_RETURN}{where}.")
            parts = got if isinstance(got, (tuple, list)) else (got,)
            big = next(filter(None, map(_too_big, parts)), None)
            if big:
                return self._result(WRONG, f"not yet for inputs {label}: your function "
                                           f"returned {big}")
            want = self.reference(*args)
            if not self._equal(got, want):
                for predicate, message in self.hints:
                    if _hint_applies(predicate, got, want, args):
                        return self._result(WRONG, f"not yet for inputs {label}: {message}")
                unit = self._unit_hint(got, want)
                if unit:
                    return self._result(WRONG, f"not yet for inputs {label}: {unit}")
                return self._result(WRONG, f"not yet: wrong result for inputs {label} (got {got!r:.80}).")
        return self._result(CORRECT, f"correct on all {len(cases)} test inputs.")


# ------------------------------------------------------------------------------------------
# Programs on the mesh
# ------------------------------------------------------------------------------------------

class NotAttempted(Exception):
    """Raised by a mesh exercise's ``build`` when the student's function returned None."""


@dataclass
class MeshProgramExercise(Exercise):
    """A code answer that becomes a program on a device mesh (``mesh_shape``, ``mesh_axes``).

    ``build(answer, case, mesh)`` returns ``(jitted_fn, args)``; the check compiles it,
    runs it, compares the output with ``expected(case, *args)`` (numbers) and asks
    ``collectives_ok(records, case)`` for an error message (or None) about the compiled
    program's collectives. Each case is a different shape, so a program that only works
    for one shape does not pass.

    In the grader the student's kernel only *exports* each case's program
    (:meth:`export_programs`, ``jax.export``: the StableHLO and its shardings); the grader's
    checker, which runs no student code, compiles the exported program itself, runs it on
    input values of its own (drawn per student) and judges it (:meth:`evaluate_exported`).
    An exercise whose answer is data for the check's own program (PartitionSpecs) says how
    to call it: ``answer_args(case)``; then the kernel hands back that data and the checker
    builds the program.
    """

    build: Callable = None
    expected: Callable = None
    collectives_ok: Callable = None
    cases: list = field(default_factory=list)
    describe: Callable = None
    error_hints: list = field(default_factory=list)   # (substring of an error, message)
    rtol: float = 1e-5
    mesh_shape: tuple = (2, 4)
    mesh_axes: tuple = ("x", "y")
    answer_args: Callable | None = None     # case -> args, when the answer is data
    program_ok: Callable | None = None      # (StableHLO text, case): raises if its form is wrong
    # (result, expected, case) -> what is wrong with numbers that differ, or None
    numbers_hint: Callable | None = None

    def _label(self, case) -> str:
        return self.describe(*case) if self.describe else repr(case)

    def _failed(self, answer, label, e) -> Result:
        """The result for a program that could not be built or compiled."""
        if isinstance(e, NotAttempted):
            if is_stub(answer):      # the template's body, still ``...``
                return self._result(UNANSWERED, "not attempted yet: your function returns None.")
            return self._result(WRONG, f"not yet: {NO_RETURN} for {label}.")
        text = e if isinstance(e, str) else _clean_error(f"{type(e).__name__}: {e}")
        for needle, message in self.error_hints:
            if needle in text:
                return self._result(WRONG, f"not yet ({label}): {message}")
        return self._result(WRONG, f"your program failed for {label}: {text[:400]}")

    def _judge(self, compiled, args, case, label) -> Result | None:
        """A wrong result for this case, or None if its numbers and collectives are right."""
        import numpy as np

        got = np.asarray(compiled(*args))
        want = np.asarray(self.expected(case, *args))
        if got.shape != want.shape:
            return self._result(WRONG, f"not yet: for {label} the result has shape "
                                       f"{got.shape}, expected {want.shape} (the whole "
                                       f"array: every device's block put together).")
        if not np.allclose(got, want, rtol=self.rtol, atol=self.rtol * float(np.abs(want).max() or 1)):
            extra = None
            if self.numbers_hint is not None:
                try:
                    extra = self.numbers_hint(got, want, case)
                except Exception as e:       # a bug in the check, not the answer
                    if strict_checks():
                        raise HintError(f"numbers_hint raised {type(e).__name__}: {e}") from e
            return self._result(WRONG, f"not yet: wrong numbers for {label}"
                                       + (f": {extra}" if extra else "."))
        records = hlo.collectives(compiled)
        problem = self.collectives_ok(records, case)
        if problem:
            kinds = ", ".join(r.kind for r in records) or "none"
            return self._result(WRONG, f"the numbers are right for {label}, but {problem} "
                                       f"(the compiled program has: {kinds}).")
        return None

    def _done(self) -> Result:
        return self._result(CORRECT, f"correct on all {len(self.cases)} shapes: right numbers "
                                     f"and the intended collectives.")

    def evaluate(self, answer) -> Result:
        from ..mesh import make_mesh

        if answer is Ellipsis or answer is None:
            return self._result(UNANSWERED, "not attempted yet: write the function, then run this cell.")
        if not callable(answer):
            return self._result(WRONG, f"expected a function, got {type(answer).__name__}.")
        mesh = make_mesh(self.mesh_shape, self.mesh_axes)
        for case in self.cases:
            label = self._label(case)
            try:
                fn, args = self.build(answer, case, mesh)
                lowered = fn.lower(*args)
                if self.program_ok is not None:
                    self.program_ok(lowered.as_text(), case)
                compiled = lowered.compile()
                wrong = self._judge(compiled, args, case, label)
            except Exception as e:  # the student's code: report, never raise
                return self._failed(answer, label, e)
            if wrong:
                return wrong
        return self._done()

    # -- the grader's two halves ----------------------------------------------------------
    def export_programs(self, answer) -> list[dict]:
        """In the student's kernel: per case, the program serialized by ``jax.export``
        ({"program": base64}), or the answer's data ({"value": ...}, with ``answer_args``),
        or what went wrong ({"error": text} / {"stub": bool})."""
        import base64

        import jax

        from ..mesh import make_mesh

        out = []
        mesh = make_mesh(self.mesh_shape, self.mesh_axes)
        for case in self.cases:
            try:
                if self.answer_args is not None:
                    value = answer(*self.answer_args(case))
                    if value is None:
                        raise NotAttempted
                    out.append({"value": value})
                    continue
                fn, args = self.build(answer, case, mesh)
                inner, where = getattr(fn, "fn", fn), getattr(fn, "mesh", None)
                if where is not None:
                    with jax.set_mesh(where):
                        fn.lower(*args)                # the wrapper's own checks
                        exp = jax.export.export(inner)(*args)
                else:
                    exp = jax.export.export(inner)(*args)
                out.append({"program": base64.b64encode(exp.serialize()).decode()})
            except NotAttempted:
                out.append({"stub": bool(is_stub(answer))})
            except Exception as e:
                out.append({"error": _clean_error(f"{type(e).__name__}: {e}")[:600]})
        return out

    def evaluate_exported(self, records: list, seed: int) -> Result:
        """In the grader's checker: judge what :meth:`export_programs` handed back, on
        input values drawn from ``seed`` (never the student's)."""
        import base64

        import jax
        import numpy as np

        from ..mesh import make_mesh

        if not isinstance(records, list) or len(records) != len(self.cases):
            return self._result(WRONG, "the program could not be read back from your notebook.")
        mesh = make_mesh(self.mesh_shape, self.mesh_axes)
        rng = np.random.default_rng(seed)
        stub = _Marked(True)
        for case, rec in zip(self.cases, records):
            label = self._label(case)
            if not isinstance(rec, dict):
                return self._result(WRONG, "the program could not be read back.")
            if "stub" in rec:
                return self._failed(_Marked(bool(rec["stub"])), label, NotAttempted())
            if "error" in rec:
                return self._failed(stub, label, str(rec["error"]))
            try:
                if self.answer_args is not None:
                    value = rec.get("value")
                    fn, args = self.build(lambda *a: value, case, mesh)
                    args = _redrawn(args, rng)
                    compiled = fn.lower(*args).compile()
                else:
                    template, args = self.build(_Marked(False), case, mesh)
                    args = _redrawn(args, rng)
                    exp = jax.export.deserialize(bytearray(base64.b64decode(rec["program"])))
                    problem = _exported_problem(exp, args)
                    if problem:
                        return self._result(WRONG, f"not yet ({label}): {problem}")
                    if self.program_ok is not None:
                        self.program_ok(exp.mlir_module(), case)
                    fn = jax.jit(exp.call)
                    where = getattr(template, "mesh", None)
                    if where is not None:
                        fn = type(template)(fn, where)
                    compiled = fn.lower(*args).compile()
                wrong = self._judge(compiled, args, case, label)
            except Exception as e:
                return self._failed(stub, label, e)
            if wrong:
                return wrong
        return self._done()


class _Marked:
    """A stand-in answer for the checker: not callable as the student's code, only marked
    as a stub or not (for :func:`is_stub`)."""

    def __init__(self, stub: bool):
        self.scalebook_stub = stub

    def __call__(self, *args):
        raise RuntimeError("the checker does not run the student's code")


def _redrawn(args, rng):
    """``args`` with the same shapes, dtypes and shardings, and new random values."""
    import jax
    import numpy as np

    out = []
    for a in args:
        if hasattr(a, "sharding") and hasattr(a, "shape"):
            v = rng.standard_normal(a.shape).astype(np.dtype(a.dtype))
            out.append(jax.device_put(v, a.sharding))
        else:
            out.append(a)
    return tuple(out)


_SAFE_TARGETS = {"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "xla.sdy.GlobalToLocalShape",
                 "xla.sdy.LocalToGlobalShape", "xla.sdy.FuncResultSharding", "annotate_device_placement",
                 "local_to_global_shape", "global_to_local_shape"}


def _exported_problem(exp, args) -> str | None:
    """Why an exported program cannot be the answer to these inputs, or None."""
    if exp.nr_devices != len(args[0].sharding.device_set if args else ()) and args:
        return f"the program is for {exp.nr_devices} devices, not {len(args[0].sharding.device_set)}"
    avals = [(tuple(a.shape), str(a.dtype)) for a in exp.in_avals]
    want = [(tuple(a.shape), str(a.dtype)) for a in args]
    if avals != want:
        return f"the program takes {avals}, expected {want}"
    for got, a in zip(exp.in_shardings_hlo, args):
        expected = a.sharding._to_xla_hlo_sharding(len(a.shape))
        if got is not None and got != expected:
            return "the program expects its inputs sharded otherwise than the exercise gives them"
    unsafe = _unsafe_calls(exp.mlir_module())
    if unsafe:
        return f"the program calls {unsafe}, which the grader does not run"
    return None


def _unsafe_calls(text: str) -> str:
    """The custom calls of a StableHLO module other than sharding markers ("" if none): a
    host callback or a foreign function would run code the grader never saw."""
    targets = set(re.findall(r"custom_call\s*@([\w.$-]+)", text))
    targets |= set(re.findall(r'call_target_name\s*=\s*"([^"]+)"', text))
    return ", ".join(sorted(t for t in targets if t not in _SAFE_TARGETS))


def statement_names(model=None, chip=None, **_):
    """Fields for a variant's statement: a LLaMA-3 model's size and name ("70B",
    "LLaMA-3 70B") and a chip's display and short names ("TPU v5e", "v5e"; "H100")."""
    from ..hardware import get_chip

    out = {}
    if model is not None:
        size = model.split("-", 1)[1].upper()
        out.update(size=size, model_name=f"LLaMA-3 {size}")
    if chip is not None:
        short = chip.split("-", 1)[1]
        out.update(chip_name=get_chip(chip).display_name,
                   chip_short=short.upper() if chip.startswith("gpu") else short)
    return out


def eight_bit_peak_hint(chip, days, why, rtol=0.03):
    """A hint pair for a training-time answer worked out at the chip's 8-bit peak (fp8 or
    int8, twice bf16's on every GPU of the table) instead of the dense bf16 one: ``days`` is
    the right answer, ``why`` the sentence that says why bf16 is meant. [] when the chip has
    no 8-bit peak."""
    from ..hardware import get_chip

    c = get_chip(chip)
    low = next((d for d in ("fp8", "int8") if getattr(c, f"{d}_flops", None)), None)
    if low is None:
        return []
    ratio = c.peak_flops(low) / c.bf16_flops
    def close(a):
        a = as_number(a)
        return a is not None and math.isclose(a, days / ratio, rel_tol=rtol)

    return [(close,
             f"that uses the {low} peak ({ratio:.2g}x the bf16 one); {why}")]


def mesh_inputs(shapes, seed):
    """Random float32 arrays of the given shapes, the same for every run with ``seed``."""
    import numpy as np
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def returns_something(answer):
    """Wrap a student's per-device function so that returning None means "not attempted"
    (or, for a function that does work, "has no return"). The wrapper takes the student's
    function's name, so JAX's messages name their function, not the check's."""
    @functools.wraps(answer)
    def body(*blocks):
        out = answer(*blocks)
        if out is None:
            raise NotAttempted
        return out
    return body
