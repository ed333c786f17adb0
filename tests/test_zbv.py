"""ZB-V (Qi et al. 2024 Sec. 6): two chunks per rank placed in a V, the backward split into
B and W. The order is torch's ScheduleZBVZeroBubble; the cost model's closed form is
checked against the event simulator; the engines build it or say why not."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.cost import memory as mem
from paraplan.cost.estimate import estimate
from paraplan.cost.bubbles import zbv_bubble_s
from paraplan.cost.evaluate import evaluate
from paraplan.errors import SpecError
from paraplan.plan.axes import AttentionKernel, Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch, SpaceLimits, check_plan, enumerate_space
from paraplan.sim.engine import StageCosts, simulate
from paraplan.sim.schedules import (Phase, Placement, ScheduleError, build_schedule, placement, stage_rank,
                                    virtual_stage)
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

from support import assert_torchtitan_runs_schedule_eager_only, closed_form_step_s

ZBV = Schedule.ZERO_BUBBLE_V


def _sim(p, m, f, b, w, c=0.0):
    return simulate(build_schedule(ZBV, p, m, 2), StageCosts.uniform(p, 2, f, b, w, c), Placement.V_SHAPE)


def test_order_is_torchs_zbv_schedule():
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    kind = {"F": Phase.FORWARD, "I": Phase.BACKWARD, "W": Phase.WEIGHT}
    for p in range(1, 9):
        for m in range(1, 3 * p + 2):
            ours = build_schedule(ZBV, p, m, 2)
            fake = SimpleNamespace(pp_group_size=p, num_stages=2 * p, _n_microbatches=m)
            for rank in range(p):
                theirs = [a for a in schedules.ScheduleZBVZeroBubble._calculate_single_rank_operations(fake, rank)
                          if a is not None]
                assert [(kind[a.computation_type.value], a.stage_index, a.microbatch_index) for a in theirs] == [
                    (t.phase, int(virtual_stage(Placement.V_SHAPE, p, rank, t.chunk)), t.microbatch)
                    for t in ours[rank]], (p, m, rank)


def test_v_placement_puts_both_ends_on_the_first_rank():
    p = 4
    stages = [[int(virtual_stage(Placement.V_SHAPE, p, r, c)) for c in range(2)] for r in range(p)]
    assert stages == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [int(stage_rank(Placement.V_SHAPE, p, j)) for j in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert placement(ZBV) is Placement.V_SHAPE and placement(Schedule.INTERLEAVED_1F1B) is Placement.LOOPED


def test_the_turn_of_the_v_sends_nothing():
    # one micro-batch down and back up: 2p chunk forwards and 2p backwards in a row, with a
    # send at each of the 2(p-1) rank changes each way and none at the turn (stage p-1 -> p)
    p, c = 4, 0.25
    one = _sim(p, 1, 1.0, 1.0, 0.0, c)
    assert one.step_time_s == pytest.approx(2 * p * 1.0 + 2 * p * 1.0 + 4 * (p - 1) * c)
    # the looped placement sends at every one of its 2p - 1 hops each way
    looped = simulate(build_schedule(Schedule.INTERLEAVED_1F1B, p, p, 2), StageCosts.uniform(p, 2, 1.0, 1.0, 0.0, c))
    first = [e for e in looped.events if e.microbatch == 0 and e.phase is Phase.FORWARD]
    assert first[-1].end_s == pytest.approx(2 * p * 1.0 + (2 * p - 1) * c)


def test_needs_two_chunks():
    with pytest.raises(ScheduleError, match="exactly 2 chunks"):
        build_schedule(ZBV, 4, 8, 3)
    with pytest.raises(ScheduleError, match="placement 'v' needs 2 chunks"):
        simulate(build_schedule(Schedule.ONE_F_ONE_B, 2, 2), StageCosts.uniform(2, 1, 1.0, 1.0), Placement.V_SHAPE)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_peak_memory_is_1f1bs_and_bubble_a_sixth_of_it(p):
    # Qi et al. 2024 Sec. 6: ZB-V keeps 1F1B's peak activation memory (p micro-batches of a
    # whole stage on the first rank). At equal chunk times torch's order leaves only the
    # warm-up offset, (p-1) chunk forwards: half ZB-H1's bubble, a sixth of 1F1B's (derived)
    m = 4 * p
    zbv = _sim(p, m, 1.0, 1.0, 1.0)
    assert zbv.peak_inflight == (float(p),) * p
    assert zbv.step_time_s - zbv.ideal_s == (p - 1) * 1.0
    one_f_one_b = simulate(build_schedule(Schedule.ONE_F_ONE_B, p, m), StageCosts.uniform(p, 1, 2.0, 4.0))
    zb_h1 = simulate(build_schedule(Schedule.ZERO_BUBBLE, p, m), StageCosts.uniform(p, 1, 2.0, 2.0, 2.0))
    assert one_f_one_b.peak_inflight[0] == zbv.peak_inflight[0]
    assert (one_f_one_b.step_time_s - one_f_one_b.ideal_s) == 6 * (zbv.step_time_s - zbv.ideal_s)
    assert (zb_h1.step_time_s - zb_h1.ideal_s) == 2 * (zbv.step_time_s - zbv.ideal_s)


def _random_costs(rng, n):
    f, b, w = rng.uniform(0.3, 3.0, (3, n))
    return f, b, w, rng.uniform(0.0, 0.3, n) * np.minimum(np.minimum(f, b), w)


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8, 16])
def test_closed_form_is_the_simulated_bubble_where_exact(p):
    # m <= p and m >= 2p - 1: the largest of the critical paths' linear forms (docs/model.md)
    rng = np.random.default_rng(p)
    ms = sorted({1, 2, max(p - 1, 1), p, 2 * p - 1, 2 * p, 3 * p + 1})
    for m in ms:
        for f, b, w, c in zip(*_random_costs(rng, 12)):
            sim = _sim(p, m, f, b, w, c)
            assert float(zbv_bubble_s(p, m, f, b, w, c)) == pytest.approx(sim.step_time_s - sim.ideal_s,
                                                                           rel=1e-9, abs=1e-12), (p, m, f, b, w, c)


@pytest.mark.parametrize("p", [4, 8, 16])
def test_closed_form_interpolates_within_seven_percent_of_the_step_in_between(p):
    rng = np.random.default_rng(100 + p)
    worst = 0.0
    for m in range(p + 1, 2 * p - 1):
        for f, b, w, c in zip(*_random_costs(rng, 8)):
            sim = _sim(p, m, f, b, w, c)
            closed = float(zbv_bubble_s(p, m, f, b, w, c)) + sim.ideal_s
            worst = max(worst, abs(closed - sim.step_time_s) / sim.step_time_s)
    assert 0.0 < worst < 0.07  # 6.0% at p = 8 on these samples


def test_closed_form_is_vectorized():
    f, b, w, c = _random_costs(np.random.default_rng(0), 5)
    p, m = np.array([2, 4, 4, 8, 8]), np.array([3, 2, 6, 30, 8])
    batch = zbv_bubble_s(p, m, f, b, w, c)
    assert batch.shape == (5,)
    assert batch.tolist() == [float(zbv_bubble_s(*x)) for x in zip(p, m, f, b, w, c)]


def _llama(gpus=512):
    return load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=gpus)


@pytest.mark.parametrize("batch, pp, dp", [(512, 8, 8), (64, 8, 8), (8, 8, 8), (512, 4, 16)])
def test_cost_model_step_is_within_three_percent_of_the_simulated_one(batch, pp, dp):
    # the search ranks by the closed form (embedding and head on the first rank, which fills
    # some of the bubble); the plans shown are simulated
    model, cluster = _llama()
    wl = Workload(global_batch_size=batch, seq_len=8192)
    plan = make_plan(tp=8, pp=pp, dp=dp, vp=2, schedule=ZBV, micro_batch_size=1, zero=ZeroStage.OPTIMIZER,
                     sequence_parallel=True, attention=AttentionKernel.FLASH3)
    closed = closed_form_step_s(model, cluster, wl, plan)
    simulated = estimate(model, cluster, wl, plan)
    assert simulated.sim is not None and simulated.sim.peak_inflight[0] == pytest.approx(min(pp, (batch // dp + 1) / 2))
    assert closed == pytest.approx(simulated.step_time_s, rel=0.03)


def test_first_rank_holds_embedding_head_and_logits():
    model, cluster = _llama()
    wl = Workload(global_batch_size=512, seq_len=8192)
    kw = dict(tp=8, pp=8, dp=8, vp=2, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, sequence_parallel=True)
    zbv = estimate(model, cluster, wl, make_plan(schedule=ZBV, **kw))
    interleaved = estimate(model, cluster, wl, make_plan(schedule=Schedule.INTERLEAVED_1F1B, **kw))
    # the first rank is the worst stage: one micro-batch's loss state (interleaved 1F1B's
    # worst, its first stage, has none) beside the embedding and the head; the state holds the
    # head's saved inputs too, the final norm's and the head GEMM's (SP shards, Megatron)
    one = mem.logits_bytes_per_element(wl.precision) * 8192 * model.vocab_size / 8 + (2 + 2) * 8192 * model.hidden_size / 8
    assert zbv.memory.logits_bytes == pytest.approx(one) and interleaved.memory.logits_bytes == 0.0
    assert zbv.memory.weights_bytes > interleaved.memory.weights_bytes
    # ... and its step beats interleaved 1F1B's with the same two chunks per rank
    assert zbv.step_time_s < interleaved.step_time_s


def test_plan_rules():
    model, cluster = _llama()
    wl = Workload(global_batch_size=512, seq_len=8192)
    bad = check_plan(make_plan(tp=8, pp=8, dp=8, vp=4, schedule=ZBV), model, cluster, wl)
    assert bad is not None and "VP must be 2" in bad.reason
    assert check_plan(make_plan(tp=8, pp=8, dp=8, vp=2, schedule=ZBV), model, cluster, wl) is None
    # the search offers it with two chunks per rank only
    seen = set()
    limits = SpaceLimits(schedules=(ZBV,), recomputes=(make_plan().recompute,))
    for batch, _ in enumerate_space(model, cluster, wl, limits, {"tp": 8, "pp": 8}):
        seen |= set(zip(batch.vp.tolist(), batch.schedule_code.tolist()))
    assert seen == {(2, ZBV.code)}


def test_engines(tmp_path, capsys):
    assert_torchtitan_runs_schedule_eager_only(tmp_path, capsys, "zbv", "ZBVZeroBubble")


def test_run_refuses_compiled_zero_bubble_stages():
    from paraplan.run.cli import config_from_argv
    argv = ["--model", "llama3-8b", "--layers", "4", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
            "--vocab", "256", "--seq", "32", "--batch", "4", "--pp", "2", "--vp", "2", "--schedule", "zbv",
            "--device", "cpu"]
    assert config_from_argv(argv).plan.schedule is ZBV
    with pytest.raises(SpecError, match="--compile"):
        config_from_argv([*argv, "--compile"])


def test_trace_names_each_chunks_own_layers(tmp_path):
    # the per-layer slices under a task are the layers of its virtual stage (the V's, not the
    # looped placement's: chunk 1 of rank 0 is the last stage)
    out = tmp_path / "t.json"
    assert main(["trace", "--model", "llama3-8b", "--gpus", "16", "--seq", "4096", "--batch", "16", "--tp", "2",
                 "--pp", "4", "--vp", "2", "--schedule", "zbv", "--dp", "2", "--zero", "1", "-o", str(out)]) == 0
    import json
    events = json.loads(out.read_text())["traceEvents"]
    tasks = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("forward", "backward", "weight")]
    layer_slices = [e for e in events if e.get("ph") == "X" and "layer" in e.get("args", {})]
    for task in tasks:
        label = task["args"]["layers"]
        inside = {e["args"]["layer"] for e in layer_slices if e["pid"] == task["pid"]
                  and task["ts"] <= e["ts"] < task["ts"] + task["dur"]}
        spans = [part for part in label.split(", ") if part.startswith("L")]
        lo, hi = (int(x) for x in spans[0][1:].split("-"))
        assert inside and inside <= set(range(lo, hi + 1)), (task["name"], task["pid"], label, sorted(inside))


def test_last_rank_keeps_its_whole_recompute_working_set():
    # under ZB-V the last rank computes no loss: its memory cannot fall as the vocabulary grows
    cluster = load_cluster("dgx-h100", num_gpus=16)
    wl = Workload(global_batch_size=16, seq_len=8192)
    base = load_model("llama3-8b")
    acts = []
    for vocab in (8000, 16000, 32000):
        model = dataclasses.replace(base, num_layers=30, vocab_size=vocab)
        plan = make_plan(tp=8, pp=2, dp=1, vp=2, schedule=ZBV, micro_batch_size=1, sequence_parallel=True,
                         recompute=Recompute.FULL)
        costs = evaluate(model, cluster, wl, PlanBatch.from_plans([plan]))
        acts.append(float(np.asarray(costs.memory.activations_bytes).reshape(-1)[0]))
    assert acts[0] <= acts[1] <= acts[2]


def test_search_narrows_to_the_schedules_asked_for(capsys):
    import json
    assert main(["search", "--gpus", "64", "--pp", "4", "--schedule", "zbv,zb", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    plans = [r["plan"] for r in shown["ranked"]] if "ranked" in shown else []
    assert plans and all(p["schedule"] in ("zbv", "zb") for p in plans)
    assert main(["search", "--schedule", "zbx"]) == 2
    assert "schedule='zbx' is not allowed" in capsys.readouterr().err
    assert main(["search", "--engine", "megatron", "--schedule", "zbv"]) == 2
    assert "megatron allows 1f1b, interleaved" in capsys.readouterr().err
