"""Derive GEMM and NVLink efficiency curves from vidur's measured operator and NCCL times.

    python calibration/vidur_curves.py ../shared/validation/vidur_profiling

GEMM: for every profiled linear (QKV, out-proj, MLP up/down) at every token count and TP
degree, efficiency = 2mnk / ((median time − launch overhead) × dense BF16 peak); the curve
is the median efficiency per half-decade of FLOPs (bins with at least 5 samples). NVLink:
all-reduce bus bandwidth 2(n−1)/n·B/t over the tier's unidirectional bandwidth, median per
decade of bytes, for single-node groups. The printed arrays are what the GPU and cluster
TOMLs carry. The measurement reading lives in paraplan.calibrate.vidur (also behind
`paraplan calibrate --vidur`); this script prints the arrays the presets were made from.
"""

from __future__ import annotations

import sys
from pathlib import Path

from paraplan.calibrate.vidur import binned, gemm_points, link_points
from paraplan.specs.catalog import load_cluster, load_gpu
from paraplan.specs.workload import Precision

PRESETS = {"h100": ("h100-sxm-80gb", "dgx-h100"), "a100": ("a100-sxm-80gb", "dgx-a100-80gb")}


def main(root: str) -> None:
    root_p = Path(root)
    for gpu, fn in (("h100", "compute_h100_meta-llama_Llama-2-70b-hf_mlp.csv"),
                    ("h100", "compute_h100_meta-llama_Llama-2-7b-hf_mlp.csv"),
                    ("a100", "compute_a100_meta-llama_Llama-2-70b-hf_mlp.csv")):
        peak = load_gpu(PRESETS[gpu][0]).peak(Precision.BF16)
        pts = binned(gemm_points(root_p / fn, peak), per_decade=2, min_samples=5)
        print(f"# {gpu} GEMM from {fn}")
        print("flops = [" + ", ".join(f"{x:.3g}" for x, _ in pts) + "]")
        print("efficiency = [" + ", ".join(f"{max(y, 0.01):.3f}" for _, y in pts) + "]")
    for gpu in ("h100", "a100"):
        bw = load_cluster(PRESETS[gpu][1]).nvlink.bw_unidir_bytes_per_s
        pts = binned(link_points(root_p / f"network_{gpu}_dgx_all_reduce.csv", "all_reduce", bw),
                     per_decade=1, min_samples=1)
        print(f"# {gpu} NVLink all-reduce bus-bandwidth efficiency")
        print("efficiency_bytes = [" + ", ".join(f"{x:.3g}" for x, _ in pts) + "]")
        print("efficiency = [" + ", ".join(f"{min(max(y, 0.005), 1.0):.3f}" for _, y in pts) + "]")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/validation/vidur_profiling")
