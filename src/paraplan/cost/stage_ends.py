"""The ends of the pipeline per micro-batch: the embedding, the LM head with its loss, and
the multi-token-prediction modules beside the head.

Legend: T tokens per micro-batch on one CP rank, t tensor-parallel degree, h hidden size,
V vocabulary, D multi-token-prediction modules, L_s layers of the critical stage, m
micro-batches per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from ..plan.axes import Recompute
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision
from . import memory as mem
from .comm import Collective, collective_time_s
from .layer_compute import LayerCompute, autocast_grad_s, autocast_weight_cast_s
from .layout import Layout
from .low_precision import head_precision
from .overlap import LayerTimes
from .roofline import elementwise_time_s, gemm_time_s, memory_bound_time_s, rows_aligned
from .tp import TPComm
from .zero import ZeroTraffic, fsdp2_accumulate

LOSS_FWD_KERNELS, LOSS_BWD_KERNELS = 3, 4  # upcast, max/sum-exp, write; fill, scatter, log-softmax bwd, downcast
# an eager loss over a vocabulary split by TP, op by op (Plan.loss_parallel: torch's
# loss_parallel, torchtitan 0.3's _LossParallelCrossEntropy): forward upcast, amax, subtract, exp, sum, log,
# subtract; backward zeros, index-put, exp, add, where, multiply, downcast
PARALLEL_LOSS_FWD_KERNELS, PARALLEL_LOSS_BWD_KERNELS = 7, 7
# vocab-parallel cross-entropy's all-reduces of one fp32 value per token: the logits' max,
# the target logit, the sum of exponentials (Megatron-Core 0.16.1 tensor_parallel/
# cross_entropy.py; torch 2.13's loss_parallel the same three)
VOCAB_PARALLEL_CE_ALL_REDUCES = 3


def loss_bytes_per_logit(precision: Precision) -> tuple[float, float]:
    """Cross-entropy over the T×V/t logits, HBM bytes per logit element (forward, backward),
    as PyTorch autocast (and Megatron's vocab-parallel kernel) run it in fp32. Forward: upcast
    16-bit logits (read 2, write 4), log-softmax (two reads for max and sum-exp, one write:
    12). Backward: the NLL gradient fill (write 4), log-softmax backward (reads the gradient
    twice and the output once, writes one: 16), downcast to 16 bits (read 4, write 2). 32-bit
    logits skip both casts: 18 and 26 bytes at 16 bits, 12 and 20 at 32."""
    return 12.0 + _loss_cast_bytes(precision), 20.0 + _loss_cast_bytes(precision)


def _loss_cast_bytes(precision: Precision) -> float:
    """A 16-bit logit's up-cast to fp32 (read 2, write 4) or its gradient's down-cast (read
    4, write 2): 6 bytes; none for 32-bit logits."""
    return 0.0 if precision.activation_bytes >= 4.0 else 6.0


def parallel_loss_bytes_per_logit(precision: Precision) -> tuple[float, float]:
    """The same under torch's loss_parallel, whose ops are not fused (PARALLEL_LOSS_*_KERNELS):
    forward amax (read 4), subtract (8), exp (8), sum (4), subtract (8) = 32; backward zeros
    (write 4), exp (8), add (12), multiply (8) = 32; and the casts as above."""
    return 32.0 + _loss_cast_bytes(precision), 32.0 + _loss_cast_bytes(precision)


def _loss_s(gpu, lay: Layout, logits_el):
    """(forward, backward) of the cross-entropy over `logits_el` logits: eager kernels
    (loss_bytes_per_logit; op by op over TP where lay.loss_parallel), at the loss's measured
    share, or under torch.compile (lay.compiled_loss) one fused kernel each way at the fused
    kernels' share: the forward reads the logits twice (their max, then the sum of
    exponentials), the backward reads them once and writes their gradient, in their dtype."""
    loss_fwd_b, loss_bwd_b = loss_bytes_per_logit(lay.precision)
    eager_fwd = memory_bound_time_s(gpu, logits_el * loss_fwd_b, LOSS_FWD_KERNELS, gpu.loss_bw_efficiency)
    eager_bwd = memory_bound_time_s(gpu, logits_el * loss_bwd_b, LOSS_BWD_KERNELS, gpu.loss_bw_efficiency)
    split = lay.loss_parallel
    if np.any(split):
        par_fwd_b, par_bwd_b = parallel_loss_bytes_per_logit(lay.precision)
        eager_fwd = np.where(split, memory_bound_time_s(gpu, logits_el * par_fwd_b, PARALLEL_LOSS_FWD_KERNELS,
                                                        gpu.loss_bw_efficiency), eager_fwd)
        eager_bwd = np.where(split, memory_bound_time_s(gpu, logits_el * par_bwd_b, PARALLEL_LOSS_BWD_KERNELS,
                                                        gpu.loss_bw_efficiency), eager_bwd)
    if not np.any(lay.compiled_loss):
        return eager_fwd, eager_bwd
    compiled = elementwise_time_s(gpu, logits_el * 2.0 * lay.act_bytes_per_element)
    return np.where(lay.compiled_loss, compiled, eager_fwd), np.where(lay.compiled_loss, compiled, eager_bwd)


@dataclass(frozen=True, kw_only=True)
class StageEnds:
    """The embedding's and the head's time per micro-batch (seconds), on the stages that hold them."""

    embedding_forward_s: Num   # with its TP reduction
    embedding_backward_s: Num  # with its gradient accumulation
    head_forward_s: Num        # the head, the loss and the MTP modules
    head_backward_s: Num


def _head_s(cluster: ClusterSpec, model: ModelSpec, lay: Layout, tp: TPComm, fused):
    """(forward, backward) of the LM head and its loss, with their TP collectives."""
    gpu, T, t, sp, ab = cluster.gpu, lay.tokens_per_microbatch, lay.tp, lay.sequence_parallel, lay.act_bytes_per_element
    V, h, tp_host = model.vocab_size, model.hidden_size, tp.host_s
    ag, rs, ar = tp.all_gather_s, tp.reduce_scatter_s, tp.all_reduce_s
    # the head's vocabulary as the engine has it: Megatron pads it to a multiple of 128·TP
    # (--make-vocab-size-divisible-by); an eager model keeps the tokenizer's, and a 16-bit
    # vocabulary of 50,257 misaligns every pass of the head (roofline.rows_aligned)
    lm_aligned = fused | rows_aligned(V / t, ab)
    lm_gemm = gemm_time_s(gpu, T, V / t, h, head_precision(lay.precision), aligned=lm_aligned)
    logits_el = T * V / t
    loss_fwd, loss_bwd = _loss_s(gpu, lay, logits_el)
    ce_tp = VOCAB_PARALLEL_CE_ALL_REDUCES * (collective_time_s(cluster, Collective.ALL_REDUCE, mem.MASTER_BYTES * T, t, 1)
                                             + tp_host)
    # the column-parallel head gathers its sequence-parallel input; backward reduce-scatters
    # (SP) or all-reduces (no SP) the input gradient
    lm_fwd = lm_gemm + loss_fwd + np.where(sp, ag + tp_host, 0.0) + ce_tp
    # backward kernels: gradient fill, NLL scatter, log-softmax backward, downcast
    # (asynchronously beside the head's weight-gradient GEMM where the layers do so too)
    head_red = np.where(sp, rs, ar)
    head_red = np.where(tp.async_backward, np.maximum(head_red - lm_gemm, 0.0), head_red)
    lm_bwd = 2.0 * lm_gemm + loss_bwd + head_red + tp_host
    return lm_fwd, lm_bwd


def _autocast_ends_s(gpu, model: ModelSpec, lay: Layout, casts_per_mb):
    """(head forward, head backward, embedding backward) autocast adds where the plan casts."""
    # the head's weight is cast like the layers' (a tied head casts the embedding table);
    # the embedding's own gradient is fp32 already (F.embedding is not autocast): only
    # accumulated, and a tied table's gradients from both uses land in the one .grad
    autocast, t, m = lay.autocast_casts, lay.tp, lay.num_microbatches
    tied = model.tied_embeddings
    head_params = model.output_weight_params / t
    head_fwd = np.where(autocast, casts_per_mb * autocast_weight_cast_s(gpu, head_params, 1.0), 0.0)
    # (a tied table on one stage gets two gradients, the head's and the embedding's: the
    # first micro-batch adds them into one sum too, so every micro-batch adds, 12 B per
    # parameter, where autocast_grad_s counts the m - 1 accumulations)
    both = np.where(lay.single_stage, memory_bound_time_s(gpu, 12.0 * head_params, 1.0) / np.maximum(m, 1.0),
                    0.0) if tied else 0.0
    head_bwd = np.where(autocast, autocast_grad_s(gpu, head_params, 1.0, m) + both, 0.0)
    emb_bwd = np.where(autocast, autocast_grad_s(gpu, model.embedding_params / t, 1.0, m, cast=False), 0.0)
    return head_fwd, head_bwd, emb_bwd


def stage_ends(cluster: ClusterSpec, model: ModelSpec, lay: Layout, lc: LayerCompute, tp: TPComm, z: ZeroTraffic,
               layer: LayerTimes, recompute_stage_s) -> StageEnds:
    """The embedding, the head and loss, and the MTP modules (`recompute_stage_s`: the
    stage's recomputation per micro-batch, of which an MTP block re-runs a layer's share)."""
    gpu, T, t, sp, h = cluster.gpu, lay.tokens_per_microbatch, lay.tp, lay.sequence_parallel, model.hidden_size
    emb_fwd = memory_bound_time_s(gpu, 2.0 * lay.act_bytes_per_element * T * h, 2)
    # vocab-parallel embedding: forward reduces over TP; under SP its reduce-scatter's
    # backward is an all-gather of the output gradient (without SP the all-reduce's is none)
    emb_tp = np.where(sp, tp.reduce_scatter_s, tp.all_reduce_s) + tp.host_s
    emb_tp_bwd = np.where(sp, tp.all_gather_s + tp.host_s, 0.0)
    lm_fwd, lm_bwd = _head_s(cluster, model, lay, tp, lc.fused)
    # multi-token prediction (DeepSeek-V3 report Sec. 2.2): after the head, per module the
    # next token's embedding, the projection M_k (T × 2h -> h/t, column-parallel), one block
    # priced as the stage's average layer (an MoE layer in an MoE model) and the shared head and
    # loss again (without the head's own gradient accumulation, counted once below)
    # (with the vocab-parallel embedding's collectives; the block recomputed as a layer of the
    # stage is under full, selective and module recomputation, not under first-k's block method)
    D = model.mtp_layers
    mtp_fwd = mtp_bwd = 0.0
    if D:
        mtp_proj = gemm_time_s(gpu, T, h / t, 2.0 * h, lay.precision)
        mtp_rc = np.where(lay.recompute_code == Recompute.FIRST_K.code, 0.0, recompute_stage_s / lay.stage_layers)
        mtp_fwd = D * (emb_fwd + emb_tp + mtp_proj + layer.forward_s + lm_fwd)
        mtp_bwd = D * (emb_fwd + emb_tp_bwd + 2.0 * mtp_proj + layer.backward_s + mtp_rc + lm_bwd)
    # the embedding's and the head's (with the final norm) gradient accumulation under FSDP2
    emb_acc = fsdp2_accumulate(gpu, lay, z, model.embedding_params / t, 1.0)
    head_acc = fsdp2_accumulate(gpu, lay, z, model.lm_head_params / t + h, 2.0)  # (the final norm is not split by TP)
    if np.any(lay.autocast_casts):
        head_fwd_cast, head_bwd_cast, emb_bwd_cast = _autocast_ends_s(gpu, model, lay, lc.casts_per_microbatch)
        lm_fwd = lm_fwd + head_fwd_cast
        head_acc = head_acc + head_bwd_cast
        emb_acc = emb_acc + emb_bwd_cast
    emb_bwd_total = emb_fwd + emb_tp_bwd + emb_acc
    lm_bwd = lm_bwd + head_acc
    if D:
        lm_fwd, lm_bwd = lm_fwd + mtp_fwd, lm_bwd + mtp_bwd
    return StageEnds(embedding_forward_s=emb_fwd + emb_tp, embedding_backward_s=emb_bwd_total,
                     head_forward_s=lm_fwd, head_backward_s=lm_bwd)
