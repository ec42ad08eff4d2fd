"""Inside a chip: the systolic array, the MXUs and the load/compute pipeline.

Chapter 2 of the book derives each formula here in the open; later chapters import them.

* :func:`systolic_matmul` simulates a weight-stationary systolic array cycle by cycle
  (NumPy) and returns the product together with the cycle count and the number of
  busy cells per cycle. :func:`systolic_cycles` is the closed form of its cycle count:
  ``M + K + N - 2`` for ``X[M, K] @ W[K, N]`` on a ``K x N`` array.
* :func:`mxu_padding_efficiency`: the useful fraction of MXU work when the two
  weight dimensions are padded up to multiples of the MXU size.
* :func:`mxu_count`, :func:`mxu_peak_flops`: the MXUs of a chip and one MXU's share of
  the chip's peak.
* :func:`pipelined_time`: the time of ``n`` load-then-compute steps when the load of
  step ``i + 1`` overlaps the compute of step ``i`` (HBM -> VMEM -> MXU pipelining).

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
    "mxu_peak_flops", "pipelined_time",
]


@dataclass(frozen=True)
class SystolicRun:
    """Result of :func:`systolic_matmul`.

    out: the product X @ W; cycles: clock cycles from the first activation entering the
    array to the last result leaving it (weights already loaded); busy: for each cycle,
    how many of the K x N cells did a multiply-add; cells: K x N.
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
    """Multiply ``x[M, K] @ w[K, N]`` on a simulated weight-stationary ``K x N`` systolic array.

    Cell ``(k, n)`` holds the weight ``w[k, n]``. Row ``m`` of ``x`` enters the array from
    the left, skewed so that ``x[m, k]`` reaches row ``k`` at cycle ``m + k``; every cycle,
    each cell multiplies the activation passing through it by its weight, adds the partial
    sum arriving from the cell above, and passes the activation right and the sum down.
    The finished ``out[m, n]`` leaves the bottom of column ``n`` at cycle ``m + (K - 1) + n``.
    Only neighbouring cells ever talk to each other: no cell reads memory.

    Returns a :class:`SystolicRun` with the product, the cycle count (equal to
    :func:`systolic_cycles`) and the number of busy cells in each cycle.
    """
    x = _as_matrix("x", x)
    w = _as_matrix("w", w)
    M, K = x.shape
    K2, N = w.shape
    if K != K2:
        raise ValueError(f"inner dimensions differ: x is {x.shape} and w is {w.shape}")
    dtype = np.result_type(x.dtype, w.dtype)
    act = np.zeros((K, N), dtype)        # activation register of each cell
    valid = np.zeros((K, N), bool)       # whether that register holds a real activation
    psum = np.zeros((K, N), dtype)       # partial sum leaving each cell downwards
    out = np.zeros((M, N), dtype)
    cycles = systolic_cycles(M, K, N)
    busy = np.zeros(cycles, dtype=np.int64)
    rows = np.arange(K)
    cols = np.arange(N)
    for t in range(cycles):
        # Activations move one cell right; a new skewed column enters on the left.
        act[:, 1:] = act[:, :-1]
        valid[:, 1:] = valid[:, :-1]
        m_in = t - rows                              # row k receives x[t - k, k]
        enter = (m_in >= 0) & (m_in < M)
        act[:, 0] = 0
        act[enter, 0] = x[m_in[enter], rows[enter]]
        valid[:, 0] = enter
        # Partial sums move one cell down; the top row starts from zero.
        above = np.zeros_like(psum)
        above[1:] = psum[:-1]
        psum = above + act * w
        busy[t] = int(valid.sum())
        # The bottom row finishes out[t - (K - 1) - n, n].
        m_out = t - (K - 1) - cols
        done = (m_out >= 0) & (m_out < M)
        out[m_out[done], cols[done]] = psum[K - 1, done]
    return SystolicRun(out=out, cycles=cycles, busy=busy, cells=K * N)


def systolic_cycles(M: int, K: int, N: int) -> int:
    """Cycles for ``X[M, K] @ W[K, N]`` on a ``K x N`` weight-stationary array: M + K + N - 2.

    The last row of X enters at cycle M - 1, needs K - 1 more cycles to reach the bottom
    row and N - 1 more to reach the last column; counting cycle 0 gives M + K + N - 2.
    Loading the weights (K more cycles) is not included.
    """
    M = check_positive_int("M", M)
    K = check_positive_int("K", K)
    N = check_positive_int("N", N)
    return M + K + N - 2


def mxu_padding_efficiency(K: int, N: int, chip="tpu-v5e") -> float:
    """Useful fraction of MXU work for a ``[K, N]`` weight on ``chip``'s MXUs.

    The weight is cut into ``s x s`` tiles (``s`` = the MXU size); a partial tile costs as
    much as a full one, so the fraction is ``K N / (ceil(K/s) s * ceil(N/s) s)``.
    """
    K = check_positive_int("K", K)
    N = check_positive_int("N", N)
    s = _mxu_size(chip)
    return (K * N) / (math.ceil(K / s) * s * math.ceil(N / s) * s)


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
