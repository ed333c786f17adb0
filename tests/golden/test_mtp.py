"""Multi-token prediction (DeepSeek-V3 report, arXiv 2412.19437, Sec. 2.2): the module's
weights against DeepSeek's published sizes, its FLOPs against the TFLOP/s NeMo reports for
a measured DeepSeek-V3 run, and its place in the pipeline against Megatron-Bridge's layout."""

from __future__ import annotations

import csv
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.cost.chunks import chunk_layers
from paraplan.cost.estimate import estimate
from paraplan.cost.flops import model_flops_per_token
from paraplan.export import megatron
from paraplan.plan.axes import Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

V3 = load_model("deepseek-v3")
MOE_CSV = Path(__file__).resolve().parents[2] / ".." / "shared" / "validation" / "training_dev_moe.csv"


def test_deepseek_v3_checkpoint_size_with_its_mtp_module():
    # DeepSeek-V3 README: "685B ... includes 671B of the Main Model weights and 14B of the
    # Multi-Token Prediction (MTP) Module weights"; Hugging Face stores the module with its
    # own copies of the shared embedding and output head
    # (whole billions: 684.49B here, the module 13.46B of it)
    assert V3.mtp_layers == 1 and V3.num_params == pytest.approx(671e9, rel=1e-3)
    copies = 2 * V3.vocab_size * V3.hidden_size
    assert V3.num_params + V3.mtp_params + copies == pytest.approx(685e9, rel=1e-3)


@pytest.mark.skipif(not MOE_CSV.exists(), reason="../shared/validation not beside the checkout")
def test_nemo_deepseek_v3_tflops_count_the_mtp_module():
    # Megatron-Bridge's DeepSeek-V3 row (NeMo 25.09, 1,024 H100, seq 4096): 1,297 tokens/s/GPU
    # at a model 338 TFLOP/s/GPU, i.e. 260.6 GFLOP per token. paraplan's count with causal
    # attention gives it to 0.1% with the MTP module and 3.9% short without: the run trained it
    row = next(r for r in csv.DictReader(MOE_CSV.open()) if r["id"] == "train-dev-moe-008")
    per_token = float(row["notes"].split("model_tflops_per_gpu=")[1].split(";")[0]) * 1e12 / float(row["value"])
    seq = int(row["seq_len"])
    assert model_flops_per_token(V3, seq, causal=True) == pytest.approx(per_token, rel=1e-3)
    without = model_flops_per_token(replace(V3, mtp_layers=0), seq, causal=True)
    assert without < per_token * 0.965


@pytest.mark.parametrize("pp,vp", [(8, 4), (16, 2)])
def test_the_mtp_module_takes_a_layer_slot_as_megatron_bridge_lays_it_out(pp, vp):
    # Megatron-Bridge 0.3.1 deepseek_v3.py: 61 layers and the MTP module in 32 virtual stages,
    # "Et|(tt|)*30mL": one layer beside the embedding, none beside the MTP module and the loss
    wl = Workload(global_batch_size=1024, seq_len=4096)
    plan = make_plan(tp=2, pp=pp, vp=vp, dp=1024 // (2 * pp), ep=64, schedule=Schedule.INTERLEAVED_1F1B)
    assert [len(r) for r in chunk_layers(V3, wl, plan)] == [1] + [2] * 30 + [0]
    args = megatron.pipeline_args(V3, wl, plan)
    assert args == ["--pipeline-model-parallel-layout", "Et|(t*2|)*30mL", "--mtp-num-layers", 1]


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core not installed")
def test_megatron_core_builds_the_exported_mtp_layout():
    import torch
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_config import TransformerConfig
    wl = Workload(global_batch_size=1024, seq_len=4096, precision=Precision.FP8)
    plan = megatron.SUPPORT.adapt(make_plan(tp=2, pp=16, vp=2, dp=32, ep=64, sequence_parallel=True,
                                            schedule=Schedule.INTERLEAVED_1F1B, zero=ZeroStage.OPTIMIZER,
                                            recompute=Recompute.MODULES))
    a = megatron.arguments(plan, V3, wl)
    layout = a[a.index("--pipeline-model-parallel-layout") + 1]
    cfg = TransformerConfig(num_layers=V3.num_layers, hidden_size=V3.hidden_size, num_attention_heads=V3.num_heads,
                            tensor_model_parallel_size=2, pipeline_model_parallel_size=16, sequence_parallel=True,
                            pipeline_dtype=torch.bfloat16, num_moe_experts=V3.num_experts,
                            moe_router_topk=V3.top_k, moe_ffn_hidden_size=V3.moe_ffn_hidden_size,
                            expert_model_parallel_size=64, expert_tensor_parallel_size=1,
                            add_bias_linear=False,  # --disable-bias-linear
                            mtp_num_layers=int(a[a.index("--mtp-num-layers") + 1]),
                            pipeline_model_parallel_layout=layout)
    built = cfg.pipeline_model_parallel_layout
    assert built.virtual_pipeline_model_parallel_size == 2
    decoders = [built.layout[j % 16][j // 16].count(LayerType.decoder) for j in range(32)]
    assert decoders == [len(r) for r in chunk_layers(V3, wl, plan)]
    assert built.layout[15][1].count(LayerType.mtp) == 1  # the last virtual stage holds it


def test_the_mtp_module_costs_about_its_share_of_the_flops():
    # one stage, so that the module's time lands on the step: its compute grows by about the
    # share of FLOPs it adds (a block, a projection and the head again: 4.1% of DeepSeek-V3's),
    # and its block's all-to-all is one more MoE layer's, counted as EP communication
    cluster = load_cluster("dgx-h100", num_gpus=256)
    wl = Workload(global_batch_size=1024, seq_len=4096, precision=Precision.FP8)
    plan = make_plan(tp=1, pp=1, dp=256, ep=64, zero=ZeroStage.PARAMETERS)
    with_mtp, without = (estimate(m, cluster, wl, plan) for m in (V3, replace(V3, mtp_layers=0)))
    flops = model_flops_per_token(V3, 4096, causal=True) / model_flops_per_token(replace(V3, mtp_layers=0), 4096,
                                                                               causal=True) - 1.0
    compute = with_mtp.time.compute_s / without.time.compute_s - 1.0
    assert 0.5 * flops < compute < 1.5 * flops
    assert with_mtp.time.ep_comm_s / without.time.ep_comm_s == pytest.approx(1.0 + 1.0 / V3.num_layers)
    assert with_mtp.step_time_s > without.step_time_s and with_mtp.memory.total > without.memory.total


def _run(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_the_flag_drops_the_module_and_engines_without_it_say_so(capsys):
    base = ["--model", "deepseek-v3", "--gpus", "256", "--seq", "4096", "--batch", "1024", "--tp", "1", "--ep", "64",
            "--zero", "3", "--recompute", "full"]
    with_mtp = json.loads(_run(capsys, "estimate", *base, "--json")[1])
    without = json.loads(_run(capsys, "estimate", *base, "--mtp-layers", "0", "--json")[1])
    assert with_mtp["step_time_s"] > without["step_time_s"]
    for argv in (["export", "--format", "torchtitan", *base], ["estimate", *base, "--mtp-layers", "17"]):
        code, out, err = _run(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert ("mtp_layers=1" in err and "--mtp-layers 0" in err) if argv[0] == "export" else "--mtp-layers" in err
