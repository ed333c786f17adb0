"""Golden: FLOP counts reproduce Narayanan et al. SC'21 (arXiv 2104.04473) and Megatron-Core.

* Eq. (3), FLOPs per iteration with full recomputation: 96·B·s·l·h²·(1 + s/(6h) + V/(16lh)),
  for GPT with MHA and f = 4h. It is four forward passes of every layer (forward, backward
  = 2×, recomputed forward) plus three of the logits layer (not recomputed).
* Table 1 (weak scaling, 1.7B to 1T on A100) and Sec. 5.1's end-to-end training times.
* Megatron-Core's `num_floating_point_operations` (Megatron-LM megatron/training/training.py),
  the convention paraplan uses for MFU: forward + backward, no recomputation, attention
  over the full s×s.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cost.flops import (layer_forward_flops, lm_head_forward_flops, megatron_flops_per_iteration,
                                 model_flops_per_token)
from paraplan.specs.catalog import load_model
from paraplan.specs.model import make_model
from paraplan.units import PETA, SECONDS_PER_DAY, TERA

SEQ = 2048
A100_BF16_PEAK_TFLOPS = 312.0  # dense FP16/BF16 tensor-core peak (NVIDIA A100 datasheet)

# Narayanan et al. SC'21 Table 1: (preset, GPUs, global batch, achieved TFLOP/s per GPU,
# % of theoretical peak, aggregate PFLOP/s).
TABLE_1 = [
    ("megatron-gpt-1.7b", 32, 512, 137, 44, 4.4),
    ("megatron-gpt-3.6b", 64, 512, 138, 44, 8.8),
    ("megatron-gpt-7.5b", 128, 512, 142, 46, 18.2),
    ("megatron-gpt-18b", 256, 1024, 135, 43, 34.6),
    ("megatron-gpt-39b", 512, 1536, 138, 44, 70.8),
    ("megatron-gpt-76b", 1024, 1792, 140, 45, 143.8),
    ("megatron-gpt-145b", 1536, 2304, 148, 47, 227.1),
    ("megatron-gpt-310b", 1920, 2160, 155, 50, 297.4),
    ("mt-nlg-530b", 2520, 2520, 163, 52, 410.2),
    ("megatron-gpt-1t", 3072, 3072, 163, 52, 502.0),
]


def _megatron_core_flops(model, batch: int, seq: int) -> float:
    """Megatron-LM `num_floating_point_operations(args, batch_size)` for a dense model,
    written as in megatron/training/training.py (2024, before MLA / MoE-layer terms):

        12·B·s·l·h²·( (1 + k/a + s/h)·(q/h) + (f/h)·(3/2 if swiglu else 1) + V/(2·l·h) )

    with q = kv_channels·a the query projection size and k the query groups (GQA).
    """
    B, s, l, h = batch, seq, model.num_layers, model.hidden_size
    a, k, f, V = model.num_heads, model.num_kv_heads, model.ffn_hidden_size, model.vocab_size
    q = model.head_dim * a
    gated = 3.0 / 2.0 if model.gated_mlp else 1.0
    return 12.0 * B * s * l * h * h * ((1.0 + k / a + s / h) * (q / h) + (f / h) * gated + V / (2.0 * l * h))


@pytest.mark.parametrize("name", [row[0] for row in TABLE_1] + ["gpt3-175b"])
def test_eq3_is_four_layer_passes_plus_three_logit_passes(name):
    # The derivation behind Eq. (3), from paraplan's per-operator counts (flops.py).
    model = load_model(name)
    B = 8
    tokens = B * SEQ
    layer = layer_forward_flops(model, tokens, SEQ, causal=False).total
    by_operator = 4.0 * model.num_layers * layer + 3.0 * lm_head_forward_flops(model, tokens)
    assert megatron_flops_per_iteration(model, B, SEQ) == pytest.approx(by_operator, rel=1e-12)


@pytest.mark.parametrize("name,gpus,batch,tflops,pct,pflops", TABLE_1, ids=[r[0] for r in TABLE_1])
def test_table1_rows_are_consistent(name, gpus, batch, tflops, pct, pflops):
    # The transcribed row checks itself: per-GPU rate × GPUs = aggregate (1T: 163 × 3072 =
    # 500.7 vs 502.0 PFLOP/s, per-GPU rates are rounded), and rate / 312 = % of peak.
    assert tflops * TERA * gpus / PETA == pytest.approx(pflops, rel=0.01)
    assert 100.0 * tflops / A100_BF16_PEAK_TFLOPS == pytest.approx(pct, abs=1.0)
    # the preset matches the row's shape (Table 1: hidden size and layers)
    model = load_model(name)
    assert model.ffn_hidden_size == 4 * model.hidden_size and model.num_kv_heads == model.num_heads


@pytest.mark.parametrize("name,gpus,batch,tflops,tokens,days", [
    # Sec. 5.1: "GPT-3 ... n = 1024 A100 GPUs, batch size 1536, X = 140 teraFLOP/s per GPU ...
    # 300 billion tokens ... 34 days"; the 1T model on 3072 GPUs at 163 TFLOP/s (Table 1)
    # for 450 billion tokens: 84 days.
    ("gpt3-175b", 1024, 1536, 140, 300e9, 34.0),
    ("megatron-gpt-1t", 3072, 3072, 163, 450e9, 84.0),
])
def test_end_to_end_training_time(name, gpus, batch, tflops, tokens, days):
    model = replace(load_model(name), vocab_size=51200)  # Megatron pads the GPT-2 vocabulary
    iteration_s = megatron_flops_per_iteration(model, batch, SEQ) / (tflops * TERA * gpus)
    got_days = tokens / (batch * SEQ) * iteration_s / SECONDS_PER_DAY
    # The paper's figure uses Eq. (4), 8·T·P/(n·X), which drops Eq. (3)'s s/(6h) and
    # V/(16lh) terms (+1.4% for 1T, +3% for GPT-3); Eq. (3) lands within 3% and above it.
    eq4_days = 8.0 * tokens * model.num_params / (gpus * tflops * TERA) / SECONDS_PER_DAY
    assert eq4_days == pytest.approx(days, rel=0.01)
    assert got_days == pytest.approx(days, rel=0.03)
    assert got_days > eq4_days


def test_1t_model_iteration():
    # The 1T row: F = 96·3072·2048·128·25600²·(1 + 2048/153600 + 51200/(16·128·25600)).
    model = load_model("megatron-gpt-1t")
    expected = 96.0 * 3072 * 2048 * 128 * 25600**2 * (1 + 2048 / (6 * 25600) + 51200 / (16 * 128 * 25600))
    flops = megatron_flops_per_iteration(model, 3072, SEQ)
    assert flops == pytest.approx(expected, rel=1e-12)
    # at the published 163 TFLOP/s per GPU on 3072 GPUs, one iteration takes ~102.6 s
    assert flops / (163 * TERA * 3072) == pytest.approx(102.63, rel=1e-3)


GQA_GATED = [
    load_model("llama3-70b"),     # GQA 64/8, SwiGLU, q = h
    load_model("llama3.1-405b"),  # GQA 128/8
    load_model("mistral-7b"),
    # q = a·d ≠ h: the query_projection_to_hidden_size_ratio term matters
    make_model(name="wide-heads", num_layers=6, hidden_size=2048, num_heads=16, num_kv_heads=4,
               head_dim=256, ffn_hidden_size=5632, vocab_size=32000, gated_mlp=True),
]


@pytest.mark.parametrize("model", GQA_GATED + [load_model("gpt3-175b")], ids=lambda m: m.name)
@pytest.mark.parametrize("seq", [2048, 8192])
def test_model_flops_match_megatron_core(model, seq):
    batch = 16
    ours = model_flops_per_token(model, seq, causal=False) * batch * seq
    assert ours == pytest.approx(_megatron_core_flops(model, batch, seq), rel=1e-12)


def test_causal_counts_half_the_attention_core():
    # causal=True (what the kernels execute) removes half of the 4·s·a·d core per token and
    # layer from each of the three passes: 3 · 2·s·a·d · l.
    model = load_model("llama3-8b")
    s = 8192
    diff = model_flops_per_token(model, s, causal=False) - model_flops_per_token(model, s, causal=True)
    assert diff == pytest.approx(3.0 * 2.0 * s * model.q_dim * model.num_layers, rel=1e-12)


def test_eq3_minus_megatron_core_is_the_recomputed_forward():
    # Eq. (3) (with recomputation) − Megatron-Core (without) = one more forward of the layers.
    model = replace(load_model("gpt3-175b"), vocab_size=51200)
    B = 1536
    extra = B * SEQ * model.num_layers * layer_forward_flops(model, 1.0, SEQ, causal=False).total
    assert megatron_flops_per_iteration(model, B, SEQ) - _megatron_core_flops(model, B, SEQ) == \
        pytest.approx(extra, rel=1e-9)
