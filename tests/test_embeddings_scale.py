"""The embedding search past REPACK_MAX_TABLES tables (issue 33, part 4): one table moves at
a time onto the packing of the others, with the per-rank sums kept up to date."""

from __future__ import annotations

import random

import numpy as np

from paraplan.embeddings import search
from paraplan.embeddings.cost import ComputeKernel, ShardingType, evaluate
from paraplan.embeddings.tables import EmbeddingTable, EmbeddingWorkload
from paraplan.specs.catalog import load_cluster


def _workload(n: int, seed: int = 1) -> EmbeddingWorkload:
    rng = random.Random(seed)
    tables = tuple(EmbeddingTable(name=f"t{i}", num_rows=int(10 ** rng.uniform(3, 6.5)), dim=rng.choice([64, 128]),
                                  pooling_factor=rng.choice([1, 2, 5])) for i in range(n))
    return EmbeddingWorkload(name=f"synthetic-{n}", tables=tables, batch_size_per_rank=256)


def test_moves_keep_the_sums_the_cost_model_adds():
    """After moves of every kind, the incremental step equals a full evaluation of the plan."""
    wl, cluster = _workload(40), load_cluster("dgx-h100", num_gpus=16)
    P = search._Planner(wl, cluster, 16, 0.15, False)
    S = search._Packing(P)
    S.start({t.name: (*P.shape(t), 0.0) for t in wl.tables})
    moves = [("t0", (ShardingType.COLUMN_WISE, 2, ComputeKernel.HBM, 0.0, 0.0)),
             ("t1", (ShardingType.DATA_PARALLEL, 16, ComputeKernel.DENSE, 0.0, 0.0)),
             ("t2", (ShardingType.ROW_WISE, 16, ComputeKernel.HBM, 0.0, 0.0)),
             ("t3", (ShardingType.TABLE_ROW_WISE, 8, ComputeKernel.HBM, 0.0, 0.0)),
             ("t0", (ShardingType.TABLE_WISE, 1, ComputeKernel.HBM, 0.0, 0.0))]
    for name, option in moves:
        trial = S.trial(name, option)  # leaves the packing as it was
        S.move(name, option)
        _, _, moved = S.priced()
        assert np.isclose(trial[0], P.penalized(moved), rtol=1e-12)
        full = evaluate(S.plan(), wl, cluster, hbm_reserve_fraction=0.15)
        assert np.isclose(moved.step_time_s, full.step_time_s, rtol=1e-9)
        assert np.allclose(moved.axis.expand(moved.hbm_bytes) if moved.axis else moved.hbm_bytes, full.hbm_bytes,
                           rtol=1e-9)


def test_many_tables_search_by_moves_and_beats_the_first_packing():
    n = search.REPACK_MAX_TABLES + 20
    wl, cluster = _workload(n), load_cluster("dgx-h100", num_gpus=8)
    result = search.plan_embeddings(wl, cluster)
    P = search._Planner(wl, cluster, 8, 0.15, False)
    first = P.price({t.name: (*P.shape(t), 0.0) for t in wl.tables})
    assert result.cost.fits
    assert result.cost.step_time_s < first[0]
    assert {p.table for p in result.plan.placements} == {t.name for t in wl.tables}
    # every shard on its own rank, within the world
    for p in result.plan.placements:
        assert len(set(p.ranks)) == len(p.ranks) and all(0 <= r < 8 for r in p.ranks)
