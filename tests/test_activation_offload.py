"""Activation offload (Plan.activation_offload_layers; cost/activation_offload.py): what it
moves to the host, what of its copies shows, where the search tries it, what engines run it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan import api
from paraplan.cost.estimate import estimate
from paraplan.errors import SpecError
from paraplan.export import deepspeed, megatron, torchtitan
from paraplan.plan.axes import AttentionKernel, Recompute, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import SpaceLimits, check_plan
from paraplan.errors import NoPlanFitsError
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

LLAMA70 = load_model("llama3-70b")
GB200 = load_cluster("gb200-nvl72", 8)
WL = Workload(global_batch_size=8, seq_len=8192)


def _plan(**kw):
    base = dict(tp=2, dp=4, micro_batch_size=1, sequence_parallel=True, zero=ZeroStage.PARAMETERS,
                attention=AttentionKernel.FLASH3)
    base.update(kw)
    return make_plan(**base)


def _slow_host(cluster, gb_per_s):
    """The cluster with its GPUs' host link at `gb_per_s` one way (and no DRAM limit)."""
    gpu = replace(cluster.gpu, host_link_bw_unidir_bytes_per_s=gb_per_s * 1e9)
    return replace(cluster, gpu=gpu, host_memory_bw_bytes_per_s_per_host=0.0)


def test_offloaded_layers_move_their_activations_to_the_host():
    base = estimate(LLAMA70, GB200, WL, _plan())
    per_layer = None
    for j in (8, 40, 80):
        e = estimate(LLAMA70, GB200, WL, _plan(activation_offload_layers=j))
        # one micro-batch in flight on a single stage: the host holds j layers' activations
        assert e.host_bytes > 0
        per_layer = per_layer or e.host_bytes / j
        assert e.host_bytes == pytest.approx(j * per_layer)
        # the GPU keeps the rest and two layers' staging buffer
        saved = base.memory.activations_bytes - e.memory.activations_bytes
        assert saved == pytest.approx((j - 2) * per_layer)
    # the layer's saved activations are what the memory model keeps per layer: all 80 layers'
    # are the activations a plan without offload holds, less the stage's other terms
    assert 80 * per_layer < base.memory.activations_bytes


def test_copies_hide_under_compute_on_c2c_and_show_on_a_slow_link():
    plan = _plan(activation_offload_layers=40)
    fast = estimate(LLAMA70, GB200, WL, plan)
    none = estimate(LLAMA70, GB200, WL, _plan())
    assert fast.time.offload_s == 0.0 and fast.overlapped.offload_s > 0.0
    assert fast.step_time_s == pytest.approx(none.step_time_s)
    # on links slow enough that every copy outlasts its neighbour's compute, the exposed time
    # grows by m·j·2·bytes·(1/bw1 − 1/bw2): the layer's bytes over the link, out and back
    slow1, slow2 = (estimate(LLAMA70, _slow_host(GB200, bw), WL, plan) for bw in (0.5, 1.0))
    bytes_per_layer = fast.host_bytes / 40
    m = fast.num_microbatches
    growth = slow1.step_time_s - slow2.step_time_s
    assert growth == pytest.approx(m * 40 * 2 * bytes_per_layer * (1 / 0.5e9 - 1 / 1e9), rel=1e-6)
    assert slow1.time.offload_s > slow2.time.offload_s > 0.0
    # the breakdown adds up
    assert slow1.time.total == pytest.approx(slow1.step_time_s)


def test_two_gpus_sharing_a_grace_share_its_dram_bandwidth():
    gb300 = load_cluster("gb300-nvl72", 8)
    assert gb300.offload_bytes_per_s == pytest.approx(389e9 / 2)
    assert gb300.offload_bytes_per_s < gb300.gpu.host_link_bw_unidir_bytes_per_s
    h100 = load_cluster("dgx-h100", 8)  # DRAM bandwidth not stated: the PCIe link's rate
    assert h100.offload_bytes_per_s == h100.gpu.host_link_bw_unidir_bytes_per_s


def test_offloaded_activations_must_fit_in_host_dram():
    small_host = replace(GB200, host_memory_bytes_per_host=2 * 10e9)  # 10 GB per GPU
    e = estimate(LLAMA70, small_host, WL, _plan(activation_offload_layers=80))
    assert not e.fits
    assert "offloaded optimizer state and activations" in e.misfit("gb200")


def test_first_k_recomputes_some_layers_offloads_the_next_and_keeps_the_rest():
    first_k = _plan(recompute=Recompute.FIRST_K, recompute_num_layers=20)
    kept = estimate(LLAMA70, GB200, WL, first_k)
    whole = estimate(LLAMA70, GB200, WL, _plan())
    for j in (10, 60):
        e = estimate(LLAMA70, GB200, WL, replace(first_k, activation_offload_layers=j))
        # an offloaded layer goes whole: as many bytes per layer as without recomputation
        assert e.host_bytes / j == pytest.approx(estimate(LLAMA70, GB200, WL, _plan(activation_offload_layers=j))
                                                 .host_bytes / j)
        assert kept.memory.activations_bytes - e.memory.activations_bytes == pytest.approx(e.host_bytes * (j - 2) / j)
    assert whole.memory.activations_bytes > kept.memory.activations_bytes


@pytest.mark.parametrize("kw, words", [
    (dict(recompute=Recompute.FIRST_K, recompute_num_layers=4, activation_offload_layers=77),
     "at most the stage's 80 layers less the 4 first-k recomputes"),
    (dict(recompute=Recompute.OP_SAC, fused_kernels=False, activation_offload_layers=4), "other than op-sac"),
    (dict(activation_offload_layers=81), "at most the stage's 80 layers"),
    (dict(pp=2, dp=2, activation_offload_layers=41), "at most the stage's 40 layers"),
])
def test_rules_refuse_what_offload_cannot_combine_with(kw, words):
    rej = check_plan(_plan(**kw), LLAMA70, GB200, WL)
    assert rej is not None and words in rej.reason


def test_search_finds_an_offloaded_plan_where_nothing_fits_otherwise():
    # Llama 3 70B on 8 GB200 at 131,072 tokens, the optimizer kept on the GPU (Megatron-Core's
    # default): without activation offload no plan fits
    wl = Workload(global_batch_size=4, seq_len=131072)
    with pytest.raises(NoPlanFitsError):
        api.search(LLAMA70, GB200, gpus=8, workload=wl, top=1,
                   limits=SpaceLimits(allow_offload=False, activation_offload=False))
    best = api.search(LLAMA70, GB200, gpus=8, workload=wl, top=1, limits=SpaceLimits(allow_offload=False)).ranked[0]
    assert best.plan.activation_offload_layers > 0 and best.fits
    assert best.overlapped.offload_s > 0.0


def test_search_tries_offload_only_where_the_host_link_is_c2c_class():
    h100 = load_cluster("dgx-h100", 64)
    wl = Workload(global_batch_size=64, seq_len=8192)
    ranked = api.search(LLAMA70, h100, gpus=64, workload=wl, top=20).ranked
    assert all(e.plan.activation_offload_layers == 0 for e in ranked)
    forced = api.search(LLAMA70, h100, gpus=64, workload=wl, top=200,
                        limits=SpaceLimits(activation_offload=True)).ranked
    assert any(e.plan.activation_offload_layers > 0 for e in forced)


def test_engines_run_it_as_they_ship_it():
    plan = _plan(tp=1, dp=8, zero=ZeroStage.OPTIMIZER, sequence_parallel=False, activation_offload_layers=16)
    megatron.check(plan, LLAMA70, WL)  # PP 1, no recomputation: --cpu-offloading-num-layers
    args = megatron.arguments(plan, LLAMA70, WL)
    assert args[args.index("--cpu-offloading-num-layers") + 1] == "16"
    for bad in (replace(plan, pp=2, dp=4), replace(plan, recompute=Recompute.FULL),
                replace(plan, activation_offload_layers=80)):
        with pytest.raises(SpecError, match="activation_offload_layers"):
            megatron.check(bad, LLAMA70, WL)
    with pytest.raises(SpecError, match="activation_offload_layers"):
        torchtitan.check(replace(plan, zero=ZeroStage.PARAMETERS), LLAMA70, WL)
    with pytest.raises(SpecError, match="activation_offload_layers"):
        deepspeed.check(plan, LLAMA70, WL)


def test_the_cli_estimates_it_and_refuses_a_bad_count(capsys):
    from paraplan.cli.main import main
    common = ["estimate", "--model", "llama3-70b", "--cluster", "gb200-nvl72", "--gpus", "8", "--seq", "8192",
              "--batch", "8", "--tp", "2", "--dp", "4", "--zero", "3"]
    assert main(common + ["--offload-activations", "40"]) == 0
    out = capsys.readouterr().out
    assert "aoff40" in out and "activation offload (hidden)" in out and "host DRAM per GPU" in out
    assert main(common + ["--offload-activations", "40", "--recompute", "first_k", "--recompute-layers", "50"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "activation offload" in err[0]


def test_the_advice_names_offload_where_the_search_would_try_it():
    from paraplan.search.advice import fitting_changes, memory_headroom
    wl = Workload(global_batch_size=8, seq_len=65536)
    plan = _plan(cp=4, dp=1)  # TP2 CP4 ZeRO-3: 344 GiB by the memory model, over a GB200's
    changes = fitting_changes(LLAMA70, GB200, wl, plan)
    assert [c.flags for c in changes] == ["--offload-activations 80"]
    assert changes[0].estimate.fits
    # on an H100 cluster (PCIe to the host) the advice does not offer it
    h100 = load_cluster("dgx-h100", 8)
    assert not any("offload-activations" in c.flags for c in fitting_changes(LLAMA70, h100, wl, plan))
    # of a plan that fits, it frees the most where it moves every layer's activations off the GPU
    fits = _plan(tp=1, pp=4, dp=2, zero=ZeroStage.OPTIMIZER, sequence_parallel=False)
    room = memory_headroom(LLAMA70, GB200, Workload(global_batch_size=64, seq_len=8192),
                           estimate(LLAMA70, GB200, Workload(global_batch_size=64, seq_len=8192), fits))
    assert room.flags == "--offload-activations 20" and room.freed_bytes > 0


def test_the_breakdown_counts_the_critical_stages_own_offloaded_layers():
    # 32 layers over 3 stages: 11, 11 and 10 (the last holds the loss's slot) -- the last critical
    model, h100, wl = load_model("llama3-8b"), load_cluster("dgx-h100", 6), Workload(global_batch_size=16, seq_len=4096)
    base = dict(tp=2, pp=3, dp=1, sequence_parallel=True, attention=AttentionKernel.FLASH3)
    kept = estimate(model, h100, wl, make_plan(**base))
    offloaded = estimate(model, h100, wl, make_plan(**base, activation_offload_layers=11))
    # copies add no compute: what the step gains is the exposed copies and the bubble they widen
    assert offloaded.time.compute_s == pytest.approx(kept.time.compute_s)
    assert offloaded.time.offload_s > 0.0
    assert offloaded.time.total == pytest.approx(offloaded.step_time_s)
