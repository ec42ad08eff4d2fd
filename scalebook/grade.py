"""Grade a folder of filled-in chapter notebooks.

    python -m scalebook.grade submissions/ [--stored] [--csv grades.csv]

Each notebook is re-run from the top in a fresh kernel (so a grade reflects the code, not
outputs edited by hand) and the lines printed by the exercise checks are collected. With
``--stored`` the notebooks are not run and their saved outputs are read instead, which is
fast but trusts the file. A student's cell that raises does not stop the run; exercises
after it are graded as they come out.

Re-running executes the students' code: do it in a sandbox you are happy to run it in.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .exercises.core import MARKS, STATUSES, parse_results

__all__ = ["Report", "grade_notebook", "grade_paths", "main"]



@dataclass
class Report:
    path: Path
    results: dict = field(default_factory=dict)      # exercise id -> (status, message)
    error: str | None = None

    @property
    def correct(self) -> int:
        return sum(1 for status, _ in self.results.values() if status == "correct")


def _outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
    return "".join(parts)


def grade_notebook(path, run: bool = True, timeout: int = 600, kernel_name: str = "python3") -> Report:
    """Grade one notebook: re-run it (default) or read its stored outputs."""
    import nbformat

    path = Path(path)
    report = Report(path)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # not a notebook, broken JSON: report, keep grading the others
        report.error = f"cannot read notebook: {type(e).__name__}: {e}"
        return report
    if run:
        from nbclient import NotebookClient

        client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, allow_errors=True,
                                resources={"metadata": {"path": str(path.parent)}})
        try:
            client.execute()
        except Exception as e:
            report.error = f"run stopped: {type(e).__name__}: {e}"
    for result in parse_results(_outputs_text(nb)):
        report.results[result.exercise_id] = (result.status, result.message)
    return report


def grade_paths(paths, run: bool = True, timeout: int = 600) -> list[Report]:
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(q for q in p.rglob("*.ipynb") if ".ipynb_checkpoints" not in q.parts)
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")
    return [grade_notebook(f, run=run, timeout=timeout) for f in files]


def _key(ex_id: str):
    return tuple(int(x) for x in ex_id.split("."))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scalebook.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", help="notebooks or folders of notebooks")
    parser.add_argument("--stored", action="store_true", help="read saved outputs instead of re-running")
    parser.add_argument("--csv", help="also write the grades to this CSV file")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = parser.parse_args(argv)
    try:
        reports = grade_paths(args.paths, run=not args.stored, timeout=args.timeout)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 2
    ids = sorted({i for r in reports for i in r.results}, key=_key)
    short = {status: MARKS[status] for status in STATUSES}
    print(f"{'notebook':<40} {'correct':>7}  " + " ".join(f"{i:>5}" for i in ids))
    for r in reports:
        marks = " ".join(f"{short[r.results[i][0]] if i in r.results else '?':>5}" for i in ids)
        print(f"{str(r.path)[-40:]:<40} {r.correct:>7}  {marks}" + (f"   ({r.error})" if r.error else ""))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["notebook", "correct"] + ids + ["error"])
            for r in reports:
                w.writerow([str(r.path), r.correct] + [r.results.get(i, ("missing",))[0] for i in ids]
                           + [r.error or ""])
    return 0


if __name__ == "__main__":
    sys.exit(main())
