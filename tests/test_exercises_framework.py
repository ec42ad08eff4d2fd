"""The exercise machinery itself: registry, printing, and behaviour on odd input."""

import pytest

from scalebook import exercises
from scalebook.exercises import NumericExercise, check, evaluate, exercise_ids, get_exercise


def test_ids_are_unique_and_ordered():
    ids = exercise_ids()
    assert len(ids) == len(set(ids))
    assert ids == sorted(ids, key=lambda k: tuple(map(int, k.split("."))))
    assert "1.10" in ids and ids.index("1.10") > ids.index("1.9")


def test_unknown_exercise_is_reported_not_raised(capsys):
    r = evaluate("99.1", 3)
    assert r.status == "wrong" and "unknown exercise" in r.message
    check("99.1", 3)
    assert "unknown exercise '99.1'" in capsys.readouterr().out
    with pytest.raises(KeyError):
        get_exercise("99.1")


def test_check_prints_one_line(capsys):
    check("1.2", ...)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("… Exercise 1.2: not attempted")


def test_a_broken_reference_does_not_crash_the_notebook():
    ex = NumericExercise(id="0.1", title="broken", reference=lambda: 1 / 0)
    exercises._REGISTRY["0.1"] = ex
    try:
        r = evaluate("0.1", 1.0)
        assert r.status == "wrong" and "could not check" in r.message
    finally:
        del exercises._REGISTRY["0.1"]


def test_registering_twice_is_an_error():
    with pytest.raises(ValueError, match="registered twice"):
        exercises.register(NumericExercise(id="1.1", title="dup", reference=lambda: 1.0))


def test_generic_ratio_hints():
    ex = NumericExercise(id="0.2", title="t", unit="s", reference=lambda: 2.0)
    assert "2x too large" in ex.evaluate(4.0).message
    assert "1e+09x too large" in ex.evaluate(2e9).message
    # A 2.4% miss is a GiB/GB slip only when the answer is a size:
    assert "GiB" not in ex.evaluate(2.0 * 2**30 / 1e9).message
    size = NumericExercise(id="0.3", title="t", unit="bytes", reference=lambda: 2.0)
    assert "GiB" in size.evaluate(2.0 * 2**30 / 1e9).message
    assert "GiB" in NumericExercise(id="0.4", title="t", unit="GB", reference=lambda: 80.0).evaluate(80 * 1.024**3).message
    assert ex.evaluate(-2.0).status == "wrong"
    assert ex.evaluate(2.05).correct and not ex.evaluate(2.2).correct
