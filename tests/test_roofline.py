"""scalebook.roofline: formulas checked against XLA's own counts, and their input checks."""

import math

import jax
import jax.numpy as jnp
import pytest

import scalebook
from scalebook import hardware, roofline as rl
from scalebook.units import fmt_bytes, fmt_time, sci

SHAPES = [(2, 64, 128), (8, 512, 1024), (128, 256, 768), (1000, 300, 70)]


@pytest.mark.parametrize("B,D,F", SHAPES)
def test_matmul_counts_match_xla_cost_analysis(B, D, F):
    compiled = jax.jit(jnp.matmul).lower(jax.ShapeDtypeStruct((B, D), jnp.float32),
                                         jax.ShapeDtypeStruct((D, F), jnp.float32)).compile()
    cost = compiled.cost_analysis()
    assert cost["flops"] == rl.matmul_flops(B, D, F)
    assert cost["bytes accessed"] == rl.matmul_bytes(B, D, F, bytes_per_element=4)


@pytest.mark.parametrize("B,D,F", [(8, 64, 128), (16, 256, 96), (3, 100, 70)])
def test_batched_matmul_counts_match_xla_cost_analysis(B, D, F):
    """Each token its own matrix, einsum bd,bdf->bf: XLA counts 2BDF FLOPs, s(BD+BDF+BF) bytes."""
    f = lambda x, w: jnp.einsum("bd,bdf->bf", x, w)
    compiled = jax.jit(f).lower(jax.ShapeDtypeStruct((B, D), jnp.float32),
                                jax.ShapeDtypeStruct((B, D, F), jnp.float32)).compile()
    cost = compiled.cost_analysis()
    assert cost["flops"] == rl.batched_matmul_flops(B, D, F) == 2 * B * D * F
    assert cost["bytes accessed"] == rl.batched_matmul_bytes(B, D, F, bytes_per_element=4)


def test_batched_matmul_intensity_does_not_grow_with_the_batch():
    for s in (1, 2, 4):
        values = [rl.batched_matmul_intensity(B, 8192, 28672, s) for B in (1, 7, 64, 4096)]
        assert max(values) - min(values) < 1e-12 * values[0]
        assert values[0] == 2 * 8192 * 28672 / (s * (8192 + 8192 * 28672 + 28672)) < 2 / s
        # with one token it is the ordinary matmul
        assert math.isclose(values[0], rl.matmul_intensity(1, 8192, 28672, s))
    with pytest.raises(ValueError, match="B must be a positive integer"):
        rl.batched_matmul_bytes(0, 2, 3)


def test_dot_product_counts():
    assert rl.dot_flops(1000) == 2000 and rl.dot_bytes(1000) == 2 * 2001
    assert rl.dot_bytes(1000, bytes_per_element=4) == 4 * 2001
    with pytest.raises(ValueError, match="D must be a positive integer"):
        rl.dot_flops(0)


def test_measured_operations_are_listed_without_timing():
    from scalebook import measure

    ops = measure.roofline_operations()
    assert [o.intensity for o in ops[:6]] == [n / 6 for n in measure.MATMUL_SIZES]
    assert all(o.intensity == 0.25 for o in ops[6:]) and len(ops) == 9
    timed = measure.measure_roofline(matmul_sizes=(8, 16), vector_sizes=(1024,), repeats=1)
    listed = measure.roofline_operations(matmul_sizes=(8, 16), vector_sizes=(1024,))
    assert [(m.name, m.flops, m.nbytes) for m in timed] == [
        (o.name, o.flops, o.nbytes) for o in listed]
    assert all(m.seconds > 0 for m in timed)


def test_intensity_approaches_batch_for_small_batches():
    for B in (1, 4, 16):
        assert B * 0.98 < rl.matmul_intensity(B, 8192, 28672) <= B


def test_mixed_precision_bytes():
    # int8 weights, bf16 activations: 2BD + DF + 2BF
    assert rl.matmul_bytes(3, 5, 7, 2, weight_bytes_per_element=1) == 2 * 15 + 35 + 2 * 21


@pytest.mark.parametrize("chip", hardware.chip_names())
@pytest.mark.parametrize("D,F", [(8192, 28672), (28672, 8192), (4096, 14336), (2048, 2048), (16384, 53248)])
def test_critical_batch_is_the_smallest_compute_bound_batch(chip, D, F):
    I = hardware.get_chip(chip).critical_intensity
    if 2 * D * F / (2 * (D + F)) <= I:
        with pytest.raises(ValueError, match="never becomes compute-bound"):
            rl.critical_batch(D, F, chip)
        return
    B = rl.critical_batch(D, F, chip)
    assert rl.matmul_intensity(B, D, F) >= I
    assert B == 1 or rl.matmul_intensity(B - 1, D, F) < I


def test_critical_batch_with_int8_weights_is_about_half():
    full = rl.critical_batch(8192, 28672, "tpu-v5e")
    half = rl.critical_batch(8192, 28672, "tpu-v5e", weight_bytes_per_element=1)
    assert abs(half - full / 2) <= 2
    assert rl.matmul_intensity(half, 8192, 28672, 2, 1) >= hardware.get_chip("tpu-v5e").critical_intensity


def _brute_force_tiled_bytes(B, D, F, tb, tf, s):
    total = 0
    for i in range(0, B, tb):
        for j in range(0, F, tf):
            r, c = min(tb, B - i), min(tf, F - j)
            total += s * (r * D + D * c + r * c)
    return total


@pytest.mark.parametrize("B,D,F,tb,tf", [(256, 64, 512, 128, 128), (1000, 30, 700, 256, 128), (64, 8, 64, 64, 64)])
def test_tiled_bytes_match_a_simulated_loop(B, D, F, tb, tf):
    assert rl.tiled_matmul_bytes(B, D, F, tb, tf) == _brute_force_tiled_bytes(B, D, F, tb, tf, 2)


def test_tiled_intensity_tends_to_half_the_tile_in_bf16():
    n = 1 << 16
    assert math.isclose(rl.tiled_matmul_intensity(n, n, n, 512, 512), 256, rel_tol=0.01)


def test_split_contraction_matches_the_compiled_all_reduce():
    """Two-way split of D: the compiled program all-reduces exactly one [B, F] block."""
    from jax.sharding import NamedSharding, PartitionSpec as P

    scalebook.setup(quiet=True)
    mesh = scalebook.make_mesh((2, 4), ("x", "y"))
    for B, D, F in [(16, 64, 32), (8, 128, 48)]:
        x = jax.ShapeDtypeStruct((B, D), jnp.float32, sharding=NamedSharding(mesh, P(None, "x")))
        y = jax.ShapeDtypeStruct((D, F), jnp.float32, sharding=NamedSharding(mesh, P("x", None)))
        hlo = jax.jit(jnp.matmul, out_shardings=NamedSharding(mesh, P())).lower(x, y).compile().as_text()
        reduces = [l for l in hlo.splitlines() if " all-reduce(" in l]
        assert len(reduces) == 1 and f"f32[{B},{F}]" in reduces[0]
        t = rl.contraction_split_times(B, D, F, "tpu-v5e", bytes_per_element=4)
        chip = hardware.get_chip("tpu-v5e")
        assert math.isclose(t.comm, 4 * B * F / chip.ici_link_bandwidth)   # one [B, F] exchange
        assert math.isclose(t.compute, B * D * F / chip.bf16_flops)


def test_hide_threshold_is_where_the_times_cross():
    for chip in ("tpu-v5e", "tpu-v5p", "gpu-h100"):
        for n in (2, 4):
            d = rl.min_contraction_to_hide_comm(chip, n_chips=n)
            D = math.ceil(d / n) * n
            t = rl.contraction_split_times(64, D, 1024, chip, n_chips=n)
            assert t.compute >= t.comm
            t_below = rl.contraction_split_times(64, D - n, 1024, chip, n_chips=n)
            assert t_below.compute < t_below.comm


def test_bounds():
    b = rl.time_bounds(1e12, 2e9, "tpu-v5e", comm_bytes=1e8)
    chip = hardware.get_chip("tpu-v5e")
    parts = (1e12 / chip.bf16_flops, 2e9 / chip.hbm_bandwidth, 1e8 / chip.ici_link_bandwidth)
    assert math.isclose(b.lower, max(parts)) and math.isclose(b.upper, sum(parts))
    assert b.bottleneck == "compute"
    assert rl.time_bounds(1e9, 2e9, "tpu-v5e").bottleneck == "memory"


@pytest.mark.parametrize("call,match", [
    (lambda: rl.matmul_flops(0, 2, 3), "B must be a positive integer"),
    (lambda: rl.matmul_flops(2.5, 2, 3), "B must be a positive integer"),
    (lambda: rl.matmul_bytes(2, -1, 3), "D must be a positive integer"),
    (lambda: rl.matmul_bytes(2, 2, 3, bytes_per_element=0), "bytes_per_element"),
    (lambda: rl.matmul_intensity(True, 2, 3), "B must be a positive integer"),
    (lambda: rl.compute_time(-1, "tpu-v5e"), "flops"),
    (lambda: rl.memory_time(float("nan"), "tpu-v5e"), "nbytes"),
    (lambda: rl.comm_time(10, 0), "bandwidth"),
    (lambda: rl.compute_time(1e9, "tpu-v5e", dtype="fp4"), "dtype"),
    (lambda: rl.tiled_matmul_bytes(64, 8, 64, 128, 64), "tiles must fit"),
    (lambda: rl.contraction_split_times(4, 9, 4, "tpu-v5e", n_chips=2), "does not divide"),
    (lambda: rl.contraction_split_times(4, 8, 4, "tpu-v5e", n_chips=1), "at least 2"),
    (lambda: rl.critical_batch(64, 64, "tpu-v5e"), "never becomes compute-bound"),
    (lambda: rl.arithmetic_intensity(10, 0), "nbytes"),
    (lambda: rl.compute_time("1e12", "tpu-v5e"), "flops"),
])
def test_bad_input_gets_a_clear_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_unknown_chip_in_a_formula():
    with pytest.raises(KeyError, match="known chips"):
        rl.compute_time(1e9, "tpu-v99")


def test_formatting():
    assert sci(1.97e14) == "1.97e14"
    assert sci(8.19e11) == "8.19e11"
    assert sci(5e10) == "5e10"
    assert sci(240.5) == "240"
    assert sci(2734.4) == "2734" and sci(9999) == "9999" and sci(10500) == "1.05e4"
    assert sci(1.234e-5) == "1.23e-5"
    assert fmt_time(0.00123) == "1.23 ms"
    assert fmt_time(4.2e-5) == "42 µs"
    assert fmt_time(7200) == "2 h"
    assert fmt_bytes(1.6e10) == "16 GB"
    assert fmt_bytes(512) == "512 B"
