"""The grader on a class: synthetic submissions graded in one run.

The assignment is built from chapter 1 by scalebook.assign (with variants for 1.1 and 1.2);
each student's notebook is then filled in the way a student (or a cheat, or an accident)
would. The grades.csv of one run must equal EXPECTED exactly (its rows for that class), and
the run must stay within its time limit. Only the kernel's re-run counts: a redefined
``check``, a monkeypatched ``evaluate``, edited outputs and an edited variant earn nothing.

Two classes: ``small`` (a right, a partly right and a wrong notebook, and three files that
are not notebooks, which cost no kernel) runs in the quick tier and tells the scoring apart;
``full`` (all fifteen, with the loops, crashes and memory hogs whose time limits cost most
of a minute) is in the slow tier.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from scalebook import assign, grade
from scalebook.exercises import get_exercise
from scalebook.exercises.core import draw_variant

SECRET = b"instructor secret for the tests"
IDS = ["1.1", "1.2", "1.8", "1.9", "1.10"]
STUDENTS = ["s01-right", "s02-partly", "s03-wrong", "s04-blank", "s05-broken-json",
            "s06-empty", "s07-loop", "s08-crash", "s09-check", "s10-outputs", "s11-variant",
            "s12-renamed", "s13-memory", "s14-absent", "s15-stuck"]
SMALL = ["s01-right", "s02-partly", "s03-wrong", "s05-broken-json", "s06-empty", "s14-absent"]
CLASSES = {"small": SMALL, "full": STUDENTS}
TIME_LIMIT = 120     # seconds per notebook
CELL_TIMEOUT = 15    # seconds per cell: the infinite loop is interrupted after this (5 s was
                     # too short for the import cell on a loaded 2-core machine)

RIGHT_1_9 = '''def matmul_time_bounds(B, D, F, chip):
    c = hardware.get_chip(chip)
    t_math = 2 * B * D * F / c.bf16_flops
    t_mem = 2 * (B * D + D * F + B * F) / c.hbm_bandwidth
    return (max(t_math, t_mem), t_math + t_mem)
'''
SWAPPED_1_9 = RIGHT_1_9.replace("return (max(t_math, t_mem), t_math + t_mem)",
                                "return (t_math + t_mem, max(t_math, t_mem))")
RIGHT_1_10 = '''def smallest_compute_bound_batch(D, F, chip):
    I = hardware.get_chip(chip).critical_intensity
    B = 1
    while 2 * B * D * F < I * 2 * (B * D + D * F + B * F):
        B += 1
    return B
'''
WRONG_1_10 = '''def smallest_compute_bound_batch(D, F, chip):
    return math.ceil(hardware.get_chip(chip).critical_intensity)
'''

EXPECTED = """\
student,exercise,status,points
s01-right,1.1,correct,2
s01-right,1.2,correct,1
s01-right,1.8,correct,1
s01-right,1.9,correct,3
s01-right,1.10,correct,1
s02-partly,1.1,correct,2
s02-partly,1.2,wrong,0
s02-partly,1.8,wrong,0
s02-partly,1.9,correct,3
s02-partly,1.10,not attempted,0
s03-wrong,1.1,wrong,0
s03-wrong,1.2,wrong,0
s03-wrong,1.8,wrong,0
s03-wrong,1.9,wrong,0
s03-wrong,1.10,wrong,0
s04-blank,1.1,not attempted,0
s04-blank,1.2,not attempted,0
s04-blank,1.8,not attempted,0
s04-blank,1.9,not attempted,0
s04-blank,1.10,not attempted,0
s05-broken-json,1.1,unreadable,0
s05-broken-json,1.2,unreadable,0
s05-broken-json,1.8,unreadable,0
s05-broken-json,1.9,unreadable,0
s05-broken-json,1.10,unreadable,0
s06-empty,1.1,unreadable,0
s06-empty,1.2,unreadable,0
s06-empty,1.8,unreadable,0
s06-empty,1.9,unreadable,0
s06-empty,1.10,unreadable,0
s07-loop,1.1,correct,2
s07-loop,1.2,missing,0
s07-loop,1.8,correct,1
s07-loop,1.9,correct,3
s07-loop,1.10,correct,1
s08-crash,1.1,correct,2
s08-crash,1.2,correct,1
s08-crash,1.8,missing,0
s08-crash,1.9,correct,3
s08-crash,1.10,correct,1
s09-check,1.1,not attempted,0
s09-check,1.2,not attempted,0
s09-check,1.8,not attempted,0
s09-check,1.9,not attempted,0
s09-check,1.10,not attempted,0
s10-outputs,1.1,not attempted,0
s10-outputs,1.2,not attempted,0
s10-outputs,1.8,not attempted,0
s10-outputs,1.9,not attempted,0
s10-outputs,1.10,not attempted,0
s11-variant,1.1,wrong,0
s11-variant,1.2,wrong,0
s11-variant,1.8,correct,1
s11-variant,1.9,correct,3
s11-variant,1.10,correct,1
s12-renamed,1.1,missing,0
s12-renamed,1.2,correct,1
s12-renamed,1.8,correct,1
s12-renamed,1.9,correct,3
s12-renamed,1.10,correct,1
s13-memory,1.1,correct,2
s13-memory,1.2,missing,0
s13-memory,1.8,correct,1
s13-memory,1.9,correct,3
s13-memory,1.10,correct,1
s14-absent,1.1,no submission,0
s14-absent,1.2,no submission,0
s14-absent,1.8,no submission,0
s14-absent,1.9,no submission,0
s14-absent,1.10,no submission,0
s15-stuck,1.1,correct,2
s15-stuck,1.2,correct,1
s15-stuck,1.8,correct,1
s15-stuck,1.9,missing,0
s15-stuck,1.10,correct,1
"""


def _code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def _src(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _answer_cell(nb, ex_id):
    for c in _code_cells(nb):
        # a chapter's answer cell calls check; an assignment's varied one calls record
        if f'check("{ex_id}",' in _src(c) or f'record("{ex_id}",' in _src(c):
            return c
    raise KeyError(ex_id)


def _set(nb, ex_id, new_source):
    _answer_cell(nb, ex_id)["source"] = new_source


def _right_value(student, ex_id):
    params = draw_variant(ex_id, SECRET, student)
    ex = get_exercise(ex_id)
    return (ex.with_variant(params) if params else ex).reference()


def _value_cell(nb, ex_id, code, prefix=""):
    cell = _answer_cell(nb, ex_id)
    src = _src(cell)
    first, _, rest = src.partition("\n")
    var = first.split("=", 1)[0].strip()
    cell["source"] = prefix + f"{var} = {code}\n" + rest


def _fill_right(nb, student, skip=()):
    for ex_id in ("1.1", "1.2"):
        if ex_id not in skip:
            _value_cell(nb, ex_id, repr(_right_value(student, ex_id)))
    if "1.8" not in skip:
        _value_cell(nb, "1.8", '"memory"')
    if "1.9" not in skip:
        _set(nb, "1.9", RIGHT_1_9 + '\n\ncheck("1.9", matmul_time_bounds)\n')
    if "1.10" not in skip:
        _set(nb, "1.10", RIGHT_1_10 + '\n\ncheck("1.10", smallest_compute_bound_batch)\n')


def expected(students) -> str:
    """EXPECTED's header and the rows of STUDENTS."""
    head, *rows = EXPECTED.splitlines(keepends=True)
    return head + "".join(r for r in rows if r.split(",")[0] in students)


def _make_class(tmp: Path, students: list[str]) -> tuple[Path, Path]:
    out = tmp / "assignment"
    assign.build_assignment(IDS, out, title="Week 1", students=students, secret=SECRET,
                            points="1.1=2,1.9=3")
    subs = tmp / "submissions"
    subs.mkdir()
    made = {s: json.loads((out / "students" / f"{s}.ipynb").read_text()) for s in students}
    # The students outside this class are filled in on throwaway copies and not saved.
    made.update({s: json.loads(json.dumps(made[students[0]])) for s in STUDENTS if s not in made})

    def save(student, nb):
        if student in students:
            (subs / f"{student}.ipynb").write_text(json.dumps(nb))

    nb = made["s01-right"]
    _fill_right(nb, "s01-right")
    save("s01-right", nb)

    nb = made["s02-partly"]
    _fill_right(nb, "s02-partly", skip=("1.2", "1.8", "1.10"))
    v = draw_variant("1.2", SECRET, "s02-partly")
    from scalebook.exercises import ch01
    s = ch01._DTYPE_BYTES[v["dtype"]]
    _, k, n, *_ = ch01._VECTOR_OPS[v["op"]]
    _value_cell(nb, "1.2", f"{k} / ({n - 1} * {s})")              # forgot the output vector
    _value_cell(nb, "1.8", '"compute"')
    save("s02-partly", nb)

    nb = made["s03-wrong"]
    _value_cell(nb, "1.1", "1.0")
    _value_cell(nb, "1.2", "4096.0")             # far from any variant's intensity
    _value_cell(nb, "1.8", '"compute"')
    _set(nb, "1.9", SWAPPED_1_9 + '\n\ncheck("1.9", matmul_time_bounds)\n')
    _set(nb, "1.10", WRONG_1_10 + '\n\ncheck("1.10", smallest_compute_bound_batch)\n')
    save("s03-wrong", nb)

    save("s04-blank", made["s04-blank"])
    if "s05-broken-json" in students:
        (subs / "s05-broken-json.ipynb").write_text(json.dumps(made["s05-broken-json"])[:-200])
    if "s06-empty" in students:
        (subs / "s06-empty.ipynb").write_text("")

    nb = made["s07-loop"]
    _fill_right(nb, "s07-loop")
    _value_cell(nb, "1.2", repr(_right_value("s07-loop", "1.2")), prefix="while True:\n    pass\n")
    save("s07-loop", nb)

    nb = made["s08-crash"]
    _fill_right(nb, "s08-crash")
    _value_cell(nb, "1.8", '"memory"', prefix="import os\nos._exit(1)\n")
    save("s08-crash", nb)

    # A first cell that redefines check to print success, and patches the package's own
    # evaluate in the kernel for good measure; every answer left blank.
    nb = made["s09-check"]
    cheat = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
             "id": "cheat", "source":
             "import scalebook.exercises as se, scalebook.exercises.core as sc\n"
             "def check(i, a, variant=None):\n    print(f'✔ Exercise {i}: correct.')\n"
             "fake = lambda i, a, variant=None: sc.Result(i, 'correct', 'correct.')\n"
             "se.evaluate = sc.evaluate = fake\n"}
    imports = next(i for i, c in enumerate(nb["cells"]) if "from scalebook.exercises import check"
                   in _src(c))
    nb["cells"].insert(imports + 1, cheat)
    save("s09-check", nb)

    # Blank answers whose stored outputs were edited to say "correct".
    nb = made["s10-outputs"]
    for ex_id in IDS:
        _answer_cell(nb, ex_id)["outputs"] = [{"output_type": "stream", "name": "stdout",
                                               "text": f"✔ Exercise {ex_id}: correct.\n"}]
    save("s10-outputs", nb)

    # Edits the variant back to the chapter's numbers and answers those (the package's
    # reference for the chapter's own exercise): no credit, the grader re-derives the variant.
    nb = made["s11-variant"]
    _fill_right(nb, "s11-variant", skip=("1.1", "1.2"))
    for ex_id in ("1.1", "1.2"):
        ex = get_exercise(ex_id)
        _set(nb, ex_id, f"answer_{ex_id.replace('.', '_')} = {ex.reference()!r}\n"
                        f"check({ex_id!r}, answer_{ex_id.replace('.', '_')}, "
                        f"variant={json.dumps(ex.params)})\n")
    save("s11-variant", nb)

    # Renamed exercise 1.1: new heading, new variable, new check id.
    nb = made["s12-renamed"]
    _fill_right(nb, "s12-renamed", skip=("1.1",))
    _set(nb, "1.1", f"my_answer = {_right_value('s12-renamed', '1.1')!r}\ncheck('1.11', my_answer)\n")
    for c in nb["cells"]:
        if c["cell_type"] == "markdown" and _src(c).startswith("### Exercise 1.1 "):
            c["source"] = _src(c).replace("### Exercise 1.1 ", "### Exercise 1.11 ")
    save("s12-renamed", nb)

    nb = made["s13-memory"]
    _fill_right(nb, "s13-memory")
    _value_cell(nb, "1.2", repr(_right_value("s13-memory", "1.2")),
                prefix="hog = bytearray(16 * 2**30)\n")
    save("s13-memory", nb)
    # s14-absent hands nothing in.

    # A loop that swallows the interrupt: the kernel stays busy, so the notebook is run again
    # in a new kernel without that cell (1.9's answer cell).
    nb = made["s15-stuck"]
    _fill_right(nb, "s15-stuck")
    _set(nb, "1.9", "import time\nwhile True:\n    try:\n        time.sleep(0.1)\n"
                    "    except KeyboardInterrupt:\n        pass\n" + RIGHT_1_9)
    save("s15-stuck", nb)
    return out, subs


@pytest.fixture(scope="module", params=["small", pytest.param("full", marks=pytest.mark.slow)])
def graded(request, tmp_path_factory):
    students = CLASSES[request.param]
    tmp = tmp_path_factory.mktemp("class")
    key_dir, subs = _make_class(tmp, students)
    (tmp / "secret").write_bytes(SECRET)
    out = tmp / "grading"
    t0 = time.perf_counter()
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "scalebook.grade", str(subs),
                           "--key", str(key_dir / "key.json"), "--secret-file", str(tmp / "secret"),
                           "--out", str(out), "--time-limit", str(TIME_LIMIT),
                           "--cell-timeout", str(CELL_TIMEOUT), "--memory", "3GiB"],
                          capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    print(f"\ngraded {len(students) - 1} notebooks in {seconds:.1f} s")
    return {"proc": proc, "out": out, "seconds": seconds, "subs": subs, "students": students,
            "class": request.param}


def test_the_csv_equals_the_expected_table(graded):
    assert graded["proc"].returncode == 0, graded["proc"].stderr[-2000:]
    assert (graded["out"] / "grades.csv").read_text() == expected(graded["students"])


def test_the_run_stays_within_its_limits(graded):
    # 14 notebooks, each under its own limit; with two cores the class takes well under
    # the sum of the limits (the loop costs one cell timeout, the crash one re-run).
    assert graded["seconds"] < TIME_LIMIT * 2


def test_the_terminal_shows_a_progress_bar_and_a_summary_but_no_tracebacks(graded):
    proc = graded["proc"]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "zmq" not in (proc.stdout + proc.stderr).lower()
    n = len(graded["students"])
    assert f"{n - 1}/{n}" in proc.stderr and f"{n}/{n}" in proc.stderr   # the progress bar
    right = expected(graded["students"]).count(",1.9,correct,")
    assert right == {"small": 2, "full": 7}[graded["class"]]
    assert f"| 1.9 | 3 | {right}/{n} |" in proc.stdout                   # the summary table
    assert "the lower bound comes first" in proc.stdout                  # commonest wrong hint
    assert (graded["out"] / "summary.md").read_text().strip() in proc.stdout


FEEDBACK = {  # what each student's feedback file must say
    "s07-loop": [f"ran past {CELL_TIMEOUT} s and was interrupted", "7 of 8 points"],
    "s08-crash": ["killed the kernel; the notebook was run again without it"],
    "s02-partly": ["the output vector must be written to HBM too", "| 1.9 | correct | 3 |"],
    "s03-wrong": ["the lower bound comes first"],
    "s05-broken-json": ["not a notebook"],
    "s06-empty": ["the file is empty"],
    "s13-memory": ["MemoryError"],
    "s12-renamed": ["`answer_1_1` is not defined"],
    "s14-absent": ["no notebook was handed in"],
    "s15-stuck": ["did not stop when interrupted"],
}


def test_feedback_files_say_what_happened(graded):
    fb = graded["out"] / "feedback"
    assert sorted(p.stem for p in fb.glob("*.md")) == sorted(graded["students"])
    checked = [s for s in graded["students"] if s in FEEDBACK]
    assert len(checked) >= 4
    for student in checked:
        text = (fb / f"{student}.md").read_text()
        for phrase in FEEDBACK[student]:
            assert phrase in text, (student, phrase)


def test_the_submissions_are_left_as_they_were(graded):
    # The grader runs copies in a temporary folder and writes nothing next to them.
    names = sorted(p.name for p in graded["subs"].iterdir())
    assert names == sorted(f"{s}.ipynb" for s in graded["students"] if s != "s14-absent")
