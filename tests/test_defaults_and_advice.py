"""Errors and advice that speak of what the user set, not of defaults they never typed:
an interrupted command, unknown preset names, an MoE model file without top_k, the default
batch against an odd --seq, torchtitan's FSDP default, serve's --max-num-tokens default and
its advice, and search's advice when the user's pins are what leave nothing that fits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paraplan.embeddings.cost import ComputeKernel, ShardingType, table_contribution
from paraplan.embeddings.tables import EmbeddingTable
from paraplan.embeddings.tables import Optimizer as EmbOptimizer
from paraplan.specs.catalog import load_cluster

from support import assert_user_error, run, write


def _every_command_imported() -> None:
    """Build the parser first, so that no module imported by it binds a stand-in search."""
    from paraplan.cli import build_parser
    build_parser()


def test_ctrl_c_prints_one_line_and_exits_130(capsys, monkeypatch):
    import paraplan.search.planner as planner
    _every_command_imported()

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(planner, "search", interrupted)
    code, out, err = run(capsys, "search")
    assert code == 130
    assert "Traceback" not in err and err.strip() == "paraplan: interrupted"


def test_sigterm_in_run_exits_143(capsys, monkeypatch):
    # paraplan run turns SIGTERM into Terminated to stop torchrun (run/cli.py _launch)
    import paraplan.search.planner as planner
    from paraplan.errors import Terminated
    _every_command_imported()

    def terminated(*a, **k):
        raise Terminated
    monkeypatch.setattr(planner, "search", terminated)
    code, out, err = run(capsys, "search")
    assert code == 143 and err.strip() == "paraplan: terminated"


@pytest.mark.parametrize("name", ["foo", "zzzzzz"])
def test_a_name_like_no_preset_gets_no_arbitrary_suggestions(capsys, name):
    line = assert_user_error(*run(capsys, "estimate", "--model", name))
    assert "no preset name is close" in line and "closest" not in line


def test_a_name_inside_preset_names_suggests_them(capsys):
    line = assert_user_error(*run(capsys, "estimate", "--model", "qwen"))
    assert "closest: " in line and "qwen3-30b-a3b" in line and "qwen3-235b-a22b" in line


MOE_TOML = """name = "x"
num_layers = 4
hidden_size = 1024
ffn_hidden_size = 4096
num_heads = 16
num_kv_heads = 16
vocab_size = 32000
gated_mlp = true
tied_embeddings = false
num_experts = 8
"""


def test_moe_model_file_without_top_k_says_it_is_missing(capsys, tmp_path):
    p = write(tmp_path, "m.toml", MOE_TOML)
    line = assert_user_error(*run(capsys, "estimate", "--model", str(p), "--gpus", "8"))
    assert "top_k" in line and "experts per token" in line and "1..8" in line
    p = write(tmp_path, "m.toml", MOE_TOML + "top_k = 2\n")
    line = assert_user_error(*run(capsys, "estimate", "--model", str(p), "--gpus", "8"))
    assert "moe_ffn_hidden_size" in line and "each expert's FFN width" in line


@pytest.mark.parametrize("seq", [8191, 3000, 10000])
def test_default_batch_is_about_4m_tokens_with_a_power_of_two_factor(capsys, seq):
    # 4M/3000 = 1398 (2·3·233) would leave data parallelism above 2 nothing to divide
    # divisible by powers of two up to an eighth of the leading one: 32 for 4M/10000 = 419
    code, out, err = run(capsys, "estimate", "--model", "llama3-8b", "--gpus", "32", "--seq", str(seq), "--no-sp",
                         "--json")
    assert code == 0, err
    d = json.loads(out)
    batch = d["num_microbatches"] * d["plan"]["dp"] * d["plan"]["micro_batch_size"]
    assert abs(batch * seq / 2**22 - 1) <= 1 / 16
    assert d["plan"]["dp"] == 32  # the whole cluster's data parallelism divides it


def test_default_batch_values():
    from paraplan.cli.args import default_batch
    assert [default_batch(s) for s in (8192, 8191, 3000, 4096, 2**22, 2**24)] == [512, 512, 1408, 1024, 1, 1]


def test_batch_tokens_not_a_multiple_of_seq_names_the_flag_given(capsys):
    line = assert_user_error(*run(capsys, "estimate", "--batch-tokens", "1000", "--seq", "300"))
    assert "--batch-tokens=1000" in line and "--batch" in line


def test_torchtitan_plans_without_zero_get_its_fsdp(capsys, tmp_path):
    # torchtitan's default: FSDP2 over every data-parallel rank, resharding after forward
    # only without a pipeline (apply_fsdp: reshard_after_forward = not pp_enabled)
    code, out, err = run(capsys, "estimate", "--engine", "torchtitan", "--tp", "8", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["zero"] == "3"
    code, out, err = run(capsys, "estimate", "--engine", "torchtitan", "--tp", "8", "--pp", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["zero"] == "2"
    # a zero-bubble schedule over FSDP2 takes ZeRO 0 or 2 only: the default is one of them
    code, out, err = run(capsys, "estimate", "--engine", "torchtitan", "--tp", "8", "--pp", "2", "--vp", "2",
                         "--schedule", "zbv", "--no-compile", "--json")
    assert code == 0, err
    # --zero 0 given: the engine's rule is the error (that is what the user asked for)
    line = assert_user_error(*run(capsys, "estimate", "--engine", "torchtitan", "--tp", "8", "--pp", "2",
                                  "--zero", "0"))
    assert "zero='0'" in line
    out_file = tmp_path / "t.toml"
    code, out, err = run(capsys, "export", "--format", "torchtitan", "--tp", "8", "--pp", "2", "-o", str(out_file))
    assert code == 0, err
    text = out_file.read_text()
    assert "data_parallel_shard_degree = 32" in text and 'fsdp_reshard_after_forward = "never"' in text
    # Megatron keeps ZeRO-0 (no distributed optimizer unless asked)
    code, out, err = run(capsys, "estimate", "--engine", "megatron", "--tp", "8", "--pp", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["zero"] == "0"


@pytest.mark.parametrize("engine", [[], ["--engine", "torchtitan"]])
def test_an_empty_zero_is_refused_not_read_as_zero(capsys, engine):
    line = assert_user_error(*run(capsys, "estimate", "--tp", "8", "--zero", "", *engine))
    assert "zero=''" in line


SMALL = ["serve", "--model", "llama3-8b", "--gpus", "1", "--requests", "20", "--json"]


def test_serve_default_max_num_tokens_rises_to_a_long_prompt(capsys):
    code, out, err = run(capsys, *SMALL, "--prompt", "10000", "--output", "16")
    assert code == 0, err
    assert json.loads(out)["engine_limits"]["max_num_tokens"] == 10000
    code, out, err = run(capsys, *SMALL, "--prompt", "100", "--output", "16")
    assert json.loads(out)["engine_limits"]["max_num_tokens"] == 8192  # TensorRT-LLM's default
    line = assert_user_error(*run(capsys, *SMALL, "--prompt", "10000", "--output", "16",
                                  "--max-num-tokens", "9000"))
    assert "--max-num-tokens=9000" in line and "10000" in line


def test_serve_chunked_prefill_default_rises_to_max_batch(capsys):
    code, out, err = run(capsys, *SMALL, "--chunked-prefill", "--max-batch", "10000")
    assert code == 0, err
    line = assert_user_error(*run(capsys, *SMALL, "--chunked-prefill", "--max-batch", "10000",
                                  "--max-num-tokens", "5000"))
    assert "--max-batch (10000)" in line


@pytest.mark.parametrize("flags,absent,present", [
    (["--weights", "int4"], ["int4 weights"], ["8-bit KV cache", "more GPUs (--gpus"]),
    (["--weights", "fp8", "--kv", "fp8"], ["8-bit KV cache", "fp8/int8"], ["int4 weights"]),
    (["--weights", "bf16", "--kv", "bf16"], [], ["fp8/int8 or int4 weights", "8-bit KV cache"]),
])
def test_serve_advice_leaves_out_what_the_deployment_already_does(capsys, flags, absent, present):
    line = assert_user_error(*run(capsys, "serve", "--model", "llama3.1-405b", "--gpus", "2", *flags))
    advice = line.rsplit("; try ", 1)[1]
    assert all(a not in advice for a in absent), advice
    assert all(p in advice for p in present), advice


def test_serve_advice_names_the_pins_that_hold_a_replica_small(capsys):
    line = assert_user_error(*run(capsys, "serve", "--model", "llama3.1-405b", "--gpus", "8", "--tp", "2",
                                  "--pp", "1"))
    assert "more GPUs per replica (--tp, --pp" in line
    # unpinned on 3 GPUs: replicas of 1 and 2 GPUs were tried; the lever is --gpus
    line = assert_user_error(*run(capsys, "serve", "--model", "llama3.1-405b", "--gpus", "3"))
    assert "more GPUs (--gpus" in line and "power of two" in line and "--tp" not in line


def test_search_says_when_lifting_the_pins_would_fit(capsys):
    base = ["search", "--model", "llama3.1-405b", "--gpus", "64"]
    # --quiet: the search without the pins is over a million plans, whose phase lines would come first
    line = assert_user_error(*run(capsys, *base, "--pp", "1", "--cp", "1", "--quiet"))
    assert line.startswith("paraplan: error: no plan with the pins (--pp 1 --cp 1) fits")
    assert "without the pins (--pp 1 --cp 1) plans fit: the fastest is " in line
    assert "more GPUs" not in line  # lifting the pins is the answer, not more GPUs
    assert "not searched" not in line  # nothing was left out: the default search has it all
    code, out, err = run(capsys, *base, "--top", "1", "--json")
    assert code == 0, err
    # the plan it names is what the unpinned search ranks first
    assert f"the fastest is {json.loads(out)['ranked'][0]['plan']['describe']} (" in line


def test_search_says_when_the_pins_are_not_what_leaves_nothing(capsys):
    line = assert_user_error(*run(capsys, "search", "--model", "llama3.1-405b", "--gpus", "8", "--tp", "8"))
    assert "without the pins (--tp 8) no plan fits either" in line and "more GPUs (about " in line


def test_engine_without_offload_is_named_in_the_advice(capsys):
    line = assert_user_error(*run(capsys, "search", "--model", "llama3.1-405b", "--gpus", "8",
                                  "--engine", "torchtitan"))
    assert "optimizer offload (not searched for this engine)" in line


def test_an_engines_own_pins_are_not_the_users(capsys):
    # DeepSpeed pins PP = CP = 1 itself: with no pins given, nothing is said about lifting them
    line = assert_user_error(*run(capsys, "search", "--model", "llama3.1-405b", "--gpus", "8",
                                  "--engine", "deepspeed"))
    assert "without the pins" not in line
    # with a user pin, the search without it keeps the engine's: it names no pipeline plan
    line = assert_user_error(*run(capsys, "search", "--model", "llama3.1-405b", "--gpus", "64",
                                  "--engine", "deepspeed", "--tp", "8"))
    assert "without the pins (--tp 8)" in line
    assert "the fastest is" not in line or "PP1 " in line.split("the fastest is", 1)[1]


def test_megatron_search_ranks_no_offload_it_cannot_run(capsys):
    # --optimizer-cpu-offload needs the distributed optimizer (ZeRO-1): the engine's search
    # bounds leave the others out instead of ranking them and refusing them all
    code, out, err = run(capsys, "search", "--model", "llama3-70b", "--gpus", "16", "--engine", "megatron",
                         "--top", "5", "--json")
    assert code == 0, err
    for e in json.loads(out)["ranked"]:
        assert not e["plan"]["offload_optimizer"] or e["plan"]["zero"] == "1"
    # 405B's 126 layers on 64 GPUs: Megatron fits them only with a pipeline, which its
    # account-for flags split in slot-counted chunks (it used to find no plan at all)
    code, out, err = run(capsys, "search", "--model", "llama3.1-405b", "--gpus", "64", "--engine", "megatron",
                         "--top", "1", "--json")
    assert code == 0, err
    best = json.loads(out)["ranked"][0]["plan"]
    assert best["pp"] > 1 and 126 % (best["pp"] * best["vp"]) != 0
    assert not best["offload_optimizer"] or best["zero"] == "1"


def test_column_shards_of_uneven_width_are_priced_in_shard_order():
    # 100 columns over 3 shards: 34, 33, 33, the wider first (priced once per distinct shard)
    t = EmbeddingTable(name="t", num_rows=10**6, dim=100, pooling_factor=10.0)
    cluster = load_cluster("dgx-h100", num_gpus=8)
    opt = EmbOptimizer.ROWWISE_ADAGRAD
    c = table_contribution(t, ShardingType.COLUMN_WISE, 3, ComputeKernel.HBM, 0.0, 0.0, False,
                           (512, 8, 2, opt), cluster, 8)
    hbm = c["per_shard"]["hbm"]
    assert hbm[0] > hbm[1] == hbm[2] > 0
    np.testing.assert_allclose(hbm[0] / hbm[1], (34 * t.weight_bytes + opt.state_bytes_per_row(34))
                               / (33 * t.weight_bytes + opt.state_bytes_per_row(33)))


# ---------------------------------------------------------------- a second audit's findings

def _training_csv(tmp_path, **changes):
    from support import TRAINING_HEADER, TRAINING_ROW, write_csv
    return write_csv(tmp_path, TRAINING_HEADER, [{**TRAINING_ROW, **changes}], "rows.csv")


@pytest.mark.parametrize("mb,dp", [("1000000", "1"), ("8", "1"), ("2", "4")])
def test_validate_skips_a_row_whose_micro_batches_exceed_its_batch(capsys, tmp_path, mb, dp):
    # the row's global batch is 4: micro_batch × dp above it is no run that happened
    code, out, err = run(capsys, "validate", str(_training_csv(tmp_path, micro_batch=mb, dp=dp)), "--json")
    assert code == 1, err  # its one row skipped
    (r,) = json.loads(out)["rows"]
    assert r["predicted"] is None and "exceeds global_batch 4" in r["skipped"]


def test_run_refuses_vp_without_a_pipeline_before_starting(capsys):
    line = assert_user_error(*run(capsys, "run", "--vp", "2"))
    assert "--vp=2" in line and "--pp > 1" in line


@pytest.mark.parametrize("argv,flag", [
    (["trace", "--gpus", "8", "--tp", "8", "-o"], "--model"),
    (["export", "--format", "megatron", "--gpus", "8", "--tp", "8", "-o"], "--model"),
])
def test_an_output_naming_an_input_is_refused_and_the_input_kept(capsys, tmp_path, argv, flag):
    model = write(tmp_path, "m.toml", MOE_TOML.replace("num_experts = 8\n", ""))
    before = model.read_text()
    line = assert_user_error(*run(capsys, *argv, str(model), "--model", str(model)))
    assert f"the {flag} file this command reads" in line
    assert model.read_text() == before


def test_embeddings_export_naming_its_tables_is_refused(capsys, tmp_path):
    tables = write(tmp_path, "t.csv", "name,num_rows,dim\nt,1000,64\n")
    line = assert_user_error(*run(capsys, "embeddings", "--tables", str(tables), "--gpus", "8",
                                  "--export-torchrec", str(tables)))
    assert "the --tables file" in line and tables.read_text() == "name,num_rows,dim\nt,1000,64\n"


def test_interruptions_too_frequent_for_progress_say_so(capsys):
    code, out, err = run(capsys, "estimate", "--interruptions-per-gpu-day", "100")
    assert code == 0, err
    (line,) = [x for x in out.splitlines() if x.startswith("with failures")]
    assert "no progress" in line and "years" not in line and "$" not in line


def test_no_single_change_advice_points_to_search_not_only_more_gpus(capsys):
    code, out, err = run(capsys, "estimate", "--model", "mixtral-8x7b", "--tp", "1")
    assert code == 0, err
    assert "several together may (`paraplan search`" in out


def test_dualpipev_at_micro_batch_1_does_not_suggest_a_smaller_one(capsys):
    line = assert_user_error(*run(capsys, "estimate", "--pp", "4", "--vp", "2", "--schedule", "dualpipev"))
    assert "smaller micro-batch" not in line and "less DP" in line


def test_the_default_batch_named_as_such_when_dp_does_not_divide_it(capsys):
    line = assert_user_error(*run(capsys, "estimate", "--gpus", "1024", "--tp", "1"))
    assert "--batch=512" in line and "the default" in line and "multiple of 1024" in line


@pytest.mark.parametrize("argv", [
    ["scale", "--counts", "2_0"], ["estimate", "--model", "mixtral-8x7b", "--moe-imbalance", "2_0"],
    ["embeddings", "--hbm-reserve", "0_1"], ["calibrate", "--ranks", "2_0"], ["run", "--lr", "2_0"],
])
def test_underscored_numbers_are_refused_everywhere(capsys, argv):
    line = assert_user_error(*run(capsys, *argv))
    assert "_" in line


@pytest.mark.parametrize("argv,says", [
    (["--recompute", "first_k", "--pp", "4"], "--recompute-layers=0"),
    (["--pp", "4", "--schedule", "interleaved"], "give --vp 2 or more"),
    (["--pp", "4", "--schedule", "zbv"], "give --vp 2"),
])
def test_plan_flags_name_the_flag_that_is_missing(capsys, argv, says):
    line = assert_user_error(*run(capsys, "estimate", *argv))
    assert says in line


def test_moe_imbalance_on_a_dense_model_is_refused_like_capacity_factor(capsys):
    line = assert_user_error(*run(capsys, "estimate", "--moe-imbalance", "1.2"))
    assert "--moe-imbalance=1.2" in line and "llama3-70b is dense" in line


def test_estimate_without_plan_flags_estimates_the_search_best(capsys):
    # a first `estimate` with no plan flag used to price TP1 PP1 DP-all (1.39 TiB per GPU for
    # the default Llama 3 70B); it now takes the plan the search ranks first, and says so
    small = ["--model", "llama3-8b", "--gpus", "16", "--seq", "4096", "--batch", "64"]
    code, out, err = run(capsys, "search", *small, "--top", "1", "--json")
    assert code == 0, err
    best = json.loads(out)["ranked"][0]
    code, out, err = run(capsys, "estimate", *small, "--json")
    assert code == 0, err
    est = json.loads(out)
    assert est["plan_source"] == "search" and est["fits"]
    assert est["plan"] == best["plan"] and est["step_time_s"] == best["step_time_s"]
    code, out, err = run(capsys, "estimate", *small)
    assert "no plan flags: the fastest plan that fits" in out
    # any plan flag, even the default value of one, is a plan from the flags
    for flag in (["--tp", "1"], ["--recompute", "none"], ["--no-sp"]):
        code, out, err = run(capsys, "estimate", *small, *flag, "--json")
        assert code == 0 and json.loads(out)["plan_source"] == "flags", flag
        assert json.loads(out)["plan"]["tp"] == 1
    # under --engine, the best plan that engine runs (as export picks it)
    code, out, err = run(capsys, "estimate", *small, "--engine", "megatron")
    exported = json.loads(run(capsys, "export", "--format", "megatron", *small, "--json")[1])
    assert code == 0 and exported["plan_source"] == "search"
    assert f"plan            {exported['plan']}\n" in out


def test_trace_without_plan_flags_traces_the_search_best(capsys, tmp_path):
    small = ["--model", "llama3-8b", "--gpus", "16", "--seq", "4096", "--batch", "64"]
    best = json.loads(run(capsys, "estimate", *small, "--json")[1])
    code, out, err = run(capsys, "trace", *small, "-o", str(tmp_path / "t.json"), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["plan_source"] == "search" and summary["step_time_s"] == best["step_time_s"]
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["plan"] == summary["plan"]


def test_an_empty_recompute_is_still_refused(capsys):
    line = assert_user_error(*run(capsys, "estimate", "--model", "llama3-8b", "--gpus", "8", "--recompute", ""))
    assert "recompute" in line
