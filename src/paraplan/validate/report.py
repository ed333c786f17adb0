"""Render a validation result (the `validate --json` dict) as terminal tables."""

from __future__ import annotations

from ..report.table import grid


def _fmt(x):
    if x is None:
        return "-"
    return f"{x:.4g}"


def render_validation(result: dict, verbose: bool = False) -> str:
    rows = []
    for r in result["rows"]:
        err = "skipped: " + r["skipped"] if r["skipped"] else f"{r['error_pct']:+.1f}%"
        line = [r["id"], r["model"], r["metric_id"], _fmt(r["measured"]), _fmt(r["predicted"]), err]
        if verbose:
            line.append(r.get("plan") or "")
        rows.append(line)
    headers = ["id", "model", "metric", "measured", "predicted", "error"] + (["plan (blank knobs searched)"] if verbose else [])
    out = [grid(headers, rows, align="lllrrr" + ("l" if verbose else ""))]
    s = result["summary"]
    src_rows = []
    for name, v in sorted(s["by_source"].items(), key=lambda kv: -kv[1]["n"]):
        src_rows.append([name[:90], str(v["n"]), f"{v['mean_abs_pct_error']:.1f}%"])
    out.append("")
    out.append(grid(["source", "rows", "mean |error|"], src_rows))
    out.append("")
    if s["n_predicted"]:
        out.append(f"rows {s['n']}, predicted {s['n_predicted']}, skipped {s['n_skipped']}; "
                   f"mean |error| {s['mean_abs_pct_error']:.2f}%, p90 {s['p90_abs_pct_error']:.2f}%, "
                   f"max {s['max_abs_pct_error']:.2f}%")
    else:
        out.append(f"rows {s['n']}, none predicted")
    return "\n".join(out)
