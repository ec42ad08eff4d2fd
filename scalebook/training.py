"""The training planner (chapter 6): how many chips, how long, how much, with which sharding.

:func:`plan_training` puts chapter 5's schemes together for one LLaMA-style model on one kind
of chip. The mesh has four axes, innermost first::

    tp    tensor parallelism (Megatron, sequence-parallel activations)   heads, F split
    fsdp  ZeRO-3: weights, gradients and Adam state sharded               batch split
    pp    pipeline stages (1F1B, N_mb microbatches)                       layers split
    dp    data-parallel replicas (state replicated, gradients all-reduced) batch split

An axis runs on the fast network (TPU ICI; GPU NVLink) when it and every axis inside it fit
in one slice (``chip.max_slice_chips``, the largest one job can be given: 6,144 of a v5p
pod's 8,960 chips; ``chip.ici_domain_chips`` where no slice limit is listed), otherwise on
the scale-out network (``chip.dcn_bandwidth``; :func:`scalebook.parallelism.network`). Each mesh axis is timed as
one ring (a bidirectional torus ring on a TPU) by
:func:`scalebook.collectives.collective_time`; a real slice can lay a big axis over two or
three torus dimensions and go faster, so the times are upper bounds for TPUs.

Per chip, with B global tokens, b_copy = B / (n_dp n_fsdp) tokens per model copy (not the
b = B / n of the notation page), N_mb microbatches of b_mb = b_copy / N_mb tokens, N
parameters, s = 2 bytes (bf16), L layers, L_p = ceil(L / n_pp) layers per stage, the step
is timed pass by pass (the model of How to Scale Your Model's training chapter):

* each pass of one microbatch on the busiest stage (ceil(L / P) layers and the output head)
  has its compute (its share of the training FLOPs per token,
  models.training_flops_per_token, causal attention, at peak FLOP/s; the backward pass is
  twice the forward, plus what rematerialisation recomputes) and its collectives;
* tp: per layer 2 all-gathers and 2 reduce-scatters of the activations [b_mb, D] in the
  forward (attention and MLP, Megatron with sequence parallelism), the same in the backward
  (and again in a rematerialised forward). They are *exposed* by default: a layer's matmul
  waits for its gathered input. ``tp_overlap=True`` assumes a collective matmul (chapter 10)
  that hides them behind the matmuls, at best;
* fsdp: per microbatch, the stage's weights N s / (n_tp n_pp) are all-gathered in the forward
  and again in the backward, and the gradients reduce-scattered (ZeRO-3), prefetched behind
  the pass's compute; ``keep_weights=True`` gathers them once per step and keeps them (the
  LLaMA-3 run: no resharding after the forward), at the memory of a gathered stage and its
  gradients;
* pp: per microbatch a stage sends its output forward and its gradient back
  (collective-permutes of [b_mb / n_tp, D]), ``interleave`` times with an interleaved
  schedule of that many virtual stages per chip;
* a pass takes max(compute + exposed TP, the collectives of each network): those on one
  network queue behind each other, different networks run at once;
* the step is the pipeline's: (N_mb + (n_pp - 1) / interleave) x (forward + backward pass),
  every stage idle in the bubble (n_pp - 1) / (interleave N_mb + n_pp - 1) of the time
  (parallelism.bubble_fraction), plus whatever of the once-per-step collectives outlasts
  the pass they overlap, queued on their network behind that pass's own collectives: the
  dp all-reduce of each chip's gradient shard N s / (n_tp n_pp n_fsdp) after the last
  backward pass (ZeRO-1 or 2 on the dp axis, ``zero=1`` or ``2``: a reduce-scatter there,
  every microbatch's with ZeRO-2, and an all-gather of the updated shards before the first
  forward pass) and, with kept weights, the fsdp reduce-scatter after the last backward
  pass and the all-gather before the first forward pass;
* on a GPU, a collective over a group that spans nodes runs in two levels: within each
  8-GPU node over NVLink, then 1/8 of the bytes between nodes on each GPU's own NIC, the
  phases one after the other (:func:`scalebook.collectives.hierarchical_time`, chapter 11).
  Exposed, its NVLink phases count under "nvlink" and its NIC phases under "dcn" (the
  breakdown reports them apart); in the network queues it counts whole under "dcn";
* ep (a mixture of experts): per MoE layer a dispatch and a combine all-to-all
  (:func:`scalebook.collectives.expert_all_to_all`); across GPU nodes its NVLink part counts
  under "nvlink" and its InfiniBand part under "dcn", in the exposed time and in the plan's
  collectives (one entry per network). Every copy on its own, the parts run one after the
  other and queue whole on "dcn"; with node-limited routing (``Routing(max_nodes=...)``)
  NVLink forwards while InfiniBand sends, each part on its own network's queue.

The bound is the largest of the compute, the bubble and each network's exposed time. Memory
per chip: parallelism.training_memory_per_chip for the N / (n_tp n_pp) parameters of one
stage over n_fsdp chips (ZeRO-3; the fp32 master weights and Adam moments, and with
``zero=2`` the gradients, also over n_dp), plus the FSDP buffer (two gathered layers, bf16;
with kept weights the whole gathered stage and its bf16 gradients instead), plus
activations (models.activation_bytes_per_token, per microbatch, split over tp and the
stage's layers, times the microbatches in flight of
parallelism.pipeline_activation_microbatches). A plan fits when the total is at most
``hbm_fraction`` of the chip's HBM (default 0.9: the rest for the compiler's temporaries).

The search tries every (n_tp, n_pp, n_fsdp, n_dp, remat) that divides the chips and the
model (TP within one fast domain), every microbatch count that fits, keeps those that fit,
and picks the shortest step; among equal steps, the least memory. The options (tp_overlap,
keep_weights, zero, interleave) are the caller's: the search uses what it is given. A
configuration that cannot fit raises :class:`InfeasiblePlan`, which says by how much and
what would fit.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import textwrap
import warnings
from dataclasses import dataclass, field

from . import collectives as _coll
from . import parallelism as _par
from .hardware import Chip, get_chip
from .hardware import all_chips as _all_chips
from .models import MoEConfig, TransformerConfig, get_model
from .units import check_positive, fmt_bytes, fmt_time, sci

__all__ = ["REMAT", "Degrees", "Memory", "Collective", "Routing", "TrainingPlan",
           "InfeasiblePlan",
           "plan_training", "evaluate_plan", "check_plan", "search_plans",
           "mfu_from_throughput", "mfu_from_gpu_hours", "DEFAULT_HBM_FRACTION",
           "train_specs", "init_adam", "adam_train_step", "fp8_quantize",
           "FP8_E4M3_MAX", "ASSUMED_MFU", "LLAMA3_405B_TABLE4"]

REMAT = ("none", "selective", "full")
AXES = ("tp", "cp", "fsdp", "pp", "dp")     # mesh axes, innermost first
DEFAULT_HBM_FRACTION = 0.9
#: LLaMA-3 405B's pre-training (Table 4 of the LLaMA-3 paper, arXiv:2407.21783): GPUs,
#: TP, CP, PP, DP, sequence length, sequences per DP rank, achieved BF16 TFLOP/s per GPU
#: and MFU. Row 3 with DP = 8 (some copies print 4, which multiplies to neither 16,384
#: GPUs nor 16M tokens). Chapter 6 checks the planner against it.
LLAMA3_405B_TABLE4 = (
    dict(gpus=8192, tp=8, cp=1, pp=16, dp=64, seq=8192, per_dp=32, tflops=430, mfu=0.43),
    dict(gpus=16384, tp=8, cp=1, pp=16, dp=128, seq=8192, per_dp=16, tflops=400,
         mfu=0.41),
    dict(gpus=16384, tp=8, cp=16, pp=16, dp=8, seq=131072, per_dp=16, tflops=380,
         mfu=0.38),
)
# An achieved MFU to quote beside a plan's bound: well-tuned large runs report 38-43%
# (LLAMA3_405B_TABLE4). An assumption, not a measurement.
ASSUMED_MFU = 0.40
_DAY = 86_400.0
# Tokens per chip per step past which a plan is flagged: 2**20, some 500 times LLaMA-3
# 405B's (16M tokens on 8,192 GPUs), a step of minutes.
_MAX_TOKENS_PER_CHIP = 2**20


class InfeasiblePlan(ValueError):
    """No sharding of this model fits the chips' memory; the message says by how much and
    what would fit. ``best`` is the plan that came closest (it does not fit)."""

    def __init__(self, message: str, best=None):
        super().__init__(message)
        self.best = best


# ------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Degrees:
    """Parallel degrees; their product is the number of chips. ``cp`` (context
    parallelism) splits each sequence; it is 1 unless asked for."""

    tp: int
    fsdp: int
    pp: int
    dp: int
    cp: int = 1
    ep: int = 1         # expert parallelism: experts split over ep of the fsdp x dp chips

    @property
    def n_chips(self) -> int:
        return self.tp * self.cp * self.fsdp * self.pp * self.dp

    def __str__(self) -> str:
        cp = f" x CP {self.cp}" if self.cp > 1 else ""
        ep = f" (EP {self.ep})" if self.ep > 1 else ""
        return f"TP {self.tp}{cp} x FSDP {self.fsdp} x PP {self.pp} x DP {self.dp}{ep}"


@dataclass(frozen=True)
class Memory:
    """Bytes per chip."""

    weights: float
    gradients: float
    master_weights: float
    optimizer: float
    fsdp_buffer: float
    activations: float

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.master_weights + self.optimizer
                + self.fsdp_buffer + self.activations)

    def as_dict(self) -> dict:
        return {"weights": self.weights, "gradients": self.gradients,
                "master_weights": self.master_weights, "optimizer": self.optimizer,
                "fsdp_buffer": self.fsdp_buffer, "activations": self.activations}


@dataclass(frozen=True)
class Collective:
    """One scheme's collectives in a step: ``count`` of them of ``nbytes`` each (in
    collective_time's convention), ``seconds`` their summed time per step on ``network``,
    whether or not it is hidden behind the compute."""

    axis: str
    kind: str
    network: str
    seconds: float
    count: int
    nbytes: float


@dataclass(frozen=True)
class PassTime:
    """One pass (forward or backward) of one microbatch on one stage, in seconds.

    ``compute``: at peak FLOP/s. ``exposed``: {network: seconds} of collectives on the
    critical path (tensor- and context-parallel ones that a matmul waits for); one that
    runs hierarchically across GPU nodes counts its NVLink phases under "nvlink" and its
    NIC phases under "dcn". ``networks``: {network: seconds} of every collective of the
    pass, exposed ones included; those on one network queue behind each other, beside the
    compute (a hierarchical collective queues whole on "dcn", its phases in sequence)."""

    compute: float
    exposed: dict
    networks: dict

    @property
    def critical(self) -> float:
        """Compute plus the exposed collectives."""
        return self.compute + sum(self.exposed.values())

    @property
    def seconds(self) -> float:
        return max([self.critical] + list(self.networks.values()))

    @property
    def limit(self) -> str:
        """What sets the pass: "compute" (with its exposed collectives), or the network
        whose collectives take longer than that."""
        worst = max(self.networks, key=self.networks.get, default=None)
        if worst is None or self.networks[worst] <= self.critical:
            return "compute"
        return worst

    def parts(self) -> dict:
        """The pass split into "compute" and each network's share beyond it; adds up to
        :attr:`seconds`."""
        out = {"compute": self.compute}
        for net, sec in self.exposed.items():
            out[net] = out.get(net, 0.0) + sec
        if self.limit != "compute":     # then the pass waits for that network's queue
            out[self.limit] = out.get(self.limit, 0.0) + self.seconds - self.critical
        return out


@dataclass(frozen=True)
class Routing:
    """How a mixture-of-experts layer's tokens cross the scale-out network.

    ``max_nodes``: node-limited routing (DeepSeek-V3): a token's experts lie on at most
    this many nodes, and it crosses the network once per node, not once per expert (None:
    each of its k copies goes on its own). ``dispatch_bytes``: bytes per element sent to
    the experts (1 for an FP8 dispatch); the combine comes back in bf16."""

    max_nodes: int | None = None
    dispatch_bytes: float = 2.0

    def __post_init__(self):
        if self.max_nodes is not None:
            _int("max_nodes", self.max_nodes)
        check_positive("dispatch_bytes", self.dispatch_bytes)


@dataclass(frozen=True)
class TrainingPlan:
    """A training configuration and what it costs. Print it for a report."""

    model: str
    chip: str
    degrees: Degrees
    networks: dict
    reasons: dict
    global_batch_tokens: int
    seq_len: int
    microbatches: int
    remat: str
    memory: Memory
    hbm_bytes: float
    hbm_fraction: float
    forward: PassTime
    backward: PassTime
    collectives: tuple
    model_flops_per_step: float
    peak_flops: float
    train_tokens: float
    price_per_hour: float | None
    considered: int = 0
    notes: tuple = field(default=())
    fast_network: str = "ici"        # "nvlink" on a GPU
    step_start: dict = field(default_factory=dict)  # kept weights: the one all-gather
    step_end: dict = field(default_factory=dict)    # once-per-step collectives, per network
    tp_overlap: bool = False
    keep_weights: bool = False
    zero: int = 0
    interleave: int = 1
    ep_overlap: bool = False
    routing: Routing = field(default_factory=Routing)
    fp8: bool = False                # the linear layers' matmuls at the fp8 peak
    dualpipe: bool = False           # DualPipe's fill and drain instead of 1F1B's
    comm_sm_fraction: float = 0.0    # share of the compute units given to communication

    @property
    def n_chips(self) -> int:
        return self.degrees.n_chips

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.hbm_fraction * self.hbm_bytes

    def comm_seconds(self, network: str) -> float:
        """Seconds per step of all collectives on ``network`` ("ici"/"nvlink", "dcn"),
        hidden behind the compute or not."""
        return sum(c.seconds for c in self.collectives if c.network == network)

    @property
    def bubble(self) -> float:
        """Fraction of the step each stage idles in the pipeline's fill and drain:
        (P - 1) / (v N_mb + P - 1) with v the interleave."""
        if self.degrees.pp == 1:
            return 0.0
        if self.dualpipe:
            extra = self.slots - self.microbatches
            return extra / self.slots
        return _par.bubble_fraction(self.degrees.pp, self.microbatches, self.interleave)

    @property
    def slots(self) -> float:
        """(forward + backward) pass times on the pipeline's critical path:
        N_mb + (P - 1) / v; with DualPipe N_mb + (P / 2 - 1)(F&B + B - 3 W) / (F + B)
        (:func:`scalebook.parallelism.dualpipe_bubble` with F = 1, B = 2, W = 1: 2/3 of a
        pass pair per stage pair, against 1F1B's P - 1 pass pairs)."""
        return self.microbatches + _fill(self.degrees.pp, self.interleave, self.dualpipe)

    @property
    def pass_pair_seconds(self) -> float:
        return self.forward.seconds + self.backward.seconds

    @property
    def step_seconds(self) -> float:
        """slots x (forward + backward pass), plus what the once-per-step collectives add
        beyond the pass they overlap (the first forward, the last backward)."""
        return _step_time(self.forward, self.backward, self.step_start, self.step_end,
                          self.microbatches, self.degrees.pp, self.interleave,
                          self.dualpipe)

    @property
    def compute_seconds(self) -> float:
        """The step's compute at peak, without the bubble: N_mb x (forward + backward)."""
        return self.microbatches * (self.forward.compute + self.backward.compute)

    @property
    def breakdown(self) -> dict:
        """The step split into where its time goes: "compute", "bubble" (the fill and
        drain, (P - 1) / v pass pairs) and each network ("ici"/"nvlink", "dcn") for its
        exposed collectives; the values add up to :attr:`step_seconds`."""
        M = self.microbatches
        out = {"compute": 0.0, "bubble": (self.slots - M) * self.pass_pair_seconds}
        for pt in (self.forward, self.backward):
            for k, v in pt.parts().items():
                out[k] = out.get(k, 0.0) + M * v
        for extra, pt in ((self.step_start, self.forward), (self.step_end, self.backward)):
            e = _edge(extra, pt)
            if e:
                net = max(extra, key=lambda k: extra[k] + pt.networks.get(k, 0.0))
                out[net] = out.get(net, 0.0) + e
        return out

    @property
    def bound(self) -> str:
        """What bounds the step. The worse pass first (chapter 5): a network whose
        collectives in one pass take longer than the pass's compute bounds the step (the
        one with the largest ratio). Otherwise what takes the largest part of the step:
        "compute", "bubble", or a network ("ici", "nvlink", "dcn") for its exposed
        collectives."""
        worst, ratio = None, 1.0
        for pt in (self.forward, self.backward):
            for k, v in pt.networks.items():
                if v / pt.compute > ratio:
                    worst, ratio = k, v / pt.compute
        if worst is not None:
            return worst
        parts = self.breakdown
        return max(parts, key=parts.get)

    @property
    def comm_ratio(self) -> float:
        """Exposed communication and bubble over the compute (0: all hidden)."""
        return self.step_seconds / self.compute_seconds - 1

    @property
    def mfu(self) -> float:
        """Upper bound on MFU: model FLOPs (no remat) / (step x chips x peak)."""
        return self.model_flops_per_step / (self.step_seconds * self.n_chips * self.peak_flops)

    @property
    def tokens_per_second(self) -> float:
        return self.global_batch_tokens / self.step_seconds

    @property
    def days(self) -> float:
        """Days to train ``train_tokens`` at this step time (no failures, no restarts)."""
        return self.train_tokens / self.tokens_per_second / _DAY

    @property
    def chip_hours(self) -> float:
        return self.days * 24 * self.n_chips

    def days_at(self, mfu: float = ASSUMED_MFU) -> float:
        """Days to train ``train_tokens`` if the run achieves ``mfu`` of the chips' peak
        (the plan's own :attr:`days` are those at its bound, :attr:`mfu`). A run cannot
        beat its plan's bound: an ``mfu`` above :attr:`mfu` gives the bound's days."""
        mfu = check_positive("mfu", mfu)
        if mfu > 1:
            raise ValueError(f"mfu is a fraction of the peak (0.4 for 40%); got {mfu!r}")
        mfu = min(mfu, self.mfu)
        flops = self.model_flops_per_step / self.global_batch_tokens * self.train_tokens
        return flops / (self.n_chips * self.peak_flops * mfu) / _DAY

    def cost_at(self, mfu: float = ASSUMED_MFU) -> float | None:
        """Dollars at the listed price if the run achieves ``mfu``; None without a price."""
        days = self.days_at(mfu)
        return None if self.price_per_hour is None else days * 24 * self.n_chips * \
            self.price_per_hour

    @property
    def cost(self) -> float | None:
        """Dollars at the chip's listed price per chip-hour; None when it has none."""
        return None if self.price_per_hour is None else self.chip_hours * self.price_per_hour

    def options(self) -> list:
        """The plan's options, in words."""
        return [o for o, on in (("TP overlapped (collective matmul)", self.tp_overlap),
                                ("weights kept gathered", self.keep_weights),
                                (f"ZeRO-{self.zero} on dp", self.zero),
                                (f"interleave {self.interleave}", self.interleave > 1),
                                ("EP all-to-all overlapped", self.ep_overlap),
                                (f"tokens to at most {self.routing.max_nodes} nodes",
                                 self.routing.max_nodes and self.degrees.ep > 1),
                                (f"dispatch in {self.routing.dispatch_bytes:g}-byte "
                                 f"elements", self.routing.dispatch_bytes != 2
                                 and self.degrees.ep > 1),
                                ("linear layers in fp8", self.fp8),
                                ("DualPipe", self.dualpipe),
                                (f"{self.comm_sm_fraction:.0%} of the compute units on "
                                 f"communication", self.comm_sm_fraction)) if on]

    def __str__(self) -> str:
        d, m = self.degrees, self.memory
        head = f"{self.model} on {self.n_chips} x {self.chip}: {d}, "
        rest = f"{self.microbatches} microbatch(es), remat {self.remat}"
        lines = [head + rest] if len(head + rest) <= 100 else [head.rstrip(", "),
                                                               "  " + rest]
        if self.considered:
            lines.append(f"  (the fastest of {self.considered} configurations that fit)")
        opts = self.options()
        if opts:
            lines.append(textwrap.fill(", ".join(opts), 100, initial_indent="  options: ",
                                       subsequent_indent="    "))
        for axis in AXES + ("ep",):
            if axis in ("cp", "ep") and getattr(d, axis) == 1:
                continue
            net = self.networks[axis]
            net = self.fast_network if net == "ici" else net
            lines.append(f"  {axis:<4} {getattr(d, axis):>5}  on {net:<6}  "
                         f"{self.reasons[axis]}")
        lim = self.hbm_fraction * self.hbm_bytes
        over = ("" if self.fits else
                f" DOES NOT FIT, {fmt_bytes(m.total - lim)} over")
        lines.append(f"  memory per chip {fmt_bytes(m.total)} of {fmt_bytes(lim)} usable "
                     f"({self.hbm_fraction:.0%} of {fmt_bytes(self.hbm_bytes)}):{over}")
        parts = [f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in m.as_dict().items()]
        lines.append("    " + ", ".join(parts[:4]))
        lines.append("    " + ", ".join(parts[4:]))
        lines.append(f"  step {fmt_time(self.step_seconds)} = "
                     + " + ".join(f"{k} {fmt_time(v)}" for k, v in self.breakdown.items()
                                  if v > 0))
        for name, pt in (("forward", self.forward), ("backward", self.backward)):
            exp = ", ".join(f"{k} {fmt_time(v)}" for k, v in pt.exposed.items())
            nets = ", ".join(f"{k} {fmt_time(v)}" for k, v in pt.networks.items())
            wait = (f" + waiting for {pt.limit} {fmt_time(pt.seconds - pt.critical)}"
                    if pt.limit != "compute" else "")
            lines.append(f"    {name} pass {fmt_time(pt.seconds)}: compute "
                         f"{fmt_time(pt.compute)}" + (f" + exposed {exp}" if exp else "")
                         + wait)
            if nets:
                lines.append(f"      all its collectives: {nets}")
        if d.pp > 1:
            fill = (f"{self.slots - self.microbatches:.3g} (DualPipe)" if self.dualpipe
                    else f"{d.pp - 1}" + (f"/{self.interleave}" if self.interleave > 1
                                          else ""))
            lines.append(f"    x {self.microbatches} microbatches + {fill}"
                         + f" in the fill and drain (bubble {self.bubble:.1%})")
        for c in self.collectives:
            if c.count:
                lines.append(f"    {c.axis:<4} {c.kind:<18} x{c.count:<5} on {c.network:<6} "
                             f"{fmt_time(c.seconds)}")
        lines.append(f"  bound: {self.bound}; MFU upper bound {self.mfu:.1%}; "
                     f"{sci(self.tokens_per_second)} tokens/s")
        cost = ("no listed price for this chip in scalebook.hardware" if self.cost is None
                else f"${sci(self.cost)} at ${self.price_per_hour:.2f} per chip-hour")
        lines.append(f"  {sci(self.train_tokens)} tokens at the bound: {self.days:.3g} days, "
                     f"{sci(self.chip_hours)} chip-hours,")
        lines.append(f"    {cost}")
        at = self.cost_at()
        what = ("an assumed achieved figure" if ASSUMED_MFU <= self.mfu else
                f"the bound: the assumed {ASSUMED_MFU:.0%} is above it")
        lines.append(f"  at {min(ASSUMED_MFU, self.mfu):.0%} MFU ({what}): "
                     f"{self.days_at():.3g} days"
                     + ("" if at is None else f", ${sci(at)}"))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _fill(P: int, v: int, dualpipe: bool = False) -> float:
    """Pass pairs of the pipeline's fill and drain: (P - 1) / v, or DualPipe's
    dualpipe_bubble(P) / (F + B) with F = 1, B = 2 (0 without a pipeline)."""
    if P == 1:
        return 0.0
    if dualpipe:
        return _par.dualpipe_bubble(P) / 3
    return (P - 1) / v


def _step_time(fwd: PassTime, bwd: PassTime, start: dict, end: dict, M: int, P: int,
               v: int, dualpipe: bool = False) -> float:
    """(N_mb + fill) pass pairs, plus what the once-per-step collectives add."""
    return ((M + _fill(P, v, dualpipe)) * (fwd.seconds + bwd.seconds)
            + _edge(start, fwd) + _edge(end, bwd))


def _edge(extra: dict, pass_time: PassTime) -> float:
    """Seconds a once-per-step set of collectives outlasts the pass it overlaps: on each
    network it queues behind that pass's own collectives there."""
    return max([0.0] + [sec + pass_time.networks.get(net, 0.0) - pass_time.seconds
                        for net, sec in extra.items()])


# ------------------------------------------------------------------------------------------
# validation helpers
# ------------------------------------------------------------------------------------------

def _int(name, value, minimum=1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _fast_domain(chip: Chip, n_chips: int) -> int:
    """The most chips one job's fast network joins: the largest slice, else the domain."""
    return chip.max_slice_chips or chip.ici_domain_chips or n_chips


def _net_of(chip: Chip, inner: int, n_chips: int) -> str:
    domain = _fast_domain(chip, n_chips)
    return "ici" if inner <= domain else "dcn"


# ------------------------------------------------------------------------------------------
# one configuration
# ------------------------------------------------------------------------------------------

def _tp_ok(c: TransformerConfig, tp: int) -> bool:
    # Heads, F and D must split evenly. The key/value heads are not checked: with
    # tp > n_kv_heads a real layout replicates them (or splits a head, and XLA adds
    # collectives within the TP group); the plan prices neither.
    return c.n_heads % tp == 0 and c.d_ff % tp == 0 and c.d_model % tp == 0


class _MoEView:
    """A MoEConfig seen through the TransformerConfig methods the planner uses: shapes and
    attention from its dense config, parameters, FLOPs and activations with the experts
    (k routed and the shared ones per token, all E in memory)."""

    def __init__(self, moe: MoEConfig):
        self.moe, self._base = moe, moe.dense

    def __getattr__(self, name):
        return getattr(self._base, name)

    def num_params(self) -> int:
        return self.moe.total_params()

    def expert_params(self) -> int:
        return self.moe.expert_params()

    def forward_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        return (2 * self.moe.active_matmul_params()
                + self._base.attention_flops_per_token(seq_len, causal))

    def training_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        return 3 * self.forward_flops_per_token(seq_len, causal)

    def training_memory(self):
        return TransformerConfig.training_memory(self)

    def _extra(self, kept_per_mlp: int) -> float:
        """Elements per token an average layer keeps beyond the dense config's: the other
        k + shared - 1 expert MLPs' kept values, and the dispatched and combined copies."""
        m, b = self.moe, self._base
        per_moe = (m.top_k + m.n_shared - 1) * kept_per_mlp * b.d_ff + 2 * m.top_k * b.d_model
        dense = (m.dense_layers * kept_per_mlp * ((m.dense_d_ff or b.d_ff) - b.d_ff))
        return (m.moe_layers * per_moe + dense) / b.n_layers

    def activation_elements_per_layer_per_token(self) -> float:
        return self._base.activation_elements_per_layer_per_token() + self._extra(3)

    def saved_values_per_layer_per_token(self, policy: str) -> float:
        return self._base.saved_values_per_layer_per_token(policy) + self._extra(2)

    def activation_bytes_per_token(self, remat: bool = False) -> float:
        b = self._base
        layers = 1 if remat else b.n_layers
        return b.activation_bytes_per_token(remat=remat) + 2 * layers * self._extra(3)


def _experts(c) -> float:
    """Routed-expert parameters (0 for a dense model)."""
    return c.expert_params() if isinstance(c, _MoEView) else 0


def _layout(chip, deg: Degrees):
    n = deg.n_chips
    inner = 1
    nets = {}
    for axis in AXES:
        k = getattr(deg, axis)
        inner *= k
        nets[axis] = _net_of(chip, inner, n) if k > 1 else "-"
    if deg.ep > 1:      # the ep group: the innermost ep chips of the fsdp, then dp, axis
        span = deg.tp * deg.cp * deg.ep * (deg.pp if deg.ep > deg.fsdp else 1)
        nets["ep"] = _net_of(chip, span, n)
    return nets


def _inner_before(deg: Degrees) -> dict:
    """Each axis's stride: the product of the axes inside it (tp innermost)."""
    out, inner = {}, 1
    for axis in AXES:
        out[axis] = inner
        inner *= getattr(deg, axis)
    return out


def _activation_per_token(c: TransformerConfig, remat: str) -> float:
    """Activation bytes per token of the whole model (bf16) under ``remat``."""
    if remat == "selective":
        # each layer keeps what dots_with_no_batch_dims_saveable keeps; one layer's full
        # set is alive while it is recomputed; the head as in the other policies
        per_layer = c.saved_values_per_layer_per_token("weight_dots")
        head = 2 * c.d_model + c.vocab_size
        return 2 * (c.n_layers * per_layer + c.activation_elements_per_layer_per_token()
                    + head)
    return c.activation_bytes_per_token(remat=(remat == "full"))


def _memory(c: TransformerConfig, deg: Degrees, b_mb: float, M: int, remat: str,
            zero: int = 0, keep_weights: bool = False) -> Memory:
    E_p = _experts(c)
    N = c.num_params() - E_p              # what TP, PP and FSDP split (all of a dense model)
    L_p = math.ceil(c.n_layers / deg.pp)
    stage_params = N / (deg.tp * deg.pp)
    st = _par.training_memory_per_chip(stage_params, deg.fsdp, 3)
    grads, master, opt = st.gradients, st.master_weights, st.optimizer
    if zero >= 1:                        # ZeRO-1/2 on the dp axis: shard over dp as well
        master, opt = master / deg.dp, opt / deg.dp
    if zero >= 2:
        grads = grads / deg.dp
    weights = st.weights
    if E_p:     # the experts: split over ep (and tp, pp), their fp32 state over the
        # replicas too when FSDP or ZeRO shards state (each expert lives on dp fsdp / ep)
        e = E_p / (deg.tp * deg.pp * deg.ep)
        r = deg.dp * deg.fsdp // deg.ep if (zero or deg.fsdp > 1) else 1
        weights, grads = weights + 2 * e, grads + 2 * e / (r if zero >= 2 else 1)
        master, opt = master + 4 * e / r, opt + 8 * e / r
    if keep_weights and deg.fsdp > 1:    # the rest of the gathered stage, and its gradients
        buffer = 2 * 2 * stage_params * (deg.fsdp - 1) / deg.fsdp
    else:
        buffer = 2 * 2 * c.params_per_layer() / deg.tp if deg.fsdp > 1 else 0.0
    per_token = _activation_per_token(c, remat)
    in_flight = (_par.pipeline_activation_microbatches(deg.pp, M, "1f1b") if deg.pp > 1 else 1)
    # the layer part is split over the stage's layers; the head sits on one stage.
    head = (2 * c.d_model + c.vocab_size) * 2
    layers = (per_token - head) * L_p / c.n_layers
    act = (layers * in_flight + head) * b_mb / (deg.tp * deg.cp)
    return Memory(weights, grads, master, opt, buffer, act)


class _Timer:
    """One collective over a mesh axis: ``timer(kind, nbytes, axis)`` its seconds,
    ``timer.parts(kind, nbytes, axis)`` the same seconds by network. On a GPU, an axis
    whose group spans nodes but also has several GPUs in each node runs in two levels:
    over NVLink inside the node, then 1/local of the bytes between nodes (each GPU on its
    own NIC), the phases one after the other; its parts are then {"nvlink": the NVLink
    phases, "dcn": the NIC phases}. Any other collective is one part, on the axis's
    network ("ici"/"nvlink" or "dcn")."""

    def __init__(self, chip: Chip, deg: Degrees, nets: dict):
        self.chip, self.deg, self.nets = chip, deg, nets
        self.stride = _inner_before(deg)
        self.node = chip.ici_domain_chips or deg.n_chips
        self.fast = _par.network(chip, "ici")
        self.slow = _par.network(chip, "dcn") if "dcn" in nets.values() else None
        self.gpu = chip.vendor == "NVIDIA"
        self._cache = {}

    def parts(self, kind, nbytes, axis) -> dict:
        key = (kind, nbytes, axis)
        if key in self._cache:
            return self._cache[key]
        k = getattr(self.deg, axis)
        fast_name = "nvlink" if self.gpu else "ici"
        if self.nets[axis] != "dcn":
            out = {fast_name: _coll.collective_time(kind, nbytes, k,
                                                    bandwidth=self.fast.bandwidth,
                                                    topology=self.fast.topology)}
        else:
            local = (max(1, min(k, self.node // self.stride[axis])) if self.gpu else 1)
            if local == 1 or kind == "collective-permute" or k % local:
                out = {"dcn": _coll.collective_time(kind, nbytes, k,
                                                    bandwidth=self.slow.bandwidth,
                                                    topology=self.slow.topology)}
            else:       # chapter 11's hierarchical collective, its phases in sequence
                phases = _coll.hierarchical_phases(kind, nbytes, local, k // local,
                                                   fast_bandwidth=self.fast.bandwidth,
                                                   slow_bandwidth=self.slow.bandwidth)
                out = {}
                for ph in phases:
                    net = "nvlink" if ph.network == "nvlink" else "dcn"
                    out[net] = out.get(net, 0.0) + ph.seconds
        self._cache[key] = out
        return out

    def __call__(self, kind, nbytes, axis) -> float:
        return sum(self.parts(kind, nbytes, axis).values())


def _timer(chip: Chip, deg: Degrees, nets: dict) -> _Timer:
    """seconds(kind, nbytes, axis) for one collective over a mesh axis (see _Timer)."""
    return _Timer(chip, deg, nets)


def _all_to_all(chip: Chip, deg: Degrees, nets: dict, tokens: float, k: int, D: int,
                s: float, routing: Routing) -> tuple[dict, float, bool]:
    """One all-to-all of an MoE layer over the ep group: ``tokens`` per chip, each sending
    k copies of [D] at ``s`` bytes per element. Returns ({network: seconds}, seconds,
    whether the parts overlap). Within one fast domain, collective_time's, one part. A GPU
    group over several nodes: :func:`scalebook.collectives.expert_all_to_all`, its NVLink
    part under "nvlink" and its InfiniBand part under "dcn": every copy on its own (the
    parts one after the other), or with node-limited routing (``routing.max_nodes``) one
    crossing per node a token reaches and NVLink forwarding, the parts at once."""
    fast = _par.network(chip, "ici")
    nbytes = tokens * k * D * s
    if nets["ep"] != "dcn":
        t = _coll.collective_time("all-to-all", nbytes, deg.ep, bandwidth=fast.bandwidth,
                                  topology=fast.topology)
        return {"nvlink" if chip.vendor == "NVIDIA" else "ici": t}, t, False
    slow = _par.network(chip, "dcn")
    node = chip.ici_domain_chips or 1
    # the group's members sit tp cp apart within fsdp, or tp cp pp apart on dp
    stride = deg.tp * deg.cp * (1 if deg.fsdp > 1 else deg.pp)
    local = 1
    if chip.vendor == "NVIDIA" and stride < node:
        local = max(1, min(deg.ep, node // stride, deg.fsdp if deg.fsdp > 1 else deg.ep))
    a = _coll.expert_all_to_all(nbytes, k, local, deg.ep, fast_bandwidth=fast.bandwidth,
                                slow_bandwidth=slow.bandwidth, max_nodes=routing.max_nodes)
    parts = {"nvlink": a.nvlink, "dcn": a.nic} if a.nvlink else {"dcn": a.nic}
    return parts, a.seconds, a.overlapped


def _linear_flops_per_token(c) -> float:
    """Forward FLOPs per token of the linear layers DeepSeek-V3 runs in fp8
    (arXiv:2412.19437, section 3.3: attention projections and MLPs or experts), 2 x their
    matmul parameters one token meets: not the output head, not an MoE's router, not the
    attention's scores and values."""
    b = c.param_breakdown()
    head = b.embedding if c.tied_embeddings else b.output_head
    if isinstance(c, _MoEView):
        return 2 * (c.moe.active_matmul_params() - head - c.moe.router_params())
    return 2 * (c.matmul_params() - head)


def _remat_flops_per_token(c: TransformerConfig, S: int, remat: str) -> float:
    """Forward FLOPs per token recomputed in the backward pass: every layer's forward
    under "full", the attention matmuls under "selective" (the weight matmuls' outputs are
    kept), none under "none"."""
    if remat == "full":
        return c.forward_flops_per_token(S, causal=True) - 2 * c.param_breakdown().output_head
    if remat == "selective":
        return c.attention_flops_per_token(S, causal=True)
    return 0.0


def _passes(c: TransformerConfig, chip: Chip, deg: Degrees, nets: dict, B: int, S: int,
            M: int, remat: str, tp_overlap: bool, keep_weights: bool, zero: int,
            interleave: int, ep_overlap: bool = False, routing: Routing = Routing(),
            fp8: bool = False, comm_sm_fraction: float = 0.0):
    """(forward PassTime, backward PassTime, step_start, step_end, collectives per step)."""
    s = 2
    E_p = _experts(c)
    N = c.num_params() - E_p          # TP/PP/FSDP-split parameters; experts apart
    L_p = math.ceil(c.n_layers / deg.pp)
    b_mb = B / (deg.dp * deg.fsdp) / M            # tokens of one microbatch of one copy
    t = _timer(chip, deg, nets)
    gpu = chip.vendor == "NVIDIA"

    def netname(axis):
        net = nets[axis]
        return "nvlink" if net == "ici" and gpu else net

    # compute of one microbatch on the busiest stage: ceil(L / P) layers and the output
    # head (the last stage; with P = 1 the whole model)
    tokens = B * deg.pp / deg.n_chips / M        # tokens per chip per pass, one stage
    head = 2 * c.param_breakdown().output_head
    layer = (c.forward_flops_per_token(S, causal=True) - head) / c.n_layers
    fwd = (L_p * layer + head) * tokens
    extra = _remat_flops_per_token(c, S, remat) * L_p / c.n_layers * tokens
    peak = chip.bf16_flops
    comp_f, comp_b = fwd / peak, (2 * fwd + extra) / peak
    if fp8:     # the linear layers' three matmuls (forward, input and weight gradient) at
        # the fp8 peak; attention, router, head (and recomputed attention) stay bf16. Under
        # full remat the recomputed forward's linear layers run in fp8 as well.
        lin = _linear_flops_per_token(c) / c.n_layers * L_p * tokens
        again_lin = lin if remat == "full" else 0.0
        peak8 = chip.peak_flops("fp8")
        comp_f = lin / peak8 + (fwd - lin) / peak
        comp_b = ((2 * lin + again_lin) / peak8
                  + (2 * fwd - 2 * lin + extra - again_lin) / peak)
    # compute units given to communication kernels (DeepSeek-V3: 20 of an H800's 132 SMs)
    # leave 1 - comm_sm_fraction of the peak to the matmuls
    comp_f, comp_b = comp_f / (1 - comm_sm_fraction), comp_b / (1 - comm_sm_fraction)

    f_nets, b_nets, start, end = {}, {}, {}, {}
    f_exp, b_exp = {}, {}
    colls = []
    again = remat in ("full", "selective")       # layers re-run (part of) their forward

    def add(d, net, sec):
        if sec:
            d[net] = d.get(net, 0.0) + sec

    def merged(*parts):
        out = {}
        for p in parts:
            for k, v in p.items():
                out[k] = out.get(k, 0.0) + v
        return out

    def add_split(d, parts, sec):
        # ``sec`` seconds of exposed collectives whose phases are ``parts`` ({network:
        # seconds}, summing to the collectives' time): each network gets its share, so a
        # hierarchical collective's NVLink phases count under "nvlink", its NIC's under "dcn"
        total = sum(parts.values())
        for k, v in parts.items():
            add(d, k, sec * (v / total) if total else 0.0)

    if deg.tp > 1:
        act = b_mb / deg.cp * c.d_model * s
        pair_parts = merged(t.parts("all-gather", act, "tp"),
                            t.parts("reduce-scatter", act, "tp"))
        pair = t("all-gather", act, "tp") + t("reduce-scatter", act, "tp")
        n_f = 2 * L_p                             # attention and MLP, one pair each
        n_b = 2 * L_p + (2 * L_p if remat == "full" else 0)
        f_tp, b_tp = n_f * pair, n_b * pair
        net = netname("tp")
        add(f_nets, net, f_tp)
        add(b_nets, net, b_tp)
        if tp_overlap:      # collective matmul (chapter 10): one chunk of n_tp is not hidden
            hide = (deg.tp - 1) / deg.tp
            add_split(f_exp, pair_parts, max(0.0, f_tp - hide * comp_f))
            add_split(b_exp, pair_parts, max(0.0, b_tp - hide * comp_b))
        else:
            add_split(f_exp, pair_parts, f_tp)
            add_split(b_exp, pair_parts, b_tp)
        n = (n_f + n_b) * M
        colls.append(Collective("tp", "all-gather", net, n * t("all-gather", act, "tp"),
                                n, act))
        colls.append(Collective("tp", "reduce-scatter", net,
                                n * t("reduce-scatter", act, "tp"), n, act))
    if deg.cp > 1:
        # all-gather-based context parallelism (the LLaMA-3 run): each layer gathers the
        # keys and values of the whole sequence; the backward gathers them again and
        # reduce-scatters their gradients. The attention waits for them: exposed.
        kv = b_mb * 2 * c.kv_dim * s / min(deg.tp, c.n_kv_heads)
        ag, rs = t("all-gather", kv, "cp"), t("reduce-scatter", kv, "cp")
        net = netname("cp")
        add(f_nets, net, L_p * ag)
        add(b_nets, net, L_p * (ag + rs))
        add_split(f_exp, t.parts("all-gather", kv, "cp"), L_p * ag)
        add_split(b_exp, merged(t.parts("all-gather", kv, "cp"),
                                t.parts("reduce-scatter", kv, "cp")), L_p * (ag + rs))
        colls.append(Collective("cp", "all-gather", net, 2 * L_p * M * ag, 2 * L_p * M, kv))
        colls.append(Collective("cp", "reduce-scatter", net, L_p * M * rs, L_p * M, kv))
    if deg.fsdp > 1:
        w = N * s / (deg.tp * deg.pp)
        ag, rs = t("all-gather", w, "fsdp"), t("reduce-scatter", w, "fsdp")
        net = netname("fsdp")
        if keep_weights:
            add(start, net, ag)
            add(end, net, rs)
            colls.append(Collective("fsdp", "all-gather", net, ag, 1, w))
            colls.append(Collective("fsdp", "reduce-scatter", net, rs, 1, w))
        else:
            add(f_nets, net, ag)
            add(b_nets, net, ag + rs)
            colls.append(Collective("fsdp", "all-gather", net, 2 * M * ag, 2 * M, w))
            colls.append(Collective("fsdp", "reduce-scatter", net, M * rs, M, w))
    if deg.pp > 1:
        a = b_mb / deg.cp * c.d_model * s / deg.tp
        perm = interleave * t("collective-permute", a, "pp")
        net = netname("pp")
        add(f_nets, net, perm)
        add(b_nets, net, perm)
        n = 2 * M * interleave
        colls.append(Collective("pp", "collective-permute", net,
                                n * t("collective-permute", a, "pp"), n, a))
    if deg.ep > 1:
        # each MoE layer sends every token's k copies to their experts and back (dispatch,
        # combine) in the forward, and the gradients the same way in the backward
        m = c.moe
        tok = b_mb / (deg.cp * deg.tp)
        a2a = tok * m.top_k * c.d_model * s
        # a dispatch (at routing.dispatch_bytes) and a combine (bf16), as a mean of the two
        disp = _all_to_all(chip, deg, nets, tok, m.top_k, c.d_model,
                           routing.dispatch_bytes, routing)
        comb = _all_to_all(chip, deg, nets, tok, m.top_k, c.d_model, s, routing)
        parts = merged(*({k2: v / 2 for k2, v in x[0].items()} for x in (disp, comb)))
        t_a2a, overlapped = (disp[1] + comb[1]) / 2, disp[2]
        moe_l = L_p * m.moe_layers / c.n_layers        # MoE layers of the busiest stage
        n_f = 2 * moe_l
        n_b = 2 * moe_l + (2 * moe_l if remat == "full" else 0)
        net = netname("ep")
        if overlapped:      # node-limited: NVLink forwards while InfiniBand sends
            for k2, v in parts.items():
                add(f_nets, k2, n_f * v)
                add(b_nets, k2, n_b * v)
        else:               # one part after the other: queued whole on the ep network
            add(f_nets, net, n_f * t_a2a)
            add(b_nets, net, n_b * t_a2a)
        if not ep_overlap:      # the experts wait for their tokens: each part on its
            # network, or (overlapped parts) the whole on the slower one
            if overlapped:
                add(f_exp, max(parts, key=parts.get), n_f * t_a2a)
                add(b_exp, max(parts, key=parts.get), n_b * t_a2a)
            else:
                add_split(f_exp, parts, n_f * t_a2a)
                add_split(b_exp, parts, n_b * t_a2a)
        n = round((n_f + n_b) * M)
        # one entry per network: the InfiniBand part first, then the NVLink part
        for k2 in sorted(parts, key=lambda x: x != "dcn"):
            colls.append(Collective("ep", "all-to-all", k2, n * parts[k2], n, a2a))
    if E_p:
        # the experts' gradients: summed over the dp fsdp / ep chips holding each expert
        r = deg.dp * deg.fsdp // deg.ep
        if r > 1:
            ge = E_p * s / (deg.tp * deg.pp * deg.ep)
            net = "dcn" if "dcn" in nets.values() else ("nvlink" if gpu else "ici")
            slow = _par.network(chip, "dcn" if net == "dcn" else "ici")
            ar = _coll.collective_time("all-reduce", ge, r, bandwidth=slow.bandwidth,
                                       topology=slow.topology)
            add(end, net, ar)
            colls.append(Collective("ep", "all-reduce", net, ar, 1, ge))
    g = N * s / (deg.tp * deg.pp * deg.fsdp)      # each chip's gradient shard
    if deg.cp > 1:      # the cp ranks saw different tokens: sum their gradients
        ar = t("all-reduce", g, "cp")
        add(end, netname("cp"), ar)
        colls.append(Collective("cp", "all-reduce", netname("cp"), ar, 1, g))
    if deg.dp > 1:
        net = netname("dp")
        if zero:
            rs, ag = t("reduce-scatter", g, "dp"), t("all-gather", g, "dp")
            if zero >= 2:   # gradients sharded: reduce-scatter each microbatch's
                add(b_nets, net, rs)
                colls.append(Collective("dp", "reduce-scatter", net, M * rs, M, g))
            else:
                add(end, net, rs)
                colls.append(Collective("dp", "reduce-scatter", net, rs, 1, g))
            # the updated shards are gathered after the optimizer step, before (and
            # prefetched behind) the next step's first forward pass
            add(start, net, ag)
            colls.append(Collective("dp", "all-gather", net, ag, 1, g))
        else:
            sec = t("all-reduce", g, "dp")
            colls.append(Collective("dp", "all-reduce", net, sec, 1, g))
            add(end, net, sec)
    return (PassTime(comp_f, f_exp, f_nets), PassTime(comp_b, b_exp, b_nets),
            start, end, tuple(colls))


# why each axis is used (or not): (when its degree is above 1, when it is 1)
_REASONS = {
    "tp": ("splits heads and F; activations move every layer",
           "not needed: FSDP and the batch carry the chips"),
    "cp": ("splits each sequence; keys and values gathered every layer", "not used"),
    "ep": ("splits the experts over the data chips; tokens sent to them and back",
           "not used"),
    "fsdp": ("shards weights, gradients, Adam state", "not used"),
    "pp": ("splits the layers; sends activations between stages",
           "not needed: state and activations fit without it"),
    "dp": ("replicas; one gradient reduction per step", "not used"),
}


def _reasons(c, chip, deg: Degrees, nets, fixed: dict, keep_weights=False) -> dict:
    out = {axis: "fixed by the caller" if axis in fixed else used if getattr(deg, axis) > 1
           else unused for axis, (used, unused) in _REASONS.items()}
    if keep_weights and deg.fsdp > 1 and "fsdp" not in fixed:
        out["fsdp"] = "shards Adam state; weights gathered once per step and kept"
    return out


def _check_model_chip(model, chip):
    if isinstance(model, _MoEView):
        c = model
    elif isinstance(model, MoEConfig):
        c = _MoEView(model)
    else:
        c = get_model(model)
    ch = get_chip(chip)
    return c, ch


def _check_batch(c, B, S):
    B = _int("global_batch_tokens", B)
    S = _int("seq_len", S)
    if B % S:
        raise ValueError(f"global_batch_tokens={B} is not a whole number of sequences of "
                         f"seq_len={S}; use a multiple of {S}")
    return B, S


def _check_options(remat, zero, interleave, hbm_fraction):
    if remat not in REMAT:
        raise ValueError(f"remat must be one of {REMAT}; got {remat!r}")
    if zero not in (0, 1, 2) or isinstance(zero, bool):
        raise ValueError(f"zero must be 0, 1 or 2 (the ZeRO stage on the dp axis; FSDP is "
                         f"stage 3); got {zero!r}")
    interleave = _int("interleave", interleave)
    f = check_positive("hbm_fraction", hbm_fraction)
    if f > 1:
        raise ValueError(f"hbm_fraction must be at most 1; got {f}")
    return interleave, f


def _build(c, ch, deg, B, S, M, remat, tp_overlap, keep_weights, zero, interleave, f,
           train_tokens, fixed, considered, mem=None, ep_overlap=False,
           routing=Routing(), fp8=False, dualpipe=False,
           comm_sm_fraction=0.0) -> TrainingPlan:
    """A plan from checked inputs."""
    nets = _layout(ch, deg)
    if mem is None:
        mem = _memory(c, deg, B / (deg.dp * deg.fsdp) / M, M, remat, zero, keep_weights)
    if dualpipe:        # DualPipe keeps a second copy of its stages' bf16 weights
        second = 2 * ((c.num_params() - _experts(c)) / (deg.tp * deg.pp)
                      + _experts(c) / (deg.tp * deg.pp * deg.ep))
        mem = dataclasses.replace(mem, weights=mem.weights + second)
        ep_overlap = True
    fwd, bwd, start, end, colls = _passes(c, ch, deg, nets, B, S, M, remat, tp_overlap,
                                          keep_weights, zero, interleave, ep_overlap,
                                          routing, fp8, comm_sm_fraction)
    L_p = math.ceil(c.n_layers / deg.pp)
    imbalance = deg.pp * L_p / c.n_layers
    notes = []
    if imbalance > 1:
        notes.append(f"{c.n_layers} layers over {deg.pp} stages: {L_p} per stage, "
                     f"{imbalance - 1:.1%} idle on the lighter stages")
    per_chip = B / deg.n_chips
    if per_chip > _MAX_TOKENS_PER_CHIP:
        msg = (f"{B:,} tokens per step is {per_chip:,.0f} per chip: far beyond what "
               f"large runs use (LLaMA-3 405B: 16M tokens on 8,192-16,384 GPUs, about "
               f"2,000 per GPU); the optimiser would update once every "
               f"{fmt_time(per_chip * c.training_flops_per_token(S, True) / ch.bf16_flops)}"
               f" or more")
        notes.append(msg)
    return TrainingPlan(
        model=c.name, chip=ch.name, degrees=deg, networks=nets,
        reasons=_reasons(c, ch, deg, nets, fixed or {}, keep_weights), global_batch_tokens=B, seq_len=S,
        microbatches=M, remat=remat, memory=mem, hbm_bytes=ch.hbm_bytes, hbm_fraction=f,
        forward=fwd, backward=bwd, collectives=colls,
        model_flops_per_step=c.training_flops_per_token(S, causal=True) * B,
        peak_flops=ch.bf16_flops, train_tokens=train_tokens,
        price_per_hour=ch.price_per_hour, considered=considered, notes=tuple(notes),
        fast_network="nvlink" if ch.vendor == "NVIDIA" else "ici",
        step_start=start, step_end=end, tp_overlap=bool(tp_overlap),
        keep_weights=bool(keep_weights and deg.fsdp > 1), zero=zero if deg.dp > 1 else 0,
        interleave=interleave, ep_overlap=bool(ep_overlap and deg.ep > 1), routing=routing,
        fp8=bool(fp8), dualpipe=bool(dualpipe and deg.pp > 1),
        comm_sm_fraction=comm_sm_fraction)


def evaluate_plan(model, chip, *, tp: int, fsdp: int, pp: int = 1, dp: int = 1, cp: int = 1,
                  ep: int = 1, global_batch_tokens: int, seq_len: int, microbatches: int = 1,
                  remat: str = "none", tp_overlap: bool = False, keep_weights: bool = False,
                  zero: int = 0, interleave: int = 1, ep_overlap: bool = False,
                  routing: Routing | None = None, train_tokens: float = 15e12,
                  hbm_fraction: float = DEFAULT_HBM_FRACTION, fp8: bool = False,
                  dualpipe: bool = False, comm_sm_fraction: float = 0.0, _fixed=None,
                  _considered: int = 0) -> TrainingPlan:
    """The plan for one given configuration (it may not fit: see ``plan.fits``).

    ``remat``: "none", "selective" (keep the weight matmuls' outputs, recompute the
    attention) or "full"; ``tp_overlap``: hide the TP collectives behind the matmuls with a
    collective matmul (at best; default: exposed); ``keep_weights``: gather the FSDP
    weights once per step and keep them; ``zero``: 0, 1 or 2, the ZeRO stage of the dp
    axis; ``interleave``: virtual pipeline stages per chip; ``cp``: context parallelism;
    ``ep``: expert parallelism for a :class:`~scalebook.models.MoEConfig` (the experts
    split over ep of the fsdp x dp chips, tokens sent to them by all-to-all, exposed unless
    ``ep_overlap``, as DualPipe overlaps one microbatch's with another's compute;
    ``routing`` a :class:`Routing` for how its tokens cross the network).
    ``fp8``: the linear layers' matmuls (forward, input and weight gradients) at the chip's
    fp8 peak, the rest (attention scores and values, router, output head, recomputation
    of attention) at bf16, as DeepSeek-V3 trains (MFU stays counted against the bf16
    peak). ``dualpipe``: DeepSeek-V3's DualPipe schedule: its fill and drain
    (:func:`scalebook.parallelism.dualpipe_bubble`, P even, N_mb even), the expert
    all-to-alls overlapped (``ep_overlap``) and a second copy of the stage's bf16 weights
    in memory. ``comm_sm_fraction``: the share of the chip's compute units given to
    communication kernels while they overlap the compute (DeepSeek-V3: 20 of an H800's 132
    SMs); every pass's compute then takes 1 / (1 - comm_sm_fraction) as long.
    Refuses degrees that do not divide the model (heads, F, layers), the sequence (cp) or
    the batch (whole sequences per data shard and per microbatch)."""
    c, ch = _check_model_chip(model, chip)
    B, S = _check_batch(c, global_batch_tokens, seq_len)
    deg = Degrees(_int("tp", tp), _int("fsdp", fsdp), _int("pp", pp), _int("dp", dp),
                  _int("cp", cp), _int("ep", ep))
    _check_ep(c, deg)
    M = _int("microbatches", microbatches)
    interleave, f = _check_options(remat, zero, interleave, hbm_fraction)
    if not _tp_ok(c, deg.tp):
        raise ValueError(f"tp={deg.tp} must divide n_heads={c.n_heads}, d_ff={c.d_ff} and "
                         f"d_model={c.d_model} of {c.name}")
    if deg.pp > c.n_layers:
        raise ValueError(f"pp={deg.pp} is more than the {c.n_layers} layers of {c.name}")
    if interleave > math.ceil(c.n_layers / deg.pp):
        raise ValueError(f"interleave={interleave} needs at least that many layers per "
                         f"stage; {c.name} has {math.ceil(c.n_layers / deg.pp)} at pp={deg.pp}")
    if S % deg.cp:
        raise ValueError(f"cp={deg.cp} must divide seq_len={S} (each chip takes S / cp "
                         f"tokens of every sequence)")
    seqs = B // S
    if seqs % (deg.dp * deg.fsdp):
        raise ValueError(f"{seqs} sequences per batch do not split over dp x fsdp = "
                         f"{deg.dp * deg.fsdp} data shards")
    if (seqs // (deg.dp * deg.fsdp)) % M:
        raise ValueError(f"{seqs // (deg.dp * deg.fsdp)} sequences per data shard do not split "
                         f"into {M} microbatches")
    tokens = check_positive("train_tokens", train_tokens)
    for name, flag in (("fp8", fp8), ("dualpipe", dualpipe)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False; got {flag!r}")
    if isinstance(comm_sm_fraction, bool) or not isinstance(comm_sm_fraction, numbers.Real) \
            or not 0 <= comm_sm_fraction < 1:
        raise ValueError(f"comm_sm_fraction is the share of the chip's compute units given "
                         f"to communication, in [0, 1); got {comm_sm_fraction!r}")
    if fp8 and not ch.fp8_flops:
        raise ValueError(f"fp8=True: {ch.name} has no fp8 peak in scalebook.hardware; chips "
                         f"with one: {', '.join(x.name for x in _all_chips() if x.fp8_flops)}")
    if dualpipe:
        if deg.pp < 2 or deg.pp % 2:
            raise ValueError(f"dualpipe=True needs an even number of pipeline stages, at "
                             f"least 2; got pp={deg.pp}")
        if M % 2 or interleave != 1:
            raise ValueError(f"dualpipe=True feeds microbatches from both ends: it needs an "
                             f"even number of them (got microbatches={M}) and no interleave "
                             f"(got {interleave})")
    return _warned(_build(c, ch, deg, B, S, M, remat, tp_overlap, keep_weights, zero,
                          interleave, f, tokens, _fixed, _considered,
                          ep_overlap=ep_overlap, routing=_routing(routing), fp8=fp8,
                          dualpipe=dualpipe, comm_sm_fraction=float(comm_sm_fraction)))


def _routing(routing) -> Routing:
    if routing is None:
        return Routing()
    if not isinstance(routing, Routing):
        raise TypeError(f"routing must be a training.Routing; got {type(routing).__name__}")
    return routing


def _check_ep(c, deg: Degrees) -> None:
    if deg.ep == 1:
        return
    if not isinstance(c, _MoEView):
        raise ValueError(f"ep={deg.ep}: expert parallelism needs a mixture-of-experts model "
                         f"(a MoEConfig); {c.name} is dense")
    E, data = c.moe.n_experts, deg.dp * deg.fsdp
    if E % deg.ep or data % deg.ep:
        raise ValueError(f"ep={deg.ep} must divide the {E} experts and the dp x fsdp = {data} "
                         f"data chips it is carved from")


def _warned(plan: TrainingPlan) -> TrainingPlan:
    """Warn of a batch far beyond any real run's (the note says why)."""
    for note in plan.notes:
        if "far beyond" in note:
            warnings.warn(note, stacklevel=3)
    return plan


def check_plan(plan: TrainingPlan) -> None:
    """Raise a ValueError unless ``plan`` fits its chips' memory (the validator the
    exercises use)."""
    if not isinstance(plan, TrainingPlan):
        raise TypeError(f"expected a TrainingPlan; got {type(plan).__name__}")
    lim = plan.hbm_fraction * plan.hbm_bytes
    if not plan.fits:
        raise ValueError(f"{plan.degrees} needs {fmt_bytes(plan.memory.total)} per chip, "
                         f"{fmt_bytes(plan.memory.total - lim)} over the usable {fmt_bytes(lim)}")


# ------------------------------------------------------------------------------------------
# the search
# ------------------------------------------------------------------------------------------

_PINNABLE = ("tp", "cp", "fsdp", "pp", "dp", "ep", "microbatches")


def _candidates(c, ch, n, S, seqs, fixed):
    domain = _fast_domain(ch, n)
    cps = [fixed.get("cp", 1)]
    for cp in cps:
        if n % cp or S % cp:
            continue
        for tp in _divisors(n // cp):
            if "tp" in fixed and tp != fixed["tp"]:
                continue
            if not _tp_ok(c, tp) or tp > domain:
                continue
            for pp in _divisors(n // (tp * cp)):
                if ("pp" in fixed and pp != fixed["pp"]) or pp > c.n_layers:
                    continue
                rest = n // (tp * cp * pp)
                for fsdp in _divisors(rest):
                    dp = rest // fsdp
                    if (("fsdp" in fixed and fsdp != fixed["fsdp"])
                            or ("dp" in fixed and dp != fixed["dp"])):
                        continue
                    if seqs % (dp * fsdp):
                        continue
                    if isinstance(c, _MoEView):
                        E = c.moe.n_experts
                        eps = [e for e in _divisors(dp * fsdp) if E % e == 0]
                    else:
                        eps = [1]
                    for ep in eps:
                        if "ep" in fixed and ep != fixed["ep"]:
                            continue
                        deg = Degrees(tp, fsdp, pp, dp, cp, ep)
                        if ch.dcn_bandwidth is None and "dcn" in _layout(ch, deg).values():
                            continue        # no scale-out figure: only one fast domain
                        yield deg


def _choices(value, default):
    return default if value is None else (value,)


def search_plans(model, chip, n_chips: int, global_batch_tokens: int, seq_len: int, *,
                 remat: str | None = None, tp_overlap: bool = False,
                 keep_weights: bool | None = None, zero: int | None = None,
                 interleave: int = 1, ep_overlap: bool = False,
                 hbm_fraction: float = DEFAULT_HBM_FRACTION,
                 train_tokens: float = 15e12, **fixed) -> tuple[list, TrainingPlan | None]:
    """Every configuration's best plan: (fitting plans sorted by step time, the closest
    non-fitting plan or None).

    For each split (TP x CP x FSDP x PP x DP) it tries every microbatch count, weights
    kept gathered or not, and takes the first remat policy ("none", "selective", "full")
    and ZeRO stage on dp (1, then 2; 0 has ZeRO-1's time and more memory) that fit.
    ``remat``, ``keep_weights`` and ``zero`` pin those; ``tp_overlap`` and ``interleave``
    are the caller's assumptions, and ``ep_overlap``; ``fixed`` may pin tp, cp, fsdp, pp,
    dp, ep or microbatches (cp is 1 unless pinned; ep is searched for a MoEConfig)."""
    c, ch = _check_model_chip(model, chip)
    n = _int("n_chips", n_chips)
    B, S = _check_batch(c, global_batch_tokens, seq_len)
    for k in fixed:
        if k not in _PINNABLE:
            raise TypeError(f"unknown option {k!r}; pin one of {', '.join(_PINNABLE)}")
    remats = _choices(remat, REMAT)
    for r in remats:
        _check_options(r, 0 if zero is None else zero, interleave, hbm_fraction)
    interleave, f = _check_options(remats[0], 0 if zero is None else zero, interleave,
                                   hbm_fraction)
    tokens = check_positive("train_tokens", train_tokens)
    axes = {k: _int(k, v) for k, v in fixed.items() if k != "microbatches"}
    if "microbatches" in fixed:
        _int("microbatches", fixed["microbatches"])
    prod = math.prod(axes.values()) if axes else 1
    if n % prod:
        raise ValueError(f"the pinned degrees {axes} multiply to {prod}, which does not "
                         f"divide n_chips={n}")
    seqs = B // S
    lim = f * ch.hbm_bytes
    fits, closest = [], None
    for deg in _candidates(c, ch, n, S, seqs, axes):
        if interleave > math.ceil(c.n_layers / deg.pp):
            continue
        nets = _layout(ch, deg)
        per_shard = seqs // (deg.dp * deg.fsdp)
        Ms = _divisors(per_shard)
        if "microbatches" in fixed:
            Ms = [m for m in Ms if m == fixed["microbatches"]]
        keeps = _choices(keep_weights, (False, True)) if deg.fsdp > 1 else (False,)
        zeros = _choices(zero, (1, 2)) if deg.dp > 1 else (0,)
        best = None
        for M in Ms:
            b_mb = B / (deg.dp * deg.fsdp) / M
            for keep in keeps:
                for r in remats:
                    fitted = False
                    for z in zeros:
                        mem = _memory(c, deg, b_mb, M, r, z, keep)
                        if mem.total > lim:
                            if closest is None or mem.total < closest[0]:
                                closest = (mem.total, deg, M, r, keep, z)
                            continue
                        fwd, bwd, start, end, _ = _passes(c, ch, deg, nets, B, S, M, r,
                                                          tp_overlap, keep, z, interleave,
                                                          ep_overlap)
                        key = (_step_time(fwd, bwd, start, end, M, deg.pp, interleave),
                               mem.total)
                        if best is None or key < best[0]:
                            best = (key, M, keep, r, z, mem)
                        fitted = True
                        break
                    if fitted:
                        break        # a heavier remat policy is never faster
        if best is not None:
            _, M, keep, r, z, mem = best
            fits.append(_build(c, ch, deg, B, S, M, r, tp_overlap, keep, z, interleave, f,
                               tokens, axes, 0, mem, ep_overlap))
    fits.sort(key=lambda p: (p.step_seconds, p.memory.total))
    best_bad = None
    if closest is not None:
        _, deg, M, r, keep, z = closest
        best_bad = _build(c, ch, deg, B, S, M, r, tp_overlap, keep, z, interleave, f, tokens,
                          axes, 0, ep_overlap=ep_overlap)
    return fits, best_bad


def plan_training(model, chip, n_chips: int, global_batch_tokens: int, seq_len: int, *,
                  train_tokens: float = 15e12, remat: str | None = None,
                  tp_overlap: bool = False, keep_weights: bool | None = None,
                  zero: int | None = None, interleave: int = 1, ep_overlap: bool = False,
                  hbm_fraction: float = DEFAULT_HBM_FRACTION, **fixed) -> TrainingPlan:
    """The fastest configuration that fits (see the module docstring for the model).

    ``model``: a name ("llama3-70b") or a TransformerConfig; ``chip``: a name or a Chip;
    ``global_batch_tokens`` B and ``seq_len`` S (B a multiple of S); ``train_tokens`` for
    days and cost; ``remat``, ``keep_weights``, ``zero``: pin them (default: searched);
    ``tp_overlap``, ``interleave``: assumptions (default: exposed TP, plain 1F1B);
    ``fixed``: pin any of tp, cp, fsdp, pp, dp, microbatches. Raises
    :class:`InfeasiblePlan` when nothing fits, with what would."""
    opts = dict(remat=remat, tp_overlap=tp_overlap, keep_weights=keep_weights, zero=zero,
                interleave=interleave, ep_overlap=ep_overlap, hbm_fraction=hbm_fraction,
                train_tokens=train_tokens)
    fits, closest = search_plans(model, chip, n_chips, global_batch_tokens, seq_len,
                                 **opts, **fixed)
    if fits:
        return _warned(dataclasses.replace(fits[0], considered=len(fits)))
    c, ch = _check_model_chip(model, chip)
    raise InfeasiblePlan(_infeasible_message(c, ch, n_chips, global_batch_tokens, seq_len,
                                             opts, fixed, closest), closest)


def _infeasible_message(c, ch, n, B, S, opts, fixed, closest) -> str:
    f = opts["hbm_fraction"]
    lim = f * ch.hbm_bytes
    head = f"{c.name} does not fit on {n} x {ch.name}"
    if fixed:
        head += f" with {fixed}"
    if closest is None and ch.dcn_bandwidth is None and n > _fast_domain(ch, n):
        return (head + f": {n} chips span more than one {_fast_domain(ch, n)}-chip domain and "
                f"{ch.name} has no dcn_bandwidth in scalebook.hardware; use at most "
                f"{_fast_domain(ch, n)} chips or get_chip({ch.name!r}).with_(dcn_bandwidth=...)")
    if closest is None:
        return (head + ": no configuration divides the chips, the model and the "
                f"{B // S} sequences of the batch; choose a chip count with more factors "
                f"of 2 or a batch with more sequences")
    over = closest.memory.total - lim
    msg = [head + f": the closest ({closest.degrees}, {closest.microbatches} microbatch(es), "
           f"remat {closest.remat}) needs {fmt_bytes(closest.memory.total)} per chip, "
           f"{fmt_bytes(over)} ({over / lim:.0%}) over the usable {fmt_bytes(lim)}."]
    # the least one sequence can take: full remat, the most TP one fast domain allows,
    # one layer per pipeline stage (and the head on one of them)
    domain = _fast_domain(ch, n)
    tp_max = max(t for t in _divisors(domain) if _tp_ok(c, t))
    head = (2 * c.d_model + c.vocab_size) * 2
    per_tok = c.activation_bytes_per_token(remat=True)
    one_seq = ((per_tok - head) / c.n_layers + head) * S / tp_max
    if one_seq > lim and "cp" not in fixed:
        msg.append(f"One sequence of {S:,} tokens alone holds {fmt_bytes(one_seq)} of "
                   f"activations per chip with full remat, TP {tp_max} and one layer per "
                   f"pipeline stage: no number of chips fits it without splitting the "
                   f"sequence; pin context parallelism (cp=...), which splits each "
                   f"sequence over cp chips.")
        return " ".join(msg)
    ideas = []
    narrower = {k: v for k, v in opts.items() if k != "train_tokens"}
    if opts["remat"] in ("none", "selective"):
        try:
            fits, _ = search_plans(c, ch, n, B, S, **{**narrower, "remat": "full"}, **fixed)
        except ValueError:
            fits = []
        if fits:
            ideas.append("full rematerialisation (remat='full') fits")
    state = c.training_memory().total
    for k in (2, 4, 8, 16, 32, 64):
        m = n * k
        try:
            fits, _ = search_plans(c, ch, m, B, S, **narrower, **fixed)
        except ValueError:
            continue
        if fits:
            ideas.append(f"{m} chips fit")
            break
    else:
        ideas.append(f"the model state alone is {fmt_bytes(state)}: at least "
                     f"{math.ceil(state / lim)} chips")
    for k in (2, 4, 8, 16):
        if (B // k) % S or B // k < S:
            break
        try:
            fits, _ = search_plans(c, ch, n, B // k, S, **narrower, **fixed)
        except ValueError:
            continue
        if fits:
            ideas.append(f"a batch of {B // k} tokens fits")
            break
    return " ".join(msg) + (" Would fit: " + "; ".join(ideas) + "." if ideas else "")


# ------------------------------------------------------------------------------------------
# MFU from published figures
# ------------------------------------------------------------------------------------------

def _flops_per_token(model, seq_len):
    if isinstance(model, numbers.Real) and not isinstance(model, bool):
        return 6 * check_positive("n_params", model)
    if isinstance(model, MoEConfig):
        if seq_len is None:
            return 6 * model.active_params()
        return _MoEView(model).training_flops_per_token(_int("seq_len", seq_len), True)
    c = get_model(model)
    if seq_len is None:
        return 6 * c.num_params()
    return c.training_flops_per_token(_int("seq_len", seq_len), causal=True)


def mfu_from_throughput(model, tokens_per_second: float, n_chips: int, chip,
                        seq_len: int | None = None) -> float:
    """MFU = FLOPs per token x tokens/s / (chips x peak bf16 FLOP/s).

    ``model``: a config or name (FLOPs per token with causal attention at ``seq_len``; 6N
    when ``seq_len`` is None) or a number of parameters N (6N per token)."""
    ch = get_chip(chip)
    tps = check_positive("tokens_per_second", tokens_per_second)
    n = _int("n_chips", n_chips)
    fpt = _flops_per_token(model, seq_len)
    return _check_mfu(fpt * tps / (n * ch.bf16_flops),
                      f"{sci(fpt)} FLOPs per token x {sci(tps)} tokens/s on {n} x {ch.name} "
                      f"at {sci(ch.bf16_flops)} FLOP/s")


def mfu_from_gpu_hours(model, tokens: float, chip_hours: float, chip,
                       seq_len: int | None = None) -> float:
    """Average MFU implied by a run's reported chip-hours: FLOPs per token x tokens /
    (chip_hours x 3600 x peak). ``model`` as in :func:`mfu_from_throughput` (for a
    mixture-of-experts model pass its activated parameters)."""
    ch = get_chip(chip)
    D = check_positive("tokens", tokens)
    h = check_positive("chip_hours", chip_hours)
    fpt = _flops_per_token(model, seq_len)
    return _check_mfu(fpt * D / (h * 3600 * ch.bf16_flops),
                      f"{sci(fpt)} FLOPs per token x {sci(D)} tokens in {sci(h)} "
                      f"{ch.name}-hours at {sci(ch.bf16_flops)} FLOP/s")


def _check_mfu(mfu: float, how: str) -> float:
    """Refuse an MFU above 1: more FLOPs than the chips can do at peak."""
    if mfu > 1:
        raise ValueError(f"{how} is an MFU of {mfu:.0%}, more than the chips' peak: check "
                         f"the units (tokens, hours, tokens/s) and, for a mixture-of-experts "
                         f"model, pass its activated parameters, not its total")
    return mfu


# ------------------------------------------------------------------------------------------
# a real (small) sharded training step: Adam with fp32 master weights
# ------------------------------------------------------------------------------------------

def train_specs(config, fsdp_axis: str | None = "fsdp", tp_axis: str | None = "tp"):
    """PartitionSpecs of :func:`scalebook.llama.init_params`'s tree for FSDP x TP training:
    every matrix is split over ``fsdp_axis`` along d_model and over ``tp_axis`` along heads
    or F (W_q, W_k, W_v, W_gate, W_up and the head by columns; W_o and W_down by rows); the
    embedding over d_model; norms replicated. Returns (param specs, batch spec [B, S])."""
    from jax.sharding import PartitionSpec as P
    c = get_model(config)
    f, t = fsdp_axis, tp_axis
    col, row = P(f, t), P(t, f)
    layer = {"attn_norm": P(), "wq": col, "wk": col, "wv": col, "wo": row, "mlp_norm": P(),
             "w_gate": col, "w_up": col, "w_down": row}
    specs = {"embed": P(None, f), "layers": [dict(layer) for _ in range(c.n_layers)],
             "final_norm": P()}
    if not c.tied_embeddings:
        specs["head"] = col
    return specs, P(f, None)


def init_adam(params):
    """Adam state for fp32 master weights ``params``: (master, first moment, second moment)."""
    import jax
    import jax.numpy as jnp
    master = jax.tree.map(lambda w: w.astype(jnp.float32), params)
    zeros = jax.tree.map(jnp.zeros_like, master)
    return master, zeros, jax.tree.map(jnp.zeros_like, master)


def adam_train_step(state, tokens, targets, step, config, *, lr: float = 3e-3,
                    b1: float = 0.9, b2: float = 0.95, eps: float = 1e-8,
                    compute_dtype=None, gathered=None, sharded=None):
    """One mixed-precision Adam step: cast the fp32 master weights to ``compute_dtype``
    (bf16 by default), forward and backward with :func:`scalebook.llama.loss_fn`, update
    master and moments in fp32. ``step`` counts from 1. Returns (new state, loss).

    Bytes per parameter: 4 master + 8 moments (the arguments), plus the bf16 copy and its
    gradient while the step runs: the 16 bytes the planner counts.

    ``gathered`` and ``sharded`` (trees of shardings, e.g. from :func:`train_specs` with
    and without the FSDP axis) make the FSDP collectives explicit: the compute copy is
    constrained to ``gathered`` (an all-gather of the weights) and the gradients to
    ``sharded`` (a reduce-scatter)."""
    import jax
    import jax.numpy as jnp
    from . import llama as _llama
    dt = jnp.bfloat16 if compute_dtype is None else compute_dtype
    master, m, v = state
    params = jax.tree.map(lambda w: w.astype(dt), master)

    def loss(p):
        if gathered is not None:
            p = jax.lax.with_sharding_constraint(p, gathered)
        return _llama.loss_fn(p, tokens, targets, config)

    loss, g = jax.value_and_grad(loss)(params)
    if sharded is not None:
        g = jax.lax.with_sharding_constraint(g, sharded)
    g = jax.tree.map(lambda x: x.astype(jnp.float32), g)
    m = jax.tree.map(lambda a, b: b1 * a + (1 - b1) * b, m, g)
    v = jax.tree.map(lambda a, b: b2 * a + (1 - b2) * b * b, v, g)
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    master = jax.tree.map(lambda w, a, b: w - lr * (a / c1) / (jnp.sqrt(b / c2) + eps),
                          master, m, v)
    return (master, m, v), loss


# -- fp8 with fine-grained scaling (chapter 12) ---------------------------------------------
FP8_E4M3_MAX = 448.0     # the largest finite float8 e4m3 (OCP FP8 format; e4m3fn)


def fp8_quantize(x, block=(1, 128)):
    """``x`` (2-D) rounded to float8 e4m3 with one fp32 scale per ``block`` of it, and back:
    returns (the dequantized array, the number of scales). Each block is scaled so that
    its largest magnitude maps to 448, the e4m3 maximum, as DeepSeek-V3 does for
    activations (1 x 128 tiles) and weights (128 x 128 blocks), arXiv:2412.19437 section
    3.3.2; ``block=None`` is one scale for the whole tensor (per-tensor scaling). The
    block must divide the shape."""
    import ml_dtypes
    import numpy as np
    a = np.asarray(x, dtype=np.float32)
    if a.ndim != 2:
        raise ValueError(f"x must be 2-D; got shape {a.shape}")
    bm, bn = a.shape if block is None else block
    _int("block rows", bm)
    _int("block columns", bn)
    if a.shape[0] % bm or a.shape[1] % bn:
        raise ValueError(f"block={block} must divide the shape {a.shape}")
    tiles = a.reshape(a.shape[0] // bm, bm, a.shape[1] // bn, bn)
    amax = np.abs(tiles).max(axis=(1, 3), keepdims=True)
    scale = np.where(amax > 0, amax / FP8_E4M3_MAX, 1.0).astype(np.float32)
    q = (tiles / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    return (q * scale).reshape(a.shape), int(scale.size)
