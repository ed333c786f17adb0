"""Terminal tables for estimates and rankings (plain text, no dependencies)."""

from __future__ import annotations

import textwrap

from ..cost.estimate import Estimate
from ..units import fmt_bytes, fmt_co2e_kg, fmt_count, fmt_energy_j, fmt_time, fmt_usd
from .legend import legend_line, split_shared
from .width import DEFAULT_WIDTH, labelled, wrap


def grid(headers: list[str], rows: list[list[str]], align: str | None = None, *, width: int | None = None,
         wrap_col: int | None = None) -> str:
    """Fixed-width table; `align` is a string of 'l'/'r' per column (default: first l, rest r).
    A header with a newline takes two lines. With `width` and `wrap_col`, that column's cells
    wrap onto continuation lines where the table would be wider than `width`."""
    align = align or ("l" + "r" * (len(headers) - 1))
    head_rows = _header_rows(headers)
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(*head_rows, *rows)]
    if width is not None and wrap_col is not None:
        rows, widths = _wrapped(rows, widths, width, wrap_col, head_rows)

    def line(cells):
        out = []
        for c, w, a in zip(cells, widths, align):
            out.append(c.ljust(w) if a == "l" else c.rjust(w))
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(h) for h in head_rows] + [sep] + [line(r) for r in rows])


def _header_rows(headers: list[str]) -> list[list[str]]:
    """The header as lines of cells, a one-line header at the bottom of a two-line one."""
    parts = [h.split("\n") for h in headers]
    depth = max(len(p) for p in parts)
    padded = [[""] * (depth - len(p)) + p for p in parts]
    return [[p[i] for p in padded] for i in range(depth)]


def _wrapped(rows, widths, width: int, col: int, head_rows) -> tuple[list[list[str]], list[int]]:
    """The rows with column `col` wrapped so that the table fits `width` (where its words
    allow: a word is never split), and the column widths."""
    over = sum(widths) + 2 * (len(widths) - 1) - width
    if over <= 0:
        return rows, widths
    longest_word = max((len(w) for r in rows for w in r[col].split()), default=0)
    target = max(widths[col] - over, longest_word, max(len(h[col]) for h in head_rows))
    out = []
    for r in rows:
        pieces = textwrap.wrap(r[col], target, break_long_words=False, break_on_hyphens=False) or [""]
        out.append(r[:col] + [pieces[0]] + r[col + 1:])
        out += [[""] * col + [p] + [""] * (len(r) - col - 1) for p in pieces[1:]]
    widths = widths[:col] + [max(len(r[col]) for r in out + head_rows)] + widths[col + 1:]
    return out, widths


def _pct(x: float, total: float) -> str:
    return f"{100.0 * x / total:5.1f}%" if total > 0 else "-"


def time_table(est: Estimate) -> str:
    parts = est.time.parts()
    total = est.step_time_s
    names = {"compute_s": "compute (fwd+bwd)", "recompute_s": "recomputation", "tp_comm_s": "TP comm (exposed)",
             "cp_comm_s": "CP comm (exposed)", "ep_comm_s": "EP all-to-all (exposed)", "pp_comm_s": "PP send/recv (exposed)",
             "dp_comm_s": "DP/ZeRO comm (exposed)", "bubble_s": "pipeline bubble", "optimizer_s": "optimizer step",
             "host_wait_s": "GPU waiting for the host", "offload_s": "activation offload (exposed)",
             "bubble_work_s": "work for the bubbles (exposed)"}
    rows = [[names[k], fmt_time(v), _pct(v, total)] for k, v in parts.items()
            if v > 0 or k not in ("ep_comm_s", "host_wait_s", "offload_s", "bubble_work_s")]
    rows.append(["step total", fmt_time(total), "100.0%"])
    ov = est.overlapped.parts()
    hidden = {"offload_s": "  activation offload (hidden)"}
    rows += [[hidden.get(k, f"  overlapped {k.split('_')[0].upper()} comm (hidden)"), fmt_time(v), ""]
             for k, v in ov.items() if v > 0]
    return grid(["time per step", "seconds", "share"], rows)


def memory_table(est: Estimate) -> str:
    parts = est.memory.parts()
    names = {"weights_bytes": "weights", "gradients_bytes": "gradients", "optimizer_bytes": "optimizer states",
             "activations_bytes": "activations", "logits_bytes": "logits + loss", "comm_buffers_bytes": "comm buffers",
             "fragmentation_bytes": "allocator fragmentation", "reserved_bytes": "CUDA context + workspaces"}
    total = est.memory.total
    rows = [[names[k], fmt_bytes(v), _pct(v, total)] for k, v in parts.items()]
    rows.append(["total per GPU (worst stage)", fmt_bytes(total), f"of {fmt_bytes(est.hbm_bytes)}"])
    if est.host_bytes > 0:
        cap = f"of {fmt_bytes(est.host_capacity_bytes)}" if est.host_capacity_bytes > 0 else "(host DRAM not stated)"
        rows.append(["host DRAM per GPU (offloaded)", fmt_bytes(est.host_bytes), cap])
    return grid(["memory per GPU", "bytes", "share"], rows)


SUMMARY_LABEL_CHARS = 16  # "with failures   ": the summary's values start in this column


def summary_lines(est: Estimate, width: int = DEFAULT_WIDTH) -> list[str]:
    """The estimate's headline figures, a label and its value per line (wrapped under the value)."""
    return [wrap(line, width, indent=SUMMARY_LABEL_CHARS) for line in _summary(est)]


def _summary(est: Estimate) -> list[str]:
    b = est.budget
    return [
        f"plan            {est.plan.describe()}",
        f"micro-batches   {est.num_microbatches} per step",
        f"step time       {fmt_time(est.step_time_s)}",
        f"throughput      {fmt_count(est.tokens_per_s)} tokens/s, {est.tokens_per_s_per_gpu:,.0f} tokens/s/GPU",
        f"MFU / HFU       {100 * est.mfu:.1f}% / {100 * est.hfu:.1f}%  (MFU: 6N + full-s² attention FLOPs; "
        f"HFU: executed FLOPs incl. recompute)",
        f"memory          {fmt_bytes(est.memory.total)} of {fmt_bytes(est.hbm_bytes)}"
        + (f", host {fmt_bytes(est.host_bytes)}" + (f" of {fmt_bytes(est.host_capacity_bytes)}"
                                                    if est.host_capacity_bytes > 0 else "")
           if est.host_bytes > 0 else "")
        + ("" if est.fits else "  — DOES NOT FIT"),
        f"token budget    {fmt_count(b.tokens)} tokens: {fmt_time(b.time_s)}, {fmt_count(b.gpu_hours)} GPU-hours, "
        f"{fmt_usd(b.usd)}",
        f"energy, carbon  {fmt_energy_j(b.energy_j)} at {'the power limit' if b.power_limited else 'TDP'}, "
        f"{fmt_energy_j(b.facility_energy_j)} at PUE "
        f"{b.pue:.2f}: {fmt_co2e_kg(b.carbon_kg)} at {b.grid_kg_co2e_per_kwh:.3g} kg/kWh (--pue, --grid-kg-per-kwh)",
        failures_line(b.with_failures),
    ]


NO_PROGRESS_GOODPUT = 1e-3  # below it a line of years and dollars would be noise: "no progress"


def failures_line(r) -> str:
    """The budget through interruptions, in one line (cost/reliability.py)."""
    if r.mtbf_s == float("inf"):
        return "with failures   none assumed (--interruptions-per-gpu-day 0)"
    if r.goodput < NO_PROGRESS_GOODPUT:  # the budget would take over a thousand times its failure-free time
        return (f"with failures   no progress (goodput {100 * r.goodput:.2g}%): an interruption every "
                f"{fmt_time(r.mtbf_s)}, too short for a restart ({fmt_time(r.checkpoint_s)} checkpoint stall); "
                "fewer GPUs, faster restarts or fewer interruptions")
    return (f"with failures   an interruption every {fmt_time(r.mtbf_s)}, checkpoint every "
            f"{fmt_time(r.checkpoint_interval_s)} ({fmt_time(r.checkpoint_s)} stall): goodput {100 * r.goodput:.1f}%, "
            f"{fmt_time(r.wall_time_s)}, {fmt_usd(r.wall_usd)}, {r.interruptions:,.0f} interruptions")


def estimate_report(est: Estimate, width: int = DEFAULT_WIDTH, legend: bool = False) -> str:
    """The summary, with the plan's shorthand explained under it if `legend`, and the time and
    memory tables."""
    key = "\n\n" + legend_line([est.plan.describe()], width) if legend else ""
    return "\n".join(summary_lines(est, width)) + key + "\n\n" + time_table(est) + "\n\n" + memory_table(est)


def plan_column(descriptions: list[str], width: int) -> tuple[str, list[str]]:
    """(the "every plan: ..." line of the tokens all the plans share, or ""; each plan's
    description without them) for a table with a column of plans."""
    shared, rest = split_shared(descriptions)
    return (labelled("every plan: ", " ".join(shared), width) if shared else ""), rest


def with_plans(table: str, descriptions: list[str], shared_line: str, width: int, already=()) -> str:
    """A table of plans with the tokens they share above it and the legend under it (less the
    terms in `already`, explained above)."""
    return "\n".join(x for x in (shared_line, table, legend_line(descriptions, width, already)) if x)


def ranking_table(ests, width: int = DEFAULT_WIDTH) -> str:
    """The ranked plans, one row each; the tokens every plan shares above, the legend under."""
    # the share of the step the GPU waits for an eager host (calibrated profiles), where any plan has it
    host = any(e.time.host_wait_s > 0 for e in ests)
    descriptions = [e.plan.describe() for e in ests]
    shared_line, plans = plan_column(descriptions, width)
    rows = [_ranking_row(i, e, plan, host) for i, (e, plan) in enumerate(zip(ests, plans), 1)]
    table = grid(["#", "plan", "step", "tok/s/GPU", "MFU", "bubble", "exp.comm", "recomp",
                  *(["host"] if host else []), "mem/GPU"], rows, align="llrrrrrrr" + ("r" if host else ""),
                 width=width, wrap_col=1)
    return with_plans(table, descriptions, shared_line, width)


def _ranking_row(i: int, e, plan: str, host: bool) -> list[str]:
    t = e.time
    comm = t.tp_comm_s + t.cp_comm_s + t.ep_comm_s + t.pp_comm_s + t.dp_comm_s
    return [str(i), plan, fmt_time(e.step_time_s), f"{e.tokens_per_s_per_gpu:,.0f}",
            f"{100 * e.mfu:.1f}%", _pct(t.bubble_s, e.step_time_s).strip(),
            _pct(comm, e.step_time_s).strip(), _pct(t.recompute_s, e.step_time_s).strip(),
            *([_pct(t.host_wait_s, e.step_time_s).strip()] if host else []),
            fmt_bytes(e.memory.total)]


def unchecked_gpus(gpus) -> list[str]:
    """The GPUs no measured run checks (GPUSpec.checked_against empty), each once."""
    return list(dict.fromkeys(g.name for g in gpus if not g.checked_against))


def unchecked_note(gpus) -> str:
    """One line naming the GPUs no measured run checks, or ""."""
    names = unchecked_gpus(gpus)
    if not names:
        return ""
    its = "their" if len(names) > 1 else "its"
    return (f"note: no measured training run checks {', '.join(names)}: the share of {its} GEMM rate sustained in "
            "training is assumed, not fitted (and a preset without measurements borrows the H100's GEMM curve); "
            "search and estimate --whatif show how much a plan hangs on it")


def scaling_table(result, width: int = DEFAULT_WIDTH) -> str:
    """One row per GPU count of a sweep (search/scaling.py): the best plan and what the token
    budget takes through interruptions."""
    many = len(result.cluster_names) > 1  # several clusters: a column names each point's
    descriptions = [pt.best.plan.describe() for pt in result.points if pt.best is not None]
    shared_line, plans = plan_column(descriptions, width)
    plan_of = dict(zip([id(pt) for pt in result.points if pt.best is not None], plans))
    rows, notes = [], []
    for pt in result.points:
        if pt.best is None:
            notes.append(f"{_where(pt, many)}: {pt.why_not}")
        rows.append(_scaling_row(pt, many, plan_of.get(id(pt), f"no plan (note {len(notes)})")))
    table = grid((["cluster"] if many else []) + ["GPUs", "best plan", "step", "tok/s/GPU", "MFU", "scaling",
                                                  "time to\ntrain", "goodput", "cost", "carbon"],
                 rows, align=("l" if many else "") + "llrrrrrrrr", width=width, wrap_col=2 if many else 1)
    lines = [with_plans(table, descriptions, shared_line, width), ""]
    lines += [labelled(f"note {i}: ", n, width) for i, n in enumerate(notes, 1)] + ([""] if notes else [])
    return "\n".join(lines + [wrap(x, width, indent=2) for x in _scaling_footer(result, many)])


def _where(pt, many: bool) -> str:
    return f"{pt.num_gpus:,} GPUs" + (f" of {pt.cluster_name}" if many else "")


def _scaling_row(pt, many: bool, plan: str) -> list[str]:
    """A sweep point's row: its best plan's figures, or blanks beside `plan` (a note) for none."""
    head = [pt.cluster_name] if many else []
    if pt.best is None:
        return head + [f"{pt.num_gpus:,}", plan, "", "", "", "", "", "", "", ""]
    e, r = pt.best, pt.best.budget.with_failures
    return head + [f"{pt.num_gpus:,}", plan, fmt_time(e.step_time_s),
                   f"{e.tokens_per_s_per_gpu:,.0f}", f"{100 * e.mfu:.1f}%", f"{100 * pt.efficiency:.0f}%",
                   *((fmt_time(r.wall_time_s), f"{100 * r.goodput:.1f}%", fmt_usd(r.wall_usd),
                      fmt_co2e_kg(e.budget.wall_carbon_kg))
                     if r.goodput >= NO_PROGRESS_GOODPUT else ("no progress", f"{100 * r.goodput:.2g}%", "-", "-"))]


def _carbon_basis(pt) -> str:
    """What a sweep's carbon column is priced at (the workload's, the same at every point)."""
    b = pt.best.budget
    at = "power limit" if b.power_limited else "TDP"
    return f"carbon at the GPUs' {at}, PUE {b.pue:.2f}, {b.grid_kg_co2e_per_kwh:.3g} kg CO2e/kWh (--pue, --grid-kg-per-kwh)"


def _scaling_footer(result, many: bool) -> list[str]:
    """The lines under a sweep's table: prices, the soonest and the cheapest count, the key."""
    lines = []
    fast, cheap = result.fastest, result.cheapest
    if many:  # what "cheapest" compared: each cluster's price per GPU-hour
        prices = {pt.cluster_name: pt.usd_per_gpu_hour for pt in result.points}
        lines.append("$/GPU-hour: " + ", ".join(f"{n} {fmt_usd(p)}" for n, p in prices.items())
                     + (" (--price)" if len(set(prices.values())) == 1 else ""))
    if fast is None:
        return lines + ["no GPU count finishes the token budget through interruptions at this rate "
                        "(--interruptions-per-gpu-day)"]
    tokens = fmt_count(fast.best.budget.tokens)
    if fast is cheap:
        lines.append(f"{_where(fast, many)} train the {tokens} tokens both soonest and for the fewest "
                     + ("dollars" if many else "GPU-hours"))
    else:
        f, c = fast.best.budget.with_failures, cheap.best.budget.with_failures
        more = (f"costs {100 * (f.wall_usd / c.wall_usd - 1):.1f}% more" if many and c.wall_usd > 0
                else f"takes {100 * (f.wall_gpu_hours / c.wall_gpu_hours - 1):.1f}% more GPU-hours")
        lines.append(f"soonest: {_where(fast, many)}, {fmt_time(f.wall_time_s)} for {fmt_usd(f.wall_usd)}; "
                     f"cheapest: {_where(cheap, many)}, {fmt_time(c.wall_time_s)} for {fmt_usd(c.wall_usd)} "
                     f"(the soonest {more})")
    lines.append("scaling: tokens/s/GPU over the smallest count's" + (" on the same cluster" if many else "")
                 + "; time, cost and carbon through interruptions (--interruptions-per-gpu-day; 0 for none); "
                 + _carbon_basis(fast))
    return lines
