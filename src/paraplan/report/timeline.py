"""A simulated pipeline step as a Chrome / Perfetto trace (JSON Object Format).

Open the JSON in https://ui.perfetto.dev or chrome://tracing. Each pipeline rank is a
process ("stage k"); thread 0 holds its tasks and the idle "bubble" gaps between them,
thread 1 the optional sub-operations of each task (GEMMs, "TP all-reduce", ...), thread 2
the optional per-step work after the pipeline (DP collectives, optimizer step).
Format: Chrome Trace Event Format, complete events (ph "X") with ts/dur in microseconds.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ..sim.engine import SimResult
from ..sim.schedules import Phase
from ..units import MEGA

# One sub-operation of a task: (name, duration_s, category, args).
SubOp = tuple[str, float, str, dict[str, Any]]
TaskDetail = Callable[[int, int, Phase], Sequence[SubOp]]

TASK_TID, DETAIL_TID, STEP_TID = 0, 1, 2
_CATEGORY = {Phase.FORWARD: "forward", Phase.BACKWARD: "backward", Phase.WEIGHT: "weight"}
_GAP_TOLERANCE = 1e-9  # gaps shorter than this fraction of the step are rounding, not bubbles


def chrome_trace(
    result: SimResult,
    *,
    stage_labels: list[str] | None = None,
    task_detail: TaskDetail | None = None,
    metadata: dict | None = None,
    layers: Sequence[str] | None = None,
    after: Sequence[SubOp] = (),
) -> dict:
    """Trace dict for `json.dump`. `stage_labels[rank]` names processes, `layers[j]` labels
    virtual stage j's layers, `task_detail(rank, chunk, phase)` lists a task's sub-ops,
    which are scaled to fill the task's span when their sum differs from it; `after` lists
    the per-step work that follows the pipeline, laid end to end from the simulated step's
    end on every rank, at its own durations."""
    num_ranks = len(result.busy_s)
    if stage_labels is not None and len(stage_labels) != num_ranks:
        raise ValueError(f"stage_labels has {len(stage_labels)} labels; the result has {num_ranks} ranks")
    trace: list[dict] = []
    for rank in range(num_ranks):
        label = stage_labels[rank] if stage_labels is not None else f"stage {rank}"
        trace += [
            _meta("process_name", rank, 0, {"name": label}),
            _meta("process_sort_index", rank, 0, {"sort_index": rank}),
            _meta("thread_name", rank, TASK_TID, {"name": "tasks"}),
        ]
        if task_detail is not None:
            trace.append(_meta("thread_name", rank, DETAIL_TID, {"name": "operations"}))
        if after:
            trace.append(_meta("thread_name", rank, STEP_TID, {"name": "after the pipeline"}))

    details: dict[tuple[int, int, Phase], Sequence[SubOp]] = {}
    rank_end_s = [0.0] * num_ranks  # events are in start order, so per rank in list order
    min_gap_s = _GAP_TOLERANCE * result.step_time_s
    for e in result.events:
        if e.start_s - rank_end_s[e.rank] > min_gap_s:
            trace.append(_bubble(e.rank, rank_end_s[e.rank], e.start_s))
        rank_end_s[e.rank] = e.end_s
        ts_us, end_us = e.start_s * MEGA, e.end_s * MEGA  # trace time unit: microseconds
        trace.append({
            "name": f"{e.phase.value} mb{e.microbatch} c{e.chunk}",
            "cat": _CATEGORY[e.phase],
            "ph": "X", "pid": e.rank, "tid": TASK_TID, "ts": ts_us, "dur": end_us - ts_us,
            "args": {
                "phase": e.phase.value, "microbatch": e.microbatch, "chunk": e.chunk,
                "virtual_stage": e.virtual_stage,
                "layers": layers[e.virtual_stage] if layers is not None else None,
            },
        })
        if task_detail is not None:
            key = (e.rank, e.chunk, e.phase)
            if key not in details:
                details[key] = _checked(task_detail(*key), key)
            trace += _sub_slices(details[key], e.rank, ts_us, end_us)
    for rank, end_s in enumerate(rank_end_s):
        if result.step_time_s - end_s > min_gap_s:
            trace.append(_bubble(rank, end_s, result.step_time_s))
    ops = _checked(after, "after")
    for rank in range(num_ranks):
        begin_s = result.step_time_s
        for name, duration_s, category, args in ops:
            trace.append({"name": name, "cat": category, "ph": "X", "pid": rank, "tid": STEP_TID,
                          "ts": begin_s * MEGA, "dur": duration_s * MEGA, "args": dict(args)})
            begin_s += duration_s
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": dict(metadata or {})}


def _sub_slices(ops: Sequence[SubOp], rank: int, ts_us: float, end_us: float) -> list[dict]:
    # Lay the ops end to end and scale them onto [ts_us, end_us]; running sums of
    # non-negative numbers never pass the total, so no slice leaves its parent's span.
    total_s = sum(op[1] for op in ops)
    if total_s <= 0.0:
        return []
    span_us, scale = end_us - ts_us, (end_us - ts_us) / (total_s * MEGA)
    slices, done_s, begin_us = [], 0.0, ts_us
    for name, duration_s, category, args in ops:
        done_s += duration_s
        finish_us = ts_us + span_us * min(done_s / total_s, 1.0)
        slices.append({
            "name": name, "cat": category, "ph": "X", "pid": rank, "tid": DETAIL_TID,
            "ts": begin_us, "dur": finish_us - begin_us,
            "args": {**args, "modelled_s": duration_s, "scale": scale},
        })
        begin_us = finish_us
    return slices


def _checked(ops: Sequence[SubOp], key: tuple[int, int, Phase] | str) -> Sequence[SubOp]:
    where = key if isinstance(key, str) else f"task_detail{key}"
    for op in ops:
        if len(op) != 4 or not op[1] >= 0.0:
            raise ValueError(
                f"{where}: sub-operation {op!r} is not allowed; it must be "
                f"(name, duration_s >= 0, category, args)"
            )
    return ops


def _bubble(rank: int, start_s: float, end_s: float) -> dict:
    ts_us = start_s * MEGA
    return {
        "name": "bubble", "cat": "bubble", "ph": "X", "pid": rank, "tid": TASK_TID,
        "ts": ts_us, "dur": end_s * MEGA - ts_us, "args": {"idle_s": end_s - start_s},
    }


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
