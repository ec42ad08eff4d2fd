"""Profiles of JAX programs: capture a trace, read it as a table of ops, draw its timeline,
and predict the profile a real chip would show (chapter 9).

* :func:`capture` runs a function under ``jax.profiler.trace`` in a temporary folder and
  returns the parsed :class:`Trace`; :func:`find_trace_file` finds the Perfetto/Chrome JSON
  trace (``perfetto_trace.json.gz``) that JAX writes there; :func:`load_trace` parses such a
  file (or its decoded JSON) and fails with :class:`TraceError` on a malformed or empty one.
* :class:`Trace` holds one :class:`OpEvent` per executed HLO op (name, device, thread,
  start, duration), read from a CPU, GPU or TPU trace (:func:`load_trace` says how each
  is read); :meth:`Trace.summary` sums them by op, by kind or by device
  (:class:`OpSummary`); :func:`plot_timeline` draws one lane per device.
* :func:`op_kind` names the kind of an op from its HLO name ("matmul", "collective",
  "elementwise", ...), or from the compiled program's own instructions
  (:func:`scalebook.hlo.op_categories`) when given.
* :func:`overlapping_pairs` finds the collectives that ran at the same time as compute on
  the same device (communication overlapped with computation, as far as a trace shows it).
* :func:`compare_with_roofline` puts the measured time of each big op next to its roofline
  time max(FLOPs / C, bytes / W) for the peak C and bandwidth W you give (chapter 1's
  measured values for this machine).
* :func:`real_profile` finds the real GPU and TPU profiles (trace and compiled HLO) that
  ship with the package in ``scalebook/data/profiles`` (sources and licences there).
* :func:`memory_profile` reads ``jax.profiler.device_memory_profile()`` (a pprof
  snapshot of the arrays alive on the devices) into one :class:`LiveBuffer` per allocation
  site, largest first, with the line of code that made it.
* :func:`predict_layer_profile` predicts, op by op, one transformer layer's training step on
  a real chip with tensor parallelism (the book's cost model); :func:`plot_predicted` draws
  it as the timeline a profiler would show.

Why the JSON trace and not ``.xplane.pb``: the ``.xplane.pb`` file is XProf's own protobuf
format (TensorBoard's profile plugin / ``xprof`` read it); the JSON trace is plain Chrome
trace-event format that Perfetto opens and the standard library parses, so the book needs
no extra package. Times in a trace are microseconds; this module returns seconds.
"""

from __future__ import annotations

import bisect
import glob
import gzip
import json
import math
import numbers
import os
import re
import shutil
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field

from .collectives import KINDS, collective_time
from .hardware import get_chip
from .models import get_model
from .roofline import Bounds
from .units import check_positive, check_positive_int

__all__ = ["TraceError", "OpEvent", "OpSummary", "Trace", "capture", "find_trace_file",
           "load_trace", "op_kind", "KINDS_ORDER", "plot_timeline", "OpComparison",
           "compare_with_roofline", "PredictedOp", "predict_layer_profile", "plot_predicted",
           "predicted_breakdown", "KIND_COLORS", "padded_bytes", "compilations",
           "COMPUTE_KINDS", "overlapping_pairs", "overlap_seconds", "RealProfile", "real_profile",
           "REAL_PROFILES", "LiveBuffer", "memory_profile"]

KINDS_ORDER = ("matmul", "attention", "elementwise", "data movement", "collective", "other")
KIND_COLORS = {"matmul": "#1f77b4", "attention": "#9467bd", "elementwise": "#ff7f0e",
               "data movement": "#8c564b", "collective": "#d62728", "other": "#7f7f7f",
               "control flow": "#7f7f7f", "bookkeeping": "#7f7f7f"}


class TraceError(ValueError):
    """A trace file that is missing, malformed or holds no executed HLO ops."""


@dataclass(frozen=True)
class OpEvent:
    """One execution of one HLO op on one device, as the trace records it.

    name: the HLO instruction name (e.g. "ynn_fusion.3", "all-reduce"); module: the
    compiled program ("jit_train_step"); device: the device number (None if the trace does
    not say); thread: the name of the thread (CPU), stream (GPU) or line (TPU: "XLA Ops")
    that ran it; start, duration: seconds (start measured from the first event of the
    trace); kernel: on a GPU, the name of the kernel this event is (one op may launch
    several), else "". args: the event's own ``args`` as the trace stores them (on a TPU
    the op's cost model: ``long_name``, ``hlo_category``, ``bytes_accessed``,
    ``model_flops``, ``source``, ``tf_op``...); not compared.
    """

    name: str
    module: str
    device: int | None
    thread: str
    start: float
    duration: float
    kernel: str = ""
    args: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def end(self) -> float:
        return self.start + self.duration


@dataclass(frozen=True)
class OpSummary:
    """Events summed by a key (an op name, a kind, a device): how many, their total and mean
    duration in seconds, and their share of the total of all rows."""

    key: str
    count: int
    total: float
    share: float

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else 0.0

    def __str__(self) -> str:
        from .units import fmt_time
        return (f"{self.key:<32} n={self.count:<5} total {fmt_time(self.total):>10}  "
                f"mean {fmt_time(self.mean):>10}  {self.share:6.1%}")


# ------------------------------------------------------------------------------------------
# Kinds of op
# ------------------------------------------------------------------------------------------

# Collective op names, '_' read as '-': XLA's opcodes (an async pair's "-start"/"-done"
# halves included) and the names JAX gives the instructions of shard_map's collectives
# after their primitives (psum_invariant.7, all_gather.3, ppermute.3, ...).
_COLLECTIVE_BASES = frozenset({
    "all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute",
    "collective-broadcast", "ragged-all-to-all", "all-reduce-scatter",
    "all-gather-invariant", "psum", "psum-invariant", "psum-scatter", "pmax", "pmin",
    "ppermute", "pshuffle"})
_DATA_MOVEMENT_BASES = frozenset({
    "copy", "copy-start", "copy-done", "transpose", "slice", "dynamic-slice",
    "concatenate", "pad", "gather", "scatter", "broadcast", "reshape", "bitcast",
    "dynamic-update-slice", "send", "recv", "send-done", "recv-done"})
_ELEMENTWISE_BASES = frozenset({
    "add", "multiply", "subtract", "divide", "exponential", "tanh", "reduce", "maximum",
    "minimum", "negate", "convert", "select", "compare", "rsqrt", "log"})
_CONV = re.compile(r"(^|[_\-$])conv(olution)?([_\-.$]|$)")
_ATTENTION = re.compile(r"attn|attention|fmha|flash")


def _base_name(name: str) -> str:
    """'all_gather.3' -> 'all-gather', 'all-reduce-start.1.0' -> 'all-reduce'."""
    base = re.sub(r"(\.\d+)+$", "", name).replace("_", "-")
    return re.sub(r"-(start|done)$", "", base) if base not in ("copy-start", "copy-done") \
        else base


def op_kind(name: str, categories: dict | None = None) -> str:
    """The kind of the op named ``name``: one of :data:`KINDS_ORDER`.

    With ``categories`` (``scalebook.hlo.op_categories(compiled)``) the compiled program's
    own instruction decides (a fusion containing a dot is a "matmul", one calling a
    collective is a "collective"). Without it the name decides: collectives by their
    opcode names (``all-reduce``, ``all-gather-start``...) or by the names JAX gives
    shard_map's collectives (``psum_invariant.7``, ``all_gather.3``, ``reduce_scatter.7``,
    ``ppermute.3``, ``all_to_all.2``, ``psum.4``); ``dot``/``ynn_fusion``/``*gemm*``/
    ``*matmul*``/``*cublas*``/``*conv*`` are matmuls (XLA:CPU's YNNPACK fusions, GPU's
    cuBLAS and Triton gemm fusions, cuDNN convolutions); ``*attn*``/``*attention*``/
    ``*fmha*``/``*flash*`` are fused attention kernels; ``copy``/``copy-start``/
    ``transpose``/``slice``... are data movement, other fusions and ``wrapped_*`` ops
    are elementwise. A generic ``custom-call.N`` is "other": only the program knows it.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be an HLO op name (str); got {type(name).__name__}")
    if categories is not None:
        if not isinstance(categories, dict):
            raise TypeError("categories must be the dict of scalebook.hlo.op_categories(compiled)")
        cat = categories.get(name)
        if cat is not None:
            return {"control flow": "other", "bookkeeping": "other"}.get(cat, cat)
    base = _base_name(name)
    if base in _COLLECTIVE_BASES:
        return "collective"
    if base == "dot" or base.startswith("ynn-fusion") or "gemm" in base \
            or "cublas" in base or "matmul" in base or _CONV.search(base):
        return "matmul"
    if _ATTENTION.search(base):
        return "attention"
    if base in _DATA_MOVEMENT_BASES or (base.split("-")[0] in _DATA_MOVEMENT_BASES
                                        and "fusion" not in base):
        return "data movement"
    if "fusion" in base or base.startswith("wrapped-") or base in _ELEMENTWISE_BASES:
        return "elementwise"
    return "other"


# ------------------------------------------------------------------------------------------
# Reading trace files
# ------------------------------------------------------------------------------------------

def find_trace_file(logdir) -> str:
    """The Perfetto/Chrome JSON trace that ``jax.profiler.trace(logdir, ...)`` wrote.

    JAX writes ``plugins/profile/<date>/`` under ``logdir`` with ``<host>.xplane.pb``
    (XProf's format), ``<host>.trace.json.gz`` and, with ``create_perfetto_trace=True``,
    ``perfetto_trace.json.gz``. The newest ``perfetto_trace.json.gz`` is returned, else the
    newest ``*.trace.json.gz`` (both hold the same events in Chrome trace-event JSON).
    """
    if not isinstance(logdir, (str, os.PathLike)):
        raise TypeError(f"logdir must be a folder path; got {type(logdir).__name__}")
    logdir = os.fspath(logdir)
    if not os.path.isdir(logdir):
        raise TraceError(f"logdir {logdir!r} is not a folder")
    for pattern in ("perfetto_trace.json.gz", "*.trace.json.gz", "*.trace.json"):
        found = glob.glob(os.path.join(logdir, "**", pattern), recursive=True)
        if found:
            return max(found, key=os.path.getmtime)
    raise TraceError(f"no JSON trace under {logdir!r}: run jax.profiler.trace(logdir, "
                     f"create_perfetto_trace=True) first (an .xplane.pb alone needs XProf)")


def _read_json(source):
    if isinstance(source, (dict, list)):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"trace must be a path to a .json or .json.gz trace, or its decoded "
                        f"JSON (dict or list); got {type(source).__name__}")
    path = os.fspath(source)
    if os.path.isdir(path):
        path = find_trace_file(path)
    if not os.path.isfile(path):
        raise TraceError(f"trace file {path!r} does not exist")
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return json.loads(raw.decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TraceError(f"trace file {path!r} is not a (gzipped) JSON trace: "
                         f"{type(e).__name__}: {e}") from None


_DEVICE_PROCESS = re.compile(r"^/device:([A-Z][A-Z0-9_]*):(\d+)$")
_MODULE_ID = re.compile(r"\(\d+\)$")


def _device_of(process_name: str):
    """The device number of a trace process named ``/device:GPU:3`` / ``/device:TPU:0``
    (None for the host, ``/device:CUSTOM:...`` and anything else)."""
    m = _DEVICE_PROCESS.match(process_name or "")
    if not m or m.group(1) == "CUSTOM":
        return None
    return int(m.group(2))


_CONTROL_FLOW = frozenset({"while", "conditional", "call"})


def _leaves(ops: list) -> list:
    """The op events without the control-flow ops that enclose others of their thread: a
    while loop (XLA:CPU's ``while.5``) spans the ops of its body, which are traced too,
    so counting it as well would count that time twice."""
    by_thread = defaultdict(list)
    for op in ops:
        by_thread[(op[2], op[3])].append(op)
    out = []
    for evs in by_thread.values():
        evs.sort(key=lambda o: (o[4], -o[5]))
        for i, op in enumerate(evs):
            name, ts, dur = op[0], op[4], op[5]
            if _base_name(name) in _CONTROL_FLOW and any(
                    o[4] < ts + dur for o in evs[i + 1:i + 2]):
                continue
            out.append(op)
    return out


def load_trace(source, keep_runtime: bool = False) -> "Trace":
    """Parse a Chrome/Perfetto JSON trace into a :class:`Trace` of HLO-op events.

    ``source`` is a ``.json``/``.json.gz`` path, a folder that ``jax.profiler.trace`` wrote,
    or the decoded JSON (a dict with "traceEvents" or a bare list of events). Complete
    events (``"ph": "X"``) are read as follows, by where they ran:

    * **GPU and TPU** (the trace has ``/device:GPU:N`` or ``/device:TPU:N`` processes):
      only device-side events count, and the device is the ``N`` of the process name.
      On a GPU these are the kernels, each carrying ``args.hlo_op`` (an op that launches
      several kernels has several events per run); the host-side launch calls
      (``cuLaunchKernel``, ``hipModuleLaunchKernel``) carry the same ``hlo_op`` but are
      CPU time, and are left out. On a TPU they are the events of the "XLA Ops" line,
      named by the op, with the program taken from the "XLA Modules" line around them.
      XLA:GPU runs parts of many programs as command buffers (CUDA graphs), whose kernels
      would carry no op name, or all that of one command buffer. Recent XLA switches to
      running op by op while the profiler is active, so a trace keeps per-op attribution
      by default; it is lost when ``--xla_enable_command_buffers_during_profiling`` is
      set, or on an older XLA without that switch. A trace whose device events name no op
      at all raises :class:`TraceError` saying so (``--xla_gpu_enable_command_buffer=``,
      empty, turns command buffers off altogether).
    * **CPU** (no device process; XLA:CPU runs ops on host threads): events whose
      ``args`` name an ``hlo_op``, on the device of their ``args.device_ordinal``.

    A control-flow op (``while``, ``conditional``, ``call``) whose body's ops are traced
    inside it is left out, so that no time is counted twice.

    Named annotations (``jax.profiler.TraceAnnotation`` / ``StepTraceAnnotation``) on the
    host's Python thread are kept in ``Trace.annotations``. A file that is not JSON, has
    no event list, or has no executed op raises :class:`TraceError` saying so.
    """
    data = _read_json(source)
    if isinstance(data, dict):
        if "traceEvents" not in data:
            raise TraceError("the JSON has no 'traceEvents' list: not a Chrome/Perfetto trace")
        events = data["traceEvents"]
    else:
        events = data
    if not isinstance(events, list):
        raise TraceError("'traceEvents' must be a list of events")
    threads, devices = {}, {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "M":
            continue
        name = str((e.get("args") or {}).get("name", ""))
        if e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = name
        elif e.get("name") == "process_name" and _device_of(name) is not None:
            devices[e.get("pid")] = _device_of(name)
    complete = []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        try:
            ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"a complete event has no numeric 'ts'/'dur': {str(e)[:120]}") from None
        complete.append((e, ts, dur))
    t0 = min((ts for _, ts, _ in complete), default=0.0)
    on_device = any(e.get("pid") in devices for e, _, _ in complete)
    kernels, xla_ops, modules = defaultdict(list), defaultdict(list), defaultdict(list)
    ops, spans = [], []
    for e, ts, dur in complete:
        args = e.get("args") or {}
        pid = e.get("pid")
        thread = threads.get((pid, e.get("tid")), str(e.get("tid", "")))
        name = str(e.get("name", ""))
        if on_device and pid in devices:
            if thread == "XLA Modules":
                modules[pid].append((ts, ts + dur, _MODULE_ID.sub("", name)))
            elif thread == "XLA Ops":
                xla_ops[pid].append((str(args.get("hlo_op", name)),
                                     str(args.get("hlo_module", "")), devices[pid], thread,
                                     ts, dur, "", args))
            elif "hlo_op" in args:
                op = str(args["hlo_op"])
                kernels[pid].append((op, str(args.get("hlo_module", "")), devices[pid],
                                     thread, ts, dur, name if name != op else "", args))
        elif "hlo_op" in args and not on_device:
            dev = args.get("device_ordinal")
            try:
                dev = int(dev) if dev is not None else None
            except (TypeError, ValueError):
                dev = None
            ops.append((str(args["hlo_op"]), str(args.get("hlo_module", "")), dev, thread,
                        ts, dur, "", args))
        elif pid not in devices and thread.startswith("python") and not name.startswith("$"):
            spans.append((name, "", None, thread, ts, dur, "", args))
    for pid in devices:
        if kernels[pid]:              # a GPU's kernels (or any device events naming an op)
            ops.extend(kernels[pid])
            continue
        mods = sorted(modules[pid])
        starts = [m[0] for m in mods]
        for op, module, dev, thread, ts, dur, kernel, a in xla_ops[pid]:
            if not module:            # a TPU's op: the program running around it
                i = bisect.bisect_right(starts, ts) - 1
                if i >= 0 and mods[i][1] >= ts:
                    module = mods[i][2]
            ops.append((op, module, dev, thread, ts, dur, kernel, a))
    ops = _leaves(ops)
    if not ops:
        if on_device:
            raise TraceError("the trace's device events name no HLO op (no args.hlo_op, no "
                             "'XLA Ops' line): on a GPU, command buffers (CUDA graphs) hide "
                             "per-op attribution. Recent XLA runs op by op while profiling "
                             "unless --xla_enable_command_buffers_during_profiling is set: "
                             "unset it, or on an older XLA profile with XLA_FLAGS="
                             "--xla_gpu_enable_command_buffer= (empty) to see each op")
        raise TraceError("the trace holds no executed HLO ops (no event with args.hlo_op): "
                         "was anything run (and block_until_ready called) inside "
                         "jax.profiler.trace?")
    mk = [OpEvent(n, m, d, th, (ts - t0) * 1e-6, dur * 1e-6, k, a)
          for n, m, d, th, ts, dur, k, a in ops]
    ann = [OpEvent(n, m, d, th, (ts - t0) * 1e-6, dur * 1e-6, "", a)
           for n, m, d, th, ts, dur, _, a in spans]
    mk.sort(key=lambda ev: (ev.start, ev.device if ev.device is not None else -1))
    ann.sort(key=lambda ev: ev.start)
    path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else None
    return Trace(events=mk, annotations=ann, path=path)


# ------------------------------------------------------------------------------------------
# Real GPU and TPU profiles shipped with the package
# ------------------------------------------------------------------------------------------

REAL_PROFILES = ("tpu_v6e_offload", "gpu_mi300x_conv", "gpu_amd_te_attention")


@dataclass(frozen=True)
class RealProfile:
    """A real accelerator profile stored in ``scalebook/data/profiles`` (sources, licences
    and how it was converted in its README): ``trace`` is the path of its Perfetto JSON
    trace, ``hlo`` maps each program's name (``jit_f``) to the path of its compiled HLO."""

    name: str
    trace: str
    hlo: dict

    def hlo_text(self, module: str) -> str:
        if module not in self.hlo:
            raise ValueError(f"profile {self.name!r} stores the HLO of "
                             f"{', '.join(sorted(self.hlo))}; got {module!r}")
        with open(self.hlo[module]) as fh:
            return fh.read()


def real_profile(name: str) -> RealProfile:
    """One of :data:`REAL_PROFILES`: ``"tpu_v6e_offload"`` (4 TPU v6e chips: host offload
    and an all-reduce), ``"gpu_mi300x_conv"`` (8 AMD MI300X GPUs: a sharded convolution),
    ``"gpu_amd_te_attention"`` (one AMD GPU: Transformer Engine attention, Triton and
    cuBLAS gemms)."""
    if name not in REAL_PROFILES:
        raise ValueError(f"name must be one of {', '.join(REAL_PROFILES)}; got {name!r}")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "profiles")
    hlo = {}
    for path in sorted(glob.glob(os.path.join(root, "hlo", f"{name}.*.hlo.txt"))):
        module = os.path.basename(path)[len(name) + 1:-len(".hlo.txt")]
        hlo[module] = path
    return RealProfile(name, os.path.join(root, "traces", f"{name}.trace.json.gz"), hlo)


# ------------------------------------------------------------------------------------------
# The trace
# ------------------------------------------------------------------------------------------

@dataclass
class Trace:
    """The executed HLO ops of a profile (``events``) and the user's annotations.

    ``categories`` (``scalebook.hlo.op_categories(compiled)``), when set, labels the ops
    by the compiled program's own instructions instead of by their names.
    """

    events: list
    annotations: list = field(default_factory=list)
    path: str | None = None
    categories: dict | None = None

    def kind(self, name: str) -> str:
        return op_kind(name, self.categories)

    @property
    def devices(self) -> list:
        return sorted({e.device for e in self.events if e.device is not None})

    @property
    def modules(self) -> list:
        return sorted({e.module for e in self.events})

    def select(self, module: str | None = None, device=None, kind: str | None = None) -> list:
        """The events of one compiled program, device and/or kind."""
        if kind is not None and kind not in KINDS_ORDER:
            raise ValueError(f"kind must be one of {', '.join(KINDS_ORDER)}; got {kind!r}")
        if module is not None and module not in self.modules:
            raise ValueError(f"module {module!r} is not in the trace; it has "
                             f"{', '.join(self.modules)}")
        return [e for e in self.events
                if (module is None or e.module == module)
                and (device is None or e.device == device)
                and (kind is None or self.kind(e.name) == kind)]

    def summary(self, by: str = "op", module: str | None = None, device=None) -> list:
        """Events summed by ``by`` = "op" (HLO name), "kind" or "device"; largest total
        first. Totals add the durations on every device (8 devices running an op for 1 ms
        each is 8 ms)."""
        keys = {"op": lambda e: e.name, "kind": lambda e: self.kind(e.name),
                "device": lambda e: str(e.device), "module": lambda e: e.module}
        if by not in keys:
            raise ValueError(f"by must be one of {', '.join(keys)}; got {by!r}")
        total, count = defaultdict(float), defaultdict(int)
        for e in self.select(module=module, device=device):
            k = keys[by](e)
            total[k] += e.duration
            count[k] += 1
        grand = sum(total.values()) or 1.0
        rows = [OpSummary(k, count[k], total[k], total[k] / grand) for k in total]
        return sorted(rows, key=lambda r: (-r.total, r.key))

    def top(self, n: int = 10, module: str | None = None) -> list:
        """The ``n`` ops with the largest total time."""
        return self.summary("op", module=module)[:check_positive_int("n", n)]

    def table(self, n: int = 10, by: str = "op", module: str | None = None) -> str:
        """The summary as text, ``n`` rows."""
        rows = self.summary(by, module=module)[:check_positive_int("n", n)]
        return "\n".join(str(r) for r in rows)

    def steps(self, name: str) -> list:
        """The annotation spans called ``name`` (each ``StepTraceAnnotation("step",
        step_num=i)`` of :func:`capture`, or any ``TraceAnnotation(name)``)."""
        found = [a for a in self.annotations if a.name == name]
        if not found:
            names = sorted({a.name for a in self.annotations})
            raise ValueError(f"no annotation {name!r} in the trace; it has "
                             f"{', '.join(names) or 'none'}")
        return found

    def busy_time(self, device=None, module: str | None = None) -> float:
        """Seconds during which ``device`` ran at least one op (overlaps merged)."""
        spans = sorted((e.start, e.end) for e in self.select(module=module, device=device))
        busy, cur_s, cur_e = 0.0, None, None
        for s, t in spans:
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, t
            else:
                cur_e = max(cur_e, t)
        if cur_e is not None:
            busy += cur_e - cur_s
        return busy


def capture(fn, *args, steps: int = 2, warmup: int = 1, name: str = "step", logdir=None,
            categories: dict | None = None, python_tracer: bool = False) -> Trace:
    """Run ``fn(*args)`` ``warmup`` times untraced (so compilation is not in the trace),
    then ``steps`` times under ``jax.profiler.trace`` with ``create_perfetto_trace=True``,
    each inside ``jax.profiler.StepTraceAnnotation(name, step_num=i)`` (i = 0, 1, ...) and
    waited for with ``block_until_ready``. A step annotation is what XProf's per-step
    views (the overview page's step-time graph, the "Steps" line) read; a plain
    ``TraceAnnotation`` is only a named span. :meth:`Trace.steps` finds them by ``name``.

    The trace goes to a temporary folder that is deleted afterwards, unless ``logdir`` is
    given (then the files stay there, to open in XProf/TensorBoard or Perfetto).
    ``categories`` is passed on to the :class:`Trace` (``hlo.op_categories(compiled)``).
    ``python_tracer=False`` (the default) turns off the profiler's record of every Python
    function call, which :func:`load_trace` drops anyway and which makes tracing (a
    compilation above all) several times slower; JAX's own spans (``TraceAnnotation``, the
    compilations) stay in the trace.
    """
    import jax

    if not callable(fn):
        raise TypeError(f"fn must be a function (e.g. a jax.jit-ed step); got {type(fn).__name__}")
    steps = check_positive_int("steps", steps)
    if isinstance(warmup, bool) or not isinstance(warmup, numbers.Integral) or warmup < 0:
        raise ValueError(f"warmup must be a whole number >= 0; got {warmup!r}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string; got {name!r}")
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    tmp = logdir is None
    folder = tempfile.mkdtemp(prefix="scalebook-trace-") if tmp else os.fspath(logdir)
    try:
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 1 if python_tracer else 0
        with jax.profiler.trace(folder, create_perfetto_trace=True, profiler_options=options):
            for i in range(steps):
                with jax.profiler.StepTraceAnnotation(name, step_num=i):
                    jax.block_until_ready(fn(*args))
        trace = load_trace(find_trace_file(folder))
    finally:
        if tmp:
            shutil.rmtree(folder, ignore_errors=True)
    if tmp:
        trace.path = None
    trace.categories = categories
    return trace


# ------------------------------------------------------------------------------------------
# Overlap of communication with computation
# ------------------------------------------------------------------------------------------

COMPUTE_KINDS = ("matmul", "attention", "elementwise")


def overlap_seconds(a, b) -> float:
    """Seconds during which two events both ran (0 if they did not)."""
    return max(0.0, min(a.end, b.end) - max(a.start, b.start))


def overlapping_pairs(trace: Trace, module: str | None = None, device=None,
                      compute=COMPUTE_KINDS, at_least: float = 0.0) -> list:
    """The (collective, compute) pairs of events that ran at the same time on one device.

    A pair is a collective event and an event of a ``compute`` kind (matmul, attention,
    elementwise by default) on the same device, on different threads (streams, lines),
    whose time spans intersect: ``c.start < m.end and m.start < c.end``. Each is an
    instance of communication overlapping computation *as the trace records it*:

    * on XLA:CPU a collective is one blocking op, but the runtime runs independent
      instructions of a device concurrently on its threads, so a collective and a compute
      op that do not depend on each other can be in flight together;
    * on a GPU a collective kernel on its own stream next to a compute kernel;
    * on a TPU one "XLA Ops" line per chip holds every op, so an asynchronous collective
      (``-start`` / ``-done``) hides its transfer *between* its two events: this function
      finds no pairs there; read the gap between start and done instead.

    ``module`` and ``device`` restrict the events; ``at_least`` (seconds) keeps only pairs
    that overlap by that much (events that merely touch are left out). The pairs are sorted
    by the collective's start. ``len(...)`` counts them: 0 means nothing overlapped.
    """
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a scalebook.profiling.Trace; got {type(trace).__name__}")
    if isinstance(compute, str):
        compute = (compute,)
    bad = [k for k in compute if k not in KINDS_ORDER or k == "collective"]
    if bad or not compute:
        raise ValueError(f"compute must be kinds of op other than 'collective', from "
                         f"{', '.join(KINDS_ORDER)}; got {compute!r}")
    by_device = defaultdict(list)
    for e in trace.select(module=module, device=device):
        by_device[e.device].append(e)
    pairs = []
    for evs in by_device.values():
        colls = [e for e in evs if trace.kind(e.name) == "collective"]
        comp = sorted((e for e in evs if trace.kind(e.name) in compute),
                      key=lambda e: e.start)
        starts = [e.start for e in comp]
        for c in colls:
            for m in comp[:bisect.bisect_left(starts, c.end)]:   # started before c ended
                if (m.end > c.start and m.thread != c.thread
                        and overlap_seconds(c, m) >= at_least):
                    pairs.append((c, m))
    return sorted(pairs, key=lambda p: (p[0].start, p[1].start))


# ------------------------------------------------------------------------------------------
# Timeline figure
# ------------------------------------------------------------------------------------------

def plot_timeline(trace: Trace, ax=None, module: str | None = None, window=None,
                  devices=None, min_duration: float = 0.0, title: str | None = None):
    """One lane per device, one bar per op, coloured by kind (:data:`KIND_COLORS`).

    ``window`` = (start, end) in seconds limits the time range (e.g. one annotated step);
    ops shorter than ``min_duration`` seconds are left out. Returns the axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a scalebook.profiling.Trace; got {type(trace).__name__}")
    events = trace.select(module=module)
    if window is not None:
        if not (isinstance(window, (tuple, list)) and len(window) == 2 and window[0] < window[1]):
            raise ValueError(f"window must be (start, end) seconds with start < end; got {window!r}")
        events = [e for e in events if e.end > window[0] and e.start < window[1]]
    devs = trace.devices if devices is None else list(devices)
    if not devs:
        raise ValueError("the trace has no device ordinals to draw lanes for")
    events = [e for e in events if e.device in devs and e.duration >= min_duration]
    if not events:
        raise ValueError("no ops to draw in this window / for these devices")
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.35 * len(devs) + 1.4))
    t0 = window[0] if window is not None else min(e.start for e in events)
    lane = {d: i for i, d in enumerate(devs)}
    by_kind = defaultdict(list)
    for e in events:
        by_kind[trace.kind(e.name)].append(((e.start - t0) * 1e3, e.duration * 1e3, lane[e.device]))
    for kind in KINDS_ORDER:
        lanes = defaultdict(list)
        for s, w, y in by_kind.get(kind, []):
            lanes[y].append((s, w))
        for y, spans in lanes.items():      # one call per lane and kind: fast for big traces
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=KIND_COLORS[kind],
                           edgecolors="none")
    ax.set_yticks(range(len(devs)))
    ax.set_yticklabels([f"device {d}" for d in devs])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in KINDS_ORDER if k in by_kind],
              loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, frameon=False)
    if title:
        ax.set_title(title)
    return ax


# ------------------------------------------------------------------------------------------
# Measured op times against the roofline
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpComparison:
    """One op: its mean measured time per execution (seconds), the FLOPs and bytes the
    compiled program gives it, and its roofline time max(FLOPs / C, bytes / W)."""

    name: str
    kind: str
    count: int
    measured: float
    flops: float
    bytes: float
    predicted: Bounds

    @property
    def ratio(self) -> float:
        """measured / roofline (the lower bound): 1 means the op ran at the roofline."""
        return self.measured / self.predicted.lower if self.predicted.lower > 0 else math.inf

    HEADER = (f"{'op':<22} {'kind':<11} {'FLOPs':>8} {'bytes':>8}  {'roofline':>9} "
              f"{'bound':<5} {'measured':>9}  ratio")

    def __str__(self) -> str:
        """One line of at most 88 characters (the column of :attr:`HEADER`): the ratio
        measured / roofline is the last column."""
        from .units import fmt_time
        return (f"{self.name[:22]:<22} {self.kind[:11]:<11} {self.flops:8.3g} {self.bytes:8.3g}  "
                f"{fmt_time(self.predicted.lower):>9} {self.predicted.bottleneck[:3]:<5} "
                f"{fmt_time(self.measured):>9}  x{self.ratio:<5.3g}").rstrip()


def compare_with_roofline(trace: Trace, compiled, peak_flops: float, bandwidth: float,
                          n: int = 8, module: str | None = None) -> list:
    """The ``n`` ops of ``compiled`` with the largest total time in ``trace``, each with its
    mean measured duration and its roofline time on a device of ``peak_flops`` FLOP/s and
    ``bandwidth`` bytes/s (:func:`scalebook.hlo.ops` gives FLOPs and bytes per op).

    Collectives are left out: their roofline needs a link bandwidth, and on a simulated
    mesh their durations are waits for the slowest device (chapter 9 explains).
    """
    from . import hlo

    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a scalebook.profiling.Trace; got {type(trace).__name__}")
    C = check_positive("peak_flops (FLOP/s)", peak_flops)
    W = check_positive("bandwidth (bytes/s)", bandwidth)
    n = check_positive_int("n", n)
    table = {o.name: o for o in hlo.ops(compiled)}
    rows = []
    for r in trace.summary("op", module=module):
        o = table.get(r.key)
        if o is None or o.category == "collective" or (o.flops == 0 and o.bytes == 0):
            continue
        bounds = Bounds(compute=o.flops / C, memory=o.bytes / W)
        rows.append(OpComparison(r.key, op_kind(r.key, {k: v.category for k, v in table.items()}),
                                 r.count, r.mean, o.flops, o.bytes, bounds))
        if len(rows) == n:
            break
    if not rows:
        raise ValueError("none of the trace's ops is in the compiled program: pass the "
                         "Compiled of the function that was traced (and module= if the "
                         "trace holds several programs)")
    return rows


# ------------------------------------------------------------------------------------------
# Predicted profile of one transformer layer on a real chip
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PredictedOp:
    """One op of a predicted per-chip profile: FLOPs, HBM bytes and bytes sent per chip,
    its time (seconds: the roofline max(compute, memory) for on-chip work, the collective's
    time for communication) and what bounds it ("compute", "memory", "communication")."""

    name: str
    phase: str        # "forward" or "backward"
    kind: str         # matmul, attention, elementwise or collective
    flops: float
    hbm_bytes: float
    comm_bytes: float
    time: float
    bound: str


def predict_layer_profile(model, chip, tokens: int, seq_len: int, tp: int = 8,
                          bytes_per_element: float = 2, topology: str | None = None) -> list:
    """Op by op, one transformer layer's training step (forward then backward) on one chip
    of a ``tp``-way tensor-parallel group, for a microbatch of ``tokens`` tokens in
    sequences of ``seq_len`` (the book's cost model, chapters 1, 3 and 4).

    Megatron-style tensor parallelism: q/k/v, gate and up are split by columns, o and down
    by rows, so each chip holds 1/tp of every weight and of the heads, and the forward pass
    ends each of attention and MLP with an all-reduce of the [tokens, d] activations
    (the backward pass has two more, for the input gradients). Per op:

    * weight matmul [T, k] @ [k, n/tp]: 2 T k n / tp FLOPs; bytes s (T k + k n / tp + T n / tp)
      (or the row-split transpose); backward 2x the FLOPs and bytes (input and weight
      gradients);
    * attention (a fused kernel, full S x S scores): 4 T S H h / tp FLOPs, bytes of q, k, v
      and the output; backward 2x;
    * elementwise (norms, rotary embeddings, SiLU x up, residual adds): memory-bound,
      bytes = s x (read + write) of the arrays they touch; backward 2x;
    * all-reduce of s T d bytes over ``tp`` chips: :func:`scalebook.collectives.collective_time`
      with the chip's links (``topology``: "torus" for TPUs, "ring" over all NVLink links of
      the GPU, i.e. ``bandwidth = ici_bandwidth``, by default).

    Time of on-chip work = max(FLOPs / C, bytes / W_hbm) (perfect overlap inside an op).
    """
    m = get_model(model)
    c = get_chip(chip)
    T = check_positive_int("tokens", tokens)
    S = check_positive_int("seq_len", seq_len)
    if T % S:
        raise ValueError(f"tokens ({T}) must be a whole number of sequences of seq_len ({S})")
    tp = check_positive_int("tp (tensor-parallel chips)", tp)
    s = check_positive("bytes_per_element", bytes_per_element)
    d, F, H, K, h = m.d_model, m.d_ff, m.n_heads, m.n_kv_heads, m.head_dim
    for name, width in (("n_heads", H), ("n_kv_heads", K), ("d_ff", F)):
        if width % tp:
            raise ValueError(f"tp={tp} must divide the model's {name} ({width})")
    is_gpu = c.vendor.lower() == "nvidia"
    topo = topology or ("ring" if is_gpu else "torus")
    if topo not in ("ring", "torus"):
        raise ValueError(f"topology must be 'ring' or 'torus'; got {topology!r}")

    def on_chip(name, phase, kind, flops, nbytes):
        b = Bounds(compute=flops / c.bf16_flops, memory=nbytes / c.hbm_bandwidth)
        return PredictedOp(name, phase, kind, flops, nbytes, 0.0, b.lower, b.bottleneck)

    def all_reduce(name, phase):
        nbytes = s * T * d
        if tp == 1:
            return None
        if is_gpu and topo == "ring":
            t = collective_time("all-reduce", nbytes, tp, bandwidth=c.ici_bandwidth,
                                topology="ring")
        else:
            t = collective_time("all-reduce", nbytes, tp, c, topology=topo)
        from .collectives import ring_bytes
        return PredictedOp(name, phase, "collective", 0.0, 0.0,
                           ring_bytes("all-reduce", nbytes, tp), t, "communication")

    def weight(name, k, n, phase="forward", mult=1):
        flops = 2 * T * k * n / tp
        nbytes = s * (T * k + k * n / tp + T * n / tp)
        return on_chip(name, phase, "matmul", mult * flops, mult * nbytes)

    qkv = H * h + 2 * K * h
    fwd = [
        on_chip("attention norm", "forward", "elementwise", 4 * T * d, s * 2 * T * d),
        weight("q, k, v projections", d, qkv),
        on_chip("rotary embedding", "forward", "elementwise", 6 * T * (H + K) * h / tp,
                s * 2 * T * (H + K) * h / tp),
        on_chip("attention (fused)", "forward", "attention", 4 * T * S * H * h / tp,
                s * T * (2 * H * h + 2 * K * h) / tp),
        weight("o projection", H * h, d),
        all_reduce("all-reduce (attention out)", "forward"),
        on_chip("residual + MLP norm", "forward", "elementwise", 5 * T * d, s * 3 * T * d),
        weight("MLP gate + up", d, 2 * F),
        on_chip("SiLU x up", "forward", "elementwise", 5 * T * F / tp, s * 3 * T * F / tp),
        weight("MLP down", F, d),
        all_reduce("all-reduce (MLP out)", "forward"),
        on_chip("residual add", "forward", "elementwise", T * d, s * 3 * T * d),
    ]
    bwd = []
    for op in reversed(fwd):
        if op is None or op.kind == "collective":
            continue           # the forward all-reduces' gradients pass through unchanged
        bwd.append(on_chip(op.name, "backward", op.kind, 2 * op.flops, 2 * op.hbm_bytes))
        if op.name in ("MLP gate + up", "q, k, v projections"):
            # the input gradient of a column-split matmul is a partial sum over the chips
            part = "MLP" if op.name.startswith("MLP") else "attention"
            bwd.append(all_reduce(f"all-reduce (grad of {part} input)", "backward"))
    return [op for op in fwd + bwd if op is not None]


def predicted_breakdown(ops) -> dict:
    """{kind: seconds} of a predicted profile, plus "total" (no overlap of communication
    with compute: the all-reduces of tensor parallelism wait for the op before them)."""
    out = {k: 0.0 for k in ("matmul", "attention", "elementwise", "collective")}
    for op in ops:
        if not isinstance(op, PredictedOp):
            raise TypeError("ops must be the list that predict_layer_profile returns")
        out[op.kind] += op.time
    out["total"] = sum(out.values())
    return out


def plot_predicted(ops, ax=None, label: str = "", y: float = 0.0):
    """Draw a predicted profile as a profiler would show it: ops one after another on a
    compute lane (y) and the collectives on a communication lane below it (y + 1).
    Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 1.6))
    t = 0.0
    for op in ops:
        if not isinstance(op, PredictedOp):
            raise TypeError("ops must be the list that predict_layer_profile returns")
        lane = y + 1 if op.kind == "collective" else y
        ax.broken_barh([(t * 1e3, op.time * 1e3)], (lane - 0.4, 0.8),
                       facecolors=KIND_COLORS[op.kind], edgecolors="white", linewidth=0.4)
        t += op.time
    ax.set_xlabel("time (ms)")
    return ax


# ------------------------------------------------------------------------------------------
# Tiled layouts
# ------------------------------------------------------------------------------------------

def padded_bytes(shape, dtype="float32", tile=(8, 128)) -> int:
    """Bytes an array of ``shape`` occupies when its minor dimensions are stored in tiles of
    ``tile`` (XLA's tiled layout ``{...:T(8,128)}``): each of the last ``len(tile)``
    dimensions is rounded up to a multiple of its tile size, and padding is stored too.
    ``tile=()`` gives the plain size."""
    from .units import dtype_bytes

    if not isinstance(shape, (tuple, list)) or any(
            isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 0 for d in shape):
        raise ValueError(f"shape must be a tuple of whole numbers >= 0; got {shape!r}")
    if not isinstance(tile, (tuple, list)) or any(
            isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 1 for t in tile):
        raise ValueError(f"tile must be a tuple of positive whole numbers; got {tile!r}")
    if len(tile) > len(shape):
        raise ValueError(f"tile {tuple(tile)} has more dimensions than shape {tuple(shape)}")
    dims = list(shape)
    for i, t in enumerate(tile, start=len(shape) - len(tile)):
        dims[i] = -(-dims[i] // t) * t
    return int(math.prod(dims) * dtype_bytes(dtype))


# ------------------------------------------------------------------------------------------
# Counting compilations
# ------------------------------------------------------------------------------------------

_COMPILES = {"n": 0, "listening": False}
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _on_event(name, duration, **kwargs):
    if name == _COMPILE_EVENT:
        _COMPILES["n"] += 1


def compilations() -> int:
    """How many programs XLA has compiled in this process since the first call of this
    function (it installs a ``jax.monitoring`` listener). Take the difference of two calls
    to count the compilations of a piece of code: a jitted function that recompiles on
    every call shows up here."""
    import jax

    if not _COMPILES["listening"]:
        jax.monitoring.register_event_duration_secs_listener(_on_event)
        _COMPILES["listening"] = True
    return _COMPILES["n"]


# ------------------------------------------------------------------------------------------
# Device memory profiles (pprof)
# ------------------------------------------------------------------------------------------

def _varint(b: bytes, i: int):
    out = shift = 0
    while True:
        c = b[i]
        i += 1
        out |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return out, i


def _fields(b: bytes):
    """(field number, value) of a serialized protobuf message (its wire format)."""
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        kind = key & 7
        if kind == 0:
            v, i = _varint(b, i)
        elif kind == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif kind == 1:
            v, i = b[i:i + 8], i + 8
        elif kind == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"not a protobuf message (wire type {kind})")
        yield key >> 3, v


def _ints(v) -> list:
    """A repeated integer field, packed (bytes) or not (one int)."""
    if isinstance(v, int):
        return [v]
    out, i = [], 0
    while i < len(v):
        x, i = _varint(v, i)
        out.append(x)
    return out


@dataclass(frozen=True)
class LiveBuffer:
    """The live arrays of one device made at one place: ``bytes`` in ``count`` buffers,
    ``kind`` ("buffer": arrays; "executable": compiled programs), and ``stack``, the
    Python frames that allocated them, innermost first, as (function, file, line)."""

    device: str
    kind: str
    bytes: int
    count: int
    stack: tuple

    def where(self, skip=("/jax/", "/jaxlib/", "/scalebook/", "site-packages")) -> tuple:
        """The innermost frame whose file is none of ``skip``: the user's own line."""
        for frame in self.stack:
            if not any(s in frame[1] for s in skip):
                return frame
        return self.stack[0] if self.stack else ("", "", 0)


def memory_profile(data: bytes | None = None, kind: str | None = "buffer") -> list:
    """The device memory in use now, by allocation site: ``data`` is what
    ``jax.profiler.device_memory_profile()`` returns (taken now when None), a gzipped
    pprof ``Profile`` whose samples are the live buffers with the Python stack that
    allocated them and ``kind``/``device`` labels. Returns one :class:`LiveBuffer` per
    (device, kind, stack), largest first; ``kind=None`` keeps executables too.

    A snapshot, not a peak: call it where memory matters (after a step, or in an
    out-of-memory handler) to see which arrays hold the memory and which line made them.
    The peak *inside* a compiled program is the compiler's (``hlo.memory``,
    ``hlo.live_memory``, XProf's memory viewer). ``pprof`` reads the same data
    (``pprof --web file.prof`` on a saved copy)."""
    import gzip as _gzip

    if data is None:
        import jax
        data = jax.profiler.device_memory_profile()
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"data must be the bytes of jax.profiler.device_memory_profile(); "
                        f"got {type(data).__name__}")
    raw = _gzip.decompress(data) if data[:2] == b"\x1f\x8b" else bytes(data)
    try:
        top = defaultdict(list)
        for k, v in _fields(raw):
            top[k].append(v)
        strings = [b.decode("utf-8", "replace") for b in top[6]]
        types = [dict(_fields(t)) for t in top[1]]
        functions = {}
        for f in top[5]:
            d = dict(_fields(f))
            functions[d.get(1, 0)] = (strings[d.get(2, 0)], strings[d.get(4, 0)])
        locations = {}
        for loc in top[4]:
            d = defaultdict(list)
            for k, v in _fields(loc):
                d[k].append(v)
            frames = []
            for line in d[4]:
                ld = dict(_fields(line))
                fn, file = functions.get(ld.get(1, 0), ("", ""))
                frames.append((fn, file, ld.get(2, 0)))
            locations[d[1][0] if d[1] else 0] = frames
        value_names = [strings[t.get(1, 0)] for t in types]
        i_bytes = value_names.index("space") if "space" in value_names else len(types) - 1
        i_count = value_names.index("allocations") if "allocations" in value_names else 0
        totals = defaultdict(lambda: [0, 0])
        for sample in top[2]:
            d = defaultdict(list)
            for k, v in _fields(sample):
                d[k].append(v)
            locs = [x for v in d[1] for x in _ints(v)]
            values = [x for v in d[2] for x in _ints(v)]
            labels = {}
            for lab in d[3]:
                ld = dict(_fields(lab))
                labels[strings[ld.get(1, 0)]] = strings[ld.get(2, 0)]
            stack = tuple(f for loc in locs for f in locations.get(loc, []))
            key = (labels.get("device", ""), labels.get("kind", ""), stack)
            totals[key][0] += values[i_bytes] if i_bytes < len(values) else 0
            totals[key][1] += values[i_count] if i_count < len(values) else 0
    except (IndexError, KeyError, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"data is not a pprof memory profile: {type(e).__name__}: {e}") \
            from None
    rows = [LiveBuffer(dev, k, nbytes, count, stack)
            for (dev, k, stack), (nbytes, count) in totals.items()
            if kind is None or k == kind]
    return sorted(rows, key=lambda r: (-r.bytes, r.device, r.stack))

