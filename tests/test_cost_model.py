"""Cost-model behaviours that the published runs pinned down (see docs/model.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cost.estimate import estimate
from paraplan.cost.flops import layer_forward_flops
from paraplan.plan.axes import Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import SpaceLimits, enumerate_space
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload
from paraplan.validate.training import row_setup

WL = Workload(global_batch_size=64, seq_len=2048)


@pytest.mark.parametrize("model_name", ["mpt-7b", "llama3-8b"])
def test_checkpoint_early_stop_skips_the_down_projection_only(model_name):
    model, cluster = load_model(model_name), load_cluster("dgx-h100", num_gpus=8)
    base = make_plan(dp=8, micro_batch_size=4, recompute=Recompute.FULL, zero=ZeroStage.PARAMETERS)
    full = estimate(model, cluster, WL, base)
    early = estimate(model, cluster, WL, replace(base, checkpoint_early_stop=True))
    saved = full.time.recompute_s - early.time.recompute_s
    # the down-projection is f·h of the layer's forward GEMM work: a real saving, and no more
    lf = layer_forward_flops(model, 4 * 2048, 2048, causal=True)
    down_share = 2.0 * 4 * 2048 * model.ffn_hidden_size * model.hidden_size / lf.total
    assert 0.5 * down_share < saved / full.time.recompute_s < 1.5 * down_share
    assert early.time.compute_s == pytest.approx(full.time.compute_s)
    assert early.hfu * early.step_time_s < full.hfu * full.step_time_s  # the skipped GEMM is not executed
    # without recomputation the flag changes nothing
    none = make_plan(dp=8, micro_batch_size=1, zero=ZeroStage.PARAMETERS)
    assert (estimate(model, cluster, WL, replace(none, checkpoint_early_stop=True)).step_time_s
            == pytest.approx(estimate(model, cluster, WL, none).step_time_s))


def test_full_shard_only_when_hybrid_sharding_is_off():
    model, cluster = load_model("mpt-1b"), load_cluster("dgx-h100", num_gpus=64)
    limits = SpaceLimits(zero_stages=(ZeroStage.PARAMETERS,), hybrid_shard=False)
    shards = {(int(d), int(s)) for batch, _ in enumerate_space(model, cluster, WL, limits)
              for d, s in zip(batch.dp, batch.dp_shard)}
    assert shards and all(d == s for d, s in shards)
    hsdp = {(int(d), int(s)) for batch, _ in enumerate_space(model, cluster, WL, SpaceLimits(
        zero_stages=(ZeroStage.PARAMETERS,))) for d, s in zip(batch.dp, batch.dp_shard)}
    assert any(d != s for d, s in hsdp)


def test_loss_traffic_weighs_most_on_small_models_with_large_vocabularies():
    """The fp32 cross-entropy is memory-bound: its share of the step falls as hidden grows."""
    cluster = load_cluster("dgx-a100-80gb", num_gpus=8)
    shares = []
    for name in ("mpt-125m", "mpt-1b", "mpt-7b"):
        model = load_model(name)
        plan = make_plan(dp=8, micro_batch_size=8, zero=ZeroStage.PARAMETERS)
        est = estimate(model, cluster, Workload(global_batch_size=64, seq_len=512), plan)
        wider = replace(model, vocab_size=2 * model.vocab_size)
        est2 = estimate(wider, cluster, Workload(global_batch_size=64, seq_len=512), plan)
        shares.append(est2.step_time_s / est.step_time_s - 1.0)
    assert shares[0] > shares[1] > shares[2] > 0


def test_composer_rows_run_pytorch_checkpointing_and_full_shard():
    row = {"id": "x", "source": "s", "model": "MPT-7B", "seq_len": "2048", "gpu": "H100", "num_gpus": "16",
           "precision": "BF16", "global_batch": "64", "micro_batch": "4", "dp": "16", "tp": "1", "pp": "1",
           "recompute": "full", "zero": "PyTorch FSDP FULL_SHARD (MP mode DEFAULT)",
           "framework": "MosaicML Composer / llm-foundry", "metric_id": "tokens_per_s_per_gpu", "value": "1"}
    setup = row_setup(row, "f.csv", 2)
    assert setup.limits.checkpoint_early_stop and not setup.limits.hybrid_shard and setup.limits.fp32_params
    assert setup.limits.eager_elementwise and setup.limits.fused_kernels  # MPT: one Wqkv, eager GELU and norms
    megatron = dict(row, framework="Megatron-Core r0.8.0", zero="")
    setup = row_setup(megatron, "f.csv", 2)
    assert not setup.limits.checkpoint_early_stop and setup.limits.hybrid_shard
    assert not setup.limits.eager_elementwise


@pytest.mark.parametrize("sp", [False, True])
def test_async_tp_backward_hides_reductions_behind_weight_gradients(sp):
    model, cluster = load_model("llama2-13b"), load_cluster("dgx-a100-80gb", num_gpus=8)
    plan = make_plan(tp=8, micro_batch_size=2, sequence_parallel=sp)
    wl = Workload(global_batch_size=16, seq_len=4096)
    sync = estimate(model, cluster, wl, replace(plan, tp_async_backward=False))
    asyn = estimate(model, cluster, wl, plan)
    assert asyn.time.tp_comm_s < sync.time.tp_comm_s
    # only the backward half can hide, and with SP its output-gradient all-gathers cannot
    assert asyn.time.tp_comm_s > (0.5 if not sp else 0.6) * sync.time.tp_comm_s
    assert asyn.overlapped.tp_comm_s > sync.overlapped.tp_comm_s
    # TP=1 has nothing to reduce
    solo = make_plan(dp=8, micro_batch_size=2)
    assert (estimate(model, cluster, wl, replace(solo, tp_async_backward=False)).step_time_s
            == pytest.approx(estimate(model, cluster, wl, solo).step_time_s))


@pytest.mark.parametrize("early", [False, True])
def test_recomputation_moves_no_time_out_of_compute(early):
    """Recomputing layers adds recompute time and the recomputed forward's exposed TP; the
    forward/backward compute itself stays what it was."""
    model, cluster = load_model("llama2-13b"), load_cluster("dgx-a100-80gb", num_gpus=8)
    wl = Workload(global_batch_size=16, seq_len=4096)
    plan = make_plan(tp=8, micro_batch_size=2, checkpoint_early_stop=early)
    none = estimate(model, cluster, wl, plan)
    full = estimate(model, cluster, wl, replace(plan, recompute=Recompute.FULL))
    assert full.time.compute_s == pytest.approx(none.time.compute_s, rel=1e-9)
    assert full.time.recompute_s > 0 and full.time.tp_comm_s > none.time.tp_comm_s


def test_fp32_parameter_shards_are_the_master_copy():
    # FSDP with fp32 shards under autocast: 4 (weights) + 4 (grads) + 8 (moments) bytes per
    # parameter, not 2 + 4 + 12; the sum drops by exactly 2 bytes per sharded parameter
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=8, seq_len=2048)
    base = make_plan(dp=8, micro_batch_size=1, zero=ZeroStage.PARAMETERS)
    bf16 = estimate(model, cluster, wl, base).memory
    fp32 = estimate(model, cluster, wl, replace(base, fp32_params=True)).memory
    assert fp32.weights_bytes == pytest.approx(2 * bf16.weights_bytes)
    assert fp32.optimizer_bytes == pytest.approx(bf16.optimizer_bytes * 8 / 12)
    assert fp32.gradients_bytes == pytest.approx(bf16.gradients_bytes)
    params_per_gpu = bf16.weights_bytes / 2
    assert bf16.model_states_bytes - fp32.model_states_bytes == pytest.approx(2 * params_per_gpu)


def test_megatron_16bit_gradient_buffer_halves_the_gradients_and_their_reduction():
    """Megatron-Core's DDP keeps main_grad in the reduction's dtype: with fp32 reduction off
    (Plan.grad_buffer_16bit) the gradients take 2 bytes a parameter, not 4, and the
    data-parallel reduction moves 16-bit values, whatever grad_reduce_fp32 says."""
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=16)
    wl = Workload(global_batch_size=64, seq_len=4096)
    fp32 = make_plan(tp=1, dp=16, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, grad_reduce_fp32=True)
    bf16 = replace(fp32, grad_buffer_16bit=True)
    a, b = estimate(model, cluster, wl, fp32), estimate(model, cluster, wl, bf16)
    assert b.memory.gradients_bytes == pytest.approx(a.memory.gradients_bytes / 2.0)
    assert b.memory.weights_bytes == pytest.approx(a.memory.weights_bytes)
    assert b.time.dp_comm_s < a.time.dp_comm_s


def test_interleaved_chunks_reduce_under_the_last_group_of_backwards():
    """Under the interleaved schedule each model chunk's gradients are reduced once its last
    backward ends, chunk v−1's a group of p micro-batches before chunk 0's (Megatron-Core
    schedules.py): the reduction hides behind more than the last micro-batch's backward, so a
    step whose reduction outlasts one micro-batch exposes less of it than under 1F1B."""
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=256)
    wl = Workload(global_batch_size=256, seq_len=1024)
    one = make_plan(tp=4, pp=4, dp=16, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, sequence_parallel=True,
                    grad_reduce_fp32=True)
    inter = replace(one, vp=4, schedule=Schedule.INTERLEAVED_1F1B)
    a, b = estimate(model, cluster, wl, one), estimate(model, cluster, wl, inter)
    assert a.time.dp_comm_s > 0.0 and b.time.dp_comm_s < a.time.dp_comm_s


def test_eager_elementwise_keeps_the_fused_gemms_and_runs_the_eager_kernels():
    """llm-foundry's MPT fuses Wqkv and its loss but runs its norms, GELU and residual adds as
    eager PyTorch kernels: its GEMMs are the fused engine's, its element-wise time the eager
    engine's (on the H100, whose eager element-wise efficiency was measured)."""
    from paraplan.cost.layer_compute import layer_compute
    from paraplan.cost.layout import layout
    model, cluster = load_model("mpt-7b"), load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=64, seq_len=2048)
    fused = make_plan(dp=8, micro_batch_size=4, zero=ZeroStage.PARAMETERS)
    variants = {name: replace(fused, **kw) for name, kw in
                (("fused", {}), ("mpt", {"eager_elementwise": True}), ("eager", {"fused_kernels": False}))}
    lc = {name: layer_compute(cluster.gpu, model, wl, p, layout(model, wl, p), None) for name, p in variants.items()}
    assert lc["mpt"].gemms_forward_s == pytest.approx(lc["fused"].gemms_forward_s)
    assert lc["mpt"].elementwise_forward_s == pytest.approx(lc["eager"].elementwise_forward_s)
    assert lc["mpt"].elementwise_forward_s > lc["fused"].elementwise_forward_s
