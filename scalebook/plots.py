"""The book's figures: one colour per chip, log-log rooflines, labelled units, and one
style drawn for the site's column.

The site's text column is ``COLUMN_PX`` (672) CSS pixels wide at desktop width. Figures
are drawn at ``FIGURE_DPI`` (96) dots per inch, so a figure at most ``MAX_WIDTH_IN`` (7)
inches wide is shown at its own size, and a font of ``p`` points is ``p * 96 / 72`` pixels
tall on the page. :func:`book_style` (which ``scalebook.setup()`` applies in a notebook)
sets that DPI, a 7-inch default width and fonts no smaller than 9 points (a cell that
asks for smaller text gets it: 7 points is still 9.3 pixels). :func:`figure_report` measures a drawn figure:
its width, its smallest text and any legend that covers data. ``setup()`` stores the
report in each figure's PNG, and tests/test_figures.py checks every stored figure.
"""

from __future__ import annotations

import json

import numpy as np

from .hardware import get_chip
from .roofline import attainable_flops
from .units import sci

__all__ = ["CHIP_COLORS", "COLUMN_PX", "FIGURE_DPI", "MAX_WIDTH_IN", "MIN_TEXT_PX",
           "BOOK_STYLE", "book_style", "chip_color", "figure_report", "rendered_text_px",
           "roofline_plot"]

COLUMN_PX = 672          # the site's text column at desktop width, CSS pixels
FIGURE_DPI = 96          # dots per inch of a drawn figure (a CSS inch)
MAX_WIDTH_IN = COLUMN_PX / FIGURE_DPI      # 7 inches: the widest figure shown unscaled
MIN_TEXT_PX = 9          # the smallest text a reader should see, CSS pixels
REPORT_KEY = "scalebook-figure"            # the PNG text chunk that holds figure_report()

# Font sizes in points: at 96 dpi, 9 pt is 12 px and 10 pt 13.3 px.
BOOK_STYLE = {
    "figure.dpi": FIGURE_DPI,
    "figure.figsize": (MAX_WIDTH_IN, 3.6),
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.title_fontsize": 9,
    "legend.framealpha": 0.9,
    "figure.titlesize": 11,
}


CHIP_COLORS = {
    "tpu-v4": "#8c564b",
    "tpu-v5e": "#1f77b4",
    "tpu-v5p": "#17becf",
    "tpu-v6e": "#9467bd",
    "gpu-a100": "#bcbd22",
    "gpu-h100": "#2ca02c",
    "gpu-h200": "#d62728",
    "gpu-b200": "#ff7f0e",
}


def chip_color(chip) -> str:
    return CHIP_COLORS.get(get_chip(chip).name, "#333333")


def roofline_plot(chips, points=(), ax=None, dtype: str = "bf16", intensity_range=(0.1, 1e4),
                  title: str | None = None):
    """Draw the rooflines of ``chips`` on log-log axes and place operations on them.

    ``points`` is a sequence of (label, intensity in FLOPs/byte). Each is marked on every
    chip's roof at the FLOP/s it could attain there. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    lo, hi = intensity_range
    x = np.logspace(np.log10(lo), np.log10(hi), 400)
    chips = [get_chip(c) for c in chips]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    for chip in chips:
        peak = chip.peak_flops(dtype)
        color = chip_color(chip)
        ax.loglog(x, attainable_flops(x, peak, chip.hbm_bandwidth), color=color, lw=2,
                  label=f"{chip.display_name}: peak {sci(peak)} FLOP/s")
        crit = peak / chip.hbm_bandwidth
        ax.axvline(crit, color=color, ls=":", lw=1)
        ax.annotate(f"I* = {crit:.0f}", (crit, peak), textcoords="offset points", xytext=(4, -14),
                    color=color, fontsize=8)
        for k, (label, intensity) in enumerate(points):
            y = attainable_flops(intensity, peak, chip.hbm_bandwidth)
            ax.plot([intensity], [y], markers[k % len(markers)], color=color, ms=7,
                    markeredgecolor="black", markeredgewidth=0.5)
    for k, (label, intensity) in enumerate(points):
        ax.plot([], [], markers[k % len(markers)], color="white", markeredgecolor="black",
                label=f"{label} (I = {sci(intensity)})")
    ax.set_xlabel("arithmetic intensity (FLOPs per HBM byte)")
    ax.set_ylabel(f"attainable {dtype} FLOP/s")
    ax.set_xlim(lo, hi)
    ax.grid(True, which="major", alpha=0.3)
    # below the axes: inside, it would cover the roofs or the I* lines
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    if title:
        ax.set_title(title)
    return ax


def book_style() -> None:
    """Set matplotlib's defaults to the book's figure style (:data:`BOOK_STYLE`)."""
    import matplotlib

    matplotlib.rcParams.update(BOOK_STYLE)


def figure_report(fig) -> dict:
    """Measure a matplotlib figure as it will be drawn.

    Returns ``dpi``, ``width_in`` and ``height_in`` (the figure's size), ``min_font_pt``
    and ``smallest_text`` (the smallest text drawn and its font size in points), and
    ``legend_covers``: for each legend drawn over data, what it covers (a line, a bar,
    markers, an image or a text of the same axes), empty when none does.
    """
    from matplotlib.text import Text

    drawn = []
    original = Text.draw

    def recording(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn.append((float(self.get_fontsize()), self.get_text().strip()))
        return original(self, renderer)

    Text.draw = recording
    try:
        fig.draw_without_rendering()
    finally:
        Text.draw = original
    if not hasattr(fig.canvas, "get_renderer"):     # a bare Figure (scalebook.diagrams)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        FigureCanvasAgg(fig)
    renderer = fig.canvas.get_renderer()
    covers = []
    for ax in fig.axes:
        legends = [ax.get_legend()] if ax.get_legend() is not None else []
        for legend in legends + [lg for lg in fig.legends]:
            if not legend.get_visible():
                continue
            box = legend.get_window_extent(renderer).padded(-1)
            covers += [f"{legend_name(legend)} covers {what}"
                       for what in _covered(ax, box, renderer)]
    small = min(drawn, default=(0.0, ""))
    w, h = fig.get_size_inches()
    return {"dpi": float(fig.dpi), "width_in": round(float(w), 3),
            "height_in": round(float(h), 3), "min_font_pt": small[0],
            "smallest_text": small[1][:40], "legend_covers": sorted(set(covers))}


def legend_name(legend) -> str:
    labels = [t.get_text() for t in legend.get_texts()]
    return "legend (" + ", ".join(labels[:2]) + (", ..." if len(labels) > 2 else "") + ")"


def _covered(ax, box, renderer) -> list[str]:
    """What of AX's data (lines, patches, collections, images, texts) enters the display
    bounding box BOX."""
    out = []
    for line in ax.lines:
        if line.get_visible() and len(line.get_xydata()) and \
                line.get_transform().transform_path(line.get_path()).intersects_bbox(
                    box, filled=False):
            out.append(f"line {line.get_label()!r}")
    for patch in ax.patches:
        if patch.get_visible() and patch.get_transform().transform_path(
                patch.get_path()).intersects_bbox(box, filled=True):
            out.append(f"a {type(patch).__name__.lower()}")
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        offsets = coll.get_offsets()
        if len(offsets) and coll.get_offset_transform() is not None and \
                type(coll).__name__ == "PathCollection":
            pts = coll.get_offset_transform().transform(offsets)
            if any(box.contains(x, y) for x, y in pts):
                out.append(f"markers {coll.get_label()!r}")
            continue
        tr = coll.get_transform()
        if any(tr.transform_path(p).intersects_bbox(box, filled=True)
               for p in coll.get_paths()):
            out.append(f"a {type(coll).__name__} {coll.get_label()!r}")
    for image in ax.images:
        if image.get_visible() and image.get_window_extent(renderer).overlaps(box):
            out.append("an image")
    for text in ax.texts:
        if text.get_visible() and text.get_text().strip() and \
                text.get_window_extent(renderer).overlaps(box):
            out.append(f"text {text.get_text()[:20]!r}")
    return out


def rendered_text_px(report: dict, natural_px: float | None = None,
                     shown_px: float | None = None) -> float:
    """How tall, in CSS pixels, the smallest text of a figure with REPORT is on a page.

    NATURAL_PX: the figure's own width in CSS pixels (by default its size times its dpi;
    a PNG saved with a tight bounding box differs a little); SHOWN_PX: the width the page
    shows it at (by default its own width, or the column's if it is wider).
    """
    natural = report["width_in"] * report["dpi"] if natural_px is None else natural_px
    shown = min(natural, COLUMN_PX) if shown_px is None else shown_px
    return report["min_font_pt"] * report["dpi"] / 72 * shown / natural


def report_json(fig) -> str:
    """figure_report() as the JSON text stored in a figure's PNG."""
    return json.dumps(figure_report(fig), sort_keys=True)
