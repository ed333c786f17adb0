"""The zero-bubble split of a backward, timed on one GPU.

The zero-bubble schedules (zb, zbv, dualpipev) run a stage's backward as two passes: B
(gradients of the stage input) and, later, W (gradients of the weights). torch.distributed.
pipelining does it with `stage_backward_input` (autograd.grad for the inputs, keeping the
graph and saving each weight-gradient node's incoming gradient) and `stage_backward_weight`
(autograd.grad from those saved gradients to the weights). paraplan prices W as the stage's
weight-gradient GEMMs and B as the rest of the backward (cost/evaluate.py `weight_grad_s`).
This times, for a stack of paraplan run's blocks (a middle pipeline stage: no embedding, no
head), the forward F and the whole backward, then F, B and W as torch's functions run them,
issued back to back from an idle GPU and marked by CUDA events as the GPU reaches each pass
(so host time that leaves the GPU idle counts, as it does in a pipeline). Two parameter setups: fp32 parameters under bf16 autocast (paraplan run
on one GPU) and bf16 parameters (FSDP2's param_dtype, as torchtitan trains).

Writes $OUT/zb_split.json. Usage (device tool): python3 calibration/gpu_zb_split.py
"""
import os
import statistics
import sys
from dataclasses import replace

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from paraplan.run.model import Transformer  # noqa: E402
from paraplan.specs.catalog import load_model  # noqa: E402
from gpu_common import add_row, results  # noqa: E402

dev = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [  # (label, hidden, heads, kv_heads, ffn, layers, micro-batch, seq)
    ("llama3-8b block, s2048 b2", 4096, 32, 8, 14336, 4, 2, 2048),
    ("llama3-8b block, s8192 b1", 4096, 32, 8, 14336, 4, 1, 8192),
    ("2048-wide block, s4096 b2", 2048, 16, 8, 8192, 4, 2, 4096),
    ("1024-wide block, s1024 b4", 1024, 8, 8, 4096, 8, 4, 1024),
    ("2048-wide block, s2048 b1, 12 layers", 2048, 16, 8, 8192, 12, 1, 2048),
    ("negligible (hidden 64), 16 layers", 64, 2, 1, 256, 16, 1, 16),  # beyond calibrate's 1-8 layers
]
if dev == "cpu":  # a smoke run of the script itself, on tiny shapes
    CASES = [("tiny", 64, 4, 2, 128, 2, 1, 32)]
REPS = 7


def marks(n):
    """n CUDA events (GPU timestamps), or a list the CPU fills with wall times."""
    return [torch.cuda.Event(enable_timing=True) for _ in range(n)] if dev == "cuda" else []


def mark(ev, i):
    if dev == "cuda":
        ev[i].record()
    else:
        import time
        ev.append(time.perf_counter())


def spans(ev) -> list[float]:
    """Seconds between consecutive marks, after the GPU has reached the last."""
    if dev == "cuda":
        torch.cuda.synchronize()
        return [a.elapsed_time(b) / 1e3 for a, b in zip(ev, ev[1:])]
    return [b - a for a, b in zip(ev, ev[1:])]


def measure(label, h, heads, kv, ffn, layers, b, s, bf16_params):
    spec = replace(load_model("llama3-8b"), num_layers=layers, hidden_size=h, num_heads=heads, num_kv_heads=kv,
                   head_dim=h // heads, ffn_hidden_size=ffn, vocab_size=512)
    torch.manual_seed(0)
    model = Transformer(spec, s, first=False, last=False).to(dev)
    if bf16_params:
        model = model.to(torch.bfloat16)
    params = list(model.parameters())
    autocast = torch.autocast(dev, dtype=torch.bfloat16, enabled=not bf16_params)
    # the residual stream a stage receives: fp32 with fp32 parameters under autocast (the
    # embedding's output and every residual add stay fp32), bf16 with bf16 parameters
    act = torch.bfloat16 if bf16_params else torch.float32
    x0 = torch.randn(b, s, h, device=dev, dtype=act)
    dy = torch.randn(b, s, h, device=dev, dtype=act) * 1e-3

    def forward():
        x = x0.detach().requires_grad_(True)
        with autocast:
            y = model(x)
        return x, y

    # each pass marked as the GPU reaches it, the passes issued back to back (one
    # synchronization per round, at its end): an eager host running ahead of its GPU, as in
    # a pipeline stage's F, B, W (the first micro-batch: the GPU idle before the F)
    f_s, full_s, b_s, w_s = [], [], [], []
    for i in range(REPS + 2):
        ev = marks(3)
        mark(ev, 0)
        x, y = forward()
        mark(ev, 1)
        torch.autograd.backward(y, dy)
        mark(ev, 2)
        f, full = spans(ev)
        for p in params:
            p.grad = None
        ev = marks(4)
        mark(ev, 0)
        x, y = forward()
        mark(ev, 1)
        _, groups = stage_backward_input([y], [dy], [x], iter(params))
        mark(ev, 2)
        stage_backward_weight(iter(params), groups)
        mark(ev, 3)
        _, bb, ww = spans(ev)
        for p in params:
            p.grad = None
        if i >= 2:  # two warm-ups
            f_s.append(f), full_s.append(full), b_s.append(bb), w_s.append(ww)
    med = statistics.median
    return {"label": label, "bf16_params": bf16_params, "hidden": h, "heads": heads, "kv_heads": kv, "ffn": ffn,
            "layers": layers, "micro_batch": b, "seq": s, "forward_s": med(f_s), "backward_s": med(full_s),
            "backward_input_s": med(b_s), "backward_weight_s": med(w_s),
            "split_over_full": (med(b_s) + med(w_s)) / med(full_s)}


def main():
    res = results("zb_split.json") if dev == "cuda" else {"file": "/tmp/zb_split.json", "rows": []}
    for case in CASES:
        for bf16_params in (False, True):
            row = measure(*case, bf16_params)
            if dev == "cuda":
                add_row(res, row)
            else:
                print(row)


if __name__ == "__main__":
    main()
