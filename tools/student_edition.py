"""The student edition: the same book without its solutions, built from the same sources.

    python3 tasks.py student [--out _build/student] [--repository URL] [--no-site]
                             [--pdf]

Writes to ``--out`` a copy of the book that a class can be given:

* ``notebooks/``, ``book/``, ``scalebook/``, the configuration and the lock file, with
  the ``solutions/`` part gone: no solutions pages in the table of contents, no solution
  cells, no sentence that links to a solution, no instructor's guide;
* ``_build/html``: its website, built like the full one (Sphinx warnings are errors);
* with ``--pdf``, ``_build/html/scalebook.pdf``: the student edition as one PDF, printed
  by tools/pdf.py from the student edition's own sources (``--root``), never from the
  full book; the introduction then links it. Without ``--pdf`` the introduction's link
  to the PDF is taken out: the full book's PDF holds the solutions.

What is taken out, and how:

1. Table of contents: every part whose files are under ``solutions/``, and the
   instructor's guide (``book/instructor``).
2. Cells: a Markdown cell that starts ``### Solution N.M`` or a cell tagged ``solution``.
3. Text: a sentence that links to ``solutions/`` ("Worked solutions are in the [solutions
   to chapter 3](../solutions/03_sharding.ipynb).") and anything between
   ``<!-- instructor -->`` and ``<!-- /instructor -->`` (Markdown comments, invisible in the
   full edition), in the notebooks and in the book's pages.

Afterwards every file and page is searched again; a link to a solution, a solution cell or
a solutions page that survived stops the build with the list of where (a new kind of link
must be taught to this tool, not shipped). So does a PDF in the student edition that
this tool did not print from the student sources (its SHA-256 is recorded in
``_build/pdf/student-pdf.sha256``), the full book's PDF above all, and a link to
``scalebook.pdf`` when there is no student PDF.

``--repository URL``: where the student edition will be published (a repository of its own,
so that its Colab badges open the student notebooks, not the full ones). It replaces the
book's repository URL in the configuration and in every notebook's badge and set-up cell.
Without it the badges still open the full edition's chapter notebooks, which hold no
solutions but do name the solutions' folder in the repository.

The scalebook package is the same in both editions: its exercise checks compute the
reference answers of the chapter's own numbers. Use ``python -m scalebook.assign`` with
per-student variants when that matters (book/instructor.md).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
INSTRUCTOR_PAGES = ("book/instructor",)
# What the student edition is made of (solutions/, tests/ and tools other than the site's
# extensions stay behind).
COPY = ("_config.yml", "pyproject.toml", "requirements.in", "requirements.lock",
        "book", "notebooks", "scalebook", "tools/exercise_cells.py", "tools/site_fixes.py",
        "tools/api_index.py",
        "tools/site_static")                     # README.md: a student one is written

_INSTRUCTOR_BLOCK = re.compile(r"[ \t]*<!-- instructor -->.*?<!-- /instructor -->[ \t]*\n?",
                               re.S)
_SOLUTION_LINK = r"\]\((?:\.\./|\./|/)?solutions/[^)]*\)"
# A sentence (from the end of the last one, or a line's start) holding a solutions link;
# it may run on over the lines of its paragraph, before and after the link.
_SOLUTION_SENTENCE = re.compile(r"(?:(?<=[.!?])[ \t]+|(?<=\n)|^)[^.!?\n]*(?:\n[^.!?\n]*)*?"
                                + _SOLUTION_LINK
                                + r"[^.!?\n]*(?:\n(?=[^\n])[^.!?\n]*)*[.!?]?", re.M)
_SOLUTION_HEADING = re.compile(r"^#{2,4} Solution \d+\.\d+")
_LEFTOVER = re.compile(r"solutions/\d\d_\w+|" + _SOLUTION_LINK + r"|^#{2,4} Solution \d+\.\d+",
                       re.M)


class StudentEditionError(RuntimeError):
    pass


def rewrite_repository(text: str, repo_from: str | None, repo_to: str | None) -> str:
    """TEXT with the book's repository replaced: its URL (set-up cell) and its Colab path
    (``colab.research.google.com/github/OWNER/NAME/...``, the badges)."""
    if not (repo_from and repo_to):
        return text
    text = text.replace(repo_from, repo_to)
    gh = "https://github.com/"
    if repo_from.startswith(gh) and repo_to.startswith(gh):
        text = text.replace("/github/" + repo_from[len(gh):] + "/",
                            "/github/" + repo_to[len(gh):] + "/")
    return text


_PDF_LINK = re.compile(r'[ \t]*<span class="pdf-link">.*?</span>[ \t]*\n?', re.S)
PDF_NAME = "scalebook.pdf"
PDF_RECORD = Path("_build") / "pdf" / "student-pdf.sha256"


def strip_text(text: str, pdf_link: bool = False) -> str:
    """Markdown without its instructor-only blocks, its sentences that link to solutions,
    and the link to the PDF unless ``pdf_link`` (the student edition's own PDF is built,
    ``--pdf``)."""
    text = _INSTRUCTOR_BLOCK.sub("", text)
    text = _SOLUTION_SENTENCE.sub("", text)
    if not pdf_link:
        text = _PDF_LINK.sub("", text)
    return re.sub(r"[ \t]+\n", "\n", text)


STUDENT_README = """# {title}: the student edition

This is the student edition of the book: every chapter, with its explanations, code,
figures and exercises, and the book's Python package `scalebook`, which checks your answers
as you go. The worked solutions are not part of it.

Read it as a website (your course gives the address), or run a chapter in Colab: open its
notebook from `notebooks/` (each chapter page has an "Open in Colab" badge), then
*Runtime > Run all*; the first cell installs `scalebook`. Each exercise ends with a cell
like `check("1.3", answer_1_3)` that says whether your answer is right and, if not, gives a
hint. An assignment your instructor hands out is a notebook of its own, with your own
numbers; hand in the `.ipynb` file as you are told.

To run it on your own machine (Python 3.12):

```bash
python3.12 -m venv .venv
.venv/bin/pip install --require-hashes -r requirements.lock
.venv/bin/pip install --no-deps -e .
.venv/bin/jupyter lab notebooks/
```
"""


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _set_source(cell, text: str) -> None:
    cell["source"] = text.splitlines(keepends=True) if isinstance(cell["source"], list) else text


def is_solution_cell(cell) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    return "solution" in tags or (cell.get("cell_type") == "markdown"
                                  and bool(_SOLUTION_HEADING.match(_source(cell).lstrip())))


def strip_notebook(nb: dict, repo_from: str | None = None, repo_to: str | None = None,
                   pdf_link: bool = False) -> dict:
    """A copy of a notebook (JSON) with its solution cells dropped and its text stripped."""
    nb = copy.deepcopy(nb)
    cells = []
    for cell in nb["cells"]:
        if is_solution_cell(cell):
            continue
        text = _source(cell)
        if cell["cell_type"] == "markdown":
            text = strip_text(text, pdf_link)
        text = rewrite_repository(text, repo_from, repo_to)
        _set_source(cell, text)
        cells.append(cell)
    nb["cells"] = cells
    return nb


def strip_myst(text: str, repo_from: str | None = None, repo_to: str | None = None,
               pdf_link: bool = False) -> str:
    """The MyST half of a pair, stripped the same way (cells are split at ``+++`` and fences)."""
    parts = re.split(r"(?m)^(?=\+\+\+|```\{code-cell\})", text)
    keep = [p for p in parts if not _SOLUTION_HEADING.match(re.sub(r"^\+\+\+.*\n\s*", "", p))]
    return rewrite_repository(strip_text("".join(keep), pdf_link), repo_from, repo_to)


def student_toc(toc: dict) -> dict:
    """The table of contents without the solutions part and the instructor's pages."""
    toc = copy.deepcopy(toc)

    def keep(entry) -> bool:
        f = entry.get("file", "")
        return not f.startswith("solutions/") and f not in INSTRUCTOR_PAGES

    parts = []
    for part in toc.get("parts", []):
        chapters = [c for c in part.get("chapters", []) if keep(c)]
        if chapters:
            parts.append({**part, "chapters": chapters})
    toc["parts"] = parts
    return toc


def _repository(config_text: str) -> str:
    m = re.search(r"^repository:\n(?:[ \t]+.*\n)*?[ \t]+url:\s*(\S+)", config_text, re.M)
    if not m:
        raise StudentEditionError("_config.yml has no repository url")
    return m.group(1).rstrip("/")


def make_sources(root: Path, dest: Path, repository: str | None = None,
                 pdf_link: bool = False) -> list[Path]:
    """Write the student edition's sources into DEST (emptied first); returns the files.
    ``pdf_link``: keep the introduction's link to ``scalebook.pdf`` (``--pdf`` prints
    the student edition's own)."""
    root, dest = Path(root), Path(dest)
    d, r = dest.resolve(), root.resolve()
    if r.is_relative_to(d) or (d.is_relative_to(r) and not d.is_relative_to(r / "_build")):
        raise StudentEditionError(f"{dest}: write the student edition under _build/ or outside "
                                  "the checkout")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    config = (root / "_config.yml").read_text()
    repo_from = _repository(config)
    repo_to = repository.rstrip("/") if repository else None
    written = []
    for name in COPY:
        src = root / name
        files = [src] if src.is_file() else sorted(
            p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts
            and ".ipynb_checkpoints" not in p.parts)
        for f in files:
            rel = f.relative_to(root)
            if rel.with_suffix("").as_posix() in INSTRUCTOR_PAGES:
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            if f.suffix == ".ipynb":
                nb = strip_notebook(json.loads(f.read_text()), repo_from, repo_to,
                                    pdf_link)
                out.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            elif f.suffix == ".md" and rel.parts[0] in ("book", "notebooks"):
                out.write_text(strip_myst(f.read_text(), repo_from, repo_to, pdf_link))
            elif rel.as_posix() == "_config.yml" and repo_to:
                out.write_text(rewrite_repository(config, repo_from, repo_to))
            else:
                shutil.copy2(f, out)
            written.append(out)
    title = yaml.safe_load(config).get("title", "The book")
    (dest / "README.md").write_text(STUDENT_README.format(title=title))
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    (dest / "_toc.yml").write_text("# The student edition's table of contents (no solutions; "
                                   "written by tools/student_edition.py).\n"
                                   + yaml.safe_dump(student_toc(toc), sort_keys=False))
    written.append(dest / "_toc.yml")
    return written


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def full_pdfs(root: Path = ROOT) -> list[Path]:
    """Where the full book's PDF (with its solutions) is built in a checkout."""
    return [p for p in (root / "_build" / "html" / PDF_NAME,
                        root / "_build" / "pdf" / PDF_NAME) if p.is_file()]


def record_pdf(dest: Path, pdf: Path) -> None:
    """Record ``pdf`` as the one printed from the student edition's sources."""
    (dest / PDF_RECORD).parent.mkdir(parents=True, exist_ok=True)
    (dest / PDF_RECORD).write_text(_sha256(pdf) + "\n")


def _pdf_leftovers(dest: Path, root: Path = ROOT) -> list[str]:
    """A PDF in the student edition that was not printed from its sources (the full
    book's above all), and a link to scalebook.pdf when the student edition has none."""
    record = dest / PDF_RECORD
    ok = set(record.read_text().split()) if record.is_file() else set()
    full = {_sha256(p) for p in full_pdfs(root)}
    found = []
    for f in sorted(dest.rglob("*.pdf")):
        h = _sha256(f)
        if h in full:
            found.append(f"{f.relative_to(dest)}: the full book's PDF, with its "
                         f"solutions")
        elif h not in ok:
            found.append(f"{f.relative_to(dest)}: a PDF not printed from the student "
                         f"edition's sources")
    if not ok:
        for f in sorted(dest.rglob("*")):
            if not f.is_file() or f.suffix not in (".md", ".ipynb", ".html") \
                    or "_sources" in f.parts:
                continue
            if PDF_NAME in f.read_text(errors="replace"):
                found.append(f"{f.relative_to(dest)}: links to {PDF_NAME}, and the "
                             f"student edition has no PDF of its own (--pdf)")
    return found


def leftovers(dest: Path, root: Path = ROOT) -> list[str]:
    """Every place in the student edition (sources and site) that still shows a
    solution, or holds or links a PDF not printed from its own sources (``root``: the
    checkout whose full PDF must not be there)."""
    dest = Path(dest)
    found = _pdf_leftovers(dest, root)
    if (dest / "solutions").exists():
        found.append("solutions/ folder")
    html = dest / "_build" / "html"
    if (html / "solutions").exists():
        found.append("_build/html/solutions/ pages")
    for f in sorted(dest.rglob("*")):
        if not f.is_file() or f.suffix not in (".md", ".ipynb", ".html", ".yml") \
                or "_sources" in f.parts:
            continue
        text = f.read_text(errors="replace")
        if f.suffix == ".html":
            hits = re.findall(r'href="[^"]*solutions/[^"]*"|\bSolution \d+\.\d+', text)
        else:
            hits = _LEFTOVER.findall(text)
        found += [f"{f.relative_to(dest)}: {h!r}" for h in hits[:3]]
    return found


def build_site(dest: Path) -> int:
    jb = Path(sys.executable).with_name("jupyter-book")
    return subprocess.run([str(jb), "build", str(dest), "--path-output", str(dest), "-W", "-n",
                           "--keep-going"], cwd=dest).returncode


def build_pdf(dest: Path) -> int:
    """Print the student edition (its own sources, ``--root``) to
    DEST/_build/pdf/scalebook.pdf, copied to DEST/_build/html when the site is there,
    and record it as the student PDF."""
    dest = Path(dest).resolve()
    rc = subprocess.run([sys.executable, str(ROOT / "tools" / "pdf.py"),
                         "--root", str(dest)], cwd=dest).returncode
    pdf = dest / "_build" / "pdf" / PDF_NAME
    if rc == 0 and pdf.is_file():
        record_pdf(dest, pdf)
    return rc or (0 if pdf.is_file() else 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 tasks.py student",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "_build" / "student"),
                        help="folder for the student edition (_build/student)")
    parser.add_argument("--repository", help="URL the student edition will be published at")
    parser.add_argument("--no-site", action="store_true", help="write the sources only")
    parser.add_argument("--pdf", action="store_true",
                        help="also print the student edition as one PDF (a minute or "
                             "two)")
    args = parser.parse_args(argv)
    dest = Path(args.out)
    try:
        make_sources(ROOT, dest, args.repository, pdf_link=args.pdf)
    except StudentEditionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not args.no_site:
        rc = build_site(dest)
        if rc:
            print("error: the student edition's site did not build", file=sys.stderr)
            return rc
    if args.pdf:
        rc = build_pdf(dest)
        if rc:
            print("error: the student edition's PDF was not printed", file=sys.stderr)
            return rc
    bad = leftovers(dest)
    if bad:
        print("error: the student edition still shows solutions:\n  " + "\n  ".join(bad),
              file=sys.stderr)
        return 1
    print(f"student edition: {dest} (notebooks/ for Colab"
          + ("" if args.no_site else f", site at {dest / '_build' / 'html' / 'index.html'}")
          + (f", PDF at {dest / '_build' / 'pdf' / PDF_NAME}" if args.pdf else "")
          + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
