"""Chapter 8 exercises: serving LLaMA-3. Reference answers are computed from scalebook
(serving, inference, hardware, models); the code answers run on several models and chips."""

from __future__ import annotations

import dataclasses
import functools
import math

from .. import inference as inf
from .. import serving
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import (ChoiceExercise, CodeExercise, NumericExercise,
                    VariedNumericExercise, as_number)

FRAC = 0.9


def _close(a, b, rtol=0.02):
    return math.isclose(a, b, rel_tol=rtol)


def _m(name):
    return get_model(name)


def _pow2_at_least(x):
    return 2 ** math.ceil(math.log2(max(x, 1)))


# 8.1 -------------------------------------------------------------------------------------
_B1 = 64      # sequences: not the chapter's 32, whose slice section 8.1 prints


def _min_v5e(kv=True, s_w=1.0, frac=FRAC, pow2=True, s_kv=2, batch=_B1):
    m, chip = _m("llama3-70b"), get_chip("tpu-v5e")
    cache = batch * 8192 * inf.kv_bytes_per_token(m) * s_kv / 2
    need = m.weight_bytes(s_w) + (cache if kv else 0)
    n = need / (frac * chip.hbm_bytes)
    return _pow2_at_least(n) if pow2 else math.ceil(n)


register(NumericExercise(
    id="8.1", title="The smallest v5e slice for 70B in int8", unit="chips", integer=True,
    reference=lambda: serving.plan_serving("llama3-70b", "tpu-v5e", "int8", context_len=8192,
                                           output_len=512, min_batch=_B1).n_chips,
    hints=[
        (lambda a: a == _min_v5e(kv=False), "that slice holds the int8 weights, but not the "
         "64 caches of 8192 tokens next to them (2 L H_kv h s bytes per token)."),
        (lambda a: a == _min_v5e(kv=False, s_w=0.5), "int8 weights are 1 byte each, and the "
         "caches need room too."),
        (lambda a: a in (_min_v5e(frac=1.0), _min_v5e(s_kv=1), _min_v5e(batch=32)),
         "too small: only 90% of each chip's HBM is usable, the cache is bf16, 2 bytes per "
         "element (1 byte is the weights only), and there are 64 sequences (not section "
         "8.1's 32 caches)."),
        (lambda a: a in (_min_v5e(pow2=False), _min_v5e(pow2=False, frac=1.0)),
         "the planner's TPU slices come in powers of two: round up to the next one."),
    ],
))


# 8.2 -------------------------------------------------------------------------------------
# Keys in 8 bits and values in 4 (a "K8V4" cache: keys are the more sensitive to rounding).
# The chapters print 405B's cache per token at 2, 1 and 0.5 bytes for both (chapters 4 and
# 7), not this mixed one. The slips give distinct multiples of the answer: 4/3 (both at 1
# byte), 2/3 (both at 4 bits, or the keys alone), 1/3 (the values alone), 2 (the factor 2
# on top of a key and a value), 8/3 (bf16), 8 (bits for bytes), 16 (H instead of H_kv),
# 1/126 (one layer).
def _k8v4(key_bytes=1.0, value_bytes=0.5, heads=None, layers=None):
    m = _m("llama3-405b")
    per = ((m.n_layers if layers is None else layers)
           * (m.n_kv_heads if heads is None else heads) * m.head_dim)
    return per * (key_bytes + value_bytes)


def _ref2():
    """Half of an fp8 cache (its keys) plus half of a 4-bit one (its values)."""
    return (inf.kv_bytes_per_token("llama3-405b", dtype="fp8")
            + inf.kv_bytes_per_token("llama3-405b", dtype="int4")) // 2


register(NumericExercise(
    id="8.2", title="KV bytes per token of 405B, keys in 8 bits and values in 4",
    unit="bytes", integer=True, reference=_ref2,
    hints=[
        (lambda a: a == _k8v4(value_bytes=1), "that stores the values in 8 bits too; they "
                                              "take 4 bits, half a byte each."),
        (lambda a: a == _k8v4(key_bytes=0.5),
         "too small: that is the keys alone, or keys and values both at 4 bits; a token "
         "stores a key (1 byte per element) AND a value (half a byte) in every layer."),
        (lambda a: a == _k8v4(key_bytes=0), "that is the values alone; add the keys, 1 byte "
                                            "per element."),
        (lambda a: a == 2 * _k8v4(), "2x too large: the factor 2 of 2 L H_kv h s counts the "
                                     "key and the value, which you have already added "
                                     "separately (1 + 0.5 bytes)."),
        (lambda a: a == _k8v4(2, 2), "that is a bf16 cache; keys take 1 byte per element and "
                                     "values half a byte."),
        (lambda a: a == _k8v4(8, 4), "that counts bits; the question asks for bytes (8 bits "
                                     "each): 1 byte per key element, 0.5 per value element."),
        (lambda a: a == _k8v4(heads=_m("llama3-405b").n_heads),
         "16x too large: GQA caches only the 8 key/value heads, not all 128 query heads."),
        (lambda a: a == _k8v4(layers=1), "that is one layer; the cache holds every one of the "
                                         "126 layers."),
    ],
))


# 8.3 -------------------------------------------------------------------------------------
# 8.3, 8.4 and 8.5 share their numbers (B, T, n); an assignment draws each exercise's own,
# so each statement gives all of them.
_B3, _N3, _T3 = 64, 16, 8192
_SLICE_CHOICES = {"B": (16, 32, 64, 128, 256), "T": (2048, 4096, 8192, 16384, 32768),
                  "n": (8, 16, 32, 64)}


def _t3(s_w=0.5, kv=True, n=_N3, all_params=False, s_kv=2, B=_B3, T=_T3):
    m, chip = _m("llama3-70b"), get_chip("tpu-v5e")
    w = (m.num_params() if all_params else m.matmul_params()) * s_w
    cache = B * T * inf.kv_bytes_per_token(m) * s_kv / 2 if kv else 0
    return (w + cache) / (n * chip.hbm_bandwidth)


def _decode3(B=_B3, T=_T3, n=_N3):
    return inf.decode_step_time("llama3-70b", "tpu-v5e", B, T, n, "int4", check_memory=False)


def _step3(B=_B3, T=_T3, n=_N3):
    return _decode3(B, T, n).t_mem


def _valid3(B, T, n):
    """The int4 weights and the caches fit in 90% of the slice's HBM, and the step is
    memory-bound (8.4 and 8.5 take its throughput from T_mem)."""
    fit = inf.fit_batch("llama3-70b", "tpu-v5e", n, T, weight_dtype="int4",
                        hbm_fraction=FRAC).max_batch
    step = _decode3(B, T, n)
    return fit >= B and step.t_mem > step.t_math


def _hints3(B, T, n):
    def t(**kw):
        return _t3(**{"B": B, "T": T, "n": n, **kw})
    return [
        (lambda a: _close(a, t(s_w=2)), "the weights were counted in bf16; int4 is half "
         "a byte per weight."),
        (lambda a: _close(a, t(s_w=1)), "int4 is half a byte per weight, not one."),
        (lambda a: _close(a, t(kv=False)), "that is the weights alone; the step also reads "
         "the whole batch's cache, B T x 2 L H_kv h s bytes."),
        (lambda a: _close(a, t(n=1)), f"the bytes are read by the {n} chips' HBM together."),
        (lambda a: _close(a, t(s_kv=0.5)), "only the weights are int4; the cache is bf16, "
         "2 bytes per element."),
    ]


_SLICE_WORDS = ("LLaMA-3 70B with int4 weights decodes a batch of {B} sequences at context "
                "{T} (bf16 cache) on {n} TPU v5e chips.")

register(VariedNumericExercise(
    id="8.3", title="A decode step of 70B in int4", unit="seconds", rtol=0.03,
    params={"B": _B3, "T": _T3, "n": _N3}, choose=_SLICE_CHOICES,
    solve=_step3, hints_for=_hints3, valid=_valid3, chips=lambda n, **_: n,
    statement=_SLICE_WORDS + " What is the memory time $T_{{\\mathrm{{mem}}}}$ of one step: "
    "the matmul weights ($N_{{\\mathrm{{mm}}}}$, `matmul_params()`) and the whole cache, "
    "read once over the {n} chips' HBM bandwidth? Answer in seconds.",
))


# 8.4 -------------------------------------------------------------------------------------
def _tps4(B=_B3, T=_T3, n=_N3):
    return B / _step3(B, T, n) / n


def _hints4(B, T, n):
    tps = _tps4(B, T, n)
    return [
        (lambda a: _close(a, tps * n), f"that is the whole slice; divide by its {n} chips."),
        (lambda a: _close(a, tps / B), f"a step makes one token for each of the {B} "
         "sequences of the batch."),
        (lambda a: _close(a, tps / (B * n)), "that is one sequence on one chip: a step "
         "makes B tokens, shared by n chips."),
    ]


_MEMORY_BOUND_WORDS = (" The step is memory-bound: it takes $T_{{\\mathrm{{mem}}}}$, the "
                       "matmul weights ($N_{{\\mathrm{{mm}}}}$) and the whole cache read "
                       "once over the {n} chips' HBM bandwidth (exercise 8.3).")

register(VariedNumericExercise(
    id="8.4", title="Tokens per second per chip", unit="tokens/s", rtol=0.03,
    params={"B": _B3, "T": _T3, "n": _N3}, choose=_SLICE_CHOICES,
    solve=_tps4, hints_for=_hints4, valid=_valid3, chips=lambda n, **_: n,
    statement=_SLICE_WORDS + _MEMORY_BOUND_WORDS + " How many output tokens per second "
    "does each chip of the slice produce?",
))


# 8.5 -------------------------------------------------------------------------------------
def _cost5(price_mult=1.0, per=3600, B=_B3, T=_T3, n=_N3):
    price = get_chip("tpu-v5e").price_per_hour * price_mult
    return price / per / _tps4(B, T, n) * 1e6


def _hints5(B, T, n):
    def c(**kw):
        return _cost5(B=B, T=T, n=n, **kw)
    return [
        (lambda a: _close(a, c(price_mult=n)), "the price is per chip-hour and the "
         f"throughput per chip: no factor {n}."),
        (lambda a: _close(a, c(per=1)), "the price is per hour and the throughput per "
         "second: divide the price by 3600."),
        (lambda a: _close(a, c() / 1e6), "that is per token; the question asks per "
         "million tokens."),
        (lambda a: _close(a, c(price_mult=1 / n)), "that divides one chip's price by "
         f"the whole slice's tokens/s: take both per chip (or both for the {n} chips)."),
    ]


register(VariedNumericExercise(
    id="8.5", title="Dollars per million output tokens", unit="dollars", rtol=0.03,
    params={"B": _B3, "T": _T3, "n": _N3}, choose=_SLICE_CHOICES,
    solve=lambda B, T, n: _cost5(B=B, T=T, n=n), hints_for=_hints5, valid=_valid3,
    chips=lambda n, **_: n,
    statement=_SLICE_WORDS + _MEMORY_BOUND_WORDS + " At the on-demand price of a v5e chip "
    "in the hardware table (`get_chip(\"tpu-v5e\").price_per_hour`, dollars per "
    "chip-hour), what do a million output tokens cost at that throughput (decode chips "
    "only)? Answer in dollars.",
))


# 8.6 -------------------------------------------------------------------------------------
_S6, _OUT6, _MFU6 = 4096, 256, 0.5


def _ratio6(mfu=_MFU6, attention=True, causal=True, upside=False):
    m, chip = _m("llama3-70b"), get_chip("tpu-v5e")
    per_tok = (m.forward_flops_per_token(_S6, causal=causal) if attention
               else m.dense_flops_per_token())
    r_p = chip.bf16_flops * mfu / (_S6 * per_tok)
    r_d = _tps4() / _OUT6
    return r_p / r_d if upside else r_d / r_p


register(NumericExercise(
    id="8.6", title="Prefill chips per decode chip", unit="", rtol=0.03, reference=_ratio6,
    hints=[
        (lambda a: _close(a, _ratio6(mfu=1.0)), "half the answer: at 50% MFU a prefill chip "
         "does half its peak (twice the chips), and this exercise generates 256 tokens per "
         "request, not the chapter's 512 (twice the requests per decode chip)."),
        (lambda a: _close(a, _ratio6(upside=True)), "upside down: prefill chips per decode "
         "chip = (requests/s a decode chip finishes) / (prompts/s a prefill chip starts)."),
        (lambda a: _close(a, _ratio6(causal=False)), "a causal kernel computes only the "
         "unmasked half of the S x S scores: (S + 1) / 2 keys per token on average."),
        (lambda a: _close(a, _ratio6(attention=False)), "that counts the matmul weights "
         "only; add causal attention, 4 L H h (S + 1) / 2 FLOPs per prompt token."),
    ],
))


# 8.7 -------------------------------------------------------------------------------------
def _full7(frac=FRAC, batch=None, read_all=False):
    m, chip = _m("llama3-8b"), get_chip("gpu-h100")
    per_seq = inf.kv_bytes_per_token(m) * 4096
    B = math.floor((frac * chip.hbm_bytes - m.weight_bytes(2)) / per_seq) if batch is None \
        else batch
    read = m.num_params() if read_all else m.matmul_params()
    return (read * 2 + B * per_seq) / chip.hbm_bandwidth


register(NumericExercise(
    id="8.7", title="The latency where the HBM is full", unit="seconds", rtol=0.01,
    reference=lambda: serving.plan_serving("llama3-8b", "gpu-h100", context_len=4096,
                                           output_len=256, n_chips=1,
                                           batch="max").step_time,
    hints=[
        (lambda a: _close(a, _full7(frac=1.0)), "that fills all of the HBM; the server may "
         "use 90%."),
        (lambda a: _close(a, _full7(batch=1)), "that is one sequence; fill the HBM with as "
         "many caches as fit."),
        (lambda a: _close(a, _full7(batch=0)), "that is the weights alone; at a full HBM the "
         "caches are most of the bytes."),
        (lambda a: _close(a, FRAC * get_chip("gpu-h100").hbm_bytes
                          / get_chip("gpu-h100").hbm_bandwidth, 0.01),
         "0.9 M_cap / W_hbm is the large-batch limit (reading all N weights comes to about "
         "the same); count the bytes a step reads: the matmul weights N_mm (the embedding "
         "is looked up, not streamed) and the caches of a whole number of sequences."),
    ],
))


# 8.8 -------------------------------------------------------------------------------------
_CASE8 = dict(weights_dtype="int8", kv_dtype="bf16", n_chips=16, batch=256, context_len=512,
              output_len=128)


def _plan8(hop=1e-6):
    return serving.plan_serving("llama3-70b", "tpu-v5e", hop_latency=hop, **_CASE8)


register(ChoiceExercise(
    id="8.8", title="What bounds a large batch at a short context?",
    choices=("memory", "compute", "communication"), reference=lambda: _plan8().bound,
    hints={"memory": "decode is memory-bound below the critical batch; with 1-byte weights "
                     "and bf16 compute B* is about C x 1 / (2 W_hbm), and 256 sequences are "
                     "above it: compare 2 N_mm B / (n C) with N_mm / (n W_hbm). Attention "
                     "reads only 512 tokens per sequence.",
           "communication": "the 2 L all-reduces of the [256, 8192] activations (bf16) on a "
                            "4 x 4 torus take several ms, but the kernels, attention then "
                            "the matmuls, take longer."},
))


# 8.9 -------------------------------------------------------------------------------------
# 70B bf16 on v5e at a short context (2048 tokens), 32 -> 64 chips, each at the largest batch
# that fits: section 8.2 prints the same model rising from 16 to 32 chips at 8192 tokens;
# here the batch is four times larger and the all-reduces of 64 chips take longer than the
# HBM read. Tokens/s per chip fall by 12% to 39% for any hop latency from 0.3 to 3 µs, with
# the step taken as max(FLOPs/C, bytes/W, comm) or per kernel (attention's KV read, then
# the matmuls) against comm: tests/test_exercises_ch08.py checks both.
_MODEL9, _CHIP9, _T9, _N9 = "llama3-70b", "tpu-v5e", 2048, (32, 64)


def _full_plan9(n, hop=1e-6):
    """The plan at the largest batch that fits in 90% of HBM, a multiple of the KV batch
    shards (given explicitly, whatever the planner's default batch)."""
    kw = dict(context_len=_T9, n_chips=n, hop_latency=hop)
    first = serving.plan_serving(_MODEL9, _CHIP9, **kw)
    step = first.kv_batch_shards * first.pipeline_stages
    return serving.plan_serving(_MODEL9, _CHIP9, batch=first.max_batch // step * step, **kw)


def _trend9(hop=1e-6):
    a, b = (_full_plan9(n, hop).tokens_per_s_per_chip for n in _N9)
    return "rises" if b > 1.05 * a else ("falls" if b < a / 1.05 else "same")


register(ChoiceExercise(
    id="8.9", title="A bigger slice at a short context",
    choices=("rises", "same", "falls"), reference=_trend9,
    hints={"rises": "by the HBM alone it would rise (per chip the weights shrink and the "
                    "batch grows, as in section 8.2); but at 2048 tokens over twice as many "
                    "sequences fit on 64 chips: count the 2 L all-reduces of their [B, D] "
                    "activations on the 8 x 8 torus (plan_serving(..., n_chips=64).t_comm).",
           "same": "compare each slice's step with its HBM read: on 64 chips the all-reduces "
                   "take longer than the read, and the batch per chip does not grow enough "
                   "to make up for it."},
))


# 8.10 ------------------------------------------------------------------------------------
# The slice sizes are the chip's (serving.slice_sizes): powers of two, but no 2-chip TPU
# slice, and 4 chips at least on a 3D torus (v4, v5p). The first case tells the typical
# slips apart (no caches, all of the HBM, no rounding to a slice; 16 GB read as 16 GiB
# gives 16 chips, as all of the HBM does); the second is one where 80 GB read as 80 GiB
# alone changes the answer, and the third one where v5p's 95 GiB read as 95e9 does; the
# fourth and fifth, slices where a power of two is not a slice the chip comes in (2 chips
# of v6e, 1 of v5p).
_CASES_10 = [("llama3-70b", "tpu-v5e", "int8", 8192, 64),
             ("llama3-8b", "gpu-h100", "int8", 8192, 64),
             ("llama3-70b", "tpu-v5p", "int4", 32768, 64),
             ("llama3-8b", "tpu-v6e", "bf16", 8192, 16),
             ("llama3-8b", "tpu-v5p", "bf16", 4096, 8),
             ("llama3-8b", "gpu-h100", "bf16", 8192, 64),
             ("llama3-405b", "tpu-v6e", "int4", 4096, 16),
             ("llama3-70b", "gpu-h200", "bf16", 32768, 8),
             ("llama3-405b", "tpu-v5e", "int8", 8192, 32)]


def _min_slice_ref(model, chip, weights_dtype, context, min_batch):
    return serving.plan_serving(model, chip, weights_dtype, context_len=context,
                                output_len=1, min_batch=min_batch).n_chips


def _other_prefix(hbm):
    """The capacity read with the other prefix: 16 GB as 16 GiB, 95 GiB as 95 GB."""
    gb, gib = hbm / 1e9, hbm / 2 ** 30
    return gb * 2 ** 30 if float(gb).is_integer() else gib * 1e9


def _min_slice_variant(args, kv=True, frac=FRAC, pow2=True, s_kv=2, sizes=True,
                       prefix=False):
    model, chip, wd, T, B = args
    m, c = _m(model), get_chip(chip)
    need = m.weight_bytes(inf.bytes_per_element(wd)) + (
        B * T * inf.kv_bytes_per_token(m) * s_kv / 2 if kv else 0)
    n = need / (frac * (_other_prefix(c.hbm_bytes) if prefix else c.hbm_bytes))
    if not pow2:
        return math.ceil(n)
    if not sizes:
        return _pow2_at_least(n)
    return next((k for k in serving.slice_sizes(chip) if k >= n), None)


def _smaller_prefix_slip(got, want, args):
    """The answer with 16 GB read as 16 GiB (more bytes per chip: fewer chips)."""
    n = _min_slice_variant(args, prefix=True)
    return as_number(got) == n and n is not None and n < want


def _gen10(rng):
    """A LLaMA-3, a chip, a weight dtype, a context and a batch whose caches and weights
    fit some slice of the chip."""
    while True:
        args = (rng.choice(("llama3-8b", "llama3-70b", "llama3-405b")),
                rng.choice(("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-a100",
                            "gpu-h100", "gpu-h200", "gpu-b200")),
                rng.choice(("bf16", "int8", "int4")),
                rng.choice((2048, 4096, 8192, 16384, 32768)),
                rng.choice((1, 4, 8, 16, 32, 64, 128)))
        try:
            _min_slice_ref(*args)
        except ValueError:      # no slice holds it, or its TP degree would split the heads
            continue
        return args


register(CodeExercise(
    id="8.10", title="The smallest slice, in code", reference=_min_slice_ref,
    cases=_CASES_10, compare=lambda got, want: as_number(got) == want, unit="chips",
    describe=lambda m, c, w, T, B: f"{m} on {c}, {w}, context {T}, min_batch {B}",
    generate=_gen10,
    hints=[
        (lambda got, want, args: as_number(got) == _min_slice_variant(args, kv=False),
         "the weights fit, but the min_batch caches of context tokens must fit next to them."),
        (lambda got, want, args: as_number(got) in (_min_slice_variant(args, frac=1.0),
                                                    _min_slice_variant(args, s_kv=1))
         or _smaller_prefix_slip(got, want, args),
         "too small: only 90% of each chip's HBM is usable, the cache is bf16, 2 bytes "
         "per element, and hbm_bytes is already in bytes (16 GB is 16e9 bytes, not "
         "16 x 2**30)."),
        (lambda got, want, args: as_number(got) == _min_slice_variant(args, prefix=True),
         "hbm_bytes is already the capacity in bytes: a v5p's 95 GiB is 95 x 2**30 bytes, "
         "not 95e9."),
        (lambda got, want, args: as_number(got) == _min_slice_variant(args, sizes=False),
         "that power of two is not a slice this chip comes in: a TPU has no 2-chip slice "
         "(1 chip, then 4, 8, 16, ...), and a v4 or v5p slice (3D torus) has at least 4 "
         "chips (serving.slice_sizes(chip) lists them)."),
        (lambda got, want, args: as_number(got) == _min_slice_variant(args, pow2=False),
         "slices come in powers of two: round up to the next one."),
    ],
))


# 8.11 ------------------------------------------------------------------------------------
# One definition of the front, the same as section 8.6's and serving.pareto_front's: a point
# is dominated when another is at least as good on both counts (latency no higher,
# throughput no lower); the points are distinct, so it is better on one. The first case
# tells the typical slips apart, each giving a different wrong list: every point; the
# lowest throughputs kept (direction); ties kept (strict dominance, or a sort without the
# tie-break, or >= in the walk: (2, 90) or (2.5, 100) beside (2, 100)); the right points
# unsorted.
_CASES_11 = [
    ([(2.0, 100.0), (3.0, 250.0), (1.5, 40.0), (2.0, 90.0), (4.0, 300.0), (1.0, 50.0),
      (2.5, 100.0), (3.0, 100.0)],),
    ([(2.0, 100.0), (1.0, 50.0), (3.0, 90.0), (4.0, 300.0), (1.5, 40.0)],),
    ([(10.0, 5.0), (20.0, 4.0), (5.0, 1.0), (30.0, 8.0), (25.0, 8.5), (7.0, 3.0)],),
    ([(1.0, 1.0)],),
    ([(3.0, 30.0), (1.0, 10.0), (2.0, 20.0), (2.5, 15.0)],),
    ([(2.0, 90.0), (3.0, 100.0), (1.0, 50.0), (2.0, 100.0)],),   # ties on each axis
]


def _gen11(rng):
    """1 to 12 distinct (latency, throughput) points on coarse grids, so that ties on one
    count are common."""
    n = rng.randint(1, 12)
    lats = [0.5 * k for k in range(1, 13)]
    tps = [25.0 * k for k in range(1, 17)]
    points = []
    while len(points) < n:
        p = (rng.choice(lats), rng.choice(tps))
        if p not in points:
            points.append(p)
    return (points,)


def _pareto_ref(points):
    front, best = [], -math.inf
    for lat, tps in sorted(points, key=lambda p: (p[0], -p[1])):
        if tps > best:
            front.append((lat, tps))
            best = tps
    return front


def _as_pairs(got):
    try:
        return [(float(a), float(b)) for a, b in got]
    except (TypeError, ValueError):
        return None


def _pareto_equal(got, want):
    return _as_pairs(got) == want


def _strict_front(points):
    """The points no other beats strictly on both counts: the weak front plus the ties."""
    return [p for p in points if not any(q[0] < p[0] and q[1] > p[1] for q in points)]


def _keeps_ties(got, want, points):
    """Every point of the front and some tied ones (dominated only with a tie on one axis),
    in any order."""
    g = _as_pairs(got)
    return (g is not None and set(want) < set(g) <= set(_strict_front(points))
            and len(g) == len(set(g)))


def _wrong_direction(got, points):
    """The lowest throughputs kept (a min instead of a max, or the front of the slowest and
    weakest points), in any order."""
    g = _as_pairs(got)
    if g is None:
        return False
    low = [p for p in points if not any(q != p and q[0] <= p[0] and q[1] <= p[1]
                                        for q in points)]
    return set(g) == set(low) and set(low) != set(_pareto_ref(points))


register(CodeExercise(
    id="8.11", title="The Pareto front, in code", reference=_pareto_ref, cases=_CASES_11,
    compare=_pareto_equal, describe=lambda pts: f"points={pts}", generate=_gen11,
    hints=[
        (lambda got, want, args: _as_pairs(got) is not None
         and sorted(_as_pairs(got)) == sorted(args[0]),
         "that keeps every point: drop each point that another is at least as good as on "
         "both counts (latency no higher and throughput no lower)."),
        (lambda got, want, args: _wrong_direction(got, args[0]),
         "those are the points with the lowest throughput: more tokens/s is better, so a point "
         "stays when its throughput is above that of every point with lower or equal latency."),
        (lambda got, want, args: _keeps_ties(got, want, args[0]),
         "a tie on one count still dominates: a point with the same latency and more "
         "throughput, or the same throughput at lower latency, beats it. (A walk over "
         "sorted(points) meets the lower throughput of two equal latencies first and keeps "
         "it: sort equal latencies by throughput, highest first, and keep a point only when "
         "its throughput is strictly above the best so far.)"),
        (lambda got, want, args: _as_pairs(got) is not None
         and sorted(_as_pairs(got)) == want and _as_pairs(got) != want,
         "the right points, in the wrong order: return them sorted by latency, lowest "
         "first."),
    ],
))


# 8.12 ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _plans(model, chips):
    return tuple(serving.candidate_plans(model, list(chips), context_len=8192, output_len=512))


_CASES_12 = [("llama3-70b", ("tpu-v5e", "gpu-h100"), "exact"),
             ("llama3-70b", ("tpu-v5e", "gpu-h100"), 0.02),
             ("llama3-70b", ("tpu-v5e", "gpu-h100", "tpu-v6e"), 0.005),
             ("llama3-8b", ("gpu-h100", "tpu-v5e"), 0.003),
             ("llama3-405b", ("tpu-v5e", "gpu-h100", "gpu-h200"), 0.03)]


@dataclasses.dataclass(frozen=True)
class _Cheapest:
    """The reference's plan and the target: any plan meeting the target at the same cost
    (within rounding: compute-bound plans of different batches cost the same) is right."""

    plan: serving.ServingPlan
    target: float


def _cheapest_ref(plans, target):
    return _Cheapest(serving.cheapest_plan(plans, target), target)


def _same_cost(got, want: _Cheapest) -> bool:
    return (isinstance(got, serving.ServingPlan) and got.step_time <= want.target
            and got.cost_per_million is not None
            and math.isclose(_e2e(got), _e2e(want.plan), rel_tol=1e-9))


def _args12(model, chips, target):
    plans = list(_plans(model, chips))
    if target == "exact":      # the target equals the cheapest plan's step time at 20 ms
        target = serving.cheapest_plan(plans, 0.02).step_time
    return (plans, target)




def _gen12(rng):
    """A LLaMA-3 on two or three chips (one of them with a price at least) and a target:
    now and then exactly a plan's step time (a plan at the target meets it), else drawn
    between the fastest and the slowest priced plan (log-uniform)."""
    while True:
        model = rng.choice(("llama3-8b", "llama3-70b", "llama3-405b"))
        chips = tuple(rng.sample(("tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-h100", "gpu-h200"),
                                 rng.choice((2, 3))))
        plans = list(_plans(model, chips))
        priced = sorted(p.step_time for p in plans if p.cost_per_million is not None)
        if not priced:
            continue
        if rng.random() < 0.3:
            target = rng.choice(priced)
        else:
            lo, hi = math.log(priced[0]), math.log(priced[-1])
            target = round(math.exp(rng.uniform(lo, hi)), 6)
            if target < priced[0]:
                continue
        return (plans, target)


class _LazyCases(list):
    """Cases built on first use (the candidate searches take a moment)."""

    def __iter__(self):
        if not len(self):
            self.extend(_args12(*c) for c in _CASES_12)
        return super().__iter__()


def _describe12(plans, target):
    chips = sorted({p.chip for p in plans})
    return f"{len(plans)} plans of {plans[0].model} on {', '.join(chips)}, target {target} s"


def _fastest_ok(plans, target):
    return min((p for p in plans if p.step_time <= target), key=lambda p: p.step_time)


def _e2e(p):
    return p.cost_per_million_with_prefill


def _cheapest_any(plans, target):
    return min((p for p in plans if p.cost_per_million is not None), key=_e2e)


def _strict(plans, target):
    return min((p for p in plans if p.step_time < target and p.cost_per_million is not None),
               key=_e2e)


def _decode_only(plans, target):
    return min((p for p in plans if p.step_time <= target and p.cost_per_million is not None),
               key=lambda p: p.cost_per_million)


def _most_tps(plans, target):
    return max((p for p in plans if p.step_time <= target),
               key=lambda p: p.tokens_per_s_per_chip)


register(CodeExercise(
    id="8.12", title="The cheapest plan that meets a latency target, in code",
    reference=_cheapest_ref, cases=_LazyCases(), compare=_same_cost,
    describe=_describe12, generate=_gen12,
    hints=[
        (lambda got, want, args: got == _cheapest_any(*args),
         "that plan is the cheapest, but its time per token misses the target."),
        (lambda got, want, args: got == _fastest_ok(*args),
         "that is the fastest plan; among those meeting the target, take the cheapest."),
        (lambda got, want, args: got == _decode_only(*args),
         "that plan has the cheapest decode; every request pays its prefill too: compare "
         "cost_per_million_with_prefill."),
        (lambda got, want, args: got == _most_tps(*args),
         "the most tokens/s per chip is not the cheapest across chips of different prices, "
         "and leaves out the prefill: compare cost_per_million_with_prefill."),
        (lambda got, want, args: got == _strict(*args),
         "a plan whose step_time equals the target meets it: keep step_time <= target."),
    ],
))


# 8.13 ------------------------------------------------------------------------------------
_B13 = 16     # sequences: enough that tokens share experts, not so few that B k distinct
#               experts (no sharing) is within the tolerance; no table of 8.9 prints it


def _ds3():
    from ..models import DEEPSEEK_V3
    return DEEPSEEK_V3


def _bytes13(experts=None, layers=None, fixed=True, s_w=1.0):
    """Weight bytes one decode step of DeepSeek-V3 reads at batch 16, or a typical mistake:
    ``experts`` routed experts per MoE layer instead of E_B, over ``layers`` layers."""
    m = _ds3()
    E, k, N_e = m.n_experts, m.top_k, m.dense.mlp_params_per_layer()
    E_B = inf.expected_experts(E, k, _B13) if experts is None else experts
    L = m.moe_layers if layers is None else layers
    base = m.active_matmul_params() - m.moe_layers * k * N_e
    return s_w * ((base if fixed else 0) + L * E_B * N_e)


def _ref13():
    return inf.moe_decode_step(_ds3(), "gpu-h200", _B13, 4096, n_chips=32,
                               weight_dtype="fp8", compute_dtype="fp8",
                               check_memory=False).weight_bytes


register(NumericExercise(
    id="8.13", title="The weights an MoE decode step reads", unit="bytes", rtol=0.03,
    reference=_ref13,
    hints=[
        (lambda a: _close(a, _bytes13(experts=_ds3().top_k)), "that is one token's weights "
         "(the active parameters); 16 tokens reach more than 8 experts per layer."),
        (lambda a: _close(a, _bytes13(experts=_ds3().n_experts)), "that reads all 256 "
         "experts; at batch 16 a step reaches only E (1 - (1 - k/E)^B) of them on average."),
        (lambda a: _close(a, _bytes13(experts=_B13 * _ds3().top_k)), "close, but B k = 128 "
         "experts counts an expert twice when two tokens pick it: the expected number of "
         "distinct experts is E (1 - (1 - k/E)^B)."),
        (lambda a: _close(a, _B13 * _bytes13(experts=_ds3().top_k)), "the weights are read "
         "once per step for all 16 tokens, not once per token."),
        (lambda a: _close(a, _bytes13(s_w=2.0)), "fp8 weights are 1 byte each, not 2."),
        (lambda a: _close(a, _bytes13(fixed=False), 0.005), "that is the routed experts alone; add "
         "the weights every token meets: attention, the 3 dense layers' MLPs, the shared "
         "experts, the routers and the output head."),
        (lambda a: _close(a, _bytes13(layers=_ds3().dense.n_layers)), "only 58 of the 61 "
         "layers have experts: the first 3 are dense (their MLPs are in the weights every "
         "token meets)."),
    ],
))


# 8.14 ------------------------------------------------------------------------------------
# Paged KV on 8 v5e chips: 70B with int8 weights, bf16 cache, pages of 256 tokens. Half the
# requests hold 200 + 100 tokens at the end, half 3,000 + 1,000: how many fit at once?
_PAGE14, _SHORT14, _LONG14 = 256, (200, 100), (3000, 1000)


def _held14(page=_PAGE14, frac=FRAC, s_kv=2, prompt_only=False, pages=True, count=False,
            matmul_only=False, pairs=True, n=8, short=_SHORT14, long=_LONG14):
    m, chip = _m("llama3-70b"), get_chip("tpu-v5e")
    weights = m.matmul_params() if matmul_only else m.weight_bytes(1.0)
    free = n * chip.hbm_bytes * frac - weights
    kv = inf.kv_bytes_per_token(m) * s_kv / 2
    lens = [p + (0 if prompt_only else o) for p, o in (short, long)]
    if count:
        return 2 * math.floor(free / (max(lens) * kv) / 2)
    if not pages:
        return 2 * math.floor(free / kv / sum(lens))
    n_pages = math.floor(free / (page * kv))
    per_pair = sum(math.ceil(x / page) for x in lens)
    return 2 * (n_pages // per_pair) if pairs else 2 * n_pages / per_pair


def _ref14(page=_PAGE14, short=_SHORT14, long=_LONG14, n=8):
    fit = inf.fit_batch("llama3-70b", "tpu-v5e", n, sum(long), weight_dtype="int8",
                        hbm_fraction=FRAC)
    n_pages = int(fit.free // (page * inf.kv_bytes_per_token("llama3-70b")))
    pair = inf.paged_kv_tokens([sum(short), sum(long)], page, sum(long))
    return 2 * (n_pages // (pair.paged // page))


def _a(number):
    """The article before a number said aloud: "an" for 8, 11, 18, 80-89, 800-899, ..."""
    digits = str(number)
    return "an" if digits[0] == "8" or (len(digits) in (2, 5) and digits[:2] in ("11", "18")) \
        else "a"


def _hints14(page, short, long, n):
    def held(**kw):
        return _held14(**{"page": page, "short": short, "long": long, "n": n, **kw})
    s, lg = sum(short), sum(long)
    ps, pl = math.ceil(s / page), math.ceil(lg / page)
    return [
        (lambda a: a == held(matmul_only=True),
         "the weights are all N parameters at 1 byte (the embedding table sits in HBM too), "
         "not only the N_mm of the matmuls; and only whole pairs fit (round down)."),
        (lambda a: 2 * a == held(),
         "that is the number of pairs, half the answer: each pair is two requests, one of "
         "each kind."),
        (lambda a: a % 2 == 1 or a == math.ceil(held(pairs=False) / 2) * 2,
         "the two kinds come in equal numbers: count whole pairs that fit (round down), "
         "two requests each."),
        (lambda a: a == held(count=True) or _close(a, held(count=True) + 1, 0.001),
         f"that reserves the longest request, {lg:,} tokens, for every one (admission by "
         "count); with pages each request holds only its own length."),
        (lambda a: _close(a, held(pages=False), 0.02) or _close(a, held(page=16), 0.02),
         f"pages are {page} tokens and allocated whole: {_a(s)} {s:,}-token request holds "
         f"{ps} page{'s' if ps > 1 else ''} ({ps * page:,} slots), {_a(lg)} {lg:,}-token one "
         f"{pl} ({pl * page:,})."),
        (lambda a: _close(a, held(prompt_only=True), 0.02),
         "that counts the prompts only; at the end every request also holds its output "
         "tokens' keys and values."),
        (lambda a: _close(a, held(frac=1.0), 0.02),
         "only 90% of each chip's HBM is usable, and the weights come out of it."),
        (lambda a: _close(a, held(s_kv=1), 0.02),
         "2x too many: the cache is bf16, 2 bytes per element."),
    ]


def _valid14(page, short, long, n):
    """Requests of the two kinds are at least a page apart (so that pages matter), and
    the slice holds a few pairs."""
    return sum(long) > 2 * sum(short) and _ref14(page, short, long, n) >= 4


register(VariedNumericExercise(
    id="8.14", title="Requests a paged cache holds", unit="requests", integer=True,
    params={"page": _PAGE14, "short": _SHORT14, "long": _LONG14, "n": 8},
    choose={"page": (32, 64, 128, 256, 512),
            "short": ((200, 100), (100, 50), (500, 300), (1000, 200)),
            "long": ((3000, 1000), (1500, 500), (6000, 2000), (12000, 4000)),
            "n": (8, 16)},
    solve=_ref14, hints_for=_hints14, valid=_valid14,
    describe=lambda page, short, long, n: {"sp": f"{short[0]:,}", "so": f"{short[1]:,}",
                                           "lp": f"{long[0]:,}", "lo": f"{long[1]:,}"},
    statement="LLaMA-3 70B with int8 weights (all $N$ parameters at 1 byte) and a bf16 "
              "cache runs on {n} TPU v5e chips, 90% of each chip's HBM usable. The cache is "
              "paged, {page} tokens per page, each page allocated whole. Half the requests "
              "end with {sp} prompt + {so} output tokens, half with {lp} + {lo}. When every "
              "request has grown to its full length, how many requests does the cache hold "
              "at once (the two kinds in equal numbers)?",
))


# 8.15 ------------------------------------------------------------------------------------
def _trip15(s_kv=1, kv_factor=2, links=16, per=1.0, model="llama3-70b", prompt=4096,
            chip="tpu-v5e"):
    m, c = _m(model), get_chip(chip)
    nbytes = prompt * kv_factor * m.n_layers * m.n_kv_heads * m.head_dim * s_kv
    return nbytes / (links * c.dcn_bandwidth * per)


def _plan15(model="llama3-70b", prompt=4096, kv="int8", n=16, chip="tpu-v5e"):
    return serving.plan_serving(model, chip, "bf16", kv, context_len=prompt + 512,
                                output_len=512, prompt_len=prompt, n_chips=n)


def _hints15(model, prompt, kv, n, chip):
    s_kv = inf.bytes_per_element(kv)

    def trip(**kw):
        return _trip15(**{"s_kv": s_kv, "links": n, "model": model, "prompt": prompt,
                          "chip": chip, **kw})
    other = ("that is a bf16 cache; int8 is 1 byte per element." if s_kv == 1 else
             f"that is an 8-bit cache; {kv} is {s_kv:g} bytes per element.")
    return [
        (lambda a: _close(a, trip(s_kv=3 - s_kv)), other),
        (lambda a: _close(a, trip(kv_factor=1)), "each token stores a key and a value: "
         "2 L H_kv h s_kv bytes."),
        (lambda a: _close(a, trip(links=1)), "that sends the whole cache over one link; "
         f"each of the {n} chips sends its own share at the same time."),
        (lambda a: _close(a, trip(per=1 / 8)), "dcn_bandwidth is already bytes per "
         "second: no factor 8."),
    ]


def _valid15(model, prompt, kv, n, chip):
    try:
        _plan15(model, prompt, kv, n, chip)
    except ValueError:          # the bf16 weights fit no such slice, or it does not exist
        return False
    return True


register(VariedNumericExercise(
    id="8.15", title="The cache's trip to the decode chips", unit="seconds", rtol=0.02,
    params={"model": "llama3-70b", "prompt": 4096, "kv": "int8", "n": 16, "chip": "tpu-v5e"},
    choose={"model": ("llama3-8b", "llama3-70b", "llama3-405b"),
            "prompt": (1024, 2048, 3000, 4096, 6000, 8192, 12000, 16384),
            "kv": ("int8", "bf16"), "n": (4, 8, 16, 32), "chip": ("tpu-v5e", "tpu-v5p")},
    solve=lambda **p: _plan15(**p).kv_transfer_time, hints_for=_hints15, valid=_valid15,
    chips=lambda n, **_: n,
    describe=lambda model, prompt, kv, n, chip: {"short": model.split("-")[-1].upper(),
                                                 "chip_name": get_chip(chip).display_name},
    statement="In a disaggregated server, LLaMA-3 {short} ({kv} cache) prefills prompts of "
              "{prompt:,} tokens on {n} {chip_name} chips and sends each prompt's cache to a "
              "separate decode slice. Each of the {n} chips sends its 1/{n} of the cache over "
              "its own data-centre link, at `get_chip(\"{chip}\").dcn_bandwidth` bytes per "
              "second. How long does one prompt's cache take to cross? Answer in seconds.",
))
