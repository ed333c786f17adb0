"""Invariants of the cost model over random valid plans (hypothesis).

Every printed total is the sum of its parts; faster hardware is never slower; more memory
never makes a fitting plan stop fitting. Plans come from `make_plan` over small models and
clusters and are kept only when `check_plan` accepts them.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from paraplan.cost.estimate import estimate
from paraplan.plan.axes import AttentionKernel, Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import check_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

MODELS = ("llama3-8b", "llama2-7b", "mistral-7b", "gpt3-5b", "megatron-gpt-1.7b", "mpt-350m", "mpt-1b")
CLUSTERS = ("dgx-h100", "dgx-a100-80gb", "h100-pathways-islands")
PROFILE = settings(max_examples=100, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])


def _pow2_divisors(n: int, limit: int) -> list[int]:
    return [x for x in (1, 2, 4, 8, 16, 32, 64) if x <= limit and n % x == 0]


@st.composite
def cases(draw):
    """(model, cluster, workload, plan) with a plan that check_plan accepts."""
    model = load_model(draw(st.sampled_from(MODELS)))
    n = draw(st.sampled_from((8, 16, 32, 64)))
    cluster = load_cluster(draw(st.sampled_from(CLUSTERS)), num_gpus=n)
    tp = draw(st.sampled_from(_pow2_divisors(n, cluster.gpus_per_node)))
    pp = draw(st.sampled_from(_pow2_divisors(n // tp, 8)))
    cp = draw(st.sampled_from(_pow2_divisors(n // (tp * pp), 4)))
    dp = n // (tp * pp * cp)
    layers_per_stage = model.num_layers // pp if model.num_layers % pp == 0 else 1
    vp = draw(st.sampled_from([v for v in (1, 2, 3, 4) if layers_per_stage % v == 0])) if pp > 1 else 1
    if pp == 1:
        schedule = Schedule.ONE_F_ONE_B
    elif vp > 1:
        schedule = draw(st.sampled_from((Schedule.INTERLEAVED_1F1B, Schedule.BREADTH_FIRST)))
    else:
        schedule = draw(st.sampled_from((Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE)))
    mb = draw(st.sampled_from((1, 2, 4)))
    num_micro = pp * draw(st.integers(1, 4))  # a multiple of PP, as interleaving needs
    seq = draw(st.sampled_from((512, 1024, 2048, 4096)))
    recompute = draw(st.sampled_from(tuple(Recompute)))
    k = draw(st.integers(1, max(1, layers_per_stage - 1))) if recompute is Recompute.FIRST_K else 0
    sp = tp > 1 and draw(st.booleans())
    zero = draw(st.sampled_from(tuple(ZeroStage)))
    dp_shard = dp
    if zero is ZeroStage.PARAMETERS and dp > 1:
        dp_shard = draw(st.sampled_from([x for x in range(1, dp + 1) if dp % x == 0]))
    plan = make_plan(
        tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, micro_batch_size=mb, schedule=schedule, recompute=recompute,
        recompute_num_layers=k, sequence_parallel=sp, zero=zero, dp_shard=dp_shard,
        offload_optimizer=zero is not ZeroStage.PARAMETERS and draw(st.booleans()),
        dp_overlap=draw(st.booleans()), tp_overlap=sp and draw(st.booleans()),
        attention=draw(st.sampled_from((AttentionKernel.UNFUSED, AttentionKernel.FLASH2))))
    precision = draw(st.sampled_from((Precision.BF16, Precision.FP8))) \
        if Precision.FP8 in cluster.gpu.peak_flops_per_s else Precision.BF16
    workload = Workload(global_batch_size=dp * mb * num_micro, seq_len=seq, precision=precision)
    assume(check_plan(plan, model, cluster, workload) is None)
    return model, cluster, workload, plan


def _scale_links(cluster, factor, *, nvlink=True, scaleout=True, dcn=True):
    def scaled(tier):
        return replace(tier, bw_unidir_bytes_per_s=tier.bw_unidir_bytes_per_s * factor)
    return replace(cluster,
                   nvlink=scaled(cluster.nvlink) if nvlink else cluster.nvlink,
                   scaleout=scaled(cluster.scaleout) if scaleout else cluster.scaleout,
                   dcn=scaled(cluster.dcn) if (dcn and cluster.dcn is not None) else cluster.dcn)


def _no_slower(faster, baseline):
    # a step can only shrink; the margin absorbs floating-point reassociation only
    assert faster.step_time_s <= baseline.step_time_s * (1 + 1e-9), (
        f"{faster.plan.describe()}: {faster.step_time_s} s > {baseline.step_time_s} s\n"
        f"faster:   {faster.time}\nbaseline: {baseline.time}")


@PROFILE
@given(cases())
def test_time_and_memory_parts_sum_to_totals(case):
    model, cluster, workload, plan = case
    est = estimate(model, cluster, workload, plan)
    parts = est.time.parts()
    assert all(v >= 0.0 and math.isfinite(v) for v in parts.values()), parts
    assert math.isclose(sum(parts.values()), est.step_time_s, rel_tol=1e-9)
    mem = est.memory.parts()
    assert all(v >= 0.0 and math.isfinite(v) for v in mem.values()), mem
    assert math.isclose(sum(mem.values()), est.memory.total, rel_tol=1e-9)
    assert est.fits == bool(est.memory.fits_in(cluster.gpu.hbm_bytes))


@PROFILE
@given(cases())
def test_step_time_positive_and_mfu_in_unit_interval(case):
    model, cluster, workload, plan = case
    est = estimate(model, cluster, workload, plan)
    assert est.step_time_s > 0.0
    assert 0.0 < est.mfu < 1.0
    assert 0.0 < est.hfu < 1.0
    assert est.num_microbatches == workload.global_batch_size // (plan.dp * plan.micro_batch_size)


@PROFILE
@given(cases(), st.sampled_from(("all", "nvlink", "scaleout")))
def test_more_network_bandwidth_is_never_slower(case, which):
    model, cluster, workload, plan = case
    faster = _scale_links(cluster, 2.0, nvlink=which in ("all", "nvlink"), scaleout=which in ("all", "scaleout"),
                          dcn=which == "all")
    _no_slower(estimate(model, faster, workload, plan), estimate(model, cluster, workload, plan))


@PROFILE
@given(cases())
def test_doubling_peak_flops_is_never_slower(case):
    model, cluster, workload, plan = case
    gpu = cluster.gpu
    faster = replace(cluster, gpu=replace(gpu, peak_flops_per_s={k: 2.0 * v for k, v in gpu.peak_flops_per_s.items()}))
    _no_slower(estimate(model, faster, workload, plan), estimate(model, cluster, workload, plan))


@PROFILE
@given(cases(), st.sampled_from((1.25, 2.0)))
def test_more_hbm_never_stops_a_plan_fitting(case, factor):
    model, cluster, workload, plan = case
    bigger = replace(cluster, gpu=replace(cluster.gpu, hbm_bytes=cluster.gpu.hbm_bytes * factor))
    base = estimate(model, cluster, workload, plan)
    more = estimate(model, bigger, workload, plan)
    if base.fits:
        assert more.fits
    assert more.memory.total <= base.memory.total * (1 + 1e-12)


def test_the_strategy_reaches_the_interesting_corners():
    # A property over plans that never pipeline or shard would pass for the wrong reason.
    seen = set()

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
    @given(cases())
    def collect(case):
        _, cluster, _, plan = case
        seen.add(("pp", plan.pp > 1))
        seen.add(("vp", plan.vp > 1))
        seen.add(("tp", plan.tp > 1))
        seen.add(("cp", plan.cp > 1))
        seen.add(("zero", plan.zero))
        seen.add(("schedule", plan.schedule))
        seen.add(("islands", cluster.dcn is not None))

    collect()
    for key in (("pp", True), ("vp", True), ("tp", True), ("cp", True), ("zero", ZeroStage.PARAMETERS),
                ("schedule", Schedule.ZERO_BUBBLE), ("schedule", Schedule.INTERLEAVED_1F1B), ("islands", True)):
        assert key in seen, key


@pytest.mark.parametrize("factor", [0.5, 2.0])
def test_bandwidth_actually_moves_the_step(factor):
    # Guards the properties above: a network change must reach the step time at all.
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=64)
    workload = Workload(global_batch_size=64, seq_len=4096)
    plan = make_plan(tp=8, dp=8, sequence_parallel=True, zero=ZeroStage.OPTIMIZER)
    base = estimate(model, cluster, workload, plan)
    other = estimate(model, _scale_links(cluster, factor), workload, plan)
    assert (other.step_time_s < base.step_time_s) == (factor > 1)


# Known defect (reported, not fixed here): when ZeRO-2/3 per-layer traffic outlasts the
# layer's compute, cost/evaluate.py hides it behind the compute alone
# (z3_*_exp = max(z3 - comp, 0)), while CP ring exchange and overlapped TP collectives hide
# behind the same compute. Faster compute then exposes more CP/TP time without shortening
# the ZeRO-bound layer, and the step gets slower. strict: this fails once it is fixed, so
# the marker goes and the cases join the property above.
SLOWER_WITH_FASTER_COMPUTE = [
    # (model, cluster, GPUs, seq, plan)
    ("llama3-8b", "dgx-a100-80gb", 16, 512, dict(tp=1, cp=4, dp=4, zero=ZeroStage.GRADIENTS)),
    ("llama3-8b", "dgx-a100-80gb", 16, 512, dict(tp=4, cp=4, dp=1, zero=ZeroStage.PARAMETERS,
                                                 sequence_parallel=True, attention=AttentionKernel.UNFUSED)),
    ("llama3-8b", "dgx-a100-80gb", 16, 512, dict(tp=8, dp=2, zero=ZeroStage.PARAMETERS, sequence_parallel=True,
                                                 tp_overlap=True, attention=AttentionKernel.UNFUSED)),
]


def test_regression_doubling_peak_flops_with_exposed_zero_traffic():
    """Plans where ZeRO traffic and CP/TP overlap once shared one window (fixed)."""
    slower = []
    for model_name, cluster_name, n, seq, kw in SLOWER_WITH_FASTER_COMPUTE:
        model, cluster = load_model(model_name), load_cluster(cluster_name, num_gpus=n)
        plan = make_plan(**kw)
        workload = Workload(global_batch_size=plan.dp, seq_len=seq)
        gpu = cluster.gpu
        faster = replace(cluster, gpu=replace(gpu, peak_flops_per_s={k: 2.0 * v for k, v in gpu.peak_flops_per_s.items()}))
        base, fast = estimate(model, cluster, workload, plan), estimate(model, faster, workload, plan)
        if fast.step_time_s > base.step_time_s * (1 + 1e-9):
            slower.append(plan.describe())
    assert not slower, f"2x peak FLOP/s made these plans slower: {slower}"
