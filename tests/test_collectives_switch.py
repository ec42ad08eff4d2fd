"""Collective times on an NVSwitch GPU node and on an axis of two chips (scalebook.collectives)."""

import pytest

from scalebook import collectives, roofline
from scalebook.hardware import get_chip

# H100 SXM: 18 NVLink 4 links of 25 GB/s each way (900 GB/s both ways, NVIDIA's DGX H100
# page), 8 GPUs behind NVSwitch in a node. Written out here, not read from the code.
H100_EGRESS = 18 * 25e9


@pytest.mark.parametrize("kind,factor", [("all-gather", 7 / 8), ("reduce-scatter", 7 / 8),
                                         ("all-reduce", 2 * 7 / 8), ("all-to-all", 7 / 8),
                                         ("collective-permute", 1.0)])
def test_a_gpu_node_sends_through_all_its_nvlinks(kind, factor):
    V = 1e9
    assert collectives.collective_time(kind, V, 8, "gpu-h100") == pytest.approx(
        factor * V / H100_EGRESS)
    assert collectives.is_switched("gpu-h100") and not collectives.is_switched("tpu-v5p")


def test_the_old_one_link_torus_answer_is_refused_for_a_gpu():
    with pytest.raises(ValueError, match="NVSwitch.*topology='switch'"):
        collectives.collective_time("all-reduce", 1e9, 8, "gpu-h100", topology="torus")
    # Given a bandwidth, the chip is not consulted: any network can be timed.
    assert collectives.collective_time("all-reduce", 1e9, 8, "gpu-h100", bandwidth=1e9,
                                       topology="ring") == pytest.approx(2 * 7 / 8)


def test_a_group_beyond_one_nvlink_domain_says_to_use_the_scale_out_network():
    with pytest.raises(ValueError, match=r"NVLink domain of 8.*dcn_bandwidth"):
        collectives.collective_time("all-gather", 1e9, 16, "gpu-h100")
    with pytest.raises(ValueError, match="NVLink domain"):
        collectives.collective_time("all-gather", 1e9, (2, 8), "gpu-b200")


def test_a_group_beyond_one_nvlink_domain_is_pointed_to_the_hierarchical_collective():
    """Not to a flat ring on the cards, which would be ~8x slower (chapter 11.3): the
    message names hierarchical_time with the split of the group into nodes."""
    with pytest.raises(ValueError, match=r"hierarchical_time\('all-reduce', nbytes, 8, 2, "
                                         r"'gpu-h100'\)") as e:
        collectives.collective_time("all-reduce", 1e9, 16, "gpu-h100")
    assert "topology='ring'" not in str(e.value)
    with pytest.raises(ValueError, match=r"nbytes, local, nodes"):
        collectives.collective_time("all-reduce", 1e9, 12, "gpu-h100")


def test_switch_latency_steps_and_crossover():
    assert collectives.latency_steps("all-to-all", 8, "switch") == 1
    assert collectives.latency_steps("all-gather", 8, "switch") == 7
    # crossover: 7 hops of 1 us against 7/8 V / W  ->  V = 8 W t_hop
    got = collectives.latency_bound_bytes("all-gather", 8, "gpu-h100", hop_latency=1e-6)
    assert got == pytest.approx(8 * H100_EGRESS * 1e-6)


@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter", "all-reduce", "all-to-all"])
def test_a_torus_axis_of_two_chips_has_one_link_not_two(kind):
    ring = collectives.collective_time(kind, 1e8, 2, "tpu-v5p", topology="ring")
    torus = collectives.collective_time(kind, 1e8, 2, "tpu-v5p", topology="torus")
    assert torus == ring
    # ... and an axis of 4 does halve it
    assert collectives.collective_time(kind, 1e8, 4, "tpu-v5p", topology="torus") < \
        collectives.collective_time(kind, 1e8, 4, "tpu-v5p", topology="ring")


@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-v5p", "tpu-v6e"])
def test_two_chips_one_answer_chapter_1_and_chapter_3_models_agree(chip):
    # Chapter 1: D >= (n - 1) s C / W for the split contraction on n = 2 chips, one link.
    d1 = roofline.min_contraction_to_hide_comm(chip, n_chips=2)
    # Chapter 3: the torus all-reduce of [B, F] (per unit of B F) against 2 B D F / (n C).
    s = 2
    c = get_chip(chip)
    d3 = collectives.collective_time("all-reduce", s, 2, chip) / (2 / (2 * c.bf16_flops))
    assert d3 == pytest.approx(d1)


def test_links_per_device_is_the_one_rule_behind_every_bandwidth():
    from scalebook import collectives as co
    from scalebook import parallelism as par
    from scalebook.hardware import get_chip
    assert [co.links_per_device("torus", n) for n in (2, 3, 16, None)] == [1, 2, 2, 2]
    assert {co.links_per_device(t, 16) for t in ("ring", "switch")} == {1}
    v5p = get_chip("tpu-v5p")
    for n in (2, 4, 16):      # the time of an all-gather uses exactly those links
        want = co.ring_bytes("all-gather", 1e6, n) / (v5p.ici_link_bandwidth
                                                      * co.links_per_device("torus", n))
        assert co.collective_time("all-gather", 1e6, n, v5p) == want
    # and so does chapter 5's DP threshold: an axis of 2 gets half a torus axis's bandwidth
    b2, b4 = (par.data_parallel_critical_batch(v5p, n) for n in (2, 4))
    assert b2 / b4 == pytest.approx(((2 - 1) / 2 / 1) / ((4 - 1) / 4 / 2))   # (n-1)/n / links
