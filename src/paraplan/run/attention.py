"""Which attention kernel torch runs, in paraplan's terms (specs/hardware.py AttentionKernel).

`F.scaled_dot_product_attention` picks a backend per call (torch/nn/attention: SDPBackend).
paraplan names them by the kernel whose speed and memory it prices:

  CUDNN_ATTENTION      -> flash3   cuDNN's fused attention: Hopper-class speed (on an H100,
                                   torch 2.11 picks it by default; measured 520-640 TFLOP/s
                                   forward at 2k-16k tokens, calibration/h100_2026-11-22)
  FLASH_ATTENTION      -> flash2   FlashAttention-2 (Dao 2023), also torch's CPU kernel
                                   (285-350 TFLOP/s forward on the same H100)
  EFFICIENT_ATTENTION  -> flash2   the memory-efficient kernel (xFormers): it stores no scores
                                   either, but runs slower than FlashAttention-2 (150-175
                                   TFLOP/s there), so a run on it is under-predicted unless
                                   calibrate measured it (it does where FlashAttention-2 refuses)
  MATH                 -> unfused  scores materialized

`paraplan run` records the kernel torch picks for its own shapes, so that the prediction
prices what ran; `paraplan calibrate` measures each fused backend under its name.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

from ..plan.axes import AttentionKernel

BACKEND_KERNEL = {
    SDPBackend.CUDNN_ATTENTION: AttentionKernel.FLASH3,
    SDPBackend.FLASH_ATTENTION: AttentionKernel.FLASH2,
    SDPBackend.EFFICIENT_ATTENTION: AttentionKernel.FLASH2,
    SDPBackend.MATH: AttentionKernel.UNFUSED,
}
# the backends `paraplan calibrate` measures, under the kernel name they stand for: the first
# of each name's backends that runs on the device (the memory-efficient kernel where
# FlashAttention-2 refuses: pre-Ampere GPUs)
CALIBRATED_BACKENDS = ((AttentionKernel.FLASH2, (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION)),
                       (AttentionKernel.FLASH3, (SDPBackend.CUDNN_ATTENTION,)))


def default_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> AttentionKernel:
    """The kernel torch's SDPA dispatcher picks for causal attention over these tensors
    (batch × heads × seq × head_dim, keys and values with their own heads, as the model
    calls it: grouped-query attention when they have fewer)."""
    choice = int(torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1]))
    for backend, kernel in BACKEND_KERNEL.items():
        if int(backend) == choice:
            return kernel
    return AttentionKernel.FLASH2  # OVERRIDEABLE (an out-of-tree device's own kernel): fused


def run_kernel(heads: int, kv_heads: int, seq_len: int, head_dim: int, device: torch.device,
               dtype: torch.dtype) -> AttentionKernel:
    """The kernel a run's attention layer gets: `heads` and `kv_heads` per rank (divided by
    TP), one sequence of `seq_len`."""
    # (requiring gradients, as in training: some backends' constraints depend on it)
    q = torch.zeros(1, heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
    kv = torch.zeros(1, kv_heads, seq_len, head_dim, device=device, dtype=dtype, requires_grad=True)
    return default_kernel(q, kv, kv)
