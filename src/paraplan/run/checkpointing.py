"""Activation checkpointing per paraplan's recompute policy (plan/axes.py Recompute).

full: every block keeps only its input and re-runs in the backward; first_k: the first k
blocks of each pipeline chunk do; selective: the attention core (scores, softmax) is
recomputed and the projections kept (Korthikanti et al. 2022); op-sac: torchtitan's per-op
selective checkpointing, the same policy (torchtitan distributed/activation_checkpoint.py):
each block keeps its input and the outputs of every other matmul, the attention kernel and
the TP reduce-scatters, and re-runs the rest. PyTorch's non-reentrant checkpoint is used,
which stops recomputing once the backward has what it needs (Plan.checkpoint_early_stop).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from ..plan.axes import Recompute


def op_sac_saved_ops() -> set:
    """The ops whose outputs per-op checkpointing keeps (torchtitan's _save_list, plus the CPU
    and cuDNN attention kernels, which paraplan run's SDPA may pick)."""
    aten = torch.ops.aten
    names = ("_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    ops = {aten.mm.default, aten.max.default, torch.ops._c10d_functional.reduce_scatter_tensor.default}
    ops |= {getattr(aten, n).default for n in names if hasattr(aten, n)}
    if hasattr(aten, "_scaled_mm"):
        ops.add(aten._scaled_mm.default)
    return ops


def op_sac_context():
    """A checkpoint's context: keep the saved ops' outputs except every second matmul (counted
    per block, apart in its forward and its recomputation), re-run the rest."""
    saved, count = op_sac_saved_ops(), defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func is torch.ops.aten.mm.default:
            count[key] += 1
        keep = func in saved and not (func is torch.ops.aten.mm.default and count[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def apply_checkpointing(model: nn.Module, recompute: Recompute, num_layers: int = 0) -> int:
    """Wrap blocks of a (stage of the) Transformer in place; returns how many were wrapped."""
    if recompute is Recompute.NONE:
        return 0
    wrapped = 0
    for i, (name, block) in enumerate(list(model.layers.items())):
        if recompute is Recompute.SELECTIVE:
            block.attention.recompute_core = True
            wrapped += 1
        elif recompute is Recompute.OP_SAC:
            model.layers[name] = checkpoint_wrapper(block, context_fn=op_sac_context, preserve_rng_state=False)
            wrapped += 1
        elif recompute is Recompute.FULL or (recompute is Recompute.FIRST_K and i < num_layers):
            model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)
            wrapped += 1
    return wrapped
