"""paraplan's embedding planner against TorchRec's, both priced by both cost models.

    python benchmarks/bench_embeddings.py                 # Criteo-1TB at 8/64/128 GPUs, batch 512 and 65,536 per rank
    python benchmarks/bench_embeddings.py --search        # also TorchRec's slower proposers (minutes at 64 GPUs)

Needs TorchRec on CPU (README: 'Side by side with TorchRec'). Per case: the slowest-rank
cost TorchRec's own estimator gives its default plan, (optionally) its best plan with the
dynamic-programming and enlarged grid-search proposers, and paraplan's plan; paraplan's
model's step for both plans; and each planner's wall time. Timings belong here, never in
unit tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from paraplan.embeddings.cost import evaluate  # noqa: E402
from paraplan.embeddings.search import plan_embeddings  # noqa: E402
from paraplan.embeddings.tables import load_embedding_workload  # noqa: E402
from paraplan.export.torchrec import price_with_torchrec, torchrec_plan  # noqa: E402
from paraplan.specs.catalog import load_cluster  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", default="8,64,128")
    ap.add_argument("--batch", default="512,65536")
    ap.add_argument("--search", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for W in map(int, args.gpus.split(",")):
        for B in map(int, args.batch.split(",")):
            wl = load_embedding_workload("criteo-1tb", B)
            cluster = load_cluster("dgx-h100", num_gpus=W)
            t0 = time.perf_counter()
            ours = plan_embeddings(wl, cluster)
            t_ours = time.perf_counter() - t0
            t0 = time.perf_counter()
            tr_plan, tr = torchrec_plan(wl, cluster, W)
            t_tr = time.perf_counter() - t0
            row = {"gpus": W, "batch_per_rank": B,
                   "torchrec_model_ms": {"torchrec_default": tr.max_rank_s * 1e3,
                                         "paraplan": price_with_torchrec(ours.plan, wl, cluster).max_rank_s * 1e3},
                   "paraplan_model_ms": {"torchrec_default": evaluate(tr_plan, wl, cluster).step_time_s * 1e3,
                                         "paraplan": ours.cost.step_time_s * 1e3},
                   "planner_s": {"paraplan": t_ours, "torchrec_default": t_tr}}
            if args.search:
                t0 = time.perf_counter()
                _, trs = torchrec_plan(wl, cluster, W, "search")
                row["torchrec_model_ms"]["torchrec_search"] = trs.max_rank_s * 1e3
                row["planner_s"]["torchrec_search"] = time.perf_counter() - t0
            rows.append(row)
            if not args.json:
                m = row["torchrec_model_ms"]
                gain = 100 * (1 - m["paraplan"] / m["torchrec_default"])
                extra = f" search {m['torchrec_search']:.4f}" if args.search else ""
                print(f"{W:4d} GPUs batch {B:6d}: TorchRec model ms: default {m['torchrec_default']:.4f}{extra} paraplan {m['paraplan']:.4f} "
                      f"({gain:+.1f}%) | paraplan model ms: default {row['paraplan_model_ms']['torchrec_default']:.4f} "
                      f"paraplan {row['paraplan_model_ms']['paraplan']:.4f} | planner s: paraplan {t_ours:.2f} TorchRec {t_tr:.2f}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
