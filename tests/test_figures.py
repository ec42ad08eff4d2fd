"""Every figure the notebooks store is drawn for the site's column (issue 27, item 4).

scalebook.setup() draws a notebook's figures in the book's style (scalebook.plots) and
stores scalebook.plots.figure_report() in each PNG. Read from the stored notebooks (no
kernel, no browser), each figure must be

* at most 7 inches wide at its stored resolution: MAX_PNG_PX = 2 x 672 pixels (the PNGs
  are drawn at twice the 96 dpi), so the 672 px column shows it at its own size;
* readable there: its smallest text, as rendered in the column, at least 9 CSS pixels
  (tests/test_browser.py measures the same in the built site);
* free of legends drawn over its data;
* captioned: its cell gives a sentence as caption and a name (mystnb: {figure: ...}),
  one figure per cell.

The measuring code itself is tested here on figures with planted faults.
"""

import base64
import json
import re
import struct
import sys
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from scalebook import plots  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import site_fixes  # noqa: E402

sys.path.pop(0)

RETINA = 2                                   # setup() stores figures at twice their dpi
MAX_PNG_PX = RETINA * plots.COLUMN_PX        # 1344: 7 in at 192 dpi
NOTEBOOKS = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb"),
                    ROOT / "book" / "hardware.ipynb"])


def stored_figures():
    """(notebook, cell, PNG bytes) for every stored PNG output."""
    out = []
    for path in NOTEBOOKS:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            for o in cell.get("outputs", []):
                if "image/png" in o.get("data", {}):
                    out.append((path, cell, base64.b64decode(o["data"]["image/png"])))
    return out


FIGURES = stored_figures()


def png_size(data: bytes) -> tuple[int, int]:
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def where(path, cell) -> str:
    return f"{path.relative_to(ROOT)} cell {cell.get('id')}"


def test_the_book_has_its_figures():
    assert len(FIGURES) >= 30
    assert {p.name[:2] for p, _, _ in FIGURES} >= {f"{n:02d}" for n in range(1, 12)}


@pytest.mark.parametrize("path,cell,data", FIGURES, ids=[where(p, c) for p, c, _ in FIGURES])
def test_a_stored_figure_fits_the_column_and_its_text_is_readable(path, cell, data):
    report = site_fixes.png_text(data, plots.REPORT_KEY)
    assert report, (f"{where(path, cell)}: no figure report in the PNG (drawn without "
                    "scalebook.setup()'s formatter? re-execute the notebook)")
    report = json.loads(report)
    width, _ = png_size(data)
    assert report["dpi"] == plots.FIGURE_DPI
    assert width <= MAX_PNG_PX, (
        f"{where(path, cell)}: {width} px wide, over {MAX_PNG_PX} (7 in at "
        f"{RETINA * plots.FIGURE_DPI} dpi): the column would shrink it")
    px = plots.rendered_text_px(report, natural_px=width / RETINA)
    assert px >= plots.MIN_TEXT_PX, (
        f"{where(path, cell)}: its smallest text ({report['min_font_pt']} pt, "
        f"{report['smallest_text']!r}) is {px:.1f} px in the column")
    assert not report["legend_covers"], f"{where(path, cell)}: {report['legend_covers']}"


def test_every_figure_has_a_caption_sentence_and_a_name():
    names, problems = {}, []
    for path, cell, data in FIGURES:
        fig = (cell["metadata"].get("mystnb") or {}).get("figure") or {}
        caption, name = fig.get("caption", ""), fig.get("name", "")
        images = sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))
        if images != 1:
            problems.append(f"{where(path, cell)}: {images} figures in one cell (one each: "
                            "the caption would be repeated)")
        words = caption.split()
        if not (len(words) >= 8 and caption[0].isupper() and caption.endswith(".")):
            problems.append(f"{where(path, cell)}: caption is not a sentence: {caption!r}")
        if caption.strip() == (site_fixes.png_text(data, "Description") or "").strip():
            problems.append(f"{where(path, cell)}: caption is the generated description")
        if not re.fullmatch(r"fig-[a-z0-9-]+", name):
            problems.append(f"{where(path, cell)}: figure name {name!r} (want fig-...)")
        elif name in names:
            problems.append(f"{where(path, cell)}: name {name} also in {names[name]}")
        names[name] = where(path, cell)
    assert not problems, "\n".join(problems)


# ---- the measuring code, on planted faults -------------------------------------------

@pytest.fixture
def styled():
    with matplotlib.rc_context(plots.BOOK_STYLE):
        yield
    plt.close("all")


def test_book_style_draws_a_seven_inch_figure_at_96_dpi(styled):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    r = plots.figure_report(fig)
    assert r["dpi"] == 96 and r["width_in"] == pytest.approx(7)
    assert r["width_in"] * r["dpi"] == plots.COLUMN_PX
    assert r["min_font_pt"] >= 9          # tick labels are the smallest text
    assert plots.rendered_text_px(r) == pytest.approx(r["min_font_pt"] * 96 / 72)


def test_a_legend_over_a_line_is_found_and_one_beside_it_is_not(styled):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0.9, 0.9], label="high")        # runs under an upper-right legend
    ax.plot([0, 1], [0.1, 0.1], label="low")
    ax.set_ylim(0, 1)
    ax.legend(loc="upper right")
    covers = plots.figure_report(fig)["legend_covers"]
    assert any("'high'" in c for c in covers) and not any("'low'" in c for c in covers)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15))  # below the axes
    assert plots.figure_report(fig)["legend_covers"] == []


def test_a_legend_over_bars_markers_or_text_is_found(styled):
    fig, ax = plt.subplots()
    ax.bar([0, 1, 2], [1, 1, 1], label="bars")
    ax.legend(loc="upper left")
    assert any("rectangle" in c for c in plots.figure_report(fig)["legend_covers"])
    fig, ax = plt.subplots()
    ax.scatter([0.05], [0.95], label="dots")
    ax.text(0.9, 0.05, "note")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left")
    assert any("markers" in c for c in plots.figure_report(fig)["legend_covers"])
    ax.legend(loc="lower right")
    assert any("text 'note'" in c for c in plots.figure_report(fig)["legend_covers"])


def test_small_text_and_a_wide_figure_are_measured(styled):
    fig, ax = plt.subplots(figsize=(14, 3))             # twice the column
    ax.text(0.5, 0.5, "tiny", fontsize=7)
    r = plots.figure_report(fig)
    assert r["min_font_pt"] == 7 and r["smallest_text"] == "tiny"
    # 7 pt at 96 dpi is 9.3 px, but the column halves a 14-inch figure
    assert plots.rendered_text_px(r) == pytest.approx(7 * 96 / 72 / 2)
    assert plots.rendered_text_px(r) < plots.MIN_TEXT_PX
    invisible = ax.text(0.1, 0.1, "hidden", fontsize=2)
    invisible.set_visible(False)
    assert plots.figure_report(fig)["min_font_pt"] == 7   # only drawn text counts


def test_the_report_is_stored_in_the_png_and_read_back(styled, tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1])
    fig.savefig(tmp_path / "f.png", metadata={plots.REPORT_KEY: plots.report_json(fig)})
    back = json.loads(site_fixes.png_text((tmp_path / "f.png").read_bytes(), plots.REPORT_KEY))
    assert back == plots.figure_report(fig)
    assert site_fixes.png_text((tmp_path / "f.png").read_bytes(), "nothing") is None
