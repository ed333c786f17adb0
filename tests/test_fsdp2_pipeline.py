"""FSDP2 under torch's pipeline schedules (paraplan run, torchtitan with PP > 1 and
ZeRO 2/3): every backward but the step's last keeps its gathered parameters and skips the
gradient reduction (PipelineStage: set_reshard_after_backward(False),
set_requires_gradient_sync(False)); the stage reduce-scatters the accumulated unsharded
gradients once, after its last backward (perform_reduce_grad). torch 2.13
torch/distributed/pipelining/stage.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cost import memory as mem
from paraplan.cost.comm import Collective, collective_time_s
from paraplan.cost.estimate import estimate
from paraplan.cost.evaluate import fsdp2_pp_gathers_per_pass, layout
from paraplan.plan.axes import Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.sim.schedules import Phase, build_schedule
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("dgx-h100", num_gpus=16)


def _gathers(schedule: Schedule, p: int, m: int, v: int) -> list[int]:
    """Per rank, the passes that find their chunk's parameters resharded: the chunk's first
    pass, and every pass after one of its forwards (which reshard after themselves)."""
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
                                        (Schedule.INTERLEAVED_1F1B, 2), (Schedule.INTERLEAVED_1F1B, 4),
                                        (Schedule.BREADTH_FIRST, 2)])
@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (4, 16), (8, 32)])
def test_every_schedule_gathers_m_plus_one_times_per_chunk(schedule, v, p, m):
    per_pass = float(fsdp2_pp_gathers_per_pass(m))
    assert _gathers(schedule, p, m, v) == [v * (m + 1)] * p
    assert 2 * m * per_pass == pytest.approx(m + 1)


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
    L = float(lay.L_s)
    # eight more micro-batches: eight more gathers of every layer (and of the first one a
    # pass cannot prefetch), no reduction
    grow = _zero_traffic_s(plan, 16) - _zero_traffic_s(plan, 8)
    assert grow == pytest.approx(8 * (L + 1) * ag, rel=1e-6)
    # priced as Megatron-style ZeRO-3 they would add two gathers and a reduction each
    flat = replace(plan, fsdp2_copies=False)
    grow_flat = _zero_traffic_s(flat, 16) - _zero_traffic_s(flat, 8)
    assert grow_flat == pytest.approx(8 * (2 * (L + 1) * ag + L * rs), rel=1e-6)


def test_zero2_reduces_once_per_step_under_pipeline_schedules():
    plan = _plan(ZeroStage.GRADIENTS)
    assert _zero_traffic_s(plan, 16) == pytest.approx(_zero_traffic_s(plan, 8), rel=1e-9)
    flat = replace(plan, fsdp2_copies=False)
    assert _zero_traffic_s(flat, 16) > _zero_traffic_s(flat, 8)
