"""Exercise and solution cells read well in Colab/Jupyter (CommonMark) and on the site
(sphinx-exercise boxes, made by tools/exercise_cells.py as the site reads a notebook)."""

import json
import re
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import exercise_cells  # noqa: E402

IPYNBS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
SITE_MARKUP = re.compile(r"\{(exercise|solution|admonition|note|figure)\}|^:label:|^:nonumber:|^:::", re.M)


def _markdown_cells(path):
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            yield "".join(cell["source"])


@pytest.mark.parametrize("path", IPYNBS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_markdown_cell_renders_through_commonmark_without_site_markup(path):
    """What Colab and nbconvert do: render each cell as CommonMark. No directive, no
    ':label:' and no colon fence may reach the reader; exercise cells show id and title."""
    md = MarkdownIt("commonmark")
    headings = 0
    for text in _markdown_cells(path):
        html = md.render(text)
        assert not SITE_MARKUP.search(text), text[:200]
        assert "{exercise}" not in html and ":label:" not in html
        parsed = exercise_cells.parse(text)
        if parsed:
            kind, ch, num, title, body = parsed
            heading = f"<h3>{kind.capitalize()} {ch}.{num}" + (f" · {title}" if title else "")
            assert html.startswith(heading), html[:120]
            assert body.strip(), "an exercise or solution cell has a body"
            headings += 1
    assert headings > 0, "each chapter and solutions notebook has exercise or solution cells"


def test_maths_in_a_statement_stays_maths_for_the_notebook_renderer():
    """Jupyter's renderer typesets $...$ itself; CommonMark must leave it intact (not emphasis)."""
    text = "### Exercise 9.1 · T\n\nCompute $a_{ij} * b_{jk}$ and $$\\sum_i x_i$$."
    html = MarkdownIt("commonmark").render(text)
    assert "$a_{ij} * b_{jk}$" in html and "$$\\sum_i x_i$$" in html


def test_to_directive_for_exercise_and_solution():
    ex = exercise_cells.to_directive("### Exercise 5.12 · A title\n\nBody $x$.\n")
    assert ex == ":::{exercise} 5.12 · A title\n:label: ex-5-12\n:nonumber:\n\nBody $x$.\n:::\n"
    sol = exercise_cells.to_directive("### Solution 5.12\n\nWork.")
    assert sol == ":::{solution} ex-5-12\n:label: sol-5-12\n\nWork.\n:::\n"
    assert exercise_cells.to_directive("## 5.1 Not an exercise\n\ntext") is None
    assert exercise_cells.to_directive("### Exercises\n\nintro") is None


def test_a_body_with_colon_fences_gets_a_longer_fence():
    out = exercise_cells.to_directive("### Exercise 1.1 · T\n\n:::{note}\ninner\n:::\n")
    assert out.startswith("::::{exercise}") and out.endswith("\n::::\n")


def test_notebook_json_is_rewritten_only_where_there_are_exercise_cells():
    nb = {"cells": [{"cell_type": "markdown", "source": ["### Exercise 2.3 · T\n", "\n", "Body"]},
                    {"cell_type": "code", "source": "### Exercise 2.4 · not markdown"}]}
    out = json.loads(exercise_cells.transform_notebook_json(json.dumps(nb)))
    assert out["cells"][0]["source"].startswith(":::{exercise} 2.3 · T")
    assert out["cells"][1]["source"] == "### Exercise 2.4 · not markdown"
    plain = json.dumps({"cells": [{"cell_type": "markdown", "source": "hello"}]})
    assert exercise_cells.transform_notebook_json(plain) == plain


HEADING = re.compile(r"^#{2,4} (Exercise|Solution) \d+\.\d+", re.M)


@pytest.mark.parametrize("path", IPYNBS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_exercise_and_solution_heading_starts_its_own_cell(path):
    """A heading in the middle of a cell (a missing ``+++`` in the MyST source) is not turned
    into a box on the site, and the previous solution swallows the next one."""
    for text in _markdown_cells(path):
        for m in HEADING.finditer(text):
            assert text[:m.start()].strip() == "", (
                f"{m.group(0)!r} is not at the start of its cell: put +++ before it in the .md")
