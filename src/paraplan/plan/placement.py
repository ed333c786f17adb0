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


def _crossings_exact(p: int, st: int, blk: int, G: int, replicas: int, spacing: int) -> int:
    """Sends of the slowest replica's pipeline that leave a domain of G ranks, walked hop by
    hop: replica r starts at r·spacing (spacing 0: the replicas interleave inside a stage, r·blk
    apart), stage i of it at start + i·st; a hop crosses when some rank of the sending block
    and its peer st ranks on lie in two domains: (start mod G) + blk − 1 ≥ G − st."""
    if p <= 1:
        return 0
    if st >= G:
        return p - 1
    step = spacing or blk
    starts = sorted({(r * step) % G for r in range(min(replicas, G))})
    return max(sum(1 for i in range(p - 1) if (o + i * st) % G + blk - 1 >= G - st) for o in starts)


def pipeline_crossings(p, stride, block, gpus_per_node, replicas=1, spacing=0):
    """How many of a pipeline's p − 1 sends leave a node (or any domain of `gpus_per_node`
    ranks), for the slowest of `replicas` pipelines (vectorized): the step waits for it.
    Consecutive stages sit `stride` ranks apart and each stage of one pipeline holds `block`
    consecutive ranks (TP×CP in training; TP in serving). The replicas start `spacing` ranks
    apart (data parallelism outermost: t·c·p), or, with spacing 0, interleave inside each
    stage, `block` apart (the pipeline outermost; replicas·block = stride there). Every send crosses once the stride reaches a
    node. Where the stride divides the node, the block divides the stride and the replicas
    repeat with the node (their spacing dividing it, or a multiple of it), node boundaries
    fall between the same stages of every replica: min(p − 1, ⌊(p·stride − 1)/G⌋) cross.
    Elsewhere (e.g. 72-GPU racks, three replicas) each distinct layout is walked hop by hop
    (_crossings_exact; a rank-by-rank walk of every replica reproduces it)."""
    p, st, blk, reps, spc = np.broadcast_arrays(*(np.asarray(x, dtype=float)
                                                  for x in (p, stride, block, replicas, spacing)))
    G = float(gpus_per_node)
    out = np.where(st >= G, p - 1.0, np.minimum(p - 1.0, np.floor((p * st - 1.0) / G)))
    st1, blk1 = np.maximum(st, 1.0), np.maximum(blk, 1.0)
    repeats = (spc == 0) | (reps <= 1) | (np.mod(G, np.maximum(spc, 1.0)) == 0) | (np.mod(spc, G) == 0)
    regular = (st >= G) | ((np.mod(G, st1) == 0) & (np.mod(st1, blk1) == 0) & repeats)
    odd = ~regular & (p > 1)
    if np.any(odd):
        out = np.array(out, dtype=float, copy=True) if np.ndim(out) else out
        cols = np.stack(np.broadcast_arrays(p, st, blk, reps, spc), axis=-1)
        if np.ndim(out):
            rows = cols[odd]
            keys, inverse = np.unique(rows, axis=0, return_inverse=True)
            vals = np.array([_crossings_exact(int(a), int(b), int(c), int(G), int(d), int(e)) for a, b, c, d, e in keys],
                            dtype=float)
            out[odd] = vals[np.ravel(inverse)]
        else:
            a, b, c, d, e = (int(x) for x in cols)
            out = float(_crossings_exact(a, b, c, int(G), d, e))
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
        cross = (pipeline_crossings(pp, tc * dp, tc, D, dp), pipeline_crossings(pp, tc, tc, D, dp, tc * pp))
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
