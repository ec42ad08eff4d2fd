"""Chapter 4 exercises: right answers computed independently here (by hand from the LLaMA-3
shapes in shared/reference/facts.md and the hardware table) are accepted; typical wrong
answers are rejected; an Ellipsis is 'not attempted'."""

import math

import pytest

from scalebook.exercises import evaluate, exercise_ids
from scalebook.hardware import get_chip

# LLaMA-3 shapes (facts.md §1.1): L, d, H, K, h, F, V
M8 = dict(L=32, d=4096, H=32, K=8, h=128, F=14336, V=128256)
M70 = dict(L=80, d=8192, H=64, K=8, h=128, F=28672, V=128256)
M405 = dict(L=126, d=16384, H=128, K=8, h=128, F=53248, V=128256)


def n_params(L, d, H, K, h, F, V, tied=False):
    per_layer = d * H * h + 2 * d * K * h + H * h * d + 3 * d * F + 2 * d
    return V * d + L * per_layer + d + (0 if tied else V * d)


def ok(i, a):
    return evaluate(i, a).status == "correct"


def wrong(i, a):
    return evaluate(i, a).status == "wrong"


def test_at_least_ten_exercises_all_unanswered_by_ellipsis():
    ids = [i for i in exercise_ids() if i.startswith("4.")]
    assert len(ids) >= 10
    for i in ids:
        assert evaluate(i, ...).status == "not attempted"


def test_4_1():
    m = M70
    right = m["d"] * m["H"] * m["h"] * 2 + 2 * m["d"] * m["K"] * m["h"]
    assert ok("4.1", right)
    assert wrong("4.1", 4 * m["d"] * m["H"] * m["h"])                 # multi-head
    assert "grouped-query" in evaluate("4.1", 4 * m["d"] * m["H"] * m["h"]).message
    assert wrong("4.1", right * 80) and wrong("4.1", right + 1)
    q_k_v_only = m["d"] * m["H"] * m["h"] + 2 * m["d"] * m["K"] * m["h"]
    assert wrong("4.1", q_k_v_only) and "W_o" in evaluate("4.1", q_k_v_only).message


def test_4_2():
    m = M405
    right = m["L"] * 3 * m["d"] * m["F"] / n_params(**m)
    assert ok("4.2", right)
    assert wrong("4.2", right * 100) and "percentage" in evaluate("4.2", right * 100).message
    assert wrong("4.2", right * 2 / 3) and "three matrices" in evaluate("4.2", right * 2 / 3).message


def test_4_3():
    right = n_params(**M8, tied=True)
    assert ok("4.3", right)
    assert wrong("4.3", n_params(**M8))
    assert wrong("4.3", right - M8["V"] * M8["d"])


def test_4_4():
    right = 6 * n_params(**M70) * 15e12
    assert ok("4.4", right) and ok("4.4", 6.35e24)
    assert "forward" in evaluate("4.4", right / 3).message
    assert wrong("4.4", 2 * right) and wrong("4.4", right / 6)


def test_4_5():
    peak = get_chip("gpu-h100").bf16_flops
    right = 6 * n_params(**M405) * 15.6e12 / (16384 * peak * 0.40) / 86400
    assert ok("4.5", right)
    assert "40%" in evaluate("4.5", right * 0.4).message
    assert wrong("4.5", right * 24) and wrong("4.5", right * 86400)


def test_4_6():
    m = M8
    matmul_params = m["L"] * (2 * m["d"] * m["H"] * m["h"] + 2 * m["d"] * m["K"] * m["h"]
                              + 3 * m["d"] * m["F"]) + m["V"] * m["d"]
    right = 2 * matmul_params / (4 * m["L"] * m["H"] * m["h"])
    assert ok("4.6", right)
    assert wrong("4.6", 2 * right)
    with_embed = 2 * n_params(**m) / (4 * m["L"] * m["H"] * m["h"])
    assert wrong("4.6", with_embed) and "embedding" in evaluate("4.6", with_embed).message
    no_head = 2 * (matmul_params - m["V"] * m["d"]) / (4 * m["L"] * m["H"] * m["h"])
    assert wrong("4.6", no_head) and "output head" in evaluate("4.6", no_head).message


def test_4_7():
    right = 2 * M70["L"] * M70["K"] * M70["h"] * 2
    assert ok("4.7", right)
    assert "key/value heads" in evaluate("4.7", right * 8).message
    assert wrong("4.7", right / 2) and wrong("4.7", right * 2) and wrong("4.7", right / 80)


def test_4_8():
    hbm = get_chip("gpu-h100").hbm_bytes
    weights = 2 * n_params(**M70)
    per_seq = 2 * M70["L"] * M70["K"] * M70["h"] * 2 * 8192
    right = math.floor((8 * hbm - weights) / per_seq)
    assert ok("4.8", right)
    assert wrong("4.8", right + 1) and wrong("4.8", math.floor(8 * hbm / per_seq))
    assert wrong("4.8", math.floor((8 * hbm - weights) / (per_seq * 8)))
    nominal = math.floor((8 * hbm - 2 * 70e9) / per_seq)          # N = 70e9 instead of exact
    assert wrong("4.8", nominal) and "num_params" in evaluate("4.8", nominal).message
    gib = math.floor((8 * hbm / 1e9 * 2**30 - weights) / per_seq)  # 80 GB read as 80 GiB
    assert wrong("4.8", gib) and "GiB" in evaluate("4.8", gib).message


def test_4_9():
    N = n_params(**M70)
    assert ok("4.9", 16 * N)
    for b in (2, 12, 14, 18):
        assert wrong("4.9", b * N), b


def test_4_10():
    m = M70
    per_layer = 4 * m["d"] + 2 * m["H"] * m["h"] + 2 * m["K"] * m["h"] + 3 * m["F"]
    head = 2 * m["d"] + m["V"]
    right = (m["L"] * per_layer + head) / (m["L"] * m["d"] + per_layer + head)
    assert ok("4.10", right)
    assert wrong("4.10", 1 / right)
    no_extra_layer = (m["L"] * per_layer + head) / (m["L"] * m["d"] + head)
    assert wrong("4.10", no_extra_layer) and "recomputed" in evaluate("4.10", no_extra_layer).message
    no_head = (m["L"] * per_layer) / (m["L"] * m["d"] + per_layer)   # head left out on both sides
    assert wrong("4.10", no_head) and "head" in evaluate("4.10", no_head).message


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


def test_4_13():
    m = M8
    S = 131072
    attn = 4 * m["L"] * S * m["H"] * m["h"]
    dense = 2 * (n_params(**m) - m["V"] * m["d"] - (2 * m["L"] + 1) * m["d"])
    right = "attention" if attn > dense else "weights"
    assert ok("4.13", right)
    assert wrong("4.13", "weights" if right == "attention" else "attention")
    assert wrong("4.13", "mlp")
