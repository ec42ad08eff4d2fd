"""scalebook.tables.Table: one set of cells, shown as a Markdown table (Jupyter, Colab, the
site) and as aligned plain text (print, scripts, the text/plain of a stored output); and the
chapters' main results are stored as tables, not only as text."""

import json
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from mdit_py_plugins.dollarmath import dollarmath_plugin

from scalebook.tables import MAX_WIDTH, Table

ROOT = Path(__file__).resolve().parents[1]


def _html(md: str) -> str:
    """HTML as the site reads Markdown: tables, and $...$ as maths (MyST's dollarmath)."""
    return MarkdownIt("commonmark").enable("table").use(dollarmath_plugin).render(md)


def small():
    t = Table(["chip", "bf16 FLOP/s", "HBM"], title="Peaks", caption="Sources: the chip table.")
    t.add("tpu-v5e", "1.97e14", "16 GB").add("gpu-h100", "9.89e14", "80 GB")
    return t


def test_plain_text_is_aligned_columns_with_title_and_caption():
    lines = str(small()).split("\n")
    assert lines[0] == "Peaks" and lines[-1] == "Sources: the chip table."
    header, first, second = lines[1:4]
    assert header == "chip      bf16 FLOP/s    HBM"
    assert first == "tpu-v5e       1.97e14  16 GB"
    assert second == "gpu-h100      9.89e14  80 GB"
    # every column of the rows ends (right-aligned) or starts (left) where its heading does
    assert header.index("s") + 1 == first.index("1.97e14") + len("1.97e14")


def test_markdown_is_a_table_with_alignment_marks():
    md = small().to_markdown()
    assert md.startswith("**Peaks**\n\n| chip | bf16 FLOP/s | HBM |\n|:---|---:|---:|\n")
    assert "| tpu-v5e | 1.97e14 | 16\u00a0GB |" in md and md.endswith("\n\nSources: the chip table.")
    html = _html(md)
    assert html.count("<tr>") == 3 and html.count('style="text-align:right"') == 2 * 3
    # IPython picks these up: text/markdown and text/plain of the same cells
    assert small()._repr_markdown_() == md
    assert repr(small()) == str(small())


def test_a_number_keeps_its_unit_on_its_line_in_the_markdown():
    t = Table(["chip", "TPOT", "sharding"], [("tpu-v5e", "14.2 ms", "TP 8 x FSDP 2")])
    md = t.to_markdown()
    assert "| 14.2\u00a0ms |" in md and "| TP 8 x FSDP 2 |" in md and "tpu-v5e" in md
    assert "14.2 ms" in str(t)           # plain text keeps an ordinary space


def test_automatic_alignment_reads_numbers_with_units_and_dashes():
    t = Table(["a", "b", "c", "d", "e"])
    t.add("x", "1.84s", "73%", "TP 8 x FSDP 512", "$2.28e7")
    t.add("y", "-", "100%", "TP 1 x FSDP 256", "–")
    assert t.align == "lrrlr"
    assert Table(["a", "b"], [("1", "x")], align="cl").align == "cl"


def test_pipes_and_markdown_characters_are_escaped_and_read_back():
    t = Table(["a|b", "cost"], [("x | y", "$1.5 and $2"), ("I*", "w_hbm `v`")])
    md = t.to_markdown()
    html = _html(md)
    # still a table of two columns, and the reader sees the characters themselves
    assert html.count("<tr>") == 3 and html.count("<th ") == 2 and html.count("<td ") == 4
    assert "a|b" in html and "x | y" in html and "$1.5 and $2" in html
    assert "I*" in html and "w_hbm `v`" in html and "<em>" not in html and "<code>" not in html
    assert "math" not in html
    # the plain text is not escaped
    assert "x | y" in str(t) and "\\" not in str(t)


def test_a_table_too_wide_for_two_spaces_uses_one():
    cells = ["x" * 9] * 10
    t = Table(cells, [cells])
    assert max(len(l) for l in str(t).split("\n")) == 10 * 9 + 9 <= MAX_WIDTH
    t2 = Table(cells[:5], [cells[:5]])
    assert str(t2).split("\n")[0] == "  ".join(cells[:5])


def test_bad_rows_and_alignments_say_what_is_wrong():
    with pytest.raises(ValueError, match="has 2 cells"):
        Table(["a", "b"]).add(1)
    with pytest.raises(ValueError, match="one of l, r, c per column"):
        Table(["a", "b"], align="lx")
    with pytest.raises(ValueError, match="one line"):
        Table(["a"]).add("two\nlines")
    with pytest.raises(ValueError, match="at least one column"):
        Table([])


def test_show_prints_outside_ipython(capsys):
    small().show()
    assert capsys.readouterr().out == str(small()) + "\n"


# -- the chapters -------------------------------------------------------------------------
# (notebook, a heading of its table): the main tabular results the chapters show as tables.
CHAPTER_TABLES = [
    ("01_rooflines", "I* (FLOPs/byte)"),
    ("02_accelerators", "MXUs/core"),
    ("02_accelerators", "TPU v6e (Trillium)"),
    ("04_transformers", "H_kv"),
    ("04_transformers", "128K / H100 HBM"),
    ("05_parallelism", "DP/FSDP 1 axis"),
    ("06_training", "at 40%"),
    ("06_training", "sharding"),
    ("08_serving", "tok/s/chip"),
    ("07_inference", "batch that fits"),
    ("07_inference", "TTFT 2K"),
    ("08_serving", "cheapest end to end"),
    ("11_gpus", "gpu-h100"),
]


def _markdown_outputs(name):
    nb = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            md = out.get("data", {}).get("text/markdown")
            if md is not None:
                yield "".join(md), "".join(out["data"].get("text/plain", ""))


@pytest.mark.parametrize("name,heading", CHAPTER_TABLES)
def test_the_chapters_main_results_are_stored_as_tables(name, heading):
    """The stored output is a Markdown table (the site and Colab show a table) with that
    heading, and its plain-text twin (what nbval compares, and a terminal shows) holds the
    same heading."""
    found = [(md, plain) for md, plain in _markdown_outputs(name)
             if f">{heading}</th>" in _html(md)]
    assert found, f"{name}: no table output with the heading {heading!r}"
    assert heading in found[0][1]
