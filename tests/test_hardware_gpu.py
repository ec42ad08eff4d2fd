"""The inside of the GPUs (chapter 11): SMs x clock x per-SM rate gives the datasheet's
peaks, every figure has a source, TPUs have none of these fields, and the previews hold."""

import math

import pytest

from scalebook import hardware
from scalebook.hardware import GPU_FIELDS, SOURCES, all_chips, get_chip, preview_chip

GPUS_WITH_CLOCKS = ["gpu-a100", "gpu-h100", "gpu-h200"]


@pytest.mark.parametrize("name", GPUS_WITH_CLOCKS)
def test_tensor_peak_is_sms_times_rate_times_clock(name):
    c = get_chip(name)
    derived = c.sm_count * c.tensor_flops_per_sm_clock * c.tensor_clock
    assert derived == pytest.approx(c.bf16_flops, rel=1e-3), (name, derived)


@pytest.mark.parametrize("name", GPUS_WITH_CLOCKS)
def test_vector_peak_is_cores_times_two_times_boost_clock(name):
    c = get_chip(name)
    derived = c.sm_count * c.cuda_cores_per_sm * 2 * c.boost_clock
    assert derived == pytest.approx(c.vector_flops, rel=2e-3), (name, derived)


def test_per_sm_rate_doubles_from_ampere_to_hopper():
    assert get_chip("gpu-h100").tensor_flops_per_sm_clock == \
        2 * get_chip("gpu-a100").tensor_flops_per_sm_clock
    # four Tensor Cores per SM: 1,024 dense bf16 FLOPs per Tensor Core per clock on Hopper
    h = get_chip("gpu-h100")
    assert h.tensor_flops_per_sm_clock // h.tensor_cores_per_sm == 1024


def test_h100_tensor_clock_is_below_its_boost_clock():
    h = get_chip("gpu-h100")
    assert h.tensor_clock < h.boost_clock
    assert get_chip("gpu-a100").tensor_clock == get_chip("gpu-a100").boost_clock


def test_b200_publishes_no_clock_and_its_implied_clock_is_plausible():
    b = get_chip("gpu-b200")
    assert b.tensor_clock is None and b.tensor_flops_per_sm_clock is None
    # if its SM does twice the Hopper SM's work per clock, its peak implies ~1.86 GHz
    implied = b.bf16_flops / (b.sm_count * 2 * get_chip("gpu-h100").tensor_flops_per_sm_clock)
    assert 1.7e9 < implied < 2.0e9
    # its FP32 figure implies a boost clock near the H100's
    vec_clock = b.vector_flops / (b.sm_count * b.cuda_cores_per_sm * 2)
    assert vec_clock == pytest.approx(get_chip("gpu-h100").boost_clock, rel=0.01)


@pytest.mark.parametrize("chip", all_chips(), ids=lambda c: c.name)
def test_gpu_fields_have_sources_and_tpus_have_none(chip):
    for f in GPU_FIELDS:
        value = getattr(chip, f)
        if chip.vendor == "Google":
            assert value is None, (chip.name, f)
        if value is not None:
            assert chip.sources[f] in SOURCES
            assert chip.source(f) == SOURCES[chip.sources[f]]
            assert value > 0
        else:
            assert f not in chip.sources


@pytest.mark.parametrize("name", ["gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200"])
def test_on_chip_memory_is_binary_and_sensible(name):
    c = get_chip(name)
    assert c.register_bytes_per_sm == 65536 * 4            # 64K 32-bit registers
    assert c.smem_bytes_per_sm % 1024 == 0
    if c.l1_bytes_per_sm:
        assert c.smem_bytes_per_sm < c.l1_bytes_per_sm
    if c.l2_bytes:
        assert c.l2_bytes < c.hbm_bytes / 1000


def test_h100_memory_the_device_reports():
    reported, key = hardware.DEVICE_REPORTED_HBM["gpu-h100"]
    assert key in SOURCES
    assert reported == 81_559 * 2**20
    h = get_chip("gpu-h100")
    assert h.hbm_bytes == 80e9 < reported < 80 * 2**30
    assert "81,559 MiB" in h.notes


def test_gb200_preview():
    g = preview_chip("gpu-gb200")
    assert "gpu-gb200" not in hardware.chip_names()
    assert g.ici_domain_chips == 72 and g.max_slice_chips == 72
    assert g.bf16_flops == pytest.approx(2.5e15)
    assert g.ici_bandwidth == pytest.approx(get_chip("gpu-b200").ici_bandwidth)
    assert g.hbm_bytes == pytest.approx(186e9)
    for figure in hardware.PREVIEW_CONFIDENCE["gpu-gb200"]:
        assert g.source(figure)
    assert math.isclose(72 * 2 * g.ici_bandwidth, 129.6e12)    # NVIDIA's "130 TB/s"


def test_h800_preview_source_resolves():
    assert "DeepSeek-V3" in preview_chip("gpu-h800").source("ici_links")
