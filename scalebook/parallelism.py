"""Parallelism for training (chapter 5): what each scheme costs per chip.

For a stack of MLP blocks ``In[B, D] @ W_in[D, F] -> H[B, F]``, ``H @ W_out[F, D]`` (and, in
the chapter, the small LLaMA of chapter 4), each scheme splits the batch, the weights or
both over a mesh and pays for it in collectives. Chapter 5 derives every formula below; here
each is one small function. Symbols as in the book's notation page:

    B   global batch in tokens          b = B / n   tokens per chip
    D   model width                     F   MLP hidden width
    s   bytes per element (bf16: 2)     C   peak FLOP/s of a chip
    W   one link's bandwidth, one direction (W_ici; W_dcn across slices)
    n_dp, n_fsdp, n_tp, n_pp, n_ep      parallel degrees;  N_mb  microbatches

Communication times use :func:`scalebook.collectives.collective_time` (ring algorithms; a TPU
torus axis sends both ways). "Compute-bound" means the collective takes no longer than the
matmuls it can overlap with, at peak FLOP/s. FLOPs are 2 per multiply-add; a matmul's
backward costs twice its forward (dX and dW).

Networks (:func:`network`): on a TPU the ICI of one mesh axis is a bidirectional torus ring
of links of ``ici_link_bandwidth``; on a GPU inside a node the NVSwitch lets a ring
algorithm use all of a GPU's NVLink bandwidth (``ici_bandwidth``) in one direction; across
nodes or slices the data-centre network gives each chip ``dcn_bandwidth``, modelled as one
ring. Every function that takes a chip accepts a name or a :class:`~scalebook.hardware.Chip`,
including ``get_chip("tpu-v5p").with_(ici_link_bandwidth=...)``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from . import collectives as _coll
from . import roofline as _rl
from .hardware import Chip, get_chip
from .units import check_nonnegative, check_positive, check_positive_int

__all__ = [
    "NETWORKS", "TP_PASSES", "COMBINES", "SCHEMES", "ZERO_STAGES", "SCHEDULES", "REMAT_POLICIES",
    "Network", "network", "LayerTimes", "ChipMemory", "Schedule", "Capacity", "TwoDPlan",
    "dp_layer_times", "fsdp_layer_times", "data_parallel_critical_batch",
    "training_memory_per_chip", "largest_model_per_chip",
    "tp_mlp_layer_times", "tp_attention_check", "max_tp_degree", "max_tp_degree_layer",
    "fsdp_tp_layer_times", "optimal_fsdp_degree", "fsdp_tp_critical_batch", "best_2d_split",
    "check_pipeline", "bubble_fraction", "dualpipe_bubble", "one_f_one_b_bubble",
    "pipeline_schedule", "simulate_schedule",
    "pipeline_activation_microbatches",
    "moe_capacity", "tokens_dropped", "moe_critical_batch", "moe_all_to_all_bytes",
    "moe_layer_times", "route_top_k", "balance_router_bias",
    "ring_attention_min_block", "ring_attention_step_times",
    "mlp_saved_elements", "accumulation_activation_bytes", "offload_time",
    "dcn_critical_batch_per_slice", "check_divides", "hierarchical_dp_critical_batch",
    "ep_critical_width",
]

NETWORKS = ("ici", "dcn")
TP_PASSES = ("forward", "backward", "worse")
COMBINES = ("max", "sum")
SCHEMES = ("dp", "fsdp")
ZERO_STAGES = (0, 1, 2, 3)
SCHEDULES = ("gpipe", "1f1b")
REMAT_POLICIES = ("nothing", "dots", "everything")


# ------------------------------------------------------------------------------------------
# small validators
# ------------------------------------------------------------------------------------------

def _int(name, value, minimum=1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def _axes(name, axes) -> tuple:
    """A degree given as one int or a tuple of mesh-axis sizes -> tuple of ints >= 1."""
    if isinstance(axes, (tuple, list)):
        if not axes:
            raise ValueError(f"{name} must name at least one axis size")
        return tuple(_int(f"{name} (each axis size)", a) for a in axes)
    return (_int(name, axes),)


def _choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
    return value


def _chip(chip) -> Chip:
    if chip is None:
        raise ValueError("give a chip: a name such as 'tpu-v5p' or a Chip object")
    return get_chip(chip)


def check_divides(name: str, size, n, what: str = "devices") -> int:
    """Raise a ValueError unless the dimension ``size`` splits evenly into ``n`` parts."""
    size = _int(name, size)
    n = _int(f"the number of {what}", n)
    if size % n:
        raise ValueError(f"{name}={size} does not divide over {n} {what}; choose a size that "
                         f"is a multiple of {n} or a degree that divides {size}")
    return size // n


# ------------------------------------------------------------------------------------------
# networks
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Network:
    """How a collective over one mesh axis is timed: link ``bandwidth`` (bytes/s, one
    direction) and ``topology`` ("torus": bidirectional ring, "ring": one direction,
    "switch": a GPU node's NVSwitch, ``bandwidth`` being all of a GPU's NVLinks)."""

    name: str
    bandwidth: float
    topology: str


def network(chip, kind: str = "ici") -> Network:
    """The network a collective uses on ``chip``: ``"ici"`` (TPU ICI torus axis; GPU NVLink
    inside a node) or ``"dcn"`` (between TPU slices or GPU nodes). See the module docstring."""
    c = _chip(chip)
    _choice("network kind", kind, NETWORKS)
    if kind == "dcn":
        if c.dcn_bandwidth is None:
            raise ValueError(f"{c.name} has no dcn_bandwidth in scalebook.hardware; make a chip "
                             f"with one: get_chip({c.name!r}).with_(dcn_bandwidth=...)")
        return Network("dcn", c.dcn_bandwidth, "ring")
    if c.vendor == "NVIDIA":
        return Network("nvlink", c.ici_bandwidth, "switch")
    return Network("ici", c.ici_link_bandwidth, "torus")


def _ctime(kind, nbytes, axes, net: Network) -> float:
    return _coll.collective_time(kind, nbytes, axes, bandwidth=net.bandwidth, topology=net.topology)


# ------------------------------------------------------------------------------------------
# results
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LayerTimes:
    """Compute and communication seconds of one layer on one chip, forward and backward.

    ``comm_*`` is the time of the collectives that can overlap with that pass's matmuls.
    """

    scheme: str
    compute_forward: float
    comm_forward: float
    compute_backward: float
    comm_backward: float

    @property
    def compute(self) -> float:
        return self.compute_forward + self.compute_backward

    @property
    def comm(self) -> float:
        return self.comm_forward + self.comm_backward

    @property
    def lower(self) -> float:
        """Perfect overlap within each pass: max(compute, comm) of forward plus of backward."""
        return max(self.compute_forward, self.comm_forward) + max(self.compute_backward,
                                                                  self.comm_backward)

    @property
    def compute_bound(self) -> bool:
        """True when neither pass waits for its collectives."""
        return self.comm_forward <= self.compute_forward and self.comm_backward <= self.compute_backward

    @property
    def ratio(self) -> float:
        """The worse of comm/compute over the two passes (<= 1: compute-bound)."""
        return max(self.comm_forward / self.compute_forward, self.comm_backward / self.compute_backward)


@dataclass(frozen=True)
class ChipMemory:
    """Bytes of training state held by one chip."""

    weights: float
    gradients: float
    master_weights: float
    optimizer: float
    activations: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.master_weights + self.optimizer + self.activations

    def as_dict(self) -> dict:
        return {"weights": self.weights, "gradients": self.gradients,
                "master_weights": self.master_weights, "optimizer": self.optimizer,
                "activations": self.activations}


@dataclass(frozen=True)
class Schedule:
    """A pipeline schedule: ``grid[stage][step]`` is ``("F", mb)``, ``("B", mb)`` or None.

    Every forward or backward of one microbatch on one stage takes one step (the chapter
    assumes a backward as long as a forward, which keeps the picture simple; the bubble
    fraction does not depend on it)."""

    kind: str
    n_stages: int
    n_microbatches: int
    grid: tuple

    @property
    def steps(self) -> int:
        return len(self.grid[0])

    @property
    def busy(self) -> int:
        return sum(cell is not None for row in self.grid for cell in row)

    @property
    def bubble_fraction(self) -> float:
        """Idle (stage, step) slots over all slots, measured on the grid."""
        total = self.n_stages * self.steps
        return (total - self.busy) / total

    def in_flight(self, stage: int) -> int:
        """Most microbatches whose forward has run on ``stage`` but not yet their backward:
        how many sets of activations the stage holds at once."""
        live, peak = 0, 0
        for cell in self.grid[stage]:
            if cell is None:
                continue
            live += 1 if cell[0] == "F" else -1
            peak = max(peak, live)
        return peak

    def text(self) -> str:
        """One line per stage: F3 = forward of microbatch 3, b3 = its backward, . = idle."""
        def fmt(cell):
            return " ." if cell is None else ("F" if cell[0] == "F" else "b") + str(cell[1])
        width = max(len(fmt(c)) for row in self.grid for c in row)
        return "\n".join(f"stage {i}: " + " ".join(fmt(c).rjust(width) for c in row)
                         for i, row in enumerate(self.grid))


@dataclass(frozen=True)
class Capacity:
    """Expert capacity of a top-k MoE layer: slots per expert and the slots in all."""

    tokens: int
    n_experts: int
    k: int
    capacity_factor: float
    per_expert: int

    @property
    def slots(self) -> int:
        return self.per_expert * self.n_experts


@dataclass(frozen=True)
class TwoDPlan:
    """An FSDP x TP split of ``n_chips`` chips for a global batch of ``batch`` tokens."""

    n_fsdp: int
    n_tp: int
    times: LayerTimes


# ------------------------------------------------------------------------------------------
# 1-2. data parallelism and FSDP / ZeRO
# ------------------------------------------------------------------------------------------

def _mlp_dims(D, F, b):
    return _int("D", D), _int("F", F), check_positive("b (tokens per chip)", b)


def dp_layer_times(D: int, F: int, b: float, n_dp, chip, *, network_kind: str = "ici",
                   bytes_per_element: float = 2) -> LayerTimes:
    """One MLP block (W_in[D, F], W_out[F, D]) under pure data parallelism over ``n_dp``
    (an int or a tuple of axis sizes), ``b`` tokens per chip.

    Forward: 2 matmuls, 4 b D F FLOPs, no communication. Backward: 8 b D F FLOPs, and the
    gradients (2 D F s bytes) are all-reduced over the data axes while it runs."""
    D, F, b = _mlp_dims(D, F, b)
    axes = _axes("n_dp", n_dp)
    net = network(chip, network_kind)
    if net.topology != "torus":            # one NIC (or one switch port set) per chip
        axes = (math.prod(axes),)
    s = check_positive("bytes_per_element", bytes_per_element)
    fwd = _rl.compute_time(4 * b * D * F, chip)
    return LayerTimes("dp", fwd, 0.0, 2 * fwd, _ctime("all-reduce", 2 * D * F * s, axes, net))


def fsdp_layer_times(D: int, F: int, b: float, n_fsdp, chip, *, network_kind: str = "ici",
                     bytes_per_element: float = 2) -> LayerTimes:
    """One MLP block under FSDP (ZeRO-3) over ``n_fsdp``, ``b`` tokens per chip.

    Forward: all-gather the weights (2 D F s bytes gathered) behind 4 b D F FLOPs. Backward:
    gather them again and reduce-scatter the gradients, twice the bytes, behind twice the
    FLOPs, so both passes have the same threshold."""
    D, F, b = _mlp_dims(D, F, b)
    axes = _axes("n_fsdp", n_fsdp)
    net = network(chip, network_kind)
    s = check_positive("bytes_per_element", bytes_per_element)
    V = 2 * D * F * s
    fwd = _rl.compute_time(4 * b * D * F, chip)
    ag = _ctime("all-gather", V, axes, net)
    rs = _ctime("reduce-scatter", V, axes, net)
    return LayerTimes("fsdp", fwd, ag, 2 * fwd, ag + rs)


def data_parallel_critical_batch(chip, n=None, *, axes: int = 1, shape=None,
                                 network_kind: str = "ici",
                                 bytes_per_element: float = 2) -> float:
    """Tokens per chip above which DP's gradient all-reduce (equally FSDP's gathers and
    reduce-scatter) hides behind the matmuls: b* = (n-1)/n * s C / (2 W l), where l is the
    number of links a chip sends on at once: 2 per torus axis (one each way), 1 on an
    axis of 2 chips, 1 on a one-way ring (the DCN) or a GPU's NVSwitch (whose W is all
    its NVLinks). Large torus axes, k of them: s C / (4 W k). D and F cancel, so no model
    is needed.

    Give the data axes one of three ways: nothing (one large axis, the large-n limit
    (n-1)/n -> 1); ``axes`` = k (k large torus axes, large-n limit), optionally with ``n``
    chips on one axis (k = 1); or ``shape``, the sizes of the torus axes the data axis
    spans, e.g. ``shape=(4, 2, 2)``: n = 16 chips, 2 + 1 + 1 = 4 links (an axis of 2 has
    one). An axis has its 2 links only if it wraps around: on a v5p, a slice of at least
    4 x 4 x 4 does; a smaller slice's axes are lines, one link fewer per axis, so the
    ``shape`` here is that of a data axis inside a large slice."""
    c = _chip(chip)
    k = _int("axes (torus axes the data axis spans)", axes)
    s = check_positive("bytes_per_element", bytes_per_element)
    net = network(c, network_kind)
    if shape is not None:
        sizes = _axes("shape", shape)
        if k != 1:
            raise ValueError(f"give shape={sizes} or axes={k}, not both: the shape already "
                             f"says how many axes there are")
        m = math.prod(sizes)
        if m < 2:
            raise ValueError(f"shape={sizes} has {m} chip; data parallelism needs at "
                             f"least 2")
        if n is not None and _int("n", n) != m:
            raise ValueError(f"n={n} does not match shape={sizes}, which has {m} chips")
    elif n is not None:
        m = _int("n", n, minimum=2)
        if k != 1:
            raise ValueError(f"n={m} chips over axes={k} axes: give the mesh shape instead, "
                             f"e.g. shape=(4, 2, 2) for 16 chips on three axes (the split "
                             f"sets the links: an axis of 2 chips has one)")
        sizes = (m,)
    else:
        m, sizes = None, (None,) * k
    frac = 1.0 if m is None else (m - 1) / m
    if net.topology != "torus":
        # a GPU's NVSwitch W is already all its links; on the DCN each chip has one NIC,
        # however many mesh axes the data axis spans
        links = 1
    else:
        links = sum(_coll.links_per_device(net.topology, a) for a in sizes
                    if a is None or a > 1)
    # all-reduce of s bytes per weight element (2 (n-1)/n s / (links W)) against the
    # backward's 4 FLOPs per weight element per token.
    return 2 * frac * s / (links * net.bandwidth) / (4 / c.bf16_flops)


def training_memory_per_chip(n_params: float, n_shard: int = 1, zero_stage: int = 0, *,
                             weight_bytes: float = 2, grad_bytes: float = 2,
                             master_bytes: float = 4, optimizer_bytes: float = 8,
                             activations: float = 0.0) -> ChipMemory:
    """Bytes per chip of mixed-precision Adam state for ``n_params`` parameters when
    ``n_shard`` chips share them with ZeRO stage ``zero_stage``:

    0 (plain DP): everything replicated; 1: optimizer moments and fp32 master weights
    sharded; 2: gradients too; 3 (FSDP): the bf16 weights too. ``activations`` (bytes per
    chip) is added as given."""
    N = check_positive("n_params", n_params)
    n = _int("n_shard", n_shard)
    _choice("zero_stage", zero_stage, ZERO_STAGES)
    w = check_positive("weight_bytes", weight_bytes) * N
    g = check_nonnegative("grad_bytes", grad_bytes) * N
    m = check_nonnegative("master_bytes", master_bytes) * N
    o = check_nonnegative("optimizer_bytes", optimizer_bytes) * N
    return ChipMemory(weights=w / n if zero_stage >= 3 else w,
                      gradients=g / n if zero_stage >= 2 else g,
                      master_weights=m / n if zero_stage >= 1 else m,
                      optimizer=o / n if zero_stage >= 1 else o,
                      activations=check_nonnegative("activations", activations))


def largest_model_per_chip(chip, n_shard: int = 1, zero_stage: int = 0, *,
                           activation_fraction: float = 0.0, **bytes_per_param) -> float:
    """Most parameters whose Adam training state fits in the chip's HBM (n_params, a float),
    leaving ``activation_fraction`` of the HBM for activations."""
    c = _chip(chip)
    f = check_nonnegative("activation_fraction", activation_fraction)
    if f >= 1:
        raise ValueError(f"activation_fraction must be below 1; got {f}")
    per_param = training_memory_per_chip(1.0, n_shard, zero_stage, **bytes_per_param).total
    return c.hbm_bytes * (1 - f) / per_param


# ------------------------------------------------------------------------------------------
# 3. tensor parallelism
# ------------------------------------------------------------------------------------------

def tp_mlp_layer_times(B: float, D: int, F: int, n_tp, chip, *, matmuls: int = 2,
                       network_kind: str = "ici", bytes_per_element: float = 2) -> LayerTimes:
    """A Megatron MLP over ``n_tp`` chips (W_in[D, F_Y], W_out[F_Y, D]) for ``B`` tokens
    (every TP chip sees all B tokens). ``matmuls`` = 2 (plain MLP) or 3 (gated: gate and up
    both column-split).

    Forward: (matmuls) x 2 B D F / n FLOPs, and one all-reduce of the output [B, D]
    (equivalently an all-gather of the input plus a reduce-scatter of the output when the
    activations are sequence-sharded). Backward: twice the FLOPs, one all-reduce of dIn."""
    B = check_positive("B (tokens)", B)
    D, F = _int("D", D), _int("F", F)
    m = _int("matmuls", matmuls)
    if m not in (2, 3):
        raise ValueError(f"matmuls must be 2 (plain MLP) or 3 (gated MLP); got {m}")
    axes = _axes("n_tp", n_tp)
    n = math.prod(axes)
    check_divides("F", F, n, "tensor-parallel chips")
    net = network(chip, network_kind)
    s = check_positive("bytes_per_element", bytes_per_element)
    fwd = _rl.compute_time(m * 2 * B * D * F / n, chip)
    ar = _ctime("all-reduce", B * D * s, axes, net)
    return LayerTimes("tp", fwd, ar, 2 * fwd, ar)


def tp_attention_check(n_heads: int, n_kv_heads: int, n_tp: int) -> int:
    """Query heads per chip when attention is split by heads over ``n_tp`` chips. Refuses a
    degree above the head count or one that does not divide it; with n_tp > n_kv_heads the
    key/value heads must be copied (each chip still needs its group's KV head)."""
    H = _int("n_heads", n_heads)
    K = _int("n_kv_heads", n_kv_heads)
    n = _int("n_tp", n_tp)
    if H % K:
        raise ValueError(f"n_heads={H} must be a multiple of n_kv_heads={K}")
    if n > H:
        raise ValueError(f"n_tp={n} is above the number of query heads {H}: tensor parallelism "
                         f"over heads cannot use more chips than there are heads")
    return check_divides("n_heads", H, n, "tensor-parallel chips")


def _largest_tp(flops, ar_bytes, c: Chip, net: Network, k: int) -> int:
    """Largest n whose all-reduces hide behind the matmuls of one pass, per token:
    2 (n-1)/n ar_bytes / (W l) <= flops / (n C), l = k x links per torus axis, so
    n <= 1 + flops W l / (2 ar_bytes C). An axis of 2 chips has one link (l = 1)."""
    w_eff = net.bandwidth * k * _coll.links_per_device(net.topology)
    n = int(math.floor(1 + flops * w_eff / (2 * ar_bytes * c.bf16_flops) + 1e-9))
    if n == 2 and k == 1:
        # an axis of 2 chips has one link: the all-reduce gets W, not 2 W
        w2 = net.bandwidth * _coll.links_per_device(net.topology, 2)
        n = 2 if flops * w2 / (2 * ar_bytes * c.bf16_flops) >= 1 - 1e-9 else 1
    return n


def max_tp_degree(F: int, chip, *, matmuls: int = 2, axes: int = 1, network_kind: str = "ici",
                  bytes_per_element: float = 2) -> int:
    """Largest n_tp for which the Megatron MLP's all-reduce hides behind its matmuls.

    From 2 (n-1)/n B D s / W_eff <= matmuls 2 B D F / (n C), with W_eff = 2 W k on k torus
    axes (W on a ring): n <= 1 + matmuls F W_eff / (s C). B and D cancel: it depends on F
    and the network only. The MLP alone: :func:`max_tp_degree_layer` adds attention."""
    c = _chip(chip)
    F = _int("F", F)
    m = _int("matmuls", matmuls)
    k = _int("axes", axes)
    s = check_positive("bytes_per_element", bytes_per_element)
    net = network(c, network_kind)
    # per token: m matmuls of 2 D F FLOPs; one all-reduce of D s bytes (D cancels)
    return _largest_tp(m * 2 * F, s, c, net, k)


def max_tp_degree_layer(model, chip, *, seq_len: int, causal: bool = True,
                        which: str = "worse", axes: int = 1, network_kind: str = "ici",
                        bytes_per_element: float = 2) -> int:
    """Largest n_tp for which a whole transformer layer (attention and gated MLP, Megatron
    with sequence parallelism) hides its collectives behind its matmuls, in pass ``which``:
    "forward", "backward" or "worse" (the smaller of the two, which is the forward's).

    Per token and layer the forward does f = 2 (attention + MLP weights) FLOPs plus the
    attention scores and values at ``seq_len`` (``models.attention_flops_per_token``,
    causal by default, as chapter 6 counts them), and sends two all-reduces' worth of
    [D] activations: an all-gather before and a reduce-scatter after the attention and
    the MLP, 2 x 2 (n-1)/n D s bytes. The backward does 2 f behind the same collectives
    (the transposes swap gathers and reduce-scatters). So
    n <= 1 + f W_eff / (4 D s C) forward, and 1 + 2 f W_eff / (4 D s C) backward."""
    from .models import get_model
    cfg = get_model(model)
    S = _int("seq_len", seq_len)
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False; got {causal!r}")
    _choice("which (pass)", which, TP_PASSES)
    c = _chip(chip)
    k = _int("axes", axes)
    s = check_positive("bytes_per_element", bytes_per_element)
    net = network(c, network_kind)
    f = (2 * (cfg.attention_params_per_layer() + cfg.mlp_params_per_layer())
         + cfg.attention_flops_per_token(S, causal) / cfg.n_layers)
    ar = 2 * cfg.d_model * s                     # two all-reduces of D elements per token
    fwd = _largest_tp(f, ar, c, net, k)
    bwd = _largest_tp(2 * f, ar, c, net, k)
    return {"forward": fwd, "backward": bwd, "worse": min(fwd, bwd)}[which]


# ------------------------------------------------------------------------------------------
# 4. FSDP x TP
# ------------------------------------------------------------------------------------------

def _combine(combine, net: Network) -> str:
    """How the FSDP (X) and TP (Y) collectives of one pass add up: "max" when they run at
    once on different links (a TPU torus, each degree on its own torus axes), "sum" when
    they queue on the same links (the pessimistic bound; the only choice on a GPU's
    NVSwitch or the DCN, where every mesh axis goes through the same ports)."""
    if combine is None:
        return "max" if net.topology == "torus" else "sum"
    _choice("combine", combine, COMBINES)
    if combine == "max" and net.topology != "torus":
        raise ValueError(f"combine='max' needs different links for the two axes; on the "
                         f"{net.name} network ({net.topology}) both axes share the chip's "
                         f"ports: use combine='sum'")
    return combine


def _two_axes(axes, net: Network) -> tuple:
    if not isinstance(axes, (tuple, list)) or len(axes) != 2:
        raise ValueError(f"axes must be a pair (a_X, a_Y): the torus axes the FSDP and the "
                         f"TP degree each span; got {axes!r}")
    mx, my = (_int("axes (each of a_X, a_Y)", a) for a in axes)
    if net.topology != "torus" and (mx, my) != (1, 1):
        raise ValueError(f"axes={axes!r}: on the {net.name} network ({net.topology}) more "
                         f"mesh axes add no links; use axes=(1, 1)")
    return mx, my


def fsdp_tp_layer_times(B: float, D: int, F: int, n_fsdp, n_tp, chip, *,
                        combine: str | None = None, network_kind: str = "ici",
                        bytes_per_element: float = 2) -> LayerTimes:
    """One MLP block, weights W_in[D_X, F_Y], W_out[F_Y, D_X], activations In[B_X, D]:
    FSDP over X (``n_fsdp`` chips, an int or a tuple of torus-axis sizes), Megatron TP
    over Y (``n_tp``, likewise).

    Forward per chip: 4 B D F / (X Y) FLOPs; all-gather the weight shards over X (2 D F s / Y
    bytes gathered) and, over Y, all-gather the input and reduce-scatter the output
    ([B / X, D] each). Backward: twice the FLOPs; the weight gather again plus a
    reduce-scatter of the gradients over X, and the same TP pair over Y. Within an axis
    the collectives queue; across the two axes ``combine`` says how they add: "max" (the
    default on a torus: X and Y use different links at once) or "sum" (they share links;
    the default, and the only choice, on a GPU's NVSwitch or the DCN)."""
    B = check_positive("B (tokens)", B)
    D, F = _int("D", D), _int("F", F)
    x_axes, y_axes = _axes("n_fsdp", n_fsdp), _axes("n_tp", n_tp)
    X, Y = math.prod(x_axes), math.prod(y_axes)
    check_divides("F", F, Y, "tensor-parallel chips")
    net = network(chip, network_kind)
    how = max if _combine(combine, net) == "max" else (lambda a, b: a + b)
    s = check_positive("bytes_per_element", bytes_per_element)
    fwd = _rl.compute_time(4 * B * D * F / (X * Y), chip)
    w_gather = _ctime("all-gather", 2 * D * F * s / Y, x_axes, net)
    w_rs = _ctime("reduce-scatter", 2 * D * F * s / Y, x_axes, net)
    act = B * D * s / X
    tp = _ctime("all-gather", act, y_axes, net) + _ctime("reduce-scatter", act, y_axes, net)
    return LayerTimes("fsdp+tp", fwd, how(w_gather, tp), 2 * fwd, how(w_gather + w_rs, tp))


def optimal_fsdp_degree(B: float, n_chips: int, F: int, *, axes=(1, 1)) -> float:
    """The FSDP degree that minimises the 2D split's communication (large-n limit),
    X* = sqrt(B n a_X / (F a_Y)); n = n_chips, B global tokens, ``axes`` = (a_X, a_Y) the
    torus axes the FSDP and TP degrees span (a_X + a_Y = 3 on a whole 3D torus). The
    same X* for both ways of adding the two axes' collectives (max or sum): it makes the
    FSDP and TP terms equal."""
    B = check_positive("B (tokens)", B)
    n = _int("n_chips", n_chips)
    F = _int("F", F)
    if not isinstance(axes, (tuple, list)) or len(axes) != 2:
        raise ValueError(f"axes must be a pair (a_X, a_Y); got {axes!r}")
    mx, my = (_int("axes (each of a_X, a_Y)", a) for a in axes)
    return math.sqrt(B * n * mx / (F * my))


def fsdp_tp_critical_batch(F: int, chip, *, axes=(1, 1), combine: str | None = None,
                           network_kind: str = "ici", bytes_per_element: float = 2) -> float:
    """Tokens per chip above which FSDP x TP at its optimal split is compute-bound
    (large-n limit, forward pass, the harder one: the backward doubles the FLOPs and the
    weight collectives but not the TP collectives).

    With W_eff = 2 W per torus axis (W on a ring or switch) and ``axes`` = (a_X, a_Y), the
    torus axes each degree spans, the forward's FSDP and TP terms are
    T_fsdp / T_math = (s C / (2 W_eff)) X / (B a_X) and T_tp / T_math = (s C / (2 W_eff))
    Y / (F a_Y). Both are least, together, at X* = sqrt(B n a_X / (F a_Y)), where each is
    (s C / (2 W_eff)) sqrt(n / (B F a_X a_Y)).

    ``combine="max"`` (default on a torus: the two axes use different links at once): the
    larger term must be <= 1, so b* = (s C / (2 W_eff))^2 / (F a_X a_Y).
    ``combine="sum"`` (the terms share links; default on a GPU's NVSwitch or the DCN):
    their sum, twice one term, must be <= 1, so b* = (s C / W_eff)^2 / (F a_X a_Y), four
    times more. Pure FSDP on one axis needs s C / (2 W_eff)."""
    c = _chip(chip)
    F = _int("F", F)
    s = check_positive("bytes_per_element", bytes_per_element)
    net = network(c, network_kind)
    mx, my = _two_axes(axes, net)
    how = _combine(combine, net)
    w_eff = net.bandwidth * _coll.links_per_device(net.topology)
    terms = 1 if how == "max" else 2               # the max of two equal terms, or their sum
    return (terms * s * c.bf16_flops / (2 * w_eff)) ** 2 / (F * mx * my)


def best_2d_split(B: float, D: int, F: int, n_chips: int, chip, **kw) -> TwoDPlan:
    """The (n_fsdp, n_tp) with n_fsdp n_tp = n_chips (n_tp dividing F) a practitioner
    would pick, by trying every divisor pair: the least TP among the splits whose worse
    pass is compute-bound (more TP only adds collectives once the compute hides them);
    when none is, the one whose worse pass has the least communication per FLOP
    (:attr:`LayerTimes.ratio`), ties to the least communication per step.

    The worse pass, not the whole step: a step is compute-bound only when each pass hides
    its own collectives, and a split with less communication per step can still make its
    forward pass wait (the TP collectives are as large there as in the backward, behind
    half the FLOPs). ``n_tp = 1`` is pure FSDP, so the result is never worse than it."""
    n = _int("n_chips", n_chips)
    F = _int("F", F)
    plans = [TwoDPlan(n // Y, Y, fsdp_tp_layer_times(B, D, F, n // Y, Y, chip, **kw))
             for Y in range(1, n + 1) if not (n % Y or F % Y)]   # n_tp = 1 always divides
    bound = [p for p in plans if p.times.compute_bound]
    if bound:
        return min(bound, key=lambda p: p.n_tp)
    return min(plans, key=lambda p: (p.times.ratio, p.times.comm))


# ------------------------------------------------------------------------------------------
# 5. pipeline parallelism
# ------------------------------------------------------------------------------------------

def check_pipeline(n_layers: int, n_stages: int) -> int:
    """Layers per stage; refuses more stages than layers and an uneven split."""
    L = _int("n_layers", n_layers)
    P = _int("n_stages", n_stages)
    if P > L:
        raise ValueError(f"n_stages={P} is more than n_layers={L}: every stage needs at least "
                         f"one layer")
    return check_divides("n_layers", L, P, "pipeline stages")


def bubble_fraction(n_stages: int, n_microbatches: int, interleave: int = 1) -> float:
    """Idle fraction of a GPipe or 1F1B pipeline: (P - 1) / (N_mb + P - 1). With an
    interleaved schedule of ``interleave`` = v virtual stages per chip the fill and drain
    shrink v-fold: (P - 1) / (v N_mb + P - 1)."""
    P = _int("n_stages", n_stages)
    M = _int("n_microbatches", n_microbatches)
    v = _int("interleave", interleave)
    return (P - 1) / (v * M + P - 1)


def dualpipe_bubble(n_stages: int, forward: float = 1.0, backward: float = 2.0,
                    weight_grad: float | None = None) -> float:
    """Idle time per stage in DualPipe's fill and drain, in the units of ``forward``:
    (P / 2 - 1)(F&B + B - 3 W), with F&B = F + B the time of a forward and a backward
    chunk run overlapped (their compute does not shrink; only their communication hides)
    and W the weight-gradient part of the backward (default B / 2: the backward's two
    matmuls, input and weight gradient, of equal size). DeepSeek-V3 (arXiv:2412.19437,
    Table 2) against 1F1B's (P - 1)(F + B): :func:`one_f_one_b_bubble`. P must be even (the
    schedule feeds microbatches from both ends)."""
    P = _int("n_stages", n_stages)
    if P % 2:
        raise ValueError(f"DualPipe needs an even number of pipeline stages; got n_stages={P}")
    F = check_positive("forward", forward)
    B = check_positive("backward", backward)
    W = B / 2 if weight_grad is None else check_nonnegative("weight_grad", weight_grad)
    if W > B:
        raise ValueError(f"weight_grad={W} is part of the backward, at most backward={B}")
    return (P / 2 - 1) * (F + B + B - 3 * W)


def one_f_one_b_bubble(n_stages: int, forward: float = 1.0, backward: float = 2.0) -> float:
    """Idle time per stage in 1F1B's fill and drain, (P - 1)(F + B), in the units of
    ``forward`` (DeepSeek-V3, arXiv:2412.19437, Table 2; :func:`bubble_fraction` divides it
    by the step)."""
    P = _int("n_stages", n_stages)
    return (P - 1) * (check_positive("forward", forward) + check_positive("backward", backward))


def pipeline_schedule(n_stages: int, n_microbatches: int, kind: str = "gpipe") -> Schedule:
    """Build the schedule step by step (one step per forward or backward of a microbatch on
    a stage). "gpipe": all forwards, then all backwards (last microbatch first). "1f1b":
    each stage runs at most P - stage forwards ahead, then alternates one backward and one
    forward. A job runs at the first step when its input is ready: the forward of mb on
    stage p after that on p - 1, the backward on p after that on p + 1 (and after its own
    forward on the last stage)."""
    P = _int("n_stages", n_stages)
    M = _int("n_microbatches", n_microbatches)
    _choice("kind", kind, SCHEDULES)
    orders = []
    for p in range(P):
        if kind == "gpipe":
            order = [("F", m) for m in range(M)] + [("B", m) for m in reversed(range(M))]
        else:
            warm = min(P - p, M)
            order = [("F", m) for m in range(warm)]
            f_next, b_next = warm, 0
            while b_next < M:
                order.append(("B", b_next))
                b_next += 1
                if f_next < M:
                    order.append(("F", f_next))
                    f_next += 1
        orders.append(order)
    return simulate_schedule(orders, kind=kind)


def _check_orders(orders):
    if not isinstance(orders, (list, tuple)) or not orders:
        raise ValueError("orders must be a non-empty list with one list of jobs per stage")
    P = len(orders)
    M = None
    for p, order in enumerate(orders):
        if not isinstance(order, (list, tuple)):
            raise ValueError(f"orders[{p}] must be a list of jobs such as ('F', 0) or ('B', 0)")
        jobs = []
        for job in order:
            if (not isinstance(job, (list, tuple)) or len(job) != 2 or job[0] not in ("F", "B")
                    or isinstance(job[1], bool) or not isinstance(job[1], numbers.Integral)):
                raise ValueError(f"orders[{p}] has {job!r}; a job is ('F', microbatch) or "
                                 f"('B', microbatch)")
            jobs.append((job[0], int(job[1])))
        m = len(jobs) // 2
        M = m if M is None else M
        want = sorted([("F", i) for i in range(M)] + [("B", i) for i in range(M)])
        if sorted(jobs) != want or m != M:
            raise ValueError(f"stage {p} must run the forward and the backward of each of the "
                             f"{M} microbatches exactly once")
        for i in range(M):
            if jobs.index(("B", i)) < jobs.index(("F", i)):
                raise ValueError(f"stage {p} runs the backward of microbatch {i} before its "
                                 f"forward")
    return P, M


def simulate_schedule(orders, kind: str = "custom") -> Schedule:
    """Run per-stage job lists (``orders[p]`` = [("F", 0), ("F", 1), ("B", 0), ...]) step by
    step: each stage takes its next job at the first step its input is ready (the forward of
    a microbatch after that on the previous stage, the backward after that on the next
    stage, or after its own forward on the last stage). Refuses a job list that cannot
    finish (a stage waiting for a job another stage will never run first)."""
    P, M = _check_orders(orders)
    orders = [[(j[0], int(j[1])) for j in o] for o in orders]
    done = {}                                   # (kind, stage, mb) -> step it finished
    pos = [0] * P
    grid = [[] for _ in range(P)]
    step = 0
    while any(pos[p] < len(orders[p]) for p in range(P)):
        ready = []
        for p in range(P):
            if pos[p] >= len(orders[p]):
                ready.append(None)
                continue
            kind_, m = orders[p][pos[p]]
            if kind_ == "F":
                ok = p == 0 or done.get(("F", p - 1, m), step) < step
            else:
                dep = ("F", p, m) if p == P - 1 else ("B", p + 1, m)
                ok = done.get(dep, step) < step
            ready.append((kind_, m) if ok else None)
        for p, job in enumerate(ready):
            grid[p].append(job)
            if job is not None:
                done[(job[0], p, job[1])] = step
                pos[p] += 1
        step += 1
        if step > 2 * M * P + 2 * P + 2:
            raise ValueError("these job lists deadlock: some stage waits for a job that "
                             "another stage has queued behind a job that waits for it")
    return Schedule(kind, P, M, tuple(tuple(r) for r in grid))


def pipeline_activation_microbatches(n_stages: int, n_microbatches: int, kind: str = "gpipe") -> int:
    """Microbatches of activations the first stage holds at once: N_mb for GPipe,
    min(P, N_mb) for 1F1B."""
    P = _int("n_stages", n_stages)
    M = _int("n_microbatches", n_microbatches)
    _choice("kind", kind, SCHEDULES)
    return M if kind == "gpipe" else min(P, M)


# ------------------------------------------------------------------------------------------
# 6. expert parallelism
# ------------------------------------------------------------------------------------------

def _moe(n_experts, k):
    E = _int("n_experts", n_experts)
    k = _int("k (experts per token)", k)
    if k > E:
        raise ValueError(f"k={k} experts per token is more than n_experts={E}")
    return E, k


def moe_capacity(tokens: int, n_experts: int, k: int, capacity_factor: float) -> Capacity:
    """Slots per expert: ceil(capacity_factor x tokens x k / E). A capacity factor of 1
    gives exactly enough slots for a perfectly even routing."""
    T = _int("tokens", tokens)
    E, k = _moe(n_experts, k)
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, numbers.Real) \
            or not math.isfinite(capacity_factor) or capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be a number > 0 (1.0: just enough slots for an "
                         f"even routing); got {capacity_factor!r}")
    per = math.ceil(capacity_factor * T * k / E - 1e-9)
    return Capacity(T, E, k, float(capacity_factor), max(1, per))


def tokens_dropped(expert_counts, capacity: int) -> int:
    """Routed (token, expert) pairs that find no slot: sum of max(0, count - capacity)."""
    cap = _int("capacity", capacity, minimum=0)
    total = 0
    for i, c in enumerate(expert_counts):
        total += max(0, _int(f"expert_counts[{i}]", c, minimum=0) - cap)
    return total


def moe_critical_batch(D: int, F: int, n_experts: int, k: int, chip, *, n_ep: int = 1,
                       **kw) -> int:
    """Tokens per chip (all experts' tokens together) for which each expert's matmul is
    compute-bound on HBM (:func:`scalebook.roofline.critical_batch`, b*).

    Each expert sees k/E of the tokens routed by the chips that share one copy of the
    experts. With all E experts on one chip (``n_ep`` = 1) that chip needs E/k x b*; with
    the experts split over ``n_ep`` chips, an expert collects the tokens of all of them, so
    each chip needs E / (k n_ep) x b* (rounded up)."""
    E, k = _moe(n_experts, k)
    n = _int("n_ep", n_ep)
    check_divides("n_experts", E, n, "expert-parallel chips")
    return math.ceil(E / (k * n) * _rl.critical_batch(D, F, chip, **kw))


def moe_all_to_all_bytes(tokens_per_chip: float, D: int, k: int, n_ep: int,
                         bytes_per_element: float = 2) -> float:
    """Bytes each chip sends in ONE of the MoE layer's two all-to-alls (dispatch, then
    combine): its b k routed copies of [D] activations, (n - 1) / n of them leave the chip."""
    b = check_positive("tokens_per_chip", tokens_per_chip)
    D = _int("D", D)
    k = _int("k", k)
    n = _int("n_ep", n_ep)
    return _coll.ring_bytes("all-to-all", b * k * D * check_positive("bytes_per_element",
                                                                      bytes_per_element), n)


def moe_layer_times(b: float, D: int, F: int, n_experts: int, k: int, n_ep: int, chip, *,
                    network_kind: str = "ici", bytes_per_element: float = 2) -> LayerTimes:
    """Forward and backward of one MoE MLP (each expert W_in[D, F], W_out[F, D]) with the
    experts split over ``n_ep`` chips of one axis, ``b`` tokens per chip, top-``k``.

    Compute per chip: 4 b k D F forward (each token meets k experts). Communication: the
    dispatch and combine all-to-alls of b k D s bytes per chip, in each pass."""
    b = check_positive("b (tokens per chip)", b)
    D, F = _int("D", D), _int("F", F)
    E, k = _moe(n_experts, k)
    n = _int("n_ep", n_ep)
    check_divides("n_experts", E, n, "expert-parallel chips")
    net = network(chip, network_kind)
    s = check_positive("bytes_per_element", bytes_per_element)
    fwd = _rl.compute_time(4 * b * k * D * F, chip)
    a2a = 2 * _ctime("all-to-all", b * k * D * s, n, net)
    return LayerTimes("ep", fwd, a2a, 2 * fwd, a2a)


# ------------------------------------------------------------------------------------------
# 7. context parallelism (ring attention)
# ------------------------------------------------------------------------------------------

def ring_attention_step_times(block: int, n_heads: int, n_kv_heads: int, head_dim: int, chip, *,
                              network_kind: str = "ici", bytes_per_element: float = 2):
    """One step of ring attention: a chip's query block of ``block`` positions meets one
    K/V block of the same length while the next K/V block arrives from a neighbour.

    Returns (compute seconds, transfer seconds): 4 block^2 H h FLOPs against a
    collective-permute of K and V, 2 block K h s bytes, over one link."""
    S = _int("block (positions per chip)", block)
    H, K, h = _int("n_heads", n_heads), _int("n_kv_heads", n_kv_heads), _int("head_dim", head_dim)
    if H % K:
        raise ValueError(f"n_heads={H} must be a multiple of n_kv_heads={K}")
    net = network(chip, network_kind)
    s = check_positive("bytes_per_element", bytes_per_element)
    return (_rl.compute_time(4 * S * S * H * h, chip),
            _ctime("collective-permute", 2 * S * K * h * s, 2, net))


def ring_attention_min_block(chip, n_heads: int, n_kv_heads: int, *, network_kind: str = "ici",
                             bytes_per_element: float = 2) -> float:
    """Positions per chip above which ring attention hides its K/V permutes:
    4 S^2 H h / C >= 2 S K h s / W  ->  S >= s C K / (2 W H) (h cancels)."""
    c = _chip(chip)
    H, K = _int("n_heads", n_heads), _int("n_kv_heads", n_kv_heads)
    if H % K:
        raise ValueError(f"n_heads={H} must be a multiple of n_kv_heads={K}")
    s = check_positive("bytes_per_element", bytes_per_element)
    return s * c.bf16_flops * K / (2 * network(c, network_kind).bandwidth * H)


# ------------------------------------------------------------------------------------------
# 8. memory-saving tools
# ------------------------------------------------------------------------------------------

def mlp_saved_elements(D: int, F: int, policy: str) -> int:
    """Elements per token one block x -> act(x @ W_in) @ W_out keeps for its backward pass
    under a ``jax.checkpoint`` policy:

    "nothing" (nothing_saveable): only the block's input, D.
    "dots" (dots_saveable): the input and the matmul output x @ W_in, D + F (the block's
    own output is the next block's input, counted there).
    "everything" (everything_saveable, or no checkpoint): input, x @ W_in and act(.),
    D + 2F."""
    D, F = _int("D", D), _int("F", F)
    _choice("policy", policy, REMAT_POLICIES)
    return {"nothing": D, "dots": D + F, "everything": D + 2 * F}[policy]


def accumulation_activation_bytes(activation_bytes_per_token: float, batch_tokens: int,
                                  n_microbatches: int) -> float:
    """Activation bytes alive with gradient accumulation over ``n_microbatches``: only one
    microbatch's, batch / N_mb tokens (the batch must split evenly)."""
    a = check_nonnegative("activation_bytes_per_token", activation_bytes_per_token)
    per = check_divides("batch_tokens", batch_tokens, n_microbatches, "microbatches")
    return a * per


def offload_time(nbytes: float, chip, *, round_trip: bool = True) -> float:
    """Seconds to move ``nbytes`` between host memory and the chip over PCIe (``pcie_bandwidth``,
    one direction); ``round_trip`` counts the way back too (load, update, store)."""
    c = _chip(chip)
    if c.pcie_bandwidth is None:
        raise ValueError(f"{c.name} has no pcie_bandwidth; use get_chip(...).with_(pcie_bandwidth=...)")
    t = check_nonnegative("nbytes", nbytes) / c.pcie_bandwidth
    return 2 * t if round_trip else t


# ------------------------------------------------------------------------------------------
# 9. across pods
# ------------------------------------------------------------------------------------------

def dcn_critical_batch_per_slice(chip, n_slices=None, *, bytes_per_element: float = 2) -> float:
    """Tokens per slice above which data parallelism across slices hides its DCN all-reduce.

    Inside a slice the gradients are first reduce-scattered over ICI, so each of a slice's
    c chips all-reduces N s / c bytes over its own DCN link: 2 (m-1)/m N s / (c W_dcn)
    against the backward's 4 N B_slice / (c C). The c cancels: B_slice >= (m-1)/m s C /
    (2 W_dcn), whatever the slice size (``n_slices`` = m; default the large-m limit)."""
    c = _chip(chip)
    s = check_positive("bytes_per_element", bytes_per_element)
    frac = 1.0 if n_slices is None else (lambda m: (m - 1) / m)(_int("n_slices", n_slices, 2))
    w = network(c, "dcn").bandwidth
    return frac * s * c.bf16_flops / (2 * w)



# ------------------------------------------------------------------------------------------
# 10. across GPU nodes (chapter 11)
# ------------------------------------------------------------------------------------------

def _gpu_domain(c: Chip) -> int:
    if c.vendor != "NVIDIA" or c.ici_domain_chips is None:
        raise ValueError(f"{c.name} is not a GPU with an NVLink domain; for a TPU use "
                         f"data_parallel_critical_batch and dcn_critical_batch_per_slice")
    return c.ici_domain_chips


def hierarchical_dp_critical_batch(chip, nodes: int, *, local: int | None = None,
                                   pipelined: bool = True,
                                   bytes_per_element: float = 2) -> float:
    """Tokens per GPU above which data parallelism (or FSDP, the same bytes behind twice the
    FLOPs) over ``local`` GPUs in each of ``nodes`` nodes hides its gradient all-reduce,
    run hierarchically (:func:`scalebook.collectives.hierarchical_time`).

    Per weight element the backward pass does 4 FLOPs per token and the all-reduce moves
    its s bytes, so b* = C T(s) / 4 with T(s) the hierarchical all-reduce time of s bytes.
    Pipelined, for l = 8 GPUs a node and m nodes: b* = max(2 (l-1)/l s C / (4 W_nvlink),
    2 (m-1)/m s C / (4 l W_dcn)): the NICs need 1/l of the flat figure
    ``data_parallel_critical_batch(chip, network_kind="dcn")``. ``local`` defaults to
    the whole NVLink domain."""
    c = _chip(chip)
    domain = _gpu_domain(c)
    g = domain if local is None else _int("local", local)
    m = _int("nodes", nodes)
    s = check_positive("bytes_per_element", bytes_per_element)
    t = _coll.hierarchical_time("all-reduce", s, g, m, c, pipelined=pipelined)
    return c.bf16_flops * t / 4


def ep_critical_width(chip, n_ep: int, *, matmuls: int = 2, bytes_per_element: float = 2,
                      pipelined: bool = False) -> float:
    """Expert width F above which an MoE layer's dispatch and combine all-to-alls over
    ``n_ep`` chips hide behind its expert matmuls, whatever the batch.

    Per routed copy of a token (forward): the expert's ``matmuls`` matmuls do
    2 matmuls D F FLOPs (2: an up and a down projection, 4 D F; 3: a gated MLP's gate, up
    and down, 6 D F, as in Mixtral's and DeepSeek-V3's experts), and the dispatch and
    combine each move its D s bytes, so 2 matmuls D F / C >= 2 t(D s):
    F* = C t(s) / matmuls, where t(s) is one all-to-all's time for s bytes per chip.
    Inside one fast domain t = collective_time (a GPU's NVSwitch sends the blocks straight
    to their GPU: t(s) = (n-1)/n s / W); a GPU group over several nodes of
    ``ici_domain_chips`` runs the hierarchical all-to-all (NVLink for the copies that stay
    in the node, the NIC for the rest)."""
    c = _chip(chip)
    n = _int("n_ep", n_ep, minimum=2)
    m = _int("matmuls", matmuls)
    s = check_positive("bytes_per_element", bytes_per_element)
    domain = c.ici_domain_chips
    if c.vendor == "NVIDIA" and domain is not None and n > domain:
        if n % domain:
            raise ValueError(f"n_ep={n} does not fill whole nodes of {domain} {c.name} GPUs")
        t = _coll.hierarchical_time("all-to-all", s, domain, n // domain, c,
                                    pipelined=pipelined)
    else:
        t = _ctime("all-to-all", s, n, network(c, "ici"))
    return c.bf16_flops * t / m


# -- DeepSeek-V3's routing (chapter 12) -----------------------------------------------------
def route_top_k(scores, k: int, bias=None, group_of=None, max_groups: int | None = None):
    """Experts each token is routed to: the ``k`` highest of ``scores`` [T, E] (plus
    ``bias`` [E], which only chooses: DeepSeek-V3's auxiliary-loss-free balancing,
    arXiv:2412.19437 section 2.1.2, never lets it weight the output). With ``group_of``
    [E] (each expert's node) and ``max_groups`` M, node-limited routing: a token first
    keeps the M nodes whose experts score highest (by the sum of each node's k / M best
    scores, as DeepSeek-V3 does) and picks its k among their experts only. Returns [T, k]
    indices."""
    import numpy as np
    s = np.asarray(scores, dtype=float)
    if s.ndim != 2:
        raise ValueError(f"scores must be [tokens, experts]; got shape {s.shape}")
    T, E = s.shape
    k = _int("k", k)
    if k > E:
        raise ValueError(f"k={k} is more than the {E} experts")
    if bias is not None:
        b = np.asarray(bias, dtype=float)
        if b.shape != (E,):
            raise ValueError(f"bias must have one entry per expert, shape ({E},); got {b.shape}")
        s = s + b
    if group_of is not None:
        g = np.asarray(group_of)
        if g.shape != (E,):
            raise ValueError(f"group_of must give each of the {E} experts its node; got "
                             f"shape {g.shape}")
        groups = np.unique(g)
        M = _int("max_groups", max_groups)
        if M > len(groups):
            raise ValueError(f"max_groups={M} is more than the {len(groups)} nodes")
        per = max(1, k // M)
        best = np.stack([np.sort(s[:, g == x], axis=1)[:, -per:].sum(axis=1)
                         for x in groups], axis=1)                     # [T, nodes]
        keep = np.argsort(-best, axis=1, kind="stable")[:, :M]
        allowed = (g[None, None, :] == groups[keep][:, :, None]).any(axis=1)   # [T, E]
        if (allowed.sum(axis=1) < k).any():
            raise ValueError(f"max_groups={M} nodes hold fewer than k={k} experts")
        s = np.where(allowed, s, -np.inf)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def balance_router_bias(scores, k: int, steps: int, gamma: float = 1e-3, bias=None):
    """DeepSeek-V3's auxiliary-loss-free balancing (arXiv:2412.19437, section 2.1.2) on a
    fixed batch of router ``scores`` [T, E]: after each step every overloaded expert's
    bias falls by ``gamma`` and every underloaded one's rises by it (the load compared
    with the mean, T k / E). Returns (bias, loads) with loads [steps + 1, E], the tokens
    per expert before each update and after the last."""
    import numpy as np
    s = np.asarray(scores, dtype=float)
    T, E = s.shape
    n = _int("steps", steps, minimum=0)
    g = check_positive("gamma", gamma)
    b = np.zeros(E) if bias is None else np.asarray(bias, dtype=float).copy()
    k = _int("k", k)

    def load():
        return np.bincount(route_top_k(s, k, b).ravel(), minlength=E)

    loads = []
    for _ in range(n):
        loads.append(load())
        b -= g * np.sign(loads[-1] - T * k / E)
    loads.append(load())
    return b, np.array(loads)
