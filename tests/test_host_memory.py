"""Host DRAM: offloaded optimizer states must fit in the host's memory too.

Presets state each host's DRAM from its datasheet; a plan that offloads more than a
GPU's share of it does not fit, and the search says so.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cli import main
from paraplan.cost.estimate import estimate
from paraplan.errors import NoPlanFitsError
from paraplan.plan.axes import Recompute, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import SpaceLimits
from paraplan.search.planner import search
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload
from paraplan.units import GIGA

WL = Workload(global_batch_size=64, seq_len=4096)


def test_presets_state_host_dram_from_datasheets():
    assert load_cluster("dgx-h100").host_memory_bytes_per_gpu == pytest.approx(2000 * GIGA / 8)
    assert load_cluster("dgx-a100-40gb").host_memory_bytes_per_gpu == pytest.approx(1000 * GIGA / 8)
    gb = load_cluster("gb200-nvl72")  # one Grace (480 GB) per two GPUs, not the rack's 17 TB pooled
    assert gb.host_memory_bytes_per_gpu == pytest.approx(240 * GIGA) and gb.host_gpus == 2
    assert load_cluster("mi300x-8").host_memory_bytes_per_gpu == 0.0  # platform-dependent: not stated


def test_offloaded_optimizer_lives_in_host_dram():
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=64)
    plan = make_plan(tp=8, pp=2, dp=4, zero=ZeroStage.OPTIMIZER, offload_optimizer=True, sequence_parallel=True,
                     recompute=Recompute.FULL)
    est = estimate(model, cluster, WL, plan)
    # fp32 master + two Adam moments + an fp32 gradient copy: 16 bytes per parameter of the
    # rank's optimizer shard (the worst stage holds a little more than the average)
    per_gpu = 16.0 * model.num_params / (8 * 2 * 4)
    assert per_gpu <= est.host_bytes <= 1.1 * per_gpu
    assert est.memory.optimizer_bytes == 0.0 and est.fits
    on_gpu = estimate(model, cluster, WL, replace(plan, offload_optimizer=False))
    assert on_gpu.host_bytes == 0.0


def test_a_plan_that_overflows_host_dram_does_not_fit():
    # Llama 3 70B on 16 H100 as TP 8 × DP 2: without offload the ZeRO-1 optimizer shard does
    # not fit in HBM; offloaded it needs ~70 GB of host DRAM per GPU
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=16)
    small_host = replace(cluster, host_memory_bytes_per_host=8 * 50 * GIGA)
    plan = make_plan(tp=8, pp=1, dp=2, zero=ZeroStage.OPTIMIZER, offload_optimizer=True, sequence_parallel=True,
                     recompute=Recompute.FULL)
    assert estimate(model, cluster, WL, plan).fits
    est = estimate(model, small_host, WL, plan)
    assert est.memory.total <= est.hbm_bytes and not est.fits
    assert "host DRAM" in est.misfit(small_host.gpu.name)
    assert not estimate(model, cluster, WL, replace(plan, offload_optimizer=False)).fits
    # the search has only offload to make the model fit here: it says host DRAM is the limit
    limits = SpaceLimits(zero_stages=(ZeroStage.OPTIMIZER,), recomputes=(Recompute.FULL,))
    fixed = {"tp": 8, "pp": 1, "micro_batch_size": 1}
    with pytest.raises(NoPlanFitsError, match="share of host DRAM"):
        search(model, small_host, WL, limits=limits, fixed=fixed)
    best = search(model, cluster, WL, limits=limits, fixed=fixed, top_k=1).ranked[0]
    assert best.fits and best.plan.offload_optimizer and best.host_bytes <= best.host_capacity_bytes


def test_estimate_reports_host_dram(capsys):
    assert main(["estimate", "--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1",
                 "--offload", "--recompute", "full", "--seq", "4096", "--batch", "64"]) == 0
    out = capsys.readouterr().out
    assert "host DRAM per GPU (offloaded)" in out and "of 232.83 GiB" in out


def test_cluster_file_host_memory_is_checked(tmp_path, capsys):
    from paraplan.specs.catalog import CATALOG_DIR
    text = (CATALOG_DIR / "clusters" / "dgx-h100.toml").read_text()
    bad = tmp_path / "c.toml"
    bad.write_text(text.replace("host_memory_gb_per_host = 2000.0", "host_memory_gb_per_host = -1"))
    assert main(["estimate", "--cluster", str(bad), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "host_memory_gb_per_host" in err and "Traceback" not in err and err.count("\n") == 1


def test_embedding_rows_in_host_memory_must_fit_the_hosts_dram(tmp_path, capsys):
    # one 6-billion-row, 128-dim fp32 table (2.8 TiB): too big for the HBM of 8 or 16 H100s,
    # so its rows live in host memory behind an HBM cache (UVM caching)
    tables = tmp_path / "t.csv"
    tables.write_text("name,num_rows,dim,pooling_factor\nhuge,6000000000,128,10\nsmall,1000000,64,5\n")
    assert main(["embeddings", "--tables", str(tables), "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "host memory (UVM)" in err and "fullest host" in err and err.count("\n") == 1
    assert main(["embeddings", "--tables", str(tables), "--gpus", "16", "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    per_host, cap = out["max_host_bytes"], out["host_memory_bytes"]
    table_bytes = 6e9 * 128 * 4
    # the whole table lives in host memory (the HBM caches hold copies): half of it per host
    assert table_bytes / 2 <= per_host <= cap
    # GB200: each Grace holds its two GPUs' share, 480 GB; 8 billion rows (4.1 TB) over 8
    # Graces overflow them, though the rack's 17 TB pooled would not
    tables.write_text("name,num_rows,dim,pooling_factor\nhuge,8000000000,128,10\n")
    assert main(["embeddings", "--tables", str(tables), "--gpus", "16", "--cluster", "gb200-nvl72"]) == 2
    assert "fullest host" in capsys.readouterr().err


def test_expert_buffering_needs_host_dram_for_the_rest(capsys):
    # DeepSeek-V3 in bf16, a tenth of its experts cached in HBM: every expert in host memory,
    # ~152 GiB per GPU; a DGX A100 (320GB) node has 1 TB for 8 GPUs, a DGX H100 2 TB
    base = ["serve", "--model", "deepseek-v3", "--tp", "8", "--expert-cache", "0.1", "--weights", "bf16"]
    assert main(base + ["--cluster", "dgx-a100-40gb"]) == 2
    err = capsys.readouterr().err
    assert "experts held in host memory" in err and "host's DRAM" in err
    assert main(base + ["--cluster", "dgx-h100", "--json"]) == 0
