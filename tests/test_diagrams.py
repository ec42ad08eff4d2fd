"""scalebook.diagrams: the pictures agree with what they show.

* sharded_array's stripes and labels, read back from the drawn figure, equal the holders of
  each element that JAX's devices_indices_map gives, on several meshes, specs and shapes;
* collective_blocks' after-state is what the collective computes: each collective runs under
  jax.shard_map on one-hot inputs (one position per source device and chunk), so the result
  names exactly which pieces each device ends up holding and summing;
* the ring algorithm ends in that after-state and sends ring_bytes per device;
* the pipeline figure shows the schedule's grid; bad input gets a clear error; every figure
  fits the 7 in column with text of 9 pt or more and carries a caption sentence.
"""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from matplotlib.patches import FancyArrowPatch, Rectangle
from matplotlib.text import Text

import scalebook
from scalebook import collectives as coll
from scalebook import diagrams as dg
from scalebook import parallelism as par
from scalebook.errors import UnknownNameError
from scalebook.mesh import describe_figure

COLOR_TO_DEVICE = {dg.device_color(d): d for d in range(8)}


def _hex(rgba) -> str:
    from matplotlib.colors import to_hex
    return to_hex(rgba)


def _panel(fig, title):
    (ax,) = [a for a in fig.axes if a.get_visible() and a.get_title() == title]
    return ax


def _drawn_blocks(ax):
    """{block outline (x0, y0, x1, y1): (device ids of its stripes, its label's ids)}."""
    outlines = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]
    stripes = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_fill()]
    out = {}
    for o in outlines:
        x0, y0 = o.get_xy()
        x1, y1 = x0 + o.get_width(), y0 + o.get_height()
        ids = {COLOR_TO_DEVICE[_hex(s.get_facecolor())] for s in stripes
               if x0 - 1e-9 <= s.get_x() and s.get_x() + s.get_width() <= x1 + 1e-9
               and y0 - 1e-9 <= s.get_y() and s.get_y() + s.get_height() <= y1 + 1e-9}
        labels = [t.get_text() for t in ax.texts
                  if x0 < t.get_position()[0] < x1 and y0 < t.get_position()[1] < y1]
        assert len(labels) == 1, (o, labels)
        out[(x0, y0, x1, y1)] = (ids, _parse_label(labels[0]))
    return out


def _parse_label(text):
    ids = set()
    for item in text.replace("\n", " ").split(","):
        item = item.strip()
        if "–" in item:
            a, b = item.split("–")
            ids |= set(range(int(a[1:]), int(b[1:]) + 1))
        else:
            ids.add(int(item[1:]))
    return ids


def _holders_from_jax(sharding, shape):
    """For each element: the set of devices holding it, from devices_indices_map."""
    held = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        held[idx] = set()
    for dev, index in sharding.devices_indices_map(shape).items():
        sub = held[index]
        for idx in np.ndindex(*sub.shape):
            sub[idx].add(dev.id)
    return held


CASES = [
    ((2, 4), ("x", "y"), (8, 16), P()),
    ((2, 4), ("x", "y"), (8, 16), P("x", None)),
    ((2, 4), ("x", "y"), (8, 16), P(None, "y")),
    ((2, 4), ("x", "y"), (8, 16), P("x", "y")),
    ((2, 4), ("x", "y"), (8, 16), P("y", "x")),
    ((2, 4), ("x", "y"), (8, 16), P(("x", "y"), None)),
    ((2, 4), ("x", "y"), (8, 16), P(None, ("y", "x"))),
    ((4, 2), ("data", "model"), (12, 6), P("data", None)),
    ((4, 2), ("data", "model"), (12, 6), P(None, "model")),
    ((2, 2), ("a", "b"), (6, 4), P("b", "a")),
    ((8,), ("i",), (16,), P("i")),
    ((8,), ("i",), (6, 16), P(None, "i")),
    ((2, 2, 2), ("p", "q", "r"), (4, 8), P(("r", "p"), "q")),
]


@pytest.mark.parametrize("mesh_shape, names, shape, spec", CASES)
def test_sharded_array_blocks_are_jaxs_blocks(mesh_shape, names, shape, spec):
    fig = dg.sharded_array(spec, mesh_shape, names, shape, title="A",
                           show_mesh=len(mesh_shape) <= 2)
    sharding = NamedSharding(dg.mesh_for(mesh_shape, names), spec)
    held = _holders_from_jax(sharding, shape)
    blocks = _drawn_blocks(_panel(fig, "A"))
    covered = np.zeros(shape if len(shape) == 2 else (1,) + shape, int)
    for (x0, y0, x1, y1), (striped, labelled) in blocks.items():
        assert striped == labelled
        rows = slice(int(y0), int(y1))
        cols = slice(int(x0), int(x1))
        covered[rows, cols] += 1
        region = held[rows, cols] if len(shape) == 2 else held[cols]
        for ids in np.ravel(region):
            assert ids == striped, (spec, (x0, y0, x1, y1), ids, striped)
    assert (covered == 1).all()         # the blocks tile the array, no gap, no overlap


def test_a_named_sharding_and_an_array_draw_the_same_blocks():
    mesh = dg.mesh_for((2, 4), ("x", "y"))
    sharding = NamedSharding(mesh, P("y", "x"))
    a = jax.device_put(np.arange(8 * 16.0).reshape(8, 16), sharding)
    from_spec = _drawn_blocks(_panel(dg.sharded_array(P("y", "x"), title="A"), "A"))
    from_sharding = _drawn_blocks(_panel(dg.sharded_array(sharding, shape=(8, 16),
                                                          title="A"), "A"))
    from_array = _drawn_blocks(_panel(dg.sharded_array(a, shape=None, title="A"), "A"))
    assert from_spec == from_sharding == from_array
    # and the array's own shards agree with the holders drawn
    for s in a.addressable_shards:
        r, c = s.index
        (ids,) = [ids for (x0, y0, x1, y1), (ids, _) in from_array.items()
                  if (x0, y0) == (c.start or 0, r.start or 0)]
        assert s.device.id in ids


def test_arrays_of_different_shapes_each_get_their_own_blocks():
    mesh = dg.mesh_for((2, 4), ("x", "y"))
    arrays = {"In": jax.device_put(np.zeros((64, 32)), NamedSharding(mesh, P("x"))),
              "W_in": jax.device_put(np.zeros((32, 128)), NamedSharding(mesh, P("x", "y"))),
              "W_out": jax.device_put(np.zeros((128, 32)), NamedSharding(mesh, P("y", "x")))}
    fig = dg.sharded_arrays(arrays, shape=None)
    assert "each array" in dg.caption(fig)
    for name, a in arrays.items():
        held = _holders_from_jax(a.sharding, a.shape)
        blocks = _drawn_blocks(_panel(fig, f"{name} = {dg._spec_text(a.sharding.spec)}"))
        assert sum((x1 - x0) * (y1 - y0) for x0, y0, x1, y1 in blocks) == a.size
        for (x0, y0, x1, y1), (ids, _) in blocks.items():
            for h in held[int(y0):int(y1), int(x0):int(x1)].ravel():
                assert h == ids


def test_the_mesh_panel_places_each_device_where_the_mesh_has_it():
    fig = dg.sharded_array(P("a", "b"), (4, 2), ("a", "b"), (8, 8))
    ax = _panel(fig, "the devices on the mesh")
    mesh = dg.mesh_for((4, 2), ("a", "b"))
    for t in ax.texts:
        x, y = t.get_position()
        assert t.get_text() == f"d{mesh.devices[int(y), int(x)].id}"


@pytest.mark.parametrize("ids, text", [((0,), "d0"), ((4, 0), "d0, d4"),
                                       (range(8), "d0–d7"), ((0, 1, 2, 5), "d0–d2, d5"),
                                       ((0, 2, 4, 6), "d0, d2,\nd4, d6")])
def test_device_labels(ids, text):
    assert dg.device_label(ids) == text
    assert _parse_label(text) == set(ids)


# ------------------------------------------------------------------------------------------
# Collectives: the after-state is what JAX computes
# ------------------------------------------------------------------------------------------

BODIES = {
    "all-gather": lambda b, n: jax.lax.all_gather(b, "y", axis=0, tiled=True),
    "reduce-scatter": lambda b, n: jax.lax.psum_scatter(b, "y", scatter_dimension=0,
                                                        tiled=True),
    "all-reduce": lambda b, n: jax.lax.psum(b, "y"),
    "all-to-all": lambda b, n: jax.lax.all_to_all(b, "y", 0, 0, tiled=True),
    "collective-permute": lambda b, n: jax.lax.ppermute(b, "y", [(i, (i + 1) % n)
                                                                 for i in range(n)]),
}


def _cells(state, d):
    return [cell for cell in state[d] if cell is not None]


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("kind", dg.COLLECTIVE_KINDS)
def test_collective_after_state_is_what_the_collective_computes(kind, n):
    before, after = dg.collective_blocks(kind, n)
    rest = 8 // n
    mesh = dg.mesh_for((rest, n), ("x", "y"))
    k = len(_cells(before, 0))
    assert all(len(_cells(before, d)) == k for d in range(n))
    # device (x, d) holds its filled slots in order; a slot holding piece (s, c) is one-hot
    # at position s * n + c
    x = np.zeros((rest, n, k, n * n), np.float32)
    for d in range(n):
        for j, cell in enumerate(_cells(before, d)):
            for s, c in cell:
                x[:, d, j, s * n + c] = 1
    f = jax.jit(jax.shard_map(lambda b: BODIES[kind](b[0, 0], n)[None, None], mesh=mesh,
                              in_specs=P("x", "y"), out_specs=P("x", "y"),
                              check_vma=False))
    got = np.asarray(f(jax.device_put(x, NamedSharding(mesh, P("x", "y")))))
    assert set(np.unique(got)) <= {0.0, 1.0}       # every piece summed at most once
    for r in range(rest):
        for d in range(n):
            decoded = [frozenset((int(p) // n, int(p) % n) for p in np.flatnonzero(row))
                       for row in got[r, d]]
            assert decoded == _cells(after, d), (kind, n, d)


def test_the_collective_figure_draws_the_blocks():
    fig = dg.collective("all-to-all", 4)
    _, after = dg.collective_blocks("all-to-all", 4)
    ax = _panel(fig, "after")
    for t in ax.texts:
        x, y = t.get_position()
        cell = after[int(y)][int(x)]
        ((_, c),) = cell
        assert t.get_text() == f"A{c}"
        stripes = [p for p in ax.patches if p.get_fill() and p.get_x() == int(x)
                   and p.get_y() == int(y)]
        assert {COLOR_TO_DEVICE[_hex(p.get_facecolor())] for p in stripes} == {s for s, _ in cell}


# ------------------------------------------------------------------------------------------
# Rings
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("direction", [1, -1])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("kind", dg.RING_KINDS)
def test_the_ring_ends_in_the_collectives_result_and_sends_ring_bytes(kind, n, direction):
    states, sends = dg.ring_steps(kind, n, direction)
    before, after = dg.collective_blocks(kind, n)
    assert states[0] == before and states[-1] == after
    for s, moves in enumerate(sends):
        assert sorted((src, dst) for src, dst, _ in moves) == [(i, (i + direction) % n)
                                                                for i in range(n)]
        for src, _, cell in moves:
            (c,) = {ch for _, ch in cell}
            assert states[s][src][c] == cell        # a device sends what it holds
    array_bytes = 4096.0
    per_device = len(sends) * array_bytes / n       # one chunk of 1/n of the array a step
    assert per_device == pytest.approx(coll.ring_bytes(kind, array_bytes, n))


def test_the_ring_figure_labels_each_arrow_with_the_chunk_sent():
    fig = dg.ring(4, "reduce-scatter", step=2)
    _, sends = dg.ring_steps("reduce-scatter", 4)
    labels = sorted(t.get_text() for t in fig.axes[0].texts if "A" in t.get_text())
    assert labels == sorted(dg._chunk_label(cell) for _, _, cell in sends[2])
    assert fig.axes[0].get_title() == "step 3 of 3"


@pytest.mark.parametrize("n", [3, 4, 8])
@pytest.mark.parametrize("kind", dg.RING_KINDS)
def test_the_bidirectional_ring_is_the_torus_cost_model(kind, n):
    """Both half-rings end in the collective's result; a link carries half a chunk a step
    in each direction, which is collective_time's torus time (half the one-way ring's),
    in latency_steps(torus) steps."""
    (_, cw), (_, ccw) = dg.ring_steps(kind, n, 1), dg.ring_steps(kind, n, -1)
    after = dg.collective_blocks(kind, n)[1]
    assert dg.ring_steps(kind, n, 1)[0][-1] == dg.ring_steps(kind, n, -1)[0][-1] == after
    M, W = 8192.0, 1e9
    # bytes over the link i -> i + 1 (clockwise half-chunks only) and i -> i - 1
    for way, sends in ((1, cw), (-1, ccw)):
        per_link = {}
        for moves in sends:
            for src, dst, _ in moves:
                assert dst == (src + way) % n
                per_link[(src, dst)] = per_link.get((src, dst), 0) + M / n / 2
        assert max(per_link.values()) / W == pytest.approx(
            coll.collective_time(kind, M, n, bandwidth=W, topology="torus"))
        assert max(per_link.values()) / W == pytest.approx(
            coll.collective_time(kind, M, n, bandwidth=W, topology="ring") / 2)
    assert len(cw) == len(ccw) == coll.latency_steps(kind, n, "torus")
    step = 1
    fig = dg.ring(n, kind, step=step, bidirectional=True)
    ax = fig.axes[0]
    labels = sorted(t.get_text() for t in ax.texts if "A" in t.get_text())
    assert labels == sorted("½" + dg._chunk_label(cell) for _, _, cell in cw[step] + ccw[step])
    # the arrows join each device to both neighbours: read the devices at their ends
    where = {tuple(np.round(t.get_position(), 6)): int(t.get_text()[1:])
             for t in ax.texts if t.get_text().startswith("d")}
    arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
    ends = sorted((where[tuple(np.round(a._posA_posB[0], 6))],      # no public getter
                   where[tuple(np.round(a._posA_posB[1], 6))]) for a in arrows)
    assert ends == sorted([(i, (i + 1) % n) for i in range(n)]
                          + [(i, (i - 1) % n) for i in range(n)])


# ------------------------------------------------------------------------------------------
# Pipeline schedules
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sched", [par.pipeline_schedule(4, 8, "gpipe"),
                                   par.pipeline_schedule(3, 5, "1f1b"),
                                   par.simulate_schedule([[("F", 0), ("F", 1), ("B", 0),
                                                           ("B", 1)]] * 2)])
def test_the_pipeline_figure_shows_the_schedules_grid(sched):
    fig = dg.pipeline_schedule({"mine": sched})
    ax = fig.axes[0]
    drawn = {}
    for t in ax.texts:
        x, y = t.get_position()
        drawn[(int(y), int(x))] = int(t.get_text())
    colours = {(int(p.get_y()), int(p.get_x())): _hex(p.get_facecolor())
               for p in ax.patches}
    want = {(p, t): cell for p, row in enumerate(sched.grid) for t, cell in enumerate(row)
            if cell is not None}
    assert drawn == {k: cell[1] for k, cell in want.items()}
    assert colours == {k: dg.FORWARD_COLOR if cell[0] == "F" else dg.BACKWARD_COLOR
                       for k, cell in want.items()}
    assert f"bubble {sched.bubble_fraction:.0%}" in ax.get_title()


# ------------------------------------------------------------------------------------------
# Clear errors
# ------------------------------------------------------------------------------------------

def test_errors_are_clear():
    with pytest.raises(UnknownNameError, match="unknown collective 'all-scatter'; choose one "
                                               "of all-gather, reduce-scatter"):
        dg.collective("all-scatter")
    with pytest.raises(UnknownNameError, match="choose one of all-gather, reduce-scatter, "
                                               "all-reduce$"):
        dg.ring(4, "all-to-all")
    with pytest.raises(ValueError, match="names mesh axis 'z', but the mesh has axes 'x', 'y'"):
        dg.sharded_array(P("z", None))
    with pytest.raises(ValueError, match="dimension 1 of shape \\(8, 6\\) has size 6, which "
                                         "does not divide into 4 blocks"):
        dg.sharded_array(P(None, "y"), shape=(8, 6))
    with pytest.raises(ValueError, match="uses mesh axis 'x' for dimensions 0 and 1"):
        dg.sharded_array(P("x", "x"))
    with pytest.raises(ValueError, match="a 4 x 4 mesh needs 16 devices; there are 8"):
        dg.sharded_array(P("x", "y"), (4, 4))
    with pytest.raises(ValueError, match="one axis name"):
        dg.sharded_array(P("x"), (2, 4), ("x",))
    with pytest.raises(ValueError, match="draws 1-D or 2-D arrays; got shape \\(2, 4, 8\\)"):
        dg.sharded_array(P("x"), shape=(2, 4, 8))
    with pytest.raises(TypeError, match="spec must be a PartitionSpec"):
        dg.sharded_array("x")
    with pytest.raises(ValueError, match="n must be an integer of at least 2"):
        dg.collective("all-gather", 1)
    with pytest.raises(ValueError, match="step must be an integer of at least 0 and at most 2"):
        dg.ring(4, "all-gather", step=3)
    with pytest.raises(ValueError, match="bidirectional needs n >= 3"):
        dg.ring(2, "all-gather", bidirectional=True)
    with pytest.raises(ValueError, match="direction must be 1"):
        dg.ring(4, "all-gather", direction=2)
    with pytest.raises(TypeError, match="draws scalebook.parallelism.Schedule objects"):
        dg.pipeline_schedule([[("F", 0)]])
    assert dg.collective_blocks("ppermute", 3) == dg.collective_blocks("collective-permute", 3)


# ------------------------------------------------------------------------------------------
# The column: width, text size, caption
# ------------------------------------------------------------------------------------------

FIGURES = {
    "sharded_arrays": lambda: dg.sharded_arrays([P(), P("x", "y"), P(("x", "y"), None)]),
    "sharded_array 1-D": lambda: dg.sharded_array(P("i"), (8,), ("i",), (16,)),
    "collectives": lambda: dg.collectives(),
    "collective n=8": lambda: dg.collective("reduce-scatter", 8),
    "ring": lambda: dg.ring(4, "all-reduce"),
    "ring n=8 step": lambda: dg.ring(8, "all-gather", step=0),
    "ring backwards": lambda: dg.ring(4, "all-gather", direction=-1),
    "ring both ways": lambda: dg.ring(4, "all-reduce", bidirectional=True),
    "ring both ways n=8": lambda: dg.ring(8, "all-gather", step=0, bidirectional=True),
    "pipeline": lambda: dg.pipeline_schedule([par.pipeline_schedule(4, 8, k)
                                              for k in par.SCHEDULES]),
    "pipeline long": lambda: dg.pipeline_schedule(par.pipeline_schedule(8, 32, "1f1b")),
}


@pytest.mark.parametrize("name", FIGURES)
def test_figures_fit_the_column_with_readable_text_and_a_caption(name):
    fig = FIGURES[name]()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()                        # lays the figure out and makes its tick labels
    assert fig.get_figwidth() <= dg.MAX_WIDTH
    hidden = set()                       # labels of ticks outside the axes: not drawn
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            hidden |= {id(lab) for tick in axis.get_major_ticks()
                       if not ax.axison or not lo - 1e-9 <= tick.get_loc() <= hi + 1e-9
                       for lab in (tick.label1, tick.label2)}
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
             and id(t) not in hidden]
    assert texts
    small = [(t.get_text(), t.get_fontsize()) for t in texts
             if t.get_fontsize() < dg.MIN_FONT]
    assert not small, small
    # nothing drawn outside the figure (a label cut off at the edge)
    renderer = canvas.get_renderer()
    w, h = fig.bbox.width, fig.bbox.height
    for t in texts:
        box = t.get_window_extent(renderer)
        assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= w + 1 and box.y1 <= h + 1, \
            (t.get_text(), box, w, h)
    text = dg.caption(fig)
    assert text[0].isupper() and text.endswith(".") and len(text) > 60
    assert describe_figure(fig) == text


def test_a_figure_wider_than_the_column_is_refused():
    # the notebook crops a figure to its drawing plus 0.1 in each side: that must fit 7 in
    from scalebook.plots import MAX_WIDTH_IN
    assert dg.MAX_WIDTH + 0.2 <= MAX_WIDTH_IN
    with pytest.raises(ValueError, match=f"at most {dg.MAX_WIDTH} in wide"):
        dg._figure(dg.MAX_WIDTH + 0.2, 3)


def test_setup_devices_are_used():
    assert [d.id for d in dg.mesh_for((8,), ("i",)).devices] == \
        [d.id for d in scalebook.mesh.devices()]
