"""What torchtitan's per-op selective checkpointing keeps of one block, eager and under
torch.compile (inductor), measured on a CPU: paraplan run's block (Llama-style, SwiGLU, GQA) in
fp32, wrapped as torchtitan wraps it (checkpoint_wrapper with the op-SAC policy,
paraplan/run/checkpointing.py), then each block compiled as torchtitan's --compile does.

Eager: the block's input (the checkpoint's) plus the outputs the policy's cache holds
(torch.utils.checkpoint's _CachingTorchDispatchMode storage). Compiled: the tensors the
compiled backward saved (CompiledFunctionBackward.saved_tensors), plus the block's input.

    python calibration/cpu_compile_op_sac.py   # writes calibration/cpu_compile_op_sac.json

tests/test_op_sac.py checks cost/memory.py op_sac_bytes_per_token against the file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from paraplan.run.checkpointing import op_sac_context
from paraplan.run.model import Transformer
from paraplan.specs.catalog import load_model

H, F, HEADS, KV_HEADS, BATCH, SEQ = 256, 704, 8, 2, 2, 96
OUT = Path(__file__).with_suffix(".json")


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)
    elif hasattr(obj, "val"):  # torch.utils.checkpoint._VersionWrapper
        yield from _tensors(obj.val)


def _eager(block, x, cos, sin) -> list[dict]:
    contexts = []

    def context_fn():
        contexts.append(op_sac_context())
        return contexts[-1]
    checkpoint_wrapper(block, context_fn=context_fn, preserve_rng_state=False)(x, cos, sin)
    out, seen = [], set()
    for func, cached in contexts[0][0].storage.items():
        for t in (t for value in cached.values() for t in _tensors(value)):
            if t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                out.append({"op": str(func), "shape": list(t.shape), "elements": t.numel()})
    return out


def _compiled(block, x, cos, sin, skip: set) -> list[dict]:
    wrapped = checkpoint_wrapper(block, context_fn=op_sac_context, preserve_rng_state=False)
    y = torch.compile(wrapped)(x, cos, sin)
    out, seen, stack, visited = [], set(skip), [y.grad_fn], set()
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in visited:
            continue
        visited.add(id(fn))
        for t in getattr(fn, "saved_tensors", ()) or ():
            if t is not None and t.untyped_storage().data_ptr() not in seen:
                seen.add(t.untyped_storage().data_ptr())
                out.append({"op": type(fn).__name__, "shape": list(t.shape), "elements": t.numel()})
        stack.extend(nf for nf, _ in fn.next_functions)
    y.sum().backward()
    return out


def main() -> None:
    torch.manual_seed(0)
    spec = replace(load_model("llama3-8b"), num_layers=1, hidden_size=H, num_heads=HEADS, num_kv_heads=KV_HEADS,
                   head_dim=H // HEADS, ffn_hidden_size=F, vocab_size=512)
    model = Transformer(spec, SEQ, first=False, last=False)
    block = next(iter(model.layers.values()))
    x = torch.randn(BATCH, SEQ, H, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in list(model.parameters()) + list(model.buffers())}
    skip.add(x.untyped_storage().data_ptr())
    tokens = BATCH * SEQ
    result = {"torch": torch.__version__, "hidden": H, "ffn": F, "heads": HEADS, "kv_heads": KV_HEADS,
              "tokens": tokens, "dtype": "float32"}
    for label, saved in (("eager", _eager(block, x, model.rope_cos, model.rope_sin)),
                         ("compiled", _compiled(block, x, model.rope_cos, model.rope_sin, skip))):
        # the block's input, which the checkpoint keeps, plus the saved outputs
        result[label] = {"elements_per_token": H + sum(t["elements"] for t in saved) / tokens, "saved": saved}
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"kept per token (elements, the input included): eager {result['eager']['elements_per_token']:g}, "
          f"compiled {result['compiled']['elements_per_token']:g}")


if __name__ == "__main__":
    main()
