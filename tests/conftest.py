"""Shared test set-up: JAX gets the book's 8 simulated CPU devices before any test runs."""

import os

import pytest

import scalebook

scalebook.setup(quiet=True)

# A hint predicate that raises is a bug in an exercise check: under the tests it fails loudly
# (in a student's notebook it is skipped). Notebook kernels started by nbval inherit this.
os.environ["SCALEBOOK_STRICT_HINTS"] = "1"


def _share(item) -> int:
    """Where a test file goes in the queue xdist hands out (--dist loadfile, no reordering):
    the slow ones (the site build, the Colab path) first, then the unit-test files (a few of
    them take most of a minute), then the notebooks, many files of similar size, which fill the
    gaps at the end. Long files first keeps one worker from starting one when the rest are done."""
    if item.get_closest_marker("slow"):
        return 0
    return 2 if item.path.suffix == ".ipynb" else 1


def pytest_collection_modifyitems(config, items):
    # Only under xdist: in one process the files keep pytest's order, easier to read. The sort
    # is stable, so the cells of a notebook keep their order.
    if hasattr(config, "workerinput"):
        items.sort(key=_share)


# The website, built once per test run and shared by the tests that read it (test_site.py,
# test_browser.py): under xdist the workers share pytest's base temporary folder, and a file
# lock makes the first worker that asks build it while the others wait for it.
@pytest.fixture(scope="session")
def built_site(tmp_path_factory):
    import fcntl
    import json
    import subprocess
    import sys
    from pathlib import Path

    if os.environ.get("SCALEBOOK_BUILT_SITE"):   # authoring only: reuse a site built before
        out = Path(os.environ["SCALEBOOK_BUILT_SITE"])
        return out / "_build" / "html", {"returncode": 0, "stdout": "", "stderr": ""}
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out, result = base / "site", base / "site-build.json"
    with open(base / "site-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            root = Path(__file__).resolve().parents[1]
            jb = Path(sys.executable).with_name("jupyter-book")
            r = subprocess.run([str(jb), "build", str(root), "--path-output", str(out), "-W",
                                "-n", "--keep-going"], capture_output=True, text=True,
                               timeout=900)
            result.write_text(json.dumps({"returncode": r.returncode, "stdout": r.stdout[-3000:],
                                          "stderr": r.stderr[-3000:]}))
    return out / "_build" / "html", json.loads(result.read_text())
