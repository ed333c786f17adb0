"""32-bit activations (fp32 and tf32 workloads, CPU runs): 4 bytes per element in memory
and on the wire, where 16-bit workloads count 2."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cost import memory as mem
from paraplan.cost.estimate import estimate
from paraplan.cost.layer_compute import elementwise_bytes_per_token
from paraplan.cost.stage_ends import loss_bytes_per_logit
from paraplan.errors import SpecError
from paraplan.plan.axes import AttentionKernel, Recompute
from paraplan.plan.plan import Plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload, parse_precision


def test_precision_names_its_activation_width():
    assert [p.activation_bytes for p in (Precision.BF16, Precision.FP16, Precision.FP8)] == [2.0, 2.0, 2.0]
    assert [p.activation_bytes for p in (Precision.TF32, Precision.FP32)] == [4.0, 4.0]
    assert parse_precision("FP32") is Precision.FP32 and parse_precision("tf32") is Precision.TF32
    assert parse_precision("BF16 (AMP)") is Precision.BF16  # a 16-bit run that keeps fp32 masters
    with pytest.raises(SpecError, match="allowed: bf16, fp16, fp8, tf32, fp32"):
        parse_precision("fp4")


def test_stored_activations_double_at_32_bits():
    """Korthikanti et al.'s per-layer bytes count 16-bit elements: every one of them doubles
    at 32 bits; the 1-byte dropout masks do not."""
    model = load_model("llama3-8b")  # no dropout
    plan = Plan(tp=2, sequence_parallel=True, micro_batch_size=2, attention=AttentionKernel.FLASH2)
    for rc in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL):
        b16 = mem.layer_activation_bytes(model, plan, 4096, recompute_code=rc.code, precision=Precision.BF16)[0]
        b32 = mem.layer_activation_bytes(model, plan, 4096, recompute_code=rc.code, precision=Precision.FP32)[0]
        assert float(b32) == pytest.approx(2.0 * float(b16)), rc
    # with dropout and unfused attention: scores and softmax output double, masks stay 1 byte
    legacy = replace(model, dropout=True)
    t16 = mem.activation_terms(legacy, 2048, precision=Precision.BF16)
    t32 = mem.activation_terms(legacy, 2048, precision=Precision.FP32)
    a, s = legacy.num_heads, 2048
    assert t16.scores == pytest.approx(5 * a * s) and t32.scores == pytest.approx(9 * a * s)
    h = legacy.hidden_size
    assert t32.replicated - 2 * h == pytest.approx(2 * (t16.replicated - 2 * h))


def test_loss_and_elementwise_bytes_at_32_bits():
    assert loss_bytes_per_logit(Precision.BF16) == (18.0, 26.0)
    assert loss_bytes_per_logit(Precision.FP32) == (12.0, 20.0)  # no up- or down-cast
    assert mem.logits_bytes_per_element(Precision.BF16) == 6.0
    assert mem.logits_bytes_per_element(Precision.FP32) == 8.0
    model = load_model("llama3-8b")
    assert elementwise_bytes_per_token(model, act_bytes=4.0) == 2.0 * elementwise_bytes_per_token(model, act_bytes=2.0)


def test_tensor_parallel_traffic_doubles_at_32_bits():
    """TF32 and BF16 plans differ in GEMM rate, not in what TP moves, except the width: the
    sequence-parallel all-gathers and reduce-scatters carry twice the bytes at 32 bits."""
    model = load_model("llama3-70b")
    cluster = load_cluster("dgx-h100", num_gpus=8)
    plan = Plan(tp=8, dp=1, dp_shard=1, sequence_parallel=True, micro_batch_size=1, recompute=Recompute.FULL)
    tp = {}
    for prec in (Precision.BF16, Precision.TF32):
        est = estimate(model, cluster, Workload(global_batch_size=8, seq_len=8192, precision=prec), plan,
                       simulate_pipeline=False)
        tp[prec] = est.time.tp_comm_s
        assert est.memory.activations_bytes > 0
    # large messages sit on the flat part of the bus-bandwidth curve: time ∝ bytes
    assert tp[Precision.TF32] / tp[Precision.BF16] == pytest.approx(2.0, rel=0.05)


def test_every_activation_message_doubles_at_32_bits():
    """Pipeline sends, Ulysses all-to-alls and MoE dispatch/combine, all exposed here (no
    overlap), carry 4-byte elements in a TF32 workload: about twice a BF16 one's time on
    large messages."""
    from paraplan.plan.axes import CPCommType, Schedule, ZeroStage
    model = load_model("qwen3-30b-a3b")  # no shared experts: nothing hides the all-to-all
    cluster = load_cluster("dgx-h100", num_gpus=64)
    plan = Plan(tp=1, pp=2, cp=2, dp=16, ep=8, micro_batch_size=1, dp_shard=16, cp_comm_type=CPCommType.A2A,
                schedule=Schedule.ONE_F_ONE_B, zero=ZeroStage.OPTIMIZER, ep_overlap=False)
    t = {}
    for prec in (Precision.BF16, Precision.TF32):
        est = estimate(model, cluster, Workload(global_batch_size=256, seq_len=16384, precision=prec), plan,
                       simulate_pipeline=False)
        t[prec] = est.time
    for part in ("pp_comm_s", "cp_comm_s", "ep_comm_s"):
        ratio = getattr(t[Precision.TF32], part) / getattr(t[Precision.BF16], part)
        assert 1.6 < ratio < 2.05, (part, ratio)


def test_a_32_bit_workload_has_32_bit_parameters():
    """No 16-bit copy: weights 4 bytes, optimizer 8 (the moments; the weight is the master),
    whatever the plan's fp32_params knob says; the GEMMs' operands are 4 bytes too."""
    from paraplan.cost.roofline import gemm_time_s
    from paraplan.plan.axes import ZeroStage
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", num_gpus=8)
    plan = Plan(dp=8, dp_shard=8, zero=ZeroStage.NONE, micro_batch_size=1)
    wl = Workload(global_batch_size=64, seq_len=4096, precision=Precision.FP32)
    m32 = estimate(model, cluster, wl, plan, simulate_pipeline=False).memory
    m32b = estimate(model, cluster, wl, replace(plan, fp32_params=True), simulate_pipeline=False).memory
    m16 = estimate(model, cluster, replace(wl, precision=Precision.BF16), plan, simulate_pipeline=False).memory
    assert m32.weights_bytes == pytest.approx(2.0 * m16.weights_bytes)
    assert m32.optimizer_bytes == pytest.approx(m16.optimizer_bytes * 8.0 / 12.0)
    assert (m32.weights_bytes, m32.optimizer_bytes) == (m32b.weights_bytes, m32b.optimizer_bytes)
    gpu = cluster.gpu  # a memory-bound GEMM (one row) moves twice the bytes (the launch stays)
    tau = gpu.kernel_launch_overhead_s
    assert float(gemm_time_s(gpu, 1, 8192, 8192, Precision.TF32)) - tau == pytest.approx(
        2.0 * (float(gemm_time_s(gpu, 1, 8192, 8192, Precision.BF16)) - tau), rel=0.01)


@pytest.mark.parametrize("engine", ["megatron", "deepspeed"])
def test_engines_without_a_32_bit_setting_refuse_it(engine, capsys, tmp_path):
    from paraplan.cli import main
    out = tmp_path / "cfg"
    code = main(["export", "--format", engine, "--model", "llama3-8b", "--gpus", "8", "--batch", "64", "--seq", "4096",
                 "--precision", "fp32", "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "precision" in err and len(err.strip().splitlines()) == 1 and not out.exists()
