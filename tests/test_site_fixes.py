"""tools/site_fixes.py: the figure description read back from a PNG without PIL."""

import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import site_fixes  # noqa: E402


def test_the_description_matplotlib_stores_is_read_back(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    text = "Rooflines of a TPU v5e: FLOP/s against FLOPs per byte (µs, ×2)."
    fig.savefig(tmp_path / "a.png", metadata={"Description": text})
    fig.savefig(tmp_path / "b.png")
    plt.close(fig)
    assert site_fixes.png_description(tmp_path / "a.png") == text
    assert site_fixes.png_description(tmp_path / "b.png") is None
    (tmp_path / "c.png").write_bytes(b"not a png")
    assert site_fixes.png_description(tmp_path / "c.png") is None
    assert site_fixes.png_description(tmp_path / "missing.png") is None


def test_the_colab_badge_is_the_sites_own_copy():
    html = ('<a href="https://colab.research.google.com/github/o/r/blob/main/n.ipynb">'
            f'<img alt="Open In Colab" src="{site_fixes.COLAB_BADGE}" /></a>')
    assert f'src="../{site_fixes.LOCAL_BADGE}"' in site_fixes.local_badge(html, 1)
    assert f'src="{site_fixes.LOCAL_BADGE}"' in site_fixes.local_badge(html, 0)
    assert "colab.research.google.com/github/" in site_fixes.local_badge(html, 1)  # the link
    assert (ROOT / "tools" / "site_static" / "colab-badge.svg").read_text().startswith("<svg")


def test_the_site_address_comes_from_baseurl_or_the_repository():
    from types import SimpleNamespace as NS

    repo = {"repository_url": "https://github.com/My-Course/llm-book"}
    assert site_fixes.site_url(NS(html_baseurl="", html_theme_options=repo)) == \
        "https://my-course.github.io/llm-book/"
    assert site_fixes.site_url(NS(html_baseurl="https://x.org/book", html_theme_options=repo)) \
        == "https://x.org/book/"
    assert site_fixes.site_url(NS(html_baseurl="", html_theme_options={})) == ""


def test_the_sitemap_lists_the_pages_and_nothing_else(tmp_path):
    for name in ("index.html", "book/intro.html", "notebooks/01_a.html", "search.html",
                 "genindex.html", "_static/x.html"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("<html></html>")
    (tmp_path / "index.html").write_text('<meta http-equiv="Refresh" content="0; url=book/intro.html" />')
    xml = site_fixes.sitemap(tmp_path, "https://o.github.io/r/")
    locs = re.findall(r"<loc>(.*?)</loc>", xml)
    assert locs == ["https://o.github.io/r/book/intro.html", "https://o.github.io/r/notebooks/01_a.html"]


def test_a_pages_description_is_its_first_paragraph_outside_cells():
    from docutils import nodes
    from docutils.utils import new_document
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser

    doc = new_document("x", get_default_settings(Parser))
    cell = nodes.container(classes=["cell"])
    cell += nodes.paragraph(text="JAX 0.12 with 8 simulated CPU devices and some more words here")
    doc += nodes.paragraph(text="Short.")
    doc += cell
    doc += nodes.paragraph(text="You are about to run a matrix multiplication on an accelerator. " * 5)
    desc = site_fixes.description(doc)
    assert desc.startswith("You are about") and len(desc) <= 201 and desc.endswith("…")
    tags = site_fixes.meta_tags('A "title"', desc, "Book", "https://o.github.io/r/p.html")
    assert '<meta name="description" content="You are about' in tags
    assert 'og:title" content="A &quot;title&quot;"' in tags and "og:url" in tags


def test_figures_are_numbered_by_chapter():
    """Sphinx numbers figures through the whole book (the toctree is not numbered);
    chapter documents get (chapter, k) in their own order, other pages keep theirs."""
    sphinx = {"book/intro": {"figure": {"a": (1,)}},
              "notebooks/05_parallelism": {"figure": {"late": (17,), "early": (15,),
                                                      "mid": (16,)}},
              "solutions/11_gpus": {"figure": {"s": (40,)}, "table": {"t": (3,)}}}
    out = site_fixes.chapter_numbers(sphinx)
    assert out["notebooks/05_parallelism"]["figure"] == {"early": (5, 1), "mid": (5, 2),
                                                         "late": (5, 3)}
    assert out["solutions/11_gpus"] == {"figure": {"s": (11, 1)}, "table": {"t": (11, 1)}}
    assert out["book/intro"] == sphinx["book/intro"]


def test_the_set_up_cell_folds_away_whole_on_the_site():
    """The site reads the set-up cell as hide-cell (code and output behind one toggle); the
    other cells and a notebook without a set-up cell are left as they are."""
    import json

    nb = json.loads((ROOT / "notebooks" / "01_rooflines.ipynb").read_text())
    before = [c.get("metadata", {}).get("tags", []) for c in nb["cells"]]
    after = [c.get("metadata", {}).get("tags", []) for c in
             json.loads(site_fixes.fold_setup_cell(json.dumps(nb)))["cells"]]
    setup = next(i for i, t in enumerate(before) if "setup" in t)
    assert "hide-input" in before[setup] and after[setup] == ["setup", "hide-cell"]
    assert [t for i, t in enumerate(after) if i != setup] == \
        [t for i, t in enumerate(before) if i != setup]
    plain = json.dumps({"cells": [{"cell_type": "code", "metadata": {"tags": ["hide-input"]}}]})
    assert site_fixes.fold_setup_cell(plain) == plain


def test_nodes_made_in_a_nested_document_are_rehomed_before_pickling():
    """MyST's eval-rst blocks (the API pages' autodoc) make nodes whose document is a nested
    one carrying the build environment in its settings: pickled with the page, that copied
    the whole environment into each API page's doctree (6 MB each). After doctree-read every
    node belongs to the page's own document, and the pickle holds none of the nested one."""
    import pickle

    from docutils import nodes
    from docutils.frontend import get_default_settings
    from docutils.parsers.rst import Parser
    from docutils.utils import new_document

    settings = get_default_settings(Parser)
    page = new_document("page.md", settings)
    nested_settings = get_default_settings(Parser)
    nested_settings.env = {"every page's data": "x" * 1_000_000}   # the environment
    nested = new_document("page.md", nested_settings)
    para = nodes.paragraph("", "")
    para += nodes.Text("an API entry")
    page += para
    para.document = nested            # as the eval-rst block leaves it
    before = len(pickle.dumps(page))
    site_fixes._one_document(None, page)
    after = len(pickle.dumps(page))
    assert before > 1_000_000 > 10_000 > after
    assert all(n.document is page for n in page.findall())
