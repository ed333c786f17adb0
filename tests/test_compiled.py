"""torch.compile'd blocks (Plan.compiled; torchtitan's --compile.enable, paraplan run --compile):
what one H100 measured (calibration/h100_2026-11-23, README there) and how the model prices it.
Golden tests re-predict the recorded blocks and runs; the rest check the wiring."""

from __future__ import annotations

import glob
import json
from dataclasses import replace
from pathlib import Path

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
    """Four `paraplan run --compile` steps on one H100 (embedding, LM head, loss and AdamW
    eager, as torchtitan), predicted on the profile calibrate measured in the same lease:
    its compiled_elementwise_ratio came from a microbenchmark, not from these runs."""
    paths = sorted(glob.glob(str(DIR / "compiled" / "c*.json")))
    assert len(paths) == 4
    for metric, mean, worst in (("step_time", 4.0, 6.0), ("memory", 2.0, 2.5)):
        result = compare_reports(load_reports(paths, str(PROFILE)), metric)
        assert all("compiled" in r["plan"] for r in result["rows"])
        assert result["summary"]["mean_abs_pct_error"] < mean, metric
        assert result["summary"]["max_abs_pct_error"] < worst, metric


def test_compiled_runs_were_faster_and_smaller_than_the_same_runs_eager():
    """The measurement the model is held to: each compiled run against its eager twin."""
    twins = {"c1.json": DIR.parent / "h100_2026-11-22" / "runs_b" / "run1.json",
             "c4.json": DIR.parent / "h100_2026-11-22" / "runs_b" / "run4.json",
             "cs1.json": DIR / "calibrate" / "small1.json"}
    for name, eager_path in twins.items():
        c = json.loads((DIR / "compiled" / name).read_text())
        e = json.loads(eager_path.read_text())
        assert c["measured"]["step_time_s"] < e["measured"]["step_time_s"], name
        assert c["measured"]["peak_memory_bytes"] < e["measured"]["peak_memory_bytes"], name


def test_compiled_element_wise_is_the_gpus_ratio_of_eager():
    cluster = load_cluster("dgx-h100", num_gpus=8)
    gpu = cluster.gpu
    assert gpu.compiled_elementwise_ratio == pytest.approx(0.434)
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
