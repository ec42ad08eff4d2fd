"""The hierarchical collective (chapter 11): one model of a collective over several GPU
nodes, checked against derivations by hand, and used by every planner that times one.

By hand, for g GPUs in each of m nodes, B bytes per GPU, W_f (NVLink, all of a GPU's links)
and W_s (its own NIC):

    all-reduce      (g-1)/g B/W_f + 2(m-1)/m (B/g)/W_s + (g-1)/g B/W_f
    reduce-scatter  (g-1)/g B/W_f + (m-1)/m (B/g)/W_s
    all-gather      (m-1)/m (B/g)/W_s + (g-1)/g B/W_f
    all-to-all      (g-1)/(g m) B/W_f + (g m - g)/(g m) B/W_s
"""

import math

import pytest

from scalebook import collectives as coll
from scalebook import hardware, inference, training
from scalebook.models import get_model

H100 = hardware.get_chip("gpu-h100")
WF, WS = 18 * 25e9, 50e9          # the H100's NVLinks (one way) and its 400 Gb/s NIC


def test_the_h100_bandwidths_are_the_ones_derived_by_hand():
    assert H100.ici_bandwidth == pytest.approx(WF)
    assert H100.dcn_bandwidth == pytest.approx(WS)


@pytest.mark.parametrize("g,m", [(8, 2), (8, 16), (4, 4), (2, 128)])
def test_all_reduce_by_hand(g, m):
    B = 1.2e9
    want = 7 / 8 * B / WF if g == 8 else (g - 1) / g * B / WF
    want = 2 * want + 2 * (m - 1) / m * (B / g) / WS
    assert coll.hierarchical_time("all-reduce", B, g, m, H100) == pytest.approx(want, rel=1e-12)
    # pipelined: the NVLink pair against the NIC phase, the larger of the two
    piped = max(2 * (g - 1) / g * B / WF, 2 * (m - 1) / m * (B / g) / WS)
    assert coll.hierarchical_time("all-reduce", B, g, m, H100, pipelined=True) == \
        pytest.approx(piped, rel=1e-12)


def test_worked_example_numbers():
    # 8 nodes of 8 H100s, 1 GB per GPU: NVLink 2 x 7/8 GB / 450 GB/s = 3.889 ms; the NICs
    # 2 x 7/8 x 125 MB / 50 GB/s = 4.375 ms; in sequence 8.264 ms, pipelined 4.375 ms
    assert coll.hierarchical_time("all-reduce", 1e9, 8, 8, H100) == pytest.approx(8.2639e-3,
                                                                                 rel=1e-4)
    assert coll.hierarchical_time("all-reduce", 1e9, 8, 8, H100, pipelined=True) == \
        pytest.approx(4.375e-3, rel=1e-12)
    # a flat ring over all 64 GPUs on their NICs sends 8x the NIC bytes
    flat = coll.collective_time("all-reduce", 1e9, 64, bandwidth=WS, topology="ring")
    assert flat == pytest.approx(2 * 63 / 64 * 1e9 / WS)
    assert flat / coll.hierarchical_time("all-reduce", 1e9, 8, 8, H100, pipelined=True) > 8


@pytest.mark.parametrize("g,m", [(8, 4), (2, 3)])
def test_gather_scatter_and_all_to_all_by_hand(g, m):
    B = 3e8
    rs = (g - 1) / g * B / WF + (m - 1) / m * (B / g) / WS
    ag = (m - 1) / m * (B / g) / WS + (g - 1) / g * B / WF
    n = g * m
    a2a = (g - 1) / n * B / WF + (n - g) / n * B / WS
    for kind, want in (("reduce-scatter", rs), ("all-gather", ag), ("all-to-all", a2a)):
        assert coll.hierarchical_time(kind, B, g, m, H100) == pytest.approx(want, rel=1e-12)


def test_phases_list_the_networks_in_order():
    ph = coll.hierarchical_phases("all-reduce", 8e8, 8, 4, H100)
    assert [(p.network, p.kind, p.group) for p in ph] == [
        ("nvlink", "reduce-scatter", 8), ("nic", "all-reduce", 4), ("nvlink", "all-gather", 8)]
    assert ph[1].sent == pytest.approx(2 * 3 / 4 * 1e8)
    assert sum(p.seconds for p in ph) == pytest.approx(
        coll.hierarchical_time("all-reduce", 8e8, 8, 4, H100))


def test_one_node_and_one_gpu_per_node_are_the_flat_collectives():
    B = 5e8
    for kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
        inside = coll.collective_time(kind, B, 8, H100)
        assert coll.hierarchical_time(kind, B, 8, 1, H100) == pytest.approx(inside)
        across = coll.collective_time(kind, B, 16, bandwidth=WS, topology="switch")
        assert coll.hierarchical_time(kind, B, 1, 16, H100) == pytest.approx(across)


def test_latency_steps():
    t0 = coll.hierarchical_time("all-reduce", 1e6, 8, 4, H100)
    t1 = coll.hierarchical_time("all-reduce", 1e6, 8, 4, H100, hop_latency=1e-6)
    assert t1 - t0 == pytest.approx((2 * 7 + 2 * 3) * 1e-6)
    a0 = coll.hierarchical_time("all-to-all", 1e6, 8, 4, H100)
    a1 = coll.hierarchical_time("all-to-all", 1e6, 8, 4, H100, hop_latency=1e-6)
    assert a1 - a0 == pytest.approx(2e-6)


def test_errors_are_clear():
    with pytest.raises(ValueError, match="collective-permute"):
        coll.hierarchical_time("collective-permute", 1e6, 8, 2, H100)
    with pytest.raises(ValueError, match="more than the 8"):
        coll.hierarchical_time("all-reduce", 1e6, 16, 2, H100)
    with pytest.raises(ValueError, match="dcn_bandwidth"):
        coll.hierarchical_time("all-reduce", 1e6, 8, 2, H100.with_(dcn_bandwidth=None))
    with pytest.raises(ValueError, match="give a chip"):
        coll.hierarchical_time("all-reduce", 1e6, 8, 2)
    with pytest.raises(ValueError, match="kind must be"):
        coll.hierarchical_time("broadcast", 1e6, 8, 2, H100)
    with pytest.raises(ValueError, match="pipelined"):
        coll.hierarchical_time("all-reduce", 1e6, 8, 2, H100, pipelined="yes")
    # bandwidths given instead of a chip
    t = coll.hierarchical_time("all-reduce", 1e6, 4, 2, fast_bandwidth=1e11, slow_bandwidth=1e10)
    assert t == pytest.approx(2 * 3 / 4 * 1e6 / 1e11 + 2 * 1 / 2 * 2.5e5 / 1e10)


def test_sharp_all_reduce_in_a_switch():
    B = 1e9
    ring = coll.collective_time("all-reduce", B, 8, H100)
    sharp = coll.collective_time("all-reduce", B, 8, H100, sharp=True)
    assert sharp == pytest.approx(B / WF)
    assert ring / sharp == pytest.approx(2 * 7 / 8)
    assert coll.collective_time("all-reduce", B, 8, H100, sharp=True, hop_latency=1e-6) == \
        pytest.approx(B / WF + 2e-6)
    with pytest.raises(ValueError, match="sharp"):
        coll.collective_time("all-gather", B, 8, H100, sharp=True)
    with pytest.raises(ValueError, match="sharp"):
        coll.collective_time("all-reduce", B, 8, "tpu-v5p", sharp=True)


def test_the_inference_model_uses_it():
    # a tensor-parallel all-reduce over 16 H100s: two nodes, pipelined, hop latency included
    t = inference._tp_ar_time(H100, 4e7, 16, hop_latency=1e-6)
    assert t == pytest.approx(coll.hierarchical_time("all-reduce", 4e7, 8, 2, H100,
                                                     pipelined=True, hop_latency=1e-6))
    a = inference._a2a_time(H100, 4e7, 32, hop_latency=1e-6)
    assert a == pytest.approx(coll.hierarchical_time("all-to-all", 4e7, 8, 4, H100,
                                                     hop_latency=1e-6))


def test_the_training_planner_uses_it():
    # FSDP over 2 nodes x 8 GPUs with tp = 1: the fsdp axis spans nodes with 8 GPUs in each
    m = get_model("llama3-8b")
    plan = training.evaluate_plan(m, H100, tp=1, fsdp=16, global_batch_tokens=16 * 8192,
                                  seq_len=8192)
    deg = plan.degrees
    nets = training._layout(H100, deg)
    assert nets["fsdp"] == "dcn"
    seconds = training._timer(H100, deg, nets)
    V = 1.234e8
    for kind in ("all-gather", "reduce-scatter", "all-reduce"):
        assert seconds(kind, V, "fsdp") == pytest.approx(
            coll.hierarchical_time(kind, V, 8, 2, H100), rel=1e-12)
