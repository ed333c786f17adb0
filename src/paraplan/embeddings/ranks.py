"""Per-rank quantities kept in run-length form: one column per rank some shard singled out,
and one column that every other rank shares.

At 262,144 ranks most tables are row-wise or data-parallel: their shards are alike on every
rank, so all the ranks no table-wise or column-wise shard landed on hold the same value.
The search keeps those ranks as one column with a count, and its cost then grows with the
ranks that differ, not with the world. Element-wise arithmetic on the columns is, bit for
bit, the arithmetic on each rank (the same operations in the same order); what counts or
orders ranks (the ranks at the maximum, the least-loaded rank, the host sums) reads the
named ranks and the count of the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# From this many ranks the embedding search and evaluate keep per-rank arrays in run-length
# form; below, one entry per rank (a rank named one at a time costs more than a short
# array): Criteo-1TB `embeddings --gpus N --json` took 4.6 s one-per-rank vs 5.1 s run-length
# at 4,096 GPUs, 8.1 s vs 5.8 s at 8,192 (2026-11-29, a loaded 2-core VM). Outputs are the
# same either way (tests/test_embeddings_runs.py).
RUNS_MIN_RANKS = 8192


@dataclass(frozen=True, kw_only=True)
class RankAxis:
    """Which ranks a per-rank array's columns stand for: `named` (ascending), one column
    each, then, while some rank is unnamed, one column all the unnamed ranks share."""

    world_size: int
    named: np.ndarray
    rest: int = field(init=False)  # how many ranks the last (shared) column stands for; 0: no such column

    def __post_init__(self) -> None:
        object.__setattr__(self, "rest", self.world_size - len(self.named))

    @staticmethod
    def every_rank(world_size: int) -> "RankAxis":
        return RankAxis(world_size=world_size, named=np.arange(world_size))

    @property
    def num_columns(self) -> int:
        return len(self.named) + (1 if self.rest else 0)

    @property
    def counts(self) -> np.ndarray:
        """Ranks per column."""
        return np.concatenate([np.ones(len(self.named), dtype=np.int64), [self.rest] if self.rest else []])

    def columns_of(self, ranks: np.ndarray) -> np.ndarray:
        """Columns of `ranks` (an unnamed rank reads the shared column)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        if not self.rest:  # every rank named: column r is rank r
            return ranks
        if not len(self.named):
            return np.zeros(len(ranks), dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.named, ranks), len(self.named) - 1)
        return np.where(self.named[pos] == ranks, pos, len(self.named))

    def first_unnamed(self) -> int | None:
        """The lowest rank no column names (None: every rank is named)."""
        return first_missing(self.named, self.world_size)

    def lowest_rank_at_min(self, key: np.ndarray) -> int:
        """The lowest rank whose column holds `key`'s minimum: np.argmin over one entry per rank."""
        i = int(key.argmin())
        if not self.rest:
            return i
        if i == len(self.named):  # only the shared column holds it
            return int(self.first_unnamed())
        r = int(self.named[i])
        return min(r, int(self.first_unnamed())) if key[-1] == key[i] else r

    def expand(self, values: np.ndarray) -> np.ndarray:
        """`values` (one per column) as one per rank."""
        out = np.full(self.world_size, values[-1] if self.rest else 0.0, dtype=float)
        out[self.named] = values[: len(self.named)]
        return out

    def group_sums(self, values: np.ndarray, group_size: int) -> np.ndarray:
        """Sums over consecutive groups of `group_size` ranks (hosts), each added rank by rank
        in order as np.bincount adds them; one group stands for every group no named rank
        is in (they are alike), plus the last one when it is shorter."""
        W = self.world_size
        if not self.rest:
            return np.bincount(np.arange(W) // group_size, weights=values[:W])
        touched = distinct_ascending(self.named // group_size)
        free = first_missing(touched, W // group_size)  # a whole group no named rank is in
        groups = np.union1d(touched, [g for g in (free, (W - 1) // group_size) if g is not None])
        ranks = (groups.astype(np.int64)[:, None] * group_size + np.arange(group_size)).ravel()
        ranks = ranks[ranks < W]  # each group's ranks in order, as np.bincount adds them
        return np.bincount(np.searchsorted(groups, ranks // group_size), weights=values[self.columns_of(ranks)])


def distinct_ascending(ascending: np.ndarray) -> np.ndarray:
    """The distinct values of an ascending array."""
    return ascending[np.concatenate([[True], ascending[1:] != ascending[:-1]])] if len(ascending) else ascending


def first_missing(ascending: np.ndarray, limit: int) -> int | None:
    """The lowest of 0, 1, ..., limit − 1 not in `ascending` (distinct, ascending); None: all are."""
    gaps = np.nonzero(ascending != np.arange(len(ascending)))[0]
    first = int(gaps[0]) if len(gaps) else len(ascending)
    return first if first < limit else None


class RankColumns:
    """Rows of per-rank quantities (e.g. seconds and bytes) over a RankAxis that grows as
    shards name ranks: a newly named rank's column starts as a copy of the shared one."""

    def __init__(self, world_size: int, rows: int, every_rank: bool = False):
        """`rows` zero rows; `every_rank`: each rank its own column from the start."""
        self.axis = RankAxis.every_rank(world_size) if every_rank else \
            RankAxis(world_size=world_size, named=np.zeros(0, dtype=np.int64))
        self.data = np.zeros((rows, world_size if every_rank else 1))

    @staticmethod
    def of(axis: RankAxis, data: np.ndarray) -> "RankColumns":
        """Rows `data` over the columns of `axis` (kept, not copied)."""
        out = RankColumns.__new__(RankColumns)
        out.axis, out.data = axis, data
        return out

    def copy(self) -> "RankColumns":
        return RankColumns.of(self.axis, self.data.copy())

    def name(self, ranks) -> np.ndarray:
        """The columns of `ranks`, each given its own column first where it had none."""
        ranks = np.asarray(ranks, dtype=np.int64)
        cols = self.axis.columns_of(ranks)
        if not self.axis.rest:
            return cols
        new = ranks[cols == len(self.axis.named)]  # those reading the shared column
        if len(new):
            new = np.unique(new) if len(new) > 1 else new
            named = np.insert(self.axis.named, np.searchsorted(self.axis.named, new), new)
            keep = np.searchsorted(named, self.axis.named)
            data = np.empty((self.data.shape[0], len(named) + (1 if len(named) < self.axis.world_size else 0)))
            data[:] = self.data[:, -1:]  # every newly named rank holds what the shared column held
            data[:, keep] = self.data[:, : len(self.axis.named)]
            self.axis, self.data = RankAxis(world_size=self.axis.world_size, named=named), data
            cols = self.axis.columns_of(ranks)
        return cols
