"""Golden: activation memory per layer reproduces Korthikanti et al. 2022 (arXiv 2205.05198).

Table 2 ("activations memory per transformer layer") for a GPT layer with multi-head
attention, f = 4h, dropout and unfused (non-Flash) attention, 16-bit activations:

    no parallelism                        sbh (34 + 5as/h)
    tensor parallel (TP)                  sbh (10 + 24/t + 5as/(ht))
    TP + sequence parallel (SP)           sbh (34/t + 5as/(ht))
    TP + selective recompute              sbh (10 + 24/t)
    TP + SP + selective recompute         sbh (34/t)
    full recompute                        2sbh

With full recomputation and SP the stored layer input is itself split over TP (2sbh/t),
as Megatron stores it (Korthikanti Sec. 4.2.2, paraplan cost/memory.py).
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from paraplan.cost.memory import layer_activation_bytes
from paraplan.plan.axes import AttentionKernel, Recompute
from paraplan.plan.plan import make_plan
from paraplan.specs.model import make_model
from paraplan.units import GIB

# Korthikanti et al. Table 3: the 22B model (a=64, h=6144, l=48) on TP=8, micro-batch 4, s=2048.
MEGATRON_22B = make_model(name="korthikanti-22b", num_layers=48, hidden_size=6144, num_heads=64,
                          vocab_size=51200, gated_mlp=False, dropout=True)


def _bytes(model, *, s, b, t, sp, recompute):
    plan = make_plan(tp=t, micro_batch_size=b, sequence_parallel=sp, recompute=recompute,
                     attention=AttentionKernel.UNFUSED)
    stored, _, _ = layer_activation_bytes(model, plan, s, recompute_code=recompute.code)
    return float(stored)


def _table2(*, s, b, h, a, t, sp, recompute):
    """Korthikanti Table 2, in exact rational arithmetic."""
    sbh = Fraction(s * b * h)
    scores = Fraction(5 * a * s, h * t)
    if recompute is Recompute.FULL:
        return 2 * sbh / (t if sp else 1)
    if recompute is Recompute.SELECTIVE:
        return sbh * (Fraction(34, t) if sp else 10 + Fraction(24, t))
    return sbh * ((Fraction(34, t) if sp else 10 + Fraction(24, t)) + scores)


SHAPES = [  # (s, b, h, a, t): GPT-3 175B, the 22B, the 530B and 1T models of Table 3, and odd ones
    (2048, 1, 12288, 96, 8),
    (2048, 4, 6144, 64, 8),
    (2048, 1, 20480, 128, 8),
    (2048, 1, 25600, 160, 8),
    (1024, 2, 1024, 16, 1),
    (4096, 3, 2048, 16, 2),
    (512, 8, 4096, 32, 4),
]


@pytest.mark.parametrize("s,b,h,a,t", SHAPES)
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL])
def test_table2_per_layer(s, b, h, a, t, sp, recompute):
    if sp and t == 1:
        pytest.skip("sequence parallelism needs TP > 1")
    model = make_model(name="mha-4h", num_layers=4, hidden_size=h, num_heads=a, vocab_size=51200,
                       gated_mlp=False, dropout=True)
    expected = _table2(s=s, b=b, h=h, a=a, t=t, sp=sp, recompute=recompute)
    assert _bytes(model, s=s, b=b, t=t, sp=sp, recompute=recompute) == pytest.approx(float(expected), rel=1e-12)


def test_no_parallelism_is_eq_1():
    # Korthikanti Eq. (1): sbh (34 + 5as/h) per layer without any parallelism.
    s, b, h, a = 2048, 1, 12288, 96
    model = make_model(name="gpt3", num_layers=96, hidden_size=h, num_heads=a, vocab_size=51200,
                       gated_mlp=False, dropout=True)
    got = _bytes(model, s=s, b=b, t=1, sp=False, recompute=Recompute.NONE)
    assert got == pytest.approx(s * b * h * (34 + 5 * a * s / h), rel=1e-12)


def test_22b_model_whole_stack_in_gib():
    # Table 2 applied to the 22B configuration of Table 3 (48 layers, TP 8, b 4, s 2048):
    # 26.33 sbh per layer without SP -> 59.25 GiB; 4.25 sbh with SP + selective -> 9.5625 GiB.
    L = MEGATRON_22B.num_layers
    tp_only = L * _bytes(MEGATRON_22B, s=2048, b=4, t=8, sp=False, recompute=Recompute.NONE)
    sp_sel = L * _bytes(MEGATRON_22B, s=2048, b=4, t=8, sp=True, recompute=Recompute.SELECTIVE)
    assert tp_only / GIB == pytest.approx(59.25, rel=1e-12)
    assert sp_sel / GIB == pytest.approx(9.5625, rel=1e-12)
    # SP + selective recomputation: the paper's headline ~5x activation saving
    assert tp_only / sp_sel == pytest.approx((10 + 3 + 5 * 64 * 2048 / (6144 * 8)) / 4.25, rel=1e-12)


def test_flash_attention_drops_the_score_term():
    # FlashAttention never stores the s x s scores: the TP row becomes sbh (10 + 24/t).
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    model = make_model(name="gpt3", num_layers=96, hidden_size=h, num_heads=a, vocab_size=51200,
                       gated_mlp=False, dropout=True)
    plan = make_plan(tp=t, micro_batch_size=b, attention=AttentionKernel.FLASH2)
    stored, _, _ = layer_activation_bytes(model, plan, s, recompute_code=Recompute.NONE.code)
    assert float(stored) == pytest.approx(s * b * h * (10 + 24 / t), rel=1e-12)


def _with_and_without_dropout(h, a):
    """(a GPT layer of hidden h and a heads with dropout, the same without)."""
    return tuple(make_model(name=f"dropout-{d}", num_layers=4, hidden_size=h, num_heads=a, vocab_size=32000,
                            gated_mlp=False, dropout=d) for d in (True, False))


def test_without_dropout_the_masks_go():
    # No dropout (Llama-style): the two 1-byte dropout masks (sbh each) are not stored.
    s, b, h, a, t = 2048, 1, 4096, 32, 4
    with_do, no_do = _with_and_without_dropout(h, a)
    diff = (_bytes(with_do, s=s, b=b, t=t, sp=False, recompute=Recompute.SELECTIVE)
            - _bytes(no_do, s=s, b=b, t=t, sp=False, recompute=Recompute.SELECTIVE))
    assert diff == pytest.approx(2 * s * b * h, rel=1e-12)


def test_unfused_attention_without_dropout_keeps_the_softmax_output_alone():
    # Without attention dropout the attention-over-values GEMM saves the softmax output itself:
    # of Korthikanti's 5as per token (softmax output 2as, dropout mask as, dropout output 2as)
    # 2as stay, split over TP; the two 1-byte hidden-dropout masks (2sbh) go too.
    s, b, h, a, t = 4096, 2, 4096, 32, 4
    with_do, no_do = _with_and_without_dropout(h, a)
    kept = _bytes(no_do, s=s, b=b, t=t, sp=False, recompute=Recompute.NONE)
    assert kept == pytest.approx(float(s * b * h * (8 + Fraction(24, t) + Fraction(2 * a * s, h * t))), rel=1e-12)
    diff = (_bytes(with_do, s=s, b=b, t=t, sp=False, recompute=Recompute.NONE) - kept)
    assert diff == pytest.approx(2 * s * b * h + 3 * a * s * s * b / t, rel=1e-12)
