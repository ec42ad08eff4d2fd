"""Authoring tool for the book's notebooks. Run with the project's venv:

    .venv/bin/python tools/notebooks.py sync PATH ...      # .md -> .ipynb: inputs from the .md,
                                                           # outputs and cell ids kept
    .venv/bin/python tools/notebooks.py execute PATH ...   # sync, run, store the outputs
    .venv/bin/python tools/notebooks.py check [PATH ...]   # exit 1 if a pair has drifted apart
    .venv/bin/python tools/notebooks.py pair NB.ipynb ...  # make a .md for an unpaired notebook

PATH may name either file of a pair (``notebooks/05_parallelism.md`` or ``.ipynb``).

Every chapter and solutions notebook is a jupytext pair (``formats: ipynb,md:myst``): the
MyST Markdown file is the source people edit and review (one line per line of prose, no
cell ids, no outputs); the ``.ipynb`` holds the same cells with their stored outputs, which
nbval, GitHub and Colab show. jupytext (the maintained library) reads and writes both; this
tool adds only what is the book's own:

1. the first three cells, the same in every notebook: the title (``# N. Title``), the
   "Open in Colab" badge (URL from _config.yml) and the set-up cell (``setup_source()``);
2. normalised notebook metadata, so that a re-run changes only outputs;
3. stream outputs joined the same way every run (a kernel splits stdout at random places).

Cell ids are kept across edits (a new cell gets a new random id; nothing is renumbered)
and sources are stored as lists of lines, so a one-word edit changes one line in each file.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG_SETUP = "setup"
TAG_BADGE = "colab-badge"
PAIR_FORMATS = "ipynb,md:myst"
CHAPTER_DIRS = ("notebooks", "solutions")    # notebooks with the title/badge/set-up layout


# ---- the book's own cells -----------------------------------------------------------------

def repository() -> tuple[str, str]:
    """(url, branch) of the book's repository, read from _config.yml."""
    text = (ROOT / "_config.yml").read_text()
    block = re.search(r"^repository:\n((?:[ \t]+.*\n)+)", text, re.M)
    if not block:
        raise SystemExit("_config.yml has no repository: block")
    url = re.search(r"^\s+url:\s*(\S+)", block.group(1), re.M).group(1)
    branch = re.search(r"^\s+branch:\s*(\S+)", block.group(1), re.M).group(1)
    return url.rstrip("/"), branch


def colab_url(nb_path: Path) -> str:
    url, branch = repository()
    gh = url.replace("https://github.com/", "")
    p = Path(nb_path).resolve().with_suffix(".ipynb")
    # A copy outside the checkout (a test's temporary folder) keeps its folder/name.
    rel = p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else f"{p.parent.name}/{p.name}"
    return f"https://colab.research.google.com/github/{gh}/blob/{branch}/{rel}"


def badge_source(nb_path: Path) -> str:
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab_url(nb_path)})")


def install_source() -> str:
    url, branch = repository()
    return f"git+{url}@{branch}"


def setup_source() -> str:
    """The set-up cell. Before installing anything it refuses to go on in a kernel that has
    already imported JAX (the install could not replace it); an install failure is one
    message (what failed, what to try, the SCALEBOOK_SOURCE override), not pip's traceback."""
    return f'''# Set-up: run this cell first. Where the book's package is missing (Colab), it is
# installed (and JAX, if this one is too old); then JAX gets 8 devices and says what it
# runs on. SCALEBOOK_SOURCE overrides where scalebook is installed from.
import importlib, importlib.util, os, subprocess, sys
if importlib.util.find_spec("scalebook") is None:
    if "jax" in sys.modules:
        print("JAX is already imported in this kernel, so installing scalebook cannot "
              "take effect.\\nRestart the runtime, then run this cell first.")
        raise SystemExit
    source = os.environ.get("SCALEBOOK_SOURCE",
                            "{install_source()}")
    print("Installing scalebook from", source)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", source],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        print(pip.stderr.strip().splitlines()[-1] if pip.stderr.strip() else "")
        print(f"Could not install scalebook from {{source}} (pip exit {{pip.returncode}}). "
              "Check the network, or set SCALEBOOK_SOURCE to a location pip accepts "
              "(a git URL, a local folder), then run this cell again.")
        raise SystemExit
    importlib.invalidate_caches()
import scalebook
setup_info = scalebook.setup()'''


def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _tags(cell) -> list:
    return list(cell.get("metadata", {}).get("tags", []))


def arrange(nb, path: Path):
    """Put the title, the badge cell and the set-up cell first, keeping their cell ids.

    The title is the first markdown cell's first line (``# N. Title``); if that cell holds
    more, the rest becomes its own cell after the set-up cell. The set-up cell is tagged
    ``hide-input`` so the website folds its code away and shows what it printed.
    """
    import nbformat.v4 as v4

    old_badge = next((c for c in nb.cells if TAG_BADGE in _tags(c)), None)
    old_setup = next((c for c in nb.cells if TAG_SETUP in _tags(c)), None)
    cells = [c for c in nb.cells if c is not old_badge and c is not old_setup]
    first = next((i for i, c in enumerate(cells) if c.cell_type == "markdown"), None)
    text = _src(cells[first]) if first is not None else ""
    if first is None or not text.startswith("# "):
        raise SystemExit(f"{path}: the first markdown cell must start with the title, '# N. Title'")
    title_line, _, rest = text.partition("\n")
    title = cells[first]
    title.source = title_line
    body = cells[:first] + cells[first + 1:]
    if rest.strip():
        body.insert(first, v4.new_markdown_cell(rest.strip("\n")))
    badge = old_badge or v4.new_markdown_cell()
    badge.source = badge_source(path)
    badge.metadata = {"tags": [TAG_BADGE]}
    setup = old_setup or v4.new_code_cell()
    setup.source = setup_source()
    setup.metadata = {"tags": [TAG_SETUP, "hide-input"]}
    nb.cells = [title, badge, setup] + body
    return nb


def notebook_metadata() -> dict:
    return {
        "jupytext": {"formats": PAIR_FORMATS},
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                       "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": []},
    }


def normalise(nb):
    """Drop volatile metadata and join split streams, so diffs show only real changes."""
    nb.metadata = notebook_metadata()
    for c in nb.cells:
        for key in ("execution", "collapsed", "scrolled", "ExecuteTime"):
            c.metadata.pop(key, None)
        if c.cell_type == "code":
            c.outputs = _merge_streams(c.get("outputs", []))
    return nb


def _merge_streams(outputs: list) -> list:
    """Join consecutive stdout (or stderr) chunks: how a kernel splits a stream varies run to run."""
    merged = []
    for out in outputs:
        if (out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == out.get("name")):
            prev = merged[-1]
            prev["text"] = _text(prev["text"]) + _text(out["text"])
        else:
            merged.append(out)
    return merged


def _text(t) -> str:
    return "".join(t) if isinstance(t, list) else t


# ---- pairs ----------------------------------------------------------------------------------

def pair_paths(path) -> tuple[Path, Path]:
    """(.md, .ipynb) for either file of a pair."""
    p = Path(path)
    if p.suffix not in (".md", ".ipynb"):
        raise SystemExit(f"{p}: expected a .md or .ipynb file of a notebook pair")
    return p.with_suffix(".md"), p.with_suffix(".ipynb")


def all_pairs() -> list[Path]:
    """The .md sources of every paired notebook in the book (chapters, solutions, and the
    reference pages in book/ that are notebooks)."""
    out = []
    for d in CHAPTER_DIRS + ("book",):
        out += sorted(p for p in (ROOT / d).glob("*.md") if p.with_suffix(".ipynb").exists())
    return out


def _is_chapter(path: Path) -> bool:
    return Path(path).resolve().parent.name in CHAPTER_DIRS


def _write_ipynb(nb, path: Path) -> None:
    import nbformat

    nbformat.validate(nb)
    path.write_text(nbformat.writes(nb, version=4) + "\n")


def _write_md(nb, path: Path) -> None:
    import jupytext

    jupytext.write(nb, path, fmt="md:myst")


def sync(path) -> Path:
    """Make the .ipynb's inputs equal the .md's (title/badge/set-up arranged in both);
    keep the .ipynb's outputs and cell ids. Returns the .ipynb path."""
    import jupytext
    import nbformat
    from jupytext.combine import combine_inputs_with_outputs

    md, ipynb = pair_paths(path)
    if not md.exists():
        raise SystemExit(f"{md} does not exist: make it with 'tools/notebooks.py pair {ipynb}'")
    source = jupytext.read(md)
    if _is_chapter(md):
        source = arrange(source, ipynb)
    source.metadata.setdefault("jupytext", {})["formats"] = PAIR_FORMATS
    _write_md(source, md)
    source = jupytext.read(md)
    if ipynb.exists():
        outputs = nbformat.read(ipynb, as_version=4)
        combined = combine_inputs_with_outputs(source, outputs, fmt="md:myst")
    else:
        combined = source
    _write_ipynb(normalise(combined), ipynb)
    return ipynb


def pair(path) -> Path:
    """Create the .md of an unpaired .ipynb (inputs only), then sync."""
    import nbformat

    md, ipynb = pair_paths(path)
    nb = nbformat.read(ipynb, as_version=4)
    nb.metadata.setdefault("jupytext", {})["formats"] = PAIR_FORMATS
    _write_md(nb, md)
    return sync(md)


def drift(path) -> list[str]:
    """What differs between the inputs of a pair's two files ([] when in sync)."""
    import jupytext
    import nbformat

    md, ipynb = pair_paths(path)
    for p in (md, ipynb):
        if not p.exists():
            return [f"{p.name} is missing"]
    a = jupytext.read(md).cells
    b = nbformat.read(ipynb, as_version=4).cells
    problems = []
    if len(a) != len(b):
        problems.append(f"{md.name} has {len(a)} cells, {ipynb.name} has {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if x.cell_type != y.cell_type:
            problems.append(f"cell {i}: {x.cell_type} in {md.name}, {y.cell_type} in {ipynb.name}")
        elif _src(x) != _src(y):
            problems.append(f"cell {i} ({x.cell_type}) differs: {_src(x)[:60]!r} vs {_src(y)[:60]!r}")
        elif _tags(x) != _tags(y):
            problems.append(f"cell {i}: tags {_tags(x)} in {md.name}, {_tags(y)} in {ipynb.name}")
        if len(problems) >= 5:
            break
    return problems


def execute(path, timeout: int = 600) -> float:
    """Sync, run the .ipynb in a fresh kernel, store its outputs. Returns seconds."""
    import nbformat
    from nbclient import NotebookClient

    ipynb = sync(path)
    nb = nbformat.read(ipynb, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(ipynb.parent)}})
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    _write_ipynb(normalise(nb), ipynb)
    return elapsed


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("sync", "execute", "check", "pair"):
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "check":
        paths = args or all_pairs()
        bad = 0
        for p in paths:
            problems = drift(p)
            if problems:
                bad += 1
                print(f"{p}: out of sync ('tools/notebooks.py sync {p}' fixes it)")
                for line in problems:
                    print("   ", line)
        print(f"{len(paths) - bad} of {len(paths)} pairs in sync")
        return 1 if bad else 0
    for p in args:
        if cmd == "sync":
            print(f"{sync(p)}: synced", flush=True)
        elif cmd == "pair":
            print(f"{pair(p)}: paired", flush=True)
        else:
            print(f"{p}: {execute(p):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
