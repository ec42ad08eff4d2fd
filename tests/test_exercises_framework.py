"""The exercise machinery itself: registry, printing, and behaviour on odd input."""

import pytest

from scalebook import exercises
from scalebook.exercises import core
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
    core._REGISTRY["0.1"] = ex
    try:
        r = evaluate("0.1", 1.0)
        assert r.status == "wrong" and "could not check" in r.message
    finally:
        del core._REGISTRY["0.1"]


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


def test_declared_and_percentage_hints():
    """The ring factor and per-chip hints fire only where an exercise declares them; a
    percentage is named for fractions and ratios; a whole number rounded either way after
    a factor slip is named, an answer one off is not (issue 25)."""
    plain = NumericExercise(id="0.5", title="t", unit="s", reference=lambda: 1.0)
    ring = NumericExercise(id="0.6", title="t", unit="s", reference=lambda: 1.0, ring=8,
                           chips=16)
    assert "ring factor" not in plain.evaluate(8 / 7).message
    assert "(n - 1)/n = 7/8 (n = 8) left out" in ring.evaluate(8 / 7).message
    assert "applied where it does not belong" in ring.evaluate(7 / 8).message
    assert "ring factor" not in ring.evaluate(4 / 3).message      # not this ring's n
    assert "16x too large, the number of chips" in ring.evaluate(16.0).message
    assert "16x too small, the number of chips" in ring.evaluate(1 / 16).message
    assert "chips" not in plain.evaluate(16.0).message
    frac = NumericExercise(id="0.7", title="t", unit="fraction (0 to 1)",
                           reference=lambda: 0.27)
    assert "as a fraction between 0 and 1 (27% is 0.27)" in frac.evaluate(27.0).message
    ratio = NumericExercise(id="0.8", title="t", unit="ratio", reference=lambda: 1.98)
    assert "as a ratio" in ratio.evaluate(198.0).message
    assert "percentage" not in plain.evaluate(100.0).message
    hops = NumericExercise(id="0.9", title="t", unit="hops", integer=True,
                           reference=lambda: 11)
    assert "2x too small" in hops.evaluate(6).message and "2x" in hops.evaluate(5).message
    assert "1e+03x too small" in NumericExercise(
        id="0.10", title="t", unit="tokens", integer=True,
        reference=lambda: 153).evaluate(1).message
    three = NumericExercise(id="0.11", title="t", unit="chips", integer=True,
                            reference=lambda: 3)
    assert "2x" not in three.evaluate(2).message          # one off, not a factor of 2
    assert "prefix" not in hops.evaluate(12).message      # 11 x 1.024 rounded up is 12


def test_a_float_id_is_refused_with_a_message(capsys):
    r = evaluate(1.10, 3)
    assert r.status == "wrong" and 'check("1.10", ...)' in r.message and "same as 1.1" in r.message
    check(1.1, 3)
    assert "string" in capsys.readouterr().out
    assert evaluate(3, 1).status == "wrong"
    assert "not an exercise id" in evaluate("1.x", 1).message


def test_ids_with_leading_zeros_and_spaces_are_normalised():
    assert core.normalise_id(" 1.02 ") == "1.2"
    assert evaluate("01.2", ...).exercise_id == "1.2"


def test_unknown_exercise_in_a_known_chapter_lists_that_chapter():
    msg = evaluate("1.99", 3).message
    assert "unknown exercise '1.99'" in msg and "chapter 1 has 1.1" in msg


def test_printed_results_parse_back():
    results = [core.Result("1.2", s, "msg: x.") for s in core.STATUSES]
    text = "noise\n" + "\n".join(map(str, results)) + "\nmore noise"
    assert core.parse_results(text) == results


def _fresh(code):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_check_loads_only_its_own_chapter():
    out = _fresh("import sys\nfrom scalebook.exercises import evaluate\n"
                 "print(evaluate('1.2', ...).status)\n"
                 "print(sorted(m for m in sys.modules if m.startswith('scalebook.exercises.ch')))")
    assert out.splitlines() == ["not attempted", "['scalebook.exercises.ch01']"]


def test_a_broken_chapter_file_does_not_break_another_chapter(tmp_path):
    """Put a chapter file that raises on import into a copy of the package: chapter 1's
    checks still work, and the broken chapter's own check reports the error."""
    import shutil
    from pathlib import Path
    pkg = Path(exercises.__file__).resolve().parents[1]
    copy = tmp_path / "scalebook"
    shutil.copytree(pkg, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "exercises" / "ch77.py").write_text("raise RuntimeError('broken on purpose')\n")
    out = _fresh(f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
                 "import scalebook; assert scalebook.__file__.startswith(sys.path[0])\n"
                 "from scalebook.exercises import evaluate\n"
                 "print(evaluate('1.2', ...).status)\n"
                 "print(evaluate('77.1', 1).message)")
    first, second = out.splitlines()
    assert first == "not attempted"
    assert "broken on purpose" in second


def test_a_broken_hint_fails_under_the_tests_and_is_skipped_for_students(monkeypatch):
    ex = NumericExercise(id="0.5", title="t", unit="s", reference=lambda: 2.0,
                         hints=[(lambda a: a / 0 > 1, "never shown"), (lambda a: a > 3, "too big")])
    core._REGISTRY["0.5"] = ex
    try:
        monkeypatch.setenv("SCALEBOOK_STRICT_HINTS", "1")
        with pytest.raises(core.HintError, match="ZeroDivisionError"):
            evaluate("0.5", 5.0)
        monkeypatch.setenv("SCALEBOOK_STRICT_HINTS", "0")
        r = evaluate("0.5", 5.0)
        assert r.status == "wrong" and "too big" in r.message
    finally:
        del core._REGISTRY["0.5"]


# ---- kinds: messages for code answers, huge numbers, tolerances (issue 8) ----------------

from scalebook.exercises.kinds import CodeExercise, is_stub  # noqa: E402


def _code(unit, reference, **kw):
    return CodeExercise(id="0.6", title="t", unit=unit, reference=reference,
                        cases=[(3,), (5,)], **kw)


@pytest.mark.parametrize("unit,reference,answer,words", [
    ("s", lambda n: n * 1e-3, lambda n: n * 1.0, "s vs ms"),                  # ms for s
    ("s", lambda n: n * 1.0, lambda n: n * 1e-3, "s vs ms"),
    ("bytes", lambda n: n * 1e9, lambda n: n * 2**30, "GiB is 2**30 bytes"),  # GiB for GB
    ("bytes", lambda n: n * 1e3, lambda n: n * 2**10, "KiB is 2**10 bytes"),  # KiB for kB
    ("bytes", lambda n: n * 1e6, lambda n: n * 2**20, "MiB is 2**20 bytes"),  # MiB for MB
    ("bytes", lambda n: n * 1e9, lambda n: n * 8e9, "bits vs bytes"),        # bits for bytes
    ("bytes", lambda n: n * 8e9, lambda n: n * 1e9, "bits vs bytes"),
    ("s", lambda n: (n * 1e-3, n * 2e-3), lambda n: (n * 1.0, n * 2.0), "s vs ms"),  # pairs
])
def test_code_answers_get_unit_hints(unit, reference, answer, words):
    r = _code(unit, reference).evaluate(answer)
    assert r.status == "wrong" and words in r.message, r


def test_code_unit_hints_need_a_unit_and_one_factor():
    assert "ms" not in _code("", lambda n: n * 1e-3).evaluate(lambda n: n * 1.0).message
    # the two numbers of a pair off by different factors: no unit hint
    r = _code("s", lambda n: (n * 1.0, n * 2.0)).evaluate(lambda n: (n * 1e3, n * 2.0))
    assert r.status == "wrong" and "units" not in r.message, r


def _stub(n):
    ...


def _stub_with_docstring(n):
    """Return the answer."""


def _forgot_return(n):
    result = n * 2      # noqa: F841  (computed, never returned)


def test_a_function_that_returns_none_has_no_return_but_a_stub_is_not_attempted():
    ex = _code("", lambda n: n * 2)
    assert is_stub(_stub) and is_stub(_stub_with_docstring) and is_stub(lambda n: None)
    assert not is_stub(_forgot_return) and not is_stub(print)
    assert ex.evaluate(_stub).status == "not attempted"
    assert ex.evaluate(_stub_with_docstring).status == "not attempted"
    r = ex.evaluate(_forgot_return)
    assert r.status == "wrong", r
    assert "your function has no return (it returned None)" in r.message, r
    # None on a later case only (a return on one branch): named with its inputs
    r = ex.evaluate(lambda n: n * 2 if n == 3 else print(end=""))
    assert r.status == "wrong" and "no return" in r.message and "(5,)" in r.message, r


def test_huge_integers_get_a_message_not_an_overflow():
    num = NumericExercise(id="0.7", title="t", unit="bytes", reference=lambda: 2.0)
    for answer in (10**400, -10**400):
        r = num.evaluate(answer)
        assert r.status == "wrong" and "could not check" not in r.message, r
        assert "401 digits" in r.message and "too large" in r.message, r
    code = _code("tokens", lambda n: n, compare=lambda got, want: exercises.as_number(got) == want)
    r = code.evaluate(lambda n: 10**400)
    assert r.status == "wrong" and "401 digits" in r.message, r
    r = _code("s", lambda n: (1.0, 2.0)).evaluate(lambda n: (1.0, 10**400))
    assert r.status == "wrong" and "401 digits" in r.message, r
    # through evaluate() of real exercises, numeric and code
    assert "401 digits" in evaluate("1.4", 10**400).message
    assert "401 digits" in evaluate("1.10", lambda D, F, chip: 10**400).message
    assert "401 digits" in evaluate("4.12", lambda *a: 10**400).message


def test_a_tight_tolerance_is_printed_without_rounding_to_zero():
    ex = NumericExercise(id="0.8", title="t", unit="bytes", reference=lambda: 2.0, rtol=0.001)
    r = ex.evaluate(2.01)
    assert "0.1%" in r.message and "0%)" not in r.message, r
    assert "off by more than 0.1%" in evaluate("4.7", 1.01 * get_exercise("4.7").reference()).message


def test_an_answer_rounded_too_far_is_told_so():
    ex = NumericExercise(id="0.9", title="t", unit="bytes", reference=lambda: 1.1288e12, rtol=0.02)
    r = ex.evaluate(1.1e12)                              # 2 significant figures: 2.5% off
    assert "2 significant figures" in r.message and "GiB" not in r.message, r
    assert "KiB" in ex.evaluate(1.1288e12 / 1.024).message   # a real prefix slip still is one
    assert "GiB" in ex.evaluate(1.1288e12 / 1.024 ** 3).message
    assert "1 significant figure" in ex.evaluate(1e12).message


def test_the_graders_stand_in_keeps_a_stub_apart_from_a_missing_return():
    from scalebook import grade
    from scalebook.exercises import get_exercise
    cases = [list(c) for c in get_exercise("1.10").cases]
    calls = [{"value": None} for _ in cases]
    assert evaluate("1.10", grade._replay(calls, cases, stub=True)).status == "not attempted"
    r = evaluate("1.10", grade._replay(calls, cases, stub=False))
    assert r.status == "wrong" and "no return" in r.message, r


def test_answers_in_float32_are_judged_at_float32_precision():
    """A right answer computed with jnp in float32 is right (issue 25: 7.11 said "wrong
    result (got Array(3.3616, dtype=float32))"); a whole-number answer from a float
    computation is read as the whole number, and says so."""
    import jax.numpy as jnp
    import numpy as np

    from scalebook.exercises.kinds import dtype_rtol, same_number

    assert dtype_rtol(1.0) == 0 and dtype_rtol(np.float64(1)) == 0 and dtype_rtol(3) == 0
    assert 0 < dtype_rtol(np.float32(1)) < 1e-6 and dtype_rtol(jnp.bfloat16(1)) > 1e-3
    assert same_number(np.float32(405_853_388_800), 405_853_388_800)
    assert not same_number(405_853_388_801.0, 405_853_388_800)
    assert not same_number(np.float32(405_853_388_800 * (1 + 1e-5)), 405_853_388_800)
    f32 = jnp.float32(get_exercise("1.1").reference())
    assert evaluate("1.1", f32).correct
    r = evaluate("1.4", get_exercise("1.4").reference() + 3.3e-10)
    assert r.correct and "read" in r.message
    assert not evaluate("1.4", get_exercise("1.4").reference() + 0.4).correct


ODD_RETURNS = ["a string", None, (1,), [1, 2, 3, 4], {"a": 1}, float("nan"), -1, 10**400]


@pytest.mark.parametrize("ex_id", [i for i in exercise_ids()
                                   if isinstance(get_exercise(i), CodeExercise)])
def test_a_code_answer_of_the_wrong_type_gets_a_message_never_a_hint_error(ex_id):
    """Under strict hints (this suite), a hint predicate that raises fails: a function
    returning a string, a short tuple or a huge int must get a message, not break a hint
    (issue 25: 7.11's hints raised TypeError on a string)."""
    for value in ODD_RETURNS:
        r = evaluate(ex_id, lambda *args, value=value: value)
        assert r.status == "wrong" and r.message, (value, r)


def test_a_choice_is_recognised_in_any_case_and_with_any_word_separator():
    """"All Gather", "all_gather" and "--all-gather" all spell the choice "all-gather";
    an alias (a flag's full name, say) maps to its choice; anything else is told the
    choices. The recorded form (core.well_formed) agrees."""
    from scalebook.exercises.kinds import ChoiceExercise
    ex = ChoiceExercise(id="99.7", title="t", choices=("all-gather", "compute_bound"),
                        reference=lambda: "all-gather",
                        aliases={"xla_all_gather": "all-gather"},
                        hints={"compute_bound": "no."})
    for spelling in ("all-gather", "All Gather", "all_gather", "--ALL-GATHER ",
                     "xla-all-gather"):
        assert ex.evaluate(spelling).status == "correct", spelling
    assert ex.evaluate("Compute bound").message == "not yet: no."
    assert "one of" in ex.evaluate("allgather").message
    assert ex.choice_of(3) is None and ex.choice_of("compute-bound") == "compute_bound"
