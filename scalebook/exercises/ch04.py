"""Chapter 4 exercises: transformer arithmetic. Reference answers are computed from scalebook."""

from __future__ import annotations

import math

from ..hardware import get_chip
from ..models import LLAMA3_405B_TOKENS, MoEConfig, TransformerConfig, get_model
from .core import register
from .kinds import ChoiceExercise, CodeExercise, NumericExercise, as_number


def _close(a, b, rtol=0.02):
    return math.isclose(a, b, rel_tol=rtol)


def _m(name):
    return get_model(name)


# 4.1 ------------------------------------------------------------------------------------
def _attn_70b():
    return _m("llama3-70b").attention_params_per_layer()


def _attn_70b_mha():
    m = _m("llama3-70b")
    return 4 * m.d_model * m.q_dim


def _attn_70b_qkv():
    """W_q + W_k + W_v without the output projection."""
    m = _m("llama3-70b")
    return m.d_model * m.q_dim + 2 * m.d_model * m.kv_dim


register(NumericExercise(
    id="4.1", title="Attention parameters of one 70B layer", unit="parameters", integer=True,
    reference=_attn_70b,
    hints=[
        (lambda a: a == _attn_70b_mha(),
         "that is multi-head attention: k and v have only n_kv_heads heads (grouped-query attention)."),
        (lambda a: a == _attn_70b_qkv(), "count the output projection W_o too."),
        (lambda a: a == 2 * _m("llama3-70b").d_model * _m("llama3-70b").q_dim,
         "count all four matrices: W_k and W_v too, not only W_q and W_o."),
        (lambda a: a == _attn_70b() * _m("llama3-70b").n_layers,
         "that is all 80 layers; the question asks for one layer."),
    ],
))


# 4.2 ------------------------------------------------------------------------------------
def _mlp_share_405b():
    return _m("llama3-405b").param_breakdown().shares()["mlp"]


register(NumericExercise(
    id="4.2", title="MLP share of LLaMA-3 405B", unit="fraction (0 to 1)", rtol=0.01,
    reference=_mlp_share_405b,
    hints=[
        (lambda a: _close(a, 100 * _mlp_share_405b()), "give a fraction between 0 and 1, not a percentage."),
        (lambda a: _close(a, 2 / 3 * _mlp_share_405b(), 0.03),
         "the gated (SwiGLU) MLP has three matrices: gate, up and down."),
        (lambda a: _close(a, _m("llama3-405b").param_breakdown().shares()["attention"]),
         "that is the attention share."),
    ],
))


# 4.3 ------------------------------------------------------------------------------------
def _tied_8b():
    return _m("llama3-8b").scaled(tied_embeddings=True).num_params()


register(NumericExercise(
    id="4.3", title="LLaMA-3 8B with tied embeddings", unit="parameters", integer=True,
    reference=_tied_8b,
    hints=[
        (lambda a: a == _m("llama3-8b").num_params(),
         "that is the untied count: tying removes the separate output head."),
        (lambda a: a == _tied_8b() - _m("llama3-8b").param_breakdown().embedding,
         "you removed the V x D table twice: the tied model still has one copy."),
    ],
))


# 4.4 ------------------------------------------------------------------------------------
def _flops_70b():
    return _m("llama3-70b").training_flops(15e12)


register(NumericExercise(
    id="4.4", title="Training compute of 70B on 15T tokens", unit="FLOPs", rtol=0.02,
    reference=_flops_70b,
    hints=[
        (lambda a: _close(a, _flops_70b() / 3), "that is the forward pass only (2 N per token); "
                                                "the backward pass costs twice the forward."),
        (lambda a: _close(a, _flops_70b() * 2 / 3), "that is the backward pass only; add the forward."),
        (lambda a: _close(a, _flops_70b() / 6), "that is N N_tok; each parameter costs 6 FLOPs per training token."),
    ],
))


# 4.5 ------------------------------------------------------------------------------------
_GPUS_45, _MFU_45 = 16_384, 0.40


def _days_405b(mfu=_MFU_45):
    flops = _m("llama3-405b").training_flops(LLAMA3_405B_TOKENS)
    return flops / (_GPUS_45 * get_chip("gpu-h100").bf16_flops * mfu) / 86_400


register(NumericExercise(
    id="4.5", title="Days to train 405B", unit="days", rtol=0.03,
    reference=_days_405b,
    hints=[
        (lambda a: _close(a, _days_405b(1.0), 0.03), "that is at 100% of peak; the GPUs reach 40% of it (MFU)."),
        (lambda a: _close(a, _days_405b() * 86_400, 0.03), "that is in seconds; convert to days."),
        (lambda a: _close(a, _days_405b() * 24, 0.03), "that is in hours; convert to days."),
    ],
))


# 4.6 ------------------------------------------------------------------------------------
def _crossover(name="llama3-8b", dense=None):
    m = _m(name)
    dense = m.dense_flops_per_token() if dense is None else dense
    return dense / m.attention_flops_per_token(1)       # attention is linear in S


register(NumericExercise(
    id="4.6", title="When attention costs as much as the weights", unit="tokens", rtol=0.02,
    reference=_crossover,
    hints=[
        (lambda a: _close(a, _crossover(dense=2 * (_m("llama3-8b").matmul_params()
                                                    - _m("llama3-8b").param_breakdown().output_head))),
         "include the output head: it is a weight matmul too (2 N_mm counts it)."),
        (lambda a: _close(a, _crossover(dense=2 * _m("llama3-8b").num_params())),
         "2 N counts the embedding lookup and the norms as matmuls; use the matmul parameters "
         "only (attention, MLP, output head)."),
        (lambda a: _close(a, 2 * _crossover()), "count the full S x S score matrix (causal=False), "
                                                "both q.k and the weighted sum of v."),
        (lambda a: _close(a, _crossover() * _m("llama3-8b").group_size),
         "the attention matmuls involve every query head (n_heads), not only the key/value heads."),
    ],
))


# 4.7 ------------------------------------------------------------------------------------
def _kv_70b(bpe=2):
    return _m("llama3-70b").kv_cache_bytes_per_token(bpe)


def _kv_mha_70b(bpe=1):
    """70B's cache per token if every query head kept its own key and value (no GQA)."""
    return _kv_70b(bpe) * _m("llama3-70b").group_size


register(NumericExercise(
    id="4.7", title="KV cache per token of 70B without GQA, in fp8", unit="bytes",
    rtol=0.001, reference=_kv_mha_70b,
    hints=[
        (lambda a: _close(a, _kv_70b(1), 0.001),
         "that caches only the 8 key/value heads of GQA; here every one of the 64 query heads "
         "keeps its own key and value."),
        (lambda a: _close(a, _kv_70b(2), 0.001),
         "that is the chapter's figure (GQA, bf16): drop GQA and store 1 byte per element."),
        (lambda a: _close(a, _kv_mha_70b(2), 0.001), "that is bf16; fp8 is 1 byte per element."),
        (lambda a: _close(a, _kv_mha_70b() / 2, 0.001), "2x too small: keys and values are "
         "both cached, at 1 byte each in fp8."),
        (lambda a: _close(a, 8 * _kv_mha_70b(), 0.001), "the GQA figure already counts the 8 "
         "key/value heads: going to all 64 heads multiplies it by G = 8, not by H."),
        (lambda a: _close(a, _kv_mha_70b() / _m("llama3-70b").n_layers, 0.001),
         "that is one layer; every layer keeps its own keys and values."),
    ],
))


# 4.8 ------------------------------------------------------------------------------------
_GPUS_48, _CTX_48 = 8, 8192


def _max_batch(include_weights=True, kv_per_token=None, n_params=None, hbm_bytes=None):
    m = _m("llama3-70b")
    hbm = get_chip("gpu-h100").hbm_bytes if hbm_bytes is None else hbm_bytes
    weights = (2 * n_params if n_params is not None else m.weight_bytes(2)) if include_weights else 0
    free = _GPUS_48 * hbm - weights
    per_seq = (m.kv_cache_bytes(1, _CTX_48) if kv_per_token is None else kv_per_token * _CTX_48)
    return math.floor(free / per_seq)


register(NumericExercise(
    id="4.8", title="Largest 8K-context batch for 70B on 8 H100s", unit="sequences", integer=True,
    reference=_max_batch,
    hints=[
        (lambda a: a == _max_batch(include_weights=False), "the bf16 weights take their share of HBM first."),
        # The nominal 70B and one too many both give 186, so this hint names both (a separate
        # "one too many" hint could never be reached; tests/test_exercises_ch04.py checks it).
        (lambda a: a == _max_batch(n_params=70e9),
         "use the exact parameter count (num_params()), not the nominal 70B, and round down: "
         "a partial sequence does not fit."),
        (lambda a: a == _max_batch(hbm_bytes=get_chip("gpu-h100").hbm_bytes / 1e9 * 2**30),
         "the hardware table gives HBM in decimal bytes (1 GB = 1e9 bytes), not GiB."),
        (lambda a: a == _max_batch(kv_per_token=_kv_70b() * _m("llama3-70b").group_size),
         "the cache holds n_kv_heads key/value heads per layer, not n_heads."),
    ],
))


# 4.9 ------------------------------------------------------------------------------------
def _train_mem_70b(**kw):
    return _m("llama3-70b").training_memory(**kw).total


register(NumericExercise(
    id="4.9", title="Memory to train 70B with Adam", unit="bytes", rtol=0.02,
    reference=_train_mem_70b,
    hints=[
        # Leaving out the master copy and keeping one Adam moment both give 12 bytes per
        # parameter: one hint names both.
        (lambda a: _close(a, _train_mem_70b(master_bytes=0)),
         "12 bytes per parameter: you left out either the fp32 master copy of the weights "
         "(4 bytes) or one of Adam's two moments (m and v, 4 bytes each)."),
        (lambda a: _close(a, _train_mem_70b(grad_bytes=0)), "you left out the bf16 gradients."),
        (lambda a: _close(a, _train_mem_70b(grad_bytes=4)), "the gradients are bf16 here (2 bytes), not fp32."),
        (lambda a: _close(a, _m("llama3-70b").weight_bytes(2)), "that is only the bf16 weights."),
    ],
))


# 4.10 -----------------------------------------------------------------------------------
def _remat_ratio():
    m = _m("llama3-70b")
    return m.activation_bytes_per_token(remat=False) / m.activation_bytes_per_token(remat=True)


def _remat_ratio_no_head():
    m = _m("llama3-70b")
    a = m.activation_elements_per_layer_per_token()
    return (m.n_layers * a) / (m.n_layers * m.d_model + a)


def _remat_ratio_no_extra_layer():
    m = _m("llama3-70b")
    head = 2 * m.d_model + m.vocab_size
    return m.activation_bytes_per_token(remat=False) / (2 * (m.n_layers * m.d_model + head))


register(NumericExercise(
    id="4.10", title="What rematerialisation saves on 70B", unit="ratio (no remat / full remat)",
    rtol=0.02, reference=_remat_ratio,
    hints=[
        (lambda a: _close(a, _remat_ratio_no_head(), 0.002),
         "add the head's activations (2 D + V per token) on both sides: they are kept with or "
         "without remat."),
        (lambda a: _close(a, _remat_ratio_no_extra_layer(), 0.002),
         "during the backward pass one layer is recomputed, so its full activations are alive too."),
        (lambda a: _close(a, 1 / _remat_ratio()), "upside down: divide without-remat by with-remat."),
    ],
))


# 4.11 -----------------------------------------------------------------------------------
def _is(got, value):
    g = as_number(got)
    return g is not None and _close(g, value, 1e-9)


def _kv_ref(n_layers, n_kv_heads, head_dim, batch, context, bytes_per_element):
    c = TransformerConfig("x", n_layers=n_layers, d_model=64, n_heads=n_kv_heads, n_kv_heads=n_kv_heads,
                          head_dim=head_dim, d_ff=64, vocab_size=64)
    return c.kv_cache_bytes(batch, context, bytes_per_element)


# The first two cases tell the mistakes apart. The first (batch 3, 1 byte per element)
# separates leaving out the values (1/2), the batch (1/3) and 2 bytes written for every
# element (x2); the second (batch 5, 4 bytes) catches leaving out bytes_per_element (1/4),
# which the first cannot see. With the old first case (batch 1, 2 bytes) a missing
# bytes_per_element was told "factor 2 for K and V" and a missing batch passed it.
_CASES_11 = [(126, 8, 128, 3, 131072, 1), (2, 1, 64, 5, 100, 4), (80, 8, 128, 1, 8192, 2),
             (32, 8, 128, 16, 4096, 2), (12, 12, 64, 8, 1024, 2)]

register(CodeExercise(
    id="4.11", title="KV cache size, in code", reference=_kv_ref, cases=_CASES_11, rtol=1e-9,
    unit="bytes",
    describe=lambda L, H_kv, h, B, T, s: (f"n_layers={L}, n_kv_heads={H_kv}, head_dim={h}, "
                                          f"batch={B}, context={T}, bytes_per_element={s}"),
    hints=[
        (lambda got, want, args: _is(got, want / 2), "keys AND values: a factor 2."),
        (lambda got, want, args: _is(got, want / args[3]), "multiply by the batch."),
        (lambda got, want, args: _is(got, want / args[5]), "multiply by bytes_per_element."),
        (lambda got, want, args: _is(got, want / args[5] * 2),
         "use bytes_per_element, not 2 bytes for every element."),
    ],
))


# 4.12 -----------------------------------------------------------------------------------
def _params_ref(n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, tied):
    return TransformerConfig("x", n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                             n_kv_heads=n_kv_heads, head_dim=head_dim, d_ff=d_ff,
                             vocab_size=vocab_size, tied_embeddings=tied).num_params()


def _norms(args):
    return (2 * args[0] + 1) * args[1]


_CASES_12 = [(32, 4096, 32, 8, 128, 14336, 128256, False),
             (2, 64, 4, 2, 16, 160, 100, True),
             (3, 96, 2, 1, 64, 256, 300, False),      # n_heads * head_dim != d_model
             (126, 16384, 128, 8, 128, 53248, 128256, False)]

register(CodeExercise(
    id="4.12", title="Parameter count, in code", reference=_params_ref, cases=_CASES_12,
    compare=lambda got, want: as_number(got) == want, unit="parameters",
    describe=lambda L, D, H, H_kv, h, F, V, t: (f"L={L}, D={D}, H={H}, H_kv={H_kv}, h={h}, "
                                                f"F={F}, V={V}, tied={t}"),
    hints=[
        (lambda got, want, args: as_number(got) == want - _norms(args),
         "the RMSNorm gains count too: two per layer and a final one, D each."),
        (lambda got, want, args: as_number(got) == want - args[1] * args[6] and args[7] is False,
         "untied: the output head is a separate V x D matrix."),
        (lambda got, want, args: as_number(got) == want + args[1] * args[6] and args[7] is True,
         "tied: the output head reuses the embedding, so count V x D once."),
        (lambda got, want, args: as_number(got) == want + 2 * args[0] * args[1] * (args[2] - args[3]) * args[4],
         "k and v have n_kv_heads heads, not n_heads."),
        (lambda got, want, args: as_number(got) == want + 2 * args[0] * args[1] * (args[1] - args[2] * args[4]),
         "the q and o projections are D x (n_heads head_dim), which need not equal D x D."),
    ],
))


# 4.13 -----------------------------------------------------------------------------------
def _which_dominates():
    m = _m("llama3-8b")
    S = 131_072
    return "attention" if m.attention_flops_per_token(S) > m.dense_flops_per_token() else "weights"


register(ChoiceExercise(
    id="4.13", title="8B at 128K context: what dominates the FLOPs?", choices=("attention", "weights"),
    reference=_which_dominates,
    hints={"weights": "compare 4 L S H h with 2 x (matmul parameters) at S = 131,072: the "
                      "attention term grows with S (your answer to 4.6 is the crossover).",
           "attention": "compare 4 L S H h with 2 x (matmul parameters) at S = 131,072."},
))


# 4.14 -----------------------------------------------------------------------------------
_E_414, _K_414 = 16, 2


def _moe_70b(n_experts=_E_414, top_k=_K_414):
    return MoEConfig(_m("llama3-70b"), n_experts, top_k)


register(NumericExercise(
    id="4.14", title="Active parameters of an MoE LLaMA-3 70B", unit="parameters",
    integer=True, reference=lambda: _moe_70b().active_params(),
    hints=[
        (lambda a: a == _moe_70b().total_params(),
         "that is the total, every expert: a token meets only k = 2 experts per layer."),
        (lambda a: a == _moe_70b().active_params() - _moe_70b().router_params(),
         "count the routers too: a [D, E] matrix in every layer, and every token uses it."),
        (lambda a: a == _moe_70b(top_k=1).active_params(),
         "each token meets k = 2 experts per layer, not one."),
        (lambda a: a == _moe_70b().active_matmul_params(),
         "that leaves out the embedding and the norms; count every parameter a token meets."),
        (lambda a: a == _m("llama3-70b").num_params(),
         "that is the dense model: add the second expert and the router of every layer."),
        (lambda a: _close(a, _moe_70b().active_params(), 0.001),
         "very close: check the router, a D x E = D x 16 matrix in each of the 80 layers."),
    ],
))


# 4.15 -----------------------------------------------------------------------------------
_CTX_415 = 8192


def _weight_dots_70b(values=None, bpe=2, layers=None):
    m = _m("llama3-70b")
    v = m.saved_values_per_layer_per_token("weight_dots", _CTX_415) if values is None else values
    return (m.n_layers if layers is None else layers) * v * bpe


def _wd(extra):
    m = _m("llama3-70b")
    return m.saved_values_per_layer_per_token("weight_dots", _CTX_415) + extra


register(NumericExercise(
    id="4.15", title="What the weight_dots policy keeps for 70B", unit="bytes per token",
    rtol=0.005,
    reference=_weight_dots_70b,
    hints=[
        (lambda a: _close(a, _weight_dots_70b(_wd(-_m("llama3-70b").kv_dim)), 0.004),
         "keys AND values are kept: 2 H_kv h, not H_kv h."),
        (lambda a: _close(a, _weight_dots_70b(_wd(_m("llama3-70b").d_ff)), 0.004),
         "the SiLU-gated product is elementwise, not a matmul output: this policy "
         "recomputes it from the gate and up outputs."),
        (lambda a: _close(a, _weight_dots_70b() + 2 * (2 * _m("llama3-70b").d_model
                                                      + _m("llama3-70b").vocab_size), 0.004),
         "the question asks for the layers only: leave out the head's 2D + V."),
        (lambda a: _close(a, _weight_dots_70b(_wd(_m("llama3-70b").d_model)), 0.005),
         "W_d's output is not kept: nothing in the layer's backward pass needs it (it only "
         "feeds the next layer, whose input is kept there)."),
        (lambda a: _close(a, _weight_dots_70b(_wd(-_m("llama3-70b").d_model)), 0.005),
         "one D-wide value is missing: the layer's input or W_o's output (both are kept; "
         "the residual W_o's output joins feeds the MLP's norm)."),
        (lambda a: _close(a, _weight_dots_70b(_wd(-_m("llama3-70b").d_model
                                                  - _m("llama3-70b").d_model)), 0.005),
         "count the layer's input (D) and W_o's output (D) besides the projections."),
        (lambda a: _close(a, _weight_dots_70b(_wd(2 * (_m("llama3-70b").q_dim
                                                       - _m("llama3-70b").kv_dim))), 0.005),
         "keys and values have n_kv_heads heads (H_kv h each), not n_heads."),
        (lambda a: _close(a, _weight_dots_70b(layers=1), 0.005),
         "that is one layer; all 80 keep their values."),
        (lambda a: _close(a, _weight_dots_70b(bpe=4), 0.005), "that is f32; bf16 is 2 bytes."),
        (lambda a: _close(a, _weight_dots_70b(bpe=1), 0.005),
         "that counts values; in bf16 each takes 2 bytes."),
        (lambda a: _close(a, _weight_dots_70b(_m("llama3-70b").saved_values_per_layer_per_token(
            "dots", _CTX_415)), 0.005),
         "that is dots_saveable: the no-batch-dims policy keeps no output of the attention "
         "matmuls (they have a batch dimension)."),
    ],
))


# 4.16 -----------------------------------------------------------------------------------
_GPUS_416, _CTX_416 = 4, 32768


def _batch_416(w_bpe=1, kv_bpe=0.5, n_params=None, hbm_bytes=None, weights=True):
    m = _m("llama3-70b")
    hbm = get_chip("gpu-h100").hbm_bytes if hbm_bytes is None else hbm_bytes
    n = m.num_params() if n_params is None else n_params
    free = _GPUS_416 * hbm - (n * w_bpe if weights else 0)
    return math.floor(free / m.kv_cache_bytes(1, _CTX_416, kv_bpe))


register(NumericExercise(
    id="4.16", title="An 8-bit model with a 4-bit cache on 4 H100s", unit="sequences",
    integer=True, reference=_batch_416,
    hints=[
        (lambda a: a == _batch_416(kv_bpe=2), "that is a bf16 cache; int4 is half a byte."),
        (lambda a: a == _batch_416(kv_bpe=1), "that is an 8-bit cache; int4 is half a byte."),
        (lambda a: a == _batch_416(w_bpe=2), "the weights are fp8 here: 1 byte each, not 2."),
        (lambda a: a == _batch_416(weights=False), "the weights take their share of HBM first."),
        (lambda a: a == _batch_416(hbm_bytes=get_chip("gpu-h100").hbm_bytes / 1e9 * 2**30),
         "the hardware table gives HBM in decimal bytes (1 GB = 1e9 bytes), not GiB."),
        (lambda a: a == _batch_416() + 1,
         "round down (and use the exact num_params(), not 70e9): a partial sequence does "
         "not fit."),
    ],
))
