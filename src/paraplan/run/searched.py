"""The order `paraplan run --schedule-search` runs: the schedule search (sim/repetend.py) at
the in-flight activations per rank of the plan's schedule (1F1B: p − r on rank r), under
unit costs, a forward, an input-gradient and a weight-gradient pass of equal time (the cost
model's backward of twice the forward, split in halves) and no send latency. Every worker
searches it again (the search is deterministic), and rank 0's report records it. No torch
is imported here: the launcher checks a plan with it before any process starts.
"""

from __future__ import annotations

from ..errors import SpecError
from ..export.torch_pipeline import action_rows
from ..plan.axes import Schedule
from ..plan.plan import Plan
from ..sim.engine import StageCosts, simulate
from ..sim.repetend import NAMED_ONE_CHUNK, SearchedSchedule, search_schedule
from ..sim.schedules import build_schedule

# the unit costs the run's order is searched under (seconds only in name: their ratio counts)
RUN_FORWARD_S, RUN_BACKWARD_S, RUN_WEIGHT_S = 1.0, 1.0, 1.0


def check_searchable(plan: Plan) -> None:
    """SpecError unless --schedule-search can run the plan (one chunk per rank, a pipeline)."""
    if plan.pp < 2:
        raise SpecError("run", "--schedule-search", True, "needs --pp > 1")
    if plan.vp != 1 or plan.schedule not in NAMED_ONE_CHUNK:
        raise SpecError("run", "--schedule-search", True,
                        "with --vp 1 and --schedule " + ", ".join(map(str, NAMED_ONE_CHUNK))
                        + " (the repetend search runs one chunk per rank)")
    if plan.compiled:  # torch 2.13 _check_torch_compile_compatibility: no compiled stages with split backwards
        raise SpecError("run", "--compile", True, "not with --schedule-search (its backward is split into B and W)")


def run_search(plan: Plan, num_microbatches: int) -> SearchedSchedule:
    """The searched order for the plan's pipeline, capped at its schedule's in-flight activations."""
    p, m = plan.pp, num_microbatches
    costs = StageCosts.uniform(p, 1, RUN_FORWARD_S, RUN_BACKWARD_S, RUN_WEIGHT_S)
    named = costs if plan.schedule is Schedule.ZERO_BUBBLE else costs.fuse_weight()
    cap = simulate(build_schedule(plan.schedule, p, m, 1), named).peak_inflight
    return search_schedule(costs, m, cap)


def run_actions(plan: Plan, num_microbatches: int) -> tuple[tuple[str, ...], ...]:
    """Each pipeline rank's actions (torch's action strings) of the searched order."""
    return action_rows(run_search(plan, num_microbatches).tasks)
