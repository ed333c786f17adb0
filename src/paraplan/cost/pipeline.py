"""The pipeline in closed form (the event simulator re-times it): the critical stage, the
bubble and the exposed sends between stages.

Legend: p pipeline stages, v model chunks per rank, m micro-batches per step, t, c, d the
tensor-, context- and data-parallel degrees, T tokens per micro-batch on one CP rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from ..plan.axes import Schedule
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from .bubbles import dualpipev_bubble_s, zbv_bubble_s
from .comm import pipeline_hops_s
from .layout import Layout
from .stages import Stages


@dataclass(frozen=True, kw_only=True)
class PipelineCosts:
    """The closed-form pipeline of a step (seconds)."""

    p2p_s: Num              # one activation hand-off between consecutive stages
    stage_microbatch_s: tuple  # forward + backward per micro-batch of the first, a middle and the last stage
    critical_microbatch_s: Num  # the slowest stage's
    critical_host_wait_s: Num   # of which its wait for its host
    bubble_s: Num
    exposed_sends_s: Num


def p2p_handoff_s(cluster: ClusterSpec, model: ModelSpec, lay: Layout):
    """One activation hand-off between consecutive stages, the mean over the pipeline's hops.

    Consecutive stages sit pp_stride ranks apart (t·c·d with the pipeline outermost, t·c with
    data parallelism outermost), each a block of t·c ranks of its pipeline: only the sends
    that leave a node cross the network, and those that leave an island the data-center tier
    (comm.pipeline_hops_s). One hand-off costs the mean over the p·v − 1 hops of the virtual
    pipeline: v·(p − 1) sends down it and v − 1 from the last rank back to the first
    (the slowest of the d pipelines: t·c·p apart with data parallelism outermost, else
    interleaved inside each stage). ZB-V's V goes down the ranks and back up: the hops of one
    loop, each twice; its turn stays on the last rank."""
    t, c, p = lay.tp, lay.cp, lay.pp
    p2p_bytes = lay.act_bytes_per_element * lay.tokens_per_microbatch * model.hidden_size / lay.sp_divisor
    mean_hop, _, _ = pipeline_hops_s(cluster, p2p_bytes, p, lay.pp_stride, t * c, np.where(lay.v_shape, 1.0, lay.vp),
                                     lay.dp, np.where(lay.dp_outer_stride > t * c, lay.dp_outer_stride, 0.0))
    return np.where(p > 1, mean_hop, 0.0)


def _v_shape_bubble_s(sc, lay: Layout, st: Stages, p2p, t_max, per_mb):
    """(idle, of which sends) of ZB-V and DualPipeV.

    ZB-V: its step with every rank a plain one (the last rank of a V), zbv_bubble_s (derived
    from the schedule's critical paths, docs/model.md), or the first rank's work with the
    embedding and the head, whichever is longer: both bound the step from below (a longer
    task never shortens a path), and the first rank's extra work fills some of the bubble.
    Of the idle time left, a micro-batch's 2(p−1) sends through the V forward and 2(p−1)
    back are PP communication."""
    p, m, last = lay.pp, lay.num_microbatches, st.last
    chunk_f, chunk_b, chunk_w = (last.forward_s / 2.0, (last.backward_s - last.weight_grad_s) / 2.0,
                                 last.weight_grad_s / 2.0)
    zbv_idle = np.maximum(zbv_bubble_s(p, m, chunk_f, chunk_b, chunk_w, p2p) - m * (t_max - per_mb[2]), 0.0)
    pp_zbv = np.minimum(4.0 * (p - 1.0) * p2p, zbv_idle)
    # DualPipeV (dualpipev_bubble_s) the same way; its sends are what they add to the idle time
    dual = sc == Schedule.DUAL_PIPE_V.code
    if np.any(dual):
        def dual_idle(c):
            return np.maximum(dualpipev_bubble_s(p, m, chunk_f, chunk_b, chunk_w, c) - m * (t_max - per_mb[2]), 0.0)
        idle = dual_idle(p2p)
        zbv_idle = np.where(dual, idle, zbv_idle)
        pp_zbv = np.where(dual, idle - dual_idle(0.0), pp_zbv)
    return zbv_idle, pp_zbv


def critical_stage(st: Stages, p) -> tuple[list, Num]:
    """([first, middle, last] stage's forward + backward per micro-batch, the slowest's) of p
    stages: a middle stage exists from p = 3."""
    per_mb = [x.forward_s + x.backward_s for x in (st.first, st.middle, st.last)]
    return per_mb, np.maximum(np.maximum(per_mb[0], np.where(p > 2, per_mb[1], 0.0)), per_mb[2])


def pipeline(cluster: ClusterSpec, model: ModelSpec, plan, lay: Layout, st: Stages) -> PipelineCosts:
    """The critical stage, the bubble of the plan's schedule and the exposed sends."""
    p, v, m, only, vshape = lay.pp, lay.vp, lay.num_microbatches, lay.single_stage, lay.v_shape
    sc = np.asarray(plan.schedule_code)
    p2p = p2p_handoff_s(cluster, model, lay)
    middle = st.middle
    per_mb, t_max = critical_stage(st, p)
    # the critical stage's wait for its host, reported apart from its compute
    wait_first, wait_middle, wait_last = (f + b for f, b, _ in st.host_waits)
    crit_wait = np.where(t_max == per_mb[2], wait_last, np.where(t_max == per_mb[0], wait_first, wait_middle))
    t_avg = np.where(only, per_mb[0], (per_mb[0] + per_mb[2] + (p - 2.0) * per_mb[1]) / np.maximum(p, 1.0))
    # (p−1)/v of a micro-batch's time (SC'21 §2.2); a breadth-first loop with fewer
    # micro-batches than stages also waits p−m chunk slots in each of its v−1 later loops,
    # (v(p−m)+m−1)/v (docs/model.md, derived; the simulator reproduces it). Interleaved
    # 1F1B needs m a multiple of p and GPipe/1F1B have v = 1, so only looping BFS gains it.
    bubble_1f1b = ((p - 1.0) + np.maximum(p - m, 0.0) * (v - 1.0)) / v * t_avg
    # ZB-H1 (Qi et al. 2024 Sec. 3.1): (p−1)(T_F + T_B − T_W) with B and W split; with fewer
    # micro-batches than stages the simulated bubble grows by one W pass per micro-batch
    # short of p (derived, docs/model.md; tests/golden/test_bubble_closed_forms.py)
    wg_avg = middle.weight_grad_s  # (with an eager host's wait for its W passes, where measured)
    bubble_zb = np.maximum((p - 1.0) * (t_avg - 2.0 * wg_avg) + np.maximum(p - m, 0.0) * wg_avg, 0.0)
    zbv_idle, pp_zbv = _v_shape_bubble_s(sc, lay, st, p2p, t_max, per_mb)
    bubble_zbv = zbv_idle - pp_zbv
    bubble = np.where(sc == Schedule.ZERO_BUBBLE.code, bubble_zb, np.where(vshape, bubble_zbv, bubble_1f1b))
    bubble = np.where(only, 0.0, bubble)
    pp_exposed = np.where(only, 0.0, np.where(vshape, pp_zbv, 2.0 * (p * v - 1.0) * p2p))
    return PipelineCosts(p2p_s=p2p, stage_microbatch_s=tuple(per_mb), critical_microbatch_s=t_max,
                         critical_host_wait_s=crit_wait, bubble_s=bubble, exposed_sends_s=pp_exposed)
