"""Tests of scalebook.comms: the collective parser against programs JAX really compiles on the
8-device CPU mesh, against hand-written HLO for each replica-group syntax, and the cost
formulas against independent derivations (including a hop-by-hop routing simulation)."""

import math

import numpy as np
import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType, Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from scalebook import collectives, hlo, units  # noqa: E402
from scalebook.hardware import get_chip  # noqa: E402

MESH = scalebook.make_mesh((2, 4), ("x", "y"))
X, Y = 2, 4


def sds(shape, spec=None, dtype=jnp.float32, mesh=MESH):
    sharding = None if spec is None else NamedSharding(mesh, spec)
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def smap(f, in_specs, out_specs, mesh=MESH):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def only(records, kind):
    found = [r for r in records if r.kind == kind]
    assert len(found) == 1, f"expected one {kind}, found {[r.kind for r in records]}"
    return found[0]


ROWS_Y = ((0, 1, 2, 3), (4, 5, 6, 7))          # groups along y of the 2x4 mesh
COLS_X = ((0, 4), (1, 5), (2, 6), (3, 7))      # groups along x


# ------------------------------------------------------------------------------------------
# Real programs: each kind via shard_map, two shapes each; bytes from the textbook formula
# computed here from the global shape (not from the parser's output).
# ------------------------------------------------------------------------------------------

SHAPES = [(8, 16), (16, 64)]


@pytest.mark.parametrize("shape", SHAPES)
def test_all_gather_from_shard_map(shape):
    M, N = shape
    f = smap(lambda a: jax.lax.all_gather(a, "y", axis=1, tiled=True, to="invarying"),
             P("x", "y"), P("x", None))
    r = only(hlo.collectives(f.lower(sds(shape)).compile()), "all-gather")
    out_bytes = (M // X) * N * 4                       # each device ends with [M/2, N] f32
    assert (r.group_size, r.groups, r.dtype, r.count) == (Y, ROWS_Y, "f32", 1)
    assert r.bytes_per_device == pytest.approx((Y - 1) / Y * out_bytes)
    assert r.result_shapes == (f"f32[{M // X},{N}]",)


@pytest.mark.parametrize("shape", SHAPES)
def test_reduce_scatter_from_psum_scatter(shape):
    M, N = shape
    f = smap(lambda a: jax.lax.psum_scatter(a, "y", scatter_dimension=1, tiled=True),
             P("x", None), P("x", "y"))
    r = only(hlo.collectives(f.lower(sds(shape)).compile()), "reduce-scatter")
    in_bytes = (M // X) * N * 4
    assert (r.group_size, r.groups, r.rs_like) == (Y, ROWS_Y, False)
    assert r.bytes_per_device == pytest.approx((Y - 1) / Y * in_bytes)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("axes,groups", [("y", ROWS_Y), ("x", COLS_X), (("x", "y"), (tuple(range(8)),))])
def test_all_reduce_groups_and_bytes(shape, axes, groups):
    M, N = shape
    f = smap(lambda a: jax.lax.psum(a, axes), P("x", "y"), P("x", "y"))
    r = only(hlo.collectives(f.lower(sds(shape)).compile()), "all-reduce")
    n = len(groups[0])
    block = (M // X) * (N // Y) * 4
    assert r.groups == groups and r.group_size == n
    assert r.bytes_per_device == pytest.approx(2 * (n - 1) / n * block)


@pytest.mark.parametrize("shape", SHAPES)
def test_all_to_all_tuple_form(shape):
    M, N = shape
    f = smap(lambda a: jax.lax.all_to_all(a, "y", 0, 1, tiled=True), P("x", "y"), P("x", "y"))
    r = only(hlo.collectives(f.lower(sds(shape)).compile()), "all-to-all")
    block = (M // X) * (N // Y) * 4
    assert r.group_size == Y and len(r.operand_shapes) == Y      # one operand per peer
    assert r.bytes_per_device == pytest.approx((Y - 1) / Y * block)


@pytest.mark.parametrize("shape", SHAPES)
def test_collective_permute_ring_shift(shape):
    M, N = shape
    perm = [(i, (i + 1) % Y) for i in range(Y)]
    f = smap(lambda a: jax.lax.ppermute(a, "y", perm), P("x", "y"), P("x", "y"))
    r = only(hlo.collectives(f.lower(sds(shape)).compile()), "collective-permute")
    assert r.bytes_per_device == (M // X) * (N // Y) * 4
    assert set(r.groups) == {(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4)}
    assert r.group_size == 8


def test_shard_map_collectives_compute_the_right_numbers():
    a = jnp.arange(8 * 16, dtype=jnp.float32).reshape(8, 16)
    ag = smap(lambda b: jax.lax.all_gather(b, "y", axis=1, tiled=True, to="invarying"),
              P("x", "y"), P("x", None))(a)
    np.testing.assert_array_equal(ag, a)
    rs = smap(lambda b: jax.lax.psum_scatter(b, "y", scatter_dimension=1, tiled=True),
              P("x", None), P("x", "y"))(a)
    np.testing.assert_array_equal(rs, Y * a)       # every y-device held the same a


# ------------------------------------------------------------------------------------------
# Where XLA:CPU differs from a TPU: asserted, so the chapter's claims stay true.
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,K,N", [(8, 16, 32), (16, 32, 64)])
def test_cpu_compiles_reduce_scatter_sharding_as_all_reduce_plus_slice(M, K, N):
    f = jax.jit(lambda a, b: a @ b, out_shardings=NamedSharding(MESH, P("x", "y")))
    recs = hlo.collectives(f.lower(sds((M, K), P("x", "y")), sds((K, N), P("y", None))).compile())
    assert [r.kind for r in recs] == ["all-reduce"]
    r = recs[0]
    partial = (M // X) * N * 4                     # each device's partial sum C[M/2, N]
    assert r.rs_like and r.group_size == Y
    assert r.bytes_per_device == pytest.approx(2 * (Y - 1) / Y * partial)
    assert r.reduce_scatter_bytes == pytest.approx((Y - 1) / Y * partial)   # half


def test_plain_all_reduce_is_not_rs_like():
    f = jax.jit(lambda a, b: a @ b, out_shardings=NamedSharding(MESH, P("x", None)))
    r = only(hlo.collectives(f.lower(sds((8, 16), P("x", "y")), sds((16, 32), P("y", None))).compile()),
             "all-reduce")
    assert not r.rs_like and r.reduce_scatter_bytes is None
    assert r.groups == ROWS_Y                        # printed as [2,4]<=[8]


@pytest.mark.parametrize("shape", SHAPES)
def test_cpu_moves_bf16_all_gather_in_f32(shape):
    M, N = shape
    f = smap(lambda a: jax.lax.all_gather(a, "y", axis=1, tiled=True, to="invarying"),
             P("x", "y"), P("x", None))
    r = only(hlo.collectives(f.lower(sds(shape, dtype=jnp.bfloat16)).compile()), "all-gather")
    bf16_formula = (Y - 1) / Y * (M // X) * N * 2
    assert r.dtype == "f32"
    assert r.bytes_per_device == pytest.approx(2 * bf16_formula)


@pytest.mark.parametrize("trips", [3, 7])
def test_scan_trip_count_multiplies(trips):
    def body(c, w):
        return jax.lax.psum(c @ w, "y"), None
    f = smap(lambda a, ws: jax.lax.scan(body, a, ws)[0], (P("x", None), P()), P("x", None))
    recs = hlo.collectives(f.lower(sds((8, 16)), sds((trips, 16, 16))).compile())
    r = only(recs, "all-reduce")
    assert r.count == trips
    assert hlo.total_bytes(recs) == pytest.approx(trips * 2 * (Y - 1) / Y * (8 // X) * 16 * 4)


def test_groups_are_partition_ids_of_a_permuted_mesh():
    devs = np.array(jax.devices())[[0, 2, 4, 6, 1, 3, 5, 7]].reshape(2, 4)
    mesh = Mesh(devs, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    f = smap(lambda a: jax.lax.psum(a, "x"), P("x", "y"), P(None, "y"), mesh=mesh)
    r = only(hlo.collectives(f.lower(sds((8, 16), mesh=mesh)).compile()), "all-reduce")
    # HLO numbers devices by their position in the mesh (partition id), not by device.id
    assert r.groups == tuple(map(tuple, np.arange(8).reshape(2, 4).T))


def test_three_axis_mesh_group_order():
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("a", "b", "c"),
                axis_types=(AxisType.Auto,) * 3)
    f = smap(lambda v: jax.lax.psum(v, ("c", "a")), P(("a", "b", "c")), P("b"), mesh=mesh)
    r = only(hlo.collectives(f.lower(sds((8, 16), mesh=mesh)).compile()), "all-reduce")
    want = np.arange(8).reshape(2, 2, 2).transpose(1, 2, 0).reshape(2, 4)   # b outer; c, a inner
    assert r.groups == tuple(map(tuple, want))


def test_reshard_permute_with_self_pairs_counts_only_real_senders():
    f = jax.jit(lambda a: a, out_shardings=NamedSharding(MESH, P("y", None)))
    recs = hlo.collectives(f.lower(sds((8, 16), P("x", None))).compile())
    r = only(recs, "collective-permute")
    senders = {s for s, t in r.groups if s != t}
    assert r.group_size == len(senders) < 8
    assert r.bytes_per_device == 2 * 16 * 4


def test_hlo_text_strips_file_paths():
    f = jax.jit(lambda a: a * 2)
    c = f.lower(sds((8,))).compile()
    assert __file__ in c.as_text()                 # the raw text holds this file's path
    assert __file__ not in hlo.hlo_text(c)
    assert "FileNames" not in hlo.hlo_text(c)
    assert hlo.collectives(c) == []


# ------------------------------------------------------------------------------------------
# Hand-written HLO: every replica-group syntax, tuples, async pairs, loops
# ------------------------------------------------------------------------------------------

def module(body, extra_comps="", partitions=8):
    return (f"HloModule m, num_partitions={partitions}\n\n%add (a: f32[], b: f32[]) -> f32[] {{\n"
            "  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n"
            "  ROOT %s = f32[] add(%a, %b)\n}\n\n" + extra_comps +
            "ENTRY %main (p: f32[4,16]) -> f32[4,16] {\n  %p = f32[4,16]{1,0} parameter(0)\n"
            + body + "\n}\n")


@pytest.mark.parametrize("groups_text,want", [
    ("{{0,1,2,3},{4,5,6,7}}", ROWS_Y),
    ("{{0,4},{1,5},{2,6},{3,7}}", COLS_X),
    ("[2,4]<=[8]", ROWS_Y),
    ("[4,2]<=[2,4]T(1,0)", COLS_X),
    ("[1,8]<=[8]", (tuple(range(8)),)),
    ("{}", (tuple(range(8)),)),
    ("mesh['axis_0'=2,'axis_1'=4] {'axis_1'}", ROWS_Y),
    ("mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", COLS_X),
    ("mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}", (tuple(range(8)),)),
    ("mesh['axis_0'=2,'axis_1'=4] {'axis_1','axis_0'}", ((0, 4, 1, 5, 2, 6, 3, 7),)),
    ("mesh['a'=8] {'a':(1)2}", COLS_X),
    ("mesh['a'=8] {'a':(4)2}", ((0, 1), (2, 3), (4, 5), (6, 7))),
    ("mesh['a'=8] {'a':(2)2}", ((0, 2), (1, 3), (4, 6), (5, 7))),
    ("mesh['x'=2,'y'=4], device_ids=([2,4]T(1,0)) {'y'}", ((0, 4, 1, 5), (2, 6, 3, 7))),
    ("mesh['x'=2,'y'=4], device_ids=(7,6,5,4,3,2,1,0) {'y'}", ((7, 6, 5, 4), (3, 2, 1, 0))),
])
def test_replica_group_syntaxes_in_an_all_reduce(groups_text, want):
    text = module(f"  ROOT %ar = f32[4,16]{{1,0}} all-reduce(%p), channel_id=1, "
                 f"replica_groups={groups_text}, use_global_device_ids=true, to_apply=%add")
    r = only(hlo.collectives(text), "all-reduce")
    assert r.groups == want
    n = len(want[0])
    assert r.bytes_per_device == pytest.approx(2 * (n - 1) / n * 4 * 16 * 4)


def test_device_ids_with_sub_axis():
    # device order arange(8).reshape(2,2,2).transpose(0,2,1) = [0,2,1,3,4,6,5,7] on a 4x2
    # mesh; axis_0 (size 4) cut into (1)2 x (2)2, the group runs along the minor half.
    g = hlo.parse_replica_groups(
        "mesh['axis_0'=4,'axis_1'=2], device_ids=([2,2,2]T(0,2,1)) {'axis_0':(2)2}")
    ids = np.arange(8).reshape(2, 2, 2).transpose(0, 2, 1).reshape(2, 2, 2)   # axis_0 split
    want = tuple(tuple(int(v) for v in ids[i, :, k]) for i in range(2) for k in range(2))
    assert g == want


def test_combined_tuple_all_reduce_adds_operands():
    text = module("  %q = f32[8]{0} constant({1,2,3,4,5,6,7,8})\n"
                 "  %ar = (f32[4,16]{1,0}, f32[8]{0}) all-reduce(%p, %q), channel_id=1, "
                 "replica_groups=[2,4]<=[8], use_global_device_ids=true, to_apply=%add\n"
                 "  ROOT %g = f32[4,16]{1,0} get-tuple-element(%ar), index=0")
    r = only(hlo.collectives(text), "all-reduce")
    assert r.operand_shapes == ("f32[4,16]", "f32[8]")
    assert r.bytes_per_device == pytest.approx(2 * 3 / 4 * (4 * 16 * 4 + 8 * 4))


def test_async_all_gather_start_done_counted_once():
    text = module("  %ags = (f32[4,16]{1,0}, f32[4,64]{1,0}) all-gather-start(%p), channel_id=1, "
                 "replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={1}, use_global_device_ids=true\n"
                 "  %agd = f32[4,64]{1,0} all-gather-done(%ags)\n"
                 "  ROOT %s = f32[4,16]{1,0} slice(%agd), slice={[0:4], [0:16]}")
    recs = hlo.collectives(text)
    assert len(recs) == 1 and recs[0].is_async
    assert recs[0].result_shapes == ("f32[4,64]",)
    assert recs[0].bytes_per_device == pytest.approx(3 / 4 * 4 * 64 * 4)


def test_async_all_reduce_rs_like_through_done():
    text = module("  %ars = f32[4,16]{1,0} all-reduce-start(%p), channel_id=1, "
                 "replica_groups=[2,4]<=[8], to_apply=%add\n"
                 "  %ard = f32[4,16]{1,0} all-reduce-done(%ars)\n"
                 "  %pid = u32[] partition-id()\n  %z = u32[] constant(0)\n"
                 "  ROOT %ds = f32[4,4]{1,0} dynamic-slice(%ard, %z, %pid), dynamic_slice_sizes={4,4}")
    r = only(hlo.collectives(text), "all-reduce")
    assert r.rs_like and r.is_async


@pytest.mark.parametrize("kept_cols,rs_like", [(4, True), (8, False), (16, False), (2, False)])
def test_rs_like_needs_exactly_one_nth_kept(kept_cols, rs_like):
    """Groups of 4: keeping 4 of 16 columns is a reduce-scatter; keeping 8 (a half) or 2
    (an eighth) is some other slice and must not be counted as one."""
    text = module("  %ar = f32[4,16]{1,0} all-reduce(%p), channel_id=1, "
                  "replica_groups=[2,4]<=[8], to_apply=%add\n"
                  "  %pid = u32[] partition-id()\n  %z = u32[] constant(0)\n"
                  f"  ROOT %ds = f32[4,{kept_cols}]{{1,0}} dynamic-slice(%ar, %z, %pid), "
                  f"dynamic_slice_sizes={{4,{kept_cols}}}")
    assert only(hlo.collectives(text), "all-reduce").rs_like is rs_like


def test_all_to_all_array_form_and_reduce_scatter_text():
    text = module("  %a2a = f32[4,16]{1,0} all-to-all(%p), channel_id=1, replica_groups=[2,4]<=[8], "
                 "dimensions={1}\n"
                 "  ROOT %rs = f32[4,4]{1,0} reduce-scatter(%a2a), channel_id=2, "
                 "replica_groups=[2,4]<=[8], dimensions={1}, to_apply=%add")
    a2a, rs = hlo.collectives(text)
    assert (a2a.kind, rs.kind) == ("all-to-all", "reduce-scatter")
    assert a2a.bytes_per_device == pytest.approx(3 / 4 * 256)
    assert rs.bytes_per_device == pytest.approx(3 / 4 * 256)


def test_permute_of_only_self_pairs_moves_nothing():
    text = module("  ROOT %cp = f32[4,16]{1,0} collective-permute(%p), channel_id=1, "
                 "source_target_pairs={{0,0},{1,1}}")
    r = only(hlo.collectives(text), "collective-permute")
    assert r.bytes_per_device == 0 and r.group_size == 0


NESTED = """%inner_body (t: (s32[], f32[4,16])) -> (s32[], f32[4,16]) {
  %t = (s32[], f32[4,16]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[4,16]{1,0} get-tuple-element(%t), index=1
  %ar = f32[4,16]{1,0} all-reduce(%x), channel_id=1, replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%add
  ROOT %r = (s32[], f32[4,16]{1,0}) tuple(%i, %ar)
}

%inner_cond (t: (s32[], f32[4,16])) -> pred[] {
  %t.1 = (s32[], f32[4,16]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

%outer_body (u: (s32[], f32[4,16])) -> (s32[], f32[4,16]) {
  %u = (s32[], f32[4,16]{1,0}) parameter(0)
  %w = (s32[], f32[4,16]{1,0}) while(%u), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  %y = f32[4,16]{1,0} get-tuple-element(%w), index=1
  %ag = f32[4,64]{1,0} all-gather(%y), channel_id=2, replica_groups=[2,4]<=[8], dimensions={1}
  ROOT %v = (s32[], f32[4,16]{1,0}) tuple(%i.9, %y)
}

"""


def test_nested_loops_multiply_trip_counts():
    text = module("  %z = s32[] constant(0)\n  %tt = (s32[], f32[4,16]{1,0}) tuple(%z, %p)\n"
                 "  %wo = (s32[], f32[4,16]{1,0}) while(%tt), condition=%inner_cond, body=%outer_body, "
                 "backend_config={\"known_trip_count\":{\"n\":\"5\"}}\n"
                 "  ROOT %o = f32[4,16]{1,0} get-tuple-element(%wo), index=1",
                 extra_comps=NESTED.replace("%i.9", "%i.9").replace(
                     "  ROOT %v", "  %i.9 = s32[] get-tuple-element(%u), index=0\n  ROOT %v"))
    recs = hlo.collectives(text)
    ar, ag = only(recs, "all-reduce"), only(recs, "all-gather")
    assert ar.count == 15 and ag.count == 5
    assert ar.groups == COLS_X
    assert hlo.total_bytes(recs, "all-reduce") == pytest.approx(15 * 2 * 1 / 2 * 256)
    assert hlo.total_bytes(recs) == pytest.approx(15 * 256 + 5 * 3 / 4 * 1024)


def test_loop_without_known_trip_count_counts_once():
    text = module("  %z = s32[] constant(0)\n  %tt = (s32[], f32[4,16]{1,0}) tuple(%z, %p)\n"
                 "  %wo = (s32[], f32[4,16]{1,0}) while(%tt), condition=%inner_cond, body=%inner_body\n"
                 "  ROOT %o = f32[4,16]{1,0} get-tuple-element(%wo), index=1", extra_comps=NESTED.split("%outer_body")[0])
    assert only(hlo.collectives(text), "all-reduce").count == 1


# ------------------------------------------------------------------------------------------
# Bad input
# ------------------------------------------------------------------------------------------

def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="does not look like HLO"):
        hlo.collectives("hello world")
    with pytest.raises(TypeError, match="compiled must be"):
        hlo.collectives(42)
    f = jax.jit(lambda a: a + 1)
    with pytest.raises(TypeError, match=r"\.compile\(\)"):
        hlo.collectives(f.lower(sds((4,))))
    with pytest.raises(TypeError, match="got a function"):
        hlo.collectives(f)
    with pytest.raises(ValueError, match="not defined"):
        hlo.collectives("%ar = f32[4] all-reduce(%nowhere), replica_groups={{0,1}}, to_apply=%add")
    with pytest.raises(ValueError, match="replica groups"):
        hlo.parse_replica_groups("[[0,1]]")
    with pytest.raises(ValueError, match="num_devices"):
        hlo.parse_replica_groups("{}")
    with pytest.raises(ValueError, match="not in the mesh"):
        hlo.parse_replica_groups("mesh['a'=2] {'b'}")


# ------------------------------------------------------------------------------------------
# Cost formulas
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4, 16])
def test_ring_bytes_formulas(n):
    V = 1e6
    assert collectives.ring_bytes("all-gather", V, n) == pytest.approx(V - V / n)
    assert collectives.ring_bytes("reduce-scatter", V, n) == pytest.approx(V - V / n)
    # an all-reduce is a reduce-scatter then an all-gather of the same array
    assert collectives.ring_bytes("all-reduce", V, n) == pytest.approx(
        collectives.ring_bytes("reduce-scatter", V, n) + collectives.ring_bytes("all-gather", V, n))
    assert collectives.ring_bytes("collective-permute", V, n) == V


@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-v5p"])
@pytest.mark.parametrize("n", [4, 16])
def test_collective_time_ring_and_torus(chip, n):
    W = get_chip(chip).ici_link_bandwidth
    V = 3e8
    t_ring = collectives.collective_time("all-gather", V, n, chip, topology="ring")
    t_torus = collectives.collective_time("all-gather", V, n, chip, topology="torus")
    assert t_ring == pytest.approx((n - 1) / n * V / W)
    assert t_torus == pytest.approx(t_ring / 2)
    assert collectives.collective_time("all-reduce", V, n, chip) == pytest.approx(2 * t_torus)
    assert collectives.collective_time("collective-permute", V, n, chip) == pytest.approx(V / W)
    # two axes of n: twice the links for n*n devices
    assert collectives.collective_time("all-gather", V, (n, n), chip) == pytest.approx(
        (n * n - 1) / (n * n) * V / (4 * W))
    assert collectives.collective_time("all-gather", V, n, bandwidth=W) == t_torus


def _simulated_all_to_all_max_link_load(n, V, torus):
    """Route every block hop by hop and return the busiest directed link's bytes."""
    load = {}
    block = V / n
    for src in range(n):
        for d in range(1, n):
            if torus and d > n - d:
                steps, paths = n - d, [(-1, 1.0)]
            elif torus and d == n - d:
                steps, paths = d, [(1, 0.5), (-1, 0.5)]
            else:
                steps, paths = d, [(1, 1.0)]
            for direction, share in paths:
                node = src
                for _ in range(steps):
                    # A link joins two chips: on an axis of 2 both "directions" are one link.
                    link = (node, (node + direction) % n)
                    load[link] = load.get(link, 0) + block * share
                    node = (node + direction) % n
    return max(load.values())


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("topology", ["ring", "torus"])
def test_all_to_all_time_matches_routing_simulation(n, topology):
    V, W = 1e6, 1e9
    want = _simulated_all_to_all_max_link_load(n, V, topology == "torus") / W
    assert collectives.collective_time("all-to-all", V, n, bandwidth=W, topology=topology) == pytest.approx(want)


def test_cost_formula_bad_inputs():
    with pytest.raises(ValueError, match="kind"):
        collectives.ring_bytes("all-gathr", 1.0, 4)
    with pytest.raises(ValueError, match="nbytes"):
        collectives.ring_bytes("all-gather", -1.0, 4)
    with pytest.raises(ValueError, match="devices in the group"):
        collectives.ring_bytes("all-gather", 1.0, 0)
    with pytest.raises(ValueError, match="topology"):
        collectives.collective_time("all-gather", 1.0, 4, "tpu-v5e", topology="mesh")
    with pytest.raises(ValueError, match="chip"):
        collectives.collective_time("all-gather", 1.0, 4)
    with pytest.raises(ValueError, match="bandwidth"):
        collectives.collective_time("all-gather", 1.0, 4, bandwidth=0)
    with pytest.raises(KeyError, match="known chips"):
        collectives.collective_time("all-gather", 1.0, 4, "tpu-v9")
    with pytest.raises(ValueError, match="dtype"):
        units.dtype_bytes("f31")
    assert units.dtype_bytes(jnp.bfloat16) == 2 and units.dtype_bytes("f32") == 4


# ------------------------------------------------------------------------------------------
# collective-permute pairs and their hops along a mesh axis (exercise 10.7's neighbour check)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shift,hops", [(1, (1,)), (-1, (-1,)), (2, (2,)), (3, (-1,))])
def test_permute_hops_along_y_from_a_compiled_ring_shift(shift, hops):
    perm = [(i, (i + shift) % Y) for i in range(Y)]
    f = smap(lambda a: jax.lax.ppermute(a, "y", perm), P("x", "y"), P("x", "y"))
    r = only(hlo.collectives(f.lower(sds((8, 16))).compile()), "collective-permute")
    assert r.source_target_pairs == r.groups and len(r.source_target_pairs) == 8
    assert r.hops((X, Y), 1) == hops
    assert r.hops((X, Y), 0) is None            # the sends run along y, not along x


def test_permute_hops_along_x_and_across_both_axes():
    f = smap(lambda a: jax.lax.ppermute(a, "x", [(0, 1), (1, 0)]), P("x", "y"), P("x", "y"))
    r = only(hlo.collectives(f.lower(sds((8, 16))).compile()), "collective-permute")
    assert r.hops((X, Y), 0) == (1,)            # an axis of 2: both directions are one hop
    assert r.hops((X, Y), 1) is None
    text = module("  ROOT %cp = f32[4,16]{1,0} collective-permute(%p), channel_id=1, "
                  "source_target_pairs={{0,5},{5,0},{2,2}}")
    r = only(hlo.collectives(text), "collective-permute")
    assert r.source_target_pairs == ((0, 5), (5, 0), (2, 2))
    assert r.hops((2, 4), 1) is None and r.hops((2, 4), 0) is None
    assert r.hops((8,), 0) == (-3, 3)           # on a ring of 8: 0 -> 5 is 3 hops back


def test_permute_hops_bad_inputs():
    text = module("  ROOT %cp = f32[4,16]{1,0} collective-permute(%p), channel_id=1, "
                  "source_target_pairs={{0,1},{1,0}}")
    r = only(hlo.collectives(text), "collective-permute")
    with pytest.raises(ValueError, match="mesh dimension"):
        r.hops((2, 4), 2)
    with pytest.raises(ValueError, match="positive axis sizes"):
        r.hops((), 0)
    with pytest.raises(ValueError, match="outside a mesh"):
        r.hops((1,), 0)
    ar = only(hlo.collectives(module("  ROOT %ar = f32[4,16]{1,0} all-reduce(%p), "
                                     "channel_id=1, replica_groups={{0,1,2,3},{4,5,6,7}}, "
                                     "to_apply=%add")), "all-reduce")
    assert ar.source_target_pairs == ()
    with pytest.raises(ValueError, match="collective-permute"):
        ar.hops((2, 4), 1)
