"""FP8 delayed scaling (Workload.fp8_recipe = delayed; cost/low_precision.py amax_reduction_s):
the GEMMs and casts of per-tensor FP8, and at the end of every forward and backward pass of a
model chunk an all-reduce of its amaxes over the pipeline stage's TP×CP×DP ranks, on the
compute stream, reported with the data-parallel communication."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support import assert_user_error, run

from paraplan.cost.estimate import estimate
from paraplan.cost.layout import layout
from paraplan.cost.low_precision import amax_reduction_s
from paraplan.export import torchtitan
from paraplan.errors import SpecError
from paraplan.plan.axes import Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Fp8Recipe, Precision, Workload
from paraplan.validate.recipes import fp8_scaling

MODEL = load_model("llama3-70b")
CURRENT = Workload(global_batch_size=512, seq_len=4096, precision=Precision.FP8)
DELAYED = replace(CURRENT, fp8_recipe=Fp8Recipe.DELAYED)


def amax_s(plan, workload=DELAYED, gpus=512):
    cluster = load_cluster("dgx-h100", num_gpus=gpus)
    return float(amax_reduction_s(cluster, MODEL, workload, plan, layout(MODEL, workload, plan)))


def test_only_delayed_scaling_reduces_amaxes():
    plan = make_plan(tp=8, pp=4, dp=16, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, sequence_parallel=True)
    assert amax_s(plan, CURRENT) == 0.0
    assert amax_s(plan) > 0.0
    assert amax_s(plan, replace(DELAYED, precision=Precision.BF16, fp8_recipe=Fp8Recipe.TENSORWISE)) == 0.0


def test_the_reduction_spans_the_stage_and_costs_more_across_more_nodes():
    """The group is TP×CP×DP: one rank alone reduces nothing; more data-parallel replicas put
    more nodes in it, and a latency-bound all-reduce pays each hop."""
    one = make_plan(tp=1, pp=1, dp=1, micro_batch_size=1)
    assert amax_s(one, gpus=1) == 0.0
    costs = [amax_s(make_plan(tp=8, pp=4, dp=d, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, sequence_parallel=True),
                    gpus=32 * d) for d in (2, 8, 32)]
    assert costs[0] < costs[1] < costs[2]


def test_every_pass_of_every_micro_batch_waits_for_it_and_it_is_reported_as_dp_communication():
    """Without a pipeline the step is longer by m micro-batches × (one forward + one backward
    pass) × the all-reduce, counted in the exposed DP communication (a little less: the longer
    passes hide a little more of the gradients' reduction behind them)."""
    cluster = load_cluster("dgx-h100", num_gpus=64)
    plan = make_plan(tp=8, pp=1, dp=8, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, sequence_parallel=True)
    a, b = estimate(MODEL, cluster, CURRENT, plan), estimate(MODEL, cluster, DELAYED, plan)
    extra = b.num_microbatches * 2 * amax_s(plan, gpus=64)
    assert extra > 0.0
    assert 0.95 * extra <= b.step_time_s - a.step_time_s <= extra * (1 + 1e-9)
    assert b.time.dp_comm_s - a.time.dp_comm_s == pytest.approx(b.step_time_s - a.step_time_s, rel=1e-6)
    assert b.time.compute_s == pytest.approx(a.time.compute_s, rel=1e-9)


def test_virtual_stages_reduce_once_per_chunk():
    """Interleaved stages make v passes of L/v layers a micro-batch: v reductions each way, each
    of fewer amaxes (latency-bound: about the same time each)."""
    one = make_plan(tp=8, pp=4, dp=16, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, sequence_parallel=True)
    four = replace(one, vp=4, schedule=Schedule.INTERLEAVED_1F1B)
    assert 4 * amax_s(four) > 3 * amax_s(one)


@pytest.mark.parametrize("row, recipe", [
    ({"framework": "NeMo 25.04.00 (dgxc v25.05.04)", "precision": "FP8"}, Fp8Recipe.DELAYED),
    ({"framework": "NeMo (NeMo24.03.01.framework)", "precision": "FP8"}, Fp8Recipe.DELAYED),
    ({"framework": "NeMo 25.04 (NeMo 2.0 / Megatron-Core)",
      "precision": "FP8 (page caption: per-tensor FP8, current-step scaling)"}, Fp8Recipe.TENSORWISE),
    ({"framework": "Megatron-Bridge / Megatron-Core (NeMo 26.02.01)", "precision": "FP8"}, Fp8Recipe.TENSORWISE),
    ({"framework": "Megatron-Bridge / Megatron-Core (NeMo 25.11)", "precision": "FP8-DS"}, Fp8Recipe.DELAYED),
    ({"framework": "NeMo 25.04.01 (dgxc v25.05.04)", "precision": "MXFP8"}, Fp8Recipe.TENSORWISE),
    ({"framework": "Megatron-LM (MCore + TE)", "precision": "FP8"}, Fp8Recipe.DELAYED),
    ({"framework": "torchtitan + torch.compile", "precision": "BF16 + Float8 linear"}, Fp8Recipe.TENSORWISE),
])
def test_validate_reads_each_runs_scaling_recipe(row, recipe):
    assert fp8_scaling(row, Precision.FP8, Fp8Recipe.TENSORWISE) is recipe
    assert fp8_scaling(row, Precision.FP8, Fp8Recipe.ROWWISE) is Fp8Recipe.ROWWISE
    assert fp8_scaling(row, Precision.BF16, Fp8Recipe.TENSORWISE) is Fp8Recipe.TENSORWISE


def test_torchtitan_refuses_delayed_scaling_in_one_line():
    plan = make_plan(tp=1, dp=8, micro_batch_size=1, zero=ZeroStage.PARAMETERS)
    with pytest.raises(SpecError, match="no delayed scaling"):
        torchtitan.check(torchtitan.SUPPORT.adapt(plan), load_model("llama3-8b"), DELAYED)


def test_cli_prints_the_recipe_and_refuses_it_without_fp8(capsys):
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--gpus", "8", "--precision", "fp8",
                         "--fp8-recipe", "delayed", "--tp", "1", "--dp", "8")
    assert code == 0, err
    assert "fp8 (delayed)" in out
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--fp8-recipe", "delayed")
    line = assert_user_error(code, out, err)
    assert "fp8_recipe" in line and "delayed" in line


def test_delayed_scaling_runs_inform_the_fp8_ratio_as_per_tensor_ones_do():
    """Their GEMMs are per-tensor FP8's: `paraplan fit` fits fp8_gemm_efficiency_ratio on them too."""
    from paraplan.validate.fit import FP8, ROWWISE, SHARE
    assert FP8.informed_by(Precision.FP8, Fp8Recipe.DELAYED)
    assert FP8.informed_by(Precision.FP8, Fp8Recipe.TENSORWISE)
    assert not ROWWISE.informed_by(Precision.FP8, Fp8Recipe.DELAYED)
    assert not SHARE.informed_by(Precision.FP8, Fp8Recipe.DELAYED)
