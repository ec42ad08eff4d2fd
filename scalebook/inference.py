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
          "int4": "s4"}
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
    all-reduces."""

    n: int
    t_mem: float
    t_math: float
    t_comm: float
    t_kernels: float = math.nan

    @property
    def bound(self) -> str:
        if self.t_comm > self.t_kernels:
            return "communication"
        return "memory" if self.t_mem >= self.t_math else "compute"

    @property
    def lower(self) -> float:
        """max(t_kernels, t_comm): the all-reduces overlapped with the kernels."""
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


def simulate_serving(model, chip, n_chips: int, rate: float, n_requests: int = 200,
                     prompt_len=512, output_len=128, max_batch: int | None = None,
                     policy: str = "continuous", seed: int = 0, weight_dtype: str = "bf16",
                     kv_dtype: str = "bf16", prefill_chunk: int | None = None,
                     page_size: int | None = None, hbm_fraction: float = 1.0) -> ServingStats:
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
    requests (none by default)."""
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

    def prefill_cost(lengths):
        a = sum(S * c.attention_flops_per_token(int(S), causal=True) for S in lengths)
        return (max(a / C, kv_tok * sum(lengths) / W)
                + max(w_flops * sum(lengths) / C, w_bytes / W))

    def decode_cost(B, total_T):
        return max(attn * total_T / C, kv_tok * total_T / W) + max(w_flops * B / C, w_bytes / W)

    def mixed_cost(B, total_T, pieces):
        # pieces: (prefix, tokens) of each prompt chunk in the step
        pairs = total_T + sum(k * (p0 + (k + 1) / 2) for p0, k in pieces)
        kv = total_T + sum(p0 + k for p0, k in pieces)
        tokens = B + sum(k for _, k in pieces)
        return max(attn * pairs / C, kv_tok * kv / W) + max(w_flops * tokens / C, w_bytes / W)

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
