"""Each Plan field is declared once (plan/plan.py `axis`): PlanBatch's columns, their names
and codecs, and the flags and bounds derive from that declaration."""

from __future__ import annotations

from dataclasses import fields

from paraplan.plan.axes import CPCommType, RankOrder, Recompute, RecomputeOps, Schedule, ZeroStage
from paraplan.plan.plan import COLUMNS, Plan, make_plan
from paraplan.plan.space import DEGREES, PlanBatch, check_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload


def test_the_batch_columns_are_the_plan_fields():
    assert [c.field for c in COLUMNS] == [f.name for f in fields(Plan)]
    assert {c.name for c in COLUMNS} == {f.name for f in fields(PlanBatch)}
    assert {c.name for c in COLUMNS if c.name != c.field} == {
        "cp_comm_type_code", "rank_order_code", "schedule_code", "recompute_code", "zero_code", "attention_code",
        "capacity_factor_value", "grad_compression_code", "recompute_ops_code"}


def test_plans_round_trip_through_a_batch():
    plans = [make_plan(tp=2, pp=4, dp=8, vp=2, schedule=Schedule.INTERLEAVED_1F1B, recompute=Recompute.FIRST_K,
                       recompute_num_layers=2, zero=ZeroStage.PARAMETERS, dp_shard=4, cp_comm_type=CPCommType.A2A,
                       rank_order=RankOrder.TP_CP_PP_DP, capacity_factor=1.25, ep_overlap=True),
             make_plan(), make_plan(sequence_parallel=True, tp_overlap=True, dp_overlap=False, compiled=True,
                                    recompute=Recompute.SET, recompute_ops=RecomputeOps.parse("qkv,act", "ops"))]
    batch = PlanBatch.from_plans(plans)
    assert [batch.plan(i) for i in range(len(plans))] == plans
    assert batch.capacity_factor_value.tolist() == [1.25, 0.0, 0.0]  # no capacity factor (dropless) as 0.0
    assert batch.schedule_code.tolist() == [p.schedule_code for p in plans]
    assert batch.recompute_ops_code.tolist() == [0, 0, 2 + 128]  # the ops' bits (qkv is code 1, act 7)


def test_declared_metadata():
    meta = {f.name: f.metadata for f in fields(Plan)}
    assert meta["micro_batch_size"]["flag"] == "--mb" and meta["recompute_num_layers"]["flag"] == "--recompute-layers"
    assert DEGREES == ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "micro_batch_size", "powersgd_rank")
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=8)
    rejected = check_plan(make_plan(tp=8, vp=0), model, cluster, Workload(global_batch_size=8, seq_len=2048))
    assert rejected is not None and rejected.reason == "vp=0 must be >= 1"
