"""Search plans over a mixed cluster (specs/mixed.py, plan/mixed.py): which groups hold which
pipeline stages, each group's TP degree, and how many layers each stage takes.

GiPH (Hu et al., MLSys 2023) places work on heterogeneous devices by its speed and memory;
paraplan does it by enumeration and a greedy balance, without a learned policy:

1. Shapes: data-parallel degree, micro-batch, recomputation, TP overlap, the order of the
   groups down the pipeline and each group's TP degree; each group then holds as many stages as its
   GPUs allow (dp × TP × stages ≤ its GPUs). Shapes with fewer micro-batches than stages are
   left out (their bubble exceeds the step's work).
2. Layers: every stage starts with one; each further layer goes to the stage whose time
   after taking it is least, among those whose memory still fits. A stage's time and memory
   are affine in its layers and in the micro-batches it holds (cost/mixed.py prices a stage
   as a stage of a homogeneous proxy pipeline), so four vectorized evaluations per group
   give every stage of every shape (`_GroupTable`); tests check the affine table against
   the proxies themselves. (Its exposed reduction after the pipeline is not affine: the
   closed form below takes it from two points.)
3. Rank the shapes by the closed-form 1F1B step ((m − 1)·slowest stage + one pass through
   every stage and hop + the slowest after-pipeline tail), then price the best few exactly
   (cost/mixed.py estimate_mixed: each stage's proxy, the event simulator) and rank those.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, replace
from itertools import permutations

import numpy as np

from ..errors import NoPlanFitsError, ParaplanError
from ..plan.axes import Recompute, Schedule, ZeroStage
from ..plan.mixed import MixedPlan, MixedStage
from ..plan.space import PlanBatch, check_plan, divisors
from ..specs.mixed import GPUGroup, MixedCluster
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from ..cost.mixed import (FIRST, MixedEstimate, boundary_bytes, check_mixed_model, estimate_mixed, price_proxies,
                          proxy_depth, proxy_key, proxy_plan, proxy_stages)
from ..cost.reshard import BoundaryLayout, reshard

TP_DEGREES = (1, 2, 4, 8)
MICRO_BATCHES = (1, 2, 4)
RECOMPUTES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
TP_OVERLAPS = (False, True)
# shapes priced exactly (proxies and the simulator) after the closed-form rank: on
# benchmarks/bench_mixed.py's two cases the exact top 10 (of 200 priced exactly) sat within the
# closed form's first 13, so 24 (or twice --top) leaves room
EXACT_PLANS = 24


@dataclass(frozen=True, kw_only=True)
class MixedSearchResult:
    ranked: tuple[MixedEstimate, ...]
    num_shapes: int     # shapes enumerated
    num_fit: int        # shapes whose layers could all be placed within memory
    elapsed_s: float


@dataclass(frozen=True)
class _Stage:
    """One stage of a shape, affine in its layers n: forward + backward per micro-batch
    fixed_s + n·per_layer_s, memory fixed_bytes + n·per_layer_bytes."""

    group: str
    tp: int
    fixed_s: float
    per_layer_s: float
    fixed_bytes: float
    per_layer_bytes: float
    after_fixed_s: float
    after_per_layer_s: float
    capacity_bytes: float

    def time_s(self, n: int) -> float:
        return self.fixed_s + n * self.per_layer_s

    def memory_bytes(self, n: int) -> float:
        return self.fixed_bytes + n * self.per_layer_bytes

    def fits(self, n: int) -> bool:
        return self.memory_bytes(n) <= self.capacity_bytes

    def after_s(self, n: int) -> float:
        """The reduction and optimizer step after the pipeline: from two points (the exposed
        part of the reduction is not affine; the plans shown are priced exactly)."""
        return max(self.after_fixed_s + n * self.after_per_layer_s, 0.0)


class _GroupTable:
    """A group's stages for every (tp, dp, mb, recomputation, TP overlap) at once: forward + backward
    and bytes, as affine functions of the layers n and the proxy depth d (bytes: bilinear, a
    micro-batch in flight holds n layers' activations), from proxies at n ∈ {1, 2} and
    d ∈ {3, 4} (cost/mixed.py's proxies, evaluated as one batch); the time after the pipeline
    from the same two points of n."""

    def __init__(self, model: ModelSpec, group: GPUGroup, workload: Workload, keys: list[tuple]):
        self.index: dict = {}
        self.stages: dict = {}  # (key, which, depth) -> _Stage, as shapes read them again
        cluster = group.cluster
        plans = []
        for key in keys:
            tp, dp, mb, rc, tpov = key
            proxy = proxy_plan(cluster, tp=tp, depth=3, dp=dp, micro_batch_size=mb, schedule=Schedule.ONE_F_ONE_B,
                               recompute=rc, zero=ZeroStage.OPTIMIZER, sequence_parallel=True, tp_overlap=tpov)
            if check_plan(proxy, replace(model, num_layers=12), cluster.with_num_gpus(tp * 3 * dp), workload) is None:
                self.index[key] = len(plans)
                plans.append(proxy)
        self.capacity_bytes = cluster.gpu.hbm_bytes
        # (layers, depth) -> per plan its (first, last, middle) proxy stages (cost/mixed.py)
        self.values = {(n, d): proxy_stages(replace(model, num_layers=n * d), cluster, workload,
                                            PlanBatch.from_plans([replace(p, pp=d) for p in plans]))
                       for n in (1, 2) for d in (3, 4)} if plans else {}

    def stage(self, key: tuple, which: int, depth: float, group: str) -> _Stage | None:
        """The stage `which` (FIRST, LAST, MIDDLE) of proxies `depth` deep, or None if the
        proxy is not a valid plan."""
        i = self.index.get(key)
        if i is None:
            return None
        if (key, which, depth) not in self.stages:
            # (forward, backward, after, bytes, send, checkpoint) at each (layers, depth)
            v = {nd: rows[i][which] for nd, rows in self.values.items()}
            t = [v[n, 3][0] + v[n, 3][1] for n in (1, 2)]
            after = [v[n, 3][2] for n in (1, 2)]
            at_depth = [v[n, 3][3] + (depth - 3.0) * (v[n, 4][3] - v[n, 3][3]) for n in (1, 2)]
            self.stages[key, which, depth] = _Stage(
                group=group, tp=key[0], fixed_s=2 * t[0] - t[1], per_layer_s=t[1] - t[0],
                fixed_bytes=2 * at_depth[0] - at_depth[1], per_layer_bytes=at_depth[1] - at_depth[0],
                after_fixed_s=2 * after[0] - after[1], after_per_layer_s=after[1] - after[0],
                capacity_bytes=self.capacity_bytes)
        return self.stages[key, which, depth]

    def send_s(self, key: tuple) -> float:
        return self.values[1, 3][self.index[key]][FIRST][4]


def _balanced_layers(stages: list[_Stage], num_layers: int) -> list[int] | None:
    """Layers per stage: one each, then each further layer to the stage least slowed that
    still fits; None when some layer fits nowhere."""
    if len(stages) > num_layers or not all(s.fits(1) for s in stages):
        return None
    layers = [1] * len(stages)
    heap = [(s.time_s(2), i) for i, s in enumerate(stages) if s.fits(2)]
    heapq.heapify(heap)
    for _ in range(num_layers - len(stages)):
        if not heap:
            return None
        _, i = heapq.heappop(heap)
        layers[i] += 1
        if stages[i].fits(layers[i] + 1):
            heapq.heappush(heap, (stages[i].time_s(layers[i] + 1), i))
    return layers


def _inflight_depth(place: int, num_stages: int, m: int) -> tuple[int, float]:
    """(which proxy stage, proxy depth) for `place` under 1F1B (cost/mixed.py proxy_depth),
    the depth held to the m micro-batches there are: a first stage holds min(depth, m), a middle
    one min(depth − 1, m) (the last, one at any depth)."""
    depth, which = proxy_depth(place, num_stages)
    return which, float(min(depth, m if which == FIRST else m + 1))


def _shape_stages(tables: dict, order: tuple[GPUGroup, ...], tps: tuple[int, ...], counts: tuple[int, ...],
                  dp: int, mb: int, rc: Recompute, tpov: bool, m: int) -> list[_Stage] | None:
    places = [(g, tp) for g, tp, c in zip(order, tps, counts) for _ in range(c)]
    stages = []
    for place, (group, tp) in enumerate(places):
        which, depth = _inflight_depth(place, len(places), m)
        s = tables[group.name].stage((tp, dp, mb, rc, tpov), which, depth, group.name)
        if s is None:
            return None
        stages.append(s)
    return stages


def _closed_form_s(model: ModelSpec, mixed: MixedCluster, workload: Workload, tables: dict, stages: list[_Stage],
                   layers: list[int], key: tuple, m: int) -> float:
    """1F1B's step from per-stage times: (m − 1)·slowest + a pass through all stages and
    hops + the slowest after-pipeline tail (Narayanan et al. SC'21 Sec. 2.2.1, uneven stages)."""
    times = [s.time_s(n) for s, n in zip(stages, layers)]
    dp, mb, rc, tpov = key
    x = boundary_bytes(model, workload, mb)
    hops = 0.0
    for a, b in zip(stages, stages[1:]):
        if a.group == b.group and a.tp == b.tp:
            hops += tables[a.group].send_s((a.tp, dp, mb, rc, tpov))
        else:
            link = mixed.between_groups if a.group != b.group else mixed.group(b.group).cluster.scaleout
            hops += reshard(link, mixed.group(b.group).cluster, BoundaryLayout(a.tp, a.tp > 1),
                            BoundaryLayout(b.tp, b.tp > 1), x).seconds
    tail = max(s.after_s(n) for s, n in zip(stages, layers))
    return (m - 1) * max(times) + sum(times) + 2.0 * hops + tail


def _shapes(model: ModelSpec, mixed: MixedCluster, workload: Workload):
    """Every (order, tps, stage counts, dp, mb, recomputation, TP overlap, m) whose groups each
    hold a stage."""
    gb = workload.global_batch_size
    for dp in divisors(gb):
        if dp > max(g.num_gpus for g in mixed.groups):
            break  # (every group holds a stage of dp × TP GPUs)
        for mb in MICRO_BATCHES:
            if gb % (dp * mb):
                continue
            m = gb // (dp * mb)
            for order in permutations(mixed.groups):
                for tps in np.ndindex(*(len(TP_DEGREES),) * len(order)):
                    tp = tuple(TP_DEGREES[i] for i in tps)
                    counts = tuple(g.num_gpus // (dp * t) for g, t in zip(order, tp))
                    if (min(counts) < 1 or sum(counts) > model.num_layers or sum(counts) > m
                            or any(t > g.cluster.gpus_per_node for g, t in zip(order, tp))):
                        continue
                    for rc in RECOMPUTES:
                        for tpov in TP_OVERLAPS:
                            yield order, tp, counts, dp, mb, rc, tpov, m


def search_mixed(model: ModelSpec, mixed: MixedCluster, workload: Workload, *, top_k: int = 10) -> MixedSearchResult:
    """Rank mixed plans by simulated step time (NoPlanFitsError if none fits)."""
    t0 = time.perf_counter()
    check_mixed_model(model)
    shapes = list(_shapes(model, mixed, workload))
    if not shapes:
        raise NoPlanFitsError(f"no pipeline over {mixed.name}: with every group holding a stage of DP × TP GPUs, "
                              f"the global batch of {workload.global_batch_size} gives fewer micro-batches than "
                              f"stages (or the {model.num_layers} layers fewer than stages) in every shape; try a "
                              "larger global batch")
    keys = {g.name: sorted({(tp, dp, mb, rc, tpov) for order, tps, _, dp, mb, rc, tpov, _ in shapes
                            for g2, tp in zip(order, tps) if g2.name == g.name}, key=str) for g in mixed.groups}
    tables = {g.name: _GroupTable(model, g, workload, keys[g.name]) for g in mixed.groups}
    scored = []
    for order, tps, counts, dp, mb, rc, tpov, m in shapes:
        if tpov and max(tps) == 1:
            continue  # (no TP to overlap: the same plan as without)
        stages = _shape_stages(tables, order, tps, counts, dp, mb, rc, tpov, m)
        layers = None if stages is None else _balanced_layers(stages, model.num_layers)
        if layers is None:
            continue
        plan = MixedPlan(dp=dp, micro_batch_size=mb, recompute=rc, tp_overlap=tpov, stages=tuple(
            MixedStage(group=s.group, tp=s.tp, layers=n) for s, n in zip(stages, layers)))
        scored.append((_closed_form_s(model, mixed, workload, tables, stages, layers, (dp, mb, rc, tpov), m), plan))
    if not scored:
        raise NoPlanFitsError(f"no plan over {mixed.name} fits: every shape of {len(shapes)} leaves a stage over its "
                              f"GPU's memory; try a larger global batch, fewer layers or more GPUs")
    scored.sort(key=lambda x: x[0])
    finalists = [plan for _, plan in scored[:max(EXACT_PLANS, 2 * top_k)]]
    cache = price_proxies(model, mixed, workload, [proxy_key(p, place) for p in finalists for place in range(p.pp)])
    ranked = []
    for plan in finalists:
        try:
            est = estimate_mixed(model, mixed, workload, plan, cache)
        except ParaplanError:
            continue
        if est.fits:
            ranked.append(est)
    if not ranked:
        raise NoPlanFitsError(f"no plan over {mixed.name} fits: the {len(scored)} shapes whose layers fit by the "
                              f"search's table do not once priced stage by stage; try a larger global batch or "
                              "more GPUs")
    ranked.sort(key=lambda e: e.step_time_s)
    return MixedSearchResult(ranked=tuple(ranked[:top_k]), num_shapes=len(shapes), num_fit=len(scored),
                             elapsed_s=time.perf_counter() - t0)
