"""Per micro-batch times of the first, a middle and the last pipeline stage.

A stage runs its layers (each forward and backward with its exposed communication), the
ends it holds (embedding; head, loss and MTP modules), its recomputation, the first
ZeRO-3 gather of each pass, and waits for an eager host.

Legend: L_s layers of the critical (fullest) stage; L a stage's layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from ..plan.axes import Recompute
from ..specs.hardware import ClusterSpec, GPUSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .activation_offload import ActivationOffload, offloaded_layers
from .amax import amax_reduction_s
from .bf16_layers import bf16_layer_extra_s, bf16_layers_on_end_stages
from .host import eager_host_wait
from .layer_compute import LayerCompute
from .layout import Layout
from .moe import MoELayerCosts, dropless
from .overlap import LayerTimes
from .recompute import Recomputation
from .stage_ends import StageEnds
from .zero import ZeroTraffic


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    """Per micro-batch times of one pipeline stage (one model chunk = L_s/v layers × v)."""

    forward_s: Num       # compute + exposed per-micro-batch comm, whole stage
    backward_s: Num      # incl. recomputation and exposed comm
    weight_grad_s: Num   # part of backward that is weight-gradient GEMMs (for ZB-H1)


@dataclass(frozen=True, kw_only=True)
class Stages:
    """The first, a middle and the last stage, and their waits for an eager host."""

    first: StageTimes
    middle: StageTimes
    last: StageTimes
    host_waits: tuple     # (forward, backward, W pass) wait per micro-batch of each of the three
    layers: tuple         # layers of each of the three
    # FP8 delayed scaling's 2v amax all-reduces a micro-batch, on every stage (amax.py)
    amax_reductions_per_microbatch_s: Num = 0.0

    def host_wait_per_layer(self) -> tuple:
        """(forward, backward, W pass) per layer, for the breakdown: the stage that waits most
        per layer (the last one's LM head lets its host catch up; a middle stage has nothing
        to hide its host behind). Computed when asked: the search never reads it."""
        return tuple(np.maximum.reduce([np.asarray(w[i], dtype=float) / np.maximum(layers, 1.0)
                                        for layers, w in zip(self.layers, self.host_waits)]) for i in (0, 1, 2))


def _stage_parts(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, lay: Layout,
                 ends: StageEnds, bf16_args):
    """(layers, forward extra, backward extra) of the first, a middle and the last stage
    (under ZB-V the first rank holds the embedding and the head, the last rank neither)."""
    L_first, L_s, L_last = lay.first_stage_layers, lay.stage_layers, lay.last_stage_layers
    v_shape, only, holds_ends = lay.v_shape, lay.single_stage, lay.first_holds_ends
    emb_fwd, emb_bwd = ends.embedding_forward_s, ends.embedding_backward_s
    lm_fwd, lm_bwd = ends.head_forward_s, ends.head_backward_s
    parts: tuple = ((L_first, emb_fwd + np.where(holds_ends, lm_fwd, 0.0), emb_bwd + np.where(holds_ends, lm_bwd, 0.0)),
                    (L_s, 0.0, 0.0),
                    (L_last, np.where(v_shape, 0.0, np.where(only, emb_fwd, 0.0) + lm_fwd),
                     np.where(v_shape, 0.0, lm_bwd + np.where(only, emb_bwd, 0.0))))
    n_first, n_last = bf16_layers_on_end_stages(model, lay)
    if np.any(n_first + n_last):
        # NVFP4's BF16 first and last layers, on the stages that hold them
        extra_fwd, extra_bwd = bf16_layer_extra_s(model, cluster, workload, plan, lay, *bf16_args)
        parts = tuple((layers, fwd + n * extra_fwd, bwd + n * extra_bwd)
                      for (layers, fwd, bwd), n in zip(parts, (n_first, 0.0, n_last)))
    return parts


def _host_wait(gpu: GPUSpec, plan, lay: Layout, layer: LayerTimes, rc_stage, wgrad, layers, extra_fwd, extra_bwd):
    """An eager engine's GPU waiting for its host, (forward, backward, W pass) per micro-batch
    (gpu.eager_layer_host_s; 0 in the presets: nothing computed in the search's batches)."""
    if gpu.eager_layer_host_s <= 0.0:
        return 0.0, 0.0, 0.0
    share = _recompute_share(lay, layers)
    per_layer = 1.0 / np.maximum(layers, 1.0)
    return eager_host_wait(gpu, plan, layers, layer.forward_s,
                           layer.backward_s + share * rc_stage * per_layer,
                           extra_fwd + extra_bwd, lay.num_microbatches,
                           recomputed=np.minimum(share * lay.recomputed_layers * per_layer, 1.0),
                           layer_wgrad_s=wgrad)


def moe_dispatch_gaps(gpu: GPUSpec, plan, layer: LayerTimes, mc: MoELayerCosts | None):
    """(forward, backward) wait of one MoE layer for a host that blocks at every dropless
    dispatch, before the stage's share of MoE layers (stage_waits), or None where no host
    blocks. Megatron-Core's token dispatchers copy the routed token counts
    to the host and synchronize on them in each MoE layer's forward before the all-to-all
    (token_dispatcher.py, MoEAlltoAllTokenDispatcher: cuda_sync_point "before_ep_alltoall", or
    "before_finish" without EP; none when dropping and padding to capacity): the GPU's queue
    is empty after it, so the host cannot run ahead across MoE layers, and a layer lasts at
    least the host time that issues it, h = gpu.moe_dispatch_host_s for its forward and 2h
    for its backward (HOST_FORWARD_SHARE: the backward issues about twice the kernels): each
    pass lasts at least its host time. Under EP overlap a synchronization window holds one
    micro-batch's forward layer beside another's backward layer; each pass keeps its own bound
    (the window's is their sum), so that slower compute never shortens a pass and the
    backward's data-parallel window holds only the backward's wait. There the blocks of each
    pass run beside the other's all-to-alls (ep.py), and what of those stays exposed lasts in
    this pass's pairs, though counted with the other pass's time: each pass's bound is taken
    on its own blocks with the exposure beside them (else a slower forward attention, hiding
    more of the backward's all-to-all, would shorten its own wait and the step). Vectorized."""
    h = gpu.moe_dispatch_host_s
    if h <= 0.0 or mc is None:
        return None
    syncs = np.asarray(plan.fused_kernels, dtype=bool) & dropless(plan)
    swap = np.where(np.asarray(plan.ep_overlap, dtype=bool), layer.ep_backward_exposed_s - layer.ep_forward_exposed_s,
                    0.0)
    return syncs, np.maximum(h - (layer.forward_s + swap), 0.0), np.maximum(2.0 * h - (layer.backward_s - swap), 0.0)


def stage_waits(gpu: GPUSpec, plan, lay: Layout, layer: LayerTimes, rc_stage, wgrad, moe_gaps, layers, extra_fwd,
                extra_bwd):
    """A stage's (forward, backward, W pass) wait per micro-batch: for an eager host
    (_host_wait) and, in its MoE layers, for the host a dropless dispatch blocks
    (moe_dispatch_gaps)."""
    host = _host_wait(gpu, plan, lay, layer, rc_stage, wgrad, layers, extra_fwd, extra_bwd)
    if moe_gaps is None:
        return host
    syncs, gap_fwd, gap_bwd = moe_gaps
    moe_layers = np.where(syncs, layers * lay.moe_layer_share, 0.0)
    return host[0] + moe_layers * gap_fwd, host[1] + moe_layers * gap_bwd, host[2]


def _recompute_share(lay: Layout, layers):
    """Recomputation scales with the stage's layers, except first-k's fixed k per stage."""
    return np.where(lay.recompute_code == Recompute.FIRST_K.code, 1.0, layers / lay.stage_layers)


def stage_times(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, lay: Layout, lc: LayerCompute,
                layer: LayerTimes, rc: Recomputation, z: ZeroTraffic, ends: StageEnds,
                mc: MoELayerCosts | None, offload: ActivationOffload | None = None) -> Stages:
    """The three stages' per micro-batch times (with the exposed copies of their offloaded
    layers' activations: activation_offload.py)."""
    rc_stage, wgrad = rc.total_s, lc.weight_grad_s
    # (NVFP4's BF16 layers are priced against the layer's GEMMs and the gathered weights' cast)
    parts = _stage_parts(model, cluster, workload, plan, lay, ends, (lc, z.gathered_cast_s, mc))
    gaps = moe_dispatch_gaps(cluster.gpu, plan, layer, mc)
    waits = [stage_waits(cluster.gpu, plan, lay, layer, rc_stage, wgrad, gaps, *p) for p in parts]
    # one amax all-reduce at the end of each of the stage's v chunk passes, forward and backward
    amax_s = lay.vp * amax_reduction_s(cluster, model, workload, plan, lay)

    def stage(layers, extra_fwd, extra_bwd, wait):
        fwd = layers * layer.forward_s + extra_fwd + z.first_gather_s + amax_s
        bwd = (layers * layer.backward_s + extra_bwd + _recompute_share(lay, layers) * rc_stage + z.first_gather_s
               + amax_s)
        if offload is not None:
            offloaded = offloaded_layers(plan, lay, layers)
            fwd = fwd + offloaded * offload.forward_exposed_s
            bwd = bwd + offloaded * offload.backward_exposed_s
        return StageTimes(forward_s=fwd + wait[0], backward_s=bwd + wait[1], weight_grad_s=layers * wgrad + wait[2])
    first, middle, last = (stage(layers, fwd, bwd, w) for (layers, fwd, bwd), w in zip(parts, waits))
    return Stages(first=first, middle=middle, last=last, host_waits=tuple(waits), layers=tuple(p[0] for p in parts),
                  amax_reductions_per_microbatch_s=2.0 * amax_s)
