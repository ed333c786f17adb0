"""Assemble per-micro-batch stage times, communication, memory and the step time of plans.

One code path for one plan (`estimate`) and for millions (`search`): plan fields may be
ints or numpy arrays. `evaluate` is a composition of the cost model's parts, each a module
of this package returning a small frozen value: a layer's compute (layer_compute.py), its
TP, CP and EP communication (tp.py, cp.py, ep.py), ZeRO/FSDP traffic (zero.py),
recomputation (recompute.py), the layer with its overlap (overlap.py), the pipeline's ends
(stage_ends.py), the stages with their host waits (stages.py, host.py), the pipeline
(pipeline.py, bubbles.py), data-parallel sync (dp_sync.py), the optimizer (optimizer.py),
memory (stage_memory.py) and hardware FLOPs (hardware_flops.py). What overlaps with what
is in docs/model.md, "What overlaps".

Legend: m micro-batches per step, L_s layers of the critical stage, D multi-token-prediction
modules, t_max the critical stage's time per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from ..plan.axes import Recompute
from ..report import labels
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .breakdown import MemoryBreakdown, OverlappedComm, TimeBreakdown
from .activation_offload import ActivationOffload, activation_offload, offloaded_layers
from .bubbles import dualpipev_bubble_s, zbv_bubble_s
from .cp import CPComm, cp_comm
from .dp_sync import DPSync, dp_sync
from .ep import EPComm, ep_comm, ep_overlapped
from .hardware_flops import hardware_flops_per_step
from .host import HOST_FORWARD_SHARE, eager_host_wait, host_idle_s, split_host_s
from .layer_compute import EW_BWD_KERNELS, EW_FWD_KERNELS, LayerCompute, elementwise_bytes_per_token, layer_compute
from .layout import Layout, end_chunk_slots, layout
from .low_precision import recipe_cluster
from .moe import MoELayerCosts, moe_layer_costs
from .optimizer import ADAM_STEP, optimizer_step_s
from .overlap import LayerTimes, layer_times
from .pipeline import PipelineCosts, critical_stage, pipeline
from .recompute import Recomputation, recomputation
from .stage_ends import LOSS_BWD_KERNELS, LOSS_FWD_KERNELS, loss_bytes_per_logit, stage_ends
from .stage_memory import plan_memory, plan_memory_total, stage_memory
from .stages import Stages, StageTimes, stage_times
from .tp import TPComm, sp_norm_grad_all_reduce_s, tp_collectives_per_pass, tp_comm
from .zero import (ZeroTraffic, fsdp2_gather_copy_s, fsdp2_pp_gathers_per_pass, fsdp2_reduce_copy_s,
                   zero_traffic)

# (names other packages read from here: the CLI, calibrate/profile.py, the tests)
__all__ = ["ADAM_STEP", "EW_BWD_KERNELS", "EW_FWD_KERNELS", "HOST_FORWARD_SHARE", "LOSS_BWD_KERNELS",
           "LOSS_FWD_KERNELS", "Layout", "PlanCosts", "StageTimes", "dualpipev_bubble_s", "eager_host_wait",
           "elementwise_bytes_per_token", "end_chunk_slots", "evaluate", "fsdp2_gather_copy_s",
           "fsdp2_pp_gathers_per_pass", "fsdp2_reduce_copy_s", "host_idle_s", "layout", "loss_bytes_per_logit",
           "plan_memory", "plan_memory_total", "split_host_s", "tp_collectives_per_pass", "zbv_bubble_s"]


@dataclass(frozen=True, kw_only=True)
class PlanCosts:
    """Everything the cost model knows about a plan (or a batch of plans)."""

    num_microbatches: Num
    first: StageTimes
    middle: StageTimes
    last: StageTimes
    p2p_s: Num                    # one activation hand-off between consecutive stages
    time: TimeBreakdown           # closed-form step (search); estimate() re-times the pipeline
    overlapped: OverlappedComm
    memory: MemoryBreakdown
    host_bytes: Num               # host DRAM per GPU (offloaded optimizer), worst stage
    dp_step_s: Num                # exposed DP comm, SP norm-gradient all-reduce and optimizer, after the pipeline
    critical_stage_s: Num         # m × the slowest stage's per-micro-batch time (no bubble)
    step_detail: dict             # dp_step_s by part, in the order they run after the pipeline (for the trace)
    comm_detail: dict             # per-collective totals per step (exposed, seconds)
    hardware_flops_per_step: Num
    layer_detail: dict            # per-layer op times (forward/backward; "wgrad": ZB-H1's W inside "bwd"), for the trace

    @property
    def step_time_s(self):
        return self.time.total


@dataclass(frozen=True, kw_only=True)
class _Parts:
    """The parts of one evaluation, as the time breakdown and the labels read them."""

    plan: object
    lay: Layout
    lc: LayerCompute
    tp: TPComm
    cp: CPComm
    ep: EPComm
    zero: ZeroTraffic
    rc: Recomputation
    layer: LayerTimes
    stages: Stages
    pipe: PipelineCosts
    dp: DPSync
    offload: ActivationOffload | None


def _time_breakdown(model: ModelSpec, x: _Parts, sp_norm_s, optimizer_s) -> TimeBreakdown:
    """The step on the critical stage by part (layers counted: the fullest stage's; where the
    critical stage holds the head and MTP blocks, its layers and those blocks, whose exposed
    collectives are communication and whose recomputation is recomputation, not compute)."""
    lay, tp, cp, ep, z, rc, pipe = x.lay, x.tp, x.cp, x.ep, x.zero, x.rc, x.pipe
    m, t_max = lay.num_microbatches, pipe.critical_microbatch_s
    crit_layers, rc_crit = _critical_layers(model, lay, t_max, pipe.stage_microbatch_s)
    crit_tp = crit_layers * (tp.forward_exposed_s + tp.backward_exposed_s) + rc_crit * rc.tp_s
    crit_cp = crit_layers * (cp.forward_exposed_s + cp.backward_exposed_s) + rc_crit * rc.cp_s
    crit_ep = crit_layers * (ep.forward_exposed_s + ep.backward_exposed_s) + rc_crit * rc.ep_s
    crit_wait = pipe.critical_host_wait_s
    crit_offload = 0.0 if x.offload is None else _critical_offload_s(lay, x.offload, x.plan, t_max,
                                                                      pipe.stage_microbatch_s)
    # FP8 delayed scaling's amax all-reduces over the stage's TP×CP×DP ranks: DP communication
    amax = x.stages.amax_reductions_per_microbatch_s
    compute_mb = (t_max - (crit_tp + crit_cp + crit_ep) - rc_crit * rc.compute_s
                  - (crit_layers * (x.layer.zero_forward_exposed_s + x.layer.zero_backward_exposed_s
                                    + z.grad_compression_s)
                     + 2.0 * z.first_gather_s) - crit_wait - crit_offload - amax)
    return TimeBreakdown(
        compute_s=m * compute_mb,
        host_wait_s=m * crit_wait,
        recompute_s=m * rc_crit * rc.compute_s,
        tp_comm_s=m * crit_tp + sp_norm_s,
        cp_comm_s=m * crit_cp,
        ep_comm_s=m * crit_ep,
        pp_comm_s=pipe.exposed_sends_s,
        dp_comm_s=x.dp.exposed_s + x.dp.microbatch_exposed_s + m * amax,
        bubble_s=pipe.bubble_s,
        optimizer_s=optimizer_s,
        offload_s=m * crit_offload,
    )


def _critical_offload_s(lay: Layout, offload: ActivationOffload, plan, t_max, per_mb):
    """The exposed activation copies of the critical stage per micro-batch, of its own layers
    (stages.py adds them so; the multi-token-prediction blocks are never offloaded)."""
    layers = np.where(t_max == per_mb[0], lay.first_stage_layers,
                      np.where(t_max == per_mb[2], lay.last_stage_layers, lay.stage_layers))
    return offloaded_layers(plan, lay, layers) * (offload.forward_exposed_s + offload.backward_exposed_s)


def _critical_layers(model: ModelSpec, lay: Layout, t_max, per_mb) -> tuple:
    """(layers, recomputation share) of the critical stage: the fullest stage's, or where the
    stage holding the head and the D multi-token-prediction blocks is critical, its layers
    and those blocks (recomputed as its layers are, unless only the first k are)."""
    L_s, D = lay.stage_layers, model.mtp_layers
    if not D:
        return L_s, 1.0
    ends = lay.first_holds_ends
    head_crit = np.where(ends, t_max == per_mb[0], t_max == per_mb[2])
    L_head = np.where(ends, lay.first_stage_layers, lay.last_stage_layers)
    return (np.where(head_crit, L_head + D, L_s),
            np.where(head_crit & (lay.recompute_code != Recompute.FIRST_K.code), (L_head + D) / L_s, 1.0))


def _overlapped(x: _Parts) -> OverlappedComm:
    """Communication hidden behind compute per step."""
    lay, tp, cp, ep = x.lay, x.tp, x.cp, x.ep
    m, L_s = lay.num_microbatches, lay.stage_layers
    return OverlappedComm(
        tp_comm_s=m * L_s * ((tp.forward_s - tp.forward_exposed_s) + (tp.backward_s - tp.backward_exposed_s)),
        cp_comm_s=m * L_s * ((cp.forward_s - cp.forward_exposed_s) + (cp.backward_s - cp.backward_exposed_s)),
        ep_comm_s=m * L_s * ((ep.forward_s - ep.forward_exposed_s) + (ep.backward_s - ep.backward_exposed_s)),
        dp_comm_s=x.dp.overlapped_s + x.dp.microbatch_overlapped_s,
        offload_s=0.0 if x.offload is None else m * offloaded_layers(x.plan, lay, L_s) * x.offload.hidden_s(),
    )


def _layer_detail(x: _Parts, mc: MoELayerCosts | None) -> dict:
    """Per-layer op times for the trace, averaged over the stage's layers, by label."""
    lc, lay, layer, z, waits = x.lc, x.lay, x.layer, x.zero, x.stages.host_wait_per_layer()
    w_moe, w_dense = lay.moe_layer_share, lay.dense_layer_share
    moe = None
    if mc:
        moe = (w_moe * (mc.expert_gemm_fwd_s - mc.imbalance_fwd_s), w_moe * mc.imbalance_fwd_s,
               lc.moe_forward_s - w_moe * mc.expert_gemm_fwd_s, lc.moe_backward_s,
               x.ep.forward_exposed_s, x.ep.backward_exposed_s)
    return labels.layer_detail(
        qkv_s=lc.qkv_gemm_s, attention_fwd_s=lc.attention_forward_s, out_s=lc.out_gemm_s,
        up_s=w_dense * lc.up_gemm_s, down_s=w_dense * lc.down_gemm_s, elementwise_fwd_s=lc.elementwise_forward_s,
        tp_fwd_s=x.tp.forward_exposed_s, cp_fwd_s=x.cp.forward_exposed_s, zero_fwd_s=layer.zero_forward_exposed_s,
        fsdp2_fwd_s=z.fsdp2_forward_s, host_wait_s=waits, gemms_bwd_s=lc.gemms_backward_s,
        gemms_wgrad_s=lc.gemms_wgrad_s,
        attention_bwd_s=lc.attention_backward_s, elementwise_bwd_s=lc.elementwise_backward_s,
        tp_bwd_s=x.tp.backward_exposed_s, cp_bwd_s=x.cp.backward_exposed_s, zero_bwd_s=layer.zero_backward_exposed_s,
        fsdp2_bwd_s=z.fsdp2_backward_s, grad_casts_s=lc.grad_casts_s, moe_wgrad_s=lc.moe_wgrad_s, moe=moe,
        grad_compression_bwd_s=z.grad_compression_s)


def _layer_parts(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, lay: Layout,
                 mc: MoELayerCosts | None):
    """A layer's compute, communication, recomputation and time with its overlap."""
    lc = layer_compute(cluster.gpu, model, workload, plan, lay, mc)
    tp = tp_comm(cluster, model, plan, lay, lc, mc)
    cp = cp_comm(cluster, model, plan, lay, lc)
    ep = ep_comm(lay, mc)
    z = zero_traffic(cluster, model, plan, lay, mc is not None, lc.layer_matrices)
    forward_compute_s = lc.forward_s + z.gathered_cast_s
    rc = recomputation(cluster.gpu, model, plan, lay, lc, forward_compute_s, tp, cp, ep.forward_exposed_s, mc)
    ep = ep_overlapped(plan, lay, ep, lc, tp, cp, mc)
    layer = layer_times(cluster.gpu.overlap_slowdown, forward_compute_s, lc.backward_s, tp, cp, ep, z)
    return lc, tp, cp, ep, z, rc, layer


def _staged(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan):
    """A plan's layout, MoE layer costs, layer parts, stages and offloaded activations' copies:
    what its step is built from."""
    cluster = recipe_cluster(cluster, workload)  # (row-wise FP8's GEMM rate)
    lay = layout(model, workload, plan)
    mc = (moe_layer_costs(model, cluster, workload, plan, lay.tokens_per_microbatch, lay.tp, lay.precision)
          if model.is_moe else None)
    lc, tp, cp, ep, z, rc, layer = _layer_parts(model, cluster, workload, plan, lay, mc)
    offload = activation_offload(cluster, model, workload, plan, lay, layer,
                                 (mc.activation_bytes, mc.act_fn_out_bytes) if mc else (0.0, 0.0))
    ends = stage_ends(cluster, model, lay, lc, tp, z, layer, rc.total_s)
    stages = stage_times(model, cluster, workload, plan, lay, lc, layer, rc, z, ends, mc, offload)
    return lay, mc, (lc, tp, cp, ep, z, rc, layer), stages, offload


def step_floor_s(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan) -> Num:
    """A floor under plan_time(...).total, from the stages alone: m × the critical stage's time
    per micro-batch, and the optimizer step. The step (_time_breakdown) counts the critical
    stage's exposed ZeRO-3 gathers as DP communication, those of the fullest stage's L_s
    layers (dp_sync.py), so where the critical stage is the head's with its D multi-token-
    prediction blocks (L_head + D layers) the floor takes off the difference; every other
    term the step adds is never negative: the bubble, the exposed sends, the rest of DP sync,
    the SP norm all-reduce. The search times in full only the plans whose floor is under the
    n-th fastest step it has seen (search/planner.py)."""
    stages_s, lay = _stage_floor(model, cluster, workload, plan)
    return stages_s + optimizer_step_s(cluster.gpu, workload, lay)


def stage_floor_s(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan) -> Num:
    """step_floor_s without the optimizer step: m × the critical stage's time per micro-batch
    (less the head's extra ZeRO-3 gathers). ZeRO only adds to a stage's time per micro-batch
    (gathers, reduce-scatters and their casts, exposed or slowing the compute they overlap),
    so the plan without ZeRO has the least: the search prices it once for every ZeRO choice
    (search/planner.py)."""
    return _stage_floor(model, cluster, workload, plan)[0]


def _stage_floor(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan):
    """(stage_floor_s, the plan's layout)."""
    lay, _, (*_, layer), stages, _ = _staged(model, cluster, workload, plan)
    per_mb, t_max = critical_stage(stages, lay.pp)
    crit_layers, _ = _critical_layers(model, lay, t_max, per_mb)
    beyond_fullest = (crit_layers - lay.stage_layers) * (layer.zero_forward_exposed_s + layer.zero_backward_exposed_s)
    return lay.num_microbatches * (t_max - beyond_fullest), lay


def _timed(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan):
    """The parts of a plan's step and its time: (parts, MoE layer costs, SP norm all-reduce,
    optimizer step, TimeBreakdown)."""
    lay, mc, (lc, tp, cp, ep, z, rc, layer), stages, offload = _staged(model, cluster, workload, plan)
    pipe = pipeline(cluster, model, plan, lay, stages)
    dp = dp_sync(cluster, model, plan, lay, stages.first, z, layer, mc is not None)
    optimizer = optimizer_step_s(cluster.gpu, workload, lay)
    sp_norm = sp_norm_grad_all_reduce_s(cluster, model, lay, tp, z.microbatch_reduce)
    x = _Parts(plan=plan, lay=lay, lc=lc, tp=tp, cp=cp, ep=ep, zero=z, rc=rc, layer=layer, stages=stages, pipe=pipe,
               dp=dp, offload=offload)
    return x, mc, sp_norm, optimizer, _time_breakdown(model, x, sp_norm, optimizer)


def plan_time(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan) -> TimeBreakdown:
    """A plan's (or a batch's) step time by part, alone: what the search ranks by."""
    return _timed(model, cluster, workload, plan)[-1]


def evaluate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan) -> PlanCosts:
    """Time, memory and the rest for a plan or a batch."""
    x, mc, sp_norm, optimizer, time = _timed(model, cluster, workload, plan)
    lay, lc, cp, dp, stages, pipe, rc = x.lay, x.lc, x.cp, x.dp, x.stages, x.pipe, x.rc
    comm_detail = labels.comm_detail(
        tp_s=time.tp_comm_s, cp_s=time.cp_comm_s, ep_s=time.ep_comm_s, pp_s=time.pp_comm_s, dp_s=time.dp_comm_s,
        sequence_parallel=lay.sequence_parallel, cp_comm_type_code=cp.comm_type_code,
        hierarchical_a2a=bool(np.all(np.asarray(plan.a2a_hierarchical)) and mc))
    memory, host_bytes = stage_memory(model, cluster, workload, plan, lay,
                                      (mc.activation_bytes, mc.act_fn_out_bytes) if mc else (0.0, 0.0))
    hw = hardware_flops_per_step(model, lay, lc.flops, workload.seq_len, lc.flash, rc.early_stop,
                                 np.asarray(plan.op_sac_attention_kept, dtype=bool))
    step_detail = labels.step_detail(dp_exposed_s=dp.exposed_s, sp_norm_s=sp_norm, optimizer_s=optimizer,
                                     compression_s=dp.compression_s)
    return PlanCosts(num_microbatches=lay.num_microbatches, first=stages.first, middle=stages.middle,
                     last=stages.last, p2p_s=pipe.p2p_s, time=time, host_bytes=host_bytes,
                     overlapped=_overlapped(x), memory=memory, dp_step_s=sum(step_detail.values()),
                     critical_stage_s=lay.num_microbatches * pipe.critical_microbatch_s, step_detail=step_detail,
                     comm_detail=comm_detail, hardware_flops_per_step=hw, layer_detail=_layer_detail(x, mc))
