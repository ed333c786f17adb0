"""Price the pieces calibration/gpu_moe.py measured with paraplan's MoE cost model (cost/moe.py's
formulas at λ = 1) and print measured vs predicted, per shape.

Usage: python calibration/compare_moe.py calibration/h100_2026-11-23/moe.json [hardware ...]
(hardware: cluster presets or `paraplan calibrate` profiles; default dgx-h100 and the
profile calibrated beside these measurements).
"""
import json
import sys

from paraplan.cost.roofline import gemm_time_s, up_projection_time_s
from paraplan.specs.catalog import load_cluster
from paraplan.specs.workload import Precision


def predicted(gpu, r, prec):
    """Forward and backward expert GEMM time of one rank, as cost/moe.py prices them: each of
    the `local` experts one fused up GEMM (m x 2f x h) and one down GEMM (m x h x f); the
    backward twice the forward's GEMMs (dgrad + wgrad)."""
    m, h, f, local = r["m"], r["h"], r["f"], r["local"]
    one = up_projection_time_s(gpu, m, f, h, prec, 2, True) + gemm_time_s(gpu, m, h, f, prec)
    fwd = local * float(one)
    return fwd, 2.0 * fwd


def main(argv):
    data = json.load(open(argv[0]))
    hardware = argv[1:] or ["dgx-h100", "calibration/h100_2026-11-23/calibrate/h100.toml"]
    print(f"measured on {data['device']}, torch {data['torch']}")
    for hw in hardware:
        gpu = load_cluster(hw).gpu
        print(f"\npredicted on {hw}")
        print(f"{'shape':36s} {'prec':4s} {'meas fwd':>9s} {'pred fwd':>9s} {'err':>7s} "
              f"{'meas bwd':>9s} {'pred bwd':>9s} {'err':>7s}  TFLOP/s meas fwd/bwd")
        errs = []
        for r in data["rows"]:
            flops_fwd = r["local"] * 2.0 * r["m"] * r["h"] * 3 * r["f"]
            for key, prec in (("bf16", Precision.BF16), ("fp8", Precision.FP8)):
                if f"{key}_fwd_s" not in r or prec not in gpu.peak_flops_per_s:
                    continue  # not measured, or a profile with no FP8 rate (calibrate measures 16 bits)
                pf, pb = predicted(gpu, r, prec)
                mf, mb = r[f"{key}_fwd_s"], r[f"{key}_bwd_s"]
                ef, eb = pf / mf - 1.0, pb / mb - 1.0
                errs += [ef, eb]
                print(f"{r['label']:36s} {key:4s} {mf * 1e3:8.3f}m {pf * 1e3:8.3f}m {ef:+7.1%} "
                      f"{mb * 1e3:8.3f}m {pb * 1e3:8.3f}m {eb:+7.1%}  {flops_fwd / mf / 1e12:5.0f} / "
                      f"{2 * flops_fwd / mb / 1e12:5.0f}")
        print(f"mean |error| {sum(abs(e) for e in errs) / len(errs):.1%}, "
              f"mean signed {sum(errs) / len(errs):+.1%} over {len(errs)}")


if __name__ == "__main__":
    main(sys.argv[1:])
