"""The API reference's two indexes, made from the package's own docstring.

``scalebook/__init__.py``'s docstring lists the modules ("Modules ...::") and which function
computes each formula or does each task ("Formula or task -> function::"), as plain text
that ``help(scalebook)`` shows in a notebook. The API page (``book/api.md``) shows both as
tables whose names link to their entries::

    ```{scalebook-index} modules
    ```

    ```{scalebook-index} formulas
    ```

A module links to its own page (``book/api/<module>.md``); a function, class, method or
attribute to its entry there. A name that has no entry of its own (a module constant such as
``MIXTRAL_8X7B``) is shown as code. A name that does not resolve stops the build, which runs
with warnings as errors (tests/test_site.py).

Used by _config.yml (``sphinx.local_extensions``); tests/test_api_index.py tests the parsing.
"""

from __future__ import annotations

import importlib
import inspect
import re

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from sphinx import addnodes

MODULES_HEAD = "Modules (chapter that derives them)::"
FORMULAS_HEAD = "Formula or task -> function::"
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _block(doc: str, head: str) -> list[str]:
    """The indented lines of the literal block that follows HEAD in DOC."""
    lines = doc.split(head, 1)[1].splitlines()[1:]
    out = []
    for line in lines:
        if line.strip() and not line.startswith("  "):
            break
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    return [ln for ln in out if ln.strip()]


def modules(doc: str) -> list[tuple[str, str, str]]:
    """(module, what it holds, chapters) for each module of the docstring's list; a line
    indented further continues the one above it."""
    rows: list[list[str]] = []
    for line in _block(doc, MODULES_HEAD):
        m = re.match(r"^  (\w+)\s{2,}(.+)$", line)
        if m:
            rows.append([m.group(1), m.group(2).strip()])
        elif rows:
            rows[-1][1] += " " + line.strip()
    out = []
    for name, text in rows:
        # "(4); sharded decode loop, ... (7)": every parenthesised chapter list
        chapters = re.findall(r"\(([\d, ]+)\)", text)
        what = re.sub(r"\s*\(([\d, ]+)\)", "", text).strip(" ;")
        out.append((name, what, ", ".join(c.strip() for c in chapters)))
    return out


def formulas(doc: str) -> list[tuple[str, str]]:
    """(formula or task, the functions that compute it) for each line of the index: the
    second column starts at the first word that is one of the package's modules followed
    by a dot."""
    names = "|".join(sorted((m for m, _, _ in modules(doc)), key=len, reverse=True))
    split = re.compile(rf"^\s*(.+?)\s+((?:{names})\.\w.*)$")
    out = []
    for line in _block(doc, FORMULAS_HEAD):
        m = split.match(line)
        if not m:
            raise ValueError(f"formula index line without a module.function: {line!r}")
        out.append((m.group(1).strip(), m.group(2).strip()))
    return out


def _exists(path: str):
    """The object at 'scalebook.a.b.c', or None."""
    parts = path.split(".")
    for i in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return None
            obj = getattr(obj, attr)
        return obj
    return None


def _linkable(obj) -> bool:
    """Whether autodoc gives OBJ an entry: a class, function, method or property (module
    constants are not documented on their own)."""
    return (inspect.isclass(obj) or inspect.isroutine(obj) or isinstance(obj, property)
            or inspect.ismodule(obj))


def resolve(functions: str) -> list[tuple[str, str | None]]:
    """Split the index's second column into (text, full dotted name or None) pieces.

    ``mod.name`` is ``scalebook.mod.name``; a name after it belongs to the same owner
    (``training.TrainingPlan.days_at / cost_at``: ``TrainingPlan.cost_at``) or, failing
    that, to the same module (``(Bounds)``: ``roofline.Bounds``; ``TrainingPlan.breakdown``
    after ``training.evaluate_plan``)."""
    pieces: list[tuple[str, str | None]] = []
    module = owner = None
    pos = 0
    for m in NAME.finditer(functions):
        if m.start() > pos:
            pieces.append((functions[pos:m.start()], None))
        word = m.group(0)
        if functions[m.end():m.end() + 1] == "=" or word in ("True", "False", "None"):
            # an argument in a call shown in the index: collective_time(..., sharp=True)
            pieces.append((word, None))
            pos = m.end()
            continue
        full = None
        candidates = [f"scalebook.{word}"] if "." in word else []
        candidates += [f"{base}.{word}" for base in (owner, module) if base]
        for candidate in candidates:
            if _exists(candidate) is not None:
                full = candidate
                break
        if full is not None and "." in word:
            owner = full.rsplit(".", 1)[0]
            module = ".".join(full.split(".")[:2])
        if full is None:
            raise ValueError(f"formula index: {word!r} in {functions!r} is not in the package")
        pieces.append((word, full if _linkable(_exists(full)) else None))
        pos = m.end()
    if pos < len(functions):
        pieces.append((functions[pos:], None))
    return pieces


def _xref(text: str, target: str, reftype: str = "obj") -> nodes.Node:
    ref = addnodes.pending_xref("", refdomain="py", reftype=reftype, reftarget=target,
                                refexplicit=True, refwarn=True)
    ref["py:module"] = None
    ref["py:class"] = None
    ref += nodes.literal(text, text, classes=["xref", "py", f"py-{reftype}"])
    return ref


def _table(header: list[str], rows: list[list[nodes.Node]], classes: list[str]) -> nodes.table:
    table = nodes.table(classes=["scalebook-index"] + classes)
    group = nodes.tgroup(cols=len(header))
    table += group
    for _ in header:
        group += nodes.colspec(colwidth=1)
    head = nodes.thead()
    row = nodes.row()
    for h in header:
        row += nodes.entry("", nodes.paragraph(text=h))
    head += row
    group += head
    body = nodes.tbody()
    for cells in rows:
        row = nodes.row()
        for cell in cells:
            row += nodes.entry("", cell)
        body += row
    group += body
    return table


class ScalebookIndex(Directive):
    """``scalebook-index modules`` or ``scalebook-index formulas``: a table of the package
    docstring's list."""

    required_arguments = 1
    option_spec = {"class": directives.class_option}

    def run(self):
        import scalebook

        kind = self.arguments[0]
        doc = scalebook.__doc__
        if kind == "modules":
            rows = []
            for name, what, chapters in modules(doc):
                link = nodes.paragraph()
                link += _xref(name, f"scalebook.{name}", "mod")
                rows.append([link, nodes.paragraph(text=what), nodes.paragraph(text=chapters)])
            return [_table(["module", "what it holds", "chapter"], rows, ["index-modules"])]
        if kind == "formulas":
            rows = []
            for task, functions in formulas(doc):
                cell = nodes.paragraph()
                for text, target in resolve(functions):
                    if target is None:
                        cell += (nodes.literal(text, text) if NAME.fullmatch(text)
                                 else nodes.Text(text))
                    else:
                        cell += _xref(text, target)
                rows.append([nodes.paragraph(text=task), cell])
            return [_table(["formula or task", "function"], rows, ["index-formulas"])]
        raise self.error(f"scalebook-index: 'modules' or 'formulas', not {kind!r}")


def setup(app):
    app.add_directive("scalebook-index", ScalebookIndex)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
