"""Compressed gradient reduction (Plan.grad_compression, cost/grad_compression.py): the bytes on
the wire, when it pays and when not, its memory and kernels in the breakdowns, its rules, the
CLI, and the engines that ship it or refuse it."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest
from engine_checks import SKIP_DS, installed
from support import assert_user_error, run

from paraplan.cost.comm import Collective, collective_time_s
from paraplan.cost.estimate import estimate
from paraplan.cost.grad_compression import powersgd_reduce_s, qgz_reduce_scatter_s
from paraplan.cost.layout import layout
from paraplan.errors import SpecError
from paraplan.export import deepspeed, megatron, torchtitan
from paraplan.plan.axes import GradCompression, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch, check_plan
from paraplan.report.labels import GRAD_COMPRESSION
from paraplan.run.config import RunConfig, check_runnable
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.curves import EfficiencyCurve
from paraplan.specs.workload import Workload

MODEL = load_model("llama3-8b")
WL = Workload(global_batch_size=64, seq_len=4096)
NONE, INT4, PSGD = GradCompression.NONE, GradCompression.INT4, GradCompression.POWERSGD
FLAT = EfficiencyCurve(x=(1.0,), y=(1.0,))


def _slow_network(gpus: int = 64, gbit_per_s: float = 25.0):
    """DGX H100 nodes on a 25 Gb/s-per-GPU Ethernet (a slow scale-out network)."""
    c = load_cluster("dgx-h100", num_gpus=gpus)
    return replace(c, scaleout=replace(c.scaleout, bw_unidir_bytes_per_s=gbit_per_s / 8 * 1e9))


def _ideal_network(gpus: int = 64):
    """Bandwidth only: NVLink free, the network at its line rate for any message, no latency."""
    c = load_cluster("dgx-h100", num_gpus=gpus)
    return replace(c, nvlink=replace(c.nvlink, bw_unidir_bytes_per_s=1e30, latency_s=0.0, efficiency=FLAT),
                   scaleout=replace(c.scaleout, latency_s=0.0, efficiency=FLAT, op_efficiency=()))


# ------------------------------------------------------------------ bytes on the wire
def test_int4_moves_about_a_quarter_of_the_16_bit_bytes_across_nodes():
    # ZeRO++ qgZ (Wang et al. 2023 Sec. 3.3): int4 values with fp32 scales instead of bf16, the
    # node's reduced 1/g share crossing the network: 4x fewer network bytes, less the scales
    cluster = _ideal_network()
    lay = layout(MODEL, WL, make_plan(dp=64, zero=ZeroStage.PARAMETERS, grad_compression=INT4))
    comm, kernels, multi = qgz_reduce_scatter_s(cluster, MODEL, lay)
    plain = collective_time_s(cluster, Collective.REDUCE_SCATTER, lay.reduce_bytes_per_param * lay.layer_params,
                              lay.zero_shard_group, 1)
    assert bool(multi) and kernels > 0.0
    assert 3.9 < plain / comm < 4.0


def test_powersgd_volume_is_rank_times_rows_plus_columns():
    # Vogels et al. 2019 Sec. 3: an n×m gradient goes as P (n×r) and Q (m×r): r·(n+m) numbers
    cluster = _ideal_network()
    runs = {}
    comm = {}
    for r in (1, 2, 4):
        lay = layout(MODEL, WL, make_plan(dp=64, grad_compression=PSGD, powersgd_rank=r))
        runs = dict(block=lay.dp_block, outer_stride=lay.dp_outer_stride)
        comm[r] = float(powersgd_reduce_s(cluster, MODEL, lay, 64, 1, runs)[0])
    full = float(collective_time_s(cluster, Collective.ALL_REDUCE, lay.reduce_bytes_per_param * lay.params_stage,
                                   64, 1, **runs))
    # linear in r (the 1-D tensors, all-reduced uncompressed, are the constant): a + b·r
    assert comm[4] - comm[2] == pytest.approx(2.0 * (comm[2] - comm[1]), rel=1e-9)
    assert comm[2] - comm[1] > 0.5 * comm[1]
    assert full / comm[1] > 1000.0  # 4096-wide matrices: r(n+m) ≪ n·m


# ------------------------------------------------------------------ when it pays
@pytest.mark.parametrize("zero,fmt", [(ZeroStage.NONE, PSGD), (ZeroStage.PARAMETERS, INT4)])
def test_a_slow_network_with_many_replicas_gets_faster(zero, fmt):
    cluster = _slow_network()
    base = estimate(MODEL, cluster, WL, make_plan(dp=64, zero=zero))
    comp = estimate(MODEL, cluster, WL, make_plan(dp=64, zero=zero, grad_compression=fmt))
    assert comp.step_time_s < 0.9 * base.step_time_s
    assert comp.time.dp_comm_s < base.time.dp_comm_s


def test_nvlink_only_data_parallelism_does_not_pay():
    cluster = load_cluster("dgx-h100", num_gpus=8)
    base = estimate(MODEL, cluster, WL, make_plan(dp=8))
    psgd = estimate(MODEL, cluster, WL, make_plan(dp=8, grad_compression=PSGD))
    assert psgd.step_time_s > base.step_time_s  # the compression kernels cost more than NVLink saves
    # inside one node DeepSpeed's qgZ falls back to the 16-bit reduce-scatter: the same step
    z3 = estimate(MODEL, cluster, WL, make_plan(dp=8, zero=ZeroStage.PARAMETERS))
    q = estimate(MODEL, cluster, WL, make_plan(dp=8, zero=ZeroStage.PARAMETERS, grad_compression=INT4))
    assert q.step_time_s == z3.step_time_s


# ------------------------------------------------------------------ breakdowns and memory
def test_kernels_are_named_in_the_step_and_layer_details():
    cluster = _slow_network()
    psgd = estimate(MODEL, cluster, WL, make_plan(dp=64, grad_compression=PSGD))
    assert psgd.step_detail[GRAD_COMPRESSION] > 0.0
    # the DP line of the step (ZeRO-0: all after the pipeline) is its collectives plus the kernels
    assert psgd.step_detail["DP/ZeRO collectives (exposed)"] + psgd.step_detail[GRAD_COMPRESSION] == pytest.approx(
        psgd.time.dp_comm_s, rel=1e-12)
    q = estimate(MODEL, cluster, WL, make_plan(dp=64, zero=ZeroStage.PARAMETERS, grad_compression=INT4))
    assert q.layer_detail["bwd"][GRAD_COMPRESSION] > 0.0
    assert GRAD_COMPRESSION not in estimate(MODEL, cluster, WL, make_plan(dp=64)).step_detail
    for e in (psgd, q):
        assert e.step_time_s == pytest.approx(e.time.total, rel=1e-9)


def test_powersgd_error_feedback_is_in_the_gradients_line():
    cluster = _slow_network()
    base = estimate(MODEL, cluster, WL, make_plan(dp=64))
    psgd = estimate(MODEL, cluster, WL, make_plan(dp=64, grad_compression=PSGD))
    params = MODEL.num_params  # one stage, no TP: every parameter on every GPU
    extra = psgd.memory.gradients_bytes - base.memory.gradients_bytes
    assert 2.0 * params <= extra <= 2.0 * params * 1.001  # a bf16 error per parameter, plus P and Q
    assert psgd.memory.optimizer_bytes == base.memory.optimizer_bytes
    q = estimate(MODEL, cluster, WL, make_plan(dp=64, zero=ZeroStage.PARAMETERS, grad_compression=INT4))
    z3 = estimate(MODEL, cluster, WL, make_plan(dp=64, zero=ZeroStage.PARAMETERS))
    assert q.memory.total == z3.memory.total  # qgZ keeps no error


# ------------------------------------------------------------------ rules and bad input
@pytest.mark.parametrize("kw,words", [
    (dict(dp=64, zero=ZeroStage.OPTIMIZER, grad_compression=PSGD), "DDP comm hook"),
    (dict(dp=64, zero=ZeroStage.OPTIMIZER, grad_compression=INT4), "ZeRO-3"),
    (dict(dp=32, tp=2, zero=ZeroStage.PARAMETERS, grad_compression=INT4), "ZeRO-3 over all ranks"),
    (dict(dp=64, zero=ZeroStage.PARAMETERS, dp_shard=8, grad_compression=INT4), "HSDP"),
    (dict(dp=64, powersgd_rank=2), "powersgd only"),
])
def test_rules_name_what_it_cannot_combine_with(kw, words):
    rejected = check_plan(make_plan(**kw), MODEL, load_cluster("dgx-h100", num_gpus=64), WL)
    assert rejected is not None and words in rejected.reason


def test_one_replica_and_moe_models_are_refused():
    assert "DP×CP > 1" in check_plan(make_plan(tp=8, grad_compression=PSGD), MODEL,
                                     load_cluster("dgx-h100", num_gpus=8), WL).reason
    moe = load_model("mixtral-8x7b")
    assert "dense models" in check_plan(make_plan(dp=64, grad_compression=PSGD), moe,
                                        load_cluster("dgx-h100", num_gpus=64), WL).reason


SPEC = ("--model", "llama3-8b", "--gpus", "64", "--batch", "64", "--seq", "4096")


def test_cli_flags_and_plan_string(capsys):
    code, out, _ = run(capsys, "estimate", *SPEC, "--dp", "64", "--grad-compression", "powersgd", "--powersgd-rank", "2")
    assert code == 0 and "gc:powersgd/r2" in out and "gc: compressed DP gradients" in out
    code, again, _ = run(capsys, "estimate", *SPEC, "--plan", "TP1 PP1 DP64 mb1 rc:none gc:powersgd/r2 attn:flash3")
    assert code == 0 and again.splitlines()[2] == out.splitlines()[2]  # the plan line, step time below it
    assert again.splitlines()[4] == out.splitlines()[4]
    code, out, err = run(capsys, "estimate", *SPEC, "--dp", "64", "--grad-compression", "1bit")
    assert_user_error(code, out, err)
    assert "grad_compression" in err and "int4" in err and "powersgd" in err
    code, out, err = run(capsys, "estimate", *SPEC, "--dp", "64", "--powersgd-rank", "2")
    assert_user_error(code, out, err)
    assert "--powersgd-rank" in err


def test_search_takes_the_format_as_a_pin(capsys):
    code, out, _ = run(capsys, "search", "--model", "llama3-8b", "--gpus", "16", "--batch", "32", "--seq", "2048",
                       "--grad-compression", "powersgd", "--top", "3")
    rows = [line for line in out.splitlines() if re.search(r"\bTP\d+ .* rc:[a-z]", line)]
    assert code == 0 and rows and all("gc:powersgd" in line and "zero" not in line for line in rows)


# ------------------------------------------------------------------ engines
def test_megatron_and_torchtitan_refuse_and_mask():
    p = make_plan(dp=64, grad_compression=PSGD)
    one = PlanBatch.from_plans([p, make_plan(dp=64)])
    for mod in (megatron, torchtitan):
        with pytest.raises(SpecError) as e:
            mod.check(p, MODEL, WL)
        assert "grad_compression" in str(e.value) and "\n" not in str(e.value)
        assert mod.SUPPORT.limits.engine_rule(one, MODEL, WL).tolist() == [True, False]
    with pytest.raises(SpecError, match="int4"):
        deepspeed.check(p, MODEL, WL)
    assert deepspeed.unbuildable(one, MODEL, WL).tolist() == [True, False]
    with pytest.raises(SpecError, match="--grad-compression"):
        check_runnable(RunConfig(model=MODEL, model_name="llama3-8b", workload=Workload(global_batch_size=2, seq_len=128), plan=replace(
            make_plan(dp=2), grad_compression=PSGD)))


def test_deepspeed_writes_qgz():
    p = make_plan(dp=16, zero=ZeroStage.PARAMETERS, grad_compression=INT4)
    cfg = deepspeed.config(p, MODEL, WL)
    assert cfg["zero_optimization"]["zero_quantized_gradients"] is True and cfg["zero_optimization"]["stage"] == 3
    assert "zero_quantized_gradients" not in deepspeed.config(replace(p, grad_compression=NONE), MODEL, WL)[
        "zero_optimization"]


@pytest.mark.skipif(not installed("deepspeed"), reason=SKIP_DS)
def test_deepspeed_config_class_reads_qgz(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import deepspeed.runtime.config as dsc
    p = make_plan(dp=16, zero=ZeroStage.PARAMETERS, grad_compression=INT4)
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dsc.dist, "get_world_size", lambda *a, **k: 16)
    c = dsc.DeepSpeedConfig(json.loads(json.dumps(deepspeed.config(p, MODEL, WL))))
    assert c.zero_config.zero_quantized_gradients and c.zero_optimization_stage == 3


def test_default_is_no_compression():
    p = make_plan(dp=8)
    assert p.grad_compression is NONE and "gc:" not in p.describe()
    batch = PlanBatch.from_plans([p])
    assert np.all(batch.grad_compression_code == NONE.code)


def test_an_engine_search_keeps_the_pin(capsys):
    # DeepSpeed runs qgZ: every plan it ranks has it; Megatron runs neither format: a one-line error
    args = ("search", "--model", "llama3-8b", "--gpus", "16", "--batch", "32", "--seq", "2048", "--top", "2")
    code, out, _ = run(capsys, *args, "--engine", "deepspeed", "--grad-compression", "int4")
    rows = [line for line in out.splitlines() if re.search(r"\bTP\d+ .* rc:[a-z]", line)]
    assert code == 0 and rows and all("gc:int4" in line and "zero3" in line for line in rows)
    code, out, err = run(capsys, *args, "--engine", "megatron", "--grad-compression", "powersgd")
    assert code == 2 and "Traceback" not in err
