"""What-if tables and JSON (search/whatif.py): which assumption a plan's step time hangs on,
and which plan is the better bet if that assumption turns out worse."""

from __future__ import annotations

import math

from ..inference.whatif import ServeWhatIf
from ..search.whatif import Unit, WhatIf
from ..units import fmt_bw, fmt_time
from .jsonout import plan_dict
from .table import grid
from .width import DEFAULT_WIDTH, wrap


def _value(value: float, unit: Unit) -> str:
    match unit:
        case Unit.OF_PEAK:
            return f"{value:.2f} of peak"
        case Unit.OF_MEASURED:
            return f"{value:.2f} of measured"
        case Unit.SHARE:
            return f"{value:.2f}"
        case Unit.BYTES_PER_S:
            return fmt_bw(value)
        case Unit.SECONDS:
            return fmt_time(value)
        case Unit.FACTOR:
            return f"{value:.2f}x"
    raise AssertionError(unit)  # pragma: no cover - closed enum


def _delta(value: float, base: float) -> str:
    pct = 100.0 * (value / base - 1.0)
    return f"{0.0 if abs(pct) < 0.05 else pct:+.1f}%"  # no "-0.0%" for rounding noise


def whatif_table(w: WhatIf, ranked=(), width: int = DEFAULT_WIDTH) -> str:
    """One row per assumption: the plan's step time δ worse and δ better; over several plans,
    the fastest under the worse value and how much the plan loses by staying."""
    pct = f"{100 * w.change:g}%"
    base = w.plan.step_time_s
    index = {e.plan: i for i, e in enumerate(ranked, 1)}
    rows = []
    capped = False
    for r in w.rows:
        marks = [("*" if r.capped(w.change, worse) else "") for worse in (True, False)]
        capped = capped or any(marks)
        lost_fit = w.plan.fits and not r.worse_fits  # the worse value, not the plan, stops it fitting
        row = [str(r.assumption), _value(r.nominal, r.unit),
               _delta(r.worse_step_s, base) + marks[0] + (" (no fit)" if lost_fit else ""),
               _delta(r.better_step_s, base) + marks[1]]
        if w.num_plans > 1:
            b = r.best_if_worse
            if b is None:
                row += ["none fits", ""]
            elif b.plan == w.plan.plan:
                row += ["the same" + (" [s]" if r.searched_again else ""), "-"]
            else:
                rank = f"#{index[b.plan]} " if b.plan in index else ""
                row += [f"{rank}{b.plan.describe()} ({fmt_time(b.step_time_s)})" + (" [s]" if r.searched_again else ""),
                        "no fit" if math.isinf(r.regret) else f"{100 * r.regret:.1f}%"]
        rows.append(row)
    heads = ["assumption", "nominal", f"{pct} worse", f"{pct} better"]
    if w.num_plans > 1:
        heads += ["fastest plan if worse", "this plan\nslower by"]
    intro = (f"what if one assumption is {pct} off: the step time of {w.plan.plan.describe()} "
             f"({fmt_time(base)})" + (f", and the fastest plan if it is worse (the {w.num_plans} best plans re-timed; "
                                      "[s]: the whole space searched again, where a plan further down could win)"
                                      if w.num_plans > 1 else ""))
    notes = [f"worse: rates and bandwidths ×(1 − {pct}), latencies, overheads and imbalance ×(1 + {pct}); "
             "'of measured': the share of the microbenchmarked compute rate sustained in training"]
    if capped:
        notes.append("*: the value moved less, held at its bound (an efficiency at most 1, the imbalance from 1 "
                     "to experts/top-k)")
    table = grid(heads, rows, align="ll" + "r" * 2 + ("lr" if w.num_plans > 1 else ""), width=width,
                 wrap_col=4 if w.num_plans > 1 else None)
    return wrap(intro, width, indent=2) + "\n\n" + table + "\n" + wrap("\n".join(notes), width, indent=2)


def whatif_dict(w: WhatIf) -> dict:
    return {
        "change": w.change,
        "plan": w.plan.plan.describe(),
        "step_time_s": w.plan.step_time_s,
        "num_plans_reranked": w.num_plans,
        "assumptions": [
            {"assumption": str(r.assumption), "nominal": r.nominal, "unit": str(r.unit),
             "worse_value": r.worse_value, "better_value": r.better_value,
             "worse_step_time_s": r.worse_step_s, "better_step_time_s": r.better_step_s, "fits_if_worse": r.worse_fits,
             **({"fastest_if_worse": None if r.best_if_worse is None else
                 {"plan": plan_dict(r.best_if_worse.plan), "step_time_s": r.best_if_worse.step_time_s},
                 "regret": None if r.best_if_worse is None or math.isinf(r.regret) else r.regret,
                 "searched_again": r.searched_again}
                if w.num_plans > 1 else {})}
            for r in w.rows],
    }


def serve_whatif_table(w: ServeWhatIf, has_tpot: bool = True, width: int = DEFAULT_WIDTH) -> str:
    """A deployment re-estimated with each assumption moved (inference/whatif.py): the lone
    request's TTFT and TPOT, and throughput and the rate in the targets, δ worse / δ better."""
    pct = f"{100 * w.change:g}%"
    b = w.base

    def pair(row, get) -> str:
        base = get(b)
        if not base:
            return "-"
        return "/".join("misses" if not get(e) else _delta(get(e), base) for e in (row.worse, row.better))

    rows = []
    for row in w.rows:
        rows.append([str(row.assumption), _value(row.nominal, row.unit), pair(row, lambda e: e.ttft_floor_s),
                     pair(row, lambda e: e.tpot_floor_s) if has_tpot else "-",
                     pair(row, lambda e: e.max_tokens_per_s_per_gpu), pair(row, lambda e: e.slo_rate_rps),
                     "-" if row.worse.gpus_needed is None else f"{row.worse.gpus_needed}"])
    gpus = ("now " + str(b.gpus_needed)) if b.gpus_needed is not None else \
        ("no rate given" if b.slo_rate_rps > 0 else "the targets are missed")
    return (wrap(f"what if one hardware assumption is {pct} off: {b.plan.describe()} re-estimated "
                 f"(changes {pct} worse/{pct} better; GPUs for the rate: {gpus})", width, indent=2) + "\n\n"
            + grid(["assumption", "nominal", "TTFT₁", "TPOT₁", "max out\ntok/s/GPU", "req/s\nin SLO",
                    "GPUs for the rate\nif worse"], rows, align="llrrrrr")
            + "\n" + wrap(f"worse: rates and bandwidths ×(1 − {pct}), the launch overhead ×(1 + {pct}); req/s in SLO "
                          "is found by bisection to about 3%, so a smaller change there reads as the throughput's",
                          width, indent=2))


def serve_whatif_dict(w: ServeWhatIf, has_tpot: bool = True) -> dict:
    """JSON of a serving what-if (SI units; TPOT null without a second token, as the ranking's)."""
    def one(e):
        return {"ttft_floor_s": e.ttft_floor_s, "tpot_floor_s": e.tpot_floor_s if has_tpot else None,
                "max_output_tokens_per_s_per_gpu": e.max_tokens_per_s_per_gpu,
                "slo_rate_rps_per_replica": e.slo_rate_rps, "gpus_needed": e.gpus_needed}
    return {"change": w.change, "plan": w.base.plan.describe(), "nominal_estimate": one(w.base),
            "assumptions": [{"assumption": str(r.assumption), "nominal": r.nominal, "unit": str(r.unit),
                             "worse": one(r.worse), "better": one(r.better)} for r in w.rows]}
