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

from ..argtypes import MAX_DEGREE
from ..errors import ParaplanError, SpecError
from ..specs.hardware import ClusterSpec
from ..units import fmt_bytes
from .cost import (FIELDS, ComputeKernel, EmbeddingCost, EmbeddingPlan, ShardingType, TablePlacement, cost_from_sums,
                   evaluate, rank_array, remembered_contribution)
from .ranks import RUNS_MIN_RANKS, RankAxis, RankColumns, distinct_ascending, first_missing
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
# Up to this many tables every candidate plan is packed afresh (all tables, largest first);
# beyond, the search moves one table at a time onto the packing of the others (the re-pack
# costs grow with tables², a move with its shards): a search bound, not a model parameter.
REPACK_MAX_TABLES = 128


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
        self.tables = wl.table_named
        self.evaluated = 0
        self._load_cache: dict = {}
        self._unit_cache: dict = {}
        self.memo: dict = {}

    def load(self, t: EmbeddingTable, sharding: ShardingType, k: int, kernel=ComputeKernel.HBM, cache=0.0, hot=0.0):
        """Per-rank seconds and HBM bytes of the table alone (the loads the greedy placement
        adds), in run-length form: the shards' ranks 0..k−1 first, then the rest (row-wise
        and data-parallel tables: one column, every rank alike)."""
        return self._alone(t, sharding, k, kernel, cache, hot)[:2]

    def rank_sum_s(self, t: EmbeddingTable, sharding: ShardingType, k: int, kernel, cache, hot) -> float:
        """The table alone's seconds summed over every rank (as numpy sums one per rank)."""
        time_v, _, axis = self._alone(t, sharding, k, kernel, cache, hot)
        return float(axis.expand(time_v).sum())

    def _alone(self, t: EmbeddingTable, sharding: ShardingType, k: int, kernel, cache, hot) -> tuple:
        key = (t.name, sharding, k, kernel, cache, hot)
        if key not in self._load_cache:
            ranks = range(self.W) if sharding in (ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL) else range(k)
            p = TablePlacement(table=t.name, sharding=sharding, ranks=ranks, kernel=kernel, cache_ratio=cache, hot_row_fraction=hot)
            alone = evaluate(EmbeddingPlan(placements=(p,), world_size=self.W), self.wl, self.cluster,
                             hbm_reserve_fraction=self.reserve, memo=self.memo, per_table=False,
                             runs=self.W >= RUNS_MIN_RANKS)
            self._load_cache[key] = (alone.rank_total_s, alone.hbm_bytes, alone.axis or RankAxis.every_rank(self.W))
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
        cols = self.columns(2)  # seconds and HBM bytes per rank
        placements = []
        units = []
        for name, (sh, k, kern, cache, hot) in choice.items():
            t = self.tables[name]
            time_v, mem_v = self.load(t, sh, k, kern, cache, hot)
            if sh in (ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL):
                cols.data[0] += time_v[-1]  # alike on every rank
                cols.data[1] += mem_v[-1]
                placements.append(TablePlacement(table=name, sharding=sh, ranks=range(W), kernel=kern,
                                                 cache_ratio=cache, hot_row_fraction=hot))
            else:
                units.append((self.unit_cost(t, sh, k, kern, cache, hot), name, sh, k, kern, cache, hot,
                              time_v[:k], mem_v[:k]))
        units.sort(key=lambda u: -u[0])
        mem_max = float(cols.data[1].max())  # kept as shards are added: whether any rank can run out
        for _, name, sh, k, kern, cache, hot, tv, mv in units:
            ranks, mem_max = self.put(cols, mem_max, sh, tv, mv)
            placements.append(TablePlacement(table=name, sharding=sh, ranks=ranks, kernel=kern, cache_ratio=cache,
                                             hot_row_fraction=hot))
        order = {t.name: i for i, t in enumerate(self.wl.tables)}
        placements.sort(key=lambda p: order[p.table])
        return EmbeddingPlan(placements=tuple(placements), world_size=W, dedup=self.dedup)

    def columns(self, rows: int) -> RankColumns:
        """Rows of per-rank quantities for the packing, in run-length form at many ranks."""
        return RankColumns(self.W, rows, every_rank=self.W < RUNS_MIN_RANKS)

    def put(self, cols: RankColumns, mem_max: float, sh: ShardingType, tv: np.ndarray,
            mv: np.ndarray) -> tuple[tuple[int, ...], float]:
        """Ranks for one table's shards (seconds `tv`, bytes `mv` each), added to the per-rank
        seconds and bytes `cols` (rows 0 and 1) in place; `mem_max` is the bytes' maximum
        before and (returned) after."""
        if sh is ShardingType.TABLE_ROW_WISE:
            n = self._emptiest_node(cols, mv)
            ranks = tuple(range(n * self.g, (n + 1) * self.g))
            c = cols.name(ranks)
            cols.data[0, c] += tv
            cols.data[1, c] += mv
            return ranks, max(mem_max, float(cols.data[1, c].max()))
        # each shard to the least-loaded rank with room (else the least loaded), not one of
        # the table's own; ties to the lowest rank (the ranks no shard is on share a column,
        # which stands for the lowest of them)
        chosen: list[int] = []
        roomy = mem_max + float(mv.max()) <= self.capacity  # no rank can run out
        for j in range(len(tv)):
            load, mem = cols.data
            key = load.copy() if roomy else load + (mem + mv[j] > self.capacity) * 1e9
            if not cols.axis.rest:  # one column per rank: column r is rank r
                key[chosen] = np.inf
                r = c = int(key.argmin())
            else:  # the chosen are named: each has its own column
                key[cols.axis.columns_of(chosen)] = np.inf
                r = cols.axis.lowest_rank_at_min(key)
                c = int(cols.name([r])[0])
                load, mem = cols.data
            chosen.append(r)
            load[c] += tv[j]
            mem[c] += mv[j]
            mem_max = max(mem_max, float(mem[c]))
        return tuple(chosen), mem_max

    def _emptiest_node(self, cols: RankColumns, mv: np.ndarray) -> int:
        """The node (g ranks) whose busiest rank is least loaded, among those where `mv` fits
        (else among all); ties to the lowest node. The nodes no shard is on are alike: the
        lowest of them stands for all."""
        g, axis = self.g, cols.axis
        touched = distinct_ascending(axis.named // g)
        free = first_missing(touched, self.W // g)
        nodes = touched if free is None else np.insert(touched, np.searchsorted(touched, free), free)
        c = axis.columns_of((nodes[:, None] * g + np.arange(g)).ravel())
        node_load = cols.data[0, c].reshape(-1, g).max(axis=1)
        room = (cols.data[1, c].reshape(-1, g) + mv).max(axis=1) <= self.capacity
        i = int(np.argmin(np.where(room, node_load, np.inf))) if room.any() else int(np.argmin(node_load))
        return int(nodes[i])

    def penalized(self, cost: EmbeddingCost) -> float:
        """The step, plus a penalty growing with how far the plan is over HBM or host memory."""
        penalty = 0.0 if cost.fits_hbm else 1e6 * float(cost.hbm_bytes.max() - cost.capacity_bytes) / self.capacity
        if not cost.fits_host:
            penalty += 1e6 * float(cost.host_bytes_per_host.max() / cost.host_capacity_bytes - 1.0)
        return cost.step_time_s + penalty

    def price(self, choice: dict) -> tuple[float, EmbeddingPlan, EmbeddingCost]:
        plan = self.place(choice)
        cost = evaluate(plan, self.wl, self.cluster, hbm_reserve_fraction=self.reserve, memo=self.memo,
                        per_table=False, runs=self.W >= RUNS_MIN_RANKS)
        self.evaluated += 1
        return self.penalized(cost), plan, cost


class _Repacking:
    """The search's working plan when every candidate is packed afresh, largest first (LPT
    over all tables): exact, at a cost that grows with the square of the tables."""

    def __init__(self, P: _Planner):
        self.P = P
        self.choice: dict = {}

    def start(self, choice: dict) -> tuple:
        self.choice = dict(choice)
        return self.P.price(self.choice)

    def priced(self) -> tuple:
        return self.P.price(self.choice)

    def trial(self, name: str, option: tuple) -> tuple:
        return self.P.price({**self.choice, name: option})

    def move(self, name: str, option: tuple) -> None:
        self.choice = {**self.choice, name: option}

    def snapshot(self):
        return dict(self.choice)

    def restore(self, snapshot) -> None:
        self.choice = dict(snapshot)

    def settle(self, best: tuple) -> tuple:
        return best

    def plan(self) -> EmbeddingPlan:
        return self.P.place(self.choice)


class _Packing:
    """The search's working plan when one table moves at a time: its shards come off and its
    new ones are placed onto the packing of the others, and the per-rank sums the cost model
    adds up follow (a move costs the table's shards and one pass over the ranks, where a
    re-pack costs every table): what keeps the search near-linear in the number of tables."""

    LOAD, MEM = len(FIELDS), len(FIELDS) + 1  # rows after the cost model's sums

    def __init__(self, P: _Planner):
        self.P = P
        self.choice: dict = {}
        self.ranks: dict[str, range | tuple[int, ...]] = {}

    def start(self, choice: dict) -> tuple:
        return self._packed(self.P.place(choice), choice)

    def _packed(self, plan: EmbeddingPlan, choice: dict) -> tuple:
        P = self.P
        self.choice, self.ranks = dict(choice), {}
        # the cost model's per-rank sums, then the table-alone loads the packing balances
        self.cols = P.columns(len(FIELDS) + 2)
        for p in plan.placements:
            self._add(p.table, self.choice[p.table], p.ranks, 1.0)
            self.ranks[p.table] = p.ranks
        return self.priced()

    def _add(self, name: str, option: tuple, ranks, sign: float) -> None:
        """Add (sign 1) or remove (sign -1) one table's shards on `ranks`."""
        P, (sh, k, kern, cache, hot) = self.P, option
        t = P.tables[name]
        c = remembered_contribution(P.memo, t, sh, len(ranks), kern, cache, hot, P.dedup, P.wl, P.cluster, P.W)
        time_v, mem_v = P.load(t, sh, k, kern, cache, hot)
        every = sh in (ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL)
        if every and c["alike"]:
            self.cols.data[:self.LOAD] += sign * c["stacked"][:, :1]
        else:
            cols = self.cols.name(rank_array(ranks))
            self.cols.data[:self.LOAD, cols] += sign * c["stacked"]
        if c["every_stacked"].any():  # hot-row replicas: a share on every rank
            self.cols.data[:self.LOAD] += sign * c["every_stacked"][:, None]
        if every:
            self.cols.data[self.LOAD] += sign * time_v[-1]
            self.cols.data[self.MEM] += sign * mem_v[-1]
        else:
            cols = self.cols.name(rank_array(ranks))
            self.cols.data[self.LOAD, cols] += sign * time_v[:k]
            self.cols.data[self.MEM, cols] += sign * mem_v[:k]

    def move(self, name: str, option: tuple) -> None:
        P, (sh, k, kern, cache, hot) = self.P, option
        self._add(name, self.choice[name], self.ranks[name], -1.0)
        if sh in (ShardingType.ROW_WISE, ShardingType.DATA_PARALLEL):
            ranks: range | tuple[int, ...] = range(P.W)
        else:
            time_v, mem_v = P.load(P.tables[name], sh, k, kern, cache, hot)
            loads = RankColumns.of(self.cols.axis, self.cols.data[self.LOAD:].copy())  # _add below adds the table's
            ranks = P.put(loads, float(loads.data[1].max()), sh, time_v[:k], mem_v[:k])[0]
        self._add(name, option, ranks, 1.0)
        self.choice[name], self.ranks[name] = option, ranks

    def priced(self) -> tuple:
        """(penalized step, None, cost): the shape `_better` compares."""
        cost = cost_from_sums(dict(zip(FIELDS, self.cols.data[:self.LOAD])), self.P.cluster, self.cols.axis,
                              self.P.reserve)
        self.P.evaluated += 1
        return self.P.penalized(cost), None, cost

    def trial(self, name: str, option: tuple) -> tuple:
        kept = self.choice[name], self.ranks[name], self.cols.copy()
        self.move(name, option)
        out = self.priced()
        self.choice[name], self.ranks[name], self.cols = kept
        return out

    def snapshot(self):
        return dict(self.choice), dict(self.ranks), self.cols.copy()

    def restore(self, snapshot) -> None:
        choice, ranks, cols = snapshot
        self.choice, self.ranks, self.cols = dict(choice), dict(ranks), cols.copy()

    def settle(self, best: tuple) -> tuple:
        """The moves leave holes where tables left: the chosen options packed afresh, kept when better."""
        repacked = self.P.price(self.choice)
        if _better(repacked, best):
            self._packed(repacked[1], self.choice)
            return repacked
        return best

    def plan(self) -> EmbeddingPlan:
        c = self.choice
        placements = tuple(TablePlacement(table=t.name, sharding=c[t.name][0], ranks=self.ranks[t.name],
                                          kernel=c[t.name][2], cache_ratio=c[t.name][3], hot_row_fraction=c[t.name][4])
                           for t in self.P.wl.tables)
        return EmbeddingPlan(placements=placements, world_size=self.P.W, dedup=self.P.dedup)


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
    return a[2].ranks_near_max(1e-6) < b[2].ranks_near_max(1e-6)


def _starts(S, P: _Planner, wl: EmbeddingWorkload) -> tuple:
    """Steps 2 and 3: every sharded table re-split one way (TorchRec's uniform proposer), and
    for each, data parallel for the k tables whose replicated cost is lowest relative to their
    sharded cost, k swept (one table at a time gains nothing while another rank ties). Leaves
    S at the best plan seen and returns its price."""
    W = P.W
    dp_option = (ShardingType.DATA_PARALLEL, W, ComputeKernel.DENSE, 0.0, 0.0)
    # choices: table -> (sharding, shards, kernel, cache ratio, hot-row share); hot rows come last (step 5)
    base = {t.name: (*P.shape(t), 0.0) for t in wl.tables}
    best = S.start(base)
    kept = S.snapshot()
    starts = [base] + [{n: (o if _movable(v) and _valid(P.tables[n], o, W, P.g) else v) for n, v in base.items()}
                       for o in _options(P, None)]
    for start in starts:
        priced = S.start(start)
        if _better(priced, best):
            best, kept = priced, S.snapshot()
        def dp_ratio(t):
            dp_v, _ = P.load(t, *dp_option[:4])
            return float(dp_v.max()) / max(P.rank_sum_s(t, *start[t.name][:4], start[t.name][4]) / W, 1e-30)
        for k, t in enumerate(sorted((t for t in wl.tables if P.replicable(t) and W > 1), key=dp_ratio), start=1):
            S.move(t.name, dp_option)
            if k > REPACK_MAX_TABLES and k % max(1, k // REPACK_MAX_TABLES) and k != len(wl.tables):
                continue  # past the first tables, k swept in steps of k/128 (under 1%)
            priced = S.priced()
            if _better(priced, best):
                best, kept = priced, S.snapshot()
    S.restore(kept)
    return S.settle(best)


def _costliest_first(S, P: _Planner) -> list[str]:
    """The tables by their busiest rank's seconds, the costliest first (at most the first
    REPACK_MAX_TABLES: the rest are small beside the ranks' loads)."""
    order = sorted(S.choice, key=lambda n: -float(P.load(P.tables[n], *S.choice[n])[0].max()))
    return order[:REPACK_MAX_TABLES]


def _local_search(S, P: _Planner, best: tuple) -> tuple:
    """Step 4, costliest tables first: the best option for one table at a time (NeuroShard's
    beam over column splits, widened to every sharding type), two rounds at most."""
    for _ in range(2):
        improved = False
        for name in _costliest_first(S, P):
            pick = None
            for option in _options(P, P.tables[name]):
                if option[:4] == (pick or S.choice[name])[:4]:
                    continue
                priced = S.trial(name, option)
                if _better(priced, best):
                    best, pick = priced, option
            if pick is not None:
                S.move(name, pick)
                improved = True
        settled = S.settle(best)
        improved, best = improved or settled is not best, settled
        if not improved:
            break
    return best


def _hot_rows(S, P: _Planner, best: tuple) -> tuple:
    """Step 5, hot-row replication (FlexShard): per table, costliest first, the replicated
    share of its hottest rows that lowers the whole step (every rank pays each table's
    all-reduce)."""
    for name in _costliest_first(S, P):
        if P.tables[name].access is None or S.choice[name][0] is ShardingType.DATA_PARALLEL:
            continue
        pick = None
        for f in HOT_ROW_FRACTIONS[1:]:
            priced = S.trial(name, (*S.choice[name][:4], f))
            if _better(priced, best):
                best, pick = priced, (*S.choice[name][:4], f)
        if pick is not None:
            S.move(name, pick)
    return S.settle(best)


def plan_embeddings(wl: EmbeddingWorkload, cluster: ClusterSpec, *, world_size: int | None = None,
                    hot_rows: bool = False, dedup: bool = False,
                    hbm_reserve_fraction: float = 0.15) -> EmbeddingSearchResult:
    """The fastest plan found for `wl` on `world_size` ranks of `cluster`."""
    W = world_size or cluster.num_gpus
    if not 1 <= W <= MAX_DEGREE:  # the GPU counts tested (benchmarks/README.md), as for the training commands
        raise SpecError("embeddings", "--gpus", W, f"a whole number from 1 to {MAX_DEGREE:,} is required")
    P = _Planner(wl, cluster, W, hbm_reserve_fraction, dedup)
    # exact re-packing while tables² stays small; one table moved at a time beyond
    S = _Repacking(P) if len(wl.tables) <= REPACK_MAX_TABLES else _Packing(P)
    best = _local_search(S, P, _starts(S, P, wl))
    if hot_rows:
        _hot_rows(S, P, best)
    plan = S.plan()
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
