"""Between chips: tori, slices and transfer times.

Chapter 2 of the book derives each formula here in the open; later chapters import them.
(What happens inside one chip -- systolic arrays, MXUs -- is in :mod:`scalebook.chip_internals`.)

* :func:`torus_hops`, :func:`hops_from`, :func:`diameter`, :func:`mean_hops`: hop counts
  on a 1D/2D/3D grid of chips, each axis with or without a wraparound link.
* :func:`slice_wraparound`: which axes of a TPU slice shape have wraparound links.
* :func:`transfer_time`: ``hops x latency + bytes / (links x link bandwidth)``.
* :func:`bisection_links`, :func:`bisection_bandwidth`: the links (and bytes/s, one
  direction) that cross the cut halving the longest axis.
* :func:`slice_info`: chips, hosts, wraparound, diameter and bisection of one slice.
* :func:`bandwidth_hierarchy`: a chip's HBM, chip-to-chip, PCIe and DCN bandwidths.
* :func:`fat_tree_endpoints`, :func:`scalable_unit`: the GPUs a non-blocking fat tree of
  switches with a given port count joins, and one rail-optimised scalable unit (chapter 11).

Units: bytes, seconds, bytes/s (one direction).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .hardware import Chip, get_chip
from .units import check_nonnegative, check_positive, check_positive_int

__all__ = [
    "parse_shape", "torus_hops", "hops_from", "diameter",
    "mean_hops", "slice_wraparound", "transfer_time", "bisection_links", "bisection_bandwidth",
    "SliceInfo", "slice_info", "bandwidth_hierarchy", "fat_tree_endpoints",
    "ScalableUnit", "scalable_unit",
]


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
    if c.max_slice_chips is not None and n_chips > c.max_slice_chips:
        raise ValueError(f"a {'x'.join(map(str, shape))} slice has {n_chips} chips, more than the "
                         f"largest {c.name} slice ({c.max_slice_chips} of a "
                         f"{c.ici_domain_chips}-chip pod); more chips are several slices "
                         f"joined by the DCN (multislice)")
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
    """A chip's bandwidths from fastest to slowest, bytes/s per chip; ``None`` where no
    figure is published.

    Rows: HBM (the vendor's figure, reads and writes together, not one direction);
    chip-to-chip over all links (ICI or NVLink) and over one link, one direction; PCIe to
    the host; DCN (data-centre network; on a GPU its own network card). On a torus each
    link goes to one neighbour; on a GPU node every NVLink goes to an NVSwitch, so any one
    peer GPU is reached at the full all-links rate, and all peers at once share it.
    """
    c = get_chip(chip)
    switched = c.vendor == "NVIDIA"
    link = "NVLink" if switched else "ICI"
    if switched:
        all_links = f"chip -> switch, {c.ici_links} links: any GPU of the node"
        one_link = f"one of the {c.ici_links} (each to a switch chip)"
    else:
        all_links = f"chip -> neighbours, {c.ici_links} links"
        one_link = "chip -> one neighbour"
    return [
        {"level": "HBM", "bandwidth": c.hbm_bandwidth,
         "what": "chip <-> its own HBM, reads + writes"},
        {"level": f"{link}, all links", "bandwidth": c.ici_bandwidth, "what": all_links},
        {"level": f"{link}, one link", "bandwidth": c.ici_link_bandwidth, "what": one_link},
        {"level": "PCIe", "bandwidth": c.pcie_bandwidth, "what": "chip <-> host CPU memory"},
        {"level": "DCN", "bandwidth": c.dcn_bandwidth,
         "what": "chip's share of the network to other hosts" if not switched
         else "the GPU's own network card, to other nodes"},
    ]


# ---- GPU clusters: fat trees and rails (chapter 11) ---------------------------------------

def fat_tree_endpoints(radix: int, tiers: int) -> int:
    """Endpoints (NICs) a non-blocking fat tree of ``radix``-port switches joins with
    ``tiers`` levels of switches: each switch below the top gives half its ports to the
    level below and half to the level above, so 2 tiers join radix^2 / 2 and 3 tiers
    radix^3 / 4 (radix^tiers / 2^(tiers - 1)); one tier is one switch, radix endpoints."""
    k = check_positive_int("radix (ports per switch)", radix)
    t = check_positive_int("tiers", tiers)
    if k % 2:
        raise ValueError(f"radix={k}: a fat tree splits each switch's ports in halves; give "
                         f"an even port count")
    return k ** t // 2 ** (t - 1)


@dataclass(frozen=True)
class ScalableUnit:
    """One rail-optimised scalable unit: ``nodes`` nodes of ``gpus_per_node`` GPUs, one NIC
    per GPU; ``leaf_switches`` = one per rail (GPU rank i of every node on leaf i), each
    with ``nodes`` ports down and as many up to the spine (non-blocking)."""

    nodes: int
    gpus_per_node: int
    leaf_switches: int
    ports_up: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def scalable_unit(radix: int = 64, gpus_per_node: int = 8) -> ScalableUnit:
    """The largest rail-optimised unit of ``radix``-port leaf switches: each rail's leaf
    gives half its ports to the nodes (one GPU of each) and half to the spine, so a unit has
    radix / 2 nodes. NVIDIA's DGX H100 SuperPOD unit: 64-port switches, 32 nodes, 256 GPUs,
    8 leaf switches."""
    k = check_positive_int("radix (ports per switch)", radix)
    g = check_positive_int("gpus_per_node", gpus_per_node)
    if k % 2:
        raise ValueError(f"radix={k}: give an even port count")
    return ScalableUnit(nodes=k // 2, gpus_per_node=g, leaf_switches=g, ports_up=k // 2)
