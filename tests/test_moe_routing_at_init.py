"""A router as initialized (published throughput benchmarks): the busiest expert-parallel rank's
load from the order statistics of uniform random routing (cost/moe.py random_routing_imbalance)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from paraplan.cost.estimate import estimate
from paraplan.cost.moe import expected_max_standard_normal, random_routing_imbalance
from paraplan.plan.axes import ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.search.whatif import Assumption, assumptions
from paraplan.specs.catalog import load_cluster
from paraplan.specs.model import ModelSpec
from paraplan.specs.workload import Precision, Workload
from paraplan.validate.training import _routing_policy

MOE = ModelSpec(name="moe-test", num_layers=8, hidden_size=2048, ffn_hidden_size=6144, num_heads=32,
                num_kv_heads=4, head_dim=128, vocab_size=32000, num_experts=64, top_k=4,
                moe_ffn_hidden_size=768)
WL = Workload(global_batch_size=64, seq_len=4096, precision=Precision.BF16)


@pytest.mark.parametrize("n,tabulated", [(1, 0.0), (2, 0.5642), (4, 1.0294), (8, 1.4236), (16, 1.7660)])
def test_expected_max_of_normals_reproduces_tippetts_table(n, tabulated):
    """Tippett (1925), Biometrika 17, Table: the mean of the largest of n standard normals."""
    assert expected_max_standard_normal(n) == pytest.approx(tabulated, abs=1e-4)


def _simulated(E, k, ep, routed_tokens, trials, rng):
    """Mean over trials of (busiest rank's received copies) / (mean), each token's k experts
    drawn uniformly without replacement, rank r holding experts r·E/ep onward."""
    tokens = ep * routed_tokens
    ratios = []
    for _ in range(trials):
        experts = np.argsort(rng.random((tokens, E)), axis=1)[:, :k]  # k distinct per token
        load = np.bincount((experts // (E // ep)).ravel(), minlength=ep)
        ratios.append(load.max() / (routed_tokens * k))
    return float(np.mean(ratios))


@pytest.mark.parametrize("E,k,ep,routed", [(8, 2, 8, 512), (64, 4, 16, 256), (64, 8, 4, 128)])
def test_random_routing_imbalance_matches_a_simulated_router(E, k, ep, routed):
    model = replace(MOE, num_experts=E, top_k=k)
    simulated = _simulated(E, k, ep, routed, trials=200, rng=np.random.default_rng(7))
    assert float(random_routing_imbalance(model, ep, routed)) == pytest.approx(simulated, rel=0.01)


def test_random_routing_imbalance_grok_like_by_hand():
    """8 experts top-2, EP 8, 2,048 tokens a rank: per-token variance 2·(1/8)(7/8)(6/7) = 0.1875,
    σ = √(8·2048·0.1875) = 55.43 copies on a mean of 4,096, and the busiest of 8 ranks 1.4236 σ up."""
    model = replace(MOE, num_experts=8, top_k=2)
    assert float(random_routing_imbalance(model, 8, 2048)) == pytest.approx(1 + 1.4236 * 3072 ** 0.5 / 4096, rel=1e-4)
    assert float(random_routing_imbalance(model, 1, 2048)) == 1.0  # one rank holds every expert
    # more tokens per micro-batch: the law of large numbers balances the ranks
    assert random_routing_imbalance(model, 8, 8192) < random_routing_imbalance(model, 8, 512)


def test_an_initialized_router_prices_its_own_imbalance_and_whatif_has_no_stated_one():
    c = load_cluster("dgx-h100", num_gpus=16)
    plan = make_plan(tp=1, pp=1, dp=16, ep=16, micro_batch_size=1, zero=ZeroStage.OPTIMIZER)
    at_init = replace(WL, moe_routing_at_init=True)
    balanced = estimate(MOE, c, replace(WL, moe_imbalance=1.0), plan).step_time_s
    stated = estimate(MOE, c, WL, plan).step_time_s  # 1.1, the default
    init = estimate(MOE, c, at_init, plan).step_time_s
    assert balanced < init < stated
    assert Assumption.IMBALANCE in assumptions(MOE, c, WL, [plan])
    assert Assumption.IMBALANCE not in assumptions(MOE, c, at_init, [plan])


@pytest.mark.parametrize("notes,policy", [
    ("MoE: force-balanced token distribution, dropless", {"moe_imbalance": 1.0}),
    ("SFT on a chat mix", {}), ("LoRA fine-tuning, rank 16", {}), ("fine-tune of the base model", {}),
    ("pretraining benchmark, mock data", {"moe_routing_at_init": True}), ("", {"moe_routing_at_init": True}),
])
def test_validate_reads_how_a_row_routed(notes, policy):
    assert _routing_policy({"model": "m", "source": "s", "notes": notes}) == policy


def _step_s(capsys, imbalance):
    from support import run
    code, out, err = run(capsys, "estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "4096",
                         "--batch", "64", "--tp", "1", "--pp", "1", "--ep", "16", "--mb", "1", "--json",
                         "--moe-imbalance", imbalance)
    assert code == 0, err
    import json
    return json.loads(out)["step_time_s"]


def test_cli_moe_imbalance_init_sits_between_balance_and_the_default(capsys):
    assert _step_s(capsys, "1.0") < _step_s(capsys, "init") < _step_s(capsys, "1.1")


def test_cli_moe_imbalance_neither_number_nor_init_is_one_line(capsys):
    from support import assert_user_error, run
    code, out, err = run(capsys, "estimate", "--model", "qwen3-30b-a3b", "--moe-imbalance", "initial")
    line = assert_user_error(code, out, err)
    assert "'initial' is not allowed" in line and "'init'" in line
