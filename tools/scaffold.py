"""Scaffolding for authors: a new chapter, or a new exercise in a chapter.

    .venv/bin/python tools/scaffold.py chapter 5 parallelism "Parallelism for training"
    .venv/bin/python tools/scaffold.py exercise 5.3 "The FSDP all-gather" --kind numeric

``chapter`` writes the chapter's notebook pair, its solutions pair, the exercise-check file
``scalebook/exercises/chNN.py``, the test file ``tests/test_exercises_chNN.py``, and adds both
notebooks to _toc.yml. ``exercise`` appends, in the right places, the statement cell and the
answer cell (chapter), the solution cells (solutions), a check stub (chNN.py) and a test stub.

The stubs are deliberately unfinished: the check's reference raises NotImplementedError and
the test stub fails, so a scaffolded exercise cannot pass the test suite until it is written.
Nothing is overwritten: each command refuses if what it would create exists already.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

HEADER = """---
jupytext:
  formats: ipynb,md:myst
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3 (ipykernel)
  language: python
  name: python3
---
"""

KINDS = ("numeric", "choice", "code")


def _chapter_files(chapter: int, root: Path = ROOT):
    found = sorted((root / "notebooks").glob(f"{chapter:02d}_*.md"))
    if not found:
        raise SystemExit(f"no chapter {chapter}: make it with 'tools/scaffold.py chapter {chapter} "
                         f"<slug> <title>'")
    nb = found[0]
    return nb, root / "solutions" / nb.name, root / "scalebook" / "exercises" / f"ch{chapter:02d}.py", \
        root / "tests" / f"test_exercises_ch{chapter:02d}.py"


def _refuse_existing(paths) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        raise SystemExit("refusing to overwrite: " + ", ".join(existing))


def new_chapter(chapter: int, slug: str, title: str, root: Path = ROOT, sync: bool = True) -> list[Path]:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", slug):
        raise SystemExit(f"slug must be lower-case letters, digits and _; got {slug!r}")
    name = f"{chapter:02d}_{slug}"
    nb = root / "notebooks" / f"{name}.md"
    sol = root / "solutions" / f"{name}.md"
    checks = root / "scalebook" / "exercises" / f"ch{chapter:02d}.py"
    tests = root / "tests" / f"test_exercises_ch{chapter:02d}.py"
    _refuse_existing([nb, sol, checks, tests, nb.with_suffix(".ipynb"), sol.with_suffix(".ipynb")])
    nb.write_text(HEADER + f"""
# {chapter}. {title}

The practitioner's question this chapter answers.

**What you will learn**

* ...

```{{code-cell}}
from scalebook.exercises import check
```

## {chapter}.1 First section

+++

## Summary

* ...

## Exercises

Write each answer in the cell under the exercise, replacing `...`, then run the cell. Worked
solutions are in the [solutions to chapter {chapter}](../solutions/{name}.ipynb).
""")
    sol.write_text(HEADER + f"""
# Solutions: {chapter}. {title}

Worked solutions to the exercises of [chapter {chapter}](../notebooks/{name}.ipynb).

```{{code-cell}}
from scalebook.exercises import check
```
""")
    checks.write_text(f'''"""Chapter {chapter} exercises: {title.lower()}. Reference answers are computed from scalebook."""

from __future__ import annotations

from .core import register
from .kinds import ChoiceExercise, CodeExercise, NumericExercise

__all__: list[str] = []
''')
    tests.write_text(f'''"""Chapter {chapter}'s exercise checks accept right answers, reject wrong ones, and never raise.

The right answers here are worked by hand, independently of scalebook/exercises/ch{chapter:02d}.py.
What the tests require of every exercise (tests/exercise_harness.py; README, "Exercises"):

* RIGHT[id]: the answer, worked by hand here (numeric ones are also tried at 0.9 and 1.1 x
  their tolerance: accepted and rejected);
* WRONG[id]: the typical mistakes, each rejected with a hint, not a bare "wrong";
* HINTS[id]: (mistake, words its hint must contain) pairs. The first case should tell the
  typical mistakes apart (round vs ceil, a missing factor 2 vs a missing byte size); with
  all_hints=True every hint the exercise defines must be reached by one of them, so a hint
  that a more generic one always beats fails the tests;
* a code exercise: tested on at least two shapes, in a test of its own below.
"""

import pytest

from exercise_harness import standard_tests
from scalebook.exercises import evaluate

RIGHT: dict = {{}}   # id -> the right answer
WRONG: dict = {{}}   # id -> [typical wrong answers]
HINTS: dict = {{}}   # id -> [(wrong answer, words of its hint)]

globals().update(standard_tests({chapter}, RIGHT, WRONG, HINTS, all_hints=True))
''')
    _add_to_toc(root, name)
    if sync:
        import notebooks as nbtool
        for p in (nb, sol):
            nbtool.sync(p)
    return [nb, sol, checks, tests]


def _add_to_toc(root: Path, name: str) -> None:
    toc_path = root / "_toc.yml"
    toc = toc_path.read_text()
    for part, folder in (("Chapters", "notebooks"), ("Solutions", "solutions")):
        entry = f"      - file: {folder}/{name}\n"
        if entry in toc:
            continue
        m = re.search(rf"(  - caption: {part}\n(?:    .*\n)*?    chapters:\n)((?:      - file: .*\n)*)", toc)
        if not m:
            raise SystemExit(f"_toc.yml has no '{part}' part with a chapters list")
        entries = m.group(2).splitlines(keepends=True) + [entry]
        entries.sort(key=lambda e: e.split("/")[-1])
        toc = toc[:m.start(2)] + "".join(entries) + toc[m.end(2):]
    toc_path.write_text(toc)


def _answer_cell(ex_id: str, kind: str) -> str:
    var = "answer_" + ex_id.replace(".", "_")
    if kind == "code":
        fn = "your_function_" + ex_id.replace(".", "_")
        return f"```{{code-cell}}\ndef {fn}(...):\n    ...\n\n\ncheck(\"{ex_id}\", {fn})\n```\n"
    unit = '"a" or "b"' if kind == "choice" else "unit"
    return f"```{{code-cell}}\n{var} = ...  # {unit}\ncheck(\"{ex_id}\", {var})\n```\n"


def new_exercise(ex_id: str, title: str, kind: str = "numeric", root: Path = ROOT,
                 sync: bool = True) -> list[Path]:
    m = re.fullmatch(r"(\d+)\.(\d+)", ex_id)
    if not m:
        raise SystemExit(f"exercise id must be chapter.number, e.g. 5.3; got {ex_id!r}")
    if kind not in KINDS:
        raise SystemExit(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    chapter = int(m.group(1))
    nb, sol, checks, tests = _chapter_files(chapter, root)
    text = nb.read_text()
    if re.search(rf"^### Exercise {re.escape(ex_id)} ", text, re.M):
        raise SystemExit(f"exercise {ex_id} exists already in {nb}")
    if "\n## Exercises\n" not in text:
        raise SystemExit(f"{nb} has no '## Exercises' section")
    nb.write_text(text.rstrip("\n") + f"\n\n+++\n\n### Exercise {ex_id} · {title}\n\n"
                  f"The statement: what is given, what to compute, in which unit.\n\n"
                  + _answer_cell(ex_id, kind))
    sol.write_text(sol.read_text().rstrip("\n") + f"\n\n+++\n\n### Solution {ex_id}\n\n"
                   f"The reasoning, step by step.\n\n```{{code-cell}}\n"
                   f"answer_{ex_id.replace('.', '_')} = ...\ncheck(\"{ex_id}\", "
                   f"answer_{ex_id.replace('.', '_')})\n```\n")
    cls = {"numeric": "NumericExercise", "choice": "ChoiceExercise", "code": "CodeExercise"}[kind]
    extra = {"numeric": '    unit="...",\n', "choice": '    choices=("a", "b"),\n',
             "code": "    cases=[],\n"}[kind]
    checks.write_text(checks.read_text().rstrip("\n") + f'''


def _reference_{ex_id.replace(".", "_")}(*args):
    raise NotImplementedError("write the reference answer of exercise {ex_id}")


register({cls}(
    id="{ex_id}", title="{title}",
{extra}    reference=_reference_{ex_id.replace(".", "_")},
    hints=[],
))
''')
    tests.write_text(tests.read_text().rstrip("\n") + f'''


def test_{ex_id.replace(".", "_")}_is_written():
    pytest.fail("write the tests of exercise {ex_id}: its right answer worked by hand in RIGHT, "
                "its typical wrong answers in WRONG, and in HINTS each mistake with words of "
                "its hint, every hint reached (all_hints=True); a code exercise on two shapes "
                "or more (see this file's docstring)")
''')
    if sync:
        import notebooks as nbtool
        for p in (nb, sol):
            nbtool.sync(p)
    return [nb, sol, checks, tests]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tools/scaffold.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("chapter", help="a new chapter: notebooks, checks, tests, toc")
    c.add_argument("number", type=int)
    c.add_argument("slug")
    c.add_argument("title")
    e = sub.add_parser("exercise", help="a new exercise in an existing chapter")
    e.add_argument("id")
    e.add_argument("title")
    e.add_argument("--kind", default="numeric", choices=KINDS)
    args = parser.parse_args(argv)
    if args.cmd == "chapter":
        made = new_chapter(args.number, args.slug, args.title)
    else:
        made = new_exercise(args.id, args.title, args.kind)
    for p in made:
        print("wrote", p.relative_to(ROOT) if p.is_relative_to(ROOT) else p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
