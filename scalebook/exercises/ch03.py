"""Chapter 3 exercises: sharded matrices and collectives.

Reference answers are computed from scalebook (collectives, roofline, hardware, models). The code
exercises run the student's program on the 2x4 mesh of the notebook (``scalebook.setup()``
must have run), compare the numbers with an unsharded computation, and read the compiled
program with :func:`scalebook.hlo.collectives` to check which collectives it contains.
"""

from __future__ import annotations

import math

from .. import collectives
from .. import roofline as rl
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import (ChoiceExercise, MeshProgramExercise, NotAttempted, NumericExercise,
                    VariedNumericExercise, mesh_inputs, returns_something)

__all__ = ["MESH_SHAPE", "MESH_AXES"]

MESH_SHAPE, MESH_AXES = (2, 4), ("x", "y")


def _close(a, b, rtol=0.03):
    return math.isclose(a, b, rel_tol=rtol)


def _70b():
    return get_model("llama3-70b")


# Variants (for assignments; see kinds.VariedNumericExercise). The chapter's own numbers
# are each exercise's ``params``; an assignment draws others from ``choose``.
_MODELS = ("llama3-8b", "llama3-70b", "llama3-405b")
_SIZE = {"llama3-8b": "8B", "llama3-70b": "70B", "llama3-405b": "405B"}
_SHORT = {"tpu-v4": "v4", "tpu-v5e": "v5e", "tpu-v5p": "v5p", "tpu-v6e": "v6e"}
_TPUS = tuple(_SHORT)


def _torus_axis(chip, n):
    """Whether ``n`` chips of ``chip`` form a torus axis (wraparound links): on v5e and
    v6e only the full 16-chip axis of a pod; on v4 and v5p an axis of a slice made of
    whole 4 x 4 x 4 cubes (4, 8, 16, ... chips)."""
    if get_chip(chip).topology.startswith("2D"):
        return n == 16
    return n % 4 == 0


# 3.1 -------------------------------------------------------------------------------------
def _w_up_bytes(bytes_per_element=2, model="llama3-70b", matrix="up"):
    m = get_model(model)
    cols = {"up": m.d_ff, "query": m.n_heads * m.head_dim,
            "key": m.n_kv_heads * m.head_dim}[matrix]
    return m.d_model * cols * bytes_per_element


def _ex1(bytes_per_element=2, model="llama3-70b", matrix="up", n=16):
    nbytes = _w_up_bytes(bytes_per_element, model, matrix)
    return collectives.ring_bytes("all-gather", nbytes, n)


def _ex1_hints(model, matrix, n):
    whole = _w_up_bytes(2, model, matrix)
    return [
        # 0.5%: at n = 16 the whole matrix, 16/15 of the answer, is 0.7% from GiB's 1.074
        (lambda a: _close(a, whole, 0.005), "that is the whole matrix; a device already holds "
         "its own 1/n and receives (and forwards) the other n - 1 shards."),
        (lambda a: _close(a, whole / n), "that is one shard. In a ring every device "
         "passes on n - 1 shards."),
        (lambda a: _close(a, _ex1(4, model, matrix, n)),
         "bf16 takes 2 bytes per element, not 4."),
    ]


_MATRIX_WORDS = {"up": "up-projection", "query": "query projection",
                 "key": "key projection"}
_MATRIX_SHAPE = {"up": "W[D, F]", "query": "W_Q[D, H h]", "key": "W_K[D, H_{kv} h]"}

register(VariedNumericExercise(
    id="3.1", title="Bytes of an FSDP all-gather", unit="bytes",
    params={"model": "llama3-70b", "matrix": "up", "n": 16},
    choose={"model": _MODELS, "matrix": tuple(_MATRIX_WORDS), "n": (4, 8, 16, 32)},
    solve=lambda model, matrix, n: _ex1(2, model, matrix, n), hints_for=_ex1_hints,
    ring=lambda n, **_: n, chips=lambda n, **_: n,
    describe=lambda model, matrix, n: {"size": _SIZE[model],
                                       "what": _MATRIX_WORDS[matrix],
                                       "shape": _MATRIX_SHAPE[matrix]},
    statement="The {what} of LLaMA-3 {size}, ${shape}$ in bf16, is sharded over {n} "
              "chips. How many bytes does each chip send when they all-gather it with "
              "the ring algorithm?",
))


# 3.2 -------------------------------------------------------------------------------------
def _ex2(topology="torus", model="llama3-70b", n=8, chip="tpu-v5p"):
    return collectives.collective_time("all-reduce", _w_up_bytes(model=model), n, chip,
                                       topology=topology)


def _ex2_hints(model, n, chip):
    return [
        (lambda a: _close(a, _ex2("ring", model, n, chip)), "that is a one-way ring. A "
         "torus axis with wraparound sends half the data each way, over two links."),
        (lambda a: _close(a, _ex2("torus", model, n, chip) / 2), "an all-reduce is a "
         "reduce-scatter and then an all-gather: 2 (n - 1) / n times the array."),
    ]


register(VariedNumericExercise(
    id="3.2", title="All-reduce of a gradient on a v5p axis", unit="s",
    params={"model": "llama3-70b", "n": 8, "chip": "tpu-v5p"},
    choose={"model": _MODELS, "n": (4, 8, 16), "chip": _TPUS},
    solve=lambda model, n, chip: _ex2("torus", model, n, chip), hints_for=_ex2_hints,
    ring=lambda n, **_: n,
    valid=lambda model, n, chip: _torus_axis(chip, n),
    describe=lambda model, n, chip: {"short": _SHORT[chip], "size": _SIZE[model]},
    variant_title="All-reduce of a gradient on a {short} axis",
    statement="The bf16 gradient of LLaMA-3 {size}'s up-projection $W[D, F]$ is "
              "all-reduced over the {n} chips of one TPU {short} torus axis "
              "(wraparound, links used in both directions). How long does it take at "
              "least, in seconds?",
))


# 3.3 - 3.5 -------------------------------------------------------------------------------
_KINDS = ("none", "all-gather", "reduce-scatter", "all-reduce", "all-to-all")

register(ChoiceExercise(
    id="3.3", title="Contraction sharded on both sides", choices=_KINDS,
    reference=lambda: "all-reduce",
    hints={"reduce-scatter": "a reduce-scatter leaves O[I, K_X] sharded; here every device "
                             "must end with the whole O.",
           "all-gather": "gathering A and W would work but moves the inputs; the partial sums "
                         "are already computed locally. What combines partial sums?",
           "none": "each device holds only part of the sum over J: the results must be added.",
           "all-to-all": "nothing is being transposed between dimensions; partial sums must be added."},
))

register(ChoiceExercise(
    id="3.4", title="Both operands sharded on the same axis", choices=_KINDS,
    reference=lambda: "all-gather",
    hints={"none": "O[I_X, K_X] is not a valid sharding: a mesh axis may shard only one "
                   "dimension. One operand has to be made whole along X first.",
           "all-reduce": "there are no partial sums: J is not sharded.",
           "reduce-scatter": "there are no partial sums to reduce: J is not sharded.",
           "all-to-all": "an all-to-all would move W's sharding to J, which is not what is asked; "
                         "to get O[I_X, K] each device needs all of W's columns."},
))

register(ChoiceExercise(
    id="3.5", title="Move a sharding from rows to columns", choices=_KINDS,
    reference=lambda: "all-to-all",
    hints={"all-gather": "an all-gather then a local slice works but holds the whole array "
                         "for a moment and moves n times more data.",
           "none": "the device that holds rows 0..I/n must receive pieces of every other row.",
           "all-reduce": "nothing is summed.", "reduce-scatter": "nothing is summed."},
))


# 3.6 -------------------------------------------------------------------------------------
def _a2a_bytes(B=4096, model="llama3-70b"):
    return B * get_model(model).d_model * 2


def _ex6(B=4096, model="llama3-70b", n=16, chip="tpu-v5e"):
    return collectives.collective_time("all-to-all", _a2a_bytes(B, model), n, chip,
                                       topology="torus")


def _ex6_hints(B, model, n, chip):
    nbytes = _a2a_bytes(B, model)
    return [
        (lambda a: _close(a, collectives.ring_bytes("all-to-all", nbytes, n)
                          / (2 * get_chip(chip).ici_link_bandwidth)),
         "that counts each block once, but a block for a device d steps away crosses "
         "min(d, n - d) links on its way."),
        (lambda a: _close(a, collectives.collective_time("all-to-all", nbytes, n, chip,
                                                         topology="ring")),
         "that is a one-way ring; the torus axis sends each block the shorter way round."),
    ]


register(VariedNumericExercise(
    id="3.6", title="All-to-all on a bidirectional ring", unit="s",
    params={"B": 4096, "model": "llama3-70b", "n": 16, "chip": "tpu-v5e"},
    choose={"B": (1024, 2048, 4096, 8192), "model": _MODELS, "n": (4, 8, 16),
            "chip": _TPUS},
    solve=_ex6, hints_for=_ex6_hints, ring=lambda n, **_: n,
    valid=lambda B, model, n, chip: _torus_axis(chip, n),
    describe=lambda B, model, n, chip: {"short": _SHORT[chip], "size": _SIZE[model]},
    statement="Each of {n} TPU {short} chips on one torus axis holds activations of "
              "{B} tokens by $D$ of LLaMA-3 {size} in bf16, and they do an all-to-all "
              "over the axis (as when routing tokens to experts). Using the busiest "
              "link's load, how long does it take, in seconds?",
))


# 3.7 -------------------------------------------------------------------------------------
# TPU v4, not v5p: section 3.5 prints the threshold of v5e, v5p and v6e at n = 16.
def _ex7(topology="torus", n=16, chip="tpu-v4"):
    m = _70b()
    t_gather = collectives.collective_time("all-gather", _w_up_bytes(), n, chip, topology=topology)
    t_per_token = rl.compute_time(rl.matmul_flops(1, m.d_model, m.d_ff), chip)
    return t_gather / t_per_token


register(NumericExercise(
    id="3.7", title="Tokens per chip to hide the FSDP all-gather", unit="tokens", reference=_ex7,
    ring=16,
    hints=[
        # A one-way ring and 1 FLOP per multiply-add both give exactly 2x: one hint for both.
        (lambda a: _close(a, _ex7("ring")), "2x too large: did you use a one-way ring (a torus "
         "axis sends both ways, halving the gather), or count 1 FLOP per multiply-add instead "
         "of 2?"),
        (lambda a: _close(a, _ex7() * 16 / 15), "keep the (n - 1) / n of the ring all-gather."),
        (lambda a: _close(a, _ex7(chip="tpu-v5p")), "that is a v5p's threshold; use the v4's "
         "peak FLOP/s and ICI bandwidth."),
    ],
))


# 3.8 -------------------------------------------------------------------------------------
# 405B, not 70B: section 3.6 prints the reduce-scatter of a 70B layer on this slice.
def _ex8(axes=(4, 4, 4), model="llama3-405b", chip="tpu-v5p"):
    return collectives.collective_time("reduce-scatter", get_model(model).params_per_layer() * 2,
                                       axes, chip)


def _axes(shape):
    return tuple(int(a) for a in shape.split("x"))


def _ex8_hints(shape, model, chip):
    axes = _axes(shape)
    n = math.prod(axes)
    hints = [
        (lambda a: _close(a, _ex8(n, model, chip)),
         f"the {n} chips form three torus axes; a collective over all of them uses the "
         f"links of all three (divide by 3)."),
        # An all-reduce and a one-way ring both give exactly 2x: one hint for both.
        (lambda a: _close(a, 2 * _ex8(axes, model, chip)), "2x too large: did you time "
         "an all-reduce (a reduce-scatter sends only (n - 1) / n times the array, half "
         "as much), or a one-way ring (each torus axis sends both ways)?"),
    ]
    if model != "llama3-70b":
        hints.append((lambda a: _close(a, _ex8(axes, "llama3-70b", chip)),
                      f"that is a LLaMA-3 70B layer (section 3.6's example); this "
                      f"exercise asks about {_SIZE[model]}."))
    return hints


register(VariedNumericExercise(
    id="3.8", title="Reduce-scatter of one layer's gradients", unit="s",
    params={"shape": "4x4x4", "model": "llama3-405b", "chip": "tpu-v5p"},
    # Slices of whole 4 x 4 x 4 cubes: every axis a torus.
    choose={"shape": ("4x4x4", "4x4x8", "4x8x8", "8x8x8", "4x4x16", "8x8x16"),
            "model": _MODELS, "chip": ("tpu-v4", "tpu-v5p")},
    solve=lambda shape, model, chip: _ex8(_axes(shape), model, chip),
    hints_for=_ex8_hints, ring=lambda shape, **_: math.prod(_axes(shape)),
    valid=lambda shape, model, chip: (shape, model, chip) != ("4x4x4", "llama3-70b",
                                                              "tpu-v5p"),
    describe=lambda shape, model, chip: {"short": _SHORT[chip], "size": _SIZE[model],
                                         "times": " \\times ".join(shape.split("x"))},
    statement="The bf16 gradients of one LLaMA-3 {size} layer (all its parameters, "
              "`get_model(\"{model}\").params_per_layer()`) are reduce-scattered over "
              "a ${times}$ TPU {short} slice, using all three torus axes. How long "
              "does it take, in seconds?",
))


# 3.9 -------------------------------------------------------------------------------------
def _ex9(n=8, matmuls=3, model="llama3-70b", chip="tpu-v5p"):
    m = get_model(model)
    B = 4096
    t_comm = collectives.collective_time("all-reduce", B * m.d_model * 2, n, chip)
    t_math = rl.compute_time(matmuls * rl.matmul_flops(B, m.d_model, m.d_ff) / n, chip)
    return t_comm / t_math


def _ex9_hints(model, n, chip):
    return [
        (lambda a: _close(a, _ex9(n, 1, model, chip)),
         f"the gated MLP has three matmuls (gate, up, down), all sharded over the {n} "
         f"chips."),
        (lambda a: _close(a, _ex9(n, 2, model, chip)), "LLaMA's MLP is gated: gate, up "
         "and down are three matmuls."),
    ]


register(VariedNumericExercise(
    id="3.9", title="Tensor-parallel MLP: communication over compute", unit="(ratio)",
    params={"model": "llama3-70b", "n": 8, "chip": "tpu-v5p"},
    choose={"model": _MODELS, "n": (4, 8, 16), "chip": _TPUS},
    solve=lambda model, n, chip: _ex9(n, 3, model, chip), hints_for=_ex9_hints,
    ring=lambda n, **_: n, chips=lambda n, **_: n,
    # Section 3.6 prints the ratio for 70B over 4 v5p chips.
    valid=lambda model, n, chip: (_torus_axis(chip, n)
                                  and (model, n, chip) != ("llama3-70b", 4, "tpu-v5p")),
    describe=lambda model, n, chip: {"short": _SHORT[chip], "size": _SIZE[model]},
    statement="LLaMA-3 {size}'s gated MLP is tensor-parallel over the {n} chips of one "
              "TPU {short} torus axis, as in section 3.6, with a batch of 4096 tokens. "
              "What is the ratio $T_{{\\mathrm{{comm}}}} / T_{{\\mathrm{{math}}}}$ of "
              "the all-reduce of the bf16 output $[B, D]$ to the time of the MLP's "
              "matmuls on one chip at peak?",
))


# ------------------------------------------------------------------------------------------
# Code exercises run on the mesh
# ------------------------------------------------------------------------------------------

def _only_kinds(records, allowed):
    return [r for r in records if r.kind not in allowed]


# 3.10 FSDP matmul: all-gather the weight ---------------------------------------------------
def _build_fsdp(answer, case, mesh):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    B, D, F = case
    x, w = mesh_inputs([(B, D), (D, F)], seed=B + D + F)
    x = jax.device_put(x, NamedSharding(mesh, P("x", None)))
    w = jax.device_put(w, NamedSharding(mesh, P("y", None)))
    fn = jax.jit(jax.shard_map(returns_something(answer), mesh=mesh, in_specs=(P("x", None), P("y", None)),
                               out_specs=P("x", None)))
    return fn, (x, w)


def _fsdp_collectives(records, case):
    B, D, F = case
    ag = [r for r in records if r.kind == "all-gather"]
    if _only_kinds(records, ("all-gather",)):
        return "FSDP gathers the weight and needs no other collective"
    if len(ag) != 1 or ag[0].group_size != 4:
        return "expected one all-gather of w over the 4 devices of axis 'y'"
    if not math.isclose(ag[0].bytes_per_device, collectives.ring_bytes("all-gather", D * F * 4, 4)):
        return "the all-gather should move the weight w (not the activations)"
    return None


register(MeshProgramExercise(
    id="3.10", title="An FSDP matmul in shard_map",
    build=_build_fsdp, expected=lambda case, x, w: x @ w, collectives_ok=_fsdp_collectives,
    cases=[(8, 16, 32), (16, 64, 8), (4, 32, 24)],
    describe=lambda B, D, F: f"x[{B},{D}] @ w[{D},{F}]",
    error_hints=[("check_vma", "the result is the same on every 'y' device, so gather with "
                               "jax.lax.all_gather(..., tiled=True, to='invarying')."),
                 ("dot_general requires contracting dimensions to have the same shape",
                  "x_block has all D columns but w_block only D/4 rows: gather w along axis 0 "
                  "(tiled=True) first.")],
))


# 3.11 reduce-scatter matmul ----------------------------------------------------------------
def _build_rs(answer, case, mesh):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    B, D, F = case
    x, w = mesh_inputs([(B, D), (D, F)], seed=3 * B + D + F)
    x = jax.device_put(x, NamedSharding(mesh, P(None, "y")))
    w = jax.device_put(w, NamedSharding(mesh, P("y", None)))
    fn = jax.jit(jax.shard_map(returns_something(answer), mesh=mesh, in_specs=(P(None, "y"), P("y", None)),
                               out_specs=P(None, "y")))
    return fn, (x, w)


def _rs_collectives(records, case):
    B, D, F = case
    if any(r.kind == "all-reduce" for r in records):
        return ("an all-reduce followed by a slice sends twice the bytes of a reduce-scatter: "
                "use jax.lax.psum_scatter")
    rs = [r for r in records if r.kind == "reduce-scatter"]
    if _only_kinds(records, ("reduce-scatter",)) or len(rs) != 1 or rs[0].group_size != 4:
        return "expected exactly one reduce-scatter over the 4 devices of axis 'y'"
    if not math.isclose(rs[0].bytes_per_device, collectives.ring_bytes("reduce-scatter", B * F * 4, 4)):
        return "the reduce-scatter should act on the [B, F] partial sums"
    return None


register(MeshProgramExercise(
    id="3.11", title="A matmul whose partial sums are reduce-scattered",
    build=_build_rs, expected=lambda case, x, w: x @ w, collectives_ok=_rs_collectives,
    cases=[(8, 16, 32), (16, 64, 8), (4, 32, 24)],
    describe=lambda B, D, F: f"x[{B},{D}] @ w[{D},{F}]",
    error_hints=[("out_specs", "each device must return its [B, F/4] block of the sum: "
                               "jax.lax.psum_scatter(..., scatter_dimension=1, tiled=True).")],
))


# 3.12 shardings with no communication ------------------------------------------------------
def _build_specs(answer, case, mesh):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    M, K, N = case
    specs = answer(M, K, N)
    if specs is None:
        raise NotAttempted
    if not (isinstance(specs, (tuple, list)) and len(specs) == 3
            and all(isinstance(s, P) for s in specs)):
        raise TypeError("return three PartitionSpecs (spec_a, spec_w, spec_o)")
    sa, sb, sc = (NamedSharding(mesh, s) for s in specs)
    if math.prod(sc.shard_shape((M, N))) * 8 != M * N:
        raise ValueError(f"the output sharding {specs[2]} leaves each device more than 1/8 of O")
    if sa.is_fully_replicated and sb.is_fully_replicated:
        raise ValueError("fully replicated inputs: every device holds all of A and all of W")
    a, b = mesh_inputs([(M, K), (K, N)], seed=M * K + N)
    a, b = jax.device_put(a, sa), jax.device_put(b, sb)
    fn = jax.jit(lambda a, b: a @ b, out_shardings=sc)
    return fn, (a, b)


def _no_collectives(records, case):
    if records:
        return "the program communicates; choose shardings where no device needs another's data"
    return None


register(MeshProgramExercise(
    id="3.12", title="Shardings that need no communication",
    build=_build_specs, expected=lambda case, a, b: a @ b, collectives_ok=_no_collectives,
    answer_args=lambda case: case,
    cases=[(8, 16, 32), (16, 8, 64), (32, 24, 8)],
    describe=lambda I, J, K: f"A[{I},{J}] @ W[{J},{K}]",
    error_hints=[("more than 1/8", "O must be split over all 8 devices, e.g. one mesh axis on "
                                   "each of its dimensions."),
                 ("three PartitionSpecs", "return a tuple (spec_a, spec_w, spec_o) of jax.P(...)."),
                 ("fully replicated inputs", "with A and W both fully replicated nothing is "
                  "communicated, but every device holds both whole inputs: shard A or W (or "
                  "both) so that each device holds only what its block of O needs.")],
))


# 3.13 a latency-bound all-reduce -----------------------------------------------------------
def _decode_bytes():
    return 16 * get_model("llama3-8b").d_model * 2          # [B, D] in bf16, B = 16 tokens


def _ex13(hop_steps=None, topology="torus", latency=True):
    """The all-reduce over a 16-chip v5e torus axis with the book's assumed t_hop.
    ``hop_steps`` replaces the algorithm's 2 (n - 1) steps (for the hints)."""
    t_hop = collectives.ASSUMED_HOP_LATENCY
    t_bw = collectives.collective_time("all-reduce", _decode_bytes(), 16, "tpu-v5e",
                                       topology=topology)
    if not latency:
        return t_bw
    steps = (collectives.latency_steps("all-reduce", 16, topology) if hop_steps is None
             else hop_steps)
    return t_bw + steps * t_hop


register(NumericExercise(
    id="3.13", title="A latency-bound all-reduce", unit="s", reference=_ex13, rtol=0.03,
    hints=[
        (lambda a: _close(a, 30 * collectives.ASSUMED_HOP_LATENCY, 0.005),
         "that is the latency term alone; add the bandwidth term (small, not zero)."),
        (lambda a: _close(a, _ex13(hop_steps=32), 0.005), "2 (n - 1) steps, not 2 n: a ring "
         "of n chips takes n - 1 steps for each half of an all-reduce."),
        (lambda a: _close(a, _ex13(latency=False)), "that is the bandwidth term alone; a "
         "buffer this small is far below the crossover, so the hops dominate: add "
         "2 (n - 1) t_hop."),
        (lambda a: _close(a, _ex13(hop_steps=15)), "n - 1 hops is an all-gather's count; an "
         "all-reduce is a reduce-scatter and then an all-gather, 2 (n - 1) steps."),
        (lambda a: _close(a, _ex13(hop_steps=1)), "the latency is paid at every step of the "
         "ring, not once: 2 (n - 1) steps for an all-reduce."),
        (lambda a: _close(a, _ex13(topology="ring"), 0.005), "that bandwidth term is twice "
         "too large: either a one-way ring (the full v5e axis is a torus, both directions) "
         "or 4-byte elements (the activations are bf16, 2 bytes)."),
        (lambda a: _close(a, collectives.collective_time(
            "all-gather", _decode_bytes(), 16, "tpu-v5e",
            hop_latency=collectives.ASSUMED_HOP_LATENCY), 0.005),
         "that is an all-gather; an all-reduce has twice its bandwidth term and its steps."),
    ],
))


# 3.14 gather before or after the matmul ----------------------------------------------------
def _ex14(plan="after", bytes_per_element=2, frac=True, model="llama3-70b", B=4096,
          n=4):
    """X[B_Y, F] @ W[F, D] -> [B, D] whole on the n chips of Y; bytes per chip sent."""
    m = get_model(model)
    rows = B * (m.d_model if plan == "after" else m.d_ff) * bytes_per_element
    return collectives.ring_bytes("all-gather", rows, n) if frac else rows


def _ex14_hints(model, B, n):
    def ex(**kw):
        return _ex14(model=model, B=B, n=n, **kw)
    return [
        (lambda a: _close(a, ex(plan="before")), "that gathers the activations [B, F] "
         "before the matmul; here F > D, so gathering the product [B, D] afterwards "
         "moves less."),
        # 0.5%: at n = 16 the ring factor left out (16/15) is 0.7% from GiB's 1.074
        (lambda a: _close(a, ex(frac=False), 0.005), "keep the (n - 1) / n of the ring "
         "all-gather: each chip already holds its own rows."),
        (lambda a: _close(a, ex(bytes_per_element=4)), "bf16 takes 2 bytes per "
         "element, not 4."),
        (lambda a: _close(a, ex() / 2), "half the answer: the question asks for all "
         "the bytes a chip sends, both directions of the torus together."),
        (lambda a: _close(a, ex(frac=False) / n), "that is the chip's own output "
         "block; it sends that block on to all the other chips of the ring: (n - 1) / "
         "n of the gathered [B, D]."),
    ]


register(VariedNumericExercise(
    id="3.14", title="Gather before or after the matmul", unit="bytes",
    params={"model": "llama3-70b", "B": 4096, "n": 4},
    choose={"model": _MODELS, "B": (1024, 2048, 4096, 8192, 16384), "n": (4, 8, 16)},
    solve=lambda model, B, n: _ex14(model=model, B=B, n=n), hints_for=_ex14_hints,
    ring=lambda n, **_: n, chips=lambda n, **_: n,
    describe=lambda model, B, n: {"size": _SIZE[model]},
    statement="The down-projection of LLaMA-3 {size} in bf16: the hidden activations "
              "of {B} tokens, $[B_Y, F]$ ($F$ = `d_ff`), split by tokens over the {n} "
              "chips of axis $Y$, multiply the replicated weight $W[F, D]$, and the "
              "product $[B, D]$ must end up whole on all {n} chips. Of the two plans "
              "of case 6 (gather before, gather after), take the one that moves fewer "
              "bytes. How many bytes does each chip send?",
))
