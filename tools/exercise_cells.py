"""Exercise and solution cells: plain Markdown in the notebooks, exercise boxes on the site.

In a notebook (Colab, Jupyter, GitHub) an exercise is an ordinary Markdown cell whose first
line is a heading, so every CommonMark renderer shows its id, title and maths::

    ### Exercise 5.3 · The FSDP all-gather of one layer

    The statement, with $maths$ ...

and a solution, in the solutions notebook, is a cell that starts ``### Solution 5.3``.

On the website this Sphinx extension rewrites such cells, as the notebook is read, into
sphinx-exercise's directives (labels ``ex-5-3`` and ``sol-5-3``), so the site shows a styled,
labelled exercise box and each solution links back to its exercise. Nothing else changes:
the heading line becomes the directive's title, the rest of the cell its body.

Two fixes to what sphinx-exercise renders, made as each page is written:

* the title reads "Exercise 5.3 · The FSDP all-gather of one layer", not sphinx-exercise's
  "Exercise (5.3 · ...)" (it puts an exercise's title in brackets after its kind), and a
  solution's "Solution to Exercise 5.3 · ...";
* an exercise whose solution is in the book ends with a link to it ("Worked solution");
  the student edition, which has no solutions, has no such links.

Used by _config.yml (``sphinx.local_extensions``) and by the tests, which render the
notebooks' Markdown with a CommonMark renderer and the site's HTML.
"""

from __future__ import annotations

import json
import re

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms.post_transforms import SphinxPostTransform

EXERCISE_HEADING = re.compile(r"^#{2,4} Exercise (\d+)\.(\d+) · (.+?)\s*$")
SOLUTION_HEADING = re.compile(r"^#{2,4} Solution (\d+)\.(\d+)(?: · (.+?))?\s*$")


def exercise_label(chapter: int | str, number: int | str) -> str:
    return f"ex-{int(chapter)}-{int(number)}"


def solution_label(chapter: int | str, number: int | str) -> str:
    return f"sol-{int(chapter)}-{int(number)}"


def _fence(body: str) -> str:
    """A colon fence longer than any colon run in the body, so the body may hold fences."""
    runs = [len(m) for m in re.findall(r"^:{3,}", body, re.M)]
    return ":" * max([3] + [r + 1 for r in runs])


def parse(markdown: str):
    """("exercise" | "solution", chapter, number, title, body) for such a cell, else None."""
    first, _, body = markdown.lstrip("\n").partition("\n")
    m = EXERCISE_HEADING.match(first)
    if m:
        return "exercise", int(m.group(1)), int(m.group(2)), m.group(3), body.strip("\n")
    m = SOLUTION_HEADING.match(first)
    if m:
        return "solution", int(m.group(1)), int(m.group(2)), m.group(3) or "", body.strip("\n")
    return None


def to_directive(markdown: str) -> str | None:
    """The site's MyST for an exercise or solution cell; None for any other cell."""
    found = parse(markdown)
    if found is None:
        return None
    kind, chapter, number, title, body = found
    fence = _fence(body)
    if kind == "exercise":
        head = (f"{fence}{{exercise}} {chapter}.{number} · {title}\n"
                f":label: {exercise_label(chapter, number)}\n:nonumber:\n")
    else:
        head = (f"{fence}{{solution}} {exercise_label(chapter, number)}\n"
                f":label: {solution_label(chapter, number)}\n")
    return f"{head}\n{body}\n{fence}\n"


def transform_notebook_json(text: str) -> str:
    """Rewrite the exercise and solution cells of a notebook given as JSON text."""
    nb = json.loads(text)
    changed = False
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        new = to_directive(src)
        if new is not None:
            cell["source"] = new
            changed = True
    return json.dumps(nb, ensure_ascii=False) if changed else text


def _source_read(app, docname, source):
    path = app.env.doc2path(docname)
    if str(path).endswith(".ipynb"):
        source[0] = transform_notebook_json(source[0])


def _unbracket(title: nodes.Element) -> None:
    """Drop the brackets sphinx-exercise puts round an exercise's title: the text node
    " (" before it becomes " " and the ")" after it goes (in TITLE, or in the link to the
    exercise that a solution's title holds)."""
    for holder in [title] + list(title.findall(nodes.reference)):
        texts = [c for c in holder.children if isinstance(c, nodes.Text)]
        opening = [c for c in texts if str(c) == " ("]
        if opening and texts and str(texts[-1]) == ")":
            holder.replace(opening[0], nodes.Text(" "))
            holder.remove(texts[-1])


class ExerciseTitles(SphinxPostTransform):
    """After sphinx-exercise has built the titles (its post-transforms run at 20 to 22)."""

    default_priority = 30

    def run(self):
        from sphinx_exercise.nodes import exercise_enumerable_node, exercise_node, solution_node

        for node in self.document.findall(
                lambda n: isinstance(n, (exercise_node, exercise_enumerable_node, solution_node))):
            if node.children and isinstance(node.children[0], nodes.title):
                _unbracket(node.children[0])


class SolutionLinks(SphinxPostTransform):
    """Each exercise ex-N-M whose solution sol-N-M is in the book gets a last line that
    links to it; a pending reference, so that Sphinx's resolver (priority 10) makes the link
    right for every builder (a relative URL on the site, an anchor in the single page)."""

    default_priority = 5

    def run(self):
        from sphinx_exercise.nodes import exercise_enumerable_node, exercise_node

        labels = self.env.get_domain("std").labels
        for node in self.document.findall(
                lambda n: isinstance(n, (exercise_node, exercise_enumerable_node))):
            m = re.fullmatch(r"ex-(\d+)-(\d+)", node.get("label", ""))
            if not m:
                continue
            target = solution_label(*m.groups())
            if target not in labels:
                continue
            ref = addnodes.pending_xref("", refdomain="std", reftype="ref", reftarget=target,
                                        refexplicit=True, refwarn=True,
                                        refdoc=self.env.docname)
            ref += nodes.inline("", "Worked solution", classes=["xref", "std", "std-ref"])
            para = nodes.paragraph("", "", classes=["exercise-solution-link"])
            para += ref
            (node.children[1] if len(node.children) > 1 else node).append(para)


def setup(app):
    app.connect("source-read", _source_read)
    app.add_post_transform(ExerciseTitles)
    app.add_post_transform(SolutionLinks)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
