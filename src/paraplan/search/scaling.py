"""How many GPUs to rent: the best plan at each GPU count of a sweep (strong scaling).

The global batch stays fixed (it is a convergence choice, not a systems one), so each
added GPU takes a smaller share of it: data parallelism runs out at batch / micro-batch
replicas and the search must turn to pipeline and context parallelism, whose bubbles and
exchanges cost throughput per GPU. Each count is searched afresh (search/planner.py);
the budget of every point is priced through interruptions (cost/reliability.py), whose
rate grows with the GPUs, so the fastest count is rarely the cheapest.

Scaling efficiency of a count = its tokens/s/GPU over that of the smallest count with a
plan on the same cluster (1.0: perfectly linear). Several clusters (GPU types, networks,
prices) can be swept at once: the soonest and the cheapest point are then across them, the
cheapest by dollars (each cluster at its own price per GPU-hour).
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
    cluster_name: str
    gpu_name: str
    usd_per_gpu_hour: float    # the price the point's budget is at (the workload's, else the cluster's)
    best: Estimate | None
    why_not: str               # "" when there is a plan
    num_candidates: int
    elapsed_s: float
    efficiency: float | None   # tokens/s/GPU over the same cluster's smallest planned count's (None: no plan)


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
        """The point that trains the budget for the fewest GPU-hours on one cluster, for the fewest
        dollars across several (each at its price), interruptions included."""
        many = len(self.cluster_names) > 1
        return min(self.finishing, default=None, key=lambda p: (p.best.budget.with_failures.wall_usd if many
                                                                else p.best.budget.with_failures.wall_gpu_hours))

    @property
    def cluster_names(self) -> tuple[str, ...]:
        """The clusters swept, in order, each once."""
        return tuple(dict.fromkeys(p.cluster_name for p in self.points))


def scale(model: ModelSpec, clusters: Sequence[ClusterSpec], workload: Workload, *,
          limits: SpaceLimits = SpaceLimits(), fixed: dict | None = None,
          progress: Callable[[int, int, int], None] | None = None,
          choose: Callable[[list], list] | None = None, choose_among: int = 1) -> ScalingResult:
    """Search each cluster (one per GPU count, ascending within each cluster name) for its best plan.

    A count with no valid or fitting plan is a point with its reason; when no count has a
    plan, the error of the largest count is raised (a SpecError when the pins allow no plan
    anywhere, else NoPlanFitsError naming every count).
    `progress(i, n, num_gpus)` is called before each count is searched. `choose(ranked)`, if
    given, keeps the plans an engine can run among the `choose_among` fastest that fit, or
    raises why none.
    """
    points: list[ScalePoint] = []
    pin_errors: list[SpecError] = []
    base: dict[str, float] = {}  # each cluster's first planned tokens/s/GPU
    for i, cluster in enumerate(clusters):
        where = dict(num_gpus=cluster.num_gpus, cluster_name=cluster.name, gpu_name=cluster.gpu.name,
                     usd_per_gpu_hour=(workload.usd_per_gpu_hour if workload.usd_per_gpu_hour is not None
                                       else cluster.usd_per_gpu_hour))
        if progress:
            progress(i, len(clusters), cluster.num_gpus)
        t0 = _time.perf_counter()
        try:
            res = search(model, cluster, workload, limits=limits, fixed=fixed, top_k=choose_among)
            ranked = res.ranked if choose is None else choose(res.ranked)
        except (NoPlanFitsError, SpecError) as exc:
            if isinstance(exc, SpecError):
                pin_errors.append(exc)
            points.append(ScalePoint(**where, best=None, why_not=str(exc), num_candidates=0,
                                     elapsed_s=_time.perf_counter() - t0, efficiency=None))
            continue
        best = ranked[0]
        first = base.setdefault(cluster.name, best.tokens_per_s_per_gpu)
        points.append(ScalePoint(**where, best=best, why_not="", num_candidates=res.num_candidates,
                                 elapsed_s=res.elapsed_s, efficiency=best.tokens_per_s_per_gpu / first))
    if pin_errors and len(pin_errors) == len(points):
        first = pin_errors[0]
        names = tuple(dict.fromkeys(p.cluster_name for p in points))
        if len(names) > 1:  # the pins fail on every cluster, not only on the first one named
            raise SpecError(f"{first.where} (and on every count of {', '.join(names)})", first.field, first.value,
                            first.allowed)
        raise first
    if points and all(p.best is None for p in points):
        counts = ", ".join(dict.fromkeys(f"{p.num_gpus:,}" for p in points))
        names = tuple(dict.fromkeys(p.cluster_name for p in points))
        on = f" on {', '.join(names)}" if len(names) > 1 else ""
        raise NoPlanFitsError(f"no plan at any of {counts} GPUs{on}; at {points[-1].num_gpus:,}"
                              f"{f' on {points[-1].cluster_name}' if on else ''}: {points[-1].why_not}")
    return ScalingResult(points=tuple(points))
