"""Cross-mesh resharding: an activation handed from one pipeline stage to the next when the
two lay it out differently (Zhuang et al., "On Optimizing the Communication of Model
Parallelism", MLSys 2023: the hand-off is a many-to-many multicast between two device
meshes).

A boundary activation of X bytes (micro-batch × sequence × hidden, 16-bit) lies over a
stage's TP group in one of two ways: split along the sequence over the t ranks (sequence
parallelism: rank i holds the i-th 1/t) or whole on every rank (replicated). The receiving
stage needs its own layout. Two ways to deliver it, the cheaper one taken:

- send each piece once, then gather locally (the paper's Sec. 3 insight, and Megatron-LM's
  scatter/gather of pipeline sends, Narayanan et al. SC'21 Sec. 4.1): every element crosses
  the boundary once, spread over min(t_src, t_dst) sender-receiver pairs (one NIC each), so
  X / min(t_src, t_dst) per link; a receiver that needs the whole tensor then all-gathers it
  with its TP group over its own NVLink;
- send each receiver all it needs (no local step): a replicated receiver gets all of X
  across the boundary, t_dst/t_src receivers per sender.

The volumes are exact for these layouts (tests check them tile by tile); the time is the
link's (comm.send_s: latency + bytes / bandwidth at the message's efficiency), as every send
in paraplan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..specs.hardware import ClusterSpec, LinkTier
from .comm import Collective, collective_time_s, send_s


@dataclass(frozen=True)
class BoundaryLayout:
    """How a stage's TP group holds the boundary activation."""

    tp: int
    sequence_sharded: bool  # SP (rank i: the i-th 1/tp of the sequence); else whole on every rank


@dataclass(frozen=True, kw_only=True)
class Resharding:
    """One boundary hand-off of one micro-batch's activation (or its gradient, back)."""

    strategy: str           # "send once + local all-gather", "send once" or "send to each receiver"
    crossing_bytes: float   # bytes over the boundary in all
    per_link_bytes: float   # bytes through the busiest NIC (one per GPU) of either side
    local_bytes: float      # bytes each receiver gathers from its own TP group afterwards
    seconds: float


def crossing_volumes(src: BoundaryLayout, dst: BoundaryLayout, tensor_bytes: float) -> tuple[float, float, float]:
    """(crossing, busiest NIC, each receiver's local gather) bytes sending each piece once:
    a sender sends X / t_src, a receiver takes X / t_dst, so the busiest carries
    X / min(t_src, t_dst)."""
    links = min(src.tp, dst.tp)
    gather = 0.0 if dst.sequence_sharded or dst.tp == 1 else tensor_bytes * (dst.tp - 1) / dst.tp
    return tensor_bytes, tensor_bytes / links, gather


def direct_volumes(src: BoundaryLayout, dst: BoundaryLayout, tensor_bytes: float) -> tuple[float, float]:
    """(crossing, busiest NIC) bytes sending each receiver all it needs from across."""
    need = tensor_bytes / dst.tp if dst.sequence_sharded else tensor_bytes
    crossing = need * dst.tp
    # the busiest NIC: a sender's share of all that crosses, or a receiver's own need
    return crossing, max(crossing / src.tp, need)


def reshard(link: LinkTier, receiver: ClusterSpec, src: BoundaryLayout, dst: BoundaryLayout,
            tensor_bytes: float) -> Resharding:
    """The cheaper of the two deliveries over `link` (per GPU, one way) into `receiver`'s
    TP group."""
    crossing, per_link, gather = crossing_volumes(src, dst, tensor_bytes)
    local_s = float(collective_time_s(receiver, Collective.ALL_GATHER, tensor_bytes, dst.tp, 1)) if gather else 0.0
    once = Resharding(strategy="send once + local all-gather" if gather else "send once", crossing_bytes=crossing,
                      per_link_bytes=per_link, local_bytes=gather, seconds=float(send_s(link, per_link)) + local_s)
    if not gather:
        return once
    d_crossing, d_link = direct_volumes(src, dst, tensor_bytes)
    direct = Resharding(strategy="send to each receiver", crossing_bytes=d_crossing, per_link_bytes=d_link,
                        local_bytes=0.0, seconds=float(send_s(link, d_link)))
    return once if once.seconds <= direct.seconds else direct
