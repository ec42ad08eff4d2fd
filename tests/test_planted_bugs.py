"""Tests written against bugs that once slipped through (each was planted on purpose in a
review and not caught): every expected value here is a literal or computed by hand."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from scalebook import llama, measure, plots, roofline
from scalebook.hardware import get_chip


def test_rope_angles_equal_hand_computed_ones():
    """theta^(-2i/h) for pair i, not theta^(-i/h)."""
    h, theta = 8, 10000.0
    cos, sin = llama.rope_angles(jnp.array([[3]]), h, theta)
    want = [3 * theta ** (-2 * i / h) for i in range(h // 2)]     # 3, 0.3, 0.03, 0.003
    assert want == pytest.approx([3.0, 0.3, 0.03, 0.003])
    np.testing.assert_allclose(np.asarray(cos)[0, 0], np.cos(want), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(sin)[0, 0], np.sin(want), rtol=1e-6)


def test_apply_rope_rotates_pair_i_with_i_plus_half():
    x = jnp.zeros((1, 1, 1, 4)).at[0, 0, 0, 0].set(1.0)          # unit vector in dim 0
    cos, sin = llama.rope_angles(jnp.array([[1]]), 4, 10000.0)    # pair 0 turns by 1 rad
    out = np.asarray(llama.apply_rope(x, cos, sin))[0, 0, 0]
    np.testing.assert_allclose(out, [math.cos(1), 0, math.sin(1), 0], atol=1e-6)


def test_attainable_flops_is_the_minimum_of_the_two_roofs():
    peak, bw = 100.0, 2.0
    got = roofline.attainable_flops([1, 50, 1000], peak, bw)
    assert list(got) == [2.0, 100.0, 100.0]


def test_critical_batch_stops_even_if_the_flop_formula_is_broken(monkeypatch):
    """A planted 1-FLOP-per-multiply-add bug once made the search loop run forever."""
    monkeypatch.setattr(roofline, "matmul_flops", lambda B, D, F: B * D * F)
    try:
        B = roofline.critical_batch(8192, 28672, "tpu-v5e")
    except (ValueError, RuntimeError):
        return
    assert B > 0


def test_critical_batch_of_a_known_case_by_hand():
    # v5e: I* = 1.97e14 / 8.19e11 = 240.54; X[B, 8192] @ W[8192, 28672], all bf16:
    # 2 B D F >= I* 2 (B D + D F + B F)  <=>  B >= I* D F / (D F - I* (D + F))
    I = 1.97e14 / 8.19e11
    D, F = 8192, 28672
    want = math.ceil(I * D * F / (D * F - I * (D + F)))
    assert roofline.critical_batch(D, F, "tpu-v5e") == want == 250     # 249.97 rounds up


def test_measured_matmul_counts_2n3_flops_and_3n2_elements():
    m = measure.measure_matmul(16, repeats=1)
    assert m.flops == 2 * 16**3 and m.nbytes == 3 * 16 * 16 * 4
    assert m.seconds > 0 and m.flops_per_second == m.flops / m.seconds
    e = measure.measure_elementwise(1024, repeats=1)
    assert e.flops == 2 * 1024 and e.nbytes == 2 * 1024 * 4 and e.intensity == 0.25


def test_measure_refuses_bad_sizes():
    with pytest.raises(ValueError):
        measure.measure_matmul(0)
    with pytest.raises((ValueError, TypeError)):
        measure.time_call(lambda: None, repeats=0)


def test_roofline_plot_draws_each_roof_at_min_of_peak_and_bandwidth():
    import matplotlib
    matplotlib.use("Agg", force=True)
    ax = plots.roofline_plot(["tpu-v5e", "gpu-h100"], points=[("x", 10.0)])
    roofs = [l for l in ax.get_lines() if len(l.get_xdata()) > 10]
    assert len(roofs) == 2
    for line, name in zip(roofs, ["tpu-v5e", "gpu-h100"]):
        c = get_chip(name)
        x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        np.testing.assert_allclose(y, np.minimum(c.bf16_flops, x * c.hbm_bandwidth))
        assert line.get_color() == plots.chip_color(name)
    assert len(set(plots.CHIP_COLORS.values())) == len(plots.CHIP_COLORS)
