"""Grade a class's notebooks by re-running them: nothing a notebook prints or stores counts.

    python -m scalebook.grade SUBMISSIONS... --key KEY [--secret-file FILE] [--out DIR]
        [--points 1.1=2,1.9=3] [--jobs N] [--time-limit S] [--cell-timeout S] [--memory 4GiB]
        [--processes N] [--only ID,...] [--partial-credit]
        [--submitted FILE.csv|mtime --deadline ISO-8601 [--late-policy 10%/day,cap=50%]]
        [--export canvas,gradescope [--roster-info FILE.csv] [--assignment-name NAME]]

SUBMISSIONS are notebooks, folders of them, or zip files of them. A notebook directly in a
folder belongs to the student named by its file name (``alice.ipynb``); a notebook in a
sub-folder belongs to the student named by that sub-folder (``alice/anything.ipynb``). KEY
says what is graded: the ``key.json`` that ``python -m scalebook.assign`` wrote, or a master
notebook (a chapter, ``notebooks/01_rooflines.ipynb``), whose answer cells
``check("1.3", answer_1_3)`` name each exercise's answer variable.

How a grade is made, and why a student's code cannot make it:

1. The notebook is read as JSON; one that is empty or not a notebook is reported
   ("unreadable") and costs nothing else. Its stored outputs are deleted, never read.
2. It runs in a fresh kernel of its own, in an empty temporary folder, with a memory limit
   (RLIMIT_AS) and a CPU-time limit in the kernel process, a per-cell time limit (a cell past
   it is interrupted and the next cell runs) and a per-notebook time limit (the worker and
   its kernel are killed). A cell that kills the kernel (or hangs it beyond an interrupt) is
   skipped and the notebook is run again, in a new kernel, without it.
3. After the last cell the grader adds one cell of its own that reads each exercise's answer
   *variable* (named by the key, not by the student's cells). A value is sent back as it
   is (numbers, strings, tuples). A function is called on the check's published inputs and
   on inputs drawn for this student (from the instructor's secret; fresh random ones
   without it), sent by the grader; what it returns is sent back. A program on the mesh is
   not run there for a verdict: each case's program is exported (``jax.export``: its
   StableHLO and shardings), or, for an answer that is data (PartitionSpecs), the data is
   sent back. These answers go to a file, one line per exercise.
4. The verdicts are made outside the kernel. Values are checked in this process with
   :func:`scalebook.exercises.core.evaluate` from the installed package (with the
   student's variant, re-derived from the secret and the student's id). Function and
   program answers go to a second sandbox, the *checker*, which runs no student code: it
   replays the recorded calls against the references, and compiles each exported program
   itself, runs it on input values of its own (drawn per student) and reads the
   collectives from what it compiled; a program that takes other shapes or shardings, or
   calls anything but sharding markers (a host callback), is refused. A ``check`` the
   student redefined, a patched registry, a printed "✔ Exercise 1.1: correct." and an
   edited output never reach a verdict; what the kernel can forge is only the answer
   itself. (9.8, whose check counted the kernel's compilations, is judged from its
   exported update too: lr must be an input of the one program.)

Writes, in ``--out`` (default ``grading/``): ``grades.csv`` (student, exercise, status,
points), ``gradebook.csv`` (a row per student: total, maximum, points per exercise),
``feedback/STUDENT.md`` and ``.html`` (each exercise's status, message and hint, and
what went wrong in the run), ``logs/STUDENT.log`` (the worker's and kernel's messages,
kept off the terminal), ``copies.md`` and ``summary.md`` (per exercise: how many right,
the most common wrong hint), which is also printed, and ``results.json`` (each student's
statuses and answers, from which ``--only`` keeps those two reports class-wide). Statuses: correct, wrong, not
attempted, missing (no answer variable after the run), unreadable, no submission (a
student on the key's roster with no notebook).

Late work (:mod:`scalebook.gradebook`): ``--submitted`` gives each student's submission
time (a CSV of ``student,submitted``, ISO-8601 with a zone, as an LMS exports it; or
``mtime``, the notebook files' times), ``--deadline`` the deadline (with a zone) and
``--late-policy`` what lateness costs: ``none`` (recorded only), ``zero``, or ``P%/day``
with an optional ``cap=C%``, a partial day counting as a whole one. gradebook.csv then
has the columns submitted, late_days, penalty and total_after_penalty, and the feedback
says how the penalty was applied; a notebook without a time is flagged and not
penalised. Bad times or policies are refused before any notebook runs.
``--export canvas,gradescope`` also writes ``canvas.csv`` and ``gradescope.csv`` in the
columns those platforms' CSV imports use, with names, ids, emails and sections from
``--roster-info``.

Each notebook's worker and kernel run in a bubblewrap sandbox (``bwrap``, Debian's
``bubblewrap``; the grader refuses to run without it and says how to install it): every
namespace unshared (no network; its own process IDs, so every process it starts, a daemon
too, dies with it), killed with the grader, an empty environment, the system and Python
read-only, a read-only copy of this package (its SHA-256 in summary.md), a private /tmp,
and one writable folder holding its own copy of the notebook and the answers file. The
class folder, the grading output, other submissions, the checkout with its solutions and
the secret are not mounted. The answers file is read without following links, at most 8
MiB, and only as answers; the checker's sandbox is built the same way around a folder
holding only those answers and the grader's inputs.

A sandbox runs at most ``--processes`` processes and threads at once (a fork bomb stops
there): RLIMIT_NPROC, set in the kernel, where the grader runs as a user other than
root; as root, whom RLIMIT_NPROC never binds, a pids cgroup per sandbox
(:func:`process_limit`).
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import csv
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["KeyItem", "Key", "load_key", "Submission", "find_submissions", "Grade",
           "grade_submissions", "write_outputs", "summary_table", "secret_check", "main",
           "SandboxMissing", "bwrap_path", "sandbox_argv", "package_copy", "match_roster",
           "copy_report", "class_grades", "process_limit", "DEFAULT_PROCESSES",
           "MISSING", "UNREADABLE", "NO_SUBMISSION", "TIMED_OUT"]

MISSING, UNREADABLE, NO_SUBMISSION, TIMED_OUT = "missing", "unreadable", "no submission", "timed out"
KEY_FORMAT = "scalebook-key/1"
MAX_NOTEBOOK_BYTES = 50 * 2**20
_CHECK_CALL = re.compile(r"""\bcheck\(\s*["'](\d+\.\d+)["']\s*,\s*([A-Za-z_]\w*)""")


# ------------------------------------------------------------------------------------------
# The key: what is graded
# ------------------------------------------------------------------------------------------

@dataclass
class KeyItem:
    id: str
    answer: str              # the name of the answer variable in the notebook
    points: float = 1.0
    variant: bool = False    # drawn per student from the instructor's secret


@dataclass
class Key:
    items: list[KeyItem]
    title: str = ""
    students: list[str] = field(default_factory=list)   # the roster, if the key has one
    secret_check: str | None = None                     # tells a wrong secret from a right one

    @property
    def varied(self) -> bool:
        return any(i.variant for i in self.items)


def secret_check(secret: bytes) -> str:
    """A fingerprint of the instructor's secret (the key stores it; the secret stays out)."""
    return hmac.new(secret, b"scalebook key check", hashlib.sha256).hexdigest()[:16]


def load_key(path) -> Key:
    """A key from ``key.json`` (written by scalebook.assign) or from a master notebook."""
    path = Path(path)
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        if data.get("format") != KEY_FORMAT:
            raise ValueError(f"{path} is not a scalebook key (format {data.get('format')!r})")
        items = [KeyItem(e["id"], e["answer"], float(e.get("points", 1)), bool(e.get("variant")))
                 for e in data["exercises"]]
        return Key(items, data.get("title", ""), list(data.get("students", [])),
                   data.get("secret_check"))
    import nbformat

    nb = nbformat.read(path, as_version=4)
    items, seen = [], set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for ex_id, var in _CHECK_CALL.findall(cell.source):
            if ex_id not in seen:
                seen.add(ex_id)
                items.append(KeyItem(ex_id, var))
    if not items:
        raise ValueError(f"{path} has no answer cells (check(\"N.M\", answer_variable))")
    return Key(items, title=path.stem)


def apply_points(key: Key, spec: str | None) -> None:
    """``--points 1.1=2,1.9=3`` (or a JSON file {"1.1": 2}) overrides the key's points."""
    if not spec:
        return
    if Path(spec).is_file():
        table = {str(k): float(v) for k, v in json.loads(Path(spec).read_text()).items()}
    else:
        table = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            ex_id, _, pts = part.partition("=")
            table[ex_id.strip()] = float(pts)
    known = {i.id for i in key.items}
    unknown = set(table) - known
    if unknown:
        raise ValueError(f"--points names exercises not in the key: {', '.join(sorted(unknown))}")
    for item in key.items:
        item.points = table.get(item.id, item.points)


# ------------------------------------------------------------------------------------------
# Submissions
# ------------------------------------------------------------------------------------------

@dataclass
class Submission:
    student: str
    path: Path | None
    problem: str | None = None     # why it cannot be graded (set before running)
    note: str | None = None        # said in the student's feedback (a roster match, ...)


def match_roster(subs: list[Submission], roster: list[str]) -> tuple[list[Submission], list[str]]:
    """Check the submissions against the key's roster. A file name that is a roster id
    spelled in another Unicode form (a zip made on a Mac writes "Zoë" decomposed) is that
    student. A notebook whose file name is not on the roster ("Copy of alice.ipynb") but
    which was made for a roster student (the id ``assign`` stores in it) who handed in
    nothing else is graded as that student, with a note, when it is the only such
    notebook: when two claim the same student (a classmate's copy next to the student's
    own), neither is, since the id in a notebook is the student's to edit. One that
    matches nobody is graded under its file name, flagged. Returns the submissions and
    the warnings to print."""
    import unicodedata

    if not roster:
        return subs, []
    on = set(roster)
    nfc = {unicodedata.normalize("NFC", r): r for r in roster}
    have = {s.student for s in subs}
    subs = list(subs)
    for i, s in enumerate(subs):        # the roster's spelling of the same id
        same = nfc.get(unicodedata.normalize("NFC", s.student))
        if s.student not in on and same is not None and same not in have:
            have.add(same)
            subs[i] = Submission(same, s.path, s.problem, s.note)
    claims: dict[int, str] = {}
    for i, s in enumerate(subs):
        if s.student in on or s.path is None or s.problem is not None:
            continue
        nb, _ = read_notebook(s.path)
        claimed = nb.metadata.get("scalebook", {}).get("student") if nb is not None else None
        if isinstance(claimed, str):
            claims[i] = nfc.get(unicodedata.normalize("NFC", claimed), claimed)
    claimants = Counter(claims.values())
    out, warnings = [], []
    for i, s in enumerate(subs):
        if s.student in on or s.path is None:
            out.append(s)
            continue
        claimed = claims.get(i)
        if claimed in on and claimed not in have and claimants[claimed] == 1:
            out.append(Submission(claimed, s.path, s.problem,
                                  f"handed in as {s.student!r}; graded as {claimed!r}, the "
                                  f"student it was made for."))
            warnings.append(f"{s.path.name}: not on the roster; graded as {claimed!r} (the "
                            f"student the notebook was made for)")
            continue
        why = ""
        if claimed in on and claimed in have:
            why = f"; it was made for {claimed!r}, who handed in a notebook of their own"
        elif claimed in on:
            others = sorted(subs[j].path.name for j, c in claims.items() if c == claimed)
            why = (f"; it is one of {len(others)} notebooks made for {claimed!r} "
                   f"({', '.join(others)}), so none is graded as {claimed!r}: rename the "
                   f"right one {claimed}.ipynb and regrade with --only {claimed}")
        out.append(Submission(s.student, s.path, s.problem,
                              f"{s.student!r} is not on the roster: graded with "
                              f"{s.student!r}'s variants, which nobody was given{why}."))
        warnings.append(f"{s.path.name}: {s.student!r} is not on the roster{why}")
    return out, warnings


def _student_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return rel.stem if len(rel.parts) == 1 else rel.parts[0]


def _extract_capped(z: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path) -> None:
    """One notebook out of a zip, at most one byte past the size limit: a member that
    unpacks to gigabytes (a zip bomb, or a size the zip misstates) is cut there, and
    then reported as over the limit, instead of filling the disk."""
    target.parent.mkdir(parents=True, exist_ok=True)
    left = MAX_NOTEBOOK_BYTES + 1
    with z.open(info) as src, open(target, "wb") as dst:
        while left > 0:
            chunk = src.read(min(left, 2**20))
            if not chunk:
                break
            dst.write(chunk)
            left -= len(chunk)


def find_submissions(paths, workdir: Path) -> list[Submission]:
    """One Submission per student; zips are unpacked under ``workdir``."""
    found: dict[str, list[Path]] = {}

    def add(root: Path, files):
        for f in files:
            found.setdefault(_student_of(f, root), []).append(f)

    for i, p in enumerate(map(Path, paths)):
        if p.is_dir():
            add(p, sorted(q for q in p.rglob("*.ipynb")
                          if ".ipynb_checkpoints" not in q.parts and "__MACOSX" not in q.parts))
        elif p.is_file() and p.suffix == ".zip":
            dest = workdir / f"zip{i}"
            dest.mkdir(parents=True, exist_ok=True)
            with zipfile.ZipFile(p) as z:
                for member in z.namelist():     # refuse paths that climb out of dest
                    target = (dest / member).resolve()
                    if not target.is_relative_to(dest.resolve()):
                        raise ValueError(f"{p}: unsafe path in zip: {member}")
                for info in z.infolist():
                    if info.is_dir() or not info.filename.endswith(".ipynb"):
                        continue
                    _extract_capped(z, info, dest / info.filename)
                    t = time.mktime(info.date_time + (0, 0, -1))   # the zip's times, not
                    os.utime(dest / info.filename, (t, t))         # the unpacking's (local)
            entries = [e for e in dest.iterdir() if e.name != "__MACOSX"]
            root = entries[0] if len(entries) == 1 and entries[0].is_dir() and not any(
                entries[0].glob("*.ipynb")) else dest
            add(root, sorted(q for q in root.rglob("*.ipynb")
                             if ".ipynb_checkpoints" not in q.parts and "__MACOSX" not in q.parts))
        elif p.is_file():
            add(p.parent, [p])
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
    subs = []
    for student, files in sorted(found.items()):
        if len(files) > 1:
            subs.append(Submission(student, files[0], f"{len(files)} notebooks for one student "
                                   f"({', '.join(f.name for f in files)}): hand in one"))
        else:
            subs.append(Submission(student, files[0]))
    return subs


def read_notebook(path: Path):
    """(notebook, None) or (None, why it is unreadable)."""
    import nbformat

    try:
        size = path.stat().st_size
    except OSError as e:
        return None, f"cannot read the file: {e}"
    if size == 0:
        return None, "the file is empty"
    if size > MAX_NOTEBOOK_BYTES:
        return None, f"the file is {size / 2**20:.0f} MiB, over the {MAX_NOTEBOOK_BYTES >> 20} MiB limit"
    try:
        text = path.read_text(encoding="utf-8")
        nb = nbformat.reads(text, as_version=4)
        if not isinstance(nb.get("cells"), list):
            raise ValueError("no list of cells")
    except Exception as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        return None, f"not a notebook ({type(e).__name__}: {first})"
    return nb, None


# ------------------------------------------------------------------------------------------
# The grader's own cell, run in the student's kernel after the student's cells
# ------------------------------------------------------------------------------------------

_COLLECTOR = r'''# Added by the grader after the student's cells: reads the answer variables.
def _scalebook_grader_collect(spec, path, call_limit):
    import base64 as _b64
    import dataclasses as _dc
    import json as _json
    import pickle as _pickle
    import signal as _signal

    out = open(path, "a", encoding="utf-8")
    ns = globals()
    try:
        from jax.sharding import PartitionSpec as _PSpec
    except Exception:
        _PSpec = None

    def enc(x, depth=0, refs=None):
        if refs and id(x) in refs and not isinstance(x, (str, int, float, bool)):
            return {"arg": refs[id(x)]}
        if x is Ellipsis:
            return {"ellipsis": True}
        if x is None or isinstance(x, bool):
            return x
        if isinstance(x, str):
            return x[:2000]
        if isinstance(x, (int, float)):
            if not isinstance(x, int) or -2**63 < x < 2**63:
                return x
            try:
                return float(x)
            except OverflowError:       # 10**400: too big for any answer (said so)
                return {"bigint": int.bit_length(x)}
        if _PSpec is not None and isinstance(x, _PSpec) and depth < 3:
            return {"pspec": [enc(v, depth + 1) for v in x]}
        if isinstance(x, (tuple, list)) and depth < 3 and len(x) <= 64:
            return {"seq": [enc(v, depth + 1, refs) for v in x], "type": type(x).__name__}
        if (isinstance(x, dict) and depth < 3 and len(x) <= 64
                and all(isinstance(k, str) for k in x)):
            return {"dict": {k[:200]: enc(v, depth + 1, refs) for k, v in x.items()}}
        shape = getattr(x, "shape", None)
        if shape == () and hasattr(x, "item"):
            try:
                return enc(x.item(), depth)
            except Exception:
                pass
        if (isinstance(shape, tuple) and len(shape) <= 4 and hasattr(x, "tolist")
                and hasattr(x, "dtype") and getattr(x, "size", 1 << 30) <= 65536):
            try:
                return {"array": x.tolist(), "dtype": str(x.dtype)}
            except Exception:
                pass
        if _dc.is_dataclass(x) and not isinstance(x, type) and depth < 3:
            try:
                fields = {f.name: enc(getattr(x, f.name), depth + 1, refs)
                          for f in _dc.fields(x)}
                return {"object": f"{type(x).__module__}:{type(x).__qualname__}",
                        "fields": fields}
            except Exception:
                pass
        try:
            r = repr(x)[:200]
        except Exception:
            r = "?"
        return {"opaque": type(x).__name__, "repr": r}

    def arg_refs(args):
        refs = {}
        for i, a in enumerate(args):
            refs.setdefault(id(a), [i])
            if isinstance(a, (list, tuple)) and len(a) <= 4096:
                for j, v in enumerate(a):
                    refs.setdefault(id(v), [i, j])
        return refs

    class _Late(Exception):
        pass

    def _alarm(signum, frame):
        raise _Late()

    def timed(fn, limit):
        old = _signal.signal(_signal.SIGALRM, _alarm)
        _signal.setitimer(_signal.ITIMER_REAL, limit)
        try:
            return fn()
        finally:
            _signal.setitimer(_signal.ITIMER_REAL, 0)
            _signal.signal(_signal.SIGALRM, old)

    def collect(item):
        rec = {"id": item["id"]}
        if item["answer"] not in ns:
            rec["missing"] = True
            return rec
        value = ns[item["answer"]]
        if item["how"] == "function" and callable(value):
            calls = []
            for args in _pickle.loads(_b64.b64decode(item["cases"])):
                try:
                    got = timed(lambda: value(*args), call_limit)
                    calls.append({"value": enc(got, refs=arg_refs(args))})
                except _Late:
                    calls.append({"raised": ["TimeoutError", f"took more than {call_limit:g} s"]})
                except BaseException as e:
                    calls.append({"raised": [type(e).__name__, str(e)[:300]]})
            rec["calls"] = calls
            try:          # a body still ``...`` is not attempted; one with no return is wrong
                from scalebook.exercises.kinds import is_stub as _is_stub
                rec["stub"] = bool(_is_stub(value))
            except Exception:
                pass
        elif item["how"] == "program" and callable(value):
            from scalebook.exercises import get_exercise as _get

            try:
                progs = timed(lambda: _get(item["id"]).export_programs(value), 6 * call_limit)
            except _Late:
                progs = [{"error": f"TimeoutError: took more than {6 * call_limit:g} s"}]
            except BaseException as e:
                progs = [{"error": f"{type(e).__name__}: {str(e)[:300]}"}]
            for p in progs:
                if "value" in p:
                    p["value"] = enc(p["value"])
            rec["programs"] = progs
        else:
            rec["value"] = enc(value)
        return rec

    for item in spec:           # one answer that cannot be sent costs that answer only
        try:
            rec = collect(item)
            line = _json.dumps(rec)
        except BaseException as e:
            line = _json.dumps({"id": item["id"], "value": {
                "opaque": "object", "repr": f"an answer that could not be read "
                                            f"({type(e).__name__})"}})
        out.write(line + "\n")
        out.flush()
    out.close()

'''


def _how(ex_id: str) -> str:
    """How the grader checks an exercise: "value" (here), "function" (called in the
    kernel on the grader's inputs, judged by the checker), "program" (exported from the
    kernel, compiled and judged by the checker) or "kernel" (a kind none of these fits:
    given no verdict, since only the kernel could judge it and its word is not taken)."""
    from .exercises import get_exercise
    from .exercises.kinds import (ChoiceExercise, CodeExercise, MeshProgramExercise,
                                  NumericExercise)

    try:
        ex = get_exercise(ex_id)
    except Exception:
        return "value"          # an unknown id: evaluate() says so, in this process
    if isinstance(ex, (NumericExercise, ChoiceExercise)):
        return "value"
    if isinstance(ex, CodeExercise):
        return "function"
    if isinstance(ex, MeshProgramExercise) or hasattr(ex, "evaluate_exported"):
        return "program"
    return "kernel"


def input_seed(secret: bytes | None, student: str, ex_id: str) -> bytes:
    """The seed of a student's drawn test inputs: an HMAC under the instructor's secret
    (the same at every regrade), or, with no secret, fresh random bytes."""
    if not secret:
        return os.urandom(16)
    message = f"scalebook inputs\0{ex_id}\0{student}".encode()
    return hmac.new(secret, message, hashlib.sha256).digest()


def function_cases(ex_id: str, seed: bytes) -> list:
    """A code exercise's published inputs, then those drawn from ``seed``."""
    from .exercises import get_exercise

    ex = get_exercise(ex_id)
    return [tuple(c) for c in ex.cases] + ex.drawn_cases(seed)


def _pack(value) -> str:
    import base64
    import pickle

    return base64.b64encode(pickle.dumps(value)).decode()


def _unpack(text: str):
    import base64
    import pickle

    return pickle.loads(base64.b64decode(text))      # the grader's own data, never a kernel's


def collector_source(key: Key, records: Path, call_limit: float,
                     cases: dict | None = None) -> str:
    """The grader's cell: the collector, with the exercises' answer names and, for code
    exercises, the inputs to call the student's functions on (``cases``: id -> list)."""
    spec = []
    for item in key.items:
        how = _how(item.id)
        entry = {"id": item.id, "answer": item.answer, "how": how}
        if how == "function":
            entry["cases"] = _pack((cases or {}).get(item.id) or function_cases(item.id, b""))
        spec.append(entry)
    return (_COLLECTOR + f"\n\n_scalebook_grader_collect(__import__('json').loads("
            f"{json.dumps(spec)!r}), {str(records)!r}, {float(call_limit)!r})\n")


# ------------------------------------------------------------------------------------------
# The worker: one notebook, one kernel at a time (a subprocess of the grader)
# ------------------------------------------------------------------------------------------

def _kernel_spec_dir(tmp: Path, memory: int, cpu: int, processes: int = 0) -> Path:
    d = tmp / "kernels" / "scalebook-grader"
    d.mkdir(parents=True)
    argv = [sys.executable, "-m", "scalebook.grade", "--kernel", str(memory), str(cpu),
            f"--processes={int(processes)}", "-f", "{connection_file}"]
    (d / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "grader",
                                               "language": "python"}))
    return tmp / "kernels"


def _run_kernel(argv: list[str]) -> None:
    """The kernel process: set the limits, then become an ipykernel. RLIMIT_NPROC caps
    the tasks (processes and threads) of the sandbox's user, counted in the sandbox's
    own user namespace; it binds every user but root (see :func:`process_limit`)."""
    import resource

    memory, cpu = int(argv[0]), int(argv[1])
    rest = argv[2:]
    processes = 0
    if rest and rest[0].startswith("--processes="):
        processes, rest = int(rest[0].split("=", 1)[1]), rest[1:]
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if cpu > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    if processes > 0:                   # never above the hard limit it was given
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        n = processes if hard == resource.RLIM_INFINITY else min(processes, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    from ipykernel.kernelapp import launch_new_instance

    launch_new_instance(argv=rest)


_TIMEOUT_ENAME = "GraderCellTimeout"


def _run_once(nb, spec: dict, skip: set, kernels: Path, log) -> dict:
    """Run every cell not in ``skip``, then the collector. Returns what happened."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    records = Path(spec["records"])
    records.write_text("")
    deadline = spec["started"] + spec["time_limit"] - spec["reserve"]
    ksm = KernelSpecManager(kernel_dirs=[str(kernels)], ensure_native_kernel=False)
    km = AsyncKernelManager(kernel_name="scalebook-grader", kernel_spec_manager=ksm)

    class ErrorsOnly(NotebookClient):
        """Keeps a cell's errors, the only output the grader reads: a flood of prints is
        dropped as it arrives instead of piling up in this process."""

        def output(self, outs, msg, display_id, cell_index):
            if msg.get("msg_type") != "error":
                return None
            return super().output(outs, msg, display_id, cell_index)

    client = ErrorsOnly(nb, km=km, timeout=spec["cell_timeout"], allow_errors=True,
                            interrupt_on_timeout=True, startup_timeout=120,
                            error_on_timeout={"ename": _TIMEOUT_ENAME, "evalue": "", "traceback": []},
                            resources={"metadata": {"path": spec["cwd"]}})
    events = {"errors": [], "timeouts": [], "dead": None, "stuck": None, "out_of_time": None}
    with client.setup_kernel():
        pid = getattr(getattr(km, "provisioner", None), "process", None)
        if pid is not None:
            Path(spec["kernel_pid"]).write_text(str(pid.pid))
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or index in skip or index == len(nb.cells) - 1:
                continue
            left = deadline - time.time()
            if left <= 1:
                events["out_of_time"] = index
                break
            client.timeout = int(max(1, min(spec["cell_timeout"], left)))
            t_cell = time.monotonic()
            try:
                client.execute_cell(cell, index)
            except DeadKernelError:
                events["dead"] = index
                return events
            timed_out = time.monotonic() - t_cell >= client.timeout
            if timed_out:
                events["timeouts"].append([index, client.timeout])
                # Did the interrupt stop it? A cell that swallows KeyboardInterrupt leaves the
                # kernel busy: then the notebook is run again without that cell.
                probe = nbformat.from_dict({"cell_type": "code", "source": "None",
                                            "metadata": {}, "outputs": [],
                                            "execution_count": None})
                client.timeout = 10
                t_probe = time.monotonic()
                try:
                    client.execute_cell(probe, index)
                except DeadKernelError:
                    events["dead"] = index
                    return events
                if time.monotonic() - t_probe >= client.timeout:
                    events["stuck"] = index
                    return events
                continue
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    events["errors"].append([index, out.get("ename", ""),
                                             str(out.get("evalue", ""))[:200]])
        collector = nb.cells[-1]
        client.timeout = int(max(5, spec["reserve"] - 2))
        try:
            client.execute_cell(collector, len(nb.cells) - 1)
        except DeadKernelError:
            events["collector"] = "the kernel died while the answers were read"
            return events
        errs = [o for o in collector.outputs if o.get("output_type") == "error"]
        if errs:
            events["collector"] = f"{errs[0].get('ename')}: {str(errs[0].get('evalue'))[:200]}"
    return events


def _worker(spec_path: str) -> int:
    import resource

    import nbformat

    spec = json.loads(Path(spec_path).read_text())
    if spec["memory"] > 0:       # the outputs it collects: a flood of prints ends here
        resource.setrlimit(resource.RLIMIT_AS, (spec["memory"], spec["memory"]))
    nb = nbformat.read(spec["notebook"], as_version=4)
    for cell in nb.cells:                  # stored outputs are never used
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.cells.append(nbformat.v4.new_code_cell(Path(spec["collector"]).read_text()))
    kernels = _kernel_spec_dir(Path(spec["tmp"]), spec["memory"], spec["cpu"],
                               spec.get("processes", 0))
    skip, history = set(), []
    for attempt in range(4):
        with open(spec["log"], "a") as log:
            events = _run_once(nb, spec, skip, kernels, log)
        history.append(events)
        bad = events.get("dead") if events.get("dead") is not None else events.get("stuck")
        if bad is None or bad in skip:
            break
        skip.add(bad)
    Path(spec["report"]).write_text(json.dumps({"runs": history, "skipped": sorted(skip)}))
    return 0


# ------------------------------------------------------------------------------------------
# The grader process
# ------------------------------------------------------------------------------------------

@dataclass
class Grade:
    student: str
    path: Path | None
    results: dict = field(default_factory=dict)    # exercise id -> (status, message)
    notes: list = field(default_factory=list)      # what went wrong in the run
    points: dict = field(default_factory=dict)     # exercise id -> points earned
    seconds: float = 0.0
    package_hash: str = ""                         # SHA-256 of the package that graded it
    answers: dict = field(default_factory=dict)    # exercise id -> the answer, shown short
    partial: dict = field(default_factory=dict)    # exercise id -> share of test inputs right
    raw: dict = field(default_factory=dict)        # exercise id -> a number or string answer

    @property
    def total(self) -> float:
        return sum(self.points.values())


class _Opaque:
    """Stands for a value the kernel could not send (its type name and repr only)."""

    def __init__(self, name, text):
        self._text = text
        self.__class__ = type(str(name)[:60] or "object", (_Opaque,), {})

    def __repr__(self):
        return self._text


def decode(x, args=None):
    """A value sent by the collector, rebuilt from plain JSON. ``args``: the inputs of the
    call that returned it (a returned input is sent as a reference to it). Arrays come back
    as NumPy arrays, PartitionSpecs as PartitionSpecs, this package's dataclasses as
    themselves where they can be rebuilt; anything else as an opaque stand-in."""
    if isinstance(x, dict):
        if x.get("ellipsis"):
            return ...
        if "arg" in x:
            path = x["arg"]
            try:
                v = args[path[0]]
                return v[path[1]] if len(path) > 1 else v
            except (TypeError, IndexError, KeyError):
                return _Opaque("object", "an input the grader did not send")
        if "seq" in x:
            items = [decode(v, args) for v in x["seq"]]
            return tuple(items) if x.get("type") == "tuple" else items
        if "dict" in x and isinstance(x["dict"], dict):
            return {str(k): decode(v, args) for k, v in x["dict"].items()}
        if "pspec" in x:
            from jax.sharding import PartitionSpec

            entries = [decode(v) for v in x["pspec"]]
            if all(e is None or isinstance(e, str)
                   or (isinstance(e, tuple) and all(isinstance(a, str) for a in e))
                   for e in entries):
                return PartitionSpec(*entries)
            return _Opaque("PartitionSpec", "a PartitionSpec of odd entries")
        if "bigint" in x:      # an int too big for a float: its size, not its digits
            bits = x["bigint"] if isinstance(x["bigint"], int) else 0
            return 2 ** max(64, min(bits, 4096))
        if "array" in x:
            import numpy as np

            try:    # numbers only, a few bytes each: a forged "U20000000" would take GiBs
                dtype = np.dtype(str(x.get("dtype")))
                if dtype.kind in "OUSVMm" and dtype.name != "bfloat16" or dtype.itemsize > 16:
                    raise TypeError(dtype)
                return np.asarray(x["array"], dtype=dtype)
            except (TypeError, ValueError, OverflowError):
                return _Opaque("array", "an array the grader could not read")
        if "object" in x:
            return _rebuild(str(x["object"]), x.get("fields"), args)
        if "opaque" in x:
            return _Opaque(x.get("opaque", "object"), str(x.get("repr", "?")))
        return _Opaque("dict", "{...}")
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    return _Opaque(type(x).__name__, repr(x)[:60])


def _rebuild(name: str, fields, args):
    """A dataclass of this package from its fields (anything else: an opaque stand-in)."""
    import dataclasses
    import importlib

    module, _, qualname = name.partition(":")
    in_package = module == "scalebook" or module.startswith("scalebook.")
    if (in_package and isinstance(fields, dict) and qualname
            and not any(part.startswith("_") for part in qualname.split("."))):
        try:
            cls = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
            # a class of this package's own, not one reached through it (grade:os....)
            if (isinstance(cls, type) and dataclasses.is_dataclass(cls)
                    and cls.__module__ == module and cls.__qualname__ == qualname):
                return cls(**{k: decode(v, args) for k, v in fields.items()})
        except Exception:
            pass
    return _Opaque(qualname.rpartition(".")[2] or "object", f"a {qualname or 'value'}")


def _replay(calls: list, cases: list, stub: bool = False):
    """A stand-in for the student's function: returns (or raises) what it did in the kernel,
    for the grader's inputs ``cases`` (matched by identity: the check calls it with them).
    ``stub``: the student's function was the template's (its body still ``...``)."""
    def find(args):
        for c, r in zip(cases, calls):
            if len(c) == len(args) and all(a is b for a, b in zip(c, args)):
                return c, r
        return None, None

    def fn(*args):
        case, rec = find(args)
        if not isinstance(rec, dict):
            raise RuntimeError("the grader did not run this input")
        if "raised" in rec:
            name, message = (list(rec["raised"]) + ["", ""])[:2]
            raise type(str(name)[:60] or "Exception", (Exception,), {})(message)
        return decode(rec.get("value"), case)

    fn.scalebook_stub = bool(stub)         # read by scalebook.exercises.kinds.is_stub
    return fn


@contextmanager
def _lenient_hints():
    """Grading is a student's run: a hint whose predicate raises is skipped, not fatal."""
    old = os.environ.get("SCALEBOOK_STRICT_HINTS")
    os.environ["SCALEBOOK_STRICT_HINTS"] = "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SCALEBOOK_STRICT_HINTS", None)
        else:
            os.environ["SCALEBOOK_STRICT_HINTS"] = old


def _passed_fraction(ex_id: str, fn, cases: list) -> float:
    """The share of a code exercise's *drawn* test inputs on which the recorded answers
    are right. The published inputs are left out: a table of their answers (the chapter
    prints them) must earn nothing, partial credit included."""
    from .exercises import get_exercise

    ex, passed = get_exercise(ex_id), 0
    cases = list(cases)[len(ex.cases):]
    for args in cases:
        try:
            got = fn(*args)
            passed += bool(ex._equal(got, ex.reference(*args)))
        except Exception:
            pass
    return passed / len(cases) if cases else 0.0


def check_records(items: list) -> dict:
    """The checker's work (run in its own sandbox, on data only: no student code runs
    here): judge each code answer's recorded calls on the grader's inputs, and compile and
    run each exported program on input values of the checker's own. Returns id ->
    [status, message, share of inputs right]."""
    from .exercises import evaluate, get_exercise

    out = {}
    with _lenient_hints():
        for item in items:
            ex_id, rec = item["id"], item["rec"]
            try:
                if item["how"] == "function":
                    cases = _unpack(item["cases"])
                    calls = rec.get("calls") if isinstance(rec.get("calls"), list) else []
                    replay = _replay(calls, cases, bool(rec.get("stub", False)))
                    r = evaluate(ex_id, replay, variant=item.get("variant"), cases=cases)
                    share = (_passed_fraction(ex_id, replay, cases)
                             if r.status == "wrong" and not rec.get("stub") else 0.0)
                else:
                    progs = rec.get("programs")
                    if isinstance(progs, list):
                        progs = [{**p, "value": decode(p["value"])}
                                 if isinstance(p, dict) and "value" in p else p
                                 for p in progs]
                    r = get_exercise(ex_id).evaluate_exported(progs, int(item["seed"]))
                    share = 0.0
                out[ex_id] = [r.status, r.message, share]
            except Exception as e:      # a bug of ours: this answer is not graded, others are
                out[ex_id] = ["wrong", f"the grader could not check this answer "
                                       f"({type(e).__name__}: {str(e)[:200]}).", 0.0]
    return out


def _checker(spec_path: str) -> int:
    """The checker process (``--check SPEC``): reads the items, writes the verdicts."""
    import resource

    spec = json.loads(Path(spec_path).read_text())
    if spec.get("memory", 0) > 0:
        resource.setrlimit(resource.RLIMIT_AS, (spec["memory"], spec["memory"]))
    from .mesh import setup

    setup(quiet=True)
    verdicts = check_records(spec["items"])
    Path(spec["verdicts"]).write_text(json.dumps(verdicts))
    return 0


def _evaluate_records(grade: Grade, key: Key, records: dict, secret: bytes | None,
                      partial: bool = False, verdicts: dict | None = None) -> None:
    from .exercises import evaluate
    from .exercises.core import CORRECT, Result, draw_variant

    verdicts = verdicts or {}
    for item in key.items:
        rec = records.get(item.id)
        if rec is None:
            grade.results.setdefault(item.id, (TIMED_OUT if grade.notes else MISSING,
                                               "this exercise's answer was never read: the run "
                                               "stopped before the end."))
            continue
        if rec.get("missing"):
            grade.results[item.id] = (MISSING, f"no answer: `{item.answer}` is not defined after "
                                      f"the run (renamed, deleted, or its cell failed).")
            continue
        variant = draw_variant(item.id, secret, grade.student) if item.variant else None
        how = _how(item.id)
        with _lenient_hints():
            if how == "kernel":       # an exercise of a kind the grader cannot judge outside
                # the kernel: no verdict, since the kernel writes its answers file itself
                # and a "result" line there would be the student's word (none is, today)
                result = Result(item.id, "wrong", "this exercise cannot be judged outside "
                                                  "your kernel, so the grader gives it no "
                                                  "points: tell your instructor.")
            elif how in ("function", "program"):     # judged by the checker
                grade.answers[item.id] = ("a function" if how == "function"
                                          else "a program on the mesh")
                v = verdicts.get(item.id)
                if not (isinstance(v, list) and len(v) == 3):
                    v = ["wrong", "the checker did not judge this answer (see the notes).", 0.0]
                result = Result(item.id, str(v[0]), str(v[1]))
                if partial and result.status == "wrong":
                    grade.partial[item.id] = float(v[2])
            else:                     # a value, judged here; a "result" line is ignored
                try:
                    value = decode(rec.get("value"))
                except RecursionError:
                    value = _Opaque("object", "an answer nested too deep to read")
                grade.answers[item.id] = _short(value)
                if isinstance(value, (int, float, str)) and not isinstance(value, bool):
                    grade.raw[item.id] = value
                result = evaluate(item.id, value, variant=variant)
        if result.status not in ("correct", "wrong", "not attempted"):
            result = Result(item.id, "wrong", "the check's result could not be read.")
        grade.results[item.id] = (result.status, result.message)
    for item in key.items:
        if grade.results[item.id][0] == CORRECT:
            grade.points[item.id] = item.points
        else:                 # partial credit: the share of test inputs answered right
            grade.points[item.id] = round(item.points * grade.partial.get(item.id, 0.0), 4)


def _short(value) -> str:
    """An answer as the feedback shows it: at most 60 characters."""
    if value is Ellipsis:
        return "..."
    text = repr(value) if not isinstance(value, _Opaque) else f"a {value!r}"
    return text if len(text) <= 60 else text[:57] + "..."


def _expected_form(ex_id: str) -> str:
    """What kind of answer an exercise wants (never its value)."""
    from .exercises import get_exercise
    from .exercises.kinds import ChoiceExercise, CodeExercise, NumericExercise

    try:
        ex = get_exercise(ex_id)
    except Exception:
        return ""
    if isinstance(ex, ChoiceExercise):
        return "one of " + ", ".join(repr(c) for c in ex.choices)
    if isinstance(ex, NumericExercise):
        return f"a number ({ex.unit})" if ex.unit else "a number"
    if isinstance(ex, CodeExercise):
        return "a function"
    return "a function (a program on the mesh)"


def _notes_from_report(report: dict, nb) -> list[str]:
    notes = []

    def where(index):
        src = nb.cells[index].source.strip().splitlines() if index < len(nb.cells) else []
        return f"cell {index}" + (f" ({src[0][:50]!r})" if src else "")

    for run in report.get("runs", []):
        for index, seconds in run.get("timeouts", []):
            notes.append(f"{where(index)} ran past {seconds} s and was interrupted.")
        if run.get("dead") is not None:
            notes.append(f"{where(run['dead'])} killed the kernel; the notebook was run again "
                         f"without it.")
        if run.get("stuck") is not None:
            notes.append(f"{where(run['stuck'])} ran past its time limit and did not stop when "
                         f"interrupted; the notebook was run again without it.")
        if run.get("out_of_time") is not None:
            notes.append(f"the notebook ran out of time at {where(run['out_of_time'])}; the "
                         f"cells after it were not run.")
        if run.get("collector"):
            notes.append(f"reading the answers failed: {run['collector']}")
    last = (report.get("runs") or [{}])[-1]
    for index, ename, evalue in last.get("errors", []):
        notes.append(f"{where(index)} raised {ename}: {evalue}")
    seen, out = set(), []
    for n in notes:
        if n not in seen:
            seen.add(n)
            out.append(n)
    return out


# ------------------------------------------------------------------------------------------
# The sandbox: each notebook's worker and kernel run in bubblewrap
# ------------------------------------------------------------------------------------------
class SandboxMissing(RuntimeError):
    """bubblewrap (``bwrap``) is not installed: the grader refuses to run student code."""


INSTALL_BWRAP = "sudo apt-get install bubblewrap   (Debian/Ubuntu; other systems: bubblewrap)"


def bwrap_path() -> str:
    """The ``bwrap`` executable, or SandboxMissing with the command to install it."""
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxMissing("the grader runs every notebook in a bubblewrap sandbox, and "
                             f"`bwrap` is not installed: {INSTALL_BWRAP}")
    return exe


def package_copy(dest: Path) -> tuple[Path, str]:
    """A read-only copy of the installed ``scalebook`` package under ``dest`` (the folder
    to put on the sandbox's PYTHONPATH) and the SHA-256 of its files, so that nothing a
    submission does to the checkout changes what grades the next one."""
    src = Path(__file__).resolve().parent
    pkg = dest / "scalebook"
    shutil.copytree(src, pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*")):
        if f.is_file():
            h.update(str(f.relative_to(dest)).encode() + b"\0" + f.read_bytes())
    for f in sorted(pkg.rglob("*"), reverse=True):
        f.chmod(0o555 if f.is_dir() else 0o444)
    pkg.chmod(0o555)
    return dest, h.hexdigest()


_SANDBOX_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
                "PYDEVD_DISABLE_FILE_VALIDATION": "1", "JUPYTER_PLATFORM_DIRS": "1",
                "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}


def sandbox_argv(box: Path, pkg_root: Path, argv: list[str], opts: dict | None = None
                 ) -> list[str]:
    """``bwrap`` around ``argv``: every namespace unshared (no network, its own PIDs:
    the whole process tree dies with the worker), dies with the grader, a new session
    (no terminal), no capabilities, an empty environment but for a few settings, the
    system and Python read-only, the package copy read-only, a private /tmp, and one
    writable folder, ``box`` (this notebook's copy, its scratch and its answers).
    Nothing else of the host is mounted: no checkout, no other submission, no
    references, no secret. With a pids cgroup in ``opts`` (``opts["cgroup"]``, made by
    :func:`process_limit` where the grader runs as root), ``bwrap`` starts inside a
    cgroup of its own capped at ``opts["processes"]`` tasks."""
    ro = []
    for d in ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/sbin", "/etc"):
        if os.path.exists(d):
            ro += ["--ro-bind", d, d]
    for d in sorted({sys.base_prefix, sys.prefix, sys.exec_prefix}):
        if not any(d == x or d.startswith(x + "/") for x in ("/usr", "/bin", "/lib")):
            ro += ["--ro-bind", d, d]
    env = []
    for k, v in {**_SANDBOX_ENV, "PYTHONPATH": str(pkg_root)}.items():
        env += ["--setenv", k, v]
    for k, v in os.environ.items():        # JAX and XLA settings, never the secret
        if k.startswith(("JAX_", "XLA_")) and "SECRET" not in k:
            env += ["--setenv", k, v]
    # /tmp first: a bind made before it under /tmp (a venv, the package copy, the box)
    # would be hidden by it
    boxed = [bwrap_path(), "--unshare-all", "--die-with-parent", "--new-session",
             "--cap-drop", "ALL", "--clearenv", *env, "--proc", "/proc",
             "--dev", "/dev", "--tmpfs", "/tmp", *ro,
             "--ro-bind", str(pkg_root), str(pkg_root),
             "--bind", str(box), str(box), "--chdir", str(box / "cwd"), "--"] + argv
    opts = opts or {}
    if opts.get("cgroup") and opts.get("processes", 0) > 0:
        worker = box.name == "box"          # the notebook's own sandbox; else the checker's
        cg = Path(opts["cgroup"]) / (box.parent.name if worker else
                                     f"{box.parent.name}-{box.name}")
        cap = str(opts["processes"])
        if worker:
            _sandbox.cgroup = cg
        return ["/bin/sh", "-c", _JOIN_CGROUP, "sh", str(cg), cap] + boxed
    return boxed


_sandbox = threading.local()           # the cgroup of the sandbox this thread started

# Make a cgroup, cap its tasks, move this shell into it and become the command: every
# process and thread the sandbox starts is then counted against pids.max.
_JOIN_CGROUP = ('mkdir "$1" && echo "$2" > "$1/pids.max" '
                '&& echo $$ > "$1/cgroup.procs" && shift 2 && exec "$@"')
# Processes and threads one notebook's sandbox may run at once: bubblewrap's two, the
# worker's and the kernel's, which JAX/XLA and OpenBLAS make many of (thread pools sized
# by the machine's cores). Measured over every chapter: at most 65 on 2 cores, 4 more
# per core (book/instructor.md); the default leaves twice that.
DEFAULT_PROCESSES = 128 + 8 * len(os.sched_getaffinity(0))


def _cgroup_roots() -> list[Path]:
    """Where a pids cgroup can be made: the cgroup-v1 pids hierarchy, or the cgroup-v2
    tree when it offers the pids controller."""
    roots = []
    v1 = Path("/sys/fs/cgroup/pids")
    if (v1 / "cgroup.procs").exists():
        roots.append(v1)
    for v2 in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        try:
            if "pids" in (v2 / "cgroup.controllers").read_text().split():
                roots.append(v2)
        except OSError:
            pass
    return roots


def _make_pids_cgroup() -> Path | None:
    """A fresh cgroup under which each sandbox gets a child capped by pids.max, or None
    where none can be made (not root, no pids controller, a read-only /sys)."""
    for root in _cgroup_roots():
        parent = root / f"scalebook-grade-{os.getpid()}-{int(time.time() * 1000)}"
        try:
            parent.mkdir()
        except OSError:
            continue
        try:
            if (root / "cgroup.subtree_control").exists():      # v2: hand pids down
                for d in (root, parent):
                    if "pids" not in (d / "cgroup.subtree_control").read_text().split():
                        (d / "cgroup.subtree_control").write_text("+pids")
            probe = parent / "probe"
            probe.mkdir()
            ok = (probe / "pids.max").exists()
            probe.rmdir()
            if ok:
                return parent
        except OSError:
            pass
        _remove_cgroup(parent)
    return None


def _remove_cgroup(parent: Path) -> None:
    """Kill what is left in the sandboxes' cgroups (nothing, normally) and remove
    them."""
    children = [d for d in parent.iterdir() if d.is_dir()] if parent.is_dir() else []
    for d in children + [parent]:
        for _ in range(50):
            try:
                for pid in (d / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def process_limit(processes: int) -> tuple[str, Path | None]:
    """How the cap of ``processes`` tasks per notebook is enforced here: ("rlimit",
    None) for a user other than root (RLIMIT_NPROC, set in the kernel, counts the
    sandbox's tasks in its own user namespace); ("cgroup", parent) for root, whom
    RLIMIT_NPROC never binds (the kernel exempts user id 0, and bubblewrap maps root to
    root), when a pids cgroup can be made; ("none", None) when neither works or
    ``processes`` is 0."""
    if processes <= 0:
        return "none", None
    if os.geteuid() != 0:
        return "rlimit", None
    parent = _make_pids_cgroup()
    return ("cgroup", parent) if parent is not None else ("none", None)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_BOX_READ_LIMIT = 8 * 2**20


def _read_box_text(path: Path, limit: int = _BOX_READ_LIMIT) -> str:
    """A file the sandbox wrote: opened without following a link, a regular file only,
    at most ``limit`` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return ""
        return f.read(limit).decode("utf-8", "replace")


def _read_box_json(path: Path):
    try:
        value = json.loads(_read_box_text(path) or "null")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def nbformat_dumps(nb) -> str:
    import nbformat

    return nbformat.writes(nb)


def grade_one(sub: Submission, key: Key, secret: bytes | None, opts: dict, workdir: Path,
              logdir: Path) -> Grade:
    """Grade one submission (runs its notebook in a worker subprocess)."""
    t0 = time.time()
    grade = Grade(sub.student, sub.path)
    if sub.path is None:
        for item in key.items:
            grade.results[item.id] = (NO_SUBMISSION, "no notebook was handed in.")
            grade.points[item.id] = 0.0
        return grade
    nb, why = read_notebook(sub.path) if not sub.problem else (None, sub.problem)
    if nb is None:
        for item in key.items:
            grade.results[item.id] = (UNREADABLE, f"the notebook could not be graded: {why}.")
            grade.points[item.id] = 0.0
        grade.notes.append(why)
        return grade
    if sub.note:
        grade.notes.append(sub.note)
    claimed = nb.metadata.get("scalebook", {}).get("student")
    if claimed is not None and str(claimed) != sub.student and not sub.note:
        grade.notes.append(f"the notebook was made for student {claimed!r} but was handed in as "
                           f"{sub.student!r}; graded as {sub.student!r} (its variants).")
    tmp = Path(tempfile.mkdtemp(prefix="nb-", dir=workdir))
    box = tmp / "box"                   # the only folder the sandbox can write
    cwd = box / "cwd"
    cwd.mkdir(parents=True)
    notebook = box / "submission.ipynb"           # its own copy: never the class folder
    notebook.write_text(nbformat_dumps(nb))
    records = box / "records.jsonl"
    cases = {item.id: function_cases(item.id, input_seed(secret, sub.student, item.id))
             for item in key.items if _how(item.id) == "function"}
    (box / "collector.py").write_text(collector_source(key, records, opts["call_limit"], cases))
    spec = {"notebook": str(notebook), "records": str(records),
            "collector": str(box / "collector.py"), "report": str(box / "report.json"),
            "kernel_pid": str(box / "kernel.pid"), "tmp": str(box), "cwd": str(cwd),
            "log": str(box / "worker.log"),
            "time_limit": opts["time_limit"], "cell_timeout": opts["cell_timeout"],
            "reserve": opts["reserve"], "memory": opts["memory"], "cpu": opts["time_limit"],
            "started": t0, "processes": opts.get("processes", 0)}
    (box / "spec.json").write_text(json.dumps(spec))
    argv = sandbox_argv(box, opts["pkg_root"], [sys.executable, "-m", "scalebook.grade",
                                                "--worker", str(box / "spec.json")],
                        opts)
    with open(logdir / f"{sub.student}.log", "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=tmp, env=dict(_SANDBOX_ENV),
                                start_new_session=True)
        try:
            proc.wait(timeout=opts["time_limit"] + 30)
        except subprocess.TimeoutExpired:
            grade.notes.append(f"the notebook ran past the time limit of {opts['time_limit']} s "
                               f"and was stopped.")
            _kill_group(proc.pid)      # bwrap: its PID namespace, every process in it, ends
            proc.wait()
        log.write(_read_box_text(box / "worker.log", 2**20))
    report = _read_box_json(box / "report.json")
    if report is not None:
        grade.notes += _notes_from_report(report, nb)
    elif proc.returncode not in (0, -9, None):
        grade.notes.append(f"the grader's worker failed (exit {proc.returncode}); see "
                           f"logs/{sub.student}.log")
    recs = {}
    known = {i.id for i in key.items}
    for line in _read_box_text(records).splitlines():
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):      # RecursionError: [[[[... 5,000 deep
            continue
        if isinstance(rec, dict) and rec.get("id") in known and rec["id"] not in recs:
            recs[rec["id"]] = rec
    verdicts = _run_checker(sub, key, recs, cases, secret, opts, tmp, logdir)
    if isinstance(verdicts, str):
        grade.notes.append(verdicts)
        verdicts = {}
    _evaluate_records(grade, key, recs, secret, partial=opts.get("partial", False),
                      verdicts=verdicts)
    shutil.rmtree(tmp, ignore_errors=True)
    grade.seconds = time.time() - t0
    return grade


def _run_checker(sub: Submission, key: Key, recs: dict, cases: dict, secret, opts: dict,
                 tmp: Path, logdir: Path) -> dict | str:
    """Judge the code and program answers in a second sandbox, the checker, which runs no
    student code: it sees the answers the kernel handed back and the grader's inputs, and
    nothing the kernel could write but those answers. Returns the verdicts (id -> [status,
    message, share]) or a note saying why there are none."""
    from .exercises.core import draw_variant

    items = []
    for item in key.items:
        rec, how = recs.get(item.id), _how(item.id)
        if how not in ("function", "program") or not isinstance(rec, dict) or rec.get("missing"):
            continue
        entry = {"id": item.id, "how": how, "rec": rec,
                 "variant": draw_variant(item.id, secret, sub.student) if item.variant else None}
        if how == "function":
            entry["cases"] = _pack(cases[item.id])
        else:
            seed = input_seed(secret, sub.student, item.id)
            entry["seed"] = int.from_bytes(seed[:4], "big")
        items.append(entry)
    if not items:
        return {}
    box = tmp / "checker"
    (box / "cwd").mkdir(parents=True)
    spec = {"items": items, "verdicts": str(box / "verdicts.json"), "memory": opts["memory"]}
    (box / "check.json").write_text(json.dumps(spec))
    argv = sandbox_argv(box, opts["pkg_root"], [sys.executable, "-m", "scalebook.grade",
                                                "--check", str(box / "check.json")], opts)
    limit = 60 + 20 * len(items)
    with open(logdir / f"{sub.student}.log", "a") as log:
        log.write("\n--- the checker ---\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=box, env=dict(_SANDBOX_ENV),
                                start_new_session=True)
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            proc.wait()
            return f"checking the code answers took more than {limit} s and was stopped."
    verdicts = _read_box_json(box / "verdicts.json")
    if verdicts is None:
        return (f"the checker of the code answers failed (exit {proc.returncode}); see "
                f"logs/{sub.student}.log")
    return verdicts


class _Progress:
    """A one-line progress bar on a terminal; one line per notebook elsewhere."""

    def __init__(self, total: int, stream=None):
        self.total, self.done, self.stream = total, 0, stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.lock = threading.Lock()
        self.t0 = time.time()

    def step(self, grade: Grade, n_items: int):
        with self.lock:
            self.done += 1
            right = sum(1 for s, _ in grade.results.values() if s == "correct")
            width = 30
            fill = int(width * self.done / max(1, self.total))
            line = (f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} "
                    f"{time.time() - self.t0:5.0f} s  {grade.student[:24]}: {right}/{n_items}")
            if self.tty:
                self.stream.write("\r" + line.ljust(90))
                if self.done == self.total:
                    self.stream.write("\n")
            else:
                self.stream.write(line + "\n")
            self.stream.flush()


def grade_submissions(subs: list[Submission], key: Key, secret: bytes | None = None, *,
                      jobs: int | None = None, time_limit: int = 300, cell_timeout: int = 60,
                      memory: int = 4 * 2**30, call_limit: float = 10.0, logdir: Path,
                      progress=None, partial: bool = False,
                      processes: int = DEFAULT_PROCESSES) -> list[Grade]:
    """Grade every submission, ``jobs`` at a time (default: the cores this process may
    use); each notebook's sandbox runs at most ``processes`` processes and threads (0:
    no cap)."""
    if key.varied and secret is None:
        raise ValueError("this key has exercises with variants: give the instructor's secret "
                         "(--secret-file or SCALEBOOK_SECRET)")
    if key.varied and key.secret_check and secret_check(secret) != key.secret_check:
        raise ValueError("the secret does not match the one the assignment was made with")
    bwrap_path()                        # refuse, with the command, rather than run unboxed
    jobs = jobs or len(os.sched_getaffinity(0))
    logdir.mkdir(parents=True, exist_ok=True)
    opts = {"time_limit": time_limit, "cell_timeout": min(cell_timeout, time_limit),
            "reserve": max(10, min(60, time_limit // 5)), "memory": memory, "call_limit": call_limit,
            "partial": partial, "processes": processes}
    # The checks' published inputs are built here, some on the 8-device mesh, and loading a
    # chapter's checks may start JAX (a case made of arrays): give JAX its devices first.
    from .mesh import setup

    setup(quiet=True)
    hows = {_how(i.id) for i in key.items}      # load the chapters' checks before forking
    if "program" in hows:
        try:
            import flatbuffers  # noqa: F401  (jax.export's serialization)
        except ImportError:
            raise ValueError("grading programs on the mesh needs the flatbuffers package "
                             "(pip install flatbuffers; it is in requirements.lock)") from None
    bar = progress if progress is not None else _Progress(len(subs))
    how, opts["cgroup"] = process_limit(processes) if subs else ("none", None)
    if how == "none" and processes > 0 and subs:
        print("warning: the process limit (--processes) is not enforced: the grader "
              "runs as root, which RLIMIT_NPROC does not bind, and no pids cgroup "
              "could be made; run it as another user (book/instructor.md)",
              file=sys.stderr)
    try:
        return _grade_all(subs, key, secret, opts, jobs, logdir, bar)
    finally:
        if opts["cgroup"] is not None:
            _remove_cgroup(opts["cgroup"])


def _grade_all(subs, key, secret, opts, jobs, logdir, bar) -> list[Grade]:
    with tempfile.TemporaryDirectory(prefix="scalebook-grade-") as work:
        work = Path(work)
        (work / "pkg").mkdir()
        opts["pkg_root"], opts["pkg_hash"] = package_copy(work / "pkg")
        with futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            todo = {pool.submit(_grade_noted, s, key, secret, opts, work, logdir): s
                    for s in subs}
            grades = []
            for fut in futures.as_completed(todo):
                sub = todo[fut]
                try:
                    g = fut.result()
                except Exception as e:       # a bug of ours must not lose the class's grades
                    g = Grade(sub.student, sub.path, notes=[f"grader error: {type(e).__name__}: {e}"])
                    for item in key.items:
                        g.results[item.id], g.points[item.id] = (MISSING, "not graded."), 0.0
                g.package_hash = opts["pkg_hash"]
                grades.append(g)
                if bar:
                    bar.step(g, len(key.items))
        for f in (work / "pkg").rglob("*"):        # let the folder be removed
            f.chmod(0o755 if f.is_dir() else 0o644)
    return sorted(grades, key=lambda g: g.student)


_LIMIT_SIGNS = ("Resource temporarily unavailable", "can't start new thread",
                "pthread_create failed")


def _grade_noted(sub, key, secret, opts, work, logdir) -> Grade:
    """grade_one, then a note in the feedback when the run hit the cap on processes and
    threads, so that a cap set too low is not taken for the student's mistake: the
    cgroup's count of refused forks (as root), or else a refused thread or process in
    the log or the cells' errors (XLA stops the kernel: "pthread_create failed")."""
    _sandbox.cgroup = None
    g = grade_one(sub, key, secret, opts, work, logdir)
    if opts.get("processes", 0) <= 0:
        return g
    hit = False
    if _sandbox.cgroup is not None:
        try:
            events = (Path(_sandbox.cgroup) / "pids.events").read_text().split()
            hit = "max" in events and int(events[events.index("max") + 1]) > 0
        except (OSError, ValueError, IndexError):
            pass
    if not hit:
        log = logdir / f"{sub.student}.log"
        text = "\n".join(g.notes)
        if log.is_file():
            with open(log, "rb") as f:
                f.seek(max(0, log.stat().st_size - 2**20))
                text += f.read().decode("utf-8", "replace")
        hit = any(sign in text for sign in _LIMIT_SIGNS)
    if hit:
        cap = opts["processes"]
        g.notes.append(f"the run reached the limit of {cap} processes and threads "
                       f"(--processes): a process or thread it started was refused. "
                       f"A chapter's notebook stays far below it.")
    return g


def _fmt_points(p: float) -> str:
    return f"{p:g}"


def summary_table(grades: list[Grade], key: Key) -> str:
    n = len(grades)
    lines = [f"| exercise | points | right | most common wrong answer's hint |",
             "|:---|---:|---:|:---|"]
    for item in key.items:
        right = sum(1 for g in grades if g.results[item.id][0] == "correct")
        hints = Counter(g.results[item.id][1] for g in grades if g.results[item.id][0] == "wrong")
        top = ""
        if hints:
            message, count = hints.most_common(1)[0]
            top = f"{message if len(message) <= 140 else message[:139] + '…'} ({count})"
        lines.append(f"| {item.id} | {_fmt_points(item.points)} | {right}/{n} | {top} |")
    return "\n".join(lines)


def _late_line(g: Grade, key: Key, late) -> str:
    """What the feedback says about lateness: when, how late, what it cost."""
    if late is None:
        return ""
    possible = _fmt_points(sum(i.points for i in key.items))
    if late.penalty:
        return (f"{late.note} {_fmt_points(g.total)} of {possible} points become "
                f"{_fmt_points(late.after(g.total))}.")
    return late.note


def _feedback(g: Grade, key: Key, late=None) -> str:
    possible = sum(i.points for i in key.items)
    lines = [f"# Feedback for {g.student}", "",
             f"{key.title + ': ' if key.title else ''}{_fmt_points(g.total)} of "
             f"{_fmt_points(possible)} points.", ""]
    if late is not None:
        lines += [_late_line(g, key, late), ""]
    if g.path is not None:
        lines += [f"Graded by re-running `{g.path.name}` from the top in a fresh kernel.", ""]
    lines += ["| exercise | status | points | your answer | expected | message |",
              "|:---|:---|---:|:---|:---|:---|"]
    for item in key.items:
        cells = [g.results[item.id][1][:_MESSAGE_CHARS], g.answers.get(item.id, ""),
                 _expected_form(item.id)]
        message, answer, form = (c.replace("|", "\\|").replace("\n", " ") for c in cells)
        lines.append(f"| {item.id} | {g.results[item.id][0]} | "
                     f"{_fmt_points(g.points[item.id])} | {answer} | {form} | {message} |")
    if g.notes:
        notes = [f"* {n[:_MESSAGE_CHARS]}" for n in g.notes[:_NOTES_KEPT]]
        if len(g.notes) > _NOTES_KEPT:
            notes.append(f"* ... and {len(g.notes) - _NOTES_KEPT} more (logs/{g.student}.log)")
        lines += ["", "What happened in the run:", ""] + notes
    return "\n".join(lines) + "\n"


# What a notebook can get quoted back in its feedback: bounded, whatever it raises or prints.
_MESSAGE_CHARS, _NOTES_KEPT = 500, 20


def _feedback_html(g: Grade, key: Key, late=None) -> str:
    """The same feedback as a page a student can open: every text escaped."""
    from html import escape

    possible = sum(i.points for i in key.items)
    rows = []
    for item in key.items:
        status, message = g.results[item.id]
        cells = [item.id, status, _fmt_points(g.points[item.id]), g.answers.get(item.id, ""),
                 _expected_form(item.id), message[:_MESSAGE_CHARS]]
        rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    notes = "".join(f"<li>{escape(n[:_MESSAGE_CHARS])}</li>" for n in g.notes[:_NOTES_KEPT])
    title = escape(f"Feedback for {g.student}")
    return (f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>body{{font-family:sans-serif;max-width:60em;margin:2em auto}}"
            f"td,th{{border:1px solid #ccc;padding:.3em .5em;vertical-align:top}}"
            f"table{{border-collapse:collapse}}</style></head><body>\n<h1>{title}</h1>\n"
            f"<p>{escape(key.title + ': ' if key.title else '')}{_fmt_points(g.total)} of "
            f"{_fmt_points(possible)} points.</p>\n"
            + (f"<p>{escape(_late_line(g, key, late))}</p>\n" if late else "")
            + "<table><tr><th>exercise</th><th>status</th>"
            f"<th>points</th><th>your answer</th><th>expected</th><th>message</th></tr>\n"
            + "\n".join(rows) + "</table>\n"
            + (f"<h2>What happened in the run</h2><ul>{notes}</ul>\n" if notes else "")
            + "</body></html>\n")


def _same(a, b) -> bool:
    import math

    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a.strip() == b.strip()
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)
    except (OverflowError, TypeError, ValueError):      # 10**400: only equal to itself
        return a == b


def copy_report(grades: list[Grade], key: Key, secret: bytes | None) -> str:
    """Answers worth a second look, as Markdown: the same wrong answer from several students,
    and an answer that is another student's variant's (re-derived from the secret) but not
    the student's own. Neither proves copying; both are where to look."""
    from .exercises import get_exercise
    from .exercises.core import draw_variant

    by = {g.student: g for g in grades}
    lines = []
    for item in key.items:
        vals = {s: g.raw[item.id] for s, g in by.items() if item.id in g.raw}
        wrong = [(s, v) for s, v in vals.items() if by[s].results[item.id][0] == "wrong"]
        seen = []
        for s, v in wrong:
            group = [t for t, w in wrong if _same(v, w)]
            if len(group) > 1 and group not in seen:
                seen.append(group)
                lines.append(f"| {item.id} | the same wrong answer, {_short(v)} | "
                             f"{', '.join(sorted(group))} |")
        if item.variant and secret:
            ex = get_exercise(item.id)
            refs = {}
            for s in by:
                try:
                    refs[s] = ex.with_variant(draw_variant(item.id, secret, s)).reference()
                except Exception:
                    continue
            for s, v in vals.items():
                if s in refs and _same(v, refs[s]):
                    continue
                others = [t for t, r in refs.items() if t != s and _same(v, r)]
                if others:
                    lines.append(f"| {item.id} | {s}'s answer is the right one for "
                                 f"{', '.join(sorted(others))}'s variant | {s} |")
    head = ["# Answers worth a second look", "",
            "Not proof of copying: where two answers agree more than chance suggests.", ""]
    if not lines:
        return "\n".join(head + ["Nothing found."]) + "\n"
    return "\n".join(head + ["| exercise | what | students |", "|:---|:---|:---|"] + lines) + "\n"


def _write_no_follow(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, replacing a link planted there rather than following it."""
    if path.is_symlink():
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def _read_rows(path: Path) -> list[list[str]]:
    if not path.is_file() or path.is_symlink():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))[1:]


def write_outputs(grades: list[Grade], key: Key, out: Path, keep_others: bool = False,
                  *, late=None, exports=(), people=None, column: str | None = None,
                  everyone: list[Grade] | None = None) -> str:
    """``grades.csv`` (a row per student and exercise), ``gradebook.csv`` (a row per
    student: total, maximum, points per exercise), ``feedback/*.md`` and ``summary.md``
    under ``out`` (links planted there are replaced, never followed); returns the
    summary table. ``keep_others``: keep the rows an earlier run wrote for students not
    graded in this one (``--only``). ``late`` (a :class:`scalebook.gradebook.Deadline`):
    gradebook.csv gets the columns submitted, late_days, penalty, total_after_penalty
    and the feedback says how the penalty was applied. ``exports``: "canvas" and/or
    "gradescope" write ``canvas.csv`` / ``gradescope.csv`` (names and ids from
    ``people``, the assignment's column named ``column``, default the key's title).
    ``everyone``: the whole class's grades for summary.md (:func:`class_grades`)."""
    import io

    from . import gradebook as gb

    out.mkdir(parents=True, exist_ok=True)
    graded = {g.student for g in grades}
    rows = [[g.student, item.id, g.results[item.id][0], _fmt_points(g.points[item.id])]
            for g in grades for item in key.items]
    if keep_others:
        rows += [r for r in _read_rows(out / "grades.csv") if len(r) == 4 and r[0] not in graded]
    rows.sort(key=lambda r: (r[0], [i.id for i in key.items].index(r[1])
                             if r[1] in {i.id for i in key.items} else 1e9))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["student", "exercise", "status", "points"])
    w.writerows(rows)
    _write_no_follow(out / "grades.csv", buf.getvalue())
    ids = [i.id for i in key.items]
    possible = sum(i.points for i in key.items)
    per: dict[str, dict[str, str]] = {}
    handed: dict[str, bool] = {}
    for student, ex, status, points in rows:
        per.setdefault(student, {})[ex] = points
        handed[student] = handed.get(student, False) or status != NO_SUBMISSION
    if late is not None and keep_others:    # times of students graded before (--only)
        for r in _read_dicts(out / "gradebook.csv"):
            if r.get("student") not in graded and r.get("submitted") \
                    and r["student"] not in late.times:
                try:
                    late.times[r["student"]] = gb.parse_time(r["submitted"])
                except ValueError:
                    pass
    book_rows = []
    for student, pts in per.items():
        total = sum(float(pts.get(i, 0) or 0) for i in ids)
        lt = late.of(student, handed[student]) if late is not None else None
        book_rows.append({"student": student, "total": total, "points": pts, "late": lt,
                          "score": lt.after(total) if lt else total})
    book = io.StringIO()
    w = csv.writer(book, lineterminator="\n")
    extra = ["submitted", "late_days", "penalty", "total_after_penalty"] if late else []
    w.writerow(["student", "total", "max"] + ids + extra)
    for r in book_rows:
        cells = [r["student"], _fmt_points(r["total"]), _fmt_points(possible)] + \
            [r["points"].get(i, "") for i in ids]
        if late is not None:
            lt = r["late"]
            when = lt.submitted if lt is not None else None
            cells += ["" if when is None else when.isoformat(),
                      "" if lt is None or lt.days is None else str(lt.days),
                      f"{round(100 * lt.penalty, 4):g}%" if lt else "0%",
                      _fmt_points(r["score"])]
        w.writerow(cells)
    _write_no_follow(out / "gradebook.csv", book.getvalue())
    column = column or key.title or "scalebook assignment"
    writers = {"canvas": gb.canvas_csv, "gradescope": gb.gradescope_csv}
    for name in exports:
        _write_no_follow(out / f"{name}.csv",
                         writers[name](book_rows, column, possible, people or {}))
    fb = out / "feedback"
    if fb.is_symlink():
        fb.unlink()
    fb.mkdir(exist_ok=True)
    lates = {r["student"]: r["late"] for r in book_rows}
    for g in grades:
        lt = lates.get(g.student)
        _write_no_follow(fb / f"{g.student}.md", _feedback(g, key, lt))
        _write_no_follow(fb / f"{g.student}.html", _feedback_html(g, key, lt))
    hashes = sorted({g.package_hash for g in grades if g.package_hash})
    table = summary_table(everyone or grades, key) + "".join(
        f"\n\ngraded with the scalebook package of sha256 {h}" for h in hashes)
    _write_no_follow(out / "summary.md", table + "\n")
    return table


RESULTS_FILE = "results.json"


def class_grades(grades: list[Grade], key: Key, out: Path, keep_others: bool = False
                 ) -> list[Grade]:
    """Every student's grade for the class-wide reports (summary.md, copies.md): those
    graded now and, with ``keep_others`` (``--only``), those an earlier run graded, read
    back from ``results.json`` in ``out`` (statuses, messages, points and number or
    string answers; the grader's own file), which is then written anew."""
    graded = {g.student for g in grades}
    everyone = list(grades)
    ids = {i.id for i in key.items}
    if keep_others:
        try:
            old = json.loads(_read_box_text(out / RESULTS_FILE, 64 * 2**20) or "{}")
        except ValueError:
            old = {}
        for student, r in (old.items() if isinstance(old, dict) else ()):
            if student in graded or not isinstance(r, dict):
                continue
            results = {k: tuple(v) for k, v in r.get("results", {}).items()}
            if set(results) != ids:
                continue                  # graded against another key: left out
            everyone.append(Grade(student, None, results=results,
                                  points=dict(r.get("points", {})), raw=dict(r.get("raw", {}))))
    out.mkdir(parents=True, exist_ok=True)
    _write_no_follow(out / RESULTS_FILE, json.dumps(
        {g.student: {"results": g.results, "points": g.points, "raw": g.raw}
         for g in sorted(everyone, key=lambda g: g.student)}, ensure_ascii=False))
    return sorted(everyone, key=lambda g: g.student)


def _read_dicts(path: Path) -> list[dict]:
    if not path.is_file() or path.is_symlink():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]i?B?|B)?\s*", str(text), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512MiB)")
    unit = (m.group(2) or "B").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}[unit])


def read_secret(path: str | None) -> bytes | None:
    if path:
        return Path(path).read_bytes().strip()
    env = os.environ.get("SCALEBOOK_SECRET")
    return env.encode() if env else None


def _gradebook_options(args):
    """The late-policy and export options, checked before any notebook runs: (the
    :class:`scalebook.gradebook.Deadline` or None, the exports, the roster details)."""
    from . import gradebook as gb

    exports = gb.parse_exports(args.export)
    people = gb.read_roster_info(args.roster_info) if args.roster_info else {}
    if args.roster_info and not exports:
        raise ValueError("--roster-info is used by the exports: add --export canvas "
                         "and/or --export gradescope")
    policy = gb.parse_late_policy(args.late_policy)
    if args.deadline is None:
        if args.submitted or args.late_policy.strip().lower() != "none":
            raise ValueError("--submitted and --late-policy need --deadline "
                             "(ISO-8601 with a zone, e.g. 2025-03-01T17:00:00+01:00)")
        return None, exports, people
    deadline = gb.parse_time(args.deadline, "--deadline")
    if not args.submitted:
        raise ValueError("--deadline needs --submitted: a CSV of student,submitted "
                         "times (an LMS export) or 'mtime' for the notebook files' "
                         "times")
    mtime = args.submitted.strip().lower() == "mtime"
    times = {} if mtime else gb.read_submitted(args.submitted)
    return gb.Deadline(deadline, policy, times), exports, people


def _file_times(subs: list[Submission]) -> dict:
    """``--submitted mtime``: each notebook file's modification time."""
    from .gradebook import utc

    return {s.student: utc(s.path.stat().st_mtime) for s in subs if s.path is not None}


def _gradebook_warnings(grades: list[Grade], late, people, only: bool = False) -> list[str]:
    out = []
    handed = [g.student for g in grades if g.path is not None]
    if late is not None:
        missing = [s for s in handed if s not in late.times]
        if missing:
            out.append(f"no submission time for {', '.join(missing)}: no late penalty "
                       f"applied (flagged in gradebook.csv and their feedback)")
        extra = sorted(set(late.times) - {g.student for g in grades})
        if extra and not only:            # with --only, the others are not regraded
            out.append(f"submission times for students not graded here: "
                       f"{', '.join(extra)}")
    if people:
        unknown = [g.student for g in grades if g.student not in people]
        if unknown:
            out.append(f"no roster details for {', '.join(unknown)}: their rows in the "
                       f"exports must be matched by hand")
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--kernel"]:
        _run_kernel(argv[1:])
        return 0
    if argv[:1] == ["--worker"]:
        return _worker(argv[1])
    if argv[:1] == ["--check"]:
        return _checker(argv[1])
    parser = argparse.ArgumentParser(prog="python -m scalebook.grade",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="notebooks, folders or zip files of them")
    parser.add_argument("--key", required=True,
                        help="key.json from scalebook.assign, or a master notebook")
    parser.add_argument("--secret-file", help="the instructor's secret (else $SCALEBOOK_SECRET)")
    parser.add_argument("--out", default="grading", help="folder for the results (grading/)")
    parser.add_argument("--points", help="points per exercise: 1.1=2,1.9=3 or a JSON file")
    parser.add_argument("--jobs", type=int, default=None, help="notebooks at once (all cores)")
    parser.add_argument("--time-limit", type=int, default=300, help="seconds per notebook (300)")
    parser.add_argument("--cell-timeout", type=int, default=60, help="seconds per cell (60)")
    parser.add_argument("--memory", type=parse_size, default=parse_size("4GiB"),
                        help="memory limit of each kernel (4GiB)")
    parser.add_argument("--only", help="regrade these students only (comma-separated ids); "
                                       "the other rows of --out are kept")
    parser.add_argument("--partial-credit", action="store_true",
                        help="a code answer right on some of its drawn test inputs earns "
                             "that share")
    parser.add_argument("--processes", type=int, default=DEFAULT_PROCESSES,
                        help="processes and threads each notebook may run at once "
                             f"({DEFAULT_PROCESSES}; 0: no limit)")
    parser.add_argument("--submitted", metavar="FILE.csv|mtime",
                        help="submission times: a CSV with student,submitted columns "
                             "(ISO-8601 with a zone), or 'mtime' for the files' times")
    parser.add_argument("--deadline",
                        help="ISO-8601 with a zone: 2025-03-01T17:00+01:00")
    parser.add_argument("--late-policy", default="none",
                        help="none (default), zero, or P%%/day with an optional cap: "
                             "10%%/day,cap=50%%; a partial day counts as a whole one")
    parser.add_argument("--export", action="append", metavar="canvas,gradescope",
                        help="also write canvas.csv and/or gradescope.csv (repeatable)")
    parser.add_argument("--roster-info", metavar="FILE.csv",
                        help="student id -> name, sis id, sis login id, canvas id, "
                             "email, section, for the exports")
    parser.add_argument("--assignment-name",
                        help="the assignment's column in the exports, e.g. "
                             "'Week 2 (4567)' as a Canvas export names it (default: "
                             "the key's title)")
    args = parser.parse_args(argv)
    try:
        key = load_key(args.key)
        apply_points(key, args.points)
        out = Path(args.out)
        late, exports, people = _gradebook_options(args)
        with tempfile.TemporaryDirectory(prefix="scalebook-subs-") as unzip:
            subs, warnings = match_roster(find_submissions(args.paths, Path(unzip)),
                                          key.students)
            have = {s.student for s in subs}
            subs += [Submission(s, None) for s in key.students if s not in have]
            only = None
            if args.only:
                only = {x.strip() for x in args.only.split(",") if x.strip()}
                unknown = only - {s.student for s in subs}
                if unknown:
                    raise ValueError(f"--only names students with no notebook and not on the "
                                     f"roster: {', '.join(sorted(unknown))}")
                subs = [s for s in subs if s.student in only]
            subs.sort(key=lambda s: s.student)
            for w in warnings:
                print(f"warning: {w}", file=sys.stderr)
            if not subs:
                print("no notebooks found", file=sys.stderr)
                return 2
            t0 = time.time()
            if late is not None and args.submitted.strip().lower() == "mtime":
                late.times.update(_file_times(subs))
            grades = grade_submissions(subs, key, read_secret(args.secret_file), jobs=args.jobs,
                                       time_limit=args.time_limit, cell_timeout=args.cell_timeout,
                                       memory=args.memory, logdir=out / "logs",
                                       partial=args.partial_credit,
                                       processes=args.processes)
    except (FileNotFoundError, ValueError, SandboxMissing) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for w in _gradebook_warnings(grades, late, people, only is not None):
        print(f"warning: {w}", file=sys.stderr)
    everyone = class_grades(grades, key, out, keep_others=only is not None)
    table = write_outputs(grades, key, out, keep_others=only is not None, late=late,
                          exports=exports, people=people, column=args.assignment_name,
                          everyone=everyone)
    _write_no_follow(out / "copies.md", copy_report(everyone, key,
                                                    read_secret(args.secret_file)))
    print(f"\n{len(grades)} notebooks graded in {time.time() - t0:.0f} s; results in {out}/ "
          f"(grades.csv, feedback/, summary.md)\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
