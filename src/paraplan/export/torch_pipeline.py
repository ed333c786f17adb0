"""A schedule's task lists as torch.distributed.pipelining's action list: one row per pipeline
rank, each action `{stage}{type}{micro-batch}` (torch 2.13 schedules.py `_Action`, read back by
`_Action.from_str`, a row of the CSV that `PipelineScheduleMulti._load_csv` loads with
format "compute_only"): F a forward, B a full backward, I a backward for the input only and W
its weight gradient. torch's runtime (`_PipelineScheduleRuntime`) adds the sends and receives
itself, so any order the simulator runs without deadlock runs there (run/pipeline.py).
No torch is imported here.
"""

from __future__ import annotations

import csv
import io
from typing import Sequence

from ..sim.schedules import Phase, Placement, Task, virtual_stage


def action_rows(tasks_per_rank: Sequence[Sequence[Task]], where: Placement = Placement.LOOPED) -> tuple[tuple[str, ...], ...]:
    """Each rank's tasks as torch actions; a backward is I where the schedule has W tasks, else B.
    Joined tasks (one action of several) have no compute-only form and are refused."""
    p = len(tasks_per_rank)
    split = any(t.phase is Phase.WEIGHT for tasks in tasks_per_rank for t in tasks)
    kind = {Phase.FORWARD: "F", Phase.BACKWARD: "I" if split else "B", Phase.WEIGHT: "W"}
    rows = []
    for rank, tasks in enumerate(tasks_per_rank):
        if any(t.joined for t in tasks):
            raise ValueError(f"rank {rank}: joined tasks have no compute-only torch action")
        rows.append(tuple(f"{int(virtual_stage(where, p, rank, t.chunk))}{kind[t.phase]}{t.microbatch}" for t in tasks))
    return tuple(rows)


def csv_text(rows: Sequence[Sequence[str]]) -> str:
    """The rows as the CSV torch's `_load_csv` reads (one line per rank)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()
