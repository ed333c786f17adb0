"""Low-precision training (FP8, NVFP4): which GEMMs run at the low-precision peak, how wide
their operands are, what quantizing their inputs moves, and which layers stay in BF16.

FP8 (Transformer Engine, per-tensor or MXFP8): every linear layer's three GEMMs (forward,
data gradient, weight gradient) at the FP8 peak on 1-byte operands; each GEMM input cast from
16 bits (read 2 B, write 1 B); attention, norms, embeddings and communication in 16 bits.

FP8 with torchao's row-wise recipe (Workload.fp8_recipe; torchao/float8/config.py
`Float8LinearRecipeName.ROWWISE`: axiswise scales for input, weight and output gradient in
all three GEMMs): a scale per row along the GEMM's reduction axis, so the input X (T×K) is
quantized for the forward GEMM and again along T for the weight gradient, the output gradient
G (T×N) along N for the data gradient and along T for the weight gradient: per linear layer
X twice and G twice, where a per-tensor scale quantizes each once (its transposes fused).
torchtitan gathers TP inputs in 16 bits under this recipe, so every rank quantizes the
gathered input whole. Its GEMMs run at the GPU's fp8_rowwise_gemm_efficiency_ratio of the
per-tensor FP8 rate (torch._scaled_mm: a CUTLASS kernel for row-wise scales, cuBLAS for
per-tensor ones; fitted by `paraplan fit` on row-wise runs, 1.0 where none was). Weights are
quantized along both axes as well; like FP8's weight casts, not priced.

NVFP4 (NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv 2509.25149; Transformer
Engine `NVFP4BlockScaling`; Megatron-Core low-precision guide, `--fp4-format e2m1`):
- values are 4-bit E2M1 in blocks of 16 with one E4M3 scale per block (and an FP32 scale per
  tensor): 0.5 + 1/16 bytes per element;
- all three GEMMs of a linear layer take NVFP4 inputs, at the FP4 peak;
- in BF16: the attention core (QKᵀ, softmax, SV), embeddings and output head, norms and
  non-linearities, tensor-parallel reductions, and the first and last transformer layers
  (Megatron `--first-last-layers-bf16`, `--num-layers-at-start/end-in-bf16`, default 1 each;
  the paper's 12B run kept 2 and 8);
- extra work: each GEMM input is quantized twice, row-wise for its own GEMM and column-wise
  after a 16×16 random Hadamard transform for the weight-gradient GEMM (stochastic rounding on
  gradients): a memory-bound pass that reads 16 bits and writes two 4-bit copies. The
  transform's 32 FLOPs per element run on the tensor cores inside that pass (Transformer
  Engine's fused Hadamard-cast kernel) and are not priced apart; the weights' quantization
  (16×16 blocks, so that forward and backward see the same values) is not priced, as FP8's
  casts of them are not.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..specs.hardware import ClusterSpec
from ..specs.workload import Precision, Workload

LOW_PRECISIONS = (Precision.FP8, Precision.NVFP4)

# E2M1 (half a byte) plus one E4M3 scale byte per 16-element block (arXiv 2509.25149)
NVFP4_BYTES_PER_ELEMENT = 0.5 + 1.0 / 16.0
FP8_BYTES_PER_ELEMENT = 1.0
SOURCE_BYTES_PER_ELEMENT = 2.0  # a GEMM input is quantized from 16 bits

# Megatron-Core's default `--num-layers-at-start-in-bf16` / `--num-layers-at-end-in-bf16`
NVFP4_BF16_LAYERS_AT_START = 1
NVFP4_BF16_LAYERS_AT_END = 1


def gemm_operand_bytes(precision: Precision) -> float:
    """Bytes per element of a GEMM operand: 1 under FP8, 0.5625 under NVFP4, else the
    activation width."""
    if precision is Precision.FP8:
        return FP8_BYTES_PER_ELEMENT
    if precision is Precision.NVFP4:
        return NVFP4_BYTES_PER_ELEMENT
    return Precision(precision).activation_bytes


def quantize_bytes_per_element(precision: Precision) -> float:
    """HBM bytes moved per element of a GEMM input to quantize it in the forward pass (the
    backward moves twice as many, as cost/layer_compute.py counts FP8's): FP8 reads 2 B and writes
    1 B; NVFP4 reads 2 B and writes its row-wise and its Hadamard-transformed column-wise
    copies. 0 for a precision that does not quantize."""
    if precision is Precision.FP8:
        return SOURCE_BYTES_PER_ELEMENT + FP8_BYTES_PER_ELEMENT
    if precision is Precision.NVFP4:
        return SOURCE_BYTES_PER_ELEMENT + 2.0 * NVFP4_BYTES_PER_ELEMENT
    return 0.0


def _quantized_params(low_precision_params, fused_kernels) -> np.ndarray:
    """Plans whose weights Transformer Engine keeps quantized (the knob, on a fused engine)."""
    return np.asarray(low_precision_params, dtype=bool) & np.asarray(fused_kernels, dtype=bool)


def weights_bytes_per_param(precision: Precision, low_precision_params, fused_kernels) -> float | np.ndarray:
    """HBM bytes a linear layer's weight keeps per parameter through a step (vectorized over
    the plan knobs):
    - in 16 bits: 2;
    - under FP8 or NVFP4 on Transformer Engine (fused_kernels): its quantized copies, row-wise
      for the forward GEMM and column-wise for the data gradient's (Hopper's FP8: the
      transpose), gemm_operand_bytes each. Megatron-Core passes `is_first_microbatch`, so
      Transformer Engine quantizes every weight at a step's first micro-batch and keeps the
      copies for the others (megatron/core/extensions/transformer_engine.py, 0.16.1; TE's
      `get_weight_workspace(cache_name="weight")`); beside the 16-bit weight, unless the weights
      are kept quantized (Plan.low_precision_params: --fp8-param-gather, fp4_param), which
      leaves the copies alone. (Blackwell runs per-tensor FP8 GEMMs in every layout and may
      need no column-wise copy: counted as two all the same.)
    - under torchao's FP8 (an eager engine): 2, its casts made at each use, as the GEMMs'
      inputs are (not priced); the knob does not apply.
    A model's embedding, output head and the MTP blocks' dense part stay 16-bit
    (stage_memory.py); the layers NVFP4 keeps in BF16 (bf16_end_layers) and the MTP blocks'
    routed experts are counted at the quantized rate."""
    if precision not in LOW_PRECISIONS:
        return SOURCE_BYTES_PER_ELEMENT
    copies = 2.0 * gemm_operand_bytes(precision)
    kept = np.where(_quantized_params(low_precision_params, fused_kernels), copies, SOURCE_BYTES_PER_ELEMENT + copies)
    return np.where(np.asarray(fused_kernels, dtype=bool), kept, SOURCE_BYTES_PER_ELEMENT)


def gathered_weight_bytes_per_param(precision: Precision, low_precision_params, fused_kernels) -> float | np.ndarray:
    """Bytes per parameter a data-parallel all-gather of the weights moves (the distributed
    optimizer's after its step, ZeRO-3's before each use): the row-wise quantized copy where
    Transformer Engine keeps the weights quantized (Megatron-Core --fp8-param-gather,
    Megatron-Bridge fp4_param_gather; each rank makes its column-wise copy), else 16 bits
    (torchao's float8 all-gather for FSDP2 is not modelled). The embedding and the head,
    16-bit there, are counted at the same rate (under 15% of an 8B model's parameters, a few
    percent of a 70B's)."""
    if precision not in LOW_PRECISIONS:
        return SOURCE_BYTES_PER_ELEMENT
    return np.where(_quantized_params(low_precision_params, fused_kernels), gemm_operand_bytes(precision),
                    SOURCE_BYTES_PER_ELEMENT)


def attention_precision(precision: Precision) -> Precision:
    """What the attention core computes in: 16 bits under FP8 and NVFP4."""
    return Precision.BF16 if precision in LOW_PRECISIONS else precision


def head_precision(precision: Precision) -> Precision:
    """What the output head's GEMM computes in: BF16 under NVFP4 (FP8 keeps the workload's
    precision here, as its validated estimates have it)."""
    return Precision.BF16 if precision is Precision.NVFP4 else precision


def bf16_end_layers(precision: Precision, num_layers: int) -> tuple[int, int]:
    """(first, last) transformer layers kept in BF16: Megatron-Core's one and one under NVFP4
    (fewer for a model of fewer layers), none otherwise."""
    if precision is not Precision.NVFP4:
        return 0, 0
    first = min(NVFP4_BF16_LAYERS_AT_START, num_layers)
    return first, min(NVFP4_BF16_LAYERS_AT_END, num_layers - first)


def recipe_cluster(cluster: ClusterSpec, workload: Workload) -> ClusterSpec:
    """The cluster as the workload's FP8 recipe sees it: under the row-wise recipe its GPU's FP8
    GEMMs at fp8_rowwise_gemm_efficiency_ratio of the per-tensor rate; else the cluster itself
    (no copy: the search prices every batch through here)."""
    if not workload.fp8_rowwise:
        return cluster
    gpu = cluster.gpu
    return replace(cluster, gpu=replace(gpu, fp8_gemm_efficiency_ratio=gpu.fp8_gemm_efficiency_ratio
                                        * gpu.fp8_rowwise_gemm_efficiency_ratio))
