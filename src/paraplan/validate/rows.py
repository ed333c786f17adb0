"""What training and inference validation share: reading a measurements CSV, one row's
result record (the `validate --json` contract of ../shared/validation/README.md), the loop
that skips a row with its reason, and the error summary."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from ..errors import FileFormatError, ParaplanError


def read_rows(path: str, required: tuple[str, ...], kind: str) -> list[tuple[int, dict]]:
    """(line number, row) of every data row; a missing column names the file and line 1."""
    p = Path(path)
    if not p.is_file():
        raise FileFormatError(path, "no such file")
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise FileFormatError(path, f"missing column(s) {', '.join(missing)}; {kind} needs "
                                  f"{', '.join(required)}", 1)
        return [(reader.line_num, row) for row in reader]


def int_cell(row: dict, key: str, path: str, line: int) -> int | None:
    """An integer column (blank: None); a non-number names the file, line and column."""
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        return int(float(text))
    except ValueError:
        raise FileFormatError(path, f"column {key!r}: {text!r} is not a number", line) from None


def row_result(row: dict, path: str, line: int, metrics: tuple[str, ...]) -> dict:
    """The row's record before prediction; `skipped` is set when its metric is unknown."""
    metric = row["metric_id"].strip()
    try:
        measured = float(row["value"])
    except ValueError:
        raise FileFormatError(path, f"column 'value': {row['value']!r} is not a number", line) from None
    out = {"id": row["id"], "source": row["source"], "model": row["model"], "metric_id": metric,
           "measured": measured, "predicted": None, "error_pct": None, "skipped": None, "plan": None}
    if metric not in metrics:
        out["skipped"] = f"unknown metric_id {metric!r}"
    return out


def with_prediction(out: dict, predicted: float, plan: str, note: str | None = None) -> dict:
    """error_pct = 100 × (predicted − measured) / measured."""
    out.update(predicted=predicted, error_pct=100.0 * (predicted - out["measured"]) / out["measured"],
               plan=plan, note=note)
    return out


def validate_rows(rows: list[tuple[int, dict]], predict, progress=None) -> dict:
    """Predict every row; a user-level error on one row skips that row with its reason."""
    out = []
    for i, (line, row) in enumerate(rows):
        try:
            out.append(predict(row, line))
        except ParaplanError as exc:
            if isinstance(exc, FileFormatError):
                raise
            out.append({"id": row.get("id"), "source": row.get("source"), "model": row.get("model"),
                        "metric_id": row.get("metric_id"), "measured": float(row.get("value") or "nan"),
                        "predicted": None, "error_pct": None, "skipped": str(exc), "plan": None})
        if progress:
            progress(i + 1, len(rows))
    return {"rows": out, "summary": summarize(out)}


def source_group(source: str) -> str:
    """A publication/table, without the per-row locator (data row, line number)."""
    return re.sub(r"(,? ?(table header line|data row|line) \d+)+", "", source).replace(" ()", "").strip()


def summarize(rows: list[dict]) -> dict:
    done = [r for r in rows if r["skipped"] is None]
    errs = sorted(abs(r["error_pct"]) for r in done)
    by_source: dict = {}
    for r in done:
        key = source_group(r["source"])
        by_source.setdefault(key, []).append(abs(r["error_pct"]))

    def pct(q):
        if not errs:
            return None
        i = min(len(errs) - 1, max(0, math.ceil(q * len(errs)) - 1))
        return errs[i]

    return {
        "n": len(rows), "n_predicted": len(done), "n_skipped": len(rows) - len(done),
        "mean_abs_pct_error": sum(errs) / len(errs) if errs else None,
        "p90_abs_pct_error": pct(0.9),
        "max_abs_pct_error": errs[-1] if errs else None,
        "by_source": {k: {"n": len(v), "mean_abs_pct_error": sum(v) / len(v)} for k, v in by_source.items()},
    }
