"""The website builds with warnings as errors, and the built pages have what readers need."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The slowest tests of the suite (python3 tasks.py test -m "not slow" leaves them out);
# they may take longer than pyproject's default per-test limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

@pytest.fixture(scope="module")
def site(built_site):
    html, r = built_site   # built once per run, shared with test_browser.py (conftest.py)
    assert r["returncode"] == 0, r["stdout"] + r["stderr"]
    assert "warning" not in r["stderr"].lower(), r["stderr"]
    return html


def test_pages_exist(site):
    for page in ["index.html", "book/intro.html", "book/notation.html", "book/hardware.html",
                 "book/references.html"]:
        assert (site / page).exists(), page
    chapters = sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb"))
    for stem in chapters:
        assert (site / "notebooks" / f"{stem}.html").exists()
        assert (site / "solutions" / f"{stem}.html").exists()


def test_chapter_pages_have_a_colab_launch_button_and_badge(site):
    for page in sorted((site / "notebooks").glob("*.html")):
        html = page.read_text()
        target = f"https://colab.research.google.com/github/scalebook-authors/scalebook/blob/main/notebooks/{page.stem}.ipynb"
        assert re.search(r'href="' + re.escape(target) + r'"[^>]*class="[^"]*btn', html) or \
            re.search(r'class="[^"]*btn[^"]*"[^>]*href="' + re.escape(target), html) or \
            html.count(target) >= 2, f"{page.name}: no Colab launch button"
        assert "colab-badge.svg" in html


def test_figures_are_rendered(site):
    html = (site / "notebooks" / "01_rooflines.html").read_text()
    assert html.count("<img") >= 2


def test_hardware_table_is_generated(site):
    html = (site / "book" / "hardware.html").read_text()
    from scalebook.hardware import all_chips
    for chip in all_chips():
        assert chip.name in html


def test_every_solution_links_to_its_exercise(site):
    for page in sorted((site / "solutions").glob("*.html")):
        html = page.read_text()
        labels = re.findall(r'id="sol-(\d+-\d+)"', html)
        assert labels, page.name
        for label in labels:
            assert f'href="../notebooks/{page.stem}.html#ex-{label}"' in html, f"sol-{label} has no link"
    chapter = (site / "notebooks" / "01_rooflines.html").read_text()
    assert 'id="ex-1-1"' in chapter and 'id="ex-1-10"' in chapter
