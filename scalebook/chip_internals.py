"""Inside a chip: the systolic array, the MXUs and the load/compute pipeline.

Chapter 2 of the book derives each formula here in the open; later chapters import them.

* :func:`systolic_matmul` simulates a weight-stationary systolic array cycle by cycle
  (NumPy) and returns the product together with the cycle count and the number of
  busy cells per cycle. :func:`systolic_cycles` is the closed form of its cycle count:
  ``B + D + F - 2`` for ``X[B, D] @ W[D, F]`` on a ``D x F`` array.
* :func:`mxu_padding_efficiency`: the useful fraction of MXU work when the two
  weight dimensions are padded up to multiples of the MXU size.
* :func:`mxu_count`, :func:`mxu_peak_flops`: the MXUs of a chip and one MXU's share of
  the chip's peak.
* :func:`implied_clock`: the clock rate a chip's peak implies, given its MXUs.
* :func:`mxu_operation`: the shape and cadence of one MXU operation.
* :func:`weight_stream_batch`: tokens per weight a matmul needs for its arithmetic to take
  as long as streaming its weights over a given bandwidth (HBM, VMEM, PCIe).
* :func:`pipelined_time`: the time of ``n`` load-then-compute steps when the load of
  step ``i + 1`` overlaps the compute of step ``i`` (HBM -> VMEM -> MXU pipelining).

Inside a GPU (chapter 11):

* :func:`sm_peak_flops`: SMs x dense FLOPs per SM per clock x clock (the datasheet's
  tensor peak); :func:`sm_vector_flops`: SMs x CUDA cores x 2 x boost clock (its FP32 peak).
* :func:`implied_sm_clock`: the clock a GPU's peak implies for a given per-SM rate (for a
  GPU whose clock is unpublished, the B200).
* :func:`wave_quantization`: how a matmul's output tiles fill the SMs in waves, and the
  share of the SMs' time that does useful work.

Units: seconds, FLOP/s.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .hardware import get_chip
from .units import check_nonnegative, check_positive_int

__all__ = [
    "SystolicRun", "systolic_matmul", "systolic_cycles", "mxu_padding_efficiency", "mxu_count",
    "mxu_peak_flops", "pipelined_time", "implied_clock", "MXUOperation", "mxu_operation",
    "weight_stream_batch", "MXU_OP_ROWS", "sm_peak_flops", "sm_vector_flops",
    "implied_sm_clock", "Waves", "wave_quantization",
]

# Rows of activations one MXU operation takes: an MXU multiplies X[8, q] by its loaded
# W[q, q] in 8 cycles, one row per cycle (scaling-book, TPU chapter, appendix B).
MXU_OP_ROWS = 8


@dataclass(frozen=True)
class SystolicRun:
    """Result of :func:`systolic_matmul`.

    out: the product X @ W; cycles: clock cycles from the first activation entering the
    array to the last result leaving it (weights already loaded); busy: for each cycle,
    how many of the D x F cells did a multiply-add; cells: D x F.
    """

    out: np.ndarray
    cycles: int
    busy: np.ndarray
    cells: int

    @property
    def utilization(self) -> float:
        """Multiply-adds done / (cells x cycles); 1.0 would mean every cell busy every cycle."""
        return float(self.busy.sum()) / (self.cells * self.cycles)


def _as_matrix(name: str, a) -> np.ndarray:
    try:
        arr = np.asarray(a)
    except Exception as e:  # pragma: no cover - odd objects
        raise ValueError(f"{name} must be a 2D array; got {type(a).__name__}") from e
    if arr.ndim != 2 or 0 in arr.shape:
        raise ValueError(f"{name} must be a non-empty 2D array; got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.number) and not np.issubdtype(arr.dtype, np.bool_)):
        raise ValueError(f"{name} must hold numbers; got dtype {arr.dtype}")
    return arr


def systolic_matmul(x, w) -> SystolicRun:
    """Multiply ``x[B, D] @ w[D, F]`` on a simulated weight-stationary ``D x F`` systolic array.

    Cell ``(d, f)`` holds the weight ``w[d, f]``. Row ``b`` of ``x`` enters the array from
    the left, skewed so that ``x[b, d]`` reaches row ``d`` at cycle ``b + d``; every cycle,
    each cell multiplies the activation passing through it by its weight, adds the partial
    sum arriving from the cell above, and passes the activation right and the sum down.
    The finished ``out[b, f]`` leaves the bottom of column ``f`` at cycle ``b + (D - 1) + f``.
    Only neighbouring cells ever talk to each other: no cell reads memory.

    Returns a :class:`SystolicRun` with the product, the cycle count (equal to
    :func:`systolic_cycles`) and the number of busy cells in each cycle.
    """
    x = _as_matrix("x", x)
    w = _as_matrix("w", w)
    B, D = x.shape
    D2, F = w.shape
    if D != D2:
        raise ValueError(f"inner dimensions differ: x is {x.shape} and w is {w.shape}")
    dtype = np.result_type(x.dtype, w.dtype)
    act = np.zeros((D, F), dtype)        # activation register of each cell
    valid = np.zeros((D, F), bool)       # whether that register holds a real activation
    psum = np.zeros((D, F), dtype)       # partial sum leaving each cell downwards
    out = np.zeros((B, F), dtype)
    cycles = systolic_cycles(B, D, F)
    busy = np.zeros(cycles, dtype=np.int64)
    rows = np.arange(D)
    cols = np.arange(F)
    for t in range(cycles):
        # Activations move one cell right; a new skewed column enters on the left.
        act[:, 1:] = act[:, :-1]
        valid[:, 1:] = valid[:, :-1]
        b_in = t - rows                              # row d receives x[t - d, d]
        enter = (b_in >= 0) & (b_in < B)
        act[:, 0] = 0
        act[enter, 0] = x[b_in[enter], rows[enter]]
        valid[:, 0] = enter
        # Partial sums move one cell down; the top row starts from zero.
        above = np.zeros_like(psum)
        above[1:] = psum[:-1]
        psum = above + act * w
        busy[t] = int(valid.sum())
        # The bottom row finishes out[t - (D - 1) - f, f].
        b_out = t - (D - 1) - cols
        done = (b_out >= 0) & (b_out < B)
        out[b_out[done], cols[done]] = psum[D - 1, done]
    return SystolicRun(out=out, cycles=cycles, busy=busy, cells=D * F)


def systolic_cycles(B: int, D: int, F: int) -> int:
    """Cycles for ``X[B, D] @ W[D, F]`` on a ``D x F`` weight-stationary array: B + D + F - 2.

    The last row of X enters at cycle B - 1, needs D - 1 more cycles to reach the bottom
    row and F - 1 more to reach the last column; counting cycle 0 gives B + D + F - 2.
    Loading the weights (D more cycles) is not included.
    """
    B = check_positive_int("B", B)
    D = check_positive_int("D", D)
    F = check_positive_int("F", F)
    return B + D + F - 2


def mxu_padding_efficiency(D: int, F: int, chip="tpu-v5e") -> float:
    """Useful fraction of MXU work for a ``[D, F]`` weight on ``chip``'s MXUs.

    The weight is cut into ``q x q`` tiles (``q`` = the MXU size); a partial tile costs as
    much as a full one, so the fraction is ``D F / (ceil(D/q) q * ceil(F/q) q)``.
    """
    D = check_positive_int("D", D)
    F = check_positive_int("F", F)
    q = _mxu_size(chip)
    return (D * F) / (math.ceil(D / q) * q * math.ceil(F / q) * q)


def _mxu_size(chip) -> int:
    if isinstance(chip, numbers.Integral) and not isinstance(chip, bool):
        return check_positive_int("mxu_size", chip)
    c = get_chip(chip)
    if c.mxu_size is None:
        raise ValueError(f"{c.name} has no MXU (mxu_size is None); use a TPU such as 'tpu-v5e'")
    return c.mxu_size


def mxu_count(chip) -> int:
    """MXUs on one chip: TensorCores x MXUs per TensorCore."""
    c = get_chip(chip)
    if c.tensorcores is None or c.mxus_per_core is None:
        raise ValueError(f"{c.name} has no published MXU count; use a TPU such as 'tpu-v5e'")
    return c.tensorcores * c.mxus_per_core


def mxu_peak_flops(chip, dtype: str = "bf16") -> float:
    """One MXU's share of the chip's peak FLOP/s for ``dtype``."""
    return get_chip(chip).peak_flops(dtype) / mxu_count(chip)


def pipelined_time(n_steps: int, load_time: float, compute_time: float,
                   overlap: bool = True) -> float:
    """Seconds for ``n_steps`` tiles that each load (HBM -> VMEM) and then compute (MXU).

    With ``overlap``, the load of tile i + 1 runs while tile i computes (double buffering):
    ``load + (n - 1) max(load, compute) + compute``. Without it the steps add up:
    ``n (load + compute)``.
    """
    n = check_positive_int("n_steps", n_steps)
    L = check_nonnegative("load_time", load_time)
    C = check_nonnegative("compute_time", compute_time)
    if not overlap:
        return n * (L + C)
    return L + (n - 1) * max(L, C) + C


def implied_clock(chip, dtype: str = "bf16") -> float:
    """Hz at which the chip's MXUs, each doing ``mxu_size**2`` multiply-adds (2 FLOPs each)
    per cycle, reach its published peak: ``peak / (MXUs x 2 x mxu_size**2)``."""
    c = get_chip(chip)
    return c.peak_flops(dtype) / (mxu_count(c) * 2 * _mxu_size(c) ** 2)


@dataclass(frozen=True)
class MXUOperation:
    """One MXU operation: ``X[rows, size] @ W[size, size]`` in ``cycles`` clock cycles."""

    rows: int
    size: int
    cycles: int

    @property
    def flops(self) -> int:
        """2 x rows x size x size FLOPs."""
        return 2 * self.rows * self.size * self.size

    @property
    def flops_per_cycle(self) -> float:
        return self.flops / self.cycles


def mxu_operation(chip) -> MXUOperation:
    """The operation one MXU of ``chip`` repeats: ``X[8, q] @ W[q, q]`` every 8 cycles."""
    return MXUOperation(rows=MXU_OP_ROWS, size=_mxu_size(chip), cycles=MXU_OP_ROWS)


def weight_stream_batch(chip, bandwidth: float, weight_bytes_per_element: float = 2,
                        dtype: str = "bf16") -> float:
    """Tokens ``B`` for which ``X[B, D] @ W[D, F]`` computes for as long as ``W`` takes to
    stream in at ``bandwidth`` bytes/s: ``2 B D F / C = s_w D F / W``, so
    ``B = s_w C / (2 W)``, whatever D and F. Fewer tokens than this and the matmul waits for
    its weights (activations are not counted: they are small next to W at such B)."""
    c = get_chip(chip)
    W = check_nonnegative("bandwidth", bandwidth)
    if W == 0:
        raise ValueError("bandwidth must be positive")
    sw = check_nonnegative("weight_bytes_per_element", weight_bytes_per_element)
    return sw * c.peak_flops(dtype) / (2 * W)


# ------------------------------------------------------------------------------------------
# inside a GPU (chapter 11)
# ------------------------------------------------------------------------------------------

def _gpu_figure(c, field: str):
    value = getattr(c, field)
    if value is None:
        raise ValueError(f"{c.name} has no {field} in scalebook.hardware (NVIDIA publishes "
                         f"none, or it is not a GPU); give one with "
                         f"get_chip({c.name!r}).with_({field}=...)")
    return value


def sm_peak_flops(chip) -> float:
    """Dense bf16 FLOP/s from the SMs: ``sm_count x tensor_flops_per_sm_clock x
    tensor_clock``. Equals the datasheet's ``bf16_flops`` to rounding on the A100, H100
    and H200."""
    c = get_chip(chip)
    return (_gpu_figure(c, "sm_count") * _gpu_figure(c, "tensor_flops_per_sm_clock")
            * _gpu_figure(c, "tensor_clock"))


def sm_vector_flops(chip) -> float:
    """FP32 FLOP/s of the CUDA cores: ``sm_count x cuda_cores_per_sm x 2 x boost_clock``
    (a fused multiply-add per core per clock counts as 2 FLOPs)."""
    c = get_chip(chip)
    return (_gpu_figure(c, "sm_count") * _gpu_figure(c, "cuda_cores_per_sm") * 2
            * _gpu_figure(c, "boost_clock"))


def implied_sm_clock(chip, flops_per_sm_clock: float, dtype: str = "bf16") -> float:
    """Hz at which ``sm_count`` SMs, each doing ``flops_per_sm_clock`` dense FLOPs per
    clock, reach the chip's published ``dtype`` peak: ``peak / (SMs x rate)``."""
    c = get_chip(chip)
    rate = check_nonnegative("flops_per_sm_clock", flops_per_sm_clock)
    if rate == 0:
        raise ValueError("flops_per_sm_clock must be positive")
    return c.peak_flops(dtype) / (_gpu_figure(c, "sm_count") * rate)


@dataclass(frozen=True)
class Waves:
    """Result of :func:`wave_quantization`: ``tiles`` output tiles, run ``sms`` at a time in
    ``waves`` waves; ``efficiency`` = tiles / (waves x sms), the share of the SMs' tile
    slots that compute a tile (the last wave leaves SMs idle). ``useful`` also counts the
    padding inside the tiles: B F / (waves x sms x t_B t_F), the share of the SMs' time
    spent on real output elements (a B = 64 batch fills half of each 128-row tile)."""

    tiles: int
    sms: int
    waves: int
    elements: int = 0           # B F, the output's real elements
    tile_elements: int = 0      # t_B t_F

    @property
    def efficiency(self) -> float:
        return self.tiles / (self.waves * self.sms)

    @property
    def useful(self) -> float:
        if not self.tile_elements:
            raise ValueError("useful needs the output and tile sizes: use wave_quantization")
        return self.elements / (self.waves * self.sms * self.tile_elements)


def wave_quantization(B: int, F: int, chip, tile=(128, 256)) -> Waves:
    """How the output ``Z[B, F]`` of a matmul, cut into ``tile = (t_B, t_F)`` tiles (one SM
    computes one tile at a time, the whole contraction), fills the chip's SMs: tiles =
    ceil(B / t_B) ceil(F / t_F), waves = ceil(tiles / SMs). 128 x 256 is a common Hopper
    tile; a kernel library chooses among several."""
    c = get_chip(chip)
    B = check_positive_int("B", B)
    F = check_positive_int("F", F)
    if not isinstance(tile, (tuple, list)) or len(tile) != 2:
        raise ValueError(f"tile must be a pair (t_B, t_F); got {tile!r}")
    tb, tf = (check_positive_int("tile side", t) for t in tile)
    sms = _gpu_figure(c, "sm_count")
    tiles = math.ceil(B / tb) * math.ceil(F / tf)
    return Waves(tiles=tiles, sms=sms, waves=math.ceil(tiles / sms), elements=B * F,
                 tile_elements=tb * tf)
