"""Adam accumulation (Plan.adam_accumulation, --adama): the knob from the CLI, the plan
string and the API, the plans it does not combine with, and the engines that refuse it.
Its physics (bytes and seconds) is in tests/golden/test_adama_physics.py."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from support import assert_user_error, run

from paraplan import api
from paraplan.errors import SpecError
from paraplan.export import deepspeed, megatron, torchtitan
from paraplan.plan.axes import AttentionKernel, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch, check_plan
from paraplan.report.legend import terms_used, unexplained
from paraplan.run.config import RunConfig, check_runnable
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

MODEL, CLUSTER = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=8)
WL = Workload(global_batch_size=64, seq_len=4096)
SPEC = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq", "4096", "--batch", "64"]
ADAMA = make_plan(dp=8, zero=ZeroStage.OPTIMIZER, adam_accumulation=True, attention=AttentionKernel.FLASH3)


def test_describe_tag_and_legend():
    text = ADAMA.describe()
    assert "adama" in text.split() and "adama" not in replace(ADAMA, adam_accumulation=False).describe()
    assert not unexplained([text])
    assert any(t.label == "adama" for t in terms_used([text]))


def test_the_flag_and_the_plan_string_give_the_same_plan(capsys):
    outs = []
    for argv in (["--dp", "8", "--zero", "1", "--adama"], ["--plan", ADAMA.describe()], ["--dp", "8", "--zero", "1"]):
        code, out, _ = run(capsys, "estimate", *SPEC, *argv, "--json")
        assert code == 0
        outs.append(json.loads(out))
    by_flag, by_string, plain = (o["plan"] for o in outs)
    assert by_flag == by_string != plain
    assert outs[0]["time_breakdown_s"] == outs[1]["time_breakdown_s"] != outs[2]["time_breakdown_s"]
    assert plain["adam_accumulation"] is False and by_flag["adam_accumulation"] is True


@pytest.mark.parametrize("plan, needle", [
    (replace(ADAMA, zero=ZeroStage.GRADIENTS), "needs ZeRO 0 or 1, not 2"),
    (replace(ADAMA, zero=ZeroStage.PARAMETERS), "needs ZeRO 0 or 1, not 3"),
    (replace(ADAMA, offload_optimizer=True), "cannot run with --offload"),
    (replace(ADAMA, fsdp2_copies=True), "FSDP2"),
])
def test_what_it_does_not_combine_with(plan, needle):
    rejected = check_plan(plan, MODEL, CLUSTER, WL)
    assert rejected is not None and needle in rejected.reason and "adam accumulation" in rejected.reason


def test_it_combines_with_zero_0_and_1():
    assert check_plan(ADAMA, MODEL, CLUSTER, WL) is None
    assert check_plan(replace(ADAMA, zero=ZeroStage.NONE), MODEL, CLUSTER, WL) is None


def test_a_rejected_combination_is_one_line_on_the_cli(capsys):
    line = assert_user_error(*run(capsys, "estimate", *SPEC, "--dp", "8", "--zero", "2", "--adama"))
    assert "adam accumulation (--adama) needs ZeRO 0 or 1" in line


def test_api_keyword_and_bad_value():
    est = api.estimate("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch_size=64, dp=8, zero="1",
                       adam_accumulation=True)
    assert est.plan.adam_accumulation
    with pytest.raises(SpecError, match="adam_accumulation='yes' is not allowed; True or False"):
        api.estimate("llama3-8b", "dgx-h100", gpus=8, dp=8, adam_accumulation="yes")


@pytest.mark.parametrize("engine, plan", [
    (megatron, ADAMA),
    (deepspeed, ADAMA),
    (torchtitan, replace(ADAMA, zero=ZeroStage.NONE)),
])
def test_engines_refuse_it_and_their_masks_exclude_it(engine, plan):
    off = replace(plan, adam_accumulation=False)
    engine.check(off, MODEL, WL)  # the same plan without it exports
    with pytest.raises(SpecError, match="adam_accumulation=True is not allowed;.*no Adam accumulation"):
        engine.check(plan, MODEL, WL)
    mask = engine.SUPPORT.limits.engine_rule(PlanBatch.from_plans([off, plan]), MODEL, WL)
    assert np.asarray(mask).tolist() == [False, True]


def test_the_export_command_refuses_it_in_one_line(capsys):
    line = assert_user_error(*run(capsys, "export", *SPEC, "--plan", ADAMA.describe(), "--format", "megatron"))
    assert "adam_accumulation=True" in line


def test_paraplan_run_refuses_it():
    """(`paraplan run` has no --adama flag, as it has no --offload: a config given whole is checked.)"""
    cfg = RunConfig(model=MODEL, model_name="llama3-8b", plan=replace(ADAMA, dp=2, dp_shard=2), workload=WL)
    check_runnable(replace(cfg, plan=replace(cfg.plan, adam_accumulation=False)))
    with pytest.raises(SpecError, match="--adama=True is not allowed; Adam accumulation"):
        check_runnable(cfg)


def test_a_search_does_not_try_it_and_rank_refuses_the_flag(capsys):
    res = api.search("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch_size=64, top=5)
    assert res.ranked and not any(r.plan.adam_accumulation for r in res.ranked)
    line = assert_user_error(*run(capsys, "estimate", *SPEC, "--rank", "1", "--adama"))
    assert "--adama" in line
