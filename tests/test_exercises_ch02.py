"""Chapter 2 exercise checks: right answers (computed here by hand from the hardware and
model figures, not by the reference functions) pass; typical mistakes fail; ... is not attempted."""

import math

import pytest

from scalebook.exercises import evaluate, exercise_ids
from scalebook.hardware import get_chip
from scalebook.models import get_model

V5E, V5P, V6E, H100 = (get_chip(n) for n in ("tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-h100"))


def _llama70b_bytes():
    # 2 bytes per bf16 weight; parameters counted from the config with the LLaMA formula
    m = get_model("llama3-70b")
    d, L, V, F = m.d_model, m.n_layers, m.vocab_size, m.d_ff
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * F + 2 * d
    return 2 * (2 * V * d + L * per_layer + d)


W70 = _llama70b_bytes()


def status(eid, answer):
    return evaluate(eid, answer).status


def test_chapter_has_at_least_eight_exercises():
    assert len([e for e in exercise_ids() if e.startswith("2.")]) >= 8


@pytest.mark.parametrize("eid", [f"2.{k}" for k in range(1, 13)])
def test_ellipsis_is_not_attempted(eid):
    assert status(eid, ...) == "not attempted"


# 2.1 one MXU of a v5p: chip peak / (2 TensorCores x 4 MXUs)
def test_2_1():
    right = V5P.bf16_flops / (V5P.tensorcores * V5P.mxus_per_core)
    assert status("2.1", right) == "correct"
    for wrong in (V5P.bf16_flops, V5P.bf16_flops / 4, right / 2):
        r = evaluate("2.1", wrong)
        assert r.status == "wrong" and "not yet" in r.message


# 2.2 systolic cycles, checked against counting cycles of a hand simulation
def _count_cycles(M, K, N):
    # last output out[M-1, N-1] leaves at cycle (M-1) + (K-1) + (N-1); cycles are numbered from 0
    return (M - 1) + (K - 1) + (N - 1) + 1


def test_2_2():
    assert status("2.2", _count_cycles) == "correct"
    assert status("2.2", lambda M, K, N: M + K + N - 1) == "wrong"
    assert status("2.2", lambda M, K, N: M) == "wrong"
    # right on square arrays only: wrong for K != N
    assert status("2.2", lambda M, K, N: M + 2 * K - 2) == "wrong"
    r = evaluate("2.2", lambda M, K, N: M + K + N - 1)
    assert "too many" in r.message
    assert status("2.2", lambda M, K, N: None) == "not attempted"


# 2.3 padding on v6e (256 x 256 MXU) for a [384, 640] weight
def test_2_3():
    s = V6E.mxu_size
    right = (384 * 640) / (math.ceil(384 / s) * s * math.ceil(640 / s) * s)
    assert status("2.3", right) == "correct"
    r = evaluate("2.3", 1.0)      # the 128 x 128 answer
    assert r.status == "wrong" and "128" in r.message
    assert status("2.3", 1 - right) == "wrong"


# 2.4 torus hops
def _my_hops(src, dst, shape):
    return sum(min(abs(a - b), n - abs(a - b)) for a, b, n in zip(src, dst, shape))


def test_2_4():
    assert status("2.4", _my_hops) == "correct"
    no_wrap = lambda src, dst, shape: sum(abs(a - b) for a, b in zip(src, dst))
    r = evaluate("2.4", no_wrap)
    assert r.status == "wrong" and "wraparound" in r.message
    # wraps only the first axis: right on 1D and on some 2D cases, wrong on others
    first_only = lambda src, dst, shape: (min(abs(src[0] - dst[0]), shape[0] - abs(src[0] - dst[0]))
                                          + sum(abs(a - b) for a, b in zip(src[1:], dst[1:])))
    assert status("2.4", first_only) == "wrong"


# 2.5 diameter of v5e 8x16: the 16 axis (full pod width) wraps, the 8 axis does not
def test_2_5():
    assert status("2.5", (8 - 1) + 16 // 2) == "correct"
    assert status("2.5", (8 - 1) + (16 - 1)) == "wrong"
    assert status("2.5", 8 // 2 + 16 // 2) == "wrong"
    assert status("2.5", 15.5) == "wrong"


# 2.6 v5e chips for LLaMA-3-70B bf16
def test_2_6():
    right = math.ceil(W70 / V5E.hbm_bytes)
    assert status("2.6", right) == "correct"
    assert status("2.6", right - 1) == "wrong"
    assert status("2.6", math.ceil(W70 / 2 / V5E.hbm_bytes)) == "wrong"


# 2.7 decode floor on v6e 4x4
def test_2_7():
    right = W70 / (16 * V6E.hbm_bandwidth)
    assert status("2.7", right) == "correct"
    assert status("2.7", right * 1.02) == "correct"
    for wrong in (W70 / V6E.hbm_bandwidth, right * 2, right * 1e3, W70 / (16 * V5E.hbm_bandwidth)):
        assert status("2.7", wrong) == "wrong"


# 2.8 PCIe load into v5e 4x4: one PCIe link per chip
def test_2_8():
    right = W70 / 16 / V5E.pcie_bandwidth
    assert status("2.8", right) == "correct"
    for wrong in (W70 / V5E.pcie_bandwidth, W70 / 2 / V5E.pcie_bandwidth, right / 1e3):
        assert status("2.8", wrong) == "wrong"


# 2.9 DCN copy between two v5e pods (256 chips each)
def test_2_9():
    right = W70 / (256 * V5E.dcn_bandwidth)
    assert status("2.9", right) == "correct"
    for wrong in (W70 / V5E.dcn_bandwidth, W70 / (256 * V5E.ici_link_bandwidth), right * 8):
        assert status("2.9", wrong) == "wrong"


# 2.10 PCIe is faster per chip than DCN on v5e
def test_2_10():
    assert V5E.pcie_bandwidth > V5E.dcn_bandwidth      # the premise of the expected answer
    assert status("2.10", "pcie") == "correct"
    assert status("2.10", " PCIe ") == "correct"
    assert status("2.10", "dcn") == "wrong"
    assert status("2.10", "ici") == "wrong"


# 2.11 ratio of the HBM floors: (W / 16 v5e) / (W / 8 H100)
def test_2_11():
    right = (8 * H100.hbm_bandwidth) / (16 * V5E.hbm_bandwidth)
    assert status("2.11", right) == "correct"
    assert status("2.11", 1 / right) == "wrong"
    assert status("2.11", H100.hbm_bandwidth / V5E.hbm_bandwidth) == "wrong"


# 2.12 corner to corner on a v5e 4x4 (no wraparound: 6 hops), two links, 1 us per hop
def test_2_12():
    right = 6 * 1e-6 + 1e9 / (2 * V5E.ici_link_bandwidth)
    assert status("2.12", right) == "correct"
    for wrong in (6 * 1e-6 + 1e9 / V5E.ici_link_bandwidth, 6 * 1e9 / (2 * V5E.ici_link_bandwidth),
                  right * 1e3):
        assert status("2.12", wrong) == "wrong"
    r = evaluate("2.12", 6 * 1e-6 + 1e9 / V5E.ici_link_bandwidth)
    assert "two links" in r.message


@pytest.mark.parametrize("answer", ["fast", None, float("nan"), [1, 2]])
def test_junk_answers_never_raise(answer):
    for eid in [f"2.{k}" for k in range(1, 13)]:
        assert evaluate(eid, answer).status in ("wrong", "not attempted")
