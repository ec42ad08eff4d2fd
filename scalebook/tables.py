"""Tables of results: a real table in Jupyter, Colab and the book's site, aligned text elsewhere.

A :class:`Table` holds headings and rows of cells that the caller has already formatted
(``sci(x)``, ``fmt_time(t)``, ...), so the numbers are the same in every form. It shows
itself in two forms:

* ``text/markdown`` (``_repr_markdown_``): a Markdown pipe table, which Jupyter, Colab and
  GitHub render as a table, and which the site (myst-nb, ``nb_render_markdown_format: myst``)
  turns into an HTML table that wraps on a phone and prints in the PDF;
* ``text/plain`` (``str(t)``, ``print(t)``, a script, a terminal): the same cells in aligned
  columns, at most :data:`MAX_WIDTH` characters wide where the columns allow it.

In a notebook, a table that is a cell's last expression is shown; elsewhere in a cell use
``t.show()`` (IPython's ``display`` in a kernel, ``print`` otherwise)::

    t = Table(["chip", "bf16 FLOP/s"], title="Peak rates")
    for chip in hardware.all_chips():
        t.add(chip.name, sci(chip.bf16_flops))
    t.show()
"""

from __future__ import annotations

import re
import textwrap

__all__ = ["Table", "MAX_WIDTH"]

#: The widest plain-text line the book prints (tests/test_width.py).
MAX_WIDTH = 100

_ALIGNS = {"l": "left", "r": "right", "c": "centre"}
# A cell that reads as a number (with a unit or a sign after it), or a dash for "none":
# such columns are right-aligned unless the caller says otherwise.
_NUMERIC = re.compile(r"^[-+~$x]?\d[\d,.]*(e[-+]?\d+)?%?(\s?\S+)?$|^[-–—]$")
# A number and its unit: "14.2 ms", "23.5 GB", "1.2e12 bytes/s".
_WITH_UNIT = re.compile(r"^[-+~$]?\d[\d,.]*(e[-+]?\d+)? \S+$")
# Characters that mean something in a Markdown table or in MyST's inline syntax
# ($ opens maths on the site, * and _ emphasis, ` code, < an HTML tag).
_MARKDOWN_SPECIAL = re.compile(r"([\\|$*_`<\[\]])")


def _cell(value) -> str:
    if value is None:
        return ""
    text = str(value)
    if "\n" in text:
        raise ValueError(f"a table cell is one line; got {text!r}")
    return text


def _escape(text: str) -> str:
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


class Table:
    """Headings, rows of text cells, an optional title and caption, and column alignment.

    ``align`` is one letter per column (``"lrr"``: left, right, right; ``c`` centres) or
    None, which right-aligns the columns whose every cell reads as a number (``2.75e14``,
    ``23.5 GB``, ``73%``, ``-``) and left-aligns the rest. Cells may be strings or anything
    ``str()`` formats; ``None`` is an empty cell.
    """

    def __init__(self, headers, rows=(), *, title: str | None = None,
                 caption: str | None = None, align: str | None = None):
        self.headers = [_cell(h) for h in headers]
        if not self.headers:
            raise ValueError("a table needs at least one column heading")
        if align is not None:
            if len(align) != len(self.headers) or any(a not in _ALIGNS for a in align):
                raise ValueError(f"align must be one of l, r, c per column ({len(self.headers)} "
                                 f"columns: {self.headers}); got {align!r}")
        self._align = align
        self.title = title
        self.caption = caption
        self.rows: list[list[str]] = []
        for row in rows:
            self.add(*row)

    def add(self, *cells) -> "Table":
        """Append one row (one cell per column); returns the table, so calls can chain."""
        if len(cells) != len(self.headers):
            raise ValueError(f"a row of this table has {len(self.headers)} cells "
                             f"({', '.join(self.headers)}); got {len(cells)}: {cells!r}")
        self.rows.append([_cell(c) for c in cells])
        return self

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def align(self) -> str:
        """One letter per column: ``l``, ``r`` or ``c`` (see the class's docstring)."""
        if self._align is not None:
            return self._align
        out = []
        for j in range(len(self.headers)):
            cells = [r[j] for r in self.rows if r[j]]
            out.append("r" if cells and all(_NUMERIC.match(c) for c in cells) else "l")
        return "".join(out)

    # -- plain text -----------------------------------------------------------------------
    def to_text(self) -> str:
        """The aligned plain-text table (title above, caption below)."""
        align = self.align
        widths = [max(len(r[j]) for r in [self.headers] + self.rows)
                  for j in range(len(self.headers))]

        def line(cells, sep):
            parts = []
            for c, w, a in zip(cells, widths, align):
                parts.append(c.rjust(w) if a == "r" else c.center(w) if a == "c"
                             else c.ljust(w))
            return sep.join(parts).rstrip()

        # two spaces between columns, one where two would pass the book's width
        sep = "  " if sum(widths) + 2 * (len(widths) - 1) <= MAX_WIDTH else " "
        lines = [line(self.headers, sep)] + [line(r, sep) for r in self.rows]
        if self.title:
            lines.insert(0, self.title)
        if self.caption:
            lines += textwrap.wrap(self.caption, MAX_WIDTH, break_on_hyphens=False)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p, cycle) -> None:      # IPython's text/plain
        p.text(self.to_text())

    # -- Markdown -------------------------------------------------------------------------
    def to_markdown(self) -> str:
        """A Markdown pipe table, with the title in bold above it and the caption below.

        In a cell that reads as a number with its unit (``14.2 ms``, ``23.5 GB``) the space
        is a no-break space, so a narrow column never puts the unit under its number."""
        marks = {"l": ":---", "r": "---:", "c": ":---:"}

        def cell(c):
            return _escape(c.replace(" ", "\u00a0") if _WITH_UNIT.match(c) else c)

        def row(cells, head=False):
            return "| " + " | ".join(_escape(c) if head else cell(c) for c in cells) + " |"

        lines = [row(self.headers, head=True),
                 "|" + "|".join(marks[a] for a in self.align) + "|"]
        lines += [row(r) for r in self.rows]
        parts = []
        if self.title:
            parts.append(f"**{_escape(self.title)}**")
        parts.append("\n".join(lines))
        if self.caption:
            parts.append(_escape(self.caption))
        return "\n\n".join(parts)

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def show(self) -> None:
        """Display the table: both forms in a Jupyter kernel (the front end picks), the plain
        text elsewhere. For a table that is not a cell's last expression."""
        try:
            from IPython import get_ipython
            shell = get_ipython()
        except ImportError:
            shell = None
        if shell is None:
            print(self.to_text())
        else:
            from IPython.display import display
            display(self)
