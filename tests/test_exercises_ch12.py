"""Chapter 12's exercise checks accept right answers, reject wrong ones, and never raise.

The right answers here are worked by hand, independently of scalebook/exercises/ch12.py,
from DeepSeek-V3's published shapes (arXiv:2412.19437: D = 7,168, 61 layers of which 58
MoE, 256 routed experts of width 2,048, top 8; MLA with d_c = 512, d_r = 64, 128 heads of
128 + 64 key and 128 value; 671,030,277,120 parameters by our count), the H800's 80 GB, and
DeepSeek-V2-Lite's MLA (16 heads, the same widths) for 12.5. What the tests require of
every exercise: tests/exercise_harness.py (see tests/test_exercises_ch11.py).
"""

import math

import pytest

from exercise_harness import slip_battery_tests, standard_tests
from scalebook.exercises import evaluate, get_exercise

D, L_MOE, K = 7168, 58, 8
N_TOTAL = 671_030_277_120

# 12.1: 58 layers x 8 experts x 3 D F
R1 = 58 * 8 * 3 * D * 2048
# 12.2: 3 other nodes x D x 1 byte
R2 = 3 * D
# 12.3: 40 layers x (512 + 64) x 1 byte
R3 = 40 * 576
# 12.4: (0.9 x 16 x 80e9 - 671.03e9) / (32,768 x 61 x 576 x 2), rounded down
R4 = math.floor((0.9 * 16 * 80e9 - N_TOTAL) / (32768 * 61 * 576 * 2))
# 12.5: 2 x 16 x (1,024 + 64) FLOPs per key over 576 x 2 bytes
R5 = 2 * 16 * 1088 / 1152
# 12.7: (4 - 1)(1 + 2 + 2 - 3) / 3 = 2 pass pairs idle against 20
R7 = 2 / 22
# 12.8: f = 2 (N_act - head - router) / (2 N_act + 61 x 81,920 x (S + 1) / 2) at S = 32K
N_ACT = 37_556_155_392 - 129280 * 7168              # active matmul parameters (no embed.)
HEAD, ROUTER = 129280 * 7168, 58 * 7168 * 256
F8 = 2 * (N_ACT - HEAD - ROUTER) / (2 * N_ACT + 61 * 2 * 128 * 320 * 32769 / 2)
R8 = 1 / (1 - F8 + F8 / 2)
F8_4K = 2 * (N_ACT - HEAD - ROUTER) / (2 * N_ACT + 61 * 2 * 128 * 320 * 4097 / 2)
# 12.9: 4,096 x 7,168 / 128 scales of 4 bytes
R9 = 4096 * 7168 / 128 * 4
# 12.10: (1 + 0.88) / (1 + 0.05)
R10 = 1.88 / 1.05
# 12.11: 48 tokens x 8 copies x D x 1 byte x 312 / 320
R11 = 48 * 8 * D * 312 / 320
# 12.12: 14.8e12 / (12,288 x 4,096) steps x 10 s x 2,048 GPUs / 3,600
R12 = 14.8e12 / (12288 * 4096) * 10 * 2048 / 3600

RIGHT = {"12.1": R1, "12.2": R2, "12.3": R3, "12.4": R4, "12.5": R5, "12.6": "selection",
         "12.7": R7, "12.8": R8, "12.9": R9, "12.10": R10, "12.11": R11, "12.12": R12,
         "12.14": "expert_weight_gradient"}

WRONG = {
    "12.1": [61 * 8 * 3 * D * 2048, 58 * 8 * 2 * D * 2048, 58 * 9 * 3 * D * 2048,
             58 * 256 * 3 * D * 2048, 2 * R1],
    "12.2": [4 * D, 8 * D, 7 * D, 6 * D, 2 * R2],
    "12.3": [40 * 512, 2 * R3, 128 * R3, R3 * 1.024 ** 3],
    "12.4": [78, 264, 417, R4 + 1],
    "12.5": [16.0, R5 / 16, 2 * 16 * 1088 / 1024, 2 * R5, R5 / 2],
    "12.6": ["gate", "both", "loss"],
    "12.7": [7 / 27, 6 / 26, (5 / 3 * 3) / (20 + 5), (14 / 3) / (20 + 14 / 3), 100 * R7],
    "12.8": [2.0, F8, 1 + F8, 1 - F8 / 2, 100 * R8],
    "12.9": [4096 * 7168 / 128 ** 2 * 4, 4096 * 7168 / 128, 4096 * 4, R9 / 2],
    "12.10": [1.88, 0.88 / 1.05, 1.88 / 2, 100 * R10],
    "12.11": [2 * R11, 48 * 8 * D, 48 * 8 * D * 319 / 320, R11 / 8],
    "12.12": [R12 * 12288 / 15360, R12 * 3600, R12 * 4096,
              R12 / 2048],
    "12.14": ["attention_scores", "router", "output_head"],
}

HINTS = {
    "12.1": [(61 * 8 * 3 * D * 2048, "58 of the 61"), (58 * 8 * 2 * D * 2048, "3 D F"),
             (58 * 9 * 3 * D * 2048, "shared expert"),
             (58 * 256 * 3 * D * 2048, "memory holds")],
    "12.2": [(4 * D, "token's own"), (8 * D, "once per node"), (7 * D, "once per node"),
             (6 * D, "in fp8")],
    "12.3": [(40 * 512, "rotary key"), (2 * R3, "once, not as a key and a value"),
             (128 * R3, "per head")],
    "12.4": [(78, "stand-in"), (264, "90%"), (417, "2 bytes"), (R4 + 1, "round down")],
    "12.5": [(8 * R5, "128 heads"), (16.0, "weighted sum of latents"), (R5 / 16, "read once"),
             (2 * 16 * 1088 / 1024, "rotary key"), (2 * R5, "bf16"), (R5 / 2, "multiply-add")],
    "12.6": [("gate", "raw scores"), ("both", "only to pick"), ("loss", "auxiliary loss")],
    "12.7": [(2 / 20, "idle + N_mb"), (7 / 27, "1F1B"), (6 / 26, "units of T_fwd"),
             (5 / 25, "subtract 3 T_wgt"),
             ((14 / 3) / (20 + 14 / 3), "both ends")],
    "12.8": [(2.0, "Amdahl"), (F8, "fp8 share"), (1 + F8, "fp8 share"),
             (1 - F8 / 2, "inverse"), (1 / (1 - F8_4K / 2), "at 4K")],
    "12.9": [(4096 * 7168 / 128 ** 2 * 4, "1 x 128 tile"), (4096 * 7168 / 128, "4 bytes"),
             (4096 * 4, "T D / 128"), (7168 / 128 * 4, "T D / 128")],
    "12.10": [(1.88, "1 + rho"), (0.88 / 1.05, "1 + alpha tokens"), (0.94, "one step")],
    "12.11": [(2 * R11, "fp8"), (48 * 8 * D, "own node"), (48 * 8 * D * 319 / 320,
                                                           "other 7 GPUs"),
              (R11 / 8, "k = 8 copies")],
    "12.12": [(R12 * 12288 / 15360, "12,288"), (R12 * 3600, "GPU-seconds"),
              (R12 * 4096, "4,096 tokens")],
    "12.14": [("attention_scores", "attention operator"), ("router", "gating"),
              ("output_head", "output head")],
}

globals().update(standard_tests(12, RIGHT, WRONG, HINTS, all_hints=True))
globals().update(slip_battery_tests(12))


# ---- the code exercise -------------------------------------------------------------------

def saving_right(P, n_mb, F, B, W):
    work = n_mb * (F + B)
    one, dual = (P - 1) * (F + B), (P // 2 - 1) * (F + 2 * B - 3 * W)
    return one / (one + work) - dual / (dual + work)


def _share_gap(one, dual, n_mb, F, B, over_work=False):
    work = n_mb * (F + B)
    if over_work:
        return one / work - dual / work
    return one / (one + work) - dual / (dual + work)


@pytest.mark.parametrize("fn, words", [
    (lambda P, n, F, B, W: (P - 1) * (F + B) - (P / 2 - 1) * (F + 2 * B - 3 * W),
     "difference of the idle times"),
    (lambda P, n, F, B, W: _share_gap((P - 1) * (F + B), (P / 2 - 1) * (F + 2 * B - 3 * W),
                                      n, F, B, over_work=True), "not by the work alone"),
    (lambda P, n, F, B, W: -_share_gap(0, (P / 2 - 1) * (F + 2 * B - 3 * W), n, F, B),
     "DualPipe's share alone"),
    (lambda P, n, F, B, W: _share_gap((P - 1) * (F + B), (P - 1) * (F + 2 * B - 3 * W),
                                      n, F, B), "both ends"),
    (lambda P, n, F, B, W: _share_gap((P - 1) * (F + B), (P / 2 - 1) * (F + 2 * B), n, F, B),
     "subtract 3W"),
    (lambda P, n, F, B, W: _share_gap((P - 1) * (F + B),
                                      (P / 2 - 1) * (max(F, B) + B - 3 * W), n, F, B),
     "F + B"),
])
def test_12_13_tells_the_slips_apart_on_its_first_case(fn, words):
    r = evaluate("12.13", fn)
    assert r.status == "wrong" and words in r.message and "n_mb=20," in r.message, r


def test_12_13_accepts_the_formula_on_every_shape():
    assert evaluate("12.13", saving_right).correct
    e = get_exercise("12.13")
    assert len(e.cases) >= 2 and len({c[0] for c in e.cases}) >= 2


def test_12_13_a_special_case_cannot_pass():
    # right for the first case only
    first = saving_right(16, 20, 1.0, 2.0, 1.0)
    r = evaluate("12.13", lambda P, n, F, B, W: first)
    assert r.status == "wrong"


def test_12_13_survives_a_crashing_answer():
    r = evaluate("12.13", lambda P, n, F, B, W: 1 / 0)
    assert r.status == "wrong"
