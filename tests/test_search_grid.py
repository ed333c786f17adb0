"""The search prices an MoE block on its grid (plan/space.py SpaceBlock.grid: each cost term at
the size of the axes it reads, numpy broadcasting the rest) instead of as one column per plan.
Both must give every plan the same numbers, bit for bit, and the search the same ranking."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.cost.evaluate import plan_memory, plan_time
from paraplan.export.registry import exporter
from paraplan.plan.space import SpaceLimits, space_blocks
from paraplan.search import planner
from paraplan.search.planner import search
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

CASES = {
    # (model, cluster, GPUs, seq, global batch, precision, engine)
    "mixtral": ("mixtral-8x7b", "dgx-h100", 64, 4096, 256, "bf16", None),
    "qwen3-fp8": ("qwen3-30b-a3b", "dgx-h100", 32, 4096, 128, "fp8", None),
    "deepseek-v2-torchtitan": ("deepseek-v2", "dgx-h100", 64, 4096, 128, "bf16", "torchtitan"),
    "mixtral-deepspeed": ("mixtral-8x7b", "dgx-h100", 32, 4096, 64, "bf16", "deepspeed"),
    "qwen3-megatron": ("qwen3-30b-a3b", "dgx-h100", 32, 4096, 128, "bf16", "megatron"),
}


def _setup(case):
    name, cluster, gpus, seq, batch, precision, engine = CASES[case]
    limits = exporter(engine).SUPPORT.search_limits() if engine else SpaceLimits()
    return (load_model(name), load_cluster(cluster, num_gpus=gpus),
            Workload(global_batch_size=batch, seq_len=seq, precision=Precision(precision)), limits)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_blocks_grid_prices_every_plan_as_its_columns_do(case):
    model, cluster, workload, limits = _setup(case)
    blocks = [b for b in space_blocks(model, cluster, workload, limits) if b.num_candidates]
    assert any(len(b.experts["ep"]) > 1 for b in blocks)
    for block in blocks[::max(1, len(blocks) // 12)]:  # a dozen blocks across the space
        grid, columns = block.grid(), block.candidates()
        bad = block.invalid(model, cluster, workload, grid)
        valid, rejected = block.materialize(model, cluster, workload)
        assert rejected == int(bad.sum()) and len(valid) == int((~bad).sum())
        ok = np.flatnonzero(~bad)
        with np.errstate(all="ignore"):  # the grid prices its invalid plans too
            grid_memory = np.broadcast_to(np.asarray(plan_memory(model, cluster, workload, grid)[0].total),
                                          block.shape).ravel()[ok]
            grid_time = np.broadcast_to(np.asarray(plan_time(model, cluster, workload, grid).total),
                                        block.shape).ravel()[ok]
        assert np.array_equal(grid_memory, np.asarray(plan_memory(model, cluster, workload, valid)[0].total))
        assert np.array_equal(grid_time, np.asarray(plan_time(model, cluster, workload, valid).total))
        assert all(np.array_equal(getattr(columns.take(ok), f), getattr(valid, f)) for f in ("ep", "etp", "vp"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_search_ranks_the_same_plans_priced_on_grids_or_as_columns(case, monkeypatch):
    model, cluster, workload, limits = _setup(case)
    on_grids = search(model, cluster, workload, limits=limits, resimulate=16)
    monkeypatch.setattr(planner, "_on_grid", lambda part: False)
    as_columns = search(model, cluster, workload, limits=limits, resimulate=16)
    assert (on_grids.num_candidates, on_grids.num_valid, on_grids.num_fit) == \
        (as_columns.num_candidates, as_columns.num_valid, as_columns.num_fit)
    assert [e.plan for e in on_grids.ranked] == [e.plan for e in as_columns.ranked]
    assert [e.step_time_s for e in on_grids.ranked] == [e.step_time_s for e in as_columns.ranked]
