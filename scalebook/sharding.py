"""Programming many devices in JAX: shardings with clear errors, collectives of a lowered
program, a collective matmul, and one LLaMA-3 layer written in JAX's three modes (chapter 10).

* :func:`named_sharding` builds a ``NamedSharding`` and checks the things JAX reports late
  or obscurely (an axis the mesh lacks, an axis used twice, a dimension that does not
  divide), naming the argument and the allowed values.
* :func:`show_error` runs code that must fail and prints the exception's type and the first
  lines of JAX's message (wrapped, without file paths), so a notebook shows a real error
  without stopping *Run all*; it fails loudly if the code does not raise.
* :func:`lowered_collectives` reads the collectives of a *lowered* program (StableHLO, before
  the compiler runs), so it works for a ``shard_map`` program lowered on an
  ``AbstractMesh`` of any size, where nothing can be compiled. It returns the same
  :class:`scalebook.hlo.Collective` records as :func:`scalebook.hlo.collectives`.
* :func:`collective_matmul` is ``all_gather(a) @ w`` with the gather split into ``n - 1``
  ``ppermute`` steps, each next to one chunk's matmul; :func:`collective_matmul_times`
  costs both versions with the chapter-3 model.
* :func:`layer_specs`, :func:`layer_structs` and :func:`layer_fn` write one LLaMA-3 layer
  (attention with grouped KV heads and the gated MLP, no norms or RoPE: they add no
  communication) for training (FSDP over ``"data"`` + tensor parallelism over ``"model"``)
  and for decoding (tensor parallelism, KV cache split over batch and KV heads), in
  ``"auto"``, ``"explicit"`` and ``"manual"`` mode.

Sizes are in bytes, times in seconds.
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import textwrap

import numpy as np

from . import collectives as _coll
from . import roofline as _rl
from .hardware import get_chip
from .units import check_positive_int, dtype_bytes

__all__ = ["named_sharding", "shard_shape", "show_error", "lowered_collectives",
           "collective_matmul", "allgather_matmul", "collective_matmul_times", "record_time",
           "MODES", "PURPOSES", "layer_specs", "layer_structs", "layer_fn"]

MODES = ("auto", "explicit", "manual")
PURPOSES = ("train", "decode")


# ------------------------------------------------------------------------------------------
# Shardings with readable errors
# ------------------------------------------------------------------------------------------

def _mesh_sizes(mesh) -> dict:
    shape = getattr(mesh, "shape", None)
    names = getattr(mesh, "axis_names", None)
    if shape is None or names is None:
        raise TypeError(f"mesh must be a jax.sharding.Mesh or AbstractMesh; got "
                        f"{type(mesh).__name__}")
    return dict(shape)


def _spec_entries(spec):
    from jax.sharding import PartitionSpec
    if isinstance(spec, PartitionSpec):
        return tuple(spec)
    if isinstance(spec, (tuple, list)):
        return tuple(spec)
    raise TypeError(f"spec must be a PartitionSpec such as P('x', None); got "
                    f"{type(spec).__name__} {spec!r:.60}")


def _entry_axes(entry, i) -> tuple:
    if entry is None:
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)) and all(isinstance(a, str) for a in entry):
        return tuple(entry)
    raise TypeError(f"spec entry {i} must be None, an axis name or a tuple of axis names; "
                    f"got {entry!r}")


def shard_shape(shape, spec, mesh) -> tuple:
    """The block of an array of ``shape`` that each device holds under ``spec`` on ``mesh``.

    Works for a ``Mesh`` and an ``AbstractMesh``; raises ValueError (naming the dimension,
    its size and the axes) when a dimension does not divide, or an axis is unknown or
    used twice.
    """
    sizes = _mesh_sizes(mesh)
    entries = _spec_entries(spec)
    shape = tuple(shape)
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise ValueError(f"shape must be non-negative integers; got {shape}")
    if len(entries) > len(shape):
        raise ValueError(f"spec {spec} has {len(entries)} entries but the array has only "
                         f"{len(shape)} dimensions {shape}")
    used = {}
    block = list(shape)
    for i, entry in enumerate(entries):
        axes = _entry_axes(entry, i)
        for a in axes:
            if a not in sizes:
                raise ValueError(f"spec {spec} names mesh axis {a!r}, but the mesh has axes "
                                 f"{', '.join(map(repr, sizes))}")
            if a in used:
                raise ValueError(f"spec {spec} uses mesh axis {a!r} for dimensions {used[a]} and "
                                 f"{i}; a mesh axis can split only one dimension")
            used[a] = i
        ways = math.prod(sizes[a] for a in axes)
        if shape[i] % ways:
            over = " x ".join(f"{a}={sizes[a]}" for a in axes)
            raise ValueError(f"dimension {i} of shape {shape} has size {shape[i]}, which does not "
                             f"divide into {ways} blocks (mesh axes {over}); choose a size that "
                             f"is a multiple of {ways} or shard that dimension over fewer axes")
        block[i] = shape[i] // ways
    return tuple(block)


def named_sharding(mesh, spec, shape=None):
    """``NamedSharding(mesh, spec)``, checked first: every axis exists and is used once, and,
    when ``shape`` is given, every sharded dimension divides by its axes' sizes.
    """
    from jax.sharding import NamedSharding, PartitionSpec
    entries = _spec_entries(spec)
    spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec(*entries)
    if shape is None:
        shard_shape((0,) * len(entries), spec, mesh)        # axis names and reuse only
    else:
        shard_shape(shape, spec, mesh)
    return NamedSharding(mesh, spec)


# ------------------------------------------------------------------------------------------
# Showing a real error without stopping the notebook
# ------------------------------------------------------------------------------------------

# "This error occurs at source: /tmp/ipykernel_1/2.py:1 (<module>)", and any other file path
_AT_SOURCE = re.compile(r"\s*This error occurs at source:.*$", re.S)
_FILE_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.<>@+\-]+)+\.py(?::\d+)*(?: \([^)]*\))?")


def show_error(fn, *, expect: type = Exception, lines: int = 3, width: int = 100) -> None:
    """Run ``fn()``, which must raise ``expect`` (or a subclass); print ``Type: message``,
    the message's first ``lines`` non-blank lines, each wrapped to ``width`` characters,
    with file paths removed.

    Raises AssertionError if ``fn()`` returns without raising, so a notebook that shows an
    error fails loudly, not silently, once the code stops making it; an exception that is
    not an ``expect`` propagates unchanged. What ``fn`` prints is discarded (some JAX errors
    print the caller's file and line). Returns None, so a cell shows only the message.
    """
    check_positive_int("lines", lines)
    check_positive_int("width", width)
    if not callable(fn):
        raise TypeError(f"fn must be a function of no arguments (a lambda: ...); got "
                        f"{type(fn).__name__}")
    if not (isinstance(expect, type) and issubclass(expect, BaseException)):
        raise TypeError(f"expect must be an exception class such as ValueError; got "
                        f"{expect!r}")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            fn()
    except expect as e:
        err = e
    else:
        raise AssertionError("show_error: the code ran without raising; the error it is "
                             "meant to show no longer happens")
    message = _FILE_PATH.sub("<file>", _AT_SOURCE.sub("", str(err)))
    body = [ln.strip() for ln in message.splitlines() if ln.strip()] or ["(no message)"]
    body[0] = f"{type(err).__name__}: {body[0]}"
    for ln in body[:lines]:
        print(textwrap.fill(ln, width=width, subsequent_indent="    ",
                            break_long_words=True, break_on_hyphens=False))
    if len(body) > lines:
        print(f"    [... {len(body) - lines} more line(s)]")


# ------------------------------------------------------------------------------------------
# Collectives of a lowered (StableHLO) program
# ------------------------------------------------------------------------------------------

_SHLO_KINDS = {"all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
               "all_reduce": "all-reduce", "all_to_all": "all-to-all",
               "collective_permute": "collective-permute"}
_SHLO_OP = re.compile(r'%([\w#.\-]+)(?::\d+)?\s*=\s*"stablehlo\.(' + "|".join(_SHLO_KINDS) +
                      r')"')
_SIG = re.compile(r"^\s*\}?\)?\s*:\s*\((.*?)\)\s*->\s*(.*?)\s*$")
_TENSOR = re.compile(r"tensor<((?:\d+x)*)([a-z][a-z0-9]*)>")


def _tensor_shapes(text: str) -> list:
    out = []
    for dims, dtype in _TENSOR.findall(text):
        dims = [d for d in dims.split("x") if d]
        out.append(f"{dtype}[{','.join(dims)}]")
    return out


def _shape_nbytes(shape: str) -> float:
    dtype, dims = shape.split("[")
    dims = [int(d) for d in dims.rstrip("]").split(",") if d]
    return math.prod(dims) * dtype_bytes(dtype)


def _mesh_axis_groups(mesh_sizes: dict, axes: list) -> tuple:
    names = list(mesh_sizes)
    ids = np.arange(math.prod(mesh_sizes.values())).reshape([mesh_sizes[a] for a in names])
    order = [i for i, a in enumerate(names) if a not in axes] + [names.index(a) for a in axes]
    size = math.prod(mesh_sizes[a] for a in axes)
    return tuple(tuple(int(v) for v in row) for row in ids.transpose(order).reshape(-1, size))


def _pairs(attr_text: str) -> tuple:
    m = re.search(r'source_target_pairs\s*=\s*dense<"0x([0-9A-Fa-f]+)">', attr_text)
    if m:
        vals = np.frombuffer(bytes.fromhex(m.group(1)), dtype="<i8")
        return tuple(tuple(int(v) for v in p) for p in vals.reshape(-1, 2))
    m = re.search(r"source_target_pairs\s*=\s*dense<(\[.*?\]\])>", attr_text)
    if m:
        return tuple(tuple(p) for p in eval(m.group(1), {"__builtins__": {}}))  # noqa: S307
    return ()


def lowered_collectives(lowered) -> list:
    """The collectives a lowered program asks for, as :class:`scalebook.hlo.Collective`.

    ``lowered`` is ``jax.jit(f).lower(...)`` or ``jax.jit(f).trace(...).lower(
    lowering_platforms=("cpu",))`` (the way to lower on an ``AbstractMesh``), or its
    ``as_text()``. Before compilation only the collectives written in ``shard_map`` bodies
    exist; those chosen by the partitioner in auto or explicit mode appear only after
    ``.compile()`` (read them with :func:`scalebook.hlo.collectives`). Shapes are per
    device; bytes per device follow :func:`scalebook.collectives.ring_bytes`.
    """
    from .hlo import Collective
    if isinstance(lowered, str):
        text = lowered
    elif type(lowered).__name__ == "Lowered":
        text = lowered.as_text()
    elif type(lowered).__name__ == "Compiled":
        raise TypeError("lowered: got a compiled program; use scalebook.hlo.collectives for it")
    else:
        raise TypeError(f"lowered must be a jax.stages.Lowered or its StableHLO text; got "
                        f"{type(lowered).__name__}")
    if "stablehlo" not in text and "func.func" not in text:
        raise ValueError("lowered: the text does not look like StableHLO (no func.func found)")
    meshes = {}
    for name, body in re.findall(r"sdy\.mesh\s+@([\w.]+)\s*=\s*<\[(.*?)\]", text):
        meshes[name] = {a: int(s) for a, s in re.findall(r'"([^"]+)"=(\d+)', body)}
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        m = _SHLO_OP.search(line)
        if not m:
            continue
        kind = _SHLO_KINDS[m.group(2)]
        sig = None
        if line.rstrip().endswith("({"):
            for later in lines[i + 1:]:
                s = _SIG.match(later)
                if later.strip().startswith("})") and s:
                    sig = s
                    break
        else:
            s = re.search(r">\s*:\s*\((.*?)\)\s*->\s*(.*?)\s*$", line)
            sig = s
        if sig is None:
            raise ValueError(f"lowered: could not read the operand types of {m.group(0)}")
        operand_shapes = tuple(_tensor_shapes(sig.group(1)))
        result_shapes = tuple(_tensor_shapes(sig.group(2)))
        dtypes = sorted({s.split("[")[0] for s in operand_shapes + result_shapes})
        if kind == "collective-permute":
            groups = _pairs(line)
            senders = {a for a, b in groups if a != b}
            group_size = len(senders)
            nbytes = sum(map(_shape_nbytes, operand_shapes)) if senders else 0.0
        else:
            rg = re.search(r"replica_group_mesh_axes<mesh\s*=\s*@([\w.]+),\s*axes\s*=\s*\[(.*?)\]>",
                           line)
            if rg:
                axes = re.findall(r'name\s*=\s*"([^"]+)"', rg.group(2))
                groups = _mesh_axis_groups(meshes[rg.group(1)], axes)
            else:
                dense = re.search(r"replica_groups\s*=\s*dense<(\[.*?\]\])>", line)
                if not dense:
                    raise ValueError(f"lowered: could not read the replica groups of {m.group(0)}")
                groups = tuple(tuple(g) for g in eval(dense.group(1), {"__builtins__": {}}))  # noqa: S307
            group_size = len(groups[0])
            shapes = result_shapes if kind == "all-gather" else operand_shapes
            nbytes = _coll.ring_bytes(kind, sum(map(_shape_nbytes, shapes)), group_size)
        out.append(Collective(kind=kind, name=m.group(1), group_size=group_size, groups=groups,
                              dtype="/".join(dtypes), operand_shapes=operand_shapes,
                              result_shapes=result_shapes, bytes_per_device=float(nbytes)))
    return out


def record_time(record, chip=None, *, bandwidth: float | None = None,
                topology: str | None = None) -> float:
    """Seconds for one collective record (from :func:`lowered_collectives` or
    :func:`scalebook.hlo.collectives`) by the chapter-3 model, times its ``count``.

    The array given to :func:`scalebook.collectives.collective_time` is the per-device
    result of an all-gather and the per-device operand of the others, over the record's
    ``group_size`` devices on one axis; ``chip``, ``bandwidth`` and ``topology`` as there.
    """
    from .hlo import Collective
    if not isinstance(record, Collective):
        raise TypeError(f"record must be a scalebook.hlo.Collective; got {type(record).__name__}")
    shapes = record.result_shapes if record.kind == "all-gather" else record.operand_shapes
    nbytes = sum(map(_shape_nbytes, shapes))
    if record.group_size < 1:
        return 0.0
    return record.count * _coll.collective_time(record.kind, nbytes, record.group_size, chip,
                                                bandwidth=bandwidth, topology=topology)


# ------------------------------------------------------------------------------------------
# A collective matmul
# ------------------------------------------------------------------------------------------

def allgather_matmul(a_block, w_block, axis: str):
    """Inside ``shard_map``: ``all_gather(a)[B, D] @ w[D, F_axis]``, the plain version.

    ``a_block`` is this device's ``[B/.., D/n]`` block of A (D split over ``axis``),
    ``w_block`` its ``[D, F/n]`` block of W. Returns this device's ``[B/.., F/n]`` block.
    """
    import jax
    a_full = jax.lax.all_gather(a_block, axis, axis=1, tiled=True)
    return a_full @ w_block


def collective_matmul(a_block, w_block, axis: str):
    """Inside ``shard_map``: the same product as :func:`allgather_matmul`, with the all-gather
    of A split into ``n - 1`` ``ppermute`` steps.

    At step ``k`` device ``i`` holds the chunk of A's columns that device ``(i + k) mod n``
    started with; it multiplies that chunk by the matching rows of its W block and, in the
    same step, passes the chunk to device ``i - 1``. The sends of step ``k`` are independent
    of the matmul of step ``k``, so a compiler with asynchronous collectives can overlap them.
    """
    import jax
    n = jax.lax.axis_size(axis)
    i = jax.lax.axis_index(axis)
    c = a_block.shape[1]
    if w_block.shape[0] != n * c:
        raise ValueError(f"w_block must have n * (columns of a_block) = {n} x {c} = {n * c} rows "
                         f"(W[D, F_{axis}] with D whole); got {w_block.shape[0]}")
    to_left = [(j, (j - 1) % n) for j in range(n)]
    chunk, acc = a_block, None
    for k in range(n):
        rows = jax.lax.dynamic_slice_in_dim(w_block, ((i + k) % n) * c, c, axis=0)
        nxt = jax.lax.ppermute(chunk, axis, to_left) if k < n - 1 else None
        part = chunk @ rows
        acc = part if acc is None else acc + part
        chunk = nxt
    return acc


def collective_matmul_times(B: int, D: int, F: int, n: int, chip, bytes_per_element: float = 2,
                            bidirectional: bool = True) -> dict:
    """Seconds per device for ``A[B, D_n] . W[D, F_n]`` on ``n`` chips of one torus axis.

    ``B, D, F`` are global sizes. Each device does ``2 B D F / n`` FLOPs at peak
    (:func:`scalebook.roofline.compute_time`). Plain: an all-gather of A's ``[B, D]``
    (:func:`scalebook.collectives.collective_time`, torus), then the matmul:
    ``T = T_gather + T_math``. Collective: ``n`` steps of ``T_math / n``; each of the first
    ``n - 1`` overlaps the send of one ``[B, D/n]`` chunk to a neighbour, taking
    ``chunk / W`` (one direction) or ``chunk / (2W)`` (``bidirectional``: half of each chunk
    goes each way round, as the torus all-gather does; on an axis of 2 chips there is
    one link, so ``chunk / W`` either way, the rule of
    :func:`scalebook.collectives.links_per_device`):
    ``T = T_math / n + (n - 1) max(T_math / n, T_step)``.
    Returns ``{"math", "gather", "step_comm", "plain", "collective"}``.
    """
    for name, v in (("B", B), ("D", D), ("F", F)):
        check_positive_int(name, v)
    n = check_positive_int("n (devices on the axis)", n)
    if D % n:
        raise ValueError(f"D = {D} must divide by n = {n} (A is split along D)")
    chip = get_chip(chip)
    t_math = _rl.compute_time(_rl.matmul_flops(B, D, F) / n, chip)
    gathered = B * D * bytes_per_element
    t_gather = _coll.collective_time("all-gather", gathered, n, chip)
    chunk = gathered / n
    links = _coll.links_per_device("torus", n) if bidirectional else 1
    t_step = _coll.collective_time("collective-permute", chunk, n, chip) / links
    steps = t_math / n + (n - 1) * max(t_math / n, t_step)
    return {"math": t_math, "gather": t_gather, "step_comm": t_step,
            "plain": t_gather + t_math, "collective": steps}


# ------------------------------------------------------------------------------------------
# One LLaMA-3 layer in three modes
# ------------------------------------------------------------------------------------------

def _check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")


def layer_specs(purpose: str) -> dict:
    """PartitionSpecs of a layer's weights and inputs for ``purpose`` "train" or "decode".

    Weights are stored per head: ``wq[D, Hkv, G, h]``, ``wk``/``wv[D, Hkv, h]``,
    ``wo[Hkv, G, h, D]``, ``w_gate``/``w_up[D, F]``, ``w_down[F, D]``. Heads and ``F`` are
    split over ``"model"`` (tensor parallelism). For training the ``D`` dimension of each
    weight is also split over ``"data"`` (FSDP) and the activations ``x[B_seq, S, D]`` over
    ``"data"``. For decoding the weights are whole along ``"data"``, ``x[B_seq, D]`` is split
    over ``"data"`` and the KV cache ``[B_seq, T, Hkv, h]`` over ``"data"`` (batch) and
    ``"model"`` (KV heads).
    """
    from jax.sharding import PartitionSpec as P
    _check_choice("purpose", purpose, PURPOSES)
    d = "data" if purpose == "train" else None
    specs = {"wq": P(d, "model", None, None), "wk": P(d, "model", None),
             "wv": P(d, "model", None), "wo": P("model", None, None, d),
             "w_gate": P(d, "model"), "w_up": P(d, "model"), "w_down": P("model", d)}
    if purpose == "train":
        specs["x"] = P("data", None, None)
    else:
        specs["x"] = P("data", None)
        specs["k_cache"] = P("data", None, "model", None)
        specs["v_cache"] = P("data", None, "model", None)
    return specs


def _layer_shapes(cfg, purpose, batch_seqs, seq_len):
    G = cfg.n_heads // cfg.n_kv_heads
    D, K, h, F = cfg.d_model, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    shapes = {"wq": (D, K, G, h), "wk": (D, K, h), "wv": (D, K, h), "wo": (K, G, h, D),
              "w_gate": (D, F), "w_up": (D, F), "w_down": (F, D)}
    if purpose == "train":
        shapes["x"] = (batch_seqs, seq_len, D)
    else:
        shapes["x"] = (batch_seqs, D)
        shapes["k_cache"] = shapes["v_cache"] = (batch_seqs, seq_len, K, h)
    return shapes


def layer_structs(cfg, mesh, purpose: str, batch_seqs: int, seq_len: int, dtype="bfloat16"):
    """``{name: jax.ShapeDtypeStruct}`` of one layer's weights and inputs, sharded on ``mesh``
    (a ``Mesh`` or an ``AbstractMesh`` with axes ``"data"`` and ``"model"``); no memory is
    allocated. ``seq_len`` is the sequence length S (train) or the context T (decode).
    Raises ValueError, naming the array, when a dimension does not divide by its axes.
    """
    import jax
    _check_choice("purpose", purpose, PURPOSES)
    sizes = _mesh_sizes(mesh)
    if set(sizes) != {"data", "model"}:
        raise ValueError(f"mesh must have the axes 'data' and 'model'; got {', '.join(sizes)}")
    check_positive_int("batch_seqs", batch_seqs)
    check_positive_int("seq_len", seq_len)
    specs = layer_specs(purpose)
    out = {}
    for name, shape in _layer_shapes(cfg, purpose, batch_seqs, seq_len).items():
        try:
            sharding = named_sharding(mesh, specs[name], shape)
        except ValueError as e:
            raise ValueError(f"{name}{list(shape)}: {e}") from None
        out[name] = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    return out


def _layer_math(x, p, cache, gather, rowsum, decode):
    """The layer's arithmetic, with the two places where modes differ passed in:
    ``gather(name, w)`` makes a weight usable (FSDP), ``rowsum(eq, a, w)`` is a contraction
    over a dimension split over "model" (tensor parallelism) and returns the summed result."""
    import jax
    import jax.numpy as jnp
    wq, wk, wv = gather("wq", p["wq"]), gather("wk", p["wk"]), gather("wv", p["wv"])
    wo = gather("wo", p["wo"])
    if decode:
        q = jnp.einsum("bd,dkgh->bkgh", x, wq)
        k, v = cache
        s = jnp.einsum("bkgh,btkh->bkgt", q, k) / math.sqrt(q.shape[-1])
        o = jnp.einsum("bkgt,btkh->bkgh", jax.nn.softmax(s, axis=-1), v)
        h1 = x + rowsum("bkgh,kghd->bd", o, wo)
    else:
        q = jnp.einsum("bsd,dkgh->bskgh", x, wq)
        k = jnp.einsum("bsd,dkh->bskh", x, wk)
        v = jnp.einsum("bsd,dkh->bskh", x, wv)
        S = x.shape[1]
        s = jnp.einsum("bskgh,btkh->bkgst", q, k) / math.sqrt(q.shape[-1])
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e30)
        o = jnp.einsum("bkgst,btkh->bskgh", jax.nn.softmax(s, axis=-1).astype(v.dtype), v)
        h1 = x + rowsum("bskgh,kghd->bsd", o, wo)
    g = jnp.einsum("...d,df->...f", h1, gather("w_gate", p["w_gate"]))
    u = jnp.einsum("...d,df->...f", h1, gather("w_up", p["w_up"]))
    return h1 + rowsum("...f,fd->...d", jax.nn.silu(g) * u, gather("w_down", p["w_down"]))


def _without_data(spec):
    from jax.sharding import PartitionSpec as P
    return P(*[None if e == "data" else e for e in spec])


def layer_fn(mode: str, purpose: str, mesh):
    """A jitted function for one layer's forward pass in ``mode`` on ``mesh``.

    Train: ``f(params, x) -> x_out[B_seq, S, D]``; decode: ``f(params, x, k_cache, v_cache)
    -> x_out[B_seq, D]``, with the shardings of :func:`layer_specs`. The three modes compute
    the same numbers:

    * ``"manual"``: ``shard_map``; the FSDP weights are all-gathered over ``"data"`` and the
      row-parallel products ``psum``-ed over ``"model"``, written by hand.
    * ``"explicit"`` (mesh axes Explicit): ``jax.reshard`` of each weight to its spec without
      ``"data"``; the row-parallel contractions give ``out_sharding``.
    * ``"auto"`` (mesh axes Auto): plain ``jnp`` code with ``in_shardings`` and a sharding
      constraint on each row-parallel result; the partitioner chooses the collectives.
    """
    import jax
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P
    _check_choice("mode", mode, MODES)
    _check_choice("purpose", purpose, PURPOSES)
    sizes = _mesh_sizes(mesh)
    if set(sizes) != {"data", "model"}:
        raise ValueError(f"mesh must have the axes 'data' and 'model'; got {', '.join(sizes)}")
    types = set(getattr(mesh, "axis_types", ()))
    want = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}.get(mode)
    if want is not None and types != {want}:
        raise ValueError(f"mode {mode!r} needs a mesh whose axes are all {want.name}; this mesh "
                         f"has {', '.join(t.name for t in mesh.axis_types)} (scalebook.make_mesh"
                         f"(..., explicit={mode == 'explicit'}))")
    specs = layer_specs(purpose)
    decode = purpose == "decode"
    wnames = [k for k in specs if k.startswith("w")]
    out_spec = specs["x"]

    def ns(spec):
        return NamedSharding(mesh, spec)

    if mode == "manual":
        def gather(name, w):
            spec = specs[name]
            if "data" not in spec:
                return w
            return jax.lax.all_gather(w, "data", axis=tuple(spec).index("data"), tiled=True)

        def rowsum(eq, a, w):
            return jax.lax.psum(jax.numpy.einsum(eq, a, w), "model")

        def body(p, x, *cache):
            return _layer_math(x, p, cache, gather, rowsum, decode)

        in_specs = ({k: specs[k] for k in wnames}, specs["x"]) + \
            ((specs["k_cache"], specs["v_cache"]) if decode else ())
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_spec))

    if mode == "explicit":
        def gather(name, w):
            return jax.reshard(w, ns(_without_data(specs[name])))

        def rowsum(eq, a, w):
            return jax.numpy.einsum(eq, a, w, out_sharding=ns(out_spec))

        def f(p, x, *cache):
            return _layer_math(x, p, cache, gather, rowsum, decode)

        return jax.jit(f)

    def gather_auto(name, w):
        return w

    def rowsum_auto(eq, a, w):
        return jax.lax.with_sharding_constraint(jax.numpy.einsum(eq, a, w), ns(out_spec))

    def f_auto(p, x, *cache):
        return _layer_math(x, p, cache, gather_auto, rowsum_auto, decode)

    in_sh = ({k: ns(specs[k]) for k in wnames}, ns(specs["x"])) + \
        ((ns(specs["k_cache"]), ns(specs["v_cache"])) if decode else ())
    return jax.jit(f_auto, in_shardings=in_sh, out_shardings=ns(out_spec))
