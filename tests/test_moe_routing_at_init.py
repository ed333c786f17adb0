"""A router as initialized (published throughput benchmarks): the busiest expert-parallel rank's
load from the order statistics of uniform random routing (cost/moe.py random_routing_imbalance)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from support import assert_user_error, run

from paraplan.cost.estimate import estimate
from paraplan.cost.moe import expected_max_standard_normal, random_routing_imbalance, routing_imbalance
from paraplan.errors import SpecError
from paraplan.plan.axes import ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.search.whatif import Assumption, assumptions
from paraplan.specs.catalog import load_cluster
from paraplan.specs.model import ModelSpec
from paraplan.specs.workload import Precision, Workload
from paraplan.validate.recipes import routing_policy

MOE = ModelSpec(name="moe-test", num_layers=8, hidden_size=2048, ffn_hidden_size=6144, num_heads=32,
                num_kv_heads=4, head_dim=128, vocab_size=32000, num_experts=64, top_k=4,
                moe_ffn_hidden_size=768)
WL = Workload(global_batch_size=64, seq_len=4096, precision=Precision.BF16)


@pytest.mark.parametrize("n,tabulated", [(1, 0.0), (2, 0.5642), (4, 1.0294), (8, 1.4236), (16, 1.7660)])
def test_expected_max_of_normals_reproduces_tippetts_table(n, tabulated):
    """Tippett (1925), Biometrika 17, Table: the mean of the largest of n standard normals."""
    assert expected_max_standard_normal(n) == pytest.approx(tabulated, abs=1e-4)


def _simulated_excess(E, k, ep, routed_tokens, trials, rng):
    """Mean over trials of (busiest rank's received copies) / (mean) − 1, each of the group's
    ep·T tokens drawing its k experts uniformly without replacement, rank r holding experts
    r·E/ep onward."""
    tokens = ep * routed_tokens
    excess = []
    for _ in range(trials):
        experts = np.argsort(rng.random((tokens, E)), axis=1)[:, :k]  # k distinct per token
        load = np.bincount((experts // (E // ep)).ravel(), minlength=ep)
        excess.append(load.max() / (routed_tokens * k) - 1.0)
    return float(np.mean(excess))


@pytest.mark.parametrize("E,k,ep,routed", [(8, 2, 2, 512), (8, 2, 8, 512), (64, 4, 16, 256), (64, 8, 4, 128)])
def test_random_routing_imbalance_matches_a_simulated_router(E, k, ep, routed):
    """λ − 1, the busiest rank's excess over the mean, within 6% of a simulated router's."""
    model = replace(MOE, num_experts=E, top_k=k)
    simulated = _simulated_excess(E, k, ep, routed, trials=400, rng=np.random.default_rng(7))
    assert float(random_routing_imbalance(model, ep, routed)) - 1.0 == pytest.approx(simulated, rel=0.06)


def test_two_ranks_are_a_folded_normal():
    """At EP 2 the two loads sum to the group's copies, so the busier one is the mean plus |X − μ|:
    E = μ + σ·√(2/π) (a folded normal), σ² = 2·T·k·(1/2)(1/2)(E − k)/(E − 1)."""
    E, k, T = 16, 4, 1000
    sigma = math.sqrt(2 * T * k * 0.25 * (E - k) / (E - 1))
    model = replace(MOE, num_experts=E, top_k=k)
    assert float(random_routing_imbalance(model, 2, T)) == pytest.approx(1 + sigma * math.sqrt(2 / math.pi) / (T * k),
                                                                         rel=1e-4)
    assert float(random_routing_imbalance(model, 1, T)) == 1.0  # one rank holds every expert
    # more tokens per micro-batch: the law of large numbers balances the ranks
    assert random_routing_imbalance(model, 2, 8 * T) < random_routing_imbalance(model, 2, T)


def test_expert_tensor_parallelism_routes_its_group_together():
    """An expert's rows are its ETP group's union: ETP 4 spreads over four times the tokens, so
    the excess over the mean halves."""
    at_init = replace(WL, moe_routing_at_init=True)
    one = routing_imbalance(MOE, at_init, make_plan(tp=1, pp=1, dp=16, ep=16, micro_batch_size=1), 4096, 1)
    four = routing_imbalance(MOE, at_init, make_plan(tp=4, pp=1, dp=16, ep=16, etp=4, micro_batch_size=1), 4 * 4096, 4)
    assert float(four) - 1.0 == pytest.approx((float(one) - 1.0) / 2.0, rel=1e-9)


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


@pytest.mark.parametrize("row,policy", [
    # Megatron-Core's force load balancing draws every token's router logits at random
    ({"notes": "MoE: force-balanced token distribution, dropless"}, {"moe_routing_at_init": True}),
    ({"notes": "SFT on a chat mix, mock data"}, {}), ({"notes": "LoRA fine-tuning, rank 16"}, {}),
    ({"notes": "fine-tune of the base model"}, {}),
    ({"notes": "MLA (q-lora 1536, kv-lora 512), mock data"}, {"moe_routing_at_init": True}),
    ({"notes": "pretraining benchmark on synthetic data"}, {"moe_routing_at_init": True}),
    ({"framework": "NeMo 25.04.00 (dgxc v25.05.04)"}, {"moe_routing_at_init": True}),
    ({"notes": "the_pile shard00, 50 iterations"}, {}), ({}, {}),
])
def test_validate_reads_how_a_row_routed(row, policy):
    assert routing_policy({"model": "m", "source": "s", **row}) == policy


def _step_s(capsys, imbalance):
    code, out, err = run(capsys, "estimate", "--model", "qwen3-30b-a3b", "--gpus", "16", "--seq", "4096",
                         "--batch", "64", "--tp", "1", "--pp", "1", "--ep", "16", "--mb", "1", "--json",
                         "--moe-imbalance", imbalance)
    assert code == 0, err
    return json.loads(out)["step_time_s"]


def test_cli_moe_imbalance_init_sits_between_balance_and_the_default(capsys):
    assert _step_s(capsys, "1.0") < _step_s(capsys, "init") < _step_s(capsys, "1.1")


def test_cli_moe_imbalance_neither_number_nor_init_is_one_line(capsys):
    code, out, err = run(capsys, "estimate", "--model", "qwen3-30b-a3b", "--moe-imbalance", "initial")
    line = assert_user_error(code, out, err)
    assert "'initial' is not allowed" in line and "'init'" in line


@pytest.mark.parametrize("kw,field", [({"moe_imbalance": "init"}, "moe_imbalance"),
                                      ({"moe_imbalance": True}, "moe_imbalance"),
                                      ({"moe_routing_at_init": "yes"}, "moe_routing_at_init")])
def test_workload_refuses_a_routing_that_is_not_one(kw, field):
    """From Python as from the CLI: one SpecError naming the field, not a TypeError."""
    with pytest.raises(SpecError) as e:
        Workload(global_batch_size=8, seq_len=1024, **kw)
    assert e.value.field == field
