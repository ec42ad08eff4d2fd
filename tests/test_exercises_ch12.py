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

from exercise_harness import standard_tests
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
# 12.6: with the biases A 0.90 - 0.25 = 0.65, B 0.70, C 0.60, D 0.45 + 0.30 = 0.75: D and B
# are chosen; D's gate is its raw score over the two raw scores
R6 = 0.45 / (0.45 + 0.70)
# 12.7: (4 - 1)(1 + 2 + 2 - 3) / 3 = 2 pass pairs idle against 20
R7 = 2 / 22
# 12.8: f = 2 (N_act - head - router) / (2 N_act + 61 x 81,920 x (S + 1) / 2) at S = 32K
N_ACT = 37_556_155_392 - 129280 * 7168              # active matmul parameters (no embed.)
HEAD, ROUTER = 129280 * 7168, 58 * 7168 * 256
F8 = 2 * (N_ACT - HEAD - ROUTER) / (2 * N_ACT + 61 * 2 * 128 * 320 * 32769 / 2)
R8 = 1 / (1 - F8 + F8 / 2)
F8_4K = 2 * (N_ACT - HEAD - ROUTER) / (2 * N_ACT + 61 * 2 * 128 * 320 * 4097 / 2)
ATT8, ATT8_FULL = 61 * 2 * 128 * 320 * 32769 / 2, 61 * 2 * 128 * 320 * 32768


def speedup(fp8, fwd):
    return 1 / (1 - fp8 / fwd + fp8 / fwd / 2)


R4_NO_WEIGHTS = math.floor(0.9 * 16 * 80e9 / (32768 * 61 * 576 * 2))
R4_ONE_GPU = math.floor((0.9 * 80e9 - N_TOTAL / 16) / (32768 * 61 * 576 * 2))
# 12.14: LLaMA-3 70B (D 8,192, 80 layers, 64 heads of 128, 8 KV heads, F 28,672, V 128,256)
# at S = 8,192: per token, the linear layers 2 x 80 x (2 D^2 + 2 D 1,024 + 3 D F) FLOPs in
# fp8; the head 2 V D and the causal attention 4 x 80 x 64 x 128 x (S + 1) / 2 in bf16. The
# backward doubles both, so the shares are the forward's; an fp8 FLOP takes half the time.
LIN14 = 2 * 80 * (2 * 8192 ** 2 + 2 * 8192 * 1024 + 3 * 8192 * 28672)
HEAD14, ATT14 = 2 * 128256 * 8192, 4 * 80 * 64 * 128 * 8193 / 2
ATT14_FULL = 4 * 80 * 64 * 128 * 8192
R14 = (HEAD14 + ATT14) / (HEAD14 + ATT14 + LIN14 / 2)
# 12.9: 4,096 x 7,168 / 128 scales of 4 bytes
R9 = 4096 * 7168 / 128 * 4
# 12.10: (1 + 0.88) / (1 + 0.05)
R10 = 1.88 / 1.05
# 12.11: 48 tokens x 8 copies x D x 1 byte x 312 / 320
R11 = 48 * 8 * D * 312 / 320
# 12.12: 14.8e12 / (12,288 x 4,096) steps x 10 s x 2,048 GPUs / 3,600
R12 = 14.8e12 / (12288 * 4096) * 10 * 2048 / 3600

RIGHT = {"12.1": R1, "12.2": R2, "12.3": R3, "12.4": R4, "12.5": R5, "12.6": R6,
         "12.7": R7, "12.8": R8, "12.9": R9, "12.10": R10, "12.11": R11, "12.12": R12,
         "12.14": R14}

WRONG = {
    "12.1": [61 * 8 * 3 * D * 2048, 58 * 8 * 2 * D * 2048, 58 * 9 * 3 * D * 2048,
             58 * 256 * 3 * D * 2048, 2 * R1],
    "12.2": [4 * D, 8 * D, 7 * D, 6 * D, 2 * R2],
    "12.3": [40 * 512, 2 * R3, 128 * R3, R3 * 1.024 ** 3],
    "12.4": [78, 264, 417, R4 + 1],
    "12.5": [16.0, R5 / 16, 2 * 16 * 1088 / 1024, 2 * R5, R5 / 2],
    "12.6": [0.75 / (0.75 + 0.70), 0, 0.45, 0.45 / 2.65, 0.70 / 1.15, 0.45 / 1.35],
    "12.7": [7 / 27, 6 / 26, (5 / 3 * 3) / (20 + 5), (14 / 3) / (20 + 14 / 3), 100 * R7],
    "12.8": [2.0, F8, 1 + F8, 1 - F8 / 2, 100 * R8],
    "12.9": [4096 * 7168 / 128 ** 2 * 4, 4096 * 7168 / 128, 4096 * 4, R9 / 2],
    "12.10": [1.88, 0.88 / 1.05, 1.88 / 2, 100 * R10],
    "12.11": [2 * R11, 48 * 8 * D, 48 * 8 * D * 319 / 320, R11 / 8],
    "12.12": [R12 * 12288 / 15360, R12 * 3600, R12 * 4096,
              R12 / 2048],
    "12.14": [(HEAD14 + ATT14) / (HEAD14 + ATT14 + LIN14), R14 * 100, 1 - R14, 0,
              (3 * (HEAD14 + ATT14) + 2 * LIN14)
              / (3 * (HEAD14 + ATT14) + 2 * LIN14 + LIN14 / 2)],
}

HINTS = {
    "12.1": [(61 * 8 * 3 * D * 2048, "58 of the 61"), (58 * 8 * 2 * D * 2048, "3 D F"),
             (58 * 9 * 3 * D * 2048, "shared expert"),
             (58 * 256 * 3 * D * 2048, "memory holds"),
             (58 * 8 * D * 2048, "of D x F each"), (8 * 3 * D * 2048, "count all 58")],
    "12.2": [(4 * D, "token's own"), (8 * D, "once per node"), (7 * D, "once per node"),
             (6 * D, "in fp8")],
    "12.3": [(40 * 512, "rotary key"), (2 * R3, "once, not as a key and a value"),
             (128 * R3, "per head"), (61 * 576, "61 are not"), (576, "one layer"),
             (40 * 128 * 320, "uncompressed cache")],
    "12.4": [(78, "stand-in"), (264, "90%"), (417, "2 bytes"), (R4 + 1, "round down"),
             (R4_NO_WEIGHTS, "weights first"), (R4_ONE_GPU, "one GPU's share")],
    "12.5": [(8 * R5, "128 heads"), (8 * R5, "bits"), (16.0, "weighted sum of latents"),
             (R5 / 16, "read once"),
             (2 * 16 * 1088 / 1024, "rotary key"), (2 * R5, "bf16"), (R5 / 2, "multiply-add"),
             ((2 * 16 * 192 + 2 * 16 * 128) / 1152, "meet the latent"),
             (R5 * 576 / (16 * 320), "uncompressed key"), (1 / R5, "bytes per FLOP")],
    # the gate from the biased scores; D left out (no bias in the choice); no
    # normalisation; over all four; B's gate; over D and A (the raw top 2 with D)
    "12.6": [(0.75 / (0.75 + 0.70), "the bias only chooses"), (0, "among the top 2"),
             (0.45, "add up to 1"), (0.45 / 2.65, "not all four"),
             (0.70 / 1.15, "that is the gate of B"),
             (math.exp(0.45) / (math.exp(0.45) + math.exp(0.70)), "not a softmax"),
             (0.75, "biased score"), (0.45 / 2.05, "or three")],
    "12.7": [(2 / 20, "idle + N_mb"), (7 / 27, "1F1B"), (6 / 26, "units of T_fwd"),
             (5 / 25, "subtract 3 T_wgt"),
             ((14 / 3) / (20 + 14 / 3), "both ends"),
             ((8 / 3) / (20 + 8 / 3), "not P/2."), (1 / 21, "not max(T_fwd"),
             (4 / 24, "not T_wgt once")],
    "12.8": [(2.0, "Amdahl"), (F8, "fp8 share"), (1 + F8, "fp8 share"),
             (1 - F8 / 2, "inverse"), (1 / (1 - F8_4K / 2), "at 4K"),
             (speedup(2 * N_ACT, 2 * N_ACT + ATT8), "take them out"),
             (speedup(2 * (N_ACT - HEAD - ROUTER), 2 * N_ACT), "add MLA's attention"),
             (speedup(2 * (N_ACT - HEAD - ROUTER), 2 * N_ACT + ATT8_FULL), "causal")],
    "12.9": [(4096 * 7168 / 128 ** 2 * 4, "1 x 128 tile"), (4096 * 7168 / 128, "4 bytes"),
             (4096 * 4, "T D / 128"), (7168 / 128 * 4, "T D / 128"), (4, "T D / 128"),
             (7168 * 4, "T D / 128"), (4096 * 7168 + R9, "scales alone")],
    "12.10": [(1.88, "1 + rho"), (0.88 / 1.05, "1 + alpha tokens"), (0.94, "one step"),
              (1.83, "do not subtract"), (2 / 1.05, "not always"), (1.88 / 1.1, "once a step")],
    "12.11": [(2 * R11, "fp8"), (48 * 8 * D, "own node"), (48 * 8 * D * 319 / 320,
                                                           "other 7 GPUs"),
              (R11 / 8, "k = 8 copies"), (R11 / 8, "bits"),
              (R11 * 1.024, "KiB"), (R11 / 1.024, "KiB"), (48 * 3 * D, "no node limit"),
              (2 * R11, "not the combine")],
    "12.12": [(R12 * 12288 / 15360, "12,288"), (R12 * 3600, "GPU-seconds"),
              (R12 * 4096, "4,096 tokens"), (R12 / 24, "GPU-days"),
              (2.664e6, "reported figure"), (14.8e12 / (12288 * 4096), "number of steps")],
    "12.14": [((HEAD14 + ATT14) / (HEAD14 + ATT14 + LIN14), "share of the FLOPs"),
              ((3 * (HEAD14 + ATT14) + 2 * LIN14)
               / (3 * (HEAD14 + ATT14) + 2 * LIN14 + LIN14 / 2), "Wgrad"),
              (ATT14 / (ATT14 + (LIN14 + HEAD14) / 2), "output head stays in bf16"),
              (HEAD14 / (HEAD14 + (LIN14 + ATT14) / 2), "attention operator"),
              ((HEAD14 + ATT14_FULL) / (HEAD14 + ATT14_FULL + LIN14 / 2), "causal=True"),
              (1 - R14, "fp8 matmuls' share"), (0, "not everything"),
              ((HEAD14 + ATT14) / (LIN14 / 2), "bf16 time over the fp8 time"),
              ((3 * (HEAD14 + ATT14) + LIN14) / (3 * (HEAD14 + ATT14) + 2 * LIN14),
               "(Wgrad) runs in fp8 too"),
              ((2 * HEAD14 + ATT14) / (2 * HEAD14 + ATT14 + LIN14 / 2), "a lookup")],
}

globals().update(standard_tests(12, RIGHT, WRONG, HINTS, all_hints=True))


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
    (lambda P, n, F, B, W: -saving_right(P, n, F, B, W), "DualPipe's share minus"),
    (lambda P, n, F, B, W: 100 * saving_right(P, n, F, B, W), "not a percentage"),
    (lambda P, n, F, B, W: saving_right(P, n * (F + B + W) / (F + B), F, B, W),
     "W is part of the backward"),
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


# ---- the varied exercises 12.6 and 12.14 on other numbers --------------------------------

def test_12_6_on_a_variant_where_the_bias_picks_a_and_d():
    # A 0.90 - 0.20 = 0.70, B 0.65, C 0.60, D 0.40 + 0.40 = 0.80: D and A are chosen
    params = {"sA": 0.9, "sB": 0.65, "sC": 0.6, "sD": 0.4, "bA": 0.2, "bD": 0.4}
    assert evaluate("12.6", 0.40 / 1.30, variant=params).correct
    r = evaluate("12.6", 0.80 / 1.50, variant=params)
    assert "the bias only chooses" in r.message, r
    assert "gate of A" in evaluate("12.6", 0.90 / 1.30, variant=params).message


def test_12_6_variants_keep_the_slips_apart():
    """Every valid variant picks D only with its bias and leaves each slip 3% from the
    answer (an unnormalised score that happens to equal the gate would pass)."""
    ex = get_exercise("12.6")
    for i in range(40):
        params = ex.draw(bytes([i]) * 16)
        v = ex.with_variant(params)
        ref = float(v.reference())
        assert not evaluate("12.6", params["sD"], variant=params).correct
        assert evaluate("12.6", ref, variant=params).correct


def test_12_14_on_405b_at_4k():
    # 405B: D 16,384, 126 layers, 128 heads of 128, 8 KV heads, F 53,248, V 128,256
    lin = 2 * 126 * (2 * 16384 ** 2 + 2 * 16384 * 1024 + 3 * 16384 * 53248)
    head, att = 2 * 128256 * 16384, 4 * 126 * 128 * 128 * 4097 / 2
    params = {"model": "llama3-405b", "S": 4096}
    right = (head + att) / (head + att + lin / 2)
    assert evaluate("12.14", right, variant=params).correct
    assert "share of the FLOPs" in evaluate("12.14", (head + att) / (head + att + lin),
                                            variant=params).message


def test_12_14_refuses_variants_where_the_head_hides():
    """At 128K tokens the 8B's output head is under 3% of the bf16 time: a variant there
    could not tell a head run in fp8 from the answer, so none is drawn."""
    ex = get_exercise("12.14")
    assert not ex.valid(model="llama3-8b", S=131072)
    assert ex.valid(model="llama3-70b", S=8192)
