"""The schedule search (sim/repetend.py; Tessel, Lin et al. HPCA 2024): every order it returns
fits the cap, holds each task once, runs without deadlock and is never slower than the named
schedules that fit; on the documented case (docs/model/step.md, "Schedule search") it beats
them; bad caps are one-line errors; and its order exports as torch's action list."""

from __future__ import annotations

from collections import Counter

import pytest

from paraplan.plan.axes import Schedule
from paraplan.sim.engine import StageCosts, simulate
from paraplan.sim.repetend import search_schedule
from paraplan.sim.schedules import Phase, ScheduleError


def _uneven(p: int, head_s: float, p2p_s: float = 0.0) -> StageCosts:
    """F = B = W = 1 s, the last stage's F and B longer by `head_s` (the LM head and the loss)."""
    f = tuple((1.0 + (head_s if r == p - 1 else 0.0),) for r in range(p))
    return StageCosts(forward_s=f, backward_s=f, weight_s=tuple((1.0,) for _ in range(p)), p2p_s=p2p_s)


def _one_f_one_b(p: int) -> tuple[float, ...]:
    return tuple(float(p - r) for r in range(p))


CASES = [(p, m, cap, costs)
         for p in (2, 3, 4, 8)
         for m in sorted({p, 2 * p, min(4 * p, 32)})
         for cap in (1, max(1, p // 2), p, p + 2, _one_f_one_b(p))
         for costs in (StageCosts.uniform(p, 1, 1.0, 1.0, 1.0), _uneven(p, 1.0, p2p_s=0.1),
                       StageCosts.uniform(p, 1, 1.0, 2.0, 0.0))]


@pytest.mark.parametrize("p, m, cap, costs", CASES)
def test_searched_order_fits_is_complete_and_no_slower_than_named(p, m, cap, costs):
    result = search_schedule(costs, m, cap)
    caps = cap if isinstance(cap, tuple) else (float(cap),) * p
    # timed again from scratch: no deadlock, the same step, and the peak under the cap
    timed = costs if result.split_backward else costs.fuse_weight()
    sim = simulate(result.tasks, timed)
    assert sim.step_time_s == result.step_time_s
    assert all(peak <= c for peak, c in zip(sim.peak_inflight, caps))
    phases = (Phase.FORWARD, Phase.BACKWARD, Phase.WEIGHT) if result.split_backward else (Phase.FORWARD, Phase.BACKWARD)
    for tasks in result.tasks:
        count = Counter((t.phase, t.microbatch, t.chunk) for t in tasks)
        assert set(count) == {(ph, i, 0) for ph in phases for i in range(m)} and set(count.values()) == {1}
    best = result.best_named_s
    if best is not None:
        assert result.step_time_s <= best
    # a named result is exactly that schedule's order and time
    if result.repetend is None:
        assert result.step_time_s == dict(result.named)[Schedule(result.source)]


def test_documented_case_beats_every_named_schedule_that_fits():
    # docs/model/step.md "Schedule search": 4 stages, 16 micro-batches, F = B = W = 1 s, each
    # rank capped at 1F1B's own in-flight activations (4, 3, 2, 1): GPipe (16) and ZB-H1 (4 on
    # every rank) do not fit; 1F1B takes 57 s; the searched order, 1F1B's depths with the
    # backward split and each W right after its B, 54 s (its input gradients reach the stage
    # before one W sooner per hop)
    result = search_schedule(StageCosts.uniform(4, 1, 1.0, 1.0, 1.0), 16, _one_f_one_b(4))
    assert dict(result.named) == {Schedule.GPIPE: None, Schedule.ONE_F_ONE_B: 57.0, Schedule.ZERO_BUBBLE: None}
    assert result.source == "repetend" and result.step_time_s == 54.0 < result.best_named_s
    assert result.sim.peak_inflight == (4.0, 3.0, 2.0, 1.0)
    assert str(result.repetend) == "repetend F B W, depth 4/3/2/1, lag 0/0/0/0"
    # with the LM head's stage 1 s longer per pass and 0.1 s sends, still ahead of 1F1B
    heavy = search_schedule(_uneven(4, 1.0, p2p_s=0.1), 16, _one_f_one_b(4))
    assert heavy.source == "repetend" and heavy.step_time_s < heavy.best_named_s


def test_below_every_named_schedule_the_search_still_finds_one():
    # a cap under 1F1B's first rank: no named schedule fits, the searched order does
    result = search_schedule(StageCosts.uniform(8, 1, 1.0, 1.0, 1.0), 32, 6)
    assert result.best_named_s is None and result.source == "repetend"
    assert max(result.sim.peak_inflight) <= 6


def test_where_a_named_schedule_is_optimal_it_is_kept():
    # ZB-H1 at uniform costs and cap p: the last rank starts after p - 1 forwards and works
    # 3m passes, (p - 1) + 3m = 51 s is a lower bound, which ZB-H1 reaches
    result = search_schedule(StageCosts.uniform(4, 1, 1.0, 1.0, 1.0), 16, 4)
    assert result.source == "zb" and result.repetend is None and result.step_time_s == 51.0


@pytest.mark.parametrize("cap, needle", [
    (0, "cap_inflight=0 is not allowed"), (0.5, "cap_inflight=0.5"), (float("nan"), "cap_inflight=nan"),
    ("x", "cap_inflight='x'"), (True, "cap_inflight=True"), ((4, 3), "cap_inflight has 2 values"),
    ((4, 3, 2, -1), "cap_inflight=-1"),
])
def test_bad_caps_are_one_line_errors(cap, needle):
    with pytest.raises(ScheduleError) as err:
        search_schedule(StageCosts.uniform(4, 1, 1.0, 1.0, 1.0), 8, cap)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_more_than_one_chunk_is_a_one_line_error():
    with pytest.raises(ScheduleError, match="num_chunks=2 is not allowed"):
        search_schedule(StageCosts.uniform(4, 2, 1.0, 1.0, 1.0), 8, 4)


def test_action_rows_are_torch_actions():
    from paraplan.export.torch_pipeline import action_rows, csv_text
    result = search_schedule(StageCosts.uniform(2, 1, 1.0, 1.0, 1.0), 4, (2, 1))
    rows = action_rows(result.tasks)
    assert rows[0] == ("0F0", "0F1", "0I0", "0W0", "0F2", "0I1", "0W1", "0F3", "0I2", "0W2", "0I3", "0W3")
    assert csv_text(rows).splitlines()[1] == ",".join(rows[1])
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    parsed = [schedules._Action.from_str(a) for a in rows[1]]
    assert [str(a) for a in parsed] == list(rows[1]) and parsed[1].computation_type.value == "I"


def test_estimate_shows_the_search_beside_a_1f1b_plan(capsys):
    # docs/model/step.md: llama3-8b, TP2 PP4 1F1B, batch 16 on 8 H100: the searched order at
    # the plan's own in-flight activations (4/3/2/1) shortens the pipeline and the step
    import json
    from paraplan.cli import main
    assert main(["estimate", "--model", "llama3-8b", "--gpus", "8", "--pp", "4", "--tp", "2",
                 "--schedule", "1f1b", "--batch", "16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    found = d["schedule_search"]
    assert found["source"] == "repetend" and found["cap_inflight"] == [4.0, 3.0, 2.0, 1.0]
    assert found["pipeline_s"] < found["named_pipeline_s"]["1f1b"]
    assert found["named_pipeline_s"]["zb"] is None and found["step_time_s"] < d["step_time_s"]
    # a plan with several chunks per rank has none
    assert main(["estimate", "--model", "llama3-8b", "--gpus", "8", "--pp", "4", "--tp", "2", "--vp", "2",
                 "--batch", "16", "--json"]) == 0
    assert "schedule_search" not in json.loads(capsys.readouterr().out)
