"""What if an assumption is off: re-time a plan, and re-rank the best plans, with one hardware
or workload assumption made δ worse and δ better at a time.

A prediction rests on numbers the user may not know for their cluster: the compute rate
sustained over hours (fitted), the attention kernels' efficiency (fitted), the network's
achieved bandwidth (an assumption unless calibrated), the expert load imbalance (an
assumption). Before committing a run, an engineer wants to know which of them the chosen
plan's step time hangs on, and whether another plan would be the better bet if one of them
turns out worse (the regret of keeping the nominal best). Each assumption is scaled where
the cost model reads it (specs), so every number here comes from the same model.

Worse means slower hardware: a rate or bandwidth × (1 − δ); a latency, launch overhead,
overlap slowdown, host time or load imbalance × (1 + δ). Better is the opposite, with
efficiencies capped at 1 and imbalance floored at 1. Memory does not depend on these, except
the routed tokens' activations on the busiest expert rank (imbalance): a plan that stops
fitting under a scenario is not ranked there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Callable, Sequence

from ..cost.estimate import Estimate
from ..cost.moe import load_factor
from ..errors import SpecError
from ..plan.space import PlanBatch
from ..specs.curves import EfficiencyCurve
from ..specs.hardware import ClusterSpec, GPUSpec, LinkTier
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .planner import SIMULATED_PLANS, finished

# how far each assumption moves by default: a step for comparing assumptions with one another,
# not a measured uncertainty (--whatif PCT sets it)
DEFAULT_CHANGE = 0.2
WHATIF_CANDIDATES = SIMULATED_PLANS  # plans re-ranked per scenario: the ones the search simulated
# the fastest plan on a changed cluster and workload (a whole search), None when none fits
SearchAgain = Callable[[ClusterSpec, Workload], Estimate | None]


class Assumption(StrEnum):
    """The assumptions a what-if varies, each scaled where the cost model reads it."""

    COMPUTE = "compute rate"                  # GPUSpec.sustained_compute_ratio: GEMMs and attention
    ATTENTION = "attention kernels"           # GPUSpec.attention_efficiency curves
    HBM = "HBM bandwidth"                     # GPUSpec.hbm_bw_bytes_per_s: element-wise, optimizer, casts
    NVLINK = "NVLink bandwidth"               # ClusterSpec.nvlink.bw_unidir_bytes_per_s
    SCALEOUT = "scale-out bandwidth"          # ClusterSpec.scaleout.bw_unidir_bytes_per_s
    SCALEOUT_LATENCY = "scale-out latency"    # ClusterSpec.scaleout.latency_s
    DCN = "data-centre bandwidth"             # ClusterSpec.dcn.bw_unidir_bytes_per_s (islands)
    OVERLAP = "overlap slowdown"              # GPUSpec.overlap_slowdown
    LAUNCH = "kernel launch overhead"         # GPUSpec.kernel_launch_overhead_s
    HOST = "eager host time"                  # GPUSpec.eager_layer_host_s, zb_*_host_s (calibrated profiles)
    MOE_HOST = "MoE dispatch host time"       # GPUSpec.moe_dispatch_host_s (Megatron's dropless MoE)
    HOST_LINK = "host link bandwidth"         # GPUSpec.host_link_bw_unidir_bytes_per_s (offload, host experts)
    IMBALANCE = "MoE load imbalance"          # Workload.moe_imbalance (dropless MoE)


class Unit(StrEnum):
    """How an assumption's nominal value reads."""

    OF_PEAK = "of peak"            # a fraction of the GPU's peak FLOP/s
    OF_MEASURED = "of measured"    # a fraction of the microbenchmarked rate, sustained in training
    SHARE = "share"                # a plain fraction (of compute lost while a collective overlaps)
    BYTES_PER_S = "bytes/s"
    SECONDS = "s"
    FACTOR = "x"


# higher is worse for these (a delay or a load); for the rest (rates) lower is worse
_HIGHER_IS_WORSE = {Assumption.SCALEOUT_LATENCY, Assumption.OVERLAP, Assumption.LAUNCH, Assumption.HOST,
                    Assumption.MOE_HOST, Assumption.IMBALANCE}


@dataclass(frozen=True, kw_only=True)
class Sensitivity:
    """One assumption: the plan's step time with it δ worse and δ better, and (over several
    plans) the fastest plan under the worse value."""

    assumption: Assumption
    nominal: float               # the assumption's value, in `unit`
    unit: Unit
    worse_value: float           # the value re-timed as worse (a cap can keep it nearer nominal)
    better_value: float
    worse_step_s: float          # the plan's step time with the assumption δ worse
    better_step_s: float
    worse_fits: bool = True      # whether the plan still fits under the worse value
    best_if_worse: Estimate | None = None  # the fastest plan that fits under the worse value
    searched_again: bool = False  # the changed cluster was also searched whole (a plan further down could win)

    def capped(self, change: float, worse: bool) -> bool:
        """Whether the value moved less than `change` (held by its bound)."""
        if not self.nominal:  # nothing to scale (a zero latency or overhead)
            return False
        moved = abs((self.worse_value if worse else self.better_value) / self.nominal - 1.0)
        return moved < change * (1.0 - 1e-9)

    @property
    def regret(self) -> float:
        """How much slower the plan is than the fastest plan under the worse value (0: still best)."""
        if self.best_if_worse is None or not self.worse_fits:
            return 0.0 if self.best_if_worse is None else math.inf
        return max(self.worse_step_s / self.best_if_worse.step_time_s - 1.0, 0.0)


@dataclass(frozen=True, kw_only=True)
class WhatIf:
    change: float                 # δ, a fraction
    plan: Estimate                # the plan in question, at the nominal assumptions
    num_plans: int                # plans re-ranked under each scenario (1: the plan alone)
    rows: tuple[Sensitivity, ...]


def assumptions(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plans) -> tuple[Assumption, ...]:
    """The assumptions that can move these plans on this cluster."""
    out = [Assumption.COMPUTE]
    # the fused-attention curves (an unfused kernel runs on the GEMM curve)
    if any(p.attention in cluster.gpu.attention_efficiency for p in plans):
        out.append(Assumption.ATTENTION)
    out.append(Assumption.HBM)
    if min(cluster.gpus_per_node, cluster.num_gpus) > 1:
        out.append(Assumption.NVLINK)
    if cluster.num_gpus > cluster.gpus_per_node:
        out += [Assumption.SCALEOUT, Assumption.SCALEOUT_LATENCY]
    if cluster.dcn is not None and cluster.gpus_per_island and cluster.num_gpus > cluster.gpus_per_island:
        out.append(Assumption.DCN)
    if cluster.num_gpus > 1:
        out.append(Assumption.OVERLAP)
    out.append(Assumption.LAUNCH)
    # an eager engine's layers (not fused, not compiled) wait for their host
    if cluster.gpu.eager_layer_host_s > 0 and any(not p.fused_kernels and not p.compiled for p in plans):
        out.append(Assumption.HOST)
    # Megatron's dropless MoE layers wait for the host that issues them (cost/stages.py)
    if (model.is_moe and cluster.gpu.moe_dispatch_host_s > 0
            and any(p.fused_kernels and p.capacity_factor is None for p in plans)):
        out.append(Assumption.MOE_HOST)
    # optimizer states offloaded to the host cross its link every step
    if any(p.offload_optimizer for p in plans):
        out.append(Assumption.HOST_LINK)
    # dropless routing over more than one expert-parallel rank (else the load factor is 1 or the
    # capacity), at a stated imbalance (a router as initialized has its own: cost/moe.py)
    if (model.is_moe and not workload.moe_routing_at_init
            and any(p.capacity_factor is None and p.ep > 1 for p in plans)):
        out.append(Assumption.IMBALANCE)
    return tuple(out)


def nominal(assumption: Assumption, cluster: ClusterSpec, workload: Workload, plan) -> tuple[float, Unit]:
    """The assumption's value as the model reads it for `plan`."""
    gpu = cluster.gpu
    match assumption:
        case Assumption.COMPUTE:
            return gpu.sustained_compute_ratio, Unit.OF_MEASURED
        case Assumption.ATTENTION:
            return max(gpu.attention_curve(plan.attention).y) if plan.attention in gpu.attention_efficiency \
                else max(gpu.gemm_efficiency.y), Unit.OF_PEAK
        case Assumption.HBM:
            return gpu.hbm_bw_bytes_per_s, Unit.BYTES_PER_S
        case Assumption.NVLINK:
            return cluster.nvlink.bw_unidir_bytes_per_s, Unit.BYTES_PER_S
        case Assumption.SCALEOUT:
            return cluster.scaleout.bw_unidir_bytes_per_s, Unit.BYTES_PER_S
        case Assumption.SCALEOUT_LATENCY:
            return cluster.scaleout.latency_s, Unit.SECONDS
        case Assumption.DCN:
            return cluster.dcn.bw_unidir_bytes_per_s, Unit.BYTES_PER_S
        case Assumption.OVERLAP:
            return gpu.overlap_slowdown, Unit.SHARE
        case Assumption.LAUNCH:
            return gpu.kernel_launch_overhead_s, Unit.SECONDS
        case Assumption.HOST:
            return gpu.eager_layer_host_s, Unit.SECONDS
        case Assumption.MOE_HOST:
            return gpu.moe_dispatch_host_s, Unit.SECONDS
        case Assumption.HOST_LINK:
            return gpu.host_link_bw_unidir_bytes_per_s, Unit.BYTES_PER_S
        case Assumption.IMBALANCE:  # as the plan's routing reads it: at most its EP (cost/moe.py)
            return float(load_factor(plan, workload.moe_imbalance)), Unit.FACTOR
    raise AssertionError(assumption)  # pragma: no cover - closed enum


def _scaled_curve(curve: EfficiencyCurve, factor: float) -> EfficiencyCurve:
    return EfficiencyCurve(x=curve.x, y=tuple(min(1.0, y * factor) for y in curve.y))


def _scaled(spec: GPUSpec | LinkTier, **scale) -> GPUSpec | LinkTier:
    """`spec` with each named field multiplied by its factor."""
    return replace(spec, **{k: getattr(spec, k) * f for k, f in scale.items()})


def _factor(assumption: Assumption, change: float, worse: bool) -> float:
    """The factor on the assumption's value: 1 + δ where it grows in this scenario, else 1 − δ."""
    return 1.0 + change if (assumption in _HIGHER_IS_WORSE) == worse else 1.0 - change


def scaled_cluster(assumption: Assumption, cluster: ClusterSpec, change: float, worse: bool) -> ClusterSpec:
    """The cluster with a hardware `assumption` moved by `change` (worse or better), within what
    the value can be (an efficiency at most 1)."""
    f = _factor(assumption, change, worse)
    gpu = cluster.gpu
    match assumption:
        case Assumption.COMPUTE:
            # the product with the GEMM curve stays a fraction of peak
            cap = 1.0 / max(max(gpu.gemm_efficiency.y), *(max(c.y) for c in gpu.attention_efficiency.values()))
            return replace(cluster, gpu=replace(gpu, sustained_compute_ratio=min(gpu.sustained_compute_ratio * f, cap)))
        case Assumption.ATTENTION:
            curves = {k: _scaled_curve(c, f) for k, c in gpu.attention_efficiency.items()}
            return replace(cluster, gpu=replace(gpu, attention_efficiency=curves))
        case Assumption.HBM:
            return replace(cluster, gpu=_scaled(gpu, hbm_bw_bytes_per_s=f))
        case Assumption.NVLINK:
            return replace(cluster, nvlink=_scaled(cluster.nvlink, bw_unidir_bytes_per_s=f))
        case Assumption.SCALEOUT:
            return replace(cluster, scaleout=_scaled(cluster.scaleout, bw_unidir_bytes_per_s=f))
        case Assumption.SCALEOUT_LATENCY:
            return replace(cluster, scaleout=_scaled(cluster.scaleout, latency_s=f))
        case Assumption.DCN:
            return replace(cluster, dcn=_scaled(cluster.dcn, bw_unidir_bytes_per_s=f))
        case Assumption.OVERLAP:
            return replace(cluster, gpu=replace(gpu, overlap_slowdown=min(gpu.overlap_slowdown * f, 1.0)))
        case Assumption.LAUNCH:
            return replace(cluster, gpu=_scaled(gpu, kernel_launch_overhead_s=f))
        case Assumption.HOST:  # one host: its split-backward passes scale with it
            return replace(cluster, gpu=replace(_scaled(gpu, eager_layer_host_s=f),
                                                zb_input_host_s=tuple(c * f for c in gpu.zb_input_host_s),
                                                zb_weight_host_s=tuple(c * f for c in gpu.zb_weight_host_s)))
        case Assumption.MOE_HOST:
            return replace(cluster, gpu=_scaled(gpu, moe_dispatch_host_s=f))
        case Assumption.HOST_LINK:
            return replace(cluster, gpu=_scaled(gpu, host_link_bw_unidir_bytes_per_s=f))
    raise AssertionError(f"{assumption} is not a hardware assumption")


def scenario(assumption: Assumption, model: ModelSpec, cluster: ClusterSpec, workload: Workload, change: float,
             worse: bool) -> tuple[ClusterSpec, Workload]:
    """The cluster and workload with `assumption` moved by `change` (worse or better), within
    what the value can be (an efficiency at most 1, the imbalance from 1 to experts/top-k)."""
    if assumption is Assumption.IMBALANCE:
        f = _factor(assumption, change, worse)
        # the busiest rank's load ×(1 ± δ); one rank receiving every token is the most
        most = model.num_experts / model.top_k if model.is_moe else workload.moe_imbalance
        return cluster, replace(workload, moe_imbalance=min(max(1.0, workload.moe_imbalance * f), most))
    return scaled_cluster(assumption, cluster, change, worse), workload


def _retime(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plans) -> list[Estimate]:
    return finished(model, cluster, workload, PlanBatch.from_plans(list(plans)))


def what_if(model: ModelSpec, cluster: ClusterSpec, workload: Workload, ranked: Sequence[Estimate],
            change: float = DEFAULT_CHANGE, search_again: SearchAgain | None = None) -> WhatIf:
    """Each assumption δ worse and δ better for ranked[0]; with more than one plan, the fastest
    plan that fits under the worse value too.

    `ranked` is a search's best plans in order (or one plan). Where making an assumption worse
    makes no plan faster, a plan ranked below them, nominally no faster than the last, cannot
    beat a re-timed plan that is no slower than that: re-timing `ranked` finds the fastest.
    Otherwise (a plan the change hurt less could be further down, or none of them fits any more)
    `search_again` searches the changed cluster and workload whole, where given. The premise
    holds for most plans, not all (docs/model.md, *What if an assumption is off*): a plan that a
    worse value speeds up slightly and that sits just below `ranked` can be missed."""
    if not 0.0 < change < 1.0:
        raise SpecError("what-if", "change", change, "a fraction above 0 and below 1")
    plans = [e.plan for e in ranked]
    last_nominal_s = ranked[-1].step_time_s
    rows = []
    for a in assumptions(model, cluster, workload, plans):
        value, unit = nominal(a, cluster, workload, plans[0])
        changed = scenario(a, model, cluster, workload, change, worse=True)
        improved = scenario(a, model, cluster, workload, change, worse=False)
        worse = _retime(model, *changed, plans)
        better = _retime(model, *improved, plans[:1])
        best, again = None, False
        if len(plans) > 1:
            fit = [e for e in worse if e.fits]
            best = min(fit, key=lambda e: e.step_time_s) if fit else None
            if search_again is not None and (best is None or best.step_time_s > last_nominal_s):
                whole, again = search_again(*changed), True
                # the whole search ranks by its closed form before simulating: keep the faster
                if whole is not None and (best is None or whole.step_time_s < best.step_time_s):
                    best = whole
        rows.append(Sensitivity(assumption=a, nominal=value, unit=unit,
                                worse_value=nominal(a, *changed, plans[0])[0],
                                better_value=nominal(a, *improved, plans[0])[0],
                                worse_step_s=worse[0].step_time_s, better_step_s=better[0].step_time_s,
                                worse_fits=worse[0].fits, best_if_worse=best, searched_again=again))
    return WhatIf(change=change, plan=ranked[0], num_plans=len(plans), rows=tuple(rows))
