"""DeepSpeed JSON config (and a `deepspeed` launcher line) for a plan.

Keys follow DeepSpeed's config documentation and `deepspeed/runtime/config.py` (0.19):
the tests load every exported config with DeepSpeed's own `DeepSpeedConfig`, which checks
train_batch_size = micro-batch × accumulation × world size, where it installs. With AutoTP
(TP>1) and no mpu, as `deepspeed.initialize()` builds it for the launcher line here, that
world size counts every rank, TP ranks included (the TP group is made later, by the
engine): the JSON then gives the micro-batch and the accumulation steps only, and
DeepSpeed derives its own train_batch_size (global batch × TP, its sample count).

What the JSON can say: data parallelism with ZeRO 0–3, optimizer offload, precision,
AutoTP tensor parallelism (`tensor_parallel.autotp_size`, no sequence parallelism) and
activation checkpointing. Pipeline stages (`PipelineModule(num_stages=...)`), expert
parallelism and Ulysses sequence parallelism are chosen in the training script, not the
JSON, so plans that use them are refused rather than half-exported. DeepSpeed 0.19
removed MiCS, so there is no HSDP shard group either.
"""

from __future__ import annotations

import json

from ..plan.axes import AttentionKernel, RankOrder, Recompute, Schedule, ZeroStage
from ..plan.plan import Plan
from ..plan.space import SpaceLimits
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision, Workload
from ..specs.engine import Engine, EngineSupport, check_model, unsupported
from .common import ExportResult, header_lines, nodes_and_gpus_per_node

ENGINE = Engine.DEEPSPEED

SUPPORT = EngineSupport(
    engine=ENGINE,
    limits=SpaceLimits(max_cp=1, max_vp=1, schedules=(Schedule.ONE_F_ONE_B,), recomputes=(Recompute.NONE, Recompute.FULL),
                       sequence_parallel=(False,), tp_overlap=(False,), hybrid_shard=False, max_ep=1,
                       rank_orders=(RankOrder.TP_CP_DP_PP,)),
    grad_reduce_fp32=False,       # communication_data_type defaults to the model's 16-bit type
    checkpoint_early_stop=False,  # deepspeed.checkpointing re-runs the whole block
    tp_async_backward=False,
    fused_kernels=False,      # Hugging Face models (AutoTP): q_proj, k_proj, v_proj, gate_proj, up_proj apart
    pinned={"pp": 1, "cp": 1},
    pin_reason="its JSON sets no pipeline stages, context or expert parallelism, and an MoE model takes AutoTP "
               "only with sequence parallelism, which AutoTP lacks: an MoE model runs data-parallel only")


def check(plan: Plan, model: ModelSpec, workload: Workload) -> None:
    """Raise a one-line error for what a DeepSpeed JSON config cannot express."""
    check_model(SUPPORT, model)
    for name, allowed in (("pp", "1 in the JSON (pipeline stages are set by PipelineModule in code)"),
                          ("cp", "1 (Ulysses sequence parallelism is not ring context parallelism)"),
                          ("ep", "1 in the JSON (expert parallelism is set by deepspeed.moe in code)"),
                          ("etp", "1")):
        if getattr(plan, name) != 1:
            raise unsupported(ENGINE, name, getattr(plan, name), allowed)
    if plan.tp > 1 and (plan.sequence_parallel or plan.tp_overlap):
        raise unsupported(ENGINE, "sequence_parallel" if plan.sequence_parallel else "tp_overlap", True,
                          "AutoTP tensor parallelism without sequence parallelism or TP overlap (use --no-sp)")
    if plan.recompute not in (Recompute.NONE, Recompute.FULL):
        raise unsupported(ENGINE, "recompute", str(plan.recompute),
                          "none or full (deepspeed.checkpointing around each layer)")
    if plan.zero is ZeroStage.PARAMETERS and plan.dp_shard != plan.dp:
        raise unsupported(ENGINE, "dp_shard", plan.dp_shard, f"dp_shard = DP = {plan.dp} (MiCS was removed in 0.19)")
    if plan.offload_optimizer and plan.zero is ZeroStage.NONE:
        raise unsupported(ENGINE, "offload_optimizer", True, "optimizer offload with ZeRO 1-3")
    if workload.precision not in (Precision.BF16, Precision.FP16):
        raise unsupported(ENGINE, "precision", str(workload.precision), "bf16 or fp16")
    if plan.attention is AttentionKernel.UNFUSED:
        raise unsupported(ENGINE, "attention", str(plan.attention), "flash2 or flash3 (the JSON names no attention "
                          "kernel; the training script's model picks it)")


def config(plan: Plan, model: ModelSpec, workload: Workload) -> dict:
    """The plan as a DeepSpeed config dict (JSON-ready)."""
    check(plan, model, workload)
    gas = workload.global_batch_size // (plan.dp * plan.micro_batch_size)
    zero: dict = {"stage": int(str(plan.zero)), "overlap_comm": plan.dp_overlap, "contiguous_gradients": True}
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    cfg: dict = {
        "train_batch_size": workload.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.micro_batch_size,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "communication_data_type": "fp32" if plan.grad_reduce_fp32 else
        ("fp16" if workload.precision is Precision.FP16 else "bf16"),
    }
    if workload.precision is Precision.FP16:
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    else:
        cfg["bf16"] = {"enabled": True}
    if plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
        # DeepSpeedConfig (no mpu) asserts train_batch_size = micro × accumulation × all ranks
        del cfg["train_batch_size"]
    if plan.recompute is Recompute.FULL:
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False,
                                           "synchronize_checkpoint_boundary": False}
    return cfg


def export(plan: Plan, model: ModelSpec, cluster: ClusterSpec, workload: Workload, est=None) -> ExportResult:
    cfg = config(plan, model, workload)
    nodes, per_node = nodes_and_gpus_per_node(plan, cluster)
    launcher = (f"deepspeed --num_nodes {nodes} --num_gpus {per_node} train.py "
                "--deepspeed --deepspeed_config ds_config.json")
    notes = [" / ".join(header_lines(model, cluster, workload, plan, est))]
    if plan.tp > 1:
        notes.append(f"AutoTP: no train_batch_size in the JSON; DeepSpeed counts the {plan.tp} TP ranks as data "
                     f"parallel and reports {workload.global_batch_size * plan.tp}, the global batch is "
                     f"{workload.global_batch_size} (micro-batch × accumulation × DP {plan.dp})")
    if plan.recompute is Recompute.FULL:
        notes.append("full recomputation: the training script wraps each layer in deepspeed.checkpointing.checkpoint "
                     "(or calls gradient_checkpointing_enable() on a Hugging Face model)")
    return ExportResult(engine=ENGINE, plan=plan, filename="ds_config.json", text=json.dumps(cfg, indent=2) + "\n",
                        launcher=launcher, notes=tuple(notes))
