"""Collective cost formulas: bytes each device sends, and seconds on real links.

Chapter 3 derives these; :mod:`scalebook.hlo` reads the collectives of a compiled program
and uses :func:`ring_bytes` for their per-device bytes.

Byte model (per participating device, ring algorithms; ``n`` = devices in the group):

============================ ===============================================
all-gather                   (n - 1) / n x output bytes (the gathered array)
reduce-scatter               (n - 1) / n x input bytes (the unreduced array)
all-reduce                   2 (n - 1) / n x array bytes
all-to-all                   (n - 1) / n x input bytes (the chunks that leave)
collective-permute           input bytes, for a device that really sends
============================ ===============================================

Sizes are in bytes, bandwidths in bytes/s (one direction of one link), times in seconds.

Networks (``topology=``): ``"torus"`` (a TPU ICI axis, a bidirectional ring with
wraparound: half the data goes each way), ``"ring"`` (one direction only), and ``"switch"``
(the GPUs of one NVLink domain, e.g. an 8-GPU node: every GPU reaches every other through
NVSwitch, so a ring algorithm's bytes leave each GPU through *all* its NVLinks at once,
T = ring bytes / (links x link bandwidth)). Given a GPU chip, :func:`collective_time` uses the
switch and refuses a group larger than the NVLink domain (the scale-out network is slower:
time that part with ``bandwidth=chip.dcn_bandwidth``). An axis of two chips has one link
between them, so a "torus" of 2 does not halve the time: it equals the ring of 2.

Latency (chapters 3 and 7): every step of a ring algorithm waits for a message to cross one hop,
``t_hop`` seconds, however small the message. :func:`collective_time` adds
``steps x hop_latency`` when given ``hop_latency=`` (default 0, the pure bandwidth model of
chapter 3), and :func:`latency_bound_bytes` gives the buffer size below which that latency
term is the larger one.
"""

from __future__ import annotations

import math

from .hardware import get_chip
from .units import check_nonnegative, check_positive, check_positive_int

__all__ = ["KINDS", "TOPOLOGIES", "ASSUMED_HOP_LATENCY", "ring_bytes", "collective_time",
           "links_per_device",
           "latency_steps", "latency_bound_bytes", "is_switched"]

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
TOPOLOGIES = ("ring", "torus", "switch")

#: The book's assumed latency of one chip-to-chip hop, ``t_hop``, in seconds: an order of
#: magnitude (1 µs), not a vendor figure. The chip table has no per-hop latency and no
#: vendor page in the book's sources states one, so chapters 2, 3 and 7 use this
#: assumption and say so. Not a default: ``collective_time`` still defaults to
#: ``hop_latency=0``.
ASSUMED_HOP_LATENCY = 1e-6


def is_switched(chip) -> bool:
    """True for a chip whose fast network is a switch (NVSwitch GPUs), not a torus."""
    return "nvswitch" in get_chip(chip).topology.lower()


def _topology(topology, chip, bandwidth):
    """The topology to use: the given one, checked, or the chip's own (switch or torus)."""
    if topology is not None and topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}; got {topology!r}")
    switched = chip is not None and bandwidth is None and is_switched(chip)
    if topology is None:
        return "switch" if switched else "torus"
    if switched and topology != "switch":
        raise ValueError(f"{get_chip(chip).name}: its GPUs talk through NVSwitch, not a "
                         f"{topology}; use topology='switch' (the default for this chip), or "
                         "give bandwidth= to time another network")
    return topology


def ring_bytes(kind: str, nbytes: float, n: int) -> float:
    """Bytes each of ``n`` devices sends in one collective, ring algorithms.

    ``nbytes`` is, per device: the gathered output (all-gather), the unreduced input
    (reduce-scatter), the array (all-reduce), the input (all-to-all), or the block sent
    (collective-permute). See the table in the module docstring.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    nbytes = check_nonnegative("nbytes", nbytes)
    n = check_positive_int("n (devices in the group)", n)
    if kind == "collective-permute":
        return nbytes
    frac = (n - 1) / n
    return 2 * frac * nbytes if kind == "all-reduce" else frac * nbytes



def _ring_all_to_all_link_load(nbytes: float, n: int, torus: bool) -> float:
    """Bytes that cross the busiest directed link in an all-to-all of ``nbytes`` per device.

    Each device sends a block of nbytes / n to every other device, forwarded hop by hop. On
    a unidirectional ring the block for the device d steps away crosses d links; on a
    bidirectional ring it takes the shorter way, min(d, n - d) links, and a tie is split
    evenly between the two directions.
    """
    block = nbytes / n
    if torus:
        hops = sum(min(d, n - d) for d in range(1, n))
        return block * hops / 2      # two outgoing links per device share the load
    return block * n * (n - 1) / 2


def links_per_device(topology: str, axis_size: int | None = None) -> int:
    """Links one device sends on along one axis at once: 2 on a torus axis (one each way
    round), 1 on a ring, a line or a switch, and 1 on an axis of 2 chips, whatever the
    topology (its two "directions" are the same single link). ``axis_size=None``: a large
    axis. The one rule behind :func:`collective_time`'s bandwidth and the critical batches
    of :mod:`scalebook.parallelism`."""
    if axis_size is not None and axis_size <= 2:
        return 1
    return 2 if topology == "torus" else 1


def collective_time(kind: str, nbytes: float, axes, chip=None, *, bandwidth: float | None = None,
                    topology: str | None = None, hop_latency: float = 0.0) -> float:
    """Seconds for one collective over mesh ``axes`` with ring algorithms.

    ``nbytes`` is the per-device array defined in :func:`ring_bytes`. ``axes`` is the group
    size ``n`` or a tuple of axis sizes (a collective over several torus axes at once).
    The link bandwidth is ``bandwidth`` (bytes/s, one direction) or the chip's
    ``ici_link_bandwidth``.

    ``topology="ring"``: one unidirectional ring per axis, so T = ring_bytes / W.
    ``topology="torus"`` (the default for a TPU): a bidirectional ring with wraparound per
    axis; half the data goes each way, so T = ring_bytes / (2 W); an axis of 2 chips has one
    link, so no halving there. With k axes of size > 1 the ring traffic spreads over k times
    as many links (the usual first-order model): T is divided by k.
    ``topology="switch"`` (the default, and the only choice, for an NVSwitch GPU without
    ``bandwidth=``): W is the GPU's total NVLink bandwidth (``ici_bandwidth``, all links),
    T = ring_bytes / W for every kind, the all-to-all included (its blocks go straight to
    their GPU); the group must fit in one NVLink domain (``ici_domain_chips``).

    Exceptions on a ring or torus: a collective-permute sends its block to one neighbour
    over one link, T = nbytes / W. An all-to-all forwards blocks over several hops; T is the
    load of the busiest link (see ``_ring_all_to_all_link_load``) divided by W (one axis).

    ``hop_latency`` (seconds per hop, ``t_hop``; default 0) adds
    ``latency_steps(kind, axes, topology) x hop_latency``: the steps of the algorithm, each
    of which waits one hop whatever the message size. With the default every result is the
    bandwidth-only time above.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    topology = _topology(topology, chip, bandwidth)
    sizes = _axis_sizes(axes)
    n = math.prod(sizes)
    if bandwidth is None:
        if chip is None:
            raise ValueError("give a chip (e.g. 'tpu-v5p') or bandwidth= in bytes/s")
        c = get_chip(chip)
        if topology == "switch":
            if c.ici_domain_chips is not None and n > c.ici_domain_chips:
                raise ValueError(
                    f"{n} {c.name} GPUs span more than one NVLink domain of "
                    f"{c.ici_domain_chips}; the part between nodes runs on the scale-out "
                    f"network: time it with bandwidth=get_chip({c.name!r}).dcn_bandwidth "
                    f"({c.dcn_bandwidth:.3g} bytes/s) and topology='ring'")
            bandwidth = c.ici_bandwidth
        else:
            bandwidth = c.ici_link_bandwidth
    W = check_positive("bandwidth (bytes/s)", bandwidth)
    nbytes = check_nonnegative("nbytes", nbytes)
    t_hop = check_nonnegative("hop_latency (seconds per hop)", hop_latency)
    if n == 1:
        return 0.0
    latency = latency_steps(kind, sizes, topology) * t_hop if t_hop else 0.0
    if topology == "switch":
        return ring_bytes(kind, nbytes, n) / W + latency
    if kind == "collective-permute":
        return nbytes / W + latency
    if kind == "all-to-all":
        if len([s for s in sizes if s > 1]) > 1:
            raise ValueError("collective_time models an all-to-all over one axis only")
        torus = topology == "torus" and n > 2
        return _ring_all_to_all_link_load(nbytes, n, torus) / W + latency
    # Links each device sends on: two per torus axis (one each way), one on a ring or on
    # an axis of two chips (both "directions" are the same single link).
    links = sum(links_per_device(topology, s) for s in sizes if s > 1)
    return ring_bytes(kind, nbytes, n) / (W * links) + latency


def _axis_sizes(axes) -> list[int]:
    if isinstance(axes, (tuple, list)):
        sizes = [check_positive_int("axes", a) for a in axes]
        if not sizes:
            raise ValueError("axes must name at least one axis size")
        return sizes
    return [check_positive_int("axes (devices in the group)", axes)]


def latency_steps(kind: str, axes, topology: str = "torus") -> int:
    """Hops a collective waits for one after another (the latency part of its time).

    A ring all-gather or reduce-scatter over an axis of n devices takes n - 1 steps of one
    hop each (both directions of a bidirectional ring run at once, so a torus takes the
    same n - 1); an all-reduce is a reduce-scatter then an all-gather, 2 (n - 1). Over
    several axes the collective runs axis after axis, so the steps add up:
    sum over axes of (n_i - 1), doubled for an all-reduce. A collective-permute is one hop.
    An all-to-all's farthest block travels n - 1 hops on a one-way ring, n // 2 on a torus
    axis (one axis only). Through a switch ("switch") the ring algorithms take the same
    steps, and an all-to-all's blocks go straight to their GPU in one step.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if topology not in TOPOLOGIES:
        raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}; got {topology!r}")
    sizes = [s for s in _axis_sizes(axes) if s > 1]
    if not sizes:
        return 0
    if kind == "collective-permute" or (kind == "all-to-all" and topology == "switch"):
        return 1
    if kind == "all-to-all":
        if len(sizes) > 1:
            raise ValueError("latency_steps models an all-to-all over one axis only")
        return sizes[0] // 2 if topology == "torus" else sizes[0] - 1
    steps = sum(s - 1 for s in sizes)
    return 2 * steps if kind == "all-reduce" else steps


def latency_bound_bytes(kind: str, axes, chip=None, *, hop_latency: float,
                        bandwidth: float | None = None, topology: str | None = None) -> float:
    """The per-device buffer size (bytes, as in :func:`ring_bytes`) at which the latency
    term of :func:`collective_time` equals its bandwidth term; smaller buffers are
    latency-bound.

    Both terms of ``collective_time`` are known: the bandwidth term grows linearly with the
    buffer, the latency term ``latency_steps x hop_latency`` does not depend on it, so the
    crossover is latency / (bandwidth time per byte). For an all-gather over one torus axis
    of n devices it is (n - 1) t_hop / ((n - 1) / (2 n W)) = 2 n W t_hop.
    """
    t_hop = check_positive("hop_latency (seconds per hop)", hop_latency)
    sizes = _axis_sizes(axes)
    if math.prod(sizes) == 1:
        raise ValueError("a collective over one device moves nothing and waits for nothing; "
                         "give axes with more than one device")
    topology = _topology(topology, chip, bandwidth)
    per_byte = collective_time(kind, 1.0, sizes, chip, bandwidth=bandwidth, topology=topology)
    return latency_steps(kind, sizes, topology) * t_hop / per_byte

