"""Where a parallel group's ranks fall: which share a node (NVLink domain) or an island, for
a plan's rank order (plan/axes.py RankOrder). Pure rank arithmetic on domain sizes, aligned
to the rank space; cost/comm.py prices the collectives and sends over it, and the plan space
asks whether two rank orders place a layout's groups differently at all."""

from __future__ import annotations

import numpy as np


def members_within(domain_gpus: int, group_size, stride, block=None, outer_stride=None):
    """Members of a group that share one domain (node or island) of `domain_gpus`: evenly
    strided, or runs of `block` members `stride` apart repeated `outer_stride` (≥ block·stride)
    apart, domains aligned to the rank space. A run that fits in the domain brings all of its
    members, and the domain holds as many runs as outer strides fit in it."""
    n = np.asarray(group_size)
    st = np.asarray(stride)
    if block is None:
        return np.minimum(n, np.maximum(1, domain_gpus // np.maximum(st, 1)))
    blk = np.asarray(block)
    inner = np.minimum(blk, np.maximum(1, domain_gpus // np.maximum(st, 1)))
    runs = np.minimum(n // np.maximum(blk, 1), np.maximum(1, domain_gpus // np.maximum(np.asarray(outer_stride), 1)))
    return np.where(inner >= blk, inner * runs, inner)


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


def rank_orders_differ(tp: int, cp: int, pp: int, dp: int, shards, gpus_per_node: int, gpus_per_island: int = 0,
                       experts: bool = False) -> bool:
    """Whether data parallelism outermost (tp-cp-pp-dp) places any group of the layout
    differently from the pipeline outermost (tp-cp-dp-pp) in some domain (node, island): the
    data-parallel group CP×DP, each ZeRO-3 shard group (dp_shard·CP) and its replicas, the
    experts' EDP group (= DP there), and the pipeline's crossings of domain boundaries and
    the number of a stage's ranks in an island that a crossing send shares its uplinks with.
    Where none differs the two orders cost the same, and the plan space offers only the default."""
    if pp == 1 or dp == 1:
        return False
    tc = tp * cp
    for D in (gpus_per_node, gpus_per_island) if gpus_per_island else (gpus_per_node,):
        cross = (pipeline_crossings(pp, tc * dp, tc, D), pipeline_crossings(pp, tc, tc, D))
        pairs = [(members_within(D, dp * cp, tp), members_within(D, dp * cp, tp, cp, tc * pp)), cross,
                 ((tc * dp >= D) or (pp * tc * dp > D), (tc >= D) or (pp * tc > D))]
        if D == gpus_per_island and gpus_per_island != gpus_per_node and max(cross) > 0:
            pairs.append((min(D, tc * dp), min(D, tc)))
        if experts:
            pairs.append((members_within(D, dp, tc), members_within(D, dp, tc * pp)))
        for shard in shards:
            pairs.append((members_within(D, shard * cp, tp), members_within(D, shard * cp, tp, cp, tc * pp)))
            pairs.append((members_within(D, dp // shard, tc * shard), members_within(D, dp // shard, tc * pp * shard)))
        if any(bool(np.any(np.asarray(a) != np.asarray(b))) for a, b in pairs):
            return True
    return False
