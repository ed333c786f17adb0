"""Steps of many micro-batches: the pipeline makespan is extended from two simulations
instead of simulating every micro-batch (cost/estimate.py SIM_MICROBATCHES), and must equal
the full simulation; a huge batch answers in about the time of a small one."""

from __future__ import annotations

import json

import pytest

from paraplan.cli import main
from paraplan.cost import estimate as est_mod
from paraplan.cost.estimate import estimate
from paraplan.plan.axes import Schedule
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

MODEL = load_model("llama3-8b")


@pytest.mark.parametrize("schedule, vp", [(Schedule.ONE_F_ONE_B, 1), (Schedule.GPIPE, 1),
                                          (Schedule.INTERLEAVED_1F1B, 2), (Schedule.ZERO_BUBBLE, 1),
                                          (Schedule.BREADTH_FIRST, 4)])
def test_extended_makespan_equals_the_full_simulation(monkeypatch, schedule, vp):
    cluster = load_cluster("dgx-h100", num_gpus=32)
    plan = make_plan(tp=8, pp=4, dp=1, vp=vp, micro_batch_size=1, schedule=schedule)
    wl = Workload(global_batch_size=248, seq_len=2048)  # 248 micro-batches of one sequence
    full = estimate(MODEL, cluster, wl, plan)
    assert full.num_microbatches == 248 and full.sim is not None  # 248 <= 2·128: simulated whole
    monkeypatch.setattr(est_mod, "SIM_MICROBATCHES", 64)  # now 248 > 2·32: extended from 32 and 64
    ext = estimate(MODEL, cluster, wl, plan)
    assert ext.sim is None
    assert ext.step_time_s == pytest.approx(full.step_time_s, rel=1e-9)
    assert ext.time.bubble_s == pytest.approx(full.time.bubble_s, rel=1e-6, abs=1e-12)


def test_a_huge_batch_is_estimated_not_simulated_whole(capsys):
    # 4,000,000 micro-batches: simulating each one ran out of time and memory
    code = main(["estimate", "--model", "mpt-125m", "--gpus", "8", "--seq", "1024", "--pp", "2", "--dp", "4",
                 "--batch", "16000000", "--mb", "1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["num_microbatches"] == 4_000_000


def test_trace_refuses_a_micro_batch_cap_that_would_be_gigabytes(tmp_path, capsys):
    out = tmp_path / "t.json"
    code = main(["trace", "--model", "mpt-125m", "--gpus", "8", "--seq", "1024", "--pp", "2", "--dp", "4",
                 "--batch", "16000000", "--mb", "1", "--max-microbatches", "99999999", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "--max-microbatches" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_plans_finished_together_equal_each_finished_alone(monkeypatch):
    # finish_all simulates the plans of one schedule shape in one pass (and extends two runs
    # to m where m is large): each Estimate must be the one finish gives the plan alone
    from paraplan.cost.estimate import finish, finish_all
    from paraplan.cost.evaluate import evaluate
    from paraplan.plan.space import PlanBatch

    monkeypatch.setattr(est_mod, "SIM_MICROBATCHES", 16)  # 64 micro-batches > 2·8: extended
    cluster = load_cluster("dgx-h100", num_gpus=32)
    wl = Workload(global_batch_size=64, seq_len=2048)
    plans = [make_plan(tp=8, pp=4, dp=1, vp=vp, micro_batch_size=mb, schedule=schedule)
             for schedule, vp in ((Schedule.ONE_F_ONE_B, 1), (Schedule.INTERLEAVED_1F1B, 2), (Schedule.ZERO_BUBBLE_V, 2))
             for mb in (1, 2, 4)] + [make_plan(tp=8, pp=1, dp=4, micro_batch_size=2)]
    costs = [evaluate(MODEL, cluster, wl, PlanBatch.from_plans([p])) for p in plans]
    together = finish_all(MODEL, cluster, wl, plans, costs)
    for plan, c, est in zip(plans, costs, together):
        alone = finish(MODEL, cluster, wl, plan, c)
        assert (est.step_time_s, est.time, est.num_microbatches) == (alone.step_time_s, alone.time, alone.num_microbatches)
        assert (est.sim is None) == (alone.sim is None)
        if est.sim is not None:
            assert est.sim.step_time_s == alone.sim.step_time_s and est.sim.busy_s == alone.sim.busy_s
    assert len({e.step_time_s for e in together}) > 3
