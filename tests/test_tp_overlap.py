"""TP overlap hides each collective behind the GEMM it is fused with (cost/tp.py)."""

from __future__ import annotations

import numpy as np
import pytest

from paraplan.cost.layer_compute import layer_compute
from paraplan.cost.layout import layout
from paraplan.cost.tp import tp_comm
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload


def _tp(model_name, **kw):
    model, cluster = load_model(model_name), load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=64, seq_len=8192)
    plan = make_plan(tp=8, dp=1, micro_batch_size=8, sequence_parallel=True, **kw)
    lay = layout(model, wl, plan)
    lc = layer_compute(cluster.gpu, model, wl, plan, lay, None)
    return tp_comm(cluster, model, plan, lay, lc, None), lc


def test_each_collective_hides_only_behind_its_own_gemm():
    """Llama 3 8B at TP 8: the gathers and scatters around attention outlast its narrow QKV and
    out-projection GEMMs, while the MLP's GEMMs outlast theirs. The layer's GEMMs together would
    hide every collective; paired, the attention block's excess stays exposed. Under Transformer
    Engine the chunk never hidden is the all-gather's first of t and the pipelined
    reduce-scatter's last of UB_PIPELINE_SPLITS; the backward's input-gradient reduce-scatters
    run whole beside their GEMMs ("bulk")."""
    from paraplan.cost.layer_compute import UB_PIPELINE_SPLITS as n
    tp, lc = _tp("llama3-8b", tp_overlap=True)
    ag, rs, t = float(np.ravel(tp.all_gather_s)[0]), float(np.ravel(tp.reduce_scatter_s)[0]), 8.0
    qkv, out, up, down = (float(np.ravel(x)[0]) for x in (lc.qkv_gemm_s, lc.out_gemm_s, lc.up_gemm_s, lc.down_gemm_s))
    assert ag > qkv and rs > out and up > ag and down > rs
    paired = (ag - qkv) + (rs - out) + ag / t + max(rs - down, rs / n)
    assert float(np.ravel(tp.forward_exposed_s)[0]) == pytest.approx(paired, rel=1e-9)
    whole_layer = max(2 * (ag + rs) - float(np.ravel(lc.gemms_forward_s)[0]), 2 * (ag + rs) / t)
    assert float(np.ravel(tp.forward_exposed_s)[0]) > whole_layer
    # the backward's gathers pair with the data-gradient GEMMs the same way; its scatters, bulk
    bulk = (ag - out) + max(rs - qkv, 0.0) + max(ag - down, ag / t) + max(rs - up, 0.0)
    assert float(np.ravel(tp.backward_exposed_s)[0]) == pytest.approx(bulk, rel=1e-9)


def test_overlap_never_exposes_more_than_no_overlap():
    for name in ("llama3-8b", "llama3-70b"):
        over, _ = _tp(name, tp_overlap=True)
        plain, _ = _tp(name, tp_overlap=False)
        assert float(np.ravel(over.forward_exposed_s)[0]) <= float(np.ravel(plain.forward_exposed_s)[0])
        assert float(np.ravel(over.forward_exposed_s)[0]) >= float(np.ravel(over.forward_s)[0]) / 8 - 1e-12


def test_mla_gathers_its_latents_not_the_hidden_state():
    """Under MLA with SP, Megatron-Core runs the down-projections on the sequence shard and
    gathers the latents c_Q, c_KV and the RoPE key (1,536 + 512 + 64 wide for DeepSeek-V3)
    before the up-projections, not the 7,168-wide hidden state; the out-projection still
    reduce-scatters [T, h]."""
    from paraplan.cost.comm import Collective, collective_time_s
    from paraplan.cost.tp import attention_gather_widths

    model, cluster = load_model("deepseek-v3"), load_cluster("dgx-h100", num_gpus=8)
    assert attention_gather_widths(model) == (1536, 512, 64)
    assert attention_gather_widths(load_model("llama3-8b")) == (4096,)
    wl = Workload(global_batch_size=64, seq_len=4096)
    plan = make_plan(tp=8, dp=1, ep=1, micro_batch_size=1, sequence_parallel=True)
    lay = layout(model, wl, plan)
    tp = tp_comm(cluster, model, plan, lay, layer_compute(cluster.gpu, model, wl, plan, lay, None), None)
    row = float(np.ravel(lay.act_bytes_per_element)[0]) * 4096

    def coll(kind, width):
        return float(np.ravel(collective_time_s(cluster, kind, row * width, 8, 1))[0])

    attn = sum(coll(Collective.ALL_GATHER, w) for w in (1536, 512, 64)) + coll(Collective.REDUCE_SCATTER, 7168)
    blocks = float(np.ravel(tp.blocks)[0])  # attention, and the dense or shared-expert MLP share
    mlp = (blocks - 1.0) * (coll(Collective.ALL_GATHER, 7168) + coll(Collective.REDUCE_SCATTER, 7168))
    assert float(np.ravel(tp.forward_s)[0]) == pytest.approx(attn + mlp, rel=1e-9)
    assert attn < coll(Collective.ALL_GATHER, 7168) + coll(Collective.REDUCE_SCATTER, 7168)
