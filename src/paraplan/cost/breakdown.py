"""Costs as value types that add: every printed total is the sum of its parts.

Fields may be floats (one plan) or numpy arrays (a batch of plans).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..num import scalar


class _Parts:
    def parts(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def total(self):
        return sum(getattr(self, f.name) for f in fields(self))

    def __add__(self, other):
        return type(self)(**{k: v + getattr(other, k) for k, v in self.parts().items()})

    def scalar(self, i: int | None = None):
        """The i-th plan of a batch (or the float version of a single plan)."""
        return type(self)(**{k: scalar(v, i or 0) for k, v in self.parts().items()})


@dataclass(frozen=True, kw_only=True)
class TimeBreakdown(_Parts):
    """Seconds per optimizer step on the critical path (exposed time only)."""

    compute_s: float
    recompute_s: float
    tp_comm_s: float       # exposed tensor-parallel collectives
    cp_comm_s: float       # exposed context-parallel K/V exchange (ring, all-gather or all-to-all)
    ep_comm_s: float       # exposed expert-parallel all-to-all (MoE dispatch and combine)
    pp_comm_s: float       # exposed pipeline send/recv (fill and drain)
    dp_comm_s: float       # exposed data-parallel / ZeRO / FSDP collectives
    bubble_s: float        # pipeline bubble (idle time of the critical stage)
    optimizer_s: float     # optimizer step (and host offload traffic)
    host_wait_s: float = 0.0  # the GPU idle while an eager engine's host issues kernels (host.eager_host_wait)
    offload_s: float = 0.0    # exposed copies of offloaded activations to and from host memory
    bubble_work_s: float = 0.0  # extra per-step work (--bubble-work-*) the bubbles did not hide (cost/bubble_fill.py)


@dataclass(frozen=True, kw_only=True)
class OverlappedComm(_Parts):
    """Communication hidden behind compute (reported, not added to the step)."""

    tp_comm_s: float
    cp_comm_s: float
    ep_comm_s: float
    dp_comm_s: float
    offload_s: float = 0.0    # activation copies to and from host memory under compute


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown(_Parts):
    """Bytes per GPU on the worst pipeline stage."""

    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    logits_bytes: float
    comm_buffers_bytes: float
    fragmentation_bytes: float
    reserved_bytes: float

    def fits_in(self, capacity_bytes: float):
        return self.total <= capacity_bytes

    @property
    def model_states_bytes(self):
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes
