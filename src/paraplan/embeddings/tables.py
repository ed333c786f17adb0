"""Embedding workload specs: tables, their access statistics, batch and optimizer.

Notation (per table t): N rows, D dim, P pooling factor (ids per sample), e bytes per
weight element. A batch of G samples (B per rank × W ranks) looks up n = G·P ids, of which
U are distinct rows.

Access statistics come from locality measurements (facebookresearch/dlrm_datasets,
`locality_stats.txt`): the share of a batch's indices that fall on rows accessed 1, 2, 3-4,
... times. From it follow the two quantities that hot-row replication (FlexShard, Sethi et
al. 2023) and in-batch deduplication (RecD, Zhao et al. MLSys 2023) act on: how many
accesses the hottest k rows take, and the share of distinct ids U/n.
"""

from __future__ import annotations

import csv
import io
import math
import tomllib
from dataclasses import dataclass, field, replace
from enum import StrEnum
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import FileFormatError, SpecError, UnknownPresetError
from ..specs.files import read_text


class Optimizer(StrEnum):
    """Sparse optimizers fused into the embedding backward (FBGEMM TBE)."""

    ROWWISE_ADAGRAD = "rowwise_adagrad"  # one fp32 accumulator per row
    ADAM = "adam"                        # two fp32 moments per element

    def state_bytes_per_row(self, dim: int) -> float:
        return 4.0 if self is Optimizer.ROWWISE_ADAGRAD else 8.0 * dim


@dataclass(frozen=True, kw_only=True)
class AccessProfile:
    """How one batch's lookups spread over rows (a locality measurement).

    `index_share[i]` is the share of the batch's indices on rows accessed (edge[i],
    edge[i+1]] times (the last bin open); `unique_share` = U/n."""

    name: str
    bin_edges: tuple[int, ...]
    index_share: tuple[float, ...]
    unique_share: float
    ids_per_sample_per_table: float = 1.0  # mean pooling factor: indices / (batch · tables)
    source: str = field(default="", compare=False)

    def hot_curve(self):
        """(row share, access share) of the hottest rows, cumulative from the hottest.

        Rows per bin = indices in the bin / accesses per row, taken at the bin's geometric
        middle (√(lo·hi); 2·lo for the open last bin): an assumption of the histogram's
        resolution, stated in docs/model.md."""
        edges = np.asarray(self.bin_edges, dtype=float)
        lo = edges
        hi = np.append(edges[1:], 2.0 * edges[-1])
        mid = np.sqrt(np.maximum(lo, 1.0) * hi)
        share = np.asarray(self.index_share, dtype=float)
        share = share / share.sum()
        rows = share / mid
        order = np.argsort(-mid)  # hottest bin first
        row_cum = np.concatenate([[0.0], np.cumsum(rows[order]) / rows.sum()])
        acc_cum = np.concatenate([[0.0], np.cumsum(share[order])])
        return row_cum, acc_cum

    def access_share_of_hottest(self, row_fraction):
        """Share of accesses that the hottest `row_fraction` of a batch's distinct rows take
        (piecewise linear inside a bin, whose rows are equally hot)."""
        row_cum, acc_cum = self.hot_curve()
        return np.interp(np.clip(row_fraction, 0.0, 1.0), row_cum, acc_cum)


@dataclass(frozen=True, kw_only=True)
class EmbeddingTable:
    name: str
    num_rows: int
    dim: int
    pooling_factor: float = 1.0
    weight_bytes: float = 4.0  # fp32 weights (TorchRec's default data type)
    access: AccessProfile | None = None

    @property
    def weight_bytes_total(self) -> float:
        return float(self.num_rows) * self.dim * self.weight_bytes

    def unique_share(self, num_ids: float) -> float:
        """U/n for n ids: the profile's measurement, or, without one, uniform access:
        E[U] = N·(1 − (1 − 1/N)^n) (balls into bins), which matters for small tables."""
        if self.access is not None:
            return self.access.unique_share
        n = max(float(num_ids), 1.0)
        N = float(self.num_rows)
        expected = N * -math.expm1(n * math.log1p(-1.0 / N)) if N > 1 else 1.0
        return min(1.0, expected / n)


@dataclass(frozen=True, kw_only=True)
class EmbeddingWorkload:
    name: str
    tables: tuple[EmbeddingTable, ...]
    batch_size_per_rank: int
    optimizer: Optimizer = Optimizer.ROWWISE_ADAGRAD
    id_bytes: float = 8.0          # TBE takes int64 indices (TorchRec prices them so too)
    output_comm_bytes: float = 4.0  # pooled embeddings and their gradients on the wire (fp32)
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"embedding workload {self.name!r}"
        if not self.tables:
            raise SpecError(where, "tables", 0, "at least one table is required")
        names = [t.name for t in self.tables]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise SpecError(where, "tables", dup[0], "table names must be unique")
        if self.batch_size_per_rank < 1:
            raise SpecError(where, "batch_size_per_rank", self.batch_size_per_rank, "a positive integer is required")

    def with_batch(self, batch_size_per_rank: int) -> "EmbeddingWorkload":
        return replace(self, batch_size_per_rank=batch_size_per_rank)

    def with_access(self, profile: AccessProfile | None) -> "EmbeddingWorkload":
        return replace(self, tables=tuple(replace(t, access=profile) for t in self.tables))

    @property
    def total_weight_bytes(self) -> float:
        return sum(t.weight_bytes_total for t in self.tables)


# ----------------------------------------------------------------------------- loading

_CATALOG = "paraplan.specs.catalog"
PRESETS = {
    "criteo-1tb": "the 26 Criteo-1TB tables of TorchRec's DLRM example (dim 128, one id per table)",
    "dlrm-skewed": "96 synthetic tables (10k-100M rows, dim 128), pooling and skew of Meta's DLRM 2022 locality data",
}
DEFAULT_PRESET = "criteo-1tb"


def _catalog_text(name: str) -> str:
    return resources.files(_CATALOG).joinpath("embeddings", name).read_text()


def load_profile(path_or_name: str = "dlrm-2022") -> AccessProfile:
    """A locality profile: the built-in DLRM 2022 one, or a TOML file of the same schema."""
    if path_or_name == "dlrm-2022":
        text, shown = _catalog_text("dlrm-2022-locality.toml"), "dlrm-2022-locality.toml"
    else:
        text, shown = read_text(Path(path_or_name), str(path_or_name)), str(path_or_name)
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FileFormatError(shown, f"invalid TOML: {exc}") from None
    for key in ("bin_edges", "index_share", "num_indices", "num_unique_rows"):
        if key not in d:
            raise FileFormatError(shown, f"missing field {key!r}")
    if len(d["bin_edges"]) != len(d["index_share"]):
        raise FileFormatError(shown, f"bin_edges has {len(d['bin_edges'])} entries, index_share {len(d['index_share'])}; they must match")
    return AccessProfile(name=d.get("name", shown), bin_edges=tuple(int(x) for x in d["bin_edges"]),
                         index_share=tuple(float(x) for x in d["index_share"]),
                         unique_share=float(d["num_unique_rows"]) / float(d["num_indices"]),
                         ids_per_sample_per_table=(float(d["num_indices"]) / (d["batch_size"] * d["num_tables"])
                                                   if "batch_size" in d and "num_tables" in d else 1.0),
                         source=d.get("source", shown))


def _tables_from_csv(text: str, shown: str) -> tuple[EmbeddingTable, ...]:
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    need = {"name", "num_rows", "dim"}
    if reader.fieldnames is None or not need <= set(reader.fieldnames):
        raise FileFormatError(shown, f"header must have columns {sorted(need)} (optional: pooling_factor, weight_bytes); got {reader.fieldnames}")
    out = []
    for i, row in enumerate(reader, start=2):
        def num(key, kind, default=None, minimum=1):
            raw = (row.get(key) or "").strip()
            if not raw and default is not None:
                return default
            try:
                v = kind(raw)
            except ValueError:
                raise FileFormatError(shown, f"field {key}={raw!r} is not a number", line=i) from None
            if v < minimum:
                raise FileFormatError(shown, f"field {key}={raw!r} must be >= {minimum}", line=i)
            return v
        out.append(EmbeddingTable(name=row["name"].strip(), num_rows=num("num_rows", int), dim=num("dim", int),
                                  pooling_factor=num("pooling_factor", float, 1.0, minimum=0),
                                  weight_bytes=num("weight_bytes", float, 4.0, minimum=0.5)))
    if not out:
        raise FileFormatError(shown, "no tables")
    return tuple(out)


def skewed_tables(profile: AccessProfile, num_tables: int = 96) -> tuple[EmbeddingTable, ...]:
    """The `dlrm-skewed` preset: row counts log-spaced from 10^4 to 10^8 (deterministic), dim
    128, the profile's mean pooling factor n/(batch·tables) and its access skew."""
    rows = np.logspace(4, 8, num_tables)
    pooling = round(profile.ids_per_sample_per_table, 2)
    return tuple(EmbeddingTable(name=f"t{i}", num_rows=int(round(r)), dim=128, pooling_factor=pooling, access=profile)
                 for i, r in enumerate(rows))


def load_embedding_workload(name_or_path: str = DEFAULT_PRESET, batch_size_per_rank: int = 512,
                            optimizer: Optimizer = Optimizer.ROWWISE_ADAGRAD) -> EmbeddingWorkload:
    """A preset (`criteo-1tb`, `dlrm-skewed`) or a CSV of tables (name,num_rows,dim[,pooling_factor])."""
    if name_or_path == "criteo-1tb":
        tables = _tables_from_csv(_catalog_text("criteo-1tb.csv"), "criteo-1tb.csv")
        source = "pytorch/torchrec@a48cef79 examples/nvt_dataloader/README.md"
    elif name_or_path == "dlrm-skewed":
        profile = load_profile()
        tables, source = skewed_tables(profile), profile.source
    else:
        path = Path(name_or_path)
        if path.suffix.lower() != ".csv":
            raise UnknownPresetError("embedding workload", str(name_or_path), list(PRESETS))
        tables, source = _tables_from_csv(read_text(path, str(path)), str(path)), str(path)
    return EmbeddingWorkload(name=Path(str(name_or_path)).stem, tables=tables, batch_size_per_rank=batch_size_per_rank,
                             optimizer=optimizer, source=source)
