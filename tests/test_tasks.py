"""tasks.py: the parts of the bench and test commands that run without a kernel."""

import importlib.util
import json
import tomllib
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("tasks", ROOT / "tasks.py")
tasks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tasks)


def _nb(cells, **meta):
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3"}, **meta},
            "nbformat": 4, "nbformat_minor": 5}


def _code(src, tags=None, outputs=None):
    return {"cell_type": "code", "source": src, "metadata": {"tags": tags} if tags else {},
            "outputs": outputs or [], "execution_count": 3 if outputs else None}


def test_floor_notebook_is_the_setup_cell_alone_without_outputs():
    setup = _code("import scalebook\nscalebook.setup()", ["setup", "hide-input"],
                  [{"output_type": "stream", "name": "stdout", "text": "8 devices"}])
    nb = _nb([{"cell_type": "markdown", "source": "# Title", "metadata": {}},
              _code("print('before')"), setup, _code("x = 1", ["setup"])], language_info={"x": 1})
    floor = tasks.floor_notebook(nb)
    assert [c["source"] for c in floor["cells"]] == ["import scalebook\nscalebook.setup()"]
    assert floor["cells"][0]["outputs"] == [] and floor["cells"][0]["execution_count"] is None
    assert floor["metadata"] == nb["metadata"] and floor["nbformat"] == 4
    assert nb["cells"][2]["outputs"], "the source notebook is left as it was"


def test_floor_notebook_of_a_stored_notebook_is_what_nbclient_runs():
    stored = json.loads((ROOT / "notebooks" / "01_rooflines.ipynb").read_text())
    assert isinstance(tasks.setup_cell(stored)["source"], list), "stored sources are lists of lines"
    node = tasks.as_node(tasks.floor_notebook(stored))
    assert len(node.cells) == 1 and isinstance(node.cells[0].source, str)
    assert "scalebook" in node.cells[0].source and node.cells[0].outputs == []
    assert tasks.as_node(stored).cells[2].source == node.cells[0].source


def test_floor_notebook_needs_a_setup_cell():
    with pytest.raises(ValueError):
        tasks.floor_notebook(_nb([_code("x = 1", ["hide-input"])]))


def test_every_chapter_and_solution_has_the_setup_cell_the_floor_is_built_from():
    for d in ("notebooks", "solutions"):
        for p in sorted((ROOT / d).glob("*.ipynb")):
            floor = tasks.floor_notebook(json.loads(p.read_text()))
            assert "scalebook.setup()" in "".join(floor["cells"][0]["source"]), p.name


def test_bench_notebooks_selects_by_glob_or_substring(tmp_path):
    for d, names in {"notebooks": ["01_a", "02_b"], "solutions": ["01_a"], "book": ["hw"]}.items():
        (tmp_path / d).mkdir()
        for n in names:
            (tmp_path / d / f"{n}.ipynb").write_text("{}")
    rel = lambda ps: [p.relative_to(tmp_path).as_posix() for p in ps]  # noqa: E731
    assert rel(tasks.bench_notebooks(root=tmp_path)) == [
        "notebooks/01_a.ipynb", "notebooks/02_b.ipynb", "solutions/01_a.ipynb", "book/hw.ipynb"]
    assert rel(tasks.bench_notebooks("01_", root=tmp_path)) == ["notebooks/01_a.ipynb",
                                                                "solutions/01_a.ipynb"]
    assert rel(tasks.bench_notebooks("solutions/*", root=tmp_path)) == ["solutions/01_a.ipynb"]
    assert tasks.bench_notebooks("nothing", root=tmp_path) == []


def test_summarise_takes_the_median():
    assert tasks.summarise([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert tasks.summarise([4.0, 1.0])["median"] == 2.5


def test_notebook_table_is_markdown_with_ratios_to_the_floor_median():
    table = tasks.notebook_table([2.0, 1.0, 3.0, 2.0],
                                 {"notebooks/01_a.ipynb": [5.0, 4.0, 9.0], "book/hw.ipynb": []},
                                 failed={"book/hw.ipynb": "CellExecutionError"})
    lines = table.splitlines()
    assert lines[0] == "| notebook | median wall s | x floor | min s | max s |"
    assert lines[1] == "|:---|---:|---:|---:|---:|"
    assert lines[2] == "| floor (kernel start + set-up cell) | 2.0 | 1.00 | 1.0 | 3.0 |"
    assert lines[3] == "| notebooks/01_a.ipynb | 5.0 | 2.50 | 4.0 | 9.0 |"
    assert lines[4].startswith("| book/hw.ipynb | failed |")
    assert all(ln.count("|") == 6 for ln in lines)


def test_suite_table_quotes_arguments_with_spaces():
    table = tasks.suite_table([("quick", ["-m", "not slow"], 61.4, 97.6, 0, "700 passed in 60s")])
    assert table.splitlines()[2] == "| quick | `pytest -m 'not slow'` | 61 | 98 | 0 | 700 passed in 60s |"


def test_the_suite_parts_time_the_quick_tier_cold_then_warm_and_the_full_suite_cold():
    assert [(name, args, cache) for name, args, cache in tasks.SUITE_PARTS] == [
        ("quick, cold cache", ["-m", "not slow"], "cold"),
        ("quick, warm cache", ["-m", "not slow"], "warm"),
        ("full, cold cache", [], "cold")]


def test_time_suite_gives_each_part_a_cold_or_the_previous_cache(monkeypatch):
    calls = []

    def fake_run(cmd, cwd, env, capture_output, text):
        calls.append((cmd[3:], env["SCALEBOOK_JAX_CACHE"]))
        return types.SimpleNamespace(returncode=len(calls) - 1,
                                     stdout=f"==== {len(calls)} passed in 1.0s ====\n")
    monkeypatch.setattr(tasks, "_say", lambda msg: None)
    rows = tasks.time_suite("all", run=fake_run)
    assert [r[0] for r in rows] == ["quick, cold cache", "quick, warm cache", "full, cold cache"]
    assert [r[4] for r in rows] == [0, 1, 2] and rows[2][5] == "3 passed in 1.0s"
    assert [c[0] for c in calls] == [["-m", "not slow"], ["-m", "not slow"], []]
    cold, warm, full = (c[1] for c in calls)
    assert cold == warm and full != cold                      # warm reuses the cold cache
    table = tasks.suite_table(rows)
    assert table.count("\n") == 4 and "| quick, warm cache |" in table
    calls.clear()
    assert [r[0] for r in tasks.time_suite("quick", run=fake_run)] == [
        "quick, cold cache", "quick, warm cache"]


def test_a_chapter_is_its_notebook_its_solutions_and_its_tests():
    assert tasks.chapter_paths(2) == [
        "notebooks/02_accelerators.ipynb", "solutions/02_accelerators.ipynb",
        "tests/test_chip_internals_ch02.py", "tests/test_exercises_ch02.py",
        "tests/test_hardware_ch02.py"]
    assert tasks.chapter_paths(99) == []


def test_pytest_summary_is_the_last_rule_line():
    out = "x\n==== short test summary info ====\nFAILED a\n===== 1 failed, 3 passed in 2.0s =====\n"
    assert tasks._pytest_summary(out) == "1 failed, 3 passed in 2.0s"


@pytest.mark.parametrize("given, passed", [
    ([], []),
    (["notebooks/01_rooflines.ipynb"], ["notebooks/01_rooflines.ipynb"]),
    (["-p", "no:xdist", "-k", "x"], ["-n0", "-k", "x"]),
    (["-pno:xdist"], ["-n0"]),
    (["-p", "no:randomly"], ["-p", "no:randomly"]),
    (["--pdb"], ["--pdb", "-n0"]),
    (["--pdb", "-n", "2"], ["--pdb", "-n", "2"]),
    (["-m", "not slow"], ["-m", "not slow"]),
])
def test_pytest_args(given, passed):
    assert tasks.pytest_args(given) == passed


def test_pytest_defaults_spread_files_over_workers_and_time_out():
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    opts = ini["addopts"].split()
    assert "-n" in opts and opts[opts.index("--dist") + 1] == "loadfile"
    assert "--no-loadscope-reorder" in opts  # the order is conftest's, slow files first
    assert 0 < int(ini["timeout"]) <= 1200
    assert any(m.startswith("slow:") for m in ini["markers"])


def test_build_warns_while_the_repository_url_is_the_placeholder(tmp_path):
    """_config.yml names the repository once; tasks.py build says so while it is still
    scalebook-authors/scalebook, and where to set it."""
    assert "scalebook-authors/scalebook" in (ROOT / "_config.yml").read_text()
    assert "repository.url" in tasks.placeholder_warning(ROOT)
    (tmp_path / "_config.yml").write_text(
        "title: x\nrepository:\n  url: https://github.com/scalebook-authors/scalebook\n"
        "  branch: main\n")
    warning = tasks.placeholder_warning(tmp_path)
    assert warning and "placeholder" in warning and "Publishing a fork" in warning
    (tmp_path / "_config.yml").write_text(
        "title: x\n# scalebook-authors/scalebook was the placeholder\nrepository:\n"
        "  url: https://github.com/my-course/llm-book\n  branch: main\n")
    assert tasks.placeholder_warning(tmp_path) is None
    assert tasks.placeholder_warning(tmp_path / "missing") is None


def test_build_prints_the_placeholder_warning_before_and_after(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(tasks, "ensure_venv", lambda: Path("/venv/bin/python"))
    monkeypatch.setattr(tasks.subprocess, "run",
                        lambda cmd, **kw: calls.append(cmd) or types.SimpleNamespace(returncode=0))
    assert tasks.build(["--no-pdf"]) == 0
    out = capsys.readouterr().out
    assert out.count("WARNING: _config.yml's repository.url is still the placeholder") == 2
    assert calls and calls[0][1] == "build"
def test_bench_prints_the_slip_battery():
    report = tasks.slip_battery_report()
    assert report is not None and "specific" in report and "ring (n-1)/n" in report
    assert report.splitlines()[-1].split()[0] == "all"
