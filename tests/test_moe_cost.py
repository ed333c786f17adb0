"""Mixture-of-experts cost model: plan rules, dispatch (flat and deduplicated), load, overlap, FLOPs."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.cost.comm import Collective, collective_time_s, deduplicated_dispatch_s
from paraplan.cost.estimate import estimate
from paraplan.cost.flops import layer_forward_flops, model_flops_per_token
from paraplan.cost.moe import units_hit
from paraplan.plan.axes import Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import SpaceLimits, check_plan, enumerate_space
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.model import ModelSpec
from paraplan.specs.workload import Precision, Workload

# A small Qwen3-MoE-like model (no preset dependency): 128 experts top-8, GQA, SwiGLU.
MOE = ModelSpec(name="moe-test", num_layers=8, hidden_size=2048, ffn_hidden_size=6144, num_heads=32,
                num_kv_heads=4, head_dim=128, vocab_size=32000, num_experts=128, top_k=8,
                moe_ffn_hidden_size=768)
DENSE = ModelSpec(name="dense-test", num_layers=8, hidden_size=2048, ffn_hidden_size=6144, num_heads=32,
                  num_kv_heads=4, head_dim=128, vocab_size=32000)
WL = Workload(global_batch_size=64, seq_len=4096, precision=Precision.BF16, moe_imbalance=1.0)


def _cluster(n=16):
    return load_cluster("dgx-h100", num_gpus=n)


def _plan(**kw):
    base = dict(tp=1, pp=1, dp=16, ep=16, micro_batch_size=1, zero=ZeroStage.OPTIMIZER)
    base.update(kw)
    return make_plan(**base)


def test_expert_parallel_rules_give_reasons():
    c = _cluster()
    assert "must divide the 128 routed experts" in check_plan(_plan(ep=12, dp=12), MOE,
                                                              load_cluster("dgx-h100", num_gpus=12), WL).reason
    assert "EP×ETP" in check_plan(_plan(ep=16, etp=2), MOE, c, WL).reason
    assert "needs sequence parallelism" in check_plan(_plan(tp=2, dp=8, ep=8), MOE, c, WL).reason
    assert "interleaved" in check_plan(_plan(pp=2, dp=8, ep=8, ep_overlap=True), MOE, c, WL).reason
    assert "is dense" in check_plan(_plan(), DENSE, c, WL).reason
    assert check_plan(_plan(), MOE, c, WL) is None


def test_ep_overlap_refuses_block_recomputation_as_megatron_core_does():
    c = _cluster()
    for rc, kw in ((Recompute.FULL, {}), (Recompute.FIRST_K, {"recompute_num_layers": 2})):
        rej = check_plan(_plan(ep_overlap=True, recompute=rc, **kw), MOE, c, WL)
        assert rej is not None and "cannot run with" in rej.reason and rc.value in rej.reason
        assert check_plan(_plan(ep_overlap=False, recompute=rc, **kw), MOE, c, WL) is None
    for rc in (Recompute.NONE, Recompute.SELECTIVE, Recompute.MODULES):
        assert check_plan(_plan(ep_overlap=True, recompute=rc), MOE, c, WL) is None
    # the search never pairs them
    lim = SpaceLimits(recomputes=(Recompute.FULL, Recompute.FIRST_K), max_micro_batch=1)
    chunks = [b for b, _ in enumerate_space(MOE, c, WL, lim, fixed={"pp": 1})]
    assert sum(len(b) for b in chunks) > 0 and not any(bool(b.ep_overlap.any()) for b in chunks)
    lim = replace(lim, recomputes=(Recompute.NONE,))
    assert any(bool(b.ep_overlap.any()) for b, _ in enumerate_space(MOE, c, WL, lim, fixed={"pp": 1}))


def _routed_units(E, k, G, M, U, rng, n=20000):
    """Monte Carlo of a token's distinct units (U blocks of E/U consecutive experts) under
    DeepSeek's gate with iid scores (balanced routing): the G groups scored by the sum of their
    top k/M scores, the best M kept, then the top k experts among theirs (G = M = 1: plain top-k)."""
    s = rng.random((n, E))
    if G > 1:
        score = np.sort(s.reshape(n, G, E // G), axis=2)[:, :, -(k // M):].sum(axis=2)
        keep = np.zeros((n, G), bool)
        np.put_along_axis(keep, np.argsort(-score, axis=1)[:, :M], True, axis=1)
        s = np.where(np.repeat(keep, E // G, axis=1), s, -1.0)
    units = np.argsort(-s, axis=1)[:, :k] // (E // U)
    return float(np.mean([len(set(row)) for row in units]))


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2", "qwen3-30b-a3b", "gpt-oss-120b", "mixtral-8x7b"])
def test_distinct_units_a_token_reaches_match_a_simulated_gate(name):
    """units_hit against the gate itself: within 1% without a group limit; where a unit holds
    whole groups, within 2% above (a chosen group now and then holds none of the k); inside a
    group (DeepSeek-V3 at 16 to 64 ranks) the gate spreads a token over its groups more evenly
    than the uniform pool the formula draws from: within 8% below."""
    model, rng = load_model(name), np.random.default_rng(0)
    for U in (2, 4, 8, 16, 32, 64):
        if model.num_experts % U:
            continue
        simulated = _routed_units(model.num_experts, model.top_k, model.expert_groups or 1,
                                  model.group_top_k or 1, U, rng)
        hit = float(units_hit(model, U))
        if not model.group_limited:
            assert hit == pytest.approx(simulated, rel=0.01)
        elif U <= model.expert_groups:  # each chosen group taken to hold one of the k: an upper bound
            assert simulated <= hit <= 1.02 * simulated
        else:
            assert 0.92 * simulated <= hit <= simulated


def test_node_limited_routing_sends_a_deepseek_v3_token_to_four_nodes():
    """DeepSeek-V3 report Sec. 2.1.2 / 3.2.2: its 256 experts on 8 nodes (EP 64), each token to at
    most 4 nodes: the deduplicated dispatch moves half the flat all-to-all's network bytes (8
    copies, 7/8 of them remote, against 4 nodes, 7/8 remote), so at a network-bound size it takes
    about half the time; without the group limit a token reaches 8·(1 − C(224, 8)/C(256, 8)) = 5.29."""
    v3 = load_model("deepseek-v3")
    assert float(units_hit(v3, 8)) == pytest.approx(4.0)
    free = 8 * (1 - math.comb(224, 8) / math.comb(256, 8))  # = 5.29
    assert float(units_hit(replace(v3, expert_groups=0, group_top_k=0), 8)) == pytest.approx(free)
    c = load_cluster("dgx-h100", num_gpus=64)
    row = 4096 * 7168 * 2.0  # a micro-batch of 4,096 tokens, bf16
    flat = float(collective_time_s(c, Collective.ALL_TO_ALL, row * v3.top_k, 64, 1))
    dedup = float(deduplicated_dispatch_s(c, row, units_hit(v3, 8), units_hit(v3, 64), 64, 1))
    # half the bytes, in larger messages (one per node, not per GPU) the network runs more
    # efficiently: the network's efficiency at each message size accounts for the rest
    eff = c.scaleout.efficiency
    ratio = 0.5 * eff.at(row * v3.top_k / 64) / eff.at(row * 4 / 8)
    assert dedup == pytest.approx(ratio * flat, rel=0.02)
    assert dedup < 0.5 * flat


def test_deduplicated_dispatch_is_the_flat_all_to_all_where_nothing_repeats():
    """Top-1 routing sends one copy a token either way: the same network bytes (the NVLink
    forwarding of the RDMA arrivals runs beside them). Inside one node with one expert per GPU
    (Mixtral at EP 8) the two move the same NVLink bytes."""
    c = load_cluster("dgx-h100", num_gpus=64)
    top1 = ModelSpec(name="top1", num_layers=2, hidden_size=4096, ffn_hidden_size=8192, num_heads=32,
                     num_kv_heads=8, head_dim=128, vocab_size=32000, num_experts=64, top_k=1,
                     moe_ffn_hidden_size=4096)
    row = 1e9
    flat = float(collective_time_s(c, Collective.ALL_TO_ALL, row, 64, 1))
    dedup = float(deduplicated_dispatch_s(c, row, units_hit(top1, 8), units_hit(top1, 64), 64, 1))
    eff = c.scaleout.efficiency  # one message per node, not per GPU
    assert dedup == pytest.approx(flat * eff.at(row / 64) / eff.at(row / 8), rel=0.02)
    mixtral = load_model("mixtral-8x7b")
    flat8 = float(collective_time_s(c, Collective.ALL_TO_ALL, row * 2, 8, 1))
    dedup8 = float(deduplicated_dispatch_s(c, row, units_hit(mixtral, 1), units_hit(mixtral, 8), 8, 1))
    assert dedup8 == pytest.approx(flat8, rel=0.02)


def test_deduplicated_dispatch_is_refused_with_capacity_padding_and_expert_tp():
    c = _cluster(64)
    base = dict(tp=2, pp=1, dp=32, ep=16, micro_batch_size=1, sequence_parallel=True, a2a_hierarchical=True)
    assert check_plan(make_plan(**base), MOE, c, WL) is None
    assert "capacity factor 1.25" in check_plan(make_plan(**base, capacity_factor=1.25), MOE, c, WL).reason
    assert "ETP=2" in check_plan(make_plan(**base, etp=2), MOE, c, WL).reason


def test_ep_overlap_hides_all_to_all_and_is_never_slower():
    c = _cluster()
    plain = estimate(MOE, c, WL, _plan())
    over = estimate(MOE, c, WL, _plan(ep_overlap=True))
    assert plain.time.ep_comm_s > 0
    assert over.time.ep_comm_s < plain.time.ep_comm_s
    assert over.overlapped.ep_comm_s > 0
    assert over.step_time_s < plain.step_time_s


def test_load_imbalance_slows_experts_and_capacity_factor_one_matches_balance():
    c = _cluster()
    balanced = estimate(MOE, c, WL, _plan())
    skewed = estimate(MOE, c, replace(WL, moe_imbalance=1.5), _plan())
    assert skewed.step_time_s > balanced.step_time_s
    assert skewed.memory.activations_bytes > balanced.memory.activations_bytes
    assert skewed.layer_detail["fwd"]["MoE load imbalance (in experts)"] > 0
    # token dropping padded to capacity 1.0 computes exactly the balanced load, and exchanges
    # no token counts before its dispatch (a dropless one does: a few µs per layer)
    dropped = estimate(MOE, c, replace(WL, moe_imbalance=1.5), _plan(capacity_factor=1.0))
    assert dropped.step_time_s == pytest.approx(balanced.step_time_s, rel=2e-3)
    assert dropped.step_time_s < balanced.step_time_s
    assert check_plan(_plan(capacity_factor=0.8), MOE, c, WL).reason.startswith("capacity factor 0.8")
    # past E/k = 16 every expert holds every token: refused (1e300 gave NaN times before)
    assert "to 16 (E/top_k" in check_plan(_plan(capacity_factor=1e300), MOE, c, WL).reason
    assert check_plan(_plan(capacity_factor=16.0), MOE, c, WL) is None


def test_more_expert_parallelism_shards_expert_states():
    c = _cluster()
    small = estimate(MOE, c, WL, _plan(ep=2))
    large = estimate(MOE, c, WL, _plan(ep=16))
    assert large.memory.weights_bytes < small.memory.weights_bytes
    assert large.memory.optimizer_bytes == pytest.approx(small.memory.optimizer_bytes, rel=0.05)


def test_mfu_flops_count_active_experts_only():
    """6·N_active per token (plus attention): Kaplan et al. 2020 C ≈ 6N with N the active
    parameters of an MoE (Fedus et al. 2022)."""
    s = 4096
    attn = 3.0 * MOE.num_layers * layer_forward_flops(MOE, 1.0, s, causal=False).attn_core
    dense_equiv = 6.0 * (MOE.num_active_params - MOE.embedding_params)
    # norms and the router are counted in N but are not GEMM FLOPs in the per-op count
    assert model_flops_per_token(MOE, s) - attn == pytest.approx(dense_equiv, rel=0.01)
    assert MOE.num_active_params < MOE.num_params / 5


def test_search_covers_moe_axes():
    c = _cluster()
    seen = set()
    for batch, _ in enumerate_space(MOE, c, WL, SpaceLimits(schedules=(Schedule.ONE_F_ONE_B,),
                                                            recomputes=(Recompute.NONE,))):
        seen |= {(int(e * x), bool(h), bool(o))
                 for e, x, h, o in zip(batch.ep, batch.etp, batch.a2a_hierarchical, batch.ep_overlap)}
    assert {e for e, _, _ in seen} >= {1, 2, 4, 8, 16}
    assert (16, True, True) in seen  # both dispatches, at any EP > 1 (ETP 1)
    assert (8, True, False) in seen and not any(h for e, h, _ in seen if e == 1)


def test_cli_estimate_shows_all_to_all(capsys):
    rc = main(["estimate", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16", "--seq", "4096",
               "--batch", "64", "--ep", "16", "--zero", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "EP all-to-all (exposed)" in out and "EP16" in out


def test_cli_rejects_ep_on_dense_model(capsys):
    rc = main(["estimate", "--model", "llama3-8b", "--gpus", "8", "--ep", "8", "--batch", "8", "--seq", "2048"])
    err = capsys.readouterr().err
    assert rc == 2 and "is dense" in err and "Traceback" not in err


def test_module_recomputation_between_none_and_full_for_mla_moe():
    # DeepSeek-V3 on 1,024 H100 (the published Megatron-Bridge layout): recomputing the
    # separate norms, the expert activation and the MLA up-projections keeps far less than
    # no recomputation and far more than full, and costs a fraction of full's recompute
    from paraplan.specs.catalog import load_model
    model, cluster = load_model("deepseek-v3"), load_cluster("dgx-h100", num_gpus=1024)
    wl = Workload(global_batch_size=8192, seq_len=4096, precision=Precision.FP8, moe_imbalance=1.0)
    base = make_plan(tp=2, pp=8, dp=64, ep=64, vp=4, micro_batch_size=1, schedule=Schedule.INTERLEAVED_1F1B,
                     sequence_parallel=True, zero=ZeroStage.OPTIMIZER)
    est = {rc: estimate(model, cluster, wl, replace(base, recompute=rc))
           for rc in (Recompute.NONE, Recompute.MODULES, Recompute.FULL)}
    acts = {rc: e.memory.activations_bytes for rc, e in est.items()}
    assert acts[Recompute.FULL] < acts[Recompute.MODULES] < 0.8 * acts[Recompute.NONE]
    rcs = {rc: e.time.recompute_s for rc, e in est.items()}
    assert 0 < rcs[Recompute.MODULES] < 0.25 * rcs[Recompute.FULL]
    # the re-run FLOPs are the up-projections' (DeepSeek-V2 Sec. 2.1: W_UQ, W_UK, W_UV) on
    # every token of every layer of the stage, per micro-batch: 2·T·params/t; and of the MTP
    # module's block, on one of the 8 stages (per GPU, an eighth)
    def hw_flops(e):
        return e.hfu * e.step_time_s * cluster.gpu.peak(Precision.FP8)
    m = wl.global_batch_size // 64
    layers = -(-model.num_layers // 32) * 4 + model.mtp_layers / 8
    extra = m * layers * 2.0 * 4096 * model.mla_up_proj_params / 2
    assert hw_flops(est[Recompute.MODULES]) - hw_flops(est[Recompute.NONE]) == pytest.approx(extra, rel=1e-6)
    assert model.mla_up_proj_params == 1536 * 128 * 192 + 512 * 128 * (128 + 128)


def test_module_recomputation_drops_norm_and_expert_activation_outputs():
    # per MoE layer and token: the pre-MLP norm's output (2h bytes; Megatron runs it as a
    # separate module before the router) and, per routed copy, the activation output (f_e
    # elements); attention's norm is fused into the QKV GEMM by Transformer Engine: kept
    c = _cluster()
    base = _plan()
    none = estimate(MOE, c, WL, replace(base, recompute=Recompute.NONE))
    mod = estimate(MOE, c, WL, replace(base, recompute=Recompute.MODULES))
    tokens = WL.seq_len  # micro-batch 1, TP 1, every layer MoE
    per_layer = (none.memory.activations_bytes - mod.memory.activations_bytes) / MOE.num_layers
    assert per_layer == pytest.approx(tokens * (2 * MOE.hidden_size + MOE.top_k * 2 * MOE.moe_ffn_hidden_size),
                                      rel=1e-9)
    # a dense model without MLA has nothing Megatron would recompute: refused with a reason
    from paraplan.plan.space import check_plan
    rej = check_plan(replace(base, ep=1, recompute=Recompute.MODULES), DENSE, c, WL)
    assert rej is not None and "MoE or MLA" in rej.reason


def test_ep_overlap_hides_each_all_to_all_only_behind_its_partner_block():
    # Megatron-Core's merged forward/backward layer (DeepSeek-V3 Sec. 3.2.1): the backward
    # combine runs under the forward attention block alone, so what exceeds that block stays
    # exposed even when the whole layer's compute would cover every all-to-all
    c = _cluster()
    plain = estimate(MOE, c, WL, _plan())
    over = estimate(MOE, c, WL, _plan(ep_overlap=True))
    fwd, bwd = plain.layer_detail["fwd"], plain.layer_detail["bwd"]
    attn_fwd = fwd["QKV GEMM"] + fwd["attention"] + fwd["out-proj GEMM"] + fwd["element-wise"]
    combine_bwd = bwd["EP all-to-all"] / 2  # dispatch and combine move the same tokens
    layer_compute = sum(v for k, v in fwd.items() if k != "EP all-to-all") + sum(
        v for k, v in bwd.items() if k != "EP all-to-all")
    assert combine_bwd > attn_fwd
    assert fwd["EP all-to-all"] + bwd["EP all-to-all"] < layer_compute  # a whole-layer window would hide all
    floor = over.num_microbatches * MOE.num_layers * (combine_bwd - attn_fwd)
    assert over.time.ep_comm_s >= floor * (1 - 1e-9) > 0


def test_imbalance_needs_expert_parallelism():
    # with every expert on the rank (EP = 1) a dropless layer runs exactly its own copies
    c = _cluster()
    one = _plan(ep=1)
    assert (estimate(MOE, c, replace(WL, moe_imbalance=1.5), one).step_time_s
            == pytest.approx(estimate(MOE, c, WL, one).step_time_s))
    assert estimate(MOE, c, replace(WL, moe_imbalance=1.5), _plan(ep=2)).step_time_s > estimate(
        MOE, c, WL, _plan(ep=2)).step_time_s


def test_hsdp_shards_experts_within_a_replica():
    # ZeRO-3 with 8-rank shard groups over DP 16: dense states over 8 ranks, the experts'
    # over EDP/R = (16/2)/2 = 4 ranks, not over the whole EDP of 8
    c = _cluster()
    full = estimate(MOE, c, WL, _plan(ep=2, zero=ZeroStage.PARAMETERS))
    hsdp = estimate(MOE, c, WL, _plan(ep=2, zero=ZeroStage.PARAMETERS, dp_shard=8))
    e_params = MOE.expert_params / 2  # this rank's EP shard
    dense = MOE.layer_params - MOE.expert_params + MOE.embedding_params + MOE.lm_head_params + MOE.hidden_size
    assert hsdp.memory.optimizer_bytes == pytest.approx(12 * (dense / 8 + e_params / 4), rel=0.02)
    assert full.memory.optimizer_bytes == pytest.approx(12 * (dense / 16 + e_params / 8), rel=0.02)
    # the experts must shard within a replica: EP 16 does not divide an 8-rank shard group
    rej = check_plan(_plan(ep=16, zero=ZeroStage.PARAMETERS, dp_shard=8), MOE, c, WL)
    assert rej is not None and "under HSDP" in rej.reason


def test_shared_experts_hide_the_all_to_all_only_on_megatron():
    shared = replace(MOE, shared_expert_ffn_hidden_size=2048)
    c = _cluster()
    fused = estimate(shared, c, WL, _plan())
    eager = estimate(shared, c, WL, _plan(fused_kernels=False))
    assert fused.time.ep_comm_s < eager.time.ep_comm_s
    from paraplan.export.megatron import arguments
    assert "--moe-shared-expert-overlap" in " ".join(map(str, arguments(_plan(), shared, WL)))
    assert "--moe-shared-expert-overlap" not in " ".join(map(str, arguments(_plan(), MOE, WL)))


def test_expert_gradients_reduce_with_one_data_parallel_rank():
    # TP8 EP2 on 8 GPUs: DP = 1, but each expert shard replicates over EDP = 8/2 = 4 ranks
    c = _cluster(8)
    wl = replace(WL, global_batch_size=8)
    est = estimate(MOE, c, wl, _plan(tp=8, dp=1, ep=2, sequence_parallel=True, zero=ZeroStage.OPTIMIZER))
    assert est.time.dp_comm_s > 0


def test_shared_expert_overlap_needs_an_all_to_all():
    # EP 1 with expert TP: no dispatch to hide behind, no flag exported, nothing hidden
    from paraplan.cost.moe import shared_expert_overlap
    from paraplan.export.megatron import arguments
    shared = replace(MOE, shared_expert_ffn_hidden_size=2048)
    c = _cluster()
    plan = _plan(tp=2, dp=8, ep=1, etp=2, sequence_parallel=True)
    assert not shared_expert_overlap(shared, plan)
    assert "--moe-shared-expert-overlap" not in " ".join(map(str, arguments(plan, shared, WL)))
    assert estimate(shared, c, WL, plan).time.ep_comm_s == pytest.approx(
        estimate(shared, c, WL, replace(plan, fused_kernels=False)).time.ep_comm_s, rel=0.02)


def _with_dispatch_host(c, host_s):
    return replace(c, gpu=replace(c.gpu, moe_dispatch_host_s=host_s))


def test_dropless_dispatch_sync_bounds_a_moe_layer_by_its_host_time():
    """Megatron-Core blocks its host on the token counts at every dropless dispatch: a MoE
    layer lasts at least its host time, whatever the GPU; padding to capacity never syncs."""
    c0 = _with_dispatch_host(_cluster(), 0.0)
    base = estimate(MOE, c0, WL, _plan())
    layer_fwd = base.layer_detail["fwd"]
    assert sum(layer_fwd.values()) > 0
    # a host faster than the GPU's layer: no wait
    fast = estimate(MOE, _with_dispatch_host(_cluster(), 1e-6), WL, _plan())
    assert fast.step_time_s == pytest.approx(base.step_time_s)
    # a slow host: the step grows, by less than the host time of every MoE layer's passes
    # (the GPU's own time is inside the bound), and the wait is reported as the host's
    slow_c = _with_dispatch_host(_cluster(), 0.05)
    slow = estimate(MOE, slow_c, WL, _plan())
    m, layers = base.num_microbatches, MOE.num_layers
    assert slow.step_time_s > base.step_time_s
    assert slow.step_time_s - base.step_time_s < m * layers * 3 * 0.05
    assert slow.step_time_s > m * layers * 3 * 0.05  # forward h + backward 2h per layer, at least
    assert slow.time.host_wait_s > 0
    # capacity-padded routing sizes every buffer ahead: no synchronization, no wait
    padded0 = estimate(MOE, c0, WL, _plan(capacity_factor=1.0))
    padded = estimate(MOE, slow_c, WL, _plan(capacity_factor=1.0))
    assert padded.step_time_s == pytest.approx(padded0.step_time_s)
    # an eager engine's MoE is priced by its own host queue (eager_layer_host_s), not this bound
    eager0 = estimate(MOE, c0, WL, _plan(fused_kernels=False))
    eager = estimate(MOE, slow_c, WL, _plan(fused_kernels=False))
    assert eager.step_time_s == pytest.approx(eager0.step_time_s)


def test_dispatch_host_bound_shrinks_with_the_micro_batch():
    """The host time per layer is fixed, the GPU's grows with the tokens: per token, a larger
    micro-batch waits less (why NVIDIA's small-expert recipes run several sequences)."""
    c = _with_dispatch_host(_cluster(), 0.008)  # over the 5.8 ms GPU forward of one sequence's layer
    c0 = _with_dispatch_host(_cluster(), 0.0)

    def slowdown(mb):
        plan = _plan(micro_batch_size=mb)
        return estimate(MOE, c, WL, plan).step_time_s / estimate(MOE, c0, WL, plan).step_time_s
    assert slowdown(1) > slowdown(4) >= 1.0
    assert slowdown(1) > 1.0


def _layer(plan, wl=WL, model=MOE, n=16):
    from paraplan.cost.moe import moe_layer_costs
    return moe_layer_costs(model, _cluster(n), wl, plan, wl.seq_len * plan.micro_batch_size, plan.tp,
                           wl.precision)


def test_received_copies_are_sorted_by_local_expert_where_a_rank_holds_several():
    """Megatron-Core sorts the received copies by local expert after the dispatch and back
    before the combine whenever a rank holds more than one expert (token_dispatcher.py
    dispatch_postprocess / combine_preprocess); torchtitan under any expert parallelism. One
    copy pass each way over the received rows, at the copy rate."""
    from paraplan.cost.moe import SORT_KERNELS, permutation_pass_bytes
    from paraplan.cost.roofline import memory_bound_time_s
    c = _cluster()
    T = WL.seq_len
    one_pass = memory_bound_time_s(c.gpu, permutation_pass_bytes(T * MOE.top_k, MOE.hidden_size, 2.0), SORT_KERNELS)
    assert float(_layer(_plan()).sort_s) == pytest.approx(2.0 * float(one_pass))        # 8 local experts
    assert float(_layer(_plan(ep=1, dp=16)).sort_s) == pytest.approx(2.0 * float(one_pass))  # Megatron at EP 1
    assert float(_layer(_plan(ep=1, dp=16, fused_kernels=False)).sort_s) == 0.0          # torchtitan without EP
    one_expert = replace(MOE, num_experts=16)
    assert float(_layer(_plan(), model=one_expert).sort_s) == 0.0                        # one local expert
    assert float(_layer(_plan(fused_kernels=False), model=one_expert).sort_s) > 0.0      # torchtitan under EP
    # the sort runs on the busiest rank's received copies (λ), the rank's own permutation on its
    # T·k (every rank routes as many)
    skewed = replace(WL, moe_imbalance=1.5)
    assert float(_layer(_plan(), wl=skewed).sort_s) == pytest.approx(
        2.0 * float(memory_bound_time_s(c.gpu, permutation_pass_bytes(1.5 * T * MOE.top_k, MOE.hidden_size, 2.0),
                                        SORT_KERNELS)))


def test_megatron_sends_router_probabilities_and_exchanges_token_counts():
    """Megatron-Core's dispatch sends each copy's probability in an all-to-all of its own
    (forward and backward), and every engine exchanges the per-expert token counts before the
    dispatch (forward only): the difference between the fused and eager engines' exchange is
    the probabilities' all-to-all."""
    from paraplan.cost.moe import COUNT_BYTES, PROB_BYTES
    c = _cluster()
    fused, eager = _layer(_plan()), _layer(_plan(fused_kernels=False))
    probs = collective_time_s(c, Collective.ALL_TO_ALL, PROB_BYTES * WL.seq_len * MOE.top_k, 16, 1)
    counts = collective_time_s(c, Collective.ALL_GATHER, COUNT_BYTES * MOE.num_experts, 16, 1)
    assert float(fused.a2a_fwd_s - eager.a2a_fwd_s) == pytest.approx(float(probs))
    assert float(fused.a2a_bwd_s - eager.a2a_bwd_s) == pytest.approx(float(probs))
    assert float(eager.a2a_fwd_s - eager.a2a_bwd_s) == pytest.approx(float(counts))


def test_megatron_keeps_no_expert_output_for_the_combine():
    """Megatron-Core 0.16.1 weights the copies inside the experts' activation and unpermutes
    them without probabilities, so its combine keeps no expert output; torchtitan's eager MoE
    multiplies the rank's own copies by their scores in fp32, and the product keeps its fp32
    input: 4 bytes per element of T·k rows of h, whatever the load factor."""
    from paraplan.cost.moe import moe_activation_bytes
    skewed = replace(WL, moe_imbalance=1.5)
    fused, _ = moe_activation_bytes(MOE, skewed, _plan(), WL.seq_len, 1, Precision.BF16)
    eager, _ = moe_activation_bytes(MOE, skewed, _plan(fused_kernels=False), WL.seq_len, 1, Precision.BF16)
    assert float(eager - fused) == pytest.approx(4.0 * WL.seq_len * MOE.top_k * MOE.hidden_size)
