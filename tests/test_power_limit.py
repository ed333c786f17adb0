"""A board power limit below the TDP (GPUSpec.power_limit_watts; `--power-limit`; a validation row's
GPU cell "H100 (96GB HBM2e, 500W)"): compute at the clock it leaves, energy at the limit."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from paraplan.cost.estimate import estimate
from paraplan.plan.axes import ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload
from paraplan.validate.training import row_cluster, row_setup
from support import TRAINING_ROW, assert_user_error, run


def test_the_clock_goes_as_the_cube_root_of_the_power():
    gpu = load_cluster("dgx-h100").gpu  # 700 W
    assert gpu.power_clock_share == 1.0 and gpu.draw_watts == gpu.tdp_watts == 700.0
    capped = replace(gpu, power_limit_watts=500.0)
    assert capped.power_clock_share == pytest.approx(0.8939, rel=1e-4)  # the cube root of 500/700
    assert capped.compute_share == pytest.approx(gpu.sustained_compute_ratio * 0.8939, rel=1e-4)
    assert capped.draw_watts == 500.0
    above = replace(gpu, power_limit_watts=900.0)  # a limit above the TDP changes nothing
    assert above.power_clock_share == 1.0 and above.draw_watts == 700.0


def _estimate(cluster):
    model = load_model("llama3.1-70b")
    wl = Workload(global_batch_size=64, seq_len=8192)
    return estimate(model, cluster, wl, make_plan(tp=8, dp=8, micro_batch_size=1, zero=ZeroStage.PARAMETERS))


def test_a_limited_gpu_computes_slower_and_draws_its_limit():
    cluster = load_cluster("dgx-h100", num_gpus=64)
    full, capped = _estimate(cluster), _estimate(cluster.with_power_limit(500.0))
    share = (500.0 / 700.0) ** (1.0 / 3.0)
    # the GEMMs and attention slow by the clock; element-wise work (HBM-bound) does not
    assert full.time.compute_s / share > capped.time.compute_s > full.time.compute_s * 1.05
    assert capped.step_time_s > full.step_time_s
    assert capped.budget.power_limited and not full.budget.power_limited
    for est, watts in ((full, 700.0), (capped, 500.0)):
        assert est.budget.energy_j == pytest.approx(watts * est.budget.gpu_hours * 3600.0)


def test_the_cli_takes_a_power_limit_and_refuses_a_nonsense_one(capsys):
    args = ("estimate", "--model", "llama3.1-8b", "--gpus", "8", "--seq", "4096", "--batch", "64", "--tp", "1",
            "--pp", "1", "--dp", "8", "--quiet")
    code, out, _ = run(capsys, *args, "--power-limit", "500")
    assert code == 0 and "at the power limit" in out
    code, out, _ = run(capsys, *args)
    assert code == 0 and "at TDP" in out
    line = assert_user_error(*run(capsys, *args, "--power-limit", "0"))
    assert "--power-limit" in line and "0" in line


def test_a_row_runs_at_the_limit_its_gpu_cell_states():
    row = {**TRAINING_ROW, "gpu": "H100 (96GB HBM2e, 500W)", "num_gpus": "8", "tp": "1", "pp": "1", "dp": "8",
           "global_batch": "64", "micro_batch": "1"}
    setup = row_setup(row, "rows.csv", 2)
    assert setup.power_limit_watts == 500.0 and row_cluster(setup).gpu.power_limit_watts == 500.0
    plain = row_setup({**row, "gpu": "H100"}, "rows.csv", 2)
    assert plain.power_limit_watts is None and row_cluster(plain).gpu.power_limit_watts is None


def test_scale_prices_every_cluster_at_the_limit_and_a_mixed_cluster_refuses_it(capsys):
    args = ("scale", "--counts", "256", "--quiet", "--json")
    full = json.loads(run(capsys, *args)[1])
    capped = json.loads(run(capsys, *args, "--power-limit", "500")[1])
    step = [p["best"]["step_time_s"] for p in (full["points"][0], capped["points"][0])]
    assert step[1] > step[0]
    line = assert_user_error(*run(capsys, "search", "--cluster", "examples/h100-a100-mixed.toml", "--power-limit",
                                  "500", "--quiet"))
    assert "--power-limit" in line and "power_limit_watts" in line
