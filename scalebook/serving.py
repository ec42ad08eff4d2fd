"""The serving planner (chapter 8): from a model and a chip to a slice, a batch, a step
time, tokens/s per chip and dollars per million output tokens.

Every number comes from chapter 7's functions (:mod:`scalebook.inference`) and chapter 3's
collective model (:func:`scalebook.collectives.collective_time`); this module only chooses
among them. The model of a decode step:

* Weights split evenly over the chips of the slice with 1D tensor parallelism (Megatron:
  heads and MLP width) over the whole slice on a TPU (its ICI torus), and over one NVLink
  node on a GPU; a GPU slice larger than one node runs P = n / 8 pipeline stages, one per
  node, with the batch cut into P micro-batches (the LLaMA-3 paper serves 405B in bf16 so,
  TP inside a node and PP across nodes, arXiv:2407.21783 section 6).
* The KV cache of the batch at ``context_len`` tokens per sequence (every sequence at the
  full context: the step time of a full cache), split over key/value heads and then over
  the batch (:func:`scalebook.inference.kv_cache_sharding`), so it is stored once.
* Step time = max(t_math, t_mem, t_comm): the compute and HBM times of
  :func:`scalebook.inference.decode_step_time` for one micro-batch on the chips of one
  stage, and 2 L tensor-parallel all-reduces of the [B/P, D] activations
  (:func:`scalebook.collectives.collective_time` on the slice's torus axes or the node's
  switch) plus the P hops between pipeline stages over the data-centre network. The step
  time is also the time per output token a user sees; B tokens come out per step.
* Prefill of one prompt of ``prompt_len`` tokens at a stated MFU: the FLOPs of
  :func:`scalebook.inference.prefill_time` divided by (n C MFU).

Cost per million output tokens = price per chip-hour / (3600 tokens/s per chip) x 1e6, at
the chip's listed on-demand price (``Chip.price_per_hour``); where the book has no price the
cost is ``None`` and the plan says so (chip-hours per million tokens are always given).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from . import collectives as _coll
from . import inference as _inf
from .hardware import Chip, get_chip
from .models import TransformerConfig, get_model
from .units import check_nonnegative, check_positive, check_positive_int, fmt_bytes, fmt_time

__all__ = ["ServingPlan", "InfeasibleError", "slice_sizes", "slice_axes", "plan_serving",
           "candidate_plans", "pareto_front", "cheapest_plan", "fastest_plan"]


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


@dataclass(frozen=True)
class ServingPlan:
    """One serving configuration and what it gives. Times in seconds, bytes, tokens/s.

    ``step_time`` is the decode step (= time per output token, TPOT); ``bound`` names the
    largest of ``t_math``, ``t_mem``, ``t_comm``. Throughputs are per chip. Cost fields are
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
    prompt_len: int
    output_len: int
    prefill_mfu: float
    prefill_time: float         # one prompt on the whole slice at prefill_mfu
    prefill_flops: float        # one prompt
    peak_flops: float           # per chip, the prefill compute dtype
    price_per_hour: float | None

    # -- derived ------------------------------------------------------------------------
    @property
    def memory_bytes(self) -> float:
        """Weights plus the batch's KV cache, all chips."""
        return self.weight_bytes + self.kv_bytes

    @property
    def memory_per_chip(self) -> float:
        return self.memory_bytes / self.n_chips

    @property
    def step_time(self) -> float:
        return max(self.t_math, self.t_mem, self.t_comm)

    @property
    def bound(self) -> str:
        times = {"memory": self.t_mem, "compute": self.t_math, "communication": self.t_comm}
        return max(times, key=times.get)

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
        """Prompts one chip prefills per second at prefill_mfu."""
        return self.peak_flops * self.prefill_mfu / self.prefill_flops

    @property
    def prefill_decode_ratio(self) -> float:
        """Prefill chips per decode chip when the two run on separate servers
        (disaggregated): requests/s a decode chip finishes / requests/s a prefill chip
        starts."""
        return self.requests_per_s_per_chip / self.prefill_requests_per_s_per_chip

    @property
    def chip_hours_per_million(self) -> float:
        """Decode chip-hours per million output tokens."""
        return 1e6 / self.tokens_per_s_per_chip / 3600

    @property
    def cost_per_million(self) -> float | None:
        """US dollars per million output tokens, decode chips only (None: no price)."""
        if self.price_per_hour is None:
            return None
        return self.price_per_hour * self.chip_hours_per_million

    @property
    def cost_per_million_with_prefill(self) -> float | None:
        """The same, paying also for the prefill chips of the disaggregated ratio."""
        c = self.cost_per_million
        return None if c is None else c * (1 + self.prefill_decode_ratio)

    @property
    def weight_sharding(self) -> str:
        if self.pipeline_stages > 1:
            return (f"TP over {self.n_chips // self.pipeline_stages} GPUs (one NVLink node) x "
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
        price = (f"${self.cost_per_million:.3g} per million output tokens "
                 f"(${self.cost_per_million_with_prefill:.3g} with prefill chips) at "
                 f"${self.price_per_hour:.3g}/chip-hour"
                 if self.price_per_hour is not None else
                 f"no listed price for {self.chip}: none given "
                 f"({self.chip_hours_per_million:.3g} chip-hours per million tokens)")
        lines = [
            f"{self.model} on {self.n_chips} x {self.chip}, weights {self.weights_dtype}, "
            f"KV {self.kv_dtype}, context {self.context_len}",
            f"  weights       {self.weight_sharding}",
            f"  KV cache      {self.kv_sharding}",
            f"  memory        {fmt_bytes(self.weight_bytes)} weights + "
            f"{fmt_bytes(self.kv_bytes)} KV = {fmt_bytes(self.memory_per_chip)}/chip of "
            f"{fmt_bytes(self.hbm_bytes / self.n_chips)}",
            f"  batch         {self.batch} (at most {self.max_batch} fit); "
            f"KV {self.kv_bytes_per_token:.4g} B/token",
            f"  decode step   {fmt_time(self.step_time)}, {self.bound}-bound (math "
            f"{fmt_time(self.t_math)}, memory {fmt_time(self.t_mem)}, comm "
            f"{fmt_time(self.t_comm)})",
            f"  throughput    {self.tokens_per_s_per_chip:.4g} tokens/s/chip, "
            f"{self.requests_per_s_per_chip:.3g} requests/s/chip at {self.output_len} tokens",
            f"  prefill       {fmt_time(self.prefill_time)} for {self.prompt_len} tokens at "
            f"MFU {self.prefill_mfu:.0%}; prefill:decode chips {self.prefill_decode_ratio:.3g}",
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
                    prefill_s=self.prefill_time, pd_ratio=self.prefill_decode_ratio,
                    usd_per_mtok=self.cost_per_million)


# -- the plan ------------------------------------------------------------------------------
def _check_fraction(name, value):
    v = check_positive(name, value)
    if v > 1:
        raise ValueError(f"{name} is a fraction, at most 1; got {value!r}")
    return v


def _stages(chip: Chip, n: int) -> int:
    if not _coll.is_switched(chip):
        return 1
    node = chip.ici_domain_chips or 8
    if n <= node:
        return 1
    if n % node:
        raise ValueError(f"{n} GPUs is not a whole number of {node}-GPU nodes")
    return n // node


def _weight_bytes(c: TransformerConfig, sw: float) -> float:
    return c.weight_bytes(sw)


def _min_chips(c, chip, sw, kv_seq, min_batch, hbm_fraction, sizes):
    """The smallest slice in ``sizes`` holding the weights and min_batch sequences."""
    w = _weight_bytes(c, sw)
    for n in sizes:
        if w + min_batch * kv_seq <= n * chip.hbm_bytes * hbm_fraction:
            return n
    return None


def _infeasible_fit(c, chip, wname, kvname, T, min_batch, sizes, hbm_fraction,
                    capped=False):
    sw = _dtype(wname, "weights_dtype")
    w = _weight_bytes(c, sw)
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


def plan_serving(model, chip, weights_dtype: str = "bf16", kv_dtype: str = "bf16",
                 context_len: int = 8192, output_len: int = 512, prompt_len: int | None = None,
                 n_chips: int | None = None, batch: int | None = None, min_batch: int = 32,
                 prefill_mfu: float = 0.5, hbm_fraction: float = 0.9,
                 compute_dtype: str = "bf16", max_chips: int | None = None,
                 latency_target: float | None = None,
                 hop_latency: float = _coll.ASSUMED_HOP_LATENCY,
                 _batches=None):
    """Plan decode serving of ``model`` on ``chip``.

    ``n_chips=None``: the smallest slice (:func:`slice_sizes`) whose ``hbm_fraction`` of HBM
    holds the weights and ``min_batch`` sequences of ``context_len`` tokens (a "useful"
    batch). ``batch=None``: the largest batch that fits there at ``context_len`` (rounded
    down to a multiple of the KV batch shards and of the pipeline micro-batches).
    ``prompt_len`` (default ``context_len - output_len``) is the prompt prefilled at
    ``prefill_mfu`` of the peak for ``compute_dtype``. ``latency_target`` (seconds per
    output token): the largest batch, at most the one above, whose step time meets it.
    ``hop_latency``: seconds each step of a ring all-reduce waits (default
    ``collectives.ASSUMED_HOP_LATENCY``, chapters 3 and 7's assumed 1e-6 s; 0 gives the
    bandwidth-only model).

    Raises :class:`InfeasibleError` (a ValueError) with the numbers when nothing fits, and
    ValueError for bad input (an unknown dtype lists the known names; an unknown chip or
    model raises KeyError listing the known ones)."""
    c, chip = get_model(model), get_chip(chip)
    sw = _dtype(weights_dtype, "weights_dtype")
    _dtype(kv_dtype, "kv_dtype")
    T = check_positive_int("context_len", context_len)
    out = check_positive_int("output_len", output_len)
    if out >= T and prompt_len is None:
        raise ValueError(f"output_len={out} must be shorter than context_len={T} "
                         f"(or give prompt_len)")
    S = T - out if prompt_len is None else check_positive_int("prompt_len", prompt_len)
    min_b = check_positive_int("min_batch", min_batch)
    mfu = _check_fraction("prefill_mfu", prefill_mfu)
    f = _check_fraction("hbm_fraction", hbm_fraction)
    peak = _inf._peak(chip, compute_dtype)
    t_hop = check_nonnegative("hop_latency", hop_latency)
    sizes = slice_sizes(chip, max_chips)
    kv_tok = _inf.kv_bytes_per_token(c, "gqa", kv_dtype)
    kv_seq = _inf.kv_bytes_per_sequence(c, T, "gqa", kv_dtype)
    if n_chips is None:
        n = _min_chips(c, chip, sw, kv_seq, min_b, f, sizes)
        if n is None:
            raise _infeasible_fit(c, chip, weights_dtype, kv_dtype, T, min_b, sizes, f,
                                  capped=max_chips is not None and max_chips < (
                                      64 if _coll.is_switched(chip)
                                      else chip.ici_domain_chips or 256))
    else:
        n = check_positive_int("n_chips", n_chips)
    P = _stages(chip, n)
    n_tp = n // P
    axes = slice_axes(chip, n_tp) if P == 1 else (n_tp,)
    try:
        fit = _inf.fit_batch(c, chip, n, T, weights_dtype, kv_dtype, hbm_fraction=f)
    except ValueError as e:
        raise InfeasibleError(str(e)) from None
    # KV sharding: heads as far as they go, then the batch; micro-batches for the pipeline.
    heads = math.gcd(c.n_kv_heads, n_tp)
    step = (n_tp // heads) * P
    largest = (fit.max_batch // step) * step
    if batch is None:
        if largest < 1:
            raise InfeasibleError(
                f"on {n} x {chip.name} {fit.max_batch} sequences of {T} tokens fit next to the "
                f"{fmt_bytes(fit.weights)} of weights, fewer than the {step} the sharding "
                f"needs (KV batch shards x pipeline stages)")
        B = largest
    else:
        B = check_positive_int("batch", batch)
        if B > fit.max_batch:
            raise InfeasibleError(
                f"a batch of {B} sequences of {T} tokens does not fit on {n} x {chip.name}: "
                f"{fmt_bytes(fit.weights)} weights + {B} x {fmt_bytes(fit.kv_per_sequence)} KV "
                f"> {fmt_bytes(fit.hbm)}, {f:g} of the HBM; at most {fit.max_batch} fit")
        if B % step:
            raise ValueError(f"batch={B} must be a multiple of {step} (KV batch shards x "
                             f"pipeline stages on {n} x {chip.name})")
    def plan(B):
        kvs = _inf.kv_cache_sharding(c.n_kv_heads, B // P, n_tp)
        # One micro-batch on one stage's chips, the whole model's bytes: the time per token.
        st = _inf.decode_step_time(c, chip, B // P, T, n_tp, weights_dtype, kv_dtype,
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
            t_math=st.t_math, t_mem=st.t_mem, t_comm=t_comm, prompt_len=S, output_len=out,
            prefill_mfu=mfu, prefill_time=t_prefill, prefill_flops=pf.flops, peak_flops=peak,
            price_per_hour=chip.price_per_hour)

    pf = _inf.prefill_time(c, chip, 1, S, n, weights_dtype, kv_dtype, compute_dtype,
                           check_memory=False)
    t_prefill = max(pf.t_math / mfu, pf.t_mem)
    if _batches is not None:      # candidate_plans: several batches, one set-up
        return [plan(b) for b in _batches(B, step)]
    if latency_target is None:
        return plan(B)
    # The largest batch (multiple of step, at most B) whose step time meets the target;
    # the step time grows with the batch, so bisect.
    tgt = _target(latency_target)
    lo = plan(step)
    if lo.step_time > tgt:
        raise InfeasibleError(
            f"{fmt_time(tgt)} per token is below the bound of {c.name} ({weights_dtype}) on "
            f"{n} x {chip.name}: even batch {step} takes {fmt_time(lo.step_time)} "
            f"({lo.bound}-bound; reading the weights alone takes "
            f"{fmt_time(fit.weights / (n_tp * chip.hbm_bandwidth))} per token); try a larger "
            f"slice (n_chips=) or search all of them with cheapest_plan")
    a, b = 1, B // step          # plan(a * step) meets the target
    if plan(b * step).step_time <= tgt:
        return plan(b * step)
    while b - a > 1:
        mid = (a + b) // 2
        if plan(mid * step).step_time <= tgt:
            a = mid
        else:
            b = mid
    return plan(a * step)


# -- searching configurations --------------------------------------------------------------
def _as_list(x, name):
    if isinstance(x, (str, Chip, TransformerConfig)) or not hasattr(x, "__iter__"):
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
    """Plans for every chip, weight dtype and slice from the smallest that fits (or the
    ``slices`` given) up, and batches in powers of two (times the sharding's step) up to the
    largest that fits: the points of the latency-throughput picture. Slices that hold no
    batch are skipped. ``kw`` goes to :func:`plan_serving`."""
    plans = []
    for m in _as_list(model, "model"):
        for ch in _as_list(chips, "chips"):
            chip = get_chip(ch)
            for wd in _as_list(weights_dtypes, "weights_dtypes"):
                try:
                    first = plan_serving(m, chip, wd, kv_dtype, context_len, output_len,
                                         min_batch=min_batch, **kw)
                except InfeasibleError:
                    continue
                sizes = [n for n in (slices or slice_sizes(chip, kw.get("max_chips")))
                         if n >= first.n_chips]
                for n in sizes:
                    try:
                        plans += plan_serving(m, chip, wd, kv_dtype, context_len, output_len,
                                              n_chips=n, _batches=_batches, **kw)
                    except (InfeasibleError, ValueError):
                        continue
    return plans


def pareto_front(plans) -> list[ServingPlan]:
    """The plans no other plan beats on both time per token (lower) and tokens/s per chip
    (higher), sorted by time per token; along the front both rise strictly."""
    ps = sorted(_as_list(plans, "plans"), key=lambda p: (p.step_time, -p.tokens_per_s_per_chip))
    front, best = [], -math.inf
    for p in ps:
        if p.tokens_per_s_per_chip > best:
            front.append(p)
            best = p.tokens_per_s_per_chip
    return front


def _target(latency_target):
    if isinstance(latency_target, bool) or not isinstance(latency_target, numbers.Real):
        raise ValueError(f"latency_target is seconds per output token; got {latency_target!r}")
    return check_positive("latency_target (s per token)", latency_target)


def fastest_plan(plans) -> ServingPlan:
    """The plan with the shortest time per token."""
    return min(_as_list(plans, "plans"), key=lambda p: p.step_time)


def cheapest_plan(plans, latency_target: float, by: str = "cost") -> ServingPlan:
    """The plan with time per token at most ``latency_target`` seconds that costs least per
    million output tokens (``by="cost"``, plans without a price left out) or uses the fewest
    chip-hours per million tokens (``by="chip_hours"``). Raises InfeasibleError naming the
    fastest plan and its time when none meets the target."""
    ps = _as_list(plans, "plans")
    tgt = _target(latency_target)
    if by not in ("cost", "chip_hours"):
        raise ValueError(f"by must be 'cost' or 'chip_hours'; got {by!r}")
    if by == "cost":
        priced = [p for p in ps if p.cost_per_million is not None]
        if not priced:
            raise ValueError("none of the plans' chips has a listed price: use by='chip_hours'")
        ps = priced
    ok = [p for p in ps if p.step_time <= tgt]
    if not ok:
        f = fastest_plan(ps)
        which = "plan with a listed price" if by == "cost" else "plan"
        raise InfeasibleError(
            f"no {which} reaches {fmt_time(tgt)} per token: the fastest, {f.model} on "
            f"{f.n_chips} x {f.chip} ({f.weights_dtype}) at batch {f.batch}, takes "
            f"{fmt_time(f.step_time)} ({f.bound}-bound)")
    key = (lambda p: p.cost_per_million) if by == "cost" else (lambda p: p.chip_hours_per_million)
    return min(ok, key=lambda p: (key(p), p.step_time))
