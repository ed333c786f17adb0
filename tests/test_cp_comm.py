"""Context-parallel K/V exchange: ring (p2p), all-gather (Llama 3) and all-to-all (Ulysses).

The three move K/V differently; the tests check the properties their papers state, not the
formulas: the ring and the all-gather move the same bytes and differ in what they hide;
Ulysses' per-rank volume stays flat as sequence and CP grow together (Jacobs et al. 2023,
Sec. 3.2), while an all-gather's grows with the group.
"""

from __future__ import annotations

import json

from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.cost.estimate import estimate
from paraplan.plan.axes import CPCommType, Recompute
from paraplan.plan.plan import make_plan
from paraplan.plan.space import SpaceLimits, check_plan, enumerate_space
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload


def _cp_per_layer_mb(est, total: bool) -> float:
    """CP time per layer and micro-batch (pp = 1, no recomputation)."""
    t = est.time.cp_comm_s + (est.overlapped.cp_comm_s if total else 0.0)
    return t / (est.num_microbatches * load_model("llama3-8b").num_layers)


def _llama8b(cp: int, kind: CPCommType, seq_per_rank: int = 8192):
    cluster = load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=8 // cp, seq_len=seq_per_rank * cp)
    plan = make_plan(cp=cp, dp=8 // cp, cp_comm_type=kind, recompute=Recompute.NONE)
    return estimate(load_model("llama3-8b"), cluster, wl, plan)


def test_search_tries_every_exchange_only_when_cp_is_above_one():
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=16)
    wl = Workload(global_batch_size=16, seq_len=32768)
    codes = {}
    for cp in (1, 4):
        seen = set()
        for batch, _ in enumerate_space(model, cluster, wl, SpaceLimits(), fixed={"cp": cp, "tp": 1}):
            seen |= set(batch.cp_comm_type_code.tolist())
        codes[cp] = seen
    assert codes[1] == {CPCommType.P2P.code}
    assert codes[4] == {k.code for k in CPCommType}


def test_validity_rules_name_the_exchange():
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100", num_gpus=64)  # 64 heads, 8 kv heads
    wl = Workload(global_batch_size=8, seq_len=65536)
    rej = check_plan(make_plan(tp=8, cp=8, dp=1, cp_comm_type=CPCommType.A2A, sequence_parallel=True), model, cluster, wl)
    assert rej is not None and "Ulysses" in rej.reason and "kv_heads=8" in rej.reason
    assert check_plan(make_plan(tp=1, cp=8, dp=8, cp_comm_type=CPCommType.A2A), model, cluster, wl) is None
    rej = check_plan(make_plan(tp=8, cp=1, dp=8, cp_comm_type=CPCommType.ALL_GATHER, sequence_parallel=True),
                     model, cluster, wl)
    assert rej is not None and "needs CP>1" in rej.reason


def test_ring_and_allgather_move_the_same_bytes_but_the_ring_hides_more():
    ring = _llama8b(4, CPCommType.P2P, seq_per_rank=16384)
    gather = _llama8b(4, CPCommType.ALL_GATHER, seq_per_rank=16384)
    total_ring, total_gather = _cp_per_layer_mb(ring, True), _cp_per_layer_mb(gather, True)
    assert total_gather == pytest.approx(total_ring, rel=0.1)
    assert _cp_per_layer_mb(ring, False) < _cp_per_layer_mb(gather, False)
    assert ring.step_time_s < gather.step_time_s
    assert "CP K/V all-gather" in gather.comm_detail and "CP ring send/recv" in ring.comm_detail


def test_ulysses_volume_stays_flat_as_sequence_and_cp_grow_together():
    # tokens per rank fixed at 8k, CP 2 -> 8 inside one NVLink node (Jacobs et al. 2023 Sec. 3.2)
    uly = [_cp_per_layer_mb(_llama8b(c, CPCommType.A2A), True) for c in (2, 8)]
    gather = [_cp_per_layer_mb(_llama8b(c, CPCommType.ALL_GATHER), True) for c in (2, 8)]
    # Ulysses: (c-1)/c of a constant buffer (1/2 -> 7/8), in smaller messages; all-gather:
    # c-1 K/V chunks received (1 -> 7)
    assert uly[1] / uly[0] < 2.5
    assert gather[1] / gather[0] > 5.0 and gather[1] / gather[0] > 2.0 * uly[1] / uly[0]
    # Ulysses hides nothing: all of it is on the critical path
    est = _llama8b(8, CPCommType.A2A)
    assert est.overlapped.cp_comm_s == 0.0 and est.time.cp_comm_s > 0.0


def test_cli_cp_comm_flag(capsys):
    base = ["estimate", "--model", "llama3-8b", "--gpus", "8", "--seq", "32768", "--batch", "8"]
    assert main(base + ["--cp", "4", "--dp", "2", "--cp-comm", "allgather", "--json"]) == 0
    assert "CP4/allgather" in capsys.readouterr().out
    assert main(base + ["--cp", "1", "--cp-comm", "a2a"]) == 2
    err = capsys.readouterr().err
    assert "needs CP>1" in err and "Traceback" not in err
    assert main(base + ["--cp", "4", "--dp", "2", "--cp-comm", "ring"]) == 2
    assert "allowed: p2p, allgather, a2a" in capsys.readouterr().err
    assert main(["search", "--model", "llama3-8b", "--gpus", "8", "--seq", "32768", "--batch", "8", "--cp", "4",
                 "--cp-comm", "a2a", "--top", "1", "--json"]) == 0
    assert "CP4/a2a" in capsys.readouterr().out


def test_a_ring_that_leaves_the_node_runs_at_network_speed():
    model, wl = load_model("llama3-8b"), Workload(global_batch_size=1, seq_len=131072)
    plan = make_plan(tp=8, cp=2, dp=1, sequence_parallel=True)  # 16 GPUs: the CP pair spans two nodes
    two_nodes = load_cluster("dgx-h100", num_gpus=16)
    one_domain = replace(two_nodes, gpus_per_node=16)  # the same links, one 16-GPU NVLink domain
    ring = [estimate(model, c, wl, plan) for c in (two_nodes, one_domain)]
    total = [e.time.cp_comm_s + e.overlapped.cp_comm_s for e in ring]
    assert total[0] > 4.0 * total[1]  # 50 GB/s per GPU over InfiniBand against 450 GB/s NVLink


def test_recomputing_attention_repeats_its_cp_exchange():
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=1, seq_len=65536)
    cp = {rc: estimate(model, cluster, wl, make_plan(cp=8, dp=1, cp_comm_type=CPCommType.A2A, recompute=rc)).time.cp_comm_s
          for rc in (Recompute.NONE, Recompute.SELECTIVE)}
    # Ulysses moves the same all-to-alls forward and backward: one more forward is +50%
    assert cp[Recompute.SELECTIVE] / cp[Recompute.NONE] == pytest.approx(1.5, rel=0.05)


def test_search_restricted_to_an_impossible_exchange_says_why(capsys):
    base = ["search", "--model", "llama3-8b", "--gpus", "16", "--seq", "32768", "--batch", "16", "--top", "1"]
    assert main(base + ["--cp", "16", "--cp-comm", "a2a"]) == 2
    err = capsys.readouterr().err
    assert "--cp-comm='a2a'" in err and "kv_heads=8" in err and err.count("\n") == 1
    assert main(base + ["--cp", "1", "--cp-comm", "allgather"]) == 2
    assert "needs CP>1" in capsys.readouterr().err


def test_malformed_cp_comm_cell_skips_its_row(tmp_path, capsys):
    src = Path(__file__).resolve().parents[1] / "validation" / "llama3_herd_table4.csv"
    bad = tmp_path / "bad.csv"
    bad.write_text(src.read_text().replace(",allgather,", ",ringx,"))
    assert main(["validate", str(bad), "--json"]) == 0  # the other rows are still predicted
    out = capsys.readouterr().out
    skipped = [r["skipped"] for r in json.loads(out)["rows"] if r["skipped"]]
    assert skipped and all("cp_comm_type" in s and "'ringx'" in s for s in skipped)
    assert any("bad.csv:4" in s for s in skipped)
