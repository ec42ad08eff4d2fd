"""Which notebooks' stored outputs a change makes stale, and re-running them (used by
``tools/notebooks.py stale`` and ``execute``).

A notebook's stored outputs are *stale* when a fresh run would not reproduce them under
nbval's rules: the same output keys, the same text after tests/sanitize.cfg's sanitisers,
PNG images and cells tagged ``nbval-ignore-output`` or ``nbval-skip`` left out. Only a run
can tell, so ``stale`` runs notebooks; to run only those a change can have touched, every
run records what the notebook used:

* the code of scalebook it executed, as *units*: each top-level function, each class's own
  statements, each method, and each module's top level (its constants, its imports). A
  unit's fingerprint is a hash of its syntax tree without docstrings, so comments,
  docstrings and moved lines change nothing; ``sys.monitoring`` records which code ran,
  at the cost of one event per function the first time it runs;
* the files under the repository or the notebook's folder it opened (data it reads), by
  content;
* its own cells (sources and tags), and the versions of Python, JAX, jaxlib, numpy and
  matplotlib.

They go to ``_build/stale/manifest.json`` (not committed: a fresh checkout has none, and
its first ``stale`` runs every notebook), written when a run matched the stored outputs or
stored its own. A notebook none of whose recorded inputs changed is not run again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "scalebook"
MANIFEST = ROOT / "_build" / "stale" / "manifest.json"
SANITIZE = ROOT / "tests" / "sanitize.cfg"
IGNORE_TAGS = ("nbval-ignore-output", "nbval-skip")
# Output keys nbval does not compare (nbval.plugin: skip_compare, images without nbdime)
SKIP_KEYS = {"metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
             "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg"}
VERSIONED = ("jax", "jaxlib", "numpy", "matplotlib")

# JAX's persistent compilation cache, as the test suite uses it (conftest.py): a cached
# program gives the same outputs as a compiled one, except in the notebooks listed here.
JAX_CACHE_DIR = ROOT / "_build" / "jax-cache"
NO_JAX_CACHE = {
    # a program loaded from the cache leaves no backend_compile span in a trace, and loads
    # faster than it compiles
    "notebooks/09_profiling.ipynb": "counts backend_compile spans in the trace of a "
                                    "recompiling loop, and times it against a cached one",
}


def cache_env(env: dict) -> dict:
    """Switch JAX's persistent compilation cache on in ENV (changed in place, returned), with
    every program kept (JAX's default keeps only those that took over 1 s to compile; most of
    the suite's take 10 ms to 1 s). SCALEBOOK_JAX_CACHE=0 leaves it off, SCALEBOOK_JAX_CACHE=DIR
    moves it from _build/jax-cache; a JAX_COMPILATION_CACHE_DIR already set is kept."""
    where = env.get("SCALEBOOK_JAX_CACHE", str(JAX_CACHE_DIR))
    if where not in ("0", "off", "") and "JAX_COMPILATION_CACHE_DIR" not in env:
        env["JAX_COMPILATION_CACHE_DIR"] = where
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    return env


def notebook_cache(env: dict, notebook) -> dict:
    """The cache for NOTEBOOK's kernel in ENV (changed in place, returned): off for the
    notebooks in NO_JAX_CACHE, as cache_env set it for the rest."""
    if rel(notebook) in NO_JAX_CACHE:
        env["JAX_ENABLE_COMPILATION_CACHE"] = "false"
    else:
        env.pop("JAX_ENABLE_COMPILATION_CACHE", None)
    return env


def kernel_env(notebook, base: dict | None = None) -> dict:
    """The environment NOTEBOOK's kernel gets: BASE (os.environ) with the persistent
    compilation cache as the test suite has it (conftest.py)."""
    return notebook_cache(cache_env(dict(os.environ if base is None else base)), notebook)


def rel(path) -> str:
    p = Path(path).resolve()
    return p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else str(p)


# ---- what a run used -----------------------------------------------------------------------

# Run silently in the kernel before the first cell (no output, no execution count): records
# each code object of scalebook that starts, once, and each file opened under the repository.
TRACER = r'''
def _scalebook_trace(roots, package):
    import sys, os
    seen, files = set(), set()
    tool = next(t for t in (sys.monitoring.PROFILER_ID, 3, 4, 5)
                if sys.monitoring.get_tool(t) is None)
    sys.monitoring.use_tool_id(tool, "scalebook-stale")

    def started(code, offset):
        if code.co_filename.startswith(package):
            seen.add((code.co_filename, code.co_qualname))
        return sys.monitoring.DISABLE

    sys.monitoring.register_callback(tool, sys.monitoring.events.PY_START, started)
    sys.monitoring.set_events(tool, sys.monitoring.events.PY_START)

    def audit(event, args):
        if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            p = os.path.realpath(os.fsdecode(args[0]))
            if p.startswith(roots):
                files.add(p)

    sys.addaudithook(audit)

    def report():
        import json
        return json.dumps({"code": sorted(seen), "files": sorted(files)})
    return report

_scalebook_stale_report = _scalebook_trace({roots!r}, {package!r})
del _scalebook_trace
'''


def _strip_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None),
                                                             ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _fingerprint(node) -> str:
    return hashlib.sha1(ast.dump(node, include_attributes=False).encode()).hexdigest()[:16]


def _without_docstrings(node):
    """A copy of NODE with the docstring of every function, class and module in it removed."""
    import copy

    node = copy.deepcopy(node)
    for n in ast.walk(node):
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            n.body = _strip_docstring(n.body) or [ast.Pass()]
    return node


def module_units(path: Path) -> dict[str, str]:
    """{unit: fingerprint} of one module: "<module>" (its top level, with each function
    and class reduced to its name and decorators), each top-level function "f", each class
    "C" (its statements but its methods, which are "C.m")."""
    tree = _without_docstrings(ast.parse(path.read_text(), str(path)))
    units: dict[str, str] = {}
    top = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            units[stmt.name] = _fingerprint(stmt)
            top.append(ast.Expr(ast.Tuple([ast.Constant(stmt.name), *stmt.decorator_list])))
        elif isinstance(stmt, ast.ClassDef):
            own = [s for s in stmt.body if not isinstance(s, (ast.FunctionDef,
                                                             ast.AsyncFunctionDef))]
            for s in stmt.body:
                if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    units[f"{stmt.name}.{s.name}"] = _fingerprint(s)
                    own.append(ast.Expr(ast.Tuple([ast.Constant(s.name), *s.decorator_list])))
            units[stmt.name] = _fingerprint(ast.ClassDef(
                stmt.name, stmt.bases, stmt.keywords, own or [ast.Pass()],
                stmt.decorator_list, []))
            top.append(ast.Expr(ast.Constant(stmt.name)))
        else:
            top.append(stmt)
    units["<module>"] = _fingerprint(ast.Module(top, []))
    return units


def unit_of(qualname: str, units: dict) -> str:
    """The unit a code object belongs to, from its __qualname__: "C.m.<locals>.g" -> "C.m",
    "f.<locals>.<lambda>" -> "f", "<lambda>" at the top level -> "<module>"."""
    parts = qualname.split(".<locals>")[0].split(".")
    if len(parts) >= 2 and f"{parts[0]}.{parts[1]}" in units:
        return f"{parts[0]}.{parts[1]}"
    return parts[0] if parts[0] in units else "<module>"


def _file_hash(path: Path) -> str | None:
    try:
        return hashlib.sha1(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def cells_fingerprint(nb) -> str:
    h = hashlib.sha1()
    for c in nb.cells:
        src = c.source if isinstance(c.source, str) else "".join(c.source)
        h.update(json.dumps([c.cell_type, src, c.get("metadata", {}).get("tags", [])]).encode())
    return h.hexdigest()[:16]


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": ".".join(map(str, sys.version_info[:3]))}
    for name in VERSIONED:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def record(nb, used: dict) -> dict:
    """The manifest entry of a run of NB that used USED (the tracer's report)."""
    deps: dict[str, dict[str, str]] = {}
    cache: dict[str, dict] = {}
    for filename, qualname in used["code"]:
        path = Path(filename)
        if path.suffix != ".py" or not path.exists():
            continue
        key = rel(path)
        if key not in cache:
            cache[key] = module_units(path)
        unit = unit_of(qualname, cache[key])
        deps.setdefault(key, {})[unit] = cache[key][unit]
        deps[key]["<module>"] = cache[key]["<module>"]   # it was imported
    files = {}
    for f in used["files"]:
        p = Path(f)
        if p.suffix == ".py" and p.is_relative_to(PACKAGE) or not p.is_file():
            continue
        if any(part in (".venv", "_build", ".git", "__pycache__") for part in p.parts):
            continue
        files[rel(p)] = _file_hash(p)
    return {"cells": cells_fingerprint(nb), "code": deps, "files": files,
            "versions": versions(), "checked": time.strftime("%Y-%m-%d %H:%M:%S")}


def load_manifest() -> dict:
    try:
        return json.loads(MANIFEST.read_text())
    except (OSError, ValueError):
        return {}


def save_entries(entries: dict) -> None:
    manifest = load_manifest()
    manifest.update(entries)
    MANIFEST.parent.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")


def changed_inputs(path, nb, entry: dict | None) -> list[str]:
    """Why a run of NB (the .ipynb at PATH, inputs as they would be synced) could give other
    outputs than the recorded run: [] when nothing it used has changed."""
    if not entry:
        return ["no run of it recorded yet"]
    why = []
    if entry.get("cells") != cells_fingerprint(nb):
        why.append("its cells changed")
    now = versions()
    for name, v in entry.get("versions", {}).items():
        if now.get(name) != v:
            why.append(f"{name} {v} -> {now.get(name)}")
    for module, units in entry.get("code", {}).items():
        p = ROOT / module
        if not p.exists():
            why.append(f"{module} is gone")
            continue
        current = module_units(p)
        for unit, fp in units.items():
            if current.get(unit) != fp:
                why.append(f"{module}: {unit}" + ("" if unit in current else " (gone)"))
    for f, fp in entry.get("files", {}).items():
        if _file_hash(ROOT / f) != fp:
            why.append(f"{f} changed")
    return why


# ---- comparing outputs as nbval does --------------------------------------------------------

def sanitizers() -> list[tuple[re.Pattern, str]]:
    """tests/sanitize.cfg's (regex, replacement) pairs."""
    out, regex = [], None
    for line in SANITIZE.read_text().splitlines():
        if line.startswith("regex:"):
            regex = line[len("regex:"):].strip()
        elif line.startswith("replace:") and regex is not None:
            out.append((re.compile(regex), line[len("replace:"):].strip()))
            regex = None
    return out


def _text(v) -> str:
    return "".join(v) if isinstance(v, list) else str(v)


def comparable(outputs: list, subs) -> dict[str, list[str]]:
    """OUTPUTS as nbval compares them: streams joined, each key's values in order,
    sanitised, the keys it skips left out."""
    merged = []
    for o in outputs:
        if o.get("output_type") == "stream" and merged and \
                merged[-1].get("output_type") == "stream" and merged[-1]["name"] == o["name"]:
            merged[-1] = dict(merged[-1], text=_text(merged[-1]["text"]) + _text(o["text"]))
        else:
            merged.append(dict(o))
    keyed: dict[str, list[str]] = {}

    def add(key, value):
        text = _text(value) if not isinstance(value, (dict, int, float)) else json.dumps(value)
        for rx, rep in subs:
            text = rx.sub(rep, text)
        keyed.setdefault(key, []).append(text)

    for o in merged:
        if o.get("output_type") == "stream":
            add(o["name"], o["text"])
            continue
        for key, value in o.items():
            if key in SKIP_KEYS:
                continue
            if key == "data":
                for mime, v in value.items():
                    if mime not in SKIP_KEYS:
                        add(mime, v)
            else:
                add(key, value)
    return keyed


def compared(cell) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    return cell.cell_type == "code" and not any(t in tags for t in IGNORE_TAGS) \
        and cell.get("execution_count") is not None


def first_difference(old: dict, new: dict) -> str:
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if a is None or b is None:
            return f"{key} output {'only in the fresh run' if a is None else 'no longer made'}"
        a_lines = "".join(a).splitlines()
        b_lines = "".join(b).splitlines()
        for i, (x, y) in enumerate(zip(a_lines, b_lines)):
            if x != y:
                at = next((j for j, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
                lo = max(0, at - 30)
                cut = (lambda t: ("..." if lo else "") + t[lo:at + 40].strip()
                       + ("..." if len(t) > at + 40 else ""))
                return f"{key} line {i + 1}: stored {cut(x)!r}, now {cut(y)!r}"
        return f"{key}: {len(a_lines)} lines stored, {len(b_lines)} now"
    return ""


def stale_cells(stored_nb, fresh_nb) -> list[tuple[int, str]]:
    """[(code cell number as nbval counts it, first difference)] of the compared cells whose
    fresh outputs differ from the stored ones."""
    subs = sanitizers()
    out, n = [], -1
    for old, new in zip(stored_nb.cells, fresh_nb.cells):
        if old.cell_type != "code":
            continue
        n += 1
        if not compared(old):
            continue
        a, b = comparable(old.get("outputs", []), subs), comparable(new.get("outputs", []), subs)
        if a != b:
            out.append((n, first_difference(a, b)))
    return out


def keep_ignored_outputs(stored_nb, fresh_nb) -> int:
    """Give each nbval-ignore-output cell of FRESH_NB whose source is the same as in
    STORED_NB (matched by cell id) its stored outputs back, so that re-running a notebook
    does not re-record timings. Returns how many cells were kept."""
    old = {c.get("id"): c for c in stored_nb.cells}
    kept = 0
    for c in fresh_nb.cells:
        tags = c.get("metadata", {}).get("tags", [])
        prev = old.get(c.get("id"))
        if c.cell_type == "code" and "nbval-ignore-output" in tags and prev is not None \
                and prev.source == c.source and prev.get("outputs"):
            c.outputs = prev.outputs
            kept += 1
    return kept


# ---- running ---------------------------------------------------------------------------------

@dataclass
class Run:
    path: str
    seconds: float = 0.0
    error: str = ""
    stale: list = field(default_factory=list)      # [(cell, difference)]
    entry: dict | None = None
    fresh: dict | None = None                      # the run's notebook (JSON), if asked


def run_notebook(path: str, nb_json: str, keep: bool = False, timeout: int = 600) -> Run:
    """Run the notebook NB_JSON (PATH says where it lives) in a fresh kernel with the tracer,
    compare its outputs with the stored ones and record what it used."""
    import nbformat
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient

    stored = nbformat.reads(nb_json, as_version=4)
    nb = nbformat.reads(nb_json, as_version=4)
    ipynb = ROOT / path
    result = Run(path)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(ipynb.parent)}})
    env = kernel_env(ipynb)
    t0 = time.perf_counter()
    try:
        with client.setup_kernel(env=env):
            roots = (str(ROOT) + os.sep, str(ipynb.parent.resolve()) + os.sep)
            tracer = TRACER.replace("{roots!r}", repr(roots)).replace(
                "{package!r}", repr(str(PACKAGE) + os.sep))
            reply = run_sync(client.kc.execute_interactive)(tracer, silent=True,
                                                            store_history=False, timeout=60)
            if reply["content"]["status"] != "ok":
                raise RuntimeError("the dependency tracer did not start: "
                                   + reply["content"].get("evalue", ""))
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
            reply = run_sync(client.kc.execute_interactive)(
                "", silent=True, store_history=False, timeout=60,
                user_expressions={"used": "_scalebook_stale_report()"})
            used = json.loads(ast.literal_eval(
                reply["content"]["user_expressions"]["used"]["data"]["text/plain"]))
    except Exception as e:  # a failing cell: reported, not raised
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
        lines = [ln for ln in text.splitlines() if ln.strip()]
        result.error = lines[-1].strip() if lines else type(e).__name__
        result.seconds = time.perf_counter() - t0
        return result
    result.seconds = time.perf_counter() - t0
    result.stale = stale_cells(stored, nb)
    result.entry = record(nb, used)
    if keep:
        result.fresh = nbformat.writes(nb)
    return result


def run_many(jobs: list[tuple[str, str]], workers: int, keep: bool = False):
    """Run (path, notebook JSON) pairs, WORKERS at a time; yields each Run as it ends."""
    if workers <= 1 or len(jobs) <= 1:
        for path, text in jobs:
            yield run_notebook(path, text, keep)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_notebook, path, text, keep) for path, text in jobs]
        for f in futures:
            yield f.result()
