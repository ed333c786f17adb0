"""The GEMM and attention efficiency curves of GPUs that paraplan has no measurement of, taken
from a measured GPU at the same time at peak.

A curve gives the achieved share of the 16-bit peak against a kernel's FLOPs. What costs a small
GEMM or attention call its share is time: the launch, the prologue and epilogue, the pipeline's
fill and drain, each a few microseconds whatever the GPU (efficiency ~ F / (F + R·t0) at peak
rate R). A GPU k times faster at peak spends the same t0 on k times the FLOPs, so it reaches a
share at k times the FLOPs: its curve is the measured GPU's with the FLOPs axis × k, k its BF16
peak over the measured GPU's. The plateau (large calls) is unchanged. An ASSUMPTION for each
borrower (wave quantization scales with SM count and tile size, not the peak), kept because it
is the physics of the part of the curve it moves; `paraplan calibrate` on the machine replaces it.

    python calibration/borrowed_curves.py          # prints each borrower's curves
    python calibration/borrowed_curves.py --write  # writes them into the GPU TOMLs

Measured against the published training runs (docs/accuracy.md, 2026-11-30): with the H100's
curves shifted for the Blackwell GPUs (× 2.28 B200/B300, × 2.53 GB200/GB300) and their knobs
refitted, B200/GB200 10.6% → 10.2% in sample, 14.0% → 13.3% out of source.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

GPUS = Path(__file__).resolve().parents[1] / "src" / "paraplan" / "specs" / "catalog" / "gpus"
# borrower -> the measured GPU whose curves it takes
BORROWED = {"b200": "h100-sxm-80gb", "gb200": "h100-sxm-80gb", "b300": "h100-sxm-80gb", "gb300": "h100-sxm-80gb",
            "mi300x": "h100-sxm-80gb", "l40s": "a100-sxm-80gb", "tpu-v4": "a100-sxm-80gb"}


def _read(name: str) -> dict:
    return tomllib.loads((GPUS / f"{name}.toml").read_text())


def _flops(values) -> str:
    return "[" + ", ".join(f"{v:.3g}" for v in values) + "]"


def shifted(borrower: str) -> dict[str, list[float]]:
    """{table: flops axis} of the borrower: the source's axes × the BF16 peak ratio."""
    src, dst = _read(BORROWED[borrower]), _read(borrower)
    k = dst["peak_tflops"]["bf16"] / src["peak_tflops"]["bf16"]
    tables = {"gemm_efficiency": src["gemm_efficiency"]["flops"]}
    for kernel in dst.get("attention_efficiency", {}):
        tables[f"attention_efficiency.{kernel}"] = src["attention_efficiency"][kernel]["flops"]
    return {table: [f * k for f in axis] for table, axis in tables.items()}


def write(borrower: str) -> None:
    path = GPUS / f"{borrower}.toml"
    text = path.read_text()
    for table, axis in shifted(borrower).items():
        pattern = re.compile(rf"(^\[{re.escape(table)}\]\n(?:#.*\n)*)flops = \[[^\]]*\]", re.M)
        text, n = pattern.subn(lambda m: m.group(1) + "flops = " + _flops(axis), text)
        if n != 1:
            raise SystemExit(f"{path}: no [{table}] flops line")
    path.write_text(text)


def main() -> None:
    for borrower in BORROWED:
        k = _read(borrower)["peak_tflops"]["bf16"] / _read(BORROWED[borrower])["peak_tflops"]["bf16"]
        print(f"{borrower}: {BORROWED[borrower]}'s curves, FLOPs × {k:.3f}")
        for table, axis in shifted(borrower).items():
            print(f"  [{table}] flops = {_flops(axis)}")
        if "--write" in sys.argv[1:]:
            write(borrower)


if __name__ == "__main__":
    main()
