"""Remat policies of chapter 4: the values each jax.checkpoint policy keeps per layer, and
the matmul FLOPs it recomputes, against scalebook.models' formulas.

* kept values: the arrays that the backward function of jax.vjp holds for one checkpointed
  layer (shapes from jax.eval_shape), per token, must equal
  ``saved_values_per_layer_per_token`` exactly;
* recomputation: the dot FLOPs of the compiled training step under each policy must equal
  the step without remat plus L x tokens x ``recompute_flops_per_layer_per_token``, exactly
  (XLA drops the recomputed W_down, whose result the backward pass never uses).
"""

from functools import partial

import jax
import jax.numpy as jnp
import pytest

from scalebook import hlo, llama
from scalebook.models import REMAT_POLICIES, TransformerConfig

CONFIGS = [
    # GQA with H h != D, and multi-query attention
    (TransformerConfig("gqa-narrow-heads", n_layers=2, d_model=96, n_heads=4, n_kv_heads=2,
                       head_dim=16, d_ff=160, vocab_size=128), 2, 24),
    (TransformerConfig("mqa", n_layers=1, d_model=64, n_heads=4, n_kv_heads=1,
                       head_dim=32, d_ff=128, vocab_size=96), 3, 16),
]
IDS = [c.name for c, _, _ in CONFIGS]
QUICK = hlo.ANALYSIS_ONLY


def _kept_per_token(c, batch, seq, policy):
    params = llama.init_params(c, jax.random.key(0))
    pos = jnp.arange(seq)[None, :]
    cos, sin = llama.rope_angles(pos, c.head_dim, c.rope_theta)
    layer = jax.checkpoint(lambda p, x: llama._layer(p, x, cos, sin, pos, c)[0],
                           policy=llama.remat_policy(policy))
    x = jax.ShapeDtypeStruct((batch, seq, c.d_model), jnp.float32)
    backward = jax.eval_shape(lambda p, x: jax.vjp(layer, p, x)[1], params["layers"][0], x)
    kept = sum(a.size for a in jax.tree.leaves(backward) if a.ndim and a.shape[0] == batch)
    assert kept % (batch * seq) == 0
    return kept // (batch * seq)


@pytest.mark.parametrize("policy", REMAT_POLICIES)
@pytest.mark.parametrize("c,batch,seq", CONFIGS, ids=IDS)
def test_values_kept_match_the_formula(c, batch, seq, policy):
    assert _kept_per_token(c, batch, seq, policy) \
        == c.saved_values_per_layer_per_token(policy, context=seq)


def _dot_flops(c, batch, seq, remat):
    ps = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                      llama.init_params(c, jax.random.key(0)))
    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    fn = jax.jit(partial(llama.train_step, config=c, remat=remat))
    compiled = fn.lower(ps, tok, tok).compile(QUICK)
    return sum(op.flops * op.count for op in hlo.ops(compiled)), compiled


@pytest.mark.parametrize("c,batch,seq", CONFIGS[1:], ids=IDS[1:])
def test_recomputed_matmul_flops_match_the_formula(c, batch, seq):
    base = c.training_flops_per_token(seq) * batch * seq
    none, _ = _dot_flops(c, batch, seq, None)
    assert none == base
    for policy in REMAT_POLICIES:
        got, _ = _dot_flops(c, batch, seq, policy)
        want = base + c.n_layers * batch * seq * c.recompute_flops_per_layer_per_token(
            policy, seq)
        assert got == want, policy


def test_remat_does_not_change_the_loss():
    c, batch, seq = CONFIGS[1]
    params = llama.init_params(c, jax.random.key(1))
    tokens = jax.random.randint(jax.random.key(2), (batch, seq), 0, c.vocab_size)

    def loss_and_grad(remat):
        fn = jax.jit(jax.value_and_grad(partial(llama.loss_fn, config=c, remat=remat)))
        return fn(params, tokens, tokens)
    ref, g_ref = loss_and_grad(None)
    for policy in ("nothing",):
        loss, g = loss_and_grad(policy)
        assert jnp.allclose(loss, ref)
        assert all(jnp.allclose(a, b, atol=1e-6) for a, b in
                   zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)))


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="remat must be None or one of"):
        llama.remat_policy("everything")
