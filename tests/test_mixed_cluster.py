"""Mixed clusters (issue 35 items 1-2): GPU groups, pipelines placed on them, cross-mesh
resharding at their boundaries, the search, and the commands."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from paraplan.cost.estimate import estimate
from paraplan.cost.mixed import FIRST, LAST, MIDDLE, estimate_mixed, price_proxies, proxy_key
from paraplan.cost.reshard import BoundaryLayout, crossing_volumes, direct_volumes, reshard
from paraplan.cost.stage_memory import plan_memory_total
from paraplan.errors import FileFormatError, SpecError
from paraplan.plan.axes import Recompute, Schedule, ZeroStage
from paraplan.plan.mixed import MixedPlan, MixedStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch
from paraplan.search.mixed import _GroupTable, _balanced_layers, search_mixed
from paraplan.sim.engine import StageCosts, simulate_schedule
from paraplan.sim.schedules import ScheduleError
from paraplan.specs.catalog import load_cluster, load_mixed_cluster, load_model
from paraplan.specs.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "h100-a100-mixed.toml"
LINK = """
[between_groups]
gbit_per_s = 400.0
latency_us = 5.0
efficiency_bytes = [1e4, 1e5, 1e6, 1e7, 1e8, 1e9]
efficiency = [0.05, 0.2, 0.5, 0.8, 0.9, 0.92]
"""
TWO_H100 = """name = "h100-h100"
[[group]]
name = "a"
cluster = "dgx-h100"
num_gpus = 256
[[group]]
name = "b"
cluster = "dgx-h100"
num_gpus = 256
""" + LINK
WL = Workload(global_batch_size=512, seq_len=8192)


@pytest.fixture(scope="module")
def llama70b():
    return load_model("llama3-70b")


@pytest.fixture(scope="module")
def example():
    return load_mixed_cluster(EXAMPLE)


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "mixed.toml"
    path.write_text(text)
    return path


# ---- the cluster file ----------------------------------------------------------------------

def test_example_loads_with_each_groups_preset_and_count(example):
    assert [(g.name, g.num_gpus, g.cluster.gpu.name) for g in example.groups] == [
        ("h100", 512, "h100-sxm-80gb"), ("a100", 512, "a100-sxm-80gb")]
    assert example.num_gpus == 1024
    assert example.between_groups.bw_unidir_bytes_per_s == pytest.approx(200e9 / 8)


@pytest.mark.parametrize("text, says", [
    (TWO_H100.replace(LINK, ""), "between_groups"),
    (TWO_H100.replace('name = "b"', 'name = "a"'), "a name used by one group only"),
    (TWO_H100.replace('cluster = "dgx-h100"\nnum_gpus = 256\n[[group]]', 'cluster = "no-such"\nnum_gpus = 256\n[[group]]'),
     "no-such"),
    (TWO_H100.replace("num_gpus = 256", "num_gpus = 0", 1), "num_gpus"),
    ('name = "one"\n[[group]]\nname = "a"\ncluster = "dgx-h100"\nnum_gpus = 8\n' + LINK, "at least two"),
    ('name = "x"\ngroup = 3\n' + LINK, "[[group]] tables"),
])
def test_bad_cluster_files_get_one_line_errors(tmp_path, text, says):
    with pytest.raises((FileFormatError, SpecError)) as e:
        load_mixed_cluster(_write(tmp_path, text))
    assert says in str(e.value) and "\n" not in str(e.value)


# ---- cross-mesh resharding ---------------------------------------------------------------

def _holders(layout: BoundaryLayout, units: int) -> list[set[int]]:
    """Which sequence units each rank holds (or needs), tile by tile: the i-th 1/t under
    sequence parallelism, else all of them."""
    if not layout.sequence_sharded:
        return [set(range(units)) for _ in range(layout.tp)]
    return [{u for u in range(units) if r * units <= u * layout.tp < (r + 1) * units} for r in range(layout.tp)]


LAYOUTS = [BoundaryLayout(t, sp) for t in (1, 2, 4, 8) for sp in (True, False) if not (t == 1 and not sp)]


@pytest.mark.parametrize("src", LAYOUTS, ids=str)
@pytest.mark.parametrize("dst", LAYOUTS, ids=str)
def test_resharding_volumes_tile_by_tile(src, dst):
    """Sending each needed tile once, to one receiver that needs it, from one sender that
    holds it (spread evenly): the crossing is the tensor once and the busiest NIC carries
    X / min(t_src, t_dst); sending each receiver all it needs: the sum of the needs."""
    units = 8 * 8 * 3
    held, needed = _holders(src, units), _holders(dst, units)
    sent, received = [0] * src.tp, [0] * dst.tp
    for u in range(units):
        takers = [r for r in range(dst.tp) if u in needed[r]]
        givers = [s for s in range(src.tp) if u in held[s]]
        sent[givers[u % len(givers)]] += 1
        received[takers[u % len(takers)]] += 1
    crossing, per_link, gather = crossing_volumes(src, dst, float(units))
    assert crossing == units == sum(sent)
    assert per_link == pytest.approx(max(max(sent), max(received)))
    assert gather == pytest.approx(units - max(received) if not dst.sequence_sharded else 0.0)
    d_crossing, d_link = direct_volumes(src, dst, float(units))
    assert d_crossing == sum(len(n) for n in needed)
    assert d_link >= max(len(n) for n in needed)


def test_resharding_takes_the_cheaper_delivery():
    """Into a replicated TP8 group over a slow link, send once and gather over NVLink (the
    paper's local all-gather) beats sending all of it to every receiver; the time is the
    link's send of the busiest NIC's bytes plus the gather."""
    h100 = load_cluster("dgx-h100")
    x = 2.0 * 8192 * 8192
    r = reshard(h100.scaleout, h100, BoundaryLayout(8, False), BoundaryLayout(8, False), x)
    assert r.strategy == "send once + local all-gather"
    assert r.per_link_bytes == x / 8 and r.local_bytes == x * 7 / 8
    one = reshard(h100.scaleout, h100, BoundaryLayout(8, True), BoundaryLayout(8, True), x)
    assert one.strategy == "send once" and one.seconds < r.seconds


# ---- the engine's per-hop sends -----------------------------------------------------------

def test_per_hop_sends_equal_the_uniform_send_and_price_each_hop():
    base = StageCosts.uniform(4, 1, 1.0, 2.0, p2p_s=0.1)
    same = StageCosts(forward_s=base.forward_s, backward_s=base.backward_s, weight_s=base.weight_s, p2p_s=0.0,
                      hop_s=(0.1, 0.1, 0.1))
    for schedule in (Schedule.ONE_F_ONE_B, Schedule.GPIPE):
        assert simulate_schedule(schedule, 8, same).step_time_s == simulate_schedule(schedule, 8, base).step_time_s
    # a slow middle hop: every micro-batch's forward crosses it once and its gradient once,
    # so in GPipe (no overlap across the hop's critical path) the step grows by 2 × 0.5
    slow = StageCosts(forward_s=base.forward_s, backward_s=base.backward_s, weight_s=base.weight_s, p2p_s=0.0,
                      hop_s=(0.1, 0.6, 0.1))
    grown = simulate_schedule(Schedule.GPIPE, 8, slow).step_time_s - simulate_schedule(Schedule.GPIPE, 8, base).step_time_s
    assert grown == pytest.approx(1.0)
    with pytest.raises(ScheduleError, match="hop_s has 2 hops"):
        simulate_schedule(Schedule.ONE_F_ONE_B, 8, StageCosts(forward_s=base.forward_s, backward_s=base.backward_s,
                                                              weight_s=base.weight_s, p2p_s=0.0, hop_s=(0.1, 0.1)))


# ---- pricing -----------------------------------------------------------------------------

@pytest.mark.parametrize("rc", [Recompute.NONE, Recompute.FULL])
@pytest.mark.parametrize("tp, pp, dp", [(8, 4, 16), (4, 8, 16)])
def test_two_groups_of_one_gpu_price_as_the_homogeneous_pipeline(tmp_path, llama70b, rc, tp, pp, dp):
    """Split over two groups of the same H100s, joined by their own network, a pipeline's
    step is the homogeneous cost model's to the rounding; its memory the static count (the
    GPU's fragmentation share; estimate() replays the allocator, which finds less)."""
    mixed = load_mixed_cluster(_write(tmp_path, TWO_H100))
    stages = tuple(MixedStage(group="a" if i < pp // 2 else "b", tp=tp, layers=80 // pp) for i in range(pp))
    mixed_est = estimate_mixed(llama70b, mixed, WL, MixedPlan(dp=dp, micro_batch_size=1, stages=stages, recompute=rc))
    h100 = load_cluster("dgx-h100", num_gpus=tp * pp * dp)
    plan = make_plan(tp=tp, pp=pp, dp=dp, micro_batch_size=1, recompute=rc, zero=ZeroStage.OPTIMIZER,
                     sequence_parallel=True, attention=h100.gpu.attention_kernels[-1])
    homogeneous = estimate(llama70b, h100, WL, plan)
    assert mixed_est.step_time_s == pytest.approx(homogeneous.step_time_s, rel=1e-9)
    # the budget through interruptions: the same checkpoint stall and goodput (to 1e-4: the
    # homogeneous estimate copies the stage its memory is worst on, the mixed one the stage
    # with the most state, here a middle stage a few parameters fuller than the first)
    mine, theirs = mixed_est.with_failures, homogeneous.budget.with_failures
    assert mine.checkpoint_s == pytest.approx(theirs.checkpoint_s, rel=1e-4)
    assert mine.goodput == pytest.approx(theirs.goodput, rel=1e-6)
    static, _ = plan_memory_total(llama70b, h100, WL, PlanBatch.from_plans([plan]))
    assert max(s.memory_bytes for s in mixed_est.stages) == pytest.approx(float(static[0]), rel=1e-9)
    assert max(s.memory_bytes for s in mixed_est.stages) >= homogeneous.memory.total


def test_a_slower_group_gets_fewer_layers_and_the_step_is_priced_by_the_simulator(llama70b, example):
    est = search_mixed(llama70b, example, WL, top_k=3).ranked[0]
    assert est.fits and sum(s.layers for s in est.stages) == 80
    h100 = [s.layers for s in est.stages if s.group == "h100"]
    a100 = [s.layers for s in est.stages if s.group == "a100"]
    assert h100 and a100 and min(h100) > max(a100)  # the H100 does ~2.3x an A100's work per second
    assert est.step_time_s >= est.sim.step_time_s  # the pipeline, then the slowest tail after it
    assert est.plan.gpus_of("h100") <= 512 and est.plan.gpus_of("a100") <= 512


def test_the_search_ranks_by_step_and_every_shown_plan_fits(llama70b, example):
    res = search_mixed(llama70b, example, WL, top_k=5)
    steps = [e.step_time_s for e in res.ranked]
    assert steps == sorted(steps) and all(e.fits for e in res.ranked)
    # the search's shared, batched proxies price each plan as estimating it alone does
    assert steps == [estimate_mixed(llama70b, example, WL, e.plan).step_time_s for e in res.ranked]


@pytest.mark.parametrize("which, depth, n", [(FIRST, 4, 7), (LAST, 4, 13), (MIDDLE, 3, 21), (MIDDLE, 6, 5)])
def test_the_search_table_is_the_proxies_themselves(llama70b, example, which, depth, n):
    """The search's affine table (four batched evaluations per group) gives the proxies'
    times and bytes at any layers and depth (cost/mixed.py price_proxies). (Not the exposed
    reduction after the pipeline, which overlaps with the last backward: the closed form
    takes it from two points, the plans shown are priced exactly.)"""
    group = example.groups[1]
    table_key = (8, 16, 1, Recompute.SELECTIVE, True)
    stage = _GroupTable(llama70b, group, WL, [table_key]).stage(table_key, which, float(depth), group.name)
    key = (group.name, 8, n, depth, 16, 1, Schedule.ONE_F_ONE_B, Recompute.SELECTIVE, ZeroStage.OPTIMIZER, True, True)
    fwd, bwd, after, memory, _, _ = price_proxies(llama70b, example, WL, [key])[key][which]
    assert stage.time_s(n) == pytest.approx(fwd + bwd, rel=1e-9)
    assert stage.memory_bytes(n) == pytest.approx(memory, rel=1e-9)
    assert stage.after_s(n) >= 0.0


def test_balanced_layers_fill_the_fastest_first_within_memory():
    from paraplan.search.mixed import _Stage
    zero = dict(fixed_s=0.0, fixed_bytes=0.0, per_layer_bytes=1.0, after_fixed_s=0.0, after_per_layer_s=0.0)
    fast = _Stage(group="f", tp=1, per_layer_s=1.0, capacity_bytes=6.0, **zero)
    slow = _Stage(group="s", tp=1, per_layer_s=2.0, capacity_bytes=100.0, **zero)
    assert _balanced_layers([fast, slow], 9) == [6, 3]   # 6 fit on the fast one: times 6 and 6
    assert _balanced_layers([fast, slow], 6) == [4, 2]
    assert _balanced_layers([fast, replace_capacity(slow, 2.0)], 9) is None


def replace_capacity(stage, capacity):
    from dataclasses import replace
    return replace(stage, capacity_bytes=capacity)


@pytest.mark.parametrize("kw, field", [
    (dict(stages=(MixedStage(group="h100", tp=8, layers=80),)), "stages"),
    (dict(schedule=Schedule.INTERLEAVED_1F1B), "schedule"),
    (dict(zero=ZeroStage.PARAMETERS), "zero"),
])
def test_bad_mixed_plans_say_the_field(kw, field):
    base = dict(dp=16, micro_batch_size=1, stages=(MixedStage(group="h100", tp=8, layers=40),) * 2)
    with pytest.raises(SpecError, match=field):
        MixedPlan(**{**base, **kw})


def test_a_plan_that_asks_more_gpus_than_a_group_has_is_refused(llama70b, example):
    plan = MixedPlan(dp=128, micro_batch_size=1, stages=(MixedStage(group="h100", tp=8, layers=40),
                                                         MixedStage(group="a100", tp=8, layers=40)))
    with pytest.raises(SpecError, match="at most group 'h100'"):
        estimate_mixed(llama70b, example, WL, plan)


def test_moe_models_are_refused_in_one_line(example):
    with pytest.raises(SpecError, match="dense model"):
        estimate_mixed(load_model("mixtral-8x7b"), example, WL, MixedPlan(
            dp=16, micro_batch_size=1, stages=(MixedStage(group="h100", tp=8, layers=16),) * 2))


# ---- commands ----------------------------------------------------------------------------

def _paraplan(*args):
    return subprocess.run([sys.executable, "-m", "paraplan", *args], capture_output=True, text=True, cwd=ROOT)


def test_search_estimate_and_trace_over_the_example(tmp_path):
    out = _paraplan("search", "--cluster", str(EXAMPLE), "--top", "3", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert len(res["ranked"]) == 3 and set(res["alone"]) == {"h100", "a100"}
    best = res["ranked"][0]
    assert math.isclose(sum(s["layers"] for s in best["stages"]), 80)
    est = _paraplan("estimate", "--cluster", str(EXAMPLE), "--stages", "h100:8:56,a100:8:24", "--dp", "64", "--json")
    assert est.returncode == 0, est.stderr
    got = json.loads(est.stdout)
    assert [s["layers"] for s in got["stages"]] == [56, 24] and got["plan_source"] == "flags"
    # the budget's energy: every used GPU at its TDP (H100 700 W, A100 400 W) for the budget's time
    b = got["token_budget"]
    assert b["energy_j"] == pytest.approx((512 * 700 + 512 * 400) * b["time_s"])
    assert b["gpu_hours"] == pytest.approx(1024 * b["time_s"] / 3600)
    assert any("resharding" in h for h in got["hops"])
    trace = tmp_path / "t.json"
    tr = _paraplan("trace", "--cluster", str(EXAMPLE), "--stages", "h100:8:56,a100:4:24", "--dp", "64", "-o",
                   str(trace))
    assert tr.returncode == 0, tr.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("reshard") for e in events)


@pytest.mark.parametrize("args, says", [
    (["search", "--cluster", str(EXAMPLE), "--tp", "8"], "--tp"),
    (["estimate", "--cluster", str(EXAMPLE), "--stages", "h100:8"], "GROUP:TP:LAYERS"),
    (["estimate", "--cluster", str(EXAMPLE), "--stages", "h100:8:56,a100:8:24"], "--dp"),
    (["estimate", "--cluster", str(EXAMPLE), "--stages", "h100:8:50,a100:8:24", "--dp", "64"], "80 layers"),
    (["estimate", "--stages", "h100:8:40,a100:8:40", "--dp", "8"], "only with a mixed cluster"),
    (["search", "--cluster", str(EXAMPLE), "--model", "mixtral-8x7b"], "dense model"),
    (["search", "--cluster", str(EXAMPLE), "--batch", "8"], "fewer micro-batches than stages"),
])
def test_bad_mixed_requests_exit_2_in_one_line(args, says):
    out = _paraplan(*args)
    assert out.returncode == 2 and says in out.stderr and out.stderr.count("\n") == 1


def test_the_python_api_searches_a_mixed_cluster_as_the_search_does(llama70b, example):
    from paraplan import api
    res = api.search_mixed("llama3-70b", EXAMPLE, global_batch_size=512, seq_len=8192, top=2)
    direct = search_mixed(llama70b, example, WL, top_k=2)
    assert [e.plan.describe() for e in res.ranked] == [e.plan.describe() for e in direct.ranked]
    with pytest.raises(SpecError, match="bogus"):
        api.search_mixed("llama3-70b", EXAMPLE, bogus=1)


def test_proxies_priced_in_one_batch_are_those_priced_one_by_one(llama70b, example):
    """The search prices its finalists' stages in batches (price_proxies over many keys):
    to the bit what each stage priced alone gives."""
    res = search_mixed(llama70b, example, WL, top_k=3)
    keys = [proxy_key(e.plan, place) for e in res.ranked for place in range(e.plan.pp)]
    together = price_proxies(llama70b, example, WL, keys)
    for key in keys:
        assert price_proxies(llama70b, example, WL, [key])[key] == together[key]
