"""How fast `paraplan serve` is, with decode-only iterations timed in runs (the default) and
one by one (the reference the runs must equal: tests/test_serving_speed.py).

    python benchmarks/bench_serve.py          # table
    python benchmarks/bench_serve.py --json

Each case is a whole `paraplan serve --json` (every deployment, each one's rate search and
the best one's simulation at the target rate); "same output" says whether both ways printed
the same JSON. Timings belong here, never in unit tests.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from bench_search import environment, environment_line  # noqa: E402
from paraplan.cli import main  # noqa: E402
from paraplan.inference import batching, planner  # noqa: E402

CASES = (
    ("CLI default (llama3-70b, 1024 + 256 tokens, 8 req/s)", []),
    ("long output (1024 + 4096 tokens)", ["--output", "4096"]),
    ("long prompt and output (8192 + 1024 tokens)", ["--prompt", "8192", "--output", "1024"]),
    ("llama3-8b on up to 8 GPUs, 40 req/s", ["--model", "llama3-8b", "--rate", "40"]),
)


def _serve(argv: list[str]) -> tuple[float, str]:
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(["serve", *argv, "--json"])
    if code != 0:
        raise SystemExit(f"paraplan serve {' '.join(argv)} exited with {code}")
    return time.perf_counter() - t0, out.getvalue()


def run_case(label: str, argv: list[str]) -> dict:
    runs_s, runs_out = _serve(argv)
    one_by_one = functools.partial(batching.simulate, decode_runs=False)
    original = planner.simulate
    planner.simulate = one_by_one
    try:
        each_s, each_out = _serve(argv)
    finally:
        planner.simulate = original
    return {"case": label, "flags": " ".join(argv), "runs_s": runs_s, "one_by_one_s": each_s,
            "speedup": each_s / runs_s, "same_output": runs_out == each_out}


def main_bench() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [run_case(label, argv) for label, argv in CASES]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(environment_line(environment()))
    print(f"{'case':<54} {'runs s':>7} {'one by one s':>13} {'speedup':>8}  same output")
    print("-" * 98)
    for r in rows:
        print(f"{r['case']:<54} {r['runs_s']:>7.2f} {r['one_by_one_s']:>13.2f} {r['speedup']:>7.1f}x  "
              f"{'yes' if r['same_output'] else 'NO'}")


if __name__ == "__main__":
    main_bench()
