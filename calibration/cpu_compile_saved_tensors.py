"""Saved tensors of one block of paraplan run's model, eager vs torch.compile (inductor), on a CPU.
Usage: python calibration/cpu_compile_saved_tensors.py (output in calibration/cpu_compile_saved_tensors.log)."""
import torch, time
from dataclasses import replace
from paraplan.specs.catalog import load_model
from paraplan.run.model import Transformer
torch.manual_seed(0)
spec = replace(load_model("llama3-8b"), num_layers=1, hidden_size=256, num_heads=8, num_kv_heads=2, head_dim=32,
               ffn_hidden_size=704, vocab_size=512)
b, s, h = 2, 96, 256
model = Transformer(spec, s, first=False, last=False)
block = next(iter(model.layers.values()))
skip = {p.untyped_storage().data_ptr() for p in list(model.parameters()) + list(model.buffers())}
def saved_eager():
    x = torch.randn(b, s, h, requires_grad=True)
    skip2 = skip | {x.untyped_storage().data_ptr()}
    seen, items = set(), []
    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in skip2 and ptr not in seen:
            seen.add(ptr); items.append((tuple(t.shape), t.untyped_storage().nbytes()))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, model.rope_cos, model.rope_sin)
    return items
def saved_compiled():
    cb = torch.compile(block)
    x = torch.randn(b, s, h, requires_grad=True)
    y = cb(x, model.rope_cos, model.rope_sin)
    fn = y.grad_fn
    items=[]; seen=set(); skip2 = skip | {x.untyped_storage().data_ptr()}
    # walk graph
    stack=[fn]; visited=set()
    while stack:
        f=stack.pop()
        if f is None or id(f) in visited: continue
        visited.add(id(f))
        try:
            ts = f.saved_tensors
        except Exception as e:
            ts = ()
        for t in ts:
            if t is None: continue
            ptr=t.untyped_storage().data_ptr()
            if ptr not in skip2 and ptr not in seen:
                seen.add(ptr); items.append((type(f).__name__, tuple(t.shape), t.dtype, t.untyped_storage().nbytes()))
        for nf,_ in f.next_functions: stack.append(nf)
    return items
e = saved_eager()
print("eager: saved elements per token:", sum(n for _,n in e)/(b*s)/4, "; h =", h, "; per h:", sum(n for _,n in e)/(b*s)/4/h)
for it in e: print("  ", it)
t=time.time()
c = saved_compiled()
print("compiled: saved elements per token:", sum(it[-1] for it in c)/(b*s)/4, "; per h:", sum(it[-1] for it in c)/(b*s)/4/h, time.time()-t)
for it in c: print("  ", it)
