"""A plan over a mixed cluster (specs/mixed.py): a pipeline whose stages sit on GPU groups,
each stage with its own tensor-parallel degree and number of layers, replicated `dp` times.

Every stage runs the same micro-batches (one global batch, `dp` replicas of the pipeline), so
the data-parallel degree is the pipeline's; a group lends dp × Σ tp of its stages GPUs. The
rest of the policy (schedule, recomputation, ZeRO stage, sequence parallelism) is the
pipeline's, as engines set it once per job.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from ..errors import SpecError
from .axes import Recompute, Schedule, ZeroStage

# the schedules a mixed pipeline runs: one chunk per rank (a stage per GPU group's ranks)
MIXED_SCHEDULES = (Schedule.ONE_F_ONE_B, Schedule.GPIPE)
MIXED_RECOMPUTES = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
MIXED_ZERO = (ZeroStage.NONE, ZeroStage.OPTIMIZER)


@dataclass(frozen=True, kw_only=True)
class MixedStage:
    """One pipeline stage: the group its GPUs come from, its TP degree, its layers."""

    group: str
    tp: int
    layers: int

    def __post_init__(self) -> None:
        for name in ("tp", "layers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError("mixed plan", f"stage.{name}", v, "an integer >= 1")


@dataclass(frozen=True, kw_only=True)
class MixedPlan:
    dp: int
    micro_batch_size: int
    stages: tuple[MixedStage, ...]
    schedule: Schedule = Schedule.ONE_F_ONE_B
    recompute: Recompute = Recompute.NONE
    zero: ZeroStage = ZeroStage.OPTIMIZER
    sequence_parallel: bool = True
    tp_overlap: bool = False  # TP communication overlapped with the GEMMs (Megatron --tp-comm-overlap)

    def __post_init__(self) -> None:
        for name in ("dp", "micro_batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError("mixed plan", name, v, "an integer >= 1")
        if len(self.stages) < 2:
            raise SpecError("mixed plan", "stages", len(self.stages), "at least 2 pipeline stages")
        for name, value, allowed in (("schedule", self.schedule, MIXED_SCHEDULES),
                                     ("recompute", self.recompute, MIXED_RECOMPUTES),
                                     ("zero", self.zero, MIXED_ZERO)):
            if value not in allowed:
                raise SpecError("mixed plan", name, str(value), f"one of {', '.join(str(a) for a in allowed)}")

    @property
    def pp(self) -> int:
        return len(self.stages)

    @property
    def num_layers(self) -> int:
        return sum(s.layers for s in self.stages)

    def gpus_of(self, group: str) -> int:
        """GPUs the plan takes from `group`: dp replicas of its stages' TP groups."""
        return self.dp * sum(s.tp for s in self.stages if s.group == group)

    def describe(self) -> str:
        """e.g. `DP16 mb1 1f1b rc:full zero1 SP | h100 TP8 ×4 [22,22,22,22] | a100 TP8 ×4 [3,3,3,3]`."""
        head = (f"DP{self.dp} mb{self.micro_batch_size} {self.schedule} rc:{self.recompute} zero{self.zero.value}"
                + (" SP" if self.sequence_parallel else "") + (" tpov" if self.tp_overlap else ""))
        runs = []
        for (group, tp), stages in groupby(self.stages, key=lambda s: (s.group, s.tp)):
            layers = [s.layers for s in stages]
            runs.append(f"{group} TP{tp} ×{len(layers)} [{','.join(map(str, layers))}]")
        return " | ".join([head] + runs)
