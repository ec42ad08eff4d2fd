"""scalebook.profiling (trace capture and parsing, roofline comparison, predicted profiles)
and the instruction readers added to scalebook.hlo for chapter 9.

Traces are produced here, on the 8 simulated devices; conclusions are checked with ratios,
never with absolute times."""

import gzip
import json
import math
import os
import time

import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from scalebook import hlo, profiling  # noqa: E402
from scalebook.collectives import ring_bytes  # noqa: E402
from scalebook.hardware import get_chip  # noqa: E402
from scalebook.models import get_model  # noqa: E402


@pytest.fixture(scope="module")
def sharded_matmul():
    """A contraction-sharded matmul (an all-reduce) followed by tanh, on 8 devices."""
    mesh = scalebook.make_mesh((8,), ("x",))
    a = jax.device_put(jnp.ones((256, 512)), NamedSharding(mesh, P(None, "x")))
    b = jax.device_put(jnp.ones((512, 128)), NamedSharding(mesh, P("x", None)))
    f = jax.jit(lambda a, b: jnp.tanh(a @ b))
    compiled = f.lower(a, b).compile()
    return f, (a, b), compiled


@pytest.fixture(scope="module")
def trace(sharded_matmul):
    f, args, compiled = sharded_matmul
    return profiling.capture(f, *args, steps=3, categories=hlo.op_categories(compiled))


# ------------------------------------------------------------------------------------------
# hlo.ops and friends
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("M,K,N", [(64, 32, 16), (256, 128, 512)])
def test_ops_flops_and_bytes_match_cost_analysis(M, K, N):
    c = jax.jit(lambda a, b: a @ b).lower(jax.ShapeDtypeStruct((M, K), jnp.float32),
                                           jax.ShapeDtypeStruct((K, N), jnp.float32)).compile()
    ops = hlo.ops(c)
    mm = [o for o in ops if o.category == "matmul"]
    assert len(mm) == 1 and mm[0].flops == 2 * M * K * N
    assert mm[0].bytes == 4 * (M * K + K * N + M * N)
    cost = hlo.cost(c)
    assert sum(o.flops for o in ops) == cost["flops"]
    assert sum(o.bytes for o in ops) == cost["bytes accessed"]


def test_elementwise_chain_fuses_into_one_loop_fusion():
    def chain(x):
        for _ in range(5):
            x = jnp.sin(x) * 2 + 1
        return x

    c = jax.jit(chain).lower(jax.ShapeDtypeStruct((1000,), jnp.float32)).compile()
    assert hlo.count_fusions(c) == 1
    (fusion,) = hlo.fusions(c)
    assert fusion.fusion_kind == "kLoop" and fusion.category == "elementwise"
    # one read and one write of the array: the fusion keeps the chain's temporaries on chip
    assert fusion.bytes == 2 * 4 * 1000 == hlo.cost(c)["bytes accessed"]


def test_ops_see_loop_bodies_with_trip_counts():
    def scanned(w, x):
        return jax.lax.scan(lambda c, wi: (c @ wi, None), x, w)[0]

    c = jax.jit(scanned).lower(jax.ShapeDtypeStruct((4, 64, 64), jnp.float32),
                               jax.ShapeDtypeStruct((16, 64), jnp.float32)).compile()
    mm = [o for o in hlo.ops(c) if o.category == "matmul"]
    assert len(mm) == 1 and mm[0].count == 4 and mm[0].flops == 2 * 16 * 64 * 64


def test_ops_categories_of_a_sharded_program(sharded_matmul):
    _, _, compiled = sharded_matmul
    cats = hlo.op_categories(compiled)
    assert "collective" in cats.values() and "matmul" in cats.values()
    ar = [o for o in hlo.ops(compiled) if o.category == "collective"]
    assert len(ar) == 1 and ar[0].opcode == "all-reduce"
    # per device: [256, 512/8] @ [512/8, 128]
    (mm,) = [o for o in hlo.ops(compiled) if o.category == "matmul"]
    assert mm.flops == 2 * 256 * 64 * 128


def test_ops_bad_input():
    with pytest.raises(TypeError, match="Lowered"):
        hlo.ops(jax.jit(jnp.sin).lower(1.0))
    with pytest.raises(ValueError, match="does not look like HLO"):
        hlo.ops("hello world")
    with pytest.raises(ValueError, match="ENTRY"):
        hlo.ops("%x = f32[4] add(%a, %b)")


# ------------------------------------------------------------------------------------------
# Capturing and parsing traces
# ------------------------------------------------------------------------------------------

def test_trace_has_every_device_and_the_programs_ops(trace, sharded_matmul):
    _, _, compiled = sharded_matmul
    assert trace.devices == list(range(8))
    names = {o.name for o in hlo.ops(compiled)}
    traced = {e.name for e in trace.events}
    assert traced <= names                       # every traced op is an instruction
    assert any(trace.kind(n) == "collective" for n in traced)
    # each op runs once per step on every device
    for row in trace.summary("op"):
        assert row.count == 3 * 8, row
    assert len(trace.steps("step")) == 3


def test_summary_shares_and_kinds(trace):
    by_kind = trace.summary("kind")
    assert math.isclose(sum(r.share for r in by_kind), 1.0)
    assert {r.key for r in by_kind} <= set(profiling.KINDS_ORDER)
    assert sum(r.total for r in by_kind) == pytest.approx(sum(e.duration for e in trace.events))
    by_dev = trace.summary("device")
    assert len(by_dev) == 8
    assert trace.top(2)[0].total >= trace.top(2)[1].total
    assert "n=" in trace.table(3)
    with pytest.raises(ValueError, match="by must be one of"):
        trace.summary("colour")
    with pytest.raises(ValueError, match="kind must be one of"):
        trace.select(kind="fusions")
    with pytest.raises(ValueError, match="no annotation"):
        trace.steps("train")


def test_events_lie_inside_their_steps(trace):
    steps = trace.steps("step")
    first, last = steps[0].start, steps[-1].end
    for e in trace.events:
        assert first - 1e-3 <= e.start <= e.end <= last + 1e-3
    assert 0 < trace.busy_time(0) <= last - first + 1e-3


def test_find_and_load_files(tmp_path, sharded_matmul):
    f, args, _ = sharded_matmul
    t = profiling.capture(f, *args, steps=1, logdir=tmp_path)
    path = profiling.find_trace_file(tmp_path)
    assert path.endswith("perfetto_trace.json.gz")
    again = profiling.load_trace(path)
    assert len(again.events) == len(t.events)
    assert profiling.load_trace(tmp_path).events == again.events      # a folder works too


def test_synthetic_trace_table():
    events = [{"ph": "M", "pid": 1, "tid": 7, "name": "thread_name", "args": {"name": "w0"}}]
    for i in range(4):
        events.append({"ph": "X", "pid": 1, "tid": 7, "ts": 100 + 10 * i, "dur": 4,
                       "name": "dot.1", "args": {"hlo_op": "dot.1", "hlo_module": "jit_f",
                                                 "device_ordinal": "0"}})
        events.append({"ph": "X", "pid": 1, "tid": 7, "ts": 105 + 10 * i, "dur": 1,
                       "name": "all-reduce", "args": {"hlo_op": "all-reduce",
                                                      "hlo_module": "jit_f",
                                                      "device_ordinal": "1"}})
    t = profiling.load_trace({"traceEvents": events})
    dot, ar = t.summary("op")
    assert (dot.key, dot.count, ar.key) == ("dot.1", 4, "all-reduce")
    assert dot.total == pytest.approx(16e-6) and dot.share == pytest.approx(0.8)
    assert t.events[0].start == 0.0 and t.events[0].thread == "w0"
    assert [r.key for r in t.summary("kind")] == ["matmul", "collective"]
    assert t.busy_time(0) == pytest.approx(16e-6)


def _events(rows):
    """A CPU-style trace: rows of (op, device, thread id, start us, duration us)."""
    ev = [{"ph": "M", "pid": 1, "tid": t, "name": "thread_name", "args": {"name": f"w{t}"}}
          for t in sorted({r[2] for r in rows})]
    for name, dev, tid, ts, dur in rows:
        ev.append({"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name,
                   "args": {"hlo_op": name, "hlo_module": "jit_f",
                            "device_ordinal": str(dev)}})
    return profiling.load_trace({"traceEvents": ev})


def test_overlapping_pairs_on_a_synthetic_trace():
    t = _events([
        ("ppermute.1", 0, 1, 10, 10),      # 10..20 on device 0, thread 1
        ("ynn_fusion.1", 0, 2, 15, 10),    # 15..25, device 0, thread 2: overlaps
        ("ynn_fusion.2", 0, 2, 20, 5),     # 20..25: starts as the permute ends, no overlap
        ("fusion.3", 0, 3, 5, 6),          # 5..11: overlaps its first microsecond
        ("copy.4", 0, 3, 12, 3),           # data movement: not compute
        ("dot.5", 0, 1, 0, 5),             # same thread, before it
        ("ynn_fusion.1", 1, 4, 15, 10),    # device 1: no collective there
        ("all-reduce.2", 1, 5, 100, 5),    # device 1, later than everything
    ])
    pairs = profiling.overlapping_pairs(t)
    assert [(c.name, m.name) for c, m in pairs] == [("ppermute.1", "fusion.3"),
                                                    ("ppermute.1", "ynn_fusion.1")]
    assert all(c.device == m.device == 0 for c, m in pairs)
    assert len(profiling.overlapping_pairs(t, compute="matmul")) == 1
    assert len(profiling.overlapping_pairs(t, compute=("data movement",))) == 1
    assert profiling.overlapping_pairs(t, device=1) == []
    with pytest.raises(ValueError, match="other than 'collective'"):
        profiling.overlapping_pairs(t, compute="collective")
    with pytest.raises(TypeError, match="Trace"):
        profiling.overlapping_pairs({"traceEvents": []})


def test_collective_matmul_overlaps_its_sends_and_the_all_gather_version_does_not():
    """XLA:CPU runs a device's independent instructions on several threads: the
    collective matmul's ppermutes run while chunk matmuls run (on another thread of the
    same device); the plain version's all-gather feeds its only matmul, so nothing can
    overlap it."""
    from scalebook import sharding

    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    # big enough that XLA:CPU hands the chunk matmuls to its thread pool (at 256 x 512 @
    # 512 x 512 it runs them one after another on one thread, and nothing overlaps)
    a = jax.device_put(jnp.ones((256, 1024)), NamedSharding(mesh, P("x", "y")))
    w = jax.device_put(jnp.ones((1024, 1024)), NamedSharding(mesh, P(None, "y")))
    counts = {}
    for fn in (sharding.allgather_matmul, sharding.collective_matmul):
        f = jax.jit(jax.shard_map(lambda a, w, fn=fn: fn(a, w, "y"), mesh=mesh,
                                  in_specs=(P("x", "y"), P(None, "y")),
                                  out_specs=P("x", "y")))
        tr = profiling.capture(f, a, w, steps=5,
                               categories=hlo.op_categories(f.lower(a, w).compile()))
        counts[fn.__name__] = len(profiling.overlapping_pairs(tr))
    assert counts["allgather_matmul"] == 0 and counts["collective_matmul"] > 0, counts


def test_a_tpu_trace_has_one_op_line_so_no_pairs():
    tr = profiling.load_trace(profiling.real_profile("tpu_v6e_offload").trace)
    assert profiling.overlapping_pairs(tr) == []


@pytest.mark.parametrize("content,match", [
    (b"", "not a \\(gzipped\\) JSON trace"),
    (b"{not json", "not a \\(gzipped\\) JSON trace"),
    (gzip.compress(b"[1, 2", mtime=0), "not a \\(gzipped\\) JSON trace"),   # mtime: a stable test id
    (json.dumps({"events": []}).encode(), "no 'traceEvents'"),
    (json.dumps({"traceEvents": []}).encode(), "no executed HLO ops"),
    (json.dumps({"traceEvents": [{"ph": "X", "ts": 1, "dur": 2, "name": "python"}]}).encode(),
     "no executed HLO ops"),
    (json.dumps({"traceEvents": [{"ph": "X", "dur": 2, "args": {"hlo_op": "a"}}]}).encode(),
     "no numeric 'ts'"),
])
def test_malformed_or_empty_trace_gives_a_clear_error(tmp_path, content, match):
    p = tmp_path / "t.json"
    p.write_bytes(content)
    with pytest.raises(profiling.TraceError, match=match):
        profiling.load_trace(p)


def test_bad_arguments(tmp_path):
    with pytest.raises(profiling.TraceError, match="does not exist"):
        profiling.load_trace(tmp_path / "missing.json")
    with pytest.raises(profiling.TraceError, match="no JSON trace"):
        profiling.find_trace_file(tmp_path)
    with pytest.raises(profiling.TraceError, match="not a folder"):
        profiling.find_trace_file(tmp_path / "nope")
    with pytest.raises(TypeError, match="trace must be a path"):
        profiling.load_trace(42)
    with pytest.raises(TypeError, match="fn must be a function"):
        profiling.capture("f")
    with pytest.raises(ValueError, match="steps"):
        profiling.capture(jnp.sin, 1.0, steps=0)
    with pytest.raises(ValueError, match="warmup"):
        profiling.capture(jnp.sin, 1.0, warmup=-1)
    with pytest.raises(TypeError, match="HLO op name"):
        profiling.op_kind(3)


def test_op_kind_from_names():
    assert profiling.op_kind("all-reduce.22") == "collective"
    assert profiling.op_kind("all-gather-start") == "collective"
    assert profiling.op_kind("ynn_fusion.31") == "matmul"
    assert profiling.op_kind("dot.4") == "matmul"
    assert profiling.op_kind("multiply_add_fusion") == "elementwise"
    assert profiling.op_kind("wrapped_tanh") == "elementwise"
    assert profiling.op_kind("copy.3") == "data movement"
    assert profiling.op_kind("custom-call") == "other"
    assert profiling.op_kind("fusion.3", {"fusion.3": "matmul"}) == "matmul"


def test_timeline_draws_one_lane_per_device(trace):
    ax = profiling.plot_timeline(trace)
    assert len(ax.get_yticks()) == 8
    step = trace.steps("step")[1]
    ax = profiling.plot_timeline(trace, window=(step.start, step.end), devices=[0, 1])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["device 0", "device 1"]
    with pytest.raises(ValueError, match="window"):
        profiling.plot_timeline(trace, window=(2, 1))
    with pytest.raises(TypeError, match="Trace"):
        profiling.plot_timeline([])


def test_compare_with_roofline(trace, sharded_matmul):
    _, _, compiled = sharded_matmul
    rows = profiling.compare_with_roofline(trace, compiled, peak_flops=1e11, bandwidth=1e10)
    assert rows and all(r.kind != "collective" for r in rows)
    mm = [r for r in rows if r.kind == "matmul"][0]
    assert mm.flops == 2 * 256 * 64 * 128
    assert mm.predicted.compute == pytest.approx(mm.flops / 1e11)
    assert mm.ratio == pytest.approx(mm.measured / mm.predicted.lower)
    with pytest.raises(ValueError, match="peak_flops"):
        profiling.compare_with_roofline(trace, compiled, peak_flops=0, bandwidth=1e10)
    other = jax.jit(lambda x: x * 3).lower(jnp.ones(3)).compile()
    with pytest.raises(ValueError, match="none of the trace's ops"):
        profiling.compare_with_roofline(trace, other, 1e11, 1e10)


def test_roofline_rows_fit_the_column_with_the_ratio_last(trace, sharded_matmul):
    """Chapter 9 prints these rows whole: the ratio (its last column, which the prose reads)
    must not be cut off by the site's column (the chapter once cut each row at 100
    characters and lost it)."""
    _, _, compiled = sharded_matmul
    header = profiling.OpComparison.HEADER
    assert len(header) <= 88 and header.split()[-1] == "ratio"
    for r in profiling.compare_with_roofline(trace, compiled, 1e11, 1e10):
        line = str(r)
        assert len(line) <= 88, line
        assert line.split()[-1] == f"x{r.ratio:.3g}", line
    long = profiling.OpComparison("a_very_long_fusion_name.123", "data movement", 3, 1.0,
                                  1e9, 1e9, profiling.Bounds(compute=1e-3, memory=2e-3))
    assert len(str(long)) <= 88 and str(long).endswith("x500")


def test_capture_leaves_the_python_function_tracer_off(tmp_path, sharded_matmul):
    """The Python tracer records every function call ("$..." events, which load_trace drops)
    and makes a traced compilation several times slower: capture keeps it off unless asked."""
    f, args, _ = sharded_matmul
    profiling.capture(f, *args, steps=1, logdir=tmp_path)
    raw = profiling._read_json(profiling.find_trace_file(tmp_path))
    assert not [e for e in raw["traceEvents"] if str(e.get("name", "")).startswith("$")]


def test_capture_shows_recompilation_as_compile_spans():
    """Chapter 9 diagnoses recompilation from a trace: each compilation is a
    backend_compile span among the trace's annotations (none once the program is cached).
    The static values are new to this process and to the persistent compilation cache
    (conftest.py), whose hits would show no span: a cache hit is no compilation."""
    f = jax.jit(lambda x, s: x * s, static_argnums=1)
    x = jnp.ones(8)
    fresh = 1.0 + (time.time_ns() % 10**9) / 10**9

    def three(scales):
        return [f(x, s) for s in scales]

    scales = (fresh, fresh + 1, fresh + 2)
    n0 = profiling.compilations()
    t = profiling.capture(three, scales, steps=1, warmup=0)
    assert len([a for a in t.annotations if "backend_compile" in a.name]) == 3
    assert profiling.compilations() - n0 == 3
    again = profiling.capture(three, scales, steps=1, warmup=0)
    assert not [a for a in again.annotations if "backend_compile" in a.name]
    assert profiling.compilations() - n0 == 3


def test_compilations_counts_a_persistent_cache_hit_as_a_compilation(tmp_path):
    """A program served from JAX's persistent compilation cache (a reader may have one
    switched on) was still traced, lowered and looked up anew: compilations() counts it, so
    chapter 9's recompilation diagnosis and exercise checks do not depend on the cache."""
    import subprocess
    import sys

    code = (
        "import scalebook; scalebook.setup(quiet=True)\n"
        "import jax, jax.numpy as jnp\n"
        "from scalebook import profiling\n"
        "x = jnp.ones(4) + 0\n"
        "n0 = profiling.compilations()\n"
        "f = jax.jit(lambda x, s: x * s + 0.125, static_argnums=1)\n"
        "[f(x, s) for s in (2.0, 3.0)]\n"
        "print(profiling.compilations() - n0)\n")
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    env.pop("JAX_ENABLE_COMPILATION_CACHE", None)
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:]
    assert len(list((tmp_path / "cache").iterdir())) >= 2          # the second run hit it
    assert [r.stdout.split()[-1] for r in runs] == ["2", "2"]


# ------------------------------------------------------------------------------------------
# Predicted profiles
# ------------------------------------------------------------------------------------------

def test_predicted_layer_matches_the_training_flops_formula():
    m = get_model("llama3-70b")
    T, S, tp = 8192, 8192, 8
    ops = profiling.predict_layer_profile(m, "tpu-v5p", tokens=T, seq_len=S, tp=tp)
    matmul = sum(o.flops for o in ops if o.kind in ("matmul", "attention"))
    # 6 x (weights of one layer) per token + 3 x forward attention of one layer, over tp chips
    per_layer = (m.training_flops_per_token(S) - 6 * m.param_breakdown().output_head) / m.n_layers
    assert matmul == pytest.approx(per_layer * T / tp, rel=1e-9)


def test_predicted_collectives_and_bounds():
    m = get_model("llama3-70b")
    T = 8192
    for chip, bw in (("tpu-v5p", 2 * get_chip("tpu-v5p").ici_link_bandwidth),
                     ("gpu-h100", get_chip("gpu-h100").ici_bandwidth)):
        ops = profiling.predict_layer_profile(m, chip, tokens=T, seq_len=T, tp=8)
        ar = [o for o in ops if o.kind == "collective"]
        assert len(ar) == 4
        want = ring_bytes("all-reduce", 2 * T * m.d_model, 8)
        assert all(o.comm_bytes == want and o.time == pytest.approx(want / bw) for o in ar)
        assert all(o.bound == "compute" for o in ops if o.kind == "matmul")
        assert all(o.bound == "memory" for o in ops if o.kind == "elementwise")
        b = profiling.predicted_breakdown(ops)
        assert b["total"] == pytest.approx(sum(o.time for o in ops))
        assert b["matmul"] > b["elementwise"]
    # a faster link shrinks only the collectives
    fast = get_chip("tpu-v5p").with_(ici_link_bandwidth=4e11)
    slow_b = profiling.predicted_breakdown(
        profiling.predict_layer_profile(m, "tpu-v5p", tokens=T, seq_len=T))
    fast_b = profiling.predicted_breakdown(
        profiling.predict_layer_profile(m, fast, tokens=T, seq_len=T))
    assert fast_b["collective"] == pytest.approx(slow_b["collective"] / 4)
    assert fast_b["matmul"] == slow_b["matmul"]
    assert profiling.predict_layer_profile(m, "tpu-v5p", tokens=T, seq_len=T, tp=1)[5].kind \
        != "collective"


def test_predicted_bad_input():
    with pytest.raises(ValueError, match="tp=3 must divide"):
        profiling.predict_layer_profile("llama3-70b", "tpu-v5p", 8192, 8192, tp=3)
    with pytest.raises(ValueError, match="whole number of sequences"):
        profiling.predict_layer_profile("llama3-70b", "tpu-v5p", 1000, 8192)
    with pytest.raises(ValueError, match="tokens"):
        profiling.predict_layer_profile("llama3-70b", "tpu-v5p", 0, 8192)
    with pytest.raises(ValueError, match="topology"):
        profiling.predict_layer_profile("llama3-70b", "tpu-v5p", 8192, 8192, topology="mesh")
    with pytest.raises(TypeError):
        profiling.predicted_breakdown([1, 2])
    ax = profiling.plot_predicted(profiling.predict_layer_profile("llama3-8b", "gpu-h100",
                                                                  4096, 4096))
    assert ax.get_xlabel() == "time (ms)"


def test_real_profiles_ship_with_the_package():
    """Chapter 9 reads the TPU profile in Colab, where only the installed package exists:
    every file under scalebook/data/profiles matches the package-data patterns."""
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["scalebook"]
    files = [p.relative_to(root / "scalebook").as_posix()
             for p in (root / "scalebook" / "data").rglob("*") if p.is_file()]
    assert len(files) >= 11
    for f in files:
        assert any(fnmatch.fnmatch(f, pat) and f.count("/") == pat.count("/")
                   for pat in patterns), f
    for name in profiling.REAL_PROFILES:
        prof = profiling.real_profile(name)
        assert os.path.isfile(prof.trace) and prof.hlo
        assert set(prof.hlo) <= set(profiling.load_trace(prof.trace).modules)
    assert "ENTRY" in profiling.real_profile("tpu_v6e_offload").hlo_text("jit_f")
    with pytest.raises(ValueError, match="one of"):
        profiling.real_profile("h100")


# ------------------------------------------------------------------------------------------
# Ops back to source lines, memory over the schedule, device memory profiles
# ------------------------------------------------------------------------------------------

def test_op_sources_give_named_scopes_and_lines():
    import inspect

    def layer(x, w):
        with jax.named_scope("proj"):
            h = x @ w
        with jax.named_scope("act"):
            return jnp.tanh(h) * 2

    c = jax.jit(layer).lower(jax.ShapeDtypeStruct((64, 32), jnp.float32),
                             jax.ShapeDtypeStruct((32, 16), jnp.float32)).compile()
    src = hlo.op_sources(c)
    assert set(src) == {o.name for o in hlo.ops(c)}
    first = inspect.getsourcelines(layer)[1]
    (mm,) = [s for s in src.values() if hlo.op_categories(c)[s.name] == "matmul"]
    assert mm.scope == "proj" and mm.op_name.endswith("proj/dot_general")
    assert mm.function.endswith("layer") and mm.line == first + 2 and mm.file == __file__
    (act,) = [s for s in src.values() if s.scope == "act"]
    assert act.line == first + 4 and act.op_name.startswith("jit(layer)/act/")
    params = [s for s in src.values() if s.name.startswith(("x", "w"))]
    assert params and all(s.line == 0 and s.scope == "" for s in params)
    # the HLO text alone has no stack tables: names still, lines not
    stripped = hlo.op_sources(hlo.hlo_text(c))
    assert stripped[mm.name].op_name == mm.op_name and stripped[mm.name].line == 0
    with pytest.raises(TypeError):
        hlo.op_sources(layer)


def test_op_sources_read_older_source_file_metadata():
    text = """HloModule m

ENTRY %main (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %t = f32[4]{0} tanh(%p), metadata={op_type="tanh" op_name="jit(f)/blk/tanh" source_file="/src/model.py" source_line=37}
}
"""
    s = hlo.op_sources(text)["t"]
    assert (s.op_name, s.file, s.line, s.scope) == ("jit(f)/blk/tanh", "/src/model.py", 37, "blk")


# XLA's own buffer assignment of the TPU fixture's jit_f, stored next to its HloModuleProto
# in the XSpace (HloProto.buffer_assignment): the HBM (colour 0) temporaries are one
# allocation of 21,474,934,784 bytes: 4 arrays of 5,368,709,120 at offsets 98,304 +
# k x 5,368,709,120, the first 98,304 bytes holding the 32-byte tuple tables.
XLA_TPU_JIT_F_HBM_ALLOCATION = 21_474_934_784


def test_live_memory_matches_xla_buffer_assignment_on_the_tpu_fixture():
    text = profiling.real_profile("tpu_v6e_offload").hlo_text("jit_f")
    array = 5 * 1024 * 1024 * 256 * 4
    lm = hlo.live_memory(text)
    assert lm.peak == 4 * array and lm.at == "broadcast_add_fusion.2"
    assert [n for n, _ in lm.live] == ["copy-start", "copy-start.2", "copy-start.4",
                                       "broadcast_add_fusion.2"]
    assert 0 < XLA_TPU_JIT_F_HBM_ALLOCATION - lm.peak <= 98_304
    # nothing in HBM at the start (the inputs are in host memory, S(5)) or the end
    assert lm.timeline[0][1] == 0 and lm.timeline[-1][1] == 0
    assert hlo.live_memory(text, memory_space=2).peak == 3 * 4     # the copies' u32 flags
    with pytest.raises(ValueError, match="memory_space"):
        hlo.live_memory(text, memory_space=-1)


def test_live_memory_of_a_cpu_program_bounds_xla():
    """On XLA:CPU the estimate holds the arguments and every intermediate alive at once;
    XLA may write a result over an input that dies, so its figure is at most ours."""
    def f(x, w):
        return jnp.tanh(x @ w) @ w.T

    c = jax.jit(f).lower(jax.ShapeDtypeStruct((128, 64), jnp.float32),
                         jax.ShapeDtypeStruct((64, 256), jnp.float32)).compile()
    lm, m = hlo.live_memory(c), hlo.memory(c)
    assert m.arguments + m.outputs - m.aliased <= lm.peak <= m.peak + 128 * 256 * 4
    assert {"x.1", "w.1"} <= {n for n, _ in lm.live} or lm.peak >= m.arguments


def test_memory_profile_finds_the_largest_buffer_and_its_line():
    import inspect

    def make():
        return jnp.ones((512, 1024))                 # 2 MiB on device 0

    big = make()
    line = inspect.getsourcelines(make)[1] + 1
    mesh = scalebook.make_mesh((8,), ("x",))
    small = jax.device_put(jnp.ones((64, 8)), NamedSharding(mesh, P("x")))
    rows = profiling.memory_profile()
    top = rows[0]
    assert (top.device, top.kind, top.bytes, top.count) == ("cpu:0", "buffer", 2 * 2**20, 1)
    assert top.where()[0] == "make" and top.where()[2] == line
    shards = [r for r in rows if r.bytes == 8 * 8 * 4 and r.where()[0] ==
              "test_memory_profile_finds_the_largest_buffer_and_its_line"]
    assert len({r.device for r in shards}) == 8
    assert all(r.kind == "buffer" for r in rows)
    assert any(r.kind == "executable" for r in profiling.memory_profile(kind=None))
    with pytest.raises(ValueError, match="pprof"):
        profiling.memory_profile(b"\x08\x01\x12")
    with pytest.raises(TypeError):
        profiling.memory_profile("profile")
    del big, small


def test_overlapping_pairs_can_ask_for_a_least_overlap():
    """Chapter 10 keeps pairs that overlap by at least 10 µs (events that touch are not
    overlap); the same function serves chapters 9 and 10."""
    from types import SimpleNamespace as E
    from scalebook.profiling import overlap_seconds

    assert overlap_seconds(E(start=0.0, end=2.0), E(start=1.0, end=3.0)) == 1.0
    assert overlap_seconds(E(start=0.0, end=1.0), E(start=2.0, end=3.0)) == 0.0
