"""Bubble filling (PipeFisher: Osawa et al., "PipeFisher: Efficient Training of Large Language
Models Using Pipelining and Fisher Information Matrices", MLSys 2023): work placed in each
pipeline rank's idle time (sim/idle.py), priced on the simulated step.

Two kinds of work fill it:
- each rank's own work after the pipeline (its exposed DP gradient traffic, the SP
  norm-gradient all-reduce, its optimizer step): it needs the rank's last gradient, so it
  starts at the rank's last task instead of after the whole pipeline, and hides in the rank's
  window, its cool-down and the next step's warm-up (the rank's first forward waits for the
  stage before it anyway);
- extra work per GPU per step given as FLOPs and HBM bytes (a second-order preconditioner's
  curvature and inverses: K-FAC, Shampoo), priced by the roofline (roofline.work_time_s) in
  equal pieces, by default one per layer of the stage, as PipeFisher assigns K-FAC's work layer
  by layer. A piece is not split: it goes whole into a gap between the rank's tasks, earliest
  gaps first (every piece is the same, so that is ⌊gap / piece⌋ per gap); the pieces left
  run in the rank's tail after its own work.

A rank's tail (its own work, then the pieces left) is exposed where it outlasts the window,
and the step grows by the largest exposed tail over the ranks:
    filled step = pipeline end + max_r max(tail_r − window_r, 0),
against pipeline end + the busiest stage's after-pipeline work + the extra work unfilled.
The first rank runs the pipeline's first forward and its last backward in every schedule here,
so its window is empty and its own work stays exposed: filling the optimizer step gains only
what the first rank's work falls short of the busiest stage's (docs/model/step.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..num import scalar
from ..plan.plan import Plan
from ..plan.space import PlanBatch
from ..report.labels import OPTIMIZER_STEP, SP_NORM_ALL_REDUCE
from ..sim.idle import PipelineIdle
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .breakdown import TimeBreakdown
from .layout import Layout, layout
from .low_precision import attention_precision
from .optimizer import optimizer_step_s
from .roofline import work_time_s

MAX_BUBBLE_WORK_PIECES = 1_000_000  # pieces per rank: a million kernels a step is no preconditioner's


@dataclass(frozen=True, kw_only=True)
class BubbleWork:
    """Extra work per GPU per step to place in the pipeline's idle time (every rank the same)."""

    extra_flops: float = 0.0  # FLOPs per GPU per step
    extra_bytes: float = 0.0  # HBM bytes per GPU per step
    pieces: int | None = None  # equal pieces it splits into, none split further (None: one per layer of the stage)

    def __post_init__(self) -> None:
        for name in ("extra_flops", "extra_bytes"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise SpecError("bubble work", name, value, "must be a finite number >= 0 per GPU per step")
        if self.pieces is not None and not (isinstance(self.pieces, int) and 1 <= self.pieces <= MAX_BUBBLE_WORK_PIECES):
            raise SpecError("bubble work", "pieces", self.pieces,
                            f"must be a whole number from 1 to {MAX_BUBBLE_WORK_PIECES:,} (None: one per layer)")


@dataclass(frozen=True, kw_only=True)
class PricedWork:
    """BubbleWork in seconds on a plan: its pieces, and each rank's own after-pipeline work."""

    piece_s: float
    pieces: int
    after_s: tuple[float, ...]  # per pipeline rank

    @property
    def extra_s(self) -> float:
        return self.piece_s * self.pieces


@dataclass(frozen=True, kw_only=True)
class RankFill:
    """Where one rank's work went (seconds per step)."""

    after_s: float     # its own work after the pipeline: DP traffic, SP norm all-reduce, optimizer step
    in_gaps_s: float   # extra work placed whole in its gaps
    tail_s: float      # after_s and the extra work left, from its last task on
    window_s: float    # its cool-down and the next step's warm-up, which hide the tail
    exposed_s: float   # max(tail_s − window_s, 0)


@dataclass(frozen=True, kw_only=True)
class BubbleFill:
    """A plan's step with the work in its bubbles, and without."""

    plain_step_s: float     # no extra work, nothing in the bubbles: the plan's step
    unfilled_step_s: float  # the extra work after the pipeline, nothing in the bubbles
    filled_step_s: float    # the work in the bubbles: the step the estimate reports
    extra_s: float          # the extra work per GPU per step
    piece_s: float
    pieces: int
    idle: PipelineIdle | None
    ranks: tuple[RankFill, ...]
    binding_rank: int | None  # the rank whose exposed tail sets the step (None: nothing exposed)
    note: str = ""            # why nothing was filled ("" when the bubbles were)


def rank_after_work_s(workload: Workload, cluster: ClusterSpec, lay: Layout, step_detail: dict) -> tuple[float, ...]:
    """Each pipeline rank's work after the pipeline: the step's exposed DP traffic and SP norm
    all-reduce as the busiest stage has them (on every rank: conservative), and the optimizer
    step over the rank's own parameters (the first stage's, a middle one's or the last one's:
    layout.py), at most the busiest stage's, which the step prices."""
    optimizer = step_detail[OPTIMIZER_STEP]
    rest = sum(step_detail.values()) - optimizer
    p = int(scalar(lay.pp))
    middle = scalar(lay.stage_layers) * scalar(lay.layer_params)
    v_shape = bool(scalar(lay.v_shape))
    head_rank = 0 if v_shape or p == 1 else p - 1
    dense = [middle] * p
    dense[0] = scalar(lay.params_first_stage)
    if not v_shape and p > 1:
        dense[p - 1] = scalar(lay.params_last_stage)
    out = []
    for r in range(p):
        experts = lay.head_stage_expert_params if r == head_rank else lay.expert_params_stage
        own = scalar(optimizer_step_s(cluster.gpu, workload, replace(lay, params_stage=dense[r],
                                                                        head_stage_expert_params=experts)))
        out.append(rest + min(own, optimizer))
    return tuple(out)


def priced_work(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, work: BubbleWork,
                step_detail: dict) -> PricedWork:
    """`work` on the plan's GPU: its pieces (one per layer of the stage unless `work` says)
    by the roofline at the attention core's precision (16 bits under FP8 and NVFP4), and each
    rank's own after-pipeline work."""
    lay = layout(model, workload, PlanBatch.from_plans([plan]))
    after = rank_after_work_s(workload, cluster, lay, step_detail)
    if work.extra_flops == 0 and work.extra_bytes == 0:
        return PricedWork(piece_s=0.0, pieces=0, after_s=after)
    pieces = work.pieces or int(scalar(lay.stage_layers))
    piece_s = scalar(work_time_s(cluster.gpu, work.extra_flops / pieces, work.extra_bytes / pieces,
                                 attention_precision(workload.precision)))
    return PricedWork(piece_s=piece_s, pieces=pieces, after_s=after)


def _rank_fill(after_s: float, window_s: float, gap_pieces: int, work: PricedWork) -> RankFill:
    """One rank's work: whole pieces into its gaps, the rest in its tail after its own work."""
    placed = min(work.pieces, gap_pieces)
    tail = after_s + (work.pieces - placed) * work.piece_s
    return RankFill(after_s=after_s, in_gaps_s=placed * work.piece_s, tail_s=tail, window_s=window_s,
                    exposed_s=max(tail - window_s, 0.0))


def fill_bubbles(time: TimeBreakdown, step_detail: dict, idle: PipelineIdle | None, work: PricedWork,
                 note: str = "") -> tuple[BubbleFill, TimeBreakdown]:
    """The step with `work` in the bubbles of `idle` (None: the pipeline was not simulated, or
    has one stage: nothing is filled, and `note` says why) and its time by part: the after-
    pipeline parts scaled to what the binding rank leaves exposed of its own work, and the
    extra work it leaves exposed as bubble_work_s."""
    after = sum(step_detail.values())
    plain = time.total
    unfilled = plain + work.extra_s
    if idle is None:
        fill = BubbleFill(plain_step_s=plain, unfilled_step_s=unfilled, filled_step_s=unfilled, extra_s=work.extra_s,
                          piece_s=work.piece_s, pieces=work.pieces, idle=None, ranks=(), binding_rank=None,
                          note=note or "no pipeline bubbles: the work runs after the step")
        return fill, replace(time, bubble_work_s=work.extra_s)
    ranks = tuple(_rank_fill(a, r.cooldown_s + r.warmup_s, r.gap_pieces, work) for a, r in zip(work.after_s, idle.ranks))
    worst = max(range(len(ranks)), key=lambda r: ranks[r].exposed_s)
    binding = ranks[worst]
    own_exposed = max(binding.after_s - binding.window_s, 0.0)  # its own work runs first in its tail
    keep = own_exposed / after if after > 0 else 0.0
    sp, optimizer = step_detail[SP_NORM_ALL_REDUCE], step_detail[OPTIMIZER_STEP]
    dp = after - sp - optimizer
    filled_time = replace(time, dp_comm_s=time.dp_comm_s - (1.0 - keep) * dp, tp_comm_s=time.tp_comm_s - (1.0 - keep) * sp,
                          optimizer_s=keep * optimizer, bubble_work_s=binding.exposed_s - own_exposed)
    fill = BubbleFill(plain_step_s=plain, unfilled_step_s=unfilled, filled_step_s=float(filled_time.total),
                      extra_s=work.extra_s, piece_s=work.piece_s, pieces=work.pieces, idle=idle, ranks=ranks,
                      binding_rank=worst if binding.exposed_s > 0 else None, note=note)
    return fill, filled_time
