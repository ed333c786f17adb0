"""torchao's row-wise FP8 recipe (Workload.fp8_recipe; cost/low_precision.py): each GEMM input
quantized for its own GEMM and again along T for the weight gradient, each output gradient twice,
the TP-gathered inputs whole on every rank; its GEMMs at the GPU's row-wise ratio of the
per-tensor FP8 rate. Published labels map to it; a recipe without FP8 is one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cost.estimate import estimate
from paraplan.cost.roofline import memory_bound_time_s
from paraplan.errors import SpecError
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Fp8Recipe, Precision, Workload
from paraplan.validate.training import published_fp8_recipe, published_precision

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("dgx-h100", num_gpus=8)
T, t = 4096, 2
TENSORWISE = Workload(global_batch_size=8, seq_len=T, precision=Precision.FP8)
ROWWISE = replace(TENSORWISE, fp8_recipe=Fp8Recipe.ROWWISE)
PLAN = make_plan(tp=t, dp=4, micro_batch_size=1, sequence_parallel=True, fused_kernels=False)


def _detail(cluster, workload):
    return estimate(MODEL, cluster, workload, PLAN).layer_detail


def test_rowwise_gemms_run_at_the_rowwise_share_of_the_per_tensor_rate():
    gpu = replace(CLUSTER.gpu, fp8_rowwise_gemm_efficiency_ratio=0.6)
    rowwise = _detail(replace(CLUSTER, gpu=gpu), ROWWISE)["fwd"]
    slower = replace(gpu, fp8_gemm_efficiency_ratio=gpu.fp8_gemm_efficiency_ratio * 0.6)
    tensorwise = _detail(replace(CLUSTER, gpu=slower), TENSORWISE)["fwd"]
    for gemm in ("QKV GEMM", "out-proj GEMM", "MLP up GEMM", "MLP down GEMM"):
        assert float(rowwise[gemm]) == pytest.approx(float(tensorwise[gemm]))
    # at a ratio of 1 the GEMMs are the per-tensor ones
    one = replace(CLUSTER, gpu=replace(gpu, fp8_rowwise_gemm_efficiency_ratio=1.0))
    assert float(_detail(one, ROWWISE)["fwd"]["QKV GEMM"]) == pytest.approx(float(_detail(one, TENSORWISE)["fwd"]["QKV GEMM"]))


def test_rowwise_quantizes_inputs_twice_and_output_gradients_twice():
    h, f, qd = MODEL.hidden_size, MODEL.ffn_hidden_size, MODEL.q_dim
    gpu = replace(CLUSTER.gpu, fp8_rowwise_gemm_efficiency_ratio=1.0)
    cluster = replace(CLUSTER, gpu=gpu)
    row, ten = _detail(cluster, ROWWISE), _detail(cluster, TENSORWISE)
    qb = 3.0  # read 2 B, write 1 B per element
    x = 2 * h + qd / t + f / t                         # GEMM inputs, the gathered ones whole
    g = (qd + 2 * MODEL.kv_dim) / t + h + 2 * f / t + h  # output gradients: QKV, out, gate+up, down
    per_tensor = memory_bound_time_s(gpu, qb * T * (2 * h / t + qd / t + f / t), 0)
    fwd = float(row["fwd"]["element-wise"]) - float(ten["fwd"]["element-wise"])
    bwd = float(row["bwd"]["element-wise"]) - float(ten["bwd"]["element-wise"])
    assert fwd == pytest.approx(float(memory_bound_time_s(gpu, qb * T * x, 0) - per_tensor))
    assert bwd == pytest.approx(float(memory_bound_time_s(gpu, qb * T * (x + 2 * g), 0) - 2 * per_tensor))
    assert fwd > 0 and bwd > fwd


@pytest.mark.parametrize("model_name,tp", [("llama3-8b", 1), ("llama3-70b", 8), ("mixtral-8x7b", 4), ("deepseek-v3", 8)])
def test_rowwise_is_never_faster_than_tensorwise_at_the_same_gemm_rate(model_name, tp):
    """More quantization, the same GEMMs: dense, MoE and MLA models, with and without TP (an MoE
    layer shorter than its host's dispatch time hides the difference: never faster, not always
    slower)."""
    model = load_model(model_name)
    if model.mtp_layers:
        model = replace(model, mtp_layers=0)
    cluster = load_cluster("dgx-h100", num_gpus=tp * 2)
    one = replace(cluster, gpu=replace(cluster.gpu, fp8_rowwise_gemm_efficiency_ratio=1.0))
    plan = make_plan(tp=tp, dp=2, micro_batch_size=1, sequence_parallel=tp > 1,
                     **({"ep": 2} if model.is_moe else {}))
    wl = Workload(global_batch_size=8, seq_len=2048, precision=Precision.FP8)
    per_tensor = estimate(model, one, wl, plan).step_time_s
    row = estimate(model, one, replace(wl, fp8_recipe=Fp8Recipe.ROWWISE), plan).step_time_s
    assert row > per_tensor if not model.is_moe else row >= per_tensor
    assert estimate(model, cluster, replace(wl, fp8_recipe=Fp8Recipe.ROWWISE), plan).step_time_s >= row


@pytest.mark.parametrize("label,recipe", [
    ("BF16 + Float8 linear (float8 rowwise)", Fp8Recipe.ROWWISE),
    ("BF16 + Float8 linear (rowwise, bf16 all-gather)", Fp8Recipe.ROWWISE),
    ("BF16 + Float8 linear (rowwise_with_gw_hp, bf16 all-gather)", Fp8Recipe.ROWWISE),
    ("BF16 + Float8 linear (float8 tensorwise)", Fp8Recipe.TENSORWISE),
    ("FP8 (page caption: per-tensor FP8, current-step scaling)", Fp8Recipe.TENSORWISE),
    ("MXFP8", Fp8Recipe.TENSORWISE),
    ("BF16 (rowwise in the notes of a BF16 run)", Fp8Recipe.TENSORWISE),
])
def test_published_labels_name_the_recipe(label, recipe):
    assert published_fp8_recipe(label, published_precision(label)) is recipe


def test_a_recipe_without_fp8_is_refused_in_one_line():
    with pytest.raises(SpecError, match="fp8_recipe='rowwise'.*precision is bf16"):
        Workload(global_batch_size=8, seq_len=T, fp8_recipe=Fp8Recipe.ROWWISE)
