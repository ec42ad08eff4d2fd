"""One locked set of versions, one declared range: the lock file holds the exact versions the
tests and the site use, the package declares the range it supports (lower bounds: the oldest
versions tests/test_colab.py runs every chapter on), and the set-up check knows the pins."""

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from scalebook.mesh import TESTED_JAX_VERSION, TESTED_VERSIONS

ROOT = Path(__file__).resolve().parents[1]


def lock_pins():
    text = (ROOT / "requirements.lock").read_text()
    pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==([^\s\\;]+)", text, re.M))
    return {k.lower(): v for k, v in pins.items()}, text


def declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {Requirement(d).name.lower(): Requirement(d) for d in project["dependencies"]}


def lower_bounds() -> dict[str, str]:
    """The oldest supported version of each dependency (its '>=' bound in pyproject)."""
    out = {}
    for name, req in declared().items():
        low = [s.version for s in req.specifier if s.operator == ">="]
        assert len(low) == 1, f"{name}: declare exactly one lower bound (>=), got {req}"
        out[name] = low[0]
    return out


def test_every_locked_requirement_has_a_hash():
    _, text = lock_pins()
    blocks = re.split(r"\n(?=[A-Za-z0-9_.\-]+==)", text.split("\n", 1)[1])
    reqs = [b for b in blocks if re.match(r"[A-Za-z0-9_.\-]+==", b)]
    assert len(reqs) > 50
    for b in reqs:
        assert "--hash=sha256:" in b, b.splitlines()[0]


def test_package_declares_ranges_that_hold_the_locked_versions():
    pins, _ = lock_pins()
    for name, req in declared().items():
        assert not any(s.operator == "==" for s in req.specifier), \
            f"{req}: an exact pin would replace a Colab image's {name}; declare a range"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"{name}: the locked {pins[name]} is outside the declared {req.specifier}"
    assert set(lower_bounds()) == {"jax", "jaxlib", "numpy", "matplotlib"}


def test_the_set_up_check_knows_the_locked_versions():
    pins, _ = lock_pins()
    assert TESTED_VERSIONS == {name: pins[name] for name in TESTED_VERSIONS}
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
