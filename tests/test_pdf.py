"""The whole book as one PDF (tools/pdf.py): built offline, maths typeset, every image loaded,
nothing cut at the margin, an outline of the book's pages and sections, page numbers in the
contents, no blank page."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import pdf as pdftool  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def printed(tmp_path_factory, built_site):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.fail("Chromium is not installed: the PDF cannot be printed "
                    "(apt-get install chromium; .ci/run installs it)")
    tmp = tmp_path_factory.mktemp("pdf")
    pdf, report = tmp / "book.pdf", tmp / "report.json"
    # built where the test site was (conftest.py's built_site), as tasks.py build does: the
    # single page reuses the site's parsed pages (_build/.doctrees) and is only written
    site_root = built_site[0].parents[1]
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "pdf.py"), "--out", str(pdf),
                        "--build-dir", str(site_root), "--no-copy", "--report", str(report)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return site_root, pdf, json.loads(report.read_text()), r.stdout


def _toc_titles() -> list[str]:
    """The title of every page in _toc.yml's order (the root first), from the sources."""
    files = ["book/intro"] + re.findall(r"^\s+- file:\s*(\S+)", (ROOT / "_toc.yml").read_text(), re.M)
    titles = []
    for f in files:
        text = (ROOT / f"{f}.md").read_text()
        titles.append(re.search(r"^# (.+)$", text, re.M).group(1).replace("`", ""))
    return titles


@pytest.mark.slow
def test_the_book_prints_to_one_pdf_with_its_maths_and_figures(printed):
    tmp, pdf, report, stdout = printed
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-")
    pages = len(re.findall(rb"/Type\s*/Page[^s]", data))
    # Every chapter, solutions notebook and page starts a sheet of its own (book.css).
    documents = len(re.findall(r"^\s+- file:", (ROOT / "_toc.yml").read_text(), re.M)) + 1
    assert pages > 3 * documents, pages
    # The chapters hold several hundred formulas; a page whose maths was not typeset has 0.
    assert report["formulas"] > 300 and report["failed"] == 0, stdout
    assert report["broken_images"] == []          # the Colab badge included: it is local
    single = (tmp / "_build" / "singlehtml" / "book" / "intro.html").read_text()
    assert "tex-chtml.js" in single and "cdn" not in re.findall(r'<script[^>]*mathjax[^>]*>',
                                                                  single)[0].lower()


@pytest.mark.slow
def test_nothing_printed_is_cut_at_the_margin(printed):
    """In the print layout every code block, output, table and display equation fits its
    column (tools/pdf.py shrinks or wraps the wide ones, then measures again), and the longest
    printed lines come out whole in the PDF's text."""
    from pypdf import PdfReader

    tmp, pdf, report, _ = printed
    assert report["wide"] == [], report["wide"][:10]
    assert report["empty"] == [], report["empty"][:10]
    assert report["shrunk"] > 0 and report["pre"] > 500
    text = " ".join(p.extract_text() for p in PdfReader(pdf).pages)
    text = re.sub(r"\s+", " ", text)
    # chapter 6's plans table: its last two columns were past the margin before
    assert re.search(r"model chips sharding remat memory bound MFU bound days at 40%", text)


@pytest.mark.slow
def test_the_outline_is_the_books_pages_and_their_sections(printed):
    from pypdf import PdfReader

    tmp, pdf, report, _ = printed
    reader = PdfReader(pdf)
    top, children = [], {}
    last = None
    for item in reader.outline:
        if isinstance(item, list):
            children[last] = [c.title for c in item if not isinstance(c, list)]
        else:
            last = item.title
            top.append((item.title, reader.get_destination_page_number(item) + 1))
    titles = [t for t, _ in top]
    expected = _toc_titles()
    expected[0] = "Introduction"
    # top level: every page of the table of contents but the API's module pages, which sit
    # under the API page
    assert titles == [t for t in expected if not t.startswith("scalebook.")], titles
    assert [c for c in children["The scalebook package"] if c.startswith("scalebook.")] == \
        [t for t in expected if t.startswith("scalebook.")]
    # second level: a chapter's numbered sections, its summary and exercises
    first = children["1. Rooflines: how long will this take?"]
    assert first[0].startswith("1.1 ") and "Summary" in first and "Exercises" in first
    # the pages go forward, and the contents print the page each entry's outline item goes to
    pages = [p for _, p in top]
    assert pages == sorted(pages) and pages[0] > 1
    where = {}

    def walk(items):
        for item in items:
            if isinstance(item, list):
                walk(item)
            else:
                where.setdefault(item.title, reader.get_destination_page_number(item) + 1)

    walk(reader.outline)
    title_of = {o["id"]: o["title"] for o in report["outline"]}
    assert len(report["toc"]) >= len(top) - 1
    for anchor, number in zip(report["toc"], report["toc_numbers"]):
        assert where[title_of[anchor]] == number, (title_of[anchor], number)
    # each heading is printed on the page its outline item goes to (its first characters, as
    # pypdf reads them: ligatures undone)
    def norm(s):
        for lig, plain in (("\ufb00", "ff"), ("\ufb01", "fi"), ("\ufb02", "fl"), ("\ufb03", "ffi")):
            s = s.replace(lig, plain)
        return re.sub(r"\s+", " ", s)

    texts = {}
    wrong = []
    for item in [i for i in reader.outline if not isinstance(i, list)] + \
            [c for i in reader.outline if isinstance(i, list) for c in i if not isinstance(c, list)]:
        page = reader.get_destination_page_number(item)
        if page not in texts:
            texts[page] = norm(reader.pages[page].extract_text())
        if norm(item.title)[:12] not in texts[page]:
            wrong.append((item.title, page + 1))
    assert not wrong, wrong[:10]
    # ... and the contents' pages show those numbers (laid over them after the first print)
    shown = " ".join(reader.pages[i].extract_text() for i in range(report["toc_pages"]))
    shown = shown.replace("\ufb01", "fi").replace("\ufb02", "fl")
    assert "1. Rooflines: how long will this take?" in shown
    assert set(map(str, report["toc_numbers"])) <= set(shown.split()), shown[-400:]


@pytest.mark.slow
def test_no_page_is_blank(printed):
    tmp, pdf, report, _ = printed
    assert pdftool.blank_pages(pdf.read_bytes()) == []


@pytest.mark.slow
def test_no_code_frame_is_left_empty(printed):
    """A code block that moves on to the next page whole leaves its grey frame behind, empty
    (two pages of the PDF had one): tools/pdf.py lets a block taller than a page break and
    checks every page's frames for text."""
    tmp, pdf, report, _ = printed
    assert pdftool.empty_frames(pdf.read_bytes()) == []


def test_the_frame_check_reads_chromiums_drawing():
    """The content stream as Chromium writes it: a grey rounded frame drawn as a path under
    nested transforms, text placed with Tm inside it (or not)."""
    frame = (b".24 0 0 -.24 0 842.88 cm\nq\n2.5 0 0 2.5 162.5 -500 cm\n.9686 .9686 .9686 rg\n"
             b"65 300 m\n800 300 l\n800 400 l\n805 405 810 410 815 415 c\n65 400 l\nh\nf\nQ\n")
    text = b"q\n2.5 0 0 2.5 162.5 -500 cm\nBT\n/F4 16 Tf\n1 0 0 -1 100 350 Tm\n<0013> Tj\nET\nQ\n"
    outside = text.replace(b"100 350 Tm", b"100 900 Tm")
    frames, marks = pdftool._frames_and_marks(frame + text)
    assert len(frames) == 1 and len(marks) == 1
    x0, y0, x1, y1 = frames[0]
    assert x0 <= marks[0][0] <= x1 and y0 <= marks[0][1] <= y1
    frames, marks = pdftool._frames_and_marks(frame + outside)
    assert not (frames[0][1] <= marks[0][1] <= frames[0][3])
    # a white page background and a narrow grey box are not frames
    assert pdftool._frames_and_marks(b"1 1 1 rg\n0 0 863 1255 re\nf\n.96 .96 .96 rg\n0 0 50 10 re\nf\n")[0] == []
