"""Self-checking exercises.

In a notebook::

    from scalebook.exercises import check
    answer = ...                 # replace ... with your answer
    check("1.3", answer)         # prints: correct / not yet, with a hint / not attempted yet

``check`` never raises on a student's answer: a wrong type, a NaN, or student code that
crashes is reported as a message. Programs (tests, an instructor's grading script) use
:func:`~scalebook.exercises.core.evaluate`, which returns a
:class:`~scalebook.exercises.core.Result` instead of printing.

Layout: :mod:`.core` (results, the registry, ``check``; one chapter file is imported only
when one of its exercises is checked), :mod:`.kinds` (numeric, choice, code and mesh-program
answers), and one file per chapter, ``chNN.py``, whose reference answers are computed from
scalebook, never typed in. ``python tools/scaffold.py`` writes a new exercise or chapter.
"""

from .core import (CORRECT, MARKS, STATUSES, UNANSWERED, WRONG, Exercise, Result, chapter_ids,
                   check, evaluate, exercise_ids, get_exercise, normalise_id, parse_results,
                   record, register)
from .kinds import ChoiceExercise, CodeExercise, MeshProgramExercise, NumericExercise, as_number

__all__ = ["check", "record", "evaluate", "Result", "Exercise", "register", "get_exercise", "exercise_ids",
           "chapter_ids", "normalise_id", "parse_results", "NumericExercise", "CodeExercise",
           "ChoiceExercise", "MeshProgramExercise", "as_number", "CORRECT", "WRONG", "UNANSWERED",
           "STATUSES", "MARKS"]
