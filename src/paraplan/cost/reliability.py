"""Training through failures: checkpoint interval, interruptions and goodput of a long run.

A job of N GPUs is interrupted at rate λ·N (λ interruptions per GPU-day, a Poisson process),
a mean time between interruptions M = 1/(λ·N). Each checkpoint stalls training for δ
seconds; each interruption costs a restart R and the work since the last checkpoint. Daly
(2006, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS
22(3), Eq. 13) gives the expected wall time of T_s seconds of work checkpointed every τ:

    T_w = M · e^{R/M} · (e^{(τ+δ)/M} − 1) · T_s / τ

Goodput is T_s / T_w. The τ that minimizes it solves e^{x + δ/M}·(1 − x) = 1 for x = τ/M
(bisection; R does not move it), never shorter than one step here; when δ, R ≪ M it is
Young's √(2·δ·M) (1974, "A first order approximation to the optimum checkpoint interval",
CACM 17(9)).

δ is the blocking part of an asynchronous checkpoint (PyTorch DCP `async_save`, Megatron
`--async-save`): each GPU copies its share of the model states (its optimizer shard, and its
1/replicas slice of weights that data-parallel ranks replicate: DCP and Megatron's
fully-parallel save write each replicated tensor once) to host memory over its host link;
the write to storage runs in the background and must finish within τ (the storage floor).
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
    checkpoint_interval_s: float   # Daly's optimum (≈ Young's), at least one step (τ)
    goodput: float                 # useful training time / wall time
    wall_time_s: float             # the budget's training time through interruptions
    interruptions: float           # expected interruptions over the wall time
    wall_gpu_hours: float
    wall_usd: float


def reliability(*, num_gpus: int, step_s: float, work_s: float, checkpoint_s: float,
                interruptions_per_gpu_day: float, restart_s: float, usd_per_gpu_hour: float,
                min_interval_s: float = 0.0) -> Reliability:
    """The optimal checkpoint interval and the goodput for `work_s` of failure-free training;
    `min_interval_s` is the time storage needs to take one checkpoint."""
    rate = interruptions_per_gpu_day * num_gpus / SECONDS_PER_DAY
    if rate <= 0.0:  # no interruptions assumed
        mtbf, interval, ratio = math.inf, math.inf, 1.0
    elif not 1.0 / rate > 0.0:  # a rate past the float range: interrupted all the time
        mtbf, interval, ratio = 0.0, max(step_s, min_interval_s), math.inf
    else:
        mtbf = 1.0 / rate
        d = checkpoint_s / mtbf
        lo, hi = 0.0, 1.0  # e^{x+d}(1 − x) − 1 falls from e^d − 1 > 0 at x = 0 to −1 at x = 1
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if mid < 1.0 and mid + d + math.log1p(-mid) > 0.0:  # in logs: no overflow when d is huge
                lo = mid
            else:
                hi = mid
        interval = max(lo * mtbf, step_s, min_interval_s)
        try:
            ratio = mtbf * math.exp(restart_s / mtbf) * math.expm1((interval + checkpoint_s) / mtbf) / interval
        except OverflowError:  # interruptions far more often than a restart or an interval: no progress
            ratio = math.inf
    wall = work_s * ratio
    gpu_hours = wall / SECONDS_PER_HOUR * num_gpus
    return Reliability(mtbf_s=mtbf, checkpoint_s=checkpoint_s, checkpoint_interval_s=interval, goodput=1.0 / ratio,
                       wall_time_s=wall, interruptions=wall * rate, wall_gpu_hours=gpu_hours,
                       wall_usd=gpu_hours * usd_per_gpu_hour)
