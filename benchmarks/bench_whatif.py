"""How fast `--whatif` is, and what re-timing only the 64 best plans misses.

    python benchmarks/bench_whatif.py          # table
    python benchmarks/bench_whatif.py --json

`paraplan search --whatif` re-times the nominal search's 64 best plans under each assumption
made 20% worse (search/whatif.py), and searches the changed cluster whole only where the
re-timed best is slower than the 64th plan was nominally (then a plan further down could win).
For each case this times that against a whole search per scenario and compares the fastest
plans: the gap is how much faster the whole search's plan is (0: the same step time).
`--retime-only` leaves the whole searches out of what-if, to show what re-timing alone misses.
Timings belong here, never in unit tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bench_search import environment, environment_line  # noqa: E402
from paraplan.search.planner import search  # noqa: E402
from paraplan.search.whatif import DEFAULT_CHANGE, WHATIF_CANDIDATES, scenario, what_if  # noqa: E402
from paraplan.specs.catalog import load_cluster, load_model  # noqa: E402
from paraplan.specs.workload import Precision, Workload  # noqa: E402

CASES = (
    # (label, model preset, cluster preset, GPUs, seq, global batch in sequences, precision)
    ("llama3-70b / 512 x H100 (CLI default)", "llama3-70b", "dgx-h100", 512, 8192, 512, "bf16"),
    ("gpt3-175b / 1024 x H100", "gpt3-175b", "dgx-h100", 1024, 2048, 1536, "bf16"),
    ("mixtral-8x7b / 256 x H100 (MoE)", "mixtral-8x7b", "dgx-h100", 256, 4096, 1024, "bf16"),
    ("llama3-8b / 64 x A100 40GB", "llama3-8b", "dgx-a100-40gb", 64, 8192, 256, "bf16"),
)


def _fastest(model, cluster, workload):
    from paraplan.errors import NoPlanFitsError
    try:
        return search(model, cluster, workload, top_k=1).ranked[0]
    except NoPlanFitsError:
        return None


def run_case(label, model_name, cluster_name, num_gpus, seq, batch, precision, retime_only):
    model = load_model(model_name)
    cluster = load_cluster(cluster_name, num_gpus=num_gpus)
    wl = Workload(global_batch_size=batch, seq_len=seq, precision=Precision(precision))
    t0 = time.perf_counter()
    res = search(model, cluster, wl, top_k=WHATIF_CANDIDATES)
    search_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    wi = what_if(model, cluster, wl, res.ranked, DEFAULT_CHANGE,
                 search_again=None if retime_only else (lambda c, w: _fastest(model, c, w)))
    whatif_s = time.perf_counter() - t0
    rows, full_s = [], 0.0
    for r in wi.rows:
        c, w = scenario(r.assumption, model, cluster, wl, DEFAULT_CHANGE, worse=True)
        t0 = time.perf_counter()
        full = _fastest(model, c, w)
        full_s += time.perf_counter() - t0
        found = r.best_if_worse
        gap = (0.0 if found is None and full is None else math.inf if found is None or full is None
               else found.step_time_s / full.step_time_s - 1.0)
        rows.append({"assumption": str(r.assumption), "searched_again": r.searched_again,
                     "whatif_best": found.plan.describe() if found else None,
                     "whatif_best_step_s": found.step_time_s if found else None,
                     "full_best": full.plan.describe() if full else None,
                     "full_best_step_s": full.step_time_s if full else None, "gap": gap, "regret": r.regret})
    return {"case": label, "search_s": search_s, "whatif_s": whatif_s, "full_searches_s": full_s,
            "scenarios": len(rows), "same_step": sum(abs(x["gap"]) < 1e-9 for x in rows),
            "searched_again": sum(x["searched_again"] for x in rows),
            "max_gap": max(x["gap"] for x in rows), "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--retime-only", action="store_true", help="what-if without its whole searches")
    args = ap.parse_args(argv)
    results = [run_case(*case, retime_only=args.retime_only) for case in CASES]
    env = environment()
    if args.json:
        print(json.dumps({"environment": env, "results": results}, indent=1))
        return 0
    print(f"{environment_line(env)}; each assumption {100 * DEFAULT_CHANGE:g}% worse")
    head = (f"{'case':<40} {'search s':>8} {'whatif s':>8} {'searched again':>14} {'full s':>8} {'same best':>10} "
            f"{'max gap':>8}")
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r['case']:<40} {r['search_s']:>8.2f} {r['whatif_s']:>8.2f} {r['searched_again']:>14} "
              f"{r['full_searches_s']:>8.2f} "
              f"{r['same_step']:>4} of {r['scenarios']:<3} {100 * r['max_gap']:>7.2f}%")
        for x in r["rows"]:
            if x["gap"] > 1e-9:
                print(f"    {x['assumption']}: what-if {x['whatif_best']} {x['whatif_best_step_s']} s; "
                      f"whole search {x['full_best']} {x['full_best_step_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
