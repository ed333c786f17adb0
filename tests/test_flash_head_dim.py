"""FlashAttention-2 runs a head dimension it has no kernel for in the next wider kernel
(flops.py FLASH2_HEAD_DIMS, from its HEADDIM_SWITCH): 112-wide heads pay for 128."""

from __future__ import annotations

import pytest

from paraplan.cost.estimate import estimate
from paraplan.cost.flops import flash2_padding, layer_forward_flops
from paraplan.cost.roofline import attention_time_s
from paraplan.plan.axes import AttentionKernel
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster
from paraplan.specs.model import ModelSpec
from paraplan.specs.workload import Precision, Workload


def _model(head_dim: int, heads: int = 64) -> ModelSpec:
    # hidden 7168 over 64 heads: 112 wide
    return ModelSpec(name=f"hd{head_dim}", num_layers=4, hidden_size=7168, ffn_hidden_size=28672, num_heads=heads,
                     num_kv_heads=heads, head_dim=head_dim, vocab_size=50432, gated_mlp=False)


@pytest.mark.parametrize("hd, padded", [(64, 64), (80, 96), (96, 96), (112, 128), (128, 128), (192, 192)])
def test_padding_ratio(hd, padded):
    assert flash2_padding(_model(hd)) == pytest.approx(padded / hd)


def test_flash2_prices_the_padded_width_and_flash3_does_not():
    cluster = load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=8, seq_len=8192)
    m = _model(112)
    times = {}
    for kernel in (AttentionKernel.FLASH2, AttentionKernel.FLASH3):
        plan = make_plan(tp=8, pp=1, dp=1, micro_batch_size=1, attention=kernel)
        times[kernel] = estimate(m, cluster, wl, plan).layer_detail["fwd"]["attention"]
    # the same FLOPs at the same curve point would take the same time: flash2 now runs 128/112 of them
    executed = layer_forward_flops(m, 8192, 8192).attn_core / 8
    gpu = cluster.gpu
    assert times[AttentionKernel.FLASH2] == pytest.approx(
        float(attention_time_s(gpu, executed * 128 / 112, Precision.BF16, AttentionKernel.FLASH2.code)), rel=1e-9)
    assert times[AttentionKernel.FLASH3] == pytest.approx(
        float(attention_time_s(gpu, executed, Precision.BF16, AttentionKernel.FLASH3.code)), rel=1e-9)
