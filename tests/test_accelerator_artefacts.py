"""The trace and HLO readers on what real GPUs and TPUs emit, not only XLA:CPU (issue 26).

* Real traces (scalebook/data/profiles/traces, sources in their README): two JAX programs on AMD
  GPUs (an MI300X 3-D convolution on 8 GPUs; a Transformer-Engine attention loss on one
  GPU, with Triton gemm fusions and a cuBLAS gemm) and a JAX program on 4 TPU v6e chips
  (host offload and a psum). Each is loaded, tabulated per op and per kind, and drawn.
* Real HLO (scalebook/data/profiles/hlo): the compiled modules stored in those same profiles, so
  every op a trace names is an instruction of its program.
* Hand-written HLO of each accelerator form: TPU collective fusions, cuBLAS / cuBLASLt gemm
  custom-calls, Triton gemm fusions, convolutions (TPU's dot-as-convolution, cuDNN
  custom-calls), async collective wrappers and fused-attention custom-calls.
* shard_map's collective names, XLA's peak memory and host fields, and step annotations.
"""

import gzip
import json
from pathlib import Path

import pytest

import scalebook

scalebook.setup(quiet=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
from jax.sharding import PartitionSpec as P  # noqa: E402

from scalebook import hlo, profiling  # noqa: E402
from scalebook.collectives import ring_bytes  # noqa: E402

# Real profiles ship with the package (chapter 9 reads them); the tool that made them is
# tests/fixtures/make_fixtures.py.
FIXTURES = Path(__file__).resolve().parents[1] / "scalebook" / "data" / "profiles"
TRACES = FIXTURES / "traces"
HLO = FIXTURES / "hlo"


def fixture_hlo(name):
    return (HLO / f"{name}.hlo.txt").read_text()


def raw_events(name):
    return json.loads(gzip.decompress((TRACES / f"{name}.trace.json.gz").read_bytes()))[
        "traceEvents"]


def processes(events):
    return {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}


# ------------------------------------------------------------------------------------------
# Real GPU traces: device-side kernels only, the device from the process name
# ------------------------------------------------------------------------------------------

def test_gpu_trace_keeps_the_kernels_and_drops_the_host_launches():
    """The MI300X trace names each op twice: on the host's hipModuleLaunchKernel call and on
    the GPU's kernel. Only the kernels are device time; GPU events have no device_ordinal."""
    raw = raw_events("gpu_mi300x_conv")
    procs = processes(raw)
    with_op = [e for e in raw if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]
    on_host = [e for e in with_op if procs[e["pid"]] == "/host:CPU"]
    on_gpu = [e for e in with_op if procs[e["pid"]].startswith("/device:GPU:")]
    assert len(on_host) == len(on_gpu) == 198
    assert {e["name"] for e in on_host} <= {"hipModuleLaunchKernel", "hipExtModuleLaunchKernel"}
    assert not any("device_ordinal" in e["args"] for e in with_op)

    t = profiling.load_trace(TRACES / "gpu_mi300x_conv.trace.json.gz")
    assert len(t.events) == 198
    assert t.devices == list(range(8))
    assert t.modules == ["jit_forward_3d_conv"]
    assert all(e.kernel.endswith(".kd") for e in t.events)       # AMD kernel objects
    kernel_time = sum(e["dur"] for e in on_gpu) * 1e-6
    assert sum(e.duration for e in t.events) == pytest.approx(kernel_time)
    assert t.busy_time(device=3) > 0
    # per device: the same four ops (device 0 lost two kernels' op names in this capture)
    per_device = {d: len(t.select(device=d)) for d in t.devices}
    assert per_device == {0: 23, **{d: 25 for d in range(1, 8)}}


def test_gpu_trace_per_op_table_with_the_programs_own_categories():
    t = profiling.load_trace(TRACES / "gpu_mi300x_conv.trace.json.gz")
    top = t.summary("op")
    assert [r.key for r in top[:2]] == ["input_transpose_fusion", "cudnn-conv.1"]
    # the convolution launches two kernels (im2col, then the gemm) per run
    conv = {r.key: r for r in top}["cudnn-conv.1"]
    assert conv.count == 79 and len({e.kernel for e in t.select() if e.name == conv.key}) > 1
    t.categories = hlo.op_categories(fixture_hlo("gpu_mi300x_conv.jit_forward_3d_conv"))
    kinds = {r.key: r for r in t.summary("kind")}
    assert set(kinds) == {"matmul", "elementwise"}
    assert kinds["matmul"].total == pytest.approx(conv.total)
    assert all(e.name in t.categories for e in t.events)    # every traced op is an instruction


def test_gpu_trace_with_triton_gemms_cublas_and_fused_attention():
    t = profiling.load_trace(TRACES / "gpu_amd_te_attention.trace.json.gz")
    assert t.devices == [0] and t.modules == ["jit_loss_fn"] and len(t.events) == 150
    text = fixture_hlo("gpu_amd_te_attention.jit_loss_fn")
    cats = hlo.op_categories(text)
    assert {e.name for e in t.events} <= set(cats)
    t.categories = cats
    kinds = {r.key: r for r in t.summary("kind")}
    assert set(kinds) == {"matmul", "attention", "elementwise"}
    matmuls = {e.name for e in t.select(kind="matmul")}
    assert matmuls == {"gemm_fusion_dot", "gemm_fusion_dot.1", "gemm_fusion_dot.3",
                       "gemm_fusion_dot.6", "gemm_fusion_dot.7", "custom-call.1"}
    assert {e.name for e in t.select(kind="attention")} == {
        "te_fused_attn_forward_ffi.10", "te_fused_attn_forward_ffi.15",
        "te_fused_attn_backward_ffi.12", "te_fused_attn_backward_ffi.18"}
    # the names alone say the same for all but the cuBLAS call ("custom-call.1")
    for e in t.events:
        if e.name != "custom-call.1":
            assert profiling.op_kind(e.name) == t.kind(e.name), e.name
    # the host's PjitFunction spans (the Python calls) are kept as annotations
    assert len(t.steps("PjitFunction(loss_fn)")) == 10
    rows = profiling.compare_with_roofline(t, text, peak_flops=2.5e15, bandwidth=8e12, n=4)
    assert rows[0].kind in ("matmul", "attention") and all(r.measured > 0 for r in rows)


def test_tpu_trace_reads_the_xla_ops_line():
    """A TPU's ops are the events of its "XLA Ops" line (no args.hlo_op there), their
    program the "XLA Modules" span around them, the device the process /device:TPU:N."""
    raw = raw_events("tpu_v6e_offload")
    assert not any("hlo_op" in e.get("args", {}) for e in raw)
    t = profiling.load_trace(TRACES / "tpu_v6e_offload.trace.json.gz")
    assert t.devices == [0, 1, 2, 3]
    assert {e.thread for e in t.events} == {"XLA Ops"}
    assert t.modules == ["jit__psum", "jit_broadcast_in_dim", "jit_f"]
    psum = t.select(module="jit__psum")
    assert {e.name for e in psum} == {"all-reduce"} and len(psum) == 3 * 4
    f_ops = {e.name for e in t.select(module="jit_f")}
    f_hlo = {o.name for o in hlo.ops(fixture_hlo("tpu_v6e_offload.jit_f"))}
    assert f_ops <= f_hlo
    cats = {**hlo.op_categories(fixture_hlo("tpu_v6e_offload.jit_f")),
            **hlo.op_categories(fixture_hlo("tpu_v6e_offload.jit__psum"))}
    t.categories = cats
    kinds = {r.key: r for r in t.summary("kind", module="jit_f")}
    # host offload: the copies from host memory take most of the program's time
    assert kinds["data movement"].share > 0.9 and "elementwise" in kinds
    assert t.kind("all-reduce") == "collective"
    assert profiling.op_kind("copy-done.4") == "data movement"


@pytest.mark.parametrize("name,lanes", [("gpu_mi300x_conv", 8), ("gpu_amd_te_attention", 1),
                                        ("tpu_v6e_offload", 4)])
def test_timeline_of_each_real_trace(name, lanes):
    t = profiling.load_trace(TRACES / f"{name}.trace.json.gz")
    ax = profiling.plot_timeline(t)
    assert len(ax.get_yticks()) == lanes
    first = t.select(device=0)[0]
    ax = profiling.plot_timeline(t, window=(first.start, first.end + 1e-3), devices=[0])
    assert [x.get_text() for x in ax.get_yticklabels()] == ["device 0"]


def test_gpu_loader_synthetic_forms():
    def meta(pid, name, tid=None):
        kind = "thread_name" if tid is not None else "process_name"
        return {"ph": "M", "pid": pid, "tid": tid, "name": kind, "args": {"name": name}}

    host_launch = {"ph": "X", "pid": 9, "tid": 1, "ts": 10, "dur": 30,
                   "name": "cuLaunchKernel", "args": {"hlo_op": "fusion.1",
                                                      "hlo_module": "jit_f"}}
    kernel = {"ph": "X", "pid": 3, "tid": 2, "ts": 50, "dur": 5, "name": "loop_fusion_1",
              "args": {"hlo_op": "fusion.1", "hlo_module": "jit_f"}}
    base = [meta(9, "/host:CPU"), meta(3, "/device:GPU:5"), meta(3, "Stream #2", tid=2),
            meta(7, "/device:CUSTOM:Megascale Trace")]
    t = profiling.load_trace({"traceEvents": base + [host_launch, kernel]})
    (e,) = t.events
    assert (e.name, e.device, e.thread, e.kernel) == ("fusion.1", 5, "Stream #2",
                                                     "loop_fusion_1")
    assert e.duration == pytest.approx(5e-6) and e.start == pytest.approx(40e-6)
    # kernels that name no op (a CUDA graph / command buffer): say so, never count the host
    graph = dict(kernel, args={"correlation_id": "4"})
    with pytest.raises(profiling.TraceError, match="command buffer") as err:
        profiling.load_trace({"traceEvents": base + [host_launch, graph]})
    # recent XLA profiles op by op unless this flag is set: the message names it first
    assert "--xla_enable_command_buffers_during_profiling" in str(err.value)


def test_a_loop_is_not_counted_on_top_of_its_body():
    """XLA:CPU traces a while loop as one op spanning the ops of its body: the loader keeps
    the body's ops and leaves the loop out, so no time counts twice."""
    def scanned(w, x):
        return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0]

    f = jax.jit(scanned)
    w, x = jnp.ones((4, 64, 64)), jnp.ones((16, 64))
    cats = hlo.op_categories(f.lower(w, x).compile())
    assert any(n.startswith("while") for n in cats)
    t = profiling.capture(f, w, x, steps=2)
    assert not any(e.name.startswith("while") for e in t.events)
    (mm,) = [r for r in t.summary("op") if cats.get(r.key) == "matmul"]
    assert mm.count == 2 * 4                        # 2 steps x 4 iterations
    assert sum(e.duration for e in t.events) <= t.busy_time(0) * (1 + 1e-9)
    # only control flow is dropped: a TPU op with instant events at its start stays
    ev = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:TPU:0"}},
          {"ph": "M", "pid": 1, "tid": 3, "name": "thread_name", "args": {"name": "XLA Ops"}},
          {"ph": "X", "pid": 1, "tid": 3, "ts": 10, "dur": 100, "name": "copy-done.5"},
          {"ph": "X", "pid": 1, "tid": 3, "ts": 10, "dur": 1e-6, "name": "fusion"},
          {"ph": "X", "pid": 1, "tid": 3, "ts": 200, "dur": 50, "name": "while.2"},
          {"ph": "X", "pid": 1, "tid": 3, "ts": 201, "dur": 20, "name": "fusion.1"}]
    names = [e.name for e in profiling.load_trace({"traceEvents": ev}).events]
    assert names == ["copy-done.5", "fusion", "fusion.1"]


# ------------------------------------------------------------------------------------------
# Real HLO: GPU gemms, convolutions and attention; TPU host offload and all-reduce
# ------------------------------------------------------------------------------------------

def test_real_gpu_hlo_gemm_fusions_cublas_and_attention():
    ops = {o.name: o for o in hlo.ops(fixture_hlo("gpu_amd_te_attention.jit_loss_fn"))}
    gemm = ops["gemm_fusion_dot"]          # Triton: f32[2,4096,6144] = [4096,2,1024] x ...
    assert (gemm.fusion_kind, gemm.category) == ("kCustom", "matmul")
    assert gemm.flops == 2 * (2 * 4096 * 6144) * 1024
    cublas = ops["custom-call.1"]          # __cublas$gemm: [4096,6144] x [2048,6144]^T
    assert cublas.category == "matmul" and cublas.flops == 2 * 4096 * 2048 * 6144
    # operands + result, the s8[67108864] cuBLAS workspace left out
    assert cublas.bytes == 2 * (4096 * 6144 + 2048 * 6144 + 4096 * 2048)
    attn = [o for o in ops.values() if o.opcode == "custom-call" and "attn" in o.name]
    assert len(attn) == 4 and {o.category for o in attn} == {"attention"}
    # six matmuls of the same size: the forward and backward of a [4096, 6144] x
    # [6144, 2048] projection, in three layouts
    assert sum(o.flops for o in ops.values()) == 6 * cublas.flops == 6 * gemm.flops


def test_real_gpu_convolution_counts_what_xla_counts():
    """cuDNN/MIOpen's convolution custom-call of the MI300X program gets the FLOPs XLA's own
    cost analysis gives the same convolution compiled here (padding positions excluded)."""
    (conv,) = [o for o in hlo.ops(fixture_hlo("gpu_mi300x_conv.jit_forward_3d_conv"))
               if o.category == "matmul"]
    assert conv.opcode == "custom-call" and conv.name == "cudnn-conv.1"
    x = jax.ShapeDtypeStruct((1, 16, 32, 60, 104), jnp.float32)
    k = jax.ShapeDtypeStruct((5120, 16, 1, 2, 2), jnp.float32)
    c = jax.jit(lambda a, b: jax.lax.conv_general_dilated(
        a, b, (1, 2, 2), [(1, 1)] * 3)).lower(x, k).compile(hlo.ANALYSIS_ONLY)
    assert conv.flops == hlo.cost(c)["flops"] == sum(o.flops for o in hlo.ops(c))
    assert conv.flops < 2 * (5120 * 34 * 31 * 53) * (16 * 2 * 2)      # < the dense count


def test_real_tpu_hlo_host_offload_and_all_reduce():
    ops = hlo.ops(fixture_hlo("tpu_v6e_offload.jit_f"))
    by_cat = {}
    for o in ops:
        by_cat.setdefault(o.category, set()).add(o.opcode)
    assert by_cat["data movement"] == {"copy-start", "copy-done"}
    assert by_cat["elementwise"] == {"fusion"}
    psum_text = fixture_hlo("tpu_v6e_offload.jit__psum")
    (ar,) = [o for o in hlo.ops(psum_text) if o.category == "collective"]
    assert ar.name == "all-reduce"
    # the groups the trace's long_name gives, restored by make_fixtures.py (this JAX's
    # printer leaves the proto's iota list out and prints replica_groups={})
    assert "replica_groups={}" not in psum_text
    (rec,) = hlo.collectives(psum_text)
    nbytes = 5 * 1024 * 1024 * 256 * 4
    assert rec.kind == "all-reduce" and rec.group_size == 2
    assert rec.groups == ((0, 4), (1, 5), (2, 6), (3, 7))      # 4 pairs over 8 chips
    assert rec.bytes_per_device == ring_bytes("all-reduce", nbytes, 2)
    trace = profiling.load_trace(str(TRACES / "tpu_v6e_offload.trace.json.gz"))
    long_name = trace.select(module="jit__psum")[0].args["long_name"]
    assert "replica_groups=[4,2]<=[2,4]T(1,0)" in long_name
    assert hlo.parse_replica_groups("[4,2]<=[2,4]T(1,0)") == rec.groups


# ------------------------------------------------------------------------------------------
# Hand-written accelerator HLO, one form each
# ------------------------------------------------------------------------------------------

TPU_REDUCE_SCATTER_FUSION = """
HloModule jit_step, is_scheduled=true, num_partitions=2

%add (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  ROOT %sum = bf16[] add(%a, %b)
}

%fused_computation.32 (p: bf16[32,32,8192]) -> bf16[32,32,8192] {
  %p = bf16[32,32,8192]{2,1,0:T(8,128)(2,1)} parameter(0)
  ROOT %m = bf16[32,32,8192]{2,1,0:T(8,128)(2,1)} multiply(%p, %p)
}

%all-reduce-scatter.3 (param.1: bf16[32,32,8192]) -> bf16[32,32,4096] {
  %param.1 = bf16[32,32,8192]{2,1,0:T(8,128)(2,1)} parameter(0)
  %all-reduce.9 = bf16[32,32,8192]{2,1,0:T(8,128)(2,1)} all-reduce(%param.1), channel_id=3, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
  %c0 = s32[] constant(0)
  %pid = u32[] partition-id()
  %c4096 = u32[] constant(4096)
  %off = u32[] multiply(%pid, %c4096)
  ROOT %dynamic-slice.2 = bf16[32,32,4096]{2,1,0:T(8,128)(2,1)} dynamic-slice(%all-reduce.9, %c0, %c0, %off), dynamic_slice_sizes={32,32,4096}
}

ENTRY %main.7 (Arg_0.1: bf16[32,32,8192]) -> bf16[32,32,4096] {
  %Arg_0.1 = bf16[32,32,8192]{2,1,0:T(8,128)(2,1)} parameter(0)
  %fusion.32 = bf16[32,32,8192]{2,1,0:T(8,128)(2,1)S(1)} fusion(%Arg_0.1), kind=kLoop, calls=%fused_computation.32
  ROOT %fusion.3 = bf16[32,32,4096]{2,1,0:T(8,128)(2,1)S(1)} fusion(bf16[32,32,8192]{2,1,0:T(8,128)(2,1)S(1)} %fusion.32), kind=kCustom, calls=%all-reduce-scatter.3
}
"""


def test_tpu_fusion_that_calls_a_collective_is_that_collective():
    ops = {o.name: o for o in hlo.ops(TPU_REDUCE_SCATTER_FUSION)}
    assert ops["fusion.3"].category == "collective"
    assert ops["fusion.3"].fusion_kind == "kCustom"
    assert ops["fusion.32"].category == "elementwise"
    cats = hlo.op_categories(TPU_REDUCE_SCATTER_FUSION)
    assert profiling.op_kind("fusion.3", cats) == "collective"
    # the same with a reduce-scatter inside, and with an async wrapper around one (GPU)
    rs = TPU_REDUCE_SCATTER_FUSION.replace(
        "all-reduce(%param.1), channel_id=3",
        "reduce-scatter(%param.1), dimensions={2}, channel_id=3")
    assert hlo.op_categories(rs)["fusion.3"] == "collective"


GPU_FORMS = """
HloModule jit_gpu_forms, is_scheduled=true

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%triton_gemm_computation (p0: bf16[64,256], p1: bf16[256,128]) -> bf16[64,128] {
  %p0 = bf16[64,256]{1,0} parameter(0)
  %p1 = bf16[256,128]{1,0} parameter(1)
  ROOT %dot.5 = bf16[64,128]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%async_computation (q: f32[8,1024]) -> f32[1,1024] {
  %q = f32[8,1024]{1,0} parameter(0)
  ROOT %reduce-scatter.1 = f32[1,1024]{1,0} reduce-scatter(%q), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, use_global_device_ids=true, dimensions={0}, to_apply=%add
}

ENTRY %main (a: bf16[64,256], b: bf16[256,128], c: f32[8,64,32], d: f32[8,32,16], e: f32[8,1024], bias: f32[8,64,16]) -> f32[1,1024] {
  %a = bf16[64,256]{1,0} parameter(0)
  %b = bf16[256,128]{1,0} parameter(1)
  %c = f32[8,64,32]{2,1,0} parameter(2)
  %d = f32[8,32,16]{2,1,0} parameter(3)
  %e = f32[8,1024]{1,0} parameter(4)
  %bias = f32[8,64,16]{2,1,0} parameter(5)
  %cublas-gemm.1 = (bf16[64,128]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", backend_config={"operation_queue_id":"0","gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"epilogue":"DEFAULT"}}
  %cublas-lt-matmul.2 = (f32[8,64,16]{2,1,0}, s8[33554432]{0}) custom-call(%c, %d, %bias), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"alpha_real":1,"beta":1,"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]},"epilogue":"BIAS"}}
  %gemm_fusion_dot.4 = bf16[64,128]{1,0} fusion(%a, %b), kind=kCustom, calls=%triton_gemm_computation, backend_config={"fusion_backend_config":{"kind":"__triton_gemm","triton_gemm_config":{"block_m":"64","block_n":"64","block_k":"32"}}}
  %fmha.3 = (bf16[64,128]{1,0}, u8[0]{0}) custom-call(%a, %b), custom_call_target="__cudnn$fmhaSoftmax"
  %reduce-scatter-start = ((f32[8,1024]{1,0}), f32[1,1024]{1,0}) async-start(%e), calls=%async_computation
  ROOT %reduce-scatter-done = f32[1,1024]{1,0} async-done(%reduce-scatter-start), calls=%async_computation
}
"""


ASYNC_GEMM = """
HloModule jit_async_gemm, is_scheduled=true

%wrapped_gemm (p: f32[64,32], q: f32[32,16]) -> f32[64,16] {
  %p = f32[64,32]{1,0} parameter(0)
  %q = f32[32,16]{1,0} parameter(1)
  ROOT %dot.9 = f32[64,16]{1,0} dot(%p, %q), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[64,32], b: f32[32,16]) -> f32[64,16] {
  %a = f32[64,32]{1,0} parameter(0)
  %b = f32[32,16]{1,0} parameter(1)
  %dot-start = ((f32[64,32]{1,0}, f32[32,16]{1,0}), f32[64,16]{1,0}) async-start(%a, %b), calls=%wrapped_gemm
  ROOT %dot-done = f32[64,16]{1,0} async-done(%dot-start), calls=%wrapped_gemm
}
"""


def test_gpu_gemm_custom_calls_and_triton_fusions_are_matmuls():
    ops = {o.name: o for o in hlo.ops(GPU_FORMS)}
    gemm = ops["cublas-gemm.1"]
    assert gemm.category == "matmul" and gemm.flops == 2 * 64 * 128 * 256
    assert gemm.bytes == 2 * (64 * 256 + 256 * 128 + 64 * 128)      # no workspace
    lt = ops["cublas-lt-matmul.2"]                                      # batched, with bias
    assert lt.category == "matmul" and lt.flops == 2 * 8 * 64 * 16 * 32
    triton = ops["gemm_fusion_dot.4"]
    assert triton.category == "matmul" and triton.flops == 2 * 64 * 128 * 256
    assert ops["fmha.3"].category == "attention"
    assert ops["reduce-scatter-start"].category == "collective"
    assert ops["reduce-scatter-done"].category == "collective"
    # an async gemm (start / done around a wrapped computation) counts its FLOPs once
    pair = hlo.ops(ASYNC_GEMM)[2:]
    assert [(o.opcode, o.category) for o in pair] == [("async-start", "matmul"),
                                                      ("async-done", "matmul")]
    assert sum(o.flops for o in pair) == 2 * 64 * 16 * 32
    assert profiling.op_kind("cublas-lt-matmul.2") == "matmul"        # by name too


TPU_DOT_AS_CONVOLUTION = """
HloModule jit_mm, is_scheduled=true

%fused_computation (p0: bf16[512,1024], p1: bf16[1024,2048]) -> bf16[512,2048] {
  %p0 = bf16[512,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %p1 = bf16[1024,2048]{1,0:T(8,128)(2,1)} parameter(1)
  %convolution.1 = bf16[512,2048]{1,0:T(8,128)(2,1)} convolution(%p0, %p1), dim_labels=bf_io->bf
  ROOT %t = bf16[512,2048]{1,0:T(8,128)(2,1)} tanh(%convolution.1)
}

ENTRY %main (a: bf16[512,1024], b: bf16[1024,2048]) -> bf16[512,2048] {
  %a = bf16[512,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %b = bf16[1024,2048]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %fusion = bf16[512,2048]{1,0:T(8,128)(2,1)} fusion(%a, %b), kind=kOutput, calls=%fused_computation
}
"""


def test_tpu_matmul_fusion_holding_a_convolution_counts_its_flops():
    (op,) = [o for o in hlo.ops(TPU_DOT_AS_CONVOLUTION) if o.name == "fusion"]
    assert op.category == "matmul" and op.flops == 2 * 512 * 2048 * 1024


@pytest.mark.parametrize("x,k,kw", [
    ((2, 6, 17, 15), (8, 6, 3, 3), dict(window_strides=(1, 1), padding="SAME")),
    ((2, 6, 17, 15), (8, 6, 3, 2), dict(window_strides=(2, 3), padding=[(2, 1), (0, 3)])),
    ((2, 6, 17, 15), (8, 6, 3, 3), dict(window_strides=(1, 1), padding=[(1, 2), (1, 1)],
                                        lhs_dilation=(2, 1))),
    ((2, 6, 17, 15), (8, 6, 3, 3), dict(window_strides=(1, 2), padding="VALID",
                                        rhs_dilation=(2, 2))),
    ((2, 6, 17, 15), (9, 2, 3, 3), dict(window_strides=(1, 1), padding="SAME",
                                        feature_group_count=3)),
    ((4, 6, 17, 15), (8, 6, 3, 3), dict(window_strides=(1, 1), padding="SAME",
                                        batch_group_count=2)),
])
def test_convolution_flops_equal_xla_cost_analysis(x, k, kw):
    c = jax.jit(lambda a, b: jax.lax.conv_general_dilated(a, b, **kw)).lower(
        jax.ShapeDtypeStruct(x, jnp.float32), jax.ShapeDtypeStruct(k, jnp.float32)
    ).compile(hlo.ANALYSIS_ONLY)
    convs = [o for o in hlo.ops(c) if o.flops]
    assert convs and {o.category for o in convs} == {"matmul"}
    assert sum(o.flops for o in convs) == hlo.cost(c)["flops"]


def test_convolution_gradients_count_what_xla_counts():
    loss = lambda a, b: jax.lax.conv_general_dilated(a, b, (2, 1), "SAME").sum()  # noqa: E731
    c = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(
        jax.ShapeDtypeStruct((2, 6, 17, 15), jnp.float32),
        jax.ShapeDtypeStruct((8, 6, 3, 3), jnp.float32)).compile(hlo.ANALYSIS_ONLY)
    assert sum(o.flops for o in hlo.ops(c)) == hlo.cost(c)["flops"]


# ------------------------------------------------------------------------------------------
# shard_map's collective names, memory, step annotations
# ------------------------------------------------------------------------------------------

def test_op_kind_knows_shard_map_collective_names():
    for name in ("psum_invariant.7", "all_gather.3", "reduce_scatter.7", "ppermute.3",
                 "all_to_all.2", "psum.4", "pmax.7", "psum_scatter.1",
                 "all-gather-start.2", "collective-permute-done.1", "all-reduce.1.0"):
        assert profiling.op_kind(name) == "collective", name
    assert profiling.op_kind("custom-call.4") == "other"
    assert profiling.op_kind("cudnn-conv.1") == "matmul"
    assert profiling.op_kind("wrapped_convert") == "elementwise"        # not a convolution
    assert profiling.op_kind("copy-start.3") == "data movement"


def test_traced_shard_map_collectives_are_collectives_by_name():
    """The names this JAX gives shard_map's collectives in a real trace, read without the
    program: the name alone gives the kind the compiled program does."""
    mesh = scalebook.make_mesh((8,), ("x",))

    def body(a):
        g = jax.lax.all_gather(a, "x", tiled=True)
        return (jax.lax.psum(a, "x"), jax.lax.psum_scatter(g, "x", tiled=True),
                jax.lax.ppermute(a, "x", [(i, (i + 1) % 8) for i in range(8)]),
                jax.lax.pmax(a, "x"), jax.lax.all_to_all(g, "x", 0, 0, tiled=True))

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"),
                              out_specs=(P(), P("x"), P("x"), P(), P("x"))))
    x = jnp.arange(64.0 * 8).reshape(64, 8)
    cats = hlo.op_categories(f.lower(x).compile())
    t = profiling.capture(f, x, steps=1)
    traced = {e.name for e in t.events if e.name in cats}
    collective = {n for n in traced if cats[n] == "collective"}
    assert len(collective) >= 5
    assert all(profiling.op_kind(n) == "collective" for n in collective), collective
    assert all(profiling.op_kind(n) == profiling.op_kind(n, cats) for n in traced)


def test_memory_reads_xla_peak_and_host_fields():
    c = jax.jit(lambda x: jnp.exp(x @ x) @ x).lower(
        jax.ShapeDtypeStruct((256, 256), jnp.float32)).compile()
    m = hlo.memory(c)
    raw = c.memory_analysis()
    assert m.peak_memory == raw.peak_memory_in_bytes > 0
    assert m.peak == m.arguments + m.outputs + m.temporaries - m.aliased
    # XLA:CPU's peak leaves the temporary buffer out: arguments + outputs here
    assert m.temporaries > 0 and m.peak_memory == m.arguments + m.outputs < m.peak

    class Stats:                 # what a TPU with host offload reports (fields by name)
        argument_size_in_bytes, output_size_in_bytes, temp_size_in_bytes = 100, 50, 30
        alias_size_in_bytes, generated_code_size_in_bytes = 20, 5
        peak_memory_in_bytes = 140
        host_argument_size_in_bytes, host_output_size_in_bytes = 1000, 700
        host_temp_size_in_bytes, host_alias_size_in_bytes = 300, 200
        host_generated_code_size_in_bytes = 0

    class Compiled:
        def memory_analysis(self):
            return Stats()

        def cost_analysis(self):
            return {}

    m = hlo.memory(Compiled())
    assert (m.peak_memory, m.host_arguments, m.host_outputs, m.host_temporaries,
            m.host_aliased) == (140, 1000, 700, 300, 200)
    assert m.host_total == 1800 and m.peak == 160


def test_capture_marks_each_step_with_its_number(tmp_path):
    """XProf's per-step views read StepTraceAnnotation(name, step_num=i): the trace's step
    spans carry their numbers."""
    f = jax.jit(lambda x: jnp.tanh(x @ x))
    x = jnp.ones((64, 64))
    t = profiling.capture(f, x, steps=3, name="train", logdir=tmp_path)
    assert len(t.steps("train")) == 3
    raw = profiling._read_json(profiling.find_trace_file(tmp_path))["traceEvents"]
    nums = [e["args"].get("step_num") for e in raw if e.get("ph") == "X"
            and e.get("name") == "train"]
    assert sorted(int(n) for n in nums) == [0, 1, 2]


def test_fixture_sources_are_documented():
    for folder in (TRACES, HLO):
        readme = (folder / "README.md").read_text()
        for f in folder.iterdir():
            if f.name != "README.md":
                assert f.name in readme, f"{f.name} is not described in {folder}/README.md"
        assert "Licen" in readme and "commit" in readme
