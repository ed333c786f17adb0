"""`paraplan trace`: what each task's sub-operations show (layers as the cost model lays them
out, backward order, ZB-H1's B/W split, MoE entries, communication tags) and the per-step
work after the pipeline."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from support import run

from paraplan.cost.chunks import chunk_layers
from paraplan.cost.estimate import estimate
from paraplan.cost.layout import layout
from paraplan.plan.axes import Schedule
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload


def _trace(capsys, tmp_path, *argv):
    path = tmp_path / "t.json"
    code, _, err = run(capsys, "trace", *argv, "-o", str(path))
    assert code == 0, err
    trace = json.loads(path.read_text())
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    tasks = [e for e in xs if e["tid"] == 0 and e["cat"] != "bubble"]
    return trace, xs, tasks


def _ops(xs, task):
    """The sub-operations inside `task` (thread 1 of its rank)."""
    end = task["ts"] + task["dur"]
    return [o for o in xs if o["pid"] == task["pid"] and o["tid"] == 1 and task["ts"] <= o["ts"] < end]


LLAMA_VP = ("--model", "llama3-70b", "--gpus", "64", "--seq", "4096", "--batch", "32", "--tp", "4", "--pp", "4",
            "--vp", "3", "--schedule", "interleaved")


def test_layers_follow_the_cost_models_layout(capsys, tmp_path):
    # 80 layers in 4 × 3 chunks of 7 slots: the embedding and the loss take one slot each and
    # the 2 spare slots come off middle ranks; no chunk draws 3 layers over a 7-layer span
    trace, xs, tasks = _trace(capsys, tmp_path, *LLAMA_VP)
    model = load_model("llama3-70b")
    layout_ = chunk_layers(model, Workload(global_batch_size=32, seq_len=4096),
                           make_plan(tp=4, pp=4, dp=4, vp=3, schedule=Schedule.INTERLEAVED_1F1B))
    assert [len(r) for r in layout_] == [6, 7, 7, 7, 7, 7, 7, 7, 7, 6, 6, 6]
    seen = set()
    for t in (t for t in tasks if t["args"]["microbatch"] == 0 and t["args"]["phase"] == "F"):
        span = layout_[t["args"]["virtual_stage"]]
        ops = _ops(xs, t)
        assert sorted({o["args"]["layer"] for o in ops}) == list(span)
        assert t["args"]["layers"] is not None and f"L{span[0]}-{span[-1]}" in t["args"]["layers"]
        seen.update(span)
    assert seen == set(range(80))
    first = next(t for t in tasks if t["args"]["virtual_stage"] == 0)
    last = next(t for t in tasks if t["args"]["virtual_stage"] == 11)
    assert first["args"]["layers"] == "embedding, L0-5" and last["args"]["layers"] == "L74-79, LM head + loss"


@pytest.mark.parametrize("l, p, v", [(80, 4, 3), (80, 4, 1), (126, 16, 8), (80, 41, 2), (61, 3, 7), (5, 2, 2),
                                     (32, 8, 4), (30, 4, 4), (12, 1, 1), (13, 3, 4)])
def test_chunk_layers_count_what_the_cost_model_times(l, p, v):
    model = replace(load_model("llama3-8b"), num_layers=l)
    plan = make_plan(pp=p, vp=v, schedule=Schedule.INTERLEAVED_1F1B if v > 1 else Schedule.ONE_F_ONE_B)
    wl = Workload(global_batch_size=p * 4, seq_len=1024)
    spans = chunk_layers(model, wl, plan)
    lay = layout(model, wl, PlanBatch.from_plans([plan]))
    per_rank = [sum(len(spans[c * p + r]) for c in range(v)) for r in range(p)]
    assert [x for s in spans for x in s] == list(range(l))  # every layer once, in order
    L_s, L_first, L_last = (float(np.ravel(x)[0]) for x in (lay.stage_layers, lay.first_stage_layers, lay.last_stage_layers))
    timed = [L_first] + [L_s] * (p - 2) + [L_last] if p > 1 else [L_s]
    # no stage holds more layers than the cost model times it with; the spare slots beyond the
    # embedding's and the loss's come off the middle stages while they have chunks to give
    assert all(n <= t for n, t in zip(per_rank, timed))
    if sum(timed) - l <= max(p - 2, 0) * v:
        assert (per_rank[0], per_rank[-1]) == (L_first, L_last)  # the middle stages are timed full (conservative)


def test_backward_runs_layers_last_to_first(capsys, tmp_path):
    _, xs, tasks = _trace(capsys, tmp_path, *LLAMA_VP)
    b = next(t for t in tasks if t["args"]["phase"] == "B")
    layers = [o["args"]["layer"] for o in _ops(xs, b)]
    assert layers == sorted(layers, reverse=True) and len(set(layers)) > 1
    f = next(t for t in tasks if t["args"]["phase"] == "F")
    layers = [o["args"]["layer"] for o in _ops(xs, f)]
    assert layers == sorted(layers)


MIXTRAL_ZB = ("--model", "mixtral-8x7b", "--gpus", "64", "--seq", "4096", "--batch", "64", "--tp", "2", "--pp", "4",
              "--ep", "8", "--schedule", "zb", "--moe-imbalance", "1.3")


def _mixtral_zb():
    """The estimate of the plan MIXTRAL_ZB's flags make."""
    cluster = load_cluster("dgx-h100", num_gpus=64)
    return estimate(load_model("mixtral-8x7b"), cluster, Workload(global_batch_size=64, seq_len=4096, moe_imbalance=1.3),
                    make_plan(tp=2, pp=4, dp=8, ep=8, schedule=Schedule.ZERO_BUBBLE, sequence_parallel=True,
                              attention=cluster.gpu.attention_kernels[-1]))


def test_zero_bubble_w_shows_the_weight_gradient_gemms_and_b_the_rest(capsys, tmp_path):
    _, xs, tasks = _trace(capsys, tmp_path, *MIXTRAL_ZB)
    est = _mixtral_zb()
    assert est.plan.describe() == "TP2 PP4 DP8 EP8 mb1 zb SP rc:none attn:flash3"
    bwd, wgrad = est.layer_detail["bwd"], est.layer_detail["wgrad"]
    b = next(t for t in tasks if t["args"]["phase"] == "B" and t["pid"] == 1)
    w = next(t for t in tasks if t["args"]["phase"] == "W" and t["pid"] == 1)
    b_ops, w_ops = _ops(xs, b), _ops(xs, w)
    assert all("(wgrad)" in o["name"] for o in w_ops)
    assert not any("wgrad" in o["name"] for o in b_ops) and any("GEMMs (dgrad)" in o["name"] for o in b_ops)
    layer = b_ops[0]["args"]["layer"]
    b_s = sum(o["args"]["modelled_s"] for o in b_ops if o["args"]["layer"] == layer)
    w_s = sum(o["args"]["modelled_s"] for o in w_ops if o["args"]["layer"] == layer)
    assert w_s == pytest.approx(sum(wgrad.values()))  # the dense and the experts' weight-gradient GEMMs
    assert b_s + w_s == pytest.approx(sum(bwd.values()))  # together one whole backward, once
    # the W task is exactly its weight-gradient GEMMs (nothing else is in a W pass)
    assert w_ops[0]["args"]["scale"] == pytest.approx(1.0)


def test_moe_experts_beside_their_imbalance_and_all_to_all_is_communication(capsys, tmp_path):
    _, xs, tasks = _trace(capsys, tmp_path, *MIXTRAL_ZB)
    fwd = _mixtral_zb().layer_detail["fwd"]
    f = next(t for t in tasks if t["args"]["phase"] == "F")
    ops = {o["name"].rsplit(" L", 1)[0]: o for o in _ops(xs, f) if o["args"]["layer"] == _ops(xs, f)[0]["args"]["layer"]}
    experts, imbalance = ops["MoE experts at λ = 1 (grouped GEMMs)"], ops["MoE load imbalance (in experts)"]
    assert imbalance["args"]["modelled_s"] > 0
    # the two laid end to end are the experts' modelled time, imbalance included, once
    est = _mixtral_zb()
    assert experts["args"]["modelled_s"] + imbalance["args"]["modelled_s"] == pytest.approx(
        float(est.layer_detail["fwd"]["MoE experts at λ = 1 (grouped GEMMs)"])
        + float(est.layer_detail["fwd"]["MoE load imbalance (in experts)"]))
    assert sum(o["args"]["modelled_s"] for o in ops.values()) == pytest.approx(sum(fwd.values()))
    assert ops["EP all-to-all"]["cat"] == "comm" and ops["TP collectives"]["cat"] == "comm"
    assert ops["QKV GEMM"]["cat"] == "compute"


def test_dp_collectives_and_optimizer_end_the_trace_at_the_step_time(capsys, tmp_path):
    trace, xs, tasks = _trace(capsys, tmp_path, *LLAMA_VP)
    after = [e for e in xs if e["tid"] == 2]
    assert {e["pid"] for e in after} == {0, 1, 2, 3}
    names = [e["name"] for e in after if e["pid"] == 0]
    assert "optimizer step" in names and "DP/ZeRO collectives (exposed)" in names
    pipeline_end = max(t["ts"] + t["dur"] for t in tasks)
    assert min(e["ts"] for e in after) == pytest.approx(pipeline_end)
    end = max(e["ts"] + e["dur"] for e in xs)
    assert end == pytest.approx(trace["otherData"]["step_time_s"] * 1e6, rel=1e-9)
