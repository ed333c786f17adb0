"""A plan over a mixed cluster (plan/mixed.py): each stage priced on its own GPU group, the
hand-offs between groups resharded (reshard.py), the step timed by the event simulator.

Each stage is priced by the homogeneous cost model (evaluate.py) on its group's cluster, as
a stage of a *proxy* pipeline that holds the stage's layers at every stage: same TP, data
parallelism, micro-batch and policy, the stage's place deciding which of the proxy's stages
it is. The first stage is the proxy's first (embedding, P micro-batches in flight under
1F1B), the last its last (head and loss, one in flight); a middle stage at place s is the
second stage of a proxy P − s + 1 deep, so that it holds P − s micro-batches, as 1F1B's
stage s does (all m under GPipe). Its forward, backward, memory and what it runs after the
pipeline (its data-parallel reduction and optimizer step: the proxy's dp_step_s) are that
proxy stage's. The pipeline is then simulated with every stage's own times and every hop's
own send (sim/engine.py StageCosts.hop_s): within a group the plain pipeline send, between
groups or TP layouts the resharding. A rank's step ends when its own reduction and
optimizer step after its last backward end; the step when the last rank's does.

What is not modelled: interleaved, zero-bubble and V schedules (one chunk per rank only),
context and expert parallelism, ZeRO-2/3 (the proxy prices them, but a stage's gathers
across a group boundary are not), MoE and multi-token-prediction models (their layers are
not uniform), and the allocator replay (each stage's slack is its GPU's fragmentation share).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..errors import SpecError
from ..plan.axes import ZeroStage
from ..plan.mixed import MixedPlan, MixedStage
from ..plan.plan import Plan, make_plan
from ..plan.space import PlanBatch, check_plan
from ..sim.engine import SimResult, StageCosts, simulate_schedule
from ..sim.idle import pipeline_idle
from ..specs.hardware import ClusterSpec
from ..specs.mixed import MixedCluster
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .estimate import PlanRejectedError
from .evaluate import evaluate, layout
from .flops import model_flops_per_token
from .memory import OPTIMIZER_BYTES, WEIGHT_BYTES
from .pipeline import p2p_handoff_s
from .reliability import Reliability, reliability
from .reshard import BoundaryLayout, Resharding, reshard
from .stage_memory import stage_bytes

FIRST, LAST, MIDDLE = 0, 1, 2  # stage_bytes's order (stage_memory.py)


@dataclass(frozen=True, kw_only=True)
class MixedStageCost:
    """One stage as priced on its group: per micro-batch times, what it runs after the
    pipeline, its memory per GPU against the GPU's."""

    group: str
    gpu: str
    tp: int
    layers: int
    forward_s: float
    backward_s: float
    after_pipeline_s: float
    memory_bytes: float
    capacity_bytes: float
    pipeline_send_s: float  # its send to the next stage when both share group and layout
    checkpoint_s: float     # its GPUs' stall copying their share of a checkpoint to host memory

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.capacity_bytes


@dataclass(frozen=True, kw_only=True)
class MixedEstimate:
    """A mixed plan's step: each stage, each hop (None: a plain pipeline send), the pipeline."""

    plan: MixedPlan
    cluster: str
    stages: tuple[MixedStageCost, ...]
    reshardings: tuple[Resharding | None, ...]
    hop_s: tuple[float, ...]
    num_microbatches: int
    step_time_s: float
    tokens_per_s: float
    num_gpus: int
    mfu: float            # model FLOPs / (step × the used GPUs' summed peak)
    usd_per_hour: float   # the used GPUs' hourly price
    power_watts: float    # the used GPUs' summed TDP (the budget's energy: cost/carbon.py)
    with_failures: Reliability  # the token budget through interruptions (cost/reliability.py)
    rank_end_s: tuple[float, ...]  # each rank's last task's end; its after-pipeline work follows
    sim: SimResult

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)



def check_mixed_model(model: ModelSpec) -> None:
    """SpecError unless a mixed pipeline can price `model`: dense, without MTP (uniform layers)."""
    if model.is_moe or model.mtp_layers:
        raise SpecError("mixed plan", "model", model.name,
                        "a dense model without MTP (a mixed pipeline prices uniform layers)")


def check_mixed_plan(model: ModelSpec, mixed: MixedCluster, workload: Workload, plan: MixedPlan) -> int:
    """The plan's micro-batches per step; SpecError where the plan cannot run on `mixed`."""
    check_mixed_model(model)
    if plan.num_layers != model.num_layers:
        raise SpecError("mixed plan", "stages.layers", plan.num_layers, f"{model.num_layers} layers in all")
    for group in mixed.groups:
        used = plan.gpus_of(group.name)
        if used > group.num_gpus:
            raise SpecError("mixed plan", "dp × stage TP", used, f"at most group {group.name!r}'s {group.num_gpus} GPUs")
    for stage in plan.stages:
        mixed.group(stage.group)  # a named group
    per_step = plan.dp * plan.micro_batch_size
    if workload.global_batch_size % per_step:
        raise SpecError("mixed plan", "dp × micro_batch_size", per_step,
                        f"a divisor of the global batch {workload.global_batch_size}")
    return workload.global_batch_size // per_step


def proxy_depth(place: int, num_stages: int) -> tuple[int, int]:
    """(proxy pipeline depth, which of its stages) for a stage at `place` of `num_stages`."""
    if place == 0:
        return num_stages, FIRST
    if place == num_stages - 1:
        return num_stages, LAST
    return num_stages - place + 1, MIDDLE


def proxy_key(plan: MixedPlan, place: int) -> tuple:
    """What prices stage `place` of `plan`: its group, TP, layers, proxy depth and the policy."""
    stage = plan.stages[place]
    depth, _ = proxy_depth(place, plan.pp)
    return (stage.group, stage.tp, stage.layers, depth, plan.dp, plan.micro_batch_size, plan.schedule,
            plan.recompute, plan.zero, plan.sequence_parallel, plan.tp_overlap)


def proxy_plan(cluster: ClusterSpec, *, tp: int, depth: int, dp: int, micro_batch_size: int, schedule, recompute,
               zero, sequence_parallel: bool, tp_overlap: bool) -> Plan:
    """The homogeneous pipeline `depth` deep on `cluster` whose stages a mixed stage is priced
    as: its TP, the pipeline's DP and policy, the GPU's fastest attention kernel."""
    return make_plan(tp=tp, pp=depth, dp=dp, micro_batch_size=micro_batch_size, schedule=schedule,
                     recompute=recompute, zero=zero, sequence_parallel=sequence_parallel and tp > 1,
                     tp_overlap=tp_overlap and tp > 1, attention=cluster.gpu.attention_kernels[-1])


def price_proxies(model: ModelSpec, mixed: MixedCluster, workload: Workload, keys) -> dict:
    """Each proxy_key's (first, last, middle) stages (proxy_stages), or the reason its proxy is
    not a valid plan: one batched evaluation per group, layers and depth (the proxies of a
    search's plans share them)."""
    out: dict = {}
    by_shape: dict = {}
    for key in dict.fromkeys(keys):
        group, _, layers, depth = key[:4]
        by_shape.setdefault((group, layers, depth), []).append(key)
    for (group, layers, depth), shape_keys in by_shape.items():
        cluster = mixed.group(group).cluster
        proxy_model = replace(model, num_layers=layers * depth)
        plans, valid = [], []
        for key in shape_keys:
            _, tp, _, _, dp, mb, schedule, recompute, zero, sp, tpov = key
            proxy = proxy_plan(cluster, tp=tp, depth=depth, dp=dp, micro_batch_size=mb, schedule=schedule,
                               recompute=recompute, zero=zero, sequence_parallel=sp, tp_overlap=tpov)
            rejected = check_plan(proxy, proxy_model, cluster.with_num_gpus(tp * depth * dp), workload)
            if rejected is not None:
                out[key] = f"a stage of TP{tp} with {layers} layers on {cluster.name}: {rejected.reason}"
                continue
            plans.append(proxy)
            valid.append(key)
        if plans:
            out.update(zip(valid, proxy_stages(proxy_model, cluster, workload, PlanBatch.from_plans(plans))))
    return out


def proxy_stages(model: ModelSpec, cluster: ClusterSpec, workload: Workload, batch: PlanBatch) -> list:
    """Per plan of `batch` (homogeneous proxy pipelines), its (first, last, middle) stages as
    (forward, backward, after-pipeline seconds, bytes, pipeline send, checkpoint bytes)."""
    costs = evaluate(model, cluster, workload, batch)
    memory, states = stage_bytes(model, cluster, workload, batch)

    def column(x) -> np.ndarray:
        return np.broadcast_to(np.asarray(x, dtype=float), (len(batch),))

    send = column(p2p_handoff_s(cluster, model, layout(model, workload, batch)))
    after = column(costs.dp_step_s)
    # a checkpoint writes each tensor once over its replicas (DCP dedup, Megatron's fully-parallel
    # save; estimate.py checkpoint_bytes_per_gpu): weights over DP, the optimizer over DP at ZeRO-0
    dp = column(batch.dp)
    zero0 = np.asarray(batch.zero_code) == ZeroStage.NONE.code
    ckpt = [column(w) / dp + column(o) / np.where(zero0, dp, 1.0) for w, o in states]
    stages = [(column(t.forward_s), column(t.backward_s), column(m), c) for t, m, c in
              zip((costs.first, costs.last, costs.middle), memory, ckpt)]
    return [tuple((float(f[i]), float(b[i]), float(after[i]), float(m[i]), float(send[i]), float(c[i]))
                  for f, b, m, c in stages) for i in range(len(batch))]


def _stage_cost(model: ModelSpec, mixed: MixedCluster, workload: Workload, plan: MixedPlan, place: int,
                cache: dict) -> MixedStageCost:
    """Stage `place` of the plan; `cache` keeps proxy stages across the plans of one model,
    cluster and workload (a search prices the same stage in many plans: price_proxies)."""
    stage = plan.stages[place]
    cluster = mixed.group(stage.group).cluster
    key = proxy_key(plan, place)
    if key not in cache:
        cache.update(price_proxies(model, mixed, workload, [key]))
    if isinstance(cache[key], str):
        raise PlanRejectedError(cache[key])
    fwd, bwd, after, memory, send, ckpt = cache[key][proxy_depth(place, plan.pp)[1]]
    return MixedStageCost(group=stage.group, gpu=cluster.gpu.name, tp=stage.tp, layers=stage.layers, forward_s=fwd,
                          backward_s=bwd, after_pipeline_s=after, memory_bytes=memory,
                          capacity_bytes=cluster.gpu.hbm_bytes, pipeline_send_s=send,
                          checkpoint_s=ckpt / cluster.gpu.host_link_bw_unidir_bytes_per_s)


def _layout(plan: MixedPlan, stage: MixedStage) -> BoundaryLayout:
    return BoundaryLayout(tp=stage.tp, sequence_sharded=plan.sequence_parallel and stage.tp > 1)


def boundary_bytes(model: ModelSpec, workload: Workload, micro_batch_size: int) -> float:
    """One micro-batch's activation at a stage boundary: micro-batch × sequence × hidden at the
    workload's activation width (pipeline.p2p_handoff_s's tensor, before any TP split)."""
    return workload.precision.activation_bytes * micro_batch_size * workload.seq_len * model.hidden_size


def _hops(model: ModelSpec, mixed: MixedCluster, workload: Workload, plan: MixedPlan,
          stages: tuple[MixedStageCost, ...]) -> tuple[tuple[Resharding | None, ...], tuple[float, ...]]:
    """Each hop's resharding (None: the group's plain pipeline send) and send time."""
    reshardings: list[Resharding | None] = []
    hop_s: list[float] = []
    for a, b, cost in zip(plan.stages, plan.stages[1:], stages):
        if a.group == b.group and a.tp == b.tp:
            reshardings.append(None)
            hop_s.append(cost.pipeline_send_s)
            continue
        receiver = mixed.group(b.group).cluster
        link = mixed.between_groups if a.group != b.group else receiver.scaleout
        x = boundary_bytes(model, workload, plan.micro_batch_size)
        r = reshard(link, receiver, _layout(plan, a), _layout(plan, b), x)
        reshardings.append(r)
        hop_s.append(r.seconds)
    return tuple(reshardings), tuple(hop_s)


def estimate_mixed(model: ModelSpec, mixed: MixedCluster, workload: Workload, plan: MixedPlan,
                   cache: dict | None = None) -> MixedEstimate:
    """Predict one mixed plan (SpecError / PlanRejectedError where it cannot run); `cache`:
    proxy stages kept across calls with the same model, cluster and workload."""
    m = check_mixed_plan(model, mixed, workload, plan)
    cache = {} if cache is None else cache
    stages = tuple(_stage_cost(model, mixed, workload, plan, place, cache) for place in range(plan.pp))
    reshardings, hop_s = _hops(model, mixed, workload, plan, stages)
    zeros = tuple((0.0,) for _ in stages)
    costs = StageCosts(forward_s=tuple((s.forward_s,) for s in stages), backward_s=tuple((s.backward_s,) for s in stages),
                       weight_s=zeros, p2p_s=0.0, hop_s=hop_s)
    sim = simulate_schedule(plan.schedule, m, costs)
    idle = pipeline_idle(sim)
    rank_end_s = tuple(idle.makespan_s - r.cooldown_s for r in idle.ranks)  # each rank's last task
    step = float(max(end + s.after_pipeline_s for end, s in zip(rank_end_s, stages)))
    tokens = workload.tokens_per_step
    gpus = {g.name: plan.gpus_of(g.name) for g in mixed.groups}
    peak = sum(n * mixed.group(name).cluster.gpu.peak(workload.precision) for name, n in gpus.items())
    usd = sum(n * (workload.usd_per_gpu_hour if workload.usd_per_gpu_hour is not None
                   else mixed.group(name).cluster.usd_per_gpu_hour) for name, n in gpus.items())
    watts = sum(n * mixed.group(name).cluster.gpu.draw_watts for name, n in gpus.items())
    num_gpus = sum(gpus.values())
    train_s = workload.token_budget / tokens * step
    # the slowest stage's checkpoint stall holds every rank (estimate.py prices one cluster so)
    failures = reliability(num_gpus=num_gpus, step_s=step, work_s=train_s,
                           checkpoint_s=max(s.checkpoint_s for s in stages),
                           interruptions_per_gpu_day=workload.interruptions_per_gpu_day,
                           restart_s=workload.restart_s, usd_per_gpu_hour=usd / num_gpus,
                           min_interval_s=model.num_params * (WEIGHT_BYTES + OPTIMIZER_BYTES)
                           / workload.storage_bytes_per_s)
    return MixedEstimate(plan=plan, cluster=mixed.name, stages=stages, reshardings=reshardings, hop_s=hop_s,
                         num_microbatches=m, step_time_s=step, tokens_per_s=tokens / step, num_gpus=num_gpus,
                         mfu=model_flops_per_token(model, workload.seq_len) * tokens / step / peak, usd_per_hour=usd,
                         power_watts=watts, with_failures=failures, rank_end_s=rank_end_s, sim=sim)
