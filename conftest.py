"""The test suite's set-up, for every path it runs (tests/, notebooks/, solutions/, book/):

* JAX gets the book's 8 simulated CPU devices before any test runs;
* every program XLA compiles is kept in JAX's persistent compilation cache for the next run
  (tools/stale.py's NO_JAX_CACHE names the notebooks that must compile for real);
* hint predicates that raise fail loudly (SCALEBOOK_STRICT_HINTS);
* under pytest-xdist the files are handed out longest first, by tests/durations.json
  (``--store-durations`` rewrites it from the run), so the workers finish together.

It lives at the repository's root so that it applies to a notebook run on its own
(``python3 tasks.py test notebooks/05_parallelism.ipynb``), not only to tests/.
"""

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
DURATIONS = ROOT / "tests" / "durations.json"

# JAX's persistent compilation cache serves XLA:CPU too (the same executable, with the same
# as_text(), cost_analysis() and memory_analysis()). Compiling is most of the suite's time,
# so a second run of an unchanged test or notebook takes a fraction of the first. It is set
# before JAX is imported, so this process and every notebook kernel it starts (they inherit
# the environment) use it; the notebooks in tools/stale.py's NO_JAX_CACHE (they count
# compilations in a trace) run without it. The cache is keyed by the program, the compile
# options and the versions of JAX and jaxlib, so it cannot serve an executable of other code.
# SCALEBOOK_JAX_CACHE=0 turns it off (tools/stale.py: cache_env says the rest).
sys.path.insert(0, str(ROOT / "tools"))
import stale  # noqa: E402

sys.path.pop(0)
stale.cache_env(os.environ)

import scalebook  # noqa: E402

scalebook.setup(quiet=True)

# A hint predicate that raises is a bug in an exercise check: under the tests it fails loudly
# (in a student's notebook it is skipped). Notebook kernels started by nbval inherit this.
os.environ["SCALEBOOK_STRICT_HINTS"] = "1"


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="write each test file's seconds (set-up, call and tear-down of its "
                          "tests) to tests/durations.json, which orders the files under xdist")


def _rel(path) -> str:
    path = Path(path).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def set_kernel_cache(notebook) -> None:
    """Make the next kernel started from this process use the persistent compilation cache,
    unless NOTEBOOK (a path) is in tools/stale.py's NO_JAX_CACHE."""
    stale.notebook_cache(os.environ, notebook)


@pytest.fixture
def kernel_cache():
    """set_kernel_cache, for tests that start kernels of their own (tests/test_colab.py)."""
    yield set_kernel_cache
    os.environ.pop("JAX_ENABLE_COMPILATION_CACHE", None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before nbval starts a notebook's kernel (in its first cell's set-up), switch the
    persistent compilation cache off for the notebooks in NO_JAX_CACHE, on for the rest."""
    if item.path.suffix == ".ipynb":
        set_kernel_cache(item.path)


STALE_HINT = ("outputs differ from the stored ones: a change that was meant to change them "
              "needs them stored again ('.venv/bin/python tools/notebooks.py stale' lists "
              "every such cell, 'execute --stale' stores them); otherwise the change broke "
              "what this cell shows")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """nbval reports a cell whose outputs differ as "Notebook cell execution failed", as it
    does a cell that raised: say which it is, and what to run."""
    outcome = yield
    rep = outcome.get_result()
    if item.path.suffix == ".ipynb" and rep.failed and isinstance(rep.longrepr, str) \
            and "Cell outputs differ" in rep.longrepr:
        rep.longrepr = rep.longrepr.replace("Notebook cell execution failed", STALE_HINT, 1)


def _durations() -> dict:
    try:
        return json.loads(DURATIONS.read_text())["seconds"]
    except (OSError, ValueError, KeyError):
        return {}


def pytest_collection_modifyitems(config, items):
    """Under xdist (--dist loadfile, no reordering) the files are handed out in the order of
    ``items``: longest first by tests/durations.json, so that no worker starts a long file
    when the others are nearly done. A file not listed there yet counts as 30 s. The sort is
    stable, so the tests and the cells of a notebook keep their order. In one process the
    files keep pytest's order, easier to read."""
    if not hasattr(config, "workerinput"):
        return
    seconds = _durations()
    items.sort(key=lambda item: -seconds.get(_rel(item.path), 30.0))


_MEASURED: dict[str, float] = {}


def pytest_runtest_logreport(report):
    # On the controller under xdist (and in one process) every report passes here.
    path = report.nodeid.split("::")[0]
    _MEASURED[path] = _MEASURED.get(path, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    if not session.config.getoption("--store-durations") or hasattr(session.config,
                                                                    "workerinput"):
        return
    seconds = _durations()
    seconds.update({k: round(v, 1) for k, v in _MEASURED.items()})
    DURATIONS.write_text(json.dumps({
        "about": "seconds per test file (set-up + call + tear-down of its tests) from one "
                 "run with --store-durations; conftest.py hands the longest out first",
        "seconds": dict(sorted(seconds.items()))}, indent=1) + "\n")
