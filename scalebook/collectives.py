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

In-switch reduction (chapter 11): an NVSwitch of the Hopper generation or later can add the
GPUs' arrays itself (NVLink SHARP, "NVLS"). ``collective_time("all-reduce", ...,
sharp=True)`` on a switch: each GPU sends (n - 1)/n of its array into the switch to be
reduced, then its own reduced 1/n once, to be multicast: B bytes out and B in, T = B / W,
where the ring's 2 (n - 1)/n B / W was (1.75x as long for n = 8).

Across nodes (chapter 11): :func:`hierarchical_time` is the one model of a collective over
a group that spans several GPU nodes, ``local`` GPUs in each of ``nodes`` nodes: the part
inside each node over NVLink, the part between nodes on each GPU's own network card (a
rail-optimised fat tree, modelled as a switch: every NIC reaches every other at its full
``dcn_bandwidth``). :func:`hierarchical_phases` lists the phases. The training and serving
planners time every collective that leaves a node with it, but an MoE layer's dispatch
and combine: :func:`expert_all_to_all` times those, with or without node-limited routing.

Latency (chapters 3 and 7): every step of a ring algorithm waits for a message to cross one hop,
``t_hop`` seconds, however small the message. :func:`collective_time` adds
``steps x hop_latency`` when given ``hop_latency=`` (default 0, the pure bandwidth model of
chapter 3), and :func:`latency_bound_bytes` gives the buffer size below which that latency
term is the larger one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .hardware import get_chip
from .units import check_nonnegative, check_positive, check_positive_int

__all__ = ["KINDS", "TOPOLOGIES", "ASSUMED_HOP_LATENCY", "ring_bytes", "collective_time",
           "links_per_device",
           "latency_steps", "latency_bound_bytes", "is_switched", "Phase",
           "hierarchical_phases", "hierarchical_time", "ExpertAllToAll",
           "expert_all_to_all"]

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
                    topology: str | None = None, hop_latency: float = 0.0,
                    sharp: bool = False) -> float:
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

    ``sharp=True`` (an all-reduce through a switch only): the switch reduces (NVLink SHARP),
    T = nbytes / W, and two hops of latency (into the switch and back out).
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
                d = c.ici_domain_chips
                split = (f"{d}, {n // d}" if n % d == 0 else "local, nodes")
                raise ValueError(
                    f"{n} {c.name} GPUs span more than one NVLink domain of {d}; time a "
                    f"group across nodes hierarchically (NVLink in each node, each GPU's "
                    f"network card between nodes, dcn_bandwidth {c.dcn_bandwidth:.3g} "
                    f"bytes/s): hierarchical_time({kind!r}, nbytes, {split}, "
                    f"{c.name!r})")
            bandwidth = c.ici_bandwidth
        else:
            bandwidth = c.ici_link_bandwidth
    W = check_positive("bandwidth (bytes/s)", bandwidth)
    nbytes = check_nonnegative("nbytes", nbytes)
    t_hop = check_nonnegative("hop_latency (seconds per hop)", hop_latency)
    if not isinstance(sharp, bool):
        raise ValueError(f"sharp must be True or False; got {sharp!r}")
    if sharp and (kind != "all-reduce" or topology != "switch"):
        raise ValueError(f"sharp=True models an all-reduce reduced inside a switch (NVLink "
                         f"SHARP); got kind={kind!r} on a {topology}: an all-gather or "
                         f"reduce-scatter sends the same bytes either way")
    if n == 1:
        return 0.0
    if sharp:
        return nbytes / W + 2 * t_hop
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



# ------------------------------------------------------------------------------------------
# across nodes: the hierarchical collective (chapter 11)
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    """One phase of a hierarchical collective: ``kind`` over ``group`` devices on
    ``network`` ("nvlink" inside a node, "nic" between nodes), each device sending
    ``sent`` bytes, taking ``seconds`` (bandwidth only)."""

    network: str
    kind: str
    group: int
    sent: float
    seconds: float


def _bandwidths(chip, fast_bandwidth, slow_bandwidth, local):
    c = get_chip(chip) if chip is not None else None
    if fast_bandwidth is None:
        if c is None:
            raise ValueError("give a chip (e.g. 'gpu-h100') or fast_bandwidth= and "
                             "slow_bandwidth= in bytes/s")
        fast_bandwidth = c.ici_bandwidth
    if slow_bandwidth is None:
        if c is None or c.dcn_bandwidth is None:
            name = c.name if c is not None else "this chip"
            raise ValueError(f"{name} has no dcn_bandwidth: give slow_bandwidth= (each "
                             f"GPU's network card, bytes/s) or a chip with one")
        slow_bandwidth = c.dcn_bandwidth
    if c is not None and c.ici_domain_chips is not None and local > c.ici_domain_chips:
        raise ValueError(f"local={local} GPUs per node is more than the {c.ici_domain_chips} "
                         f"of one {c.name} NVLink domain")
    return (check_positive("fast_bandwidth (bytes/s)", fast_bandwidth),
            check_positive("slow_bandwidth (bytes/s)", slow_bandwidth))


def hierarchical_phases(kind: str, nbytes: float, local: int, nodes: int, chip=None, *,
                        fast_bandwidth: float | None = None,
                        slow_bandwidth: float | None = None) -> list[Phase]:
    """The phases of one collective over ``local`` x ``nodes`` GPUs: ``local`` in each of
    ``nodes`` nodes, ``nbytes`` per GPU as in :func:`ring_bytes`.

    Inside a node the NVSwitch gives each GPU ``fast_bandwidth`` (default: all its NVLinks,
    ``chip.ici_bandwidth``); between nodes each GPU sends on its own NIC at
    ``slow_bandwidth`` (default ``chip.dcn_bandwidth``) through a non-blocking fat tree.

    * all-reduce: reduce-scatter in the node (nbytes over ``local``), all-reduce between
      nodes of the 1/local each GPU now holds (each GPU with the GPUs of the same rank in the
      other nodes), all-gather in the node;
    * reduce-scatter: in the node, then between nodes on nbytes / local;
    * all-gather: between nodes on nbytes / local, then in the node;
    * all-to-all: no levels: each GPU sends (local - 1)/n of its nbytes to the other GPUs
      of its node over NVLink and (n - local)/n to the other nodes on its NIC.

    A collective-permute is point to point, not hierarchical: time it with
    :func:`collective_time` on the network its pair uses."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if kind == "collective-permute":
        raise ValueError("a collective-permute sends to one peer; it has no levels: time it "
                         "with collective_time on the network between the pair")
    B = check_nonnegative("nbytes", nbytes)
    g = check_positive_int("local (GPUs of the group in each node)", local)
    m = check_positive_int("nodes (nodes the group spans)", nodes)
    fast, slow = _bandwidths(chip, fast_bandwidth, slow_bandwidth, g)

    def phase(network, k, size, b):
        W = fast if network == "nvlink" else slow
        sent = ring_bytes(k, b, size)
        return Phase(network, k, size, sent, sent / W)

    n = g * m
    if kind == "all-to-all":
        return [Phase("nvlink", kind, g, B * (g - 1) / n, B * (g - 1) / n / fast),
                Phase("nic", kind, m, B * (n - g) / n, B * (n - g) / n / slow)]
    if kind == "all-reduce":
        return [phase("nvlink", "reduce-scatter", g, B), phase("nic", "all-reduce", m, B / g),
                phase("nvlink", "all-gather", g, B)]
    if kind == "reduce-scatter":
        return [phase("nvlink", kind, g, B), phase("nic", kind, m, B / g)]
    return [phase("nic", kind, m, B / g), phase("nvlink", kind, g, B)]


def hierarchical_time(kind: str, nbytes: float, local: int, nodes: int, chip=None, *,
                      fast_bandwidth: float | None = None, slow_bandwidth: float | None = None,
                      pipelined: bool = False, hop_latency: float = 0.0) -> float:
    """Seconds for one collective over ``local`` GPUs in each of ``nodes`` nodes (see
    :func:`hierarchical_phases` for the phases and the bandwidths).

    ``pipelined=False``: the phases run one after the other, T = sum of their times.
    ``pipelined=True``: the array is cut into chunks that stream through the phases, so
    NVLink and the NICs work at once and the busier network sets the pace: T = max(sum of
    the NVLink phases, sum of the NIC phases). ``hop_latency`` adds the steps of each
    phase (:func:`latency_steps`) times ``t_hop``: 2 (local - 1) + 2 (nodes - 1) for an
    all-reduce, (local - 1) + (nodes - 1) for a gather or scatter, one per part for an
    all-to-all.

    By hand, an all-reduce of B bytes per GPU, W_f and W_s the two bandwidths::

        T = (l-1)/l B/W_f  +  2(m-1)/m (B/l)/W_s  +  (l-1)/l B/W_f

    so the NICs carry 1/l of what a flat ring over all l m GPUs would send on them."""
    phases = hierarchical_phases(kind, nbytes, local, nodes, chip,
                                 fast_bandwidth=fast_bandwidth, slow_bandwidth=slow_bandwidth)
    if not isinstance(pipelined, bool):
        raise ValueError(f"pipelined must be True or False; got {pipelined!r}")
    t_hop = check_nonnegative("hop_latency (seconds per hop)", hop_latency)
    if pipelined:
        t = max(sum(p.seconds for p in phases if p.network == net) for net in ("nvlink", "nic"))
    else:
        t = sum(p.seconds for p in phases)
    if t_hop:
        if kind == "all-to-all":
            steps = sum(1 for p in phases if p.sent > 0)
        else:
            steps = sum(latency_steps(p.kind, p.group, "switch") for p in phases)
        t += steps * t_hop
    return t


# ------------------------------------------------------------------------------------------
# an MoE layer's dispatch or combine across GPU nodes (chapters 6, 8 and 12)
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExpertAllToAll:
    """One dispatch (or combine) of an MoE layer over an expert group that spans GPU nodes,
    split by network: ``nvlink`` the seconds of its part inside the nodes, ``nic`` those on
    each GPU's network card. ``overlapped``: the two parts stream at once (node-limited
    forwarding), else they run one after the other. ``seconds`` = max or sum of the two,
    plus ``latency``."""

    nvlink: float
    nic: float
    overlapped: bool
    latency: float = 0.0

    @property
    def seconds(self) -> float:
        both = max(self.nvlink, self.nic) if self.overlapped else self.nvlink + self.nic
        return both + self.latency

    def parts(self) -> dict:
        """{"nvlink": seconds, "nic": seconds} (bandwidth only)."""
        return {"nvlink": self.nvlink, "nic": self.nic}


def expert_all_to_all(nbytes: float, top_k: int, local: int, n: int, chip=None, *,
                      fast_bandwidth: float | None = None,
                      slow_bandwidth: float | None = None, max_nodes: int | None = None,
                      hop_latency: float = 0.0) -> ExpertAllToAll:
    """An MoE dispatch or combine over ``n`` GPUs, ``local`` of them in each node (n / local
    nodes; the last may be filled in part), each GPU holding ``nbytes`` of routed copies
    (``top_k`` copies of each of its tokens). Bandwidths as :func:`hierarchical_phases`.

    * ``max_nodes=None``, every copy on its own (chapter 11's all-to-all, and DeepEP's
      low-latency decode kernels, which send each copy straight to its GPU): (local - 1) / n
      of the bytes over NVLink, (n - local) / n on the NIC, one after the other.
    * ``max_nodes=M``, node-limited routing (DeepSeek-V3, arXiv:2412.19437 section 3.2.2,
      and DeepEP's normal kernels for training and prefill): a token's experts lie on at
      most M nodes. It crosses the network once per node it reaches, min(k, M, n / local)
      of them (DeepSeek's gate picks the M nodes by their best experts' scores, so a token
      reaches nearly all of them), less its own node, a share 1 / (n / local) of them: that
      many of its k copies' bytes on the NIC. On arrival (or at home) NVLink forwards each
      copy to its expert's GPU: (local - 1) / local of all the bytes. The report overlaps
      the two fully, so the parts run at once.

    ``hop_latency``: one hop for each part (the NIC's, then NVLink's)."""
    B = check_nonnegative("nbytes", nbytes)
    k = check_positive_int("top_k", top_k)
    g = check_positive_int("local (GPUs of the group in each node)", local)
    n = check_positive_int("n (GPUs of the expert group)", n)
    if g > n:
        raise ValueError(f"local={g} GPUs per node is more than the group of n={n}")
    fast, slow = _bandwidths(chip, fast_bandwidth, slow_bandwidth, g)
    t_hop = check_nonnegative("hop_latency (seconds per hop)", hop_latency)
    nodes = n / g
    hops = t_hop * ((g > 1) + (n > g))
    if max_nodes is None:
        return ExpertAllToAll(B * (g - 1) / n / fast, B * (n - g) / n / slow, False, hops)
    M = check_positive_int("max_nodes", max_nodes)
    crossings = min(k, M, nodes) * (nodes - 1) / nodes
    return ExpertAllToAll(B * (g - 1) / g / fast, B / k * crossings / slow, True, hops)
