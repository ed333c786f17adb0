"""The search prices an MoE block on its grid (plan/space.py SpaceBlock.grid: each cost term at
the size of the axes it reads, numpy broadcasting the rest) instead of as one column per plan.
Both must give every plan the same numbers, bit for bit, and the search the same ranking."""

from __future__ import annotations

import numpy as np
import pytest

from support import search_setup, spread_blocks

from paraplan.cost.evaluate import plan_memory, plan_time
from paraplan.plan.space import space_blocks
from paraplan.search import planner
from paraplan.search.planner import search

CASES = {
    # (model, cluster, GPUs, seq, global batch, precision, engine)
    "mixtral": ("mixtral-8x7b", "dgx-h100", 64, 4096, 256, "bf16", None),
    "qwen3-fp8": ("qwen3-30b-a3b", "dgx-h100", 32, 4096, 128, "fp8", None),
    "deepseek-v2-torchtitan": ("deepseek-v2", "dgx-h100", 64, 4096, 128, "bf16", "torchtitan"),
    "mixtral-deepspeed": ("mixtral-8x7b", "dgx-h100", 32, 4096, 64, "bf16", "deepspeed"),
    "qwen3-megatron": ("qwen3-30b-a3b", "dgx-h100", 32, 4096, 128, "bf16", "megatron"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_blocks_grid_prices_every_plan_as_its_columns_do(case):
    model, cluster, workload, limits = search_setup(*CASES[case])
    assert any(len(b.experts["ep"]) > 1 for b in space_blocks(model, cluster, workload, limits))
    for block in spread_blocks(model, cluster, workload, limits):
        grid, columns = block.grid(), block.candidates()
        bad = block.invalid(model, cluster, workload, grid)
        valid, rejected = block.materialize(model, cluster, workload)
        assert rejected == int(bad.sum()) and len(valid) == int((~bad).sum())
        ok = np.flatnonzero(~bad)
        with np.errstate(all="ignore"):  # the grid prices its invalid plans too
            grid_memory = block.flat(np.asarray(plan_memory(model, cluster, workload, grid)[0].total))[ok]
            grid_time = block.flat(np.asarray(plan_time(model, cluster, workload, grid).total))[ok]
        assert np.array_equal(grid_memory, np.asarray(plan_memory(model, cluster, workload, valid)[0].total))
        assert np.array_equal(grid_time, np.asarray(plan_time(model, cluster, workload, valid).total))
        assert all(np.array_equal(getattr(columns.take(ok), f), getattr(valid, f)) for f in ("ep", "etp", "vp"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_search_ranks_the_same_plans_priced_on_grids_or_as_columns(case, monkeypatch):
    model, cluster, workload, limits = search_setup(*CASES[case])
    on_grids = search(model, cluster, workload, limits=limits, resimulate=16)
    monkeypatch.setattr(planner, "_on_grid", lambda part: False)
    as_columns = search(model, cluster, workload, limits=limits, resimulate=16)
    assert (on_grids.num_candidates, on_grids.num_valid, on_grids.num_fit) == \
        (as_columns.num_candidates, as_columns.num_valid, as_columns.num_fit)
    assert [e.plan for e in on_grids.ranked] == [e.plan for e in as_columns.ranked]
    assert [e.step_time_s for e in on_grids.ranked] == [e.step_time_s for e in as_columns.ranked]
