"""Bubble filling (PipeFisher, Osawa et al. MLSys 2023): each rank's idle time in the simulated
step (sim/idle.py) and the work placed in it (cost/bubble_fill.py, estimate --fill-bubbles)."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from support import assert_user_error, run

from paraplan.cost.breakdown import TimeBreakdown
from paraplan.cost.bubble_fill import BubbleWork, PricedWork, fill_bubbles
from paraplan.cost.estimate import estimate, pipeline_runs, stage_costs
from paraplan.cost.evaluate import evaluate
from paraplan.errors import SpecError
from paraplan.plan.axes import Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch
from paraplan.report.labels import OPTIMIZER_STEP, SP_NORM_ALL_REDUCE
from paraplan.sim.engine import StageCosts, simulate_schedule
from paraplan.sim.idle import pipeline_idle
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

SCHEDULES = [(Schedule.GPIPE, 1, False), (Schedule.ONE_F_ONE_B, 1, False), (Schedule.INTERLEAVED_1F1B, 2, False),
             (Schedule.BREADTH_FIRST, 3, False), (Schedule.ZERO_BUBBLE, 1, True), (Schedule.ZERO_BUBBLE_V, 2, True),
             (Schedule.DUAL_PIPE_V, 2, True)]
SMALL_PP = ["--model", "llama3-8b", "--gpus", "16", "--seq", "2048", "--batch", "16", "--tp", "2", "--pp", "4",
            "--mb", "1"]


def _random_costs(rng: random.Random, p: int, v: int, split: bool) -> StageCosts:
    def table(lo, hi):
        return tuple(tuple(rng.uniform(lo, hi) for _ in range(v)) for _ in range(p))
    return StageCosts(forward_s=table(0.5, 1.5), backward_s=table(1.0, 2.5),
                      weight_s=table(0.3, 1.0) if split else table(0.0, 0.0), p2p_s=rng.uniform(0.0, 0.2))


@pytest.mark.parametrize("schedule,v,split", SCHEDULES, ids=[s.value for s, _, _ in SCHEDULES])
def test_idle_and_busy_add_up_to_the_step_on_every_rank(schedule, v, split):
    rng = random.Random(7)
    for p, m in ((2, 4), (4, 8), (5, 10)):
        result = simulate_schedule(schedule, m, _random_costs(rng, p, v, split))
        idle = pipeline_idle(result)
        assert len(idle.ranks) == p and idle.makespan_s == result.step_time_s
        for busy, rank in zip(result.busy_s, idle.ranks):
            assert min(rank.warmup_s, rank.gaps_s, rank.cooldown_s) >= 0.0
            assert busy + rank.total_s == pytest.approx(result.step_time_s, rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (6, 6), (8, 32)])
def test_1f1b_idle_is_the_closed_form_split(p, m):
    """Uniform 1F1B without sends: rank r idles r·f before its first forward, r·b after its
    last backward and (p − 1 − r)(f + b) between its tasks; (p − 1)(f + b) on every rank."""
    f, b = 1.0, 2.5
    result = simulate_schedule(Schedule.ONE_F_ONE_B, m, StageCosts.uniform(p, 1, f, b))
    idle = pipeline_idle(result)
    for r, rank in enumerate(idle.ranks):
        assert rank.warmup_s == pytest.approx(r * f)
        assert rank.cooldown_s == pytest.approx(r * b)
        assert rank.gaps_s == pytest.approx((p - 1 - r) * (f + b))
        assert rank.total_s == pytest.approx((p - 1) * (f + b)) == pytest.approx(result.bubble_s[r])
    # the first rank starts first and finishes last: its idle is all gaps
    assert idle.ranks[0].warmup_s == idle.ranks[0].cooldown_s == 0.0


def test_gaps_hold_whole_pieces_only():
    result = simulate_schedule(Schedule.ONE_F_ONE_B, 8, StageCosts.uniform(4, 1, 1.0, 2.0))
    gaps = [r.gaps_s for r in pipeline_idle(result).ranks]
    assert [r.gap_pieces for r in pipeline_idle(result, 0.25).ranks] == [4 * g for g in gaps]  # gaps: whole seconds
    assert all(r.gap_pieces == 0 for r in pipeline_idle(result, max(gaps) + 1.0).ranks)


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=16), Workload(global_batch_size=16, seq_len=2048)


def test_extrapolated_idle_matches_the_full_simulation(llama8b):
    """Past 2·m1 micro-batches the estimate times m1 and 2·m1 and extends the line to m: the
    idle time and the pieces the gaps hold follow the same line as the full simulation."""
    model, cluster, _ = llama8b
    wl = Workload(global_batch_size=300, seq_len=2048)
    plan = make_plan(tp=4, pp=4, dp=1, micro_batch_size=1, sequence_parallel=True)
    costs = evaluate(model, cluster, wl, PlanBatch.from_plans([plan]))
    assert len(pipeline_runs(plan, costs).counts) == 2  # extrapolated
    est = estimate(model, cluster, wl, plan, bubble_work=BubbleWork(extra_flops=4e13, pieces=64))
    full = pipeline_idle(simulate_schedule(plan.schedule, 300, stage_costs(costs, plan)), est.idle.piece_s)
    assert est.idle.makespan_s == pytest.approx(full.makespan_s, rel=1e-9)
    for got, want in zip(est.idle.ranks, full.ranks):
        for name in ("warmup_s", "gaps_s", "cooldown_s"):
            assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-9, abs=1e-12), name
        assert got.gap_pieces == want.gap_pieces


@pytest.mark.parametrize("schedule,v,_", SCHEDULES, ids=[s.value for s, _, _ in SCHEDULES])
def test_filling_the_optimizer_step_never_slows_the_step(llama8b, schedule, v, _):
    model, cluster, wl = llama8b
    plan = make_plan(tp=2, pp=4, dp=2, vp=v, schedule=schedule, micro_batch_size=1, sequence_parallel=True)
    plain = estimate(model, cluster, wl, plan)
    filled = estimate(model, cluster, wl, plan, bubble_work=BubbleWork())
    fill = filled.bubble_fill
    assert plain.bubble_fill is None and plain.time.bubble_work_s == 0.0
    assert fill.plain_step_s == fill.unfilled_step_s == plain.step_time_s
    assert filled.step_time_s == fill.filled_step_s <= plain.step_time_s
    assert sum(filled.time.parts().values()) == pytest.approx(filled.step_time_s, rel=1e-12)


def test_filling_a_long_optimizer_step_shortens_the_step(llama8b):
    """An offloaded optimizer takes a large share of the step; with two MTP modules the last
    stage has more parameters than the first, whose work stays exposed (the first rank ends
    the pipeline): the last rank's longer work hides in its cool-down and warm-up."""
    model, cluster, wl = llama8b
    model = replace(model, mtp_layers=2)
    wl = replace(wl, global_batch_size=32, seq_len=4096)
    plan = make_plan(tp=2, pp=4, dp=2, micro_batch_size=1, sequence_parallel=True, offload_optimizer=True,
                     zero=ZeroStage.OPTIMIZER)
    plain = estimate(model, cluster, wl, plan)
    filled = estimate(model, cluster, wl, plan, bubble_work=BubbleWork())
    ranks = filled.bubble_fill.ranks
    assert ranks[-1].after_s > ranks[0].after_s  # the head's stage steps more parameters
    assert filled.step_time_s < 0.97 * plain.step_time_s
    assert filled.bubble_fill.binding_rank == 0
    # the step ends with the first rank's own work: all of it exposed
    assert filled.step_time_s == pytest.approx(plain.step_time_s - plain.time.optimizer_s
                                               - plain.time.dp_comm_s + ranks[0].after_s - plain.step_detail[
                                                   SP_NORM_ALL_REDUCE], rel=1e-12)


def _uniform_fill(p: int, m: int, f: float, b: float, piece_s: float, pieces: int):
    """A uniform 1F1B step whose only after-pipeline work is `pieces` of extra work."""
    result = simulate_schedule(Schedule.ONE_F_ONE_B, m, StageCosts.uniform(p, 1, f, b))
    time = TimeBreakdown(compute_s=m * (f + b), recompute_s=0.0, tp_comm_s=0.0, cp_comm_s=0.0, ep_comm_s=0.0,
                         pp_comm_s=0.0, dp_comm_s=0.0, bubble_s=result.step_time_s - m * (f + b), optimizer_s=0.0)
    detail = {"DP/ZeRO collectives (exposed)": 0.0, SP_NORM_ALL_REDUCE: 0.0, OPTIMIZER_STEP: 0.0}
    work = PricedWork(piece_s=piece_s, pieces=pieces, after_s=(0.0,) * p)
    return result, fill_bubbles(time, detail, pipeline_idle(result, piece_s), work)


def test_work_beyond_every_bubble_lengthens_the_step_by_the_excess():
    p, m, f, b = 4, 8, 1.0, 2.0
    bubble = (p - 1) * (f + b)  # every rank's idle time
    result, (fill, time) = _uniform_fill(p, m, f, b, piece_s=0.25, pieces=60)  # 15 s of work
    assert fill.unfilled_step_s == pytest.approx(result.step_time_s + 15.0)
    assert fill.filled_step_s == pytest.approx(result.step_time_s + 15.0 - bubble)
    assert time.bubble_work_s == pytest.approx(15.0 - bubble) and time.total == fill.filled_step_s


def test_work_that_fits_the_bubbles_costs_nothing_and_whole_pieces_leave_holes():
    p, m, f, b = 4, 8, 1.0, 2.0
    result, (fill, _) = _uniform_fill(p, m, f, b, piece_s=0.25, pieces=36)  # 9 s: exactly every rank's idle time
    assert fill.filled_step_s == pytest.approx(result.step_time_s) and fill.binding_rank is None
    # pieces of 2 s: rank 0's gaps of 3 s hold one each, so its 9 s of idle take 3 pieces, not 4.5
    _, (fill, _) = _uniform_fill(p, m, f, b, piece_s=2.0, pieces=4)
    assert fill.ranks[0].in_gaps_s == 6.0 and fill.ranks[0].exposed_s == 2.0 and fill.binding_rank == 0


def test_extra_work_in_an_estimate(llama8b):
    model, cluster, wl = llama8b
    plan = make_plan(tp=2, pp=4, dp=2, micro_batch_size=1, sequence_parallel=True)
    plain = estimate(model, cluster, wl, plan)
    small = estimate(model, cluster, wl, plan, bubble_work=BubbleWork(extra_flops=2e12, extra_bytes=1e9))
    big = estimate(model, cluster, wl, plan, bubble_work=BubbleWork(extra_flops=2e15))
    fill_s, fill_b = small.bubble_fill, big.bubble_fill
    assert fill_s.pieces == 8 and fill_s.extra_s == pytest.approx(8 * fill_s.piece_s)  # one piece per layer
    assert fill_s.unfilled_step_s == pytest.approx(plain.step_time_s + fill_s.extra_s, rel=1e-12)
    assert small.step_time_s <= estimate(model, cluster, wl, plan, bubble_work=BubbleWork()).step_time_s + 1e-12
    assert plain.step_time_s < big.step_time_s < fill_b.unfilled_step_s
    assert big.time.bubble_work_s > 0 and sum(big.time.parts().values()) == pytest.approx(big.step_time_s)


@pytest.mark.parametrize("kwargs", [dict(extra_flops=-1.0), dict(extra_bytes=float("nan")),
                                    dict(extra_flops=float("inf")), dict(pieces=0), dict(pieces=2.5)])
def test_bad_bubble_work_is_a_one_line_error(kwargs):
    with pytest.raises(SpecError) as exc:
        BubbleWork(**kwargs)
    assert "\n" not in str(exc.value) and next(iter(kwargs)) in str(exc.value)


@pytest.mark.parametrize("argv", [["--fill-bubbles", "--bubble-work-tflop", "-1"],
                                  ["--fill-bubbles", "--bubble-work-gb", "nan"],
                                  ["--fill-bubbles", "--bubble-work-tflop", "1e10"],
                                  ["--bubble-work-tflop", "2.5"],
                                  ["--fill-bubbles", "--bubble-work-tflop", "2.5", "--bubble-work-pieces", "0"],
                                  ["--fill-bubbles", "--bubble-work-pieces", "4"],
                                  ["--fill-bubbles", "--whatif"]])
def test_cli_bad_bubble_flags_exit_2(capsys, argv):
    line = assert_user_error(*run(capsys, "estimate", *SMALL_PP, *argv))
    assert "bubble-work" in line or "--whatif" in line


def test_cli_estimate_fill_bubbles(capsys):
    code, out, err = run(capsys, "estimate", *SMALL_PP, "--fill-bubbles", "--bubble-work-tflop", "50",
                         "--bubble-work-gb", "10", "--json")
    assert code == 0, err
    d = json.loads(out)
    fill = d["bubble_fill"]
    assert d["step_time_s"] == fill["filled_step_s"] <= fill["unfilled_step_s"]
    assert len(fill["ranks"]) == 4 and {"warmup_s", "gaps_s", "cooldown_s", "exposed_s"} <= set(fill["ranks"][0])
    code, out, err = run(capsys, "estimate", *SMALL_PP, "--fill-bubbles")
    assert code == 0, err
    assert "bubble filling (PipeFisher)" in out and "idle before" in out
    code, out, _ = run(capsys, "estimate", *SMALL_PP, "--json")
    assert "bubble_fill" not in json.loads(out)


def test_the_documented_cases_hold():
    """docs/model/step.md, Bubble filling: what its two cases show."""
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=64)
    wl = Workload(global_batch_size=64, seq_len=4096)
    plan = make_plan(tp=8, pp=8, dp=1, micro_batch_size=1, sequence_parallel=True,
                     attention=cluster.gpu.attention_kernels[-1])

    def filled(tflop: float = 0.0, gb: float = 0.0, pieces: int | None = None):
        return estimate(model, cluster, wl, plan, bubble_work=BubbleWork(extra_flops=tflop * 1e12,
                                                                          extra_bytes=gb * 1e9, pieces=pieces))
    alone = filled().step_time_s
    assert filled(25, 10).step_time_s == pytest.approx(alone, rel=1e-12)  # hidden whole
    coarse, fine = filled(250, 100).bubble_fill, filled(250, 100, 40).bubble_fill
    assert coarse.plain_step_s < coarse.filled_step_s < coarse.unfilled_step_s  # per-layer pieces: partly
    assert fine.filled_step_s == pytest.approx(alone, rel=1e-12)  # 40 pieces: hidden whole
    small = replace(load_model("llama3-8b"), mtp_layers=2)
    cluster = load_cluster("dgx-h100", num_gpus=16)
    wl = Workload(global_batch_size=32, seq_len=4096)
    plan = make_plan(tp=2, pp=4, dp=2, micro_batch_size=1, sequence_parallel=True, offload_optimizer=True,
                     zero=ZeroStage.OPTIMIZER, attention=cluster.gpu.attention_kernels[-1])
    fill = estimate(small, cluster, wl, plan, bubble_work=BubbleWork()).bubble_fill
    assert 0.92 < fill.filled_step_s / fill.plain_step_s < 0.96  # the docs: −6%
