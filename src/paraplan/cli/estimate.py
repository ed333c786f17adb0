"""`paraplan estimate`: predict one plan (the flags', or the fastest that fits) with a full
breakdown."""

from __future__ import annotations

from dataclasses import asdict

from ..argtypes import int_up_to, number_within
from ..cost.bubble_fill import MAX_BUBBLE_WORK_PIECES, BubbleWork
from ..cost.estimate import estimate
from ..errors import SpecError
from ..report.bubbles import bubble_fill_dict, bubble_fill_text
from ..report.jsonout import estimate_dict
from ..report.strict_json import json_text
from ..report.table import estimate_report, unchecked_gpus
from ..report.whatif import whatif_dict, whatif_table
from ..report.width import terminal_width, wrap
from ..search.advice import headroom_line
from ..search.schedule_search import searched_beside, searched_dict, searched_line
from ..search.whatif import what_if
from ..units import GIGA, TERA
from .args import add_plan_command, add_whatif, engine_rules_from_args, mixed_cluster_args, specs_from_args
from .choice import chosen_plan, searched_plan_note
from .notes import header, headroom_for, misfit_advice_for, seq_notes


def add_parser(sub) -> None:
    e = add_plan_command(sub, "estimate", "predict one plan with a full breakdown", required=True)
    add_whatif(e, "the plan's step time")
    add_bubble_fill(e)
    e.set_defaults(func=cmd_estimate)


MAX_BUBBLE_WORK = 1e9  # TFLOP or GB per GPU per step: a guard against a mistyped unit, not a measurement


def add_bubble_fill(p) -> None:
    g = p.add_argument_group("bubble filling (PipeFisher; docs/model/step.md)")
    g.add_argument("--fill-bubbles", action="store_true",
                   help="run each pipeline rank's DP traffic and optimizer step from its last backward on, in its "
                        "idle time, and the --bubble-work-* in its gaps; show each rank's idle time and the step "
                        "with and without the work")
    g.add_argument("--bubble-work-tflop", type=number_within(0.0, MAX_BUBBLE_WORK, "TFLOP per GPU per step"),
                   default=0.0, metavar="TFLOP",
                   help="with --fill-bubbles: extra work per GPU per step, e.g. a K-FAC or Shampoo preconditioner's "
                        "curvature and inverses (default 0)")
    g.add_argument("--bubble-work-gb", type=number_within(0.0, MAX_BUBBLE_WORK, "GB per GPU per step"),
                   default=0.0, metavar="GB", help="with --fill-bubbles: the extra work's HBM traffic (default 0)")
    g.add_argument("--bubble-work-pieces", type=int_up_to(MAX_BUBBLE_WORK_PIECES), default=None, metavar="N",
                   help="with --bubble-work-*: equal pieces the extra work splits into, each placed whole in a gap "
                        "(default: one per layer of the stage, as PipeFisher assigns K-FAC's work by layer)")


def bubble_work_from_args(args) -> BubbleWork | None:
    """--fill-bubbles and its extra work as a BubbleWork (None without the flag)."""
    given = (("--bubble-work-tflop", args.bubble_work_tflop), ("--bubble-work-gb", args.bubble_work_gb),
             ("--bubble-work-pieces", args.bubble_work_pieces))
    for flag, value in given:
        if value and not args.fill_bubbles:
            raise SpecError("estimate", flag, value, "applies with --fill-bubbles only")
    if args.bubble_work_pieces and not (args.bubble_work_tflop or args.bubble_work_gb):
        raise SpecError("estimate", "--bubble-work-pieces", args.bubble_work_pieces,
                        "applies with --bubble-work-tflop or --bubble-work-gb only (it splits that work)")
    if not args.fill_bubbles:
        return None
    if args.whatif is not None:  # its re-timed steps are the plain ones
        raise SpecError("estimate", "--whatif", args.whatif, "prices the plan without filling its bubbles: "
                        "not with --fill-bubbles")
    return BubbleWork(extra_flops=args.bubble_work_tflop * TERA, extra_bytes=args.bubble_work_gb * GIGA,
                      pieces=args.bubble_work_pieces)


def cmd_estimate(args) -> int:
    if mixed_cluster_args(args):
        from .mixed import cmd_estimate_mixed
        return cmd_estimate_mixed(args)
    model, cluster, wl = specs_from_args(args)
    plan, source = chosen_plan(args, model, cluster, wl, engine=engine_rules_from_args(args, wl, model),
                               flags_narrow=False)
    est = estimate(model, cluster, wl, plan, bubble_work=bubble_work_from_args(args))
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
                          **({"whatif": whatif_dict(wi)} if wi else {}),
                          **({"bubble_fill": bubble_fill_dict(est.bubble_fill)} if est.bubble_fill else {})}, indent=1))
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
        if est.bubble_fill:
            print("\n" + bubble_fill_text(est.bubble_fill, width))
    return 0
