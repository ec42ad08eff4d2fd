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


def test_a_sentence_running_on_after_its_link_goes_to_its_end_and_no_further():
    text = ("Use the tables. Worked solutions are in the [solutions to chapter 9]"
            "(../solutions/09_profiling.ipynb), a\nnotebook under `solutions` (in Colab: "
            "File, Open\nnotebook, GitHub).\nExercises 9.5 and 9.6 stay.\n\n+++\n")
    out = se.strip_text(text)
    assert "solutions" not in out and "GitHub" not in out and "notebook" not in out
    assert out.startswith("Use the tables.") and "Exercises 9.5 and 9.6 stay." in out
    assert out.endswith("\n\n+++\n")


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


def _texts(folder):
    return {f: f.read_text(errors="replace") for f in folder.rglob("*")
            if f.is_file() and f.suffix in (".md", ".ipynb", ".yml", ".py", ".html")}


def test_the_student_edition_never_holds_or_links_the_full_pdf(tmp_path):
    """Without --pdf: no link to a PDF anywhere. The full book's PDF (it holds the
    solutions) copied in, a PDF the tool did not print, and a link with no student PDF
    are each found."""
    dest = tmp_path / "student"
    se.make_sources(ROOT, dest)
    assert not [f for f, t in _texts(dest).items() if se.PDF_NAME in t]
    checkout = tmp_path / "checkout"            # a checkout with its full PDF built
    full = checkout / "_build" / "html" / se.PDF_NAME
    full.parent.mkdir(parents=True)
    full.write_bytes(b"%PDF-1.7 the whole book, solutions included")
    assert se.leftovers(dest, checkout) == []
    html = dest / "_build" / "html"
    html.mkdir(parents=True)
    (html / se.PDF_NAME).write_bytes(full.read_bytes())
    (dest / "notes.pdf").write_bytes(b"%PDF-1.7 something else")
    found = se.leftovers(dest, checkout)
    assert any("_build/html/scalebook.pdf: the full book's PDF" in f for f in found)
    assert any("notes.pdf: a PDF not printed from the student" in f for f in found)
    (html / se.PDF_NAME).unlink()
    (dest / "notes.pdf").unlink()
    page = dest / "book" / "notation.md"
    page.write_text(page.read_text() + "\n[the PDF](../scalebook.pdf)\n")
    assert any("notation.md: links to scalebook.pdf" in f for f in se.leftovers(dest))


def test_pdf_prints_the_student_sources_and_records_them(tmp_path, monkeypatch):
    """--pdf: the introduction keeps its link, tools/pdf.py is run on the student
    edition's folder (--root), and the PDF it prints is recorded as the student one;
    the full book's PDF is never copied."""
    dest = (tmp_path / "student").resolve()
    calls = []

    def fake_run(cmd, **kw):
        calls.append([str(c) for c in cmd])
        pdf = dest / "_build" / "pdf" / se.PDF_NAME
        pdf.parent.mkdir(parents=True, exist_ok=True)
        pdf.write_bytes(b"%PDF-1.7 printed from the student sources")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(se.subprocess, "run", fake_run)
    assert se.main(["--out", str(dest), "--no-site", "--pdf"]) == 0
    (cmd,) = calls
    assert cmd[1].endswith("tools/pdf.py") and cmd[2:] == ["--root", str(dest)]
    assert se.PDF_NAME in (dest / "book" / "intro.md").read_text()
    assert (dest / se.PDF_RECORD).is_file() and se.leftovers(dest) == []
    assert se.main(["--out", str(dest), "--no-site"]) == 0    # rebuilt without: no link
    assert se.PDF_NAME not in (dest / "book" / "intro.md").read_text()


def test_the_pdf_tool_writes_under_the_root_it_prints(tmp_path, monkeypatch):
    """tools/pdf.py --root BOOK: the single page is built from BOOK and the PDF lands
    under BOOK/_build (copied next to BOOK's site), never in this checkout's _build."""
    spec = importlib.util.spec_from_file_location("pdf_tool", ROOT / "tools" / "pdf.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    book = tmp_path / "book"
    (book / "_build" / "html").mkdir(parents=True)
    seen = {}

    def fake_build(out, root):
        seen["root"], seen["out"] = root, out
        return out / "_build" / "singlehtml"

    def fake_print(site, pdf, browser):
        pdf.parent.mkdir(parents=True, exist_ok=True)
        pdf.write_bytes(b"%PDF-1.7")
        return {"formulas": 1, "failed": 0, "broken_images": []}

    monkeypatch.setattr(tool, "chromium", lambda: "/usr/bin/chromium")
    monkeypatch.setattr(tool, "build_single_page", fake_build)
    monkeypatch.setattr(tool, "print_pdf", fake_print)
    before = [(f, f.stat().st_mtime_ns) for f in se.full_pdfs(ROOT)]
    assert tool.main(["--root", str(book)]) == 0
    assert seen["root"] == book.resolve()
    assert seen["out"] == book.resolve()           # its _build/ beside BOOK's site
    assert (book / "_build" / "pdf" / se.PDF_NAME).is_file()
    assert (book / "_build" / "html" / se.PDF_NAME).is_file()
    assert [(f, f.stat().st_mtime_ns) for f in se.full_pdfs(ROOT)] == before


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
