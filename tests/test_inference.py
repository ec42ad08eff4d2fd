"""scalebook.inference (chapter 7): every formula against a hand computation, every bad
input refused with a message; the sharded decode loop and speculative decoding of
scalebook.llama on the 8-device CPU mesh."""

import math

import numpy as np
import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from scalebook import hlo, llama  # noqa: E402
from scalebook import inference as inf  # noqa: E402
from scalebook.hardware import get_chip  # noqa: E402
from scalebook.models import TransformerConfig, get_model  # noqa: E402

m8, m70 = get_model("llama3-8b"), get_model("llama3-70b")
v5e, h100 = get_chip("tpu-v5e"), get_chip("gpu-h100")


# -- rooflines ------------------------------------------------------------------------------
def test_decode_critical_batch_by_hand():
    assert inf.decode_critical_batch(v5e) == pytest.approx(1.97e14 * 2 / (2 * 8.19e11))
    # int8 weights, bf16 compute: half; int8 weights and int8 compute: the same as bf16
    assert inf.decode_critical_batch(v5e, "int8") == pytest.approx(inf.decode_critical_batch(v5e) / 2)
    assert inf.decode_critical_batch(v5e, "int8", "int8") == pytest.approx(3.94e14 / (2 * 8.19e11))
    assert inf.decode_critical_batch(v5e, "int4") == pytest.approx(inf.decode_critical_batch(v5e) / 4)
    assert inf.decode_critical_batch(h100, "fp8", "fp8") == pytest.approx(1.979e15 / (2 * 3.35e12))


def test_decode_critical_batch_approaches_the_exact_roofline():
    from scalebook import roofline
    exact = roofline.critical_batch(m70.d_model, m70.d_ff, v5e)
    assert exact == pytest.approx(inf.decode_critical_batch(v5e), rel=0.05)


def test_modified_chip_is_accepted():
    fast = v5e.with_(hbm_bandwidth=2 * v5e.hbm_bandwidth)
    assert inf.decode_critical_batch(fast) == pytest.approx(inf.decode_critical_batch(v5e) / 2)


@pytest.mark.parametrize("S,G,h", [(4096, 8, 128), (1024, 4, 64), (8192, 1, 128)])
def test_attention_intensity_prefill_and_decode(S, G, h):
    pre = inf.attention_cost(S, S, G, h)
    assert pre.flops == 4 * G * S * S * h
    assert pre.bytes == 2 * (2 * G * S * h + 2 * S * h)
    assert pre.intensity == pytest.approx(S * G / (G + 1))
    dec = inf.attention_cost(1, S, G, h)
    assert dec.intensity == pytest.approx(2 * G * S / (2 * (G + S)))
    assert dec.intensity == pytest.approx(G, rel=G / S * 1.01)      # G T / (G + T)
    naive = inf.attention_cost(S, S, G, h, fused=False)
    assert naive.bytes == pre.bytes + 2 * 2 * G * S * S
    assert naive.intensity < 2 * h / 2


def test_naive_attention_bytes_match_chapter_4_layer_matmuls():
    c, S = m8, 512
    mm = {m.name: m for m in c.layer_matmuls(1, S)}
    ch4 = mm["attention scores q.k"].bytes + mm["attention weighted sum of v"].bytes
    ch4_flops = mm["attention scores q.k"].flops + mm["attention weighted sum of v"].flops
    ours = inf.attention_cost(S, S, c.group_size, c.head_dim, fused=False)
    assert ours.bytes * c.n_kv_heads == ch4
    assert ours.flops * c.n_kv_heads == ch4_flops


# -- KV cache -------------------------------------------------------------------------------
def test_kv_bytes_per_token_variants():
    L, H, K, h = 80, 64, 8, 128
    assert inf.kv_bytes_per_token(m70) == 2 * L * K * h * 2 == m70.kv_cache_bytes_per_token()
    assert inf.kv_bytes_per_token(m70, "mha") == 2 * L * H * h * 2
    assert inf.kv_bytes_per_token(m70, "mqa") == 2 * L * 1 * h * 2
    assert inf.kv_bytes_per_token(m70, dtype="int8") == 2 * L * K * h
    assert inf.kv_bytes_per_token(m70, dtype="fp8") == 2 * L * K * h
    assert inf.kv_bytes_per_token(m70, dtype="int4") == L * K * h
    assert inf.kv_bytes_per_token(m70, layers_per_kv=2) == L * K * h * 2


def test_kv_bytes_per_sequence_with_local_layers():
    per_layer = 2 * 8 * 128 * 2
    assert inf.kv_bytes_per_sequence(m8, 8192) == 32 * per_layer * 8192
    got = inf.kv_bytes_per_sequence(m8, 8192, window=1024, local_layers=16)
    assert got == per_layer * (16 * 8192 + 16 * 1024)
    assert inf.kv_bytes_per_sequence(m8, 512, window=1024, local_layers=32) == 32 * per_layer * 512


def test_paged_kv_tokens():
    u = inf.paged_kv_tokens([1, 16, 17, 100], page_size=16, max_context=128)
    assert (u.used, u.paged, u.reserved) == (134, 16 + 16 + 32 + 112, 512)
    assert u.paged_waste == pytest.approx(1 - 134 / 176)
    assert u.reserved_waste == pytest.approx(1 - 134 / 512)


# -- what fits ------------------------------------------------------------------------------
def test_fit_batch_by_hand():
    fit = inf.fit_batch(m70, h100, 8, 8192)
    free = 8 * 80e9 - m70.num_params() * 2
    assert fit.max_batch == math.floor(free / (327_680 * 8192))
    assert fit.free == pytest.approx(free)
    assert inf.fit_batch(m70, h100, 8, 8192, kv_dtype="int8").max_batch == math.floor(
        free / (327_680 / 2 * 8192))


def test_weights_that_do_not_fit_say_by_how_much():
    with pytest.raises(ValueError, match=r"do not fit .* short") as e:
        inf.fit_batch(m70, v5e, 4, 8192)
    assert "77.1 GB short" in str(e.value)     # 141.1 GB - 64 GB


def test_a_batch_that_does_not_fit_says_by_how_much():
    need = m70.num_params() * 2 + 64 * 327_680 * 8192
    with pytest.raises(ValueError) as e:
        inf.check_fits(m70, h100, 2, 64, 8192)
    msg = str(e.value)
    assert f"{(need - 160e9) / 1e9:.0f} GB more than" in msg and "at most 7 fit" in msg
    with pytest.raises(ValueError, match="more than"):
        inf.decode_step_time(m70, h100, 64, 8192, n_chips=2)
    assert inf.check_fits(m70, h100, 2, 7, 8192) == pytest.approx(
        m70.num_params() * 2 + 7 * 327_680 * 8192)


def test_chips_to_fit():
    assert inf.chips_to_fit(m8, h100) == 1
    assert inf.chips_to_fit(m70, h100) == 4          # 141 GB <= half of 320 GB
    assert inf.chips_to_fit(m70, h100, weight_share=1.0) == 2


# -- step times -----------------------------------------------------------------------------
def test_decode_step_time_by_hand():
    B, T, n = 16, 4096, 8
    st = inf.decode_step_time(m70, h100, B, T, n_chips=n)
    Nmm = m70.matmul_params()
    flops = 2 * Nmm * B + 4 * 80 * 64 * 128 * B * T
    nbytes = Nmm * 2 + B * T * 327_680
    assert st.flops == flops and st.bytes == nbytes
    assert st.t_math == pytest.approx(flops / (n * 9.89e14))
    assert st.t_mem == pytest.approx(nbytes / (n * 3.35e12))
    assert st.lower == st.t_mem and st.bound == "memory"
    assert st.upper == pytest.approx(st.t_math + st.t_mem)
    assert st.throughput == pytest.approx(B / st.t_mem)


def test_decode_step_with_per_sequence_contexts():
    even = inf.decode_step_time(m8, h100, 4, 1000)
    mixed = inf.decode_step_time(m8, h100, 4, [500, 1500, 1000, 1000])
    assert mixed.bytes == even.bytes and mixed.flops == even.flops


def test_large_batch_decode_turns_compute_bound_without_kv():
    # with a short context, decode becomes compute-bound near the critical batch
    B = 2 * int(inf.decode_critical_batch(h100))
    assert inf.decode_step_time(m8, h100, B, 1, check_memory=False).bound == "compute"
    assert inf.decode_step_time(m8, h100, 8, 1).bound == "memory"


def test_prefill_time_by_hand():
    st = inf.prefill_time(m70, h100, 2, 4096, n_chips=8)
    flops = 2 * 4096 * m70.forward_flops_per_token(4096, causal=True)
    assert st.flops == flops and st.tokens == 8192
    assert st.bound == "compute"
    assert st.t_math == pytest.approx(flops / (8 * 9.89e14))
    assert inf.prefill_time(m70, h100, 2, 4096, 8, causal=False).flops == \
        2 * 4096 * m70.forward_flops_per_token(4096)


def test_latency_throughput_is_monotone():
    pts = inf.latency_throughput(m8, h100, 1, 8192)
    assert [p.batch for p in pts][-1] == inf.fit_batch(m8, h100, 1, 8192).max_batch
    lat = [p.lower for p in pts]
    thr = [p.throughput for p in pts]
    assert lat == sorted(lat) and thr == sorted(thr)


# -- sharding -------------------------------------------------------------------------------
def test_tp_decode_times_by_hand():
    B, n = 8, 8
    tp = inf.tp_decode_times(m70, v5e, B, n)
    ar = 2 * (n - 1) / n * B * 8192 * 2 / (2 * 5e10)
    assert tp.t_comm == pytest.approx(2 * 80 * ar)
    assert tp.t_mem == pytest.approx(m70.matmul_params() * 2 / (n * 8.19e11))
    lat = inf.tp_decode_times(m70, v5e, B, n, hop_latency=1e-6)
    assert lat.t_comm == pytest.approx(tp.t_comm + 2 * 80 * 14 * 1e-6)


def test_ici_bound_degree_is_where_comm_meets_memory():
    n_star = inf.ici_bound_tp_degree(m70, v5e, 256)
    assert n_star > 1
    lo = inf.tp_decode_times(m70, v5e, 256, math.floor(n_star))
    hi = inf.tp_decode_times(m70, v5e, 256, math.ceil(n_star))
    assert lo.t_comm <= lo.t_mem and hi.t_comm >= hi.t_mem


def test_kv_cache_sharding():
    assert inf.kv_cache_sharding(8, 32, 4) == inf.KVSharding(4, 1)
    assert inf.kv_cache_sharding(8, 32, 32) == inf.KVSharding(8, 4)
    assert inf.kv_cache_sharding(8, 36, 12) == inf.KVSharding(4, 3)
    assert inf.kv_cache_sharding(4, 6, 8) == inf.KVSharding(4, 2)
    assert inf.kv_cache_sharding(8, 32, 32).fraction_per_shard == 1 / 32
    with pytest.raises(ValueError, match="multiple of 4"):
        inf.kv_cache_sharding(8, 30, 32)


def test_weight_stationary_comm_bytes():
    B, D, F = 64, 8192, 28672
    assert inf.weight_stationary_comm_bytes("1d", B, D, F, 16) == 2 * 15 / 16 * B * D * 2
    X, Y = 2, 8
    want = 2 * (X - 1) / X * B * F * 2 / Y + 2 * (Y - 1) / Y * B * D * 2 / X
    assert inf.weight_stationary_comm_bytes("2d", B, D, F, (X, Y)) == pytest.approx(want)
    # at 64 chips the best 2D split beats 1D
    best = min(inf.weight_stationary_comm_bytes("2d", B, D, F, (x, 64 // x)) for x in (2, 4, 8, 16))
    assert best < inf.weight_stationary_comm_bytes("1d", B, D, F, 64)


# -- speculative decoding -------------------------------------------------------------------
@pytest.mark.parametrize("alpha,k", [(0.0, 3), (0.5, 1), (0.8, 4), (1.0, 5), (0.9, 7)])
def test_speculative_tokens_per_step(alpha, k):
    assert inf.speculative_tokens_per_step(alpha, k) == pytest.approx(
        sum(alpha ** i for i in range(k + 1)))


def test_speculative_gain():
    g = inf.speculative_gain(0.8, 4, 0.1)
    assert g.tokens_per_step == pytest.approx((1 - 0.8 ** 5) / 0.2)
    assert g.cost_per_step == pytest.approx(1.4)
    assert g.speedup == pytest.approx(g.tokens_per_step / 1.4)
    assert inf.speculative_gain(0.1, 4, 0.5).speedup < 1     # a poor draft does not pay
    k = inf.best_draft_length(0.8, 0.05)
    assert all(inf.speculative_gain(0.8, k, 0.05).speedup >= inf.speculative_gain(0.8, j, 0.05).speedup
               for j in range(1, 17))


# -- simulator ------------------------------------------------------------------------------
def test_simulator_step_costs_match_the_formulas():
    # one request, fixed lengths: prefill then output_len - 1 decode steps, each costed by
    # prefill_time / decode_step_time
    r = inf.simulate_serving(m8, h100, 1, rate=1.0, n_requests=1, prompt_len=100, output_len=4)
    want_ttft = inf.prefill_time(m8, h100, 1, 100).lower
    want_rest = sum(inf.decode_step_time(m8, h100, 1, 100 + i).lower for i in (1, 2, 3))
    assert r.ttft[0] == pytest.approx(want_ttft)
    assert r.latency[0] == pytest.approx(want_ttft + want_rest)
    assert r.tpot[0] == pytest.approx(want_rest / 3)


def test_continuous_batching_beats_static_on_latency():
    kw = dict(n_requests=120, prompt_len=(64, 512), output_len=(16, 256), seed=3)
    cont = inf.simulate_serving(m8, h100, 1, rate=20.0, **kw)
    stat = inf.simulate_serving(m8, h100, 1, rate=20.0, policy="static", **kw)
    assert cont.percentile("ttft", 50) < stat.percentile("ttft", 50)
    assert cont.throughput >= 0.95 * stat.throughput
    again = inf.simulate_serving(m8, h100, 1, rate=20.0, **kw)
    assert again == cont                                        # deterministic with a seed


# -- bad input ------------------------------------------------------------------------------
@pytest.mark.parametrize("call,word", [
    (lambda: inf.kv_bytes_per_token(m70, dtype="int3"), "known: f32, bf16, fp16, fp8, int8, int4"),
    (lambda: inf.kv_bytes_per_token(m70, "mla"), "attention must be one of mha, gqa, mqa"),
    (lambda: inf.kv_bytes_per_token(m70, layers_per_kv=3), "must divide the 80 layers"),
    (lambda: inf.kv_bytes_per_sequence(m70, 8192, local_layers=4), "window="),
    (lambda: inf.kv_bytes_per_sequence(m70, 0), "context"),
    (lambda: inf.decode_critical_batch("tpu-v5e", "bf17"), "weight_dtype='bf17'"),
    (lambda: inf.decode_critical_batch("tpu-v5e", compute_dtype="int4"), "compute_dtype"),
    (lambda: inf.decode_critical_batch("gpu-h100", compute_dtype="int8"), "no published int8"),
    (lambda: inf.decode_critical_batch("tpu-v9"), "known chips"),
    (lambda: inf.attention_cost(0, 10, 1, 64), "queries"),
    (lambda: inf.attention_cost(1, 10, 1, 64, fused="yes"), "fused"),
    (lambda: inf.decode_step_time(m8, h100, 0, 100), "batch"),
    (lambda: inf.decode_step_time(m8, h100, 2, [100]), "2 lengths|1 lengths"),
    (lambda: inf.decode_step_time(m8, h100, 2, "long"), "context"),
    (lambda: inf.decode_step_time(m8, h100, 2, 100, n_chips=0), "n_chips"),
    (lambda: inf.prefill_time(m8, h100, 1, -5), "seq_len"),
    (lambda: inf.fit_batch(m8, h100, 1, 100, hbm_fraction=1.5), "hbm_fraction"),
    (lambda: inf.paged_kv_tokens([10, 300], 16, 256), "longer than max_context"),
    (lambda: inf.paged_kv_tokens("abc", 16, 256), "lengths"),
    (lambda: inf.kv_cache_sharding(0, 8, 8), "n_kv_heads"),
    (lambda: inf.weight_stationary_comm_bytes("3d", 1, 8, 8, 2), "layout"),
    (lambda: inf.weight_stationary_comm_bytes("2d", 1, 8, 8, 4), r"mesh=\(X, Y\)"),
    (lambda: inf.speculative_tokens_per_step(1.2, 4), "probability"),
    (lambda: inf.speculative_tokens_per_step(0.5, 0), "k"),
    (lambda: inf.speculative_gain(0.5, 4, -1), "cost_ratio"),
    (lambda: inf.simulate_serving(m8, h100, 1, rate=0), "rate"),
    (lambda: inf.simulate_serving(m8, h100, 1, rate=1, policy="fifo"), "policy"),
    (lambda: inf.simulate_serving(m8, h100, 1, rate=1, prompt_len=(10, 5)), "low <= high"),
    (lambda: inf.simulate_serving(m8, h100, 1, rate=1, max_batch=10_000), "do not fit"),
    (lambda: inf.tp_decode_times(m8, h100, 1, 0), "n_tp"),
])
def test_bad_input_is_refused_with_a_message(call, word):
    with pytest.raises((ValueError, TypeError, KeyError), match=word):
        call()


# -- on the mesh ----------------------------------------------------------------------------
TINY = TransformerConfig("tiny-serve", n_layers=2, d_model=64, n_heads=8, n_kv_heads=4,
                         head_dim=16, d_ff=128, vocab_size=128)


@pytest.fixture(scope="module")
def served():
    params = llama.init_params(TINY, jax.random.key(0))
    mesh = scalebook.make_mesh((2, 4), ("data", "model"))
    prompt = jax.random.randint(jax.random.key(1), (4, 5), 0, TINY.vocab_size)
    return params, mesh, prompt


def test_sharded_greedy_equals_full_recompute(served):
    params, mesh, prompt = served
    got, cache = llama.generate_greedy_sharded(params, prompt, 6, TINY, mesh)
    ref, _ = llama.generate_greedy(params, prompt, 6, TINY)
    assert bool(jnp.all(got == ref))
    full = llama.forward(params, got, TINY)
    assert bool(jnp.all(jnp.argmax(full[:, 4:-1], -1) == got[:, 5:]))
    assert cache[0][0].sharding.spec[:3] == ("data", None, "model")
    assert llama.cache_bytes(cache) == TINY.kv_cache_bytes(4, 11, 4)
    assert cache[0][0].addressable_shards[0].data.nbytes * 8 == cache[0][0].nbytes


def test_sharded_decode_step_collectives_and_memory(served):
    params, mesh, prompt = served
    B, T = 4, 16
    cache = llama.init_kv_cache(TINY, B, T, jnp.float32)
    p_sh, c_sh = llama.shard_for_decode(params, cache, TINY, mesh)
    step = llama.sharded_forward_with_cache(TINY, mesh)
    compiled = step.lower(p_sh, prompt[:, :1], c_sh, 3).compile()
    recs = hlo.collectives(compiled)
    ar = [r for r in recs if r.kind == "all-reduce"]
    ag = [r for r in recs if r.kind == "all-gather"]
    assert len(ar) == 2 * TINY.n_layers and len(ag) == 1 and len(recs) == len(ar) + len(ag)
    from scalebook.collectives import ring_bytes
    assert all(r.group_size == 4 for r in recs)
    assert all(r.bytes_per_device == ring_bytes("all-reduce", B // 2 * TINY.d_model * 4, 4)
               for r in ar)
    assert ag[0].bytes_per_device == ring_bytes("all-gather", B // 2 * TINY.vocab_size * 4, 4)
    mem = hlo.memory(compiled)
    assert mem.aliased == TINY.kv_cache_bytes(B, T, 4) // 8      # the donated cache, per device


def test_sharded_decoder_refuses_bad_meshes(served):
    params, mesh, prompt = served
    with pytest.raises(ValueError, match="not an axis"):
        llama.sharded_forward_with_cache(TINY, mesh, model_axis="tp")
    wide = scalebook.make_mesh((1, 8), ("data", "model"))
    with pytest.raises(ValueError, match="more shards than key/value heads"):
        llama.sharded_forward_with_cache(TINY, wide)
    with pytest.raises(ValueError, match="does not divide"):
        llama.shard_for_decode(params, llama.init_kv_cache(TINY, 3, 8, jnp.float32), TINY, mesh)


def test_speculative_decoding_equals_target_greedy(served):
    params, mesh, prompt = served
    draft, dcfg = llama.draft_from_layers(params, TINY, 1)
    assert dcfg.n_layers == 1 and draft["embed"] is params["embed"]
    res = llama.speculative_generate(params, TINY, draft, dcfg, prompt[:1], 10, k=3)
    ref, _ = llama.generate_greedy(params, prompt[:1], 10, TINY)
    assert bool(jnp.all(res.tokens == ref))
    assert res.target_calls == len(res.accepted)
    assert sum(a + 1 for a in res.accepted) >= 10 - 1
    assert 0 <= res.acceptance_rate <= 1
    # a draft identical to the target is always accepted
    same = llama.speculative_generate(params, TINY, params, TINY, prompt[:1], 8, k=3)
    assert set(same.accepted) == {3} and same.acceptance_rate == 1.0


def test_speculative_bad_input(served):
    params, mesh, prompt = served
    with pytest.raises(ValueError, match="one sequence"):
        llama.speculative_generate(params, TINY, params, TINY, prompt, 4)
    with pytest.raises(ValueError, match="n_layers must be an integer from 1 to 1"):
        llama.draft_from_layers(params, TINY, 2)
    with pytest.raises(ValueError, match="k must be"):
        llama.speculative_generate(params, TINY, params, TINY, prompt[:1], 4, k=0)


def test_simulation_reports_the_realised_arrival_rate():
    """Poisson arrivals of one run come at a rate near, not at, the nominal one."""
    from scalebook import inference as _inf
    s = _inf.simulate_serving("llama3-8b", "gpu-h100", 1, rate=50.0, n_requests=2000,
                              prompt_len=64, output_len=8)
    assert s.offered_rate != 50.0 and abs(s.offered_rate / 50.0 - 1) < 0.1


def test_step_time_is_attention_then_matmuls():
    # 8B on one H100 at batch 1024, context 256: the matmuls are compute-bound (15.5 ms),
    # attention memory-bound (it reads 1024 x 256 tokens of cache, 34 GB: 10 ms), so the
    # two times add.
    st = inf.decode_step_time(m8, h100, 1024, 256)
    kv = 1024 * 256 * 2 * 32 * 8 * 128 * 2
    attn = 4 * 32 * 32 * 128 * 1024 * 256
    t_attn = max(attn / 9.89e14, kv / 3.35e12)
    t_mm = max(2 * m8.matmul_params() * 1024 / 9.89e14, m8.matmul_params() * 2 / 3.35e12)
    assert t_attn == pytest.approx(kv / 3.35e12) and t_mm > m8.matmul_params() * 2 / 3.35e12
    assert st.t_attn == pytest.approx(t_attn) and st.t_mm == pytest.approx(t_mm)
    assert st.time == pytest.approx(t_attn + t_mm)
    assert st.lower < 0.7 * st.time          # the overlapped bound is well below here
    assert st.throughput == pytest.approx(1024 / st.time)
    assert st.bound == "compute"             # 15.5 of the 25.5 ms in compute-bound kernels


def test_overlapped_bound_is_never_larger():
    for m in (m8, m70):
        for chip in (h100, v5e):
            for B in (1, 16, 256, 4096):
                for T in (128, 4096, 65536):
                    st = inf.decode_step_time(m, chip, B, T, n_chips=8, check_memory=False)
                    assert st.lower <= st.time * (1 + 1e-12) <= st.upper * (1 + 1e-12)
                    pf = inf.prefill_time(m, chip, 1, T, n_chips=8, check_memory=False)
                    assert pf.lower <= pf.time * (1 + 1e-12)
    # memory-bound at a long context: the two forms agree
    st = inf.decode_step_time(m70, h100, 32, 8192, n_chips=8)
    assert st.bound == "memory" and st.time == pytest.approx(st.lower)


def test_context_beyond_the_model_is_refused():
    with pytest.raises(ValueError, match=r"1,000,000 tokens is longer than the 131,072"):
        inf.decode_step_time(m8, h100, 1, 1_000_000, check_memory=False)
    with pytest.raises(ValueError, match=r"seq_len=200,000 tokens"):
        inf.prefill_time(m8, h100, 1, 200_000, check_memory=False)
    with pytest.raises(ValueError, match=r"131,072"):
        inf.fit_batch(m8, h100, 8, 140_000)


def test_tp_decode_times_takes_the_cache_dtype_and_checks_memory():
    # 70B int8 weights, 32 sequences of 8K, 8 v5e: 70.6 GB + 32 x 2.68 GB (bf16 cache)
    # = 156 GB > 128 GB of HBM
    with pytest.raises(ValueError, match=r"at most \d+ fit"):
        inf.tp_decode_times(m70, v5e, 32, 8, 8192, weight_dtype="int8")
    a = inf.tp_decode_times(m70, v5e, 32, 8, 8192, weight_dtype="int8", kv_dtype="int8",
                            check_memory=False)
    b = inf.tp_decode_times(m70, v5e, 32, 8, 8192, weight_dtype="int8", check_memory=False)
    kv8 = 32 * 8192 * inf.kv_bytes_per_token(m70, dtype="int8")
    assert a.t_mem == pytest.approx((m70.matmul_params() + kv8) / (8 * 8.19e11))
    assert b.t_mem - a.t_mem == pytest.approx(kv8 / (8 * 8.19e11))


# -- chunked prefill, paged admission, goodput (issue 23, item 6) ---------------------------
def _mixed_by_hand(m, chip, decode_T, pieces, s_w=2):
    """A step of chunked prefill worked from the shapes: attention (4 L H h FLOPs per
    query-key pair; bytes: the decodes' caches, and each prompt piece's prefix read and its
    own keys and values written), then the matmuls over every token, weights read once.
    ``pieces`` lists (prefix, tokens) of the prompt chunks in the step."""
    kv_tok = 2 * m.n_layers * m.n_kv_heads * m.head_dim * 2
    pairs = sum(decode_T) + sum(T0 + i + 1 for T0, S in pieces for i in range(S))
    kv_tokens = sum(decode_T) + sum(T0 + S for T0, S in pieces)
    tokens = len(decode_T) + sum(S for _, S in pieces)
    t_attn = max(4 * m.n_layers * m.n_heads * m.head_dim * pairs / chip.bf16_flops,
                 kv_tokens * kv_tok / chip.hbm_bandwidth)
    t_mm = max(2 * m.matmul_params() * tokens / chip.bf16_flops,
               m.matmul_params() * s_w / chip.hbm_bandwidth)
    return t_attn + t_mm


def test_mixed_step_by_hand_and_its_two_limits():
    st = inf.mixed_step_time(m8, h100, [8192] * 32, 512, 32768)
    assert st.time == pytest.approx(_mixed_by_hand(m8, h100, [8192] * 32, [(32768, 512)]))
    # one pass reads the weights once: cheaper than a decode step plus a separate chunk
    apart = (inf.decode_step_time(m8, h100, 32, 8192).time
             + inf.mixed_step_time(m8, h100, [], 512, 32768).time)
    assert st.time < apart and st.lower <= st.time
    # no chunk: a decode step; no decodes and no prefix: the prefill of one prompt
    assert inf.mixed_step_time(m8, h100, [300, 700], 0).time == pytest.approx(
        inf.decode_step_time(m8, h100, 2, [300, 700]).time)
    assert inf.mixed_step_time(m8, h100, [], 1000).time == pytest.approx(
        inf.prefill_time(m8, h100, 1, 1000).time)


def test_chunked_prefill_steps_by_hand():
    # two requests arriving about 1 µs apart, prompts of 100 tokens in chunks of 64:
    # step 1: A[0:64]; step 2: A[64:100] + B[0:28] -> A's first token;
    # step 3: A decodes (T = 101) + B[28:92]; step 4: A (T = 102) + B[92:100] -> B's first
    r = inf.simulate_serving(m8, h100, 1, rate=1e6, n_requests=2, prompt_len=100,
                             output_len=4, prefill_chunk=64)
    s1 = _mixed_by_hand(m8, h100, [], [(0, 64)])
    s2 = _mixed_by_hand(m8, h100, [], [(64, 36), (0, 28)])
    s3 = _mixed_by_hand(m8, h100, [101], [(28, 64)])
    s4 = _mixed_by_hand(m8, h100, [102], [(92, 8)])
    s5 = _mixed_by_hand(m8, h100, [103, 101], [])      # A's last token, B's second
    assert r.ttft[0] == pytest.approx(s1 + s2)
    assert r.latency[0] == pytest.approx(s1 + s2 + s3 + s4 + s5)
    assert r.ttft[1] == pytest.approx(s1 + s2 + s3 + s4, rel=1e-3)   # B came 1 µs late
    # without chunks: A's prefill alone, then B's joins after A's first decode step
    plain = inf.simulate_serving(m8, h100, 1, rate=1e6, n_requests=2, prompt_len=100,
                                 output_len=4)
    assert plain.ttft[0] == pytest.approx(_mixed_by_hand(m8, h100, [], [(0, 100)]))


def test_chunking_lowers_the_tpot_tail_and_raises_the_median_ttft():
    kw = dict(n_requests=120, prompt_len=(128, 2048), output_len=(16, 512), max_batch=64,
              seed=1, rate=20.0)
    plain = inf.simulate_serving(m8, h100, 1, **kw)
    chunked = inf.simulate_serving(m8, h100, 1, prefill_chunk=256, **kw)
    assert chunked.percentile("tpot", 99) < 0.8 * plain.percentile("tpot", 99)
    assert chunked.percentile("ttft", 50) > plain.percentile("ttft", 50)


def test_paged_admission_by_hand():
    # pages of 1024 tokens; hbm_fraction chosen so that the KV budget holds 5 pages;
    # prompts of 1500 and 600 output tokens (3 pages at the end, 2 at admission).
    kv_tok = 2 * 32 * 8 * 128 * 2
    w = 2 * m8.num_params()
    f = (w + 5.5 * 1024 * kv_tok) / h100.hbm_bytes
    kw = dict(rate=1e6, n_requests=2, prompt_len=1500, output_len=600, page_size=1024,
              hbm_fraction=f)
    r = inf.simulate_serving(m8, h100, 1, **kw)
    assert r.kv_pages == 5
    # both join (2 + 2 pages); at 2049 tokens (output token 549) A takes the last free page
    # and B, the newest, is preempted; it comes back only when A's 3 pages are free again
    assert r.preemptions == 1
    # B had made 549 tokens; after A finishes it prefills 1500 + 549 tokens again (its 550th
    # token) and decodes the other 50 at T = 2050 ... 2099, alone
    redo = (_mixed_by_hand(m8, h100, [], [(0, 2049)])
            + sum(_mixed_by_hand(m8, h100, [T], []) for T in range(2050, 2100)))
    assert r.latency[1] - r.latency[0] == pytest.approx(redo, rel=1e-3)   # B came 1 µs late
    # with room for both, paged runs are the count-based ones
    roomy = dict(kw, hbm_fraction=1.0)
    assert inf.simulate_serving(m8, h100, 1, **roomy).latency == pytest.approx(
        inf.simulate_serving(m8, h100, 1, rate=1e6, n_requests=2, prompt_len=1500,
                             output_len=600).latency)
    # a request whose cache outgrows the budget is refused
    with pytest.raises(ValueError, match="needs 3 pages of 1024 tokens"):
        inf.simulate_serving(m8, h100, 1, **dict(kw, hbm_fraction=(w + 2.5 * 1024 * kv_tok)
                                                  / h100.hbm_bytes))


def test_paging_admits_more_than_counting_at_the_longest():
    kw = dict(rate=40.0, n_requests=300, prompt_len=(128, 3584), output_len=(16, 512), seed=2)
    counted = inf.simulate_serving(m8, h100, 1, **kw)
    paged = inf.simulate_serving(m8, h100, 1, page_size=16, **kw)
    fit = inf.fit_batch(m8, h100, 1, max(3584 + 512, 1))
    assert counted.mean_batch <= fit.max_batch < 1.2 * paged.mean_batch
    assert paged.mean_batch > 1.3 * counted.mean_batch


def test_goodput_by_hand():
    r = inf.simulate_serving(m8, h100, 1, rate=30.0, n_requests=100, prompt_len=(128, 2048),
                             output_len=8, max_batch=32, seed=4)
    ttft, lat = np.array(r.ttft), np.array(r.latency)
    tpot = (lat - ttft) / 7
    for a, b in ((0.05, 0.01), (0.2, 0.02), (1.0, 0.1)):
        ok = (ttft <= a) & (tpot <= b)
        assert r.goodput(a, b) == pytest.approx(ok.sum() / r.duration)
        assert r.slo_attainment(a, b) == pytest.approx(ok.mean())
    assert r.goodput(1e9, 1e9) == pytest.approx(100 / r.duration)
    assert r.goodput(1e9, 1e9) == pytest.approx(r.throughput / 8)
    one = inf.simulate_serving(m8, h100, 1, rate=1.0, n_requests=3, output_len=1)
    assert one.goodput(1.0, 1e-9) == pytest.approx(3 / one.duration)   # no TPOT to miss


@pytest.mark.parametrize("call,word", [
    (lambda: inf.simulate_serving(m8, h100, 1, rate=1, prefill_chunk=0), "prefill_chunk"),
    (lambda: inf.simulate_serving(m8, h100, 1, rate=1, page_size=2.5), "page_size"),
    (lambda: inf.simulate_serving(m8, h100, 1, rate=1, page_size=16, hbm_fraction=0.1),
     "do not fit"),
    (lambda: inf.simulate_serving(m8, h100, 1, rate=1, hbm_fraction=1.2), "hbm_fraction"),
    (lambda: inf.mixed_step_time(m8, h100, [], 0), "nothing to do"),
    (lambda: inf.mixed_step_time(m8, h100, [100], -1), "chunk"),
    (lambda: inf.mixed_step_time(m8, h100, [100], 0, 50), "chunk_prefix"),
    (lambda: inf.mixed_step_time(m8, h100, 100, 10), "decode_context"),
    (lambda: inf.mixed_step_time(m8, h100, [], 100, 200_000), "max_context"),
    (lambda: inf.mixed_step_time(m8, h100, [100_000] * 8, 10), "more than"),
    (lambda: inf.simulate_serving(m8, h100, 1, rate=1, n_requests=2).goodput(0, 1),
     "ttft_slo"),
])
def test_new_simulator_input_is_refused_with_a_message(call, word):
    with pytest.raises(ValueError, match=word):
        call()


def test_simulator_all_reduces_follow_the_planner():
    # One request on an idle 16-chip v5e slice: its TTFT is the prompt's kernels plus its
    # 2 L all-reduces of [S, D], and each decode step adds those of [1, D], as the planner
    # costs its steps; without all_reduces the kernels alone.
    from scalebook import collectives
    m70b = get_model("llama3-70b")
    kw = dict(n_requests=1, prompt_len=1000, output_len=3, weight_dtype="int8")
    plain = inf.simulate_serving(m70b, v5e, 16, rate=1.0, **kw)
    tp = inf.simulate_serving(m70b, v5e, 16, rate=1.0, all_reduces=True, **kw)

    def ar(tokens):
        return 2 * 80 * collectives.collective_time("all-reduce", tokens * 8192 * 2, (4, 4),
                                                     v5e, hop_latency=1e-6)
    pf = inf.prefill_time(m70b, v5e, 1, 1000, 16, "int8", check_memory=False)
    assert plain.ttft[0] == pytest.approx(pf.time)
    assert tp.ttft[0] == pytest.approx(pf.time + ar(1000))
    steps = [inf.decode_step_time(m70b, v5e, 1, 1000 + i, 16, "int8").time for i in (1, 2)]
    assert tp.latency[0] - tp.ttft[0] == pytest.approx(sum(steps) + 2 * ar(1))
    with pytest.raises(ValueError, match="one 8-GPU node"):
        inf.simulate_serving(m70b, h100, 16, rate=1.0, all_reduces=True, **kw)
    with pytest.raises(ValueError, match="all_reduces must be True or False"):
        inf.simulate_serving(m70b, v5e, 16, rate=1.0, all_reduces="yes", **kw)
