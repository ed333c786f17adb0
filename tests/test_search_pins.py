"""`paraplan search` with pinned axes that leave no plan: the pin is named, with the values
the axis can take, in one line (exit 2); pins that do not apply are refused, not dropped."""

from __future__ import annotations

import pytest
from support import assert_user_error, run

from paraplan.cli import main
from paraplan.plan.space import divisors

BASE = ["search", "--model", "llama3-8b", "--gpus", "8", "--batch", "64", "--seq", "2048"]


@pytest.mark.parametrize("flags, field, allowed", [
    (["--tp", "3"], "--tp=3", "1, 2, 4, 8"),          # does not divide 8 GPUs
    (["--pp", "64"], "--pp=64", "1, 2, 4, 8"),        # more stages than GPUs
    (["--dp", "5"], "--dp=5", "1, 2, 4, 8"),
    (["--mb", "100000"], "--mb=100000", "1, 2, 4, 8, 16"),
    (["--ep", "2"], "--ep=2", "allowed here: 1"),      # a dense model has no experts
    (["--etp", "2"], "--etp=2", "allowed here: 1"),
    (["--pp", "1", "--vp", "2"], "--pp=1", "allowed here: 2, 4, 8"),  # virtual stages need PP > 1
    (["--vp", "64"], "--vp=64", "allowed here: 1, 2, 4, 8"),
])
def test_impossible_pin_is_named_with_its_allowed_values(flags, field, allowed, capsys):
    code = main(BASE + flags)
    out, err = capsys.readouterr()
    line = assert_user_error(code, out, err)
    assert field in line and allowed in line, line


def test_capacity_factor_on_a_dense_model_is_refused(capsys):
    line = assert_user_error(main(BASE + ["--capacity-factor", "1.5"]), *capsys.readouterr())
    assert "--capacity-factor=1.5" in line and "dense" in line


def test_pinned_search_still_honours_a_valid_pin(capsys):
    assert main(BASE + ["--tp", "2", "--json"]) == 0
    import json
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert ranked and all(r["plan"]["tp"] == 2 for r in ranked)


def test_batch_too_small_for_the_gpu_count_says_what_must_divide(capsys):
    line = assert_user_error(main(["search", "--gpus", "1048576", "--batch", "1"]), *capsys.readouterr())
    assert "must divide the batch" in line and "fewer GPUs" in line


@pytest.mark.parametrize("n", [1, 2, 12, 36, 97, 1024, 1_000_000])
def test_divisors_match_the_definition(n):
    assert list(divisors(n)) == [x for x in range(1, n + 1) if n % x == 0]


@pytest.mark.parametrize("flags", [["--tokens", "inf"], ["--price", "nan"], ["--tokens", "-1"]])
def test_non_finite_numbers_are_refused(flags, capsys):
    code, out, err = run(capsys, "estimate", *flags)
    line = assert_user_error(code, out, err)
    assert flags[0] in line and "is not allowed; allowed: above 0 to " in line


def test_a_count_past_the_limit_is_a_one_line_error(capsys):
    # the plan space enumerates divisors of the count: 10^19 GPUs once hung the search
    code, out, err = run(capsys, "search", "--gpus", "10000000000000000000")
    assert code == 2 and "--gpus" in err and "1 to 1,048,576" in err and len(err.strip().splitlines()) == 1


def test_sequence_parallel_needs_tp_to_divide_the_sequence(capsys):
    # Megatron scatters each CP rank's sequence over TP: 4100 tokens do not split 8 ways
    line = assert_user_error(main(["estimate", "--model", "llama3-8b", "--gpus", "8", "--tp", "8", "--sp",
                                   "--seq", "4100", "--batch", "8"]), *capsys.readouterr())
    assert "sequence parallelism" in line and "4100" in line
    assert main(["search", "--model", "llama3-8b", "--gpus", "16", "--seq", "4100", "--batch", "64",
                 "--tp", "4", "--cp", "2", "--json"]) == 0
    import json
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert ranked and all(not p["plan"]["sequence_parallel"] for p in ranked)  # 2050 per CP rank, odd over 4


def test_no_plan_repeats_another_with_a_zero_stage_that_shards_nothing(capsys):
    # one data-parallel rank: ZeRO-1/2/3 equal ZeRO-0 for a dense model; shown once
    import json
    assert main(["search", "--model", "gpt3-175b", "--gpus", "128", "--batch", "32", "--seq", "2048", "--pp", "16",
                 "--top", "20", "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert all(p["plan"]["zero"] in (0, "none", "0") or p["plan"]["dp"] * p["plan"]["cp"] > 1 for p in ranked)


def test_offload_needs_a_sharded_optimizer(capsys):
    line = assert_user_error(main(["estimate", "--model", "llama3-8b", "--gpus", "8", "--zero", "0", "--offload"]),
                             *capsys.readouterr())
    assert "offload" in line and "ZeRO" in line


def test_top_above_the_resimulated_count_is_honoured(capsys):
    import json
    assert main(BASE + ["--top", "100", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["ranked"]) == 100


def test_one_gpu_still_offloads_the_optimizer(capsys):
    # one data-parallel rank: ZeRO-0 stands for every stage, but ZeRO-Offload (ZeRO-1 + offload) stays
    import json
    assert main(["search", "--model", "llama3-8b", "--gpus", "1", "--seq", "4096", "--batch", "8", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["ranked"][0]["plan"]
    assert best["offload_optimizer"] and best["zero"] == "1"


def test_engine_bounds_that_leave_nothing_are_named(capsys):
    # TP2 is valid on 2 GPUs with one sequence, but torchtitan runs TP only beside FSDP
    line = assert_user_error(main(["search", "--engine", "torchtitan", "--model", "llama3-8b", "--gpus", "2",
                                   "--batch", "1", "--seq", "4098"]), *capsys.readouterr())
    assert "the engine can build" in line and "valid without --engine" in line
