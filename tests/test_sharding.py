"""scalebook.sharding: checked shardings, collectives of lowered programs, the collective
matmul and the LLaMA-3 layer in three modes, on the 8-device CPU mesh."""

import math

import numpy as np
import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AbstractMesh, AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from scalebook import hlo, sharding as sh  # noqa: E402
from scalebook.hardware import get_chip  # noqa: E402
from scalebook.models import TransformerConfig, get_model  # noqa: E402

MESH = scalebook.make_mesh((2, 4), ("x", "y"))
TINY = TransformerConfig("tiny", n_layers=1, d_model=32, n_heads=8, n_kv_heads=4, head_dim=8,
                         d_ff=64, vocab_size=128)


# named_sharding / shard_shape ------------------------------------------------------------
def test_named_sharding_is_a_named_sharding():
    s = sh.named_sharding(MESH, P("x", "y"), (8, 16))
    assert isinstance(s, NamedSharding) and s.spec == P("x", "y")
    assert sh.named_sharding(MESH, ("x", None)).spec == P("x", None)


@pytest.mark.parametrize("spec,shape,words", [
    (P("z", None), (8, 16), ["'z'", "'x', 'y'"]),
    (P("x", "x"), (8, 16), ["'x'", "only one dimension"]),
    (P("y", None), (6, 16), ["size 6", "4 blocks", "y=4"]),
    (P(("x", "y"), None), (12, 16), ["8 blocks", "x=2 x y=4"]),
    (P("x", None, None), (8, 16), ["3 entries", "2 dimensions"]),
])
def test_named_sharding_errors_name_the_problem(spec, shape, words):
    with pytest.raises(ValueError) as e:
        sh.named_sharding(MESH, spec, shape)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_bad_types_are_refused():
    with pytest.raises(TypeError, match="PartitionSpec"):
        sh.named_sharding(MESH, "x")
    with pytest.raises(TypeError, match="Mesh"):
        sh.named_sharding("mesh", P("x"))
    with pytest.raises(TypeError, match="entry 0"):
        sh.shard_shape((8,), (3,), MESH)


def test_shard_shape_matches_jax_and_works_on_abstract_meshes():
    for spec in [P(), P("x", None), P(None, "y"), P("y", "x"), P(("x", "y"), None)]:
        assert sh.shard_shape((8, 16), spec, MESH) == NamedSharding(MESH, spec).shard_shape((8, 16))
    am = AbstractMesh((16, 8), ("data", "model"))
    assert sh.shard_shape((8192, 28672), P("data", "model"), am) == (512, 3584)


# lowered_collectives ---------------------------------------------------------------------
def _all_five(a):
    g = jax.lax.all_gather(a, "y", axis=1, tiled=True)               # [4, 16]
    r = jax.lax.psum(g, "x")                                         # [4, 16]
    s = jax.lax.psum_scatter(r, "y", scatter_dimension=1, tiled=True)   # [4, 4]
    t = jax.lax.all_to_all(s, "y", 0, 1, tiled=True)                 # [1, 16]
    return jax.lax.ppermute(t, "x", [(0, 1), (1, 0)])


def test_lowered_collectives_agree_with_the_compiled_program():
    f = jax.jit(jax.shard_map(_all_five, mesh=MESH, in_specs=P("x", "y"),
                              out_specs=P(("x", "y"), None), check_vma=False))
    a = jnp.ones((8, 16), jnp.float32)
    lowered = f.lower(a)
    low, comp = sh.lowered_collectives(lowered), hlo.collectives(lowered.compile())
    assert [r.kind for r in low] == ["all-gather", "all-reduce", "reduce-scatter", "all-to-all",
                                     "collective-permute"]
    by_kind = {r.kind: r for r in comp}
    for r in low:
        c = by_kind[r.kind]
        assert r.group_size == c.group_size, r.kind
        assert math.isclose(r.bytes_per_device, c.bytes_per_device), r.kind
        if r.kind != "collective-permute":
            assert sorted(r.groups) == sorted(c.groups), r.kind
    # hand-worked bytes: all-gather output [4,16] f32 over 4 -> 3/4 * 256
    assert low[0].bytes_per_device == 3 / 4 * 4 * 16 * 4
    assert low[0].groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert low[1].groups == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_lowered_collectives_on_an_abstract_mesh_of_real_size():
    am = AbstractMesh((16, 8), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    w = jax.ShapeDtypeStruct((8192, 28672), jnp.bfloat16,
                             sharding=NamedSharding(am, P("data", "model")))
    f = jax.jit(jax.shard_map(lambda w: jax.lax.all_gather(w, "data", tiled=True, to="invarying"),
                              mesh=am,
                              in_specs=P("data", "model"), out_specs=P(None, "model")))
    (r,) = sh.lowered_collectives(f.trace(w).lower(lowering_platforms=("cpu",)))
    assert r.kind == "all-gather" and r.group_size == 16 and r.dtype == "bf16"
    assert r.result_shapes == ("bf16[8192,3584]",)
    assert r.bytes_per_device == 15 / 16 * 8192 * 3584 * 2


def test_lowered_collectives_refuses_other_things():
    with pytest.raises(TypeError, match="Lowered"):
        sh.lowered_collectives(3)
    with pytest.raises(ValueError, match="StableHLO"):
        sh.lowered_collectives("hello")
    c = jax.jit(lambda a: a + 1).lower(jnp.ones(4)).compile()
    with pytest.raises(TypeError, match="hlo.collectives"):
        sh.lowered_collectives(c)


# collective matmul -----------------------------------------------------------------------
@pytest.mark.parametrize("B,D,F", [(8, 16, 32), (16, 32, 8)])
def test_collective_matmul_equals_plain_and_uses_permutes(B, D, F):
    rng = np.random.default_rng(B + D)
    A = rng.standard_normal((B, D)).astype(np.float32)
    W = rng.standard_normal((D, F)).astype(np.float32)
    a = jax.device_put(A, NamedSharding(MESH, P("x", "y")))
    w = jax.device_put(W, NamedSharding(MESH, P(None, "y")))
    outs = {}
    for fn in (sh.allgather_matmul, sh.collective_matmul):
        f = jax.jit(jax.shard_map(lambda a, w, fn=fn: fn(a, w, "y"), mesh=MESH,
                                  in_specs=(P("x", "y"), P(None, "y")), out_specs=P("x", "y")))
        c = f.lower(a, w).compile()
        outs[fn.__name__] = (np.asarray(c(a, w)), hlo.collectives(c))
    np.testing.assert_allclose(outs["collective_matmul"][0], A @ W, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(outs["allgather_matmul"][0], A @ W, rtol=1e-4, atol=1e-4)
    perms = outs["collective_matmul"][1]
    assert [r.kind for r in perms] == ["collective-permute"] * 3
    chunk = B // 2 * D // 4 * 4
    assert sum(r.bytes_per_device for r in perms) == 3 * chunk
    (ag,) = outs["allgather_matmul"][1]
    assert ag.kind == "all-gather" and ag.bytes_per_device == 3 * chunk   # same bytes


def test_collective_matmul_times_by_hand():
    v5p = get_chip("tpu-v5p")
    B, D, F, n = 8192, 8192, 28672, 4
    t = sh.collective_matmul_times(B, D, F, n, "tpu-v5p")
    t_math = 2 * B * D * F / n / v5p.bf16_flops
    t_gather = (n - 1) / n * B * D * 2 / (2 * v5p.ici_link_bandwidth)
    t_step = B * D * 2 / n / (2 * v5p.ici_link_bandwidth)
    assert math.isclose(t["math"], t_math) and math.isclose(t["gather"], t_gather)
    assert math.isclose(t["plain"], t_gather + t_math)
    assert math.isclose(t["collective"], t_math / n + (n - 1) * max(t_math / n, t_step))
    assert t["collective"] < t["plain"]
    faster = sh.collective_matmul_times(B, D, F, n, v5p.with_(ici_link_bandwidth=1e12))
    assert faster["gather"] < t["gather"]
    with pytest.raises(ValueError, match="divide"):
        sh.collective_matmul_times(8, 10, 8, 4, "tpu-v5p")
    with pytest.raises(ValueError):
        sh.collective_matmul_times(8, 16, 8, 0, "tpu-v5p")


def test_collective_matmul_send_on_an_axis_of_two_chips_uses_its_one_link():
    """Two chips share one link: a chunk cannot go half each way round, so its send takes
    chunk / W, not chunk / (2 W) (collectives.links_per_device); from 3 chips on, half."""
    v5p = get_chip("tpu-v5p")
    B, D, F = 4096, 8192, 28672
    for n, links in ((2, 1), (4, 2), (8, 2)):
        t = sh.collective_matmul_times(B, D, F, n, v5p)
        chunk = B * D * 2 / n
        assert math.isclose(t["step_comm"], chunk / (links * v5p.ici_link_bandwidth)), n
        one_way = sh.collective_matmul_times(B, D, F, n, v5p, bidirectional=False)
        assert math.isclose(one_way["step_comm"], chunk / v5p.ici_link_bandwidth)
    # at n = 2 the whole gather is that one send: the same link, the same bytes
    t2 = sh.collective_matmul_times(B, D, F, 2, v5p)
    assert math.isclose(t2["step_comm"], t2["gather"])


def test_collective_matmul_checks_w_rows():
    f = jax.jit(jax.shard_map(lambda a, w: sh.collective_matmul(a, w, "y"), mesh=MESH,
                              in_specs=(P("x", "y"), P("y", None)), out_specs=P("x", "y")))
    with pytest.raises(ValueError, match="rows"):
        f.lower(jnp.ones((8, 16)), jnp.ones((16, 16)))


# LLaMA-3 layer in three modes ----------------------------------------------------------------
def _run(cfg, purpose, mode, vals):
    mesh = scalebook.make_mesh((2, 4), ("data", "model"), explicit=(mode == "explicit"))
    st = sh.layer_structs(cfg, mesh, purpose, 4, 8, dtype="float32")
    arrs = {k: jax.device_put(vals[k], st[k].sharding) for k in st}
    p = {k: v for k, v in arrs.items() if k.startswith("w")}
    args = (p, arrs["x"]) + ((arrs["k_cache"], arrs["v_cache"]) if purpose == "decode" else ())
    c = sh.layer_fn(mode, purpose, mesh).lower(*args).compile()
    return np.asarray(c(*args)), hlo.collectives(c)


def _reference(vals, purpose):
    """The layer in plain NumPy (no sharding), written independently of _layer_math."""
    p = {k: np.asarray(v, np.float64) for k, v in vals.items()}
    x = p["x"]
    sm = (lambda s: np.exp(s - s.max(-1, keepdims=True))
          / np.exp(s - s.max(-1, keepdims=True)).sum(-1, keepdims=True))
    silu = (lambda z: z / (1 + np.exp(-z)))
    if purpose == "decode":
        q = np.einsum("bd,dkgh->bkgh", x, p["wq"])
        s = np.einsum("bkgh,btkh->bkgt", q, p["k_cache"]) / np.sqrt(q.shape[-1])
        o = np.einsum("bkgt,btkh->bkgh", sm(s), p["v_cache"])
        h1 = x + np.einsum("bkgh,kghd->bd", o, p["wo"])
    else:
        q = np.einsum("bsd,dkgh->bskgh", x, p["wq"])
        k = np.einsum("bsd,dkh->bskh", x, p["wk"])
        v = np.einsum("bsd,dkh->bskh", x, p["wv"])
        S = x.shape[1]
        s = np.einsum("bskgh,btkh->bkgst", q, k) / np.sqrt(q.shape[-1])
        s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
        o = np.einsum("bkgst,btkh->bskgh", sm(s), v)
        h1 = x + np.einsum("bskgh,kghd->bsd", o, p["wo"])
    return h1 + (silu(h1 @ p["w_gate"]) * (h1 @ p["w_up"])) @ p["w_down"]


@pytest.mark.parametrize("purpose", sh.PURPOSES)
def test_layer_three_modes_agree_with_numpy(purpose):
    mesh = scalebook.make_mesh((2, 4), ("data", "model"))
    st = sh.layer_structs(TINY, mesh, purpose, 4, 8, dtype="float32")
    rng = np.random.default_rng(1)
    vals = {k: (0.3 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in st.items()}
    want = _reference(vals, purpose)
    kinds = {}
    for mode in sh.MODES:
        got, records = _run(TINY, purpose, mode, vals)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        kinds[mode] = sorted(r.kind for r in records)
    n_ag = 7 if purpose == "train" else 0
    for mode in sh.MODES:
        assert kinds[mode] == ["all-gather"] * n_ag + ["all-reduce"] * 2, (mode, kinds[mode])


def test_layer_structs_at_real_size_allocate_nothing_and_check_divisibility():
    am = AbstractMesh((16, 8), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    m70 = get_model("llama3-70b")
    st = sh.layer_structs(m70, am, "train", 16, 4096)
    assert st["wq"].shape == (8192, 8, 8, 128) and st["wq"].sharding.spec == P("data", "model",
                                                                             None, None)
    assert st["w_down"].sharding.shard_shape(st["w_down"].shape) == (3584, 512)
    with pytest.raises(ValueError, match=r"x\[8, 4096, 8192\].*size 8.*16 blocks"):
        sh.layer_structs(m70, am, "train", 8, 4096)
    big = AbstractMesh((8, 16), ("data", "model"))
    with pytest.raises(ValueError, match="wq.*size 8"):        # 8 KV heads over 16
        sh.layer_structs(m70, big, "train", 16, 4096)


def test_layer_fn_refuses_bad_arguments():
    auto = scalebook.make_mesh((2, 4), ("data", "model"))
    with pytest.raises(ValueError, match="mode"):
        sh.layer_fn("pjit", "train", auto)
    with pytest.raises(ValueError, match="purpose"):
        sh.layer_fn("auto", "serve", auto)
    with pytest.raises(ValueError, match="Explicit"):
        sh.layer_fn("explicit", "train", auto)
    with pytest.raises(ValueError, match="'data' and 'model'"):
        sh.layer_fn("manual", "train", MESH)


def test_record_time_by_hand():
    f = jax.jit(jax.shard_map(_all_five, mesh=MESH, in_specs=P("x", "y"),
                              out_specs=P(("x", "y"), None), check_vma=False))
    low = sh.lowered_collectives(f.lower(jnp.ones((8, 16), jnp.float32)))
    W = get_chip("tpu-v5p").ici_link_bandwidth
    ag, ar = low[0], low[1]
    assert math.isclose(sh.record_time(ag, "tpu-v5p"), 3 / 4 * 256 / (2 * W))
    assert math.isclose(sh.record_time(ar, bandwidth=1e9, topology="ring"), 2 * 1 / 2 * 256 / 1e9)
    with pytest.raises(TypeError, match="Collective"):
        sh.record_time("all-gather", "tpu-v5p")
    with pytest.raises(ValueError, match="chip"):
        sh.record_time(ag)


def test_real_size_training_layer_collectives_by_hand():
    """The manual layer lowered on a 16 x 8 abstract mesh at LLaMA-3 70B's shapes: seven weight
    all-gathers over 'data' and two activation all-reduces over 'model', bytes worked by hand."""
    am = AbstractMesh((16, 8), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    st = sh.layer_structs(get_model("llama3-70b"), am, "train", 16, 4096)
    p = {k: v for k, v in st.items() if k.startswith("w")}
    lowered = sh.layer_fn("manual", "train", am).trace(p, st["x"]).lower(
        lowering_platforms=("cpu",))
    recs = sh.lowered_collectives(lowered)
    D, F, H, K, h = 8192, 28672, 64, 8, 128
    weights = (D * H * h + 2 * D * K * h + H * h * D + 3 * D * F) * 2      # bf16 bytes
    ag = [r for r in recs if r.kind == "all-gather"]
    ar = [r for r in recs if r.kind == "all-reduce"]
    assert len(ag) == 7 and len(ar) == 2 and len(recs) == 9
    assert all(r.group_size == 16 for r in ag) and all(r.group_size == 8 for r in ar)
    assert math.isclose(sum(r.bytes_per_device for r in ag), 15 / 16 * weights / 8)
    for r in ar:
        assert r.operand_shapes == ("bf16[1,4096,8192]",)
        assert math.isclose(r.bytes_per_device, 2 * 7 / 8 * 4096 * D * 2)


# show_error -------------------------------------------------------------------------------
def test_show_error_prints_type_and_jax_message_without_paths(capsys):
    sh.show_error(lambda: jax.device_put(jnp.ones((6, 16)), NamedSharding(MESH, P("y", None))))
    out = capsys.readouterr().out
    assert out.startswith("IndivisibleError: One of device_put args")
    assert "partitioned 4 times" in out and "dimension size is 6" in out
    assert ".py" not in out and "error occurs at source" not in out
    assert all(len(line) <= 100 for line in out.splitlines())


def test_show_error_keeps_the_first_lines_and_says_how_many_it_left_out(capsys):
    def many():
        raise ValueError("first\n\nsecond /usr/lib/x/y.py:3 here\nthird\nfourth\nfifth")
    sh.show_error(many, lines=3, width=40)
    assert capsys.readouterr().out.splitlines() == [
        "ValueError: first", "second <file> here", "third", "    [... 2 more line(s)]"]
    sh.show_error(lambda: 1 / 0, expect=ZeroDivisionError)
    assert capsys.readouterr().out == "ZeroDivisionError: division by zero\n"
    sh.show_error(lambda: (_ for _ in ()).throw(KeyError("k" * 150)), width=60)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and all(len(line) <= 60 for line in out)


def test_show_error_fails_loudly_when_nothing_raises():
    with pytest.raises(AssertionError, match="ran without raising"):
        sh.show_error(lambda: jax.device_put(jnp.ones((8, 16)), NamedSharding(MESH, P("y"))))
    with pytest.raises(TypeError, match="missing"):            # not the expected kind
        sh.show_error(lambda: jax.shard_map(lambda a: a, mesh=MESH, in_specs=P()),
                      expect=ValueError)
    with pytest.raises(TypeError, match="function of no arguments"):
        sh.show_error(ValueError("not a function"))
    with pytest.raises(TypeError, match="exception class"):
        sh.show_error(lambda: 1 / 0, expect="ZeroDivisionError")
    with pytest.raises(ValueError, match="lines must be a positive integer"):
        sh.show_error(lambda: 1 / 0, lines=0)


# the chapter shows JAX's errors without stopping Run all -------------------------------------
def test_chapter_10_raises_once_and_follows_each_mistake_with_its_fix():
    """No cell of chapter 10 raises (Colab's Run all ignores raises-exception tags): 10.3's
    ambiguous einsum is shown through show_error, as is each mistake of section 10.7, whose
    stored output is JAX's (or the book's) message, and a code cell that runs the fix
    follows it before the next mistake."""
    import json
    from pathlib import Path
    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" /
                     "10_jax_sharding.ipynb").read_text())
    cells = nb["cells"]

    def text(c):
        return "".join(c["source"])

    assert not [c for c in cells if "raises-exception" in c["metadata"].get("tags", [])]
    (amb,) = [c for c in cells if c["cell_type"] == "code"
              and "show_error(ambiguous_contraction" in text(c)]
    assert "ShardingTypeError: Contracting dimensions are sharded" in "".join(
        amb["outputs"][0]["text"]) and "einsum" in text(amb)

    import re

    def heading(c, n):                         # a markdown cell may hold several paragraphs
        return c["cell_type"] == "markdown" and re.search(rf"^## {n} ", text(c), re.M)

    start = next(i for i, c in enumerate(cells) if heading(c, r"10\.7"))
    end = next(i for i, c in enumerate(cells) if heading(c, r"10\.8"))
    shown, pending, mistakes = [], None, 0
    for c in cells[start:end]:
        if c["cell_type"] == "markdown" and re.search(r"^\*\*", text(c), re.M):
            assert pending is None, f"no fix cell after {pending!r}"
            mistakes += 1
        elif c["cell_type"] == "code" and "show_error(" in text(c):
            out = "".join("".join(o.get("text", "")) for o in c["outputs"])
            names = re.findall(r"^(\w+Error): ", out, re.M)
            assert len(names) == text(c).count("show_error("), f"not every error shown: {out!r}"
            assert all(len(line) <= 100 for line in out.splitlines())
            shown += names
            pending = pending or text(c)
        elif c["cell_type"] == "code":
            assert "except" not in text(c)
            pending = None
    assert pending is None, f"no fix cell after {pending!r}"
    assert mistakes >= 6
    assert "IndivisibleError" in shown and "DuplicateSpecError" in shown
    assert shown.count("ValueError") >= 5 and "TypeError" in shown
