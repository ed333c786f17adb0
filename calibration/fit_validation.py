"""Fit the few physical GPU parameters that no microbenchmark here measures, against the
published training runs, by coordinate descent on the mean |error|:

    python calibration/fit_validation.py ../shared/validation/training_dev.csv

Parameters (one value per GPU type, never per row): sustained clock ratio under training
load, the attention-kernel efficiency plateau per kernel (FA2, FA3/cuDNN), the FP8/BF16 GEMM efficiency ratio, and the compute slowdown while a collective overlaps.
Prints each trial; the chosen values are written into the GPU TOMLs by hand, with a
comment pointing here.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import paraplan.validate.training as vt
from paraplan.specs.curves import EfficiencyCurve

BASE = {"h100_clock": 0.75, "h100_fa2": 0.25, "h100_fa3": 0.45, "a100_fa2": 0.3, "fp8_ratio": 1.0,
        "overlap_slowdown": 0.1}
_orig = vt.load_cluster


def run(params: dict, path: str) -> float:
    def patched(name, num_gpus=None):
        c = _orig(name, num_gpus=num_gpus)
        g = c.gpu
        is_h = "h100" in g.name or "h200" in g.name
        curves = {}
        for kernel, curve in g.attention_efficiency.items():
            plateau = params[("h100_" if is_h else "a100_") + ("fa3" if kernel == "flash3" else "fa2")]
            ys = tuple(min(y, plateau) if i < len(curve.y) - 1 else plateau for i, y in enumerate(curve.y))
            curves[kernel] = EfficiencyCurve(x=curve.x, y=ys)
        g = replace(g, attention_efficiency=curves,
                    fp8_gemm_efficiency_ratio=params["fp8_ratio"], overlap_slowdown=params["overlap_slowdown"],
                    sustained_compute_ratio=params["h100_clock"] if is_h else g.sustained_compute_ratio)
        return replace(c, gpu=g)
    vt.load_cluster = patched
    try:
        res = vt.validate_file(path)
    finally:
        vt.load_cluster = _orig
    s = res["summary"]
    print(params, f"mean {s['mean_abs_pct_error']:.2f} p90 {s['p90_abs_pct_error']:.2f} max {s['max_abs_pct_error']:.1f}",
          flush=True)
    return s["mean_abs_pct_error"]


def main(path: str) -> None:
    grid = {"overlap_slowdown": [0.0, 0.1, 0.2, 0.3, 0.5], "h100_clock": [0.7, 0.75, 0.8, 0.85], "h100_fa2": [0.2, 0.25, 0.3, 0.35, 0.4],
            "h100_fa3": [0.45, 0.5, 0.55, 0.6, 0.65, 0.7], "a100_fa2": [0.25, 0.3, 0.35, 0.4, 0.5],
            "fp8_ratio": [0.85, 0.9, 0.95, 1.0]}
    best = dict(BASE)
    best_err = run(best, path)
    for _ in range(1):
        for key, values in grid.items():
            for v in values:
                trial = dict(best, **{key: v})
                err = run(trial, path)
                if err < best_err:
                    best, best_err = trial, err
    print("BEST", best, best_err)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "../shared/validation/training_dev.csv")
