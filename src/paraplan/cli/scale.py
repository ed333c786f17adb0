"""`paraplan scale`: the best plan at each GPU count of a sweep (and of several clusters)."""

from __future__ import annotations

import argparse
import sys

from ..argtypes import MAX_DEGREE, integer as _integer
from ..errors import SpecError
from ..report.jsonout import estimate_dict
from ..report.strict_json import json_text
from ..report.table import scaling_table, unchecked_gpus, unchecked_note
from ..report.width import terminal_width, wrap
from ..search.policy import ENGINE_CANDIDATES, bounded_space, expressible
from ..search.scaling import scale
from ..specs.catalog import load_cluster
from ..units import fmt_count
from .args import add_plan_command, engine_rules_from_args, search_pins, specs_from_args


def add_parser(sub) -> None:
    c = add_plan_command(sub, "scale", "the best plan at each GPU count of a sweep: throughput, scaling efficiency, "
                                       "time and cost to train the budget (fixed global batch); --cluster a,b "
                                       "sweeps several clusters and names the soonest and the cheapest across them",
                         required=False)
    c.add_argument("--counts", default=",".join(map(str, DEFAULT_SCALE_COUNTS)),
                   help="GPU counts to search, comma-separated (default "
                        + ",".join(map(str, DEFAULT_SCALE_COUNTS)) + "; --gpus is ignored)")
    c.add_argument("--plot", default=None, help="also draw the sweep (PNG, or the format of the extension)")
    c.set_defaults(func=cmd_scale)


DEFAULT_SCALE_COUNTS = (256, 512, 1024, 2048, 4096, 8192, 16384)


def _cluster_names(text: str) -> list[str]:
    """scale --cluster: one preset or TOML, or several separated by commas (each once)."""
    names = [x.strip() for x in text.split(",")]
    if not all(names):
        raise SpecError("scale", "--cluster", text, "cluster presets or TOML files separated by commas "
                        "(e.g. dgx-h100,dgx-b200)")
    return list(dict.fromkeys(names))


def _gpu_counts(text: str) -> tuple[int, ...]:
    """--counts: GPU counts separated by commas, each a whole number >= 1."""
    try:
        counts = tuple(_integer(x) for x in text.split(","))
    except argparse.ArgumentTypeError:
        counts = ()
    if not counts or any(not 1 <= n <= MAX_DEGREE for n in counts):
        raise SpecError("scale", "--counts", text, f"GPU counts separated by commas, each a whole number from 1 to "
                        f"{MAX_DEGREE:,} (e.g. 1024,2048,4096)")
    return tuple(sorted(set(counts)))


def cmd_scale(args) -> int:
    counts = _gpu_counts(args.counts)
    if args.plot is not None:  # a path that cannot be written fails before the searches
        from ..report.plots import plot_format
        plot_format(args.plot, "scale")
    names = _cluster_names(args.cluster)
    if args.hardware:
        if len(names) > 1:  # --hardware replaces --cluster: a list would be dropped silently
            raise SpecError("scale", "--hardware", args.hardware, "one profile in place of --cluster; to compare "
                            "it with clusters, list it in --cluster (e.g. --cluster dgx-h100,profile.toml)")
        names = [args.hardware]
    model, cluster, wl = specs_from_args(args, names[0])
    clusters = [load_cluster(name, num_gpus=n).with_power_limit(args.power_limit) for name in names for n in counts]
    loaded = [c.name for c in clusters[::len(counts)]]
    if len(set(loaded)) < len(loaded):  # points are told apart by their cluster's name
        raise SpecError("scale", "--cluster", args.cluster, f"clusters with distinct names (these load as {', '.join(loaded)})")
    engine = engine_rules_from_args(args, wl, model)
    fixed, limits = bounded_space(engine, *search_pins(args))
    show = (not args.json) and sys.stderr.isatty()

    def progress(i, n, gpus):
        on = f" of {clusters[i].name}" if len(names) > 1 else ""
        sys.stderr.write(f"\rsearching {gpus:,} GPUs{on} ({i + 1} of {n})   ")
        sys.stderr.flush()

    try:
        result = scale(model, clusters, wl, limits=limits, fixed=fixed, progress=progress if show else None,
                       choose=None if engine is None else (lambda ranked: expressible(ranked, model, wl, engine.support,
                                                                                      engine.check)),
                       choose_among=ENGINE_CANDIDATES)
    finally:
        if show:
            sys.stderr.write("\r" + " " * 40 + "\r")
    where = (f"{cluster.gpu.name} ({cluster.name})" if len(names) == 1
             else ", ".join(f"{c.gpu.name} ({c.name})" for c in clusters[::len(counts)]))
    title = (f"{model.name} on {where}; batch {wl.global_batch_size} × {wl.seq_len} "
             f"tokens, {wl.precision_label}" + (f"; plans {args.engine} runs" if engine is not None else ""))
    if args.plot is not None:
        from ..report.plots import plot_scaling
        plot_scaling(result, args.plot, title)
    if args.json:
        print(json_text({"model": model.name, "cluster": cluster.name if len(names) == 1 else None,
                          "unchecked_gpus": unchecked_gpus([c.gpu for c in clusters]),
                          "global_batch_size": wl.global_batch_size,
                          "seq_len": wl.seq_len, "precision": str(wl.precision), "fp8_recipe": str(wl.fp8_recipe),
                          "optimizer": str(wl.optimizer),
                          "token_budget": wl.token_budget, "interruptions_per_gpu_day": wl.interruptions_per_gpu_day,
                          "clusters": list(result.cluster_names),
                          "points": [
                              {"num_gpus": p.num_gpus, "cluster": p.cluster_name, "gpu": p.gpu_name,
                               "usd_per_gpu_hour": p.usd_per_gpu_hour,
                               "why_not": p.why_not or None, "scaling_efficiency": p.efficiency,
                               "num_candidates": p.num_candidates, "search_s": p.elapsed_s,
                               "best": estimate_dict(p.best) if p.best is not None else None} for p in result.points],
                          "fastest_num_gpus": result.fastest.num_gpus if result.fastest else None,
                          "fastest_cluster": result.fastest.cluster_name if result.fastest else None,
                          "cheapest_num_gpus": result.cheapest.num_gpus if result.cheapest else None,
                          "cheapest_cluster": result.cheapest.cluster_name if result.cheapest else None}, indent=1))
        return 0
    width = terminal_width()
    print(wrap(title + f"; {fmt_count(wl.token_budget)} tokens to train", width, indent=2) + "\n")
    print(scaling_table(result, width))
    note = unchecked_note([c.gpu for c in clusters])
    if note:
        print(wrap(note, width, indent=2))
    if args.plot:
        print(f"wrote {args.plot}")
    return 0
