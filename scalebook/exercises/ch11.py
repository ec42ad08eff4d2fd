"""Chapter 11 exercises: GPUs. Reference answers are computed from scalebook (hardware,
chip_internals, collectives, parallelism, serving).

The mesh exercise (11.12) runs the student's per-device function on a 2 x 4 mesh with axes
``"node"`` and ``"gpu"`` (``scalebook.setup()`` must have run), compares the numbers with
NumPy and reads the compiled program's collectives with :func:`scalebook.hlo.collectives`.
"""

from __future__ import annotations

import math

from .. import chip_internals as ci
from .. import collectives as coll
from .. import parallelism as par
from ..hardware import get_chip
from ..models import MIXTRAL_8X7B, get_model
from .core import register
from .kinds import (ChoiceExercise, CodeExercise, MeshProgramExercise, NumericExercise,
                    VariedNumericExercise, as_number, mesh_inputs, returns_something)

__all__ = ["MESH_SHAPE", "MESH_AXES"]

MESH_SHAPE, MESH_AXES = (2, 4), ("node", "gpu")
_GPUS = ("gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200")
_DTYPE_BYTES = {"bf16": 2, "fp32": 4}


def _close(a, b, rtol=0.02):
    a = as_number(a)
    return a is not None and b != 0 and math.isclose(a, b, rel_tol=rtol)


def _name(chip):
    return get_chip(chip).display_name


def _n(model):
    return get_model(model).num_params()


# 11.1 peak from the SMs ------------------------------------------------------------------
_GEN_CHIP = {"ampere": "gpu-a100", "hopper": "gpu-h100"}
_GEN_NAME = {"ampere": "Ampere", "hopper": "Hopper"}


def _rate(gen):
    return get_chip(_GEN_CHIP[gen]).tensor_flops_per_sm_clock


def _ex1(sms=114, clock_mhz=1620, gen="hopper"):
    chip = get_chip(_GEN_CHIP[gen]).with_(sm_count=sms, tensor_clock=clock_mhz * 1e6)
    return ci.sm_peak_flops(chip)


def _ex1_hints(sms, clock_mhz, gen):
    ref = _ex1(sms, clock_mhz, gen)
    other = "hopper" if gen == "ampere" else "ampere"
    r, r_other = _rate(gen), _rate(other)
    half = (f"half the answer: the {_GEN_NAME[gen]} SM does {r:,} dense FLOPs per clock "
            f"(a multiply-add counted as 2 FLOPs)" + (f"; {r_other:,} is the Ampere SM's"
                                                      if gen == "hopper" else "") + ".")
    double = (f"twice the answer: {r_other:,} is the Hopper SM's rate; an Ampere SM does "
              f"{r:,} FLOPs per clock." if gen == "ampere" else
              "twice the answer: the per-SM rate already counts both FLOPs of a "
              "multiply-add; do not double it.")
    return [
        (lambda a: _close(a, ref / 2), half),
        (lambda a: _close(a, ref * 2), double),
        (lambda a: _close(a, ref * 4), "4x too large: the rate is per SM, all 4 Tensor "
                                       "Cores together; do not multiply by them again."),
        (lambda a: _close(a, ref / 4), "4x too small: the rate per SM covers its 4 Tensor "
                                       "Cores; multiply by the SMs, not the Tensor Cores."),
    ]


register(VariedNumericExercise(
    id="11.1", title="The peak of an H100 PCIe from its SMs", unit="FLOP/s", rtol=0.01,
    params={"sms": 114, "clock_mhz": 1620, "gen": "hopper"},
    choose={"sms": (96, 108, 114, 120, 128, 132, 144), "clock_mhz": (1410, 1620, 1755,
                                                                    1830, 1980),
            "gen": ("ampere", "hopper")},
    solve=_ex1, hints_for=_ex1_hints,
    describe=lambda sms, clock_mhz, gen: {"gen_name": _GEN_NAME[gen],
                                          "ref_chip": _name(_GEN_CHIP[gen])},
    variant_title="The peak of a {gen_name} GPU from its SMs",
    statement="A {gen_name} GPU has {sms} SMs whose Tensor Cores run at {clock_mhz:,} MHz "
              "(the H100 PCIe card, for one, has 114 SMs at 1,620 MHz for tensor work). "
              "Each SM does the dense bf16 work per clock of the {ref_chip} in "
              "`scalebook.hardware` (`tensor_flops_per_sm_clock`). What is the GPU's "
              "dense bf16 peak, in FLOP/s?",
))


# 11.2 SM time in a small matmul ----------------------------------------------------------
def _waves(B, F, chip, tile=(128, 256)):
    return ci.wave_quantization(B, F, chip, tile=tile)


def _ex2(B=384, F=14336, chip="gpu-h100"):
    return _waves(B, F, chip).efficiency


def _ex2_hints(B, F, chip):
    w = _waves(B, F, chip)
    floor_tiles = (B // 128) * (F // 256)
    hints = [
        (lambda a: _close(a, 1.0, 0.005), "the last wave is not full: count the waves, "
                                          "ceil(tiles / SMs), and the SM-tile slots they offer."),
        (lambda a: _close(a, 100 * w.efficiency, 0.01), "give a fraction (0.5 for half), "
                                                        "not a percentage."),
        (lambda a: _close(a, w.tiles / w.sms, 0.01) and w.waves > 1,
         "tiles / SMs counts full waves only; the SMs wait through the last, partial wave too."),
    ]
    if floor_tiles and floor_tiles != w.tiles:
        fw = math.ceil(floor_tiles / w.sms)
        hints.append((lambda a: _close(a, floor_tiles / (fw * w.sms), 0.01),
                      "round the tile counts up: a partial tile at the edge still takes "
                      "an SM."))
    return hints


def _ex2_ok(B, F, chip):
    return _ex2(B, F, chip) < 0.99


register(VariedNumericExercise(
    id="11.2", title="Idle SMs in a small matmul", unit="fraction", rtol=0.01,
    params={"B": 384, "F": 14336, "chip": "gpu-h100"},
    choose={"B": (32, 128, 256, 384, 640, 1024), "F": (4096, 14336, 28672, 53248),
            "chip": ("gpu-a100", "gpu-h100", "gpu-b200")},
    solve=_ex2, hints_for=_ex2_hints, valid=_ex2_ok,
    describe=lambda B, F, chip: {"chip_name": _name(chip),
                                 "sms": get_chip(chip).sm_count},
    statement="A kernel computes $X[{B}, D] \\cdot W[D, {F}]$ on one {chip_name} "
              "({sms} SMs) with output tiles of 128 x 256 ($t_B \\times t_F$), each SM "
              "computing one tile at a time, in waves of {sms} tiles. What share of the "
              "SM-tile slots of all its waves (SMs x waves) compute a tile? Answer as a "
              "fraction.",
))


# 11.3 what in-switch reduction saves -----------------------------------------------------
def _ex3(n=4, MB=512, chip="gpu-h100"):
    M = MB * 1e6
    return (coll.collective_time("all-reduce", M, n, chip)
            - coll.collective_time("all-reduce", M, n, chip, sharp=True))


def _ex3_hints(n, MB, chip):
    M, c = MB * 1e6, get_chip(chip)
    ring = coll.collective_time("all-reduce", M, n, chip)
    sharp = coll.collective_time("all-reduce", M, n, chip, sharp=True)
    ref = ring - sharp
    return [
        (lambda a: _close(a, ring), "that is the ring's whole time; subtract what the "
                                    "in-switch reduction takes, M / W_nvl."),
        (lambda a: _close(a, sharp), "that is the time with in-switch reduction; the "
                                     "question asks for the difference from the ring."),
        (lambda a: _close(a, ref * c.ici_links), "use all of a GPU's NVLinks together "
                                                 "(its ici_bandwidth), not one link."),
        (lambda a: _close(a, ref * 2 ** 20 / 1e6, 0.005),
         "off by a binary/decimal prefix: 1 MB is 1e6 bytes here."),
        (lambda a: _close(a, ((n - 1) / n - 1) * M / c.ici_bandwidth)
         or _close(a, (1 - (n - 1) / n) * M / c.ici_bandwidth),
         "the ring all-reduce sends 2 (n - 1) / n M from each GPU: a reduce-scatter and an "
         "all-gather, not (n - 1) / n M."),
    ]


register(VariedNumericExercise(
    id="11.3", title="What in-switch reduction saves", unit="s", rtol=0.02,
    params={"n": 4, "MB": 512, "chip": "gpu-h100"},
    choose={"n": (3, 4, 5, 6, 7, 8), "MB": (64, 256, 512, 1024, 4096),
            "chip": ("gpu-h100", "gpu-h200", "gpu-b200")},
    solve=_ex3, hints_for=_ex3_hints,
    describe=lambda n, MB, chip: {"chip_name": _name(chip)},
    statement="{n} GPUs of one {chip_name} node all-reduce an array of {MB} MB each "
              "(1 MB = 1e6 bytes) over NVLink. How many seconds does in-switch reduction "
              "(NVLink SHARP, $T_{{\\mathrm{{comm}}}} = M / W_{{\\mathrm{{nvl}}}}$) save "
              "against the ring all-reduce? Bandwidth only, no latency.",
))


# 11.4 a hierarchical all-reduce ----------------------------------------------------------
def _ex4(nodes=4, chip="gpu-h100", dtype="bf16", model="llama3-8b", pipelined=False):
    M = _DTYPE_BYTES[dtype] * _n(model)
    return coll.hierarchical_time("all-reduce", M, 8, nodes, chip, pipelined=pipelined)


def _ex4_hints(nodes, chip, dtype, model="llama3-8b"):
    c = get_chip(chip)
    s = _DTYPE_BYTES[dtype]
    M = s * _n(model)
    n = 8 * nodes
    nic_only = 2 * (nodes - 1) / nodes * M / 8 / c.dcn_bandwidth
    other = "bf16" if dtype == "fp32" else "fp32"
    return [
        (lambda a: _close(a, _ex4(nodes, chip, dtype, pipelined=True)),
         "that is the pipelined time (the busier network alone); the phases here run one "
         "after the other: add them."),
        (lambda a: _close(a, coll.collective_time("all-reduce", M, n,
                                                  bandwidth=c.dcn_bandwidth,
                                                  topology="ring")),
         "that is one flat ring over all GPUs' cards; reduce-scatter inside the node first, "
         "so each card carries 1/8 of the gradient."),
        (lambda a: _close(a, nic_only), "that is the phase between nodes only; add the "
                                        "reduce-scatter and all-gather inside the node."),
        (lambda a: _close(a, _ex4(nodes, chip, dtype) + 7 * nic_only),
         "between nodes each GPU all-reduces only its 1/8 of the gradient (its block after "
         "the node's reduce-scatter), not all of it."),
        (lambda a: _close(a, _ex4(nodes, chip, other)), f"the gradient is {dtype}: "
                                                        f"{s} bytes per parameter."),
    ]


register(VariedNumericExercise(
    id="11.4", title="A hierarchical all-reduce of 8B's gradient", unit="s", rtol=0.02,
    params={"nodes": 4, "chip": "gpu-h100", "dtype": "bf16"},
    choose={"nodes": (2, 4, 8, 16, 32), "chip": ("gpu-a100", "gpu-h100", "gpu-b200"),
            "dtype": ("bf16", "fp32")},
    solve=_ex4, hints_for=_ex4_hints,
    describe=lambda nodes, chip, dtype: {"chip_name": _name(chip), "n": 8 * nodes,
                                         "bytes": _DTYPE_BYTES[dtype]},
    statement="LLaMA-3 8B trains data-parallel on {nodes} nodes of 8 {chip_name} GPUs "
              "({n} GPUs); each GPU holds the whole {dtype} gradient ({bytes} bytes per "
              "parameter) and all-reduces it hierarchically: reduce-scatter in the node "
              "over NVLink, all-reduce between nodes on each GPU's card, all-gather in "
              "the node, one phase after the other. How many seconds does it take? "
              "Bandwidth only.",
))


# 11.5 tokens per weight shard across nodes -----------------------------------------------
def _ex5(chip="gpu-b200", nodes=16, pipelined=True, local=None):
    return par.hierarchical_dp_critical_batch(chip, nodes, pipelined=pipelined,
                                              local=local)


def _ex5_hints(chip, nodes):
    ref = _ex5(chip, nodes)
    return [
        (lambda a: _close(a, par.data_parallel_critical_batch(chip, nodes * 8,
                                                              network_kind="dcn")),
         "that is the flat figure, every GPU sending its whole gradient on its card; "
         "hierarchically each card carries 1/8."),
        (lambda a: _close(a, _ex5(chip, nodes, pipelined=False)),
         "that adds the NVLink and card phases; pipelined, the busier network alone sets "
         "the pace."),
        (lambda a: _close(a, par.data_parallel_critical_batch(chip, 8)) and not
         _close(ref, par.data_parallel_critical_batch(chip, 8)),
         "that is the figure inside one node; here the cards are the busier network."),
        (lambda a: _close(a, ref / 2) or _close(a, ref * 2),
         "2x off: the backward pass does 4 FLOPs per weight element per token (two matmuls "
         "of 2), against the all-reduce of that element's s = 2 bytes."),
    ]


register(VariedNumericExercise(
    id="11.5", title="Tokens per weight shard for DP across B200 nodes", unit="tokens",
    rtol=0.02,
    params={"chip": "gpu-b200", "nodes": 16},
    choose={"chip": ("gpu-a100", "gpu-h100", "gpu-b200"), "nodes": (2, 4, 8, 16, 32, 128)},
    solve=lambda chip, nodes: _ex5(chip, nodes), hints_for=_ex5_hints,
    describe=lambda chip, nodes: {"chip_name": _name(chip)},
    variant_title="Tokens per weight shard for DP across {chip_name} nodes",
    statement="Data parallelism (or FSDP) runs over {nodes} nodes of 8 {chip_name} GPUs, "
              "with the bf16 gradient all-reduced hierarchically and pipelined (the busier "
              "of NVLink and the cards sets the pace). How many tokens must each weight "
              "shard see per step for the all-reduce to hide behind the backward pass?",
))


# 11.6 TP across nodes --------------------------------------------------------------------
def _ex6():
    return par.max_tp_degree(get_model("llama3-405b").d_ff, "gpu-h100", matmuls=3,
                             network_kind="dcn")


def _ex6_raw():
    c = get_chip("gpu-h100")
    return 1 + 3 * get_model("llama3-405b").d_ff * c.dcn_bandwidth / (2 * c.bf16_flops)


register(NumericExercise(
    id="11.6", title="Tensor parallelism over the network cards", unit="GPUs", integer=True,
    reference=_ex6,
    hints=[
        (lambda a: a == 8, "8 is the node; here every all-reduce runs on the GPUs' cards "
                           "(dcn_bandwidth)."),
        (lambda a: a == math.ceil(_ex6_raw()), "round down: one more GPU and the "
                                               "all-reduce no longer hides."),
        (lambda a: a == math.floor(1 + 2 * get_model("llama3-405b").d_ff
                                   * get_chip("gpu-h100").dcn_bandwidth
                                   / (2 * get_chip("gpu-h100").bf16_flops)),
         "the gated MLP has 3 matmuls (gate, up, down) behind its one all-reduce."),
        (lambda a: a > 16, "that is NVLink's figure; across nodes the link is the card, "
                           "9x slower."),
    ],
))


# 11.7 expert width across nodes ----------------------------------------------------------
def _ex7(chip="gpu-h100", n_ep=32):
    return par.ep_critical_width(chip, n_ep)


def _ex7_hints(chip, n_ep):
    c = get_chip(chip)
    ref = _ex7(chip, n_ep)
    flat = c.bf16_flops * (n_ep - 1) / n_ep * 2 / c.dcn_bandwidth / 2
    nic_part = c.bf16_flops * (n_ep - 8) / n_ep * 2 / c.dcn_bandwidth / 2
    return [
        (lambda a: _close(a, flat), "that sends all (n - 1) / n of the copies on the card; "
                                    "the 7 / n_ep for the GPU's own node go over NVLink."),
        (lambda a: _close(a, nic_part) and not _close(ref, nic_part),
         "add the NVLink part: (8 - 1) / n_ep of the bytes, at the NVLink bandwidth."),
        (lambda a: _close(a, ref * 2), "2x too large: dispatch and combine are 2 all-to-alls, "
                                       "against 2 matmuls of 2 D F FLOPs each per copy."),
        (lambda a: _close(a, ref / 2), "2x too small: count both all-to-alls (dispatch and "
                                       "combine) of D s bytes per routed copy."),
    ]


register(VariedNumericExercise(
    id="11.7", title="Expert width for all-to-alls across H100 nodes", unit="elements of F",
    rtol=0.02,
    params={"chip": "gpu-h100", "n_ep": 32},
    choose={"chip": ("gpu-a100", "gpu-h100", "gpu-b200"), "n_ep": (16, 24, 32, 48, 128)},
    solve=_ex7, hints_for=_ex7_hints,
    describe=lambda chip, n_ep: {"chip_name": _name(chip), "nodes": n_ep // 8},
    variant_title="Expert width for all-to-alls across {chip_name} nodes",
    statement="An MoE layer's experts are split over {n_ep} {chip_name} GPUs in {nodes} "
              "nodes of 8. Each routed copy of a token goes to its expert's GPU in the "
              "dispatch all-to-all and back in the combine, over NVLink when that GPU is "
              "in the same node and on the GPU's card otherwise, the two parts one after "
              "the other, bf16. Above what expert width $F$ do the two all-to-alls hide "
              "behind the expert's two matmuls (4 D F FLOPs per copy, forward)?",
))


# 11.8 LLaMA-3's gradient reduce-scatter on the cards --------------------------------------
def _ex8(model="llama3-405b", pp=16, dp=128, dtype="fp32"):
    shard = _DTYPE_BYTES[dtype] * _n(model) / (8 * pp)
    return coll.collective_time("reduce-scatter", shard, dp,
                                bandwidth=get_chip("gpu-h100").dcn_bandwidth,
                                topology="ring")


def _ex8_hints(model, pp, dp, dtype):
    ref = _ex8(model, pp, dp, dtype)
    other = "bf16" if dtype == "fp32" else "fp32"
    h = get_chip("gpu-h100")
    return [
        (lambda a: _close(a, _ex8(model, pp, dp, other)),
         f"the gradients are reduced in {dtype}: {_DTYPE_BYTES[dtype]} bytes each."),
        (lambda a: _close(a, 2 * ref), "a reduce-scatter sends (n - 1) / n of the shard once; "
                                       "2 (n - 1) / n is an all-reduce."),
        (lambda a: _close(a, ref * 8) or _close(a, ref * pp) or _close(a, ref * 8 * pp),
         "each GPU holds 1 / (8 pp) of the parameters: TP splits them 8 ways and the "
         "pipeline pp ways."),
        (lambda a: _close(a, ref * h.dcn_bandwidth / h.ici_bandwidth),
         "the data-parallel peers are in other nodes: the card's dcn_bandwidth, not NVLink."),
    ]


register(VariedNumericExercise(
    id="11.8", title="LLaMA-3's gradient reduce-scatter on the cards", unit="s", rtol=0.02,
    params={"model": "llama3-405b", "pp": 16, "dp": 128, "dtype": "fp32"},
    choose={"model": ("llama3-70b", "llama3-405b"), "pp": (4, 8, 16),
            "dp": (16, 32, 64, 128), "dtype": ("bf16", "fp32")},
    solve=_ex8, hints_for=_ex8_hints,
    describe=lambda model, pp, dp, dtype: {"model_name": "LLaMA-3 " + model.split("-")[1]
                                           .upper(), "n": 8 * pp * dp,
                                           "bytes": _DTYPE_BYTES[dtype]},
    statement="{model_name} trains on {n:,} H100s: TP 8 inside each node, {pp} pipeline "
              "stages, and {dp} data-parallel ranks whose peers sit in other nodes. Once "
              "per step each GPU reduce-scatters the gradients of its own parameters, in "
              "{dtype} ({bytes} bytes each, as the LLaMA-3 paper reduces in FP32), over "
              "its network card as a ring. How many seconds does that take? Bandwidth "
              "only.",
))


# 11.9 405B's decode bound on one server --------------------------------------------------
def _ex9(weight_bytes=1, gpus=8):
    h = get_chip("gpu-h100")
    return weight_bytes * _n("llama3-405b") / (gpus * h.hbm_bandwidth)


register(NumericExercise(
    id="11.9", title="405B in fp8 on one H100 server", unit="s", rtol=0.02,
    reference=_ex9,
    hints=[
        (lambda a: _close(a, _ex9(weight_bytes=2)), "fp8 weights take 1 byte each, not 2."),
        (lambda a: _close(a, _ex9(gpus=1)), "the 8 GPUs each read their own 1/8 of the "
                                            "weights at once."),
        (lambda a: _close(a, _ex9() * 1e9 / 2 ** 30, 0.005),
         "off by a binary/decimal prefix: the bandwidth is in bytes/s, decimal."),
    ],
))


# 11.10 hierarchical all-reduce time in code ----------------------------------------------
def _hier_ref(nbytes, local, nodes, chip):
    return coll.hierarchical_time("all-reduce", nbytes, local, nodes, chip)


_CASES_10 = [(1e9, 8, 4, "gpu-h100"), (3e8, 4, 2, "gpu-a100"), (5e8, 8, 1, "gpu-b200"),
             (2e9, 2, 16, "gpu-h200"), (7.5e8, 1, 8, "gpu-h100")]


def _draw_10(rng):
    return (rng.choice((1e8, 2.5e8, 6e8, 1e9, 4e9)), rng.choice((1, 2, 4, 8)),
            rng.choice((1, 2, 3, 4, 8, 16, 64)), rng.choice(_GPUS))


def _num(got):
    return as_number(got)


def _variant(**slip):
    """A hint predicate: the student's number equals the all-reduce with one slip."""
    def predicate(got, want, args):
        nbytes, g, m, chip = args
        c = get_chip(chip)
        fast, slow = c.ici_bandwidth, c.dcn_bandwidth
        nv = 2 * (g - 1) / g * nbytes / fast
        nic = 2 * (m - 1) / m * nbytes / g / slow
        if slip.get("pipelined"):
            t = max(nv, nic)
        elif slip.get("no_split"):
            t = nv + 2 * (m - 1) / m * nbytes / slow
        elif slip.get("no_nvlink"):
            t = nic
        elif slip.get("flat"):
            t = 2 * (g * m - 1) / (g * m) * nbytes / slow
        else:
            t = nv + nic
        v = _num(got)
        return v is not None and t > 0 and v != want and math.isclose(v, t, rel_tol=1e-6)
    return predicate


register(CodeExercise(
    id="11.10", title="The hierarchical all-reduce, in code", reference=_hier_ref,
    cases=_CASES_10, generate=_draw_10, unit="s", rtol=1e-6,
    describe=lambda nbytes, local, nodes, chip: f"nbytes={nbytes:g}, local={local}, "
                                                f"nodes={nodes}, chip={chip!r}",
    hints=[
        (lambda got, want, args: _num(got) is None, "return the time in seconds, a number."),
        (_variant(pipelined=True), "that is the pipelined time (the larger of NVLink and the "
                                   "cards); here the phases run one after the other."),
        (_variant(no_split=True), "between nodes each GPU all-reduces only the 1/local block "
                                  "it holds after the node's reduce-scatter."),
        (_variant(no_nvlink=True), "add the reduce-scatter and the all-gather inside the node "
                                   "over NVLink (the chip's ici_bandwidth)."),
        (_variant(flat=True), "that is one flat ring on the cards; reduce inside the node "
                              "first."),
    ],
))


# 11.11 wave quantization in code ---------------------------------------------------------
def _waves_ref(B, F, sms, tile_b, tile_f):
    chip = get_chip("gpu-h100").with_(sm_count=sms)
    return ci.wave_quantization(B, F, chip, tile=(tile_b, tile_f)).efficiency


# The first case tells floor from ceil (B and F not multiples of the tile) and has a
# partial last wave; the others vary the tiles and the SM count.
_CASES_11 = [(200, 1000, 132, 128, 256), (4096, 28672, 132, 128, 256),
             (64, 8192, 108, 64, 128), (1000, 3000, 148, 128, 128),
             (8192, 8192, 132, 256, 128)]


def _draw_11(rng):
    return (rng.choice((16, 96, 200, 512, 777, 2048, 4096)),
            rng.choice((1000, 4096, 14336, 28672, 53248)), rng.choice((108, 114, 132, 148)),
            rng.choice((64, 128, 256)), rng.choice((64, 128, 256)))


def _eff_with(got, args, floor=False, waves=True):
    B, F, sms, tb, tf = args
    tiles = (B // tb) * (F // tf) if floor else math.ceil(B / tb) * math.ceil(F / tf)
    if tiles == 0:
        return False
    eff = tiles / (math.ceil(tiles / sms) * sms) if waves else min(1.0, tiles / sms)
    v = _num(got)
    return v is not None and math.isclose(v, eff, rel_tol=1e-9)


register(CodeExercise(
    id="11.11", title="Waves of tiles, in code", reference=_waves_ref, cases=_CASES_11,
    generate=_draw_11, rtol=1e-9,
    describe=lambda B, F, sms, tb, tf: f"B={B}, F={F}, sms={sms}, tile=({tb}, {tf})",
    hints=[
        (lambda got, want, args: _num(got) is None, "return the share as a number."),
        (lambda got, want, args: _num(got) is not None and math.isclose(_num(got), 100 * want,
                                                                        rel_tol=1e-9),
         "return a fraction (0.5 for half), not a percentage."),
        (lambda got, want, args: _eff_with(got, args, floor=True),
         "round the tile counts up (math.ceil): a partial tile at the edge takes an SM too."),
        (lambda got, want, args: _eff_with(got, args, waves=False),
         "count the waves, ceil(tiles / sms): the SMs wait through the last, partial wave."),
    ],
))


# 11.12 the hierarchical all-reduce in shard_map ------------------------------------------
def _P(*entries):
    from jax.sharding import PartitionSpec
    return PartitionSpec(*entries)


def _build_12(answer, case, mesh):
    import jax
    from jax.sharding import NamedSharding
    R, C = case
    (g,) = mesh_inputs([(8 * R, C)], seed=R * 31 + C)
    spec = _P(("node", "gpu"))
    x = jax.device_put(g, NamedSharding(mesh, spec))
    fn = jax.jit(jax.shard_map(returns_something(answer), mesh=mesh, in_specs=spec,
                               out_specs=spec))
    return fn, (x,)


def _expected_12(case, x):
    import numpy as np
    R, C = case
    total = np.asarray(x).reshape(8, R, C).sum(axis=0)
    return np.tile(total, (8, 1))


def _collectives_12(records, case):
    R, C = case
    block = R * C * 4
    kinds = [r.kind for r in records]
    if kinds == ["all-reduce"] and records[0].group_size == 8:
        return ("that is the flat all-reduce over all 8 devices: its every byte crosses "
                "the nodes' cards; reduce-scatter over 'gpu' first, all-reduce over 'node', "
                "all-gather over 'gpu'")
    if [r.group_size for r in records if r.kind == "all-reduce"] == [4, 2] or \
            kinds == ["all-reduce", "all-reduce"]:
        return ("the all-reduce over 'node' acts on the whole block; reduce-scatter over "
                "'gpu' first, so that between nodes each device sends 1/4 of it")
    if kinds != ["reduce-scatter", "all-reduce", "all-gather"]:
        return ("expected a reduce-scatter over 'gpu', an all-reduce over 'node' and an "
                "all-gather over 'gpu', in that order")
    rs, ar, ag = records
    if (rs.group_size, ar.group_size, ag.group_size) != (4, 2, 4):
        return ("the reduce-scatter and all-gather run over the 4 devices of 'gpu' (a "
                "node), the all-reduce over the 2 of 'node'")
    if not math.isclose(ar.bytes_per_device, coll.ring_bytes("all-reduce", block / 4, 2)):
        return "the all-reduce between nodes should act on the [R/4, C] block of one device"
    return None


register(MeshProgramExercise(
    id="11.12", title="The hierarchical all-reduce in shard_map", build=_build_12,
    expected=_expected_12, collectives_ok=_collectives_12,
    cases=[(8, 16), (16, 8), (4, 32)], mesh_shape=MESH_SHAPE, mesh_axes=MESH_AXES,
    describe=lambda R, C: f"a [{R}, {C}] block per device",
    error_hints=[("not divisible", "psum_scatter with tiled=True cuts the block's first "
                                   "dimension into 4 (scatter_dimension=0).")],
))


# 11.13 Mixtral's experts across nodes ----------------------------------------------------
def _ex13():
    F = MIXTRAL_8X7B.dense.d_ff
    return "compute" if F >= par.ep_critical_width("gpu-h100", 64) else "communication"


register(ChoiceExercise(
    id="11.13", title="Mixtral's experts across H100 nodes",
    choices=("compute", "communication"), reference=_ex13,
    hints={"compute": "compare Mixtral's expert width F with F* for 64 H100s in 8 nodes "
                      "(par.ep_critical_width): 7/8 of the copies leave the node on the "
                      "cards."},
))


# 11.14 the XLA flag ----------------------------------------------------------------------
register(ChoiceExercise(
    id="11.14", title="The XLA flag that overlaps collectives",
    choices=("latency_hiding_scheduler", "command_buffer", "triton_gemm"),
    reference=lambda: "latency_hiding_scheduler",
    hints={"command_buffer": "command buffers (CUDA graphs) save kernel launch time; they "
                             "do not move a collective to overlap a matmul.",
           "triton_gemm": "that flag chooses matmul kernels (Triton or cuBLAS); it does not "
                          "schedule collectives."},
))
