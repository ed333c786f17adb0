"""32-bit activations (fp32 and tf32 workloads, CPU runs): 4 bytes per element in memory
and on the wire, where 16-bit workloads count 2."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cost import memory as mem
from paraplan.cost.estimate import estimate
from paraplan.cost.evaluate import elementwise_bytes_per_token, loss_bytes_per_logit
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
