"""FLOPs per operator of a decoder-only transformer.

Notation (Narayanan et al. SC'21; Korthikanti et al. 2022):
  s sequence length, b micro-batch size, h hidden size, f ffn hidden size,
  a attention heads, k kv heads, d head dim, l layers, V vocabulary.
A GEMM of (m×k)·(k×n) costs 2mkn FLOPs. Backward of a GEMM costs 2× its forward
(input and weight gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs.model import ModelSpec

# FlashAttention-2's backward runs 5 matmuls against the forward's 2 (Dao 2023, Sec. 3.1),
# i.e. 2.5x the forward FLOPs.
FLASH_BWD_OVER_FWD = 2.5
# Causal masking: a kernel that skips masked blocks does half the s^2 work (+ diagonal blocks).
CAUSAL_FRACTION = 0.5
# The head dimensions FlashAttention-2 compiles its kernels for (csrc/flash_attn/src/
# static_switch.h HEADDIM_SWITCH; flash_api.cpp rounds the head size up to the next one):
# a head of 80 or 112 runs the 96- or 128-wide kernel, its matmuls over the padded width.
FLASH2_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256)


def flash2_padding(model: ModelSpec) -> float:
    """FLOPs FlashAttention-2 executes over those the model counts (1.0 for head dims it has
    a kernel for): QK^T over the query/key head dim and AV over the value head dim, each
    rounded up to the kernel's."""
    def padded(d: int) -> int:
        return next((k for k in FLASH2_HEAD_DIMS if k >= d), d)
    d_qk, d_v = model.q_dim // model.num_heads, model.v_dim // model.num_heads
    return (padded(d_qk) + padded(d_v)) / (d_qk + d_v)


@dataclass(frozen=True, kw_only=True)
class LayerFlops:
    """Forward FLOPs of one layer for `tokens` tokens (whole layer, before any TP split)."""

    qkv: float
    attn_core: float  # QK^T and AV, as executed (causal: half)
    out_proj: float
    mlp: float

    @property
    def linear(self) -> float:
        return self.qkv + self.out_proj + self.mlp

    @property
    def total(self) -> float:
        return self.linear + self.attn_core


def causal_attention_span(model: ModelSpec, seq_len):
    """Keys a query attends to, averaged over positions and layers, over a full causal
    layer's (s/2): 1 without sliding windows. A windowed layer's query at position i sees
    min(i, w) keys, Σ = s·w − w²/2 for s > w (Beltagy et al. 2020, Longformer Sec. 3.1;
    GPT-OSS model card: a 128-token band on every other layer)."""
    w, n = model.sliding_window, model.num_sliding_window_layers
    if not w:
        return 1.0
    s = np.asarray(seq_len, dtype=float)
    windowed = np.where(s > w, (s * w - w * w / 2.0) / (s * s / 2.0), 1.0)
    return ((model.num_layers - n) + n * windowed) / model.num_layers


def layer_forward_flops(model: ModelSpec, tokens, seq_len, *, causal: bool = True) -> LayerFlops:
    """Forward FLOPs of one transformer layer over `tokens` tokens of sequences of `seq_len`.

    QKV 2·t·h·(a·d + 2·k·d); scores+AV 4·t·s·a·d (×1/2 causal, × the layers' mean span
    under sliding windows); out 2·t·a·d·h; MLP 2·t·h·f·(3 gated | 2). Narayanan et al.
    SC'21 Sec. 5.1 for the MHA/4h case.
    """
    h, f = model.hidden_size, model.ffn_hidden_size
    qkv = 2.0 * tokens * model.qkv_params_per_layer
    # QK^T over a·d plus AV over a·d_v (equal unless MLA)
    core = 2.0 * tokens * seq_len * (model.q_dim + model.v_dim) * (
        CAUSAL_FRACTION * causal_attention_span(model, seq_len) if causal else 1.0)
    out = 2.0 * tokens * model.v_dim * h
    mlp = 2.0 * tokens * h * f * model.num_mlp_matrices
    return LayerFlops(qkv=qkv, attn_core=core, out_proj=out, mlp=mlp)


def moe_forward_flops(model: ModelSpec, tokens) -> float:
    """Forward FLOPs of one MoE layer's feed-forward part (0 for a dense model).

    Router 2·t·h·E, k routed experts 2·t·k·h·f_e·n_mat, shared experts 2·t·h·f_sh·n_mat
    (Fedus et al. 2022 Sec. 2; DeepSeek-V3 report Sec. 2.1.2 for shared experts).
    """
    if not model.is_moe:
        return 0.0
    n = model.num_mlp_matrices
    h = model.hidden_size
    return 2.0 * tokens * h * (model.num_experts + model.top_k * n * model.moe_ffn_hidden_size
                               + n * model.shared_expert_ffn_hidden_size)


def moe_down_proj_flops(model: ModelSpec, tokens) -> float:
    """The down-projection part of `moe_forward_flops`: 2·t·h·(k·f_e + f_sh)."""
    if not model.is_moe:
        return 0.0
    return 2.0 * tokens * model.hidden_size * (model.top_k * model.moe_ffn_hidden_size
                                                + model.shared_expert_ffn_hidden_size)


def lm_head_forward_flops(model: ModelSpec, tokens) -> float:
    """Logits GEMM 2·t·h·V (the embedding lookup itself is a gather, ~0 FLOPs)."""
    return 2.0 * tokens * model.hidden_size * model.vocab_size


def mtp_projection_forward_flops(model: ModelSpec, tokens) -> float:
    """One multi-token-prediction module's projection M_k of the concatenated, normed hidden
    state and next-token embedding, 2h -> h: 2·t·2h·h (DeepSeek-V3 report Sec. 2.2, Eq. 21)."""
    return 4.0 * tokens * model.hidden_size * model.hidden_size


def mtp_forward_flops(model: ModelSpec, tokens, seq_len, *, causal: bool = True) -> float:
    """Forward FLOPs of the D multi-token-prediction modules (0 without): each its
    projection, one transformer block (an MoE layer in an MoE model) and the shared output
    head over the same tokens (DeepSeek-V3 report Sec. 2.2, Fig. 3)."""
    if not model.mtp_layers:
        return 0.0
    lf = layer_forward_flops(model, tokens, seq_len, causal=causal)
    ffn = moe_forward_flops(model, tokens) if model.is_moe else lf.mlp
    block = lf.total - lf.mlp + ffn
    return model.mtp_layers * (mtp_projection_forward_flops(model, tokens) + block
                               + lm_head_forward_flops(model, tokens))


def model_flops_per_token(model: ModelSpec, seq_len: int, *, causal: bool = False) -> float:
    """Training FLOPs per token, forward + backward = 3× forward, without recomputation.

    This is paraplan's MFU convention (PaLM, Chowdhery et al. 2022, App. B: 6N + attention):
    attention counted over the full s×s (causal=False) unless asked otherwise. For an MoE
    model N is the active parameters: each token's k routed experts, not all E. Multi-token
    prediction modules count (NeMo's reported DeepSeek-V3 TFLOP/s do: tests/golden/
    test_mtp.py).
    """
    lf = layer_forward_flops(model, 1.0, seq_len, causal=causal)
    layers = (model.num_layers * (lf.total - lf.mlp) + model.num_dense_mlp_layers * lf.mlp
              + model.num_moe_layers * moe_forward_flops(model, 1.0))
    return 3.0 * (layers + lm_head_forward_flops(model, 1.0) + mtp_forward_flops(model, 1.0, seq_len, causal=causal))


def megatron_flops_per_iteration(model: ModelSpec, batch: int, seq_len: int) -> float:
    """Narayanan et al. SC'21 Eq. (3): 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)).

    Counts full activation recomputation (4 forward-equivalents); GPT with f = 4h, MHA.
    """
    B, s, l, h, V = batch, seq_len, model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))
