"""Times a pipeline schedule (schedules as data, schedules.py): every task's start and end.

Notation as in schedules.py: p ranks, m micro-batches, v chunks per rank, V = v*p virtual
stages; virtual stage j of (rank, chunk) by the schedule's Placement (looped: chunk*p + rank).

Model. Each rank runs its task list strictly in order, one task at a time. A task starts
at max(rank free, dependencies ready), where (Narayanan et al. SC'21, Sec. 2.2):
  F(mb, j) needs F(mb, j-1) done + p2p_s                            (j > 0)
  B(mb, j) needs F(mb, j) done, and B(mb, j+1) done + p2p_s         (j < V-1)
  W(mb, j) needs B(mb, j) done
Point-to-point sends are latency only: they occupy no rank (as when they overlap with
compute on a separate stream), and a gradient costs the same p2p_s as an activation. A hop
between two stages of the same rank (the turn of a V, or p = 1) sends nothing: it costs 0.

Actions. A task marked `joined` runs in one action with the task before it (DualPipeV's
full backward B+W and its forward-backward pairs): the action starts once every input its
tasks wait for from outside it is there, runs its tasks back to back (its duration is
their sum: an overlap of the pair is priced into the costs, not here), and every task's
output is ready, or sent, only when the whole action ends.

Waves. Start times are the unique solution of the rules above: with each rank's order
fixed, a task's start is a longest path through the schedule's graph. The graph is cut once
per shape into waves (_Graph.waves): wave k holds the actions whose longest chain of
predecessors has k links, at most one per rank, so a wave's actions start together once
the waves before it have ended. Each wave is a few numpy operations, over the runs of one
shape at once (simulate_schedules: a search's re-timed plans share a few shapes), with the
same additions and maxima in the same order as one task at a time, so the times are the
same to the bit. A rank whose next action no wave reaches is a deadlock: RuntimeError
names the stuck tasks.

Tie-break rule (the only one): events that start at the same time are ordered by rank,
then by position in the rank's list: the order of `SimResult.events`. It decides the
order events are listed in, never a time.

Peak in-flight activations (memory) count a chunk's activation from its F until its last
backward task: B, or W where the schedule splits the backward (ZB-H1 keeps the inputs
the weight gradient needs; Qi et al. 2024 Sec. 3.1).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Sequence

import numpy as np

from ..plan.axes import Schedule
from .schedules import (Phase, Placement, ScheduleError, Task, build_schedule, placement, positive_int, stage_rank,
                        virtual_stage)

PerRankChunk = tuple[tuple[float, ...], ...]

_FORWARD, _BACKWARD, _WEIGHT = 0, 1, 2
_CODE = {Phase.FORWARD: _FORWARD, Phase.BACKWARD: _BACKWARD, Phase.WEIGHT: _WEIGHT}
_NOT_DONE = -1.0  # times are >= 0, so a negative end time marks "not finished yet"


@dataclass(frozen=True, kw_only=True)
class StageCosts:
    """Per-task durations, indexed [rank][chunk], and the per-hop send latency."""

    forward_s: PerRankChunk
    backward_s: PerRankChunk  # input-gradient backward; the whole backward unless split
    weight_s: PerRankChunk    # weight-gradient backward; zeros unless zero-bubble
    p2p_s: float              # one micro-batch's activation (or gradient) to the next stage
    # per hop between virtual stages j and j+1 (V - 1 of them), that hop's send in place of
    # p2p_s, both ways: stages on different GPU groups reshard there (cost/reshard.py).
    # Empty: p2p_s on every hop.
    hop_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        forward = _table("forward_s", self.forward_s)
        p, v = len(forward), len(forward[0])
        object.__setattr__(self, "forward_s", forward)
        for name in ("backward_s", "weight_s"):
            table = _table(name, getattr(self, name))
            if (len(table), len(table[0])) != (p, v):
                raise ScheduleError(
                    f"stage costs: {name} has shape {len(table)}x{len(table[0])}; "
                    f"it must match forward_s, {p} ranks x {v} chunks"
                )
            object.__setattr__(self, name, table)
        object.__setattr__(self, "p2p_s", _duration("p2p_s", self.p2p_s))
        object.__setattr__(self, "hop_s", tuple(_duration("hop_s", h) for h in self.hop_s))

    @classmethod
    def uniform(
        cls,
        num_stages: int,
        num_chunks: int,
        forward_s: float,
        backward_s: float,
        weight_s: float = 0.0,
        p2p_s: float = 0.0,
    ) -> StageCosts:
        """The same cost for every chunk of every rank."""
        p = positive_int("stage costs: num_stages", num_stages)
        v = positive_int("stage costs: num_chunks", num_chunks)

        def grid(x: float) -> PerRankChunk:
            return tuple((x,) * v for _ in range(p))

        return cls(forward_s=grid(forward_s), backward_s=grid(backward_s),
                   weight_s=grid(weight_s), p2p_s=p2p_s)

    @property
    def num_stages(self) -> int:
        return len(self.forward_s)

    @property
    def num_chunks(self) -> int:
        return len(self.forward_s[0])

    def fuse_weight(self) -> StageCosts:
        """Costs for a schedule without W tasks: the weight gradient folded into B."""
        fused = tuple(tuple(b + w for b, w in zip(brow, wrow))
                      for brow, wrow in zip(self.backward_s, self.weight_s))
        zeros = tuple((0.0,) * len(row) for row in self.weight_s)
        return replace(self, backward_s=fused, weight_s=zeros)


@dataclass(frozen=True, kw_only=True, slots=True)
class SimEvent:
    """One task as it ran."""

    rank: int
    phase: Phase
    microbatch: int
    chunk: int
    virtual_stage: int
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, kw_only=True, eq=False)
class EventColumns:
    """The timeline column-wise (read-only numpy arrays), in `SimResult.events` order."""

    rank: np.ndarray
    phase_code: np.ndarray  # index into PHASES
    microbatch: np.ndarray
    chunk: np.ndarray
    virtual_stage: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray


PHASES = (Phase.FORWARD, Phase.BACKWARD, Phase.WEIGHT)  # EventColumns.phase_code order


@dataclass(frozen=True, kw_only=True, eq=False)
class SimResult:
    """Timeline of one training step's pipeline."""

    step_time_s: float                # makespan: the last task's end
    busy_s: tuple[float, ...]         # per rank: sum of its task durations
    bubble_s: tuple[float, ...]       # per rank: step_time_s - busy_s
    peak_inflight: tuple[float, ...]  # per rank: max micro-batches held, counted in 1/v units
    timeline: tuple = field(repr=False, compare=False)  # (graph, start_s, end_s) by task: `columns` reads it

    @cached_property
    def columns(self) -> EventColumns:
        """The timeline in the tie-break order, column-wise; `events` reads it as objects
        (sorted when first read: a search reads only the step time of most runs)."""
        g, start, end = self.timeline
        ix = np.lexsort((np.arange(len(start)), g.rank, start))  # the tie-break rule
        return EventColumns(**{name: _frozen(a[ix]) for name, a in (
            ("rank", g.rank), ("phase_code", g.code), ("microbatch", g.microbatch),
            ("chunk", g.chunk), ("virtual_stage", g.stage), ("start_s", start), ("end_s", end),
        )})

    @cached_property
    def events(self) -> tuple[SimEvent, ...]:
        """Every task as it ran, ordered by (start_s, rank, position): the tie-break rule."""
        c = self.columns
        return tuple(
            SimEvent(rank=r, phase=PHASES[ph], microbatch=mb, chunk=ch, virtual_stage=j,
                     start_s=s, end_s=e)
            for r, ph, mb, ch, j, s, e in zip(
                c.rank.tolist(), c.phase_code.tolist(), c.microbatch.tolist(), c.chunk.tolist(),
                c.virtual_stage.tolist(), c.start_s.tolist(), c.end_s.tolist(),
            )
        )

    @property
    def ideal_s(self) -> float:
        """Step time with no bubble: the busiest rank's work."""
        return max(self.busy_s, default=0.0)

    @property
    def bubble_fraction(self) -> float:
        """(step - ideal) / ideal, Narayanan et al. SC'21 Sec. 2.2.1 (1F1B: (p-1)/m)."""
        ideal = self.ideal_s
        return (self.step_time_s - ideal) / ideal if ideal > 0 else 0.0


def simulate(tasks_per_rank: Sequence[Sequence[Task]], costs: StageCosts,
             where: Placement = Placement.LOOPED) -> SimResult:
    """Time the schedule `tasks_per_rank` (one ordered list per rank) under `costs`, its
    virtual stages placed as `where` says (schedules.placement(schedule))."""
    p, v = costs.num_stages, costs.num_chunks
    if len(tasks_per_rank) != p:
        raise ScheduleError(f"schedule has {len(tasks_per_rank)} ranks; the stage costs have {p}")
    if where is Placement.V_SHAPE and v != 2:
        raise ScheduleError(f"placement 'v' needs 2 chunks per rank; the stage costs have {v}")
    return _simulate(_Graph(tasks_per_rank, p, v, where), tasks_per_rank, costs)


# a ZB-V graph of p = 64, m = 256, v = 2 holds some 19 MB (tasks, arrays, its waves): a few
# shapes cover a search's simulated plans
@functools.lru_cache(maxsize=8)
def _prepared(schedule: Schedule, p: int, m: int, v: int) -> tuple[tuple, _Graph]:
    """A schedule's task lists and their dependency graph, which do not depend on the costs:
    built once for the many plans a search simulates with the same shape."""
    tasks = build_schedule(schedule, p, m, v)
    return tasks, _Graph(tasks, p, v, placement(schedule))


# task times (tasks × runs) one pass holds per array: a few 8M-float arrays (64 MB each) at most
SIM_BATCH_TIMES = 8_000_000


def simulate_schedule(schedule: Schedule, num_microbatches: int, costs: StageCosts) -> SimResult:
    """simulate(build_schedule(schedule, p, m, v), costs, placement(schedule)), the schedule's
    graph built once per shape (p, m, v from the costs)."""
    return simulate_schedules([(schedule, num_microbatches, costs)])[0]


def simulate_schedules(runs: Sequence[tuple[Schedule, int, StageCosts]]) -> list[SimResult]:
    """simulate_schedule for each (schedule, micro-batches, costs), in order: the runs of one
    shape (schedule, p, m, v) timed together, one pass over its graph for all of them."""
    shapes: dict[tuple, list[int]] = {}
    for i, (schedule, m, costs) in enumerate(runs):
        shapes.setdefault((Schedule(schedule), costs.num_stages, m, costs.num_chunks), []).append(i)
    out: list[SimResult | None] = [None] * len(runs)
    for shape, index in shapes.items():
        tasks, g = _prepared(*shape)
        per_batch = max(1, SIM_BATCH_TIMES // len(g.rank))  # runs timed in one pass
        for a in range(0, len(index), per_batch):
            batch = index[a:a + per_batch]
            for i, result in zip(batch, _simulate_all(g, tasks, [runs[i][2] for i in batch])):
                out[i] = result
    return out  # type: ignore[return-value]


def _simulate(g: _Graph, tasks_per_rank, costs: StageCosts) -> SimResult:
    return _simulate_all(g, tasks_per_rank, [costs])[0]


def _simulate_all(g: _Graph, tasks_per_rank, costs: Sequence[StageCosts]) -> list[SimResult]:
    """The schedule of graph g timed under each of `costs` (columns of one pass)."""
    for c in costs:
        if not g.has_weight and any(w for row in c.weight_s for w in row):
            raise ScheduleError(
                "stage costs: weight_s is nonzero but the schedule has no W tasks; "
                "use costs.fuse_weight() to fold it into backward_s"
            )
    v = costs[0].num_chunks
    # durations [task, run]
    table = np.array([[c.forward_s, c.backward_s, c.weight_s] for c in costs], dtype=np.float64)
    duration = np.ascontiguousarray(table[:, g.code, g.rank, g.chunk].T)
    start = _start_times(g, duration, _sends(g, costs), tasks_per_rank)
    end = start + duration
    # Activations held: +1 when a chunk's F runs, -1 when its last backward task (B, or W
    # when the schedule splits the backward) runs; each rank runs its list in order.
    release = _WEIGHT if g.has_weight else _BACKWARD
    held = np.cumsum((g.code == _FORWARD).astype(np.int64) - (g.code == release))
    before = np.concatenate(([0], held))[g.first]  # running total where each rank starts
    peak = tuple(int((held[a:a + n] - base).max()) / v for a, n, base in zip(g.first, g.length, before))
    # (each run's own copy: a result kept does not hold the batch's arrays)
    return [_result(g, start[:, k].copy(), end[:, k].copy(), duration[:, k], peak) for k in range(len(costs))]


def _sends(g: "_Graph", costs: Sequence[StageCosts]) -> np.ndarray:
    """Each run's send time [run], or, where a run prices its hops apart (hop_s), each task's
    [task, run]: a forward at virtual stage j sends over hop j, a backward over hop j - 1."""
    if not any(c.hop_s for c in costs):
        return np.array([c.p2p_s for c in costs])
    num_stages = int(g.stage.max()) + 1
    sends = np.zeros((len(g.stage), len(costs)))
    for k, c in enumerate(costs):
        hops = np.asarray(c.hop_s if c.hop_s else (c.p2p_s,) * (num_stages - 1), dtype=np.float64)
        if len(hops) != num_stages - 1:
            raise ScheduleError(f"stage costs: hop_s has {len(hops)} hops; the schedule has {num_stages - 1}")
        padded = np.concatenate(([0.0], hops, [0.0]))  # hop j at [j + 1]; none off either end
        sends[:, k] = np.where(g.code == _FORWARD, padded[g.stage + 1], np.where(g.code == _BACKWARD, padded[g.stage], 0.0))
    return sends


def _result(g: _Graph, start: np.ndarray, end: np.ndarray, duration: np.ndarray, peak: tuple) -> SimResult:
    """One run's timeline as a SimResult."""
    busy_s = np.bincount(g.rank, weights=duration, minlength=len(g.length))
    step_time_s = float(end.max())
    return SimResult(
        step_time_s=step_time_s,
        busy_s=tuple(busy_s.tolist()),
        bubble_s=tuple((step_time_s - busy_s).tolist()),
        peak_inflight=peak,
        timeline=(g, start, end),
    )


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


class _Graph:
    """The schedule as flat numpy arrays over all tasks (rank by rank, in list order),
    checked to hold every (phase, micro-batch, virtual stage) exactly once.

    A finished task k fills two slots: [2k] its end, read by a successor on its own rank, and
    [2k+1] end + p2p_s, read by one on the neighbouring virtual stage. A dependency is a
    slot; the last slot is "no dependency", finished at time 0. The simulator runs actions
    (unit_*) in waves: an action's tasks fill their slots when the action ends.
    """

    def __init__(self, tasks_per_rank: Sequence[Sequence[Task]], p: int, v: int, where: Placement):
        flat = [t for tasks in tasks_per_rank for t in tasks]
        self._read(flat, tasks_per_rank, v)
        key, num_stages = self._keys(flat, p, v, where)
        self._check_complete(flat, p, v, where, num_stages)
        self._dependencies(key, num_stages, p, where)
        self._actions(flat, p)

    def _read(self, flat: list, tasks_per_rank: Sequence[Sequence[Task]], v: int) -> None:
        """Each task's phase code, micro-batch, chunk and rank, checked."""
        p = len(tasks_per_rank)
        self.length = np.array([len(tasks) for tasks in tasks_per_rank], dtype=np.int64)
        self.first = np.concatenate(([0], np.cumsum(self.length)[:-1])).astype(np.int64)
        try:
            self.code = np.array([_CODE[t.phase] for t in flat], dtype=np.int64)
        except (KeyError, AttributeError):
            bad = next(t for t in flat if getattr(t, "phase", None) not in _CODE)
            raise ScheduleError(f"task {bad!r} is not allowed; tasks are Task(phase F/B/W, ...)") from None
        self.microbatch = np.array([t.microbatch for t in flat], dtype=np.int64)
        self.chunk = np.array([t.chunk for t in flat], dtype=np.int64)
        self.rank = np.repeat(np.arange(p, dtype=np.int64), self.length)
        bad = np.flatnonzero((self.chunk < 0) | (self.chunk >= v) | (self.microbatch < 0))
        if bad.size:
            i = int(bad[0])
            raise ScheduleError(
                f"rank {self.rank[i]}: task {flat[i]} is not allowed; chunk must be in "
                f"[0, {v}) and microbatch >= 0"
            )

    def _keys(self, flat: list, p: int, v: int, where: Placement) -> tuple[np.ndarray, int]:
        """Each task's virtual stage and (phase, virtual stage, micro-batch) key."""
        m = int(self.microbatch.max()) + 1 if flat else 1
        num_stages = v * p
        self.stage = virtual_stage(where, p, self.rank, self.chunk).astype(np.int64)
        key = self.stage * m + self.microbatch  # (virtual stage, micro-batch)
        self.num_keys = 3 * num_stages * m
        self.task_key = self.code * (num_stages * m) + key  # (phase, virtual stage, mb)
        self.m = m
        return key, num_stages

    def _check_complete(self, flat: list, p: int, v: int, where: Placement, num_stages: int) -> None:
        """Every (phase, virtual stage, micro-batch) once: F and B, and W in all or none."""
        m = self.m
        count = np.bincount(self.task_key, minlength=self.num_keys)
        if (count > 1).any():
            i = int(np.flatnonzero(count[self.task_key] > 1)[0])
            raise ScheduleError(f"rank {self.rank[i]}: task {flat[i]} appears more than once")
        self.has_weight = bool(count[2 * num_stages * m:].any())
        needed = count[: (3 if self.has_weight else 2) * num_stages * m]
        if not needed.all():
            code, rest = divmod(int(np.flatnonzero(needed == 0)[0]), num_stages * m)
            j, mb = divmod(rest, m)
            r = int(stage_rank(where, p, j))
            c = int(np.flatnonzero(virtual_stage(where, p, r, np.arange(v)) == j)[0])
            raise ScheduleError(
                f"schedule lacks task {PHASES[code].value} mb{mb} c{c} on rank {r}; "
                f"every micro-batch needs F and B (and W in all or none) on every virtual stage"
            )

    def _dependencies(self, key: np.ndarray, num_stages: int, p: int, where: Placement) -> None:
        """What each task waits for."""
        # Dependencies as slots (see _start_times): F needs F(j-1) + p2p, B needs its own F
        # and B(j+1) + p2p, W needs its B. A neighbouring stage on the task's own rank hands
        # over without a send (slot 2k).
        m, none = self.m, 2 * self.num_keys
        block = num_stages * m  # task_key offset of one phase
        is_f, is_b = self.code == _FORWARD, self.code == _BACKWARD
        first_stage, last_stage = self.stage == 0, self.stage == num_stages - 1
        prev_rank = stage_rank(where, p, np.maximum(self.stage - 1, 0))
        next_rank = stage_rank(where, p, np.minimum(self.stage + 1, num_stages - 1))
        forward_dep = np.where(first_stage, none, 2 * (key - m) + (prev_rank != self.rank))
        self.dep_a = np.where(is_f, forward_dep, 2 * (self.task_key - block))
        self.dep_b = np.where(is_b & ~last_stage, 2 * (block + key + m) + (next_rank != self.rank), none)

    def _actions(self, flat: list, p: int) -> None:
        """Tasks grouped into the actions a rank starts, with the inputs each waits for."""
        # Actions: a task starts one unless it is `joined` to the one before it. An action
        # waits for its tasks' dependencies from outside it (at most three: a pair's forward
        # input, its backward's forward and output gradient; a joined W waits on its own B).
        joined = np.array([t.joined for t in flat], dtype=bool)
        starts = self.first[self.length > 0]
        if joined[starts].any():
            i = int(starts[joined[starts]][0])
            raise ScheduleError(f"rank {self.rank[i]}: task {flat[i]} is joined but starts the rank's list")
        leader = ~joined
        self.unit_first = np.flatnonzero(leader).astype(np.int64)
        self.unit_size = np.diff(np.append(self.unit_first, len(flat))).astype(np.int64)
        self.rank_units = np.bincount(self.rank[leader], minlength=p).astype(np.int64)
        self.rank_first_unit = np.concatenate(([0], np.cumsum(self.rank_units)[:-1])).astype(np.int64)
        none = 2 * self.num_keys
        deps = [self.dep_a, self.dep_b, np.full(len(flat), none, dtype=np.int64)]
        self.unit_dep_a, self.unit_dep_b, self.unit_dep_c = (d[self.unit_first].copy() for d in deps)
        for u in np.flatnonzero(self.unit_size > 1).tolist():
            a = int(self.unit_first[u])
            members = range(a, a + int(self.unit_size[u]))
            inside = {int(2 * self.task_key[k]) + j for k in members for j in (0, 1)}
            outside = sorted({int(d[k]) for k in members for d in (self.dep_a, self.dep_b)} - inside - {none})
            if len(outside) > 3:
                raise ScheduleError(f"rank {self.rank[a]}: the action at task {flat[a]} waits for more than 3 inputs")
            outside += [none] * (3 - len(outside))
            self.unit_dep_a[u], self.unit_dep_b[u], self.unit_dep_c[u] = outside

    @cached_property
    def waves(self) -> tuple[list[_Wave], np.ndarray]:
        """The actions in waves, each wave's actions on distinct ranks and waiting only on
        earlier waves: wave k holds the actions whose longest chain of predecessors (the action
        before on its rank, those whose outputs it waits for) has k links. And the actions no
        wave reaches (a deadlock), empty unless the schedule cannot run."""
        units = len(self.unit_first)
        rank_of_unit = self.rank[self.unit_first]
        unit_of_task = np.repeat(np.arange(units, dtype=np.int64), self.unit_size)
        task_of_key = np.full(self.num_keys + 1, -1, dtype=np.int64)  # the last: "no dependency"
        task_of_key[self.task_key] = np.arange(len(self.task_key), dtype=np.int64)
        inputs = [[] for _ in range(units)]  # the actions each action waits for
        for dep in (self.unit_dep_a, self.unit_dep_b, self.unit_dep_c):
            producer = task_of_key[dep // 2]
            for u in np.flatnonzero(producer >= 0).tolist():
                inputs[u].append(int(unit_of_task[producer[u]]))
        after = (np.arange(units) > self.rank_first_unit[rank_of_unit]).tolist()  # not a rank's first
        waiting = [len(inputs[u]) + after[u] for u in range(units)]
        consumers = [[] for _ in range(units)]
        for u, ins in enumerate(inputs):
            for w in ins:
                consumers[w].append(u)
        level = [-1] * units
        wave = [u for u in range(units) if waiting[u] == 0]
        depth = 0
        while wave:
            for u in wave:
                level[u] = depth
            ready = []
            for u in wave:
                for c in consumers[u] + ([u + 1] if u + 1 < units and after[u + 1] else []):
                    waiting[c] -= 1
                    if waiting[c] == 0:
                        ready.append(c)
            wave, depth = ready, depth + 1
        level = np.array(level, dtype=np.int64)
        order = np.argsort(level, kind="stable")
        bounds = np.searchsorted(level[order], np.arange(depth + 1))
        waves = [_Wave.of(self, order[a:b], rank_of_unit) for a, b in zip(bounds[:-1], bounds[1:])]
        return waves, np.flatnonzero(level < 0)


@dataclass(frozen=True, kw_only=True)
class _Wave:
    """Actions that start once earlier waves have ended, one per rank: their ranks, the three
    slots each waits for, and their tasks in run order (member k of the actions that have more
    than k), with the slots those tasks fill."""

    rank: np.ndarray
    dep_a: np.ndarray
    dep_b: np.ndarray
    dep_c: np.ndarray
    members: tuple[tuple[np.ndarray, np.ndarray | None], ...]  # (tasks, which actions; None: all)
    tasks: np.ndarray       # the tasks whose slots `slot` are, in that order
    slot: np.ndarray        # every task's end slot (2k; 2k + 1 is the sent copy)
    slot_action: np.ndarray | None  # the action of each, whose end fills it (None: one task per action)

    @classmethod
    def of(cls, g: "_Graph", units: np.ndarray, rank_of_unit: np.ndarray) -> "_Wave":
        first, size = g.unit_first[units], g.unit_size[units]
        members = tuple((first[size > k] + k, None if k == 0 else np.flatnonzero(size > k))
                        for k in range(int(size.max())))
        tasks = np.concatenate([t for t, _ in members])
        action = (None if len(members) == 1 else
                  np.concatenate([np.arange(len(units)) if w is None else w for _, w in members]))
        return cls(rank=rank_of_unit[units], dep_a=g.unit_dep_a[units], dep_b=g.unit_dep_b[units],
                   dep_c=g.unit_dep_c[units], members=members, tasks=tasks, slot=2 * g.task_key[tasks],
                   slot_action=action)


def _start_times(g: "_Graph", duration: np.ndarray, p2p_s: np.ndarray, tasks_per_rank) -> np.ndarray:
    """Every task's start [task (flat index, rank by rank), run] for runs' `duration` [task,
    run] and sends `p2p_s` ([run], or [task, run]: _sends), wave by wave (_Graph.waves): an
    action starts when its rank is free and its inputs are there, its tasks run back to back,
    and each task's outputs are ready when the action ends (sent: p2p_s later)."""
    waves, stuck = g.waves
    if stuck.size:
        raise _deadlock_at(g, stuck, tasks_per_rank)
    runs = duration.shape[1]
    avail = np.full((2 * g.num_keys + 1, runs), _NOT_DONE)
    avail[-1] = 0.0  # "no dependency"
    rank_free = np.zeros((len(g.length), runs))
    start_s = np.zeros_like(duration)
    for w in waves:
        end = np.maximum(np.maximum(avail[w.dep_a], avail[w.dep_b]), np.maximum(avail[w.dep_c], rank_free[w.rank]))
        for tasks, which in w.members:  # back to back (more than one task: DualPipeV's actions)
            if which is None:  # every action's first task (end: a new array from here on)
                start_s[tasks] = end
                end = end + duration[tasks]
            else:
                start_s[tasks] = end[which]
                end[which] = end[which] + duration[tasks]
        filled = end if w.slot_action is None else end[w.slot_action]
        avail[w.slot] = filled
        avail[w.slot + 1] = filled + (p2p_s if p2p_s.ndim == 1 else p2p_s[w.tasks])
        rank_free[w.rank] = end
    return start_s


def _deadlock_at(g: "_Graph", stuck: np.ndarray, tasks_per_rank) -> RuntimeError:
    """The deadlock error for the actions no wave reaches: each rank stopped at its first."""
    units = len(g.unit_first)
    stop = (g.rank_first_unit + g.rank_units).tolist()
    next_unit = list(stop)
    rank_of_unit = g.rank[g.unit_first]
    for u in stuck.tolist():
        r = int(rank_of_unit[u])
        next_unit[r] = min(next_unit[r], u)
    done = np.ones(units, dtype=bool)
    done[stuck] = False
    finished = np.repeat(done, g.unit_size)
    avail = np.full(2 * g.num_keys + 1, _NOT_DONE)
    avail[-1] = 0.0
    avail[2 * g.task_key[finished]] = 0.0
    avail[2 * g.task_key[finished] + 1] = 0.0
    return _deadlock(tasks_per_rank, g, next_unit, stop, avail.tolist())


def _deadlock(tasks_per_rank, g: _Graph, next_unit, stop, avail) -> RuntimeError:
    stuck = []
    for rank, tasks in enumerate(tasks_per_rank):
        u = next_unit[rank]
        if u == stop[rank]:
            continue
        first, size = int(g.unit_first[u]), int(g.unit_size[u])
        own = {int(g.task_key[k]) for k in range(first, first + size)}
        waits = "an input"
        for i in range(first, first + size):  # the first task of the action with an input missing
            t, j = tasks[i - int(g.first[rank])], int(g.stage[i])
            missing = [d for d in (int(g.dep_a[i]), int(g.dep_b[i]))
                       if d < 2 * g.num_keys and d // 2 not in own and avail[d] < 0.0]
            if not missing:
                continue
            if t.phase is Phase.FORWARD:
                waits = f"F mb{t.microbatch} of virtual stage {j - 1}"
            elif t.phase is Phase.WEIGHT:
                waits = f"B mb{t.microbatch} of virtual stage {j}"
            elif missing[0] == int(g.dep_a[i]):
                waits = f"F mb{t.microbatch} of virtual stage {j}"
            else:
                waits = f"B mb{t.microbatch} of virtual stage {j + 1}"
            break
        t = tasks[first - int(g.first[rank])]
        stuck.append(f"rank {rank} at task #{first - int(g.first[rank])} ({t}) waits for {waits}")
    shown = "; ".join(stuck[:8]) + (f"; ... {len(stuck) - 8} more" if len(stuck) > 8 else "")
    return RuntimeError(f"schedule deadlocks: {shown}")


def _table(field: str, value: object) -> PerRankChunk:
    try:
        rows = tuple(tuple(_duration(field, x) for x in row) for row in value)  # type: ignore[union-attr]
    except TypeError:
        raise ScheduleError(f"stage costs: {field} must be a [rank][chunk] table of seconds") from None
    if not rows or not rows[0] or any(len(r) != len(rows[0]) for r in rows):
        raise ScheduleError(
            f"stage costs: {field} must have at least one rank and the same number (>= 1) "
            f"of chunks on every rank"
        )
    return rows


def _duration(field: str, value: object) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ScheduleError(f"stage costs: {field}={value!r} is not allowed; it must be seconds") from None
    if not (math.isfinite(seconds) and seconds >= 0.0):
        raise ScheduleError(f"stage costs: {field}={value!r} is not allowed; it must be finite and >= 0")
    return seconds
