"""The small LLaMA in scalebook.llama against the formulas of scalebook.models.

FLOPs are compared two ways on several tiny configurations:
* the matmuls (dot_general) of the traced program must equal the formula exactly;
* XLA's cost_analysis() of the compiled program (f32, layers unrolled) must lie between the
  formula and llama.XLA_FLOP_TOLERANCE above it: the excess is the elementwise work (norms, rotary
  embeddings, softmax, SiLU, residual adds, cross-entropy, the SGD update) that the
  formulas leave out.
"""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scalebook import hlo, llama
from scalebook.models import TransformerConfig

# Written here, not imported from the code under test: widening the package's tolerance
# must not widen the test's. Chapter 4 prints the package's value; the two must agree.
FLOP_TOL = 0.05


def test_the_package_tolerance_is_the_tested_one():
    assert llama.XLA_FLOP_TOLERANCE == FLOP_TOL

CONFIGS = [
    # (config, batch, seq_len)
    (TransformerConfig("gqa", n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, head_dim=32,
                       d_ff=384, vocab_size=512), 2, 64),
    (TransformerConfig("mqa-tied", n_layers=3, d_model=96, n_heads=6, n_kv_heads=1, head_dim=32,
                       d_ff=256, vocab_size=300, tied_embeddings=True), 1, 48),
    (TransformerConfig("mha-wide-heads", n_layers=1, d_model=64, n_heads=2, n_kv_heads=2,
                       head_dim=48, d_ff=192, vocab_size=200), 3, 40),
]
IDS = [c.name for c, _, _ in CONFIGS]


def shapes(make, *args):
    """The shapes and dtypes of what make(*args) returns, without making its arrays (each
    new shape of an eagerly drawn random array is a compilation of its own)."""
    return jax.eval_shape(partial(make, *args))

assert 0 < FLOP_TOL < 0.2


# -- numerics of the building blocks, against independent numpy versions ---------------
def naive_attention(q, k, v, q_pos, k_pos):
    """Multi-head attention in numpy with each key/value head repeated for its group of
    H / K query heads. q [B, S, H, h]; k, v [B, T, K, h]; q_pos [B, S]; k_pos [T]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, S, H, h = q.shape
    G = H // k.shape[2]
    k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)    # [B, T, H, h]
    out = np.zeros((B, S, H, h))
    for b in range(B):
        for i in range(H):
            scores = q[b, :, i] @ k[b, :, i].T / np.sqrt(h)         # [S, T]
            scores[np.asarray(k_pos)[None, :] > np.asarray(q_pos[b])[:, None]] = -np.inf
            w = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[b, :, i] = (w / w.sum(axis=1, keepdims=True)) @ v[b, :, i]
    return out.reshape(B, S, H * h)


@pytest.mark.parametrize("H, K", [(4, 2), (6, 1), (3, 3)])
def test_attention_matches_naive_multi_head(H, K):
    c = TransformerConfig("t", n_layers=1, d_model=32, n_heads=H, n_kv_heads=K, head_dim=8,
                          d_ff=32, vocab_size=16)
    B, S, T, h = 2, 5, 7, 8
    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32)
               for shape in [(B, S, H, h), (B, T, K, h), (B, T, K, h)])
    q_pos = jnp.array([[2, 3, 4, 5, 6], [0, 1, 2, 3, 6]])             # decode-like offsets
    k_pos = jnp.arange(T)
    # jitted: one compilation, where op-by-op dispatch compiles each operation's shapes
    got = jax.jit(partial(llama._attention, c=c))(q, k, v, q_pos, k_pos)
    np.testing.assert_allclose(np.asarray(got), naive_attention(q, k, v, q_pos, k_pos),
                               rtol=1e-5, atol=1e-5)


def test_rope_depends_only_on_relative_position_and_keeps_norms():
    h, theta = 16, 10_000.0
    kq, kk = jax.random.split(jax.random.key(6))
    q = jax.random.normal(kq, (1, 1, 1, h))
    k = jax.random.normal(kk, (1, 1, 1, h))

    def rotated(x, pos):
        cos, sin = llama.rope_angles(jnp.array([[pos]]), h, theta)
        return np.asarray(llama.apply_rope(x, cos, sin), np.float64).ravel()

    def score(m, n):
        return rotated(q, m) @ rotated(k, n)

    for m, n in [(3, 10), (10, 3), (0, 0), (7, 1)]:
        for shift in (1, 57, 400):
            np.testing.assert_allclose(score(m, n), score(m + shift, n + shift), rtol=1e-4, atol=1e-4)
    assert not np.isclose(score(3, 10), score(3, 11))              # the offset does matter
    for pos in (0, 5, 1000):
        np.testing.assert_allclose(np.linalg.norm(rotated(q, pos)),
                                   np.linalg.norm(np.asarray(q)), rtol=1e-5)
    np.testing.assert_allclose(rotated(q, 0), np.asarray(q).ravel(), rtol=1e-6)   # angle 0


def test_rms_norm_matches_numpy():
    x = np.random.default_rng(0).normal(size=(3, 4, 10)).astype(np.float32) * 3
    gain = np.linspace(0.5, 2.0, 10).astype(np.float32)
    eps = 1e-5
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps) * gain
    np.testing.assert_allclose(np.asarray(llama.rms_norm(jnp.asarray(x), jnp.asarray(gain), eps)),
                               want, rtol=1e-5)


@pytest.mark.parametrize("c, B, S", CONFIGS, ids=IDS)
def test_param_count_matches_formula(c, B, S):
    p = jax.eval_shape(partial(llama.init_params, c))   # shapes and dtypes, no values
    assert llama.count_params(p) == c.num_params()
    assert llama.param_bytes(p) == c.weight_bytes(4)
    L0 = p["layers"][0]
    assert L0["wq"].shape == (c.d_model, c.n_heads * c.head_dim)
    assert L0["wk"].shape == (c.d_model, c.n_kv_heads * c.head_dim)
    assert ("head" in p) == (not c.tied_embeddings)


@pytest.mark.parametrize("c, B, S", CONFIGS, ids=IDS)
def test_forward_flops(c, B, S):
    ps, tok = shapes(llama.init_params, c), jax.ShapeDtypeStruct((B, S), jnp.int32)
    fn = partial(llama.forward, config=c)
    want = c.forward_flops_per_token(S) * B * S       # full S x S scores, as the code computes
    assert hlo.matmul_flops_traced(fn, ps, tok) == want
    got = hlo.xla_flops(fn, ps, tok)
    assert want <= got <= want * (1 + FLOP_TOL), got / want


@pytest.mark.parametrize("c, B, S", CONFIGS, ids=IDS)
def test_training_step_flops(c, B, S):
    ps, tok = shapes(llama.init_params, c), jax.ShapeDtypeStruct((B, S), jnp.int32)
    fn = partial(llama.train_step, config=c)
    want = c.training_flops_per_token(S) * B * S
    assert want == 3 * c.forward_flops_per_token(S) * B * S
    assert hlo.matmul_flops_traced(fn, ps, tok, tok) == want
    got = hlo.xla_flops(fn, ps, tok, tok)
    assert want <= got <= want * (1 + FLOP_TOL), got / want


def test_analysis_only_compiles_give_the_same_analyses():
    """hlo.ANALYSIS_ONLY (used by hlo.xla_flops) skips optimising the machine code; the HLO,
    its cost analysis and its memory analysis must be those of a default compile."""
    c, B, S = CONFIGS[0]
    ps, tok = shapes(llama.init_params, c), jax.ShapeDtypeStruct((B, S), jnp.int32)
    lowered = jax.jit(partial(llama.train_step, config=c)).lower(ps, tok, tok)
    default, quick = lowered.compile(), lowered.compile(hlo.ANALYSIS_ONLY)
    assert hlo.cost(quick) == hlo.cost(default)
    assert hlo.memory(quick) == hlo.memory(default)
    assert hlo.entry_lines(quick) == hlo.entry_lines(default)
    assert hlo.xla_flops(partial(llama.train_step, config=c), ps, tok, tok) == \
        hlo.cost(default)["flops"]


def test_scan_would_undercount():
    """Why the model unrolls its layers: cost_analysis counts a scanned body once."""
    w = jax.ShapeDtypeStruct((4, 64, 64), jnp.float32)
    x = jax.ShapeDtypeStruct((8, 64), jnp.float32)

    def scanned(w, x):
        return jax.lax.scan(lambda h, wi: (h @ wi, None), x, w)[0]

    def unrolled(w, x):
        for i in range(4):
            x = x @ w[i]
        return x

    one = 2 * 8 * 64 * 64
    assert hlo.xla_flops(unrolled, w, x) == pytest.approx(4 * one, rel=0.01)
    assert hlo.xla_flops(scanned, w, x) < 2 * one


@pytest.mark.parametrize("c, B, S", CONFIGS, ids=IDS)
def test_decode_step_flops(c, B, S):
    T = 2 * S
    ps = shapes(llama.init_params, c)
    cache = shapes(llama.init_kv_cache, c, B, T, jnp.float32)
    tok = jax.ShapeDtypeStruct((B, 1), jnp.int32)
    fn = partial(llama.forward_with_cache, config=c)
    want = c.forward_flops_per_token(T) * B           # one query against all T cache slots
    assert hlo.matmul_flops_traced(fn, ps, tok, cache, S) == want
    got = hlo.xla_flops(fn, ps, tok, cache, jnp.int32(S))
    assert want <= got <= want * (1 + FLOP_TOL), got / want


@pytest.mark.parametrize("c, B, S", CONFIGS, ids=IDS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kv_cache_size_exact(c, B, S, dtype):
    cache = llama.init_kv_cache(c, B, S, dtype)
    per_elem = jnp.dtype(dtype).itemsize
    assert llama.cache_bytes(cache) == c.kv_cache_bytes(B, S, per_elem)
    # by hand: k and v, per layer, [B, S, K, h]
    assert llama.cache_bytes(cache) == 2 * c.n_layers * B * S * c.n_kv_heads * c.head_dim * per_elem


def test_cached_decoding_matches_full_forward():
    c = CONFIGS[0][0]
    p = llama.init_params(c, jax.random.key(1))
    prompt = jax.random.randint(jax.random.key(2), (2, 5), 0, c.vocab_size)
    out, cache = llama.generate_greedy(p, prompt, 4, c)
    assert out.shape == (2, 9)
    full = llama.forward(p, out, c)
    np.testing.assert_array_equal(np.argmax(full[:, 4:-1], -1), np.asarray(out[:, 5:]))
    assert llama.cache_bytes(cache) == c.kv_cache_bytes(2, 9, 4)
    # prefill through the cache gives the same logits as the plain forward pass
    logits, _ = llama.forward_with_cache(p, out, llama.init_kv_cache(c, 2, 12, jnp.float32), 0, c)
    np.testing.assert_allclose(logits, full, atol=1e-4)


def test_training_step_lowers_loss():
    c = CONFIGS[2][0]
    p = llama.init_params(c, jax.random.key(3))
    tok = jax.random.randint(jax.random.key(4), (3, 16), 0, c.vocab_size)
    step = jax.jit(partial(llama.train_step, config=c, lr=0.05))
    p1, loss0 = step(p, tok, tok)
    for _ in range(5):
        p1, loss = step(p1, tok, tok)
    assert float(loss) < float(loss0)


def test_bad_inputs_rejected():
    c = CONFIGS[0][0]
    p = llama.init_params(c)
    with pytest.raises(ValueError, match="tokens"):
        llama.forward(p, jnp.zeros((4,), jnp.int32), c)
    with pytest.raises(ValueError, match="integer"):
        llama.forward(p, jnp.zeros((1, 4), jnp.float32), c)
    with pytest.raises(ValueError, match="targets"):
        llama.loss_fn(p, jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 3), jnp.int32), c)
    with pytest.raises(ValueError, match="context"):
        llama.init_kv_cache(c, 1, 0)
    cache = llama.init_kv_cache(c, 1, 8, jnp.float32)
    with pytest.raises(ValueError, match="does not fit"):
        llama.forward_with_cache(p, jnp.zeros((1, 4), jnp.int32), cache, 6, c)
