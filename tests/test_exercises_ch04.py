"""Chapter 4's exercise checks accept right answers, reject typical wrong ones, never raise.

The right answers here are computed independently (by hand from the LLaMA-3 shapes in
shared/reference/facts.md and the hardware table), not by the references in
scalebook/exercises/ch04.py. Code answers run on several configurations."""

import math

import pytest

from exercise_harness import standard_tests
from scalebook.exercises import chapter_ids, evaluate, get_exercise
from scalebook.hardware import get_chip

# LLaMA-3 shapes (facts.md §1.1): L, d, H, K, h, F, V
M8 = dict(L=32, d=4096, H=32, K=8, h=128, F=14336, V=128256)
M70 = dict(L=80, d=8192, H=64, K=8, h=128, F=28672, V=128256)
M405 = dict(L=126, d=16384, H=128, K=8, h=128, F=53248, V=128256)
MISTRAL7 = dict(M8, V=32000)     # Mistral 7B: LLaMA-3 8B's shapes, a 32,000-token vocabulary


def n_params(L, d, H, K, h, F, V, tied=False):
    per_layer = d * H * h + 2 * d * K * h + H * h * d + 3 * d * F + 2 * d
    return V * d + L * per_layer + d + (0 if tied else V * d)


def ok(i, a):
    return evaluate(i, a).status == "correct"


def wrong(i, a):
    return evaluate(i, a).status == "wrong"


def attention_params(m):
    return m["d"] * m["H"] * m["h"] * 2 + 2 * m["d"] * m["K"] * m["h"]


def mlp_share(m):
    return m["L"] * 3 * m["d"] * m["F"] / n_params(**m)


def training_flops(m, tokens):
    return 6 * n_params(**m) * tokens


def train_days_405b():
    peak = get_chip("gpu-h100").bf16_flops
    return training_flops(M405, 15.6e12) / (16384 * peak * 0.40) / 86400


def matmul_params(m):
    return m["L"] * (2 * m["d"] * m["H"] * m["h"] + 2 * m["d"] * m["K"] * m["h"]
                     + 3 * m["d"] * m["F"]) + m["V"] * m["d"]


def s_star(n_mm, m):
    return 2 * n_mm / (4 * m["L"] * m["H"] * m["h"])


def kv_bytes_per_token(m):
    return 2 * m["L"] * m["K"] * m["h"] * 2


HBM = get_chip("gpu-h100").hbm_bytes
WEIGHTS70 = 2 * n_params(**M70)
PER_SEQ = kv_bytes_per_token(M70) * 8192
ACT70 = 4 * M70["d"] + 2 * M70["H"] * M70["h"] + 2 * M70["K"] * M70["h"] + 3 * M70["F"]
HEAD70 = 2 * M70["d"] + M70["V"]
S128K = 131072
ATTN_8B = 4 * M8["L"] * S128K * M8["H"] * M8["h"]
DENSE_8B = 2 * (n_params(**M8) - M8["V"] * M8["d"] - (2 * M8["L"] + 1) * M8["d"])

RIGHT = {
    "4.1": attention_params(M70),
    "4.2": mlp_share(MISTRAL7),
    "4.3": n_params(**M8, tied=True),
    "4.4": training_flops(M70, 15e12),
    "4.5": train_days_405b(),
    "4.6": s_star(matmul_params(M8), M8),
    "4.7": kv_bytes_per_token(M70) * 8 / 2,          # all 64 heads (G = 8), 1 byte
    "4.8": math.floor((8 * HBM - WEIGHTS70) / PER_SEQ),
    "4.9": 18 * n_params(**M405),                   # fp32 gradients: 2 + 4 + 4 + 8
    "4.10": (M70["L"] * ACT70 + HEAD70) / (M70["L"] * M70["d"] + ACT70 + HEAD70),
    "4.13": "attention" if ATTN_8B > DENSE_8B else "weights",
}

# typical mistakes that also have a specific hint
MULTI_HEAD = 4 * M70["d"] * M70["H"] * M70["h"]
Q_K_V_ONLY = M70["d"] * M70["H"] * M70["h"] + 2 * M70["d"] * M70["K"] * M70["h"]
WITH_EMBED = s_star(n_params(**M8), M8)
NO_HEAD_4_6 = s_star(matmul_params(M8) - M8["V"] * M8["d"], M8)
NOMINAL = math.floor((8 * HBM - 2 * 70e9) / PER_SEQ)               # N = 70e9 instead of exact
GIB = math.floor((8 * HBM / 1e9 * 2**30 - WEIGHTS70) / PER_SEQ)    # 80 GB read as 80 GiB
NO_EXTRA_LAYER = (M70["L"] * ACT70 + HEAD70) / (M70["L"] * M70["d"] + HEAD70)
NO_HEAD_4_10 = (M70["L"] * ACT70) / (M70["L"] * M70["d"] + ACT70)  # head left out on both sides

WRONG = {
    "4.1": [MULTI_HEAD, RIGHT["4.1"] * 80, RIGHT["4.1"] + 1, Q_K_V_ONLY],
    "4.2": [RIGHT["4.2"] * 100, RIGHT["4.2"] * 2 / 3],
    "4.3": [n_params(**M8), RIGHT["4.3"] - M8["V"] * M8["d"]],
    "4.4": [2 * RIGHT["4.4"], RIGHT["4.4"] / 6, RIGHT["4.4"] / 3],
    "4.5": [RIGHT["4.5"] * 0.4, RIGHT["4.5"] * 24, RIGHT["4.5"] * 86400],
    "4.6": [2 * RIGHT["4.6"], WITH_EMBED, NO_HEAD_4_6],
    "4.7": [RIGHT["4.7"] / 8, RIGHT["4.7"] / 2, RIGHT["4.7"] * 2, RIGHT["4.7"] / 80],
    "4.8": [RIGHT["4.8"] + 1, math.floor(8 * HBM / PER_SEQ),
            math.floor((8 * HBM - WEIGHTS70) / (PER_SEQ * 8)), NOMINAL, GIB],
    "4.9": [b * n_params(**M405) for b in (2, 12, 14, 16, 20)],
    "4.10": [1 / RIGHT["4.10"], NO_EXTRA_LAYER, NO_HEAD_4_10],
    "4.13": ["weights" if RIGHT["4.13"] == "attention" else "attention"],
}

HINTS = {   # a typical mistake -> words its hint must contain
    "4.1": [(MULTI_HEAD, "grouped-query"), (Q_K_V_ONLY, "W_o")],
    "4.2": [(RIGHT["4.2"] * 100, "percentage"), (RIGHT["4.2"] * 2 / 3, "three matrices")],
    "4.4": [(RIGHT["4.4"] / 3, "forward")],
    "4.5": [(RIGHT["4.5"] * 0.4, "40%")],
    "4.6": [(WITH_EMBED, "embedding"), (NO_HEAD_4_6, "output head")],
    "4.7": [(RIGHT["4.7"] / 8, "8 key/value heads")],
    "4.8": [(NOMINAL, "num_params"), (GIB, "GiB")],
    "4.10": [(NO_EXTRA_LAYER, "recomputed"), (NO_HEAD_4_10, "head")],
}

# 4.9: each slip, built from the bytes per parameter (2 weights + 4 fp32 grads + 4 master +
# 8 Adam)
N405 = n_params(**M405)
SLIPS_4_9 = [
    ("no master copy", (2 + 4 + 0 + 8) * N405, "master copy"),
    ("one Adam moment", (2 + 4 + 4 + 4) * N405, "one of Adam's two moments"),
    ("no gradients", (2 + 0 + 4 + 8) * N405, "fp32 gradients (4 bytes)"),
    ("bf16 gradients", (2 + 2 + 4 + 8) * N405, "keeps the gradients in fp32"),
    ("fp32 working weights", (4 + 4 + 4 + 8) * N405, "working copy"),
    ("only the weights", 2 * N405, "only the bf16 weights"),
]
HINTS["4.9"] = [(answer, words) for _, answer, words in SLIPS_4_9]
HINTS["4.3"] = [(n_params(**M8), "untied"), (RIGHT["4.3"] - M8["V"] * M8["d"], "twice")]
HINTS["4.1"] += [(2 * M70["d"] * M70["H"] * M70["h"], "W_k and W_v"),
                 (RIGHT["4.1"] * 80, "80 layers")]
HINTS["4.2"] += [(MISTRAL7["L"] * (2 * MISTRAL7["d"] * MISTRAL7["H"] * MISTRAL7["h"]
                                   + 2 * MISTRAL7["d"] * MISTRAL7["K"] * MISTRAL7["h"])
                  / n_params(**MISTRAL7), "attention share"),
                 (mlp_share(M8), "LLaMA-3 8B's share"),                  # section 4.2's table
                 (mlp_share(M8) * n_params(**M8)                         # the head left at V
                  / (n_params(**M8) - (M8["V"] - 32000) * M8["d"]), "both V x D matrices")]
HINTS["4.4"] += [(RIGHT["4.4"] * 2 / 3, "backward pass only"),
                 (RIGHT["4.4"] / 6, "N N_tok"),
                 (3 * n_params(**M70) * 15e12, "3 N N_tok"),
                 (12 * n_params(**M70) * 15e12, "12 N N_tok")]
HINTS["4.5"] += [(RIGHT["4.5"] * 86400, "seconds"), (RIGHT["4.5"] * 24, "hours"),
                 # the H100's fp8 peak, 1979 TFLOP/s, for its bf16 one
                 (training_flops(M405, 15.6e12) / (16384 * 1.979e15 * 0.40) / 86400,
                  "fp8 peak")]
HINTS["4.1"] += [(2 * RIGHT["4.1"], "bf16 bytes")]
HINTS["4.3"] += [(2 * RIGHT["4.3"], "bf16 bytes")]
HINTS["4.6"] += [(2 * RIGHT["4.6"], "causal=False"), (RIGHT["4.6"] * M8["H"] // M8["K"], "every query head")]
HINTS["4.7"] = [(RIGHT["4.7"] / 8, "8 key/value heads"), (RIGHT["4.7"] / 2, "both cached"),
                (RIGHT["4.7"] * 8, "multiplies it by G = 8, not by H"),
                (RIGHT["4.7"] * 8, "bits"), (RIGHT["4.7"] / 8, "bits"),
                (RIGHT["4.7"] * 2, "that is bf16"), (RIGHT["4.7"] / 4, "chapter's figure"),
                (RIGHT["4.7"] / 80, "one layer"),
                (RIGHT["4.7"] * 1.01, "off by more than 0.1%")]
HINTS["4.8"] += [(math.floor(8 * HBM / PER_SEQ), "weights take their share"),
                 (RIGHT["4.8"] + 1, "round down"),
                 (math.floor((8 * HBM - WEIGHTS70) / (PER_SEQ * 8)), "n_kv_heads")]
HINTS["4.10"] += [(1 / RIGHT["4.10"], "upside down")]

# 4.14: LLaMA-3 70B with 16 experts of its MLP shape, top 2, router [d, E] per layer
E14, K14 = 16, 2
MLP70 = 3 * M70["d"] * M70["F"]
ROUTER70 = M70["L"] * M70["d"] * E14
ACTIVE14 = n_params(**M70) + M70["L"] * (K14 - 1) * MLP70 + ROUTER70
TOTAL14 = n_params(**M70) + M70["L"] * (E14 - 1) * MLP70 + ROUTER70
NORMS70 = (2 * M70["L"] + 1) * M70["d"]
RIGHT["4.14"] = ACTIVE14
WRONG["4.14"] = [TOTAL14, ACTIVE14 - ROUTER70, ACTIVE14 - M70["L"] * MLP70, n_params(**M70),
                 ACTIVE14 - M70["V"] * M70["d"] - NORMS70, ACTIVE14 + 1]
HINTS["4.14"] = [(TOTAL14, "that is the total"), (ACTIVE14 - ROUTER70, "routers"),
                 (ACTIVE14 - M70["L"] * MLP70, "not one"), (n_params(**M70), "dense model"),
                 (ACTIVE14 - M70["V"] * M70["d"] - NORMS70, "embedding and the norms"),
                 (ACTIVE14 - ROUTER70 // M70["L"], "very close: check the router"),
                 (2 * ACTIVE14, "bf16 bytes")]

# 4.15: weight_dots keeps 2d + H h + 2 K h + 2F per token per layer (bf16, 80 layers)
KEPT70 = 2 * M70["d"] + M70["H"] * M70["h"] + 2 * M70["K"] * M70["h"] + 2 * M70["F"]
RIGHT["4.15"] = M70["L"] * KEPT70 * 2
SCORES70 = M70["H"] * 8192 + M70["H"] * M70["h"]          # dots_saveable keeps these too
MISTAKES_4_15 = [
    (M70["L"] * (KEPT70 + M70["d"]) * 2, "W_d's output is not kept"),
    (M70["L"] * (KEPT70 - M70["d"]) * 2, "one D-wide value is missing"),
    (M70["L"] * (KEPT70 - M70["K"] * M70["h"]) * 2, "keys AND values"),
    (M70["L"] * (KEPT70 + M70["F"]) * 2, "SiLU-gated product"),
    (M70["L"] * KEPT70 * 2 + 2 * (2 * M70["d"] + M70["V"]), "layers only"),
    (M70["L"] * (KEPT70 - 2 * M70["d"]) * 2, "the layer's input"),
    (M70["L"] * (KEPT70 + 2 * (M70["H"] - M70["K"]) * M70["h"]) * 2, "n_kv_heads"),
    (KEPT70 * 2, "one layer"),
    (M70["L"] * KEPT70 * 4, "f32"),
    (M70["L"] * KEPT70, "counts values"),
    (M70["L"] * (KEPT70 + SCORES70) * 2, "dots_saveable"),
]
WRONG["4.15"] = [a for a, _ in MISTAKES_4_15]
# kB read as KiB (1.024x) is not the head added (1.0215x)
HINTS["4.15"] = list(MISTAKES_4_15) + [(RIGHT["4.15"] * 1.024, "KiB")]

# 4.16: 70B, fp8 weights, int4 cache (0.5 byte), 4 H100s, 32K context
N70 = n_params(**M70)
KV_INT4 = 2 * M70["L"] * M70["K"] * M70["h"] * 0.5 * 32768


def batch_416(weights=1 * N70, per_seq=KV_INT4, hbm=HBM):
    return math.floor((4 * hbm - weights) / per_seq)


RIGHT["4.16"] = batch_416()
MISTAKES_4_16 = [
    (batch_416(per_seq=4 * KV_INT4), "bf16 cache"),
    (batch_416(per_seq=2 * KV_INT4), "8-bit cache"),
    (batch_416(weights=2 * N70), "fp8 here"),
    (batch_416(weights=0), "weights take their share"),
    (batch_416(hbm=HBM / 1e9 * 2**30), "GiB"),
    (batch_416() + 1, "round down"),
]
WRONG["4.16"] = [a for a, _ in MISTAKES_4_16]
HINTS["4.16"] = list(MISTAKES_4_16)

# Right answers accepted (and the tolerance band on both sides), typical mistakes rejected
# with their hint, ... not attempted, malformed answers answered: tests/exercise_harness.py.
# Every hint of every numeric exercise is reached by a built mistake (all_hints).
globals().update(standard_tests(4, RIGHT, WRONG, HINTS, all_hints=True))


def test_4_8_one_too_many_and_the_nominal_count_share_a_hint_that_names_both():
    assert NOMINAL == RIGHT["4.8"] + 1      # the two slips give the same batch
    msg = evaluate("4.8", NOMINAL).message
    assert "num_params" in msg and "round down" in msg


def test_4_9_one_hint_names_the_three_14_byte_slips():
    msg = evaluate("4.9", 14 * N405).message
    assert "master copy" in msg and "moments" in msg and "gradients" in msg
    assert ok("4.9", 7.3e12)                      # 7.31 TB to 2 significant figures


def test_4_2_mistral_7b_has_its_published_count():
    assert n_params(**MISTRAL7) == 7_241_732_096


def test_4_16_the_nominal_count_is_one_too_many():
    assert batch_416(weights=70e9) == RIGHT["4.16"] + 1
    assert "num_params" in evaluate("4.16", RIGHT["4.16"] + 1).message


def test_at_least_ten_exercises():
    assert len(chapter_ids(4)) >= 10


def test_rounded_estimates_pass():
    assert ok("4.4", 6.35e24)


def test_a_choice_outside_the_question_says_what_is_expected():
    r = evaluate("4.13", "mlp")
    assert r.status == "wrong" and "'attention'" in r.message and "'weights'" in r.message


def test_4_11_code():
    def right(n_layers, n_kv_heads, head_dim, batch, context, bytes_per_element):
        return 2 * n_layers * n_kv_heads * head_dim * batch * context * bytes_per_element

    def no_values(n_layers, n_kv_heads, head_dim, batch, context, bytes_per_element):
        return n_layers * n_kv_heads * head_dim * batch * context * bytes_per_element

    def bf16_only(n_layers, n_kv_heads, head_dim, batch, context, bytes_per_element):
        return 2 * n_layers * n_kv_heads * head_dim * batch * context * 2   # right on bf16 cases only

    def stub(n_layers, n_kv_heads, head_dim, batch, context, bytes_per_element):
        ...

    assert ok("4.11", right)
    assert wrong("4.11", no_values) and "factor 2" in evaluate("4.11", no_values).message
    assert wrong("4.11", bf16_only)
    assert evaluate("4.11", stub).status == "not attempted"


def _kv(factor=2, batch=True, bpe=True, fixed_bpe=None, scale=1):
    def kv_cache_bytes(n_layers, n_kv_heads, head_dim, b, context, bytes_per_element):
        s = fixed_bpe if fixed_bpe is not None else (bytes_per_element if bpe else 1)
        return scale * factor * n_layers * n_kv_heads * head_dim * (b if batch else 1) * context * s
    return kv_cache_bytes


@pytest.mark.parametrize("mistake,answer,words", [
    ("keys only", _kv(factor=1), "factor 2"),
    ("no batch", _kv(batch=False), "batch"),
    ("no bytes per element", _kv(bpe=False), "multiply by bytes_per_element"),
    ("always 2 bytes", _kv(fixed_bpe=2), "not 2 bytes"),
    ("in GiB", _kv(scale=1 / 2**30), "units"),
    ("bits", _kv(scale=8), "bits vs bytes"),
])
def test_4_11_each_mistake_gets_its_own_hint(mistake, answer, words):
    r = evaluate("4.11", answer)
    assert r.status == "wrong" and words in r.message, (mistake, r)
    if words != "factor 2":
        assert "factor 2" not in r.message, (mistake, r)


def test_4_12_code():
    def right(L, d, H, K, h, F, V, tied):
        return n_params(L, d, H, K, h, F, V, tied)

    def no_norms(L, d, H, K, h, F, V, tied):
        return n_params(L, d, H, K, h, F, V, tied) - (2 * L + 1) * d

    def always_untied(L, d, H, K, h, F, V, tied):   # wrong only on the tied case
        return n_params(L, d, H, K, h, F, V, False)

    def square_q(L, d, H, K, h, F, V, tied):          # assumes H h = d: wrong only on one case
        return n_params(L, d, H, K, h, F, V, tied) + 2 * L * d * (d - H * h)

    assert ok("4.12", right)
    assert "RMSNorm" in evaluate("4.12", no_norms).message
    assert "tied" in evaluate("4.12", always_untied).message
    assert "need not equal" in evaluate("4.12", square_q).message


def _p(L, d, H, K, h, F, V, tied, norms=True, kv_heads=None, q_dim=None, head=None):
    kv = K if kv_heads is None else kv_heads
    q = H * h if q_dim is None else q_dim
    per_layer = 2 * d * q + 2 * d * kv * h + 3 * d * F + (2 * d if norms else 0)
    untied = (not tied) if head is None else head
    return V * d + L * per_layer + (d if norms else 0) + (V * d if untied else 0)


@pytest.mark.parametrize("mistake,answer,words", [
    ("no norms", lambda *a: _p(*a, norms=False), "RMSNorm"),
    ("no output head", lambda *a: _p(*a, head=False), "untied: the output head"),
    ("head counted when tied", lambda *a: _p(*a, head=True), "tied: the output head reuses"),
    ("MHA k and v", lambda L, d, H, K, h, F, V, t: _p(L, d, H, K, h, F, V, t, kv_heads=H),
     "n_kv_heads heads"),
    ("q and o as d x d", lambda L, d, H, K, h, F, V, t: _p(L, d, H, K, h, F, V, t, q_dim=d),
     "need not equal"),
])
def test_4_12_each_hint_is_reached(mistake, answer, words):
    r = evaluate("4.12", answer)
    assert r.status == "wrong" and words in r.message, (mistake, r)


# ------------------------------------------------------------------------------------------
# Variants (assignments draw other numbers per student): worked by hand like the above
# ------------------------------------------------------------------------------------------

def test_4_1_a_variant_with_fewer_kv_heads_and_its_own_slips():
    v = {"model": "llama3-405b", "kv_heads": 1}
    m = dict(M405, K=1)
    assert ok_v("4.1", attention_params(m), v) and not ok_v("4.1", RIGHT["4.1"], v)
    assert "grouped-query" in evaluate("4.1", 4 * m["d"] * m["H"] * m["h"], variant=v).message
    assert "126 layers" in evaluate("4.1", attention_params(m) * 126, variant=v).message
    text = get_exercise("4.1").with_variant(v).text()
    assert "LLaMA-3 405B" in text and "1 key/value head (multi-query" in text


def test_4_5_a_variant_names_its_own_mfu():
    v = {"chip": "gpu-b200", "gpus": 8192, "mfu": 0.30}
    peak = get_chip("gpu-b200").bf16_flops
    days = training_flops(M405, 15.6e12) / (8192 * peak * 0.30) / 86400
    assert ok_v("4.5", days, v)
    assert "30%" in evaluate("4.5", days * 0.30, variant=v).message


def test_4_8_a_variant_and_its_slips():
    v = {"model": "llama3-405b", "chip": "gpu-h200", "gpus": 16, "context": 32768}
    hbm = get_chip("gpu-h200").hbm_bytes
    per_seq = kv_bytes_per_token(M405) * 32768
    right = math.floor((16 * hbm - 2 * n_params(**M405)) / per_seq)
    assert ok_v("4.8", right, v) and not ok_v("4.8", RIGHT["4.8"], v)
    assert "share of HBM" in evaluate("4.8", math.floor(16 * hbm / per_seq), variant=v).message
    # here the nominal 405e9 gives the right batch: one too many has its own hint
    assert math.floor((16 * hbm - 2 * 405e9) / per_seq) == right
    assert "round down" in evaluate("4.8", right + 1, variant=v).message


def test_4_14_a_variant_with_four_experts_per_token():
    v = {"model": "llama3-8b", "E": 64, "k": 4}
    mlp, router = 3 * M8["d"] * M8["F"], M8["L"] * M8["d"] * 64
    active = n_params(**M8) + M8["L"] * 3 * mlp + router
    assert ok_v("4.14", active, v)
    assert "other 3 experts" in evaluate("4.14", n_params(**M8), variant=v).message
    assert "D x 64" in evaluate("4.14", active - router // M8["L"], variant=v).message


def test_4_16_a_variant_and_its_slips():
    v = {"model": "llama3-8b", "chip": "gpu-h100", "gpus": 2, "context": 65536}
    kv = 2 * M8["L"] * M8["K"] * M8["h"] * 65536
    N8 = n_params(**M8)
    right = math.floor((2 * HBM - N8) / (kv * 0.5))
    assert ok_v("4.16", right, v)
    assert "bf16 cache" in evaluate("4.16", math.floor((2 * HBM - N8) / (kv * 2)),
                                    variant=v).message
    assert "not 8e9" in evaluate("4.16", right + 1, variant=v).message


def ok_v(i, a, variant):
    return evaluate(i, a, variant=variant).status == "correct"


@pytest.mark.parametrize("ex,right", [
    ("4.11", lambda L, K, h, b, T, s: 2 * L * K * h * b * T * s),
    ("4.12", lambda L, d, H, K, h, F, V, tied: n_params(L, d, H, K, h, F, V, tied)),
])
def test_drawn_inputs_pass_a_right_function(ex, right):
    e = get_exercise(ex)
    cases = e.drawn_cases(b"ch04", n=40)
    assert all(e._equal(right(*c), e.reference(*c)) for c in cases)
    assert evaluate(ex, right).correct
