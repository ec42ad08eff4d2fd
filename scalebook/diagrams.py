"""Diagrams of meshes, shardings, collectives and pipeline schedules (chapters 3, 5, 10).

Every picture is computed, so it cannot disagree with what it shows:

* :func:`sharded_array` / :func:`sharded_arrays` colour an array's blocks by the devices
  that hold them, read from a real ``NamedSharding``'s ``devices_indices_map`` (a block
  held by several devices is striped in all their colours and labelled with all of them);
* :func:`collective` / :func:`collectives` draw who holds which chunk before and after
  each collective, from :func:`collective_blocks` (tests/test_diagrams.py runs each
  collective under ``jax.shard_map`` and compares);
* :func:`ring` draws the chunks each device sends at each step of a ring all-gather,
  reduce-scatter or all-reduce, from :func:`ring_steps` (whose last state is the
  collective's result and whose traffic adds up to :func:`scalebook.collectives.ring_bytes`);
* :func:`pipeline_schedule` draws a :class:`scalebook.parallelism.Schedule`: stages
  against time steps with the microbatch numbers.

Each function returns a ``matplotlib.figure.Figure`` (not a pyplot figure: it shows when it
is a cell's last value and leaves no pyplot state behind) drawn for the book's column: at
most :data:`MAX_WIDTH` inches wide, no text under :data:`MIN_FONT` points. Its caption, a
sentence saying what it shows, is :func:`caption` (``scalebook.mesh.describe_figure``
returns it, and the site uses it as the figure's caption and alt text).

Colours: one per device (:func:`device_color`), the same in every diagram.
"""

from __future__ import annotations

import functools
import math
import numbers

__all__ = ["MAX_WIDTH", "MIN_FONT", "COLLECTIVE_KINDS", "RING_KINDS", "device_color",
           "device_label", "caption", "mesh_for", "block_holders", "sharded_array",
           "sharded_arrays", "collective_blocks", "collective", "collectives", "ring_steps",
           "ring", "pipeline_schedule"]

MAX_WIDTH = 6.8          # inches: the 7 in (672 px) column less the 0.1 in that the
                         # notebook's tight crop pads on each side of the drawing
MIN_FONT = 9.0           # points: the smallest text in any diagram
COLLECTIVE_KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
                    "collective-permute")
RING_KINDS = ("all-gather", "reduce-scatter", "all-reduce")
_ALIASES = {"ppermute": "collective-permute", "permute": "collective-permute",
            "allgather": "all-gather", "reducescatter": "reduce-scatter",
            "allreduce": "all-reduce", "alltoall": "all-to-all"}
_CAPTION_ATTR = "scalebook_caption"
_EDGE = "#222222"


# ------------------------------------------------------------------------------------------
# Shared pieces: colours, labels, captions, figures
# ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def device_color(device_id: int) -> str:
    """The colour of device ``device_id`` in every diagram: the light half of matplotlib's
    tab20 for devices 0-9 (black text stays readable on it), then the dark half, cycling."""
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    tab20 = colormaps["tab20"].colors
    order = list(tab20[1::2]) + list(tab20[0::2])
    return to_hex(order[int(device_id) % len(order)])


def device_label(ids, per_line: int = 2) -> str:
    """Device ids as a short label: ``(0,)`` -> ``d0``, ``(0, 4)`` -> ``d0, d4``, a run of
    three or more -> ``d0–d3``; at most ``per_line`` items a line."""
    ids = sorted(int(i) for i in ids)
    if not ids:
        raise ValueError("device_label needs at least one device id")
    items, start = [], 0
    for k in range(1, len(ids) + 1):
        if k == len(ids) or ids[k] != ids[k - 1] + 1:
            run = ids[start:k]
            if len(run) >= 3:
                items.append(f"d{run[0]}–d{run[-1]}")
            else:
                items.extend(f"d{i}" for i in run)
            start = k
    lines = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    return ",\n".join(lines)


def caption(fig) -> str | None:
    """The sentence a diagram's figure carries as its caption (None for other figures)."""
    return getattr(fig, _CAPTION_ATTR, None)


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    if width > MAX_WIDTH:
        raise ValueError(f"a diagram is at most {MAX_WIDTH} in wide; asked for {width:.2f}")
    return Figure(figsize=(width, height), layout="constrained")


def _finish(fig, text: str):
    setattr(fig, _CAPTION_ATTR, text)
    return fig


def _int(name: str, value, minimum: int = 1, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum \
            or (maximum is not None and value > maximum):
        top = f" and at most {maximum}" if maximum is not None else ""
        raise ValueError(f"{name} must be an integer of at least {minimum}{top}; got {value!r}")
    return int(value)


def _add(ax, patch):
    """Add a patch without updating the data limits (every diagram sets its own), which
    is most of the time add_patch takes."""
    ax.add_artist(patch)


def _striped(ax, x, y, w, h, ids, zorder=1):
    """A w x h rectangle at (x, y), in vertical stripes, one per device of ``ids``."""
    from matplotlib.patches import Rectangle

    ids = sorted(ids)
    for k, d in enumerate(ids):
        _add(ax, Rectangle((x + k * w / len(ids), y), w / len(ids), h, lw=0,
                               facecolor=device_color(d), zorder=zorder))
    _add(ax, Rectangle((x, y), w, h, fill=False, edgecolor=_EDGE, lw=1.0,
                           zorder=zorder + 1))


# ------------------------------------------------------------------------------------------
# Meshes and sharded arrays
# ------------------------------------------------------------------------------------------

def mesh_for(mesh_shape, axis_names):
    """A ``jax.sharding.Mesh`` of the given shape over the first devices (those that
    :func:`scalebook.mesh.setup` chose, or JAX's own), checked: positive sizes, one name per
    axis, no more devices than there are."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from . import mesh as _mesh

    shape = tuple(mesh_shape) if isinstance(mesh_shape, (tuple, list)) else (mesh_shape,)
    names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    for s in shape:
        _int("every mesh size", s)
    if len(shape) != len(names) or not all(isinstance(a, str) for a in names):
        raise ValueError(f"mesh shape {shape} needs one axis name (a string) per size; "
                         f"got {names}")
    if len(set(names)) != len(names):
        raise ValueError(f"mesh axis names must differ; got {names}")
    try:
        devs = _mesh.devices()
    except Exception:
        devs = jax.devices()
    need = math.prod(shape)
    if need > len(devs):
        raise ValueError(f"a {' x '.join(map(str, shape))} mesh needs {need} devices; "
                         f"there are {len(devs)}")
    return Mesh(np.array(devs[:need]).reshape(shape), names)


def _as_sharding(spec, mesh_shape, axis_names, shape):
    """(NamedSharding, array shape) from a NamedSharding, a jax.Array or a PartitionSpec."""
    from jax.sharding import NamedSharding, PartitionSpec

    from . import sharding as _sh

    if hasattr(spec, "sharding") and hasattr(spec, "shape"):        # a jax.Array
        shape = tuple(spec.shape) if shape is None else shape
        spec = spec.sharding
    if isinstance(spec, NamedSharding):
        if shape is None:
            raise ValueError("give the array's shape (shape=...) with a NamedSharding")
        _sh.shard_shape(tuple(shape), spec.spec, spec.mesh)
        return spec, tuple(shape)
    if not isinstance(spec, (PartitionSpec, tuple, list)):
        raise TypeError(f"spec must be a PartitionSpec, a NamedSharding or a sharded "
                        f"jax.Array; got {type(spec).__name__}")
    if shape is None:
        raise ValueError("give the array's shape (shape=...) with a PartitionSpec")
    mesh = mesh_for(mesh_shape, axis_names)
    return _sh.named_sharding(mesh, spec, tuple(shape)), tuple(shape)


def block_holders(sharding, shape) -> dict:
    """``{block: device ids}`` of an array of ``shape`` under ``sharding``, read from JAX's
    ``devices_indices_map``: a block is one (start, stop) pair per dimension, the ids are
    sorted; blocks come in row-major order."""
    shape = tuple(shape)
    out: dict = {}
    for dev, index in sharding.devices_indices_map(shape).items():
        index = tuple(index) + (slice(None),) * (len(shape) - len(tuple(index)))
        block = tuple((s.start or 0, n if s.stop is None else s.stop)
                      for s, n in zip(index, shape))
        out.setdefault(block, []).append(dev.id)
    return {b: tuple(sorted(out[b])) for b in sorted(out)}


def _spec_text(spec) -> str:
    return "P(" + ", ".join(repr(e) if not isinstance(e, tuple) else
                            "(" + ", ".join(map(repr, e)) + ")" for e in tuple(spec)) + ")"


def _draw_mesh(ax, mesh):
    ids = [[d.id for d in row] for row in mesh.devices.reshape(
        (mesh.devices.shape[0] if mesh.devices.ndim == 2 else 1, -1))]
    rows, cols = len(ids), len(ids[0])
    for r in range(rows):
        for c in range(cols):
            _striped(ax, c, r, 1, 1, [ids[r][c]])
            ax.text(c + 0.5, r + 0.5, f"d{ids[r][c]}", ha="center", va="center",
                    fontsize=MIN_FONT + 1)
    names = mesh.axis_names
    sizes = dict(mesh.shape)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.set_xticks([c + 0.5 for c in range(cols)], [str(c) for c in range(cols)])
    ax.set_yticks([r + 0.5 for r in range(rows)], [str(r) for r in range(rows)])
    ax.tick_params(labelsize=MIN_FONT, length=0)
    ax.set_xlabel(f"mesh axis {names[-1]!r} ({sizes[names[-1]]})", fontsize=MIN_FONT)
    if len(names) == 2:
        ax.set_ylabel(f"axis {names[0]!r} ({sizes[names[0]]})", fontsize=MIN_FONT)
    ax.set_title("the devices on the mesh", fontsize=MIN_FONT + 1)


def _draw_blocks(ax, holders, shape, title):
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    for block, ids in holders.items():
        (r0, r1), (c0, c1) = ((0, 1), block[0]) if len(shape) == 1 else block
        _striped(ax, c0, r0, c1 - c0, r1 - r0, ids)
        label = device_label(ids)
        ax.text((c0 + c1) / 2, (r0 + r1) / 2, label, ha="center", va="center",
                fontsize=MIN_FONT, linespacing=1.0, zorder=5,
                bbox=None if len(ids) == 1 else dict(boxstyle="round,pad=0.15", lw=0,
                                                     facecolor="white", alpha=0.8))
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    cuts_c = sorted({b[-1][0] for b in holders} | {cols})
    cuts_r = sorted({b[0][0] for b in holders} | {rows}) if len(shape) == 2 else [0, 1]
    ax.set_xticks(cuts_c)
    ax.set_yticks(cuts_r if len(shape) == 2 else [])
    ax.tick_params(labelsize=MIN_FONT)
    ax.set_xlabel("column j" if len(shape) == 2 else "index i", fontsize=MIN_FONT)
    if len(shape) == 2:
        ax.set_ylabel("row i", fontsize=MIN_FONT)
    ax.set_title(title, fontsize=MIN_FONT + 1)


def sharded_arrays(specs, mesh_shape=(2, 4), axis_names=("x", "y"), shape=(8, 16), *,
                   titles=None, show_mesh: bool = True, ncols: int = 2):
    """One panel per sharding of a 1-D or 2-D array of ``shape``: each block coloured by
    the device(s) holding it and labelled with their ids, read from the sharding's
    ``devices_indices_map``. ``specs`` are ``PartitionSpec``s (placed on a mesh of
    ``mesh_shape`` with ``axis_names``), ``NamedSharding``s or sharded ``jax.Array``s.
    With ``show_mesh`` the first panel draws the mesh's devices. ``titles`` (one per spec)
    default to the specs; given a dict, its keys name the specs (``"A[I_X, J] = P('x',
    None)"``)."""
    named = None
    if isinstance(specs, dict):
        named, specs = list(specs), list(specs.values())
    specs = list(specs)
    if not specs:
        raise ValueError("specs is empty: give at least one PartitionSpec or NamedSharding")
    ncols = _int("ncols", ncols, 1, 3)
    if titles is not None and len(titles) != len(specs):
        raise ValueError(f"titles has {len(titles)} entries for {len(specs)} specs")
    placed = [_as_sharding(s, mesh_shape, axis_names, shape) for s in specs]
    for sh, shp in placed:
        if len(shp) not in (1, 2):
            raise ValueError(f"sharded_array draws 1-D or 2-D arrays; got shape {shp}")
    meshes = {id(sh.mesh): sh.mesh for sh, _ in placed}
    mesh = placed[0][0].mesh
    if show_mesh and mesh.devices.ndim > 2:
        raise ValueError(f"the mesh panel draws 1-D or 2-D meshes; this one is "
                         f"{mesh.devices.shape} (pass show_mesh=False)")
    if named is not None and titles is None:
        titles = [f"{k} = {_spec_text(sh.spec)}" for k, (sh, _) in zip(named, placed)]
    panels = [("mesh", None)] * bool(show_mesh) + list(zip(placed, titles or [None] * len(specs)))
    ncols = min(ncols, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    def aspect(panel):
        if panel[0] == "mesh":
            return mesh.devices.shape[0] / mesh.devices.shape[-1] if mesh.devices.ndim == 2 \
                else 1 / mesh.devices.shape[0]
        shp = panel[0][1]
        return 1 / shp[0] if len(shp) == 1 else shp[0] / shp[1]

    panel_w = MAX_WIDTH / ncols
    heights = [panel_w * min(max(max(aspect(p) for p in panels[r * ncols:(r + 1) * ncols]),
                                 0.25), 0.8) + 0.75 for r in range(nrows)]
    fig = _figure(MAX_WIDTH, sum(heights))
    axes = list(fig.subplots(nrows, ncols, squeeze=False, height_ratios=heights).flat)
    for ax, panel in zip(axes, panels):
        if panel[0] == "mesh":
            _draw_mesh(ax, mesh)
            continue
        (sh, shp), title = panel
        _draw_blocks(ax, block_holders(sh, shp), shp, title or _spec_text(sh.spec))
        if not 0.25 <= aspect(panel) <= 0.8:
            ax.set_aspect("auto")       # a very tall or flat array: not drawn to scale
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    shapes = list(dict.fromkeys(shp for _, shp in placed))
    shp = shapes[0]
    dims = " x ".join(map(str, shp))
    mesh_txt = " x ".join(f"{n} ({a!r})" for a, n in dict(mesh.shape).items())
    article = "an" if str(shp[0]).startswith("8") or shp[0] in (11, 18) else "a"
    what = f"{article} {dims} array" if len(shapes) == 1 else "each array"
    text = (f"Which device holds each block of {what} on a {mesh_txt} mesh, "
            f"for {len(specs)} sharding{'s' * (len(specs) > 1)}: a block's colour and "
            f"label name the devices that hold it, and a block held by several devices is "
            f"striped in all their colours.")
    if len(meshes) > 1:
        text = text.replace(f"on a {mesh_txt} mesh", "on their meshes")
    if show_mesh:
        text += " The first panel shows where each device sits on the mesh."
    return _finish(fig, text)


def sharded_array(spec, mesh_shape=(2, 4), axis_names=("x", "y"), shape=(8, 16), *,
                  title: str | None = None, show_mesh: bool = True):
    """:func:`sharded_arrays` for one sharding: the mesh beside the array's blocks."""
    return sharded_arrays([spec], mesh_shape, axis_names, shape,
                          titles=None if title is None else [title], show_mesh=show_mesh)


# ------------------------------------------------------------------------------------------
# Collectives: who holds what, before and after
# ------------------------------------------------------------------------------------------

def _kind(kind, allowed=COLLECTIVE_KINDS) -> str:
    from .errors import UnknownNameError

    k = _ALIASES.get(str(kind).lower().replace("_", "-").replace(" ", ""), kind)
    k = _ALIASES.get(str(k).lower().replace("-", ""), k)
    if k not in allowed:
        raise UnknownNameError(f"unknown collective {kind!r}; choose one of "
                               f"{', '.join(allowed)}")
    return k


def collective_blocks(kind: str, n: int):
    """Who holds what before and after a collective over ``n`` devices.

    Returns ``(before, after)``: for each device a tuple of ``n`` slots, each ``None``
    (empty) or a frozenset of ``(source device, chunk)`` pairs, the sum of whose data the
    slot holds. The array is cut into chunks ``A0 .. A(n-1)``:

    * all-gather: device d starts with chunk d and ends with all of them;
    * reduce-scatter: every device starts with its own full array, device d ends with chunk
      d summed over all devices;
    * all-reduce: the same start; every device ends with every chunk summed;
    * all-to-all: device d starts with its n chunks and sends chunk c to device c, so slot
      s of device d ends holding chunk d of device s (a transpose);
    * collective-permute (a shift by one): device d's chunk d moves to device d + 1 mod n.
    """
    kind = _kind(kind)
    n = _int("n", n, 2, 16)

    def one(s, c):
        return frozenset({(s, c)})

    def total(c):
        return frozenset((s, c) for s in range(n))

    own = tuple(tuple(one(d, c) for c in range(n)) for d in range(n))
    diag = tuple(tuple(one(d, d) if c == d else None for c in range(n)) for d in range(n))
    if kind == "all-gather":
        return diag, tuple(tuple(one(c, c) for c in range(n)) for _ in range(n))
    if kind == "reduce-scatter":
        return own, tuple(tuple(total(d) if c == d else None for c in range(n))
                          for d in range(n))
    if kind == "all-reduce":
        return own, tuple(tuple(total(c) for c in range(n)) for _ in range(n))
    if kind == "all-to-all":
        return own, tuple(tuple(one(s, d) for s in range(n)) for d in range(n))
    return diag, tuple(tuple(one(c, c) if c == (d - 1) % n else None for c in range(n))
                       for d in range(n))


def _chunk_label(cell) -> str:
    chunks = {c for _, c in cell}
    if len(chunks) != 1:
        raise ValueError(f"a slot sums pieces of one chunk; got chunks {sorted(chunks)}")
    (c,) = chunks
    return (f"ΣA{c}" if len(cell) > 1 else f"A{c}")


def _draw_slots(ax, state, title, show_devices=True):
    n = len(state)
    for d, row in enumerate(state):
        for c, cell in enumerate(row):
            if cell is None:
                from matplotlib.patches import Rectangle
                _add(ax, Rectangle((c, d), 1, 1, fill=False, edgecolor="#bbbbbb",
                                       lw=0.6, ls=":"))
                continue
            _striped(ax, c, d, 1, 1, {s for s, _ in cell})
            ax.text(c + 0.5, d + 0.5, _chunk_label(cell), ha="center", va="center",
                    fontsize=MIN_FONT, zorder=5)
    ax.set_xlim(0, len(state[0]))
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([d + 0.5 for d in range(n)], [f"d{d}" for d in range(n)] if show_devices
                  else [""] * n)
    ax.tick_params(labelsize=MIN_FONT, length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title, fontsize=MIN_FONT)


def collectives(kinds=COLLECTIVE_KINDS, n: int = 4):
    """Before/after diagrams of several collectives over ``n`` devices, one row each: a
    row of squares per device, one square per chunk, coloured by the device(s) whose data
    it holds (a sum is striped in all their colours and marked Σ). From
    :func:`collective_blocks`."""
    if isinstance(kinds, str):
        kinds = [kinds]
    kinds = [_kind(k) for k in kinds]
    if not kinds:
        raise ValueError("kinds is empty: name at least one collective")
    n = _int("n", n, 2, 8)
    per_row = 1 if len(kinds) == 1 else 2
    nrows = math.ceil(len(kinds) / per_row)
    cell = min(0.4, (MAX_WIDTH / per_row - 0.9) / (2 * n))
    fig = _figure(MAX_WIDTH, nrows * (n * cell + 0.75))
    subs = fig.subfigures(nrows, per_row, squeeze=False).flat
    for sub, kind in zip(subs, kinds):
        before, after = collective_blocks(kind, n)
        ax_b, ax_a = sub.subplots(1, 2)
        _draw_slots(ax_b, before, "before")
        _draw_slots(ax_a, after, "after")
        sub.suptitle(kind, fontsize=MIN_FONT + 1)
    names = ", ".join(kinds[:-1]) + (" and " if len(kinds) > 1 else "") + kinds[-1]
    text = (f"Who holds which chunk before and after the {names} over {n} devices: "
            f"each row is a device (d0 to d{n - 1}), each square a chunk A0 to A{n - 1} of "
            f"the array, coloured by the device its data came from; ΣAc is chunk c summed "
            f"over the devices whose colours stripe it.")
    return _finish(fig, text)


def collective(kind: str, n: int = 4):
    """:func:`collectives` for one kind."""
    return collectives([kind], n)


# ------------------------------------------------------------------------------------------
# Rings: the traffic of each step
# ------------------------------------------------------------------------------------------

def ring_steps(kind: str, n: int, direction: int = 1):
    """The ring algorithm of ``kind`` over ``n`` devices, step by step.

    Returns ``(states, sends)``: ``states[0]`` is :func:`collective_blocks`'s before-state
    and ``states[s + 1]`` what each device holds after step ``s``; ``sends[s]`` lists the
    ``(source, destination, cell)`` of step ``s``, each device sending one chunk (a
    frozenset of ``(source device, chunk)`` pairs, like a slot) to the next device,
    i + ``direction`` mod n (``direction`` = 1 or -1). All-gather: at step s device i
    passes on chunk (i - s direction) mod n, the one it received last. Reduce-scatter:
    device i sends its partial sum of chunk (i - (s + 1) direction) mod n and the receiver
    adds its own part, so after n - 1 steps device d holds all of chunk d. An all-reduce
    is a reduce-scatter followed by an all-gather of the summed chunks."""
    kind = _kind(kind, RING_KINDS)
    n = _int("n", n, 2, 16)
    if direction not in (1, -1) or isinstance(direction, bool):
        raise ValueError(f"direction must be 1 (to device i + 1) or -1 (to device i - 1); "
                         f"got {direction!r}")
    before, _ = collective_blocks(kind, n)
    states = [tuple(tuple(row) for row in before)]
    sends = []

    def step(chunk_of, add):
        cur = [list(row) for row in states[-1]]
        moves = []
        for i in range(n):
            c = chunk_of(i)
            cell = cur[i][c]
            if cell is None:
                raise AssertionError(f"device {i} has no chunk {c} to send")
            moves.append((i, (i + direction) % n, cell))
        nxt = [list(row) for row in cur]
        for src, dst, cell in moves:
            (c,) = {ch for _, ch in cell}
            mine = cur[dst][c] if add and cur[dst][c] is not None else frozenset()
            nxt[dst][c] = frozenset(cell | mine)
        states.append(tuple(tuple(row) for row in nxt))
        sends.append(tuple(moves))

    if kind in ("reduce-scatter", "all-reduce"):
        for s in range(n - 1):
            step(lambda i, s=s: (i - (s + 1) * direction) % n, add=True)
    if kind == "reduce-scatter":
        # the slots other than a device's own chunk hold stale partial sums: drop them
        final = tuple(tuple(cell if c == d else None for c, cell in enumerate(row))
                      for d, row in enumerate(states[-1]))
        states[-1] = final
    if kind in ("all-gather", "all-reduce"):
        for s in range(n - 1):
            step(lambda i, s=s: (i - s * direction) % n, add=False)
    return states, sends


def ring(n: int = 4, kind: str = "all-gather", step: int | None = None,
         direction: int = 1, bidirectional: bool = False):
    """The ring ``kind`` over ``n`` devices: one panel per step (or only ``step``,
    counted from 0), the devices on a circle and, on each arrow, the chunk that device
    sends to the next one (i + ``direction``) in that step, coloured by the devices whose
    data it sums. From :func:`ring_steps`.

    ``bidirectional=True`` draws the ring of a torus axis, whose links carry data both
    ways: every chunk is split in two halves (marked ½), one half runs the ring of
    ``direction`` 1 (arrows outside the circle), the other that of -1 (inside), so each
    link carries half a chunk a step in each direction and the collective takes half the
    time of the one-way ring."""
    from matplotlib.patches import Circle, FancyArrowPatch

    kind = _kind(kind, RING_KINDS)
    n = _int("n", n, 2, 8)
    if not isinstance(bidirectional, bool):
        raise ValueError(f"bidirectional must be True or False; got {bidirectional!r}")
    if bidirectional and n == 2:
        raise ValueError("a ring of 2 devices has one link: nothing to send the other way "
                         "round (bidirectional needs n >= 3)")
    rings = ([(1, ring_steps(kind, n, 1)[1]), (-1, ring_steps(kind, n, -1)[1])]
             if bidirectional else [(direction, ring_steps(kind, n, direction)[1])])
    n_steps = len(rings[0][1])
    steps = list(range(n_steps))
    if step is not None:
        step = _int("step", step, 0, n_steps - 1)
        steps = [step]
    ncols = min(len(steps), 2 if bidirectional else 3)
    nrows = math.ceil(len(steps) / ncols)
    panel = MAX_WIDTH / ncols
    radius = max(1.0, n / 4) * (1.45 if bidirectional else 1.0)
    tall = 3.4 if n > 4 or bidirectional else 2.6
    fig = _figure(MAX_WIDTH, nrows * min(panel, tall) + 0.1)
    axes = list(fig.subplots(nrows, ncols, squeeze=False).flat)
    pos = [(radius * math.sin(2 * math.pi * i / n), radius * math.cos(2 * math.pi * i / n))
           for i in range(n)]
    half = "½" if bidirectional else ""
    box = 0.72 if bidirectional else 0.56
    for ax, s in zip(axes, steps):
        for i, (x, y) in enumerate(pos):
            _add(ax, Circle((x, y), 0.24, facecolor=device_color(i), edgecolor=_EDGE,
                            lw=1.0, zorder=3))
            ax.text(x, y, f"d{i}", ha="center", va="center", fontsize=MIN_FONT, zorder=4)
        for way, sends in rings:
            for src, dst, cell in sends[s]:
                (x0, y0), (x1, y1) = pos[src], pos[dst]
                # clockwise arcs (direction 1) bulge outwards; anticlockwise ones too
                # unless both run, when they bulge inwards, off the clockwise arrows
                rad = -(0.35 if n > 2 else 0.5) * (1 if bidirectional else way)
                _add(ax, FancyArrowPatch((x0, y0), (x1, y1),
                                         connectionstyle=f"arc3,rad={rad}",
                                         arrowstyle="-|>", mutation_scale=12, lw=1.2,
                                         color="#444444", shrinkA=14, shrinkB=14,
                                         zorder=2))
                # the chunk in flight, on the arc's midpoint: matplotlib's arc3 puts the
                # control point at mid + rad (dy, -dx), and a quadratic Bezier passes half
                # way to it
                dx, dy = x1 - x0, y1 - y0
                cx, cy = (x0 + x1) / 2 + rad * dy / 2, (y0 + y1) / 2 - rad * dx / 2
                _striped(ax, cx - box / 2, cy - 0.16, box, 0.32,
                         {d for d, _ in cell}, zorder=6)
                ax.text(cx, cy, half + _chunk_label(cell), ha="center", va="center",
                        fontsize=MIN_FONT, zorder=8)
        phase = ""
        if kind == "all-reduce":
            phase = " (reduce-scatter)" if s < n - 1 else " (all-gather)"
        ax.set_title(f"step {s + 1} of {n_steps}{phase}", fontsize=MIN_FONT + 1)
        ax.set_xlim(-radius - 0.75, radius + 0.75)
        ax.set_ylim(-radius - 0.5, radius + 0.5)
        ax.set_aspect("equal")
        ax.axis("off")
    for ax in axes[len(steps):]:
        ax.set_visible(False)
    which = "every step" if step is None else f"step {step + 1}"
    if bidirectional:
        text = (f"The bidirectional ring {kind} over {n} devices, {which} of {n_steps}: "
                f"every chunk is split in halves (½), one travelling clockwise (arrows "
                f"outside) and one anticlockwise (inside), coloured by the devices whose "
                f"data they carry (ΣAc: a sum of chunk c); each device sends half a chunk "
                f"each way a step, so each link carries half the bytes of the one-way ring.")
        return _finish(fig, text)
    way = "next" if direction == 1 else "previous"
    text = (f"The ring {kind} over {n} devices, {which} of {n_steps}: in each step "
            f"every device sends one chunk to the {way} device round the ring (the chunk on "
            f"each arrow, coloured by the devices whose data it carries; ΣAc is a partial "
            f"or complete sum of chunk c), so each device sends {n_steps} chunks of "
            f"1/{n} of the array in all.")
    return _finish(fig, text)


# ------------------------------------------------------------------------------------------
# Pipeline schedules
# ------------------------------------------------------------------------------------------

FORWARD_COLOR = "#aec7e8"
BACKWARD_COLOR = "#ffbb78"


def pipeline_schedule(schedules, titles=None):
    """Stages against time steps for one or more :class:`scalebook.parallelism.Schedule`
    (a Schedule, a list, or a dict of them: its keys become the titles): each forward
    (blue) or backward (orange) carries its microbatch number, white is idle, the bubble.
    Numbers are left out where a step is too narrow for 9 pt text."""
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import MaxNLocator

    from .parallelism import Schedule

    if isinstance(schedules, dict):
        titles = list(schedules) if titles is None else titles
        schedules = list(schedules.values())
    elif isinstance(schedules, Schedule):
        schedules = [schedules]
    schedules = list(schedules)
    if not schedules or not all(isinstance(s, Schedule) for s in schedules):
        raise TypeError("pipeline_schedule draws scalebook.parallelism.Schedule objects "
                        "(from parallelism.pipeline_schedule or simulate_schedule)")
    if titles is not None and len(titles) != len(schedules):
        raise ValueError(f"titles has {len(titles)} entries for {len(schedules)} schedules")
    steps = max(s.steps for s in schedules)
    plot_w = MAX_WIDTH - 0.8
    numbered = plot_w / steps >= 0.2
    heights = [0.3 * s.n_stages + 0.55 for s in schedules]
    fig = _figure(MAX_WIDTH, sum(heights) + 0.45)
    axes = fig.subplots(len(schedules), 1, squeeze=False, sharex=True,
                        height_ratios=heights)[:, 0]
    for k, (ax, sched) in enumerate(zip(axes, schedules)):
        for p, row in enumerate(sched.grid):
            for t, cell in enumerate(row):
                if cell is None:
                    continue
                colour = FORWARD_COLOR if cell[0] == "F" else BACKWARD_COLOR
                _add(ax, Rectangle((t, p), 1, 1, facecolor=colour, edgecolor="white",
                                       lw=0.8))
                if numbered:
                    ax.text(t + 0.5, p + 0.5, str(cell[1]), ha="center", va="center",
                            fontsize=MIN_FONT)
        ax.set_xlim(0, steps)
        ax.set_ylim(sched.n_stages, 0)
        ax.set_yticks([p + 0.5 for p in range(sched.n_stages)],
                      [str(p) for p in range(sched.n_stages)])
        ax.tick_params(labelsize=MIN_FONT, length=0)
        ax.set_ylabel("stage", fontsize=MIN_FONT)
        name = titles[k] if titles is not None else sched.kind
        ax.set_title(f"{name}: {sched.steps} steps, bubble {sched.bubble_fraction:.0%}",
                     fontsize=MIN_FONT + 1)
    axes[-1].set_xlabel("time step", fontsize=MIN_FONT)
    axes[-1].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.legend(handles=[Patch(facecolor=FORWARD_COLOR, label="forward"),
                        Patch(facecolor=BACKWARD_COLOR, label="backward"),
                        Patch(facecolor="white", edgecolor="#999999", label="idle")],
               fontsize=MIN_FONT, ncols=3, loc="outside upper center", frameon=False)
    s0 = schedules[0]
    names = " and ".join(str(t) for t in (titles or [s.kind for s in schedules]))
    text = (f"The {names} schedule{'s' * (len(schedules) > 1)} of a {s0.n_stages}-stage "
            f"pipeline with {s0.n_microbatches} microbatches: each row is a stage, each "
            f"column a time step; a blue square is a forward and an orange one a backward"
            f"{' of the microbatch whose number it shows' if numbered else ''}, and the "
            f"white gaps are the bubble.")
    return _finish(fig, text)
