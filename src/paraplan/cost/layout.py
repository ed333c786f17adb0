"""What a plan makes of the model on one GPU: the sizes the memory and the time model read.

Legend of the formulas below (floats, or numpy arrays over a batch of plans):
    t   tensor-parallel degree          p   pipeline stages
    d   data-parallel degree            c   context-parallel degree
    v   model chunks per pipeline rank  b   micro-batch size (sequences)
    l   the model's layers              L_s layers on the critical (fullest) stage
    S   ZeRO shard group, dp_shard·c    R   HSDP replicas, d/dp_shard
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num, as_float
from ..plan.axes import V_SCHEDULES, GradCompression, Recompute, RankOrder, ZeroStage
from ..specs.model import ModelSpec
from ..specs.workload import Precision, Workload
from . import memory as mem
from .low_precision import gathered_weight_bytes_per_param, weights_bytes_per_param
from .moe import moe_layers_on_stage


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What a plan makes of the model on one GPU: the sizes both the memory model and the
    time model read (floats or numpy arrays over a batch of plans)."""

    precision: Precision
    act_bytes_per_element: float  # bytes per activation element (16-bit unless fp32/tf32)
    fp32_params: Num        # 32-bit parameter shards (the plan's knob, or a 32-bit workload)
    casts_gathered: Num     # fp32 shards of a 16-bit workload: each gathered weight cast at use
    tp: Num
    pp: Num
    dp: Num
    cp: Num
    vp: Num                 # model chunks per pipeline rank
    num_microbatches: Num   # micro-batches per step
    tokens_per_microbatch: Num  # tokens per micro-batch on one CP rank
    sequence_parallel: Num
    sp_divisor: Num         # TP when sequence parallel, else 1
    recompute_code: Num
    recompute_ops_code: Num  # Recompute.SET's set (plan/axes.py RecomputeOps), 0 under the other policies
    zero_code: Num
    stage_layers: Num       # layers of the critical stage
    first_stage_layers: Num
    last_stage_layers: Num
    single_stage: Num       # one pipeline stage
    spare_chunk_slots: Num  # chunk slots past the layers: the loss's first, then the embedding's
    v_shape: Num            # ZB-V, DualPipeV: two chunks per rank in a V (sim/schedules.py Placement.V_SHAPE)
    first_holds_ends: Num   # the first rank holds both the embedding and the head (one stage, or a V)
    moe_layer_share: Num    # share of the stage's layers that are MoE layers
    dense_layer_share: Num
    first_k_layers: Num     # first-k: layers recomputed per stage
    recomputed_layers: Num  # layers re-run whole per stage and micro-batch
    zero_shard_group: Num   # ZeRO-3 shard group (dp_shard × CP)
    hsdp_replicas: Num
    edp: Num                # expert data-parallel group
    expert_shard_group: Num  # the experts' ZeRO shard group: EDP within one HSDP replica, edp/R
    expert_stride: Num      # rank distance between members of an expert data-parallel group
    # rank distance between data-parallel replicas (plan.rank_order): t·c with the pipeline
    # outermost (Megatron's default), t·c·p with data parallelism outermost; CP×DP groups are
    # runs of c ranks t apart repeated dp_outer_stride apart (dp_block = c; the whole group,
    # one even run, with the pipeline outermost)
    dp_outer_stride: Num
    dp_block: Num
    pp_stride: Num          # rank distance between consecutive pipeline stages
    dense_layer_params: Num
    layer_params: Num       # one layer's non-expert parameters on this TP rank
    expert_params: Num      # one (average) layer's routed experts on this rank
    params_first_stage: Num
    params_last_stage: Num
    mtp_expert_params: Num  # routed experts of the multi-token-prediction blocks on the head's rank
    # routed experts on the head's stage: its layers' and the MTP blocks', counted like the
    # other stages' (as a full stage's) at least; the busiest stage's experts
    head_stage_expert_params: Num
    params_stage: Num       # the busiest stage's non-expert parameters on this rank
    expert_params_stage: Num
    zero3: Num
    zero2: Num
    fsdp2: Num              # data parallelism on FSDP2 fully_shard (plan.fsdp2_copies, over 2+ ranks)
    fsdp2_pp: Num           # ... under torch's pipeline schedules: no-sync accumulation, one reduction per step
    autocast_casts: Num     # weights cast by torch.autocast (plan.autocast, fp32 parameters without FSDP)
    compiled_loss: Num      # the cross-entropy under torch.compile (an eager engine's; plan.compiled_loss)
    loss_parallel: Num      # ... else eager over a TP-split vocabulary, op by op (plan.loss_parallel, TP > 1)
    gather_bytes_per_param: Num  # bytes per parameter all-gathered
    linear_weight_bytes_per_param: Num  # bytes a linear layer's weight keeps (weights_bytes_per_param)
    reduce_bytes_per_param: Num  # bytes per gradient reduced
    grad_bytes_per_param: Num    # bytes per gradient kept: fp32, or Megatron-Core's 16-bit buffer (plan.grad_buffer_16bit)
    optimizer_shard: Num    # optimizer-state shard of the dense parameters
    expert_optimizer_shard: Num  # and of the experts
    offload_optimizer: Num
    qgz: Num                # ZeRO-3's reduce-scatter in int4 (plan.grad_compression int4; cost/grad_compression.py)
    powersgd_rank: Num      # DDP's PowerSGD hook at this rank r (plan.grad_compression powersgd), else 0
    adam_accumulation: Num  # AdamA: gradients folded into Adam's states per micro-batch (plan knob)


def end_chunk_slots(model: ModelSpec, per_chunk, slack):
    """(layers off the last virtual stage, off the first) where a split leaves `slack` slots
    past the layers in chunks of `per_chunk`: the last chunk gives one to the loss and one to
    each multi-token-prediction module (as many as it has layers), then the first one to the
    embedding. Megatron-Core --account-for-loss/embedding-in-pipeline-split; Llama 3 405B's 126
    layers in 16 × 8 chunks, Dubey et al. 2024 Sec. 3.3.2; Megatron-Bridge lays out
    DeepSeek-V3's 61 layers and its MTP module in 32 chunks as `Et|(tt|)*30mL`. Vectorized."""
    off_last = np.minimum(np.minimum(slack, 1.0 + model.mtp_layers), per_chunk)
    off_first = np.minimum(np.maximum(slack - off_last, 0.0), 1.0)
    return off_last, off_first


def _stage_layers(model: ModelSpec, plan, p, v):
    """(L_s, L_first, L_last, only, slack, vshape, ends): layers per stage and where the ends sit."""
    # layers on the critical stage: ceil(l / (p·v)) per chunk × v chunks (an uneven split's
    # spare slots: the loss's and the embedding's off the last and first stages, any more
    # off the middle ones, which are timed full: conservative)
    L_s = np.ceil(model.num_layers / (p * v)) * v
    # Chunk slots left over by ceil(l/(p·v)) go to the loss (and the multi-token-prediction
    # modules) and the embedding: end_chunk_slots. Further slack stays on the middle stages'
    # count (conservative).
    only = p == 1
    # ZB-V and DualPipeV place their two chunks per rank in a V: the first rank holds the first
    # and the last virtual stage, so the embedding, the head and both spare slots; the last
    # rank is a middle one
    vshape = np.isin(np.asarray(plan.schedule_code), [s.code for s in V_SCHEDULES]) & ~only
    ends = only | vshape
    slack = np.where(only, 0.0, p * v * np.ceil(model.num_layers / (p * v)) - model.num_layers)
    off_last, off_first = end_chunk_slots(model, L_s / v, slack)
    L_last = np.where(vshape, L_s, L_s - off_last)
    L_first = L_s - np.where(vshape, off_last + off_first, off_first)
    return L_s, L_first, L_last, only, slack, vshape, ends


def _stage_params(model: ModelSpec, t, L_first, L_last, only, vshape, ends, dense_layer_params):
    """(first stage's, last stage's) non-expert parameters on one TP rank."""
    # multi-token prediction: the D modules sit with the head (DeepSeek-V3 report Sec. 2.2;
    # Megatron-Core builds them on the last pipeline stage), their routed experts sharded like
    # a layer's; their input embedding is the main one, which a separate last stage keeps a copy
    # of, as of a tied table
    mtp_dense = model.mtp_layers * model.mtp_dense_params_per_module
    params_stage_first = (L_first * dense_layer_params + model.embedding_params
                          + np.where(ends, model.lm_head_params + model.hidden_size + mtp_dense, 0.0)) / t
    # a tied table is on the last stage too when the stages differ: Megatron keeps a copy for
    # the output layer and all-reduces the two gradients (shared_embedding), paraplan run unties it
    params_stage_last = np.where(vshape, L_last * dense_layer_params,
                                 L_last * dense_layer_params + model.lm_head_params + model.hidden_size + mtp_dense
                                 + np.where(only | model.tied_embeddings | (model.mtp_layers > 0),
                                            model.embedding_params, 0.0)) / t
    return params_stage_first, params_stage_last


def _bytes_per_param(prec: Precision, plan, fp32_params, wide: bool) -> dict:
    """The Layout's widths of a parameter's weight (kept, gathered) and gradient (kept, reduced)."""
    # a 16-bit gradient buffer is reduced in its own dtype (Megatron-Core's one flag sets both)
    grad_buffer_16bit = np.asarray(plan.grad_buffer_16bit, dtype=bool) & ~np.asarray(wide, dtype=bool)
    grad_reduce_fp32 = (np.asarray(plan.grad_reduce_fp32, dtype=bool) | wide) & ~grad_buffer_16bit
    zc = np.asarray(plan.zero_code)
    # weights kept quantized need a sharded optimizer for their fp32 master (Megatron-Core:
    # --fp8-param-gather asserts the distributed optimizer or FSDP): not at ZeRO-0
    quantized = np.asarray(plan.low_precision_params, dtype=bool) & (zc >= ZeroStage.OPTIMIZER.code)
    gather = np.where(fp32_params, mem.MASTER_BYTES,
                      gathered_weight_bytes_per_param(prec, quantized, plan.fused_kernels))
    return dict(
        gather_bytes_per_param=gather,
        # ZeRO-3's shards are kept as they are gathered (their gathered layers' quantized copies
        # are not priced)
        linear_weight_bytes_per_param=np.where(fp32_params | (zc == ZeroStage.PARAMETERS.code), gather,
                                               weights_bytes_per_param(prec, quantized, plan.fused_kernels)),
        reduce_bytes_per_param=np.where(grad_reduce_fp32, mem.GRAD_BYTES, mem.WEIGHT_BYTES),
        grad_bytes_per_param=np.where(grad_buffer_16bit, mem.WEIGHT_BYTES, mem.GRAD_BYTES))


def layout(model: ModelSpec, workload: Workload, plan) -> Layout:
    """The Layout of a plan (or a batch of plans) of `model` under `workload`."""
    prec = Precision(workload.precision)
    ab = prec.activation_bytes
    # a 32-bit workload has 32-bit parameters (no 16-bit copy, the master is the weight) and
    # reduces 32-bit gradients, whatever the plan's mixed-precision knobs say
    wide = ab >= 4.0
    t, p, d, c, v, b = (as_float(plan.tp), as_float(plan.pp), as_float(plan.dp), as_float(plan.cp),
                        as_float(plan.vp), as_float(plan.micro_batch_size))
    sp = np.asarray(plan.sequence_parallel, dtype=bool)
    rc = np.asarray(plan.recompute_code)
    zc = np.asarray(plan.zero_code)
    L_s, L_first, L_last, only, slack, vshape, ends = _stage_layers(model, plan, p, v)
    # MoE: per-layer quantities are averages over the critical stage's layers, a share
    # w_moe of which are MoE layers (moe.py) and w_dense have the dense MLP
    w_moe = moe_layers_on_stage(model, L_s) / L_s
    w_dense = 1.0 - w_moe
    k_rc = np.where(rc == Recompute.FIRST_K.code, as_float(plan.recompute_num_layers), 0.0)
    dense_layer_params = (model.attn_params_per_layer + model.norm_params_per_layer
                          + w_dense * model.mlp_params_per_layer + w_moe * model.moe_dense_params_per_moe_layer)
    ep_etp = as_float(plan.ep) * as_float(plan.etp)
    # routed experts: this rank's shard, replicated over the expert data-parallel group EDP
    expert_params = w_moe * model.expert_params_per_moe_layer / ep_etp
    mtp_experts = model.mtp_layers * model.mtp_expert_params_per_module / ep_etp
    params_stage_first, params_stage_last = _stage_params(model, t, L_first, L_last, only, vshape, ends,
                                                          dense_layer_params)
    S = as_float(plan.dp_shard) * c
    edp = t * c * d / ep_etp
    dp_outermost = (np.asarray(plan.rank_order_code) == RankOrder.TP_CP_PP_DP.code) & (p > 1)
    dp_outer = np.where(dp_outermost, t * c * p, t * c)
    S_e = edp * as_float(plan.dp_shard) / d  # the experts' shard group: EDP within one HSDP replica
    fp32_params = np.asarray(plan.fp32_params, dtype=bool) | wide
    sharded = zc >= ZeroStage.OPTIMIZER.code
    fsdp2 = np.asarray(plan.fsdp2_copies, dtype=bool) & (d * c > 1)
    # weights cast by torch.autocast: fp32 parameters without FSDP (whose policy casts them
    # itself), in a 16-bit workload (a 32-bit one and fp32 shards have nothing to cache)
    casts = np.asarray(plan.autocast, dtype=bool) & ~fp32_params & ~fsdp2
    eager_loss = ~np.asarray(plan.fused_kernels, dtype=bool)
    compiled_loss = np.asarray(plan.compiled_loss, dtype=bool) & eager_loss
    return Layout(
        precision=prec, act_bytes_per_element=ab, fp32_params=fp32_params, casts_gathered=fp32_params & (not wide),
        tp=t, pp=p, dp=d, cp=c, vp=v, num_microbatches=np.floor(workload.global_batch_size / (d * b)),
        tokens_per_microbatch=b * workload.seq_len / c,
        sequence_parallel=sp, sp_divisor=np.where(sp, t, 1.0), recompute_code=rc, zero_code=zc,
        recompute_ops_code=np.where(rc == Recompute.SET.code, np.asarray(plan.recompute_ops_code), 0),
        stage_layers=L_s, first_stage_layers=L_first, last_stage_layers=L_last, single_stage=only,
        spare_chunk_slots=slack, v_shape=vshape, first_holds_ends=ends,
        moe_layer_share=w_moe, dense_layer_share=w_dense, first_k_layers=k_rc,
        recomputed_layers=np.where(rc == Recompute.FULL.code, L_s, k_rc),
        zero_shard_group=S, hsdp_replicas=d / as_float(plan.dp_shard), edp=edp, expert_shard_group=S_e,
        # expert groups re-slice the stage's ranks in order: EDP members ep·etp folded ranks
        # apart, dp_outer/(t·c) real ranks per folded one beyond a replica (with data
        # parallelism outermost EP×ETP = TP×CP, plan/space.py ep_rank_order: dp_outer apart)
        expert_stride=ep_etp * dp_outer / (t * c), dp_outer_stride=dp_outer,
        dp_block=np.where(dp_outermost, c, c * d), pp_stride=np.where(dp_outermost, t * c, t * c * d),
        dense_layer_params=dense_layer_params, layer_params=dense_layer_params / t, expert_params=expert_params,
        params_first_stage=params_stage_first, params_last_stage=params_stage_last, mtp_expert_params=mtp_experts,
        params_stage=np.maximum(params_stage_first, params_stage_last),
        expert_params_stage=L_s * expert_params,  # the same on every stage (0 for a dense model)
        head_stage_expert_params=(np.maximum(L_s * expert_params,
                                             np.where(ends, L_first, L_last) * expert_params + mtp_experts)
                                  if model.mtp_layers else L_s * expert_params),
        zero3=zc == ZeroStage.PARAMETERS.code, zero2=zc == ZeroStage.GRADIENTS.code,
        fsdp2=fsdp2, fsdp2_pp=fsdp2 & (p > 1), autocast_casts=casts,
        compiled_loss=compiled_loss,
        loss_parallel=np.asarray(plan.loss_parallel, dtype=bool) & eager_loss & ~compiled_loss & (t > 1),
        **_bytes_per_param(prec, plan, fp32_params, wide),
        optimizer_shard=np.where(sharded, S, 1.0), expert_optimizer_shard=np.where(sharded, S_e, 1.0),
        offload_optimizer=np.asarray(plan.offload_optimizer, dtype=bool),
        qgz=np.asarray(plan.grad_compression_code) == GradCompression.INT4.code,
        powersgd_rank=np.where(np.asarray(plan.grad_compression_code) == GradCompression.POWERSGD.code,
                               as_float(plan.powersgd_rank), 0.0),
        adam_accumulation=np.asarray(plan.adam_accumulation, dtype=bool))
