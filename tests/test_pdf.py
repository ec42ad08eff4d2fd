"""The whole book as one PDF (tools/pdf.py): built offline, maths typeset, every image loaded."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_book_prints_to_one_pdf_with_its_maths_and_figures(tmp_path):
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.fail("Chromium is not installed: the PDF cannot be printed "
                    "(apt-get install chromium; .ci/run installs it)")
    pdf = tmp_path / "book.pdf"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "pdf.py"), "--out", str(pdf),
                        "--build-dir", str(tmp_path / "single"), "--no-copy"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-")
    pages = len(re.findall(rb"/Type\s*/Page[^s]", data))
    # Every chapter, solutions notebook and page starts a sheet of its own (book.css).
    documents = len(re.findall(r"^\s+- file:", (ROOT / "_toc.yml").read_text(), re.M)) + 1
    assert pages > 3 * documents, pages
    formulas = int(re.search(r"(\d+) formulas", r.stdout).group(1))
    # The chapters hold several hundred formulas; a page whose maths was not typeset has 0.
    assert formulas > 300, r.stdout
    single = (tmp_path / "single" / "_build" / "singlehtml" / "book" / "intro.html").read_text()
    assert "tex-chtml.js" in single and "cdn" not in re.findall(r'<script[^>]*mathjax[^>]*>',
                                                                  single)[0].lower()
