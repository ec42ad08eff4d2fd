"""Chapter 10 exercises: programming many devices in JAX.

Reference answers are computed from scalebook (collectives, sharding, hardware, models). The
mesh exercises run the student's function on the notebook's 2 x 4 mesh (``scalebook.setup()``
must have run), compare the numbers with NumPy, and read the compiled program's collectives
with :func:`scalebook.hlo.collectives`.
"""

from __future__ import annotations

import math

from .. import collectives
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import (ChoiceExercise, MeshProgramExercise, NotAttempted, NumericExercise,
                    VariedNumericExercise, mesh_inputs, returns_something)

__all__ = ["MESH_SHAPE", "MESH_AXES"]

MESH_SHAPE, MESH_AXES = (2, 4), ("x", "y")


def _close(a, b, rtol=0.01):
    return math.isclose(a, b, rel_tol=rtol)


def _70b():
    return get_model("llama3-70b")


def _weight_bytes(bf16=2, model="llama3-70b"):
    """bf16 bytes of one LLaMA-3 layer's seven weight matrices (no norm vectors)."""
    m = get_model(model)
    return (m.params_per_layer() - m.norm_params_per_layer()) * bf16


def _short(name):
    """"v5p" for tpu-v5p, "H100" for gpu-h100, "70B" for llama3-70b."""
    kind, rest = name.split("-", 1)
    return rest if kind == "tpu" else rest.upper()


# 10.1 ------------------------------------------------------------------------------------
def _ex1(n_data=32, n_model=4, topology="torus", n_group=None, chip="tpu-v5p"):
    return collectives.collective_time("all-gather", _weight_bytes() / n_model,
                                       n_group or n_data, chip, topology=topology)


def _hints1(n_data, n_model, chip):
    def t(**kw):
        return _ex1(**{"n_data": n_data, "n_model": n_model, "chip": chip, **kw})
    n = n_data * n_model
    return [
        (lambda a: _close(a, t(n_model=1)), "each chip gathers only its 'model' shard of "
         f"the weights: divide the layer's bytes by n_model = {n_model}."),
        (lambda a: _close(a, t(topology="ring")), "2x too large. Three slips give this: a "
         "one-way ring (a torus axis sends half the blocks each way, halving the time); "
         "f32 weights (they are bf16, 2 bytes each); or an all-reduce's bytes (an "
         "all-gather sends (n - 1)/n of its result, half of what an all-reduce of it "
         "sends)."),
        (lambda a: _close(a, t(n_group=n), 0.003), "the gathers run over the "
         f"{n_data} chips of 'data' only, not over all {n}."),
        (lambda a: _close(a, t() * n_data / (n_data - 1), 0.003), "keep the (n - 1) / n of "
         "the ring all-gather: a chip already holds its own shard."),
    ]


def _valid1(n_data, n_model, chip):
    """Each axis is a torus axis of the chip: at most 16 chips on a 2D torus (v5e, v6e:
    16 x 16 slices at most)."""
    return "3d" in get_chip(chip).topology.lower() or max(n_data, n_model) <= 16


register(VariedNumericExercise(
    id="10.1", title="FSDP gathers of one layer on a v5p slice", unit="s", rtol=0.015,
    params={"n_data": 32, "n_model": 4, "chip": "tpu-v5p"},
    choose={"n_data": (8, 16, 32), "n_model": (2, 4, 8),
            "chip": ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")},
    solve=lambda n_data, n_model, chip: _ex1(n_data, n_model, chip=chip),
    hints_for=_hints1, valid=_valid1, ring=lambda n_data, **_: n_data,
    describe=lambda n_data, n_model, chip: {"n": n_data * n_model, "chip_short": _short(chip),
                                            "chip_name": get_chip(chip).display_name},
    variant_title="FSDP gathers of one layer on a {chip_short} slice",
    statement="LLaMA-3 70B is trained with the layer shardings of section 10.9 on {n} "
              "{chip_name} chips arranged as `data` = {n_data} by `model` = {n_model}, each "
              "mesh axis modelled as one torus axis (a bidirectional ring; the slice's real "
              "torus may be shaped otherwise). In one layer's forward pass, each chip "
              "all-gathers, over "
              "`data`, its `model` shard of all seven weight matrices (the layer's "
              "parameters except the two norm vectors, in bf16). How long do these "
              "all-gathers take in total, in seconds, by the chapter-3 model?",
))


# 10.2 ------------------------------------------------------------------------------------
def _nvlink():
    h = get_chip("gpu-h100")
    return h.ici_link_bandwidth * h.ici_links


def _ex2(per_layer=2, layers=None, bandwidth=None, topology="ring", batch=128):
    m = _70b()
    layers = m.n_layers if layers is None else layers
    t = collectives.collective_time("all-reduce", batch * m.d_model * 2, 8,
                                    bandwidth=bandwidth or _nvlink(), topology=topology)
    return per_layer * layers * t


register(NumericExercise(
    id="10.2", title="Decode all-reduces for a whole token on an H100 node", unit="s",
    reference=_ex2, rtol=0.03, ring=8,
    hints=[
        (lambda a: _close(a, _ex2(layers=1)) or _close(a, _ex2(per_layer=1, layers=1)),
         "that is one layer; a decode step runs all 80 layers."),
        (lambda a: _close(a, _ex2(per_layer=1)) or _close(a, _ex2(topology="torus")),
         "2x too small: there are two all-reduces per layer (attention and MLP), on a one-way "
         "ring (NVSwitch, not a torus)."),
        (lambda a: _close(a, _ex2(bandwidth=get_chip("gpu-h100").ici_link_bandwidth)),
         "that uses one NVLink; through NVSwitch a GPU sends over all 18 of its links at once."),
        (lambda a: _close(a, _ex2(per_layer=4)),
         "2x too large: a decode step is a forward pass only, with two all-reduces per "
         "layer (attention and MLP); a training step's backward pass adds the other two."),
    ],
))


# 10.3 ------------------------------------------------------------------------------------
def _ex3(bidirectional=True, whole=False, chip="tpu-v5e"):
    """On TPU v5e: section 10.6's table is v5p's at every n from 2 to 64, from which v5p's
    threshold is one ratio away (F times a step's send over its matmul); v6e's on 4 chips
    equals v5p's on 8 (twice the FLOP/s, the same links)."""
    from ..sharding import collective_matmul_times
    m, n = _70b(), 4
    t = collective_matmul_times(4096, m.d_model, 1, n, chip, bidirectional=bidirectional)
    if whole:
        return t["gather"] / t["math"]
    return t["step_comm"] / (t["math"] / n)          # times are linear in F


register(NumericExercise(
    id="10.3", title="When does a collective matmul stop hiding its sends?", unit="F",
    reference=_ex3, rtol=0.03,
    hints=[
        (lambda a: _close(a, _ex3(bidirectional=False)), "2x too large: half of each chunk "
         "goes each way round the torus axis, so a chunk's send takes chunk / (2 W)."),
        (lambda a: _close(a, _ex3(chip="tpu-v5p")), "that is the threshold on TPU v5p (section "
         "10.6's table); the question is for v5e chips: use their own bf16 FLOP/s and ICI "
         "link bandwidth."),
        (lambda a: _close(a, _ex3(whole=True)), "that compares the whole gather with the whole "
         "matmul; compare one chunk's send with one chunk's matmul (1/n of the matmul)."),
        (lambda a: _close(a, _ex3() * 4), "n = 4x too large: a step sends one [B, D/n] chunk "
         "of A, not all of A (or: a chunk's matmul is 1/n of the chip's matmul, "
         "2 B D F / (n^2 C), not 1/n^2 of it)."),
        (lambda a: _close(a, _ex3() / 4), "n = 4x too small. Either that is F / n, a chip's "
         "columns of W, where the question asks for the full width F before the split; or "
         "the chunk's matmul is too large: compare a chunk's send with a chunk's matmul, "
         "2 B D F / (n^2 C), 1/n of the chip's whole matmul 2 B D F / (n C)."),
    ],
))


# 10.4 ------------------------------------------------------------------------------------
def _ex4(n_model=8, bandwidth=None, topology="ring", n_nodes=8, chip="gpu-h100",
         model="llama3-405b"):
    h = get_chip(chip)
    return collectives.collective_time("all-gather", _weight_bytes(model=model) / n_model,
                                       n_nodes, bandwidth=bandwidth or h.dcn_bandwidth,
                                       topology=topology)


def _hints4(n_nodes, chip, model):
    def t(**kw):
        return _ex4(**{"n_nodes": n_nodes, "chip": chip, "model": model, **kw})
    g = get_chip(chip)
    return [
        (lambda a: _close(a, t(bandwidth=g.ici_link_bandwidth * g.ici_links)), "that is "
         "NVLink; the 'data' axis crosses nodes, over the network at W_dcn per GPU."),
        (lambda a: _close(a, t(n_model=1)), "each GPU gathers only its 'model' shard of "
         "the weights: divide by n_model = 8."),
        (lambda a: _close(a, t(topology="torus")), "the network between nodes is not a "
         "torus: use a one-way ring."),
    ]


register(VariedNumericExercise(
    id="10.4", title="FSDP across H100 nodes", unit="s", rtol=0.03,
    # not 70B: section 10.9 prints 70B's gathers over 'data' on H100s, one step away
    params={"n_nodes": 8, "chip": "gpu-h100", "model": "llama3-405b"},
    choose={"n_nodes": (2, 4, 6, 8, 12, 16, 24, 32),
            "chip": ("gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200"),
            "model": ("llama3-8b", "llama3-70b", "llama3-405b")},
    solve=lambda n_nodes, chip, model: _ex4(n_nodes=n_nodes, chip=chip, model=model),
    hints_for=_hints4, ring=lambda n_nodes, **_: n_nodes,
    describe=lambda n_nodes, chip, model: {"n": 8 * n_nodes, "chip_short": _short(chip),
                                           "model_short": _short(model)},
    variant_title="FSDP across {chip_short} nodes",
    statement="Train LLaMA-3 {model_short} with the layer shardings of section 10.9 on "
              "{n_nodes} {chip_short} nodes ({n} GPUs): `model` = 8 inside each node, "
              "`data` = {n_nodes} across nodes, each GPU sending over the network at its "
              "$W_{{\\mathrm{{dcn}}}}$ as a one-way ring. How long do one layer's seven "
              "FSDP weight all-gathers (each GPU gathers its `model` shard of the bf16 "
              "weights) take per forward pass, in seconds?",
))


# 10.5 ------------------------------------------------------------------------------------
register(ChoiceExercise(
    id="10.5", title="Which axes must out_specs keep?", choices=("x", "y", "both", "none"),
    reference=lambda: "y",
    hints={"x": "psum over 'x' makes the value the same along 'x' (its type drops 'x'), but it "
                "still differs along 'y'; out_specs without 'y' claims a replication the types "
                "cannot prove, and shard_map refuses.",
           "both": "P('x', 'y') is accepted, but it stacks the two equal copies held along 'x': "
                   "the global result is [8, 16], not the [4, 16] sum. Leave 'x' out.",
           "none": "P() claims the value is the same on all 8 devices; psum over 'x' makes it the "
                   "same along 'x' only, so shard_map refuses."},
))


# ------------------------------------------------------------------------------------------
# Code exercises on the mesh
# ------------------------------------------------------------------------------------------

def _shard_map_build(in_specs, out_spec, shapes, seed_of):
    def build(answer, case, mesh):
        import jax
        from jax.sharding import NamedSharding
        arrays = mesh_inputs(shapes(*case), seed=seed_of(*case))
        args = tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, in_specs()))
        fn = jax.jit(jax.shard_map(returns_something(answer), mesh=mesh, in_specs=in_specs(),
                                   out_specs=out_spec()))
        return fn, args
    return build


def _P(*entries):
    from jax.sharding import PartitionSpec
    return PartitionSpec(*entries)


# 10.6 the MLP with its layout the other way round -----------------------------------------
# x[B_X, D_Y], W1[D_Y, F], W2[F, D_Y]: the first matmul contracts the split D (partial sums
# of x W1, all-reduced before the relu), the second is local (this device's D/4 columns).
def _tp_collectives(records, case):
    B, D, F = case
    if any(r.kind == "all-gather" for r in records):
        return ("no gather is needed: each device's x block [B/2, D/4] times its w1 block "
                "[D/4, F] is its share of a sum over D, and the other devices hold the rest "
                "of that sum")
    ar = [r for r in records if r.kind == "all-reduce"]
    if any(r.group_size == 2 for r in ar):
        return "the sum runs over 'x'; D is split over 'y', so psum over 'y'"
    if len(records) != 1 or len(ar) != 1 or ar[0].group_size != 4:
        return "expected exactly one collective, an all-reduce over the 4 devices of 'y'"
    if not math.isclose(ar[0].bytes_per_device,
                        collectives.ring_bytes("all-reduce", B // 2 * F * 4, 4)):
        return ("the all-reduce should act on the [B/2, F] partial sums of the first matmul, "
                "the only sum over the split D")
    return None


def _mlp_np(case, x, w1, w2):
    import numpy as np
    return np.maximum(np.asarray(x) @ np.asarray(w1), 0) @ np.asarray(w2)


def _tp_numbers(got, want, case):
    import numpy as np
    half = case[0] // 2           # the rows of x are split over 'x': two halves
    tol = dict(rtol=1e-4, atol=1e-4 * float(np.abs(want).max() or 1))
    # a psum over 'x' (alone or with 'y') gives both halves the same rows, whatever the
    # inputs (the grader draws its own)
    if (np.allclose(got[:half], got[half:], **tol)
            and not np.allclose(want[:half], want[half:], **tol)):
        return ("a psum over 'x' adds up the partial sums of different rows of x (the "
                "batch is split over 'x'): x W1 contracts D, which 'y' splits, so the sum "
                "runs over 'y' only")
    return ("x W1 contracts D, which 'y' splits: each device's x block times its w1 block "
            "is only its part of the sum over D, and the relu needs the whole sum (relu of "
            "a partial sum is not a part of the relu)")


register(MeshProgramExercise(
    id="10.6", title="The MLP the other way round in shard_map",
    build=_shard_map_build(lambda: (_P("x", "y"), _P("y", None), _P(None, "y")),
                           lambda: _P("x", "y"),
                           lambda B, D, F: [(B, D), (D, F), (F, D)],
                           lambda B, D, F: B + 2 * D + 3 * F),
    expected=_mlp_np, collectives_ok=_tp_collectives, numbers_hint=_tp_numbers,
    cases=[(8, 16, 32), (16, 8, 64), (4, 32, 16)],
    describe=lambda B, D, F: f"x[{B},{D}], w1[{D},{F}], w2[{F},{D}]",
))


# 10.7 collective matmul ------------------------------------------------------------------
def _cm_collectives(records, case):
    B, D, F = case
    if any(r.kind == "all-gather" for r in records):
        return "that is the plain version: move A's chunks with jax.lax.ppermute instead"
    perms = [r for r in records if r.kind == "collective-permute"]
    if len(perms) != len(records):
        return "only collective-permutes should move data"
    chunk = B // 2 * D // 4 * 4
    runs = sum(r.count for r in perms)             # a permute in a loop runs trip-count times
    if runs != 3 or any(not math.isclose(r.bytes_per_device, chunk) for r in perms):
        return (f"expected n - 1 = 3 permutes to run ({runs} do), each of one "
                f"[{B // 2}, {D // 4}] chunk of A (the last chunk is used where it arrives, "
                f"not sent on)")
    if any(r.group_size != 8 for r in perms):
        return "every device should pass its chunk to a neighbour along 'y' in each step"
    y = MESH_AXES.index("y")
    n = MESH_SHAPE[y]                    # y is the last mesh axis: position p % n along it
    for r in perms:
        hops = r.hops(MESH_SHAPE, y)
        if hops is None:
            return "every chunk should move along 'y' only, within its row of the mesh"
        if any(abs(h) != 1 for h in hops):
            k = max(abs(h) for h in hops)
            s, t = next((s, t) for s, t in r.source_target_pairs if (t - s) % n in (k, n - k))
            return (f"a permute sends chunks {k} hops along 'y' (from position {s % n} to "
                    f"{t % n}); in a collective matmul each device sends only to its "
                    f"neighbour and, in the next step, passes on the chunk it has just "
                    f"received: the same one-hop pairs every step, e.g. "
                    f"[(j, (j - 1) % 4) for j in range(4)]")
    return None


def _count_eqns(jaxpr, primitive: str) -> int:
    """Equations of ``primitive`` in a jaxpr, counting those inside sub-jaxprs (shard_map, jit)."""
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive.name == primitive
        for v in eqn.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += _count_eqns(inner, primitive)
    return n


def _cm_structure(compiled):
    """The matmul must be split into one per chunk: a program that gathers A with permutes
    and then does one matmul overlaps nothing. Counted in the compiled program, each matmul
    as many times as it runs (the trip counts of the loops around it), so that a loop
    (``fori_loop``, ``scan``) and an unrolled Python loop are judged alike. A program that
    all-gathers is left to the collectives' message."""
    from .. import hlo

    ops = hlo.ops(compiled)
    if any(o.opcode.startswith("all-gather") for o in ops):
        return
    runs = sum(o.count for o in ops if o.category == "matmul")
    if runs < MESH_SHAPE[1]:
        raise ValueError(f"collective matmul: {runs} matmul(s) run, expected one per chunk")


class _ChunkMatmuls:
    """A jitted program whose compilation also checks :func:`_cm_structure`: the notebook's
    check and the grader's checker both compile (the checker rebuilds this wrapper around the
    exported program, as it does any wrapper with a ``mesh``)."""

    def __init__(self, fn, mesh):
        self.fn, self.mesh = fn, mesh

    def lower(self, *args):
        return _CheckedLowering(self.fn.lower(*args))


class _CheckedLowering:
    def __init__(self, lowered):
        self.lowered = lowered

    def as_text(self):
        return self.lowered.as_text()

    def compile(self):
        compiled = self.lowered.compile()
        _cm_structure(compiled)
        return compiled


_cm_shard_map = _shard_map_build(lambda: (_P("x", "y"), _P(None, "y")), lambda: _P("x", "y"),
                                 lambda B, D, F: [(B, D), (D, F)], lambda B, D, F: 5 * B + D + F)


def _cm_build(answer, case, mesh):
    fn, args = _cm_shard_map(answer, case, mesh)
    return _ChunkMatmuls(fn, mesh), args


register(MeshProgramExercise(
    id="10.7", title="Your own collective matmul",
    build=_cm_build,
    expected=lambda case, a, w: __import__("numpy").asarray(a) @ __import__("numpy").asarray(w),
    collectives_ok=_cm_collectives, rtol=1e-4,
    cases=[(8, 16, 32), (16, 32, 8), (4, 16, 24)],
    describe=lambda B, D, F: f"A[{B},{D}] @ W[{D},{F}]",
    error_hints=[("dot_general requires contracting dimensions",
                  "a chunk of A has D/4 columns; multiply it by the matching D/4 rows of w "
                  "(jax.lax.dynamic_slice_in_dim with the chunk's owner from axis_index)."),
                 ("expected one per chunk", "multiply each chunk as it arrives (n = 4 chunk "
                  "matmuls, each next to a send, in a Python loop or a fori_loop); gathering "
                  "A with permutes and then doing one matmul hides nothing behind the "
                  "sends."),
                 ("ppermute", "ppermute takes (source, destination) pairs of positions along "
                  "'y', e.g. [(j, (j - 1) % 4) for j in range(4)]."),
                 ("must have static start/stop/step",
                  "the rows of w that a chunk needs start at a position computed from "
                  "axis_index, a traced value, and w[start:stop] needs Python numbers: take "
                  "them with jax.lax.dynamic_slice_in_dim(w, start, size, axis=0).")],
))


# 10.8 KV cache spec ----------------------------------------------------------------------
# More query heads than KV heads per 'model' device: q[B_seq, H_kv, G, h] has its G query
# heads of each KV head split over 'model' (H_kv = 1 or 2 cannot be split 4 ways). A device
# then needs every KV head of its sequences: the cache is split over 'data' only, and each
# device holds 1/2 of it (the price of tensor parallelism wider than the KV heads).
def _build_kv(answer, case, mesh):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    spec = answer()
    if spec is None:
        raise NotAttempted
    if not isinstance(spec, PartitionSpec) or len(spec) > 4:
        raise TypeError("return one PartitionSpec with at most 4 entries, e.g. P(..., ..., ..., ...)")
    dm = mesh
    Bs, T, K, G, h = case
    q, k, v = mesh_inputs([(Bs, K, G, h), (Bs, T, K, h), (Bs, T, K, h)], seed=Bs * T + K + G)
    from ..sharding import shard_shape
    try:
        block = shard_shape(k.shape, spec, dm)
    except ValueError as e:
        raise ValueError(f"cache spec {spec}: {e}") from None
    held = k.size // math.prod(block)                 # 1/held of the cache per device
    if held < 2:
        raise ValueError(f"with {spec} every device holds the whole cache")
    q_sh = NamedSharding(dm, PartitionSpec("data", None, "model", None))
    c_sh = NamedSharding(dm, spec)

    def attend(q, k, v):
        s = jax.nn.softmax(jnp.einsum("bkgh,btkh->bkgt", q, k), axis=-1)
        return jnp.einsum("bkgt,btkh->bkgh", s, v)

    fn = jax.jit(attend, out_shardings=q_sh)
    return fn, (jax.device_put(q, q_sh), jax.device_put(k, c_sh), jax.device_put(v, c_sh))


def _attend_np(case, q, k, v):
    import numpy as np
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    s = np.einsum("bkgh,btkh->bkgt", q, k)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bkgt,btkh->bkgh", p / p.sum(-1, keepdims=True), v)


def _no_collectives(records, case):
    if records:
        return ("the program communicates: a device's queries are all the query heads of "
                "its sequences' KV heads, so it needs the cache of those sequences for every "
                "KV head and every position; split the cache only where q is split the same "
                "way")
    return None


register(MeshProgramExercise(
    id="10.8", title="A KV cache that needs no communication",
    build=_build_kv, expected=_attend_np, collectives_ok=_no_collectives, rtol=1e-4,
    answer_args=lambda case: (),
    mesh_axes=("data", "model"),
    cases=[(4, 8, 2, 4, 8), (2, 16, 1, 8, 4), (6, 4, 2, 4, 8)],
    describe=lambda Bs, T, K, G, h: f"q[{Bs},{K},{G},{h}], cache[{Bs},{T},{K},{h}]",
    error_hints=[("whole cache", "every device holds the whole cache: split it where q "
                                 "is split the same way, so that each device keeps only "
                                 "what its queries read."),
                 ("dimension 2 of shape", "the model has only 1 or 2 KV heads, which "
                                          "cannot be split over the 4 devices of 'model'; "
                                          "q splits the query heads G of each KV head, "
                                          "which the cache does not have."),
                 ("does not divide", "split each cache dimension the way q splits the same "
                                     "dimension: the batch over 'data' only, as q's."),
                 ("names mesh axis", "the mesh axes are 'data' and 'model'."),
                 ("one PartitionSpec", "return jax.P(...) with one entry per cache dimension "
                                       "[B_seq, T, H_kv, h].")],
))


# 10.9 fix an ambiguous contraction -------------------------------------------------------
class _UnderMesh:
    """A jitted function whose tracing and lowering happen under ``jax.set_mesh(mesh)``."""

    def __init__(self, fn, mesh):
        self.fn, self.mesh = fn, mesh

    def lower(self, *args):
        import jax
        with jax.set_mesh(self.mesh):
            out = jax.eval_shape(self.fn, *args)
            spec = getattr(getattr(out, "sharding", None), "spec", None)
            if spec is None or tuple(spec) + (None,) * (2 - len(spec)) != (("x", "y"), None):
                raise ValueError(f"the result is sharded {spec}, expected "
                                 f"P(('x', 'y'), None)")
            return self.fn.lower(*args)


def _build_fix(answer, case, mesh):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from ..mesh import make_mesh
    em = make_mesh(MESH_SHAPE, MESH_AXES, explicit=True)
    B, D, F = case
    a, b = mesh_inputs([(B, D), (D, F)], seed=7 * B + D + F)
    a = jax.device_put(a, NamedSharding(em, PartitionSpec("x", "y")))
    b = jax.device_put(b, NamedSharding(em, PartitionSpec("y", None)))
    return _UnderMesh(jax.jit(returns_something(answer)), em), (a, b)


def _fix_collectives(records, case):
    if any(r.kind == "all-gather" for r in records):
        return ("the program gathers: resharding the inputs before the product moves whole "
                "blocks of a or b; leave them as they are, so that only the partial sums "
                "over the split D move")
    if (len(records) != 1 or records[0].group_size != 4
            or not (records[0].kind == "reduce-scatter" or records[0].rs_like)):
        return ("expected one reduce-scatter of the partial sums over the 4 devices of 'y' "
                "(which this CPU compiler may write as an all-reduce whose result each "
                "device slices); an all-reduce that keeps the whole sum on every device of "
                "'y' sends twice the bytes")
    return None


register(MeshProgramExercise(
    id="10.9", title="Fix an ambiguous contraction",
    build=_build_fix, expected=lambda case, a, b: __import__("numpy").asarray(a) @
    __import__("numpy").asarray(b), collectives_ok=_fix_collectives, rtol=1e-4,
    cases=[(8, 16, 32), (16, 32, 8), (24, 16, 24)],
    describe=lambda B, D, F: f"a[{B},{D}] @ b[{D},{F}]",
    error_hints=[("ambiguous", "tell JAX how the result is sharded: the out_sharding= "
                               "argument of jnp.einsum, jnp.matmul or jnp.dot (section "
                               "10.3)."),
                 ("expected P(('x', 'y'), None)", "the rows must be split over both axes, "
                                                  "'x' then 'y', and the columns whole: one "
                                                  "dimension split over two axes is written "
                                                  "as a tuple of the axes (section 10.1).")],
))


# 10.10 sequence to heads -----------------------------------------------------------------
def _a2a_collectives(records, case):
    if any(r.kind == "all-gather" for r in records):
        return ("an all-gather then a slice holds the whole array for a moment and moves n "
                "times more data; one all_to_all moves only the blocks that change owner")
    a2a = [r for r in records if r.kind == "all-to-all"]
    if len(records) != 1 or len(a2a) != 1 or a2a[0].group_size != 4:
        return "expected exactly one all-to-all over the 4 devices of 'y'"
    return None


register(MeshProgramExercise(
    id="10.10", title="Sequence to heads with one all-to-all",
    build=_shard_map_build(lambda: (_P("y", None),), lambda: _P(None, "y"),
                           lambda S, H: [(S, H)], lambda S, H: 11 * S + H),
    expected=lambda case, x: __import__("numpy").asarray(x), collectives_ok=_a2a_collectives,
    cases=[(8, 16), (16, 8), (4, 32)],
    describe=lambda S, H: f"x[{S},{H}]",
    # the hint says what the two axes do, not the call that answers the exercise
    error_hints=[("to equal x.shape[split_axis]", "without tiled=True, all_to_all wants "
                                                  "split_axis to be exactly as long as the "
                                                  "axis (4) and removes it; tiled=True cuts "
                                                  "a dimension of any multiple of 4 into 4 "
                                                  "pieces and keeps the array's rank."),
                 ("split_axis", "all_to_all cuts each block along split_axis into "
                                "one piece per device of 'y' and joins the pieces it "
                                "receives along concat_axis: which dimension must end "
                                "up split (the heads), and which whole (the "
                                "sequence)?"),
                 ("replicated across mesh axis", "use the axis name 'y' in all_to_all: "
                                                 "only 'y' splits x.")],
))
