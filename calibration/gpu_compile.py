"""Eager vs torch.compile (inductor) blocks of paraplan run's model on one GPU.

torchtitan compiles each TransformerBlock (--compile.enable) and runs them with bf16
parameters (FSDP2's param_dtype): this times a stack of such blocks, forward + backward, and
measures what they keep for the backward, eager and compiled, at Llama 3 8B's block shapes
(and a narrower one). No optimizer, no LM head: the blocks alone.
Per configuration: step time (median of 5 runs of 5 steps after warm-up), the bytes the
forward leaves allocated (what the backward needs, without the input), and the same per
token per hidden unit per layer, in elements of 2 bytes (as docs/model.md counts them).
Writes $OUT/compile.json. Usage (device tool): python3 calibration/gpu_compile.py
"""
import os
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from paraplan.run.model import Transformer  # noqa: E402
from paraplan.specs.catalog import load_model  # noqa: E402
from gpu_common import add_row, results, timed  # noqa: E402

dev = "cuda"
CASES = [  # (label, hidden, heads, kv_heads, ffn, layers, micro-batch, seq)
    ("llama3-8b block, s2048 b2", 4096, 32, 8, 14336, 4, 2, 2048),
    ("llama3-8b block, s8192 b1", 4096, 32, 8, 14336, 4, 1, 8192),
    ("2048-wide block, s4096 b2", 2048, 16, 8, 8192, 4, 2, 4096),
]


def measure(label, h, heads, kv, ffn, layers, b, s, compiled):
    spec = replace(load_model("llama3-8b"), num_layers=layers, hidden_size=h, num_heads=heads, num_kv_heads=kv,
                   head_dim=h // heads, ffn_hidden_size=ffn, vocab_size=512)
    torch.manual_seed(0)
    model = Transformer(spec, s, first=False, last=False).to(dev, torch.bfloat16)
    blocks = list(model.layers.values())
    fns = [torch.compile(blk) for blk in blocks] if compiled else blocks
    cos, sin = model.rope_cos, model.rope_sin  # bf16 with the module, as FSDP2's param_dtype casts
    x = torch.randn(b, s, h, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def fwd():
        y = x
        for fn in fns:
            y = fn(y, cos, sin)
        return y

    t0 = time.time()
    for _ in range(3):
        fwd().float().sum().backward()
    warm_s = time.time() - t0
    torch.cuda.synchronize()
    # what the forward keeps for the backward
    x.grad = None
    for p in model.parameters():
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    y = fwd()
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - base - y.untyped_storage().nbytes()
    torch.cuda.reset_peak_memory_stats()
    y.float().sum().backward()
    torch.cuda.synchronize()
    peak_bwd = torch.cuda.max_memory_allocated() - base
    del y
    step_s = timed(lambda: fwd().float().sum().backward(), reps=5, warmup=0)
    with torch.no_grad():
        fwd_s = timed(fwd, reps=5, warmup=0)
    r = {"label": label, "compiled": compiled, "hidden": h, "heads": heads, "kv_heads": kv, "ffn": ffn,
         "layers": layers, "micro_batch": b, "seq": s, "step_s": step_s,
         "fwd_nograd_s": fwd_s, "warmup_wall_s": warm_s,
         "kept_bytes": kept, "peak_bwd_bytes": peak_bwd,
         "kept_elements_per_token_per_h_per_layer": kept / 2 / (b * s) / h / layers}
    return r


def main():
    res = results("compile.json")
    for case in CASES:
        for compiled in (False, True):
            try:
                r = measure(*case, compiled)
            except Exception as e:  # noqa: BLE001 - record and go on
                r = {"label": case[0], "compiled": compiled, "error": repr(e)[:400]}
            add_row(res, r)


if __name__ == "__main__":
    main()
