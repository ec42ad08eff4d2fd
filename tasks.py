#!/usr/bin/env python3
"""The book's two commands. Needs only a Python 3 interpreter to start.

    python3 tasks.py build    # build the website into _build/html (warnings are errors)
    python3 tasks.py test     # run the whole test suite

Each command creates (or reuses) the virtual environment .venv with Python 3.12 and the
locked, hash-checked versions in requirements.lock, plus this repository's package
``scalebook`` (editable). Set SCALEBOOK_PYTHON to choose the Python 3.12 interpreter.
Extra arguments after ``test`` go to pytest, e.g. ``python3 tasks.py test -k roofline``.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
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
    if STAMP.exists() and STAMP.read_text() == _fingerprint():
        return py
    _say("installing the locked requirements (hash-checked)")
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "install", "-q"]
    subprocess.run(pip + ["--require-hashes", "--no-deps", "-r", str(ROOT / "requirements.lock")],
                   check=True, cwd=ROOT)
    subprocess.run(pip + ["--no-deps", "--no-build-isolation", "-e", str(ROOT)], check=True, cwd=ROOT)
    STAMP.write_text(_fingerprint())
    return py


def _env() -> dict:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # Notebooks draw with the kernel's inline backend; a backend chosen from outside (Agg)
    # would make figures disappear from the outputs nbval compares.
    env.pop("MPLBACKEND", None)
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    return env


def build(args: list[str]) -> int:
    py = ensure_venv()
    out = ROOT / "_build"
    _say("building the site (warnings are errors)")
    cmd = [str(py.with_name("jupyter-book")), "build", str(ROOT), "--path-output", str(ROOT),
           "-W", "-n", "--keep-going"] + args
    rc = subprocess.run(cmd, cwd=ROOT, env=_env()).returncode
    if rc == 0:
        _say(f"site built: {out / 'html' / 'index.html'}")
    return rc


def test(args: list[str]) -> int:
    py = ensure_venv()
    _say("running the test suite")
    return subprocess.run([str(py), "-m", "pytest"] + args, cwd=ROOT, env=_env()).returncode


def main() -> int:
    commands = {"build": build, "test": test}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(__doc__)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
