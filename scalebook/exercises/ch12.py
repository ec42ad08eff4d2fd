"""Chapter 12 exercises: beyond LLaMA-3 (DeepSeek-V3). Reference answers are computed
from scalebook (models.DEEPSEEK_V3 and DEEPSEEK_V3_MLA, MLAConfig, parallelism's pipeline
bubbles, hardware.preview_chip("gpu-h800")).

Where a scalebook function gives an answer directly (``parallelism.dualpipe_bubble`` for
12.7 and 12.13, ``MLAConfig.decode_intensity`` for 12.5), the check cannot tell and
accepts it; the chapter says so.
"""

from __future__ import annotations

import math

from .. import parallelism as par
from ..hardware import preview_chip
from ..models import DEEPSEEK_V3, MLAConfig, get_model
from .core import register
from .kinds import (ChoiceExercise, CodeExercise, NumericExercise, VariedNumericExercise,
                    as_number)

_DS = DEEPSEEK_V3
_D = _DS.dense.d_model
_BYTES = {"fp8": 1, "bf16": 2}


def _close(a, b, rtol=0.005):
    a = as_number(a)
    return a is not None and b != 0 and math.isclose(a, b, rel_tol=rtol)


# 12.1 routed parameters one token meets --------------------------------------------------
def _ex1(k=8, F=2048):
    return _DS.moe_layers * k * 3 * _D * F


def _ex1_hints(k, F):
    return [
        (lambda a: _close(a, _DS.dense.n_layers * k * 3 * _D * F),
         f"only {_DS.moe_layers} of the {_DS.dense.n_layers} layers are MoE layers; the "
         f"first {_DS.dense_layers} keep a dense MLP."),
        (lambda a: _close(a, _DS.moe_layers * k * 2 * _D * F),
         "an expert is a gated MLP: three matrices (gate, up, down), 3 D F parameters."),
        (lambda a: _close(a, _DS.moe_layers * (k + 1) * 3 * _D * F),
         "that counts the shared expert too; the question asks for the routed ones."),
        (lambda a: _close(a, _DS.moe_layers * _DS.n_experts * 3 * _D * F),
         "that is every routed expert, what memory holds; a token meets only k of them."),
        (lambda a: _close(a, _DS.moe_layers * k * _D * F),
         "an expert is a gated MLP: three matrices (gate, up, down) of D x F each."),
        (lambda a: _close(a, k * 3 * _D * F),
         f"that is one layer; count all {_DS.moe_layers} MoE layers."),
    ]


register(VariedNumericExercise(
    id="12.1", title="Routed parameters one token meets", unit="parameters", rtol=0.02,
    params={"k": 8, "F": 2048},
    choose={"k": (2, 4, 6, 8, 12, 16), "F": (1024, 1536, 2048, 3072, 4096)},
    solve=_ex1, hints_for=_ex1_hints,
    statement="A model has DeepSeek-V3's shapes (`scalebook.models.DEEPSEEK_V3`: $D$ = "
              "7,168, 61 layers of which the first 3 are dense and the other 58 MoE "
              "layers of 256 routed gated experts and one shared expert), but each token "
              "is routed to $k$ = {k} experts of width $F$ = {F:,}. How many parameters of "
              "the *routed* experts does one token meet, over all layers?",
))


# 12.2 bytes a token sends on the card under node-limited routing -------------------------
def _ex2(max_nodes=4, dtype="fp8", D=_D):
    return (max_nodes - 1) * D * _BYTES[dtype]


def _ex2_hints(max_nodes, dtype, D=_D):
    s = _BYTES[dtype]
    other = "bf16" if dtype == "fp8" else "fp8"
    return [
        (lambda a: _close(a, max_nodes * D * s),
         "one of the nodes is the token's own: its copy stays on NVLink, not the card."),
        (lambda a: _close(a, _DS.top_k * D * s) or _close(a, (_DS.top_k - 1) * D * s),
         "with node-limited routing the token crosses the network once per node, and "
         "the node forwards it to its experts there; not once per expert."),
        (lambda a: _close(a, (max_nodes - 1) * D * _BYTES[other]),
         f"the dispatch is in {dtype}: {s} byte(s) per element."),
    ]


register(VariedNumericExercise(
    id="12.2", title="A node-limited dispatch on the card", unit="bytes", rtol=0.02,
    params={"max_nodes": 4, "dtype": "fp8", "D": 7168},
    choose={"max_nodes": (2, 3, 4, 6), "dtype": ("fp8", "bf16"),
            "D": (4096, 5120, 7168, 8192)},
    solve=_ex2, hints_for=_ex2_hints,
    statement="A model like DeepSeek-V3 ($D$ = {D:,}, $k$ = 8) routes each token to "
              "experts on at most {max_nodes} nodes, one of them the token's own. Across nodes a token "
              "sends one copy of its $[D]$ activation, in {dtype}, to each other node it "
              "visits, which forwards it to the experts there over NVLink. At most how "
              "many bytes of one token leave its GPU on the network card in one MoE "
              "layer's dispatch?",
))


# 12.3 MLA's cache per token --------------------------------------------------------------
def _ex3(L=40, dtype="fp8"):
    return L * (512 + 64) * _BYTES[dtype]


def _ex3_hints(L, dtype):
    s = _BYTES[dtype]
    return [
        (lambda a: _close(a, L * 512 * s), "add the rotary key, d_r = 64 values per layer, "
                                           "which the latent cannot carry."),
        (lambda a: _close(a, 2 * L * 576 * s),
         "twice the answer: the latent is cached once, not as a key and a value"
         + (", and an fp8 value is 1 byte." if dtype == "fp8" else ".")),
        (lambda a: _close(a, 128 * L * 576 * s), "the latent is shared by all heads: "
                                                 "cache it once per layer, not per head."),
        (lambda a: _close(a, 576 * s), f"that is one layer; this model has {L}."),
        (lambda a: _close(a, 61 * 576 * s) and L != 61,
         f"this model has {L} layers (DeepSeek-V3's 61 are not the question)."),
        (lambda a: _close(a, L * 128 * (192 + 128) * s),
         "that is the uncompressed cache, every head's key (128 + 64) and value (128); MLA "
         "caches the latent and the rotary key, d_c + d_r per layer."),
    ]


register(VariedNumericExercise(
    id="12.3", title="A latent cache per token", unit="bytes", rtol=0.02,
    params={"L": 40, "dtype": "fp8"},
    choose={"L": (27, 40, 48, 60, 80), "dtype": ("fp8", "bf16")},
    solve=_ex3, hints_for=_ex3_hints,
    statement="A model with {L} layers uses multi-head latent attention with DeepSeek-V3's "
              "widths, $d_c$ = 512 and $d_r$ = 64, and 128 heads, and stores its cache in "
              "{dtype}. How many bytes of cache does one token leave?",
))


# 12.4 sequences whose latent cache fits beside the fp8 weights -------------------------
def _ex4(gpus=16, context=32768, fraction=0.9, kv=None):
    h = preview_chip("gpu-h800")
    from ..models import DEEPSEEK_V3_MLA
    per_token = DEEPSEEK_V3_MLA.kv_cache_bytes_per_token(2) if kv is None else kv
    free = fraction * gpus * h.hbm_bytes - _DS.weight_bytes(1)
    return math.floor(free / (context * per_token))


register(NumericExercise(
    id="12.4", title="Long sequences beside DeepSeek-V3's fp8 weights", unit="sequences",
    integer=True, reference=_ex4,
    hints=[
        (lambda a: a == _ex4(kv=2 * 61 * 8 * 96 * 2),
         "that is the GQA stand-in's cache (8 KV heads of 96); DeepSeek-V3 caches the "
         "latent and the rotary key, (512 + 64) L values of 2 bytes."),
        (lambda a: a == _ex4(fraction=1.0), "only 90% of each GPU's HBM is usable."),
        (lambda a: a == _ex4(kv=61 * 576), "the cache is bf16: 2 bytes per value."),
        (lambda a: a == math.ceil((0.9 * 16 * 80e9 - _DS.weight_bytes(1))
                                  / (32768 * 61 * 576 * 2)),
         "round down: a sequence that does not fit whole does not fit."),
        (lambda a: a == math.floor(0.9 * 16 * 80e9 / (32768 * 61 * 576 * 2)),
         "subtract the fp8 weights first: the cache gets what they leave."),
        (lambda a: a == _ex4(gpus=1) or a == math.floor(
            (0.9 * 80e9 - _DS.weight_bytes(1) / 16) / (32768 * 61 * 576 * 2)),
         "that is one GPU's share; the 16 GPUs hold the sequences together."),
    ],
))


# 12.5 absorbed decode intensity ---------------------------------------------------------
_V2_LITE = MLAConfig(d_model=2048, n_heads=16, kv_rank=512, rope_dim=64, nope_dim=128,
                     v_dim=128, n_layers=27)


def _ex5(H=16, s=2):
    return 2 * H * (2 * 512 + 64) / ((512 + 64) * s)


register(NumericExercise(
    id="12.5", title="Arithmetic intensity of absorbed MLA decode", unit="FLOPs/byte",
    rtol=0.02, reference=lambda: _V2_LITE.decode_intensity(True, 1, 2),
    hints=[
        (lambda a: _close(a, _ex5(H=128)),
         "8x too large: that is with DeepSeek-V3's 128 heads; DeepSeek-V2-Lite, the model "
         "asked about, has 16. (Or bits counted for bytes?)"),
        (lambda a: _close(a, 2 * 16 * 576 / (576 * 2)),
         "count the weighted sum of latents too: 2 H d_c FLOPs per key besides the "
         "scores' 2 H (d_c + d_r)."),
        (lambda a: _close(a, _ex5() / 16), "all 16 heads read the same latent: the bytes "
                                           "are read once for all of them."),
        (lambda a: _close(a, 2 * 16 * 1088 / (512 * 2)),
         "the cache read per key includes the rotary key: (d_c + d_r) s bytes."),
        (lambda a: _close(a, _ex5(s=1)), "the cache is bf16: 2 bytes per value."),
        (lambda a: _close(a, _ex5() / 2), "a multiply-add is 2 FLOPs."),
        (lambda a: _close(a, (2 * 16 * 192 + 2 * 16 * 128) / (576 * 2)),
         "absorbed, the queries meet the latent itself: 2 H (d_c + d_r) FLOPs per key for "
         "the scores and 2 H d_c for the weighted sum, not the heads' 192 and 128."),
        (lambda a: _close(a, _ex5() * 576 / (16 * 320)),
         "the bytes read per key are the cache's, the latent and the rotary key "
         "(d_c + d_r) s, not every head's uncompressed key and value."),
        (lambda a: _close(a, 1 / _ex5()), "that is bytes per FLOP; the intensity is FLOPs "
                                          "per byte, its inverse."),
    ],
))


# 12.6 where the balancing bias acts -----------------------------------------------------
# Four experts A-D: A overloaded (bias -bA), D underloaded (bias +bD); top-2. The bias
# picks D over A or B; the gates use the raw scores.
def _chosen6(sA, sB, sC, sD, bA, bD, biased=True):
    """The two experts a token picks, by score plus bias (or the raw score)."""
    s = {"A": sA + (-bA if biased else 0), "B": sB, "C": sC, "D": sD + (bD if biased else 0)}
    return sorted(s, key=s.get, reverse=True)[:2]


def _ex6(sA=0.90, sB=0.70, sC=0.60, sD=0.45, bA=0.25, bD=0.30):
    raw = {"A": sA, "B": sB, "C": sC, "D": sD}
    return sD / sum(raw[e] for e in _chosen6(sA, sB, sC, sD, bA, bD))


def _valid6(sA, sB, sC, sD, bA, bD):
    """D is picked only with the bias, no two biased scores tie, and the answer and the
    typical slips (the hints' numbers) are 3% apart or more."""
    biased = sorted([sA - bA, sB, sC, sD + bD])
    if not ("D" in _chosen6(sA, sB, sC, sD, bA, bD)
            and "D" not in _chosen6(sA, sB, sC, sD, bA, bD, biased=False)
            and all(y - x > 0.02 for x, y in zip(biased, biased[1:]))):
        return False
    values = [_ex6(sA, sB, sC, sD, bA, bD)] + _slips6(sA, sB, sC, sD, bA, bD)
    return all(abs(x - y) > 0.03 * max(x, y) for i, x in enumerate(values)
               for y in values[i + 1:])


def _slips6(sA, sB, sC, sD, bA, bD):
    """The typical slips' answers: the gate from the biased scores, D's raw score alone,
    normalised over all four, the other chosen expert's gate."""
    raw = {"A": sA, "B": sB, "C": sC, "D": sD}
    biased = {"A": sA - bA, "B": sB, "C": sC, "D": sD + bD}
    picked = _chosen6(sA, sB, sC, sD, bA, bD)
    other = next(e for e in picked if e != "D")
    return [biased["D"] / sum(biased[e] for e in picked), sD, sD / sum(raw.values()),
            raw[other] / (sD + raw[other]),
            math.exp(sD) / (math.exp(sD) + math.exp(raw[other])), sD + bD]


def _ex6_hints(sA, sB, sC, sD, bA, bD):
    raw = {"A": sA, "B": sB, "C": sC, "D": sD}
    biased = {"A": sA - bA, "B": sB, "C": sC, "D": sD + bD}
    picked = _chosen6(sA, sB, sC, sD, bA, bD)
    other = next(e for e in picked if e != "D")
    return [
        (lambda a: _close(a, biased["D"] / sum(biased[e] for e in picked)),
         "the bias only chooses the experts: the gates are the raw scores, divided by the "
         "sum of the k chosen raw scores."),
        (lambda a: a == 0, "with its bias D is among the top 2: the bias is added to the "
                           "scores to choose (the gates then use the raw scores)."),
        (lambda a: _close(a, sD), "divide by the sum of the 2 chosen scores: the gates of a "
                                  "token's experts add up to 1."),
        (lambda a: _close(a, sD / sum(raw.values()))
         or any(_close(a, sD / (sD + raw[x] + raw[y])) for x, y in (("A", "B"), ("A", "C"),
                                                                    ("B", "C"))),
         "normalise over the 2 chosen experts only, not all four (or three)."),
        (lambda a: _close(a, raw[other] / (sD + raw[other])),
         f"that is the gate of {other}, the other expert chosen; the question asks for D's."),
        (lambda a: _close(a, math.exp(sD) / (math.exp(sD) + math.exp(raw[other]))),
         "the gates are the sigmoid scores divided by their sum over the chosen experts, "
         "not a softmax."),
        (lambda a: _close(a, sD + bD), "that is D's biased score, which only chooses; its "
                                       "gate is its raw score over the chosen raw scores' sum."),
    ]


register(VariedNumericExercise(
    id="12.6", title="Where the balancing bias acts", unit="fraction", rtol=0.01,
    params={"sA": 0.90, "sB": 0.70, "sC": 0.60, "sD": 0.45, "bA": 0.25, "bD": 0.30},
    choose={"sA": (0.85, 0.9, 0.95), "sB": (0.65, 0.7, 0.75), "sC": (0.55, 0.6),
            "sD": (0.3, 0.35, 0.4, 0.45, 0.5), "bA": (0.2, 0.25, 0.3, 0.4),
            "bD": (0.25, 0.3, 0.35, 0.4)},
    solve=_ex6, hints_for=_ex6_hints, valid=_valid6,
    statement="A DeepSeek-V3-style router (top-2 of four experts, sigmoid scores, "
              "auxiliary-loss-free balancing) gives a token the scores A {sA}, B {sB}, "
              "C {sC}, D {sD}. Expert A has been overloaded, and its balancing bias is now "
              "-{bA}; D has been underloaded, and its bias is +{bD}; B's and C's are 0. "
              "What weight (gate) does expert D's output get in the token's output?",
))


# 12.7 DualPipe's bubble -----------------------------------------------------------------
def _ex7(P=8, M=20):
    fill = par.dualpipe_bubble(P) / 3          # pass pairs, F = 1, B = 2, W = 1
    return fill / (M + fill)


def _ex7_hints(P, M):
    fill = par.dualpipe_bubble(P) / 3
    return [
        (lambda a: _close(a, fill / M),
         "that is the idle time over the work alone: the fraction of the step is idle / "
         "(idle + N_mb pass pairs)."),
        (lambda a: _close(a, (P - 1) / (M + P - 1)),
         "that is 1F1B's bubble, (P - 1) / (N_mb + P - 1); DualPipe's fill and drain is "
         "(P/2 - 1)(T_f&b + T_bwd - 3 T_wgt)."),
        (lambda a: _close(a, 2 * (P / 2 - 1) / (M + 2 * (P / 2 - 1))),
         "the idle time (P/2 - 1)(T_f&b + T_bwd - 3 T_wgt) is in units of T_fwd; divide "
         "by T_fwd + T_bwd = 3 to count it in forward-backward pass pairs."),
        (lambda a: _close(a, 5 * (P / 2 - 1) / 3 / (M + 5 * (P / 2 - 1) / 3)),
         "subtract 3 T_wgt: the weight-gradient halves of the backward fill the bubble."),
        (lambda a: _close(a, 2 * (P - 1) / 3 / (M + 2 * (P - 1) / 3)),
         "DualPipe feeds microbatches from both ends: P/2 - 1, not P - 1, stage pairs."),
        (lambda a: _close(a, 2 * (P / 2) / 3 / (M + 2 * (P / 2) / 3)),
         "the fill and drain have P/2 - 1 stage pairs, not P/2."),
        (lambda a: _close(a, (P / 2 - 1) / 3 / (M + (P / 2 - 1) / 3)),
         "a forward and a backward chunk overlapped still compute both: T_f&b = T_fwd + "
         "T_bwd = 3, not max(T_fwd, T_bwd)."),
        (lambda a: _close(a, 4 * (P / 2 - 1) / 3 / (M + 4 * (P / 2 - 1) / 3)),
         "subtract 3 T_wgt, not T_wgt once: the formula is (P/2 - 1)(T_f&b + T_bwd - "
         "3 T_wgt)."),
    ]


register(VariedNumericExercise(
    id="12.7", title="DualPipe's bubble", unit="fraction", rtol=0.02,
    params={"P": 8, "M": 20},
    choose={"P": (4, 8, 16, 32), "M": (8, 16, 20, 32, 64)},
    solve=_ex7, hints_for=_ex7_hints,
    statement="A pipeline of $P$ = {P} stages runs {M} microbatches with DualPipe. With "
              "a chunk's forward taking $T_{{\\mathrm{{fwd}}}}$ = 1, its backward "
              "$T_{{\\mathrm{{bwd}}}}$ = 2, the backward's weight-gradient part "
              "$T_{{\\mathrm{{wgt}}}}$ = 1 and $T_{{\\mathrm{{f\\&b}}}} = "
              "T_{{\\mathrm{{fwd}}}} + T_{{\\mathrm{{bwd}}}}$, what fraction of the step "
              "does each stage idle in the fill and drain (idle time over idle time plus "
              "the $N_{{\\mathrm{{mb}}}}$ pass pairs of work, all in units of a "
              "forward-backward pass pair)?",
))


# 12.8 fp8 speed-up of the compute at a long context -------------------------------------
def _share(S, k=8):
    from ..models import DEEPSEEK_V3_MLA
    head = _DS.dense.param_breakdown().output_head
    active = (_DS.active_matmul_params()
              + _DS.moe_layers * (k - _DS.top_k) * _DS.dense.mlp_params_per_layer())
    lin = 2 * (active - head - _DS.router_params())
    return lin / (2 * active + DEEPSEEK_V3_MLA.attention_flops_per_token(S))


def _ex8(S=32768, k=8):
    f = _share(S, k)
    return 1 / (1 - f + f / 2)


def _ex8_hints(S, k=8):
    f = _share(S, k)
    return [
        (lambda a: _close(a, 2.0), "only the linear layers run in fp8; attention, the "
                                   "router and the head stay bf16 (Amdahl)."),
        (lambda a: _close(a, f) or _close(a, 1 + f),
         "that is the fp8 share of the FLOPs; the speed-up is 1 / ((1 - f) + f / 2)."),
        (lambda a: _close(a, 1 - f / 2),
         "that is the new time over the old, (1 - f) + f / 2; the speed-up is its "
         "inverse."),
        (lambda a: _close(a, _ex8(4096, k)), "that is at 4K tokens; at a longer context "
                                             "attention takes a larger share."),
        (lambda a: _close(a, _speedup8(_fwd8(S, k)[0], _fwd8(S, k)[2]), 0.002),
         "the output head and the router stay in bf16: take them out of the fp8 FLOPs."),
        (lambda a: _close(a, _speedup8(_fwd8(S, k)[1], _fwd8(S, k)[0])),
         "add MLA's attention FLOPs (bf16) to the forward: at a long context they are a "
         "large share."),
        (lambda a: _close(a, _speedup8(_fwd8(S, k)[1], _fwd8(S, k, causal=False)[2])),
         "the attention is causal: a token meets (S + 1) / 2 keys on average "
         "(attention_flops_per_token's default)."),
    ]


def _fwd8(S, k=8, causal=True):
    """DeepSeek-V3's forward FLOPs per token: (every weight matmul, the fp8 linear layers,
    the whole forward)."""
    from ..models import DEEPSEEK_V3_MLA
    head = _DS.dense.param_breakdown().output_head
    active = (_DS.active_matmul_params()
              + _DS.moe_layers * (k - _DS.top_k) * _DS.dense.mlp_params_per_layer())
    lin = 2 * (active - head - _DS.router_params())
    return (2 * active, lin,
            2 * active + DEEPSEEK_V3_MLA.attention_flops_per_token(S, causal=causal))


def _speedup8(fp8, fwd):
    f = fp8 / fwd
    return 1 / (1 - f + f / 2)


def _valid8(S, k):
    """The head and router left in fp8 is 2.5 tolerances off the answer or more (at long
    contexts they are too small a share to tell)."""
    return _speedup8(_fwd8(S, k)[0], _fwd8(S, k)[2]) > _ex8(S, k) * (1 + 2.5 * 0.003)


register(VariedNumericExercise(
    id="12.8", title="What fp8 buys at a long context", unit="ratio", rtol=0.003,
    params={"S": 32768, "k": 8},
    choose={"S": (8192, 16384, 32768, 65536, 131072), "k": (4, 6, 8, 12)},
    solve=_ex8, hints_for=_ex8_hints, valid=_valid8,
    statement="DeepSeek-V3, with each token routed to $k$ = {k} experts, runs its forward "
              "pass at a context of $S$ = {S:,} tokens: the linear "
              "layers (every matmul one token meets but the output head and the router) "
              "run at the fp8 peak, twice bf16's; MLA's attention "
              "(`DEEPSEEK_V3_MLA.attention_flops_per_token`, causal), the router and the "
              "head run in bf16. If the compute is at peak throughout, how many times "
              "faster is the forward than all in bf16?",
))


# 12.9 the scales' bytes -----------------------------------------------------------------
def _ex9(T=4096, D=7168):
    return T * D / 128 * 4


def _ex9_hints(T, D):
    return [
        (lambda a: _close(a, T * D / 128 ** 2 * 4),
         "activations are scaled per 1 x 128 tile (one token, 128 channels), not per "
         "128 x 128 block (that is the weights')."),
        (lambda a: _close(a, T * D / 128), "each scale is fp32: 4 bytes."),
        # one scale per token, per 128 channels, per channel (unless that is the answer
        # over 8, bytes taken for bits: D = 32 T) or for the whole tensor
        (lambda a: _close(a, T * 4) or _close(a, D / 128 * 4) or a == 4
         or (_close(a, D * 4) and not _close(D * 4, T * D / 128 * 4 / 8)),
         "one scale per 128 values of every token: T D / 128 scales."),
        (lambda a: _close(a, T * D + T * D / 128 * 4),
         "that adds the fp8 values themselves; the question asks for the scales alone."),
    ]


register(VariedNumericExercise(
    id="12.9", title="Bytes of fp8 activation scales", unit="bytes", rtol=0.02,
    params={"T": 4096, "D": 7168},
    choose={"T": (1024, 2048, 4096, 8192), "D": (4096, 5120, 7168, 8192)},
    solve=_ex9, hints_for=_ex9_hints,
    statement="An activation of {T:,} tokens x {D:,} channels is cast to fp8 with "
              "DeepSeek-V3's fine-grained scaling, one fp32 scale per tile. How many bytes "
              "do the scales take?",
))


# 12.10 MTP at batch 1 -------------------------------------------------------------------
def _ex10(alpha=0.88, rho=0.05):
    return (1 + alpha) / (1 + rho)


def _ex10_hints(alpha, rho):
    return [
        (lambda a: _close(a, 1 + alpha), "the module's pass costs rho of a step: divide by "
                                         "1 + rho."),
        (lambda a: _close(a, alpha / (1 + rho)), "the first token is always the target's "
                                                 "own: a step yields 1 + alpha tokens."),
        (lambda a: _close(a, (1 + alpha) / 2), "at batch 1 the verification of two tokens "
                                               "costs one step (memory-bound), not two."),
        (lambda a: _close(a, 1 + alpha - rho, 0.005),
         "the module's pass makes each step 1 + rho long: divide the tokens by it, do not "
         "subtract rho."),
        (lambda a: _close(a, 2 / (1 + rho)), "the second token is accepted with probability "
                                             "alpha, not always: 1 + alpha tokens a step."),
        (lambda a: _close(a, (1 + alpha) / (1 + 2 * rho)),
         "the module runs once a step, for the one token it proposes: 1 + rho."),
    ]


register(VariedNumericExercise(
    id="12.10", title="Multi-token prediction at batch 1", unit="ratio", rtol=0.02,
    params={"alpha": 0.88, "rho": 0.05},
    choose={"alpha": (0.7, 0.75, 0.8, 0.85, 0.9, 0.95), "rho": (0.02, 0.05, 0.1)},
    solve=_ex10, hints_for=_ex10_hints,
    statement="One MTP module proposes the token after next; the target accepts it with "
              "probability $\\alpha$ = {alpha}. The module's pass costs $\\rho$ = {rho} of "
              "a decode step, and at batch 1 verifying two tokens costs one step. How "
              "many times the tokens per second of plain decoding does this give?",
))


# 12.11 decode bytes across nodes --------------------------------------------------------
def _ex11(tokens=48, n_ep=320, local=8, s=1):
    return tokens * _DS.top_k * _D * s * (n_ep - local) / n_ep


register(NumericExercise(
    id="12.11", title="Bytes a decode GPU sends across nodes", unit="bytes", rtol=0.01,
    reference=_ex11,
    hints=[
        (lambda a: _close(a, _ex11(s=2)), "twice the answer: the dispatch is in fp8, 1 byte "
                                          "per element (and the question counts the "
                                          "dispatch alone, not the combine)."),
        (lambda a: _close(a, 48 * 3 * _D) or _close(a, 48 * 4 * _D),
         "no node limit here: the k = 8 copies go to GPUs spread uniformly over all 320, "
         "and (n_ep - 8) / n_ep of them leave on the card."),
        (lambda a: _close(a, 48 * _DS.top_k * _D, 0.0005),   # 1.0256x; kB as KiB 1.024x
         "the copies for the 8 GPUs of its own node (itself included) go over NVLink: "
         "(n_ep - 8) / n_ep of them leave on the card."),
        (lambda a: _close(a, _ex11(local=1), 0.0005),      # 1.0224x
         "the other 7 GPUs of the node are reached over NVLink, not the card: "
         "(n_ep - 8) / n_ep."),
        (lambda a: _close(a, _ex11() / _DS.top_k), "8x too small: each token sends k = 8 "
         "copies, one per expert. (Or bytes divided by 8 as if bits?)"),
    ],
))


# 12.12 GPU-hours from a step time -------------------------------------------------------
def _ex12(step=10.0, seqs=12288, S=4096, gpus=2048, tokens=14.8e12):
    return tokens / (seqs * S) * step * gpus / 3600


register(NumericExercise(
    id="12.12", title="GPU-hours from a step", unit="GPU-hours", rtol=0.02,
    reference=_ex12, chips=2048,
    hints=[
        (lambda a: _close(a, _ex12(seqs=15360)), "this batch is 12,288 sequences, not "
                                                 "DeepSeek-V3's final 15,360."),
        (lambda a: _close(a, _ex12() * 3600), "that is GPU-seconds: divide by 3,600."),
        (lambda a: _close(a, _ex12(S=1)), "each sequence has 4,096 tokens: tokens per "
                                          "step = sequences x S."),
        (lambda a: _close(a, _ex12() / 24), "that is GPU-days; the question asks for hours."),
        (lambda a: _close(a, 2.664e6), "that is DeepSeek-V3's reported figure, for its own "
                                       "batches; work it from this run's step time."),
        (lambda a: _close(a, 14.8e12 / (12288 * 4096)),
         "that is the number of steps; times 10 s and 2,048 GPUs, in hours."),
    ],
))


# 12.13 DualPipe against 1F1B, in code -------------------------------------------------
def _shares(P, M, F, B, W, pairs=None, no_w=False, fb=None, over_work=False,
            work_w=False):
    """The shares of the step that 1F1B and DualPipe idle in their fill and drain."""
    one = (P - 1) * (F + B)
    dual = ((P / 2 - 1) if pairs is None else pairs) * \
        ((F + B if fb is None else fb) + B - (0 if no_w else 3 * W))
    work = M * (F + B + (W if work_w else 0))
    if over_work:
        return one / work, dual / work
    return one / (one + work), dual / (dual + work)


def _saving_ref(P, M, F, B, W):
    one, dual = _shares(P, M, F, B, W)
    return one - dual


_CASES_13 = [(16, 20, 1.0, 2.0, 1.0), (8, 32, 1.0, 2.2, 0.8), (4, 8, 2.0, 3.0, 1.0),
             (32, 64, 1.5, 2.5, 1.25)]


def _draw_13(rng):
    F = rng.choice((1.0, 1.5, 2.0))
    B = F * rng.choice((1.8, 2.0, 2.2))
    return (rng.choice((4, 6, 8, 12, 16, 32)), rng.choice((8, 16, 20, 32, 64, 128)), F, B,
            B * rng.choice((0.4, 0.5)))


def _saving_with(slip):
    def predicate(got, want, args):
        P, M, F, B, W = args
        one, dual = _shares(P, M, F, B, W)
        t = {"pairs": lambda: one - _shares(P, M, F, B, W, pairs=P - 1)[1],
             "no_w": lambda: one - _shares(P, M, F, B, W, no_w=True)[1],
             "fb_max": lambda: one - _shares(P, M, F, B, W, fb=max(F, B))[1],
             "over_work": lambda: (lambda a, b: a - b)(*_shares(P, M, F, B, W,
                                                                 over_work=True)),
             "dual_only": lambda: dual, "one_only": lambda: one,
             "idle_diff": lambda: (P - 1) * (F + B) - (P / 2 - 1) * (F + 2 * B - 3 * W),
             "negative": lambda: dual - one, "percent": lambda: 100 * (one - dual),
             "work_w": lambda: (lambda a, b: a - b)(*_shares(P, M, F, B, W, work_w=True)),
             }[slip]()
        v = as_number(got)
        return v is not None and v != want and math.isclose(v, t, rel_tol=1e-6)
    return predicate


register(CodeExercise(
    id="12.13", title="DualPipe against 1F1B, in code", reference=_saving_ref,
    cases=_CASES_13, generate=_draw_13, unit="share of the step", rtol=1e-6,
    describe=lambda P, n_mb, F, B, W: f"P={P}, n_mb={n_mb}, F={F:g}, B={B:g}, W={W:g}",
    hints=[
        (lambda got, want, args: as_number(got) is None,
         "return the difference of the two shares, a number."),
        (_saving_with("idle_diff"), "that is the difference of the idle times; each "
                                    "schedule's share is its idle time over idle + "
                                    "n_mb (F + B)."),
        (_saving_with("over_work"), "divide each idle time by idle + work, not by the "
                                    "work alone."),
        (_saving_with("dual_only"), "that is DualPipe's share alone: subtract it from "
                                    "1F1B's."),
        (_saving_with("one_only"), "that is 1F1B's share alone: subtract DualPipe's."),
        (_saving_with("pairs"), "DualPipe runs microbatches from both ends: its fill and "
                                "drain has P/2 - 1 stage pairs, not P - 1."),
        (_saving_with("no_w"), "subtract 3W in DualPipe's idle time: the weight-gradient "
                               "work fills part of its bubble."),
        (_saving_with("fb_max"), "F&B, a forward and a backward chunk overlapped, still "
                                 "computes both: F + B (only communication hides)."),
        (_saving_with("negative"), "that is DualPipe's share minus 1F1B's: return 1F1B's "
                                   "minus DualPipe's, the saving."),
        (_saving_with("percent"), "return a fraction of the step, not a percentage."),
        (_saving_with("work_w"), "the work is n_mb (F + B): W is part of the backward B, "
                                 "not extra time."),
    ],
))


# 12.14 what the fp8 recipe leaves in bf16 -----------------------------------------------
_MODELS14 = ("llama3-8b", "llama3-70b", "llama3-405b")


def _flops14(model, S, head_fp8=False, attn_fp8=False, causal=True):
    """Forward FLOPs per token of a dense LLaMA: (in fp8, in bf16) under DeepSeek-V3's
    recipe (the linear layers' matmuls in fp8; attention and the output head in bf16),
    or a typical mistake. The backward repeats the split (2x each), so it cancels."""
    m = get_model(model)
    head = 2 * m.param_breakdown().output_head
    attn = m.attention_flops_per_token(S, causal=causal)
    fp8 = 2 * m.matmul_params() - head
    bf16 = head + attn
    if head_fp8:
        fp8, bf16 = fp8 + head, bf16 - head
    if attn_fp8:
        fp8, bf16 = fp8 + attn, bf16 - attn
    return fp8, bf16


def _head14(model):
    return 2 * get_model(model).param_breakdown().output_head


def _ex14(model="llama3-70b", S=8192, **kw):
    fp8, bf16 = _flops14(model, S, **kw)
    return bf16 / (bf16 + fp8 / 2)


def _slips14(model, S):
    """The typical slips' answers (the hints' numbers, but 0)."""
    fp8, bf16 = _flops14(model, S)
    return [bf16 / (bf16 + fp8), (3 * bf16 + 2 * fp8) / (3 * bf16 + 2 * fp8 + fp8 / 2),
            _ex14(model, S, head_fp8=True), _ex14(model, S, attn_fp8=True),
            _ex14(model, S, causal=False), (fp8 / 2) / (bf16 + fp8 / 2)]


def _valid14(model, S):
    """Every slip 3% or more from the answer (at a long context the output head is too
    small a share to tell from the linear layers), and 1% from each other."""
    ref, slips = _ex14(model, S), _slips14(model, S)
    return (all(abs(x - ref) > 0.03 * max(x, ref) for x in slips)
            and all(abs(x - y) > 0.01 * max(x, y) for i, x in enumerate(slips)
                    for y in slips[i + 1:]))


def _ex14_hints(model, S):
    fp8, bf16 = _flops14(model, S)
    return [
        (lambda a: _close(a, bf16 / (bf16 + fp8)),
         "that is the bf16 share of the FLOPs; a FLOP at the fp8 peak takes half the time "
         "of one at the bf16 peak."),
        (lambda a: _close(a, (3 * bf16 + 2 * fp8) / (3 * bf16 + 2 * fp8 + fp8 / 2)),
         "the backward's two matmuls of each linear layer (the input gradient, Dgrad, and "
         "the weight gradient, Wgrad) run in fp8 too, not only the forward."),
        (lambda a: _close(a, _ex14(model, S, head_fp8=True)),
         "the output head stays in bf16 (so do the embedding and the router)."),
        (lambda a: _close(a, _ex14(model, S, attn_fp8=True)),
         "the attention operator (scores and weighted sum of values) stays in bf16; fp8 is "
         "for the linear layers."),
        (lambda a: _close(a, _ex14(model, S, causal=False)),
         "with the masked half skipped, a token meets (S + 1) / 2 keys on average: use "
         "attention_flops_per_token(S, causal=True)."),
        (lambda a: _close(a, (fp8 / 2) / (bf16 + fp8 / 2)),
         "that is the fp8 matmuls' share of the time; the question asks for the work left "
         "in bf16."),
        (lambda a: a == 0,
         "not everything runs in fp8: the attention and the output head stay in bf16."),
        (lambda a: _close(a, bf16 / (fp8 / 2)),
         "that is the bf16 time over the fp8 time; the share is over the whole step: "
         "bf16 / (bf16 + fp8 / 2)."),
        (lambda a: _close(a, (3 * bf16 + fp8) / (3 * bf16 + fp8 + fp8)),
         "the weight gradient (Wgrad) runs in fp8 too: all three matmuls of each linear "
         "layer."),
        (lambda a: _close(a, (2 * bf16 - _flops14(model, S)[1] + _head14(model))
                          / (2 * bf16 - _flops14(model, S)[1] + _head14(model) + fp8 / 2)),
         "the embedding is a lookup, not a matmul: it has no FLOPs (only the output head "
         "multiplies)."),
    ]


register(VariedNumericExercise(
    id="12.14", title="What the fp8 recipe leaves in bf16", unit="fraction", rtol=0.02,
    params={"model": "llama3-70b", "S": 8192},
    choose={"model": _MODELS14, "S": (4096, 8192, 16384, 32768, 65536, 131072)},
    solve=_ex14, hints_for=_ex14_hints, valid=_valid14,
    describe=lambda model, S: {"size": get_model(model).name.split("-")[-1].upper()},
    statement="LLaMA-3 {size} (`scalebook.models.get_model(\"{model}\")`) is trained "
              "with DeepSeek-V3's fp8 recipe at a context of $S$ = {S:,} tokens, with a "
              "kernel that skips the masked half of the attention "
              "(`attention_flops_per_token(S, causal=True)`). If every matmul runs at "
              "its precision's peak (fp8 twice bf16), what fraction of the training "
              "step's compute time goes to the matmuls that stay in bf16?",
))
