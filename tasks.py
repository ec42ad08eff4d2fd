#!/usr/bin/env python3
"""The book's two commands. Needs only a Python 3 interpreter to start.

    python3 tasks.py build    # build the website into _build/html (warnings are errors), and its PDF
    python3 tasks.py pdf      # only the PDF: the whole book as one file, _build/html/scalebook.pdf
    python3 tasks.py test     # run the whole test suite
    python3 tasks.py quick    # the quick tier: every test but the slow ones (site, PDF, Colab)
    python3 tasks.py chapter 5  # one chapter: its notebook, its solutions, its exercise tests
    python3 tasks.py stale    # which notebooks' stored outputs a change made stale (--write)
    python3 tasks.py bench    # time every notebook against a kernel-plus-set-up floor, and the suite
    python3 tasks.py student  # the student edition (no solutions) and its site, in _build/student
                              # (--pdf: and its own PDF, printed from the student sources)

Each command creates (or reuses) the virtual environment .venv with Python 3.12 and the
locked, hash-checked versions in requirements.lock, plus this repository's package
``scalebook`` (editable). Set SCALEBOOK_PYTHON to choose the Python 3.12 interpreter.
Extra arguments after ``test`` go to pytest, e.g. ``python3 tasks.py test -k roofline``;
``-m "not slow"`` leaves out the site build and the Colab path. The tests run on all cores
(pytest-xdist, a test file or notebook at a time per worker); ``-n0`` (or ``-p no:xdist``)
runs them in one process.
``quick`` and ``chapter`` take pytest's arguments too. ``stale`` is
``tools/notebooks.py stale`` (its options: ``--write`` stores the fresh outputs, ``--all``).
The tests keep every program XLA compiles in JAX's persistent compilation cache,
``_build/jax-cache``, so a second run compiles little (SCALEBOOK_JAX_CACHE=0: no cache).
``bench`` options: ``--rounds N`` (3), ``--only PATTERN`` (notebooks whose path matches),
``--no-suite`` (skip timing the test suite), ``--suite quick|full|all`` (which tiers: all).
After the timings ``bench`` prints the exercises' slip battery: how many typical
slips get a hint that names them (tests/exercise_harness.py).
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY_VERSION = (3, 12)
STAMP = VENV / ".scalebook-installed"


def _say(msg: str) -> None:
    print(f"[tasks] {msg}", flush=True)


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    major, minor = out.stdout.split()
    return int(major), int(minor)


def find_python() -> str:
    """A Python 3.12 interpreter: $SCALEBOOK_PYTHON, this one, python3.12 on PATH, or pyenv's."""
    candidates = []
    if os.environ.get("SCALEBOOK_PYTHON"):
        candidates.append(os.environ["SCALEBOOK_PYTHON"])
    candidates.append(sys.executable)
    if shutil.which("python3.12"):
        candidates.append(shutil.which("python3.12"))
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{pyenv_root}/versions/3.12*/bin/python3.12"), reverse=True)
    candidates += ["/usr/local/bin/python3.12", "/usr/bin/python3.12"]
    for c in candidates:
        if c and Path(c).exists() and _version_of(c) == PY_VERSION:
            return c
    sys.exit("[tasks] This book needs Python 3.12 (the version Colab runs). Install it, e.g. "
             "'pyenv install 3.12', or point SCALEBOOK_PYTHON at a python3.12 interpreter.")


def _fingerprint() -> str:
    h = hashlib.sha256()
    for name in ("requirements.lock", "pyproject.toml"):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()


def ensure_venv() -> Path:
    """Create or reuse .venv; reinstall only when the lock or pyproject changed."""
    py = VENV / "bin" / "python"
    if py.exists() and _version_of(str(py)) != PY_VERSION:
        _say(f"{VENV} is not Python 3.12; recreating it")
        shutil.rmtree(VENV)
    if not py.exists():
        base = find_python()
        _say(f"creating {VENV.name} with {base}")
        subprocess.run([base, "-m", "venv", str(VENV)], check=True)
    fingerprint = _fingerprint()  # of the files installed from, even if they change meanwhile
    if STAMP.exists() and STAMP.read_text() == fingerprint:
        return py
    _say("installing the locked requirements (hash-checked)")
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    subprocess.run(pip + ["--require-hashes", "--no-deps", "-r", str(ROOT / "requirements.lock")],
                   check=True, cwd=ROOT)
    subprocess.run(pip + ["--no-deps", "--no-build-isolation", "-e", str(ROOT)], check=True, cwd=ROOT)
    STAMP.write_text(fingerprint)
    return py


def _env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # Notebooks draw with the kernel's inline backend; a backend chosen from outside (Agg)
    # would make figures disappear from the outputs nbval compares.
    env.pop("MPLBACKEND", None)
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    return env


PLACEHOLDER_REPOSITORY = "scalebook-authors/scalebook"


def placeholder_warning(root: Path = ROOT) -> str | None:
    """A warning when _config.yml's repository URL (the one place that names it) is still the
    placeholder: the Colab badges, the launch buttons, the set-up cell's install and the
    sitemap would all point at a repository that is not yours."""
    try:
        text = (root / "_config.yml").read_text()
    except OSError:
        return None
    m = re.search(r"^repository:\s*\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)", text, re.M)
    if not m or PLACEHOLDER_REPOSITORY not in m.group(1):
        return None
    return (f"WARNING: _config.yml's repository.url is still the placeholder {m.group(1)}; "
            "the Colab badges, launch buttons, the set-up cell's install and the sitemap point "
            "there. Before publishing, set it to your repository and re-sync the notebooks "
            "(README, 'Publishing a fork').")


def build(args: list[str]) -> int:
    py = ensure_venv()
    out = ROOT / "_build"
    warning = placeholder_warning()
    if warning:
        _say(warning)
    _say("building the site (warnings are errors)")
    cmd = [str(py.with_name("jupyter-book")), "build", str(ROOT), "--path-output", str(ROOT),
           "-W", "-n", "--keep-going"] + args
    no_pdf = "--no-pdf" in args
    cmd = [a for a in cmd if a != "--no-pdf"]
    rc = subprocess.run(cmd, cwd=ROOT, env=_env()).returncode
    if rc == 0:
        _say(f"site built: {out / 'html' / 'index.html'}")
        if no_pdf:
            _say("no PDF (--no-pdf): the site's link to scalebook.pdf stays broken")
        elif not (shutil.which("chromium") or shutil.which("chromium-browser")):
            _say("NO PDF: Chromium is not installed (apt-get install chromium); the site's "
                 "link to scalebook.pdf stays broken")
        else:
            rc = pdf([])
    if warning:
        _say(warning)   # again, where it is seen: after the build's long output
    return rc


def pdf(args: list[str]) -> int:
    """The whole book as one PDF (tools/pdf.py; options: --help)."""
    py = ensure_venv()
    _say("printing the book to PDF (single-page build, then headless Chromium)")
    return subprocess.run([str(py), str(ROOT / "tools" / "pdf.py")] + args, cwd=ROOT,
                          env=_env()).returncode


def pytest_args(args: list[str]) -> list[str]:
    """The pytest arguments for ``test``: pyproject's addopts turn pytest-xdist on (-n auto), so
    ``-p no:xdist`` would leave their -n unrecognised; it becomes -n0, which runs the tests in
    one process as asked. --pdb and --trace need one process too."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if a in ("-pno:xdist", "-p") and (a == "-pno:xdist" or args[i + 1:i + 2] == ["no:xdist"]):
            out.append("-n0")
            i += 1 if a == "-pno:xdist" else 2
            continue
        out.append(a)
        i += 1
    gives_n = any(a == "--numprocesses" or a.startswith("--numprocesses=")
                  or (a.startswith("-n") and not a.startswith("--")) for a in out)
    if not gives_n and any(a in ("--pdb", "--trace") for a in out):
        out.append("-n0")
    return out


def test(args: list[str]) -> int:
    py = ensure_venv()
    _say("running the test suite")
    return subprocess.run([str(py), "-m", "pytest"] + pytest_args(args), cwd=ROOT,
                          env=_env()).returncode


QUICK = ["-m", "not slow"]


def quick(args: list[str]) -> int:
    """The quick tier: ``test -m "not slow"`` (every unit test, notebook and exercise check;
    not the grader's sandboxed runs of whole notebooks, the site, the PDF, the browser, the
    student edition or the Colab path)."""
    return test(QUICK + args)


def chapter_paths(n: int, root: Path = ROOT) -> list[str]:
    """What ``chapter N`` runs: the chapter's notebook and solutions, and its tests
    (tests/*_chNN.py)."""
    tag = f"{n:02d}_"
    paths = [p for d in ("notebooks", "solutions") for p in sorted((root / d).glob(tag + "*.ipynb"))]
    paths += sorted((root / "tests").glob(f"test_*_ch{n:02d}.py"))
    return [p.relative_to(root).as_posix() for p in paths]


def chapter(args: list[str]) -> int:
    if not args or not args[0].isdigit():
        print("usage: python3 tasks.py chapter N [pytest arguments]   e.g. chapter 5 -x")
        return 2
    paths = chapter_paths(int(args[0]))
    if not paths:
        print(f"[tasks] no chapter {args[0]}: no notebooks/{int(args[0]):02d}_*.ipynb")
        return 2
    _say("chapter " + args[0] + ": " + ", ".join(paths))
    return test(paths + args[1:])


def stale(args: list[str]) -> int:
    """tools/notebooks.py stale, run with the venv (options: --help)."""
    py = ensure_venv()
    return subprocess.run([str(py), str(ROOT / "tools" / "notebooks.py"), "stale"] + args,
                          cwd=ROOT, env=_env()).returncode


# ----------------------------------------------------------------------------------------
# bench: how long each notebook takes in a fresh kernel, next to the floor every notebook
# pays (kernel start + the set-up cell), and how long each part of the test suite takes.

NOTEBOOK_DIRS = ("notebooks", "solutions", "book")
# (name, pytest arguments, compilation cache); each part runs as one pytest process, with
# pyproject's options (xdist on). "cold" gives it a new, empty cache (a fresh clone, CI);
# "warm" the cache the part before it left (the inner loop: run again after a change).
SUITE_PARTS = (
    ("quick, cold cache", QUICK, "cold"),
    ("quick, warm cache", QUICK, "warm"),
    ("full, cold cache", [], "cold"),
)


def bench_notebooks(pattern: str | None = None, root: Path = ROOT) -> list[Path]:
    """The notebooks bench runs: those under notebooks/, solutions/ and book/, whose path
    relative to the repository matches PATTERN (a glob, or else a substring)."""
    paths = [p for d in NOTEBOOK_DIRS for p in sorted((root / d).glob("*.ipynb"))]
    if pattern:
        paths = [p for p in paths if fnmatch.fnmatch(p.relative_to(root).as_posix(), pattern)
                 or pattern in p.relative_to(root).as_posix()]
    return paths


def setup_cell(nb: dict) -> dict | None:
    """The notebook's set-up cell: its first code cell tagged ``setup``."""
    for c in nb.get("cells", []):
        if c.get("cell_type") == "code" and "setup" in c.get("metadata", {}).get("tags", []):
            return c
    return None


def floor_notebook(nb: dict) -> dict:
    """A notebook of only NB's set-up cell (outputs cleared), with NB's metadata: running it
    costs what every chapter pays before its first line of content."""
    cell = setup_cell(nb)
    if cell is None:
        raise ValueError("the notebook has no code cell tagged 'setup'")
    cell = json.loads(json.dumps(cell))
    cell["outputs"], cell["execution_count"] = [], None
    return {"cells": [cell], "metadata": json.loads(json.dumps(nb.get("metadata", {}))),
            "nbformat": nb.get("nbformat", 4), "nbformat_minor": nb.get("nbformat_minor", 5)}


def summarise(samples: list[float]) -> dict:
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "n": len(samples)}


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table; columns after the first are right-aligned."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join([":---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def notebook_table(floor: list[float], times: dict[str, list[float]],
                   failed: dict[str, str] | None = None) -> str:
    """The notebook table: median wall time, its ratio to the floor's median, min and max."""
    failed = failed or {}
    f = summarise(floor)
    rows = [["floor (kernel start + set-up cell)", f"{f['median']:.1f}", "1.00",
             f"{f['min']:.1f}", f"{f['max']:.1f}"]]
    for name, samples in times.items():
        if not samples:
            rows.append([name, "failed", "", "", ""])
            continue
        s = summarise(samples)
        rows.append([name + (" (failed)" if name in failed else ""), f"{s['median']:.1f}",
                     f"{s['median'] / f['median']:.2f}", f"{s['min']:.1f}", f"{s['max']:.1f}"])
    return markdown_table(["notebook", "median wall s", "x floor", "min s", "max s"], rows)


def suite_table(parts: list[tuple]) -> str:
    """PARTS: (name, pytest arguments, wall s, CPU s, exit status, pytest's summary)."""
    rows = [[name, "`pytest " + " ".join(a if " " not in a else repr(a) for a in args) + "`",
             f"{wall:.0f}", f"{cpu:.0f}", str(rc), summary]
            for name, args, wall, cpu, rc, summary in parts]
    return markdown_table(["part", "command", "wall s", "CPU s", "exit", "pytest says"], rows)


def as_node(nb: dict):
    """NB (a notebook as stored: JSON, sources as lists of lines) as the NotebookNode nbclient
    runs, a copy: read the way nbformat reads a file, so list sources become strings."""
    import nbformat

    return nbformat.reads(json.dumps(nb), as_version=4)


def _run_notebook(nb: dict, cwd: Path, timeout: int = 600) -> float:
    """Wall seconds to run NB in a fresh python3 kernel (start included), as tools/notebooks.py
    execute does, but the notebook is a copy in memory and nothing is written back."""
    from nbclient import NotebookClient

    client = NotebookClient(as_node(nb), timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    t0 = time.perf_counter()
    client.execute()
    return time.perf_counter() - t0


def _pytest_summary(output: str) -> str:
    lines = [ln.strip("= ").strip() for ln in output.strip().splitlines() if ln.startswith("=")]
    return lines[-1] if lines else (output.strip().splitlines() or [""])[-1][:120]


def time_suite(which: str = "all", run=subprocess.run) -> list[tuple]:
    """Run the SUITE_PARTS of WHICH ("quick", "full" or "all"), each as one pytest process:
    [(name, pytest arguments, wall s, CPU s of the process and its children, exit status,
    pytest's summary line)]. A "cold" part gets a new, empty compilation cache; a "warm"
    one the cache the part before it left. RUN is subprocess.run (a test passes its own)."""
    import resource
    import tempfile

    wanted = {"quick": ("quick",), "full": ("full",), "all": ("quick", "full")}[which]
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-jax-cache-") as caches:
        cache = None
        for i, (part, args, kind) in enumerate(SUITE_PARTS):
            if not part.startswith(wanted):
                continue
            if kind == "cold" or cache is None:
                cache = str(Path(caches) / f"cache{i}")
            env = dict(_env(), SCALEBOOK_JAX_CACHE=cache)
            env.pop("JAX_COMPILATION_CACHE_DIR", None)
            _say(f"suite part {part}: pytest {' '.join(args)}")
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            r = run([sys.executable, "-m", "pytest"] + args, cwd=ROOT, env=env,
                    capture_output=True, text=True)
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
            out.append((part, args, time.perf_counter() - t0, cpu, r.returncode,
                        _pytest_summary(r.stdout)))
    return out


def slip_battery_report(root: Path = ROOT) -> str | None:
    """The slip battery's tables (every numeric exercise's typical slips and the share
    of messages that name them: tests/exercise_harness.py), or None with a note if it
    fails."""
    sys.path.insert(0, str(root / "tests"))
    try:
        from exercise_harness import battery_report
        return battery_report()
    except Exception as e:  # the bench's timings stand without it
        _say(f"slip battery not run: {type(e).__name__}: {e}")
        return None
    finally:
        sys.path.remove(str(root / "tests"))


def _bench_in_venv(opts: argparse.Namespace) -> int:
    paths = bench_notebooks(opts.only)
    if not paths:
        _say(f"no notebook matches {opts.only!r}")
        return 2
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    source = next((p for p in paths if setup_cell(json.loads(p.read_text()))),
                  next(p for p in bench_notebooks() if setup_cell(json.loads(p.read_text()))))
    floor_nb = floor_notebook(json.loads(source.read_text()))
    floor: list[float] = []
    times: dict[str, list[float]] = {p.relative_to(ROOT).as_posix(): [] for p in paths}
    failed: dict[str, str] = {}
    _say(f"{len(paths)} notebooks, {opts.rounds} rounds; floor = kernel start + the set-up cell "
         f"of {source.relative_to(ROOT)}")
    for r in range(1, opts.rounds + 1):
        for p in paths:
            name = p.relative_to(ROOT).as_posix()
            floor.append(_run_notebook(floor_nb, source.parent))
            try:
                times[name].append(_run_notebook(json.loads(p.read_text()), p.parent))
            except Exception as e:  # a failing notebook is reported, the others still run
                text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # the traceback's colours
                last = [ln for ln in text.splitlines() if ln.strip()][-1:] or [""]
                failed[name] = f"{type(e).__name__}: {last[0].strip()}"
            _say(f"round {r}: floor {floor[-1]:.1f} s, {name} "
                 + (f"{times[name][-1]:.1f} s" if name not in failed else "FAILED"))
    suite = [] if opts.no_suite else time_suite(opts.suite)
    changed = [p for p in paths if hashlib.sha256(p.read_bytes()).hexdigest() != before[p]]
    cpus = os.cpu_count()
    print(f"\n### Notebooks: wall seconds in a fresh kernel, median of {opts.rounds} "
          f"(floor: {len(floor)} runs, alternating with the notebooks; {cpus} CPUs)\n")
    print(notebook_table(floor, times, failed))
    for name, why in failed.items():
        print(f"\n{name} failed: {why}")
    if suite:
        print("\n### Test suite by part: one pytest process each, with pyproject's options "
              "(xdist on); CPU s is user + system time of the process and its children\n")
        print(suite_table(suite))
    battery = slip_battery_report()
    if battery:
        print("\n### Exercise hints: the slip battery (tests/exercise_harness.py)\n")
        print("```\n" + battery + "\n```")
    if changed:  # nothing here writes them; someone else did meanwhile
        print("\nnote: these notebooks changed on disk during the run (not by bench): "
              + ", ".join(p.relative_to(ROOT).as_posix() for p in changed))
    return 1 if failed or any(part[4] != 0 for part in suite) else 0


def bench(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python3 tasks.py bench",
                                     description="Time each notebook against the floor (kernel "
                                     "start + set-up cell), and the test suite by part.")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of runs (median); 3")
    parser.add_argument("--only", metavar="PATTERN",
                        help="only notebooks whose path (e.g. notebooks/01_rooflines.ipynb) "
                             "matches this glob or contains it")
    parser.add_argument("--no-suite", action="store_true", help="do not time the test suite")
    parser.add_argument("--suite", choices=("quick", "full", "all"), default="all",
                        help="which tiers of the suite to time: the quick one (cold and warm "
                             "cache), the full one (cold), or all")
    opts = parser.parse_args(args)
    if opts.rounds < 1:
        parser.error("--rounds must be at least 1")
    py = ensure_venv()
    if Path(sys.prefix).resolve() != VENV.resolve():  # run it with the venv's nbclient
        return subprocess.run([str(py), str(ROOT / "tasks.py"), "bench"] + args, cwd=ROOT,
                              env=_env()).returncode
    return _bench_in_venv(opts)


def student(args: list[str]) -> int:
    """The student edition: tools/student_edition.py, run with the venv (options: --help)."""
    py = ensure_venv()
    return subprocess.run([str(py), str(ROOT / "tools" / "student_edition.py")] + args,
                          cwd=ROOT, env=_env()).returncode


def main() -> int:
    commands = {"build": build, "test": test, "quick": quick, "chapter": chapter, "stale": stale,
                "bench": bench, "student": student, "pdf": pdf}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
