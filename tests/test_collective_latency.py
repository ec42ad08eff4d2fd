"""The per-hop latency term of scalebook.collectives (chapter 7): the default keeps chapter
3's bandwidth-only times, the steps of each algorithm, and the latency-bound buffer size."""

import math

import pytest

from scalebook import collectives
from scalebook.hardware import get_chip

KINDS = collectives.KINDS


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("topology", ["ring", "torus"])
@pytest.mark.parametrize("axes", [1, 4, 8, 16])
def test_default_latency_keeps_the_bandwidth_only_time(kind, topology, axes):
    t0 = collectives.collective_time(kind, 3e6, axes, "tpu-v5p", topology=topology)
    t1 = collectives.collective_time(kind, 3e6, axes, "tpu-v5p", topology=topology,
                                     hop_latency=0.0)
    assert t0 == t1


@pytest.mark.parametrize("kind,n,topology,steps", [
    ("all-gather", 8, "torus", 7), ("reduce-scatter", 8, "ring", 7), ("all-reduce", 8, "torus", 14),
    ("collective-permute", 8, "torus", 1), ("all-to-all", 8, "torus", 4),
    ("all-to-all", 8, "ring", 7), ("all-to-all", 5, "torus", 2), ("all-gather", 1, "torus", 0),
])
def test_latency_steps(kind, n, topology, steps):
    assert collectives.latency_steps(kind, n, topology) == steps


def test_latency_steps_over_two_axes_add_up():
    assert collectives.latency_steps("all-gather", (4, 8)) == 3 + 7
    assert collectives.latency_steps("all-reduce", (4, 8)) == 2 * (3 + 7)
    assert collectives.latency_steps("all-gather", (1, 8)) == 7


@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter", "all-reduce", "collective-permute"])
def test_latency_adds_steps_times_hop(kind):
    t_hop = 1e-6
    base = collectives.collective_time(kind, 1e5, 16, "tpu-v5e")
    with_lat = collectives.collective_time(kind, 1e5, 16, "tpu-v5e", hop_latency=t_hop)
    assert with_lat == pytest.approx(base + collectives.latency_steps(kind, 16) * t_hop)


def test_latency_bound_bytes_all_gather_torus_closed_form():
    # bandwidth term (n-1)/n V / (2W) equals latency (n-1) t_hop  =>  V* = 2 n W t_hop
    W, n, t_hop = 5e10, 16, 1e-6
    got = collectives.latency_bound_bytes("all-gather", n, bandwidth=W, hop_latency=t_hop)
    assert got == pytest.approx(2 * n * W * t_hop)
    # one-way ring: V* = n W t_hop
    got = collectives.latency_bound_bytes("all-gather", n, bandwidth=W, hop_latency=t_hop,
                                          topology="ring")
    assert got == pytest.approx(n * W * t_hop)


@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter", "all-reduce", "all-to-all",
                                  "collective-permute"])
def test_at_the_crossover_both_terms_are_equal(kind):
    chip = get_chip("tpu-v5p")
    V = collectives.latency_bound_bytes(kind, 8, chip, hop_latency=2e-6)
    bw = collectives.collective_time(kind, V, 8, chip)
    total = collectives.collective_time(kind, V, 8, chip, hop_latency=2e-6)
    assert total == pytest.approx(2 * bw)


def test_a_modified_chip_moves_the_crossover():
    fast = get_chip("tpu-v5p").with_(ici_link_bandwidth=2e11)
    slow = collectives.latency_bound_bytes("all-reduce", 8, "tpu-v5p", hop_latency=1e-6)
    assert collectives.latency_bound_bytes("all-reduce", 8, fast, hop_latency=1e-6) == \
        pytest.approx(2 * slow)


@pytest.mark.parametrize("kwargs,word", [
    (dict(kind="all-gather", axes=8, hop_latency=-1.0), "hop_latency"),
    (dict(kind="all-gather", axes=8, hop_latency=0.0), "hop_latency"),
    (dict(kind="all-gather", axes=8, hop_latency=math.nan), "hop_latency"),
    (dict(kind="gather", axes=8, hop_latency=1e-6), "kind must be one of"),
    (dict(kind="all-gather", axes=1, hop_latency=1e-6), "more than one device"),
    (dict(kind="all-gather", axes=0, hop_latency=1e-6), "axes"),
    (dict(kind="all-gather", axes=8, hop_latency=1e-6, topology="mesh"), "topology"),
])
def test_bad_input_to_latency_bound_bytes(kwargs, word):
    with pytest.raises(ValueError, match=word):
        collectives.latency_bound_bytes(chip="tpu-v5e", **kwargs)


def test_bad_hop_latency_in_collective_time():
    with pytest.raises(ValueError, match="hop_latency"):
        collectives.collective_time("all-gather", 1e6, 8, "tpu-v5e", hop_latency=-1e-6)
    with pytest.raises(ValueError, match="one axis only"):
        collectives.latency_steps("all-to-all", (4, 2))
