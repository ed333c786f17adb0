"""JSON-ready dicts of results (SI units, keys carry their units)."""

from __future__ import annotations

import math
from dataclasses import asdict

from ..cost.estimate import Estimate
from ..plan.plan import plan_fields


def plan_dict(plan) -> dict:
    d = plan_fields(plan)
    d["describe"] = plan.describe()
    return d


def _no_inf(d: dict) -> dict:
    """JSON has no infinity: an unbounded quantity (no failures: MTBF) becomes null."""
    return {k: _no_inf(v) if isinstance(v, dict) else (None if isinstance(v, float) and math.isinf(v) else v)
            for k, v in d.items()}


def estimate_dict(est: Estimate) -> dict:
    return {
        "plan": plan_dict(est.plan),
        "num_gpus": est.num_gpus,
        "num_microbatches": est.num_microbatches,
        "step_time_s": est.step_time_s,
        "tokens_per_s": est.tokens_per_s,
        "tokens_per_s_per_gpu": est.tokens_per_s_per_gpu,
        "mfu": est.mfu,
        "hfu": est.hfu,
        "model_tflops_per_gpu": est.model_tflops_per_gpu,
        "time_breakdown_s": est.time_parts(),
        "overlapped_comm_s": est.overlapped.parts(),
        "exposed_comm_by_collective_s": est.comm_detail,
        "memory_bytes": {**est.memory.parts(), "total_bytes": est.memory.total},
        "hbm_bytes": est.hbm_bytes,
        "host_bytes": est.host_bytes,
        "host_capacity_bytes": est.host_capacity_bytes,
        "fits": est.fits,
        "budget": _no_inf(asdict(est.budget)),
    }
