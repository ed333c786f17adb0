"""What training and inference validation share: reading a measurements CSV, one row's
result record (the `validate --json` contract of ../shared/validation/README.md), the loop
that skips a row with its reason, and the error summary.

A file that is not a CSV of the documented columns (a missing or doubled column, a row with
the wrong number of cells, a file that is not UTF-8) is a FileFormatError: nothing is
predicted. A row whose cell paraplan cannot read (a non-integer where a count is required, a
count below its minimum, a measured value that is not a positive finite number, a label it
does not know) is skipped with a RowError naming the file, line, column and value, and so is a
row that lacks what a prediction needs (a blank sequence length, a GPU without a preset, an
unknown metric: SpecError); every other row is still predicted and reported.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import stat
from pathlib import Path

from ..errors import FileFormatError, ParaplanError, RowError, SpecError
# Counts (GPUs, tokens, sequences, layers, degrees) above int32 are not a run anyone measured,
# and the planner's integer arithmetic is not meant for them: the catalog's bound.
from ..specs.files import MAX_COUNT, read_text
from .memory import memory_summary


def _text(path: str) -> str:
    """The file's text: UTF-8 (a leading byte-order mark is dropped); else the line of the first bad byte."""
    return read_text(Path(path), path)


def misspelled_column(header, known) -> tuple[str, str] | None:
    """(column, the known column it is close to) for the first header column paraplan does not
    read that looks like a misspelling of one it does ('tpp' for 'tp'): read as an annotation,
    it would silently unpin what it meant to pin. Columns like no known one are annotations."""
    import difflib
    for col in header:
        if col in known:
            continue
        close = difflib.get_close_matches(col.strip().lower(), known, n=1, cutoff=0.8)
        if close:
            return col, close[0]
    return None


def read_rows(path: str, required: tuple[str, ...], kind: str, known: tuple[str, ...] = ()) -> list[tuple[int, dict]]:
    """(line number, row) of every data row; a missing column names the file and line 1, a
    row with more or fewer cells than the header its line; a column that looks like a
    misspelling of a `known` one line 1 too."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileFormatError(path, "no such file") from None
    except OSError as exc:  # a name too long for a file, a symbolic-link loop
        raise FileFormatError(path, f"cannot use path: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise FileFormatError(path, f"is a directory; {kind} (CSV) is required")
    if os.path.samestat(st, os.stat(os.devnull)):
        raise FileFormatError(path, f"is empty; {kind} needs a header and at least one row")
    if not stat.S_ISREG(st.st_mode):  # a pipe or a device may never end
        raise FileFormatError(path, f"is not a regular file; {kind} (CSV) is required")
    text = _text(path)
    if not text.strip():
        raise FileFormatError(path, f"is empty; {kind} needs a header and at least one row")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = reader.fieldnames or []
        twice = sorted({c for c in header if header.count(c) > 1})
        if twice:  # csv.DictReader would keep the last cell of each and drop the others
            raise FileFormatError(path, f"column {twice[0]!r} appears {header.count(twice[0])} times in the header; "
                                  "each column may appear once", 1)
        missing = [c for c in required if c not in header]
        if missing:
            raise FileFormatError(path, f"missing column(s) {', '.join(missing)}; {kind} needs "
                                  f"{', '.join(required)}", 1)
        typo = misspelled_column(header, tuple(known) + tuple(required))
        if typo:
            raise FileFormatError(path, f"column {typo[0]!r} is not one paraplan reads; did you mean {typo[1]!r}? "
                                  "(rename it, or it would be ignored)", 1)
        rows = []
        for row in reader:
            extra = row.get(None) or []
            cells = len(header) + len(extra) - sum(v is None for k, v in row.items() if k is not None)
            if cells != len(header):
                raise FileFormatError(path, f"the row has {cells} cells, the header {len(header)}; every row "
                                      "needs one cell per column (blank cells are allowed)", reader.line_num)
            rows.append((reader.line_num, row))
    except csv.Error as exc:
        raise FileFormatError(path, f"not a valid CSV row: {exc}", reader.line_num) from None
    if not rows:  # a summary of nothing would read as a pass
        raise FileFormatError(path, f"no data rows; {kind} needs a header and at least one row")
    return rows


def int_cell(row: dict, key: str, path: str, line: int, minimum: int = 1) -> int | None:
    """An integer column in [minimum, MAX_COUNT] (blank: None); anything else is a RowError
    naming the file, line, column and value. "8.0" and "1e3" are integers; "2.5", "inf" and
    "nan" are not."""
    text = (row.get(key) or "").strip()
    if not text:
        return None
    allowed = f"a whole number from {minimum} to {MAX_COUNT} is required"
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise RowError(path, line, key, f"{text!r} is not a number; {allowed}") from None
        if not number.is_integer():  # also false for inf and nan
            raise RowError(path, line, key, f"{text!r} is not allowed; {allowed}") from None
        value = int(number)
    if not minimum <= value <= MAX_COUNT:
        raise RowError(path, line, key, f"{text!r} is not allowed; {allowed}")
    return value


def required_int(row: dict, key: str, path: str, line: int, needed_for: str) -> int:
    """An integer column the prediction needs: a blank cell skips the row with the reason."""
    value = int_cell(row, key, path, line)
    if value is None:
        raise SpecError("row", key, "", f"{needed_for} needs it (a whole number >= 1)")
    return value


def measured_value(row: dict) -> float | None:
    """The row's measured value, or None where the cell is not a positive finite number."""
    try:
        measured = float((row.get("value") or "").strip())
    except ValueError:
        return None
    return measured if math.isfinite(measured) and measured > 0 else None


def row_result(row: dict, path: str, line: int, metrics: tuple[str, ...]) -> dict:
    """The row's record before prediction; `skipped` is set when its metric is unknown."""
    metric = row["metric_id"].strip()
    measured = measured_value(row)
    if measured is None:
        text = row["value"].strip()
        raise RowError(path, line, "value", f"{text!r} is not allowed; a measured value is a positive finite number")
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
    """Predict every row; a user-level error on one row (a RowError, a SpecError) skips that
    row with its reason; a FileFormatError refuses the file."""
    out = []
    for i, (line, row) in enumerate(rows):
        try:
            out.append(predict(row, line))
        except ParaplanError as exc:
            if isinstance(exc, FileFormatError):
                raise
            out.append({"id": row.get("id"), "source": row.get("source"), "model": row.get("model"),
                        "metric_id": row.get("metric_id"), "measured": measured_value(row),
                        "predicted": None, "error_pct": None, "skipped": str(exc), "plan": None})
        if progress:
            progress(i + 1, len(rows))
    return {"rows": out, "summary": summarize(out)}


def source_group(source: str) -> str:
    """A publication/table, without the per-row locator (data row, line number)."""
    return re.sub(r"(,? ?(table header line|data row|line) \d+)+", "", source).replace(" ()", "").strip()


# GPU preset -> the generation validate's summaries (and docs/accuracy.md's tables) group it under;
# a preset not named here is its own group
GENERATIONS = {"a100-sxm-80gb": "A100", "a100-sxm-40gb": "A100", "h100-sxm-80gb": "H100/H200",
               "h200-sxm-141gb": "H100/H200", "b200": "B200/GB200", "gb200": "B200/GB200",
               "b300": "B300/GB300", "gb300": "B300/GB300", "gh200-96gb": "GH200", "gh200-144gb": "GH200",
               "l40s": "L40S", "mi300x": "MI300X"}


def generation(gpu: str) -> str:
    """The generation a GPU preset's rows are summarized under (GENERATIONS; else its name)."""
    return GENERATIONS.get(gpu, gpu)


def error_stats(abs_errors: list[float]) -> dict:
    """n, mean, p90 (the nearest-rank 90th percentile) and max of absolute % errors (None where none)."""
    errs = sorted(abs_errors)
    if not errs:
        return {"n": 0, "mean_abs_pct_error": None, "p90_abs_pct_error": None, "max_abs_pct_error": None}
    p90 = errs[min(len(errs) - 1, max(0, math.ceil(0.9 * len(errs)) - 1))]
    return {"n": len(errs), "mean_abs_pct_error": sum(errs) / len(errs), "p90_abs_pct_error": p90,
            "max_abs_pct_error": errs[-1]}


def summarize(rows: list[dict]) -> dict:
    """Error over every predicted row, by source, and -- where the rows say their GPU preset and
    whether the model is MoE (training rows) -- by GPU generation and for the MoE rows."""
    done = [r for r in rows if r["skipped"] is None]
    by_source: dict = {}
    by_generation: dict = {}
    for r in done:
        by_source.setdefault(source_group(r["source"]), []).append(abs(r["error_pct"]))
        if r.get("gpu"):
            by_generation.setdefault(generation(r["gpu"]), []).append(abs(r["error_pct"]))
    out = {
        "n": len(rows), "n_predicted": len(done), "n_skipped": len(rows) - len(done),
        **{k: v for k, v in error_stats([abs(r["error_pct"]) for r in done]).items() if k != "n"},
        "by_source": {k: {"n": len(v), "mean_abs_pct_error": sum(v) / len(v)} for k, v in by_source.items()},
    }
    if by_generation:
        out["by_generation"] = {g: error_stats(v) for g, v in sorted(by_generation.items())}
        out["moe"] = error_stats([abs(r["error_pct"]) for r in done if r.get("moe")])
    peak = memory_summary(rows, source_group)  # its own section beside the time metrics
    if peak is not None:
        out["peak_memory"] = peak
    return out
