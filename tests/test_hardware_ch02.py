"""The hardware fields chapter 2 added: every chip handles them, every figure has a source."""

import pytest

from scalebook import hardware
from scalebook.hardware import SOURCES, all_chips, get_chip

NEW_FIELDS = ["tensorcores", "mxus_per_core", "mxu_size", "vmem_bytes", "chips_per_host",
              "ici_domain_chips", "max_slice_chips", "vector_flops"]


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


@pytest.mark.parametrize("chip", all_chips(), ids=lambda c: c.name)
def test_a_slice_fits_in_its_pod_and_the_vector_unit_is_slower_than_the_matrix_units(chip):
    if chip.max_slice_chips is not None:
        assert chip.chips_per_host <= chip.max_slice_chips <= chip.ici_domain_chips
    if chip.vector_flops is not None:
        assert chip.vector_flops < chip.bf16_flops / 10


def test_the_v5p_pod_is_bigger_than_its_largest_slice():
    # Cloud TPU v5p page: 8,960 chips per pod; the largest slice is 16x16x24 = 6,144 chips.
    v5p = get_chip("tpu-v5p")
    assert (v5p.ici_domain_chips, v5p.max_slice_chips) == (8960, 16 * 16 * 24)


def test_every_gpu_publishes_a_vector_peak():
    for chip in all_chips():
        if chip.vendor == "NVIDIA":
            assert chip.vector_flops is not None, chip.name


# Pod peaks as Google's pages state them (bf16, FLOP/s), with the precision they are given
# in: the chip figures times the pod size must agree (chapter 2 prints the products).
POD_PEAKS = {"tpu-v4": (1.1e18, 0.05),       # cloud-v4: "1.1 exaflops (bf16 or int8)"
             "tpu-v5e": (50.63e15, 0.01),    # cloud-v5e: "BF16 peak compute per Pod 50.63 PFLOPs"
             "tpu-v6e": (234.9e15, 0.01)}    # cloud-v6e: "234.9 PFLOPs"


@pytest.mark.parametrize("name", sorted(POD_PEAKS))
def test_pod_peak_is_chips_times_the_chip_peak(name):
    chip = get_chip(name)
    stated, rel = POD_PEAKS[name]
    assert chip.ici_domain_chips * chip.bf16_flops == pytest.approx(stated, rel=rel)


def test_the_v5e_hbm_figure_and_the_current_pages_800_gibps():
    # cloud-v5e-2025 says "800 GiBps"; the earlier page says 819 GBps. 800 x 1024 MB/s is
    # 819.2 GB/s, the stored figure; 800 x 2**30 would be 5% more. See book/hardware.md.
    bw = get_chip("tpu-v5e").hbm_bandwidth
    assert bw == pytest.approx(800 * 1024 * 1e6, rel=1e-3)
    assert 800 * 2**30 / bw - 1 == pytest.approx(0.049, abs=0.002)
