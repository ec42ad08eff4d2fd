"""A small LLaMA-architecture transformer in plain JAX, built from a TransformerConfig.

The same architecture as LLaMA-3 (RMSNorm before attention and MLP, rotary position
embeddings, grouped-query attention, SwiGLU MLP, no biases, untied output head unless the
config says otherwise), without LLaMA-3.1's RoPE frequency scaling (which has no parameters
and no FLOPs), written to be read, not to be fast. Chapter 4 uses it to check the
formulas of :mod:`scalebook.models` against what XLA compiles:

* :func:`count_params` of :func:`init_params` equals ``config.num_params()``;
* the FLOPs XLA's ``cost_analysis()`` reports (:func:`scalebook.hlo.xla_flops`) for
  :func:`forward` and for a training step (:func:`train_step`) are compared with ``config.forward_flops_per_token`` and
  ``config.training_flops_per_token``: the matmuls exactly, XLA's total (which adds the
  elementwise work) within :data:`XLA_FLOP_TOLERANCE` above the formula;
* the cache of :func:`init_kv_cache` has exactly ``config.kv_cache_bytes(batch, context)``
  bytes.

The layers are a Python list and the forward pass is a Python loop over them, so XLA sees
every layer (``cost_analysis`` counts the body of a ``lax.scan`` only once).

Array names: B batch, S sequence (query positions), T cache length (key positions),
d model width, H query heads, K key/value heads, G = H / K, h head size, F MLP width,
V vocabulary.
"""

from __future__ import annotations

import math
import numbers
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from .models import TransformerConfig, get_model

__all__ = ["init_params", "count_params", "param_bytes", "rms_norm", "rope_angles", "apply_rope",
           "forward", "loss_fn", "train_step", "init_kv_cache", "cache_bytes", "forward_with_cache",
           "generate_greedy", "XLA_FLOP_TOLERANCE"]

# How far above the matmul formula XLA's FLOP count of this model (in float32, layers
# unrolled) may lie: the excess is elementwise work (norms, rotary embeddings, softmax,
# SiLU, residual adds, cross-entropy, the update). The tests and chapter 4 use this value.
XLA_FLOP_TOLERANCE = 0.05


# -- parameters ---------------------------------------------------------------------------
def init_params(config: TransformerConfig, key=None, dtype=jnp.float32) -> dict:
    """Random parameters for ``config``: a dict of arrays (normal, std 1/sqrt(fan-in);
    norm gains 1). Layout: ``embed`` [V, d]; ``layers``: a list of L dicts with
    ``attn_norm`` [d], ``wq`` [d, H h], ``wk`` and ``wv`` [d, K h], ``wo`` [H h, d],
    ``mlp_norm`` [d], ``w_gate`` and ``w_up`` [d, F], ``w_down`` [F, d]; ``final_norm`` [d];
    ``head`` [d, V] unless the embeddings are tied."""
    c = get_model(config)
    if key is None:
        key = jax.random.key(0)
    d, F, V = c.d_model, c.d_ff, c.vocab_size

    def dense(k, fan_in, fan_out):
        return (jax.random.normal(k, (fan_in, fan_out), jnp.float32) / math.sqrt(fan_in)).astype(dtype)

    keys = jax.random.split(key, c.n_layers + 2)
    params = {"embed": jax.random.normal(keys[0], (V, d), jnp.float32).astype(dtype), "layers": []}
    for i in range(c.n_layers):
        k = jax.random.split(keys[i + 1], 7)
        params["layers"].append({
            "attn_norm": jnp.ones((d,), dtype),
            "wq": dense(k[0], d, c.q_dim),
            "wk": dense(k[1], d, c.kv_dim),
            "wv": dense(k[2], d, c.kv_dim),
            "wo": dense(k[3], c.q_dim, d),
            "mlp_norm": jnp.ones((d,), dtype),
            "w_gate": dense(k[4], d, F),
            "w_up": dense(k[5], d, F),
            "w_down": dense(k[6], F, d),
        })
    params["final_norm"] = jnp.ones((d,), dtype)
    if not c.tied_embeddings:
        params["head"] = dense(keys[-1], d, V)
    return params


def count_params(params) -> int:
    """Number of scalars in a parameter pytree."""
    return int(sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)))


def param_bytes(params) -> int:
    """Bytes of a parameter pytree."""
    return int(sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(params)))


# -- building blocks ----------------------------------------------------------------------
def rms_norm(x, gain, eps: float):
    """x / sqrt(mean(x^2) + eps) * gain, over the last axis (computed in f32)."""
    xf = x.astype(jnp.float32)
    scale = jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return (xf * scale).astype(x.dtype) * gain


def rope_angles(positions, head_dim: int, theta: float):
    """cos and sin of the rotary angles, shape positions.shape + (head_dim // 2,).

    Pair i of a head (dimensions i and i + h/2) turns by position * theta^(-2i/h)."""
    inv_freq = theta ** (-jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim)
    ang = positions.astype(jnp.float32)[..., None] * inv_freq
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x, cos, sin):
    """Rotate pairs (x[..., i], x[..., i + h/2]) of x [B, S, n, h] by the angles [B or 1, S, h/2]."""
    h2 = x.shape[-1] // 2
    x1, x2 = x[..., :h2], x[..., h2:]
    c, s = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def _attention(q, k, v, q_pos, k_pos, c: TransformerConfig):
    """Grouped-query attention. q [B, S, H, h]; k, v [B, T, K, h]; q_pos [B|1, S], k_pos [T].
    A query attends to keys at positions <= its own. Returns [B, S, H h]."""
    B, S, H, h = q.shape
    K, G = c.n_kv_heads, c.group_size
    qg = q.reshape(B, S, K, G, h)
    scores = jnp.einsum("bskgh,btkh->bkgst", qg, k) / math.sqrt(h)          # 2 B H S T h FLOPs
    mask = k_pos[None, None, None, None, :] <= q_pos[:, None, None, :, None]
    scores = jnp.where(mask, scores.astype(jnp.float32), -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bkgst,btkh->bskgh", probs, v)                         # 2 B H S T h FLOPs
    return out.reshape(B, S, H * h)


def _layer(p, x, cos, sin, q_pos, c: TransformerConfig, kv=None, start=None):
    """One transformer layer. Without ``kv``: causal self-attention over x's own tokens.
    With ``kv = (k_cache, v_cache)`` [B, T, K, h]: the new keys and values are written at
    ``start`` and the queries attend to the whole cache (masked by position).
    Returns (new x, (k_cache, v_cache) or None)."""
    B, S, _ = x.shape
    H, K, h = c.n_heads, c.n_kv_heads, c.head_dim
    y = rms_norm(x, p["attn_norm"], c.norm_eps)
    q = apply_rope((y @ p["wq"]).reshape(B, S, H, h), cos, sin)
    k = apply_rope((y @ p["wk"]).reshape(B, S, K, h), cos, sin)
    v = (y @ p["wv"]).reshape(B, S, K, h)
    if kv is None:
        k_all, v_all, k_pos, new_kv = k, v, jnp.arange(S), None
    else:
        k_all = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), (0, start, 0, 0))
        v_all = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), (0, start, 0, 0))
        k_pos, new_kv = jnp.arange(k_all.shape[1]), (k_all, v_all)
    x = x + _attention(q, k_all.astype(q.dtype), v_all.astype(q.dtype), q_pos, k_pos, c) @ p["wo"]
    y = rms_norm(x, p["mlp_norm"], c.norm_eps)
    x = x + (jax.nn.silu(y @ p["w_gate"]) * (y @ p["w_up"])) @ p["w_down"]
    return x, new_kv


def _check_tokens(tokens, c: TransformerConfig):
    if not hasattr(tokens, "shape") or len(tokens.shape) != 2:
        raise ValueError(f"tokens must be an integer array of shape [batch, seq_len]; got "
                         f"{getattr(tokens, 'shape', type(tokens).__name__)}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must hold integer token ids; got dtype {tokens.dtype}")
    if tokens.shape[0] < 1 or tokens.shape[1] < 1:
        raise ValueError(f"tokens must have batch >= 1 and seq_len >= 1; got shape {tokens.shape}")


def _head(params, x, c: TransformerConfig):
    x = rms_norm(x, params["final_norm"], c.norm_eps)
    w = params["embed"].T if c.tied_embeddings else params["head"]
    return (x @ w).astype(jnp.float32)


# -- forward, loss, training step ---------------------------------------------------------
def forward(params, tokens, config: TransformerConfig):
    """Logits [B, S, V] (f32) for token ids [B, S], causal attention over the sequence."""
    c = get_model(config)
    _check_tokens(tokens, c)
    B, S = tokens.shape
    x = params["embed"][tokens]
    pos = jnp.arange(S)[None, :]
    cos, sin = rope_angles(pos, c.head_dim, c.rope_theta)
    for p in params["layers"]:               # a Python loop: XLA sees (and counts) every layer
        x, _ = _layer(p, x, cos, sin, pos, c)
    return _head(params, x, c)


def loss_fn(params, tokens, targets, config: TransformerConfig):
    """Mean next-token cross-entropy of ``targets`` [B, S] given ``tokens`` [B, S]."""
    logits = forward(params, tokens, config)
    if getattr(targets, "shape", None) != tokens.shape:
        raise ValueError(f"targets must have the shape of tokens {tokens.shape}; got "
                         f"{getattr(targets, 'shape', None)}")
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def train_step(params, tokens, targets, config: TransformerConfig, lr: float = 1e-2):
    """One step of plain stochastic gradient descent (no momentum, no Adam): returns
    (new params, loss).

    Forward and backward cost 3x the forward FLOPs; the update adds 2 FLOPs per parameter
    (a multiply and a subtract), negligible next to 6 N per token times B S tokens."""
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets, config)
    new = jax.tree.map(lambda w, g: (w - lr * g).astype(w.dtype), params, grads)
    return new, loss


# -- KV cache -----------------------------------------------------------------------------
def init_kv_cache(config: TransformerConfig, batch: int, context: int, dtype=jnp.bfloat16) -> list:
    """An empty KV cache: a list of L pairs (k, v), each [batch, context, K, h] of ``dtype``.
    Its size is config.kv_cache_bytes(batch, context, itemsize)."""
    c = get_model(config)
    for name, val in (("batch", batch), ("context", context)):
        if isinstance(val, bool) or not isinstance(val, numbers.Integral) or val < 1:
            raise ValueError(f"{name} must be a positive integer; got {val!r}")
    shape = (batch, context, c.n_kv_heads, c.head_dim)
    return [(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(c.n_layers)]


def cache_bytes(cache) -> int:
    """Bytes held by a KV cache."""
    return param_bytes(cache)


def forward_with_cache(params, tokens, cache, start, config: TransformerConfig):
    """Run ``tokens`` [B, S] at positions start .. start+S-1 against ``cache``: write their
    keys and values into the cache and return (logits [B, S, V], new cache). With start=0
    and the whole prompt this is the prefill; with S = 1 it is one decode step."""
    c = get_model(config)
    _check_tokens(tokens, c)
    B, S = tokens.shape
    T = cache[0][0].shape[1]
    if len(cache) != c.n_layers or cache[0][0].shape[0] != B:
        raise ValueError(f"cache has {len(cache)} layers and batch {cache[0][0].shape[0]}; "
                         f"expected {c.n_layers} layers and batch {B}")
    if isinstance(start, numbers.Integral) and not 0 <= start <= T - S:
        raise ValueError(f"start={start} with {S} new tokens does not fit a cache of "
                         f"context {T}")
    pos = start + jnp.arange(S)[None, :]
    cos, sin = rope_angles(pos, c.head_dim, c.rope_theta)
    x = params["embed"][tokens]
    new_cache = []
    for p, kv in zip(params["layers"], cache):
        x, kv = _layer(p, x, cos, sin, pos, c, kv=kv, start=start)
        new_cache.append(kv)
    return _head(params, x, c), new_cache


def generate_greedy(params, prompt, steps: int, config: TransformerConfig, context=None,
                    cache_dtype=jnp.float32):
    """Greedy decoding with a KV cache: prefill ``prompt`` [B, S], then ``steps`` decode
    steps of one token. Returns (tokens [B, S + steps], cache)."""
    c = get_model(config)
    B, S = prompt.shape
    context = S + steps if context is None else context
    cache = init_kv_cache(c, B, context, cache_dtype)
    step = jax.jit(partial(forward_with_cache, config=c))
    logits, cache = step(params, prompt, cache, 0)
    out = [prompt]
    tok = jnp.argmax(logits[:, -1], axis=-1)[:, None].astype(prompt.dtype)
    for i in range(steps):
        out.append(tok)
        if i == steps - 1:
            break
        logits, cache = step(params, tok, cache, jnp.int32(S + i))
        tok = jnp.argmax(logits[:, -1], axis=-1)[:, None].astype(prompt.dtype)
    return jnp.concatenate(out, axis=1), cache
