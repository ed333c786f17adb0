"""What the cost model takes from the pipeline schedule: micro-batches in flight per stage
(memory), the window the DP reduction hides behind, and the closed-form ZB-H1 bubble the
search ranks plans by, each tied to the schedule simulator."""

from __future__ import annotations

import pytest

from paraplan.cost import memory as mem
from paraplan.cost.allocator import allocated_bytes
from paraplan.cost.estimate import estimate
from paraplan.cost.evaluate import evaluate
from paraplan.plan.axes import Recompute, Schedule
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch
from paraplan.sim.engine import StageCosts, simulate
from paraplan.sim.schedules import SPLIT_BACKWARD, Phase, build_schedule, placement, stage_rank, virtual_stage
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

STAGES = (2, 3, 4, 6)
MICROBATCHES = (1, 2, 3, 4, 5, 8, 12)
CHUNKS = {Schedule.GPIPE: (1,), Schedule.ONE_F_ONE_B: (1,), Schedule.ZERO_BUBBLE: (1,),
          Schedule.INTERLEAVED_1F1B: (2, 3, 4), Schedule.BREADTH_FIRST: (1, 2, 3), Schedule.ZERO_BUBBLE_V: (2,),
          Schedule.DUAL_PIPE_V: (2,)}


def _cases(schedule):
    return [(p, m, v) for p in STAGES for m in MICROBATCHES for v in CHUNKS[schedule]
            if not (schedule is Schedule.INTERLEAVED_1F1B and m % p)
            and not (schedule is Schedule.DUAL_PIPE_V and m < 2 * p)]


@pytest.mark.parametrize("schedule", list(Schedule))
def test_inflight_microbatches_of_every_rank_are_the_simulators(schedule):
    # the memory model's count on each rank is SimResult.peak_inflight (the first stage was
    # right before; the middle and last stages of GPipe, breadth-first, ZB-H1 and interleaved
    # were not: the last held one micro-batch)
    for p, m, v in _cases(schedule):
        w = 1.0 / v if schedule in SPLIT_BACKWARD else 0.0
        sim = simulate(build_schedule(schedule, p, m, v), StageCosts.uniform(p, v, 1.0 / v, 2.0 / v, w),
                       placement(schedule))
        plan = make_plan(pp=p, vp=v, schedule=schedule)
        counted = [float(mem.inflight_microbatches(plan, m, r)) for r in range(p)]
        assert counted == pytest.approx(sim.peak_inflight), (p, m, v)


@pytest.mark.parametrize("schedule", list(Schedule))
def test_inflight_logits_are_the_last_chunks_forwards_not_yet_backpropagated(schedule):
    for p, m, v in _cases(schedule):
        held = peak = 0
        where = placement(schedule)  # the rank and chunk of the last virtual stage (ZB-V: rank 0)
        rank = int(stage_rank(where, p, p * v - 1))
        last = next(c for c in range(v) if int(virtual_stage(where, p, rank, c)) == p * v - 1)
        for task in build_schedule(schedule, p, m, v)[rank]:
            if task.chunk == last and task.phase is not Phase.WEIGHT:
                held += 1 if task.phase is Phase.FORWARD else -1
                peak = max(peak, held)
        plan = make_plan(pp=p, vp=v, schedule=schedule)
        assert float(mem.inflight_logits(plan, m)) == peak, (p, m, v)


def test_gpipe_last_stage_keeps_every_microbatchs_logits():
    # the reviewer's case: 64 micro-batches of 8,192 tokens through a 128,256 vocabulary over
    # TP 8 are 47 GiB of logits on the last stage, with 64 micro-batches of layer inputs
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=512)
    wl = Workload(global_batch_size=1024, seq_len=8192)
    plan = make_plan(tp=8, pp=4, dp=16, micro_batch_size=1, schedule=Schedule.GPIPE, recompute=Recompute.FULL,
                     sequence_parallel=True)
    e = estimate(model, cluster, wl, plan)
    # each with the head's inputs: the final norm's and the head GEMM's, SP shards (Megatron)
    one = mem.logits_bytes_per_element(wl.precision) * 8192 * model.vocab_size / 8 + (2 + 2) * 8192 * model.hidden_size / 8
    assert e.num_microbatches == 64
    assert e.memory.logits_bytes == pytest.approx(64 * one)
    # and every micro-batch's stored layer inputs, 2·s·h/t each with SP, over 20 layers
    assert e.memory.activations_bytes >= 64 * 20 * 2 * 8192 * model.hidden_size / 8
    assert e.memory.total > 100 * 2**30 and not e.fits
    one_f_one_b = estimate(model, cluster, wl, make_plan(tp=8, pp=4, dp=16, micro_batch_size=1,
                                                         recompute=Recompute.FULL, sequence_parallel=True))
    assert one_f_one_b.memory.total < 0.8 * e.memory.total


def _llama8b(schedule, gbs=64, **kw):
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=64)
    wl = Workload(global_batch_size=gbs, seq_len=4096)
    plan = make_plan(tp=1, pp=4, dp=16, micro_batch_size=1, schedule=schedule, **kw)
    return estimate(model, cluster, wl, plan), evaluate(model, cluster, wl, PlanBatch.from_plans([plan]))


def test_zero_bubble_holds_p_microbatches_on_its_last_stage():
    # with full recomputation the last stage (LM head, logits) is the worst; ZB-H1 keeps p
    # micro-batches' layer inputs there where 1F1B keeps one
    zb, zb_costs = _llama8b(Schedule.ZERO_BUBBLE, recompute=Recompute.FULL)
    f1b, _ = _llama8b(Schedule.ONE_F_ONE_B, recompute=Recompute.FULL)
    assert zb.num_microbatches == 4
    assert zb.memory.logits_bytes == f1b.memory.logits_bytes > 0  # the last stage is the worst in both
    assert zb.memory.activations_bytes == pytest.approx(4 * f1b.memory.activations_bytes)
    # (live tensors: 1F1B's replayed allocator keeps its freed inputs' blocks cached between
    # the loss's tensors, cost/lifetimes.py, so its reserved peak may reach ZB-H1's)
    assert allocated_bytes(zb.memory) > allocated_bytes(f1b.memory)


def test_zero_bubble_dp_reduction_hides_only_behind_the_last_w_pass():
    # rank 0 ends with B then W; the gradients exist only as W runs (Qi et al. 2024 Fig. 3)
    zb, zb_costs = _llama8b(Schedule.ZERO_BUBBLE)
    f1b, f1b_costs = _llama8b(Schedule.ONE_F_ONE_B)
    w_s = float(zb_costs.first.weight_grad_s[0])
    assert f1b.overlapped.dp_comm_s > w_s  # 1F1B hides more than a W pass's worth ...
    assert zb.overlapped.dp_comm_s == pytest.approx(w_s)  # ... ZB-H1 exactly the W pass
    assert zb.time.dp_comm_s > f1b.time.dp_comm_s


def test_zero_bubble_closed_form_follows_the_simulator_below_p_microbatches():
    # the search's closed form gains max(p - m, 0)·W as m drops below p, as the simulated
    # bubble does (tests/golden/test_bubble_closed_forms.py); first/last stage extras offset
    # both alike
    at_p_sim, at_p_costs = _llama8b(Schedule.ZERO_BUBBLE, gbs=64)
    assert at_p_sim.num_microbatches == 4
    for gbs in (16, 32, 48):
        e, c = _llama8b(Schedule.ZERO_BUBBLE, gbs=gbs)
        assert e.num_microbatches == gbs // 16 < 4
        closed_rise = float(c.time.bubble_s[0]) - float(at_p_costs.time.bubble_s[0])
        simulated_rise = e.time.bubble_s - at_p_sim.time.bubble_s
        assert closed_rise == pytest.approx(simulated_rise, rel=1e-9) and closed_rise > 0
