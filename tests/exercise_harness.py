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

import math

import pytest

from scalebook.exercises import NumericExercise, chapter_ids, evaluate, get_exercise

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
    return tests
