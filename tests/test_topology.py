"""Tests of scalebook.topology: the systolic-array simulation, hop counts, slices, transfer times.

Hop counts are checked against a breadth-first search over an explicitly built graph of
links (not the formula), slice facts against Google's published tables.
"""

import itertools
import math
from collections import deque

import numpy as np
import pytest

from scalebook import chip_internals, topology
from scalebook.errors import UnknownNameError
from scalebook.hardware import get_chip

# ---- systolic array ------------------------------------------------------------------------

SHAPES = [(1, 1, 1), (1, 5, 3), (4, 1, 6), (3, 4, 5), (8, 8, 8), (9, 3, 2), (2, 16, 7)]


@pytest.mark.parametrize("M,K,N", SHAPES)
def test_systolic_integer_product_is_exact(M, K, N):
    rng = np.random.default_rng(M * 100 + K * 10 + N)
    x = rng.integers(-9, 10, (M, K))
    w = rng.integers(-9, 10, (K, N))
    run = chip_internals.systolic_matmul(x, w)
    np.testing.assert_array_equal(run.out, x @ w)


@pytest.mark.parametrize("M,K,N", SHAPES)
def test_systolic_float_product_and_counts(M, K, N):
    rng = np.random.default_rng(7 + M + K + N)
    x = rng.standard_normal((M, K))
    w = rng.standard_normal((K, N))
    run = chip_internals.systolic_matmul(x, w)
    np.testing.assert_allclose(run.out, x @ w, rtol=1e-12, atol=1e-12)
    # every multiply-add of the product happens exactly once
    assert run.busy.sum() == M * K * N
    assert run.cycles == len(run.busy) == chip_internals.systolic_cycles(M, K, N)
    assert run.busy.max() <= K * N
    assert 0 < run.utilization <= 1


def test_systolic_cycle_count_is_tight():
    # the first cycle and the last cycle both do work: no idle cycle is counted
    run = chip_internals.systolic_matmul(np.ones((5, 3)), np.ones((3, 4)))
    assert run.busy[0] == 1 and run.busy[-1] == 1
    assert np.all(run.busy > 0)


def test_systolic_utilization_grows_with_rows():
    w = np.ones((8, 8))
    small = chip_internals.systolic_matmul(np.ones((2, 8)), w).utilization
    big = chip_internals.systolic_matmul(np.ones((64, 8)), w).utilization
    assert big > 3 * small


@pytest.mark.parametrize("x,w", [
    (np.ones((2, 3)), np.ones((4, 2))),        # inner dims differ
    (np.ones(3), np.ones((3, 2))),             # 1D
    (np.ones((0, 3)), np.ones((3, 2))),        # empty
    (np.ones((2, 2), bool), np.ones((2, 2))),  # not numbers
])
def test_systolic_bad_input(x, w):
    with pytest.raises(ValueError):
        chip_internals.systolic_matmul(x, w)


def test_systolic_cycles_bad_input():
    with pytest.raises(ValueError, match="D"):          # X[B, D] @ W[D, F]: D is 0
        chip_internals.systolic_cycles(2, 0, 3)


# ---- MXU -----------------------------------------------------------------------------------

def _padded_cells_by_counting(K, N, s):
    # count the cells of all s x s tiles touched by a K x N weight, one tile at a time
    tiles = sum(1 for i in range(0, K, s) for j in range(0, N, s))
    return tiles * s * s


@pytest.mark.parametrize("K,N", [(128, 128), (100, 300), (384, 384), (8192, 28672), (1, 1)])
@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-v6e"])
def test_padding_efficiency_matches_tile_count(K, N, chip):
    s = get_chip(chip).mxu_size
    assert chip_internals.mxu_padding_efficiency(K, N, chip) == pytest.approx(K * N / _padded_cells_by_counting(K, N, s))


def test_padding_efficiency_128_vs_256():
    assert chip_internals.mxu_padding_efficiency(384, 384, "tpu-v5e") == 1.0
    assert chip_internals.mxu_padding_efficiency(384, 384, "tpu-v6e") < 1.0
    assert chip_internals.mxu_padding_efficiency(512, 512, "tpu-v6e") == 1.0
    assert chip_internals.mxu_padding_efficiency(100, 100, 10) == 1.0   # a bare array size works too


def test_padding_efficiency_errors():
    with pytest.raises(ValueError, match="MXU"):
        chip_internals.mxu_padding_efficiency(128, 128, "gpu-h100")
    with pytest.raises(UnknownNameError):
        chip_internals.mxu_padding_efficiency(128, 128, "tpu-v9")
    with pytest.raises(ValueError, match="D"):          # a weight W[D, F] with D < 0
        chip_internals.mxu_padding_efficiency(-1, 128)


@pytest.mark.parametrize("chip", ["tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"])
def test_mxu_peak_times_count_is_chip_peak(chip):
    c = get_chip(chip)
    assert chip_internals.mxu_count(chip) == c.tensorcores * c.mxus_per_core
    assert chip_internals.mxu_peak_flops(chip) * chip_internals.mxu_count(chip) == pytest.approx(c.bf16_flops)


def test_mxu_count_gpu_raises():
    with pytest.raises(ValueError, match="gpu-h100"):
        chip_internals.mxu_count("gpu-h100")


# ---- pipelining ----------------------------------------------------------------------------

def _simulate_double_buffer(n, L, C):
    # event simulation: one DMA engine loads tiles back to back (two buffers), one MXU
    # computes tile i once it is loaded and tile i-1 is done; a load may not start before
    # the compute that frees its buffer (tile i-2) has finished.
    load_end, comp_end = [], []
    for i in range(n):
        start = max(load_end[-1] if load_end else 0.0, comp_end[i - 2] if i >= 2 else 0.0)
        load_end.append(start + L)
        comp_end.append(max(load_end[i], comp_end[i - 1] if i else 0.0) + C)
    return comp_end[-1]


@pytest.mark.parametrize("n,L,C", [(1, 2.0, 3.0), (5, 1.0, 3.0), (5, 3.0, 1.0), (10, 2.0, 2.0), (3, 0.0, 1.0)])
def test_pipelined_time_matches_event_simulation(n, L, C):
    assert chip_internals.pipelined_time(n, L, C) == pytest.approx(_simulate_double_buffer(n, L, C))
    assert chip_internals.pipelined_time(n, L, C, overlap=False) == pytest.approx(n * (L + C))
    assert chip_internals.pipelined_time(n, L, C) <= chip_internals.pipelined_time(n, L, C, overlap=False)


def test_pipelined_time_errors():
    with pytest.raises(ValueError, match="n_steps"):
        chip_internals.pipelined_time(0, 1.0, 1.0)
    with pytest.raises(ValueError, match="load_time"):
        chip_internals.pipelined_time(2, -1.0, 1.0)


# ---- hop counts ----------------------------------------------------------------------------

def _bfs_hops(shape, wrap):
    """All-pairs hop counts by breadth-first search over an explicit list of links."""
    wrap = (wrap,) * len(shape) if isinstance(wrap, bool) else tuple(wrap)
    nodes = list(itertools.product(*[range(n) for n in shape]))
    nbrs = {v: set() for v in nodes}
    for v in nodes:
        for ax, n in enumerate(shape):
            for step in (-1, 1):
                c = list(v)
                c[ax] += step
                if 0 <= c[ax] < n:
                    nbrs[v].add(tuple(c))
                elif wrap[ax] and n > 1:
                    c[ax] %= n
                    nbrs[v].add(tuple(c))
    dist = {}
    for s in nodes:
        d = {s: 0}
        q = deque([s])
        while q:
            u = q.popleft()
            for v in nbrs[u]:
                if v not in d:
                    d[v] = d[u] + 1
                    q.append(v)
        dist[s] = d
    return nodes, dist, nbrs


CASES = [((8,), True), ((8,), False), ((5,), True), ((2, 4), False), ((2, 4), True),
         ((4, 4), True), ((3, 5), (True, False)), ((2, 3, 4), True), ((4, 4, 4), False),
         ((3, 2, 5), (False, True, True))]


@pytest.mark.parametrize("shape,wrap", CASES)
def test_hops_match_breadth_first_search(shape, wrap):
    nodes, dist, _ = _bfs_hops(shape, wrap)
    for s in nodes[:: max(1, len(nodes) // 6)]:
        grid = topology.hops_from(s, shape, wrap)
        for t in nodes:
            assert topology.torus_hops(s, t, shape, wrap) == dist[s][t]
            assert grid[t] == dist[s][t]
    all_d = [dist[s][t] for s in nodes for t in nodes if s != t]
    assert topology.diameter(shape, wrap) == max(all_d)
    assert topology.mean_hops(shape, wrap) == pytest.approx(sum(all_d) / len(all_d))


def test_wraparound_halves_the_diameter_of_a_long_ring():
    assert topology.diameter((16,), True) * 2 == topology.diameter((16,), False) + 1


@pytest.mark.parametrize("bad", [
    lambda: topology.torus_hops((0, 0), (0, 4), (2, 4)),       # outside the grid
    lambda: topology.torus_hops((0,), (1, 1), (2, 4)),         # wrong number of coordinates
    lambda: topology.hops_from((0, 0), (2, 0)),                # zero-length axis
    lambda: topology.diameter((2, 2, 2, 2)),                   # four axes
    lambda: topology.diameter((2, 4), wrap=(True,)),           # wrap per axis of wrong length
    lambda: topology.parse_shape("4by4"),
])
def test_hop_bad_input(bad):
    with pytest.raises(ValueError):
        bad()


def test_parse_shape_forms():
    assert topology.parse_shape("4x4x8") == (4, 4, 8) == topology.parse_shape([4, 4, 8])


# ---- slices --------------------------------------------------------------------------------

@pytest.mark.parametrize("chip,shape,wrap", [
    ("tpu-v5e", "16x16", (True, True)),
    ("tpu-v5e", "8x16", (False, True)),
    ("tpu-v5e", "2x4", (False, False)),
    ("tpu-v6e", "4x4", (False, False)),
    ("tpu-v5p", "4x4x4", (True, True, True)),
    ("tpu-v5p", "4x4x8", (True, True, True)),
    ("tpu-v5p", "2x4x4", (False, False, False)),
    ("tpu-v4", "4x4x6", (False, False, False)),
])
def test_slice_wraparound(chip, shape, wrap):
    assert topology.slice_wraparound(chip, shape) == wrap


@pytest.mark.parametrize("chip,shape", [("tpu-v5e", "32x8"), ("tpu-v5e", "2x2x2"),
                                        ("tpu-v5e", "32x32"), ("gpu-h100", "2x4")])
def test_slice_wraparound_rejects(chip, shape):
    with pytest.raises(ValueError):
        topology.slice_wraparound(chip, shape)


# Hosts per v5p slice: the Cloud TPU v5p configurations table (topology, chips, hosts).
@pytest.mark.parametrize("shape,chips,hosts", [("2x2x1", 4, 1), ("2x2x2", 8, 2), ("2x4x4", 32, 8),
                                               ("4x4x4", 64, 16), ("16x16x24", 6144, 1536)])
def test_v5p_slice_hosts_match_cloud_table(shape, chips, hosts):
    info = topology.slice_info("tpu-v5p", shape)
    assert (info.chips, info.hosts) == (chips, hosts)
    assert info.name == shape


def _bisection_by_counting(shape, wrap):
    """Links whose two ends fall on different sides of the cut halving the longest axis."""
    _, _, nbrs = _bfs_hops(shape, wrap)
    ax = int(np.argmax(shape))
    half = shape[ax] // 2
    return sum(1 for u, vs in nbrs.items() for v in vs if u[ax] < half <= v[ax])


@pytest.mark.parametrize("shape,wrap", [((4, 4), True), ((4, 4), False), ((2, 8), True),
                                        ((4, 4, 8), True), ((2, 4, 4), False), ((8,), True)])
def test_bisection_links_by_counting(shape, wrap):
    assert topology.bisection_links(shape, wrap) == _bisection_by_counting(shape, wrap)


# Published pod bisection bandwidths (Cloud TPU docs: v5e "1.6 TB/s", v6e "3.2 TB/s" per pod).
@pytest.mark.parametrize("chip,published", [("tpu-v5e", 1.6e12), ("tpu-v6e", 3.2e12)])
def test_pod_bisection_matches_published(chip, published):
    side = math.isqrt(get_chip(chip).ici_domain_chips)
    assert topology.bisection_bandwidth(chip, (side, side)) == pytest.approx(published, rel=0.01)


# ---- transfer time and the bandwidth hierarchy ---------------------------------------------

def test_transfer_time_formula():
    assert topology.transfer_time(1e9, 5e10) == pytest.approx(0.02)
    assert topology.transfer_time(1e9, 5e10, hops=6, hop_latency=1e-6) == pytest.approx(0.02 + 6e-6)
    assert topology.transfer_time(1e9, 5e10, links=2) == pytest.approx(0.01)
    assert topology.transfer_time(0, 5e10, hops=3, hop_latency=1e-6) == pytest.approx(3e-6)


@pytest.mark.parametrize("kwargs,name", [
    (dict(nbytes=-1, link_bandwidth=1e9), "nbytes"),
    (dict(nbytes=1, link_bandwidth=0), "link_bandwidth"),
    (dict(nbytes=1, link_bandwidth=1e9, hops=-1), "hops"),
    (dict(nbytes=1, link_bandwidth=1e9, links=0), "links"),
    (dict(nbytes=1, link_bandwidth=1e9, hop_latency=-1e-6), "hop_latency"),
])
def test_transfer_time_errors(kwargs, name):
    with pytest.raises(ValueError, match=name):
        topology.transfer_time(**kwargs)


@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-v5p", "gpu-h100"])
def test_bandwidth_hierarchy(chip):
    c = get_chip(chip)
    rows = topology.bandwidth_hierarchy(chip)
    bw = {r["level"].split(",")[0]: r["bandwidth"] for r in rows}
    assert rows[0]["bandwidth"] == c.hbm_bandwidth
    assert rows[1]["bandwidth"] == c.ici_links * c.ici_link_bandwidth
    assert bw["PCIe"] == c.pcie_bandwidth and bw["DCN"] == c.dcn_bandwidth
    # HBM is the fastest level on every chip; DCN per chip is below one ICI/NVLink link on TPUs
    assert all(r["bandwidth"] is None or r["bandwidth"] <= c.hbm_bandwidth for r in rows)
    if c.vendor == "Google":
        assert c.dcn_bandwidth < c.ici_link_bandwidth


def test_bandwidth_hierarchy_says_a_gpu_node_is_switched():
    """On an NVSwitch node there is no neighbour: any one peer is reached at the full
    all-links rate (chapter 11.2), and HBM's figure is reads and writes together."""
    rows = {r["level"]: r["what"] for r in topology.bandwidth_hierarchy("gpu-h100")}
    assert "neighbour" not in rows["NVLink, all links"] + rows["NVLink, one link"]
    assert "any GPU" in rows["NVLink, all links"] and "switch" in rows["NVLink, one link"]
    assert "reads + writes" in rows["HBM"]
    tpu = {r["level"]: r["what"] for r in topology.bandwidth_hierarchy("tpu-v5p")}
    assert "neighbour" in tpu["ICI, one link"]


def test_bandwidth_hierarchy_unknown_chip():
    with pytest.raises(UnknownNameError, match="known chips"):
        topology.bandwidth_hierarchy("tpu-v99")


@pytest.mark.parametrize("M,K,N", [(2, 3, 4), (16, 8, 5), (1, 32, 32)])
def test_systolic_matches_jax_dot_in_float32(M, K, N):
    import jax.numpy as jnp

    rng = np.random.default_rng(M + 2 * K + 3 * N)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((K, N)).astype(np.float32)
    run = chip_internals.systolic_matmul(x, w)
    assert run.out.dtype == np.float32
    np.testing.assert_allclose(run.out, np.asarray(jnp.dot(x, w)), rtol=1e-5, atol=1e-5)
