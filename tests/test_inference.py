"""Serving model: iteration cost, KV-cache memory, continuous-batching simulation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.errors import ParaplanError, SpecError
from paraplan.inference.batching import simulate
from paraplan.inference.deploy import AttentionSharding, EngineLimits, ServePlan, StoreDtype, Traffic
from paraplan.inference import step as step_module
from paraplan.inference.step import (IterationModel, attention_gemms, kv_share_per_gpu, replicated_params_per_layer,
                                     routed_experts, serve_memory)
from paraplan.specs.catalog import load_cluster, load_model


@pytest.fixture(scope="module")
def h100():
    return load_cluster("dgx-h100")


@pytest.fixture(scope="module")
def llama8b():
    return load_model("llama3.1-8b")


def test_decode_is_memory_bound(llama8b, h100):
    """A batch-1 decode step reads every weight once: its time is bounded below by
    weight bytes / HBM bandwidth and within a few launches of that bound."""
    step = IterationModel(llama8b, h100, ServePlan())
    t = step.time_s(0, 0.0, 1, 1000, 1)
    weight_bytes = llama8b.num_params * 2.0
    floor = weight_bytes / h100.gpu.hbm_bw_bytes_per_s
    assert floor < t < 1.6 * floor


def test_decode_step_grows_slowly_with_batch_until_compute_bound(llama8b, h100):
    step = IterationModel(llama8b, h100, ServePlan())
    t1 = step.time_s(0, 0.0, 1, 512, 1)
    t64 = step.time_s(0, 0.0, 64, 64 * 512, 64)
    t4096 = step.time_s(4096, 4096 * 2048.0, 0, 0, 1)
    assert t64 < 1.5 * t1          # memory-bound: 64 sequences for little more than one
    assert t4096 > 5 * t64         # a 4k-token prefill is compute-bound


def test_fp8_weights_halve_decode_time_roughly(llama8b, h100):
    bf16 = IterationModel(llama8b, h100, ServePlan()).time_s(0, 0.0, 8, 8 * 256, 8)
    fp8 = IterationModel(llama8b, h100, ServePlan(weight_dtype=StoreDtype.FP8, kv_dtype=StoreDtype.FP8)).time_s(
        0, 0.0, 8, 8 * 256, 8)
    assert 0.45 < fp8 / bf16 < 0.7


def test_more_hbm_bandwidth_is_never_slower(llama8b, h100):
    fast = replace(h100, gpu=replace(h100.gpu, hbm_bw_bytes_per_s=h100.gpu.hbm_bw_bytes_per_s * 1.5))
    for args in [(0, 0.0, 32, 32 * 1000, 32), (2048, 2048 * 1024.0, 16, 16000, 17)]:
        assert IterationModel(llama8b, fast, ServePlan()).time_s(*args) <= IterationModel(llama8b, h100, ServePlan()).time_s(*args)


def test_kv_capacity_is_what_is_left_after_weights(llama8b, h100):
    lim = EngineLimits()
    mem = serve_memory(llama8b, h100, ServePlan(), lim)
    per_token = 2 * llama8b.num_layers * llama8b.num_kv_heads * llama8b.head_dim * 2.0
    assert mem.kv_bytes_per_token == per_token
    left = h100.gpu.hbm_bytes - mem.weights_bytes - mem.workspace_bytes - mem.reserved_bytes
    assert mem.kv_capacity_tokens == int(left * lim.kv_free_fraction // per_token)
    fp8 = serve_memory(llama8b, h100, ServePlan(kv_dtype=StoreDtype.FP8), lim)
    assert fp8.kv_capacity_tokens == pytest.approx(2 * mem.kv_capacity_tokens, rel=1e-6, abs=2)


def test_kv_sharding_over_heads_replicates_when_tp_exceeds_kv_heads(llama8b):
    # 8 kv heads: tp 8 stores 1/8 each; tp 16 cannot split a head, so each GPU keeps one (1/8)
    assert kv_share_per_gpu(llama8b, ServePlan(tp=8)) == 1 / 8
    assert kv_share_per_gpu(llama8b, ServePlan(tp=16, ep=1)) == 1 / 8
    assert kv_share_per_gpu(llama8b, ServePlan(tp=16, attention_sharding=AttentionSharding.BATCH)) == 1 / 16


def test_simulation_conserves_tokens_and_respects_the_offered_load(llama8b, h100):
    plan = ServePlan()
    lim = EngineLimits()
    mem = serve_memory(llama8b, h100, plan, lim)
    step = IterationModel(llama8b, h100, plan)
    light = simulate(step, Traffic(prompt_tokens=256, output_tokens=64, rate_rps=1.0, num_requests=200), lim,
                     mem.kv_capacity_tokens)
    # far below capacity: the replica keeps up, so it completes about the offered rate
    assert light.requests_per_s == pytest.approx(1.0, rel=0.1)
    assert np.all(light.ttft_s > 0) and np.all(light.tpot_s > 0)
    assert light.output_tokens == 200 * 64
    # e2e = ttft + (n-1) * tpot for every request
    assert np.allclose(light.e2e_s, light.ttft_s + 63 * light.tpot_s)
    # at maximum load the replica batches, so the per-token latency grows but throughput too
    heavy = simulate(step, Traffic(prompt_tokens=256, output_tokens=64, num_requests=2000), lim,
                     mem.kv_capacity_tokens)
    assert heavy.output_tokens_per_s > 20 * light.output_tokens_per_s
    assert heavy.tpot_s.mean() > light.tpot_s.mean()


def test_batch_limit_bounds_concurrency_and_lowers_throughput(llama8b, h100):
    plan = ServePlan()
    mem = serve_memory(llama8b, h100, plan, EngineLimits())
    step = IterationModel(llama8b, h100, plan)
    tr = Traffic(prompt_tokens=128, output_tokens=128, num_requests=1000)
    small = simulate(step, tr, EngineLimits(max_batch=32), mem.kv_capacity_tokens)
    big = simulate(step, tr, EngineLimits(max_batch=512), mem.kv_capacity_tokens)
    assert small.max_concurrency <= 32 < big.max_concurrency
    assert big.output_tokens_per_s > 3 * small.output_tokens_per_s


def test_chunked_prefill_lowers_tpot_under_load(llama8b, h100):
    plan = ServePlan()
    mem = serve_memory(llama8b, h100, plan, EngineLimits())
    step = IterationModel(llama8b, h100, plan)
    tr = Traffic(prompt_tokens=3000, output_tokens=100, rate_rps=20.0, num_requests=300)
    whole = simulate(step, tr, EngineLimits(max_num_tokens=4096), mem.kv_capacity_tokens)
    chunked = simulate(step, tr, EngineLimits(max_num_tokens=512, chunked_prefill=True), mem.kv_capacity_tokens)
    assert np.percentile(chunked.tpot_s, 99) < np.percentile(whole.tpot_s, 99)


def test_request_larger_than_the_kv_cache_is_a_clear_error(llama8b, h100):
    plan = ServePlan()
    step = IterationModel(llama8b, h100, plan)
    with pytest.raises(ParaplanError, match="KV cache"):
        simulate(step, Traffic(prompt_tokens=5000, output_tokens=10, num_requests=2), EngineLimits(), 1000)


@pytest.mark.parametrize("field,value", [("tp", 0), ("replicas", -1)])
def test_bad_deployment_names_the_field(field, value):
    with pytest.raises(SpecError, match=field):
        ServePlan(**{field: value})


def test_bad_traffic_names_the_field():
    with pytest.raises(SpecError, match="rate_rps"):
        Traffic(prompt_tokens=10, output_tokens=10, rate_rps=0.0)
    with pytest.raises(SpecError, match="allowed: bf16"):
        StoreDtype.parse("fp4", "weights")


def test_tp_beyond_the_node_is_rejected(llama8b, h100):
    with pytest.raises(SpecError, match="tp"):
        IterationModel(llama8b, h100, ServePlan(tp=16))


def test_expert_buffering_trades_hbm_for_host_traffic(h100):
    """Huang et al. 2023: experts outside HBM free memory and cost host-link fetches when hit."""
    mix = load_model("mixtral-8x7b")
    lim = EngineLimits()
    full = ServePlan(tp=2)
    half = ServePlan(tp=2, expert_cache_fraction=0.5)
    m_full, m_half = serve_memory(mix, h100, full, lim), serve_memory(mix, h100, half, lim)
    expert_bytes = mix.expert_params / 2 * 2.0
    assert m_full.weights_bytes - m_half.weights_bytes == pytest.approx(0.5 * expert_bytes, rel=1e-6)
    assert m_half.kv_capacity_tokens > m_full.kv_capacity_tokens
    args = (0, 0.0, 16, 16 * 512, 16)
    t_full = IterationModel(mix, h100, full).time_s(*args)
    t_half = IterationModel(mix, h100, half).time_s(*args)
    t_hot = IterationModel(mix, h100, replace(half, expert_hit_rate=1.0)).time_s(*args)
    assert t_half > 3 * t_full            # PCIe is ~50x slower than HBM
    assert t_hot == pytest.approx(t_full)  # every routed expert cached: no host traffic
    with pytest.raises(SpecError, match="expert_hit_rate"):
        ServePlan(expert_cache_fraction=0.5, expert_hit_rate=0.2)


# ---- pipeline parallelism, MoE, MLA, admission --------------------------------------------

def _lone_ttft_s(model, cluster, plan):
    mem = serve_memory(model, cluster, plan, EngineLimits())
    res = simulate(IterationModel(model, cluster, plan), Traffic(prompt_tokens=1024, output_tokens=8, num_requests=1),
                   EngineLimits(), mem.kv_capacity_tokens)
    return float(res.ttft_s[0])


def test_pipeline_does_not_cut_a_lone_requests_latency(h100):
    """One prompt is one sequence: it cannot split into p micro-batches, so it passes the p
    stages in turn (Pope et al. 2022); its TTFT with PP is no less than without (same TP)."""
    m = load_model("llama3-70b")
    fp8 = dict(weight_dtype=StoreDtype.FP8, kv_dtype=StoreDtype.FP8)
    for tp in (1, 2):
        base = _lone_ttft_s(m, h100, ServePlan(tp=tp, **fp8))
        for pp in (2, 4):
            assert _lone_ttft_s(m, h100, ServePlan(tp=tp, pp=pp, **fp8)) >= base


def test_pipeline_splits_a_batch_into_micro_batches_of_whole_sequences(llama8b, h100):
    """4,096 decoding sequences run as 4 micro-batches of 1,024; a 4,096-token prompt is one
    unit, so it passes the 4 stages whole and takes longer (compute-bound)."""
    step = IterationModel(llama8b, h100, ServePlan(pp=4))
    decode = step.time_s(0, 0.0, 4096, 0.0, 4096)
    prompt = step.time_s(4096, 4096 * 2048.0, 0, 0.0, 1)
    assert decode >= 4 * (step._linear(1024) + step.lm_head_s(1024))
    assert prompt >= 4 * step._linear(4096) > decode


def test_pipeline_keeps_the_lm_head_whole_in_the_last_stage(llama8b, h100, monkeypatch):
    """The last stage runs the LM head of every micro-batch that passes it: with a 1-second
    head, two micro-batches of 32 sequences take at least 2 s per iteration."""
    step = IterationModel(llama8b, h100, ServePlan(pp=2))
    monkeypatch.setattr(step, "lm_head_s", lambda rows: 1.0 if rows > 0 else 0.0)
    assert step.time_s(0, 0.0, 64, 64 * 100.0, 64) >= 2.0


def test_expert_parallel_inside_tp_needs_no_all_to_all(h100, monkeypatch):
    """ep divides tp: every GPU holds all tokens, masks the experts it lacks and reduces
    through the layer's all-reduce (vLLM, TensorRT-LLM): no all-to-all is costed."""
    from paraplan.cost.comm import Collective
    mix = load_model("mixtral-8x7b")
    seen = []
    real = step_module.collective_time_s

    def spy(cluster, collective, *args, **kw):
        seen.append(collective)
        return real(cluster, collective, *args, **kw)
    monkeypatch.setattr(step_module, "collective_time_s", spy)
    for ep in (2, 8):
        IterationModel(mix, h100, ServePlan(tp=8, ep=ep)).time_s(4096, 4096 * 2048.0, 0, 0.0, 1)
    assert seen and Collective.ALL_TO_ALL not in seen


@pytest.mark.parametrize("E,k", [(8, 2), (256, 8), (64, 6)])
def test_routed_tokens_are_conserved(E, k):
    """Uniform routing: the active experts share all T·k routed tokens, each at least one."""
    for ep in (1, 4):
        local = E / ep
        for T in (1, 2, 7, 64, 5000):
            active, per = routed_experts(T, E, k, local)
            assert active * per == pytest.approx(local * T * k / E)
            assert 0 < active <= local and per >= 1 - 1e-12
        # one token picks k of E: k/E of the local experts are active, each with that token
        assert routed_experts(1, E, k, local) == pytest.approx((local * k / E, 1.0))
        # two tokens: an expert is idle when both miss it, (1 − k/E)²
        assert routed_experts(2, E, k, local)[0] == pytest.approx(local * (1 - (1 - k / E) ** 2))
        # many tokens: every expert active, T·k/E each
        assert routed_experts(100_000, E, k, local) == pytest.approx((local, 100_000 * k / E))


def test_mla_attention_gemms_are_the_models_projections(h100):
    """MLA's GEMMs are its low-rank projections (DeepSeek-V2 Sec. 2.1.2), not MHA's
    (q + 2·kv)·h: on one GPU they hold ModelSpec.attn_params_per_layer less the two norms;
    on t GPUs the down-projections stay whole and the rest splits."""
    for name in ("deepseek-v3", "llama3-70b"):
        m = load_model(name)
        norms = m.q_lora_rank + m.kv_lora_rank
        assert sum(n * k for n, k in attention_gemms(m, 1)) == m.attn_params_per_layer - norms
        rep = replicated_params_per_layer(m)
        split = (m.attn_params_per_layer - norms - rep) / 8
        assert sum(n * k for n, k in attention_gemms(m, 8)) == pytest.approx(rep + split)
    v3 = load_model("deepseek-v3")
    assert replicated_params_per_layer(v3) == v3.hidden_size * (1536 + 512 + 64)


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_whole(llama8b, h100, monkeypatch):
    """Chunked prefill off, prompt <= max_num_tokens: a prompt longer than the budget the
    decode tokens leave waits for the next iterations instead of being split."""
    plan = ServePlan()
    limits = EngineLimits(max_num_tokens=1024, max_batch=256)
    step = IterationModel(llama8b, h100, plan)
    seen = []
    real = step.time_s

    def spy(P, pairs, D, read, rows, **kw):
        seen.append((P, D))
        return real(P, pairs, D, read, rows, **kw)
    monkeypatch.setattr(step, "time_s", spy)
    mem = serve_memory(llama8b, h100, plan, limits)
    simulate(step, Traffic(prompt_tokens=1000, output_tokens=200, num_requests=100), limits, mem.kv_capacity_tokens)
    assert all(P % 1000 == 0 for P, _ in seen)          # whole prompts only
    assert all(P + D <= 1024 for P, D in seen)
    assert sum(P for P, _ in seen) == 100 * 1000
