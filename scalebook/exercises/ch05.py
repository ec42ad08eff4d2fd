"""Chapter 5 exercises: parallelism for training.

Reference answers are computed from scalebook (parallelism, collectives, hardware, models).
The mesh exercises run the student's program on the notebook's simulated devices
(``scalebook.setup()`` must have run), compare the numbers with an unsharded computation
and read the compiled program with :func:`scalebook.hlo.collectives`.
"""

from __future__ import annotations

import math
from fractions import Fraction

from .. import parallelism as par
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import (ChoiceExercise, CodeExercise, MeshProgramExercise, NotAttempted,
                    NumericExercise, VariedNumericExercise, mesh_inputs, returns_something)
from .kinds import statement_names as _words

__all__ = []


def _close(a, b, rtol=0.03):
    return math.isclose(a, b, rel_tol=rtol)


# Variants (for assignments; see kinds.VariedNumericExercise and chapter 1). The chapter's
# own numbers are each exercise's ``params``; an assignment draws others from ``choose``.
_MODELS = ("llama3-8b", "llama3-70b", "llama3-405b")
_TPUS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
_GPUS = ("gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200")




def _pct(x):
    return f"{x * 100:g}"


# 5.1 DP threshold, exact ------------------------------------------------------------------
def _ex1(n=8, backward_flops=4, directions=2, chip="tpu-v6e"):
    chip = get_chip(chip)
    frac = (n - 1) / n if n else 1.0
    return 2 * frac * 2 / (directions * chip.ici_link_bandwidth) / (backward_flops / chip.bf16_flops)


def _ex1_hints(chip, chips):
    return [
        (lambda a: _close(a, _ex1(None, chip=chip)),
         f"that is the large-n limit; with {chips} chips keep the factor (n - 1) / n = "
         f"{chips - 1}/{chips} of the ring all-reduce."),
        (lambda a: _close(a, _ex1(chips, backward_flops=6, chip=chip)),
         "the all-reduce can only overlap the backward pass (4 FLOPs per weight per token), "
         "not the forward pass too."),
        (lambda a: _close(a, 2 * _ex1(chips, chip=chip)),
         "2x too large: did you use a one-way ring (a torus axis sends half each way), or the "
         "forward pass's 2 FLOPs per weight per token instead of the backward's 4?"),
    ]


register(VariedNumericExercise(
    id="5.1", title="Batch per chip to hide the gradient all-reduce", unit="tokens",
    params={"chip": "tpu-v6e", "chips": 8}, choose={"chip": _TPUS, "chips": (4, 8, 16)},
    solve=lambda chip, chips: par.data_parallel_critical_batch(chip, chips),
    hints_for=_ex1_hints, describe=_words,
    ring=lambda chips, **_: chips, chips=lambda chips, **_: chips,
    statement="Data parallelism over the {chips} {chip_name} chips of one torus axis, with "
              "bf16 gradients. Each chip all-reduces its gradients (ring algorithm, both "
              "directions of the axis) while its backward pass runs at peak bf16 FLOP/s. From "
              "how many tokens per chip $b$ does the all-reduce take no longer than the "
              "backward pass's matmuls? Keep the factor $\\frac{{n-1}}{{n}}$ (here $n$ = "
              "{chips}). Answer in tokens per chip.",
))


# 5.2 ZeRO-2 memory ---------------------------------------------------------------------
def _ex2(stage=2, model="llama3-8b", n=16):
    return par.training_memory_per_chip(get_model(model).num_params(), n, stage).total


def _ex2_hints(model, n):
    return [
        # 1%: at n = 256 plain data parallelism (16 N) is 2.7% from 8x ZeRO-2's state
        (lambda a: _close(a, _ex2(1, model, n), 0.01),
         "that is ZeRO-1: stage 2 shards the gradients too."),
        (lambda a: _close(a, _ex2(3, model, n), 0.01),
         "that is ZeRO-3 (FSDP): at stage 2 every chip still holds all the bf16 weights."),
        (lambda a: _close(a, _ex2(0, model, n), 0.01),
         "that is plain data parallelism: nothing sharded."),
    ]


register(VariedNumericExercise(
    id="5.2", title="ZeRO-2 memory per chip", unit="bytes",
    params={"model": "llama3-8b", "n": 16},
    choose={"model": ("llama3-8b", "llama3-70b"), "n": (4, 8, 16, 32, 64, 128, 256)},
    solve=lambda model, n: _ex2(2, model, n), hints_for=_ex2_hints, describe=_words,
    chips=lambda n, **_: n,
    # a state that fits in the largest HBM of the book's table (a B200's)
    valid=lambda model, n: _ex2(2, model, n) <= get_chip("gpu-b200").hbm_bytes,
    statement="{model_name} is trained with mixed-precision Adam (bf16 weights and gradients, "
              "fp32 master weights, two fp32 moments: 16 bytes per parameter) on {n} chips "
              "with ZeRO stage 2. How many bytes of training state does each chip hold (no "
              "activations)? Answer in bytes.",
))


# 5.3 fewest chips for 405B with FSDP ----------------------------------------------------
def _ex3(rounding=math.ceil, hbm=None, left=0.3, model="llama3-405b", chip="tpu-v5p"):
    chip = get_chip(chip)
    hbm = chip.hbm_bytes if hbm is None else hbm
    return rounding(16 * get_model(model).num_params() / ((1 - left) * hbm))


def _ex3_hints(model, chip, left):
    right = _ex3(left=left, model=model, chip=chip)
    hints = [
        (lambda a: a == _ex3(math.floor, left=left, model=model, chip=chip) and a < right,
         "round up: with that many chips the state does not quite fit."),
    ]
    gib = get_chip(chip).hbm_bytes / 2**30
    if gib == round(gib):        # HBM listed in GiB (a TPU v4's 32, a v5p's 95)
        short = _words(chip=chip)["chip_short"]
        hints.append((lambda a: a == _ex3(hbm=gib * 1e9, left=left, model=model, chip=chip),
                      f"the {short}'s HBM is {gib:g} GiB (2**30 bytes each), not {gib:g} GB."))
    hints.append((lambda a: a == _ex3(left=0.0, model=model, chip=chip),
                  f"leave {_pct(left)}% of each chip's HBM for activations."))
    return hints


register(VariedNumericExercise(
    id="5.3", title="Fewest v5p chips to hold 405B's training state", unit="chips",
    integer=True, params={"model": "llama3-405b", "chip": "tpu-v5p", "left": 0.3},
    choose={"model": ("llama3-70b", "llama3-405b"), "chip": _TPUS + _GPUS,
            "left": (0.2, 0.3, 0.4, 0.5)},
    solve=lambda model, chip, left: _ex3(left=left, model=model, chip=chip),
    hints_for=_ex3_hints, describe=lambda model, chip, left: {**_words(model, chip),
                                                              "pct": _pct(left)},
    variant_title="Fewest {chip_short} chips to hold {size}'s training state",
    statement="With FSDP (ZeRO-3) over $n$ {chip_name} chips, each chip holds $1/n$ of "
              "{model_name}'s 16 bytes per parameter of training state. Leaving {pct}% of "
              "each chip's HBM for activations, what is the smallest $n$ for which the state "
              "fits? Answer in chips.",
))


# 5.4 TP degree with a faster link --------------------------------------------------------
def _fast():
    v5p = get_chip("tpu-v5p")
    return v5p.with_(ici_link_bandwidth=2 * v5p.ici_link_bandwidth)


def _ex4(matmuls=3):
    return par.max_tp_degree(get_model("llama3-70b").d_ff, _fast(), matmuls=matmuls)


register(NumericExercise(
    id="5.4", title="Tensor parallelism with faster links", unit="chips", integer=True,
    reference=_ex4,
    hints=[
        (lambda a: a == _ex4(matmuls=2), "LLaMA's MLP is gated: three matmuls (gate, up, "
         "down) share one all-reduce."),
        # today's link on a torus and the faster link on a one-way ring give the same degree
        (lambda a: a == par.max_tp_degree(get_model("llama3-70b").d_ff, "tpu-v5p", matmuls=3),
         "that is half the bandwidth: today's v5p link (here it is twice as fast), or a "
         "one-way ring (a torus axis sends both ways, 2 W_ici per chip)."),
    ],
))


# 5.5 which scheme? ------------------------------------------------------------------------
def _ex5():
    m = get_model("llama3-70b")
    n, B = 1024, 2 ** 20
    b = B / n
    chip = get_chip("tpu-v5p")
    if 16 * m.num_params() <= chip.hbm_bytes and b >= par.data_parallel_critical_batch(chip):
        return "dp"
    if b >= par.data_parallel_critical_batch(chip):
        return "fsdp"
    if b >= par.fsdp_tp_critical_batch(m.d_ff, chip):
        return "fsdp+tp"
    return "none"


register(ChoiceExercise(
    id="5.5", title="Which scheme is compute-bound?", choices=("dp", "fsdp", "fsdp+tp", "none"),
    reference=_ex5,
    hints={"dp": "data parallelism keeps the whole 70B Adam state (16 bytes per parameter) "
                 "on every chip: it does not fit.",
           "fsdp": "1024 tokens per chip is below FSDP's threshold s C / (4 W_ici) on one axis.",
           "none": "compare b = B / n with (s C / (4 W_ici))^2 / F, the 2D split's threshold."},
))


# 5.6 microbatches for a small bubble -----------------------------------------------------
def _ex6(P=16, target=0.1):
    t = Fraction(str(target))      # exact: 0.1 is 1/10, so 15 x 9 / 1 = 135, not 135.00001
    return math.ceil((P - 1) * (1 - t) / t)


def _ex6_hints(P, target):
    t = Fraction(str(target))
    return [
        (lambda a: a == math.ceil(P * (1 - t) / t), "the bubble is (P - 1) / (N_mb + P - 1): "
         "P - 1 stages idle at the start, not P."),
        (lambda a: a == math.ceil((P - 1) / t), "the total time is N_mb + P - 1 steps, not "
         f"N_mb: solve (P - 1) / (N_mb + P - 1) <= {target:g}."),
        (lambda a: a == _ex6(P, target) - 1,
         f"check: with that many the bubble is still above {_pct(target)}%."),
    ]


register(VariedNumericExercise(
    id="5.6", title="Microbatches for a small bubble", unit="microbatches", integer=True,
    params={"P": 16, "target": 0.1},
    choose={"P": (4, 8, 12, 16, 24, 32), "target": (0.05, 0.1, 0.2, 0.25)},
    solve=_ex6, hints_for=_ex6_hints,
    describe=lambda P, target: {"pct": _pct(target)},
    statement="A pipeline has {P} stages. What is the fewest microbatches "
              "$N_{{\\mathrm{{mb}}}}$ per step for which the bubble is at most {pct}% of the "
              "time? Answer in microbatches.",
))


# 5.7 expert capacity -------------------------------------------------------------------
def _ex7(k=8, cf=1.25, tokens=4096, E=64):
    return par.moe_capacity(tokens, E, k, cf).per_expert


def _ex7_hints(tokens, E, k, cf):
    hints = []
    if k > 1:
        hints.append((lambda a: a == _ex7(1, cf, tokens, E), f"each token goes to k = {k} "
                      f"experts: there are B k routed copies to place."))
    if cf != 1:
        hints.append((lambda a: a == _ex7(k, 1.0, tokens, E),
                      f"multiply by the capacity factor {cf:g}."))
    return hints


register(VariedNumericExercise(
    id="5.7", title="Slots per expert", unit="tokens", integer=True,
    params={"tokens": 4096, "E": 64, "k": 8, "cf": 1.25},
    choose={"tokens": (1024, 2048, 4096, 8192, 16384), "E": (8, 16, 32, 64, 128, 256),
            "k": (1, 2, 4, 8), "cf": (1.0, 1.25, 1.5, 2.0)},
    solve=lambda tokens, E, k, cf: _ex7(k, cf, tokens, E), hints_for=_ex7_hints,
    valid=lambda tokens, E, k, cf: 4 * k <= E,
    statement="An MoE layer with {E} experts routes each of {tokens} tokens to its top {k}, "
              "with a capacity factor of {cf:g}. How many slots (tokens) does each expert "
              "have?",
))


# 5.8 MoE critical batch ----------------------------------------------------------------
def _ex8(model="llama3-70b", E=16, k=2, chip="tpu-v5e"):
    m = get_model(model)
    return par.moe_critical_batch(m.d_model, m.d_ff, E, k, chip)


def _dense8(model="llama3-70b", chip="tpu-v5e"):
    from ..roofline import critical_batch
    m = get_model(model)
    return critical_batch(m.d_model, m.d_ff, chip)


def _ex8_hints(model, E, k, chip):
    dense = _dense8(model, chip)
    return [
        (lambda a: _close(a, dense), "that is the dense layer's batch; each expert sees "
         "only k / E of the tokens."),
        (lambda a: _close(a, dense * k / E), "the other way round: E / k times the dense "
         "batch."),
    ]


register(VariedNumericExercise(
    id="5.8", title="Batch for compute-bound experts", unit="tokens",
    params={"model": "llama3-70b", "E": 16, "k": 2, "chip": "tpu-v5e"},
    choose={"model": _MODELS, "E": (8, 16, 32, 64), "k": (1, 2, 4), "chip": _TPUS},
    solve=_ex8, hints_for=_ex8_hints, valid=lambda model, E, k, chip: 2 * k <= E,
    describe=_words,
    statement="An MoE layer has {E} experts, each an MLP with {model_name}'s $D$ and $F$ in "
              "bf16, and routes each token to its top {k}. One {chip_name} holds all {E} "
              "experts (no expert parallelism). How many tokens per chip (all experts' tokens "
              "together) does it need before each expert's matmul $[b_e, D] \\cdot [D, F]$ "
              "is compute-bound on its HBM (chapter 1's critical batch)? Answer in tokens.",
))


# 5.9 ring attention block --------------------------------------------------------------
def _ex9(kv=None, model="llama3-70b", chip="tpu-v5e"):
    m = get_model(model)
    return par.ring_attention_min_block(chip, m.n_heads, kv or m.n_kv_heads)


def _ex9_hints(model, chip):
    m = get_model(model)
    return [
        (lambda a: _close(a, _ex9(m.n_heads, model, chip)),
         f"LLaMA-3 uses grouped-query attention: only H_kv = {m.n_kv_heads} key/value heads "
         f"travel around the ring."),
        (lambda a: _close(a, _ex9(None, model, chip) / 2), "both K and V blocks travel: "
         "2 S K h s bytes."),
    ]


register(VariedNumericExercise(
    id="5.9", title="Positions per chip for ring attention", unit="tokens",
    params={"model": "llama3-70b", "chip": "tpu-v5e"},
    choose={"model": _MODELS, "chip": _TPUS + _GPUS},
    solve=lambda model, chip: _ex9(None, model, chip), hints_for=_ex9_hints,
    describe=lambda model, chip: {**_words(model, chip), "link": (
        "over one link in one direction" if chip.startswith("tpu") else
        "over NVLink in one direction (all of a GPU's NVLinks, its `ici_bandwidth`)")},
    statement="Ring attention over {chip_name} chips for {model_name} in bf16: each step, a "
              "chip attends its block of queries (all heads) to one K/V block while the next "
              "K/V block arrives {link}. How many positions per chip make the transfer no "
              "longer than the attention's matmuls? Answer in tokens.",
))


# 5.10 DCN tokens per slice -------------------------------------------------------------
register(NumericExercise(
    id="5.10", title="Tokens per slice across the DCN", unit="tokens",
    reference=lambda: par.dcn_critical_batch_per_slice("tpu-v5e", 4),
    ring=4, chips=lambda: get_chip("tpu-v5e").ici_domain_chips,
    hints=[
        (lambda a: _close(a, par.dcn_critical_batch_per_slice("tpu-v5e")), "that is the "
         "large-m limit; with m = 4 slices keep (m - 1) / m."),
        (lambda a: _close(a, par.dcn_critical_batch_per_slice("tpu-v5e", 4) / 256), "that is "
         "per chip; the question asks for the whole slice's batch (the chips cancel)."),
    ],
))


# 5.11 offload -------------------------------------------------------------------------------
def _ex11(bytes_per_param=8, round_trip=True, model="llama3-8b", n=16, chip="gpu-h100"):
    state = bytes_per_param * get_model(model).num_params() / n
    return par.offload_time(state, chip, round_trip=round_trip)


def _ex11_hints(model, n, chip):
    return [
        (lambda a: _close(a, _ex11(round_trip=False, model=model, n=n, chip=chip)), "the "
         "moments come in for the update and go back out: count both directions."),
        (lambda a: _close(a, _ex11(12, model=model, n=n, chip=chip)), "only the two moments "
         "(8 bytes per parameter) are offloaded here, not the master weights."),
    ]


register(VariedNumericExercise(
    id="5.11", title="Streaming Adam's moments over PCIe", unit="s",
    params={"model": "llama3-8b", "n": 16, "chip": "gpu-h100"},
    choose={"model": _MODELS, "n": (8, 16, 32, 64, 128), "chip": _GPUS},
    solve=lambda model, n, chip: _ex11(model=model, n=n, chip=chip), hints_for=_ex11_hints,
    chips=lambda n, **_: n,
    describe=_words,
    statement="{model_name} is trained with FSDP over {n} {chip_name} GPUs, and the two fp32 "
              "Adam moments (8 bytes per parameter) live in host memory. Every step each GPU "
              "copies its shard of the moments in over PCIe for the update and back out, the "
              "copy out after the copy in (count the two one after the other, at the "
              "{chip_short}'s `pcie_bandwidth`). How many seconds of PCIe transfer is that "
              "per step?",
))


# 5.12 optimal FSDP degree ---------------------------------------------------------------
def _ex12(B=2 ** 24, n=8192, model="llama3-405b"):
    return par.optimal_fsdp_degree(B, n, get_model(model).d_ff)


def _ex12_hints(B, n, model):
    x = _ex12(B, n, model)
    return [
        (lambda a: _close(a, n / x), "that is Y = n / X*, the tensor-parallel degree."),
        (lambda a: _close(a, math.sqrt(B / get_model(model).d_ff)),
         "X* = sqrt(B n / F): the chips n belong under the root too."),
        (lambda a: _close(a, x * math.sqrt(2)) or _close(a, x / math.sqrt(2)),
         "that puts the degrees on different numbers of torus axes; the exercise takes "
         "one axis each, a_X = a_Y = 1."),
    ]


register(VariedNumericExercise(
    id="5.12", title="The best FSDP degree of a 2D split", unit="chips", rtol=0.05,
    params={"B": 2 ** 24, "n": 8192, "model": "llama3-405b"},
    choose={"B": (2 ** 21, 2 ** 22, 2 ** 23, 2 ** 24), "n": (1024, 2048, 4096, 8192, 16384),
            "model": _MODELS},
    solve=_ex12, hints_for=_ex12_hints,
    valid=lambda B, n, model: 1 < _ex12(B, n, model) < n,
    describe=lambda B, n, model: {**_words(model), "log2B": B.bit_length() - 1},
    statement="{model_name} trains on {n} chips with a global batch of $2^{{{log2B}}}$ tokens, "
              "FSDP over $X$ chips and tensor parallelism over $Y = {n} / X$. Which $X$ "
              "minimises the communication of an MLP block, with each degree on one torus "
              "axis ($a_X = a_Y = 1$)? Give the large-$n$ optimum $X^{{*}}$ of section 5.4 as "
              "the formula gives it, a real number, not rounded to a divisor of {n}. Answer "
              "in chips.",
))


# ------------------------------------------------------------------------------------------
# Code answers
# ------------------------------------------------------------------------------------------

def _mlp(x, w_in, w_out):
    import numpy as np
    return np.maximum(x @ w_in, 0) @ w_out


# 5.13 FSDP gradients ---------------------------------------------------------------------
def _build_fsdp(answer, case, mesh):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    B, D, F = case
    arrays = mesh_inputs([(B, D), (D, F), (F, D), (B, D)], seed=B + D + F)
    args = [jax.device_put(a, NamedSharding(mesh, P("data"))) for a in arrays]
    student = returns_something(answer)

    def per_device(x, w_in, w_out, dy):
        out = student(x, w_in, w_out, dy)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError("return two arrays: (this device's rows of dW_in, of dW_out)")
        # both shards side by side, flattened on this device (no communication)
        return jnp.concatenate([jnp.ravel(out[0]), jnp.ravel(out[1])])

    fn = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("data"),
                               out_specs=P("data")))
    return fn, args


def _fsdp_expected(case, x, w_in, w_out, dy):
    import numpy as np
    x, w_in, w_out, dy = map(_np, (x, w_in, w_out, dy))
    h = x @ w_in
    d_in = x.T @ ((dy @ w_out.T) * (h > 0))                      # [D, F]
    d_out = np.maximum(h, 0).T @ dy                              # [F, D]
    rd, rf = d_in.shape[0] // 8, d_out.shape[0] // 8
    return np.concatenate([np.concatenate([d_in[i * rd:(i + 1) * rd].ravel(),
                                           d_out[i * rf:(i + 1) * rf].ravel()])
                           for i in range(8)])


def _fsdp_collectives(records, case):
    from .. import collectives
    B, D, F = case
    if any(r.kind == "all-reduce" for r in records):
        return ("an all-reduce of the gradients (psum, then a slice) sends twice the bytes "
                "of what FSDP needs: each device keeps only its rows of the sum, so "
                "reduce-scatter them (jax.lax.psum_scatter, tiled=True)")
    ag = [r for r in records if r.kind == "all-gather"]
    rs = [r for r in records if r.kind == "reduce-scatter"]
    if (len(ag) != 2 or len(rs) != 2 or len(records) != 4
            or any(r.group_size != 8 for r in records)):
        return ("expected two all-gathers (W_in, W_out) and two reduce-scatters (dW_in, "
                "dW_out) over all 8 devices, and nothing else")
    want = collectives.ring_bytes("all-gather", D * F * 4, 8)
    if not all(math.isclose(r.bytes_per_device, want) for r in records):
        return "the collectives should move the weights and their gradients, not activations"
    return None


register(MeshProgramExercise(
    id="5.13", title="FSDP weight gradients in shard_map",
    build=_build_fsdp, expected=_fsdp_expected,
    collectives_ok=_fsdp_collectives, cases=[(16, 16, 32), (32, 64, 16), (8, 24, 40)],
    mesh_shape=(8,), mesh_axes=("data",),
    describe=lambda B, D, F: f"x[{B},{D}], W_in[{D},{F}], W_out[{F},{D}], dy[{B},{D}]",
    error_hints=[("dot_general requires contracting dimensions", "gather each weight along "
                  "its first axis (tiled=True) before the matmuls."),
                 ("return two arrays", "return a tuple (dW_in rows, dW_out rows).")],
))


def _np(a):
    import numpy as np
    return np.asarray(a)


# 5.14 Megatron block with sequence parallelism ----------------------------------------
_SP = ("x", "y")


def _build_tp(answer, case, mesh):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    B, D, F = case
    x, w_in, w_out = mesh_inputs([(B, D), (D, F), (F, D)], seed=2 * B + D + F)
    specs = (P(_SP, None), P(None, "y"), P("y", None))
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((x, w_in, w_out), specs)]
    fn = jax.jit(jax.shard_map(returns_something(answer), mesh=mesh, in_specs=specs,
                               out_specs=P(_SP, None)))
    return fn, args


def _tp_collectives(records, case):
    from .. import collectives
    B, D, F = case
    act = B // 2 * D * 4                         # the [B/2, D] rows of one 'x' group, f32
    if any(r.kind == "all-reduce" for r in records):
        return ("an all-reduce (psum, then a slice) sends twice the bytes of a "
                "reduce-scatter: each device keeps only its own rows of the sum "
                "(jax.lax.psum_scatter, tiled=True)")
    ag = [r for r in records if r.kind == "all-gather"]
    rs = [r for r in records if r.kind == "reduce-scatter"]
    if any(not math.isclose(r.bytes_per_device, collectives.ring_bytes("all-gather", act, 4))
           for r in ag):
        return ("tensor parallelism keeps the weights split; gather the activations "
                "(the rows of x) over 'y' instead")
    if (len(ag) != 1 or len(rs) != 1 or len(records) != 2
            or any(r.group_size != 4 for r in records)):
        return ("expected exactly one all-gather of x and one reduce-scatter of the output, "
                "both over the 4 devices of axis 'y'")
    if not math.isclose(rs[0].bytes_per_device, collectives.ring_bytes("reduce-scatter", act, 4)):
        return "the reduce-scatter should sum the [B/2, D] partial outputs of the second matmul"
    return None


register(MeshProgramExercise(
    id="5.14", title="A sequence-parallel Megatron block in shard_map",
    build=_build_tp, expected=lambda case, x, w_in, w_out: _mlp(*map(_np, (x, w_in, w_out))),
    collectives_ok=_tp_collectives, cases=[(16, 16, 32), (32, 32, 64), (8, 8, 24)],
    describe=lambda B, D, F: f"x[{B},{D}], W_in[{D},{F}], W_out[{F},{D}]",
    error_hints=[("dot_general requires contracting dimensions", "this device holds only "
                  "B/8 rows of x: gather the rows of its 'x' group over 'y' first."),
                 ("check_vma", "the output is split over 'y' too: reduce-scatter the "
                               "partial sums instead of summing them everywhere.")],
))


# 5.15 experts ------------------------------------------------------------------------------
def _build_experts(answer, case, mesh):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    C, D = case
    buckets, w = mesh_inputs([(8 * 8, C, D), (8, D, D)], seed=C * D)
    args = [jax.device_put(a, NamedSharding(mesh, P("ep"))) for a in (buckets, w)]
    fn = jax.jit(jax.shard_map(returns_something(answer), mesh=mesh, in_specs=P("ep"), out_specs=P("ep")))
    return fn, args


def _experts_expected(case, buckets, w):
    import numpy as np
    b = np.asarray(buckets).reshape(8, 8, *buckets.shape[1:])       # [source, expert, C, D]
    w = np.asarray(w)
    out = np.tanh(np.einsum("secd,edf->secf", b, w))
    return out.reshape(buckets.shape)


def _experts_collectives(records, case):
    if any(r.kind == "all-gather" for r in records):
        return ("gathering every expert's weights onto every device is not expert "
                "parallelism: send the tokens to the experts with all-to-alls")
    a2a = [r for r in records if r.kind == "all-to-all"]
    if len(a2a) != 2 or len(records) != 2 or any(r.group_size != 8 for r in a2a):
        return "expected exactly two all-to-alls over the 8 devices: dispatch and combine"
    return None


register(MeshProgramExercise(
    id="5.15", title="Send tokens to their experts",
    build=_build_experts, expected=_experts_expected, collectives_ok=_experts_collectives,
    cases=[(4, 16), (2, 8), (6, 12)], mesh_shape=(8,), mesh_axes=("ep",),
    describe=lambda C, D: f"buckets[8, {C}, {D}] per device",
    error_hints=[("Incompatible shapes", "after the first all-to-all this device holds one "
                                         "bucket from each device, all for its own expert.")],
))


# 5.16 1F1B job lists --------------------------------------------------------------------
def _ref_1f1b(n_stages, n_mb):
    return par.pipeline_schedule(n_stages, n_mb, "1f1b")


def _compare_1f1b(got, want):
    try:
        sched = par.simulate_schedule(got)
    except Exception:
        return False
    return (sched.n_stages == want.n_stages and sched.n_microbatches == want.n_microbatches
            and sched.steps == want.steps
            and all(sched.in_flight(p) <= min(want.n_stages - p, want.n_microbatches)
                    for p in range(want.n_stages)))


def _hint_gpipe(got, want, args):
    s = par.simulate_schedule(got)
    return s.steps == want.steps and s.in_flight(0) > min(*args)


def _invalid_message(got, want, args):
    try:
        par.simulate_schedule(got)
    except ValueError as e:
        return True, str(e)
    return False, ""


def _gen_16(rng):
    """A pipeline of 2 to 8 stages and 1 to 16 microbatches (fewer than the stages too)."""
    return rng.randint(2, 8), rng.randint(1, 16)


register(CodeExercise(
    id="5.16", title="A 1F1B schedule", reference=_ref_1f1b, compare=_compare_1f1b,
    cases=[(4, 8), (3, 7), (5, 3), (2, 6)], generate=_gen_16,
    describe=lambda P_, M: f"n_stages={P_}, n_mb={M}",
    hints=[
        (lambda got, want, args: _invalid_message(got, want, args)[0],
         "these job lists are not a valid pipeline (run the chapter's "
         "par.simulate_schedule on them to see why)."),
        (_hint_gpipe, "the bubble is right but a stage holds more microbatches than 1F1B "
                      "allows (P - stage): that is GPipe. Start the backwards earlier."),
        (lambda got, want, args: par.simulate_schedule(got).steps > want.steps,
         "valid, but slower than 1F1B: the pipeline idles more than (P - 1) / (N_mb + P - 1)."),
    ],
))


# 5.17 2D specs, batch on 'y', gated MLP ----------------------------------------------
_X_SPEC = ("y", None)


def _gated(x, g, u, d):
    import numpy as np
    z = x @ g
    return (z / (1 + np.exp(-z)) * (x @ u)) @ d


def _build_specs(answer, case, mesh):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    B, D, F = case
    specs = answer(B, D, F)
    if specs is None:
        raise NotAttempted
    if not (isinstance(specs, (tuple, list)) and len(specs) == 3
            and all(isinstance(s, P) for s in specs)):
        raise TypeError("return three PartitionSpecs (spec_w_gate, spec_w_up, spec_w_down)")
    shard = [NamedSharding(mesh, s) for s in specs]
    for name, s, shape in [("W_gate", shard[0], (D, F)), ("W_up", shard[1], (D, F)),
                           ("W_down", shard[2], (F, D))]:
        if math.prod(s.shard_shape(shape)) * 8 != math.prod(shape):
            raise ValueError(f"{name} with {s.spec} leaves each device more than 1/8 of it")
    arrays = mesh_inputs([(B, D), (D, F), (D, F), (F, D)], seed=B * D + F)
    xs = NamedSharding(mesh, P(*_X_SPEC))
    fn = jax.jit(lambda x, g, u, d: (jax.nn.silu(x @ g) * (x @ u)) @ d,
                 in_shardings=(xs, *shard), out_shardings=xs)
    return fn, tuple(jax.device_put(a, s) for a, s in zip(arrays, (xs, *shard)))


def _best_2d_bytes(B, D, F):
    """Bytes per device of FSDP over 'y' (4) x TP over 'x' (2): gather each of the three
    weights' D over 'y' (a [D, F/2] slab each), all-reduce the [B/4, D] outputs over 'x'."""
    from .. import collectives
    return (3 * collectives.ring_bytes("all-gather", D * F // 2 * 4, 4)
            + collectives.ring_bytes("all-reduce", B // 4 * D * 4, 2))


def _specs_collectives(records, case):
    from .. import hlo
    B, D, F = case
    sent, bound = hlo.total_bytes(records), _best_2d_bytes(*case)
    if any(r.group_size == 8 for r in records):
        return (f"the program has a collective over all 8 devices (it sends "
                f"{sent:.0f} bytes per device; FSDP x TP here sends {bound:.0f}). Split "
                f"each weight's D over the batch's axis 'y' and its F over 'x'")
    if any(r.kind == "all-gather" and r.group_size == 2 for r in records):
        return ("weights are gathered over 'x': here the batch is split over 'y', so 'y' is "
                "the FSDP axis (gather D over it) and 'x' the tensor-parallel one (split F)")
    from .. import collectives
    slab = collectives.ring_bytes("all-gather", D * F // 2 * 4, 4)   # a [D, F/2] weight
    if any(r.kind == "all-gather" and not math.isclose(r.bytes_per_device, slab)
           for r in records):
        return ("an all-gather moves something other than one weight's [D, F/2] slab "
                "over 'y': FSDP gathers weights, and tensor parallelism over 'x' splits F")
    if any(r.kind in ("all-reduce", "reduce-scatter") and r.group_size != 2
           for r in records):
        return ("the partial outputs are summed over more than the 2 devices of 'x': "
                "split F over 'x' only, D over 'y'")
    if sent > 1.001 * bound:
        return (f"it sends {sent:.0f} bytes per device, more than FSDP over 'y' x TP over "
                f"'x' ({bound:.0f})")
    return None


register(MeshProgramExercise(
    id="5.17", title="PartitionSpecs for a 2D-sharded gated MLP",
    build=_build_specs, expected=lambda case, *a: _gated(*map(_np, a)),
    collectives_ok=_specs_collectives, cases=[(16, 32, 64), (32, 16, 32), (8, 64, 128)],
    answer_args=lambda case: case,
    rtol=1e-4,
    describe=lambda B, D, F: f"x[{B},{D}], W_gate, W_up[{D},{F}], W_down[{F},{D}]",
    error_hints=[("more than 1/8", "every device should hold 1/8 of each weight: use both "
                                   "mesh axes in each spec."),
                 ("three PartitionSpecs", "return a tuple (spec_w_gate, spec_w_up, "
                                          "spec_w_down) of jax.P(...).")],
))
