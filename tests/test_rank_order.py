"""Rank order (plan/axes.py RankOrder): which parallel dimension is outermost in rank space.
The group placement (plan/placement.py) is checked against a rank-by-rank layout of both
orders; the cost model's consequences on a cluster of pods joined at 1:7 (Llama 3's, Dubey
et al. 2024 Sec. 3.3.1): with data parallelism outermost no pipeline send leaves a pod and
the gradient reduction does; the search offers the second order only where it places a group
differently; the engines that cannot build it refuse it, and Megatron-LM gets its flag."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from paraplan.cli import main
from paraplan.errors import SpecError
from paraplan.cost.evaluate import evaluate
from paraplan.plan.axes import RankOrder, ZeroStage
from paraplan.plan.placement import members_within, pipeline_crossings, rank_orders_differ
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch, SpaceLimits, check_plan, enumerate_space
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

DP_OUTER = RankOrder.TP_CP_PP_DP


def rank(order: RankOrder, t, c, p, d, T, C, P, D):
    """Global rank of (tp, cp, pp, dp) coordinates, fastest dimension first."""
    if order is RankOrder.TP_CP_DP_PP:
        return t + T * (c + C * (d + D * p))
    return t + T * (c + C * (p + P * d))


@pytest.mark.parametrize("order", list(RankOrder))
def test_data_parallel_groups_fall_in_domains_as_a_rank_walk_places_them(order):
    """Members of the CP×DP group of rank 0 in rank 0's domain, and the pipeline's sends that
    leave a domain, against the ranks laid out one by one."""
    for T, C, P, D, dom in itertools.product((1, 2, 8), (1, 2, 4), (1, 2, 3, 4, 8), (1, 2, 3, 4, 16), (8, 64, 72)):
        group = [rank(order, 0, c, 0, d, T, C, P, D) for c in range(C) for d in range(D)]
        walk = sum(1 for r in group if r // dom == 0)
        if order is RankOrder.TP_CP_DP_PP:
            got = members_within(dom, C * D, T)
        else:
            got = members_within(dom, C * D, T, C, T * C * P)
        # (the group count assumes domains aligned to the group's power-of-two runs)
        if (C * D * P) % 3 and dom != 72:
            assert int(got) == walk, (order, T, C, P, D, dom)
        # the pipelines: a hop of replica d crosses when some rank of its TP×CP block and its
        # peer in the next stage lie in two domains; the step waits for the slowest replica
        walk = max(sum(1 for p in range(P - 1)
                       if any(rank(order, t, c, p, d, T, C, P, D) // dom != rank(order, t, c, p + 1, d, T, C, P, D) // dom
                              for t in range(T) for c in range(C)))
                   for d in range(D))
        stride = T * C * D if order is RankOrder.TP_CP_DP_PP else T * C
        spacing = 0 if order is RankOrder.TP_CP_DP_PP else T * C * P
        assert pipeline_crossings(P, stride, T * C, dom, D, spacing) == walk, (order, T, C, P, D, dom)


LLAMA405 = load_model("llama3.1-405b")
PODS = load_cluster("llama3-roce-24k", num_gpus=16384)
WL = Workload(global_batch_size=2048, seq_len=8192)


def costs(cluster, order, **kw):
    base = dict(tp=8, pp=16, dp=128, vp=8, micro_batch_size=1, zero=ZeroStage.OPTIMIZER, sequence_parallel=True)
    base.update(kw)
    return evaluate(LLAMA405, cluster, WL, PlanBatch.from_plans([make_plan(rank_order=order, **base)]))


def test_on_pods_data_parallelism_outermost_keeps_the_pipeline_in_a_pod():
    """Llama 3's layout, TP8 PP16 DP128 on 16,384 GPUs in pods of 3,072: with the pipeline
    outermost its stages sit 1,024 ranks apart and 5 of 15 sends leave a pod (over the 1:7
    aggregation layer); with data parallelism outermost a pipeline spans 128 ranks and none
    does, while the DP groups now span the pods."""
    flat = replace(PODS, gpus_per_island=0, dcn=None)
    assert pipeline_crossings(16, 1024, 8, 3072) == 5 and pipeline_crossings(16, 8, 8, 3072) == 0
    pp_outer, dp_outer = costs(PODS, RankOrder.TP_CP_DP_PP), costs(PODS, DP_OUTER)
    # the hand-off: unchanged by the pods with data parallelism outermost, slower without it
    assert float(dp_outer.p2p_s[0]) == pytest.approx(float(costs(flat, DP_OUTER).p2p_s[0]))
    assert float(pp_outer.p2p_s[0]) > 1.2 * float(costs(flat, RankOrder.TP_CP_DP_PP).p2p_s[0])
    # the gradient reduction crosses the pods only with data parallelism outermost
    assert float(pp_outer.time.dp_comm_s[0]) == pytest.approx(float(costs(flat, RankOrder.TP_CP_DP_PP).time.dp_comm_s[0]))
    assert float(dp_outer.time.dp_comm_s[0]) > float(costs(flat, DP_OUTER).time.dp_comm_s[0])


def test_the_search_offers_the_second_order_only_where_it_costs_differently():
    """A plan and its twin in the other order are never both offered at the same time: where
    the orders place every group alike the default stands alone."""
    model = load_model("llama3-8b")
    islands = replace(load_cluster("h100-pathways-islands", num_gpus=64), gpus_per_island=32)
    wl = Workload(global_batch_size=128, seq_len=4096)
    for cluster in (load_cluster("dgx-h100", num_gpus=64), islands):
        plans, times = [], []
        for batch, _ in enumerate_space(model, cluster, wl, SpaceLimits(recomputes=(SpaceLimits().recomputes[0],)),
                                        fixed={"micro_batch_size": 1}):
            plans += [batch.plan(i) for i in range(len(batch))]
            times += list(np.asarray(evaluate(model, cluster, wl, batch).time.total))
        by_plan = dict(zip(plans, times))
        twins = [(p, replace(p, rank_order=RankOrder.TP_CP_DP_PP)) for p in plans if p.rank_order is DP_OUTER]
        assert twins, cluster.name
        for p, q in twins:
            assert q in by_plan and by_plan[p] != by_plan[q], (cluster.name, p.describe())
            assert rank_orders_differ(p.tp, p.cp, p.pp, p.dp, [p.dp_shard], cluster.gpus_per_node,
                                      cluster.gpus_per_island)
    # one node: nothing to place differently
    assert not rank_orders_differ(2, 1, 2, 2, [2], 8)


def test_experts_with_data_parallelism_outermost_need_ep_etp_equal_to_tp_cp():
    model = load_model("mixtral-8x7b")
    cluster = load_cluster("dgx-h100", num_gpus=64)
    wl = Workload(global_batch_size=256, seq_len=4096)
    base = dict(tp=2, pp=4, dp=8, vp=1, micro_batch_size=1, sequence_parallel=True, zero=ZeroStage.OPTIMIZER,
                rank_order=DP_OUTER)
    bad = check_plan(make_plan(ep=8, **base), model, cluster, wl)
    assert bad is not None and "EP×ETP = TP×CP" in bad.reason
    assert check_plan(make_plan(ep=2, **base), model, cluster, wl) is None
    assert check_plan(make_plan(ep=8, **{**base, "rank_order": RankOrder.TP_CP_DP_PP}), model, cluster, wl) is None


def test_engines_build_what_they_can(capsys):
    from paraplan.export import megatron, torchtitan
    plan = make_plan(tp=8, pp=4, dp=4, vp=1, micro_batch_size=1, sequence_parallel=True, zero=ZeroStage.OPTIMIZER,
                     rank_order=DP_OUTER)
    model, wl = load_model("llama3-70b"), Workload(global_batch_size=64, seq_len=4096)
    assert "--use-tp-pp-dp-mapping" in [str(a) for a in megatron.arguments(plan, model, wl)]
    assert "--use-tp-pp-dp-mapping" not in [str(a) for a in megatron.arguments(
        replace(plan, rank_order=RankOrder.TP_CP_DP_PP), model, wl)]
    with pytest.raises(SpecError, match="CP·EP ≤ 1"):
        megatron.check(replace(plan, cp=2, dp=2), model, wl)
    with pytest.raises(SpecError, match="pipeline outermost"):
        torchtitan.check(torchtitan.SUPPORT.adapt(replace(plan, zero=ZeroStage.PARAMETERS)), model, wl)
    # torchtitan's search never proposes it; the CLI says so when asked
    code = main(["search", "--model", "llama3-70b", "--gpus", "128", "--engine", "torchtitan",
                 "--rank-order", "tp-cp-pp-dp", "--json"])
    err = capsys.readouterr().err
    assert code == 2 and "--rank-order" in err and err.count("\n") == 1


def test_bad_rank_order_is_one_line(capsys, tmp_path):
    code = main(["estimate", "--model", "llama3-8b", "--gpus", "16", "--pp", "2", "--rank-order", "dp-first"])
    err = capsys.readouterr().err
    assert code == 2 and "rank_order" in err and "tp-cp-pp-dp" in err and err.count("\n") == 1
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "validation" / "llama3_herd_table4.csv"
    bad = tmp_path / "bad.csv"
    bad.write_text(src.read_text().replace(",tp-cp-pp-dp,", ",pp-first,"))
    main(["validate", str(bad), "--json"])  # the row is skipped naming the cell; others are predicted
    import json
    skipped = [r["skipped"] for r in json.loads(capsys.readouterr().out)["rows"] if r["skipped"]]
    assert any("rank_order" in s and "'pp-first'" in s and "bad.csv:2" in s for s in skipped)


def test_asking_for_one_order_keeps_the_layouts_where_the_orders_agree():
    """--rank-order tp-cp-pp-dp narrows the plans where the order matters; a layout that places
    every group alike under both (PP = 1 here) stays in the space, as the one plan it is."""
    model, wl = load_model("llama3-8b"), Workload(global_batch_size=64, seq_len=4096)
    cluster = load_cluster("dgx-h100", num_gpus=32)
    seen = set()
    for batch, _ in enumerate_space(model, cluster, wl, SpaceLimits(rank_orders=(DP_OUTER,)),
                                    fixed={"micro_batch_size": 1, "tp": 2}):
        seen |= set(zip(batch.pp.tolist(), batch.dp.tolist(), batch.rank_order_code.tolist()))
    assert (1, 16, RankOrder.TP_CP_DP_PP.code) in seen and (2, 8, DP_OUTER.code) in seen
    assert (2, 8, RankOrder.TP_CP_DP_PP.code) not in seen  # TP2 PP2 DP8: the orders differ
