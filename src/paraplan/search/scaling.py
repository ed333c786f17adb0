"""How many GPUs to rent: the best plan at each GPU count of a sweep (strong scaling).

The global batch stays fixed (it is a convergence choice, not a systems one), so each
added GPU takes a smaller share of it: data parallelism runs out at batch / micro-batch
replicas and the search must turn to pipeline and context parallelism, whose bubbles and
exchanges cost throughput per GPU. Each count is searched afresh (search/planner.py);
the budget of every point is priced through interruptions (cost/reliability.py), whose
rate grows with the GPUs, so the fastest count is rarely the cheapest.

Scaling efficiency of a count = its tokens/s/GPU over that of the smallest count with a
plan (1.0: perfectly linear).
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..cost.estimate import Estimate
from ..errors import NoPlanFitsError, SpecError
from ..plan.space import SpaceLimits
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .planner import search


@dataclass(frozen=True, kw_only=True)
class ScalePoint:
    """The best plan at one GPU count, or why there is none."""

    num_gpus: int
    best: Estimate | None
    why_not: str               # "" when there is a plan
    num_candidates: int
    elapsed_s: float
    efficiency: float | None   # tokens/s/GPU over the smallest planned count's (None: no plan)


@dataclass(frozen=True, kw_only=True)
class ScalingResult:
    points: tuple[ScalePoint, ...]

    @property
    def planned(self) -> tuple[ScalePoint, ...]:
        return tuple(p for p in self.points if p.best is not None)

    @property
    def finishing(self) -> tuple[ScalePoint, ...]:
        """Planned counts that finish the budget through interruptions (a finite wall time)."""
        return tuple(p for p in self.planned if math.isfinite(p.best.budget.with_failures.wall_time_s))

    @property
    def fastest(self) -> ScalePoint | None:
        """The count that finishes the token budget soonest, interruptions included."""
        return min(self.finishing, key=lambda p: p.best.budget.with_failures.wall_time_s, default=None)

    @property
    def cheapest(self) -> ScalePoint | None:
        """The count that trains the budget for the fewest GPU-hours, interruptions included."""
        return min(self.finishing, key=lambda p: p.best.budget.with_failures.wall_gpu_hours, default=None)


def scale(model: ModelSpec, clusters: Sequence[ClusterSpec], workload: Workload, *,
          limits: SpaceLimits = SpaceLimits(), fixed: dict | None = None,
          progress: Callable[[int, int, int], None] | None = None,
          choose: Callable[[list], list] | None = None, choose_among: int = 1) -> ScalingResult:
    """Search each cluster (one per GPU count, ascending) for its best plan.

    A count with no valid or fitting plan is a point with its reason; when no count has a
    plan, the error of the largest count is raised (a SpecError when the pins allow no plan
    anywhere, else NoPlanFitsError naming every count).
    `progress(i, n, num_gpus)` is called before each count is searched. `choose(ranked)`, if
    given, keeps the plans an engine can run among the `choose_among` fastest that fit, or
    raises why none.
    """
    points: list[ScalePoint] = []
    pin_errors: list[SpecError] = []
    base = None
    for i, cluster in enumerate(clusters):
        if progress:
            progress(i, len(clusters), cluster.num_gpus)
        t0 = _time.perf_counter()
        try:
            res = search(model, cluster, workload, limits=limits, fixed=fixed, top_k=choose_among)
            ranked = res.ranked if choose is None else choose(res.ranked)
        except (NoPlanFitsError, SpecError) as exc:
            if isinstance(exc, SpecError):
                pin_errors.append(exc)
            points.append(ScalePoint(num_gpus=cluster.num_gpus, best=None, why_not=str(exc), num_candidates=0,
                                     elapsed_s=_time.perf_counter() - t0, efficiency=None))
            continue
        best = ranked[0]
        base = base if base is not None else best.tokens_per_s_per_gpu
        points.append(ScalePoint(num_gpus=cluster.num_gpus, best=best, why_not="", num_candidates=res.num_candidates,
                                 elapsed_s=res.elapsed_s, efficiency=best.tokens_per_s_per_gpu / base))
    if pin_errors and len(pin_errors) == len(points):
        raise pin_errors[0]
    if points and all(p.best is None for p in points):
        counts = ", ".join(f"{p.num_gpus:,}" for p in points)
        raise NoPlanFitsError(f"no plan at any of {counts} GPUs; at {points[-1].num_gpus:,}: {points[-1].why_not}")
    return ScalingResult(points=tuple(points))
