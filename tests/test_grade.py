"""Grading a folder of submissions: re-run notebooks, collect the check lines."""

import json
from pathlib import Path

import pytest

from scalebook import grade

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "notebooks" / "01_rooflines.ipynb"


def submission(tmp_path, name, answers):
    """A copy of chapter 1 with some answer cells filled in, e.g. {"1.2": "1/6"}."""
    nb = json.loads(CHAPTER.read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        for ex, code in answers.items():
            var = "answer_" + ex.replace(".", "_")
            if cell["cell_type"] == "code" and src.startswith(f"{var} = ..."):
                cell["source"] = src.replace(f"{var} = ...", f"{var} = {code}", 1)
    path = tmp_path / name
    path.write_text(json.dumps(nb))
    return path


def test_rerun_grades_what_the_code_does(tmp_path):
    submission(tmp_path, "alice.ipynb", {"1.2": "1 / 6", "1.3": "295", "1.8": '"memory"'})
    # Bob's stored outputs claim success, but his code raises: re-running finds out.
    bob = submission(tmp_path, "bob.ipynb", {"1.2": "1 / 0"})
    data = json.loads(bob.read_text())
    for cell in data["cells"]:
        if "answer_1_2 = 1 / 0" in "".join(cell["source"]):
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "✔ Exercise 1.2: correct.\n"}]
    bob.write_text(json.dumps(data))
    reports = {r.path.name: r for r in grade.grade_paths([tmp_path])}
    alice, bob_r = reports["alice.ipynb"], reports["bob.ipynb"]
    assert alice.correct == 2
    assert alice.results["1.3"][0] == "wrong" and alice.results["1.1"][0] == "not attempted"
    assert len(alice.results) == 10
    assert bob_r.correct == 0 and "1.2" not in bob_r.results    # that cell raised; others still ran
    assert bob_r.results["1.3"][0] == "not attempted"


def test_stored_mode_and_cli(tmp_path, capsys):
    path = ROOT / "solutions" / "01_rooflines.ipynb"
    out_csv = tmp_path / "g.csv"
    assert grade.main([str(path), "--stored", "--csv", str(out_csv)]) == 0
    printed = capsys.readouterr().out
    assert "01_rooflines.ipynb" in printed and " 10 " in printed
    rows = out_csv.read_text().splitlines()
    assert rows[0].startswith("notebook,correct,1.1,1.2") and ",10," in rows[1]


def test_bad_paths(tmp_path, capsys):
    assert grade.main([str(tmp_path / "missing")]) == 2
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{not json")
    report = grade.grade_notebook(broken, run=False)
    assert report.error and "cannot read notebook" in report.error
