"""Every plan kind `paraplan run` executes, checked against the single-process run.

    python benchmarks/run_kinds.py          # ~5 min on 2 CPU cores (torch 2.13 CPU, gloo)

Runs a 4-layer, hidden-64 model for 3 steps under each plan and prints the largest relative
difference of its loss and gradient norm from reference.single_process_run (tests/test_run.py
uses 1e-5 as the tolerance and runs five of these kinds). A plan `paraplan run` refuses is
shown with its one-line error.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from paraplan.run.cli import config_from_argv
from paraplan.run.reference import single_process_run

TINY = ("--model llama3-8b --layers 4 --hidden 64 --heads 4 --kv-heads 2 --vocab 256 --seq 32 --batch 8 "
        "--steps 2 --warmup 1 --device cpu").split()
KINDS = [
    "--dp 2 --zero 3", "--dp 4 --zero 3 --dp-shard 2", "--dp 2", "--dp 2 --zero 1", "--dp 2 --zero 2 --mb 2",
    "--tp 2", "--tp 2 --no-sp", "--tp 2 --dp 2 --zero 3",
    "--pp 2 --schedule gpipe", "--pp 2", "--pp 2 --vp 2", "--pp 2 --vp 2 --schedule bfs", "--pp 2 --schedule zb",
    "--pp 2 --vp 2 --schedule zb", "--pp 2 --vp 2 --tp 2 --schedule zb", "--pp 2 --dp 2 --zero 0",
    "--pp 2 --vp 2 --dp 2 --zero 3", "--pp 2 --dp 2 --zero 2 --schedule zb", "--pp 2 --dp 2 --tp 2 --zero 3",
    "--dp 2 --zero 3 --recompute full", "--tp 2 --recompute selective", "--pp 2 --recompute first_k --recompute-layers 1",
    "--pp 2 --dp 2 --zero 3 --schedule zb",
    "--pp 2 --vp 2 --schedule zbv", "--pp 2 --vp 2 --tp 2 --schedule zbv", "--pp 2 --vp 2 --dp 2 --zero 2 --schedule zbv",
    "--pp 2 --vp 2 --dp 2 --zero 3 --schedule zbv",
    "--pp 2 --vp 2 --schedule dualpipev", "--pp 2 --vp 2 --tp 2 --schedule dualpipev",
    "--pp 2 --vp 2 --dp 2 --zero 2 --schedule dualpipev",
]


def main() -> int:
    ref_loss, ref_norm = (np.array(x) for x in single_process_run(config_from_argv(TINY)))
    print("| flags | ranks | max rel. loss diff | max rel. grad-norm diff | wall |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        for kind in KINDS:
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "paraplan.cli", "run", *TINY, *kind.split(), "-o", str(out)],
                               capture_output=True, text=True)
            wall = time.perf_counter() - t0
            if p.returncode != 0:
                print(f"| `{kind}` | | refused (exit {p.returncode}): {p.stderr.strip().splitlines()[-1]} | | |")
                continue
            r = json.loads(out.read_text())
            m = r["measured"]
            dl = np.max(np.abs(np.array(m["losses"]) / ref_loss - 1))
            dn = np.max(np.abs(np.array(m["grad_norms"]) / ref_norm - 1))
            print(f"| `{kind}` | {r['world_size']} | {dl:.1e} | {dn:.1e} | {wall:.0f} s |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
