"""The package's layout: the docstring index is complete and true, no import cycles, no JAX
on ``import scalebook``, and every subpackage is installed."""

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import scalebook

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(m.name for m in pkgutil.iter_modules(scalebook.__path__))


def _index_lines():
    doc = scalebook.__doc__
    return doc.split("Formula or task -> function::", 1)[1].strip().splitlines()


def test_every_module_is_listed_in_the_package_docstring():
    listed = set(re.findall(r"^  (\w+)\s{2,}", scalebook.__doc__.split("Formula or task")[0], re.M))
    assert listed == set(MODULES), f"not listed: {set(MODULES) - listed}; listed but missing: {listed - set(MODULES)}"


@pytest.mark.parametrize("line", _index_lines())
def test_every_function_in_the_formula_index_exists(line):
    """Each 'mod.name[.attr]' resolves; a bare name after ' / ' belongs to the same owner."""
    refs = re.findall(r"(?<![\w.])([a-z_]+(?:\.[A-Za-z_]\w*)+)", line.split("  ")[-1])
    assert refs, f"index line names no function: {line!r}"
    owner = None
    for ref in refs:
        mod, *attrs = ref.split(".")
        obj = importlib.import_module(f"scalebook.{mod}")
        for a in attrs[:-1]:
            obj = getattr(obj, a)
        assert hasattr(obj, attrs[-1]), f"{ref} does not exist ({line.strip()})"
        owner = obj
    for extra in re.findall(r"/ ([a-z_]\w*)\b", line):
        assert hasattr(owner, extra), f"{extra} does not exist ({line.strip()})"


def test_import_scalebook_does_not_import_jax():
    code = "import sys, scalebook; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", MODULES)
def test_each_module_imports_alone(name):
    """A fresh interpreter imports each module first: an import cycle would fail here."""
    code = f"import scalebook.{name}"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def test_every_subpackage_is_installed_by_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'include = ["scalebook", "scalebook.*"]' in text
    subpackages = [p.parent.relative_to(ROOT).as_posix().replace("/", ".")
                   for p in (ROOT / "scalebook").rglob("__init__.py")]
    from setuptools import find_packages
    found = set(find_packages(str(ROOT), include=["scalebook", "scalebook.*"]))
    assert set(subpackages) <= found


def test_every_module_has_its_api_page_in_the_table_of_contents():
    """One page per module, book/api/<module>.md, documenting it; each in _toc.yml."""
    pages = {p.stem: p.read_text() for p in (ROOT / "book" / "api").glob("*.md")}
    missing = sorted(set(MODULES) - set(pages))
    assert not missing, f"add book/api/<module>.md (and its line in _toc.yml) for: {missing}"
    toc = (ROOT / "_toc.yml").read_text()
    for name in MODULES:
        assert f".. automodule:: scalebook.{name}\n" in pages[name], name
        assert f"- file: book/api/{name}\n" in toc, f"book/api/{name}.md is not in _toc.yml"
