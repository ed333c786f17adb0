"""`paraplan search`: rank every valid plan that fits (the plan space, with pins and an
engine's bounds; search/policy.py holds what happens when nothing fits)."""

from __future__ import annotations

from ..errors import NoPlanFitsError
from ..report.jsonout import estimate_dict
from ..report.strict_json import json_text
from ..report.table import estimate_report, ranking_table, unchecked_gpus
from ..report.whatif import whatif_dict, whatif_table
from ..report.width import terminal_width, wrap
from ..search.planner import PIN_FLAGS
from ..search.policy import bounded_space, fastest_or_none, nothing_fits_with_pins, ranked_search
from ..search.schedule_search import searched_beside, searched_dict, searched_line
from ..search.whatif import WHATIF_CANDIDATES, what_if
from .args import (MAX_RANK as MAX_TOP, add_plan_command, add_whatif, engine_rules_from_args, mixed_cluster_args,
                   specs_from_args)
from ..argtypes import int_up_to as _int_up_to
from .choice import narrowed_space
from .notes import header, seq_notes
from .progress import Progress, progress_from_args


def add_parser(sub) -> None:
    s = add_plan_command(sub, "search", "rank every valid plan that fits (default: Llama 3 70B on 64×8 H100)",
                         required=False)
    # every plan shown is simulated (~10 ms each, more with deep pipelines): a bound keeps a
    # mistyped --top from running for hours
    s.add_argument("--top", type=_int_up_to(MAX_TOP), default=10,
                   help=f"plans to show (default 10; at most {MAX_TOP:,}: each shown plan is simulated)")
    add_whatif(s, "the best plan's step time, and the fastest plan if it is worse")
    s.set_defaults(func=cmd_search)


def cmd_search(args) -> int:
    if mixed_cluster_args(args):
        from .mixed import cmd_search_mixed
        return cmd_search_mixed(args)
    model, cluster, wl = specs_from_args(args)
    user_pins, user_limits = narrowed_space(args)
    engine = engine_rules_from_args(args, wl, model)
    fixed, limits = bounded_space(engine, user_pins, user_limits)
    progress = progress_from_args(args)
    top = args.top if args.whatif is None else max(args.top, WHATIF_CANDIDATES)
    try:
        res, pool = ranked_search(model, cluster, wl, top, fixed=fixed, limits=limits, engine=engine,
                                  progress=progress, phase=progress.phase)
    except NoPlanFitsError as exc:
        raise _without_pins(args, exc, model, cluster, wl, user_pins, user_limits, engine, progress) from None
    ranked = pool[: args.top]
    wi = None if args.whatif is None else what_if(
        model, cluster, wl, pool[:WHATIF_CANDIDATES], args.whatif / 100.0,
        search_again=lambda cl, w: fastest_or_none(model, cl, w, fixed=fixed, limits=limits, engine=engine))
    if args.json:
        print(json_text({"model": model.name, "cluster": cluster.name, "num_gpus": cluster.num_gpus,
                          "engine": args.engine, "unchecked_gpus": unchecked_gpus([cluster.gpu]),
                          "notes": seq_notes(model, wl),
                          "num_candidates": res.num_candidates, "num_valid": res.num_valid, "num_fit": res.num_fit,
                          "elapsed_s": res.elapsed_s, "ranked": [estimate_dict(e) for e in ranked],
                          **_schedule_search(model, cluster, wl, ranked[0]),
                          **({"whatif": whatif_dict(wi)} if wi else {})}, indent=1))
        return 0
    width = terminal_width()
    print(header(model, cluster, wl, f"; plans {args.engine} runs, predicted with its policy" if engine else "",
                 width))
    print(wrap(f"searched {res.num_candidates:,} candidate plans ({res.num_valid:,} valid, {res.num_fit:,} fit in "
               f"memory) in {res.elapsed_s:.1f} s\n", width))
    print(ranking_table(ranked, width))
    print("\nbest plan:\n")
    print(estimate_report(ranked[0], width))
    searched = searched_beside(model, cluster, wl, ranked[0])
    if searched:
        print(wrap(searched_line(ranked[0], searched), width))
    if wi:
        print("\n" + whatif_table(wi, ranked, width))
    return 0


def _schedule_search(model, cluster, wl, best) -> dict:
    """The schedule search beside the best plan (search/schedule_search.py), for --json."""
    searched = searched_beside(model, cluster, wl, best)
    return {"best_schedule_search": searched_dict(best, searched)} if searched else {}


def _without_pins(args, exc, model, cluster, wl, user_pins, user_limits, engine,
                  progress: Progress) -> NoPlanFitsError:
    """The nothing-fits error: as it is without pins; with them, saying whether the search
    without them fits (search/policy.py nothing_fits_with_pins)."""
    # the user's restrictions of the plan space beyond the pinned axes, which a search without
    # the pins lifts too (the capacity factor is kept: token dropping is a training choice)
    restrictions = [(f, v) for f, v in (("--schedule", args.schedule), ("--cp-comm", args.cp_comm),
                                        ("--rank-order", args.rank_order)) if v is not None]
    if not (user_pins or restrictions):
        return exc
    pins = " ".join([f"{PIN_FLAGS[k]} {v}" for k, v in user_pins.items()] + [f"{f} {v}" for f, v in restrictions])
    kept = "; --capacity-factor kept" if args.capacity_factor is not None else ""
    lifted = f"without the pins ({pins}{kept})"
    if progress.bar or progress.long:
        progress.line(f"nothing fits; searching again {lifted}")
    return nothing_fits_with_pins(exc, model, cluster, wl, pins=pins, lifted=lifted, limits=user_limits,
                                  engine=engine, progress=progress, phase=progress.phase)
