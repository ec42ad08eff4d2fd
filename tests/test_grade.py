"""The grader's parts: keys, points, finding submissions, reading notebooks, rebuilding the
kernel's values, the secret; and one real run of a chapter's solutions against its key.
The class of synthetic submissions is in tests/test_coursework_grader.py."""

import json
import zipfile
from pathlib import Path

import nbformat
import pytest

from scalebook import grade
from scalebook.exercises import evaluate

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "01_rooflines.ipynb"


def test_a_master_notebook_is_a_key():
    key = grade.load_key(CHAPTER)
    assert [i.id for i in key.items] == [f"1.{n}" for n in range(1, 12)]
    names = {i.id: i.answer for i in key.items}
    assert names["1.1"] == "answer_1_1" and names["1.9"] == "matmul_time_bounds"
    assert not key.varied and key.students == []


def test_key_json_and_points(tmp_path):
    path = tmp_path / "key.json"
    path.write_text(json.dumps({"format": grade.KEY_FORMAT, "title": "W1", "students": ["a"],
                                "secret_check": None, "exercises": [
                                    {"id": "1.1", "answer": "answer_1_1", "points": 2,
                                     "variant": True},
                                    {"id": "1.8", "answer": "answer_1_8"}]}))
    key = grade.load_key(path)
    assert key.varied and [i.points for i in key.items] == [2.0, 1.0]
    grade.apply_points(key, "1.8=0.5")
    assert [i.points for i in key.items] == [2.0, 0.5]
    with pytest.raises(ValueError, match="1.3"):
        grade.apply_points(key, "1.3=2")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a scalebook key"):
        grade.load_key(tmp_path / "bad.json")


def test_submissions_by_file_folder_and_zip(tmp_path):
    subs = tmp_path / "subs"
    (subs / "carol").mkdir(parents=True)
    (subs / "alice.ipynb").write_text("{}")
    (subs / "carol" / "week1.ipynb").write_text("{}")
    (subs / "carol" / ".ipynb_checkpoints").mkdir()
    (subs / "carol" / ".ipynb_checkpoints" / "week1-checkpoint.ipynb").write_text("{}")
    with zipfile.ZipFile(tmp_path / "more.zip", "w") as z:
        z.writestr("export/dave/nb.ipynb", "{}")
        z.writestr("export/erin/a.ipynb", "{}")
        z.writestr("export/erin/b.ipynb", "{}")
    found = grade.find_submissions([subs, tmp_path / "more.zip"], tmp_path / "work")
    by = {s.student: s for s in found}
    assert sorted(by) == ["alice", "carol", "dave", "erin"]
    assert by["alice"].problem is None and by["carol"].path.name == "week1.ipynb"
    assert "2 notebooks for one student" in by["erin"].problem
    with pytest.raises(FileNotFoundError):
        grade.find_submissions([tmp_path / "nope"], tmp_path / "work")


def test_unsafe_zip_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as z:
        z.writestr("../../escape.ipynb", "{}")
    with pytest.raises(ValueError, match="unsafe path"):
        grade.find_submissions([tmp_path / "evil.zip"], tmp_path / "work")


@pytest.mark.parametrize("text, why", [("", "the file is empty"), ("{not json", "not a notebook"),
                                       ("[1, 2]", "not a notebook"),
                                       ('{"cells": 3}', "not a notebook")])
def test_unreadable_notebooks(tmp_path, text, why):
    p = tmp_path / "x.ipynb"
    p.write_text(text)
    nb, problem = grade.read_notebook(p)
    assert nb is None and why in problem


def test_values_are_rebuilt_from_plain_json():
    assert grade.decode({"ellipsis": True}) is ...
    assert grade.decode({"seq": [1, 2.5], "type": "tuple"}) == (1, 2.5)
    assert grade.decode({"seq": [1], "type": "list"}) == [1]
    odd = grade.decode({"opaque": "ndarray", "repr": "array([1, 2])"})
    assert type(odd).__name__ == "ndarray" and repr(odd) == "array([1, 2])"
    r = evaluate("1.1", odd)
    assert r.status == "wrong" and "expected a number" in r.message and "ndarray" in r.message


def test_a_function_answer_is_replayed_from_its_recorded_calls():
    from scalebook.exercises import get_exercise

    cases = grade.function_cases("1.10", b"seed")
    want = [get_exercise("1.10").reference(*c) for c in cases]
    fn = grade._replay([{"value": w} for w in want], cases)
    assert evaluate("1.10", fn, cases=cases).status == "correct"
    boom = grade._replay([{"raised": ["ZeroDivisionError", "division by zero"]}], cases)
    r = evaluate("1.10", boom, cases=cases)
    assert r.status == "wrong" and "ZeroDivisionError: division by zero" in r.message
    # an input the grader did not send (the check's own drawn ones) is never answered
    with pytest.raises(RuntimeError, match="did not run"):
        fn(1, 2, "tpu-v5e")


def test_richer_values_come_back_as_themselves():
    import numpy as np
    from jax.sharding import PartitionSpec as P

    a = grade.decode({"array": [[1.0, 2.0], [3.0, 4.0]], "dtype": "float32"})
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == (2, 2)
    assert grade.decode({"pspec": ["x", None, {"seq": ["x", "y"], "type": "tuple"}]}) == \
        P("x", None, ("x", "y"))
    assert type(grade.decode({"pspec": [3]})).__name__ == "PartitionSpec"   # opaque, not P
    assert grade.decode({"dict": {"tp": 8, "remat": {"seq": ["a"], "type": "tuple"}}}) == \
        {"tp": 8, "remat": ("a",)}
    plans = ["plan a", "plan b"]
    assert grade.decode({"arg": [0, 1]}, (plans, 0.5)) == "plan b"
    assert "did not send" in repr(grade.decode({"arg": [5]}, (plans,)))
    # only this package's dataclasses are rebuilt; any other name stays opaque
    got = grade.decode({"object": "scalebook.hardware:Chip", "fields": {"name": 1}})
    assert type(got).__name__ == "Chip" and not hasattr(got, "name")
    odd = grade.decode({"object": "os:system", "fields": {}})
    assert type(odd).__name__ == "system" and "a system" in repr(odd)


def test_a_varied_key_needs_the_right_secret(tmp_path):
    key = grade.Key([grade.KeyItem("1.1", "answer_1_1", 1, True)],
                    secret_check=grade.secret_check(b"right"))
    with pytest.raises(ValueError, match="secret"):
        grade.grade_submissions([], key, None, logdir=tmp_path)
    with pytest.raises(ValueError, match="does not match"):
        grade.grade_submissions([], key, b"wrong", logdir=tmp_path)


def test_sizes():
    assert grade.parse_size("4GiB") == 4 * 2**30 and grade.parse_size("512M") == 512 * 2**20
    with pytest.raises(Exception):
        grade.parse_size("lots")


def test_the_chapter_solutions_get_full_marks_against_the_chapter_key(tmp_path):
    """The non-assignment path: a chapter's own notebook is the key; the solutions notebook
    (which answers every exercise) is graded by re-running it."""
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "model-student.ipynb").write_bytes((ROOT / "solutions" / "01_rooflines.ipynb").read_bytes())
    out = tmp_path / "out"
    assert grade.main([str(subs), "--key", str(CHAPTER), "--out", str(out), "--jobs", "1",
                       "--points", "1.9=2"]) == 0
    rows = (out / "grades.csv").read_text().splitlines()
    assert rows[0] == "student,exercise,status,points"
    assert rows[1:] == [f"model-student,1.{n},correct,{2 if n == 9 else 1}" for n in range(1, 12)]
    assert "12 of 12 points" in (out / "feedback" / "model-student.md").read_text()


def test_feedback_quotes_are_bounded():
    key = grade.load_key(CHAPTER)
    g = grade.Grade("mallory", None)
    for item in key.items:
        g.results[item.id], g.points[item.id] = ("wrong", "x" * 5000), 0.0
    g.notes = [f"cell {n} raised ValueError: " + "y" * 5000 for n in range(100)]
    text = grade._feedback(g, key)
    assert len(text) < 30_000 and "... and 80 more" in text


def test_feedback_shows_the_answer_the_expected_form_and_is_safe_html():
    key = grade.load_key(CHAPTER)
    g = grade.Grade("mallory", None)
    for item in key.items:
        g.results[item.id], g.points[item.id] = ("wrong", "not yet: <b>hint</b>"), 0.0
    g.answers["1.8"] = grade._short("<script>alert(1)</script>")
    g.answers["1.2"] = grade._short(0.25)
    md = grade._feedback(g, key)
    assert "| 1.2 | wrong | 0 | 0.25 | a number" in md
    assert "one of 'memory'" in md or "one of" in md
    html = grade._feedback_html(g, key)
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "&lt;b&gt;hint&lt;/b&gt;" in html
    assert len(grade._short("x" * 500)) <= 60


def test_partial_credit_counts_the_drawn_inputs_answered_right():
    """The share is of the inputs drawn for the student: right on all but the last earns
    (drawn - 1) / drawn; a table of the published cases (right on those only) earns 0."""
    from scalebook.exercises import get_exercise

    key = grade.load_key(CHAPTER)
    assert grade._how("1.10") == "function"
    ex = get_exercise("1.10")
    cases = grade.function_cases("1.10", b"seed")
    published, drawn = len(ex.cases), ex.drawn
    assert len(cases) == published + drawn and drawn >= 2
    right = [ex.reference(*c) for c in cases]

    def enc(v):
        return list(v) if isinstance(v, tuple) else v

    answers = {"all but the last": ([{"value": enc(r)} for r in right[:-1]] + [{"value": -1}],
                                    round((drawn - 1) / drawn, 4)),
               "published only": ([{"value": enc(r)} for r in right[:published]]
                                  + [{"value": -1}] * drawn, 0.0)}
    for name, (calls, share) in answers.items():
        rec = {"id": "1.10", "calls": calls}
        verdicts = grade.check_records([{"id": "1.10", "how": "function", "rec": rec,
                                         "cases": grade._pack(cases)}])
        for partial, want in ((False, 0.0), (True, share)):
            g = grade.Grade("carol", None)
            grade._evaluate_records(g, key, {"1.10": rec}, None, partial=partial,
                                    verdicts=verdicts)
            assert g.results["1.10"][0] == "wrong" and g.points["1.10"] == want, name


def test_forged_answer_lines_cannot_make_the_grader_allocate_or_reach_out():
    """What a kernel writes to its answers file is decoded in the grader's own process:
    an array of a wide string or object type (a forged "U20000000" would take GiBs), an
    integer too big for a float, and a class reached through a module of the package are
    refused or bounded; the package's own dataclasses still come back."""
    from scalebook.exercises import evaluate

    for dtype in ("U20000000", "object", "V2000000000", "S100000"):
        v = grade.decode({"array": ["a"] * 4, "dtype": dtype})
        assert isinstance(v, grade._Opaque), dtype
    assert grade.decode({"array": [1, 2], "dtype": "int32"}).tolist() == [1, 2]
    big = grade.decode({"bigint": 10**12})
    assert isinstance(big, int) and big.bit_length() <= 4097
    assert "too large" in evaluate("1.1", big).message
    same = [grade.Grade(n, None, results={"1.1": ("wrong", "")}, raw={"1.1": v})
            for n, v in (("a", big), ("b", big), ("c", 1.5))]
    assert "the same wrong answer" in grade.copy_report(same, grade.load_key(CHAPTER), None)
    for name in ("scalebook.grade:_Opaque", "scalebook.assign:KeyItem",
                 "scalebook.grade:os.stat_result", "os:stat_result"):
        assert isinstance(grade._rebuild(name, {}, None), grade._Opaque), name
    item = grade._rebuild("scalebook.grade:KeyItem", {"id": {"seq": []}, "answer": "a"}, None)
    assert isinstance(item, grade.KeyItem)


def test_a_notebook_made_for_another_student_cannot_take_their_row(tmp_path):
    """Two misnamed notebooks claim the same student (a classmate's copy next to the
    student's own): neither is graded as that student. One alone still is; a file name in
    another Unicode form of a roster id is that student."""
    import unicodedata

    def notebook(name, student):
        nb = nbformat.v4.new_notebook()
        nb.metadata["scalebook"] = {"student": student}
        path = tmp_path / f"{name}.ipynb"
        path.write_text(nbformat.writes(nb))
        return grade.Submission(name, path)

    roster = ["victim", "Zoë", "bob"]
    two = [notebook("Copy of victim", "victim"), notebook("Copy of Copy of victim", "victim")]
    subs, warnings = grade.match_roster(two, roster)
    assert sorted(s.student for s in subs) == ["Copy of Copy of victim", "Copy of victim"]
    assert all("2 notebooks made for 'victim'" in w for w in warnings)
    subs, _ = grade.match_roster(two[:1], roster)
    assert [s.student for s in subs] == ["victim"]
    decomposed = unicodedata.normalize("NFD", "Zoë")
    assert decomposed != "Zoë"
    subs, warnings = grade.match_roster([notebook(decomposed, "other")], roster)
    assert [s.student for s in subs] == ["Zoë"] and not warnings
    own = [notebook("bob", "bob"), notebook("mallory", "bob")]
    subs, warnings = grade.match_roster(own, roster)
    assert sorted(s.student for s in subs) == ["bob", "mallory"]
    assert "made for 'bob', who handed in a notebook of their own" in warnings[0]


def test_a_zip_bomb_is_cut_at_the_size_limit(tmp_path):
    """A member that unpacks to more than the notebook size limit is written only up to
    it, then reported as too big; the disk is not filled."""
    z = tmp_path / "class.zip"
    with zipfile.ZipFile(z, "w", compression=zipfile.ZIP_DEFLATED) as f:
        f.writestr("bomb.ipynb", b"\0" * (grade.MAX_NOTEBOOK_BYTES + 2**20))
        f.writestr("alice.ipynb", "{}")
        f.writestr("notes.txt", "not a notebook")
    subs = {s.student: s for s in grade.find_submissions([z], tmp_path / "work")}
    assert set(subs) == {"bomb", "alice"}
    assert subs["bomb"].path.stat().st_size == grade.MAX_NOTEBOOK_BYTES + 1
    assert "over the" in grade.read_notebook(subs["bomb"].path)[1]


def _solutions_notebook(n):
    return next((ROOT / "solutions").glob(f"{n:02d}_*.ipynb"))


@pytest.mark.parametrize("chapter", [
    pytest.param(n, marks=[] if n in (3, 7, 9) else [pytest.mark.slow])
    for n in range(2, 1 + max(int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9]*.ipynb")))])
def test_every_chapters_solutions_get_full_marks_through_the_sandboxes(chapter, tmp_path):
    """Every kind of answer through the real pipeline: values judged here; functions called
    in the kernel on published and drawn inputs (arrays in 7.12, serving plans in 8.12,
    traces in 9.5) and judged by the checker; programs on the mesh exported by the kernel
    and compiled, run and judged by the checker (3, 5, 9, 10). Chapters 3, 7 and 9 cover
    every kind in the quick tier; the rest run in the full suite."""
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "sol.ipynb").write_bytes(_solutions_notebook(chapter).read_bytes())
    key = next((ROOT / "notebooks").glob(f"{chapter:02d}_*.ipynb"))
    out = tmp_path / "out"
    assert grade.main([str(subs), "--key", str(key), "--out", str(out), "--jobs", "1"]) == 0
    rows = (out / "grades.csv").read_text().splitlines()[1:]
    wrong = [r for r in rows if not r.endswith(",correct,1")]
    assert rows and not wrong, (out / "feedback" / "sol.md").read_text()


def test_outputs_replace_planted_links_and_never_follow_them(tmp_path):
    """A link planted in the grading folder (feedback/alice.md, grades.csv) pointing at an
    instructor's file is replaced by the grader's file; the instructor's file is untouched."""
    key = grade.load_key(CHAPTER)
    g = grade.Grade("alice", None)
    for item in key.items:
        g.results[item.id], g.points[item.id] = ("wrong", "not yet."), 0.0
    victim = tmp_path / "instructor-notes.txt"
    victim.write_text("mine")
    out = tmp_path / "grading"
    (out / "feedback").mkdir(parents=True)
    for link in (out / "feedback" / "alice.md", out / "grades.csv", out / "summary.md"):
        link.symlink_to(victim)
    grade.write_outputs([g], key, out)
    assert victim.read_text() == "mine"
    for f in (out / "feedback" / "alice.md", out / "grades.csv", out / "summary.md"):
        assert f.is_file() and not f.is_symlink()


def test_a_result_line_from_the_kernel_never_counts(monkeypatch):
    """The kernel writes its own answers file: a "result": ["correct", ...] line there is
    the student's word. A value answer is judged from its value; an exercise of a kind the
    grader cannot judge outside the kernel gets no verdict, whatever the line says."""
    key = grade.load_key(CHAPTER)
    forged = {i.id: {"id": i.id, "result": ["correct", "forged"]} for i in key.items}
    g = grade.Grade("mallory", None)
    grade._evaluate_records(g, key, forged, None)
    assert g.total == 0
    monkeypatch.setattr(grade, "_how", lambda ex_id: "kernel")
    g = grade.Grade("mallory", None)
    grade._evaluate_records(g, key, forged, None)
    assert g.total == 0 and all(s == "wrong" for s, _ in g.results.values())
