"""Roofline arithmetic: how long an operation must take on a chip.

An operation that does ``flops`` floating-point operations, moves ``hbm_bytes`` between
HBM and the compute units and sends ``comm_bytes`` over a link takes at least

    T_compute = flops / peak FLOP/s
    T_memory  = hbm_bytes / HBM bandwidth
    T_comm    = comm_bytes / link bandwidth

and the whole operation takes between ``max`` of these (perfect overlap: the lower
bound) and their ``sum`` (no overlap: the upper bound).

For the matmul ``X[B, D] @ W[D, F]``:

    FLOPs = 2 B D F                       (one multiply and one add per term)
    bytes = s (B D + D F + B F)           (read X and W, write the result; s bytes/element)
    intensity = FLOPs / bytes  ~  B       when B << D, F and s = 2

and when every token has its own matrix, ``X[B, D]`` with ``W[B, D, F]``:

    bytes = s (B D + B D F + B F),  intensity = 2 D F / (s (D + D F + F)) < 2 / s, whatever B

All times are in seconds, sizes in bytes, rates in bytes/s or FLOP/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .hardware import Chip, get_chip
from .units import check_nonnegative, check_positive, check_positive_int

__all__ = [
    "Bounds", "compute_time", "memory_time", "comm_time", "time_bounds", "arithmetic_intensity",
    "matmul_flops", "matmul_bytes", "matmul_intensity", "dot_flops", "dot_bytes",
    "batched_matmul_flops", "batched_matmul_bytes", "batched_matmul_intensity",
    "critical_batch", "tiled_matmul_bytes", "tiled_matmul_intensity",
    "contraction_split_times", "min_contraction_to_hide_comm", "attainable_flops",
]


@dataclass(frozen=True)
class Bounds:
    """The three times of an operation and the bounds they imply (all in seconds)."""

    compute: float
    memory: float
    comm: float = 0.0

    @property
    def lower(self) -> float:
        """Perfect overlap: the slowest resource sets the time."""
        return max(self.compute, self.memory, self.comm)

    @property
    def upper(self) -> float:
        """No overlap: the times add up."""
        return self.compute + self.memory + self.comm

    @property
    def bottleneck(self) -> str:
        """'compute', 'memory' or 'communication': whichever time is largest."""
        times = {"compute": self.compute, "memory": self.memory, "communication": self.comm}
        return max(times, key=times.get)


def compute_time(flops: float, chip, dtype: str = "bf16") -> float:
    """Seconds to do ``flops`` at the chip's peak rate for ``dtype``."""
    return check_nonnegative("flops", flops) / get_chip(chip).peak_flops(dtype)


def memory_time(nbytes: float, chip) -> float:
    """Seconds to move ``nbytes`` between HBM and the compute units."""
    return check_nonnegative("nbytes", nbytes) / get_chip(chip).hbm_bandwidth


def comm_time(nbytes: float, bandwidth: float) -> float:
    """Seconds to send ``nbytes`` over a link of ``bandwidth`` bytes/s (one direction)."""
    return check_nonnegative("nbytes", nbytes) / check_positive("bandwidth (bytes/s)", bandwidth)


def time_bounds(flops: float, hbm_bytes: float, chip, comm_bytes: float = 0.0,
                comm_bandwidth: float | None = None, dtype: str = "bf16") -> Bounds:
    """Compute, memory and communication times of one operation on ``chip``.

    ``comm_bandwidth`` defaults to one ICI/NVLink link of the chip.
    """
    chip = get_chip(chip)
    bw = chip.ici_link_bandwidth if comm_bandwidth is None else comm_bandwidth
    return Bounds(compute=compute_time(flops, chip, dtype), memory=memory_time(hbm_bytes, chip),
                  comm=comm_time(comm_bytes, bw))


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved."""
    return check_nonnegative("flops", flops) / check_positive("nbytes", nbytes)


def _dims(**dims) -> list[int]:
    return [check_positive_int(k, v) for k, v in dims.items()]


def matmul_flops(B: int, D: int, F: int) -> int:
    """FLOPs of X[B, D] @ W[D, F]: 2 B D F."""
    B, D, F = _dims(B=B, D=D, F=F)
    return 2 * B * D * F


def matmul_bytes(B: int, D: int, F: int, bytes_per_element: float = 2,
                 weight_bytes_per_element: float | None = None) -> float:
    """HBM bytes of X[B, D] @ W[D, F] when each array crosses HBM exactly once.

    ``bytes_per_element`` applies to X and to the output; ``weight_bytes_per_element``
    (default: the same) to W, e.g. 1 for int8 weights with bf16 activations.
    """
    B, D, F = _dims(B=B, D=D, F=F)
    s = check_positive("bytes_per_element", bytes_per_element)
    sw = s if weight_bytes_per_element is None else check_positive(
        "weight_bytes_per_element", weight_bytes_per_element)
    return s * B * D + sw * D * F + s * B * F


def matmul_intensity(B: int, D: int, F: int, bytes_per_element: float = 2,
                     weight_bytes_per_element: float | None = None) -> float:
    """Arithmetic intensity (FLOPs/byte) of X[B, D] @ W[D, F]."""
    return matmul_flops(B, D, F) / matmul_bytes(B, D, F, bytes_per_element, weight_bytes_per_element)


def dot_flops(D: int) -> int:
    """FLOPs of a dot product of two D-vectors, counted as D multiplies and D adds."""
    return 2 * check_positive_int("D", D)


def dot_bytes(D: int, bytes_per_element: float = 2) -> float:
    """Bytes of a dot product: read two D-vectors, write one scalar."""
    return check_positive("bytes_per_element", bytes_per_element) * (2 * check_positive_int("D", D) + 1)


def batched_matmul_flops(B: int, D: int, F: int) -> int:
    """FLOPs of X[B, D] with W[B, D, F] (each token its own matrix, einsum bd,bdf->bf): 2 B D F."""
    return matmul_flops(B, D, F)


def batched_matmul_bytes(B: int, D: int, F: int, bytes_per_element: float = 2) -> float:
    """HBM bytes of X[B, D] with W[B, D, F] -> [B, F]: s (B D + B D F + B F).

    Each of the B weight matrices is read once and used by one token only.
    """
    B, D, F = _dims(B=B, D=D, F=F)
    s = check_positive("bytes_per_element", bytes_per_element)
    return s * (B * D + B * D * F + B * F)


def batched_matmul_intensity(B: int, D: int, F: int, bytes_per_element: float = 2) -> float:
    """FLOPs/byte of X[B, D] with W[B, D, F]: 2 D F / (s (D + D F + F)), the same for any B."""
    return batched_matmul_flops(B, D, F) / batched_matmul_bytes(B, D, F, bytes_per_element)


def critical_batch(D: int, F: int, chip, bytes_per_element: float = 2,
                   weight_bytes_per_element: float | None = None, dtype: str = "bf16") -> int:
    """Smallest integer B for which X[B, D] @ W[D, F] is compute-bound on ``chip``.

    Solves 2 B D F >= I (s B D + s_w D F + s B F) for B, where I is the chip's critical
    intensity for ``dtype``. Raises ValueError when no batch is large enough (the
    intensity tends to 2 D F / (s (D + F)) as B grows).
    """
    D, F = _dims(D=D, F=F)
    chip = get_chip(chip)
    s = check_positive("bytes_per_element", bytes_per_element)
    sw = s if weight_bytes_per_element is None else check_positive(
        "weight_bytes_per_element", weight_bytes_per_element)
    I = chip.critical_intensity_for(dtype)
    # FLOPs and bytes grow linearly in B: flops = a B, bytes = b B + c. The intensity rises
    # towards a / b; the FLOP count comes from matmul_flops, so the two can never disagree.
    a = matmul_flops(1, D, F)
    b, c = s * (D + F), sw * D * F
    denom = a - I * b
    if denom <= 0:
        raise ValueError(f"X[B, {D}] @ W[{D}, {F}] never becomes compute-bound on {chip.name}: "
                         f"its intensity approaches {a / b:.4g} FLOPs/byte as B grows, below the "
                         f"critical intensity {I:.4g}")
    B = max(1, math.ceil(I * c / denom))
    # Guard against rounding in the division: step to the exact smallest integer. The closed
    # form is off by at most one or two, so a long walk means the formulas disagree: stop.
    for _ in range(64):
        if B > 1 and matmul_intensity(B - 1, D, F, s, sw) >= I:
            B -= 1
        elif matmul_intensity(B, D, F, s, sw) < I:
            B += 1
        else:
            return B
    raise RuntimeError(f"critical_batch: the closed form {B} and matmul_intensity disagree "
                       f"(a bug in scalebook.roofline)")


def tiled_matmul_bytes(B: int, D: int, F: int, tile_b: int, tile_f: int,
                       bytes_per_element: float = 2) -> float:
    """HBM bytes of X[B, D] @ W[D, F] computed one output tile [tile_b, tile_f] at a time.

    Each output tile needs a [tile_b, D] strip of X and a [D, tile_f] strip of W, read
    from HBM for that tile; so X is read ceil(F / tile_f) times and W ceil(B / tile_b)
    times, and the output is written once.
    """
    B, D, F, tb, tf = _dims(B=B, D=D, F=F, tile_b=tile_b, tile_f=tile_f)
    s = check_positive("bytes_per_element", bytes_per_element)
    if tb > B or tf > F:
        raise ValueError(f"tiles must fit the matrix: tile_b={tb} <= B={B} and tile_f={tf} <= F={F}")
    return s * (B * D * math.ceil(F / tf) + D * F * math.ceil(B / tb) + B * F)


def tiled_matmul_intensity(B: int, D: int, F: int, tile_b: int, tile_f: int,
                           bytes_per_element: float = 2) -> float:
    """FLOPs per HBM byte of the tiled matmul; about 2 / (s (1/tile_b + 1/tile_f)) for large D."""
    return matmul_flops(B, D, F) / tiled_matmul_bytes(B, D, F, tile_b, tile_f, bytes_per_element)


def contraction_split_times(B: int, D: int, F: int, chip, n_chips: int = 2,
                            bytes_per_element: float = 2, dtype: str = "bf16",
                            bandwidth: float | None = None) -> Bounds:
    """X[B, D] @ W[D, F] with D split over ``n_chips`` chips in a ring, summed by all-reduce.

    Each chip multiplies its [B, D/n] and [D/n, F] blocks (2 B D F / n FLOPs), then a ring
    all-reduce of the [B, F] partial sums sends 2 (n - 1) / n * B F s bytes per chip over
    one link. (For two chips that is one exchange of the partial sum.) HBM traffic is
    ignored here: this is the network roofline. ``bandwidth`` (bytes/s, one direction)
    defaults to one ICI/NVLink link of the chip.
    """
    B, D, F, n = _dims(B=B, D=D, F=F, n_chips=n_chips)
    if n < 2:
        raise ValueError(f"n_chips must be at least 2 to split a contraction; got {n}")
    if D % n:
        raise ValueError(f"D={D} does not divide into n_chips={n} equal blocks")
    chip = get_chip(chip)
    s = check_positive("bytes_per_element", bytes_per_element)
    flops = matmul_flops(B, D, F) / n
    comm = 2 * (n - 1) / n * B * F * s
    bw = chip.ici_link_bandwidth if bandwidth is None else bandwidth
    return Bounds(compute=compute_time(flops, chip, dtype), memory=0.0, comm=comm_time(comm, bw))


def min_contraction_to_hide_comm(chip, n_chips: int = 2, bytes_per_element: float = 2,
                                 dtype: str = "bf16", bandwidth: float | None = None) -> float:
    """The D above which the all-reduce of a split contraction hides behind compute.

    From 2 B D F / (n C) >= 2 (n - 1) B F s / (n W):  D >= (n - 1) s C / W, with C the
    peak FLOP/s and W the bandwidth each chip sends with (default: one link). B and F cancel.
    """
    chip = get_chip(chip)
    n = check_positive_int("n_chips", n_chips)
    if n < 2:
        raise ValueError(f"n_chips must be at least 2; got {n}")
    s = check_positive("bytes_per_element", bytes_per_element)
    bw = chip.ici_link_bandwidth if bandwidth is None else check_positive("bandwidth (bytes/s)", bandwidth)
    return (n - 1) * s * chip.peak_flops(dtype) / bw


def attainable_flops(intensity, peak_flops: float, bandwidth: float):
    """The roof: min(peak, intensity x bandwidth), in FLOP/s (arrays welcome)."""
    import numpy as np

    return np.minimum(peak_flops, np.asarray(intensity, dtype=float) * bandwidth)
