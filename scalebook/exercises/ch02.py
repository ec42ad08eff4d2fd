"""Chapter 2 exercises: accelerators. Reference answers are computed from scalebook."""

from __future__ import annotations

import math

from .. import chip_internals, topology
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import ChoiceExercise, CodeExercise, NumericExercise, as_number


def _close(a, b, rtol=0.03):
    return math.isclose(a, b, rel_tol=rtol)


def _weights_70b() -> float:
    """Bytes of all LLaMA-3-70B weights in bf16."""
    return get_model("llama3-70b").weight_bytes(2)


# 2.1 ------------------------------------------------------------------------------------
register(NumericExercise(
    id="2.1", title="One MXU's share of a TPU v5p", unit="FLOP/s",
    reference=lambda: chip_internals.mxu_peak_flops("tpu-v5p"),
    hints=[
        (lambda a: _close(a, get_chip("tpu-v5p").bf16_flops / get_chip("tpu-v5p").mxus_per_core),
         "a v5p chip has two TensorCores, each with its own MXUs."),
        (lambda a: _close(a, get_chip("tpu-v5p").bf16_flops), "that is the whole chip; divide by its MXUs."),
        (lambda a: _close(a, chip_internals.mxu_peak_flops("tpu-v5p") / 2),
         "a multiply-add counts as 2 FLOPs (a multiply and an add)."),
    ],
))


# 2.2 ------------------------------------------------------------------------------------
# Cases are (B, D, F) for X[B, D] @ W[D, F] on a D x F array. The first case tells the
# mistakes apart: with D = 1 (the old first case, (1, 1, 1)) the weight-loading D extra
# cycles were the same as one cycle too many.
_CASES_2 = [(8, 128, 128), (3, 4, 5), (1, 1, 1), (256, 128, 128), (1, 256, 256), (100, 7, 3)]

register(CodeExercise(
    id="2.2", title="Cycles of a weight-stationary systolic array", reference=chip_internals.systolic_cycles,
    cases=_CASES_2, compare=lambda got, want: as_number(got) == want, unit="cycles",
    describe=lambda B, D, F: f"B={B}, D={D}, F={F}",
    hints=[
        (lambda got, want, args: as_number(got) == want + args[1],
         "leave out the weight-loading cycles (D of them): the weights are already in place."),
        (lambda got, want, args: as_number(got) == want + 1,
         "one cycle too many: cycle 0 already does work."),
        (lambda got, want, args: as_number(got) == want - 1, "one cycle short: count cycle 0 too."),
        (lambda got, want, args: as_number(got) == args[0], "B is only how long the rows take to "
         "enter; they still have to cross the D rows and F columns of cells."),
    ],
))


# 2.3 ------------------------------------------------------------------------------------
_K3, _N3 = 384, 640

register(NumericExercise(
    id="2.3", title="Padding waste on Trillium", unit="fraction (0 to 1)",
    reference=lambda: chip_internals.mxu_padding_efficiency(_K3, _N3, "tpu-v6e"),
    hints=[
        (lambda a: _close(a, chip_internals.mxu_padding_efficiency(_K3, _N3, "tpu-v5e")),
         "that is the answer for a 128 x 128 MXU; v6e's MXU is larger."),
        (lambda a: _close(a, 1 - chip_internals.mxu_padding_efficiency(_K3, _N3, "tpu-v6e")),
         "that is the wasted fraction; the question asks for the useful one."),
        (lambda a: a > 1, "a fraction of the work is between 0 and 1."),
    ],
))


# 2.4 ------------------------------------------------------------------------------------
def _torus_ref(src, dst, shape):
    return topology.torus_hops(src, dst, shape, wrap=True)


_CASES_4 = [((0, 0), (1, 1), (4, 4)), ((0, 0), (3, 3), (4, 4)), ((0,), (7,), (8,)),
            ((2, 0), (2, 14), (16, 16)), ((1, 1, 1), (3, 0, 7), (4, 4, 8)), ((5, 1), (0, 3), (8, 4))]

register(CodeExercise(
    id="2.4", title="Hops on a torus", reference=_torus_ref, cases=_CASES_4,
    compare=lambda got, want: as_number(got) == want, unit="hops",
    describe=lambda src, dst, shape: f"src={src}, dst={dst}, shape={shape}",
    hints=[
        (lambda got, want, args: as_number(got) == topology.torus_hops(*args, wrap=False),
         "that is the distance without wraparound links; the ends of each axis are joined."),
        (lambda got, want, args: as_number(got) == max(abs(a - b) for a, b in zip(args[0], args[1])),
         "hops along different axes add up; they are not done at the same time."),
    ],
))


# 2.5 ------------------------------------------------------------------------------------
_SHAPE5 = (4, 16)      # not 8x16: the chapter's slice table prints that one's diameter

register(NumericExercise(
    id="2.5", title="Diameter of a v5e 4x16 slice", unit="hops", integer=True,
    reference=lambda: topology.slice_info("tpu-v5e", _SHAPE5).diameter,
    hints=[
        (lambda a: a == topology.diameter(_SHAPE5, wrap=False),
         "the 16-long axis spans the whole pod, so it has a wraparound link."),
        (lambda a: a == topology.diameter(_SHAPE5, wrap=True),
         "only an axis that spans the full pod width wraps; the 4-long axis does not."),
    ],
))


# 2.6 ------------------------------------------------------------------------------------
# 405B, not 70B: the chapter's worked example prints the v5e chips that hold 70B.
def _weights_405b() -> float:
    return get_model("llama3-405b").weight_bytes(2)


register(NumericExercise(
    id="2.6", title="v5e chips to hold LLaMA-3-405B", unit="chips", integer=True,
    reference=lambda: math.ceil(_weights_405b() / get_chip("tpu-v5e").hbm_bytes),
    hints=[
        (lambda a: a == math.floor(_weights_405b() / get_chip("tpu-v5e").hbm_bytes),
         "round up: a fraction of a chip still needs a whole chip."),
        (lambda a: a == math.ceil(get_model("llama3-405b").num_params() / get_chip("tpu-v5e").hbm_bytes),
         "each bf16 weight takes 2 bytes."),
        (lambda a: a == math.ceil(_weights_405b() / (get_chip("tpu-v5e").hbm_bytes / 1e9 * 2**30)),
         "the hardware table gives HBM in bytes (16 GB = 16e9 bytes), not GiB."),
        (lambda a: a == math.ceil(_weights_70b() / get_chip("tpu-v5e").hbm_bytes),
         "that is LLaMA-3-70B (the chapter's example); this exercise asks about 405B."),
    ],
))


# 2.7 ------------------------------------------------------------------------------------
def _decode_floor(chip, n_chips, nbytes=None):
    nbytes = _weights_70b() if nbytes is None else nbytes
    return nbytes / (n_chips * get_chip(chip).hbm_bandwidth)


register(NumericExercise(
    id="2.7", title="Decode floor of LLaMA-3-70B on a v6e 4x4 slice", unit="s",
    reference=lambda: _decode_floor("tpu-v6e", 16),
    hints=[
        (lambda a: _close(a, _decode_floor("tpu-v6e", 1)),
         "the 16 chips each stream their own share of the weights at the same time."),
        (lambda a: _close(a, _decode_floor("tpu-v5e", 16)), "that is a v5e's HBM bandwidth."),
        (lambda a: _close(a, get_model("llama3-70b").num_params() / (16 * get_chip("tpu-v6e").hbm_bandwidth)),
         "bf16 weights take 2 bytes each."),
    ],
))


# 2.8 ------------------------------------------------------------------------------------
def _pcie_load(n_links):
    return _weights_70b() / (n_links * get_chip("tpu-v5e").pcie_bandwidth)


register(NumericExercise(
    id="2.8", title="Loading LLaMA-3-70B over PCIe", unit="s",
    reference=lambda: _pcie_load(16),
    hints=[
        (lambda a: _close(a, _pcie_load(1)), "every chip has its own PCIe link to its host; "
         "all 16 load their share at once."),
        (lambda a: _close(a, _pcie_load(2)), "count PCIe links per chip, not per host."),
    ],
))


# 2.9 ------------------------------------------------------------------------------------
def _dcn_copy(n_chips):
    return _weights_70b() / (n_chips * get_chip("tpu-v5e").dcn_bandwidth)


register(NumericExercise(
    id="2.9", title="Copying LLaMA-3-70B between two v5e pods over DCN", unit="s",
    reference=lambda: _dcn_copy(get_chip("tpu-v5e").ici_domain_chips),
    hints=[
        (lambda a: _close(a, _dcn_copy(1)), "each of the pod's chips sends its own share at once."),
        (lambda a: _close(a, _weights_70b() / (get_chip("tpu-v5e").ici_domain_chips
                                               * get_chip("tpu-v5e").ici_link_bandwidth)),
         "between pods there is no ICI; the bytes cross the data-centre network."),
    ],
))


# 2.10 -----------------------------------------------------------------------------------
def _faster_path():
    c = get_chip("tpu-v5e")
    return "pcie" if c.pcie_bandwidth > c.dcn_bandwidth else "dcn"


register(ChoiceExercise(
    id="2.10", title="PCIe reload or DCN copy?", choices=("pcie", "dcn"), reference=_faster_path,
    hints={"dcn": "compare the per-chip bandwidths: each chip has a PCIe link of its own, but "
                  "only a small share of its host's network card.",
           "pcie": "compare the per-chip bandwidths of the two paths."},
))


# 2.11 -----------------------------------------------------------------------------------
def _floor_ratio():
    return _decode_floor("tpu-v5e", 16) / _decode_floor("gpu-h100", 8)


register(NumericExercise(
    id="2.11", title="v5e slice versus eight H100s", unit="ratio (dimensionless)",
    reference=_floor_ratio,
    hints=[
        (lambda a: _close(a, 1 / _floor_ratio()), "upside down: v5e time divided by H100 time."),
        (lambda a: _close(a, get_chip("gpu-h100").hbm_bandwidth / get_chip("tpu-v5e").hbm_bandwidth),
         "that compares one chip with one chip; the slice has 16 chips and the node 8."),
    ],
))


# 2.12 -----------------------------------------------------------------------------------
# 1e6 bytes, so that the latency (6 us) is over a third of the answer: with 1e9 bytes it was
# 0.06% of it, below the 1% tolerance, and leaving it out passed.
_BYTES12, _LAT12 = 1e6, 1e-6
_SHAPE12 = (4, 4)


def _send_12(links=2, latency=_LAT12, wrap=None):
    wrap = topology.slice_wraparound("tpu-v5e", _SHAPE12) if wrap is None else wrap
    hops = topology.torus_hops((0, 0), (3, 3), _SHAPE12, wrap=wrap)
    return topology.transfer_time(_BYTES12, get_chip("tpu-v5e").ici_link_bandwidth, hops=hops,
                                  links=links, hop_latency=latency)


def _store_and_forward(a):
    copy = _BYTES12 / (2 * get_chip("tpu-v5e").ici_link_bandwidth)
    return _close(a, 6 * copy, 0.05) or _close(a, 6 * copy + 6 * _LAT12, 0.05)


register(NumericExercise(
    id="2.12", title="Corner to corner on a v5e 4x4 slice", unit="s", rtol=0.01,
    reference=lambda: _send_12(2),
    hints=[
        (lambda a: _close(a, _send_12(1), 0.01),
         "the corner chip has two links into the slice; split the bytes over both paths."),
        (lambda a: _close(a, _send_12(latency=0), 0.01),
         "add the latency: 1e-6 s for each of the hops; for a message this small it is a "
         "large part of the time."),
        (lambda a: _close(a, _send_12(wrap=True), 0.01),
         "a 4x4 v5e slice has no wraparound links (neither axis spans the pod's 16 chips): "
         "(0, 0) to (3, 3) is 3 + 3 hops."),
        (lambda a: _close(a, _send_12(latency=_LAT12 / 6), 0.01),
         "the latency is per hop: multiply it by the number of hops."),
        (_store_and_forward,
         "chips forward bytes as they arrive, so distance adds latency, not a copy per hop."),
    ],
))


# 2.13 -----------------------------------------------------------------------------------
def _vpu_limit(bytes_per_element=8, flops=None):
    """FLOPs per element above which a v5p elementwise op is VPU-bound, not HBM-bound."""
    c = get_chip("tpu-v5p")
    peak = c.vector_flops if flops is None else flops
    return peak * bytes_per_element / c.hbm_bandwidth


register(NumericExercise(
    id="2.13", title="When the vector unit is the limit", unit="FLOPs per element",
    reference=_vpu_limit,
    hints=[
        (lambda a: _close(a, _vpu_limit(1)),
         "that is FLOPs per byte; each element moves 8 bytes (a 4-byte read and a 4-byte "
         "write)."),
        (lambda a: _close(a, _vpu_limit(4)),
         "half the answer: each element moves 8 bytes (a 4-byte f32 read and a 4-byte "
         "write, not the read alone, not bf16), and vector_flops is already per chip (both "
         "TensorCores)."),
        (lambda a: _close(a, _vpu_limit(flops=get_chip("tpu-v5p").bf16_flops)),
         "that uses the MXUs' peak; elementwise work runs on the VPU (vector_flops)."),
    ],
))


# 2.14 -----------------------------------------------------------------------------------
def _pcie_batch(chip="tpu-v6e", bandwidth=None, s_w=2):
    c = get_chip(chip)
    return chip_internals.weight_stream_batch(c, bandwidth or c.pcie_bandwidth, s_w)


register(NumericExercise(
    id="2.14", title="Weights from host memory on a v6e", unit="tokens",
    reference=_pcie_batch,
    hints=[
        (lambda a: _close(a, _pcie_batch(bandwidth=get_chip("tpu-v6e").hbm_bandwidth)),
         "that is for weights read from HBM; these come from host memory over PCIe."),
        (lambda a: _close(a, _pcie_batch(s_w=1)), "half the answer: bf16 weights are 2 "
                                                  "bytes each, and pcie_bandwidth is one "
                                                  "direction (do not double it)."),
        (lambda a: _close(a, 8 * _pcie_batch()), "pcie_bandwidth is already per chip: do not "
                                                 "share it among the host's chips."),
        (lambda a: _close(a, 2 * _pcie_batch()),
         "a multiply-add is 2 FLOPs: X[B, D] @ W[D, F] does 2 B D F of them."),
        (lambda a: _close(a, _pcie_batch("tpu-v5e")),
         "those are the v5e's figures; use the v6e's peak and PCIe bandwidth."),
    ],
))
