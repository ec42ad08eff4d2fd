"""Chapter 2's exercise checks accept right answers, reject typical wrong ones, never raise.

The right answers here are computed by hand from the hardware and model figures, not by the
reference functions in scalebook/exercises/ch02.py. Code answers run on several shapes."""

import math

import pytest

from exercise_harness import standard_tests
from scalebook.exercises import chapter_ids, evaluate
from scalebook.hardware import get_chip
from scalebook.models import get_model

V5E, V5P, V6E, H100 = (get_chip(n) for n in ("tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-h100"))


def _llama_bytes(name="llama3-70b"):
    # 2 bytes per bf16 weight; parameters counted from the config with the LLaMA formula
    m = get_model(name)
    d, L, V, F = m.d_model, m.n_layers, m.vocab_size, m.d_ff
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    per_layer = d * q + 2 * d * kv + q * d + 3 * d * F + 2 * d
    return 2 * (2 * V * d + L * per_layer + d)


W70 = _llama_bytes("llama3-70b")
W405 = _llama_bytes("llama3-405b")
W405 = _llama_bytes("llama3-405b")
LAT = 6 * 1e-6                  # 2.12: 6 hops of 1e-6 s
SEND = 1e6 / (2 * V5E.ici_link_bandwidth)
S6 = V6E.mxu_size

RIGHT = {
    # 2.1 one MXU of a v5p: chip peak / (2 TensorCores x 4 MXUs)
    "2.1": V5P.bf16_flops / (V5P.tensorcores * V5P.mxus_per_core),
    # 2.3 padding on v6e (256 x 256 MXU) for a [384, 640] weight
    "2.3": (384 * 640) / (math.ceil(384 / S6) * S6 * math.ceil(640 / S6) * S6),
    # 2.5 diameter of v5e 4x16: the 16 axis (full pod width) wraps, the 4 axis does not
    "2.5": (4 - 1) + 16 // 2,
    # 2.6 v5e chips for LLaMA-3-405B bf16
    "2.6": math.ceil(W405 / V5E.hbm_bytes),
    # 2.7 decode floor on v6e 4x4
    "2.7": W70 / (16 * V6E.hbm_bandwidth),
    # 2.8 PCIe load into v5e 4x4: one PCIe link per chip
    "2.8": W405 / 64 / V5E.pcie_bandwidth,         # 405B on an 8x8 (70B's is printed)
    # 2.9 DCN copy between two v5e pods (256 chips each)
    "2.9": W405 / (256 * V5E.dcn_bandwidth),
    # 2.10 PCIe is faster per chip than DCN on v5e
    "2.10": "pcie",
    # 2.11 ratio of the HBM floors: (W / 16 v5e) / (W / 8 H100)
    "2.11": (8 * H100.hbm_bandwidth) / (16 * V5E.hbm_bandwidth),
    # 2.12 corner to corner on a v5e 4x4 (no wraparound: 6 hops), two links, 1 us per hop
    "2.12": LAT + SEND,
    # 2.13 v5p elementwise f32: 8 bytes per element; VPU-bound above C_vpu * 8 / W_hbm
    "2.13": V5P.vector_flops * 8 / V5P.hbm_bandwidth,
    # 2.14 v6e, bf16 weights over PCIe: 2 B D F / C = 2 D F / W_pcie -> B = C / W_pcie
    "2.14": V6E.bf16_flops / V6E.pcie_bandwidth,
}

WRONG = {
    "2.1": [V5P.bf16_flops, V5P.bf16_flops / 4, RIGHT["2.1"] / 2],
    "2.3": [1.0, 1 - RIGHT["2.3"]],
    "2.5": [(4 - 1) + (16 - 1), 4 // 2 + 16 // 2],
    "2.6": [RIGHT["2.6"] - 1, math.ceil(W405 / 2 / V5E.hbm_bytes),
            math.ceil(W405 / (V5E.hbm_bytes / 1e9 * 2**30)), math.ceil(W70 / V5E.hbm_bytes)],
    "2.7": [W70 / V6E.hbm_bandwidth, RIGHT["2.7"] * 2, RIGHT["2.7"] * 1e3,
            W70 / (16 * V5E.hbm_bandwidth)],
    "2.8": [W405 / V5E.pcie_bandwidth, W405 / 8 / V5E.pcie_bandwidth, RIGHT["2.8"] / 1e3],
    "2.9": [W405 / V5E.dcn_bandwidth, W405 / (256 * V5E.ici_link_bandwidth), RIGHT["2.9"] * 8,
            W70 / (256 * V5E.dcn_bandwidth)],
    "2.10": ["dcn"],
    "2.11": [1 / RIGHT["2.11"], H100.hbm_bandwidth / V5E.hbm_bandwidth],
    "2.12": [LAT + 2 * SEND, SEND, 2e-6 + SEND, 1e-6 + SEND, 6 * SEND, LAT + 6 * SEND,
             RIGHT["2.12"] * 1e3],
    "2.13": [V5P.vector_flops / V5P.hbm_bandwidth, V5P.vector_flops * 4 / V5P.hbm_bandwidth,
             V5P.bf16_flops * 8 / V5P.hbm_bandwidth],
    "2.14": [V6E.bf16_flops / V6E.hbm_bandwidth, V6E.bf16_flops / (2 * V6E.pcie_bandwidth),
             2 * V6E.bf16_flops / V6E.pcie_bandwidth, V5E.bf16_flops / V5E.pcie_bandwidth],
}

HINTS = {   # a typical mistake -> words its hint must contain
    "2.1": [(V5P.bf16_flops / 4, "two TensorCores"), (V5P.bf16_flops, "whole chip"),
            (RIGHT["2.1"] / 2, "2 FLOPs")],
    "2.3": [(1.0, "128"), (1 - RIGHT["2.3"], "wasted"), (1.5, "between 0 and 1")],
    "2.5": [((4 - 1) + (16 - 1), "wraparound"), (4 // 2 + 16 // 2, "4-long axis")],
    "2.6": [(RIGHT["2.6"] - 1, "round up"), (math.ceil(W405 / 2 / V5E.hbm_bytes), "2 bytes"),
            (math.ceil(W405 / (V5E.hbm_bytes / 1e9 * 2**30)), "GiB"),
            (math.ceil(W70 / V5E.hbm_bytes), "405B")],
    "2.7": [(W70 / V6E.hbm_bandwidth, "16 chips"), (W70 / (16 * V5E.hbm_bandwidth), "v5e"),
            (W70 / 2 / (16 * V6E.hbm_bandwidth), "2 bytes")],
    "2.8": [(W405 / V5E.pcie_bandwidth, "all 64"),
            (W405 / 8 / V5E.pcie_bandwidth, "per chip"),
            (W405 / 64 / (2 * V5E.pcie_bandwidth), "one direction")],     # PCIe doubled
    "2.9": [(W405 / V5E.dcn_bandwidth, "share"), (W405 / (256 * V5E.ici_link_bandwidth), "no ICI"),
            (W70 / (256 * V5E.dcn_bandwidth), "70B's copy")],
    "2.11": [(1 / RIGHT["2.11"], "upside down"),
             (H100.hbm_bandwidth / V5E.hbm_bandwidth, "one chip with one chip")],
    "2.12": [(LAT + 2 * SEND, "two links"),             # one link
             (SEND, "add the latency"),                 # the latency left out: 37% of it
             (2e-6 + SEND, "no wraparound"),            # 4x4 taken as a torus: 1 + 1 hops
             (1e-6 + SEND, "per hop"),                  # one latency, not six
             (6 * SEND, "forward"), (LAT + 6 * SEND, "forward")],   # a copy per hop
    "2.13": [(V5P.vector_flops / V5P.hbm_bandwidth, "per byte"),
             (V5P.vector_flops * 4 / V5P.hbm_bandwidth, "not the read alone"),
             (V5P.vector_flops * 4 / V5P.hbm_bandwidth, "already per chip"),
             (V5P.bf16_flops * 8 / V5P.hbm_bandwidth, "MXUs' peak")],
    "2.14": [(V6E.bf16_flops / V6E.hbm_bandwidth, "PCIe"),
             (V6E.bf16_flops / (2 * V6E.pcie_bandwidth), "2 bytes"),
             (2 * V6E.bf16_flops / V6E.pcie_bandwidth, "2 FLOPs"),
             (V5E.bf16_flops / V5E.pcie_bandwidth, "v5e"),
             (8 * V6E.bf16_flops / V6E.pcie_bandwidth, "already per chip"),
             (V6E.bf16_flops / (2 * V6E.pcie_bandwidth), "do not double")],
}

# Right answers accepted (and the tolerance band on both sides), typical mistakes rejected
# with their hint, ... not attempted, malformed answers answered: tests/exercise_harness.py.
globals().update(standard_tests(2, RIGHT, WRONG, HINTS, all_hints=True))


def test_chapter_has_its_twelve_exercises():
    ids = chapter_ids(2)
    assert len(ids) >= 8
    assert {f"2.{k}" for k in range(1, 15)} <= set(ids)


def test_estimates_within_tolerance_are_accepted():
    assert evaluate("2.7", RIGHT["2.7"] * 1.02).correct
    assert evaluate("2.10", " PCIe ").correct


def test_2_10_premise():
    assert V5E.pcie_bandwidth > V5E.dcn_bandwidth      # the premise of the expected answer


def test_answers_outside_the_question_say_what_is_expected():
    r = evaluate("2.5", 15.5)                           # hops are whole numbers
    assert r.status == "wrong" and "whole number" in r.message
    r = evaluate("2.10", "ici")                         # not one of the two paths asked about
    assert r.status == "wrong" and "'pcie'" in r.message and "'dcn'" in r.message


def status(eid, answer):
    return evaluate(eid, answer).status


# ---- code answers ------------------------------------------------------------------------------

# 2.2 systolic cycles, checked against counting cycles of a hand simulation
def _count_cycles(B, D, F):
    # last output out[B-1, F-1] leaves at cycle (B-1) + (D-1) + (F-1); cycles are numbered from 0
    return (B - 1) + (D - 1) + (F - 1) + 1


def test_2_2():
    assert status("2.2", _count_cycles) == "correct"
    assert status("2.2", lambda B, D, F: B + D + F - 1) == "wrong"
    assert status("2.2", lambda B, D, F: B) == "wrong"
    # right on square arrays only: wrong for D != F
    assert status("2.2", lambda B, D, F: B + 2 * D - 2) == "wrong"
    r = evaluate("2.2", lambda B, D, F: B + D + F - 1)
    assert "too many" in r.message


@pytest.mark.parametrize("mistake,answer,words", [
    ("weight loading counted", lambda B, D, F: B + 2 * D + F - 2, "weight-loading"),
    ("one too many", lambda B, D, F: B + D + F - 1, "one cycle too many"),
    ("one short", lambda B, D, F: B + D + F - 3, "one cycle short"),
    ("only B", lambda B, D, F: B, "cross the D rows"),
])
def test_2_2_each_mistake_gets_its_hint(mistake, answer, words):
    r = evaluate("2.2", answer)
    assert r.status == "wrong" and words in r.message, (mistake, r)
    assert status("2.2", lambda B, D, F: None) == "not attempted"


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


@pytest.mark.parametrize("mistake,answer,words", [
    ("no wraparound", lambda src, dst, shape: sum(abs(a - b) for a, b in zip(src, dst)), "wraparound"),
    ("axes at once", lambda src, dst, shape: max(min(abs(a - b), n - abs(a - b))
                                                 for a, b, n in zip(src, dst, shape)), "add up"),
])
def test_2_4_each_hint_is_reached(mistake, answer, words):
    r = evaluate("2.4", answer)
    assert r.status == "wrong" and words in r.message, (mistake, r)


# ---- variants (an assignment's own numbers): each gets the hints for its own slips ---

def test_2_5_variants_know_which_axes_wrap():
    # v5p 4x8x8: whole 4x4x4 cubes, so every axis wraps: 2 + 4 + 4 hops
    params = {"chip": "tpu-v5p", "shape": "4x8x8"}
    assert evaluate("2.5", 2 + 4 + 4, variant=params).correct
    r = evaluate("2.5", 3 + 7 + 7, variant=params)
    assert r.status == "wrong" and "every axis has a wraparound link" in r.message, r
    # v5e 4x8: neither axis spans the pod's 16, so neither wraps: 3 + 7 hops
    params = {"chip": "tpu-v5e", "shape": "4x8"}
    assert evaluate("2.5", 3 + 7, variant=params).correct
    r = evaluate("2.5", 2 + 4, variant=params)
    assert r.status == "wrong" and "neither the 4-long nor the 8-long" in r.message, r
    from scalebook.exercises import get_exercise
    title = get_exercise("2.5").with_variant(params).title_text()
    assert title == "Diameter of a v5e 4x8 slice"


def test_2_6_fp32_master_weights():
    V5P_ = get_chip("tpu-v5p")
    params = {"chip": "tpu-v5p", "dtype": "fp32"}     # 405B
    right = math.ceil(2 * W405 / V5P_.hbm_bytes)
    assert evaluate("2.6", right, variant=params).correct
    r = evaluate("2.6", math.ceil(W405 / V5P_.hbm_bytes), variant=params)
    assert r.status == "wrong" and "4 bytes, not 2" in r.message, r


def test_2_7_and_2_8_variants():
    params = {"model": "llama3-405b", "chip": "tpu-v5e", "shape": "16x16"}
    assert evaluate("2.7", W405 / (256 * V5E.hbm_bandwidth), variant=params).correct
    r = evaluate("2.7", W405 / V5E.hbm_bandwidth, variant=params)
    assert r.status == "wrong" and "the 256 chips" in r.message, r
    r = evaluate("2.7", W405 / (256 * V6E.hbm_bandwidth), variant=params)
    assert r.status == "wrong" and "v6e's HBM bandwidth" in r.message, r
    # 32 chips on 8 hosts
    params = {"model": "llama3-8b", "chip": "tpu-v5p", "shape": "2x4x4"}
    W8 = _llama_bytes("llama3-8b")
    assert evaluate("2.8", W8 / (32 * V5P.pcie_bandwidth), variant=params).correct
    r = evaluate("2.8", W8 / (8 * V5P.pcie_bandwidth), variant=params)
    assert r.status == "wrong" and "per chip, not per host" in r.message, r


def test_2_11_variant():
    B200 = get_chip("gpu-b200")
    params = {"tpu": "tpu-v6e", "shape": "4x8", "gpu": "gpu-b200"}
    right = 8 * B200.hbm_bandwidth / (32 * V6E.hbm_bandwidth)
    assert evaluate("2.11", right, variant=params).correct
    r = evaluate("2.11", 1 / right, variant=params)
    assert r.status == "wrong" and "v6e time divided by B200 time" in r.message, r


def test_2_14_int8_weights():
    params = {"chip": "tpu-v5e", "weights": "int8"}
    right = 1 * V5E.bf16_flops / (2 * V5E.pcie_bandwidth)
    assert evaluate("2.14", right, variant=params).correct
    r = evaluate("2.14", 2 * right, variant=params)
    assert r.status == "wrong" and "int8 weights take 1 byte" in r.message, r
    from scalebook.exercises import get_exercise
    v = get_exercise("2.14").with_variant(params)
    assert v.title_text() == "Weights from host memory on a v5e"
    assert v.text().startswith("A TPU v5e streams the int8 weight")


@pytest.mark.parametrize("ex,answer", [("2.2", _count_cycles), ("2.4", _my_hops)])
def test_code_answers_are_right_on_drawn_inputs(ex, answer):
    from scalebook.exercises import get_exercise
    e = get_exercise(ex)
    cases = e.drawn_cases(b"ch02", n=30)
    assert len(set(map(repr, cases))) > 20
    assert evaluate(ex, answer, cases=list(e.cases) + cases).correct
