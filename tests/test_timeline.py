"""Chrome / Perfetto trace of a simulated step."""

from __future__ import annotations

import json

import pytest

from paraplan.plan.axes import Schedule
from paraplan.report.timeline import DETAIL_TID, STEP_TID, TASK_TID, chrome_trace
from paraplan.sim.engine import StageCosts, simulate
from paraplan.sim.schedules import Phase, build_schedule

P, M, V = 3, 6, 2


@pytest.fixture(scope="module")
def result():
    costs = StageCosts(
        forward_s=((1e-3, 2e-3), (1e-3, 1e-3), (3e-3, 1e-3)),
        backward_s=((2e-3, 4e-3), (2e-3, 2e-3), (6e-3, 2e-3)),
        weight_s=((0.0, 0.0),) * P,
        p2p_s=1e-4,
    )
    return simulate(build_schedule(Schedule.INTERLEAVED_1F1B, P, M, V), costs)


def detail(rank, chunk, phase):
    # Sub-ops that do not sum to the task time, so they must be scaled into its span.
    return [("GEMMs", 1e-3, "compute", {"flops": 1e12}),
            ("TP all-reduce", 5e-4 * (rank + 1), "comm", {"bytes": 1 << 20}),
            ("empty", 0.0, "compute", {})]


def slices(trace, **match):
    return [e for e in trace["traceEvents"]
            if e["ph"] == "X" and all(e.get(k) == v for k, v in match.items())]


def test_one_process_per_rank_with_names(result):
    trace = chrome_trace(result, stage_labels=["embed+L0-3", "L4-7", "L8-11+head"], task_detail=detail)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "embed+L0-3", 1: "L4-7", 2: "L8-11+head"}
    threads = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {(r, t) for r in range(P) for t in (TASK_TID, DETAIL_TID)}
    assert {e["pid"] for e in slices(trace)} == set(range(P))
    default = chrome_trace(result)
    assert {e["args"]["name"] for e in default["traceEvents"] if e["name"] == "process_name"} == {
        "stage 0", "stage 1", "stage 2"}


def test_tasks_are_complete_events_in_microseconds(result):
    trace = chrome_trace(result, metadata={"plan": "tp2 pp3"}, layers=[f"L{j}" for j in range(P * V)])
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"] == {"plan": "tp2 pp3"}
    tasks = [e for e in slices(trace, tid=TASK_TID) if e["cat"] != "bubble"]
    assert len(tasks) == len(result.events) == 2 * P * M * V
    for e in slices(trace):
        assert e["ts"] >= 0.0 and e["dur"] >= 0.0
    first = tasks[0]
    assert first["name"] == "F mb0 c0" and first["ts"] == 0.0 and first["dur"] == pytest.approx(1e3)
    assert first["args"] == {"phase": "F", "microbatch": 0, "chunk": 0, "virtual_stage": 0, "layers": "L0"}
    json.dumps(trace)  # serialisable as is


def test_bubbles_fill_exactly_the_idle_time(result):
    trace = chrome_trace(result)
    for rank in range(P):
        idle_us = sum(e["dur"] for e in slices(trace, pid=rank, cat="bubble"))
        assert idle_us == pytest.approx(result.bubble_s[rank] * 1e6)
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices(trace, pid=rank, tid=TASK_TID))
        assert spans[0][0] == 0.0 and spans[-1][1] == pytest.approx(result.step_time_s * 1e6)
        for (_, end), (start, _) in zip(spans, spans[1:]):  # tasks and bubbles tile the step
            assert start == pytest.approx(end)


def test_sub_operations_stay_inside_their_task(result):
    trace = chrome_trace(result, task_detail=detail)
    for rank in range(P):
        tasks = [e for e in slices(trace, pid=rank, tid=TASK_TID) if e["cat"] != "bubble"]
        ops = slices(trace, pid=rank, tid=DETAIL_TID)
        assert len(ops) == 3 * len(tasks)
        for task, group in zip(tasks, (ops[i:i + 3] for i in range(0, len(ops), 3))):
            begin, end = task["ts"], task["ts"] + task["dur"]
            assert group[0]["ts"] == begin
            for op in group:
                assert begin <= op["ts"] and op["ts"] + op["dur"] <= end and op["dur"] >= 0.0
            for a, b in zip(group, group[1:]):  # laid out end to end
                assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
            assert group[-1]["ts"] + group[-1]["dur"] == pytest.approx(end)
            # scaled in proportion: all-reduce / GEMM keeps the modelled ratio
            assert group[1]["dur"] / group[0]["dur"] == pytest.approx(0.5 * (rank + 1))
            assert group[1]["args"]["bytes"] == 1 << 20 and group[1]["args"]["modelled_s"] == 5e-4 * (rank + 1)


def test_bad_inputs_are_rejected(result):
    with pytest.raises(ValueError, match="stage_labels"):
        chrome_trace(result, stage_labels=["only one"])
    with pytest.raises(ValueError, match="duration_s >= 0"):
        chrome_trace(result, task_detail=lambda r, c, ph: [("x", -1.0, "comm", {})])


def test_detail_is_asked_once_per_rank_chunk_phase(result):
    calls = []

    def counting(rank, chunk, phase):
        calls.append((rank, chunk, phase))
        return [("op", 1.0, "compute", {})]

    chrome_trace(result, task_detail=counting)
    assert sorted(calls) == sorted({(r, c, ph) for r in range(P) for c in range(V)
                                    for ph in (Phase.FORWARD, Phase.BACKWARD)})


def test_work_after_the_pipeline_follows_the_step_on_every_rank(result):
    after = [("DP all-reduce", 2e-3, "comm", {}), ("optimizer step", 1e-3, "optimizer", {"kernels": 4})]
    trace = chrome_trace(result, task_detail=detail, after=after)
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert all(threads[(r, STEP_TID)] == "after the pipeline" for r in range(P))
    end_us = result.step_time_s * 1e6
    for rank in range(P):
        ops = slices(trace, pid=rank, tid=STEP_TID)
        assert [op["name"] for op in ops] == ["DP all-reduce", "optimizer step"]
        assert ops[0]["ts"] == pytest.approx(end_us) and ops[0]["dur"] == pytest.approx(2e3)  # not scaled
        assert ops[1]["ts"] == pytest.approx(end_us + 2e3) and ops[1]["args"] == {"kernels": 4}
        # the pipeline's own tracks still end at the simulated step
        assert max(e["ts"] + e["dur"] for e in slices(trace, pid=rank, tid=TASK_TID)) == pytest.approx(end_us)
    assert not slices(chrome_trace(result), tid=STEP_TID)
    with pytest.raises(ValueError, match="after: sub-operation"):
        chrome_trace(result, after=[("x", -1.0, "comm", {})])
