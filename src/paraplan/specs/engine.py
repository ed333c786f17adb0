"""Training engines as an input, like a cluster: which engine runs the job, what plans it can
run (the bounds of its search space) and the framework policy it fixes (Plan fields that are
not searched but set to what the framework does).

Each engine's own bounds (its SUPPORT) sit beside its exporter (export/torchtitan.py,
megatron.py, deepspeed.py), whose config writer they describe; export/registry.py finds
them by engine. An engine's bounds are a part of the plan space, so this module reads
plan/'s vocabulary (the one module of specs/ that does; it never reads cost/ or search/).

A plan feature the engine cannot express raises `unsupported(...)`, a one-line SpecError
naming the field, its value and what the engine allows (the CLI prints it and exits 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Callable

from ..errors import SpecError
from ..plan.axes import ZeroStage
from ..plan.plan import Plan
from ..plan.space import SpaceLimits, without_fsdp_autocast
from .model import ModelSpec
from .workload import Optimizer, Workload


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
    compiled_loss: bool = False  # and the loss (Plan.compiled_loss)
    loss_parallel: bool = False  # an eager loss over TP op by op (Plan.loss_parallel)
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
                       grad_buffer_16bit=False, eager_elementwise=False,
                       fused_kernels=self.fused_kernels, compiled=self.compiled, compiled_loss=self.compiled_loss,
                       loss_parallel=self.loss_parallel,
                       autocast=bool(without_fsdp_autocast(self.autocast_without_fsdp, plan.tp, plan.pp,
                                                           plan.zero.code, plan.dp_shard, plan.cp)))

    def search_limits(self) -> SpaceLimits:
        return self.with_policy(self.limits)

    def with_policy(self, limits: SpaceLimits) -> SpaceLimits:
        """`limits` with this framework's fixed policy knobs (what `adapt` sets on a plan)."""
        return replace(limits, grad_reduce_fp32=self.grad_reduce_fp32,
                       checkpoint_early_stop=self.checkpoint_early_stop, tp_async_backward=self.tp_async_backward,
                       fsdp2_copies=self.fsdp2_copies, fused_kernels=self.fused_kernels, compiled=self.compiled,
                       compiled_loss=self.compiled_loss, loss_parallel=self.loss_parallel,
                       autocast_without_fsdp=self.autocast_without_fsdp, fp32_params=False,
                       grad_buffer_16bit=False, eager_elementwise=False)

    def with_plan_default_zero(self, plan: Plan, zero_given: bool) -> Plan:
        """`plan` with the engine's own ZeRO default where the user gave no ZeRO stage and the
        plan has data or context parallelism to shard over (`default_zero`)."""
        if zero_given or plan.dp * plan.cp == 1:
            return plan
        return replace(plan, zero=self.default_zero(plan))  # dp_shard is already dp (make_plan)

    def without_compile(self) -> EngineSupport:
        """The engine with its blocks eager (--no-compile): async TP, which needs
        torch.compile, is not searched. Only an engine that compiles (torchtitan) takes it."""
        if not self.compiled:
            raise unsupported(self.engine, "--no-compile", True,
                              "its blocks as they are: --no-compile is for torchtitan, which compiles them")
        return replace(self, compiled=False, compiled_loss=False, limits=replace(self.limits, tp_overlap=(False,)))


def unsupported(engine: Engine, field_name: str, value: object, allowed: str) -> SpecError:
    """The one-line error for a plan feature the engine cannot express."""
    return SpecError(f"engine {engine}", field_name, value, f"{engine} allows {allowed}")


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
    if workload.optimizer is not Optimizer.ADAM:
        raise unsupported(engine, "--optimizer", workload.optimizer.value, "adam (its fused Adam kernel)")
