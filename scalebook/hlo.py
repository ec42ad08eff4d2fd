"""Reading compiled programs: HLO text, the collectives in it, and XLA's cost analysis.

* :func:`hlo_text` -- the HLO text of a ``jax.stages.Compiled`` (local file tables cut).
* :func:`collectives` -- one :class:`Collective` record per collective operation (kind,
  replica groups, shapes, dtype, loop count) with the bytes each device sends under the
  ring model of :mod:`scalebook.collectives`; :func:`total_bytes`, :func:`summarize`,
  :func:`collective_lines` (the HLO lines, for display), :func:`parse_replica_groups`
  (every replica-group syntax XLA prints).
* :func:`cost` -- ``compiled.cost_analysis()`` as one dict on every JAX version;
  :func:`xla_flops` -- the FLOPs XLA counts for ``jax.jit(fn)(*args)``;
  :func:`matmul_flops_traced` -- the FLOPs of the ``dot_general`` ops of a traced program.
* :func:`memory` -- ``compiled.memory_analysis()`` as a small record of byte counts
  (XLA's peak and the host-memory counts of host offload included).
* :func:`ops` -- the instructions that run as separate steps (what a profiler trace shows),
  one :class:`Op` each with its category, FLOPs (of the dots, convolutions and gemm
  custom-calls inside) and bytes (operands + result); :func:`fusions`,
  :func:`count_fusions`, :func:`op_categories` (chapter 9). They read the HLO of any
  backend: XLA:CPU's, a GPU's (cuBLAS/cuDNN custom-calls, Triton gemm fusions) or a
  TPU's (collectives fused into ``kind=kCustom`` fusions, layouts such as ``S(1)``).
* :func:`op_sources` -- each instruction's ``op_name`` (the ``jax.named_scope`` path) and
  the source line it came from; :func:`live_memory` -- the bytes live in one memory space
  (HBM, host, ...) as the entry computation runs, and what is live at the peak;
  :func:`peak_buffers` -- the buffers XLA's own buffer assignment finds live at the peak
  (the ``live-range`` file of an ``xla_dump_to`` dump).

What a comparison with these verifies: the kinds, shapes, dtypes and replica groups are
XLA's own; a byte count derived from those shapes with :func:`scalebook.collectives.ring_bytes`
checks the shapes and groups, not the ring formula itself.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from .collectives import KINDS, ring_bytes
from .units import DTYPE_BYTES

__all__ = [
    "Collective", "collectives", "hlo_text", "collective_lines", "total_bytes", "summarize",
    "parse_replica_groups", "cost", "xla_flops", "matmul_flops_traced", "MemoryUse", "memory",
    "Op", "ops", "fusions", "count_fusions", "op_categories", "OP_CATEGORIES", "entry_lines",
    "OpSource", "op_sources", "LiveMemory", "live_memory", "peak_buffers",
]


# ------------------------------------------------------------------------------------------
# ------------------------------------------------------------------------------------------
# The records
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Collective:
    """One collective operation found in a compiled program.

    kind: "all-gather", "reduce-scatter", "all-reduce", "all-to-all" or "collective-permute".
    name: the HLO instruction name. group_size: devices in each replica group (for a
    collective-permute, the devices that really send). groups: the replica groups as
    tuples of device ids (for a permute, the (source, target) pairs). dtype: the element
    type the collective really moves (on XLA:CPU a bf16 program may move f32).
    operand_shapes / result_shapes: per-device shapes such as "f32[4,16]" (several for a
    combined, tuple-shaped collective). bytes_per_device: bytes each taking part device
    sends once, ring model (module docstring). count: how many times it runs (the trip
    count of the while loops around it). rs_like: an all-reduce whose result is only
    sliced down to 1/n per device, which is how XLA:CPU compiles a reduce-scatter.
    is_async: it was an async ``-start``/``-done`` pair (counted once).
    """

    kind: str
    name: str
    group_size: int
    groups: tuple
    dtype: str
    operand_shapes: tuple
    result_shapes: tuple
    bytes_per_device: float
    count: int = 1
    rs_like: bool = False
    is_async: bool = False
    op_name: str = ""

    @property
    def total_bytes(self) -> float:
        """bytes_per_device x count: what one device sends for this op over the whole program."""
        return self.bytes_per_device * self.count

    @property
    def reduce_scatter_bytes(self) -> float | None:
        """For an rs_like all-reduce: the bytes a real reduce-scatter would send (half)."""
        if not self.rs_like:
            return None
        return ring_bytes("reduce-scatter", _sum_bytes(self.operand_shapes), self.group_size)

    @property
    def source_target_pairs(self) -> tuple:
        """For a collective-permute: its (source, target) pairs of partition ids, as the
        program lists them (self-pairs included); () for any other kind."""
        return tuple(self.groups) if self.kind == "collective-permute" else ()

    def hops(self, mesh_shape, axis: int) -> tuple | None:
        """For a collective-permute on a mesh of ``mesh_shape``: the distinct hops its real
        sends make along mesh dimension ``axis`` (an int), sorted, each taken the short way
        round that axis's ring, between -n/2 and n/2 (on an axis of 4, a send from position
        3 to 0 is +1 and one from 0 to 3 is -1; 0 to 2 is 2). None if a send also moves
        along another mesh dimension. Partition ids number the mesh's positions in
        row-major order, as the compiled program does (not ``device.id``). A ring step
        between neighbours gives ``(-1,)`` or ``(1,)``."""
        if self.kind != "collective-permute":
            raise ValueError(f"hops are defined for a collective-permute; this is {self.kind}")
        shape = tuple(int(s) for s in mesh_shape)
        if not shape or any(s < 1 for s in shape):
            raise ValueError(f"mesh_shape must be positive axis sizes; got {mesh_shape!r}")
        if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < len(shape):
            raise ValueError(f"axis must be a mesh dimension, 0 to {len(shape) - 1}; "
                             f"got {axis!r}")
        size = math.prod(shape)
        n = shape[axis]
        found = set()
        for s, t in self.source_target_pairs:
            if s == t:
                continue
            if not (0 <= s < size and 0 <= t < size):
                raise ValueError(f"pair ({s}, {t}) names a partition outside a mesh of "
                                 f"{size} devices {shape}")
            ps, pt = np.unravel_index(s, shape), np.unravel_index(t, shape)
            if any(a != b for d, (a, b) in enumerate(zip(ps, pt)) if d != axis):
                return None
            d = (int(pt[axis]) - int(ps[axis])) % n
            found.add(d - n if d > n / 2 else d)
        return tuple(sorted(found))

    def __str__(self) -> str:
        extra = " (all-reduce + slice: a reduce-scatter on CPU)" if self.rs_like else ""
        loop = f" x{self.count}" if self.count != 1 else ""
        return (f"{self.kind:<18} {self.dtype:<5} n={self.group_size:<2} "
                f"{' '.join(self.operand_shapes)} -> {' '.join(self.result_shapes)}: "
                f"{self.bytes_per_device:.4g} B/device{loop}{extra}")


# ------------------------------------------------------------------------------------------
# Reading HLO text
# ------------------------------------------------------------------------------------------

_SHAPE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMP = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$|^\s*(ENTRY\s+)?%?([\w.\-]+)\s*\{\s*$")
_START_SUFFIX = "-start"
_DONE_SUFFIX = "-done"


def hlo_text(compiled) -> str:
    """The HLO text of ``compiled`` (a jax.stages.Compiled or HLO text), without the
    FileNames/FunctionNames/FileLocations/StackFrames tables (they hold local file paths).
    """
    if isinstance(compiled, str):
        text = compiled
    elif hasattr(compiled, "as_text") and hasattr(compiled, "cost_analysis") and \
            type(compiled).__name__ == "Compiled":
        text = compiled.as_text()
        if not isinstance(text, str):
            raise ValueError("compiled.as_text() returned no HLO text for this program")
    elif type(compiled).__name__ == "Lowered":
        raise TypeError("compiled: got a jax.stages.Lowered; call .compile() on it first "
                        "(the collectives exist only after the SPMD partitioner has run)")
    elif callable(compiled):
        raise TypeError("compiled: got a function; pass jax.jit(f, ...).lower(*args).compile() "
                        "or its .as_text()")
    else:
        raise TypeError(f"compiled must be a jax.stages.Compiled or HLO text (str); got "
                        f"{type(compiled).__name__}")
    lines, skipping = [], False
    for line in text.split("\n"):
        if line.strip() in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            skipping = True
            continue
        if skipping:
            if re.match(r"^\d+ ", line) or not line.strip():
                continue
            skipping = False
        lines.append(line)
    return "\n".join(lines)


def _strip_comments(s: str) -> str:
    return re.sub(r"/\*.*?\*/", "", s)


def _split_type(rest: str) -> tuple[str, str]:
    """Split 'TYPE opcode(...), attrs' into (TYPE, 'opcode(...), attrs')."""
    rest = rest.strip()
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[:i + 1], rest[i + 1:].strip()
        raise ValueError(f"unbalanced parentheses in HLO type: {rest[:80]!r}")
    m = re.match(r"^(\S+)\s+(.*)$", rest)
    if not m:
        return rest, ""
    return m.group(1), m.group(2)


def _shapes(type_text: str) -> list[str]:
    """['f32[4,16]', ...] from an HLO type (layouts dropped)."""
    return [f"{d}[{dims}]" for d, dims in _SHAPE.findall(type_text) if d in DTYPE_BYTES]


def _shape_bytes(shape: str) -> float:
    m = _SHAPE.match(shape)
    dtype, dims = m.group(1), m.group(2)
    n = math.prod(int(x) for x in dims.split(",") if x) if dims else 1
    return n * DTYPE_BYTES[dtype]


def _sum_bytes(shapes) -> float:
    return float(sum(_shape_bytes(s) for s in shapes))


def _args(call: str) -> tuple[str, list[str], str]:
    """From 'opcode(%a, %b), attrs' return (opcode, operand names, attrs)."""
    m = re.match(r"^([\w\-]+)\((.*)$", call)
    if not m:
        return call.split(",")[0].strip(), [], ""
    opcode, tail = m.group(1), m.group(2)
    depth, i = 1, 0
    for i, ch in enumerate(tail):
        depth += ch in "({["
        depth -= ch in ")}]"
        if depth == 0:
            break
    inner, attrs = tail[:i], tail[i + 1:]
    names = re.findall(r"%([\w.\-]+)", inner)
    if not names:   # operands printed without '%'
        names = [p.strip().split()[-1] for p in inner.split(",") if p.strip()]
    return opcode, names, attrs


def _attr(attrs: str, key: str) -> str | None:
    """The value of ``key=...`` in an attribute list, braces/brackets balanced."""
    m = re.search(r"(?:^|[\s,])" + re.escape(key) + r"=", attrs)
    if not m:
        return None
    s = attrs[m.end():]
    depth = 0
    for i, ch in enumerate(s):
        if ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
            if depth < 0:
                return s[:i].strip()
        elif ch == "," and depth == 0:
            # the mesh form continues after a comma: mesh['a'=2], device_ids=(...) {...}
            if s[:i].lstrip().startswith("mesh[") and not re.search(r"\}\s*$", s[:i]):
                continue
            return s[:i].strip()
    return s.strip()


def _iota(spec: str) -> np.ndarray:
    """Device ids of an iota list '[d0,d1,...]T(p0,p1,...)' or '[8]', flattened."""
    m = re.fullmatch(r"\s*\[([0-9,\s]+)\]\s*(?:T\(([0-9,\s]+)\))?\s*", spec)
    if not m:
        raise ValueError(f"cannot read iota device list {spec!r}")
    dims = [int(x) for x in m.group(1).split(",") if x.strip()]
    arr = np.arange(math.prod(dims)).reshape(dims)
    if m.group(2):
        arr = arr.transpose([int(x) for x in m.group(2).split(",") if x.strip()])
    return arr.reshape(-1)


def parse_replica_groups(text: str, num_devices: int | None = None) -> tuple:
    """Decode an HLO ``replica_groups`` value into a tuple of device-id tuples.

    Three syntaxes are understood:

    * explicit lists: ``{{0,1,2,3},{4,5,6,7}}`` (``{}`` means one group of all devices,
      which needs ``num_devices``);
    * iota lists: ``[2,4]<=[8]`` (``arange(8).reshape(2, 4)``) and
      ``[4,2]<=[2,4]T(1,0)`` (``arange(8).reshape(2, 4).T.reshape(4, 2)``);
    * the mesh-axes form ``mesh['a'=2,'b'=4] {'b'}``, optionally with
      ``device_ids=([2,2,2]T(0,2,1))`` and sub-axes ``{'a':(pre)size}``: the group runs
      along the listed axes, in the listed order, and every combination of the other axes
      gives one group.
    """
    if not isinstance(text, str):
        raise TypeError(f"replica groups must be text; got {type(text).__name__}")
    s = text.strip()
    if s.startswith("mesh["):
        return _mesh_groups(s)
    if "<=" in s:
        m = re.fullmatch(r"\[([0-9,\s]+)\]\s*<=\s*(.+)", s)
        if not m:
            raise ValueError(f"cannot read iota replica groups {text!r}")
        shape = [int(x) for x in m.group(1).split(",") if x.strip()]
        ids = _iota(m.group(2))
        if len(shape) != 2 or math.prod(shape) != ids.size:
            raise ValueError(f"iota replica groups {text!r}: group shape {shape} does not hold "
                             f"{ids.size} devices")
        return tuple(tuple(int(d) for d in row) for row in ids.reshape(shape))
    if s.startswith("{"):
        inner = s[1:-1].strip() if s.endswith("}") else None
        if inner is None:
            raise ValueError(f"cannot read replica groups {text!r}")
        if not inner:
            if num_devices is None:
                raise ValueError("replica_groups={} means all devices, but the device count is "
                                 "unknown (no num_partitions in the HLO): pass num_devices")
            return (tuple(range(num_devices)),)
        groups = re.findall(r"\{([0-9,\s]*)\}", inner)
        if not groups:
            raise ValueError(f"cannot read replica groups {text!r}")
        return tuple(tuple(int(x) for x in g.split(",") if x.strip()) for g in groups)
    raise ValueError(f"cannot read replica groups {text!r}: expected {{{{...}}}}, "
                     f"[g,n]<=[...] or mesh[...] {{...}}")


def _mesh_groups(s: str) -> tuple:
    m = re.match(r"mesh\[(.*?)\]\s*(?:,\s*device_ids=\((.*?\)?)\))?\s*\{(.*)\}\s*$", s)
    if not m:
        raise ValueError(f"cannot read mesh replica groups {s!r}")
    axes = [(a, int(n)) for a, n in re.findall(r"'([^']+)'\s*=\s*(\d+)", m.group(1))]
    if not axes:
        raise ValueError(f"mesh replica groups {s!r} name no axes")
    names = [a for a, _ in axes]
    total = math.prod(n for _, n in axes)
    if m.group(2):
        dev = m.group(2).strip()
        ids = _iota(dev) if dev.startswith("[") else np.array(
            [int(x) for x in dev.split(",") if x.strip()])
        if ids.size != total:
            raise ValueError(f"mesh replica groups {s!r}: device_ids has {ids.size} devices, "
                             f"the mesh {total}")
    else:
        ids = np.arange(total)
    # Listed (sub-)axes: 'a' or 'a':(pre)size.
    listed = []
    for name, pre, size in re.findall(r"'([^']+)'(?:\s*:\s*\((\d+)\)(\d+))?", m.group(3)):
        if name not in names:
            raise ValueError(f"mesh replica groups {s!r}: axis {name!r} is not in the mesh")
        listed.append((name, int(pre) if pre else None, int(size) if size else None))
    # Split each axis into the sub-axes its listed pieces need (major to minor).
    factors, keys = [], []
    for name, n in axes:
        cuts = {1, n}
        for lname, pre, size in listed:
            if lname == name and pre is not None:
                if n % (pre * size):
                    raise ValueError(f"sub-axis ({pre}){size} does not divide axis {name!r}={n}")
                cuts |= {pre, pre * size}
        cuts = sorted(cuts)
        # A sub-axis ``(p)q`` has the more-major sub-axes' product p before it and size q:
        # it covers the cut interval [p, p*q). Increasing p runs from major to minor.
        pieces = [(cuts[i], cuts[i + 1] // cuts[i]) for i in range(len(cuts) - 1)]
        for p, q in pieces:
            factors.append(q)
            keys.append((name, p, q))
    arr = ids.reshape(factors) if factors else ids
    chosen = []
    for name, pre, size in listed:
        if pre is None:
            idx = [i for i, k in enumerate(keys) if k[0] == name]
        else:
            idx = [i for i, k in enumerate(keys) if k == (name, pre, size)]
            if not idx:  # a piece made of several cut intervals
                raise ValueError(f"mesh replica groups {s!r}: cannot place sub-axis {name}:({pre}){size}")
        chosen.extend(idx)
    others = [i for i in range(len(factors)) if i not in chosen]
    group_size = math.prod(factors[i] for i in chosen) if chosen else 1
    arr = arr.transpose(others + chosen).reshape(-1, group_size)
    return tuple(tuple(int(d) for d in row) for row in arr)


@dataclass
class _Instr:
    name: str
    computation: str
    type_text: str
    opcode: str
    operands: list
    attrs: str
    line: str
    users: list = field(default_factory=list)


def _parse_module(text: str):
    comps: dict[str, list[_Instr]] = {}
    entry, current = None, None
    for raw in text.split("\n"):
        line = _strip_comments(raw).rstrip()
        if not line.strip() or line.lstrip().startswith("HloModule"):
            continue
        cm = _COMP.match(line)
        if cm and "=" not in line.split("(")[0]:
            name = cm.group(2) or cm.group(5)
            current = name
            comps.setdefault(name, [])
            if cm.group(1) or cm.group(4):
                entry = name
            continue
        if line.strip() == "}":
            current = None
            continue
        im = _INSTR.match(line)
        if not im:
            continue
        type_text, call = _split_type(im.group(2))
        opcode, operands, attrs = _args(call)
        comp = current if current is not None else "<snippet>"
        comps.setdefault(comp, []).append(
            _Instr(im.group(1), comp, type_text, opcode, operands, attrs, line.strip()))
    return comps, entry


def _multipliers(comps, entry) -> dict[str, int]:
    """How many times each computation runs: products of known while-loop trip counts."""
    mult: dict[str, int] = {}
    roots = [entry] if entry else list(comps)

    def visit(comp, k, depth=0):
        if depth > 64 or comp not in comps:
            return
        mult[comp] = mult.get(comp, 0) + k
        for ins in comps[comp]:
            if ins.opcode == "while":
                trip = 1
                cfg = re.search(r"backend_config=(\{.*\})", ins.attrs)
                if cfg:
                    m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)"?', cfg.group(1))
                    if m:
                        trip = int(m.group(1))
                body = _attr(ins.attrs, "body")
                cond = _attr(ins.attrs, "condition")
                if body:
                    visit(body.lstrip("%"), k * trip, depth + 1)
                if cond:
                    visit(cond.lstrip("%"), k * (trip + 1), depth + 1)
                continue
            for key in ("calls", "branch_computations", "true_computation", "false_computation"):
                v = _attr(ins.attrs, key)
                if v:
                    for c in re.findall(r"%?([\w.\-]+)", v):
                        visit(c, k, depth + 1)

    for r in roots:
        if entry is None and r in mult:
            continue
        visit(r, 1)
    return mult


def _kind(opcode: str) -> tuple[str | None, bool]:
    """('all-gather', is_async) for 'all-gather' or 'all-gather-start'; (None, _) otherwise."""
    base, is_async = opcode, False
    if opcode.endswith(_START_SUFFIX):
        base, is_async = opcode[: -len(_START_SUFFIX)], True
    return (base if base in KINDS else None), is_async



def collectives(compiled, num_devices: int | None = None) -> list[Collective]:
    """One :class:`Collective` per collective in a compiled program, in program order.

    ``compiled`` is a ``jax.stages.Compiled`` (``jax.jit(f).lower(...).compile()``) or its
    ``as_text()``. Collectives inside while loops with a known trip count get that
    ``count``; async start/done pairs count once (at the start); a tuple-shaped (combined)
    collective is one record whose bytes add up all its operands. ``num_devices`` is only
    needed for ``replica_groups={}`` in text without a ``num_partitions`` header.
    """
    text = hlo_text(compiled)
    if not re.search(r"%?[\w.\-]+\s*=\s*\S", text) or not re.search(r"\w+\[[0-9,]*\]", text):
        raise ValueError("compiled: the text does not look like HLO (no instructions such as "
                         "'%x = f32[4] add(%a, %b)' found)")
    if num_devices is None:
        m = re.search(r"num_partitions=(\d+)", text)
        if m and int(m.group(1)) > 1:
            num_devices = int(m.group(1))
        else:
            m = re.search(r"replica_count=(\d+)", text)
            num_devices = int(m.group(1)) if m else None
    comps, entry = _parse_module(text)
    table: dict[str, _Instr] = {}
    for instrs in comps.values():
        for ins in instrs:
            table[ins.name] = ins
    for ins in table.values():
        for op in ins.operands:
            if op in table:
                table[op].users.append(ins)
    mult = _multipliers(comps, entry)
    out = []
    for comp, instrs in comps.items():
        for ins in instrs:
            kind, is_async = _kind(ins.opcode)
            if kind is None:
                continue
            out.append(_record(ins, kind, is_async, table, comps, mult.get(comp, 1) or 1,
                               num_devices))
    return out


def _record(ins, kind, is_async, table, comps, count, num_devices) -> Collective:
    operand_shapes = []
    for op in ins.operands:
        if op not in table:
            raise ValueError(f"collective {ins.name}: operand %{op} is not defined in the HLO "
                             f"text (pass the whole module, not one line)")
        operand_shapes.extend(_shapes(table[op].type_text))
    result_shapes = _shapes(ins.type_text)
    if is_async:
        dones = [u for u in ins.users if u.opcode == kind + _DONE_SUFFIX]
        if dones:
            result_shapes = _shapes(dones[0].type_text)
        elif kind != "all-reduce":
            # start returns (operands..., results..., contexts); keep the results
            result_shapes = result_shapes[len(operand_shapes):][:len(operand_shapes)]
    operand_shapes, result_shapes = tuple(operand_shapes), tuple(result_shapes)
    dtypes = sorted({s.split("[")[0] for s in operand_shapes + result_shapes})
    dtype = dtypes[0] if len(dtypes) == 1 else "/".join(dtypes)
    meta = re.search(r'op_name="([^"]*)"', ins.attrs)
    op_name = meta.group(1) if meta else ""
    rs_like = False
    if kind == "collective-permute":
        pairs_text = _attr(ins.attrs, "source_target_pairs")
        pairs = tuple(tuple(int(x) for x in p.split(",")) for p in
                      re.findall(r"\{\s*(\d+\s*,\s*\d+)\s*\}", pairs_text or ""))
        senders = {a for a, b in pairs if a != b}
        group_size = len(senders)
        groups = pairs
        nbytes = _sum_bytes(operand_shapes) if senders else 0.0
    else:
        rg = _attr(ins.attrs, "replica_groups")
        if rg is None:
            if num_devices is None:
                raise ValueError(f"collective {ins.name} has no replica_groups and the device "
                                 f"count is unknown: pass num_devices")
            groups = (tuple(range(num_devices)),)
        else:
            groups = parse_replica_groups(rg, num_devices)
        group_size = len(groups[0])
        if kind == "all-gather":
            size = _sum_bytes(result_shapes)
        else:
            size = _sum_bytes(operand_shapes)
        nbytes = ring_bytes(kind, size, group_size)
        if kind == "all-reduce":
            rs_like = _is_rs_like(ins, table, comps, group_size)
    return Collective(kind=kind, name=ins.name, group_size=group_size, groups=groups,
                      dtype=dtype, operand_shapes=operand_shapes, result_shapes=result_shapes,
                      bytes_per_device=float(nbytes), count=int(count), rs_like=rs_like,
                      is_async=is_async, op_name=op_name)


def _is_rs_like(ins, table, comps, n) -> bool:
    """An all-reduce whose users all keep only 1/n of it through a dynamic-slice."""
    if n < 2:
        return False
    users = ins.users
    if ins.opcode.endswith(_START_SUFFIX):
        users = [u2 for u in users if u.opcode.endswith(_DONE_SUFFIX) for u2 in u.users]
    if not users:
        return False
    full = _sum_bytes(_shapes(ins.type_text))
    for u in users:
        slices = u.opcode == "dynamic-slice"
        if u.opcode == "fusion":
            called = _attr(u.attrs, "calls")
            body = comps.get((called or "").lstrip("%"), [])
            slices = any(b.opcode == "dynamic-slice" for b in body)
        if not slices or not math.isclose(_sum_bytes(_shapes(u.type_text)) * n, full):
            return False
    return True


def total_bytes(records, kind: str | None = None) -> float:
    """Sum of bytes_per_device x count over ``records`` (optionally of one kind)."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    return float(sum(r.total_bytes for r in records if kind is None or r.kind == kind))


def summarize(records) -> str:
    """One line per collective, for printing in a notebook."""
    if not records:
        return "(no collectives)"
    return "\n".join(str(r) for r in records)


def collective_lines(compiled, width: int = 160) -> list[str]:
    """The HLO lines of the collectives (metadata and frontend attributes cut), for display."""
    out = []
    for line in hlo_text(compiled).split("\n"):
        m = _INSTR.match(_strip_comments(line))
        if not m:
            continue
        _, call = _split_type(m.group(2))
        if _kind(call.split("(")[0])[0] is None:
            continue
        line = re.sub(r",\s*(metadata|frontend_attributes|backend_config)=\{.*?\}(?=,|$)", "",
                      line.strip())
        line = re.sub(r"\]\{[0-9,]*\}", "]", line)  # layouts such as f32[4,16]{1,0}
        out.append(line if len(line) <= width else line[:width - 3] + "...")
    return out




# ------------------------------------------------------------------------------------------
# XLA's cost and memory analysis
# ------------------------------------------------------------------------------------------

def _require_compiled(compiled, what: str):
    if type(compiled).__name__ == "Lowered":
        raise TypeError(f"{what}: got a jax.stages.Lowered; call .compile() on it first")
    if not hasattr(compiled, "cost_analysis") or not hasattr(compiled, "memory_analysis"):
        raise TypeError(f"{what}: expected a jax.stages.Compiled "
                        f"(jax.jit(f).lower(*args).compile()); got {type(compiled).__name__}")


def cost(compiled) -> dict:
    """``compiled.cost_analysis()`` as one dict ("flops", "bytes accessed", ...).

    Older JAX versions returned a list with one dict per program; this returns the dict.
    """
    _require_compiled(compiled, "cost")
    c = compiled.cost_analysis()
    if isinstance(c, (list, tuple)):
        c = c[0] if c else {}
    return dict(c or {})


# Compile options for a program that is only read, never run: XLA's passes over the HLO (and
# so cost_analysis, memory_analysis and as_text) are those of a normal compile, but the
# machine code is not optimised, which takes about a third of an XLA:CPU compile.
ANALYSIS_ONLY = {"xla_backend_optimization_level": 0}


def xla_flops(fn, *args) -> float:
    """FLOPs that XLA's cost analysis reports for ``jax.jit(fn)(*args)`` after compiling
    (args may be arrays or jax.ShapeDtypeStruct). Loop bodies count once, so unroll. The
    program is compiled with ANALYSIS_ONLY: nothing runs it."""
    import jax

    return float(cost(jax.jit(fn).lower(*args).compile(ANALYSIS_ONLY))["flops"])


def _dot_general_flops(eqn) -> int:
    (lhs_contract, _), (lhs_batch, _) = eqn.params["dimension_numbers"]
    lhs, out = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
    k = int(np.prod([lhs[i] for i in lhs_contract], dtype=np.int64))
    return 2 * int(np.prod(out, dtype=np.int64)) * k


def _count_dots(jaxpr) -> int:
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            total += _dot_general_flops(eqn)
        for v in eqn.params.values():
            inner = getattr(v, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                total += _count_dots(inner)
            elif hasattr(v, "eqns"):
                total += _count_dots(v)
    return total


def matmul_flops_traced(fn, *args) -> int:
    """FLOPs of every matrix multiplication (``dot_general``) in the traced program of
    ``fn(*args)``: 2 x (output size) x (contracted size) each, loops not multiplied.
    Unlike :func:`xla_flops` this leaves out all elementwise work, so it can be compared
    with the matmul formulas exactly."""
    import jax

    return _count_dots(jax.make_jaxpr(fn)(*args).jaxpr)


@dataclass(frozen=True)
class MemoryUse:
    """Bytes per device that XLA's ``memory_analysis()`` reports for a compiled program.

    arguments: the inputs; outputs: the results; temporaries: scratch space XLA allocates
    while the program runs; aliased: output bytes that reuse an input's buffer (donation);
    generated_code: the program itself. ``peak`` = arguments + outputs + temporaries -
    aliased, the footprint while the program runs (an upper bound: XLA may free inputs
    early).

    peak_memory: XLA's own ``peak_memory_in_bytes``, the peak it computes from its buffer
    assignment (0 where the backend does not report it). Read it on a TPU or GPU. On
    XLA:CPU it leaves the temporary buffer out (it comes within a few bytes of arguments +
    outputs - aliased: chapter 9 shows it), so the book's CPU checks use ``peak``.
    host_*: the same counts for arrays in host memory (host offload: arguments and
    outputs with ``memory_kind="pinned_host"``, activations a remat policy offloads); 0
    without offload.
    """

    arguments: int
    outputs: int
    temporaries: int
    aliased: int
    generated_code: int
    peak_memory: int = 0
    host_arguments: int = 0
    host_outputs: int = 0
    host_temporaries: int = 0
    host_aliased: int = 0
    host_generated_code: int = 0

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs + self.temporaries - self.aliased

    @property
    def host_total(self) -> int:
        """Host-memory bytes of the program: arguments + outputs + temporaries - aliased."""
        return (self.host_arguments + self.host_outputs + self.host_temporaries
                - self.host_aliased)


def memory(compiled) -> MemoryUse:
    """``compiled.memory_analysis()`` as a :class:`MemoryUse` (bytes per device), with
    XLA's peak (``peak_memory_in_bytes``) and the host-memory fields (``host_*``)."""
    _require_compiled(compiled, "memory")
    m = compiled.memory_analysis()
    if m is None:
        raise ValueError("memory: this backend gives no memory analysis for the program")

    def get(name):
        return int(getattr(m, name, 0) or 0)

    return MemoryUse(
        arguments=get("argument_size_in_bytes"), outputs=get("output_size_in_bytes"),
        temporaries=get("temp_size_in_bytes"), aliased=get("alias_size_in_bytes"),
        generated_code=get("generated_code_size_in_bytes"),
        peak_memory=get("peak_memory_in_bytes"),
        host_arguments=get("host_argument_size_in_bytes"),
        host_outputs=get("host_output_size_in_bytes"),
        host_temporaries=get("host_temp_size_in_bytes"),
        host_aliased=get("host_alias_size_in_bytes"),
        host_generated_code=get("host_generated_code_size_in_bytes"))


# ------------------------------------------------------------------------------------------
# The instructions of a compiled program, one by one (chapter 9)
# ------------------------------------------------------------------------------------------

# Opcodes that move or re-describe data without arithmetic.
_DATA_MOVEMENT = {"copy", "transpose", "bitcast", "reshape", "broadcast", "slice",
                  "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "gather",
                  "scatter", "reverse", "copy-start", "copy-done", "iota"}
# Opcodes that only name values (no work at run time).
_BOOKKEEPING = {"parameter", "constant", "tuple", "get-tuple-element", "after-all",
                "partition-id", "replica-id", "opt-barrier"}
_CONTROL = {"while", "conditional", "call"}
OP_CATEGORIES = ("matmul", "attention", "collective", "elementwise", "data movement",
                 "control flow", "bookkeeping")
# Custom-call targets that are matrix multiplications (cuBLAS / cuBLASLt / hipBLASLt gemms;
# XLA:GPU calls them __cublas$... on ROCm too) and convolutions (cuDNN / MIOpen).
_GEMM_TARGET = re.compile(r"gemm|matmul", re.IGNORECASE)
_CONV_TARGET = re.compile(r"^__cudnn\$conv")
_ATTENTION_TARGET = re.compile(r"fmha|attn|attention|flash", re.IGNORECASE)
# Opcodes that wrap a called computation: what they run is what that computation holds.
_WRAPPERS = {"fusion", "call", "async-start", "async-update", "async-done"}


@dataclass(frozen=True)
class Op:
    """One instruction of a compiled program's top-level computations.

    name: the HLO instruction name (the name a profiler trace shows); opcode: e.g. "fusion",
    "dot", "all-reduce"; fusion_kind: "kLoop", "kInput", "kOutput", "kCustom" (fusions only);
    shape: the result type, e.g. "f32[64,128]" (layouts dropped); operands: the operand names;
    category: one of :data:`OP_CATEGORIES` (:func:`ops` says how each is decided);
    flops: the matrix FLOPs inside, as XLA's cost analysis counts them (dots: 2 x result
    size x contracted size; convolutions: 2 x the multiply-adds of the valid window
    positions; gemm custom-calls from their shapes; 0 for other ops: elementwise
    arithmetic is not counted here); bytes: operand + result bytes (each crossing memory
    once, the fusion boundary model; a gemm's or convolution's scratch workspace left out);
    count: times it runs (while-loop trip counts); computation: where it sits; called: the
    computations it calls.
    """

    name: str
    opcode: str
    shape: str
    operands: tuple
    category: str
    flops: float
    bytes: float
    count: int = 1
    fusion_kind: str = ""
    computation: str = ""
    called: tuple = ()

    def __str__(self) -> str:
        kind = f" {self.fusion_kind}" if self.fusion_kind else ""
        return (f"{self.name:<26} {self.opcode + kind:<15} {self.shape:<15} {self.category:<12} "
                f"{self.flops:9.3g} FLOPs {self.bytes:9.3g} B")


def _dot_flops(ins, table) -> float:
    """2 x (result elements) x (contracted elements) of a dot instruction."""
    out = _shapes(ins.type_text)
    if not out or not ins.operands or ins.operands[0] not in table:
        return 0.0
    lhs = _shapes(table[ins.operands[0]].type_text)
    if not lhs:
        return 0.0
    lhs_dims = [int(x) for x in lhs[0].split("[")[1].rstrip("]").split(",") if x]
    contract = _attr(ins.attrs, "lhs_contracting_dims") or ""
    k = math.prod(lhs_dims[int(i)] for i in re.findall(r"\d+", contract)) if contract else 1
    n_out = _shape_bytes(out[0]) / DTYPE_BYTES[out[0].split("[")[0]]
    return 2.0 * n_out * k


def _module(compiled):
    text = hlo_text(compiled)
    if not re.search(r"%?[\w.\-]+\s*=\s*\S", text) or not re.search(r"\w+\[[0-9,]*\]", text):
        raise ValueError("compiled: the text does not look like HLO (no instructions such as "
                         "'%x = f32[4] add(%a, %b)' found)")
    comps, entry = _parse_module(text)
    table = {ins.name: ins for instrs in comps.values() for ins in instrs}
    return comps, entry, table


def _called(ins) -> list[str]:
    out = []
    for key in ("calls", "to_apply", "body", "condition", "branch_computations",
                "true_computation", "false_computation"):
        v = _attr(ins.attrs, key)
        if v:
            out.extend(re.findall(r"%?([\w.\-]+)", v))
    return out


def _dims(shape: str) -> list[int]:
    return [int(x) for x in shape.split("[")[1].rstrip("]").split(",") if x]


def _target(ins) -> str:
    return (_attr(ins.attrs, "custom_call_target") or "").strip('"')


def _backend_kind(ins) -> str:
    """The "kind" of a fusion's backend config (``__triton_gemm``...), or ""."""
    m = re.search(r'"kind"\s*:\s*"([^"]*)"', ins.attrs)
    return m.group(1) if m else ""


def _operand_shape(ins, table, i):
    if i >= len(ins.operands) or ins.operands[i] not in table:
        return None
    shapes = _shapes(table[ins.operands[i]].type_text)
    return shapes[0] if shapes else None


def _gemm_flops(ins, table) -> float:
    """2 x (result elements) x (contracted elements) of a gemm custom-call: the contracting
    dimensions are in its backend config's dot_dimension_numbers."""
    out, lhs = _shapes(ins.type_text), _operand_shape(ins, table, 0)
    if not out or lhs is None:
        return 0.0
    m = re.search(r'"lhs_contracting_dimensions"\s*:\s*\[([^\]]*)\]', ins.attrs)
    if not m:
        return 0.0
    dims = _dims(lhs)
    k = math.prod(dims[int(i)] for i in re.findall(r"\d+", m.group(1)))
    return 2.0 * math.prod(_dims(out[0])) * k


def _window(attrs: str) -> list[dict]:
    """The window={size=.. stride=.. pad=.. lhs_dilate=.. rhs_dilate=..} of a convolution,
    one dict per spatial dimension."""
    text = _attr(attrs, "window") or ""
    fields = dict(re.findall(r"(\w+)=([0-9_x\-]+)", text))
    n = len(fields["size"].split("x")) if "size" in fields else 0
    dims = [{"size": 1, "stride": 1, "lo": 0, "lhs_dilate": 1, "rhs_dilate": 1}
            for _ in range(n)]
    for key in ("size", "stride", "lhs_dilate", "rhs_dilate"):
        for d, v in zip(dims, fields.get(key, "").split("x") if key in fields else []):
            d[key] = int(v)
    if "pad" in fields:
        for d, v in zip(dims, fields["pad"].split("x")):
            d["lo"] = int(v.split("_")[0])
    return dims


def _valid_positions(n_in, n_out, w) -> int:
    """(output, kernel) index pairs of one spatial dimension that read a real input element
    (not padding, not a hole of lhs dilation): XLA's HloCostAnalysis count."""
    o = np.arange(n_out)[:, None]
    k = np.arange(w["size"])[None, :]
    pos = o * w["stride"] - w["lo"] + k * w["rhs_dilate"]
    d = w["lhs_dilate"]
    ok = (pos % d == 0) & (pos >= 0) & (pos // d < n_in)
    return int(ok.sum())


def _conv_count(inp: str, kernel: str, out: str, attrs: str) -> float:
    """FLOPs of a convolution with input, kernel and output shapes ``inp``, ``kernel``,
    ``out`` and the window / dim_labels / group counts of ``attrs``: 2 x (input features
    per group) x (output features) x (batch / batch groups) x the valid window positions
    of every spatial dimension, as XLA's cost analysis counts them."""
    labels = _attr(attrs, "dim_labels") or ""
    m = re.fullmatch(r"(\w+)_(\w+)->(\w+)", labels.strip())
    if not m:
        return 0.0
    lhs_l, _, out_l = m.groups()
    x, y = _dims(inp), _dims(out)
    if len(x) != len(lhs_l) or len(y) != len(out_l):
        return 0.0
    fgc = int(_attr(attrs, "feature_group_count") or 1)
    bgc = int(_attr(attrs, "batch_group_count") or 1)
    window = _window(attrs)
    spatial = sorted(c for c in lhs_l if c.isdigit())
    if len(window) != len(spatial):
        return 0.0
    positions = 1
    for c, w in zip(spatial, window):
        positions *= _valid_positions(x[lhs_l.index(c)], y[out_l.index(c)], w)
    fma = (x[lhs_l.index("f")] // fgc) * y[out_l.index("f")] * \
        (x[lhs_l.index("b")] // bgc) * positions
    return 2.0 * fma


def _conv_flops(ins, table) -> float:
    """FLOPs of a ``convolution`` instruction or of a cuDNN/MIOpen convolution custom-call.
    A backward convolution's window and dim_labels are those of the forward one, so its
    operands and result are put back in the forward roles (input, kernel, output) first."""
    res = _shapes(ins.type_text)
    a, b = _operand_shape(ins, table, 0), _operand_shape(ins, table, 1)
    if not res or a is None or b is None:
        return 0.0
    target = _target(ins) if ins.opcode == "custom-call" else ""
    if "BackwardInput" in target:
        inp, kernel, out = res[0], b, a
    elif "BackwardFilter" in target:
        inp, kernel, out = a, res[0], b
    else:
        inp, kernel, out = a, b, res[0]
    return _conv_count(inp, kernel, out, ins.attrs)


def _own_flops(ins, table) -> float:
    """Matrix FLOPs of one instruction (not looking inside called computations)."""
    if ins.opcode == "dot":
        return _dot_flops(ins, table)
    if ins.opcode == "convolution":
        return _conv_flops(ins, table)
    if ins.opcode == "custom-call":
        target = _target(ins)
        if _CONV_TARGET.search(target):
            return _conv_flops(ins, table)
        if _GEMM_TARGET.search(target):
            return _gemm_flops(ins, table)
    return 0.0


def _inner_flops(comp, comps, table, depth=0) -> float:
    if depth > 16:
        return 0.0
    total = 0.0
    for ins in comps.get(comp, []):
        total += _own_flops(ins, table)
        if ins.opcode in _WRAPPERS:
            for c in _called(ins):
                total += _inner_flops(c, comps, table, depth + 1)
    return total


def _own_kind(ins) -> str | None:
    """"collective", "matmul" or "attention" for an instruction that is one by itself."""
    op = ins.opcode
    base = op[: -len(_START_SUFFIX)] if op.endswith(_START_SUFFIX) else \
        op[: -len(_DONE_SUFFIX)] if op.endswith(_DONE_SUFFIX) else op
    if base in KINDS or base in ("ragged-all-to-all", "collective-broadcast"):
        return "collective"
    if op in ("dot", "convolution"):
        return "matmul"
    if op == "custom-call":
        target = _target(ins)
        if _CONV_TARGET.search(target) or _GEMM_TARGET.search(target):
            return "matmul"
        if _ATTENTION_TARGET.search(target):
            return "attention"
    if op == "fusion" and "gemm" in _backend_kind(ins):
        return "matmul"          # a Triton gemm fusion (__triton_gemm, ..._gemm_fusion)
    return None


def _holds(comp, comps, kind, depth=0) -> bool:
    """Whether computation ``comp`` (or one it calls) holds an instruction of ``kind``."""
    if depth > 16:
        return False
    for ins in comps.get(comp, []):
        if _own_kind(ins) == kind:
            return True
        if ins.opcode in _WRAPPERS and any(_holds(c, comps, kind, depth + 1)
                                           for c in _called(ins)):
            return True
    return False


def _category(ins, comps) -> str:
    own = _own_kind(ins)
    if own is not None:
        return own
    op = ins.opcode
    if op in _WRAPPERS - {"call"}:
        called = _called(ins)
        # A fusion or async wrapper is what it runs: a collective first (TPU's
        # kind=kCustom, calls=%all-reduce-scatter.3), then a matmul, then attention.
        for kind in ("collective", "matmul", "attention"):
            if any(_holds(c, comps, kind) for c in called):
                return kind
        return "elementwise"
    if op in _CONTROL:
        return "control flow"
    if op in _BOOKKEEPING:
        return "bookkeeping"
    if op in _DATA_MOVEMENT:
        return "data movement"
    return "elementwise"


def ops(compiled) -> list[Op]:
    """The instructions of a compiled program that run as separate steps: those of the entry
    computation and of the bodies of its while loops and conditionals (not the insides of
    fusions), in program order, one :class:`Op` each.

    These are the names a profiler trace of the program shows (``ynn_fusion.3``,
    ``all-reduce``, ...). ``compiled`` is a ``jax.stages.Compiled`` or its HLO text (of
    any backend: a GPU or TPU dump reads the same way).

    Categories: collectives by opcode (async ``-start``/``-done`` halves included);
    ``dot``, ``convolution`` and gemm/convolution custom-calls (``__cublas$gemm``,
    ``__cublas$lt$matmul``, ``__cudnn$conv...``) are matmuls, fused-attention
    custom-calls (cuDNN ``fmha``, Transformer Engine ``te_fused_attn``...) attention; a
    fusion (or async wrapper) is what its called computation holds: a collective first
    (TPU's ``fusion.3 ... kind=kCustom, calls=%all-reduce-scatter.3``), else a matmul (a
    dot or convolution inside, or a Triton gemm fusion, ``__triton_gemm``), else
    attention, else elementwise.
    """
    comps, entry, table = _module(compiled)
    if entry is None:
        raise ValueError("compiled: the HLO text has no ENTRY computation; pass the whole "
                         "module (compiled.as_text()), not a few lines")
    mult = _multipliers(comps, entry)
    order, seen = [entry], {entry}
    i = 0
    while i < len(order):     # the entry and the control-flow computations it reaches
        for ins in comps.get(order[i], []):
            if ins.opcode in _CONTROL:
                for c in _called(ins):
                    if c in comps and c not in seen:
                        seen.add(c)
                        order.append(c)
        i += 1
    out = []
    for comp in order:
        for ins in comps[comp]:
            shape = " ".join(_shapes(ins.type_text)) or ins.type_text.split("{")[0]
            category = _category(ins, comps)
            called = tuple(_called(ins))
            flops = _own_flops(ins, table)
            if ins.opcode in ("fusion", "async-start"):   # an async pair counts once
                flops += sum(_inner_flops(c, comps, table) for c in called)
            if category in ("bookkeeping", "control flow") or ins.opcode == "bitcast":
                nbytes = 0.0
            else:
                operand_bytes = sum(_sum_bytes(_shapes(table[o].type_text))
                                    for o in ins.operands if o in table)
                result = _shapes(ins.type_text)
                if ins.opcode == "custom-call" and category == "matmul" and len(result) > 1:
                    result = result[:1]      # the (result, workspace) tuple of a gemm/conv
                nbytes = operand_bytes + _sum_bytes(result)
            fk = (_attr(ins.attrs, "kind") or "") if ins.opcode == "fusion" else ""
            out.append(Op(name=ins.name, opcode=ins.opcode, shape=shape,
                          operands=tuple(ins.operands), category=category, flops=float(flops),
                          bytes=float(nbytes), count=int(mult.get(comp, 1) or 1),
                          fusion_kind=fk, computation=comp, called=called))
    return out


def fusions(compiled) -> list[Op]:
    """The fusion instructions of a compiled program (:func:`ops` whose opcode is "fusion")."""
    return [o for o in ops(compiled) if o.opcode == "fusion"]


def count_fusions(compiled) -> int:
    """How many fusions the compiled program runs (loop trip counts not multiplied)."""
    return len(fusions(compiled))


def op_categories(compiled) -> dict:
    """{instruction name: category} for :func:`ops`, to label the events of a trace."""
    return {o.name: o.category for o in ops(compiled)}


def entry_lines(compiled, width: int = 100) -> list[str]:
    """The instructions of the entry computation as short lines for display: metadata,
    backend configs and layouts' long attributes cut, each line at most ``width`` chars."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 20:
        raise ValueError(f"width must be a whole number >= 20; got {width!r}")
    comps, entry, _ = _module(compiled)
    if entry is None:
        raise ValueError("compiled: the HLO text has no ENTRY computation")
    out = []
    for ins in comps[entry]:
        line = re.split(r",\s*(?:metadata|frontend_attributes|backend_config)=", ins.line)[0]
        out.append(line if len(line) <= width else line[:width - 3] + "...")
    return out


# ------------------------------------------------------------------------------------------
# Ops back to source lines
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OpSource:
    """Where an instruction came from: ``op_name`` is JAX's name for the operation, the
    program and the ``jax.named_scope`` / ``jax.named_call`` scopes it ran in
    (``jit(f)/mlp/activation/tanh``); ``function``, ``file``, ``line`` the innermost frame
    of the user's code that created it (empty / 0 when the program does not say)."""

    name: str
    op_name: str
    function: str
    file: str
    line: int

    @property
    def scope(self) -> str:
        """The named scopes of ``op_name`` without the program and the primitive:
        ``jit(f)/mlp/activation/tanh`` -> ``mlp/activation``."""
        parts = self.op_name.split("/")
        return "/".join(parts[1:-1]) if len(parts) > 2 else ""


def _tables(text: str) -> dict:
    """{table name: {id: text}} of the FileNames/FunctionNames/FileLocations/StackFrames
    tables at the top of a compiled module's text."""
    out, current = {}, None
    for line in text.split("\n"):
        s = line.strip()
        if s in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            current = out.setdefault(s, {})
            continue
        m = re.match(r"^(\d+) (.*)$", s) if current is not None else None
        if m:
            current[int(m.group(1))] = m.group(2)
        elif current is not None and s:
            current = None
    return out


def _frame(tables: dict, frame_id: int):
    """(function, file, line) of a StackFrames entry."""
    frame = tables.get("StackFrames", {}).get(frame_id, "")
    loc_id = re.search(r"file_location_id=(\d+)", frame)
    loc = tables.get("FileLocations", {}).get(int(loc_id.group(1)), "") if loc_id else ""
    fields = dict(re.findall(r"(\w+)=(\d+)", loc))
    file = tables.get("FileNames", {}).get(int(fields.get("file_name_id", -1)), "")
    function = tables.get("FunctionNames", {}).get(int(fields.get("function_name_id", -1)), "")
    return function.strip('"'), file.strip('"'), int(fields.get("line", 0))


def op_sources(compiled) -> dict:
    """{instruction name: :class:`OpSource`} for the instructions of :func:`ops` (what a
    trace names), read from each one's ``metadata={op_name=... stack_frame_id=...}`` (or
    ``source_file=... source_line=...``) and the module's stack-frame tables.

    ``compiled`` must be the ``jax.stages.Compiled`` or its full ``as_text()``: the tables
    that hold files and lines are at the top of that text. A fusion carries the metadata
    of the operation it was built around (its root), so its ``op_name`` names one of the
    operations it fused. Instructions without metadata (parameters, copies XLA added) get
    an empty ``op_name``.
    """
    raw = compiled if isinstance(compiled, str) else None
    if raw is None:
        _require_compiled(compiled, "op_sources")
        raw = compiled.as_text()
    tables = _tables(raw)
    _, _, table = _module(compiled)
    out = {}
    for op in ops(compiled):
        attrs = table[op.name].attrs
        meta = re.search(r"metadata=\{(.*?)\}(?:,|$)", attrs)
        meta = meta.group(1) if meta else ""
        name = re.search(r'op_name="((?:[^"\\]|\\.)*)"', meta)
        function, file, line = "", "", 0
        frame = re.search(r"stack_frame_id=(\d+)", meta)
        if frame:
            function, file, line = _frame(tables, int(frame.group(1)))
        else:
            f = re.search(r'source_file="([^"]*)"', meta)
            n = re.search(r"source_line=(\d+)", meta)
            file, line = (f.group(1) if f else ""), (int(n.group(1)) if n else 0)
        out[op.name] = OpSource(op.name, name.group(1) if name else "", function, file, line)
    return out


# ------------------------------------------------------------------------------------------
# Memory live over a program's schedule
# ------------------------------------------------------------------------------------------

_ARRAY = re.compile(r"(\w+)\[([0-9,]*)\](\{[^}]*\})?")
_ALIASES = {"bitcast", "get-tuple-element", "tuple", "opt-barrier", "domain"}


def _arrays(type_text: str) -> list:
    """[(bytes, memory space)] of each array of a (tuple) type; the space is the n of a
    layout's S(n), 0 (the device's main memory) when there is none. Tile padding is not
    counted."""
    out = []
    for dtype, dims, layout in _ARRAY.findall(type_text):
        if dtype not in DTYPE_BYTES:
            continue
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        space = re.search(r"S\((\d+)\)", layout or "")
        out.append((int(n * DTYPE_BYTES[dtype]), int(space.group(1)) if space else 0))
    return out


@dataclass(frozen=True)
class LiveMemory:
    """Bytes live in one memory space over the entry computation's schedule.

    ``timeline``: (instruction, bytes live while it runs) in program order; ``peak`` the
    largest of those, reached first at instruction ``at``; ``live``: (instruction that
    made the array, bytes) of every array live there, largest first."""

    memory_space: int
    timeline: tuple
    peak: int
    at: str
    live: tuple


def live_memory(compiled, memory_space: int = 0) -> LiveMemory:
    """How many bytes of memory space ``memory_space`` (0: the device's main memory, HBM;
    1: a TPU's VMEM; 5: host memory, as in XLA's ``S(n)`` layouts) are live as the entry
    computation of a scheduled module runs, and which arrays are live at the peak.

    An estimate of what XLA's buffer assignment (and XProf's memory viewer) reports: every
    array an instruction makes is live from that instruction to its last use (the
    program's parameters and results for the whole program); ``bitcast``,
    ``get-tuple-element``, ``tuple`` and an async op's ``-done`` make no new array (they
    name one that exists), and ``copy-start``'s second element is its source. It leaves
    out what XLA may do better (write an op's result over an input that dies there) and
    worse (alignment, fragmentation, tile padding), and the temporaries inside loops and
    fusions: read it as the arrays that must coexist, not a byte-exact allocation.
    """
    if isinstance(memory_space, bool) or not isinstance(memory_space, int) or \
            memory_space < 0:
        raise ValueError(f"memory_space must be a whole number >= 0; got {memory_space!r}")
    comps, entry, _ = _module(compiled)
    if entry is None:
        raise ValueError("compiled: the HLO text has no ENTRY computation")
    instrs = comps[entry]
    index = {ins.name: i for i, ins in enumerate(instrs)}
    end = len(instrs)
    sizes, born, last, maker = [], [], [], []     # per buffer
    refs = {}            # instruction -> [per tuple element: set of buffer ids]

    def new(i, nbytes, space):
        sizes.append(nbytes if space == memory_space else 0)
        born.append(i)
        last.append(i)
        maker.append(instrs[i].name)
        return {len(sizes) - 1}

    for i, ins in enumerate(instrs):
        arrays = _arrays(ins.type_text)
        ops_refs = [refs.get(o, []) for o in ins.operands]
        for r in ops_refs:                              # a use keeps what it names alive
            for elem in r:
                for b in elem:
                    last[b] = max(last[b], i)
        flat = [b for r in ops_refs for elem in r for b in elem]
        if ins.opcode == "parameter":
            elems = [new(i, n, sp) for n, sp in arrays]
            for elem in elems:
                for b in elem:
                    last[b] = end
        elif ins.opcode == "get-tuple-element" and ops_refs and ops_refs[0]:
            k = int(_attr(ins.attrs, "index") or 0)
            elems = [ops_refs[0][k]] if k < len(ops_refs[0]) else [set(flat)]
        elif ins.opcode == "tuple":
            elems = [set().union(*r) if r else set() for r in ops_refs]
        elif ins.opcode in _ALIASES:
            elems = [set(flat)] * max(1, len(arrays))
        elif ins.opcode == "copy-done" and ops_refs and ops_refs[0]:
            elems = [ops_refs[0][0]]                   # the destination of its copy-start
        elif ins.opcode.endswith(_DONE_SUFFIX):
            elems = [set(flat)]
        elif ins.opcode == "copy-start" and len(arrays) >= 2:
            elems = [new(i, *arrays[0]), set(flat)] + [new(i, *a) for a in arrays[2:]]
        else:
            elems = [new(i, n, sp) for n, sp in arrays]
        refs[ins.name] = elems
        if ins.line.startswith("ROOT"):
            for elem in elems:
                for b in elem:
                    last[b] = end
    timeline = []
    for i, ins in enumerate(instrs):
        timeline.append((ins.name, sum(sz for sz, s, t in zip(sizes, born, last)
                                       if s <= i <= t)))
    peak_i = max(range(len(timeline)), key=lambda i: (timeline[i][1], -i)) if timeline else 0
    live = sorted(((maker[b], sizes[b]) for b in range(len(sizes))
                   if born[b] <= peak_i <= last[b] and sizes[b]),
                  key=lambda x: (-x[1], index.get(x[0], 0)))
    return LiveMemory(memory_space, tuple(timeline), timeline[peak_i][1] if timeline else 0,
                      timeline[peak_i][0] if timeline else "", tuple(live))


def peak_buffers(live_range_text: str, compiled=None) -> list:
    """[(buffer, bytes, shape)] of the buffers live at the peak of a program, largest
    first, from the ``*-live-range.txt`` file that XLA writes with ``xla_dump_to`` (its
    "Live ranges at N (peak):" section: XLA's own buffer assignment). ``buffer`` is an
    instruction name; ``shape`` its type (the tuple element a ``{i}`` index names) when
    ``compiled`` (the program, or its HLO text: the dump's ``*after_optimizations.txt``)
    is given, else "".
    """
    if not isinstance(live_range_text, str):
        raise TypeError("live_range_text must be the text of XLA's *-live-range.txt dump")
    m = re.search(r"^\s*Live ranges at \d+ \(peak\):\s*$", live_range_text, re.M)
    if not m:
        raise ValueError("live_range_text has no 'Live ranges at N (peak):' section: pass "
                         "the *-live-range.txt file of an xla_dump_to dump")
    table = _module(compiled)[2] if compiled is not None else {}
    out = []
    for line in live_range_text[m.end():].split("\n"):
        b = re.match(r"^\s+([\w.\-]+)\{([\d,]*)\}: (\d+) bytes", line)
        if not b:
            if line.strip():
                break
            continue
        name, index, nbytes = b.group(1), b.group(2), int(b.group(3))
        shape = ""
        if name in table:
            arrays = _shapes(table[name].type_text)
            k = int(index.split(",")[0]) if index else 0
            shape = arrays[k] if k < len(arrays) else ""
        out.append((name, nbytes, shape))
    return sorted(out, key=lambda r: -r[1])

