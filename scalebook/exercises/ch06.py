"""Chapter 6 exercises: training LLaMA-3. Reference answers are computed from scalebook."""

from __future__ import annotations

import math

from .. import parallelism as par
from .. import training as tr
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import (ChoiceExercise, CodeExercise, NumericExercise, VariedNumericExercise,
                    as_number)
from .kinds import eight_bit_peak_hint
from .kinds import statement_names as _words

__all__: list[str] = []


def _close(a, b, rtol=0.02):
    a = as_number(a)
    return a is not None and b != 0 and math.isclose(a, b, rel_tol=rtol)


def _peak(chip):
    return get_chip(chip).bf16_flops


def _n(name):
    return get_model(name).num_params()


# Variants (for assignments; see kinds.VariedNumericExercise and chapter 1). The chapter's
# own numbers are each exercise's ``params``; an assignment draws others from ``choose``.
_MODELS = ("llama3-8b", "llama3-70b", "llama3-405b")
_TPUS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
_GPUS = ("gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200")


def _sci(x, digits=None):
    """1.5e13 for 15e12, 1.02e11 with ``digits`` = 3 (no '+', no trailing zeros)."""
    text = f"{x:e}" if digits is None else f"{x:.{digits - 1}e}"
    mantissa, exponent = text.split("e")
    if "." in mantissa and digits is None:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"




# 6.1 ------------------------------------------------------------------------------------
# Where the batch runs out (section 6.5): a pipeline replica of TP x P chips needs N_mb
# microbatches of one or more whole sequences, and N_mb >= (P - 1)(1 - beta) / beta for a
# bubble (P - 1) / (N_mb + P - 1) of at most beta; the batch's sequences feed at most
# floor(sequences / N_mb) replicas.
def _fewest_mb(P, beta):
    """The fewest microbatches whose 1F1B bubble is at most ``beta`` (found with
    parallelism.bubble_fraction, so the rule is the chapter's)."""
    n = 1
    while par.bubble_fraction(P, n) > beta + 1e-12:
        n += 1
    return n


def _chips61(seqs=2048, tp=8, P=4, beta=0.18, n_mb=None, round_up=False):
    n_mb = _fewest_mb(P, beta) if n_mb is None else n_mb
    replicas = math.ceil(seqs / n_mb) if round_up else seqs // n_mb
    return replicas * tp * P


def _ex1_hints(seqs, tp, P, beta):
    n_mb = _fewest_mb(P, beta)
    over_work = math.ceil((P - 1) / beta - 1e-9)        # (P - 1) / N_mb <= beta
    return [
        (lambda a: a == seqs * tp * P,
         f"with one microbatch per replica the bubble is {P - 1} / {P} of the step: each "
         "replica needs N_mb microbatches with (P - 1) / (N_mb + P - 1) <= the limit."),
        (lambda a: a == _chips61(seqs, tp, P, beta, n_mb=over_work),
         "the bubble is (P - 1) / (N_mb + P - 1) of the step, not (P - 1) / N_mb."),
        (lambda a: a == _chips61(seqs, tp, P, beta) // tp,
         f"a replica is TP x P = {tp} x {P} chips: count the tensor-parallel ones too"
         + (" (or the pipeline stages: TP = P here)." if tp == P else ".")),
        (lambda a: a == _chips61(seqs, tp, P, beta) // P,
         f"a replica is TP x P = {tp} x {P} chips: count the pipeline stages too."),
        (lambda a: a == _chips61(seqs, tp, P, beta, round_up=True),
         "round the replicas down: each needs N_mb whole sequences."),
        (lambda a: a == _chips61(seqs, tp, P, beta, n_mb=n_mb - 1),
         f"with N_mb = {n_mb - 1} the bubble is above the limit: round the microbatches "
         "up."),
        (lambda a: a == seqs // n_mb,
         "that is the number of replicas; each has TP x P chips."),
    ]


def _valid61(seqs, tp, P, beta):
    """Every slip a different number from the answer and from each other (rounding the
    replicas up is no slip where N_mb divides the sequences)."""
    ex = _chips61(seqs, tp, P, beta)
    n_mb = _fewest_mb(P, beta)
    slips = [seqs * tp * P, _chips61(seqs, tp, P, beta, n_mb=math.ceil((P - 1) / beta - 1e-9)),
             ex // tp, _chips61(seqs, tp, P, beta, n_mb=n_mb - 1), seqs // n_mb]
    if tp != P:                 # where TP = P one hint names both
        slips.append(ex // P)
    if seqs % n_mb:
        slips.append(_chips61(seqs, tp, P, beta, round_up=True))
    return ex > 0 and len(set(slips + [ex])) == len(slips) + 1


register(VariedNumericExercise(
    id="6.1", title="The most chips a batch can feed", unit="chips", integer=True,
    params={"seqs": 2048, "tp": 8, "P": 4, "beta": 0.18},
    # limits for which (P - 1)(1 - beta) / beta is never a whole number: no N_mb sits on
    # the limit, where a float's last digit would decide it
    choose={"seqs": (512, 1024, 1536, 2048, 3072, 4096), "tp": (4, 8), "P": (4, 8, 16),
            "beta": (0.08, 0.16, 0.18, 0.22)},
    solve=_chips61, hints_for=_ex1_hints, valid=_valid61,
    describe=lambda seqs, tp, P, beta: {"pct": f"{beta:.0%}"},
    statement="A training batch holds {seqs:,} sequences. The plan runs TP {tp} x PP {P} "
              "(a 1F1B pipeline of {P} stages) per replica, with the replicas (the FSDP and "
              "DP axes) sharing the batch; each replica cuts its share into $N_{{\\mathrm"
              "{{mb}}}}$ microbatches of one or more whole sequences, and the bubble, "
              "$(P - 1) / (N_{{\\mathrm{{mb}}}} + P - 1)$ of the step, may be at most "
              "{pct}. How many chips at most can such a plan keep busy?",
))


# 6.2 ------------------------------------------------------------------------------------
# Two phases of the 405B run at Table 4's achieved rates (section 6.2): the days add phase
# by phase. (4.5 asks the one-configuration days from an MFU.)
_TOKENS_405B = 15.6e12


def _phase_days(tokens, gpus, tflops):
    return 6 * _n("llama3-405b") * tokens / (gpus * tflops * 1e12) / 86400


def _ex2(first=3.6, r1=430, r2=400):
    rest = _TOKENS_405B - first * 1e12
    return _phase_days(first * 1e12, 8192, r1) + _phase_days(rest, 16384, r2)


def _ex2_hints(first, r1, r2):
    days = _ex2(first, r1, r2)
    T1, T = first * 1e12, _TOKENS_405B
    return [
        (lambda a: _close(a, _phase_days(T, 16384, r2)),
         f"that runs all 15.6T tokens on 16,384 GPUs; the first {first:g}T ran on 8,192 at "
         f"{r1} TFLOP/s each: add that phase's days."),
        (lambda a: _close(a, _phase_days(T, 8192, r1)),
         f"that runs all 15.6T tokens on 8,192 GPUs; after the first {first:g}T the run "
         f"moved to 16,384 at {r2} TFLOP/s each."),
        (lambda a: _close(a, _phase_days(T1, 16384, r2) + _phase_days(T - T1, 8192, r1)),
         "the phases are swapped: the first tokens ran on the 8,192 GPUs."),
        (lambda a: _close(a, _phase_days(T, (8192 * r1 + 16384 * r2) / 2, 1)),
         "time adds phase by phase (each phase's tokens over its own rate), not the whole "
         "run over an average rate."),
        (lambda a: _close(a, _phase_days(T1, 8192, r1)) or _close(a, _phase_days(T - T1, 16384,
                                                                                 r2)),
         "that is one phase; add the other."),
        (lambda a: _close(a, days * 24), "that is hours: divide by 24."),
        (lambda a: _close(a, days / 3), "6 FLOPs per parameter and token, not 2."),
    ]


def _valid2(first, r1, r2):
    """The phases' slips (all on one configuration, swapped) 3% or more from the answer."""
    days, T1, T = _ex2(first, r1, r2), first * 1e12, _TOKENS_405B
    slips = [_phase_days(T, 16384, r2), _phase_days(T, 8192, r1),
             _phase_days(T1, 16384, r2) + _phase_days(T - T1, 8192, r1),
             _phase_days(T, (8192 * r1 + 16384 * r2) / 2, 1)]
    return all(abs(x - days) > 0.03 * days for x in slips)


register(VariedNumericExercise(
    id="6.2", title="Days for 405B in two phases", unit="days", rtol=0.02,
    params={"first": 3.6, "r1": 430, "r2": 400},
    choose={"first": (1.2, 2.4, 3.6, 4.8, 6.0), "r1": (410, 430, 450),
            "r2": (380, 400, 420)},
    solve=_ex2, hints_for=_ex2_hints, valid=_valid2,
    statement="Suppose LLaMA-3 405B's 15.6T tokens ($6 N N_{{\\mathrm{{tok}}}}$) ran in two "
              "phases of section 6.2's Table 4: the first {first:g}T tokens on 8,192 H100s "
              "achieving {r1} TFLOP/s per GPU, the rest on 16,384 achieving {r2}. How many "
              "days did the run take?",
))


# 6.3 ------------------------------------------------------------------------------------
def _usable(chip):
    return tr.DEFAULT_HBM_FRACTION * get_chip(chip).hbm_bytes


def _min_chips_405b(model="llama3-405b", chip="tpu-v5p"):
    return math.ceil(16 * _n(model) / _usable(chip))


def _ex3_hints(model, chip):
    N, usable = _n(model), _usable(chip)
    hints = [
        (lambda a: a == math.floor(16 * N / usable),
         "round up: a fraction of a chip does not exist, and fewer chips do not hold it."),
        (lambda a: a == math.ceil(16 * N / get_chip(chip).hbm_bytes),
         "leave the 10% of HBM for the compiler: divide by 0.9 x HBM."),
        (lambda a: a == math.ceil(2 * N / usable),
         "that holds the bf16 weights only: Adam training keeps 16 bytes per parameter."),
        (lambda a: a == math.ceil(12 * N / usable),
         "12 bytes is the fp32 master and moments: add the bf16 weights and gradients."),
    ]
    hbm = get_chip(chip).hbm_bytes
    gib = hbm / 2**30
    if gib == round(gib):        # HBM listed in GiB (a TPU v4's 32, a v5p's 95)
        hints.append((
            lambda a: a == math.ceil(16 * N / (tr.DEFAULT_HBM_FRACTION * gib * 1e9)),
            f"the {_words(chip=chip)['chip_short']}'s HBM is {gib:g} GiB (2**30 bytes each, "
            f"about {_sci(hbm, 3)} bytes), not {gib:g}e9 bytes: use hbm_bytes."))
    return hints


register(VariedNumericExercise(
    id="6.3", title="Fewest v5p chips for 405B's state", unit="chips", integer=True,
    rtol=0.0, params={"model": "llama3-405b", "chip": "tpu-v5p"},
    choose={"model": ("llama3-70b", "llama3-405b"), "chip": _TPUS + _GPUS},
    solve=_min_chips_405b, hints_for=_ex3_hints, describe=_words,
    variant_title="Fewest {chip_short} chips for {size}'s state",
    statement="How many {chip_name} chips are needed at least to hold the mixed-precision Adam "
              "state of {model_name} (16 bytes per parameter, fully sharded), using 90% of "
              "each chip's HBM and no activations? A whole number of chips.",
))


# 6.4 ------------------------------------------------------------------------------------
def _state_70b_zero1():
    """TP 8 x FSDP 32 x DP 4 with ZeRO-1 on DP: bf16 weights and gradients over the 256
    chips of one copy, fp32 master weights and moments over all 1024."""
    m = tr.evaluate_plan("llama3-70b", "tpu-v5p", tp=8, fsdp=32, dp=4, zero=1,
                         global_batch_tokens=128 * 8192, seq_len=8192).memory
    return (m.weights + m.gradients + m.master_weights + m.optimizer) / 1e9


register(NumericExercise(
    id="6.4", title="70B state per chip with ZeRO-1 on DP", unit="GB", rtol=0.02,
    reference=_state_70b_zero1,
    hints=[
        (lambda a: _close(a, 16 * _n("llama3-70b") / 256 / 1e9),
         "that leaves the DP replicas each a whole copy of the fp32 master weights and Adam "
         "moments: ZeRO-1 shards those 12 bytes over DP as well (all 1024 chips)."),
        (lambda a: _close(a, 16 * _n("llama3-70b") / 1024 / 1e9),
         "ZeRO-1 shards only the optimizer's fp32 state over DP; the bf16 weights and "
         "gradients are split over TP x FSDP (256 chips), not over DP."),
        (lambda a: _close(a, (4 / 32 + 12 / 128) * _n("llama3-70b") / 1e9),
         "8x too large: TP splits the parameters too: divide by TP x FSDP (x DP for the "
         "fp32 part). (Or bits counted for bytes?)"),
        (lambda a: _close(a, _state_70b_zero1() * 1e9 / 2**30),
         "that is GiB; the answer is in GB (1e9 bytes)."),
        (lambda a: _close(a, (2 / 256 + 12 / 1024) * _n("llama3-70b") / 1e9),
         "add the bf16 gradients (2 bytes per parameter, over TP x FSDP like the weights)."),
    ],
))


# 6.5 ------------------------------------------------------------------------------------
def _fsdp_gather_s():
    h = get_chip("gpu-h100")
    w = 2 * _n("llama3-70b") / 8
    return 2 * (3 / 4) * w / h.dcn_bandwidth


register(NumericExercise(
    id="6.5", title="FSDP gathers over the scale-out network", unit="s", rtol=0.03,
    reference=_fsdp_gather_s, ring=4,
    hints=[
        (lambda a: _close(a, _fsdp_gather_s() / 2), "that is one gather: FSDP gathers the "
                                                    "weights for the forward and again for "
                                                    "the backward."),
        (lambda a: _close(a, _fsdp_gather_s() * 8), "each GPU gathers only its TP shard: "
                                                    "divide the weights by the TP degree 8."),
        (lambda a: _close(a, _fsdp_gather_s() * 4 / 3), "a ring all-gather sends (n-1)/n of "
                                                        "the array, 3/4 for n = 4."),
        (lambda a: _close(a, _fsdp_gather_s() * get_chip("gpu-h100").dcn_bandwidth
                          / get_chip("gpu-h100").ici_bandwidth),
         "the FSDP group spans 4 servers: the scale-out network (dcn_bandwidth), not NVLink."),
    ],
))


# 6.6 ------------------------------------------------------------------------------------
def _bubble(P=16, M=64):
    return par.bubble_fraction(P, M)


def _ex6_hints(P, M):
    b = _bubble(P, M)
    return [
        (lambda a: _close(a, (P - 1) / M, 0.01), "(P - 1) / N_mb is the bubble relative to the "
                                                 "useful work; as a fraction of the whole step "
                                                 "divide by N_mb + P - 1."),
        (lambda a: _close(a, 1 - b, 0.01), "that is the busy fraction; the bubble "
                                           "is the idle part."),
        (lambda a: _close(a, P / (M + P), 0.01), f"the fill and drain are P - 1 = {P - 1} "
                                                 "pass slots, not P: (P - 1) / "
                                                 "(N_mb + P - 1)."),
    ]


register(VariedNumericExercise(
    id="6.6", title="The bubble of 16 stages", unit="fraction (0 to 1)", rtol=0.01,
    params={"P": 16, "M": 64},
    choose={"P": (4, 8, 12, 16, 24, 32), "M": (8, 16, 32, 64, 128, 256)},
    solve=_bubble, hints_for=_ex6_hints, valid=lambda P, M: M >= P,
    variant_title="The bubble of {P} stages",
    statement="A 1F1B pipeline of {P} stages runs {M} microbatches per step. What fraction of "
              "the step is a stage idle? Answer as a fraction (0 to 1).",
))


# 6.7 ------------------------------------------------------------------------------------
def _mfu_tp(chip="gpu-h100", gpus=16384, batch=2**24, step=7.0, seq_len=None):
    return tr.mfu_from_throughput("llama3-405b", batch / step, gpus, chip, seq_len=seq_len)


def _ex7_hints(chip, gpus, batch, step):
    mfu = _mfu_tp(chip, gpus, batch, step)
    return [
        (lambda a: _close(a, mfu / 3), "6N FLOPs per token for training, not 2N."),
        (lambda a: _close(a, mfu * gpus), f"divide by the peak of all {gpus:,} GPUs."),
        (lambda a: _close(a, mfu * 100), "a fraction between 0 and 1, not a percentage."),
        (lambda a: _close(a, _mfu_tp(chip, gpus, batch, step, seq_len=8192)),
         "that counts attention's FLOPs too: the exercise counts 6N per token."),
    ]


def _ex7_ok(chip, gpus, batch, step):
    """An MFU that runs report, 20% to 70% (mfu_from_throughput refuses one above 1)."""
    return 0.2 <= 6 * _n("llama3-405b") * batch / step / (gpus * _peak(chip)) <= 0.7


register(VariedNumericExercise(
    id="6.7", title="MFU from a step time", unit="fraction (0 to 1)", rtol=0.02,
    params={"chip": "gpu-h100", "gpus": 16384, "batch": 2**24, "step": 7.0},
    choose={"chip": _GPUS, "gpus": (8192, 16384, 24576), "batch": (2**23, 2**24),
            "step": (3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0)},
    solve=_mfu_tp, hints_for=_ex7_hints, chips=lambda gpus, **_: gpus,
    valid=_ex7_ok,
    describe=lambda chip, gpus, batch, step: {**_words(chip=chip),
                                              "log2B": batch.bit_length() - 1},
    statement="{gpus:,} {chip_name} GPUs train LLaMA-3 405B on batches of $2^{{{log2B}}}$ "
              "tokens, one step every {step:.1f} s. With 6N FLOPs per token, what is the MFU "
              "(a fraction between 0 and 1)?",
))


# 6.8 ------------------------------------------------------------------------------------
def _mfu_hours():
    return tr.mfu_from_gpu_hours("llama3-70b", 15e12, 7.0e6, "gpu-h100")


register(NumericExercise(
    id="6.8", title="MFU from GPU-hours", unit="fraction (0 to 1)", rtol=0.02,
    reference=_mfu_hours,
    hints=[
        (lambda a: _close(a, _mfu_hours() * 3600), "hours are 3600 seconds: multiply the "
                                                   "GPU-hours by 3600."),
        (lambda a: _close(a, _mfu_hours() / 3), "6 N N_tok FLOPs, not 2 N N_tok."),
        (lambda a: _close(a, _mfu_hours() * 100), "a fraction between 0 and 1, not a percentage."),
    ],
))


# 6.9 ------------------------------------------------------------------------------------
def _bound_choice():
    return tr.evaluate_plan("llama3-70b", "gpu-h100", tp=8, fsdp=16, dp=16, microbatches=2,
                            global_batch_tokens=2**22, seq_len=8192).bound


register(ChoiceExercise(
    id="6.9", title="What bounds the H100 plan?",
    choices=("compute", "bubble", "nvlink", "dcn"), reference=_bound_choice,
    hints={"compute": "with one microbatch it would be; with two, each pass has half the "
                      "compute but still gathers all of the stage's weights over FSDP: "
                      "compare one pass's compute with its gathers.",
           "bubble": "there is no pipeline here (PP 1), so no fill and drain.",
           "nvlink": "the TP collectives are exposed, but they stay inside a server; "
                     "which collectives leave it, and how often?"},
))


# 6.10 -----------------------------------------------------------------------------------
_TOKENS_610 = 15.6e12


def _cost_405b(model="llama3-405b", chip="tpu-v5e", mfu=0.40):
    """Chip-hours = FLOPs / (peak x MFU x 3600 s), whatever the number of chips."""
    ch = get_chip(chip)
    return 6 * _n(model) * _TOKENS_610 / (ch.bf16_flops * mfu * 3600) * ch.price_per_hour


def _with_attention(model="llama3-405b", chip="tpu-v5e", mfu=0.40):
    c = get_model(model)
    return (_cost_405b(model, chip, mfu) * c.training_flops_per_token(8192, causal=True)
            / (6 * c.num_params()))


def _ex10_hints(model, chip, mfu):
    cost = _cost_405b(model, chip, mfu)
    return [
        (lambda a: any(_close(a, cost * n) for n in (256, 4096, 6144, 8192, 8960)),
         "chip-hours = FLOPs / (one chip's peak x MFU x 3600 s) already count every chip: "
         "the bill does not depend on how many chips share the work."),
        (lambda a: _close(a, cost * 3600), "the price is per chip-hour: divide the "
                                           "chip-seconds by 3600."),
        (lambda a: _close(a, cost * mfu ** 2), "a lower MFU makes the run longer, "
                                               f"so dearer: divide by {mfu:.2f}."),
        (lambda a: _close(a, cost * mfu), f"divide by the MFU of {mfu:.2f}: at "
                                          f"{mfu * 100:g}% of the peak the chips take "
                                          f"{1 / mfu:.3g} times as long."),
        (lambda a: _close(a, cost * 15 / 15.6), "the run is 15.6T tokens, not 15T."),
        (lambda a: _close(a, _with_attention(model, chip, mfu)),
         "that counts attention's FLOPs at 8K too: the exercise counts 6N per token."),
    ]


# Section 6.1 prints the v5p plans at 40% MFU with their days (405B: 291.3 days on 8192
# chips) and 70B's bill, so a v5p bill at 40% is one multiplication from a printed number:
# the chapter's own exercise is on v5e, and no variant draws v5p at 40%.
register(VariedNumericExercise(
    id="6.10", title="The bill for 405B on v5e", unit="dollars", rtol=0.02,
    params={"model": "llama3-405b", "chip": "tpu-v5e", "mfu": 0.40},
    choose={"model": ("llama3-70b", "llama3-405b"),
            "chip": tuple(c for c in _TPUS + _GPUS if get_chip(c).price_per_hour),
            "mfu": (0.30, 0.35, 0.40, 0.45, 0.50)},
    valid=lambda model, chip, mfu: not (chip == "tpu-v5p" and mfu == 0.40),
    solve=_cost_405b, hints_for=_ex10_hints,
    describe=lambda model, chip, mfu: {**_words(model, chip), "pct": f"{mfu * 100:g}"},
    variant_title="The bill for {size} on {chip_short}",
    statement="What does the compute of pre-training {model_name} on 15.6T tokens cost on "
              "{chip_name} at {pct}% MFU, counting $6N$ FLOPs per token, at the "
              "{chip_short}'s listed price per chip-hour (in `scalebook.hardware`)? In "
              "dollars. Does the answer depend on how many chips the run uses?",
))


# 6.11 code: a sharding that fits and is compute-bound ------------------------------------
_CASES_11 = [("llama3-70b", "gpu-h100", 128, 2**22), ("llama3-8b", "tpu-v5p", 256, 2**22),
             ("llama3-70b", "tpu-v5p", 1024, 2**22), ("llama3-405b", "tpu-v5p", 4096, 2**24)]
_DEFAULTS = dict(tp=1, fsdp=1, pp=1, dp=1, microbatches=1, remat="none",
                 keep_weights=False, zero=0, interleave=1)
_KEYS = tuple(_DEFAULTS)


def _ref_11(model, chip, n, B):
    return (model, chip, n, B)


# Drawn cases: 8B or 70B on 64 to 256 chips of a kind, a batch of 2M to 8M tokens: pods the
# planner searches in about 0.1 s. A plan that passes exists for every one whose training
# state fits when fully sharded (tests/test_exercises_ch06.py searches them all).
_DRAWN_MODELS_11 = ("llama3-8b", "llama3-70b")
_DRAWN_CHIPS_11 = ("gpu-a100", "gpu-h100", "gpu-b200", "tpu-v4", "tpu-v5e", "tpu-v5p",
                   "tpu-v6e")
_DRAWN_CHIPS_N_11 = (32, 64, 128)
_DRAWN_BATCHES_11 = (2**20, 2**21, 2**22)


def _state_fits_11(model, chip, n):
    return 16 * _n(model) <= n * _usable(chip)


def _gen_11(rng):
    while True:
        case = (rng.choice(_DRAWN_MODELS_11), rng.choice(_DRAWN_CHIPS_11),
                rng.choice(_DRAWN_CHIPS_N_11), rng.choice(_DRAWN_BATCHES_11))
        if _state_fits_11(*case[:3]):
            return case


def _plan_of(got, case):
    model, chip, n, B = case
    if not isinstance(got, dict) or set(got) - set(_KEYS) or not {"tp", "fsdp"} <= set(got):
        raise TypeError
    kw = {k: got.get(k, d) for k, d in _DEFAULTS.items()}
    return tr.evaluate_plan(model, chip, global_batch_tokens=B, seq_len=8192, **kw)


def _valid_11(got, case):
    try:
        p = _plan_of(got, case)
    except Exception:
        return None
    return p


_MAX_BUBBLE = 0.25          # the pipeline may idle at most this share of the step


def _compare_11(got, want):
    p = _valid_11(got, want)
    return (p is not None and p.n_chips == want[2] and p.fits and p.bound == "compute"
            and p.bubble <= _MAX_BUBBLE
            and p.degrees.tp <= (get_chip(want[1]).ici_domain_chips or p.n_chips))


def _bad_keys(got, want, args):
    return not isinstance(got, dict) or set(got) - set(_KEYS) or not {"tp", "fsdp"} <= set(got)


def _bad_product(got, want, args):
    p = _valid_11(got, want)
    return p is not None and p.n_chips != want[2]


def _invalid(got, want, args):
    return _valid_11(got, want) is None


def _no_fit(got, want, args):
    p = _valid_11(got, want)
    return p is not None and not p.fits


def _tp_outside(got, want, args):
    p = _valid_11(got, want)
    return p is not None and p.degrees.tp > (get_chip(want[1]).ici_domain_chips or p.n_chips)


def _bubbly(got, want, args):
    p = _valid_11(got, want)
    return p is not None and p.bubble > _MAX_BUBBLE


def _comm_bound(got, want, args):
    p = _valid_11(got, want)
    return p is not None and p.bound != "compute"


register(CodeExercise(
    id="6.11", title="A plan that fits and is compute-bound", reference=_ref_11,
    compare=_compare_11, cases=_CASES_11, generate=_gen_11, drawn=2,
    describe=lambda m, c, n, B: f"{m} on {n} x {c}, batch {B} tokens",
    hints=[
        (_bad_keys, "return a dict with keys tp and fsdp, and optionally pp, dp, "
                    "microbatches, remat, keep_weights, zero, interleave (nothing else)."),
        (_invalid, "training.evaluate_plan refuses these degrees: run it on your dict to "
                   "see why (heads, F, layers and sequences must divide)."),
        (_bad_product, "tp x fsdp x pp x dp must equal the number of chips."),
        (_no_fit, "it does not fit in HBM: print training.evaluate_plan(...) and shard "
                  "more (FSDP), add microbatches, or rematerialise."),
        (_tp_outside, "TP must stay inside one fast domain (8 GPUs on an H100 server): "
                      "its collectives run every layer."),
        (_bubbly, "the pipeline idles more than a quarter of the step (print the plan's "
                  "bubble): give it more microbatches than stages, or fewer stages."),
        (_comm_bound, "it fits, but exposed collectives take longer than the compute: "
                      "print the plan's step line and move that traffic (fewer microbatches "
                      "or kept weights for FSDP over the scale-out network, smaller TP)."),
    ],
))


# 6.12 code: training state per chip -------------------------------------------------------
def _ref_12(n_params, tp, fsdp, pp):
    return par.training_memory_per_chip(n_params / (tp * pp), fsdp, 3).total


def _gen_12(rng):
    """A LLaMA-3 or an arbitrary parameter count on a TP x FSDP x PP split of real sizes."""
    n_params = rng.choice((8_030_261_248, 70_553_706_496, 405_853_388_800,
                           rng.randint(10**6, 10**12)))
    return (n_params, rng.choice((1, 2, 4, 8)), rng.choice((1, 2, 4, 8, 16, 32, 64, 128, 256)),
            rng.choice((1, 2, 4, 8, 16)))


register(CodeExercise(
    id="6.12", title="Training state per chip, in code", reference=_ref_12, rtol=1e-6,
    unit="bytes", generate=_gen_12,
    cases=[(70_553_706_496, 8, 64, 1), (8_030_261_248, 1, 16, 1),
           (405_853_388_800, 8, 64, 16), (1_000_000, 2, 1, 4)],
    describe=lambda N, t, f, p: f"N={N}, tp={t}, fsdp={f}, pp={p}",
    hints=[
        (lambda got, want, args: _close(got, 16 * args[0] / args[2], 1e-6),
         "TP and PP split the parameters too: divide by tp x fsdp x pp."),
        (lambda got, want, args: args[3] > 1 and _close(got, 16 * args[0] / (args[1]
                                                                         * args[2]), 1e-6),
         "the pipeline splits the layers, so each stage holds 1/pp of the parameters: "
         "divide by pp too."),
        (lambda got, want, args: _close(got, (2 + 14 / args[2]) * args[0]
                                        / (args[1] * args[3]), 1e-6),
         "ZeRO-3 shards the bf16 weights over FSDP too, not only the gradients and the "
         "fp32 state."),
        (lambda got, want, args: _close(got, 12 * args[0] / (args[1] * args[2] * args[3]),
                                        1e-6),
         "12 bytes is the fp32 master weights and Adam moments: add the bf16 weights and "
         "gradients (16 in all)."),
        (lambda got, want, args: _close(got, par.training_memory_per_chip(
            args[0] / (args[1] * args[3]), args[2], 1).total, 1e-6),
         "that is ZeRO-1: under FSDP the bf16 weights and gradients are sharded too."),
    ],
))
