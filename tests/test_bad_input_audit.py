"""The bad-input audit: each case once printed a traceback, ran on with a flag silently
ignored, or accepted a value nothing can mean. Now: one line on stderr naming the flag or
field, exit 2, no traceback, no output file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from support import GPU_ROW, INFERENCE_HEADER, TRAINING_HEADER, TRAINING_ROW, assert_user_error, run, write_csv

from paraplan.specs.workload import Precision, parse_precision

SMALL = ["--model", "mpt-125m", "--gpus", "8", "--batch", "8", "--seq", "1024"]
LONG = "a" * 300  # longer than a file name may be (NAME_MAX 255)
VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"


def _error(capsys, *argv) -> str:
    code, out, err = run(capsys, *argv)
    return assert_user_error(code, out, err)


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


# ---------------------------------------------------------------- 1. output paths

def _loop(d: Path) -> Path:
    a, b = d / "loop_a", d / "loop_b"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


OUTPUTS = {
    "trace": (["trace", *SMALL, "-o"], "--output"),
    "export": (["export", "--format", "megatron", *SMALL, "--tp", "2", "-o"], "--output"),
    "scale": (["scale", *SMALL, "--counts", "8", "--plot"], "--plot"),
    "embeddings": (["embeddings", "--gpus", "8", "--export-torchrec"], "--export-torchrec"),
    "calibrate-o": (["calibrate", "--from-raw", "raw.json", "-o"], "--output"),
    "calibrate-raw": (["calibrate", "--from-raw", "raw.json", "--raw"], "--raw"),
}


@pytest.mark.parametrize("command", OUTPUTS)
@pytest.mark.parametrize("bad", ["too-long", "symlink-loop"])
def test_unusable_output_path_is_one_line(capsys, tmp_path, command, bad):
    argv, option = OUTPUTS[command]
    path = str(tmp_path / (LONG + ".out")) if bad == "too-long" else str(_loop(tmp_path))
    before = _files(tmp_path)
    line = _error(capsys, *argv, path)
    assert option in line and "cannot use path" in line
    assert _files(tmp_path) == before


def test_unusable_compare_plot_path_is_one_line(capsys, tmp_path):
    report = _report(tmp_path)
    line = _error(capsys, "compare", report, "--plot", str(tmp_path / (LONG + ".png")))
    assert "--plot" in line and "cannot use path" in line


# ---------------------------------------------------------------- 2. input paths

@pytest.mark.parametrize("argv", [
    lambda d: ["estimate", "--model", LONG, *SMALL[2:]],
    lambda d: ["estimate", "--model", str(d / (LONG + ".toml")), *SMALL[2:]],
    lambda d: ["estimate", "--model", str(d / LONG), *SMALL[2:]],
    lambda d: ["serve", "--model", str(d / (LONG + ".json"))],
    lambda d: ["validate", str(d / (LONG + ".csv"))],
])
def test_unusable_input_path_is_one_line(capsys, tmp_path, argv):
    line = _error(capsys, *argv(tmp_path))
    # a path is shown whole; a preset name (no '/') is cut, saying its length (issue 33)
    assert LONG in line or (LONG[:70] in line and "(300 characters)" in line)


# ---------------------------------------------------------------- 4. serve --requests

def test_serve_requests_has_a_maximum(capsys):
    line = _error(capsys, "serve", "--model", "llama3-8b", "--gpus", "2", "--requests", "100001")
    assert "--requests" in line and "100,000" in line


# ---------------------------------------------------------------- 6. capacity factor below 1

@pytest.mark.parametrize("cf", ["0.5", "40"])
def test_capacity_factor_out_of_range_is_named(capsys, cf):
    # mixtral: 8 experts, top-2: 1.0 .. 4
    line = _error(capsys, "search", "--model", "mixtral-8x7b", "--gpus", "8", "--batch", "8", "--seq", "1024",
                  "--capacity-factor", cf)
    assert "--capacity-factor" in line and "from 1.0" in line and "to 4" in line and "DP" not in line


@pytest.mark.parametrize("text, expected", [("FP8-DS", Precision.FP8), ("MXFP8", Precision.FP8),
                                            ("bf16-mixed", Precision.BF16), ("bfloat16", Precision.BF16),
                                            ("float32", Precision.FP32), ("FP8 (implied; see notes)", Precision.FP8)])
def test_engine_precision_names_are_read(text, expected):
    assert parse_precision(text) is expected


# ---------------------------------------------------------------- 7. absurd workload numbers

@pytest.mark.parametrize("flags,allowed", [
    (["--storage-gb-per-s", "1e-320"], "allowed: 0.001 to 1e+06 GB/s"),
    (["--storage-gb-per-s", "1e7"], "allowed: 0.001 to 1e+06 GB/s"),
    (["--price", "1e308"], "allowed: above 0 to 1e+06 $ per GPU-hour"),
    (["--tokens", "1e308"], "allowed: above 0 to 1e+18 tokens"),
    (["--pue", "0.5"], "allowed: 1 to 3 (facility power over IT power)"),
    (["--grid-kg-per-kwh", "-1"], "allowed: 0 to 2 kg CO2e per kWh"),
])
def test_absurd_workload_numbers_are_refused(capsys, flags, allowed):
    line = _error(capsys, "search", *SMALL, *flags, "--json", "--top", "1")
    assert allowed in line and flags[0] in line


def test_serve_rate_has_a_maximum(capsys):
    line = _error(capsys, "serve", "--model", "llama3-8b", "--gpus", "2", "--rate", "1e300")
    assert "--rate" in line and "1e+09" in line


def test_workload_bounds_keep_the_defaults_and_llama3_budget(capsys):
    code, out, err = run(capsys, "search", *SMALL, "--tokens", "15.6e12", "--price", "2.5", "--json", "--top", "1")
    assert code == 0, err
    assert "NaN" not in out and "Infinity" not in out
    json.loads(out)


# ---------------------------------------------------------------- 8. --precision exact

@pytest.mark.parametrize("text", ["xbf16y", "fp8bf16", "bf16x", "amp bf16"])
def test_precision_is_matched_exactly(capsys, text):
    line = _error(capsys, "search", *SMALL, "--precision", text)
    assert "precision" in line and repr(text) in line


@pytest.mark.parametrize("text,precision", [
    ("bf16", Precision.BF16), (" FP16 ", Precision.FP16), ("BF16 (AMP)", Precision.BF16),
    ("BF16 (pure)", Precision.BF16), ("FP8-CS", Precision.FP8), ("FP8 (implied; see notes)", Precision.FP8),
    ("tf32", Precision.TF32), ("FP32", Precision.FP32),
])
def test_precision_spellings_of_the_published_files_still_parse(text, precision):
    assert parse_precision(text) is precision


# ---------------------------------------------------------------- 9. empty strings

@pytest.mark.parametrize("argv,flag", [
    (["estimate", *SMALL, "--hardware", ""], "--hardware"),
    (["scale", *SMALL, "--counts", "8", "--hardware", ""], "--hardware"),
    (["serve", "--model", "llama3-8b", "--gpus", "2", "--weights", ""], "weights"),
    (["serve", "--model", "llama3-8b", "--gpus", "2", "--kv", ""], "kv"),
    (["embeddings", "--gpus", "8", "--profile", ""], "--profile"),
    (["calibrate", "--vidur", ""], "--vidur"),
])
def test_empty_string_is_not_taken_as_not_given(capsys, argv, flag):
    line = _error(capsys, *argv)
    assert flag in line and "''" in line


def test_validate_hardware_empty(capsys, tmp_path):
    line = _error(capsys, "validate", str(_training_csv(tmp_path)), "--hardware", "")
    assert "--hardware" in line and "''" in line


# ---------------------------------------------------------------- 10. flags that would do nothing

@pytest.mark.parametrize("command", ["estimate", "trace", "export"])
def test_recompute_layers_needs_first_k(capsys, tmp_path, command):
    out = tmp_path / "out.json"
    extra = {"estimate": [], "trace": ["-o", str(out)], "export": ["--format", "megatron", "-o", str(out)]}[command]
    line = _error(capsys, command, *SMALL, "--recompute-layers", "3", *extra)
    assert "--recompute-layers" in line and "first_k" in line
    assert not out.exists()


def test_schedule_needs_a_pipeline(capsys):
    line = _error(capsys, "estimate", *SMALL, "--schedule", "zb", "--pp", "1")
    assert "--schedule" in line and "'zb'" in line


def test_schedule_and_recompute_layers_with_a_pipeline_still_run(capsys):
    code, out, err = run(capsys, "estimate", *SMALL, "--pp", "2", "--schedule", "zb", "--recompute", "first_k",
                         "--recompute-layers", "1", "--json")
    assert code == 0, err


def test_max_load_and_rate_exclude_each_other(capsys):
    line = _error(capsys, "serve", "--max-load", "--rate", "5")
    assert "--rate" in line and "--max-load" in line


@pytest.mark.parametrize("flags,named", [
    (["--ranks", "4"], "--ranks"), (["--device", "cuda"], "--device"), (["--quick"], "--quick"),
])
def test_from_raw_refuses_benchmark_flags(capsys, tmp_path, flags, named):
    out = tmp_path / "p.toml"
    line = _error(capsys, "calibrate", "--from-raw", str(tmp_path / "raw.json"), "-o", str(out), *flags)
    assert named in line and "--from-raw" in line
    assert not out.exists()


@pytest.mark.parametrize("flags,named", [
    (["-o", "X"], "--output"), (["--raw", "X"], "--raw"), (["--from-raw", "X"], "--from-raw"),
    (["--quick"], "--quick"),
])
def test_vidur_refuses_profile_flags(capsys, tmp_path, flags, named):
    line = _error(capsys, "calibrate", "--vidur", str(tmp_path), *flags)
    assert named in line and "--vidur" in line


# ---------------------------------------------------------------- 11. compare: measured / predicted values

def _report(tmp_path, name: str = "r.json", measured=1.0, predicted=1.1) -> str:
    r = {"kind": "paraplan-run", "version": 1, "status": "ok", "command": "paraplan run",
         "model": {"name": "tiny"}, "plan": {"describe": "TP1 PP1 DP2 mb1 rc:none"}, "world_size": 2,
         "device": "cpu", "device_name": "cpu", "measured": {"step_time_s": measured, "peak_memory_bytes": 1 << 20},
         "predicted": {"step_time_s": predicted, "memory_bytes": 2 << 20, "hardware": "cpu-profile"}}
    p = tmp_path / name
    p.write_text(json.dumps(r))  # NaN and Infinity as Python's json writes (and reads) them
    return str(p)


@pytest.mark.parametrize("field,value", [
    ("measured", float("nan")), ("measured", float("inf")), ("measured", True), ("measured", 10**400),
    ("predicted", float("nan")), ("predicted", float("-inf")), ("predicted", False), ("predicted", 0),
    ("predicted", -1.0),
])
def test_compare_refuses_values_that_are_not_positive_finite_numbers(capsys, tmp_path, field, value):
    path = _report(tmp_path, **{field: value})
    line = _error(capsys, "compare", path)
    assert path in line and f"{field}.step_time_s" in line


# ---------------------------------------------------------------- 13-15. validate files

# rows whose metric is unknown: validate skips them, and a bad cell must be the reason given
def _csv(tmp_path, header, rows, name="rows.csv") -> Path:
    return write_csv(tmp_path, header, [{**r, "metric_id": "not_a_metric"} for r in rows], name)


def _training_csv(tmp_path, **changes) -> Path:
    return _csv(tmp_path, TRAINING_HEADER, [{**TRAINING_ROW, **changes}])


def _skip_reason(capsys, path) -> str:
    """The skip reason of the file's one row (exit 1: nothing predicted, nothing refused)."""
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert code == 1, err
    (row,) = json.loads(out)["rows"]
    return row["skipped"]


@pytest.mark.parametrize("value", ["xbf16y", "int4 weights", "bf16 fp8"])
def test_inference_unknown_precision_skips_the_row(capsys, tmp_path, value):
    path = _csv(tmp_path, INFERENCE_HEADER, [{**GPU_ROW, "precision": value}])
    line = _skip_reason(capsys, path)
    assert f"{path}:2:" in line and "'precision'" in line and repr(value) in line


def test_inference_tpot_row_with_one_output_token_is_skipped_with_the_reason(tmp_path):
    # one output token has no time between tokens: the row is skipped naming output_len
    # (it used to print NaN and numpy's "Mean of empty slice" warning)
    from paraplan.validate.inference import validate_inference_file
    row = {**GPU_ROW, "metric": "mean ITL", "metric_id": "tpot_mean_ms", "output_len": "1"}
    res = validate_inference_file(str(write_csv(tmp_path, INFERENCE_HEADER, [row, {**row, "id": "two", "output_len": "2"}])))
    one, two = res["rows"]
    assert one["predicted"] is None and "output_len" in one["skipped"] and "2 output tokens" in one["skipped"]
    assert two["skipped"] is None and two["predicted"] > 0


@pytest.mark.parametrize("value", ["lots", "QPS", "batch 8"])
def test_inference_non_numeric_batch_skips_the_row(capsys, tmp_path, value):
    path = _csv(tmp_path, INFERENCE_HEADER, [{**GPU_ROW, "batch_or_concurrency": value}])
    line = _skip_reason(capsys, path)
    assert f"{path}:2:" in line and "'batch_or_concurrency'" in line and repr(value) in line


@pytest.mark.parametrize("changes,column", [
    ({"precision": "xbf16y"}, "precision"), ({"precision": "fp8bf16"}, "precision"),
    ({"recompute": "sometimes"}, "recompute"),
    ({"vp": "2", "pp": "1"}, "vp"),
])
def test_training_bad_cell_is_the_reason_its_row_is_skipped(capsys, tmp_path, changes, column):
    # the metric is unknown too: the bad cell is named, not the metric
    path = _training_csv(tmp_path, **changes)
    line = _skip_reason(capsys, path)
    assert f"{path}:2:" in line and repr(column) in line and repr(changes[column]) in line


def test_training_vp_with_pp_blank_pins_vp_and_searches_pp(tmp_path):
    # a blank knob is searched (the validation README): VP stays 2, so only PP > 1 plans remain
    from paraplan.validate.training import row_setup
    path = _training_csv(tmp_path, vp="2", pp="", dp="", tp="4", layers="48")
    row = next(csv.DictReader(path.open(encoding="utf-8")))
    setup = row_setup(row, str(path), 2)
    assert setup.fixed["vp"] == 2 and "pp" not in setup.fixed


@pytest.mark.parametrize("header", [TRAINING_HEADER, INFERENCE_HEADER])
def test_header_only_file_is_refused(capsys, tmp_path, header):
    path = _csv(tmp_path, header, [])
    line = _error(capsys, "validate", str(path))
    assert str(path) in line and "no data rows" in line


def test_published_rows_keep_their_cells(tmp_path):
    """Every precision, recompute, vp/pp and load cell of ../shared/validation is still accepted."""
    from paraplan.validate.inference import _dtypes, _load
    from paraplan.validate.training import row_cells
    if not VALIDATION.is_dir():
        pytest.skip("published validation data not present")
    for name in ("training_dev.csv", "training_dev_moe.csv"):
        with (VALIDATION / name).open(encoding="utf-8") as fh:
            for line, row in enumerate(csv.DictReader(fh), start=2):
                row_cells(row, name, line)
    with (VALIDATION / "inference_dev.csv").open(encoding="utf-8") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            _dtypes(row["precision"], "inference_dev.csv", line)
            _load(row["batch_or_concurrency"], "inference_dev.csv", line)


# ---------------------------------------------------------------- 16. options before any subcommand

def test_options_without_a_subcommand_are_search_options(capsys):
    code, out, err = run(capsys, *SMALL, "--top", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["model"] == "mpt-125m"


# ---------------------------------------------------------------- 17. absurd counts in model files

MODEL_TOML = """\
name = "m"
num_layers = 4
hidden_size = 256
ffn_hidden_size = 1024
num_heads = 4
num_kv_heads = 4
vocab_size = 1000
gated_mlp = false
tied_embeddings = false
"""


@pytest.mark.parametrize("old,new,field", [
    ("num_layers = 4", "num_layers = 99999999999999", "num_layers"),
    ("hidden_size = 256", "hidden_size = 2147483648", "hidden_size"),
    ("vocab_size = 1000", "vocab_size = 1000\nnum_experts = 99999999999999", "num_experts"),
])
def test_model_file_counts_have_a_maximum(capsys, tmp_path, old, new, field):
    path = tmp_path / "m.toml"
    path.write_text(MODEL_TOML.replace(old, new))
    line = _error(capsys, "estimate", "--model", str(path), "--gpus", "8", "--batch", "8", "--seq", "1024")
    assert field in line and "2147483647" in line


# ---------------------------------------------------------------- 18. embeddings: the advice names a real knob
# (tests/test_embeddings.py test_nothing_fits_says_why: the weight_bytes column)


# ---------------------------------------------------------------- 19. --sliding-window-kv on a model without windows

def test_sliding_window_kv_needs_windows(capsys):
    line = _error(capsys, "serve", "--model", "llama3-8b", "--gpus", "2", "--sliding-window-kv")
    assert "--sliding-window-kv" in line and "llama3-8b" in line


@pytest.mark.parametrize("field,most", [("num_hidden_layers", "10000"), ("hidden_size", "2147483647")])
def test_hf_config_counts_have_a_maximum(capsys, tmp_path, field, most):
    config = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
              "intermediate_size": 11008, "num_attention_heads": 32, "vocab_size": 32000}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, field: 99999999999999}))
    line = _error(capsys, "estimate", "--model", str(path), "--gpus", "8", "--batch", "8", "--seq", "1024")
    assert field in line and most in line


def test_run_refuses_an_empty_hardware_before_starting(capsys):
    line = _error(capsys, "run", "--hardware", "", "--dp", "2", "--device", "cpu")
    assert "--hardware" in line


def test_unknown_precision_names_the_flag(capsys):
    line = _error(capsys, "estimate", "--precision", "fp9")
    assert "--precision='fp9'" in line and "bf16" in line


# ---------------------------------------------------------------- 20. fuzzing: nested and huge numbers in files

DEEP_TOML, DEEP_JSON = "x = " + "[" * 5000 + "]" * 5000 + "\n", "[" * 5000 + "]" * 5000
HUGE_TOML = MODEL_TOML.replace("num_layers = 4", "num_layers = " + "9" * 5001)
HUGE_JSON = '{"model_type": "llama", "num_hidden_layers": ' + "9" * 5001 + "}"


@pytest.mark.parametrize("argv,name,text", [
    (lambda p: ["estimate", "--model", p, *SMALL[2:]], "m.toml", DEEP_TOML),
    (lambda p: ["estimate", "--model", p, *SMALL[2:]], "m.toml", HUGE_TOML),
    (lambda p: ["estimate", "--model", p, *SMALL[2:]], "config.json", DEEP_JSON),
    (lambda p: ["estimate", "--model", p, *SMALL[2:]], "config.json", HUGE_JSON),
    (lambda p: ["estimate", *SMALL, "--cluster", p], "c.toml", DEEP_TOML),
    (lambda p: ["validate", str(VALIDATION / "training_dev.csv"), "--hardware", p], "h.toml", DEEP_TOML),
    (lambda p: ["embeddings", "--gpus", "8", "--profile", p], "p.toml", DEEP_TOML),
    (lambda p: ["compare", p], "r.json", DEEP_JSON),
    (lambda p: ["compare", p], "r.json", '{"kind": ' + "9" * 5001 + "}"),
    (lambda p: ["calibrate", "--from-raw", p], "raw.json", DEEP_JSON),
    (lambda p: ["calibrate", "--from-raw", p], "raw.json", '{"ranks": ' + "9" * 5001 + "}"),
])
def test_deeply_nested_or_huge_integer_file_is_one_line(capsys, tmp_path, argv, name, text):
    path = tmp_path / name
    path.write_text(text)
    line = _error(capsys, *argv(str(path)))
    assert f"error: {path}" in line and ("nested too deeply" in line or "more than 4300 digits" in line)


# ---------------------------------------------------------------- 21. fuzzing: plan and workload integers

@pytest.mark.parametrize("argv,flag,most", [
    (["estimate", *SMALL, "--dp", "99999999999999999999"], "--dp", "1,048,576"),
    (["estimate", *SMALL, "--pp", "2", "--vp", "4611686018427387904"], "--vp", "1,048,576"),
    (["estimate", *SMALL, "--mb", "1048577"], "--mb", "1,048,576"),
    (["estimate", *SMALL, "--dp-shard", "99999999999999999999"], "--dp-shard", "1,048,576"),
    (["estimate", *SMALL, "--recompute", "first_k", "--recompute-layers", "99999999999"], "--recompute-layers",
     "10,000"),
    (["estimate", "--model", "mpt-125m", "--gpus", "8", "--seq", "1024", "--batch", "99999999999999999999"], "--batch",
     "2,147,483,647"),
    (["search", "--model", "mpt-125m", "--gpus", "8", "--batch", "8", "--seq", "99999999999999999999"], "--seq",
     "2,147,483,647"),
    (["search", "--model", "mpt-125m", "--gpus", "99999999999", "--batch", "8"], "--gpus", "1,048,576"),
    (["estimate", "--model", "mpt-125m", "--gpus", "8", "--seq", "1", "--batch-tokens", "1099511627777"],
     "--batch-tokens", "1,099,511,627,776"),
    (["estimate", "--model", "mpt-125m", "--gpus", "8", "--seq", "1", "--batch-tokens", "4294967296"],
     "--batch-tokens", "2147483647"),
    (["scale", *SMALL, "--counts", "8,99999999999"], "--counts", "1,048,576"),
])
def test_plan_and_workload_integers_have_a_maximum(capsys, argv, flag, most):
    line = _error(capsys, *argv)
    assert flag in line and most in line


def test_model_layers_have_a_maximum(capsys, tmp_path):
    # per-layer lists (the MoE layout, a trace's events) of 200,000 layers took gigabytes
    path = tmp_path / "m.toml"
    path.write_text(MODEL_TOML.replace("num_layers = 4", "num_layers = 200000"))
    line = _error(capsys, "estimate", "--model", str(path), *SMALL[2:])
    assert f"{path}:2:" in line and "num_layers" in line and "10,000" in line


def test_hf_moe_layers_have_a_maximum_before_the_layer_list(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3_moe", "num_hidden_layers": 20000, "hidden_size": 2048,
                                "intermediate_size": 6144, "num_attention_heads": 32, "num_key_value_heads": 4,
                                "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8,
                                "moe_intermediate_size": 768}))
    line = _error(capsys, "estimate", "--model", str(path), "--gpus", "8", "--batch", "8", "--seq", "1024")
    assert "num_hidden_layers" in line and "10000" in line


def test_the_largest_batch_and_sequence_still_estimate(capsys):
    code, out, err = run(capsys, "estimate", "--model", "mpt-125m", "--gpus", "2", "--pp", "2", "--batch",
                         "2147483646", "--seq", "2147483647", "--json")
    assert code == 0, err
    assert "NaN" not in out and json.loads(out)["step_time_s"] > 0


# ---------------------------------------------------------------- 22. fuzzing: --moe-imbalance

MOE = ["--model", "mixtral-8x7b", "--gpus", "8", "--batch", "8", "--seq", "1024"]


@pytest.mark.parametrize("argv,most", [
    (["estimate", *MOE, "--ep", "8", "--moe-imbalance", "1e300"], "to 4"),    # E/k = 8/2
    (["estimate", *MOE, "--ep", "8", "--moe-imbalance", "1e300", "--json"], "to 4"),
    (["estimate", *MOE, "--ep", "2", "--moe-imbalance", "3"], "to 2"),       # EP = 2
    (["search", *MOE, "--moe-imbalance", "4.5"], "to 4"),
])
def test_moe_imbalance_is_at_most_ep_and_experts_over_top_k(capsys, argv, most):
    line = _error(capsys, *argv)
    assert "--moe-imbalance" in line and most in line


def test_moe_imbalance_at_its_maximum_is_a_number(capsys):
    code, out, err = run(capsys, "estimate", *MOE, "--ep", "8", "--moe-imbalance", "4", "--json")
    assert code == 0, err
    assert "NaN" not in out and json.loads(out)["step_time_s"] > 0


def test_a_searched_plan_takes_at_most_ep_as_its_imbalance():
    # a rank of EP = 2 receives at most every token: λ = 4 prices it as λ = 2
    from dataclasses import replace
    from paraplan.cost.estimate import estimate
    from paraplan.plan.plan import make_plan
    from paraplan.specs.catalog import load_cluster, load_model
    from paraplan.specs.workload import Workload
    model, cluster = load_model("mixtral-8x7b"), load_cluster("dgx-h100", num_gpus=8)
    plan = make_plan(tp=1, pp=1, dp=8, ep=2)
    wl = Workload(global_batch_size=8, seq_len=1024, moe_imbalance=2.0)
    assert estimate(model, cluster, replace(wl, moe_imbalance=4.0), plan).step_time_s == pytest.approx(
        estimate(model, cluster, wl, plan).step_time_s)


# ---------------------------------------------------------------- 23. fuzzing: serve names the engine limit

def test_serve_names_max_num_tokens_when_its_workspace_fills_the_gpu(capsys):
    line = _error(capsys, "serve", "--max-num-tokens", "10000000")
    assert "--max-num-tokens" in line and "workspace" in line and "TP1 PP1 w:bf16" not in line


def test_serve_still_names_the_weights_when_they_do_not_fit(capsys):
    line = _error(capsys, "serve", "--model", "llama3.1-405b", "--gpus", "1")
    assert "weights" in line and "--max-num-tokens" not in line


# ---------------------------------------------------------------- 24. fuzzing: --version, subcommand hints

def test_version_prints_the_package_version(capsys):
    from importlib.metadata import version
    code, out, err = run(capsys, "--version")
    assert code == 0 and out.strip() == f"paraplan {version('paraplan')}" and not err


@pytest.mark.parametrize("argv,command", [(["serve", "--seq", "4"], "serve"), (["estimate", "--foo"], "estimate"),
                                          (["compare", "r.json", "--tp", "2"], "compare")])
def test_unknown_option_points_to_the_subcommand_help(capsys, argv, command):
    line = _error(capsys, *argv)
    assert "unrecognized arguments" in line and f"see `paraplan {command} --help`" in line


# ---------------------------------------------------------------- 25. fuzzing: names and physical bounds in files

def test_hf_name_or_path_must_be_a_string(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"_name_or_path": ["a", "b"], "model_type": "llama", "num_hidden_layers": 2,
                                "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                                "vocab_size": 100}, indent=1))
    line = _error(capsys, "estimate", "--model", str(path), "--gpus", "1", "--batch", "1", "--seq", "64")
    assert f"{path}:2:" in line and "_name_or_path" in line


@pytest.mark.parametrize("old,new,field", [
    ("gb_per_s = 450.0", "gb_per_s = 1e-300", "nvlink.gb_per_s"),
    ("gbit_per_s = 400.0", "gbit_per_s = 1e300", "scaleout.gbit_per_s"),
    ("latency_us = 5.0", "latency_us = 1e9", "latency_us"),
])
def test_cluster_link_numbers_have_physical_bounds(capsys, tmp_path, old, new, field):
    from paraplan.specs.catalog import CATALOG_DIR
    text = (CATALOG_DIR / "clusters" / "dgx-h100.toml").read_text()
    assert old in text
    path = tmp_path / "c.toml"
    path.write_text(text.replace(old, new, 1))
    line = _error(capsys, "estimate", *SMALL, "--cluster", str(path))
    assert str(path) in line and field in line and "from" in line
