"""Megatron-LM launch script (bash: torchrun pretrain_gpt.py with arguments) for a plan.

Argument names are Megatron-LM's `megatron/training/arguments.py` (core_r0.16); the tests
map them to their argparse destinations and build Megatron-Core's own TransformerConfig and
DistributedDataParallelConfig from them, as `core_transformer_config_from_args` does, so
Megatron-Core's validation runs on every exported plan where megatron-core is installed.

Mapping (paraplan -> Megatron-LM):
- ZeRO-0 -> DDP; ZeRO-1 -> `--use-distributed-optimizer`; ZeRO-2/3 -> Megatron-FSDP
  (`--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads[_params]`); HSDP ->
  `--num-distributed-optimizer-instances` = DP / shard group. Megatron-FSDP and optimizer
  offload both run on the distributed optimizer (`--use-distributed-optimizer`), offload with
  `--use-precision-aware-optimizer` so the fp32 main parameters leave the GPU too.
- Recompute: `selective` -> `--recompute-granularity selective` (the attention core,
  Korthikanti et al.); `full` -> `full`, `uniform`, 1 layer per checkpoint; `first_k` ->
  `full`, `block`, k / VP layers per model chunk (Megatron counts per virtual stage);
  `modules` -> `selective` with `--recompute-modules layernorm` (+ `moe_act` for MoE,
  `mla_up_proj` for MLA, `core_attn` only for unfused attention); Megatron-Core refuses
  moe_act/layernorm recomputation under delayed scaling, so a delayed-scaling plan with it is
  refused in one line.
- FP8: `--fp8-format hybrid` with `--fp8-recipe tensorwise` (current scaling) or `delayed`,
  the workload's recipe (Workload.fp8_recipe; delayed scaling's amax all-reduces are priced).
- Schedules: 1F1B, and interleaved 1F1B via `--num-layers-per-virtual-pipeline-stage`.
- Multi-token prediction: `--mtp-num-layers D`, the modules on the last stage (an 'm' each in
  a layout string).
- Layers per virtual stage (`pipeline_args`): as the cost model and the simulator lay them out
  (cost/chunks.py chunk_layers). Equal chunks as they are; one or two spare slots as
  `--account-for-loss-in-pipeline-split` (and `--account-for-embedding-in-pipeline-split`),
  as Megatron-Bridge's Llama 3.1 405B recipe runs its 126 layers; any other split as
  `--pipeline-model-parallel-layout`, one `E`/`t`/`L` string per virtual stage (Megatron-Core
  PipelineParallelLayerLayout; Megatron-Bridge's DeepSeek-V3 recipes lay out its 61 layers so).
- CP: `--cp-comm-type` p2p (ring), all_gather or a2a (Ulysses), Transformer Engine's names.
- MoE dispatch: the flat all-to-all -> `--moe-token-dispatcher-type alltoall`; the deduplicating
  one (`a2a_hierarchical`) -> `flex` with `--moe-flex-dispatcher-backend deepep` (DeepEP must be
  installed; Megatron-Bridge takes HybridEP on GB200/GB300 NVL72, the same traffic); DeepSeek's
  group-limited routing -> `--moe-router-num-groups G --moe-router-group-topk M`.
- Activation offload: `--cpu-offloading-num-layers k` (Megatron-Core's layer-level CPU
  offloading), which runs with one pipeline stage, no recomputation and k below the model's
  layers only.
"""

from __future__ import annotations

import itertools
import shlex
import numpy as np

from ..cost.chunks import chunk_layers
from ..cost.low_precision import LOW_PRECISIONS
from ..cost.moe import shared_expert_overlap
from ..plan.axes import (AttentionKernel, CPCommType, GradCompression, RankOrder, Recompute, RecomputeOp, RecomputeOps,
                         Schedule, ZeroStage)
from ..plan.plan import Plan
from ..plan.space import SpaceLimits
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Fp8Recipe, Precision, Workload
from ..specs.engine import Engine, EngineSupport, unsupported
from .common import ExportResult, header_lines, nodes_and_gpus_per_node, slot_counted_split

ENGINE = Engine.MEGATRON
# Megatron's --attention-backend: TE's flash-attn path, TE's cuDNN fused attention, unfused.
ATTENTION = {AttentionKernel.FLASH2: "flash", AttentionKernel.FLASH3: "fused", AttentionKernel.UNFUSED: "unfused"}
FSDP_STRATEGY = {ZeroStage.GRADIENTS: "optim_grads", ZeroStage.PARAMETERS: "optim_grads_params"}
# --cp-comm-type: Transformer Engine's names (p2p, all_gather, a2a, a2a+p2p; TE 2.x
# attention/dot_product_attention/context_parallel.py raises on any other)
CP_COMM = {CPCommType.P2P: "p2p", CPCommType.ALL_GATHER: "all_gather", CPCommType.A2A: "a2a"}

def _tp_pp_dp_mapping_refused(plan) -> object:
    """Megatron-LM's validate_args: --use-tp-pp-dp-mapping asserts "context_parallel and
    expert_model_parallel can't be used with tp-pp-dp mapping" (CP·EP ≤ 1). Vectorized."""
    return ((np.asarray(plan.rank_order_code) == RankOrder.TP_CP_PP_DP.code) & (np.asarray(plan.pp) > 1)
            & (np.asarray(plan.cp) * np.asarray(plan.ep) > 1))


def _ep_overlap_mtp_refused(plan, model: ModelSpec) -> object:
    """Megatron-Core's TransformerConfig with --overlap-moe-expert-parallel-comm: "MTP layernum
    only supports 1" and, with it, "Pipeline model parallel size must be larger than 1"
    (core 0.16.1 transformer_config.py). Vectorized."""
    overlap = np.asarray(plan.ep_overlap, dtype=bool)
    return overlap & ((model.mtp_layers > 1) | ((model.mtp_layers == 1) & (np.asarray(plan.pp) == 1)))


def _offload_refused(plan) -> object:
    """--optimizer-cpu-offload runs on the distributed optimizer (ZeRO-1) only (check). Vectorized."""
    return np.asarray(plan.offload_optimizer, dtype=bool) & (np.asarray(plan.zero_code) != ZeroStage.OPTIMIZER.code)


def _activation_offload_refused(plan, model: ModelSpec) -> object:
    """Megatron-Core's layer-level CPU offloading (--cpu-offloading-num-layers) refuses a
    pipeline, recomputation and the model's every layer (core 0.16.1 transformer_config.py:
    "no support for Pipeline parallelism with CPU offloading", "does not work when activation
    recomputation is enabled", "only for layers less than num_layers"). Vectorized."""
    j = np.asarray(plan.activation_offload_layers)
    return (j > 0) & ((np.asarray(plan.pp) > 1) | (np.asarray(plan.recompute_code) != Recompute.NONE.code)
                      | (j >= model.num_layers))


def _grad_compression_refused(plan) -> object:
    """Megatron-Core's DDP reduces in the gradient buffer's dtype (bf16, or fp32 with
    --accumulate-allreduce-grads-in-fp32): no quantized or low-rank gradient reduction. Vectorized."""
    return np.asarray(plan.grad_compression_code) != GradCompression.NONE.code


def _delayed_modules_refused(plan, workload: Workload) -> object:
    """Megatron-Core refuses moe_act/layernorm recomputation under FP8 delayed scaling. Vectorized."""
    return workload.fp8_delayed & (np.asarray(plan.recompute_code) == Recompute.MODULES.code)


def _low_precision_params_refused(plan) -> object:
    """--fp8-param-gather needs the distributed optimizer (validate_args). Vectorized."""
    return np.asarray(plan.low_precision_params, dtype=bool) & (np.asarray(plan.zero_code) == ZeroStage.NONE.code)


def _low_precision_offload_refused(plan, workload: Workload) -> object:
    """--fp8-param-gather with --optimizer-cpu-offload needs --fp8-recipe delayed (validate_args). Vectorized."""
    fp8_not_delayed = workload.precision is Precision.FP8 and not workload.fp8_delayed
    return (np.asarray(plan.low_precision_params, dtype=bool) & np.asarray(plan.offload_optimizer, dtype=bool)
            & fp8_not_delayed)


SUPPORT = EngineSupport(
    engine=ENGINE,
    # uneven splits too: the export writes the chunks the cost model lays out (pipeline_args)
    # (a searched set of ops is exported where pinned and --recompute-modules expresses it)
    limits=SpaceLimits(schedules=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B),
                       recomputes=tuple(r for r in Recompute if r is not Recompute.SET),
                       engine_rule=lambda batch, model, workload: (_tp_pp_dp_mapping_refused(batch)
                                                                   | _offload_refused(batch)
                                                                   | _grad_compression_refused(batch)
                                                                   | _low_precision_params_refused(batch)
                                                                   | _delayed_modules_refused(batch, workload)
                                                                   | _low_precision_offload_refused(batch, workload)
                                                                   | np.asarray(batch.adam_accumulation, dtype=bool)
                                                                   | _ep_overlap_mtp_refused(batch, model)
                                                                   | _activation_offload_refused(batch, model))),
    grad_reduce_fp32=True,        # bf16: validate_args sets accumulate_allreduce_grads_in_fp32; fp16: the flag
    checkpoint_early_stop=False,  # Megatron's checkpoint re-runs the whole layer
    tp_async_backward=True,       # Megatron-Core overlaps backward TP reductions with wgrad GEMMs
    trains_mtp=True)              # --mtp-num-layers


# Recompute.SET's sets Megatron-Core's --recompute-modules express (a dense layer under
# Transformer Engine, whose MLP module is LayerNormMLP: checkpointing "mlp" keeps its input,
# the residual, and re-runs the norm, the up-projection and the activation; "core_attn"
# re-runs the attention core, which keeps only the unfused scores)
MEGATRON_MODULES = {"mlp": RecomputeOps([RecomputeOp.LN2, RecomputeOp.UP, RecomputeOp.ACT]),
                    "core_attn": RecomputeOps([RecomputeOp.SCORES])}


def recompute_modules(ops: RecomputeOps) -> list[str] | None:
    """The --recompute-modules that drop exactly `ops`, or None where no union of modules does."""
    for n in range(1, len(MEGATRON_MODULES) + 1):
        for names in itertools.combinations(MEGATRON_MODULES, n):
            if frozenset().union(*(MEGATRON_MODULES[x] for x in names)) == ops:
                return sorted(names)
    return None


def check(plan: Plan, model: ModelSpec, workload: Workload) -> None:
    """Raise a one-line error for what Megatron-LM cannot express."""
    if plan.pp > 1 and plan.schedule not in (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B):
        raise unsupported(ENGINE, "schedule", str(plan.schedule), "1f1b or interleaved (VP>1)")
    if plan.recompute is Recompute.FIRST_K and plan.recompute_num_layers % plan.vp:
        raise unsupported(ENGINE, "recompute_num_layers", plan.recompute_num_layers,
                          f"a multiple of VP={plan.vp} (--recompute-num-layers counts per virtual stage)")
    if plan.recompute is Recompute.SET and recompute_modules(plan.recompute_ops) is None:
        raise unsupported(ENGINE, "recompute_ops", str(plan.recompute_ops),
                          "ln2,up,act (--recompute-modules mlp), scores (core_attn) or both")
    if bool(_offload_refused(plan)):
        raise unsupported(ENGINE, "offload_optimizer", True, "optimizer offload with zero=1 "
                          "(--optimizer-cpu-offload needs the distributed optimizer)")
    if bool(_grad_compression_refused(plan)):
        raise unsupported(ENGINE, "grad_compression", str(plan.grad_compression),
                          "none (its DDP reduces bf16 or fp32 gradients; no compressed reduction)")
    if plan.adam_accumulation:
        raise unsupported(ENGINE, "adam_accumulation", True, "no Adam accumulation (AdamA; its optimizer "
                          "steps once on the main_grad buffers accumulated over the micro-batches)")
    if bool(_ep_overlap_mtp_refused(plan, model)):
        raise unsupported(ENGINE, "ep_overlap", True, f"EP overlap with {model.mtp_layers} MTP layer(s) only for "
                          "1 MTP layer and PP > 1 (Megatron-Core's --overlap-moe-expert-parallel-comm)")
    if bool(_activation_offload_refused(plan, model)):
        raise unsupported(ENGINE, "activation_offload_layers", plan.activation_offload_layers,
                          f"1 to {model.num_layers - 1} with PP=1 and recompute none (Megatron-Core's "
                          "--cpu-offloading-num-layers: no pipeline, no recomputation, fewer than all layers)")
    if bool(_tp_pp_dp_mapping_refused(plan)):
        raise unsupported(ENGINE, "rank_order", str(plan.rank_order),
                          f"{RankOrder.TP_CP_DP_PP} with CP or EP > 1 (--use-tp-pp-dp-mapping asserts CP·EP ≤ 1)")
    if workload.precision not in (Precision.BF16, Precision.FP16, Precision.FP8):
        raise unsupported(ENGINE, "precision", str(workload.precision), "bf16, fp16 or fp8 (--bf16 / --fp16 / --fp8-format)")
    if workload.fp8_recipe is Fp8Recipe.ROWWISE:
        raise unsupported(ENGINE, "fp8_recipe", str(workload.fp8_recipe),
                          f"{Fp8Recipe.TENSORWISE} or {Fp8Recipe.DELAYED} (--fp8-recipe delayed, tensorwise, mxfp8 or "
                          "blockwise: no row-wise)")
    if bool(_delayed_modules_refused(plan, workload)):
        raise unsupported(ENGINE, "recompute", str(plan.recompute), "none, selective, full or first_k under FP8 "
                          "delayed scaling (Megatron-Core refuses moe_act/layernorm recomputation with --fp8-recipe "
                          "delayed; --fp8-recipe tensorwise runs modules)")
    if bool(_low_precision_params_refused(plan)):
        raise unsupported(ENGINE, "zero", str(plan.zero), "1 or more with low-precision parameters (validate_args: "
                          "--fp8-param-gather only with the distributed optimizer or FSDP)")
    if bool(_low_precision_offload_refused(plan, workload)):
        raise unsupported(ENGINE, "offload_optimizer", True, "no optimizer offload with low-precision parameters under "
                          f"{workload.fp8_recipe} scaling (validate_args: --fp8-param-gather with "
                          "--optimizer-cpu-offload needs --fp8-recipe delayed)")
    if plan.attention not in ATTENTION:  # pragma: no cover - closed enum
        raise unsupported(ENGINE, "attention", str(plan.attention), ", ".join(map(str, ATTENTION)))


def layout_string(counts: list[int], mtp: int = 0) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for `counts[j]` decoder layers on
    virtual stage j (rank j % PP, chunk j // PP, the order PipelineParallelLayerLayout
    reads): stages split by '|', the embedding 'E' first, the `mtp` multi-token-prediction
    modules 'm' and the loss 'L' last, runs written 't*n' and repeated stages '(...|)*r' (its
    parse_str_to_list unrolls both)."""
    n = len(counts)
    run = lambda x, c: x if c == 1 else f"{x}*{c}" if c else ""  # noqa: E731
    stages = [("E" if j == 0 else "") + run("t", c) + (run("m", mtp) + "L" if j == n - 1 else "")
              for j, c in enumerate(counts)]
    groups = [(x, len(list(g))) for x, g in itertools.groupby(stages)]
    out = []
    for i, (x, r) in enumerate(groups):
        last = i == len(groups) - 1
        reps = r - 1 if last else r
        if reps > 1:
            out.append(f"({x}|)*{reps}")
        elif reps == 1:
            out.append(x + "|")
        if last:
            out.append(x)
    return "".join(out)


def pipeline_args(model: ModelSpec, workload: Workload, plan: Plan) -> list:
    """The flags that place the layers on the virtual stages as the cost model lays them out
    (chunk_layers): equal chunks through --num-layers-per-virtual-pipeline-stage; the
    embedding's and the loss's spare slots through Megatron-Core's account-for flags, which
    take a layer off the first and the last chunk (transformer_block.get_num_layers_to_build);
    anything else as a layout string."""
    # (Megatron-Core builds the MTP modules on the last stage, beside its layers)
    mtp = ["--mtp-num-layers", model.mtp_layers] if model.mtp_layers else []
    if plan.pp == 1:
        return mtp
    split = slot_counted_split(model, plan)
    if split is not None:
        per_chunk, embedding, loss = split
        return ((["--account-for-embedding-in-pipeline-split"] if embedding else [])
                + (["--account-for-loss-in-pipeline-split"] if loss else [])
                + (["--num-layers-per-virtual-pipeline-stage", per_chunk] if plan.vp > 1 else []) + mtp)
    # (the MTP modules take their slots in the layout: 'm', Megatron-Bridge's DeepSeek-V3 recipes)
    counts = [len(r) for r in chunk_layers(model, workload, plan)]
    return ["--pipeline-model-parallel-layout", layout_string(counts, model.mtp_layers)] + mtp


def _rope_args(model: ModelSpec) -> list:
    """The model's RoPE base (--rotary-base takes an integer; Megatron's default is 10,000) and
    Llama 3.1's frequency scaling (--use-rope-scaling fixes its low/high factors 1 and 4 and
    8,192 original positions, as the model's config.json has them)."""
    a = []
    if model.rope_theta:
        if model.rope_theta != int(model.rope_theta):
            raise unsupported(ENGINE, "rope_theta", model.rope_theta, "an integer RoPE base (--rotary-base)")
        a += ["--rotary-base", int(model.rope_theta)]
    if model.rope_llama3_scaling_factor:
        a += ["--use-rope-scaling", "--rope-scaling-factor", model.rope_llama3_scaling_factor]
    return a


def _model_args(model: ModelSpec, workload: Workload) -> list[str]:
    a = ["--num-layers", model.num_layers, "--hidden-size", model.hidden_size,
         "--ffn-hidden-size", model.ffn_hidden_size, "--num-attention-heads", model.num_heads,
         "--seq-length", workload.seq_len, "--max-position-embeddings", max(workload.seq_len, model.max_seq_len),
         "--position-embedding-type", "rope", *_rope_args(model), "--normalization", "RMSNorm", "--disable-bias-linear",
         "--attention-dropout", 0.0, "--hidden-dropout", 0.0,
         "--tokenizer-type", "NullTokenizer", "--vocab-size", model.vocab_size]
    if model.head_dim * model.num_heads != model.hidden_size:
        a += ["--kv-channels", model.head_dim]
    if model.num_kv_heads != model.num_heads:
        a += ["--group-query-attention", "--num-query-groups", model.num_kv_heads]
    if model.gated_mlp:
        a.append("--swiglu")
    if not model.tied_embeddings:
        a.append("--untie-embeddings-and-output-weights")
    if model.is_mla:
        a += ["--multi-latent-attention", "--kv-lora-rank", model.kv_lora_rank,
              "--qk-head-dim", model.head_dim - model.qk_rope_head_dim,
              "--qk-pos-emb-head-dim", model.qk_rope_head_dim, "--v-head-dim", model.v_head_dim or model.head_dim]
        if model.q_lora_rank:
            a += ["--q-lora-rank", model.q_lora_rank]
    if model.is_moe:
        dense = model.num_dense_layers
        freq = [0] * dense + [int(j % model.moe_layer_interval == model.moe_layer_interval - 1)
                              for j in range(model.num_layers - dense)]
        a += ["--num-experts", model.num_experts, "--moe-router-topk", model.top_k,
              "--moe-ffn-hidden-size", model.moe_ffn_hidden_size, "--moe-layer-freq", str(freq).replace(" ", ""),
              "--moe-grouped-gemm"]
        if model.shared_expert_ffn_hidden_size:
            a += ["--moe-shared-expert-intermediate-size", model.shared_expert_ffn_hidden_size]
        if model.group_limited:  # DeepSeek's group-limited routing (ModelSpec.expert_groups)
            a += ["--moe-router-num-groups", model.expert_groups, "--moe-router-group-topk", model.group_top_k]
    return a


def _dispatch_args(plan: Plan) -> list[str]:
    """The MoE dispatcher: the flex dispatcher's DeepEP backend for the deduplicating dispatch
    paraplan prices (plan.a2a_hierarchical), else the alltoall dispatcher's flat all-to-all."""
    return (["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
            if plan.a2a_hierarchical else ["--moe-token-dispatcher-type", "alltoall"])


def arguments(plan: Plan, model: ModelSpec, workload: Workload) -> list[str]:
    """pretrain_gpt.py arguments for the model, workload and plan (strings)."""
    check(plan, model, workload)
    a = _model_args(model, workload)
    a += ["--tensor-model-parallel-size", plan.tp, "--pipeline-model-parallel-size", plan.pp,
          "--context-parallel-size", plan.cp, "--micro-batch-size", plan.micro_batch_size,
          "--global-batch-size", workload.global_batch_size]
    a += pipeline_args(model, workload, plan)
    if plan.cp > 1:
        a += ["--cp-comm-type", CP_COMM[plan.cp_comm_type]]
    if plan.rank_order is RankOrder.TP_CP_PP_DP and plan.pp > 1:
        a.append("--use-tp-pp-dp-mapping")  # rank order tp-cp-ep-pp-dp: data parallelism outermost
    if plan.sequence_parallel:
        a.append("--sequence-parallel")
    if plan.tp_overlap:
        a.append("--tp-comm-overlap")
    if model.is_moe:
        a += ["--expert-model-parallel-size", plan.ep, "--expert-tensor-parallel-size", plan.etp]
        a += _dispatch_args(plan)
        if plan.capacity_factor is not None:
            a += ["--moe-expert-capacity-factor", plan.capacity_factor, "--moe-pad-expert-input-to-capacity"]
        if plan.ep_overlap:
            a.append("--overlap-moe-expert-parallel-comm")
        if bool(shared_expert_overlap(model, plan)):  # as paraplan prices it (cost/moe.py)
            a.append("--moe-shared-expert-overlap")
        # the permutation as paraplan prices Megatron's, fused (Transformer Engine's permute
        # kernels; Megatron-Core's default is the unfused scatter path)
        a.append("--moe-permute-fusion")
        if workload.precision in LOW_PRECISIONS and plan.capacity_factor is None:
            # dropless FP8 (the export refuses NVFP4): the router pads each expert's rows to the
            # quantized GEMM's alignment, so Transformer Engine copies none to pad them
            # (experts.py Fp8Padding), which paraplan does not price
            a.append("--moe-router-padding-for-quantization")
    if plan.recompute is Recompute.SELECTIVE:
        a += ["--recompute-granularity", "selective"]
    elif plan.recompute is Recompute.MODULES:
        a += ["--recompute-granularity", "selective", "--recompute-modules"]
        a += (["core_attn"] if plan.attention is AttentionKernel.UNFUSED else []) + ["layernorm"]
        a += (["moe_act"] if model.is_moe else []) + (["mla_up_proj"] if model.is_mla else [])
    elif plan.recompute is Recompute.SET:
        a += ["--recompute-granularity", "selective", "--recompute-modules"] + recompute_modules(plan.recompute_ops)
    elif plan.recompute is Recompute.FULL:
        a += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", 1]
    elif plan.recompute is Recompute.FIRST_K:
        a += ["--recompute-granularity", "full", "--recompute-method", "block",
              "--recompute-num-layers", plan.recompute_num_layers // plan.vp]
    if plan.activation_offload_layers:
        a += ["--cpu-offloading-num-layers", plan.activation_offload_layers]
    if plan.zero is ZeroStage.OPTIMIZER:
        a.append("--use-distributed-optimizer")
    elif plan.zero in FSDP_STRATEGY:
        # Megatron-FSDP reduce-scatters gradients only with the distributed optimizer (its
        # DistributedDataParallelConfig.use_distributed_optimizer; all-reduce otherwise)
        # and checkpoints only in its own format (validate_args: "Megatron FSDP only supports
        # fsdp_dtensor checkpoint format")
        a += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", FSDP_STRATEGY[plan.zero],
              "--use-distributed-optimizer", "--ckpt-format", "fsdp_dtensor"]
    if plan.zero is not ZeroStage.NONE and plan.dp_shard != plan.dp:
        a += ["--num-distributed-optimizer-instances", plan.dp // plan.dp_shard]
    if plan.dp_overlap:
        a.append("--overlap-grad-reduce")
        if plan.zero is not ZeroStage.NONE:
            a.append("--overlap-param-gather")
    if plan.offload_optimizer:
        # without the precision-aware optimizer the distributed optimizer keeps its fp32 main
        # parameters on the GPU (Megatron-Core distrib_optimizer.py); with it the
        # HybridDeviceOptimizer holds them on the host with the moments
        a += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", 1.0, "--use-precision-aware-optimizer"]
    if workload.precision is Precision.FP16:
        # Megatron-LM reduces in fp32 by default for bf16 only; the plan reduces in fp32 (SUPPORT)
        a += ["--fp16", "--accumulate-allreduce-grads-in-fp32"]
    else:
        a.append("--bf16")
        if workload.precision is Precision.FP8:
            a += ["--fp8-format", "hybrid", "--fp8-recipe", str(workload.fp8_recipe)]
            if plan.low_precision_params:
                a.append("--fp8-param-gather")  # FP8 weights, gathered in FP8 (Plan.low_precision_params)
    a += ["--attention-backend", ATTENTION[plan.attention]]
    return [str(x) for x in a]


def environment(plan: Plan) -> list[str]:
    """The shell lines that set what Megatron-LM's validate_args requires of the environment:
    before Blackwell, TP or CP asks CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue, so
    that each TP/CP collective is scheduled ahead of the GEMM it overlaps), except beside
    Megatron-FSDP, which asserts it is not 1, or the expert all-to-all overlap, which wants
    more queues and only warns."""
    if plan.zero in FSDP_STRATEGY:
        return ["unset CUDA_DEVICE_MAX_CONNECTIONS  # Megatron-FSDP asserts it is not 1"]
    if (plan.tp > 1 or plan.cp > 1) and not plan.ep_overlap:
        return ["export CUDA_DEVICE_MAX_CONNECTIONS=1  # TP/CP on Hopper and earlier (validate_args)"]
    return []


def export(plan: Plan, model: ModelSpec, cluster: ClusterSpec, workload: Workload, est=None,
           filename: str = "megatron.sh") -> ExportResult:
    args = arguments(plan, model, workload)
    nodes, per_node = nodes_and_gpus_per_node(plan, cluster)
    lines = ["#!/usr/bin/env bash"] + [f"# {x}" for x in header_lines(model, cluster, workload, plan, est)] + [
        "# A throughput benchmark: mock data (--mock-data) and a fixed learning rate for TRAIN_ITERS steps.",
        "# To train, replace --mock-data with --data-path and a tokenizer, and set the learning-rate schedule.",
        "# Run from a Megatron-LM checkout; set MASTER_ADDR and NODE_RANK on every node.",
        "set -euo pipefail", *environment(plan),
        f"GPUS_PER_NODE={per_node}", f"NNODES={nodes}",
        "DISTRIBUTED_ARGS=(--nproc-per-node $GPUS_PER_NODE --nnodes $NNODES --node-rank ${NODE_RANK:-0} "
        "--master-addr ${MASTER_ADDR:-localhost} --master-port 6000)",
        "PARAPLAN_ARGS=("]
    # one flag (with its value) per line
    i = 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            lines.append(f"    {args[i]} {shlex.quote(args[i + 1])}")
            i += 2
        else:
            lines.append(f"    {args[i]}")
            i += 1
    lines += [")", "torchrun \"${DISTRIBUTED_ARGS[@]}\" pretrain_gpt.py \"${PARAPLAN_ARGS[@]}\" "
              "--mock-data --train-iters ${TRAIN_ITERS:-100} --lr 1e-4 \"$@\"", ""]
    notes = ("gradients are all-reduced in fp32 (Megatron-LM's default for bf16, "
             "--accumulate-allreduce-grads-in-fp32 for fp16); the prediction assumes the same",)
    return ExportResult(engine=ENGINE, plan=plan, filename=filename, text="\n".join(lines),
                        launcher=f"bash {shlex.quote(filename)}", notes=notes)
