"""The book's maths uses the symbols of book/notation.md, one meaning each.

Symbols other texts overload, and that this book once used with two meanings, are retired
here: each rule below is a pattern that may not appear inside a formula ($...$ or $$...$$)
of a chapter or solutions page, with the symbol to use instead. Code cells are not read
(code may name things as it likes); the notation and references pages may quote a rule's
usual name ("often written 6ND").
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "notebooks").glob("*.md")) + sorted((ROOT / "solutions").glob("*.md"))

MATH = re.compile(r"\$\$(.+?)\$\$|\$([^$\n]+?)\$", re.S)
CODE_CELL = re.compile(r"```\{code-cell\}.*?```", re.S)

RULES = [
    (r"6\s*N\s*D\b", "training tokens are N_tok: write 6 N N_tok, not 6ND"),
    (r"H\s*/\s*K\b", "the number of key/value heads is H_kv (G = H / H_kv), not K"),
    (r"(?<![_{\\a-zA-Z])K\s*h\b", "key/value heads are H_kv: write H_kv h, not K h"),
    (r"\bB\[J", "chapter 3's second operand is W[J, K]; B is the batch"),
    (r"\\text\{seq\}|d_\{?\\(text|mathrm)\{head", "sequence length is S and head size h"),
    (r"\[\s*M\s*,\s*K\s*\]|\[\s*K\s*,\s*N\s*\]", "a matmul is X[B, D] W[D, F], not M, K, N"),
    (r"(?<![_{\\a-zA-Z'])d(?![a-zA-Z_'])", "the model width is D (a bare d is no book symbol)"),
    (r"d_\{\\(text|mathrm)\{(model|ff)\}", "write D and F, not d_model and d_ff"),
]


def formulas(path: Path):
    text = CODE_CELL.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
    for m in MATH.finditer(text):
        yield text[:m.start()].count("\n") + 1, (m.group(1) or m.group(2))


@pytest.mark.parametrize("path", PAGES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_retired_symbols(path):
    found = [f"{path.name}:{line}: {why}: ${body.strip()[:60]}$"
             for line, body in formulas(path) for pat, why in RULES if re.search(pat, body)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("formula, retired", [
    ("6ND", True), ("6 N N_{\\mathrm{tok}}", False),
    ("G = H/K", True), ("G = H / H_{\\mathrm{kv}}", False),
    ("2(Hh + Kh)", True), ("2(Hh + H_{\\mathrm{kv}} h)", False),
    ("A[I, J_Y] \\cdot B[J, K]", True), ("A[I, J_Y] \\cdot W[J, K]", False),
    ("X[M, K]", True), ("X[B, D]", False),
    ("W_{out}[d, V]", True), ("\\frac{d}{dx}", False), ("D", False),
    ("W[d_{\\text{model}}, d_{\\text{ff}}]", True), ("W[D, F]", False),
])
def test_the_rules_themselves(formula, retired):
    assert any(re.search(pat, formula) for pat, _ in RULES) == retired
