"""A very deep pipeline: `paraplan estimate` of a 10,000-layer model at 500 to 5,000 stages.

    python benchmarks/bench_deep_pipeline.py
    python benchmarks/bench_deep_pipeline.py --pp 500,5000 --layers 10000

Each case is one `paraplan estimate` process (one micro-batch per stage: batch = PP; full
recomputation so the plan fits), its wall time and its peak resident memory. A pipeline whose
schedule needs more tasks than the event simulator holds (cost/estimate.py SIM_TASKS_MAX) is
priced with the closed-form bubble and says so; `paraplan trace` refuses it in one line.
Timings belong here, never in unit tests.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_search import environment, environment_line  # noqa: E402

MODEL = """name = "deep-{layers}"
num_layers = {layers}
hidden_size = 1024
ffn_hidden_size = 4096
num_heads = 16
num_kv_heads = 16
vocab_size = 32000
gated_mlp = false
tied_embeddings = false
"""


def run_case(model_path: str, pp: int) -> tuple[float, float, str]:
    """(seconds, peak resident GiB of the child, its last note or step line)."""
    cmd = [sys.executable, "-m", "paraplan", "estimate", "--model", model_path, "--gpus", str(pp), "--pp", str(pp),
           "--tp", "1", "--batch", str(pp), "--seq", "1024", "--mb", "1", "--recompute", "full"]
    env = {**os.environ, "PYTHONPATH": os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    seconds = time.perf_counter() - t0
    peak_kib = max(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, before)
    step = next((line for line in out.splitlines() if line.startswith("step time")), "")
    note = "closed-form bubble" if "pipeline not simulated" in out else "simulated"
    return seconds, peak_kib / 2**20, f"{step.split(maxsplit=2)[-1]} ({note})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", default="100,500,2000,5000")
    ap.add_argument("--layers", type=int, default=10_000)
    args = ap.parse_args()
    print(environment_line(environment()))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "deep.toml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(MODEL.format(layers=args.layers))
        print(f"{'layers':>7}  {'PP':>6}  {'seconds':>8}  {'peak GiB':>9}  step")
        for pp in (int(x) for x in args.pp.split(",")):
            seconds, gib, step = run_case(path, pp)
            # (the children's peak: the largest case so far, as the cases run smallest first)
            print(f"{args.layers:>7,}  {pp:>6,}  {seconds:>8.2f}  {gib:>9.2f}  {step}")


if __name__ == "__main__":
    main()
