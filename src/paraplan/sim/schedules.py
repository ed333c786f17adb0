"""Pipeline schedules as data: one ordered list of tasks per pipeline rank.

Notation (Narayanan et al. SC'21): p pipeline stages (ranks), m micro-batches per step,
v model chunks per rank ("virtual stages"). Where the V = v·p virtual stages live is the
schedule's placement (Placement): looped, virtual stage j on rank j % p as chunk j // p, so
a micro-batch loops through the ranks v times; or V-shaped (ZB-V, two chunks), chunk 0 of
rank r is stage r and chunk 1 is stage 2p-1-r, so a micro-batch goes down the ranks and
back up, and the first rank holds both the first and the last stage.

A schedule says only *in what order* each rank runs its tasks; when they run follows
from the dependencies and costs, in engine.py. Each builder below names the paper whose
order it reproduces.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from ..errors import ParaplanError
from ..plan.axes import V_SCHEDULES, Schedule


class ScheduleError(ParaplanError, ValueError):
    """A schedule that cannot be built or simulated with the given arguments."""


class Phase(StrEnum):
    FORWARD = "F"
    BACKWARD = "B"  # input gradient; for non-zero-bubble schedules it includes W too
    WEIGHT = "W"    # weight gradient, split off B by zero-bubble schedules only


@dataclass(frozen=True, slots=True)
class Task:
    """One pass of one micro-batch through one model chunk of a rank. A `joined` task runs as
    part of the action of the task before it in the rank's list (DualPipeV's full backward,
    B with its W, and its overlapped forward-backward pair): the action starts once all its
    tasks' inputs are there, runs them one after another, and sends their outputs when the
    whole action ends (torch's _PipelineScheduleRuntime sends after an action)."""

    phase: Phase
    microbatch: int
    chunk: int
    joined: bool = False

    def __str__(self) -> str:
        return f"{'+' if self.joined else ''}{self.phase.value} mb{self.microbatch} c{self.chunk}"


RankTasks = tuple[Task, ...]


# Schedules that split each backward into B (input gradient) and W (weight gradient) tasks
# (DualPipeV splits some: the others run B and W as one action)
SPLIT_BACKWARD = frozenset({Schedule.ZERO_BUBBLE, Schedule.ZERO_BUBBLE_V, Schedule.DUAL_PIPE_V})


class Placement(StrEnum):
    """Which rank and chunk hold virtual stage j (p ranks, v chunks each)."""

    LOOPED = "looped"  # rank j % p, chunk j // p (Narayanan et al. SC'21 Sec. 2.2.2)
    # v = 2: rank j, chunk 0 for j < p; rank 2p-1-j, chunk 1 above (Qi et al. 2024 Sec. 6,
    # ZB-V; torch generate_stage_to_rank_mapping(style="v"))
    V_SHAPE = "v"


def placement(schedule: Schedule) -> Placement:
    """The placement a schedule runs on."""
    return Placement.V_SHAPE if Schedule(schedule) in V_SCHEDULES else Placement.LOOPED


def virtual_stage(where: Placement, num_stages: int, rank, chunk):
    """Virtual stage of (rank, chunk) under `where`; vectorized over rank and chunk."""
    rank, chunk = np.asarray(rank), np.asarray(chunk)
    if where is Placement.V_SHAPE:
        return np.where(chunk == 0, rank, 2 * num_stages - 1 - rank)
    return chunk * num_stages + rank


def stage_rank(where: Placement, num_stages: int, stage):
    """Rank that holds virtual stage `stage` under `where`; vectorized."""
    stage = np.asarray(stage)
    if where is Placement.V_SHAPE:
        return np.where(stage < num_stages, stage, 2 * num_stages - 1 - stage)
    return stage % num_stages


def build_schedule(
    schedule: Schedule, num_stages: int, num_microbatches: int, num_chunks: int = 1
) -> tuple[RankTasks, ...]:
    """Ordered task list for each of `num_stages` pipeline ranks."""
    try:
        schedule = Schedule(schedule)
    except ValueError:
        allowed = ", ".join(s.value for s in Schedule)
        raise ScheduleError(f"schedule={schedule!r} is not allowed; allowed: {allowed}") from None
    p = positive_int("num_stages", num_stages)
    m = positive_int("num_microbatches", num_microbatches)
    v = positive_int("num_chunks", num_chunks)
    if schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE) and v != 1:
        raise ScheduleError(
            f"schedule {schedule.value!r}: num_chunks={v} is not allowed; it runs one chunk "
            f"per rank (num_chunks=1); use 'interleaved' or 'bfs' for looping stages"
        )
    if schedule in V_SCHEDULES and v != 2:
        raise ScheduleError(
            f"schedule {schedule.value!r}: num_chunks={v} is not allowed; it runs exactly 2 chunks "
            f"per rank, placed in a V"
        )
    if schedule is Schedule.DUAL_PIPE_V and m < 2 * p:
        raise ScheduleError(
            f"schedule 'dualpipev': num_microbatches={m} is not allowed; DualPipeV needs at least "
            f"2 x num_stages = {2 * p} (one per virtual stage; torch ScheduleDualPipeV)"
        )
    if schedule is Schedule.INTERLEAVED_1F1B:
        if v < 2:
            raise ScheduleError(
                f"schedule 'interleaved': num_chunks={v} is not allowed; it needs at least 2 "
                f"chunks per rank (with 1 chunk use '1f1b')"
            )
        if m % p != 0:
            raise ScheduleError(
                f"schedule 'interleaved': num_microbatches={m} is not allowed; Megatron-LM's "
                f"interleaved order needs a multiple of num_stages={p}"
            )
    builder, tasks = _BUILDERS[schedule], _Tasks(m, v)
    return tuple(tuple(builder(p, m, v, rank, tasks)) for rank in range(p))


def positive_int(field: str, value: object) -> int:
    """`value` as an int >= 1, or a ScheduleError naming `field`."""
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        number = 0
    if number < 1:
        raise ScheduleError(f"{field}={value!r} is not allowed; it must be an integer >= 1")
    return number


class _Tasks:
    """Every Task of a schedule built once: ranks share them, which keeps building fast."""

    def __init__(self, m: int, v: int):
        self.F, self.B, self.W = (
            [[Task(phase, i, c) for i in range(m)] for c in range(v)] for phase in Phase
        )


def _gpipe(p: int, m: int, v: int, rank: int, t: _Tasks) -> list[Task]:
    # Huang et al. NeurIPS'19 (GPipe): every micro-batch's forward, then every backward.
    return t.F[0] + t.B[0]


def _one_f_one_b(p: int, m: int, v: int, rank: int, t: _Tasks) -> list[Task]:
    # PipeDream-Flush (Narayanan et al. ICML'21; SC'21 Sec. 2.2.1, Fig. 4 top): p-rank-1
    # warm-up forwards, then one forward and one backward alternately, then the cool-down
    # backwards. At most p-rank micro-batches are in flight on rank `rank`.
    F, B = t.F[0], t.B[0]
    warmup = min(p - rank - 1, m)
    tasks = F[:warmup]
    for i in range(m - warmup):
        tasks += (F[warmup + i], B[i])
    return tasks + B[m - warmup:]


def _interleaved(p: int, m: int, v: int, rank: int, t: _Tasks) -> list[Task]:
    # Narayanan et al. SC'21 Sec. 2.2.2, Fig. 4 bottom, in the order of Megatron-LM's
    # forward_backward_pipelining_with_interleaving: the k-th chunk-pass of a rank belongs
    # to chunk (k mod p*v) // p (reversed for backwards) and micro-batch
    # (k // p*v) * p + k mod p, i.e. micro-batches go through each chunk in groups of p.
    # Warm-up is (p-rank-1)*2 + (v-1)*p chunk-forwards, capped at all m*v of them per rank
    # (Megatron-Core 0.16.1 get_pp_rank_microbatches; torch.distributed.pipelining's
    # Interleaved1F1B likewise): at m == p rank 0 runs every forward first, the last rank not.
    total = m * v
    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)

    def forward(k: int) -> Task:
        group, in_group = divmod(k, p * v)
        return t.F[in_group // p][group * p + k % p]

    def backward(k: int) -> Task:
        group, in_group = divmod(k, p * v)
        return t.B[v - 1 - in_group // p][group * p + k % p]

    tasks = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        tasks += (forward(warmup + k), backward(k))
    return tasks + [backward(k) for k in range(total - warmup, total)]


def _breadth_first(p: int, m: int, v: int, rank: int, t: _Tasks) -> list[Task]:
    # Lamy-Poirier MLSys'23 (Breadth-First Pipeline Parallelism), looping layout, breadth-
    # first order: all micro-batches through chunk 0, then chunk 1, ..., then the
    # backwards chunk by chunk in reverse. GPipe is the v=1 case.
    forwards = [task for c in range(v) for task in t.F[c]]
    return forwards + [task for c in reversed(range(v)) for task in t.B[c]]


def _zero_bubble_h1(p: int, m: int, v: int, rank: int, t: _Tasks) -> list[Task]:
    # ZB-H1, Qi et al. ICLR'24 (Zero Bubble Pipeline Parallelism, Sec. 3.1, Fig. 3): 1F1B
    # with the backward split into B (input gradient, on the critical path) and W (weight
    # gradient, which nothing downstream waits for). Rank r runs the 1F1B order of F and B
    # and defers its W passes: it skips W in its first r steady-state rounds, so its last
    # r+1 W passes fill the cool-down bubble. In-flight micro-batches (F done, W not yet)
    # stay at p-r+r = p, the 1F1B peak, and the bubble drops to (p-1)(T_F + T_B - T_W).
    F, B, W = t.F[0], t.B[0], t.W[0]
    warmup = min(p - rank - 1, m)
    tasks = F[:warmup]
    next_w = 0  # W passes run in micro-batch order, lagging their B
    for i in range(m - warmup):
        tasks += (F[warmup + i], B[i])
        if i >= rank:
            tasks.append(W[next_w])
            next_w += 1
    for i in range(m - warmup, m):
        tasks += (B[i], W[next_w])
        next_w += 1
    return tasks + W[next_w:]


def _zero_bubble_v(p: int, m: int, v: int, rank: int, t: _Tasks) -> list[Task]:
    # ZB-V, Qi et al. 2024 (Zero Bubble Pipeline Parallelism, Sec. 6, Fig. 8), in the order
    # of torch 2.13 ScheduleZBVZeroBubble._calculate_single_rank_operations: chunk 0 of rank r
    # is stage r, chunk 1 is stage 2p-1-r (Placement.V_SHAPE). Warm-up: 2(p-r)-1 forwards of
    # chunk 0, r pairs F1 F0, then p-r rounds F1 B1 W1; steady state F0 B0 W0 F1 B1 W1; the
    # cool-down runs r pairs B0 B1, then p-r pairs B0 W0, then the deferred W passes. The
    # order is built for max(m, 2p-1) micro-batches and the ones past m dropped (torch does).
    n = max(2 * p - 1, m)
    order: list[tuple[Phase, int, int]] = []  # (phase, chunk, micro-batch)
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - rank) - 1):
        order.append((Phase.FORWARD, 0, f0)); f0 += 1  # noqa: E702
    for _ in range(rank):
        order += [(Phase.FORWARD, 1, f1), (Phase.FORWARD, 0, f0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(p - rank):
        order += [(Phase.FORWARD, 1, f1), (Phase.BACKWARD, 1, b1), (Phase.WEIGHT, 1, b1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:
        if f0 < n:
            order.append((Phase.FORWARD, 0, f0)); f0 += 1  # noqa: E702
        order += [(Phase.BACKWARD, 0, b0), (Phase.WEIGHT, 0, b0),
                  (Phase.FORWARD, 1, f1), (Phase.BACKWARD, 1, b1), (Phase.WEIGHT, 1, b1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(rank):
        order += [(Phase.BACKWARD, 0, b0), (Phase.BACKWARD, 1, b1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(p - rank):
        order += [(Phase.BACKWARD, 0, b0), (Phase.WEIGHT, 0, w0)]
        b0, w0 = b0 + 1, w0 + 1
    order += [(Phase.WEIGHT, 1, i) for i in range(w1, b1)] + [(Phase.WEIGHT, 0, i) for i in range(w0, b0)]
    table = {Phase.FORWARD: t.F, Phase.BACKWARD: t.B, Phase.WEIGHT: t.W}
    return [table[phase][chunk][mb] for phase, chunk, mb in order if mb < m]


def _dual_pipe_v(p: int, m: int, v: int, rank: int, t: _Tasks) -> list[Task]:
    # DualPipeV (DeepSeek-AI 2024, DeepSeek-V3 report Sec. 3.2.1; DualPipe's "cut in half" V),
    # in the order of torch 2.13 ScheduleDualPipeV._calculate_single_rank_operations, steps
    # 1-8 there. Chunk 0 is stage r, chunk 1 stage 2p-1-r (Placement.V_SHAPE). A full
    # backward is B with its W joined; an overlapped pair F(x) + full backward(y) is F with B
    # and W joined; a split B queues its W, which later steps pop oldest first.
    order: list[Task] = []
    nf, nb = [0, 0], [0, 0]  # next forward / backward micro-batch per chunk
    queue: list[tuple[int, int]] = []  # (chunk, micro-batch) of W passes not yet run

    def forward(c: int) -> None:
        order.append(t.F[c][nf[c]]); nf[c] += 1  # noqa: E702

    def backward(c: int, split: bool, joined: bool = False) -> None:
        order.append(Task(Phase.BACKWARD, nb[c], c, True) if joined else t.B[c][nb[c]])
        if split:
            queue.append((c, nb[c]))
        else:
            order.append(Task(Phase.WEIGHT, nb[c], c, True))
        nb[c] += 1

    def pair(f: int, b: int) -> None:
        forward(f)
        backward(b, split=False, joined=True)

    def weight() -> None:
        if queue:
            c, mb = queue.pop(0)
            order.append(t.W[c][mb])

    for _ in range(2 * (p - rank - 1)):                       # 1: F0
        forward(0)
    for _ in range(rank + 1):                                 # 2: F0 F1
        forward(0), forward(1)
    for _ in range(p - rank - 1):                             # 3: B1 W1 F1 (zero bubble)
        backward(1, split=True), weight(), forward(1)
    for i in range(m - 2 * p + rank + 1):                     # 4: F0&B1, F1&B0 (main step)
        if i == 0 and rank == p - 1:  # not overlapped, to shorten the bubble
            forward(0), backward(1, split=False)
        else:
            pair(0, 1)
        pair(1, 0)
    for _ in range(p - rank - 1):                             # 5: B1, F1&B0
        backward(1, split=False), pair(1, 0)
    split = False
    for i in range(rank + 1):                                 # 6: B1 B0, split from halfway
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        backward(1, split)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        backward(0, split)
    for _ in range(p - rank - 1):                             # 7: W0 B0
        weight(), backward(0, split)
    for _ in range(rank + 1):                                 # 8: W0
        weight()
    return order


_BUILDERS = {
    Schedule.GPIPE: _gpipe,
    Schedule.ONE_F_ONE_B: _one_f_one_b,
    Schedule.INTERLEAVED_1F1B: _interleaved,
    Schedule.BREADTH_FIRST: _breadth_first,
    Schedule.ZERO_BUBBLE: _zero_bubble_h1,
    Schedule.ZERO_BUBBLE_V: _zero_bubble_v,
    Schedule.DUAL_PIPE_V: _dual_pipe_v,
}


# Schedules torch runs through its lowering runtime (PipelineScheduleMulti), which brackets
# FSDP stages with UNSHARD/RESHARD actions; ScheduleGPipe and Schedule1F1B run without it.
FSDP_LOWERED = frozenset({Schedule.INTERLEAVED_1F1B, Schedule.BREADTH_FIRST, Schedule.ZERO_BUBBLE,
                          Schedule.ZERO_BUBBLE_V, Schedule.DUAL_PIPE_V})
FSDP_ACTIVE_CHUNKS = 3  # torch 2.13 _add_unshard_reshard(max_active_stages=3)


@functools.lru_cache(maxsize=4096)
def fsdp2_gathers_per_step(schedule: Schedule, num_stages: int, num_microbatches: int, num_chunks: int,
                           reshard_after_forward: bool) -> int:
    """All-gathers of FSDP2-sharded chunks per step on the busiest rank under torch's pipeline
    schedules (torch 2.13 torch/distributed/pipelining/stage.py, schedules.py):
    - every backward runs without gradient sync and keeps its chunk gathered
      (set_reshard_after_backward(False)); a forward reshards after itself when
      `reshard_after_forward` (ZeRO-3); FSDP2 gathers a chunk only when it is not gathered;
    - lowered schedules (FSDP_LOWERED) also prefetch the next FSDP_ACTIVE_CHUNKS distinct chunks
      of the rank's task list and reshard the active chunks not among them
      (_add_unshard_reshard): with four or more chunks per rank, chunks are evicted and
      gathered again.
    Without eviction that is m + 1 gathers per chunk at ZeRO-3 (each forward is followed by one
    pass of its chunk, which finds it resharded) and 1 below it. With eviction the count is
    replayed on this module's task order (_replay_fsdp2_gathers); it grows by the same amount
    with every p more micro-batches once the interleaved order has two rounds (m >= 2p) and
    with every micro-batch in the looped breadth-first order from m = p + 1, so larger m are
    extrapolated from two replays (tests/test_fsdp2_pipeline.py checks both against the full
    replay)."""
    p, m, v = num_stages, num_microbatches, num_chunks
    if schedule not in FSDP_LOWERED or v <= FSDP_ACTIVE_CHUNKS:
        return v * (m + 1) if reshard_after_forward else v
    step = p if schedule is Schedule.INTERLEAVED_1F1B else 1
    first = 2 * p if schedule is Schedule.INTERLEAVED_1F1B else p + 1
    if m <= first + step:
        return _replay_fsdp2_gathers(schedule, p, m, v, reshard_after_forward)
    a = _replay_fsdp2_gathers(schedule, p, first, v, reshard_after_forward)
    b = _replay_fsdp2_gathers(schedule, p, first + step, v, reshard_after_forward)
    return a + (m - first) // step * (b - a)


def _replay_fsdp2_gathers(schedule: Schedule, p: int, m: int, v: int, reshard_after_forward: bool) -> int:
    """fsdp2_gathers_per_step by replaying every rank's task list (busiest rank)."""
    lowered = schedule in FSDP_LOWERED
    worst = 0
    for tasks in build_schedule(schedule, p, m, v):
        # the next FSDP_ACTIVE_CHUNKS distinct chunks from each task on, in one backward sweep
        upcoming: list[list[int]] = [[]] * len(tasks)
        ahead: list[int] = []
        for i in range(len(tasks) - 1, -1, -1):
            c = tasks[i].chunk
            ahead = ([c] + [x for x in ahead if x != c])[:FSDP_ACTIVE_CHUNKS]
            upcoming[i] = ahead
        gathered: set[int] = set()
        active: set[int] = set()
        n = 0
        for i, task in enumerate(tasks):
            if lowered:
                for c in [c for c in active if c not in upcoming[i]]:
                    active.discard(c)
                    gathered.discard(c)  # RESHARD
                for c in upcoming[i]:
                    if c not in active:
                        active.add(c)
                        if c not in gathered:  # UNSHARD
                            n += 1
                            gathered.add(c)
            if task.chunk not in gathered:
                n += 1
                gathered.add(task.chunk)
            if task.phase is Phase.FORWARD and reshard_after_forward:
                gathered.discard(task.chunk)
        worst = max(worst, n)
    return worst
