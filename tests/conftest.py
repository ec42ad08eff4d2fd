"""Shared test set-up: JAX gets the book's 8 simulated CPU devices before any test runs."""

import os

import scalebook

scalebook.setup(quiet=True)

# A hint predicate that raises is a bug in an exercise check: under the tests it fails loudly
# (in a student's notebook it is skipped). Notebook kernels started by nbval inherit this.
os.environ["SCALEBOOK_STRICT_HINTS"] = "1"


def _share(item) -> int:
    """Where a test file goes in the queue xdist hands out (--dist loadfile, no reordering):
    the slow ones (the site build, the Colab path) first, then the notebooks, whose cells run
    one after another in one kernel, then the many short unit-test files, which fill the gaps
    at the end. Longest first keeps one worker from starting a long file when the rest are done."""
    if item.get_closest_marker("slow"):
        return 0
    if item.path.suffix == ".ipynb":
        return 1
    return 2


def pytest_collection_modifyitems(config, items):
    # Only under xdist: in one process the files keep pytest's order, easier to read. The sort
    # is stable, so the cells of a notebook keep their order.
    if hasattr(config, "workerinput"):
        items.sort(key=_share)
