"""Bytes one block of `paraplan run`'s model saves for its backward per rank under DTensor TP over 2 CPU ranks,
with and without sequence parallelism (fp32). Usage: torchrun --standalone --nproc-per-node 2 calibration/cpu_sp_saved_tensors.py
(output in calibration/cpu_sp_saved_tensors.log). With SP the QKV and MLP projections save the all-gathered input."""
import torch
import torch.distributed as dist
from dataclasses import replace
from torch.distributed.device_mesh import init_device_mesh
from paraplan.specs.catalog import load_model
from paraplan.run.model import Transformer
from paraplan.run.tensor_parallel import apply_tensor_parallel

def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    spec = replace(load_model("llama3-8b"), num_layers=1, hidden_size=256, num_heads=8, num_kv_heads=2, head_dim=32,
                   ffn_hidden_size=704, vocab_size=512)
    s, b, h = 96, 2, 256
    out = {}
    for sp in (False, True):
        torch.manual_seed(0)
        model = Transformer(spec, s, first=False, last=False)
        apply_tensor_parallel(model, mesh, sequence_parallel=sp)
        skip = set()
        for p in list(model.parameters()) + list(model.buffers()):
            t = p.to_local() if hasattr(p, "to_local") else p
            skip.add(t.untyped_storage().data_ptr())
        from torch.distributed.tensor import DTensor
        x_full = torch.randn(b, s, h)
        x = (x_full.chunk(2, dim=1)[rank] if sp else x_full).clone().requires_grad_()
        skip.add(x.untyped_storage().data_ptr())
        seen, items = set(), []
        def pack(t):
            tl = t.to_local() if isinstance(t, DTensor) else t
            ptr = tl.untyped_storage().data_ptr()
            if ptr not in skip and ptr not in seen:
                seen.add(ptr); items.append((tuple(tl.shape), tl.untyped_storage().nbytes()))
            return t
        block = next(iter(model.layers.values()))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block(x, model.rope_cos, model.rope_sin)
        out[sp] = (sum(n for _, n in items) / (b * s), items)
    if rank == 0:
        for sp, (per_tok, items) in out.items():
            print("sp" if sp else "no-sp", "bytes per token (of the full sequence) per rank:", per_tok)
            for it in items: print("   ", it)
    dist.destroy_process_group()

main()
