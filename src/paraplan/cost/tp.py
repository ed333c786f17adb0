"""Tensor-parallel communication of one layer per micro-batch, and the SP norm-gradient all-reduce.

TP collectives are exposed, unless TP overlap (TE userbuffers, torch's micro-pipeline TP)
hides each behind the GEMM it is fused with; the first of t chunks is never hidden.

Legend: t tensor-parallel degree, T tokens per micro-batch on one CP rank, h hidden size,
L_s layers of the critical stage, m micro-batches per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from .comm import Collective, collective_time_s
from .layer_compute import LayerCompute, single_matmul_input_grads
from .layout import Layout
from .moe import MoELayerCosts


def tp_collectives_per_pass(sp, blocks):
    """TP collectives a layer issues per pass (forward, or backward) for `blocks` attention
    and MLP blocks: an all-gather and a reduce-scatter around each with sequence parallelism,
    one all-reduce without (Korthikanti et al. 2022 Sec. 4.2.2, Fig. 5)."""
    return np.where(sp, 2.0, 1.0) * blocks


def attention_gather_widths(model: ModelSpec) -> tuple[int, ...]:
    """Per-token widths sequence parallelism gathers before attention's column-parallel GEMMs
    (and reduce-scatters the gradients of): the hidden state; under MLA the latents the
    up-projections read -- c_Q (r_q; the hidden state without a query LoRA, which the full-rank
    query projection reads), c_KV (r_kv) and the shared RoPE key (d_r) -- its down-projections
    running on the sequence shard with weights duplicated over TP (Megatron-Core 0.16.1
    multi_latent_attention.py, `parallel_mode='duplicated'`, get_query_key_value_tensors)."""
    if not model.is_mla:
        return (model.hidden_size,)
    return (model.q_lora_rank or model.hidden_size, model.kv_lora_rank, model.qk_rope_head_dim)


@dataclass(frozen=True, kw_only=True)
class TPComm:
    """A layer's TP collectives per micro-batch (seconds): full and exposed, forward and backward."""

    all_gather_s: Num       # one [T, h] activation over the TP group
    reduce_scatter_s: Num
    all_reduce_s: Num
    host_s: Num             # the engine's host time at every TP collective
    blocks: Num             # attention and MLP blocks that gather and scatter
    forward_s: Num
    backward_s: Num
    forward_exposed_s: Num
    backward_exposed_s: Num
    async_backward: Num     # plan.tp_async_backward


def tp_comm(cluster: ClusterSpec, model: ModelSpec, plan, lay: Layout, lc: LayerCompute,
            mc: MoELayerCosts | None) -> TPComm:
    """A layer's TP collectives, with what TP overlap and async backward reductions hide."""
    gpu = cluster.gpu
    t, T, sp = lay.tp, lay.tokens_per_microbatch, lay.sequence_parallel
    w_moe, w_dense = lay.moe_layer_share, lay.dense_layer_share
    fused = lc.fused
    has_shared = 1.0 if model.shared_expert_ffn_hidden_size else 0.0
    row_bytes = lay.act_bytes_per_element * T  # one token's value per row of a [T, ·] activation

    def gathered(kind, widths):
        return sum(collective_time_s(cluster, kind, row_bytes * w, t, 1) for w in widths)

    ag = gathered(Collective.ALL_GATHER, (model.hidden_size,))  # one [T, h] activation, the TP buffer
    rs = gathered(Collective.REDUCE_SCATTER, (model.hidden_size,))
    ar = gathered(Collective.ALL_REDUCE, (model.hidden_size,))
    # attention's gathers (and its input gradients' reduce-scatters), one per latent under MLA
    ag_attn, rs_attn = ((gathered(Collective.ALL_GATHER, attention_gather_widths(model)),
                         gathered(Collective.REDUCE_SCATTER, attention_gather_widths(model)))
                        if model.is_mla else (ag, rs))
    # one gather/reduce pair around attention and one around a dense MLP (or an MoE layer's
    # shared experts; its routed experts exchange tokens by all-to-all instead)
    n_blk = 1.0 + w_dense + w_moe * has_shared
    n_mlp_blk = w_dense + w_moe * has_shared
    tp_fwd = np.where(sp, ag_attn + rs + n_mlp_blk * (ag + rs), n_blk * ar)
    # without SP each separate column-parallel projection all-reduces its own input gradient
    # (DTensor ColwiseParallel with a replicated input): wq, wk, wv and w1, w3 where Megatron's
    # fused QKV and gate/up reduce once each (7 all-reduces per layer against 4, counted in
    # paraplan run with torch's CommDebugMode); with SP one reduce-scatter per block either way
    extra_col = np.where(~fused & ~sp, np.where(model.is_mla, 0.0, 2.0) + n_mlp_blk * (model.num_mlp_matrices - 2.0),
                         0.0)
    # (with SP the backward gathers the out-projection's output gradient, [T, h], and
    # reduce-scatters attention's input gradients, at the widths gathered forward)
    tp_bwd = np.where(sp, ag + rs_attn + n_mlp_blk * (ag + rs), n_blk * ar) + extra_col * ar
    tpov = np.asarray(plan.tp_overlap, dtype=bool)
    sh_up = mc.shared_up_s if mc else 0.0 * lay.stage_layers
    sh_down = mc.shared_down_s if mc else 0.0 * lay.stage_layers
    mlp_blocks = ((w_dense, lc.up_gemm_s, lc.down_gemm_s), (w_moe * has_shared, sh_up, sh_down))
    # Backward without TP overlap: Megatron runs the input-gradient reduction of each
    # column-parallel layer (QKV, MLP up) asynchronously beside its weight-gradient GEMM
    # (Narayanan et al. SC'21 `--async-tensor-model-parallel-allreduce`; Korthikanti et al. 2022
    # Sec. 4.2.2 for the SP reduce-scatter). With SP the all-gather of the output gradient
    # before each row-parallel layer stays exposed.
    col_wgrad = ((1.0, lc.qkv_gemm_s, rs_attn), (w_dense, lc.up_gemm_s, rs), (w_moe * has_shared, sh_up, rs))
    async_ar = sum(wt * np.maximum(ar - w, 0.0) for wt, w, _ in col_wgrad)
    async_rs = n_blk * ag + sum(wt * np.maximum(c - w, 0.0) for wt, w, c in col_wgrad)
    tp_async = np.asarray(plan.tp_async_backward, dtype=bool)
    # TP overlap on an eager engine is torch's micro-pipeline TP (torchtitan's async TP:
    # torch/_inductor/fx_passes/micro_pipeline_tp.py, torch 2.13): it fuses an all-gather into
    # the matmuls that consume it and a matmul into the reduce-scatter that consumes it. In the
    # backward the reduce-scatter of a block's input gradient follows the *sum* of the separate
    # wq, wk, wv (w1, w3) input gradients, not a matmul, so it is not fused and stays exposed:
    # one per block whose input feeds several column-parallel GEMMs (`fuse_matmul_reduce_scatter`
    # finds no producer matmul). Transformer Engine's userbuffers (fused_kernels) overlap it.
    unfused = tuple(np.where(~fused & sp, 1.0 - single, 0.0) for single in single_matmul_input_grads(model))
    tpov_fwd, tpov_bwd = _paired_overlap_exposed(t, lc, mlp_blocks, (ag, rs, ag_attn, rs_attn), unfused)
    tp_fwd_exp = np.where(tpov, tpov_fwd, tp_fwd)
    tp_bwd_exp = np.where(tpov, tpov_bwd,
                          np.where(tp_async, np.where(sp, async_rs, async_ar + extra_col * ar), tp_bwd))
    # the engine's host time at every TP collective (GPUSpec.tp_collective_overhead_s; 0 in
    # the presets): spent on the issuing host, hidden by nothing
    tp_host = np.where(t > 1, gpu.tp_collective_overhead_s, 0.0)
    tp_host_fwd = tp_collectives_per_pass(sp, n_blk) * tp_host
    tp_host_bwd = tp_host_fwd + extra_col * tp_host
    return TPComm(all_gather_s=ag, reduce_scatter_s=rs, all_reduce_s=ar, host_s=tp_host, blocks=n_blk,
                  forward_s=tp_fwd + tp_host_fwd, backward_s=tp_bwd + tp_host_bwd,
                  forward_exposed_s=tp_fwd_exp + tp_host_fwd, backward_exposed_s=tp_bwd_exp + tp_host_bwd,
                  async_backward=tp_async)


def _paired_overlap_exposed(t, lc: LayerCompute, mlp_blocks, comm, unfused):
    """Under TP overlap, a layer's (forward, backward) exposed TP time. Each collective hides
    behind the GEMM it is fused with, not behind the layer's GEMMs at large: forward, the
    all-gather behind the column-parallel GEMM that consumes it (QKV, MLP up) and the
    reduce-scatter behind the row-parallel GEMM that feeds it (out, MLP down) -- Transformer
    Engine's userbuffers split each such GEMM over the ring's steps (Wang et al., ASPLOS 2023,
    "Overlap communication with dependent computation"), as torch's micro-pipeline TP does; the
    chunk the collective cannot start before (an all-gather's first, a reduce-scatter's last)
    is never hidden: one of the chunks its GEMM runs in (lc.tp_chunks: t, or under Transformer
    Engine 4 for a pipelined reduce-scatter; layer_compute.tp_overlap_chunks). Backward, each
    block's gather (of the output gradient) behind the row-parallel GEMM's data-gradient pass
    that consumes it, its reduce-scatter (of the input gradient) behind the column-parallel
    one's that feeds it -- Transformer Engine's "bulk" overlap runs it whole beside that GEMM,
    no chunk unhidden -- unless `unfused` (attention, MLP: 1 where that gradient is a sum on an
    eager engine, exposed whole); the weight-gradient GEMMs need the gathered tensors and come
    after. `comm`: (AG, RS) of [T, h] and attention's (AG, RS) at its gathered widths."""
    ag, rs, ag_attn, rs_attn = comm
    unfused_attn, unfused_mlp = unfused
    userbuffers = np.asarray(lc.fused, dtype=bool)
    # the chunks the collectives' GEMMs run in: forward QKV (gather) and out (scatter), and the
    # out data gradient (the backward's gather); up and down chunk as QKV and out do
    (ag_chunks, _, rs_chunks, _), (_, _, bwd_ag_chunks, _) = lc.tp_chunks

    def exposed(c, g, chunks):
        return np.maximum(c - g, c / chunks)

    def rs_bwd(c, g_col, u):
        return u * c + (1.0 - u) * np.where(userbuffers, np.maximum(c - g_col, 0.0), exposed(c, g_col, t))

    fwd = exposed(ag_attn, lc.qkv_gemm_s, ag_chunks) + exposed(rs, lc.out_gemm_s, rs_chunks) + sum(
        wt * (exposed(ag, up, ag_chunks) + exposed(rs, down, rs_chunks)) for wt, up, down in mlp_blocks)
    bwd = exposed(ag, lc.out_gemm_s, bwd_ag_chunks) + rs_bwd(rs_attn, lc.qkv_gemm_s, unfused_attn) + sum(
        wt * (exposed(ag, down, bwd_ag_chunks) + rs_bwd(rs, up, unfused_mlp)) for wt, up, down in mlp_blocks)
    return fwd, bwd


def sp_norm_grad_all_reduce_s(cluster: ClusterSpec, model: ModelSpec, lay: Layout, tp: TPComm, mb_reduce):
    """Per step, the all-reduce of the gradients sequence parallelism leaves partial.

    Sequence parallelism leaves each TP rank a partial gradient of the weights it keeps
    replicated (norms, the MoE router): Megatron-Core all-reduces them over TP in one flat
    buffer once per step (finalize_model_grads, _allreduce_layernorm_grads; paraplan run
    without DP the same). FSDP2 reduces each such tensor on its own at every gradient
    reduction (torch 2.13 _fsdp_param.py _get_grad_inner_tensor): per micro-batch under
    ZeRO-2/3 (`mb_reduce`), per step below it or under pipeline schedules."""
    t, L_s, w_moe, sp = lay.tp, lay.stage_layers, lay.moe_layer_share, lay.sequence_parallel
    reduce_bytes, tp_host = lay.reduce_bytes_per_param, tp.host_s
    sp_tensors = L_s * (model.norm_params_per_layer / model.hidden_size + w_moe) + 1.0  # w_moe: 0 when dense
    sp_params = L_s * (model.norm_params_per_layer + w_moe * model.hidden_size * model.num_experts) + model.hidden_size
    flat = collective_time_s(cluster, Collective.ALL_REDUCE, reduce_bytes * sp_params, t, 1) + tp_host
    one_each = sp_tensors * (collective_time_s(cluster, Collective.ALL_REDUCE, reduce_bytes * sp_params / sp_tensors, t, 1)
                             + tp_host)
    return np.where(sp & (t > 1), np.where(lay.fsdp2, np.where(mb_reduce, lay.num_microbatches, 1.0) * one_each,
                                           flat), 0.0)
