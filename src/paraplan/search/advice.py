"""What would make a plan that does not fit fit, and what frees most in one that does: each
memory lever changed alone, priced.

`paraplan estimate` and `paraplan trace` of a plan over the GPU's memory say which single
change of its flags would fit (full recomputation, a smaller micro-batch, a higher ZeRO
stage, optimizer offload, activation offload where the host link is NVLink-C2C class, twice
the TP, PP or CP on the same GPUs), each estimated with the
cost model, fastest first; none of them is the answer "more GPUs" (the search says that).
Of a plan that fits, `estimate` says how much of the GPU's memory it leaves and which one of
those changes frees the most, at what step time (memory_headroom).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..cost.estimate import Estimate, estimate
from ..cost.evaluate import evaluate
from ..cost.low_precision import LOW_PRECISIONS
from ..errors import ParaplanError
from ..plan.axes import Recompute, RecomputeOps, ZeroStage
from ..plan.plan import Plan
from ..plan.space import C2C_CLASS_BYTES_PER_S, PlanBatch, check_plan, fullest_stage_layers
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from ..units import fmt_bytes, fmt_time


@dataclass(frozen=True)
class FitChange:
    """One change of a plan's flags and its estimate (which fits)."""

    flags: str  # as typed on the command line, e.g. "--recompute full"
    plan: Plan
    estimate: Estimate


def _changes(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan) -> list[tuple[str, Plan]]:
    """(flags, plan) for each lever that lowers memory, changed alone from `plan` (activation
    offload of every layer recomputation leaves, where the search would try it: a host link
    of NVLink-C2C class; FP8 or NVFP4 weights kept quantized, on Transformer Engine with a
    sharded optimizer)."""
    out = []
    if (workload.precision in LOW_PRECISIONS and plan.fused_kernels and not plan.low_precision_params
            and plan.zero is not ZeroStage.NONE):
        out.append(("--low-precision-params", replace(plan, low_precision_params=True)))
    if plan.recompute is not Recompute.FULL:
        out.append(("--recompute full", replace(plan, recompute=Recompute.FULL, recompute_num_layers=0,
                                                recompute_ops=RecomputeOps())))
    mb = plan.micro_batch_size
    for smaller in sorted({1, mb // 2} - {0, mb}):
        out.append((f"--mb {smaller}", replace(plan, micro_batch_size=smaller)))
    for z in ZeroStage:
        if z.code > plan.zero.code and plan.dp > 1:
            out.append((f"--zero {z.value}", replace(plan, zero=z, dp_shard=plan.dp)))
    if not plan.offload_optimizer:
        out.append(("--offload", replace(plan, offload_optimizer=True)))
    if not plan.activation_offload_layers and cluster.offload_bytes_per_s >= C2C_CLASS_BYTES_PER_S:
        layers = int(fullest_stage_layers(model.num_layers, plan.pp)) - (
            plan.recompute_num_layers if plan.recompute is Recompute.FIRST_K else 0)
        if layers > 0:
            out.append((f"--offload-activations {layers}", replace(plan, activation_offload_layers=layers)))
    if plan.dp % 2 == 0:
        sp = plan.sequence_parallel or plan.tp == 1  # (the CLI turns SP on with TP > 1)
        dp = plan.dp // 2
        shard = dp if plan.dp_shard >= plan.dp else min(plan.dp_shard, dp)  # (HSDP keeps its group)
        for name, value in (("tp", plan.tp), ("pp", plan.pp), ("cp", plan.cp)):
            extra = {"sequence_parallel": sp} if name == "tp" else {}
            out.append((f"--{name} {2 * value} --dp {dp}",
                        replace(plan, **{name: 2 * value}, dp=dp, dp_shard=shard, **extra)))
    return out


def _valid_changes(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan,
                   check: Callable[[Plan], None] | None) -> list[tuple[str, Plan]]:
    """The single changes of `plan` (`_changes`) the plan rules allow and `check` (an engine's
    rules, raising for a plan the engine cannot run) accepts."""
    out = []
    for flags, p in _changes(model, cluster, workload, plan):
        if check_plan(p, model, cluster, workload) is not None:
            continue
        try:
            if check is not None:
                check(p)
        except ParaplanError:
            continue
        out.append((flags, p))
    return out


def fitting_changes(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan,
                    check: Callable[[Plan], None] | None = None) -> list[FitChange]:
    """The single valid changes of `plan` that fit on `cluster`, fastest first. At most a
    dozen estimates, each simulated as `paraplan estimate` would (the step it advertises is
    the one the changed flags print)."""
    out = []
    for flags, p in _valid_changes(model, cluster, workload, plan, check):
        try:
            est = estimate(model, cluster, workload, p)
        except ParaplanError:
            continue
        if est.fits:
            out.append(FitChange(flags=flags, plan=p, estimate=est))
    return sorted(out, key=lambda c: c.estimate.step_time_s)


def misfit_advice(model: ModelSpec, cluster: ClusterSpec, workload: Workload, est: Estimate,
                  check: Callable[[Plan], None] | None = None, shown: int = 4) -> tuple[str, list[FitChange]]:
    """One line for a plan that does not fit: why, and the single changes that would fit (or
    that none does); with the changes themselves."""
    changes = fitting_changes(model, cluster, workload, est.plan, check)
    why = f"does not fit: {est.misfit(cluster.gpu.name)}"
    if not changes:
        return (why + "; no single change of recomputation, micro-batch, ZeRO, offload or TP/PP/CP fits: "
                "several together may (`paraplan search` with the axes to keep pinned finds them), or more GPUs "
                "(`paraplan scale`)"), changes
    alts = ", ".join(f"{c.flags} ({fmt_bytes(c.estimate.memory.total)}, step {fmt_time(c.estimate.step_time_s)})"
                     for c in changes[:shown])
    return f"{why}; fits with one change: {alts}", changes


@dataclass(frozen=True)
class Headroom:
    """How close a plan runs to the GPU's memory, and the single change that frees the most."""

    free_bytes: float        # the GPU's memory the plan leaves (its worst stage)
    hbm_bytes: float
    flags: str               # the change that frees the most ("" when none is valid)
    freed_bytes: float       # by that change
    step_ratio: float        # its step time over the plan's, closed form both (cost/evaluate.py)


def memory_headroom(model: ModelSpec, cluster: ClusterSpec, workload: Workload, est: Estimate,
                    check: Callable[[Plan], None] | None = None) -> Headroom:
    """The plan's free memory, and which valid single change (`_valid_changes`) lowers its
    memory most, priced in one batch of the cost model
    with the plan itself (the step ratio compares closed-form steps, the pipeline unsimulated);
    what it frees is the estimate's, with both allocators replayed (cost/lifetimes.py)."""
    valid = _valid_changes(model, cluster, workload, est.plan, check)
    free = est.hbm_bytes - est.memory.total
    if not valid:
        return Headroom(free_bytes=free, hbm_bytes=est.hbm_bytes, flags="", freed_bytes=0.0, step_ratio=1.0)
    costs = evaluate(model, cluster, workload, PlanBatch.from_plans([est.plan] + [p for _, p in valid]))
    # (a change whose offloaded states or activations overflow host DRAM frees nothing usable)
    memory = np.where(cluster.host_memory_holds(np.asarray(costs.host_bytes, dtype=float)),
                      np.asarray(costs.memory.total, dtype=float), np.inf)
    step = np.asarray(costs.step_time_s, dtype=float)
    best = 1 + int(np.argmin(memory[1:]))
    changed = estimate(model, cluster, workload, valid[best - 1][1]).memory.total
    return Headroom(free_bytes=free, hbm_bytes=est.hbm_bytes, flags=valid[best - 1][0],
                    freed_bytes=float(est.memory.total - changed), step_ratio=float(step[best] / step[0]))


def headroom_line(h: Headroom) -> str:
    """One line: the memory a plan leaves, and what frees most."""
    line = f"memory headroom {fmt_bytes(h.free_bytes)} of {fmt_bytes(h.hbm_bytes)} ({100 * h.free_bytes / h.hbm_bytes:.0f}%)"
    if h.flags and h.freed_bytes > 0:
        line += (f"; frees most alone: {h.flags} (−{fmt_bytes(h.freed_bytes)}, step "
                 f"{100 * (h.step_ratio - 1):+.0f}%)")
    return line
