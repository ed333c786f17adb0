"""FSDP2 under torch's pipeline schedules (paraplan run, torchtitan with PP > 1): every
backward, the step's last included, keeps its gathered parameters and skips the gradient
reduction (PipelineStage: set_reshard_after_backward(False), set_requires_gradient_sync(False));
the stage reduces the accumulated unsharded gradients once, after its last backward
(perform_reduce_grad), and waits for it; lowered schedules (interleaved, looped BFS, ZB)
keep at most three chunks gathered (_add_unshard_reshard). torch 2.13
torch/distributed/pipelining/stage.py, schedules.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cost import memory as mem
from paraplan.cost.comm import Collective, collective_time_s
from paraplan.cost.estimate import estimate
from paraplan.cost.layout import layout
from paraplan.cost.zero import fsdp2_pp_gathers_per_pass, fsdp2_reduce_copy_s
from paraplan.plan.axes import Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.sim.schedules import Phase, _replay_fsdp2_gathers, build_schedule, fsdp2_gathers_per_step
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("dgx-h100", num_gpus=16)


def _gathers(schedule: Schedule, p: int, m: int, v: int) -> list[int]:
    """Per rank, the passes that find their chunk's parameters resharded (no eviction): the
    chunk's first pass, and every pass after one of its forwards (which reshard after
    themselves at ZeRO-3)."""
    out = []
    for tasks in build_schedule(schedule, p, m, v):
        n = 0
        for chunk in range(v):
            prev = None
            for task in tasks:
                if task.chunk != chunk or task.phase is Phase.WEIGHT:
                    continue
                n += prev is None or prev is Phase.FORWARD
                prev = task.phase
        out.append(n)
    return out


@pytest.mark.parametrize("schedule,v", [(Schedule.GPIPE, 1), (Schedule.ONE_F_ONE_B, 1), (Schedule.ZERO_BUBBLE, 1),
                                        (Schedule.INTERLEAVED_1F1B, 2), (Schedule.INTERLEAVED_1F1B, 3),
                                        (Schedule.BREADTH_FIRST, 2), (Schedule.BREADTH_FIRST, 3)])
@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (4, 16), (8, 32)])
def test_up_to_three_chunks_every_schedule_gathers_m_plus_one_times_per_chunk(schedule, v, p, m):
    assert _gathers(schedule, p, m, v) == [v * (m + 1)] * p
    # the replay (UNSHARD/RESHARD bookkeeping included) finds no eviction with 3 chunks or fewer
    assert _replay_fsdp2_gathers(schedule, p, m, v, True) == v * (m + 1)
    assert _replay_fsdp2_gathers(schedule, p, m, v, False) == v  # ZeRO-2: once per chunk


def _torch_gathers(cls, p: int, m: int, v: int, zero3: bool) -> int:
    """The same count on torch's own lowered order (UNSHARD/RESHARD actions included), the
    busiest rank; stages are stand-ins with the attributes the lowering reads."""
    from types import SimpleNamespace

    from torch.distributed.pipelining import schedules as S
    worst = 0
    for rank in range(p):
        stages = [SimpleNamespace(group_size=p, group_rank=rank, num_stages=p * v, stage_index=rank + c * p,
                                  stage_index_to_group_rank=None, is_first=False, is_last=False) for c in range(v)]
        actions = cls(stages, m, loss_fn=lambda a, b: a).pipeline_order_with_comms[rank]
        gathered, n = set(), 0
        for a in actions:
            kind, chunk = a.computation_type, a.stage_index
            if kind == S.RESHARD or kind == S.REDUCE_GRAD:
                gathered.discard(chunk)
                continue
            if kind not in (S.UNSHARD, S.FORWARD, S.FULL_BACKWARD, S.BACKWARD_INPUT, S.BACKWARD_WEIGHT):
                continue
            if chunk not in gathered:
                n += 1
                gathered.add(chunk)
            if kind == S.FORWARD and zero3:
                gathered.discard(chunk)
        worst = max(worst, n)
    return worst


@pytest.mark.parametrize("schedule,torch_name", [(Schedule.INTERLEAVED_1F1B, "ScheduleInterleaved1F1B"),
                                                 (Schedule.BREADTH_FIRST, "ScheduleLoopedBFS")])
@pytest.mark.parametrize("p,m,v", [(2, 4, 4), (4, 8, 2), (4, 16, 4), (4, 16, 8), (2, 8, 6)])
@pytest.mark.parametrize("zero3", [True, False])
def test_replay_matches_torchs_lowered_schedule(schedule, torch_name, p, m, v, zero3):
    # four or more chunks per rank: torch keeps three gathered (_add_unshard_reshard) and
    # gathers evicted ones again, beyond m + 1
    torch = pytest.importorskip("torch.distributed.pipelining.schedules")
    assert (fsdp2_gathers_per_step(schedule, p, m, v, zero3)
            == _torch_gathers(getattr(torch, torch_name), p, m, v, zero3))


def test_eviction_shows_in_the_price_of_many_chunks():
    many = make_plan(pp=4, vp=4, dp=4, micro_batch_size=1, schedule=Schedule.INTERLEAVED_1F1B, zero=ZeroStage.PARAMETERS,
                     fsdp2_copies=True)
    m = 16
    assert float(fsdp2_pp_gathers_per_pass(many, m, True)) > (m + 1) / (2 * m)
    assert float(fsdp2_pp_gathers_per_pass(many, m, False)) > 0.0  # ZeRO-2 gathers evicted chunks again
    few = make_plan(pp=4, vp=2, dp=4, micro_batch_size=1, schedule=Schedule.INTERLEAVED_1F1B, zero=ZeroStage.PARAMETERS,
                    fsdp2_copies=True)
    assert float(fsdp2_pp_gathers_per_pass(few, m, True)) == pytest.approx((m + 1) / (2 * m))
    assert float(fsdp2_pp_gathers_per_pass(few, m, False)) == 0.0


def _plan(zero: ZeroStage, pp: int = 2, fsdp2: bool = True):
    return make_plan(pp=pp, dp=16 // pp, micro_batch_size=1, zero=zero, grad_reduce_fp32=True, fsdp2_copies=fsdp2)


def test_memory_keeps_the_stage_gathered_with_unsharded_fp32_gradients():
    wl = Workload(global_batch_size=64, seq_len=4096)
    lay = layout(MODEL, wl, _plan(ZeroStage.PARAMETERS))
    S = 8
    torch_pp = estimate(MODEL, CLUSTER, wl, _plan(ZeroStage.PARAMETERS)).memory
    megatron_like = estimate(MODEL, CLUSTER, wl, _plan(ZeroStage.PARAMETERS, fsdp2=False)).memory
    full = float(lay.params_stage)  # (the worst stage: the first or the last, within the final norm)
    assert torch_pp.gradients_bytes == pytest.approx(mem.GRAD_BYTES * full, rel=1e-5)
    assert torch_pp.weights_bytes == pytest.approx(mem.WEIGHT_BYTES * full, rel=1e-5)
    assert megatron_like.gradients_bytes == pytest.approx(mem.GRAD_BYTES * full / S, rel=1e-5)
    assert megatron_like.weights_bytes == pytest.approx(mem.WEIGHT_BYTES * full / S, rel=1e-5)
    assert torch_pp.optimizer_bytes == megatron_like.optimizer_bytes  # still sharded
    # no per-layer gather/reduce buffers beyond what the stage keeps: one layer's 16-bit gradient
    assert torch_pp.comm_buffers_bytes == pytest.approx(mem.WEIGHT_BYTES * float(lay.layer_params))
    assert megatron_like.comm_buffers_bytes > 2 * torch_pp.comm_buffers_bytes
    # gradients accumulate in the reduce dtype: 16-bit where the policy reduces in 16 bits
    bf16 = estimate(MODEL, CLUSTER, wl, replace(_plan(ZeroStage.PARAMETERS), grad_reduce_fp32=False)).memory
    assert bf16.gradients_bytes == pytest.approx(mem.WEIGHT_BYTES * full, rel=1e-5)
    # without PP FSDP2 shards them as priced before
    flat = _plan(ZeroStage.PARAMETERS, pp=1)
    assert (estimate(MODEL, CLUSTER, wl, flat).memory.gradients_bytes
            == estimate(MODEL, CLUSTER, wl, replace(flat, fsdp2_copies=False)).memory.gradients_bytes)


def _zero_traffic_s(plan, m):
    est = estimate(MODEL, CLUSTER, Workload(global_batch_size=plan.dp * m, seq_len=4096), plan)
    return est.time.dp_comm_s + est.overlapped.dp_comm_s


def test_zero3_gathers_once_more_than_the_micro_batches_and_reduces_once_per_step():
    plan = _plan(ZeroStage.PARAMETERS)
    lay = layout(MODEL, Workload(global_batch_size=64, seq_len=4096), plan)
    ag = float(collective_time_s(CLUSTER, Collective.ALL_GATHER, mem.WEIGHT_BYTES * float(lay.layer_params), 8, 1))
    rs = float(collective_time_s(CLUSTER, Collective.REDUCE_SCATTER, mem.GRAD_BYTES * float(lay.layer_params), 8, 1))
    L = float(lay.stage_layers)
    # eight more micro-batches: eight more gathers of every layer (and of the first one a
    # pass cannot prefetch), no reduction
    grow = _zero_traffic_s(plan, 16) - _zero_traffic_s(plan, 8)
    assert grow == pytest.approx(8 * (L + 1) * ag, rel=1e-6)
    # priced as Megatron-style ZeRO-3 they would add two gathers and a reduction each
    flat = replace(plan, fsdp2_copies=False)
    grow_flat = _zero_traffic_s(flat, 16) - _zero_traffic_s(flat, 8)
    assert grow_flat == pytest.approx(8 * (2 * (L + 1) * ag + L * rs), rel=1e-6)
    # what does not grow is the step's reduction: a reduce-scatter per layer and one for the
    # stage root (the embedding or the head), exposed, and FSDP2's copy into its input
    grads = mem.GRAD_BYTES * float(lay.params_stage)
    step_rs = (L * rs + float(collective_time_s(CLUSTER, Collective.REDUCE_SCATTER,
                                                grads - L * mem.GRAD_BYTES * float(lay.layer_params), 8, 1)))
    copy = float(fsdp2_reduce_copy_s(CLUSTER.gpu, grads, 8))
    assert _zero_traffic_s(plan, 8) - 9 * (L + 1) * ag == pytest.approx(step_rs + copy, rel=1e-6)


def test_zero1_reductions_under_pipeline_schedules_are_exposed():
    # paraplan run's ZeRO-0/1 reduce in perform_reduce_grad too, after the last backward
    wl = Workload(global_batch_size=64, seq_len=4096)
    piped = estimate(MODEL, CLUSTER, wl, _plan(ZeroStage.NONE))
    other = estimate(MODEL, CLUSTER, wl, _plan(ZeroStage.NONE, fsdp2=False))
    assert piped.overlapped.dp_comm_s == 0.0 < other.overlapped.dp_comm_s
    # ZeRO-1: the reduce-scatter is exposed; the parameters' all-gather still hides behind
    # the next step's first forward
    piped = estimate(MODEL, CLUSTER, wl, _plan(ZeroStage.OPTIMIZER))
    other = estimate(MODEL, CLUSTER, wl, _plan(ZeroStage.OPTIMIZER, fsdp2=False))
    assert 0.0 < piped.overlapped.dp_comm_s < other.overlapped.dp_comm_s


def test_zero2_reduces_once_per_step_under_pipeline_schedules():
    plan = _plan(ZeroStage.GRADIENTS)
    assert _zero_traffic_s(plan, 16) == pytest.approx(_zero_traffic_s(plan, 8), rel=1e-9)
    flat = replace(plan, fsdp2_copies=False)
    assert _zero_traffic_s(flat, 16) > _zero_traffic_s(flat, 8)


@pytest.mark.parametrize("schedule", [Schedule.INTERLEAVED_1F1B, Schedule.BREADTH_FIRST])
@pytest.mark.parametrize("p,v", [(2, 4), (4, 5), (8, 8)])
@pytest.mark.parametrize("zero3", [True, False])
def test_large_step_counts_extrapolate_the_replay_exactly(schedule, p, v, zero3):
    # the count grows by the same amount per round of p micro-batches (interleaved) or per
    # micro-batch (looped BFS) once the order repeats; larger m come from two replays
    step = p if schedule is Schedule.INTERLEAVED_1F1B else 1
    for m in range(step, 6 * p + 1, step):
        assert fsdp2_gathers_per_step(schedule, p, m, v, zero3) == _replay_fsdp2_gathers(schedule, p, m, v, zero3)


def test_zero1_on_fsdp2_regathers_evicted_chunks_as_zero2_does():
    # paraplan run runs ZeRO-1 as FSDP2 with reshard_after_forward=False, like ZeRO-2
    m = 16
    z1, z2 = (make_plan(pp=4, vp=4, dp=4, micro_batch_size=1, schedule=Schedule.INTERLEAVED_1F1B, zero=z,
                        fsdp2_copies=True) for z in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS))
    wl = Workload(global_batch_size=4 * m, seq_len=4096)
    d1 = estimate(MODEL, CLUSTER, wl, z1).layer_detail["fwd"]
    d2 = estimate(MODEL, CLUSTER, wl, z2).layer_detail["fwd"]
    assert float(d1["FSDP2 copies"]) == float(d2["FSDP2 copies"]) > 0.0
