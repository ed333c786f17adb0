"""What the training-engine exporters share: the protocol each follows (`Exporter`), the
exported result, and the helpers of their headers and node counts. The engines themselves
(what each can run, its fixed policy) are an input: specs/engine.py; export/registry.py
finds an engine's exporter.

An exporter never writes a config that silently differs from the plan: a plan feature the
engine cannot express raises `unsupported(...)` (specs/engine.py), a one-line SpecError
naming the field, its value and what the engine allows (the CLI prints it and exits 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..errors import SpecError
from ..plan.plan import Plan
from ..specs.engine import Engine, EngineSupport
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload


@dataclass(frozen=True, kw_only=True)
class ExportResult:
    """An engine config for one plan: the file's name and text, and the launch command."""

    engine: Engine
    plan: Plan
    filename: str             # suggested name of the config file
    text: str                 # the config file (TOML / bash / JSON)
    launcher: str             # one shell line that starts the job
    notes: tuple[str, ...] = field(default=())  # how paraplan's terms map onto the engine's


class Exporter(Protocol):
    """What each engine's export module (torchtitan.py, megatron.py, deepspeed.py) provides."""

    ENGINE: Engine
    SUPPORT: EngineSupport  # the plans the engine runs and the policy it fixes

    def check(self, plan: Plan, model: ModelSpec, workload: Workload) -> None:
        """Raise a one-line SpecError for what the engine cannot express."""

    def export(self, plan: Plan, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
               est: object = None, filename: str = ...) -> ExportResult:
        """The engine's config for `plan` (checked first); `filename` is where it is written
        (-o; each engine has its default), which its launch lines name."""
        ...


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


def header_lines(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, est) -> list[str]:
    """What the file is for, as comment lines (without the comment marker)."""
    from ..units import fmt_bytes
    lines = [f"paraplan export: {model.name} on {plan.num_gpus} x {cluster.gpu.name} ({cluster.name}), "
             f"global batch {workload.global_batch_size} x {workload.seq_len} tokens, {workload.precision_label}",
             f"plan: {plan.describe()}"]
    if est is not None:
        lines.append(f"predicted: step {est.step_time_s:.4g} s, {est.tokens_per_s:,.0f} tokens/s, "
                     f"{fmt_bytes(est.memory.total)} per GPU (worst stage)")
    return lines


