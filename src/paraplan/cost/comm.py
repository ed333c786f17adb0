"""Collective communication cost, hierarchical over the cluster's tiers.

Notation: n group size, B bytes of the full buffer (all-reduce / all-gather output /
reduce-scatter input), g members of the group inside one node (NVLink domain), N nodes
spanned inside one island, I islands spanned. Ring algorithms (Patarasuk & Yuan 2009;
NCCL): reduce-scatter and all-gather move (n−1)/n·B per rank, all-reduce 2(n−1)/n·B.
Hierarchical (NCCL's tree/ring over rails): the NVLink step moves (g−1)/g·B, the network
step (N−1)/N·B/g per GPU over its own NIC, the data-center step (I−1)/I·B/(g·N). Each step adds latency α per ring hop and runs at the
tier's bus bandwidth × efficiency(message bytes) (curves from calibration; all-gather and
reduce-scatter have curves of their own where a calibration measured them apart).

Group layout follows the plan's rank order (plan/axes.py RankOrder; Megatron's default: TP
fastest, then CP, then DP, then PP): a group is described by its size and its stride in global
rank space, or, where the group is not evenly strided, as runs of `block` members `stride`
apart repeated `outer_stride` apart (the data-parallel group CP×DP when the pipeline sits
between CP and DP: CP ranks t apart, DP replicas t·c·p apart).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from ..plan.placement import members_within, pipeline_crossings
from ..specs.hardware import ClusterSpec, LinkTier


class Collective(StrEnum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"                    # flat: every rank to every rank at once
    P2P = "send-recv"


def group_span(cluster: ClusterSpec, group_size, stride, block=None, outer_stride=None):
    """(g, N, I): members per node, nodes per island, islands spanned by the group (evenly
    strided, or in runs of `block` repeated `outer_stride` apart: plan/placement.py members_within)."""
    n = np.asarray(group_size, dtype=float)
    g = members_within(cluster.gpus_per_node, group_size, stride, block, outer_stride).astype(float)
    if cluster.gpus_per_island and cluster.dcn is not None:
        gi = members_within(cluster.gpus_per_island, group_size, stride, block, outer_stride).astype(float)
    else:
        gi = n
    nodes = np.maximum(gi / g, 1.0)
    islands = np.maximum(n / gi, 1.0)
    return g, nodes, islands


def _step(tier: LinkTier, members, bytes_moved_per_rank, msg_bytes, op: str = ""):
    """One ring phase over `members` ranks of a tier: latency per hop + bytes / bus bw (at
    collective `op`'s efficiency where the tier has it apart)."""
    members = np.asarray(members, dtype=float)
    bw = tier.bw_unidir_bytes_per_s * tier.curve(op).at(msg_bytes)
    t = tier.latency_s * (members - 1.0) + bytes_moved_per_rank / bw
    return np.where(members > 1.0, t, 0.0)


def _hop(tier: LinkTier, members, bytes_moved_per_rank, msg_bytes):
    """One all-to-all phase: every send posted at once, so one latency, then bytes / bus bw."""
    members = np.asarray(members, dtype=float)
    bw = tier.bw_unidir_bytes_per_s * tier.efficiency.at(msg_bytes)
    return np.where(members > 1.0, tier.latency_s + bytes_moved_per_rank / bw, 0.0)


def _gather_or_scatter_s(cluster: ClusterSpec, num_bytes, group_size, stride, op: str = "",
                         block=None, outer_stride=None):
    """Hierarchical reduce-scatter (or, symmetric, all-gather) time of a B-byte buffer; `op`
    picks a per-collective efficiency curve ("all_gather", "reduce_scatter"; "" the all-reduce's)."""
    B = np.asarray(num_bytes, dtype=float)
    g, N, I = group_span(cluster, group_size, stride, block, outer_stride)
    t = _step(cluster.nvlink, g, (g - 1.0) / g * B, B, op)
    t = t + _step(cluster.scaleout, N, (N - 1.0) / N * B / g, B / g, op)
    if cluster.dcn is not None:
        t = t + _step(cluster.dcn, I, (I - 1.0) / I * B / (g * N), B / (g * N), op)
    return t


def collective_time_s(cluster: ClusterSpec, kind: Collective, num_bytes, group_size, stride,
                      block=None, outer_stride=None):
    """Time of one collective over a strided group (vectorized over numpy arrays); a group in
    runs of `block` members repeated `outer_stride` apart where both are given (reductions)."""
    n = np.asarray(group_size)
    B = np.asarray(num_bytes, dtype=float)
    if block is not None and kind not in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_REDUCE):
        raise ValueError(f"{kind} over runs of ranks is not modelled")
    if kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        t = _gather_or_scatter_s(cluster, B, n, stride, "all_gather" if kind is Collective.ALL_GATHER else "reduce_scatter",
                                 block, outer_stride)
    elif kind is Collective.ALL_REDUCE:
        # all-reduce = reduce-scatter + all-gather: the 2·(n−1)/n lives here, once.
        t = 2.0 * _gather_or_scatter_s(cluster, B, n, stride, "", block, outer_stride)
    elif kind is Collective.ALL_TO_ALL:
        # B is one rank's buffer, B/n to each peer. NCCL posts every send at once: (g−1)/n of
        # B goes over NVLink while (n−g)/n crosses the network, concurrently, in messages of B/n.
        # Across islands, (n − g·N)/n of B crosses the data-center tier at the same time (every
        # GPU sends its share: the tier's per-GPU rate), the rest of the network part stays in the island.
        g, N, I = group_span(cluster, n, stride)
        nn = np.asarray(n, dtype=float)
        t = np.maximum(_hop(cluster.nvlink, g, (g - 1.0) / nn * B, B / nn),
                       _hop(cluster.scaleout, N, (g * N - g) / nn * B, B / nn))
        if cluster.dcn is not None:
            t = np.maximum(t, _hop(cluster.dcn, I, (nn - g * N) / nn * B, B / nn))
    elif kind is Collective.P2P:
        t = p2p_time_s(cluster, B, stride)
    else:  # pragma: no cover - closed enum
        raise AssertionError(kind)
    return np.where(n > 1, t, 0.0) if np.ndim(t) else (float(t) if n > 1 else 0.0)


def deduplicated_dispatch_s(cluster: ClusterSpec, row_bytes, nodes_hit, ranks_hit, group_size, stride):
    """One MoE dispatch (or combine) over the EP group that sends each token once to each node
    and once to each GPU holding any of its routed experts, not once per expert: DeepEP's
    normal kernels (Megatron-Core's flex dispatcher) send it by RDMA to the GPU of the same
    local index on each other destination node, which forwards it over NVLink to the node's
    GPUs that need it; the combine reduces within the node and returns it once (DeepEP
    README; DeepSeek-V3 report Sec. 3.2.2). `row_bytes` is the rank's tokens once each,
    `nodes_hit` and `ranks_hit` the distinct nodes and GPUs of the group a token's experts are
    on (cost/moe.py units_hit). A token reaches the other (N·I − 1) of the N·I nodes with
    probability (N·I − 1)/(N·I) per node it needs; every GPU it needs but the one it lands on
    takes it over NVLink, (g − 1)/g of them. The NVLink forwarding runs concurrently with the
    network (chunked). Vectorized."""
    B = np.asarray(row_bytes, dtype=float)
    g, N, I = group_span(cluster, group_size, stride)
    nodes = N * I
    hit_n, hit_r = np.asarray(nodes_hit, dtype=float), np.asarray(ranks_hit, dtype=float)
    t = np.maximum(_hop(cluster.nvlink, g, B * hit_r * (g - 1.0) / g, B * hit_r / (g * nodes)),
                   _hop(cluster.scaleout, N, B * hit_n * (N - 1.0) / nodes, B * hit_n / nodes))
    if cluster.dcn is not None:
        t = np.maximum(t, _hop(cluster.dcn, I, B * hit_n * (I - 1.0) / I, B * hit_n / nodes))
    return np.where(np.asarray(group_size) > 1, t, 0.0)


def p2p_time_s(cluster: ClusterSpec, num_bytes, stride):
    """Point-to-point send of B bytes to the rank `stride` away (pipeline neighbours)."""
    B = np.asarray(num_bytes, dtype=float)
    st = np.asarray(stride)
    def one(tier: LinkTier):
        return tier.latency_s + B / (tier.bw_unidir_bytes_per_s * tier.efficiency.at(B))
    t = np.where(st < cluster.gpus_per_node, one(cluster.nvlink), one(cluster.scaleout))
    if cluster.dcn is not None and cluster.gpus_per_island:
        t = np.where(st >= cluster.gpus_per_island, one(cluster.dcn), t)
    return t


def send_s(tier: LinkTier, num_bytes, rate_scale=1.0):
    """One point-to-point send of `num_bytes` over `tier`: latency + bytes / (bandwidth ×
    `rate_scale` × efficiency at that size)."""
    B = np.asarray(num_bytes, dtype=float)
    return tier.latency_s + B / (tier.bw_unidir_bytes_per_s * rate_scale * tier.efficiency.at(B))


def pipeline_hops_s(cluster: ClusterSpec, num_bytes, p, stride, block, v=1, replicas=1, spacing=0):
    """(mean, sum, slowest) time of a pipeline's hand-offs of `num_bytes`, stages `stride`
    ranks apart and each stage `block` consecutive ranks of one pipeline (pipeline_crossings),
    over its p·v − 1 hops: v·(p − 1) down the pipeline and, interleaved (v > 1), v − 1 from the
    last rank back to the first (which leaves a domain exactly where some hop does), for the
    slowest of `replicas` pipelines `spacing` ranks apart (pipeline_crossings). A hop inside a
    node goes over NVLink, one to another node over the scale-out network, one to another
    island over the data-center tier. The data-center
    tier's per-GPU rate is what each GPU gets when all of an island's GPUs cross at once (an
    oversubscribed core); a pipeline hop sends from the GPUs of one stage only, min(island,
    stride) of them, which share the island's uplinks: each gets the tier's rate × island /
    senders, at most its NIC's scale-out rate. Vectorized."""
    p = np.asarray(p, dtype=float)
    st = np.asarray(stride, dtype=float)
    v = np.asarray(v, dtype=float)
    hops = v * (p - 1.0) + (v - 1.0)
    def crossing(D):
        n = pipeline_crossings(p, st, block, D, replicas, spacing)
        return v * n + (v - 1.0) * (n > 0)
    n_node = crossing(cluster.gpus_per_node)
    near = send_s(cluster.nvlink, num_bytes)
    far = send_s(cluster.scaleout, num_bytes)
    if cluster.dcn is not None and cluster.gpus_per_island:
        I = float(cluster.gpus_per_island)
        n_isl = crossing(cluster.gpus_per_island)
        pooled = np.minimum(I / np.minimum(st, I),
                            cluster.scaleout.bw_unidir_bytes_per_s / cluster.dcn.bw_unidir_bytes_per_s)
        across = send_s(cluster.dcn, num_bytes, np.maximum(pooled, 1.0))
    else:
        n_isl, across = np.zeros_like(hops), far
    total = (hops - n_node) * near + (n_node - n_isl) * far + n_isl * across
    slowest = np.where(n_isl > 0, across, np.where(n_node > 0, far, near))
    return total / np.maximum(hops, 1.0), total, slowest
