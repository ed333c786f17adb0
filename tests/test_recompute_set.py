"""Searched recomputation (Recompute.SET, cost/recompute_set.py): the sets span none to full,
fusion makes an element-wise recompute cheaper, and the search picks a set where it fits and
beats full recomputation."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest

from paraplan.cost.cp import cp_comm
from paraplan.cost.layer_compute import layer_compute
from paraplan.cost.layout import layout
from paraplan.cost.memory import layer_activation_bytes, recompute_op_bytes_per_token
from paraplan.cost.recompute_set import MAX_SEARCHED_SETS, op_costs, pareto_sets, searched_sets, set_cost
from paraplan.cost.tp import tp_comm
from paraplan.errors import SpecError
from paraplan.export import megatron
from paraplan.plan.axes import AttentionKernel, Recompute, RecomputeOp, RecomputeOps, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import SpaceLimits, check_plan
from paraplan.search.planner import search
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

LLAMA = load_model("llama3-8b")
ALL = RecomputeOps(RecomputeOp)


def _stored(model, rc, ops=RecomputeOps(), precision=None, **kw):
    plan = make_plan(recompute=rc, recompute_ops=ops, **kw)
    return float(layer_activation_bytes(model, plan, 4096, recompute_code=rc.code, precision=precision)[0])


@pytest.mark.parametrize("fused,autocast,tp,sp,kernel,precision", [
    c for c in itertools.product([True, False], [False, True], [1, 4], [False, True],
                                 [AttentionKernel.UNFUSED, AttentionKernel.FLASH2],
                                 [Precision.BF16, Precision.FP8, Precision.FP32]) if c[2] > 1 or not c[3]])
def test_the_sets_span_none_to_full(fused, autocast, tp, sp, kernel, precision):
    """Every op dropped keeps what full recomputation keeps (the layer input); one op dropped
    keeps none's bytes less that op's (so the empty set would be none's); the scores alone,
    selective's."""
    kw = dict(tp=tp, micro_batch_size=2, sequence_parallel=sp, attention=kernel, fused_kernels=fused,
              autocast=autocast, compiled=not fused)
    full, none = _stored(LLAMA, Recompute.FULL, precision=precision, **kw), _stored(LLAMA, Recompute.NONE,
                                                                                     precision=precision, **kw)
    assert _stored(LLAMA, Recompute.SET, ALL, precision, **kw) == pytest.approx(full, rel=1e-12)
    assert _stored(LLAMA, Recompute.SET, RecomputeOps([RecomputeOp.SCORES]), precision, **kw) == pytest.approx(
        _stored(LLAMA, Recompute.SELECTIVE, precision=precision, **kw), rel=1e-12)
    table = recompute_op_bytes_per_token(LLAMA, make_plan(**kw), 4096, precision=precision)
    for op in (RecomputeOp.LN1, RecomputeOp.ACT):
        got = _stored(LLAMA, Recompute.SET, RecomputeOps([op]), precision, **kw)
        assert got == pytest.approx(none - 2 * 4096 * float(table[op]), rel=1e-12) and got < none


def _op_costs(plan, model=LLAMA, seq=4096):
    cluster, wl = load_cluster("dgx-h100", num_gpus=8), Workload(global_batch_size=64, seq_len=seq)
    lay = layout(model, wl, plan)
    lc = layer_compute(cluster.gpu, model, wl, plan, lay, None)
    return op_costs(cluster.gpu, model, plan, lay, lc, tp_comm(cluster, model, plan, lay, lc, None),
                    cp_comm(cluster, model, plan, lay, lc))


def test_fusion_makes_an_elementwise_recompute_cheaper():
    """A norm recomputed inside the next GEMM's compiled prologue reads its input only; the same
    norm as its own kernel (eager, or a fused engine's module) also writes and launches."""
    compiled = _op_costs(make_plan(fused_kernels=False, compiled=True))
    eager = _op_costs(make_plan(fused_kernels=False))
    fused_engine = _op_costs(make_plan())
    for op in (RecomputeOp.LN1, RecomputeOp.ACT):
        assert float(compiled[op].compute_s) < float(fused_engine[op].compute_s) < float(eager[op].compute_s)
    # a GEMM costs the same whether the block is compiled or not
    assert float(compiled[RecomputeOp.RESID].compute_s) < float(eager[RecomputeOp.RESID].compute_s)
    assert float(compiled[RecomputeOp.UP].compute_s) == pytest.approx(float(eager[RecomputeOp.UP].compute_s))


def test_the_attention_is_rerun_once_for_scores_and_output():
    costs = _op_costs(make_plan(attention=AttentionKernel.UNFUSED))
    both = RecomputeOps([RecomputeOp.SCORES, RecomputeOp.ATTN]).code
    one = RecomputeOps([RecomputeOp.ATTN]).code
    assert float(set_cost(both, costs).compute_s) == pytest.approx(float(set_cost(one, costs).compute_s))
    assert float(set_cost(ALL.code, costs).compute_s) > float(set_cost(one, costs).compute_s) > 0.0


def test_the_frontier_is_small_and_ends_at_every_op():
    saved, seconds = np.array([0.0, 1.0, 1.0, 3.0, 0.5]), np.array([0.0, 2.0, 1.0, 1.5, 1.0])
    # (set 1 saves what set 2 does, slower; set 4 ties set 2's time, saving less)
    assert pareto_sets(saved, seconds, limit=3) == [2, 3] and pareto_sets(saved, seconds, limit=2) == [3]
    cluster, wl = load_cluster("dgx-h100", num_gpus=8), Workload(global_batch_size=64, seq_len=8192)
    for tp, sp in ((1, False), (8, True)):
        codes = searched_sets(LLAMA, cluster, wl, SpaceLimits())(tp, sp)
        assert 1 <= len(codes) <= MAX_SEARCHED_SETS and codes[-1] == ALL.code - RecomputeOps([RecomputeOp.SCORES]).code


def test_the_search_picks_a_set_that_fits_where_none_does_not_and_beats_full():
    """Llama 3 8B at 6k tokens on 8 H100s, one sequence per micro-batch, ZeRO-1 and no model
    parallelism: nothing recomputed needs about 92 GiB; a set fits under 80 and is faster than
    full recomputation, and faster than every other policy that fits."""
    cluster, wl = load_cluster("dgx-h100", num_gpus=8), Workload(global_batch_size=48, seq_len=6144)

    def best(*recomputes):
        limits = SpaceLimits(recomputes=recomputes, max_micro_batch=1, zero_stages=(ZeroStage.OPTIMIZER,),
                             allow_offload=False, activation_offload=False)
        return search(LLAMA, cluster, wl, limits=limits, fixed={"tp": 1, "pp": 1, "cp": 1}, top_k=1,
                      resimulate=2).ranked[0]
    with pytest.raises(Exception, match="no plan fits"):
        best(Recompute.NONE)
    chosen = best(*[r for r in Recompute if r not in (Recompute.MODULES, Recompute.OP_SAC)])
    assert chosen.plan.recompute is Recompute.SET and chosen.plan.recompute_ops != ALL
    assert chosen.step_time_s < 0.9 * best(Recompute.FULL).step_time_s


def test_a_set_whose_plan_fits_without_recomputation_is_not_timed():
    """A searched set only re-runs work: where the same plan without recomputation fits, the
    search times the twin and passes the set over (search/planner.py); pinned to sets alone
    (no twin in the space) it ranks them."""
    from paraplan.plan.space import PlanBatch
    from paraplan.search.planner import _set_with_a_fitting_twin
    cluster, wl = load_cluster("dgx-h100", num_gpus=8), Workload(global_batch_size=16, seq_len=2048)
    roomy = make_plan(tp=1, dp=8, recompute=Recompute.SET, recompute_ops=RecomputeOps.parse("ln2,act", "recompute_ops"), zero=ZeroStage.OPTIMIZER)
    tight = make_plan(tp=1, dp=8, micro_batch_size=1, recompute=Recompute.SET, recompute_ops=RecomputeOps.parse("ln2,act", "recompute_ops"))
    long_wl = Workload(global_batch_size=48, seq_len=6144)
    batch = PlanBatch.from_plans([roomy])
    assert _set_with_a_fitting_twin(LLAMA, cluster, wl, batch, np.array([True])).tolist() == [True]
    # at 6k tokens nothing recomputed needs about 92 GiB: the set stays
    assert _set_with_a_fitting_twin(LLAMA, cluster, long_wl, PlanBatch.from_plans([tight]),
                                    np.array([True])).tolist() == [False]
    only_sets = SpaceLimits(recomputes=(Recompute.SET,), max_micro_batch=1, allow_offload=False,
                            activation_offload=False)
    ranked = search(LLAMA, cluster, wl, limits=only_sets, fixed={"tp": 1, "pp": 1, "cp": 1}, top_k=1).ranked
    assert ranked and ranked[0].plan.recompute is Recompute.SET


def test_a_set_is_a_dense_layers_and_names_one_op():
    cluster, wl = load_cluster("dgx-h100", num_gpus=64), Workload(global_batch_size=64, seq_len=4096)
    rejected = check_plan(make_plan(tp=8, dp=8, sequence_parallel=True, recompute=Recompute.SET, recompute_ops=ALL),
                          load_model("mixtral-8x7b"), cluster, wl)
    assert rejected is not None and "dense" in rejected.reason
    rejected = check_plan(make_plan(tp=8, dp=8, recompute=Recompute.SET), LLAMA, cluster, wl)
    assert rejected is not None and "at least one op" in rejected.reason


def test_megatron_refuses_a_set_its_modules_cannot_express():
    assert megatron.recompute_modules(RecomputeOps.parse("ln2,up,act", "t")) == ["mlp"]
    assert megatron.recompute_modules(RecomputeOps.parse("scores,ln2,up,act", "t")) == ["core_attn", "mlp"]
    with pytest.raises(SpecError, match="recompute_ops='qkv,act'.*--recompute-modules mlp"):
        megatron.check(make_plan(recompute=Recompute.SET, recompute_ops=RecomputeOps.parse("qkv,act", "t")), LLAMA,
                       Workload(global_batch_size=64, seq_len=4096))


@pytest.mark.parametrize("flags,message", [
    (["--recompute-ops", "qkv,bogus"], "--recompute-ops='bogus' is not allowed; allowed: ln1, qkv"),
    (["--recompute", "set"], "--recompute set needs the ops"),
    (["--recompute", "full", "--recompute-ops", "act"], "applies with --recompute set only"),
])
def test_bad_recompute_ops_are_one_line_and_exit_2(flags, message):
    out = subprocess.run([sys.executable, "-m", "paraplan", "estimate", "--model", "llama3-8b", "--gpus", "8", *flags],
                         capture_output=True, text=True)
    assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_the_cli_and_api_price_a_set_in_the_recomputation_row():
    from paraplan import api
    est = api.estimate("llama3-8b", "dgx-h100", gpus=8, tp=2, recompute_ops="qkv,act")
    assert est.plan.recompute is Recompute.SET and "rc:set(qkv,act)" in est.plan.describe()
    none = api.estimate("llama3-8b", "dgx-h100", gpus=8, tp=2)
    assert est.time.recompute_s > 0.0 == none.time.recompute_s
    assert est.memory.activations_bytes < none.memory.activations_bytes


def test_the_advice_for_a_set_that_does_not_fit_names_full_recomputation():
    from paraplan.search.advice import fitting_changes
    cluster, wl = load_cluster("dgx-h100", num_gpus=8), Workload(global_batch_size=48, seq_len=6144)
    plan = make_plan(dp=8, zero=ZeroStage.OPTIMIZER, recompute=Recompute.SET,
                     recompute_ops=RecomputeOps([RecomputeOp.ACT]))
    assert "--recompute full" in [c.flags for c in fitting_changes(LLAMA, cluster, wl, plan)]
