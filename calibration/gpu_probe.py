"""What `paraplan run`'s model does on one GPU, piece by piece (run through the device tool;
output in calibration/gpu_check_*.txt):

1. which SDPA backend torch picks for the run's attention, and the forward / backward time
   of each fused backend (flash, cuDNN, memory-efficient) at the run's head shape;
2. the memory of the run's training step by phase (forward, backward, optimizer step),
   for 1 and 3 layers and two vocabulary sizes, so that per-layer activations, the logits
   and the optimizer step's transient separate; and the bytes each layer saves for its
   backward by dtype (saved-tensor hooks, unique storages).

Usage: python calibration/gpu_probe.py  (needs torch and a CUDA GPU; paraplan on the path)
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from paraplan.plan.axes import Recompute
from paraplan.run.checkpointing import apply_checkpointing
from paraplan.run.model import Transformer, loss_fn
from paraplan.specs.catalog import load_model

GIB = 2**30
dev = torch.device("cuda")


def timed(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def attention():
    out = {}
    for s in (1024, 2048, 4096, 8192, 16384):
        b = max(1, 8192 // s)
        q, k, v = (torch.randn(b, 32, s, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        choice = torch._fused_sdp_choice(q, k, v, is_causal=True)
        flops_fwd = 4 * b * 32 * s * s * 128 / 2  # causal: half the score matrix
        row = {"batch": b, "seq": s, "default_backend": int(choice)}
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    g = torch.randn_like(o)
                    tf = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                    tfb = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g))
                row[name] = {"fwd_s": tf, "bwd_s": tfb - tf, "fwd_tflops": flops_fwd / tf / 1e12,
                             "bwd_tflops": 2.5 * flops_fwd / (tfb - tf) / 1e12}
            except Exception as e:  # a backend that refuses the shape
                row[name] = str(e)[:100]
        out[s] = row
        print("attention", s, json.dumps(row), flush=True)
    return out


def saved_by_layer(model, x):
    """Bytes each block saves for backward (unique storages), by dtype."""
    seen, per = set(), {}

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.dtype)
        if t.device.type == "cuda" and key not in seen and t.untyped_storage().data_ptr() != 0:
            seen.add(key)
            per[str(t.dtype)] = per.get(str(t.dtype), 0) + t.untyped_storage().nbytes()
        return t

    block = next(iter(model.layers.values()))
    h = model.tok_embeddings(x)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cuda", torch.bfloat16):
        h2 = h.detach().requires_grad_()
        seen.add((h2.untyped_storage().data_ptr(), h2.dtype))  # the block's input is counted as the layer before's output
        block(h2, model.rope_cos, model.rope_sin)
    return per


def memory(layers, vocab, b, s, recompute):
    spec = replace(load_model("llama3-8b"), num_layers=layers, vocab_size=vocab)
    torch.cuda.empty_cache()
    with torch.device(dev):
        model = Transformer(spec, s)
    apply_checkpointing(model, recompute)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    x = torch.randint(0, vocab, (b, s), device=dev)
    rec = {"layers": layers, "vocab": vocab, "batch": b, "seq": s, "recompute": str(recompute),
           "params": sum(p.numel() for p in model.parameters())}
    for it in range(2):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        for mb in range(2):
            with torch.autocast("cuda", torch.bfloat16):
                logits = model(x)
                if mb == 0 and it == 1:
                    rec["after_forward_GiB"] = (torch.cuda.memory_allocated() - base) / GIB
                    rec["peak_forward_GiB"] = (torch.cuda.max_memory_allocated() - base) / GIB
                loss = loss_fn(logits, x)
            loss.backward()
            del logits, loss
        torch.cuda.synchronize()
        peak_fb = torch.cuda.max_memory_allocated()
        before_opt = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        opt.step()
        torch.cuda.synchronize()
        peak_opt = torch.cuda.max_memory_allocated()
        opt.zero_grad(set_to_none=True)
        if it == 1:
            rec.update(base_GiB=base / GIB, peak_fwd_bwd_GiB=peak_fb / GIB, before_opt_GiB=before_opt / GIB,
                       peak_opt_GiB=peak_opt / GIB)
    if recompute is Recompute.NONE and layers == 1:
        rec["saved_per_layer_bytes"] = saved_by_layer(model, x)
    print("memory", json.dumps(rec), flush=True)
    del model, opt
    return rec


def main():
    print(torch.__version__, torch.cuda.get_device_name(0), "flash", torch.backends.cuda.flash_sdp_enabled(),
          "cudnn", torch.backends.cuda.cudnn_sdp_enabled(), "efficient", torch.backends.cuda.mem_efficient_sdp_enabled(),
          flush=True)
    res = {"attention": attention(), "memory": []}
    for layers, vocab, b, s, rc in ((1, 128256, 2, 2048, Recompute.NONE), (3, 128256, 2, 2048, Recompute.NONE),
                                    (1, 8192, 2, 2048, Recompute.NONE), (3, 8192, 2, 2048, Recompute.NONE),
                                    (1, 128256, 1, 8192, Recompute.NONE), (3, 128256, 1, 8192, Recompute.NONE),
                                    (1, 128256, 2, 2048, Recompute.FULL), (3, 128256, 2, 2048, Recompute.FULL),
                                    (1, 128256, 2, 2048, Recompute.SELECTIVE), (3, 128256, 2, 2048, Recompute.SELECTIVE)):
        res["memory"].append(memory(layers, vocab, b, s, rc))
    json.dump(res, open(sys.argv[1] if len(sys.argv) > 1 else "gpu_probe.json", "w"), indent=1)


if __name__ == "__main__":
    main()
