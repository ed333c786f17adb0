"""Serving with sliding-window attention: what a windowed layer keeps and reads."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.errors import ParaplanError
from paraplan.inference.batching import KV_PAGE_TOKENS, simulate
from paraplan.inference.deploy import EngineLimits, Layout, ServePlan, Traffic
from paraplan.inference.pope import forward_pass, max_context_tokens
from paraplan.inference.planner import estimate_plan, max_sequences
from paraplan.inference.step import AttentionWindow, IterationModel, serve_memory
from paraplan.specs.catalog import load_cluster, load_model


def _brute_pairs(done: int, chunk: int, w: int | None) -> float:
    """Keys the queries at positions done+1 .. done+chunk see (w None: full causal)."""
    return float(sum(i if w is None else min(i, w) for i in range(done + 1, done + chunk + 1)))


@pytest.mark.parametrize("done,chunk", [(0, 4000), (0, 100), (50, 200), (3000, 1000), (100, 5000)])
def test_prefill_pairs_count_the_keys_each_query_sees(done, chunk):
    w = 512
    win = AttentionWindow(window=w, share=1.0)
    # the continuous form c·(d + c/2) is the exact count less c/2, windowed or not
    assert win.prefill_pairs(done, chunk) == pytest.approx(_brute_pairs(done, chunk, w) - chunk / 2, rel=2e-3, abs=chunk)
    half = AttentionWindow(window=w, share=0.5)
    expect = 0.5 * _brute_pairs(done, chunk, None) + 0.5 * _brute_pairs(done, chunk, w)
    assert half.prefill_pairs(done, chunk) == pytest.approx(expect, rel=2e-3, abs=chunk)


def test_held_tokens_and_its_inverse():
    win = AttentionWindow(window=128, share=0.5)
    assert win.held(1280) == pytest.approx(0.5 * 1280 + 0.5 * 128)
    assert win.held(100) == 100
    for c in (50, 128, 129, 4096, 100_000):
        assert win.max_context(win.held(c)) == pytest.approx(c)
    assert AttentionWindow().held(777) == 777
    assert AttentionWindow(window=4096, share=1.0).max_context(10_000) == float("inf")


class _Recorder:
    """An IterationModel stand-in that records what each iteration asks for."""

    def __init__(self, model):
        self.model = model
        self.calls = []

    def time_s(self, prefill_tokens, prefill_pairs, decode_seqs, decode_ctx_tokens, logit_rows, **chunks):
        # a run of decode-only iterations comes as one array of reads (IterationModel.time_s)
        reads = np.atleast_1d(decode_ctx_tokens)
        self.calls += [(prefill_tokens, prefill_pairs, decode_seqs, float(r)) for r in reads]
        return 1e-3 if np.ndim(decode_ctx_tokens) == 0 else np.full(reads.shape, 1e-3)


@pytest.mark.parametrize("window", [200, 1100, 1300, 5000])
def test_decode_reads_a_windowed_layer_only_within_its_window(window):
    """One request at a time (closed loop of one): the j-th decode iteration generates
    token isl + 1 + j, which attends to isl + 1 + j keys on full layers and min(·, w) on
    windowed ones. Windows below the
    prompt, reached mid-decode, reached at the last token and never reached."""
    model = replace(load_model("llama3-8b"), sliding_window=window, num_sliding_window_layers=16)
    isl, osl = 1024, 277
    rec = _Recorder(model)
    simulate(rec, Traffic(prompt_tokens=isl, output_tokens=osl, concurrency=1, num_requests=3),
             EngineLimits(sliding_window_kv=True), 10**9)
    decodes = [c for c in rec.calls if c[2] == 1]
    assert len(decodes) == 3 * (osl - 1)
    for n, call in enumerate(decodes):
        j = n % (osl - 1) + 1  # the j-th decoded token after the first
        ctx = isl + 1 + j
        assert call[3] == pytest.approx(0.5 * ctx + 0.5 * min(ctx, window)), (n, call)


def test_decode_reads_match_a_brute_force_sum_under_load():
    """Many sequences at different points of their decode at once."""
    window = 1100
    model = replace(load_model("llama3-8b"), sliding_window=window, num_sliding_window_layers=32)
    isl, osl = 1000, 300
    rec = _Recorder(model)
    # staggered starts: a prompt of 1000 with 2500 tokens an iteration admits two at a time
    simulate(rec, Traffic(prompt_tokens=isl, output_tokens=osl, num_requests=40),
             EngineLimits(sliding_window_kv=True, max_batch=16, max_num_tokens=2500), 10**9)
    full = _Recorder(replace(model, sliding_window=0, num_sliding_window_layers=0))
    simulate(full, Traffic(prompt_tokens=isl, output_tokens=osl, num_requests=40),
             EngineLimits(max_batch=16, max_num_tokens=2500), 10**9)
    # same schedule (the recorder's iteration time does not depend on the reads)
    assert [c[2] for c in rec.calls] == [c[2] for c in full.calls]
    # rebuild every decoding sequence's context: each one holds isl + 1 tokens when it starts
    # decoding and grows by one per iteration; the token it generates attends to context + 1
    # and leaves after osl − 1 iterations
    live: list[list[int]] = []   # [context, iterations left]
    for (_, _, d, read_w), (_, _, _, read_f) in zip(rec.calls, full.calls):
        live += [[isl + 1, osl - 1] for _ in range(d - len(live))]
        assert len(live) == d
        assert read_f == pytest.approx(sum(c + 1 for c, _ in live)), "reconstruction"
        assert read_w == pytest.approx(sum(min(c + 1, window) for c, _ in live))
        live = [[c + 1, n - 1] for c, n in live if n > 1]


def test_windows_let_more_sequences_share_the_kv_cache():
    model = load_model("gpt-oss-120b")
    cluster = load_cluster("dgx-h100", num_gpus=8)
    plan = ServePlan(tp=4, pp=1, ep=4)
    traffic = Traffic(prompt_tokens=8192, output_tokens=1024)
    on, off = EngineLimits(sliding_window_kv=True), EngineLimits()
    mem = serve_memory(model, cluster, plan, on)
    # half of GPT-OSS's layers keep 128 tokens: a 9,216-token request keeps about half as much
    keep = AttentionWindow.of(model, honoured=True).held(traffic.context_tokens)
    assert keep == pytest.approx(0.5 * 9216 + 0.5 * 128)
    assert max_sequences(model, mem, traffic, on) == int(mem.kv_capacity_tokens // keep)
    assert max_sequences(model, mem, traffic, on) > 1.9 * max_sequences(model, mem, traffic, off)
    fast = estimate_plan(model, cluster, plan, traffic, on)
    slow = estimate_plan(model, cluster, plan, traffic, off)
    assert fast.max_tokens_per_s_per_gpu > slow.max_tokens_per_s_per_gpu


def test_an_engine_without_windows_runs_full_attention():
    """TensorRT-LLM's default (no max_attention_window_size): the windowed model is served
    exactly like the same model without windows."""
    model = load_model("mistral-7b")
    cluster = load_cluster("dgx-h100", num_gpus=1)
    plan = ServePlan(tp=1, pp=1)
    traffic = Traffic(prompt_tokens=20000, output_tokens=200, num_requests=16)
    mem = serve_memory(model, cluster, plan, EngineLimits())
    plain = replace(model, sliding_window=0, num_sliding_window_layers=0)
    a = simulate(IterationModel(model, cluster, plan), traffic, EngineLimits(), mem.kv_capacity_tokens)
    b = simulate(IterationModel(plain, cluster, plan), traffic, EngineLimits(), mem.kv_capacity_tokens)
    assert a.makespan_s == b.makespan_s
    c = simulate(IterationModel(model, cluster, plan), traffic, EngineLimits(sliding_window_kv=True),
                 mem.kv_capacity_tokens)
    assert c.makespan_s < 0.8 * a.makespan_s  # 20k-token contexts read 4,096 tokens a layer


def test_a_request_needs_whole_pages_per_layer_group():
    # full layers: 1,000 tokens in 16 pages of 64; a 130-token window that does not start on
    # a page boundary spans up to ceil(129/64) + 1 = 4 pages
    win = AttentionWindow(window=130, share=0.25)
    assert win.held_paged(1000, KV_PAGE_TOKENS) == pytest.approx(0.75 * 1024 + 0.25 * 256)
    assert win.held_paged(100, KV_PAGE_TOKENS) == pytest.approx(128)  # below the window: as full
    assert win.held_paged(150, KV_PAGE_TOKENS) == pytest.approx(192)  # 3 pages hold all 150 tokens


def test_admission_reserves_the_windowed_kv():
    """The KV cache admits as many requests as their windowed need allows: half the layers
    keep 128 tokens, so a 1,024-token request reserves 0.5·1,024 + 0.5·192 = 608 tokens
    (a 128-token window spans up to 3 pages of 64)."""
    model = replace(load_model("llama3-8b"), sliding_window=128, num_sliding_window_layers=16)
    traffic = Traffic(prompt_tokens=1000, output_tokens=24, num_requests=40)
    capacity = 6100  # 10 windowed requests (6,080 tokens) or 5 full ones (5,120)
    on = simulate(_Recorder(model), traffic, EngineLimits(sliding_window_kv=True), capacity)
    off = simulate(_Recorder(model), traffic, EngineLimits(), capacity)
    assert (on.max_concurrency, off.max_concurrency) == (10, 5)


def test_the_planner_accepts_a_context_only_windows_make_fit():
    model = replace(load_model("llama3-8b"), sliding_window=4096, num_sliding_window_layers=32, max_seq_len=10**7)
    cluster = load_cluster("dgx-h100", num_gpus=1)
    plan = ServePlan(tp=1, pp=1)
    cap = serve_memory(model, cluster, plan, EngineLimits()).kv_capacity_tokens
    traffic = Traffic(prompt_tokens=cap + 1000, output_tokens=2, num_requests=4)
    with pytest.raises(ParaplanError, match="the KV cache holds"):
        estimate_plan(model, cluster, plan, traffic, EngineLimits())
    est = estimate_plan(model, cluster, plan, traffic, EngineLimits(sliding_window_kv=True))
    assert est.max_concurrency >= 1


def test_serve_cli_passes_the_engine_flag(capsys):
    args = ["serve", "--model", "gpt-oss-120b", "--tp", "4", "--ep", "4", "--weights", "fp8", "--kv", "fp8",
            "--prompt", "8192", "--output", "64", "--max-load", "--requests", "64", "--json"]
    out = {}
    for flag in ([], ["--sliding-window-kv"]):
        assert main(args + flag) == 0
        rows = json.loads(capsys.readouterr().out)["ranked"]
        out[bool(flag)] = rows[0]
    assert out[True]["kv_capacity_tokens"] == out[False]["kv_capacity_tokens"]  # the same cache
    # decoding tokens read 128 of the 8,192 cached tokens on half the layers
    assert out[True]["tpot_floor_s"] < out[False]["tpot_floor_s"]
    assert out[True]["max_output_tokens_per_s_per_gpu"] > out[False]["max_output_tokens_per_s_per_gpu"]


def test_pope_static_passes_see_the_windows():
    cluster = load_cluster("dgx-h100", num_gpus=8)
    plan = ServePlan(tp=8)
    full = load_model("llama3-8b")
    half = replace(full, sliding_window=2048, num_sliding_window_layers=16)
    assert max_context_tokens(half, cluster, plan, batch=64) > 1.9 * max_context_tokens(full, cluster, plan, batch=64)
    every = replace(full, sliding_window=2048, num_sliding_window_layers=32)
    with pytest.raises(ParaplanError, match="stops growing"):
        max_context_tokens(every, cluster, plan, batch=64)
    a = forward_pass(full, cluster, n=8, layout=Layout.WS_1D, plan=plan, batch=8, tokens_per_seq=1, context=100_000)
    b = forward_pass(half, cluster, n=8, layout=Layout.WS_1D, plan=plan, batch=8, tokens_per_seq=1, context=100_000)
    assert b.memory_s < 0.6 * a.memory_s  # half the layers read 2,048 of the 100,000 cached tokens


def test_serve_says_how_it_serves_the_windows(capsys):
    args = ["serve", "--model", "gpt-oss-120b", "--tp", "4", "--ep", "4", "--weights", "fp8", "--kv", "fp8",
            "--prompt", "1024", "--output", "16", "--max-load", "--requests", "16"]
    assert main(args) == 0
    assert "18 of 36 layers attend to a 128-token window; served as full attention" in capsys.readouterr().out
    assert main(args + ["--sliding-window-kv"]) == 0
    assert "the engine keeps only that in their KV cache" in capsys.readouterr().out
