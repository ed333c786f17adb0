"""Collective communication cost, hierarchical over the cluster's tiers.

Notation: n group size, B bytes of the full buffer (all-reduce / all-gather output /
reduce-scatter input), g members of the group inside one node (NVLink domain), N nodes
spanned inside one island, I islands spanned. Ring algorithms (Patarasuk & Yuan 2009;
NCCL): reduce-scatter and all-gather move (n−1)/n·B per rank, all-reduce 2(n−1)/n·B.
Hierarchical (NCCL's tree/ring over rails; Tutel's 2D scheme for all-to-all): the NVLink
step moves (g−1)/g·B, the network step (N−1)/N·B/g per GPU over its own NIC, the
data-center step (I−1)/I·B/(g·N). Each step adds latency α per ring hop and runs at the
tier's bus bandwidth × efficiency(message bytes) (curves from calibration; all-gather and
reduce-scatter have curves of their own where a calibration measured them apart).

Group layout follows Megatron's rank order (TP fastest, then CP, then DP, then PP): a group
is described by its size and its stride in global rank space.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from ..specs.hardware import ClusterSpec, LinkTier


class Collective(StrEnum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"                    # flat: every rank to every rank at once
    ALL_TO_ALL_2D = "hierarchical all-to-all"    # Tutel: intra-node first, then across nodes
    P2P = "send-recv"


def _members_within(domain_gpus: int, group_size, stride):
    """Members of a strided group that share one domain (node or island) of `domain_gpus`."""
    n = np.asarray(group_size)
    st = np.asarray(stride)
    within = np.maximum(1, domain_gpus // np.maximum(st, 1))
    return np.minimum(n, within)


def group_span(cluster: ClusterSpec, group_size, stride):
    """(g, N, I): members per node, nodes per island, islands spanned by the group."""
    n = np.asarray(group_size, dtype=float)
    g = _members_within(cluster.gpus_per_node, group_size, stride).astype(float)
    if cluster.gpus_per_island and cluster.dcn is not None:
        gi = _members_within(cluster.gpus_per_island, group_size, stride).astype(float)
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


def _gather_or_scatter_s(cluster: ClusterSpec, num_bytes, group_size, stride, op: str = ""):
    """Hierarchical reduce-scatter (or, symmetric, all-gather) time of a B-byte buffer; `op`
    picks a per-collective efficiency curve ("all_gather", "reduce_scatter"; "" the all-reduce's)."""
    B = np.asarray(num_bytes, dtype=float)
    g, N, I = group_span(cluster, group_size, stride)
    t = _step(cluster.nvlink, g, (g - 1.0) / g * B, B, op)
    t = t + _step(cluster.scaleout, N, (N - 1.0) / N * B / g, B / g, op)
    if cluster.dcn is not None:
        t = t + _step(cluster.dcn, I, (I - 1.0) / I * B / (g * N), B / (g * N), op)
    return t


def collective_time_s(cluster: ClusterSpec, kind: Collective, num_bytes, group_size, stride):
    """Time of one collective over a strided group (vectorized over numpy arrays)."""
    n = np.asarray(group_size)
    B = np.asarray(num_bytes, dtype=float)
    if kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        t = _gather_or_scatter_s(cluster, B, n, stride, "all_gather" if kind is Collective.ALL_GATHER else "reduce_scatter")
    elif kind is Collective.ALL_REDUCE:
        # all-reduce = reduce-scatter + all-gather: the 2·(n−1)/n lives here, once.
        t = 2.0 * _gather_or_scatter_s(cluster, B, n, stride)
    elif kind is Collective.ALL_TO_ALL:
        # B is one rank's buffer, B/n to each peer. NCCL posts every send at once: (g−1)/n of
        # B goes over NVLink while (n−g)/n crosses the network, concurrently, in messages of B/n.
        g, N, I = group_span(cluster, n, stride)
        nn = np.asarray(n, dtype=float)
        t = np.maximum(_hop(cluster.nvlink, g, (g - 1.0) / nn * B, B / nn),
                       _hop(cluster.scaleout, N, (nn - g) / nn * B, B / nn))
    elif kind is Collective.ALL_TO_ALL_2D:
        # Tutel (Hwang et al. 2023, Sec. 3.3): an intra-node all-to-all groups each GPU's tokens
        # by destination node ((g−1)/g·B over NVLink, messages B/g), then one all-to-all across
        # nodes ((N−1)/N·B per GPU, messages B/N): the same network bytes in g× larger messages.
        g, N, I = group_span(cluster, n, stride)
        t = (_hop(cluster.nvlink, g, (g - 1.0) / g * B, B / g)
             + _hop(cluster.scaleout, N, (N - 1.0) / N * B, B / N))
    elif kind is Collective.P2P:
        t = p2p_time_s(cluster, B, stride)
    else:  # pragma: no cover - closed enum
        raise AssertionError(kind)
    return np.where(n > 1, t, 0.0) if np.ndim(t) else (float(t) if n > 1 else 0.0)


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


def pipeline_crossings(p, stride, block, gpus_per_node):
    """How many of a pipeline's p − 1 sends leave a node (vectorized). Consecutive stages sit
    `stride` ranks apart and each stage of one pipeline holds `block` consecutive ranks (TP×CP
    in training, whose DP replicas interleave; TP in serving). Where the block divides the node,
    node boundaries fall between stages: min(p − 1, ⌊(p·stride − 1)/G⌋) of the sends cross. Where
    it does not, a send crosses if the two stages' ranks span two nodes (an upper bound in
    training, where another replica may be the one crossing). Every send crosses once the
    stride reaches a node."""
    p = np.asarray(p, dtype=float)
    st = np.asarray(stride, dtype=float)
    blk = np.asarray(block, dtype=float)
    G = float(gpus_per_node)
    out = np.where(st >= G, p - 1.0, np.minimum(p - 1.0, np.floor((p * st - 1.0) / G)))
    odd = (st < G) & (np.mod(G, np.maximum(blk, 1.0)) != 0) & (p > 1)
    if np.any(odd):
        count = np.zeros(np.shape(out))
        for i in range(1, int(np.max(np.where(odd, p, 1)))):
            spans = np.floor(((i + 1) * st - 1.0) / G) > np.floor((i - 1) * st / G)
            count = count + np.where(odd & (i < p), spans, False)
        out = np.where(odd, count, out)
    return out if np.ndim(out) else float(out)


def pipeline_send_times_s(cluster: ClusterSpec, num_bytes, stride):
    """(a pipeline send that stays in its node, one that leaves it) for stages `stride` ranks
    apart: NVLink, and the tier a node's width of ranks away (every send leaves once the stride
    reaches a node: then both are the stride's own tier)."""
    st = np.asarray(stride, dtype=float)
    G = cluster.gpus_per_node
    near = p2p_time_s(cluster, num_bytes, np.minimum(st, G - 1))
    far = p2p_time_s(cluster, num_bytes, st * np.ceil(G / np.maximum(st, 1.0)))
    return near, far
