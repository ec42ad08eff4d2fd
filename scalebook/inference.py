"""Inference arithmetic (chapter 7): prefill and decode, the KV cache, step-time bounds,
sharding for serving, speculative decoding, and a small serving simulator.

Symbols (book/notation.md): B sequences decoded together (in decode every sequence adds
one token per step, so the batch of tokens equals the batch of sequences), S query positions
(prompt length in prefill), T context length (keys and values in the cache), L layers,
D model width, H and H_kv query and key/value heads, G = H / H_kv, h head size, N_mm the
parameters that take part in a matmul, s bytes per element, C peak FLOP/s and W_hbm HBM
bytes/s of one chip, n chips.

Every function takes a model name or :class:`~scalebook.models.TransformerConfig`, and a
chip name or :class:`~scalebook.hardware.Chip` (also a modified one, ``chip.with_(...)``).
Dtypes are short names: ``"f32"``, ``"bf16"``, ``"fp16"``, ``"fp8"``, ``"int8"``, ``"int4"``
(or any name of :data:`scalebook.units.DTYPE_BYTES`). The model here is the first-order one
of the chapter: perfect overlap inside a bound, no kernel overheads, weights read once per
step, activations ignored next to weights and cache.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from . import chip_internals as _ci
from . import collectives as _coll
from .hardware import get_chip
from .models import TransformerConfig, get_model
from .units import check_nonnegative, check_positive, check_positive_int, dtype_bytes, fmt_bytes

__all__ = [
    "DTYPES", "ATTENTION_KINDS", "bytes_per_element", "decode_critical_batch", "AttentionCost",
    "attention_cost", "kv_bytes_per_token", "kv_bytes_per_sequence", "PagedUse", "paged_kv_tokens",
    "BatchFit", "fit_batch", "check_fits", "StepTime", "decode_step_time", "prefill_time",
    "latency_throughput", "chips_to_fit", "TPTimes", "tp_decode_times", "ici_bound_tp_degree",
    "KVSharding", "kv_cache_sharding", "weight_stationary_comm_bytes", "SpeculativeGain",
    "speculative_tokens_per_step", "speculative_gain", "best_draft_length", "ServingStats",
    "simulate_serving", "mixed_step_time",
]

# Short dtype names of the chapter -> names of scalebook.units.DTYPE_BYTES.
DTYPES = {"f32": "f32", "bf16": "bf16", "fp16": "f16", "fp8": "f8e4m3fn", "int8": "s8",
          "int4": "s4", "fp4": "f4e2m1fn"}
ATTENTION_KINDS = ("mha", "gqa", "mqa")
_COMPUTE = ("bf16", "fp8", "int8")


def bytes_per_element(dtype, arg: str = "dtype") -> float:
    """Bytes of one element of ``dtype`` (``"bf16"`` -> 2, ``"int4"`` -> 0.5); an unknown
    name raises ValueError naming ``arg`` and listing the known names."""
    name = dtype.strip().lower() if isinstance(dtype, str) else dtype
    name = DTYPES.get(name, name)
    try:
        return dtype_bytes(name)
    except ValueError:
        raise ValueError(f"{arg}={dtype!r} is not a dtype the book knows; known: "
                         f"{', '.join(DTYPES)} (or any name in scalebook.units.DTYPE_BYTES)") from None


def _peak(chip, compute_dtype: str) -> float:
    key = compute_dtype.strip().lower() if isinstance(compute_dtype, str) else compute_dtype
    if key not in _COMPUTE:
        raise ValueError(f"compute_dtype={compute_dtype!r}: the chips' peaks are given for "
                         f"{', '.join(_COMPUTE)}")
    try:
        return chip.peak_flops(key)
    except ValueError as e:
        raise ValueError(f"compute_dtype={compute_dtype!r}: {e}") from None


def _model(model) -> TransformerConfig:
    return get_model(model)


# -- rooflines of inference ----------------------------------------------------------------
def decode_critical_batch(chip, weight_dtype: str = "bf16", compute_dtype: str = "bf16") -> float:
    """Batch B* above which a weight matmul X[B, D] @ W[D, F] of decode is compute-bound.

    For B << D, F the weights dominate the bytes: FLOPs 2 B D F, bytes about s_w D F, so the
    intensity is 2 B / s_w and the matmul is compute-bound when 2 B / s_w >= C / W_hbm:
    B* = C s_w / (2 W_hbm), with C the peak for ``compute_dtype``. int8 weights with bf16
    compute halve B*; int8 weights with int8 compute keep it (C doubles too).
    (:func:`scalebook.roofline.critical_batch` solves the exact equation with activations.)"""
    chip = get_chip(chip)
    sw = bytes_per_element(weight_dtype, "weight_dtype")
    _peak(chip, compute_dtype)                     # a clear error for an unknown dtype
    # chapter 2's streamed-weight batch, with the weights streamed from HBM
    return _ci.weight_stream_batch(chip, chip.hbm_bandwidth, sw,
                                   compute_dtype.strip().lower())


@dataclass(frozen=True)
class AttentionCost:
    """FLOPs and HBM bytes of attention for one sequence and one key/value head (its G query
    heads), and their ratio."""

    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def attention_cost(queries: int, context: int, group: int, head_dim: int,
                   bytes_per_element: float = 2, fused: bool = True) -> AttentionCost:
    """Attention of ``queries`` (S) positions against ``context`` (T) keys for one key/value
    head shared by ``group`` (G) query heads of size ``head_dim`` (h).

    FLOPs: 4 G S T h (scores q.k and the weighted sum of v, the full S x T block).
    ``fused=True`` (a flash-style kernel that keeps the scores on chip): bytes
    s (2 G S h + 2 T h): read q, k, v, write the output. Intensity 2 G S T / (s (G S + T)):
    prefill (S = T) about S G / (G + 1) for s = 2, decode (S = 1) about G.
    ``fused=False`` adds the G S x T score matrix written by the first matmul and read by
    the second, 2 s G S T bytes (chapter 4's ``layer_matmuls`` per head), which caps the
    intensity at 2 h / s (h for bf16) however long the sequence."""
    S = check_positive_int("queries", queries)
    T = check_positive_int("context", context)
    G = check_positive_int("group", group)
    h = check_positive_int("head_dim", head_dim)
    s = check_positive("bytes_per_element", bytes_per_element)
    if not isinstance(fused, bool):
        raise ValueError(f"fused must be True or False; got {fused!r}")
    flops = 4 * G * S * T * h
    nbytes = s * (2 * G * S * h + 2 * T * h) + (0 if fused else 2 * s * G * S * T)
    return AttentionCost(flops=flops, bytes=nbytes)


# -- the KV cache --------------------------------------------------------------------------
def _kv_heads(c: TransformerConfig, attention: str) -> int:
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}; got {attention!r}")
    return {"mha": c.n_heads, "gqa": c.n_kv_heads, "mqa": 1}[attention]


def _stored_layers(c: TransformerConfig, layers_per_kv) -> int:
    k = check_positive_int("layers_per_kv", layers_per_kv)
    if c.n_layers % k:
        raise ValueError(f"layers_per_kv={k} must divide the {c.n_layers} layers of {c.name}")
    return c.n_layers // k


def kv_bytes_per_token(model, attention: str = "gqa", dtype: str = "bf16",
                       layers_per_kv: int = 1) -> float:
    """KV-cache bytes one token adds: 2 (L / layers_per_kv) H_kv h s.

    ``attention``: "mha" caches all H heads, "gqa" the model's H_kv, "mqa" one.
    ``layers_per_kv``: layers that share one cached K/V (cross-layer sharing; 1 = none).
    ``dtype``: the cache's element type ("bf16", "fp8", "int8", ...)."""
    c = _model(model)
    K = _kv_heads(c, attention)
    s = bytes_per_element(dtype, "dtype")
    L = _stored_layers(c, layers_per_kv)
    v = 2 * L * K * c.head_dim * s
    return int(v) if float(v).is_integer() else v


def kv_bytes_per_sequence(model, context: int, attention: str = "gqa", dtype: str = "bf16",
                          layers_per_kv: int = 1, window: int | None = None,
                          local_layers: int = 0) -> float:
    """KV-cache bytes of one sequence of ``context`` tokens.

    ``local_layers`` of the (stored) layers use sliding-window attention over the last
    ``window`` tokens and keep only min(context, window) of them; the others keep all."""
    c = _model(model)
    T = check_positive_int("context", context)
    L = _stored_layers(c, layers_per_kv)
    per_layer = kv_bytes_per_token(c, attention, dtype, layers_per_kv) / L
    if isinstance(local_layers, bool) or not isinstance(local_layers, numbers.Integral) \
            or not 0 <= local_layers <= L:
        raise ValueError(f"local_layers must be an integer from 0 to {L}; got {local_layers!r}")
    if local_layers and window is None:
        raise ValueError("local_layers > 0 needs window= (tokens a local layer keeps)")
    W = T if window is None else min(T, check_positive_int("window", window))
    v = per_layer * ((L - local_layers) * T + local_layers * W)
    return int(v) if float(v).is_integer() else v


@dataclass(frozen=True)
class PagedUse:
    """Cache slots (in tokens) for a set of sequences: used holds real tokens; paged
    allocates whole pages; reserved gives every sequence max_context slots up front."""

    used: int
    paged: int
    reserved: int

    @property
    def paged_waste(self) -> float:
        return 1 - self.used / self.paged

    @property
    def reserved_waste(self) -> float:
        return 1 - self.used / self.reserved


def paged_kv_tokens(lengths, page_size: int, max_context: int) -> PagedUse:
    """Token slots that sequences of ``lengths`` occupy with pages of ``page_size`` tokens
    (sum of ceil(length / page) pages) against a contiguous allocation of ``max_context``
    per sequence."""
    P = check_positive_int("page_size", page_size)
    M = check_positive_int("max_context", max_context)
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise ValueError(f"lengths must be a list of sequence lengths; got {lengths!r}")
    ls = [check_positive_int("lengths (each)", x) for x in lengths]
    if not ls:
        raise ValueError("lengths must name at least one sequence")
    if max(ls) > M:
        raise ValueError(f"a sequence of {max(ls)} tokens is longer than max_context={M}")
    return PagedUse(used=sum(ls), paged=sum(math.ceil(x / P) * P for x in ls), reserved=M * len(ls))


# -- memory: what fits ---------------------------------------------------------------------
@dataclass(frozen=True)
class BatchFit:
    """How many sequences of ``context`` tokens fit next to the weights (bytes, all chips)."""

    max_batch: int
    hbm: float
    weights: float
    kv_per_sequence: float

    @property
    def free(self) -> float:
        return self.hbm - self.weights


def _hbm(chip, n_chips, hbm_fraction) -> float:
    n = check_positive_int("n_chips", n_chips)
    f = check_positive("hbm_fraction", hbm_fraction)
    if f > 1:
        raise ValueError(f"hbm_fraction is the share of HBM the server may use, at most 1; got {f}")
    return n * chip.hbm_bytes * f


def fit_batch(model, chip, n_chips: int, context: int, weight_dtype: str = "bf16",
              kv_dtype: str = "bf16", attention: str = "gqa", hbm_fraction: float = 1.0) -> BatchFit:
    """The largest batch of ``context``-token sequences whose KV cache fits in the HBM of
    ``n_chips`` after the weights: floor((n M_hbm f - N s_w) / KV bytes per sequence).
    Raises ValueError, saying by how much, when the weights alone do not fit."""
    c, chip = _model(model), get_chip(chip)
    c.check_context(context)
    hbm = _hbm(chip, n_chips, hbm_fraction)
    w = c.weight_bytes(bytes_per_element(weight_dtype, "weight_dtype"))
    if w > hbm:
        raise ValueError(f"the {weight_dtype} weights of {c.name} ({fmt_bytes(w)}) do not fit in "
                         f"the {fmt_bytes(hbm)} of HBM of {n_chips} x {chip.name}: "
                         f"{fmt_bytes(w - hbm)} short")
    per_seq = kv_bytes_per_sequence(c, context, attention, kv_dtype)
    return BatchFit(max_batch=int((hbm - w) // per_seq), hbm=hbm, weights=w, kv_per_sequence=per_seq)


def check_fits(model, chip, n_chips: int, batch: int, context: int, weight_dtype: str = "bf16",
               kv_dtype: str = "bf16", attention: str = "gqa", hbm_fraction: float = 1.0) -> float:
    """Bytes that weights plus the KV cache of ``batch`` x ``context`` tokens need; raises
    ValueError saying how many bytes are missing and what batch would fit."""
    B = check_positive_int("batch", batch)
    fit = fit_batch(model, chip, n_chips, context, weight_dtype, kv_dtype, attention, hbm_fraction)
    need = fit.weights + B * fit.kv_per_sequence
    if need > fit.hbm:
        raise ValueError(f"a batch of {B} sequences of {context} tokens needs {fmt_bytes(need)} "
                         f"({fmt_bytes(fit.weights)} weights + {fmt_bytes(B * fit.kv_per_sequence)}"
                         f" KV cache): {fmt_bytes(need - fit.hbm)} more than the "
                         f"{fmt_bytes(fit.hbm)} of HBM; at most {fit.max_batch} fit")
    return need


# -- step times ----------------------------------------------------------------------------
@dataclass(frozen=True)
class StepTime:
    """One prefill or decode step on n chips: FLOPs, HBM bytes (weights and KV cache), the
    times of its two kinds of kernel, and the tokens it produces (decode) or processes
    (prefill).

    The kernels run one after the other, each at its own bound: attention (its FLOPs, and
    the KV cache it reads or writes) takes ``t_attn`` = max(attention FLOPs / nC, KV bytes
    / nW_hbm), the weight matmuls ``t_mm`` = max(matmul FLOPs / nC, weight bytes / nW_hbm),
    and the step ``time`` = t_attn + t_mm (the model of the chapter and the planner).
    ``lower`` = max(t_math, t_mem) pretends the two overlap perfectly: an optimistic bound,
    never above ``time``, equal to it when both kernels are bound by the same resource
    (memory-bound decode, compute-bound prefill). ``upper`` = t_math + t_mem."""

    batch: int
    tokens: int
    flops: float
    weight_bytes: float
    kv_bytes: float
    t_math: float
    t_mem: float
    attn_flops: float = 0.0
    peak: float = math.nan           # C x n: FLOP/s of all chips
    bandwidth: float = math.nan      # W_hbm x n: bytes/s of all chips

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes

    @property
    def matmul_flops(self) -> float:
        return self.flops - self.attn_flops

    @property
    def t_attn(self) -> float:
        """Attention: max(attention FLOPs / nC, KV-cache bytes / nW_hbm)."""
        return max(self.attn_flops / self.peak, self.kv_bytes / self.bandwidth)

    @property
    def t_mm(self) -> float:
        """The weight matmuls: max(2 N_mm B / nC, N_mm s_w / nW_hbm)."""
        return max(self.matmul_flops / self.peak, self.weight_bytes / self.bandwidth)

    @property
    def time(self) -> float:
        """The step: t_attn + t_mm (attention and the matmuls run one after the other)."""
        return self.t_attn + self.t_mm

    @property
    def lower(self) -> float:
        """max(t_math, t_mem): all kernels overlapped perfectly (optimistic)."""
        return max(self.t_math, self.t_mem)

    @property
    def upper(self) -> float:
        return self.t_math + self.t_mem

    @property
    def compute_time(self) -> float:
        """The part of ``time`` spent in compute-bound kernels."""
        return ((self.attn_flops / self.peak
                 if self.attn_flops / self.peak >= self.kv_bytes / self.bandwidth else 0.0)
                + (self.matmul_flops / self.peak
                   if self.matmul_flops / self.peak >= self.weight_bytes / self.bandwidth
                   else 0.0))

    @property
    def bound(self) -> str:
        """"compute" when compute-bound kernels take at least half of ``time``, else
        "memory"."""
        return "compute" if 2 * self.compute_time >= self.time else "memory"

    @property
    def throughput(self) -> float:
        """Tokens per second at ``time`` (all chips together)."""
        return self.tokens / self.time


def _contexts(context, batch: int) -> list[int]:
    if isinstance(context, numbers.Integral) and not isinstance(context, bool):
        return [check_positive_int("context", context)] * batch
    if isinstance(context, (str, bytes)) or not hasattr(context, "__iter__"):
        raise ValueError(f"context must be a positive integer or one length per sequence; "
                         f"got {context!r}")
    ls = [check_positive_int("context (each)", x) for x in context]
    if len(ls) != batch:
        raise ValueError(f"context gives {len(ls)} lengths for a batch of {batch}")
    return ls


def decode_step_time(model, chip, batch: int, context, n_chips: int = 1,
                     weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                     compute_dtype: str = "bf16", attention: str = "gqa",
                     check_memory: bool = True) -> StepTime:
    """One decode step: every one of ``batch`` sequences adds a token.

    FLOPs = 2 N_mm B + 4 L H h sum(T) (weights, then attention over each sequence's T keys).
    Bytes = N_mm s_w (every weight read once) + sum(T) x KV bytes per token.
    t_math = FLOPs / (n C), t_mem = bytes / (n W_hbm): the weights and the cache are
    split evenly over ``n_chips`` and communication is left out (see :func:`tp_decode_times`).
    The step takes ``time`` = t_attn + t_mm (:class:`StepTime`); ``lower`` is the
    optimistic max(t_math, t_mem).
    ``context`` is one T for all, or a list of T per sequence. With ``check_memory`` a batch
    that does not fit raises ValueError (:func:`check_fits`)."""
    c, chip = _model(model), get_chip(chip)
    B = check_positive_int("batch", batch)
    n = check_positive_int("n_chips", n_chips)
    Ts = _contexts(context, B)
    c.check_context(max(Ts))
    if check_memory:
        check_fits(c, chip, n, B, max(Ts), weight_dtype, kv_dtype, attention)
    sw = bytes_per_element(weight_dtype, "weight_dtype")
    peak = _peak(chip, compute_dtype)
    total_T = sum(Ts)
    attn = 4 * c.n_layers * c.n_heads * c.head_dim * total_T
    flops = 2 * c.matmul_params() * B + attn
    wb = c.matmul_params() * sw
    kvb = total_T * kv_bytes_per_token(c, attention, kv_dtype)
    return _step(B, B, flops, wb, kvb, attn, n * peak, n * chip.hbm_bandwidth)


def _step(batch, tokens, flops, wb, kvb, attn, C, W) -> StepTime:
    return StepTime(batch=batch, tokens=tokens, flops=flops, weight_bytes=wb, kv_bytes=kvb,
                    t_math=flops / C, t_mem=(wb + kvb) / W, attn_flops=attn, peak=C,
                    bandwidth=W)


def prefill_time(model, chip, batch: int, seq_len: int, n_chips: int = 1,
                 weight_dtype: str = "bf16", kv_dtype: str = "bf16", compute_dtype: str = "bf16",
                 attention: str = "gqa", causal: bool = True, check_memory: bool = True) -> StepTime:
    """Prefill of ``batch`` prompts of ``seq_len`` tokens (the time to the first token).

    FLOPs = B S (2 N_mm + attention per token at S, half the S x S block when ``causal``,
    a kernel that skips masked blocks). Bytes = N_mm s_w + the KV cache it writes,
    B S x KV bytes per token. Usually compute-bound: B S is far above the critical batch."""
    c, chip = _model(model), get_chip(chip)
    B = check_positive_int("batch", batch)
    S = c.check_context(seq_len, "seq_len")
    n = check_positive_int("n_chips", n_chips)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False; got {causal!r}")
    if check_memory:
        check_fits(c, chip, n, B, S, weight_dtype, kv_dtype, attention)
    sw = bytes_per_element(weight_dtype, "weight_dtype")
    peak = _peak(chip, compute_dtype)
    attn = B * S * c.attention_flops_per_token(S, causal=causal)
    flops = B * S * c.dense_flops_per_token() + attn
    wb = c.matmul_params() * sw
    kvb = B * S * kv_bytes_per_token(c, attention, kv_dtype)
    return _step(B, B * S, flops, wb, kvb, attn, n * peak, n * chip.hbm_bandwidth)


def latency_throughput(model, chip, n_chips: int, context: int, batches=None, **kw) -> list:
    """Decode step times for a range of batches (default: powers of two up to what fits):
    the points of the latency-throughput curve (``t.lower`` against ``t.throughput``)."""
    c, chip = _model(model), get_chip(chip)
    fit = fit_batch(c, chip, n_chips, context, kw.get("weight_dtype", "bf16"),
                    kw.get("kv_dtype", "bf16"), kw.get("attention", "gqa"))
    if fit.max_batch < 1:
        raise ValueError(f"no sequence of {context} tokens fits next to the weights on "
                         f"{n_chips} x {chip.name}")
    if batches is None:
        batches = [2 ** i for i in range(int(math.log2(fit.max_batch)) + 1)]
        if batches[-1] != fit.max_batch:
            batches.append(fit.max_batch)
    return [decode_step_time(c, chip, b, context, n_chips, **kw) for b in batches]


def chips_to_fit(model, chip, weight_dtype: str = "bf16", weight_share: float = 0.5) -> int:
    """Smallest power of two n with the weights at most ``weight_share`` of n chips' HBM
    (the rest is left for the KV cache)."""
    c, chip = _model(model), get_chip(chip)
    f = check_positive("weight_share", weight_share)
    if f > 1:
        raise ValueError(f"weight_share must be at most 1; got {f}")
    w = c.weight_bytes(bytes_per_element(weight_dtype, "weight_dtype"))
    n = 1
    while w > f * n * chip.hbm_bytes:
        n *= 2
    return n


# -- sharding for serving ------------------------------------------------------------------
@dataclass(frozen=True)
class TPTimes:
    """A decode step with 1D tensor (model) parallelism over n chips: time to read each
    chip's share of the weights and cache, to compute, the per-kernel step of the two
    (``t_kernels``: attention, then the matmuls, :class:`StepTime`), and the 2 L
    all-reduces, which sit between the kernels on the critical path: ``time`` = t_kernels +
    t_comm (``lower``: the all-reduces hidden behind the kernels, max of the two)."""

    n: int
    t_mem: float
    t_math: float
    t_comm: float
    t_kernels: float = math.nan

    @property
    def time(self) -> float:
        return self.t_kernels + self.t_comm

    @property
    def bound(self) -> str:
        """The largest part of ``time``: the all-reduces, or the kernels, memory- or
        compute-bound."""
        kernels = "memory" if self.t_mem >= self.t_math else "compute"
        return "communication" if self.t_comm > self.t_kernels else kernels

    @property
    def lower(self) -> float:
        """max(t_kernels, t_comm): the all-reduces hidden behind the kernels."""
        return max(self.t_kernels, self.t_comm)


def tp_decode_times(model, chip, batch: int, n_tp: int, context: int = 0,
                    weight_dtype: str = "bf16", act_dtype: str = "bf16",
                    hop_latency: float = 0.0, topology: str | None = None,
                    kv_dtype: str = "bf16", check_memory: bool = True) -> TPTimes:
    """Decode with the weights split n_tp ways (Megatron-style: heads and the MLP width),
    on one axis of the chip's network (``topology`` as in
    :func:`scalebook.collectives.collective_time`: a TPU's torus, a GPU node's switch).

    Each layer all-reduces its [B, D] activations twice (after W_o and after W_down):
    t_comm = 2 L x collective_time("all-reduce", B D s_a, n_tp, hop_latency). Memory:
    (N_mm s_w + B T KV bytes per token) / (n_tp W_hbm) with the cache in ``kv_dtype``;
    compute 2 N_mm B / (n_tp C). With ``check_memory`` a batch whose weights and cache do
    not fit the n_tp chips raises ValueError (:func:`check_fits`)."""
    c, chip = _model(model), get_chip(chip)
    B = check_positive_int("batch", batch)
    n = check_positive_int("n_tp", n_tp)
    T = check_nonnegative("context", context)
    sw = bytes_per_element(weight_dtype, "weight_dtype")
    sa = bytes_per_element(act_dtype, "act_dtype")
    if check_memory and T >= 1:
        check_fits(c, chip, n, B, math.ceil(T), weight_dtype, kv_dtype)
    kv = B * T * kv_bytes_per_token(c, "gqa", kv_dtype)
    C, W = n * chip.bf16_flops, n * chip.hbm_bandwidth
    mm, wb = 2 * c.matmul_params() * B, c.matmul_params() * sw
    t_kernels = kv / W + max(mm / C, wb / W)
    ar = _coll.collective_time("all-reduce", B * c.d_model * sa, n, chip,
                               topology=topology, hop_latency=hop_latency)
    return TPTimes(n=n, t_mem=(wb + kv) / W, t_math=mm / C, t_comm=2 * c.n_layers * ar,
                   t_kernels=t_kernels)


def ici_bound_tp_degree(model, chip, batch: int, weight_dtype: str = "bf16",
                        act_dtype: str = "bf16") -> float:
    """The tensor-parallel degree n* above which the all-reduces (bandwidth only, one torus
    axis) take longer than reading the weights (no KV cache).

    2 L x 2 (n-1)/n B D s_a / (2 W_ici) = N_mm s_w / (n W_hbm) gives
    n* = 1 + (N_mm s_w / (2 L B D s_a)) x (W_ici / W_hbm): the weight bytes per layer per
    byte of activations, times the ICI/HBM bandwidth ratio."""
    c, chip = _model(model), get_chip(chip)
    B = check_positive_int("batch", batch)
    sw = bytes_per_element(weight_dtype, "weight_dtype")
    sa = bytes_per_element(act_dtype, "act_dtype")
    return 1 + (c.matmul_params() * sw / (2 * c.n_layers * B * c.d_model * sa)) * (
        chip.ici_link_bandwidth / chip.hbm_bandwidth)


@dataclass(frozen=True)
class KVSharding:
    """How a KV cache [B, T, H_kv, h] is cut over n shards: head_shards ways over key/value
    heads and batch_shards ways over sequences (head_shards x batch_shards = n)."""

    head_shards: int
    batch_shards: int

    @property
    def fraction_per_shard(self) -> float:
        """The share of the whole cache each shard holds: 1 / n (no copies)."""
        return 1 / (self.head_shards * self.batch_shards)


def kv_cache_sharding(n_kv_heads: int, batch: int, n_shards: int) -> KVSharding:
    """Split over heads as far as they go (gcd(H_kv, n) ways), the rest over the batch.

    With n > H_kv a head cannot be split without splitting the attention arithmetic, and
    copying heads would store the cache n / H_kv times; splitting the batch keeps one copy.
    Raises ValueError when the batch does not divide by the batch shards."""
    K = check_positive_int("n_kv_heads", n_kv_heads)
    B = check_positive_int("batch", batch)
    n = check_positive_int("n_shards", n_shards)
    heads = math.gcd(K, n)
    rest = n // heads
    if B % rest:
        raise ValueError(f"{n} shards over {K} key/value heads leave {rest}-way batch "
                         f"sharding, and batch {B} does not divide by {rest}: use a batch that "
                         f"is a multiple of {rest}")
    return KVSharding(head_shards=heads, batch_shards=rest)


def weight_stationary_comm_bytes(layout: str, batch: int, d_model: int, d_ff: int, mesh,
                                 bytes_per_element: float = 2) -> float:
    """Bytes each chip sends (ring algorithms) for one MLP block in decode, weights fixed.

    ``"1d"`` (``mesh`` = n): W_in[D, F_n], W_out[F_n, D]; one all-reduce of the [B, D]
    output: 2 (n-1)/n B D s, the same for any n.
    ``"2d"`` (``mesh`` = (X, Y)): W_in[D_X, F_Y], W_out[F_Y, D_X]; the [B, F/Y] partial sums
    are reduce-scattered over X and all-gathered back over X, the [B, D/X] output
    all-reduced over Y: 2 (X-1)/X B F s / Y + 2 (Y-1)/Y B D s / X, which falls like
    1/sqrt(n) when X/Y is near D/F (Pope et al., arXiv:2211.05102, section 3)."""
    B = check_positive_int("batch", batch)
    D = check_positive_int("d_model", d_model)
    F = check_positive_int("d_ff", d_ff)
    s = check_positive("bytes_per_element", bytes_per_element)
    if layout == "1d":
        n = check_positive_int("mesh (chips of the 1d layout)", mesh)
        return _coll.ring_bytes("all-reduce", B * D * s, n)
    if layout == "2d":
        if not (isinstance(mesh, (tuple, list)) and len(mesh) == 2):
            raise ValueError(f"the 2d layout needs mesh=(X, Y); got {mesh!r}")
        X = check_positive_int("mesh X", mesh[0])
        Y = check_positive_int("mesh Y", mesh[1])
        if F % Y or D % X:
            raise ValueError(f"d_ff={F} must divide by Y={Y} and d_model={D} by X={X}")
        h = B * F * s / Y
        return (_coll.ring_bytes("reduce-scatter", h, X) + _coll.ring_bytes("all-gather", h, X)
                + _coll.ring_bytes("all-reduce", B * D * s / X, Y))
    raise ValueError(f"layout must be '1d' or '2d'; got {layout!r}")


# -- speculative decoding ------------------------------------------------------------------
def _alpha(alpha) -> float:
    a = check_nonnegative("alpha (acceptance rate)", alpha)
    if a > 1:
        raise ValueError(f"alpha (acceptance rate) is a probability, from 0 to 1; got {alpha!r}")
    return a


def speculative_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens per target step with ``k`` draft tokens, each accepted with
    probability ``alpha`` given the ones before it: 1 + alpha + ... + alpha^k =
    (1 - alpha^(k+1)) / (1 - alpha) (Leviathan et al., arXiv:2211.17192, section 3)."""
    a = _alpha(alpha)
    k = check_positive_int("k (draft tokens per step)", k)
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


@dataclass(frozen=True)
class SpeculativeGain:
    """Speculative decoding against plain decoding of the target: tokens per step, the cost
    of a step in target steps (k draft steps of cost c each, plus one verification), and
    their ratio, the speed-up (> 1: it pays)."""

    tokens_per_step: float
    cost_per_step: float

    @property
    def speedup(self) -> float:
        return self.tokens_per_step / self.cost_per_step


def speculative_gain(alpha: float, k: int, cost_ratio: float) -> SpeculativeGain:
    """Speed-up of greedy speculative decoding: tokens_per_step / (k c + 1), c = time of a
    draft step / time of a target step. The verification of k + 1 tokens is taken to cost
    one target step, true while decode is memory-bound (k + 1 tokens per sequence stay far
    below the critical batch)."""
    cst = check_nonnegative("cost_ratio (draft step / target step)", cost_ratio)
    k = check_positive_int("k (draft tokens per step)", k)
    return SpeculativeGain(speculative_tokens_per_step(alpha, k), k * cst + 1)


def best_draft_length(alpha: float, cost_ratio: float, k_max: int = 16) -> int:
    """The k from 1 to ``k_max`` with the largest speed-up."""
    k_max = check_positive_int("k_max", k_max)
    return max(range(1, k_max + 1), key=lambda k: speculative_gain(alpha, k, cost_ratio).speedup)


# -- a serving simulator -------------------------------------------------------------------
@dataclass(frozen=True)
class ServingStats:
    """Results of :func:`simulate_serving`: seconds, tokens/s, and per-request arrays.

    ``tpot`` lists the requests with more than one output token; ``request_tpot`` has one
    entry per request, in arrival order (nan where a request made a single token)."""

    policy: str
    rate: float
    throughput: float          # generated tokens / s over the whole run
    ttft: tuple                # time to first token of each request (s)
    tpot: tuple                # time per output token after the first (s)
    latency: tuple             # arrival to last token (s)
    mean_batch: float          # sequences per decode step, on average
    duration: float
    offered_rate: float = float("nan")   # the arrivals' realised rate, requests/s
    request_tpot: tuple = ()   # TPOT of every request, nan for a single output token
    preemptions: int = 0       # running requests sent back to the queue (paged KV only)
    kv_pages: int = 0          # pages of the KV budget (paged KV only)

    def percentile(self, what: str, q: float) -> float:
        """A percentile (0-100) of "ttft", "tpot" or "latency"."""
        if what not in ("ttft", "tpot", "latency"):
            raise ValueError(f"what must be 'ttft', 'tpot' or 'latency'; got {what!r}")
        q = check_nonnegative("q (percentile)", q)
        if q > 100:
            raise ValueError(f"q is a percentile, from 0 to 100; got {q}")
        return float(np.percentile(getattr(self, what), q))

    def _meets(self, ttft_slo, tpot_slo) -> np.ndarray:
        a = check_positive("ttft_slo (seconds)", ttft_slo)
        b = check_positive("tpot_slo (seconds)", tpot_slo)
        if len(self.request_tpot) != len(self.ttft):
            raise ValueError("these stats have no per-request TPOT (request_tpot); "
                             "run simulate_serving again")
        tp = np.asarray(self.request_tpot, dtype=float)
        return (np.asarray(self.ttft) <= a) & (np.isnan(tp) | (tp <= b))

    def slo_attainment(self, ttft_slo: float, tpot_slo: float) -> float:
        """Share of requests with TTFT <= ``ttft_slo`` and TPOT <= ``tpot_slo`` (seconds);
        a request of one output token has no TPOT and meets that part."""
        return float(self._meets(ttft_slo, tpot_slo).mean())

    def goodput(self, ttft_slo: float, tpot_slo: float) -> float:
        """Requests/s that meet both SLOs: their count over the run's ``duration`` (Zhong et
        al., DistServe, arXiv:2401.09670, rate requests by the SLOs they meet; they call
        goodput the highest arrival rate at which a target share of requests meets
        them)."""
        return float(self._meets(ttft_slo, tpot_slo).sum()) / self.duration


def _lengths(name, value, n, rng) -> np.ndarray:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return np.full(n, check_positive_int(name, value))
    if isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = (check_positive_int(name, v) for v in value)
        if lo > hi:
            raise ValueError(f"{name}=(low, high) needs low <= high; got {value!r}")
        return rng.integers(lo, hi + 1, size=n)
    raise ValueError(f"{name} must be a positive integer or a (low, high) range; got {value!r}")


def _count(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0; got {value!r}")
    return int(value)


def mixed_step_time(model, chip, decode_context, chunk: int, chunk_prefix: int = 0,
                    n_chips: int = 1, weight_dtype: str = "bf16", kv_dtype: str = "bf16",
                    compute_dtype: str = "bf16", attention: str = "gqa",
                    check_memory: bool = True) -> StepTime:
    """One step of chunked prefill (Agrawal et al., Sarathi-Serve, arXiv:2403.02369): the
    decode tokens of the running sequences, whose caches hold ``decode_context`` tokens (a
    list, one T per sequence; empty for none), and ``chunk`` prompt tokens of one request
    whose first ``chunk_prefix`` tokens are already in the cache, in ONE pass.

    The matmuls see every token once and read the weights once:
    max(2 N_mm (B + S_chunk) / nC, N_mm s_w / nW_hbm). Attention: each decode token meets
    its T keys; chunk token i (0-based) meets T_pre + i + 1, so the chunk does
    S_chunk (T_pre + (S_chunk + 1) / 2) query-key pairs at 4 L H h FLOPs each; the bytes are
    the decodes' caches plus the chunk's prefix read and its own keys and values written,
    (sum(T) + T_pre + S_chunk) x KV bytes per token. ``time`` = t_attn + t_mm as in
    :class:`StepTime`. With no chunk it is :func:`decode_step_time`; with no decodes and
    no prefix, :func:`prefill_time` of one prompt of ``chunk`` tokens."""
    c, chip = _model(model), get_chip(chip)
    n = check_positive_int("n_chips", n_chips)
    if isinstance(decode_context, (str, bytes)) or not hasattr(decode_context, "__iter__"):
        raise ValueError(f"decode_context must be a list of context lengths, one per decoding "
                         f"sequence (empty for none); got {decode_context!r}")
    Ts = [check_positive_int("decode_context (each)", x) for x in decode_context]
    S = _count("chunk (prompt tokens in the step)", chunk)
    T0 = _count("chunk_prefix (tokens of the prompt already cached)", chunk_prefix)
    if not Ts and not S:
        raise ValueError("the step has nothing to do: give decode_context or a chunk > 0")
    if T0 and not S:
        raise ValueError(f"chunk_prefix={T0} without a chunk: give chunk > 0")
    c.check_context(max(Ts + [T0 + S]))
    sw = bytes_per_element(weight_dtype, "weight_dtype")
    kv_tok = kv_bytes_per_token(c, attention, kv_dtype)
    kv_tokens = sum(Ts) + (T0 + S if S else 0)
    if check_memory:
        hbm = _hbm(chip, n, 1.0)
        need = c.weight_bytes(sw) + kv_tokens * kv_tok
        if need > hbm:
            raise ValueError(f"the step's weights and {kv_tokens:,} tokens of cache need "
                             f"{fmt_bytes(need)}: {fmt_bytes(need - hbm)} more than the "
                             f"{fmt_bytes(hbm)} of HBM of {n} x {chip.name}")
    peak = _peak(chip, compute_dtype)
    attn = 4 * c.n_layers * c.n_heads * c.head_dim * (sum(Ts) + S * (T0 + (S + 1) / 2))
    flops = 2 * c.matmul_params() * (len(Ts) + S) + attn
    wb = c.matmul_params() * sw
    return _step(len(Ts) + (1 if S else 0), len(Ts) + S, flops, wb, kv_tokens * kv_tok, attn,
                 n * peak, n * chip.hbm_bandwidth)


def _tp_all_reduces(c, chip, n: int, on, hop_latency):
    """tokens -> seconds of a step's 2 L tensor-parallel all-reduces over n chips (0 when
    ``on`` is False or n = 1)."""
    if not isinstance(on, bool):
        raise ValueError(f"all_reduces must be True or False; got {on!r}")
    t_hop = check_nonnegative("hop_latency", hop_latency)
    if not on or n == 1:
        return lambda tokens: 0.0
    from .serving import slice_axes          # serving imports this module
    node = chip.ici_domain_chips or 8
    if _coll.is_switched(chip) and n > node:
        raise ValueError(f"all_reduces=True models tensor parallelism inside one "
                         f"{node}-GPU node; n_chips={n} spans several")
    axes = slice_axes(chip, n)

    def comm(tokens):
        return 2 * c.n_layers * _coll.collective_time(
            "all-reduce", tokens * c.d_model * 2, axes, chip, hop_latency=t_hop)
    return comm


def simulate_serving(model, chip, n_chips: int, rate: float, n_requests: int = 200,
                     prompt_len=512, output_len=128, max_batch: int | None = None,
                     policy: str = "continuous", seed: int = 0, weight_dtype: str = "bf16",
                     kv_dtype: str = "bf16", prefill_chunk: int | None = None,
                     page_size: int | None = None, hbm_fraction: float = 1.0,
                     all_reduces: bool = False,
                     hop_latency: float = _coll.ASSUMED_HOP_LATENCY) -> ServingStats:
    """Serve ``n_requests`` arriving as a Poisson process of ``rate`` requests/s, each with
    a prompt and an output length (fixed or uniform in a (low, high) range), costing every
    step with this chapter's model (``StepTime.time``: attention, then the matmuls).

    ``policy="continuous"``: at every step, waiting requests join (first come, first
    served) while there is room; ``policy="static"``: a new batch starts only when the
    previous one has finished every request.

    Prefill. ``prefill_chunk=None``: the prompts that join are prefilled in one step of
    their own (the running decodes wait for it), then one decode step for all.
    ``prefill_chunk=k`` (chunked prefill, Sarathi-Serve, arXiv:2403.02369): every step
    carries the decode tokens of the running batch plus up to k prompt tokens of the
    requests being prefilled, oldest first, costed as one pass
    (:func:`mixed_step_time`); a request makes its first token in the step that finishes
    its prompt and decodes from the next.

    Room. ``page_size=None``: at most ``max_batch`` requests run at once; it defaults to
    what fits at the longest prompt + output (:func:`fit_batch`). ``page_size=p``
    (tokens; paged KV, as vLLM, Kwon et al., arXiv:2309.06180): the KV budget,
    ``hbm_fraction`` of the HBM minus the weights, is cut into pages of p tokens. A request
    joins when the pages for its prompt and its first token, ceil((prompt + 1) / p), are
    free after the running sequences have taken the pages they grow into this step; a
    sequence takes a new page when its cache crosses a page boundary, and all its pages
    come back when it finishes. When a running sequence needs a page and none is free,
    the newest running request is preempted: its pages are freed and it goes back to the
    front of the queue, to be prefilled again, prompt and the tokens made so far
    (recompute, vLLM's default). ``max_batch`` is then an optional cap on running
    requests (none by default).

    ``all_reduces=True``: the weights are split by 1D tensor parallelism over the
    ``n_chips`` (a TPU slice's torus, or one GPU node), and every step adds, after its
    kernels, the 2 L all-reduces of its tokens' [tokens, D] bf16 activations
    (:func:`scalebook.collectives.collective_time`, ``hop_latency`` per ring step), as the
    serving planner's steps do."""
    c, chip = _model(model), get_chip(chip)
    n_chips = check_positive_int("n_chips", n_chips)
    lam = check_positive("rate (requests/s)", rate)
    n_req = check_positive_int("n_requests", n_requests)
    if policy not in ("continuous", "static"):
        raise ValueError(f"policy must be 'continuous' or 'static'; got {policy!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an integer; got {seed!r}")
    chunk = None if prefill_chunk is None else check_positive_int(
        "prefill_chunk (prompt tokens per step)", prefill_chunk)
    page = None if page_size is None else check_positive_int("page_size (tokens)", page_size)
    rng = np.random.default_rng(seed)
    prompts = _lengths("prompt_len", prompt_len, n_req, rng)
    outputs = _lengths("output_len", output_len, n_req, rng)
    longest = int((prompts + outputs).max())
    fit = fit_batch(c, chip, n_chips, longest, weight_dtype, kv_dtype,
                    hbm_fraction=hbm_fraction)
    kv_tok = kv_bytes_per_token(c, "gqa", kv_dtype)
    n_pages = 0
    if page is None:
        if max_batch is None:
            max_batch = fit.max_batch
        max_batch = check_positive_int("max_batch", max_batch)
        if max_batch > fit.max_batch:
            raise ValueError(f"max_batch={max_batch} sequences of up to {longest} tokens do "
                             f"not fit: at most {fit.max_batch} do on {n_chips} x {chip.name}")
    else:
        max_batch = n_req if max_batch is None else check_positive_int("max_batch", max_batch)
        n_pages = int(fit.free // (page * kv_tok))
        worst = int(np.ceil((prompts + outputs) / page).max())
        if worst > n_pages:
            raise ValueError(f"a request of {longest} tokens needs {worst} pages of {page} "
                             f"tokens; the KV budget ({fmt_bytes(fit.free)} after the weights)"
                             f" holds {n_pages}")
    arrivals = np.cumsum(rng.exponential(1 / lam, size=n_req))
    # The step costs of decode_step_time, prefill_time and mixed_step_time, with their
    # constants taken out of the loop (the tests check that they agree).
    sw = bytes_per_element(weight_dtype, "weight_dtype")
    C, W = n_chips * chip.bf16_flops, n_chips * chip.hbm_bandwidth
    w_flops, w_bytes = 2 * c.matmul_params(), c.matmul_params() * sw
    attn = 4 * c.n_layers * c.n_heads * c.head_dim

    comm = _tp_all_reduces(c, chip, n_chips, all_reduces, hop_latency)

    def prefill_cost(lengths):
        a = sum(S * c.attention_flops_per_token(int(S), causal=True) for S in lengths)
        return (max(a / C, kv_tok * sum(lengths) / W)
                + max(w_flops * sum(lengths) / C, w_bytes / W) + comm(sum(lengths)))

    def decode_cost(B, total_T):
        return (max(attn * total_T / C, kv_tok * total_T / W)
                + max(w_flops * B / C, w_bytes / W) + comm(B))

    def mixed_cost(B, total_T, pieces):
        # pieces: (prefix, tokens) of each prompt chunk in the step
        pairs = total_T + sum(k * (p0 + (k + 1) / 2) for p0, k in pieces)
        kv = total_T + sum(p0 + k for p0, k in pieces)
        tokens = B + sum(k for _, k in pieces)
        return (max(attn * pairs / C, kv_tok * kv / W) + max(w_flops * tokens / C, w_bytes / W)
                + comm(tokens))

    first = np.zeros(n_req)
    finish = np.zeros(n_req)
    made = np.zeros(n_req, dtype=int)
    ctx0 = np.zeros(n_req, dtype=int)      # tokens to prefill when admitted
    todo = np.zeros(n_req, dtype=int)      # of those, not yet prefilled (chunked)
    held = np.zeros(n_req, dtype=int)      # pages held (paged)
    state = {"free": n_pages, "preempted": 0, "done": 0}
    t, nxt, waiting, running = 0.0, 0, [], []
    batch_sizes = []

    def pages(tokens):
        return -(-int(tokens) // page)

    def release(r):
        state["free"] += held[r]
        held[r] = 0

    def preempt(r):
        release(r)
        running.remove(r)
        waiting.insert(0, r)
        state["preempted"] += 1

    def grow():
        # every decoding sequence takes the pages its next token needs, oldest first;
        # where none is free, the newest running request gives its pages back
        i = 0
        while i < len(running):
            r = running[i]
            if todo[r]:
                i += 1
                continue
            need = pages(prompts[r] + made[r]) - held[r]
            while need > state["free"] and running[-1] != r:
                preempt(running[-1])
            if need > state["free"]:
                preempt(r)
                break
            state["free"] -= need
            held[r] += need
            i += 1

    def made_one(r, now):
        # r made a token at time now; returns True while it still runs
        if made[r] == 0:
            first[r] = now
        made[r] += 1
        if made[r] == outputs[r]:
            finish[r] = now
            state["done"] += 1
            if page is not None:
                release(r)
            return False
        return True

    while state["done"] < n_req:
        while nxt < n_req and arrivals[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if not running and not waiting:
            t = float(arrivals[nxt])
            continue
        if page is not None:
            grow()
        admit = []
        if policy == "continuous" or not running:
            while waiting and len(running) + len(admit) < max_batch:
                r = waiting[0]
                ctx = prompts[r] + made[r]      # a preempted request prefills again
                if page is not None:
                    need = pages(ctx + 1)
                    if need > state["free"]:
                        break
                    state["free"] -= need
                    held[r] = need
                waiting.pop(0)
                ctx0[r] = todo[r] = ctx
                admit.append(r)
        if chunk is None:
            if admit:
                # one prefill step for all who join: the weights are read once
                t += prefill_cost([int(ctx0[r]) for r in admit])
                for r in admit:
                    todo[r] = 0
                    if made_one(r, t):
                        running.append(r)
            if running:
                t += decode_cost(len(running), int(sum(prompts[r] + made[r] for r in running)))
                batch_sizes.append(len(running))
                running[:] = [r for r in running if made_one(r, t)]
            continue
        running.extend(admit)
        decoding = [r for r in running if not todo[r]]
        pieces, budget = [], chunk
        for r in running:
            if budget and todo[r]:
                k = int(min(todo[r], budget))
                pieces.append((r, int(ctx0[r] - todo[r]), k))
                budget -= k
        t += mixed_cost(len(decoding), int(sum(prompts[r] + made[r] for r in decoding)),
                        [(p0, k) for _, p0, k in pieces])
        if decoding:
            batch_sizes.append(len(decoding))
        gone = {r for r in decoding if not made_one(r, t)}
        for r, _, k in pieces:
            todo[r] -= k
            if not todo[r] and not made_one(r, t):
                gone.add(r)
        running[:] = [r for r in running if r not in gone]
    tpot_all = np.array([(finish[r] - first[r]) / (outputs[r] - 1) if outputs[r] > 1
                         else np.nan for r in range(n_req)])
    duration = float(finish.max() - arrivals[0])
    return ServingStats(policy=policy, rate=lam, throughput=float(outputs.sum()) / duration,
                        ttft=tuple(first - arrivals),
                        tpot=tuple(float(x) for x in tpot_all[outputs > 1]),
                        latency=tuple(finish - arrivals),
                        mean_batch=float(np.mean(batch_sizes)) if batch_sizes else 0.0,
                        duration=duration,
                        offered_rate=(float((n_req - 1) / (arrivals[-1] - arrivals[0]))
                                      if n_req > 1 else lam),
                        request_tpot=tuple(float(x) for x in tpot_all),
                        preemptions=state["preempted"], kv_pages=n_pages)


# -- serving a mixture of experts (chapter 8, section 8.9) ---------------------------------
# and multi-token prediction, a speculation without a draft model (chapter 7, section 7.6).
# Kept apart from the step-time functions above: these take a MoEConfig (or a dense model)
# and use the per-kernel step, T_attn + max(T_math, T_weights) + T_a2a.
from .models import MoEConfig as _MoEConfig  # noqa: E402

__all__ += ["expected_experts", "busiest_experts", "MoEStep", "moe_decode_step",
            "moe_critical_batch",
            "MTPGain", "mtp_module_params", "mtp_speedup", "mtp_break_even_batch",
            "MoEPrefill", "moe_prefill"]


def expected_experts(n_experts: int, top_k: int, tokens: float) -> float:
    """Expected number of distinct routed experts that ``tokens`` (B) tokens reach in one
    MoE layer, each token sent to ``top_k`` (k) of ``n_experts`` (E): E (1 - (1 - k/E)^B).

    Assumes uniform, independent routing: each token's k experts are a uniformly random
    set, so a given expert is missed by one token with probability 1 - k/E and by all B
    with (1 - k/E)^B. B = 1 gives k; B -> infinity gives E. Real routers are not uniform
    (popular experts are hit more often), so fewer distinct experts are reached: this is an
    upper bound on the weights a step reads for a given batch."""
    E = check_positive_int("n_experts", n_experts)
    k = check_positive_int("top_k", top_k)
    if k > E:
        raise ValueError(f"top_k={k} experts per token is more than n_experts={E}")
    B = check_nonnegative("tokens", tokens)
    return E * (1 - (1 - k / E) ** B)


def busiest_experts(n_experts: int, top_k: int, tokens: float, n_ep: int) -> float:
    """Expected routed experts of one MoE layer that the busiest of ``n_ep`` chips reads,
    each chip holding m = E / n_ep of them, when ``tokens`` tokens are routed uniformly.

    The step waits for the slowest chip, so this, not E_B / n_ep, sets the time to read
    the experts. Each expert is taken to be hit independently with probability q = E_B / E
    (:func:`expected_experts`), so a chip's count is Binomial(m, q) and the busiest of
    n_ep is E[max] = sum over x = 1..m of 1 - F(x - 1)^n_ep, F the binomial CDF. (The hits
    are not quite independent, a token's k experts being distinct; with one expert a chip
    the busiest chip reads exactly 1 from the first token, which is returned as such.)
    n_ep = 1 gives E_B; many tokens give m."""
    n = check_positive_int("n_ep", n_ep)
    E = check_positive_int("n_experts", n_experts)
    if E % n:
        raise ValueError(f"n_ep={n} must divide the {E} experts")
    e_b = expected_experts(E, top_k, tokens)
    m, q = E // n, e_b / E
    if n == 1:
        return e_b
    if m == 1:                  # one expert a chip: some chip reads one as soon as a token runs
        return 1.0 if tokens > 0 else 0.0
    total, cdf = 0.0, 0.0
    for x in range(m):                   # P(X <= x), then 1 - P(X <= x)^n for x + 1
        cdf += math.comb(m, x) * q ** x * (1 - q) ** (m - x)
        total += 1 - min(cdf, 1.0) ** n
    return total


def _busiest_slots(m: int, q: float, n: int, tokens: float) -> float:
    """E[max] over n chips of Binomial(m, q) expert slots hit (as :func:`busiest_experts`)."""
    if m == 1:
        return 1.0 if tokens > 0 else 0.0
    total, cdf = 0.0, 0.0
    for x in range(m):
        cdf += math.comb(m, x) * q ** x * (1 - q) ** (m - x)
        total += 1 - min(cdf, 1.0) ** n
    return total


def _tp_ar_time(chip, nbytes: float, n: int, hop_latency: float = 0.0) -> float:
    """One all-reduce of ``nbytes`` per chip over the n chips of a tensor-parallel group:
    within one fast domain :func:`scalebook.collectives.collective_time`. A GPU group over
    several nodes runs it hierarchically, pipelined: reduce-scatter and all-gather in each
    node over NVLink, and the node's 1 / node of the bytes all-reduced between the nodes
    on each GPU's own NIC (``dcn_bandwidth``), the slower of the two setting the pace;
    ``hop_latency`` for each of its 2 (node - 1) + 2 (nodes - 1) steps."""
    if n == 1:
        return 0.0
    domain = chip.ici_domain_chips
    if not _coll.is_switched(chip) or domain is None or n <= domain:
        return _coll.collective_time("all-reduce", nbytes, n, chip, hop_latency=hop_latency)
    # chapter 11's hierarchical all-reduce, pipelined
    return _coll.hierarchical_time("all-reduce", nbytes, domain, n // domain, chip,
                                   pipelined=True, hop_latency=hop_latency)


@dataclass(frozen=True)
class MoEStep:
    """One decode step of ``batch`` sequences, ``queries`` tokens each (1 for plain decode,
    gamma + 1 to verify gamma speculated tokens), on ``n_chips`` chips: r = n / n_ep copies
    of an expert-parallel group of ``n_ep`` chips, each copy serving batch / r sequences.

    ``experts_read``: routed experts per MoE layer one group reads (E_B; 0 for a dense
    model). ``flops``: weight-matmul FLOPs, ``attn_flops``: attention FLOPs, both over all
    chips. ``weight_bytes``: weight bytes read by all groups together; ``kv_bytes``: the
    cache read. ``experts_busiest``: routed experts per MoE layer the busiest chip of a
    group reads (:func:`busiest_experts`). Times in seconds: ``t_attn`` the attention
    kernels, ``t_math`` and ``t_weights`` the weight matmuls' compute and the busiest chip's
    weight reading, ``t_a2a`` the dispatch and combine all-to-alls of every MoE layer,
    ``t_ar`` the all-reduces of the tensor-parallel other weights; ``t_comm`` = t_a2a + t_ar.

    ``time`` = t_attn + max(t_math, t_weights) + t_comm: attention (bound by reading the
    cache), the weight matmuls and the collectives run one after the other; with
    ``overlap_a2a`` (two micro-batches that take turns, one computing while the other
    communicates) it is max(t_attn + max(t_math, t_weights), t_comm). ``optimistic`` = max
    of t_attn, t_math, t_weights and t_comm: perfect overlap, a bound that is never larger
    than ``time``."""

    model: str
    batch: int
    queries: int
    n_chips: int
    n_ep: int
    experts_read: float
    flops: float
    attn_flops: float
    weight_bytes: float
    kv_bytes: float
    t_attn: float
    t_math: float
    t_weights: float
    t_a2a: float
    t_ar: float = 0.0               # the tensor-parallel all-reduces of the other weights
    experts_busiest: float = math.nan

    overlap_a2a: bool = False

    @property
    def t_comm(self) -> float:
        """The step's collectives: the all-to-alls and the all-reduces."""
        return self.t_a2a + self.t_ar

    @property
    def time(self) -> float:
        kernels = self.t_attn + max(self.t_math, self.t_weights)
        return max(kernels, self.t_comm) if self.overlap_a2a else kernels + self.t_comm

    @property
    def optimistic(self) -> float:
        return max(self.t_attn, self.t_math, self.t_weights, self.t_comm)

    @property
    def tokens(self) -> int:
        return self.batch * self.queries

    @property
    def bound(self) -> str:
        """What bounds the weight matmuls: "compute" or "memory"."""
        return "compute" if self.t_math >= self.t_weights else "memory"

    @property
    def weight_bytes_per_token(self) -> float:
        return self.weight_bytes / self.tokens

    @property
    def tokens_per_s(self) -> float:
        """Tokens per second of the whole slice (one per sequence per step in decode)."""
        return self.tokens / self.time


@dataclass(frozen=True)
class _Parts:
    """Parameter counts a decode step needs, for a dense model or an MoE."""

    name: str
    base: TransformerConfig
    n_experts: int       # 1 for a dense model
    top_k: int           # 1 for a dense model
    moe_layers: int      # 0 for a dense model
    expert: int          # parameters of one routed expert (its gated MLP)
    n_shared: int        # shared experts per MoE layer (0 for a dense model)
    fixed: int           # matmul parameters every token meets: all but the routed experts
    active: int          # matmul parameters one token meets (2 x this = FLOPs per token)
    total: int           # every parameter (memory)


def _parts(model) -> _Parts:
    if isinstance(model, _MoEConfig):
        c = model.dense
        N_e = c.mlp_params_per_layer()
        active = model.active_matmul_params()
        return _Parts(model.name, c, model.n_experts, model.top_k, model.moe_layers, N_e,
                      model.n_shared, active - model.moe_layers * model.top_k * N_e, active,
                      model.total_params())
    try:
        c = get_model(model)
    except Exception:
        raise ValueError(f"model must be a MoEConfig (e.g. scalebook.models.MIXTRAL_8X7B) or "
                         f"a dense model (a name or TransformerConfig); got {model!r}") from None
    mm = c.matmul_params()
    return _Parts(c.name, c, 1, 1, 0, 0, 0, mm, mm, c.num_params())


def _groups(p: _Parts, n_chips, n_ep, batch, redundant: int = 0) -> tuple[int, int, int]:
    """(n, n_ep, r): the chips, the expert-parallel group and its copies, checked (the
    group holds E + ``redundant`` expert slots)."""
    n = check_positive_int("n_chips", n_chips)
    B = check_positive_int("batch", batch)
    if n_ep is None:
        n_ep = n
    n_ep = check_positive_int("n_ep", n_ep)
    if p.moe_layers == 0 and n_ep != n:
        raise ValueError(f"{p.name} is a dense model: it has no experts to split; leave n_ep "
                         f"unset (its weights are split over all {n} chips)")
    if n % n_ep:
        raise ValueError(f"n_ep={n_ep} must divide n_chips={n}: the chips are n / n_ep copies "
                         f"of one expert-parallel group")
    if p.moe_layers and redundant and (p.n_experts + redundant) % n_ep:
        raise ValueError(f"n_ep={n_ep} must divide the {p.n_experts} experts and "
                         f"{redundant} redundant copies of {p.name} "
                         f"({p.n_experts + redundant} slots, the same number on each chip)")
    if p.moe_layers and not redundant and p.n_experts % n_ep:
        raise ValueError(f"n_ep={n_ep} must divide the {p.n_experts} experts of {p.name} "
                         f"(each chip of the group holds E / n_ep = {p.n_experts / n_ep:.3g} "
                         f"experts); try one of "
                         f"{[d for d in range(1, p.n_experts + 1) if p.n_experts % d == 0]}")
    r = n // n_ep
    if B % r:
        raise ValueError(f"batch={B} does not split over the {r} copies of the {n_ep}-chip "
                         f"group (n_chips={n}, n_ep={n_ep}): use a multiple of {r}")
    return n, n_ep, r


def _a2a_time(chip, nbytes: float, n_ep: int, hop_latency: float = 0.0, top_k: int = 1,
              max_nodes: int | None = None) -> float:
    """One all-to-all in which each of ``n_ep`` chips holds ``nbytes`` of routed copies
    (``top_k`` copies of each of its tokens).

    Within one fast domain (a TPU slice's torus axis, a GPU node's NVSwitch):
    :func:`scalebook.collectives.collective_time`. A GPU group over several nodes:
    :func:`scalebook.collectives.expert_all_to_all`, the one model the training planner
    uses too: every copy on its own (``max_nodes=None``), the (local - 1) / n_ep of the
    bytes meant for the other GPUs of the node over NVLink, then the (n_ep - local) / n_ep
    meant for other nodes on the GPU's own NIC; or node-limited (``max_nodes``), each token
    crossing once per node it reaches while NVLink forwards its copies, the two at once.
    Each part waits ``hop_latency`` once."""
    domain = chip.ici_domain_chips
    if not _coll.is_switched(chip) or domain is None or n_ep <= domain:
        return _coll.collective_time("all-to-all", nbytes, n_ep, chip, hop_latency=hop_latency)
    if chip.dcn_bandwidth is None:
        raise ValueError(f"an expert group of {n_ep} {chip.name} GPUs spans several nodes of "
                         f"{domain}, and the chip has no dcn_bandwidth: give one with "
                         f"chip.with_(dcn_bandwidth=...)")
    return _coll.expert_all_to_all(nbytes, top_k, domain, n_ep, chip, max_nodes=max_nodes,
                                   hop_latency=hop_latency).seconds


def _moe_step(p: _Parts, chip, batch, context, n_chips, n_ep, weight_dtype, kv_dtype,
              compute_dtype, act_dtype, queries, kv_per_token, hbm_fraction, check_memory,
              overlap_a2a=False, layers: int | None = None, all_reduces=None,
              hop_latency: float = _coll.ASSUMED_HOP_LATENCY, attn_tp: int | None = None,
              redundant_experts: int = 0, dispatch_dtype: str | None = None,
              attention_flops_per_key: float | None = None,
              max_nodes: int | None = None) -> MoEStep:
    chip = get_chip(chip)
    if max_nodes is not None:
        max_nodes = check_positive_int("max_nodes", max_nodes)
    if isinstance(redundant_experts, bool) or not isinstance(redundant_experts, int) \
            or redundant_experts < 0:
        raise ValueError(f"redundant_experts must be an integer >= 0; got "
                         f"{redundant_experts!r}")
    R = redundant_experts if p.moe_layers else 0
    if redundant_experts and not p.moe_layers:
        raise ValueError(f"{p.name} is a dense model: it has no experts to copy; leave "
                         f"redundant_experts at 0")
    n, n_ep, r = _groups(p, n_chips, n_ep, batch, R)
    a_tp = n_ep if attn_tp is None else check_positive_int("attn_tp", attn_tp)
    if n_ep % a_tp:
        raise ValueError(f"attn_tp={a_tp} must divide n_ep={n_ep}: the group's chips are "
                         f"n_ep / attn_tp data-parallel copies of the attention and the "
                         f"other non-expert weights")
    dp_attn = n_ep // a_tp
    B = batch
    T = check_positive_int("context", context)
    q = check_positive_int("queries (tokens per sequence in the step)", queries)
    sw = bytes_per_element(weight_dtype, "weight_dtype")
    sa = bytes_per_element(act_dtype, "act_dtype")
    sd = sa if dispatch_dtype is None else bytes_per_element(dispatch_dtype, "dispatch_dtype")
    peak = _peak(chip, compute_dtype)
    if not isinstance(overlap_a2a, bool):
        raise ValueError(f"overlap_a2a must be True or False; got {overlap_a2a!r}")
    t_hop = check_nonnegative("hop_latency", hop_latency)
    c = p.base
    L = c.n_layers if layers is None else layers
    if kv_per_token is None:
        kv_tok = kv_bytes_per_token(c, "gqa", kv_dtype) * L / c.n_layers
    else:
        kv_tok = check_positive("kv_bytes_per_token", kv_per_token)
    if check_memory:
        f = check_positive("hbm_fraction", hbm_fraction)
        if f > 1:
            raise ValueError(f"hbm_fraction is the share of HBM the server may use, at most 1; "
                             f"got {f}")
        routed = p.moe_layers * p.n_experts * p.expert
        w_chip = ((p.total - routed) / a_tp
                  + p.moe_layers * (p.n_experts + R) / n_ep * p.expert) * sw
        kv_chip = B * T * kv_tok / n
        if w_chip + kv_chip > f * chip.hbm_bytes:
            raise ValueError(
                f"{p.name} on {n} x {chip.name} (n_ep={n_ep}): {fmt_bytes(w_chip)} of "
                f"{weight_dtype} weights and {fmt_bytes(kv_chip)} of cache per chip "
                f"({B} sequences of {T} tokens) exceed {fmt_bytes(f * chip.hbm_bytes)} of "
                f"HBM by {fmt_bytes(w_chip + kv_chip - f * chip.hbm_bytes)}")
    tokens_group = B * q / r
    E_B = (expected_experts(p.n_experts, p.top_k, tokens_group) if p.moe_layers else 0.0)
    group_bytes = (p.fixed * dp_attn + p.moe_layers * E_B * p.expert) * sw
    flops = 2 * p.active * B * q
    if attention_flops_per_key is None:
        attn_flops = 4 * L * c.n_heads * c.head_dim * T * B * q
    else:
        attn_flops = (L * check_positive("attention_flops_per_key", attention_flops_per_key)
                      * T * B * q)
    kv_bytes = B * T * kv_tok
    t_a2a = 0.0
    if p.moe_layers and n_ep > 1:
        per_chip = tokens_group / n_ep * p.top_k * c.d_model     # elements per chip
        one = dict(hop_latency=t_hop, top_k=p.top_k, max_nodes=max_nodes)
        t_a2a = p.moe_layers * (_a2a_time(chip, per_chip * sd, n_ep, **one)     # dispatch
                                + _a2a_time(chip, per_chip * sa, n_ep, **one))  # combine
    if n_ep > 1 and _coll.is_switched(chip) and chip.ici_domain_chips \
            and n_ep > chip.ici_domain_chips and chip.dcn_bandwidth is None:
        raise ValueError(f"a group of {n_ep} {chip.name} GPUs spans several nodes and the "
                         f"chip has no dcn_bandwidth: give one with chip.with_(...)")
    # the other weights are split n_ep ways: each layer all-reduces the [B_g, D] outputs of
    # its attention and of its dense or shared MLP
    if all_reduces is None:
        all_reduces = p.moe_layers > 0
    if not isinstance(all_reduces, bool):
        raise ValueError(f"all_reduces must be True, False or None; got {all_reduces!r}")
    t_ar = (2 * L * _tp_ar_time(chip, tokens_group / dp_attn * c.d_model * sa, a_tp, t_hop)
            if all_reduces else 0.0)
    # the busiest chip of the group reads its share of the fixed weights and its experts
    if not p.moe_layers:
        M = 0.0
    elif R:
        M = _busiest_slots((p.n_experts + R) // n_ep,
                           expected_experts(p.n_experts, p.top_k, tokens_group) / p.n_experts,
                           n_ep, tokens_group)
    else:
        M = busiest_experts(p.n_experts, p.top_k, tokens_group, n_ep)
    busiest_bytes = (p.fixed / a_tp + p.moe_layers * M * p.expert) * sw
    return MoEStep(model=p.name, batch=B, queries=q, n_chips=n, n_ep=n_ep, experts_read=E_B,
                   flops=flops, attn_flops=attn_flops, weight_bytes=r * group_bytes,
                   kv_bytes=kv_bytes,
                   t_attn=max(attn_flops / (n * chip.bf16_flops),
                              kv_bytes / (n * chip.hbm_bandwidth)),
                   t_math=flops / (n * peak),
                   t_weights=busiest_bytes / chip.hbm_bandwidth, t_a2a=t_a2a, t_ar=t_ar,
                   experts_busiest=M, overlap_a2a=overlap_a2a)


def moe_decode_step(model, chip, batch: int, context: int, n_chips: int = 1,
                    n_ep: int | None = None, weight_dtype: str = "bf16",
                    kv_dtype: str = "bf16", compute_dtype: str = "bf16",
                    act_dtype: str = "bf16", queries: int = 1,
                    kv_bytes_per_token: float | None = None, hbm_fraction: float = 1.0,
                    check_memory: bool = True, overlap_a2a: bool = False,
                    all_reduces: bool | None = None,
                    hop_latency: float = _coll.ASSUMED_HOP_LATENCY,
                    attn_tp: int | None = None, redundant_experts: int = 0,
                    dispatch_dtype: str | None = None,
                    attention_flops_per_key: float | None = None,
                    max_nodes: int | None = None) -> MoEStep:
    """One decode step of a mixture of experts (a :class:`~scalebook.models.MoEConfig`,
    e.g. ``MIXTRAL_8X7B`` or ``DEEPSEEK_V3``) or of a dense model, ``batch`` (B) sequences
    at ``context`` (T) tokens each, ``queries`` new tokens per sequence (1 in decode).

    Layout: the ``n_chips`` (n) chips are r = n / ``n_ep`` copies of an expert-parallel
    group of n_ep chips (default n_ep = n, one group). A group holds every expert, E / n_ep
    per chip, and splits the other weights (attention, dense layers, shared experts, router,
    head) n_ep ways by tensor parallelism; it serves B / r sequences, the cache split
    evenly.

    Per step, with B_g = B q / r tokens per group and uniform routing
    (:func:`expected_experts`):

    * weight bytes a group reads: s_w (N_fixed + L_moe E_B N_e), with E_B = E (1 - (1 -
      k/E)^B_g) routed experts per MoE layer, N_e = 3 D F the parameters of one, N_fixed
      the matmul parameters every token meets (all but the routed experts); the busiest
      chip reads s_w (N_fixed / n_ep + L_moe M N_e), M from :func:`busiest_experts`, and
      T_weights = that / W_hbm;
    * FLOPs of the weight matmuls 2 N_active B q (N_active: ``active_matmul_params``),
      T_math = that / (n C);
    * attention: reads the cache, B T x KV bytes per token, and does 4 L H h T B q FLOPs
      (in bf16, whatever the weights); T_attn = max(FLOPs / (n C_bf16), bytes / (n W_hbm));
    * all-to-all: per MoE layer a dispatch and a combine, each chip sending its B_g / n_ep
      tokens' k copies of [D], the dispatch at ``dispatch_dtype`` (default ``act_dtype``;
      DeepSeek dispatches in fp8) and the combine at ``act_dtype``: T_a2a = L_moe x (one
      dispatch + one combine all-to-all)
      (``_a2a_time``: within a node ``collective_time``, across GPU nodes NVLink then
      the NIC, every copy on its own; with ``max_nodes``, node-limited routing as the
      training planner's ``Routing(max_nodes=...)``: a token crosses the network once per
      node it reaches, at most max_nodes, and NVLink forwards its copies at the same time,
      :func:`scalebook.collectives.expert_all_to_all`). DeepSeek's decode sends each copy
      on its own by RDMA (DeepEP's low-latency kernels), its prefill node-limited;
    * all-reduce: each layer sums the [B_g, D] outputs of its attention and of its dense
      or shared MLP over the group, T_ar = 2 L x one all-reduce (``_tp_ar_time``).

    The collectives wait ``hop_latency`` per step (default
    ``collectives.ASSUMED_HOP_LATENCY``, as the serving planner; 0 for bandwidth only).

    Step = T_attn + max(T_math, T_weights) + T_a2a + T_ar (nothing overlaps across
    kernels), or with ``overlap_a2a`` max(T_attn + max(T_math, T_weights), T_a2a + T_ar)
    (two micro-batches taking turns, as DeepSeek's decoding does).
    ``kv_bytes_per_token`` overrides the cache per token (e.g. DeepSeek's latent cache,
    576 L s bytes, where the GQA stand-in of ``DEEPSEEK_V3`` stores more), and
    ``attention_flops_per_key`` the attention's FLOPs per key, layer and query token
    (default 4 H h; MLA absorbed: ``MLAConfig.flops_per_key()``, 2 H (2 d_c + d_r)). With
    ``check_memory`` the weights (E / n_ep experts and 1 / n_ep of the rest per chip) and
    1 / n of the cache must fit in ``hbm_fraction`` of each chip's HBM. ``all_reduces``:
    count T_ar (None: for a mixture of experts, whose group splits the other weights; not
    for a dense model, whose step is then chapter 7's :func:`decode_step_time`, which
    leaves communication out).

    DeepSeek-V3's own layout (chapter 12): ``attn_tp`` splits the attention and the other
    non-expert weights only attn_tp ways, in n_ep / attn_tp data-parallel copies within
    the group (each chip reads 1 / attn_tp of them, and the all-reduces run over attn_tp
    chips on the [B_g attn_tp / n_ep, D] outputs of one copy); default attn_tp = n_ep,
    the layout above. ``redundant_experts`` (R) adds copies of busy experts, so the group
    holds E + R expert slots, (E + R) / n_ep per chip (n_ep must divide E + R), each
    slot hit with probability E_B / E (one slot a chip: the busiest reads one expert)."""
    p = _parts(model)
    return _moe_step(p, chip, batch, context, n_chips, n_ep, weight_dtype, kv_dtype,
                     compute_dtype, act_dtype, queries, kv_bytes_per_token, hbm_fraction,
                     check_memory, overlap_a2a, all_reduces=all_reduces,
                     hop_latency=hop_latency, attn_tp=attn_tp,
                     redundant_experts=redundant_experts, dispatch_dtype=dispatch_dtype,
                     attention_flops_per_key=attention_flops_per_key, max_nodes=max_nodes)


def moe_critical_batch(model, chip, n_chips: int = 1, n_ep: int | None = None,
                       weight_dtype: str = "bf16", compute_dtype: str = "bf16") -> float:
    """The batch (sequences, one token each) above which the weight matmuls of a decode
    step are compute-bound: T_math = T_weights of :func:`moe_decode_step`, i.e.
    2 N_active B / (n C) = s_w (N_fixed + L_moe E_B N_e) / (n_ep W_hbm), solved for B (a
    real number; T_math grows linearly, T_weights less than linearly, so there is one
    crossing). For a dense model B* = C s_w / (2 W_hbm). For an MoE at large batch every
    expert is read, and the routed experts alone need B k / E tokens per expert above B*:
    B = B* E / k; the whole model, whose attention and shared parts are dense, sits between
    B* and B* E / k, near B* N_total / N_active."""
    p = _parts(model)
    chip = get_chip(chip)
    n = check_positive_int("n_chips", n_chips)
    n, n_ep, r = _groups(p, n, n_ep, n)        # the checks, with a batch that splits
    sw = bytes_per_element(weight_dtype, "weight_dtype")
    peak = _peak(chip, compute_dtype)
    W = chip.hbm_bandwidth

    def gap(B):
        E_B = expected_experts(p.n_experts, p.top_k, B / r) if p.moe_layers else 0.0
        t_w = (p.fixed + p.moe_layers * E_B * p.expert) * sw / (n_ep * W)
        return 2 * p.active * B / (n * peak) - t_w

    lo, hi = 0.0, 1.0
    while gap(hi) < 0:
        lo, hi = hi, 2 * hi
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return hi


# -- multi-token prediction: speculation without a draft model ------------------------------
@dataclass(frozen=True)
class MTPGain:
    """Speculative decoding with multi-token-prediction modules (or EAGLE/Medusa-style
    heads) on the target itself, against plain decoding at the same batch.

    ``tokens_per_step``: (1 - alpha^(gamma+1)) / (1 - alpha). ``t_plain``: a plain decode
    step of B tokens; ``t_verify``: the target's step on B (gamma + 1) tokens (each sequence's
    cache read once); ``t_module``: one pass of the module over B tokens, run gamma times.
    ``rho`` = t_module / t_plain. The cost of a step in plain steps is
    t_verify / t_plain + gamma rho, and the speed-up is tokens_per_step / cost (> 1: it pays).
    """

    alpha: float
    gamma: int
    tokens_per_step: float
    t_plain: float
    t_verify: float
    t_module: float
    rho: float

    @property
    def verify_ratio(self) -> float:
        """t(B (gamma + 1)) / t(B): 1 while the step is memory-bound, up to gamma + 1."""
        return self.t_verify / self.t_plain

    @property
    def cost_per_step(self) -> float:
        return self.verify_ratio + self.gamma * self.rho

    @property
    def speedup(self) -> float:
        return self.tokens_per_step / self.cost_per_step


def _mtp_parts(p: _Parts) -> _Parts:
    """One MTP module as DeepSeek-V3 builds it (arXiv:2412.19437, section 2.2): one more
    transformer layer like the model's last (for an MoE, an MoE layer: attention, E routed
    and the shared experts, a router), a projection [2D, D] of the normed hidden state and
    the next token's embedding, and the model's own output head [D, V] (shared, but read
    again). The embedding lookup is not a matmul."""
    c = p.base
    D = c.d_model
    head = c.vocab_size * D
    fixed = c.attention_params_per_layer() + 2 * D * D + head
    if p.moe_layers:
        fixed += p.n_shared * p.expert + D * p.n_experts
        return _Parts(f"{p.name} MTP module", c, p.n_experts, p.top_k, 1, p.expert,
                      p.n_shared, fixed, fixed + p.top_k * p.expert,
                      fixed + p.n_experts * p.expert)
    fixed += c.mlp_params_per_layer()
    return _Parts(f"{p.name} MTP module", c, 1, 1, 0, 0, 0, fixed, fixed, fixed)


def mtp_module_params(model) -> int:
    """Matmul parameters of one multi-token-prediction module (``_mtp_parts``): one
    layer of the model (all its experts), the [2D, D] projection and the output head."""
    return _mtp_parts(_parts(model)).total


def mtp_speedup(model, chip, batch: int, context: int, alpha: float, gamma: int = 1,
                n_chips: int = 1, n_ep: int | None = None, weight_dtype: str = "bf16",
                kv_dtype: str = "bf16", compute_dtype: str = "bf16",
                act_dtype: str = "bf16", kv_bytes_per_token: float | None = None,
                rho: float | None = None, check_memory: bool = True,
                overlap_a2a: bool = False, all_reduces: bool | None = None,
                hop_latency: float = _coll.ASSUMED_HOP_LATENCY, attn_tp: int | None = None,
                redundant_experts: int = 0, dispatch_dtype: str | None = None,
                attention_flops_per_key: float | None = None,
                max_nodes: int | None = None) -> MTPGain:
    """Speed-up of speculation with ``gamma`` multi-token-prediction passes per step (one
    module reused gamma times; DeepSeek-V3 trains one, gamma = 1) at acceptance ``alpha``,
    for ``batch`` sequences of ``context`` tokens.

    Each step runs the module gamma times on B tokens (cost rho each, in plain steps), then
    the target verifies gamma + 1 tokens per sequence in one step. All three are
    :func:`moe_decode_step`'s per-kernel steps (a dense model or an MoE, same layout
    arguments): t_plain = t(B), t_verify = t(B (gamma + 1)) reading each cache once; the
    module's step is one layer with the projection and the head, its own one-layer cache.
    While the step is memory-bound the verification costs about one plain step; past the
    critical batch its matmuls cost gamma + 1 times as much (and an MoE reads more experts
    at small batch), so the speed-up falls below 1 at large batch.
    ``rho`` given: use it instead of the module's computed cost. With ``check_memory``
    the plain batch must fit (:func:`moe_decode_step`). ``attn_tp``,
    ``redundant_experts``, ``dispatch_dtype``, ``attention_flops_per_key`` and
    ``max_nodes``: as in :func:`moe_decode_step` (the module's one MoE layer laid out the
    same way)."""
    a = _alpha(alpha)
    g = check_positive_int("gamma (tokens speculated per step)", gamma)
    p = _parts(model)
    kw = dict(chip=chip, batch=batch, context=context, n_chips=n_chips, n_ep=n_ep,
              weight_dtype=weight_dtype, kv_dtype=kv_dtype, compute_dtype=compute_dtype,
              act_dtype=act_dtype, hbm_fraction=1.0, overlap_a2a=overlap_a2a,
              all_reduces=all_reduces, hop_latency=hop_latency, attn_tp=attn_tp,
              dispatch_dtype=dispatch_dtype, attention_flops_per_key=attention_flops_per_key,
              max_nodes=max_nodes)
    plain = _moe_step(p, queries=1, kv_per_token=kv_bytes_per_token,
                      check_memory=check_memory, redundant_experts=redundant_experts, **kw)
    verify = _moe_step(p, queries=g + 1, kv_per_token=kv_bytes_per_token,
                       check_memory=False, redundant_experts=redundant_experts, **kw)
    kv_one = None if kv_bytes_per_token is None else (
        check_positive("kv_bytes_per_token", kv_bytes_per_token) / p.base.n_layers)
    module = _moe_step(_mtp_parts(p), queries=1, kv_per_token=kv_one, check_memory=False,
                       layers=1, redundant_experts=redundant_experts, **kw)
    if rho is None:
        r = module.time / plain.time
    else:
        r = check_nonnegative("rho (module pass / plain step)", rho)
    return MTPGain(alpha=a, gamma=g, tokens_per_step=speculative_tokens_per_step(a, g),
                   t_plain=plain.time, t_verify=verify.time, t_module=module.time, rho=r)


def mtp_break_even_batch(model, chip, context: int, alpha: float, gamma: int = 1,
                         n_chips: int = 1, n_ep: int | None = None, max_batch: int = 2 ** 24,
                         **kw) -> int | None:
    """The smallest batch at which :func:`mtp_speedup` falls below 1, searching upward:
    batches r, 2 r, 4 r, ... (r = n_chips / n_ep, so each splits over the groups) until the
    speed-up drops below 1, then bisection between the last two (multiples of r). Memory is
    not checked (compare with what fits). None when it still pays at ``max_batch``.
    ``kw``: the dtypes, ``kv_bytes_per_token``, ``rho``, ``overlap_a2a`` of
    :func:`mtp_speedup`."""
    p = _parts(model)
    n = check_positive_int("n_chips", n_chips)
    n, n_ep, r = _groups(p, n, n_ep, n)
    top = check_positive_int("max_batch", max_batch)

    def pays(B):
        return mtp_speedup(model, chip, B, context, alpha, gamma, n, n_ep,
                           check_memory=False, **kw).speedup >= 1

    if not pays(r):
        return r
    lo = r
    while pays(2 * lo):
        lo *= 2
        if lo > top:
            return None
    hi = 2 * lo                       # pays at lo, not at hi: bisect on multiples of r
    while hi - lo > r:
        mid = (lo + hi) // (2 * r) * r
        lo, hi = (mid, hi) if pays(mid) else (lo, mid)
    return hi


# -- prefill of a mixture of experts on an expert-parallel group (chapter 12) ---------------
@dataclass(frozen=True)
class MoEPrefill:
    """Prefill on a group of ``n_ep`` chips, per token a chip processes: ``t_compute`` its
    FLOPs at ``mfu`` of the peak, ``t_a2a`` its share of the dispatch and combine
    all-to-alls of every MoE layer. ``overlap``: two micro-batches take turns (one
    computes while the other communicates): a token costs the longer of the two, else
    their sum."""

    model: str
    n_ep: int
    prompt_len: int
    flops_per_token: float
    t_compute: float
    t_a2a: float
    overlap: bool

    @property
    def time_per_token(self) -> float:
        return (max(self.t_compute, self.t_a2a) if self.overlap
                else self.t_compute + self.t_a2a)

    @property
    def tokens_per_s_per_chip(self) -> float:
        return 1 / self.time_per_token

    @property
    def bound(self) -> str:
        return "compute" if self.t_compute >= self.t_a2a else "all-to-all"


def moe_prefill(model, chip, prompt_len: int, n_ep: int, compute_dtype: str = "fp8",
                mfu: float = 0.5, dispatch_dtype: str = "fp8", combine_dtype: str = "bf16",
                attention_flops_per_key: float | None = None,
                overlap: bool = True, max_nodes: int | None = None) -> MoEPrefill:
    """Prefill throughput of an MoE (or dense) model per chip, compute against the expert
    all-to-alls, for prompts of ``prompt_len`` (S) tokens.

    FLOPs per token: 2 N_active (``active_matmul_params``) plus causal attention,
    ``attention_flops_per_key`` x S / 2 per layer (default the model's own, 4 H h; give
    DeepSeek-V3's MLA figure, ``MLAConfig.flops_per_key(absorbed=False)``); t_compute =
    FLOPs / (mfu x peak of ``compute_dtype``). All-to-alls: per MoE layer each token's k
    copies of [D] go out at ``dispatch_dtype`` and come back at ``combine_dtype``, timed
    as :func:`moe_decode_step` times them (``_a2a_time``: across GPU nodes the NVLink part,
    then the NIC part), bandwidth only, per token. ``max_nodes=None``: every copy is sent
    on its own, an upper bound on the bytes; ``max_nodes=M``: node-limited routing (the
    training planner's ``Routing(max_nodes=M)``, DeepEP's normal kernels that DeepSeek
    prefills with), one crossing per node a token reaches, NVLink forwarding at once."""
    p = _parts(model)
    chip = get_chip(chip)
    S = check_positive_int("prompt_len", prompt_len)
    n = check_positive_int("n_ep", n_ep)
    if p.moe_layers and p.n_experts % n and n % p.n_experts:
        raise ValueError(f"n_ep={n} must divide the {p.n_experts} experts of {p.name} (or "
                         f"be a multiple of them, with redundant copies)")
    f = check_positive("mfu", mfu)
    if f > 1:
        raise ValueError(f"mfu is a share of the peak, at most 1; got {f}")
    if not isinstance(overlap, bool):
        raise ValueError(f"overlap must be True or False; got {overlap!r}")
    if max_nodes is not None:
        max_nodes = check_positive_int("max_nodes", max_nodes)
    c = p.base
    per_key = (4 * c.n_heads * c.head_dim if attention_flops_per_key is None
               else check_positive("attention_flops_per_key", attention_flops_per_key))
    flops = 2 * p.active + c.n_layers * per_key * (S + 1) / 2
    t_c = flops / (f * _peak(chip, compute_dtype))
    t_a = 0.0
    if p.moe_layers and n > 1:
        one = p.top_k * c.d_model
        kw = dict(top_k=p.top_k, max_nodes=max_nodes)
        t_a = p.moe_layers * (
            _a2a_time(chip, one * bytes_per_element(dispatch_dtype, "dispatch_dtype"), n,
                      **kw)
            + _a2a_time(chip, one * bytes_per_element(combine_dtype, "combine_dtype"), n,
                        **kw))
    return MoEPrefill(p.name, n, S, flops, t_c, t_a, overlap)
