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
    if s.get("by_generation"):
        out += ["", render_groups(s)]
    if "peak_memory" in s:
        out += ["", render_peak_memory(s["peak_memory"])]
    return "\n".join(out)


def _pct(x) -> str:
    return "-" if x is None else f"{x:.1f}%"


def render_groups(s: dict) -> str:
    """Error by GPU generation (the GPU preset each row was predicted on) and for the MoE rows."""
    def line(name, g):
        return [name, str(g["n"]), _pct(g["mean_abs_pct_error"]), _pct(g["p90_abs_pct_error"]),
                _pct(g["max_abs_pct_error"])]
    table = [line(g, v) for g, v in s["by_generation"].items()]
    if s["moe"]["n"]:
        table.append(line("MoE (all GPUs)", s["moe"]))
    return grid(["rows", "n", "mean |error|", "p90", "max |error|"], table, align="lrrrr")


def render_peak_memory(m: dict) -> str:
    """The peak-memory section: error by torch counter, and the [OOM-RUN] lower bounds."""
    table = [["all peak-memory rows", str(m["n"]), _pct(m["mean_abs_pct_error"]), _pct(m["max_abs_pct_error"])]]
    table += [[f"torch max {stat}", str(v["n"]), _pct(v["mean_abs_pct_error"]), _pct(v["max_abs_pct_error"])]
              for stat, v in m["by_stat"].items() if v["n"]]
    lines = ["peak memory per GPU (predicted: live tensors at the step's worst moment; reserved adds the "
             "caching allocator's slack)",
             grid(["rows", "n", "mean |error|", "max |error|"], table, align="lrrr"),
             f"{m['n_rows']} peak-memory rows, {m['n_skipped']} skipped; nothing fitted to them "
             "(in sample = out of source)"]
    b = m["lower_bounds"]
    if b["n"]:
        below = f"; below: {', '.join(b['below'])}" if b["below"] else ""
        lines.append(f"[OOM-RUN] rows (lower bounds, not in the error): {len(b['at_or_above'])} of {b['n']} "
                     f"predicted at or above their value{below}")
    return "\n".join(lines)
