"""The search checks memory before it times a plan: plan_memory (and plan_memory_total, the
search's total alone) must be evaluate's memory."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.cost.evaluate import evaluate, plan_memory, plan_memory_total
from paraplan.cost.memory import fits
from paraplan.cost.recompute_set import with_searched_sets
from paraplan.plan.space import PlanBatch, SpaceLimits, enumerate_space
from paraplan.search.planner import search
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload


@pytest.mark.parametrize("name,gpus,prec", [("llama3-70b", 64, Precision.BF16), ("qwen3-30b-a3b", 16, Precision.FP8),
                                            ("deepseek-v3", 64, Precision.FP8), ("llama3-8b", 16, Precision.FP32)])
def test_plan_memory_is_evaluates_memory(name, gpus, prec):
    model, cluster = load_model(name), load_cluster("dgx-h100", num_gpus=gpus)
    wl = Workload(global_batch_size=256, seq_len=4096, precision=prec)
    limits = with_searched_sets(model, cluster, wl, SpaceLimits())  # (the search's: Recompute.SET's sets too)
    batch = PlanBatch.concat([b for b, _ in enumerate_space(model, cluster, wl, limits) if len(b)])
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
    limits = with_searched_sets(model, cluster, wl, SpaceLimits())  # (the search's: Recompute.SET's sets too)
    batch = PlanBatch.concat([b for b, _ in enumerate_space(model, cluster, wl, limits) if len(b)])
    # the screen counts the live tensors and the runtime, no allocator slack (the replay decides)
    screened = replace(cluster, gpu=replace(cluster.gpu, allocator_fragmentation=0.0))
    costs = evaluate(model, screened, wl, batch)
    ok = fits(cluster, np.asarray(costs.memory.total), costs.host_bytes)
    assert res.num_fit == int(ok.sum()) > 0
    # the fastest plan that fits by the closed form is among those the search re-timed
    best = float(np.min(np.asarray(costs.time.total)[ok]))
    assert min(e.step_time_s for e in res.ranked) <= best * 1.05
    assert all(e.fits and e.memory.total <= cluster.gpu.hbm_bytes for e in res.ranked)


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
@pytest.mark.parametrize("on", ["processes", "threads"])
def test_workers_rank_and_count_as_one_does(monkeypatch, name, gpus, prec, on):
    """Slices priced by worker processes (forked, where the platform forks) or threads are
    merged in enumeration order: the same plans, times, counts and smallest plan as in one
    process, with small slices so that many run at once."""
    import paraplan.search.planner as planner
    if on == "processes" and planner._FORK is None:
        pytest.skip("this platform does not fork worker processes")
    if on == "threads":
        monkeypatch.setattr(planner, "_FORK", None)
    assert planner._forks_workers() == (on == "processes")
    model, cluster = load_model(name), load_cluster("dgx-h100", num_gpus=gpus)
    wl = Workload(global_batch_size=256, seq_len=4096, precision=prec)
    monkeypatch.setattr(planner, "CHUNK", 20_000)
    out = {}
    for workers in ("1", "3"):
        monkeypatch.setenv("PARAPLAN_WORKERS", workers)
        assert planner.search_workers() == int(workers)
        res = search(model, cluster, wl, top_k=16, resimulate=16)
        out[workers] = ([(e.plan, e.step_time_s, e.memory.total) for e in res.ranked],
                        (res.num_candidates, res.num_valid, res.num_fit))
    assert out["1"] == out["3"]
    assert out["1"][1][0] > 10 * 20_000  # many slices


@pytest.mark.parametrize("on", ["processes", "threads"])
def test_an_error_in_a_worker_reaches_the_search_as_raised(monkeypatch, on):
    """An error raised while a worker prices a slice is the search's error, its class, line
    and fields intact (a worker process sends it back pickled)."""
    import paraplan.search.planner as planner
    from paraplan.errors import SpecError
    if on == "processes" and planner._FORK is None:
        pytest.skip("this platform does not fork worker processes")
    if on == "threads":
        monkeypatch.setattr(planner, "_FORK", None)
    monkeypatch.setattr(planner, "CHUNK", 20_000)
    monkeypatch.setenv("PARAPLAN_WORKERS", "2")

    def fails(*args):
        raise SpecError("search", "--probe", 7, "a value the test refuses")
    monkeypatch.setattr(planner, "_price_slice", fails)
    with pytest.raises(SpecError) as err:
        search(load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=64),
               Workload(global_batch_size=256, seq_len=4096, precision=Precision.BF16))
    assert str(err.value) == "search: --probe=7 is not allowed; a value the test refuses"
    assert err.value.field == "--probe"


def test_a_dead_worker_process_is_one_line(monkeypatch):
    """A worker process that dies (the kernel's out-of-memory killer) ends the search with
    one line that says what happened and what helps, not the pool's traceback."""
    import os
    import paraplan.search.planner as planner
    from paraplan.errors import ParaplanError
    if not planner._forks_workers():
        pytest.skip("this process does not fork worker processes (platform, or other threads running)")
    monkeypatch.setattr(planner, "CHUNK", 20_000)
    monkeypatch.setenv("PARAPLAN_WORKERS", "2")
    monkeypatch.setattr(planner, "_price_slice", lambda *args: os._exit(9))
    with pytest.raises(ParaplanError) as err:
        search(load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=64),
               Workload(global_batch_size=256, seq_len=4096, precision=Precision.BF16))
    assert "worker process died" in str(err.value) and "PARAPLAN_WORKERS=1" in str(err.value)
    assert "\n" not in str(err.value)


def test_workers_are_threads_where_a_fork_is_not_safe():
    """No fork where another thread runs (its locks would stay held in the child) or in a
    pool's worker process (a daemon has no children)."""
    import threading
    import paraplan.search.planner as planner
    if planner._FORK is None:
        pytest.skip("this platform does not fork worker processes")
    assert planner._forks_workers()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert not planner._forks_workers()
    finally:
        stop.set()
        other.join()
    assert planner._forks_workers()


def test_the_old_name_of_the_worker_count_still_counts(monkeypatch):
    import paraplan.search.planner as planner
    monkeypatch.delenv("PARAPLAN_WORKERS", raising=False)
    monkeypatch.setenv("PARAPLAN_THREADS", "1")
    assert planner.search_workers() == 1
    monkeypatch.setenv("PARAPLAN_WORKERS", "2")
    assert planner.search_workers() == 2


def test_a_worker_process_is_told_the_search_bar():
    """A forked worker's copy of the bar takes the lower of its own and the search's, and
    offers stay its own (another copy's plans may be among them)."""
    import paraplan.search.planner as planner
    bar = planner._Bar(2)
    bar.offer(np.array([3.0, 5.0]))
    bar.lower_to(4.0)
    assert bar.seconds == 4.0
    bar.lower_to(6.0)
    assert bar.seconds == 4.0
    bar.offer(np.array([1.0]))
    assert bar.seconds == 3.0


@pytest.mark.parametrize("value", ["0", "9", "two", "1.5"])
def test_a_bad_worker_count_is_one_line(monkeypatch, capsys, value):
    from support import run
    monkeypatch.setenv("PARAPLAN_WORKERS", value)
    code, out, err = run(capsys, "search", "--model", "llama3-8b", "--gpus", "8")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"PARAPLAN_WORKERS={value!r}" in err and "1 to 8" in err
