"""tools/scaffold.py writes a chapter and an exercise that follow the book's rules, and
whose stubs fail until they are written."""

import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import exercise_cells  # noqa: E402
import scaffold  # noqa: E402


@pytest.fixture
def book(tmp_path):
    for d in ("notebooks", "solutions", "scalebook/exercises", "tests"):
        (tmp_path / d).mkdir(parents=True)
    shutil.copy(ROOT / "_toc.yml", tmp_path / "_toc.yml")
    return tmp_path


def test_a_new_chapter_and_exercise(book):
    made = scaffold.new_chapter(12, "demo", "A demonstration", root=book)
    assert [p.name for p in made] == ["12_demo.md", "12_demo.md", "ch12.py", "test_exercises_ch12.py"]
    toc = (book / "_toc.yml").read_text()
    chapters = toc.split("caption: Solutions")[0]
    assert "      - file: notebooks/12_demo\n" in chapters
    assert "      - file: solutions/12_demo\n" in toc.split("caption: Solutions")[1]
    nb = json.loads((book / "notebooks" / "12_demo.ipynb").read_text())
    assert "".join(nb["cells"][0]["source"]) == "# 12. A demonstration"
    assert "colab-badge" in nb["cells"][1]["metadata"]["tags"]
    assert "setup" in nb["cells"][2]["metadata"]["tags"]

    scaffold.new_exercise("12.1", "Count the bytes", "numeric", root=book)
    scaffold.new_exercise("12.2", "Write the function", "code", root=book)
    cells = json.loads((book / "notebooks" / "12_demo.ipynb").read_text())["cells"]
    parsed = [exercise_cells.parse("".join(c["source"])) for c in cells if c["cell_type"] == "markdown"]
    assert [(p[0], p[1], p[2], p[3]) for p in parsed if p] == [
        ("exercise", 12, 1, "Count the bytes"), ("exercise", 12, 2, "Write the function")]
    i = next(i for i, c in enumerate(cells) if "Exercise 12.1" in "".join(c["source"]))
    assert 'check("12.1", answer_12_1)' in "".join(cells[i + 1]["source"])
    sols = json.loads((book / "solutions" / "12_demo.ipynb").read_text())["cells"]
    assert sum("### Solution 12." in "".join(c["source"]) for c in sols) == 2

    checks = (book / "scalebook" / "exercises" / "ch12.py").read_text()
    compile(checks, "ch12.py", "exec")
    assert checks.count("raise NotImplementedError") == 2       # the stubs cannot pass
    tests = (book / "tests" / "test_exercises_ch12.py").read_text()
    compile(tests, "test_exercises_ch12.py", "exec")
    assert tests.count("pytest.fail(") == 2


def test_nothing_is_overwritten(book):
    scaffold.new_chapter(12, "demo", "A demonstration", root=book, sync=False)
    with pytest.raises(SystemExit, match="refusing to overwrite"):
        scaffold.new_chapter(12, "demo", "A demonstration", root=book, sync=False)
    scaffold.new_exercise("12.1", "T", root=book, sync=False)
    with pytest.raises(SystemExit, match="exists already"):
        scaffold.new_exercise("12.1", "T", root=book, sync=False)


def test_bad_arguments_are_refused(book):
    with pytest.raises(SystemExit, match="slug"):
        scaffold.new_chapter(12, "Bad Slug", "T", root=book, sync=False)
    with pytest.raises(SystemExit, match="chapter.number"):
        scaffold.new_exercise("12", "T", root=book, sync=False)
    with pytest.raises(SystemExit, match="no chapter 13"):
        scaffold.new_exercise("13.1", "T", root=book, sync=False)
    scaffold.new_chapter(12, "demo", "T", root=book, sync=False)
    with pytest.raises(SystemExit, match="kind"):
        scaffold.new_exercise("12.1", "T", kind="essay", root=book, sync=False)
