"""tools/api_index.py: the API page's tables read scalebook's docstring completely, and every
name they link resolves to an object in the package (the site build, with warnings as errors,
checks that each one has an entry to link to)."""

import pkgutil
import sys
from pathlib import Path

import pytest

import scalebook

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import api_index  # noqa: E402

sys.path.pop(0)

DOC = scalebook.__doc__
MODULES = sorted(m.name for m in pkgutil.iter_modules(scalebook.__path__))


def test_the_module_table_lists_every_module_once_with_its_chapters():
    rows = api_index.modules(DOC)
    assert sorted(name for name, _, _ in rows) == MODULES
    by_name = {name: (what, chapters) for name, what, chapters in rows}
    assert by_name["roofline"][1] == "1"
    # a line indented further continues the row above it, and its chapter joins the list
    assert by_name["llama"][1] == "4, 7" and "speculative decoding" in by_name["llama"][0]
    assert all("(" not in chapters for _, chapters in by_name.values())


def test_every_line_of_the_formula_index_becomes_a_row():
    rows = api_index.formulas(DOC)
    block = DOC.split(api_index.FORMULAS_HEAD, 1)[1].strip().splitlines()
    assert len(rows) == len([ln for ln in block if ln.strip()]) > 60
    # the one line whose two columns are a single space apart
    assert ("values kept per remat policy, PCIe offload time",
            "parallelism.mlp_saved_elements / offload_time") in rows


@pytest.mark.parametrize("task, functions", api_index.formulas(DOC))
def test_each_index_entry_resolves_and_reads_as_written(task, functions):
    pieces = api_index.resolve(functions)
    assert "".join(text for text, _ in pieces) == functions
    targets = [t for _, t in pieces if t]
    assert targets, f"{task}: nothing to link in {functions!r}"
    for t in targets:
        assert t.startswith("scalebook.") and api_index._exists(t) is not None, t


def test_names_resolve_against_their_owner_then_their_module():
    got = dict(api_index.resolve("training.TrainingPlan.days_at / cost_at"))
    assert got["cost_at"] == "scalebook.training.TrainingPlan.cost_at"
    got = dict(api_index.resolve("profiling.Trace.summary (OpSummary)"))
    assert got["OpSummary"] == "scalebook.profiling.OpSummary"
    got = dict(api_index.resolve("training.evaluate_plan / TrainingPlan.breakdown"))
    assert got["TrainingPlan.breakdown"] == "scalebook.training.TrainingPlan.breakdown"
    # an argument of a call is shown, not looked up
    got = api_index.resolve("collectives.collective_time(..., sharp=True)")
    assert got[0] == ("collectives.collective_time", "scalebook.collectives.collective_time")
    assert "".join(text for text, _ in got) == "collectives.collective_time(..., sharp=True)"
    assert dict(got)["sharp"] is None and dict(got)["True"] is None
    # a module constant has no entry of its own: shown as code, not linked
    assert dict(api_index.resolve("models.MoEConfig (MIXTRAL_8X7B)"))["MIXTRAL_8X7B"] is None


def test_a_name_that_is_not_in_the_package_is_an_error():
    with pytest.raises(ValueError, match="no_such_function"):
        api_index.resolve("roofline.time_bounds / no_such_function")
