"""scalebook.training: the chapter-6 planner, checked by hand, against XLA, and on bad input.

Hand-computed values are written out from the LLaMA-3 shapes and the chip figures (not
through scalebook.models or scalebook.collectives), so a change on either side shows up."""

import math
import time
from functools import partial

import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from scalebook import hlo, llama  # noqa: E402
from scalebook import mesh as sm  # noqa: E402
from scalebook import training as tr  # noqa: E402
from scalebook.hardware import get_chip  # noqa: E402
from scalebook.models import TransformerConfig  # noqa: E402

v5p, h100 = get_chip("tpu-v5p"), get_chip("gpu-h100")
N70 = 70_553_706_496          # facts.md §1.2
LAYER70 = 855_654_400         # parameters per layer of 70B
N405 = 405_853_388_800


# ---- one configuration, by hand --------------------------------------------------------

def test_70b_memory_by_hand():
    p = tr.evaluate_plan("llama3-70b", h100, tp=8, fsdp=64, global_batch_tokens=2**22,
                         seq_len=8192, microbatches=8)
    m = p.memory
    assert m.weights == pytest.approx(2 * N70 / 512)
    assert m.gradients == pytest.approx(2 * N70 / 512)
    assert m.master_weights == pytest.approx(4 * N70 / 512)
    assert m.optimizer == pytest.approx(8 * N70 / 512)
    assert m.fsdp_buffer == pytest.approx(2 * 2 * LAYER70 / 8)
    # 4d + 2Hh + 2Kh + 3F elements per layer and token, 80 layers, head 2d + V, bf16;
    # 2**22 / 64 / 8 = 8192 tokens per microbatch, split over 8 TP chips.
    per_layer = 4 * 8192 + 2 * 8192 + 2 * 1024 + 3 * 28672
    per_token = 2 * (80 * per_layer + 2 * 8192 + 128256)
    assert m.activations == pytest.approx(per_token * 8192 / 8)
    assert m.total == pytest.approx(16 * N70 / 512 + LAYER70 / 2 + per_token * 1024)


def test_70b_times_by_hand():
    B = 2**22
    p = tr.evaluate_plan("llama3-70b", h100, tp=8, fsdp=64, dp=2, global_batch_tokens=B,
                         seq_len=8192, microbatches=4)
    # FLOPs per token: 3 (2 x matmul params + causal attention 4 L H h (S + 1) / 2)
    matmul_params = N70 - 128256 * 8192 - (80 * 2 * 8192 + 8192)
    per_token = 3 * (2 * matmul_params + 4 * 80 * 64 * 128 * (8192 + 1) / 2)
    assert p.model_flops_per_step == pytest.approx(per_token * B)
    assert p.compute_seconds == pytest.approx(per_token * B / 1024 / 9.89e14)
    by = {(c.axis, c.kind): c for c in p.collectives}
    w = 2 * N70 / 8                                  # bf16 weights of one TP shard
    ag = by["fsdp", "all-gather"]
    assert ag.network == "dcn" and ag.count == 8     # 2 per microbatch
    assert ag.seconds == pytest.approx(8 * (63 / 64) * w / 5e10)
    g = 2 * N70 / (8 * 64)
    assert by["dp", "all-reduce"].seconds == pytest.approx(2 * 0.5 * g / 5e10)
    act = B / 128 / 4 * 8192 * 2                     # [b / N_mb, d] bf16
    tp = by["tp", "all-gather"]
    assert tp.network == "nvlink" and tp.count == 4 * 80 * 4
    assert tp.seconds == pytest.approx(tp.count * (7 / 8) * act / (18 * 2.5e10))
    assert p.bound == "dcn"
    assert p.step_seconds == pytest.approx(p.comm_seconds("dcn"))
    assert p.mfu == pytest.approx(per_token * B / (p.step_seconds * 1024 * 9.89e14))
    assert p.days == pytest.approx(15e12 / (B / p.step_seconds) / 86400)
    assert p.cost == pytest.approx(p.days * 24 * 1024 * 10.8)


def test_pipeline_bubble_and_uneven_stages():
    p = tr.evaluate_plan("llama3-405b", h100, tp=8, fsdp=64, pp=16, global_batch_tokens=2**24,
                         seq_len=8192, microbatches=32)
    assert p.bubble == pytest.approx(15 / (32 + 15))
    # 126 layers on 16 stages: 8 per stage, the compute runs as if 128 layers
    flops = p.model_flops_per_step / 8192 / 9.89e14
    assert p.compute_seconds == pytest.approx(flops * 128 / 126 / (1 - 15 / 47))
    assert any("8 per stage" in n for n in p.notes)


def test_no_price_is_said_not_invented():
    p = tr.plan_training("llama3-8b", "tpu-v6e", 256, 2**21, 8192)
    assert p.price_per_hour is None and p.cost is None
    assert "no listed price" in str(p)


def test_mfu_from_published_figures():
    # 1e9 parameters at 1e5 tokens/s on one H100: 6e14 / 9.89e14
    assert tr.mfu_from_throughput(1e9, 1e5, 1, h100) == pytest.approx(6e14 / 9.89e14)
    # LLaMA-3 405B model card: 30.84M GPU-hours, 15.6T tokens -> 34.6% (facts.md §2.8)
    mfu = tr.mfu_from_gpu_hours("llama3-405b", 15.6e12, 30.84e6, h100)
    assert mfu == pytest.approx(6 * N405 * 15.6e12 / (30.84e6 * 3600 * 9.89e14))
    assert round(mfu, 3) == 0.346
    with pytest.raises(ValueError, match="tokens_per_second"):
        tr.mfu_from_throughput(1e9, 0, 1, h100)
    with pytest.raises(ValueError, match="chip_hours"):
        tr.mfu_from_gpu_hours(1e9, 1e12, -1, h100)


# ---- the search ------------------------------------------------------------------------

CASES = [("llama3-8b", "tpu-v5p", 256, 2**22), ("llama3-70b", "tpu-v5p", 4096, 2**22),
         ("llama3-70b", "gpu-h100", 1024, 2**22), ("llama3-405b", "gpu-h100", 8192, 2**24),
         ("llama3-405b", "tpu-v5p", 8192, 2**24), ("llama3-70b", "tpu-v5e", 1024, 2**22)]


@pytest.mark.parametrize("model,chip,n,B", CASES)
def test_every_returned_plan_fits(model, chip, n, B):
    fits, _ = tr.search_plans(model, chip, n, B, 8192)
    assert fits
    for p in fits:
        assert p.n_chips == n
        assert p.memory.total <= 0.9 * get_chip(chip).hbm_bytes
        tr.check_plan(p)
    best = tr.plan_training(model, chip, n, B, 8192)
    assert best.step_seconds == pytest.approx(fits[0].step_seconds)
    assert best.considered == len(fits)
    assert all(best.step_seconds <= p.step_seconds * (1 + 1e-12) for p in fits)
    text = str(best)
    assert "memory per chip" in text and "bound:" in text and "days" in text


def test_gpu_tensor_parallelism_stays_in_the_nvlink_domain():
    fits, _ = tr.search_plans("llama3-70b", h100, 1024, 2**22, 8192)
    assert all(p.degrees.tp <= 8 for p in fits)
    assert all(p.networks["fsdp"] == "dcn" for p in fits if p.degrees.fsdp > 1
               and p.degrees.tp * p.degrees.fsdp > 8)


def test_405b_search_is_fast():
    # CPU time of this process, so that other jobs on the machine do not count
    t = time.process_time()
    p = tr.plan_training("llama3-405b", "tpu-v5p", 8960, 2**24, 8192)
    assert time.process_time() - t < 1.0
    assert p.n_chips == 8960 and p.fits


def test_pinned_degrees_are_kept():
    p = tr.plan_training("llama3-70b", h100, 1024, 2**22, 8192, tp=8, pp=1)
    assert p.degrees.tp == 8 and p.degrees.pp == 1
    assert p.reasons["tp"] == "fixed by the caller"


# ---- infeasible and bad input ----------------------------------------------------------

def test_infeasible_says_by_how_much_and_what_fits():
    with pytest.raises(tr.InfeasiblePlan) as e:
        tr.plan_training("llama3-405b", "tpu-v5p", 8, 2**20, 8192)
    msg = str(e.value)
    assert "does not fit on 8 x tpu-v5p" in msg and "over the usable" in msg
    assert "chips fit" in msg or "at least" in msg
    assert e.value.best is not None and not e.value.best.fits
    with pytest.raises(tr.InfeasiblePlan, match="remat='full'"):
        tr.plan_training("llama3-70b", h100, 64, 2**20, 8192, remat="none", microbatches=1)


def test_check_plan_refuses_a_plan_that_does_not_fit():
    p = tr.evaluate_plan("llama3-70b", h100, tp=8, fsdp=1, global_batch_tokens=2**16,
                         seq_len=8192)
    assert not p.fits
    with pytest.raises(ValueError, match="over the usable"):
        tr.check_plan(p)
    with pytest.raises(TypeError):
        tr.check_plan("TP 8")


@pytest.mark.parametrize("call,word", [
    (lambda: tr.plan_training("llama3-70b", "tpu-v9", 64, 2**22, 8192), "known chips"),
    (lambda: tr.plan_training("llama3-70b", "tpu-v5p", 0, 2**22, 8192), "n_chips"),
    (lambda: tr.plan_training("llama3-70b", "tpu-v5p", 64, 2**22 + 1, 8192), "multiple of 8192"),
    (lambda: tr.plan_training("llama3-70b", "tpu-v5p", 64, 2**22, 8192, tp=3), "does not divide"),
    (lambda: tr.plan_training("llama3-70b", "tpu-v5p", 64, 2**22, 8192, zz=2), "unknown option"),
    (lambda: tr.plan_training("llama3-70b", "tpu-v5p", 64, 2**22, 8192, remat="some"), "remat"),
    (lambda: tr.evaluate_plan("llama3-70b", v5p, tp=3, fsdp=1, global_batch_tokens=8192,
                              seq_len=8192), "tp=3 must divide"),
    (lambda: tr.evaluate_plan("llama3-70b", v5p, tp=1, fsdp=3, global_batch_tokens=8192,
                              seq_len=8192), "do not split"),
    (lambda: tr.evaluate_plan("llama3-70b", v5p, tp=1, fsdp=1, pp=81, global_batch_tokens=8192,
                              seq_len=8192), "more than the 80 layers"),
])
def test_bad_input_is_refused_clearly(call, word):
    with pytest.raises((ValueError, KeyError, TypeError), match=word):
        call()


# ---- against XLA: memory_analysis of a small sharded step ------------------------------

TINY = TransformerConfig("tiny", n_layers=2, d_model=128, n_heads=4, n_kv_heads=2,
                         head_dim=32, d_ff=512, vocab_size=512)
# XLA:CPU's peak (arguments + temporaries) lies between the planner's total and this many
# times it: it holds every gathered layer at once and computes bf16 elementwise work in f32.
MEMORY_MARGIN = 2.5


@pytest.mark.parametrize("fsdp,tp", [(8, 1), (4, 2)])
def test_memory_against_memory_analysis(fsdp, tp):
    mesh = sm.make_mesh((fsdp, tp), ("fsdp", "tp"))
    specs, bspec = tr.train_specs(TINY)
    gspecs, _ = tr.train_specs(TINY, fsdp_axis=None)

    def ns(tree):
        return jax.tree.map(lambda s: NamedSharding(mesh, s), tree,
                            is_leaf=lambda x: isinstance(x, P))
    sh = ns(specs)
    state = tr.init_adam(llama.init_params(TINY, jax.random.key(0)))
    B, S = 16, 128
    tok = jnp.zeros((B, S), jnp.int32)
    step = partial(tr.adam_train_step, config=TINY, gathered=ns(gspecs), sharded=sh)
    bsh = NamedSharding(mesh, bspec)
    compiled = jax.jit(step, in_shardings=((sh, sh, sh), bsh, bsh, None),
                       out_shardings=((sh, sh, sh), None), donate_argnums=0
                       ).lower(state, tok, tok, 1).compile()
    mem = hlo.memory(compiled)
    plan = tr.evaluate_plan(TINY, v5p, tp=tp, fsdp=fsdp, global_batch_tokens=B * S, seq_len=S)
    # the arguments are the fp32 master weights and Adam moments (12 bytes per parameter)
    # the two token arrays and the step number: norm gains replicated, the embedding split
    # over fsdp only.
    norms = TINY.n_layers * 2 * 128 + 128
    embed = 512 * 128
    split = TINY.num_params() - norms - embed
    want_args = 12 * (split / (fsdp * tp) + embed / fsdp + norms) + 2 * 4 * B * S / fsdp + 4
    assert mem.arguments == want_args
    assert plan.memory.master_weights + plan.memory.optimizer == pytest.approx(
        12 * TINY.num_params() / (fsdp * tp))
    assert plan.memory.total <= mem.peak <= MEMORY_MARGIN * plan.memory.total


def test_an_axis_beyond_the_largest_slice_runs_on_the_dcn():
    """One job gets at most one v5p slice (6,144 chips, not the 8,960-chip pod): on 8,192
    chips the outermost axis that takes the group past 6,144 chips crosses the DCN."""
    assert v5p.max_slice_chips == 6144 < v5p.ici_domain_chips
    p = tr.evaluate_plan("llama3-70b", "tpu-v5p", tp=8, fsdp=8, dp=128,
                               global_batch_tokens=1024 * 8192, seq_len=8192)
    assert p.networks["tp"] == p.networks["fsdp"] == "ici" and p.networks["dp"] == "dcn"
    q = tr.evaluate_plan("llama3-70b", "tpu-v5p", tp=8, fsdp=8, dp=96,
                               global_batch_tokens=768 * 8192, seq_len=8192)
    assert q.networks["dp"] == "ici"                 # 6,144 chips: one slice
