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
# Adam accumulation (AdamA; Zhang et al. 2023, Algorithm 1): each micro-batch's gradient g_i
# folded into the states, m += (1-β1)·g_i/N, v += (1-β2)·g_i²/N, one pass per micro-batch.
# Fused (one multi-tensor kernel per state pair): read the fp32 gradient, read and write m
# and v: 4 + 8 + 8 = 20 B. Unfused torch ops: m.add_(g, alpha) r m,g w m 12 B; v.addcmul_(g, g,
# value) r v,g w v 12 B = 24 B in 2 passes. The last micro-batch's fold is the step's own
# Adam kernel (ADAM_STEP reads the gradient and updates m, v and the weights in one pass), so
# a step of m micro-batches adds m − 1 folds to the step.
ADAMA_FOLD = {Optimizer.ADAM: (20.0, 2), Optimizer.ADAM_UNFUSED: (24.0, 2)}


def optimizer_step_s(gpu: GPUSpec, workload: Workload, lay: Layout):
    """Seconds of one optimizer step over this rank's shard of the busiest stage."""
    opt_params = lay.params_stage / lay.optimizer_shard + lay.head_stage_expert_params / lay.expert_optimizer_shard
    adam_bytes, adam_kernels = ADAM_STEP[workload.optimizer]
    # the measured optimizer efficiency is torch's AdamW (calibrate/bench.py): the unfused passes
    opt_eff = gpu.optimizer_bw_efficiency if workload.optimizer is Optimizer.ADAM_UNFUSED else None
    opt_gpu = memory_bound_time_s(gpu, adam_bytes * opt_params, adam_kernels, opt_eff)
    if np.any(lay.adam_accumulation):
        opt_gpu = opt_gpu + np.where(lay.adam_accumulation, adama_folds_s(gpu, workload, lay, opt_params), 0.0)
    opt_host = (opt_params * (mem.GRAD_BYTES + mem.WEIGHT_BYTES) / gpu.host_link_bw_unidir_bytes_per_s
                + opt_params / gpu.host_adam_params_per_s)
    return np.where(lay.offload_optimizer, opt_host, opt_gpu)


def adama_folds_s(gpu: GPUSpec, workload: Workload, lay: Layout, opt_params):
    """Seconds of Adam accumulation's extra folds of a step (ADAMA_FOLD): m − 1 passes over
    the rank's `opt_params` states (its ZeRO-1 shard, or all of them), on the GPU. They run
    between the micro-batches' backwards; counted here, as optimizer time after the pipeline."""
    fold_bytes, fold_kernels = ADAMA_FOLD[workload.optimizer]
    opt_eff = gpu.optimizer_bw_efficiency if workload.optimizer is Optimizer.ADAM_UNFUSED else None
    extra_folds = np.maximum(lay.num_microbatches - 1.0, 0.0)
    return extra_folds * memory_bound_time_s(gpu, fold_bytes * opt_params, fold_kernels, opt_eff)
