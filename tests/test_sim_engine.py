"""The simulator: semantics (start = max(rank free, dependencies)), invariants, errors."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.plan.axes import Schedule
from paraplan.sim.engine import StageCosts, simulate, simulate_schedules
from paraplan.sim.schedules import (SPLIT_BACKWARD, Phase, ScheduleError, Task, build_schedule, placement, stage_rank,
                                    virtual_stage)

F, B, W = Phase.FORWARD, Phase.BACKWARD, Phase.WEIGHT


@st.composite
def cases(draw):
    """A valid (schedule, p, m, v) and random per-rank, per-chunk costs."""
    schedule = draw(st.sampled_from(list(Schedule)))
    p = draw(st.integers(1, 5))
    if schedule is Schedule.INTERLEAVED_1F1B:
        v = draw(st.integers(2, 3))
        m = p * draw(st.integers(1, 3))
    elif schedule is Schedule.BREADTH_FIRST:
        v = draw(st.integers(1, 3))
        m = draw(st.integers(1, 8))
    elif schedule is Schedule.ZERO_BUBBLE_V:
        v, m = 2, draw(st.integers(1, 12))
    elif schedule is Schedule.DUAL_PIPE_V:
        v, m = 2, draw(st.integers(2 * p, 2 * p + 8))
    else:
        v, m = 1, draw(st.integers(1, 8))
    cost = st.floats(0.0, 4.0, allow_nan=False, allow_infinity=False)

    def table():
        return tuple(tuple(draw(cost) for _ in range(v)) for _ in range(p))

    weight = (table() if schedule in SPLIT_BACKWARD else tuple((0.0,) * v for _ in range(p)))
    costs = StageCosts(forward_s=table(), backward_s=table(), weight_s=weight,
                       p2p_s=draw(st.floats(0.0, 1.0)))
    return schedule, p, m, v, costs


def _required_start(e, by_key, done, costs, p, v, where):
    """Earliest start that the dependency rules allow for event `e` (ignoring its rank): a
    neighbouring stage on another rank sends (p2p_s), one on the same rank hands over. A
    task's output is there when its action ends (`done`, by key)."""
    last = v * p - 1
    j, mb = e.virtual_stage, e.microbatch

    def hop(k):
        return 0.0 if int(stage_rank(where, p, k)) == e.rank else costs.p2p_s
    if e.phase is F:
        return done[(F, mb, j - 1)] + hop(j - 1) if j > 0 else 0.0
    if e.phase is W:
        return done[(B, mb, j)]
    ready = done[(F, mb, j)]
    if j < last:
        ready = max(ready, done[(B, mb, j + 1)] + hop(j + 1))
    return ready


def _actions(tasks, per_rank):
    """Per rank, the events grouped into actions (a joined task runs in the one before it)."""
    out = []
    for rank, events in enumerate(per_rank):
        groups = []
        for task, e in zip(tasks[rank], events):
            if task.joined:
                groups[-1].append(e)
            else:
                groups.append([e])
        out.append(groups)
    return out


@settings(max_examples=150, deadline=None)
@given(cases())
def test_events_follow_the_rules(case):
    schedule, p, m, v, costs = case
    tasks = build_schedule(schedule, p, m, v)
    where = placement(schedule)
    result = simulate(tasks, costs, where)
    events = result.events
    by_key = {(e.phase, e.microbatch, e.virtual_stage): e for e in events}
    assert len(by_key) == len(events) == sum(map(len, tasks))  # every task exactly once

    per_rank = [[e for e in events if e.rank == r] for r in range(p)]
    actions = _actions(tasks, per_rank)
    done = {(e.phase, e.microbatch, e.virtual_stage): group[-1].end_s
            for groups in actions for group in groups for e in group}
    for rank in range(p):
        # per-rank order is the schedule's order, and tasks never overlap on a rank
        assert [(e.phase, e.microbatch, e.chunk) for e in per_rank[rank]] == [
            (t.phase, t.microbatch, t.chunk) for t in tasks[rank]]
        free = 0.0
        for group in actions[rank]:
            own = {(e.phase, e.microbatch, e.virtual_stage) for e in group}
            required = max((_required_start(e, by_key, done, costs, p, v, where) for e in group
                            if not ((e.phase is W and (B, e.microbatch, e.virtual_stage) in own)
                                    or (e.phase is B and (F, e.microbatch, e.virtual_stage) in own))),
                           default=0.0)
            start = group[0].start_s
            assert start >= required - 1e-12  # no action starts before its inputs are there
            assert start == pytest.approx(max(free, required), abs=1e-9)  # and not later
            for e in group:  # an action's tasks run back to back
                assert e.start_s == pytest.approx(free if e is not group[0] else start, abs=1e-9)
                assert e.virtual_stage == int(virtual_stage(where, p, rank, e.chunk))
                free = e.end_s
        assert result.busy_s[rank] == pytest.approx(sum(e.duration_s for e in per_rank[rank]))
        assert result.step_time_s >= result.busy_s[rank] - 1e-12  # makespan >= busy
        assert result.bubble_s[rank] == pytest.approx(result.step_time_s - result.busy_s[rank])
    assert result.step_time_s == max(e.end_s for e in events)
    # events are listed by the tie-break rule: (start, rank, position in the rank's list)
    position = {(e.rank, e.phase, e.microbatch, e.chunk): i
                for r in range(p) for i, e in enumerate(per_rank[r])}
    keys = [(e.start_s, e.rank, position[(e.rank, e.phase, e.microbatch, e.chunk)]) for e in events]
    assert keys == sorted(keys)


@settings(max_examples=100, deadline=None)
@given(cases(), st.floats(0.001, 2.0), st.sampled_from(["forward_s", "backward_s"]))
def test_slower_links_or_tasks_never_shorten_the_step(case, extra_s, field):
    schedule, p, m, v, costs = case
    tasks = build_schedule(schedule, p, m, v)
    where = placement(schedule)
    base = simulate(tasks, costs, where).step_time_s
    slower_p2p = dataclasses.replace(costs, p2p_s=costs.p2p_s + extra_s)
    assert simulate(tasks, slower_p2p, where).step_time_s >= base
    grown = tuple(tuple(x + extra_s for x in row) for row in getattr(costs, field))
    slower = dataclasses.replace(costs, **{field: grown})
    assert simulate(tasks, slower, where).step_time_s >= base


@pytest.mark.parametrize("p, m", [(2, 3), (4, 4), (4, 9), (8, 16)])
def test_1f1b_peak_inflight_is_p_minus_rank(p, m):
    result = simulate(build_schedule(Schedule.ONE_F_ONE_B, p, m), StageCosts.uniform(p, 1, 1.0, 2.0))
    assert result.peak_inflight == tuple(float(min(p - r, m)) for r in range(p))


@pytest.mark.parametrize("p, m", [(2, 3), (4, 4), (4, 9)])
def test_gpipe_and_bfs_hold_every_microbatch(p, m):
    gpipe = simulate(build_schedule(Schedule.GPIPE, p, m), StageCosts.uniform(p, 1, 1.0, 2.0))
    assert gpipe.peak_inflight == (float(m),) * p
    bfs = simulate(build_schedule(Schedule.BREADTH_FIRST, p, m, 3), StageCosts.uniform(p, 3, 1.0, 2.0))
    assert bfs.peak_inflight == (float(m),) * p  # all m micro-batches of all 3 chunks


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (4, 12, 3), (8, 16, 4)])
def test_interleaved_peak_inflight_matches_megatron(p, m, v):
    # Narayanan et al. SC'21 Sec. 2.2.2: rank r holds its warm-up (p-r-1)*2 + (v-1)*p
    # chunk activations plus one, i.e. p + (p-1)/v micro-batches on rank 0.
    result = simulate(build_schedule(Schedule.INTERLEAVED_1F1B, p, m, v), StageCosts.uniform(p, v, 1.0, 2.0))
    assert result.peak_inflight == tuple(((p - r - 1) * 2 + (v - 1) * p + 1) / v for r in range(p))
    assert result.peak_inflight[0] == pytest.approx(p + (p - 1) / v)


@pytest.mark.parametrize("p, m", [(2, 4), (4, 4), (4, 10)])
def test_zero_bubble_h1_keeps_the_1f1b_peak(p, m):
    # Qi et al. 2024 Sec. 3.1: ZB-H1 holds p micro-batches (F done, W not yet) on every rank.
    result = simulate(build_schedule(Schedule.ZERO_BUBBLE, p, m), StageCosts.uniform(p, 1, 1.0, 1.0, 1.0))
    assert result.peak_inflight == (float(p),) * p


def test_equal_start_times_go_to_the_lower_rank():
    # GPipe, uniform: rank 0 starts F mb1 when rank 1 starts F mb0, both at t = 1 s.
    result = simulate(build_schedule(Schedule.GPIPE, 2, 2), StageCosts.uniform(2, 1, 1.0, 1.0))
    at_one = [(e.rank, e.phase, e.microbatch) for e in result.events if e.start_s == 1.0]
    assert at_one == [(0, F, 1), (1, F, 0)]


def test_gpipe_with_p2p_latency_matches_its_closed_form():
    # Derived: the first micro-batch crosses p-1 links forward and p-1 back, and nothing
    # else waits: step = m(F+B) + (p-1)(F+B+2c).
    p, m, c = 4, 8, 0.25
    result = simulate(build_schedule(Schedule.GPIPE, p, m), StageCosts.uniform(p, 1, 1.0, 2.0, p2p_s=c))
    assert result.step_time_s == m * 3.0 + (p - 1) * (3.0 + 2 * c)


def test_single_stage_has_no_bubble():
    result = simulate(build_schedule(Schedule.ONE_F_ONE_B, 1, 5), StageCosts.uniform(1, 1, 1.0, 2.0, p2p_s=9.0))
    assert result.step_time_s == 15.0 and result.bubble_fraction == 0.0


def test_zero_costs_give_zero_step():
    result = simulate(build_schedule(Schedule.ONE_F_ONE_B, 3, 4), StageCosts.uniform(3, 1, 0.0, 0.0))
    assert result.step_time_s == 0.0 and result.bubble_fraction == 0.0


def test_deadlock_names_the_stuck_tasks():
    tasks = list(build_schedule(Schedule.ONE_F_ONE_B, 3, 4))
    tasks[2] = tuple(reversed(tasks[2]))  # last rank wants B mb3 before running F mb3
    with pytest.raises(RuntimeError, match=r"deadlock.*rank 2 at task #0 \(B mb3 c0\)"):
        simulate(tasks, StageCosts.uniform(3, 1, 1.0, 2.0))


def test_weight_before_its_backward_deadlocks():
    tasks = ((Task(F, 0, 0), Task(W, 0, 0), Task(B, 0, 0)),)
    with pytest.raises(RuntimeError, match="W mb0 c0"):
        simulate(tasks, StageCosts.uniform(1, 1, 1.0, 1.0, 1.0))


@pytest.mark.parametrize("tasks, match", [
    (((Task(F, 0, 0), Task(F, 0, 0), Task(B, 0, 0)),), "more than once"),
    (((Task(F, 0, 0), Task(F, 1, 0), Task(B, 1, 0)),), "lacks task B mb0"),
    (((Task(F, 0, 1), Task(B, 0, 1)),), "chunk must be in"),
    (((Task(F, 0, 0), Task(B, 0, 0)), (Task(F, 0, 0), Task(B, 0, 0))), "2 ranks"),
])
def test_malformed_schedules_are_rejected(tasks, match):
    with pytest.raises(ScheduleError, match=match):
        simulate(tasks, StageCosts.uniform(1, 1, 1.0, 1.0))


def test_weight_time_without_weight_tasks_is_rejected_not_dropped():
    costs = StageCosts.uniform(2, 1, 1.0, 1.0, 1.0)
    tasks = build_schedule(Schedule.ONE_F_ONE_B, 2, 4)
    with pytest.raises(ValueError, match="fuse_weight"):
        simulate(tasks, costs)
    fused = simulate(tasks, costs.fuse_weight())
    assert fused.busy_s == (12.0, 12.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(forward_s=((1.0,),), backward_s=((1.0,), (1.0,)), weight_s=((0.0,),), p2p_s=0.0), "backward_s has shape"),
    (dict(forward_s=((-1.0,),), backward_s=((1.0,),), weight_s=((0.0,),), p2p_s=0.0), "forward_s"),
    (dict(forward_s=((1.0,),), backward_s=((math.nan,),), weight_s=((0.0,),), p2p_s=0.0), "backward_s"),
    (dict(forward_s=((1.0,),), backward_s=((1.0,),), weight_s=((0.0,),), p2p_s=-1.0), "p2p_s"),
    (dict(forward_s=(), backward_s=(), weight_s=(), p2p_s=0.0), "at least one rank"),
    (dict(forward_s=((1.0, 2.0), (1.0,)), backward_s=((1.0,),), weight_s=((0.0,),), p2p_s=0.0), "same number"),
])
def test_bad_costs_are_rejected(kwargs, match):
    with pytest.raises(ScheduleError, match=match):
        StageCosts(**kwargs)


def test_uniform_costs_fill_every_rank_and_chunk():
    costs = StageCosts.uniform(3, 2, 1.0, 2.0, 0.5, p2p_s=0.1)
    assert costs.forward_s == ((1.0, 1.0),) * 3 and costs.weight_s == ((0.5, 0.5),) * 3
    assert (costs.num_stages, costs.num_chunks, costs.p2p_s) == (3, 2, 0.1)
    assert costs.fuse_weight().backward_s == ((2.5, 2.5),) * 3
    with pytest.raises(ScheduleError, match="num_chunks"):
        StageCosts.uniform(3, 0, 1.0, 2.0)


def test_runs_of_one_shape_timed_together_equal_each_timed_alone():
    # simulate_schedules times the runs of a shape in one pass over its graph (columns of one
    # array): each run's timeline must be the one it has alone, bit for bit
    rng = np.random.default_rng(7)
    runs = []
    for schedule, p, m, v in ((Schedule.DUAL_PIPE_V, 4, 16, 2), (Schedule.ZERO_BUBBLE_V, 4, 12, 2),
                              (Schedule.INTERLEAVED_1F1B, 4, 8, 2), (Schedule.DUAL_PIPE_V, 4, 16, 2)):
        for _ in range(3):
            table = [tuple(tuple(float(x) for x in row) for row in rng.uniform(0.2, 2.0, (p, v))) for _ in range(3)]
            weight = table[2] if schedule in (Schedule.DUAL_PIPE_V, Schedule.ZERO_BUBBLE_V) else \
                tuple((0.0,) * v for _ in range(p))
            runs.append((schedule, m, StageCosts(forward_s=table[0], backward_s=table[1], weight_s=weight,
                                                 p2p_s=float(rng.uniform(0.0, 0.3)))))
    together = simulate_schedules(runs)
    for (schedule, m, costs), res in zip(runs, together):
        alone = simulate(build_schedule(schedule, costs.num_stages, m, costs.num_chunks), costs, placement(schedule))
        assert res.step_time_s == alone.step_time_s
        assert np.array_equal(res.columns.start_s, alone.columns.start_s)
        assert (res.busy_s, res.peak_inflight) == (alone.busy_s, alone.peak_inflight)
    assert len({r.step_time_s for r in together}) == len(runs)  # the runs differ
