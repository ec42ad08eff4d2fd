"""Every chapter can be assigned as coursework in which neighbours' answers differ.

An exercise *varies per student* when a student's answer depends on numbers the grader
draws for that student: a numeric exercise with variants (its statement shows the
student's numbers), or a code exercise whose function is checked on inputs drawn per
student (``generate``) as well as on its published cases. At least half of each chapter's
exercises vary, and each numeric variant has at least MIN_DISTINCT different answers over
a class of CLASS_SIZE (a symmetric formula whose variants are permutations fails here).
"""

import math
import re

import pytest

from scalebook.exercises import chapter_ids, evaluate, get_exercise
from scalebook.hardware import get_chip
from scalebook.exercises.core import _chapters, draw_variant
from scalebook.exercises.kinds import CodeExercise, MeshProgramExercise, VariedNumericExercise

SECRET = b"coverage secret"
CLASS_SIZE, MIN_DISTINCT = 50, 8
CLASS = [f"student{n:02d}" for n in range(CLASS_SIZE)]


def _varies(ex) -> bool:
    if isinstance(ex, VariedNumericExercise):
        return ex.draw(b"probe") is not None
    if isinstance(ex, CodeExercise):
        return ex.generate is not None
    if isinstance(ex, MeshProgramExercise):
        return True        # the grader's checker draws the input values per student
    return False


def _short(chip: str) -> str:
    """A chip as a title names it: "H100", "TPU v5e"."""
    words = get_chip(chip).display_name.split()
    return " ".join(words[:2]) if words[0] == "TPU" else words[0]


def _varied_numeric():
    return [i for ch in _chapters() for i in chapter_ids(ch)
            if isinstance(get_exercise(i), VariedNumericExercise)]


def _generated():
    return [i for ch in _chapters() for i in chapter_ids(ch)
            if isinstance(get_exercise(i), CodeExercise) and get_exercise(i).generate]


def test_every_code_exercise_draws_inputs():
    """Issue 25, item 4: a code exercise checked on its published cases alone passes a
    lookup table of their answers; each draws inputs per call (or per student), and
    test_drawn_inputs_are_valid_repeatable_and_new then runs the lookup table on it."""
    code = [i for ch in _chapters() for i in chapter_ids(ch)
            if isinstance(get_exercise(i), CodeExercise)]
    assert code and set(code) == set(_generated()), sorted(set(code) - set(_generated()))


@pytest.mark.parametrize("chapter", _chapters())
def test_at_least_half_of_each_chapter_varies_per_student(chapter):
    ids = chapter_ids(chapter)
    varied = [i for i in ids if _varies(get_exercise(i))]
    assert 2 * len(varied) >= len(ids), (
        f"chapter {chapter}: {len(varied)} of {len(ids)} exercises vary per student "
        f"({', '.join(varied)}); the rest: {', '.join(sorted(set(ids) - set(varied)))}")


@pytest.mark.parametrize("ex_id", _varied_numeric())
def test_a_class_gets_many_different_answers(ex_id):
    ex = get_exercise(ex_id)
    own = float(ex.reference())
    answers = set()
    for student in CLASS:
        params = draw_variant(ex_id, SECRET, student)
        assert params != ex.params
        variant = ex.with_variant(params)
        ref = float(variant.reference())
        answers.add(round(ref, 9) if not ex.integer else round(ref))
        assert not math.isclose(ref, own, rel_tol=2 * ex.rtol)
        assert evaluate(ex_id, ref, variant=params).correct
        if ref != 0:
            assert not evaluate(ex_id, own, variant=params).correct
        text = variant.text()
        assert "{" not in text.replace("${", "").replace("\\{", "") or "$" in text
        assert all(f"{{{k}}}" not in text for k in params)
        # the title and statement name the student's chip, never the chapter's ("on an
        # H100" over an A100 variant)
        if "chip" in params and _short(params["chip"]) != _short(ex.params["chip"]):
            named = re.escape(_short(ex.params["chip"])) + r"(?![\w.])"
            assert not re.search(named, f"{variant.title_text()} {text}"), (ex_id, params)
    assert len(answers) >= MIN_DISTINCT, f"{ex_id}: {len(answers)} different answers in a class " \
                                         f"of {CLASS_SIZE}"


@pytest.mark.parametrize("ex_id", _generated())
def test_drawn_inputs_are_valid_repeatable_and_new(ex_id):
    """The generator's inputs run through the reference, repeat for a seed, and are not
    all published cases (so a lookup table of the published answers fails)."""
    ex = get_exercise(ex_id)
    def key(case):           # arrays compare element-wise: compare the cases' text
        return repr(tuple(case))

    published = {key(c) for c in ex.cases}
    drawn = ex.drawn_cases(b"seed", n=12)
    assert list(map(key, drawn)) == list(map(key, ex.drawn_cases(b"seed", n=12)))
    assert list(map(key, drawn)) != list(map(key, ex.drawn_cases(b"other", n=12)))
    assert sum(1 for c in drawn if key(c) not in published) >= 6, ex_id
    # the grader's three drawn inputs are never a published case, for any student
    for student in range(40):
        assert not published & {key(c) for c in ex.drawn_cases(student.to_bytes(2, "big"))}
    answers = set()
    for args in drawn:
        want = ex.reference(*args)
        answers.add(repr(want)[:200])
    assert len(answers) >= 3, f"{ex_id}: drawn inputs give {len(answers)} different answers"

    table = {key(c): ex.reference(*c) for c in ex.cases}

    def lookup(*args):
        return table.get(key(args))

    lookup.scalebook_stub = False
    r = evaluate(ex_id, lookup)
    assert not r.correct, f"{ex_id}: a table of the published answers passed: {r}"
