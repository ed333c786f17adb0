"""Compressed data-parallel gradient reduction (Plan.grad_compression): the bytes on the wire,
the kernels that compress and decompress on the GPU, and the error-feedback memory.

Two formats, as engines ship them (docs/model/parallelism.md, "Compressed gradient reduction"):

- int4, DeepSpeed ZeRO++ qgZ (Wang et al. 2023, "ZeRO++", Sec. 3.3; DeepSpeed 0.19.8
  deepspeed/runtime/comm/coalesced_collectives.py all_to_all_quant_reduce): ZeRO-3's per-layer
  reduce-scatter becomes an all-to-all of int4 values with fp32 block scales inside each node,
  a dequantize-reduce-requantize (quantized_reduction), then an all-to-all of the node's 1/g
  share across the nodes, a dequantize and the mean of the N nodes' chunks. 1-D tensors, and
  a shard group inside one node, keep the 16-bit reduce-scatter. No error feedback.
- PowerSGD, PyTorch DDP's comm hook (Vogels et al. 2019, Algorithm 1; torch 2.13
  torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py powerSGD_hook): each gradient
  matrix M (n×m) gets its error added back, P = M·Q (n×r) is all-reduced and orthogonalized
  (Gram-Schmidt), Q = Mᵀ·P (m×r) all-reduced, M̂ = P·Qᵀ replaces the gradient and M − M̂ is
  the next step's error. 1-D tensors are all-reduced uncompressed.

Legend: w bytes per reduced element (2; 4 with grad_reduce_fp32), r PowerSGD's rank, h hidden
size, t TP degree, M_l weight matrices per layer (wq, wk, wv, wo and the MLP's, as the eager
engines that run DDP hooks keep them), L_s layers of the critical stage, g members of the
shard group per node, N nodes it spans.
"""

from __future__ import annotations

import numpy as np

from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision
from .comm import Collective, collective_time_s, group_span
from .layout import Layout
from .roofline import elementwise_time_s, gemm_time_s

INT4_BYTES_PER_ELEMENT = 0.5   # two 4-bit values per byte (swizzle_quant's num_bits=4)
SCALE_BYTES = 4.0              # one fp32 scale per quantization group


def _layer_matrix_and_vector_params(model: ModelSpec, lay: Layout):
    """(matrix, 1-D) parameters of one layer on one GPU: the norms' are the 1-D tensors."""
    vec = model.norm_params_per_layer / lay.tp
    return lay.layer_params - vec, vec


def _matrices_per_layer(model: ModelSpec) -> float:
    """M_l: wq, wk, wv, wo and the MLP's, as the eager engines that run DDP hooks keep them."""
    return 4.0 + model.num_mlp_matrices


def qgz_wire_bytes_per_element(model: ModelSpec) -> float:
    """int4 plus its scales: all_to_all_quant_reduce quantizes a matrix in max(rows, cols,
    world) groups, one fp32 scale each, so a group holds min(rows, cols) ≈ h elements."""
    return INT4_BYTES_PER_ELEMENT + SCALE_BYTES / model.hidden_size


def qgz_reduce_scatter_s(cluster: ClusterSpec, model: ModelSpec, lay: Layout):
    """(communication, kernels) of one layer's qgZ gradient reduction per micro-batch over the
    shard group S (TP = PP = CP = 1, plan/rules.py gc_int4). The node step moves the layer's
    int4 gradient (g−1)/g over NVLink, the network step its 1/g share; inside one node
    DeepSpeed falls back to the 16-bit reduce-scatter (N = 1: comm here 0, the caller keeps it)."""
    gpu, S, w = cluster.gpu, lay.zero_shard_group, lay.reduce_bytes_per_param
    mat, vec = _layer_matrix_and_vector_params(model, lay)
    g, N, I = group_span(cluster, S, 1)
    nodes = N * I
    wire = mat * qgz_wire_bytes_per_element(model)
    comm = (collective_time_s(cluster, Collective.ALL_TO_ALL, wire, g, 1)
            + collective_time_s(cluster, Collective.ALL_TO_ALL, wire / g, nodes, g)
            + collective_time_s(cluster, Collective.REDUCE_SCATTER, w * vec, S, 1))
    # quantize (read w, write 0.5), quantized_reduction (read the g int4 chunks, write 1/g of
    # them), dequantize (read 0.5/g, write w/g) and the mean of the N chunks (read w/g, write
    # w/(gN)): bytes per element of the layer's matrices, 3 + N kernels
    q = INT4_BYTES_PER_ELEMENT
    moved = mat * ((w + q) + (q + q / g) + (q + w) / g + (w + w / nodes) / g)
    kernels = elementwise_time_s(gpu, moved, 3.0 + nodes)
    multi = nodes > 1.0
    return np.where(multi, comm, 0.0), np.where(multi, kernels, 0.0), multi


def _matrix_sums(model: ModelSpec, lay: Layout):
    """(Σ(n+m) of a layer's matrices, their elements, its 1-D elements, Σ(n+m) of the stage's
    other matrices (embedding, head), their elements, how many) on one GPU: each matrix has one
    side h and the other split by TP, so Σ(n+m) = M_l·h + elements/h."""
    h, t = model.hidden_size, lay.tp
    mat, vec = _layer_matrix_and_vector_params(model, lay)
    M_l = _matrices_per_layer(model)
    ends = np.maximum(lay.params_stage - lay.stage_layers * lay.layer_params - h, 0.0)
    ends_matrices = ends / (model.vocab_size * h / t)
    return M_l * h + mat / h, mat, vec, ends_matrices * h + ends / h, ends, ends_matrices


def _powersgd_kernels_s(gpu, model: ModelSpec, lay: Layout, sum_nm, mat, matrices):
    """One bucket's compression kernels: three GEMMs per matrix (P = M·Q, Q = Mᵀ·P, M̂ = P·Qᵀ,
    2·n·m·r FLOPs each, w-wide, priced as one GEMM over the bucket's matrices plus a launch
    per matrix), Gram-Schmidt on P (torch _orthogonalize_gram_schmidt: about 3 kernels per
    column, reading and writing P's r columns r times) and the error feedback over the
    matrices (add the error: read 2w write w; clone: read w write w; new error M − M̂: read
    2w write w: 8w per element, 3 kernels)."""
    h, r, w = model.hidden_size, np.maximum(lay.powersgd_rank, 1.0), lay.reduce_bytes_per_param
    gemm = gemm_time_s(gpu, h, r, np.maximum(mat / h, 1.0), Precision.BF16, w)
    gemms = 3.0 * (gemm + (matrices - 1.0) * gpu.kernel_launch_overhead_s)
    p_elements = r * sum_nm / 2.0
    ortho = elementwise_time_s(gpu, 4.0 * w * r * p_elements, 3.0 * r * matrices)
    feedback = elementwise_time_s(gpu, 8.0 * w * mat, 3)
    return gemms + ortho + feedback


def powersgd_reduce_s(cluster: ClusterSpec, model: ModelSpec, lay: Layout, group, stride, runs: dict):
    """(communication, kernels) of a step's PowerSGD reduction of the critical stage over the
    data-parallel group, one bucket per layer and one for the embedding / head: the P and Q
    all-reduces (r·Σ(n+m) elements of w bytes, priced as two halves) and the 1-D tensors' own."""
    gpu, w, r, L_s = cluster.gpu, lay.reduce_bytes_per_param, lay.powersgd_rank, lay.stage_layers
    sum_nm, mat, vec, ends_nm, ends, ends_matrices = _matrix_sums(model, lay)

    def all_reduce(num_bytes):
        return collective_time_s(cluster, Collective.ALL_REDUCE, num_bytes, group, stride, **runs)
    layer_comm = 2.0 * all_reduce(w * r * sum_nm / 2.0) + all_reduce(w * vec)
    ends_comm = np.where(ends > 0.0, 2.0 * all_reduce(w * r * ends_nm / 2.0) + all_reduce(w * model.hidden_size), 0.0)
    layer_kernels = _powersgd_kernels_s(gpu, model, lay, sum_nm, mat, _matrices_per_layer(model))
    ends_kernels = np.where(ends > 0.0, _powersgd_kernels_s(gpu, model, lay, ends_nm, np.maximum(ends, 1.0),
                                                            np.maximum(ends_matrices, 1.0)), 0.0)
    return L_s * layer_comm + ends_comm, L_s * layer_kernels + ends_kernels


def error_feedback_bytes(model: ModelSpec, lay: Layout, params):
    """PowerSGD's per-GPU state for `params` parameters: the error of every bucket (w bytes per
    parameter, powerSGD_hook's error_dict) and the warm-started P and Q (w·r·Σ(n+m), at most
    2·r/h of the parameters since each matrix has a side h and another ≥ h: counted at that
    bound). 0 without PowerSGD; qgZ keeps no error."""
    r, w = lay.powersgd_rank, lay.reduce_bytes_per_param
    return np.where(r > 0.0, w * params * (1.0 + 2.0 * r / model.hidden_size), 0.0)
