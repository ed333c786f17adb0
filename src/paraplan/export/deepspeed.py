"""DeepSpeed JSON config (and a `deepspeed` launcher line) for a plan.

Keys follow DeepSpeed's config documentation and `deepspeed/runtime/config.py` (0.19.8):
the tests load every exported config with DeepSpeed's own `DeepSpeedConfig`, which checks
train_batch_size = micro-batch × accumulation × world size, and run AutoEP's own checks on
it (`validate_autoep_config`, `build_folding_spec`, `validate_folding_global`, as
`DeepSpeedEngine._configure_expert_parallel` does). With AutoTP (TP>1) and no mpu, as
`deepspeed.initialize()` builds it for the launcher line here, that world size counts every
rank, TP ranks included (the TP group is made later, by the engine): the JSON then gives the
micro-batch and the accumulation steps only, and DeepSpeed derives its own train_batch_size
(global batch × TP, its sample count).

What the JSON can say: data parallelism with ZeRO 0–3, optimizer offload, precision,
AutoTP tensor parallelism (`tensor_parallel.autotp_size`, no sequence parallelism),
activation checkpointing, and expert parallelism for the Hugging Face MoE models AutoEP has
a preset for (`expert_parallel`: `autoep_size`, `preset_model`; module_inject/auto_ep_config.py):
AutoEP swaps each MoE block for a dropless expert-parallel one at `deepspeed.initialize()`.
AutoEP 0.19.8 allows no expert tensor parallelism (ETP = 1), and folds AutoTP into its
expert groups only with EP > 1 and without ZeRO offload (auto_ep_folding.py
validate_folding_global). Pipeline stages (`PipelineModule(num_stages=...)`) and Ulysses
sequence parallelism are chosen in the training script, not the JSON, so plans that use
them are refused rather than half-exported; so is expert parallelism for an MoE model
without an AutoEP preset (its experts would need deepspeed.moe.layer.MoE(ep_size=...) in the
model code, see `moe_layer_notes`). DeepSpeed 0.19 removed MiCS, so there is no HSDP shard
group either.
"""

from __future__ import annotations

import json
import shlex

import numpy as np

from ..plan.axes import AttentionKernel, GradCompression, RankOrder, Recompute, Schedule, ZeroStage
from ..plan.plan import Plan
from ..plan.space import PlanBatch, SpaceLimits, batch_shape
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision, Workload
from ..specs.engine import Engine, EngineSupport, check_model, unsupported
from .common import ExportResult, header_lines, nodes_and_gpus_per_node

ENGINE = Engine.DEEPSPEED

# paraplan preset -> DeepSpeed 0.19.8 AutoEP preset (module_inject/auto_ep_presets: the
# Hugging Face model types whose MoE blocks AutoEP knows how to replace)
AUTOEP_PRESETS = {"mixtral-8x7b": "mixtral", "mixtral-8x22b": "mixtral", "deepseek-v2": "deepseek_v2",
                  "deepseek-v3": "deepseek_v3", "qwen3-30b-a3b": "qwen3_moe", "qwen3-235b-a22b": "qwen3_moe"}


def _rules(model: ModelSpec) -> list:
    """(field, mask of the plans DeepSpeed cannot run over a PlanBatch, the field's value in a
    Plan, what DeepSpeed allows). The export check and the `--engine deepspeed` search
    (SpaceLimits.engine_rule) share them."""
    preset = AUTOEP_PRESETS.get(model.name)
    rules = [
        ("ep", lambda B: (B.ep > 1) & (preset is None), lambda P: P.ep,
         f"1 for {model.name} (AutoEP has presets for {', '.join(sorted(set(AUTOEP_PRESETS.values())))} "
         "only; other models set deepspeed.moe.layer.MoE(ep_size=...) in their code)"),
        # auto_ep_folding.py validate_folding_global: "expert_tensor_parallel_size ... not supported yet"
        ("etp", lambda B: B.etp != 1, lambda P: P.etp, "1 (AutoEP has no expert tensor parallelism yet)"),
        # auto_ep_folding.py build_folding_spec: the expert width tiles the stage (all ranks, PP = 1)
        ("ep", lambda B: (B.tp * B.dp * B.cp * B.pp) % B.ep != 0, lambda P: P.ep, "a divisor of the GPUs"),
        ("capacity_factor", lambda B: B.capacity_factor_value != 0.0, lambda P: P.capacity_factor,
         "dropless MoE only (AutoEP drops no tokens)"),
        # ZeRO++ qgZ is zero_optimization.zero_quantized_gradients (runtime/zero/config.py); PowerSGD
        # is a torch DDP comm hook, and 0.19.8 ships no 1-bit optimizer (runtime/config.py DEEPSPEED_OPTIMIZERS)
        ("grad_compression", lambda B: B.grad_compression_code == GradCompression.POWERSGD.code,
         lambda P: str(P.grad_compression), "none or int4 (ZeRO++ qgZ: zero_quantized_gradients)"),
        # its engine steps the optimizer once per gradient_accumulation_steps on the summed gradients
        ("adam_accumulation", lambda B: B.adam_accumulation, lambda P: P.adam_accumulation,
         "no Adam accumulation (AdamA; the engine steps once on the accumulated gradients)"),
    ]
    if model.is_moe:
        rules += [
            # "AutoEP+AutoTP folding requires expert_parallel.autoep_size > 1"; without AutoEP,
            # AutoTP has no plan for the routed experts
            ("ep", lambda B: (B.tp > 1) & (B.ep == 1), lambda P: P.ep,
             "EP > 1 with AutoTP on an MoE model (AutoEP+AutoTP folding)"),
            # "ZeRO optimizer/parameter offload with AutoEP+AutoTP folding is not validated yet"
            ("offload_optimizer", lambda B: (B.tp > 1) & (B.ep > 1) & B.offload_optimizer, lambda P: True,
             "no optimizer offload with AutoEP+AutoTP folding"),
        ]
    return rules


def unbuildable(batch: PlanBatch, model: ModelSpec, workload: Workload) -> np.ndarray:
    """Mask of the plans DeepSpeed cannot run (SpaceLimits.engine_rule for its search)."""
    bad = np.zeros(batch_shape(batch), dtype=bool)
    for _, mask, _, _ in _rules(model):
        bad = bad | mask(batch)
    return bad


SUPPORT = EngineSupport(
    engine=ENGINE,
    limits=SpaceLimits(max_cp=1, max_vp=1, schedules=(Schedule.ONE_F_ONE_B,), recomputes=(Recompute.NONE, Recompute.FULL),
                       sequence_parallel=(False,), tp_overlap=(False,), hybrid_shard=False,
                       hierarchical_a2a=False, ep_overlap=False, engine_rule=unbuildable,
                       rank_orders=(RankOrder.TP_CP_DP_PP,), activation_offload=False),
    grad_reduce_fp32=False,       # communication_data_type defaults to the model's 16-bit type
    checkpoint_early_stop=False,  # deepspeed.checkpointing re-runs the whole block
    tp_async_backward=False,
    fused_kernels=False,      # Hugging Face models (AutoTP): q_proj, k_proj, v_proj, gate_proj, up_proj apart
    pinned={"pp": 1, "cp": 1},
    # AutoEP+AutoTP folding runs MoE beside TP on tokens replicated over the TP lanes, but the
    # plan space (plan/space.py) prices MoE beside TP only with sequence parallelism
    pin_reason="its JSON sets no pipeline stages (PipelineModule in code) and no context parallelism, and "
               "paraplan prices an MoE model beside TP only with sequence parallelism, which AutoTP lacks: an MoE "
               "model runs data-parallel only, AutoEP spreading its experts, one sequence or more per GPU")


def check(plan: Plan, model: ModelSpec, workload: Workload) -> None:
    """Raise a one-line error for what a DeepSpeed JSON config cannot express."""
    check_model(SUPPORT, model)
    for name, allowed in (("pp", "1 in the JSON (pipeline stages are set by PipelineModule in code)"),
                          ("cp", "1 (Ulysses sequence parallelism is not ring context parallelism)")):
        if getattr(plan, name) != 1:
            raise unsupported(ENGINE, name, getattr(plan, name), allowed)
    one = PlanBatch.from_plans([plan])
    for name, mask, value, allowed in _rules(model):
        if bool(mask(one)[0]):
            raise unsupported(ENGINE, name, value(plan), allowed)
    if plan.ep_overlap or plan.a2a_hierarchical:
        raise unsupported(ENGINE, "ep_overlap" if plan.ep_overlap else "a2a_hierarchical", True,
                          "AutoEP's flat all-to-all, not overlapped with compute")
    if plan.tp > 1 and (plan.sequence_parallel or plan.tp_overlap):
        raise unsupported(ENGINE, "sequence_parallel" if plan.sequence_parallel else "tp_overlap", True,
                          "AutoTP tensor parallelism without sequence parallelism or TP overlap (use --no-sp)")
    if plan.recompute not in (Recompute.NONE, Recompute.FULL):
        raise unsupported(ENGINE, "recompute", str(plan.recompute),
                          "none or full (deepspeed.checkpointing around each layer)")
    if plan.activation_offload_layers:
        raise unsupported(ENGINE, "activation_offload_layers", plan.activation_offload_layers,
                          "0 (activation_checkpointing.cpu_checkpointing offloads the checkpoints of full "
                          "recomputation, not a layer's saved activations)")
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
    if plan.grad_compression is GradCompression.INT4:  # ZeRO++ qgZ (ZeRO-3: plan/rules.py gc_int4)
        zero["zero_quantized_gradients"] = True
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
    if plan.ep > 1:  # AutoEP: each MoE block swapped for a dropless one over EP ranks
        cfg["expert_parallel"] = {"enabled": True, "autoep_size": plan.ep, "expert_tensor_parallel_size": plan.etp,
                                  "preset_model": AUTOEP_PRESETS[model.name]}
    if plan.recompute is Recompute.FULL:
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False,
                                           "synchronize_checkpoint_boundary": False}
    return cfg


def moe_note(plan: Plan, model: ModelSpec) -> str:
    """How the experts are placed: AutoEP from the JSON, or every expert on every rank."""
    if plan.ep > 1:
        return (f"expert parallelism: AutoEP (expert_parallel in the JSON, preset {AUTOEP_PRESETS[model.name]!r}) "
                f"replaces each Hugging Face MoE block at deepspeed.initialize() with one holding "
                f"{model.num_experts // plan.ep} of the {model.num_experts} experts per rank, all-to-all over "
                f"{plan.ep} ranks; the training script loads the Hugging Face model and passes it unchanged. "
                "A model of your own instead builds each MoE layer as deepspeed.moe.layer.MoE(hidden_size, expert, "
                f"num_experts={model.num_experts}, ep_size={plan.ep}, k={model.top_k}, drop_tokens=False) "
                "(ep_size is model code there, not JSON), and its optimizer takes "
                "split_params_into_different_moe_groups_for_optimizer(param_groups)")
    return (f"every rank holds all {model.num_experts} experts (EP 1), sharded by ZeRO-{plan.zero} only; "
            "AutoEP (expert_parallel in the JSON) would spread them"
            + ("" if model.name in AUTOEP_PRESETS else f", but it has no preset for {model.name}"))


def export(plan: Plan, model: ModelSpec, cluster: ClusterSpec, workload: Workload, est=None,
           filename: str = "ds_config.json") -> ExportResult:
    cfg = config(plan, model, workload)
    nodes, per_node = nodes_and_gpus_per_node(plan, cluster)
    launcher = (f"deepspeed --num_nodes {nodes} --num_gpus {per_node} train.py "
                f"--deepspeed --deepspeed_config {shlex.quote(filename)}")
    notes = [" / ".join(header_lines(model, cluster, workload, plan, est))]
    if plan.tp > 1:
        notes.append(f"AutoTP: no train_batch_size in the JSON; DeepSpeed counts the {plan.tp} TP ranks as data "
                     f"parallel and reports {workload.global_batch_size * plan.tp}, the global batch is "
                     f"{workload.global_batch_size} (micro-batch × accumulation × DP {plan.dp})")
    if model.is_moe:
        notes.append(moe_note(plan, model))
    if plan.recompute is Recompute.FULL:
        notes.append("full recomputation: the training script wraps each layer in deepspeed.checkpointing.checkpoint "
                     "(or calls gradient_checkpointing_enable() on a Hugging Face model)")
    return ExportResult(engine=ENGINE, plan=plan, filename=filename, text=json.dumps(cfg, indent=2) + "\n",
                        launcher=launcher, notes=tuple(notes))
