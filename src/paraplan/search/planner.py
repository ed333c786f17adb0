"""Rank every valid plan that fits: vectorized closed-form pass over the whole space, then
the event simulator re-times the best candidates (the closed form is a tight estimate of
the simulated pipeline, so the top of the ranking is stable; see docs/model.md)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time as _time
from collections import deque
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, fields, replace
from functools import partial
from itertools import groupby
from typing import Callable, NoReturn

import numpy as np

from ..cost.estimate import Estimate, finish_all, with_replayed_allocator
from ..cost.evaluate import evaluate, plan_memory_total, plan_time, stage_floor_s, step_floor_s
from ..cost.layout import layout
from ..cost.optimizer import optimizer_step_s
from ..cost.memory import fits as plan_fits
from ..cost.recompute_set import with_searched_sets
from ..argtypes import MAX_DEGREE
from ..errors import NoPlanFitsError, ParaplanError, SpecError
from ..plan.axes import CPCommType, Recompute, ZeroStage
from ..plan.space import (PlanBatch, SpaceLimits, capacity_factor_ok, capacity_factor_rule, check_plan, ZERO_AXIS,
                          enumerate_space, flatten, grid_plans, space_blocks)
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from ..units import fmt_bytes

CHUNK = 200_000  # plans per vectorized evaluation (bounds peak memory of the search, per worker)
SIMULATED_PLANS = 64  # the closed form's fastest plans the event simulator re-times (docs/model.md, Search)
MAX_WORKERS = 8  # slices priced at once (each holds up to CHUNK plans' arrays)
FLOOR_SLACK = 1e-9  # a step floor above the bar by more than this share rules its plan out (_Bar)


def search_workers() -> int:
    """Workers that price slices of the space at once: this process's CPUs (within a
    container's quota, at most MAX_WORKERS), or PARAPLAN_WORKERS."""
    # PARAPLAN_THREADS: its name before the workers could be processes
    name, env = next(((n, os.environ[n].strip()) for n in ("PARAPLAN_WORKERS", "PARAPLAN_THREADS")
                      if os.environ.get(n, "").strip()), (None, ""))
    if name:
        try:
            n = int(env)
        except ValueError:
            raise SpecError("environment", name, env, f"an integer from 1 to {MAX_WORKERS}") from None
        if not 1 <= n <= MAX_WORKERS:
            raise SpecError("environment", name, env, f"an integer from 1 to {MAX_WORKERS}")
        return n
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_WORKERS, cpus, _cgroup_cpus()))


def _cgroup_cpus() -> int:
    """The CPUs a container's quota allows (cgroup v2 cpu.max 'quota period', rounded up);
    MAX_WORKERS where there is none or it cannot be read."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return MAX_WORKERS if quota == "max" else max(1, -(-int(quota) // int(period)))
    except (OSError, ValueError):
        return MAX_WORKERS


@dataclass(kw_only=True)
class _Slice:
    """What one slice of the space leaves for the ranking."""

    candidates: int
    valid: int
    fit: int = 0
    device_fit: int = 0
    smallest: tuple | None = None   # (bytes, plan) of its smallest-memory valid plan
    kept: PlanBatch | None = None   # its fastest plans and their closed-form step times
    kept_times: np.ndarray | None = None


class _Bar:
    """The n-th fastest closed-form step time seen so far in a search (inf until n are seen),
    shared by the threads pricing its slices (a worker process keeps its own copy and is told
    the search's, lower_to): a plan whose step floor (evaluate.step_floor_s) is above it
    cannot be among the n fastest, so it is not timed in full. The bar only falls, and any n
    plans' times bound the n-th fastest of the whole space from above, so the plans ranked do
    not depend on when each slice read it."""

    def __init__(self, n: int):
        self.n = n
        self._fastest = np.empty(0)
        self._elsewhere_s = float("inf")  # the lowest bar another copy of this one told it
        self._lock = threading.Lock()

    @property
    def seconds(self) -> float:
        fastest = self._fastest
        own = float(fastest[-1]) if self.n > 0 and len(fastest) >= self.n else float("inf")
        return min(own, self._elsewhere_s)

    def offer(self, times: np.ndarray) -> None:
        """Lower the bar by these plans' step times (plans not offered to it before)."""
        with self._lock:
            self._fastest = np.sort(np.concatenate([self._fastest, times]))[:self.n]

    def lower_to(self, seconds: float) -> None:
        """Lower the bar to another copy's (each bounds the n-th fastest, so the lower does;
        their plans may overlap, so they are not offered)."""
        self._elsewhere_s = min(self._elsewhere_s, seconds)

    def hopeful(self, floor: np.ndarray) -> np.ndarray:
        """Plans whose floor does not rule them out (FLOOR_SLACK, relative, for the rounding
        of the floor's and the step's sums)."""
        return ~(floor > self.seconds * (1.0 + FLOOR_SLACK))


def _slices(blocks, size: int) -> list[list]:
    """The space's parts in enumeration order, grouped into runs of about `size` candidates."""
    out, cur, n = [], [], 0
    for part in (part for block in blocks for part in block.parts(size)):
        if cur and n + part.num_candidates > size:
            out.append(cur)
            cur, n = [], 0
        cur.append(part)
        n += part.num_candidates
    if cur:
        out.append(cur)
    return out


def _priced_in_order(price, items: list, bar: _Bar):
    """price over the slices, results in their order: where there is more than one slice
    and one CPU, in worker processes where the platform forks them (Linux), else on threads
    (numpy releases the interpreter in its array work, but an MoE grid's arrays are small
    enough that two threads mostly wait for each other: docs/model/search.md)."""
    workers = min(search_workers(), len(items))
    if workers <= 1:
        yield from map(price, items)
    elif _forks_workers():
        yield from _on_processes(price, items, bar, workers)
    else:
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="paraplan-search")
        yield from _in_order(pool, lambda i: pool.submit(price, items[i]), len(items), 2 * workers)


_FORK = multiprocessing.get_context("fork") if sys.platform == "linux" else None


def _forks_workers() -> bool:
    """Whether the workers can be forked processes: on Linux, from a process that is no
    pool's worker (a daemon process has no children) and runs no other thread (a fork
    copies only the thread that forks: another's locks would stay held in the child)."""
    return _FORK is not None and not multiprocessing.current_process().daemon and threading.active_count() == 1


def _in_order(pool, submit: Callable, count: int, queued: int):
    """submit(i)'s results for i in range(count), in order, at most `queued` submitted and not
    yet taken (a queued slice holds only its rows: about workers × CHUNK plans materialized at
    once); the pool shut down after, or on an error or Ctrl-C (the slices not started dropped)."""
    pending: deque = deque()
    try:
        for i in range(count):
            pending.append(submit(i))
            if len(pending) >= queued:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _on_processes(price, items: list, bar: _Bar, workers: int):
    """The slices priced by forked worker processes: each inherits the pricing and the slices
    (only a slice's index and the bar go out, only its result comes back), keeps its own copy
    of the bar and is told the search's before each slice."""
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=_FORK, initializer=_start_worker,
                               initargs=(price, items, bar))
    try:
        for res in _in_order(pool, lambda i: pool.submit(_price_in_worker, i, bar.seconds), len(items), 2 * workers):
            if res.kept_times is not None:
                bar.offer(res.kept_times)
            yield res
    except BrokenProcessPool:
        raise ParaplanError("a search worker process died (killed, or out of host memory); PARAPLAN_WORKERS=1 "
                            "prices the search in this process, with less memory at once") from None


_WORKER: tuple = ()  # in a worker process: (price, slices, bar), inherited at its fork


def _start_worker(price, items: list, bar: _Bar) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the search's to handle, in its process
    _WORKER = (price, items, bar)


def _price_in_worker(index: int, bar_seconds: float) -> _Slice:
    price, items, bar = _WORKER
    bar.lower_to(bar_seconds)
    return price(items[index])


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    ranked: tuple[Estimate, ...]
    num_candidates: int      # plans enumerated (valid + rejected)
    num_valid: int
    num_fit: int
    elapsed_s: float
    rejected_examples: tuple[str, ...] = field(default=())

    @property
    def plans_per_s(self) -> float:
        return self.num_candidates / max(self.elapsed_s, 1e-9)


def _check_capacity_factors(model: ModelSpec, limits: SpaceLimits) -> None:
    """Capacity factors apply to MoE models only, and each must let a token reach an expert."""
    if not model.is_moe and any(cf is not None for cf in limits.capacity_factors):
        raise SpecError("search", "--capacity-factor", next(cf for cf in limits.capacity_factors if cf is not None),
                        f"applies to mixture-of-experts models only; {model.name} is dense")
    bad = [cf for cf in limits.capacity_factors if cf is not None and not capacity_factor_ok(model, cf)]
    if bad:  # else every plan is rejected and the "no valid plan" message blames the batch
        raise SpecError("search", "--capacity-factor", bad[0], capacity_factor_rule(model, bad[0]))


def _price_part(model: ModelSpec, cluster: ClusterSpec, workload: Workload, resimulate: int, require_fit: bool,
                bar: _Bar, part) -> _Slice:
    """Price one part of a block on its grid (SpaceBlock.grid: each cost term at the size of
    the axes it reads), then flatten: the memory and, for the plans that fit and the bar
    does not rule out, the time of its valid plans; keep its `resimulate` fastest, ties in
    enumeration order."""
    grid = part.grid()
    bad = part.invalid(model, cluster, workload, grid)
    out = _Slice(candidates=part.num_candidates, valid=int(bad.size - bad.sum()))
    if not out.valid:
        return out
    # invalid plans are priced too (and dropped): the arithmetic may divide by their zeros
    with np.errstate(all="ignore"):
        total, host_bytes = plan_memory_total(model, cluster, workload, grid)
        total = np.asarray(total, dtype=float)
        mem_total = part.flat(total)
        fits = part.flat(plan_fits(cluster, total, host_bytes)) & ~bad
    out.fit = int(fits.sum())
    out.device_fit = int(((mem_total <= cluster.gpu.hbm_bytes) & ~bad).sum())
    valid = np.flatnonzero(~bad)
    i_min = valid[np.argmin(mem_total[valid])]
    out.smallest = (float(mem_total[i_min]), grid_plans(grid, part.shape, np.array([i_min])).plan(0))
    timed = (fits if require_fit else ~bad).reshape(part.shape, order="F")
    if not timed.any():
        return out
    sub, sub_timed = _sub_grid_of(grid, timed)
    if np.isfinite(bar.seconds):
        sub, sub_timed = _hopeful(model, cluster, workload, part, bar, sub, sub_timed)
        if not sub_timed.any():
            return out
    with np.errstate(all="ignore"):
        step = plan_time(model, cluster, workload, sub).total
    shape = sub_timed.shape
    chosen = np.flatnonzero(flatten(sub_timed, shape))
    times = flatten(np.asarray(step, dtype=float), shape)[chosen]
    idx = _fastest_first(times, resimulate)
    out.kept, out.kept_times = grid_plans(sub, shape, chosen[idx]), times[idx]
    bar.offer(out.kept_times)
    return out


def _hopeful(model: ModelSpec, cluster: ClusterSpec, workload: Workload, part, bar: _Bar, sub: PlanBatch,
             wanted: np.ndarray) -> tuple[PlanBatch, np.ndarray]:
    """The sub-grid of the wanted plans the bar does not rule out: first (where the part has a
    ZeRO axis) by a floor under all the ZeRO choices of a plan, then by each remaining plan's
    own floor."""
    with np.errstate(all="ignore"):
        floor = floor_under_zero_choices(model, cluster, workload, part, sub, wanted.shape)
        if floor is not None:
            sub, wanted = _sub_grid_of(sub, wanted & bar.hopeful(floor))
            if not wanted.any():
                return sub, wanted
        floor = np.broadcast_to(step_floor_s(model, cluster, workload, sub), wanted.shape)
    return _sub_grid_of(sub, wanted & bar.hopeful(floor))


def floor_under_zero_choices(model: ModelSpec, cluster: ClusterSpec, workload: Workload, part, grid: PlanBatch,
                             shape: tuple) -> np.ndarray | None:
    """Under the step floor (evaluate.step_floor_s) of each plan of `grid` (the part's, or a
    sub-grid of it, of `shape`), priced once for all its ZeRO choices: the stage floor of the
    plan without ZeRO (evaluate.stage_floor_s) and the fastest optimizer step of its choices.
    None where the part has no ZeRO axis or the plan without ZeRO is no floor
    (SpaceBlock.without_zero)."""
    unsharded = part.without_zero(grid)
    if unsharded is None:
        return None
    optimizer = np.broadcast_to(optimizer_step_s(cluster.gpu, workload, layout(model, workload, grid)), shape)
    return np.broadcast_to(stage_floor_s(model, cluster, workload, unsharded)
                           + optimizer.min(axis=ZERO_AXIS, keepdims=True), shape)


def _sub_grid_of(grid: PlanBatch, wanted: np.ndarray) -> tuple[PlanBatch, np.ndarray]:
    """The grid on the indices of each of its axes (SpaceBlock.grid: micro-batch sizes, expert
    layouts, ZeRO choices, rows) that hold a wanted plan, and which of its plans are wanted."""
    axes = range(wanted.ndim)
    keep = tuple(np.flatnonzero(wanted.any(axis=tuple(a for a in axes if a != axis))) for axis in axes)
    return _sub_grid(grid, keep), wanted[np.ix_(*keep)]


def _sub_grid(grid: PlanBatch, keep: tuple) -> PlanBatch:
    """The grid on the kept indices of each of its axes (a column of length 1 on an axis is the
    same for every index)."""
    def pick(col):
        for axis, index in enumerate(keep):
            if col.shape[axis] > 1:
                col = np.take(col, index, axis=axis)
        return col
    return PlanBatch(**{f.name: pick(getattr(grid, f.name)) for f in fields(PlanBatch)})


def _merge(into: _Slice, res: _Slice) -> None:
    """Add a later part's (or slice's) counts and smallest plan to `into` (the first smallest
    wins a tie, as in enumeration order)."""
    into.candidates += res.candidates
    into.valid += res.valid
    into.fit += res.fit
    into.device_fit += res.device_fit
    if res.smallest is not None and (into.smallest is None or res.smallest[0] < into.smallest[0]):
        into.smallest = res.smallest


def _price_columns(model: ModelSpec, cluster: ClusterSpec, workload: Workload, resimulate: int, require_fit: bool,
                   bar: _Bar, parts) -> _Slice:
    """Materialize parts as columns and price them in one batch: the memory of their valid
    plans and the time of those that fit and the bar does not rule out; keep the
    `resimulate` fastest, ties in enumeration order."""
    batches = [b for b in (part.materialize(model, cluster, workload)[0] for part in parts) if len(b)]
    out = _Slice(candidates=sum(p.num_candidates for p in parts), valid=sum(len(b) for b in batches))
    if not batches:
        return out
    batch = PlanBatch.concat(batches)
    # memory first (a fraction of the cost): only the plans that fit are timed
    mem_total, host_bytes = plan_memory_total(model, cluster, workload, batch)
    mem_total = np.asarray(mem_total)
    fits = plan_fits(cluster, mem_total, host_bytes)
    out.fit = int(fits.sum())
    out.device_fit = int((mem_total <= cluster.gpu.hbm_bytes).sum())
    if not require_fit:
        fits = np.ones_like(fits)
    i_min = int(np.argmin(mem_total))
    out.smallest = (float(mem_total[i_min]), batch.plan(i_min))
    if Recompute.NONE in parts[0].limits.recomputes:
        fits = fits & ~_set_with_a_fitting_twin(model, cluster, workload, batch, fits)
    if not fits.any():
        return out
    sub = batch if fits.all() else batch.take(np.flatnonzero(fits))
    if np.isfinite(bar.seconds):
        hopeful = bar.hopeful(np.broadcast_to(step_floor_s(model, cluster, workload, sub), (len(sub),)))
        if not hopeful.any():
            return out
        sub = sub if hopeful.all() else sub.take(np.flatnonzero(hopeful))
    step = np.asarray(plan_time(model, cluster, workload, sub).total)
    idx = _fastest_first(step, resimulate)
    out.kept, out.kept_times = sub.take(idx), step[idx]
    bar.offer(out.kept_times)
    return out


def _set_with_a_fitting_twin(model: ModelSpec, cluster: ClusterSpec, workload: Workload, batch: PlanBatch,
                             fits: np.ndarray) -> np.ndarray:
    """The plans under a searched recomputation set (Recompute.SET) whose twin without
    recomputation fits too: the twin, in the space beside it, is at least as fast (a set only
    re-runs work), so they need no timing; a set earns its place only where the layout does
    not fit without one."""
    candidates = np.flatnonzero(fits & (np.asarray(batch.recompute_code) == Recompute.SET.code))
    out = np.zeros(len(batch), dtype=bool)
    if len(candidates):
        twins = batch.take(candidates)
        twins = replace(twins, recompute_code=np.full(len(twins), Recompute.NONE.code),
                        recompute_ops_code=np.zeros(len(twins), dtype=np.asarray(twins.recompute_ops_code).dtype))
        total, host_bytes = plan_memory_total(model, cluster, workload, twins)
        out[candidates] = plan_fits(cluster, np.asarray(total), host_bytes)
    return out


def _fastest(results: list[_Slice], n: int) -> tuple[PlanBatch | None, np.ndarray | None]:
    """The n fastest of the plans `results` kept, with their times; ties in the results' order
    (a stable sort: results in enumeration order keep the ranking independent of the slicing)."""
    kept = [r for r in results if r.kept is not None]
    if not kept:
        return None, None
    times = np.concatenate([r.kept_times for r in kept])
    idx = _fastest_first(times, n)
    return PlanBatch.concat([r.kept for r in kept]).take(idx), times[idx]


def _fastest_first(times: np.ndarray, n: int) -> np.ndarray:
    """Indices of the n smallest `times`, fastest first, ties in index order (a stable sort:
    the order plans were enumerated in)."""
    return np.argsort(times, kind="stable")[:n]


def _on_grid(part) -> bool:
    """Whether a part is priced on its grid: where it offers several expert layouts (an MoE
    model's EP × ETP × all-to-all choices), whose costs the grid computes once per layout
    rather than once per plan; a dense part is priced as columns with its neighbours, in
    fewer and larger array operations."""
    return len(part.experts["ep"]) > 1


def _price_slice(model: ModelSpec, cluster: ClusterSpec, workload: Workload, resimulate: int, require_fit: bool,
                 bar: _Bar, parts) -> _Slice:
    """Price a slice of the space, its parts in order: each MoE part on its grid, each run of
    dense parts as one batch of columns. Keep the slice's `resimulate` fastest, ties in
    enumeration order (stable sorts over results kept in enumeration order, so the kept plans
    do not depend on how the space is sliced or priced)."""
    price = partial(_price_part, model, cluster, workload, resimulate, require_fit, bar)
    results = []
    for on_grid, run in groupby(parts, key=_on_grid):
        run = list(run)
        results += map(price, run) if on_grid else [_price_columns(model, cluster, workload, resimulate,
                                                                    require_fit, bar, run)]
    out = _Slice(candidates=0, valid=0)
    for res in results:
        _merge(out, res)
    out.kept, out.kept_times = _fastest(results, resimulate)
    return out


def _raise_nothing_fits(model: ModelSpec, cluster: ClusterSpec, workload: Workload, limits: SpaceLimits,
                        fixed: dict | None, n_valid: int, n_device_fit: int, best_mem) -> NoReturn:
    """Why no plan is ranked: pins that rule every plan out, host DRAM for offload, or memory."""
    if n_valid == 0 and fixed:
        _explain_pins(model, cluster, workload, limits, fixed)
    if n_valid and n_device_fit:
        raise NoPlanFitsError(
            f"every plan that fits in {fmt_bytes(cluster.gpu.hbm_bytes)} per GPU offloads more optimizer state or activations "
            f"than the GPU's {fmt_bytes(cluster.host_memory_bytes_per_gpu)} share of host DRAM; try more GPUs "
            "(a smaller shard per GPU)"
            + ("" if ZeroStage.PARAMETERS in limits.zero_stages and Recompute.FULL in limits.recomputes
               else ", or allow ZeRO-3 and full recomputation instead of offload"))
    raise NoPlanFitsError(_nothing_fits(model, cluster, workload, n_valid, best_mem, limits, fixed),
                          smallest=best_mem if n_valid else None)


def search(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, limits: SpaceLimits = SpaceLimits(),
           fixed: dict | None = None, top_k: int = 10, resimulate: int = SIMULATED_PLANS, progress=None,
           require_fit: bool = True, phase: Callable[[str, int], None] | None = None) -> SearchResult:
    """Rank plans by simulated step time; `progress(done, total)` (candidate plans) is called
    per slice of the space, and `phase(name, count)` as each phase starts: ("search", candidate
    plans), then ("simulate", plans re-timed by the event simulator).

    `require_fit=False` ranks plans that exceed HBM too (to report their memory).

    Whether a plan fits is the replayed allocator's (cost/lifetimes.py), which runs on the plans
    shown: the vectorized screen over the whole space counts the live tensors and the runtime
    only, a bound no fitting plan exceeds. Where none of the plans it keeps fits once replayed,
    the space is screened again with the GPU's `allocator_fragmentation` share of slack."""
    kw = dict(limits=limits, fixed=fixed, top_k=top_k, resimulate=resimulate, progress=progress,
              require_fit=require_fit, phase=phase)
    screened = replace(cluster, gpu=replace(cluster.gpu, allocator_fragmentation=0.0))
    result = _search(model, screened, workload, **kw)
    if not require_fit or any(e.fits for e in result.ranked) or not cluster.gpu.allocator_fragmentation:
        return result
    return _search(model, cluster, workload, **kw)


def _search(model: ModelSpec, cluster: ClusterSpec, workload: Workload, *, limits: SpaceLimits,
            fixed: dict | None, top_k: int, resimulate: int, progress, require_fit: bool,
            phase: Callable[[str, int], None] | None) -> SearchResult:
    """search() with `cluster`'s GPU share of allocator slack in the screen."""
    t0 = _time.perf_counter()
    # every plan shown is simulated, from twice as many as are asked for: those the replayed
    # allocator puts over the memory are passed over (_replayed)
    resimulate = max(resimulate, 2 * top_k)
    _check_capacity_factors(model, limits)
    limits = with_searched_sets(model, cluster, workload, limits)  # (Recompute.SET's frontier)
    # the counts, and the smallest-memory valid plan to explain a "nothing fits"
    seen = _Slice(candidates=0, valid=0)
    slices = []  # each slice's kept plans (its counts are merged into `seen`)
    # the layouts first (cheap), each expanded into plans only when its slice's turn comes, so
    # that at most about one chunk of plans per thread is held at once
    blocks = space_blocks(model, cluster, workload, limits, fixed)
    total = sum(b.num_candidates for b in blocks) or 1
    done = 0
    if phase:
        phase("search", total)

    bar = _Bar(resimulate)
    run = partial(_price_slice, model, cluster, workload, resimulate, require_fit, bar)
    # slices of consecutive parts, about CHUNK candidates each, priced by workers and merged
    # in enumeration order
    for res in _priced_in_order(run, _slices(blocks, CHUNK), bar):
        _merge(seen, res)
        slices.append(res)
        done += res.candidates
        if progress:
            progress(done, total)
    best, _ = _fastest(slices, resimulate)
    if best is None:
        _raise_nothing_fits(model, cluster, workload, limits, fixed, seen.valid, seen.device_fit, seen.smallest)
    if phase:
        phase("simulate", len(best))
    ests = finished(model, cluster, workload, best)
    ests.sort(key=lambda e: e.step_time_s)
    return SearchResult(ranked=_replayed(model, cluster, workload, ests, top_k, require_fit),
                        num_candidates=seen.candidates, num_valid=seen.valid, num_fit=seen.fit,
                        elapsed_s=_time.perf_counter() - t0)


def _replayed(model: ModelSpec, cluster: ClusterSpec, workload: Workload, ests: list[Estimate], top_k: int,
              require_fit: bool) -> tuple[Estimate, ...]:
    """The fastest `top_k` of `ests` with their fragmentation from the replayed allocator
    (with_replayed_allocator; the screen priced the GPU's share), skipping, where plans must
    fit, those the replay puts over the GPU's memory; if it puts every one over, the fastest
    `top_k` as they are, marked as not fitting."""
    replayed, shown = [], []
    for est in ests:
        replayed.append(with_replayed_allocator(model, cluster, workload, est))
        if replayed[-1].fits or not require_fit:
            shown.append(replayed[-1])
        if len(shown) == top_k:
            break
    return tuple(shown or replayed[:top_k])


def finished(model: ModelSpec, cluster: ClusterSpec, workload: Workload, batch: PlanBatch) -> list[Estimate]:
    """Every plan of `batch` priced, its pipeline simulated, in the batch's order."""
    costs = evaluate(model, cluster, workload, batch)
    return finish_all(model, cluster, workload, [batch.plan(i) for i in range(len(batch))],
                      [_slice_costs(costs, i) for i in range(len(batch))])


def _slice_costs(costs, i):
    """Re-evaluate is cheap, but slicing keeps one code path: evaluate once, pick plan i."""
    from dataclasses import fields, is_dataclass, replace

    def pick(x):
        if is_dataclass(x):
            return replace(x, **{f.name: pick(getattr(x, f.name)) for f in fields(x)})
        if isinstance(x, dict):
            return {k: pick(v) for k, v in x.items()}
        a = np.asarray(x)
        return a if a.ndim == 0 else a[i:i + 1]
    return pick(costs)


PIN_FLAGS = {"tp": "--tp", "pp": "--pp", "dp": "--dp", "cp": "--cp", "ep": "--ep", "etp": "--etp", "vp": "--vp",
             "micro_batch_size": "--mb"}


def _explain_pins(model, cluster, workload, limits, fixed) -> None:
    """No valid plan with these pins: name the pin that rules out every plan, with the values
    that axis can take once the pin is lifted (a SpecError, one line)."""
    if set(limits.cp_comm_types) != set(CPCommType):
        # a restricted CP exchange (--cp-comm) that the pins leave no plan for: say its rule
        for batch, _ in enumerate_space(model, cluster, workload, replace(limits, cp_comm_types=tuple(CPCommType)),
                                        fixed):
            if len(batch):
                base = batch.plan(0)
                wanted = ", ".join(map(str, limits.cp_comm_types))
                rej = [check_plan(replace(base, cp_comm_type=k), model, cluster, workload) for k in limits.cp_comm_types]
                reason = next((r.reason for r in rej if r is not None), "")
                raise SpecError("search", "--cp-comm", wanted, f"no valid plan with the pins uses it: {reason}")
    for key, value in fixed.items():
        rest = {k: v for k, v in fixed.items() if k != key}
        seen: set[int] = set()
        for batch, _ in enumerate_space(model, cluster, workload, limits, rest):
            seen.update(int(x) for x in np.unique(getattr(batch, key)))
        if seen:
            shown = sorted(seen)
            listed = ", ".join(map(str, shown[:12])) + (", ..." if len(shown) > 12 else "")
            raise SpecError("search", PIN_FLAGS.get(key, key), value,
                            f"no valid plan for {model.name} on {cluster.num_gpus} GPUs with global batch "
                            f"{workload.global_batch_size} and the other pins; allowed here: {listed}")


def _nothing_fits(model, cluster, workload, n_valid, best_mem, limits, fixed=None) -> str:
    """Why no plan fits and what would: more GPUs, a shorter sequence, what the limits left out
    (an engine's bounds)."""
    if n_valid == 0 and limits.engine_rule is not None:
        # the engine's own bounds (its device mesh, its schedules) may be what left nothing
        for batch, _ in enumerate_space(model, cluster, workload, replace(limits, engine_rule=None), fixed):
            if len(batch):
                shown = batch.plan(0).describe()
                return (f"no plan for {model.name} on {cluster.num_gpus} GPUs with global batch "
                        f"{workload.global_batch_size} that the engine can build (its device mesh and "
                        f"pipeline schedules): plans such as {shown} are valid without --engine; "
                        f"`paraplan export --plan '{shown}'` names the rule it breaks")
    if n_valid == 0:
        max_tp = limits.max_tp or cluster.gpus_per_node
        return (f"no valid plan for {model.name} on {cluster.num_gpus} GPUs with global batch "
                f"{workload.global_batch_size}: DP = GPUs/(TP·CP·PP) must divide the batch, with TP ≤ {max_tp}, "
                f"CP ≤ {limits.max_cp}, PP at most the {model.num_layers} layers and TP dividing the heads; "
                "try fewer GPUs, a larger batch, or counts with more divisors (e.g. powers of two)")
    need, plan = best_mem
    cap = cluster.gpu.hbm_bytes
    more = int(np.ceil(cluster.num_gpus * need / cap / cluster.gpus_per_node)) * cluster.gpus_per_node
    # past the GPU counts the CLI plans for (--gpus), more GPUs is no answer
    too_many = more > MAX_DEGREE
    ways = ([] if too_many else [f"more GPUs (about {more:,})"]) + ["a shorter sequence"]
    left_out = [name for name, allowed in (("ZeRO-3", ZeroStage.PARAMETERS in limits.zero_stages),
                                           ("full recomputation", Recompute.FULL in limits.recomputes),
                                           ("optimizer offload", limits.allow_offload)) if not allowed]
    if left_out:  # bounds narrower than the whole space (an engine's): those plans were never tried
        ways.append(f"{' and '.join(left_out)} (not searched "
                    f"{'for this engine' if limits.engine_rule is not None else 'here'})")
    beyond = f" (about {more:,} GPUs would hold it, more than the {MAX_DEGREE:,} paraplan plans for)" if too_many else ""
    return (f"no plan fits in {fmt_bytes(cap)} per GPU: the smallest needs {fmt_bytes(need)} "
            f"({plan.describe()}){beyond}; try " + (", ".join(ways[:-1]) + " or " if len(ways) > 1 else "") + ways[-1])
