"""The hardware fields chapter 2 added: every chip handles them, every figure has a source."""

import pytest

from scalebook import hardware
from scalebook.hardware import SOURCES, all_chips, get_chip

NEW_FIELDS = ["tensorcores", "mxus_per_core", "mxu_size", "vmem_bytes", "chips_per_host",
              "ici_domain_chips"]


@pytest.mark.parametrize("chip", all_chips(), ids=lambda c: c.name)
def test_every_published_figure_has_a_known_source(chip):
    for f in NEW_FIELDS:
        value = getattr(chip, f)
        if value is not None:
            assert f in chip.sources, f"{chip.name}.{f} has a value but no source"
            assert chip.sources[f] in SOURCES
            assert chip.source(f) == SOURCES[chip.sources[f]]
        else:
            assert f not in chip.sources, f"{chip.name}.{f} is None but cites a source"


@pytest.mark.parametrize("chip", all_chips(), ids=lambda c: c.name)
def test_tpus_have_mxus_and_gpus_do_not(chip):
    mxu = [chip.tensorcores, chip.mxus_per_core, chip.mxu_size]
    if chip.vendor == "Google":
        assert all(isinstance(v, int) and v > 0 for v in mxu)
        assert chip.mxu_size in (128, 256)
    else:
        assert mxu == [None, None, None]
    assert isinstance(chip.chips_per_host, int) and chip.chips_per_host > 0
    assert isinstance(chip.ici_domain_chips, int) and chip.ici_domain_chips >= chip.chips_per_host


def test_v6e_has_the_larger_mxu():
    assert get_chip("tpu-v6e").mxu_size == 2 * get_chip("tpu-v5e").mxu_size


def test_vmem_is_far_smaller_than_hbm():
    c = get_chip("tpu-v5e")
    assert c.vmem_bytes < c.hbm_bytes / 50


def test_spec_table_accepts_new_columns():
    rows = hardware.spec_table(["tpu-v5e", "gpu-h100"], ["mxu_size", "chips_per_host"])
    assert rows[0]["mxu_size"] == 128 and rows[1]["mxu_size"] is None
