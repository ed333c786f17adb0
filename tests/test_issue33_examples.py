"""Issue 33's examples that no other file tests by name: the multi-cluster `scale` table at
120 columns and `embeddings` at 262,144 GPUs (the search keeps what every rank shares once,
not once per rank). 10,000 layers at 2,000 and 5,000 pipeline stages: test_deep_pipeline.py."""

from __future__ import annotations

from paraplan.embeddings import search
from paraplan.embeddings.cost import ComputeKernel, ShardingType
from paraplan.embeddings.tables import load_embedding_workload
from paraplan.specs.catalog import load_cluster

from support import assert_user_error, run


def test_the_multi_cluster_scale_table_fits_120_columns(capsys, monkeypatch):
    # was about 190 columns: a cluster column beside the plan, the step and the budget
    monkeypatch.setenv("COLUMNS", "120")
    code, out, err = run(capsys, "scale", "--model", "llama3-8b", "--seq", "4096", "--batch", "64", "--tokens", "1e11",
                         "--counts", "8,16", "--cluster", "dgx-h100,dgx-a100-80gb")
    assert code == 0, err
    assert "dgx-a100-80gb" in out and "dgx-h100" in out
    assert max(len(line) for line in out.splitlines()) <= 120, max(out.splitlines(), key=len)


def test_embeddings_at_262144_gpus_keep_the_ranks_alike_as_one_column():
    # was 61-69 s and 1.5-5.9 GB: per-rank arrays of 262,144 entries per table and option
    W = 262_144
    wl = load_embedding_workload("criteo-1tb", 512)
    P = search._Planner(wl, load_cluster("dgx-h100", num_gpus=W), W, 0.15, False)
    big = max(wl.tables, key=lambda t: t.num_rows)
    time_v, mem_v = P.load(big, ShardingType.ROW_WISE, W, ComputeKernel.HBM)
    assert len(time_v) == len(mem_v) == 1 and time_v[0] > 0
    small = min(wl.tables, key=lambda t: t.num_rows)
    time_v, _ = P.load(small, ShardingType.TABLE_WISE, 1)
    assert len(time_v) == 2 and time_v[0] > 0 and time_v[1] == 0  # its rank, then every other
    penalized, plan, cost = P.price({t.name: (*P.shape(t), 0.0) for t in wl.tables})
    singled_out = {r for p in plan.placements if not isinstance(p.ranks, range) for r in p.ranks}
    assert cost.axis is not None and cost.axis.num_columns == len(singled_out) + 1
    assert cost.rank_total_s.shape == (len(singled_out) + 1,)
    # the first packing (every table whole where it fits one GPU) overfills one rank: the
    # penalty the search steers away from
    assert not cost.fits_hbm and penalized > cost.step_time_s and cost.ranks_near_max() >= 1


def test_embeddings_refuse_more_gpus_than_tested_in_one_line(capsys):
    line = assert_user_error(*run(capsys, "embeddings", "--gpus", str(2**20 + 1)))
    assert "--gpus=1048577" in line and "from 1 to 1,048,576" in line
