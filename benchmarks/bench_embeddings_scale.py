"""How the embedding planner's time grows with the tables and the GPUs.

    python benchmarks/bench_embeddings_scale.py     # 100, 500, 1,000, 2,000 tables on 64 GPUs; Criteo at 16,384 to 262,144
    python benchmarks/bench_embeddings_scale.py --tables 100,200 --gpus 16 --criteo-gpus ''

Synthetic workloads: N tables with a fixed seed, rows log-uniform from 1,000 to 40M, widths
64/128/128/256, pooling factors 1/1/2/5/20 (the spread of a production DLRM: a few huge
tables, many small). Each case runs in its own process: one `plan_embeddings` call, its wall
time, the plans it priced, its step and the process's peak resident memory (imports
included). Up to 128 tables every candidate is packed afresh (search.REPACK_MAX_TABLES);
beyond, one table moves at a time, so the time grows about linearly with the tables. The
ranks no table-wise or column-wise shard is on share one column (embeddings/ranks.py), so
the time at many GPUs grows with the shards, not the ranks. Timings belong here, never in
unit tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bench_search import environment, environment_line  # noqa: E402
from paraplan.embeddings.search import plan_embeddings  # noqa: E402
from paraplan.embeddings.tables import EmbeddingTable, EmbeddingWorkload, load_embedding_workload  # noqa: E402
from paraplan.specs.catalog import load_cluster  # noqa: E402


def synthetic(n: int, batch_per_rank: int = 512, seed: int = 0) -> EmbeddingWorkload:
    rng = random.Random(seed)
    tables = tuple(EmbeddingTable(name=f"t{i}", num_rows=int(10 ** rng.uniform(3, 7.6)),
                                  dim=rng.choice([64, 128, 128, 256]), pooling_factor=rng.choice([1, 1, 2, 5, 20]))
                   for i in range(n))
    return EmbeddingWorkload(name=f"synthetic-{n}", tables=tables, batch_size_per_rank=batch_per_rank)


def run_case(label: str, wl: EmbeddingWorkload, gpus: int) -> dict:
    cluster = load_cluster("dgx-h100", num_gpus=gpus)
    t0 = time.perf_counter()
    res = plan_embeddings(wl, cluster)
    seconds = time.perf_counter() - t0
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"case": label, "tables": len(wl.tables), "gpus": gpus, "seconds": seconds,
            "plans_priced": res.candidates, "step_ms": res.cost.step_time_s * 1e3, "peak_rss_mib": peak_mib}


def one_case(spec: str) -> dict:
    """The case `spec` ("synthetic:N:GPUS" or "criteo:GPUS"), in this process."""
    kind, *numbers = spec.split(":")
    if kind == "criteo":
        return run_case("Criteo-1TB (26 tables)", load_embedding_workload("criteo-1tb", 512), int(numbers[0]))
    return run_case(f"{numbers[0]} synthetic tables", synthetic(int(numbers[0])), int(numbers[1]))


def in_child(spec: str) -> dict:
    """The case `spec` in a fresh process, so that its peak memory is its own."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", spec], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", default="100,500,1000,2000")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--criteo-gpus", default="16384,65536,262144", help="Criteo-1TB at these GPU counts ('' for none)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child's case: synthetic:N:GPUS or criteo:GPUS
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_case(args.one)))
        return
    specs = [f"synthetic:{n}:{args.gpus}" for n in args.tables.split(",") if n]
    specs += [f"criteo:{g}" for g in args.criteo_gpus.split(",") if g]
    rows = [in_child(spec) for spec in specs]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(environment_line(environment()))
    print(f"{'case':<26} {'GPUs':>7} {'seconds':>8} {'plans priced':>13} {'step ms':>9} {'peak MiB':>9}")
    print("-" * 77)
    for r in rows:
        print(f"{r['case']:<26} {r['gpus']:>7,} {r['seconds']:>8.2f} {r['plans_priced']:>13,} {r['step_ms']:>9.3f} "
              f"{r['peak_rss_mib']:>9,.0f}")


if __name__ == "__main__":
    main()
