"""The one rule by which search, estimate, trace and export choose a plan (docs/tutorial.md,
Choosing the plan):

- plan flags narrow the search (`--pp 8`: the plans with eight pipeline stages), as `search`
  takes them; `--rank N` is the N-th plan of that search, as `search` numbers its rows, and
  with no `--rank` it is the first;
- `--plan "TP8 PP1 DP64 ..."` is exactly that plan (the string `search` prints);
- estimate and trace price a plan written out in flags as it is, the rest at its defaults,
  unless `--rank` asks for the search: they are how a plan one has in mind is judged, fit or not.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from ..cost.estimate import Estimate
from ..errors import SpecError
from ..plan.axes import AttentionKernel, Recompute, ZeroStage
from ..plan.plan import Plan
from ..plan.space import SpaceLimits
from ..search.policy import EngineRules, bounded_space, ranked_search
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .args import (DEFAULT_BATCH_TOKENS, apply_plan_string, check_recompute_layers, engine_default_zero,
                   plan_flags_given, plan_from_args, search_pins)
from .progress import Progress, progress_from_args

SEARCHED_PLAN_NOTE = ("no plan flags: the fastest plan that fits, as `paraplan search` ranks it (plan flags such as "
                      "--tp pick one)")


def searched_plan_note(args: argparse.Namespace) -> str:
    """What a report says of a plan the search chose: the first without flags, else its rank."""
    rank = getattr(args, "rank", None)
    if rank is None:
        return SEARCHED_PLAN_NOTE
    return (f"--rank {rank}: row {rank} of `paraplan search` with the same flags (the plan flags given narrow the "
            "search)")

# plan flags no search varies toward one value (the space tries each choice there, or only
# one): with --rank, or to export, the plan they describe is given whole with --plan
UNSEARCHED_FLAGS = (("offload", "--offload"), ("adama", "--adama"), ("no_dp_overlap", "--no-dp-overlap"),
                    ("dp_shard", "--dp-shard"),
                    ("recompute_layers", "--recompute-layers"), ("recompute_ops", "--recompute-ops"),
                    ("a2a_hierarchical", "--a2a-hierarchical"),
                    ("ep_overlap", "--ep-overlap"), ("offload_activations", "--offload-activations"))


def narrowed_space(args: argparse.Namespace) -> tuple[dict, SpaceLimits]:
    """(pins, limits) of the search the plan flags narrow: search's pins and choices
    (args.py search_pins) and, among the flags of one plan (estimate, trace, export), the
    ZeRO stage, recomputation, SP, TP overlap and attention kernel held to the value given."""
    fixed, limits = search_pins(args)
    if not hasattr(args, "zero"):  # search's own flags
        return fixed, limits
    check_recompute_layers(args)
    for key, flag in UNSEARCHED_FLAGS:
        value = getattr(args, key)
        if value not in (None, False, 0):
            raise SpecError("plan", flag, value, "does not narrow a search (it tries that choice where it helps): "
                            "give the whole plan with --plan 'TP8 PP1 ...', or leave the flag out")
    narrow: dict = {}
    if args.zero is not None:
        narrow["zero_stages"] = (ZeroStage.parse(str(args.zero), "zero"),)
    if args.recompute is not None:
        narrow["recomputes"] = (Recompute.parse(args.recompute, "recompute"),)
    if args.sp is not None:
        narrow["sequence_parallel"] = (args.sp,)
    if args.tp_overlap:
        narrow["tp_overlap"] = (True,)
    if args.attention is not None:
        narrow["attention"] = (AttentionKernel.parse(args.attention, "attention"),)
    return fixed, replace(limits, **narrow)


def ranked_plan(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                engine: EngineRules | None, rank: int, progress: Progress | None = None) -> Estimate:
    """The estimate of the rank-th plan (1-based) of the search the plan flags narrow, within
    the engine's bounds; a rank past the plans the search ranked is a one-line error."""
    fixed, limits = bounded_space(engine, *narrowed_space(args))
    progress = progress or progress_from_args(args)
    _, ranked = ranked_search(model, cluster, workload, rank, fixed=fixed, limits=limits, engine=engine,
                              progress=progress, phase=progress.phase)
    if rank > len(ranked):
        where = "" if not plan_flags_given(args) else " with these plan flags"
        raise SpecError("plan", "--rank", rank, f"at most {len(ranked)}: the search{where} ranks "
                        f"{len(ranked)} plan{'s' if len(ranked) != 1 else ''} that fit"
                        + (f" and {engine.support.engine} runs" if engine is not None else ""))
    return ranked[rank - 1]


def engine_plan(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                engine: EngineRules | None) -> Plan:
    """The plan of the flags, with the engine's policy knobs and checked against it."""
    plan = plan_from_args(args, cluster)
    per = plan.dp * plan.micro_batch_size
    if args.batch is None and args.batch_tokens is None and workload.global_batch_size % per:
        # the default batch, not one the user gave: say so, and which flag sets it
        raise SpecError("plan", "--batch", workload.global_batch_size,
                        f"(the default, about {DEFAULT_BATCH_TOKENS:,} tokens of --seq {workload.seq_len}) is not a "
                        f"multiple of DP×micro-batch = {plan.dp}×{plan.micro_batch_size}; give --batch, a multiple "
                        f"of {per}")
    if engine is not None:
        plan = engine.support.adapt(engine_default_zero(args, plan, engine.support))
        engine.check(plan, model, workload)
    return plan


def chosen_plan(args: argparse.Namespace, model: ModelSpec, cluster: ClusterSpec, workload: Workload, *,
                engine: EngineRules | None, flags_narrow: bool,
                progress: Progress | None = None) -> tuple[Plan, str]:
    """(plan, source) by the module's rule: "plan" (--plan), "flags" (estimate and trace's
    flags without --rank; `flags_narrow=False`) or "search" (the --rank-th, default first,
    plan of the search the flags narrow)."""
    rank = getattr(args, "rank", None)
    if rank is not None and getattr(args, "plan", None):
        raise SpecError("plan", "--rank", rank, "picks a plan of the search; --plan gives the whole plan: one or "
                        "the other")
    if getattr(args, "plan", None):
        apply_plan_string(args)
        return engine_plan(args, model, cluster, workload, engine), "plan"
    if rank is None and not flags_narrow and plan_flags_given(args):
        return engine_plan(args, model, cluster, workload, engine), "flags"
    return ranked_plan(args, model, cluster, workload, engine, rank or 1, progress).plan, "search"
