"""Chapter 1 exercises: rooflines. Reference answers are computed from scalebook."""

from __future__ import annotations

import math

from .. import roofline as rl
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import ChoiceExercise, CodeExercise, NumericExercise, as_number


def _close(a, b, rtol=0.03):
    return math.isclose(a, b, rel_tol=rtol)


# 1.1 ------------------------------------------------------------------------------------
def _ex1_parts():
    B, D, F = 4096, 8192, 8192
    return rl.time_bounds(rl.matmul_flops(B, D, F), rl.matmul_bytes(B, D, F), "tpu-v5p")


register(NumericExercise(
    id="1.1", title="Lower bound of one matmul", unit="s",
    reference=lambda: _ex1_parts().lower,
    hints=[
        (lambda a: _close(a, _ex1_parts().memory), "that is the memory time. Which of the two times is larger?"),
        (lambda a: _close(a, _ex1_parts().upper), "that is the upper bound (no overlap); the lower bound assumes perfect overlap."),
        (lambda a: _close(a, _ex1_parts().compute / 2), "a matmul does 2 FLOPs (a multiply and an add) per term of the sum."),
    ],
))


# 1.2 ------------------------------------------------------------------------------------
def _ex2():
    N, s = 1_000_000, 2
    return rl.arithmetic_intensity(N, 3 * N * s)


register(NumericExercise(
    id="1.2", title="Intensity of a vector add", unit="FLOPs/byte", reference=_ex2,
    hints=[
        (lambda a: _close(a, 0.25), "the output vector must be written to HBM too."),
        (lambda a: _close(a, 1 / 3), "each bf16 element takes 2 bytes."),
    ],
))


# 1.3 ------------------------------------------------------------------------------------
register(NumericExercise(
    id="1.3", title="Critical intensity in fp8", unit="FLOPs/byte",
    reference=lambda: get_chip("gpu-h100").critical_intensity_for("fp8"),
    hints=[(lambda a: _close(a, get_chip("gpu-h100").critical_intensity),
            "that is the bf16 critical intensity; fp8 has its own peak FLOP/s.")],
))


# 1.4 ------------------------------------------------------------------------------------
def _down_proj():
    m = get_model("llama3-70b")
    return m.d_ff, m.d_model


register(NumericExercise(
    id="1.4", title="Smallest compute-bound batch on an H100", unit="tokens", integer=True,
    reference=lambda: rl.critical_batch(*_down_proj(), "gpu-h100"),
    hints=[
        (lambda a: abs(a - get_chip("gpu-h100").critical_intensity) < 2,
         "B ~ I* is the approximation for B << D, F. Solve the inequality with all three byte terms."),
        (lambda a: a == rl.critical_batch(*_down_proj(), "gpu-h100") - 1,
         "one short: at that batch the intensity is still just below I*. Round up."),
    ],
))


# 1.5 ------------------------------------------------------------------------------------
def _up_proj():
    m = get_model("llama3-70b")
    return m.d_model, m.d_ff


register(NumericExercise(
    id="1.5", title="int8 weights halve the batch", unit="tokens", integer=True,
    reference=lambda: rl.critical_batch(*_up_proj(), "tpu-v5e", bytes_per_element=2,
                                        weight_bytes_per_element=1),
    hints=[
        (lambda a: a == rl.critical_batch(*_up_proj(), "tpu-v5e"),
         "that is the answer with bf16 weights. The weights now take 1 byte each."),
        (lambda a: a == rl.critical_batch(*_up_proj(), "tpu-v5e", dtype="int8",
                                          bytes_per_element=2, weight_bytes_per_element=1),
         "the arithmetic is still done in bf16, so use the bf16 peak."),
    ],
))


# 1.6 ------------------------------------------------------------------------------------
register(NumericExercise(
    id="1.6", title="When does the all-reduce hide?", unit="elements of D", rtol=0.03,
    reference=lambda: rl.min_contraction_to_hide_comm("tpu-v5e"),
    hints=[
        (lambda a: _close(a, rl.min_contraction_to_hide_comm("tpu-v5e") * 2),
         "each chip does only half of the 2BDF FLOPs, but it also sends only one [B, F] partial sum."),
        (lambda a: _close(a, rl.min_contraction_to_hide_comm("tpu-v5e") / 2),
         "a bf16 element of the partial sum takes 2 bytes."),
    ],
))


# 1.7 ------------------------------------------------------------------------------------
def _tile_answer():
    n, crit = 16384, get_chip("tpu-v5e").critical_intensity
    t = 128
    while rl.tiled_matmul_intensity(n, n, n, t, t) < crit:
        t += 128
    return t


register(NumericExercise(
    id="1.7", title="Tile size for a compute-bound matmul", unit="elements", integer=True,
    reference=_tile_answer,
    hints=[
        (lambda a: a % 128 != 0, "the tile must be a multiple of 128 (the matrix unit's width)."),
        (lambda a: a < _tile_answer(), "too small: at that tile size the intensity is still below I*."),
    ],
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


_CASES_9 = [(1, 8192, 28672, "tpu-v5e"), (4096, 8192, 8192, "gpu-h100"), (256, 4096, 14336, "tpu-v6e"),
            (64, 16384, 53248, "gpu-b200")]

register(CodeExercise(
    id="1.9", title="Time bounds of a bf16 matmul", reference=_bounds_ref, cases=_CASES_9,
    describe=lambda B, D, F, chip: f"B={B}, D={D}, F={F}, chip={chip!r}",
    hints=[
        (lambda got, want, args: isinstance(got, (tuple, list)) and len(got) == 2
         and _close(got[0], want[1]) and _close(got[1], want[0]),
         "the lower bound comes first: (max of the times, sum of the times)."),
        (lambda got, want, args: not hasattr(got, "__len__") or len(got) != 2,
         "return a pair (lower, upper) in seconds."),
    ],
))


# 1.10 -----------------------------------------------------------------------------------
def _critical_batch_ref(D, F, chip):
    return rl.critical_batch(D, F, chip)


_CASES_10 = [(8192, 28672, "tpu-v5e"), (28672, 8192, "gpu-h100"), (4096, 4096, "tpu-v6e"),
             (16384, 53248, "gpu-a100"), (2048, 8192, "tpu-v5p")]

register(CodeExercise(
    id="1.10", title="Smallest compute-bound batch, in code", reference=_critical_batch_ref,
    cases=_CASES_10, compare=lambda got, want: as_number(got) == want,
    describe=lambda D, F, chip: f"D={D}, F={F}, chip={chip!r}",
    hints=[
        (lambda got, want, args: abs(got - math.ceil(get_chip(args[2]).critical_intensity)) <= 1,
         "B = I* keeps only the weight bytes and ignores the input and output bytes BD and BF; "
         "solve 2BDF >= I*·2(BD + DF + BF) for B."),
        (lambda got, want, args: got == want - 1, "one short: round up, the batch must reach I*."),
        (lambda got, want, args: not float(got).is_integer(), "return a whole number of tokens."),
    ],
))
