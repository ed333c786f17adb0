"""Search policy beyond ranking one space: a search inside an engine's bounds (specs/engine.py)
that keeps only the plans its exporter accepts, the pins and choices of a user inside those
bounds, and, when nothing fits with the user's pins, the search again without them that says
what would fit.

An engine's exporter check is passed in as a function (`check(plan, model, workload)`, which
raises a SpecError for what the engine cannot express): search/ knows nothing of export/.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from ..errors import NoPlanFitsError, SpecError
from ..plan.plan import Plan
from ..plan.space import SpaceLimits
from ..specs.engine import EngineSupport, unsupported
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from ..units import fmt_bytes, fmt_time
from .planner import PIN_FLAGS, SearchResult

# ranked plans a search inside an engine's bounds keeps for the exporter's own check to pick from
ENGINE_CANDIDATES = 64

PlanCheck = Callable[[Plan, ModelSpec, Workload], None]


@dataclass(frozen=True)
class EngineRules:
    """An engine as a search sees it: its bounds and policy, and its exporter's plan check."""

    support: EngineSupport
    check: PlanCheck


def expressible(ranked: list, model: ModelSpec, workload: Workload, support: EngineSupport,
                check: PlanCheck) -> list:
    """The ranked estimates whose plans pass the exporter's check, in order; none is a
    NoPlanFitsError that says why the fastest was refused."""
    keep, reasons = [], []
    for est in ranked:
        try:
            check(est.plan, model, workload)
        except SpecError as e:
            reasons.append(str(e))
            continue
        keep.append(est)
    if not keep:
        raise NoPlanFitsError(f"none of the {len(ranked)} fastest plans that fit can be expressed in "
                              f"{support.engine}; first reason: {reasons[0] if reasons else 'none'}")
    return keep


def best_exportable(model: ModelSpec, cluster: ClusterSpec, workload: Workload, support: EngineSupport,
                    check: PlanCheck):
    """The fastest plan that fits and that the engine can express: search inside the engine's
    bounds, then the first ranked plan that passes the exporter's own check."""
    fixed, limits = engine_space(support, {}, SpaceLimits())
    return ranked_search(model, cluster, workload, 1, fixed=fixed, limits=limits,
                         engine=EngineRules(support, check))[1][0]


def engine_pin_error(e: SpecError, support: EngineSupport, model: ModelSpec, cluster: ClusterSpec,
                     workload: Workload) -> SpecError:
    """A search's error about a pin that leaves no plan, said as the engine's where the engine
    pinned that axis (a user's pin against the engine's is refused before: engine_space)."""
    pinned = {PIN_FLAGS.get(k, k): k for k in support.pinned}
    if e.where != "search" or e.field not in pinned:
        return e
    return SpecError(f"engine {support.engine}", "model", model.name,
                     f"{support.engine} runs {pinned[e.field]}={e.value} only ({support.pin_reason}): no plan of "
                     f"{model.name} on {cluster.num_gpus} GPUs with global batch {workload.global_batch_size} "
                     "is valid there")


# the user's choices of the plan space an engine's bounds narrow further (SpaceLimits field, flag)
ENGINE_CHOICES = (("cp_comm_types", "--cp-comm"), ("rank_orders", "--rank-order"), ("schedules", "--schedule"),
                  ("zero_stages", "--zero"), ("recomputes", "--recompute"), ("sequence_parallel", "--sp"),
                  ("tp_overlap", "--tp-overlap"), ("attention", "--attention"))
# of those, the ones an engine's own list (in its order) stands for when the user left them open
ENGINE_ORDERED = ("zero_stages", "recomputes", "sequence_parallel", "tp_overlap", "attention")


def engine_space(support: EngineSupport, fixed: dict, limits: SpaceLimits) -> tuple[dict, SpaceLimits]:
    """The search bounds of an engine with the user's pins and choices inside them; a pin
    the engine cannot run is a one-line error."""
    for key, value in support.pinned.items():
        if key in fixed and fixed[key] != value:
            raise unsupported(support.engine, f"--{key}", fixed[key], f"{key}={value} only")
    for key, most in (("cp", support.limits.max_cp), ("vp", support.limits.max_vp), ("ep", support.limits.max_ep)):
        if most and fixed.get(key, 1) > most:  # a bound of 0 is none
            raise unsupported(support.engine, f"--{key}", fixed[key], f"{key} up to {most}")
    bounds, everything = support.search_limits(), SpaceLimits()
    chosen = {}
    for name, flag in ENGINE_CHOICES:
        asked, allowed = getattr(limits, name), getattr(bounds, name)
        if name in ENGINE_ORDERED and asked == getattr(everything, name):
            chosen[name] = allowed  # left open by the user: the engine's (attention: its preference)
            continue
        chosen[name] = tuple(x for x in asked if x in allowed)
        if not chosen[name]:
            raise unsupported(support.engine, flag, ",".join(map(_shown_choice, asked)),
                              ", ".join(map(_shown_choice, allowed)))
    # the user's model choices (token dropping, the gradients' wire format, quantized weights)
    # pass through; the engine's masks judge them
    return {**support.pinned, **fixed}, replace(bounds, capacity_factors=limits.capacity_factors,
                                                grad_compression=limits.grad_compression,
                                                powersgd_rank=limits.powersgd_rank,
                                                low_precision_params=limits.low_precision_params, **chosen)


def _shown_choice(value) -> str:
    """A choice as its flag takes it (True/False for --sp and --tp-overlap as on and off)."""
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def bounded_space(engine: EngineRules | None, fixed: dict, limits: SpaceLimits) -> tuple[dict, SpaceLimits]:
    """The user's pins and limits, inside the engine's bounds when there is one."""
    return (fixed, limits) if engine is None else engine_space(engine.support, fixed, limits)


def ranked_search(model: ModelSpec, cluster: ClusterSpec, workload: Workload, top: int, *, fixed: dict,
                  limits: SpaceLimits, engine: EngineRules | None = None,
                  progress=None, phase=None) -> tuple[SearchResult, list]:
    """(the search, its ranked estimates): with an engine, the ranked plans its exporter
    accepts, from the fastest ENGINE_CANDIDATES (or `top`, if more). `progress` and `phase`
    as search/planner.py search takes them."""
    from .planner import search  # read when called (a test may stand in for it)
    try:
        res = search(model, cluster, workload, limits=limits, fixed=fixed,
                     top_k=top if engine is None else max(top, ENGINE_CANDIDATES), progress=progress, phase=phase)
    except SpecError as e:
        if engine is None:
            raise
        raise engine_pin_error(e, engine.support, model, cluster, workload) from None
    if engine is None:
        return res, res.ranked
    return res, expressible(res.ranked, model, workload, engine.support, engine.check)


def fastest_or_none(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, fixed: dict,
                    limits: SpaceLimits, engine: EngineRules | None = None):
    """The fastest plan that fits (an Estimate), or None when none does."""
    try:
        return ranked_search(model, cluster, workload, 1, fixed=fixed, limits=limits, engine=engine)[1][0]
    except NoPlanFitsError:
        return None


def without_restrictions(limits: SpaceLimits) -> SpaceLimits:
    """`limits` with the user's choices of schedules, CP exchanges and rank orders lifted
    (the capacity factor is kept: token dropping is a training choice)."""
    d = SpaceLimits()
    return replace(limits, schedules=d.schedules, cp_comm_types=d.cp_comm_types, rank_orders=d.rank_orders)


def nothing_fits_with_pins(exc: NoPlanFitsError, model: ModelSpec, cluster: ClusterSpec, workload: Workload, *,
                           pins: str, lifted: str, limits: SpaceLimits, engine: EngineRules | None = None,
                           progress=None, phase=None) -> NoPlanFitsError:
    """The nothing-fits error of a search with pins, saying whether the search without the
    pins (`lifted` names it, `pins` the flags) fits and, if so, its fastest plan."""
    fixed2, limits2 = bounded_space(engine, {}, without_restrictions(limits))
    try:
        best = ranked_search(model, cluster, workload, 1, fixed=fixed2, limits=limits2, engine=engine,
                             progress=progress, phase=phase)[1][0]
    except NoPlanFitsError:
        return NoPlanFitsError(f"{exc}; {lifted} no plan fits either")
    fastest = (f"the fastest is {best.plan.describe()} ({fmt_bytes(best.memory.total)}, "
               f"step {fmt_time(best.step_time_s)})")
    if exc.smallest is None:
        return NoPlanFitsError(f"{exc}; {lifted} plans fit: {fastest}")
    need, plan = exc.smallest
    return NoPlanFitsError(f"no plan with the pins ({pins}) fits in {fmt_bytes(cluster.gpu.hbm_bytes)} per GPU: "
                           f"the smallest needs {fmt_bytes(need)} ({plan.describe()}); {lifted} plans fit: "
                           f"{fastest}")
