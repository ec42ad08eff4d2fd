"""scalebook.frontier_mesh on the 8-device CPU mesh: the expert-parallel MoE layer equals the
dense one (no drops) or the dense one without the pairs the capacity rule drops; its compiled
program holds two all-to-alls of our buffer's size; MLA absorbed equals unabsorbed, and the
FLOP count matches the compiled program's dot instructions; bad input gets a clear error.

References here are independent of the module where it matters: routing and the per-token
expert sum are NumPy loops, drops are counted with parallelism.tokens_dropped, byte counts
are worked out from the shapes in the test."""

import math

import numpy as np
import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from scalebook import collectives, hlo, parallelism  # noqa: E402
from scalebook import frontier_mesh as fm  # noqa: E402

MESH_8 = scalebook.make_mesh((8,), ("ep",))
MESH_24 = scalebook.make_mesh((2, 4), ("x", "y"))

# (mesh, axis, D, F, E, k, T, shared_ff)
MOE_CASES = [
    (MESH_8, "ep", 32, 64, 16, 2, 128, 32),
    (MESH_24, "y", 16, 24, 8, 3, 64, 0),
    (MESH_8, "ep", 16, 32, 8, 1, 64, 16),
]
MOE_IDS = ["n8-E16-k2-shared", "n4of2x4-E8-k3", "n8-E8-k1-shared"]


def tokens(T, D, seed=0):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((T, D)), jnp.float32)


def silu(v):
    return v / (1 + np.exp(-v))


def numpy_moe(p, x, k):
    """Token by token, expert by expert, in float64."""
    x = np.asarray(x, np.float64)
    P = {n: np.asarray(p[n], np.float64) for n in ("router", "bias", "w_gate", "w_up", "w_down")}
    s = 1 / (1 + np.exp(-(x @ P["router"])))
    y = np.zeros_like(x)
    for t in range(x.shape[0]):
        chosen = np.argsort(-(s[t] + P["bias"]), kind="stable")[:k]
        g = s[t, chosen] / s[t, chosen].sum()
        for e, gate in zip(chosen, g):
            h = silu(x[t] @ P["w_gate"][e]) * (x[t] @ P["w_up"][e])
            y[t] += gate * (h @ P["w_down"][e])
    if p.get("shared") is not None:
        S = {n: np.asarray(v, np.float64) for n, v in p["shared"].items()}
        y += (silu(x @ S["w_gate"]) * (x @ S["w_up"])) @ S["w_down"]
    return y


# ------------------------------------------------------------------------------------------
# Routing and the dense reference
# ------------------------------------------------------------------------------------------

def test_routing_bias_steers_the_choice_not_the_gates():
    p = fm.init_moe(8, 8, 6, key=3)
    x = tokens(5, 8, seed=1)
    p["bias"] = jnp.asarray([0.0, 5.0, 0.0, 0.0, 5.0, 0.0], jnp.float32)   # 1 and 4 always win
    idx, gates = fm.moe_route(p, x, 2)
    assert sorted(map(tuple, np.sort(np.asarray(idx), axis=1))) == [(1, 4)] * 5
    s = 1 / (1 + np.exp(-(np.asarray(x, np.float64) @ np.asarray(p["router"], np.float64))))
    want = s[:, [1, 4]] / s[:, [1, 4]].sum(axis=1, keepdims=True)
    got = np.take_along_axis(np.asarray(gates), np.argsort(np.asarray(idx), axis=1), axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gates).sum(axis=1), 1.0, rtol=1e-6)


@pytest.mark.parametrize("k, shared", [(2, 0), (3, 12)])
def test_dense_reference_equals_a_numpy_loop(k, shared):
    p = fm.init_moe(16, 20, 8, shared_ff=shared, key=k)
    x = tokens(24, 16, seed=k)
    np.testing.assert_allclose(np.asarray(fm.moe_dense(p, x, k)), numpy_moe(p, x, k),
                               rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------
# Expert parallelism
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mesh, axis, D, F, E, k, T, Fs", MOE_CASES, ids=MOE_IDS)
def test_expert_parallel_equals_dense_when_nothing_drops(mesh, axis, D, F, E, k, T, Fs):
    p = fm.init_moe(D, F, E, shared_ff=Fs, key=E + k)
    x = tokens(T, D, seed=k)
    layer = fm.moe_expert_parallel(mesh, axis, top_k=k, capacity_factor=E / k)
    n = mesh.shape[axis]
    assert layer.capacity(T, E) == T // n          # c = E/k gives C = b: nothing can drop
    out = layer(p, x)
    assert out.y.shape == (T, D) and out.dropped.shape == (n,)
    assert int(out.dropped.sum()) == 0
    np.testing.assert_allclose(np.asarray(out.y), np.asarray(fm.moe_dense(p, x, k)),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.y), numpy_moe(p, x, k), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mesh, axis, D, F, E, k, T, Fs", MOE_CASES, ids=MOE_IDS)
@pytest.mark.parametrize("cf", [1.0, 0.5])
def test_expert_parallel_drops_what_the_capacity_rule_drops(mesh, axis, D, F, E, k, T, Fs,
                                                            cf):
    p = fm.init_moe(D, F, E, shared_ff=Fs, key=E + k)
    p["bias"] = p["bias"].at[0].set(0.3)           # lean on expert 0 so that it overflows
    x = tokens(T, D, seed=k)
    layer = fm.moe_expert_parallel(mesh, axis, top_k=k, capacity_factor=cf)
    n, b = mesh.shape[axis], T // mesh.shape[axis]
    C = layer.capacity(T, E)
    assert C == max(1, math.ceil(cf * b * k / E))
    out = layer(p, x)
    idx = np.asarray(fm.moe_route(p, x, k)[0])
    # drops per device from the counts alone: sum over experts of max(0, count - C)
    want = [parallelism.tokens_dropped(np.bincount(idx[d * b:(d + 1) * b].ravel(),
                                                   minlength=E), C) for d in range(n)]
    assert np.asarray(out.dropped).tolist() == want and sum(want) > 0
    keep = fm.moe_kept(idx, n, C)
    assert (~keep).sum() == sum(want)
    np.testing.assert_allclose(np.asarray(out.y), np.asarray(fm.moe_dense(p, x, k, keep=keep)),
                               rtol=1e-5, atol=1e-5)
    # and it is not the undropped layer
    assert not np.allclose(np.asarray(out.y), np.asarray(fm.moe_dense(p, x, k)), atol=1e-3)


def test_an_explicit_mesh_works_too():
    """jax.make_mesh's default axes are Explicit, where shard_map wants its inputs already
    split as in_specs say: the layer puts them there, and adds no collective doing so."""
    mesh = scalebook.make_mesh((8,), ("ep",), explicit=True)
    p = fm.init_moe(16, 32, 8, shared_ff=8, key=5)
    x = tokens(64, 16, seed=5)
    layer = fm.moe_expert_parallel(mesh, "ep", top_k=2, capacity_factor=4.0)
    out = layer(p, x)
    assert int(out.dropped.sum()) == 0
    np.testing.assert_allclose(np.asarray(out.y), np.asarray(fm.moe_dense(p, x, 2)),
                               rtol=1e-5, atol=1e-5)
    assert layer.all_to_alls(p, x).matches


def test_moe_kept_fills_first_choices_first():
    # one device, capacity 1: expert 0 is every token's first choice and token 0's second
    experts = np.array([[1, 0], [0, 2], [0, 3]])
    keep = fm.moe_kept(experts, 1, 1)
    # first choices in token order: 1 (t0), 0 (t1), 0 (t2: full); then seconds: 0 (t0: full)
    assert keep.tolist() == [[True, False], [True, True], [False, True]]


@pytest.mark.parametrize("mesh, axis, D, F, E, k, T, Fs", MOE_CASES, ids=MOE_IDS)
def test_two_all_to_alls_of_our_buffer_in_the_compiled_program(mesh, axis, D, F, E, k, T, Fs):
    n, b = mesh.shape[axis], T // mesh.shape[axis]
    sds = jax.ShapeDtypeStruct
    p = jax.tree.map(lambda a: sds(a.shape, a.dtype), fm.init_moe(D, F, E, shared_ff=Fs))
    x = sds((T, D), jnp.float32)
    layer = fm.moe_expert_parallel(mesh, axis, top_k=k, capacity_factor=1.0)
    rep = layer.all_to_alls(p, x)
    C = math.ceil(b * k / E)
    buffer = E * C * D * 4                                  # [E, C, D] f32 per device
    assert len(rep.records) == 2 and rep.other_kinds == ()
    for r in rep.records:
        assert r.kind == "all-to-all" and r.group_size == n and r.count == 1
        assert r.dtype == "f32"
        assert r.bytes_per_device == pytest.approx(buffer * (n - 1) / n)
    assert rep.matches and rep.expected_bytes == pytest.approx(buffer * (n - 1) / n)
    # groups: the devices along the axis (on the 2x4 mesh, rows of y)
    if mesh is MESH_24:
        assert set(rep.records[0].groups) == {(0, 1, 2, 3), (4, 5, 6, 7)}
    # the book's formula counts tokens: equal to the buffer when b k / E is whole
    if (b * k) % E == 0:
        assert rep.formula_bytes == pytest.approx(rep.expected_bytes)
        assert rep.formula_bytes == pytest.approx(
            collectives.ring_bytes("all-to-all", b * k * D * 4, n))
    assert all(len(line) <= 100 for line in rep.lines())


def test_all_to_all_report_notices_a_missing_or_extra_collective():
    layer = fm.moe_expert_parallel(MESH_8, "ep", top_k=2)
    p = fm.init_moe(8, 8, 8)
    x = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    # a program with one all-to-all and a psum is not the layer: matches is False
    P = jax.sharding.PartitionSpec
    other = jax.jit(jax.shard_map(
        lambda a: (jax.lax.all_to_all(a, "ep", 0, 0, tiled=True), jax.lax.psum(a, "ep")),
        mesh=MESH_8, in_specs=P("ep"), out_specs=(P("ep"), P())))
    compiled = other.lower(jax.ShapeDtypeStruct((64, 8), jnp.float32)).compile()
    rep = layer.all_to_alls(p, x, compiled=compiled)
    assert not rep.matches and rep.other_kinds == ("all-reduce",)


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------

def test_moe_errors_are_clear():
    p = fm.init_moe(8, 8, 12)
    x = tokens(16, 8)
    with pytest.raises(ValueError, match="n_experts=12 does not divide over 8 devices"):
        fm.moe_expert_parallel(MESH_8, "ep", top_k=2)(p, x)
    p8 = fm.init_moe(8, 8, 8)
    with pytest.raises(ValueError, match="top_k=9 experts per token is more than the 8"):
        fm.moe_expert_parallel(MESH_8, "ep", top_k=9)(p8, x)
    with pytest.raises(ValueError, match="top_k=9 experts per token is more than the 8"):
        fm.moe_route(p8, x, 9)
    with pytest.raises(ValueError, match="tokens=12 does not divide over 8 devices"):
        fm.moe_expert_parallel(MESH_8, "ep", top_k=2)(p8, tokens(12, 8))
    with pytest.raises(ValueError, match="axis 'model' is not an axis of the mesh"):
        fm.moe_expert_parallel(MESH_24, "model", top_k=2)
    with pytest.raises(ValueError, match="capacity_factor must be a positive"):
        fm.moe_expert_parallel(MESH_8, "ep", top_k=2, capacity_factor=0)
    with pytest.raises(ValueError, match=r"x must be \[tokens, D=8\]"):
        fm.moe_dense(p8, tokens(16, 6), 2)
    with pytest.raises(ValueError, match="params lack"):
        fm.moe_dense({"router": p8["router"]}, x, 2)
    bad = dict(p8, w_up=p8["w_up"][:, :, :4])
    with pytest.raises(ValueError, match=r"params\['w_up'\] has shape \(8, 8, 4\)"):
        fm.moe_dense(bad, x, 2)
    with pytest.raises(ValueError, match="shared_ff must be an integer >= 0"):
        fm.init_moe(8, 8, 8, shared_ff=-1)
    with pytest.raises(ValueError, match=r"keep must be \[tokens, top_k\]"):
        fm.moe_dense(p8, x, 2, keep=np.ones((16, 3)))


# ------------------------------------------------------------------------------------------
# Multi-head latent attention
# ------------------------------------------------------------------------------------------

def mla_config(D, H, dc, dr, dn, dv):
    return fm.MLAConfig(d_model=D, n_heads=H, kv_rank=dc, rope_dim=dr, nope_dim=dn,
                        v_dim=dv, n_layers=1)


MLA_CASES = [(mla_config(64, 8, 32, 8, 16, 16), 2, 64), (mla_config(48, 3, 24, 4, 8, 12), 3, 17)]


def mla_inputs(cfg, B, T, seed=0):
    params = fm.init_mla(cfg, key=seed)
    xs = jnp.asarray(np.random.default_rng(seed).standard_normal((B, T, cfg.d_model)),
                     jnp.float32)
    return params, xs[:, -1], fm.mla_latent(cfg, params, xs), xs


def numpy_attention(cfg, params, x, xs):
    """Plain attention with K = [c W_UK, k_R], Q = [x W_Q, q_R], in float64, from the
    tokens themselves (RoPE computed here with NumPy)."""
    P = {n: np.asarray(v, np.float64) for n, v in params.items()}
    x, xs = np.asarray(x, np.float64), np.asarray(xs, np.float64)
    B, T, _ = xs.shape
    dr = cfg.rope_dim

    def rope(v, pos):                    # v [..., dr], pairs (i, i + dr/2)
        ang = pos * fm.ROPE_THETA ** (-np.arange(0, dr, 2) / dr)
        a, b = v[..., :dr // 2], v[..., dr // 2:]
        return np.concatenate([a * np.cos(ang) - b * np.sin(ang),
                               b * np.cos(ang) + a * np.sin(ang)], -1)

    lat = xs @ P["w_dkv"]
    kr = np.stack([rope(xs[:, t] @ P["w_kr"], t) for t in range(T)], 1)      # [B, T, dr]
    k = np.einsum("btc,che->bthe", lat, P["w_uk"])
    v = np.einsum("btc,chv->bthv", lat, P["w_uv"])
    q = np.einsum("bd,dhe->bhe", x, P["w_q"])
    qr = rope(np.einsum("bd,dhr->bhr", x, P["w_qr"]), T - 1)
    s = (np.einsum("bhe,bthe->bht", q, k) + np.einsum("bhr,btr->bht", qr, kr))
    s = s / math.sqrt(cfg.nope_dim + dr)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhv,hvd->bd", np.einsum("bht,bthv->bhv", p, v), P["w_o"])


@pytest.mark.parametrize("cfg, B, T", MLA_CASES)
def test_mla_absorbed_equals_unabsorbed_equals_plain_attention(cfg, B, T):
    params, x, cache, xs = mla_inputs(cfg, B, T)
    plain = fm.mla_decode(cfg, params, x, cache)
    absorbed = fm.mla_decode(cfg, fm.absorb_mla(cfg, params), x, cache, absorbed=True)
    np.testing.assert_allclose(np.asarray(absorbed), np.asarray(plain), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(plain), numpy_attention(cfg, params, x, xs),
                               rtol=1e-4, atol=1e-5)
    assert cache[0].shape == (B, T, cfg.kv_rank) and cache[1].shape == (B, T, cfg.rope_dim)


@pytest.mark.parametrize("cfg, B, T", MLA_CASES)
@pytest.mark.parametrize("absorbed", [False, True])
def test_mla_decode_cost_against_the_compiled_program(cfg, B, T, absorbed):
    """FLOPs: ours equal the dot instructions of XLA's program exactly (hlo.ops, which
    counts 2 x result x contracted size per dot); XLA's cost_analysis total is that plus
    elementwise work (softmax, scale, RoPE), at most a few FLOPs per score. Bytes: what
    the step reads (weights, cache, x) equals XLA's argument bytes (memory_analysis): it
    checks which arrays each form reads, not traffic, which a CPU cannot show."""
    params, x, cache, _ = mla_inputs(cfg, B, T)
    if absorbed:
        params = fm.absorb_mla(cfg, params)
    compiled = jax.jit(lambda p, x, c: fm.mla_decode(cfg, p, x, c, absorbed)).lower(
        params, x, cache).compile()
    ours = fm.mla_decode_cost(cfg, B, T, absorbed, bytes_per_element=4)
    dots = sum(op.flops * op.count for op in hlo.ops(compiled))
    assert dots == ours.flops
    xla = hlo.cost(compiled)["flops"]
    H = cfg.n_heads
    assert ours.flops <= xla <= ours.flops + 12 * B * H * T + 8 * B * H * cfg.rope_dim
    assert hlo.memory(compiled).arguments == ours.weight_bytes + ours.cache_bytes \
        + ours.io_bytes / 2
    assert hlo.memory(compiled).outputs == ours.io_bytes / 2


def test_mla_cost_by_hand():
    cfg = mla_config(64, 8, 32, 8, 16, 24)
    B, T = 2, 64
    un = fm.mla_decode_cost(cfg, B, T, absorbed=False, bytes_per_element=2)
    ab = fm.mla_decode_cost(cfg, B, T, absorbed=True, bytes_per_element=2)
    # keys and values from the cache: 2 B T d_c H (d_n + d_v) = 2 x 2 x 64 x 32 x 8 x 40
    assert un.flops - ab.flops > 2 * B * T * 32 * 8 * (16 + 24) * 0.9
    assert un.materialised_bytes == 2 * B * T * 8 * (16 + 24) * 2 and ab.materialised_bytes == 0
    assert un.cache_bytes == ab.cache_bytes == B * T * (32 + 8) * 2
    # absorbed weights: W_QK [64, 8, 32], W_QR [64, 8, 8], W_OV [8, 32, 64], bf16
    assert ab.weight_bytes == (64 * 8 * 32 + 64 * 8 * 8 + 8 * 32 * 64) * 2
    assert ab.io_bytes == 2 * B * 64 * 2 and ab.intensity == ab.flops / ab.bytes


def test_mla_errors_are_clear():
    with pytest.raises(ValueError, match="rope_dim must be even"):
        fm.init_mla(mla_config(64, 8, 32, 7, 16, 16))
    with pytest.raises(ValueError, match="q_rank=None"):
        fm.init_mla(fm.MLAConfig(d_model=64, n_heads=8, kv_rank=32, rope_dim=8, nope_dim=16,
                                 v_dim=16, n_layers=1, q_rank=24))
    with pytest.raises(ValueError, match="lacks"):
        fm.init_mla((32, 2, 8, 16, 4))
    cfg = mla_config(32, 2, 16, 4, 8, 8)
    params, x, cache, _ = mla_inputs(cfg, 2, 5)
    with pytest.raises(ValueError, match=r"from absorb_mla\(cfg, params\)"):
        fm.mla_decode(cfg, params, x, cache, absorbed=True)
    with pytest.raises(ValueError, match=r"from init_mla\(cfg\)"):
        fm.mla_decode(cfg, fm.absorb_mla(cfg, params), x, cache)
    with pytest.raises(ValueError, match=r"cache must be c \[B=2, T, d_c=16\]"):
        fm.mla_decode(cfg, params, x, (cache[0][:, :, :8], cache[1]))
    with pytest.raises(ValueError, match=r"x must be \[B, D=32\]"):
        fm.mla_decode(cfg, params, x[:, :4], cache)
    with pytest.raises(ValueError, match="absorbed must be True or False"):
        fm.mla_decode_cost(cfg, 1, 4, absorbed="yes")
