"""Hardware FLOPs per GPU per step, recomputation included (for HFU).

Legend: m micro-batches per step, L_s layers of the critical stage, t tensor-parallel
degree, p pipeline stages, T tokens per micro-batch on one CP rank, s sequence length,
D multi-token-prediction modules.
"""

from __future__ import annotations

import numpy as np

from ..plan.axes import Recompute
from ..specs.model import ModelSpec
from .flops import LayerFlops, lm_head_forward_flops, moe_down_proj_flops, moe_forward_flops, mtp_forward_flops
from .layout import Layout
from ..plan.axes import RecomputeOp
from .memory import holds, op_sac_matmuls


def hardware_flops_per_step(model: ModelSpec, lay: Layout, lf: LayerFlops, seq_len, flash, early_stop,
                            op_sac_attention_kept):
    """FLOPs one GPU runs per step: three passes of its layers and its share of the head and
    MTP modules, plus what recomputation re-runs (`flash`: a fused attention kernel;
    `early_stop`: checkpointing stops before the down-projections; `op_sac_attention_kept`:
    per-op checkpointing keeps the attention's output, Plan.op_sac_attention_kept)."""
    m, L_s, t, p, T = lay.num_microbatches, lay.stage_layers, lay.tp, lay.pp, lay.tokens_per_microbatch
    rc, rc_layers, w_moe, w_dense = lay.recompute_code, lay.recomputed_layers, lay.moe_layer_share, lay.dense_layer_share
    # per-rank FLOPs of an average layer: expert FLOPs split over the EP group like the tokens
    layer_flops = lf.total - (1.0 - w_dense) * lf.mlp + w_moe * moe_forward_flops(model, T)
    hw_layer = 3.0 * layer_flops / t
    # early stop: no down-projections (dense MLP; routed and shared experts of MoE layers)
    down_flops = w_dense * lf.mlp / model.num_mlp_matrices + w_moe * moe_down_proj_flops(model, T)
    rc_layer_flops = layer_flops - np.where(early_stop, down_flops, 0.0)
    rc_sel = np.where(rc == Recompute.SELECTIVE.code, L_s * lf.attn_core / t, 0.0)
    rc_mod = np.where(rc == Recompute.MODULES.code,
                      L_s * (np.where(flash, 0.0, lf.attn_core) + 2.0 * T * model.mla_up_proj_params) / t, 0.0)
    # per-op checkpointing re-runs the matmuls it did not keep: 2·T·out·inner each
    attn_mm, mlp_mm = op_sac_matmuls(model, t, kept=False)
    rc_op = np.where(rc == Recompute.OP_SAC.code,
                     L_s * (2.0 * T * (sum(o * i for o, i in attn_mm) + w_dense * sum(o * i for o, i in mlp_mm))
                            + np.where(op_sac_attention_kept, 0.0, lf.attn_core / t)), 0.0)
    # a searched set re-runs the GEMMs and attention of the tensors it drops (recompute_set.py)
    ops = lay.recompute_ops_code
    rc_set = L_s * (np.where(holds(ops, RecomputeOp.QKV), lf.qkv, 0.0)
                    + np.where(holds(ops, RecomputeOp.ATTN) | holds(ops, RecomputeOp.SCORES), lf.attn_core, 0.0)
                    + np.where(holds(ops, RecomputeOp.RESID), lf.out_proj, 0.0)
                    + np.where(holds(ops, RecomputeOp.UP),
                               w_dense * lf.mlp * (model.num_mlp_matrices - 1) / model.num_mlp_matrices, 0.0)) / t
    rc_op = rc_op + rc_set
    # (the head, and each MTP block recomputed as a layer of its stage but under first-k, on one
    # stage of p: per GPU, a p-th)
    hw = m * (L_s * hw_layer + rc_layers * rc_layer_flops / t + rc_sel + rc_mod + rc_op
              + 3.0 * lm_head_forward_flops(model, T) / t / p)
    D = model.mtp_layers
    if D:
        mtp_rc_hw = D * np.where(rc == Recompute.FIRST_K.code, 0.0,
                                 (rc_layers * rc_layer_flops / t + rc_sel + rc_mod + rc_op) / L_s)
        hw = hw + m * (3.0 * mtp_forward_flops(model, T, seq_len) / t + mtp_rc_hw) / p
    return hw
