"""Chapter 11 exercises: GPUs. Reference answers are computed from scalebook (hardware,
chip_internals, collectives, parallelism, serving).

The mesh exercise (11.12) runs the student's per-device function on a 2 x 4 mesh with axes
``"node"`` and ``"gpu"`` (``scalebook.setup()`` must have run), compares the numbers with
NumPy and reads the compiled program's collectives with :func:`scalebook.hlo.collectives`.

Where a scalebook function gives an answer directly (``collectives.hierarchical_time`` for
11.4, ``parallelism.hierarchical_dp_critical_batch`` for 11.5, ``ep_critical_width`` for
11.7), the check cannot tell and accepts it; the chapter says so.
"""

from __future__ import annotations

import math

from .. import chip_internals as ci
from .. import collectives as coll
from .. import parallelism as par
from ..hardware import get_chip
from ..models import MIXTRAL_8X7B, get_model
from ..units import sci
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
    ref_chip = get_chip(_GEN_CHIP[gen])
    own_peak = ci.sm_peak_flops(ref_chip)
    own_clocks = {ref_chip.tensor_clock, ref_chip.boost_clock} - {clock_mhz * 1e6}
    hints = []
    if not _close(own_peak, ref, 0.01):
        hints.append((lambda a: _close(a, own_peak, 0.01),
                      f"that is the {ref_chip.display_name}'s own peak ({ref_chip.sm_count} "
                      f"SMs at {ref_chip.tensor_clock / 1e9:.2f} GHz); this GPU has {sms} "
                      f"SMs at {clock_mhz:,} MHz: take only the per-SM rate from it."))
    if any(not _close(sms * r * f, ref, 0.01) for f in own_clocks):
        hints.append((lambda a: any(_close(a, sms * r * f, 0.01) for f in own_clocks),
                      f"that uses the {ref_chip.display_name}'s clock; this GPU's Tensor Cores "
                      f"run at {clock_mhz:,} MHz = {clock_mhz / 1e3:.2f}e9 Hz."))
    return hints + [
        (lambda a: _close(a, ref / 2), half),
        (lambda a: _close(a, ref * 2), double),
        (lambda a: _close(a, ref * 4), "4x too large: the rate is per SM, all 4 Tensor "
                                       "Cores together; do not multiply by them again."),
        (lambda a: _close(a, ref / 4), "4x too small: the rate per SM covers its 4 Tensor "
                                       "Cores; multiply by the SMs, not the Tensor Cores."),
    ] + _own_chip_hints(sms, clock_mhz, gen, ref)


def _own_chip_hints(sms, clock_mhz, gen, ref):
    """The reference GPU's own SM count taken for this GPU's (its own clock, and its own
    peak, have hints of their own in _ex1_hints)."""
    c = get_chip(_GEN_CHIP[gen])
    mhz = c.tensor_clock / 1e6
    own = [("SM count", _ex1(c.sm_count, clock_mhz, gen))]
    return [(lambda a, v=v: _close(a, v, 0.005),
             f"that uses the {c.display_name}'s own {what} ({c.sm_count} SMs at {mhz:,.0f} "
             f"MHz); this GPU has {sms} SMs at {clock_mhz:,} MHz.")
            for what, v in own if not math.isclose(v, ref, rel_tol=0.03)]


def _ex1_words(sms, clock_mhz, gen):
    aside = (" (the H100 PCIe card's figures)"
             if (sms, clock_mhz, gen) == (114, 1620, "hopper") else "")
    return {"gen_name": _GEN_NAME[gen], "ref_chip": _name(_GEN_CHIP[gen]), "aside": aside,
            "a_gen": "an Ampere" if gen == "ampere" else "a Hopper",
            "A_gen": "An Ampere" if gen == "ampere" else "A Hopper"}


register(VariedNumericExercise(
    id="11.1", title="The peak of an H100 PCIe from its SMs", unit="FLOP/s", rtol=0.01,
    params={"sms": 114, "clock_mhz": 1620, "gen": "hopper"},
    choose={"sms": (96, 108, 114, 120, 128, 132, 144), "clock_mhz": (1410, 1620, 1755,
                                                                    1830, 1980),
            "gen": ("ampere", "hopper")},
    solve=_ex1, hints_for=_ex1_hints, describe=_ex1_words,
    variant_title="The peak of {a_gen} GPU from its SMs",
    statement="{A_gen} GPU has {sms} SMs whose Tensor Cores run at {clock_mhz:,} MHz{aside}. "
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
    last = (w.tiles - (w.waves - 1) * w.sms) / w.sms
    hints = [
        (lambda a: _close(a, 1.0, 0.005), "the last wave is not full: count the waves, "
                                          "ceil(tiles / SMs), and the SM-tile slots they offer."),
        (lambda a: _close(a, 100 * w.efficiency, 0.01), "give a fraction (0.5 for half), "
                                                        "not a percentage."),
        (lambda a: _close(a, 1 - w.efficiency, 0.01),
         "that is the idle share, the slots with no tile; the question asks for the share "
         "that compute one: 1 minus it."),
        (lambda a: w.waves > 1 and _close(a, last, 0.01),
         "that is the last wave's fill alone; count the slots of all the waves: tiles / "
         "(waves x SMs)."),
        (lambda a: _close(a, w.tiles / w.sms, 0.01) and w.waves > 1,
         "tiles / SMs is more than 1, not a share: divide the tiles by the slots of all "
         "the waves, waves x SMs."),
    ]
    for other in sorted({108, 114, 132, 148} - {w.sms}):     # another GPU's SM count
        share = w.tiles / (math.ceil(w.tiles / other) * other)
        if not math.isclose(share, w.efficiency, rel_tol=0.03):
            hints.append((lambda a, share=share: _close(a, share, 0.005),
                          f"this {_name(chip)} has {w.sms} SMs, so {w.sms} tiles a wave."))
    turned = _waves(B, F, chip, tile=(256, 128)).efficiency
    if not math.isclose(turned, w.efficiency, rel_tol=0.03):
        hints.append((lambda a: _close(a, turned, 0.005),
                      "the tile is t_B x t_F = 128 x 256: 128 rows of B by 256 columns of "
                      "F, not the other way round."))
    if floor_tiles and floor_tiles != w.tiles:
        fw = math.ceil(floor_tiles / w.sms)
        hints.append((lambda a: _close(a, floor_tiles / (fw * w.sms), 0.01),
                      "round the tile counts up: a partial tile at the edge still takes "
                      "an SM."))
    return hints


def _ex2_ok(B, F, chip):
    return _ex2(B, F, chip) < 0.99


register(VariedNumericExercise(
    id="11.2", title="SM-tile slots a small matmul uses", unit="fraction", rtol=0.01,
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
    hints = [
        (lambda a: _close(a, ring), "that is the ring's whole time; subtract what the "
                                    "in-switch reduction takes, M / W_nvl."),
        (lambda a: _close(a, sharp),
         "that is M / W_nvl, the time with in-switch reduction"
         + (" (and, with n = 4, also twice the saving)" if n == 4 else "")
         + ": the saving is the ring's 2 (n - 1) / n M / W_nvl minus it."),
        (lambda a: _close(a, ref * c.ici_links), "use all of a GPU's NVLinks together "
                                                 "(its ici_bandwidth), not one link."),
        (lambda a: _close(a, ref * 2 ** 20 / 1e6, 0.005),
         "off by a binary/decimal prefix: 1 MB is 1e6 bytes here."),
        (lambda a: _close(a, ring / sharp),
         "that is how many times faster the in-switch reduction is; the question asks for "
         "the seconds it saves."),
        (lambda a: _close(a, -ref), "a saving is the ring's time minus the in-switch time: "
                                    "a positive number of seconds."),
    ] + ([
        (lambda a: _close(a, _ex3(8, MB, chip)),
         f"the ring runs over the {n} GPUs that all-reduce, not the node's 8: "
         f"(n - 1) / n = {n - 1}/{n}."),
    ] if n != 8 else [])
    one_phase = ("the ring all-reduce sends 2 (n - 1) / n M from each GPU (a reduce-scatter "
                 "and an all-gather), not (n - 1) / n M")
    two_way = (f"W_nvl is one direction, the GPU's ici_bandwidth ({sci(c.ici_bandwidth)} "
               f"bytes/s), not the two-way figure NVIDIA quotes ({sci(2 * c.ici_bandwidth)})")

    def one_phase_slip(a):
        return (_close(a, ((n - 1) / n - 1) * M / c.ici_bandwidth)
                or _close(a, (1 - (n - 1) / n) * M / c.ici_bandwidth))
    if one_phase_slip(ref / 2):        # n = 4: the two slips give the same number
        hints.append((lambda a: one_phase_slip(a) or _close(a, ref / 2),
                      f"half the saving: {one_phase}; and {two_way}."))
    else:
        hints += [(one_phase_slip, one_phase + "."),
                  (lambda a: _close(a, ref / 2), f"half the saving: {two_way}.")]
    return hints


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
    nvl_one = 7 / 8 * M / c.ici_bandwidth
    nvl_two = 2 * nvl_one
    ref = _ex4(nodes, chip, dtype)
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
    ] + _ex4_short_hints(ref, nvl_one, nic_only / 2, c) + [
        (lambda a: _close(a, ref * 2 ** 30 / 1e9, 0.005)
         or _close(a, ref * 1e9 / 2 ** 30, 0.005),
         "off by 2**30 / 1e9 = 1.074: the gradient's bytes and the bandwidths are both "
         "decimal (1 GB = 1e9 bytes); do not convert one of them to GiB."),
        (lambda a: _close(a, ref - nvl_two + nvl_two * c.ici_links, 0.005),
         "the NVLink phases use all of a GPU's links together (its ici_bandwidth), not "
         "one link."),
        (lambda a: _close(a, ref - nic_only + nic_only / 8, 0.005),
         "the card's dcn_bandwidth is already in bytes/s (400 Gb/s is 5e10 bytes/s): do "
         "not multiply it by 8."),
        (lambda a: _close(a, ref - nic_only + nic_only * (n - 1) / n * nodes / (nodes - 1),
                          0.005) and nodes > 1,
         f"between nodes the ring has one GPU per node, the {nodes} that hold the same "
         f"block: (n - 1) / n = {nodes - 1}/{nodes}, not {n - 1}/{n}."),
    ]


def _ex4_short_hints(ref, nvl_one, nic_half, c):
    """One NVLink phase left out (or NVLink taken at its two-way rate, the same number),
    and the card's all-reduce counted as (m - 1)/m instead of 2 (m - 1)/m: one hint that
    names all three where the two numbers are too close to tell apart."""
    nvlink = ("count both NVLink phases: the reduce-scatter before the cards and the "
              "all-gather after them, (g - 1) / g M / W_nvl each, at the one-way "
              f"ici_bandwidth ({sci(c.ici_bandwidth)} bytes/s, not the two-way "
              f"{sci(2 * c.ici_bandwidth)})")
    card = ("the all-reduce between nodes sends 2 (m - 1) / m (M / g) on each card (a "
            "reduce-scatter and an all-gather), not (m - 1) / m (M / g)")
    if _close(ref - nvl_one, ref - nic_half):
        return [(lambda a: _close(a, ref - nvl_one) or _close(a, ref - nic_half),
                 f"one part is half what it should be: {nvlink}; and {card}.")]
    return [(lambda a: _close(a, ref - nvl_one), nvlink + "."),
            (lambda a: _close(a, ref - nic_half), card + ".")]


register(VariedNumericExercise(
    id="11.4", title="A hierarchical all-reduce of 8B's gradient", unit="s", rtol=0.02,
    params={"nodes": 4, "chip": "gpu-h100", "dtype": "bf16"},
    choose={"nodes": (2, 4, 8, 16, 32), "chip": ("gpu-a100", "gpu-h100", "gpu-b200"),
            "dtype": ("bf16", "fp32")},
    solve=_ex4, hints_for=_ex4_hints, ring=lambda nodes, chip, dtype: (8, nodes),
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
        *[(lambda a, o=o: _close(a, ref * get_chip(o).bf16_flops / get_chip(chip).bf16_flops,
                                 0.005),
           f"use the {_name(chip)}'s own peak C ({get_chip(chip).bf16_flops:.3g} FLOP/s), "
           f"not the {_name(o)}'s.")
          for o in ("gpu-a100", "gpu-h100", "gpu-b200") if o != chip],
        (lambda a: _close(a, ref * 4 / 6, 0.005),
         "2/3 of the answer: that counts 6 FLOPs per weight element and token (the whole "
         "step's 6 N); the gradient's all-reduce overlaps the backward pass alone, 4 FLOPs "
         "(two matmuls of 2), so b >= C T_comm(s) / 4."),
    ] + ([
        (lambda a: _close(a, ref * (8 * nodes - 1) / (8 * nodes) * nodes / (nodes - 1),
                          0.005),
         f"between nodes the ring has one GPU per node: (n - 1) / n = {nodes - 1}/{nodes}, "
         f"not {8 * nodes - 1}/{8 * nodes}."),
    ] if nodes > 1 and ref > par.data_parallel_critical_batch(chip, 8) * 1.03 else [])


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


# 11.6 the TP bound ----------------------------------------------------------------------
_WHERE = {"cards": ("dcn", "in different nodes",
                    "on the GPUs' network cards (`dcn_bandwidth`, a one-way ring)",
                    "over the network cards"),
          "nvlink": ("ici", "of one node",
                     "over NVLink, through the switch (`ici_bandwidth`)", "over NVLink")}


def _model_name(model):
    return "LLaMA-3 " + model.split("-")[1].upper()


def _ex6(model="llama3-405b", chip="gpu-h100", where="cards", matmuls=3, s=2,
         other_net=False):
    """The bound 1 + matmuls F W / (s C) on the TP degree (not rounded)."""
    c = get_chip(chip)
    kind = _WHERE[where][0]
    if other_net:
        kind = "ici" if kind == "dcn" else "dcn"
    W = c.dcn_bandwidth if kind == "dcn" else c.ici_bandwidth
    return 1 + matmuls * get_model(model).d_ff * W / (s * c.bf16_flops)


def _ex6_hints(model, chip, where):
    ref = _ex6(model, chip, where)
    other = "NVLink's ici_bandwidth" if where == "cards" else "the cards' dcn_bandwidth"
    right = "the cards (dcn_bandwidth)" if where == "cards" else "NVLink (ici_bandwidth)"
    return [
        (lambda a: a in (math.floor(ref), math.ceil(ref)) and not _close(a, ref, 0.005),
         "that is the bound rounded to whole GPUs; give the bound itself, unrounded (the "
         "solution goes on to the degree you can use)."),
        (lambda a: _close(a, _ex6(model, chip, where, other_net=True), 0.005),
         f"that uses {other}; here the all-reduce runs on {right}."),
        (lambda a: _close(a, _ex6(model, chip, where, matmuls=2), 0.005),
         "the gated MLP has 3 matmuls (gate, up, down) behind its one all-reduce, not 2."),
        (lambda a: _close(a, ref - 1, 0.005),
         "the ring's (n - 1)/n gives n - 1 <= 3 F W / (s C): add the 1."),
        (lambda a: _close(a, _ex6(model, chip, where, s=1), 0.005),
         "the activations the all-reduce carries are bf16: s = 2 bytes per element"
         + (" (or did you take a two-way ring? on the cards it is one-way, W = "
            "dcn_bandwidth)." if where == "cards" else ".")),
        (lambda a: _close(a, _ex6(model, chip, where, s=4), 0.005),
         "the activations the all-reduce carries are bf16: s = 2 bytes per element."),
        (lambda a: _close(a, 1 + 8 * (ref - 1), 0.005) and where == "cards",
         "the card's dcn_bandwidth is already in bytes/s (400 Gb/s is 5e10 bytes/s): do "
         "not multiply it by 8."),
        (lambda a: _close(a, 1 + (ref - 1) * get_model(model).d_model
                          / get_model(model).d_ff, 0.005),
         "the MLP's matmuls are D x F: the FLOPs per all-reduced element grow with F "
         "(d_ff), not D."),
    ]


register(VariedNumericExercise(
    id="11.6", title="The TP bound over the network cards",
    unit="GPUs (the bound, unrounded)", rtol=0.005,
    params={"model": "llama3-405b", "chip": "gpu-h100", "where": "cards"},
    choose={"model": ("llama3-8b", "llama3-70b", "llama3-405b"),
            "chip": ("gpu-a100", "gpu-h100", "gpu-b200"), "where": ("cards", "nvlink")},
    solve=lambda model, chip, where: _ex6(model, chip, where), hints_for=_ex6_hints,
    describe=lambda model, chip, where: {
        "model_name": _model_name(model), "F": get_model(model).d_ff,
        "chip_name": _name(chip), "where_text": _WHERE[where][1],
        "net_text": _WHERE[where][2], "where_title": _WHERE[where][3]},
    variant_title="The TP bound {where_title}",
    statement="{model_name}'s gated MLP ($F$ = {F:,}, three matmuls: gate, up and down) is "
              "split with tensor parallelism over {chip_name} GPUs {where_text}, so that "
              "its all-reduce of the activations runs {net_text}. What bound does the rule "
              "of section 11.4 put on the tensor-parallel degree $n_{{\\mathrm{{tp}}}}$? "
              "Give the bound itself, not rounded (a degree you can use is a whole number "
              "at most this that divides the heads and $F$).",
))


# 11.7 expert width across nodes ----------------------------------------------------------
_MM_TEXT = {2: "two matmuls (4 D F FLOPs per copy, forward)",
            3: "three matmuls (a gated MLP: gate, up and down, 6 D F FLOPs per copy, "
               "forward)"}


def _ex7(chip="gpu-h100", n_ep=32, matmuls=3):
    return par.ep_critical_width(chip, n_ep, matmuls=matmuls)


def _ex7_hints(chip, n_ep, matmuls):
    c = get_chip(chip)
    ref = _ex7(chip, n_ep, matmuls)
    C, s, Wn, Wd = c.bf16_flops, 2, c.ici_bandwidth, c.dcn_bandwidth

    def width(t):            # F* for a per-byte all-to-all time t
        return C * s * t / matmuls
    flat = width((n_ep - 1) / n_ep / Wd)
    nic_part = width((n_ep - 8) / n_ep / Wd)
    other = 2 if matmuls == 3 else 3
    return [
        (lambda a: _close(a, flat), "that sends all (n - 1) / n of the copies on the card; "
                                    "the 7 / n_ep for the GPU's own node go over NVLink."),
        (lambda a: _close(a, nic_part) and not _close(ref, nic_part),
         "add the NVLink part: (8 - 1) / n_ep of the bytes, at the NVLink bandwidth."),
        (lambda a: _close(a, width(7 / 8 / Wn + (n_ep - 8) / n_ep / Wd))
         or _close(a, width(7 / 8 / Wn + 1 / 8 / Wd)),
         "of a GPU's n_ep - 1 peers 7 share its node: 7 / n_ep of its copies stay on "
         "NVLink (not 7/8), (n_ep - 8) / n_ep leave on the card."),
        (lambda a: _close(a, ref * matmuls / other),
         f"this expert has {matmuls} matmuls, {2 * matmuls} D F FLOPs per routed copy: "
         f"F* = C T(s) / {matmuls}."),
        (lambda a: _close(a, ref * 2), "2x too large: dispatch and combine are 2 all-to-alls, "
                                       "each moving a copy's D s bytes once, and in bf16 "
                                       "s = 2 bytes, not 4."),
        (lambda a: _close(a, ref / 2), "2x too small: count both all-to-alls (dispatch and "
                                       "combine) of D s bytes per routed copy."),
        (lambda a: _close(a, width(7 / n_ep / Wn + (n_ep - 8) / n_ep / (8 * Wd)), 0.005),
         "the card's dcn_bandwidth is already in bytes/s (400 Gb/s is 5e10 bytes/s): do "
         "not multiply it by 8."),
        (lambda a: _close(a, width(3 / n_ep / Wn + (n_ep - 4) / n_ep / Wd), 0.005),
         "the nodes hold 8 GPUs each: 7 of a GPU's peers share its node (NVLink), "
         "n_ep - 8 are on other nodes (the card)."),
        (lambda a: _close(a, ref * matmuls, 0.005),
         f"the expert's FLOPs per routed copy are {2 * matmuls} D F against the "
         f"all-to-alls' 2 D s bytes: F* = C T(s) / {matmuls}."),
    ]


register(VariedNumericExercise(
    id="11.7", title="Expert width for all-to-alls across H100 nodes", unit="elements of F",
    rtol=0.02,
    params={"chip": "gpu-h100", "n_ep": 32, "matmuls": 3},
    choose={"chip": ("gpu-a100", "gpu-h100", "gpu-b200"), "n_ep": (16, 24, 32, 48, 128),
            "matmuls": (2, 3)},
    solve=_ex7, hints_for=_ex7_hints,
    describe=lambda chip, n_ep, matmuls: {"chip_name": _name(chip), "nodes": n_ep // 8,
                                          "mm_text": _MM_TEXT[matmuls]},
    variant_title="Expert width for all-to-alls across {chip_name} nodes",
    statement="An MoE layer's experts are split over {n_ep} {chip_name} GPUs in {nodes} "
              "nodes of 8. Each routed copy of a token goes to its expert's GPU in the "
              "dispatch all-to-all and back in the combine, over NVLink when that GPU is "
              "in the same node and on the GPU's card otherwise, the two parts one after "
              "the other, bf16. Above what expert width $F$ do the two all-to-alls hide "
              "behind the expert's {mm_text}?",
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
        (lambda a: _close(a, ref * 8),
         "8x too large: each GPU holds 1 / (8 pp) of the parameters (TP splits them 8 "
         "ways), and each GPU has its own card: the node's 8 do not share one."),
        (lambda a: _close(a, ref * pp) or _close(a, ref * 8 * pp),
         "each GPU holds 1 / (8 pp) of the parameters: TP splits them 8 ways and the "
         "pipeline pp ways."),
        (lambda a: _close(a, ref * h.dcn_bandwidth / h.ici_bandwidth),
         "the data-parallel peers are in other nodes: the card's dcn_bandwidth, not NVLink."),
        (lambda a: _close(a, ref / dp),
         f"the reduce-scatter's input is the GPU's whole shard, 1 / (8 pp) of the "
         f"parameters (TP and the stages split them); the {dp} data-parallel ranks hold "
         f"copies of it, so do not divide by them too (its output is 1/{dp} of it)."),
        (lambda a: _close(a, ref * 2 ** 30 / 1e9, 0.005)
         or _close(a, ref * 1e9 / 2 ** 30, 0.005),
         "off by 2**30 / 1e9 = 1.074: the shard's bytes and the card's bandwidth are both "
         "decimal (1 GB = 1e9 bytes); do not convert one of them to GiB."),
    ]


register(VariedNumericExercise(
    id="11.8", title="LLaMA-3's gradient reduce-scatter on the cards", unit="s", rtol=0.02,
    params={"model": "llama3-405b", "pp": 16, "dp": 128, "dtype": "fp32"},
    choose={"model": ("llama3-70b", "llama3-405b"), "pp": (4, 8, 16),
            "dp": (16, 32, 64, 128), "dtype": ("bf16", "fp32")},
    solve=_ex8, hints_for=_ex8_hints, ring=lambda model, pp, dp, dtype: dp,
    describe=lambda model, pp, dp, dtype: {"model_name": _model_name(model),
                                           "n": 8 * pp * dp,
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
        (lambda a: _close(a, _ex9(weight_bytes=2, gpus=1)),
         "16x too large: fp8 weights take 1 byte each, and the 8 GPUs each read their own "
         "1/8 at once."),
        (lambda a: _close(a, _ex9() * 1e9 / 2 ** 30, 0.005),
         "off by a binary/decimal prefix: the bandwidth is in bytes/s, decimal."),
        (lambda a: _close(a, _ex9() * get_chip("gpu-h100").hbm_bandwidth
                          / get_chip("gpu-h100").ici_bandwidth),
         "each GPU reads its weights from its own HBM (hbm_bandwidth), not over NVLink."),
        (lambda a: 0 < a < _ex9() / 20,
         "far too small: at batch 1 the FLOPs take almost no time; the step waits for the "
         "weights to be read from HBM."),
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
        elif slip.get("one_nvlink"):
            t = nv / 2 + nic
        elif slip.get("card_half"):
            t = nv + nic / 2
        elif slip.get("flat"):
            t = 2 * (g * m - 1) / (g * m) * nbytes / slow
        elif slip.get("card_bits"):
            t = nv + nic / 8
        elif slip.get("split_nodes"):
            t = nv + 2 * (m - 1) / m * nbytes / m / slow
        elif slip.get("node_ring"):
            t = nv + 2 * (g - 1) / g * nbytes / g / slow
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
        (_variant(one_nvlink=True), "count both NVLink phases: the reduce-scatter before the "
                                    "cards and the all-gather after them, (local - 1) / local "
                                    "x nbytes / ici_bandwidth each."),
        (_variant(flat=True), "that is one flat ring on the cards; reduce inside the node "
                              "first."),
        (_variant(card_half=True), "between nodes the block is all-reduced: 2 (nodes - 1) / "
                                   "nodes x (nbytes / local) on the card, a reduce-scatter "
                                   "and an all-gather, not (nodes - 1) / nodes x it."),
        (_variant(card_bits=True), "the chip's dcn_bandwidth is already in bytes/s: do not "
                                   "multiply it by 8."),
        (_variant(split_nodes=True), "between nodes each GPU all-reduces the 1/local block "
                                     "it holds after the node's reduce-scatter, not "
                                     "1/nodes of the array."),
        (_variant(node_ring=True), "between nodes the ring has one GPU per node: its factor "
                                   "is 2 (nodes - 1) / nodes, not the node's (local - 1) / "
                                   "local."),
    ],
))


# 11.11 wave quantization in code ---------------------------------------------------------
def _waves_ref(B, F, sms, tile_b, tile_f):
    chip = get_chip("gpu-h100").with_(sm_count=sms)
    return ci.wave_quantization(B, F, chip, tile=(tile_b, tile_f)).efficiency


# The first case tells floor from ceil (B and F not multiples of the tile: floor gives
# 1 x 3 = 3 tiles, ceil 2 x 4 = 8), all in one wave that leaves most SMs idle; the fourth
# has a partial last wave (192 tiles on 148 SMs); the third tells t_B x t_F from the tile
# turned round (2 x 40 = 80 tiles against 1 x 79: on the others the two give the same
# share); the others vary the tiles and the SMs.
_CASES_11 = [(200, 1000, 132, 128, 256), (4096, 28672, 132, 128, 256),
             (96, 5000, 108, 64, 128), (1000, 3000, 148, 128, 128),
             (8192, 8192, 132, 256, 128)]


def _draw_11(rng):
    return (rng.choice((16, 96, 200, 512, 777, 2048, 4096)),
            rng.choice((1000, 4096, 14336, 28672, 53248)), rng.choice((108, 114, 132, 148)),
            rng.choice((64, 128, 256)), rng.choice((64, 128, 256)))


def _useful(got, want, args):
    """The useful share, section 11.1's other measure (real output over all the slots'
    tile area), where it differs from the slots used."""
    B, F, sms, tb, tf = args
    tiles = math.ceil(B / tb) * math.ceil(F / tf)
    useful = B * F / (math.ceil(tiles / sms) * sms * tb * tf)
    v = _num(got)
    return (v is not None and not math.isclose(useful, want, rel_tol=1e-9)
            and math.isclose(v, useful, rel_tol=1e-9))


def _eff_with(got, args, floor=False, waves=True, turned=False):
    B, F, sms, tb, tf = args
    if turned:
        tb, tf = tf, tb
    tiles = (B // tb) * (F // tf) if floor else math.ceil(B / tb) * math.ceil(F / tf)
    if tiles == 0:
        return False
    eff = tiles / (math.ceil(tiles / sms) * sms) if waves else min(1.0, tiles / sms)
    v = _num(got)
    return v is not None and math.isclose(v, eff, rel_tol=1e-9)


register(CodeExercise(
    id="11.11", title="Waves of tiles, in code", reference=_waves_ref, cases=_CASES_11,
    generate=_draw_11, rtol=1e-9, unit="fraction",
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
        (_useful, "that is the useful share, padding counted out (section 11.1's other "
                  "measure); here a tile counts whole, padded or not: tiles / (waves x sms)."),
        (lambda got, want, args: _num(got) is not None and _num(got) >= 1
         and _num(got) == math.ceil(math.ceil(args[0] / args[3]) * math.ceil(args[1] / args[4])
                                    / args[2]),
         "that is the number of waves; return the share of their SM-tile slots that compute "
         "a tile, tiles / (waves x sms)."),
        (lambda got, want, args: _num(got) is not None and math.isclose(
            _num(got), args[0] * args[1] / (math.ceil(args[0] / args[3]) * args[3]
                                            * math.ceil(args[1] / args[4]) * args[4]),
            rel_tol=1e-9),
         "that is the share of the tiles' elements that are real (the padding); count SM-tile "
         "slots instead: tiles / (waves x sms)."),
        (lambda got, want, args: _eff_with(got, args, turned=True),
         "the tile is t_B x t_F: tile_b cuts B and tile_f cuts F, not the other way round."),
    ],
))


# 11.12 a hierarchical reduce-scatter in shard_map ---------------------------------------
def _P(*entries):
    from jax.sharding import PartitionSpec
    return PartitionSpec(*entries)


def _build_12(answer, case, mesh):
    import jax
    from jax.sharding import NamedSharding
    rows, cols = case
    (g,) = mesh_inputs([(8 * rows, cols)], seed=rows * 31 + cols)
    spec = _P(("node", "gpu"))
    x = jax.device_put(g, NamedSharding(mesh, spec))
    fn = jax.jit(jax.shard_map(returns_something(answer), mesh=mesh, in_specs=spec,
                               out_specs=spec))
    return fn, (x,)


def _expected_12(case, x):
    import numpy as np
    rows, cols = case
    return np.asarray(x).reshape(8, rows, cols).sum(axis=0)


def _numbers_12(got, want, case):
    """The right sums in the wrong places: device (node i, gpu j) holding chunk 2 j + i
    (a tiled scatter over "gpu", then over "node") where the out spec wants 4 i + j."""
    import numpy as np
    rows, cols = case
    k = rows // 8
    if got.shape != want.shape or rows % 8:
        return None
    swapped = want.reshape(4, 2, k, cols).transpose(1, 0, 2, 3).reshape(rows, cols)
    if np.allclose(got, swapped, rtol=1e-5, atol=1e-5 * float(np.abs(want).max() or 1)):
        return ("the right sums in the wrong places. Scattering the rows over 'gpu' and "
                "then over 'node' leaves device (node i, gpu j) chunk 2 j + i of the "
                "result; the out spec P(('node', 'gpu')) wants chunk 4 i + j there. View "
                "the block as [2, 4, rows / 8, cols] (chunk 4 i + j at [i, j]): scatter "
                "dimension 1 over 'gpu', then dimension 0 over 'node'.")
    return None


def _collectives_12(records, case):
    rows, cols = case
    block = rows * cols * 4
    kinds = [r.kind for r in records]
    if kinds == ["reduce-scatter"] and records[0].group_size == 8:
        return ("that is one flat reduce-scatter over all 8 devices, 4/8 of whose ring steps "
                "cross the nodes' cards with the whole block's chunks; reduce-scatter over "
                "'gpu' first (NVLink), then over 'node' on the quarter each device holds")
    if "all-reduce" in kinds:
        return ("an all-reduce sends twice the bytes of a reduce-scatter and leaves every "
                "device the whole sum; scatter instead: over 'gpu', then over 'node'")
    if kinds != ["reduce-scatter", "reduce-scatter"]:
        return ("expected a reduce-scatter over 'gpu' and then a reduce-scatter over "
                "'node'")
    first, second = records
    if (first.group_size, second.group_size) == (2, 4):
        return ("the reduce-scatter over 'node' comes first and acts on the whole block: "
                "the cards carry 4x the bytes they need; scatter over 'gpu' (NVLink) first, "
                "then over 'node' on the quarter each device holds")
    if (first.group_size, second.group_size) != (4, 2):
        return ("the first reduce-scatter runs over the 4 devices of 'gpu' (a node), the "
                "second over the 2 of 'node'")
    if not (math.isclose(first.bytes_per_device, coll.ring_bytes("reduce-scatter", block, 4))
            and math.isclose(second.bytes_per_device,
                             coll.ring_bytes("reduce-scatter", block / 4, 2))):
        return ("the first reduce-scatter should act on the whole block and the second on "
                "the quarter of it the first leaves each device")
    return None


register(MeshProgramExercise(
    id="11.12", title="A hierarchical reduce-scatter in shard_map", build=_build_12,
    expected=_expected_12, collectives_ok=_collectives_12, numbers_hint=_numbers_12,
    cases=[(16, 16), (32, 8), (8, 32)], mesh_shape=MESH_SHAPE, mesh_axes=MESH_AXES,
    describe=lambda rows, cols: f"a [{rows}, {cols}] block per device",
    error_hints=[("must match shard count",
                  "psum_scatter without tiled=True needs the scattered dimension to have "
                  "exactly as many entries as the axis has devices (4 on 'gpu', 2 on "
                  "'node'), and drops it: reshape the block so that it does, e.g. to "
                  "[2, 4, rows / 8, cols], or pass tiled=True to cut a dimension into equal "
                  "pieces."),
                 ("not divisible", "psum_scatter with tiled=True cuts the scattered "
                                   "dimension into as many pieces as the axis has "
                                   "devices.")],
))


# 11.13 experts of Mixtral's shape across nodes ------------------------------------------
_EP13 = {"chip": "gpu-h100", "n_ep": 64, "matmuls": 3}


def _ex13():
    F = MIXTRAL_8X7B.dense.d_ff
    return "compute" if F >= par.ep_critical_width(**_EP13) else "communication"


register(ChoiceExercise(
    id="11.13", title="Experts of Mixtral's shape across H100 nodes",
    choices=("compute", "communication"), reference=_ex13,
    aliases={"compute-bound": "compute", "communication-bound": "communication"},
    hints={"communication": "a gated expert does 3 matmuls per routed copy (6 D F FLOPs, "
                            "forward), so F* = C T(s) / 3, not / 2; and of a GPU's copies "
                            "only 56/64 leave the node on the card, 7/64 stay on NVLink. "
                            "Then compare Mixtral's F with F*.",
           "compute": "compare the expert's F with F* = C T(s) / 3 for 64 H100s in 8 "
                      "nodes, T(s) the two-part all-to-all time of s bytes."},
))


# 11.14 the XLA flag ----------------------------------------------------------------------
_FLAGS = ("latency_hiding_scheduler", "all_gather_combine_threshold_bytes",
          "command_buffer", "triton_gemm")
_FULL = {"latency_hiding_scheduler": "xla_gpu_enable_latency_hiding_scheduler",
         "all_gather_combine_threshold_bytes": "xla_gpu_all_gather_combine_threshold_bytes",
         "command_buffer": "xla_gpu_enable_command_buffer",
         "triton_gemm": "xla_gpu_enable_triton_gemm"}

register(ChoiceExercise(
    id="11.14", title="The XLA flag for a gather that waits", choices=_FLAGS,
    reference=lambda: "latency_hiding_scheduler",
    aliases={**{full: short for short, full in _FULL.items()},
             **{"enable_" + short: short for short in _FLAGS},
             "latency_hiding": "latency_hiding_scheduler",
             "xla_gpu_latency_hiding_scheduler": "latency_hiding_scheduler",
             # as set in XLA_FLAGS
             **{_FULL[short] + setting: short
                for short, settings in (("latency_hiding_scheduler", ("=true", "=1")),
                                        ("triton_gemm", ("=true", "=false")))
                for setting in settings}},
    hints={"all_gather_combine_threshold_bytes":
           "combining merges small all-gathers into larger ones; these are already large, "
           "and a combined gather still waits for the matmuls unless the scheduler moves "
           "it.",
           "command_buffer": "command buffers (CUDA graphs) save kernel launch time; they "
                             "do not move a collective to overlap a matmul.",
           "triton_gemm": "that flag chooses matmul kernels (Triton or cuBLAS); it does not "
                          "schedule collectives."},
))
