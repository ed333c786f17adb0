"""Pipeline parallelism with `torch.distributed.pipelining`: stage modules and schedules.

The model is cut into pp×vp chunks as the cost model lays them out (cost/estimate.py
chunk_layers: equal where the layers divide, else the embedding's and the head's chunks
lighter; model.build_model builds one);
chunk c runs on pipeline rank c mod pp (the looped placement of interleaved 1F1B,
Narayanan et al. SC'21), or under ZB-V on rank c for c < pp and 2·pp−1−c above (its V,
sim/schedules.py Placement). The first chunk holds the embedding, the last the norm and head.

paraplan schedule -> torch schedule (plan/axes.py Schedule):
  gpipe -> ScheduleGPipe, 1f1b -> Schedule1F1B (one chunk per rank);
  interleaved -> ScheduleInterleaved1F1B, bfs -> ScheduleLoopedBFS,
  zb -> ScheduleInterleavedZeroBubble (ZB-H1-like, backward split into input and weight
  gradients; Qi et al. 2024) (any number of chunks per rank);
  zbv -> ScheduleZBVZeroBubble (Qi et al. 2024 Sec. 6; two chunks per rank in a V);
  dualpipev -> ScheduleDualPipeV (DeepSeek-V3 report Sec. 3.2.1; the same V, forward-backward
  pairs run one after the other: no overlap callback is registered).
A searched order (`paraplan run --schedule-search`, run/searched.py) runs as torch's action
list on its `_PipelineScheduleRuntime` (SearchedPipeline), which adds the sends and receives.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                                                    ScheduleInterleavedZeroBubble, ScheduleLoopedBFS,
                                                    ScheduleDualPipeV, ScheduleZBVZeroBubble, _Action,
                                                    _PipelineScheduleRuntime)

from ..plan.axes import Schedule
from ..sim.schedules import placement, virtual_stage

_SINGLE = {Schedule.GPIPE: ScheduleGPipe, Schedule.ONE_F_ONE_B: Schedule1F1B}
_MULTI = {Schedule.INTERLEAVED_1F1B: ScheduleInterleaved1F1B, Schedule.BREADTH_FIRST: ScheduleLoopedBFS,
          Schedule.ZERO_BUBBLE: ScheduleInterleavedZeroBubble, Schedule.ZERO_BUBBLE_V: ScheduleZBVZeroBubble,
          Schedule.DUAL_PIPE_V: ScheduleDualPipeV}


def stage_ids(pp_rank: int, pp: int, vp: int, schedule: Schedule) -> list[int]:
    """Global stage (chunk) indices held by one pipeline rank, in chunk order, as the
    schedule places them (the simulator's placement)."""
    return [int(virtual_stage(placement(schedule), pp, pp_rank, c)) for c in range(vp)]


def make_stage(module: nn.Module, stage: int, num_stages: int, device: torch.device, group) -> PipelineStage:
    return PipelineStage(module, stage, num_stages, device, group=group)


class SearchedPipeline(_PipelineScheduleRuntime):
    """torch's runtime on an order given as action strings, one row per pipeline rank
    (export/torch_pipeline.py), lowered with its sends and receives as torch's own
    zero-bubble schedules are (their constructors set pipeline_order the same way)."""

    def __init__(self, stages: list[PipelineStage], num_microbatches: int, loss_fn, actions):
        super().__init__(stages, num_microbatches, loss_fn=loss_fn)
        self.pipeline_order = {rank: [_Action.from_str(a) for a in row] for rank, row in enumerate(actions)}
        self._prepare_schedule_with_comms(self.pipeline_order)


def make_schedule(schedule: Schedule, stages: list[PipelineStage], num_microbatches: int, loss_fn, actions=None):
    """The torch schedule object; its step() runs one optimizer step's forward and backward.
    With `actions` (rows of torch action strings), that order on torch's runtime instead."""
    if actions is not None:
        return SearchedPipeline(stages, num_microbatches, loss_fn, actions)
    if schedule in _SINGLE:
        assert len(stages) == 1, "single-stage schedules hold one chunk per rank"
        return _SINGLE[schedule](stages[0], num_microbatches, loss_fn=loss_fn)
    return _MULTI[schedule](stages, num_microbatches, loss_fn=loss_fn)
