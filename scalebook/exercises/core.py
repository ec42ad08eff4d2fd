"""The exercise machinery's core: results, the registry, and ``check``.

Nothing here knows what an exercise asks; the kinds of answer (a number, a choice, a
function, a program on the mesh) are in :mod:`scalebook.exercises.kinds`, and each
chapter's exercises in ``chNN.py``. ``check("5.3", ...)`` imports only chapter 5's file,
so a broken chapter file cannot break another chapter's checks.

The printed form of a result, ``✔ Exercise 1.3: correct.``, is defined once here
(:data:`MARKS`, :func:`parse_results`); the grader reads printed results with it.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import numbers
import os
import re
from dataclasses import dataclass
from typing import Any

from ..errors import UnknownNameError

__all__ = ["CORRECT", "WRONG", "UNANSWERED", "STATUSES", "MARKS", "Result", "Exercise",
           "register", "get_exercise", "exercise_ids", "chapter_ids", "evaluate", "check",
           "normalise_id", "parse_results", "HintError", "strict_checks", "variant_seed",
           "draw_variant", "record", "well_formed"]

CORRECT, WRONG, UNANSWERED = "correct", "wrong", "not attempted"
STATUSES = (CORRECT, WRONG, UNANSWERED)
MARKS = {CORRECT: "✔", WRONG: "✘", UNANSWERED: "…"}
_MARK_STATUS = {m: s for s, m in MARKS.items()}
_RESULT_LINE = re.compile(r"^(" + "|".join(map(re.escape, MARKS.values())) +
                          r") Exercise (\d+\.\d+): (.*)$", re.M)
_ID = re.compile(r"^(\d+)\.(\d+)$")


@dataclass(frozen=True)
class Result:
    exercise_id: str
    status: str          # "correct", "wrong" or "not attempted"
    message: str

    @property
    def correct(self) -> bool:
        return self.status == CORRECT

    def __str__(self) -> str:
        return f"{MARKS[self.status]} Exercise {self.exercise_id}: {self.message}"


def parse_results(text: str) -> list[Result]:
    """Every printed result line in ``text``, in order (the inverse of ``str(Result)``)."""
    return [Result(ex_id, _MARK_STATUS[mark], message)
            for mark, ex_id, message in _RESULT_LINE.findall(text)]


@dataclass
class Exercise:
    id: str
    title: str

    def evaluate(self, answer) -> Result:  # pragma: no cover - abstract
        raise NotImplementedError

    def _result(self, status: str, message: str) -> Result:
        return Result(self.id, status, message)

    # Variants (opt-in; see kinds.VariedNumericExercise). An exercise without them has none.
    def draw(self, seed: bytes) -> dict | None:
        """The parameters of the variant that ``seed`` picks; None: this exercise has none."""
        return None

    def with_variant(self, params: dict) -> "Exercise":
        """This exercise with other parameters (its statement and check follow them)."""
        raise UnknownNameError(f"exercise {self.id} has no variants")


def normalise_id(exercise_id) -> str:
    """ "1.10" stays "1.10"; a float or int id is refused (1.10 as a float *is* 1.1)."""
    if isinstance(exercise_id, bool) or isinstance(exercise_id, numbers.Number):
        raise TypeError(f"write the exercise id as a string, e.g. check(\"1.10\", ...): "
                        f"{exercise_id!r} is a number, and the number 1.10 is the same as 1.1")
    if not isinstance(exercise_id, str):
        raise TypeError(f"the exercise id must be a string such as \"3.4\"; "
                        f"got {type(exercise_id).__name__}")
    key = exercise_id.strip()
    if not _ID.match(key):
        raise UnknownNameError(f"{exercise_id!r} is not an exercise id: write chapter.number, "
                               f"e.g. \"3.4\"")
    chapter, number = (int(p) for p in key.split("."))
    return f"{chapter}.{number}"


class HintError(RuntimeError):
    """A check's own hint predicate failed. Raised only in strict mode (the book's tests set
    SCALEBOOK_STRICT_HINTS=1); in a student's notebook the broken hint is skipped."""


def strict_checks() -> bool:
    return os.environ.get("SCALEBOOK_STRICT_HINTS", "") not in ("", "0")


_REGISTRY: dict[str, Exercise] = {}
_LOADED: set[int] = set()


def register(exercise: Exercise) -> Exercise:
    if exercise.id in _REGISTRY:
        raise ValueError(f"exercise {exercise.id} registered twice")
    _REGISTRY[exercise.id] = exercise
    return exercise


def _chapter_module(chapter: int):
    return f"{__package__}.ch{chapter:02d}"


def _load_chapter(chapter: int) -> bool:
    """Import ``chNN.py`` for ``chapter`` once; False if the chapter has no exercises."""
    if chapter in _LOADED:
        return True
    try:
        importlib.import_module(_chapter_module(chapter))
    except ModuleNotFoundError as e:
        if e.name != _chapter_module(chapter):
            raise
        return False
    _LOADED.add(chapter)
    return True


def _chapters() -> list[int]:
    import pkgutil

    from . import __path__ as pkg_path
    return sorted(int(m.name[2:]) for m in pkgutil.iter_modules(pkg_path)
                  if re.fullmatch(r"ch\d\d", m.name))


def _key(ex_id: str) -> tuple[int, int]:
    return tuple(int(p) for p in ex_id.split("."))


def chapter_ids(chapter: int) -> list[str]:
    """The exercise ids of one chapter, in order (loads only that chapter)."""
    _load_chapter(int(chapter))
    return sorted((k for k in _REGISTRY if _key(k)[0] == int(chapter)), key=_key)


def exercise_ids() -> list[str]:
    """All registered exercise ids, in chapter then number order (loads every chapter)."""
    for ch in _chapters():
        _load_chapter(ch)
    return sorted(_REGISTRY, key=_key)


def get_exercise(exercise_id) -> Exercise:
    key = normalise_id(exercise_id)
    chapter = _key(key)[0]
    _load_chapter(chapter)
    if key not in _REGISTRY:
        known = chapter_ids(chapter)
        where = (f"chapter {chapter} has {', '.join(known)}" if known
                 else f"there are no exercises for chapter {chapter}")
        raise UnknownNameError(f"unknown exercise {key!r}; {where}")
    return _REGISTRY[key]


def variant_seed(secret: bytes | str, student: str, exercise_id: Any) -> bytes:
    """HMAC-SHA256 of (exercise, student) under the instructor's secret: the seed of a
    student's variant. Without the secret it cannot be predicted; with it, re-derived."""
    if isinstance(secret, str):
        secret = secret.encode()
    if not secret:
        raise ValueError("the instructor's secret is empty")
    message = f"scalebook variant\0{normalise_id(exercise_id)}\0{student}".encode()
    return hmac.new(secret, message, hashlib.sha256).digest()


def draw_variant(exercise_id: Any, secret: bytes | str, student: str) -> dict | None:
    """The parameters of ``student``'s variant of an exercise (None if it has no variants)."""
    ex = get_exercise(exercise_id)
    return ex.draw(variant_seed(secret, student, ex.id))


def evaluate(exercise_id: Any, answer: Any, variant: dict | None = None,
             cases: list | None = None) -> Result:
    """Check ``answer`` and return a Result (never raises on the answer itself).

    ``variant`` (the parameters of an assignment's variant, a dict) checks the answer to
    that variant of the exercise instead of the chapter's own numbers. ``cases`` (code
    exercises) checks a function on exactly these inputs: the grader's."""
    try:
        ex = get_exercise(exercise_id)
    except (UnknownNameError, TypeError) as e:
        return Result(str(exercise_id), WRONG, str(e))
    except Exception as e:  # the chapter's file itself is broken: say so, affect nothing else
        return Result(str(exercise_id), WRONG, f"could not load the checks of this chapter "
                                               f"({type(e).__name__}: {e}).")
    if variant is not None:
        try:
            ex = ex.with_variant(variant)
        except Exception as e:  # a variant that does not exist: the answer cannot be right
            return Result(ex.id, WRONG, f"this variant cannot be checked ({e}).")
    if cases is not None and hasattr(ex, "with_cases"):
        ex = ex.with_cases(cases)
    try:
        return ex.evaluate(answer)
    except HintError:
        raise                   # strict mode only: a broken hint fails the book's tests
    except Exception as e:  # a bug in a check must not crash a student's notebook
        return Result(ex.id, WRONG, f"could not check this answer ({type(e).__name__}: {e}).")


def check(exercise_id: Any, answer: Any, variant: dict | None = None) -> None:
    """Print whether ``answer`` to exercise ``exercise_id`` is correct, with a hint if not.
    An assignment's notebook passes its ``variant`` (see :func:`evaluate`)."""
    print(evaluate(exercise_id, answer, variant=variant))


def well_formed(exercise_id: Any, answer: Any) -> tuple[bool, str]:
    """Whether ``answer`` has the form the exercise wants (a finite number, a whole number,
    one of the choices, a function), and a sentence saying so. Never compares it with the
    reference: an assignment's variant is judged by the grader alone."""
    from .kinds import ChoiceExercise, NumericExercise, _too_big, as_number

    ex = get_exercise(exercise_id)
    if answer is Ellipsis:
        return False, "not attempted yet: replace ... with your answer."
    if isinstance(ex, NumericExercise):
        unit = f" (in {ex.unit})" if ex.unit else ""
        big = _too_big(answer)
        if big:
            return False, f"that is {big}"
        value = as_number(answer)
        if value is None:
            return False, f"expected a number{unit}, got {type(answer).__name__} {answer!r:.60}."
        if value != value or value in (float("inf"), float("-inf")):
            return False, f"expected a finite number, got {value}."
        if ex.integer and value != round(value):
            return False, f"expected a whole number{unit}, got {value}."
        own = float(ex.reference())      # the chapter's numbers, never the variant's
        if own and value and ((value > 0) != (own > 0)):
            return False, "the sign looks wrong for this quantity."
        if own and value and not 1e-4 <= abs(value / own) <= 1e4:
            return True, (f"recorded: a number{unit}, but more than 10,000x away from the size "
                          f"this quantity has with the chapter's numbers: check the units.")
        return True, f"recorded: a number{unit}."
    if isinstance(ex, ChoiceExercise):
        if ex.choice_of(answer) is None:
            return False, f"answer with one of {', '.join(map(repr, ex.choices))}."
        return True, "recorded: one of the choices."
    if not callable(answer):
        return False, f"expected a function, got {type(answer).__name__}."
    return True, "recorded: a function."


def record(exercise_id: Any, answer: Any) -> None:
    """An assignment's answer cell for an exercise with the student's own numbers: says
    whether the answer is well-formed, never whether it is right (the grader decides, from
    numbers it re-derives)."""
    ok, message = well_formed(exercise_id, answer)
    mark = "✎" if ok else MARKS[UNANSWERED if answer is Ellipsis else WRONG]
    print(f"{mark} Exercise {normalise_id(exercise_id)}: {message}"
          + (" The grader checks it with your own numbers." if ok else ""))
