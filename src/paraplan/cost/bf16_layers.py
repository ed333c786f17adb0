"""NVFP4's first and last layers kept in BF16 (low_precision.bf16_end_layers): where they sit
and what they add to a stage's time and memory beyond a layer of the workload's precision.
"""

from __future__ import annotations

import numpy as np

from ..plan.axes import Recompute
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision, Workload
from . import memory as mem
from .layer_compute import LayerCompute, layer_gemm_passes
from .layout import Layout
from .low_precision import bf16_end_layers
from .moe import moe_activation_bytes, moe_layer_costs

def bf16_layers_on_end_stages(model: ModelSpec, lay: Layout):
    """Layers kept in BF16 (NVFP4's first and last, low_precision.bf16_end_layers) on the first
    and on the last stage (vectorized): the first rank of a V holds both, and one stage both."""
    n_start, n_end = bf16_end_layers(lay.precision, model.num_layers)
    if not n_start + n_end:
        return 0.0, 0.0
    first = n_start + np.where(lay.first_holds_ends, n_end, 0.0)
    return first, np.where(lay.v_shape, 0.0, np.where(lay.single_stage, n_start, 0.0) + n_end)


def bf16_layer_extra_bytes(model: ModelSpec, workload: Workload, plan, lay: Layout, stored):
    """Activation bytes one layer kept in BF16 (NVFP4's first and last) saves beyond a layer of
    the workload's low precision, whose saved bytes are `stored`: 16-bit GEMM inputs (under
    first-k recomputation priced as kept: conservative)."""
    moe16 = (moe_activation_bytes(model, workload, plan, lay.tokens_per_microbatch, lay.tp, Precision.BF16)
             if model.is_moe else (0.0, 0.0))
    stored16 = mem.layer_activation_bytes(
        model, plan, workload.seq_len, recompute_code=lay.recompute_code, mlp_weight=lay.dense_layer_share,
        extra_bytes=lay.moe_layer_share * moe16[0], modules_extra_saving=lay.moe_layer_share * moe16[1],
        precision=Precision.BF16)[0]
    return stored16 - stored


def bf16_layer_extra_s(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, lay: Layout,
                       lc: LayerCompute, cast, mc):
    """(forward, backward) time one layer kept in BF16 takes beyond a layer of the workload's
    low precision (NVFP4's first and last layers, low_precision.bf16_end_layers): its GEMMs (and
    an MoE layer's experts) at the BF16 rate, in the same TP-overlap chunks, its inputs not
    quantized; recomputed at that rate under full recomputation. `lc`, `cast`, `mc`: the
    low-precision layer's."""
    gpu, bf16 = cluster.gpu, Precision.BF16
    *_, gemms_fwd16, gemms_bwd16, _ = layer_gemm_passes(gpu, model, lay, lc.fused, lc.tp_chunks, bf16)
    fwd = gemms_fwd16 - lc.gemms_forward_s - cast
    bwd = gemms_bwd16 - lc.gemms_backward_s - 2.0 * cast
    if mc:
        mc16 = moe_layer_costs(model, cluster, workload, plan, lay.tokens_per_microbatch, lay.tp, bf16)
        fwd = fwd + lay.moe_layer_share * (mc16.fwd_compute_s - mc.fwd_compute_s)
        bwd = bwd + lay.moe_layer_share * (mc16.bwd_compute_s - mc.bwd_compute_s)
    return fwd, bwd + np.where(lay.recompute_code == Recompute.FULL.code, fwd, 0.0)

