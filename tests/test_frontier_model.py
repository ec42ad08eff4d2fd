"""Chapter 12's package side: MLA arithmetic (models.MLAConfig), DualPipe and fp8 in the
training planner, DeepSeek-V3's routing (parallelism.route_top_k, balance_router_bias),
fp8 block scaling (training.fp8_quantize), and the MoE serving extensions (inference:
attn_tp, redundant_experts, moe_prefill). Expected values are worked by hand here from
the published shapes, not read back from the functions."""

import math

import numpy as np
import pytest

from scalebook import hardware, inference as inf, parallelism as par, training
from scalebook.models import DEEPSEEK_V3, DEEPSEEK_V3_MLA, MLAConfig, get_model

MLA = DEEPSEEK_V3_MLA
H800 = hardware.preview_chip("gpu-h800")


# -- MLA -----------------------------------------------------------------------------------
def test_mla_parameters_match_the_published_shapes():
    D, H = 7168, 128
    by_hand = (D * 1536 + 1536 + 1536 * H * 192          # query latent, norm, up
               + D * 576 + 512 + 512 * H * 256           # kv latent + rope key, norm, up
               + H * 128 * D)                            # output
    assert MLA.params_per_layer() == by_hand
    # the GQA stand-in of DEEPSEEK_V3 was chosen to have the same parameters, within 0.1%
    assert math.isclose(MLA.params_per_layer(),
                        DEEPSEEK_V3.dense.attention_params_per_layer(), rel_tol=1e-3)


def test_mla_cache_and_intensity_by_hand():
    assert MLA.kv_cache_bytes_per_token(2) == 576 * 61 * 2
    assert MLA.kv_cache_bytes_per_token(1) == 576 * 61
    assert MLA.mha_cache_bytes_per_token(2) == 128 * (192 + 128) * 61 * 2
    # absorbed: 2 H (512 + 64) + 2 H 512 FLOPs per key, over 576 s bytes
    assert MLA.decode_intensity() == pytest.approx(2 * 128 * 1088 / (576 * 2))
    assert MLA.decode_intensity(queries=2) == pytest.approx(2 * MLA.decode_intensity())
    assert MLA.decode_intensity(absorbed=False) == pytest.approx(1.0)    # MHA's 2 / s
    assert MLA.expand_flops_per_key() == 2 * 512 * 128 * 256
    assert MLA.flops_per_key(False) == 2 * 128 * (192 + 128)
    assert MLA.attention_flops_per_token(4096) == 61 * 2 * 128 * 320 * 4097 / 2
    assert MLA.attention_flops_per_token(10, causal=False) == 61 * 2 * 128 * 320 * 10


def test_mla_rejects_bad_shapes():
    with pytest.raises(ValueError, match="kv_rank"):
        MLAConfig(d_model=64, n_heads=2, kv_rank=0, rope_dim=8, nope_dim=8, v_dim=8,
                  n_layers=1)


# -- DualPipe and fp8 in the planner ---------------------------------------------------------
def test_dualpipe_bubble_is_deepseeks_table_2():
    # P = 16, F = 1, B = 2, W = 1: (8 - 1)(3 + 2 - 3) = 14 against 1F1B's 15 x 3 = 45
    assert par.dualpipe_bubble(16) == 14
    assert par.one_f_one_b_bubble(16) == 45
    assert par.dualpipe_bubble(8, 1, 2, 0.5) == 3 * (1 + 2 + 2 - 1.5)
    with pytest.raises(ValueError, match="even"):
        par.dualpipe_bubble(15)


DS_KW = dict(tp=1, fsdp=128, pp=16, ep=64, microbatches=120,
             global_batch_tokens=15360 * 4096, seq_len=4096, keep_weights=True,
             remat="selective", train_tokens=14.8e12,
             routing=training.Routing(max_nodes=4, dispatch_bytes=1))


def test_dualpipe_in_the_planner():
    one = training.evaluate_plan(DEEPSEEK_V3, H800, ep_overlap=True, **DS_KW)
    dual = training.evaluate_plan(DEEPSEEK_V3, H800, dualpipe=True, **DS_KW)
    assert one.slots == 120 + 15
    assert dual.slots == pytest.approx(120 + 14 / 3)
    assert dual.bubble == pytest.approx((14 / 3) / (120 + 14 / 3))
    assert dual.ep_overlap and "DualPipe" in dual.options()
    # a second copy of the stage's bf16 weights
    stage = ((DEEPSEEK_V3.total_params() - DEEPSEEK_V3.expert_params()) / 16
             + DEEPSEEK_V3.expert_params() / (16 * 64))
    assert dual.memory.weights - one.memory.weights == pytest.approx(2 * stage)
    assert dual.step_seconds < one.step_seconds
    with pytest.raises(ValueError, match="even"):
        training.evaluate_plan(DEEPSEEK_V3, H800, dualpipe=True,
                               **{**DS_KW, "microbatches": 15, "global_batch_tokens":
                                  15 * 128 * 4096})


def test_fp8_runs_the_linear_layers_at_the_fp8_peak():
    m, h100 = get_model("llama3-8b"), hardware.get_chip("gpu-h100")
    kw = dict(tp=1, fsdp=8, global_batch_tokens=8 * 8192, seq_len=8192)
    bf, f8 = (training.evaluate_plan(m, h100, fp8=x, **kw) for x in (False, True))
    tokens = 8192            # one sequence per chip
    lin = 2 * (m.matmul_params() - m.param_breakdown().output_head) * tokens
    fwd = m.forward_flops_per_token(8192, causal=True) * tokens
    assert bf.forward.compute == pytest.approx(fwd / 9.89e14)
    assert f8.forward.compute == pytest.approx(lin / 1.979e15 + (fwd - lin) / 9.89e14)
    assert f8.backward.compute == pytest.approx(2 * lin / 1.979e15
                                                + 2 * (fwd - lin) / 9.89e14)
    with pytest.raises(ValueError, match="fp8 peak"):
        training.evaluate_plan(m, "tpu-v5e", fp8=True, **{**kw, "fsdp": 8})
    # full remat re-runs the whole forward but the head: its linear layers in fp8 too
    full = training.evaluate_plan(m, h100, fp8=True, remat="full", **kw)
    head = 2 * m.param_breakdown().output_head * tokens
    assert full.backward.compute == pytest.approx(3 * lin / 1.979e15
                                                  + (3 * (fwd - lin) - head) / 9.89e14)


def test_sms_given_to_communication_slow_the_compute():
    kw = dict(DS_KW, remat="full", dualpipe=True, fp8=True)
    free = training.evaluate_plan(DEEPSEEK_V3, H800, **kw)
    busy = training.evaluate_plan(DEEPSEEK_V3, H800, comm_sm_fraction=20 / 132, **kw)
    for a, b in ((free.forward, busy.forward), (free.backward, busy.backward)):
        assert b.compute == pytest.approx(a.compute * 132 / 112)
        assert b.networks == a.networks
    assert "15% of the compute units on communication" in busy.options()
    for bad in (1.0, -0.1, True):
        with pytest.raises(ValueError, match="comm_sm_fraction"):
            training.evaluate_plan(DEEPSEEK_V3, H800, comm_sm_fraction=bad, **kw)


# -- routing and balancing -------------------------------------------------------------------
def test_node_limited_routing_keeps_tokens_on_few_nodes():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(200, 32))
    node = np.repeat(np.arange(8), 4)
    free = par.route_top_k(scores, 8)
    limited = par.route_top_k(scores, 8, group_of=node, max_groups=4)
    nodes_free = [len(set(node[r])) for r in free]
    nodes_lim = [len(set(node[r])) for r in limited]
    assert max(nodes_free) > 4 and max(nodes_lim) <= 4
    # without a limit it is the plain top-k
    assert (np.sort(free, 1) == np.sort(np.argsort(-scores, 1)[:, :8], 1)).all()


def test_bias_only_chooses_and_balancing_evens_the_load():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(512, 16)) + np.linspace(0, 1.5, 16)
    bias = np.zeros(16)
    bias[0] = 100.0
    assert (par.route_top_k(scores, 2, bias) == 0).any(axis=1).all()
    b, loads = par.balance_router_bias(scores, 2, 200, gamma=0.01)
    mean = 512 * 2 / 16
    assert loads[0].max() > 2 * mean and loads[-1].max() < 1.1 * mean
    assert loads.sum(axis=1).tolist() == [1024] * 201
    assert b[0] > b[-1]          # the least-liked expert is pushed up


# -- fp8 block scaling -----------------------------------------------------------------------
def test_fine_grained_scaling_keeps_small_rows():
    rng = np.random.default_rng(0)
    # rows (tokens) whose scales span six decades, more than e4m3's range (2**-9 to 448)
    x = rng.normal(size=(128, 256)) * 10.0 ** rng.uniform(-6, 0, size=(128, 1))
    worst = {}
    for blk in (None, (1, 128)):
        y, n = training.fp8_quantize(x, blk)
        worst[blk] = float((np.abs(y - x).sum(1) / np.abs(x).sum(1)).max())
    assert worst[(1, 128)] < 0.05 and worst[None] > 0.5     # whole rows flushed to 0
    assert training.fp8_quantize(x, (128, 128))[1] == 2
    exact = np.array([[1.0, 2.0, -448.0, 0.5]])
    assert (training.fp8_quantize(exact, (1, 4))[0] == exact).all()
    with pytest.raises(ValueError, match="divide"):
        training.fp8_quantize(x, (1, 100))


# -- serving extensions ----------------------------------------------------------------------
FP8 = dict(weight_dtype="fp8", compute_dtype="fp8",
           kv_bytes_per_token=MLA.kv_cache_bytes_per_token(2))


def test_attn_tp_and_redundant_experts():
    base = inf.moe_decode_step(DEEPSEEK_V3, H800, 512, 4096, n_chips=32, **FP8)
    same = inf.moe_decode_step(DEEPSEEK_V3, H800, 512, 4096, n_chips=32, attn_tp=32, **FP8)
    assert same == base
    dp = inf.moe_decode_step(DEEPSEEK_V3, H800, 512, 4096, n_chips=32, attn_tp=4, **FP8)
    # each chip reads 1/4, not 1/32, of the fixed weights: the busiest chip's bytes grow
    fixed = (DEEPSEEK_V3.active_matmul_params()
             - 58 * 8 * DEEPSEEK_V3.dense.mlp_params_per_layer())
    extra = fixed * (1 / 4 - 1 / 32) / H800.hbm_bandwidth
    assert dp.t_weights - base.t_weights == pytest.approx(extra)
    assert dp.t_ar < base.t_ar
    red = inf.moe_decode_step(DEEPSEEK_V3, H800, 3200, 4096, n_chips=320, n_ep=320,
                              attn_tp=4, redundant_experts=64, **FP8)
    assert red.experts_busiest == 1.0
    with pytest.raises(ValueError, match="divide"):
        inf.moe_decode_step(DEEPSEEK_V3, H800, 320, 4096, n_chips=320, n_ep=320, **FP8)
    with pytest.raises(ValueError, match="attn_tp"):
        inf.moe_decode_step(DEEPSEEK_V3, H800, 512, 4096, n_chips=32, attn_tp=3, **FP8)


def test_fp8_dispatch_and_bf16_combine_in_decode():
    kw = dict(n_chips=144, n_ep=144, attn_tp=1, redundant_experts=32, overlap_a2a=True,
              hop_latency=0.0, **FP8)
    bf = inf.moe_decode_step(DEEPSEEK_V3, H800, 144 * 64, 4096, **kw)
    f8 = inf.moe_decode_step(DEEPSEEK_V3, H800, 144 * 64, 4096, dispatch_dtype="fp8", **kw)
    # 64 tokens a GPU, k = 8 copies of [D]: 7/144 of them over NVLink, 136/144 on the card,
    # per MoE layer a dispatch at 1 byte and a combine at 2 bytes an element
    per_byte = 7 / 144 / H800.ici_bandwidth + 136 / 144 / H800.dcn_bandwidth
    copies = 64 * 8 * 7168
    assert f8.t_a2a == pytest.approx(58 * copies * (1 + 2) * per_byte)
    assert bf.t_a2a == pytest.approx(58 * copies * (2 + 2) * per_byte)
    # MLA's absorbed attention: 2 H (2 d_c + d_r) FLOPs per key, layer and query token
    mla = inf.moe_decode_step(DEEPSEEK_V3, H800, 144 * 64, 4096, dispatch_dtype="fp8",
                              attention_flops_per_key=MLA.flops_per_key(), **kw)
    assert mla.attn_flops == 61 * 2 * 128 * (2 * 512 + 64) * 4096 * 144 * 64
    assert f8.attn_flops < mla.attn_flops         # the GQA stand-in's 4 H h is less
    with pytest.raises(ValueError, match="dispatch_dtype"):
        inf.moe_decode_step(DEEPSEEK_V3, H800, 144 * 64, 4096, dispatch_dtype="fp7", **kw)


def test_moe_prefill_by_hand():
    pf = inf.moe_prefill(DEEPSEEK_V3, H800, 4096, 32, mfu=0.5,
                         attention_flops_per_key=MLA.flops_per_key(False))
    flops = 2 * DEEPSEEK_V3.active_matmul_params() + 61 * 2 * 128 * 320 * 4097 / 2
    assert pf.flops_per_token == pytest.approx(flops)
    assert pf.t_compute == pytest.approx(flops / (0.5 * 1.979e15))
    # 4 nodes of 8: 7/32 of a token's bytes on NVLink, 24/32 on the card, one after the other
    per_byte = 7 / 32 / H800.ici_bandwidth + 24 / 32 / H800.dcn_bandwidth
    assert pf.t_a2a == pytest.approx(58 * 8 * 7168 * (1 + 2) * per_byte)
    assert pf.time_per_token == max(pf.t_compute, pf.t_a2a)
    seq = inf.moe_prefill(DEEPSEEK_V3, H800, 4096, 32, overlap=False)
    assert seq.time_per_token == pytest.approx(seq.t_compute + seq.t_a2a)


def test_node_limited_dispatch_in_prefill_and_decode_by_hand():
    """Node-limited routing (the training planner's Routing(max_nodes=4)) on 32 H800s in 4
    nodes: a token crosses InfiniBand once for each node it reaches but its own, min(8, 4,
    4) x 3/4 = 3 of its copies' bytes, while NVLink forwards the 7/8 of its 8 copies that
    land off their expert's GPU; DeepSeek overlaps the two (section 3.2.2): the longer
    sets the time."""
    def one(s):                       # one all-to-all of a token's 8 copies at s bytes
        return max(3 * 7168 * s / H800.dcn_bandwidth,
                   8 * 7168 * s * 7 / 8 / H800.ici_bandwidth)
    pf = inf.moe_prefill(DEEPSEEK_V3, H800, 4096, 32, mfu=0.5, max_nodes=4,
                         attention_flops_per_key=MLA.flops_per_key(False))
    assert pf.t_a2a == pytest.approx(58 * (one(1) + one(2)))
    every = inf.moe_prefill(DEEPSEEK_V3, H800, 4096, 32, mfu=0.5,
                            attention_flops_per_key=MLA.flops_per_key(False))
    assert pf.t_a2a < 0.6 * every.t_a2a
    # decode: the same model, for each GPU's B / n tokens (no hop latency here)
    kw = dict(n_chips=32, weight_dtype="fp8", compute_dtype="fp8", check_memory=False,
              hop_latency=0, dispatch_dtype="fp8")
    d = inf.moe_decode_step(DEEPSEEK_V3, H800, 256, 4096, max_nodes=4, **kw)
    assert d.t_a2a == pytest.approx(58 * 256 / 32 * (one(1) + one(2)))
    # one source of truth: the training planner's all-to-all of the same group agrees
    deg = training.Degrees(tp=1, fsdp=32, pp=1, dp=1, ep=32)
    nets = {"ep": "dcn"}
    for s in (1, 2):
        parts, sec, overlapped = training._all_to_all(
            H800, deg, nets, 256 / 32, 8, 7168, s, training.Routing(max_nodes=4))
        assert overlapped and sec == pytest.approx(256 / 32 * one(s))
        assert parts["dcn"] == pytest.approx(256 / 32 * 3 * 7168 * s / H800.dcn_bandwidth)
    with pytest.raises(ValueError, match="max_nodes"):
        inf.moe_prefill(DEEPSEEK_V3, H800, 4096, 32, max_nodes=0)
    with pytest.raises(ValueError, match="max_nodes"):
        inf.moe_decode_step(DEEPSEEK_V3, H800, 256, 4096, max_nodes=0, **kw)
