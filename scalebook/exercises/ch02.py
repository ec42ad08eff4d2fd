"""Chapter 2 exercises: accelerators. Reference answers are computed from scalebook."""

from __future__ import annotations

import math

from .. import chip_internals, topology
from ..hardware import get_chip
from ..models import get_model
from .core import register
from .kinds import (ChoiceExercise, CodeExercise, NumericExercise,
                    VariedNumericExercise, as_number)


def _close(a, b, rtol=0.03):
    return math.isclose(a, b, rel_tol=rtol)


# Variants (for assignments; see kinds.VariedNumericExercise). The chapter's own numbers
# are each exercise's ``params``; an assignment draws others from ``choose``.
_ALL_CHIPS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "gpu-a100", "gpu-h100",
              "gpu-h200", "gpu-b200")
_TPUS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
# Slice shapes: 2D for v5e and v6e (16 x 16 pods), 3D for v4 and v5p (4 x 4 x 4 cubes).
_SHAPES_2D = ("2x2", "2x4", "4x4", "2x8", "4x8", "8x8", "2x16", "4x16", "8x16", "16x16")
_SHAPES_3D = ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "2x4x8", "4x4x8", "4x8x8",
              "8x8x8", "4x4x12", "8x8x16")
_SHORT = {"tpu-v4": "v4", "tpu-v5e": "v5e", "tpu-v5p": "v5p", "tpu-v6e": "v6e",
          "gpu-a100": "A100", "gpu-h100": "H100", "gpu-h200": "H200",
          "gpu-b200": "B200"}
_MODEL_TITLE = {"llama3-8b": "LLaMA-3-8B", "llama3-70b": "LLaMA-3-70B",
                "llama3-405b": "LLaMA-3-405B"}


def _a(word):
    """The article for a chip's short name: "a v6e", "an H100"."""
    return ("an " if word[0] in "AH" else "a ") + word


def _shape_fits(chip, shape):
    """Whether ``shape`` is a slice of ``chip`` (2D on v5e/v6e, 3D on v4/v5p)."""
    dims = topology.parse_shape(shape)
    if len(dims) != (2 if get_chip(chip).topology.startswith("2D") else 3):
        return False
    try:
        topology.slice_wraparound(chip, dims)
    except ValueError:
        return False
    return True


def _chips_in(shape):
    return math.prod(topology.parse_shape(shape))


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


def _draw_2(rng):
    """A batch of 1 to 1024 rows on an array of up to 256 x 256 cells (a v6e MXU), sides
    often a power of two (an MXU's), sometimes any size (a partly filled array)."""
    def side():
        if rng.random() < 0.5:
            return rng.choice((8, 16, 32, 64, 128, 256))
        return rng.randint(2, 256)
    return rng.randint(1, 1024), side(), side()


register(CodeExercise(
    id="2.2", title="Cycles of a weight-stationary systolic array", reference=chip_internals.systolic_cycles,
    cases=_CASES_2, generate=_draw_2,
    compare=lambda got, want: as_number(got) == want, unit="cycles",
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
# Weight sides of real models, most not multiples of 256 (a v6e's MXU): 384 (MiniLM),
# 576 and 960 (SmolLM2-135M and -360M), 896 and 4864 (Qwen2.5-0.5B), 1152 (Gemma 3 1B),
# 1408 (the experts of DeepSeek-V2-Lite), 1536 (Qwen2.5-1.5B), 1600 (GPT-2 XL), 2048
# (LLaMA-3.2-1B), 2880 (gpt-oss-20b).
_SIDES3 = (384, 576, 640, 896, 960, 1152, 1408, 1536, 1600, 2048, 2880, 4864)


def _ex3(K=_K3, N=_N3):
    return chip_internals.mxu_padding_efficiency(K, N, "tpu-v6e")


def _ex3_hints(K, N):
    return [
        (lambda a: _close(a, chip_internals.mxu_padding_efficiency(K, N, "tpu-v5e")),
         "that is the answer for a 128 x 128 MXU; v6e's MXU is larger."),
        (lambda a: _close(a, 1 - _ex3(K, N)),
         "that is the wasted fraction; the question asks for the useful one."),
        (lambda a: a > 1, "a fraction of the work is between 0 and 1."),
    ]


register(VariedNumericExercise(
    id="2.3", title="Padding waste on Trillium", unit="fraction (0 to 1)",
    params={"K": _K3, "N": _N3}, choose={"K": _SIDES3, "N": _SIDES3},
    solve=_ex3, hints_for=_ex3_hints,
    # Some padding (else there is no waste to find), and not square: the chapter plots
    # the useful fraction of square weights.
    valid=lambda K, N: K != N and _ex3(K, N) < 1,
    statement="A bf16 weight of shape $[{K}, {N}]$ is multiplied on a TPU v6e. What "
              "fraction of the MXU work is useful (not spent on padding)? Answer as a "
              "number between 0 and 1.",
))


# 2.4 ------------------------------------------------------------------------------------
def _torus_ref(src, dst, shape):
    return topology.torus_hops(src, dst, shape, wrap=True)


_CASES_4 = [((0, 0), (1, 1), (4, 4)), ((0, 0), (3, 3), (4, 4)), ((0,), (7,), (8,)),
            ((2, 0), (2, 14), (16, 16)), ((1, 1, 1), (3, 0, 7), (4, 4, 8)), ((5, 1), (0, 3), (8, 4))]

def _draw_4(rng):
    """Two chips of a ring, 2D or 3D torus with axes of 2 to 16 chips."""
    shape = tuple(rng.choice((2, 4, 8, 16, rng.randint(3, 16)))
                  for _ in range(rng.choice((1, 2, 2, 3, 3))))
    src = tuple(rng.randrange(n) for n in shape)
    dst = tuple(rng.randrange(n) for n in shape)
    return src, dst, shape


register(CodeExercise(
    id="2.4", title="Hops on a torus", reference=_torus_ref, cases=_CASES_4,
    generate=_draw_4,
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
# Not 8x16 (the chapter's slice table prints its diameter): the slices that table
# prints, and the shapes of its table of tori (the same number when every axis wraps).
_PRINTED5 = {("tpu-v5e", "2x4"), ("tpu-v5e", "4x4"), ("tpu-v5e", "8x16"),
             ("tpu-v5e", "16x16"), ("tpu-v6e", "16x16"), ("tpu-v5p", "2x4x4"),
             ("tpu-v5p", "4x4x8")}
_TORI5 = ("4x4", "16x16", "4x4x4")


def _ex5(chip="tpu-v5e", shape="4x16"):
    return topology.slice_info(chip, shape).diameter


def _ex5_hints(chip, shape):
    dims = topology.parse_shape(shape)
    wrap = topology.slice_wraparound(chip, dims)
    wrapping = [f"{n}-long" for n, w in zip(dims, wrap) if w]
    open_ = [f"{n}-long" for n, w in zip(dims, wrap) if not w]
    if len(dims) == 3:     # v4, v5p: wraparound from whole 4x4x4 cubes, on every axis
        no_wrap = ("every axis is a multiple of 4 (whole 4x4x4 cubes), so every axis "
                   "has a wraparound link.")
        all_wrap = ("wraparound links come from whole 4x4x4 cubes: unless every axis "
                    "is a multiple of 4, no axis wraps.")
    else:                  # v5e, v6e: an axis wraps when it spans the pod
        no_wrap = (f"the {wrapping[0]} axis spans the whole pod, so it has a "
                   f"wraparound link." if len(wrapping) == 1 else
                   "both axes span the whole pod, so both have wraparound links.")
        all_wrap = "only an axis that spans the full pod width wraps; " + (
            f"the {open_[0]} axis does not." if len(open_) == 1 else
            f"neither the {open_[0]} nor the {open_[1]} axis does.")
    hints = []
    if wrapping:
        hints.append((lambda a: a == topology.diameter(dims, wrap=False), no_wrap))
    if open_:
        hints.append((lambda a: a == topology.diameter(dims, wrap=True), all_wrap))
    return hints


register(VariedNumericExercise(
    id="2.5", title="Diameter of a v5e 4x16 slice", unit="hops", integer=True,
    # rtol 0: hop counts are whole numbers, and a neighbour's count (10 or 12) is a
    # different answer (for an integer answer the tolerance only matters to draw()).
    rtol=0.0,
    params={"chip": "tpu-v5e", "shape": "4x16"},
    choose={"chip": _TPUS, "shape": _SHAPES_2D + _SHAPES_3D},
    solve=_ex5, hints_for=_ex5_hints,
    valid=lambda chip, shape: (_shape_fits(chip, shape) and shape not in _TORI5
                               and (chip, shape) not in _PRINTED5
                               and _chips_in(shape) > 4),
    describe=lambda chip, shape: {"short": _SHORT[chip]},
    variant_title="Diameter of a {short} {shape} slice",
    statement="What is the largest number of ICI hops between two chips of a TPU "
              "{short} `{shape}` slice? (Which of its axes have wraparound links?) "
              "Answer in hops.",
))


# 2.6 ------------------------------------------------------------------------------------
# 405B, not 70B: the chapter's worked example prints the v5e chips that hold 70B.
def _weights_405b() -> float:
    return get_model("llama3-405b").weight_bytes(2)


_WEIGHT_BYTES = {"bf16": 2, "int8": 1, "fp32": 4}   # fp32: a training run's master copy
_BYTE_SIZE = {"bf16": "2 bytes", "int8": "1 byte", "fp32": "4 bytes"}


def _ex6(model="llama3-405b", chip="tpu-v5e", dtype="bf16"):
    return math.ceil(get_model(model).weight_bytes(_WEIGHT_BYTES[dtype])
                     / get_chip(chip).hbm_bytes)


def _ex6_hints(model, chip, dtype):
    c, m = get_chip(chip), get_model(model)
    w = m.weight_bytes(_WEIGHT_BYTES[dtype])
    if c.hbm_unit == "GiB":          # the table's bytes read as GB
        size = f"{c.hbm_bytes / 2**30:g} GiB = {c.hbm_bytes:.4g} bytes"
        slip, unit = 1e9 / 2**30, "GB"
    else:
        size = f"{c.hbm_bytes / 1e9:g} GB = {c.hbm_bytes / 1e9:g}e9 bytes"
        slip, unit = 2**30 / 1e9, "GiB"
    if dtype == "bf16":
        bytes_hint = (lambda a: a == math.ceil(m.num_params() / c.hbm_bytes),
                      "each bf16 weight takes 2 bytes.")
    else:
        bytes_hint = (lambda a: a == math.ceil(m.weight_bytes(2) / c.hbm_bytes),
                      f"each {dtype} weight takes {_BYTE_SIZE[dtype]}, not 2.")
    w70 = get_model("llama3-70b").weight_bytes(_WEIGHT_BYTES[dtype])
    hints = [
        (lambda a: a == math.floor(w / c.hbm_bytes),
         "round up: a fraction of a chip still needs a whole chip."),
        bytes_hint,
        (lambda a: a == math.ceil(w / (c.hbm_bytes * slip)),
         f"the hardware table gives HBM in bytes ({size}), not {unit}."),
    ]
    if model == "llama3-405b":
        hints.append((lambda a: a == math.ceil(w70 / c.hbm_bytes),
                      "that is LLaMA-3-70B (the chapter's example); this exercise asks "
                      "about 405B."))
    return hints


# The chapter prints the count for 70B in bf16 on v5e and on H100 (section 2.5); a count
# of one chip has nothing to round up.
_PRINTED6 = {("llama3-70b", "tpu-v5e", "bf16"), ("llama3-70b", "gpu-h100", "bf16")}

register(VariedNumericExercise(
    id="2.6", title="v5e chips to hold LLaMA-3-405B", unit="chips", integer=True,
    rtol=0.0,            # whole chips: only the same count is the same answer (see 2.5)
    params={"model": "llama3-405b", "chip": "tpu-v5e", "dtype": "bf16"},
    choose={"model": ("llama3-70b", "llama3-405b"), "chip": _ALL_CHIPS,
            "dtype": tuple(_WEIGHT_BYTES)},
    solve=_ex6, hints_for=_ex6_hints,
    valid=lambda model, chip, dtype: ((model, chip, dtype) not in _PRINTED6
                                      and _ex6(model, chip, dtype) > 1),
    describe=lambda model, chip, dtype: {
        "chip_name": get_chip(chip).display_name.split(" (")[0], "short": _SHORT[chip],
        "model_title": _MODEL_TITLE[model],
        "byte_words": "" if dtype == "bf16" else f", {_BYTE_SIZE[dtype]} per weight"},
    variant_title="{short} chips to hold {model_title}",
    statement="What is the smallest number of {chip_name} chips whose HBM can hold all "
              "{model_title} weights in {dtype}{byte_words} (ignoring everything else "
              "that needs memory)? Answer in chips.",
))


# 2.7 ------------------------------------------------------------------------------------
def _decode_floor(chip, n_chips, nbytes=None):
    nbytes = _weights_70b() if nbytes is None else nbytes
    return nbytes / (n_chips * get_chip(chip).hbm_bandwidth)


def _ex7(model="llama3-70b", chip="tpu-v6e", shape="4x4"):
    return _decode_floor(chip, _chips_in(shape), get_model(model).weight_bytes(2))


def _ex7_hints(model, chip, shape):
    n, w = _chips_in(shape), get_model(model).weight_bytes(2)
    other = "tpu-v5e" if chip != "tpu-v5e" else "tpu-v6e"
    return [
        (lambda a: _close(a, _decode_floor(chip, 1, w)),
         f"the {n} chips each stream their own share of the weights at the same time."),
        (lambda a: _close(a, _decode_floor(other, n, w)),
         f"that is a {_SHORT[other]}'s HBM bandwidth."),
        (lambda a: _close(a, get_model(model).num_params()
                          / (n * get_chip(chip).hbm_bandwidth)),
         "bf16 weights take 2 bytes each."),
    ]


def _fits(model, chip, shape):
    """The model's bf16 weights fit in the slice's HBM."""
    hbm = _chips_in(shape) * get_chip(chip).hbm_bytes
    return get_model(model).weight_bytes(2) <= hbm


def _slice_words(model, chip, shape):
    return {"model_title": _MODEL_TITLE[model], "short": _SHORT[chip]}


_SHAPES = _SHAPES_2D + _SHAPES_3D


register(VariedNumericExercise(
    id="2.7", title="Decode floor of LLaMA-3-70B on a v6e 4x4 slice", unit="s",
    params={"model": "llama3-70b", "chip": "tpu-v6e", "shape": "4x4"},
    choose={"model": tuple(_MODEL_TITLE), "chip": _TPUS, "shape": _SHAPES},
    solve=_ex7, hints_for=_ex7_hints, chips=lambda shape, **_: _chips_in(shape),
    # The chapter prints the floor of 70B on a v5e 4x4 slice (section 2.5).
    valid=lambda model, chip, shape: (
        _shape_fits(chip, shape) and _fits(model, chip, shape)
        and (model, chip, shape) != ("llama3-70b", "tpu-v5e", "4x4")),
    describe=_slice_words,
    variant_title="Decode floor of {model_title} on a {short} {shape} slice",
    statement="{model_title} in bf16 is sharded evenly over a TPU {short} `{shape}` "
              "slice. What is the shortest possible time of one decode step at batch "
              "1, set by reading every weight from HBM once? Answer in seconds.",
))


# 2.8 ------------------------------------------------------------------------------------
def _pcie_load(n_links, chip="tpu-v5e", nbytes=None):
    nbytes = _weights_70b() if nbytes is None else nbytes
    return nbytes / (n_links * get_chip(chip).pcie_bandwidth)


def _ex8(model="llama3-70b", chip="tpu-v5e", shape="4x4"):
    return _pcie_load(_chips_in(shape), chip, get_model(model).weight_bytes(2))


def _ex8_hints(model, chip, shape):
    n, w = _chips_in(shape), get_model(model).weight_bytes(2)
    hosts = topology.slice_info(chip, shape).hosts
    return [
        (lambda a: _close(a, _pcie_load(1, chip, w)),
         f"every chip has its own PCIe link to its host; all {n} load their share at "
         f"once."),
        (lambda a: _close(a, _pcie_load(hosts, chip, w)),
         "count PCIe links per chip, not per host."),
        (lambda a: _close(a, _pcie_load(n, chip, w) / 2),
         "2x too small: a bf16 weight is 2 bytes, and the load crosses PCIe one way "
         "(pcie_bandwidth is already one direction: do not double it)."),
    ]


register(VariedNumericExercise(
    # 405B on an 8x8, not 70B on the 4x4 whose PCIe load section 2.6 prints
    id="2.8", title="Loading LLaMA-3 405B over PCIe", unit="s",
    params={"model": "llama3-405b", "chip": "tpu-v5e", "shape": "8x8"},
    choose={"model": tuple(_MODEL_TITLE), "chip": _TPUS, "shape": _SHAPES},
    solve=_ex8, hints_for=_ex8_hints, chips=lambda shape, **_: _chips_in(shape),
    # More than one host (else per chip and per host are the same), and room in HBM.
    valid=lambda model, chip, shape: (
        _shape_fits(chip, shape) and _fits(model, chip, shape)
        and topology.slice_info(chip, shape).hosts > 1
        and (model, chip, shape) != ("llama3-70b", "tpu-v5e", "4x4")),     # printed
    describe=_slice_words,
    variant_title="Loading {model_title} over PCIe",
    statement="The bf16 weights of {model_title} sit in host memory, and each chip of "
              "a TPU {short} `{shape}` slice loads its even share of them over PCIe, "
              "all at once. How long does the load take, at scalebook's PCIe "
              "bandwidth? Answer in seconds.",
))


# 2.9 ------------------------------------------------------------------------------------
def _dcn_copy(n_chips, model="llama3-405b"):
    """Each of ``n_chips`` v5e chips sends its share of ``model``'s bf16 weights over DCN.
    405B, not 70B: section 2.6 prints 70B's DCN time on a 4x4 slice, a pod's is / 16."""
    return get_model(model).weight_bytes(2) / (n_chips * get_chip("tpu-v5e").dcn_bandwidth)


def _pod():
    return get_chip("tpu-v5e").ici_domain_chips


register(NumericExercise(
    id="2.9", title="Copying LLaMA-3 405B between two v5e pods over DCN", unit="s",
    reference=lambda: _dcn_copy(_pod()), chips=_pod,
    hints=[
        (lambda a: _close(a, _dcn_copy(1)), "each of the pod's chips sends its own share at once."),
        (lambda a: _close(a, get_model("llama3-405b").weight_bytes(2)
                          / (_pod() * get_chip("tpu-v5e").ici_link_bandwidth)),
         "between pods there is no ICI; the bytes cross the data-centre network."),
        (lambda a: _close(a, _dcn_copy(_pod(), "llama3-70b")),
         "that is LLaMA-3 70B's copy; this one moves 405B's weights."),
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
def _floor_ratio(tpu="tpu-v5e", shape="4x4", gpu="gpu-h100"):
    return _decode_floor(tpu, _chips_in(shape)) / _decode_floor(gpu, 8)


def _ex11_hints(tpu, shape, gpu):
    return [
        (lambda a: _close(a, 1 / _floor_ratio(tpu, shape, gpu)),
         f"upside down: {_SHORT[tpu]} time divided by {_SHORT[gpu]} time."),
        (lambda a: _close(a, get_chip(gpu).hbm_bandwidth / get_chip(tpu).hbm_bandwidth),
         f"that compares one chip with one chip; the slice has {_chips_in(shape)} "
         f"chips and the node 8."),
    ]


def _ex11_ok(tpu, shape, gpu):
    # A slice that holds the weights and is slower than the node ("how many times
    # longer"), with as many TPU chips as GPUs or more.
    return (_shape_fits(tpu, shape) and _fits("llama3-70b", tpu, shape)
            and _chips_in(shape) >= 8 and _floor_ratio(tpu, shape, gpu) > 1.05)


register(VariedNumericExercise(
    id="2.11", title="v5e slice versus eight H100s", unit="ratio (dimensionless)",
    params={"tpu": "tpu-v5e", "shape": "4x4", "gpu": "gpu-h100"},
    choose={"tpu": _TPUS, "shape": _SHAPES_2D + _SHAPES_3D,
            "gpu": ("gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200")},
    solve=_floor_ratio, hints_for=_ex11_hints, valid=_ex11_ok,
    describe=lambda tpu, shape, gpu: {"tpu_short": _SHORT[tpu],
                                      "gpu_short": _SHORT[gpu]},
    variant_title="{tpu_short} slice versus eight {gpu_short}s",
    statement="How many times longer is the HBM floor of one LLaMA-3-70B decode step "
              "on a TPU {tpu_short} `{shape}` slice than on one server of 8 "
              "{gpu_short}s (weights sharded evenly in both cases)? Answer as a ratio "
              "({tpu_short} time / {gpu_short} time).",
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


def _ex14(chip="tpu-v6e", weights="bf16"):
    return _pcie_batch(chip, s_w=_WEIGHT_BYTES[weights])


def _ex14_hints(chip, weights):
    c, sw = get_chip(chip), _WEIGHT_BYTES[weights]
    ref = _ex14(chip, weights)
    if weights == "bf16":
        halved = ("half the answer: bf16 weights are 2 bytes each, and pcie_bandwidth "
                  "is one direction (do not double it).")
        doubled = "a multiply-add is 2 FLOPs: X[B, D] @ W[D, F] does 2 B D F of them."
    else:      # int8: 2 bytes per weight and 1 FLOP per multiply-add both double it
        halved = "half the answer: pcie_bandwidth is one direction (do not double it)."
        doubled = ("twice the answer: int8 weights take 1 byte each (not 2), and a "
                   "multiply-add is 2 FLOPs (X[B, D] @ W[D, F] does 2 B D F of them).")
    hints = [
        (lambda a: _close(a, _pcie_batch(chip, bandwidth=c.hbm_bandwidth, s_w=sw)),
         "that is for weights read from HBM; these come from host memory over PCIe."),
        (lambda a: _close(a, ref / 2), halved),
        (lambda a: _close(a, c.chips_per_host * ref), "pcie_bandwidth is already per "
                                                      "chip: do not share it among the "
                                                      "host's chips."),
        (lambda a: _close(a, 2 * ref), doubled),
    ]
    if chip != "tpu-v5e":
        hints.append((lambda a: _close(a, _ex14("tpu-v5e", weights)),
                      f"those are the v5e's figures; use the {_SHORT[chip]}'s peak and "
                      f"PCIe bandwidth."))
    return hints


# The chapter prints the PCIe batch for bf16 weights on a v5e and an H100 (an H200 has
# the H100's peak and PCIe link).
_PRINTED14 = {"tpu-v5e", "gpu-h100", "gpu-h200"}

register(VariedNumericExercise(
    id="2.14", title="Weights from host memory on a v6e", unit="tokens",
    params={"chip": "tpu-v6e", "weights": "bf16"},
    choose={"chip": _ALL_CHIPS, "weights": ("bf16", "int8")},
    solve=_ex14, hints_for=_ex14_hints,
    valid=lambda chip, weights: not (weights == "bf16" and chip in _PRINTED14),
    describe=lambda chip, weights: {
        "a_chip": "A" + _a(get_chip(chip).display_name.split(" (")[0])[1:],
        "a_short": _a(_SHORT[chip]),
        "upcast": "" if weights == "bf16" else "(1 byte each, turned into bf16 for the "
                                               "arithmetic at the bf16 peak)"},
    variant_title="Weights from host memory on {a_short}",
    statement="{a_chip} streams the {weights} weight $W[D, F]${upcast} of a matmul "
              "$X[B, D] \\cdot W[D, F]$ from host memory over PCIe at every step, "
              "overlapping the transfer with the arithmetic. From how many tokens $B$ "
              "does the arithmetic, not the transfer, set the time? Ignore the "
              "activations. Answer in tokens.",
))
