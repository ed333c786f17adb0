"""Kernels one serving iteration launches (inference/step.py): each GEMM once, the fused MoE
kernel once per projection whatever the number of experts (TensorRT-LLM, vLLM)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.inference.deploy import ServePlan, StoreDtype
from paraplan.inference.step import FUSED_MOE_GEMMS, KERNELS_PER_LAYER, IterationModel, routed_experts
from paraplan.specs.catalog import load_cluster, load_model

FP8 = dict(weight_dtype=StoreDtype.FP8, kv_dtype=StoreDtype.FP8)
TAU = 1e-3  # a launch overhead that dwarfs nothing else it is compared with: counted by difference


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100")


def _launches(model, cluster, plan, T):
    """Kernels of one stage's T-token forward, counted the way calibrate counts them: its price
    at a launch overhead of TAU less its price at none, over TAU."""
    def linear_s(tau):
        c = replace(cluster, gpu=replace(cluster.gpu, kernel_launch_overhead_s=tau))
        return IterationModel(model, c, plan)._linear_s(T)
    return (linear_s(TAU) - linear_s(0.0)) / TAU


@pytest.mark.parametrize("tp", [1, 8])
def test_a_dense_layer_launches_each_gemm_once(h100, tp):
    """Llama 3.1 8B: QKV, output, MLP in, MLP out are the layer's 4 GEMMs; with the 7 other
    kernels (2 norms, RoPE/KV write, attention, activation, 2 residual adds) 11 per layer,
    not 15 (each GEMM was counted among the 11 and again by its own roofline)."""
    m = load_model("llama3.1-8b")
    assert KERNELS_PER_LAYER == 7
    assert _launches(m, h100, ServePlan(tp=tp, **FP8), 512) == pytest.approx(11 * m.num_layers, abs=1e-6)


@pytest.mark.parametrize("T", [1, 64, 4096])
def test_a_fused_moe_layer_launches_per_projection_not_per_expert(h100, T):
    """Qwen3-235B-A22B (128 experts, top-8, every layer MoE) on TP8: per layer the 2
    attention GEMMs, the router GEMM, the fused kernel's 2 grouped GEMMs and the 7 others —
    12 whatever the 8..128 experts a batch activates (a loop would launch 2 per expert)."""
    m = load_model("qwen3-235b-a22b")
    assert FUSED_MOE_GEMMS == 2
    per_layer = 2 + 1 + FUSED_MOE_GEMMS + KERNELS_PER_LAYER
    assert _launches(m, h100, ServePlan(tp=8, **FP8), T) == pytest.approx(per_layer * m.num_layers, abs=1e-6)


def test_fusing_the_experts_saves_exactly_the_per_expert_launches(h100):
    """Against a loop of one GEMM kernel per active expert (the same roofline work each),
    the fused kernel is faster by (2·active − 2) launches per MoE layer, no more: the
    experts' work is priced as before."""
    m = load_model("qwen3-235b-a22b")
    step = IterationModel(m, h100, ServePlan(tp=8, **FP8))
    tau = h100.gpu.kernel_launch_overhead_s
    for T in (1, 16, 2048):
        active, per = routed_experts(T, m.num_experts, m.top_k, m.num_experts)
        h, fe = m.hidden_size, m.moe_ffn_hidden_size / 8
        loop = active * (step._gemm_s(per, 2 * fe, h) + step._gemm_s(per, h, fe))
        fused = active * (step._gemm_work_s(per, 2 * fe, h) + step._gemm_work_s(per, h, fe)) + 2 * tau
        assert loop - fused == pytest.approx((2 * active - 2) * tau, rel=1e-9)
        router = step._gemm_s(T, m.num_experts, h)
        assert step._moe_s(T) == pytest.approx(fused + router, rel=1e-12)
    # a whole 2,048-token iteration: 94 layers × (2·128 − 2) launches of 4 µs ≈ 95 ms saved
    assert active == pytest.approx(128)
    saved = m.num_layers * (2 * 128 - 2) * tau
    assert 0.09 < saved < 0.1


def test_more_experts_of_the_same_work_cost_no_more_launches(h100):
    """Splitting the same expert work over more, smaller experts changes the work's
    efficiency, never the launch count (one fused kernel per projection)."""
    m = load_model("mixtral-8x7b")
    fine = replace(m, num_experts=4 * m.num_experts, top_k=4 * m.top_k, moe_ffn_hidden_size=m.moe_ffn_hidden_size // 4)
    plan = ServePlan(tp=2, **FP8)
    assert _launches(fine, h100, plan, 1024) == pytest.approx(_launches(m, h100, plan, 1024), abs=1e-6)
