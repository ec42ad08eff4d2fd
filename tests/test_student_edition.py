"""The student edition (tools/student_edition.py): the book without its solutions."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("student_edition", ROOT / "tools" / "student_edition.py")
se = importlib.util.module_from_spec(spec)
spec.loader.exec_module(se)


def test_a_sentence_linking_to_a_solution_goes_and_its_neighbours_stay():
    text = ("The check uses bf16. Worked solutions are in the\n"
            "[solutions to chapter 3](../solutions/03_sharding.ipynb). Next, a table.\n")
    out = se.strip_text(text)
    assert "solutions" not in out
    assert out.startswith("The check uses bf16.") and "Next, a table." in out


def test_instructor_blocks_go_and_nothing_else():
    text = "Before.\n<!-- instructor -->\nSecret words.\n<!-- /instructor -->\nAfter.\n"
    assert se.strip_text(text) == "Before.\nAfter.\n"


def test_solution_cells_are_dropped_from_a_notebook_and_the_repository_is_replaced():
    nb = {"cells": [
        {"cell_type": "markdown", "metadata": {}, "source": ["### Exercise 1.1 · A\n", "Do it."]},
        {"cell_type": "markdown", "metadata": {}, "source": "### Solution 1.1\nThe answer."},
        {"cell_type": "code", "metadata": {"tags": ["solution"]}, "source": "x = 42",
         "outputs": [], "execution_count": None},
        {"cell_type": "code", "metadata": {}, "source": "url = 'https://github.com/a/b'",
         "outputs": [], "execution_count": None}]}
    out = se.strip_notebook(nb, "https://github.com/a/b", "https://github.com/c/d")
    assert [se._source(c).split("\n")[0] for c in out["cells"]] == [
        "### Exercise 1.1 · A", "url = 'https://github.com/c/d'"]
    assert len(nb["cells"]) == 4                     # the original is left as it was


def test_the_myst_half_loses_its_solution_cells_too():
    text = ("# 1. T\n\n+++\n\n### Exercise 1.1 · A\n\nDo it.\n\n+++\n\n### Solution 1.1\n\n"
            "Because.\n\n```{code-cell}\nx = 1\n```\n")
    out = se.strip_myst(text)
    assert "Solution 1.1" not in out and "Exercise 1.1" in out and "x = 1" in out


def test_the_table_of_contents_keeps_every_chapter_and_loses_solutions_and_the_guide():
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    out = se.student_toc(toc)
    files = [c["file"] for p in out["parts"] for c in p["chapters"]]
    full = [c["file"] for p in toc["parts"] for c in p["chapters"]]
    assert not [f for f in files if f.startswith("solutions/") or f == "book/instructor"]
    assert files == [f for f in full if not f.startswith("solutions/") and f != "book/instructor"]
    assert any(f.startswith("solutions/") for f in full) and "book/instructor" in full


def test_the_sources_of_the_real_book_show_no_solution(tmp_path):
    dest = tmp_path / "student"
    se.make_sources(ROOT, dest, "https://github.com/course/student-book")
    assert se.leftovers(dest) == []
    assert not (dest / "solutions").exists() and not (dest / "book" / "instructor.md").exists()
    chapters = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert sorted(p.name for p in (dest / "notebooks").glob("*.ipynb")) == chapters
    # The full book does link to solutions, so the search above had something to find.
    assert se.leftovers(ROOT)
    nb = json.loads((dest / "notebooks" / "01_rooflines.ipynb").read_text())
    text = json.dumps(nb)
    assert "course/student-book" in text and "scalebook-authors/scalebook" not in text
    # its own README (no solutions folder, no instructor's guide, no build of the full book),
    # and no link to the full edition's PDF
    readme = (dest / "README.md").read_text()
    assert "student edition" in readme and "solutions/" not in readme
    assert "instructor.md" not in readme and "tasks.py" not in readme
    assert "scalebook.pdf" not in (dest / "book" / "intro.md").read_text()
    assert "scalebook.pdf" in (ROOT / "book" / "intro.md").read_text()


def test_a_link_the_tool_does_not_know_is_found_afterwards(tmp_path):
    dest = tmp_path / "student"
    se.make_sources(ROOT, dest)
    page = dest / "book" / "notation.md"
    page.write_text(page.read_text() + "\nSee <a href='../solutions/01_rooflines.html'>it</a>.\n")
    assert any("notation.md" in hit for hit in se.leftovers(dest))


def test_it_refuses_to_write_over_the_checkout():
    with pytest.raises(se.StudentEditionError, match="under _build/"):
        se.make_sources(ROOT, ROOT / "notebooks")
    with pytest.raises(se.StudentEditionError):
        se.make_sources(ROOT, ROOT.parent)


@pytest.mark.slow
def test_the_student_site_builds_and_links_to_no_solution(tmp_path):
    out = tmp_path / "student"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "student_edition.py"), "--out",
                        str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    html = out / "_build" / "html"
    pages = sorted(html.rglob("*.html"))
    assert (html / "notebooks" / "01_rooflines.html").exists()
    assert not (html / "solutions").exists() and not (html / "book" / "instructor.html").exists()
    for page in pages:
        text = page.read_text()
        assert not re.search(r'href="[^"]*(solutions/|instructor\.html)', text), page.name
    intro = (html / "book" / "intro.html").read_text()
    assert "Assign it." in intro and "For instructors" not in intro
