"""Chapter 4 exercises: transformer arithmetic. Reference answers are computed from scalebook."""

from __future__ import annotations

import math

from ..hardware import get_chip
from ..models import LLAMA3_405B_TOKENS, MoEConfig, TransformerConfig, get_model
from .core import register
from .kinds import (ChoiceExercise, CodeExercise, NumericExercise, VariedNumericExercise,
                    as_number, eight_bit_peak_hint)


def _close(a, b, rtol=0.02):
    return math.isclose(a, b, rel_tol=rtol)


def _m(name):
    return get_model(name)


# Variants (for assignments; see kinds.VariedNumericExercise and chapter 1). The chapter's
# own numbers are each exercise's ``params``; an assignment draws others from ``choose``.
_MODELS = ("llama3-8b", "llama3-70b", "llama3-405b")
_GPUS = ("gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200")
_NOMINAL = {"llama3-8b": 8e9, "llama3-70b": 70e9, "llama3-405b": 405e9}


def _size(model):
    """'70B' for 'llama3-70b'."""
    return model.split("-", 1)[1].upper()


def _sci(x):
    """1.5e13 for 15e12 (no '+', no trailing zeros)."""
    mantissa, exponent = f"{x:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _words(model=None, chip=None, tokens=None, **_):
    """Fields for a statement: the model's and chip's names, a token count."""
    out = {}
    if model is not None:
        out.update(size=_size(model), model_name=f"LLaMA-3 {_size(model)}")
    if chip is not None:
        short = chip.split("-", 1)[1]
        out.update(chip_name=get_chip(chip).display_name,
                   chip_short=short.upper() if chip.startswith("gpu") else short)
    if tokens is not None:
        out.update(T=f"{tokens / 1e12:g}T", tokens_words=f"{tokens / 1e12:g}T ({_sci(tokens)})")
    return out


# A count of parameters given as bf16 bytes (2 per parameter): 2x too large.
_BYTES_NOT_PARAMS = ("2x too large: that is the size in bf16 bytes (2 per parameter); "
                     "the question asks for parameters.")


# 4.1 ------------------------------------------------------------------------------------
def _with_kv(model, kv_heads):
    """The model with ``kv_heads`` key/value heads (its own count: the model itself)."""
    return _m(model).scaled(n_kv_heads=kv_heads)


def _attn_70b(model="llama3-70b", kv_heads=8):
    return _with_kv(model, kv_heads).attention_params_per_layer()


def _ex1_hints(model, kv_heads):
    m = _with_kv(model, kv_heads)
    D, q, kv = m.d_model, m.q_dim, m.kv_dim
    return [
        (lambda a: a == 4 * D * q,
         "that is multi-head attention: k and v have only n_kv_heads heads (grouped-query attention)."),
        (lambda a: a == D * q + 2 * D * kv, "count the output projection W_o too."),
        (lambda a: a == 2 * D * q,
         "count all four matrices: W_k and W_v too, not only W_q and W_o."),
        (lambda a: a == m.attention_params_per_layer() * m.n_layers,
         f"that is all {m.n_layers} layers; the question asks for one layer."),
        (lambda a: a == 2 * m.attention_params_per_layer(), _BYTES_NOT_PARAMS),
    ]


def _ex1_words(model, kv_heads):
    own = _m(model).n_kv_heads
    return {**_words(model),
            "kv_words": "" if kv_heads == own else (
                f" if it had {kv_heads} key/value head{'s' if kv_heads > 1 else ''} "
                f"({'multi' if kv_heads == 1 else 'grouped'}-query attention) instead of "
                f"its {own}")}


register(VariedNumericExercise(
    id="4.1", title="Attention parameters of one 70B layer", unit="parameters", integer=True,
    params={"model": "llama3-70b", "kv_heads": 8},
    choose={"model": _MODELS, "kv_heads": (1, 2, 4, 8, 16, 32)},
    solve=_attn_70b, hints_for=_ex1_hints, describe=_ex1_words,
    # At most a quarter of the query heads: at H = 2 H_kv, W_q + W_k + W_v is 2 D H h, the
    # slip of leaving out W_k and W_v, and the two hints could not be told apart.
    valid=lambda model, kv_heads: 4 * kv_heads <= _m(model).n_heads,
    variant_title="Attention parameters of one {size} layer",
    statement="How many parameters do the four attention projections ($W_q, W_k, W_v, W_o$) "
              "of one layer of {model_name} hold{kv_words}? Answer as a whole number of "
              "parameters.",
))


# 4.2 ------------------------------------------------------------------------------------
# Section 4.2 prints the shares of the three LLaMA-3 models, so the exercise asks for a
# model the table leaves out: Mistral 7B, LLaMA-3 8B's shapes with a 32,000-token
# vocabulary (7,241,732,096 parameters, its published count).
_V_42 = 32_000


def _mistral_7b():
    return _m("llama3-8b").scaled(name="mistral-7b", vocab_size=_V_42)


def _mlp_share_7b():
    return _mistral_7b().param_breakdown().shares()["mlp"]


def _mlp_share_one_table():
    """Only one V x D matrix shrunk to the new vocabulary (the other left at 128,256)."""
    m8 = _m("llama3-8b")
    n = m8.num_params() - (m8.vocab_size - _V_42) * m8.d_model
    return m8.param_breakdown().mlp / n


register(NumericExercise(
    id="4.2", title="MLP share of Mistral 7B", unit="fraction (0 to 1)", rtol=0.01,
    reference=_mlp_share_7b,
    hints=[
        (lambda a: _close(a, 100 * _mlp_share_7b()), "give a fraction between 0 and 1, not a percentage."),
        (lambda a: _close(a, 2 / 3 * _mlp_share_7b(), 0.03),
         "the gated (SwiGLU) MLP has three matrices: gate, up and down."),
        (lambda a: _close(a, _mistral_7b().param_breakdown().shares()["attention"]),
         "that is the attention share."),
        (lambda a: _close(a, _m("llama3-8b").param_breakdown().shares()["mlp"], 0.005),
         "that is LLaMA-3 8B's share, with its 128,256-token vocabulary: Mistral's 32,000 "
         "tokens make the embedding and the output head smaller, so N is smaller."),
        (lambda a: _close(a, _mlp_share_one_table(), 0.005),
         "both V x D matrices shrink with the vocabulary: the embedding table and the "
         "separate (untied) output head."),
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
        (lambda a: a == 2 * _tied_8b(), _BYTES_NOT_PARAMS),
    ],
))


# 4.4 ------------------------------------------------------------------------------------
def _flops_70b(model="llama3-70b", tokens=15e12):
    return _m(model).training_flops(tokens)


def _ex4_hints(model, tokens):
    flops = _flops_70b(model, tokens)
    return [
        (lambda a: _close(a, flops / 3), "that is the forward pass only (2 N per token); "
                                         "the backward pass costs twice the forward."),
        (lambda a: _close(a, flops * 2 / 3),
         "that is the backward pass only; add the forward."),
        (lambda a: _close(a, flops / 6),
         "that is N N_tok; each parameter costs 6 FLOPs per training token."),
    ] + _flop_count_hints(flops)


def _flop_count_hints(flops):
    """6 N N_tok with a multiply-add counted as 1 FLOP (3 N), or as 2 twice (12 N)."""
    return [
        (lambda a: _close(a, flops / 2),
         "that is 3 N N_tok: a multiply-add is 2 FLOPs, so a token costs 2 N in the "
         "forward pass and 4 N in the backward, 6 N in all."),
        (lambda a: _close(a, 2 * flops),
         "that is 12 N N_tok: the 6 of 6 N N_tok already counts a multiply-add as 2 "
         "FLOPs (2 N forward, 4 N backward)."),
    ]


register(VariedNumericExercise(
    id="4.4", title="Training compute of 70B on 15T tokens", unit="FLOPs", rtol=0.02,
    params={"model": "llama3-70b", "tokens": 15e12},
    choose={"model": _MODELS, "tokens": (1e12, 2e12, 5e12, 10e12, 15e12)},
    solve=_flops_70b, hints_for=_ex4_hints, describe=_words,
    variant_title="Training compute of {size} on {T} tokens",
    statement="Using the $6 N N_{{\\mathrm{{tok}}}}$ rule, how many FLOPs does training "
              "{model_name} on {tokens_words} tokens take? Answer in FLOPs.",
))


# 4.5 ------------------------------------------------------------------------------------
_GPUS_45, _MFU_45 = 16_384, 0.40


def _days_405b(mfu=_MFU_45, gpus=_GPUS_45, chip="gpu-h100"):
    flops = _m("llama3-405b").training_flops(LLAMA3_405B_TOKENS)
    return flops / (gpus * get_chip(chip).bf16_flops * mfu) / 86_400


def _ex5_hints(chip, gpus, mfu):
    days = _days_405b(mfu, gpus, chip)
    return [
        (lambda a: _close(a, _days_405b(1.0, gpus, chip), 0.03),
         f"that is at 100% of peak; the GPUs reach {mfu * 100:g}% of it (MFU)."),
        (lambda a: _close(a, days * 86_400, 0.03), "that is in seconds; convert to days."),
        (lambda a: _close(a, days * 24, 0.03), "that is in hours; convert to days."),
    ] + eight_bit_peak_hint(
        chip, days,
        "the training run's matmuls are bf16: use the dense bf16 peak.", rtol=0.03)


register(VariedNumericExercise(
    id="4.5", title="Days to train 405B", unit="days", rtol=0.03,
    params={"chip": "gpu-h100", "gpus": _GPUS_45, "mfu": _MFU_45},
    choose={"chip": _GPUS, "gpus": (4096, 8192, 16_384, 24_576),
            "mfu": (0.30, 0.35, 0.40, 0.45, 0.50)},
    solve=lambda chip, gpus, mfu: _days_405b(mfu, gpus, chip), hints_for=_ex5_hints,
    chips=lambda gpus, **_: gpus,
    describe=lambda chip, gpus, mfu: {**_words(chip=chip), "pct": f"{mfu * 100:g}"},
    statement="Suppose the whole LLaMA-3 405B run used {gpus:,} {chip_name} GPUs. If they "
              "sustain {pct}% of their dense bf16 peak (the book's hardware table), how many "
              "days does $6 N N_{{\\mathrm{{tok}}}}$ for 405B on 15.6T tokens take? Answer "
              "in days.",
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
         "8x too small: that caches only the 8 key/value heads of GQA; here every one of the "
         "64 query heads keeps its own key and value (or bytes divided by 8 as if bits?)."),
        (lambda a: _close(a, _kv_70b(2), 0.001),
         "that is the chapter's figure (GQA, bf16): drop GQA and store 1 byte per element."),
        (lambda a: _close(a, _kv_mha_70b(2), 0.001), "that is bf16; fp8 is 1 byte per element."),
        (lambda a: _close(a, _kv_mha_70b() / 2, 0.001), "2x too small: keys and values are "
         "both cached, at 1 byte each in fp8."),
        (lambda a: _close(a, 8 * _kv_mha_70b(), 0.001), "8x too large: the GQA "
         "figure already counts the 8 key/value heads: going to all 64 heads multiplies it by "
         "G = 8, not by H. (Or bits counted for bytes?)"),
        (lambda a: _close(a, _kv_mha_70b() / _m("llama3-70b").n_layers, 0.001),
         "that is one layer; every layer keeps its own keys and values."),
    ],
))


# 4.8 ------------------------------------------------------------------------------------
_GPUS_48, _CTX_48 = 8, 8192
_OWN_48 = {"model": "llama3-70b", "chip": "gpu-h100", "gpus": _GPUS_48, "context": _CTX_48}


def _max_batch(include_weights=True, kv_per_token=None, n_params=None, hbm_bytes=None,
               model="llama3-70b", chip="gpu-h100", gpus=_GPUS_48, context=_CTX_48):
    m = _m(model)
    hbm = get_chip(chip).hbm_bytes if hbm_bytes is None else hbm_bytes
    weights = (2 * n_params if n_params is not None else m.weight_bytes(2)) if include_weights else 0
    free = gpus * hbm - weights
    per_seq = (m.kv_cache_bytes(1, context) if kv_per_token is None else kv_per_token * context)
    return math.floor(free / per_seq)


def _ex8_hints(**p):
    m = _m(p["model"])
    right, nominal = _max_batch(**p), _max_batch(n_params=_NOMINAL[p["model"]], **p)
    hints = [
        (lambda a: a == _max_batch(include_weights=False, **p),
         "the bf16 weights take their share of HBM first."),
        # The nominal 70B and one too many both give 186, so this hint names both (a separate
        # "one too many" hint could never be reached; tests/test_exercises_ch04.py checks it).
        (lambda a: a == nominal,
         f"use the exact parameter count (num_params()), not the nominal {_size(p['model'])}, "
         f"and round down: a partial sequence does not fit."),
        (lambda a: a == _max_batch(hbm_bytes=get_chip(p["chip"]).hbm_bytes / 1e9 * 2**30, **p),
         "the hardware table gives HBM in decimal bytes (1 GB = 1e9 bytes), not GiB."),
        (lambda a: a == _max_batch(kv_per_token=m.kv_cache_bytes_per_token() * m.group_size,
                                   **p),
         "the cache holds n_kv_heads key/value heads per layer, not n_heads."),
    ]
    if nominal != right + 1:       # another variant: one too many has a hint of its own
        hints.append((lambda a: a == right + 1, "round down: a partial sequence does not fit."))
    return hints


register(VariedNumericExercise(
    id="4.8", title="Largest 8K-context batch for 70B on 8 H100s", unit="sequences",
    integer=True, params=dict(_OWN_48),
    choose={"model": _MODELS, "chip": _GPUS, "gpus": (4, 8, 16),
            "context": (4096, 8192, 16_384, 32_768)},
    solve=lambda **p: _max_batch(**p), hints_for=_ex8_hints,
    valid=lambda **p: _max_batch(**p) >= 1,
    describe=lambda model, chip, gpus, context: {**_words(model, chip),
                                                 "ctx_k": f"{context // 1024}K"},
    variant_title="Largest {ctx_k}-context batch for {size} on {gpus} {chip_short}s",
    statement="{model_name} is served in bf16 on {gpus} {chip_name} GPUs (HBM from the book's "
              "hardware table). After the weights, how many sequences of {context:,} tokens "
              "fit in the remaining HBM as bf16 KV cache? Use the exact parameter count "
              "(`num_params()`), ignore activations and fragmentation; answer a whole number "
              "of sequences.",
))


# 4.9 ------------------------------------------------------------------------------------
# Section 4.7 prints 70B's state with bf16 gradients (16 bytes per parameter), so the
# exercise asks for 405B as its paper trained it: gradients in fp32, 18 bytes per parameter.
def _train_mem_405b(**kw):
    return _m("llama3-405b").training_memory(**{"grad_bytes": 4, **kw}).total


register(NumericExercise(
    id="4.9", title="Memory to train 405B as its paper did", unit="bytes", rtol=0.02,
    reference=_train_mem_405b,
    hints=[
        # Leaving out the master copy, one Adam moment or the fp32 gradients all give 14
        # bytes per parameter: one hint names the three.
        (lambda a: _close(a, _train_mem_405b(master_bytes=0)),
         "14 bytes per parameter: you left out the fp32 master copy of the weights "
         "(4 bytes), one of Adam's two moments (m and v, 4 bytes each) or the fp32 "
         "gradients (4 bytes)."),
        (lambda a: _close(a, _train_mem_405b(grad_bytes=2)),
         "that is 16 bytes per parameter, with bf16 gradients: the paper keeps the "
         "gradients in fp32 (4 bytes)."),
        (lambda a: _close(a, _train_mem_405b(weight_bytes=4)),
         "the working copy of the weights is bf16 (2 bytes); only the master copy is fp32."),
        (lambda a: _close(a, _m("llama3-405b").weight_bytes(2)), "that is only the bf16 weights."),
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


def _gen_11(rng):
    """A model and a cache a practitioner meets: layers, key/value heads and head size of
    real models, a serving batch and context, 1, 2 or 4 bytes per element."""
    return (rng.choice((16, 24, 28, 32, 40, 48, 60, 64, 80, 96, 126)),
            rng.choice((1, 2, 4, 8, 16)), rng.choice((64, 80, 96, 128, 256)),
            rng.randint(1, 64), rng.choice((512, 1000, 2048, 4096, 8192, 32768, 131072)),
            rng.choice((1, 2, 4)))


register(CodeExercise(
    id="4.11", title="KV cache size, in code", reference=_kv_ref, cases=_CASES_11, rtol=1e-9,
    unit="bytes", generate=_gen_11,
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


def _gen_12(rng):
    """A LLaMA-style model: H a multiple of H_kv (at most H / 2), D usually H h and
    sometimes not, F a multiple of 256 from 2D to 4D, a real vocabulary, tied or not."""
    h = rng.choice((64, 96, 128))
    H = rng.choice((8, 12, 16, 24, 32, 48, 64))
    K = rng.choice([k for k in (1, 2, 4, 8) if H % k == 0 and 2 * k <= H])
    D = H * h if rng.random() < 0.7 else H * h * rng.choice((3, 5)) // 4
    F = 256 * rng.randint(D // 128, D // 64)
    V = rng.choice((32000, 32768, 50257, 128256, 151936))
    return (rng.randint(2, 96), D, H, K, h, F, V, rng.random() < 0.4)


register(CodeExercise(
    id="4.12", title="Parameter count, in code", reference=_params_ref, cases=_CASES_12,
    compare=lambda got, want: as_number(got) == want, unit="parameters", generate=_gen_12,
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


def _moe_70b(n_experts=_E_414, top_k=_K_414, model="llama3-70b"):
    return MoEConfig(_m(model), n_experts, top_k)


def _ex14_hints(model, E, k):
    moe, L = _moe_70b(E, k, model), _m(model).n_layers
    others = "the second expert" if k == 2 else f"the other {k - 1} experts"
    return [
        (lambda a: a == moe.total_params(),
         f"that is the total, every expert: a token meets only k = {k} experts per layer."),
        (lambda a: a == moe.active_params() - moe.router_params(),
         "count the routers too: a [D, E] matrix in every layer, and every token uses it."),
        (lambda a: a == _moe_70b(E, 1, model).active_params(),
         f"each token meets k = {k} experts per layer, not one."),
        (lambda a: a == moe.active_matmul_params(),
         "that leaves out the embedding and the norms; count every parameter a token meets."),
        (lambda a: a == _m(model).num_params(),
         f"that is the dense model: add {others} and the router of every layer."),
        (lambda a: _close(a, moe.active_params(), 0.001),
         f"very close: check the router, a D x E = D x {E} matrix in each of the {L} layers."),
        (lambda a: a == 2 * moe.active_params(), _BYTES_NOT_PARAMS),
    ]


register(VariedNumericExercise(
    id="4.14", title="Active parameters of an MoE LLaMA-3 70B", unit="parameters",
    integer=True, params={"model": "llama3-70b", "E": _E_414, "k": _K_414},
    choose={"model": _MODELS, "E": (8, 16, 32, 64), "k": (2, 4, 8)},
    solve=lambda model, E, k: _moe_70b(E, k, model).active_params(),
    hints_for=_ex14_hints, valid=lambda model, E, k: 2 * k <= E,
    describe=lambda model, E, k: _words(model),
    variant_title="Active parameters of an MoE {model_name}",
    statement="Take {model_name}'s shapes and replace every MLP by $E = {E}$ experts of the "
              "same shape, each token routed to $k = {k}$ of them by a router $[D, E]$ per "
              "layer (no bias), as in section 4.8. How many parameters does one token "
              "activate, counted as section 4.8 counts Mixtral's (everything outside the "
              "experts, plus $k$ experts per layer)? An exact whole number of parameters.",
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
                                                      + _m("llama3-70b").vocab_size), 0.001),
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


def _batch_416(w_bpe=1, kv_bpe=0.5, n_params=None, hbm_bytes=None, weights=True,
               model="llama3-70b", chip="gpu-h100", gpus=_GPUS_416, context=_CTX_416):
    m = _m(model)
    hbm = get_chip(chip).hbm_bytes if hbm_bytes is None else hbm_bytes
    n = m.num_params() if n_params is None else n_params
    free = gpus * hbm - (n * w_bpe if weights else 0)
    return math.floor(free / m.kv_cache_bytes(1, context, kv_bpe))


def _ex16_hints(**p):
    return [
        (lambda a: a == _batch_416(kv_bpe=2, **p),
         "that is a bf16 cache; int4 is half a byte."),
        (lambda a: a == _batch_416(kv_bpe=1, **p),
         "that is an 8-bit cache; int4 is half a byte."),
        (lambda a: a == _batch_416(w_bpe=2, **p),
         "the weights are fp8 here: 1 byte each, not 2."),
        (lambda a: a == _batch_416(weights=False, **p),
         "the weights take their share of HBM first."),
        (lambda a: a == _batch_416(hbm_bytes=get_chip(p["chip"]).hbm_bytes / 1e9 * 2**30, **p),
         "the hardware table gives HBM in decimal bytes (1 GB = 1e9 bytes), not GiB."),
        (lambda a: a == _batch_416(**p) + 1,
         f"round down (and use the exact num_params(), not {_NOMINAL[p['model']] / 1e9:g}e9): "
         f"a partial sequence does not fit."),
    ]


register(VariedNumericExercise(
    id="4.16", title="An 8-bit model with a 4-bit cache on 4 H100s", unit="sequences",
    integer=True,
    params={"model": "llama3-70b", "chip": "gpu-h100", "gpus": _GPUS_416, "context": _CTX_416},
    choose={"model": _MODELS, "chip": _GPUS, "gpus": (2, 4, 8),
            "context": (8192, 16_384, 32_768, 65_536, 131_072)},
    solve=lambda **p: _batch_416(**p), hints_for=_ex16_hints,
    valid=lambda **p: _batch_416(**p) >= 1,
    describe=lambda model, chip, gpus, context: _words(model, chip),
    variant_title="An 8-bit model with a 4-bit cache on {gpus} {chip_short}s",
    statement="{model_name} is served on {gpus} {chip_name} GPUs (HBM from the book's hardware "
              "table) with fp8 weights (1 byte per parameter, exact count from `num_params()`) "
              "and an int4 KV cache (half a byte per element; ignore the scales). How many "
              "sequences of {context:,} tokens fit in the HBM left after the weights? Ignore "
              "activations; answer a whole number of sequences.",
))
