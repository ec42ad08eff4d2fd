"""Chapter 7 exercises: inference. Reference answers are computed from scalebook
(inference, collectives, hardware, models); the code answers are run on several shapes."""

from __future__ import annotations

import math

import numpy as np

from .. import collectives
from .. import inference as inf
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import (ChoiceExercise, CodeExercise, NumericExercise,
                    VariedNumericExercise, as_number)


def _close(a, b, rtol=0.02):
    """Whether two numbers agree; False (never an error) when one is not a number."""
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return False
    return math.isclose(a, b, rel_tol=rtol)


def _m(name):
    return get_model(name)


# Variants (for assignments; see kinds.VariedNumericExercise): each varied exercise's
# ``params`` are the chapter's own numbers, ``choose`` the values an assignment may draw.
_GPUS = ("gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200")
_TPUS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
_LLAMAS = ("llama3-8b", "llama3-70b", "llama3-405b")


def _short(model):
    """"405B" for llama3-405b."""
    return model.split("-")[-1].upper()


def _chip_name(chip):
    return get_chip(chip).display_name


# 7.1 -------------------------------------------------------------------------------------
def _b_star(weight="int8", compute="int8", chip="gpu-a100"):
    return inf.decode_critical_batch(chip, weight, compute)


def _bytes_words(dtype):
    s = inf.bytes_per_element(dtype)
    return f"{s:g} byte" + ("s" if s > 1 else "")


def _hints71(chip, weights, compute):
    ref = _b_star(weights, compute, chip)
    peak_ratio = get_chip(chip).peak_flops(compute) / get_chip(chip).bf16_flops
    grows = "doubles" if math.isclose(peak_ratio, 2) else "raises"
    heavier = 2 * inf.bytes_per_element(weights)
    return [
        (lambda a: _close(a, _b_star(weights, "bf16", chip)),
         f"that is {weights} weights with bf16 compute; {compute} compute {grows} the peak C "
         f"too."),
        (lambda a: _close(a, 2 * ref),
         f"2x too large: either the weights were counted at {heavier:g} byte"
         f"{'s' if heavier > 1 else ''} ({weights} is {inf.bytes_per_element(weights):g}), or "
         f"the factor 2 of 2 B D F FLOPs was left out: B* = C s_w / (2 W_hbm)."),
        (lambda a: _close(a, 1 / ref), "upside down: B* = C s_w / (2 W_hbm)."),
    ]


def _valid71(chip, weights, compute):
    try:                      # the chip publishes a peak for the compute dtype
        get_chip(chip).peak_flops(compute)
    except ValueError:
        return False
    # 8-bit weights multiplied in their own format, or int4 weights widened to 8 bits
    return weights in (compute, "int4")


register(VariedNumericExercise(
    id="7.1", title="Critical batch with int8 weights and int8 compute", unit="sequences",
    rtol=0.03,
    params={"chip": "gpu-a100", "weights": "int8", "compute": "int8"},
    choose={"chip": _GPUS + _TPUS, "weights": ("int8", "fp8", "int4"),
            "compute": ("int8", "fp8")},
    solve=lambda chip, weights, compute: _b_star(weights, compute, chip),
    hints_for=_hints71, valid=_valid71,
    describe=lambda chip, weights, compute: {"chip_name": _chip_name(chip),
                                             "w_bytes": _bytes_words(weights)},
    variant_title="Critical batch with {weights} weights and {compute} compute",
    statement="On one {chip_name} (`{chip}`: its dense {compute} peak and HBM bandwidth from "
              "the hardware table), decode weights are stored in {weights} ({w_bytes} each) "
              "and multiplied at the chip's {compute} peak. Above which batch $B^{{*}}$ does "
              "a decode weight matmul become compute-bound? Use the approximation "
              "$B \\ll D, F$ of section 7.2. Answer in sequences.",
))


# 7.2 -------------------------------------------------------------------------------------
_B2, _T2 = 48, 8192


def _t_mem(kv=True, n=8, kv_bytes=2, all_params=False, B=_B2, T=_T2, chip="gpu-h100"):
    m = _m("llama3-70b")
    w = (m.num_params() if all_params else m.matmul_params()) * 2
    cache = B * T * m.kv_cache_bytes_per_token(kv_bytes) if kv else 0
    return (w + cache) / (n * get_chip(chip).hbm_bandwidth)


def _ref72(B=_B2, T=_T2, chip="gpu-h100"):
    return inf.decode_step_time("llama3-70b", chip, B, T, n_chips=8).t_mem


def _hints72(B, T, chip):
    def t(**kw):
        return _t_mem(B=B, T=T, chip=chip, **kw)
    return [
        (lambda a: _close(a, t(kv=False)), f"that is the weights alone; every sequence also "
                                           f"reads its own {T:,} tokens of cache."),
        (lambda a: _close(a, t(n=1)), "8x too large: the 8 chips read their shares at the "
                                      "same time, so divide by 8 W_hbm."),
        (lambda a: _close(a, t(kv_bytes=4)), "the cache is bf16, 2 bytes per element."),
        (lambda a: _close(a, t() * 1e3), "that is in ms; answer in seconds."),
    ]


def _fits72(B, T, chip):
    try:
        _ref72(B, T, chip)
    except ValueError:          # the weights and the caches do not fit in the 8 HBMs
        return False
    return True


register(VariedNumericExercise(
    id="7.2", title="Minimum decode step of 70B", unit="seconds", rtol=0.03,
    params={"B": _B2, "T": _T2, "chip": "gpu-h100"},
    choose={"B": (16, 32, 48, 64, 96, 128), "T": (2048, 4096, 8192, 16384, 32768),
            "chip": _GPUS},
    solve=_ref72, hints_for=_hints72, valid=_fits72, chips=8,
    describe=lambda B, T, chip: {"chip_name": _chip_name(chip)},
    statement="LLaMA-3 70B in bf16 decodes a batch of {B} sequences at context $T = {T}$ "
              "with a bf16 cache on 8 {chip_name} GPUs. What is the memory-time bound "
              "$T_{{\\mathrm{{mem}}}}$ of one step (matmul weights and the whole batch's "
              "cache, read once, over the 8 chips' HBM bandwidth)? Answer in seconds.",
))


# 7.3 -------------------------------------------------------------------------------------
def _ttft(causal=True, attention=True, factor=1):
    m = _m("llama3-70b")
    S = 16384
    per_tok = m.dense_flops_per_token() * factor
    if attention:
        per_tok += m.attention_flops_per_token(S, causal=causal)
    return S * per_tok / (8 * get_chip("gpu-h100").bf16_flops)


register(NumericExercise(
    id="7.3", title="Time to first token", unit="seconds", rtol=0.02,
    reference=lambda: inf.prefill_time("llama3-70b", "gpu-h100", 1, 16384, n_chips=8).time,
    chips=8,
    hints=[
        (lambda a: _close(a, _ttft(causal=False), 0.01),
         "that counts the full S x S score matrix; a causal kernel skips the masked half."),
        (lambda a: _close(a, _ttft(attention=False), 0.01),
         "add the attention matmuls: 4 L H h (S + 1) / 2 FLOPs per token with causal masking."),
        (lambda a: _close(a, _ttft(factor=3), 0.05),
         "6 N per token is training (forward and backward); prefill is a forward pass, 2 N_mm."),
    ],
))


# 7.4 -------------------------------------------------------------------------------------
def _attn_405(fused=True, G=None, S=4096, model="llama3-405b"):
    m = _m(model)
    return inf.attention_cost(S, S, m.group_size if G is None else G, m.head_dim,
                              fused=fused).intensity


def _hints74(model, S):
    m = _m(model)
    return [
        (lambda a: _close(a, _attn_405(fused=False, S=S, model=model), 0.02),
         "that is the naive kernel that writes the scores to HBM; a fused kernel keeps them on chip."),
        (lambda a: _close(a, S, 0.005),
         "that is S: the G/(G + 1) factor comes from reading q and writing the output (G S h each) "
         "next to k and v (T h each)."),
        (lambda a: _close(a, _attn_405(G=1, S=S, model=model), 0.02),
         f"G = H / H_kv query heads share one KV head: {m.n_heads} / {m.n_kv_heads} = "
         f"{m.group_size} for {_short(model)}."),
    ]


register(VariedNumericExercise(
    id="7.4", title="Prefill attention intensity of 405B", unit="FLOPs/byte", rtol=0.01,
    params={"model": "llama3-405b", "S": 4096},
    choose={"model": _LLAMAS, "S": (1024, 2048, 4096, 8192, 16384, 32768)},
    solve=lambda model, S: _attn_405(S=S, model=model), hints_for=_hints74,
    describe=lambda model, S: {"short": _short(model)},
    variant_title="Prefill attention intensity of {short}",
    statement="For LLaMA-3 {short}, what is the arithmetic intensity of fused (flash-style) "
              "attention in a prefill of $S = T = {S}$ tokens, bf16, for one sequence? Use "
              "the exact expression of 7.2. Answer in FLOPs per byte.",
))


# 7.5 -------------------------------------------------------------------------------------
def _kv(attention="mqa", dtype="fp8", layers_per_kv=2):
    return inf.kv_bytes_per_token("llama3-405b", attention, dtype, layers_per_kv)


register(NumericExercise(
    id="7.5", title="An MQA fp8 cache shared by pairs of layers", unit="bytes", rtol=0.001,
    reference=_kv,
    hints=[
        (lambda a: _close(a, _kv("gqa"), 0.001),
         "8x too large: that is GQA with 8 KV heads; MQA keeps one. (Or bits for bytes?)"),
        (lambda a: _close(a, _kv(dtype="bf16"), 0.001),
         "2x too large: fp8 is 1 byte per element (not bf16's 2), and each pair of layers "
         "stores one K and V (126 / 2 = 63 stored layers)."),
        (lambda a: _close(a, _kv(dtype="bf16", layers_per_kv=1), 0.001),
         "4x too large: fp8 is 1 byte per element, and a pair of layers shares one K and V."),
        (lambda a: _close(a, _kv() / 2, 0.001), "2x too small: the cache holds keys AND values."),
        (lambda a: _close(a, _kv() / 63, 0.001) or _close(a, _kv() / 126, 0.001),
         "that is one layer; every stored layer (126 / 2 = 63) keeps its own."),
    ],
))


# 7.6 -------------------------------------------------------------------------------------
def _fit(kv="int8", with_weights=True, chip="gpu-h100", context=32768):
    if with_weights:
        return inf.fit_batch("llama3-8b", chip, 1, context, kv_dtype=kv).max_batch
    per_seq = inf.kv_bytes_per_sequence("llama3-8b", context, dtype=kv)
    return int(get_chip(chip).hbm_bytes // per_seq)


def _hints76(chip, context):
    fit = _fit(chip=chip, context=context)
    weights_gb = _m("llama3-8b").weight_bytes(2) / 1e9
    return [
        (lambda a: a == _fit("bf16", chip=chip, context=context),
         "that is a bf16 cache; int8 halves the bytes per token."),
        (lambda a: a == fit + 1,
         "one too many: round down (a partial sequence does not fit), and count 2 bytes for "
         "every parameter, the embedding table too: it is stored even if no matmul reads it."),
        (lambda a: a == _fit(with_weights=False, chip=chip, context=context),
         f"the bf16 weights take their {weights_gb:.0f} GB first."),
    ]


register(VariedNumericExercise(
    id="7.6", title="The batch that fits with an int8 cache", unit="sequences", integer=True,
    params={"chip": "gpu-h100", "context": 32768},
    choose={"chip": _GPUS, "context": (8192, 16384, 32768, 65536, 131072)},
    solve=lambda chip, context: _fit(chip=chip, context=context), hints_for=_hints76,
    valid=lambda chip, context: _fit(chip=chip, context=context) >= 1,
    describe=lambda chip, context: {"chip_name": _chip_name(chip)},
    statement="LLaMA-3 8B in bf16 is served on one {chip_name} with an int8 KV cache. The "
              "weights are all $N$ parameters (the exact count from `get_model`, embedding "
              "included) at 2 bytes; the HBM is the hardware table's capacity in bytes "
              "(decimal: 1 GB = 1e9 bytes, not GiB); nothing else takes memory (no "
              "activations). How many sequences of {context:,} tokens fit next to the "
              "weights? A whole number of sequences.",
))


# 7.7 -------------------------------------------------------------------------------------
def _v_star(topology="torus", n=16, chip="tpu-v5p", hop_us=2):
    return collectives.latency_bound_bytes("all-reduce", n, chip, hop_latency=hop_us * 1e-6,
                                           topology=topology)


def _hints77(n, chip, hop_us):
    def v(**kw):
        return _v_star(n=n, chip=chip, hop_us=hop_us, **kw)
    return [
        (lambda a: _close(a, v(topology="ring")),
         "2x too small: either a one-way ring (on a torus axis half the data goes each way, "
         "2 W_ici), or n - 1 latency steps instead of the all-reduce's 2 (n - 1)."),
        # 0.5%: at n = 16, 15/16 of the answer is 0.7% from GiB for GB (1/1.074)
        (lambda a: _close(a, v() * (n - 1) / n, 0.005),
         "the bandwidth term has (n - 1) / n and the latency term n - 1 steps: the n - 1 cancel, "
         "leaving 2 n W_ici t_hop."),
        (lambda a: _close(a, v() * 2),
         "2x too large: the all-reduce's 2 (n - 1) latency steps go with 2 (n - 1) / n of the "
         "bytes; the factors 2 cancel, but both must be there."),
        (lambda a: _close(a, v() * get_chip(chip).ici_links),
         "that uses all the chip's links; a ring over one torus axis uses one link each way."),
        (lambda a: _close(a, v() * 1e6) or _close(a, v() * 1e-6),
         f"check the units: bytes, with t_hop = {hop_us}e-6 s."),
    ]


register(VariedNumericExercise(
    id="7.7", title="When an all-reduce is latency-bound", unit="bytes", rtol=0.03,
    params={"n": 16, "chip": "tpu-v5p", "hop_us": 2},
    choose={"n": (4, 8, 16), "chip": _TPUS, "hop_us": (1, 2, 5)},
    solve=lambda n, chip, hop_us: _v_star(n=n, chip=chip, hop_us=hop_us),
    hints_for=_hints77, ring=lambda n, **_: n,
    describe=lambda n, chip, hop_us: {"chip_name": _chip_name(chip)},
    statement="An all-reduce runs over one torus axis of {n} {chip_name} chips (per-link "
              "bandwidth from the hardware table, bidirectional ring) with a per-hop latency "
              "of {hop_us} µs. Below what buffer size (bytes per device) does the latency "
              "term exceed the bandwidth term? Answer in bytes.",
))


# 7.8 -------------------------------------------------------------------------------------
# 8B at batch 8 over 16 v5p chips: the all-reduces' hop latency outweighs the weight read
# for any t_hop above ~0.16 µs (1.8x at 0.3 µs, 17x at 3 µs), so the answer does not hang
# on the assumed 1 µs. Leaving the latency out (bandwidth only) or counting L all-reduces
# instead of 2 L both give "memory": the hint names both.
_TP8 = dict(model="llama3-8b", chip="tpu-v5p", batch=8, n_tp=16)


def _tp_bound(hop=1e-6):
    return inf.tp_decode_times(**_TP8, hop_latency=hop).bound


register(ChoiceExercise(
    id="7.8", title="What bounds tensor-parallel decode?",
    choices=("memory", "compute", "communication"), reference=_tp_bound,
    hints={"memory": "the all-reduces' bytes are few, but each of the 2 L all-reduces (one "
                     "after attention, one after the MLP, in every layer) waits 2 (n - 1) = 30 "
                     "hops of 1 µs, whatever its size: add 2 L x 2 (n - 1) t_hop to B D s / (2 W_ici).",
           "compute": "at batch 8 the FLOPs, 2 N_mm B / (16 C), are tiny next to the bytes; "
                      "compare the weight read from 16 HBMs with the 2 L all-reduces."},
))


# 7.9 -------------------------------------------------------------------------------------
def _speedup(alpha=0.7, k=4, rho=0.1):
    return inf.speculative_gain(alpha, k, rho).speedup


def _hints79(alpha, gamma, rho):
    cost = 1 + gamma * rho
    gain = _speedup(alpha, gamma, rho) - 1
    return [
        (lambda a: _close(a, _speedup(alpha, gamma, rho=0.0)),
         "that is the tokens per step alone; each step also pays gamma draft steps of rho each."),
        (lambda a: _close(a, (1 - alpha ** gamma) / (1 - alpha) / cost),
         "the sum runs from alpha^0 to alpha^gamma: gamma + 1 terms (the target always adds one "
         "token of its own)."),
        (lambda a: _close(a, (gamma + 1) / cost),
         "that assumes every draft token is accepted (alpha = 1)."),
        (lambda a: _close(a, 1 / _speedup(alpha, gamma, rho)),
         "that is the ratio the other way round: the speed-up is the rate with speculation "
         "over the rate without."),
        (lambda a: _close(a, 100 * _speedup(alpha, gamma, rho)),
         "that is the speed-up as a percentage; give it as a ratio (198% is 1.98)."),
        (lambda a: _close(a, 100 * (_speedup(alpha, gamma, rho) - 1)),
         "that is how much faster, in percent; the speed-up is the ratio of the two "
         "rates (1 + that gain, as a fraction)."),
    ] + ([  # the gain, unless it is also half the speed-up (a speed-up near 2)
        (lambda a: _close(a, gain, 0.005),
         "that is the gain, the speed-up minus 1; give the ratio of the two rates."),
    ] if not _close(gain, (gain + 1) / 2, 0.05) else [])


register(VariedNumericExercise(
    id="7.9", title="Does speculation pay?", unit="ratio", rtol=0.02,
    params={"alpha": 0.7, "gamma": 4, "rho": 0.1},
    choose={"alpha": (0.5, 0.6, 0.7, 0.8, 0.9), "gamma": (2, 3, 4, 5, 6, 8),
            "rho": (0.02, 0.05, 0.1, 0.2)},
    solve=lambda alpha, gamma, rho: _speedup(alpha, gamma, rho), hints_for=_hints79,
    statement="A draft model costs $\\rho = {rho}$ of a target step, proposes "
              "$\\gamma = {gamma}$ tokens, and each is accepted with $\\alpha = {alpha}$. "
              "What is the speed-up over plain decoding (a ratio)?",
))


# 7.10 ------------------------------------------------------------------------------------
def _kvs_ref(n_kv_heads, batch, n_shards):
    s = inf.kv_cache_sharding(n_kv_heads, batch, n_shards)
    return (s.head_shards, s.batch_shards)


_CASES_10 = [(8, 36, 12), (8, 32, 4), (8, 32, 32), (4, 16, 8), (1, 8, 8), (8, 64, 16)]


def _gen10(rng):
    """A model's KV heads (1, 2, 4, 8 or 16), a mesh of 1 to 64 shards (powers of two, or
    one 3-, 6- or 12-way factor, where min() and gcd differ), and a batch that divides by
    the batch shards."""
    K = rng.choice((1, 2, 4, 8, 8, 16))
    n = rng.choice((1, 2, 4, 8, 16, 32, 64, 3, 6, 12, 24, 48))
    rest = n // math.gcd(K, n)
    return (K, rest * rng.choice((1, 2, 3, 4, 8, 16)), n)


def _min_split(K, n):
    """(min(K, n), the rest) with the rest divided exactly or rounded down: the split that
    takes min(heads, shards) instead of their gcd."""
    k = min(K, n)
    return [(k, n / k), (k, n // k)]


def _pair(got):
    if isinstance(got, (str, bytes)) or not hasattr(got, "__len__") or len(got) != 2:
        return None
    a, b = (as_number(x) for x in got)
    return None if a is None or b is None else (a, b)


register(CodeExercise(
    id="7.10", title="KV-cache sharding, in code", reference=_kvs_ref, cases=_CASES_10,
    compare=lambda got, want: _pair(got) == want,
    describe=lambda K, B, n: f"n_kv_heads={K}, batch={B}, n_shards={n}", generate=_gen10,
    hints=[
        (lambda got, want, args: _pair(got) in _min_split(args[0], args[2]),
         "min(n_kv_heads, n_shards) need not divide n_shards: 8 heads on 12 shards split 4 ways, "
         "the largest number that divides both (math.gcd)."),
        (lambda got, want, args: _pair(got) == (args[2], 1),
         "a KV head cannot be split: at most n_kv_heads ways over heads, the rest over the batch."),
        (lambda got, want, args: _pair(got) == (want[1], want[0]),
         "the order is (head_shards, batch_shards)."),
        (lambda got, want, args: _pair(got) is None, "return a pair (head_shards, batch_shards)."),
    ],
))


# 7.11 ------------------------------------------------------------------------------------
_CASES_11 = [(0.8, 4), (0.5, 1), (1.0, 5), (0.0, 3), (0.95, 10), (0.3, 7)]


def _gen11(rng):
    """alpha in [0, 1] (the ends now and then: 1 divides the closed form by zero), gamma
    from 1 to 12."""
    alpha = rng.choice((0.0, 1.0)) if rng.random() < 0.2 else round(rng.uniform(0, 1), 3)
    return (alpha, rng.randint(1, 12))

register(CodeExercise(
    id="7.11", title="Expected tokens per target step, in code",
    reference=inf.speculative_tokens_per_step, cases=_CASES_11, rtol=1e-9,
    unit="tokens",
    describe=lambda a, g: f"alpha={a}, gamma={g}", generate=_gen11,
    hints=[
        (lambda got, want, args: _close(as_number(got), want - 1, 1e-9),
         "one too few: the target always adds its own token, so the sum starts at alpha^0 = 1."),
        (lambda got, want, args: _close(as_number(got), want - args[0] ** args[1], 1e-9),
         "the sum runs to alpha^gamma (gamma + 1 terms)."),
        (lambda got, want, args: _close(as_number(got), args[0] ** args[1], 1e-9),
         "alpha^gamma is the chance that all gamma are accepted; sum the chances of each length."),
    ],
))


# 7.12 ------------------------------------------------------------------------------------
def _attend_ref(q, k_new, v_new, k_cache, v_cache, pos, mask=True, scale=True, at=None):
    import jax.numpy as jnp
    at = pos if at is None else at
    k_cache = k_cache.at[:, at].set(k_new)
    v_cache = v_cache.at[:, at].set(v_new)
    s = jnp.einsum("bh,bth->bt", q, k_cache)
    if scale:
        s = s / math.sqrt(q.shape[-1])
    if mask:
        s = jnp.where(jnp.arange(k_cache.shape[1])[None, :] <= pos, s, -jnp.inf)
    p = jnp.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    return jnp.einsum("bt,bth->bh", p, v_cache), k_cache, v_cache


def _attend_case(B, T, h, pos, seed):
    import jax.numpy as jnp
    rng = np.random.default_rng(seed)
    arr = [jnp.asarray(rng.normal(size=s).astype(np.float32))
           for s in [(B, h), (B, h), (B, h), (B, T, h), (B, T, h)]]
    return (*arr, pos)


def _draw12(rng):
    """A decode step of a random small shape, the new token anywhere in the cache (the
    first slot and the last included now and then)."""
    T = rng.randint(2, 24)
    pos = rng.choice([0, T - 1, rng.randrange(T)])
    return _attend_case(rng.randint(1, 5), T, rng.choice([2, 4, 8, 16]), pos,
                        rng.randrange(10**6))


_CASES_12 = [_attend_case(2, 8, 4, 3, 0), _attend_case(3, 16, 8, 0, 1),
             _attend_case(1, 5, 16, 4, 2), _attend_case(4, 12, 6, 7, 3)]


def _arrays_close(got, want, rtol=1e-4):
    if isinstance(got, (str, bytes)) or not isinstance(got, (tuple, list)) or len(got) != 3:
        return False
    try:
        return all(np.shape(g) == np.shape(w) and np.allclose(np.asarray(g), np.asarray(w),
                                                               rtol=rtol, atol=1e-5)
                   for g, w in zip(got, want))
    except Exception:
        return False


def _out_close(got, args, **kw):
    want = _attend_ref(*args, **kw)
    try:
        return np.allclose(np.asarray(got[0]), np.asarray(want[0]), rtol=1e-4, atol=1e-5)
    except Exception:
        return False


def _stale_out(got, args):
    """The output of attending to the caches as they were, before the new key and value
    were written (slots 0 .. pos, slot pos still holding the old entry)."""
    import jax.numpy as jnp
    q, _, _, k_cache, v_cache, pos = args
    s = jnp.einsum("bh,bth->bt", q, k_cache) / math.sqrt(q.shape[-1])
    s = jnp.where(jnp.arange(k_cache.shape[1])[None, :] <= pos, s, -jnp.inf)
    p = jnp.exp(s - s.max(-1, keepdims=True))
    want = jnp.einsum("bt,bth->bh", p / p.sum(-1, keepdims=True), v_cache)
    try:
        return np.allclose(np.asarray(got[0]), np.asarray(want), rtol=1e-4, atol=1e-5)
    except Exception:
        return False


def _slot_holds(got, args, slot):
    """Whether the returned key cache holds k_new at ``slot``."""
    try:
        return slot < args[3].shape[1] and np.allclose(np.asarray(got[1])[:, slot],
                                                       np.asarray(args[1]))
    except Exception:
        return False


register(CodeExercise(
    id="7.12", title="A decode step with a KV cache, in code", reference=_attend_ref,
    cases=_CASES_12, compare=_arrays_close, generate=_draw12,
    describe=lambda q, kn, vn, kc, vc, pos: f"B={q.shape[0]}, T={kc.shape[1]}, h={q.shape[1]}, "
                                            f"pos={pos}",
    hints=[
        (lambda got, want, args: _out_close(got, args, mask=False),
         "the query attended to every slot of the cache: mask the positions after pos "
         "(they hold garbage, or the future)."),
        (lambda got, want, args: _out_close(got, args, scale=False),
         "divide the scores q . k by sqrt(h) before the softmax."),
        (lambda got, want, args: _slot_holds(got, args, args[5] + 1)
         and _out_close(got, args, at=args[5] + 1),
         "the new key and value go to slot pos (positions count from 0), not pos + 1."),
        (lambda got, want, args: _slot_holds(got, args, args[5]) and _stale_out(got, args),
         "the query attended to the caches as they were: write k_new and v_new into slot pos "
         "first, so that the new token attends to itself."),
        (lambda got, want, args: _out_close(got, args) and not _arrays_close(got, want),
         "the output is right, but return the updated caches too: (out, k_cache, v_cache)."),
        (lambda got, want, args: not isinstance(got, (tuple, list)) or len(got) != 3,
         "return a tuple (out, k_cache, v_cache)."),
    ],
))


# 7.13 ------------------------------------------------------------------------------------
def _paged_ref(lengths, page_size):
    return inf.paged_kv_tokens(lengths, page_size, max(lengths)).paged


_CASES_13 = [([16, 32, 17, 1], 16), ([100, 200, 300], 64), ([7], 8), ([8, 8, 8], 8),
             ([4096, 1, 513], 256)]


def _gen13(rng):
    """1 to 6 sequences of 1 to 8,192 tokens, some an exact number of pages, on pages of 8 to
    256 tokens."""
    page = rng.choice((8, 16, 32, 64, 128, 256))
    lengths = [rng.randint(1, 64) * page if rng.random() < 0.3 else rng.randint(1, 8192)
               for _ in range(rng.randint(1, 6))]
    return (lengths, page)

register(CodeExercise(
    id="7.13", title="Paged cache slots, in code", reference=_paged_ref, cases=_CASES_13,
    compare=lambda got, want: as_number(got) == want,
    describe=lambda ls, p: f"lengths={ls}, page_size={p}", generate=_gen13,
    hints=[
        (lambda got, want, args: as_number(got) == sum(x // args[1] * args[1] for x in args[0]),
         "rounding down drops the last partial page: a sequence needs ceil(length / page) pages."),
        (lambda got, want, args: as_number(got) == sum((x // args[1] + 1) * args[1] for x in args[0]),
         "length // page + 1 pages is one page too many when the length is an exact multiple "
         "of the page: use ceil(length / page)."),
        (lambda got, want, args: as_number(got) == sum(math.ceil(x / args[1]) for x in args[0]),
         "that counts pages; the question asks for token slots (pages x page_size)."),
        (lambda got, want, args: as_number(got) == sum(args[0]),
         "that is the tokens used; pages are allocated whole."),
    ],
))


# 7.14 ------------------------------------------------------------------------------------
_B14, _T14, _N14, _A14, _RHO14 = 128, 1024, 8, 0.85, 0.03


def _t14(queries=1, kv_copies=1, free=False, bf16=False):
    """The per-kernel step of 70B (fp8 weights and compute, bf16 cache) on 8 H200:
    T_attn (the cache read once per sequence) + max(T_math, T_weights)."""
    from ..hardware import get_chip
    from ..models import get_model
    m, chip = get_model("llama3-70b"), get_chip("gpu-h200")
    N = m.matmul_params()
    t_attn = kv_copies * _B14 * _T14 * inf.kv_bytes_per_token(m) / (_N14 * chip.hbm_bandwidth)
    peak = chip.bf16_flops if bf16 else chip.fp8_flops
    t_math = 2 * N * _B14 * (1 if free else queries) / (_N14 * peak)
    return t_attn + max(t_math, N / (_N14 * chip.hbm_bandwidth))


def _ref14():
    return inf.mtp_speedup("llama3-70b", "gpu-h200", _B14, _T14, _A14, 1, n_chips=_N14,
                           weight_dtype="fp8", compute_dtype="fp8", rho=_RHO14).speedup


def _s14(tokens=1 + _A14, ratio=None, rho=_RHO14):
    ratio = _t14(2) / _t14() if ratio is None else ratio
    return tokens / (ratio + rho)


register(NumericExercise(
    id="7.14", title="Does multi-token prediction pay at batch 128?", unit="", rtol=0.015,
    reference=_ref14,
    hints=[
        (lambda a: _close(a, _s14(ratio=1.0), 0.005), "that takes the verification as free; "
         "256 tokens are past the critical batch of fp8 on H200 (about 206), so the matmuls "
         "of the verification step take longer than reading the weights."),
        (lambda a: _close(a, _s14(ratio=_t14(2, kv_copies=2) / _t14()), 0.01),
         "each sequence's cache is read once in the verification step: its 2 queries share "
         "it, so the attention time does not double."),
        (lambda a: _close(a, _s14(rho=0.0), 0.005), "add the MTP module's own pass: "
         "cost = t(2B) / t(B) + gamma rho."),
        (lambda a: _close(a, _s14(ratio=2.0), 0.01), "the verification costs 2 steps only "
         "when everything is compute-bound; here attention reads the cache once and only "
         "the matmuls' compute grows."),
        (lambda a: _close(a, _s14(tokens=2.0), 0.01), "the second token is kept only with "
         "probability alpha: 1 + alpha tokens per step on average, not 2."),
        (lambda a: _close(a, _s14(tokens=_A14), 0.01), "the target always adds a token of "
         "its own: 1 + alpha tokens per step, not alpha."),
        (lambda a: _close(a, _s14(ratio=_t14(2, bf16=True) / _t14(bf16=True)), 0.005),
         "the matmuls run in fp8: use the H200's fp8 peak, twice its bf16 one (the critical "
         "batch halves, so the verification's FLOPs cost less)."),
    ],
))


# 7.15 ------------------------------------------------------------------------------------
# A chunked-prefill step: 32 decodes at 8,192 tokens of cache plus a 512-token chunk of a
# prompt whose first 32,768 tokens are already in the cache (LLaMA-3 8B, bf16, one H100).
_B15, _T15, _S15, _P15 = 32, 8192, 512, 32768


def _mixed15(pairs=None, kv_tokens=None, tokens=None, matmul="roofline", attention=True):
    m, chip = _m("llama3-8b"), get_chip("gpu-h100")
    C, W = chip.bf16_flops, chip.hbm_bandwidth
    pairs = _B15 * _T15 + _S15 * (_P15 + (_S15 + 1) / 2) if pairs is None else pairs
    kv_tokens = _B15 * _T15 + _P15 + _S15 if kv_tokens is None else kv_tokens
    tokens = _B15 + _S15 if tokens is None else tokens
    t_attn = max(4 * m.n_layers * m.n_heads * m.head_dim * pairs / C,
                 kv_tokens * inf.kv_bytes_per_token(m) / W) if attention else 0.0
    t_flops, t_w = 2 * m.matmul_params() * tokens / C, 2 * m.matmul_params() / W
    return t_attn + {"roofline": max(t_flops, t_w), "weights": t_w}[matmul]


def _apart15():
    """A decode step and a separate pass for the chunk: the weights read twice."""
    return (inf.decode_step_time("llama3-8b", "gpu-h100", _B15, _T15).time
            + inf.mixed_step_time("llama3-8b", "gpu-h100", [], _S15, _P15).time)


register(NumericExercise(
    id="7.15", title="One step of chunked prefill", unit="seconds", rtol=0.03,
    reference=lambda: inf.mixed_step_time("llama3-8b", "gpu-h100", [_T15] * _B15, _S15,
                                          _P15).time,
    hints=[
        (lambda a: _close(a, _apart15()),
         "that is a decode step plus a separate pass for the chunk, each reading all the "
         "weights; in one pass the weights are read once for the 32 + 512 tokens."),
        (lambda a: _close(a, inf.mixed_step_time("llama3-8b", "gpu-h100", [_T15] * _B15,
                                                 _S15, _P15).lower),
         "that is the step's FLOPs over C, as if attention and the matmuls overlapped (or as "
         "if attention read no cache): they run one after the other, attention bound by the "
         "32 x 8,192 cached tokens it reads."),
        (lambda a: _close(a, _mixed15(pairs=_B15 * _T15 + _S15 * (_S15 + 1) / 2,
                                      kv_tokens=_B15 * _T15 + _S15)),
         "the chunk's queries also meet the 32,768 cached tokens of their own prompt: chunk "
         "token i attends to 32,768 + i + 1 keys, and that prefix is read from HBM."),
        (lambda a: _close(a, _mixed15(pairs=_B15 * _T15 + (_P15 + _S15) * (_P15 + _S15 + 1)
                                      / 2)),
         "far too large: that counts the whole prompt's S x S causal attention; only the "
         "512 new queries run in this step, each against the prefix and the chunk before it."),
        (lambda a: _close(a, _mixed15(matmul="weights")),
         "the matmuls see 32 + 512 = 544 tokens, above the critical batch of the H100: they "
         "take 2 N_mm x 544 / C, longer than reading the weights."),
        (lambda a: _close(a, _mixed15(attention=False)),
         "that is the matmuls alone; attention (the caches it reads) comes before them."),
    ],
))
