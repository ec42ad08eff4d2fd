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
from .kinds import ChoiceExercise, CodeExercise, NumericExercise, as_number

FRAC = 0.9


def _close(a, b, rtol=0.02):
    return math.isclose(a, b, rel_tol=rtol)


def _m(name):
    return get_model(name)


def _pow2_at_least(x):
    return 2 ** math.ceil(math.log2(max(x, 1)))


# 8.1 -------------------------------------------------------------------------------------
_B1 = 64      # sequences: not the chapter's 32, whose slice section 8.1 prints


def _min_v5e(kv=True, s_w=1.0, frac=FRAC, pow2=True, s_kv=2):
    m, chip = _m("llama3-70b"), get_chip("tpu-v5e")
    cache = _B1 * 8192 * inf.kv_bytes_per_token(m) * s_kv / 2
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
        (lambda a: a in (_min_v5e(frac=1.0), _min_v5e(s_kv=1)),
         "too small: only 90% of each chip's HBM is usable, and the cache is bf16, 2 bytes "
         "per element (1 byte is the weights only)."),
        (lambda a: a in (_min_v5e(pow2=False), _min_v5e(pow2=False, frac=1.0)),
         "the planner's TPU slices come in powers of two: round up to the next one."),
    ],
))


# 8.2 -------------------------------------------------------------------------------------
def _kv405(heads=None, s=1, kv=2):
    m = _m("llama3-405b")
    return kv * m.n_layers * (m.n_kv_heads if heads is None else heads) * m.head_dim * s


register(NumericExercise(
    id="8.2", title="KV bytes per token of 405B with an int8 cache", unit="bytes",
    integer=True, reference=lambda: inf.kv_bytes_per_token("llama3-405b", dtype="int8"),
    hints=[
        (lambda a: a == _kv405(s=2), "that is a bf16 cache; int8 is 1 byte per element."),
        (lambda a: a == _kv405(kv=1), "a token stores a key and a value: a factor 2."),
        (lambda a: a == _kv405(heads=_m("llama3-405b").n_heads),
         "GQA caches only the 8 key/value heads, not all 128 query heads."),
    ],
))


# 8.3 -------------------------------------------------------------------------------------
_B3, _N3, _T3 = 64, 16, 8192


def _t3(s_w=0.5, kv=True, n=_N3, all_params=False):
    m, chip = _m("llama3-70b"), get_chip("tpu-v5e")
    w = (m.num_params() if all_params else m.matmul_params()) * s_w
    cache = _B3 * _T3 * inf.kv_bytes_per_token(m) if kv else 0
    return (w + cache) / (n * chip.hbm_bandwidth)


def _step3():
    return inf.decode_step_time("llama3-70b", "tpu-v5e", _B3, _T3, _N3, "int4",
                                check_memory=False).t_mem


register(NumericExercise(
    id="8.3", title="A decode step of 70B in int4", unit="seconds", rtol=0.03,
    reference=_step3,
    hints=[
        (lambda a: _close(a, _t3(s_w=2)), "the weights were counted in bf16; int4 is half "
         "a byte per weight."),
        (lambda a: _close(a, _t3(s_w=1)), "int4 is half a byte per weight, not one."),
        (lambda a: _close(a, _t3(kv=False)), "that is the weights alone; the step also reads "
         "the whole batch's cache, B T x 2 L H_kv h s bytes."),
        (lambda a: _close(a, _t3(n=1)), "the bytes are read by the 16 chips' HBM together."),
    ],
))


# 8.4 -------------------------------------------------------------------------------------
def _tps4():
    return _B3 / _step3() / _N3


register(NumericExercise(
    id="8.4", title="Tokens per second per chip", unit="tokens/s", rtol=0.03,
    reference=_tps4,
    hints=[
        (lambda a: _close(a, _tps4() * _N3), "that is the whole slice; divide by its 16 chips."),
        (lambda a: _close(a, _tps4() / _B3), "a step makes one token for each of the 64 "
         "sequences of the batch."),
        (lambda a: _close(a, _tps4() / (_B3 * _N3)), "that is one sequence on one chip: a step "
         "makes B tokens, shared by n chips."),
    ],
))


# 8.5 -------------------------------------------------------------------------------------
def _cost5(price_mult=1.0, per=3600):
    price = get_chip("tpu-v5e").price_per_hour * price_mult
    return price / per / _tps4() * 1e6


register(NumericExercise(
    id="8.5", title="Dollars per million output tokens", unit="dollars", rtol=0.03,
    reference=_cost5,
    hints=[
        (lambda a: _close(a, _cost5(price_mult=_N3)), "the price is per chip-hour and the "
         "throughput per chip: no factor 16."),
        (lambda a: _close(a, _cost5(per=1)), "the price is per hour and the throughput per "
         "second: divide the price by 3600."),
        (lambda a: _close(a, _cost5() / 1e6), "that is per token; the question asks per "
         "million tokens."),
    ],
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
def _full7(frac=FRAC, batch=None):
    m, chip = _m("llama3-8b"), get_chip("gpu-h100")
    per_seq = inf.kv_bytes_per_token(m) * 4096
    B = math.floor((frac * chip.hbm_bytes - m.weight_bytes(2)) / per_seq) if batch is None \
        else batch
    return (m.matmul_params() * 2 + B * per_seq) / chip.hbm_bandwidth


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
         "0.9 M_cap / W_hbm is the large-batch limit; count the bytes a step reads: the "
         "matmul weights and the caches of a whole number of sequences."),
    ],
))


# 8.8 -------------------------------------------------------------------------------------
def _bound8(hop=1e-6):
    return serving.plan_serving("llama3-70b", "tpu-v5e", n_chips=256, batch=32,
                                context_len=8192, hop_latency=hop).bound


register(ChoiceExercise(
    id="8.8", title="What bounds 70B on a whole v5e pod?",
    choices=("memory", "compute", "communication"), reference=_bound8,
    hints={"memory": "with 256 chips each reads 1/256 of the bytes; count the all-reduces' "
                     "hop latency: 2 L all-reduces, each of 2 (16 - 1) x 2 ring steps on a "
                     "16 x 16 torus.",
           "compute": "batch 32 is far below the critical batch: compute is the smallest of "
                      "the three."},
))


# 8.9 -------------------------------------------------------------------------------------
_N9 = (64, 128)   # section 8.2 prints 16 -> 64; beyond 64 is the exercise


def _trend9():
    a, b = (serving.plan_serving("llama3-70b", "tpu-v5e", n_chips=n).tokens_per_s_per_chip
            for n in _N9)
    return "rises" if b > 1.05 * a else ("falls" if b < a / 1.05 else "same")


register(ChoiceExercise(
    id="8.9", title="A bigger slice at a full HBM",
    choices=("rises", "same", "falls"), reference=_trend9,
    hints={"rises": "per chip the weights shrink and the batch grows, as from 16 to 64 "
                    "chips; but the step is no longer the HBM read: count the all-reduces "
                    "of a large batch on an 8 x 16 torus (plan_serving(..., n_chips=128)).",
           "same": "compare the step time at a full HBM with 0.9 M_cap / W_hbm: on 128 "
                   "chips something else takes longer."},
))


# 8.10 ------------------------------------------------------------------------------------
_CASES_10 = [("llama3-70b", "tpu-v5e", "int8", 8192, 64),
             ("llama3-8b", "gpu-h100", "bf16", 8192, 64),
             ("llama3-405b", "tpu-v6e", "int4", 4096, 16),
             ("llama3-70b", "gpu-h200", "bf16", 32768, 8),
             ("llama3-405b", "tpu-v5e", "int8", 8192, 32)]


def _min_slice_ref(model, chip, weights_dtype, context, min_batch):
    return serving.plan_serving(model, chip, weights_dtype, context_len=context,
                                output_len=1, min_batch=min_batch).n_chips


def _min_slice_variant(args, kv=True, frac=FRAC, pow2=True, s_kv=2):
    model, chip, wd, T, B = args
    m, c = _m(model), get_chip(chip)
    need = m.weight_bytes(inf.bytes_per_element(wd)) + (
        B * T * inf.kv_bytes_per_token(m) * s_kv / 2 if kv else 0)
    n = need / (frac * c.hbm_bytes)
    return _pow2_at_least(n) if pow2 else math.ceil(n)


register(CodeExercise(
    id="8.10", title="The smallest slice, in code", reference=_min_slice_ref,
    cases=_CASES_10, compare=lambda got, want: as_number(got) == want, unit="chips",
    describe=lambda m, c, w, T, B: f"{m} on {c}, {w}, context {T}, min_batch {B}",
    hints=[
        (lambda got, want, args: as_number(got) == _min_slice_variant(args, kv=False),
         "the weights fit, but the min_batch caches of context tokens must fit next to them."),
        (lambda got, want, args: as_number(got) in (_min_slice_variant(args, frac=1.0),
                                                    _min_slice_variant(args, s_kv=1)),
         "too small: only 90% of each chip's HBM is usable, and the cache is bf16, 2 bytes "
         "per element."),
        (lambda got, want, args: as_number(got) == _min_slice_variant(args, pow2=False),
         "slices come in powers of two: round up to the next one."),
    ],
))


# 8.11 ------------------------------------------------------------------------------------
_CASES_11 = [
    ([(2.0, 100.0), (1.0, 50.0), (3.0, 90.0), (4.0, 300.0), (1.5, 40.0)],),
    ([(10.0, 5.0), (20.0, 4.0), (5.0, 1.0), (30.0, 8.0), (25.0, 8.5), (7.0, 3.0)],),
    ([(1.0, 1.0)],),
    ([(3.0, 30.0), (1.0, 10.0), (2.0, 20.0), (2.5, 15.0)],),
    ([(2.0, 90.0), (3.0, 100.0), (1.0, 50.0), (2.0, 100.0)],),   # ties on each axis
]


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


def _wrong_direction(points):
    """Keeping points whose throughput is lower than all before (a min instead of a max)."""
    front, best = [], math.inf
    for lat, tps in sorted(points):
        if tps < best:
            front.append((lat, tps))
            best = tps
    return front


register(CodeExercise(
    id="8.11", title="The Pareto front, in code", reference=_pareto_ref, cases=_CASES_11,
    compare=_pareto_equal, describe=lambda pts: f"points={pts}",
    hints=[
        (lambda got, want, args: _as_pairs(got) == sorted(args[0]),
         "that is every point, sorted; drop the ones another point beats on both latency "
         "(lower) and throughput (higher)."),
        (lambda got, want, args: _as_pairs(got) is not None
         and sorted(_as_pairs(got)) == want and _as_pairs(got) != want,
         "the right points, in the wrong order: sort by latency."),
        (lambda got, want, args: _as_pairs(got) == _wrong_direction(args[0]),
         "more throughput is better: keep a point when its tokens/s beat every faster point's."),
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
    describe=_describe12,
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


# 8.14 ------------------------------------------------------------------------------------
# Paged KV on 8 v5e chips: 70B with int8 weights, bf16 cache, pages of 256 tokens. Half the
# requests hold 200 + 100 tokens at the end, half 3,000 + 1,000: how many fit at once?
_PAGE14, _SHORT14, _LONG14 = 256, (200, 100), (3000, 1000)


def _held14(page=_PAGE14, frac=FRAC, s_kv=2, prompt_only=False, pages=True, count=False):
    m, chip = _m("llama3-70b"), get_chip("tpu-v5e")
    free = 8 * chip.hbm_bytes * frac - m.weight_bytes(1.0)
    kv = inf.kv_bytes_per_token(m) * s_kv / 2
    lens = [p + (0 if prompt_only else o) for p, o in (_SHORT14, _LONG14)]
    if count:
        return 2 * math.floor(free / (max(lens) * kv) / 2)
    if not pages:
        return 2 * math.floor(free / kv / sum(lens))
    n_pages = math.floor(free / (page * kv))
    return 2 * (n_pages // sum(math.ceil(x / page) for x in lens))


def _ref14():
    fit = inf.fit_batch("llama3-70b", "tpu-v5e", 8, sum(_LONG14), weight_dtype="int8",
                        hbm_fraction=FRAC)
    n_pages = int(fit.free // (_PAGE14 * inf.kv_bytes_per_token("llama3-70b")))
    pair = inf.paged_kv_tokens([sum(_SHORT14), sum(_LONG14)], _PAGE14, sum(_LONG14))
    return 2 * (n_pages // (pair.paged // _PAGE14))


register(NumericExercise(
    id="8.14", title="Requests a paged cache holds", unit="requests", rtol=0.04,
    reference=_ref14,
    hints=[
        (lambda a: a == _held14(count=True) or _close(a, _held14(count=True) + 1, 0.001),
         "that reserves the longest request, 4,000 tokens, for every one (admission by "
         "count); with pages each request holds only its own length."),
        (lambda a: _close(a, _held14(pages=False), 0.02) or _close(a, _held14(page=16), 0.02),
         "pages are 256 tokens and allocated whole: a 300-token request holds 2 pages (512 "
         "slots), a 4,000-token one 16 (4,096)."),
        (lambda a: _close(a, _held14(prompt_only=True), 0.02),
         "that counts the prompts only; at the end every request also holds its output "
         "tokens' keys and values."),
        (lambda a: _close(a, _held14(frac=1.0), 0.02),
         "only 90% of each chip's HBM is usable, and the weights come out of it."),
        (lambda a: _close(a, _held14(s_kv=1), 0.02),
         "2x too many: the cache is bf16, 2 bytes per element."),
    ],
))
