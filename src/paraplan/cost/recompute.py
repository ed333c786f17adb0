"""Recomputation per micro-batch on the critical stage: full, first-k, selective, modules, per-op, a set.

Legend: L_s layers of the critical stage, T tokens per micro-batch on one CP rank, t
tensor-parallel degree, h hidden size, qd query width, d_nope a head's non-RoPE width.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..num import Num
from ..plan.axes import Recompute
from ..specs.hardware import GPUSpec
from ..specs.model import ModelSpec
from .cp import CPComm
from .layer_compute import LayerCompute
from .layout import Layout
from .memory import op_sac_matmuls
from .moe import MoELayerCosts
from .recompute_set import op_costs, set_cost
from .roofline import elementwise_time_s, gemm_time_s
from .tp import TPComm


@dataclass(frozen=True, kw_only=True)
class Recomputation:
    """What recomputation adds to a stage's backward per micro-batch (seconds), by kind."""

    compute_s: Num          # re-run compute (reported as recomputation)
    tp_s: Num               # the re-run layers' exposed TP (reported as TP time)
    cp_s: Num
    ep_s: Num
    early_stop: Num         # plan.checkpoint_early_stop

    @property
    def total_s(self):
        return self.compute_s + self.tp_s + self.cp_s + self.ep_s


def modules_forward_s(gpu: GPUSpec, model: ModelSpec, lay: Layout, lc: LayerCompute, mc: MoELayerCosts | None):
    """What module recomputation re-runs of one layer's forward.

    Module recomputation (Megatron-Core --recompute-modules [core_attn] layernorm moe_act
    mla_up_proj) re-runs the norms Megatron runs as separate modules (MLA's input norm, an
    MoE layer's pre-MLP norm: read and write h each), the routed experts' activation
    function, MLA's up-projections from the latents, and the attention core only when it
    is unfused (a fused kernel stores no scores; Megatron warns core_attn is then useless)."""
    T, t, prec, zeros = lay.tokens_per_microbatch, lay.tp, lay.precision, 0.0 * lay.stage_layers
    qd, h, w_moe = model.q_dim, model.hidden_size, lay.moe_layer_share
    d_nope = model.head_dim - model.qk_rope_head_dim
    mla_up = (gemm_time_s(gpu, T, qd / t, model.q_lora_rank, prec) if model.q_lora_rank else zeros) + (
        gemm_time_s(gpu, T, model.num_heads * (d_nope + (model.v_head_dim or model.head_dim)) / t,
                    model.kv_lora_rank, prec) if model.is_mla else zeros)
    norms_recomputed = (1.0 if model.is_mla else 0.0) + w_moe
    return (np.where(lc.flash, 0.0, lc.attention_forward_s) + mla_up + (w_moe * mc.act_fn_fwd_s if mc else zeros)
            + elementwise_time_s(gpu, lay.act_bytes_per_element * T * 2.0 * h * norms_recomputed / lay.sp_divisor,
                                 norms_recomputed))


def op_sac_forward_s(gpu: GPUSpec, model: ModelSpec, plan, lay: Layout, lc: LayerCompute):
    """What torchtitan's per-op checkpointing re-runs of one layer's forward: the matmuls it
    did not keep (memory.py op_sac_matmuls; an MoE layer's attention ones) on the layer's T
    tokens, and every element-wise kernel (norms, RoPE, activation, residual adds); the
    attention kernel where its output is not kept (Plan.op_sac_attention_kept)."""
    T, prec = lay.tokens_per_microbatch, lay.precision
    attn, mlp = op_sac_matmuls(model, lay.tp, kept=False)

    def gemms_s(matmuls):
        return sum(gemm_time_s(gpu, T, out, inner, prec) for out, inner in matmuls)
    attention_s = np.where(np.asarray(plan.op_sac_attention_kept, dtype=bool), 0.0, lc.attention_forward_s)
    return gemms_s(attn) + lay.dense_layer_share * gemms_s(mlp) + lc.elementwise_forward_s + attention_s


def recomputation(gpu: GPUSpec, model: ModelSpec, plan, lay: Layout, lc: LayerCompute, layer_forward_s,
                  tp: TPComm, cp: CPComm, ep_forward_exposed_s, mc: MoELayerCosts | None) -> Recomputation:
    """Recomputation on the critical stage per micro-batch; `layer_forward_s` the layer's
    forward compute as re-run (with a gathered weight's casts)."""
    rc, L_s, rc_layers, w_dense = lay.recompute_code, lay.stage_layers, lay.recomputed_layers, lay.dense_layer_share
    modules_fwd = modules_forward_s(gpu, model, lay, lc, mc)
    # Full and first-k re-run whole layers (forward plus its exposed TP and CP); selective
    # re-runs the attention core only. PyTorch's non-reentrant checkpoint stops once every
    # tensor the backward needs exists again: the block's last GEMM (the MLP down-projection,
    # whose input the activation function already produced) and its output reduction are not
    # re-run. The exposed TP/CP of recomputation is reported as TP/CP time, not recompute.
    early = np.asarray(plan.checkpoint_early_stop, dtype=bool)
    last_gemm = w_dense * lc.down_gemm_s + (lay.moe_layer_share * mc.last_gemm_s if mc else 0.0 * L_s)
    # a searched set re-runs its tensors' producers (recompute_set.py), each layer of the stage
    ops = (set_cost(lay.recompute_ops_code, op_costs(gpu, model, plan, lay, lc, tp, cp))
           if np.any(rc == Recompute.SET.code) else None)
    rc_compute_stage = (rc_layers * (layer_forward_s - np.where(early, last_gemm, 0.0))
                        + (L_s * ops.compute_s if ops else 0.0)
                        + np.where(rc == Recompute.SELECTIVE.code, L_s * lc.attention_forward_s, 0.0)
                        + np.where(rc == Recompute.MODULES.code, L_s * modules_fwd, 0.0)
                        + (np.where(rc == Recompute.OP_SAC.code, L_s * op_sac_forward_s(gpu, model, plan, lay, lc), 0.0)
                           if np.any(rc == Recompute.OP_SAC.code) else 0.0))  # (a fused engine's search has none)
    # per-op checkpointing keeps the reduce-scatters' outputs and re-runs the gathers that
    # feed its re-run matmuls (without SP, the attention output's all-reduce): about half of
    # the layer's forward TP traffic
    rc_tp_stage = (rc_layers * np.where(early, 0.5, 1.0) * tp.forward_exposed_s
                   + np.where(rc == Recompute.OP_SAC.code, 0.5 * L_s * tp.forward_exposed_s, 0.0)
                   + (L_s * ops.tp_s if ops else 0.0))
    # the attention core recomputed alone still holds the CP exchange (Transformer Engine's
    # context-parallel attention does its K/V traffic inside the checkpointed kernel)
    rc_attn = np.where(rc == Recompute.SELECTIVE.code, 1.0,
                       np.where((rc == Recompute.MODULES.code) & ~lc.flash, 1.0, 0.0))
    rc_cp_stage = (rc_layers + L_s * rc_attn) * cp.forward_exposed_s + (L_s * ops.cp_s if ops else 0.0)
    # the recomputed dispatch runs inside the backward pass, not under another micro-batch's
    # compute: it stays exposed even with EP overlap. Early stop skips the combine.
    rc_ep_stage = rc_layers * np.where(early, 0.5, 1.0) * ep_forward_exposed_s
    return Recomputation(compute_s=rc_compute_stage, tp_s=rc_tp_stage, cp_s=rc_cp_stage, ep_s=rc_ep_stage,
                         early_stop=early)
