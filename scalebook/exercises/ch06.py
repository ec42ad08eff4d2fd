"""Chapter 6 exercises: training LLaMA-3. Reference answers are computed from scalebook."""

from __future__ import annotations

import math

from .. import parallelism as par
from .. import training as tr
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import ChoiceExercise, CodeExercise, NumericExercise, as_number

__all__: list[str] = []


def _close(a, b, rtol=0.02):
    a = as_number(a)
    return a is not None and b != 0 and math.isclose(a, b, rel_tol=rtol)


def _peak(chip):
    return get_chip(chip).bf16_flops


def _n(name):
    return get_model(name).num_params()


# 6.1 ------------------------------------------------------------------------------------
def _flops_8b():
    return get_model("llama3-8b").training_flops(15e12)


register(NumericExercise(
    id="6.1", title="Training FLOPs of 8B", unit="FLOPs", rtol=0.002, reference=_flops_8b,
    hints=[
        (lambda a: _close(a, _flops_8b() / 3), "that is 2 N N_tok, the forward pass only: the "
                                              "backward pass costs twice the forward."),
        (lambda a: _close(a, _flops_8b() * 2 / 3), "that is 4 N N_tok: add the forward pass (2N per "
                                                  "token) to the backward (4N)."),
    ],
))


# 6.2 ------------------------------------------------------------------------------------
def _days_405b():
    return get_model("llama3-405b").training_flops(15.6e12) / (
        16384 * _peak("gpu-h100") * 0.40) / 86400


register(NumericExercise(
    id="6.2", title="Days for 405B on 16K H100s", unit="days", rtol=0.02, reference=_days_405b,
    hints=[
        (lambda a: _close(a, _days_405b() * 24), "that is hours: divide by 24."),
        (lambda a: _close(a, _days_405b() * 0.4), "that is at 100% MFU: the chips deliver "
                                                  "only 0.40 of their peak."),
        (lambda a: _close(a, _days_405b() / 3), "6 FLOPs per parameter and token, not 2."),
    ],
))


# 6.3 ------------------------------------------------------------------------------------
def _usable(chip):
    return tr.DEFAULT_HBM_FRACTION * get_chip(chip).hbm_bytes


def _min_chips_405b():
    return math.ceil(16 * _n("llama3-405b") / _usable("tpu-v5p"))


register(NumericExercise(
    id="6.3", title="Fewest v5p chips for 405B's state", unit="chips", integer=True,
    rtol=0.0, reference=_min_chips_405b,
    hints=[
        (lambda a: a == math.floor(16 * _n("llama3-405b") / _usable("tpu-v5p")),
         "round up: a fraction of a chip does not exist, and fewer chips do not hold it."),
        (lambda a: a == math.ceil(16 * _n("llama3-405b") / get_chip("tpu-v5p").hbm_bytes),
         "leave the 10% of HBM for the compiler: divide by 0.9 x HBM."),
        (lambda a: a == math.ceil(2 * _n("llama3-405b") / _usable("tpu-v5p")),
         "that holds the bf16 weights only: Adam training keeps 16 bytes per parameter."),
        (lambda a: a == math.ceil(12 * _n("llama3-405b") / _usable("tpu-v5p")),
         "12 bytes is the fp32 master and moments: add the bf16 weights and gradients."),
        (lambda a: a == math.ceil(16 * _n("llama3-405b") / (tr.DEFAULT_HBM_FRACTION * 95e9)),
         "the v5p's HBM is 95 GiB (2**30 bytes each, about 1.02e11 bytes), not 95e9 bytes: "
         "use hbm_bytes."),
    ],
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
         "TP splits the parameters too: divide by TP x FSDP (x DP for the fp32 part)."),
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
    reference=_fsdp_gather_s,
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
def _bubble():
    return par.bubble_fraction(16, 64)


register(NumericExercise(
    id="6.6", title="The bubble of 16 stages", unit="fraction (0 to 1)", rtol=0.01,
    reference=_bubble,
    hints=[
        (lambda a: _close(a, 15 / 64, 0.01), "(P - 1) / N_mb is the bubble relative to the "
                                             "useful work; as a fraction of the whole step "
                                             "divide by N_mb + P - 1."),
        (lambda a: _close(a, 1 - _bubble(), 0.01), "that is the busy fraction; the bubble "
                                                   "is the idle part."),
        (lambda a: _close(a, 16 / (64 + 16), 0.01), "the fill and drain are P - 1 = 15 "
                                                    "pass slots, not P: (P - 1) / "
                                                    "(N_mb + P - 1)."),
    ],
))


# 6.7 ------------------------------------------------------------------------------------
def _mfu_tp():
    return tr.mfu_from_throughput("llama3-405b", 2**24 / 7.0, 16384, "gpu-h100")


register(NumericExercise(
    id="6.7", title="MFU from a step time", unit="fraction (0 to 1)", rtol=0.02,
    reference=_mfu_tp,
    hints=[
        (lambda a: _close(a, _mfu_tp() / 3), "6N FLOPs per token for training, not 2N."),
        (lambda a: _close(a, _mfu_tp() * 16384), "divide by the peak of all 16,384 GPUs."),
        (lambda a: _close(a, _mfu_tp() * 100), "a fraction between 0 and 1, not a percentage."),
        (lambda a: _close(a, tr.mfu_from_throughput("llama3-405b", 2**24 / 7.0, 16384,
                                                    "gpu-h100", seq_len=8192)),
         "that counts attention's FLOPs too: the exercise counts 6N per token."),
    ],
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
def _flops_405b():
    return 6 * _n("llama3-405b") * 15.6e12


def _cost_405b():
    """Chip-hours = FLOPs / (peak x MFU x 3600 s), whatever the number of chips."""
    ch = get_chip("tpu-v5p")
    return _flops_405b() / (ch.bf16_flops * 0.40 * 3600) * ch.price_per_hour


def _with_attention():
    c = get_model("llama3-405b")
    return _cost_405b() * c.training_flops_per_token(8192, causal=True) / (6 * c.num_params())


register(NumericExercise(
    id="6.10", title="The bill for 405B on v5p", unit="dollars", rtol=0.02,
    reference=_cost_405b,
    hints=[
        (lambda a: _close(a, _cost_405b() * 8192) or _close(a, _cost_405b() * 8960)
         or _close(a, _cost_405b() * 6144),
         "chip-hours = FLOPs / (one chip's peak x MFU x 3600 s) already count every chip: "
         "the bill does not depend on how many chips share the work."),
        (lambda a: _close(a, _cost_405b() * 3600), "the price is per chip-hour: divide the "
                                                   "chip-seconds by 3600."),
        (lambda a: _close(a, _cost_405b() * 0.40 ** 2), "a lower MFU makes the run longer, "
                                                        "so dearer: divide by 0.40."),
        (lambda a: _close(a, _cost_405b() * 0.40), "divide by the MFU of 0.40: at 40% of "
                                                   "the peak the chips take 2.5 times as "
                                                   "long."),
        (lambda a: _close(a, _cost_405b() * 15 / 15.6), "the run is 15.6T tokens, not 15T."),
        (lambda a: _close(a, _with_attention()),
         "that counts attention's FLOPs at 8K too: the exercise counts 6N per token."),
    ],
))


# 6.11 code: a sharding that fits and is compute-bound ------------------------------------
_CASES_11 = [("llama3-70b", "gpu-h100", 128, 2**22), ("llama3-8b", "tpu-v5p", 256, 2**22),
             ("llama3-70b", "tpu-v5p", 1024, 2**22), ("llama3-405b", "tpu-v5p", 4096, 2**24)]
_DEFAULTS = dict(tp=1, fsdp=1, pp=1, dp=1, microbatches=1, remat="none",
                 keep_weights=False, zero=0, interleave=1)
_KEYS = tuple(_DEFAULTS)


def _ref_11(model, chip, n, B):
    return (model, chip, n, B)


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
    compare=_compare_11, cases=_CASES_11,
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


register(CodeExercise(
    id="6.12", title="Training state per chip, in code", reference=_ref_12, rtol=1e-6,
    unit="bytes",
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
