"""ZeRO-3 / FSDP traffic of one layer per micro-batch, and FSDP2's copies around it.

ZeRO-3/FSDP gathers and reduce-scatters overlap the neighbouring layer as it runs (compute
plus its exposed TP/CP; prefetch); the first gather of each pass is exposed.

Legend: S the ZeRO shard group (dp_shard·c), S_e the experts' shard group, B bytes of one
collective, m micro-batches per step, p pipeline stages, v model chunks per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num, as_float
from ..plan.axes import Schedule, ZeroStage
from ..sim.schedules import ScheduleError, fsdp2_gathers_per_step
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from . import memory as mem
from .comm import Collective, collective_time_s
from .grad_compression import qgz_reduce_scatter_s
from .layout import Layout
from .roofline import elementwise_time_s, memory_bound_time_s


def fsdp2_gather_copy_s(gpu, gathered_bytes, shard):
    """What FSDP2's copies around one all-gather of `gathered_bytes` over `shard` ranks add to
    the step, at the element-wise rate (torch 2.13 torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py foreach_all_gather, _fsdp_param_group.py wait_for_unshard): the
    output out to the unsharded parameters on the compute stream (split_with_sizes_copy: read
    + write B; a one-rank group copies its shard straight in, the same bytes), and the shards
    into the flat input on a side stream (all_gather_copy_in: read + write B/S), which slows
    concurrent compute by overlap_slowdown of its time as communication does."""
    B, S = np.asarray(gathered_bytes, dtype=float), np.asarray(shard, dtype=float)
    side = np.where(S > 1, elementwise_time_s(gpu, 2.0 * B / np.maximum(S, 1.0), 1), 0.0)
    return elementwise_time_s(gpu, 2.0 * B, 1) + gpu.overlap_slowdown * side


def fsdp2_reduce_copy_s(gpu, reduced_bytes, shard):
    """... and around one gradient reduction over `shard` ranks (foreach_reduce): the gradients
    into the flat reduce-scatter input on the compute stream (chunk_cat: read + write B), the
    reduced shard being a view of the output; a one-rank group then copies the input to the
    output on the reduce-scatter stream (read + write B, at overlap_slowdown)."""
    B, S = np.asarray(reduced_bytes, dtype=float), np.asarray(shard, dtype=float)
    side = np.where(S > 1, 0.0, elementwise_time_s(gpu, 2.0 * B, 1))
    return elementwise_time_s(gpu, 2.0 * B, 1) + gpu.overlap_slowdown * side


def fsdp2_pp_gathers_per_pass(plan, m, z3, rows=None):
    """All-gathers per layer and pass (forward or backward) under FSDP2 in torch's pipeline
    schedules, on average over the step, for the plans of `plan` (a Plan or PlanBatch; only
    the `rows` of a batch where given, 0 elsewhere) with m micro-batches: at ZeRO-3 (`z3`) all
    of them, below it the ones beyond the step's first (which the per-step gather already
    prices). The count per step is sim/schedules.py fsdp2_gathers_per_step's, read from the
    schedule's task order (cost reads the schedules as data; sim never imports cost)."""
    shape = np.broadcast_shapes(*(np.shape(x) for x in (m, plan.schedule_code, plan.pp, plan.vp, z3,
                                                         True if rows is None else rows)))
    m = np.broadcast_to(np.asarray(m, dtype=float), shape).ravel()
    sched = np.broadcast_to(np.asarray(plan.schedule_code), shape).ravel()
    p = np.broadcast_to(as_float(plan.pp), shape).ravel()
    v = np.broadcast_to(as_float(plan.vp), shape).ravel()
    z3 = np.broadcast_to(np.asarray(z3, dtype=bool), shape).ravel()
    rows = np.ones(len(m), dtype=bool) if rows is None else np.broadcast_to(rows, shape).ravel()
    out = np.zeros(len(m))
    if rows.any():
        keys = np.stack([x[rows].astype(np.int64) for x in (sched, p, v, m, z3)], axis=1)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        counted = np.empty(len(uniq))
        for j, (code, pp, vp, mm, zz) in enumerate(uniq):
            try:
                n = fsdp2_gathers_per_step(Schedule.from_code(code), int(pp), int(mm), int(vp), bool(zz))
            except ScheduleError:  # a schedule its micro-batches cannot run: an invalid plan of a
                counted[j] = np.nan  # search's grid (plan/space.py SpaceBlock.grid), dropped there
                continue
            counted[j] = (n - (0 if zz else vp)) / (2.0 * mm * vp)
        out[rows] = counted[inverse.ravel()]
    return out.reshape(shape) if shape else float(out[0])


def fsdp2_accumulate_s(gpu, params, tensors, reduce_bytes_per_param, param_bytes_per_param, m):
    """FSDP2's gradient accumulation across the m micro-batches of a step it does not reduce
    in between, per micro-batch, of `params` parameters in `tensors` tensors: the first
    backward's gradient cast to the reduce dtype where it differs (to_accumulated_grad_if_needed:
    read 16-bit, write the reduce dtype; else autograd leaves it in .grad), each later one added
    in (accumulate_unsharded_grad_if_needed: read both, write the sum), one kernel per parameter
    tensor (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param.py). Averaged over the
    m micro-batches."""
    m = np.asarray(m, dtype=float)
    params = np.asarray(params, dtype=float)
    rb, pb = np.asarray(reduce_bytes_per_param), np.asarray(param_bytes_per_param)
    first = np.where(rb != pb, elementwise_time_s(gpu, (pb + rb) * params, tensors), 0.0)
    later = elementwise_time_s(gpu, (pb + 2.0 * rb) * params, tensors)
    return (first + (m - 1.0) * later) / np.maximum(m, 1.0)


@dataclass(frozen=True, kw_only=True)
class ZeroTraffic:
    """A layer's ZeRO-3/FSDP traffic per micro-batch (seconds), before overlap."""

    all_gather_s: Num       # one layer's parameters gathered over the shard group
    gathered_cast_s: Num    # fp32 shards: each gathered weight cast to 16 bits, per forward
    gathers_per_pass: Num
    microbatch_reduce: Num  # gradients reduced per micro-batch (ZeRO-2/3 outside pipeline FSDP2)
    accumulate: Num         # FSDP2 accumulates gradients unsharded across micro-batches
    fsdp2_forward_s: Num    # FSDP2's copies (and accumulation) per layer
    fsdp2_backward_s: Num
    forward_s: Num
    backward_s: Num
    first_gather_s: Num     # the first gather of a pass, which nothing prefetches
    grad_compression_s: Num = 0.0  # qgZ's quantize / dequantize kernels per layer backward (exposed)


def fsdp2_accumulate(gpu, lay: Layout, z: ZeroTraffic, params, tensors):
    """FSDP2's gradient accumulation per micro-batch of `params` in `tensors` tensors, where it applies."""
    if not np.any(z.accumulate):
        return 0.0
    return np.where(z.accumulate, fsdp2_accumulate_s(gpu, params, tensors, lay.reduce_bytes_per_param,
                                                     lay.gather_bytes_per_param, lay.num_microbatches), 0.0)


def _qgz(cluster: ClusterSpec, model: ModelSpec, lay: Layout, fsdp_rs):
    """(reduce-scatter, kernels) of a layer's gradients: ZeRO++ qgZ's int4 all-to-alls where the
    plan runs it across nodes (cost/grad_compression.py), else the reduce-scatter as it was."""
    if not np.any(lay.qgz):
        return fsdp_rs, 0.0
    comm, kernels, multi_node = qgz_reduce_scatter_s(cluster, model, lay)
    on = lay.qgz & multi_node
    return np.where(on, comm, fsdp_rs), np.where(on, kernels, 0.0)


def _shard_collectives_s(cluster: ClusterSpec, lay: Layout, moe: bool):
    """(all-gather, reduce-scatter) of one layer's parameters and gradients over the shard groups."""
    t, S, S_e, e_stride = lay.tp, lay.zero_shard_group, lay.expert_shard_group, lay.expert_stride
    layer_params, expert_params = lay.layer_params, lay.expert_params
    gather_bytes, reduce_bytes = lay.gather_bytes_per_param, lay.reduce_bytes_per_param
    # the shard group: dp_shard·c ranks, runs of c when data parallelism is outermost
    s_runs = dict(block=np.minimum(lay.dp_block, S), outer_stride=lay.dp_outer_stride)
    fsdp_ag = collective_time_s(cluster, Collective.ALL_GATHER, gather_bytes * layer_params, S, t, **s_runs)
    fsdp_rs = collective_time_s(cluster, Collective.REDUCE_SCATTER, reduce_bytes * layer_params, S, t, **s_runs)
    if moe:
        fsdp_ag = fsdp_ag + collective_time_s(cluster, Collective.ALL_GATHER, gather_bytes * expert_params, S_e, e_stride)
        fsdp_rs = fsdp_rs + collective_time_s(cluster, Collective.REDUCE_SCATTER, reduce_bytes * expert_params, S_e, e_stride)
    return fsdp_ag, fsdp_rs


def _fsdp2_copies_s(gpu, model: ModelSpec, lay: Layout, moe: bool, gathers, mb_reduce, accumulate, layer_matrices):
    """(forward, backward) of FSDP2's copies around a layer's collectives and its accumulation."""
    S, S_e, f2 = lay.zero_shard_group, lay.expert_shard_group, lay.fsdp2
    layer_params, expert_params = lay.layer_params, lay.expert_params
    gather_bytes, reduce_bytes = lay.gather_bytes_per_param, lay.reduce_bytes_per_param
    f2_gather = (fsdp2_gather_copy_s(gpu, gather_bytes * layer_params, S)
                 + (fsdp2_gather_copy_s(gpu, gather_bytes * expert_params, S_e) if moe else 0.0))
    f2_reduce = (fsdp2_reduce_copy_s(gpu, reduce_bytes * layer_params, S)
                 + (fsdp2_reduce_copy_s(gpu, reduce_bytes * expert_params, S_e) if moe else 0.0))
    f2_fwd = np.where(f2, gathers * f2_gather, 0.0)
    # a layer's weights as the FSDP2 engines build them: wq, wk, wv, wo, the MLP's
    # matrices, the norms
    f2_acc = 0.0
    if np.any(accumulate):
        f2_acc = np.where(accumulate, fsdp2_accumulate_s(
            gpu, layer_params + expert_params, layer_matrices + model.norm_params_per_layer / model.hidden_size,
            reduce_bytes, gather_bytes, lay.num_microbatches), 0.0)
    f2_bwd = f2_fwd + np.where(f2 & mb_reduce, f2_reduce, 0.0) + f2_acc
    return f2_fwd, f2_bwd


def zero_traffic(cluster: ClusterSpec, model: ModelSpec, plan, lay: Layout, moe: bool,
                 layer_matrices: float) -> ZeroTraffic:
    """A layer's ZeRO-3/FSDP gathers and reductions per micro-batch, and FSDP2's copies."""
    gpu = cluster.gpu
    m, zc, is_z3 = lay.num_microbatches, lay.zero_code, lay.zero3
    fsdp_ag, fsdp_rs = _shard_collectives_s(cluster, lay, moe)
    fsdp_rs, qgz_kernels = _qgz(cluster, model, lay, fsdp_rs)
    # fp32 shards: autocast casts each gathered weight to 16 bits at every use (read 4 B,
    # write 2 B per parameter), once per forward and again in a recomputed forward
    # (a 32-bit workload computes on the gathered weights as they are)
    cast = np.where(lay.casts_gathered & (zc == ZeroStage.PARAMETERS.code),
                    memory_bound_time_s(gpu, (mem.MASTER_BYTES + mem.WEIGHT_BYTES)
                                        * (lay.layer_params + lay.expert_params), 4), 0.0)
    # FSDP2 (plan.fsdp2_copies) copies around each of these collectives, streaming kernels
    # priced like the layer's element-wise ones (they write fresh buffers)
    # (not re-run by recomputation: the backward's own gather brings the weights). Host-issued
    # kernels on the layer's critical path: added after the overlap windows, which
    # they neither widen nor shrink
    f2, f2_pp = lay.fsdp2, lay.fsdp2_pp
    # per-layer gathers per pass: one at ZeRO-3; FSDP2 under torch's pipeline schedules keeps
    # what a backward gathered (about (m+1)/(2m) at ZeRO-3) and, at ZeRO-1/2, gathers again
    # only the chunks it evicted (ZeRO-1 runs on FSDP2 as ZeRO-2; ZeRO-0's one-rank shards
    # only copy, not counted)
    gathers = np.where(is_z3, 1.0, 0.0)
    regather = f2_pp & (zc >= ZeroStage.OPTIMIZER.code)
    if np.any(regather):
        gathers = np.where(regather, fsdp2_pp_gathers_per_pass(plan, m * np.ones_like(lay.tp), is_z3, rows=regather),
                           gathers)
    # per-micro-batch reduction (ZeRO-2/3), except FSDP2 under pipeline schedules: once per step
    mb_reduce = (is_z3 | lay.zero2) & ~f2_pp
    # gradients accumulated unsharded across micro-batches (ZeRO-0/1, and 2/3 under pipeline
    # schedules): the first cast to the reduce dtype, then one add per micro-batch
    accumulate = f2 & ~mb_reduce & (m > 1)
    f2_fwd = f2_bwd = 0.0
    if bool(np.any(f2)):  # (the search's batches are not on FSDP2 unless an engine says so)
        f2_fwd, f2_bwd = _fsdp2_copies_s(gpu, model, lay, moe, gathers, mb_reduce, accumulate, layer_matrices)
    return ZeroTraffic(all_gather_s=fsdp_ag, gathered_cast_s=cast, gathers_per_pass=gathers,
                       microbatch_reduce=mb_reduce, accumulate=accumulate,
                       fsdp2_forward_s=f2_fwd, fsdp2_backward_s=f2_bwd,
                       forward_s=gathers * fsdp_ag,
                       backward_s=gathers * fsdp_ag + np.where(mb_reduce, fsdp_rs, 0.0),
                       first_gather_s=gathers * fsdp_ag,
                       grad_compression_s=np.where(mb_reduce, qgz_kernels, 0.0) if np.any(lay.qgz) else 0.0)
