"""Every notebook is a jupytext pair (MyST .md for review, .ipynb with outputs), in sync.

Also shows the properties the pairs exist for: a deliberately drifted copy is caught; a
one-word edit of the prose changes one line of the .md and one line of one cell of the
.ipynb; cell ids survive an inserted cell; sources are stored as lists of lines.
"""

import difflib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import notebooks as nbtool  # noqa: E402

IPYNBS = sorted(p for d in ("notebooks", "solutions", "book") for p in (ROOT / d).glob("*.ipynb"))


def test_the_site_reads_the_ipynb_half_of_every_pair():
    """Sphinx would see two sources for one page; _config.yml excludes each .md half."""
    config = (ROOT / "_config.yml").read_text()
    patterns = re.search(r"exclude_patterns: \[(.*?)\]", config, re.S).group(1)
    for path in IPYNBS:
        md = path.with_suffix(".md").relative_to(ROOT).as_posix()
        assert f'"{md}"' in patterns or f'"{path.parent.name}/*.md"' in patterns, md


@pytest.mark.parametrize("path", IPYNBS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_notebook_has_its_markdown_half_and_they_agree(path):
    md = path.with_suffix(".md")
    assert md.exists(), f"{md.name} is missing: tools/notebooks.py pair {path}"
    assert nbtool.drift(path) == [], "run: .venv/bin/python tools/notebooks.py sync " + str(md)
    meta = json.loads(path.read_text())["metadata"]
    assert meta["jupytext"]["formats"] == "ipynb,md:myst"


@pytest.mark.parametrize("path", IPYNBS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sources_are_lists_of_lines_and_ids_are_unique(path):
    cells = json.loads(path.read_text())["cells"]
    assert all(isinstance(c["source"], list) for c in cells)
    ids = [c["id"] for c in cells]
    assert len(ids) == len(set(ids))


@pytest.fixture
def copy_of_chapter(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    for ext in (".md", ".ipynb"):
        shutil.copy(ROOT / "notebooks" / f"01_rooflines{ext}", d / f"01_rooflines{ext}")
    return d / "01_rooflines.md"


def test_a_drifted_pair_is_caught(copy_of_chapter):
    md = copy_of_chapter
    assert nbtool.drift(md) == []
    md.write_text(md.read_text().replace("asked carefully", "asked precisely", 1))
    problems = nbtool.drift(md)
    assert len(problems) == 1 and "differs" in problems[0] and "markdown" in problems[0]
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "notebooks.py"), "check", str(md)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "out of sync" in r.stdout
    nbtool.sync(md)
    assert nbtool.drift(md) == []


def _changed_lines(before: str, after: str) -> list[str]:
    return [l for l in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if l[:1] in "+-" and not l.startswith(("+++", "---"))]


def test_a_one_word_edit_touches_one_line_of_each_file(copy_of_chapter):
    md, ipynb = copy_of_chapter, copy_of_chapter.with_suffix(".ipynb")
    md_before, nb_before = md.read_text(), ipynb.read_text()
    md.write_text(md_before.replace("asked carefully", "asked precisely", 1))
    nbtool.sync(md)
    md_diff = _changed_lines(md_before, md.read_text())
    nb_diff = _changed_lines(nb_before, ipynb.read_text())
    assert len(md_diff) == 2, md_diff          # one line out, one line in
    assert len(nb_diff) == 2, nb_diff
    assert "precisely" in md_diff[1] and "precisely" in nb_diff[1]
    before = json.loads(nb_before)["cells"]
    after = json.loads(ipynb.read_text())["cells"]
    changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(changed) == 1 and after[changed[0]]["cell_type"] == "markdown"


def test_an_inserted_cell_gets_a_new_id_and_no_id_is_renumbered(copy_of_chapter):
    md, ipynb = copy_of_chapter, copy_of_chapter.with_suffix(".ipynb")
    before = json.loads(ipynb.read_text())["cells"]
    text = md.read_text()
    new = "```{code-cell}\nprint('a new cell')\n```\n\n"
    at = text.index("```{code-cell}\nimport math")
    md.write_text(text[:at] + new + text[at:])
    nbtool.sync(md)
    after = json.loads(ipynb.read_text())["cells"]
    assert len(after) == len(before) + 1
    ids_before = [c["id"] for c in before]
    inserted = [c for c in after if c["id"] not in ids_before]
    assert len(inserted) == 1 and "a new cell" in "".join(inserted[0]["source"])
    assert [c["id"] for c in after if c["id"] in ids_before] == ids_before
    # every stored output stayed with its cell
    outputs = {c["id"]: c.get("outputs") for c in before}
    assert all(c.get("outputs") == outputs[c["id"]] for c in after if c["id"] in outputs)


def test_sync_arranges_title_badge_and_setup_cells_in_both_files(copy_of_chapter):
    md = copy_of_chapter
    text = md.read_text()
    # drop the badge and set-up cells from the .md, as an author starting a chapter would
    text = re.sub(r"\+\+\+ \{\"tags\": \[\"colab-badge\"\]\}\n\n.*?\n\n", "", text, count=1, flags=re.S)
    text = re.sub(r"```\{code-cell\}\n:tags: \[setup, hide-input\]\n\n.*?```\n\n", "", text, count=1, flags=re.S)
    assert "colab-badge" not in text and "setup_info" not in text
    md.write_text(text)
    nbtool.sync(md)
    cells = json.loads(md.with_suffix(".ipynb").read_text())["cells"]
    assert "".join(cells[0]["source"]).startswith("# 1. ")
    assert "colab-badge" in cells[1]["metadata"]["tags"]
    assert "".join(cells[2]["source"]) == nbtool.setup_source()
    assert "setup_info = scalebook.setup()" in md.read_text()
