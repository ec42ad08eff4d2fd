"""Chapter 5 exercises: parallelism for training.

Reference answers are computed from scalebook (parallelism, collectives, hardware, models).
The mesh exercises run the student's program on the notebook's simulated devices
(``scalebook.setup()`` must have run), compare the numbers with an unsharded computation
and read the compiled program with :func:`scalebook.hlo.collectives`.
"""

from __future__ import annotations

import math

from .. import parallelism as par
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import (ChoiceExercise, CodeExercise, MeshProgramExercise, NotAttempted,
                    NumericExercise, mesh_inputs, returns_something)

__all__ = []


def _close(a, b, rtol=0.03):
    return math.isclose(a, b, rel_tol=rtol)


# 5.1 DP threshold, exact ------------------------------------------------------------------
def _ex1(n=8, backward_flops=4, directions=2):
    chip = get_chip("tpu-v6e")
    frac = (n - 1) / n if n else 1.0
    return 2 * frac * 2 / (directions * chip.ici_link_bandwidth) / (backward_flops / chip.bf16_flops)


register(NumericExercise(
    id="5.1", title="Batch per chip to hide the gradient all-reduce", unit="tokens",
    reference=lambda: par.data_parallel_critical_batch("tpu-v6e", 8),
    hints=[
        (lambda a: _close(a, _ex1(n=None)), "that is the large-n limit; with 8 chips keep the "
         "factor (n - 1) / n = 7/8 of the ring all-reduce."),
        (lambda a: _close(a, _ex1(backward_flops=6)), "the all-reduce can only overlap the "
         "backward pass (4 FLOPs per weight per token), not the forward pass too."),
        (lambda a: _close(a, 2 * _ex1()), "2x too large: did you use a one-way ring (a torus "
         "axis sends half each way), or the forward pass's 2 FLOPs per weight per token "
         "instead of the backward's 4?"),
    ],
))


# 5.2 ZeRO-2 memory ---------------------------------------------------------------------
def _ex2(stage=2):
    return par.training_memory_per_chip(get_model("llama3-8b").num_params(), 16, stage).total


register(NumericExercise(
    id="5.2", title="ZeRO-2 memory per chip", unit="bytes", reference=_ex2,
    hints=[
        (lambda a: _close(a, _ex2(1)), "that is ZeRO-1: stage 2 shards the gradients too."),
        (lambda a: _close(a, _ex2(3)), "that is ZeRO-3 (FSDP): at stage 2 every chip still "
         "holds all the bf16 weights."),
        (lambda a: _close(a, _ex2(0)), "that is plain data parallelism: nothing sharded."),
    ],
))


# 5.3 fewest chips for 405B with FSDP ----------------------------------------------------
def _ex3(rounding=math.ceil, hbm=None, left=0.3):
    chip = get_chip("tpu-v5p")
    hbm = chip.hbm_bytes if hbm is None else hbm
    return rounding(16 * get_model("llama3-405b").num_params() / ((1 - left) * hbm))


register(NumericExercise(
    id="5.3", title="Fewest v5p chips to hold 405B's training state", unit="chips",
    integer=True, reference=_ex3,
    hints=[
        (lambda a: a == _ex3(math.floor) and a < _ex3(), "round up: with that many chips the "
         "state does not quite fit."),
        (lambda a: a == _ex3(hbm=95e9), "the v5p's HBM is 95 GiB (2**30 bytes each), not "
         "95 GB."),
        (lambda a: a == _ex3(left=0.0), "leave 30% of each chip's HBM for activations."),
    ],
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


# 5.6 microbatches for a 10% bubble -----------------------------------------------------
def _ex6(P_=16, target=0.1):
    return math.ceil((P_ - 1) * (1 - target) / target - 1e-9)


register(NumericExercise(
    id="5.6", title="Microbatches for a small bubble", unit="microbatches", integer=True,
    reference=_ex6,
    hints=[
        (lambda a: a == math.ceil(16 * 0.9 / 0.1), "the bubble is (P - 1) / (N_mb + P - 1): "
         "P - 1 stages idle at the start, not P."),
        (lambda a: a == math.ceil(15 / 0.1), "the total time is N_mb + P - 1 steps, not N_mb: "
         "solve (P - 1) / (N_mb + P - 1) <= 0.1."),
        (lambda a: a == _ex6() - 1, "check: with that many the bubble is still above 10%."),
    ],
))


# 5.7 expert capacity -------------------------------------------------------------------
def _ex7(k=8, cf=1.25):
    return par.moe_capacity(4096, 64, k, cf).per_expert


register(NumericExercise(
    id="5.7", title="Slots per expert", unit="tokens", integer=True, reference=_ex7,
    hints=[
        (lambda a: a == _ex7(k=1), "each token goes to k = 8 experts: there are B k routed "
         "copies to place."),
        (lambda a: a == _ex7(cf=1.0), "multiply by the capacity factor 1.25."),
    ],
))


# 5.8 MoE critical batch ----------------------------------------------------------------
def _ex8():
    m = get_model("llama3-70b")
    return par.moe_critical_batch(m.d_model, m.d_ff, 16, 2, "tpu-v5e")


def _dense8():
    from ..roofline import critical_batch
    m = get_model("llama3-70b")
    return critical_batch(m.d_model, m.d_ff, "tpu-v5e")


register(NumericExercise(
    id="5.8", title="Batch for compute-bound experts", unit="tokens", reference=_ex8,
    hints=[
        (lambda a: _close(a, _dense8()), "that is the dense layer's batch; each expert sees "
         "only k / E of the tokens."),
        (lambda a: _close(a, _dense8() * 2 / 16), "the other way round: E / k times the dense "
         "batch."),
    ],
))


# 5.9 ring attention block --------------------------------------------------------------
def _ex9(kv=None):
    m = get_model("llama3-70b")
    return par.ring_attention_min_block("tpu-v5e", m.n_heads, kv or m.n_kv_heads)


register(NumericExercise(
    id="5.9", title="Positions per chip for ring attention", unit="tokens", reference=_ex9,
    hints=[
        (lambda a: _close(a, _ex9(kv=get_model("llama3-70b").n_heads)), "LLaMA-3 uses grouped-"
         "query attention: only H_kv = 8 key/value heads travel around the ring."),
        (lambda a: _close(a, _ex9() / 2), "both K and V blocks travel: 2 S K h s bytes."),
    ],
))


# 5.10 DCN tokens per slice -------------------------------------------------------------
register(NumericExercise(
    id="5.10", title="Tokens per slice across the DCN", unit="tokens",
    reference=lambda: par.dcn_critical_batch_per_slice("tpu-v5e", 4),
    hints=[
        (lambda a: _close(a, par.dcn_critical_batch_per_slice("tpu-v5e")), "that is the "
         "large-m limit; with m = 4 slices keep (m - 1) / m."),
        (lambda a: _close(a, par.dcn_critical_batch_per_slice("tpu-v5e", 4) / 256), "that is "
         "per chip; the question asks for the whole slice's batch (the chips cancel)."),
    ],
))


# 5.11 offload -------------------------------------------------------------------------------
def _ex11(bytes_per_param=8, round_trip=True):
    state = bytes_per_param * get_model("llama3-8b").num_params() / 16
    return par.offload_time(state, "gpu-h100", round_trip=round_trip)


register(NumericExercise(
    id="5.11", title="Streaming Adam's moments over PCIe", unit="s", reference=_ex11,
    hints=[
        (lambda a: _close(a, _ex11(round_trip=False)), "the moments come in for the update "
         "and go back out: count both directions."),
        (lambda a: _close(a, _ex11(12)), "only the two moments (8 bytes per parameter) are "
         "offloaded here, not the master weights."),
    ],
))


# 5.12 optimal FSDP degree ---------------------------------------------------------------
def _ex12():
    return par.optimal_fsdp_degree(2 ** 24, 8192, get_model("llama3-405b").d_ff)


register(NumericExercise(
    id="5.12", title="The best FSDP degree of a 2D split", unit="chips", reference=_ex12,
    rtol=0.05,
    hints=[
        (lambda a: _close(a, 8192 / _ex12()), "that is Y = n / X*, the tensor-parallel degree."),
        (lambda a: _close(a, math.sqrt(2 ** 24 / get_model("llama3-405b").d_ff)),
         "X* = sqrt(B n / F): the chips n belong under the root too."),
        (lambda a: _close(a, _ex12() * math.sqrt(2)) or _close(a, _ex12() / math.sqrt(2)),
         "that puts the degrees on different numbers of torus axes; the exercise takes "
         "one axis each, a_X = a_Y = 1."),
    ],
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


register(CodeExercise(
    id="5.16", title="A 1F1B schedule", reference=_ref_1f1b, compare=_compare_1f1b,
    cases=[(4, 8), (3, 7), (5, 3), (2, 6)],
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
