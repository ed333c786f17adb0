"""A plan that does not fit says why and which single change of its flags would fit
(search/advice.py): every change it names, typed back in, must fit as advertised."""

from __future__ import annotations

import json
import shlex

import pytest

from paraplan.cli import main

BIG = ["--model", "llama3-70b", "--gpus", "64", "--tp", "8", "--dp", "8", "--seq", "8192", "--batch", "64",
       "--mb", "2"]


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [
    BIG,
    ["--model", "llama3-8b", "--gpus", "8", "--dp", "8", "--seq", "8192", "--batch", "64", "--mb", "4",
     "--engine", "torchtitan", "--zero", "3"],
    ["--model", "llama3-70b", "--gpus", "32", "--tp", "4", "--pp", "2", "--dp", "4", "--seq", "4096",
     "--batch", "64", "--mb", "1", "--engine", "megatron"],
])
def test_every_advertised_change_fits_when_typed_back_in(capsys, argv):
    code, out, _ = _run(capsys, ["estimate", *argv, "--json"])
    assert code == 0
    d = json.loads(out)
    assert d["fits"] is False and d["misfit"].startswith("does not fit: needs ")
    assert d["fits_with"], "a plan this close to fitting has a change that fits"
    times = [c["step_time_s"] for c in d["fits_with"]]
    assert times == sorted(times)
    for c in d["fits_with"]:
        code, out, _ = _run(capsys, ["estimate", *argv, *shlex.split(c["flags"]), "--json"])
        assert code == 0, c["flags"]
        again = json.loads(out)
        assert again["fits"] is True, c["flags"]
        assert again["memory_bytes"]["total_bytes"] == pytest.approx(c["memory_bytes"], rel=1e-9)
        assert again["plan"]["describe"] == c["plan"]
        assert again["step_time_s"] == pytest.approx(c["step_time_s"], rel=1e-9)


def test_the_text_report_ends_with_the_advice(capsys):
    code, out, _ = _run(capsys, ["estimate", *BIG])
    assert code == 0
    last = " ".join(line.strip() for line in out.strip().split("\n\n")[-1].splitlines())  # (wrapped to the width)
    assert last.startswith("does not fit: ") and "fits with one change: " in last and "--zero 3 (" in last


def test_nothing_close_says_more_gpus(capsys):
    code, out, _ = _run(capsys, ["estimate", "--model", "llama3-70b", "--gpus", "8", "--tp", "8", "--seq", "8192",
                                 "--batch", "16"])
    assert code == 0
    flat = " ".join(out.split())  # (lines wrap at the terminal's width)
    assert "no single change" in flat and "more GPUs" in flat


def test_a_plan_that_fits_gets_no_advice(capsys):
    code, out, _ = _run(capsys, ["estimate", "--model", "llama3-8b", "--gpus", "8", "--zero", "3", "--json"])
    d = json.loads(out)
    assert code == 0 and d["fits"] and "misfit" not in d and "fits_with" not in d


def test_trace_of_a_plan_that_does_not_fit_says_so(capsys, tmp_path):
    code, out, _ = _run(capsys, ["trace", *BIG, "-o", str(tmp_path / "t.json")])
    flat = " ".join(out.split())
    assert code == 0 and "the plan does not fit" in flat and "--zero 3" in flat
    code, out, err = _run(capsys, ["trace", *BIG, "-o", "-"])
    assert code == 0 and json.loads(out)["traceEvents"] and "does not fit" in err


def test_a_plan_that_fits_says_its_headroom_and_what_frees_most_typed_back_in(capsys):
    """The change named as freeing the most memory, typed back in, frees what it says (the
    plan's memory less the freed bytes), and no other single change frees more."""
    argv = ["--model", "llama3-8b", "--gpus", "8", "--dp", "8", "--seq", "4096", "--batch", "32", "--mb", "1", "--zero", "2"]
    code, out, _ = _run(capsys, ["estimate", *argv, "--json"])
    d = json.loads(out)
    h = d["memory_headroom"]
    assert d["fits"] and "misfit" not in d
    total = d["memory_bytes"]["total_bytes"]
    assert h["free_bytes"] == pytest.approx(d["hbm_bytes"] - total)
    assert h["flags"] and h["freed_bytes"] > 0 and h["step_ratio"] > 0
    code, out, _ = _run(capsys, ["estimate", *argv, *shlex.split(h["flags"]), "--json"])
    changed = json.loads(out)["memory_bytes"]["total_bytes"]
    assert changed == pytest.approx(total - h["freed_bytes"])
    for flags in ("--recompute full", "--zero 3", "--offload"):
        code, out, _ = _run(capsys, ["estimate", *argv, *shlex.split(flags), "--json"])
        if code == 0:
            assert json.loads(out)["memory_bytes"]["total_bytes"] >= changed * (1 - 1e-9)
    # and in words, under the breakdown
    code, out, _ = _run(capsys, ["estimate", *argv])
    flat = " ".join(out.split())
    assert "memory headroom" in flat and f"frees most alone: {h['flags']}" in flat
