"""Shared test set-up: JAX gets the book's 8 simulated CPU devices before any test runs."""

import os

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
