"""The grader's gradebook (scalebook.gradebook and grade.write_outputs): late
submissions under a late policy, and the Canvas and Gradescope exports. Most tests write
the outputs of made-up grades (no notebook runs); one runs the command on a class of
two."""

import csv
import io
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from scalebook import grade
from scalebook import gradebook as gb

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "01_rooflines.ipynb"
SOLUTIONS = ROOT / "solutions" / "01_rooflines.ipynb"
DEADLINE = datetime(2025, 3, 1, 17, 0, tzinfo=timezone(timedelta(hours=1)))


@pytest.mark.parametrize("text, kind, per_day, cap", [
    ("none", "none", 0, 1), ("ZERO", "zero", 0, 1), ("10%/day", "per-day", 0.1, 1),
    ("10%/day,cap=50%", "per-day", 0.1, 0.5), (" 12.5 % / day , cap = 30 % ", "per-day",
                                                0.125, 0.3)])
def test_late_policies(text, kind, per_day, cap):
    p = gb.parse_late_policy(text)
    assert (p.kind, p.per_day, p.cap) == (kind, per_day, cap)


@pytest.mark.parametrize("text", ["10%", "ten percent", "0%/day", "150%/day",
                                  "10%/week", "10%/day,cap=0%", "10%/day,max=50%", ""])
def test_a_policy_not_understood_is_refused_with_the_forms_it_takes(text):
    with pytest.raises(ValueError, match="late policy"):
        gb.parse_late_policy(text)


def test_penalties_grow_per_day_and_stop_at_the_cap():
    p = gb.parse_late_policy("10%/day,cap=50%")
    got = [p.penalty(d) for d in (0, 1, 3, 5, 9)]
    assert got == [0, 0.1, pytest.approx(0.3), 0.5, 0.5]
    assert gb.parse_late_policy("zero").penalty(1) == 1
    assert gb.parse_late_policy("none").penalty(9) == 0
    assert gb.parse_late_policy("30%/day").penalty(5) == 1          # never below zero


def test_times_need_a_zone():
    assert gb.parse_time("2025-03-01T17:00:00+01:00") == DEADLINE
    assert gb.parse_time("2025-03-01T16:00:00Z") == DEADLINE
    assert gb.parse_time("2025-03-01 08:00:00 -0800") == DEADLINE   # an LMS export
    with pytest.raises(ValueError, match="no time zone"):
        gb.parse_time("2025-03-01T17:00:00", "--deadline")
    with pytest.raises(ValueError, match="--deadline: 'next friday' is not an ISO"):
        gb.parse_time("next friday", "--deadline")


@pytest.mark.parametrize("late, days", [
    (timedelta(hours=-5), 0), (timedelta(0), 0), (timedelta(seconds=1), 1),
    (timedelta(hours=1), 1), (timedelta(days=2), 2), (timedelta(days=2.5), 3)])
def test_a_partial_day_counts_as_a_whole_one(late, days):
    assert gb.late_days(DEADLINE + late, DEADLINE) == days


def test_the_submission_times_file(tmp_path):
    f = tmp_path / "times.csv"
    f.write_text("Student,Submission Time\nalice,2025-03-01T16:59:00+01:00\nbob,\n\n"
                 "carol,2025-03-02 08:00:00 -0800\n")
    times = gb.read_submitted(f)
    assert sorted(times) == ["alice", "carol"]      # bob's empty time: flagged later
    f.write_text("student,submitted\nalice,2025-03-01T16:59:00\n")
    with pytest.raises(ValueError, match="line 2: '2025-03-01T16:59:00' has no time"):
        gb.read_submitted(f)
    f.write_text("name,when\nalice,2025-03-01T16:59:00Z\n")
    with pytest.raises(ValueError, match="must name a 'student' and a 'submitted'"):
        gb.read_submitted(f)
    f.write_text("student,submitted\nalice,2025-03-01T16:59Z\n"
                 "alice,2025-03-01T16:59Z\n")
    with pytest.raises(ValueError, match="appears twice"):
        gb.read_submitted(f)


# --------------------------------------------------------------------------------------
# The gradebook and the feedback, from made-up grades
# --------------------------------------------------------------------------------------

CLASS = {  # student: submitted (None: no time known; "absent": no notebook)
    "ontime": DEADLINE - timedelta(minutes=3),
    "hour": DEADLINE + timedelta(hours=1),
    "twohalf": DEADLINE + timedelta(days=2.5),
    "beyond": DEADLINE + timedelta(days=7, hours=2),
    "nostamp": None,
    "absent": "absent",
}


def _grades(key):
    grades = []
    for student, when in CLASS.items():
        g = grade.Grade(student, None if when == "absent" else Path(f"{student}.ipynb"))
        for item in key.items:
            status = grade.NO_SUBMISSION if when == "absent" else "correct"
            g.results[item.id] = (status, "")
            g.points[item.id] = 0.0 if when == "absent" else item.points
        grades.append(g)
    return grades


def _late(policy="10%/day,cap=50%"):
    times = {s: t for s, t in CLASS.items() if isinstance(t, datetime)}
    return gb.Deadline(DEADLINE, gb.parse_late_policy(policy), times)


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_the_gradebook_gets_the_late_columns_and_the_penalty(tmp_path):
    key = grade.load_key(CHAPTER)                       # 11 exercises, a point each
    grades = _grades(key)
    grade.write_outputs(grades, key, tmp_path, late=_late())
    rows = _csv_rows(tmp_path / "gradebook.csv")
    head = rows[0]
    assert head[:3] == ["student", "total", "max"]
    assert head[-4:] == ["submitted", "late_days", "penalty", "total_after_penalty"]
    got = {r[0]: dict(zip(head, r)) for r in rows[1:]}
    want = {  # late_days, penalty, total after it
        "ontime": ("0", "0%", "11"), "hour": ("1", "10%", "9.9"),
        "twohalf": ("3", "30%", "7.7"), "beyond": ("8", "50%", "5.5"),
        "nostamp": ("", "0%", "11"), "absent": ("", "0%", "0")}
    for student, (days, penalty, after) in want.items():
        r = got[student]
        assert (r["late_days"], r["penalty"], r["total_after_penalty"]) == \
            (days, penalty, after), student
        assert r["total"] == ("0" if student == "absent" else "11")
    assert got["hour"]["submitted"] == "2025-03-01T18:00:00+01:00"
    assert got["nostamp"]["submitted"] == "" and got["absent"]["submitted"] == ""


def test_the_feedback_says_how_the_penalty_was_applied(tmp_path):
    key = grade.load_key(CHAPTER)
    grade.write_outputs(_grades(key), key, tmp_path, late=_late())
    fb = {s: (tmp_path / "feedback" / f"{s}.md").read_text() for s in CLASS}
    assert "on time, no late penalty" in fb["ontime"]
    assert ("1 day late (a partial day counts as a whole one); late policy: 10% of "
            "the points off per late day, at most 50%, so 10% of the points were taken "
            "off. 11 of 11 points become 9.9.") in fb["hour"]
    assert "3 days late" in fb["twohalf"] and "become 7.7" in fb["twohalf"]
    assert "8 days late" in fb["beyond"]
    assert "50% of the points were taken off" in fb["beyond"]
    assert "No submission time was found for this notebook, so no late" in fb["nostamp"]
    assert "late" not in fb["absent"]
    html = (tmp_path / "feedback" / "hour.html").read_text()
    assert "become 9.9" in html


def test_zero_and_none_policies(tmp_path):
    key = grade.load_key(CHAPTER)
    for policy, hour, note in (("zero", "0", "a late submission earns no points"),
                               ("none", "11", "no penalty for lateness")):
        out = tmp_path / policy
        grade.write_outputs(_grades(key), key, out, late=_late(policy))
        got = {r[0]: r for r in _csv_rows(out / "gradebook.csv")[1:]}
        assert got["hour"][-1] == hour and got["ontime"][-1] == "11"
        assert note in (out / "feedback" / "hour.md").read_text()


def test_missing_times_and_unknown_people_are_warned_about():
    key = grade.load_key(CHAPTER)
    late = _late()
    late.times["stranger"] = DEADLINE
    people = {"ontime": gb.Person("ontime")}
    warnings = grade._gradebook_warnings(_grades(key), late, people)
    text = "\n".join(warnings)
    assert "no submission time for nostamp: no late penalty applied" in text
    assert "absent" not in text.split("\n")[0]      # no notebook: nothing to flag
    assert "submission times for students not graded here: stranger" in text
    assert "no roster details for hour, twohalf, beyond, nostamp, absent" in text


def test_without_a_deadline_the_gradebook_is_as_before(tmp_path):
    key = grade.load_key(CHAPTER)
    grade.write_outputs(_grades(key), key, tmp_path)
    head = _csv_rows(tmp_path / "gradebook.csv")[0]
    assert head == ["student", "total", "max"] + [i.id for i in key.items]
    assert "late" not in (tmp_path / "feedback" / "hour.md").read_text()


# --------------------------------------------------------------------------------------
# The exports
# --------------------------------------------------------------------------------------

ROSTER = """\
Student,First Name,Last Name,SIS User ID,SIS Login ID,Canvas ID,Email,Section
ontime,Ana,Lima,S001,alima,1001,ana@uni.example,Sec A
hour,Bo,Chen,S002,bchen,1002,bo@uni.example,Sec B
twohalf,,,,,,,
"""


def test_canvas_and_gradescope_exports(tmp_path):
    key = grade.load_key(CHAPTER)
    key.title = "Week 2"
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER + "beyond,,,,,,eve@uni.example,\n")
    people = gb.read_roster_info(roster)
    people["nostamp"] = gb.Person("nostamp", name="=HYPERLINK(\"x\")")   # a formula
    grade.write_outputs(_grades(key), key, tmp_path, late=_late(), people=people,
                        exports=["canvas", "gradescope"], column="Week 2 (4567)")
    canvas = _csv_rows(tmp_path / "canvas.csv")
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section",
                         "Week 2 (4567)"]
    assert canvas[1] == ["    Points Possible", "", "", "", "", "11"]
    by = {r[0]: r for r in canvas[2:]}
    assert by["Lima, Ana"] == ["Lima, Ana", "1001", "S001", "alima", "Sec A", "11"]
    assert by["Chen, Bo"] == ["Chen, Bo", "1002", "S002", "bchen", "Sec B", "9.9"]
    assert by["twohalf"] == ["twohalf", "", "", "", "", "7.7"]   # no details: the id
    assert by["absent"][1:] == ["", "", "", "", "0"]
    assert "'=HYPERLINK(\"x\")" in by                           # not run as a formula
    scope = _csv_rows(tmp_path / "gradescope.csv")
    assert scope[0] == ["First Name", "Last Name", "SID", "Email", "Sections",
                        "Week 2 (4567)", "Week 2 (4567) - Max Points",
                        "Week 2 (4567) - Submission Time",
                        "Week 2 (4567) - Lateness (H:M:S)"]
    by = {r[0]: r for r in scope[1:]}
    assert by["Bo"] == ["Bo", "Chen", "S002", "bo@uni.example", "Sec B", "9.9", "11",
                        "2025-03-01T18:00:00+01:00", "1:00:00"]
    assert by["Ana"][-2:] == ["2025-03-01T16:57:00+01:00", "0:00:00"]
    assert by["beyond"][3] == "eve@uni.example" and by["beyond"][-1] == "170:00:00"
    assert by["absent"][5:] == ["0", "11", "", ""]


def test_roster_info_is_checked(tmp_path):
    f = tmp_path / "r.csv"
    f.write_text("student,nickname\na,x\n")
    with pytest.raises(ValueError, match="column 'nickname' not understood"):
        gb.read_roster_info(f)
    f.write_text("name,email\nA,a@x\n")
    with pytest.raises(ValueError, match="no 'student' column"):
        gb.read_roster_info(f)
    f.write_text("student,email\na,a@x\na,b@x\n")
    with pytest.raises(ValueError, match="'a' appears twice"):
        gb.read_roster_info(f)
    assert gb.parse_exports(["canvas,gradescope", "canvas"]) == ["canvas", "gradescope"]
    with pytest.raises(ValueError, match="the exports are canvas, gradescope"):
        gb.parse_exports(["moodle"])


@pytest.mark.parametrize("args, message", [
    (["--deadline", "2025-03-01T17:00"], "no time zone"),
    (["--deadline", "2025-03-01T17:00Z"], "--deadline needs --submitted"),
    (["--submitted", "mtime"], "need --deadline"),
    (["--late-policy", "10%/day"], "need --deadline"),
    (["--deadline", "2025-03-01T17:00Z", "--submitted", "mtime", "--late-policy",
      "5 pts"], "late policy '5 pts' not understood"),
    (["--export", "pdf"], "the exports are canvas, gradescope"),
    (["--roster-info", "ROSTER"], "--roster-info is used by the exports"),
])
def test_bad_options_are_refused_before_any_notebook_runs(tmp_path, capsys, args,
                                                          message):
    (tmp_path / "ROSTER").write_text("student\na\n")
    args = [a.replace("ROSTER", str(tmp_path / "ROSTER")) for a in args]
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.ipynb").write_bytes(SOLUTIONS.read_bytes())
    out = tmp_path / "out"
    assert grade.main([str(subs), "--key", str(CHAPTER), "--out", str(out)] + args) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_zip_keeps_its_files_times(tmp_path):
    z = tmp_path / "class.zip"
    with zipfile.ZipFile(z, "w") as f:
        info = zipfile.ZipInfo("alice.ipynb", date_time=(2025, 3, 1, 18, 30, 0))
        f.writestr(info, "{}")
    subs = grade.find_submissions([z], tmp_path / "work")
    times = grade._file_times(subs)
    assert times["alice"] == datetime(2025, 3, 1, 18, 30).astimezone()   # local time


@pytest.mark.skipif(not grade.shutil.which("bwrap"), reason="the grader needs bwrap")
def test_the_command_with_times_a_policy_and_exports(tmp_path, capsys):
    """Two students (the chapter's solutions): one on time, one an hour late; then a
    regrade of one (--only) keeps the other's time and penalty."""
    subs = tmp_path / "subs"
    subs.mkdir()
    for s in ("ontime", "hour"):
        (subs / f"{s}.ipynb").write_bytes(SOLUTIONS.read_bytes())
    times = tmp_path / "times.csv"
    times.write_text("student,submitted\nontime,2025-03-01T16:00:00+01:00\n"
                     "hour,2025-03-01T18:00:00+01:00\n")
    roster = tmp_path / "roster.csv"
    roster.write_text(ROSTER)
    out = tmp_path / "out"
    args = [str(subs), "--key", str(CHAPTER), "--out", str(out), "--jobs", "2",
            "--submitted", str(times), "--deadline", "2025-03-01T17:00:00+01:00",
            "--late-policy", "10%/day,cap=50%", "--export", "canvas,gradescope",
            "--roster-info", str(roster)]
    assert grade.main(args) == 0
    book = {r[0]: r for r in _csv_rows(out / "gradebook.csv")}
    assert book["hour"][-3:] == ["1", "10%", "9.9"]
    assert book["ontime"][-3:] == ["0", "0%", "11"]
    canvas = {r[0]: r[-1] for r in _csv_rows(out / "canvas.csv")}
    assert canvas["Chen, Bo"] == "9.9" and canvas["Student"] == "01_rooflines"
    assert "become 9.9" in (out / "feedback" / "hour.md").read_text()
    times.write_text("student,submitted\nhour,2025-03-01T18:00:00+01:00\n")
    assert grade.main(args + ["--only", "hour"]) == 0
    book = {r[0]: r for r in _csv_rows(out / "gradebook.csv")}
    assert book["ontime"][-4:] == ["2025-03-01T16:00:00+01:00", "0", "0%", "11"]
    assert book["hour"][-1] == "9.9"
