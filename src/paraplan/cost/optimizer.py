"""The optimizer step on the busiest stage's shard: on the GPU, or offloaded to the host."""

from __future__ import annotations

import numpy as np

from ..specs.hardware import GPUSpec
from ..specs.workload import Optimizer, Workload
from . import memory as mem
from .layout import Layout
from .roofline import memory_bound_time_s

# Adam step traffic per parameter (bytes) and launches, by implementation. Fused: read fp32
# param, m, v, grad (16 B), write param, m, v (12 B) and the 16-bit copy (2 B), in a few
# multi-tensor launches. torch.optim.AdamW unfused (torch/optim/adamw.py, _single_tensor /
# _multi_tensor paths, no weight decay): m.lerp_(g) r m,g w m 12; v.mul_ 8; v.addcmul_(g, g)
# 12; sqrt(v) 8; ÷ bias correction 8; + eps 8; p.addcdiv_(m, denom) r p,m,d w p 16 = 72 B in
# 7 passes (the 16-bit copy is made at the next all-gather or autocast, not here).
ADAM_STEP = {Optimizer.ADAM: (30.0, 4), Optimizer.ADAM_UNFUSED: (72.0, 7)}


def optimizer_step_s(gpu: GPUSpec, workload: Workload, lay: Layout):
    """Seconds of one optimizer step over this rank's shard of the busiest stage."""
    opt_params = lay.params_stage / lay.optimizer_shard + lay.head_stage_expert_params / lay.expert_optimizer_shard
    adam_bytes, adam_kernels = ADAM_STEP[workload.optimizer]
    # the measured optimizer efficiency is torch's AdamW (calibrate/bench.py): the unfused passes
    opt_eff = gpu.optimizer_bw_efficiency if workload.optimizer is Optimizer.ADAM_UNFUSED else None
    opt_gpu = memory_bound_time_s(gpu, adam_bytes * opt_params, adam_kernels, opt_eff)
    opt_host = (opt_params * (mem.GRAD_BYTES + mem.WEIGHT_BYTES) / gpu.host_link_bw_unidir_bytes_per_s
                + opt_params / gpu.host_adam_params_per_s)
    return np.where(lay.offload_optimizer, opt_host, opt_gpu)
