"""A 10,000-layer model at 5,000 pipeline stages: estimated with the closed-form bubble in
bounded memory (the simulator would hold 50M tasks), and refused by `trace` in one line."""

from __future__ import annotations

import pytest

from paraplan.cost.estimate import SIM_TASKS_MAX, estimate, schedule_tasks
from paraplan.plan.axes import Recompute
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster
from paraplan.specs.model import ModelSpec
from paraplan.specs.workload import Workload

from support import assert_user_error, run

DEEP = ModelSpec(name="deep-10k", num_layers=10_000, hidden_size=1024, ffn_hidden_size=4096, num_heads=16,
                 num_kv_heads=16, head_dim=64, vocab_size=32000, gated_mlp=False)


def _estimate(pp: int):
    plan = make_plan(pp=pp, micro_batch_size=1, recompute=Recompute.FULL)
    return estimate(DEEP, load_cluster("dgx-h100", num_gpus=pp), Workload(global_batch_size=pp, seq_len=1024), plan)


@pytest.mark.parametrize("pp", [2000, 5000])  # before: 74 s and 4.6 GB at 2,000; out of memory at 5,000
def test_a_pipeline_past_the_simulators_tasks_is_priced_in_closed_form_and_says_so(pp):
    est = _estimate(pp)
    assert schedule_tasks(est.plan, est.num_microbatches) > SIM_TASKS_MAX
    assert est.sim is None and "pipeline not simulated" in est.pipeline_note
    assert f"{pp:,} stages" in est.pipeline_note
    assert 0 < est.step_time_s < 1e4 and est.time.bubble_s > 0
    # within the simulator's reach the pipeline is simulated as before
    small = _estimate(100)
    assert small.sim is not None and small.pipeline_note == ""


def test_trace_refuses_what_it_cannot_hold_in_one_line(capsys, tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text('name = "deep"\nnum_layers = 10000\nhidden_size = 1024\nffn_hidden_size = 4096\n'
                    'num_heads = 16\nnum_kv_heads = 16\nvocab_size = 32000\ngated_mlp = false\n'
                    'tied_embeddings = false\n')
    out = tmp_path / "t.json"
    for pp, why in ((1000, "schedule tasks"), (100, "layer events")):
        line = assert_user_error(*run(capsys, "trace", "--model", str(deep), "--gpus", str(pp), "--pp", str(pp),
                                      "--tp", "1", "--batch", str(2 * pp), "--seq", "1024", "--mb", "1",
                                      "--recompute", "full", "-o", str(out)))
        assert "--pp" in line and why in line
        assert not out.exists()
