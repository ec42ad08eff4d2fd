"""The Colab path: a Python where scalebook is NOT installed runs chapter 1 from the top.

The set-up cell must notice that scalebook is missing, install it from the location in
SCALEBOOK_SOURCE (here: this checkout; in Colab: the repository URL from _config.yml) with pip,
and then the whole chapter must run. The "Colab" Python is a fresh virtual environment that
sees the test environment's packages (JAX, ipykernel, ...) through a .pth file but not
scalebook, whose editable install is not visible through it.
"""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "01_rooflines.ipynb"

# The slowest tests of the suite (python3 tasks.py test -m "not slow" leaves them out);
# they may take longer than pyproject's default per-test limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def colab_python(tmp_path_factory):
    base = tmp_path_factory.mktemp("colab")
    venv = base / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "outer_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run([str(py), "-c", "import importlib.util as u; print(u.find_spec('scalebook'), "
                            "u.find_spec('jax') is not None)"], capture_output=True, text=True,
                           cwd=base, check=True).stdout.split()
    assert probe == ["None", "True"], f"the fresh env must see JAX but not scalebook: {probe}"
    kernels = base / "jupyter" / "kernels" / "colab"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "colab-like", "language": "python"}))
    return py, base


def test_setup_cell_installs_scalebook_then_the_chapter_runs(colab_python, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    py, base = colab_python
    monkeypatch.setenv("JUPYTER_PATH", str(base / "jupyter"))
    monkeypatch.setenv("SCALEBOOK_SOURCE", str(ROOT))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    work = base / "notebooks"
    work.mkdir()
    nb = nbformat.read(CHAPTER, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="colab", resources={"metadata": {"path": str(work)}})
    client.execute()
    setup_out = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert f"Installing scalebook from {ROOT}" in setup_out
    assert "with 8 simulated CPU devices" in setup_out
    installed = subprocess.run([str(py), "-m", "pip", "show", "scalebook"], capture_output=True, text=True)
    assert installed.returncode == 0 and "Version: 0.1.0" in installed.stdout
    outputs = "".join("".join(o.get("text", "")) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "Exercise 1.10: not attempted yet" in outputs
    assert not any(o.output_type == "error" for c in nb.cells if c.cell_type == "code" for o in c.outputs)
