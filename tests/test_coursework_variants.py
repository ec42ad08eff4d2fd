"""Variants of exercises (opt-in, chapter 1's numeric ones) and the assignment builder."""

import json
import math
import shutil

import nbformat
import pytest

from scalebook import assign, grade
from scalebook.exercises import check, evaluate, get_exercise
from scalebook.exercises.core import draw_variant, variant_seed
from scalebook.exercises.kinds import VariedNumericExercise

VARIED = ["1.1", "1.2", "1.3", "1.4", "1.5", "1.6", "1.7"]
SECRET = b"a test secret"


@pytest.mark.parametrize("ex_id", VARIED)
def test_variants_are_drawn_from_the_secret_and_never_the_chapters_numbers(ex_id):
    ex = get_exercise(ex_id)
    assert isinstance(ex, VariedNumericExercise)
    own = ex.reference()
    drawn = [draw_variant(ex_id, SECRET, f"student{n}") for n in range(40)]
    assert drawn == [draw_variant(ex_id, SECRET, f"student{n}") for n in range(40)]  # re-derived
    assert drawn != [draw_variant(ex_id, b"another", f"student{n}") for n in range(40)]
    answers = set()
    for params in drawn:
        assert params != ex.params
        variant = ex.with_variant(params)
        answers.add(round(variant.reference(), 12))
        assert not math.isclose(variant.reference(), own, rel_tol=2 * ex.rtol)
        # The chapter's answer is wrong for the variant; the variant's own answer is right.
        assert evaluate(ex_id, own, variant=params).status == "wrong"
        assert evaluate(ex_id, variant.reference(), variant=params).status == "correct"
        assert all(f"{{{k}}}" not in variant.text() for k in params)
    assert len(answers) >= 3          # neighbours' answers differ (how much depends on the exercise)


def test_the_chapters_own_exercise_is_unchanged_by_the_variant_machinery():
    ex = get_exercise("1.2")
    assert ex.params == {"N": 1_000_000, "dtype": "bf16", "op": "add"}
    assert math.isclose(ex.reference(), 1 / 6)
    assert evaluate("1.2", 0.25).message == "not yet: the output vector must be written to HBM too."
    assert evaluate("1.2", 1 / 3).message == "not yet: each bf16 element takes 2 bytes."
    assert "1,000,000" in ex.text() and "bf16" in ex.text()


def test_a_variant_shows_its_own_hints():
    params = {"N": 4_000_000, "dtype": "fp32"}
    assert evaluate("1.2", 1 / 8, variant=params).message == \
        "not yet: the output vector must be written to HBM too."
    assert evaluate("1.2", 1 / 6, variant=params).message == "not yet: each fp32 element takes 4 bytes."


def test_bad_variants_are_reported_not_raised(capsys):
    assert "no parameter" in evaluate("1.1", 1.0, variant={"X": 1}).message
    assert "not one of" in evaluate("1.1", 1.0, variant={"chip": "tpu-v99"}).message
    assert "not a valid variant" in evaluate("1.3", 1.0, variant={"chip": "tpu-v5e",
                                                                  "dtype": "fp8"}).message
    assert "has no variants" in evaluate("1.8", "memory", variant={}).message
    assert get_exercise("1.8").draw(b"seed") is None and draw_variant("1.9", SECRET, "a") is None
    check("1.2", 1 / 12, variant={"dtype": "fp32"})
    assert capsys.readouterr().out.startswith("✔ Exercise 1.2: correct.")


def test_the_seed_is_an_hmac_of_exercise_and_student():
    assert variant_seed(SECRET, "alice", "1.1") == variant_seed(SECRET.decode(), "alice", "1.1")
    assert variant_seed(SECRET, "alice", "1.1") != variant_seed(SECRET, "alice", "1.2")
    assert variant_seed(SECRET, "alice", "1.1") != variant_seed(SECRET, "bob", "1.1")
    with pytest.raises(ValueError):
        variant_seed(b"", "alice", "1.1")


def _cells(nb):
    return [c.source for c in nb.cells]


def test_an_assignment_with_variants(tmp_path):
    key = assign.build_assignment(["1.1", "1.8", "1.9"], tmp_path, title="Week 1",
                                  students=["alice", "bob"], secret=SECRET, points="1.9=3")
    assert [(i.id, i.answer, i.points, i.variant) for i in key.items] == [
        ("1.1", "answer_1_1", 1.0, True), ("1.8", "answer_1_8", 1.0, False),
        ("1.9", "matmul_time_bounds", 3.0, False)]
    data = json.loads((tmp_path / "key.json").read_text())
    assert data["students"] == ["alice", "bob"] and data["secret_check"] == grade.secret_check(SECRET)
    assert SECRET.decode() not in (tmp_path / "key.json").read_text()
    for student in ("alice", "bob"):
        nb = nbformat.read(tmp_path / "students" / f"{student}.ipynb", as_version=4)
        nbformat.validate(nb)
        text = "\n".join(_cells(nb))
        params = draw_variant("1.1", SECRET, student)
        assert 'record("1.1", answer_1_1)' in text and "variant=" not in text
        assert json.dumps(params) not in text
        assert f"X[{params['B']}, {params['D']}]" in text          # the statement shows it
        assert 'check("1.8", answer_1_8)' in text and "### Exercise 1.9 ·" in text
        assert "from scalebook.exercises import check" in text      # the chapter's imports
        assert "setup" in nb.cells[1].metadata["tags"]
        assert nb.metadata["scalebook"]["student"] == student
        assert all(c.outputs == [] for c in nb.cells if c.cell_type == "code")
    answers = (tmp_path / "answers.md").read_text()
    assert "| alice | 1.1 |" in answers and "| bob | 1.1 |" in answers
    sols = nbformat.read(tmp_path / "solutions.ipynb", as_version=4)
    assert any(s.startswith("### Solution 1.9") for s in _cells(sols))


def test_an_assignment_without_variants_is_one_notebook(tmp_path):
    key = assign.build_assignment(["1.2", "2.1"], tmp_path)
    assert not key.varied and (tmp_path / "assignment.ipynb").exists()
    text = "\n".join(_cells(nbformat.read(tmp_path / "assignment.ipynb", as_version=4)))
    assert "### Exercise 1.2 ·" in text and "### Exercise 2.1 ·" in text and "variant=" not in text
    assert text.count("# Set-up: run this cell first") == 1


def test_assignment_errors(tmp_path):
    with pytest.raises(ValueError, match="both a roster"):
        assign.build_assignment(["1.1"], tmp_path, students=["a"])
    with pytest.raises(ValueError, match="twice"):
        assign.build_assignment(["1.1", "1.1"], tmp_path)
    with pytest.raises(ValueError, match="student ids"):
        assign.build_assignment(["1.1"], tmp_path, students=["../x"], secret=SECRET)
    with pytest.raises(Exception, match="unknown exercise"):
        assign.build_assignment(["1.99"], tmp_path)
    assert assign.main(["1.1", "--out", str(tmp_path / "o"), "--student", "a"]) == 2


@pytest.mark.slow   # grades notebooks in sandboxes
def test_mixed_case_and_non_ascii_ids_round_trip(tmp_path):
    """assign -> students answer their own variant -> grade: every id, whatever its case or
    script, earns full marks with its own variant and none with another's. (Deriving the
    seed from a lower-cased id would give Alice and alice one variant: caught here.)"""
    roster = ["Alice", "alice", "Zoë", "Łukasz-2", "bob"]
    key = assign.build_assignment(["1.1", "1.8"], tmp_path / "a", students=roster,
                                  secret=SECRET)
    answers = {s: get_exercise("1.1").with_variant(draw_variant("1.1", SECRET, s)).reference()
               for s in roster}
    assert len({round(a, 12) for a in answers.values()}) == len(roster)
    subs = tmp_path / "subs"
    subs.mkdir()
    right_1_8 = get_exercise("1.8").reference()

    def hand_in(student, as_who):
        nb = nbformat.read(tmp_path / "a" / "students" / f"{student}.ipynb", as_version=4)
        for c in nb.cells:
            for name, value in (("answer_1_1", answers[student]), ("answer_1_8", right_1_8)):
                if c.cell_type == "code" and c.source.startswith(f"{name} = ..."):
                    c.source = c.source.replace(f"{name} = ...", f"{name} = {value!r}", 1)
        nbformat.write(nb, subs / f"{as_who}.ipynb")

    for s in roster:
        hand_in(s, s)
    out = tmp_path / "grading"
    assert grade.main([str(subs), "--key", str(tmp_path / "a" / "key.json"), "--out", str(out),
                       "--jobs", "2", "--secret-file", str(_secret_file(tmp_path))]) == 0
    rows = (out / "grades.csv").read_text(encoding="utf-8").splitlines()[1:]
    assert sorted(rows) == sorted(f"{s},{ex},correct,1" for s in roster for ex in ("1.1", "1.8"))
    # Alice's notebook handed in as alice's: alice's variant, so 1.1 is wrong
    shutil.rmtree(subs)
    subs.mkdir()
    hand_in("Alice", "alice")
    out2 = tmp_path / "grading2"
    assert grade.main([str(subs), "--key", str(tmp_path / "a" / "key.json"), "--out", str(out2),
                       "--jobs", "1", "--secret-file", str(_secret_file(tmp_path))]) == 0
    rows = (out2 / "grades.csv").read_text(encoding="utf-8").splitlines()[1:]
    assert "alice,1.1,wrong,0" in rows and "alice,1.8,correct,1" in rows


def _secret_file(tmp_path):
    f = tmp_path / "secret"
    f.write_bytes(SECRET)
    return f


@pytest.mark.slow   # grades notebooks in sandboxes
def test_roster_check_gradebook_and_regrading_one_student(tmp_path, capsys):
    """A misnamed copy is graded as the roster student it was made for; an off-roster file
    is flagged; gradebook.csv has a row per student; --only regrades one student and keeps
    every other row, and summary.md and copies.md still cover the whole class."""
    roster = ["alice", "bob"]
    assign.build_assignment(["1.1", "1.8"], tmp_path / "a", students=roster, secret=SECRET)
    key = tmp_path / "a" / "key.json"
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    right = {s: get_exercise("1.1").with_variant(draw_variant("1.1", SECRET, s)).reference()
             for s in roster}

    def answered(student):
        nb = nbformat.read(tmp_path / "a" / "students" / f"{student}.ipynb", as_version=4)
        for c in nb.cells:
            if c.cell_type == "code" and c.source.startswith("answer_1_1 = ..."):
                c.source = c.source.replace("answer_1_1 = ...", f"answer_1_1 = {right[student]!r}")
        return nb

    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(answered("alice"), subs / "Copy of alice.ipynb")
    stray = nbformat.v4.new_notebook()
    stray.cells = [nbformat.v4.new_code_cell(f"answer_1_1 = {right['alice']!r}")]
    nbformat.write(stray, subs / "mallory.ipynb")
    out = tmp_path / "grading"
    args = [str(subs), "--key", str(key), "--out", str(out), "--secret-file", str(secret),
            "--jobs", "2"]
    assert grade.main(args) == 0
    err = capsys.readouterr().err
    assert "Copy of alice.ipynb: not on the roster; graded as 'alice'" in err
    assert "'mallory' is not on the roster" in err
    rows = (out / "grades.csv").read_text().splitlines()
    assert "alice,1.1,correct,1" in rows and "bob,1.1,no submission,0" in rows
    assert "mallory,1.1,wrong,0" in rows
    assert "graded as 'alice', the student it was made for" in (out / "feedback" / "alice.md").read_text()
    book = (out / "gradebook.csv").read_text().splitlines()
    assert book[0] == "student,total,max,1.1,1.8"
    assert "alice,1,2,1,0" in book and "bob,0,2,0,0" in book
    # bob hands in late: regrade bob only; alice's and mallory's rows and feedback stay
    alice_feedback = (out / "feedback" / "alice.md").read_text()
    nbformat.write(answered("bob"), subs / "bob.ipynb")
    (subs / "Copy of alice.ipynb").unlink()            # even if alice's file is gone now
    assert grade.main(args + ["--only", "bob"]) == 0
    rows = (out / "grades.csv").read_text().splitlines()
    assert "bob,1.1,correct,1" in rows and "alice,1.1,correct,1" in rows
    assert "mallory,1.1,wrong,0" in rows
    assert (out / "feedback" / "alice.md").read_text() == alice_feedback
    assert "bob,1,2,1,0" in (out / "gradebook.csv").read_text().splitlines()
    # the class-wide reports still cover the class, not only the student regraded
    assert "mallory's answer is the right one for alice's variant" in (out / "copies.md").read_text()
    assert "| 1.1 | 1 | 2/3 |" in (out / "summary.md").read_text()
    assert grade.main(args + ["--only", "zed"]) == 2


@pytest.mark.slow   # grades notebooks in sandboxes
def test_the_copy_report(tmp_path):
    """copies.md lists an answer that is another student's variant's, and a wrong answer
    several students share; the honest ones are not named."""
    roster = ["carol", "dave", "erin", "frank"]
    assign.build_assignment(["1.1"], tmp_path / "a", students=roster, secret=SECRET)
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    ref = {s: get_exercise("1.1").with_variant(draw_variant("1.1", SECRET, s)).reference()
           for s in roster}
    given = {"carol": ref["dave"], "dave": 1234.5, "erin": 1234.5, "frank": ref["frank"]}
    subs = tmp_path / "subs"
    subs.mkdir()
    for s in roster:
        nb = nbformat.read(tmp_path / "a" / "students" / f"{s}.ipynb", as_version=4)
        for c in nb.cells:
            if c.cell_type == "code" and c.source.startswith("answer_1_1 = ..."):
                c.source = c.source.replace("answer_1_1 = ...", f"answer_1_1 = {given[s]!r}")
        nbformat.write(nb, subs / f"{s}.ipynb")
    out = tmp_path / "grading"
    assert grade.main([str(subs), "--key", str(tmp_path / "a" / "key.json"), "--out",
                       str(out), "--secret-file", str(secret), "--jobs", "2"]) == 0
    report = (out / "copies.md").read_text()
    assert "carol's answer is the right one for dave's variant" in report
    assert "the same wrong answer, 1234.5 | dave, erin" in report
    assert "frank" not in report and SECRET.decode() not in report


def test_a_recorded_answer_is_checked_for_its_form_only(capsys):
    """An assignment's variant cell never says whether the answer is right: the right
    answer to the chapter's numbers and a wrong one get the same words."""
    from scalebook.exercises import record
    record("1.1", get_exercise("1.1").reference())
    right = capsys.readouterr().out
    record("1.1", 2 * get_exercise("1.1").reference())
    wrong = capsys.readouterr().out
    assert right == wrong and right.startswith("✎ Exercise 1.1: recorded: a number (in s).")
    record("1.1", "fast")
    assert "expected a number (in s)" in capsys.readouterr().out
    record("1.1", ...)
    assert capsys.readouterr().out.startswith("… Exercise 1.1: not attempted")
    record("1.4", 1.5)
    assert "whole number" in capsys.readouterr().out
    record("1.1", 1e9)
    assert "10,000x" in capsys.readouterr().out
    record("1.8", "memory")
    assert "one of the choices" in capsys.readouterr().out
