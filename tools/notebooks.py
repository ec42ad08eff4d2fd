"""Authoring tool for the book's notebooks. Run with the project's venv:

    .venv/bin/python tools/notebooks.py sync PATH ...      # .md -> .ipynb: inputs from the .md,
                                                           # outputs and cell ids kept
    .venv/bin/python tools/notebooks.py execute PATH ...   # sync, run, store the outputs
    .venv/bin/python tools/notebooks.py stale [PATH ...]   # which stored outputs are stale?
    .venv/bin/python tools/notebooks.py execute --stale    # re-run and store every stale one
    .venv/bin/python tools/notebooks.py check [PATH ...]   # exit 1 if a pair has drifted apart
    .venv/bin/python tools/notebooks.py pair NB.ipynb ...  # make a .md for an unpaired notebook

PATH may name either file of a pair (``notebooks/05_parallelism.md`` or ``.ipynb``).

``execute`` keeps the stored outputs of a cell tagged ``nbval-ignore-output`` (timings) whose
source did not change, so that a one-number change is a small diff; ``--refresh-ignored``
re-records them too. ``stale`` runs, two at a time (``--jobs N``), every notebook that a
change since its last recorded run may have touched (all of them with ``--all``; see
tools/stale.py for what is recorded), compares the fresh outputs with the stored ones the
way nbval does, and lists the cells that differ; ``stale --write`` (the same as
``execute --stale``) stores the fresh outputs of the stale ones. Exit status 1 if any
notebook is stale or fails.

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

import argparse
import os
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
import importlib, importlib.util, os, re, subprocess, sys
if importlib.util.find_spec("scalebook") is None:
    if "jax" in sys.modules:
        print("JAX is already imported in this kernel, so installing scalebook cannot "
              "take effect.\\nRestart the runtime, then run this cell first.")
        raise SystemExit
    source = os.environ.get("SCALEBOOK_SOURCE",
                            "{install_source()}")
    print("Installing scalebook from", source)
    from importlib.metadata import version, PackageNotFoundError
    def versions():
        out = {{}}
        for name in ("jax", "numpy", "matplotlib"):
            try:
                out[name] = version(name)
            except PackageNotFoundError:
                out[name] = None
        return out
    before = versions()
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", source],
                         capture_output=True, text=True)
    plain = re.sub(r"\\x1b\\[[0-9;]*m", "", pip.stderr)     # without colour codes
    errors = [ln.strip() for ln in plain.splitlines()
              if ln.strip() and not ln.strip().startswith(("note:", "hint:", "╰", "│"))]
    if pip.returncode != 0:
        print("\\n".join(errors[-3:]))
        print(f"Could not install scalebook from {{source}} (pip exit {{pip.returncode}}). "
              "Check the network, or set SCALEBOOK_SOURCE to a location pip accepts "
              "(a git URL, a local folder), then run this cell again.")
        raise SystemExit
    for line in errors:                           # pip's dependency conflicts, if any
        if "conflict" in line or "incompatible" in line or "requires" in line:
            print("pip:", line)
    after = versions()
    shown = {{"jax": "JAX", "numpy": "NumPy", "matplotlib": "Matplotlib"}}
    for name in before:
        if after[name] != before[name]:
            print(f"{{shown[name]}} {{before[name]}} was too old for scalebook: pip "
                  f"installed {{shown[name]}} {{after[name]}}." if before[name] else
                  f"pip installed {{shown[name]}} {{after[name]}}.")
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


def synced(path, write: bool = False):
    """The .ipynb of a pair with the .md's inputs (title/badge/set-up arranged) and the
    .ipynb's outputs and cell ids, as a notebook; WRITE stores both files."""
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
    source = jupytext.reads(jupytext.writes(source, fmt="md:myst"), fmt="md:myst")
    if write:
        _write_md(source, md)
        source = jupytext.read(md)
    if ipynb.exists():
        outputs = nbformat.read(ipynb, as_version=4)
        combined = combine_inputs_with_outputs(source, outputs, fmt="md:myst")
    else:
        combined = source
    combined = normalise(combined)
    if write:
        _write_ipynb(combined, ipynb)
    return combined


def sync(path) -> Path:
    """Make the .ipynb's inputs equal the .md's (title/badge/set-up arranged in both);
    keep the .ipynb's outputs and cell ids. Returns the .ipynb path."""
    synced(path, write=True)
    return pair_paths(path)[1]


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


def _stale():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import stale
    finally:
        sys.path.pop(0)
    return stale


def _store(run, refresh_ignored: bool = False) -> int:
    """Write RUN's fresh outputs to its .ipynb, keeping the stored outputs of unchanged
    nbval-ignore-output cells unless REFRESH_IGNORED; record the run. Returns the number of
    cells whose stored outputs were kept."""
    import nbformat

    st = _stale()
    ipynb = ROOT / run.path
    fresh = nbformat.reads(run.fresh, as_version=4)
    stored = nbformat.read(ipynb, as_version=4) if ipynb.exists() else None
    if ipynb.with_suffix(".md").exists():
        sync(ipynb)                     # the .md as sync writes it (the .ipynb follows)
    kept = 0
    if not refresh_ignored and stored is not None:
        kept = st.keep_ignored_outputs(stored, fresh)
    _write_ipynb(normalise(fresh), ipynb)
    st.save_entries({run.path: run.entry})
    return kept


def execute(path, timeout: int = 600, refresh_ignored: bool = False) -> float:
    """Sync, run the .ipynb in a fresh kernel, store its outputs (those of unchanged
    nbval-ignore-output cells kept unless REFRESH_IGNORED). Returns seconds."""
    import nbformat

    st = _stale()
    ipynb = sync(path)
    nb = nbformat.read(ipynb, as_version=4)
    run = st.run_notebook(st.rel(ipynb), nbformat.writes(nb), keep=True, timeout=timeout)
    if run.error:
        raise SystemExit(f"{ipynb}: the run failed, nothing stored: {run.error}")
    _store(run, refresh_ignored)
    return run.seconds


def stale_command(args) -> int:
    """tools/notebooks.py stale: run the notebooks a change may have touched, list the cells
    whose stored outputs a fresh run does not reproduce; --write stores them."""
    import nbformat

    st = _stale()
    paths = [pair_paths(p)[1] for p in args.paths] if args.paths else \
        [pair_paths(p)[1] for p in all_pairs()]
    manifest = st.load_manifest()
    jobs, fresh_enough, drifted = [], [], set()
    for ipynb in paths:
        key = st.rel(ipynb)
        nb = synced(ipynb)
        why = ["--all"] if args.all else st.changed_inputs(ipynb, nb, manifest.get(key))
        if drift(ipynb):
            drifted.add(key)
            why.insert(0, "its .md has edits the .ipynb does not have"
                          + (" (stored with --write)" if args.write else " (run 'sync')"))
        if why:
            jobs.append((key, nbformat.writes(nb), why))
        else:
            fresh_enough.append(key)
    for key in fresh_enough:
        print(f"{key}: unchanged since its last recorded run")
    if not jobs:
        print(f"nothing to run: {len(fresh_enough)} notebooks unchanged")
        return 0
    t0 = time.perf_counter()
    print(f"running {len(jobs)} notebooks, {args.jobs} at a time:")
    for key, _, why in jobs:
        shown = "; ".join(why[:3]) + (f"; and {len(why) - 3} more" if len(why) > 3 else "")
        print(f"  {key}: {shown}")
    bad, stored, entries = 0, 0, {}
    runs = st.run_many([(k, text) for k, text, _ in jobs], args.jobs, keep=args.write)
    for run in runs:
        if run.error:
            bad += 1
            print(f"{run.path}: FAILS ({run.seconds:.0f} s): {run.error}")
        elif run.stale:
            bad += 1
            cells = ", ".join(str(n) for n, _ in run.stale)
            print(f"{run.path}: STALE ({run.seconds:.0f} s): "
                  f"{len(run.stale)} cell{'s' if len(run.stale) > 1 else ''} ({cells}) differ")
            for n, diff in run.stale[:8]:
                print(f"    Cell {n}: {diff}")
            if args.write:
                kept = _store(run, args.refresh_ignored)
                print(f"    stored the fresh outputs"
                      + (f" (kept {kept} nbval-ignore-output cells)" if kept else ""))
                bad, stored = bad - 1, stored + 1
        else:
            print(f"{run.path}: up to date ({run.seconds:.0f} s)")
            if args.write and run.path in drifted:    # the new inputs, with the outputs
                _store(run, args.refresh_ignored)
                print("    stored its new inputs (.md and .ipynb in sync)")
            else:
                entries[run.path] = run.entry
    st.save_entries(entries)
    print(f"{len(jobs)} run in {time.perf_counter() - t0:.0f} s: "
          + (f"{stored} were stale and now hold fresh outputs; " if stored else "")
          + (f"{bad} stale or failing" if bad else "the rest up to date" if stored
             else "all up to date"))
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("stale", "execute"):
        parser = argparse.ArgumentParser(prog=f"tools/notebooks.py {argv[0]}")
        parser.add_argument("paths", nargs="*", help="notebook pairs (either file); all if none"
                            if argv[0] == "stale" else "notebook pairs (either file)")
        parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                            help="notebooks run at once (all cores)")
        parser.add_argument("--refresh-ignored", action="store_true",
                            help="re-record the outputs of nbval-ignore-output cells too")
        if argv[0] == "stale":
            parser.add_argument("--all", action="store_true",
                                help="run every notebook, changed or not")
            parser.add_argument("--write", action="store_true",
                                help="store the fresh outputs of the stale notebooks")
        else:
            parser.add_argument("--stale", action="store_true",
                                help="every notebook 'stale' finds (= stale --write)")
        args = parser.parse_args(argv[1:])
        if argv[0] == "stale":
            return stale_command(args)
        if args.stale:
            args.all, args.write = False, True
            return stale_command(args)
        if not args.paths:
            parser.error("name the notebooks to execute, or --stale")
        for p in args.paths:
            print(f"{p}: {execute(p, refresh_ignored=args.refresh_ignored):.1f} s", flush=True)
        return 0
    return _main(argv)


def _main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("sync", "check", "pair"):
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
        else:
            print(f"{pair(p)}: paired", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
