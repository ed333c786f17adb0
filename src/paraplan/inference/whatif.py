"""What if a hardware assumption is off, for a serving deployment: the deployment re-estimated
(lone-request TTFT and TPOT, throughput at maximum load, the rate within the targets and the
GPUs the traffic needs) with one assumption δ worse and δ better at a time, as `search
--whatif` does for training (search/whatif.py: the same assumptions, moved the same way).

Decode streams the weights and the KV cache, so it hangs on the HBM bandwidth; prefill on the
compute rate; a tensor-parallel replica on NVLink. Memory depends on none of them."""

from __future__ import annotations

from dataclasses import dataclass

from ..search.whatif import Assumption, Unit, nominal, scaled_cluster
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from .deploy import EngineLimits, Traffic
from .planner import ServeEstimate, estimate_plan


@dataclass(frozen=True, kw_only=True)
class ServeSensitivity:
    assumption: Assumption
    nominal: float
    unit: Unit
    worse: ServeEstimate
    better: ServeEstimate


@dataclass(frozen=True, kw_only=True)
class ServeWhatIf:
    change: float
    base: ServeEstimate
    rows: tuple[ServeSensitivity, ...]


def serve_assumptions(cluster: ClusterSpec, est: ServeEstimate) -> tuple[Assumption, ...]:
    """The hardware assumptions the serving step model reads for this deployment (inference/step.py)."""
    plan = est.plan
    out = [Assumption.COMPUTE, Assumption.ATTENTION, Assumption.HBM]
    if plan.gpus_per_replica > 1:  # TP all-reduces, PP sends
        out.append(Assumption.NVLINK)
    # a pipeline send whose next stage starts another node crosses the network (step.py _hop_s)
    if plan.pp > 1 and plan.gpus_per_replica > cluster.gpus_per_node:
        out += [Assumption.SCALEOUT, Assumption.SCALEOUT_LATENCY]
    if est.memory.host_bytes > 0:  # experts held in host memory, fetched on a miss
        out.append(Assumption.HOST_LINK)
    out.append(Assumption.LAUNCH)
    return tuple(out)


def serve_what_if(model: ModelSpec, cluster: ClusterSpec, base: ServeEstimate, traffic: Traffic,
                  limits: EngineLimits, change: float) -> ServeWhatIf:
    """`base` (a deployment estimated on `cluster`) re-estimated with each assumption moved."""
    rows = []
    for a in serve_assumptions(cluster, base):
        if a is Assumption.ATTENTION:  # the serving step runs the GPU's newest fused kernel
            value, unit = max(cluster.gpu.attention_curve(cluster.gpu.attention_kernels[-1]).y), Unit.OF_PEAK
        else:  # a hardware value: neither the workload nor the plan is read
            value, unit = nominal(a, cluster, None, None)
        est = {w: estimate_plan(model, scaled_cluster(a, cluster, change, worse=w), base.plan, traffic, limits)
               for w in (True, False)}
        rows.append(ServeSensitivity(assumption=a, nominal=value, unit=unit, worse=est[True], better=est[False]))
    return ServeWhatIf(change=change, base=base, rows=tuple(rows))
