"""Search: split and place tables to minimize the step (the slowest rank), under HBM limits.

Three layers, each from the literature:
  * placement: longest-processing-time-first greedy (Graham 1969): shards in decreasing cost,
    each onto the least-loaded rank with room (NeuroShard's greedy placement, Zha et al.
    MLSys 2023, Sec. 4.3);
  * splitting: a beam search over column splits of the costliest tables (NeuroShard Sec. 4.2),
    every candidate priced by the full cost model after placement;
  * what TorchRec's planner lacks: data-parallel replication of the tables whose all-reduce
    is cheaper than their all-to-all (chosen by a sweep, not a per-table rule), replication of
    each table's hottest rows by its access profile (FlexShard, Sethi et al. 2023), and
    in-batch id deduplication (RecD, Zhao et al. MLSys 2023).
Tables too big for one rank are row-sharded (inside a node when they fit there) or kept in
host memory with an HBM cache; when nothing fits, the error says by how much.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ParaplanError
from ..specs.hardware import ClusterSpec
from ..units import fmt_bytes
from .cost import ComputeKernel, EmbeddingCost, EmbeddingPlan, ShardingType, TablePlacement, evaluate
from .tables import EmbeddingTable, EmbeddingWorkload

MIN_COLUMN_SHARD_DIM = 32   # 128 B rows: one warp of FBGEMM's TBE reads 32 × 4-element vectors
COLUMN_SPLITS = (1, 2, 4)
HOT_ROW_FRACTIONS = (0.0, 0.01, 0.05, 0.2, 0.5)
# Search bounds, not model parameters: which tables may be replicated (DP) and how much of a
# rank's usable HBM one shard may take before the table is split further (room to pack others).
DP_MAX_TABLE_SHARE = 0.05
MAX_SHARD_SHARE = 0.5
# HBM cache shares the local search tries for a table kept in host memory (TorchRec's
# default UVM_CACHING_RATIO, 0.2, among them)
UVM_CACHE_RATIOS = (0.05, 0.2, 0.5)


@dataclass(frozen=True, kw_only=True)
class EmbeddingSearchResult:
    plan: EmbeddingPlan
    cost: EmbeddingCost
    candidates: int  # plans priced by the full model


class _Planner:
    def __init__(self, wl: EmbeddingWorkload, cluster: ClusterSpec, W: int, reserve: float, dedup: bool):
        self.wl, self.cluster, self.W, self.reserve, self.dedup = wl, cluster, W, reserve, dedup
        self.g = min(cluster.gpus_per_node, W)
        self.capacity = cluster.gpu.hbm_bytes * (1.0 - reserve)
        self.tables = {t.name: t for t in wl.tables}
        self.evaluated = 0
        self._load_cache: dict = {}
        self._unit_cache: dict = {}
        self.memo: dict = {}

    def load(self, t: EmbeddingTable, sharding: ShardingType, k: int, kernel=ComputeKernel.HBM, cache=0.0, hot=0.0):
        """Per-rank seconds and HBM bytes of the table alone (the loads the greedy placement adds)."""
        key = (t.name, sharding, k, kernel, cache, hot)
        if key not in self._load_cache:
            ranks = tuple(range(self.W)) if sharding in (ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL) else tuple(range(k))
            p = TablePlacement(table=t.name, sharding=sharding, ranks=ranks, kernel=kernel, cache_ratio=cache, hot_row_fraction=hot)
            alone = evaluate(EmbeddingPlan(placements=(p,), world_size=self.W), self.wl, self.cluster,
                             hbm_reserve_fraction=self.reserve, memo=self.memo)
            self._load_cache[key] = (alone.rank_total_s, alone.hbm_bytes)
        return self._load_cache[key]

    def unit_cost(self, t: EmbeddingTable, sharding: ShardingType, k: int, kernel, cache, hot) -> float:
        """What orders a table's shards in the greedy placement, largest first: a node's
        shards together (table-row-wise), else its busiest shard (k column shards each cost
        about 1/k of the whole)."""
        key = (t.name, sharding, k, kernel, cache, hot)
        if key not in self._unit_cache:
            time_v, _ = self.load(t, sharding, k, kernel, cache, hot)
            self._unit_cache[key] = float(time_v[:k].sum() if sharding is ShardingType.TABLE_ROW_WISE
                                          else time_v[:k].max())
        return self._unit_cache[key]

    def table_bytes(self, t: EmbeddingTable) -> float:
        """The table's rows with their optimizer state."""
        return t.num_rows * (t.dim * t.weight_bytes + self.wl.optimizer.state_bytes_per_row(t.dim))

    def replicable(self, t: EmbeddingTable) -> bool:
        """Small enough to replicate on every rank (DP), optimizer state included."""
        return self.table_bytes(t) <= DP_MAX_TABLE_SHARE * self.capacity

    def shape(self, t: EmbeddingTable) -> tuple[ShardingType, int, ComputeKernel, float]:
        """Default split of a table: whole on one rank if it fits, else rows over a node, else
        rows over all ranks, else host memory with the largest HBM cache that fits."""
        need = self.table_bytes(t)
        cap = MAX_SHARD_SHARE * self.capacity
        if need <= cap:
            return ShardingType.TABLE_WISE, 1, ComputeKernel.HBM, 0.0
        if self.W > self.g and self.W % self.g == 0 and need / self.g <= cap:
            return ShardingType.TABLE_ROW_WISE, self.g, ComputeKernel.HBM, 0.0
        if need / self.W <= cap:
            return ShardingType.ROW_WISE, self.W, ComputeKernel.HBM, 0.0
        cache = min(1.0, cap * self.W / need)
        return ShardingType.ROW_WISE, self.W, ComputeKernel.UVM_CACHING, round(cache, 4)

    def place(self, choice: dict) -> EmbeddingPlan:
        """choice: table -> (sharding, k, kernel, cache, hot). LPT greedy onto ranks with room."""
        W = self.W
        load = np.zeros(W)
        mem = np.zeros(W)
        placements = []
        units = []
        for name, (sh, k, kern, cache, hot) in choice.items():
            t = self.tables[name]
            time_v, mem_v = self.load(t, sh, k, kern, cache, hot)
            if sh in (ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL):
                load += time_v
                mem += mem_v
                placements.append(TablePlacement(table=name, sharding=sh, ranks=tuple(range(W)), kernel=kern,
                                                 cache_ratio=cache, hot_row_fraction=hot))
            else:
                units.append((self.unit_cost(t, sh, k, kern, cache, hot), name, sh, k, kern, cache, hot,
                              time_v[:k], mem_v[:k]))
        units.sort(key=lambda u: -u[0])
        mem_max = float(mem.max())  # kept as shards are added: whether any rank can run out
        for _, name, sh, k, kern, cache, hot, tv, mv in units:
            if sh is ShardingType.TABLE_ROW_WISE:
                # a whole node: the node whose busiest rank is least loaded, among those with
                # room (else among all); ties to the lowest node
                node_load = load.reshape(-1, self.g).max(axis=1)
                room = (mem.reshape(-1, self.g) + mv).max(axis=1) <= self.capacity
                n = int(np.argmin(np.where(room, node_load, np.inf))) if room.any() else int(np.argmin(node_load))
                ranks = tuple(range(n * self.g, (n + 1) * self.g))
                load[list(ranks)] += tv
                mem[list(ranks)] += mv
                mem_max = max(mem_max, float(mem[list(ranks)].max()))
            else:
                # each shard to the least-loaded rank with room (else the least loaded), not one
                # of the table's own; ties to the lowest rank (argmin's first minimum)
                ranks = []
                roomy = mem_max + float(mv.max()) <= self.capacity  # no rank can run out
                for j in range(k):
                    key = load.copy() if roomy else load + (mem + mv[j] > self.capacity) * 1e9
                    key[ranks] = np.inf
                    r = int(key.argmin())
                    ranks.append(r)
                    load[r] += tv[j]
                    mem[r] += mv[j]
                    mem_max = max(mem_max, float(mem[r]))
                ranks = tuple(ranks)
            placements.append(TablePlacement(table=name, sharding=sh, ranks=ranks, kernel=kern, cache_ratio=cache,
                                             hot_row_fraction=hot))
        order = {t.name: i for i, t in enumerate(self.wl.tables)}
        placements.sort(key=lambda p: order[p.table])
        return EmbeddingPlan(placements=tuple(placements), world_size=W, dedup=self.dedup)

    def price(self, choice: dict) -> tuple[float, EmbeddingPlan, EmbeddingCost]:
        plan = self.place(choice)
        cost = evaluate(plan, self.wl, self.cluster, hbm_reserve_fraction=self.reserve, memo=self.memo,
                        per_table=False)
        self.evaluated += 1
        penalty = 0.0 if cost.fits_hbm else 1e6 * float(cost.hbm_bytes.max() - cost.capacity_bytes) / self.capacity
        if not cost.fits_host:
            penalty += 1e6 * float(cost.host_bytes_per_host.max() / cost.host_capacity_bytes - 1.0)
        return cost.step_time_s + penalty, plan, cost


def _movable(v) -> bool:
    return v[0] in (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_ROW_WISE) and v[2] is ComputeKernel.HBM


def _valid(t: EmbeddingTable, option, W: int, g: int) -> bool:
    sh, k = option[0], option[1]
    if sh is ShardingType.COLUMN_WISE:
        return k <= W and t.dim % k == 0 and t.dim // k >= MIN_COLUMN_SHARD_DIM
    if sh is ShardingType.TABLE_ROW_WISE:
        return W > g and W % g == 0
    return True


def _options(P: "_Planner", t: EmbeddingTable | None):
    """Alternatives for one table (or, with None, for all sharded tables at once)."""
    W, g = P.W, P.g
    out = [(ShardingType.TABLE_WISE, 1, ComputeKernel.HBM, 0.0, 0.0)]
    out += [(ShardingType.COLUMN_WISE, k, ComputeKernel.HBM, 0.0, 0.0) for k in COLUMN_SPLITS[1:]]
    out += [(ShardingType.TABLE_ROW_WISE, g, ComputeKernel.HBM, 0.0, 0.0), (ShardingType.ROW_WISE, W, ComputeKernel.HBM, 0.0, 0.0)]
    if t is not None:
        # rows over every rank in host memory behind an HBM cache: what lets tables that fit
        # one at a time but not together move to the host (TorchRec's default ratio among them)
        out += [(ShardingType.ROW_WISE, W, ComputeKernel.UVM_CACHING, c, 0.0) for c in UVM_CACHE_RATIOS]
        if P.replicable(t):
            out.append((ShardingType.DATA_PARALLEL, W, ComputeKernel.DENSE, 0.0, 0.0))
        need = P.table_bytes(t)
        out = [o for o in out if _valid(t, o, W, g) and (o[0] is ShardingType.ROW_WISE or
               need / (g if o[0] is ShardingType.TABLE_ROW_WISE else 1) <= MAX_SHARD_SHARE * P.capacity)]
    return out


def _better(a, b) -> bool:
    """Lower step; at equal step, fewer ranks at the max (progress on a plateau)."""
    if a[0] < b[0] * (1 - 1e-9):
        return True
    if a[0] > b[0] * (1 + 1e-9):
        return False
    def at_max(c):
        tot = c.rank_total_s
        return int((tot >= tot.max() * (1 - 1e-6)).sum())
    return at_max(a[2]) < at_max(b[2])


def plan_embeddings(wl: EmbeddingWorkload, cluster: ClusterSpec, *, world_size: int | None = None,
                    hot_rows: bool = False, dedup: bool = False,
                    hbm_reserve_fraction: float = 0.15) -> EmbeddingSearchResult:
    """The fastest plan found for `wl` on `world_size` ranks of `cluster`."""
    W = world_size or cluster.num_gpus
    P = _Planner(wl, cluster, W, hbm_reserve_fraction, dedup)
    # choices: table -> (sharding, shards, kernel, cache ratio, hot-row share); hot rows come last (step 5)
    base = {t.name: (*P.shape(t), 0.0) for t in wl.tables}
    best = P.price(base)
    choice = dict(base)
    # 2. every sharded table re-split one way (TorchRec's uniform proposer), and for each,
    # 3. data parallel for the k tables whose replicated cost is lowest relative to their
    #    sharded cost, k swept (one table at a time gains nothing while another rank ties)
    starts = [base] + [{n: (o if _movable(v) and _valid(P.tables[n], o, W, P.g) else v) for n, v in base.items()}
                       for o in _options(P, None)]
    for start in starts:
        trial = dict(start)
        priced = P.price(trial)
        if _better(priced, best):
            best, choice = priced, trial
        def dp_ratio(t):
            dp_v, _ = P.load(t, ShardingType.DATA_PARALLEL, W, ComputeKernel.DENSE)
            sh_v, _ = P.load(t, *start[t.name][:4], start[t.name][4])
            return float(dp_v.max()) / max(float(sh_v.sum()) / W, 1e-30)
        small = sorted((t for t in wl.tables if P.replicable(t) and W > 1), key=dp_ratio)
        for t in small:
            trial = dict(trial)
            trial[t.name] = (ShardingType.DATA_PARALLEL, W, ComputeKernel.DENSE, 0.0, 0.0)
            priced = P.price(trial)
            if _better(priced, best):
                best, choice = priced, trial
    # 4. local search, costliest tables first: the best option for one table at a time
    #    (NeuroShard's beam over column splits, widened to every sharding type)
    for _ in range(2):
        improved = False
        for name in sorted(choice, key=lambda n: -float(P.load(P.tables[n], *choice[n][:4], choice[n][4])[0].max())):
            for option in _options(P, P.tables[name]):
                if option[:4] == choice[name][:4]:
                    continue
                trial = dict(choice)
                trial[name] = option
                priced = P.price(trial)
                if _better(priced, best):
                    best, choice, improved = priced, trial, True
        if not improved:
            break
    # 5. hot-row replication (FlexShard): per table, costliest first, the replicated share of
    #    its hottest rows that lowers the whole step (every rank pays each table's all-reduce)
    if hot_rows:
        for name in sorted(choice, key=lambda n: -float(P.load(P.tables[n], *choice[n][:4], choice[n][4])[0].max())):
            if P.tables[name].access is None or choice[name][0] is ShardingType.DATA_PARALLEL:
                continue
            for f in HOT_ROW_FRACTIONS[1:]:
                trial = dict(choice)
                trial[name] = (*choice[name][:4], f)
                priced = P.price(trial)
                if _better(priced, best):
                    best, choice = priced, trial
    _, plan, _ = best
    cost = evaluate(plan, wl, cluster, hbm_reserve_fraction=hbm_reserve_fraction, memo=P.memo)  # with table_s
    if cost.fits_hbm and not cost.fits_host:
        raise ParaplanError(
            f"no embedding plan fits: the rows kept in host memory (UVM) need {fmt_bytes(float(cost.host_bytes_per_host.max()))} "
            f"on the fullest host, which has {fmt_bytes(cost.host_capacity_bytes)} of DRAM "
            f"({fmt_bytes(wl.total_weight_bytes)} of tables on {W} GPUs); use more GPUs or 16-bit weights "
            "(weight_bytes=2 in the tables CSV)")
    if not cost.fits:
        need = float(cost.hbm_bytes.max())
        raise ParaplanError(
            f"no embedding plan fits: the fullest rank needs {fmt_bytes(need)} of HBM, {fmt_bytes(cost.capacity_bytes)} is usable "
            f"({fmt_bytes(wl.total_weight_bytes)} of tables on {W} GPUs); use more GPUs, a smaller --hbm-reserve, "
            "or 16-bit weights (weight_bytes=2 in the tables CSV)")
    return EmbeddingSearchResult(plan=plan, cost=cost, candidates=P.evaluated)
