"""torch.compile'd blocks (Plan.compiled; torchtitan's --compile.enable, paraplan run --compile):
what one H100 measured (calibration/h100_2026-11-23, README there) and how the model prices it.
Golden tests re-predict the recorded blocks and runs; the rest check the wiring."""

from __future__ import annotations

import glob
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

import pytest

from paraplan.calibrate.measurements import Measurements
from paraplan.calibrate.profile import build_profile, compiled_elementwise_ratio
from paraplan.cost import memory as mem
from paraplan.cost.evaluate import evaluate
from paraplan.errors import SpecError
from paraplan.export import torchtitan
from paraplan.plan.axes import Recompute, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.report.compare import compare_reports, load_reports
from paraplan.run.cli import config_from_argv
from paraplan.specs.catalog import cluster_from_text, load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

DIR = Path(__file__).resolve().parents[1] / "calibration" / "h100_2026-11-23"
PROFILE = DIR / "compiled" / "h100.toml"


def _block_spec(row: dict):
    return replace(load_model("llama3-8b"), num_layers=row["layers"], hidden_size=row["hidden"],
                   num_heads=row["heads"], num_kv_heads=row["kv_heads"], head_dim=row["hidden"] // row["heads"],
                   ffn_hidden_size=row["ffn"], vocab_size=512)


def _kept_elements(row: dict, compiled: bool) -> float:
    """The model's activation elements (2 bytes) per token per hidden unit of one layer, as
    calibration/gpu_compile.py measured them: bf16 parameters (no autocast), eager layers."""
    spec = _block_spec(row)
    plan = make_plan(micro_batch_size=row["micro_batch"], fused_kernels=False, compiled=compiled)
    stored, _, _ = mem.layer_activation_bytes(spec, plan, row["seq"], recompute_code=Recompute.NONE.code,
                                              precision=Precision.BF16)
    return float(stored) / (row["micro_batch"] * row["seq"]) / row["hidden"] / 2.0


def test_recorded_blocks_keep_what_the_model_counts_eager_and_compiled():
    """Three stacks of 4 blocks on one H100, eager and each block compiled: the bytes the
    forward left for the backward, per token per hidden unit per layer."""
    rows = [r for r in json.loads((DIR / "compile.json").read_text())["rows"] if "error" not in r]
    assert len(rows) == 6
    for r in rows:
        predicted = _kept_elements(r, r["compiled"])
        assert predicted == pytest.approx(r["kept_elements_per_token_per_h_per_layer"], rel=0.04), r["label"]
    # compiling dropped SiLU's output, f/h elements, at both widths
    for label in {r["label"] for r in rows}:
        eager, compiled = (next(r for r in rows if r["label"] == label and r["compiled"] is c) for c in (False, True))
        saved = (eager["kept_elements_per_token_per_h_per_layer"] - compiled["kept_elements_per_token_per_h_per_layer"])
        assert saved == pytest.approx(eager["ffn"] / eager["hidden"], rel=0.01), label
        assert _kept_elements(eager, False) - _kept_elements(eager, True) == pytest.approx(eager["ffn"] / eager["hidden"])


def test_recorded_compiled_runs_on_the_profile_measured_beside_them():
    """Six `paraplan run --compile` steps on one H100 (embedding, LM head, loss and AdamW
    eager, as torchtitan), predicted on the profile calibrate measured in the same lease:
    its compiled_elementwise_ratio came from a microbenchmark, not from these runs."""
    paths = sorted(glob.glob(str(DIR / "compiled" / "c*.json")))
    assert len(paths) == 4
    # and two with recomputation (full, selective), measured in a later lease
    paths += sorted(glob.glob(str(DIR / "compiled_rc" / "c*.json")))
    assert len(paths) == 6
    for metric, mean, worst in (("step_time", 4.0, 6.0), ("memory", 2.0, 2.5)):
        result = compare_reports(load_reports(paths, str(PROFILE)), metric)
        assert all("compiled" in r["plan"] for r in result["rows"])
        assert result["summary"]["mean_abs_pct_error"] < mean, metric
        assert result["summary"]["max_abs_pct_error"] < worst, metric


def test_compiled_element_wise_is_the_gpus_ratio_of_eager():
    cluster = load_cluster("dgx-h100", num_gpus=8)
    gpu = cluster.gpu
    assert gpu.compiled_elementwise_ratio == pytest.approx(0.405)  # the median of three H100 calibrations
    wl = Workload(global_batch_size=8, seq_len=4096)
    spec = load_model("llama3-8b")
    eager = evaluate(spec, cluster, wl, make_plan(dp=8, fused_kernels=False)).layer_detail
    comp = evaluate(spec, cluster, wl, make_plan(dp=8, fused_kernels=False, compiled=True)).layer_detail
    for part in ("fwd", "bwd"):
        ratio = float(comp[part]["element-wise"]) / float(eager[part]["element-wise"])
        assert ratio == pytest.approx(gpu.compiled_elementwise_ratio, rel=1e-9), part
    # GEMMs and attention are not compiled
    assert float(comp["fwd"]["attention"]) == float(eager["fwd"]["attention"])
    # Megatron's fused layers ignore the flag
    fused = evaluate(spec, cluster, wl, make_plan(dp=8)).layer_detail
    fused_c = evaluate(spec, cluster, wl, make_plan(dp=8, compiled=True)).layer_detail
    assert float(fused_c["fwd"]["element-wise"]) == float(fused["fwd"]["element-wise"])


def test_calibrate_writes_the_compiled_ratio_only_where_it_measured_it():
    raw = json.loads((PROFILE.parent / "h100_raw.json").read_text())
    m = Measurements.from_json(json.dumps(raw))
    e = m.elementwise
    assert e.compiled_time_s is not None and e.compiled_time_s < e.time_s
    ratio = compiled_elementwise_ratio(m)
    assert ratio == pytest.approx(e.compiled_time_s / e.time_s)
    prof = build_profile(m, name="t")
    gpu = cluster_from_text(prof.toml, "t").gpu
    assert gpu.compiled_elementwise_ratio == pytest.approx(ratio, abs=1e-4)
    # an older raw file (no compiled time) leaves the GPU's default: compiled priced as eager
    raw["elementwise"].pop("compiled_time_s")
    old = build_profile(Measurements.from_json(json.dumps(raw)), name="t")
    assert "compiled_elementwise_ratio" not in old.toml
    assert cluster_from_text(old.toml, "t").gpu.compiled_elementwise_ratio == 1.0


def test_torchtitan_exports_compile_as_priced_and_refuses_async_tp_without_it():
    model, wl = load_model("llama3-8b"), Workload(global_batch_size=64, seq_len=8192)
    plan = torchtitan.SUPPORT.adapt(make_plan(tp=2, dp=4, sequence_parallel=True, zero=ZeroStage.PARAMETERS))
    assert plan.compiled and not plan.fused_kernels
    assert torchtitan.job_config(plan, model, wl)["compile"]["enable"] is True
    with pytest.raises(SpecError, match="compiled"):
        torchtitan.check(replace(plan, tp_overlap=True, compiled=False), model, wl)


def test_run_compile_flag_reaches_the_plan():
    base = ["--model", "llama3-8b", "--layers", "2", "--hidden", "256", "--heads", "4", "--kv-heads", "2",
            "--device", "cpu"]
    assert config_from_argv(base + ["--compile"]).plan.compiled
    assert not config_from_argv(base).plan.compiled
    assert "compiled" in config_from_argv(base + ["--compile"]).plan.describe()
    # the report's command reproduces the run (the recorded c*.json predate this and lack it)
    assert "--compile" in config_from_argv(base + ["--compile"]).command_line().split()
    assert "--compile" not in config_from_argv(base).command_line().split()


# ---------------------------------------------------------------- the host issuing eager kernels

HOST_PROFILE = DIR / "host" / "h100.toml"


def test_host_idle_closed_form_matches_the_queue_issued_one_by_one():
    """host_idle_s against a FIFO stream simulated group by group: the host issues each
    after `h`, the GPU starts it when both it is issued and the GPU is free."""
    from paraplan.cost.host import host_idle_s
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(0, 40))
        g, h, s0 = rng.uniform(0.0, 2.0), rng.uniform(0.0, 2.0), rng.uniform(0.0, 10.0) * rng.integers(0, 2)
        host, gpu_free, idle = 0.0, s0, 0.0  # time 0: the GPU has s0 of work queued
        for _ in range(n):
            host += h
            start = max(gpu_free, host)
            idle += start - gpu_free
            gpu_free = start + g
        got_idle, got_slack = host_idle_s(n, g, h, s0)
        assert float(got_idle) == pytest.approx(idle, abs=1e-9), (n, g, h, s0)
        assert float(got_slack) == pytest.approx(gpu_free - host if n else s0, abs=1e-9), (n, g, h, s0)


def test_small_eager_runs_wait_for_their_host_as_measured(tmp_path):
    """The H100 profile with the host time of an eager layer (2.6 ms forward + backward at
    negligible size): the smallest run (8 layers of hidden 1024) came out 6.7% fast without
    it on this profile; the queue model brings it within 5%, and leaves the large runs where they were."""
    small = [str(DIR / "calibrate" / "small1.json")]
    large = [str(DIR.parent / "h100_2026-11-22" / "runs_b" / f"run{i}.json") for i in (1, 4, 7)]
    gpu = load_cluster(str(HOST_PROFILE), num_gpus=1).gpu
    assert gpu.eager_layer_host_s == pytest.approx(2.607e-3, rel=0.01)
    with_host = compare_reports(load_reports(small + large, str(HOST_PROFILE)), "step_time")["rows"]
    text = HOST_PROFILE.read_text().replace("eager_layer_host_us", "# eager_layer_host_us")
    no_host_path = tmp_path / "no_host.toml"
    no_host_path.write_text(text)
    without = compare_reports(load_reports(small + large, str(no_host_path)), "step_time")["rows"]
    assert without[0]["error_pct"] < -6.0 and abs(with_host[0]["error_pct"]) < 5.0
    for a, b in zip(with_host[1:], without[1:]):
        assert abs(a["predicted"] - b["predicted"]) / b["predicted"] < 0.005
        assert abs(a["error_pct"]) < 2.0


def test_full_recomputation_reissues_the_forward_from_the_host():
    """A host-bound eager plan (8 layers of hidden 1536, one 1,024-token sequence per
    micro-batch, 64 of them): full recomputation re-issues every layer's forward inside the
    backward, so it costs at least the forward's host time per layer and micro-batch."""
    from paraplan.plan.axes import Recompute
    cluster = load_cluster(str(HOST_PROFILE), num_gpus=1)
    spec = replace(load_model("llama3-8b"), num_layers=8, hidden_size=1536, ffn_hidden_size=5376, num_heads=12,
                   num_kv_heads=12, head_dim=128)
    wl = Workload(global_batch_size=64, seq_len=1024)
    step = {rc: float(np.ravel(evaluate(spec, cluster, wl, make_plan(fused_kernels=False, recompute=rc))
                               .critical_stage_s)[0]) for rc in (Recompute.NONE, Recompute.FULL)}
    from paraplan.cost.host import HOST_FORWARD_SHARE
    reissue = 64 * 8 * HOST_FORWARD_SHARE * cluster.gpu.eager_layer_host_s
    assert step[Recompute.FULL] - step[Recompute.NONE] >= 0.95 * reissue


def test_the_step_breakdown_shows_the_gpu_waiting_for_its_host():
    from paraplan.cost.estimate import estimate
    from paraplan.report.table import time_table
    cluster = load_cluster(str(HOST_PROFILE), num_gpus=1)
    spec = replace(load_model("llama3-8b"), num_layers=8, hidden_size=1536, ffn_hidden_size=5376, num_heads=12,
                   num_kv_heads=12, head_dim=128)
    wl = Workload(global_batch_size=64, seq_len=1024)
    est = estimate(spec, cluster, wl, make_plan(fused_kernels=False))
    assert est.time.host_wait_s > 0.1 * est.step_time_s  # host-bound: hidden 1536, 1,024 tokens
    assert sum(est.time.parts().values()) == pytest.approx(est.step_time_s)
    assert "GPU waiting for the host" in time_table(est)
    fused = estimate(spec, cluster, wl, make_plan())
    assert fused.time.host_wait_s == 0.0 and "GPU waiting for the host" not in time_table(fused)


def test_host_wait_applies_to_eager_layers_only():
    gpu = load_cluster(str(HOST_PROFILE), num_gpus=8)
    wl = Workload(global_batch_size=8, seq_len=512)
    spec = replace(load_model("llama3-8b"), num_layers=8, hidden_size=512, num_heads=4, num_kv_heads=4,
                   head_dim=128, ffn_hidden_size=1536, vocab_size=1024)
    step = {name: evaluate(spec, gpu, wl, make_plan(dp=8, **kw)).layer_detail["bwd"]["waiting for the host (eager)"]
            for name, kw in (("eager", {"fused_kernels": False}), ("compiled", {"fused_kernels": False, "compiled": True}),
                             ("fused", {}))}
    assert float(step["eager"]) > 0.0 and float(step["compiled"]) == 0.0 and float(step["fused"]) == 0.0
    # the presets do not model the host
    preset = load_cluster("dgx-h100", num_gpus=8)
    assert preset.gpu.eager_layer_host_s == 0.0
    d = evaluate(spec, preset, wl, make_plan(dp=8, fused_kernels=False)).layer_detail
    assert float(d["bwd"]["waiting for the host (eager)"]) == 0.0


def test_calibrate_writes_the_eager_layer_host_time_from_its_two_stacks():
    raw = json.loads((HOST_PROFILE.parent / "h100_raw.json").read_text())
    m = Measurements.from_json(json.dumps(raw))
    s = m.host_layer
    assert s.three_layers_s > s.one_layer_s
    gpu = cluster_from_text(build_profile(m, name="t").toml, "t").gpu
    assert gpu.eager_layer_host_s == pytest.approx((s.three_layers_s - s.one_layer_s) / 2.0, rel=1e-3)


# ---------------------------------------------------------------- an eager MoE layer on one GPU

def _moe_layer_errors(profile: str) -> list[float]:
    from paraplan.cost.moe import moe_layer_costs
    presets = {2048: "qwen3-30b-a3b", 2880: "gpt-oss-120b", 4096: "qwen3-235b-a22b", 7168: "deepseek-v3"}
    errors = []
    for r in json.loads((DIR / "moe_layer" / "moe_layer.json").read_text())["rows"]:
        model = replace(load_model(presets[r["hidden"]]), shared_expert_ffn_hidden_size=0)
        cluster = load_cluster(profile, num_gpus=r["ep"])
        wl = Workload(global_batch_size=r["ep"], seq_len=r["tokens"], precision="bf16", moe_imbalance=1.0)
        c = moe_layer_costs(model, cluster, wl, make_plan(dp=r["ep"], ep=r["ep"], fused_kernels=False),
                            r["tokens"], 1, Precision.BF16)
        # one GPU: no all-to-all, so none of the sort by local expert around it either
        errors.append(float(c.fwd_compute_s + c.bwd_compute_s - 2.0 * c.sort_s) / r["fwd_bwd_s"] - 1.0)
    return errors


def test_recorded_eager_moe_layers_on_the_profile_measured_beside_them(tmp_path):
    """Five MoE layers as torchtitan runs a rank's share (router, grouped GEMMs, scatter-add
    combine) on one H100, forward + backward, priced by cost/moe.py on the profile with the
    measured scatter-add; with the scatter at the copy rate they come out much too fast."""
    profile = DIR / "scatter" / "h100.toml"
    errors = _moe_layer_errors(str(profile))
    assert len(errors) == 5
    assert max(abs(e) for e in errors) < 0.2 and np.mean(np.abs(errors)) < 0.11, errors
    at_copy_rate = tmp_path / "copy_rate.toml"
    at_copy_rate.write_text(profile.read_text().replace("scatter_add_efficiency", "# scatter_add_efficiency"))
    before = _moe_layer_errors(str(at_copy_rate))
    assert np.mean(np.abs(before)) > 0.15 and max(before) < 0.1, before


def test_fused_permutation_keeps_the_copy_rate():
    from paraplan.cost.moe import moe_layer_costs
    cluster = load_cluster("dgx-h100", num_gpus=8)
    no_atomics = replace(cluster, gpu=replace(cluster.gpu, scatter_add_efficiency=None))
    model, wl = load_model("qwen3-30b-a3b"), Workload(global_batch_size=8, seq_len=4096, moe_imbalance=1.0)

    def cost(c, fused):
        mc = moe_layer_costs(model, c, wl, make_plan(dp=8, ep=8, fused_kernels=fused), 4096, 1, Precision.BF16)
        return float(mc.fwd_compute_s), float(mc.bwd_compute_s)
    assert cost(cluster, True) == cost(no_atomics, True)  # Megatron's fused permutation: no atomics priced
    # an eager engine: the scatter half of the permutation at 0.149 of the bandwidth, forward
    # (the combine) and backward (the gather's gradient) alike
    copies_bytes = 2.0 * 2.0 * 4096 * model.top_k * model.hidden_size
    extra = copies_bytes / cluster.gpu.hbm_bw_bytes_per_s * (1 / 0.149 - 1 / cluster.gpu.memory_bw_efficiency)
    for got, base in zip(cost(cluster, False), cost(no_atomics, False)):
        assert got - base == pytest.approx(extra, rel=1e-9)


def test_the_ranking_shows_a_host_column_only_where_a_plan_waits_for_its_host():
    from paraplan.cost.estimate import estimate
    from paraplan.report.table import ranking_table
    spec = replace(load_model("llama3-8b"), num_layers=8, hidden_size=1536, ffn_hidden_size=5376, num_heads=12,
                   num_kv_heads=12, head_dim=128)
    wl = Workload(global_batch_size=64, seq_len=1024)
    waits = estimate(spec, load_cluster(str(HOST_PROFILE), num_gpus=1), wl, make_plan(fused_kernels=False))
    fused = estimate(spec, load_cluster("dgx-h100", num_gpus=1), wl, make_plan())
    header = ranking_table([waits, fused]).splitlines()[0].split()
    assert "host" in header
    row = ranking_table([waits]).splitlines()[2].split()
    assert row[-3] == f"{100 * waits.time.host_wait_s / waits.step_time_s:.1f}%"  # host, then "N GiB"
    assert "host" not in ranking_table([fused]).splitlines()[0].split()


def test_no_compile_prices_and_exports_torchtitan_eager(capsys, tmp_path):
    from support import run
    out = tmp_path / "tt.toml"
    args = ["--model", "llama3-8b", "--gpus", "16", "--batch", "64", "--seq", "4096"]
    code, text, err = run(capsys, "export", "--format", "torchtitan", *args, "-o", str(out), "--no-compile")
    assert code == 0, err
    assert "compiled" not in text.splitlines()[0] and "tpov" not in text.splitlines()[0]
    toml = out.read_text()
    assert "\nenable = false\n" in toml and "enable_async_tensor_parallel = false" in toml
    assert 'components = ["model"]' in toml  # the loss eager too, as priced
    code, compiled_text, _ = run(capsys, "export", "--format", "torchtitan", *args, "-o", str(tmp_path / "c.toml"))
    assert code == 0 and "compiled" in compiled_text.splitlines()[0]
    assert 'components = ["model", "loss"]' in (tmp_path / "c.toml").read_text()  # torchtitan's default
    # the eager plan is slower, as measured: its predicted step is longer
    step = lambda t: float(t.splitlines()[0].rsplit("predicted step ", 1)[1].split()[0])  # noqa: E731
    assert step(text) > step(compiled_text)


@pytest.mark.parametrize("argv,needle", [
    (["export", "--format", "megatron", "-o", "m.sh", "--no-compile"], "--no-compile is for torchtitan"),
    (["search", "--no-compile"], "needs --engine torchtitan"),
    (["estimate", "--engine", "deepspeed", "--no-compile"], "--no-compile is for torchtitan"),
])
def test_no_compile_elsewhere_is_one_line_exit_2(capsys, tmp_path, monkeypatch, argv, needle):
    from support import assert_user_error, run
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *argv, "--model", "llama3-8b", "--gpus", "16")
    assert_user_error(code, out, err)
    assert needle in err


def test_a_compiled_loss_is_faster_and_smaller_on_an_eager_engine_only():
    # torchtitan compiles the loss with the blocks (Plan.compiled_loss): one fused kernel each
    # way over the 16-bit logits, no fp32 copy kept; Megatron's fused loss is not torch.compile's
    spec, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=16, seq_len=8192)
    eager = make_plan(dp=8, micro_batch_size=2, fused_kernels=False, compiled=True)
    loss = replace(eager, compiled_loss=True)
    e, c = evaluate(spec, cluster, wl, eager), evaluate(spec, cluster, wl, loss)
    assert c.memory.total < e.memory.total and c.step_time_s < e.step_time_s
    fused = make_plan(dp=8, micro_batch_size=2)
    f, fc = evaluate(spec, cluster, wl, fused), evaluate(spec, cluster, wl, replace(fused, compiled_loss=True))
    assert fc.memory.total == f.memory.total and fc.step_time_s == f.step_time_s


def test_an_eager_loss_over_tp_is_priced_op_by_op_only_where_the_engine_runs_it_so():
    # torch's loss_parallel and torchtitan 0.3's _LossParallelCrossEntropy keep fp32
    # log-probabilities and an unfused backward (Plan.loss_parallel); DeepSpeed's AutoTP does not
    from paraplan.export.registry import exporter
    assert exporter("torchtitan").SUPPORT.loss_parallel and not exporter("deepspeed").SUPPORT.loss_parallel
    spec, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=16, seq_len=8192)
    for tp, moves in ((2, True), (1, False)):
        plain = make_plan(tp=tp, dp=8 // tp, micro_batch_size=2, fused_kernels=False)
        e, lp = evaluate(spec, cluster, wl, plain), evaluate(spec, cluster, wl, replace(plain, loss_parallel=True))
        assert bool(lp.memory.logits_bytes > e.memory.logits_bytes) == moves
        assert bool(lp.step_time_s > e.step_time_s) == moves
