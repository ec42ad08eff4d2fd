"""A code exercise whose worked answer the chapter already prints is not an exercise.

tests/test_exercise_leaks.py finds numeric answers among a chapter's printed numbers. For a
code exercise, the answer is a function: here, the body of the function that each
solutions notebook passes to ``check`` (its statements, docstring left out), with all
whitespace removed, must not appear in its chapter's code cells or their stored outputs,
whitespace removed the same way. Nor may any one ``return`` statement of that body longer
than 25 characters, the usual form of a one-line answer. (Chapter 10's exercise 10.6 once
asked for the body of section 10.4's ``mlp_block``, which this test finds.) It cannot see a
leak written with other names; those are reviewed by hand.
"""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def chapter_text(path: Path) -> str:
    """Every code cell's source and stored text output of a notebook, whitespace removed."""
    parts = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        parts.append("".join(cell["source"]))
        for out in cell.get("outputs", []):
            parts.append("".join(out.get("text", "")))
            parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return _squeeze("\n".join(parts))


def worked_answers(path: Path):
    """(exercise id, body, [return statements]) of each function a solutions notebook
    passes to check(), whitespace removed."""
    for cell in json.loads(path.read_text())["cells"]:
        src = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
        m = re.search(r'check\("([\w.]+)",\s*(\w+)\)', src)
        if not m:
            continue
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == m.group(2):
                body = [b for b in node.body if not (isinstance(b, ast.Expr) and
                                                     isinstance(b.value, ast.Constant))]
                yield (m.group(1),
                       _squeeze("\n".join(ast.get_source_segment(src, b) for b in body)),
                       [_squeeze(ast.get_source_segment(src, b)) for b in ast.walk(node)
                        if isinstance(b, ast.Return)])


@pytest.mark.parametrize("solutions", SOLUTIONS, ids=lambda p: p.stem)
def test_no_worked_code_answer_is_printed_in_its_chapter(solutions):
    chapter = ROOT / "notebooks" / solutions.name
    text = chapter_text(chapter)
    leaks = []
    for ex_id, body, returns in worked_answers(solutions):
        if body and body in text:
            leaks.append(f"{ex_id}: the whole answer ({body[:80]})")
        leaks += [f"{ex_id}: {r[:80]}" for r in returns if len(r) > 25 and r in text]
    assert not leaks, f"{chapter.name} prints the answer of a code exercise: {leaks}"


def test_the_check_finds_a_printed_answer(tmp_path):
    """A chapter that prints the answer's body is caught (the 10.6 leak, rebuilt)."""
    body = 'return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "y")'
    sol = {"cells": [{"cell_type": "code", "source": [
        "def tp_mlp(x, w1, w2):\n", f"    {body}\n", "\n", 'check("10.6", tp_mlp)']}]}
    (tmp_path / "s.ipynb").write_text(json.dumps(sol))
    chap = {"cells": [{"cell_type": "code", "outputs": [], "source": [
        "def mlp_block(x, w1, w2):\n", "    # this device's blocks\n", f"    {body}\n"]}]}
    (tmp_path / "c.ipynb").write_text(json.dumps(chap))
    ((ex_id, whole, returns),) = worked_answers(tmp_path / "s.ipynb")
    assert ex_id == "10.6" and whole in chapter_text(tmp_path / "c.ipynb")
    assert returns[0] in chapter_text(tmp_path / "c.ipynb")
