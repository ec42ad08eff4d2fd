"""scalebook.models: exact LLaMA-3 counts, formulas checked by independent arithmetic, and
bad configurations rejected with a clear message."""

import math

import pytest

from scalebook.errors import UnknownNameError
from scalebook.models import TransformerConfig, get_model, model_names

# Published totals (Hugging Face safetensors metadata; see shared/reference/facts.md §1.2).
PUBLISHED = {"llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496,
             "llama3-405b": 405_853_388_800}


def tiny(**kw):
    base = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=160,
                vocab_size=100)
    base.update(kw)
    return TransformerConfig("tiny", **base)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_llama3_param_counts_match_published(name):
    m = get_model(name)
    assert isinstance(m.num_params(), int)
    assert m.num_params() == PUBLISHED[name]
    assert m.param_breakdown().total == PUBLISHED[name]


def test_llama3_8b_breakdown_by_hand():
    # 8B: L=32, d=4096, H=32, K=8, h=128, F=14336, V=128256 (facts.md §1.1)
    b = get_model("llama3-8b").param_breakdown()
    assert b.embedding == 128256 * 4096 == b.output_head
    assert b.attention == 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024)
    assert b.mlp == 32 * 3 * 4096 * 14336
    assert b.norms == 32 * 2 * 4096 + 4096
    s = b.shares()
    assert math.isclose(sum(s.values()), 1.0)
    assert 0.16 < s["attention"] < 0.17 and 0.70 < s["mlp"] < 0.71


def test_tied_embeddings_drop_the_head():
    untied, tied = tiny(), tiny(tied_embeddings=True)
    assert untied.num_params() - tied.num_params() == 100 * 64
    assert tied.param_breakdown().output_head == 0
    # the tied table still does the head matmul: same matmul parameters as untied
    assert tied.matmul_params() == untied.matmul_params()


def test_q_dim_may_differ_from_d_model():
    c = tiny(n_heads=2, head_dim=48)   # H h = 96 != d = 64
    assert c.attention_params_per_layer() == 64 * 96 + 2 * 64 * 2 * 48 + 96 * 64


def test_kv_cache_llama3():
    # 2 (k and v) x L x K x h x 2 bytes
    assert get_model("llama3-8b").kv_cache_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131072
    assert get_model("llama3-70b").kv_cache_bytes_per_token() == 2 * 80 * 8 * 128 * 2
    assert get_model("llama3-405b").kv_cache_bytes_per_token(1) == 2 * 126 * 8 * 128
    m = get_model("llama3-70b")
    assert m.kv_cache_bytes(4, 8192) == 4 * 8192 * 2 * 80 * 8 * 128 * 2
    assert isinstance(m.kv_cache_bytes(4, 8192), int)


def test_training_flops_6nd_and_paper():
    m = get_model("llama3-405b")
    assert m.training_flops(1000) == 6 * 405_853_388_800 * 1000
    # LLaMA-3 paper (arXiv:2407.21783 §1): 3.8e25 FLOPs for 405B on 15.6T tokens
    assert math.isclose(m.training_flops(15.6e12), 3.8e25, rel_tol=0.01)
    assert m.training_flops(0) == 0


def test_attention_flops_formula():
    m = get_model("llama3-8b")
    S = 8192
    full = 4 * 32 * 32 * 128 * S
    assert m.attention_flops_per_token(S) == full
    assert m.attention_flops_per_token(S, causal=True) == full * (S + 1) / (2 * S)
    fwd = m.forward_flops_per_token(S)
    assert fwd == 2 * (m.num_params() - 128256 * 4096 - (32 * 2 * 4096 + 4096)) + full
    assert m.backward_flops_per_token(S) == 2 * fwd
    assert m.training_flops_per_token(S) == 3 * fwd
    with_attn = m.training_flops_with_attention(10, S)
    assert with_attn == m.training_flops(10) + 3 * full * 10
    # attention grows linearly with S: doubling S doubles the attention term only
    assert m.forward_flops_per_token(2 * S) - fwd == pytest.approx(full)


def test_layer_matmuls_sum_to_dense_flops():
    for c, B, S in [(get_model("llama3-70b"), 2, 4096), (tiny(), 3, 7), (tiny(tied_embeddings=True), 1, 5)]:
        mms = c.layer_matmuls(B, S)
        weights = sum(mm.flops for mm in mms if mm.is_weight)
        attn = sum(mm.flops for mm in mms if not mm.is_weight)
        head = c.head_matmul(B, S).flops
        assert c.n_layers * weights + head == c.dense_flops_per_token() * B * S
        assert c.n_layers * attn == c.attention_flops_per_token(S) * B * S
        for mm in mms:   # bytes: every operand and the output once, 2 bytes each
            size = lambda shape: math.prod(shape)
            assert mm.bytes == 2 * (size(mm.lhs) + size(mm.rhs) + size(mm.out))


def test_training_memory_mixed_precision():
    m = get_model("llama3-70b")
    N = 70_553_706_496
    mem = m.training_memory()
    assert mem.weights == 2 * N and mem.gradients == 2 * N
    assert mem.master_weights == 4 * N and mem.optimizer == 8 * N
    assert mem.total == 16 * N
    assert m.training_memory(grad_bytes=4).total == 18 * N
    assert m.weight_bytes() == 2 * N


def test_activation_memory():
    c = tiny()
    per_layer = 4 * 64 + 2 * 64 + 2 * 32 + 3 * 160
    head = 2 * 64 + 100
    assert c.activation_bytes_per_token(bytes_per_element=1) == 2 * per_layer + head
    assert c.activation_bytes_per_token(remat=True, bytes_per_element=1) == 2 * 64 + per_layer + head
    m = get_model("llama3-70b")
    assert m.activation_bytes_per_token(remat=True) < m.activation_bytes_per_token() / 5


@pytest.mark.parametrize("kw, words", [
    (dict(n_heads=6, n_kv_heads=4), "multiple of n_kv_heads"),
    (dict(n_layers=0), "n_layers"),
    (dict(d_model=-8), "d_model"),
    (dict(head_dim=15), "head_dim"),
    (dict(d_ff=3.5), "d_ff"),
    (dict(vocab_size=True), "vocab_size"),
    (dict(rope_theta=0), "rope_theta"),
    (dict(tied_embeddings="yes"), "tied_embeddings"),
])
def test_bad_configs_rejected(kw, words):
    with pytest.raises(ValueError, match=words):
        tiny(**kw)


def test_bad_arguments_rejected():
    m = get_model("llama3-8b")
    with pytest.raises(ValueError, match="tokens"):
        m.training_flops(-1)
    with pytest.raises(ValueError, match="seq_len"):
        m.attention_flops_per_token(0)
    with pytest.raises(ValueError, match="batch"):
        m.kv_cache_bytes(0, 10)
    with pytest.raises(ValueError, match="context"):
        m.kv_cache_bytes(1, 2.5)
    with pytest.raises(ValueError, match="bytes_per_element"):
        m.kv_cache_bytes_per_token(0)
    with pytest.raises(ValueError, match="weight_bytes"):
        m.training_memory(weight_bytes=-2)


def test_unknown_model_lists_known():
    with pytest.raises(UnknownNameError) as e:
        get_model("llama3-7b")
    for n in model_names():
        assert n in str(e.value)
    assert get_model("Llama-3-70B") is get_model("llama3-70b")
    assert get_model(get_model("llama3-8b")) is get_model("llama3-8b")


def test_published_constants_agree_with_test_table():
    from scalebook.models import PUBLISHED_PARAMS
    assert PUBLISHED_PARAMS == PUBLISHED


# -- einsum FLOPs, MoE counts, remat policies (chapter 4) -----------------------------------

def test_einsum_flops_counts_every_dimension_once():
    from scalebook.models import einsum_flops
    assert einsum_flops("ij,jk->ik", (3, 5), (5, 7)) == 2 * 3 * 5 * 7
    # GQA scores: batch b and k, contracting h, free s, g, t
    assert einsum_flops("bskgh,btkh->bkgst", (2, 8, 3, 4, 16), (2, 10, 3, 16)) \
        == 2 * 2 * 8 * 10 * 3 * 4 * 16
    assert einsum_flops("bd,d->b", (4, 6), (6,)) == 2 * 4 * 6      # matrix-vector


@pytest.mark.parametrize("spec,shapes,words", [
    ("ij,jk", ((2, 3), (3, 4)), "look like"),
    ("ij,jk->ik", ((2, 3), (4, 5)), "in another"),
    ("ij,jk->ik", ((2, 3, 1), (3, 4)), "letters"),
    ("ijx,jk->ik", ((2, 3, 5), (3, 4)), "summed inside one operand"),
    ("ij,jk,kl->il", ((2, 3), (3, 4), (4, 5)), "two operands"),
])
def test_einsum_flops_refuses_what_the_rule_does_not_cover(spec, shapes, words):
    from scalebook.models import einsum_flops
    with pytest.raises(ValueError, match=words):
        einsum_flops(spec, *shapes)


def test_mixtral_counts_by_hand():
    from scalebook.models import MIXTRAL_8X7B, MIXTRAL_PUBLISHED
    L, d, H, K, h, F, V, E, k = 32, 4096, 32, 8, 128, 14336, 32000, 8, 2
    attn = 2 * d * H * h + 2 * d * K * h
    shared = 2 * V * d + L * (attn + 2 * d + d * E) + d
    total, active = shared + L * E * 3 * d * F, shared + L * k * 3 * d * F
    m = MIXTRAL_8X7B
    assert m.total_params() == total == 46_702_792_704
    assert m.active_params() == active
    assert m.active_matmul_params() == active - V * d - (2 * L + 1) * d
    assert round(total / 1e9) == round(MIXTRAL_PUBLISHED["total"] / 1e9)
    assert round(active / 1e9) == round(MIXTRAL_PUBLISHED["active"] / 1e9)
    assert m.training_flops(10) == 60 * active
    assert m.weight_bytes(2) == 2 * total
    assert m.all_to_all_bytes_per_token(2) == k * d * 2


def test_moe_with_one_expert_is_the_dense_model_plus_its_router():
    from scalebook.models import MoEConfig
    c = tiny()
    m = MoEConfig(c, 1, 1)
    assert m.total_params() == m.active_params() == c.num_params() + c.n_layers * c.d_model


@pytest.mark.parametrize("E,k", [(0, 1), (2, 3), (4, 0), (2.5, 1)])
def test_moe_rejects_bad_expert_counts(E, k):
    from scalebook.models import MoEConfig
    with pytest.raises(ValueError):
        MoEConfig(tiny(), E, k)


def test_remat_values_and_recompute_by_hand():
    c = tiny()                    # D 64, H h 64, H_kv h 32, F 160, H 4
    D, Hh, kv, F, H, T = 64, 64, 32, 160, 4, 50
    assert c.saved_values_per_layer_per_token("nothing", T) == D
    assert c.saved_values_per_layer_per_token("attention_out", T) == D + Hh
    assert c.saved_values_per_layer_per_token("weight_dots", T) == 2 * D + Hh + 2 * kv + 2 * F
    assert c.saved_values_per_layer_per_token("dots", T) \
        == 2 * D + 2 * Hh + 2 * kv + 2 * F + H * T
    weights_but_down = 2 * (2 * D * Hh + 2 * D * kv + 2 * D * F)
    assert c.recompute_flops_per_layer_per_token("nothing", T) == weights_but_down + 4 * T * Hh
    assert c.recompute_flops_per_layer_per_token("attention_out", T) \
        == weights_but_down + 2 * T * Hh
    assert c.recompute_flops_per_layer_per_token("weight_dots", T) == 4 * T * Hh
    assert c.recompute_flops_per_layer_per_token("dots", T) == 0
    with pytest.raises(ValueError, match="policy must be one of"):
        c.saved_values_per_layer_per_token("everything")
    with pytest.raises(ValueError, match="policy must be one of"):
        c.recompute_flops_per_layer_per_token("full", T)
