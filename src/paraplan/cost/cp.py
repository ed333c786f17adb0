"""Context-parallel K/V exchange of one layer per micro-batch (CP ranks sit t apart).

The ring exchange of K/V overlaps the attention kernel of the previous ring step; the K/V
all-gather and Ulysses all-to-alls are exposed.

Legend: c context-parallel degree, t tensor-parallel degree, T tokens per micro-batch on one
CP rank, qd query width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from ..plan.axes import CPCommType
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from .comm import Collective, collective_time_s, p2p_time_s
from .layer_compute import LayerCompute
from .layout import Layout


@dataclass(frozen=True, kw_only=True)
class CPComm:
    """A layer's CP exchange per micro-batch (seconds): full and exposed, forward and backward."""

    forward_s: Num
    backward_s: Num
    forward_exposed_s: Num
    backward_exposed_s: Num
    comm_type_code: Num     # plan.cp_comm_type_code


def _ring_s(cluster: ClusterSpec, lay: Layout, lc: LayerCompute, kv_bytes):
    """(full forward, exposed forward, exposed backward) of the p2p ring.

    p2p ring (Liu et al. 2023; Megatron-Core's default): c−1 steps, each K/V chunk sent
    under the previous step's attention kernel; backward passes K/V and returns dK/dV.
    Every step waits for the ring's slowest hop: the network once the group leaves the node
    (t·c GPUs > one node), the data-center tier once it leaves the island."""
    t, c = lay.tp, lay.cp
    span = t * c
    ring_stride = np.where(span > cluster.gpus_per_node, cluster.gpus_per_node, t)
    if cluster.gpus_per_island and cluster.dcn is not None:
        ring_stride = np.where(span > cluster.gpus_per_island, cluster.gpus_per_island, ring_stride)
    ring_fwd = (c - 1.0) * p2p_time_s(cluster, kv_bytes, ring_stride)
    ring_fwd_exp = np.maximum(ring_fwd - lc.attention_forward_s * (c - 1.0) / c, 0.0)
    ring_bwd_exp = np.maximum(2.0 * ring_fwd - lc.attention_backward_s * (c - 1.0) / c, 0.0)
    return ring_fwd, ring_fwd_exp, ring_bwd_exp


def cp_comm(cluster: ClusterSpec, model: ModelSpec, plan, lay: Layout, lc: LayerCompute) -> CPComm:
    """A layer's K/V exchange under the plan's CP communication type."""
    t, c, T, ab = lay.tp, lay.cp, lay.tokens_per_microbatch, lay.act_bytes_per_element
    qd = model.q_dim
    # this rank's K and V: T tokens × (K + V width)/t (2k·d; MLA its up-projected K and V, a·d_qk + a·d_v)
    kv_bytes = ab * T * model.kv_pair_dim / t
    cpc = np.asarray(plan.cp_comm_type_code)
    ring_fwd, ring_fwd_exp, ring_bwd_exp = _ring_s(cluster, lay, lc, kv_bytes)
    # all-gather (Llama 3, Dubey et al. 2024 Sec. 3.3.2: "the all-gather communication latency
    # is exposed in the critical path"): gather every rank's K/V before attention (Transformer
    # Engine's AttnFuncWithCPAndKVAllGather, Megatron --cp-comm-type allgather); backward
    # gathers again and reduce-scatters dK/dV. All exposed.
    kv_ag = collective_time_s(cluster, Collective.ALL_GATHER, c * kv_bytes, c, t)
    kv_rs = collective_time_s(cluster, Collective.REDUCE_SCATTER, c * kv_bytes, c, t)
    ag_fwd_exp = kv_ag
    ag_bwd_exp = kv_ag + kv_rs
    # all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023 Sec. 3): Q, K, V from sequence shards
    # to head shards before the kernel, the output back after it; backward the same volumes
    # in reverse. Nothing to hide behind: all exposed. One rank's buffer per all-to-all.
    a2a_qkv = collective_time_s(cluster, Collective.ALL_TO_ALL, ab * T * (qd + model.kv_pair_dim) / t, c, t)
    a2a_out = collective_time_s(cluster, Collective.ALL_TO_ALL, ab * T * qd / t, c, t)
    uly = a2a_qkv + a2a_out
    is_ag = cpc == CPCommType.ALL_GATHER.code
    is_a2a = cpc == CPCommType.A2A.code
    on = c > 1
    return CPComm(
        forward_s=np.where(on, np.where(is_ag, kv_ag, np.where(is_a2a, uly, ring_fwd)), 0.0),
        backward_s=np.where(on, np.where(is_ag, kv_ag + kv_rs, np.where(is_a2a, uly, 2.0 * ring_fwd)), 0.0),
        forward_exposed_s=np.where(on, np.where(is_ag, ag_fwd_exp, np.where(is_a2a, uly, ring_fwd_exp)), 0.0),
        backward_exposed_s=np.where(on, np.where(is_ag, ag_bwd_exp, np.where(is_a2a, uly, ring_bwd_exp)), 0.0),
        comm_type_code=cpc)
