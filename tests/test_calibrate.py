"""`paraplan calibrate`: measurements -> a hardware profile that `--hardware` reads back.

The fitting and the profile TOML need no torch and are tested on synthetic measurements
(with known answers); the benchmarks themselves run (quick, CPU, two gloo ranks) only
where torch is installed. No timing is asserted: only that what was measured is what the
profile says, and that the cost model moves the right way with it.
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.calibrate.measurements import (AttentionSample, CollectiveSample, CopySample, ElementwiseSample,
                                             GemmSample, Measurements, OptimizerSample, OverlapSample, TPLayerSample)
from paraplan.calibrate.profile import build_profile, fit_link
from paraplan.cli import main
from paraplan.cost.estimate import estimate
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

PEAK = 50e9       # FLOP/s of the synthetic device
TAU = 5e-6        # its launch overhead
ALPHA = 40e-6     # per-hop latency of its links
BW = 2e9          # bytes/s of its links


def gemm_time(m, n, k, eff):
    return 2 * m * n * k / (PEAK * eff) + TAU


def synthetic(gemm_scale: float = 1.0, ranks: int = 2) -> Measurements:
    """A device whose GEMMs run at 0.5 of peak below 1e8 FLOPs and at peak above; links
    that follow the α-β model exactly (ring all-reduce over `ranks`)."""
    gemm = []
    for n in (64, 128, 256, 512, 1024, 2048):
        eff = 0.5 if 2 * n ** 3 < 1e8 else 1.0
        gemm.append(GemmSample(m=n, n=n, k=n, dtype="float32", time_s=gemm_scale * gemm_time(n, n, n, eff)))
    att = [AttentionSample(batch=1, heads=4, seq=s, head_dim=64, dtype="float32",
                           fwd_time_s=4 * 4 * s * s * 64 * 0.5 / (PEAK * 0.25) + TAU,
                           bwd_time_s=2.5 * 4 * 4 * s * s * 64 * 0.5 / (PEAK * 0.25) + TAU) for s in (128, 256, 512)]
    n = ranks
    coll = tuple(CollectiveSample(op="all_reduce", world=n, num_bytes=B,
                                  time_s=2 * (ALPHA * (n - 1) + (n - 1) / n * B / BW)) for B in (4096, 65536, 1 << 20, 1 << 24))
    return Measurements(device_type="cpu", device_name="synthetic", ranks=ranks, threads_per_rank=1,
                        compute_dtype="float32", memory_bytes=8e9, reserved_bytes=3e8, launch_overhead_s=TAU,
                        gemm=tuple(gemm), attention=tuple(att),
                        copies=(CopySample(kind="device", num_bytes=1 << 26, time_s=2 * (1 << 26) / 10e9),),
                        collectives=coll if ranks > 1 else (), backend="gloo" if ranks > 1 else "", torch_version="x")


def write_profile(tmp_path, m: Measurements, name="syn"):
    p = tmp_path / f"{name}.toml"
    p.write_text(build_profile(m, name=name).toml)
    return p


def test_profile_round_trips_through_load_cluster(tmp_path):
    m = synthetic()
    c = load_cluster(str(write_profile(tmp_path, m)))
    gpu = c.gpu
    assert c.num_gpus == 2 and c.gpus_per_node == 2
    assert gpu.peak(Precision.BF16) == pytest.approx(PEAK, rel=1e-4)  # fastest GEMM, launch overhead removed
    # measured in fp32: the rate of the fp32 workloads a CPU run is predicted with
    assert gpu.peak(Precision.FP32) == gpu.peak(Precision.BF16)
    assert gpu.gemm_efficiency.at(2 * 2048 ** 3) == pytest.approx(1.0, abs=1e-3)
    assert gpu.gemm_efficiency.at(2 * 128 ** 3) == pytest.approx(0.5, abs=1e-3)
    assert gpu.attention_curve(gpu.attention_kernels[-1]).at(4 * 4 * 256 * 256 * 64 * 0.5) == pytest.approx(0.25, abs=1e-3)
    assert gpu.hbm_bw_bytes_per_s * gpu.memory_bw_efficiency == pytest.approx(10e9, rel=1e-4)
    assert gpu.kernel_launch_overhead_s == pytest.approx(TAU, rel=1e-4)
    assert gpu.hbm_bytes == pytest.approx(8e9, rel=1e-4)
    # the α-β fit recovers the link the samples were made from
    assert c.nvlink.latency_s == pytest.approx(ALPHA, rel=1e-3)
    assert c.nvlink.bw_unidir_bytes_per_s == pytest.approx(BW, rel=1e-3)
    assert min(c.nvlink.efficiency.y) == pytest.approx(1.0, abs=1e-3)


def test_a_profile_names_the_devices_architecture(tmp_path):
    """What torch reports of the device (compute capability, ROCm gfx name) becomes the
    profile's GPUSpec.architecture, which validate's engine policies and fit's pools read; a
    CPU's profile names none."""
    from paraplan.specs.hardware import device_architecture
    assert [device_architecture(c) for c in ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (12, 0))] == [
        "Ampere", "Ampere", "Ada", "Hopper", "Blackwell", "Blackwell", ""]
    assert device_architecture(None, "gfx942:sramecc+:xnack-") == "CDNA3" and device_architecture(None) == ""
    gpu = load_cluster(str(write_profile(tmp_path, replace(synthetic(), architecture="Hopper")))).gpu
    assert gpu.architecture == "Hopper"
    assert load_cluster(str(write_profile(tmp_path, synthetic(), name="cpu"))).gpu.architecture == ""


def test_memory_bandwidth_is_the_largest_copy_not_a_cached_one(tmp_path):
    # a small copy that stays in cache runs 3x faster than streaming; the profile must
    # price element-wise kernels at the streaming rate
    m = synthetic()
    m = replace(m, copies=(CopySample(kind="device", num_bytes=1 << 22, time_s=2 * (1 << 22) / 30e9),) + m.copies)
    gpu = load_cluster(str(write_profile(tmp_path, m))).gpu
    assert gpu.hbm_bw_bytes_per_s * gpu.memory_bw_efficiency == pytest.approx(10e9, rel=1e-4)


def test_measured_elementwise_kernels_are_priced_as_measured(tmp_path):
    # a layer's element-wise kernels measured at 20 ms: the profile's efficiency makes the
    # cost model's element-wise time for the same layer and tokens exactly that
    from paraplan.cost.layer_compute import EW_FWD_KERNELS, elementwise_bytes_per_token
    from paraplan.cost.roofline import elementwise_time_s, memory_bound_time_s
    from paraplan.specs.model import ModelSpec
    sample = ElementwiseSample(tokens=1024, hidden=1024, ffn=3584, q_dim=1024, kv_dim=256, time_s=20e-3)
    gpu = load_cluster(str(write_profile(tmp_path, replace(synthetic(), elementwise=sample)))).gpu
    layer = ModelSpec(name="l", num_layers=1, hidden_size=1024, ffn_hidden_size=3584, num_heads=8, num_kv_heads=2,
                      head_dim=128, vocab_size=1)
    counted = 1024 * elementwise_bytes_per_token(layer, act_bytes=4.0)  # measured in fp32
    assert float(elementwise_time_s(gpu, counted, EW_FWD_KERNELS)) == pytest.approx(20e-3, rel=1e-3)
    assert gpu.elementwise_bw_efficiency < 1.0
    # streaming kernels (copies, the optimizer) keep the copy rate
    assert float(memory_bound_time_s(gpu, 1e9, 0)) == pytest.approx(1e9 / 10e9, rel=1e-4)


def test_profile_without_an_elementwise_sample_prices_them_at_the_copy_rate(tmp_path):
    m = synthetic()
    assert m.elementwise is None  # raw files written before the sample existed
    gpu = load_cluster(str(write_profile(tmp_path, m))).gpu
    assert gpu.elementwise_efficiency is None and gpu.elementwise_bw_efficiency == gpu.memory_bw_efficiency


def _from_raw_error(tmp_path, capsys, raw: dict) -> str:
    """The one error line of `calibrate --from-raw` on `raw`; nothing may be written."""
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(raw))
    code = main(["calibrate", "--from-raw", str(path), "-o", str(tmp_path / "p.toml")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "p.toml").exists()
    return err


def test_raw_elementwise_sample_with_impossible_heads_is_one_line(tmp_path, capsys):
    raw = json.loads(replace(synthetic(), elementwise=ElementwiseSample(
        tokens=8, hidden=64, ffn=224, q_dim=64, kv_dim=16, time_s=1e-3)).to_json())
    assert "elementwise: q_dim=64" in _from_raw_error(tmp_path, capsys, raw)


def test_slower_elementwise_kernels_slow_the_step_not_the_gemms(tmp_path):
    model, wl = load_model("llama3-8b"), Workload(global_batch_size=16, seq_len=1024)
    plan = make_plan(tp=1, pp=1, dp=2, micro_batch_size=1)
    sample = ElementwiseSample(tokens=1024, hidden=1024, ffn=3584, q_dim=1024, kv_dim=256, time_s=5e-3)
    fast = load_cluster(str(write_profile(tmp_path, replace(synthetic(), elementwise=sample), "fast")))
    slow = load_cluster(str(write_profile(tmp_path, replace(synthetic(), elementwise=replace(sample, time_s=50e-3)),
                                          "slow")))
    e_fast, e_slow = estimate(model, fast, wl, plan), estimate(model, slow, wl, plan)
    assert e_slow.layer_detail["fwd"]["element-wise"] > 5 * e_fast.layer_detail["fwd"]["element-wise"]
    assert e_slow.layer_detail["fwd"]["MLP up GEMM"] == e_fast.layer_detail["fwd"]["MLP up GEMM"]
    assert e_slow.step_time_s > e_fast.step_time_s


def test_measured_optimizer_step_is_priced_as_measured(tmp_path):
    # an AdamW step over 8 × 1M fp32 parameters measured at 200 ms: the profile's efficiency
    # makes the model's Adam traffic (72 B per parameter) take that long, launches included;
    # copies and element-wise kernels keep their own rates
    from paraplan.cost.optimizer import ADAM_STEP
    from paraplan.cost.roofline import memory_bound_time_s
    from paraplan.specs.workload import Optimizer
    n, step_s = 8 << 20, 200e-3
    gpu = load_cluster(str(write_profile(tmp_path, replace(synthetic(), optimizer=OptimizerSample(
        params=n, tensors=8, time_s=step_s))))).gpu
    step_bytes, passes = ADAM_STEP[Optimizer.ADAM_UNFUSED]
    assert 0.0 < gpu.optimizer_efficiency < 1.0
    modelled = float(memory_bound_time_s(gpu, step_bytes * n, passes * 8, gpu.optimizer_bw_efficiency))
    assert modelled == pytest.approx(step_s, rel=1e-3)
    assert float(memory_bound_time_s(gpu, 1e9, 0)) == pytest.approx(1e9 / 10e9, rel=1e-4)
    assert gpu.elementwise_bw_efficiency == gpu.memory_bw_efficiency


def test_slower_optimizer_step_slows_only_the_optimizer(tmp_path):
    # measured on torch's AdamW: it prices the unfused passes; the fused kernel keeps the copy rate
    from paraplan.specs.workload import Optimizer
    model, wl = load_model("llama3-8b"), Workload(global_batch_size=16, seq_len=1024, precision=Precision.FP32,
                                                  optimizer=Optimizer.ADAM_UNFUSED)
    plan = make_plan(tp=1, pp=1, dp=2, micro_batch_size=1)
    base = synthetic()
    assert base.optimizer is None  # raw files written before the sample existed: the copy rate
    plain = load_cluster(str(write_profile(tmp_path, base, "plain")))
    assert plain.gpu.optimizer_efficiency is None and plain.gpu.optimizer_bw_efficiency == plain.gpu.memory_bw_efficiency
    slow = load_cluster(str(write_profile(tmp_path, replace(base, optimizer=OptimizerSample(
        params=8 << 20, tensors=8, time_s=2.0)), "slow")))
    e_plain, e_slow = estimate(model, plain, wl, plan), estimate(model, slow, wl, plan)
    ratio = plain.gpu.optimizer_bw_efficiency / slow.gpu.optimizer_bw_efficiency
    assert ratio > 2.0
    assert e_slow.time.optimizer_s == pytest.approx(e_plain.time.optimizer_s * ratio, rel=0.02)
    assert e_slow.time.compute_s == e_plain.time.compute_s
    fused = replace(wl, optimizer=Optimizer.ADAM)
    assert estimate(model, slow, fused, plan).time.optimizer_s == estimate(model, plain, fused, plan).time.optimizer_s


def _tp_layer(extra_s: float, world: int = 2, plain_s: float = 2e-6) -> TPLayerSample:
    """A TP layer that costs `extra_s` more per layer than its replica (3 layers vs 1), the
    replica `plain_s` per layer (by default less than the model's price of its math: the
    in-layer launch overhead then stays the bare add's)."""
    return TPLayerSample(world=world, tokens=16, hidden=128, bytes_per_element=4,
                         tp_1_layer_s=0.01 + plain_s + extra_s, tp_3_layers_s=0.01 + 3 * (plain_s + extra_s),
                         plain_1_layer_s=0.005 + plain_s, plain_3_layers_s=0.005 + 3 * plain_s)


def test_tp_collective_overhead_is_the_layer_time_the_priced_transfers_leave(tmp_path):
    from paraplan.cost.comm import Collective, collective_time_s
    sample = _tp_layer(0.030, plain_s=0.002)
    assert sample.tp_layer_s == pytest.approx(0.032) and sample.plain_layer_s == pytest.approx(0.002)
    c = load_cluster(str(write_profile(tmp_path, replace(synthetic(), tp_layer=sample))))
    # eight collectives per layer (SP: all-gather + reduce-scatter around attention and MLP,
    # forward and backward), each priced on the fitted link at the layer's 8 KiB buffer
    B = 16 * 128 * 4
    priced = 4 * sum(float(collective_time_s(c, k, B, 2, 1)) for k in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER))
    assert 0 < priced < 0.030
    assert c.gpu.tp_collective_overhead_s == pytest.approx((0.030 - priced) / 8, rel=1e-4)
    # transfers that take the whole difference leave no overhead (the line is left out)
    assert load_cluster(str(write_profile(tmp_path, replace(synthetic(), tp_layer=_tp_layer(1e-6)), "none"))
                        ).gpu.tp_collective_overhead_s == 0.0


def test_in_layer_launch_overhead_makes_the_model_reproduce_the_replica_layer(tmp_path):
    from paraplan.calibrate.profile import layer_launch_overhead_s
    from paraplan.specs.catalog import cluster_from_text
    base = replace(synthetic(), tp_layer=_tp_layer(0.030))
    cluster = cluster_from_text(build_profile(base, name="b").toml, "b")
    assert cluster.gpu.kernel_launch_overhead_s == pytest.approx(TAU)  # replica faster than its math: the bare add's
    _, math_s, kernels = layer_launch_overhead_s(base, cluster)
    assert 0 < math_s and 30 <= kernels <= 60  # a layer's GEMMs, attention and element-wise kernels, both passes
    # a replica that takes its math plus 100 us per counted kernel gives 100 us per kernel
    slow = replace(base, tp_layer=_tp_layer(0.030, plain_s=math_s + kernels * 100e-6))
    c = load_cluster(str(write_profile(tmp_path, slow)))
    assert c.gpu.kernel_launch_overhead_s == pytest.approx(100e-6, rel=1e-3)
    tau, math_again, _ = layer_launch_overhead_s(slow, c)
    assert tau == pytest.approx(100e-6, rel=1e-3) and math_again == pytest.approx(math_s, rel=1e-6)


def test_tp_collective_overhead_lands_on_tp_plans_only(tmp_path):
    model, wl = SMALL, Workload(global_batch_size=8, seq_len=256, precision=Precision.FP32)
    plain = load_cluster(str(write_profile(tmp_path, synthetic(), "plain")))
    slow = load_cluster(str(write_profile(tmp_path, replace(synthetic(), tp_layer=_tp_layer(0.030)), "slow")))
    x = slow.gpu.tp_collective_overhead_s
    assert x > 0 and plain.gpu.tp_collective_overhead_s == 0.0
    for plan in (make_plan(dp=2, micro_batch_size=2), make_plan(pp=2, micro_batch_size=1)):
        assert estimate(model, slow, wl, plan).step_time_s == estimate(model, plain, wl, plan).step_time_s
    # Megatron's fused QKV and gate/up: 4 all-reduces per layer without SP; paraplan run's
    # separate wq, wk, wv, w1, w3 each reduce their input gradient: 7 (CommDebugMode's count)
    for sp, fused, per_layer in ((True, True, 8), (False, True, 4), (True, False, 8), (False, False, 7)):
        plan = make_plan(tp=2, sequence_parallel=sp, micro_batch_size=2, fused_kernels=fused)
        a, b = estimate(model, plain, wl, plan), estimate(model, slow, wl, plan)
        m = a.num_microbatches
        # every layer's collectives (tp_comm) and, with SP, the norm weights' gradient
        # all-reduce once per step; per micro-batch the embedding's reduction (and with SP its
        # backward gather), the head's input gather (SP) and gradient reduction, and the
        # loss's three all-reduces
        norms = 1 if sp else 0
        assert b.time.tp_comm_s - a.time.tp_comm_s == pytest.approx((m * SMALL.num_layers * per_layer + norms) * x,
                                                                    rel=1e-6)
        head = (1 + 1 + 1 + 1 if sp else 1 + 1) + 3
        assert b.step_time_s - a.step_time_s == pytest.approx((m * (SMALL.num_layers * per_layer + head) + norms) * x,
                                                              rel=1e-6)


def test_raw_tp_layer_sample_over_other_ranks_is_one_line(tmp_path, capsys):
    raw = json.loads(replace(synthetic(), tp_layer=_tp_layer(0.01, world=4)).to_json())
    assert "tp_layer was measured over 4 rank(s), but ranks=2" in _from_raw_error(tmp_path, capsys, raw)


def test_raw_optimizer_sample_with_a_bad_field_is_one_line(tmp_path, capsys):
    raw = json.loads(replace(synthetic(), optimizer=OptimizerSample(params=8, tensors=1, time_s=1e-3)).to_json())
    raw["optimizer"]["time_s"] = -1.0
    assert "optimizer.time_s=-1.0" in _from_raw_error(tmp_path, capsys, raw)


@pytest.mark.parametrize("change, said", [({"device_type": "tpu"}, "device_type='tpu' is not allowed"),
                                          ({"ranks": 1}, "measured over 2 rank(s), but ranks=1")])
def test_raw_file_that_contradicts_itself_is_one_line(tmp_path, capsys, change, said):
    raw = json.loads(synthetic().to_json())
    raw.update(change)
    assert said in _from_raw_error(tmp_path, capsys, raw)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_more_cpu_ranks_than_cores_is_refused_before_any_process_starts(capsys):
    import os
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    code = main(["calibrate", "--device", "cpu", "--ranks", str(4 * cores + 1), "--quick"])
    err = capsys.readouterr().err
    assert code == 2 and "--ranks" in err and "CPU cores" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("both, expected", [(10e-3, 0.0), (12e-3, 0.5), (14e-3, 0.99), (9e-3, 0.0)])
def test_overlap_slowdown_from_gemms_and_all_reduce_at_once(both, expected):
    # GEMMs 10 ms, all-reduce 4 ms: at once 10 ms = perfect overlap, 14 ms = none at all
    s = OverlapSample(num_bytes=4e6, compute_s=10e-3, comm_s=4e-3, both_s=both)
    assert s.slowdown == pytest.approx(expected, abs=1e-9)


def test_measured_overlap_slowdown_reaches_the_profile_and_slows_dp(tmp_path, capsys):
    base = synthetic()
    plan = make_plan(dp=2)
    wl = Workload(global_batch_size=8, seq_len=256)
    steps = {}
    for slow in (0.0, 0.9):
        m = replace(base, overlap=OverlapSample(num_bytes=4e6, compute_s=10e-3, comm_s=4e-3, both_s=10e-3 + slow * 4e-3))
        c = load_cluster(str(write_profile(tmp_path, m, f"ov{slow}")), num_gpus=2)
        assert c.gpu.overlap_slowdown == pytest.approx(slow, abs=1e-6)
        m2 = Measurements.from_json(m.to_json())
        assert m2.overlap == m.overlap
        est = estimate(SMALL, c, wl, plan)
        assert est.overlapped.dp_comm_s > 0
        steps[slow] = est.step_time_s
    # the gradient all-reduce hidden behind the backward costs compute when overlap is poor
    assert steps[0.9] > steps[0.0]


def test_fitted_link_reproduces_every_measured_all_reduce(tmp_path):
    # a link that is not α-β (slow middle sizes): the curve makes the model hit each sample
    from paraplan.cost.comm import Collective, collective_time_s
    m = synthetic()
    coll = tuple(replace(c, time_s=c.time_s * (1.7 if c.num_bytes == 65536 else 1.0)) for c in m.collectives)
    m = replace(m, collectives=coll)
    c = load_cluster(str(write_profile(tmp_path, m)))
    for s in m.collectives:
        t = collective_time_s(c, Collective.ALL_REDUCE, s.num_bytes, 2, 1)
        assert t == pytest.approx(s.time_s, rel=2e-3)


def test_gather_and_scatter_measured_apart_get_curves_of_their_own(tmp_path):
    # gloo-like: the all-gather at the all-reduce's pace, the reduce-scatter 3× slower than
    # one ring phase of it; each collective's own curve reproduces its samples
    from paraplan.cost.comm import Collective, collective_time_s
    m = synthetic()
    n = 2
    phase = {B: ALPHA * (n - 1) + (n - 1) / n * B / BW for B in (65536, 1 << 20, 1 << 24)}
    extra = tuple(CollectiveSample(op=op, world=n, num_bytes=B, time_s=f * t)
                  for B, t in phase.items() for op, f in (("all_gather", 1.0), ("reduce_scatter", 3.0)))
    m = replace(m, collectives=m.collectives + extra)
    c = load_cluster(str(write_profile(tmp_path, m)))
    for s in extra:
        kind = Collective.ALL_GATHER if s.op == "all_gather" else Collective.REDUCE_SCATTER
        assert collective_time_s(c, kind, s.num_bytes, 2, 1) == pytest.approx(s.time_s, rel=0.02)
    for s in m.collectives:  # the all-reduce keeps its own fit
        if s.op == "all_reduce":
            assert collective_time_s(c, Collective.ALL_REDUCE, s.num_bytes, 2, 1) == pytest.approx(s.time_s, rel=2e-3)
    # a preset without them: all three on the all-reduce's curve
    h = load_cluster("dgx-h100")
    assert h.nvlink.curve("reduce_scatter") is h.nvlink.efficiency


def test_a_gpu_profile_states_the_hosts_dram(tmp_path):
    gpu = replace(synthetic(), device_type="cuda", compute_dtype="float32", host_memory_bytes=2e12, device_count=8)
    c = load_cluster(str(write_profile(tmp_path, gpu, name="gpu")))
    assert c.host_memory_bytes_per_gpu == pytest.approx(2e12 / 8)  # 2 of the machine's 8 GPUs measured
    # on a CPU the host memory is the device's: not stated twice
    cpu = load_cluster(str(write_profile(tmp_path, replace(synthetic(), host_memory_bytes=2e12), name="cpu")))
    assert cpu.host_memory_bytes_per_gpu == 0.0


SMALL_TOML = """name = "small"
num_layers = 4
hidden_size = 512
ffn_hidden_size = 1792
num_heads = 8
num_kv_heads = 8
vocab_size = 8192
gated_mlp = true
tied_embeddings = false
"""


def test_profile_is_accepted_by_the_cli(tmp_path, capsys):
    p = write_profile(tmp_path, synthetic())
    model = tmp_path / "small.toml"
    model.write_text(SMALL_TOML)
    code = main(["estimate", "--model", str(model), "--hardware", str(p), "--gpus", "2", "--dp", "2", "--batch", "8",
                 "--seq", "256", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["step_time_s"] > 0
    code = main(["search", "--model", str(model), "--hardware", str(p), "--gpus", "2", "--batch", "8", "--seq", "256",
                 "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["ranked"]


def test_one_rank_profile_takes_links_from_the_base_cluster(tmp_path):
    c = load_cluster(str(write_profile(tmp_path, synthetic(ranks=1))))
    base = load_cluster("dgx-h100")
    assert c.nvlink.bw_unidir_bytes_per_s == pytest.approx(base.nvlink.bw_unidir_bytes_per_s)
    assert c.gpus_per_node == base.gpus_per_node
    assert "not measured" in build_profile(synthetic(ranks=1), name="x").toml


SMALL = replace(load_model("llama3-8b"), name="small", num_layers=4, hidden_size=512, ffn_hidden_size=1792,
                num_heads=8, num_kv_heads=8, head_dim=64, vocab_size=8192)


@settings(max_examples=20, deadline=None)
@given(scale=st.floats(min_value=1.2, max_value=10.0), mb=st.sampled_from([1, 2, 4]),
       zero=st.sampled_from(["0", "3"]), seq=st.sampled_from([128, 256, 512]))
def test_slower_measured_gemms_predict_a_slower_step(tmp_path_factory, scale, mb, zero, seq):
    from paraplan.plan.axes import ZeroStage
    tmp = tmp_path_factory.mktemp("p")
    fast = load_cluster(str(write_profile(tmp, synthetic(), "fast")))
    slow = load_cluster(str(write_profile(tmp, synthetic(gemm_scale=scale), "slow")))
    wl = Workload(global_batch_size=8, seq_len=seq)
    plan = make_plan(dp=2, micro_batch_size=mb, zero=ZeroStage(zero))
    t_fast = estimate(SMALL, fast, wl, plan).step_time_s
    t_slow = estimate(SMALL, slow, wl, plan).step_time_s
    assert t_slow > t_fast
    assert t_slow <= scale * t_fast * (1 + 1e-9)  # only the GEMM share slows down


def test_measurements_json_round_trip_and_from_raw(tmp_path, capsys):
    m = synthetic()
    assert Measurements.from_json(m.to_json()) == m
    raw = tmp_path / "raw.json"
    raw.write_text(m.to_json())
    out = tmp_path / "prof.toml"
    assert main(["calibrate", "--from-raw", str(raw), "-o", str(out), "--name", "syn"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert load_cluster(str(out)).name == "syn"


def test_bad_raw_file_is_one_line_exit_2(tmp_path, capsys):
    raw = tmp_path / "raw.json"
    raw.write_text('{"gemm": 3}')
    assert main(["calibrate", "--from-raw", str(raw)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(raw) in err


def test_fit_link_needs_two_ranks():
    assert fit_link(synthetic(ranks=1)) is None


VIDUR = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "validation" / "vidur_profiling"


@pytest.mark.skipif(not VIDUR.is_dir(), reason="shared/validation/vidur_profiling not beside the checkout")
def test_vidur_curves_against_presets():
    from paraplan.calibrate.vidur import compare_with_presets
    r = compare_with_presets(str(VIDUR))
    # the A100 GEMM and both NVLink all-reduce curves are vidur's medians
    assert max(abs(d["diff"]) for d in r["a100"]["gemm_vs_preset"]) < 0.005
    for g in ("a100", "h100"):
        assert max(abs(d["diff"]) for d in r[g]["nvlink_vs_preset"]) < 0.005
    # the H100 GEMM preset is within 0.05 of the median over both H100 files
    assert max(abs(d["diff"]) for d in r["h100"]["gemm_vs_preset"]) < 0.05
    # send/recv runs faster than the all-reduce bus bandwidth curve says at 10 MB
    assert all(d["vidur"] > d["preset"] for d in r[g]["send_recv_vs_nvlink_preset"] if d["size"] >= 1e6)


HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed (pip install 'paraplan[run]')")
def test_quick_calibration_on_two_cpu_ranks(tmp_path, capsys):
    out, raw = tmp_path / "prof.toml", tmp_path / "raw.json"
    code = main(["calibrate", "--quick", "--device", "cpu", "--ranks", "2", "-o", str(out), "--raw", str(raw)])
    assert code == 0, capsys.readouterr().err
    m = Measurements.from_json(raw.read_text())
    c = load_cluster(str(out), num_gpus=2)
    assert m.ranks == 2 and m.backend == "gloo" and m.compute_dtype == "float32"
    assert {s.op for s in m.collectives} == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    assert m.overlap is not None and 0.0 <= c.gpu.overlap_slowdown <= 0.99
    assert m.tp_layer is not None and m.tp_layer.world == 2 and m.tp_layer.tp_1_layer_s < m.tp_layer.tp_3_layers_s
    # the profile states the overhead exactly when the measurement left one
    assert ("tp_collective_overhead_us" in out.read_text()) == (c.gpu.tp_collective_overhead_s > 0)
    fastest = max(g.flops / g.time_s for g in m.gemm)  # the peak removes at most half of each time
    assert fastest <= c.gpu.peak(Precision.BF16) * (1 + 1e-5) and c.gpu.peak(Precision.BF16) <= 2 * fastest * (1 + 1e-5)
    assert all(0 < y <= 1 for y in c.gpu.gemm_efficiency.y) and math.isfinite(c.nvlink.latency_s)
    assert estimate(SMALL, c, Workload(global_batch_size=8, seq_len=256), make_plan(dp=2)).step_time_s > 0


ONE_ROW_CSV = """\
id,source,model,params_b,layers,hidden,ffn_hidden,heads,kv_heads,vocab,gated_mlp,num_experts,top_k,moe_ffn_hidden,seq_len,gpu,num_gpus,gpus_per_node,precision,global_batch,micro_batch,tp,pp,vp,cp,ep,dp,sp,recompute,zero,framework,metric_id,value,metric_text,notes
r1,my cluster,small,0.02,4,512,1792,8,8,8192,yes,,,,256,H100 80GB,2,2,bf16,8,2,1,1,1,1,1,2,no,none,0,PyTorch,iteration_time_s,5.0,step time (s),
"""


def test_validate_predicts_rows_on_a_profile(tmp_path, capsys):
    csv = tmp_path / "runs.csv"
    csv.write_text(ONE_ROW_CSV)
    fast = write_profile(tmp_path, synthetic(), "fast")
    slow = write_profile(tmp_path, synthetic(gemm_scale=4.0), "slow")
    preds = {}
    for name, hw in (("fast", fast), ("slow", slow), ("preset", None)):
        argv = ["validate", str(csv), "--json"] + (["--hardware", str(hw)] if hw else [])
        assert main(argv) == 0
        row = json.loads(capsys.readouterr().out)["rows"][0]
        preds[name] = row["predicted"]
    assert preds["slow"] > preds["fast"] > preds["preset"]  # the H100 preset is far faster than this device
    assert main(["validate", str(csv), "--hardware", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.toml" in err


@pytest.mark.parametrize("ranks", ["0", "5000"])
def test_calibrate_ranks_are_bounded_before_any_benchmark(capsys, ranks):
    # local processes side by side, as paraplan run launches them: 1 to MAX_LOCAL_RANKS
    from paraplan.cli import main
    assert main(["calibrate", "--ranks", ranks]) == 2
    err = capsys.readouterr().err
    assert f"ranks={ranks}" in err and "1 to 1024" in err and err.count("\n") == 1
