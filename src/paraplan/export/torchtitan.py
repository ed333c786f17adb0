"""torchtitan job config (TOML) for a paraplan plan.

The file is torchtitan's TOML job config (`JobConfig`, read by `--job.config_file` up to
torchtitan 0.2.x; field names checked against torchtitan 0.2.2's `config/job_config.py`).
torchtitan 0.3 reads Python `config_registry` functions plus `--section.field` overrides
instead of TOML; the header carries that command line, generated from the same values and
checked against torchtitan 0.3.0's `ConfigManager` (tests/test_export.py).

Mapping (paraplan -> torchtitan):
- DP: ZeRO-0 -> `data_parallel_replicate_degree` (DDP); ZeRO-2 -> FSDP2 with
  `fsdp_reshard_after_forward = "never"` (parameters stay gathered from forward to
  backward); ZeRO-3 -> FSDP2 `"always"`, HSDP as shard × replicate. torchtitan has no
  optimizer-only sharding (ZeRO-1). With CP>1 torchtitan always shards over dp_shard × CP
  (ParallelDims.fsdp_enabled), so ZeRO-0 with CP is refused. The expert mesh folds
  dp_shard × CP × TP into EP × ETP (never the replicate dimension) with ETP = 1 or TP.
- PP: `pipeline_parallel_layers_per_stage` = (layers + s) / (PP × VP) with s = 0, 1 or 2
  spare slots, `pipeline_parallel_last_stage_less_layers` = 1 if s ≥ 1 and
  `_first_stage_less_layers` = 1 if s = 2 (0 otherwise): torchtitan's own split
  (generate_llm_fqn_per_model_part) then builds exactly PP × VP stages with the loss's and
  the embedding's slot taken off the last and the first virtual stage, as paraplan lays them
  out (cost/chunks.py chunk_layers); with more spare slots, `module_fqns_per_model_part`
  names each virtual stage's modules as chunk_layers lays them out (0.3: comma-joined
  stages after `--parallelism.module_fqns_per_model_part`). torch's
  multi-stage schedules (Interleaved1F1B, LoopedBFS) need VP ≥ 2, Schedule1F1B at least PP
  micro-batches.
- FP8: the float8 linear converter, and for an MoE the grouped-GEMM one on the routed
  experts (`quantize.grouped_mm.float8`, which supports neither PP nor CP).
- Batch: with PP the local batch (global / DP) is split into micro-batches of
  `pipeline_parallel_microbatch_size`; without PP the local batch is one micro-batch and
  torchtitan accumulates global / (DP × micro-batch) of them.
- CP: ring (p2p) -> `context_parallel_rotate_method = "alltoall"` (PyTorch passes each K/V
  shard on with an all-to-all per ring step); allgather -> `"allgather"`. torchtitan has no
  Ulysses (a2a). torchtitan 0.3 has no rotate knob: PyTorch's default, all-gather.
- Recompute: `full` -> FullAC; `op-sac` -> torchtitan's per-op SAC (`mode = "selective"`,
  `selective_ac_option = "op"`: keeps every other matmul's and the attention kernel's outputs,
  recomputes the rest). torchtitan has no attention-core-only policy: `selective` is refused.
"""

from __future__ import annotations

import shlex
from dataclasses import replace

import numpy as np

from ..cost.chunks import chunk_layers
from ..cost.estimate import estimate
from ..plan.axes import V_SCHEDULES, AttentionKernel, CPCommType, GradCompression, RankOrder, Recompute, Schedule, ZeroStage
from ..plan.plan import Plan
from ..plan.space import PlanBatch, SpaceLimits, batch_shape, fsdp_shards
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Fp8Recipe, Precision, Workload
from ..errors import SpecError
from ..specs.engine import Engine, EngineSupport, check_model, refuse_model, unsupported
from .common import ExportResult, header_lines, nodes_and_gpus_per_node, slot_counted_split
from . import torchtitan_v03
from ..units import fmt_bytes
from .toml import toml_text

ENGINE = Engine.TORCHTITAN

# torch.distributed.pipelining's `get_schedule_class` names. ZBVZeroBubble is paraplan's ZB-V
# (torchtitan places its two stages per rank in a V, style "v"); InterleavedZeroBubble is
# multi-stage, where paraplan's ZB-H1 is one stage per rank.
SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B",
             Schedule.INTERLEAVED_1F1B: "Interleaved1F1B", Schedule.BREADTH_FIRST: "LoopedBFS",
             Schedule.ZERO_BUBBLE_V: "ZBVZeroBubble", Schedule.DUAL_PIPE_V: "DualPipeV"}
RECOMPUTE_MODES = {Recompute.NONE: "none", Recompute.OP_SAC: "selective", Recompute.FULL: "full"}
# paraplan preset -> (torchtitan model name: 0.2.2's train spec and 0.3's module, flavor, 0.3
# config_registry function or "" where 0.3 has none for the flavor); read off torchtitan
# 0.2.2 models/*/__init__.py and 0.3.0 models/*/config_registry.py; layers, width, heads,
# experts and top-k match the presets (tests/test_export_matrix.py checks them with 0.2.2)
MODELS = {
    "llama3-8b": ("llama3", "8B", "llama3_8b"), "llama3.1-8b": ("llama3", "8B", "llama3_8b"),
    "llama3-70b": ("llama3", "70B", "llama3_70b"), "llama3.1-70b": ("llama3", "70B", "llama3_70b"),
    "llama3.1-405b": ("llama3", "405B", "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "671B", "deepseek_v3_671b"), "deepseek-v2": ("deepseek_v3", "236B", ""),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B", "qwen3_30b_a3b"), "qwen3-235b-a22b": ("qwen3", "235B-A22B", ""),
    "gpt-oss-20b": ("gpt_oss", "20b", "gpt_oss_20b"), "gpt-oss-120b": ("gpt_oss", "120b", "gpt_oss_120b"),
    "llama4-scout": ("llama4", "17bx16e", ""), "llama4-maverick": ("llama4", "17bx128e", ""),
}
PRECISIONS = {Precision.BF16: "bfloat16"}
# parallelism.context_parallel_rotate_method (torchtitan 0.2)
CP_ROTATE = {CPCommType.P2P: "alltoall", CPCommType.ALL_GATHER: "allgather"}


def _mesh_rules(model: ModelSpec, workload: Workload) -> list:
    """(field, mask of plans torchtitan 0.2.2 cannot build over a PlanBatch, the field's value in
    a Plan, what torchtitan allows). The export check and the `--engine torchtitan` search
    (SpaceLimits.engine_rule) share them."""
    gbs = workload.global_batch_size
    zero0 = ZeroStage.NONE.code
    multi_stage = [Schedule.INTERLEAVED_1F1B.code, Schedule.BREADTH_FIRST.code] + [s.code for s in V_SCHEDULES]
    v_codes = [s.code for s in V_SCHEDULES]

    def zero(P):
        return str(P.zero)


    def shard(B):  # torchtitan's dp_shard: ZeRO-0 is DDP over data_parallel_replicate_degree
        return np.where(B.zero_code == zero0, 1, B.dp_shard)

    rules = [
        # models/llama3/infra/parallelize.py: "DDP has not supported > 1D parallelism"
        ("zero", lambda B: (B.zero_code == zero0) & (B.dp > 1) & (B.cp == 1) & (B.tp * B.pp > 1), zero,
         "2 or 3 when data parallelism combines with TP or PP (its DDP replicates over 1-D meshes only)"),
        # parallel_dims.py: fsdp = dp_shard·cp; parallelize applies FSDP2 whenever cp > 1, so
        # ZeRO-0 would shard parameters, gradients and optimizer over the CP ranks
        ("zero", lambda B: (B.zero_code == zero0) & (B.cp > 1), zero,
         "2 or 3 with CP>1 (it shards parameters over the CP ranks with FSDP2 even without data parallelism)"),
        # distributed/utils.py maybe_enable_amp: FSDP's mixed-precision policy, or autocast for
        # DDP and one device; TP or PP without FSDP train in fp32
        ("dp", lambda B: (B.tp * B.pp > 1) & ~fsdp_shards(B.zero_code, B.dp_shard, B.cp), lambda P: P.dp,
         "TP or PP only beside FSDP (a shard group of 2+ at ZeRO 2/3) or CP: without it torchtitan trains "
         "in fp32, not the plan's precision"),
        # distributed/pipeline_parallel.py: "Multi-stage schedule requires at least 2 stages per rank"
        ("vp", lambda B: (B.pp > 1) & np.isin(B.schedule_code, multi_stage) & (B.vp < 2), lambda P: P.vp,
         "VP >= 2 with Interleaved1F1B or LoopedBFS (torch's multi-stage schedules need 2+ stages per rank)"),
        # torch 2.13 _check_torch_compile_compatibility: ScheduleZBVZeroBubble and
        # ScheduleDualPipeV refuse stages that have used torch.compile (they split the backward)
        ("compiled", lambda B: (B.pp > 1) & np.isin(B.schedule_code, v_codes) & B.compiled,
         lambda P: P.compiled, "False with ZBVZeroBubble or DualPipeV (torch runs them on eager stages only: "
         "export --no-compile)"),
        # paraplan run on the same torch 2.13 parts: ZBVZeroBubble over FSDP2 that reshards after
        # forward left gradient norms 31% off the single process (benchmarks/run_kinds.py);
        # DualPipeV defers weight gradients the same way
        ("zero", lambda B: (B.pp > 1) & np.isin(B.schedule_code, v_codes)
         & (B.zero_code == ZeroStage.PARAMETERS.code) & (B.dp * B.cp > 1), zero,
         "0 or 2 with ZBVZeroBubble or DualPipeV (over FSDP2 resharding after forward, torch 2.13 loses the "
         "deferred weight gradients: seen in paraplan run)"),
        # torch.distributed.pipelining Schedule1F1B: "Number of microbatches ... must be greater
        # than or equal to the number of stages"
        ("micro-batches", lambda B: (B.pp > 1) & (B.schedule_code == Schedule.ONE_F_ONE_B.code)
         & (gbs // (B.dp * B.micro_batch_size) < B.pp), lambda P: gbs // (P.dp * P.micro_batch_size),
         "at least PP micro-batches per step under 1F1B (torch's Schedule1F1B): a smaller --mb or gpipe"),
        # its optimizers (torch.optim AdamW) step once on the accumulated gradients
        ("adam_accumulation", lambda B: B.adam_accumulation, lambda P: P.adam_accumulation,
         "no Adam accumulation (AdamA; torch.optim steps once on the accumulated gradients)"),
    ]
    if model.is_moe:
        rules += [
            # parallel_dims.py: "Currently we only support ETP=TP or ETP=1" (ep > 1); with ep = 1
            # the experts take the TP plan (llama4 apply_moe_ep_tp), i.e. ETP = TP
            ("etp", lambda B: ((B.ep > 1) & (B.etp != 1) & (B.etp != B.tp)) | ((B.ep == 1) & (B.etp != B.tp)),
             lambda P: P.etp,
             "1 or TP with EP>1, TP without EP (experts take the TP plan)"),
            # parallel_dims.py build_mesh: efsdp = dp_shard·cp·tp / (ep·etp), never dp_replicate
            ("ep", lambda B: (shard(B) * B.cp * B.tp) % (B.ep * B.etp) != 0, lambda P: P.ep,
             "EP×ETP dividing dp_shard×CP×TP (its expert mesh folds the FSDP shard group, CP and TP, "
             "never the DDP/HSDP replicas; ZeRO-0 has no shard group)"),
        ]
        if workload.precision is Precision.FP8:
            # components/quantization/float8.py Float8GroupedMMConverter asserts both
            rules.append(("pp×cp", lambda B: (B.pp > 1) | (B.cp > 1), lambda P: f"{P.pp}×{P.cp}",
                          "PP = CP = 1 for an FP8 MoE (quantize.grouped_mm.float8 supports neither)"))
    # FSDP2's reduce-scatter and DDP's all-reduce in the reduce dtype: torchtitan 0.3 registers
    # no comm hook and has no quantized gradient reduction
    rules.append(("grad_compression", lambda B: B.grad_compression_code != GradCompression.NONE.code,
                  lambda P: str(P.grad_compression), "none (no compressed gradient reduction: no DDP comm hook, "
                  "FSDP2 reduces in its reduce_dtype)"))
    return rules


def unbuildable(batch: PlanBatch, model: ModelSpec, workload: Workload) -> np.ndarray:
    """Mask of the plans torchtitan cannot build (SpaceLimits.engine_rule for its search)."""
    bad = np.zeros(batch_shape(batch), dtype=bool)
    for _, mask, _, _ in _mesh_rules(model, workload):
        bad = bad | mask(batch)
    return bad


def default_zero(plan: Plan) -> ZeroStage:
    """torchtitan's sharding when the config leaves it alone: data_parallel_shard_degree = -1
    (FSDP2 over every data-parallel rank) with fsdp_reshard_after_forward = "default", which
    apply_fsdp reads as reshard_after_forward = not pp_enabled: ZeRO-3 without a pipeline,
    ZeRO-2 (parameters kept gathered across micro-batches) with one."""
    return ZeroStage.PARAMETERS if plan.pp == 1 else ZeroStage.GRADIENTS


def model_refusal(model: ModelSpec) -> SpecError | None:
    """torchtitan builds a dense model of any size under its llama3 code (a flavor the user
    registers), but an MoE model only under its own name: one without one is refused."""
    if model.is_moe and model.name not in MODELS:
        moe = sorted(name for name, (tt, _, _) in MODELS.items() if tt != "llama3")
        return unsupported(ENGINE, "model", model.name, f"MoE models it has a model for ({', '.join(moe)}; "
                           "its llama3 code is dense)")
    return None


SUPPORT = EngineSupport(
    engine=ENGINE,
    limits=SpaceLimits(schedules=tuple(SCHEDULES), recomputes=tuple(RECOMPUTE_MODES),
                       zero_stages=(ZeroStage.NONE, ZeroStage.GRADIENTS, ZeroStage.PARAMETERS),
                       allow_offload=False, activation_offload=False, sequence_parallel=(True,),
                       cp_comm_types=tuple(CP_ROTATE),
                       hierarchical_a2a=False, ep_overlap=False, engine_rule=unbuildable,
                       rank_orders=(RankOrder.TP_CP_DP_PP,)),
    grad_reduce_fp32=True,        # FSDP2 MixedPrecisionPolicy(reduce_dtype=float32): the only choice
    checkpoint_early_stop=False,  # FullAC wraps blocks with early_stop=False
    tp_async_backward=False,      # DTensor TP does not overlap the backward reductions
    fsdp2_copies=True,            # data parallelism is FSDP2 fully_shard
    default_zero=default_zero,   # FSDP2 by default (see default_zero)
    model_refusal=model_refusal,
    fused_kernels=False,          # torchtitan's Llama: separate wq, wk, wv, w1, w3; eager SwiGLU and loss
    compiled=True,                # each block under torch.compile (compile.enable): async TP and float8 need it
    compiled_loss=True,           # and the loss: compile.components' default ["model", "loss"]
    loss_parallel=True,           # eager (--no-compile) over TP: loss_parallel / _LossParallelCrossEntropy
    autocast_without_fsdp=True)   # DDP or one GPU: torch.autocast (TP or PP without FSDP train in fp32: refused)


def check(plan: Plan, model: ModelSpec, workload: Workload) -> None:
    """Raise a one-line error for what torchtitan cannot express."""
    check_model(SUPPORT, model)
    if workload.precision not in PRECISIONS and workload.precision is not Precision.FP8:
        raise unsupported(ENGINE, "precision", str(workload.precision), "bf16 or fp8 (float8 converters)")
    if plan.low_precision_params:
        raise unsupported(ENGINE, "low_precision_params", True, "off (torchao's float8 keeps 16-bit weights and casts "
                          "them at each use; its float8 all-gather for FSDP2 is not modelled)")
    if workload.fp8_delayed:
        raise unsupported(ENGINE, "fp8_recipe", str(workload.fp8_recipe),
                          f"{Fp8Recipe.TENSORWISE} or {Fp8Recipe.ROWWISE} (torchao's float8 scales each tensor as it "
                          "comes: no delayed scaling)")
    if plan.pp > 1 and plan.schedule not in SCHEDULES:
        raise unsupported(ENGINE, "schedule", str(plan.schedule),
                          ", ".join(map(str, SCHEDULES)) + " (torch's ZB-H1-like schedule needs 2+ stages per rank)")
    if plan.recompute not in RECOMPUTE_MODES:
        raise unsupported(ENGINE, "recompute", str(plan.recompute), ", ".join(map(str, RECOMPUTE_MODES)))
    if plan.zero is ZeroStage.OPTIMIZER:
        raise unsupported(ENGINE, "zero", str(plan.zero), "0 (DDP), 2 (FSDP2 reshard never) or 3 (FSDP2 / HSDP)")
    if plan.attention is AttentionKernel.UNFUSED:
        # torchtitan's attention is SDPA or FlexAttention: no knob runs the unfused path
        raise unsupported(ENGINE, "attention", str(plan.attention), "flash2 or flash3 (SDPA / FlexAttention kernels)")
    one = PlanBatch.from_plans([plan])
    for name, mask, value, allowed in _mesh_rules(model, workload):
        if bool(mask(one)[0]):
            raise unsupported(ENGINE, name, value(plan), allowed)
    if plan.tp > 1 and not plan.sequence_parallel:
        raise unsupported(ENGINE, "sequence_parallel", False, "only sequence parallel with TP>1 (torchtitan 0.2)")
    if plan.offload_optimizer:
        raise unsupported(ENGINE, "offload_optimizer", True,
                          "no optimizer-only offload (training.enable_cpu_offload also moves parameters and gradients)")
    if plan.activation_offload_layers:
        raise unsupported(ENGINE, "activation_offload_layers", plan.activation_offload_layers,
                          "0 (torchtitan 0.2 offloads no activations; training.enable_cpu_offload moves the model states)")
    if plan.tp_overlap and not plan.compiled:
        raise unsupported(ENGINE, "compiled", False, "torch.compile with async TP (tp_overlap)")
    if not plan.dp_overlap:
        raise unsupported(ENGINE, "dp_overlap", False, "only overlapped data-parallel communication (FSDP2 prefetch)")
    if plan.cp > 1 and plan.cp_comm_type not in CP_ROTATE:
        raise unsupported(ENGINE, "cp_comm_type", str(plan.cp_comm_type), ", ".join(map(str, CP_ROTATE))
                          + " (context_parallel_rotate_method alltoall / allgather)")
    if plan.capacity_factor is not None:
        raise unsupported(ENGINE, "capacity_factor", plan.capacity_factor, "dropless MoE only")
    if plan.dp_outermost:
        raise unsupported(ENGINE, "rank_order", str(plan.rank_order),
                          f"{RankOrder.TP_CP_DP_PP} (the device mesh puts the pipeline outermost)")
    if plan.a2a_hierarchical:
        raise unsupported(ENGINE, "a2a_hierarchical", True, "the flat all-to-all only")
    if plan.ep_overlap:
        raise unsupported(ENGINE, "ep_overlap", True, "no overlap of the expert all-to-all with compute")


def module_fqns(model: ModelSpec, workload: Workload, plan: Plan) -> list[list[str]]:
    """torchtitan's `module_fqns_per_model_part`: per virtual stage (its stage index, in model
    order) the modules it holds, the embedding first and the final norm and head last, the
    names its own split uses (generate_llm_fqn_per_model_part)."""
    chunks = chunk_layers(model, workload, plan)
    return [(["tok_embeddings"] if j == 0 else []) + [f"layers.{i}" for i in r]
            + (["norm", "output"] if j == len(chunks) - 1 else []) for j, r in enumerate(chunks)]


def job_config(plan: Plan, model: ModelSpec, workload: Workload) -> dict:
    """The plan as torchtitan 0.2 JobConfig sections (section -> field -> value)."""
    check(plan, model, workload)
    local_batch = workload.global_batch_size // plan.dp
    if plan.zero is ZeroStage.NONE:
        shard, replicate, reshard = 1, plan.dp, "default"
    else:
        shard, replicate = plan.dp_shard, plan.dp // plan.dp_shard
        reshard = "never" if plan.zero is ZeroStage.GRADIENTS else "always"
    name, flavor, _ = MODELS.get(model.name, ("llama3", model.name, ""))
    model_t: dict = {"name": name, "flavor": flavor}
    quantize: dict = {}
    if workload.precision is Precision.FP8:
        model_t["converters"] = ["quantize.linear.float8"]
        if model.is_moe:  # the routed experts' grouped GEMMs (GroupedExperts is no nn.Linear)
            model_t["converters"].append("quantize.grouped_mm.float8")
            quantize["fqns"] = ["experts"]
    par: dict = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                 "fsdp_reshard_after_forward": reshard, "tensor_parallel_degree": plan.tp,
                 "enable_async_tensor_parallel": plan.tp_overlap,
                 "pipeline_parallel_degree": plan.pp, "context_parallel_degree": plan.cp,
                 "expert_parallel_degree": plan.ep, "expert_tensor_parallel_degree": plan.etp}
    if plan.cp > 1:
        par["context_parallel_rotate_method"] = CP_ROTATE[plan.cp_comm_type]
    if plan.pp > 1:
        par.update(pipeline_parallel_schedule=SCHEDULES[plan.schedule],
                   pipeline_parallel_microbatch_size=plan.micro_batch_size)
        split = slot_counted_split(model, plan)
        if split is not None:
            per_stage, first_less, last_less = split
            par.update(pipeline_parallel_layers_per_stage=per_stage,
                       pipeline_parallel_first_stage_less_layers=first_less,
                       pipeline_parallel_last_stage_less_layers=last_less)
        else:  # any other split: each virtual stage's modules by name, as the simulator lays them out
            par["module_fqns_per_model_part"] = module_fqns(model, workload, plan)
    ac: dict = {"mode": RECOMPUTE_MODES[plan.recompute]}
    if plan.recompute is Recompute.OP_SAC:
        ac["selective_ac_option"] = "op"
    cfg = {
        "job": {"description": f"paraplan {plan.describe()}"},
        "model": model_t,
        "training": {"local_batch_size": local_batch if plan.pp > 1 else plan.micro_batch_size,
                     "global_batch_size": workload.global_batch_size, "seq_len": workload.seq_len,
                     "mixed_precision_param": "bfloat16", "mixed_precision_reduce": "float32"},
        "parallelism": par,
        "activation_checkpoint": ac,
        # each TransformerBlock (async TP needs it), and the loss where the plan compiles it
        # (torchtitan's default components), as priced
        "compile": {"enable": plan.compiled, "components": ["model", "loss"] if plan.compiled_loss else ["model"]},
    }
    if quantize:
        cfg["quantize.grouped_mm.float8"] = quantize
    if workload.fp8_recipe is Fp8Recipe.ROWWISE:  # torchao's recipe by name (config Float8Linear.recipe_name)
        cfg["quantize.linear.float8"] = {"recipe_name": str(Fp8Recipe.ROWWISE)}
    return cfg


def cli_overrides_v03(cfg: dict, model: ModelSpec) -> list[str] | None:
    """The same config as torchtitan 0.3 `--module/--config` plus overrides (with the registry
    module export() writes beside it where no built-in one fits); None where 0.3 cannot say it."""
    launch = torchtitan_v03.launch(cfg, MODELS.get(model.name), model.name)
    return None if isinstance(launch, str) else launch.args


def v03_lines(cfg: dict, plan: Plan, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
              run: str) -> list[str]:
    """The header's torchtitan 0.3 part: its command line, and the registry module it names."""
    launch = torchtitan_v03.launch(cfg, MODELS.get(model.name), model.name)
    head = ["torchtitan 0.3 reads no TOML; the same settings as overrides:"]
    if isinstance(launch, str):
        return head + [f"  (not expressible in 0.3: {launch})"]
    if launch.ring_as_allgather:
        gather = estimate(model, cluster, workload, replace(plan, cp_comm_type=CPCommType.ALL_GATHER))
        head[0] = ("torchtitan 0.3 reads no TOML, and runs CP by K/V all-gather only (FlexAttention; no ring): "
                   f"this plan with --cp-comm allgather, predicted step {gather.step_time_s:.4g} s "
                   f"({fmt_bytes(gather.memory.total)} per GPU), as overrides:")
    head.append(f"  {run} {shlex.join(launch.args)}")
    if launch.module_source:
        head += [f"with this config_registry module saved as {torchtitan_v03.MODULE}.py on PYTHONPATH "
                 f"({launch.why}):", f"--- {torchtitan_v03.MODULE}.py ---",
                 *launch.module_source.splitlines(), "--- end ---"]
    return head


def export(plan: Plan, model: ModelSpec, cluster: ClusterSpec, workload: Workload, est=None,
           filename: str = "torchtitan.toml") -> ExportResult:
    """The TOML job config for torchtitan 0.2 and, in its header, torchtitan 0.3's command line;
    `filename` is the path the config is written to (-o), which the launch lines name."""
    refuse_model(SUPPORT, model)  # (check and job_config judge the mesh, for any model)
    cfg = job_config(plan, model, workload)
    nodes, per_node = nodes_and_gpus_per_node(plan, cluster)
    run = (f"torchrun --nnodes {nodes} --nproc-per-node {per_node} --rdzv-backend c10d "
           "--rdzv-endpoint $MASTER_ADDR:29500 -m torchtitan.train")
    launcher = f"{run} --job.config_file {shlex.quote(filename)}"
    head = header_lines(model, cluster, workload, plan, est) + [
        "torchtitan 0.2.x reads this file:", f"  {launcher}"] + v03_lines(cfg, plan, model, cluster, workload, run)
    notes = []
    if model.name not in MODELS:
        notes.append(f"model {model.name!r} has no torchtitan flavor: register one with its dimensions "
                     f"(layers {model.num_layers}, dim {model.hidden_size}, heads {model.num_heads}/{model.num_kv_heads}, "
                     f"ffn {model.ffn_hidden_size}, vocab {model.vocab_size})")
    if plan.recompute is Recompute.OP_SAC:
        notes.append("op-sac is torchtitan's per-op SAC (keeps every other matmul's and the attention kernel's "
                     "outputs)")
    notes.append("gradients are reduced in fp32 (FSDP2 mixed_precision_reduce); the prediction assumes the same")
    if plan.compiled:
        loss = "the loss too" if plan.compiled_loss else "the loss eager"
        notes.append(f"each block under torch.compile, {loss} (compile.components): the "
                     f"prediction prices the blocks' element-wise kernels at {cluster.gpu.compiled_elementwise_ratio:g} "
                     f"of their eager time ({cluster.gpu.name}'s compiled_elementwise_ratio; docs/model.md, "
                     "Compiled blocks)")
    text = "".join(f"# {line}".rstrip() + "\n" for line in head + notes) + "\n" + toml_text(cfg)
    return ExportResult(engine=ENGINE, plan=plan, filename=filename, text=text, launcher=launcher,
                        notes=tuple(notes))
