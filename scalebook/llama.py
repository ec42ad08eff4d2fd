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

Chapter 7 adds serving: :func:`sharded_forward_with_cache` and
:func:`generate_greedy_sharded` run the KV-cache decode loop on a mesh (weights split over
heads and the MLP width on a "model" axis, the batch over a "data" axis, the cache over
both), and :func:`speculative_generate` decodes greedily with a small draft model
(:func:`draft_from_layers`) whose proposals the target verifies.

Array names: B batch, S sequence (query positions), T cache length (key positions),
d model width, H query heads, K key/value heads, G = H / K, h head size, F MLP width,
V vocabulary.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
import numpy as np

from .models import TransformerConfig, get_model

__all__ = ["init_params", "count_params", "param_bytes", "rms_norm", "rope_angles", "apply_rope",
           "forward", "loss_fn", "train_step", "remat_policy", "init_kv_cache", "cache_bytes", "forward_with_cache",
           "generate_greedy", "XLA_FLOP_TOLERANCE", "decode_shardings", "shard_for_decode",
           "sharded_forward_with_cache", "generate_greedy_sharded", "draft_from_layers",
           "SpeculativeResult", "speculative_generate"]

# How far above the matmul formula XLA's FLOP count of this model (in float32, layers
# unrolled) may lie: the excess is elementwise work (norms, rotary embeddings, softmax,
# SiLU, residual adds, cross-entropy, the update). The tests and chapter 4 use this value.
XLA_FLOP_TOLERANCE = 0.05


# -- parameters ---------------------------------------------------------------------------
def _generator(key) -> np.random.Generator:
    """A NumPy generator seeded by KEY: a JAX PRNG key (``jax.random.key(n)``), a raw
    ``jax.random.PRNGKey(n)``, or an int."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return np.random.default_rng(int(key))
    if hasattr(key, "dtype") and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    data = np.asarray(key)
    if data.dtype.kind not in "ui" or data.size == 0:
        raise TypeError(f"key must be a JAX PRNG key or an int; got {key!r}")
    return np.random.default_rng(data.astype(np.uint64).ravel().tolist())


def init_params(config: TransformerConfig, key=None, dtype=jnp.float32) -> dict:
    """Random parameters for ``config``: a dict of arrays (normal, std 1/sqrt(fan-in);
    norm gains 1). Layout: ``embed`` [V, d]; ``layers``: a list of L dicts with
    ``attn_norm`` [d], ``wq`` [d, H h], ``wk`` and ``wv`` [d, K h], ``wo`` [H h, d],
    ``mlp_norm`` [d], ``w_gate`` and ``w_up`` [d, F], ``w_down`` [F, d]; ``final_norm`` [d];
    ``head`` [d, V] unless the embeddings are tied.

    ``key`` (a JAX PRNG key or an int; default 0) seeds NumPy's generator, which draws the
    values on the host in the order above; they are then placed on the device. Drawing
    with ``jax.random`` would compile a program for every shape, about a second for a small
    model on a CPU, each time a notebook starts."""
    c = get_model(config)
    rng = _generator(0 if key is None else key)
    d, F, V = c.d_model, c.d_ff, c.vocab_size

    def place(x):
        return jax.device_put(np.asarray(x, np.float32).astype(dtype))

    def dense(fan_in, fan_out):
        return place(rng.standard_normal((fan_in, fan_out)) / math.sqrt(fan_in))

    def ones(n):
        return place(np.ones(n))

    params = {"embed": place(rng.standard_normal((V, d))), "layers": []}
    for _ in range(c.n_layers):
        params["layers"].append({
            "attn_norm": ones(d),
            "wq": dense(d, c.q_dim),
            "wk": dense(d, c.kv_dim),
            "wv": dense(d, c.kv_dim),
            "wo": dense(c.q_dim, d),
            "mlp_norm": ones(d),
            "w_gate": dense(d, F),
            "w_up": dense(d, F),
            "w_down": dense(F, d),
        })
    params["final_norm"] = ones(d)
    if not c.tied_embeddings:
        params["head"] = dense(d, V)
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
    With ``kv = (k_cache, v_cache)`` [B_seq, T, H_kv, h]: the new keys and values are
    written at ``start`` and the queries attend to the whole cache (masked by position).
    Returns (new x, (k_cache, v_cache) or None)."""
    B_seq, S, _ = x.shape
    H, H_kv, h = c.n_heads, c.n_kv_heads, c.head_dim
    y = rms_norm(x, p["attn_norm"], c.norm_eps)
    q = apply_rope((y @ p["wq"]).reshape(B_seq, S, H, h), cos, sin)
    k = apply_rope((y @ p["wk"]).reshape(B_seq, S, H_kv, h), cos, sin)
    v = (y @ p["wv"]).reshape(B_seq, S, H_kv, h)
    if kv is None:
        k_all, v_all, k_pos, new_kv = k, v, jnp.arange(S), None
    else:
        k_all = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), (0, start, 0, 0))
        v_all = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), (0, start, 0, 0))
        k_pos, new_kv = jnp.arange(k_all.shape[1]), (k_all, v_all)
    attn = _attention(q, k_all.astype(q.dtype), v_all.astype(q.dtype), q_pos, k_pos, c)
    # named so that a remat policy can keep it: save_only_these_names("attention_out")
    x = x + checkpoint_name(attn, "attention_out") @ p["wo"]
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
def remat_policy(name: str):
    """The ``jax.checkpoint`` policy for one of scalebook.models.REMAT_POLICIES."""
    cp = jax.checkpoint_policies
    policies = {"nothing": cp.nothing_saveable,
                "attention_out": cp.save_only_these_names("attention_out"),
                "weight_dots": cp.dots_with_no_batch_dims_saveable,
                "dots": cp.dots_saveable}
    if name not in policies:
        raise ValueError(f"remat must be None or one of {tuple(policies)}; got {name!r}")
    return policies[name]


def forward(params, tokens, config: TransformerConfig, remat: str | None = None):
    """Logits [B, S, V] (f32) for token ids [B, S], causal attention over the sequence.
    ``remat`` wraps every layer in ``jax.checkpoint`` with :func:`remat_policy` (None: no
    checkpoint, every value the backward pass needs is kept)."""
    c = get_model(config)
    _check_tokens(tokens, c)
    B, S = tokens.shape
    x = params["embed"][tokens]
    pos = jnp.arange(S)[None, :]
    cos, sin = rope_angles(pos, c.head_dim, c.rope_theta)

    def layer(p, x):
        return _layer(p, x, cos, sin, pos, c)[0]
    if remat is not None:
        layer = jax.checkpoint(layer, policy=remat_policy(remat))
    for p in params["layers"]:               # a Python loop: XLA sees (and counts) every layer
        x = layer(p, x)
    return _head(params, x, c)


def loss_fn(params, tokens, targets, config: TransformerConfig, remat: str | None = None):
    """Mean next-token cross-entropy of ``targets`` [B, S] given ``tokens`` [B, S]."""
    logits = forward(params, tokens, config, remat)
    if getattr(targets, "shape", None) != tokens.shape:
        raise ValueError(f"targets must have the shape of tokens {tokens.shape}; got "
                         f"{getattr(targets, 'shape', None)}")
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def train_step(params, tokens, targets, config: TransformerConfig, lr: float = 1e-2,
               remat: str | None = None):
    """One step of plain stochastic gradient descent (no momentum, no Adam): returns
    (new params, loss). ``remat`` as in :func:`forward`.

    Forward and backward cost 3x the forward FLOPs; the update adds 2 FLOPs per parameter
    (a multiply and a subtract), negligible next to 6 N per token times B S tokens."""
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets, config, remat)
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


# -- serving on a mesh (chapter 7) ---------------------------------------------------------
def _check_decode_mesh(c: TransformerConfig, mesh, data_axis: str, model_axis: str):
    names = tuple(getattr(mesh, "axis_names", ()))
    for role, ax in (("data_axis", data_axis), ("model_axis", model_axis)):
        if ax not in names:
            raise ValueError(f"{role}={ax!r} is not an axis of the mesh; its axes are {names}")
    if data_axis == model_axis:
        raise ValueError("data_axis and model_axis must be different mesh axes")
    n = mesh.shape[model_axis]
    if c.n_kv_heads % n or c.d_ff % n or (not c.tied_embeddings and c.vocab_size % n):
        raise ValueError(
            f"the model axis has {n} devices, but {c.name} has n_kv_heads={c.n_kv_heads}, "
            f"d_ff={c.d_ff}, vocab_size={c.vocab_size}: each must divide by {n}. With more "
            f"shards than key/value heads, put the extra factor on the data (batch) axis")
    return n


def decode_shardings(config: TransformerConfig, mesh, data_axis: str = "data",
                     model_axis: str = "model"):
    """PartitionSpecs for serving: (parameter specs, cache spec).

    Weight-stationary 1D tensor parallelism over ``model_axis``: W_q, W_k, W_v and the MLP's
    W_gate, W_up are split by columns (whole heads, and F / n of the MLP), W_o and W_down by
    rows; the output head by columns (vocabulary) unless tied; norms and the embedding are
    replicated. The KV cache [B, T, K, h] is split over the batch on ``data_axis`` and over
    key/value heads on ``model_axis``, so it is cut into (data x model) pieces even when
    there are more devices than key/value heads."""
    from jax.sharding import PartitionSpec as P
    c = get_model(config)
    _check_decode_mesh(c, mesh, data_axis, model_axis)
    m = model_axis
    layer = {"attn_norm": P(), "wq": P(None, m), "wk": P(None, m), "wv": P(None, m),
             "wo": P(m, None), "mlp_norm": P(), "w_gate": P(None, m), "w_up": P(None, m),
             "w_down": P(m, None)}
    specs = {"embed": P(), "layers": [dict(layer) for _ in range(c.n_layers)], "final_norm": P()}
    if not c.tied_embeddings:
        specs["head"] = P(None, m)
    return specs, P(data_axis, None, m, None)


def shard_for_decode(params, cache, config: TransformerConfig, mesh, data_axis: str = "data",
                     model_axis: str = "model"):
    """Place ``params`` and ``cache`` on ``mesh`` with :func:`decode_shardings`."""
    from jax.sharding import NamedSharding
    c = get_model(config)
    p_specs, c_spec = decode_shardings(c, mesh, data_axis, model_axis)
    B = cache[0][0].shape[0]
    if B % mesh.shape[data_axis]:
        raise ValueError(f"the cache's batch {B} does not divide over the {mesh.shape[data_axis]} "
                         f"devices of axis {data_axis!r}")
    # Placed from host (numpy) copies, which jax.device_put cuts into shards on the host: a
    # JAX array on one device would be re-placed by a compiled slicing program per shape.
    params = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x), NamedSharding(mesh, s)),
                          params, p_specs)
    sh = NamedSharding(mesh, c_spec)
    cache = [(jax.device_put(np.asarray(k), sh), jax.device_put(np.asarray(v), sh))
             for k, v in cache]
    return params, cache


def _layer_tp(p, x, cos, sin, q_pos, c: TransformerConfig, kv, start, axis):
    """One layer on one device of the model axis (``c`` counts that device's heads): as
    :func:`_layer` with a cache, plus the two all-reduces (psum) of 1D tensor parallelism,
    after W_o and after W_down."""
    B, S, _ = x.shape
    H, K, h = c.n_heads, c.n_kv_heads, c.head_dim
    y = rms_norm(x, p["attn_norm"], c.norm_eps)
    q = apply_rope((y @ p["wq"]).reshape(B, S, H, h), cos, sin)
    k = apply_rope((y @ p["wk"]).reshape(B, S, K, h), cos, sin)
    v = (y @ p["wv"]).reshape(B, S, K, h)
    k_all = jax.lax.dynamic_update_slice(kv[0], k.astype(kv[0].dtype), (0, start, 0, 0))
    v_all = jax.lax.dynamic_update_slice(kv[1], v.astype(kv[1].dtype), (0, start, 0, 0))
    attn = _attention(q, k_all.astype(q.dtype), v_all.astype(q.dtype), q_pos,
                      jnp.arange(k_all.shape[1]), c)
    x = x + jax.lax.psum(attn @ p["wo"], axis)
    y = rms_norm(x, p["mlp_norm"], c.norm_eps)
    x = x + jax.lax.psum((jax.nn.silu(y @ p["w_gate"]) * (y @ p["w_up"])) @ p["w_down"], axis)
    return x, (k_all, v_all)


def sharded_forward_with_cache(config: TransformerConfig, mesh, data_axis: str = "data",
                               model_axis: str = "model", donate: bool = True):
    """A jitted ``fn(params, tokens, cache, start) -> (logits, cache)`` that does what
    :func:`forward_with_cache` does, on ``mesh`` with :func:`decode_shardings`.

    Per layer it communicates exactly two all-reduces over ``model_axis`` of the
    activations [B / n_data, S, d]; after the head, one all-gather of the logits over
    ``model_axis`` (none when the head is tied to the replicated embedding). ``start`` is
    an int32 scalar (a traced value, so every decode step reuses one compiled program).
    With ``donate`` the cache's buffers are reused for the new cache."""
    from jax.sharding import PartitionSpec as P
    c = get_model(config)
    n = _check_decode_mesh(c, mesh, data_axis, model_axis)
    local = c.scaled(n_heads=c.n_heads // n, n_kv_heads=c.n_kv_heads // n)
    p_specs, c_spec = decode_shardings(c, mesh, data_axis, model_axis)

    def body(params, tokens, cache, start):
        S = tokens.shape[1]
        pos = start + jnp.arange(S)[None, :]
        cos, sin = rope_angles(pos, c.head_dim, c.rope_theta)
        x = params["embed"][tokens]
        new_cache = []
        for p, kv in zip(params["layers"], cache):
            x, kv = _layer_tp(p, x, cos, sin, pos, local, kv, start, model_axis)
            new_cache.append(kv)
        x = rms_norm(x, params["final_norm"], c.norm_eps)
        if c.tied_embeddings:
            return (x @ params["embed"].T).astype(jnp.float32), new_cache
        logits = (x @ params["head"]).astype(jnp.float32)
        return jax.lax.all_gather(logits, model_axis, axis=2, tiled=True, to="invarying"), new_cache

    cache_specs = [(c_spec, c_spec)] * c.n_layers
    fn = jax.shard_map(body, mesh=mesh,
                       in_specs=(p_specs, P(data_axis, None), cache_specs, P()),
                       out_specs=(P(data_axis, None, None), cache_specs))
    jitted = jax.jit(fn, donate_argnums=(2,) if donate else ())

    def run(params, tokens, cache, start):
        _check_tokens(tokens, c)
        if len(cache) != c.n_layers or cache[0][0].shape[0] != tokens.shape[0]:
            raise ValueError(f"cache has {len(cache)} layers and batch {cache[0][0].shape[0]}; "
                             f"expected {c.n_layers} layers and batch {tokens.shape[0]}")
        if tokens.shape[0] % mesh.shape[data_axis]:
            raise ValueError(f"batch {tokens.shape[0]} does not divide over the "
                             f"{mesh.shape[data_axis]} devices of axis {data_axis!r}")
        return jitted(params, tokens, cache, jnp.asarray(start, jnp.int32))

    run.lower = lambda params, tokens, cache, start: jitted.lower(
        params, tokens, cache, jnp.asarray(start, jnp.int32))
    return run


def generate_greedy_sharded(params, prompt, steps: int, config: TransformerConfig, mesh,
                            context=None, cache_dtype=jnp.float32, data_axis: str = "data",
                            model_axis: str = "model"):
    """:func:`generate_greedy` on a mesh: the same prefill and decode loop, with the weights
    and the cache sharded by :func:`decode_shardings`. Returns (tokens [B, S + steps], cache)."""
    c = get_model(config)
    _check_tokens(prompt, c)
    steps = int(steps)
    if steps < 1:
        raise ValueError(f"steps must be a positive integer; got {steps!r}")
    B, S = prompt.shape
    context = S + steps if context is None else context
    cache = init_kv_cache(c, B, context, cache_dtype)
    params, cache = shard_for_decode(params, cache, c, mesh, data_axis, model_axis)
    step = sharded_forward_with_cache(c, mesh, data_axis, model_axis)
    logits, cache = step(params, prompt, cache, 0)
    out = [np.asarray(prompt)]
    # the greedy choice on the host: the logits are small, and eager ops on sharded arrays
    # would each compile a program of their own
    tok = np.asarray(logits)[:, -1].argmax(-1)[:, None].astype(out[0].dtype)
    for i in range(steps):
        out.append(tok)
        if i == steps - 1:
            break
        logits, cache = step(params, jnp.asarray(tok), cache, S + i)
        tok = np.asarray(logits)[:, -1].argmax(-1)[:, None].astype(out[0].dtype)
    return jnp.asarray(np.concatenate(out, axis=1)), cache


# -- speculative decoding (chapter 7) ------------------------------------------------------
def draft_from_layers(params, config: TransformerConfig, n_layers: int):
    """A smaller draft model made of the first ``n_layers`` layers of ``params`` with the
    same embedding, final norm and head (layer-skipping "self-speculative" drafting).
    Returns (draft params, draft config)."""
    c = get_model(config)
    if isinstance(n_layers, bool) or not isinstance(n_layers, numbers.Integral) \
            or not 1 <= n_layers < c.n_layers:
        raise ValueError(f"n_layers must be an integer from 1 to {c.n_layers - 1} (fewer layers "
                         f"than the target's {c.n_layers}); got {n_layers!r}")
    draft = dict(params)
    draft["layers"] = list(params["layers"][:n_layers])
    return draft, c.scaled(name=f"{c.name}-draft{n_layers}", n_layers=int(n_layers))


@dataclass(frozen=True)
class SpeculativeResult:
    """What :func:`speculative_generate` did.

    tokens: [1, S + steps]; accepted: draft tokens the target accepted in each verification
    step (0 .. k); k: draft tokens proposed per step; target_calls, draft_calls: forward
    passes after the prefill (each target call verifies k tokens at once)."""

    tokens: object
    accepted: tuple
    k: int
    target_calls: int
    draft_calls: int

    @property
    def tokens_per_target_call(self) -> float:
        """Tokens produced per verification step: mean of (accepted + 1)."""
        return float(np.mean([a + 1 for a in self.accepted]))

    @property
    def acceptance_rate(self) -> float:
        """Estimate of alpha, the chance that one draft token is accepted given that the ones
        before it were: accepted tokens / tokens the target judged (each step judges
        accepted + 1 of them, or k when all k are accepted)."""
        judged = sum(a + (a < self.k) for a in self.accepted)
        return sum(self.accepted) / judged if judged else float("nan")


@functools.lru_cache(maxsize=32)
def _jitted_step(c: TransformerConfig):
    return jax.jit(partial(forward_with_cache, config=c))


def speculative_generate(target_params, target_config: TransformerConfig, draft_params,
                         draft_config: TransformerConfig, prompt, steps: int, k: int = 4,
                         cache_dtype=jnp.float32) -> SpeculativeResult:
    """Greedy speculative decoding of one sequence (``prompt`` [1, S]).

    Each step the draft proposes ``k`` tokens one at a time; the target runs all of them in
    one forward pass (k + 1 positions) and keeps the longest prefix that equals its own
    greedy choice, then adds its own next token. The output is exactly the target's greedy
    output (:func:`generate_greedy`): only the number of target passes changes. Keys and
    values of rejected tokens stay in the caches, masked by position until overwritten."""
    tc, dc = get_model(target_config), get_model(draft_config)
    _check_tokens(prompt, tc)
    if prompt.shape[0] != 1:
        raise ValueError(f"speculative_generate decodes one sequence; got batch {prompt.shape[0]}")
    if tc.vocab_size != dc.vocab_size:
        raise ValueError(f"the draft's vocabulary ({dc.vocab_size}) must be the target's "
                         f"({tc.vocab_size})")
    for name, val in (("steps", steps), ("k", k)):
        if isinstance(val, bool) or not isinstance(val, numbers.Integral) or val < 1:
            raise ValueError(f"{name} must be a positive integer; got {val!r}")
    S = prompt.shape[1]
    width = k + 1
    # Two compiled programs in all: the target runs k + 1 positions (its prefill too, in
    # chunks of k + 1, the last one padded: the padding's keys and values lie beyond the
    # prompt, masked by position until overwritten), the draft one position at a time.
    context = max(S + steps + k + 1, -(-S // width) * width)
    t_step, d_step = _jitted_step(tc), _jitted_step(dc)
    t_cache = init_kv_cache(tc, 1, context, cache_dtype)
    d_cache = init_kv_cache(dc, 1, context, cache_dtype)
    dt = np.asarray(prompt).dtype
    toks = np.asarray(prompt)
    for start in range(0, S, width):
        chunk = toks[:, start:start + width]
        used = chunk.shape[1]
        chunk = np.pad(chunk, ((0, 0), (0, width - used)))
        logits, t_cache = t_step(target_params, chunk, t_cache, np.int32(start))
    first = int(np.asarray(logits)[0, used - 1].argmax())
    for i in range(S):
        _, d_cache = d_step(draft_params, toks[:, i:i + 1], d_cache, np.int32(i))
    out = [int(t) for t in toks[0]] + [first]
    accepted, t_calls, d_calls = [], 0, 0
    while len(out) - S < steps:
        p = len(out)                       # the last token, out[p - 1], is in no cache yet
        proposal, tok = [], out[-1]
        for i in range(k):                 # the draft proposes k tokens, one at a time
            lg, d_cache = d_step(draft_params, np.array([[tok]], dt), d_cache,
                                 np.int32(p - 1 + i))
            d_calls += 1
            tok = int(np.asarray(lg)[0, -1].argmax())
            proposal.append(tok)
        block = np.array([[out[-1]] + proposal], dt)
        lg, t_cache = t_step(target_params, block, t_cache, np.int32(p - 1))
        t_calls += 1
        best = [int(t) for t in np.asarray(lg)[0].argmax(-1)]             # k + 1 choices
        n = 0
        while n < k and proposal[n] == best[n]:
            n += 1
        accepted.append(n)
        out.extend(proposal[:n] + [best[n]])
        if n == k:                         # the draft has not yet seen its own last proposal
            _, d_cache = d_step(draft_params, np.array([[proposal[-1]]], dt), d_cache,
                                np.int32(p - 1 + k))
            d_calls += 1
    tokens = jnp.array([out[:S + steps]], prompt.dtype)
    return SpeculativeResult(tokens=tokens, accepted=tuple(accepted), k=int(k),
                             target_calls=t_calls, draft_calls=d_calls)
