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
from collections import Counter
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from importlib import resources
from pathlib import Path

import numpy as np

from ..errors import FileFormatError, SpecError, UnknownPresetError
from ..specs.catalog import TomlTable
from ..specs.files import parse_toml, read_text, read_toml


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
        n = max(float(num_ids), 1.0)
        N = float(self.num_rows)
        if self.access is not None:  # never more distinct rows than the table has
            return min(self.access.unique_share, N / n)
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
        dup = sorted(n for n, count in Counter(t.name for t in self.tables).items() if count > 1)
        if dup:
            raise SpecError(where, "tables", dup[0], "table names must be unique")
        if self.batch_size_per_rank < 1:
            raise SpecError(where, "batch_size_per_rank", self.batch_size_per_rank, "a positive integer is required")

    def with_batch(self, batch_size_per_rank: int) -> "EmbeddingWorkload":
        return replace(self, batch_size_per_rank=batch_size_per_rank)

    def with_access(self, profile: AccessProfile | None) -> "EmbeddingWorkload":
        return replace(self, tables=tuple(replace(t, access=profile) for t in self.tables))

    @cached_property
    def table_named(self) -> dict[str, EmbeddingTable]:
        """Each table by its name (built once: a plan's pricing looks tables up by name)."""
        return {t.name: t for t in self.tables}

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


PROFILE_FIELDS = ("bin_edges", "index_share", "num_indices", "num_unique_rows")
PROFILE_OPTIONAL = ("name", "source", "batch_size", "num_tables")
SHARE_SUM_TOLERANCE = 0.02  # published shares are rounded (DLRM 2022's 17 three-digit shares sum to 1.002)


def load_profile(path_or_name: str = "dlrm-2022") -> AccessProfile:
    """A locality profile: the built-in DLRM 2022 one, or a TOML file of the same schema.
    A bad field is one FileFormatError naming the file, its line, the field and the value."""
    if path_or_name == "dlrm-2022":
        text, shown = _catalog_text("dlrm-2022-locality.toml"), "dlrm-2022-locality.toml"
        d = parse_toml(text, shown)
    else:
        shown = str(path_or_name)
        d, text = read_toml(Path(path_or_name), shown)
    t = TomlTable(d, shown, text)
    t.check_keys(PROFILE_FIELDS, PROFILE_OPTIONAL)
    edges = _profile_list(t, "bin_edges", lambda e: isinstance(e, int) and e >= 0, "whole access counts >= 0")
    for i, (lo, hi) in enumerate(zip(edges, edges[1:]), start=1):
        if lo >= hi:
            t.fail("bin_edges", f"field 'bin_edges'[{i}] = {hi!r} is not allowed; the edges must increase strictly "
                                "(bin i holds rows accessed (edge[i], edge[i+1]] times)")
    share = _profile_list(t, "index_share", lambda x: isinstance(x, (int, float)) and 0 <= x <= 1, "shares in [0, 1]")
    if len(share) != len(edges):
        t.fail("index_share", f"field 'index_share' has {len(share)} entries, bin_edges {len(edges)}; "
                              "one share per bin is required")
    if abs(sum(share) - 1.0) > SHARE_SUM_TOLERANCE:
        t.fail("index_share", f"field 'index_share' sums to {sum(share):.4g}; the shares of a batch's indices "
                              f"must sum to 1 (within {SHARE_SUM_TOLERANCE} for rounding)")
    num_indices, num_unique = t.int_("num_indices"), t.int_("num_unique_rows")
    if num_unique > num_indices:
        t._bad("num_unique_rows", num_unique, f"at most num_indices = {num_indices} (distinct rows of the batch's indices)")
    batch, tables = t.int_("batch_size"), t.int_("num_tables")
    if (batch is None) != (tables is None):
        key = "batch_size" if tables is None else "num_tables"
        t.fail(key, f"field {key!r} without {'num_tables' if tables is None else 'batch_size'}: give both "
                    "(ids per sample per table = num_indices / (batch_size · num_tables)) or neither")
    return AccessProfile(name=t.str_("name", shown) or shown, bin_edges=tuple(edges),
                         index_share=tuple(float(x) for x in share), unique_share=num_unique / num_indices,
                         ids_per_sample_per_table=num_indices / (batch * tables) if batch else 1.0,
                         source=t.str_("source", shown) or shown)


def _profile_list(t: TomlTable, key: str, ok, what: str) -> list:
    """A non-empty list field whose entries pass `ok`; the error names the first bad entry."""
    v = t.data[key]
    if not isinstance(v, list) or not v:
        t._bad(key, v, f"a non-empty list of {what}")
    for i, e in enumerate(v):
        if isinstance(e, bool) or not ok(e):
            t.fail(key, f"field '{key}'[{i}] = {e!r} is not allowed; a list of {what} is required")
    return v


INT64_MAX = 2**63 - 1  # TBE indexes rows with int64 ids
OPTIONAL_COLUMNS = ("pooling_factor", "weight_bytes")
MAX_WEIGHT_BYTES = 8.0  # bytes per weight element: int4 (0.5) up to fp64 (8)
# ids per sample per table: a bound on input sanity, far above any published feature
# (the DLRM datasets' mean is some tens; TorchRec's examples use 1-100)
MAX_POOLING_FACTOR = 1e6


def _tables_from_csv(text: str, shown: str) -> tuple[EmbeddingTable, ...]:
    """Tables from CSV text; `#` lines are comments. Errors name the line of the file."""
    numbered = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if not ln.lstrip().startswith("#")]
    reader = csv.reader(io.StringIO("\n".join(ln for _, ln in numbered)))

    def line_no() -> int:  # the file's line of the reader's last physical line
        return numbered[reader.line_num - 1][0] if 0 < reader.line_num <= len(numbered) else reader.line_num

    try:
        header = [h.strip().lstrip("\ufeff") for h in next(reader, [])]
        need = {"name", "num_rows", "dim"}
        unknown = [h for h in header if h not in need | set(OPTIONAL_COLUMNS)]
        if unknown:
            raise FileFormatError(shown, f"column {unknown[0]!r} is not allowed; allowed: name, num_rows, dim, "
                                  f"{', '.join(OPTIONAL_COLUMNS)}", line=line_no() or None)
        if not need <= set(header):
            raise FileFormatError(shown, f"header must have columns {sorted(need)} (optional: pooling_factor, "
                                  f"weight_bytes); got {header or None}", line=line_no() or None)
        out = []
        for cells in reader:
            if not cells:
                continue  # a blank line
            i = line_no()
            row = dict(zip(header, cells))
            if len(cells) > len(header) or not need <= set(row):  # trailing optional cells may be left out
                raise FileFormatError(shown, f"the row has {len(cells)} cells, the header {len(header)}; "
                                      "every row needs one cell per column (optional ones may be left out at the end)",
                                      line=i)
            name = row["name"].strip()
            if not name:
                raise FileFormatError(shown, f"field name={row['name']!r} is not allowed; a non-empty table name "
                                      "is required", line=i)
            out.append(EmbeddingTable(name=name, num_rows=_cell(row, "num_rows", int, shown, i, maximum=INT64_MAX),
                                      dim=_cell(row, "dim", int, shown, i),
                                      pooling_factor=_cell(row, "pooling_factor", float, shown, i, 1.0, minimum=0,
                                                           maximum=MAX_POOLING_FACTOR),
                                      weight_bytes=_cell(row, "weight_bytes", float, shown, i, 4.0, minimum=0.5,
                                                         maximum=MAX_WEIGHT_BYTES)))
    except csv.Error as exc:
        raise FileFormatError(shown, f"not a valid CSV row: {exc}", line=line_no()) from None
    if not out:
        raise FileFormatError(shown, "no tables")
    return tuple(out)


def _cell(row: dict, key: str, kind, shown: str, line: int, default=None, minimum=1, maximum=None):
    """A number cell of a tables CSV: an integer (kind int) or a finite number in [minimum, maximum]."""
    raw = (row.get(key) or "").strip()
    if not raw and default is not None:
        return default
    what = "a whole number (in digits)" if kind is int else "a finite number"
    allowed = f"{what} >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "") + " is required"
    try:
        v = kind(raw)
    except ValueError:
        try:
            float(raw)
        except ValueError:
            raise FileFormatError(shown, f"field {key}={raw!r} is not a number; {allowed}", line=line) from None
        raise FileFormatError(shown, f"field {key}={raw!r} is not allowed; {allowed}", line=line) from None
    if not math.isfinite(v) or v < minimum or (maximum is not None and v > maximum):
        raise FileFormatError(shown, f"field {key}={raw!r} is not allowed; {allowed}", line=line)
    return v


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
