"""paraplan fit: a GPU's physical knobs fitted to measured runs. The runs here are made by the
model itself at known knob values, so a fit must recover them; bounds hold; leave-one-out and
out-of-source predictions come from fits that did not see the run; bad input is one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from paraplan.specs.catalog import load_cluster, load_gpu
from paraplan.validate.fit import KNOBS, fit_gpu, source_key
from paraplan.validate.training import predict_on, row_cluster, row_setup

from support import TRAINING_HEADER, TRAINING_ROW, assert_user_error, run, write_csv

H100 = "h100-sxm-80gb"
# small dense runs with every plan knob pinned (fast to search), BF16 and FP8, two sources
BASE = {**TRAINING_ROW, "model": "gpt3-5b", "layers": "", "hidden": "", "ffn_hidden": "", "heads": "", "kv_heads": "",
        "vocab": "", "gpu": "H100", "gpus_per_node": "8", "seq_len": "2048", "framework": "Megatron-Core",
        "recompute": "none", "zero": "1", "sp": "yes", "vp": "", "cp": "1", "ep": "", "notes": ""}
SHAPES = [dict(num_gpus="8", global_batch="64", micro_batch="2", tp="2", pp="1", dp="4"),
          dict(num_gpus="16", global_batch="128", micro_batch="1", tp="4", pp="2", dp="2"),
          dict(num_gpus="8", global_batch="32", micro_batch="4", tp="1", pp="1", dp="8")]


ROWWISE_LABEL = "BF16 + Float8 linear (float8 rowwise)"  # torchtitan's label


def _runs(sustained: float, fp8: float, rowwise: float | None = None) -> list[dict]:
    """Rows whose measured iteration time is the model's own prediction at these knobs (with
    `rowwise`, row-wise FP8 runs too)."""
    rows = []
    precisions = ("bf16", "fp8") + ((ROWWISE_LABEL,) if rowwise is not None else ())
    for i, shape in enumerate(SHAPES):
        for precision in precisions:
            row = {**BASE, **shape, "precision": precision, "id": f"r{i}-{precision[-7:]}",
                   "source": f"lab-{'a' if i % 2 else 'b'}@abc:bench.md", "metric_id": "iteration_time_s"}
            setup = row_setup(row, "rows.csv", 2)
            cluster = row_cluster(setup)
            gpu = replace(cluster.gpu, sustained_compute_ratio=sustained, fp8_gemm_efficiency_ratio=fp8,
                          fp8_rowwise_gemm_efficiency_ratio=1.0 if rowwise is None else rowwise)
            row["value"] = repr(predict_on(row, setup, replace(cluster, gpu=gpu))[0])
            rows.append(row)
    return rows


@pytest.mark.parametrize("sustained,fp8", [(0.6, 0.75), (0.8, 0.9)])
def test_fit_recovers_the_knobs_that_made_the_runs(tmp_path, sustained, fp8):
    path = write_csv(tmp_path, TRAINING_HEADER, _runs(sustained, fp8))
    result = fit_gpu([str(path)], load_gpu(H100))
    assert len(result.runs) == 6
    assert result.values["sustained_compute_ratio"] == pytest.approx(sustained, abs=0.02)
    assert result.values["fp8_gemm_efficiency_ratio"] == pytest.approx(fp8, abs=0.05)
    assert result.mean_abs_pct(result.in_sample) < 1.5
    assert result.mean_abs_pct(result.leave_one_out) < 3.0


def test_fit_recovers_the_rowwise_ratio_from_rowwise_runs_alone(tmp_path):
    """Row-wise FP8 runs inform the row-wise ratio and nothing else: the per-tensor FP8 ratio
    comes from the per-tensor runs, the row-wise one from the row-wise runs at both."""
    path = write_csv(tmp_path, TRAINING_HEADER, _runs(0.7, 0.9, rowwise=0.6))
    result = fit_gpu([str(path)], load_gpu(H100))
    assert len(result.runs) == 9
    assert result.values["sustained_compute_ratio"] == pytest.approx(0.7, abs=0.02)
    assert result.values["fp8_gemm_efficiency_ratio"] == pytest.approx(0.9, abs=0.05)
    assert result.values["fp8_rowwise_gemm_efficiency_ratio"] == pytest.approx(0.6, abs=0.05)
    assert result.mean_abs_pct(result.in_sample) < 1.5
    # without row-wise runs the knob keeps the preset's value
    plain = fit_gpu([str(write_csv(tmp_path, TRAINING_HEADER, _runs(0.7, 0.9)))], load_gpu(H100))
    assert plain.values["fp8_rowwise_gemm_efficiency_ratio"] == load_gpu(H100).fp8_rowwise_gemm_efficiency_ratio


def test_fitted_knobs_stay_within_their_bounds(tmp_path):
    # runs slower than the slowest knob can make them: the fit stops at the bound
    rows = [{**r, "value": repr(float(r["value"]) * 3)} for r in _runs(0.5, 0.5)]
    result = fit_gpu([str(write_csv(tmp_path, TRAINING_HEADER, rows))], load_gpu(H100))
    for knob in KNOBS:
        assert knob.low <= result.values[knob.field] <= knob.high
    assert result.values["sustained_compute_ratio"] == KNOBS[0].low


def test_bf16_runs_leave_the_fp8_knob_at_the_preset(tmp_path):
    rows = [r for r in _runs(0.7, 0.6) if r["precision"] == "bf16"]
    result = fit_gpu([str(write_csv(tmp_path, TRAINING_HEADER, rows))], load_gpu(H100))
    assert result.values["fp8_gemm_efficiency_ratio"] == load_gpu(H100).fp8_gemm_efficiency_ratio
    assert result.values["sustained_compute_ratio"] == pytest.approx(0.7, abs=0.02)


def test_fit_cli_writes_a_profile_that_hardware_reads(capsys, tmp_path):
    path = write_csv(tmp_path, TRAINING_HEADER, _runs(0.65, 0.8))
    out_path = tmp_path / "h100-fitted.toml"
    code, out, err = run(capsys, "fit", str(path), "--gpu", "h100", "-o", str(out_path), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["runs"] == 6 and d["in_sample_mean_abs_pct_error"] < 1.5 and d["cv_mean_abs_pct_error"] < 3.0
    assert d["preset_mean_abs_pct_error"] > 5  # the preset's knobs (0.75, 1.0) were not these runs'
    cluster = load_cluster(str(out_path))
    assert cluster.gpu.sustained_compute_ratio == pytest.approx(d["knobs"]["sustained_compute_ratio"]["value"])
    assert cluster.gpu.peak_flops_per_s == load_gpu(H100).peak_flops_per_s  # only the knobs change
    assert "paraplan fit" in out_path.read_text()
    code, out, err = run(capsys, "validate", str(path), "--hardware", str(out_path), "--json")
    assert code == 0, err
    assert json.loads(out)["summary"]["mean_abs_pct_error"] < 1.5


def test_validate_cv_source_reports_in_sample_and_out_of_source(capsys, tmp_path):
    path = write_csv(tmp_path, TRAINING_HEADER, _runs(0.7, 0.8))
    code, out, err = run(capsys, "validate", str(path), "--cv", "source", "--json")
    assert code == 0, err
    s = json.loads(out)["summary"]
    assert set(s["by_source"]) == {"lab-a", "lab-b"} and s["all"]["n"] == 6
    # one physics made both sources: a fit on either predicts the other
    assert s["all"]["cv_mean_abs_pct_error"] < 3.0 and s["all"]["in_sample_mean_abs_pct_error"] < 1.5
    assert s["by_generation"]["H100/H200"]["n"] == 6


@pytest.mark.parametrize("argv,says", [
    (["fit", "absent.csv", "--gpu", "h100"], "no such file"),
    (["fit", "{csv}", "--gpu", "h1000"], "unknown gpu"),
    (["fit", "{csv}", "--gpu", "a100"], "no row names it"),
    (["fit", "{csv}", "--gpu", "h100", "-o", "/nonexistent-dir/p.toml"], "directory must exist"),
])
def test_fit_bad_input_is_one_line(capsys, tmp_path, argv, says):
    path = write_csv(tmp_path, TRAINING_HEADER, [{**TRAINING_ROW, "gpu": "H100"}])
    argv = [a.replace("{csv}", str(path)) for a in argv]
    if argv[1] == "absent.csv":
        argv[1] = str(tmp_path / "absent.csv")
    line = assert_user_error(*run(capsys, *argv))
    assert says in line


def test_source_key_is_the_publication():
    assert source_key("NVIDIA/dgxc-benchmarking@35a9aec:nemo/README.md (table)") == "NVIDIA/dgxc-benchmarking"
    assert source_key("Korthikanti et al. 2022 (arXiv 2205.05198) Table 5") == "Korthikanti et al. 2022"
    assert source_key("pages corpus: https://docs.nvidia.com/nemo-framework/user-guide/latest/x.html (copy)") \
        == "docs.nvidia.com/nemo-framework"


def test_out_of_source_never_uses_the_held_out_source(tmp_path, monkeypatch):
    # H100 runs only in lab-a (made at share 0.6), H200 runs only in lab-b (made at 0.8): holding
    # out lab-a leaves no H100 run, so its runs are predicted with the Hopper family's share
    # fitted on lab-b (0.8), not with anything lab-a measured
    from paraplan.validate.fit import cross_validate_sources, predict_at, tabulate
    rows = [{**r, "source": "lab-a@x:t.md"} for r in _runs(0.6, 1.0) if r["precision"] == "bf16"]
    h200 = []
    for r in _runs(0.8, 1.0):
        if r["precision"] != "bf16":
            continue
        row = {**r, "gpu": "H200", "source": "lab-b@x:t.md", "id": r["id"] + "-h200"}
        setup = row_setup(row, "rows.csv", 2)
        cluster = row_cluster(setup)
        gpu = replace(cluster.gpu, sustained_compute_ratio=0.8)
        row["value"] = repr(predict_on(row, setup, replace(cluster, gpu=gpu))[0])
        h200.append(row)
    runs, _ = tabulate([str(write_csv(tmp_path, TRAINING_HEADER, rows + h200))])
    import paraplan.validate.fit as fit
    monkeypatch.setattr(fit, "MIN_RUNS", 1)  # each GPU's 3 runs fit its own knobs
    cv = cross_validate_sources(runs)
    for run_, c in zip(runs, cv):
        if run_.gpu == H100:
            assert c["knobs_in_sample"]["sustained_compute_ratio"] == pytest.approx(0.6, abs=0.02)
            assert c["knobs_out_of_source"]["sustained_compute_ratio"] == pytest.approx(0.8, abs=0.02)
            assert c["out_of_source"] == pytest.approx(predict_at(run_, c["knobs_out_of_source"]))


def test_a_gpu_with_few_runs_is_fitted_with_its_family(tmp_path):
    # 3 H100 runs at 0.6 and 3 H200 runs at 0.8 (fewer than MIN_RUNS each): one Hopper fit on all
    # six in sample, lying between them
    from paraplan.validate.fit import MIN_RUNS, cross_validate_sources, tabulate
    rows = [r for r in _runs(0.6, 1.0) if r["precision"] == "bf16"]
    h200 = []
    for r in _runs(0.8, 1.0):
        if r["precision"] == "bf16":
            row = {**r, "gpu": "H200", "id": r["id"] + "-h200"}
            setup = row_setup(row, "rows.csv", 2)
            cluster = row_cluster(setup)
            row["value"] = repr(predict_on(row, setup, replace(cluster, gpu=replace(cluster.gpu,
                                                                                    sustained_compute_ratio=0.8)))[0])
            h200.append(row)
    assert len(rows) < MIN_RUNS
    runs, _ = tabulate([str(write_csv(tmp_path, TRAINING_HEADER, rows + h200))])
    shares = {c["knobs_in_sample"]["sustained_compute_ratio"] for c in cross_validate_sources(runs)}
    (share,) = shares
    assert 0.6 <= share <= 0.8


def test_nvfp4_runs_are_tabulated_along_the_ratio_that_prices_them(tmp_path):
    # NVFP4 GEMMs run at fp8_gemm_efficiency_ratio of their peak (cost/roofline.py): an NVFP4
    # run's prediction must move with that knob, and the fit must let it inform the knob
    from paraplan.validate.fit import tabulate
    row = {**BASE, **SHAPES[0], "gpu": "GB200", "precision": "nvfp4", "id": "fp4", "metric_id": "iteration_time_s",
           "value": "1.0", "source": "lab@x:t.md"}
    (run_,), _ = tabulate([str(write_csv(tmp_path, TRAINING_HEADER, [row]))])
    slow, fast = run_.grid[-1, 0], run_.grid[-1, -1]  # at the ratio's low and high bounds
    assert slow > fast * 1.05
    assert run_.informs(KNOBS[1])
