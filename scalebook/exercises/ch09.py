"""Chapter 9 exercises: profiling. Reference answers are computed from scalebook
(:mod:`scalebook.profiling`, :mod:`scalebook.hlo`), never typed in."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from .. import hlo, profiling
from ..hardware import get_chip
from ..models import get_model
from .core import CORRECT, UNANSWERED, WRONG, Exercise, register
from .kinds import ChoiceExercise, CodeExercise, MeshProgramExercise, NotAttempted, \
    VariedNumericExercise


def _close(a, b, rtol=0.02):
    return math.isclose(a, b, rel_tol=rtol)


# Variants (for assignments; see kinds.VariedNumericExercise): each varied exercise's
# ``params`` are the chapter's own numbers, ``choose`` the values an assignment may draw.
def _chip_short(chip):
    """"v5p" for tpu-v5p, "H100" for gpu-h100."""
    kind, name = chip.split("-", 1)
    return name if kind == "tpu" else name.upper()


# 9.1 tensor-parallel all-reduces of 70B on v5p ----------------------------------------------
_T91, _S91, _TP91 = 16384, 8192, 4


def _ar_time_91(tp=_TP91, chip="tpu-v5p", tokens=_T91, seq_len=_S91):
    ops = profiling.predict_layer_profile("llama3-70b", chip, tokens=tokens, seq_len=seq_len,
                                          tp=tp)
    return sum(o.time for o in ops if o.kind == "collective")


def _ar_no_frac_91(chip="tpu-v5p", tokens=_T91):
    """4 all-reduces of 2 x the array with the (n - 1)/n factor left out."""
    m = get_model("llama3-70b")
    return 4 * 2 * 2 * tokens * m.d_model / (2 * get_chip(chip).ici_link_bandwidth)


def _hints91(tp, chip, n_seq, seq_len):
    T = n_seq * seq_len

    def ar(**kw):
        return _ar_time_91(**{"tp": tp, "chip": chip, "tokens": T, "seq_len": seq_len, **kw})
    return [
        (lambda a: _close(a, 2 * ar(), 0.03),
         "2x too large: on a bidirectional ring half the data goes each way (divide by "
         "2 W_ici), and the activations are bf16 (2 bytes per number)."),
        (lambda a: _close(a, ar() / 2, 0.03),
         "2x too small: count all four all-reduces (two forward, two backward), and an "
         "all-reduce sends 2 (n - 1) / n times the array, not (n - 1) / n."),
        (lambda a: _close(a, ar() / 4, 0.03),
         "that is one all-reduce; the layer's step runs four."),
        (lambda a: _close(a, _ar_no_frac_91(chip, T), 0.03),
         "on a ring of n chips an all-reduce sends 2 (n - 1) / n of the array per chip, "
         "not twice the array."),
    ] + ([  # twice the group, where the model allows it (tp divides the 8 KV heads)
        (lambda a: _close(a, ar(tp=2 * tp), 0.03),
         f"the group has {tp} chips (tp = {tp}), not {2 * tp}."),
    ] if get_model("llama3-70b").n_kv_heads % (2 * tp) == 0 else []) + [
        (lambda a: _close(a, 80 * ar(), 0.03),
         "that is all 80 layers; the question asks for one layer."),
    ]


_SEQS = {1: "one", 2: "two", 4: "four", 8: "eight"}

register(VariedNumericExercise(
    id="9.1", title="Tensor-parallel all-reduces of 70B on v5p", unit="seconds", rtol=0.03,
    params={"tp": _TP91, "chip": "tpu-v5p", "n_seq": _T91 // _S91, "seq_len": _S91},
    choose={"tp": (2, 4, 8), "chip": ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"),
            "n_seq": (1, 2, 4, 8), "seq_len": (2048, 4096, 8192)},
    solve=lambda tp, chip, n_seq, seq_len: _ar_time_91(tp, chip, n_seq * seq_len, seq_len),
    hints_for=_hints91, ring=lambda tp, **_: tp,
    describe=lambda tp, chip, n_seq, seq_len: {
        "chip_name": get_chip(chip).display_name, "chip_short": _chip_short(chip),
        "seqs": f"{_SEQS[n_seq]} {seq_len // 1024}K sequence{'s' if n_seq > 1 else ''}",
        "B": n_seq * seq_len},
    variant_title="Tensor-parallel all-reduces of 70B on {chip_short}",
    statement="One LLaMA-3 70B layer is trained with {tp}-way tensor parallelism on "
              "{chip_name} chips along one torus axis (a bidirectional ring), on a "
              "microbatch of {seqs} ($B = {B}$ tokens). Its forward and backward passes run "
              "four all-reduces of the bf16 $[B, D]$ activations. How many seconds do the "
              "four take together, by chapter 3's ring model?",
))


# 9.2 communication share of a 70B layer on H100 ---------------------------------------------
def _share_92(chip="gpu-h100", of_on_chip=False, tokens=4096, tp=8, forward_only=False):
    ops = profiling.predict_layer_profile("llama3-70b", chip, tokens=tokens, seq_len=tokens,
                                          tp=tp)
    if forward_only:
        ops = [o for o in ops if o.phase == "forward"]
    b = profiling.predicted_breakdown(ops)
    return b["collective"] / ((b["total"] - b["collective"]) if of_on_chip else b["total"])


def _an(name):
    """The article before a chip's name said aloud: an H100, an A100, a B200."""
    return "an" if name[0] in "AEFHILMNORSX" else "a"


def _hints92(chip, tokens, tp):
    def share(c=chip, **kw):
        return _share_92(c, tokens=tokens, tp=tp, **kw)
    short = _chip_short(chip)
    return [
        (lambda a: _close(a, 100 * share()), "give a fraction between 0 and 1, not a "
                                             "percentage."),
        (lambda a: _close(a, share(of_on_chip=True)),
         "that is communication / on-chip work; divide by the whole step (on-chip work plus "
         "the all-reduces)."),
        (lambda a: _close(a, share(get_chip(chip).with_(ici_links=1))),
         "that uses one NVLink link; NVSwitch lets each GPU use all its links "
         "(ici_bandwidth = ici_links x ici_link_bandwidth)."),
        (lambda a: _close(a, share("tpu-v5p")), "that is the TPU v5p; the question asks "
                                                f"for {_an(short)} {short} node."),
        (lambda a: _close(a, share() / 2), "2x too small: the step runs four all-reduces, "
                                           "two in the forward pass and two in the "
                                           "backward; count all four."),
        (lambda a: _close(a, share(forward_only=True)),
         "that is the forward pass alone; the step is the forward and the backward pass "
         "together (predict_layer_profile lists both phases)."),
    ]


register(VariedNumericExercise(
    id="9.2", title="Communication share of a 70B layer on H100", unit="fraction (0 to 1)",
    rtol=0.02,
    params={"chip": "gpu-h100", "tokens": 4096, "tp": 8},
    choose={"chip": ("gpu-a100", "gpu-h100", "gpu-h200", "gpu-b200"),
            "tokens": (1024, 2048, 4096, 8192, 16384), "tp": (2, 4, 8)},
    solve=lambda chip, tokens, tp: _share_92(chip, tokens=tokens, tp=tp),
    hints_for=_hints92,
    describe=lambda chip, tokens, tp: {"chip_short": _chip_short(chip),
                                       "an": _an(_chip_short(chip)), "K": tokens // 1024},
    variant_title="Communication share of a 70B layer on {chip_short}",
    statement="For one LLaMA-3 70B layer's training step with {tp}-way tensor parallelism "
              "on {an} {chip_short} node and a microbatch of one {K}K sequence "
              "($B = S = {tokens}$ tokens), what fraction (0 to 1) of the predicted step "
              "time (`predict_layer_profile`, no overlap) do the all-reduces take?",
))


# 9.3 what bounds a matmul of a small microbatch ---------------------------------------------
def _bound_93():
    ops = profiling.predict_layer_profile("llama3-70b", "tpu-v5p", tokens=64, seq_len=64, tp=8)
    return next(o.bound for o in ops if o.name == "MLP gate + up" and o.phase == "forward")


register(ChoiceExercise(
    id="9.3", title="A small microbatch", choices=("compute", "memory", "communication"),
    reference=_bound_93,
    aliases={"compute-bound": "compute", "memory-bound": "memory",
             "communication-bound": "communication", "bandwidth-bound": "memory",
             "comms": "communication"},
    hints={
        "compute": "with B = 64 tokens the weights dominate the bytes: 2 B D F FLOPs over "
                   "about 2 D F bf16 weight bytes is about B = 64 FLOPs per byte; compare "
                   "that intensity with v5p's C / W_hbm.",
        "memory": "memory-bound is right for this op.",
        "communication": "a matmul sends nothing over the links; the all-reduces are "
                         "separate ops after the row-split matmuls.",
    },
))


# 9.4 padding of a tiled array --------------------------------------------------------------
_SHAPE94 = (32, 8, 100, 64)


def _padded_94(shape=_SHAPE94, tile=(8, 128), dtype="float32"):
    return profiling.padded_bytes(shape, dtype, tile)


def _hints94(lead, rows, cols):
    shape = (*lead, rows, cols)

    def padded(**kw):
        return _padded_94(shape, **kw)

    def also(**kw):
        """A standard slip that gives the same number on this shape, named too."""
        ratio = padded(**kw) / padded()
        for factor, slip in [(1 / 1.024, "kB read as KiB"), (1.024, "KiB read as kB"),
                             (8, "bits counted for bytes"), (1 / 8, "bytes divided by 8")]:
            if abs(ratio / factor - 1) < 0.004:
                return f" (Or {slip}?)"
        return ""
    return [
        (lambda a: a == padded(tile=()), "that is the size without padding: the tiles "
                                         "of the two minor dimensions are stored whole."),
        (lambda a: a == padded(tile=(1, 128)),
         f"the second-minor dimension ({rows}) is padded too, to a multiple of 8."),
        # padding only 100 -> 104 in f32 and padding both in bf16 give the same number
    ] + ([
        (lambda a: a == padded(tile=(8, 1)) == padded(dtype="bfloat16"),
         f"2x too small: the minor dimension ({cols}) is padded too, to a multiple of 128, "
         "and f32 numbers are 4 bytes each."),
    ] if padded(tile=(8, 1)) == padded(dtype="bfloat16") else [
        (lambda a: a == padded(tile=(8, 1)),
         f"the minor dimension ({cols}) is padded too, to a multiple of 128."
         + also(tile=(8, 1))),
        (lambda a: a == padded(dtype="bfloat16"), "f32 numbers are 4 bytes each."),
    ]) + [
    ] + ([
        # the tile turned round (rows to 128, cols to 8); for some shapes the same number
        # as a tile laid over the three minor dimensions
        (lambda a: a == padded(tile=(128, 8)),
         f"the 8 x 128 tile has its 128 along the minor (last) dimension: pad the "
         f"second-minor dimension ({rows}) to a multiple of 8 and the minor one ({cols}) to "
         f"a multiple of 128, not the other way round"
         + (", and tile only those two." if padded(tile=(128, 8)) == padded(tile=(8, 128, 1))
            else ".") + also(tile=(128, 8))),
    ] if padded(tile=(128, 8)) != padded() else []) + [
        (lambda a: a == padded(tile=(8, 128, 1)),
         f"the tile covers the two minor dimensions ({rows} and {cols}), not the ones "
         "before them."),
        (lambda a: a * 4 == padded(), "that is a count of elements; the question asks for "
                                      "bytes, 4 per f32 element."),
    ] + ([
        (lambda a: a == padded(tile=(128, 128)),
         f"the second-minor dimension ({rows}) is padded to a multiple of 8, not of 128: "
         f"the tile is 8 x 128, so only the minor dimension ({cols}) goes to a multiple of "
         f"128."),
    ] if padded(tile=(128, 128)) != padded() else [])


register(VariedNumericExercise(
    id="9.4", title="Padding of a tiled array", unit="bytes", integer=True,
    params={"lead": _SHAPE94[:2], "rows": _SHAPE94[2], "cols": _SHAPE94[3]},
    choose={"lead": ((32, 8), (8, 8), (4, 16), (16,), (2, 4, 8)),
            "rows": (3, 50, 100, 129, 300, 513), "cols": (64, 100, 200, 300, 1000)},
    solve=lambda lead, rows, cols: _padded_94((*lead, rows, cols)), hints_for=_hints94,
    # both minor dimensions padded, so that each slip gives its own number
    valid=lambda lead, rows, cols: rows % 8 != 0 and cols % 128 != 0,
    describe=lambda lead, rows, cols: {"dims": ", ".join(map(str, (*lead, rows, cols)))},
    statement="An f32 array of shape $[{dims}]$ is stored with the two minor dimensions "
              "tiled 8 × 128. How many bytes does it occupy, padding included?",
))


# 9.5 the slowest op of a trace ---------------------------------------------------------------
def _ev(name, dur, ts, device=0, hlo_op=True, tid=1):
    e = {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name, "args": {}}
    if hlo_op:
        e["args"] = {"hlo_op": name, "hlo_module": "jit_step", "device_ordinal": str(device)}
    return e


def _synthetic_trace(ops, extra=(), devices=4):
    """ops: [(name, n events per device, duration us)], extra: non-HLO (name, dur). A
    duration may be a tuple with one value per device (devices that spend different
    times on an op: a device that arrives last at an all-reduce waits least)."""
    events = [{"ph": "M", "pid": 1, "tid": 1, "name": "thread_name", "args": {"name": "python"}},
              {"ph": "M", "pid": 1, "tid": 2, "name": "thread_name",
               "args": {"name": "worker"}}]
    ts = 10.0
    for name, n, durs in ops:
        if not isinstance(durs, tuple):
            durs = (durs,) * devices
        for d, dur in zip(range(devices), durs):
            for _ in range(n):
                events.append(_ev(name, dur, ts, device=d, tid=2))
                events.append({"ph": "X", "pid": 1, "tid": 2, "ts": ts + dur, "dur": 0.01,
                               "name": "end: " + name, "args": {"device_ordinal": str(d)}})
                ts += dur + 1
    for name, dur in extra:
        events.append(_ev(name, dur, 5.0, hlo_op=False, tid=1))
    return {"displayTimeUnit": "ns", "traceEvents": events}


def _real_trace_json():
    """A real profile of a small sharded program (collected once, when first needed)."""
    import shutil
    import tempfile

    import jax
    import jax.numpy as jnp

    from ..mesh import make_mesh

    mesh = make_mesh((8,), ("x",))
    a = jax.device_put(jnp.ones((128, 256)), jax.NamedSharding(mesh, jax.P(None, "x")))
    b = jax.device_put(jnp.ones((256, 64)), jax.NamedSharding(mesh, jax.P("x", None)))
    f = jax.jit(lambda a, b: jnp.tanh(a @ b) * 2)
    jax.block_until_ready(f(a, b))
    folder = tempfile.mkdtemp(prefix="scalebook-ex95-")
    try:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            for _ in range(2):
                jax.block_until_ready(f(a, b))
        return profiling._read_json(profiling.find_trace_file(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _slowest_ref(trace_json):
    return profiling.load_trace(trace_json).summary("op")[0].key


def _longest_event(trace_json):
    evs = [e for e in trace_json["traceEvents"] if e.get("ph") == "X"
           and "hlo_op" in (e.get("args") or {})]
    return max(evs, key=lambda e: e["dur"])["args"]["hlo_op"]


def _most_events(trace_json):
    from collections import Counter
    c = Counter(e["args"]["hlo_op"] for e in trace_json["traceEvents"]
                if e.get("ph") == "X" and "hlo_op" in (e.get("args") or {}))
    return c.most_common(1)[0][0]


def _slowest_per_device(trace_json):
    """{device_ordinal: the op with the largest total on that device alone}."""
    totals = {}
    for e in trace_json["traceEvents"]:
        args = e.get("args") or {}
        if e.get("ph") == "X" and "hlo_op" in args:
            dev = totals.setdefault(str(args.get("device_ordinal")), {})
            dev[args["hlo_op"]] = dev.get(args["hlo_op"], 0.0) + e["dur"]
    return {d: max(t, key=t.get) for d, t in totals.items()}


def _non_hlo_names(trace_json):
    return {e.get("name") for e in trace_json["traceEvents"]
            if e.get("ph") == "X" and "hlo_op" not in (e.get("args") or {})}


_CASES_95 = [
    # fusion.1 has the largest total; all-reduce the longest single event; ynn_fusion.2
    # the most events; a step annotation and a runtime event outlast everything.
    (_synthetic_trace([("ynn_fusion.2", 4, 4.0), ("fusion.1", 2, 10.0),
                       ("all-reduce", 1, 15.0), ("copy.3", 1, 1.0)],
                      extra=[("step", 900.0), ("ThunkExecutor::Execute", 400.0)]),),
    (_synthetic_trace([("all-reduce.7", 1, 50.0), ("ynn_fusion.1", 3, 20.0),
                       ("multiply_add_fusion", 6, 2.0)], extra=[("train", 5000.0)],
                      devices=8),),
    # Not the same on every device: each device spends longest on an op of its own (40 us
    # in two events), and the all-reduce, 30 us on each, is second everywhere. Over all
    # devices the all-reduce leads (120 us against 58), so the slowest op of any one device
    # alone is wrong; the longest single event is the all-reduce's, so that slip is not.
    (_synthetic_trace([("ynn_fusion.1", 2, (20.0, 3.0, 3.0, 3.0)),
                       ("fusion.3", 2, (3.0, 20.0, 3.0, 3.0)),
                       ("ynn_fusion.4", 2, (3.0, 3.0, 20.0, 3.0)),
                       ("multiply_add_fusion", 2, (3.0, 3.0, 3.0, 20.0)),
                       ("all-reduce.2", 1, 30.0)],
                      extra=[("step", 800.0)]),),
]


def _gen95(rng):
    """A synthetic trace: 2 to 5 HLO ops on 2, 4 or 8 devices, each with 1 to 6 events of
    0.5 to 50 us, one op's total (over all devices) at least 5% above the others', and 0 to
    2 long events that are not HLO ops (a step annotation, a runtime call). In half the
    traces each device spends its own time on each op (0.5 to 50 us drawn per device)."""
    names = ["fusion.1", "fusion.2", "ynn_fusion.3", "all-reduce.4", "copy.5", "dot.6",
             "multiply_add_fusion", "convert.7", "all-gather.8"]
    devices = rng.choice((2, 4, 8))
    uneven = rng.random() < 0.5
    while True:
        ops = [(name, rng.randint(1, 6),
                tuple(rng.randint(1, 100) / 2 for _ in range(devices)) if uneven
                else rng.randint(1, 100) / 2)
               for name in rng.sample(names, rng.randint(2, 5))]
        totals = sorted(n * (sum(dur) if uneven else devices * dur) for _, n, dur in ops)
        if totals[-1] > 1.05 * totals[-2]:
            break
    extra = [(name, rng.randint(1000, 10000) / 2)
             for name in rng.sample(["step", "train", "ThunkExecutor::Execute"],
                                    rng.randint(0, 2))]
    return (_synthetic_trace(ops, extra=extra, devices=devices),)


class _Lazy(list):
    """Cases built only when a check first reaches them (compiling or profiling takes a
    moment): the list holds those built so far, ``make()`` yields the rest."""

    def __init__(self, ready, make):
        super().__init__(ready)
        self._make, self._rest = make, None

    def __iter__(self):
        i = 0
        while True:
            if i < list.__len__(self):
                yield list.__getitem__(self, i)
                i += 1
                continue
            if self._rest is None:
                self._rest = iter(self._make())
            nxt = next(self._rest, None)
            if nxt is None:
                return
            self.append(nxt)

    def __len__(self):
        for _ in self:       # build everything (only for messages that print the count)
            pass
        return list.__len__(self)


register(CodeExercise(
    id="9.5", title="The slowest op of a trace", reference=_slowest_ref,
    cases=_Lazy(_CASES_95, lambda: [(_real_trace_json(),)]), compare=lambda got, want: got == want,
    describe=lambda t: f"a trace of {len(t['traceEvents'])} events", generate=_gen95,
    hints=[
        (lambda got, want, args: isinstance(got, str) and got in _non_hlo_names(args[0]),
         "that event is not an HLO op: count only events whose args have an 'hlo_op'."),
        (lambda got, want, args: got == _longest_event(args[0]),
         "that op has the longest single event; add up the durations of all events of "
         "each op (every step, every device)."),
        (lambda got, want, args: got in _slowest_per_device(args[0]).values(),
         "that op is the slowest of one device alone; add up the events of every device "
         "(each event has its device_ordinal): in this trace the devices do not all spend "
         "the same time on each op (each has a slow op of its own), so one device's "
         "ranking is not the program's."),
        (lambda got, want, args: got == _most_events(args[0]),
         "that op has the most events; compare total durations, not counts."),
        (lambda got, want, args: not isinstance(got, str),
         "return the op's name, a string such as 'fusion.1'."),
    ],
))


# 9.6 count the fusions ------------------------------------------------------------------------
# Fusions inside a fused computation (XLA nests them on some backends): the program runs the
# outer one only, so counting every " fusion(" in the text gives 3 where the answer is 1 (and
# counting the computations that fusions call gives 2).
_NESTED_FUSION = """HloModule nested_fusion, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

%fused_inner (p.1: f32[4]) -> f32[4] {
  %p.1 = f32[4]{0} parameter(0)
  ROOT %sine.1 = f32[4]{0} sine(f32[4]{0} %p.1)
}

%fused_outer (q.1: f32[4]) -> f32[4] {
  %q.1 = f32[4]{0} parameter(0)
  %inner_fusion = f32[4]{0} fusion(f32[4]{0} %q.1), kind=kLoop, calls=%fused_inner
  ROOT %inner_fusion.1 = f32[4]{0} fusion(f32[4]{0} %inner_fusion), kind=kLoop, calls=%fused_inner
}

ENTRY %main (x.1: f32[4]) -> f32[4] {
  %x.1 = f32[4]{0} parameter(0)
  ROOT %outer_fusion = f32[4]{0} fusion(f32[4]{0} %x.1), kind=kLoop, calls=%fused_outer
}
"""


# A call instruction runs the computation it names (to_apply=): its fusions run too. XLA:CPU
# inlines most calls, so the compiled programs of the check have none; this hand-written one
# has one (an entry-only count, or one that follows loops and conditionals only, gives 1
# where the answer is 3).
_CALL_FUSION = """HloModule with_call, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%fused_sin (p.1: f32[8]) -> f32[8] {
  %p.1 = f32[8]{0} parameter(0)
  ROOT %sine.1 = f32[8]{0} sine(f32[8]{0} %p.1)
}

%fused_exp (p.2: f32[8]) -> f32[8] {
  %p.2 = f32[8]{0} parameter(0)
  ROOT %exp.1 = f32[8]{0} exponential(f32[8]{0} %p.2)
}

%called_body (q.1: f32[8]) -> f32[8] {
  %q.1 = f32[8]{0} parameter(0)
  %sine_fusion = f32[8]{0} fusion(f32[8]{0} %q.1), kind=kLoop, calls=%fused_sin
  ROOT %exp_fusion = f32[8]{0} fusion(f32[8]{0} %sine_fusion), kind=kLoop, calls=%fused_exp
}

ENTRY %main (x.1: f32[8]) -> f32[8] {
  %x.1 = f32[8]{0} parameter(0)
  %sine_fusion.1 = f32[8]{0} fusion(f32[8]{0} %x.1), kind=kLoop, calls=%fused_sin
  ROOT %call = f32[8]{0} call(f32[8]{0} %sine_fusion.1), to_apply=%called_body
}
"""


def _program_texts():
    import jax
    import jax.numpy as jnp

    f32 = jnp.float32
    S = jax.ShapeDtypeStruct

    def scanned(w, x):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0]

    def mlp_layer(x, w, b):
        return jax.nn.gelu(x @ w + b)

    def softmax_mm(x, w):
        return jax.nn.softmax(x @ w, axis=-1) @ w.T

    def chain(x):
        for _ in range(5):
            x = jnp.sin(x) * 2 + 1
        return x

    def cond_layer(p, x, w):          # a conditional: each branch runs its own fusions
        return jax.lax.cond(p > 0, lambda x: jnp.tanh(x @ w) * 2, lambda x: jnp.sin(x) + 1,
                            x)

    def switch_in_scan(w, x):         # a three-way switch in a loop body
        def body(c, wi):
            branches = [lambda c: jnp.tanh(c @ wi), lambda c: jnp.sin(c) * 3 + 1,
                        lambda c: jax.nn.gelu(c) @ wi]
            return jax.lax.switch(jnp.argmax(c.sum(0)) % 3, branches, c), None
        return jax.lax.scan(body, x, w)[0]

    progs = [(mlp_layer, (S((64, 32), f32), S((32, 128), f32), S((128,), f32))),
             "nested",
             (scanned, (S((4, 32, 32), f32), S((8, 32), f32))),
             (softmax_mm, (S((16, 32), f32), S((32, 64), f32))),
             (chain, (S((1000,), f32),)),
             (cond_layer, (S((), f32), S((16, 32), f32), S((32, 32), f32))),
             (switch_in_scan, (S((3, 32, 32), f32), S((16, 32), f32)))]
    # the hand-written nested case second, after one program whose matmul is a kCustom
    # fusion: a count of every " fusion(" or of every kLoop fusion is told apart early
    for prog in progs + ["call"]:
        if prog in ("nested", "call"):
            yield (_NESTED_FUSION if prog == "nested" else _CALL_FUSION,)
            continue
        fn, a = prog
        yield (jax.jit(fn).lower(*a).compile().as_text(),)


_ACTS_96 = ("tanh", "gelu", "relu", "sin")


@functools.lru_cache(maxsize=256)
def _drawn_program_96(kind, n, B, D, acts, reduce):
    """The compiled text of a small program drawn by :func:`_gen96` (cached: a check that
    draws the same program again does not compile it again). Source locations keep only
    the program's own line, so the text is the same whoever compiles it."""
    import jax
    import jax.numpy as jnp
    from jax._src import config

    f32, S = jnp.float32, jax.ShapeDtypeStruct
    fns = {"tanh": jnp.tanh, "gelu": jax.nn.gelu, "relu": jax.nn.relu,
           "sin": lambda x: jnp.sin(x) * 2 + 1}

    def drawn_scan(w, x):
        y = jax.lax.scan(lambda c, wi: (fns[acts[0]](c @ wi), None), x, w)[0]
        return y.sum(-1) if reduce else y

    def drawn_mlp(x, *ws):
        for act, w in zip(acts, ws):
            x = fns[act](x @ w)
        return x.sum(-1) if reduce else x

    def drawn_cond(x, *ws):           # n dense layers, or one elementwise op, by the sign
        y = jax.lax.cond(x.sum() > 0, lambda x: drawn_mlp(x, *ws),
                         lambda x: fns[acts[0]](x).sum(-1) if reduce else fns[acts[0]](x), x)
        return y

    def drawn_switch(x, *ws):         # branch k: layer k, picked by the largest column
        branches = [lambda x, act=act, w=w: fns[act](x @ w) for act, w in zip(acts, ws)]
        y = jax.lax.switch(jnp.argmax(x.sum(0)) % n, branches, x)
        return y.sum(-1) if reduce else y

    if kind == "scan":
        fn, args = drawn_scan, (S((n, D, D), f32), S((B, D), f32))
    else:
        fn = {"mlp": drawn_mlp, "cond": drawn_cond, "switch": drawn_switch}[kind]
        args = (S((B, D), f32),) + (S((D, D), f32),) * n
    with config.include_full_tracebacks_in_locations(False):
        return jax.jit(fn).lower(*args).compile().as_text()


def _nested_program_96(k, inner, width):
    """A hand-written module whose entry runs k fusions in a chain, each calling a fused
    computation that holds ``inner`` fusions of its own (as XLA nests them on some
    backends): the program runs k fusions, and the text holds k * (1 + inner)."""
    t = f"f32[{width}]"
    lines = [f"HloModule nested_{k}_{inner}, entry_computation_layout={{({t}{{0}})->{t}{{0}}}}",
             ""]
    for i in range(k):
        for j in range(inner):
            lines += [f"%fused_inner.{i}.{j} (p.{i}.{j}: {t}) -> {t} {{",
                      f"  %p.{i}.{j} = {t}{{0}} parameter(0)",
                      f"  ROOT %sine.{i}.{j} = {t}{{0}} sine({t}{{0}} %p.{i}.{j})", "}", ""]
        body = [f"%fused_outer.{i} (q.{i}: {t}) -> {t} {{", f"  %q.{i} = {t}{{0}} parameter(0)"]
        prev = f"%q.{i}"
        for j in range(inner):
            name = f"%inner_fusion.{i}.{j}"
            root = "ROOT " if j == inner - 1 else ""
            body.append(f"  {root}{name} = {t}{{0}} fusion({t}{{0}} {prev}), kind=kLoop, "
                        f"calls=%fused_inner.{i}.{j}")
            prev = name
        lines += body + ["}", ""]
    lines += [f"ENTRY %main (x.1: {t}) -> {t} {{", f"  %x.1 = {t}{{0}} parameter(0)"]
    prev = "%x.1"
    for i in range(k):
        root = "ROOT " if i == k - 1 else ""
        lines.append(f"  {root}%outer_fusion.{i} = {t}{{0}} fusion({t}{{0}} {prev}), "
                     f"kind=kLoop, calls=%fused_outer.{i}")
        prev = f"%outer_fusion.{i}"
    return "\n".join(lines + ["}", ""])


def _gen96(rng):
    """A small program compiled on this CPU: n dense layers with drawn activations, a scan
    over n layers, a lax.cond between n layers and one elementwise op, or a lax.switch
    between n layers, on drawn shapes, with or without a final sum; or (one draw in six) a
    hand-written module with fusions nested inside fused computations."""
    if rng.random() < 1 / 6:
        return (_nested_program_96(rng.randint(1, 4), rng.randint(1, 3),
                                   rng.choice((4, 8, 16))),)
    kind = rng.choice(("mlp", "mlp", "scan", "cond", "switch"))
    n = {"mlp": rng.randint(1, 4), "scan": rng.randint(2, 6), "cond": rng.randint(1, 3),
         "switch": rng.randint(2, 4)}[kind]
    acts = tuple(rng.choice(_ACTS_96) for _ in range(1 if kind == "scan" else n))
    return (_drawn_program_96(kind, n, rng.choice((8, 16, 32, 64)),
                              rng.choice((16, 32, 64, 128)), acts, rng.random() < 0.4),)


def _while_only(text):
    """The count that follows while loops (bodies and conditions) but not the branches of
    conditionals (the worked solution's first version)."""
    comps, entry, _ = hlo._module(text)
    todo, seen, count = [entry], {entry}, 0
    while todo:
        for ins in comps.get(todo.pop(), []):
            count += ins.opcode == "fusion"
            if ins.opcode == "while":
                for c in hlo._called(ins):
                    if c in comps and c not in seen:
                        seen.add(c)
                        todo.append(c)
    return count


def _without_calls(text):
    """The count that follows while loops and conditionals but not call instructions."""
    comps, entry, _ = hlo._module(text)
    todo, seen, count = [entry], {entry}, 0
    while todo:
        for ins in comps.get(todo.pop(), []):
            count += ins.opcode == "fusion"
            if ins.opcode in ("while", "conditional"):
                for c in hlo._called(ins):
                    if c in comps and c not in seen:
                        seen.add(c)
                        todo.append(c)
    return count


def _without_tuple_fusions(text):
    """The count with the fusions that return a tuple left out (a regex that takes the
    type to be one word misses them)."""
    _, _, table = hlo._module(text)
    n = sum(1 for o in hlo.fusions(text) if table[o.name].type_text.lstrip().startswith("("))
    return hlo.count_fusions(text) - n if n else None


def _entry_only(text):
    return sum(1 for o in hlo.ops(text) if o.opcode == "fusion" and
               o.computation == _entry_name(text))


def _without_conditions(text):
    """The count with the fusions of the while loops' conditions left out (bodies only)."""
    import re
    conds = set(re.findall(r"condition=%?([\w.\-]+)", text))
    in_conds = sum(1 for o in hlo.ops(text) if o.opcode == "fusion" and
                   o.computation in conds) if conds else 0
    return hlo.count_fusions(text) - in_conds if in_conds else None


def _entry_name(text):
    import re
    m = re.search(r"^ENTRY\s+%?([\w.\-]+)", text, re.M)
    return m.group(1) if m else None


register(CodeExercise(
    id="9.6", title="Count the fusions", reference=hlo.count_fusions,
    cases=_Lazy([], _program_texts),
    generate=_gen96,
    compare=lambda got, want: not isinstance(got, bool) and got == want,
    describe=lambda t: f"the program {hlo.hlo_text(t).split(',')[0].split()[-1]}",
    hints=[
        (lambda got, want, args: got == args[0].count(" fusion(") != want,
         "a fused computation can itself hold a fusion instruction (this test program "
         "does): count the fusions of the computations the program runs (the entry, while "
         "bodies and conditions, conditional branches, what a call runs), not of those a "
         "fusion calls."),
        (lambda got, want, args: got == hlo_text_count(args[0], "fusion"),
         "counting the word 'fusion' also counts instruction names (ynn_fusion) and "
         "calls=%fused_computation attributes: count instructions whose opcode is fusion."),
        (lambda got, want, args: got == hlo_text_count(args[0], "kind=kLoop")
         == _without_conditions(args[0]),
         "count every fusion instruction: matmuls are fusions too on this CPU "
         "(kind=kCustom), and a while loop's condition runs too and can hold a fusion."),
        (lambda got, want, args: got == hlo_text_count(args[0], "kind=kLoop"),
         "matmuls are fusions too on this CPU (kind=kCustom), and reductions may be kInput."),
        (lambda got, want, args: got == _without_calls(args[0]) != want,
         "a call instruction (opcode call) runs the computation its to_apply= names, once "
         "each time it is reached: the fusions of that computation run too, so count them "
         "(this hand-written program has one; XLA:CPU inlines most calls)."),
        (lambda got, want, args: got == _while_only(args[0]),
         "a conditional (lax.cond, lax.switch: opcode conditional) runs one of its "
         "branch_computations (true_computation / false_computation in older text), and "
         "each branch can hold fusions: count the fusions of every branch too, and of loops "
         "and conditionals inside them."),
        (lambda got, want, args: got == _without_tuple_fusions(args[0]),
         "a fusion can return several arrays: then its type is a tuple, "
         "'(f32[32]{0}, s32[32]{0}) fusion(...)' (argmax's reduce here), with spaces "
         "inside; find the opcode after the type, whatever the type looks like."),
        (lambda got, want, args: got == _entry_only(args[0]),
         "the loop's fusions are in the while body and condition, not in the entry "
         "computation: count those too."),
        (lambda got, want, args: got == _without_conditions(args[0]),
         "a while loop's condition is a computation that runs too (every iteration), and "
         "it can hold a fusion: count the fusions of the conditions as well as the bodies."),
        (lambda got, want, args: got == hlo_text_count(args[0], "%fused_computation") ,
         "that counts the fused computations and the calls to them; count the fusion "
         "instructions."),
        (lambda got, want, args: got == _lines_with(args[0], "fusion"),
         "that counts the lines that contain 'fusion' anywhere: names (ynn_fusion), "
         "calls=%fused_computation attributes and the fused computations' headers count "
         "too. Count the instructions whose opcode is fusion."),
        (lambda got, want, args: got == _called_computations(args[0]),
         "that counts the computations that fusions call (their bodies), not the fusion "
         "instructions the program runs: read the opcode of each instruction of the "
         "computations that run."),
    ],
))


def hlo_text_count(text, word):
    return text.count(word)


def _lines_with(text, word):
    return sum(word in line for line in text.splitlines())


def _called_computations(text):
    """The distinct computations named in calls= attributes (the fused computations)."""
    import re
    return len(set(re.findall(r"calls=%?([\w.\-]+)", text)))


# 9.7 remove the all-gather ---------------------------------------------------------------------
class _UnderMesh:
    """A jitted function that is lowered inside ``jax.set_mesh(mesh)`` (so that a bare
    PartitionSpec in a sharding constraint refers to the exercise's mesh)."""

    def __init__(self, fn, mesh):
        self.fn, self.mesh = fn, mesh

    def lower(self, *args):
        import jax
        with jax.set_mesh(self.mesh):
            return self.fn.lower(*args)


def _build_97(answer, case, mesh):
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    B, D, F = case
    rng = np.random.default_rng(B + D + F)
    x = jax.device_put(rng.standard_normal((B, D), dtype=np.float32),
                       NamedSharding(mesh, P(("x", "y"), None)))
    w1 = jax.device_put(rng.standard_normal((D, F), dtype=np.float32), NamedSharding(mesh, P()))
    w2 = jax.device_put(rng.standard_normal((F, D), dtype=np.float32), NamedSharding(mesh, P()))

    def guarded(*a):
        out = answer(*a)
        if out is None:
            raise NotAttempted
        return out

    return _UnderMesh(jax.jit(guarded), mesh), (x, w1, w2)


def _expected_97(case, x, w1, w2):
    import numpy as np
    x, w1, w2 = (np.asarray(a) for a in (x, w1, w2))
    return np.maximum(x @ w1, 0) @ w2


def _no_comm_97(records, case):
    if any(r.kind == "all-gather" for r in records):
        return ("the program still gathers: a constraint (or output sharding) that "
                "replicates h or the result makes every device collect all rows; leave the "
                "rows split")
    if records:
        return "the program still communicates; each device has all it needs for its rows"
    return None


register(MeshProgramExercise(
    id="9.7", title="Remove the all-gather", build=_build_97, expected=_expected_97,
    collectives_ok=_no_comm_97, cases=[(16, 8, 32), (32, 16, 8), (64, 24, 16)],
    describe=lambda B, D, F: f"x[{B},{D}], w1[{D},{F}], w2[{F},{D}]", rtol=1e-4,
    error_hints=[("non-empty mesh", "pass shardings with a mesh, or better, no constraint "
                                    "at all: the rows of x are already split."),
                 ("not found in mesh", "the check's mesh has the axes 'x' and 'y' (2 x 4), "
                                       "not 'data' and 'model'; and no constraint at all "
                                       "is needed: the rows of x are already split.")],
))


# 9.8 compile once ------------------------------------------------------------------------------
# The update clips the gradient when the learning rate is large, a Python branch on the
# value in the statement's code (which forces lr to be static there); the answer selects
# with jnp.where (or lax.cond) on the traced lr. Section 9.4's jitted sgd_update has no
# branch, so it is not the answer.
CLIP_ABOVE = 0.1


def _update_ref(w, g, lr):
    import numpy as np
    return w - lr * (np.clip(g, -1.0, 1.0) if lr > CLIP_ABOVE else g)


def _raised(text):
    """The message for an update that raised ``text`` ("TypeName: message"): its first
    line, after what to do about a Python branch on the traced lr."""
    first = str(text).strip().splitlines()[0][:300] if str(text).strip() else "?"
    if "Tracer" in text or "concrete value" in text:
        return ("your function raised an error because a Python if on lr cannot run while "
                "JAX traces lr as an array: choose between the two gradients with "
                f"jnp.where (or jax.lax.cond). JAX said: {first}")
    return f"your function raised {first}"


@dataclass
class _CompileOnceExercise(Exercise):
    # 0.1 itself: "above 0.1" does not clip at 0.1 (a >= slip is told apart there)
    lrs: tuple = (0.3, 0.05, 1e-3, 0.2, 0.125, CLIP_ABOVE)
    shapes: tuple = ((4, 8), (16,))
    hints: list = field(default_factory=list)

    def _update(self, answer):
        """The student's update function, or the Result that says why there is none."""
        if answer is Ellipsis or answer is None:
            return None, self._result(UNANSWERED, "not attempted yet: write make_update, then "
                                                  "run this cell.")
        if not callable(answer):
            return None, self._result(WRONG, f"expected a function make_update(), got "
                                             f"{type(answer).__name__}.")
        try:
            update = answer()
        except Exception as e:
            return None, self._result(WRONG, f"make_update() raised {type(e).__name__}: {e}")
        if update is None:
            return None, self._result(UNANSWERED, "not attempted yet: make_update() returns "
                                                  "None.")
        if not callable(update):
            return None, self._result(WRONG, "make_update() must return a function "
                                             "update(w, g, lr).")
        if not hasattr(update, "lower"):
            return None, self._result(WRONG, "not yet: return a jitted function (jax.jit(...)), "
                                             "so that the update is one compiled program.")
        return update, None

    def _inputs(self, shape, seed):
        import numpy as np
        rng = np.random.default_rng(seed)
        return (rng.standard_normal(shape).astype(np.float32),
                rng.standard_normal(shape).astype(np.float32))

    def _wrong_numbers(self, got, w, g, lr):
        import numpy as np
        got = np.asarray(got)
        if got.shape != w.shape or not np.allclose(got, _update_ref(w, g, lr), rtol=1e-5,
                                                   atol=1e-6):
            return self._result(WRONG, f"not yet: wrong numbers for lr={lr}{self._which(lr)}.")
        return None

    @staticmethod
    def _which(lr):
        if lr > CLIP_ABOVE:
            return (f" (above {CLIP_ABOVE} the update uses the gradient clipped to [-1, 1]: "
                    f"w - lr * clip(g, -1, 1))")
        return f" (at or below {CLIP_ABOVE} the gradient is not clipped: w - lr * g)"

    def _static(self, extra):
        return self._result(WRONG, f"not yet: {len(self.lrs)} new learning rates compiled "
                                   f"{extra} new programs. lr is static (static_argnums/"
                                   f"static_argnames, or closed over and re-jitted): pass it as "
                                   f"an ordinary argument so JAX traces it, and choose the "
                                   f"gradient with jnp.where (or jax.lax.cond), not a Python if.")

    def _done(self):
        return self._result(CORRECT, f"correct: right numbers, and {len(self.lrs)} learning "
                                     f"rates on {len(self.shapes)} shapes compiled once per "
                                     f"shape.")

    def evaluate(self, answer):
        import jax

        update, result = self._update(answer)
        if result is not None:
            return result
        for shape in self.shapes:
            w, g = self._inputs(shape, len(shape))
            try:
                jax.block_until_ready(update(w, g, 0.5))          # the one compilation
                n0 = profiling.compilations()
                for lr in self.lrs:
                    wrong = self._wrong_numbers(update(w, g, lr), w, g, lr)
                    if wrong:
                        return wrong
                extra = profiling.compilations() - n0
            except Exception as e:
                return self._result(WRONG, _raised(f"{type(e).__name__}: {e}"))
            if extra:
                return self._static(extra)
        return self._done()

    # the grader's halves: the kernel exports the update, the checker judges the export
    def export_programs(self, answer) -> list:
        import base64

        import jax

        update, result = self._update(answer)
        if result is not None:
            return [{"result": [result.status, result.message]}]
        out = []
        for shape in self.shapes:
            w, g = self._inputs(shape, len(shape))
            try:
                exp = jax.export.export(update)(w, g, 0.5)
                out.append({"program": base64.b64encode(exp.serialize()).decode()})
            except Exception as e:
                out.append({"error": f"{type(e).__name__}: {str(e)[:300]}"})
        return out

    def evaluate_exported(self, records, seed: int):
        import base64

        import jax
        import numpy as np

        from .kinds import _unsafe_calls

        if (isinstance(records, list) and len(records) == 1 and isinstance(records[0], dict)
                and "result" in records[0]):
            status, message = (list(records[0]["result"]) + ["", ""])[:2]
            if status in (UNANSWERED, WRONG):       # a refusal: the kernel cannot earn by it
                return self._result(status, str(message))
        if not isinstance(records, list) or len(records) != len(self.shapes):
            return self._result(WRONG, "the update could not be read back from your notebook.")
        rng = np.random.default_rng(seed)
        # drawn per student, with one learning rate on each side of the clipping threshold
        lrs = [float(rng.uniform(CLIP_ABOVE + 0.05, 0.5)), float(rng.uniform(1e-3, CLIP_ABOVE))]
        lrs += [float(x) for x in rng.uniform(1e-3, 0.5, len(self.lrs) - 3)]
        lrs += [CLIP_ABOVE]                     # the threshold itself: not clipped
        for shape, rec in zip(self.shapes, records):
            if not isinstance(rec, dict) or "program" not in rec:
                text = rec.get("error", "?") if isinstance(rec, dict) else "?"
                return self._result(WRONG, _raised(str(text)))
            try:
                exp = jax.export.deserialize(bytearray(base64.b64decode(rec["program"])))
                unsafe = _unsafe_calls(exp.mlir_module())
                if unsafe:
                    return self._result(WRONG, f"not yet: the program calls {unsafe}, which "
                                               f"the grader does not run.")
                avals = [(tuple(a.shape), str(a.dtype)) for a in exp.in_avals]
                if avals[:2] != [(shape, "float32")] * 2 or len(avals) > 3:
                    return self._result(WRONG, f"not yet: the update takes {avals}, expected "
                                               f"w and g of shape {shape} and lr.")
                if len(avals) == 2 or avals[2][0] != ():       # lr baked into the program
                    return self._static(len(self.lrs))
                w, g = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
                run = jax.jit(exp.call)
                for lr in lrs:
                    wrong = self._wrong_numbers(run(w, g, np.float32(lr)), w, g, np.float32(lr))
                    if wrong:
                        return self._result(WRONG, f"not yet: wrong numbers for a learning "
                                                   f"rate of the grader's{self._which(lr)}.")
            except Exception as e:
                return self._result(WRONG, f"the update could not be run: "
                                           f"{type(e).__name__}: {str(e)[:200]}")
        return self._done()


register(_CompileOnceExercise(id="9.8", title="Compile once"))
