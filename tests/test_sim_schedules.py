"""Schedules as data: each builder's order, completeness, and argument checks."""

from __future__ import annotations

from collections import Counter

import pytest

from paraplan.errors import ParaplanError
from paraplan.plan.axes import Schedule
from paraplan.sim.schedules import Phase, ScheduleError, Task, build_schedule

F, B, W = Phase.FORWARD, Phase.BACKWARD, Phase.WEIGHT

VALID = [
    (Schedule.GPIPE, 4, 6, 1),
    (Schedule.ONE_F_ONE_B, 4, 6, 1),
    (Schedule.ONE_F_ONE_B, 4, 2, 1),
    (Schedule.INTERLEAVED_1F1B, 4, 8, 2),
    (Schedule.INTERLEAVED_1F1B, 3, 3, 3),
    (Schedule.BREADTH_FIRST, 4, 6, 3),
    (Schedule.BREADTH_FIRST, 1, 1, 1),
    (Schedule.ZERO_BUBBLE, 4, 6, 1),
    (Schedule.ZERO_BUBBLE, 5, 3, 1),
]


def order(tasks):
    return [str(t) for t in tasks]


@pytest.mark.parametrize("schedule, p, m, v", VALID)
def test_every_task_appears_once_per_rank(schedule, p, m, v):
    ranks = build_schedule(schedule, p, m, v)
    assert len(ranks) == p
    phases = (F, B, W) if schedule is Schedule.ZERO_BUBBLE else (F, B)
    expected = Counter(Task(ph, i, c) for ph in phases for i in range(m) for c in range(v))
    for tasks in ranks:
        assert Counter(tasks) == expected


@pytest.mark.parametrize("schedule, p, m, v", VALID)
def test_backward_follows_forward_on_each_rank(schedule, p, m, v):
    for tasks in build_schedule(schedule, p, m, v):
        where = {t: i for i, t in enumerate(tasks)}
        for t in tasks:
            if t.phase is B:
                assert where[Task(F, t.microbatch, t.chunk)] < where[t]
            if t.phase is W:
                assert where[Task(B, t.microbatch, t.chunk)] < where[t]


def test_gpipe_runs_all_forwards_then_all_backwards():
    assert order(build_schedule("gpipe", 2, 3)[1]) == [
        "F mb0 c0", "F mb1 c0", "F mb2 c0", "B mb0 c0", "B mb1 c0", "B mb2 c0"]


def test_1f1b_warms_up_then_alternates():
    ranks = build_schedule(Schedule.ONE_F_ONE_B, 3, 4)
    assert order(ranks[0]) == ["F mb0 c0", "F mb1 c0", "F mb2 c0", "B mb0 c0", "F mb3 c0",
                               "B mb1 c0", "B mb2 c0", "B mb3 c0"]
    assert order(ranks[2]) == ["F mb0 c0", "B mb0 c0", "F mb1 c0", "B mb1 c0", "F mb2 c0",
                               "B mb2 c0", "F mb3 c0", "B mb3 c0"]
    for rank, tasks in enumerate(ranks):  # warm-up = p - rank - 1 forwards
        assert [t.phase for t in tasks[: 3 - rank]] == [F] * (3 - rank) and tasks[3 - rank].phase is B


def test_interleaved_follows_megatron_order():
    # p=2, m=4, v=2, rank 0: warm-up (p-1)*2 + (v-1)*p = 4; micro-batches in groups of p
    # per chunk; backwards start from the last chunk.
    ranks = build_schedule(Schedule.INTERLEAVED_1F1B, 2, 4, 2)
    assert order(ranks[0]) == [
        "F mb0 c0", "F mb1 c0", "F mb0 c1", "F mb1 c1",
        "F mb2 c0", "B mb0 c1", "F mb3 c0", "B mb1 c1", "F mb2 c1", "B mb0 c0", "F mb3 c1", "B mb1 c0",
        "B mb2 c1", "B mb3 c1", "B mb2 c0", "B mb3 c0",
    ]
    assert [t.phase for t in ranks[1][:4]] == [F, F, F, B]  # rank 1: warm-up (v-1)*p = 2, then F B


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (4, 12, 3), (2, 6, 4)])
def test_interleaved_warmup_length(p, m, v):
    for rank, tasks in enumerate(build_schedule(Schedule.INTERLEAVED_1F1B, p, m, v)):
        warmup = (p - rank - 1) * 2 + (v - 1) * p
        assert all(t.phase is F for t in tasks[: warmup + 1]) and tasks[warmup + 1].phase is B


def test_interleaved_with_m_equal_p_runs_forwards_first_only_where_the_warm_up_covers_them():
    # Megatron-Core 0.16.1 (get_pp_rank_microbatches): a rank runs every forward first when its
    # warm-up, 2(p-r-1) + (v-1)p chunk-forwards, covers all m*v; at p = m = 3, v = 2: ranks 0
    # (warm-up 7 >= 6) and 1 (5 < 6: not) and 2 (3: not)
    ranks = build_schedule(Schedule.INTERLEAVED_1F1B, 3, 3, 2)
    assert all(t.phase is F for t in ranks[0][:6]) and all(t.phase is B for t in ranks[0][6:])
    for rank in (1, 2):
        warmup = 2 * (3 - rank - 1) + 3
        assert all(t.phase is F for t in ranks[rank][: warmup + 1]) and ranks[rank][warmup + 1].phase is B


def test_breadth_first_loops_chunk_by_chunk():
    assert order(build_schedule(Schedule.BREADTH_FIRST, 2, 2, 2)[0]) == [
        "F mb0 c0", "F mb1 c0", "F mb0 c1", "F mb1 c1",
        "B mb0 c1", "B mb1 c1", "B mb0 c0", "B mb1 c0"]


def test_zero_bubble_h1_defers_weight_passes_by_rank():
    p, m = 4, 8
    for rank, tasks in enumerate(build_schedule(Schedule.ZERO_BUBBLE, p, m)):
        fb = [t for t in tasks if t.phase is not W]
        assert fb == list(build_schedule(Schedule.ONE_F_ONE_B, p, m)[rank])  # 1F1B's F/B order
        last_b = max(i for i, t in enumerate(tasks) if t.phase is B)
        assert [t.phase for t in tasks[last_b + 1:]] == [W] * (rank + 1)  # fills the cool-down
        ws = [t.microbatch for t in tasks if t.phase is W]
        assert ws == sorted(ws)


@pytest.mark.parametrize("args, match", [
    ((Schedule.INTERLEAVED_1F1B, 4, 6, 2), "multiple of num_stages=4"),
    ((Schedule.INTERLEAVED_1F1B, 4, 8, 1), "at least 2"),
    ((Schedule.ONE_F_ONE_B, 4, 8, 2), "num_chunks=2"),
    ((Schedule.GPIPE, 4, 8, 3), "num_chunks=3"),
    ((Schedule.ZERO_BUBBLE, 4, 8, 2), "num_chunks=2"),
    ((Schedule.ONE_F_ONE_B, 0, 8, 1), "num_stages=0"),
    ((Schedule.ONE_F_ONE_B, 4, 0, 1), "num_microbatches=0"),
    ((Schedule.ONE_F_ONE_B, 4, 2.5, 1), "num_microbatches=2.5"),
    ((Schedule.ONE_F_ONE_B, True, 2, 1), "num_stages=True"),
    (("pipedream", 4, 8, 1), "allowed: gpipe, 1f1b"),
])
def test_bad_arguments_raise_a_clear_error(args, match):
    with pytest.raises(ScheduleError, match=match) as info:
        build_schedule(*args)
    assert isinstance(info.value, ValueError) and isinstance(info.value, ParaplanError)


def test_schedule_accepts_its_string_value():
    assert build_schedule("1f1b", 2, 2) == build_schedule(Schedule.ONE_F_ONE_B, 2, 2)


def test_task_is_a_frozen_value():
    t = Task(F, 3, 1)
    assert t == Task(phase=F, microbatch=3, chunk=1) and str(t) == "F mb3 c1"
    with pytest.raises(AttributeError):
        t.microbatch = 4  # type: ignore[misc]
