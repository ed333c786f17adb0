"""The search times in full only the plans whose step floor (evaluate.step_floor_s) is under
the n-th fastest step it has seen (planner._Bar), after ruling out first the plans whose floor
under all their ZeRO choices (planner.floor_under_zero_choices) is above it. That is exact
only if each floor is under the next: these tests check it on every valid plan of blocks
across dense and MoE spaces (ZeRO-3, FSDP2, multi-token prediction, every schedule), and that
a search ranks the same plans with the floors as without them."""

from __future__ import annotations

import numpy as np
import pytest

from support import search_setup, spread_blocks

from paraplan.cost.evaluate import plan_time, step_floor_s
from paraplan.search import planner
from paraplan.search.planner import search

CASES = {
    # (model, cluster, GPUs, seq, global batch, precision, engine)
    "llama3-8b": ("llama3-8b", "dgx-h100", 64, 8192, 256, "bf16", None),
    "llama3-8b-torchtitan": ("llama3-8b", "dgx-h100", 64, 8192, 128, "bf16", "torchtitan"),
    "gpt3-fp8": ("gpt3-175b", "dgx-h100", 256, 2048, 512, "fp8", None),
    "mixtral": ("mixtral-8x7b", "dgx-h100", 64, 4096, 256, "bf16", None),
    "qwen3-megatron": ("qwen3-30b-a3b", "dgx-h100", 32, 4096, 128, "bf16", "megatron"),
    "deepseek-v3-mtp": ("deepseek-v3", "dgx-h100", 64, 4096, 256, "fp8", None),
}


# smaller spaces for the searches run twice (with and without the floor)
SEARCHED = {
    "llama3-8b": ("llama3-8b", "dgx-h100", 32, 8192, 128, "bf16", None),
    "llama3-8b-torchtitan": CASES["llama3-8b-torchtitan"],
    "mixtral": ("mixtral-8x7b", "dgx-h100", 8, 4096, 32, "bf16", None),
    "qwen3-megatron": ("qwen3-30b-a3b", "dgx-h100", 16, 4096, 64, "bf16", "megatron"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_floor_is_never_above_the_step(case):
    model, cluster, workload, limits = search_setup(*CASES[case])
    ratios = []
    for block in spread_blocks(model, cluster, workload, limits):
        valid, _ = block.materialize(model, cluster, workload)
        if not len(valid):
            continue
        floor = np.broadcast_to(np.asarray(step_floor_s(model, cluster, workload, valid), dtype=float), (len(valid),))
        step = np.asarray(plan_time(model, cluster, workload, valid).total, dtype=float)
        assert np.all(floor <= step * (1.0 + 1e-12)), valid.plan(int(np.argmax(floor / step))).describe()
        ratios.append(step / floor)
    ratios = np.concatenate(ratios)
    # and it is close: the step's own terms beyond it (bubble, sends, DP sync, optimizer) are a share of it
    assert np.median(ratios) < 1.5


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_floor_under_the_zero_choices_is_never_above_a_plans_floor(case):
    model, cluster, workload, limits = search_setup(*CASES[case])
    checked, ratios = 0, []
    for block in spread_blocks(model, cluster, workload, limits):
        grid = block.grid()
        with np.errstate(all="ignore"):  # (the grid prices its invalid plans too)
            under = planner.floor_under_zero_choices(model, cluster, workload, block, grid, block.shape)
            if under is None:
                continue
            ok = np.flatnonzero(~block.invalid(model, cluster, workload, grid))
            floor = block.flat(step_floor_s(model, cluster, workload, grid))[ok]
        under = block.flat(under)[ok]
        assert np.all(under <= floor * (1.0 + 1e-12)), block.candidates().take(ok).plan(
            int(np.argmax(under / floor))).describe()
        checked += len(ok)
        ratios.append(floor / under)
    if limits.fsdp2_copies:  # torchtitan: ZeRO-0 is DDP under autocast, another program: no such floor
        assert checked == 0
        return
    assert checked > 0
    # and it is close: the plans with ZeRO-3's exposed gathers are above it, the rest near it
    assert np.median(np.concatenate(ratios)) < 1.2


@pytest.mark.parametrize("case", sorted(SEARCHED))
@pytest.mark.parametrize("workers", ["1", "3"])
def test_the_search_ranks_the_same_plans_with_and_without_the_floor(case, workers, monkeypatch):
    """In one process, and on workers (forked processes with their copies of the bar where
    the platform forks them)."""
    model, cluster, workload, limits = search_setup(*SEARCHED[case])
    monkeypatch.setattr(planner, "CHUNK", 5000)  # many slices: the bar is set before most are priced
    monkeypatch.setenv("PARAPLAN_WORKERS", workers)
    ruled_out = []
    hopeful = planner._Bar.hopeful

    def counted(bar, floor):
        out = hopeful(bar, floor)
        ruled_out.append(int(np.size(out) - np.count_nonzero(out)))
        return out
    monkeypatch.setattr(planner._Bar, "hopeful", counted)
    with_floor = search(model, cluster, workload, limits=limits, top_k=16, resimulate=16)
    if workers == "1":
        assert sum(ruled_out) > 0  # the floor did rule plans out (counted in this process)
    monkeypatch.setattr(planner, "FLOOR_SLACK", float("inf"))  # no floor rules a plan out
    without = search(model, cluster, workload, limits=limits, top_k=16, resimulate=16)
    assert [e.plan for e in with_floor.ranked] == [e.plan for e in without.ranked]
    assert [e.step_time_s for e in with_floor.ranked] == [e.step_time_s for e in without.ranked]


def test_the_bar_is_the_nth_fastest_offered():
    bar = planner._Bar(3)
    assert bar.seconds == float("inf")
    bar.offer(np.array([5.0, 1.0]))
    assert bar.seconds == float("inf")  # two plans seen: no third to bound the ranking
    bar.offer(np.array([4.0, 9.0]))
    assert bar.seconds == 5.0
    bar.offer(np.array([2.0]))
    assert bar.seconds == 4.0
    assert list(bar.hopeful(np.array([3.9, 4.0, 4.1]))) == [True, True, False]
    none = planner._Bar(0)  # a search that keeps no plan rules none out by the bar
    none.offer(np.array([1.0]))
    assert none.seconds == float("inf")
