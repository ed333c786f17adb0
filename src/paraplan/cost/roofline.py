"""Roofline primitives: time = max(compute, memory) with achieved-efficiency curves as data.

A GEMM (m×k)·(k×n) does 2mkn FLOPs and moves (mk + kn + mn)·e bytes (e bytes/element).
Its achieved FLOP/s is peak × efficiency(FLOPs of this GEMM) from the GPU's calibrated
curve: a GEMM split over TP is smaller and less efficient. Memory-bound kernels move their
bytes at HBM bandwidth × achieved fraction. Every kernel pays a launch overhead.
(Williams et al. 2009, "Roofline"; efficiency-vs-size curves as in Calculon and vidur.)
"""

from __future__ import annotations

import numpy as np

from ..specs.hardware import AttentionKernel, GPUSpec
from ..specs.workload import Precision
from .low_precision import LOW_PRECISIONS, attention_precision, gemm_operand_bytes


def gemm_time_s(gpu: GPUSpec, m, n, k, precision: Precision, bytes_per_element: float | None = None,
                aligned=True):
    """Time of one GEMM (vectorized); FP8 and NVFP4 run at their peak × fp8_gemm_efficiency_ratio.
    Operands are `bytes_per_element` wide (default: the precision's activation width; FP8: 1,
    NVFP4: 0.5625). Where not `aligned` (vectorized; rows_aligned), at misaligned_gemm_efficiency_ratio."""
    if bytes_per_element is None:
        bytes_per_element = Precision(precision).activation_bytes
    m = np.asarray(m, dtype=float)
    flops = 2.0 * m * n * k
    eff = gpu.gemm_efficiency.at(flops)
    if precision in LOW_PRECISIONS:
        # the curve is by BF16 FLOPs; a low-precision GEMM finishes its FLOPs in the time of a
        # BF16 GEMM of peak_bf16/peak_low as many, and its fixed costs weigh like that one's.
        # NVFP4 reaches the same share of its peak as FP8 of its own: an ASSUMPTION (no NVFP4
        # GEMM measured here), priced with the GPU's fp8_gemm_efficiency_ratio
        eff = gpu.gemm_efficiency.at(flops * gpu.peak(Precision.BF16) / gpu.peak(precision))
        rate = gpu.peak(precision) * eff * gpu.fp8_gemm_efficiency_ratio
        bytes_per_element = gemm_operand_bytes(precision)
    else:
        rate = gpu.peak(precision) * eff
    rate = rate * gpu.compute_share * np.where(aligned, 1.0, gpu.misaligned_gemm_efficiency_ratio)
    compute = flops / rate
    memory = (m * k + k * n + m * n) * bytes_per_element / (gpu.hbm_bw_bytes_per_s * gpu.memory_bw_efficiency)
    return np.maximum(compute, memory) + gpu.kernel_launch_overhead_s


GEMM_ROW_ALIGN_BYTES = 16  # the vector width cuBLAS's tensor-core kernels load rows in


def rows_aligned(elements, bytes_per_element) -> np.ndarray:
    """Whether rows of `elements` (a GEMM dimension that is a leading one in some pass: the
    vocabulary of the LM head) start on GEMM_ROW_ALIGN_BYTES boundaries. Vectorized."""
    return np.mod(np.ceil(np.asarray(elements, dtype=float)) * bytes_per_element, GEMM_ROW_ALIGN_BYTES) == 0


def up_projection_time_s(gpu: GPUSpec, m, n_each, k, precision: Precision, matrices: int, fused):
    """The `matrices` column-parallel projections of one input, m×k by k×n_each each (a gated
    MLP's gate and up), as one GEMM of matrices·n_each (Megatron-Core's fused linear_fc1) where
    `fused`, else one GEMM each (torchtitan's w1, w3; vectorized over `fused`)."""
    one = gemm_time_s(gpu, m, matrices * np.asarray(n_each, dtype=float), k, precision)
    fused = np.asarray(fused, dtype=bool)
    if matrices == 1 or np.all(fused):
        return one
    return np.where(fused, one, matrices * gemm_time_s(gpu, m, n_each, k, precision))


def attention_time_s(gpu: GPUSpec, flops, precision: Precision, kernel_code):
    """Fused-attention kernel time at the kernel's calibrated efficiency (16-bit peak).

    `kernel_code` is an AttentionKernel code (array or int); UNFUSED entries get FLASH2's
    curve here and are costed separately by the caller.
    """
    p = attention_precision(precision)
    flops = np.asarray(flops, dtype=float)
    code = np.asarray(kernel_code)
    eff = gpu.attention_curve(AttentionKernel.FLASH2).at(flops)
    for kernel, curve in gpu.attention_efficiency.items():
        if kernel is not AttentionKernel.FLASH2:
            eff = np.where(code == kernel.code, curve.at(flops), eff)
    rate = gpu.peak(p) * eff * gpu.compute_share
    return flops / rate + gpu.kernel_launch_overhead_s


def memory_bound_time_s(gpu: GPUSpec, num_bytes, num_kernels=1, bw_efficiency: float | None = None):
    """Streaming kernels (copies, casts, gathers, the optimizer): bytes at achieved HBM
    bandwidth (the GPU's memory_bw_efficiency, or `bw_efficiency`), plus launches."""
    eff = gpu.memory_bw_efficiency if bw_efficiency is None else bw_efficiency
    return (np.asarray(num_bytes, dtype=float) / (gpu.hbm_bw_bytes_per_s * eff)
            + num_kernels * gpu.kernel_launch_overhead_s)


def elementwise_time_s(gpu: GPUSpec, num_bytes, num_kernels=1):
    """A layer's element-wise kernels (norms, RoPE, activation, residual, softmax, loss): the
    bytes the model counts at the bandwidth such kernels achieve, plus launches."""
    return memory_bound_time_s(gpu, num_bytes, num_kernels, gpu.elementwise_bw_efficiency)


def work_time_s(gpu: GPUSpec, num_flops, num_bytes, precision: Precision, num_kernels=1):
    """A kernel given only by its FLOPs and HBM bytes (a preconditioner's work: cost/bubble_fill.py):
    max(FLOPs at the precision's peak × the GEMM curve at that many FLOPs × the sustained ratio,
    bytes at achieved HBM bandwidth), plus launches. Vectorized."""
    flops = np.asarray(num_flops, dtype=float)
    rate = gpu.peak(precision) * gpu.gemm_efficiency.at(flops) * gpu.compute_share
    compute = flops / rate
    memory = np.asarray(num_bytes, dtype=float) / (gpu.hbm_bw_bytes_per_s * gpu.memory_bw_efficiency)
    return np.maximum(compute, memory) + num_kernels * gpu.kernel_launch_overhead_s
