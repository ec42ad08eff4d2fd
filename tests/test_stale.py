"""tools/stale.py, behind ``tools/notebooks.py stale`` and ``execute``: the code units a
notebook's run is recorded by, the comparison of outputs (it must say what nbval says),
keeping the outputs of nbval-ignore-output cells, and one real run of a small notebook."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import stale  # noqa: E402

sys.path.pop(0)

MODULE = '''"""A module."""
import math

RATE = 2.0


def area(r):
    """Docstring."""
    # a comment
    return math.pi * r * r * RATE


class Shape:
    """A class."""
    sides: int = 3

    def perimeter(self, a):
        return self.sides * a

    @property
    def name(self):
        return "shape"
'''


def units_of(tmp_path, text):
    p = tmp_path / "m.py"
    p.write_text(text)
    return stale.module_units(p)


def test_a_unit_changes_only_with_its_own_code(tmp_path):
    base = units_of(tmp_path, MODULE)
    assert set(base) == {"<module>", "area", "Shape", "Shape.perimeter", "Shape.name"}
    same = MODULE.replace('"""Docstring."""', '"""Another docstring."""').replace(
        "# a comment", "# another comment\n\n")
    assert units_of(tmp_path, same) == base                     # docstrings, comments, lines
    body = units_of(tmp_path, MODULE.replace("r * r * RATE", "r * RATE"))
    assert [u for u in base if body[u] != base[u]] == ["area"]
    const = units_of(tmp_path, MODULE.replace("RATE = 2.0", "RATE = 2.5"))
    assert [u for u in base if const[u] != base[u]] == ["<module>"]
    field = units_of(tmp_path, MODULE.replace("sides: int = 3", "sides: int = 4"))
    assert [u for u in base if field[u] != base[u]] == ["Shape"]
    method = units_of(tmp_path, MODULE.replace("self.sides * a", "self.sides * a * 2"))
    assert [u for u in base if method[u] != base[u]] == ["Shape.perimeter"]
    decorator = units_of(tmp_path, MODULE.replace("    @property\n", ""))
    assert "Shape" in [u for u in base if decorator[u] != base[u]]


def test_code_objects_map_to_their_units(tmp_path):
    units = units_of(tmp_path, MODULE)
    assert stale.unit_of("area", units) == "area"
    assert stale.unit_of("area.<locals>.inner.<locals>.<lambda>", units) == "area"
    assert stale.unit_of("Shape.perimeter", units) == "Shape.perimeter"
    assert stale.unit_of("Shape", units) == "Shape"                 # the class body
    assert stale.unit_of("<module>", units) == "<module>"
    assert stale.unit_of("<lambda>", units) == "<module>"
    assert stale.unit_of("<genexpr>", units) == "<module>"


def cell(source, outputs, tags=(), count=1):
    c = nbformat.v4.new_code_cell(source)
    c.outputs = [nbformat.from_dict(o) for o in outputs]
    c.execution_count = count
    if tags:
        c.metadata["tags"] = list(tags)
    return c


def out(text, name="stdout"):
    return {"output_type": "stream", "name": name, "text": text}


def test_outputs_are_compared_as_nbval_compares_them():
    png = {"output_type": "display_data", "metadata": {},
           "data": {"text/plain": "<Figure size 640x480 with 1 Axes>", "image/png": "AAAA"}}
    stored = nbformat.v4.new_notebook(cells=[
        cell("a", [out("x = 1\n"), out("y = 2\n")]),                 # split stream
        cell("b", [out("/tmp/ipykernel_123/cell.py\n")]),             # sanitised
        cell("c", [dict(png)]),
        cell("d", [out("0.51 s\n")], tags=["nbval-ignore-output"]),
        cell("e", [out("166\n")]),
        nbformat.v4.new_markdown_cell("text"),
        cell("f", [out("same\n")])])
    fresh = nbformat.v4.new_notebook(cells=[
        cell("a", [out("x = 1\ny = 2\n")]),
        cell("b", [out("/tmp/ipykernel_98765/cell.py\n")]),
        cell("c", [dict(png, data={**png["data"], "image/png": "BBBB"})]),
        cell("d", [out("0.73 s\n")], tags=["nbval-ignore-output"]),
        cell("e", [out("164\n")]),
        nbformat.v4.new_markdown_cell("text"),
        cell("f", [out("same\n"), out("warning\n", "stderr")])])
    assert stale.stale_cells(stored, fresh) == [
        (4, "stdout line 1: stored '166', now '164'"),
        (5, "stderr output only in the fresh run")]


def test_ignored_cells_keep_their_outputs_unless_their_source_changed():
    stored = nbformat.v4.new_notebook(cells=[
        cell("t = time()", [out("0.51 s\n")], tags=["nbval-ignore-output"]),
        cell("u = time() * 2", [out("1.0 s\n")], tags=["nbval-ignore-output"]),
        cell("print(1)", [out("1\n")])])
    fresh = nbformat.from_dict(json.loads(json.dumps(stored)))
    fresh.cells[0].outputs = [nbformat.from_dict(out("0.73 s\n"))]
    fresh.cells[1].source = "u = time() * 3"
    fresh.cells[1].outputs = [nbformat.from_dict(out("2.2 s\n"))]
    fresh.cells[2].outputs = [nbformat.from_dict(out("2\n"))]
    assert stale.keep_ignored_outputs(stored, fresh) == 1
    assert [c.outputs[0]["text"] for c in fresh.cells] == ["0.51 s\n", "2.2 s\n", "2\n"]


NOTEBOOK = [
    ("import os\nfrom scalebook.units import fmt_bytes\nprint(fmt_bytes(3e9))", "3 GB\n", ()),
    ("print('fresh')", "stored\n", ()),
    ("import time\nprint(time.time())", "1.0\n", ("nbval-ignore-output",)),
    ("print(f'/tmp/ipykernel_{os.getpid()}/x.py')", "/tmp/ipykernel_1/x.py\n", ()),
    ("print(open('data.txt').read())", "42\n\n", ()),
]


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A five-cell notebook with one stale cell, run by the tool, and by nbval."""
    folder = tmp_path_factory.mktemp("nb")
    (folder / "data.txt").write_text("42\n")
    nb = nbformat.v4.new_notebook(cells=[cell(src, [out(text)], tags)
                                         for src, text, tags in NOTEBOOK])
    path = folder / "small.ipynb"
    nbformat.write(nb, path)
    run = stale.run_notebook(str(path), nbformat.writes(nb), keep=True)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--nbval",
                        "--nbval-current-env", "--nbval-sanitize-with", str(stale.SANITIZE),
                        "-n0", "-q", "--rootdir", str(folder), "-c", "/dev/null", str(path)],
                       capture_output=True, text=True, cwd=folder, timeout=300)
    return run, r, folder


def test_a_run_finds_the_cells_nbval_fails(small_run):
    run, nbval, _ = small_run
    assert run.error == ""
    assert [n for n, _ in run.stale] == [1]
    assert "stored 'stored', now 'fresh'" in run.stale[0][1]
    failed = sorted(int(line.split("::Cell ")[1].split()[0])
                    for line in nbval.stdout.splitlines() if line.startswith("FAILED"))
    assert failed == [n for n, _ in run.stale], nbval.stdout[-2000:]


def test_a_run_records_the_code_and_files_it_used(small_run):
    run, _, folder = small_run
    units = run.entry["code"]["scalebook/units.py"]
    assert {"<module>", "fmt_bytes"} <= set(units) and "fmt_rate" not in units
    assert str(folder / "data.txt") in run.entry["files"] or \
        "data.txt" in " ".join(run.entry["files"])
    nb = nbformat.reads(run.fresh, as_version=4)
    path = folder / "small.ipynb"
    assert stale.changed_inputs(path, nb, run.entry) == []
    edited = json.loads(json.dumps(run.entry))
    edited["code"]["scalebook/units.py"]["fmt_bytes"] = "0" * 16   # as if it had changed
    assert stale.changed_inputs(path, nb, edited) == ["scalebook/units.py: fmt_bytes"]
    nb.cells[1].source = "print('other')"
    assert stale.changed_inputs(path, nb, run.entry) == ["its cells changed"]
    (folder / "data.txt").write_text("43\n")
    assert any("data.txt changed" in w for w in stale.changed_inputs(path, nb, run.entry))


def test_the_cli_lists_stale_cells_and_exits_1(tmp_path):
    """tools/notebooks.py stale on a notebook pair outside the book: one stale cell."""
    md = tmp_path / "pair.md"
    md.write_text(textwrap.dedent('''\
        ---
        jupytext:
          formats: ipynb,md:myst
        kernelspec:
          display_name: Python 3 (ipykernel)
          language: python
          name: python3
        ---

        Text.

        ```{code-cell}
        print(6 * 7)
        ```
        '''))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("Text."),
                                         cell("print(6 * 7)", [out("41\n")])])
    nb.metadata["jupytext"] = {"formats": "ipynb,md:myst"}
    nbformat.write(nb, tmp_path / "pair.ipynb")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "notebooks.py"), "stale",
                        str(md), "--all", "--jobs", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "STALE" in r.stdout and "Cell 0: stdout line 1: stored '41', now '42'" in r.stdout
