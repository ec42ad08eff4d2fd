"""The Colab path: in a Python where scalebook is NOT installed, every chapter runs from the top.

The set-up cell must notice that scalebook is missing, install it from the location in
SCALEBOOK_SOURCE (here: this checkout; in Colab: the repository URL from _config.yml) with
pip, and then every chapter must run. Each "Colab" Python is a fresh virtual environment that
sees the test environment's packages (ipykernel, scipy, ...) through a .pth file but not
scalebook, whose editable install is not visible through it. Two of them, one per JAX version:

* ``pinned``: the test environment's own versions (requirements.lock);
* ``oldest``: JAX, jaxlib, numpy and matplotlib at the lower bounds pyproject.toml declares,
  installed into the fresh environment first (like an older Colab image), so the claim
  "works from these versions on" is checked, not assumed.

Installing scalebook must leave the image's JAX, numpy and matplotlib alone when they are in
the declared range. One environment per version. In the ``oldest`` one every chapter in
notebooks/ runs, each in a fresh kernel, as a student opening the chapters one after another
would: that proves what nbval's run on the pinned versions does not (the declared lower
bounds, and a chapter running from a non-editable install of the package). In the ``pinned``
one the set-up cell installs the package and leaves the versions alone; running every chapter
there again would repeat nbval's run of each chapter with these very versions.
"""

import json
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WATCHED = ("jax", "jaxlib", "numpy", "matplotlib")

# The slowest tests of the suite (python3 tasks.py test -m "not slow" leaves them out);
# they may take longer than pyproject's default per-test limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def lower_bounds() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for d in deps:
        req = Requirement(d)
        out[req.name] = next(s.version for s in req.specifier if s.operator == ">=")
    return out


def versions(py) -> dict:
    code = ("import json, importlib.metadata as m; "
            "print(json.dumps({n: m.version(n) for n in %r}))" % (WATCHED,))
    return json.loads(subprocess.run([str(py), "-c", code], capture_output=True, text=True,
                                     check=True).stdout)


def scalebook_installed(py) -> bool:
    """Whether scalebook is importable in the fresh environment from its own site-packages
    (the test environment's editable install is not visible there, though pip lists it)."""
    r = subprocess.run([str(py), "-c", "import scalebook, sys; print(scalebook.__file__)"],
                       capture_output=True, text=True, cwd=Path(py).parent)
    return r.returncode == 0 and str(Path(py).parents[1]) in r.stdout


@pytest.fixture(scope="module", params=["pinned", "oldest"])
def colab_python(request, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"colab-{request.param}")
    venv = base / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "outer_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    if request.param == "oldest":
        pins = [f"{name}=={v}" for name, v in lower_bounds().items()]
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            *pins], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"could not install the declared lower bounds {pins}:\n" + \
            r.stderr[-3000:]
        assert versions(py) == lower_bounds()
    probe = subprocess.run([str(py), "-c", "import importlib.util as u; print(u.find_spec('scalebook'), "
                            "u.find_spec('jax') is not None)"], capture_output=True, text=True,
                           cwd=base, check=True).stdout.split()
    assert probe == ["None", "True"], f"the fresh env must see JAX but not scalebook: {probe}"
    kernels = base / "jupyter" / "kernels" / "colab"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(py), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "colab-like", "language": "python"}))
    work = base / "notebooks"
    work.mkdir()
    return py, base, work, request.param


@pytest.fixture
def colab_env(colab_python, monkeypatch):
    py, base, work, kind = colab_python
    monkeypatch.setenv("JUPYTER_PATH", str(base / "jupyter"))
    monkeypatch.setenv("SCALEBOOK_SOURCE", str(ROOT))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return colab_python


def run(nb, work, allow_errors=False):
    from nbclient import NotebookClient

    client = NotebookClient(nb, timeout=600, kernel_name="colab", allow_errors=allow_errors,
                            resources={"metadata": {"path": str(work)}})
    client.execute()
    return nb


def setup_cell_notebook(*before: str):
    import nbformat

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import notebooks as nbtool
    finally:
        sys.path.pop(0)
    cells = [nbformat.v4.new_code_cell(src) for src in before]
    cells.append(nbformat.v4.new_code_cell(nbtool.setup_source()))
    return nbformat.v4.new_notebook(cells=cells)


def texts(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs)


def test_setup_cell_stops_a_kernel_that_already_imported_jax(colab_env):
    py, base, work, kind = colab_env
    nb = run(setup_cell_notebook("import jax"), work, allow_errors=True)
    cell = nb.cells[-1]
    assert "Restart the runtime, then run this cell first" in texts(cell)
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert [e.ename for e in errors] == ["SystemExit"]   # stops "Run all"; no traceback
    assert not any("Traceback" in line or "File " in line for e in errors for line in e.traceback)
    assert "Installing" not in texts(cell)                  # nothing was installed
    assert not scalebook_installed(py)


def test_setup_cell_install_failure_is_one_clear_message(colab_env, monkeypatch):
    py, base, work, kind = colab_env
    monkeypatch.setenv("SCALEBOOK_SOURCE", str(base / "no-such-folder"))
    nb = run(setup_cell_notebook(), work, allow_errors=True)
    out = texts(nb.cells[-1])
    assert "Could not install scalebook from" in out and "SCALEBOOK_SOURCE" in out
    assert "CalledProcessError" not in json.dumps(nb.cells[-1].outputs)
    assert out.count("ERROR") <= 1, out                     # pip's error once, not twice


def test_the_setup_cell_installs_scalebook_and_keeps_the_images_versions(colab_env):
    py, base, work, kind = colab_env
    before = versions(py)
    nb = run(setup_cell_notebook(), work)
    out = texts(nb.cells[-1])
    assert f"Installing scalebook from {ROOT}" in out
    assert scalebook_installed(py)
    # In range, the image's JAX, numpy and matplotlib are kept, not replaced by pins.
    assert versions(py) == before
    assert "with 8 simulated CPU devices" in out
    assert ("Note: the book was tested with" in out) == (kind == "oldest"), out


def test_every_chapter_runs_through_the_colab_install_path(colab_env, kernel_cache):
    import nbformat

    py, base, work, kind = colab_env
    if kind == "pinned":
        pytest.skip("nbval runs every chapter on the pinned versions; here the set-up cell's "
                    "install is tested (test_the_setup_cell_installs_scalebook_...)")
    assert CHAPTERS, "no chapter notebooks found"
    failures, times = [], {}
    for chapter in CHAPTERS:
        nb = nbformat.read(chapter, as_version=4)
        kernel_cache(chapter)        # the compilation cache as under nbval (conftest.py)
        t0 = time.perf_counter()
        try:
            run(nb, work)
        except Exception as e:  # every chapter is tried; the failures are listed together
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            failures.append(f"{chapter.name}: {lines[-1] if lines else type(e).__name__}")
            continue
        finally:
            times[chapter.name] = time.perf_counter() - t0
        setup_out = texts(nb.cells[2])
        if not scalebook_installed(py):   # the first chapter installs it, unless a test did
            failures.append(f"{chapter.name}: scalebook is not installed after its set-up")
        assert "with 8 simulated CPU devices" in setup_out
        assert "Note: the book was tested with" in setup_out, setup_out
    print(f"\n[colab {kind}] " + ", ".join(f"{k} {v:.0f} s" for k, v in times.items()))
    assert not failures, f"on the {kind} versions {versions(py)}:\n" + "\n".join(failures)
