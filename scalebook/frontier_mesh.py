"""Chapter 12's two layers, run on the 8-device mesh: a DeepSeek-V3-style mixture of experts
with expert parallelism, and multi-head latent attention (MLA) at decode, absorbed or not.

Mixture of experts (DeepSeek-V3, arXiv:2412.19437, section 2.1.2):

* :func:`init_moe` -- parameters: a router [D, E], a routing bias [E] (used to *choose*
  experts only, as DeepSeek-V3's auxiliary-loss-free balancing does), E gated SwiGLU
  experts ``w_gate``/``w_up`` [E, D, F] and ``w_down`` [E, F, D], and optionally one shared
  expert that every token meets.
* :func:`moe_route` -- sigmoid scores s = sigmoid(x W_router); the k experts with the
  largest s + bias; gates = the chosen s, normalised to sum to 1 over the k chosen.
* :func:`moe_dense` -- the reference: every token through its own k experts (their weights
  gathered per token), no dispatch, no capacity.
* :func:`moe_expert_parallel` -- the same layer under ``jax.shard_map`` (an
  :class:`ExpertParallelMoE`): tokens and experts both split over one mesh axis of n
  devices; each device routes its tokens, packs them into capacity-bounded buffers,
  sends them to the devices holding their experts with one ``all_to_all``, runs its E/n
  experts, sends the results back with a second ``all_to_all`` and combines them with
  the gates. :meth:`ExpertParallelMoE.all_to_alls` compiles it and reads those two
  all-to-alls from the compiled program (:func:`scalebook.hlo.collectives`).
* :func:`moe_kept` -- which (token, expert) pairs the capacity rule keeps, computed
  directly in NumPy from the rule below (a reference for the sharded layer's drops).

The capacity rule. Each device has C = ceil(c b k / E) slots per expert for its own b
tokens (:func:`scalebook.parallelism.moe_capacity` with c the capacity factor), so an
expert receives at most n C rows in all. A device fills the slots in priority order: all
its tokens' first choices (in token order), then all second choices, and so on. A (token,
expert) pair that finds its expert's C slots full is *dropped*: that expert's term is left
out of the token's output (the other experts' terms, with their gates unchanged, and the
shared expert remain; in a full model the residual connection carries the token on). The
sharded layer returns how many pairs each device dropped. A capacity factor of E / k or
more gives C >= b, which no routing can overflow.

Latent attention (DeepSeek-V2, arXiv:2405.04434, section 2.1; V3 uses the same), for a
configuration with the fields of ``models.MLAConfig`` (D, H heads, the latent width d_c =
``kv_rank``, the rotary key width d_r = ``rope_dim``, a head's key width d_n = ``nope_dim``
and value width d_v = ``v_dim``). Simplifications, said here once: the queries come from x
directly (``q_rank`` must be None; DeepSeek-V3 compresses them too), there is no norm on
the latent, and RoPE is chapter 4's (:func:`scalebook.llama.apply_rope`, base
:data:`ROPE_THETA`) on the d_r rotary dimensions only.

* :func:`init_mla`, :func:`mla_latent` (the cache entries of tokens: the latent c [d_c]
  and the rotary key k_R [d_r], shared by all heads), :func:`absorb_mla` (W_UK folded into
  the query projection, W_UV into the output projection), :func:`mla_decode` (one decode
  step against a latent cache; ``absorbed=False``: keys and values materialised from the
  cache; ``absorbed=True``: attention in the latent space).
* :func:`mla_decode_cost` -- FLOPs and bytes of one decode step in each form
  (:class:`DecodeCost`).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from . import collectives as _coll
from . import hlo as _hlo
from .llama import apply_rope, rope_angles
from .models import MLAConfig
from .parallelism import check_divides, moe_all_to_all_bytes, moe_capacity
from .units import check_positive, check_positive_int, dtype_bytes

__all__ = ["init_moe", "moe_route", "moe_dense", "moe_kept", "moe_expert_parallel",
           "ExpertParallelMoE", "MoEOutput", "MoEAllToAlls",
           "MLAConfig", "ROPE_THETA", "init_mla", "absorb_mla", "mla_latent", "mla_decode",
           "DecodeCost", "mla_decode_cost"]


# ------------------------------------------------------------------------------------------
# Mixture of experts: parameters, routing, the dense reference
# ------------------------------------------------------------------------------------------

def _rng(key) -> np.random.Generator:
    if isinstance(key, bool) or not isinstance(key, numbers.Integral):
        raise ValueError(f"key must be an int seed; got {key!r}")
    return np.random.default_rng(int(key))


def init_moe(D: int, F: int, n_experts: int, *, shared_ff: int = 0, key: int = 0,
             dtype=jnp.float32) -> dict:
    """Random parameters of one MoE layer: ``router`` [D, E], ``bias`` [E] (zeros),
    ``w_gate`` and ``w_up`` [E, D, F], ``w_down`` [E, F, D] and, if ``shared_ff`` > 0, a
    shared expert ``shared`` = {``w_gate``, ``w_up`` [D, shared_ff], ``w_down``
    [shared_ff, D]}. Normal values with std 1/sqrt(fan-in), drawn on the host with NumPy
    (seeded by ``key``) so that no program is compiled per shape."""
    D, F = check_positive_int("D", D), check_positive_int("F", F)
    E = check_positive_int("n_experts", n_experts)
    if isinstance(shared_ff, bool) or not isinstance(shared_ff, numbers.Integral) \
            or shared_ff < 0:
        raise ValueError(f"shared_ff must be an integer >= 0 (0: no shared expert); got "
                         f"{shared_ff!r}")
    rng = _rng(key)

    def w(*shape):
        return jnp.asarray(rng.standard_normal(shape) / math.sqrt(shape[-2]), dtype)

    p = {"router": w(D, E), "bias": jnp.zeros((E,), dtype),
         "w_gate": w(E, D, F), "w_up": w(E, D, F), "w_down": w(E, F, D)}
    if shared_ff:
        p["shared"] = {"w_gate": w(D, shared_ff), "w_up": w(D, shared_ff),
                       "w_down": w(shared_ff, D)}
    return p


def _moe_dims(params, x=None) -> tuple:
    """(D, F, E, shared_ff) of ``params`` (arrays or ShapeDtypeStructs), checked; and that
    ``x`` is [T, D]."""
    if not isinstance(params, dict):
        raise ValueError(f"params must be the dict init_moe returns; got {type(params).__name__}")
    missing = [k for k in ("router", "bias", "w_gate", "w_up", "w_down") if k not in params]
    if missing:
        raise ValueError(f"params lack {missing}: pass the dict init_moe returns")
    D, E = params["router"].shape
    F = params["w_gate"].shape[2]
    want = {"bias": (E,), "w_gate": (E, D, F), "w_up": (E, D, F), "w_down": (E, F, D)}
    for name, shape in want.items():
        if tuple(params[name].shape) != shape:
            raise ValueError(f"params[{name!r}] has shape {tuple(params[name].shape)}; with "
                             f"router [D={D}, E={E}] and F={F} it must be {shape}")
    Fs = 0
    if params.get("shared") is not None:
        s = params["shared"]
        Fs = s["w_gate"].shape[1]
        for name, shape in {"w_gate": (D, Fs), "w_up": (D, Fs), "w_down": (Fs, D)}.items():
            if tuple(s[name].shape) != shape:
                raise ValueError(f"params['shared'][{name!r}] has shape "
                                 f"{tuple(s[name].shape)}; it must be {shape}")
    if x is not None and (len(x.shape) != 2 or x.shape[1] != D):
        raise ValueError(f"x must be [tokens, D={D}] (one row per token); got shape "
                         f"{tuple(x.shape)}")
    return D, F, E, Fs


def _top_k(top_k, E) -> int:
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer; got {top_k!r}")
    if top_k > E:
        raise ValueError(f"top_k={top_k} experts per token is more than the {E} experts")
    return int(top_k)


def _route(x, router, bias, k):
    """(experts [T, k], gates [T, k]): top-k of sigmoid scores + bias, gates normalised."""
    s = jax.nn.sigmoid(x @ router)
    _, idx = jax.lax.top_k(s + bias, k)                   # sorted: first choice first
    chosen = jnp.take_along_axis(s, idx, axis=-1)
    return idx, chosen / jnp.sum(chosen, axis=-1, keepdims=True)


_route_jit = jax.jit(_route, static_argnums=3)


def moe_route(params, x, top_k: int):
    """DeepSeek-V3's routing of tokens ``x`` [T, D]: (experts [T, k] int32, first choice
    first; gates [T, k] summing to 1 per token). Scores s = sigmoid(x W_router); the k
    experts with the largest s + bias are chosen (the bias steers the choice only); each
    chosen expert's gate is its s over the sum of the k chosen s."""
    _, _, E, _ = _moe_dims(params, x)
    return _route_jit(x, params["router"], params["bias"], _top_k(top_k, E))


def _swiglu(x, w_gate, w_up, w_down):
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


def moe_dense(params, x, top_k: int, keep=None):
    """The MoE layer's output [T, D] for tokens ``x`` [T, D], computed directly: each token
    through its own k experts (their weights gathered per token), weighted by the gates,
    plus the shared expert. ``keep`` (optional, [T, k] of 0/1, e.g. from :func:`moe_kept`)
    leaves out the pairs it marks 0, as the sharded layer does for dropped pairs.
    Compiled once per shape (``jax.jit``)."""
    _, _, E, _ = _moe_dims(params, x)
    k = _top_k(top_k, E)
    if keep is None:
        keep = np.ones((x.shape[0], k), np.float32)
    elif tuple(np.shape(keep)) != (x.shape[0], k):
        raise ValueError(f"keep must be [tokens, top_k] = {(x.shape[0], k)}; got "
                         f"{tuple(np.shape(keep))}")
    return _moe_dense(params, x, k, keep)


@partial(jax.jit, static_argnums=2)
def _moe_dense(params, x, k, keep):
    idx, gates = _route(x, params["router"], params["bias"], k)
    gates = gates * jnp.asarray(keep, gates.dtype)
    wg, wu, wd = (params[n][idx] for n in ("w_gate", "w_up", "w_down"))   # [T, k, ...]
    h = jax.nn.silu(jnp.einsum("td,tkdf->tkf", x, wg)) * jnp.einsum("td,tkdf->tkf", x, wu)
    y = jnp.einsum("tk,tkd->td", gates, jnp.einsum("tkf,tkfd->tkd", h, wd))
    if params.get("shared") is not None:
        s = params["shared"]
        y = y + _swiglu(x, s["w_gate"], s["w_up"], s["w_down"])
    return y


def moe_kept(experts, n_devices: int, capacity: int):
    """Which routed pairs the capacity rule keeps: a [T, k] bool array for the choices
    ``experts`` [T, k] (from :func:`moe_route`) of T tokens split into ``n_devices``
    contiguous blocks, with ``capacity`` slots per expert per device. Within a block the
    slots fill in priority order (every token's first choice in token order, then every
    second choice, ...); a pair whose expert is full is dropped. Plain NumPy loops: the
    rule as the module docstring states it, independent of the sharded code."""
    e = np.asarray(experts)
    if e.ndim != 2:
        raise ValueError(f"experts must be [tokens, k]; got shape {e.shape}")
    n = check_positive_int("n_devices", n_devices)
    C = check_positive_int("capacity", capacity)
    T, k = e.shape
    b = check_divides("tokens", T, n)
    keep = np.zeros((T, k), bool)
    for dev in range(n):
        used: dict = {}
        for j in range(k):
            for t in range(dev * b, (dev + 1) * b):
                ex = int(e[t, j])
                if used.get(ex, 0) < C:
                    used[ex] = used.get(ex, 0) + 1
                    keep[t, j] = True
    return keep


# ------------------------------------------------------------------------------------------
# Mixture of experts with expert parallelism (shard_map, two all-to-alls)
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MoEOutput:
    """What the sharded layer returns: ``y`` [T, D] (tokens split as x was) and
    ``dropped`` [n], the (token, expert) pairs each device dropped (int32)."""

    y: jax.Array
    dropped: jax.Array


jax.tree_util.register_dataclass(MoEOutput, data_fields=["y", "dropped"], meta_fields=[])


@dataclass(frozen=True)
class MoEAllToAlls:
    """The all-to-alls of one compiled expert-parallel MoE layer (forward), and what the
    book's formula says they should move.

    ``records``: the all-to-all :class:`scalebook.hlo.Collective` records, in program order;
    ``other_kinds``: the kinds of any other collectives found (none expected).
    ``n``: devices along the axis; ``tokens_per_device`` b; ``capacity`` C; ``buffer_shape``
    (E, C, D): the buffer each device sends in each all-to-all; ``element_bytes`` s.
    ``buffer_bytes`` = E C D s, and ``expected_bytes`` = (n - 1)/n of it: the ring-model
    bytes per device of one all-to-all of our buffer. ``formula_bytes``: the book's
    :func:`scalebook.parallelism.moe_all_to_all_bytes` for b tokens, (n - 1)/n b k D s,
    which counts routed tokens, not slots; the two agree when the capacity factor is 1
    and b k / E is a whole number (the buffers then have exactly b k rows).
    """

    records: tuple
    other_kinds: tuple
    n: int
    tokens_per_device: int
    top_k: int
    capacity: int
    buffer_shape: tuple
    element_bytes: float
    buffer_bytes: float
    expected_bytes: float
    formula_bytes: float

    @property
    def hlo_bytes(self) -> tuple:
        """Bytes per device of each all-to-all, from the compiled program's shapes."""
        return tuple(r.bytes_per_device for r in self.records)

    @property
    def matches(self) -> bool:
        """Two all-to-alls, no other collective, each over groups of n devices and moving
        ``expected_bytes`` per device."""
        return (len(self.records) == 2 and not self.other_kinds
                and all(r.group_size == self.n and r.count == 1 for r in self.records)
                and all(math.isclose(b, self.expected_bytes) for b in self.hlo_bytes))

    def lines(self) -> list[str]:
        """A few printable lines (<= 100 characters each)."""
        out = []
        for r in self.records:
            out.append(f"{r.kind} n={r.group_size} {r.dtype}: {len(r.operand_shapes)} "
                       f"blocks of {r.operand_shapes[0]}, {r.bytes_per_device:,.0f} B/device")
        E, C, D = self.buffer_shape
        out.append(f"buffer [E={E}, C={C}, D={D}] x {self.element_bytes:g} B, (n-1)/n of it: "
                   f"{self.expected_bytes:,.0f} B; formula (n-1)/n b k D s: "
                   f"{self.formula_bytes:,.0f} B")
        return out


class ExpertParallelMoE:
    """The MoE layer with its experts and tokens split over mesh axis ``axis``
    (:func:`moe_expert_parallel` builds one). Call it as ``layer(params, x)`` ->
    :class:`MoEOutput`; ``layer.compile(params, x)`` gives the compiled program (arguments
    may be arrays or jax.ShapeDtypeStruct); ``layer.all_to_alls(params, x)`` reads its
    all-to-alls (:class:`MoEAllToAlls`)."""

    def __init__(self, mesh, axis: str, top_k: int, capacity_factor: float):
        if axis not in mesh.axis_names:
            raise ValueError(f"axis {axis!r} is not an axis of the mesh; its axes are "
                             f"{tuple(mesh.axis_names)}")
        self.mesh, self.axis = mesh, axis
        self.n = int(mesh.shape[axis])
        self.top_k = check_positive_int("top_k", top_k)
        self.capacity_factor = check_positive("capacity_factor", capacity_factor)
        self._jitted = {}

    def capacity(self, tokens: int, n_experts: int) -> int:
        """C: slots per expert for the tokens/n tokens of one device,
        ceil(c (tokens/n) k / E) (:func:`scalebook.parallelism.moe_capacity`)."""
        b = check_divides("tokens", tokens, self.n, f"devices of mesh axis {self.axis!r}")
        return moe_capacity(b, n_experts, self.top_k, self.capacity_factor).per_expert

    def _check(self, params, x):
        D, F, E, Fs = _moe_dims(params, x)
        _top_k(self.top_k, E)
        check_divides("n_experts", E, self.n, f"devices of mesh axis {self.axis!r}")
        T = x.shape[0]
        C = self.capacity(T, E)
        return D, F, E, Fs, T, C

    def _fn(self, E, C, shared: bool):
        key = (E, C, shared)
        if key in self._jitted:
            return self._jitted[key]
        P = jax.sharding.PartitionSpec
        a, n, k = self.axis, self.n, self.top_k
        E_loc = E // n

        def body(x, router, bias, wg, wu, wd, *sh):
            b, D = x.shape
            idx, gates = _route(x, router, bias, k)             # [b, k] each
            e = idx.T.reshape(-1)                                # priority order (j, t)
            tok = jnp.tile(jnp.arange(b), k)
            g = gates.T.reshape(-1)
            one = jax.nn.one_hot(e, E, dtype=jnp.int32)          # [k b, E]
            pos = jnp.take_along_axis(jnp.cumsum(one, axis=0), e[:, None], 1)[:, 0] - 1
            keep = pos < C
            slot = jnp.where(keep, pos, C)                       # C: out of range, dropped
            buf = jnp.zeros((E, C, D), x.dtype).at[e, slot].set(x[tok], mode="drop")
            # dispatch: block j of E/n experts goes to device j; we get [n sources, E/n]
            buf = jax.lax.all_to_all(buf, a, 0, 0, tiled=True)
            rows = buf.reshape(n, E_loc, C, D).transpose(1, 0, 2, 3).reshape(E_loc, n * C, D)
            h = jax.nn.silu(jnp.einsum("esd,edf->esf", rows, wg)) * \
                jnp.einsum("esd,edf->esf", rows, wu)
            out = jnp.einsum("esf,efd->esd", h, wd)
            out = out.reshape(E_loc, n, C, D).transpose(1, 0, 2, 3).reshape(E, C, D)
            # combine: each block goes back to the device its tokens came from
            out = jax.lax.all_to_all(out, a, 0, 0, tiled=True)
            got = out[e, jnp.minimum(pos, C - 1)] * (keep * g)[:, None].astype(x.dtype)
            y = jnp.zeros((b, D), x.dtype).at[tok].add(got)
            if sh:
                y = y + _swiglu(x, *sh)
            return y, jnp.sum(~keep, dtype=jnp.int32)[None]

        rep, ex = P(), P(a)
        in_specs = (P(a, None), rep, rep, ex, ex, ex) + ((rep, rep, rep) if shared else ())
        smap = jax.shard_map(body, mesh=self.mesh, in_specs=in_specs,
                             out_specs=(P(a, None), P(a)), check_vma=True)
        # shard_map on an Explicit axis wants its inputs split as in_specs already: put
        # them there (on an Auto axis the partitioner would do it anyway).
        explicit = any(t == jax.sharding.AxisType.Explicit
                       for t in getattr(self.mesh, "axis_types", ()))

        def placed(*args):
            if explicit:
                args = [jax.reshard(v, jax.sharding.NamedSharding(self.mesh, spec))
                        for v, spec in zip(args, in_specs)]
            return smap(*args)

        f = jax.jit(placed)
        self._jitted[key] = f
        return f

    @staticmethod
    def _args(params, x):
        args = [x] + [params[n] for n in ("router", "bias", "w_gate", "w_up", "w_down")]
        if params.get("shared") is not None:
            s = params["shared"]
            args += [s["w_gate"], s["w_up"], s["w_down"]]
        return args

    def __call__(self, params, x) -> MoEOutput:
        _, _, E, Fs, _, C = self._check(params, x)
        y, dropped = self._fn(E, C, Fs > 0)(*self._args(params, x))
        return MoEOutput(y, dropped)

    def compile(self, params, x):
        """The compiled program (jax.stages.Compiled) for these shapes."""
        _, _, E, Fs, _, C = self._check(params, x)
        return self._fn(E, C, Fs > 0).lower(*self._args(params, x)).compile()

    def all_to_alls(self, params, x, compiled=None) -> MoEAllToAlls:
        """Compile the layer (forward) and read its collectives with
        :func:`scalebook.hlo.collectives`.

        What the comparison verifies: that XLA's program holds exactly two all-to-alls,
        each over the n devices of the axis, whose operand shapes (per device) add up to
        our buffer [E, C, D] of the input's dtype, so that the ring-model bytes
        :mod:`scalebook.hlo` derives from them equal (n - 1)/n E C D s. It checks the shapes
        and groups the compiler chose against our formula, not the time or the bytes a
        real network would carry (the (n - 1)/n factor is the ring model, applied to both).
        Use float32 on a CPU: XLA:CPU runs a bf16 all-to-all in f32 (chapter 3), so a bf16
        layer's all-to-alls move twice the bytes s = 2 predicts and ``matches`` is False."""
        D, _, E, _, T, C = self._check(params, x)
        if compiled is None:
            compiled = self.compile(params, x)
        recs = _hlo.collectives(compiled)
        a2a = tuple(r for r in recs if r.kind == "all-to-all")
        others = tuple(r.kind for r in recs if r.kind != "all-to-all")
        s = dtype_bytes(x.dtype)
        b = T // self.n
        nbytes = E * C * D * s
        return MoEAllToAlls(records=a2a, other_kinds=others, n=self.n, tokens_per_device=b,
                            top_k=self.top_k, capacity=C, buffer_shape=(E, C, D),
                            element_bytes=s, buffer_bytes=nbytes,
                            expected_bytes=_coll.ring_bytes("all-to-all", nbytes, self.n),
                            formula_bytes=moe_all_to_all_bytes(b, D, self.top_k, self.n, s))


def moe_expert_parallel(mesh, axis: str, top_k: int,
                        capacity_factor: float = 1.0) -> ExpertParallelMoE:
    """The MoE layer with expert parallelism over mesh axis ``axis`` (n devices).

    ``layer = moe_expert_parallel(mesh, "x", top_k=2)``; ``layer(params, x)`` takes the
    parameters of :func:`init_moe` (E divisible by n) and tokens ``x`` [T, D] (T divisible
    by n) and returns :class:`MoEOutput` (y [T, D], dropped [n]). Inside ``jax.shard_map``
    each device holds T/n tokens and E/n experts (``w_*`` split over ``axis`` along E; the
    router, bias and shared expert replicated), routes its tokens, packs them into an
    [E, C, D] buffer (capacity rule: module docstring), and exchanges it twice with
    ``jax.lax.all_to_all`` (dispatch, then combine). Other mesh axes, if any, hold copies.
    """
    return ExpertParallelMoE(mesh, axis, top_k, capacity_factor)


# ------------------------------------------------------------------------------------------
# Multi-head latent attention at decode
# ------------------------------------------------------------------------------------------

# The layer's shapes come from models.MLAConfig (chapter 12's DeepSeek-V3 shapes): d_model,
# n_heads, kv_rank (d_c), rope_dim (d_r), nope_dim (d_n), v_dim (d_v), n_layers, q_rank.
# RoPE's base for the d_r rotary dimensions (DeepSeek-V3 uses 10,000 before its context
# extension; the toy layer needs only some base).
ROPE_THETA = 10000.0
_MLA_FIELDS = ("d_model", "n_heads", "kv_rank", "rope_dim", "nope_dim", "v_dim")
_MLA_KEYS = ("w_q", "w_qr", "w_dkv", "w_kr", "w_uk", "w_uv", "w_o")
_ABSORBED_KEYS = ("w_qk", "w_qr", "w_dkv", "w_kr", "w_ov")


def _cfg(cfg):
    """(D, H, d_c, d_r, d_n, d_v) of an MLA configuration, checked."""
    missing = [f for f in _MLA_FIELDS if not hasattr(cfg, f)]
    if missing:
        raise ValueError(f"cfg must be an MLAConfig (fields {', '.join(_MLA_FIELDS)}); "
                         f"{type(cfg).__name__} lacks {missing}")
    dims = tuple(check_positive_int(f, getattr(cfg, f)) for f in _MLA_FIELDS)
    if dims[3] % 2:
        raise ValueError(f"rope_dim must be even (RoPE turns pairs of dimensions); got "
                         f"{dims[3]}")
    if getattr(cfg, "q_rank", None) is not None:
        raise ValueError(f"this small MLA layer takes its queries from x directly: give a "
                         f"config with q_rank=None (got q_rank={cfg.q_rank})")
    return dims


def init_mla(cfg, key: int = 0, dtype=jnp.float32) -> dict:
    """Random parameters of one MLA layer for ``cfg`` (an ``models.MLAConfig`` with
    ``q_rank=None``): ``w_q`` [D, H, d_n] and ``w_qr`` [D, H, d_r] (queries: the part
    matched against the latent's keys and the rotary part), ``w_dkv`` [D, d_c] (down to the
    latent), ``w_kr`` [D, d_r] (the rotary key all heads share), ``w_uk`` [d_c, H, d_n] and
    ``w_uv`` [d_c, H, d_v] (up-projections to keys and values), ``w_o`` [H, d_v, D]. Std
    1/sqrt(fan-in), NumPy's generator seeded by ``key``."""
    D, H, dc, dr, dn, dv = _cfg(cfg)
    rng = _rng(key)

    def w(shape, fan_in):
        return jnp.asarray(rng.standard_normal(shape) / math.sqrt(fan_in), dtype)

    return {"w_q": w((D, H, dn), D), "w_qr": w((D, H, dr), D), "w_dkv": w((D, dc), D),
            "w_kr": w((D, dr), D), "w_uk": w((dc, H, dn), dc), "w_uv": w((dc, H, dv), dc),
            "w_o": w((H, dv, D), H * dv)}


def _check_params(params, keys):
    if not isinstance(params, dict) or any(k not in params for k in keys):
        other = "absorb_mla(cfg, params)" if "w_qk" in keys else "init_mla(cfg)"
        raise ValueError(f"params must hold {', '.join(keys)} (from {other}); got "
                         f"{sorted(params) if isinstance(params, dict) else type(params)}")


def absorb_mla(cfg, params) -> dict:
    """The absorbed weights, computed once (not per step): ``w_qk`` [D, H, d_c] = W_Q W_UK^T
    per head, so that a query meets the latent directly (q_i . (W_UK,i^T c) =
    (W_UK,i q_i) . c), and ``w_ov`` [H, d_c, D] = W_UV W_O per head, so that the
    attention-weighted latent goes straight to the output. ``w_qr``, ``w_dkv``, ``w_kr``
    are kept as they are."""
    _cfg(cfg)
    _check_params(params, _MLA_KEYS)
    return _absorb({k: params[k] for k in _MLA_KEYS})


@jax.jit
def _absorb(params):
    return {"w_qk": jnp.einsum("dhe,che->dhc", params["w_q"], params["w_uk"]),
            "w_ov": jnp.einsum("chv,hvd->hcd", params["w_uv"], params["w_o"]),
            "w_qr": params["w_qr"], "w_dkv": params["w_dkv"], "w_kr": params["w_kr"]}


def mla_latent(cfg, params, x, start: int = 0):
    """The cache entries of tokens ``x`` [B, S, D] at positions start .. start + S - 1:
    (c [B, S, d_c], k_R [B, S, d_r]), the latent and the rotated shared key, all the cache
    keeps per token and layer ((d_c + d_r) s bytes)."""
    D, _, _, dr, _, _ = _cfg(cfg)
    _check_params(params, ("w_dkv", "w_kr"))
    if len(x.shape) != 3 or x.shape[2] != D:
        raise ValueError(f"x must be [B, S, D={D}]; got shape {tuple(x.shape)}")
    if isinstance(start, bool) or not isinstance(start, numbers.Integral) or start < 0:
        raise ValueError(f"start must be an integer >= 0 (the first token's position); got "
                         f"{start!r}")
    return _latent(params["w_dkv"], params["w_kr"], x, int(start))


@partial(jax.jit, static_argnums=3)
def _latent(w_dkv, w_kr, x, start):
    S, dr = x.shape[1], w_kr.shape[1]
    cos, sin = rope_angles(jnp.arange(start, start + S)[None, :], dr, ROPE_THETA)
    kr = apply_rope((x @ w_kr)[:, :, None, :], cos, sin)[:, :, 0, :]
    return x @ w_dkv, kr


def _check_cache(dims, x, cache):
    D, _, dc, dr, _, _ = dims
    if not (isinstance(cache, (tuple, list)) and len(cache) == 2):
        raise ValueError("cache must be (c [B, T, d_c], k_R [B, T, d_r]) from mla_latent")
    lat, kr = cache
    if len(x.shape) != 2 or x.shape[1] != D:
        raise ValueError(f"x must be [B, D={D}] (one new token per sequence); got shape "
                         f"{tuple(x.shape)}")
    B = x.shape[0]
    if len(lat.shape) != 3 or (lat.shape[0], lat.shape[2]) != (B, dc) or \
            tuple(kr.shape) != (B, lat.shape[1], dr):
        raise ValueError(f"cache must be c [B={B}, T, d_c={dc}] and k_R [B, T, d_r={dr}]; "
                         f"got {tuple(lat.shape)} and {tuple(kr.shape)}")
    return B, lat.shape[1]


def mla_decode(cfg, params, x, cache, absorbed: bool = False):
    """One decode step: the new tokens ``x`` [B, D] (one per sequence, at position T - 1)
    attend to ``cache`` = (c [B, T, d_c], k_R [B, T, d_r]) from :func:`mla_latent`, whose
    last entry is their own. Returns the attention output [B, D].

    ``absorbed=False`` (``params`` from :func:`init_mla`): keys c W_UK [B, T, H, d_n] and
    values c W_UV [B, T, H, d_v] are materialised from the cache and attention runs per
    head as usual. ``absorbed=True`` (``params`` from :func:`absorb_mla`): each head's
    query is taken into the latent space (x W_QK, [B, H, d_c]), scores are taken against c
    itself, and the weighted sum of c, [B, H, d_c], goes through W_OV: no [B, T, H, ...]
    array exists. Both add the rotary part q_R . k_R and scale by 1/sqrt(d_n + d_r)."""
    dims = _cfg(cfg)
    if not isinstance(absorbed, bool):
        raise ValueError(f"absorbed must be True or False; got {absorbed!r}")
    _check_params(params, _ABSORBED_KEYS if absorbed else _MLA_KEYS)
    _check_cache(dims, x, cache)
    keys = _ABSORBED_KEYS if absorbed else _MLA_KEYS
    return _decode({k: params[k] for k in keys}, x, tuple(cache), dims[4], absorbed)


@partial(jax.jit, static_argnums=(3, 4))
def _decode(params, x, cache, dn, absorbed):
    lat, kr = cache
    T, dr = lat.shape[1], kr.shape[2]
    cos, sin = rope_angles(jnp.full((1, 1), T - 1), dr, ROPE_THETA)
    qr = apply_rope(jnp.einsum("bd,dhr->bhr", x, params["w_qr"])[:, None], cos, sin)[:, 0]
    scale = 1.0 / math.sqrt(dn + dr)
    rope_scores = jnp.einsum("bhr,btr->bht", qr, kr)
    if absorbed:
        ql = jnp.einsum("bd,dhc->bhc", x, params["w_qk"])
        p = jax.nn.softmax((jnp.einsum("bhc,btc->bht", ql, lat) + rope_scores) * scale, -1)
        return jnp.einsum("bhc,hcd->bd", jnp.einsum("bht,btc->bhc", p, lat), params["w_ov"])
    q = jnp.einsum("bd,dhe->bhe", x, params["w_q"])
    k = jnp.einsum("btc,che->bthe", lat, params["w_uk"])
    v = jnp.einsum("btc,chv->bthv", lat, params["w_uv"])
    p = jax.nn.softmax((jnp.einsum("bhe,bthe->bht", q, k) + rope_scores) * scale, -1)
    return jnp.einsum("bhv,hvd->bd", jnp.einsum("bht,bthv->bhv", p, v), params["w_o"])


@dataclass(frozen=True)
class DecodeCost:
    """FLOPs and bytes of one MLA decode step (B sequences, T cached positions).

    ``flops``: the matmuls' (2 per multiply-add; softmax and RoPE left out). Bytes, each
    array read or written once: ``weight_bytes`` (the weights this form uses),
    ``cache_bytes`` (the latent cache, B T (d_c + d_r) s), ``io_bytes`` (x in, the output
    out, B D s each), ``materialised_bytes`` (unabsorbed only: keys and values
    [B, T, H, d_n + d_v] written and read back once; a kernel that fused the up-projection
    into attention would save these bytes, not the FLOPs)."""

    flops: float
    weight_bytes: float
    cache_bytes: float
    io_bytes: float
    materialised_bytes: float

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.cache_bytes + self.io_bytes + self.materialised_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / self.bytes


def mla_decode_cost(cfg, batch: int, context: int, absorbed: bool,
                    bytes_per_element: float = 4) -> DecodeCost:
    """FLOPs and bytes of :func:`mla_decode` for ``batch`` (B) sequences against
    ``context`` (T) cached positions, in one form.

    Unabsorbed: queries 2BDH(d_n + d_r); keys and values from the cache 2BT d_c H (d_n +
    d_v); scores 2BHT(d_n + d_r); weighted values 2BHT d_v; output 2BH d_v D. Absorbed:
    queries 2BDH(d_c + d_r); scores 2BHT(d_c + d_r); weighted latent 2BHT d_c; output
    2BH d_c D. Weights, each read once per step whatever B: unabsorbed W_Q, W_QR, W_UK,
    W_UV, W_O; absorbed W_QK, W_QR, W_OV."""
    D, H, dc, dr, dn, dv = _cfg(cfg)
    B = check_positive_int("batch", batch)
    T = check_positive_int("context", context)
    if not isinstance(absorbed, bool):
        raise ValueError(f"absorbed must be True or False; got {absorbed!r}")
    s = check_positive("bytes_per_element", bytes_per_element)
    if absorbed:
        flops = 2 * B * H * (D * (dc + dr) + T * (dc + dr) + T * dc + dc * D)
        weights = D * H * (dc + dr) + H * dc * D
        mat = 0
    else:
        flops = 2 * B * H * (D * (dn + dr) + T * dc * (dn + dv) + T * (dn + dr) + T * dv
                             + dv * D)
        weights = D * H * (dn + dr) + dc * H * (dn + dv) + H * dv * D
        mat = 2 * B * T * H * (dn + dv)
    return DecodeCost(flops=float(flops), weight_bytes=weights * s,
                      cache_bytes=B * T * (dc + dr) * s, io_bytes=2 * B * D * s,
                      materialised_bytes=mat * s)
