"""One rule for choosing the plan (cli/choice.py): plan flags narrow the search, `--rank N` is
the N-th row `search` prints for the same flags, `--plan` is that plan; and long work says
its phases on stderr unless `--quiet`, with --json's stdout still pure JSON."""

from __future__ import annotations

import json

import pytest
from support import assert_user_error, run

SMALL = ["--model", "llama3-8b", "--gpus", "16", "--seq", "4096", "--batch", "64"]


def _rows(capsys, *flags, top: int = 5) -> list[str]:
    code, out, err = run(capsys, "search", *SMALL, *flags, "--top", str(top), "--json")
    assert code == 0, err
    return [r["plan"]["describe"] for r in json.loads(out)["ranked"]]


@pytest.mark.parametrize("command,engine_flags", [("estimate", []), ("export", ["--format", "megatron"])])
def test_rank_n_is_the_n_th_row_of_search(capsys, command, engine_flags):
    # the search narrowed by --pp 2 (and by Megatron's bounds for export, as search --engine)
    search_engine = ["--engine", "megatron"] if engine_flags else []
    rows = _rows(capsys, "--pp", "2", *search_engine)
    assert len(rows) == 5 and len(set(rows)) == 5
    for n, row in enumerate(rows, start=1):
        code, out, err = run(capsys, command, *engine_flags, *SMALL, "--pp", "2", "--rank", str(n), "--json")
        assert code == 0, err
        d = json.loads(out)
        plan = d["plan"]["describe"] if command == "estimate" else d["plan"]
        assert plan == row and d["plan_source"] == "search" and d["plan_rank"] == n


def test_export_plan_flags_narrow_the_engines_search(capsys):
    # `--pp 2` is the best PP2 plan Megatron runs, not TP1 PP2 with every other axis at its default
    best = _rows(capsys, "--pp", "2", "--engine", "megatron", top=1)[0]
    code, out, err = run(capsys, "export", "--format", "megatron", *SMALL, "--pp", "2", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["plan"] == best and d["fits"] and "PP2" in best.split()


def test_estimate_prices_the_plan_of_its_flags_unless_rank_asks_for_the_search(capsys):
    flags = ["--tp", "2", "--pp", "2"]
    code, out, err = run(capsys, "estimate", *SMALL, *flags, "--json")
    assert code == 0, err
    written = json.loads(out)
    assert written["plan_source"] == "flags" and written["plan"]["zero"] == "0"
    code, out, err = run(capsys, "estimate", *SMALL, *flags, "--rank", "1", "--json")
    assert code == 0, err
    first = json.loads(out)
    assert first["plan"]["describe"] == _rows(capsys, *flags, top=1)[0]
    assert first["step_time_s"] <= written["step_time_s"]


def test_rank_past_what_the_search_ranked_is_one_line(capsys):
    pins = ["--tp", "2", "--pp", "2", "--dp", "4", "--schedule", "1f1b", "--cp-comm", "p2p",
            "--rank-order", "tp-cp-dp-pp"]
    rows = _rows(capsys, *pins, top=1000)
    assert 0 < len(rows) < 1000
    code, out, err = run(capsys, "estimate", *SMALL, *pins, "--rank", str(len(rows)), "--json")
    assert code == 0 and json.loads(out)["plan"]["describe"] == rows[-1]
    line = assert_user_error(*run(capsys, "estimate", *SMALL, *pins, "--rank", str(len(rows) + 1)))
    assert f"--rank={len(rows) + 1}" in line and f"at most {len(rows)}" in line


@pytest.mark.parametrize("command", ["estimate", "trace", "export"])
def test_rank_with_plan_is_one_line(capsys, tmp_path, command):
    extra = {"estimate": [], "trace": ["-o", str(tmp_path / "t.json")],
             "export": ["--format", "megatron", "-o", str(tmp_path / "m.sh")]}[command]
    line = assert_user_error(*run(capsys, command, *SMALL, *extra, "--rank", "2",
                                  "--plan", "TP1 PP1 DP16 mb2 rc:none zero2 attn:flash3"))
    assert "--rank=2" in line and "--plan" in line
    assert list(tmp_path.iterdir()) == []


def test_a_flag_no_search_narrows_is_one_line_with_rank_or_export(capsys):
    line = assert_user_error(*run(capsys, "estimate", *SMALL, "--offload", "--rank", "1"))
    assert "--offload" in line and "--plan" in line
    line = assert_user_error(*run(capsys, "export", "--format", "megatron", *SMALL, "--dp-shard", "4"))
    assert "--dp-shard" in line and "--plan" in line
    # an engine's bounds narrow the flags' choices: a stage it does not run names what it does
    line = assert_user_error(*run(capsys, "export", "--format", "deepspeed", *SMALL, "--sp"))
    assert "--sp='on'" in line and "deepspeed allows off" in line


def test_export_pp8_of_deepseek_v3_on_1024_gpus_fits(capsys):
    # issue 37: this exported TP1 PP8 DP128 ZeRO-0 (1.73 TiB per GPU) with a warning only
    code, out, err = run(capsys, "export", "--format", "megatron", "--model", "deepseek-v3", "--gpus", "1024",
                         "--pp", "8", "--quiet", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["fits"] and d["misfit"] is None and "PP8" in d["plan"].split() and d["plan_source"] == "search"
    assert err == ""  # --quiet: no phase lines, and a plan that fits has no warning


@pytest.fixture
def every_search_is_long(monkeypatch):
    """Phase lines for searches of any size (a test's search is short)."""
    import paraplan.cli.progress as progress
    monkeypatch.setattr(progress, "PROGRESS_MIN_PLANS", 0)


@pytest.mark.parametrize("argv", [["search", "--top", "2"], ["estimate"], ["estimate", "--tp", "2", "--rank", "1"],
                                  ["export", "--format", "megatron"], ["trace", "-o", "-"]])
def test_long_work_says_its_phases_on_stderr_unless_quiet(capsys, every_search_is_long, argv):
    json_flag = [] if argv[0] == "trace" else ["--json"]  # trace -o - writes the trace JSON to stdout
    code, out, err = run(capsys, *argv, *SMALL, *json_flag)
    assert code == 0, err
    json.loads(out)  # stdout is JSON only
    lines = [ln for ln in err.splitlines() if not ln.startswith("launch: ")]
    assert lines[0].startswith("searching ") and "candidate plans" in lines[0]
    assert lines[1].startswith("simulating the best ")
    code, out, err = run(capsys, *argv, *SMALL, *json_flag, "--quiet")
    assert code == 0 and json.loads(out)
    assert [ln for ln in err.splitlines() if not ln.startswith("launch: ")] == []


def test_a_short_search_writes_no_progress(capsys):
    code, out, err = run(capsys, "search", *SMALL, "--top", "1", "--json")
    assert code == 0 and err == ""


def test_an_error_after_long_work_is_still_the_last_line(capsys, every_search_is_long):
    # nothing fits: the phase lines come first, the error is one line at the end
    code, out, err = run(capsys, "search", "--model", "llama3.1-405b", "--gpus", "8", "--json")
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and lines[0].startswith("searching ")
    assert lines[-1].startswith("paraplan: error: ") and sum(ln.startswith("paraplan: ") for ln in lines) == 1


def test_input_every_plan_trips_on_is_its_error_alone(capsys, every_search_is_long):
    # the search's line waits for its first priced slice: a precision the GPU lacks fails there
    line = assert_user_error(*run(capsys, "estimate", *SMALL, "--precision", "nvfp4"))
    assert "nvfp4" in line


def test_a_long_trace_says_so_unless_quiet(capsys, tmp_path, monkeypatch):
    import paraplan.cli.trace as trace
    monkeypatch.setattr(trace, "TRACE_PROGRESS_EVENTS", 0)  # a test's trace is short
    argv = ["trace", *SMALL, "--tp", "2", "--pp", "2", "-o", str(tmp_path / "t.json"), "--json"]
    code, out, err = run(capsys, *argv)
    assert code == 0 and json.loads(out)["plan_source"] == "flags"
    assert err.startswith("tracing ") and "layer events" in err and err.count("\n") == 1
    code, out, err = run(capsys, *argv, "--quiet")
    assert code == 0 and err == ""


def test_trace_rank_is_the_same_row(capsys, tmp_path):
    row = _rows(capsys, "--pp", "2", top=2)[1]
    code, out, err = run(capsys, "trace", *SMALL, "--pp", "2", "--rank", "2", "-o", str(tmp_path / "t.json"), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["plan"] == row and d["plan_source"] == "search" and d["plan_rank"] == 2
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["plan"] == row
