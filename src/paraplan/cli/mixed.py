"""Commands over a mixed cluster (--cluster with [[group]] tables): `search` ranks pipelines
over the GPU groups (search/mixed.py), the best shown stage by stage and beside the best plan
on each group alone; `estimate` and `trace` take one such plan (--stages, or the search's
--rank N)."""

from __future__ import annotations

from ..cost.mixed import MixedEstimate, estimate_mixed
from ..errors import NoPlanFitsError, SpecError
from ..plan.axes import Recompute, Schedule, ZeroStage
from ..plan.mixed import MixedPlan, MixedStage
from ..report.mixed import comparison, mixed_dict, mixed_trace, ranking, stages_table, summary
from ..report.strict_json import json_text
from ..report.width import terminal_width, wrap
from ..search.mixed import search_mixed
from ..specs.catalog import load_mixed_cluster
from ..units import fmt_count
from .args import model_from_args, workload_from_args
from .notes import seq_notes

# flags of one homogeneous plan or cluster: a mixed plan's stages say where and how they run
_NOT_FOR_MIXED = ("tp", "pp", "cp", "ep", "etp", "vp", "cp_comm", "rank_order", "capacity_factor",
                  "grad_compression", "powersgd_rank", "hardware", "engine", "whatif", "plan", "recompute_ops",
                  "dp_shard", "offload", "offload_activations", "adama", "attention",
                  "a2a_hierarchical", "ep_overlap", "no_dp_overlap", "recompute_layers", "fill_bubbles",
                  "bubble_work_tflop", "bubble_work_gb", "bubble_work_pieces", "max_microbatches",
                  "low_precision_params")
# what `search` over a mixed cluster chooses itself
_SEARCHED = ("dp", "mb", "schedule", "recompute", "zero", "sp", "tp_overlap", "stages")


def _check_flags(args, chosen: tuple[str, ...] = _SEARCHED) -> None:
    for name in _NOT_FOR_MIXED + chosen:
        if getattr(args, name, None) not in (None, False, 0):
            raise SpecError(args.command, "--" + name.replace("_", "-"), getattr(args, name),
                            "not with a mixed cluster (--cluster with [[group]] tables): its plans are --stages "
                            "with --dp, --mb, --recompute, --zero 0|1, --schedule 1f1b|gpipe, --sp, --tp-overlap")


def parse_stages(text: str) -> tuple[MixedStage, ...]:
    """`h100:8:57,a100:8:23` as stages (group, TP, layers), in pipeline order."""
    stages = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
            raise SpecError("plan", "--stages", text, "comma-separated GROUP:TP:LAYERS, e.g. h100:8:57,a100:8:23")
        stages.append(MixedStage(group=parts[0], tp=int(parts[1]), layers=int(parts[2])))
    return tuple(stages)


def _plan_from_flags(args) -> MixedPlan:
    stages = parse_stages(args.stages)
    if args.dp is None:
        raise SpecError("plan", "--dp", "(not given)", "the data-parallel degree of the --stages pipeline")
    zero = ZeroStage.parse(args.zero, "--zero") if args.zero is not None else ZeroStage.OPTIMIZER
    return MixedPlan(dp=args.dp, micro_batch_size=args.mb or 1, stages=stages,
                     schedule=Schedule.parse(args.schedule, "--schedule") if args.schedule else Schedule.ONE_F_ONE_B,
                     recompute=Recompute.parse(args.recompute, "--recompute") if args.recompute else Recompute.NONE,
                     zero=zero, sequence_parallel=args.sp is not False, tp_overlap=args.tp_overlap)


def chosen_mixed(args, model, mixed, workload) -> tuple[MixedEstimate, str]:
    """(the plan of --stages, or the search's --rank N, priced; "flags" or "search")."""
    if args.stages:
        _check_flags(args, ("rank",))
        return estimate_mixed(model, mixed, workload, _plan_from_flags(args)), "flags"
    _check_flags(args)
    rank = args.rank or 1
    ranked = search_mixed(model, mixed, workload, top_k=rank).ranked
    if len(ranked) < rank:
        raise SpecError(args.command, "--rank", rank, f"at most {len(ranked)}: the plans the search ranks that fit")
    return ranked[rank - 1], "search"


def cmd_estimate_mixed(args) -> int:
    model, workload = model_from_args(args), workload_from_args(args)
    mixed = load_mixed_cluster(args.cluster)
    est, source = chosen_mixed(args, model, mixed, workload)
    if args.json:
        print(json_text({**mixed_dict(est, workload), "model": model.name, "plan_source": source},
                        indent=1))
        return 0
    print(_header(model, mixed, workload, terminal_width()) + "\n")
    print(summary(est, workload) + ("" if est.fits else "\nmemory          DOES NOT FIT (see OVER below)"))
    print()
    print(stages_table(est))
    return 0


def cmd_trace_mixed(args) -> int:
    from ..outfile import check_not_input, check_output, write_output
    if args.output != "-":
        check_output(args.output, "trace", "--output")
        check_not_input(args.output, args, "trace", "--output")
    model, workload = model_from_args(args), workload_from_args(args)
    mixed = load_mixed_cluster(args.cluster)
    est, _ = chosen_mixed(args, model, mixed, workload)
    text = json_text(mixed_trace(est, model.name))
    if args.output == "-":
        print(text)
    else:
        write_output(args.output, text, "trace", "--output")
        print(f"wrote {args.output}: step {est.step_time_s:.3f} s, plan {est.plan.describe()} "
              "(open in https://ui.perfetto.dev or chrome://tracing)")
    return 0


def _header(model, mixed, workload, width: int) -> str:
    groups = " + ".join(f"{g.num_gpus} × {g.cluster.gpu.name} ({g.name})" for g in mixed.groups)
    lines = [wrap(f"{model.name} ({fmt_count(model.num_params)} params) on {mixed.name}: {groups}; batch "
                  f"{workload.global_batch_size} × {workload.seq_len} tokens, {workload.precision_label}", width)]
    return "\n".join(lines + [wrap(note, width, indent=2) for note in seq_notes(model, workload)])


def _alone(model, group, workload):
    """The best plan on `group` alone (planner search), or why none fits."""
    from ..search.planner import search
    try:
        return search(model, group.cluster, workload, top_k=1).ranked[0]
    except NoPlanFitsError as e:
        return f"nothing fits: {str(e).splitlines()[0]}"


def cmd_search_mixed(args) -> int:
    _check_flags(args)
    model, workload = model_from_args(args), workload_from_args(args)
    mixed = load_mixed_cluster(args.cluster)
    res = search_mixed(model, mixed, workload, top_k=args.top)
    alone = [(g.name, _alone(model, g, workload)) for g in mixed.groups]
    best = res.ranked[0]
    if args.json:
        print(json_text({"model": model.name, "cluster": mixed.name, "num_shapes": res.num_shapes,
                         "num_fit": res.num_fit, "elapsed_s": res.elapsed_s,
                         "ranked": [mixed_dict(e, workload) for e in res.ranked],
                         "alone": {name: (e if isinstance(e, str) else {"plan": e.plan.describe(),
                                                                        "step_time_s": e.step_time_s,
                                                                        "tokens_per_s": e.tokens_per_s,
                                                                        "num_gpus": e.num_gpus})
                                   for name, e in alone}}, indent=1))
        return 0
    width = terminal_width()
    print(_header(model, mixed, workload, width))
    print(wrap(f"searched {res.num_shapes:,} pipeline shapes ({res.num_fit:,} place every layer within memory) in "
               f"{res.elapsed_s:.1f} s\n", width))
    print(ranking(list(res.ranked), width))
    print("\nbest plan:\n")
    print(summary(best, workload))
    print()
    print(stages_table(best))
    print("\nthe best plan on each group alone (paraplan search on that group's cluster):\n")
    print(comparison(best, alone, workload.token_budget))
    return 0
