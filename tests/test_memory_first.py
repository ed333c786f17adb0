"""The search checks memory before it times a plan: plan_memory (and plan_memory_total, the
search's total alone) must be evaluate's memory."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.cost.evaluate import evaluate, plan_memory, plan_memory_total
from paraplan.cost.memory import fits
from paraplan.plan.space import PlanBatch, SpaceLimits, enumerate_space
from paraplan.search.planner import search
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload


@pytest.mark.parametrize("name,gpus,prec", [("llama3-70b", 64, Precision.BF16), ("qwen3-30b-a3b", 16, Precision.FP8),
                                            ("deepseek-v3", 64, Precision.FP8), ("llama3-8b", 16, Precision.FP32)])
def test_plan_memory_is_evaluates_memory(name, gpus, prec):
    model, cluster = load_model(name), load_cluster("dgx-h100", num_gpus=gpus)
    wl = Workload(global_batch_size=256, seq_len=4096, precision=prec)
    batch = PlanBatch.concat([b for b, _ in enumerate_space(model, cluster, wl, SpaceLimits()) if len(b)])
    rng = np.random.default_rng(1)
    sample = batch.take(np.sort(rng.choice(len(batch), size=min(len(batch), 3000), replace=False)))
    memory, host = plan_memory(model, cluster, wl, sample)
    costs = evaluate(model, cluster, wl, sample)
    for part, value in memory.parts().items():
        np.testing.assert_array_equal(value, costs.memory.parts()[part], err_msg=part)
    np.testing.assert_array_equal(host, costs.host_bytes)
    # the search's total without the breakdown: the same bytes to the bit
    total, total_host = plan_memory_total(model, cluster, wl, sample)
    np.testing.assert_array_equal(total, memory.total)
    np.testing.assert_array_equal(total_host, host)


def test_the_search_counts_and_ranks_what_fits():
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=32)
    wl = Workload(global_batch_size=64, seq_len=8192)
    res = search(model, cluster, wl, top_k=5, resimulate=8)
    batch = PlanBatch.concat([b for b, _ in enumerate_space(model, cluster, wl, SpaceLimits()) if len(b)])
    costs = evaluate(model, cluster, wl, batch)
    ok = fits(cluster, np.asarray(costs.memory.total), costs.host_bytes)
    assert res.num_fit == int(ok.sum()) > 0
    # the fastest plan that fits by the closed form is among those the search re-timed
    best = float(np.min(np.asarray(costs.time.total)[ok]))
    assert min(e.step_time_s for e in res.ranked) <= best * 1.05
    assert all(e.memory.total <= cluster.gpu.hbm_bytes for e in res.ranked)


def test_the_ranking_does_not_depend_on_how_the_space_is_chunked(monkeypatch):
    """Plans tied on time (ZeRO 0/1/2 with offload on one GPU row, TP overlap on or off)
    are kept in enumeration order, whatever the chunk size."""
    import paraplan.search.planner as planner
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=64, seq_len=4096)
    ranked = {}
    for chunk in (planner.CHUNK, 5000, 777):
        monkeypatch.setattr(planner, "CHUNK", chunk)
        res = search(model, cluster, wl, top_k=20, resimulate=32)
        ranked[chunk] = [(e.plan, e.step_time_s) for e in res.ranked]
    first, *others = ranked.values()
    assert all(o == first for o in others)


@pytest.mark.parametrize("name,gpus,prec", [("llama3-70b", 64, Precision.BF16), ("qwen3-30b-a3b", 16, Precision.FP8)])
def test_threads_rank_and_count_as_one_thread_does(monkeypatch, name, gpus, prec):
    """Slices priced on threads are merged in enumeration order: the same plans, times,
    counts and smallest plan as in one thread, with small slices so that many run at once."""
    import paraplan.search.planner as planner
    model, cluster = load_model(name), load_cluster("dgx-h100", num_gpus=gpus)
    wl = Workload(global_batch_size=256, seq_len=4096, precision=prec)
    monkeypatch.setattr(planner, "CHUNK", 20_000)
    out = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("PARAPLAN_THREADS", threads)
        assert planner.search_threads() == int(threads)
        res = search(model, cluster, wl, top_k=16, resimulate=16)
        out[threads] = ([(e.plan, e.step_time_s, e.memory.total) for e in res.ranked],
                        (res.num_candidates, res.num_valid, res.num_fit))
    assert out["1"] == out["3"]
    assert out["1"][1][0] > 10 * 20_000  # many slices


@pytest.mark.parametrize("value", ["0", "9", "two", "1.5"])
def test_a_bad_thread_count_is_one_line(monkeypatch, capsys, value):
    from support import run
    monkeypatch.setenv("PARAPLAN_THREADS", value)
    code, out, err = run(capsys, "search", "--model", "llama3-8b", "--gpus", "8")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"PARAPLAN_THREADS={value!r}" in err and "1 to 8" in err
