"""FP8 delayed scaling's amax all-reduces (Workload.fp8_recipe = delayed).

Transformer Engine's delayed scaling takes each tensor's scale from an amax history that every
rank must share: when a model chunk's outermost `fp8_autocast` exits, forward and backward, it
all-reduces the amaxes the pass recorded (`FP8GlobalStateManager.reduce_and_update_fp8_tensors`)
over Megatron-Core's amax reduction group, every TP×CP×DP rank of the pipeline stage
(parallel_state.get_amax_reduction_group(with_context_parallel=True), core_v0.16.1), on the
compute stream: the next pass waits for it. docs/model/compute.md, "Delayed scaling".
"""

from __future__ import annotations

import numpy as np

from ..num import Num, as_float
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .comm import Collective, collective_time_s
from .layout import Layout

# Bytes a GEMM adds to a pass's amax reduction: an fp32 amax for each of the forward's two
# inputs (activation and weight); the backward's output gradient takes no more
AMAX_BYTES_PER_GEMM = 2 * 4.0
DENSE_LAYER_GEMMS = 4.0  # QKV, output projection, up (with the gate), down
# an MoE layer: its attention's two (QKV, output projection) and each local expert's two (fc1,
# fc2); a shared expert's and the router's are left out (the all-reduce is latency-bound: a
# few more bytes do not change its time)
MOE_LAYER_GEMMS_BESIDES_EXPERTS = 2.0
GEMMS_PER_EXPERT = 2.0


def amax_reduction_s(cluster: ClusterSpec, model: ModelSpec, workload: Workload, plan, lay: Layout) -> Num:
    """One chunk pass's amax all-reduce (vectorized over a batch's layouts; 0 under any other
    recipe): a few bytes a layer, so it costs the collective's latency across the group as
    cost/comm.py prices it (a ring over NVLink, then over the nodes, latency per hop), which
    grows with the nodes the stage spans. The group is the stage's ranks: t·c·d contiguous
    ones with the pipeline outermost, runs of t·c ranks t·c·p apart with data parallelism
    outermost (Layout.pp_stride)."""
    if not workload.fp8_delayed:
        return 0.0
    local_experts = model.num_experts / as_float(plan.ep)
    gemms = (lay.dense_layer_share * DENSE_LAYER_GEMMS
             + lay.moe_layer_share * (MOE_LAYER_GEMMS_BESIDES_EXPERTS + GEMMS_PER_EXPERT * local_experts))
    layers_per_chunk = lay.stage_layers / lay.vp
    group = lay.tp * lay.cp * lay.dp
    return np.asarray(collective_time_s(cluster, Collective.ALL_REDUCE, AMAX_BYTES_PER_GEMM * gemms * layers_per_chunk,
                                        group, 1, block=lay.pp_stride, outer_stride=lay.pp_stride * lay.pp))
