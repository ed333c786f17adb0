"""Partitioning layouts for inference and their communication volume (Pope et al. 2022).

Notation (Pope et al., "Efficiently Scaling Transformer Inference", arXiv 2211.05102):
B batch, L tokens per sequence in this pass (prompt length in prefill, 1 in decode), E
d_model, F d_ff, n chips, BL tokens in the pass. Volumes are bytes each chip sends (and
receives) per transformer layer for the feed-forward block; the attention block's input and
output ride on the same collectives in PaLM's parallel formulation.

- 1D weight-stationary (Sec. 3.2.1; Megatron TP): weights split on F over all n chips;
  each layer all-gathers and reduce-scatters the BL×E activations: 2·BL·E elements per
  chip, independent of n — it stops scaling once communication dominates.
- 2D weight-stationary (Sec. 3.2.2): weights split on E over X chips and on F over YZ
  chips (X·YZ = n); the activations move along both axes: 2·BL·E/X + 2·BL·F/YZ, least at
  X = √(n·E/F), which gives 4·BL·√(E·F/n) — Pope's 8·BL·E/√n for F = 4E. Scales as 1/√n.
- Weight-gathered (Sec. 3.2.3; "XYZ-weight-gathered"): activations stay split over the
  batch and each layer's weights are all-gathered from all n chips: each chip receives
  (n−1)/n of the layer's weight bytes. Independent of the batch: it wins once BL is large.
"""

from __future__ import annotations

import math

from .deploy import Layout


def ws1d_elements(tokens: float, d_model: float) -> float:
    """Activation elements each chip moves per layer, 1D weight-stationary (Pope Sec. 3.2.1)."""
    return 2.0 * tokens * d_model


def ws2d_best_x(d_model: float, d_ff: float, n: int) -> float:
    """Chips on the d_model axis that minimize 2D weight-stationary traffic: √(n·E/F)."""
    return math.sqrt(n * d_model / d_ff)


def ws2d_elements(tokens: float, d_model: float, d_ff: float, n: int) -> float:
    """2·BL·E/X + 2·BL·F/YZ at the best X: 4·BL·√(E·F/n) (Pope Sec. 3.2.2)."""
    return 4.0 * tokens * math.sqrt(d_model * d_ff / n)


def weight_gathered_bytes(layer_weight_bytes: float, n: int) -> float:
    """Weight bytes each chip receives per layer when weights are all-gathered (Sec. 3.2.3)."""
    return (n - 1) / n * layer_weight_bytes


def comm_bytes_per_layer(layout: Layout, *, tokens: float, d_model: int, d_ff: int, n: int,
                         act_bytes: float, layer_weight_bytes: float) -> float:
    """Bytes one chip sends per layer under `layout` (zero on one chip)."""
    if n <= 1:
        return 0.0
    if layout is Layout.WS_1D:
        return ws1d_elements(tokens, d_model) * (n - 1) / n * act_bytes
    if layout is Layout.WS_2D:
        return ws2d_elements(tokens, d_model, d_ff, n) * act_bytes
    if layout is Layout.WG_XYZ:
        return weight_gathered_bytes(layer_weight_bytes, n)
    raise AssertionError(layout)  # pragma: no cover - closed enum


def best_layout(*, tokens: float, d_model: int, d_ff: int, n: int, act_bytes: float,
                layer_weight_bytes: float) -> Layout:
    """The layout that moves the fewest bytes for this many tokens (Pope Fig. 3's crossover)."""
    return min(Layout, key=lambda lay: comm_bytes_per_layer(
        lay, tokens=tokens, d_model=d_model, d_ff=d_ff, n=n, act_bytes=act_bytes,
        layer_weight_bytes=layer_weight_bytes))
