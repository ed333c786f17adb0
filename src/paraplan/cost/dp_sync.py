"""Data-parallel gradient synchronisation per step, after the pipeline, on the busiest
stage's weights (the step waits for its reduction), and the per-micro-batch ZeRO-2/3
traffic the stages already hold.

DDP / ZeRO-1 gradient reduction overlaps the last micro-batch's backward (under ZB-H1 its W
pass only); its last bucket (one layer) is exposed (FSDP2 under pipeline schedules: all of
it, after the last backward). ZeRO-1/2 parameter all-gather overlaps the next forward. Under
Adam accumulation (plan.adam_accumulation) every micro-batch's gradients are reduced so, m
times a step.

Legend: d data-parallel degree, c context-parallel degree, t tensor-parallel degree, S the
ZeRO shard group, S_e the experts', R HSDP replicas, L_s layers of the critical stage, m
micro-batches per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num, as_float
from ..plan.axes import Schedule, ZeroStage
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from .comm import Collective, collective_time_s
from .grad_compression import powersgd_reduce_s
from .layout import Layout
from .overlap import LayerTimes
from .stages import StageTimes
from .zero import ZeroTraffic, fsdp2_gather_copy_s, fsdp2_reduce_copy_s


@dataclass(frozen=True, kw_only=True)
class DPSync:
    """A step's data-parallel traffic (seconds): exposed after the pipeline, hidden, and the
    per-micro-batch ZeRO-2/3 traffic inside the stage times."""

    exposed_s: Num
    overlapped_s: Num
    microbatch_exposed_s: Num
    microbatch_overlapped_s: Num
    # PowerSGD's compression kernels after the pipeline (inside exposed_s; 0 without it)
    compression_s: Num = 0.0


def _fsdp2_pp_reduce_s(cluster: ClusterSpec, lay: Layout, kind, group, e_group, moe: bool):
    """FSDP2 under torch's pipeline schedules reduces the accumulated gradients once per step,
    after the stage's last backward (PipelineStage perform_reduce_grad, torch 2.13
    distributed/pipelining/stage.py), one collective per FSDP unit (each layer, then the
    stage root's embedding or head)."""
    t, L_s, reduce_bytes = lay.tp, lay.stage_layers, lay.reduce_bytes_per_param
    layer_grad_bytes = reduce_bytes * lay.layer_params
    grad_bytes = reduce_bytes * lay.params_stage
    runs = dict(block=np.minimum(lay.dp_block, group), outer_stride=lay.dp_outer_stride)
    out = (L_s * collective_time_s(cluster, kind, layer_grad_bytes, group, t, **runs)
           + collective_time_s(cluster, kind, grad_bytes - L_s * layer_grad_bytes, group, t, **runs))
    if moe:
        out = out + L_s * collective_time_s(cluster, kind, reduce_bytes * lay.expert_params, e_group, lay.expert_stride)
    return out


def gradient_collectives_s(cluster: ClusterSpec, plan, lay: Layout, moe: bool):
    """(all-reduce, reduce-scatter, parameter all-gather, HSDP all-reduce, FSDP2 pipeline
    reduce-scatter) of a step's gradients and parameters over the data-parallel groups."""
    t, d, c, S, S_e, R = lay.tp, lay.dp, lay.cp, lay.zero_shard_group, lay.expert_shard_group, lay.hsdp_replicas
    edp, e_stride = lay.edp, lay.expert_stride
    reduce_bytes, gather_bytes = lay.reduce_bytes_per_param, lay.gather_bytes_per_param
    expert_stage, params_stage = lay.head_stage_expert_params, lay.params_stage
    grad_bytes = reduce_bytes * params_stage
    dp_group = d * c
    dp_runs = dict(block=lay.dp_block, outer_stride=lay.dp_outer_stride)
    g_ar = collective_time_s(cluster, Collective.ALL_REDUCE, grad_bytes, dp_group, t, **dp_runs)
    g_rs = collective_time_s(cluster, Collective.REDUCE_SCATTER, grad_bytes, dp_group, t, **dp_runs)
    p_ag = collective_time_s(cluster, Collective.ALL_GATHER, gather_bytes * params_stage, dp_group, t, **dp_runs)
    replica_stride = lay.dp_outer_stride * as_float(plan.dp_shard)
    hsdp_ar = collective_time_s(cluster, Collective.ALL_REDUCE, grad_bytes / S, R, replica_stride)
    if moe:  # expert gradients sync over EDP (HSDP: their shards all-reduced over the replicas too)
        e_grad = reduce_bytes * expert_stage
        hsdp_ar = hsdp_ar + collective_time_s(cluster, Collective.ALL_REDUCE, e_grad / S_e, R, replica_stride)
        g_ar = g_ar + collective_time_s(cluster, Collective.ALL_REDUCE, e_grad, edp, e_stride)
        g_rs = g_rs + collective_time_s(cluster, Collective.REDUCE_SCATTER, e_grad, edp, e_stride)
        p_ag = p_ag + collective_time_s(cluster, Collective.ALL_GATHER, gather_bytes * expert_stage, edp, e_stride)
    # (an all-reduce over the replicas at ZeRO-0 (one-rank shards), a reduce-scatter over the
    # shard group above it (ZeRO-1 runs as ZeRO-2))
    pp_rs = 0.0
    f2_pp = lay.fsdp2_pp
    if np.any(f2_pp):
        pp_rs = _fsdp2_pp_reduce_s(cluster, lay, Collective.REDUCE_SCATTER, S, S_e, moe)
        g_ar = np.where(f2_pp, _fsdp2_pp_reduce_s(cluster, lay, Collective.ALL_REDUCE, dp_group, edp, moe), g_ar)
        g_rs = np.where(f2_pp, pp_rs, g_rs)
    return g_ar, g_rs, p_ag, hsdp_ar, pp_rs


def _reduction_windows(plan, lay: Layout, first: StageTimes):
    """(window the gradient reduction hides behind, window the parameter all-gather hides behind).

    The reduction can start once the last micro-batch's weight gradients appear: under its
    whole backward, but under ZB-H1 only under its W pass, which rank 0 runs after its B
    (Qi et al. 2024 Sec. 3.1, Fig. 3; sim/schedules.py _zero_bubble_h1) (ZB-V's first rank
    ends with the W pass of its first chunk: half its stage's). FSDP2 under pipeline
    schedules reduces after the last backward and waits for it: nothing to hide behind."""
    sc = np.asarray(plan.schedule_code)
    last_bwd = np.where(lay.v_shape, first.weight_grad_s / 2.0,
                        np.where(sc == Schedule.ZERO_BUBBLE.code, first.weight_grad_s, first.backward_s))
    chunks = _interleaved_chunk_windows(sc, lay)
    return np.where(lay.fsdp2_pp, 0.0, chunks * last_bwd), chunks * first.forward_s


def _interleaved_chunk_windows(schedule_code, lay: Layout):
    """How many micro-batches' stage time the reduction (and the next step's gathers) hide
    behind: 1, but under the interleaved schedule ((v − 1)·g + 1)/v. Megatron-Core runs the
    micro-batches in groups of g = p per model chunk (schedules.py get_schedule_table,
    microbatch_group_size_per_vp_stage, 0.16.1): the last group's backward runs chunk v−1 for
    its g micro-batches, then chunk v−2, ..., chunk 0 last, and each chunk's reduction is
    launched after its last backward (backward_step_helper, grad_sync_func), so the first v−1
    chunks' reductions run under the g·(v−1)/v stage backwards that follow, the last chunk's
    under its own last one; the forward gathers chunk k+1's parameters as chunk k's first
    micro-batch starts (param_sync_func), mirrored."""
    v, g = lay.vp, np.minimum(lay.pp, np.maximum(lay.num_microbatches, 1.0))
    interleaved = (np.asarray(schedule_code) == Schedule.INTERLEAVED_1F1B.code) & (v > 1)
    return np.where(interleaved, ((v - 1.0) * g + 1.0) / v, 1.0)


def _fsdp2_step_copies_s(gpu, lay: Layout, z: ZeroTraffic, moe: bool):
    """(gather, reduce) copies: FSDP2 at ZeRO-0/1/2 gathers the parameters once per step (resharded after the
    backward) and reduces the gradients once per step where it does not per micro-batch:
    their copies."""
    gather_bytes, reduce_bytes = lay.gather_bytes_per_param, lay.reduce_bytes_per_param
    params_stage, expert_stage = lay.params_stage, lay.head_stage_expert_params
    step_gather = (fsdp2_gather_copy_s(gpu, gather_bytes * params_stage, lay.optimizer_shard)
                   + (fsdp2_gather_copy_s(gpu, gather_bytes * expert_stage, lay.expert_optimizer_shard) if moe else 0.0))
    step_reduce = (fsdp2_reduce_copy_s(gpu, reduce_bytes * params_stage, lay.optimizer_shard)
                   + (fsdp2_reduce_copy_s(gpu, reduce_bytes * expert_stage, lay.expert_optimizer_shard) if moe else 0.0))
    f2 = lay.fsdp2
    return np.where(f2 & ~lay.zero3, step_gather, 0.0), np.where(f2 & ~z.microbatch_reduce, step_reduce, 0.0)


def _powersgd(cluster: ClusterSpec, model: ModelSpec, lay: Layout, g_ar):
    """(ZeRO-0's reduction, compression kernels): DDP's PowerSGD hook where the plan runs it
    (cost/grad_compression.py), else the all-reduce as it was and no kernels."""
    psgd = lay.powersgd_rank > 0.0
    if not np.any(psgd):
        return g_ar, 0.0
    comm, kernels = powersgd_reduce_s(cluster, model, lay, lay.dp * lay.cp, lay.tp,
                                      dict(block=lay.dp_block, outer_stride=lay.dp_outer_stride))
    return np.where(psgd, comm, g_ar), np.where(psgd, kernels, 0.0)


def dp_sync(cluster: ClusterSpec, model: ModelSpec, plan, lay: Layout, first: StageTimes, z: ZeroTraffic,
            layer: LayerTimes, moe: bool) -> DPSync:
    """The step's data-parallel traffic by ZeRO stage, what overlaps, and what it slows."""
    gpu, zc, R, m, L_s = cluster.gpu, lay.zero_code, lay.hsdp_replicas, lay.num_microbatches, lay.stage_layers
    g_ar, g_rs, p_ag, hsdp_ar, pp_rs = gradient_collectives_s(cluster, plan, lay, moe)
    # the hook's all-reduces overlap the backward as DDP's do; its kernels run on the compute
    # stream between the backward's (DDP calls the hook as each bucket is ready): exposed
    g_ar, compression = _powersgd(cluster, model, lay, g_ar)
    ovl = np.asarray(plan.dp_overlap, dtype=bool)
    red_window, last_fwd = _reduction_windows(plan, lay, first)
    last_bucket = 1.0 / np.maximum(L_s, 1.0)

    def hide(comm, window):
        exposed = np.maximum(comm - window, comm * last_bucket)
        return np.where(ovl, exposed, comm), np.where(ovl, comm - exposed, 0.0)
    z0_exp, z0_ovl = hide(g_ar, red_window)
    z1_rs_exp, z1_rs_ovl = hide(g_rs, red_window)
    if np.any(lay.adam_accumulation):
        # Adam accumulation folds each micro-batch's reduced gradient (AdamA, Zhang et al. 2023):
        # m reductions a step, as DDP without no_sync, each under its micro-batch's backward
        n_red = np.where(lay.adam_accumulation, m, 1.0)
        z0_exp, z0_ovl, z1_rs_exp, z1_rs_ovl = (n_red * x for x in (z0_exp, z0_ovl, z1_rs_exp, z1_rs_ovl))
    z1_ag_exp, z1_ag_ovl = hide(p_ag, last_fwd)
    z3_hsdp_exp, z3_hsdp_ovl = hide(hsdp_ar, red_window)
    is_z1 = zc == ZeroStage.OPTIMIZER.code
    is_z0 = zc == ZeroStage.NONE.code
    is_z2 = lay.zero2
    dp_exposed = np.where(is_z0, z0_exp,
                 np.where(is_z1, z1_rs_exp + z1_ag_exp,
                 np.where(is_z2, z1_ag_exp, np.where(R > 1, z3_hsdp_exp, 0.0))))
    dp_overlapped_step = np.where(is_z0, z0_ovl,
                         np.where(is_z1, z1_rs_ovl + z1_ag_ovl,
                         np.where(is_z2, z1_ag_ovl, np.where(R > 1, z3_hsdp_ovl, 0.0))))
    # the hidden part still slows the backward it runs under (NCCL's SMs; a CPU's cores),
    # as for per-layer overlap; counted as DP time
    dp_exposed = dp_exposed + gpu.overlap_slowdown * dp_overlapped_step
    # ZeRO-2/3 reduced per micro-batch elsewhere; under pipeline schedules once, here
    dp_exposed = dp_exposed + np.where(lay.fsdp2_pp & (zc >= ZeroStage.GRADIENTS.code), pp_rs, 0.0)
    if bool(np.any(lay.fsdp2)):
        step_gather, step_reduce = _fsdp2_step_copies_s(gpu, lay, z, moe)
        dp_exposed = dp_exposed + step_gather + step_reduce
    dp_exposed = dp_exposed + compression
    # nothing to reduce with one data-parallel rank, unless experts replicate over their EDP
    dp_exposed = np.where((lay.dp * lay.cp > 1) | ((lay.edp > 1) if moe else False), dp_exposed, 0.0)
    # per-micro-batch ZeRO-2/3 exposed traffic is already inside the stage times
    z3_fwd_exp, z3_bwd_exp = layer.zero_forward_exposed_s, layer.zero_backward_exposed_s
    return DPSync(exposed_s=dp_exposed, overlapped_s=dp_overlapped_step,
                  microbatch_exposed_s=(m * L_s * (z3_fwd_exp + z3_bwd_exp + z.grad_compression_s)
                                        + m * 2.0 * z.first_gather_s),
                  microbatch_overlapped_s=m * L_s * ((z.forward_s - z3_fwd_exp) + (z.backward_s - z3_bwd_exp)),
                  compression_s=compression)
