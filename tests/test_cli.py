"""The command line, in-process: every command's output contract and every kind of bad input.

A user's mistake prints one line on stderr, exits 2, shows no traceback and writes nothing.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from support import assert_user_error, run


GPT3_EXAMPLE = ["--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--gpus", "1024", "--seq", "2048",
                "--batch", "1536", "--tp", "8", "--pp", "8", "--vp", "3", "--mb", "1", "--recompute", "selective"]
SMALL_PP = ["--model", "llama3-8b", "--gpus", "16", "--seq", "2048", "--batch", "16", "--tp", "2", "--pp", "4",
            "--mb", "1"]

# Header and the first two data rows of shared/validation/training_dev.csv (Korthikanti et
# al. 2022 Table 5), inlined so the test runs without shared/.
TRAINING_CSV = """\
id,source,model,params_b,layers,hidden,ffn_hidden,heads,kv_heads,vocab,gated_mlp,num_experts,top_k,moe_ffn_hidden,seq_len,gpu,num_gpus,gpus_per_node,precision,global_batch,micro_batch,tp,pp,vp,cp,ep,dp,sp,recompute,zero,framework,metric_id,value,metric_text,notes
train-dev-001,Korthikanti et al. 2022 (arXiv 2205.05198) Table 5; configs as in calculon-ai/calculon validation/seqsel/tab5,Megatron 22B,22,48,6144,24576,64,64,51200,no,,,,2048,A100 80GB,8,8,fp16,4,4,8,1,1,1,1,1,no,full,0,Megatron-LM,iteration_time_s,1.42,end-to-end iteration time (s),Selene DGX A100; 'selective' = sequence parallel + selective recompute; vp and micro_batch as encoded by Calculon's validation files
train-dev-002,Korthikanti et al. 2022 (arXiv 2205.05198) Table 5; configs as in calculon-ai/calculon validation/seqsel/tab5,Megatron 22B,22,48,6144,24576,64,64,51200,no,,,,2048,A100 80GB,8,8,fp16,4,4,8,1,1,1,1,1,yes,selective,0,Megatron-LM,iteration_time_s,1.1,end-to-end iteration time (s),Selene DGX A100; 'selective' = sequence parallel + selective recompute; vp and micro_batch as encoded by Calculon's validation files
"""


# ---------------------------------------------------------------- presets

def test_presets_lists_the_catalog(capsys):
    code, out, err = run(capsys, "presets")
    assert code == 0 and not err
    for name in ("gpt3-175b", "llama3-70b", "h100-sxm-80gb", "dgx-h100", "dgx-a100-80gb"):
        assert name in out


def test_presets_json(capsys):
    code, out, _ = run(capsys, "presets", "--json")
    assert code == 0
    data = json.loads(out)
    assert {"models", "gpus", "clusters"} <= set(data)
    assert "llama3-8b" in data["models"] and "dgx-h100" in data["clusters"]


# ---------------------------------------------------------------- estimate

@pytest.mark.parametrize("argv", [GPT3_EXAMPLE, SMALL_PP, ["--model", "llama3-8b", "--gpus", "8", "--seq", "4096",
                                                            "--batch", "32", "--tp", "8", "--mb", "2"]],
                         ids=["gpt3-interleaved", "llama3-8b-pp4", "llama3-8b-tp8"])
def test_estimate_json_parts_sum_to_totals(capsys, argv):
    code, out, err = run(capsys, "estimate", *argv, "--json")
    assert code == 0, err
    d = json.loads(out)
    parts = d["time_breakdown_s"]
    assert set(parts) >= {"compute_s", "bubble_s", "tp_comm_s", "dp_comm_s", "optimizer_s"}
    assert all(v >= 0.0 for v in parts.values()), parts
    assert math.isclose(sum(parts.values()), d["step_time_s"], rel_tol=1e-9)
    mem = dict(d["memory_bytes"])
    total = mem.pop("total_bytes")
    assert math.isclose(sum(mem.values()), total, rel_tol=1e-9)
    assert d["fits"] == (total <= d["hbm_bytes"])
    assert 0.0 < d["mfu"] < 1.0 and d["step_time_s"] > 0.0
    n = d["num_gpus"]
    assert math.isclose(d["tokens_per_s_per_gpu"] * n, d["tokens_per_s"], rel_tol=1e-12)


def test_estimate_text_report(capsys):
    code, out, err = run(capsys, "estimate", *GPT3_EXAMPLE)
    assert code == 0, err
    assert "TP8 PP8 DP16 VP3 mb1 interleaved SP rc:selective" in out
    for line in ("step time", "MFU / HFU", "time per step", "step total", "memory per GPU",
                 "total per GPU (worst stage)", "token budget"):
        assert line in out
    assert "96 per step" in out  # 1536 / (DP 16 × mb 1) micro-batches


def test_estimate_reports_a_plan_that_does_not_fit(capsys):
    # estimate predicts what it is asked; it says the plan does not fit rather than failing
    code, out, _ = run(capsys, "estimate", "--model", "gpt3-175b", "--gpus", "8", "--batch", "8", "--seq", "2048",
                       "--tp", "1")
    assert code == 0
    assert "DOES NOT FIT" in out
    # with no plan flag the search's best plan is estimated, and where none fits, that is the error
    assert "no plan fits" in assert_user_error(*run(capsys, "estimate", "--model", "gpt3-175b", "--gpus", "8",
                                                    "--batch", "8", "--seq", "2048"))


# ---------------------------------------------------------------- search

def test_search_json_ranks_fitting_plans(capsys):
    code, out, err = run(capsys, "search", "--gpus", "64", "--model", "llama3-8b", "--batch", "64",
                         "--seq", "4096", "--top", "3", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["model"] == "llama3-8b" and d["num_gpus"] == 64
    assert d["num_candidates"] >= d["num_valid"] >= d["num_fit"] > 0
    ranked = d["ranked"]
    assert len(ranked) == 3
    steps = [r["step_time_s"] for r in ranked]
    assert steps == sorted(steps)
    for r in ranked:
        assert r["fits"] and r["memory_bytes"]["total_bytes"] <= r["hbm_bytes"]
        p = r["plan"]
        assert p["tp"] * p["pp"] * p["dp"] * p["cp"] == 64
        assert 64 % (p["dp"] * p["micro_batch_size"]) == 0
        assert math.isclose(sum(r["time_breakdown_s"].values()), r["step_time_s"], rel_tol=1e-9)


def test_search_pins_axes(capsys):
    code, out, err = run(capsys, "search", "--gpus", "16", "--model", "llama3-8b", "--batch", "32",
                         "--seq", "2048", "--tp", "4", "--pp", "2", "--top", "2", "--json")
    assert code == 0, err
    for r in json.loads(out)["ranked"]:
        assert r["plan"]["tp"] == 4 and r["plan"]["pp"] == 2


def test_nothing_fits_says_why_and_what_helps(capsys):
    code, out, err = run(capsys, "search", "--model", "gpt3-175b", "--gpus", "8", "--batch", "8", "--seq", "2048")
    line = assert_user_error(code, out, err)
    assert "no plan fits" in line
    assert "smallest needs" in line and "try more GPUs" in line
    assert not out


# ---------------------------------------------------------------- trace

def test_trace_writes_chrome_trace_json(capsys, tmp_path):
    path = tmp_path / "step.json"
    code, out, err = run(capsys, "trace", *SMALL_PP, "-o", str(path))
    assert code == 0, err
    assert str(path) in out
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    tasks = [e for e in events if e.get("ph") == "X" and e.get("tid") == 0 and e["name"] != "bubble"]
    assert {e["pid"] for e in tasks} == {0, 1, 2, 3}  # one process per pipeline rank
    m = 16 // 2  # batch 16 / DP 2 (16 GPUs / TP2 / PP4) micro-batches of 1
    assert len(tasks) == 4 * 2 * m  # every rank: F and B of every micro-batch
    assert all(e["dur"] >= 0 for e in events if e.get("ph") == "X")
    assert trace["otherData"]["plan"].startswith("TP2 PP4")
    # the trace ends at the simulated step (microseconds) and is no longer than the estimate
    end_us = max(e["ts"] + e["dur"] for e in tasks)
    assert end_us <= trace["otherData"]["step_time_s"] * 1e6 * (1 + 1e-9)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_trace_of_a_long_step_shows_fewer_microbatches(capsys, tmp_path):
    path = tmp_path / "few.json"
    code, out, err = run(capsys, "trace", *SMALL_PP, "--max-microbatches", "5", "-o", str(path))
    assert code == 0, err
    trace = json.loads(path.read_text())
    # 8 micro-batches in the step; 5 asked, rounded down to a multiple of PP=4, at least 2·PP
    assert trace["otherData"]["microbatches"] == 8 and trace["otherData"]["microbatches_shown"] == 8
    code, out, err = run(capsys, "trace", *SMALL_PP, "--batch", "64", "--max-microbatches", "9", "-o", str(path))
    trace = json.loads(path.read_text())
    tasks = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("tid") == 0 and e["name"] != "bubble"]
    assert trace["otherData"]["microbatches"] == 32 and trace["otherData"]["microbatches_shown"] == 8
    assert len(tasks) == 4 * 2 * 8 and "8 of the step's 32 micro-batches shown" in out
    # the step time stays the full step's: the shown part ends well before it
    assert max(e["ts"] + e["dur"] for e in tasks) < 0.5 * trace["otherData"]["step_time_s"] * 1e6


def test_trace_to_stdout(capsys):
    code, out, _ = run(capsys, "trace", *SMALL_PP, "-o", "-")
    assert code == 0
    assert "traceEvents" in json.loads(out)


def test_trace_without_pipeline(capsys, tmp_path):
    path = tmp_path / "pp1.json"
    code, _, err = run(capsys, "trace", "--model", "llama3-8b", "--gpus", "8", "--seq", "2048", "--batch", "16",
                       "--tp", "8", "-o", str(path))
    assert code == 0, err
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


@pytest.mark.parametrize("argv,reason", [
    (["--tp", "3"], "must divide the 512 GPUs"),
    (["--model", "llama3-8b", "--gpus", "24", "--tp", "3", "--batch", "24", "--seq", "2048"], "TP=3 must divide heads"),
])
def test_trace_writes_nothing_for_an_invalid_plan(capsys, tmp_path, argv, reason):
    path = tmp_path / "never.json"
    code, out, err = run(capsys, "trace", *argv, "-o", str(path))
    line = assert_user_error(code, out, err)
    assert reason in line
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- validate

def test_validate_json_contract(capsys, tmp_path):
    csv_path = tmp_path / "two_rows.csv"
    csv_path.write_text(TRAINING_CSV)
    code, out, err = run(capsys, "validate", str(csv_path), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert set(d) >= {"rows", "summary"}
    assert [r["id"] for r in d["rows"]] == ["train-dev-001", "train-dev-002"]
    for r, measured in zip(d["rows"], (1.42, 1.1)):
        assert set(r) >= {"id", "metric_id", "measured", "predicted", "error_pct", "skipped"}
        assert r["metric_id"] == "iteration_time_s" and r["measured"] == measured
        assert r["skipped"] is None and r["predicted"] > 0
        assert math.isclose(r["error_pct"], 100.0 * (r["predicted"] - measured) / measured, rel_tol=1e-12)
    s = d["summary"]
    assert set(s) >= {"n", "n_predicted", "n_skipped", "mean_abs_pct_error", "max_abs_pct_error", "by_source"}
    assert (s["n"], s["n_predicted"], s["n_skipped"]) == (2, 2, 0)
    errs = [abs(r["error_pct"]) for r in d["rows"]]
    assert math.isclose(s["mean_abs_pct_error"], sum(errs) / 2, rel_tol=1e-12)
    assert math.isclose(s["max_abs_pct_error"], max(errs), rel_tol=1e-12)
    (source, by), = s["by_source"].items()
    assert source.startswith("Korthikanti et al. 2022") and by["n"] == 2
    # both rows ran on A100s, neither model is MoE: one generation group holding both
    assert [r["gpu"] for r in d["rows"]] == ["a100-sxm-80gb"] * 2 and not any(r["moe"] for r in d["rows"])
    (gen, g), = s["by_generation"].items()
    assert gen == "A100" and g["n"] == 2 and math.isclose(g["mean_abs_pct_error"], sum(errs) / 2, rel_tol=1e-12)
    assert g["max_abs_pct_error"] == g["p90_abs_pct_error"] == max(errs)  # nearest rank: the 2nd of 2
    assert s["moe"]["n"] == 0 and s["moe"]["mean_abs_pct_error"] is None


def test_validate_table(capsys, tmp_path):
    csv_path = tmp_path / "two_rows.csv"
    csv_path.write_text(TRAINING_CSV)
    code, out, _ = run(capsys, "validate", str(csv_path), "--verbose")
    assert code == 0
    assert "train-dev-001" in out and "rows 2, predicted 2, skipped 0" in out
    assert "TP8" in out  # --verbose shows the plan chosen for the blank knobs
    assert re.search(r"^A100 +2 ", out, re.MULTILINE)  # the error by GPU generation
    assert "MoE (all GPUs)" not in out  # no MoE row, no MoE line


@pytest.mark.parametrize("content,column,detail", [
    (TRAINING_CSV.replace(",iteration_time_s,1.42,", ",iteration_time_s,fast,"), "value", "is not allowed"),
    (TRAINING_CSV.replace(",2048,A100 80GB,8,8,", ",2k,A100 80GB,8,8,", 1), "seq_len", "is not a number"),
])
def test_validate_malformed_cell_skips_its_row_only(capsys, tmp_path, content, column, detail):
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text(content)
    code, out, err = run(capsys, "validate", str(csv_path), "--json")
    assert code == 0, err
    first, second = json.loads(out)["rows"]
    assert f"{csv_path}:2: column {column!r}" in first["skipped"] and detail in first["skipped"]
    assert first["measured"] is None or column != "value"
    assert second["skipped"] is None and second["predicted"] > 0


@pytest.mark.parametrize("content,detail", [
    ("a,b\n1,2\n", "missing column"),
    # a misspelled column would have been ignored: TP unpinned, the row predicted for another plan
    (TRAINING_CSV.replace(",dp,sp,", ",dp,spp,", 1), "column 'spp' is not one paraplan reads; did you mean 'sp'?"),
    (TRAINING_CSV.replace(",tp,pp,", ",TP,pp,", 1), "did you mean 'tp'?"),
])
def test_validate_malformed_csv(capsys, tmp_path, content, detail):
    csv_path = tmp_path / "bad.csv"
    csv_path.write_text(content)
    code, out, err = run(capsys, "validate", str(csv_path), "--json")
    line = assert_user_error(code, out, err)
    assert str(csv_path) in line and detail in line
    assert not out


def test_validate_of_rows_all_skipped_exits_1(capsys, tmp_path):
    """Every row skipped: the report says why for each, and the exit code says nothing was
    checked (a summary of nothing must not read as a pass to a script)."""
    csv_path = tmp_path / "skipped.csv"
    csv_path.write_text(TRAINING_CSV.replace(",8,8,fp16,4,", ",8,8,,4,"))
    code, out, err = run(capsys, "validate", str(csv_path), "--json")
    assert code == 1
    rows = json.loads(out)["rows"]
    assert len(rows) == 2 and all("precision" in r["skipped"] for r in rows)
    assert err.strip() == f"paraplan: error: no row of {csv_path} could be predicted (2 skipped: each row above says why)"


def test_validate_missing_file(capsys, tmp_path):
    path = tmp_path / "absent.csv"
    line = assert_user_error(*run(capsys, "validate", str(path)))
    assert str(path) in line and "no such file" in line


# ---------------------------------------------------------------- bad input

def test_unknown_model_suggests_the_closest(capsys):
    code, out, err = run(capsys, "estimate", "--model", "llama-3-7oB")
    line = assert_user_error(code, out, err)
    assert "closest" in line and "llama3-70b" in line
    assert not out


def test_unknown_cluster(capsys):
    line = assert_user_error(*run(capsys, "search", "--cluster", "dgx-h1000"))
    assert "unknown cluster" in line and "closest" in line


@pytest.mark.parametrize("argv,detail", [
    (["estimate", "--tp", "3"], "must divide the 512 GPUs"),
    (["estimate", "--model", "llama3-8b", "--gpus", "24", "--tp", "3", "--batch", "24", "--seq", "2048"],
     "TP=3 must divide heads=32"),
    (["estimate", "--model", "llama3-8b", "--gpus", "64", "--pp", "3", "--dp", "21", "--batch", "63",
      "--seq", "2048"], "TP×PP×DP×CP"),
    (["estimate", "--model", "llama3-8b", "--gpus", "8", "--pp", "8", "--vp", "5", "--batch", "8", "--seq", "2048"],
     "must not exceed layers + 2 = 34"),
    (["estimate", "--model", "llama3-8b", "--gpus", "8", "--dp", "8", "--batch", "12", "--seq", "2048"],
     "not a multiple"),
    (["estimate", "--recompute", "sometimes"], "allowed: none, selective, full, first_k"),
    (["estimate", "--schedule", "2f2b"], "allowed: gpipe, 1f1b"),
    (["estimate", "--zero", "4"], "allowed: 0, 1, 2, 3"),
    (["estimate", "--precision", "fp4"], "allowed: bf16, fp16, fp8"),
    (["search", "--batch-tokens", "1000", "--seq", "4096"], "must be a multiple of --seq"),
])
def test_invalid_plan_or_workload_names_the_reason(capsys, argv, detail):
    line = assert_user_error(*run(capsys, *argv))
    assert detail in line


@pytest.mark.parametrize("argv", [
    ["estimate", "--gpus", "0"],
    ["estimate", "--gpus", "-8"],
    ["search", "--seq", "many"],
    ["estimate", "--tokens", "0"],
    ["search", "--top", "0"],
    ["estimate", "--batch", "8", "--batch-tokens", "8192"],
    ["estimate", "--no-such-flag"],
    ["estimate", "--gpus", "16", "--tp", "2_0"],  # int() reads 2_0 as 20
    ["estimate", "--tokens", "1_000"],
])
def test_bad_flag_values_exit_2(capsys, argv):
    assert_user_error(*run(capsys, *argv))


def test_search_top_is_bounded(capsys):
    # each plan shown is simulated: --top 10000 on 8 GPUs ran past 100 s before the bound
    line = assert_user_error(*run(capsys, "search", "--top", "1001"))
    assert "--top" in line and "1 to 1,000" in line
