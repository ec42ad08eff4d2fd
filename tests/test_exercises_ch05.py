"""Chapter 5's exercise checks accept right answers, reject typical wrong ones with their
specific hints, and never raise.

Right answers are worked here by hand from the chip and model figures (closed forms, not the
scalebook.parallelism functions the references use). Code answers run on the 8-device mesh."""

import math

import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import P  # noqa: E402

from scalebook import parallelism as par  # noqa: E402
from exercise_harness import slip_battery_tests  # noqa: E402
from scalebook.exercises import evaluate, get_exercise  # noqa: E402
from scalebook.hardware import get_chip  # noqa: E402

v5e, v5p, v6e, h100 = (get_chip(c) for c in ("tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-h100"))
GiB = 2 ** 30
# LLaMA-3 (paper, Table 3; parameter counts from the Hugging Face metadata)
N8, N405 = 8_030_261_248, 405_853_388_800
F70, F405, D70, H70, K70 = 28672, 53248, 8192, 64, 8

RIGHT = {
    # 5.1: 2 (7/8) s / (2 W) per weight element against 4 / C  ->  b = (7/8) s C / (4 W)
    "5.1": 7 / 8 * 2 * v6e.bf16_flops / (4 * v6e.ici_link_bandwidth),
    # 5.2: ZeRO-2 over 16: bf16 weights whole, grads + master + Adam sharded
    "5.2": N8 * (2 + (2 + 4 + 8) / 16),
    "5.3": math.ceil(16 * N405 / (0.7 * 95 * GiB)),
    # 5.4: n <= 1 + 3 F (2 x 2W) / (s C)
    "5.4": math.floor(1 + 3 * F70 * 4 * v5p.ici_link_bandwidth / (2 * v5p.bf16_flops)),
    "5.5": "fsdp+tp",
    "5.6": 135,                                   # 15 / (M + 15) <= 0.1
    "5.7": math.ceil(1.25 * 4096 * 8 / 64),
    "5.9": 2 * v5e.bf16_flops * K70 / (2 * v5e.ici_link_bandwidth * H70),
    "5.10": 3 / 4 * 2 * v5e.bf16_flops / (2 * v5e.dcn_bandwidth),
    "5.11": 2 * 8 * N8 / 16 / h100.pcie_bandwidth,
    "5.12": math.sqrt(2 ** 24 * 8192 / F405),
}
# 5.8: E / k = 8 times the dense critical batch of W[8192, 28672] on v5e; solve
# 2 B D F >= I s (B D + D F + B F) for B (s = 2, I = C / W_hbm).
_I = v5e.bf16_flops / v5e.hbm_bandwidth
_dense = math.ceil(_I * 2 * D70 * F70 / (2 * D70 * F70 - _I * 2 * (D70 + F70)))
RIGHT["5.8"] = 8 * _dense

WRONG = {   # answer -> a word its hint must contain (None: any "wrong")
    "5.1": [(RIGHT["5.1"] * 8 / 7, "(n - 1) / n"), (2 * RIGHT["5.1"], "one-way ring"),
            (RIGHT["5.1"] * 4 / 6, "backward pass"), (RIGHT["5.1"] * 1e3, "units")],
    "5.2": [(N8 * (2 + 2 + 12 / 16), "ZeRO-1"), (16 * N8 / 16, "ZeRO-3"),
            (16 * N8, "plain data parallelism")],
    "5.3": [(math.floor(16 * N405 / (0.7 * 95 * GiB)), "round up"),
            (math.ceil(16 * N405 / (0.7 * 95e9)), "GiB"),
            (math.ceil(16 * N405 / (95 * GiB)), "30%"), (91.5, "whole number")],
    "5.4": [(math.floor(1 + 2 * F70 * 4 * v5p.ici_link_bandwidth / (2 * v5p.bf16_flops)),
             "gated"),
            (math.floor(1 + 3 * F70 * 2 * v5p.ici_link_bandwidth / (2 * v5p.bf16_flops)),
             None)],
    "5.5": [("dp", "does not fit"), ("fsdp", "threshold"), ("none", "2D split")],
    "5.6": [(144, "P - 1 stages"), (150, "N_mb + P - 1"), (134, "still above")],
    "5.7": [(math.ceil(1.25 * 4096 / 64), "k = 8"), (4096 * 8 // 64, "capacity factor")],
    "5.8": [(_dense, "dense layer"), (_dense / 8, "other way round")],
    "5.9": [(RIGHT["5.9"] * 8, "grouped-query"), (RIGHT["5.9"] / 2, "both K and V")],
    "5.10": [(RIGHT["5.10"] * 4 / 3, "(m - 1) / m"), (RIGHT["5.10"] / 256, "per chip")],
    "5.11": [(RIGHT["5.11"] / 2, "both directions"), (RIGHT["5.11"] * 1.5, "master weights")],
    "5.12": [(8192 / RIGHT["5.12"], "tensor-parallel degree"),
             (RIGHT["5.12"] * math.sqrt(2), "one axis each"),
             (math.sqrt(2 ** 24 / F405), "under the root")],
}

# The standard slip battery on every numeric exercise (tests/exercise_harness.py), with
# the mistakes above as the chapter's known pitfalls.
globals().update(slip_battery_tests(5, {
    ex: [a for a, _ in cases if not isinstance(a, str)]
    for ex, cases in WRONG.items()}))


def test_5_4_one_hint_names_both_halvings():
    # the faster link on a one-way ring equals today's link on a torus: one hint for both
    msg = evaluate("5.4", WRONG["5.4"][1][0]).message
    assert "both ways" in msg and "today's v5p" in msg


@pytest.mark.parametrize("ex", sorted(RIGHT))
def test_right_answers_are_accepted(ex):
    r = evaluate(ex, RIGHT[ex])
    assert r.correct, r


@pytest.mark.parametrize("ex,answer,word", [(k, a, w) for k, v in WRONG.items() for a, w in v])
def test_wrong_answers_are_rejected_with_their_hint(ex, answer, word):
    r = evaluate(ex, answer)
    assert r.status == "wrong", r
    if word:
        assert word in r.message, r.message


@pytest.mark.parametrize("ex", [k for k in sorted(RIGHT) if k not in ("5.5",)])
def test_tolerance_boundary(ex):
    e = get_exercise(ex)
    if e.integer:
        assert evaluate(ex, RIGHT[ex] + 1).status == "wrong"
        return
    assert evaluate(ex, RIGHT[ex] * (1 + 0.9 * e.rtol)).correct
    assert evaluate(ex, RIGHT[ex] * (1 + 1.1 * e.rtol)).status == "wrong"


ALL = sorted(RIGHT) + ["5.13", "5.14", "5.15", "5.16", "5.17"]


@pytest.mark.parametrize("ex", ALL)
def test_ellipsis_is_not_attempted(ex):
    assert evaluate(ex, ...).status == "not attempted"


@pytest.mark.parametrize("ex", ALL)
@pytest.mark.parametrize("bad", ["12", None, float("nan")])
def test_malformed_answers_get_a_message(ex, bad):
    r = evaluate(ex, bad)
    if bad is None and ex in ("5.13", "5.14", "5.15", "5.16", "5.17"):
        assert r.status == "not attempted"
        return
    assert r.status == "wrong" and r.message


def test_every_hint_is_reachable():
    # each specific hint of the numeric exercises is hit by one of the wrong answers above
    for ex, wrongs in WRONG.items():
        e = get_exercise(ex)
        if not hasattr(e, "unit"):
            continue
        messages = {evaluate(ex, a).message for a, _ in wrongs}
        for _, hint in e.hints:
            assert any(hint in m for m in messages), (ex, hint)


# ------------------------------------------------------------------------------------------
# Code answers
# ------------------------------------------------------------------------------------------

def _gather(w, axis=0):
    return jax.lax.all_gather(w, "data", axis=axis, tiled=True)


def _local_grads(x, wi, wo, dy):
    h = x @ wi
    return x.T @ ((dy @ wo.T) * (h > 0)), jax.nn.relu(h).T @ dy


def fsdp_right(x, a, b, dy):
    gi, go = _local_grads(x, _gather(a), _gather(b), dy)
    return (jax.lax.psum_scatter(gi, "data", scatter_dimension=0, tiled=True),
            jax.lax.psum_scatter(go, "data", scatter_dimension=0, tiled=True))


def fsdp_vjp(x, a, b, dy):                # let JAX transpose the gathers: also right
    _, vjp = jax.vjp(lambda a, b: jax.nn.relu(x @ _gather(a)) @ _gather(b), a, b)
    return vjp(dy)


def fsdp_psum_slice(x, a, b, dy):         # right numbers, all-reduce: twice the bytes
    gi, go = _local_grads(x, _gather(a), _gather(b), dy)
    i = jax.lax.axis_index("data")
    gi, go = jax.lax.psum(gi, "data"), jax.lax.psum(go, "data")
    return (jax.lax.dynamic_slice_in_dim(gi, i * a.shape[0], a.shape[0]),
            jax.lax.dynamic_slice_in_dim(go, i * b.shape[0], b.shape[0]))


def fsdp_local_only(x, a, b, dy):         # forgets to sum over the batch: wrong numbers
    gi, go = _local_grads(x, _gather(a), _gather(b), dy)
    i = jax.lax.axis_index("data")
    return (jax.lax.dynamic_slice_in_dim(gi, i * a.shape[0], a.shape[0]),
            jax.lax.dynamic_slice_in_dim(go, i * b.shape[0], b.shape[0]))


def fsdp_wrong_axis(x, a, b, dy):          # gathers along the columns: shapes do not fit
    gi, go = _local_grads(x, _gather(a, 1), _gather(b, 1), dy)
    return gi, go


def fsdp_forward(x, a, b):                 # the chapter's forward, three arguments
    return jax.nn.relu(x @ _gather(a)) @ _gather(b)


def tp_right(x, a, b):
    xg = jax.lax.all_gather(x, "y", axis=0, tiled=True)
    return jax.lax.psum_scatter(jax.nn.relu(xg @ a) @ b, "y", scatter_dimension=0,
                                tiled=True)


def tp_psum_slice(x, a, b):               # right numbers, all-reduce then slice
    xg = jax.lax.all_gather(x, "y", axis=0, tiled=True)
    out = jax.lax.psum(jax.nn.relu(xg @ a) @ b, "y")
    n = x.shape[0]
    return jax.lax.dynamic_slice_in_dim(out, jax.lax.axis_index("y") * n, n)


def tp_gather(x, a, b):                   # gathers the weights over y: right numbers
    a = jax.lax.all_gather(a, "y", axis=1, tiled=True, to="invarying")
    b = jax.lax.all_gather(b, "y", axis=0, tiled=True, to="invarying")
    return jax.nn.relu(x @ a) @ b


def tp_chapter(x, a, b):                  # section 5.3's psum: x is not gathered
    return jax.lax.psum(jax.nn.relu(x @ a) @ b, "y")


def experts_right(bk, w):
    mine = jax.lax.all_to_all(bk, "ep", 0, 0, tiled=True)
    return jax.lax.all_to_all(jnp.tanh(mine @ w[0]), "ep", 0, 0, tiled=True)


def experts_gather(bk, w):                # every device gathers all 8 experts
    ws = jax.lax.all_gather(w[0], "ep", to="invarying")          # [8, D, D]
    return jnp.tanh(jnp.einsum("ecd,edf->ecf", bk, ws))


def experts_one_way(bk, w):               # forgets to send the results home
    mine = jax.lax.all_to_all(bk, "ep", 0, 0, tiled=True)
    return jnp.tanh(mine @ w[0])


def orders(kind):
    return lambda P_, M: [[c for c in row if c] for row in
                          par.pipeline_schedule(P_, M, kind).grid]


def orders_handmade(P_, M):
    """1F1B written out directly: warm-up forwards, then alternate, then cool-down."""
    out = []
    for p in range(P_):
        warm = min(P_ - p, M)
        jobs = [("F", m) for m in range(warm)]
        for m in range(M):
            jobs.append(("B", m))
            if warm + m < M:
                jobs.append(("F", warm + m))
        out.append(jobs)
    return out


def orders_invalid(P_, M):
    return [[("F", m) for m in range(M)] for _ in range(P_)]


def orders_slow(P_, M):                   # one microbatch at a time through the pipe
    return [[j for m in range(M) for j in (("F", m), ("B", m))] for _ in range(P_)]


@pytest.mark.parametrize("ex,answer", [
    ("5.13", fsdp_right), ("5.13", fsdp_vjp), ("5.14", tp_right), ("5.15", experts_right),
    ("5.16", orders("1f1b")), ("5.16", orders_handmade),
    ("5.17", lambda B, D, F: (P("y", "x"), P("y", "x"), P("x", "y"))),
])
def test_right_programs_pass(ex, answer):
    r = evaluate(ex, answer)
    assert r.correct, r


@pytest.mark.parametrize("ex,answer,word", [
    ("5.13", fsdp_wrong_axis, "first axis"),
    ("5.13", fsdp_psum_slice, "twice the bytes"),
    ("5.13", fsdp_local_only, "wrong numbers"),
    ("5.13", fsdp_forward, "failed"),
    ("5.14", tp_psum_slice, "twice the bytes"),
    ("5.14", tp_gather, "keeps the weights split"),
    ("5.14", tp_chapter, "wrong numbers"),      # sums different rows of x
    ("5.15", experts_gather, "not expert parallelism"),
    ("5.15", experts_one_way, "wrong numbers"),
    ("5.16", orders("gpipe"), "GPipe"),
    ("5.16", orders_invalid, "not a valid pipeline"),
    ("5.16", orders_slow, "slower than 1F1B"),
    ("5.17", lambda B, D, F: (P(("x", "y"), None),) * 3, "all 8 devices"),
    # section 5.4's specs (plus the gate) answer the other layout: weights gathered over x
    ("5.17", lambda B, D, F: (P("x", "y"), P("x", "y"), P("y", "x")), "'y' is the FSDP"),
    ("5.17", lambda B, D, F: (P("y", None), P("y", "x"), P("x", "y")), "1/8 of each weight"),
    # pure TP over 8: cheaper than 2D for a small batch, but not the split asked for
    ("5.17", lambda B, D, F: (P(None, ("y", "x")),) * 2 + (P(("y", "x"), None),),
     "tensor parallelism over 'x' splits F"),
    ("5.17", lambda B, D, F: (P("x", "y"), P("y", "x")), "(spec_w_gate, spec_w_up"),
    ("5.17", lambda B, D, F: "x", "jax.P"),
    ("5.13", 42, "function"),
])
def test_wrong_programs_fail_with_a_reason(ex, answer, word):
    r = evaluate(ex, answer)
    assert r.status == "wrong", r
    assert word in r.message, r.message


def test_stubs_are_not_attempted():
    def stub(*args):
        ...
    for ex in ("5.13", "5.14", "5.15", "5.16", "5.17"):
        assert evaluate(ex, stub).status == "not attempted", ex


# ------------------------------------------------------------------------------------------
# Variants (assignments draw other numbers per student): worked by hand like the above
# ------------------------------------------------------------------------------------------
N70 = 70_553_706_496
v4 = get_chip("tpu-v4")


def _v(ex, answer, variant):
    return evaluate(ex, answer, variant=variant)


def test_5_1_a_variant_keeps_its_own_n_minus_1_over_n():
    v = {"chip": "tpu-v5p", "chips": 16}
    right = 15 / 16 * 2 * v5p.bf16_flops / (4 * v5p.ici_link_bandwidth)
    assert _v("5.1", right, v).correct and not _v("5.1", RIGHT["5.1"], v).correct
    assert "15/16" in _v("5.1", right * 16 / 15, v).message


def test_5_3_a_variant_on_a_v4_and_its_slips():
    v = {"model": "llama3-70b", "chip": "tpu-v4", "left": 0.5}
    right = math.ceil(16 * N70 / (0.5 * 32 * GiB))
    assert _v("5.3", right, v).correct
    assert "v4's HBM is 32 GiB" in _v("5.3", math.ceil(16 * N70 / (0.5 * 32e9)), v).message
    assert "leave 50%" in _v("5.3", math.ceil(16 * N70 / (32 * GiB)), v).message
    assert "round up" in _v("5.3", right - 1, v).message


def test_5_6_a_variant_and_its_slips():
    v = {"P": 8, "target": 0.05}                  # 7 / (N + 7) <= 0.05  ->  N >= 133
    assert _v("5.6", 133, v).correct
    assert "P - 1 stages" in _v("5.6", 152, v).message          # 8 x 0.95 / 0.05
    assert "<= 0.05" in _v("5.6", 140, v).message               # 7 / 0.05
    assert "still above 5%" in _v("5.6", 132, v).message


def test_5_7_a_variant_without_a_capacity_factor_hint():
    v = {"tokens": 8192, "E": 16, "k": 2, "cf": 1.0}
    assert _v("5.7", 8192 * 2 // 16, v).correct
    assert "k = 2" in _v("5.7", 8192 // 16, v).message
    assert not any("capacity factor" in m for _, m in get_exercise("5.7").with_variant(v).hints)


def test_5_9_a_variant_on_gpus_uses_all_of_nvlink():
    v = {"model": "llama3-8b", "chip": "gpu-h100"}
    right = 2 * h100.bf16_flops * 8 / (2 * h100.ici_bandwidth * 32)
    assert _v("5.9", right, v).correct
    assert "NVLink" in get_exercise("5.9").with_variant(v).text()
    assert "grouped-query" in _v("5.9", right * 4, v).message


def test_5_12_a_variant():
    v = {"B": 2 ** 22, "n": 1024, "model": "llama3-8b"}
    right = math.sqrt(2 ** 22 * 1024 / 14336)
    assert _v("5.12", right, v).correct
    assert "tensor-parallel degree" in _v("5.12", 1024 / right, v).message
    assert "$2^{22}$" in get_exercise("5.12").with_variant(v).text()


def test_5_16_drawn_inputs_pass_a_right_schedule():
    ex = get_exercise("5.16")
    for args in ex.drawn_cases(b"ch05", n=30):
        assert ex._equal(orders_handmade(*args), ex.reference(*args)), args
