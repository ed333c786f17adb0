"""What the training-engine exporters share: the engine enum, what each engine can run
(search bounds and the framework's fixed policy knobs), the exported result, and the
choice of plan (the one given, or the best one the engine can run).

An exporter never writes a config that silently differs from the plan: a plan feature the
engine cannot express raises `unsupported(...)`, a one-line SpecError naming the field,
its value and what the engine allows (the CLI prints it and exits 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Callable

from ..errors import NoPlanFitsError, SpecError
from ..plan.axes import ZeroStage
from ..plan.plan import Plan
from ..plan.space import SpaceLimits, without_fsdp_autocast
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload


class Engine(StrEnum):
    TORCHTITAN = "torchtitan"
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"


@dataclass(frozen=True, kw_only=True)
class EngineSupport:
    """What one engine runs: the search bounds of its plan space, and the framework policy
    (Plan fields that are not searched but set to what the framework does)."""

    engine: Engine
    limits: SpaceLimits
    grad_reduce_fp32: bool
    checkpoint_early_stop: bool
    tp_async_backward: bool
    fsdp2_copies: bool = False  # ZeRO >= 1 runs on FSDP2 (Plan.fsdp2_copies); ZeRO-0 on DDP, without them
    fused_kernels: bool = True  # Megatron / TE's fused layer and loss (Plan.fused_kernels)
    compiled: bool = False      # the eager blocks under torch.compile (Plan.compiled)
    # without FSDP (DDP or one device) the engine trains fp32 parameters under torch.autocast
    # (Plan.autocast; torchtitan's maybe_enable_amp), per plan (plan/space.py without_fsdp_autocast)
    autocast_without_fsdp: bool = False
    pinned: dict = field(default_factory=dict)  # axes the search holds fixed (e.g. {"pp": 1})
    pin_reason: str = ""  # why, for the error when the pins leave no valid plan
    trains_mtp: bool = False    # builds multi-token-prediction modules (Megatron-Core --mtp-num-layers)
    # the ZeRO stage a plan from flags gets when --zero is not given and the plan has data or
    # context parallelism to shard over (torchtitan: FSDP over them all by default)
    default_zero: Callable[[Plan], ZeroStage] = lambda plan: ZeroStage.NONE
    # a model the engine cannot build at all: the one-line error, or None (checked before a search)
    model_refusal: Callable[[ModelSpec], SpecError | None] = lambda model: None

    def adapt(self, plan: Plan) -> Plan:
        """The plan with this framework's fixed policy knobs (the CLI never sets them)."""
        return replace(plan, grad_reduce_fp32=self.grad_reduce_fp32, checkpoint_early_stop=self.checkpoint_early_stop,
                       tp_async_backward=self.tp_async_backward,
                       fsdp2_copies=self.fsdp2_copies and plan.zero is not ZeroStage.NONE, fp32_params=False,
                       fused_kernels=self.fused_kernels, compiled=self.compiled,
                       autocast=bool(without_fsdp_autocast(self.autocast_without_fsdp, plan.tp, plan.pp,
                                                           plan.zero.code, plan.dp_shard, plan.cp)))

    def search_limits(self) -> SpaceLimits:
        return self.with_policy(self.limits)

    def with_policy(self, limits: SpaceLimits) -> SpaceLimits:
        """`limits` with this framework's fixed policy knobs (what `adapt` sets on a plan)."""
        return replace(limits, grad_reduce_fp32=self.grad_reduce_fp32,
                       checkpoint_early_stop=self.checkpoint_early_stop, tp_async_backward=self.tp_async_backward,
                       fsdp2_copies=self.fsdp2_copies, fused_kernels=self.fused_kernels, compiled=self.compiled,
                       autocast_without_fsdp=self.autocast_without_fsdp, fp32_params=False)


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """An engine config for one plan: the file's name and text, and the launch command."""

    engine: Engine
    plan: Plan
    filename: str             # suggested name of the config file
    text: str                 # the config file (TOML / bash / JSON)
    launcher: str             # one shell line that starts the job
    notes: tuple[str, ...] = field(default=())  # how paraplan's terms map onto the engine's


def unsupported(engine: Engine, field_name: str, value: object, allowed: str) -> SpecError:
    """The one-line error for a plan feature the engine cannot express."""
    return SpecError(f"engine {engine}", field_name, value, f"{engine} allows {allowed}")


def engine_module(engine: Engine):
    """The export module of `engine` (its SUPPORT, check and export)."""
    if engine is Engine.TORCHTITAN:
        from . import torchtitan as mod
    elif engine is Engine.MEGATRON:
        from . import megatron as mod
    else:
        from . import deepspeed as mod
    return mod


def engine_support(mod, no_compile: bool = False) -> EngineSupport:
    """The engine's support (mod.SUPPORT); with `no_compile` (--no-compile) its blocks run
    eager, and async TP, which needs torch.compile, is not searched. Only an engine that
    compiles (torchtitan) takes the flag."""
    support = mod.SUPPORT
    if not no_compile:
        return support
    if not support.compiled:
        raise unsupported(support.engine, "--no-compile", True,
                          "its blocks as they are: --no-compile is for torchtitan, which compiles them")
    return replace(support, compiled=False, limits=replace(support.limits, tp_overlap=(False,)))


def check_model(support: EngineSupport, model: ModelSpec) -> None:
    """An engine whose models train no multi-token-prediction module refuses a model with
    one, naming the flag that drops it (its prediction would price modules it never runs):
    before a search, which would otherwise rank plans the exporter refuses one by one."""
    if model.mtp_layers and not support.trains_mtp:
        raise unsupported(support.engine, "mtp_layers", model.mtp_layers,
                          f"0: its {model.name} trains no multi-token-prediction module (--mtp-layers 0)")


def refuse_model(support: EngineSupport, model: ModelSpec) -> None:
    """A model the engine cannot build at all (its exporter refuses it too): before a search.
    The plan checks (`check`) judge only the mesh, for any model."""
    refusal = support.model_refusal(model)
    if refusal is not None:
        raise refusal


def check_optimizer(engine: Engine, workload: Workload) -> None:
    """The engines here step their fused Adam (Megatron/DeepSpeed FusedAdam, torchtitan's
    default fused implementation): a prediction for another optimizer would not match."""
    from ..specs.workload import Optimizer
    if workload.optimizer is not Optimizer.ADAM:
        raise unsupported(engine, "--optimizer", workload.optimizer.value, "adam (its fused Adam kernel)")


def nodes_and_gpus_per_node(plan: Plan, cluster: ClusterSpec) -> tuple[int, int]:
    """(nodes, GPUs per node) of the job, the plan's GPUs packed into full nodes."""
    per_node = min(cluster.gpus_per_node, plan.num_gpus)
    if plan.num_gpus % per_node:
        raise SpecError("export", "num_gpus", plan.num_gpus,
                        f"a multiple of the {cluster.gpus_per_node} GPUs per node of {cluster.name} is required")
    return plan.num_gpus // per_node, per_node


def slot_counted_split(model: ModelSpec, plan: Plan) -> tuple[int, int, int] | None:
    """(layers per chunk, embedding slot, loss slot) of a split with PP×VP chunks of equal
    slots, the loss and then the embedding taking a layer's slot where l does not divide, as
    cost/evaluate.py end_chunk_slots lays them out (Megatron-Core's account-for flags,
    torchtitan's first/last-stage-less-layers); None where more slots are spare or MTP
    modules take some (only a per-stage layout says that)."""
    chunks = plan.pp * plan.vp
    slots = -(-model.num_layers // chunks) * chunks - model.num_layers
    if slots > 2 or (slots and model.mtp_layers):
        return None
    return (model.num_layers + slots) // chunks, int(slots == 2), int(slots >= 1)


# ranked plans a search inside an engine's bounds keeps for the exporter's own check to pick from
ENGINE_CANDIDATES = 64


def expressible(ranked: list, model: ModelSpec, workload: Workload, support: EngineSupport,
                check: Callable[[Plan, ModelSpec, Workload], None]) -> list:
    """The ranked estimates whose plans pass the exporter's check, in order; none is a
    NoPlanFitsError that says why the fastest was refused."""
    keep, reasons = [], []
    for est in ranked:
        try:
            check(est.plan, model, workload)
        except SpecError as e:
            reasons.append(str(e))
            continue
        keep.append(est)
    if not keep:
        raise NoPlanFitsError(f"none of the {len(ranked)} fastest plans that fit can be expressed in "
                              f"{support.engine}; first reason: {reasons[0] if reasons else 'none'}")
    return keep


def best_exportable(model: ModelSpec, cluster: ClusterSpec, workload: Workload, support: EngineSupport,
                    check: Callable[[Plan, ModelSpec, Workload], None]):
    """The fastest plan that fits and that the engine can express: search inside the engine's
    bounds, then the first ranked plan that passes the exporter's own check."""
    from ..search.planner import PIN_FLAGS, search
    try:
        res = search(model, cluster, workload, limits=support.search_limits(), fixed=support.pinned,
                     top_k=ENGINE_CANDIDATES)
    except SpecError as e:
        # the search explains a pin that leaves no plan as the user's flag; here the engine pinned it
        pinned = {PIN_FLAGS.get(k, k): k for k in support.pinned}
        if e.where != "search" or e.field not in pinned:
            raise
        raise SpecError(f"engine {support.engine}", "model", model.name,
                        f"{support.engine} runs {pinned[e.field]}={e.value} only ({support.pin_reason}): no plan of "
                        f"{model.name} on {cluster.num_gpus} GPUs with global batch {workload.global_batch_size} "
                        f"is valid there") from None
    return expressible(res.ranked, model, workload, support, check)[0]


def header_lines(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, est) -> list[str]:
    """What the file is for, as comment lines (without the comment marker)."""
    from ..units import fmt_bytes
    lines = [f"paraplan export: {model.name} on {plan.num_gpus} x {cluster.gpu.name} ({cluster.name}), "
             f"global batch {workload.global_batch_size} x {workload.seq_len} tokens, {workload.precision}",
             f"plan: {plan.describe()}"]
    if est is not None:
        lines.append(f"predicted: step {est.step_time_s:.4g} s, {est.tokens_per_s:,.0f} tokens/s, "
                     f"{fmt_bytes(est.memory.total)} per GPU (worst stage)")
    return lines


