"""Data parallelism with FSDP2 `fully_shard`: ZeRO-3 (FSDP), ZeRO-1/2 and plain DP.

paraplan ZeRO stage -> FSDP2:
  3 (dp_shard = dp)  fully_shard over the DP ranks, parameters resharded after forward
  3 (dp_shard < dp)  HSDP: a 2-D (replicate, shard) mesh, sharded inside each group of
                     dp_shard ranks and all-reduced across groups
  1, 2               parameters kept gathered from forward to backward
                     (reshard_after_forward=False); gradients and optimizer states sharded.
                     FSDP2 has no ZeRO-1 of its own: stage 1 runs as stage 2.
  0                  replicated: HSDP with shard groups of one rank (an all-reduce of the
                     gradients, as DDP does).
Gradients are averaged over the DP ranks (the loss is a mean over the global batch).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ..plan.axes import ZeroStage


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, *, zero: ZeroStage, param_dtype: torch.dtype | None,
               gloo: bool) -> None:
    """fully_shard every block, then the (stage) root, over the 2-D (replicate, shard) mesh."""
    reshard = zero is ZeroStage.PARAMETERS
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    units = list(model.layers.values()) + [model]
    for unit in units:
        fully_shard(unit, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
        if gloo:
            # FSDP2 averages with ReduceOp.AVG / PREMUL_SUM, which gloo lacks: reduce with a
            # plain SUM and divide locally instead.
            unit.set_force_sum_reduction_for_comms(True)
    if reshard:
        # each block's pre-forward issues the next block's all-gather, so that it runs
        # behind this block's compute, as the cost model prices ZeRO-3 (prefetched). FSDP2's
        # implicit forward prefetch needs a device that runs behind the host (CUDA streams);
        # on a CPU the host is the device, and every gather would wait in front of its block.
        blocks = list(model.layers.values())
        for block, nxt in zip(blocks, blocks[1:]):
            block.set_modules_to_forward_prefetch([nxt])
