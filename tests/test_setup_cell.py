"""The set-up cell on a Colab image that lacks scalebook: what it says when pip has to
upgrade the image's JAX, and pip's dependency conflicts, shown rather than swallowed
(pip runs quietly, its output captured). Run with pip, the package and the version lookup
replaced by stand-ins, so nothing is installed."""

import importlib.metadata
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import notebooks as nbtool  # noqa: E402


OTHERS = {"numpy": "2.3.0", "matplotlib": "3.10.0"}


def run_setup(monkeypatch, capsys, versions, stderr="", returncode=0):
    """Run the set-up cell with scalebook 'missing', pip answering ``stderr``, and JAX's
    installed version reading ``versions`` in turn (before pip, then after)."""
    # versions: JAX's version before pip, then after (numpy and matplotlib: as given in
    # ``others``, the same before and after unless a pair is given)
    phases = iter(versions)
    state = {"n": 0, "jax": None}

    def version(name):
        if name == "jax":
            state["jax"] = next(phases)
            return state["jax"]
        value = OTHERS.get(name)
        if isinstance(value, tuple):
            return value[0] if state["n"] < 1 else value[1]
        return value

    def counting(name):
        out = version(name)
        if name == "matplotlib":
            state["n"] += 1
        return out

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "scalebook" else real_find_spec(name, *a))
    monkeypatch.setattr(importlib.metadata, "version", counting)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: types.SimpleNamespace(
        returncode=returncode, stderr=stderr, stdout=""))
    fake = types.ModuleType("scalebook")
    fake.setup = lambda: "set up"
    monkeypatch.setitem(sys.modules, "scalebook", fake)
    saved_jax = sys.modules.pop("jax", None)          # the cell refuses if JAX is imported
    try:
        ns = {}
        try:
            exec(nbtool.setup_source(), ns)
        except SystemExit:
            pass
    finally:
        if saved_jax is not None:
            sys.modules["jax"] = saved_jax
    return capsys.readouterr().out, ns


def test_an_upgraded_jax_is_announced_in_one_line(monkeypatch, capsys):
    out, ns = run_setup(monkeypatch, capsys, ["0.4.30", "0.12.0.1"])
    assert "JAX 0.4.30 was too old for scalebook: pip installed JAX 0.12.0.1." in out
    assert ns["setup_info"] == "set up"


def test_a_jax_in_range_is_left_alone_and_nothing_is_said(monkeypatch, capsys):
    out, _ = run_setup(monkeypatch, capsys, ["0.12.0.1", "0.12.0.1"])
    assert "JAX" not in out and out.startswith("Installing scalebook from")


def test_pips_dependency_conflicts_are_shown(monkeypatch, capsys):
    stderr = ("ERROR: pip's dependency resolver does not currently take into account all "
              "the packages that are installed. This behaviour is the source of the "
              "following dependency conflicts.\n"
              "tensorflow 2.19.0 requires ml-dtypes<1.0.0, but you have ml-dtypes 1.1.0 "
              "which is incompatible.\n")
    out, _ = run_setup(monkeypatch, capsys, ["0.12.0.1", "0.12.0.1"], stderr=stderr)
    assert "pip: tensorflow 2.19.0 requires ml-dtypes<1.0.0" in out
    assert "dependency conflicts" in out


def test_a_failed_install_is_one_message(monkeypatch, capsys):
    out, ns = run_setup(monkeypatch, capsys, ["0.12.0.1"], stderr="ERROR: no network",
                        returncode=1)
    assert "ERROR: no network" in out and "Could not install scalebook" in out
    assert "setup_info" not in ns


def test_no_jax_at_all_is_said_plainly(monkeypatch, capsys):
    out, _ = run_setup(monkeypatch, capsys, [None, "0.12.0.1"])
    assert "pip installed JAX 0.12.0.1." in out and "None" not in out


def test_an_upgraded_numpy_is_announced_too(monkeypatch, capsys):
    monkeypatch.setitem(OTHERS, "numpy", ("2.0.2", "2.5.5"))
    out, _ = run_setup(monkeypatch, capsys, ["0.12.0.1", "0.12.0.1"])
    assert "NumPy 2.0.2 was too old for scalebook: pip installed NumPy 2.5.5." in out


def test_a_failed_install_shows_the_cause_not_pips_notes(monkeypatch, capsys):
    stderr = ("\x1b[31mERROR: Could not find a version that satisfies the requirement "
              "scalebook\x1b[0m\nnote: This error originates from a subprocess\n")
    out, _ = run_setup(monkeypatch, capsys, ["0.12.0.1"], stderr=stderr, returncode=1)
    assert "ERROR: Could not find a version" in out and "\x1b[" not in out
    assert "note: This error originates" not in out
