"""Inside a chip and between chips: systolic arrays, tori, slices and transfer times.

Chapter 2 of the book derives each formula here in the open; later chapters import them.

Inside a TPU chip
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

Between chips
    * :func:`torus_hops`, :func:`hops_from`, :func:`diameter`, :func:`mean_hops`: hop counts
      on a 1D/2D/3D grid of chips, each axis with or without a wraparound link.
    * :func:`slice_wraparound`: which axes of a TPU slice shape have wraparound links.
    * :func:`transfer_time`: ``hops x latency + bytes / (links x link bandwidth)``.
    * :func:`bisection_links`, :func:`bisection_bandwidth`: the links (and bytes/s, one
      direction) that cross the cut halving the longest axis.
    * :func:`slice_info`: chips, hosts, wraparound, diameter and bisection of one slice.
    * :func:`bandwidth_hierarchy`: a chip's HBM, chip-to-chip, PCIe and DCN bandwidths.

Units: bytes, seconds, bytes/s (one direction), FLOP/s.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import dataclass

import numpy as np

from .hardware import Chip, get_chip
from .units import check_nonnegative, check_positive, check_positive_int

__all__ = [
    "SystolicRun", "systolic_matmul", "systolic_cycles", "mxu_padding_efficiency", "mxu_count",
    "mxu_peak_flops", "pipelined_time", "parse_shape", "torus_hops", "hops_from", "diameter",
    "mean_hops", "slice_wraparound", "transfer_time", "bisection_links", "bisection_bandwidth",
    "SliceInfo", "slice_info", "bandwidth_hierarchy",
]


# ---- inside the chip: the systolic array -------------------------------------------------

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


# ---- between chips: grids, tori and slices -----------------------------------------------

def parse_shape(shape) -> tuple[int, ...]:
    """A slice or mesh shape as a tuple: ``"4x4x8"``, ``(4, 4, 8)`` or ``[2, 4]``."""
    if isinstance(shape, str):
        parts = shape.lower().replace(" ", "").split("x")
        try:
            shape = tuple(int(p) for p in parts)
        except ValueError:
            raise ValueError(f"shape must look like '4x4' or '4x4x8'; got {shape!r}") from None
    try:
        shape = tuple(shape)
    except TypeError:
        raise ValueError(f"shape must be a tuple of positive integers or a string like '4x4'; "
                         f"got {shape!r}") from None
    if not 1 <= len(shape) <= 3:
        raise ValueError(f"shape must have 1, 2 or 3 axes; got {shape!r}")
    return tuple(check_positive_int(f"shape[{i}]", n) for i, n in enumerate(shape))


def _wrap_tuple(wrap, shape) -> tuple[bool, ...]:
    if isinstance(wrap, (bool, np.bool_)):
        return (bool(wrap),) * len(shape)
    try:
        wrap = tuple(wrap)
    except TypeError:
        raise ValueError(f"wrap must be True, False or one bool per axis; got {wrap!r}") from None
    if len(wrap) != len(shape) or not all(isinstance(w, (bool, np.bool_)) for w in wrap):
        raise ValueError(f"wrap must be one bool per axis of shape {shape}; got {wrap!r}")
    return tuple(bool(w) for w in wrap)


def _coord(name: str, c, shape) -> tuple[int, ...]:
    if isinstance(c, numbers.Integral) and not isinstance(c, bool) and len(shape) == 1:
        c = (c,)
    try:
        c = tuple(int(v) for v in c)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a coordinate tuple like (0, 3); got {c!r}") from None
    if len(c) != len(shape):
        raise ValueError(f"{name}={c} has {len(c)} coordinates but shape {shape} has {len(shape)} axes")
    for i, (v, n) in enumerate(zip(c, shape)):
        if not 0 <= v < n:
            raise ValueError(f"{name}[{i}]={v} is outside axis {i} of length {n}")
    return c


def _axis_hops(d, n: int, wrap: bool):
    d = np.abs(d)
    return np.minimum(d, n - d) if wrap else d


def torus_hops(src, dst, shape, wrap=True) -> int:
    """Fewest link hops from chip ``src`` to chip ``dst`` on a grid of chips.

    Each axis of length n adds ``|d|`` hops (no wraparound) or ``min(|d|, n - |d|)``
    (with a wraparound link joining its two ends). ``wrap`` is one bool for all axes or
    one per axis.
    """
    shape = parse_shape(shape)
    wrap = _wrap_tuple(wrap, shape)
    a, b = _coord("src", src, shape), _coord("dst", dst, shape)
    return int(sum(_axis_hops(bi - ai, n, w) for ai, bi, n, w in zip(a, b, shape, wrap)))


def hops_from(src, shape, wrap=True) -> np.ndarray:
    """An array of ``shape`` holding the hop count from ``src`` to every chip."""
    shape = parse_shape(shape)
    wrap = _wrap_tuple(wrap, shape)
    a = _coord("src", src, shape)
    grids = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    total = np.zeros(shape, dtype=np.int64)
    for g, ai, n, w in zip(grids, a, shape, wrap):
        total += _axis_hops(g - ai, n, w)
    return total


def diameter(shape, wrap=True) -> int:
    """The largest hop count between two chips: sum of n // 2 (wraparound) or n - 1 per axis."""
    shape = parse_shape(shape)
    wrap = _wrap_tuple(wrap, shape)
    return int(sum(n // 2 if w else n - 1 for n, w in zip(shape, wrap)))


def mean_hops(shape, wrap=True) -> float:
    """Average hop count over all ordered pairs of distinct chips."""
    shape = parse_shape(shape)
    wrap = _wrap_tuple(wrap, shape)
    total = math.prod(shape)
    if total == 1:
        return 0.0
    # Axes are independent: the mean over all pairs (including a chip with itself) is the sum
    # of per-axis means; rescale to exclude the zero-hop pairs.
    per_axis = []
    for n, w in zip(shape, wrap):
        d = np.arange(n)[:, None] - np.arange(n)[None, :]
        per_axis.append(float(_axis_hops(d, n, w).mean()))
    return sum(per_axis) * total / (total - 1)


def slice_wraparound(chip, shape) -> tuple[bool, ...]:
    """Which axes of a TPU slice of ``shape`` have wraparound links.

    The rule used in this book (scaling-book's TPU chapter; Cloud TPU v4/v5p docs):
    * 2D-torus chips (v5e, v6e): an axis wraps only when it spans the full pod axis of 16.
    * 3D-torus chips (v4, v5p): wraparound links come from the optical switches of full
      4x4x4 cubes, so every axis wraps when every axis is a multiple of 4, else none does.
    """
    c = get_chip(chip)
    shape = parse_shape(shape)
    if c.vendor != "Google":
        raise ValueError(f"{c.name} is not a TPU: GPUs in one node talk through NVSwitch, not a torus")
    n_chips = math.prod(shape)
    if c.ici_domain_chips is not None and n_chips > c.ici_domain_chips:
        raise ValueError(f"a {'x'.join(map(str, shape))} slice has {n_chips} chips, more than a "
                         f"{c.name} pod ({c.ici_domain_chips})")
    if c.topology.startswith("2D"):
        if len(shape) > 2:
            raise ValueError(f"{c.name} slices are 2D; got shape {shape}")
        side = math.isqrt(c.ici_domain_chips)
        if any(n > side for n in shape):
            raise ValueError(f"{c.name} slice axes are at most {side} long; got {shape}")
        return tuple(n == side for n in shape)
    full_cubes = all(n % 4 == 0 for n in shape) and len(shape) == 3
    return (full_cubes,) * len(shape)


def transfer_time(nbytes: float, link_bandwidth: float, hops: int = 1, links: int = 1,
                  hop_latency: float = 0.0) -> float:
    """Seconds to send ``nbytes`` from one chip to another ``hops`` links away.

    Intermediate chips forward the data as it arrives (cut-through), so distance adds only
    latency: ``hops x hop_latency + nbytes / (links x link_bandwidth)``. ``links`` counts
    the link-disjoint paths the bytes are split over (e.g. 2 when both directions of a ring
    or two axes carry half each).
    """
    nbytes = check_nonnegative("nbytes", nbytes)
    bw = check_positive("link_bandwidth (bytes/s)", link_bandwidth)
    if isinstance(hops, bool) or not isinstance(hops, numbers.Integral) or hops < 0:
        raise ValueError(f"hops must be an integer >= 0; got {hops!r}")
    links = check_positive_int("links", links)
    lat = check_nonnegative("hop_latency", hop_latency)
    return hops * lat + nbytes / (links * bw)


def bisection_links(shape, wrap=True) -> int:
    """Links (one direction) crossing the cut that halves the longest axis.

    The cut meets ``chips / n`` lines of chips along that axis of length n, each once, or
    twice when the axis wraps around (the wraparound link crosses it too).
    """
    shape = parse_shape(shape)
    wrap = _wrap_tuple(wrap, shape)
    i = int(np.argmax(shape))
    n = shape[i]
    if n == 1:
        return 0
    lines = math.prod(shape) // n
    return lines * (2 if wrap[i] and n > 2 else 1)


def bisection_bandwidth(chip, shape, wrap=None) -> float:
    """Bytes/s (one direction) across the bisection of a slice: links x link bandwidth.

    ``wrap`` defaults to :func:`slice_wraparound` for the chip.
    """
    c = get_chip(chip)
    shape = parse_shape(shape)
    w = slice_wraparound(c, shape) if wrap is None else wrap
    return bisection_links(shape, w) * c.ici_link_bandwidth


@dataclass(frozen=True)
class SliceInfo:
    """One TPU slice: its shape, chips, hosts, wraparound, diameter and bisection."""

    chip: str
    shape: tuple
    chips: int
    hosts: int
    wrap: tuple
    diameter: int
    bisection_bandwidth: float

    @property
    def name(self) -> str:
        return "x".join(map(str, self.shape))


def slice_info(chip, shape) -> SliceInfo:
    """Describe a TPU slice such as ``slice_info("tpu-v5e", "2x4")``."""
    c = get_chip(chip)
    shape = parse_shape(shape)
    wrap = slice_wraparound(c, shape)
    chips = math.prod(shape)
    return SliceInfo(chip=c.name, shape=shape, chips=chips,
                     hosts=math.ceil(chips / c.chips_per_host), wrap=wrap,
                     diameter=diameter(shape, wrap),
                     bisection_bandwidth=bisection_bandwidth(c, shape, wrap))


def bandwidth_hierarchy(chip) -> list[dict]:
    """A chip's bandwidths from fastest to slowest, bytes/s in one direction per chip.

    Rows: HBM; chip-to-chip over all links (ICI or NVLink) and over one link; PCIe to the
    host; DCN (data-centre network). ``None`` where no figure is published.
    """
    c = get_chip(chip)
    link = "NVLink" if c.vendor == "NVIDIA" else "ICI"
    return [
        {"level": "HBM", "bandwidth": c.hbm_bandwidth, "what": "chip <-> its own HBM"},
        {"level": f"{link}, all links", "bandwidth": c.ici_bandwidth,
         "what": f"chip -> neighbours, {c.ici_links} links"},
        {"level": f"{link}, one link", "bandwidth": c.ici_link_bandwidth, "what": "chip -> one neighbour"},
        {"level": "PCIe", "bandwidth": c.pcie_bandwidth, "what": "chip <-> host CPU memory"},
        {"level": "DCN", "bandwidth": c.dcn_bandwidth, "what": "chip's share of the network to other hosts"},
    ]
