"""Chapter 3's claims about sharded matmuls and collectives, checked against programs
JAX compiles on the 8-device CPU mesh: the unreduced partial sums, contractions split on
different axes, gathering before or after a matmul, and the transposes of the
collectives under differentiation. Bytes are worked here from the global shapes with the
ring formulas, not read back from the parser's own arithmetic."""

import numpy as np
import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from scalebook import hlo  # noqa: E402

MESH = scalebook.make_mesh((2, 4), ("x", "y"))
X, Y = 2, 4
F32 = 4


def put(a, spec):
    return jax.device_put(a, NamedSharding(MESH, spec))


def operands(i, j, k, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((i, j)).astype(np.float32),
            rng.standard_normal((j, k)).astype(np.float32))


def ag_bytes(gathered_bytes, n):          # ring all-gather: (n - 1) / n of the output
    return (n - 1) / n * gathered_bytes


@pytest.mark.parametrize("shape", [(16, 32, 64), (8, 16, 8)])
def test_unreduced_partial_sums_add_up_to_the_product(shape):
    i, j, k = shape
    a, w = operands(i, j, k)
    f = jax.jit(jax.shard_map(lambda a, w: (a @ w)[None], mesh=MESH,
                              in_specs=(P(None, "y"), P("y", None)),
                              out_specs=P("y", None, None)))
    terms = np.asarray(f(put(a, P(None, "y")), put(w, P("y", None))))
    assert terms.shape == (Y, i, k)
    np.testing.assert_allclose(terms.sum(axis=0), a @ w, rtol=1e-5, atol=1e-4)
    # each term is the product of one quarter of J
    q = j // Y
    for y in range(Y):
        part = a[:, y * q:(y + 1) * q] @ w[y * q:(y + 1) * q]
        np.testing.assert_allclose(terms[y], part, rtol=1e-5, atol=1e-4)
    compiled = f.lower(put(a, P(None, "y")), put(w, P("y", None))).compile()
    assert hlo.collectives(compiled) == []


@pytest.mark.parametrize("out_spec", [P(), P(None, "y")])
def test_contraction_split_on_different_axes_needs_a_collective(out_spec):
    a, w = operands(16, 32, 64)
    f = jax.jit(lambda a, w: a @ w, out_shardings=NamedSharding(MESH, out_spec))
    args = put(a, P(None, "x")), put(w, P("y", None))
    compiled = f.lower(*args).compile()
    np.testing.assert_allclose(compiled(*args), a @ w, rtol=1e-5, atol=1e-4)
    records = hlo.collectives(compiled)
    assert records, "A[I, J_X] W[J_Y, K] cannot be multiplied without moving data"
    assert not any(r.kind == "all-reduce" for r in records)


def gather_before(a, w):
    return jax.lax.all_gather(a, "y", axis=0, tiled=True, to="invarying") @ w


def gather_after(a, w):
    return jax.lax.all_gather(a @ w, "y", axis=0, tiled=True, to="invarying")


@pytest.mark.parametrize("shape", [(16, 32, 64), (16, 64, 8), (8, 8, 8)])
def test_gather_before_and_after_move_the_input_and_the_output(shape):
    i, j, k = shape
    a, w = operands(i, j, k, seed=i + j + k)
    args = put(a, P("y", None)), put(w, P())
    sent = {}
    for name, body in [("before", gather_before), ("after", gather_after)]:
        f = jax.jit(jax.shard_map(body, mesh=MESH, in_specs=(P("y", None), P()),
                                  out_specs=P()))
        compiled = f.lower(*args).compile()
        np.testing.assert_allclose(compiled(*args), a @ w, rtol=1e-5, atol=1e-4)
        (rec,) = hlo.collectives(compiled)
        assert rec.kind == "all-gather" and rec.group_size == Y
        sent[name] = rec.bytes_per_device
    assert sent["before"] == ag_bytes(i * j * F32, Y)
    assert sent["after"] == ag_bytes(i * k * F32, Y)
    # the cheaper plan is the one whose gathered array is smaller: J against K
    assert (sent["before"] < sent["after"]) == (j < k)


@pytest.mark.parametrize("shape", [(16, 32, 64), (32, 16, 8)])
def test_grad_of_an_fsdp_all_gather_is_a_reduce_scatter(shape):
    i, j, k = shape
    a, w = operands(i, j, k, seed=7)

    def fsdp_loss(a_block, w_block):
        w_full = jax.lax.all_gather(w_block, "y", axis=0, tiled=True)
        return jax.lax.psum(jnp.sum(jnp.tanh(a_block @ w_full)), ("x", "y"))

    loss = jax.shard_map(fsdp_loss, mesh=MESH,
                         in_specs=(P(("x", "y"), None), P("y", None)), out_specs=P())
    args = put(a, P(("x", "y"), None)), put(w, P("y", None))
    compiled = jax.jit(jax.grad(loss, argnums=1)).lower(*args).compile()
    by_kind = {}
    for r in hlo.collectives(compiled):
        by_kind.setdefault(r.kind, []).append(r)
    (rs,) = by_kind["reduce-scatter"]
    (ag,) = by_kind["all-gather"]
    assert rs.group_size == ag.group_size == Y
    assert rs.bytes_per_device == ag.bytes_per_device == ag_bytes(j * k * F32, Y)
    (ar,) = by_kind["all-reduce"]                     # the rows of the mesh: over x
    assert ar.group_size == X
    want = jax.grad(lambda w: jnp.sum(jnp.tanh(a @ w)))(w)
    np.testing.assert_allclose(compiled(*args), want, rtol=1e-4, atol=1e-4)


def test_grad_with_the_same_rows_on_every_device_needs_no_reduce_scatter():
    # the chapter's remark: rows invariant over y leave the whole gradient on each
    a, w = operands(16, 32, 64, seed=3)

    def loss_local(a_block, w_block):
        w_full = jax.lax.all_gather(w_block, "y", axis=0, tiled=True, to="invarying")
        return jax.lax.psum(jnp.sum(jnp.tanh(a_block @ w_full)), "x")

    loss = jax.shard_map(loss_local, mesh=MESH, in_specs=(P("x", None), P("y", None)),
                         out_specs=P())
    args = put(a, P("x", None)), put(w, P("y", None))
    compiled = jax.jit(jax.grad(loss, argnums=1)).lower(*args).compile()
    assert not any(r.kind == "reduce-scatter" for r in hlo.collectives(compiled))


TRANSPOSES = [
    (lambda a: jax.lax.all_gather(a, "y", axis=1, tiled=True),
     "all-gather", "reduce-scatter"),
    (lambda a: jax.lax.psum_scatter(a, "y", scatter_dimension=1, tiled=True),
     "reduce-scatter", "all-gather"),
    (lambda a: jax.lax.psum(a, "y"), "all-reduce", "all-reduce"),
]


@pytest.mark.parametrize("body,kind,transposed", TRANSPOSES)
@pytest.mark.parametrize("shape", [(8, 16), (16, 32)])
def test_linear_transpose_of_each_collective(body, kind, transposed, shape):
    a = put(jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape), P("x", "y"))
    f = jax.shard_map(body, mesh=MESH, in_specs=P("x", "y"), out_specs=P("x", "y"),
                      check_vma=False)
    out = jax.eval_shape(f, a)
    ct = put(jnp.ones(out.shape), P("x", "y"))
    (fwd,) = hlo.collectives(jax.jit(f).lower(a).compile())
    (back,) = hlo.collectives(jax.jit(jax.linear_transpose(f, a)).lower(ct).compile())
    assert (fwd.kind, back.kind) == (kind, transposed)
    assert fwd.bytes_per_device == back.bytes_per_device
    block = shape[0] // X * shape[1] // Y * F32
    want = {"all-gather": ag_bytes(Y * block, Y), "reduce-scatter": ag_bytes(block, Y),
            "all-reduce": 2 * ag_bytes(block, Y)}[kind]
    assert fwd.bytes_per_device == want
