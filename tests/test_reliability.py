"""Training through interruptions: Daly's wall time, its optimal checkpoint interval (Young's
in the limit) and goodput."""

from __future__ import annotations

import math

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.cost.estimate import estimate
from paraplan.cost.reliability import reliability
from paraplan.plan.axes import Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import LLAMA3_INTERRUPTIONS_PER_GPU_DAY, Workload

DAY = 86400.0


def _run(gpus, rate=LLAMA3_INTERRUPTIONS_PER_GPU_DAY, restart=600.0, ckpt=0.1, step=5.0, floor=0.0):
    return reliability(num_gpus=gpus, step_s=step, work_s=30 * DAY, checkpoint_s=ckpt,
                       interruptions_per_gpu_day=rate, restart_s=restart, usd_per_gpu_hour=2.0, min_interval_s=floor)


def test_the_interval_minimizes_dalys_wall_time_and_approaches_young():
    # Daly (2006) Eq. 13: T_w / T_s = M e^{R/M} (e^{(t+d)/M} - 1) / t, searched on a grid
    r = _run(16384, ckpt=20.0)
    d, M, R = r.checkpoint_s, r.mtbf_s, 600.0
    taus = np.geomspace(r.checkpoint_interval_s / 8, r.checkpoint_interval_s * 8, 4001)
    ratio = M * np.exp(R / M) * np.expm1((taus + d) / M) / taus
    assert r.checkpoint_interval_s == pytest.approx(taus[np.argmin(ratio)], rel=2e-3)
    assert 1.0 / r.goodput == pytest.approx(ratio.min(), rel=1e-6)
    # Young (1974): sqrt(2 d M) once the stall is small against M
    small = _run(16384, ckpt=0.5, restart=1.0)
    assert small.checkpoint_interval_s == pytest.approx(math.sqrt(2 * 0.5 * small.mtbf_s), rel=0.01)


def test_more_gpus_fail_more_often():
    a, b = _run(8192), _run(16384)
    assert b.mtbf_s == pytest.approx(a.mtbf_s / 2)
    assert b.checkpoint_interval_s == pytest.approx(a.checkpoint_interval_s / math.sqrt(2), rel=0.03)
    assert b.goodput < a.goodput < 1.0
    assert b.interruptions > 2 * a.interruptions * 0.99


def test_no_failures_long_restarts_and_the_storage_floor():
    r = _run(16384, rate=0.0)
    assert r.goodput == 1.0 and r.wall_time_s == 30 * DAY and r.interruptions == 0.0 and math.isinf(r.mtbf_s)
    # an interruption every ~3 minutes and an hour to restart: almost nothing gets done, smoothly
    slow = _run(1_000_000, restart=3600.0)
    assert 0.0 < slow.goodput < 1e-6
    assert _run(1_000_000, rate=1e6).goodput == 0.0  # beyond the float range: none at all
    assert _run(1_000_000, rate=1e308).goodput == 0.0  # a job rate that overflows
    # a checkpoint cannot come more often than once a step, nor faster than storage writes it
    assert _run(16384, ckpt=1e-6, step=30.0).checkpoint_interval_s == 30.0
    assert _run(16384, ckpt=1e-6, step=1.0, floor=45.0).checkpoint_interval_s == 45.0


def test_llama3_405b_at_16k_gpus_is_consistent_with_the_paper():
    # Dubey et al. 2024 Sec. 3.3.4: 419 unexpected interruptions in 54 days on 16,384 H100,
    # "higher than 90% effective training time" (with paraplan's assumed 10-minute restart)
    model, cluster = load_model("llama3.1-405b"), load_cluster("dgx-h100", num_gpus=16384)
    wl = Workload(global_batch_size=2048, seq_len=8192, token_budget=15.6e12)
    plan = make_plan(tp=8, pp=16, vp=8, dp=128, sequence_parallel=True, schedule=Schedule.INTERLEAVED_1F1B,
                     recompute=Recompute.FIRST_K, recompute_num_layers=2, zero=ZeroStage.OPTIMIZER)
    r = estimate(model, cluster, wl, plan, simulate_pipeline=False).budget.with_failures
    assert r.mtbf_s == pytest.approx(54 * DAY / 419 * 1.0, rel=1e-9)
    assert 0.9 < r.goodput < 1.0
    # the stall is the copy of the GPU's model states to host memory: well under a second
    assert r.checkpoint_s < 1.0


def test_cli_prints_the_budget_through_failures(capsys):
    assert main(["estimate"]) == 0
    out = capsys.readouterr().out
    assert "with failures   an interruption every" in out and "goodput" in out
    assert main(["estimate", "--interruptions-per-gpu-day", "0"]) == 0
    assert "none assumed" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["estimate", "--restart-min", "-3"])
    assert e.value.code == 2 and "--restart-min" in capsys.readouterr().err


def test_checkpoint_writes_experts_once_over_their_expert_data_parallel_group():
    # Qwen3-30B-A3B on 64 GPUs, EP 8: the experts replicate over EDP = 8, not over DP = 64,
    # so each GPU writes 1/8 of its expert weights, not 1/64 (the dense part: 1/64)
    from paraplan.cost.estimate import checkpoint_bytes_per_gpu, estimate
    from paraplan.plan.axes import ZeroStage
    from paraplan.plan.plan import make_plan
    from paraplan.specs.catalog import load_cluster, load_model
    from paraplan.specs.workload import Workload
    model = load_model("qwen3-30b-a3b")
    wl = Workload(global_batch_size=512, seq_len=4096, precision="bf16")
    plan = make_plan(tp=1, pp=1, dp=64, ep=8, micro_batch_size=1, zero=ZeroStage.GRADIENTS)
    est = estimate(model, load_cluster("dgx-h100", num_gpus=64), wl, plan)
    written = checkpoint_bytes_per_gpu(model, wl, plan, est.memory)
    experts = model.expert_params / 8                     # this GPU's expert shard, in parameters
    dense = model.num_params - model.expert_params
    w_share = est.memory.weights_bytes / (dense + experts)  # bytes per parameter held
    o = est.memory.optimizer_bytes                        # sharded over all 64 (dense) / EDP 8 (experts)
    assert written == pytest.approx(w_share * (dense / 64 + experts / 8) + o, rel=1e-6)
    # a dense model: unchanged, weights over DP, the optimizer shard whole
    dense_model = load_model("llama3-8b")
    p2 = make_plan(tp=1, pp=1, dp=64, micro_batch_size=1, zero=ZeroStage.GRADIENTS)
    e2 = estimate(dense_model, load_cluster("dgx-h100", num_gpus=64), wl, p2)
    assert checkpoint_bytes_per_gpu(dense_model, wl, p2, e2.memory) == pytest.approx(
        e2.memory.weights_bytes / 64 + e2.memory.optimizer_bytes)
