"""`--plan "TP8 PP4 ..."`: a plan as `search` prints it reads back into the same plan, for every
plan of a 64-GPU space (dense and MoE), and bad strings are one-line errors."""

from __future__ import annotations

import pytest
from support import assert_user_error, run

from paraplan.cli.args import apply_plan_string, plan_from_args
from paraplan.cli.main import build_parser
from paraplan.plan.space import PlanBatch, SpaceLimits, enumerate_space
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload


PARSER = build_parser()


def _read_back(text: str, cluster):
    args = PARSER.parse_args(["estimate", "--plan", text])
    apply_plan_string(args)
    return plan_from_args(args, cluster)


@pytest.mark.parametrize("model,tokens", [("llama3-8b", ("SP", "tpov", "offload", "rc:first", "zero3/hsdp", "CP2/")),
                                          ("qwen3-30b-a3b", ("EP", "epov", "a2a:2d", "cf"))])
def test_every_plan_of_a_64_gpu_space_round_trips(model, tokens):
    cluster = load_cluster("dgx-h100", num_gpus=64)
    spec = load_model(model)
    batch = PlanBatch.concat([b for b, _ in enumerate_space(spec, cluster, Workload(global_batch_size=256, seq_len=4096),
                                                            SpaceLimits(capacity_factors=(None, 1.25))) if len(b)])
    step = max(1, len(batch) // 2000)  # a spread of the space: every step-th plan
    seen = set()
    for i in range(0, len(batch), step):
        plan = batch.plan(i)
        text = plan.describe()
        back = _read_back(text, cluster)
        assert back.describe() == text
        seen.update(text.split())
    # the sample holds the shorthand the space offers
    for token in tokens:
        assert any(t.startswith(token) for t in seen), token


def test_a_bad_plan_string_or_one_with_flags_is_a_one_line_error(capsys):
    line = assert_user_error(*run(capsys, "estimate", "--plan", "TP8 PP1 DP64 mb1 warp9"))
    assert "--plan='warp9'" in line and "as `paraplan search` prints it" in line
    line = assert_user_error(*run(capsys, "estimate", "--plan", "TP8 PP1 DP64 mb1 rc:none attn:flash3", "--tp", "4"))
    assert "not both" in line


def test_export_takes_the_plan_string(capsys, tmp_path):
    out = tmp_path / "m.sh"
    text = "TP8 PP1 DP64 mb1 SP rc:none zero1 tpov attn:flash3"
    code, stdout, err = run(capsys, "export", "--format", "megatron", "--model", "llama3-70b", "--gpus", "512",
                            "--plan", text, "-o", str(out))
    assert code == 0, err
    assert text in out.read_text()
