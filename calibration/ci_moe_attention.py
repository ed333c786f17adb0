"""The Megatron-LM CI MoE rows of ../shared/validation/memory_dev.csv (mem-105, mem-106) under
each attention kernel: per pipeline stage, the bytes allocated (the peak the rows report, on
the logged last rank) on the plan validate picks, with the row's dropout and without it.

    python calibration/ci_moe_attention.py > calibration/ci_moe_attention.out

docs/accuracy.md quotes it: validate takes the fastest kernel where a row names none
(FlashAttention-class, −58…−60%); Transformer Engine's unfused attention without attention
dropout lands within 4%. The rows do not say which ran; nothing here is fitted."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

from paraplan.cost.allocator import allocated_bytes
from paraplan.cost.stage_memory import FIRST_STAGE, LAST_STAGE, plan_memory
from paraplan.plan.axes import AttentionKernel
from paraplan.units import GIB
from paraplan.validate.training import best_estimate, row_cluster, row_setup

ROWS = Path(__file__).resolve().parents[2] / "shared" / "validation" / "memory_dev.csv"


def main() -> None:
    rows = {r["id"]: r for r in csv.DictReader(ROWS.open())}
    print("row      measured  kernel   dropout  first stage  last stage (logged)  last vs measured")
    for rid in ("mem-105", "mem-106"):
        row = rows[rid]
        setup = row_setup(row, str(ROWS), 0)
        cluster = row_cluster(setup)
        for kernel in (AttentionKernel.FLASH3, AttentionKernel.UNFUSED):
            for dropout in (True, False):
                model = replace(setup.model, dropout=dropout)
                s = replace(setup, model=model, limits=replace(setup.limits, attention=(kernel,)))
                est, _ = best_estimate(row, s, cluster)
                first, last = (float(allocated_bytes(plan_memory(model, cluster, s.workload, est.plan, stage=st)[0]))
                               / GIB for st in (FIRST_STAGE, LAST_STAGE))
                measured = float(row["value"])
                print(f"{rid}  {measured:8.2f}  {kernel.value:7s}  {str(dropout):7s}  {first:11.2f}  {last:19.2f}"
                      f"  {100.0 * (last - measured) / measured:+15.1f}%")


if __name__ == "__main__":
    main()
