"""Pipeline sends between nodes (cost/comm.py pipeline_crossings, pipeline_hops_s): the
training hand-off (cost/evaluate.py) and the serving hop (inference/step.py) count the sends
that leave a node and price only those on the network."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.cost.evaluate import evaluate
from paraplan.plan.axes import Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

LLAMA8 = load_model("llama3-8b")
WL = Workload(global_batch_size=64, seq_len=4096)


def test_a_pipeline_send_that_leaves_the_node_crosses_the_network():
    from paraplan.inference.deploy import ServePlan
    from paraplan.inference.step import IterationModel
    cluster = load_cluster("dgx-h100", num_gpus=16)
    slow_net = replace(cluster, scaleout=replace(cluster.scaleout, bw_unidir_bytes_per_s=cluster.scaleout.bw_unidir_bytes_per_s / 100))
    llama70 = load_model("llama3-70b")

    def hops(cl, tp, pp):
        return IterationModel(llama70, cl, ServePlan(tp=tp, pp=pp))._hop_s(4096)

    # TP4 PP4 on two nodes: stages 0-1 on one node, 2-3 on the other; one of three sends crosses
    total, slowest = hops(cluster, 4, 4)
    total_slow, slowest_slow = hops(slow_net, 4, 4)
    assert slowest_slow > slowest and total_slow - total == pytest.approx(slowest_slow - slowest, rel=1e-9)
    assert hops(slow_net, 4, 2) == hops(cluster, 4, 2)  # one node: NVLink only
    t8, s8 = hops(slow_net, 8, 2)  # TP fills the node: every send crosses
    assert t8 == pytest.approx(s8) and s8 == pytest.approx(slowest_slow)


def test_a_training_pipeline_crosses_the_network_only_between_nodes():
    """Stages t·c·d ranks apart: with t·c·d < a node, one send of PP4 × 4 ranks on two nodes
    crosses the network, and a hand-off costs the mean of the three."""
    cluster = load_cluster("dgx-h100", num_gpus=16)
    slow = replace(cluster, scaleout=replace(cluster.scaleout, bw_unidir_bytes_per_s=cluster.scaleout.bw_unidir_bytes_per_s / 100))

    def hand_off(cl, **kw):
        return float(np.asarray(evaluate(LLAMA8, cl, WL, PlanBatch.from_plans([make_plan(**kw)])).p2p_s)[0])

    split = dict(tp=2, pp=4, dp=2, zero=ZeroStage.OPTIMIZER)       # stages 4 ranks apart: 1 of 3 sends leaves
    across = dict(tp=2, pp=2, dp=4, zero=ZeroStage.OPTIMIZER)       # stages a node apart: every send leaves
    inside = dict(tp=2, pp=4, zero=ZeroStage.OPTIMIZER)              # 8 GPUs: none leaves
    one_node = load_cluster("dgx-h100", num_gpus=8)
    assert hand_off(slow, **across) > 10 * hand_off(cluster, **across)
    grown = hand_off(slow, **split) - hand_off(cluster, **split)
    assert grown == pytest.approx((hand_off(slow, **across) - hand_off(cluster, **across)) / 3, rel=1e-6)
    assert hand_off(replace(one_node, scaleout=slow.scaleout), **inside) == hand_off(one_node, **inside)


def test_pipeline_crossings_count_what_a_rank_by_rank_walk_counts():
    from paraplan.cost.comm import pipeline_crossings
    for G in (8, 72):  # a DGX node, a GB200 NVL72 rack
        for s in range(1, 2 * G, 3):
            for p in range(2, 12):
                walk = sum(1 for i in range(1, p) if any(((i - 1) * s + k) // G != (i * s + k) // G for k in range(s)))
                assert pipeline_crossings(p, s, s, G) == walk, (G, s, p)
    # vectorized, as evaluate calls it: TP16 stages on 72-GPU racks straddle a rack
    got = pipeline_crossings(np.array([8.0, 4.0, 2.0, 16.0]), np.array([16.0, 32.0, 64.0, 8.0]),
                             np.array([16.0, 32.0, 64.0, 8.0]), 72)
    assert got.tolist() == [2.0, 2.0, 1.0, 1.0]


def test_an_interleaved_pipeline_wraps_around_to_the_first_node():
    cluster = load_cluster("dgx-h100", num_gpus=16)
    slow = replace(cluster, scaleout=replace(cluster.scaleout, bw_unidir_bytes_per_s=cluster.scaleout.bw_unidir_bytes_per_s / 100))

    def hand_off(cl, **kw):
        return float(np.asarray(evaluate(LLAMA8, cl, WL, PlanBatch.from_plans([make_plan(**kw)])).p2p_s)[0])

    base = dict(tp=2, pp=4, dp=2, zero=ZeroStage.OPTIMIZER)
    inter = dict(base, vp=2, schedule=Schedule.INTERLEAVED_1F1B)
    far = dict(tp=2, pp=2, dp=4, zero=ZeroStage.OPTIMIZER)  # every send leaves the node
    step_far = hand_off(slow, **far) - hand_off(cluster, **far)
    # 1F1B: 1 of 3 sends leaves; interleaved over v = 2: 2 of its 6 sends down, and the 1 back
    assert hand_off(slow, **base) - hand_off(cluster, **base) == pytest.approx(step_far / 3, rel=1e-6)
    assert hand_off(slow, **inter) - hand_off(cluster, **inter) == pytest.approx(step_far * 3 / 7, rel=1e-6)
