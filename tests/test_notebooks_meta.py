"""Rules every chapter notebook follows, checked on the stored files.

* the first cell is the title, the second the Colab badge for this notebook, built from
  _config.yml's repository;
* the third cell is the standard set-up cell (identical everywhere, same install source), the
  first code cell;
* every code cell has been run and no stored output shows a path of this machine (a notebook
  cell's own temporary file, /tmp/ipykernel_<pid>/<n>.py, which some JAX errors name, aside);
* no cell stores an error or is tagged raises-exception: Colab's "Run all" ignores the tag
  and would stop there (errors a chapter shows go through ``sharding.show_error``);
* every exercise in a chapter has its check cell, a registered check, and a solution in the
  solutions notebook that links to it; every solution's check is stored as correct;
* the table of contents lists every notebook.
"""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import exercise_cells  # noqa: E402
import notebooks as nbtool  # noqa: E402

from scalebook.exercises import exercise_ids  # noqa: E402

CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
ALL = CHAPTERS + SOLUTIONS
MACHINE_PATH = re.compile(r"/(work|tmp|root|home)/|site-packages|/usr/local/lib/python")


def load(path):
    return json.loads(path.read_text())


def src(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_there_is_a_solutions_notebook_for_every_chapter():
    assert CHAPTERS, "no chapter notebooks found"
    assert [p.name for p in CHAPTERS] == [p.name for p in SOLUTIONS]


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_badge_and_setup_cells(path):
    cells = load(path)["cells"]
    assert re.fullmatch(r"# (Solutions: )?\d+\. .+", src(cells[0])), "the first cell is the title"
    assert src(cells[1]) == nbtool.badge_source(path), "run tools/notebooks.py sync"
    assert "colab.research.google.com/github/" in src(cells[1])
    assert cells[2]["cell_type"] == "code" and src(cells[2]) == nbtool.setup_source()
    assert nbtool.install_source() in src(cells[2])
    assert not any(c["cell_type"] == "code" for c in cells[:2]), "the set-up cell is the first code cell"


CELL_FILE = re.compile(r"/tmp/ipykernel_\d+/\d+\.py")


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_cells_are_run_and_outputs_clean(path):
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] != "code":
            continue
        assert cell["execution_count"] is not None, f"cell {i} has not been run"
        # Colab's "Run all" ignores the raises-exception tag and stops at the first error:
        # an error a chapter means to show goes through sharding.show_error instead
        assert "raises-exception" not in cell.get("metadata", {}).get("tags", []), \
            f"cell {i} is tagged raises-exception: Run all in Colab would stop there"
        errors = [out for out in cell["outputs"] if out["output_type"] == "error"]
        assert not errors, f"cell {i} stores an error: Run all in Colab would stop there"
        for out in cell["outputs"]:
            text = json.dumps(out.get("text", "")) + json.dumps(out.get("data", {}).get("text/plain", ""))
            text += json.dumps(out.get("evalue", "")) + json.dumps(out.get("traceback", []))
            assert not MACHINE_PATH.search(CELL_FILE.sub("", text)), \
                f"cell {i} shows a path of this machine"


# The first line of a cell whose output nbval does not compare is a comment that says what
# in the output changes from run to run (a timing, a measurement, ...), in a sentence.
IGNORE_REASON = re.compile(r"^# .*\b(differ|differs|change|changes|vary|varies|random|"
                           r"measured|measurement|wall-clock|timings?)\b", re.IGNORECASE)


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_ignored_outputs_say_why(path):
    for i, cell in enumerate(load(path)["cells"]):
        tags = cell.get("metadata", {}).get("tags", [])
        if "nbval-ignore-output" in tags or "nbval-skip" in tags:
            first = src(cell).split("\n")[0]
            assert IGNORE_REASON.search(first) and len(first.split()) >= 5, \
                f"cell {i}: its first line must be a comment saying what changes run to run"


@pytest.mark.parametrize("first, ok", [
    ("# Timings: excluded from nbval's output comparison (they differ on every run).", True),
    ("# a wall-clock time on this machine: it changes from run to run", True),
    ("# noqa", False),
    ("# see above", False),
    ("x = 1  # timings", False),
])
def test_the_ignore_reason_rule_itself(first, ok):
    assert bool(IGNORE_REASON.search(first) and len(first.split()) >= 5) == ok


def _cells_of_kind(path, kind):
    """(id, index of the markdown cell) for each exercise (or solution) cell."""
    found = []
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "markdown":
            parsed = exercise_cells.parse(src(cell))
            if parsed and parsed[0] == kind:
                found.append((f"{parsed[1]}.{parsed[2]}", i))
    return found


def _exercises(path):
    return _cells_of_kind(path, "exercise")


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_exercise_or_solution_is_written_as_a_directive(path):
    """Directives show as raw code in Colab; exercise cells are plain Markdown headings."""
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "markdown":
            assert not re.search(r"(```|:::)\{(exercise|solution)\}", src(cell)), f"cell {i}"
            assert not re.search(r"^#{1,6} (Exercise|Solution) ", src(cell).split("\n", 1)[-1], re.M), \
                f"cell {i}: an exercise heading must start its own cell"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_every_exercise_has_a_check_and_a_solution(path):
    cells = load(path)["cells"]
    found = _exercises(path)
    assert found, "a chapter ends with exercises"
    chapter = int(path.name[:2])
    registered = [e for e in exercise_ids() if e.split(".")[0] == str(chapter)]
    assert sorted(e for e, _ in found) == sorted(registered)
    for ex_id, i in found:
        follow = src(cells[i + 1])
        assert f'check("{ex_id}"' in follow, f"the cell after exercise {ex_id} must call its check"
        assert "not attempted yet" in "".join("".join(o.get("text", "")) for o in cells[i + 1]["outputs"]), \
            f"the chapter stores exercise {ex_id} unanswered"
    solved = [e for e, _ in _cells_of_kind(ROOT / "solutions" / path.name, "solution")]
    assert sorted(solved, key=exercise_cells_key) == sorted((e for e, _ in found), key=exercise_cells_key), \
        "the solutions notebook solves exactly the chapter's exercises"


def exercise_cells_key(ex_id):
    return tuple(int(p) for p in ex_id.split("."))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_every_solution_check_passes(path):
    for cell in load(path)["cells"]:
        if cell["cell_type"] == "code" and 'check("' in src(cell):
            ex = re.search(r'check\("(\d+\.\d+)"', src(cell)).group(1)
            out = "".join("".join(o.get("text", "")) for o in cell["outputs"])
            assert f"✔ Exercise {ex}: correct" in out, f"solution {ex} does not pass its own check"


def test_toc_lists_every_page():
    toc = (ROOT / "_toc.yml").read_text()
    for path in ALL:
        assert f"file: {path.parent.name}/{path.stem}\n" in toc, f"{path} is not in _toc.yml"


MYST_ROLE = re.compile(r"\{[a-z][\w:-]*\}`")


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_myst_role_shows_raw_in_a_notebook(path):
    """Colab and Jupyter show a MyST role such as {cite}`llama3` as raw text: a notebook's
    Markdown cites with links (the site's bibliography page lists every work)."""
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "markdown":
            found = MYST_ROLE.findall(src(cell))
            assert not found, f"cell {i} has the MyST role(s) {found}"
