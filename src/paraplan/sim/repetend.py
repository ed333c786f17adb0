"""Schedule search: the order of F, B and W tasks within a repeated pattern (a repetend),
under a cap on each rank's in-flight activations, timed by the event engine (engine.py).

After Tessel (Lin et al., "Tessel: Boosting Distributed Execution of Large DNN Models via
Flexible Schedule Search", HPCA 2024): a schedule is a warm-up, a repetend run again and
again, and a cool-down. Tessel solves for the repetend of every device and completes the
warm-up and cool-down around it; here the repetend is one period of one rank (one F, one B
and, with the backward split, one W, each of the next micro-batch of its kind), in a cyclic
order shared by every rank, and what shifts it by rank are two counts per rank:

  depth k_r  forwards a rank runs ahead of its oldest backward (1F1B: p − r),
  lag d_r    backwards whose W waits (ZB-H1: r; Qi et al. ICLR'24 Sec. 3.1).

A rank walks the repetend's order cyclically and runs the next task of a kind when its gate
opens (`_rank_order`); the same walk yields the warm-up (B and W gated until k_r forwards
are out) and the cool-down (the walk skips the kinds that are done), and the gate on F
keeps the rank's in-flight activations (F run, last backward task not yet) at or under its
cap. Searched: the cyclic order (F B W or F W B; F B without W) and the depth profile,
either 1F1B's shift k_r = k + p − 1 − r or 1F1B's shape scaled to a depth k on the first
rank, k_r = ⌈k·(p − r)/p⌉, each capped at the rank's cap, for k = 1 ... the largest cap; the
lag takes the memory the depth leaves, d_r = cap_r − k_r (ZB-H1 is k = 1 at cap p). Flat
and steeper profiles, and a lag one shorter, never won on uniform costs (p = 8, m = 32 at
caps 6, 8, 12; p = 4, m = 16), so they are not searched. A deadlock (a rank waiting on a
neighbour that waits on it) drops a candidate. The candidates are ranked on min(m, 2p) micro-batches
(past the warm-up each repeats one period per micro-batch, as estimate.py's line
through two simulations says) and the best few timed again on all m. The named schedules
that run the costs' shape and fit the cap are candidates too, timed on all m and tried
first: the result is never slower than the best of them and is a named order where none is
beaten (ties keep the named one).

Scope: one chunk per rank (v = 1, the looped placement); notation as in schedules.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..plan.axes import Schedule
from .engine import SimResult, StageCosts, simulate
from .schedules import Phase, RankTasks, ScheduleError, Task, build_schedule, positive_int

F, B, W = Phase.FORWARD, Phase.BACKWARD, Phase.WEIGHT
ORDERS_SPLIT = ((F, B, W), (F, W, B))  # cyclic orders of a period with the backward split
ORDERS_FUSED = ((F, B),)
DEPTH_PROFILES = ("shifted", "scaled")  # k + p − 1 − r, or ⌈k·(p − r)/p⌉
FINALISTS = 3  # candidates ranked on fewer micro-batches that are timed again on all of them
# Named schedules the search compares with, and tries, for one chunk per rank
NAMED_ONE_CHUNK = (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE)


@dataclass(frozen=True, kw_only=True)
class Repetend:
    """One searched pattern: the cyclic order of a period's tasks, and each rank's depth and lag."""

    order: tuple[Phase, ...]
    depth: tuple[int, ...]  # per rank: forwards ahead of the oldest backward
    lag: tuple[int, ...]    # per rank: backwards whose W waits (0 without W)

    def __str__(self) -> str:
        lag = f", lag {'/'.join(map(str, self.lag))}" if W in self.order else ""
        return f"repetend {' '.join(ph.value for ph in self.order)}, depth {'/'.join(map(str, self.depth))}{lag}"


@dataclass(frozen=True, kw_only=True, eq=False)
class SearchedSchedule:
    """The fastest order found under the cap, and the named schedules it was compared with."""

    tasks: tuple[RankTasks, ...]
    sim: SimResult
    cap_inflight: tuple[float, ...]  # per rank, micro-batches
    repetend: Repetend | None        # None where a named order is the fastest
    named: tuple[tuple[Schedule, float | None], ...]  # step time of each; None: over the cap

    @property
    def step_time_s(self) -> float:
        return self.sim.step_time_s

    @property
    def source(self) -> str:
        """'repetend', or the named schedule whose order this is."""
        if self.repetend is not None:
            return "repetend"
        fitting = [(t, s) for s, t in self.named if t is not None]
        return min(fitting, key=lambda x: x[0])[1].value

    @property
    def best_named_s(self) -> float | None:
        """The fastest named schedule that fits the cap (None: none fits)."""
        return min((t for _, t in self.named if t is not None), default=None)

    @property
    def split_backward(self) -> bool:
        return any(t.phase is W for tasks in self.tasks for t in tasks)


def search_schedule(costs: StageCosts, num_microbatches: int,
                    cap_inflight: float | Sequence[float]) -> SearchedSchedule:
    """The fastest schedule found for `costs` (one chunk per rank) whose peak in-flight
    activations stay at or under `cap_inflight` micro-batches on every rank (a number for
    all ranks, or one per rank)."""
    p, m = costs.num_stages, positive_int("num_microbatches", num_microbatches)
    if costs.num_chunks != 1:
        raise ScheduleError(f"schedule search: num_chunks={costs.num_chunks} is not allowed; the repetend "
                            f"search runs one chunk per rank (num_chunks=1)")
    caps = _caps(cap_inflight, p)
    best, named = _best_named(costs, m, caps)
    timed = costs if any(w > 0.0 for row in costs.weight_s for w in row) else costs.fuse_weight()
    for rep in _finalists(timed, m, caps):
        tasks = _tasks(rep, m, caps)
        sim = simulate(tasks, timed)
        if best is None or sim.step_time_s < best[0]:
            best = (sim.step_time_s, tasks, sim, rep)
    assert best is not None, "the shifted profile at k = 1 is 1F1B's order, capped, and never deadlocks"
    _, tasks, sim, rep = best
    return SearchedSchedule(tasks=tasks, sim=sim, cap_inflight=caps, repetend=rep, named=named)


def _best_named(costs: StageCosts, m: int, caps: tuple[float, ...]):
    """(step time, tasks, sim, None) of the fastest named schedule under the caps (None: none
    fits), and every named schedule's step time (None where it exceeds a cap)."""
    p, best, named = costs.num_stages, None, []
    for schedule in NAMED_ONE_CHUNK:
        tasks = build_schedule(schedule, p, m, 1)
        sim = simulate(tasks, costs if schedule is Schedule.ZERO_BUBBLE else costs.fuse_weight())
        fits = all(peak <= cap for peak, cap in zip(sim.peak_inflight, caps))
        named.append((schedule, sim.step_time_s if fits else None))
        if fits and (best is None or sim.step_time_s < best[0]):
            best = (sim.step_time_s, tasks, sim, None)
    return best, tuple(named)


def _finalists(costs: StageCosts, m: int, caps: tuple[float, ...]) -> list[Repetend]:
    """The FINALISTS repetends fastest on min(m, 2p) micro-batches, in search order among equals."""
    p = costs.num_stages
    short = min(m, 2 * p)
    ranked: list[tuple[float, int, Repetend]] = []
    seen: set[tuple] = set()
    for rep in _repetends(p, m, caps, split=costs.weight_s != costs.fuse_weight().weight_s):
        tasks = _tasks(rep, short, caps)
        if tasks in seen:
            continue
        seen.add(tasks)
        try:
            ranked.append((simulate(tasks, costs).step_time_s, len(ranked), rep))
        except RuntimeError:  # a rank waits on a neighbour that waits on it
            continue
    return [rep for _, _, rep in sorted(ranked)[:FINALISTS]]


def _tasks(rep: Repetend, m: int, caps: tuple[float, ...]) -> tuple[RankTasks, ...]:
    return tuple(_rank_order(rep.order, m, rep.depth[r], rep.lag[r], int(caps[r])) for r in range(len(caps)))


def _caps(cap_inflight: float | Sequence[float], p: int) -> tuple[float, ...]:
    """The per-rank caps, checked: each a number >= 1 (one micro-batch in flight)."""
    values = cap_inflight if isinstance(cap_inflight, (list, tuple)) else [cap_inflight] * p
    if len(values) != p:
        raise ScheduleError(f"schedule search: cap_inflight has {len(values)} values; it needs one for all "
                            f"ranks or one per rank ({p})")
    caps = []
    for value in values:
        try:
            if isinstance(value, bool):
                raise TypeError
            cap = float(value)
        except (TypeError, ValueError):
            cap = math.nan
        if not (math.isfinite(cap) and cap >= 1.0):
            raise ScheduleError(f"schedule search: cap_inflight={value!r} is not allowed; it must be a number "
                                f">= 1 (micro-batches in flight on a rank)")
        caps.append(cap)
    return tuple(caps)


def _repetends(p: int, m: int, caps: tuple[float, ...], split: bool):
    """The searched patterns, in a fixed order (the first of equal step times is kept)."""
    seen: set[tuple] = set()
    for order in ORDERS_SPLIT if split else ORDERS_FUSED:
        for profile in DEPTH_PROFILES:
            for k in range(1, int(min(max(caps), m)) + 1):
                depth = tuple(max(1, min(_depth(profile, k, p, r), m, int(caps[r]))) for r in range(p))
                if (order, depth) in seen:
                    continue
                seen.add((order, depth))
                lag = tuple(int(caps[r]) - depth[r] if split else 0 for r in range(p))
                yield Repetend(order=order, depth=depth, lag=lag)


def _depth(profile: str, k: int, p: int, r: int) -> int:
    """Rank r's depth in a profile whose parameter is k."""
    return k + p - 1 - r if profile == "shifted" else -(-k * (p - r) // p)


def _rank_order(order: tuple[Phase, ...], m: int, depth: int, lag: int, cap: int) -> RankTasks:
    """One rank's tasks: `order` walked cyclically, each kind's next micro-batch run when its
    gate opens. F: under the depth and the cap. B: once `depth` forwards are ahead (fewer at
    the end), or the cap stops F. W: once more than `lag` backwards wait, the backwards are
    done, or the cap is reached (a W frees an activation). Some gate is open until every task
    has run, so the walk ends."""
    split = W in order
    done = {F: 0, B: 0, W: 0}
    tasks: list[Task] = []
    total = m * len(order)
    while len(tasks) < total:
        progressed = False
        for phase in order:
            f, b, w = done[F], done[B], done[W]
            held = f - (w if split else b)
            if phase is F:
                ready = f < m and held < cap and f - b < depth
            elif phase is B:
                ready = b < f and (f - b >= min(depth, m - b) or held >= cap)
            else:
                ready = w < b and (b - w > lag or b == m or held >= cap)
            if ready:
                tasks.append(Task(phase, done[phase], 0))
                done[phase] += 1
                progressed = True
        assert progressed, "a gate is always open (see the docstring)"
    return tuple(tasks)
