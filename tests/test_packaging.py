"""One locked set of versions: the lock file, the package's pins and the set-up check agree."""

import re
import tomllib
from pathlib import Path

from scalebook.mesh import TESTED_JAX_VERSION

ROOT = Path(__file__).resolve().parents[1]


def lock_pins():
    text = (ROOT / "requirements.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", text, re.M))
    return {k.lower(): v for k, v in pins.items()}, text


def test_every_locked_requirement_has_a_hash():
    _, text = lock_pins()
    blocks = re.split(r"\n(?=[A-Za-z0-9_.\-]+==)", text.split("\n", 1)[1])
    reqs = [b for b in blocks if re.match(r"[A-Za-z0-9_.\-]+==", b)]
    assert len(reqs) > 50
    for b in reqs:
        assert "--hash=sha256:" in b, b.splitlines()[0]


def test_package_pins_equal_the_lock():
    pins, _ = lock_pins()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        name, version = dep.split("==")
        assert pins[name.lower()] == version, f"{name}: pyproject {version} vs lock {pins[name.lower()]}"
    assert pins["jax"] == TESTED_JAX_VERSION
    assert pins["jupyter-book"] == "1.0.4.post1"
    assert "nbval" in pins and "sphinx-exercise" in pins


def test_python_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=3.12,<3.13"
    assert "PY_VERSION = (3, 12)" in (ROOT / "tasks.py").read_text()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 tasks.py test" in readme and "python3 tasks.py build" in readme
    assert "python3 tasks.py test" in ci
