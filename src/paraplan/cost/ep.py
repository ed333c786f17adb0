"""Expert-parallel all-to-all of one (average) layer per micro-batch, and EP overlap.

EP overlap (Megatron-Core --overlap-moe-expert-parallel-comm, after DeepSeek-V3's DualPipe,
Sec. 3.2.1): a forward and a backward micro-batch run merged layer by layer, each layer split
into attention, dispatch, MLP and combine, and each all-to-all of one runs under a compute
block of the other: backward combine under forward attention, forward dispatch under backward
MLP, backward dispatch under forward MLP, forward combine under backward attention. Each pair
takes the longer of the two, so an all-to-all hides only behind its partner, not behind the
whole layer.

Legend: w_moe the share of the stage's layers that are MoE layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from .cp import CPComm
from .layer_compute import LayerCompute
from .layout import Layout
from .moe import MoELayerCosts
from .tp import TPComm


@dataclass(frozen=True, kw_only=True)
class EPComm:
    """A layer's EP all-to-alls per micro-batch (seconds), averaged over the stage's layers."""

    forward_s: Num
    backward_s: Num
    forward_exposed_s: Num
    backward_exposed_s: Num


def ep_comm(lay: Layout, mc: MoELayerCosts | None) -> EPComm:
    """The all-to-alls as moe.py prices them (0 for a dense model)."""
    w_moe, zeros = lay.moe_layer_share, 0.0 * lay.stage_layers
    a2a_fwd, a2a_bwd = (w_moe * mc.a2a_fwd_s, w_moe * mc.a2a_bwd_s) if mc else (zeros, zeros)
    a2a_fwd_exp, a2a_bwd_exp = (w_moe * mc.a2a_fwd_exposed_s, w_moe * mc.a2a_bwd_exposed_s) if mc else (zeros, zeros)
    return EPComm(forward_s=a2a_fwd, backward_s=a2a_bwd, forward_exposed_s=a2a_fwd_exp, backward_exposed_s=a2a_bwd_exp)


def ep_overlapped(plan, lay: Layout, ep: EPComm, lc: LayerCompute, tp: TPComm, cp: CPComm,
                  mc: MoELayerCosts | None) -> EPComm:
    """`ep` with what EP overlap leaves exposed, where the plan overlaps."""
    if not mc:
        return ep
    epov = np.asarray(plan.ep_overlap, dtype=bool)
    n_blk, w_moe = tp.blocks, lay.moe_layer_share
    # an attention block lasts its compute plus the communication its kernels left exposed
    # (the CP exchange, and its share of the TP collectives: one of the n_blk blocks that
    # gather and scatter): the partner all-to-all hides behind that whole block, so a faster
    # kernel that exposes more of those hides as much more of the all-to-all (never less
    # time in all)
    attn_f = (lc.qkv_gemm_s + lc.out_gemm_s + lc.attention_forward_s + lc.elementwise_forward_s
              + cp.forward_exposed_s + tp.forward_exposed_s / n_blk)
    attn_b = (2.0 * (lc.qkv_gemm_s + lc.out_gemm_s) + lc.attention_backward_s + lc.elementwise_backward_s
              + cp.backward_exposed_s + tp.backward_exposed_s / n_blk)
    # dispatch = combine (the dispatch's token counts and router probabilities, a few µs,
    # halved with them); the MoE blocks hold the shared experts, so the all-to-alls pair
    # whole (not net of the shared-expert overlap, which would count those GEMMs twice)
    half_f, half_b = 0.5 * mc.a2a_fwd_s, 0.5 * mc.a2a_bwd_s
    ov_fwd = np.maximum(half_f - mc.bwd_compute_s, 0.0) + np.maximum(half_f - attn_b, 0.0)
    ov_bwd = np.maximum(half_b - attn_f, 0.0) + np.maximum(half_b - mc.fwd_compute_s, 0.0)
    return EPComm(forward_s=ep.forward_s, backward_s=ep.backward_s,
                  forward_exposed_s=np.where(epov, w_moe * ov_fwd, ep.forward_exposed_s),
                  backward_exposed_s=np.where(epov, w_moe * ov_bwd, ep.backward_exposed_s))
