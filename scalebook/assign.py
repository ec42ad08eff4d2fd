"""Make an assignment from a list of exercises: the students' notebooks and the instructor's key.

    python -m scalebook.assign 1.1 1.4 1.9 [--title "Week 1"] [--out assignment/]
        [--students roster.txt | --student alice --student bob] [--secret-file FILE]
        [--points 1.1=2,1.9=3] [--no-variants] [--book PATH]

From the book's chapter notebooks (``--book``, default: the checkout this package is in)
it takes, for each exercise, the statement, any cells between the statement and the answer
cell, and the answer cell with its ``check``; and, once per chapter, the set-up cell and the
chapter's imports cell (the first code cell after the set-up; cells tagged
``exercise-context`` come too). A student runs the notebook in Colab like any chapter.

Written to ``--out``:

* ``assignment.ipynb``: one notebook for the whole class, with the chapter's numbers; or,
  with a roster and a secret, ``students/ID.ipynb``: one per student, in which every
  exercise that has variants shows the student's own numbers, and its answer cell
  *records* the answer (``record("1.1", answer_1_1)``: says whether it is well-formed,
  never whether it is right; a check against the variant would hand its reference to
  whoever asks). The variant is HMAC(secret, student id, exercise id): the grader
  re-derives it and judges the answer, so neighbours' numbers differ and editing the
  notebook changes nothing;
* ``key.json``: what ``python -m scalebook.grade --key`` needs (exercises, answer variables,
  points, which have variants, the roster, a fingerprint of the secret; not the secret);
* ``answers.md``: the instructor's answer file: every student's variant and reference
  answer for each exercise;
* ``solutions.ipynb``: the book's worked solutions of these exercises (for the chapter's
  own numbers).

Keep the secret out of the repository and out of the students' reach: whoever has it can
compute every variant.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
from pathlib import Path

from .exercises import get_exercise
from .exercises.core import draw_variant, normalise_id
from .grade import KEY_FORMAT, Key, KeyItem, apply_points, read_secret, secret_check

__all__ = ["find_book", "chapter_notebook", "exercise_block", "build_assignment", "main"]

_EXERCISE = re.compile(r"^#{2,4} Exercise (\d+)\.(\d+) · (.+?)\s*$")
_SOLUTION = re.compile(r"^#{2,4} Solution (\d+)\.(\d+)(?: · (.+?))?\s*$")
_HEADING = re.compile(r"^(#{1,2}) ")
_CHECK = r"""check\(\s*["']{id}["']\s*,\s*([A-Za-z_]\w*)\s*\)"""


def find_book(book=None) -> Path:
    if book:
        root = Path(book)
    else:
        here = Path(__file__).resolve().parents[1]
        root = here if (here / "notebooks").is_dir() else Path.cwd()
    if not (root / "notebooks").is_dir():
        raise FileNotFoundError(f"{root} has no notebooks/ folder: give the book's checkout "
                                f"with --book")
    return root


def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def chapter_notebook(root: Path, chapter: int, folder: str = "notebooks"):
    import nbformat

    paths = sorted((root / folder).glob(f"{chapter:02d}_*.ipynb"))
    if not paths:
        raise FileNotFoundError(f"no notebook for chapter {chapter} in {root / folder}")
    return nbformat.read(paths[0], as_version=4)


def _first_line(cell) -> str:
    return _src(cell).lstrip("\n").partition("\n")[0]


def exercise_block(nb, ex_id: str, pattern=_EXERCISE) -> list:
    """The cells of one exercise (or solution): its heading cell up to the next exercise
    heading or section heading."""
    chapter, number = (int(p) for p in ex_id.split("."))
    cells, inside = [], False
    for cell in nb.cells:
        first = _first_line(cell) if cell.cell_type == "markdown" else ""
        m = pattern.match(first)
        if inside and cell.cell_type == "markdown" and (m or _HEADING.match(first)
                                                        or _EXERCISE.match(first)):
            break
        if m and (int(m.group(1)), int(m.group(2))) == (chapter, number):
            inside = True
        if inside:
            cells.append(copy.deepcopy(cell))
    if not cells:
        raise ValueError(f"exercise {ex_id} is not in chapter {chapter}'s notebook")
    return cells


def _context_cells(nb) -> list:
    """The set-up cell, the imports cell (first code cell after it) and exercise-context cells."""
    out, setup_seen, imports = [], False, None
    for cell in nb.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type != "code":
            continue
        if "setup" in tags:
            setup_seen = True
            out.append(copy.deepcopy(cell))
        elif setup_seen and imports is None:
            imports = copy.deepcopy(cell)
            out.append(imports)
        elif "exercise-context" in tags:
            out.append(copy.deepcopy(cell))
    return out


def _clean(cell):
    cell = copy.deepcopy(cell)
    cell.pop("id", None)
    if cell.cell_type == "code":
        cell.outputs, cell.execution_count = [], None
    return cell


def _answer_variable(block, ex_id: str) -> str:
    for cell in block:
        if cell.cell_type == "code":
            m = re.search(_CHECK.format(id=re.escape(ex_id)), _src(cell))
            if m:
                return m.group(1)
    raise ValueError(f"exercise {ex_id} has no answer cell calling check(\"{ex_id}\", ...)")


def _vary(block, ex_id: str, params: dict, text: str, title: str = ""):
    """The block with the student's numbers in the statement and in the check."""
    block = copy.deepcopy(block)
    head = block[0]
    title_line = _first_line(head)
    if title:                  # the variant's own title: "... on an A100", not the chapter's
        title_line = title_line.partition(" · ")[0] + " · " + title
    head.source = (f"{title_line}\n\n{text}\n\n*These are your own numbers, not the "
                   f"chapter's; the grader uses them whatever this notebook says. The cell "
                   f"below records your answer and says whether it is well-formed; whether "
                   f"it is right, the grader decides.*")
    pattern = re.compile(_CHECK.format(id=re.escape(ex_id)))
    for cell in block[1:]:
        if cell.cell_type == "code" and pattern.search(_src(cell)):
            # the answer is recorded, never judged here: a check against the variant would
            # hand its reference to whoever asks it
            cell.source = pattern.sub(lambda m: f'from scalebook.exercises import record\n'
                                                f'record("{ex_id}", {m.group(1)})', _src(cell))
    return block


def _notebook(title: str, student: str | None, ids: list[str], blocks: dict, contexts: dict,
              varied: set):
    import nbformat.v4 as v4

    intro = [f"# {title}", ""]
    if student is not None:
        intro += [f"Student: **{student}**", ""]
    intro += [f"Exercises {', '.join(ids)}. Run the set-up cell first, then each cell in order. "
              f"Write each answer in the cell under its exercise, replacing `...`, and run that "
              f"cell: the check says *correct*, *not yet* with a hint, or *not attempted yet*."]
    if varied:
        intro += ["", f"Exercises {', '.join(i for i in ids if i in varied)} use numbers drawn "
                      f"for you: they differ from the chapter's and from your neighbours'. "
                      f"Their cells record your answer and say whether it is well-formed (a "
                      f"number, in the right unit); whether it is right, the grader decides."]
    intro += ["", "Hand in this notebook as it is. It is graded by re-running it from the top: "
                  "what it printed when you ran it does not count, only what your code does."]
    def is_setup(c):
        return "setup" in c.get("metadata", {}).get("tags", [])

    setup = next((c for ch in sorted(contexts) for c in contexts[ch] if is_setup(c)), None)
    cells = [v4.new_markdown_cell(intro[0])] + ([_clean(setup)] if setup else [])
    cells.append(v4.new_markdown_cell("\n".join(intro[2:])))
    for ch in sorted(contexts):
        cells += [_clean(c) for c in contexts[ch] if not is_setup(c)]
        cells += [_clean(c) for ex_id in ids if int(ex_id.split(".")[0]) == ch
                  for c in blocks[ex_id]]
    for n, c in enumerate(cells):
        c["id"] = f"cell-{n:03d}"
    nb = v4.new_notebook(cells=cells)
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                  "name": "python3"},
                   "language_info": {"name": "python"}, "colab": {"provenance": []},
                   "scalebook": {"assignment": title, "exercises": ids,
                                 **({"student": student} if student is not None else {})}}
    return nb


def build_assignment(ids, out, *, title="Assignment", students=(), secret: bytes | None = None,
                     variants: bool = True, points: str | None = None, book=None) -> Key:
    """Write the assignment's notebooks, key, answer file and solutions to ``out``."""
    import nbformat

    root = find_book(book)
    ids = [normalise_id(i) for i in ids]
    if len(set(ids)) != len(ids):
        raise ValueError("an exercise is listed twice")
    students = [str(s) for s in students]
    # letters and digits of any script, then also . _ @ -: a file name on every system, and
    # never a path (no /, no leading dot)
    bad = [s for s in students if not re.fullmatch(r"[^\W_][\w.@-]{0,63}", s)]
    if bad:
        raise ValueError(f"student ids must be letters, digits and . _ @ - : {bad[:3]}")
    if len(set(students)) != len(students):
        raise ValueError("a student id is listed twice")
    exercises = {i: get_exercise(i) for i in ids}
    varied = {i for i, ex in exercises.items() if variants and ex.draw(b"probe") is not None}
    if varied and not (students and secret):
        if students or secret:
            raise ValueError("variants need both a roster (--students) and a secret "
                             "(--secret-file or SCALEBOOK_SECRET); or pass --no-variants")
        varied = set()
    chapters = sorted({int(i.split(".")[0]) for i in ids})
    nbs = {ch: chapter_notebook(root, ch) for ch in chapters}
    contexts = {ch: _context_cells(nbs[ch]) for ch in chapters}
    blocks = {i: exercise_block(nbs[int(i.split(".")[0])], i) for i in ids}
    key = Key([KeyItem(i, _answer_variable(blocks[i], i), 1.0, i in varied) for i in ids],
              title=title, students=students, secret_check=secret_check(secret) if secret else None)
    apply_points(key, points)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    answers = [f"# {title}: the instructor's answers", "",
               "Keep this file from the students. Reference answers are computed by scalebook.", ""]
    if varied:
        (out / "students").mkdir(exist_ok=True)
        answers += ["| student | exercise | variant | answer |", "|:---|:---|:---|---:|"]
        for s in students:
            own = dict(blocks)
            for i in sorted(varied, key=ids.index):
                params = draw_variant(i, secret, s)
                ex = exercises[i].with_variant(params)
                own[i] = _vary(blocks[i], i, params, ex.text(), ex.title_text())
                answers.append(f"| {s} | {i} | {json.dumps(params)} | {ex.reference():.6g} |")
            nb = _notebook(title, s, ids, own, contexts, varied)
            nbformat.write(nb, out / "students" / f"{s}.ipynb")
        answers += [""]
        distinct = []
        for i in sorted(varied, key=ids.index):
            values = {round(exercises[i].with_variant(draw_variant(i, secret, s)).reference(), 12)
                      for s in students}
            distinct.append(f"{i}: {len(values)} different answers among {len(students)} students")
        answers += ["Different answers: " + "; ".join(distinct) + ".", ""]
    else:
        nbformat.write(_notebook(title, None, ids, blocks, contexts, set()),
                       out / "assignment.ipynb")
    answers += ["The chapter's own numbers:", "", "| exercise | answer |", "|:---|---:|"]
    for i in ids:
        ref = getattr(exercises[i], "reference", None)
        shown = "code: see solutions.ipynb"
        if callable(ref):
            try:
                shown = f"{ref():.6g}" if not isinstance(ref(), str) else ref()
            except TypeError:
                pass
        answers.append(f"| {i} | {shown} |")
    (out / "answers.md").write_text("\n".join(answers) + "\n")
    (out / "key.json").write_text(json.dumps(
        {"format": KEY_FORMAT, "title": title, "students": students,
         "secret_check": key.secret_check,
         "exercises": [{"id": it.id, "answer": it.answer, "points": it.points,
                        "variant": it.variant} for it in key.items]}, indent=1) + "\n")
    import nbformat.v4 as v4

    sol_cells = [v4.new_markdown_cell(f"# {title}: worked solutions (the chapter's numbers)")]
    for ch in chapters:
        try:
            sol = chapter_notebook(root, ch, "solutions")
        except FileNotFoundError:
            continue
        for i in ids:
            if int(i.split(".")[0]) == ch:
                try:
                    sol_cells += exercise_block(sol, i, _SOLUTION)
                except ValueError:
                    sol_cells.append(v4.new_markdown_cell(f"(No worked solution of {i}.)"))
    sol_cells = [_clean(c) if c.cell_type != "code" else c for c in sol_cells]
    for n, c in enumerate(sol_cells):
        c["id"] = f"cell-{n:03d}"
    nb = v4.new_notebook(cells=sol_cells)
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python",
                                  "name": "python3"}}
    nbformat.write(nb, out / "solutions.ipynb")
    return key


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalebook.assign",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("ids", nargs="+", help="exercise ids, e.g. 1.1 1.4 3.2")
    parser.add_argument("--title", default="Assignment")
    parser.add_argument("--out", default="assignment", help="output folder (assignment/)")
    parser.add_argument("--students", help="a roster file: one student id a line")
    parser.add_argument("--student", action="append", default=[], help="a student id (repeat)")
    parser.add_argument("--secret-file", help="the instructor's secret (else $SCALEBOOK_SECRET)")
    parser.add_argument("--no-variants", action="store_true", help="everyone gets the chapter's numbers")
    parser.add_argument("--points", help="points per exercise: 1.1=2,1.9=3 (default 1 each)")
    parser.add_argument("--book", help="the book's checkout (default: this package's)")
    args = parser.parse_args(argv)
    students = list(args.student)
    if args.students:
        students += [ln.strip() for ln in Path(args.students).read_text().splitlines()
                     if ln.strip() and not ln.startswith("#")]
    try:
        key = build_assignment(args.ids, args.out, title=args.title, students=students,
                               secret=read_secret(args.secret_file),
                               variants=not args.no_variants, points=args.points, book=args.book)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    varied = [i.id for i in key.items if i.variant]
    made = (f"{len(students)} student notebooks in {args.out}/students/" if varied
            else f"{args.out}/assignment.ipynb")
    print(f"{made}; key: {args.out}/key.json; answers: {args.out}/answers.md"
          + (f"; variants for {', '.join(varied)}" if varied else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
