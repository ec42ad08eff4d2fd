"""Red team: submissions that attack the grader, graded in one class run next to an honest
one. No attack may earn a point, change another row, touch a file outside its sandbox,
outlive the grading, or read the secret (issue 24). Needs bubblewrap, as the grader does:
CI installs it (.ci/run); elsewhere the test is skipped with the command to install it."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from scalebook import grade

# Whole notebooks graded in sandboxes: the slow tier, with the grader's class runs.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "01_rooflines.ipynb"
SOLUTIONS = ROOT / "solutions" / "01_rooflines.ipynb"

if shutil.which("bwrap") is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI must install bubblewrap (.ci/run): the grader needs it")
    pytest.skip(f"bubblewrap is not installed: {grade.INSTALL_BWRAP}", allow_module_level=True)


def _notebook(*sources) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return nbformat.writes(nb)


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("redteam")
    token = f"redteam-{os.getpid()}-{int(time.time())}"
    subs, out = tmp / "subs", tmp / "grading"
    subs.mkdir()
    host_note = tmp / "host-note.txt"
    host_note.write_text(f"HOST-NOTE-{token}")
    secret_file = tmp / "secret"
    secret_file.write_text(f"FILE-SECRET-{token}")
    core = ROOT / "scalebook" / "exercises" / "core.py"
    core_before = core.read_bytes()
    honest = subs / "honest.ipynb"
    honest.write_bytes(SOLUTIONS.read_bytes())
    marker = Path("/tmp") / f"daemon-{token}"
    attacks = {
        # a "result" line for every exercise, and answers it does not know, in the answers file
        "forge": f"""
import json, pathlib
rec = pathlib.Path.cwd().parent / "records.jsonl"
with open(rec, "a") as f:
    for n in range(1, 12):
        f.write(json.dumps({{"id": f"1.{{n}}", "result": ["correct", "forged"]}}) + "\\n")
""",
        # a daemon that outlives its kernel: double fork, setsid, then writes the grades
        "daemon": f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(4)
        for p in ({str(out / 'grades.csv')!r}, {str(marker)!r}):
            try:
                open(p, "w").write("student,exercise,status,points\\ndaemon,1.1,correct,99\\n")
            except Exception:
                pass
        os.execv("/bin/sh", ["sh", "-c", "sleep 60 # {token}"])   # seen by ps if it lives
    os._exit(0)
""",
        # overwrite the honest classmate's notebook and plant a link in the grading folder
        "vandal": f"""
import os
for p in ({str(honest)!r}, {str(out / 'feedback' / 'honest.md')!r}):
    try:
        open(p, "w").write("{{}}")
    except Exception as e:
        print("could not:", type(e).__name__)
try:
    os.makedirs({str(out / 'feedback')!r}, exist_ok=True)
    os.symlink({str(host_note)!r}, {str(out / 'feedback' / 'victim.md')!r})
except Exception as e:
    print("could not:", type(e).__name__)
""",
        # edit the package that checks the answers: the sandbox's copy and the checkout's
        "backdoor": f"""
import scalebook.exercises.core as core
for p in (core.__file__, {str(core)!r}):
    try:
        open(p, "a").write("\\nevaluate = lambda *a, **k: None\\n")
    except Exception as e:
        print("could not:", type(e).__name__)
""",
        # read the secret from the environment, the command lines and the secret file, and
        # hand it back as an answer (feedback echoes wrong answers)
        "spy": f"""
import os, glob
found = [v for v in os.environ.values() if "SECRET" in v]
for c in glob.glob("/proc/*/cmdline"):
    try:
        found.append(open(c, "rb").read().decode(errors="replace"))
    except Exception:
        pass
for p in ({str(secret_file)!r}, {str(host_note)!r}):
    try:
        found.append(open(p).read())
    except Exception:
        pass
answer_1_2 = " ".join(found)[:500]
answer_1_11 = answer_1_2
print(answer_1_2)
raise RuntimeError(" ".join(x for x in found if "SECRET" in x or "NOTE" in x)[:150])
""",
        # patch the checks and empty the registry, then answer with wrong functions
        "registry": """
from scalebook.exercises import core, kinds
ok = lambda self, *a, **k: core.Result(self.id, "correct", "patched")
for kind in (kinds.CodeExercise, kinds.NumericExercise, kinds.ChoiceExercise):
    kind.evaluate = ok
core.evaluate = lambda *a, **k: core.Result(a[0], "correct", "patched")
core._REGISTRY.clear()
matmul_time_bounds = lambda *a: (0.0, 0.0, 0.0)
smallest_compute_bound_batch = lambda *a: 1
answer_1_1 = 1.0
""",
        # a lookup table of the published cases' answers (the chapter prints the cases)
        "lookup": """
from scalebook.exercises import get_exercise
tables = {}
for ex_id in ("1.9", "1.10"):
    ex = get_exercise(ex_id)
    tables[ex_id] = {tuple(c): ex.reference(*c) for c in ex.cases}
matmul_time_bounds = lambda *a: tables["1.9"].get(tuple(a), (0.0, 0.0, 0.0))
smallest_compute_bound_batch = lambda *a: tables["1.10"].get(tuple(a), 1)
""",
        # a flood of output: 400 MB printed, which the grader must not hold
        "flood": """
import sys
chunk = "x" * (50 * 2**20)
for _ in range(8):
    sys.stdout.write(chunk)
""",
        # replace the answers and report files with links to host files
        "links": f"""
import os, pathlib
box = pathlib.Path.cwd().parent
for name in ("records.jsonl", "report.json", "worker.log"):
    try:
        os.remove(box / name)
    except Exception:
        pass
    os.symlink({str(host_note)!r}, box / name)
""",
        # answers that claim to equal anything: a float subclass, an object with __eq__,
        # __float__ and __array__, a str subclass for the choice, functions returning them
        "equals": """
import numpy as np
class Yes(float):
    def __eq__(self, other): return True
    __hash__ = float.__hash__
class YesInt(int):
    def __eq__(self, other): return True
    __hash__ = int.__hash__
class YesStr(str):
    def __eq__(self, other): return True
    __hash__ = str.__hash__
class Anything:
    def __eq__(self, other): return True
    def __float__(self): return 1.0
    def __index__(self): return 1
    def __array__(self, *a, **k): return np.asarray(1.0)
class YesTuple(tuple):
    def __eq__(self, other): return True
    __hash__ = tuple.__hash__
answer_1_1, answer_1_2, answer_1_3 = Yes(1.0), Anything(), YesInt(1)
answer_1_4, answer_1_5, answer_1_6, answer_1_7, answer_1_11 = [Anything()] * 5
answer_1_8 = YesStr("?")
matmul_time_bounds = lambda *a: YesTuple((Anything(), Yes(0.0)))
smallest_compute_bound_batch = lambda *a: YesInt(1)
""",
        # not numbers: NaN and infinity everywhere
        "nan": """
nan, inf = float("nan"), float("inf")
answer_1_1, answer_1_2, answer_1_3, answer_1_4 = nan, inf, -inf, nan
answer_1_5 = answer_1_6 = answer_1_7 = answer_1_11 = nan
matmul_time_bounds = lambda *a: (nan, inf)
smallest_compute_bound_batch = lambda *a: inf
""",
        # lines forged into the answers file before the grader's own: an array that would
        # take the grader's memory if decoded as sent (64 MB here; 16 GB took this
        # machine's), a class reached through the package, nesting 5,000 deep
        "forged": """
import json, pathlib
rec = pathlib.Path.cwd().parent / "records.jsonl"
with open(rec, "a") as f:
    f.write(json.dumps({"id": "1.1", "value": {"array": ["a"] * 4, "dtype": "U4194304"}}) + "\\n")
    f.write(json.dumps({"id": "1.2", "value": {"object": "scalebook.grade:os.stat_result",
                                                "fields": {}}}) + "\\n")
    f.write('{"id": "1.3", "value": ' + '{"seq": [' * 5000 + '1' + ']}' * 5000 + '}\\n')
    f.write(json.dumps({"id": "1.4", "value": {"bigint": 10**9}}) + "\\n")
""",
    }
    for name, src in attacks.items():
        (subs / f"{name}.ipynb").write_text(_notebook(src))
    # the honest answers, then one int too big for a float: that answer alone is lost
    big = nbformat.reads(SOLUTIONS.read_text(), as_version=4)
    big.cells.append(nbformat.v4.new_code_cell("answer_1_1 = 10**400"))
    (subs / "bigint.ipynb").write_text(nbformat.writes(big))
    env = dict(os.environ, SCALEBOOK_SECRET=f"ENV-SECRET-{token}")
    t0 = time.time()
    run = subprocess.run([os.sys.executable, "-m", "scalebook.grade", str(subs), "--key",
                          str(CHAPTER), "--out", str(out), "--jobs", "2", "--time-limit", "120",
                          "--cell-timeout", "30", "--secret-file", str(secret_file),
                          "--partial-credit"],      # a table of published cases: still 0
                         capture_output=True, text=True, env=env, timeout=600)
    seconds = time.time() - t0
    time.sleep(6)                      # longer than the daemon waits before writing
    return dict(run=run, out=out, token=token, marker=marker, honest=honest, core=core,
                core_before=core_before, host_note=host_note, seconds=seconds)


def _rows(out):
    """grades.csv as {(student, exercise): (status, points)}, read as the grader reads it."""
    return {(s, e): (st, float(p)) for s, e, st, p in grade._read_rows(out / "grades.csv")}


def test_the_honest_student_keeps_full_marks_and_no_attack_earns_a_point(attacked):
    assert attacked["run"].returncode == 0, attacked["run"].stderr[-2000:]
    rows = _rows(attacked["out"])
    honest = [v for (s, _), v in rows.items() if s == "honest"]
    assert len(honest) == 11 and all(status == "correct" for status, _ in honest)
    for name in ATTACKS:
        points = [p for (s, _), (_, p) in rows.items() if s == name]
        assert len(points) == 11 and sum(points) == 0, name
    assert {s for s, _ in rows} == {"honest", "bigint", *ATTACKS}
    # an answer the grader cannot send costs that answer, not the notebook's others
    big = {e: v for (s, e), v in rows.items() if s == "bigint"}
    assert big.pop("1.1")[0] == "wrong" and all(v == ("correct", 1.0) for v in big.values())
    assert "too large" in (attacked["out"] / "feedback" / "bigint.md").read_text()


ATTACKS = ("forge", "daemon", "vandal", "backdoor", "spy", "links", "flood", "registry",
           "lookup", "equals", "nan", "forged")


def test_nothing_outside_the_sandbox_changed_and_nothing_outlived_it(attacked):
    assert attacked["core"].read_bytes() == attacked["core_before"]
    assert json.loads(attacked["honest"].read_text())["cells"]      # still the notebook
    assert not attacked["marker"].exists()
    assert "daemon,1.1,correct,99" not in (attacked["out"] / "grades.csv").read_text()
    assert not (attacked["out"] / "feedback" / "victim.md").exists()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert attacked["token"] not in ps


def test_the_secret_and_host_files_never_reach_any_output(attacked):
    token = attacked["token"]
    texts = [attacked["run"].stdout, attacked["run"].stderr]
    for f in attacked["out"].rglob("*"):
        if f.is_file():
            texts.append(f.read_text(errors="replace"))
    for text in texts:
        for leak in (f"ENV-SECRET-{token}", f"FILE-SECRET-{token}", f"HOST-NOTE-{token}"):
            assert leak not in text


def test_the_summary_names_the_package_that_graded(attacked):
    summary = (attacked["out"] / "summary.md").read_text()
    assert "graded with the scalebook package of sha256 " in summary


def test_the_red_team_run_is_quick(attacked):
    # 14 notebooks, 2 at a time: under the two minutes the issue allows
    assert attacked["seconds"] < 120, attacked["seconds"]


def test_without_bwrap_the_grader_refuses(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(grade.shutil, "which", lambda name: None)
    with pytest.raises(grade.SandboxMissing, match="apt-get install bubblewrap"):
        grade.grade_submissions([], grade.load_key(CHAPTER), None, logdir=tmp_path)
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "alice.ipynb").write_bytes(SOLUTIONS.read_bytes())
    assert grade.main([str(subs), "--key", str(CHAPTER), "--out", str(tmp_path / "o")]) == 2
    assert "bwrap` is not installed" in capsys.readouterr().err
    assert not (tmp_path / "o" / "grades.csv").exists()          # nothing ran unboxed


MESH_SETUP = ("import scalebook\nscalebook.setup()\nimport jax\n"
              "from jax.sharding import PartitionSpec as P")
MESH_HONEST = ["def fsdp(x, w):\n"
               "    return x @ jax.lax.all_gather(w, 'y', axis=0, tiled=True, to='invarying')",
               "def specs(M, K, N):\n    return P('x', None), P(None, 'y'), P('x', 'y')"]
MESH_CHEATS = {
    # right numbers with the wrong collective, and the check patched to say "correct"
    "patched": ["def fsdp(x, w):\n"
                "    i, n = jax.lax.axis_index('y'), w.shape[0]\n"
                "    part = jax.lax.dynamic_slice_in_dim(x, i * n, n, axis=1) @ w\n"
                "    return jax.lax.psum(part, 'y')",
                "def specs(M, K, N):\n    return P(), P(), P('x', 'y')",
                "from scalebook.exercises import kinds, core\n"
                "ok = lambda self, *a, **k: core.Result(self.id, 'correct', 'PATCHED-OK')\n"
                "kinds.MeshProgramExercise.evaluate = ok\n"
                "kinds.MeshProgramExercise.evaluate_exported = ok\n"
                "core._REGISTRY.clear()"],
    # hands back a program that ignores its inputs (right on the kernel's values only)
    "constant": ["import numpy as np\n"
                 "from scalebook.exercises import get_exercise, kinds\n"
                 "ex = get_exercise('3.10')\n"
                 "def fsdp(x, w):\n"
                 "    want = np.asarray(x) @ np.asarray(jax.lax.all_gather(w, 'y', axis=0,\n"
                 "        tiled=True, to='invarying')) if False else None\n"
                 "    return x @ jax.lax.all_gather(w, 'y', axis=0, tiled=True,\n"
                 "                                  to='invarying') * 0 + 1.0",
                 "specs = 'P(x)'"],
}


def test_programs_on_the_mesh_are_judged_by_the_checker_not_the_kernel(tmp_path):
    """An honest mesh answer earns its points through the real sandboxes (the kernel
    exports, the checker compiles and runs); a kernel that patches the checks, clears the
    registry or hands back a program that ignores its inputs earns nothing."""
    key = tmp_path / "key.json"
    key.write_text(json.dumps({"format": grade.KEY_FORMAT, "title": "mesh", "exercises": [
        {"id": "3.10", "answer": "fsdp"}, {"id": "3.12", "answer": "specs"}]}))
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "honest.ipynb").write_text(_notebook(MESH_SETUP, *MESH_HONEST))
    for name, cells in MESH_CHEATS.items():
        (subs / f"{name}.ipynb").write_text(_notebook(MESH_SETUP, *cells))
    out = tmp_path / "grading"
    assert grade.main([str(subs), "--key", str(key), "--out", str(out), "--jobs", "2",
                       "--time-limit", "120"]) == 0
    rows = _rows(out)
    assert rows[("honest", "3.10")] == ("correct", 1.0), (out / "feedback" / "honest.md").read_text()
    assert rows[("honest", "3.12")] == ("correct", 1.0)
    for name in MESH_CHEATS:
        assert rows[(name, "3.10")][1] == 0 and rows[(name, "3.12")][1] == 0, name
    feedback = (out / "feedback" / "patched.md").read_text()
    assert "all-reduce" in feedback and "PATCHED-OK" not in feedback
