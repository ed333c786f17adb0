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
from paraplan.cost.amax import amax_reduction_s
from paraplan.export import torchtitan
from paraplan.errors import SpecError
from paraplan.cost.evaluate import evaluate
from paraplan.plan.axes import RankOrder, Recompute, Schedule, ZeroStage
from paraplan.plan.space import PlanBatch
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


@pytest.mark.parametrize("vp", [1, 4])
def test_each_chunk_pass_waits_for_one_reduction(vp):
    """A stage runs v chunk passes of L/v layers a micro-batch, forward and backward: its
    forward and its backward each grow by v reductions (of fewer amaxes each)."""
    cluster = load_cluster("dgx-h100", num_gpus=512)
    plan = make_plan(tp=8, pp=4, dp=16, vp=vp, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, sequence_parallel=True,
                     schedule=Schedule.INTERLEAVED_1F1B if vp > 1 else Schedule.ONE_F_ONE_B)
    batch = PlanBatch.from_plans([plan])
    a, b = evaluate(MODEL, cluster, CURRENT, batch), evaluate(MODEL, cluster, DELAYED, batch)
    one = amax_s(plan)
    for stage in ("first", "middle", "last"):
        fwd = float(getattr(b, stage).forward_s[0] - getattr(a, stage).forward_s[0])
        bwd = float(getattr(b, stage).backward_s[0] - getattr(a, stage).backward_s[0])
        assert fwd == pytest.approx(vp * one, rel=1e-9) and bwd == pytest.approx(vp * one, rel=1e-9)


def test_data_parallelism_outermost_spreads_the_group_over_more_nodes():
    """With the pipeline outermost a stage's 128 ranks are 16 whole nodes; with data parallelism
    outermost they are runs of TP·CP = 4 ranks, 32 ranks apart: 32 nodes, half of each."""
    plan = make_plan(tp=4, pp=8, dp=32, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, sequence_parallel=True)
    assert amax_s(replace(plan, rank_order=RankOrder.TP_CP_PP_DP), gpus=1024) > amax_s(plan, gpus=1024)


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


def test_megatron_refuses_module_recomputation_under_delayed_scaling_in_one_line():
    from paraplan.export import megatron
    plan = megatron.SUPPORT.adapt(make_plan(tp=2, dp=8, ep=8, micro_batch_size=1, zero=ZeroStage.OPTIMIZER,
                                            sequence_parallel=True, recompute=Recompute.MODULES))
    mixtral = load_model("mixtral-8x7b")
    megatron.check(plan, mixtral, CURRENT)  # current scaling runs it
    with pytest.raises(SpecError, match="delayed"):
        megatron.check(plan, mixtral, DELAYED)
    # and its search never ranks the plan
    refused = megatron.SUPPORT.limits.engine_rule(PlanBatch.from_plans([plan]), mixtral, DELAYED)
    assert bool(refused[0]) and not bool(megatron.SUPPORT.limits.engine_rule(PlanBatch.from_plans([plan]),
                                                                             mixtral, CURRENT)[0])


def test_torchtitan_refuses_delayed_scaling_and_quantized_weights_in_one_line():
    plan = torchtitan.SUPPORT.adapt(make_plan(tp=1, dp=8, micro_batch_size=1, zero=ZeroStage.PARAMETERS))
    torchtitan.check(plan, load_model("llama3-8b"), CURRENT)
    with pytest.raises(SpecError, match="no delayed scaling"):
        torchtitan.check(plan, load_model("llama3-8b"), DELAYED)
    with pytest.raises(SpecError, match="low_precision_params"):
        torchtitan.check(replace(plan, low_precision_params=True), load_model("llama3-8b"), CURRENT)


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
