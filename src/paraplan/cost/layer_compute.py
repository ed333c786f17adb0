"""One layer's compute per micro-batch on one GPU: GEMMs, attention, element-wise kernels.

Legend (floats, or numpy arrays over a batch of plans):
    T  tokens per micro-batch on one CP rank    t  tensor-parallel degree
    h  hidden size                              f  MLP hidden size
    s  sequence length                          m  micro-batches per step
    qd, kvd  widths of the query and key/value projections
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..num import Num
from ..plan.axes import AttentionKernel
from ..specs.hardware import GPUSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision, Workload
from . import memory as mem
from .flops import CAUSAL_FRACTION, FLASH_BWD_OVER_FWD, LayerFlops, flash2_padding, layer_forward_flops
from .layout import Layout
from .low_precision import LOW_PRECISIONS, attention_precision, quantize_bytes_per_element
from .moe import MoELayerCosts
from .roofline import (attention_time_s, elementwise_time_s, gemm_time_s, memory_bound_time_s,
                       up_projection_time_s)

EW_FWD_KERNELS = 10  # a layer's forward element-wise launches (2 norms, RoPE, 2 residual adds, activation, ...)
EW_BWD_KERNELS = 14  # and backward's (each forward kernel's gradient, plus the residual-gradient adds)


def elementwise_bytes_per_token(model: ModelSpec, *, act_bytes: float, sp_div=1.0, t=1.0, w_dense=1.0):
    """A layer's forward element-wise bytes per token: norms r+w 4h, residual adds 6h,
    dropout 5h, RoPE on q and k 2(qd+kvd), activation 3f (gated) or 2f of a dense MLP;
    elements of `act_bytes` bytes. The h terms split over SP, the rest over TP."""
    h, f = model.hidden_size, model.ffn_hidden_size
    ew_h = (10.0 + (5.0 if model.dropout else 0.0)) * h / sp_div
    ew_t = (2.0 * (model.q_dim + model.kv_dim) + w_dense * (3.0 if model.gated_mlp else 2.0) * f) / t
    return act_bytes * (ew_h + ew_t)


def autocast_weight_cast_s(gpu, params, tensors):
    """torch.autocast with fp32 parameters: each weight cast to 16 bits at its first use in a
    micro-batch's forward (read 4 B, write 2 B; the cache lives for one autocast region, and a
    recomputed forward casts again), one kernel per tensor: streaming at the copy rate (a
    weight's cast is one long contiguous pass, not a layer's mix of element-wise kernels)."""
    return memory_bound_time_s(gpu, 6.0 * np.asarray(params, dtype=float), tensors)


def autocast_grad_s(gpu, params, tensors, m, cast=True):
    """... and in the backward: the 16-bit weight gradient cast back to fp32 (read 2 B, write
    4 B; not for a weight autocast does not cast, the input embedding's) and, after the step's
    first micro-batch, added into the fp32 .grad (read 4 + 4 B, write 4 B); averaged over the
    m micro-batches, one kernel per tensor each."""
    m = np.asarray(m, dtype=float)
    params = np.asarray(params, dtype=float)
    add = memory_bound_time_s(gpu, 12.0 * params, tensors) * (m - 1.0) / np.maximum(m, 1.0)
    return (memory_bound_time_s(gpu, 6.0 * params, tensors) if cast else 0.0) + add


def layer_gemms_s(gpu: GPUSpec, model: ModelSpec, T, t, prec: Precision, fused, chunks=(1.0, 1.0, 1.0, 1.0)):
    """(QKV, MLP up, out-projection, MLP down) GEMM times of one layer's forward (vectorized).

    QKV as one GEMM of the projections' total width (MLA: its low-rank chain, same FLOPs),
    and a gated MLP's gate and up as one GEMM of 2f (Megatron-Core's fused linear layers);
    separate wq, wk, wv and w1, w3 where the engine keeps them apart (plan.fused_kernels:
    torchtitan's Llama, paraplan run), each GEMM at the efficiency of its own size. `chunks`
    (QKV, up, out, down; vectorized): each GEMM run as that many GEMMs of T/chunks rows, or of
    as many column blocks (the same FLOPs, which the efficiency curve is keyed on; TP overlap:
    tp_overlap_chunks)."""
    h, f, qd, kvd = model.hidden_size, model.ffn_hidden_size, model.q_dim, model.kv_dim
    n_qkv, n_up, n_out, n_down = (np.asarray(c, dtype=float) for c in chunks)

    def gemm(n, cols, depth):
        return n * gemm_time_s(gpu, T / n, cols, depth, prec)

    g_qkv = gemm(n_qkv, model.qkv_params_per_layer / h / t, h)
    g_up = n_up * up_projection_time_s(gpu, T / n_up, f / t, h, prec, model.num_mlp_matrices - 1, fused)
    if not np.all(fused) and not model.is_mla:  # (MLA's low-rank chain either way)
        g_qkv = np.where(fused, g_qkv, gemm(n_qkv, qd / t, h) + 2.0 * gemm(n_qkv, kvd / t, h))
    g_out = gemm(n_out, h, qd / t)
    g_down = gemm(n_down, h, f / t)
    return g_qkv, g_up, g_out, g_down


def single_matmul_input_grads(model: ModelSpec) -> tuple[float, float]:
    """(attention, MLP): 1 where one matmul makes a block's input gradient, 0 where it is the
    sum of separate projections' (wq, wk, wv; a gated MLP's w1, w3) on an eager engine. Torch's
    micro-pipeline TP fuses a reduce-scatter only into a matmul that produces its input: MLA
    attention (its input feeds the low-rank chain alone) and a non-gated MLP (tp.py)."""
    return (1.0 if model.is_mla else 0.0), (1.0 if model.num_mlp_matrices <= 2 else 0.0)


# Transformer Engine's userbuffers split a GEMM+reduce-scatter ("pipeline" method) in this many
# chunks by default (transformer_engine/pytorch/module/base.py initialize_ub, 2.9:
# get_default_config "num_splits": tp_size for "ring_exchange", else 4; NeMo's tuned
# userbuffers configs keep 4 where they pipeline, nemo 2.3.0 tp_overlap_configs/userbuffers.py)
UB_PIPELINE_SPLITS = 4.0


def tp_overlap_chunks(model: ModelSpec, plan, lay: Layout, fused):
    """(forward, data-gradient) chunk counts of the (QKV, up, out, down) GEMMs: how many GEMMs
    of T/chunks rows each runs as, where TP overlap splits it over the steps of its
    collective (1 elsewhere; vectorized).

    Torch's micro-pipeline TP (an eager block with TP overlap and SP: torchtitan's async TP)
    runs each of the four forward matmuls once per rank's shard, t GEMMs of T/t rows: its fused
    all-gather-matmul as each shard of the gathered input arrives, its fused
    matmul-reduce-scatter once per destination rank's rows (torch
    `_inductor/fx_passes/micro_pipeline_tp.py`, `distributed/_symmetric_memory`
    `fused_all_gather_matmul`, `fused_matmul_reduce_scatter`). Backward, the out and down data
    gradients consume the gathered output gradient (t chunks) and the QKV and up ones feed a
    fused reduce-scatter where a single matmul makes the block's input gradient
    (single_matmul_input_grads).

    Transformer Engine's userbuffers (a fused engine with TP overlap: Megatron-Core's
    --tp-comm-overlap) by its default methods (TE 2.9 module/base.py initialize_ub): QKV and
    fc1 forward and the out and fc2 data gradients by "ring_exchange", t GEMMs of T/t rows;
    out and fc2 forward by "pipeline", UB_PIPELINE_SPLITS GEMMs, each of a block of the output
    columns reduce-scattered as it completes (priced as T/4 rows: the same FLOPs); the QKV and fc1 data and
    weight gradients by "bulk", whole GEMMs beside the collective. The SMs its collectives
    take from the GEMMs are the GPU's overlap_slowdown, as for every overlapped collective."""
    t = np.asarray(lay.tp, dtype=float)
    on = (np.asarray(plan.tp_overlap, dtype=bool) & np.asarray(lay.sequence_parallel, dtype=bool) & (t > 1))
    fused = np.asarray(fused, dtype=bool)
    micro, ub = on & ~fused, on & fused
    ring = np.where(on, t, 1.0)
    reduce_scattered = np.where(micro, t, np.where(ub, UB_PIPELINE_SPLITS, 1.0))
    qkv_single, up_single = single_matmul_input_grads(model)
    forward = (ring, ring, reduce_scattered, reduce_scattered)
    data_grad = (np.where(micro & (qkv_single > 0), t, 1.0), np.where(micro & (up_single > 0), t, 1.0), ring, ring)
    return forward, data_grad


def _micro_pipeline_reductions_s(gpu: GPUSpec, model: ModelSpec, lay: Layout, fused, chunks):
    """(forward, backward) time of torch's micro-pipeline TP summing its reduce-scatters'
    partial products. Its fused matmul-reduce-scatter writes each destination's partial
    product of the t row blocks into one stacked buffer, exchanges them by peer copies, and
    sums the t partials in one reduction kernel (torch `distributed/_symmetric_memory`
    `_fused_matmul_reduce_scatter_impl`: `reduce_fn(stacked_partials ...)`): it reads [T, h]
    and writes [T/t, h] at the activation width, where NCCL's reduce-scatter reduced inside
    its own kernel. Forward: out and down (a dense MLP by its share); backward: the QKV and
    up input gradients where one matmul makes them (single_matmul_input_grads). `chunks`:
    tp_overlap_chunks'."""
    forward_chunks, data_grad_chunks = chunks
    micro = ~np.asarray(fused, dtype=bool) & (np.asarray(forward_chunks[2]) > 1.0)
    t, T = lay.tp, lay.tokens_per_microbatch
    one = np.where(micro, memory_bound_time_s(gpu, lay.act_bytes_per_element * T * model.hidden_size * (1.0 + 1.0 / t),
                                              1), 0.0)
    qkv_fused_rs, up_fused_rs = (np.asarray(c) > 1.0 for c in data_grad_chunks[:2])
    return (1.0 + lay.dense_layer_share) * one, (qkv_fused_rs + lay.dense_layer_share * up_fused_rs) * one


@dataclass(frozen=True, kw_only=True)
class LayerCompute:
    """One (average) layer's compute per micro-batch, seconds; MoE layers' share included."""

    flops: LayerFlops
    qkv_gemm_s: Num
    up_gemm_s: Num
    out_gemm_s: Num
    down_gemm_s: Num
    gemms_forward_s: Num    # the four GEMMs of the forward (dense MLP by its share)
    gemms_backward_s: Num   # their data- and weight-gradient GEMMs
    gemms_wgrad_s: Num      # the weight-gradient GEMMs alone
    attention_forward_s: Num
    attention_backward_s: Num
    elementwise_forward_s: Num
    elementwise_backward_s: Num
    quantize_cast_s: Num    # FP8/NVFP4 casts of the GEMM inputs, per forward
    grad_casts_s: Num       # autocast's gradient casts and fp32 accumulation (backward)
    moe_forward_s: Num
    moe_backward_s: Num
    moe_wgrad_s: Num
    forward_s: Num
    backward_s: Num
    weight_grad_s: Num      # the weight-gradient GEMMs and what lies on their side (a split backward's W)
    casts_per_microbatch: Num  # autocast: weight casts per micro-batch
    layer_matrices: float   # a layer's weight matrices as the eager engines keep them
    flash: Num              # a fused attention kernel
    fused: Num              # fused QKV and gate/up GEMMs (plan.fused_kernels)
    tp_chunks: tuple        # (forward, data-gradient) chunks of the (QKV, up, out, down) GEMMs (tp_overlap_chunks)


def _attention_s(gpu: GPUSpec, model: ModelSpec, lay: Layout, plan, lf: LayerFlops, s):
    """(forward, backward) of the attention core: a fused kernel or unfused GEMMs and softmax."""
    T, t, ab = lay.tokens_per_microbatch, lay.tp, lay.act_bytes_per_element
    act_prec = attention_precision(lay.precision)
    akc = np.asarray(plan.attention_code)
    flash = akc != AttentionKernel.UNFUSED.code
    # FlashAttention-2 runs a head of 80 or 112 in its 96- or 128-wide kernel (flops.py)
    attn_flops_flash = lf.attn_core / t * np.where(akc == AttentionKernel.FLASH2.code, flash2_padding(model), 1.0)
    attn_flash_fwd = attention_time_s(gpu, attn_flops_flash, act_prec, akc)
    # Unfused attention (2021–22 Megatron): batched GEMMs over the full s×s, then scale,
    # mask, softmax and dropout over the a·s score elements per token: four passes of the
    # activation width and a 1-byte dropout mask (9 bytes per element at 16 bits).
    attn_flops_full = attn_flops_flash / CAUSAL_FRACTION
    attn_unfused_fwd = (attn_flops_full / (gpu.peak(act_prec) * gpu.compute_share
                                           * gpu.gemm_efficiency.at(attn_flops_full))
                        + elementwise_time_s(gpu, T * model.num_heads / t * s * (4.0 * ab + 1.0), 4))
    attn_fwd = np.where(flash, attn_flash_fwd, attn_unfused_fwd)
    attn_bwd = np.where(flash, attention_time_s(gpu, attn_flops_flash * FLASH_BWD_OVER_FWD, act_prec, akc)
                        - gpu.kernel_launch_overhead_s, 2.0 * attn_unfused_fwd)
    return attn_fwd, attn_bwd, flash


def layer_compute(gpu: GPUSpec, model: ModelSpec, workload: Workload, plan, lay: Layout,
                  mc: MoELayerCosts | None) -> LayerCompute:
    """A layer's compute per micro-batch (`mc`: an MoE layer's costs, None for a dense model)."""
    ab = lay.act_bytes_per_element
    t, p, m, T, sp_div = lay.tp, lay.pp, lay.num_microbatches, lay.tokens_per_microbatch, lay.sp_divisor
    w_moe, w_dense = lay.moe_layer_share, lay.dense_layer_share
    zeros = 0.0 * lay.stage_layers
    moe_fwd, moe_bwd, moe_wgrad = (w_moe * mc.fwd_compute_s, w_moe * mc.bwd_compute_s, w_moe * mc.wgrad_s) \
        if mc else (zeros, zeros, zeros)
    lf = layer_forward_flops(model, T, workload.seq_len, causal=True)
    # fused QKV and gate/up GEMMs, or separate ones (plan.fused_kernels; layer_gemms_s)
    fused = np.asarray(plan.fused_kernels, dtype=bool)
    # a layer's weight matrices as the eager engines keep them: wq, wk, wv, wo and the MLP's
    # (the tensors their per-tensor kernels -- casts, gradient adds -- run over)
    layer_matrices = 4.0 + model.num_mlp_matrices
    chunks = tp_overlap_chunks(model, plan, lay, fused)
    g_qkv, g_up, g_out, g_down, gemms_fwd, gemms_bwd, gemms_wgrad = layer_gemm_passes(gpu, model, lay, fused, chunks)
    attn_fwd, attn_bwd, flash = _attention_s(gpu, model, lay, plan, lf, workload.seq_len)
    ew_bytes = T * elementwise_bytes_per_token(model, act_bytes=ab, sp_div=sp_div, t=t, w_dense=w_dense)
    cast, cast_bwd = _quantize_casts_s(gpu, model, workload, lay)
    # an eager engine's element-wise kernels (fused_kernels off, or plan.eager_elementwise:
    # llm-foundry's MPT), one per op, stream at the GPU's eager share of the copy rate (fused
    # engines' at elementwise_bw_efficiency); an eager block under
    # torch.compile (plan.compiled): inductor's fused kernels take the GPU's measured
    # compiled_elementwise_ratio of that eager time (both measured on the same mix)
    ew_scale = np.where(mem.compiled_blocks(plan), gpu.compiled_elementwise_ratio, 1.0)
    eager_ew = ~fused | np.asarray(plan.eager_elementwise, dtype=bool)
    ew_eff = np.where(eager_ew, gpu.eager_elementwise_bw_efficiency, gpu.elementwise_bw_efficiency)
    reduce_fwd, reduce_bwd = _micro_pipeline_reductions_s(gpu, model, lay, fused, chunks)
    ew_fwd = ew_scale * memory_bound_time_s(gpu, ew_bytes, EW_FWD_KERNELS, ew_eff) + cast + reduce_fwd
    ew_bwd = ew_scale * memory_bound_time_s(gpu, 2.0 * ew_bytes, EW_BWD_KERNELS, ew_eff) + cast_bwd + reduce_bwd
    # torch.autocast with fp32 parameters (plan.autocast): the weights cast every micro-batch,
    # their gradients cast back and accumulated in fp32 (on the H100 the profiler showed these
    # casts and adds at about a seventh of a Llama 3 8B-shaped step: calibration/h100_2026-11-22)
    autocast = lay.autocast_casts
    grad_casts = 0.0
    casts_per_mb = 1.0
    if np.any(autocast):
        # (paraplan run holds one autocast region over a pipelined step: each weight cast once a step)
        casts_per_mb = np.where(p > 1, 1.0 / np.maximum(m, 1.0), 1.0)
        ew_fwd = ew_fwd + np.where(autocast, casts_per_mb * autocast_weight_cast_s(gpu, lay.layer_params,
                                                                                   layer_matrices), 0.0)
        grad_casts = np.where(autocast, autocast_grad_s(gpu, lay.layer_params, layer_matrices, m), 0.0)
        ew_bwd = ew_bwd + grad_casts
    return LayerCompute(
        flops=lf, qkv_gemm_s=g_qkv, up_gemm_s=g_up, out_gemm_s=g_out, down_gemm_s=g_down, gemms_forward_s=gemms_fwd,
        gemms_backward_s=gemms_bwd, gemms_wgrad_s=gemms_wgrad, attention_forward_s=attn_fwd,
        attention_backward_s=attn_bwd, elementwise_forward_s=ew_fwd, elementwise_backward_s=ew_bwd, quantize_cast_s=cast, grad_casts_s=grad_casts,
        moe_forward_s=moe_fwd, moe_backward_s=moe_bwd, moe_wgrad_s=moe_wgrad,
        forward_s=gemms_fwd + attn_fwd + ew_fwd + moe_fwd,
        backward_s=gemms_bwd + attn_bwd + ew_bwd + moe_bwd,
        # the weight-gradient GEMMs = one forward's worth, and what lies on the weights' side of
        # them (autocast's gradient casts and fp32 accumulation: a split backward's W pass runs them)
        weight_grad_s=gemms_wgrad + moe_wgrad + grad_casts,
        casts_per_microbatch=casts_per_mb, layer_matrices=layer_matrices, flash=flash, fused=fused,
        tp_chunks=chunks)


def layer_gemm_passes(gpu: GPUSpec, model: ModelSpec, lay: Layout, fused, chunks, prec: Precision | None = None):
    """(QKV, up, out, down forward GEMMs; their forward, backward and weight-gradient totals).

    Each GEMM at the chunks TP overlap splits it into (tp_overlap_chunks): the forward's four,
    and the data gradients (each a forward GEMM's FLOPs) as chunked there; the weight gradients
    whole. `chunks`: tp_overlap_chunks'; `prec`: the GEMMs' precision (the layout's by default)."""
    T, t, w_dense = lay.tokens_per_microbatch, lay.tp, lay.dense_layer_share
    prec = lay.precision if prec is None else prec
    forward_chunks, data_grad_chunks = chunks
    whole = layer_gemms_s(gpu, model, T, t, prec, fused)

    def chunked(chunks):
        """The four GEMMs at `chunks`, priced only for the plans that split one (the rest: whole)."""
        split = functools.reduce(np.logical_or, [np.asarray(c) > 1.0 for c in chunks])
        if not np.any(split):
            return whole
        if np.all(split):
            return layer_gemms_s(gpu, model, T, t, prec, fused, chunks)
        T_, t_, fused_, split_, *chunks_ = np.broadcast_arrays(T, t, fused, split, *chunks)
        part = layer_gemms_s(gpu, model, T_[split_], t_[split_], prec, fused_[split_], [c[split_] for c in chunks_])
        out = [np.array(np.broadcast_to(w, split_.shape), dtype=float) for w in whole]
        for o, p in zip(out, part):
            o[split_] = p
        return tuple(out)
    (g_qkv, g_up, g_out, g_down), (p_qkv, p_up, p_out, p_down) = chunked(forward_chunks), whole
    d_qkv, d_up, d_out, d_down = chunked(data_grad_chunks)
    gemms_fwd = g_qkv + g_out + w_dense * (g_up + g_down)
    gemms_wgrad = p_qkv + p_out + w_dense * (p_up + p_down)
    gemms_bwd = gemms_wgrad + d_qkv + d_out + w_dense * (d_up + d_down)
    return g_qkv, g_up, g_out, g_down, gemms_fwd, gemms_bwd, gemms_wgrad


def _quantize_casts_s(gpu: GPUSpec, model: ModelSpec, workload: Workload, lay: Layout):
    """(forward, backward) time quantizing a layer's GEMM inputs. Transformer Engine casts each
    GEMM input to FP8 (read 2 B, write 1 B) or NVFP4 (low_precision.quantize_bytes_per_element):
    streaming kernels; the backward moves twice the bytes. Row-wise FP8 (low_precision.py)
    quantizes each GEMM input X once more along T and each output gradient G twice, the
    TP-gathered inputs whole on every rank (the same inputs X, per-tensor's cast as SP shards).
    Elements per token: X = h + w·h + a·d/t + f/t (QKV input; the MLP input where a GEMM reads
    it, w the share of layers whose MLP is dense or has shared experts: a routed expert's
    input is cast after the dispatch, in moe.py; out and down inputs), G = (a·d + 2k·d)/t + h +
    n_up·f/t + h (QKV, out, up, down outputs), a dense MLP by its share."""
    prec, T, t, sp_div, w_dense = lay.precision, lay.tokens_per_microbatch, lay.tp, lay.sp_divisor, lay.dense_layer_share
    if prec not in LOW_PRECISIONS:
        return 0.0, 0.0
    h, f, qd, qb = model.hidden_size, model.ffn_hidden_size, model.q_dim, quantize_bytes_per_element(prec)
    x_div = 1.0 if workload.fp8_rowwise else sp_div
    mlp_input_share = 1.0 if model.shared_expert_ffn_hidden_size else w_dense
    x_elems = (1.0 + mlp_input_share) * h / x_div + qd / t + w_dense * f / t
    fwd = memory_bound_time_s(gpu, qb * T * x_elems, 0)
    if not workload.fp8_rowwise:
        return fwd, 2.0 * fwd
    g_elems = model.qkv_params_per_layer / h / t + h + w_dense * ((model.num_mlp_matrices - 1) * f / t + h)
    return fwd, memory_bound_time_s(gpu, qb * T * (x_elems + 2.0 * g_elems), 0)
