"""Chapter 1 exercises: rooflines. Reference answers are computed from scalebook."""

from __future__ import annotations

import math

from .. import roofline as rl
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import ChoiceExercise, CodeExercise, VariedNumericExercise, as_number


def _close(a, b, rtol=0.03):
    return math.isclose(a, b, rel_tol=rtol)


# Variants (for assignments; see kinds.VariedNumericExercise). The chapter's own numbers are
# each exercise's ``params``; an assignment draws others from ``choose``.
_ALL_CHIPS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-a100", "gpu-h100", "gpu-h200",
              "gpu-b200")
_MODELS = ("llama3-8b", "llama3-70b", "llama3-405b")
_DTYPE_BYTES = {"fp8": 1, "bf16": 2, "fp32": 4, "fp64": 8}
# A chip named after an article, for titles: "an H100", "a TPU v5e".
_CHIP_A = {"tpu-v4": "a TPU v4", "tpu-v5e": "a TPU v5e", "tpu-v5p": "a TPU v5p",
           "tpu-v6e": "a TPU v6e", "gpu-a100": "an A100", "gpu-h100": "an H100",
           "gpu-h200": "an H200", "gpu-b200": "a B200"}


def _chip_name(chip, **_):
    return {"chip_name": get_chip(chip).display_name}


def _proj_dims(model, projection):
    """(D, F) of a LLaMA-3 MLP projection: up/gate is [d_model, d_ff], down is [d_ff, d_model]."""
    m = get_model(model)
    return (m.d_model, m.d_ff) if projection in ("up", "gate") else (m.d_ff, m.d_model)


def _model_words(model, projection, chip, **_):
    D, F = _proj_dims(model, projection)
    m = get_model(model)
    return {"chip_name": get_chip(chip).display_name, "D": D, "F": F,
            "chip_a": _CHIP_A[chip],
            "model_name": getattr(m, "display_name", None) or model.replace("llama3-", "LLaMA-3 ").upper()
            .replace("LLAMA-3", "LLaMA-3")}


# 1.1 ------------------------------------------------------------------------------------
def _ex1_parts(B=4096, D=8192, F=8192, chip="tpu-v5p"):
    return rl.time_bounds(rl.matmul_flops(B, D, F), rl.matmul_bytes(B, D, F), chip)


def _ex1_hints(B, D, F, chip):
    def parts():
        return _ex1_parts(B, D, F, chip)
    return [
        (lambda a: _close(a, parts().memory), "that is the memory time. Which of the two times is larger?"),
        (lambda a: _close(a, parts().upper), "that is the upper bound (no overlap); the lower bound assumes perfect overlap."),
        (lambda a: _close(a, parts().compute / 2), "a matmul does 2 FLOPs (a multiply and an add) per term of the sum."),
    ]


register(VariedNumericExercise(
    id="1.1", title="Lower bound of one matmul", unit="s",
    params={"B": 4096, "D": 8192, "F": 8192, "chip": "tpu-v5p"},
    choose={"B": (1024, 2048, 4096, 8192), "D": (4096, 8192, 16384), "F": (8192, 14336, 28672),
            "chip": _ALL_CHIPS},
    solve=lambda B, D, F, chip: _ex1_parts(B, D, F, chip).lower, hints_for=_ex1_hints,
    describe=_chip_name,
    statement="One {chip_name} chip multiplies bf16 matrices $X[{B}, {D}]$ and $W[{D}, {F}]$. Assuming "
              "perfect overlap of compute and memory traffic, what is the lower bound on its run "
              "time, in seconds?",
))


# 1.2 ------------------------------------------------------------------------------------
# op -> (formula, FLOPs per element, vectors in HBM, in words, name for the title)
_VECTOR_OPS = {"add": ("z = x + y", 1, 3, "three", "a vector add"),
               "axpy": ("z = a x + y", 2, 3, "three (the scalar $a$ is negligible)",
                        "an axpy"),
               "fma": ("z = x \\odot y + w", 2, 4, "four", "a fused multiply-add"),
               # a momentum update, m = b m + (1 - b) g, is one of these
               "axpby": ("z = a x + b y", 3, 3,
                         "three (the scalars $a$, $b$ are negligible)", "an axpby"),
               # Adam's second moment, v = b v + (1 - b) g^2: a x, y y, b (y y) and a sum
               "moment": ("z = a x + b\\, y \\odot y", 4, 3,
                          "three (the scalars $a$, $b$ are negligible)",
                          "an Adam moment update")}


def _ex2(N=1_000_000, dtype="bf16", op="add"):
    s = _DTYPE_BYTES[dtype]
    _, k, v, _, _ = _VECTOR_OPS[op]
    return rl.arithmetic_intensity(k * N, v * N * s)


def _ex2_hints(N, dtype, op="add"):
    s = _DTYPE_BYTES[dtype]
    _, k, v, _, _ = _VECTOR_OPS[op]
    wrong = 1 if s == 2 else 2
    return [
        (lambda a: _close(a, k / ((v - 1) * s)), "the output vector must be written to HBM too."),
        (lambda a: _close(a, k / (v * wrong)), f"each {dtype} element takes {s} bytes."),
    ]


register(VariedNumericExercise(
    id="1.2", title="Intensity of a vector add", unit="FLOPs/byte",
    params={"N": 1_000_000, "dtype": "bf16", "op": "add"},
    choose={"N": (1_000_000, 4_000_000, 16_000_000), "dtype": tuple(_DTYPE_BYTES),
            "op": tuple(_VECTOR_OPS)},
    solve=_ex2, hints_for=_ex2_hints,
    describe=lambda N, dtype, op: {"formula": _VECTOR_OPS[op][0],
                                   "vectors": _VECTOR_OPS[op][3],
                                   "op_name": _VECTOR_OPS[op][4]},
    variant_title="Intensity of {op_name}",
    statement="What is the arithmetic intensity of ${formula}$ for {dtype} vectors of {N:,} "
              "elements, with all {vectors} vectors in HBM? Answer in FLOPs per byte.",
))


# 1.3 ------------------------------------------------------------------------------------
def _ex3_hints(chip, dtype):
    c = get_chip(chip)
    if dtype != "bf16":
        return [(lambda a: _close(a, c.critical_intensity),
                 f"that is the bf16 critical intensity; {dtype} has its own peak "
                 f"FLOP/s.")]
    # A bf16 variant: the slip is the chip's 8-bit headline peak.
    low = next((d for d in ("fp8", "int8") if _has_peak(chip, d)), None)
    if low is None:
        return []
    return [(lambda a: _close(a, c.critical_intensity_for(low)),
             f"that is the {low} critical intensity; bf16 has its own peak FLOP/s.")]


def _has_peak(chip, dtype):
    return getattr(get_chip(chip), f"{dtype}_flops", None) is not None


register(VariedNumericExercise(
    id="1.3", title="Critical intensity in fp8", unit="FLOPs/byte",
    params={"chip": "gpu-h100", "dtype": "fp8"},
    # Only seven chip and 8-bit pairs have a published peak; bf16 variants make the
    # class's answers differ enough (the slip to catch there: the 8-bit headline peak).
    choose={"chip": _ALL_CHIPS, "dtype": ("fp8", "int8", "bf16")},
    solve=lambda chip, dtype: get_chip(chip).critical_intensity_for(dtype),
    hints_for=_ex3_hints, valid=_has_peak, describe=_chip_name,
    variant_title="Critical intensity in {dtype}",
    statement="One {chip_name} chip multiplies {dtype} matrices at its dense {dtype} peak. How many "
              "FLOPs per HBM byte must such a matmul do to be compute-bound?",
))


# 1.4 ------------------------------------------------------------------------------------
def _down_proj():
    m = get_model("llama3-70b")
    return m.d_ff, m.d_model


def _batch_ok(model, projection, chip, **kw):
    try:
        rl.critical_batch(*_proj_dims(model, projection), chip, **kw)
    except ValueError:
        return False
    return True


def _ex4_hints(model, projection, chip):
    dims = _proj_dims(model, projection)
    return [
        (lambda a: abs(a - get_chip(chip).critical_intensity) < 2,
         "B ~ I* is the approximation for B << D, F. Solve the inequality with all three byte terms."),
        (lambda a: a == rl.critical_batch(*dims, chip) - 1,
         "one short: at that batch the intensity is still just below I*. Round up."),
    ]


# (model, chip) pairs whose critical batch the chapter prints: 70B's in sections 1.4 and
# 1.9, and every model's on a v5e in the plot of section 1.4.
_PRINTED_4 = {("llama3-70b", "tpu-v5e"), ("llama3-70b", "gpu-h100"),
              ("llama3-70b", "tpu-v6e"), ("llama3-8b", "tpu-v5e"),
              ("llama3-405b", "tpu-v5e")}


def _ex4_ok(model, projection, chip):
    return (model, chip) not in _PRINTED_4 and _batch_ok(model, projection, chip)


register(VariedNumericExercise(
    id="1.4", title="Smallest compute-bound batch on an H100", unit="tokens", integer=True,
    # 8B, not 70B: the chapter prints 70B's critical batches (sections 1.4 and 1.9).
    params={"model": "llama3-8b", "projection": "down", "chip": "gpu-h100"},
    # Not the projection: up and down swap D and F, which leaves B* unchanged.
    choose={"model": _MODELS, "chip": _ALL_CHIPS},
    solve=lambda model, projection, chip: rl.critical_batch(*_proj_dims(model, projection), chip),
    hints_for=_ex4_hints, valid=_ex4_ok, describe=_model_words,
    variant_title="Smallest compute-bound batch on {chip_a}",
    statement="{model_name}'s {projection} projection multiplies $X[B, {D}]$ by $W[{D}, {F}]$ in "
              "bf16. What is the smallest whole number of tokens $B$ for which it is compute-bound "
              "on one {chip_name}? Count all three arrays' bytes. Answer in tokens.",
))


# 1.5 ------------------------------------------------------------------------------------
def _up_proj():
    m = get_model("llama3-70b")
    return m.d_model, m.d_ff


# Weight-only quantisation: int8 (1 byte) or int4 (half a byte, as in W4A16 kernels).
_WEIGHT_BYTES = {"int8": 1, "int4": 0.5}
_BYTE_WORDS = {"int8": "1 byte", "int4": "half a byte"}


def _ex5(model, projection, chip, weights="int8"):
    return rl.critical_batch(*_proj_dims(model, projection), chip, bytes_per_element=2,
                             weight_bytes_per_element=_WEIGHT_BYTES[weights])


def _ex5_hints(model, projection, chip, weights="int8"):
    dims = _proj_dims(model, projection)
    hints = [
        (lambda a: a == rl.critical_batch(*dims, chip),
         f"that is the answer with bf16 weights. The weights now take "
         f"{_BYTE_WORDS[weights]} each."),
    ]
    if weights == "int4":
        hints.append((lambda a: a == _ex5(model, projection, chip, "int8"),
                      "that is the answer with int8 weights; int4 takes half a byte."))
    if _has_peak(chip, "int8"):
        hints.append((lambda a: a == rl.critical_batch(
            *dims, chip, dtype="int8", bytes_per_element=2,
            weight_bytes_per_element=_WEIGHT_BYTES[weights]),
            "the arithmetic is still done in bf16, so use the bf16 peak."))
    return hints


def _ex5_ok(model, projection, chip, weights="int8"):
    kw = dict(bytes_per_element=2, weight_bytes_per_element=_WEIGHT_BYTES[weights])
    return (_batch_ok(model, projection, chip)
            and _batch_ok(model, projection, chip, **kw)
            and (not _has_peak(chip, "int8") or _batch_ok(model, projection, chip,
                                                          dtype="int8", **kw)))


def _ex5_words(model, projection, chip, weights):
    return {**_model_words(model, projection, chip), "byte_words": _BYTE_WORDS[weights],
            "verb": "halve" if weights == "int8" else "quarter"}


register(VariedNumericExercise(
    id="1.5", title="int8 weights halve the batch", unit="tokens", integer=True,
    params={"model": "llama3-70b", "projection": "up", "chip": "tpu-v5e",
            "weights": "int8"},
    # Not the projection: up and down swap D and F, which leaves B* unchanged.
    choose={"model": _MODELS, "chip": _ALL_CHIPS, "weights": tuple(_WEIGHT_BYTES)},
    solve=_ex5, hints_for=_ex5_hints, valid=_ex5_ok, describe=_ex5_words,
    variant_title="{weights} weights {verb} the batch",
    statement="The weights of {model_name}'s {projection} projection, $W[{D}, {F}]$, "
              "are stored in {weights} ({byte_words}) while the activations $X[B, "
              "{D}]$ and the output stay bf16 and the arithmetic is done in bf16. What "
              "is the smallest batch $B$ that makes this matmul compute-bound on one "
              "{chip_name}? Answer in tokens.",
))


# 1.6 ------------------------------------------------------------------------------------
# psum: the dtype of the exchanged partial sums (bf16, or fp32 kept for accuracy).
_PSUM_BYTES = {"bf16": 2, "fp32": 4}


def _ex6(chip, psum="bf16"):
    return rl.min_contraction_to_hide_comm(chip, bytes_per_element=_PSUM_BYTES[psum])


def _ex6_hints(chip, psum="bf16"):
    # Each factor-2 slip gives exactly the same number, so each hint names every slip that
    # lands there (tests/test_exercises_ch01.py builds each mistake and checks its words).
    s = _PSUM_BYTES[psum]
    article = "an" if psum == "fp32" else "a"
    return [
        (lambda a: _close(a, _ex6(chip, psum) * 2),
         "2x too large: did you count 1 FLOP per multiply-add (each chip does "
         "2·B·(D/2)·F = BDF FLOPs), or send both partial sums over one direction of the link "
         "(each chip sends its own [B, F] sum, both directions at once)?"),
        (lambda a: _close(a, _ex6(chip, psum) / 2),
         f"2x too small: did you count {s // 2} byte{'s' if s > 2 else ''} per element "
         f"({article} {psum} element of the partial sum takes {s} bytes), give each "
         f"chip all "
         "2BDF FLOPs (it does only its half, BDF), or count the link's bandwidth in "
         "both directions (each chip sends in one)?"),
        (lambda a: _close(a, _ex6(chip, psum) * 4),
         f"4x too large: each chip does BDF FLOPs (2 per multiply-add, on half of D) "
         f"and sends {s}BF bytes (one {psum} [B, F] partial sum)."),
    ]


def _ex6_not_printed(chip, psum):
    """Section 1.6 prints these chips' thresholds for bf16 partial sums (one link)."""
    return not (psum == "bf16" and chip in ("tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-h100"))


register(VariedNumericExercise(
    id="1.6", title="When does the all-reduce hide?", unit="elements of D", rtol=0.03,
    # v4, not v5e: section 1.6 prints the bf16 threshold of v5e, v5p, v6e and the H100
    params={"chip": "tpu-v4", "psum": "bf16"},
    choose={"chip": _ALL_CHIPS, "psum": tuple(_PSUM_BYTES)},
    solve=_ex6, hints_for=_ex6_hints, valid=_ex6_not_printed,
    describe=lambda chip, psum: {
        "chip_name": get_chip(chip).display_name,
        "link": "ICI" if chip.startswith("tpu") else "NVLink",
        "psum_words": ("" if psum == "bf16"
                       else " (kept in fp32 for accuracy: 4 bytes each)")},
    statement="Two {chip_name} chips split the contraction dimension $D$ of a bf16 "
              "matmul $X[B, D] \\cdot W[D, F]$ in halves and exchange their $[B, F]$ "
              "partial sums{psum_words} over one {link} link (both directions at "
              "once). Ignoring HBM, above what $D$ does the exchange take no longer "
              "than the multiplication? Answer in elements of $D$.",
))


# 1.7 ------------------------------------------------------------------------------------
# Tiles come in steps of the matrix unit's width on a TPU (128, or 256 on v6e); a GPU
# has no MXU, and its kernels' tiles come in steps of 64 (the rows of a Hopper
# warpgroup's tensor-core instruction; CUTLASS and Triton tiles are multiples of 64).
_GPU_TILE_STEP = 64


def _tile_step(chip):
    return get_chip(chip).mxu_size or _GPU_TILE_STEP


def _tile_answer(n=16384, chip="tpu-v5e"):
    crit = get_chip(chip).critical_intensity
    step = _tile_step(chip)
    t = step
    while rl.tiled_matmul_intensity(n, n, n, t, t) < crit:
        t += step
        if t > n:
            raise ValueError(f"no tile of at most {n} makes this matmul compute-bound on {chip}")
    return t


def _ex7_hints(n, chip):
    step = _tile_step(chip)
    why = ("the matrix unit's width" if get_chip(chip).mxu_size
           else "the GPU kernel's tile step")
    return [
        (lambda a: a % step != 0, f"the tile must be a multiple of {step} ({why})."),
        (lambda a: a < _tile_answer(n, chip), "too small: at that tile size the intensity is still below I*."),
    ]


def _ex7_ok(n, chip):
    if (n, chip) == (16384, "tpu-v5e"):        # all but answered by section 1.5's example
        return False
    try:
        _tile_answer(n, chip)
    except ValueError:
        return False
    return True


register(VariedNumericExercise(
    id="1.7", title="Tile size for a compute-bound matmul", unit="elements", integer=True,
    # v5p, not v5e: section 1.5's v5e example (tiles 512x512, intensity 248 against
    # I* = 241) all but answers it for the v5e
    params={"n": 16384, "chip": "tpu-v5p"},
    choose={"n": (2048, 4096, 8192, 16384, 32768), "chip": _ALL_CHIPS},
    solve=_tile_answer, hints_for=_ex7_hints, valid=_ex7_ok,
    describe=lambda n, chip: {"chip_name": get_chip(chip).display_name,
                              "step": _tile_step(chip)},
    statement="One {chip_name} chip multiplies two bf16 matrices of ${n} \\times {n}$ "
              "with square $t \\times t$ output tiles (section 1.5). What is the "
              "smallest $t$, a multiple of {step}, that makes the tiled matmul "
              "compute-bound? Answer in elements (the side of the tile).",
))


# 1.8 ------------------------------------------------------------------------------------
def _ex8():
    D, F = _up_proj()
    crit = get_chip("tpu-v6e").critical_intensity
    return "compute" if rl.matmul_intensity(512, D, F) >= crit else "memory"


register(ChoiceExercise(
    id="1.8", title="Which bound on a v6e?", choices=("compute", "memory"), reference=_ex8,
    hints={"compute": "compare the intensity with the critical intensity of this chip, not of a v5e.",
           "memory": "compare the intensity with the critical intensity of this chip."},
))


# 1.9 ------------------------------------------------------------------------------------
def _bounds_ref(B, D, F, chip):
    b = rl.time_bounds(rl.matmul_flops(B, D, F), rl.matmul_bytes(B, D, F), chip)
    return (b.lower, b.upper)


def _bounds_with(B, D, F, chip, flops_per_mac=2, bytes_per_element=2, output=True):
    """(max, sum) of the two times, with one slip of counting built in."""
    c = get_chip(chip)
    t_math = flops_per_mac * B * D * F / c.bf16_flops
    t_mem = bytes_per_element * (B * D + D * F + (B * F if output else 0)) / c.hbm_bandwidth
    return t_math, t_mem


def _pair(got):
    try:
        return (as_number(got[0]), as_number(got[1])) if len(got) == 2 else None
    except Exception:            # not a sequence of two: the hint says to return a pair
        return None


def _is(got, want, rtol=1e-6):
    pair = _pair(got)
    return pair is not None and None not in pair and all(
        math.isclose(g, w, rel_tol=rtol) for g, w in zip(pair, want))


def _slip(**slip):
    def predicate(got, want, args):
        t_math, t_mem = _bounds_with(*args, **slip)
        return _is(got, (max(t_math, t_mem), t_math + t_mem))
    return predicate


def _min_max(got, want, args):
    t_math, t_mem = _bounds_with(*args)
    return _is(got, (min(t_math, t_mem), max(t_math, t_mem)))


def _swapped(got, want, args):
    pair = _pair(got)
    return pair is not None and None not in pair and pair[0] > pair[1]


# The first case has T_mem about 2.3 T_math, so every slip below changes both numbers and
# lower and upper differ by 40% (a memory-bound B = 1 first case made lower ~ upper, and
# almost any small error looked like "swapped").
_CASES_9 = [(256, 4096, 14336, "tpu-v6e"), (4096, 8192, 8192, "gpu-h100"),
            (1, 8192, 28672, "tpu-v5e"), (64, 16384, 53248, "gpu-b200")]

# Drawn inputs: the LLaMA-3 dimensions (d_model, d_ff of 8B, 70B, 405B) and batches from
# one token to a long prefill, on any chip of the table.
_DIMS = (4096, 8192, 14336, 16384, 28672, 53248)
_BATCHES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _draw_9(rng):
    return (rng.choice(_BATCHES), rng.choice(_DIMS), rng.choice(_DIMS),
            rng.choice(_ALL_CHIPS))


register(CodeExercise(
    id="1.9", title="Time bounds of a bf16 matmul", reference=_bounds_ref, cases=_CASES_9,
    generate=_draw_9,
    unit="s", describe=lambda B, D, F, chip: f"B={B}, D={D}, F={F}, chip={chip!r}",
    hints=[
        (lambda got, want, args: _pair(got) is None,
         "return a pair (lower, upper) in seconds."),
        (_swapped, "the lower bound comes first: (max of the times, sum of the times)."),
        (_min_max, "with perfect overlap the time is the larger of T_math and T_mem (not the "
                   "smaller); with none it is their sum (not the larger)."),
        (_slip(flops_per_mac=1), "a matmul does 2 FLOPs per multiply-add: 2BDF."),
        (_slip(output=False), "count the bytes of the output [B, F] too: it is written to HBM."),
        (_slip(bytes_per_element=1), "a bf16 element takes 2 bytes."),
        (_slip(bytes_per_element=4), "bf16 takes 2 bytes per element, not 4."),
    ],
))


# 1.10 -----------------------------------------------------------------------------------
def _critical_batch_ref(D, F, chip):
    return rl.critical_batch(D, F, chip)


# The first case's exact bound is 302.35, so round() (302) is told apart from ceil() (303);
# the second's is exactly 288 (I* = 281.25 on a B200; every way of writing the formula gives
# 288.0 in floating point), so floor + 1 (289) is told apart from ceil (288); every other
# case's fraction is at least 0.5.
_CASES_10 = [(16384, 53248, "gpu-h100"), (16000, 48000, "gpu-b200"),
             (8192, 28672, "tpu-v5e"), (28672, 8192, "gpu-h100"),
             (4096, 4096, "tpu-v6e"), (16384, 53248, "gpu-a100"), (2048, 8192, "tpu-v5p")]

def _draw_10(rng):
    """A LLaMA-3 projection's (D, F), either way round, and a chip where some batch is
    compute-bound (every pair of these dimensions is, on every chip of the table)."""
    while True:
        D, F = rng.sample(_DIMS, 2)
        chip = rng.choice(_ALL_CHIPS)
        if _batch_ok_dims(D, F, chip):
            return D, F, chip


def _batch_ok_dims(D, F, chip):
    try:
        rl.critical_batch(D, F, chip)
    except ValueError:
        return False
    return True


register(CodeExercise(
    id="1.10", title="Smallest compute-bound batch, in code", reference=_critical_batch_ref,
    cases=_CASES_10, generate=_draw_10,
    compare=lambda got, want: as_number(got) == want, unit="tokens",
    describe=lambda D, F, chip: f"D={D}, F={F}, chip={chip!r}",
    hints=[
        (lambda got, want, args: as_number(got) is not None
         and abs(as_number(got) - math.ceil(get_chip(args[2]).critical_intensity)) <= 1,
         "B = I* keeps only the weight bytes and ignores the input and output bytes BD and BF; "
         "solve 2BDF >= I*·2(BD + DF + BF) for B."),
        (lambda got, want, args: as_number(got) == want - 1,
         "one short: round up (math.ceil, not round()): the batch must reach I*."),
        (lambda got, want, args: as_number(got) == want + 1 and args[:2] == (16000, 48000),
         "one too many: here the bound is a whole number, which is itself compute-bound "
         "(the intensity reaches I* exactly); math.ceil, not int() + 1."),
        (lambda got, want, args: as_number(got) is not None and not as_number(got).is_integer(),
         "return a whole number of tokens."),
    ],
))


# 1.11 -----------------------------------------------------------------------------------
def _ex11_parts(model="llama3-8b", projection="up", B=128, chip="tpu-v5e"):
    """(shared, per-token) Bounds of X[B, D] @ W[D, F] and of X[B, D] with W[B, D, F], bf16."""
    D, F = _proj_dims(model, projection)
    shared = rl.time_bounds(rl.matmul_flops(B, D, F), rl.matmul_bytes(B, D, F), chip)
    own = rl.time_bounds(rl.batched_matmul_flops(B, D, F), rl.batched_matmul_bytes(B, D, F),
                         chip)
    return shared, own


def _ex11(model, projection, B, chip):
    shared, own = _ex11_parts(model, projection, B, chip)
    return own.lower / shared.lower


def _ex11_hints(model, projection, B, chip):
    shared, own = _ex11_parts(model, projection, B, chip)
    other = shared.compute if shared.bottleneck == "memory" else shared.memory
    return [
        (lambda a: _close(a, 1.0, 0.05),
         "the FLOPs are the same, but the bytes are not: each token now reads its own matrix."),
        (lambda a: _close(a, own.lower / other, 0.02),
         f"the lower bound of the shared matmul is the larger of its two times; at this batch "
         f"that is its {shared.bottleneck} time."),
        (lambda a: _close(a, shared.lower / own.lower, 0.05),
         "that is the ratio the other way round: the per-token matmul is the slower one."),
        (lambda a: _close(a, B, 0.015),
         "close to B, but not B: the weights are B times larger, while the inputs and output "
         "(BD + BF elements) are the same in both. Compare the two byte counts in full."),
    ]


register(VariedNumericExercise(
    id="1.11", title="The price of a matrix per token", unit="ratio", rtol=0.01,
    params={"model": "llama3-8b", "projection": "up", "B": 128, "chip": "tpu-v5e"},
    choose={"model": _MODELS, "projection": ("up", "down"), "B": (16, 32, 64, 128),
            "chip": _ALL_CHIPS},
    solve=_ex11, hints_for=_ex11_hints, describe=_model_words,
    statement="{model_name}'s {projection} projection multiplies $X[{B}, {D}]$ by one bf16 "
              "$W[{D}, {F}]$ on one {chip_name}. Suppose instead that each of the {B} tokens "
              "had its own matrix, $W[{B}, {D}, {F}]$, with the same FLOPs. How many times "
              "longer is the lower bound on the run time? Answer as a ratio (per-token time "
              "over shared time).",
))
