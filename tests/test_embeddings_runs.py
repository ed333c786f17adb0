"""The embedding search's per-rank arrays in run-length form (embeddings/ranks.py, issue 33):
the ranks no table-wise or column-wise shard is on share one column, and every number the
search compares is the one a per-rank array gives, bit for bit."""

from __future__ import annotations

import random

import numpy as np
import pytest

from paraplan.embeddings import search
from paraplan.embeddings.cost import ComputeKernel, EmbeddingPlan, ShardingType, TablePlacement, evaluate
from paraplan.embeddings.ranks import RankColumns
from paraplan.embeddings.tables import load_embedding_workload, load_profile
from paraplan.specs.catalog import load_cluster


def _mixed_plan(W: int) -> EmbeddingPlan:
    """Criteo's 26 tables on W ranks, every sharding type and kernel, hot rows on some."""
    wl = load_embedding_workload("criteo-1tb", 512).with_access(load_profile("dlrm-2022"))
    kinds = [("tw", (W - 3,)), ("cw", (7, W // 2)), ("trw", tuple(range(16, 24))), ("rw", range(W)),
             ("dp", range(W)), ("uvm", range(W))]
    placements = []
    for n, t in enumerate(wl.tables):
        kind, ranks = kinds[n % len(kinds)]
        sharding = {"tw": ShardingType.TABLE_WISE, "cw": ShardingType.COLUMN_WISE, "trw": ShardingType.TABLE_ROW_WISE,
                    "rw": ShardingType.ROW_WISE, "dp": ShardingType.DATA_PARALLEL,
                    "uvm": ShardingType.ROW_WISE}[kind]
        kernel = {"dp": ComputeKernel.DENSE, "uvm": ComputeKernel.UVM_CACHING}.get(kind, ComputeKernel.HBM)
        placements.append(TablePlacement(table=t.name, sharding=sharding, ranks=ranks, kernel=kernel,
                                         cache_ratio=0.2 if kind == "uvm" else 0.0,
                                         hot_row_fraction=0.05 if n % 4 == 0 and kind != "dp" else 0.0))
    return wl, EmbeddingPlan(placements=tuple(placements), world_size=W)


@pytest.mark.parametrize("W", [64, 1000, 4096])
def test_runs_give_every_rank_what_one_entry_per_rank_gives(W):
    wl, plan = _mixed_plan(W)
    cluster = load_cluster("dgx-h100", num_gpus=W)
    dense = evaluate(plan, wl, cluster, per_table=False)
    runs = evaluate(plan, wl, cluster, per_table=False, runs=True)
    assert runs.axis is not None and runs.axis.num_columns < W / 4  # the rest share a column
    for name in ("fwd_lookup_s", "bwd_lookup_s", "hbm_bytes", "host_bytes", "rank_total_s"):
        assert np.array_equal(runs.axis.expand(getattr(runs, name)), getattr(dense, name)), name
    for phase, v in dense.comm_s.items():
        assert np.array_equal(runs.axis.expand(runs.comm_s[phase]), v), phase
    assert runs.step_time_s == dense.step_time_s and runs.phase_s == dense.phase_s
    assert runs.host_bytes_per_host.max() == dense.host_bytes_per_host.max()
    assert runs.fits == dense.fits
    for tol in (0.0, 1e-6, 0.5):
        assert runs.ranks_near_max(tol) == dense.ranks_near_max(tol)
    assert runs.a2a_bytes == pytest.approx(dense.a2a_bytes, rel=1e-12)


@pytest.mark.parametrize("W", [5, 203])
def test_rank_columns_follow_a_per_rank_array(W):
    """Random naming and element-wise adds (removals too): the columns expand to the per-rank
    array kept beside, and the host sums' maximum is the same (a short last host included)."""
    rng = random.Random(W)
    host = 8
    cols, ref = RankColumns(W, 2), np.zeros((2, W))
    assert cols.axis.group_sums(cols.data[0], host).max() == 0.0
    for _ in range(300):
        if rng.random() < 0.3:
            delta = rng.choice([0.25, 1.0 / 3.0, -7.0])
            cols.data += delta
            ref += delta
        else:
            ranks = rng.sample(range(W), min(W, rng.choice([1, 2, 8])))
            delta = np.array([rng.choice([0.1, 0.5, -2.0]) for _ in ranks])
            c = cols.name(ranks)
            cols.data[:, c] += delta
            ref[:, ranks] += delta
        for row in range(2):
            assert np.array_equal(cols.axis.expand(cols.data[row]), ref[row])
        sums = np.bincount(np.arange(W) // host, weights=ref[0])
        assert cols.axis.group_sums(cols.data[0], host).max() == sums.max()
        unnamed = sorted(set(range(W)) - set(cols.axis.named.tolist()))
        assert cols.axis.first_unnamed() == (unnamed[0] if unnamed else None)
    assert cols.axis.rest == 0 or cols.data.shape[1] == len(cols.axis.named) + 1


def _dense_put(P, load, mem, mem_max, sh, tv, mv):
    """The greedy placement on one entry per rank (argmin: ties to the lowest rank)."""
    if sh is ShardingType.TABLE_ROW_WISE:
        node_load = load.reshape(-1, P.g).max(axis=1)
        room = (mem.reshape(-1, P.g) + mv).max(axis=1) <= P.capacity
        n = int(np.argmin(np.where(room, node_load, np.inf))) if room.any() else int(np.argmin(node_load))
        ranks = list(range(n * P.g, (n + 1) * P.g))
        load[ranks] += tv
        mem[ranks] += mv
        return tuple(ranks)
    chosen = []
    roomy = mem_max + float(mv.max()) <= P.capacity
    for j in range(len(tv)):
        key = load.copy() if roomy else load + (mem + mv[j] > P.capacity) * 1e9
        key[chosen] = np.inf
        r = int(key.argmin())
        chosen.append(r)
        load[r] += tv[j]
        mem[r] += mv[j]
    return tuple(chosen)


@pytest.mark.parametrize("seed", range(8))
def test_placement_on_runs_picks_the_ranks_one_entry_per_rank_picks(seed):
    """Loaded ranks, named ranks tied with the untouched ones (as a table that moved away
    leaves them), full ranks: the same ranks either way."""
    rng = random.Random(seed)
    W = 32 if seed % 2 else 256
    wl = load_embedding_workload("criteo-1tb", 512)
    P = search._Planner(wl, load_cluster("dgx-h100", num_gpus=W), W, 0.15, False)
    cols = RankColumns(W, 2)
    cols.data[0] += 0.5
    cols.name(rng.sample(range(W), 5))  # named, still at the shared value
    load, mem = np.full(W, 0.5), np.zeros(W)
    for _ in range(60):
        sh = rng.choice([ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_ROW_WISE])
        k = {ShardingType.TABLE_WISE: 1, ShardingType.COLUMN_WISE: rng.choice([2, 4]),
             ShardingType.TABLE_ROW_WISE: P.g}[sh]
        tv = np.array([rng.choice([0.0, 0.5, 1.0, 1.5]) for _ in range(k)])
        mv = np.array([rng.choice([0.1, 0.3, 0.6]) * P.capacity for _ in range(k)])
        mem_max = float(cols.data[1].max())
        got, _ = P.put(cols, mem_max, sh, tv, mv)
        assert got == _dense_put(P, load, mem, mem_max, sh, tv, mv)
        assert np.array_equal(cols.axis.expand(cols.data[0]), load)
        assert np.array_equal(cols.axis.expand(cols.data[1]), mem)
