"""Where a `paraplan run` step's GPU time goes, kernel by kernel (torch.profiler), for a few
of the one-GPU runs in calibration/gpu_check.sh; plus the GEMM shapes that a vocabulary not
a multiple of 8 makes. Run through the device tool; output in calibration/h100_2026-11-22.

Usage: python calibration/gpu_profile.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import replace

import torch
from torch.profiler import ProfilerActivity, profile

from paraplan.plan.axes import Recompute
from paraplan.run.checkpointing import apply_checkpointing
from paraplan.run.config import scale_model
from paraplan.run.model import Transformer, loss_fn
from paraplan.specs.catalog import load_model

dev = torch.device("cuda")


def gemm_ms(m, n, k, reps=20):
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps * 1e3


def step_profile(name, spec, seq, mb, micro_batches, recompute):
    torch.cuda.empty_cache()
    with torch.device(dev):
        model = Transformer(spec, seq)
    apply_checkpointing(model, recompute)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    x = torch.randint(0, spec.vocab_size, (mb, seq), device=dev)

    def step():
        for _ in range(micro_batches):
            with torch.autocast("cuda", torch.bfloat16):
                loss = loss_fn(model(x), x) / micro_batches
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type.name == "CUDA":
            per[e.name][0] += e.device_time / 1e3
            per[e.name][1] += 1
    top = sorted(per.items(), key=lambda kv: -kv[1][0])
    total = sum(v[0] for v in per.values())
    rec = {"name": name, "wall_ms": wall * 1e3, "kernel_ms": total,
           "top": [(k[:120], round(v[0], 3), v[1]) for k, v in top[:40]]}
    print(name, f"wall {wall * 1e3:.1f} ms, kernels {total:.1f} ms", flush=True)
    for k, (ms, n) in top[:25]:
        print(f"  {ms:9.2f} ms {n:5d}  {k[:150]}", flush=True)
    return rec


def main():
    out = {"gemm_ms": {}, "steps": []}
    for v in (50257, 50264, 50304, 51200):
        for label, (m, n, k) in (("fwd", (4096, v, 4096)), ("dgrad", (4096, 4096, v)), ("wgrad", (v, 4096, 4096))):
            out["gemm_ms"][f"{label} V={v}"] = ms = gemm_ms(m, n, k)
            print(f"gemm {label} V={v}: {ms:.3f} ms, {2 * m * n * k / ms / 1e9:.0f} TFLOP/s", flush=True)
    l8 = load_model("llama3-8b")
    gpt = scale_model(load_model("gpt3-175b"), layers=4, hidden=4096, heads=32)
    out["steps"].append(step_profile("gpt3-scaled s2048 mb2", gpt, 2048, 2, 4, Recompute.NONE))
    out["steps"].append(step_profile("gpt3-scaled V51200", replace(gpt, vocab_size=51200), 2048, 2, 4, Recompute.NONE))
    out["steps"].append(step_profile("llama3-8b-4l s16384 full", replace(l8, num_layers=4), 16384, 1, 2, Recompute.FULL))
    out["steps"].append(step_profile("llama3-8b-4l s2048 mb2", replace(l8, num_layers=4), 2048, 2, 4, Recompute.NONE))
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
