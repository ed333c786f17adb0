"""Cost of one training step of sharded embedding tables, per rank (the slowest sets the step).

Notation: W ranks, g ranks per node, B samples per rank, G = B·W samples in the global
batch; per table N rows, D dim (d of a column shard), P ids per sample, e bytes per weight,
i bytes per id (8, int64), c bytes per pooled element on the wire (4, fp32), u the share of
distinct ids (tables.py). Per table, a step (TorchRec's sharded EmbeddingBagCollection over
FBGEMM's table-batched embedding, TBE) runs:

  1. input dist: an all-to-all sends each id to the rank owning its row: the owner of a
     table-wise shard receives G·P·i bytes;
  2. forward lookup on the owner: read ids (n·i), gather rows (n·d·e), write pooled
     outputs (G·d·4): HBM bytes at achieved HBM bandwidth (a gather of whole rows, which
     streams like an element-wise kernel for d·e >= 128 B);
  3. output dist: table-/column-wise: all-to-all of G·d·c from the owner (it sends (W−1)/W
     of it); row-wise: every rank holds partial sums for all G samples, reduced by a
     reduce-scatter of G·D·c; table-row-wise: reduce-scatter inside the node, then an
     all-to-all of G·D·c/g across nodes (TorchRec's sharding types);
  4. backward: the same collectives in reverse (all-to-all / all-gather of gradients);
  5. backward lookup with the fused optimizer (TBE): read the output gradients (G·d·4), sort
     the ids (2 passes of n·i), then read and write each distinct row once with its
     optimizer state: u·n·(2·d·e + 2·state) bytes;
  6. data-parallel tables: local lookups (no forward communication), an all-reduce of the
     dense table gradient (N·D·4) and the optimizer over the whole table.

Rows held in host memory (UVM) are read over the host link; a UVM cache keeps the hottest
share of rows in HBM, with the hit rate from the table's access profile (uniform access
without one). Host-link gathers of 128-512 B rows run at a tenth of the link bandwidth
(TorchRec's kernel_bw_lookup: FUSED_UVM bandwidth = hbm_to_ddr_bw / 10, from its authors'
measurements).

Composition: collectives synchronize ranks, so each phase costs its slowest rank and the
phases add: step = Σ_collective max_r(t_r) + max_r(fwd lookups) + max_r(bwd lookups).
TorchRec's planner instead sums each rank's costs and takes the max rank; the two agree
when one rank is slowest in every phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from ..cost.comm import Collective, collective_time_s
from ..specs.hardware import ClusterSpec
from .ranks import RUNS_MIN_RANKS, RankAxis
from .tables import EmbeddingTable, EmbeddingWorkload

UVM_GATHER_EFFICIENCY = 0.1  # TorchRec kernel_bw_lookup (FUSED_UVM: hbm_to_ddr_mem_bw / 10)
POOLED_OUTPUT_BYTES = 4.0    # TBE writes pooled outputs in fp32
TBE_KERNELS_FWD, TBE_KERNELS_BWD = 1, 3  # forward; sort + gradient + fused update


class ShardingType(StrEnum):
    """TorchRec's sharding types (same names, so a plan exports as is)."""

    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    DATA_PARALLEL = "data_parallel"


class ComputeKernel(StrEnum):
    """Where rows live: HBM, host memory with an HBM cache, or host memory (TorchRec names)."""

    HBM = "fused"
    UVM_CACHING = "fused_uvm_caching"
    UVM = "fused_uvm"
    DENSE = "dense"  # data-parallel tables: a plain lookup, the optimizer runs with the dense model's


@dataclass(frozen=True, kw_only=True)
class TablePlacement:
    """How one table is split and where its shards live."""

    table: str
    sharding: ShardingType
    ranks: Sequence[int]           # one per shard (column shards, row shards, or all for DP: a range)
    kernel: ComputeKernel = ComputeKernel.HBM
    cache_ratio: float = 0.0       # UVM caching: share of rows cached in HBM
    hot_row_fraction: float = 0.0  # FlexShard: hottest share of a batch's distinct rows replicated on every rank


def rank_array(ranks: Sequence[int]) -> np.ndarray:
    """A placement's ranks as an array; a range (every rank, as the search keeps row-wise and
    data-parallel tables: O(1) memory at 262,144 ranks) without a loop over its members."""
    if isinstance(ranks, range):
        return np.arange(ranks.start, ranks.stop, ranks.step)
    return np.asarray(ranks, dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class EmbeddingPlan:
    placements: tuple[TablePlacement, ...]
    world_size: int
    dedup: bool = False  # RecD: ids deduplicated per rank before the input all-to-all

    def placement(self, table: str) -> TablePlacement:
        for p in self.placements:
            if p.table == table:
                return p
        raise KeyError(table)


@dataclass(frozen=True, kw_only=True)
class EmbeddingCost:
    """Per-rank costs (arrays of length W) and the step they make."""

    fwd_lookup_s: np.ndarray
    bwd_lookup_s: np.ndarray
    comm_s: dict                 # phase -> per-rank seconds
    hbm_bytes: np.ndarray
    host_bytes: np.ndarray
    capacity_bytes: float
    host_bytes_per_host: np.ndarray   # UVM rows and their optimizer state, summed per host
    host_capacity_bytes: float        # one host's DRAM (0: not stated, not checked)
    a2a_bytes: float             # bytes all ranks send in all-to-alls (input + output + gradients)
    table_s: dict = field(default_factory=dict)  # table -> lookup seconds (fwd + bwd) on its busiest rank
    # the ranks the per-rank arrays' columns stand for, in run-length form (ranks.py);
    # None: one entry per rank, in rank order
    axis: RankAxis | None = None

    @property
    def phase_s(self) -> dict:
        out = {"forward lookups": float(self.fwd_lookup_s.max()), "backward lookups + optimizer": float(self.bwd_lookup_s.max())}
        out.update({k: float(v.max()) for k, v in self.comm_s.items()})
        return out

    @property
    def step_time_s(self) -> float:
        return sum(self.phase_s.values())

    @property
    def rank_total_s(self) -> np.ndarray:
        """Each rank's own sum (the quantity TorchRec's planner balances)."""
        return self.fwd_lookup_s + self.bwd_lookup_s + sum(self.comm_s.values())

    def ranks_near_max(self, rel_tol: float = 1e-6) -> int:
        """How many ranks' own sums are within `rel_tol` of the largest."""
        tot = self.rank_total_s
        near = tot >= tot.max() * (1 - rel_tol)
        return int(near.sum() if self.axis is None else self.axis.counts[near].sum())

    @property
    def fits_hbm(self) -> bool:
        return bool(self.hbm_bytes.max() <= self.capacity_bytes)

    @property
    def fits_host(self) -> bool:
        return self.host_capacity_bytes <= 0 or bool(self.host_bytes_per_host.max() <= self.host_capacity_bytes)

    @property
    def fits(self) -> bool:
        return self.fits_hbm and self.fits_host


def _hit_rate(table: EmbeddingTable, cache_rows: float, shard_rows: float, num_ids: float) -> float:
    """Share of a shard's lookups served by a cache of its hottest `cache_rows` rows (of
    `shard_rows`; `num_ids` the ids the shard looks up)."""
    if cache_rows >= shard_rows:
        return 1.0
    if table.access is None:
        return cache_rows / shard_rows
    # the ids' distinct rows, never more than the shard holds
    distinct = min(table.unique_share(num_ids) * num_ids, shard_rows)
    if cache_rows >= distinct:
        return 1.0
    return float(table.access.access_share_of_hottest(cache_rows / max(distinct, 1.0)))


@dataclass(frozen=True)
class _Shard:
    rows: float
    dim: int
    ids: float       # ids this shard looks up per step
    outputs: float   # pooled outputs it writes (samples)


def _shards(t: EmbeddingTable, sharding: ShardingType, k: int, W: int, G: float) -> list[tuple[_Shard, np.ndarray]]:
    """The table's k shards, each distinct one once with the positions (in shard order) of
    the shards like it: row-wise and data-parallel shards are all alike (one kind, at
    position 0: one column stands for all), column-wise ones take two widths at most (rank 0
    stands for each shard's own rank)."""
    n = G * t.pooling_factor
    every = np.arange(k)
    one = np.zeros(1, dtype=np.int64)
    if sharding in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
        wide = t.dim % k  # the first dim % k shards are one column wider
        if not wide:
            return [(_Shard(t.num_rows, t.dim // k, n, G), one)]
        return [(_Shard(t.num_rows, t.dim // k + 1, n, G), every[:wide]), (_Shard(t.num_rows, t.dim // k, n, G), every[wide:])]
    if sharding in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        return [(_Shard(t.num_rows / k, t.dim, n / k, G), one)]
    # data parallel: every rank looks up its own B·P ids
    return [(_Shard(t.num_rows, t.dim, n / W, G / W), one)]


FIELDS = ("fwd", "bwd", "hbm", "host", "ids_in", "out_a2a", "rs", "ar", "a2a_total")


def table_contribution(t: EmbeddingTable, sharding: ShardingType, num_shards: int, kernel: ComputeKernel,
                       cache_ratio: float, hot_row_fraction: float, dedup: bool, wl_key: tuple,
                       cluster: ClusterSpec, W: int) -> dict:
    """One table's per-shard quantities (arrays over its shards, in shard order) and the
    per-rank quantities every rank pays (hot replicas), independent of which ranks."""
    batch, id_bytes, c, optimizer = wl_key
    gpu = cluster.gpu
    hbm_bw = gpu.hbm_bw_bytes_per_s * gpu.memory_bw_efficiency
    host_bw = gpu.host_link_bw_unidir_bytes_per_s * UVM_GATHER_EFFICIENCY
    i = id_bytes
    G = float(batch) * W
    n_all = G * t.pooling_factor
    u = t.unique_share(n_all)
    cold, hot = 1.0, 0.0
    if hot_row_fraction > 0 and t.access is not None and sharding is not ShardingType.DATA_PARALLEL:
        hot = hot_row_fraction * u * n_all
        cold = 1.0 - float(t.access.access_share_of_hottest(hot_row_fraction))
    id_scale = cold * (u if dedup else 1.0)
    # samples with at least one cold id still need a partial sum from the owner
    out_scale = 1.0 - (1.0 - cold) ** max(t.pooling_factor, 1.0) if hot else 1.0
    kinds = _shards(t, sharding, num_shards, W, G)
    width = 1 if len(kinds) == 1 else num_shards  # shards all of one kind: one column, read as all
    per = {k: np.zeros(width) for k in FIELDS}
    comm: dict = {}  # row-wise shards are alike: one collective time per distinct message

    def coll(kind, num_bytes, group):
        key = (kind, float(num_bytes), group)
        if key not in comm:
            comm[key] = collective_time_s(cluster, kind, num_bytes, group, 1)
        return comm[key]

    for s, j in kinds:  # j: the positions of the shards like s
        rows_read = s.ids * cold * (u if dedup else 1.0)
        distinct = s.ids * cold * u
        state = optimizer.state_bytes_per_row(s.dim)
        row_bytes = s.dim * t.weight_bytes
        if kernel in (ComputeKernel.HBM, ComputeKernel.DENSE):
            h = 1.0
            per["hbm"][j] = s.rows * (row_bytes + state)
        else:
            cache_rows = cache_ratio * s.rows if kernel is ComputeKernel.UVM_CACHING else 0.0
            h = _hit_rate(t, cache_rows, s.rows, s.ids)
            per["hbm"][j] = cache_rows * (row_bytes + state)
            # the whole shard lives in host memory (FBGEMM's managed UVM); the HBM cache holds
            # copies of its hottest rows (TorchRec's storage estimate counts both)
            per["host"][j] = s.rows * (row_bytes + state)
        outputs = s.outputs * (out_scale if sharding is not ShardingType.DATA_PARALLEL else 1.0)
        f_hbm = s.ids * id_scale * i + h * rows_read * row_bytes + outputs * s.dim * POOLED_OUTPUT_BYTES
        b_hbm = (outputs * s.dim * POOLED_OUTPUT_BYTES + 2.0 * s.ids * id_scale * i
                 + h * distinct * 2.0 * (row_bytes + state))
        f_host = (1.0 - h) * rows_read * row_bytes
        b_host = (1.0 - h) * distinct * 2.0 * (row_bytes + state)
        per["fwd"][j] = f_hbm / hbm_bw + f_host / host_bw + TBE_KERNELS_FWD * gpu.kernel_launch_overhead_s
        per["bwd"][j] = b_hbm / hbm_bw + b_host / host_bw + TBE_KERNELS_BWD * gpu.kernel_launch_overhead_s
        if sharding is ShardingType.DATA_PARALLEL:
            per["bwd"][j] += t.num_rows * 2.0 * (row_bytes + state) / hbm_bw  # optimizer over the whole table
            per["ar"][j] = coll(Collective.ALL_REDUCE, t.num_rows * t.dim * 4.0, W)
        elif sharding in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE):
            per["ids_in"][j] = s.ids * id_scale * i
            per["out_a2a"][j] = outputs * s.dim * c
            per["a2a_total"][j] = (W - 1) / W * (s.ids * id_scale * i + 2.0 * outputs * s.dim * c)
        else:  # row-wise over all ranks, or table-row-wise inside one node
            buf = outputs * s.dim * c
            per["ids_in"][j] = s.ids * id_scale * i
            per["rs"][j] = coll(Collective.REDUCE_SCATTER, buf, num_shards)
            per["a2a_total"][j] = (W - 1) / W * s.ids * id_scale * i
            if sharding is ShardingType.TABLE_ROW_WISE and W > num_shards:
                per["out_a2a"][j] = buf / num_shards
                per["a2a_total"][j] += (W - 1) / W * 2.0 * buf / num_shards
    every = _hot_replicas(t, hot, cold, wl_key, cluster, W)
    # the fields as rows of one array, in FIELDS order: evaluate adds every table's at once
    stacked = np.stack([per[k] for k in FIELDS])
    if width == 1:  # the memo keeps one column per table and option: O(1), not O(W), at 262,144 ranks
        stacked = np.broadcast_to(stacked, (len(FIELDS), num_shards))
    return {"per_shard": {k: stacked[i] for i, k in enumerate(FIELDS)}, "every_rank": every, "stacked": stacked,
            "every_stacked": np.array([every.get(k, 0.0) for k in FIELDS]),
            "alike": num_shards > 1 and stacked.strides[1] == 0}


def _hot_replicas(t: EmbeddingTable, hot: float, cold: float, wl_key: tuple, cluster: ClusterSpec, W: int) -> dict:
    """What every rank pays for the table's `hot` replicated rows (`cold`: the share of
    lookups they miss): local lookups of the hot ids, an all-reduce of their gradients."""
    every = {k: 0.0 for k in ("fwd", "bwd", "hbm", "ar")}
    if not hot:
        return every
    batch, i, _, optimizer = wl_key
    hbm_bw = cluster.gpu.hbm_bw_bytes_per_s * cluster.gpu.memory_bw_efficiency
    G = float(batch) * W
    row_state = t.dim * t.weight_bytes + optimizer.state_bytes_per_row(t.dim)
    local = (G * t.pooling_factor / W) * (1.0 - cold)
    every["hbm"] = hot * row_state
    every["fwd"] = (local * t.dim * t.weight_bytes + (G / W) * t.dim * POOLED_OUTPUT_BYTES) / hbm_bw
    every["bwd"] = (local * i * 2.0 + hot * 2.0 * row_state) / hbm_bw
    every["ar"] = float(collective_time_s(cluster, Collective.ALL_REDUCE, hot * t.dim * t.weight_bytes, W, 1))
    return every


def remembered_contribution(memo: dict, t: EmbeddingTable, sharding: ShardingType, num_shards: int,
                            kernel: ComputeKernel, cache_ratio: float, hot_row_fraction: float, dedup: bool,
                            wl: EmbeddingWorkload, cluster: ClusterSpec, W: int) -> dict:
    """`table_contribution`, computed once per table and option in `memo` (one workload and cluster)."""
    wl_key = (wl.batch_size_per_rank, wl.id_bytes, wl.output_comm_bytes, wl.optimizer)
    key = (t.name, sharding, num_shards, kernel, cache_ratio, hot_row_fraction, dedup, wl_key, W)
    if key not in memo:
        memo[key] = table_contribution(t, sharding, num_shards, kernel, cache_ratio, hot_row_fraction, dedup, wl_key,
                                       cluster, W)
    return memo[key]


def evaluate(plan: EmbeddingPlan, wl: EmbeddingWorkload, cluster: ClusterSpec, *, hbm_reserve_fraction: float = 0.15,
             memo: dict | None = None, per_table: bool = True, runs: bool = False) -> EmbeddingCost:
    """Per-rank time and memory of `plan` (see the module docstring for the model).

    `memo`: a dict the caller keeps across plans of one workload and cluster (the search).
    `per_table`: also each table's busiest rank (table_s, for the report; the search, which
    compares steps, leaves it out until its best plan). `runs`: the per-rank arrays in
    run-length form (ranks.py: every rank no table-wise or column-wise shard is on shares
    one column), as the search compares plans; else one entry per rank."""
    memo = {} if memo is None else memo
    W = plan.world_size
    tables = wl.table_named
    table_rank = {}
    contribs = [remembered_contribution(memo, tables[p.table], p.sharding, len(p.ranks), p.kernel, p.cache_ratio,
                                        p.hot_row_fraction, plan.dedup, wl, cluster, W) for p in plan.placements]
    spread = [_on_every_rank(p, c, W) for p, c in zip(plan.placements, contribs)]
    # at many ranks the sums are added in run-length form even for one entry per rank (then
    # expanded): one column per table on every rank, not W entries per table
    axis = _axis(plan, spread, W) if runs or W >= RUNS_MIN_RANKS else RankAxis.every_rank(W)
    # every table's shards side by side: one bincount per field adds them to their columns
    # (a rank holding two shards of one table, as an imported plan may, gets both)
    cols, col_parts, shard_parts = axis.num_columns, [], []
    every = {k: 0.0 for k in FIELDS}
    for p, contrib, alike in zip(plan.placements, contribs, spread):
        col_parts.append(np.arange(cols) if alike else axis.columns_of(rank_array(p.ranks)))
        shard_parts.append(np.broadcast_to(contrib["stacked"][:, :1], (len(FIELDS), cols)) if alike
                           else contrib["stacked"])
        for k, v in contrib["every_rank"].items():
            every[k] += v
        if not per_table:
            continue
        per, on_every = contrib["per_shard"], contrib["every_rank"]
        per_rank = np.bincount(rank_array(p.ranks), weights=per["fwd"] + per["bwd"], minlength=W)
        table_rank[p.table] = float((per_rank + on_every["fwd"] + on_every["bwd"]).max())
    if col_parts:
        all_cols, shards = np.concatenate(col_parts), np.concatenate(shard_parts, axis=1)
        acc = {k: np.bincount(all_cols, weights=shards[i], minlength=cols) + every[k] for i, k in enumerate(FIELDS)}
    else:
        acc = {k: np.zeros(cols) + every[k] for k in FIELDS}
    if not runs and axis.rest:
        acc, axis = {k: axis.expand(v) for k, v in acc.items()}, RankAxis.every_rank(W)
    return cost_from_sums(acc, cluster, axis, hbm_reserve_fraction, table_rank)


def _on_every_rank(p: TablePlacement, contrib: dict, W: int) -> bool:
    """Whether the placement puts one alike shard on each rank (row-wise, data parallel)."""
    return contrib["alike"] and isinstance(p.ranks, range) and p.ranks == range(W)


def _axis(plan: EmbeddingPlan, spread: list[bool], W: int) -> RankAxis:
    """The ranks some placement singles out, each its own column; the rest share one."""
    parts = [rank_array(p.ranks) for p, alike in zip(plan.placements, spread) if not alike]
    return RankAxis(world_size=W, named=np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64))


def cost_from_sums(acc: dict, cluster: ClusterSpec, axis: RankAxis, hbm_reserve_fraction: float,
                   table_rank: dict | None = None) -> EmbeddingCost:
    """The step and memory from each rank's sums of its shards' quantities (`acc`: field ->
    array over the columns of `axis`, every-rank terms included): what `evaluate` adds up,
    and what the search keeps up to date as it moves one table at a time."""
    W, cols = axis.world_size, axis.num_columns
    # an all-to-all is as slow as its busiest rank: the owner sending (or receiving) the most;
    # the ids' and the outputs' buffers priced in one call (element by element)
    buffers = np.concatenate([acc["ids_in"], acc["out_a2a"]])
    a2a = np.asarray(collective_time_s(cluster, Collective.ALL_TO_ALL, buffers, W, 1), dtype=float) * (buffers > 0)
    comm = {
        "input all-to-all": a2a[:cols],
        "output all-to-all": a2a[cols:],
        "output reduce-scatter": acc["rs"],
        "gradient all-to-all": a2a[cols:].copy(),
        "gradient all-gather": acc["rs"].copy(),  # all-gather mirrors the reduce-scatter
        "data-parallel all-reduce": acc["ar"],
    }
    # buffers: ids in, pooled outputs out (forward) and their gradients (backward)
    hbm = acc["hbm"] + acc["ids_in"] + 2.0 * acc["out_a2a"]
    capacity = cluster.gpu.hbm_bytes * (1.0 - hbm_reserve_fraction)
    # ranks fill hosts in order: rank r sits on host r // (GPUs per host)
    host_node = axis.group_sums(acc["host"], cluster.host_gpus)
    return EmbeddingCost(fwd_lookup_s=acc["fwd"], bwd_lookup_s=acc["bwd"], comm_s=comm, hbm_bytes=hbm,
                         host_bytes=acc["host"], capacity_bytes=capacity, host_bytes_per_host=host_node,
                         host_capacity_bytes=cluster.host_memory_bytes_per_host,
                         a2a_bytes=float(acc["a2a_total"].sum() if not axis.rest else acc["a2a_total"] @ axis.counts),
                         table_s=table_rank or {}, axis=None if not axis.rest else axis)
