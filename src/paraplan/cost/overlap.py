"""A layer's time per micro-batch with its communication overlapped (docs/model.md, "What overlaps").

ZeRO traffic hides behind the whole layer as it runs (compute + its exposed TP/CP), so faster
compute can never expose more time than it saves. Overlapped communication slows concurrent
compute by the GPU's `overlap_slowdown`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from .cp import CPComm
from .ep import EPComm
from .tp import TPComm
from .zero import ZeroTraffic


@dataclass(frozen=True, kw_only=True)
class LayerTimes:
    """A layer's time per micro-batch with its exposed communication (seconds)."""

    forward_s: Num
    backward_s: Num
    zero_forward_exposed_s: Num
    zero_backward_exposed_s: Num
    ep_forward_exposed_s: Num   # the exposed EP all-to-alls in forward_s and backward_s
    ep_backward_exposed_s: Num


def layer_times(slowdown: float, forward_compute_s, backward_compute_s, tp: TPComm, cp: CPComm, ep: EPComm,
                z: ZeroTraffic) -> LayerTimes:
    """A layer's forward and backward: compute, exposed TP/CP/EP/ZeRO traffic, the slowdown
    of what overlaps, and FSDP2's copies."""
    fwd_comp, bwd_comp = forward_compute_s, backward_compute_s
    z3_fwd_exp = np.maximum(z.forward_s - (fwd_comp + tp.forward_exposed_s + cp.forward_exposed_s
                                           + ep.forward_exposed_s), 0.0)
    z3_bwd_exp = np.maximum(z.backward_s - (bwd_comp + tp.backward_exposed_s + cp.backward_exposed_s
                                            + ep.backward_exposed_s), 0.0)
    overlapped_per_layer_fwd = ((tp.forward_s - tp.forward_exposed_s) + (cp.forward_s - cp.forward_exposed_s)
                                + (z.forward_s - z3_fwd_exp) + (ep.forward_s - ep.forward_exposed_s))
    overlapped_per_layer_bwd = ((tp.backward_s - tp.backward_exposed_s) + (cp.backward_s - cp.backward_exposed_s)
                                + (z.backward_s - z3_bwd_exp) + (ep.backward_s - ep.backward_exposed_s))
    slow_fwd = slowdown * np.minimum(overlapped_per_layer_fwd, fwd_comp)
    slow_bwd = slowdown * np.minimum(overlapped_per_layer_bwd, bwd_comp)
    return LayerTimes(
        forward_s=(fwd_comp + tp.forward_exposed_s + cp.forward_exposed_s + ep.forward_exposed_s + z3_fwd_exp
                   + slow_fwd + z.fsdp2_forward_s),
        backward_s=(bwd_comp + tp.backward_exposed_s + cp.backward_exposed_s + ep.backward_exposed_s + z3_bwd_exp
                    + slow_bwd + z.fsdp2_backward_s + z.grad_compression_s),
        zero_forward_exposed_s=z3_fwd_exp, zero_backward_exposed_s=z3_bwd_exp,
        ep_forward_exposed_s=ep.forward_exposed_s, ep_backward_exposed_s=ep.backward_exposed_s)
