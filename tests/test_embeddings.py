"""Embedding-table sharding: byte counts per sharding type, search, CLI, TorchRec side by side."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.cost.comm import Collective, collective_time_s
from paraplan.embeddings.cost import ComputeKernel, EmbeddingPlan, ShardingType, TablePlacement, evaluate
from paraplan.embeddings.search import plan_embeddings
from paraplan.embeddings.tables import EmbeddingTable, load_embedding_workload, load_profile
from paraplan.specs.catalog import load_cluster

from support import write


def _one(table, sharding, ranks, W, batch=512, **kw):
    wl = load_embedding_workload("criteo-1tb", batch)
    wl = replace(wl, tables=(table,))
    plan = EmbeddingPlan(placements=(TablePlacement(table=table.name, sharding=sharding, ranks=ranks, **kw),), world_size=W)
    return wl, evaluate(plan, wl, load_cluster("dgx-h100", num_gpus=W))


BIG = EmbeddingTable(name="big", num_rows=10_000_000, dim=128, pooling_factor=2.0)


def test_table_wise_bytes_match_the_formula():
    # ids in (G·P·8) and pooled outputs out and back (2·G·D·4), (W−1)/W of them off-rank
    W, B = 16, 512
    wl, c = _one(BIG, ShardingType.TABLE_WISE, (3,), W, B)
    G = B * W
    assert c.a2a_bytes == pytest.approx((W - 1) / W * (G * 2.0 * 8 + 2 * G * 128 * 4))
    # weights + row-wise Adagrad state (4 B per row) + I/O buffers, all on rank 3
    state = BIG.num_rows * (128 * 4 + 4)
    assert c.hbm_bytes[3] == pytest.approx(state + G * 2.0 * 8 + 2 * G * 128 * 4)
    assert c.hbm_bytes[np.arange(W) != 3].max() == 0


def test_row_wise_moves_ids_only_and_reduce_scatters_outputs():
    W, B = 16, 512
    wl, c = _one(BIG, ShardingType.ROW_WISE, tuple(range(W)), W, B)
    G = B * W
    assert c.a2a_bytes == pytest.approx((W - 1) / W * G * 2.0 * 8)
    cluster = load_cluster("dgx-h100", num_gpus=W)
    rs = float(collective_time_s(cluster, Collective.REDUCE_SCATTER, G * 128 * 4.0, W, 1))
    assert c.phase_s["output reduce-scatter"] == pytest.approx(rs)
    assert c.hbm_bytes.max() == pytest.approx(BIG.num_rows / W * (128 * 4 + 4) + G * 2.0 * 8 / W)


def test_data_parallel_has_no_all_to_all_but_an_all_reduce_of_the_table():
    W = 16
    small = EmbeddingTable(name="small", num_rows=1000, dim=64)
    wl, c = _one(small, ShardingType.DATA_PARALLEL, tuple(range(W)), W, kernel=ComputeKernel.DENSE)
    assert c.a2a_bytes == 0
    cluster = load_cluster("dgx-h100", num_gpus=W)
    assert c.phase_s["data-parallel all-reduce"] == pytest.approx(float(collective_time_s(cluster, Collective.ALL_REDUCE, 1000 * 64 * 4.0, W, 1)))


def test_column_split_halves_the_owner_output():
    W = 8  # a large batch, where bytes (not latency) set the all-to-all
    _, tw = _one(BIG, ShardingType.TABLE_WISE, (0,), W, 65536)
    _, cw = _one(BIG, ShardingType.COLUMN_WISE, (0, 1), W, 65536)
    assert cw.comm_s["output all-to-all"].max() < 0.6 * tw.comm_s["output all-to-all"].max()


def test_unique_share_uniform_and_measured():
    tiny = EmbeddingTable(name="tiny", num_rows=3, dim=8)
    assert tiny.unique_share(1000) == pytest.approx(3 / 1000, rel=1e-6)
    assert EmbeddingTable(name="huge", num_rows=10**12, dim=8).unique_share(1000) == pytest.approx(1.0, abs=1e-6)
    prof = load_profile()
    # DLRM 2022 locality: 110,259,238 distinct rows of 1,405,163,864 indices
    assert prof.unique_share == pytest.approx(110259238 / 1405163864)
    rows, acc = prof.hot_curve()
    assert np.all(np.diff(rows) >= 0) and np.all(np.diff(acc) >= 0)
    assert rows[-1] == pytest.approx(1) and acc[-1] == pytest.approx(1)
    # skew: the hottest 1% of a batch's distinct rows take well over 1% of its lookups
    assert prof.access_share_of_hottest(0.01) > 0.3


def test_search_beats_table_wise_round_robin_and_fits():
    W = 8
    wl = load_embedding_workload("criteo-1tb", 65536)
    cluster = load_cluster("dgx-h100", num_gpus=W)
    res = plan_embeddings(wl, cluster)
    naive = EmbeddingPlan(placements=tuple(TablePlacement(table=t.name, sharding=ShardingType.TABLE_WISE, ranks=(i % W,))
                                           for i, t in enumerate(wl.tables)), world_size=W)
    assert res.cost.fits
    assert res.cost.step_time_s < 0.9 * evaluate(naive, wl, cluster).step_time_s


def test_dedup_cuts_all_to_all_by_the_unique_share():
    W = 16
    wl = load_embedding_workload("dlrm-skewed", 512)
    cluster = load_cluster("dgx-h100", num_gpus=W)
    plain = plan_embeddings(wl, cluster)
    plan = replace(plain.plan, dedup=True)
    dd = evaluate(plan, wl, cluster)
    u = wl.tables[0].access.unique_share
    ids_plain = plain.cost.comm_s["input all-to-all"].max()
    assert dd.comm_s["input all-to-all"].max() < ids_plain
    assert dd.step_time_s < plain.cost.step_time_s
    # the id bytes shrink by u exactly; the pooled outputs do not change
    G = 512 * W
    ids = sum((W - 1) / W * G * t.pooling_factor * 8 for t in wl.tables
              if plan.placement(t.name).sharding is not ShardingType.DATA_PARALLEL)
    assert plain.cost.a2a_bytes - dd.a2a_bytes == pytest.approx(ids * (1 - u), rel=1e-6)


def test_one_gpu_keeps_what_does_not_fit_in_host_memory():
    # criteo-1tb's 97 GiB on one H100: the big tables row-wise in host memory behind a cache
    res = plan_embeddings(load_embedding_workload("criteo-1tb", 512), load_cluster("dgx-h100", num_gpus=1))
    assert res.cost.fits and any(p.kernel is ComputeKernel.UVM_CACHING for p in res.plan.placements)


def test_tables_that_fit_one_at_a_time_but_not_together_go_to_host_memory(tmp_path):
    # three 520M-row tables: each fits row-wise over 8 GPUs, together they do not
    path = write(tmp_path, "t.csv", "name,num_rows,dim\na,520000000,128\nb,520000000,128\nc,520000000,128\n")
    res = plan_embeddings(load_embedding_workload(str(path), 512), load_cluster("dgx-h100", num_gpus=8))
    assert res.cost.fits and any(p.kernel is ComputeKernel.UVM_CACHING for p in res.plan.placements)


def test_nothing_fits_says_why(tmp_path, capsys):
    # 2.2 TB of rows on one GPU: beyond its HBM and its host's 2 TB of DRAM
    path = write(tmp_path, "t.csv", "name,num_rows,dim\nhuge,4300000000,128\n")
    rc = main(["embeddings", "--gpus", "1", "--tables", str(path)])
    err = capsys.readouterr().err
    assert rc == 2 and "no embedding plan fits" in err and "more GPUs" in err and "\n" == err[-1] and err.count("\n") == 1
    # the advice names a real knob: the tables CSV's weight_bytes column
    assert "weight_bytes=2" in err and "fp16 weights" not in err


def test_cli_json_and_export(tmp_path, capsys):
    out = tmp_path / "constraints.json"
    assert main(["embeddings", "--gpus", "8", "--json", "--export-torchrec", str(out)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["world_size"] == 8 and d["step_time_s"] > 0
    assert d["step_time_s"] == pytest.approx(sum(d["phases_s"].values()))
    exported = json.loads(out.read_text())
    assert exported == d["torchrec"]
    constraints, placed = exported["parameter_constraints"], exported["placement"]
    assert set(constraints) == set(placed) == {"t_cat_%d" % i for i in range(26)}
    assert all(v["sharding_types"][0] in {s.value for s in ShardingType} for v in constraints.values())
    # only ParameterConstraints' own fields: TorchRec's dataclass takes each as keyword arguments
    allowed = {"sharding_types", "compute_kernels", "pooling_factors", "min_partition", "cache_params"}
    assert all(set(v) <= allowed for v in constraints.values())
    assert all(len(placed[n]["ranks"]) >= 1 and max(placed[n]["ranks"]) < 8 for n in placed)


def test_export_loads_as_torchrec_constraints(tmp_path):
    pytest.importorskip("torchrec")
    from paraplan.export.torchrec import export_document, load_constraints
    wl = load_embedding_workload("criteo-1tb", 512)
    res = plan_embeddings(wl, load_cluster("dgx-h100", num_gpus=8))
    loaded = load_constraints(json.loads(json.dumps(export_document(res.plan, wl))))
    assert len(loaded) == 26 and all(c.sharding_types for c in loaded.values())


@pytest.mark.parametrize("argv,needle", [
    (["embeddings", "--tables", "criteo"], "closest: criteo-1tb"),
    (["embeddings", "--optimizer", "sgd"], "--optimizer: value='sgd'"),
    (["embeddings", "--hbm-reserve", "1.5"], "--hbm-reserve"),
])
def test_bad_input_one_line_exit_2(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_bad_tables_csv_names_the_line(tmp_path, capsys):
    path = write(tmp_path, "t.csv", "name,num_rows,dim\na,100,16\nb,many,16\n")
    assert main(["embeddings", "--tables", str(path)]) == 2
    err = capsys.readouterr().err
    assert "t.csv:3" in err and "num_rows" in err


torchrec_cases = [(8, 512), (8, 65536), (64, 512), (64, 65536)]


@pytest.mark.parametrize("W,B", torchrec_cases)
def test_no_slower_than_torchrec_under_torchrecs_model(W, B):
    pytest.importorskip("torchrec")
    from paraplan.export.torchrec import price_with_torchrec, torchrec_plan
    wl = load_embedding_workload("criteo-1tb", B)
    cluster = load_cluster("dgx-h100", num_gpus=W)
    ours = plan_embeddings(wl, cluster)
    _, theirs = torchrec_plan(wl, cluster, W)
    priced = price_with_torchrec(ours.plan, wl, cluster)
    assert priced.max_rank_s <= theirs.max_rank_s * (1 + 1e-9)
    assert priced.max_rank_hbm_bytes <= priced.hbm_cap_bytes


@pytest.mark.parametrize("header_row,needle", [
    ("name,num_rows,dim,pooling\na,100,16,30\n", "column 'pooling' is not allowed"),
    ("name,num_rows,dim,pooling_factor\na,100,16,1e308\n", "pooling_factor"),
    ("name,num_rows,dim,weight_bytes\na,100,16,1e308\n", "weight_bytes"),
])
def test_tables_csv_refuses_unknown_columns_and_absurd_cells(tmp_path, capsys, header_row, needle):
    path = write(tmp_path, "t.csv", header_row)
    assert main(["embeddings", "--tables", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_table_row_wise_needs_whole_nodes(tmp_path):
    # 12 GPUs are a node and a half: a table too big for one rank is row-wise, not table-row-wise
    path = write(tmp_path, "t.csv", "name,num_rows,dim\nbig,200000000,128\nsmall,1000,128\n")
    res = plan_embeddings(load_embedding_workload(str(path), 512), load_cluster("dgx-h100", num_gpus=12))
    assert res.cost.fits
    assert all(p.sharding is not ShardingType.TABLE_ROW_WISE for p in res.plan.placements)


def test_fully_cached_row_wise_table_costs_what_hbm_does():
    # a row-wise shard whose cache holds all its rows reads nothing over the host link
    t = EmbeddingTable(name="a", num_rows=100_000_000, dim=128)
    wl = replace(load_embedding_workload("criteo-1tb", 4096), tables=(t,))
    cluster = load_cluster("dgx-h100", num_gpus=8)
    def step(kernel, cache):
        p = TablePlacement(table="a", sharding=ShardingType.ROW_WISE, ranks=tuple(range(8)), kernel=kernel,
                           cache_ratio=cache)
        return evaluate(EmbeddingPlan(placements=(p,), world_size=8), wl, cluster).step_time_s
    assert step(ComputeKernel.UVM_CACHING, 1.0) == pytest.approx(step(ComputeKernel.HBM, 0.0), rel=1e-9)
    # uniform access: half the shard's rows cached serve half its lookups (not half / 8)
    mid = (step(ComputeKernel.HBM, 0.0) + step(ComputeKernel.UVM_CACHING, 0.0)) / 2
    assert step(ComputeKernel.UVM_CACHING, 0.5) == pytest.approx(mid, rel=1e-6)


def test_profiled_table_never_has_more_distinct_rows_than_rows():
    prof = load_profile()
    t = EmbeddingTable(name="a", num_rows=10_000, dim=128, access=prof)
    n = 1e7
    assert t.unique_share(n) * n <= t.num_rows
    big = EmbeddingTable(name="b", num_rows=10**9, dim=128, access=prof)
    assert big.unique_share(n) == prof.unique_share


def test_profiled_cache_hit_rate_does_not_depend_on_the_shard_count():
    # a row-wise shard never has more distinct rows than it holds: 20% of each shard cached
    # serves the same share of its lookups whether the table is split 1 or 8 ways
    from paraplan.embeddings.cost import _hit_rate
    t = EmbeddingTable(name="a", num_rows=1_000_000, dim=128, access=load_profile())
    one = _hit_rate(t, 0.2 * 1_000_000, 1_000_000, 1e8)
    eight = _hit_rate(t, 0.2 * 125_000, 125_000, 1e8 / 8)
    assert eight == pytest.approx(one)


def test_two_shards_on_one_rank_add_up():
    # an imported plan may put two column shards of one table on one rank: the rank pays both
    # (the planner's own plans never do, and take the indexed-add path)
    W = 4
    _, apart = _one(BIG, ShardingType.COLUMN_WISE, (0, 1), W)
    _, together = _one(BIG, ShardingType.COLUMN_WISE, (2, 2), W)
    assert together.hbm_bytes[2] == pytest.approx(apart.hbm_bytes[0] + apart.hbm_bytes[1])
    assert together.fwd_lookup_s[2] == pytest.approx(apart.fwd_lookup_s[0] + apart.fwd_lookup_s[1])
    assert together.table_s["big"] == pytest.approx(apart.table_s["big"] * 2, rel=0.05)
    assert together.hbm_bytes[[0, 1, 3]].max() == 0


def test_the_search_prices_without_table_times_and_reports_them():
    wl = load_embedding_workload("criteo-1tb", 512)
    cluster = load_cluster("dgx-h100", num_gpus=64)
    res = plan_embeddings(wl, cluster)
    full = evaluate(res.plan, wl, cluster)
    lean = evaluate(res.plan, wl, cluster, per_table=False)
    assert lean.step_time_s == full.step_time_s and lean.table_s == {}
    assert res.cost.table_s == full.table_s and set(full.table_s) == {t.name for t in wl.tables}
