"""Predicted vs measured over `paraplan run` reports: table, errors, Kendall tau, plot.

Error of a run = (predicted − measured) / measured (positive: paraplan over-predicts).
Kendall's tau-b (Kendall 1945, with the tie correction) between the predicted and the
measured values says whether paraplan ranks the runs as the hardware does: 1 the same
order, −1 reversed. matplotlib is imported only to draw the plot.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import FileFormatError, ParaplanError
from ..run.report_format import REPORT_KIND, REPORT_VERSION, predicted_as_measured_bytes
from ..specs.files import parse_json, read_text
# metric -> (key under "measured", key under "predicted", label)
METRICS = {"step_time": ("step_time_s", "step_time_s", "step time"),
           "memory": ("peak_memory_bytes", "memory_bytes", "peak memory")}


def kendall_tau_b(x, y) -> float:
    """Kendall's tau-b of two equally long sequences; nan when either is constant or n < 2.

    tau_b = (C − D) / sqrt((n0 − n1)(n0 − n2)) over all pairs, n0 = n(n−1)/2, n1 and n2 the
    pairs tied in x and in y (a pair tied in both counts in each)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("kendall_tau_b needs two 1-D sequences of equal length")
    i, j = np.triu_indices(a.size, k=1)
    sa, sb = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    n0 = i.size
    n1, n2 = int(np.sum(sa == 0)), int(np.sum(sb == 0))
    denom = np.sqrt(float(n0 - n1) * float(n0 - n2))
    return float(np.sum(sa * sb) / denom) if denom > 0 else float("nan")


def relative_errors(predicted, measured) -> np.ndarray:
    """(predicted − measured) / measured, element-wise."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    return (p - m) / m


def _positive(value) -> bool:
    """A JSON number (not true/false) that is finite and > 0 (json reads NaN and Infinity too)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value > 0
    except OverflowError:  # an integer past the float range
        return False


def _check_value(path: str, field: str, value) -> None:
    if not _positive(value):
        raise FileFormatError(path, f"{field} = {value!r:.40} is not allowed; a finite number > 0 is required")


def load_reports(paths: list[str], hardware: str | None = None) -> list[tuple[str, dict]]:
    """(path, report) for each file; a one-line FileFormatError for anything else. With
    `hardware` (a cluster preset or calibrated profile) each run is predicted again on it."""
    out = []
    for path in paths:
        report = parse_json(read_text(Path(path), path), path)
        if not isinstance(report, dict) or report.get("kind") != REPORT_KIND:
            raise FileFormatError(path, f"not a paraplan run report (no \"kind\": \"{REPORT_KIND}\"; "
                                        "write one with `paraplan run -o FILE`)")
        if report.get("version") != REPORT_VERSION:
            raise FileFormatError(path, f"version = {report.get('version')!r:.40} is not allowed; this paraplan "
                                        f"reads run reports of version {REPORT_VERSION}")
        if report.get("status") != "ok":
            why = f": {report['reason']!s:.200}" if report.get("reason") else ""
            raise FileFormatError(path, f"status = {report.get('status')!r:.40}: the run did not complete{why}; "
                                        "only a completed run (status \"ok\") has measurements to compare")
        ws = report.get("world_size")
        if not isinstance(ws, int) or isinstance(ws, bool) or ws < 1:
            raise FileFormatError(path, f"world_size = {ws!r:.40} is not allowed; a positive integer is required")
        measured = report.get("measured")
        if not isinstance(measured, dict) or "step_time_s" not in measured:
            raise FileFormatError(path, "measured.step_time_s missing; a finite number > 0 is required")
        _check_value(path, "measured.step_time_s", measured["step_time_s"])
        if hardware is not None:
            from ..run.report import repredict
            report = repredict(report, hardware, path)
        if not isinstance(report.get("predicted"), dict):
            note = report.get("prediction_note") or "no prediction"
            raise FileFormatError(path, f"has no prediction ({note}); compare with --hardware PROFILE")
        out.append((path, report))
    return out


def _described(report: dict, key: str, field: str, path: str) -> str:
    """report[key][field] as text ("?" when absent); a one-line error when report[key] is no object."""
    obj = report.get(key)
    if obj is None:
        return "?"
    if not isinstance(obj, dict):
        raise FileFormatError(path, f"{key} must be a JSON object (as `paraplan run` writes it), "
                                    f"not {type(obj).__name__} {obj!r:.40}")
    return str(obj.get(field, "?"))


def compare_reports(reports: list[tuple[str, dict]], metric: str = "step_time") -> dict:
    """Rows and summary (mean / max |error|, Kendall tau) for one metric."""
    if metric not in METRICS:
        raise ParaplanError(f"compare: metric={metric!r} is not allowed; allowed: {', '.join(METRICS)}")
    mkey, pkey, label = METRICS[metric]
    rows = []
    for path, r in reports:
        meas, pred = r["measured"].get(mkey), r["predicted"].get(pkey)
        _check_value(path, f"measured.{mkey}", meas)
        _check_value(path, f"predicted.{pkey}", pred)
        if metric == "memory":  # what the measurement counts (run/report_format.py MEMORY_KIND_EXCLUDES)
            try:
                pred = predicted_as_measured_bytes(r["predicted"], r["measured"].get("memory_kind"))
            except TypeError:
                raise FileFormatError(path, "predicted.memory_parts_bytes must map part names to numbers "
                                            "(as `paraplan run` writes it)") from None
            _check_value(path, f"predicted.{pkey} less the parts measured.memory_kind leaves out", pred)
        rows.append({"report": path, "model": _described(r, "model", "name", path),
                     "plan": _described(r, "plan", "describe", path), "world_size": r.get("world_size"),
                     "device": r.get("device_name", r.get("device", "?")), "hardware": r["predicted"].get("hardware"),
                     "measured": float(meas), "predicted": float(pred), "command": r.get("command", "")})
    err = relative_errors([x["predicted"] for x in rows], [x["measured"] for x in rows])
    for row, e in zip(rows, err):
        row["error_pct"] = 100 * float(e)
    tau = kendall_tau_b([x["predicted"] for x in rows], [x["measured"] for x in rows]) if len(rows) > 1 else float("nan")
    return {"metric": metric, "label": label, "unit": "s" if metric == "step_time" else "bytes", "rows": rows,
            "summary": {"n": len(rows), "mean_abs_pct_error": float(np.mean(np.abs(err)) * 100),
                        "max_abs_pct_error": float(np.max(np.abs(err)) * 100),
                        "kendall_tau": None if np.isnan(tau) else tau}}


def render_comparison(result: dict) -> str:
    from ..units import fmt_bytes, fmt_time
    from .table import grid
    fmt = fmt_time if result["unit"] == "s" else fmt_bytes
    rows = [[x["report"], x["model"], x["plan"], str(x["world_size"]), f"{fmt(x['measured'])}",
             f"{fmt(x['predicted'])}", f"{x['error_pct']:+.1f}%"] for x in result["rows"]]
    s = result["summary"]
    tau = "n/a (needs two runs that differ)" if s["kendall_tau"] is None else f"{s['kendall_tau']:+.3f}"
    note = ("\npredicted memory counts what the measurement does: without the runtime's reserve, and "
            "against torch.cuda.max_memory_allocated without the allocator's fragmentation"
            if result["metric"] == "memory" else "")
    return (grid(["report", "model", "plan", "ranks", f"measured {result['label']}", "predicted", "error"], rows)
            + f"\n\n{s['n']} runs: mean |error| {s['mean_abs_pct_error']:.1f}%, max |error| "
              f"{s['max_abs_pct_error']:.1f}%, Kendall tau (ranking) {tau}{note}")


def plot_comparison(result: dict, path: str) -> None:
    """Scatter of predicted vs measured with the y = x line, written at `path` in the format
    of its extension (PNG without one)."""
    from .plots import plot_format, pyplot, save_figure
    plot_format(path, "compare")  # a bad path fails before matplotlib is imported
    plt = pyplot("compare")
    scale = 1e3 if result["unit"] == "s" else 1 / 2**20
    unit = "ms" if result["unit"] == "s" else "MiB"
    meas = np.array([x["measured"] for x in result["rows"]]) * scale
    pred = np.array([x["predicted"] for x in result["rows"]]) * scale
    fig, ax = plt.subplots(figsize=(5.5, 5))
    lo, hi = float(min(meas.min(), pred.min())) * 0.8, float(max(meas.max(), pred.max())) * 1.25
    ax.plot([lo, hi], [lo, hi], color="grey", linestyle="--", linewidth=1, label="predicted = measured")
    ax.scatter(meas, pred, zorder=3)
    for x, y, row in zip(meas, pred, result["rows"]):
        ax.annotate(row["plan"].split(" attn:")[0], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(f"measured {result['label']} ({unit})")
    ax.set_ylabel(f"predicted {result['label']} ({unit})")
    s = result["summary"]
    tau = "n/a" if s["kendall_tau"] is None else f"{s['kendall_tau']:.2f}"
    ax.set_title(f"paraplan vs measured: mean |err| {s['mean_abs_pct_error']:.1f}%, "
                 f"max {s['max_abs_pct_error']:.1f}%, tau {tau}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, "compare")
