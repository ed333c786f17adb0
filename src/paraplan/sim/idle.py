"""Where each pipeline rank idles in a simulated step, and how many equal pieces of other
work its gaps hold (bubble filling: PipeFisher, Osawa et al., MLSys 2023).

A rank's idle time, by where it falls in the step (the pipeline's makespan):
  warm-up    before its first task,
  gaps       between its tasks,
  cool-down  after its last task, until the pipeline's last task ends;
so busy + warm-up + gaps + cool-down = the makespan on every rank. Under 1F1B with uniform
stages rank r idles r·f in its warm-up, r·b in its cool-down and (p − 1 − r)(f + b) in its
gaps: (p − 1)(f + b) in all, on every rank (tests/test_bubble_fill.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .engine import SimResult

# a piece that fits a gap to this share of its length counts as fitting (float sums: a gap
# of 3 forwards holds 3 pieces of one forward's length)
FIT_TOLERANCE = 1e-9


@dataclass(frozen=True, kw_only=True)
class RankIdle:
    """One pipeline rank's idle seconds in the step, and the pieces its gaps hold."""

    warmup_s: float     # before its first task
    gaps_s: float       # between its tasks
    cooldown_s: float   # after its last task, until the pipeline ends
    gap_pieces: int     # pieces of PipelineIdle.piece_s that fit whole in its gaps (0 when none asked)

    @property
    def total_s(self) -> float:
        return self.warmup_s + self.gaps_s + self.cooldown_s


@dataclass(frozen=True, kw_only=True)
class PipelineIdle:
    """Every rank's idle time in a simulated step."""

    makespan_s: float
    piece_s: float  # the piece length gap_pieces counts (0: none)
    ranks: tuple[RankIdle, ...]


def pipeline_idle(result: SimResult, piece_s: float = 0.0) -> PipelineIdle:
    """Each rank's warm-up, gaps and cool-down in `result`, and how many pieces of `piece_s`
    seconds fit whole in its gaps (each gap holds ⌊gap / piece⌋ of them)."""
    graph, start, end = result.timeline
    makespan = result.step_time_s
    ranks = []
    for first, length in zip(graph.first.tolist(), graph.length.tolist()):
        s, e = start[first:first + length], end[first:first + length]  # the rank's list, in run order
        if length == 0:
            ranks.append(RankIdle(warmup_s=makespan, gaps_s=0.0, cooldown_s=0.0, gap_pieces=0))
            continue
        gaps = s[1:] - e[:-1]
        pieces = int(np.floor(gaps / piece_s + FIT_TOLERANCE).sum()) if piece_s > 0 else 0
        ranks.append(RankIdle(warmup_s=float(s[0]), gaps_s=float(gaps.sum()), cooldown_s=makespan - float(e[-1]),
                              gap_pieces=pieces))
    return PipelineIdle(makespan_s=makespan, piece_s=piece_s, ranks=tuple(ranks))


def extrapolated_idle(a: PipelineIdle, b: PipelineIdle, m1: int, m2: int, m: int) -> PipelineIdle:
    """The idle time at m micro-batches on the line through runs of m1 and m2 = 2·m1 (as
    cost/estimate.py extends the makespan): past the warm-up every micro-batch repeats one
    period, so the gaps (and the pieces they hold) grow by the same amount per micro-batch
    and the warm-up and cool-down stay; the pieces rounded down."""
    def line(x1: float, x2: float) -> float:
        return x2 + (m - m2) * (x2 - x1) / m1

    ranks = tuple(RankIdle(warmup_s=line(r1.warmup_s, r2.warmup_s), gaps_s=line(r1.gaps_s, r2.gaps_s),
                           cooldown_s=line(r1.cooldown_s, r2.cooldown_s),
                           gap_pieces=int(np.floor(line(r1.gap_pieces, r2.gap_pieces) + FIT_TOLERANCE)))
                  for r1, r2 in zip(a.ranks, b.ranks))
    return PipelineIdle(makespan_s=line(a.makespan_s, b.makespan_s), piece_s=b.piece_s, ranks=ranks)
