"""`--engine torchtitan|megatron|deepspeed` on search, estimate and trace: predictions with
the engine's policy knobs (specs/engine.py EngineSupport) and, in search, only the plans the
engine's exporter accepts, as `paraplan export --format` picks them."""

from __future__ import annotations

import json

import pytest

from paraplan.cli import main
from paraplan.export.registry import exporter
from paraplan.specs.engine import Engine

SMALL = ["--model", "llama3-8b", "--gpus", "8", "--seq", "4096", "--batch", "16"]


def _json(capsys, argv) -> dict:
    assert main(argv + ["--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_estimate_takes_the_engines_policy(capsys):
    plan = ["--dp", "8", "--zero", "3"]
    plain = _json(capsys, ["estimate"] + SMALL + plan)
    titan = _json(capsys, ["estimate"] + SMALL + plan + ["--engine", "torchtitan"])
    assert plain["plan"]["fsdp2_copies"] is False and plain["plan"]["grad_reduce_fp32"] is False
    # FSDP2: fp32 gradient reduction and copies around every gather and reduction
    assert titan["plan"]["fsdp2_copies"] is True and titan["plan"]["grad_reduce_fp32"] is True
    assert titan["step_time_s"] > plain["step_time_s"]


@pytest.mark.parametrize("engine", [e.value for e in Engine])
def test_search_ranks_only_plans_the_engine_runs(capsys, engine):
    out = _json(capsys, ["search"] + SMALL + ["--engine", engine, "--top", "5"])
    mod = exporter(Engine(engine))
    limits = mod.SUPPORT.limits
    assert out["engine"] == engine and 1 <= len(out["ranked"]) <= 5
    steps = [r["step_time_s"] for r in out["ranked"]]
    assert steps == sorted(steps)
    for r in out["ranked"]:
        p = r["plan"]
        # torchtitan shards on FSDP2 and replicates (ZeRO-0) on DDP, without copies
        assert p["fsdp2_copies"] is (engine == "torchtitan" and p["zero"] != "0")
        assert p["sequence_parallel"] in limits.sequence_parallel or p["tp"] == 1
        for key, value in mod.SUPPORT.pinned.items():
            assert p[key] == value


def test_engine_refusals_are_one_line(capsys):
    for argv, said in ((["search"] + SMALL + ["--engine", "deepspeed", "--pp", "2"], "--pp=2 is not allowed"),
                       (["estimate"] + SMALL + ["--engine", "megatron", "--optimizer", "adam-unfused"],
                        "--optimizer='adam-unfused' is not allowed"),
                       (["estimate"] + SMALL + ["--engine", "deepspeed", "--pp", "2"], "engine deepspeed"),
                       (["search"] + SMALL + ["--engine", "deepspeed", "--vp", "2"], "engine deepspeed: --vp=2")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
    with pytest.raises(SystemExit) as e:  # argparse's own refusal
        main(["estimate"] + SMALL + ["--engine", "jax"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "invalid choice: 'jax'" in err


def test_scale_keeps_the_engines_plans_at_every_count(capsys):
    out = _json(capsys, ["scale", "--model", "llama3-8b", "--seq", "4096", "--batch", "64", "--counts", "8,16",
                         "--engine", "deepspeed"])
    bests = [p["best"]["plan"] for p in out["points"]]
    assert len(bests) == 2 and all(p["pp"] == 1 and p["cp"] == 1 and not p["sequence_parallel"] for p in bests)
    assert all(p["grad_reduce_fp32"] is False and p["fsdp2_copies"] is False for p in bests)
