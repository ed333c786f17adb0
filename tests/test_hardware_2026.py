"""The 2026 hardware presets (GB300, B300, GH200, L40S and their clusters) against the figures of
../shared/HARDWARE_2026.md, and NVFP4 training (cost/low_precision.py)."""

from __future__ import annotations

import re
import tomllib

import numpy as np
import pytest

from paraplan.cost.estimate import estimate
from paraplan.cost.evaluate import evaluate
from paraplan.cost.low_precision import bf16_end_layers, gemm_operand_bytes, quantize_bytes_per_element
from paraplan.errors import SpecError
from paraplan.plan.axes import AttentionKernel, Recompute
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch
from paraplan.specs.catalog import CATALOG_DIR, load_cluster, load_gpu, load_model
from paraplan.specs.workload import Precision, Workload, parse_precision
from support import assert_user_error, run

# Typed from ../shared/HARDWARE_2026.md (dense tensor-core TFLOP/s, GB, TB/s, W, GB/s one way).
GPU_DATASHEET = {
    # Blackwell Ultra table, GB300 (NVL72) column: NVFP4 15 PF; FP8/BF16/TF32 5 / 2.5 / 1.25 PF;
    # 279 GB at 8 TB/s; up to 1,400 W
    "gb300": dict(nvfp4=15000, fp8=5000, bf16=2500, tf32=1250, hbm_gb=279, hbm_tb_per_s=8.0, tdp_watts=1400),
    # HGX/DGX B300 column: NVFP4 14 PF (datasheet; 13.5 on the HGX page); 4.5 / 2.25 / 1.1 PF;
    # 270 GB at 7.7 TB/s; up to 1,100 W; PCIe Gen6 x16, 256 GB/s bidirectional
    "b300": dict(nvfp4=14000, fp8=4500, bf16=2250, tf32=1100, hbm_gb=270, hbm_tb_per_s=7.7, tdp_watts=1100,
                 host_link_gb_per_s=128),
    # GH200 table: 1,979 / 989 / 494 TF; 96 GB HBM3 at 4 TB/s or 144 GB HBM3e at 4.9 TB/s;
    # up to 1,000 W per superchip; NVLink-C2C 900 GB/s bidirectional
    "gh200-96gb": dict(fp8=1979, bf16=989, tf32=494, hbm_gb=96, hbm_tb_per_s=4.0, tdp_watts=1000,
                       host_link_gb_per_s=450),
    "gh200-144gb": dict(fp8=1979, bf16=989, tf32=494, hbm_gb=144, hbm_tb_per_s=4.9, tdp_watts=1000,
                        host_link_gb_per_s=450),
    # L40S: FP8 733 / BF16 362 / TF32 183 TF; 48 GB GDDR6 at 864 GB/s; 350 W; PCIe Gen4 x16
    "l40s": dict(fp8=733, bf16=362, tf32=183, hbm_gb=48, hbm_tb_per_s=0.864, tdp_watts=350, host_link_gb_per_s=32),
    # Blackwell table: NVFP4 dense 9 PF (B200), 10 PF (GB200)
    "b200": dict(nvfp4=9000),
    "gb200": dict(nvfp4=10000),
}
CLUSTER_DATASHEET = {
    # NVLink 5, 1,800 GB/s bidirectional (domain 72 / 8); one ConnectX-8 (800 Gb/s) per GPU;
    # GB300: one Grace with ~472 GB LPDDR5X per two GPUs
    "gb300-nvl72": dict(gpu="gb300", gpus_per_node=72, nvlink_gb_per_s=900, scaleout_gbit_per_s=800,
                        host_memory_gb_per_host=472, gpus_per_host=2),
    "dgx-b300": dict(gpu="b300", gpus_per_node=8, nvlink_gb_per_s=900, scaleout_gbit_per_s=800),
    # NVLink 4, 900 GB/s bidirectional, domain 4 (quad nodes); Grace up to 480 GB LPDDR5X
    "gh200-quad": dict(gpu="gh200-96gb", gpus_per_node=4, nvlink_gb_per_s=450, host_memory_gb_per_host=480,
                       gpus_per_host=1),
    # no NVLink: PCIe Gen4 x16 between the cards
    "l40s-pcie-8": dict(gpu="l40s", gpus_per_node=8, nvlink_gb_per_s=32),
}
NEW_FILES = ([CATALOG_DIR / "gpus" / f"{n}.toml" for n in ("gb300", "b300", "gh200-96gb", "gh200-144gb", "l40s")]
             + [CATALOG_DIR / "clusters" / f"{n}.toml" for n in CLUSTER_DATASHEET])
BIG = Workload(global_batch_size=128, seq_len=8192)


def _toml(kind: str, name: str) -> dict:
    return tomllib.loads((CATALOG_DIR / kind / f"{name}.toml").read_text())


@pytest.mark.parametrize("name", sorted(GPU_DATASHEET))
def test_gpu_preset_numbers_are_the_datasheets(name):
    data, want = _toml("gpus", name), GPU_DATASHEET[name]
    for key, value in want.items():
        got = data["peak_tflops"][key] if key in {str(p) for p in Precision} else data[key]
        assert got == value, (name, key)
    gpu = load_gpu(name)
    for key in ("nvfp4", "fp8", "bf16", "tf32"):
        if key in want:
            assert gpu.peak(Precision(key)) == pytest.approx(want[key] * 1e12)


@pytest.mark.parametrize("name", sorted(CLUSTER_DATASHEET))
def test_cluster_preset_numbers_are_the_datasheets(name):
    data, want = _toml("clusters", name), CLUSTER_DATASHEET[name]
    assert data["gpu"] == want["gpu"] and data["gpus_per_node"] == want["gpus_per_node"]
    assert data["nvlink"]["gb_per_s"] == want["nvlink_gb_per_s"]
    if "scaleout_gbit_per_s" in want:
        assert data["scaleout"]["gbit_per_s"] == want["scaleout_gbit_per_s"]
    for key in ("host_memory_gb_per_host", "gpus_per_host"):
        assert data.get(key) == want.get(key), key
    cluster = load_cluster(name)
    assert cluster.gpu.name == want["gpu"] and cluster.nvlink.bw_unidir_bytes_per_s == want["nvlink_gb_per_s"] * 1e9


@pytest.mark.parametrize("path", NEW_FILES, ids=lambda p: p.stem)
def test_every_number_of_a_new_preset_comes_with_its_source(path):
    """Each group of values (lines between blank lines) carries a comment: the figure's source in
    HARDWARE_2026.md, or the ASSUMPTION it is; figures marked "not found" there say so."""
    text = path.read_text()
    assert "HARDWARE_2026.md" in text and "ASSUMPTION" in text
    for block in re.split(r"\n\s*\n", text):
        lines = block.strip().splitlines()
        if any(re.match(r"^\w+\s*=\s*[\[{0-9]", ln) for ln in lines):
            assert any(ln.lstrip().startswith("#") for ln in lines), block


@pytest.mark.parametrize("alias,name", [("GB300", "gb300"), ("B300", "b300"), ("GH200 480GB", "gh200-96gb"),
                                        ("GH200", "gh200-96gb"), ("GH200 144GB HBM3e", "gh200-144gb"),
                                        ("L40S", "l40s"), ("NVIDIA L40S", "l40s")])
def test_gpu_aliases_resolve(alias, name):
    assert load_gpu(alias).name == name


def test_gh200_480gb_is_the_96gb_hbm3_part():
    # TensorRT-LLM's "GH200 480GB": 96 GB HBM3 + 480 GB LPDDR5X on the Grace (HARDWARE_2026.md)
    gpu = load_gpu("GH200 480GB")
    assert gpu.hbm_bytes == 96e9 and gpu.hbm_bw_bytes_per_s == 4.0e12


@pytest.mark.parametrize("alias,name", [("GB300 NVL72", "gb300-nvl72"), ("DGX B300", "dgx-b300"),
                                        ("HGX B300", "dgx-b300"), ("gh200-quad", "gh200-quad"),
                                        ("l40s-pcie-8", "l40s-pcie-8")])
def test_cluster_aliases_resolve(alias, name):
    assert load_cluster(alias).name == name


def test_llama_3_3_70b_is_the_llama_3_1_70b_architecture():
    for name in ("Llama 3.3 70B", "meta-llama/Llama-3.3-70B-Instruct"):
        m = load_model(name)
        assert m is load_model("llama3.1-70b")
        assert (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_heads, m.num_kv_heads, m.vocab_size) == (
            80, 8192, 28672, 64, 8, 128256)  # meta-llama/Llama-3.3-70B-Instruct config.json


@pytest.mark.parametrize("gpu,cluster", [("GB300", "gb300-nvl72"), ("B300", "dgx-b300"),
                                         ("GH200 480GB", "gh200-quad"), ("L40S", "l40s-pcie-8"),
                                         ("NVIDIA GB300 superchip", "gb300-nvl72"), ("NVIDIA B300 SXM", "dgx-b300"),
                                         ("NVIDIA GH200 Grace Hopper", "gh200-quad"), ("NVIDIA L40S PCIe", "l40s-pcie-8")])
def test_validation_rows_find_the_2026_clusters(gpu, cluster):
    # (a whole-word family: 'gb300' is matched before 'b300')
    from paraplan.validate.training import gpu_cluster_for
    from support import TRAINING_ROW
    assert gpu_cluster_for({**TRAINING_ROW, "gpu": gpu}, "rows.csv", 2) == cluster


def test_presets_lists_the_2026_hardware(capsys):
    code, out, err = run(capsys, "presets")
    assert code == 0, err
    for name in ("gb300", "b300", "gh200-96gb", "gh200-144gb", "l40s", "gb300-nvl72", "dgx-b300", "gh200-quad",
                 "l40s-pcie-8"):
        assert re.search(rf"^{re.escape(name)}\s", out, re.M), name


# ---- NVFP4 ----------------------------------------------------------------------------------

def test_nvfp4_labels_parse():
    assert parse_precision("NVFP4") is Precision.NVFP4 and parse_precision("nvfp4") is Precision.NVFP4
    assert parse_precision("NVFP4 (Megatron-Bridge recipe)") is Precision.NVFP4
    with pytest.raises(SpecError, match="nvfp4"):
        parse_precision("fp4")  # ambiguous (MXFP4 too): refused, naming what is allowed
    assert Precision.NVFP4.activation_bytes == 2.0  # activations stay 16-bit


def test_nvfp4_bytes_and_bf16_layers():
    # E2M1 (half a byte) + an E4M3 scale per 16 elements; quantizing reads 2 B and writes two copies
    assert gemm_operand_bytes(Precision.NVFP4) == 0.5625 and gemm_operand_bytes(Precision.FP8) == 1.0
    assert quantize_bytes_per_element(Precision.NVFP4) == 3.125 and quantize_bytes_per_element(Precision.FP8) == 3.0
    assert quantize_bytes_per_element(Precision.BF16) == 0.0
    assert bf16_end_layers(Precision.NVFP4, 80) == (1, 1)  # Megatron-Core's default
    assert bf16_end_layers(Precision.NVFP4, 1) == (1, 0)
    assert bf16_end_layers(Precision.FP8, 80) == (0, 0)


def _step_s(cluster_name, precision, plan, model="llama3-70b", num_gpus=64):
    wl = Workload(global_batch_size=BIG.global_batch_size, seq_len=BIG.seq_len, precision=precision)
    return estimate(load_model(model), load_cluster(cluster_name, num_gpus=num_gpus), wl, plan)


PLAN = make_plan(tp=2, pp=4, dp=8, micro_batch_size=1, sequence_parallel=True, attention=AttentionKernel.FLASH3,
                 recompute=Recompute.SELECTIVE)


def test_nvfp4_beats_fp8_on_gb200_by_far_less_than_the_peak_ratio():
    """2x the FP8 peak, but attention, the BF16 end layers and head, element-wise kernels and
    communication stay: NVIDIA's MaxText runs gained 1.35-1.44x over FP8 on GB200."""
    fp8, fp4 = (_step_s("gb200-nvl72", p, PLAN) for p in (Precision.FP8, Precision.NVFP4))
    speedup = fp8.step_time_s / fp4.step_time_s
    assert 1.1 < speedup < 1.7
    assert fp4.memory.activations_bytes < fp8.memory.activations_bytes  # 0.5625-byte saved GEMM inputs
    # GB300's FP4 peak is 3x its FP8 one (GB200: 2x): more to gain there
    gb300 = _step_s("gb300-nvl72", Precision.FP8, PLAN).step_time_s / _step_s(
        "gb300-nvl72", Precision.NVFP4, PLAN).step_time_s
    assert speedup < gb300 < 2.0


def test_nvfp4_first_and_last_layers_run_in_bf16():
    """With four stages the first and the last carry one BF16 layer each beyond FP8's layout."""
    cluster, model = load_cluster("gb200-nvl72", num_gpus=64), load_model("llama3-70b")
    stages = {}
    for p in (Precision.FP8, Precision.NVFP4, Precision.BF16):
        wl = Workload(global_batch_size=128, seq_len=8192, precision=p)
        c = evaluate(model, cluster, wl, PlanBatch.from_plans([PLAN]))
        stages[p] = [float(np.asarray(s.forward_s).ravel()[0]) for s in (c.first, c.middle, c.last)]
    first, middle, last = stages[Precision.NVFP4]
    fp8_first, fp8_middle, fp8_last = stages[Precision.FP8]
    bf16_first, bf16_middle, _ = stages[Precision.BF16]
    per_layer_fp4, per_layer_bf16 = middle / 20, bf16_middle / 20  # 80 layers over 4 stages
    # one layer's BF16-over-FP4 difference, within the embedding's and quantization's share
    assert first - middle == pytest.approx((fp8_first - fp8_middle) + per_layer_bf16 - per_layer_fp4, rel=0.15)
    assert last - middle > fp8_last - fp8_middle  # the BF16 layer and the BF16 head
    assert bf16_first > first > middle


def test_nvfp4_moe_layers_price_their_experts_in_fp4():
    # routing padded to capacity: no dispatch synchronization, whose host bound would hide the
    # GEMMs' precision at one sequence per micro-batch (cost/stages.py moe_dispatch_gaps)
    plan = make_plan(tp=1, pp=2, dp=32, ep=8, micro_batch_size=1, attention=AttentionKernel.FLASH3,
                     capacity_factor=1.0)
    fp8, fp4 = (_step_s("gb200-nvl72", p, plan, model="qwen3-30b-a3b") for p in (Precision.FP8, Precision.NVFP4))
    assert fp4.step_time_s < fp8.step_time_s


def test_nvfp4_on_a_gpu_without_fp4_is_a_clear_error(capsys):
    plan = make_plan(tp=8, dp=8, micro_batch_size=1)
    with pytest.raises(SpecError) as e:
        _step_s("dgx-h100", Precision.NVFP4, plan)
    assert e.value.field == "precision" and e.value.value == "nvfp4"
    assert "no nvfp4 tensor-core peak" in str(e.value) and "allowed: bf16, fp16, fp8" in str(e.value)
    line = assert_user_error(*run(capsys, "estimate", "--cluster", "dgx-h100", "--precision", "nvfp4"))
    assert "precision='nvfp4'" in line and "h100" in line
    for gpu in ("gh200-96gb", "l40s", "a100-sxm-80gb", "mi300x"):
        assert Precision.NVFP4 not in load_gpu(gpu).peak_flops_per_s


@pytest.mark.parametrize("shared_ffn", [0, 4096])
def test_fp8_casts_an_moe_layers_mlp_input_only_where_a_gemm_reads_it(shared_ffn):
    """Transformer Engine casts a GEMM's input: in an MoE layer the routed experts' inputs are
    cast after the dispatch (moe.py), so the layer's MLP input is cast before it only for the
    shared experts' GEMM (not at all without shared experts, as Mixtral's)."""
    from dataclasses import replace

    from paraplan.cost.roofline import memory_bound_time_s

    model = replace(load_model("mixtral-8x7b"), shared_expert_ffn_hidden_size=shared_ffn)
    cluster = load_cluster("dgx-h100", num_gpus=8)
    T, t = 4096, 2
    plan = make_plan(tp=t, dp=4, micro_batch_size=1, sequence_parallel=True)

    def elementwise_forward(precision):
        wl = Workload(global_batch_size=8, seq_len=T, precision=precision)
        return float(estimate(model, cluster, wl, plan).layer_detail["fwd"]["element-wise"])

    h, qd = model.hidden_size, model.q_dim
    mlp_inputs = 1 if shared_ffn else 0
    # QKV input (an SP shard), the MLP input where a GEMM reads it, the out-projection's input
    cast = memory_bound_time_s(cluster.gpu, quantize_bytes_per_element(Precision.FP8) * T
                               * ((1 + mlp_inputs) * h / t + qd / t), 0)
    assert elementwise_forward(Precision.FP8) - elementwise_forward(Precision.BF16) == pytest.approx(float(cast))


# GPUs whose curves are another's, taken at the same time at peak (calibration/borrowed_curves.py)
BORROWED_CURVES = {"b200": "h100-sxm-80gb", "gb200": "h100-sxm-80gb", "b300": "h100-sxm-80gb",
                   "gb300": "h100-sxm-80gb", "mi300x": "h100-sxm-80gb", "l40s": "a100-sxm-80gb",
                   "tpu-v4": "a100-sxm-80gb"}


@pytest.mark.parametrize("borrower,source", sorted(BORROWED_CURVES.items()))
def test_a_borrowed_curve_reaches_each_share_at_the_same_time_at_peak(borrower, source):
    # a call's fixed microseconds cost a GPU k times faster k times the FLOPs: its curve is the
    # measured one with the FLOPs axis x k (k the BF16 peak ratio); the plateau is the same
    from paraplan.specs.workload import Precision
    gpu, ref = load_gpu(borrower), load_gpu(source)
    k = gpu.peak(Precision.BF16) / ref.peak(Precision.BF16)
    # the H100's attention curves are re-expressed at its refit sustained share (× 0.75/0.84,
    # rounded to 3 decimals; docs/model/compute.md, "Attention at the sustained share"); a
    # borrower keeps them as fitted, its own share fitted with them
    attention_scale, tolerance = ((0.75 / 0.84, 1e-2) if source == "h100-sxm-80gb" else (1.0, 2e-3))
    for flops in (3e8, 2e9, 5e10, 1e12):
        assert gpu.gemm_efficiency.at(flops * k) == pytest.approx(ref.gemm_efficiency.at(flops), rel=2e-3)
        for kernel in gpu.attention_efficiency:
            assert attention_scale * gpu.attention_curve(kernel).at(flops * k) == pytest.approx(
                ref.attention_curve(kernel).at(flops), rel=tolerance)
    assert gpu.gemm_efficiency.at(1e14) == pytest.approx(ref.gemm_efficiency.at(1e14))
