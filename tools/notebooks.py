"""Authoring tool for the book's notebooks. Run with the project's venv:

    .venv/bin/python tools/notebooks.py from-py SRC.py OUT.ipynb   # percent-format script -> notebook
    .venv/bin/python tools/notebooks.py to-py NB.ipynb SRC.py      # notebook -> percent-format script
    .venv/bin/python tools/notebooks.py sync NB.ipynb ...          # rewrite badge + set-up cell
    .venv/bin/python tools/notebooks.py execute NB.ipynb ...       # run, store outputs, normalise

The stored .ipynb files are the source of truth; the percent format (cells start with
``# %%`` or ``# %% [markdown]``, tags as ``# %% tags=["nbval-ignore-output"]``) is only a
convenient way to write or edit one, and is the same format jupytext reads.

Every chapter and solutions notebook starts with three cells that ``sync`` arranges:
1. the title, ``# N. Title`` (the first line of the author's first markdown cell);
2. a markdown cell with the "Open in Colab" badge (URL from _config.yml);
3. the set-up code cell (``setup_source()``), identical in every notebook.
tests/test_notebooks_meta.py checks both.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG_SETUP = "setup"
TAG_BADGE = "colab-badge"


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
    rel = nb_path.resolve().relative_to(ROOT).as_posix()
    return f"https://colab.research.google.com/github/{gh}/blob/{branch}/{rel}"


def badge_source(nb_path: Path) -> str:
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"({colab_url(nb_path)})")


def install_source() -> str:
    url, branch = repository()
    return f"git+{url}@{branch}"


def setup_source() -> str:
    return f'''# Set-up: run this cell first. Where the book's package is missing (Colab), it is
# installed with its pinned JAX; then JAX gets 8 devices and says what it runs on.
import importlib, importlib.util, os, subprocess, sys
if importlib.util.find_spec("scalebook") is None:
    source = os.environ.get("SCALEBOOK_SOURCE", "{install_source()}")
    print("Installing scalebook from", source)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", source], check=True)
    importlib.invalidate_caches()
import scalebook
setup_info = scalebook.setup()'''


def _cell(kind: str, source: str, tags=None) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": source}
    if tags:
        cell["metadata"]["tags"] = list(tags)
    if kind == "code":
        cell["execution_count"] = None
        cell["outputs"] = []
    return cell


def from_py(src: Path) -> dict:
    """Parse a percent-format script into a notebook dict."""
    cells, kind, tags, lines = [], None, None, []

    def flush():
        if kind is None:
            return
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(l[2:] if l.startswith("# ") else l[1:] if l.startswith("#") else l
                             for l in body.split("\n"))
        cells.append(_cell(kind, body, tags))

    for line in src.read_text().split("\n"):
        m = re.match(r"^# %%(.*)$", line)
        if m:
            flush()
            rest = m.group(1)
            kind = "markdown" if "[markdown]" in rest else "code"
            t = re.search(r"tags=(\[.*?\])", rest)
            tags = json.loads(t.group(1)) if t else None
            lines = []
        elif kind is not None:
            lines.append(line)
    flush()
    return {"cells": cells, "metadata": _metadata(), "nbformat": 4, "nbformat_minor": 5}


def to_py(nb: dict) -> str:
    out = []
    for c in nb["cells"]:
        tags = c.get("metadata", {}).get("tags")
        t = f" tags={json.dumps(tags)}" if tags else ""
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        if c["cell_type"] == "markdown":
            out.append(f"# %% [markdown]{t}")
            out.extend(("# " + l) if l else "#" for l in src.split("\n"))
        else:
            out.append(f"# %%{t}")
            out.append(src)
        out.append("")
    return "\n".join(out)


def _metadata() -> dict:
    return {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "colab": {"provenance": []},
    }


def sync(nb: dict, path: Path) -> dict:
    """Put the title, the badge cell and the set-up cell at the top (replacing old ones).

    The title is the first markdown cell's first line (``# N. Title``); if that cell holds
    more, the rest becomes its own cell after the set-up cell. The set-up cell is tagged
    ``hide-input`` so the website folds its code away and shows what it printed.
    """
    cells = [c for c in nb["cells"]
             if not set(c.get("metadata", {}).get("tags", [])) & {TAG_BADGE, TAG_SETUP}]
    first = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"), None)
    text = "".join(cells[first]["source"]) if first is not None else ""
    if first is None or not text.startswith("# "):
        raise SystemExit(f"{path}: the first markdown cell must start with the title, '# N. Title'")
    title, _, rest = text.partition("\n")
    body = cells[:first] + cells[first + 1:]
    if rest.strip():
        body.insert(first, _cell("markdown", rest.strip("\n")))
    badge = _cell("markdown", badge_source(path), [TAG_BADGE])
    setup = _cell("code", setup_source(), [TAG_SETUP, "hide-input"])
    nb["cells"] = [_cell("markdown", title), badge, setup] + body
    return nb


def normalise(nb: dict) -> dict:
    """Drop volatile metadata so that diffs show only real changes."""
    nb["metadata"] = _metadata()
    for i, c in enumerate(nb["cells"]):
        c.setdefault("metadata", {})
        for key in ("execution", "collapsed", "scrolled", "ExecuteTime"):
            c["metadata"].pop(key, None)
        c["id"] = f"cell-{i:03d}"
        if isinstance(c.get("source"), list):
            c["source"] = "".join(c["source"])
        if c["cell_type"] == "code":
            c["outputs"] = _merge_streams(c.get("outputs", []))
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


def execute(path: Path, timeout: int = 600) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    data = normalise(json.loads(nbformat.writes(nb)))
    _write(path, data)
    return elapsed


def _write(path: Path, nb: dict) -> None:
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    cmd, args = argv[0], [Path(a) for a in argv[1:]]
    if cmd == "from-py":
        src, out = args
        nb = sync(from_py(src), out)
        _write(out, normalise(nb))
    elif cmd == "to-py":
        nb_path, out = args
        out.write_text(to_py(json.loads(nb_path.read_text())))
    elif cmd == "sync":
        for p in args:
            _write(p, normalise(sync(json.loads(p.read_text()), p)))
    elif cmd == "execute":
        for p in args:
            print(f"{p}: {execute(p):.1f} s", flush=True)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
