"""scalebook.parallelism: chapter 5's formulas, worked by hand here, and bad input refused.

Closed forms are written out from the chip figures (not through scalebook.collectives), so a
change in either side shows up. Mesh checks (the compiled collectives of the schemes) run on
the 8-device CPU mesh."""

import math

import pytest

import scalebook

scalebook.setup(quiet=True)

from scalebook import parallelism as par  # noqa: E402
from scalebook.hardware import get_chip  # noqa: E402
from scalebook.models import get_model  # noqa: E402

v5p, v5e, h100 = get_chip("tpu-v5p"), get_chip("tpu-v5e"), get_chip("gpu-h100")
C5p, W5p = v5p.bf16_flops, v5p.ici_link_bandwidth


def close(a, b, rtol=1e-9):
    return math.isclose(a, b, rel_tol=rtol)


# ---- networks -------------------------------------------------------------------------

def test_networks():
    assert par.network("tpu-v5p") == par.Network("ici", W5p, "torus")
    assert par.network(h100) == par.Network("nvlink", h100.ici_link_bandwidth * h100.ici_links, "switch")
    assert par.network(v5p, "dcn").bandwidth == v5p.dcn_bandwidth
    with pytest.raises(ValueError, match="dcn_bandwidth"):
        par.network("tpu-v6e", "dcn")
    with pytest.raises(ValueError, match="network kind"):
        par.network("tpu-v5p", "pcie")


# ---- data parallelism and FSDP ----------------------------------------------------------

@pytest.mark.parametrize("axes", [1, 2, 3])
def test_dp_critical_batch_closed_form(axes):
    # all-reduce of s per weight element over k torus axes vs 4 backward FLOPs per element
    assert close(par.data_parallel_critical_batch(v5p, axes=axes), 2 * C5p / (4 * W5p * axes))
    shape = (16,) * axes                      # axes of 16 chips: two links each
    n = 16 ** axes
    assert close(par.data_parallel_critical_batch(v5p, shape=shape),
                 (n - 1) / n * 2 * C5p / (4 * W5p * axes))


def test_dp_critical_batch_on_a_4x2x2_mesh():
    # 16 chips: the axis of 4 has two links (one each way), each axis of 2 has one link,
    # so 4 links in all (a guess of round(16 ** (1/3)) = 3 chips per axis would give 6)
    n, links, s = 16, 2 + 1 + 1, 2
    want = 2 * (n - 1) / n * s / (links * W5p) / (4 / C5p)
    assert close(par.data_parallel_critical_batch(v5p, shape=(4, 2, 2)), want)
    assert close(par.data_parallel_critical_batch(v5p, 16, shape=(2, 4, 2)), want)
    # the times cross there: the all-reduce over (4, 2, 2) against the backward matmuls
    t = par.dp_layer_times(512, 2048, want, (4, 2, 2), v5p)
    assert close(t.comm_backward, t.compute_backward)
    with pytest.raises(ValueError, match="give the mesh shape"):
        par.data_parallel_critical_batch(v5p, 16, axes=3)
    with pytest.raises(ValueError, match="not both"):
        par.data_parallel_critical_batch(v5p, shape=(4, 4), axes=2)
    with pytest.raises(ValueError, match="does not match"):
        par.data_parallel_critical_batch(v5p, 8, shape=(4, 4))
    with pytest.raises(ValueError, match="at least 2"):
        par.data_parallel_critical_batch(v5p, shape=(1, 1))
    with pytest.raises(ValueError, match="shape"):
        par.data_parallel_critical_batch(v5p, shape=(4, 0))


def test_dp_critical_batch_on_a_ring_network():
    W = h100.ici_link_bandwidth * h100.ici_links
    assert close(par.data_parallel_critical_batch(h100), 2 * h100.bf16_flops / (2 * W))
    assert close(par.data_parallel_critical_batch(h100, network_kind="dcn"),
                 2 * h100.bf16_flops / (2 * h100.dcn_bandwidth))


@pytest.mark.parametrize("n", [2, 8])
def test_dp_and_fsdp_times_cross_at_the_critical_batch(n):
    # n = 2: an axis of 2 chips has one link, so the threshold is not halved by the torus
    b_star = par.data_parallel_critical_batch(v5p, n)
    assert n > 2 or close(b_star, 0.5 * 2 * C5p / (2 * W5p))     # (n-1)/n s C / (2 W)
    for fn in (par.dp_layer_times, par.fsdp_layer_times):
        t = fn(512, 2048, b_star, n, v5p)
        assert close(t.comm_backward, t.compute_backward, 1e-9)
        assert fn(512, 2048, 1.01 * b_star, n, v5p).compute_bound
        assert not fn(512, 2048, 0.99 * b_star, n, v5p).compute_bound
    # FSDP's forward gather has the same threshold (half the bytes, half the FLOPs)
    t = par.fsdp_layer_times(512, 2048, b_star, n, v5p)
    assert close(t.comm_forward, t.compute_forward)
    assert par.dp_layer_times(512, 2048, 10, n, v5p).comm_forward == 0


def test_dp_layer_times_by_hand():
    D, F, b, n = 1024, 4096, 300, 4
    t = par.dp_layer_times(D, F, b, n, v5p)
    assert close(t.compute_forward, 4 * b * D * F / C5p)
    assert close(t.comm_backward, 2 * (n - 1) / n * 2 * D * F * 2 / (2 * W5p))
    t2 = par.dp_layer_times(D, F, b, (4, 4), v5p)
    assert close(t2.comm_backward, 2 * 15 / 16 * 2 * D * F * 2 / (2 * W5p * 2))
    assert close(t.lower, max(t.compute_forward, t.comm_forward)
                 + max(t.compute_backward, t.comm_backward))


def test_zero_stages():
    N, n = 1e9, 8
    by_stage = [par.training_memory_per_chip(N, n, z).as_dict() for z in range(4)]
    assert by_stage[0] == {"weights": 2e9, "gradients": 2e9, "master_weights": 4e9,
                           "optimizer": 8e9, "activations": 0.0}
    assert by_stage[1]["optimizer"] == 1e9 and by_stage[1]["master_weights"] == 0.5e9
    assert by_stage[2]["gradients"] == 0.25e9 and by_stage[2]["weights"] == 2e9
    assert par.training_memory_per_chip(N, n, 3).total == 16e9 / 8
    assert par.training_memory_per_chip(N, n, 3, activations=5.0).total == 16e9 / 8 + 5


def test_largest_model():
    assert close(par.largest_model_per_chip("tpu-v5p"), v5p.hbm_bytes / 16)
    assert close(par.largest_model_per_chip("tpu-v5p", 64, 3), 64 * v5p.hbm_bytes / 16)
    assert close(par.largest_model_per_chip("tpu-v5p", activation_fraction=0.25),
                 0.75 * v5p.hbm_bytes / 16)
    with pytest.raises(ValueError, match="activation_fraction"):
        par.largest_model_per_chip("tpu-v5p", activation_fraction=1)


# ---- tensor parallelism ---------------------------------------------------------------

def test_tp_times_and_max_degree():
    B, D, F = 4096, 8192, 28672
    t = par.tp_mlp_layer_times(B, D, F, 4, v5p)
    assert close(t.compute_forward, 2 * 2 * B * D * F / 4 / C5p)
    assert close(t.comm_forward, 2 * 3 / 4 * B * D * 2 / (2 * W5p))
    n_max = par.max_tp_degree(F, v5p)
    assert n_max == math.floor(1 + 2 * F * 2 * W5p / (2 * C5p))
    assert par.tp_mlp_layer_times(B, D, F, 8, v5p).compute_bound
    assert not par.tp_mlp_layer_times(B, D, F, 16, v5p).compute_bound
    assert par.max_tp_degree(F, v5p, matmuls=3) > n_max
    assert par.max_tp_degree(F, v5p, axes=2) > n_max
    # the batch does not matter
    r1 = par.tp_mlp_layer_times(64, D, F, 8, v5p).ratio
    r2 = par.tp_mlp_layer_times(65536, D, F, 8, v5p).ratio
    assert close(r1, r2)


def test_tp_max_degree_is_the_crossing():
    F = 4096 * 6
    n = par.max_tp_degree(F, v5p)

    def ratio(m):  # forward comm / compute with the (n-1)/n factor, F divisibility ignored
        return (2 * (m - 1) / m * 2 / (2 * W5p)) / (4 * F / m / C5p)
    assert ratio(n) <= 1 < ratio(n + 1)


def test_max_tp_degree_layer_by_hand():
    # LLaMA-3 70B, S = 8192, causal: per token and layer the forward does
    #   weights: 2 (D (H h) + 2 D (K h) + (H h) D + 3 D F) FLOPs
    #   scores and values: 4 H h (S + 1) / 2 FLOPs (the unmasked half)
    # and sends an all-gather and a reduce-scatter of [D] before and after attention and
    # the MLP: 2 all-reduces, 2 x 2 (n-1)/n D s bytes, over 2 W per chip on a torus axis.
    D, H, K, h, F, S, s = 8192, 64, 8, 128, 28672, 8192, 2
    f = 2 * (D * H * h + 2 * D * K * h + H * h * D + 3 * D * F) + 4 * H * h * (S + 1) / 2

    def fwd_ratio(n):          # forward comm / compute
        return (2 * 2 * (n - 1) / n * D * s / (2 * W5p)) / (f / n / C5p)
    n = par.max_tp_degree_layer("llama3-70b", v5p, seq_len=S)
    assert fwd_ratio(n) <= 1 < fwd_ratio(n + 1)
    assert n == 13                                   # the MLP alone allows 19
    assert par.max_tp_degree(F, v5p, matmuls=3) == 19
    # the backward does twice the FLOPs behind the same collectives: a larger limit
    bwd = par.max_tp_degree_layer("llama3-70b", v5p, seq_len=S, which="backward")
    assert fwd_ratio(bwd) / 2 <= 1 < fwd_ratio(bwd + 1) / 2
    assert par.max_tp_degree_layer("llama3-70b", v5p, seq_len=S, which="forward") == n < bwd
    # without the causal mask's saving the attention does more FLOPs: never a smaller limit
    assert par.max_tp_degree_layer("llama3-70b", v5p, seq_len=S, causal=False) >= n
    # a config passes through, and two chips on one axis share one link
    tiny = get_model("llama3-8b")
    assert par.max_tp_degree_layer(tiny, v5p, seq_len=S) == \
        par.max_tp_degree_layer("llama3-8b", v5p, seq_len=S)
    slow = v5p.with_(ici_link_bandwidth=W5p / 12)
    assert par.max_tp_degree_layer("llama3-70b", slow, seq_len=S) == 1
    for bad, match in [(dict(seq_len=0), "seq_len"), (dict(seq_len=S, which="both"), "which"),
                       (dict(seq_len=S, causal="yes"), "causal")]:
        with pytest.raises(ValueError, match=match):
            par.max_tp_degree_layer("llama3-70b", v5p, **bad)


def test_tp_attention():
    assert par.tp_attention_check(64, 8, 8) == 8
    assert par.tp_attention_check(64, 8, 16) == 4
    with pytest.raises(ValueError, match="above the number of query heads"):
        par.tp_attention_check(64, 8, 128)
    with pytest.raises(ValueError, match="does not divide"):
        par.tp_attention_check(64, 8, 6)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        par.tp_attention_check(12, 8, 2)


# ---- FSDP x TP ---------------------------------------------------------------------------

def test_2d_times_by_hand():
    B, D, F, X, Y, s = 2 ** 20, 8192, 28672, 32, 8, 2
    t = par.fsdp_tp_layer_times(B, D, F, X, Y, v5p)            # a torus: "max"
    assert close(t.compute_forward, 4 * B * D * F / (X * Y) / C5p)
    w = (X - 1) / X * 2 * D * F * s / Y / (2 * W5p)
    a = 2 * (Y - 1) / Y * B * D * s / X / (2 * W5p)
    assert close(t.comm_forward, max(w, a))
    assert close(t.comm_backward, max(2 * w, a))
    t = par.fsdp_tp_layer_times(B, D, F, X, Y, v5p, combine="sum")
    assert close(t.comm_forward, w + a)
    assert close(t.comm_backward, 2 * w + a)
    # X over two torus axes (4, 8): twice the links for the weight gathers
    t = par.fsdp_tp_layer_times(B, D, F, (4, 8), Y, v5p, combine="sum")
    assert close(t.comm_forward, w / 2 + a)
    # a GPU's NVSwitch: both axes share the NVLinks, so only the sum
    assert par.fsdp_tp_layer_times(B, D, F, 1, 8, h100).comm_forward > 0
    with pytest.raises(ValueError, match="combine='sum'"):
        par.fsdp_tp_layer_times(B, D, F, 1, 8, h100, combine="max")
    with pytest.raises(ValueError, match="combine"):
        par.fsdp_tp_layer_times(B, D, F, X, Y, v5p, combine="min")


def test_critical_batch_max_and_sum_by_hand():
    # Forward, large n, X = FSDP chips on a_X torus axes, Y = TP chips on a_Y, N = X Y:
    #   T_math  = 4 B D F / (N C)
    #   T_fsdp  = 2 D F s / (Y 2 W a_X)        (gather of W_in and W_out, [D, F / Y] each)
    #   T_tp    = 2 B D s / (X 2 W a_Y)        (all-gather + reduce-scatter of [B / X, D])
    # so T_fsdp / T_math = (s C / 4W) X / (B a_X),  T_tp / T_math = (s C / 4W) Y / (F a_Y).
    # Equal at X^2 = B N a_X / (F a_Y); each term is then (s C / 4W) sqrt(1 / (b F a_X a_Y)).
    #   max <= 1:  b >= (s C / 4W)^2 / (F a_X a_Y)
    #   sum <= 1:  b >= (s C / 2W)^2 / (F a_X a_Y)       (4 times more)
    F, s = 28672, 2
    a = s * C5p / (4 * W5p)
    for mx, my in [(1, 1), (2, 1), (1, 2)]:
        b_max = par.fsdp_tp_critical_batch(F, v5p, axes=(mx, my))
        b_sum = par.fsdp_tp_critical_batch(F, v5p, axes=(mx, my), combine="sum")
        assert close(b_max, a ** 2 / (F * mx * my))
        assert close(b_sum, (2 * a) ** 2 / (F * mx * my))
        # at b*, X*, the terms are equal and the larger (max) or their sum is exactly 1
        N = 4096
        for b, want in [(b_max, 1.0), (b_sum, 0.5)]:
            B = b * N
            X = par.optimal_fsdp_degree(B, N, F, axes=(mx, my))
            assert close(X, math.sqrt(B * N * mx / (F * my)))
            fsdp, tp = a * X / (B * mx), a * (N / X) / (F * my)
            assert close(fsdp, tp) and close(fsdp, want)
    # the old one-axis-each sum, 735 tokens per chip for 70B, against the v5p torus's max
    assert round(par.fsdp_tp_critical_batch(F, v5p, combine="sum")) == 735
    assert round(par.fsdp_tp_critical_batch(F, v5p, axes=(2, 1))) == 92
    # on a GPU's NVSwitch only the sum, W = all NVLinks, no torus doubling
    Wh = h100.ici_link_bandwidth * h100.ici_links
    assert close(par.fsdp_tp_critical_batch(F, h100), (s * h100.bf16_flops / Wh) ** 2 / F)
    assert par.fsdp_tp_critical_batch(F, v5p) < par.data_parallel_critical_batch(v5p)
    for bad, match in [(dict(axes=(1,)), "pair"), (dict(axes=(0, 1)), "a_X"),
                       (dict(combine="mean"), "combine")]:
        with pytest.raises(ValueError, match=match):
            par.fsdp_tp_critical_batch(F, v5p, **bad)
    with pytest.raises(ValueError, match="axes=\\(1, 1\\)"):
        par.fsdp_tp_critical_batch(F, h100, axes=(2, 1))
    with pytest.raises(ValueError, match="pair"):
        par.optimal_fsdp_degree(1e6, 64, F, axes=2)


def test_critical_batch_matches_the_exact_layer_times():
    # at a large mesh ((n-1)/n ~ 1) the exact times give the large-n ratios
    F, N = 28672, 4096
    for combine, terms in [("max", 1), ("sum", 2)]:
        b = par.fsdp_tp_critical_batch(F, v5p, combine=combine)
        B = b * N
        X = 512
        t = par.fsdp_tp_layer_times(B, 8192, F, X, N // X, v5p, combine=combine)
        a = 2 * C5p / (4 * W5p)
        fsdp, tp = a * X / B, a * (N // X) / F
        want = max(fsdp, tp) if terms == 1 else fsdp + tp
        assert math.isclose(t.comm_forward / t.compute_forward, want, rel_tol=0.15)


@pytest.mark.parametrize("combine", ["max", "sum"])
def test_best_2d_split_minimises_the_worse_pass(combine):
    for B in (2 ** 21, 2 ** 19, 2 ** 17):
        plan = par.best_2d_split(B, 8192, 28672, 256, v5p, combine=combine)
        assert plan.n_fsdp * plan.n_tp == 256
        every = {Y: par.fsdp_tp_layer_times(B, 8192, 28672, 256 // Y, Y, v5p,
                                            combine=combine)
                 for Y in (1, 2, 4, 8, 16, 32, 64, 128, 256)}
        bound = [Y for Y, t in every.items() if t.compute_bound]
        if bound:                 # the least TP that hides the worse pass's collectives
            assert plan.n_tp == min(bound) and plan.times.compute_bound
        else:                     # else the least communication per FLOP
            assert plan.times.ratio == min(t.ratio for t in every.values())
    assert par.best_2d_split(1024, 64, 7, 5, v5p, combine=combine).n_tp == 1  # 1 | F = 7


def test_best_2d_split_max_against_sum():
    D, F = 8192, 28672
    # sum (shared links): at 2^21 tokens a split with less communication per step (Y = 4)
    # makes its forward pass wait longer than pure FSDP's; the worse pass decides
    plan = par.best_2d_split(2 ** 21, D, F, 256, v5p, combine="sum")
    pure = par.fsdp_tp_layer_times(2 ** 21, D, F, 256, 1, v5p, combine="sum")
    y4 = par.fsdp_tp_layer_times(2 ** 21, D, F, 64, 4, v5p, combine="sum")
    assert y4.comm < pure.comm and y4.ratio > pure.ratio and plan.n_tp == 1
    assert pure.compute_bound and par.best_2d_split(2 ** 21, D, F, 256, v5p).n_tp == 1
    # at 2^19 pure FSDP is not compute-bound: a TP of 2 is the least that is, either way
    assert not par.fsdp_tp_layer_times(2 ** 19, D, F, 256, 1, v5p).compute_bound
    assert par.best_2d_split(2 ** 19, D, F, 256, v5p, combine="sum").n_tp == 2
    # max (different links at once): at 2^17 tokens (512 per chip) a split is
    # compute-bound, where the sum says no split is
    assert par.best_2d_split(2 ** 17, D, F, 256, v5p).times.compute_bound
    assert not par.best_2d_split(2 ** 17, D, F, 256, v5p, combine="sum").times.compute_bound


# ---- pipeline --------------------------------------------------------------------------

@pytest.mark.parametrize("P,M", [(2, 1), (4, 4), (4, 8), (3, 7), (8, 16)])
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_schedules_match_the_bubble_formula(P, M, kind):
    s = par.pipeline_schedule(P, M, kind)
    assert s.busy == 2 * P * M
    assert s.steps == 2 * (M + P - 1)
    assert close(s.bubble_fraction, (P - 1) / (M + P - 1))
    assert close(par.bubble_fraction(P, M), (P - 1) / (M + P - 1))
    assert s.in_flight(0) == par.pipeline_activation_microbatches(P, M, kind)
    # every job appears once, forwards before backwards on a stage, in dependency order
    when = {}
    for p, row in enumerate(s.grid):
        for t, cell in enumerate(row):
            if cell:
                assert (cell, p) not in when
                when[(cell, p)] = t
    for m in range(M):
        for p in range(1, P):
            assert when[(("F", m), p)] > when[(("F", m), p - 1)]
            assert when[(("B", m), p - 1)] > when[(("B", m), p)]
        assert when[(("B", m), P - 1)] > when[(("F", m), P - 1)]


def test_schedule_text():
    text = par.pipeline_schedule(2, 2).text()
    assert text.splitlines()[0] == "stage 0: F0 F1  .  . b1 b0"


def test_simulate_schedule_bad_orders():
    good = [[("F", 0), ("B", 0)], [("F", 0), ("B", 0)]]
    assert par.simulate_schedule(good).steps == 4
    with pytest.raises(ValueError, match="exactly once"):
        par.simulate_schedule([[("F", 0)], [("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="before its forward"):
        par.simulate_schedule([[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="a job is"):
        par.simulate_schedule([[("X", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="non-empty"):
        par.simulate_schedule([])
    # stage 0 insists on the backward of 0 before the forward of 1, stage 1 on F1 before B0
    dead = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 0), ("F", 1), ("B", 0), ("B", 1)]]
    with pytest.raises(ValueError, match="deadlock"):
        par.simulate_schedule(dead)


def test_pipeline_bad_input():
    assert par.check_pipeline(8, 4) == 2
    with pytest.raises(ValueError, match="more than n_layers"):
        par.check_pipeline(4, 8)
    with pytest.raises(ValueError, match="does not divide"):
        par.check_pipeline(6, 4)
    with pytest.raises(ValueError, match="kind"):
        par.pipeline_schedule(4, 4, "interleaved")
    with pytest.raises(ValueError, match="n_microbatches"):
        par.bubble_fraction(4, 0)


# ---- experts ---------------------------------------------------------------------------

def test_moe():
    cap = par.moe_capacity(1024, 8, 2, 1.25)
    assert cap.per_expert == math.ceil(1.25 * 1024 * 2 / 8) and cap.slots == 8 * 320
    assert par.moe_capacity(1000, 8, 1, 1.0).per_expert == 125
    assert par.tokens_dropped([3, 5, 0, 9], 4) == 1 + 5
    import numpy as np
    assert par.tokens_dropped(np.array([3, 5]), 4) == 1
    from scalebook.roofline import critical_batch
    assert par.moe_critical_batch(4096, 14336, 8, 2, v5p) == math.ceil(4 * critical_batch(4096, 14336, v5p))
    assert close(par.moe_all_to_all_bytes(1024, 4096, 2, 8), 7 / 8 * 1024 * 2 * 4096 * 2)
    t = par.moe_layer_times(1024, 4096, 14336, 8, 2, 8, v5p)
    assert close(t.compute_forward, 4 * 1024 * 2 * 4096 * 14336 / C5p)


@pytest.mark.parametrize("cf", [0, -1.0, float("nan"), "1.25", True])
def test_capacity_factor_refused(cf):
    with pytest.raises(ValueError, match="capacity_factor"):
        par.moe_capacity(1024, 8, 2, cf)


def test_moe_bad_input():
    with pytest.raises(ValueError, match="more than n_experts"):
        par.moe_capacity(16, 4, 5, 1.0)
    with pytest.raises(ValueError, match="does not divide"):
        par.moe_layer_times(16, 8, 8, 6, 1, 4, v5p)
    with pytest.raises(ValueError, match="expert_counts"):
        par.tokens_dropped([1, -2], 1)


# ---- context parallelism ---------------------------------------------------------------

def test_ring_attention():
    S = par.ring_attention_min_block(v5p, 64, 8)
    assert close(S, 2 * C5p * 8 / (2 * W5p * 64))
    t_math, t_comm = par.ring_attention_step_times(round(S), 64, 8, 128, v5p)
    assert math.isclose(t_math, t_comm, rel_tol=0.01)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        par.ring_attention_min_block(v5p, 6, 4)


# ---- memory tools ------------------------------------------------------------------------

def test_remat_and_accumulation_and_offload():
    assert [par.mlp_saved_elements(64, 256, p) for p in par.REMAT_POLICIES] == [64, 320, 576]
    with pytest.raises(ValueError, match="policy"):
        par.mlp_saved_elements(64, 256, "some")
    assert par.accumulation_activation_bytes(100.0, 4096, 4) == 100.0 * 1024
    with pytest.raises(ValueError, match="does not divide"):
        par.accumulation_activation_bytes(1.0, 100, 3)
    assert close(par.offload_time(1.5e10, v5p), 2.0)
    assert close(par.offload_time(1.5e10, v5p, round_trip=False), 1.0)


def test_dcn():
    assert close(par.dcn_critical_batch_per_slice(v5p), 2 * C5p / (2 * v5p.dcn_bandwidth))
    assert close(par.dcn_critical_batch_per_slice(v5p, 4), 0.75 * 2 * C5p / (2 * v5p.dcn_bandwidth))
    with pytest.raises(ValueError, match="n_slices"):
        par.dcn_critical_batch_per_slice(v5p, 1)


# ---- chips with overridden figures, and bad input everywhere ---------------------------

def test_modified_chip_changes_the_answer():
    fast = v5p.with_(ici_link_bandwidth=2 * W5p)
    assert close(par.data_parallel_critical_batch(fast), par.data_parallel_critical_batch(v5p) / 2)
    assert par.max_tp_degree(28672, fast) > par.max_tp_degree(28672, v5p)
    assert close(par.dcn_critical_batch_per_slice(v5p.with_(dcn_bandwidth=1e10)),
                 2 * C5p / 2e10)


@pytest.mark.parametrize("call,word", [
    (lambda: par.dp_layer_times(0, 4, 1, 2, v5p), "D"),
    (lambda: par.dp_layer_times(4, 4, -1, 2, v5p), "tokens per chip"),
    (lambda: par.dp_layer_times(4, 4, 1, (2, 0), v5p), "n_dp"),
    (lambda: par.fsdp_layer_times(4, 4, 1, 2, "tpu-v9"), "unknown chip"),
    (lambda: par.data_parallel_critical_batch(None), "give a chip"),
    (lambda: par.data_parallel_critical_batch(v5p, 1), "n must be"),
    (lambda: par.training_memory_per_chip(1e9, 8, 4), "zero_stage"),
    (lambda: par.training_memory_per_chip(-1, 8, 1), "n_params"),
    (lambda: par.training_memory_per_chip(1e9, 0, 1), "n_shard"),
    (lambda: par.tp_mlp_layer_times(16, 64, 100, 8, v5p), "F=100 does not divide over 8"),
    (lambda: par.tp_mlp_layer_times(16, 64, 64, 2, v5p, matmuls=4), "matmuls"),
    (lambda: par.fsdp_tp_layer_times(16, 64, 60, 2, 8, v5p), "does not divide"),
    (lambda: par.check_divides("B", 10, 4), "B=10 does not divide over 4"),
    (lambda: par.offload_time(-1, v5p), "nbytes"),
    (lambda: par.moe_capacity(0, 4, 1, 1.0), "tokens"),
])
def test_bad_input_is_refused_by_name(call, word):
    with pytest.raises((ValueError, TypeError, KeyError)) as e:
        call()
    assert word in str(e.value)


def test_moe_critical_batch_with_the_experts_split():
    # an expert split over n_ep chips collects the tokens of all of them: E / (k n_ep) b*
    from scalebook import roofline
    dense = roofline.critical_batch(4096, 14336, v5p)
    assert par.moe_critical_batch(4096, 14336, 8, 2, v5p) == math.ceil(4 * dense)
    assert par.moe_critical_batch(4096, 14336, 8, 2, v5p, n_ep=8) == math.ceil(dense / 2)
    with pytest.raises(ValueError, match="does not divide"):
        par.moe_critical_batch(4096, 14336, 8, 2, v5p, n_ep=3)


def test_max_tp_degree_two_chips_have_one_link():
    # F chosen so that the torus formula allows 2, but one link (W, not 2 W) does not
    F = int(0.7 * 2 * C5p / (2 * W5p))          # m F W / (s C) = 0.7 with m = 2, s = 2
    assert par.max_tp_degree(F, v5p) == 1
    t = par.tp_mlp_layer_times(1024, 512, F - F % 2, 2, v5p)
    assert t.comm_forward > t.compute_forward     # the exact time agrees: 2 chips wait
    assert par.max_tp_degree(14336, v5p, matmuls=3) == 10          # unaffected above 2


def test_the_dcn_has_one_link_per_chip_whatever_the_mesh_shape():
    # one NIC per chip: a data axis over a 4 x 4 mesh of slices still sends on one link;
    # b* = (n-1)/n s C / (2 W) with W the v5p's 6.25e9 B/s of DCN
    want = (15 / 16) * 2 * 4.59e14 / (2 * 6.25e9)
    assert par.data_parallel_critical_batch("tpu-v5p", shape=(4, 4), network_kind="dcn") \
        == pytest.approx(want)
    one = par.dp_layer_times(8192, 28672, 4096, 16, "tpu-v5p", network_kind="dcn")
    two = par.dp_layer_times(8192, 28672, 4096, (4, 4), "tpu-v5p", network_kind="dcn")
    assert two.comm_backward == pytest.approx(one.comm_backward)
