"""Activation checkpointing per paraplan's recompute policy (plan/axes.py Recompute).

full: every block keeps only its input and re-runs in the backward; first_k: the first k
blocks of each pipeline chunk do; selective: the attention core (scores, softmax) is
recomputed and the projections kept (Korthikanti et al. 2022). PyTorch's non-reentrant
checkpoint is used, which stops recomputing once the backward has what it needs
(Plan.checkpoint_early_stop).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

from ..plan.axes import Recompute


def apply_checkpointing(model: nn.Module, recompute: Recompute, num_layers: int = 0) -> int:
    """Wrap blocks of a (stage of the) Transformer in place; returns how many were wrapped."""
    if recompute is Recompute.NONE:
        return 0
    wrapped = 0
    for i, (name, block) in enumerate(list(model.layers.items())):
        if recompute is Recompute.SELECTIVE:
            block.attention.recompute_core = True
            wrapped += 1
        elif recompute is Recompute.FULL or (recompute is Recompute.FIRST_K and i < num_layers):
            model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)
            wrapped += 1
    return wrapped
