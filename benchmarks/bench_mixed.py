"""Time the search over mixed clusters (`paraplan search --cluster MIXED.toml`, search/mixed.py).

    python benchmarks/bench_mixed.py            # table
    python benchmarks/bench_mixed.py --repeat 3 # best of 3

Cases: Llama 3 70B (seq 8192, batch 512) on examples/h100-a100-mixed.toml (512 H100 + 512
A100), and Llama 3.1 405B (batch 1,024) on 576 GB200 + 512 H100. Each line: the pipeline
shapes enumerated, those whose layers all fit, the wall time of the whole search (the
batched proxy table per group, the greedy layer balance of every shape, the exact pricing
of the best 24) and the best plan. The comparison with each group alone (a homogeneous
search per group) is not timed here: bench_search.py times that search.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

from paraplan.search.mixed import search_mixed  # noqa: E402
from paraplan.specs.catalog import load_mixed_cluster, load_model  # noqa: E402
from paraplan.specs.workload import Workload  # noqa: E402

GB200_H100 = """name = "gb200-h100"
[[group]]
name = "gb200"
cluster = "gb200-nvl72"
num_gpus = 576
[[group]]
name = "h100"
cluster = "dgx-h100"
num_gpus = 512
[between_groups]
gbit_per_s = 400.0
latency_us = 10.0
efficiency = 0.8
"""


def cases(tmp: str):
    gb = os.path.join(tmp, "gb200-h100.toml")
    with open(gb, "w") as f:
        f.write(GB200_H100)
    return (("llama3-70b / 512 H100 + 512 A100", "llama3-70b", os.path.join(HERE, "..", "examples",
                                                                             "h100-a100-mixed.toml"), 512),
            ("llama3.1-405b / 576 GB200 + 512 H100", "llama3.1-405b", gb, 1024))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; the fastest is reported")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'case':<40} {'shapes':>7} {'fit':>6} {'seconds':>8}  best plan")
        for label, model_name, path, batch in cases(tmp):
            model, mixed = load_model(model_name), load_mixed_cluster(path)
            workload = Workload(global_batch_size=batch, seq_len=8192)
            best = None
            for _ in range(max(1, args.repeat)):
                t0 = time.perf_counter()
                res = search_mixed(model, mixed, workload)
                wall = time.perf_counter() - t0
                best = min(best or (wall, res), (wall, res), key=lambda x: x[0])
            wall, res = best
            top = res.ranked[0]
            print(f"{label:<40} {res.num_shapes:>7,} {res.num_fit:>6,} {wall:>8.2f}  {top.plan.describe()} "
                  f"({top.step_time_s:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
