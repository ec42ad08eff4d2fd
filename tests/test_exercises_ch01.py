"""Chapter 1's exercise checks accept right answers, reject wrong ones, and never raise.

The right answers here are worked by hand from the chip and model figures, independently of
the references in scalebook/exercises/ch01.py."""

import math

import numpy as np
import pytest

from exercise_harness import standard_tests
from scalebook.exercises import evaluate
from scalebook.hardware import get_chip

v5e, v5p, v6e, h100 = (get_chip(n) for n in ("tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-h100"))
v4 = get_chip("tpu-v4")
D70, F70 = 8192, 28672     # LLaMA-3 70B d_model, d_ff (paper, Table 3)
D8, F8 = 4096, 14336       # LLaMA-3 8B d_model, d_ff (paper, Table 3)


def smallest_batch(D, F, I, s=2, sw=2):
    B = 1
    while 2 * B * D * F < I * (s * B * D + sw * D * F + s * B * F):
        B += 1
    return B


def t_math_1_1():
    return 2 * 4096 * 8192 * 8192 / v5p.bf16_flops


# 1.11: 8B's up projection, B = 128 tokens, bf16, TPU v5e. Shared W: intensity ~ 123 < I*
# ~ 241, so its lower bound is its memory time; a W per token is memory-bound too. Same
# FLOPs, so the ratio of the lower bounds is the ratio of the bytes.
B11 = 128
BYTES_SHARED_11 = 2 * (B11 * D8 + D8 * F8 + B11 * F8)
BYTES_OWN_11 = 2 * (B11 * D8 + B11 * D8 * F8 + B11 * F8)
T_MATH_11 = 2 * B11 * D8 * F8 / v5e.bf16_flops
assert T_MATH_11 < BYTES_SHARED_11 / v5e.hbm_bandwidth
RATIO_11 = BYTES_OWN_11 / BYTES_SHARED_11


RIGHT = {
    "1.1": t_math_1_1(),
    "1.2": 1 / 6,
    "1.3": 1.979e15 / 3.35e12,
    "1.4": smallest_batch(F8, D8, h100.critical_intensity),     # 8B's down projection
    "1.5": smallest_batch(D70, F70, v5e.critical_intensity, sw=1),
    "1.6": 2 * 2.75e14 / 4.5e10,                 # TPU v4: 12,222
    "1.7": 384,                                      # TPU v5p (v5e's 512 is all but printed)
    "1.8": "memory",
    "1.11": RATIO_11,
}

WRONG = {
    "1.1": [2 * (4096 * 8192 * 2 + 8192 * 8192) / v5p.hbm_bandwidth, t_math_1_1() / 2, t_math_1_1() * 1e3,
            t_math_1_1() + 2 * (4096 * 8192 * 2 + 8192**2) / v5p.hbm_bandwidth],
    "1.2": [0.25, 1 / 3, 1 / 12],
    "1.3": [h100.critical_intensity, 1.979e15 / 3.35e12 / 1e3],
    "1.4": [296, 295, RIGHT["1.4"] - 1, RIGHT["1.4"] + 1, 2 * RIGHT["1.4"]],
    "1.5": [smallest_batch(D70, F70, v5e.critical_intensity), RIGHT["1.5"] - 1],
    "1.6": [2.75e14 / 4.5e10, 4 * 2.75e14 / 4.5e10],
    "1.7": [353, 256, 512],
    "1.8": ["compute"],
    "1.11": [1.0, B11, 1 / RATIO_11, BYTES_OWN_11 / v5e.hbm_bandwidth / T_MATH_11,
             RATIO_11 * 1.02],
}


# 1.6: D >= 2C/W. Each slip, and the words its hint must contain (slips that land on the
# same number share a hint, which names them all).
C5E, W5E = v4.bf16_flops, v4.ici_link_bandwidth       # 1.6's chip (names kept short)
SLIPS_1_6 = [
    ("1 FLOP per multiply-add", 2 * 2 * C5E / W5E, "1 FLOP per multiply-add"),
    ("both partial sums one way", 2 * 2 * C5E / W5E, "one direction"),
    ("1 byte per element", 1 * C5E / W5E, "1 byte per element"),
    ("all 2BDF FLOPs per chip", 2 * C5E / W5E / 2, "all 2BDF FLOPs"),
    ("both directions' bandwidth", 2 * C5E / (2 * W5E), "both directions"),
    ("two slips: 1 FLOP per MAC and one way", 4 * 2 * C5E / W5E, "4x too large"),
]

HINTS = {
    "1.1": [(WRONG["1.1"][0], "memory time"), (t_math_1_1() / 2, "2 FLOPs"),
            (WRONG["1.1"][3], "upper bound"), (t_math_1_1() * 1e3, "units")],
    "1.2": [(0.25, "written"), (1 / 3, "2 bytes")],
    "1.3": [(h100.critical_intensity, "bf16 critical intensity")],
    "1.4": [(296, "approximation"), (RIGHT["1.4"] - 1, "one short")],
    # bf16 weights; int8 weights but the int8 peak (twice the FLOP/s: a larger I*)
    "1.5": [(smallest_batch(D70, F70, v5e.critical_intensity), "bf16 weights"),
            (smallest_batch(D70, F70, v5e.int8_flops / v5e.hbm_bandwidth, sw=1), "bf16 peak")],
    "1.6": [(answer, words) for _, answer, words in SLIPS_1_6],
    "1.7": [(353, "multiple of 128"), (256, "too small")],
    "1.11": [(1.0, "the bytes are not"), (B11, "not B"), (1 / RATIO_11, "other way round"),
             (BYTES_OWN_11 / v5e.hbm_bandwidth / T_MATH_11, "memory time")],
}

# Right answers accepted (and the tolerance band on both sides), typical mistakes rejected
# with their hint, ... not attempted, malformed answers answered: tests/exercise_harness.py.
globals().update(standard_tests(1, RIGHT, WRONG, HINTS, all_hints=True))


def test_estimates_within_tolerance_are_accepted():
    assert evaluate("1.1", 1.2e-3).correct          # rounded to 2 figures
    assert evaluate("1.6", 12200).correct
    assert not evaluate("1.6", 7880).correct       # the v5e's threshold, printed in 1.6
    assert evaluate("1.3", np.float32(591)).correct  # NumPy scalars are numbers too
    assert evaluate("1.8", " Memory ").correct


def test_whole_numbers_required_for_batches():
    r = evaluate("1.4", RIGHT["1.4"] + 0.5)
    assert r.status == "wrong" and "whole number" in r.message
    assert evaluate("1.4", float(RIGHT["1.4"])).correct


# ---- code answers ------------------------------------------------------------------------------

def good_bounds(B, D, F, chip):
    c = get_chip(chip)
    t = (2 * B * D * F / c.bf16_flops, 2 * (B * D + D * F + B * F) / c.hbm_bandwidth)
    return max(t), sum(t)


def test_code_1_9_right():
    assert evaluate("1.9", good_bounds).correct
    assert evaluate("1.9", lambda *a: list(good_bounds(*a))).correct
    assert evaluate("1.9", lambda *a: np.array(good_bounds(*a))).correct


def slipped_bounds(flops_per_mac=2, s=2, output=True, combine=lambda t: (max(t), sum(t)),
                   scale=1.0):
    def bounds(B, D, F, chip):
        c = get_chip(chip)
        t = (flops_per_mac * B * D * F / c.bf16_flops,
             s * (B * D + D * F + (B * F if output else 0)) / c.hbm_bandwidth)
        return tuple(scale * x for x in combine(t))
    return bounds


@pytest.mark.parametrize("mistake,answer,words", [
    ("swapped", lambda *a: good_bounds(*a)[::-1], "lower bound comes first"),
    ("min and max", slipped_bounds(combine=lambda t: (min(t), max(t))), "larger of T_math"),
    ("1 FLOP per MAC", slipped_bounds(flops_per_mac=1), "2 FLOPs per multiply-add"),
    ("no output bytes", slipped_bounds(output=False), "output [B, F]"),
    ("1 byte", slipped_bounds(s=1), "2 bytes"),
    ("fp32 bytes", slipped_bounds(s=4), "not 4"),
    ("in ms", slipped_bounds(scale=1e3), "s vs ms"),
    ("a number", lambda *a: 1.0, "return a pair"),
    ("small error", slipped_bounds(scale=1.01), "wrong result"),
])
def test_code_1_9_each_mistake_gets_its_hint(mistake, answer, words):
    r = evaluate("1.9", answer)
    assert r.status == "wrong" and words in r.message, (mistake, r)
    if words != "lower bound comes first":
        assert "lower bound comes first" not in r.message, (mistake, r)


def test_code_1_9_wrong():
    swapped = lambda *a: good_bounds(*a)[::-1]
    r = evaluate("1.9", swapped)
    assert r.status == "wrong" and "lower bound comes first" in r.message
    # Right on memory-bound shapes, wrong on compute-bound ones (FLOPs counted once):
    def half_flops(B, D, F, chip):
        c = get_chip(chip)
        t = (B * D * F / c.bf16_flops, 2 * (B * D + D * F + B * F) / c.hbm_bandwidth)
        return max(t), sum(t)
    assert good_bounds(1, 8192, 28672, "tpu-v5e")[0] == half_flops(1, 8192, 28672, "tpu-v5e")[0]
    assert evaluate("1.9", half_flops).status == "wrong"
    # Ignoring the output bytes: close but not right.
    def no_output(B, D, F, chip):
        c = get_chip(chip)
        t = (2 * B * D * F / c.bf16_flops, 2 * (B * D + D * F) / c.hbm_bandwidth)
        return max(t), sum(t)
    assert evaluate("1.9", no_output).status == "wrong"
    assert evaluate("1.9", lambda *a: 1.0).status == "wrong"
    r = evaluate("1.9", lambda B, D, F, chip: get_chip(chip).bogus)
    assert r.status == "wrong" and "AttributeError" in r.message


def good_batch(D, F, chip):
    return smallest_batch(D, F, get_chip(chip).critical_intensity)


def rounded_batch(D, F, chip):          # round() where ceil() is meant
    I = get_chip(chip).critical_intensity
    return round(I * D * F / (D * F - I * (D + F)))


def test_code_1_10_round_is_not_ceil():
    # The first case's exact bound has a fraction under 0.5, so round() is caught there first.
    I = h100.critical_intensity
    exact = I * 16384 * 53248 / (16384 * 53248 - I * (16384 + 53248))
    assert exact - math.floor(exact) < 0.5
    r = evaluate("1.10", rounded_batch)
    assert r.status == "wrong" and "D=16384, F=53248, chip='gpu-h100'" in r.message, r
    assert "round()" in r.message, r


def test_code_1_10():
    assert evaluate("1.10", good_batch).correct
    approx = lambda D, F, chip: math.ceil(get_chip(chip).critical_intensity)
    r = evaluate("1.10", approx)
    assert r.status == "wrong" and "keeps only the weight bytes" in r.message
    assert evaluate("1.10", lambda *a: good_batch(*a) - 1).status == "wrong"
    # Right only for the first case: a special case cannot pass.
    first = good_batch(8192, 28672, "tpu-v5e")
    assert evaluate("1.10", lambda *a: first).status == "wrong"
    assert evaluate("1.10", lambda *a: None).status == "not attempted"
    assert evaluate("1.10", "310").status == "wrong"


@pytest.mark.parametrize("mistake,answer,words", [
    ("B = I*", lambda D, F, chip: math.ceil(get_chip(chip).critical_intensity), "keeps only the weight bytes"),
    ("round()", rounded_batch, "round()"),
    ("exact bound, not rounded", lambda D, F, chip: good_batch(D, F, chip) - 0.5, "whole number"),
    ("in thousands", lambda D, F, chip: good_batch(D, F, chip) * 1e3, "units"),
])
def test_code_1_10_each_hint_is_reached(mistake, answer, words):
    r = evaluate("1.10", answer)
    assert r.status == "wrong" and words in r.message, (mistake, r)


# ---- variants (an assignment's own numbers): each gets the hints for its own slips ---

def test_1_3_bf16_variant_catches_the_8bit_peak():
    params = {"chip": "tpu-v5e", "dtype": "bf16"}
    assert evaluate("1.3", v5e.bf16_flops / v5e.hbm_bandwidth, variant=params).correct
    r = evaluate("1.3", v5e.int8_flops / v5e.hbm_bandwidth, variant=params)
    assert r.status == "wrong" and "int8 critical intensity" in r.message, r
    from scalebook.exercises import get_exercise
    title = get_exercise("1.3").with_variant(params).title_text()
    assert title == "Critical intensity in bf16"


def test_1_5_int4_variant():
    params = {"weights": "int4"}                     # 70B's up projection on a v5e
    I = v5e.critical_intensity
    right = smallest_batch(D70, F70, I, sw=0.5)
    assert evaluate("1.5", right, variant=params).correct
    r = evaluate("1.5", smallest_batch(D70, F70, I, sw=1), variant=params)
    assert r.status == "wrong" and "int8 weights" in r.message, r
    r = evaluate("1.5", smallest_batch(D70, F70, I), variant=params)
    assert r.status == "wrong" and "half a byte" in r.message, r
    from scalebook.exercises import get_exercise
    variant = get_exercise("1.5").with_variant(params)
    assert variant.title_text() == "int4 weights quarter the batch"
    assert "int4 (half a byte)" in variant.text()


def test_1_6_fp32_partial_sums():
    params = {"psum": "fp32"}                        # two v4 chips, fp32 partial sums
    assert evaluate("1.6", 4 * C5E / W5E, variant=params).correct
    r = evaluate("1.6", 2 * C5E / W5E, variant=params)      # 2 bytes per element
    assert r.status == "wrong" and "2 bytes per element" in r.message, r
    assert "fp32 element of the partial sum takes 4 bytes" in r.message, r
    r = evaluate("1.6", 16 * C5E / W5E, variant=params)
    assert r.status == "wrong" and "sends 4BF bytes" in r.message, r


def test_1_7_gpu_tiles_come_in_steps_of_64():
    n, I = 16384, h100.critical_intensity
    t = 64
    while 2 * n**3 / (2 * (2 * n**3 / t + n * n)) < I:   # X, W read per tile; O once
        t += 64
    params = {"chip": "gpu-h100"}
    assert evaluate("1.7", t, variant=params).correct
    r = evaluate("1.7", t + 32, variant=params)
    assert r.status == "wrong" and "multiple of 64" in r.message, r
    r = evaluate("1.7", t - 64, variant=params)
    assert r.status == "wrong" and "too small" in r.message, r


def test_1_4_variant_titles_name_the_chip():
    from scalebook.exercises import get_exercise
    ex = get_exercise("1.4")
    assert ex.title_text() == "Smallest compute-bound batch on an H100"
    assert ex.with_variant({"chip": "tpu-v6e", "model": "llama3-8b"}).title_text() == \
        "Smallest compute-bound batch on a TPU v6e"
    with pytest.raises(ValueError):          # the chapter prints 70B's batch on a v5e
        ex.with_variant({"chip": "tpu-v5e", "model": "llama3-70b"})


@pytest.mark.parametrize("ex,answer", [("1.9", good_bounds), ("1.10", good_batch)])
def test_code_answers_are_right_on_drawn_inputs(ex, answer):
    from scalebook.exercises import get_exercise
    e = get_exercise(ex)
    cases = e.drawn_cases(b"ch01", n=20)
    assert len(set(cases)) > 10
    assert evaluate(ex, answer, cases=list(e.cases) + cases).correct


def test_1_10_tells_floor_plus_one_from_ceil():
    """A bound that is a whole number (288 on a B200) is itself the answer: int() + 1 is
    one too many there, and the check says so (issue 25)."""
    import math as _m

    def floor_plus_one(D, F, chip):
        c = get_chip(chip)
        i = c.bf16_flops / c.hbm_bandwidth
        return _m.floor(i * D * F / (D * F - i * (D + F))) + 1

    r = evaluate("1.10", floor_plus_one)
    assert r.status == "wrong" and "math.ceil, not int() + 1" in r.message, r
