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

Per step and per chip, with B global tokens, b_copy = B / (n_dp n_fsdp) tokens per model
copy (not the b = B / n of the notation page), N parameters, s = 2 bytes (bf16), L layers, L_p = ceil(L / n_pp) layers per stage:

* compute: training FLOPs per token (models.training_flops_per_token, causal attention)
  x B / n_chips, x 4/3 on the layers with full rematerialisation, at peak FLOP/s, divided
  by (1 - bubble) (parallelism.bubble_fraction) and by L / (n_pp L_p) (uneven stages);
* fsdp: for each of the N_mb microbatches, all-gather the stage's weights N s / (n_tp n_pp)
  twice (forward and backward) and reduce-scatter the gradients once (ZeRO-3's default);
* tp: per layer and microbatch 2 all-gathers and 2 reduce-scatters of the activations
  [b_copy / N_mb, D] in the forward, the same in the backward (and again in a rematerialised
  forward);
* pp: per microbatch a stage sends its output forward and the gradient back,
  collective-permutes of [b_copy / N_mb / n_tp, D];
* dp: one all-reduce of each chip's gradient shard N s / (n_tp n_pp n_fsdp).

Collectives overlap the compute (chapter 5's model); those on the same network queue behind
each other, so the step takes max(compute, ICI total, DCN total) and the bound is the
largest of the three. Memory per chip: parallelism.training_memory_per_chip for the
N / (n_tp n_pp) parameters of one stage over n_fsdp chips (ZeRO-3), plus the FSDP buffer
(two gathered layers, bf16), plus activations (models.activation_bytes_per_token, per
microbatch, split over tp and the stage's layers, times the microbatches in flight of
parallelism.pipeline_activation_microbatches). A plan fits when the total is at most
``hbm_fraction`` of the chip's HBM (default 0.9: the rest for the compiler's temporaries).

The search tries every (n_tp, n_pp, n_fsdp, n_dp, remat) that divides the chips and the
model (TP within one fast domain), with the fewest microbatches that fit, keeps those that
fit, and picks the shortest step; among equal steps (compute-bound ones tie), the one whose
busiest network has the most slack, then the least memory. A
configuration that cannot fit raises :class:`InfeasiblePlan`, which says by how much and
what would fit.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from . import collectives as _coll
from . import parallelism as _par
from . import roofline as _rl
from .hardware import Chip, get_chip
from .models import TransformerConfig, get_model
from .units import GB, check_positive, fmt_bytes, fmt_time, sci

__all__ = ["REMAT", "Degrees", "Memory", "Collective", "TrainingPlan", "InfeasiblePlan",
           "plan_training", "evaluate_plan", "check_plan", "search_plans",
           "mfu_from_throughput", "mfu_from_gpu_hours", "DEFAULT_HBM_FRACTION",
           "train_specs", "init_adam", "adam_train_step"]

REMAT = ("none", "full")
DEFAULT_HBM_FRACTION = 0.9
# An achieved MFU to quote beside a plan's bound: well-tuned large runs report 38-43%
# (LLaMA-3 405B, Table 4 of the LLaMA-3 paper). An assumption, not a measurement.
ASSUMED_MFU = 0.40
_DAY = 86_400.0


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
    """Parallel degrees; their product is the number of chips."""

    tp: int
    fsdp: int
    pp: int
    dp: int

    @property
    def n_chips(self) -> int:
        return self.tp * self.fsdp * self.pp * self.dp

    def __str__(self) -> str:
        return f"TP {self.tp} x FSDP {self.fsdp} x PP {self.pp} x DP {self.dp}"


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
    """One scheme's collectives in a step: ``seconds`` per step on ``network``."""

    axis: str
    kind: str
    network: str
    seconds: float
    count: int
    nbytes: float          # per collective, in collective_time's convention


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
    compute_seconds: float
    bubble: float
    collectives: tuple
    model_flops_per_step: float
    peak_flops: float
    train_tokens: float
    price_per_hour: float | None
    considered: int = 0
    notes: tuple = field(default=())
    fast_network: str = "ici"        # "nvlink" on a GPU

    @property
    def n_chips(self) -> int:
        return self.degrees.n_chips

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.hbm_fraction * self.hbm_bytes

    def comm_seconds(self, network: str) -> float:
        """Seconds per step of all collectives on ``network`` ("ici"/"nvlink", "dcn")."""
        return sum(c.seconds for c in self.collectives if c.network == network)

    @property
    def step_seconds(self) -> float:
        """max(compute, each network's collectives): full overlap within the step."""
        return max([self.compute_seconds] + [self.comm_seconds(n) for n in self._nets()])

    def _nets(self):
        return sorted({c.network for c in self.collectives})

    @property
    def bound(self) -> str:
        """"compute", or the network ("ici", "nvlink", "dcn") whose collectives set the step."""
        worst = max(self._nets(), key=self.comm_seconds, default=None)
        if worst is None or self.comm_seconds(worst) <= self.compute_seconds:
            return "compute"
        return worst

    @property
    def comm_ratio(self) -> float:
        """The busiest network's collective seconds over the compute seconds (< 1: slack)."""
        return max([0.0] + [self.comm_seconds(n) for n in self._nets()]) / self.compute_seconds

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
        (the plan's own :attr:`days` are those at its bound, :attr:`mfu`)."""
        mfu = check_positive("mfu", mfu)
        if mfu > 1:
            raise ValueError(f"mfu is a fraction of the peak (0.4 for 40%); got {mfu!r}")
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

    def __str__(self) -> str:
        d, m = self.degrees, self.memory
        lines = [f"{self.model} on {self.n_chips} x {self.chip}: {d}, "
                 f"{self.microbatches} microbatch(es), remat {self.remat}"]
        if self.considered:
            lines.append(f"  (the fastest of {self.considered} configurations that fit)")
        for axis in ("tp", "fsdp", "pp", "dp"):
            net = self.networks[axis]
            net = self.fast_network if net == "ici" else net
            lines.append(f"  {axis:<4} {getattr(d, axis):>5}  on {net:<6}  "
                         f"{self.reasons[axis]}")
        lim = self.hbm_fraction * self.hbm_bytes
        lines.append(f"  memory per chip {fmt_bytes(m.total)} of {fmt_bytes(lim)} usable "
                     f"({self.hbm_fraction:.0%} of {fmt_bytes(self.hbm_bytes)}):")
        parts = [f"{k.replace('_', ' ')} {fmt_bytes(v)}" for k, v in m.as_dict().items()]
        lines.append("    " + ", ".join(parts[:4]))
        lines.append("    " + ", ".join(parts[4:]))
        lines.append(f"  step {fmt_time(self.step_seconds)}: compute "
                     f"{fmt_time(self.compute_seconds)} (bubble {self.bubble:.1%})")
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
        lines.append(f"  at {ASSUMED_MFU:.0%} MFU (an assumed achieved figure): "
                     f"{self.days_at():.3g} days"
                     + ("" if at is None else f", ${sci(at)}"))
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


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


def _layout(chip, deg: Degrees):
    n = deg.n_chips
    inner = 1
    nets = {}
    for axis in ("tp", "fsdp", "pp", "dp"):
        k = getattr(deg, axis)
        inner *= k
        nets[axis] = _net_of(chip, inner, n) if k > 1 else "-"
    return nets


def _memory(c: TransformerConfig, deg: Degrees, b_mb: float, M: int, remat: str) -> Memory:
    N = c.num_params()
    L_p = math.ceil(c.n_layers / deg.pp)
    stage_params = N / (deg.tp * deg.pp)
    st = _par.training_memory_per_chip(stage_params, deg.fsdp, 3)
    buffer = 2 * 2 * c.params_per_layer() / deg.tp if deg.fsdp > 1 else 0.0
    per_token = c.activation_bytes_per_token(remat=(remat == "full"))
    in_flight = (_par.pipeline_activation_microbatches(deg.pp, M, "1f1b") if deg.pp > 1 else 1)
    # the layer part is split over the stage's layers; the head sits on one stage.
    head = (2 * c.d_model + c.vocab_size) * 2
    layers = (per_token - head) * L_p / c.n_layers
    act = (layers * in_flight + head) * b_mb / deg.tp
    return Memory(st.weights, st.gradients, st.master_weights, st.optimizer, buffer, act)


def _collectives(c: TransformerConfig, chip: Chip, deg: Degrees, nets: dict, B: int,
                 M: int, remat: str) -> tuple:
    s = 2
    N = c.num_params()
    L_p = math.ceil(c.n_layers / deg.pp)
    b = B / (deg.dp * deg.fsdp)
    b_mb = b / M
    out = []

    def t(kind, nbytes, n, net):
        w = _par.network(chip, "dcn" if net == "dcn" else "ici")
        return _coll.collective_time(kind, nbytes, n, bandwidth=w.bandwidth, topology=w.topology)

    def netname(axis):
        net = nets[axis]
        return "nvlink" if net == "ici" and chip.vendor == "NVIDIA" else net

    if deg.tp > 1:
        act = b_mb * c.d_model * s
        per = 4 + (2 if remat == "full" else 0)       # per layer: fwd 2, bwd 2, remat fwd 2
        n = per * L_p * M
        out.append(Collective("tp", "all-gather", netname("tp"),
                              n * t("all-gather", act, deg.tp, nets["tp"]), n, act))
        out.append(Collective("tp", "reduce-scatter", netname("tp"),
                              n * t("reduce-scatter", act, deg.tp, nets["tp"]), n, act))
    if deg.fsdp > 1:
        w = N * s / (deg.tp * deg.pp)
        out.append(Collective("fsdp", "all-gather", netname("fsdp"),
                              2 * M * t("all-gather", w, deg.fsdp, nets["fsdp"]), 2 * M, w))
        out.append(Collective("fsdp", "reduce-scatter", netname("fsdp"),
                              M * t("reduce-scatter", w, deg.fsdp, nets["fsdp"]), M, w))
    if deg.pp > 1:
        a = b_mb * c.d_model * s / deg.tp
        out.append(Collective("pp", "collective-permute", netname("pp"),
                              2 * M * t("collective-permute", a, deg.pp, nets["pp"]), 2 * M, a))
    if deg.dp > 1:
        g = N * s / (deg.tp * deg.pp * deg.fsdp)
        out.append(Collective("dp", "all-reduce", netname("dp"),
                              t("all-reduce", g, deg.dp, nets["dp"]), 1, g))
    return tuple(out)


def _reasons(c, chip, deg: Degrees, nets, fixed: dict) -> dict:
    r = {}
    r["tp"] = ("fixed by the caller" if "tp" in fixed else
               "splits heads and F; activations move every layer"
               if deg.tp > 1 else "not needed: FSDP and the batch carry the chips")
    r["fsdp"] = ("fixed by the caller" if "fsdp" in fixed else
                 "shards weights, gradients, Adam state; gathers per microbatch" if deg.fsdp > 1 else "not used")
    r["pp"] = ("fixed by the caller" if "pp" in fixed else
               "splits the layers; sends activations between stages"
               if deg.pp > 1 else "not needed: state and activations fit without it")
    r["dp"] = ("fixed by the caller" if "dp" in fixed else
               "replicas; one gradient all-reduce per step"
               if deg.dp > 1 else "not used")
    return r


def _check_model_chip(model, chip):
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


def evaluate_plan(model, chip, *, tp: int, fsdp: int, pp: int = 1, dp: int = 1,
                  global_batch_tokens: int, seq_len: int, microbatches: int = 1,
                  remat: str = "none", train_tokens: float = 15e12,
                  hbm_fraction: float = DEFAULT_HBM_FRACTION, _fixed=None,
                  _considered: int = 0) -> TrainingPlan:
    """The plan for one given configuration (it may not fit: see ``plan.fits``).

    Refuses degrees that do not divide the model (heads, F, layers) or the batch (whole
    sequences per data shard and per microbatch)."""
    c, ch = _check_model_chip(model, chip)
    B, S = _check_batch(c, global_batch_tokens, seq_len)
    deg = Degrees(_int("tp", tp), _int("fsdp", fsdp), _int("pp", pp), _int("dp", dp))
    M = _int("microbatches", microbatches)
    if remat not in REMAT:
        raise ValueError(f"remat must be one of {REMAT}; got {remat!r}")
    f = check_positive("hbm_fraction", hbm_fraction)
    if f > 1:
        raise ValueError(f"hbm_fraction must be at most 1; got {f}")
    if not _tp_ok(c, deg.tp):
        raise ValueError(f"tp={deg.tp} must divide n_heads={c.n_heads}, d_ff={c.d_ff} and "
                         f"d_model={c.d_model} of {c.name}")
    if deg.pp > c.n_layers:
        raise ValueError(f"pp={deg.pp} is more than the {c.n_layers} layers of {c.name}")
    seqs = B // S
    if seqs % (deg.dp * deg.fsdp):
        raise ValueError(f"{seqs} sequences per batch do not split over dp x fsdp = "
                         f"{deg.dp * deg.fsdp} data shards")
    if (seqs // (deg.dp * deg.fsdp)) % M:
        raise ValueError(f"{seqs // (deg.dp * deg.fsdp)} sequences per data shard do not split "
                         f"into {M} microbatches")
    nets = _layout(ch, deg)
    b_mb = B / (deg.dp * deg.fsdp) / M
    mem = _memory(c, deg, b_mb, M, remat)
    per_token = c.training_flops_per_token(S, causal=True)
    model_flops = per_token * B
    layer_fwd = (c.forward_flops_per_token(S, causal=True) - 2 * c.param_breakdown().output_head)
    extra = layer_fwd * B if remat == "full" else 0.0
    L_p = math.ceil(c.n_layers / deg.pp)
    imbalance = deg.pp * L_p / c.n_layers
    bubble = _par.bubble_fraction(deg.pp, M) if deg.pp > 1 else 0.0
    compute = _rl.compute_time((model_flops + extra) / deg.n_chips, ch) * imbalance / (1 - bubble)
    notes = []
    if imbalance > 1:
        notes.append(f"{c.n_layers} layers over {deg.pp} stages: {L_p} per stage, "
                     f"{imbalance - 1:.1%} idle on the lighter stages")
        notes.append("a real run may balance them otherwise (LLaMA-3: one layer fewer "
                     "on the end stages)")
    return TrainingPlan(
        model=c.name, chip=ch.name, degrees=deg, networks=nets,
        reasons=_reasons(c, ch, deg, nets, _fixed or {}), global_batch_tokens=B, seq_len=S,
        microbatches=M, remat=remat, memory=mem, hbm_bytes=ch.hbm_bytes, hbm_fraction=f,
        compute_seconds=compute, bubble=bubble,
        collectives=_collectives(c, ch, deg, nets, B, M, remat),
        model_flops_per_step=model_flops, peak_flops=ch.bf16_flops,
        train_tokens=check_positive("train_tokens", train_tokens),
        price_per_hour=ch.price_per_hour, considered=_considered, notes=tuple(notes),
        fast_network="nvlink" if ch.vendor == "NVIDIA" else "ici")


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

def _candidates(c, ch, n, seqs, fixed, remats):
    domain = _fast_domain(ch, n)
    for tp in _divisors(n):
        if "tp" in fixed and tp != fixed["tp"]:
            continue
        if not _tp_ok(c, tp) or tp > domain:
            continue
        for pp in _divisors(n // tp):
            if ("pp" in fixed and pp != fixed["pp"]) or pp > c.n_layers:
                continue
            rest = n // (tp * pp)
            for fsdp in _divisors(rest):
                dp = rest // fsdp
                if ("fsdp" in fixed and fsdp != fixed["fsdp"]) or ("dp" in fixed and dp != fixed["dp"]):
                    continue
                if seqs % (dp * fsdp):
                    continue
                deg = Degrees(tp, fsdp, pp, dp)
                if ch.dcn_bandwidth is None and "dcn" in _layout(ch, deg).values():
                    continue            # no scale-out figure: only one fast domain
                yield deg


def search_plans(model, chip, n_chips: int, global_batch_tokens: int, seq_len: int, *,
                 remat: str | None = None, hbm_fraction: float = DEFAULT_HBM_FRACTION,
                 train_tokens: float = 15e12, **fixed) -> tuple[list, TrainingPlan | None]:
    """Every configuration's best microbatch count: (fitting plans sorted by step time,
    the closest non-fitting plan or None). ``fixed`` may pin tp, fsdp, pp, dp or
    microbatches; ``remat`` pins the policy (default: try both)."""
    c, ch = _check_model_chip(model, chip)
    n = _int("n_chips", n_chips)
    B, S = _check_batch(c, global_batch_tokens, seq_len)
    for k in fixed:
        if k not in ("tp", "fsdp", "pp", "dp", "microbatches"):
            raise TypeError(f"unknown option {k!r}; pin one of tp, fsdp, pp, dp, microbatches")
    remats = REMAT if remat is None else (remat,)
    for r in remats:
        if r not in REMAT:
            raise ValueError(f"remat must be one of {REMAT} or None; got {r!r}")
    axes = {k: _int(k, v) for k, v in fixed.items() if k != "microbatches"}
    prod = math.prod(axes.values()) if axes else 1
    if n % prod:
        raise ValueError(f"the pinned degrees {axes} multiply to {prod}, which does not "
                         f"divide n_chips={n}")
    seqs = B // S
    lim = hbm_fraction * ch.hbm_bytes
    fits, closest = [], None
    for deg in _candidates(c, ch, n, seqs, axes, remats):
        per_shard = seqs // (deg.dp * deg.fsdp)
        Ms = _divisors(per_shard)
        if "microbatches" in fixed:
            Ms = [m for m in Ms if m == fixed["microbatches"]]
        for r in remats:
            for M in Ms:   # fewest microbatches that fit (FSDP re-gathers per microbatch)
                if deg.pp > 1 and M < deg.pp and M != Ms[-1]:
                    continue
                mem = _memory(c, deg, B / (deg.dp * deg.fsdp) / M, M, r)
                if mem.total <= lim:
                    break
                if closest is None or mem.total < closest[0]:
                    closest = (mem.total, deg, M, r)
            else:
                continue
            fits.append(evaluate_plan(c, ch, tp=deg.tp, fsdp=deg.fsdp, pp=deg.pp, dp=deg.dp,
                                      global_batch_tokens=B, seq_len=S, microbatches=M,
                                      remat=r, train_tokens=train_tokens,
                                      hbm_fraction=hbm_fraction, _fixed=axes))
    fits.sort(key=lambda p: (p.step_seconds, p.comm_ratio, p.memory.total))
    best_bad = None
    if closest is not None:
        _, deg, M, r = closest
        best_bad = evaluate_plan(c, ch, tp=deg.tp, fsdp=deg.fsdp, pp=deg.pp, dp=deg.dp,
                                 global_batch_tokens=B, seq_len=S, microbatches=M, remat=r,
                                 train_tokens=train_tokens, hbm_fraction=hbm_fraction)
    return fits, best_bad


def plan_training(model, chip, n_chips: int, global_batch_tokens: int, seq_len: int, *,
                  train_tokens: float = 15e12, remat: str | None = None,
                  hbm_fraction: float = DEFAULT_HBM_FRACTION, **fixed) -> TrainingPlan:
    """The fastest configuration that fits (see the module docstring for the model).

    ``model``: a name ("llama3-70b") or a TransformerConfig; ``chip``: a name or a Chip;
    ``global_batch_tokens`` B and ``seq_len`` S (B a multiple of S); ``train_tokens`` for
    days and cost; ``remat`` "none" or "full" (default: whichever is faster and fits);
    ``fixed``: pin any of tp, fsdp, pp, dp, microbatches. Raises :class:`InfeasiblePlan`
    when nothing fits, with what would."""
    fits, closest = search_plans(model, chip, n_chips, global_batch_tokens, seq_len,
                                 remat=remat, hbm_fraction=hbm_fraction,
                                 train_tokens=train_tokens, **fixed)
    if fits:
        best = fits[0]
        import dataclasses
        return dataclasses.replace(best, considered=len(fits))
    c, ch = _check_model_chip(model, chip)
    raise InfeasiblePlan(_infeasible_message(c, ch, n_chips, global_batch_tokens, seq_len,
                                             remat, hbm_fraction, fixed, closest), closest)


def _infeasible_message(c, ch, n, B, S, remat, f, fixed, closest) -> str:
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
    ideas = []
    if remat == "none":
        try:
            fits, _ = search_plans(c, ch, n, B, S, remat="full", hbm_fraction=f, **fixed)
        except ValueError:
            fits = []
        if fits:
            ideas.append("full rematerialisation (remat='full') fits")
    state = c.training_memory().total
    for k in (2, 4, 8, 16, 32, 64):
        m = n * k
        try:
            fits, _ = search_plans(c, ch, m, B, S, remat=remat, hbm_fraction=f, **fixed)
        except ValueError:
            continue
        if fits:
            ideas.append(f"{m} chips fit")
            break
    else:
        ideas.append(f"the model state alone is {fmt_bytes(state)}: at least "
                     f"{math.ceil(state / lim)} chips")
    for k in (2, 4, 8, 16):
        if (B // k) % S:
            break
        try:
            fits, _ = search_plans(c, ch, n, B // k, S, remat=remat, hbm_fraction=f, **fixed)
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
    return _flops_per_token(model, seq_len) * tps / (n * ch.bf16_flops)


def mfu_from_gpu_hours(model, tokens: float, chip_hours: float, chip,
                       seq_len: int | None = None) -> float:
    """Average MFU implied by a run's reported chip-hours: FLOPs per token x tokens /
    (chip_hours x 3600 x peak). ``model`` as in :func:`mfu_from_throughput` (for a
    mixture-of-experts model pass its activated parameters)."""
    ch = get_chip(chip)
    D = check_positive("tokens", tokens)
    h = check_positive("chip_hours", chip_hours)
    return _flops_per_token(model, seq_len) * D / (h * 3600 * ch.bf16_flops)


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
