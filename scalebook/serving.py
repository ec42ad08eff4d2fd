"""The serving planner (chapter 8): from a model, a chip and a workload to a slice, a batch,
a time per output token (TPOT), a time to first token (TTFT), tokens/s per chip and dollars
per million tokens, prefill included.

Every number comes from chapter 7's functions (:mod:`scalebook.inference`) and chapter 3's
collective model (:func:`scalebook.collectives.collective_time`); this module only chooses
among them. The model:

* Weights split evenly over the chips of the slice with 1D tensor parallelism (Megatron:
  query heads and MLP width) over the whole slice on a TPU (its ICI torus), and over one
  NVLink node on a GPU; a GPU slice larger than one node runs P = n / 8 pipeline stages,
  one per node, with the batch cut into P micro-batches (the LLaMA-3 paper serves 405B in
  bf16 so, TP inside a node and PP across nodes, arXiv:2407.21783 section 6). The TP degree
  must divide the query heads H. Where it exceeds the key/value heads H_kv, vLLM stores
  each KV head on n_tp / H_kv chips (the cache n_tp / H_kv times); the planner instead
  splits the batch over those chips (the cache once; the chips of a head swap queries and
  attention outputs), see :func:`scalebook.inference.kv_cache_sharding`.
* The KV cache of the batch at ``context_len`` tokens per sequence (every sequence at the
  full context: the step time of a full cache).
* The decode step runs its kernels one after the other (chapter 7's
  :class:`scalebook.inference.StepTime`): attention, bound by reading the cache, then the
  weight matmuls, max(FLOPs / C, weight bytes / W_hbm): ``t_attn + t_mm``. The 2 L
  tensor-parallel all-reduces of the [B/P, D] activations (plus the P hops between
  pipeline stages over the data-centre network) take ``t_comm`` and sit on the critical
  path between them, as serving engines run them: step = t_attn + t_mm + t_comm. With
  ``overlap_comm=True`` they hide behind the kernels (two micro-batches taking turns in
  decode, a collective matmul in prefill): step = max(t_attn + t_mm, t_comm).
  ``optimistic_step_time`` is max(t_math, t_mem, t_comm), never larger than either.
* Prefill of one prompt of ``prompt_len`` tokens (the TTFT on an idle server): its kernels
  with their FLOPs at ``prefill_mfu`` of the peak on the chips of one stage, then its own
  2 L all-reduces of the [S, D] activations (or the longer of the two, overlapped), plus
  the hops between stages.

Cost: decode chip-hours per million output tokens, and end to end, with the chip-time of
each request's prefill (as on a disaggregated server with prefill chips in the right ratio)
paid too, per million output tokens, per million input tokens (prefill only) and per
request, at the chip's listed on-demand price (``Chip.price_per_hour``); where the book has
no price the cost is ``None`` and the plan says so.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from . import collectives as _coll
from . import inference as _inf
from .hardware import Chip, get_chip
from .models import MoEConfig, TransformerConfig, get_model
from .units import check_nonnegative, check_positive, check_positive_int, fmt_bytes, fmt_time

__all__ = ["ServingPlan", "InfeasibleError", "slice_sizes", "slice_axes", "valid_tp_degrees",
           "plan_serving", "candidate_plans", "pareto_front", "cheapest_plan",
           "fastest_plan", "KNEE", "TRTLLM_H200_70B_FP8", "NVIDIA_H200_70B_CLAIM",
           "SOURCES"]

KNEE = 0.9     # the default batch reaches this share of the largest batch's tokens/s

# Published end-to-end throughputs to check the planner against (chapter 8, section 8.7):
# TensorRT-LLM 0.14.0, Llama 3.1 70B in FP8 on one 8 x H200 server, TP 8, in-flight
# batching fed at an unbounded rate; (input, output) tokens per request -> tokens/s.
TRTLLM_H200_70B_FP8 = {(128, 128): 16382.98, (128, 2048): 19266.04, (128, 4096): 13974.29,
                       (500, 2000): 17693.71, (1000, 1000): 13081.43, (2048, 128): 2070.82,
                       (2048, 2048): 9716.19, (20000, 2000): 1898.98}
# NVIDIA's figure for Llama 3 70B on one HGX H200 server, with no workload stated.
NVIDIA_H200_70B_CLAIM = 24_000.0
SOURCES = {
    "TRTLLM_H200_70B_FP8": "NVIDIA, TensorRT-LLM performance overview, v0.14.0 "
                           "(github.com/NVIDIA/TensorRT-LLM/blob/v0.14.0/docs/source/"
                           "performance/perf-overview.md), H200 141GB HBM3, FP8, TP size 8",
    "NVIDIA_H200_70B_CLAIM": "NVIDIA blog, June 2024 (blogs.nvidia.com/blog/"
                             "mlperf-training-benchmarks/): Llama 3 70B at 24,000 tokens/s "
                             "on an HGX H200 server, quoted from the earnings call",
}


class InfeasibleError(ValueError):
    """An ask the chip cannot meet (the weights fit no slice, a latency below the bound);
    the message gives the numbers."""


def _dtype(name, arg):
    """Bytes per element, refusing unknown names with the list of known ones."""
    return _inf.bytes_per_element(name, arg)


def slice_sizes(chip, max_chips: int | None = None) -> list[int]:
    """Slice sizes the planner tries, up to ``max_chips``: on a TPU the slice shapes Cloud
    TPU offers, powers of two up to the chip's fast-network domain (256 chips of v5e/v6e)
    but no 2-chip slice (2D torus: 1x1, 2x2, 2x4, 4x4, ..., 16x16; 3D torus: from 2x2x1,
    4 chips); on a GPU 1, 2, 4, 8 GPUs then whole 8-GPU nodes up to 64 GPUs."""
    chip = get_chip(chip)
    switched = _coll.is_switched(chip)
    if max_chips is None:
        max_chips = 64 if switched else (chip.ici_domain_chips or 256)
    top = check_positive_int("max_chips", max_chips)
    sizes = [2 ** i for i in range(int(math.log2(top)) + 1)]
    if not switched:
        smallest = 4 if "3d" in chip.topology.lower() else 1
        sizes = [n for n in sizes if n != 2 and n >= smallest]
        if not sizes:
            raise ValueError(f"max_chips={top}: the smallest {chip.name} slice has "
                             f"{smallest} chips")
    return sizes


def slice_axes(chip, n_chips: int) -> tuple[int, ...]:
    """Torus axes of an n-chip TPU slice, as square as the chip's torus allows
    (16 chips of a 2D torus: (4, 4); 32: (4, 8)); a GPU node is one switch, (n,)."""
    chip = get_chip(chip)
    n = check_positive_int("n_chips", n_chips)
    if _coll.is_switched(chip):
        return (n,)
    dims = 3 if "3d" in chip.topology.lower() else 2
    axes = [1] * dims
    k = 0
    while math.prod(axes) < n:
        axes[k % dims] *= 2
        k += 1
    if math.prod(axes) != n:
        raise ValueError(f"n_chips={n} is not a power of two: the planner's TPU slices are")
    return tuple(sorted(axes))


def valid_tp_degrees(model) -> list[int]:
    """Tensor-parallel degrees a serving engine accepts for ``model``: the divisors of its
    H query heads (each chip holds whole heads)."""
    c = _dense(model)
    return [d for d in range(1, c.n_heads + 1) if c.n_heads % d == 0]


@dataclass(frozen=True)
class ServingPlan:
    """One serving configuration and what it gives. Times in seconds, bytes, tokens/s.

    ``step_time`` is the decode step (= time per output token, TPOT): t_attn + t_mm +
    t_comm (max(t_attn + t_mm, t_comm) with ``overlap_comm``); ``bound`` names what sets
    it. Throughputs are per chip. Cost fields are
    ``None`` when the chip has no listed price."""

    model: str
    chip: str
    n_chips: int
    axes: tuple
    pipeline_stages: int
    weights_dtype: str
    kv_dtype: str
    context_len: int
    batch: int
    max_batch: int
    hbm_bytes: float            # all chips, times hbm_fraction
    weight_bytes: float         # all chips
    kv_bytes_per_token: float
    kv_bytes: float             # the batch's cache, all chips
    kv_head_shards: int
    kv_batch_shards: int
    t_math: float
    t_mem: float
    t_comm: float
    t_attn: float
    t_mm: float
    compute_time: float         # the part of t_attn + t_mm in compute-bound kernels
    prompt_len: int
    output_len: int
    prefill_mfu: float
    prefill_time: float         # TTFT: one prompt on an idle slice
    prefill_compute: float      # its kernels (FLOPs at prefill_mfu) on one stage's chips
    prefill_comm: float         # its 2 L all-reduces of [S, D]
    prefill_hops: float         # its activations sent between pipeline stages
    prefill_comm_bandwidth: float   # the all-reduces' bandwidth part (hop latency left out)
    prefill_flops: float        # one prompt
    peak_flops: float           # per chip, the prefill compute dtype
    price_per_hour: float | None
    dcn_bandwidth: float | None = None   # per chip, bytes/s (None: no figure)
    overlap_comm: bool = False  # the all-reduces hidden behind the kernels

    # -- derived ------------------------------------------------------------------------
    @property
    def memory_bytes(self) -> float:
        """Weights plus the batch's KV cache, all chips."""
        return self.weight_bytes + self.kv_bytes

    @property
    def memory_per_chip(self) -> float:
        return self.memory_bytes / self.n_chips

    @property
    def tp_degree(self) -> int:
        return self.n_chips // self.pipeline_stages

    @property
    def t_kernels(self) -> float:
        """Attention then the matmuls: t_attn + t_mm."""
        return self.t_attn + self.t_mm

    @property
    def step_time(self) -> float:
        """TPOT: t_attn + t_mm + t_comm (max(t_attn + t_mm, t_comm) when overlap_comm)."""
        if self.overlap_comm:
            return max(self.t_kernels, self.t_comm)
        return self.t_kernels + self.t_comm

    @property
    def optimistic_step_time(self) -> float:
        """max(t_math, t_mem, t_comm): attention and the matmuls overlapped perfectly."""
        return max(self.t_math, self.t_mem, self.t_comm)

    @property
    def ttft(self) -> float:
        return self.prefill_time

    @property
    def bound(self) -> str:
        """What takes the largest part of the step: "communication" (the all-reduces,
        when they take longer than the kernels), else "compute" or "memory" (the kernels
        bound by it take at least half of t_attn + t_mm)."""
        if self.t_comm > self.t_kernels:
            return "communication"
        return "compute" if 2 * self.compute_time >= self.t_kernels else "memory"

    @property
    def tokens_per_s(self) -> float:
        return self.batch / self.step_time

    @property
    def tokens_per_s_per_chip(self) -> float:
        return self.tokens_per_s / self.n_chips

    @property
    def requests_per_s_per_chip(self) -> float:
        """Decode only: tokens/s per chip / output_len."""
        return self.tokens_per_s_per_chip / self.output_len

    @property
    def prefill_requests_per_s_per_chip(self) -> float:
        """Prompts one chip prefills per second when prompts are prefilled together (the
        weights read and each all-reduce's hop latency paid once for many, so a prompt
        costs its FLOPs at prefill_mfu, or its all-reduces' bytes if they take longer):
        each stage's n / P chips are busy for FLOPs / (n / P C MFU) +
        prefill_comm_bandwidth (the max of the two with overlap_comm) per prompt, the P
        stages on P prompts at once."""
        flops_time = self.prefill_flops / (self.tp_degree * self.peak_flops
                                           * self.prefill_mfu)
        busy = (max(flops_time, self.prefill_comm_bandwidth) if self.overlap_comm
                else flops_time + self.prefill_comm_bandwidth)
        return 1 / (busy * self.tp_degree)

    @property
    def colocated_tokens_per_s(self) -> float:
        """Output tokens/s of the slice when it also prefills every prompt itself (an
        offline server at a full batch): output_len / (the slice's prefill time per
        request + output_len x step_time / batch)."""
        prefill = 1 / (self.prefill_requests_per_s_per_chip * self.n_chips)
        return self.output_len / (prefill + self.output_len * self.step_time / self.batch)

    @property
    def prefill_decode_ratio(self) -> float:
        """Prefill chips per decode chip when the two run on separate servers
        (disaggregated): requests/s a decode chip finishes / requests/s a prefill chip
        starts."""
        return self.requests_per_s_per_chip / self.prefill_requests_per_s_per_chip

    @property
    def kv_transfer_bytes(self) -> float:
        """The cache one prompt leaves behind: prompt_len x KV bytes per token."""
        return self.prompt_len * self.kv_bytes_per_token

    @property
    def kv_transfer_time(self) -> float | None:
        """Disaggregated serving: seconds to send one prompt's cache from a prefill slice
        of the same size to the decode slice, each of the n chips sending its 1/n over
        its own data-centre link (``dcn_bandwidth``); None when the chip has no figure."""
        if not self.dcn_bandwidth:
            return None
        return self.kv_transfer_bytes / (self.n_chips * self.dcn_bandwidth)

    @property
    def disaggregated_ttft(self) -> float | None:
        """TTFT when prefill runs on its own chips: the prefill, then the cache's trip."""
        t = self.kv_transfer_time
        return None if t is None else self.prefill_time + t

    @property
    def kv_transfer_load(self) -> float | None:
        """The share of each decode chip's data-centre link that the arriving caches use
        at the plan's throughput: requests/s per chip x kv_transfer_bytes / dcn_bandwidth
        (above 1 the network, not the chips, limits the decode pool)."""
        if not self.dcn_bandwidth:
            return None
        return self.requests_per_s_per_chip * self.kv_transfer_bytes / self.dcn_bandwidth

    @property
    def chip_hours_per_million(self) -> float:
        """Decode chip-hours per million output tokens."""
        return 1e6 / self.tokens_per_s_per_chip / 3600

    @property
    def chip_seconds_per_request(self) -> float:
        """Chip-seconds one request costs end to end: its prefill, and its output_len
        tokens' share of the decode steps."""
        return (1 / self.prefill_requests_per_s_per_chip
                + self.output_len / self.tokens_per_s_per_chip)

    @property
    def cost_per_million(self) -> float | None:
        """US dollars per million output tokens, decode chips only (None: no price)."""
        if self.price_per_hour is None:
            return None
        return self.price_per_hour * self.chip_hours_per_million

    @property
    def cost_per_million_with_prefill(self) -> float | None:
        """End to end: dollars per million output tokens, the prefill chips paid too."""
        c = self.cost_per_million
        return None if c is None else c * (1 + self.prefill_decode_ratio)

    @property
    def cost_per_million_input(self) -> float | None:
        """Dollars per million prompt tokens: the prefill chips' time only."""
        if self.price_per_hour is None:
            return None
        return (self.price_per_hour / 3600 / self.prefill_requests_per_s_per_chip
                / self.prompt_len * 1e6)

    @property
    def cost_per_request(self) -> float | None:
        if self.price_per_hour is None:
            return None
        return self.price_per_hour / 3600 * self.chip_seconds_per_request

    @property
    def weight_sharding(self) -> str:
        if self.pipeline_stages > 1:
            return (f"TP over {self.tp_degree} GPUs (one NVLink node) x "
                    f"{self.pipeline_stages} pipeline stages, {self.pipeline_stages} "
                    f"micro-batches")
        return f"1D tensor parallel over {self.n_chips} chips ({'x'.join(map(str, self.axes))})"

    @property
    def kv_sharding(self) -> str:
        return f"{self.kv_head_shards} head shards x {self.kv_batch_shards} batch shards"

    @property
    def sharding(self) -> str:
        return f"weights: {self.weight_sharding}; KV cache: {self.kv_sharding}"

    def __str__(self) -> str:
        price = (f"${self.cost_per_million_with_prefill:.3g} per million output tokens "
                 f"end to end at ${self.price_per_hour:.3g}/chip-hour\n"
                 f"                (decode ${self.cost_per_million:.3g}; prefill "
                 f"${self.cost_per_million_input:.3g} per million input tokens)"
                 if self.price_per_hour is not None else
                 f"no listed price for {self.chip}: none given "
                 f"({self.chip_hours_per_million:.3g} decode chip-hours per million tokens)")
        lines = [
            f"{self.model} on {self.n_chips} x {self.chip}, weights {self.weights_dtype}, "
            f"KV {self.kv_dtype}, {self.prompt_len} + {self.output_len} tokens "
            f"(context {self.context_len})",
            f"  weights       {self.weight_sharding}",
            f"  KV cache      {self.kv_sharding}",
            f"  memory        {fmt_bytes(self.weight_bytes)} weights + "
            f"{fmt_bytes(self.kv_bytes)} KV = {fmt_bytes(self.memory_per_chip)}/chip of "
            f"{fmt_bytes(self.hbm_bytes / self.n_chips)}",
            f"  batch         {self.batch} (at most {self.max_batch} fit); "
            f"KV {self.kv_bytes_per_token:.4g} B/token",
            f"  decode step   {fmt_time(self.step_time)} (TPOT), {self.bound}-bound; "
            f"overlapped bound max(T_math, T_mem, T_comm) "
            f"{fmt_time(self.optimistic_step_time)}",
            f"                attention {fmt_time(self.t_attn)} + matmuls "
            f"{fmt_time(self.t_mm)}"
            + (f", all-reduces {fmt_time(self.t_comm)} hidden" if self.overlap_comm else
               f" + all-reduces {fmt_time(self.t_comm)}"),
            f"  throughput    {self.tokens_per_s_per_chip:.4g} tokens/s/chip, "
            f"{self.requests_per_s_per_chip:.3g} requests/s/chip at {self.output_len} tokens",
            f"  prefill       TTFT {fmt_time(self.prefill_time)}: kernels at MFU "
            f"{self.prefill_mfu:.0%} {fmt_time(self.prefill_compute)}"
            + (", all-reduces " if self.overlap_comm else " + all-reduces ")
            + f"{fmt_time(self.prefill_comm)}" + (" hidden" if self.overlap_comm else ""),
            f"                prefill:decode chips {self.prefill_decode_ratio:.3g}",
            f"  cost          {price}",
        ]
        return "\n".join(lines)

    def row(self) -> dict:
        """The plan's main figures as a dict (one row of a table)."""
        return dict(model=self.model, chip=self.chip, n_chips=self.n_chips,
                    weights=self.weights_dtype, kv=self.kv_dtype, batch=self.batch,
                    step_ms=1e3 * self.step_time, bound=self.bound,
                    tok_s_chip=self.tokens_per_s_per_chip,
                    req_s_chip=self.requests_per_s_per_chip,
                    ttft_s=self.prefill_time, pd_ratio=self.prefill_decode_ratio,
                    usd_per_mtok=self.cost_per_million_with_prefill)


# -- the plan ------------------------------------------------------------------------------
def _check_fraction(name, value):
    v = check_positive(name, value)
    if v > 1:
        raise ValueError(f"{name} is a fraction, at most 1; got {value!r}")
    return v


def _dense(model) -> TransformerConfig:
    if isinstance(model, MoEConfig):
        raise ValueError(f"{model.dense.name} is a mixture of experts: plan_serving plans "
                         f"dense models; cost an MoE decode step with "
                         f"scalebook.inference's MoE functions (chapter 8, 'Serving a "
                         f"mixture of experts')")
    return get_model(model)


def _price(chip: Chip):
    p = chip.price_per_hour
    if p is None:
        return None
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not math.isfinite(p) \
            or p <= 0:
        raise ValueError(f"{chip.name}: price_per_hour must be a positive number of dollars "
                         f"per chip-hour (or None: no price); got {p!r}")
    return float(p)


def _stages(chip: Chip, n: int) -> int:
    if not _coll.is_switched(chip):
        return 1
    node = chip.ici_domain_chips or 8
    if n <= node:
        if node % n:
            raise ValueError(f"{n} GPUs do not split a {node}-GPU node evenly: use 1, 2, 4 "
                             f"or 8 GPUs, or whole nodes")
        return 1
    if n % node:
        raise ValueError(f"{n} GPUs is not a whole number of {node}-GPU nodes")
    return n // node


def _check_slice(c, chip, n):
    """(P, n_tp) of an n-chip slice; refuses a slice the chip does not come in, or a TP
    degree that would split a query head."""
    if not _coll.is_switched(chip):
        sizes = slice_sizes(chip)
        if n not in sizes:
            raise ValueError(f"there is no {n}-chip {chip.name} slice in the planner's list: "
                             f"{', '.join(map(str, sizes))} chips")
    node = chip.ici_domain_chips or 8
    n_tp = n if not _coll.is_switched(chip) or n <= node else node
    if c.n_heads % n_tp:
        ok = valid_tp_degrees(c)
        raise ValueError(f"tensor parallelism over {n_tp} chips would split the "
                         f"{c.n_heads} query heads of {c.name} unevenly: the TP degree must "
                         f"divide them ({', '.join(map(str, ok))}); serve a larger slice as "
                         f"replicas of a smaller one")
    P = _stages(chip, n)
    return P, n // P


def _min_chips(c, chip, sw, kv_seq, min_batch, hbm_fraction, sizes):
    """The smallest slice in ``sizes`` holding the weights and min_batch sequences."""
    w = c.weight_bytes(sw)
    for n in sizes:
        if w + min_batch * kv_seq <= n * chip.hbm_bytes * hbm_fraction:
            return n
    return None


def _infeasible_fit(c, chip, wname, kvname, T, min_batch, sizes, hbm_fraction,
                    capped=False):
    sw = _dtype(wname, "weights_dtype")
    w = c.weight_bytes(sw)
    kv_seq = _inf.kv_bytes_per_sequence(c, T, "gqa", kvname)
    top = sizes[-1]
    have = top * chip.hbm_bytes * hbm_fraction
    need = w + min_batch * kv_seq
    return InfeasibleError(
        f"{c.name} in {wname} does not fit any slice of {chip.name} up to {top} chips: "
        f"{fmt_bytes(w)} of weights + {min_batch} x {fmt_bytes(kv_seq)} of KV cache at "
        f"{T} tokens = {fmt_bytes(need)} > {fmt_bytes(have)}, "
        f"{'all' if hbm_fraction == 1 else f'{hbm_fraction:g}'} of the HBM of {top} chips; "
        f"use fewer bytes per weight, a shorter context, a smaller min_batch"
        f"{' or more chips (max_chips=)' if capped else ''}")


def _prefill(c, chip, S, n_tp, P, axes, weights_dtype, kv_dtype, compute_dtype, mfu,
             t_hop):
    """(compute at MFU on one stage's chips, its 2 L all-reduces, stage hops, FLOPs, the
    all-reduces' bandwidth part) of one prompt of S tokens."""
    pf = _inf.prefill_time(c, chip, 1, S, n_tp, weights_dtype, kv_dtype, compute_dtype,
                           check_memory=False)
    # the two kernels in turn, their FLOPs at the MFU: max(FLOPs / (C MFU), bytes / W)
    C = pf.peak * mfu
    compute = (max(pf.attn_flops / C, pf.kv_bytes / pf.bandwidth)
               + max(pf.matmul_flops / C, pf.weight_bytes / pf.bandwidth))
    act = S * c.d_model * 2

    def comm(hop):
        return (2 * c.n_layers * _coll.collective_time("all-reduce", act, axes, chip,
                                                        hop_latency=hop) if n_tp > 1 else 0.0)
    hops = (P - 1) * act / chip.dcn_bandwidth if P > 1 else 0.0
    return compute, comm(t_hop), hops, pf.flops, comm(0.0)


def plan_serving(model, chip, weights_dtype: str = "bf16", kv_dtype: str = "bf16",
                 context_len: int = 8192, output_len: int = 512, prompt_len: int | None = None,
                 n_chips: int | None = None, batch: int | str | None = None,
                 min_batch: int = 32, prefill_mfu: float = 0.5, hbm_fraction: float = 0.9,
                 compute_dtype: str = "bf16", max_chips: int | None = None,
                 latency_target: float | None = None, ttft_target: float | None = None,
                 hop_latency: float = _coll.ASSUMED_HOP_LATENCY,
                 decode_context: str = "full", overlap_comm: bool = False, _batches=None):
    """Plan serving of ``model`` on ``chip`` for requests of ``prompt_len`` prompt tokens
    and ``output_len`` output tokens (``prompt_len`` defaults to ``context_len -
    output_len``; the cache is sized for ``context_len`` tokens per sequence, at least
    prompt + output).

    ``n_chips=None``: the smallest slice (:func:`slice_sizes`) whose ``hbm_fraction`` of HBM
    holds the weights and ``min_batch`` sequences of ``context_len`` tokens (a "useful"
    batch) and, with ``ttft_target`` (seconds), whose prefill meets it.
    ``batch=None``: the smallest batch (a multiple of the KV batch shards and the pipeline
    micro-batches) whose tokens/s reach ``KNEE`` (90%) of those of the largest batch that
    fits, the knee of the latency-throughput curve; ``batch="max"``: the largest that
    fits; with ``latency_target`` (seconds per output token): the largest batch, at most
    the one that fits, whose step meets it. ``decode_context="full"`` costs every decode
    step at ``context_len`` (the step of a full cache); ``"mean"`` at prompt + output / 2,
    a request's average over its decode (memory is always sized at ``context_len``).
    ``prefill_mfu``: the share of the peak for ``compute_dtype`` that prefill reaches.
    ``hop_latency``: seconds each step of a ring all-reduce waits (default
    ``collectives.ASSUMED_HOP_LATENCY``; 0 gives the bandwidth-only model).
    ``overlap_comm``: hide the all-reduces behind the kernels (max, not sum).

    Raises :class:`InfeasibleError` (a ValueError) with the numbers when nothing fits or a
    target cannot be met, and ValueError for bad input: an unknown dtype (the known names
    listed), a context beyond the model's, a slice the chip does not come in, a TP degree
    that does not divide the query heads, a prompt plus output longer than the context,
    a chip with a price that is not a positive number, an MoE model."""
    c, chip = _dense(model), get_chip(chip)
    sw = _dtype(weights_dtype, "weights_dtype")
    _dtype(kv_dtype, "kv_dtype")
    price = _price(chip)
    T = c.check_context(context_len, "context_len")
    out = check_positive_int("output_len", output_len)
    if prompt_len is None:
        if out >= T:
            raise ValueError(f"output_len={out} must be shorter than context_len={T} "
                             f"(or give prompt_len)")
        S = T - out
    else:
        S = check_positive_int("prompt_len", prompt_len)
        if S + out > T:
            raise ValueError(f"prompt_len={S} + output_len={out} = {S + out} tokens do not "
                             f"fit a context of context_len={T}")
    if not isinstance(overlap_comm, bool):
        raise ValueError(f"overlap_comm must be True or False; got {overlap_comm!r}")
    if decode_context not in ("full", "mean"):
        raise ValueError(f"decode_context must be 'full' or 'mean'; got {decode_context!r}")
    T_step = T if decode_context == "full" else max(1, round(S + out / 2))
    min_b = check_positive_int("min_batch", min_batch)
    mfu = _check_fraction("prefill_mfu", prefill_mfu)
    f = _check_fraction("hbm_fraction", hbm_fraction)
    peak = _inf._peak(chip, compute_dtype)
    t_hop = check_nonnegative("hop_latency", hop_latency)
    ttft_tgt = None if ttft_target is None else _target(ttft_target, "ttft_target",
                                                         "seconds to the first token")
    sizes = slice_sizes(chip, max_chips)
    join = max if overlap_comm else (lambda a, b: a + b)       # kernels and all-reduces
    kv_tok = _inf.kv_bytes_per_token(c, "gqa", kv_dtype)
    kv_seq = _inf.kv_bytes_per_sequence(c, T, "gqa", kv_dtype)

    def setup(n):
        P, n_tp = _check_slice(c, chip, n)
        axes = slice_axes(chip, n_tp) if P == 1 else (n_tp,)
        return (P, n_tp, axes) + _prefill(c, chip, S, n_tp, P, axes, weights_dtype,
                                          kv_dtype, compute_dtype, mfu, t_hop)

    if n_chips is None:
        n = _min_chips(c, chip, sw, kv_seq, min_b, f, sizes)
        if n is None:
            raise _infeasible_fit(c, chip, weights_dtype, kv_dtype, T, min_b, sizes, f,
                                  capped=max_chips is not None and max_chips < (
                                      64 if _coll.is_switched(chip)
                                      else chip.ici_domain_chips or 256))
        if ttft_tgt is not None:
            tried = []
            for m in [m for m in sizes if m >= n]:
                try:
                    st = setup(m)
                except ValueError:
                    continue
                tried.append((m, join(st[3], st[4]) + st[5]))
                if tried[-1][1] <= ttft_tgt:
                    n = m
                    break
            else:
                best = min(tried, key=lambda x: x[1]) if tried else (n, math.inf)
                raise InfeasibleError(
                    f"no slice of {chip.name} up to {sizes[-1]} chips prefills {S} tokens of "
                    f"{c.name} within {fmt_time(ttft_tgt)}: the fastest, {best[0]} chips, "
                    f"takes {fmt_time(best[1])} at MFU {mfu:g}")
    else:
        n = check_positive_int("n_chips", n_chips)
    P, n_tp, axes, pf_compute, pf_comm, pf_hops, pf_flops, pf_comm_bw = setup(n)
    t_prefill = join(pf_compute, pf_comm) + pf_hops
    if ttft_tgt is not None and t_prefill > ttft_tgt:
        raise InfeasibleError(
            f"prefill of {S} tokens of {c.name} on {n} x {chip.name} takes "
            f"{fmt_time(t_prefill)} (kernels at MFU {mfu:g} {fmt_time(pf_compute)}, "
            f"all-reduces {fmt_time(pf_comm)}), more than ttft_target={fmt_time(ttft_tgt)}")
    try:
        fit = _inf.fit_batch(c, chip, n, T, weights_dtype, kv_dtype, hbm_fraction=f)
    except ValueError as e:
        raise InfeasibleError(str(e)) from None
    # KV sharding: heads as far as they go, then the batch; micro-batches for the pipeline.
    heads = math.gcd(c.n_kv_heads, n_tp)
    step = (n_tp // heads) * P
    largest = (fit.max_batch // step) * step
    if largest < 1:
        raise InfeasibleError(
            f"on {n} x {chip.name} {fit.max_batch} sequences of {T} tokens fit next to the "
            f"{fmt_bytes(fit.weights)} of weights, fewer than the {step} the sharding "
            f"needs (KV batch shards x pipeline stages)")

    def plan(B):
        kvs = _inf.kv_cache_sharding(c.n_kv_heads, B // P, n_tp)
        # One micro-batch on one stage's chips, the whole model's bytes: the time per token.
        st = _inf.decode_step_time(c, chip, B // P, T_step, n_tp, weights_dtype, kv_dtype,
                                   compute_dtype, check_memory=False)
        act = (B // P) * c.d_model * 2
        t_comm = 2 * c.n_layers * _coll.collective_time("all-reduce", act, axes, chip,
                                                         hop_latency=t_hop)
        if P > 1:
            t_comm += P * act / chip.dcn_bandwidth
        return ServingPlan(
            model=c.name, chip=chip.name, n_chips=n, axes=axes, pipeline_stages=P,
            weights_dtype=weights_dtype, kv_dtype=kv_dtype, context_len=T, batch=B,
            max_batch=fit.max_batch, hbm_bytes=fit.hbm, weight_bytes=fit.weights,
            kv_bytes_per_token=kv_tok, kv_bytes=B * fit.kv_per_sequence,
            kv_head_shards=kvs.head_shards, kv_batch_shards=kvs.batch_shards,
            t_math=st.t_math, t_mem=st.t_mem, t_comm=t_comm, t_attn=st.t_attn,
            t_mm=st.t_mm, compute_time=st.compute_time, prompt_len=S, output_len=out,
            prefill_mfu=mfu, prefill_time=t_prefill, prefill_compute=pf_compute,
            prefill_comm=pf_comm, prefill_hops=pf_hops, prefill_flops=pf_flops,
            prefill_comm_bandwidth=pf_comm_bw,
            peak_flops=peak, price_per_hour=price, dcn_bandwidth=chip.dcn_bandwidth,
            overlap_comm=overlap_comm)

    if _batches is not None:      # candidate_plans: several batches, one set-up
        return [plan(b) for b in _batches(largest, step)]
    if isinstance(batch, str):
        if batch != "max":
            raise ValueError(f"batch must be a number of sequences, 'max' or None; "
                             f"got {batch!r}")
        return plan(largest)
    if batch is not None:
        B = check_positive_int("batch", batch)
        if B > fit.max_batch:
            raise InfeasibleError(
                f"a batch of {B} sequences of {T} tokens does not fit on {n} x {chip.name}: "
                f"{fmt_bytes(fit.weights)} weights + {B} x {fmt_bytes(fit.kv_per_sequence)} KV "
                f"> {fmt_bytes(fit.hbm)}, {f:g} of the HBM; at most {fit.max_batch} fit")
        if B % step:
            raise ValueError(f"batch={B} must be a multiple of {step} (KV batch shards x "
                             f"pipeline stages on {n} x {chip.name})")
        p = plan(B)
        if latency_target is not None and p.step_time > _target(latency_target):
            raise InfeasibleError(f"batch {B} takes {fmt_time(p.step_time)} per token, more "
                                  f"than latency_target={fmt_time(latency_target)}")
        return p
    if latency_target is None:
        # The knee: the smallest multiple of step whose tokens/s reach KNEE of the largest
        # batch's. Tokens/s grow with the batch, so bisect.
        want = KNEE * plan(largest).tokens_per_s
        ok = lambda k: plan(k * step).tokens_per_s >= want      # noqa: E731
        return plan(_first_true(ok, 1, largest // step) * step)
    # The largest batch (multiple of step, at most the largest) whose step time meets the
    # target; the step time grows with the batch, so bisect.
    tgt = _target(latency_target)
    lo = plan(step)
    if lo.step_time > tgt:
        raise InfeasibleError(
            f"{fmt_time(tgt)} per token is below the bound of {c.name} ({weights_dtype}) on "
            f"{n} x {chip.name}: even batch {step} takes {fmt_time(lo.step_time)} "
            f"({lo.bound}-bound; reading the weights alone takes "
            f"{fmt_time(fit.weights / (n_tp * chip.hbm_bandwidth))} per token); try a larger "
            f"slice (n_chips=) or search all of them with cheapest_plan")
    meets = lambda k: plan(k * step).step_time > tgt               # noqa: E731
    top = largest // step
    if not meets(top):
        return plan(top * step)
    return plan((_first_true(meets, 1, top) - 1) * step)


def _first_true(pred, lo: int, hi: int) -> int:
    """The smallest k in [lo, hi] with pred(k), for a pred that is monotone (False ...
    True) and true at hi."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


# -- searching configurations --------------------------------------------------------------
def _as_list(x, name):
    if isinstance(x, (str, Chip, TransformerConfig, MoEConfig)) or not hasattr(x, "__iter__"):
        return [x]
    xs = list(x)
    if not xs:
        raise ValueError(f"{name} must name at least one")
    return xs


def _batches(largest: int, step: int) -> list[int]:
    bs, b = [], step
    while b < largest:
        bs.append(b)
        b *= 2
    bs.append(largest)
    return sorted(set(bs))


def candidate_plans(model, chips, weights_dtypes=("bf16", "int8", "int4"), kv_dtype="bf16",
                    context_len: int = 8192, output_len: int = 512, slices=None,
                    min_batch: int = 1, **kw) -> list[ServingPlan]:
    """Plans for every chip, weight dtype, KV dtype (``kv_dtype``: one name or several)
    and slice from the smallest that fits (or the ``slices`` given) up, and batches in
    powers of two (times the sharding's step) up to the largest that fits: the points of
    the latency-throughput picture. Slices that hold no batch, or whose TP degree would
    split a head, are skipped. ``kw`` goes to :func:`plan_serving`."""
    plans = []
    for m in _as_list(model, "model"):
        for ch in _as_list(chips, "chips"):
            chip = get_chip(ch)
            for wd in _as_list(weights_dtypes, "weights_dtypes"):
                for kd in _as_list(kv_dtype, "kv_dtype"):
                    try:
                        first = plan_serving(m, chip, wd, kd, context_len, output_len,
                                             min_batch=min_batch, batch="max", **kw)
                    except InfeasibleError:
                        continue
                    sizes = [n for n in (slices or slice_sizes(chip, kw.get("max_chips")))
                             if n >= first.n_chips]
                    for n in sizes:
                        try:
                            plans += plan_serving(m, chip, wd, kd, context_len, output_len,
                                                  n_chips=n, _batches=_batches, **kw)
                        except (InfeasibleError, ValueError):
                            continue
    return plans


def pareto_front(plans) -> list[ServingPlan]:
    """The plans no other plan dominates (a time per token no longer and tokens/s per chip
    no fewer, and better on one), sorted by time per token; along the front both rise
    strictly."""
    ps = sorted(_as_list(plans, "plans"), key=lambda p: (p.step_time, -p.tokens_per_s_per_chip))
    front, best = [], -math.inf
    for p in ps:
        if p.tokens_per_s_per_chip > best:
            front.append(p)
            best = p.tokens_per_s_per_chip
    return front


def _target(value, name="latency_target", what="seconds per output token"):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} is {what}; got {value!r}")
    return check_positive(f"{name} (s)", value)


def fastest_plan(plans) -> ServingPlan:
    """The plan with the shortest time per token."""
    return min(_as_list(plans, "plans"), key=lambda p: p.step_time)


_COSTS = {"cost": lambda p: p.cost_per_million_with_prefill,
          "decode_cost": lambda p: p.cost_per_million,
          "chip_hours": lambda p: p.chip_seconds_per_request / p.output_len * 1e6 / 3600,
          "decode_chip_hours": lambda p: p.chip_hours_per_million}


def cheapest_plan(plans, latency_target: float, by: str = "cost",
                  ttft_target: float | None = None) -> ServingPlan:
    """The plan with time per token at most ``latency_target`` seconds (and a TTFT at most
    ``ttft_target``, if given) that costs least per million output tokens end to end,
    prefill included (``by="cost"``, plans without a price left out), or uses the fewest
    chip-hours per million output tokens end to end (``by="chip_hours"``);
    ``"decode_cost"`` and ``"decode_chip_hours"`` count the decode chips only. Raises
    InfeasibleError naming the fastest plan and its time when none meets the targets."""
    ps = _as_list(plans, "plans")
    tgt = _target(latency_target)
    ttft = None if ttft_target is None else _target(ttft_target, "ttft_target",
                                                    "seconds to the first token")
    if by not in _COSTS:
        raise ValueError(f"by must be one of {', '.join(map(repr, _COSTS))}; got {by!r}")
    if by in ("cost", "decode_cost"):
        priced = [p for p in ps if p.cost_per_million is not None]
        if not priced:
            raise ValueError("none of the plans' chips has a listed price: use by='chip_hours'")
        ps = priced
    ok = [p for p in ps if p.step_time <= tgt and (ttft is None or p.prefill_time <= ttft)]
    if not ok:
        which = "plan with a listed price" if by in ("cost", "decode_cost") else "plan"
        f = fastest_plan(ps)
        if ttft is not None and any(p.step_time <= tgt for p in ps):
            q = min((p for p in ps if p.step_time <= tgt), key=lambda p: p.prefill_time)
            raise InfeasibleError(
                f"no {which} meets both {fmt_time(tgt)} per token and a TTFT of "
                f"{fmt_time(ttft)}: of those meeting the first, the fastest prefill, "
                f"{q.n_chips} x {q.chip} ({q.weights_dtype}), takes {fmt_time(q.prefill_time)}")
        raise InfeasibleError(
            f"no {which} reaches {fmt_time(tgt)} per token: the fastest, {f.model} on "
            f"{f.n_chips} x {f.chip} ({f.weights_dtype}) at batch {f.batch}, takes "
            f"{fmt_time(f.step_time)} ({f.bound}-bound)")
    key = _COSTS[by]
    return min(ok, key=lambda p: (key(p), p.step_time))
