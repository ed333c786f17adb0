"""Activation offload: the activations a layer saves for its backward, to host memory and back.

μ-two (Purandare et al., MLSys 2023) swaps tensors to host memory only as needed and
overlaps each swap with independent compute. Megatron-Core's layer-level CPU offloading
(`cpu_offloading_num_layers`; transformer/cpu_offload.py, double-buffered) does it per
layer: the tensors layer i saves are copied to the host on a side stream while layer i+1
runs its forward, and fetched back while layer i+1 runs its backward, ahead of layer i's.
A copy longer than that neighbour's compute shows, per offloaded layer and micro-batch:

    forward_exposed  = max(0, c - t_forward),   backward_exposed = max(0, c - t_backward),
    c = (bytes the layer saves for one micro-batch) / (offload rate),

t_forward, t_backward the layer's times with their exposed communication (overlap.py),
the offload rate the GPU's host link one way, or its share of the host's DRAM bandwidth where
every GPU of the host offloads at once and that is less (ClusterSpec.offload_bytes_per_s: one
Grace serves two GPUs in GB200/GB300 NVL72). What stays on the GPU and what the host holds is
stage_memory.py's.

Not modelled: the HBM bandwidth the copies take from the kernels beside them (450 GB/s out of
8 TB/s on a GB200, about 6%), other traffic on the host link (optimizer offload, checkpoints,
data loading), and pinned-buffer setup.

Legend: j offloaded layers per stage, c one layer's copy one way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .layout import Layout
from .memory import layer_activation_bytes
from .overlap import LayerTimes


@dataclass(frozen=True, kw_only=True)
class ActivationOffload:
    """One offloaded layer's copy and what of it shows, per micro-batch (seconds)."""

    copy_s: Num               # c: its saved activations over the host link, one way
    forward_exposed_s: Num
    backward_exposed_s: Num

    def hidden_s(self):
        """One offloaded layer's copies (out and back) hidden under compute."""
        return 2.0 * self.copy_s - self.forward_exposed_s - self.backward_exposed_s


def offloaded_layers(plan, lay: Layout, layers):
    """j of a stage's `layers`, at most those first-k recomputation leaves whole: each layer of
    a stage is recomputed (first-k's first k), offloaded (the next j) or kept (the rest)."""
    return np.minimum(np.asarray(plan.activation_offload_layers, dtype=float),
                      np.maximum(layers - lay.first_k_layers, 0.0))


def activation_offload(cluster: ClusterSpec, model: ModelSpec, workload: Workload, plan, lay: Layout,
                       layer: LayerTimes, moe_activations) -> ActivationOffload | None:
    """The copies of a plan's offloaded layers; None where no plan of the batch offloads (an
    offloaded layer saves what the policy keeps: under first-k, a layer kept whole).
    `moe_activations`: an MoE layer's stored bytes and its activation function's outputs (moe.py)."""
    if not np.any(plan.activation_offload_layers):
        return None
    moe_act, moe_act_fn_out = moe_activations
    saved, _, _ = layer_activation_bytes(
        model, plan, workload.seq_len, recompute_code=lay.recompute_code, mlp_weight=lay.dense_layer_share,
        extra_bytes=lay.moe_layer_share * moe_act, modules_extra_saving=lay.moe_layer_share * moe_act_fn_out,
        precision=lay.precision)
    copy_s = saved / cluster.offload_bytes_per_s
    return ActivationOffload(copy_s=copy_s, forward_exposed_s=np.maximum(copy_s - layer.forward_s, 0.0),
                             backward_exposed_s=np.maximum(copy_s - layer.backward_s, 0.0))
