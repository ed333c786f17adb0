"""Tensor parallelism (Megatron-style column/row split) and sequence parallelism with
DTensor's `parallelize_module`, the plan torchtitan applies to its Llama.

With sequence parallelism (Korthikanti et al. 2022) the activations between blocks are
sharded along the sequence (Shard(1)): norms run on a sequence shard, attention and MLP
all-gather their input and reduce-scatter their output. Without it they are replicated and
the row-parallel outputs are all-reduced. The head keeps its logits sharded over the
vocabulary (Shard(-1)) and the loss runs under torch's `loss_parallel()` (worker.py), as
torchtitan does by default and as the cost model prices it (Megatron's vocab-parallel
cross-entropy: T·V/t logits per rank, no all-gather of the logits).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, *, sequence_parallel: bool) -> None:
    """Shard a (stage of the) Transformer of model.py over `tp_mesh` in place."""
    act = Shard(1) if sequence_parallel else Replicate()
    top = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act)
    if model.norm is not None and sequence_parallel:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=act, output_layouts=Shard(-1), use_local_output=False)
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=act),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=act),
        }
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        if sequence_parallel:
            plan.update({
                "attention_norm": SequenceParallel(),
                "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                                desired_input_layouts=(Replicate(), None, None)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            })
        parallelize_module(block, tp_mesh, plan)


def reduce_partial_grads(params: list[nn.Parameter]) -> int:
    """Sum the sequence-parallel norm weights' gradients over TP once per step, one
    all-reduce per (mesh, dtype), as Megatron does (finalize_model_grads,
    `_allreduce_layernorm_grads`); returns how many. Each TP rank holds its sequence shard's
    share (a Partial DTensor of a replicated parameter), and DTensor would otherwise reduce
    it again in every optimizer op that reads it (35 gloo all-reduces per step in a 2-layer
    run). Only gradients on a one-dimensional (TP) mesh: under FSDP its gradient reduction
    handles them (torch 2.13 reduces each such tensor over TP on its own)."""
    groups: dict = {}
    for p in params:
        g = p.grad
        if (isinstance(p, DTensor) and isinstance(g, DTensor) and g.device_mesh.ndim == 1
                and p.placements == (Replicate(),) and g.placements[0].is_partial("sum")):
            groups.setdefault((id(g.device_mesh), g.dtype), []).append(p)
    for partial in groups.values():
        mesh = partial[0].grad.device_mesh
        grads = [p.grad.to_local() for p in partial]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=mesh.get_group())
        start = 0
        for p, g in zip(partial, grads):
            p.grad = DTensor.from_local(flat[start:start + g.numel()].view_as(g), mesh, [Replicate()], run_check=False)
            start += g.numel()
    return sum(len(v) for v in groups.values())
