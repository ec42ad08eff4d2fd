"""The sandbox's cap on processes and threads (--processes): a fork bomb and a thread
bomb graded in one class run next to an honest notebook. The bombs are stopped at the
cap, the honest student keeps full marks, and the run ends within its time limit.

How the cap is enforced depends on who runs the grader (scalebook.grade.process_limit):
RLIMIT_NPROC for a user other than root; a pids cgroup for root, whom the kernel exempts
from RLIMIT_NPROC (bubblewrap maps root to root). Where neither works the test is
skipped, since an unbounded bomb would hit the whole machine. Each bomb also stops
itself after a few seconds or 400 processes, whichever comes first, so a broken cap
cannot run away."""

import os
import re
import shutil
import subprocess
import sys
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
CAP = 150             # well above a chapter's ~65 tasks on 2 cores, far below a bomb's
TIME_LIMIT = 90

if shutil.which("bwrap") is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI must install bubblewrap (.ci/run): the grader needs it")
    pytest.skip(f"bubblewrap is not installed: {grade.INSTALL_BWRAP}",
                allow_module_level=True)

FORK_BOMB = """
import os, time
n, err, t0 = 0, None, time.time()
while time.time() - t0 < 6 and n < 400:
    try:
        pid = os.fork()
    except OSError as e:
        err = e
        break
    if pid == 0:                       # each child forks once more, then waits
        try:
            if os.fork() == 0:
                time.sleep(20)
                os._exit(0)
        except OSError:
            pass
        time.sleep(20)
        os._exit(0)
    n += 1
raise RuntimeError(f"forked {n} then {type(err).__name__}")
"""

THREAD_BOMB = """
import threading, time
n, err, t0 = 0, None, time.time()
stop = threading.Event()
while time.time() - t0 < 6 and n < 400:
    try:
        threading.Thread(target=stop.wait, args=(20,), daemon=True).start()
    except RuntimeError as e:
        err = e
        break
    n += 1
raise RuntimeError(f"started {n} threads then {type(err).__name__}")
"""


def _notebook(*sources) -> str:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    return nbformat.writes(nb)


@pytest.fixture(scope="module")
def bombed(tmp_path_factory):
    how, cgroup = grade.process_limit(CAP)
    if cgroup is not None:
        grade._remove_cgroup(cgroup)
    if how == "none":
        pytest.skip("no process cap works here (root without a pids cgroup): the "
                    "grader warns and grades without one; a bomb would hit the machine")
    tmp = tmp_path_factory.mktemp("bombs")
    subs, out = tmp / "subs", tmp / "grading"
    subs.mkdir()
    (subs / "honest.ipynb").write_bytes(SOLUTIONS.read_bytes())
    (subs / "forks.ipynb").write_text(_notebook(FORK_BOMB, "answer_1_2 = 0.5"))
    (subs / "threads.ipynb").write_text(_notebook(THREAD_BOMB, "answer_1_2 = 0.5"))
    t0 = time.time()
    cmd = [sys.executable, "-m", "scalebook.grade", str(subs), "--key", str(CHAPTER),
           "--out", str(out), "--jobs", "2", "--time-limit", str(TIME_LIMIT),
           "--cell-timeout", "30", "--processes", str(CAP)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    stdout, stderr = proc.communicate(timeout=600)
    run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return dict(run=run, out=out, seconds=time.time() - t0, how=how, pid=proc.pid)


def _rows(out):
    """grades.csv as {(student, exercise): (status, points)}, read as the grader reads it."""
    return {(s, e): (st, float(p)) for s, e, st, p in grade._read_rows(out / "grades.csv")}


def test_the_honest_student_keeps_full_marks_next_to_the_bombs(bombed):
    assert bombed["run"].returncode == 0, bombed["run"].stderr[-2000:]
    rows = _rows(bombed["out"])
    honest = [v for (s, _), v in rows.items() if s == "honest"]
    assert len(honest) == 11 and all(status == "correct" for status, _ in honest)
    for bomb in ("forks", "threads"):
        assert len([1 for (s, _) in rows if s == bomb]) == 11, bomb


def test_the_bombs_are_stopped_at_the_cap(bombed):
    forks = (bombed["out"] / "feedback" / "forks.md").read_text()
    m = re.search(r"forked (\d+) then (\w+)", forks)
    assert m, forks
    assert int(m.group(1)) < CAP and m.group(2) == "BlockingIOError", m.group(0)
    threads = (bombed["out"] / "feedback" / "threads.md").read_text()
    m = re.search(r"started (\d+) threads then (\w+)", threads)
    assert m, threads
    assert int(m.group(1)) < CAP and m.group(2) == "RuntimeError", m.group(0)
    said = f"reached the limit of {CAP} processes and threads"
    assert said in forks and said in threads
    assert said not in (bombed["out"] / "feedback" / "honest.md").read_text()


def test_the_run_ends_within_its_time_limit_and_leaves_nothing(bombed):
    # 3 notebooks, 2 at a time: at most two notebook time limits, plus the start-up
    assert bombed["seconds"] < 2 * TIME_LIMIT + 30
    if bombed["how"] == "cgroup":       # its cgroups, and so its processes, are gone
        mine = f"scalebook-grade-{bombed['pid']}-*"
        left = [p for root in grade._cgroup_roots() for p in root.glob(mine)]
        assert not left, left


def test_the_process_limit_is_an_option_with_a_measured_default():
    assert grade.DEFAULT_PROCESSES >= 128 + 8
    assert grade.process_limit(0) == ("none", None)
    argv = grade.sandbox_argv(Path("/tmp/x/box"), Path("/tmp/x/pkg"), ["true"],
                              {"cgroup": "/sys/fs/cgroup/pids/p", "processes": 99})
    assert argv[:2] == ["/bin/sh", "-c"]
    assert argv[4:6] == ["/sys/fs/cgroup/pids/p/x", "99"]
    assert "--cap-drop" in argv
