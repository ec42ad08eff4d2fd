"""Chapter 2's chip-internals formulas: implied clocks, the MXU operation, weight streaming."""

import math

import jax
import jax.numpy as jnp
import pytest

from scalebook import chip_internals as ci
from scalebook import hardware
from scalebook.roofline import critical_batch

# Clock rates stated in a source (not by Google's Cloud pages): chip -> (Hz, bib key).
STATED_CLOCKS = {"tpu-v4": (1.05e9, "tpuv4"),                 # TPU v4 paper: 1050 MHz
                 "tpu-v5p": (1.75e9, "scaling-book-vpu")}     # "about 1.75GHz"


@pytest.mark.parametrize("name", [c.name for c in hardware.all_chips() if c.vendor == "Google"])
def test_peak_is_mxus_times_cells_times_two_times_the_clock(name):
    chip = hardware.get_chip(name)
    clock = ci.implied_clock(chip)
    peak = 2 * ci.mxu_count(chip) * chip.mxu_size ** 2 * clock
    assert peak == pytest.approx(chip.bf16_flops, rel=1e-12)
    assert 0.9e9 < clock < 2.0e9, f"{name}: implied clock {clock:.3g} Hz is implausible"
    if name in STATED_CLOCKS:
        assert clock == pytest.approx(STATED_CLOCKS[name][0], rel=0.01)


def test_two_mxus_per_core_would_put_v6e_at_twice_the_v5p_clock():
    # The caveat on v6e's MXU count: the page's other figure, 2, implies 3.5 GHz.
    v6e = hardware.get_chip("tpu-v6e")
    two = ci.implied_clock(v6e.with_(mxus_per_core=2))
    assert two == pytest.approx(2 * STATED_CLOCKS["tpu-v5p"][0], rel=0.01)
    assert ci.implied_clock(v6e) == pytest.approx(STATED_CLOCKS["tpu-v5p"][0], rel=0.01)


@pytest.mark.parametrize("name", ["tpu-v5e", "tpu-v6e"])
def test_mxu_operation_cadence_gives_one_mxus_share_of_the_peak(name):
    op = ci.mxu_operation(name)
    assert (op.rows, op.cycles) == (8, 8) and op.size == hardware.get_chip(name).mxu_size
    assert op.flops == 2 * 8 * op.size ** 2
    assert op.flops_per_cycle * ci.implied_clock(name) == pytest.approx(ci.mxu_peak_flops(name))


def test_weight_stream_batch_is_the_critical_batch_when_activations_are_negligible():
    v5e = hardware.get_chip("tpu-v5e")
    for bandwidth in (v5e.hbm_bandwidth, v5e.vmem_bandwidth, v5e.pcie_bandwidth):
        want = ci.weight_stream_batch(v5e, bandwidth)
        assert want == pytest.approx(2 * v5e.bf16_flops / (2 * bandwidth))
        # critical_batch counts activation bytes too; with huge D = F they do not matter.
        chip = v5e.with_(hbm_bandwidth=bandwidth)
        assert critical_batch(2**22, 2**22, chip) == pytest.approx(want, rel=0.01, abs=1)


def test_weight_stream_batch_errors():
    with pytest.raises(ValueError):
        ci.weight_stream_batch("tpu-v5e", 0)
    with pytest.raises(ValueError):
        ci.weight_stream_batch("tpu-v5e", -1.0)


def test_the_flops_and_weight_bytes_behind_weight_stream_batch_match_what_xla_compiles():
    # B = s_w C / (2 W) rests on 2 B D F FLOPs and s_w D F weight bytes: check both.
    B, D, F = 16, 256, 512
    x = jnp.ones((B, D), jnp.bfloat16)
    w = jnp.ones((D, F), jnp.bfloat16)
    cost = jax.jit(jnp.dot).lower(x, w).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    assert cost["flops"] == 2 * B * D * F
    assert cost["bytes accessed"] == 2 * (B * D + D * F + B * F)
    assert math.isclose(2 * D * F / cost["bytes accessed"], 1, rel_tol=0.1)


def test_a_slice_cannot_be_larger_than_the_largest_slice_even_inside_the_pod():
    from scalebook import topology
    assert topology.slice_info("tpu-v5p", "16x16x24").chips == 6144
    with pytest.raises(ValueError, match="largest tpu-v5p slice"):
        topology.slice_info("tpu-v5p", "16x16x32")        # 8,192 chips: fits the pod, not a slice
