"""Derive GEMM and NVLink efficiency curves from vidur's measured operator and NCCL times.

    python calibration/vidur_curves.py ../shared/validation/vidur_profiling

GEMM: for every profiled linear (QKV, out-proj, MLP up/down) at every token count and TP
degree, efficiency = 2mnk / ((median time − launch overhead) × dense BF16 peak); the curve
is the median efficiency per half-decade of FLOPs. NVLink: all-reduce bus bandwidth
2(n−1)/n·B/t over the tier's unidirectional bandwidth, median per decade of bytes, for
single-node groups. The printed arrays are what the GPU and cluster TOMLs carry.
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

PEAK_BF16 = {"h100": 989e12, "a100": 312e12}     # dense, NVIDIA datasheets
NVLINK_UNIDIR = {"h100": 450e9, "a100": 300e9}   # per GPU, NVLink4 / NVLink3
LAUNCH_S = 4e-6


def gemm_curve(path: Path, gpu: str):
    bins = defaultdict(list)
    for r in csv.DictReader(path.open()):
        T, t = int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])
        h, f, a, kv = int(r["n_embd"]), int(r["n_expanded_embd"]), int(r["n_head"]), int(r["n_kv_head"])
        d, g = h // a, r["use_gated_mlp"] == "True"
        shapes = {"attn_pre_proj": (T, (a + 2 * kv) * d // t, h), "attn_post_proj": (T, h, a * d // t),
                  "mlp_up_proj": (T, f * (2 if g else 1) // t, h), "mlp_down_proj": (T, h, f // t)}
        for op, (m, n, k) in shapes.items():
            sec = float(r[f"time_stats.{op}.median"]) * 1e-3 - LAUNCH_S
            flops = 2.0 * m * n * k
            if sec > 0:
                bins[round(2 * math.log10(flops)) / 2].append(min(flops / sec / PEAK_BF16[gpu], 1.0))
    return [(10 ** k, statistics.median(v)) for k, v in sorted(bins.items()) if len(v) >= 5]


def nvlink_curve(path: Path, gpu: str):
    bins = defaultdict(list)
    for r in csv.DictReader(path.open()):
        n, dpn = int(r["num_workers"]), int(r["devices_per_node"])
        if n < 2 or dpn != n:
            continue
        B = int(r["size"])
        sec = float(r["time_stats.all_reduce.median"]) * 1e-3
        bins[round(math.log10(B))].append(2 * (n - 1) / n * B / sec / NVLINK_UNIDIR[gpu])
    return [(10 ** k, statistics.median(v)) for k, v in sorted(bins.items())]


def main(root: str) -> None:
    root_p = Path(root)
    for gpu, fn in (("h100", "compute_h100_meta-llama_Llama-2-70b-hf_mlp.csv"),
                    ("h100", "compute_h100_meta-llama_Llama-2-7b-hf_mlp.csv"),
                    ("a100", "compute_a100_meta-llama_Llama-2-70b-hf_mlp.csv")):
        pts = gemm_curve(root_p / fn, gpu)
        print(f"# {gpu} GEMM from {fn}")
        print("flops = [" + ", ".join(f"{x:.3g}" for x, _ in pts) + "]")
        print("efficiency = [" + ", ".join(f"{max(y, 0.01):.3f}" for _, y in pts) + "]")
    for gpu in ("h100", "a100"):
        pts = nvlink_curve(root_p / f"network_{gpu}_dgx_all_reduce.csv", gpu)
        print(f"# {gpu} NVLink all-reduce bus-bandwidth efficiency")
        print("efficiency_bytes = [" + ", ".join(f"{x:.3g}" for x, _ in pts) + "]")
        print("efficiency = [" + ", ".join(f"{min(max(y, 0.005), 1.0):.3f}" for _, y in pts) + "]")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/validation/vidur_profiling")
