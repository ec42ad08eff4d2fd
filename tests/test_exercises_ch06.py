"""Chapter 6's exercise checks accept right answers, reject typical wrong ones, never raise.

The right answers here are worked by hand from the LLaMA-3 parameter counts (facts.md §1.2)
and the hardware figures, independently of scalebook/exercises/ch06.py. The code answers run
on four cases each."""

import math

import pytest
from exercise_harness import standard_tests
from scalebook.exercises import evaluate

N8, N70, N405 = 8_030_261_248, 70_553_706_496, 405_853_388_800
C_H100 = 9.89e14                         # H100 dense bf16, FLOP/s
HBM_V5P = 95 * 2**30                     # bytes
DCN_H100 = 5e10                          # bytes/s per GPU
# 405B's training FLOPs per token with causal attention at 8K over 6N, by hand: attention's
# score and value matmuls are 4 S h H per layer per token forward, half of it masked, x3 for
# training: 6 L S h H (H = 128 heads of h = 128, L = 126) against 6 N.
ATTN_405B_8K = 1 + 6 * 126 * 8192 * 128 * 128 / 2 / (6 * N405)


def state_bytes(n_params, tp, fsdp, pp):
    return 16 * n_params / (tp * fsdp * pp)


def state_bytes_zero3_only(n_params, tp, fsdp, pp):     # forgot TP and PP
    return 16 * n_params / fsdp


def state_bytes_12(n_params, tp, fsdp, pp):             # no bf16 copy nor gradients
    return 12 * n_params / (tp * fsdp * pp)


def state_bytes_no_pp(n_params, tp, fsdp, pp):          # forgot the pipeline
    return 16 * n_params / (tp * fsdp)


def state_bytes_bf16_whole(n_params, tp, fsdp, pp):     # bf16 weights not sharded
    return (2 + 14 / fsdp) * n_params / (tp * pp)


def good_sharding(model, chip, n, B):
    # hand-picked: TP inside a server or a small ICI group, FSDP for the rest
    table = {("llama3-70b", "gpu-h100", 128, 2**22): dict(tp=8, fsdp=8, dp=2, microbatches=16),
             ("llama3-8b", "tpu-v5p", 256, 2**22): dict(tp=1, fsdp=16, dp=16),
             ("llama3-70b", "tpu-v5p", 1024, 2**22): dict(tp=4, fsdp=8, dp=32, microbatches=2),
             ("llama3-405b", "tpu-v5p", 4096, 2**24): dict(tp=8, fsdp=64, dp=8, microbatches=4)}
    if (model, chip, n, B) in table:
        return table[(model, chip, n, B)]
    return rule_sharding(model, chip, n, B)      # the inputs the check draws per student


def rule_sharding(model, chip, n, B):
    """A rule, no search: TP of 1, 2, 4 or 8 (inside a server), FSDP over the rest, the
    fewest microbatches and the lightest remat that fit and leave the step compute-bound."""
    from scalebook import training
    seqs = B // 8192
    for tp in (1, 2, 4, 8):
        fsdp = n // tp
        if n % tp or seqs % fsdp:
            continue
        for M in (1, 2, 4, 8, 16, 32):
            for remat in ("none", "selective", "full"):
                for keep in (False, True):
                    d = dict(tp=tp, fsdp=fsdp, microbatches=M, remat=remat, keep_weights=keep)
                    if (seqs // fsdp) % M:
                        continue
                    p = training.evaluate_plan(model, chip, global_batch_tokens=B,
                                               seq_len=8192, **d)
                    if p.fits and p.bound == "compute":
                        return d
    return None


def too_few_microbatches(model, chip, n, B):
    d = dict(good_sharding(model, chip, n, B))
    d["microbatches"] = 1
    return d


def wrong_product(model, chip, n, B):
    return dict(tp=8, fsdp=8)


def tp_too_wide(model, chip, n, B):
    return dict(tp=16, fsdp=8, microbatches=16)


def not_a_dict(model, chip, n, B):
    return (8, 8, 1, 2)


def comm_bound(model, chip, n, B):
    # FSDP over 16 servers re-gathers the weights for each of 32 small microbatches
    return dict(tp=8, fsdp=16, microbatches=32) if chip == "gpu-h100" else \
        good_sharding(model, chip, n, B)


def deep_pipeline(model, chip, n, B):
    # the review's case: 8B on 256 v5p as TP 32 x FSDP 2 x PP 4 with one microbatch
    return dict(tp=32, fsdp=2, pp=4) if (model, n) == ("llama3-8b", 256) else \
        good_sharding(model, chip, n, B)


RIGHT = {
    # 3 / (N_mb + 3) <= 0.18 needs N_mb >= 3 x 0.82 / 0.18 = 13.7, so 14; 2,048 // 14 = 146
    # replicas of 8 x 4 chips
    "6.1": 146 * 8 * 4,
    # 3.6T tokens on 8,192 GPUs at 430 TFLOP/s, 12T on 16,384 at 400
    "6.2": 6 * N405 * (3.6e12 / (8192 * 430e12) + 12e12 / (16384 * 400e12)) / 86400,
    "6.3": math.ceil(16 * N405 / (0.9 * HBM_V5P)),
    "6.4": (4 / 256 + 12 / 1024) * N70 / 1e9,     # ZeRO-1: fp32 state over DP too
    "6.5": 2 * 0.75 * (2 * N70 / 8) / DCN_H100,
    "6.6": 15 / 79,
    "6.7": 6 * N405 * 2**24 / 7.0 / (16384 * C_H100),
    "6.8": 6 * N70 * 15e12 / (7.0e6 * 3600 * C_H100),
    "6.9": "dcn",                # 2 microbatches: each pass re-gathers the weights
    "6.11": good_sharding,
    "6.12": state_bytes,
}

WRONG = {
    "6.1": [2048 * 32, 2048 // 17 * 32, 146 * 4, 146 * 8, 147 * 32, 2048 // 13 * 32, 146,
            146 * 32 + 1, 4096],
    "6.3": [math.ceil(16 * N405 / (0.9 * HBM_V5P)) - 1],
    "6.9": ["compute", "nvlink", "bubble"],
    "6.11": [too_few_microbatches, wrong_product, not_a_dict, deep_pipeline],
    "6.12": [state_bytes_zero3_only],
}

HINTS = {
    # no bubble limit; (P - 1) / N_mb <= 0.18 (N_mb 17); TP or PP left out; replicas
    # rounded up; N_mb 13; the replicas alone
    "6.1": [(2048 * 32, "one microbatch per replica"), (2048 // 17 * 32, "not (P - 1) / N_mb"),
            (146 * 4, "tensor-parallel"), (146 * 8, "pipeline stages"),
            (147 * 32, "round the replicas down"), (2048 // 13 * 32, "N_mb = 13"),
            (146, "number of replicas")],
    "6.2": [(RIGHT["6.2"] * 24, "hours"), (RIGHT["6.2"] / 3, "not 2"),
            # all on one configuration; swapped; an average rate; one phase
            (6 * N405 * 15.6e12 / (16384 * 400e12) / 86400, "add that phase's days"),
            (6 * N405 * 15.6e12 / (8192 * 430e12) / 86400, "moved to 16,384"),
            (6 * N405 * (3.6e12 / (16384 * 400e12) + 12e12 / (8192 * 430e12)) / 86400,
             "swapped"),
            (6 * N405 * 15.6e12 / ((8192 * 430e12 + 16384 * 400e12) / 2) / 86400,
             "average rate"),
            (6 * N405 * 3.6e12 / (8192 * 430e12) / 86400, "one phase")],
    "6.3": [(math.floor(16 * N405 / (0.9 * HBM_V5P)), "round up"),
            (math.ceil(16 * N405 / HBM_V5P), "10% of HBM"),
            (math.ceil(2 * N405 / (0.9 * HBM_V5P)), "bf16 weights only"),
            (math.ceil(12 * N405 / (0.9 * HBM_V5P)), "12 bytes"),
            (math.ceil(16 * N405 / (0.9 * 95e9)), "95 GiB")],
    "6.4": [(16 * N70 / 256 / 1e9, "shards those 12 bytes over DP"),
            (16 * N70 / 1024 / 1e9, "not over DP"),
            ((4 / 32 + 12 / 128) * N70 / 1e9, "TP splits"),
            (RIGHT["6.4"] * 8, "bits"),
            (RIGHT["6.4"] * 1e9 / 2**30, "GiB"),
            ((2 / 256 + 12 / 1024) * N70 / 1e9, "bf16 gradients")],
    "6.5": [(RIGHT["6.5"] / 2, "one gather"), (RIGHT["6.5"] * 8, "TP shard"),
            (2 * (2 * N70 / 8) / DCN_H100, "(n-1)/n"),
            (RIGHT["6.5"] * DCN_H100 / (18 * 2.5e10), "scale-out network")],
    "6.6": [(15 / 64, "useful work"), (64 / 79, "busy fraction"), (16 / 80, "not P")],
    "6.7": [(RIGHT["6.7"] / 3, "not 2N"), (RIGHT["6.7"] * 16384, "all 16,384"),
            (RIGHT["6.7"] * 100, "percentage"),
            (RIGHT["6.7"] * ATTN_405B_8K, "attention's FLOPs")],
    "6.8": [(RIGHT["6.8"] * 3600, "3600"), (RIGHT["6.8"] / 3, "not 2 N N_tok"),
            (RIGHT["6.8"] * 100, "percentage")],
    "6.9": [("compute", "one pass's compute"), ("nvlink", "inside a server"),
            ("bubble", "no pipeline")],
    "6.10": [],
    "6.11": [(not_a_dict, "return a dict"), (wrong_product, "must equal the number"),
             (too_few_microbatches, "does not fit"), (comm_bound, "exposed collectives"),
             (deep_pipeline, "pipeline idles"),
             (tp_too_wide, "fast domain")],
    "6.12": [(state_bytes_zero3_only, "TP and PP split"), (state_bytes_12, "12 bytes"),
             (state_bytes_no_pp, "divide by pp"), (state_bytes_bf16_whole, "ZeRO-3 shards")],
}
# 6.10: 6 N N_tok over one v5e's peak at 40% MFU, in chip-hours, at $1.20 a chip-hour
C_V5E, C_V5P = 1.97e14, 4.59e14
RIGHT["6.10"] = 6 * N405 * 15.6e12 / (C_V5E * 0.40 * 3600) * 1.20
V5P_BILL = 6 * N405 * 15.6e12 / (C_V5P * 0.40 * 3600) * 4.20     # section 6.1's chip
HINTS["6.10"] = [(RIGHT["6.10"] * 8192, "does not depend on how many chips"),
                 (RIGHT["6.10"] * 256, "does not depend on how many chips"),
                 (RIGHT["6.10"] * 3600, "divide the chip-seconds"),
                 (RIGHT["6.10"] * 0.16, "divide by 0.40"),
                 (RIGHT["6.10"] * 0.40, "2.5 times"),
                 (RIGHT["6.10"] * 15 / 15.6, "15.6T"),
                 (RIGHT["6.10"] * ATTN_405B_8K, "attention's FLOPs")]
HINTS = {k: v for k, v in HINTS.items() if v}

globals().update(standard_tests(6, RIGHT, WRONG, HINTS, all_hints=True))


def test_the_bill_does_not_depend_on_the_chip_count():
    # the same FLOPs at the same MFU: the plans of 4096 and 8192 chips cost the same
    from scalebook import training
    for chip, bill in (("tpu-v5e", RIGHT["6.10"]), ("tpu-v5p", V5P_BILL)):
        plans = [training.plan_training("llama3-405b", chip, n, 2048 * 8192, 8192,
                                        train_tokens=15.6e12) for n in (4096, 8192)]
        for p in plans:
            c = p.model_flops_per_step / p.global_batch_tokens / (6 * N405)  # attention
            assert p.cost_at(0.40) == pytest.approx(bill * c)
    assert evaluate("6.10", RIGHT["6.10"]).correct
    assert not evaluate("6.10", RIGHT["6.10"] * 1.03).correct


def test_6_10_is_not_a_printed_v5p_bill():
    """Section 6.1 prints 405B's v5p plan at 40% MFU (291.3 days on 8192 chips): its bill
    is one multiplication away, so neither the exercise nor a variant asks for it."""
    from scalebook.exercises import get_exercise
    assert math.isclose(291.3 * 24 * 8192 * 4.20, V5P_BILL, rel_tol=0.02)   # the leak
    assert not evaluate("6.10", V5P_BILL).correct
    with pytest.raises(ValueError, match="not a valid variant"):
        get_exercise("6.10").with_variant({"chip": "tpu-v5p"})
    assert all(not (p["chip"] == "tpu-v5p" and p["mfu"] == 0.40)
               for p in (get_exercise("6.10").draw(bytes([i])) for i in range(200)))


def test_days_and_cost_at_an_assumed_mfu():
    from scalebook import training
    p = training.plan_training("llama3-70b", "tpu-v5p", 4096, 512 * 8192, 8192,
                               train_tokens=15e12)
    assert p.days_at(p.mfu) == pytest.approx(p.days)
    assert p.days_at(0.40) == pytest.approx(p.days * p.mfu / 0.40)
    assert p.cost_at(0.40) == pytest.approx(p.days_at(0.40) * 24 * 4096 * 4.20)
    with pytest.raises(ValueError, match="fraction"):
        p.days_at(40)


# ------------------------------------------------------------------------------------------
# Variants (assignments draw other numbers per student): worked by hand like the above
# ------------------------------------------------------------------------------------------
GiB = 2**30


def _v(ex, answer, variant):
    return evaluate(ex, answer, variant=variant)


def test_6_1_a_variant():
    from scalebook.exercises import get_exercise
    # 7 / (N_mb + 7) <= 0.16 needs N_mb >= 36.75, so 37; 3,072 // 37 = 83 replicas of 4 x 8
    v = {"seqs": 3072, "tp": 4, "P": 8, "beta": 0.16}
    right = 83 * 4 * 8
    assert _v("6.1", right, v).correct and not _v("6.1", RIGHT["6.1"], v).correct
    assert "round the replicas down" in _v("6.1", 84 * 32, v).message
    assert "not (P - 1) / N_mb" in _v("6.1", 3072 // 44 * 32, v).message
    ex = get_exercise("6.1").with_variant(v)
    assert "3,072 sequences" in ex.text() and "at most 16%" in ex.text()


def test_6_1_where_tp_equals_p_one_hint_names_both():
    # 3 / (N_mb + 3) <= 0.08 needs N_mb >= 34.5, so 35; 2,048 // 35 = 58 replicas of 4 x 4
    v = {"seqs": 2048, "tp": 4, "P": 4, "beta": 0.08}
    assert _v("6.1", 58 * 16, v).correct
    assert "TP = P here" in _v("6.1", 58 * 4, v).message


def test_6_2_a_variant_names_its_own_phases():
    v = {"first": 4.8, "r1": 450, "r2": 380}
    right = 6 * N405 * (4.8e12 / (8192 * 450e12) + 10.8e12 / (16384 * 380e12)) / 86400
    assert _v("6.2", right, v).correct and not _v("6.2", RIGHT["6.2"], v).correct
    whole = 6 * N405 * 15.6e12 / (16384 * 380e12) / 86400
    assert "the first 4.8T ran on 8,192 at 450" in _v("6.2", whole, v).message


def test_6_3_variants_have_the_gib_hint_only_where_hbm_is_in_gib():
    v = {"model": "llama3-70b", "chip": "tpu-v4"}
    right = math.ceil(16 * N70 / (0.9 * 32 * GiB))
    assert _v("6.3", right, v).correct
    assert "v4's HBM is 32 GiB" in _v("6.3", math.ceil(16 * N70 / (0.9 * 32e9)), v).message
    assert "round up" in _v("6.3", right - 1, v).message
    from scalebook.exercises import get_exercise
    gpu = get_exercise("6.3").with_variant({"model": "llama3-70b", "chip": "gpu-h100"})
    assert not any("GiB" in m for _, m in gpu.hints)


def test_6_6_a_variant():
    v = {"P": 8, "M": 32}
    assert _v("6.6", 7 / 39, v).correct
    assert "P - 1 = 7" in _v("6.6", 8 / 40, v).message
    assert "busy fraction" in _v("6.6", 32 / 39, v).message


def test_6_7_a_variant():
    v = {"chip": "gpu-b200", "gpus": 16384, "batch": 2**24, "step": 5.0}
    right = 6 * N405 * 2**24 / 5.0 / (16384 * 2.25e15)
    assert _v("6.7", right, v).correct
    assert "all 16,384" in _v("6.7", right * 16384, v).message


def test_6_10_a_variant_on_h100s():
    v = {"model": "llama3-70b", "chip": "gpu-h100", "mfu": 0.50}
    right = 6 * N70 * 15.6e12 / (C_H100 * 0.50 * 3600) * 10.8
    assert _v("6.10", right, v).correct
    assert "2 times as long" in _v("6.10", right * 0.5, v).message
    assert "does not depend" in _v("6.10", right * 8192, v).message


def test_6_11_every_drawn_pod_has_a_plan_that_passes():
    """The generator's pods, all of them (its space is small): a rule without search
    finds a plan that passes the check on each, so every student's inputs can be met."""
    from scalebook.exercises import get_exercise
    pods = sorted(set(get_exercise("6.11").drawn_cases(b"all pods", n=3000)))
    assert len(pods) >= 100
    r = evaluate("6.11", rule_sharding, cases=pods)
    assert r.correct, r


def test_6_12_drawn_inputs_pass_a_right_function():
    from scalebook.exercises import get_exercise
    ex = get_exercise("6.12")
    for args in ex.drawn_cases(b"ch06", n=40):
        assert ex._equal(state_bytes(*args), ex.reference(*args)), args
