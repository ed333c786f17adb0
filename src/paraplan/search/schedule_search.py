"""The schedule search (sim/repetend.py; Tessel, Lin et al. HPCA 2024) beside a plan's named
schedule: the fastest order found for the plan's stage costs, its backward split into B and
W, at the plan's own peak in-flight activations on every rank, so that it needs no more
activation memory than the plan's schedule. `paraplan estimate` shows it for pipelined plans
of one chunk per rank whose pipeline was simulated whole.
"""

from __future__ import annotations

from ..cost.estimate import Estimate, stage_costs
from ..cost.evaluate import evaluate
from ..plan.space import PlanBatch
from ..sim.repetend import NAMED_ONE_CHUNK, SearchedSchedule, search_schedule
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload

# pipeline ranks × micro-batches up to which an estimate searches (p = 8, m = 32: ~0.3 s)
SEARCH_RANK_MICROBATCHES = 256


def searched_beside(model: ModelSpec, cluster: ClusterSpec, workload: Workload, est: Estimate) -> SearchedSchedule | None:
    """The searched order at the plan's in-flight activations per rank, or None where the plan
    has no pipeline to search (one stage, several chunks per rank, a schedule with joined tasks,
    a pipeline not simulated whole or longer than SEARCH_RANK_MICROBATCHES)."""
    plan = est.plan
    if (plan.pp == 1 or plan.vp != 1 or plan.schedule not in NAMED_ONE_CHUNK or est.sim is None
            or plan.pp * est.num_microbatches > SEARCH_RANK_MICROBATCHES):
        return None
    costs = evaluate(model, cluster, workload, PlanBatch.from_plans([plan]))
    return search_schedule(stage_costs(costs, plan, split_backward=True), est.num_microbatches,
                           est.sim.peak_inflight)


def searched_step_s(est: Estimate, searched: SearchedSchedule) -> float:
    """The plan's step time with the searched pipeline in place of its schedule's: the step
    less the difference of the two simulated pipelines (the rest of the step is the same), at
    most the plan's bubble (cost/estimate.py takes the bubble from the makespan)."""
    saved_s = min(max(est.sim.step_time_s - searched.step_time_s, 0.0), est.time.bubble_s)
    return est.step_time_s - saved_s


def searched_line(est: Estimate, searched: SearchedSchedule) -> str:
    """One line for `paraplan estimate`: the searched pipeline beside the plan's schedule."""
    from ..units import fmt_time
    named = dict(searched.named)[est.plan.schedule]
    found = str(searched.repetend) if searched.repetend is not None else f"no order faster than {searched.source}"
    caps = "/".join(f"{c:g}" for c in searched.cap_inflight)
    return (f"schedule search (Tessel-style repetends, docs/model/step.md) at this plan's in-flight activations "
            f"per rank ({caps}): {found}; pipeline {fmt_time(searched.step_time_s)} against "
            f"{est.plan.schedule}'s {fmt_time(named)}, step {fmt_time(searched_step_s(est, searched))}")


def searched_dict(est: Estimate, searched: SearchedSchedule) -> dict:
    """The search's result for `paraplan estimate --json`."""
    return {"source": searched.source, "repetend": str(searched.repetend) if searched.repetend else None,
            "cap_inflight": list(searched.cap_inflight), "pipeline_s": searched.step_time_s,
            "named_pipeline_s": {str(s): t for s, t in searched.named},
            "step_time_s": searched_step_s(est, searched)}
