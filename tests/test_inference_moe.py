"""scalebook.inference's MoE serving (chapter 8, section 8.9) and multi-token prediction
(chapter 7, section 7.6): each number against a hand computation from the model shapes and
the hardware table, every bad input refused with a message."""

import itertools
import math

import pytest

from scalebook import collectives
from scalebook import inference as inf
from scalebook.hardware import get_chip
from scalebook.models import DEEPSEEK_V3, MIXTRAL_8X7B

h100, h200 = get_chip("gpu-h100"), get_chip("gpu-h200")

# Mixtral 8x7B (arXiv:2401.04088, Table 1) and the LLaMA-3 70B shapes, typed from the papers
MIX = dict(L=32, D=4096, H=32, K=8, h=128, F=14336, V=32000, E=8, k=2)
L70 = dict(L=80, D=8192, H=64, K=8, h=128, F=28672, V=128256)


def attn_params(D, H, K, h):
    return 2 * D * H * h + 2 * D * K * h


# -- expected experts ----------------------------------------------------------------------
def test_expected_experts_by_enumeration():
    """E (1 - (1 - k/E)^B) is the mean number of distinct experts over every way B tokens
    can each pick k of E experts (all equally likely)."""
    for E, k, B in [(4, 2, 2), (5, 2, 3), (6, 1, 3), (4, 3, 2)]:
        sets = list(itertools.combinations(range(E), k))
        picks = list(itertools.product(sets, repeat=B))
        mean = sum(len(set().union(*p)) for p in picks) / len(picks)
        assert inf.expected_experts(E, k, B) == pytest.approx(mean)
    assert inf.expected_experts(256, 8, 1) == pytest.approx(8)
    assert inf.expected_experts(256, 8, 1e6) == pytest.approx(256)


def test_expected_experts_bad_input():
    with pytest.raises(ValueError, match="top_k=9 experts per token is more than n_experts=8"):
        inf.expected_experts(8, 9, 4)
    with pytest.raises(ValueError, match="tokens"):
        inf.expected_experts(8, 2, -1)


# -- a decode step of Mixtral on 8 H100, by hand -------------------------------------------
def mixtral_step_by_hand(B, T, n=8, q=1):
    L, D, H, K, h, F, V, E, k = (MIX[x] for x in "L D H K h F V E k".split())
    N_e = 3 * D * F
    fixed = L * attn_params(D, H, K, h) + V * D + L * D * E        # + head, routers
    active = fixed + L * k * N_e
    E_B = E * (1 - (1 - k / E) ** (B * q))
    weight_bytes = 2 * (fixed + L * E_B * N_e)                      # bf16
    flops = 2 * active * B * q
    kv = B * T * 2 * L * K * h * 2
    attn_flops = 4 * L * H * h * T * B * q
    t_attn = max(attn_flops / (n * h100.bf16_flops), kv / (n * h100.hbm_bandwidth))
    t_math = flops / (n * h100.bf16_flops)
    # the busiest GPU (one expert each on 8 GPUs): as soon as one token runs, some GPU
    # reads its one expert
    busiest = 1.0
    t_w = 2 * (fixed / n + L * busiest * N_e) / h100.hbm_bandwidth
    a2a_in = B * q / n * k * D * 2                  # bytes each GPU dispatches
    nvlink = h100.ici_link_bandwidth * h100.ici_links
    t_a2a = 2 * L * (n - 1) / n * a2a_in / nvlink
    # 2 L all-reduces of the [B, D] outputs of attention over the 8 GPUs (ring, switch)
    t_ar = 2 * L * 2 * (n - 1) / n * B * q * D * 2 / nvlink
    return dict(E_B=E_B, weight_bytes=weight_bytes, flops=flops, kv=kv, t_attn=t_attn,
                t_math=t_math, t_w=t_w, t_a2a=t_a2a, t_ar=t_ar, busiest=busiest,
                time=t_attn + max(t_math, t_w) + t_a2a + t_ar)


@pytest.mark.parametrize("B", [1, 16, 512])
def test_mixtral_decode_step_by_hand(B):
    want = mixtral_step_by_hand(B, 4096)
    s = inf.moe_decode_step(MIXTRAL_8X7B, h100, B, 4096, n_chips=8, check_memory=B < 512,
                            hop_latency=0)
    assert s.experts_read == pytest.approx(want["E_B"])
    assert s.weight_bytes == pytest.approx(want["weight_bytes"])
    assert s.flops == pytest.approx(want["flops"])
    assert s.kv_bytes == pytest.approx(want["kv"])
    for mine, theirs in [("t_attn", "t_attn"), ("t_math", "t_math"),
                         ("t_weights", "t_w"), ("t_a2a", "t_a2a"), ("t_ar", "t_ar"),
                         ("experts_busiest", "busiest"), ("time", "time")]:
        assert getattr(s, mine) == pytest.approx(want[theirs]), mine
    assert s.optimistic <= s.time
    # one token reads its own k experts per layer: the active weights, at 2 bytes
    if B == 1:
        assert s.weight_bytes == pytest.approx(
            2 * (MIXTRAL_8X7B.active_matmul_params()))


def test_overlap_takes_the_larger_of_kernels_and_all_to_alls():
    kw = dict(n_chips=8, check_memory=False, hop_latency=0)
    plain = inf.moe_decode_step(MIXTRAL_8X7B, h100, 64, 2048, **kw)
    both = inf.moe_decode_step(MIXTRAL_8X7B, h100, 64, 2048, overlap_a2a=True, **kw)
    kernels = plain.t_attn + max(plain.t_math, plain.t_weights)
    assert both.time == pytest.approx(max(kernels, plain.t_a2a + plain.t_ar))
    assert plain.optimistic <= both.time <= plain.time


def test_deepseek_all_to_all_across_nodes_by_hand():
    """32 H200 = 4 nodes of 8: 7/32 of each GPU's routed copies go over NVLink, 24/32 over
    its NIC, one after the other; fp8 weights, 1 byte."""
    B, n = 256, 32
    s = inf.moe_decode_step(DEEPSEEK_V3, h200, B, 4096, n_chips=n, weight_dtype="fp8",
                            compute_dtype="fp8", check_memory=False, hop_latency=0)
    nbytes = B / n * 8 * 7168 * 2
    one = (nbytes * 7 / n / (h200.ici_link_bandwidth * h200.ici_links)
           + nbytes * 24 / n / h200.dcn_bandwidth)
    assert s.t_a2a == pytest.approx(2 * 58 * one)
    # within a node the collectives module's switch model
    s8 = inf.moe_decode_step(DEEPSEEK_V3, h200, 64, 4096, n_chips=8, weight_dtype="fp8",
                             compute_dtype="fp8", check_memory=False, hop_latency=0)
    a2a = collectives.collective_time("all-to-all", 64 / 8 * 8 * 7168 * 2, 8, h200)
    assert s8.t_a2a == pytest.approx(2 * 58 * a2a)


def test_copies_of_a_smaller_expert_group():
    """Two copies of a 4-GPU group: each reads the experts its own B / 2 tokens reach."""
    s = inf.moe_decode_step(MIXTRAL_8X7B, h100, 16, 1024, n_chips=8, n_ep=4)
    L, D, F, E, k = (MIX[x] for x in "L D F E k".split())
    fixed = MIXTRAL_8X7B.active_matmul_params() - L * k * 3 * D * F
    E_B = E * (1 - (1 - k / E) ** 8)
    group = 2 * (fixed + L * E_B * 3 * D * F)
    assert s.weight_bytes == pytest.approx(2 * group)
    # the busiest of 4 GPUs, 2 experts each hit with probability q = E_B / E: a
    # Binomial(2, q) count, E[max of 4] = (1 - F(0)^4) + (1 - F(1)^4)
    q = E_B / E
    f0, f1 = (1 - q) ** 2, (1 - q) ** 2 + 2 * q * (1 - q)
    busiest = (1 - f0 ** 4) + (1 - f1 ** 4)
    assert s.experts_busiest == pytest.approx(busiest)
    assert s.t_weights == pytest.approx(2 * (fixed / 4 + L * busiest * 3 * D * F)
                                        / h100.hbm_bandwidth)


def test_busiest_experts():
    # one expert per chip, B = 1 token with k = 2 of 8: two chips read one expert each
    assert inf.busiest_experts(8, 2, 1, 8) == 1.0 and inf.busiest_experts(8, 2, 0, 8) == 0
    assert inf.busiest_experts(256, 8, 4, 1) == pytest.approx(inf.expected_experts(256, 8, 4))
    assert inf.busiest_experts(256, 8, 10_000, 32) == pytest.approx(8)     # every expert
    # the busiest chip reads more than the mean, E_B / n_ep
    for B in (1, 8, 64):
        assert inf.busiest_experts(256, 8, B, 32) > inf.expected_experts(256, 8, B) / 32
    with pytest.raises(ValueError, match="n_ep=24 must divide the 256 experts"):
        inf.busiest_experts(256, 8, 4, 24)


def test_all_reduces_across_nodes_by_hand():
    """32 H200 = 4 nodes: reduce-scatter in the node, the node's 1/8 all-reduced over the 4
    nodes on each GPU's NIC, all-gather in the node, pipelined (the slower part sets the
    pace), and 2 x 7 + 2 x 3 steps of 1 us each."""
    B, n = 256, 32
    kw = dict(n_chips=n, weight_dtype="fp8", compute_dtype="fp8", check_memory=False)
    s = inf.moe_decode_step(DEEPSEEK_V3, h200, B, 4096, hop_latency=0, **kw)
    nbytes = B * 7168 * 2
    nvlink = h200.ici_link_bandwidth * h200.ici_links
    one = max(2 * 7 / 8 * nbytes / nvlink, 2 * 3 / 4 * nbytes / 8 / h200.dcn_bandwidth)
    assert s.t_ar == pytest.approx(2 * 61 * one)
    lat = inf.moe_decode_step(DEEPSEEK_V3, h200, B, 4096, hop_latency=1e-6, **kw)
    assert lat.t_ar == pytest.approx(2 * 61 * (one + 20e-6))
    # the all-to-alls wait one hop in the node and one across
    assert lat.t_a2a == pytest.approx(s.t_a2a + 2 * 58 * 2e-6)
    dense = inf.moe_decode_step("llama3-70b", h200, 64, 2048, n_chips=8)
    assert dense.t_ar == 0                          # chapter 7's step: no communication
    assert inf.moe_decode_step("llama3-70b", h200, 64, 2048, n_chips=8,
                               all_reduces=True).t_ar > 0


def test_a_dense_model_is_the_per_kernel_step():
    """LLaMA-3 70B: no experts, no all-to-all; the weights are the matmul parameters."""
    s = inf.moe_decode_step("llama3-70b", h200, 64, 2048, n_chips=8, weight_dtype="fp8",
                            compute_dtype="fp8")
    N_mm = L70["L"] * (attn_params(L70["D"], L70["H"], L70["K"], L70["h"])
                       + 3 * L70["D"] * L70["F"]) + L70["V"] * L70["D"]
    kv = 64 * 2048 * 2 * L70["L"] * L70["K"] * L70["h"] * 2
    t_w = N_mm / (8 * h200.hbm_bandwidth)
    t_math = 2 * N_mm * 64 / (8 * h200.fp8_flops)
    t_attn = kv / (8 * h200.hbm_bandwidth)
    assert s.t_a2a == 0 and s.experts_read == 0
    assert s.time == pytest.approx(t_attn + max(t_math, t_w))


def test_critical_batch_dense_and_moe():
    # dense: 2 N B / C = N s / W, so B* = C s / (2 W), whatever the model
    assert inf.moe_critical_batch("llama3-70b", h100) == pytest.approx(
        h100.bf16_flops * 2 / (2 * h100.hbm_bandwidth), rel=1e-9)
    b_dense = h200.fp8_flops / (2 * h200.hbm_bandwidth)
    b = inf.moe_critical_batch(DEEPSEEK_V3, h200, 32, weight_dtype="fp8",
                               compute_dtype="fp8")
    s = inf.moe_decode_step(DEEPSEEK_V3, h200, 32 * round(b / 32), 4096, n_chips=32,
                            weight_dtype="fp8", compute_dtype="fp8", check_memory=False)
    assert s.t_math == pytest.approx(s.t_weights, rel=0.01)      # the crossing
    # between B* and B* E / k, near B* N_total / N_active (matmul parameters)
    total_mm = DEEPSEEK_V3.active_matmul_params() + 58 * (256 - 8) * 3 * 7168 * 2048
    assert b_dense < b < b_dense * 256 / 8
    assert b == pytest.approx(b_dense * total_mm / DEEPSEEK_V3.active_matmul_params(),
                              rel=0.02)


def test_moe_bad_input():
    with pytest.raises(ValueError, match="must divide the 8 experts"):
        inf.moe_decode_step(MIXTRAL_8X7B, h100, 6, 1024, n_chips=6)
    with pytest.raises(ValueError, match="n_ep=4 must divide n_chips=6"):
        inf.moe_decode_step(MIXTRAL_8X7B, h100, 6, 1024, n_chips=6, n_ep=4)
    with pytest.raises(ValueError, match="batch=3 does not split over the 2 copies"):
        inf.moe_decode_step(MIXTRAL_8X7B, h100, 3, 1024, n_chips=8, n_ep=4)
    with pytest.raises(ValueError, match="dense model"):
        inf.moe_decode_step("llama3-8b", h100, 4, 1024, n_chips=8, n_ep=4)
    with pytest.raises(ValueError, match="exceed .* of HBM by"):
        inf.moe_decode_step(MIXTRAL_8X7B, h100, 1, 1024, n_chips=1)
    with pytest.raises(ValueError, match="MoEConfig"):
        inf.moe_decode_step("mixtral", h100, 1, 1024)
    with pytest.raises(ValueError, match="weight_dtype"):
        inf.moe_decode_step(MIXTRAL_8X7B, h100, 1, 1024, n_chips=8, weight_dtype="fp7")
    with pytest.raises(ValueError, match="batch"):
        inf.moe_decode_step(MIXTRAL_8X7B, h100, 0, 1024, n_chips=8)
    with pytest.raises(ValueError, match="overlap_a2a"):
        inf.moe_decode_step(MIXTRAL_8X7B, h100, 1, 1024, n_chips=8, overlap_a2a="yes")
    with pytest.raises(ValueError, match="no dcn_bandwidth"):
        inf.moe_decode_step(DEEPSEEK_V3, h200.with_(dcn_bandwidth=None), 32, 1024,
                            n_chips=32, weight_dtype="fp8", check_memory=False)


# -- multi-token prediction ----------------------------------------------------------------
def test_mtp_module_params_by_hand():
    D, V = 7168, 129280
    layer = attn_params(D, 128, 8, 96) + (256 + 1) * 3 * D * 2048 + D * 256
    assert inf.mtp_module_params(DEEPSEEK_V3) == layer + 2 * D * D + V * D
    D, F, V = L70["D"], L70["F"], L70["V"]
    assert inf.mtp_module_params("llama3-70b") == (
        attn_params(D, 64, 8, 128) + 3 * D * F + 2 * D * D + V * D)


def dense_step(N_mm, kv_tok, L, H, h, B, T, q, n, chip, sw):
    kv = B * T * kv_tok
    t_attn = max(4 * L * H * h * T * B * q / (n * chip.bf16_flops),
                 kv / (n * chip.hbm_bandwidth))
    return t_attn + max(2 * N_mm * B * q / (n * chip.fp8_flops),
                        N_mm * sw / (n * chip.hbm_bandwidth))


@pytest.mark.parametrize("B,T", [(1, 1024), (128, 1024), (1024, 256)])
def test_mtp_speedup_by_hand(B, T):
    """LLaMA-3 70B, fp8 weights and compute on 8 H200, alpha 0.85, one MTP module."""
    L, D, H, K, h, F, V = (L70[x] for x in "L D H K h F V".split())
    N_mm = L * (attn_params(D, H, K, h) + 3 * D * F) + V * D
    kv_tok = 2 * L * K * h * 2
    t1 = dense_step(N_mm, kv_tok, L, H, h, B, T, 1, 8, h200, 1)
    t2 = dense_step(N_mm, kv_tok, L, H, h, B, T, 2, 8, h200, 1)
    module = attn_params(D, H, K, h) + 3 * D * F + 2 * D * D + V * D
    tm = dense_step(module, kv_tok / L, 1, H, h, B, T, 1, 8, h200, 1)
    want = (1 + 0.85) / (t2 / t1 + tm / t1)
    g = inf.mtp_speedup("llama3-70b", h200, B, T, 0.85, 1, n_chips=8, weight_dtype="fp8",
                        compute_dtype="fp8", check_memory=False)
    assert g.tokens_per_step == pytest.approx(1.85)
    assert g.verify_ratio == pytest.approx(t2 / t1)
    assert g.rho == pytest.approx(tm / t1)
    assert g.speedup == pytest.approx(want)
    if B == 1:    # memory-bound: verifying two tokens costs one step
        assert g.verify_ratio == pytest.approx(1, abs=1e-3)
    # a given rho replaces the module's
    assert inf.mtp_speedup("llama3-70b", h200, B, T, 0.85, 1, n_chips=8,
                           weight_dtype="fp8", compute_dtype="fp8", rho=0.03,
                           check_memory=False).speedup == pytest.approx(
        1.85 / (t2 / t1 + 0.03))


def test_mtp_on_an_moe_reads_more_experts_at_batch_one():
    """DeepSeek-V3 at batch 1: the verification's 2 tokens reach 8 (2 - 8/256) experts per
    MoE layer instead of 8, so it costs more than one step."""
    g = inf.mtp_speedup(DEEPSEEK_V3, h200, 1, 4096, 0.85, n_chips=32, weight_dtype="fp8",
                        compute_dtype="fp8")
    one = inf.moe_decode_step(DEEPSEEK_V3, h200, 1, 4096, n_chips=32, weight_dtype="fp8",
                              compute_dtype="fp8", queries=2)
    assert one.experts_read == pytest.approx(256 * (1 - (1 - 8 / 256) ** 2))
    assert g.t_verify == pytest.approx(one.time)
    # the busiest GPU reads more experts in the verification; with the hop latency of the
    # collectives (paid once per step, whatever the tokens) the step grows by less
    plain = inf.moe_decode_step(DEEPSEEK_V3, h200, 1, 4096, n_chips=32, weight_dtype="fp8",
                                compute_dtype="fp8")
    assert one.experts_busiest > 1.3 * plain.experts_busiest
    assert one.t_weights > 1.3 * plain.t_weights and 1.05 < g.verify_ratio < 1.3


def test_break_even_batch():
    kw = dict(n_chips=32, weight_dtype="fp8", compute_dtype="fp8", overlap_a2a=True,
              kv_bytes_per_token=576 * 61 * 2)
    b = inf.mtp_break_even_batch(DEEPSEEK_V3, h200, 4096, 0.85, **kw)
    below = inf.mtp_speedup(DEEPSEEK_V3, h200, b, 4096, 0.85, check_memory=False, **kw)
    above = inf.mtp_speedup(DEEPSEEK_V3, h200, b - 1, 4096, 0.85, check_memory=False, **kw)
    assert below.speedup < 1 <= above.speedup
    # with two copies of a 16-GPU group the batch is a multiple of 2
    b2 = inf.mtp_break_even_batch(DEEPSEEK_V3, h200, 4096, 0.85, n_ep=16, **kw)
    kw2 = dict(kw, n_ep=16, check_memory=False)
    assert b2 % 2 == 0
    assert (inf.mtp_speedup(DEEPSEEK_V3, h200, b2, 4096, 0.85, **kw2).speedup < 1
            <= inf.mtp_speedup(DEEPSEEK_V3, h200, b2 - 2, 4096, 0.85, **kw2).speedup)
    # a model that always pays: alpha = 1 with a free module
    assert inf.mtp_break_even_batch("llama3-8b", h100, 1024, 1.0, rho=0.0,
                                    max_batch=2 ** 12) is None


def test_mtp_bad_input():
    with pytest.raises(ValueError, match="alpha"):
        inf.mtp_speedup("llama3-70b", h200, 1, 1024, 1.5, n_chips=8)
    with pytest.raises(ValueError, match="gamma"):
        inf.mtp_speedup("llama3-70b", h200, 1, 1024, 0.8, 0, n_chips=8)
    with pytest.raises(ValueError, match="rho"):
        inf.mtp_speedup("llama3-70b", h200, 1, 1024, 0.8, n_chips=8, rho=-0.1)
    with pytest.raises(ValueError, match="exceed"):
        inf.mtp_speedup("llama3-70b", h200, 1, 1024, 0.8, n_chips=1)


def test_speedup_never_beats_the_tokens_per_step():
    for B in (1, 64, 4096):
        g = inf.mtp_speedup(MIXTRAL_8X7B, h100, 8 * B, 2048, 0.8, 2, n_chips=8,
                            check_memory=False)
        assert g.speedup <= g.tokens_per_step and math.isfinite(g.speedup)
