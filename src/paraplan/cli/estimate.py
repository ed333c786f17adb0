"""`paraplan estimate`: predict one plan (the flags', or the fastest that fits) with a full
breakdown."""

from __future__ import annotations

from dataclasses import asdict

from ..cost.estimate import estimate
from ..report.jsonout import estimate_dict
from ..report.strict_json import json_text
from ..report.table import estimate_report, unchecked_gpus
from ..report.whatif import whatif_dict, whatif_table
from ..report.width import terminal_width, wrap
from ..search.advice import headroom_line
from ..search.schedule_search import searched_beside, searched_dict, searched_line
from ..search.whatif import what_if
from .args import add_plan_command, add_whatif, engine_rules_from_args, mixed_cluster_args, specs_from_args
from .choice import chosen_plan, searched_plan_note
from .notes import header, headroom_for, misfit_advice_for, seq_notes


def add_parser(sub) -> None:
    e = add_plan_command(sub, "estimate", "predict one plan with a full breakdown", required=True)
    add_whatif(e, "the plan's step time")
    e.set_defaults(func=cmd_estimate)


def cmd_estimate(args) -> int:
    if mixed_cluster_args(args):
        from .mixed import cmd_estimate_mixed
        return cmd_estimate_mixed(args)
    model, cluster, wl = specs_from_args(args)
    plan, source = chosen_plan(args, model, cluster, wl, engine=engine_rules_from_args(args, wl, model),
                               flags_narrow=False)
    est = estimate(model, cluster, wl, plan)
    wi = None if args.whatif is None else what_if(model, cluster, wl, [est], args.whatif / 100.0)
    advice, changes = misfit_advice_for(args, model, cluster, wl, est)
    headroom = headroom_for(args, model, cluster, wl, est)
    searched = searched_beside(model, cluster, wl, est)
    if args.json:
        fits_with = [{"flags": c.flags, "plan": c.plan.describe(), "memory_bytes": c.estimate.memory.total,
                      "step_time_s": c.estimate.step_time_s} for c in changes]
        print(json_text({**estimate_dict(est), "plan_source": source,
                          **({"plan_rank": args.rank or 1} if source == "search" else {}),
                          "unchecked_gpus": unchecked_gpus([cluster.gpu]),
                          "notes": seq_notes(model, wl) + ([est.pipeline_note] if est.pipeline_note else []),
                          **({"misfit": advice, "fits_with": fits_with} if advice else {}),
                          **({"memory_headroom": asdict(headroom)} if headroom else {}),
                          **({"schedule_search": searched_dict(est, searched)} if searched else {}),
                          **({"whatif": whatif_dict(wi)} if wi else {})}, indent=1))
    else:
        width = terminal_width()
        print(header(model, cluster, wl, width=width)
              + ("\n" + wrap(searched_plan_note(args), width) if source == "search" else "") + "\n")
        print(estimate_report(est, width, legend=True))
        if headroom:
            print(wrap(headroom_line(headroom), width))
        if est.pipeline_note:
            print(wrap("note: " + est.pipeline_note, width))
        if searched:
            print(wrap(searched_line(est, searched), width))
        if advice:
            print("\n" + wrap(advice, width))
        if wi:
            print("\n" + whatif_table(wi, width=width))
    return 0
