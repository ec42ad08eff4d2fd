"""scalebook: the helper package of the book *Scaling LLMs, executably*.

``import scalebook`` imports only the set-up code (not JAX); import a module to use it.
Every formula or constant the book uses more than once lives in exactly one place below.

Modules (chapter that derives them)::

  hardware        chip specifications with a source per figure: get_chip, all_chips, spec_table (2)
  roofline        the three clocks and their bounds; matmul FLOPs/bytes/intensity (1)
  chip_internals  inside a TPU chip: systolic array, MXU count and padding, pipelining (2);
                  inside a GPU: SM peaks, waves of tiles (11)
  topology        between chips: torus hops, slices, bisection, transfer time (2);
                  GPU clusters: fat trees, rail-optimised scalable units (11)
  collectives     collective cost formulas: ring bytes per device, time on ring/torus axes (3);
                  in-switch reduction, the hierarchical collective across GPU nodes (11)
  hlo             reading compiled programs: HLO text, collective records, cost and memory (3, 4)
  profiling       traces of JAX programs: capture, op tables, timelines, predicted profiles (9)
  models          LLaMA-3 configurations and transformer arithmetic (4);
                  DeepSeek-V3's latent attention, MLAConfig (12)
  llama           a small LLaMA in plain JAX: forward, training step, KV-cache decoding (4);
                  sharded decode loop, speculative decoding (7)
  inference       inference arithmetic: decode/prefill bounds, KV cache, serving simulator (7)
  parallelism     training parallelism: DP, FSDP/ZeRO, TP, 2D, pipeline, experts, context (5)
  training        the training planner: plan_training, InfeasiblePlan, MFU from reports (6)
  serving         the serving planner: slice, batch, step time, tokens/s/chip, $/Mtok, Pareto (8)
  mesh            notebook set-up (8 simulated devices) and meshes: setup, make_mesh
  multihost       several JAX processes on one machine: jax.distributed on CPU (10)
  sharding        JAX's three modes: checked shardings, lowered collectives, collective matmul,
                  a LLaMA-3 layer in auto/explicit/manual mode (10)
  frontier_mesh   a DeepSeek-style MoE layer with expert parallelism (shard_map, two
                  all-to-alls) and latent attention absorbed or not, on the mesh (12)
  measure         timing on this machine: measured matmul and bandwidth rooflines (1);
                  GPU measurements stored by tools/gpu_measure.py (11)
  plots           the book's figures: chip colours, roofline plots
  diagrams        pictures computed from what they show: an array's blocks on the mesh,
                  collectives before/after, ring steps (3, 10); pipeline schedules (5)
  units           units, dtype sizes and number formatting: GB/GiB, dtype_bytes, sci, fmt_*
  tables          tables of results: Markdown in notebooks and on the site, aligned text in print
  exercises       self-checking exercises: check, evaluate; core, kinds, one file per chapter
  grade           re-run and grade students' notebooks: python -m scalebook.grade
  gradebook       the grader's late policy and its Canvas and Gradescope exports
  assign          make an assignment (per-student variants, key): python -m scalebook.assign
  errors          error types with readers' messages

Formula or task -> function::

  T_math, T_mem, T_comm and max/sum bounds        roofline.time_bounds (Bounds)
  FLOPs = 2BDF, bytes = s(BD+DF+BF), intensity    roofline.matmul_flops / matmul_bytes / matmul_intensity
  dot product FLOPs and bytes                     roofline.dot_flops / dot_bytes
  smallest compute-bound batch B* ~ C/W_hbm       roofline.critical_batch
  the roof min(C, I W_hbm)                        roofline.attainable_flops
  tiled matmul bytes and intensity                roofline.tiled_matmul_bytes / tiled_matmul_intensity
  contraction split over chips (compute vs comm)  roofline.contraction_split_times / min_contraction_to_hide_comm
  systolic-array simulation, cycles B+D+F-2       chip_internals.systolic_matmul / systolic_cycles
  MXU padding efficiency, MXU share of the peak   chip_internals.mxu_padding_efficiency / mxu_peak_flops
  overlapped load/compute pipeline                chip_internals.pipelined_time
  hops, diameter, mean distance on a torus        topology.torus_hops / diameter / mean_hops
  slice wraparound, hosts, bisection              topology.slice_wraparound / slice_info / bisection_bandwidth
  point-to-point transfer time                    topology.transfer_time
  HBM / ICI / PCIe / DCN bandwidths of a chip     topology.bandwidth_hierarchy
  bytes per device of a collective (ring)         collectives.ring_bytes
  time of a collective (ring, torus, GPU switch)  collectives.collective_time
  collectives in a compiled program               hlo.collectives (Collective), hlo.total_bytes
  replica groups in any HLO syntax                hlo.parse_replica_groups
  XLA's FLOP count, cost_analysis as a dict       hlo.xla_flops, hlo.cost
  matmul FLOPs of a traced program (exact)        hlo.matmul_flops_traced
  memory_analysis as bytes per device             hlo.memory (MemoryUse)
  instructions of a compiled program, fusions     hlo.ops (Op) / fusions / count_fusions
  capture and parse a profiler trace              profiling.capture / load_trace (Trace)
  op table of a trace, by op, kind or device      profiling.Trace.summary (OpSummary)
  measured op time vs max(FLOPs/C, bytes/W)       profiling.compare_with_roofline
  predicted profile of one layer's training step  profiling.predict_layer_profile
  LLaMA-3 parameters, FLOPs/token, 6 N N_tok      models.TransformerConfig.num_params / training_flops
  FLOPs of any einsum (2 x every dimension once)  models.einsum_flops
  MoE total vs active parameters, all-to-alls     models.MoEConfig (MIXTRAL_8X7B)
  values a remat policy saves per layer           models.TransformerConfig.saved_values_per_layer_per_token
  one weight matrix per token (batched matmul)    roofline.batched_matmul_flops / batched_matmul_intensity
  the clock a chip's peak implies, MXU operation  chip_internals.implied_clock / mxu_operation
  batch to keep up with streamed weights          chip_internals.weight_stream_batch
  days and cost at an assumed MFU                 training.TrainingPlan.days_at / cost_at
  training memory, activations, KV cache bytes    models.TransformerConfig.training_memory / kv_cache_bytes
  bytes per element of a dtype                    units.dtype_bytes
  a table of results (Markdown and plain text)    tables.Table
  NamedSharding with clear errors, block shape    sharding.named_sharding / shard_shape
  collectives of a lowered program, abstract mesh  sharding.lowered_collectives / record_time
  collective matmul and its overlapped time       sharding.collective_matmul / collective_matmul_times
  draw an array's blocks by device, collectives   diagrams.sharded_array / collectives / ring
  draw a pipeline schedule                        diagrams.pipeline_schedule
  LLaMA-3 layer sharded for training and decode   sharding.layer_specs / layer_structs / layer_fn
  a multi-process run (jax.distributed) on CPU    multihost.run_local / worker
  collective latency, latency-bound buffer size   collectives.latency_steps / latency_bound_bytes
  decode critical batch B* = C s_w / 2 W_hbm      inference.decode_critical_batch
  attention FLOPs/bytes, fused vs naive           inference.attention_cost (AttentionCost)
  KV bytes per token (MHA/GQA/MQA, int8, shared)  inference.kv_bytes_per_token / kv_bytes_per_sequence
  paged vs reserved KV allocation                 inference.paged_kv_tokens (PagedUse)
  the batch that fits next to the weights         inference.fit_batch / check_fits / chips_to_fit
  decode and prefill step-time bounds             inference.decode_step_time / prefill_time (StepTime)
  latency-throughput curve                        inference.latency_throughput
  tensor-parallel decode times, ICI-bound degree  inference.tp_decode_times / ici_bound_tp_degree
  KV-cache sharding over heads then batch         inference.kv_cache_sharding (KVSharding)
  1D vs 2D weight-stationary MLP bytes            inference.weight_stationary_comm_bytes
  speculative decoding tokens/step, speed-up      inference.speculative_tokens_per_step / speculative_gain
  continuous vs static batching simulator         inference.simulate_serving (ServingStats)
  serving plan: slice, batch, bound, cost          serving.plan_serving (ServingPlan)
  candidate configs, Pareto front, cheapest       serving.candidate_plans / pareto_front / cheapest_plan
  sharded KV-cache decode on a mesh               llama.sharded_forward_with_cache / generate_greedy_sharded
  greedy speculative decoding with a draft        llama.speculative_generate / draft_from_layers
  DP / FSDP layer times, critical batch per chip  parallelism.dp_layer_times / fsdp_layer_times / data_parallel_critical_batch
  ZeRO-0..3 memory per chip, largest model        parallelism.training_memory_per_chip (ChipMemory) / largest_model_per_chip
  Megatron TP times, largest TP degree, heads     parallelism.tp_mlp_layer_times / max_tp_degree / max_tp_degree_layer / tp_attention_check
  FSDP x TP times, optimal split, critical batch  parallelism.fsdp_tp_layer_times / optimal_fsdp_degree / fsdp_tp_critical_batch
  pipeline bubble (P-1)/(vN_mb+P-1), schedules    parallelism.bubble_fraction / pipeline_schedule (Schedule)
  MoE capacity, drops, critical batch, a2a bytes  parallelism.moe_capacity / tokens_dropped / moe_critical_batch / moe_all_to_all_bytes
  ring attention block to hide the K/V permute    parallelism.ring_attention_min_block
  values kept per remat policy, PCIe offload time parallelism.mlp_saved_elements / offload_time
  DP across slices over DCN: tokens per slice     parallelism.dcn_critical_batch_per_slice
  chips, sharding, days, cost of a training run  training.plan_training (TrainingPlan) / search_plans
  a training step pass by pass, its parts, bound  training.evaluate_plan / TrainingPlan.breakdown
  MFU from throughput or reported GPU-hours      training.mfu_from_throughput / mfu_from_gpu_hours
  GPU peak = SMs x FLOPs/SM/clock x clock         chip_internals.sm_peak_flops / sm_vector_flops / implied_sm_clock
  output tiles in waves over the SMs              chip_internals.wave_quantization (Waves)
  all-reduce reduced in the NVSwitch (SHARP)      collectives.collective_time(..., sharp=True)
  a collective across GPU nodes, by phase         collectives.hierarchical_time / hierarchical_phases (Phase)
  MoE dispatch across nodes, node-limited or not  collectives.expert_all_to_all (ExpertAllToAll)
  fat-tree size, one rail-optimised unit          topology.fat_tree_endpoints / scalable_unit (ScalableUnit)
  DP tokens per shard across nodes, EP width F*   parallelism.hierarchical_dp_critical_batch / ep_critical_width
  MoE layer: dense reference, expert-parallel     frontier_mesh.moe_dense / moe_expert_parallel (ExpertParallelMoE)
  expert-parallel all-to-alls in compiled HLO     frontier_mesh.ExpertParallelMoE.all_to_alls (MoEAllToAlls)
  MLA decode absorbed or not, FLOPs and bytes     frontier_mesh.mla_decode / mla_decode_cost (DecodeCost)
  MLA cache, absorbed decode intensity            models.MLAConfig (DEEPSEEK_V3_MLA)
  DualPipe vs 1F1B fill and drain                 parallelism.dualpipe_bubble / one_f_one_b_bubble
  node-limited top-k, aux-loss-free balancing     parallelism.route_top_k / balance_router_bias
  fp8 with 1 x 128 and 128 x 128 scales           training.fp8_quantize
  MoE decode step and prefill per chip            inference.moe_decode_step / moe_prefill (MoEPrefill)
"""

from .mesh import make_mesh, setup

__version__ = "0.1.0"
__all__ = ["setup", "make_mesh", "__version__"]
