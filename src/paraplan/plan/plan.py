"""A parallel plan (frozen) and its validation. An invalid plan is a value: Rejected."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .axes import Recompute, Schedule, ZeroStage


@dataclass(frozen=True, kw_only=True)
class Plan:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    vp: int = 1  # virtual pipeline stages (model chunks) per pipeline rank
    micro_batch_size: int = 1
    schedule: Schedule = Schedule.ONE_F_ONE_B
    recompute: Recompute = Recompute.NONE
    recompute_num_layers: int = 0  # only for Recompute.FIRST_K: layers per stage recomputed
    sequence_parallel: bool = False
    zero: ZeroStage = ZeroStage.NONE
    dp_shard: int = 0  # shard group size for ZeRO; equals dp unless HSDP (set by `make_plan`)
    offload_optimizer: bool = False
    dp_overlap: bool = True
    tp_overlap: bool = False
    # FlashAttention (Dao et al.) never stores the s×s score matrix; 2021–22 Megatron did.
    flash_attention: bool = True

    # numeric codes, so that the cost model reads Plan and PlanBatch alike
    @property
    def schedule_code(self) -> int:
        return self.schedule.code

    @property
    def recompute_code(self) -> int:
        return self.recompute.code

    @property
    def zero_code(self) -> int:
        return self.zero.code

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def num_microbatches(self, workload: Workload) -> int:
        return workload.global_batch_size // (self.dp * self.micro_batch_size)

    def describe(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"DP{self.dp}"]
        if self.cp > 1:
            parts.append(f"CP{self.cp}")
        if self.vp > 1:
            parts.append(f"VP{self.vp}")
        parts.append(f"mb{self.micro_batch_size}")
        if self.pp > 1:
            parts.append(str(self.schedule))
        if self.sequence_parallel:
            parts.append("SP")
        rc = str(self.recompute)
        if self.recompute is Recompute.FIRST_K:
            rc = f"first{self.recompute_num_layers}"
        parts.append(f"rc:{rc}")
        if self.zero is not ZeroStage.NONE:
            z = f"zero{self.zero}"
            if self.dp_shard != self.dp:
                z += f"/hsdp{self.dp_shard}"
            parts.append(z)
        if self.offload_optimizer:
            parts.append("offload")
        if self.tp_overlap:
            parts.append("tpov")
        return " ".join(parts)


def make_plan(**kw) -> Plan:
    """Plan with dp_shard defaulting to dp (full sharding when ZeRO is on)."""
    p = Plan(**kw)
    if p.dp_shard == 0:
        p = replace(p, dp_shard=p.dp)
    return p


@dataclass(frozen=True)
class Rejected:
    """A plan that cannot run, and why."""

    reason: str


def check_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> Rejected | None:
    """Return Rejected(reason) if the plan is invalid for this model/cluster/workload."""
    t, p, d, c, v = plan.tp, plan.pp, plan.dp, plan.cp, plan.vp
    for name in ("tp", "pp", "dp", "cp", "vp", "micro_batch_size"):
        if getattr(plan, name) < 1:
            return Rejected(f"{name}={getattr(plan, name)} must be >= 1")
    if plan.num_gpus != cluster.num_gpus:
        return Rejected(f"TP×PP×DP×CP = {t}×{p}×{d}×{c} = {plan.num_gpus} GPUs, "
                        f"but the cluster has {cluster.num_gpus}")
    if model.num_heads % t or model.num_kv_heads % t:
        if not (model.num_heads % t == 0 and t % model.num_kv_heads == 0):
            return Rejected(f"TP={t} must divide heads={model.num_heads} and kv_heads={model.num_kv_heads}")
    if model.ffn_hidden_size % t:
        return Rejected(f"TP={t} must divide ffn_hidden={model.ffn_hidden_size}")
    if model.num_layers % (p * v):
        return Rejected(f"PP×VP = {p}×{v} must divide layers={model.num_layers}")
    if v > 1 and plan.schedule not in (Schedule.INTERLEAVED_1F1B, Schedule.BREADTH_FIRST):
        return Rejected(f"VP={v} needs the interleaved or bfs schedule, not {plan.schedule}")
    if v > 1 and p == 1:
        return Rejected("VP>1 needs PP>1")
    if workload.global_batch_size % (d * plan.micro_batch_size):
        return Rejected(f"global batch {workload.global_batch_size} is not a multiple of "
                        f"DP×micro-batch = {d}×{plan.micro_batch_size}")
    m = plan.num_microbatches(workload)
    if plan.schedule is Schedule.INTERLEAVED_1F1B and v > 1 and m % p:
        return Rejected(f"interleaved 1F1B needs micro-batches ({m}) to be a multiple of PP={p}")
    if workload.seq_len % (2 * c) and c > 1:
        return Rejected(f"CP={c} needs seq_len={workload.seq_len} divisible by 2×CP (load-balanced chunks)")
    if plan.sequence_parallel and t == 1:
        return Rejected("sequence parallelism needs TP>1")
    if plan.tp_overlap and not plan.sequence_parallel:
        return Rejected("TP communication overlap needs sequence parallelism")
    if plan.recompute is Recompute.FIRST_K:
        per_stage = model.num_layers // p
        if not (0 < plan.recompute_num_layers < per_stage):
            return Rejected(f"recompute_num_layers={plan.recompute_num_layers} must be in 1..{per_stage - 1}"
                            " (layers per stage − 1)")
    if plan.dp_shard < 1 or d % plan.dp_shard:
        return Rejected(f"dp_shard={plan.dp_shard} must divide DP={d}")
    if plan.dp_shard != d and plan.zero is not ZeroStage.PARAMETERS:
        return Rejected("a shard group smaller than DP (HSDP) needs ZeRO-3")
    if plan.offload_optimizer and plan.zero is ZeroStage.NONE and d > 1:
        pass  # offloading a replicated optimizer is allowed (DeepSpeed ZeRO-Offload needs ZeRO>=1 though)
    return None
