"""Weights under FP8 and NVFP4 (Plan.low_precision_params, cost/low_precision.py): Transformer
Engine keeps each linear layer's quantized copies (row-wise and column-wise) for a step's
micro-batches beside the 16-bit weight, or, with the weights kept quantized (Megatron-Core
--fp8-param-gather, Megatron-Bridge fp4_param), the copies alone, all-gathered in their
format; the embedding and the head stay 16-bit."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from support import assert_user_error, run

from paraplan.cost.estimate import estimate
from paraplan.cost.layout import layout
from paraplan.plan.axes import Recompute, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload
from paraplan.validate.recipes import parameter_policy

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("dgx-b200", num_gpus=8)
WL = Workload(global_batch_size=64, seq_len=4096)
ZERO1 = make_plan(tp=1, dp=8, micro_batch_size=1, zero=ZeroStage.OPTIMIZER)


def weights_gib(precision: Precision, plan=ZERO1) -> float:
    return estimate(MODEL, CLUSTER, replace(WL, precision=precision), plan).memory.weights_bytes / 2**30


def linear_params() -> float:
    """The transformer layers' weights (the attention and MLP projections and the norms)."""
    return MODEL.num_params - MODEL.embedding_params - MODEL.lm_head_params - MODEL.hidden_size


def test_bf16_ignores_the_knob():
    on = replace(ZERO1, low_precision_params=True)
    assert weights_gib(Precision.BF16, on) == weights_gib(Precision.BF16)
    assert weights_gib(Precision.BF16) == pytest.approx(2.0 * MODEL.num_params / 2**30, rel=1e-9)


@pytest.mark.parametrize("precision, copy_bytes", [(Precision.FP8, 1.0), (Precision.NVFP4, 0.5 + 1 / 16)])
def test_transformer_engine_keeps_two_quantized_copies_beside_or_instead_of_the_16bit_weight(precision, copy_bytes):
    extra_gib = 2.0 * copy_bytes * linear_params() / 2**30
    assert weights_gib(precision) - weights_gib(Precision.BF16) == pytest.approx(extra_gib, rel=1e-9)
    kept = weights_gib(precision, replace(ZERO1, low_precision_params=True))
    assert weights_gib(Precision.BF16) - kept == pytest.approx((2.0 - 2.0 * copy_bytes) * linear_params() / 2**30,
                                                               rel=1e-9)


def test_an_eager_engine_casts_at_each_use_and_keeps_16bit_weights():
    """torchao's Float8Linear (torchtitan): no cached copies, the knob changes no weight."""
    eager = replace(ZERO1, fused_kernels=False)
    assert weights_gib(Precision.FP8, eager) == weights_gib(Precision.BF16, eager)
    assert weights_gib(Precision.FP8, replace(eager, low_precision_params=True)) == weights_gib(Precision.BF16, eager)


@pytest.mark.parametrize("precision, gathered", [(Precision.BF16, 2.0), (Precision.FP8, 1.0),
                                                 (Precision.NVFP4, 0.5625)])
def test_the_weights_are_gathered_in_their_kept_format(precision, gathered):
    wl = replace(WL, precision=precision)
    assert float(layout(MODEL, wl, ZERO1).gather_bytes_per_param) == 2.0
    assert float(layout(MODEL, wl, replace(ZERO1, low_precision_params=True)).gather_bytes_per_param) == gathered


def test_gathering_fp8_weights_takes_less_data_parallel_time():
    cluster = load_cluster("dgx-h100", num_gpus=64)
    wl = Workload(global_batch_size=64, seq_len=4096, precision=Precision.FP8)
    plan = make_plan(tp=1, dp=64, micro_batch_size=1, zero=ZeroStage.OPTIMIZER)
    off, on = (estimate(MODEL, cluster, wl, p) for p in (plan, replace(plan, low_precision_params=True)))
    assert on.time.dp_comm_s + on.overlapped.dp_comm_s < off.time.dp_comm_s + off.overlapped.dp_comm_s


@pytest.mark.parametrize("row, policy", [
    ({"framework": "Megatron-Bridge / Megatron-Core (NeMo 26.02.01)", "precision": "NVFP4"}, True),
    ({"framework": "Megatron-Bridge / Megatron-Core (NeMo 25.11)", "precision": "FP8-MX"}, True),
    ({"framework": "Megatron-Bridge / Megatron-Core (NeMo 25.11)", "precision": "FP8 sub-channel"}, False),
    ({"framework": "NeMo 25.04.01 (dgxc v25.05.04)", "precision": "FP8"}, True),
    ({"framework": "NeMo 25.04.01 (dgxc v25.05.04)", "precision": "MXFP8"}, False),
    ({"framework": "Megatron-LM (MCore + TE)", "precision": "FP8"}, None),
    ({"framework": "torchtitan + torch.compile", "precision": "BF16 + Float8 linear"}, None),
    ({"framework": "Megatron-Bridge / Megatron-Core (NeMo 25.11)", "precision": "BF16"}, None),
])
def test_validate_reads_which_runs_kept_quantized_weights(row, policy):
    from paraplan.validate.training import published_precision
    got = parameter_policy(row, published_precision(row["precision"]))
    assert got == ({} if policy is None else {"low_precision_params": policy})


def _estimate(capsys, *flags):
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--gpus", "8", "--cluster", "dgx-b200",
                         "--seq", "4096", "--batch", "64", "--tp", "1", "--dp", "8", "--zero", "1", "--json", *flags)
    assert code == 0, err
    return json.loads(out)


def test_cli_flag_keeps_nvfp4_weights_quantized(capsys):
    off = _estimate(capsys, "--precision", "nvfp4")
    on = _estimate(capsys, "--precision", "nvfp4", "--low-precision-params")
    assert on["memory_bytes"]["weights_bytes"] < off["memory_bytes"]["weights_bytes"]


def test_cli_flag_under_bf16_is_one_line(capsys):
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--precision", "bf16", "--low-precision-params")
    line = assert_user_error(code, out, err)
    assert "--low-precision-params" in line and "fp8 or nvfp4" in line


def test_the_last_stage_keeps_its_head_in_16_bits():
    """With two pipeline stages the last holds 16 layers and the 16-bit head: the FP8 copies add
    2 B a parameter of its layers only."""
    from paraplan.cost.stage_memory import LAST_STAGE, plan_memory
    plan = make_plan(tp=1, pp=2, dp=4, micro_batch_size=1, zero=ZeroStage.OPTIMIZER)
    cluster = load_cluster("dgx-b200", num_gpus=8)
    weights = {p: plan_memory(MODEL, cluster, replace(WL, precision=p), plan, stage=LAST_STAGE)[0].weights_bytes
               for p in (Precision.BF16, Precision.FP8)}
    layers_params = linear_params() / 2  # 16 of the 32 layers
    assert weights[Precision.FP8] - weights[Precision.BF16] == pytest.approx(2.0 * layers_params, rel=1e-9)


def test_zero3_shards_are_kept_as_they_are_gathered():
    plan = make_plan(tp=1, dp=8, micro_batch_size=1, zero=ZeroStage.PARAMETERS)
    on = replace(plan, low_precision_params=True)
    assert weights_gib(Precision.FP8, plan) == pytest.approx(weights_gib(Precision.BF16, plan), rel=1e-12)
    # the layers' shards at 1 B, the embedding and head at 2
    expected_gib = (1.0 * linear_params() + 2.0 * (MODEL.num_params - linear_params())) / 8 / 2**30
    assert weights_gib(Precision.FP8, on) == pytest.approx(expected_gib, rel=1e-9)


def test_zero0_and_eager_engines_keep_16bit_weights_whatever_the_knob():
    """Quantized weights need the distributed optimizer's fp32 master (Megatron asserts it);
    an eager engine (torchao) neither caches copies nor gathers them quantized here."""
    wl = replace(WL, precision=Precision.FP8)
    zero0 = replace(ZERO1, zero=ZeroStage.NONE, low_precision_params=True)
    assert weights_gib(Precision.FP8, zero0) == weights_gib(Precision.FP8, replace(zero0, low_precision_params=False))
    eager = replace(ZERO1, fused_kernels=False, low_precision_params=True)
    assert float(layout(MODEL, wl, eager).gather_bytes_per_param) == 2.0


def test_megatron_refuses_quantized_weights_without_the_distributed_optimizer_in_one_line():
    from paraplan.errors import SpecError
    from paraplan.export import megatron
    from paraplan.specs.workload import Fp8Recipe
    wl = replace(WL, precision=Precision.FP8)
    plan = megatron.SUPPORT.adapt(replace(ZERO1, low_precision_params=True))
    megatron.check(plan, MODEL, wl)
    with pytest.raises(SpecError, match="distributed optimizer"):
        megatron.check(replace(plan, zero=ZeroStage.NONE), MODEL, wl)
    offload = replace(plan, offload_optimizer=True)
    with pytest.raises(SpecError, match="--fp8-recipe delayed"):
        megatron.check(offload, MODEL, wl)
    delayed = replace(wl, fp8_recipe=Fp8Recipe.DELAYED)
    megatron.check(offload, MODEL, delayed)
    # and its search never ranks the plans its check refuses
    from paraplan.plan.space import PlanBatch
    batch = PlanBatch.from_plans([plan, replace(plan, zero=ZeroStage.NONE), offload])
    rule = megatron.SUPPORT.limits.engine_rule
    assert list(map(bool, rule(batch, MODEL, wl))) == [False, True, True]
    assert list(map(bool, rule(batch, MODEL, delayed))) == [False, True, False]


def test_memory_advice_offers_quantized_weights_where_they_apply():
    """`estimate`'s what-frees-memory advice lists --low-precision-params for an FP8 plan with a
    sharded optimizer on Transformer Engine, freeing the 16-bit copy of every layer's weights."""
    from paraplan.search.advice import fitting_changes
    cluster = load_cluster("dgx-h100", num_gpus=8)
    fp8 = Workload(global_batch_size=8, seq_len=8192, precision=Precision.FP8)
    plan = make_plan(tp=1, dp=8, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, recompute=Recompute.FULL)
    before = estimate(MODEL, cluster, fp8, plan).memory.weights_bytes
    offered = {c.flags: c for c in fitting_changes(MODEL, cluster, fp8, plan)}
    assert "--low-precision-params" in offered
    freed = before - offered["--low-precision-params"].estimate.memory.weights_bytes
    assert freed == pytest.approx(2.0 * linear_params(), rel=1e-9)
    for wl, p in ((replace(fp8, precision=Precision.BF16), plan), (fp8, replace(plan, zero=ZeroStage.NONE))):
        assert "--low-precision-params" not in {c.flags for c in fitting_changes(MODEL, cluster, wl, p)}
