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
        # the badge is the site's own image (it shows offline); the link still opens Colab
        assert 'src="../_static/colab-badge.svg"' in html, f"{page.name}: badge not local"
    assert (site / "_static" / "colab-badge.svg").is_file()


def test_no_page_loads_an_image_from_the_network(site):
    for page in site.rglob("*.html"):
        srcs = re.findall(r'<img[^>]*\ssrc="(https?:[^"]+)"', page.read_text())
        assert not srcs, f"{page.relative_to(site)}: images from the network: {srcs[:3]}"


def test_figures_are_rendered(site):
    html = (site / "notebooks" / "01_rooflines.html").read_text()
    assert html.count("<img") >= 2


def test_hardware_table_is_generated(site):
    html = (site / "book" / "hardware.html").read_text()
    from scalebook.hardware import all_chips
    for chip in all_chips():
        assert chip.name in html


def test_the_chapters_results_are_html_tables_and_the_set_up_cell_is_folded(site):
    """A scalebook.tables.Table output becomes an HTML table in the page (myst-nb reads its
    text/markdown as MyST), with the heading cells the chapter's code gives; the set-up cell
    sits whole behind one toggle (tools/site_fixes.py), its output inside it."""
    for page, headings in [("06_training", ["sharding", "days", "at 40%"]),
                           ("08_serving", ["tok/s/chip", "cheapest end to end"]),
                           ("01_rooflines", ["I* (FLOPs/byte)"])]:
        html = (site / "notebooks" / f"{page}.html").read_text()
        tables = re.findall(r'<div class="cell_output[^"]*">.*?</table>', html, re.S)
        heads = " ".join(re.findall(r"<th[^>]*>(?:<p>)?(.*?)(?:</p>)?</th>", " ".join(tables)))
        for h in headings:
            assert h in heads, f"{page}: no table heading {h!r} in a cell's output"
        # the set-up cell: from its tag to the next cell ("cell_input"/"cell_output" are its own)
        setup = re.split(r'<div class="cell[ "]', html.split("tag_setup", 1)[1], maxsplit=1)[0]
        assert "<details" in setup
        folded = setup.split("<details", 1)[1].split("</details>", 1)[0]
        assert "cell_input" in folded and "simulated CPU devices" in folded


def test_every_solution_links_to_its_exercise(site):
    for page in sorted((site / "solutions").glob("*.html")):
        html = page.read_text()
        labels = re.findall(r'id="sol-(\d+-\d+)"', html)
        assert labels, page.name
        for label in labels:
            assert f'href="../notebooks/{page.stem}.html#ex-{label}"' in html, f"sol-{label} has no link"
    chapter = (site / "notebooks" / "01_rooflines.html").read_text()
    assert 'id="ex-1-1"' in chapter and 'id="ex-1-10"' in chapter


def test_every_exercise_links_to_its_own_solution(site):
    for page in sorted((site / "notebooks").glob("*.html")):
        html = page.read_text()
        exercises = re.findall(r'id="ex-(\d+-\d+)"', html)
        assert exercises, page.name
        solutions = (site / "solutions" / page.name).read_text()
        for label in exercises:
            if f'id="sol-{label}"' in solutions:
                assert f'href="../solutions/{page.stem}.html#sol-{label}"' in html, \
                    f"{page.name}: ex-{label} does not link to its solution"


def test_exercise_titles_read_without_brackets(site):
    html = (site / "notebooks" / "01_rooflines.html").read_text()
    assert '<p class="admonition-title">Exercise 1.1 · ' in html
    assert "Exercise (" not in html
    sol = (site / "solutions" / "01_rooflines.html").read_text()
    assert "> Exercise 1.1 · " in sol and "Exercise (" not in sol


def test_the_api_reference_is_one_page_per_module_with_linked_index_tables(site):
    from scalebook import __path__ as package_path
    import pkgutil

    index = (site / "book" / "api.html").read_text()
    for m in pkgutil.iter_modules(package_path):
        assert (site / "book" / "api" / f"{m.name}.html").is_file(), m.name
        assert f'href="api/{m.name}.html#module-scalebook.{m.name}"' in index, m.name
    formulas = index.split('id="formula-or-task-function"', 1)[1]
    assert formulas.count("<tr") > 60 and '<pre' not in formulas
    assert 'href="api/roofline.html#scalebook.roofline.time_bounds"' in formulas
    # the introduction says it once
    assert index.split("<article", 1)[1].count("lives in exactly one function or table here") == 1


def test_meta_tags_sitemap_and_no_page_sources(site):
    html = (site / "notebooks" / "05_parallelism.html").read_text()
    assert re.search(r'<meta name="description" content="[^"]{60,}"', html)
    assert '<meta property="og:title" content="5. Parallelism for training"' in html
    sitemap = (site / "sitemap.xml").read_text()
    assert "/notebooks/05_parallelism.html</loc>" in sitemap and "search.html" not in sitemap
    assert "Sitemap: " in (site / "robots.txt").read_text()
    # html_show_sourcelink is off, so the pages' sources are not shipped either
    assert not (site / "_sources").exists()


def test_the_introduction_no_longer_says_chapters_are_missing(site):
    html = (site / "book" / "intro.html").read_text()
    assert "in preparation" not in html
    assert "repository.url" in html   # where to set the repository when publishing
