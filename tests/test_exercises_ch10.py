"""Chapter 10's exercise checks accept right answers, reject typical wrong ones with their
specific hints, and never raise.

Right answers are worked here by hand from the chip and model figures (closed forms, not the
scalebook functions the references use). Code answers run on the 8-device CPU mesh."""

import math

import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import P  # noqa: E402

from exercise_harness import slip_battery_tests  # noqa: E402
from scalebook.exercises import evaluate  # noqa: E402
from scalebook.hardware import get_chip  # noqa: E402

v5p, h100 = get_chip("tpu-v5p"), get_chip("gpu-h100")
W5p, C5p = v5p.ici_link_bandwidth, v5p.bf16_flops
v5e = get_chip("tpu-v5e")                    # 10.3: not the v5p of section 10.6's table
W5e, C5e = v5e.ici_link_bandwidth, v5e.bf16_flops
NVLINK, DCN = h100.ici_link_bandwidth * h100.ici_links, h100.dcn_bandwidth
# LLaMA-3 70B (paper, Table 3; heads from the reference code)
D, F, H, K, h, L = 8192, 28672, 64, 8, 128, 80
W_LAYER = (D * H * h + 2 * D * K * h + H * h * D + 3 * D * F) * 2     # bf16, no norm vectors
# LLaMA-3 405B (paper, Table 3): D 16384, F 53248, 128 heads, 8 KV heads of 128
W_405 = (16384 * 128 * 128 * 2 + 2 * 16384 * 8 * 128 + 3 * 16384 * 53248) * 2

RIGHT = {
    "10.1": 31 / 32 * (W_LAYER / 4) / (2 * W5p),
    "10.2": 2 * L * 2 * 7 / 8 * 128 * D * 2 / NVLINK,
    "10.3": 4 * 2 * C5e / (4 * W5e),           # chunk send B D s/(2nW) = chunk matmul 2BDF/(n^2 C)
    "10.4": 7 / 8 * (W_405 / 8) / DCN,
    "10.5": "y",
}
RTOL = {"10.1": 0.015, "10.2": 0.03, "10.3": 0.03, "10.4": 0.03}

HINTS = {   # a typical mistake and a phrase its hint must contain
    "10.1": [(4 * RIGHT["10.1"], "n_model = 4"), (2 * RIGHT["10.1"], "one-way ring"),
             (127 / 128 * (W_LAYER / 4) / (2 * W5p), "32 chips of 'data'"),
             (RIGHT["10.1"] * 32 / 31, "(n - 1) / n")],
    "10.2": [(RIGHT["10.2"] / 80, "all 80 layers"), (RIGHT["10.2"] / 160, "all 80 layers"),
             (RIGHT["10.2"] / 2, "two all-reduces"), (RIGHT["10.2"] * 18, "all 18"),
             # four all-reduces per layer, as in a training step (chapter 9's 9.1)
             (RIGHT["10.2"] * 2, "forward pass only")],
    "10.3": [(2 * RIGHT["10.3"], "each way"), (0.75 * RIGHT["10.3"], "one chunk's send"),
             (4 * RIGHT["10.3"], "not all of A"), (RIGHT["10.3"] / 4, "1/n of the chip's whole")],
    "10.4": [(RIGHT["10.4"] * DCN / NVLINK, "W_dcn"), (8 * RIGHT["10.4"], "n_model = 8"),
             (RIGHT["10.4"] / 2, "one-way ring")],
    "10.5": [("x", "still differs along 'y'"), ("both", "[8, 16]"), ("none", "all 8 devices"),
             ("invarying", "one of")],
}

# The standard slip battery on every numeric exercise (tests/exercise_harness.py), with
# the mistakes above as the chapter's known pitfalls.
globals().update(slip_battery_tests(10, {ex: [a for a, _ in v if not isinstance(a, str)]
                                         for ex, v in HINTS.items()}))


@pytest.mark.parametrize("ex", sorted(RIGHT))
def test_right_answers_are_accepted(ex):
    r = evaluate(ex, RIGHT[ex])
    assert r.correct, r


@pytest.mark.parametrize("ex,answer,phrase", [(k, a, p) for k, v in HINTS.items() for a, p in v])
def test_typical_mistakes_get_their_hint(ex, answer, phrase):
    r = evaluate(ex, answer)
    assert r.status == "wrong" and phrase in r.message, r


@pytest.mark.parametrize("ex", sorted(RTOL))
def test_tolerance_boundary(ex):
    for sign in (1, -1):
        assert not evaluate(ex, RIGHT[ex] * (1 + sign * 1.1 * RTOL[ex])).correct
        assert evaluate(ex, RIGHT[ex] * (1 + sign * 0.9 * RTOL[ex])).correct


@pytest.mark.parametrize("ex", ["10.%d" % i for i in range(1, 11)])
def test_unanswered_and_malformed(ex):
    assert evaluate(ex, ...).status == "not attempted"
    for bad in ("12", None, float("nan")):
        r = evaluate(ex, bad)
        assert r.status in ("wrong", "not attempted") and r.message, (bad, r)


def test_10_1_variant():
    params = {"n_data": 16, "n_model": 8, "chip": "tpu-v5e"}
    w5e = get_chip("tpu-v5e").ici_link_bandwidth
    right = 15 / 16 * (W_LAYER / 8) / (2 * w5e)
    assert evaluate("10.1", right, variant=params).correct
    assert not evaluate("10.1", RIGHT["10.1"], variant=params).correct
    assert "n_model = 8" in evaluate("10.1", 8 * right, variant=params).message
    assert "16 chips of 'data' only, not over all 128" in evaluate(
        "10.1", 127 / 128 * (W_LAYER / 8) / (2 * w5e), variant=params).message


def test_10_4_variant():
    params = {"n_nodes": 4, "chip": "gpu-a100", "model": "llama3-8b"}
    a100 = get_chip("gpu-a100")
    w8 = (4096 * 32 * 128 * 2 + 2 * 4096 * 8 * 128 + 3 * 4096 * 14336) * 2
    right = 3 / 4 * (w8 / 8) / a100.dcn_bandwidth
    assert evaluate("10.4", right, variant=params).correct
    nvlink = right * a100.dcn_bandwidth / (a100.ici_link_bandwidth * a100.ici_links)
    assert "W_dcn" in evaluate("10.4", nvlink, variant=params).message


def test_10_4_is_not_one_step_from_section_10_9():
    """Section 10.9 prints 70B's FSDP gathers over 'data' on H100s (data = 16); the
    exercise's own numbers are 405B's, so no ring factor turns a printed time into it."""
    seventy = 7 / 8 * (W_LAYER / 8) / DCN
    assert not evaluate("10.4", seventy).correct
    assert abs(RIGHT["10.4"] / seventy - 1) > 0.5


# ---- code exercises on the mesh -----------------------------------------------------------
def tp_right(x, w1, w2):
    """x[B_X, D_Y] @ W1[D_Y, F]: partial sums over D, all-reduced before the relu; then
    this device's D/4 columns of W2."""
    return jax.nn.relu(jax.lax.psum(x @ w1, "y")) @ w2


def cm_right(a, w):
    n, i, c = 4, jax.lax.axis_index("y"), a.shape[1]
    acc = 0
    for k in range(n):
        acc = acc + a @ jax.lax.dynamic_slice_in_dim(w, ((i + k) % n) * c, c, axis=0)
        if k < n - 1:
            a = jax.lax.ppermute(a, "y", [(j, (j - 1) % n) for j in range(n)])
    return acc


def cm_wrong_rows(a, w):
    """Passes chunks to the left but multiplies by the rows of the chunk's old owner."""
    n, i, c = 4, jax.lax.axis_index("y"), a.shape[1]
    acc = 0
    for k in range(n):
        acc = acc + a @ jax.lax.dynamic_slice_in_dim(w, ((i - k) % n) * c, c, axis=0)
        if k < n - 1:
            a = jax.lax.ppermute(a, "y", [(j, (j - 1) % n) for j in range(n)])
    return acc


def cm_k_hops(a, w):
    """Sends each device's own chunk k hops in one permute at step k: right numbers, three
    permutes of one chunk each, but the second one jumps 2 positions along 'y'."""
    n, i, c = 4, jax.lax.axis_index("y"), a.shape[1]
    acc = a @ jax.lax.dynamic_slice_in_dim(w, i * c, c, axis=0)
    for k in range(1, n):
        got = jax.lax.ppermute(a, "y", [(j, (j - k) % n) for j in range(n)])
        acc = acc + got @ jax.lax.dynamic_slice_in_dim(w, ((i + k) % n) * c, c, axis=0)
    return acc


def _cm_loop(a, w, sends):
    """The collective matmul's loop: SENDS steps of multiply-then-send on the 4 devices of
    "y"; returns (the chunk held last, the partial sum)."""
    n, i, c = 4, jax.lax.axis_index("y"), a.shape[1]
    to_left = [(j, (j - 1) % n) for j in range(n)]

    def step(k, carry):
        a, acc = carry
        acc = acc + a @ jax.lax.dynamic_slice_in_dim(w, ((i + k) % n) * c, c, axis=0)
        return jax.lax.ppermute(a, "y", to_left), acc

    zero = jax.lax.pcast(jnp.zeros((a.shape[0], w.shape[1]), a.dtype), ("x", "y"),
                         to="varying")
    return jax.lax.fori_loop(0, sends, step, (a, zero))


def cm_fori_loop(a, w):
    """The collective matmul as a fori_loop of 3 send-and-multiply steps and a last
    multiply: the compiled program runs one permute and one matmul 3 times each."""
    n, i, c = 4, jax.lax.axis_index("y"), a.shape[1]
    a, acc = _cm_loop(a, w, n - 1)
    return acc + a @ jax.lax.dynamic_slice_in_dim(w, ((i + n - 1) % n) * c, c, axis=0)


def cm_fori_loop_one_send_too_many(a, w):
    """The loop runs n times, each with a send: the last send moves a chunk nobody uses,
    4 permutes run where 3 are needed."""
    return _cm_loop(a, w, 4)[1]


def cm_right_the_other_way(a, w):
    """Chunks go right instead of left: neighbours too, so right."""
    n, i, c = 4, jax.lax.axis_index("y"), a.shape[1]
    acc = 0
    for k in range(n):
        acc = acc + a @ jax.lax.dynamic_slice_in_dim(w, ((i - k) % n) * c, c, axis=0)
        if k < n - 1:
            a = jax.lax.ppermute(a, "y", [(j, (j + 1) % n) for j in range(n)])
    return acc


def cm_python_slice(a, w):
    """Takes the chunk's rows of w with Python slicing at a traced start: JAX refuses."""
    n, i, c = 4, jax.lax.axis_index("y"), a.shape[1]
    acc = 0
    for k in range(n):
        acc = acc + a @ w[((i + k) % n) * c:((i + k) % n + 1) * c]
        if k < n - 1:
            a = jax.lax.ppermute(a, "y", [(j, (j - 1) % n) for j in range(n)])
    return acc


def cm_gather_by_permutes(a, w):
    """Gathers A with three permutes, then one matmul: right numbers, nothing overlapped."""
    n, i = 4, jax.lax.axis_index("y")
    chunks, c = [a], a
    for _ in range(n - 1):
        c = jax.lax.ppermute(c, "y", [(j, (j - 1) % n) for j in range(n)])
        chunks.append(c)
    # after k steps device i holds chunk (i + k) % n: roll them into place
    order = jnp.stack(chunks)                                    # [n, B, D/n], order i, i+1, ...
    full = jnp.roll(order, i, axis=0)                            # chunk j at position j
    full = jnp.concatenate([full[j] for j in range(n)], axis=1)  # [B, D]
    return full @ w


CODE_RIGHT = {
    "10.6": tp_right,
    "10.7": cm_right,
    "10.8": lambda: P("data", None, None, None),
    "10.9": lambda a, b: jnp.einsum("bd,df->bf", a, b, out_sharding=P(("x", "y"), None)),
    "10.10": lambda x: jax.lax.all_to_all(x, "y", 1, 0, tiled=True),
}

CODE_WRONG = {   # (wrong answer, a phrase its message must contain)
    "10.6": [(lambda x, w1, w2: jax.nn.relu(jax.lax.psum(x @ w1, "x")) @ w2, "'y' splits"),
             # the sum over both axes: it also adds up rows of the two batch halves
             (lambda x, w1, w2: jax.nn.relu(jax.lax.psum(x @ w1, ("x", "y"))) @ w2,
              "different rows of x"),
             # section 10.4's answer on this layout: the relu of partial sums
             (lambda x, w1, w2: jax.lax.psum(jax.nn.relu(x @ w1), "y") @ w2,
              "relu of a partial sum"),
             (lambda x, w1, w2: jax.nn.relu(x @ w1) @ w2, "the whole sum"),
             # gather x along D, and w1's rows: right numbers, two gathers
             (lambda x, w1, w2: jax.nn.relu(
                 jax.lax.all_gather(x, "y", axis=1, tiled=True)
                 @ jax.lax.all_gather(w1, "y", axis=0, tiled=True)) @ w2,
              "no gather is needed"),
             # an extra sum (of x) that XLA combines with the right one: more bytes
             (lambda x, w1, w2: jax.nn.relu(jax.lax.psum(x @ w1, "y"))
              @ w2 + 0 * jax.lax.psum(x, "y").sum(), "[B/2, F] partial sums")],
    "10.7": [(lambda a, w: jax.lax.all_gather(a, "y", axis=1, tiled=True) @ w, "plain version"),
             (cm_wrong_rows, "wrong numbers"),
             (lambda a, w: a @ w, "D/4 rows"),
             (cm_gather_by_permutes, "hides nothing"),
             (cm_k_hops, "2 hops along 'y'"),
             (cm_fori_loop_one_send_too_many, "(4 do)"),
             (cm_python_slice, "dynamic_slice_in_dim")],
    "10.8": [(lambda: P("data", "model", None, None), "communicates"),
             (lambda: P("data", None, None, "model"), "communicates"),
             # section 10.9's decode layout: the KV heads cannot be split 4 ways here
             (lambda: P("data", None, "model", None), "only 1 or 2 KV heads"),
             (lambda: P(None, None, None, None), "whole cache"),
             (lambda: P(("data", "model"), None, None, None), "batch over 'data' only"),
             (lambda: P("batch", None, None, None), "'data' and 'model'"),
             (lambda: "data", "jax.P(...)")],
    "10.9": [(lambda a, b: jnp.einsum("bd,df->bf", a, b), "out_sharding="),
             (lambda a, b: jnp.einsum("bd,df->bf", a, b, out_sharding=P("x", None)),
              "tuple of the axes"),
             (lambda a, b: jnp.einsum("bd,df->bf", a, b, out_sharding=P("x", "y")),
              "tuple of the axes"),
             # reshard the inputs first: right sharding, but all-gathers
             (lambda a, b: jax.reshard(jax.reshard(a, P("x", None)) @ jax.reshard(b, P()),
                                       P(("x", "y"), None)), "the program gathers")],
    "10.10": [(lambda x: jax.lax.all_to_all(x, "y", 0, 1, tiled=True),
               "which dimension must end up split (the heads)"),
              (lambda x: jax.lax.dynamic_slice_in_dim(
                  jax.lax.all_gather(x, "y", tiled=True),
                  jax.lax.axis_index("y") * (x.shape[1] // 4), x.shape[1] // 4, axis=1),
               "n times more")],
}


@pytest.mark.parametrize("ex", sorted(CODE_RIGHT))
def test_code_right_answers(ex):
    r = evaluate(ex, CODE_RIGHT[ex])
    assert r.correct, r
    assert "3 shapes" in r.message


@pytest.mark.parametrize("ex,answer,phrase", [(k, a, p) for k, v in CODE_WRONG.items()
                                              for a, p in v])
def test_code_wrong_answers_get_their_hint(ex, answer, phrase):
    r = evaluate(ex, answer)
    assert r.status == "wrong" and phrase in r.message, r


def test_10_7_accepts_neighbour_sends_either_way_round():
    r = evaluate("10.7", cm_right_the_other_way)
    assert r.correct, r


def test_10_7_accepts_a_fori_loop():
    """The matmuls and permutes are counted as often as they run (loop trip counts), so a
    loop is judged like the unrolled version."""
    r = evaluate("10.7", cm_fori_loop)
    assert r.correct, r


@pytest.mark.parametrize("ex", sorted(CODE_RIGHT))
def test_code_stub_is_not_attempted(ex):
    def stub(*args):
        ...
    assert evaluate(ex, stub).status == "not attempted"
    assert evaluate(ex, 3).status == "wrong"


def test_10_5_reference_is_what_shard_map_does():
    """psum over 'x' leaves a value varying over 'y' only: out_specs P(None, 'y') gives the
    [4, 16] sum, P('x', 'y') two stacked copies, P('x', None) and P() are refused."""
    import numpy as np
    mesh = scalebook.make_mesh((2, 4), ("x", "y"))
    a = jnp.arange(128.0).reshape(8, 16)
    a_sh = jax.device_put(a, jax.NamedSharding(mesh, P("x", "y")))

    def run(spec):
        return jax.shard_map(lambda b: jax.lax.psum(b, "x"), mesh=mesh, in_specs=P("x", "y"),
                             out_specs=spec)(a_sh)
    assert np.array_equal(run(P(None, "y")), a[:4] + a[4:])
    assert run(P("x", "y")).shape == (8, 16)
    for spec in (P("x", None), P()):
        with pytest.raises(ValueError, match="replicat"):
            run(spec)


def test_the_reference_formula_agrees_with_the_hand_worked_one():
    """10.3's reference uses scalebook.sharding; check it equals n s C / (4 W) exactly."""
    assert math.isclose(evaluate("10.3", 4 * 2 * C5e / (4 * W5e)).correct, True)


def test_10_10_hint_does_not_give_the_call():
    """The hint for the axes swapped says what split_axis and concat_axis do; it does
    not print the call that answers the exercise (issue 25)."""
    r = evaluate("10.10", lambda x: jax.lax.all_to_all(x, "y", 0, 1, tiled=True))
    assert r.status == "wrong" and "split_axis" in r.message, r
    assert "split_axis=1" not in r.message and "concat_axis=0" not in r.message, r



def test_slips_students_made_get_their_hints():
    """A student's report: these got another slip's hint, or a generic one."""
    f32 = 2 * RIGHT["10.1"]              # f32 weights, or an all-reduce's bytes: also 2x
    msg = evaluate("10.1", f32).message
    assert "bf16" in msg and "all-reduce" in msg and "one-way ring" in msg, msg
    per_chip_f = RIGHT["10.3"] / 4       # F / n, a chip's columns
    assert "full width F" in evaluate("10.3", per_chip_f).message
    r = evaluate("10.10", lambda x: jax.lax.all_to_all(x, "y", 1, 0))   # tiled=False
    assert r.status == "wrong" and "tiled=True" in r.message, r


def test_10_7_a_dead_fourth_send_is_the_same_program():
    """A fourth ppermute whose result nothing uses (the loop sends after the last
    matmul) is removed by JAX before XLA sees the program: the compiled program is the
    right one, with 3 permutes, and the check accepts it. Inside a loop, where it does
    run, it is rejected (cm_fori_loop_one_send_too_many)."""
    def cm_dead_send(a, w):
        n, i, c = 4, jax.lax.axis_index("y"), a.shape[1]
        acc = 0
        for k in range(n):
            acc = acc + a @ jax.lax.dynamic_slice_in_dim(w, ((i + k) % n) * c, c, axis=0)
            a = jax.lax.ppermute(a, "y", [(j, (j - 1) % n) for j in range(n)])
        return acc
    assert evaluate("10.7", cm_dead_send).correct


def test_10_3_is_not_one_ratio_from_section_10_6s_table():
    """Section 10.6 tabulates v5p's per-step send and matmul for n = 2 to 64 (F times
    their ratio is v5p's threshold for that n); the exercise is on v5e, whose threshold is
    none of those (v6e's on 4 chips was v5p's on 8), and v5p's gets a hint."""
    v5p_threshold = 4 * 2 * C5p / (4 * W5p)
    r = evaluate("10.3", v5p_threshold)
    assert not r.correct and "v5p" in r.message, r
    for n in (2, 4, 8, 16, 32, 64):
        links = 1 if n == 2 else 2                       # one link between two chips
        table = F * (2 * 4096 * D / n / (links * W5p)) / (2 * 4096 * D * F / n**2 / C5p)
        assert abs(RIGHT["10.3"] / table - 1) > 0.1, n
