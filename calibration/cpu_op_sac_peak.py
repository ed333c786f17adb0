"""Live bytes of one block's forward + backward on a CPU, eager vs compiled, with and without
torchtitan's per-op checkpointing: what the forward keeps and how far the backward rises above
it. Heap blocks of 64 KiB and more are counted by an LD_PRELOAD malloc tracker:

    gcc -O2 -shared -fPIC -o /tmp/libpeak.so calibration/malloc_peak.c -ldl
    LD_PRELOAD=/tmp/libpeak.so python calibration/cpu_op_sac_peak.py > calibration/cpu_op_sac_peak.log

docs/model/memory.md quotes it (the backward's rise under per-op checkpointing)."""
import ctypes, torch
from dataclasses import replace
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from paraplan.specs.catalog import load_model
from paraplan.run.model import Transformer
from paraplan.run.checkpointing import op_sac_context
lib = ctypes.CDLL(None)
lib.peak_current.restype = ctypes.c_longlong; lib.peak_peak.restype = ctypes.c_longlong
torch.manual_seed(0)
h, f, heads, kv = 256, 704, 8, 2
spec = replace(load_model("llama3-8b"), num_layers=1, hidden_size=h, num_heads=heads, num_kv_heads=kv, head_dim=h // heads,
               ffn_hidden_size=f, vocab_size=512)
b, s = 2, 256
model = Transformer(spec, s, first=False, last=False)
block = next(iter(model.layers.values()))
W = sum(p.numel() for p in block.parameters()) * 4
unit = b * s * h * 4  # one fp32 residual-sized tensor

def run(mod, label):
    x = torch.randn(b, s, h, requires_grad=True)
    g = torch.ones(b, s, h)
    for _ in range(2):  # compile and warm
        y = mod(x, model.rope_cos, model.rope_sin); y.backward(g); x.grad = None
        for p in block.parameters(): p.grad = None
    del y
    c0 = lib.peak_current(); lib.peak_reset()
    y = mod(x, model.rope_cos, model.rope_sin)
    c1 = lib.peak_current(); p_fwd = lib.peak_peak(); lib.peak_reset()
    y.backward(g)
    p_bwd = lib.peak_peak()
    print(f"{label:24s} forward keeps {(c1 - c0) / unit - 1:6.2f} (+ output 1)  forward peak above start {(p_fwd - c0) / unit:6.2f}"
          f"  backward peak above forward end {(p_bwd - c1) / unit:6.2f} (weight grads {W / unit:.2f} of it)")
    x.grad = None
    for p in block.parameters(): p.grad = None

print(f"h {h}, f {f}, heads {heads}, kv heads {kv}, tokens {b * s}; units: a residual-sized fp32 tensor (tokens x h)")
run(block, "eager, no checkpoint")
run(torch.compile(block), "compiled, no checkpoint")
sac = checkpoint_wrapper(block, context_fn=op_sac_context, preserve_rng_state=False)
run(sac, "eager, op-SAC")
run(torch.compile(sac), "compiled, op-SAC")
