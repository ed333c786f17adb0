"""Fused vs separate projections (Plan.fused_kernels): Megatron-Core runs Q, K, V as one
column-parallel GEMM and a gated MLP's gate and up as another; torchtitan's Llama and
paraplan run keep wq, wk, wv, w1, w3 apart. Separate GEMMs are smaller (each at the
efficiency of its own size, each its own launch) and, without sequence parallelism, each
all-reduces its own input gradient."""

from __future__ import annotations

import pytest

from paraplan.cost.comm import Collective, collective_time_s
from paraplan.cost.estimate import estimate
from paraplan.cost.roofline import gemm_time_s
from paraplan.export.megatron import SUPPORT as MEGATRON
from paraplan.export.torchtitan import SUPPORT as TORCHTITAN
from paraplan.plan.plan import make_plan
from paraplan.report.labels import GEMMS_BWD
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("dgx-h100", num_gpus=2)
WL = Workload(global_batch_size=8, seq_len=4096)


def _detail(plan):
    return estimate(MODEL, CLUSTER, WL, plan).layer_detail["fwd"]


def test_separate_projections_are_priced_as_separate_gemms():
    T, h, t, f = 4096, MODEL.hidden_size, 2, MODEL.ffn_hidden_size
    gpu, bf16 = CLUSTER.gpu, Precision.BF16
    fused = _detail(make_plan(tp=t, micro_batch_size=1))
    apart = _detail(make_plan(tp=t, micro_batch_size=1, fused_kernels=False))
    assert float(fused["QKV GEMM"]) == pytest.approx(float(gemm_time_s(gpu, T, (MODEL.q_dim + 2 * MODEL.kv_dim) / t, h, bf16)))
    assert float(apart["QKV GEMM"]) == pytest.approx(float(gemm_time_s(gpu, T, MODEL.q_dim / t, h, bf16)
                                                           + 2 * gemm_time_s(gpu, T, MODEL.kv_dim / t, h, bf16)))
    assert float(apart["MLP up GEMM"]) == pytest.approx(2 * float(gemm_time_s(gpu, T, f / t, h, bf16)))
    # the same FLOPs in smaller GEMMs with more launches: never faster
    assert float(apart["QKV GEMM"]) > float(fused["QKV GEMM"])
    assert float(apart["MLP up GEMM"]) >= float(fused["MLP up GEMM"])
    assert float(apart["out-proj GEMM"]) == float(fused["out-proj GEMM"])


def test_without_sp_each_separate_projection_reduces_its_input_gradient():
    ar = float(collective_time_s(CLUSTER, Collective.ALL_REDUCE, 2.0 * 4096 * MODEL.hidden_size, 2, 1))
    for sp, extra in ((False, 3), (True, 0)):  # wq, wk, wv + w1, w3 against QKV + gate/up
        kw = dict(tp=2, micro_batch_size=1, sequence_parallel=sp, tp_async_backward=False)
        a = estimate(MODEL, CLUSTER, WL, make_plan(**kw))
        b = estimate(MODEL, CLUSTER, WL, make_plan(fused_kernels=False, **kw))
        m, L = a.num_microbatches, MODEL.num_layers
        assert b.time.tp_comm_s - a.time.tp_comm_s == pytest.approx(m * L * extra * ar, rel=1e-6, abs=1e-12)


def test_mla_keeps_its_low_rank_chain():
    model = load_model("deepseek-v3")
    wl = Workload(global_batch_size=8, seq_len=4096)
    kw = dict(tp=8, ep=8, micro_batch_size=1, sequence_parallel=True)
    cluster = load_cluster("dgx-h100", num_gpus=8)
    a = estimate(model, cluster, wl, make_plan(**kw)).layer_detail["fwd"]["QKV GEMM"]
    b = estimate(model, cluster, wl, make_plan(fused_kernels=False, **kw)).layer_detail["fwd"]["QKV GEMM"]
    assert float(a) == float(b)


def test_engines_say_how_they_build_the_projections():
    assert TORCHTITAN.adapt(make_plan(dp=8)).fused_kernels is False
    assert TORCHTITAN.search_limits().fused_kernels is False
    assert MEGATRON.adapt(make_plan(dp=8)).fused_kernels is True
    assert make_plan().fused_kernels is True


def test_separate_gate_and_up_reach_the_experts_and_mla_models_dense_layers():
    # torchtitan's MoE keeps w1 and w3 apart in its grouped experts and shared experts; an
    # MLA model keeps its low-rank attention chain but its dense MLPs split like any other
    model = load_model("qwen3-30b-a3b")
    cluster = load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=8, seq_len=4096)
    kw = dict(dp=8, ep=8, micro_batch_size=1)
    a = estimate(model, cluster, wl, make_plan(**kw)).layer_detail["fwd"]["MoE experts at λ = 1 (grouped GEMMs)"]
    b = estimate(model, cluster, wl, make_plan(fused_kernels=False, **kw)).layer_detail["fwd"][
        "MoE experts at λ = 1 (grouped GEMMs)"]
    assert float(b) > float(a)
    ds = load_model("deepseek-v3")
    kw = dict(tp=8, ep=8, pp=1, micro_batch_size=1, sequence_parallel=True)
    fused = estimate(ds, cluster, wl, make_plan(**kw)).layer_detail["fwd"]
    apart = estimate(ds, cluster, wl, make_plan(fused_kernels=False, **kw)).layer_detail["fwd"]
    assert float(apart["QKV GEMM"]) == float(fused["QKV GEMM"])
    assert float(apart["MLP up GEMM"]) > float(fused["MLP up GEMM"])


def test_deepspeed_exports_hugging_face_models_with_separate_projections():
    from paraplan.export.deepspeed import SUPPORT as DEEPSPEED
    assert DEEPSPEED.adapt(make_plan(dp=8)).fused_kernels is False


def test_separate_projections_launch_nine_more_kernels_per_layer():
    # counted the way calibrate counts them: the layer's price at a launch overhead of 1 ms
    # less its price at none; three more GEMMs forward (wk, wv beside wq; w3 beside w1),
    # each again twice in backward
    from dataclasses import replace
    wl = Workload(global_batch_size=1, seq_len=256)

    def kernels(fused):
        def layer_s(tau):
            c = replace(CLUSTER, gpu=replace(CLUSTER.gpu, kernel_launch_overhead_s=tau))
            d = estimate(MODEL, c, wl, make_plan(tp=2, micro_batch_size=1, sequence_parallel=True,
                                                 fused_kernels=fused)).layer_detail
            return sum(float(x) for part in ("fwd", "bwd") for x in d[part].values())
        return (layer_s(1e-3) - layer_s(0.0)) / 1e-3
    assert kernels(False) - kernels(True) == pytest.approx(9.0, abs=1e-6)


def test_async_tp_on_separate_projections_leaves_the_backward_input_gradient_scatters_exposed():
    """torch's micro-pipeline TP (torchtitan's async TP) fuses a matmul into the reduce-scatter
    it feeds; the backward reduce-scatter of a block's input gradient follows the sum of the
    wq, wk, wv (w1, w3) gradients, not a matmul, so it stays exposed: two per layer. Transformer
    Engine's overlap (fused projections) hides it with the rest."""
    model, t, T = load_model("llama3-8b"), 8, 8192
    cluster = load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=8, seq_len=T)
    kw = dict(tp=t, micro_batch_size=1, sequence_parallel=True, tp_overlap=True)

    def bwd_exposed(**extra):
        return float(estimate(model, cluster, wl, make_plan(**kw, **extra)).layer_detail["bwd"]["TP collectives"])

    rs = float(collective_time_s(cluster, Collective.REDUCE_SCATTER, 2.0 * T * model.hidden_size, t, 1))
    eager, fused = bwd_exposed(fused_kernels=False), bwd_exposed()
    assert eager >= 2.0 * rs
    assert fused < 2.0 * rs  # the same collectives, hidden behind the GEMMs but one chunk each


def _llama3_8b_at_tp8(fused: bool):
    """(model, cluster, workload, plan flags): Llama 3 8B at TP 8 with SP, one sequence of 8,192."""
    cluster = load_cluster("dgx-h100", num_gpus=8)
    flags = dict(tp=8, micro_batch_size=1, sequence_parallel=True, fused_kernels=fused)
    return load_model("llama3-8b"), cluster, Workload(global_batch_size=8, seq_len=8192), flags


def _gemm_in_chunks(gpu, T, chunks, n, k):
    """A [T, k] × [k, n] BF16 GEMM run as `chunks` GEMMs of T/chunks rows."""
    return chunks * float(gemm_time_s(gpu, T / chunks, n, k, Precision.BF16))


def test_micro_pipeline_tp_runs_each_tp_bound_gemm_as_t_chunks():
    """torch's micro-pipeline TP runs a fused all-gather-matmul once per rank's shard and a
    fused matmul-reduce-scatter once per destination's rows: the forward's four GEMMs as t
    GEMMs of T/t rows; in the backward only out's and down's data gradients (consumers of the
    gathered output gradient), the weight gradients whole. TP without overlap keeps whole GEMMs
    (Transformer Engine's overlap: the test below)."""
    model, cluster, wl, kw = _llama3_8b_at_tp8(fused=False)
    gpu, h, f, t, T = cluster.gpu, model.hidden_size, model.ffn_hidden_size, kw["tp"], wl.seq_len

    def out_down(chunks):
        return _gemm_in_chunks(gpu, T, chunks, h, model.q_dim / t) + _gemm_in_chunks(gpu, T, chunks, h, f / t)

    whole = estimate(model, cluster, wl, make_plan(**kw)).layer_detail
    async_tp = estimate(model, cluster, wl, make_plan(**kw, tp_overlap=True)).layer_detail
    assert float(whole["fwd"]["out-proj GEMM"]) == pytest.approx(_gemm_in_chunks(gpu, T, 1, h, model.q_dim / t))
    assert float(async_tp["fwd"]["out-proj GEMM"]) == pytest.approx(_gemm_in_chunks(gpu, T, t, h, model.q_dim / t))
    assert float(async_tp["fwd"]["MLP down GEMM"]) == pytest.approx(_gemm_in_chunks(gpu, T, t, h, f / t))
    bwd = GEMMS_BWD
    assert float(async_tp["wgrad"][bwd]) == pytest.approx(float(whole["wgrad"][bwd]))
    assert float(async_tp["bwd"][bwd]) == pytest.approx(float(whole["bwd"][bwd]) + out_down(t) - out_down(1))


def test_micro_pipeline_tp_sums_its_reduce_scatters_partials_in_a_kernel_of_its_own():
    """torch's fused matmul-reduce-scatter stacks the t partial products and sums them in one
    reduction kernel (read [T, h], write [T/t, h]): forward, out's and down's; backward none
    for Llama (its QKV and up input gradients are sums of separate matmuls, not fused)."""
    from paraplan.cost.roofline import memory_bound_time_s
    model, cluster, wl, kw = _llama3_8b_at_tp8(fused=False)
    t, T, h = kw["tp"], wl.seq_len, model.hidden_size

    def elementwise(**extra):
        detail = estimate(model, cluster, wl, make_plan(**kw, **extra)).layer_detail
        return float(detail["fwd"]["element-wise"]), float(detail["bwd"]["element-wise"])

    (fwd, bwd), (fwd_async, bwd_async) = elementwise(), elementwise(tp_overlap=True)
    one = float(memory_bound_time_s(cluster.gpu, 2.0 * T * h * (1.0 + 1.0 / t), 1))
    assert fwd_async - fwd == pytest.approx(2.0 * one)
    assert bwd_async == pytest.approx(bwd)
    # a non-gated MLP's input gradient is one matmul's: its reduce-scatter is fused, and summed
    mpt = load_model("mpt-7b")
    assert mpt.num_mlp_matrices == 2 and not mpt.is_mla
    detail = {ov: estimate(mpt, cluster, wl, make_plan(**kw, tp_overlap=ov)).layer_detail for ov in (False, True)}
    one = float(memory_bound_time_s(cluster.gpu, 2.0 * T * mpt.hidden_size * (1.0 + 1.0 / t), 1))
    assert float(detail[True]["bwd"]["element-wise"]) - float(detail[False]["bwd"]["element-wise"]) \
        == pytest.approx(one)


def test_userbuffers_overlap_splits_gemms_by_transformer_engines_default_methods():
    """Transformer Engine's userbuffers (Megatron's --tp-comm-overlap) by its default methods
    (TE 2.9 module/base.py initialize_ub): QKV and fc1 forward by ring exchange, t GEMMs of T/t
    rows; out and fc2 forward pipelined in 4 splits; in the backward out's and fc2's data
    gradients by ring exchange (t chunks), QKV's and fc1's data gradients and every weight
    gradient whole ("bulk", "external")."""
    from paraplan.cost.layer_compute import UB_PIPELINE_SPLITS
    from paraplan.cost.roofline import up_projection_time_s
    model, cluster, wl, kw = _llama3_8b_at_tp8(fused=True)
    gpu, h, f, t, T = cluster.gpu, model.hidden_size, model.ffn_hidden_size, kw["tp"], wl.seq_len

    def up(chunks):
        return chunks * float(up_projection_time_s(gpu, T / chunks, f / t, h, Precision.BF16,
                                                   model.num_mlp_matrices - 1, True))

    def out_down(chunks):
        return _gemm_in_chunks(gpu, T, chunks, h, model.q_dim / t) + _gemm_in_chunks(gpu, T, chunks, h, f / t)

    whole = estimate(model, cluster, wl, make_plan(**kw)).layer_detail
    ub = estimate(model, cluster, wl, make_plan(**kw, tp_overlap=True)).layer_detail
    qkv_width = model.qkv_params_per_layer / h / t
    assert float(whole["fwd"]["QKV GEMM"]) == pytest.approx(_gemm_in_chunks(gpu, T, 1, qkv_width, h))
    assert float(ub["fwd"]["QKV GEMM"]) == pytest.approx(_gemm_in_chunks(gpu, T, t, qkv_width, h))
    assert float(ub["fwd"]["MLP up GEMM"]) == pytest.approx(up(t))
    assert float(ub["fwd"]["out-proj GEMM"]) == pytest.approx(_gemm_in_chunks(gpu, T, UB_PIPELINE_SPLITS, h, model.q_dim / t))
    assert float(ub["fwd"]["MLP down GEMM"]) == pytest.approx(_gemm_in_chunks(gpu, T, UB_PIPELINE_SPLITS, h, f / t))
    # smaller GEMMs run at a lower efficiency: each chunked GEMM takes longer than the whole one
    assert float(ub["fwd"]["QKV GEMM"]) > float(whole["fwd"]["QKV GEMM"])
    bwd = GEMMS_BWD
    assert float(ub["wgrad"][bwd]) == pytest.approx(float(whole["wgrad"][bwd]))
    assert float(ub["bwd"][bwd]) == pytest.approx(float(whole["bwd"][bwd]) + out_down(t) - out_down(1))


def test_an_eager_engines_element_wise_kernels_stream_at_the_measured_eager_share():
    """H100: the eager element-wise mix measured at 0.4786 of the copy rate (nine paraplan
    calibrate runs); fused engines' kernels at the copy-rate share. Same bytes, same launches."""
    from paraplan.cost.layer_compute import EW_FWD_KERNELS, elementwise_bytes_per_token
    from paraplan.cost.roofline import memory_bound_time_s
    gpu, T = CLUSTER.gpu, 4096
    assert gpu.eager_elementwise_bw_efficiency == pytest.approx(0.4786)
    assert gpu.elementwise_bw_efficiency == pytest.approx(gpu.memory_bw_efficiency)
    ew_bytes = T * elementwise_bytes_per_token(MODEL, act_bytes=2.0, t=2.0)
    for fused, eff in ((True, gpu.elementwise_bw_efficiency), (False, gpu.eager_elementwise_bw_efficiency)):
        got = float(_detail(make_plan(tp=2, micro_batch_size=1, fused_kernels=fused))["element-wise"])
        assert got == pytest.approx(float(memory_bound_time_s(gpu, ew_bytes, EW_FWD_KERNELS, eff)))
