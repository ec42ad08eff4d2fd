"""Chapter 11's exercise checks accept right answers, reject wrong ones, and never raise.

The right answers here are worked by hand, independently of scalebook/exercises/ch11.py,
from the datasheet figures (H100: 132 SMs, 4,096 dense bf16 FLOPs per SM per clock, 9.89e14
FLOP/s, 3.35e12 bytes/s of HBM, 18 NVLinks of 2.5e10 bytes/s, a 400 Gb/s card; B200:
2.25e15 FLOP/s, 18 NVLinks of 5e10 bytes/s, a 400 Gb/s card) and the LLaMA-3 parameter
counts (8B: 8,030,261,248; 405B: 405,853,388,800). What the tests require of every exercise
(tests/exercise_harness.py; README, "Exercises"):

* RIGHT[id]: the answer, worked by hand here (numeric ones are also tried at 0.9 and 1.1 x
  their tolerance: accepted and rejected);
* WRONG[id]: the typical mistakes, each rejected with a hint, not a bare "wrong";
* HINTS[id]: (mistake, words its hint must contain) pairs, every hint reached
  (all_hints=True);
* a code exercise: tested on at least two shapes, in a test of its own below.
"""

import math

import jax
import pytest

from exercise_harness import standard_tests
from scalebook.exercises import evaluate, get_exercise
from scalebook.hardware import get_chip

N8, N405 = 8_030_261_248, 405_853_388_800
C_H100, W_HBM_H100 = 989e12, 3.35e12
W_NVL_H100, W_NIC = 18 * 25e9, 400e9 / 8
C_B200, W_NVL_B200 = 2250e12, 18 * 50e9

# 11.1: 114 SMs x 4,096 FLOPs per clock x 1.62 GHz
R1 = 114 * 4096 * 1.62e9
# 11.2: 384 x 14336 output in 128 x 256 tiles: 3 x 56 = 168 tiles, 2 waves of 132
R2 = 168 / (2 * 132)
# 11.3: ring 2 (3/4) M / W, in-switch M / W, M = 512 MB over 4 H100s
R3 = (2 * 3 / 4 - 1) * 512e6 / W_NVL_H100
# 11.4: 8B's bf16 gradient, 4 nodes of 8 H100s, phases in sequence
M4 = 2 * N8
NV4 = 2 * 7 / 8 * M4 / W_NVL_H100
NIC4 = 2 * 3 / 4 * (M4 / 8) / W_NIC
R4 = NV4 + NIC4
# 11.5: B200, 16 nodes, pipelined: the cards' 2 (15/16) (2/8) / W_nic against NVLink's
T5_NIC = 2 * 15 / 16 * (2 / 8) / W_NIC
T5_NVL = 2 * 7 / 8 * 2 / W_NVL_B200
R5 = C_B200 * max(T5_NIC, T5_NVL) / 4
# 11.6: the bound n <= 1 + 3 F W_nic / (s C), F = 53,248, not rounded: 5.04
R6 = 1 + 3 * 53248 * W_NIC / (2 * C_H100)
# 11.7: 32 H100s in 4 nodes: t = 7/32 / W_nvl + 24/32 / W_nic per byte; a gated expert's
# 3 matmuls: F* = C s t / 3
T7 = 7 / 32 / W_NVL_H100 + 24 / 32 / W_NIC
R7 = C_H100 * 2 * T7 / 3
# 11.8: 405B, TP 8, PP 16, DP 128, fp32: 127/128 x 4 N / 128 bytes on the card
R8 = 127 / 128 * 4 * N405 / 128 / W_NIC
# 11.9: 405B in fp8 on 8 H100s at batch 1
R9 = N405 / (8 * W_HBM_H100)

RIGHT = {"11.1": R1, "11.2": R2, "11.3": R3, "11.4": R4, "11.5": R5, "11.6": R6,
         "11.7": R7, "11.8": R8, "11.9": R9, "11.13": "compute",
         "11.14": "latency_hiding_scheduler"}

WRONG = {
    "11.1": [R1 / 2, 2 * R1, 4 * R1, R1 / 4, R1 * 1e-6],
    "11.2": [1.0, 100 * R2, 168 / 132, 1 - R2, 36 / 132],
    "11.3": [2 * 3 / 4 * 512e6 / W_NVL_H100, 512e6 / W_NVL_H100, 18 * R3],
    "11.4": [max(NV4, NIC4), NIC4, 2 * R4, 2 * 31 / 32 * M4 / W_NIC, R4 - NV4 / 2,
             R4 * 2**30 / 1e9],
    "11.5": [45000 * 127 / 128, R5 / 2, 2 * R5],
    "11.6": [5, 6, 1 + 2 * 53248 * W_NIC / (2 * C_H100), R6 - 1, 2 * R6 - 1,
             1 + 3 * 53248 * W_NVL_H100 / (2 * C_H100)],
    "11.7": [R7 * 2, R7 / 2, C_H100 * 31 / 32 * 2 / W_NIC / 3, R7 * 3 / 2],
    "11.8": [R8 / 2, 2 * R8, 8 * R8, R8 * W_NIC / W_NVL_H100, R8 / 128, R8 * 1e9 / 2**30],
    "11.9": [2 * R9, 8 * R9],
    "11.13": ["communication"],
    "11.14": ["command_buffer", "triton_gemm", "all_gather_combine_threshold_bytes"],
}

HINTS = {
    "11.1": [(R1 / 2, "half the answer"), (2 * R1, "twice the answer"),
             (4 * R1, "4x too large"), (R1 / 4, "4x too small"),
             # the H100 SXM's own 132 SMs at 1.83 GHz; its 1.83 GHz (or its 1.98 GHz boost)
             # with this GPU's 114 SMs
             (132 * 4096 * 1.83e9, "own peak"), (114 * 4096 * 1.83e9, "1,620 MHz"),
             (114 * 4096 * 1.98e9, "1,620 MHz"), (132 * 4096 * 1.62e9, "own SM count (")],
    "11.2": [(1.0, "last wave"), (100 * R2, "not a percentage"), (168 / 132, "not a share"),
             (1 - R2, "idle share"), (36 / 132, "last wave's fill"),
             # 256 x 128 tiles: 2 x 112 = 224 in 2 waves; another GPU's SM count
             (224 / (2 * 132), "not the other way round"), (168 / (2 * 114), "132 SMs"),
             (168 / (2 * 108), "132 SMs"), (168 / (2 * 148), "132 SMs")],
    "11.3": [(2 * 3 / 4 * 512e6 / W_NVL_H100, "ring's whole time"),
             (512e6 / W_NVL_H100, "time with in-switch"), (2 * R3, "twice the saving"),
             (18 * R3, "all of a GPU's NVLinks"), (R3 * 2**20 / 1e6, "binary/decimal"),
             ((1 - 3 / 4) * 512e6 / W_NVL_H100, "2 (n - 1) / n M"),
             # NVLink taken at its two-way 9e11 bytes/s: half the saving, the same number
             # as one phase when n = 4, so the hint names both
             ((2 * 3 / 4 - 1) * 512e6 / (2 * W_NVL_H100), "two-way"),
             (1.5, "how many times faster"), (-R3, "positive"),
             ((2 * 7 / 8 - 1) * 512e6 / W_NVL_H100, "not the node's 8")],
    "11.4": [(max(NV4, NIC4), "pipelined"), (2 * 31 / 32 * M4 / W_NIC, "flat ring"),
             (NIC4, "between nodes only"), (R4 + 7 * NIC4, "only its 1/8"),
             (2 * R4, "2 bytes per parameter"), (R4 - NV4 / 2, "both NVLink phases"),
             # NVLink at its two-way rate: the same number as one NVLink phase left out
             (NV4 / 2 + NIC4, "two-way"),
             # the card's all-reduce counted as a reduce-scatter, (m - 1)/m: 1.2% from
             # the one-phase slip, so one hint names both
             (NV4 + NIC4 / 2, "not (m - 1) / m (M / g)"),
             (NV4 + NIC4 / 2, "both NVLink phases"),
             (R4 * 2**30 / 1e9, "2**30 / 1e9"),
             (NV4 * 18 + NIC4, "not one link"), (NV4 + NIC4 / 8, "multiply it by 8"),
             (NV4 + NIC4 * (31 / 32) / (3 / 4), "not 31/32")],
    "11.5": [(45000 * 127 / 128, "flat figure"),
             (C_B200 * (T5_NIC + T5_NVL) / 4, "pipelined"),
             (7 / 8 * 2 * C_B200 / (2 * W_NVL_B200), "inside one node"),
             (R5 / 2, "4 FLOPs per weight element"),
             (R5 * 312e12 / C_B200, "not the A100"), (R5 * 989e12 / C_B200, "not the H100"),
             (R5 * 4 / 6, "backward pass alone"),
             (R5 * (127 / 128) / (15 / 16), "not 127/128")],
    "11.6": [(5, "rounded to whole GPUs"), (6, "rounded to whole GPUs"),
             (1 + 3 * 53248 * W_NVL_H100 / (2 * C_H100), "NVLink's"),
             (1 + 2 * 53248 * W_NIC / (2 * C_H100), "3 matmuls"), (R6 - 1, "add the 1"),
             (2 * R6 - 1, "s = 2 bytes"), (2 * R6 - 1, "two-way ring"),
             (1 + (R6 - 1) / 2, "s = 2 bytes per element."),
             (1 + 8 * (R6 - 1), "multiply it by 8"),
             (1 + 3 * 16384 * W_NIC / (2 * C_H100), "not D")],
    "11.7": [(C_H100 * 31 / 32 * 2 / W_NIC / 3, "7 / n_ep"),
             (C_H100 * 24 / 32 * 2 / W_NIC / 3, "add the NVLink part"),
             (C_H100 * 2 * (7 / 8 / W_NVL_H100 + 24 / 32 / W_NIC) / 3, "not 7/8"),
             (R7 * 3 / 2, "3 matmuls"), (2 * R7, "2x too large"), (R7 / 2, "2x too small"),
             # bf16 taken as 4 bytes doubles F* as well
             (C_H100 * 4 * T7 / 3, "s = 2 bytes"),
             (C_H100 * 2 * (7 / 32 / W_NVL_H100 + 24 / 32 / 400e9) / 3, "multiply it by 8"),
             (C_H100 * 2 * (3 / 32 / W_NVL_H100 + 28 / 32 / W_NIC) / 3, "8 GPUs each"),
             (3 * R7, "F* = C T(s) / 3")],
    "11.8": [(R8 / 2, "fp32"), (2 * R8, "all-reduce"), (16 * R8, "1 / (8 pp)"),
             (8 * R8, "own card"), (128 * R8, "1 / (8 pp)"),
             (R8 * W_NIC / W_NVL_H100, "dcn_bandwidth"), (R8 / 128, "copies"),
             (R8 * 2**30 / 1e9, "2**30 / 1e9")],
    "11.9": [(2 * R9, "1 byte"), (8 * R9, "1/8"), (R9 * 1e9 / 2**30, "binary/decimal"),
             (N405 / (8 * W_NVL_H100), "not over NVLink"),
             (2 * N405 / (8 * 1979e12), "almost no time"), (16 * R9, "16x too large")],
    "11.13": [("communication", "3 matmuls")],
    "11.14": [("command_buffer", "launch"), ("triton_gemm", "matmul kernels"),
              ("all_gather_combine_threshold_bytes", "already large")],
}

globals().update(standard_tests(11, RIGHT, WRONG, HINTS, all_hints=True))


# ---- code exercises ----------------------------------------------------------------------

def hier_right(nbytes, local, nodes, chip):
    from scalebook.hardware import get_chip
    c = get_chip(chip)
    return (2 * (local - 1) / local * nbytes / c.ici_bandwidth
            + 2 * (nodes - 1) / nodes * nbytes / local / c.dcn_bandwidth)


def hier_pipelined(nbytes, local, nodes, chip):
    from scalebook.hardware import get_chip
    c = get_chip(chip)
    return max(2 * (local - 1) / local * nbytes / c.ici_bandwidth,
               2 * (nodes - 1) / nodes * nbytes / local / c.dcn_bandwidth)


def hier_no_split(nbytes, local, nodes, chip):
    from scalebook.hardware import get_chip
    c = get_chip(chip)
    return (2 * (local - 1) / local * nbytes / c.ici_bandwidth
            + 2 * (nodes - 1) / nodes * nbytes / c.dcn_bandwidth)


def hier_flat(nbytes, local, nodes, chip):
    from scalebook.hardware import get_chip
    n = local * nodes
    return 2 * (n - 1) / n * nbytes / get_chip(chip).dcn_bandwidth


def waves_right(B, F, sms, tile_b, tile_f):
    tiles = math.ceil(B / tile_b) * math.ceil(F / tile_f)
    return tiles / (math.ceil(tiles / sms) * sms)


def waves_floor(B, F, sms, tile_b, tile_f):
    tiles = (B // tile_b) * (F // tile_f)
    return tiles / (math.ceil(tiles / sms) * sms)


def waves_useful(B, F, sms, tile_b, tile_f):
    """Section 11.1's other measure: real output over the slots' tile area."""
    tiles = math.ceil(B / tile_b) * math.ceil(F / tile_f)
    return B * F / (math.ceil(tiles / sms) * sms * tile_b * tile_f)


def hier_card_half(nbytes, local, nodes, chip):
    """The all-reduce between nodes counted as a reduce-scatter, (m - 1)/m."""
    from scalebook.hardware import get_chip
    c = get_chip(chip)
    return (2 * (local - 1) / local * nbytes / c.ici_bandwidth
            + (nodes - 1) / nodes * nbytes / local / c.dcn_bandwidth)


def waves_turned(B, F, sms, tile_b, tile_f):
    tiles = math.ceil(B / tile_f) * math.ceil(F / tile_b)
    return tiles / (math.ceil(tiles / sms) * sms)


def waves_count(B, F, sms, tile_b, tile_f):
    return math.ceil(math.ceil(B / tile_b) * math.ceil(F / tile_f) / sms)


def waves_padding(B, F, sms, tile_b, tile_f):
    return B * F / (math.ceil(B / tile_b) * tile_b * math.ceil(F / tile_f) * tile_f)


def hier_variant(nv_factor=1.0, nic=None):
    def fn(nbytes, local, nodes, chip):
        c = get_chip(chip)
        nv = 2 * (local - 1) / local * nbytes / c.ici_bandwidth
        return nv_factor * nv + nic(nbytes, local, nodes, c)
    return fn


def waves_no_waves(B, F, sms, tile_b, tile_f):
    return min(1.0, math.ceil(B / tile_b) * math.ceil(F / tile_f) / sms)


def hier_rs_right(block):
    rows, cols = block.shape
    chunks = block.reshape(2, 4, rows // 8, cols)     # chunk 4 i + j at [i, j]
    part = jax.lax.psum_scatter(chunks, "gpu", scatter_dimension=1)
    return jax.lax.psum_scatter(part, "node", scatter_dimension=0)


def hier_rs_rows_reordered(block):
    """Also right: the rows reordered so that two tiled scatters land chunk 4 i + j."""
    rows, cols = block.shape
    v = block.reshape(2, 4, rows // 8, cols).transpose(1, 0, 2, 3).reshape(rows, cols)
    v = jax.lax.psum_scatter(v, "gpu", scatter_dimension=0, tiled=True)
    return jax.lax.psum_scatter(v, "node", scatter_dimension=0, tiled=True)


def hier_rs_wrong_places(block):
    v = jax.lax.psum_scatter(block, "gpu", scatter_dimension=0, tiled=True)
    return jax.lax.psum_scatter(v, "node", scatter_dimension=0, tiled=True)


def hier_rs_node_first(block):
    v = jax.lax.psum_scatter(block, "node", scatter_dimension=0, tiled=True)
    return jax.lax.psum_scatter(v, "gpu", scatter_dimension=0, tiled=True)


def hier_rs_not_tiled(block):
    v = jax.lax.psum_scatter(block, "gpu", scatter_dimension=0)
    return jax.lax.psum_scatter(v, "node", scatter_dimension=0)


def hier_rs_all_reduce_slice(block):
    total = jax.lax.psum(block, ("node", "gpu"))
    i = jax.lax.axis_index("node") * 4 + jax.lax.axis_index("gpu")
    k = block.shape[0] // 8
    return jax.lax.dynamic_slice_in_dim(total, i * k, k)


CODE_RIGHT = {"11.10": hier_right, "11.11": waves_right, "11.12": hier_rs_right}

CODE_WRONG = {   # (wrong answer, a phrase its message must contain)
    "11.10": [(hier_pipelined, "pipelined"), (hier_no_split, "1/local block"),
              (lambda nbytes, local, nodes, chip:
               hier_right(nbytes, local, nodes, chip)
               - 2 * (local - 1) / local * nbytes / 4.5e11 * (chip == "gpu-h100"),
               "add the reduce-scatter"),
              (lambda nbytes, local, nodes, chip:
               hier_right(nbytes, local, nodes, chip)
               - (local - 1) / local * nbytes / get_chip(chip).ici_bandwidth,
               "both NVLink phases"),
              (hier_card_half, "not (nodes - 1) / nodes"),
              (hier_flat, "flat ring"), (lambda *a: "1 ms", "a number"),
              # the card as bits/s; the node's ring factor between nodes; 1/nodes of the array
              (hier_variant(nic=lambda b, g, m, c: 2 * (m - 1) / m * b / g / (8 * c.dcn_bandwidth)),
               "multiply it by 8"),
              (hier_variant(nic=lambda b, g, m, c: 2 * (g - 1) / g * b / g / c.dcn_bandwidth),
               "one GPU per node"),
              (hier_variant(nic=lambda b, g, m, c: 2 * (m - 1) / m * b / m / c.dcn_bandwidth),
               "not 1/nodes")],
    "11.11": [(waves_floor, "ceil"), (waves_no_waves, "count the waves"),
              (lambda *a: 100 * waves_right(*a), "percentage"),
              (lambda *a: waves_right(*a) / 2, "2x too small"),
              (waves_turned, "not the other way round"), (waves_count, "number of waves"),
              (waves_padding, "the padding"), (waves_useful, "useful share")],
    "11.12": [(lambda b: jax.lax.psum_scatter(b, ("node", "gpu"), scatter_dimension=0,
                                              tiled=True), "flat reduce-scatter"),
              (hier_rs_node_first, "comes first"), (hier_rs_wrong_places, "wrong places"),
              (hier_rs_not_tiled, "tiled=True"), (hier_rs_all_reduce_slice, "twice the"),
              (lambda b: jax.lax.psum(b, ("node", "gpu")), "every device's block")],
}


@pytest.mark.parametrize("ex", sorted(CODE_RIGHT))
def test_code_right_answers(ex):
    r = evaluate(ex, CODE_RIGHT[ex])
    assert r.correct, r


@pytest.mark.parametrize("ex,answer,phrase", [(k, a, p) for k, v in CODE_WRONG.items()
                                              for a, p in v])
def test_code_wrong_answers_get_their_hint(ex, answer, phrase):
    r = evaluate(ex, answer)
    assert r.status == "wrong" and phrase in r.message, r


@pytest.mark.parametrize("ex", sorted(CODE_RIGHT))
def test_code_stub_is_not_attempted(ex):
    def stub(*args):
        ...
    assert evaluate(ex, stub).status == "not attempted"
    assert evaluate(ex, 3).status == "wrong"


@pytest.mark.parametrize("ex", ["11.10", "11.11"])
def test_code_exercises_have_several_shapes_and_draw_more(ex):
    e = get_exercise(ex)
    assert len(e.cases) >= 4 and e.generate is not None
    assert len({repr(c) for c in e.drawn_cases(b"x", n=10)}) > 3


def test_the_mesh_exercise_runs_three_shapes():
    e = get_exercise("11.12")
    assert len(e.cases) == 3 and e.mesh_axes == ("node", "gpu")
    assert "3 shapes" in evaluate("11.12", hier_rs_right).message
    assert evaluate("11.12", hier_rs_rows_reordered).correct


def test_11_13_reference_follows_the_model():
    # 64 experts of Mixtral's shape (gated, F = 14,336) over 64 H100s in 8 nodes: a routed
    # copy's 3 matmuls (6 D F) against its two all-to-alls, 7/64 of each on NVLink and
    # 56/64 on the card: F* = C s t / 3 = 11,699 < 14,336, compute-bound. (Counting 2
    # matmuls, F* = 17,548, would say "communication".)
    t = 7 / 64 / W_NVL_H100 + 56 / 64 / W_NIC
    f_star = C_H100 * 2 * t / 3
    assert f_star < 14336 < 1.5 * f_star
    assert evaluate("11.13", "compute").correct


@pytest.mark.parametrize("spelling", ["compute-bound", "Compute bound"])
def test_11_13_accepts_the_chapters_word(spelling):
    assert evaluate("11.13", spelling).correct
    r = evaluate("11.13", spelling.replace("ompute", "ommunication"))
    assert r.status == "wrong" and "3 matmuls" in r.message


@pytest.mark.parametrize("spelling", [
    "latency_hiding_scheduler", "--xla_gpu_enable_latency_hiding_scheduler",
    "xla_gpu_enable_latency_hiding_scheduler", "latency hiding scheduler",
    "Latency-hiding scheduler", "enable_latency_hiding_scheduler",
    "--xla_gpu_enable_latency_hiding_scheduler=true",      # as written in XLA_FLAGS
    "--xla_gpu_enable_latency_hiding_scheduler=True"])
def test_11_14_accepts_the_flags_spellings(spelling):
    assert evaluate("11.14", spelling).correct


def test_11_14_names_a_wrong_flag_in_any_spelling():
    r = evaluate("11.14", "--xla_gpu_enable_command_buffer")
    assert r.status == "wrong" and "launch" in r.message
    assert "one of" in evaluate("11.14", "the scheduler").message
    r = evaluate("11.14", "--xla_gpu_enable_triton_gemm=false")
    assert r.status == "wrong" and "matmul kernels" in r.message


def test_the_grader_judges_the_exported_mesh_program():
    """In an assignment the student's kernel exports the program and the grader's checker
    runs it on values of its own: right and wrong answers come out the same way."""
    e = get_exercise("11.12")
    right = e.evaluate_exported(e.export_programs(hier_rs_right), seed=7)
    assert right.correct, right
    flat = e.evaluate_exported(e.export_programs(
        lambda b: jax.lax.psum_scatter(b, ("node", "gpu"), scatter_dimension=0,
                                       tiled=True)), seed=7)
    assert flat.status == "wrong" and "flat reduce-scatter" in flat.message
    misplaced = e.evaluate_exported(e.export_programs(hier_rs_wrong_places), seed=7)
    assert misplaced.status == "wrong" and "wrong places" in misplaced.message
