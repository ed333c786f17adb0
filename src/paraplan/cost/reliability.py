"""Training through failures: checkpoint interval, interruptions and goodput of a long run.

A job of N GPUs is interrupted at rate λ·N (λ interruptions per GPU-day), a mean time
between interruptions M = 1/(λ·N). Each checkpoint stalls training for δ seconds; each
interruption costs a restart R plus the work since the last checkpoint, on average half an
interval τ. Wall time per unit of work, to first order:

    wall / work = (1 + δ/τ) / (1 − (R + τ/2)/M)

(the checkpoint stalls, then the share of wall time lost to restarts and redone work); goodput
is its inverse. When R + τ/2 ≥ M the job never makes progress. Its minimum is at

    τ = √(δ² + 2·δ·(M − R)) − δ,

never shorter than one step here: Young's √(2·δ·M) (1974, "A first order approximation to
the optimum checkpoint interval", CACM 17(9)) when δ, R ≪ M, with Daly's −δ correction
(2006, "A higher order estimate of the optimum checkpoint interval", FGCS 22(3)).

δ is the blocking part of an asynchronous checkpoint (PyTorch DCP `async_save`, Megatron
`--async-save`): each GPU copies its model states (weights and optimizer shard, not the
gradients) to host memory over its host link; the write to storage runs in the background.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..units import SECONDS_PER_DAY, SECONDS_PER_HOUR


@dataclass(frozen=True, kw_only=True)
class Reliability:
    """The token budget trained through interruptions (seconds; inf where no progress)."""

    mtbf_s: float                  # mean time between interruptions of the whole job
    checkpoint_s: float            # training stall per checkpoint (δ)
    checkpoint_interval_s: float   # the optimum (≈ Young's), at least one step (τ)
    goodput: float                 # useful training time / wall time (0: no progress)
    wall_time_s: float             # the budget's training time through interruptions
    interruptions: float           # expected interruptions over the wall time
    wall_gpu_hours: float
    wall_usd: float


def reliability(*, num_gpus: int, step_s: float, work_s: float, checkpoint_s: float,
                interruptions_per_gpu_day: float, restart_s: float, usd_per_gpu_hour: float) -> Reliability:
    """The optimal checkpoint interval and the first-order goodput for `work_s` of failure-free
    training."""
    rate = interruptions_per_gpu_day * num_gpus / SECONDS_PER_DAY
    if rate <= 0.0:
        wall = work_s
        return Reliability(mtbf_s=math.inf, checkpoint_s=checkpoint_s, checkpoint_interval_s=math.inf, goodput=1.0,
                           wall_time_s=wall, interruptions=0.0, wall_gpu_hours=wall / SECONDS_PER_HOUR * num_gpus,
                           wall_usd=wall / SECONDS_PER_HOUR * num_gpus * usd_per_gpu_hour)
    mtbf = 1.0 / rate
    d, m_r = checkpoint_s, max(mtbf - restart_s, 0.0)
    interval = max(math.sqrt(d * d + 2.0 * d * m_r) - d, step_s)
    lost = (restart_s + interval / 2.0) / mtbf
    if lost >= 1.0:
        return Reliability(mtbf_s=mtbf, checkpoint_s=checkpoint_s, checkpoint_interval_s=interval, goodput=0.0,
                           wall_time_s=math.inf, interruptions=math.inf, wall_gpu_hours=math.inf, wall_usd=math.inf)
    ratio = (1.0 + checkpoint_s / interval) / (1.0 - lost)
    wall = work_s * ratio
    return Reliability(mtbf_s=mtbf, checkpoint_s=checkpoint_s, checkpoint_interval_s=interval, goodput=1.0 / ratio,
                       wall_time_s=wall, interruptions=wall / mtbf, wall_gpu_hours=wall / SECONDS_PER_HOUR * num_gpus,
                       wall_usd=wall / SECONDS_PER_HOUR * num_gpus * usd_per_gpu_hour)
