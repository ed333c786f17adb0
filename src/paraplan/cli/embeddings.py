"""`paraplan embeddings`: shard embedding tables over GPUs (and compare with TorchRec's planner)."""

from __future__ import annotations

import numpy as np

from ..argtypes import non_empty as _non_empty, number as _number, positive_int as _positive_int
from ..errors import SpecError
from ..report.strict_json import json_text
from .args import DEFAULT_CLUSTER


def add_parser(sub) -> None:
    m = sub.add_parser("embeddings", help="shard embedding tables (default: Criteo-1TB on 64 H100)")
    m.add_argument("--tables", default="criteo-1tb", help="criteo-1tb, dlrm-skewed or a CSV (name,num_rows,dim[,pooling_factor])")
    m.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"cluster preset or TOML (default {DEFAULT_CLUSTER})")
    m.add_argument("--gpus", type=_positive_int, default=64, help="number of GPUs (default 64)")
    m.add_argument("--batch-per-rank", type=_positive_int, default=512, help="samples per GPU (default 512)")
    m.add_argument("--optimizer", default="rowwise_adagrad", help="rowwise_adagrad or adam (default rowwise_adagrad)")
    m.add_argument("--profile", type=_non_empty, help="a locality profile TOML applied to every table (dlrm-2022 is built in)")
    m.add_argument("--hot-rows", action="store_true", help="replicate each table's hottest rows on every GPU (FlexShard)")
    m.add_argument("--dedup", action="store_true", help="deduplicate ids within the batch before the all-to-all (RecD)")
    m.add_argument("--hbm-reserve", type=_number, default=0.15, help="HBM share kept for the dense model (default 0.15)")
    m.add_argument("--ranks", type=_positive_int, default=16, help="ranks to show, slowest first (default 16)")
    m.add_argument("--export-torchrec", metavar="FILE", help="write the plan as TorchRec ParameterConstraints (JSON)")
    m.add_argument("--compare-torchrec", action="store_true", help="also run TorchRec's planner; price both plans with both models")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_embeddings)


def _ranks_text(ranks, world: int) -> str:
    if len(ranks) == world and tuple(ranks) == tuple(range(world)):
        return "all"
    if len(ranks) > 2 and tuple(ranks) == tuple(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def cmd_embeddings(args) -> int:
    from ..embeddings.cost import evaluate
    from ..embeddings.search import plan_embeddings
    from ..embeddings.tables import Optimizer, load_embedding_workload, load_profile
    from ..export.torchrec import export_document
    from ..specs.catalog import load_cluster
    from ..outfile import check_not_input, check_output, write_output
    if args.export_torchrec is not None:  # before planning
        check_output(args.export_torchrec, "embeddings", "--export-torchrec")
        check_not_input(args.export_torchrec, args, "embeddings", "--export-torchrec")
    if not 0 <= args.hbm_reserve < 1:
        raise SpecError("--hbm-reserve", "value", args.hbm_reserve, "a fraction in [0, 1) is required")
    try:
        optimizer = Optimizer(args.optimizer)
    except ValueError:
        raise SpecError("--optimizer", "value", args.optimizer, "allowed: " + ", ".join(o.value for o in Optimizer)) from None
    cluster = load_cluster(args.cluster, num_gpus=args.gpus)
    wl = load_embedding_workload(args.tables, args.batch_per_rank, optimizer)
    if args.profile:
        wl = wl.with_access(load_profile(args.profile))
    res = plan_embeddings(wl, cluster, hot_rows=args.hot_rows, dedup=args.dedup, hbm_reserve_fraction=args.hbm_reserve)
    plan, cost = res.plan, res.cost
    compare = None
    if args.compare_torchrec:
        from ..export.torchrec import price_with_torchrec, torchrec_plan
        tr_plan, tr_rating = torchrec_plan(wl, cluster, plan.world_size)
        compare = {"paraplan": {"paraplan_step_s": cost.step_time_s,
                                "torchrec_max_rank_s": price_with_torchrec(plan, wl, cluster).max_rank_s},
                   "torchrec_default": {"paraplan_step_s": evaluate(tr_plan, wl, cluster, hbm_reserve_fraction=args.hbm_reserve).step_time_s,
                                        "torchrec_max_rank_s": tr_rating.max_rank_s}}
    # TorchRec's placement lists every rank of every shard: built only where it is written
    # (data-parallel tables at 2^20 GPUs list a million ranks each)
    exported = export_document(plan, wl) if args.json or args.export_torchrec is not None else None
    if args.export_torchrec is not None:
        write_output(args.export_torchrec, json_text(exported, indent=1) + "\n", "embeddings", "--export-torchrec")
    if args.json:
        print(json_text({
            "workload": wl.name, "cluster": cluster.name, "world_size": plan.world_size,
            "batch_size_per_rank": wl.batch_size_per_rank, "hot_rows": args.hot_rows, "dedup": args.dedup,
            "step_time_s": cost.step_time_s, "phases_s": cost.phase_s, "all_to_all_bytes": cost.a2a_bytes,
            "max_rank_hbm_bytes": float(cost.hbm_bytes.max()), "usable_hbm_bytes": cost.capacity_bytes,
            "max_host_bytes": float(cost.host_bytes_per_host.max()), "host_memory_bytes": cost.host_capacity_bytes,
            "plans_priced": res.candidates, "torchrec": exported, "compare_torchrec": compare}, indent=1))
        return 0
    _print_plan(args, wl, cluster, res, compare)
    return 0


def _print_plan(args, wl, cluster, res, compare) -> None:
    """The text output: the workload and step, the phases, the tables' shards, the ranks."""
    from ..report.table import grid
    from ..report.width import terminal_width, wrap
    from ..units import fmt_bytes, fmt_count
    plan, cost = res.plan, res.cost
    width = terminal_width()
    print(wrap(f"{wl.name}: {len(wl.tables)} tables, {fmt_bytes(wl.total_weight_bytes)} of weights, batch {wl.batch_size_per_rank:,}/rank "
          f"on {plan.world_size} x {cluster.gpu.name} ({cluster.name}); optimizer {wl.optimizer.value}"
          + ("; hot-row replication" if args.hot_rows else "") + ("; in-batch dedup" if args.dedup else ""),
               width, indent=2))
    print(wrap(f"step (embeddings only) {cost.step_time_s * 1e3:.3f} ms; all-to-all {fmt_bytes(cost.a2a_bytes)}/step; "
          f"fullest rank {fmt_bytes(float(cost.hbm_bytes.max()))} of {fmt_bytes(cost.capacity_bytes)} usable HBM; "
          + (f"host memory (UVM) {fmt_bytes(float(cost.host_bytes_per_host.max()))} per host"
             + (f" of {fmt_bytes(cost.host_capacity_bytes)}; " if cost.host_capacity_bytes > 0 else "; ")
             if float(cost.host_bytes_per_host.max()) > 0 else "")
          + f"{res.candidates} plans priced", width, indent=2))
    print()
    total = cost.step_time_s
    print(grid(["phase (slowest rank)", "ms", "share"],
               [[k, f"{v * 1e3:.4f}", f"{100 * v / total:.1f}%"] for k, v in cost.phase_s.items() if v > 0]))
    print()
    tables = {t.name: t for t in wl.tables}
    print(grid(["table", "rows", "dim", "pool", "sharding", "kernel", "ranks", "hot rows", "lookup ms"],
               [[p.table, fmt_count(tables[p.table].num_rows), str(tables[p.table].dim), f"{tables[p.table].pooling_factor:g}",
                 p.sharding.value + (f" x{len(p.ranks)}" if p.sharding.value == "column_wise" else ""),
                 p.kernel.value + (f" ({100 * p.cache_ratio:.0f}% cached)" if p.cache_ratio else ""),
                 _ranks_text(p.ranks, plan.world_size), f"{100 * p.hot_row_fraction:g}%" if p.hot_row_fraction else "",
                 f"{cost.table_s[p.table] * 1e3:.4f}"] for p in plan.placements]))
    print()
    totals = cost.rank_total_s
    order = list(np.argsort(-totals, kind="stable"))
    shown = order[: args.ranks]
    comm = sum(cost.comm_s.values())
    print(grid(["rank", "shards", "HBM", "fwd ms", "bwd ms", "comm ms", "sum ms"],
               [[str(r), str(sum(r in p.ranks for p in plan.placements)), fmt_bytes(float(cost.hbm_bytes[r])),
                 f"{cost.fwd_lookup_s[r] * 1e3:.4f}", f"{cost.bwd_lookup_s[r] * 1e3:.4f}", f"{comm[r] * 1e3:.4f}",
                 f"{totals[r] * 1e3:.4f}"] for r in shown]))
    if len(order) > len(shown):
        print(f"({len(order) - len(shown)} less loaded ranks not shown; --ranks N shows more)")
    if compare:
        print()
        print(grid(["plan", "paraplan model: step ms", "TorchRec model: slowest rank ms"],
                   [[k, f"{v['paraplan_step_s'] * 1e3:.4f}", f"{v['torchrec_max_rank_s'] * 1e3:.4f}"] for k, v in compare.items()]))
    if args.export_torchrec:
        print(f"wrote {args.export_torchrec}: TorchRec ParameterConstraints per table (+ ranks)")
