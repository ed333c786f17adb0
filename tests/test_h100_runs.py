"""What one H100 taught the model (calibration/h100_2026-11-22, README there): eager layers
and autocast keep more activations than Megatron's fused layer, eager cross-entropy holds
12 bytes per logit, a 50,257 vocabulary misaligns the LM head's GEMMs, torch's SDPA runs
cuDNN's attention (flash3) on Hopper, and `paraplan compare --metric memory` counts what
torch.cuda.max_memory_allocated counts. The golden tests re-predict the recorded runs."""

from __future__ import annotations

import glob
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from paraplan.calibrate.measurements import AttentionSample, GemmSample, Measurements
from paraplan.calibrate.measurements import LossSample
from paraplan.calibrate.profile import build_profile, loss_efficiency, misaligned_ratio
from paraplan.cost import memory as mem
from paraplan.cost.estimate import estimate
from paraplan.cost.stage_ends import loss_bytes_per_logit
from paraplan.cost.roofline import gemm_time_s, memory_bound_time_s, rows_aligned
from paraplan.errors import FileFormatError
from paraplan.plan.axes import AttentionKernel, Recompute
from paraplan.plan.plan import make_plan
from paraplan.report.compare import compare_reports, load_reports
from paraplan.run.report import predicted_as_measured_bytes
from paraplan.specs.catalog import cluster_from_text, load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

RUNS = Path(__file__).resolve().parents[1] / "calibration" / "h100_2026-11-22"
H100 = load_cluster("dgx-h100", num_gpus=1)
WL = Workload(global_batch_size=4, seq_len=2048)


# ---------------------------------------------------------------- golden: the recorded runs

def _compare(pattern: str, metric: str, hardware: str = "dgx-h100") -> dict:
    paths = sorted(glob.glob(str(RUNS / pattern)))
    assert paths, pattern
    return compare_reports(load_reports(paths, hardware), metric)


def test_recorded_h100_runs_memory_within_three_percent():
    """Nine one-GPU runs (Llama 3 8B/70B shapes, GPT-3 with MHA, GELU and tied embeddings;
    2k-16k tokens; no, selective and full recomputation): peak memory as allocated."""
    result = _compare("runs_b/run*.json", "memory")
    errors = [abs(r["error_pct"]) for r in result["rows"]]
    assert len(errors) == 9
    assert max(errors) < 3.0, errors


def test_recorded_h100_runs_step_time_on_the_profile_measured_there():
    result = _compare("runs_b/run*.json", "step_time", str(RUNS / "runs_d" / "h100.toml"))
    by_model = {r["model"] + r["plan"]: r["error_pct"] for r in result["rows"]}
    assert result["summary"]["mean_abs_pct_error"] < 4.0
    assert result["summary"]["max_abs_pct_error"] < 8.0
    # GPT-3's 50,257 vocabulary: -40.0% on runs_b's own profile with the model before the
    # misaligned LM head was priced (commit 67832cf~)
    gpt = [e for k, e in by_model.items() if k.startswith("gpt3")]
    assert len(gpt) == 1 and abs(gpt[0]) < 8.0


def test_calibrated_h100_profile_has_both_attention_kernels_and_the_misalignment():
    prof = RUNS / "runs_c" / "h100.toml"
    gpu = load_cluster(str(prof), num_gpus=1).gpu
    assert set(gpu.attention_efficiency) == {AttentionKernel.FLASH2, AttentionKernel.FLASH3}
    # cuDNN's kernel outruns FlashAttention-2 on Hopper at every size measured
    for flops in (1e11, 1e12):
        assert gpu.attention_curve(AttentionKernel.FLASH3).at(flops) > gpu.attention_curve(AttentionKernel.FLASH2).at(flops)
    assert 0.1 < gpu.misaligned_gemm_efficiency_ratio < 0.3


# ---------------------------------------------------------------- memory terms

def test_eager_layer_keeps_silu_output_of_a_gated_mlp_only():
    llama, gpt = load_model("llama3-8b"), load_model("gpt3-175b")
    for model, extra in ((llama, 2.0 * llama.ffn_hidden_size), (gpt, 0.0)):
        fused, _, _ = mem.layer_activation_bytes(model, make_plan(), 2048, recompute_code=make_plan().recompute_code)
        eager, _, _ = mem.layer_activation_bytes(model, make_plan(fused_kernels=False), 2048,
                                                 recompute_code=make_plan().recompute_code)
        assert eager - fused == pytest.approx(2048 * extra)


def test_autocast_keeps_fp32_residual_and_a_cast_per_linear():
    model, h = load_model("llama3-8b"), load_model("llama3-8b").hidden_size
    rc = make_plan().recompute_code
    eager, _, _ = mem.layer_activation_bytes(model, make_plan(fused_kernels=False), 1, recompute_code=rc)
    cast, _, _ = mem.layer_activation_bytes(model, make_plan(fused_kernels=False, autocast=True), 1, recompute_code=rc)
    # two norm inputs 2 -> 4 bytes (+4h); QKV input cast 3x, MLP input 2x instead of once (+6h)
    assert cast - eager == pytest.approx(10.0 * h)
    fused_cast, _, _ = mem.layer_activation_bytes(model, make_plan(autocast=True), 1, recompute_code=rc)
    fused, _, _ = mem.layer_activation_bytes(model, make_plan(), 1, recompute_code=rc)
    assert fused_cast - fused == pytest.approx(4.0 * h)  # one cast per fused GEMM: only the residual


def test_eager_loss_holds_twelve_bytes_per_logit():
    assert mem.logits_bytes_per_element(Precision.BF16) == 6.0
    assert mem.logits_bytes_per_element(Precision.BF16, False) == mem.EAGER_LOSS_BYTES == 12.0
    assert list(mem.logits_bytes_per_element(Precision.FP32, np.array([True, False]))) == [8.0, 12.0]


def test_autocast_caches_no_cast_of_the_input_embedding():
    model = load_model("llama3-8b")
    a = estimate(model, H100, WL, make_plan(micro_batch_size=1, fused_kernels=False)).memory.weights_bytes
    b = estimate(model, H100, WL, make_plan(micro_batch_size=1, fused_kernels=False, autocast=True)).memory.weights_bytes
    assert a - b == pytest.approx(2.0 * model.embedding_params)


def test_full_recomputation_working_set_beyond_the_loss_only():
    """The loss's logits are freed before the last layer re-runs: the stage holds the larger
    of the two, not their sum."""
    model = load_model("llama3-8b")
    kw = dict(micro_batch_size=1, recompute=Recompute.FULL)
    m = estimate(model, H100, WL, make_plan(**kw)).memory
    none = estimate(model, H100, WL, make_plan(micro_batch_size=1)).memory
    stored_inputs = model.num_layers * 2.0 * 2048 * model.hidden_size + 2.0 * 2048 * model.hidden_size
    working = none.activations_bytes / model.num_layers - 2.0 * 2048 * model.hidden_size / model.num_layers
    assert m.logits_bytes > working  # a 128k vocabulary's logits outweigh one layer
    assert m.activations_bytes == pytest.approx(stored_inputs, rel=1e-9)


# ---------------------------------------------------------------- misaligned GEMMs

def test_rows_aligned():
    assert list(rows_aligned(np.array([50257, 50264, 128256, 64128.5]), 2.0)) == [False, True, True, False]
    assert bool(rows_aligned(50257 * 4, 4.0)) and not bool(rows_aligned(50257, 4.0))


def test_misaligned_vocab_slows_only_the_eager_head():
    gpu = H100.gpu
    t_aligned = float(gemm_time_s(gpu, 4096, 50264, 4096, Precision.BF16))
    t_mis = float(gemm_time_s(gpu, 4096, 50257, 4096, Precision.BF16, aligned=False))
    assert t_mis > 4.0 * t_aligned
    model = replace(load_model("llama3-8b"), vocab_size=50257)
    padded = replace(model, vocab_size=50264)
    for fused, slower in ((True, False), (False, True)):
        plan = make_plan(micro_batch_size=1, fused_kernels=fused)
        a = estimate(model, H100, WL, plan).step_time_s
        b = estimate(padded, H100, WL, plan).step_time_s
        assert (a > 1.05 * b) is slower


# ---------------------------------------------------------------- calibrate

def _measurements(**kw) -> Measurements:
    gemm = tuple(GemmSample(m=n, n=n, k=n, dtype="bfloat16", time_s=2.0 * n ** 3 / 5e14 + 1e-5)
                 for n in (512, 1024, 2048, 4096, 8192))
    att = tuple(AttentionSample(batch=1, heads=32, seq=s, head_dim=128, dtype="bfloat16", fwd_time_s=ft * s * s / 1e12,
                                bwd_time_s=2.5 * ft * s * s / 1e12, kernel=k)
                for s in (1024, 4096, 8192) for k, ft in (("flash2", 80.0), ("flash3", 40.0)))
    base = dict(device_type="cuda", device_name="NVIDIA H100 80GB HBM3", ranks=1, threads_per_rank=16,
                compute_dtype="bfloat16", memory_bytes=80e9, reserved_bytes=5e8, launch_overhead_s=5e-6, gemm=gemm,
                attention=att, copies=())
    from paraplan.calibrate.measurements import CopySample
    base["copies"] = (CopySample(kind="device", num_bytes=2**30, time_s=2 * 2**30 / 3e12),)
    return Measurements(**{**base, **kw})


def test_profile_writes_a_curve_per_attention_kernel_and_the_misaligned_ratio():
    mis = (GemmSample(m=4096, n=50264, k=4096, dtype="bfloat16", time_s=2.4e-3),
           GemmSample(m=4096, n=50257, k=4096, dtype="bfloat16", time_s=12.5e-3))
    m = _measurements(misaligned_gemm=mis)
    assert misaligned_ratio(m) == pytest.approx((50257 / 12.5e-3) / (50264 / 2.4e-3))
    prof = build_profile(m, name="t")
    assert set(prof.attention_curves) == {"flash2", "flash3"}
    gpu = cluster_from_text(prof.toml, "t").gpu
    assert gpu.misaligned_gemm_efficiency_ratio == pytest.approx(misaligned_ratio(m), abs=1e-4)
    f2, f3 = gpu.attention_curve(AttentionKernel.FLASH2), gpu.attention_curve(AttentionKernel.FLASH3)
    assert f3.at(1e12) == pytest.approx(2.0 * f2.at(1e12), rel=0.05)  # half the time, twice the rate
    # round trip through the raw file
    assert Measurements.from_json(m.to_json()).misaligned_gemm == mis
    assert "misaligned_gemm_efficiency_ratio" not in build_profile(_measurements(), name="t").toml


def test_raw_files_with_a_bad_kernel_or_one_misaligned_sample_are_refused():
    m = json.loads(_measurements().to_json())
    m["attention"][0]["kernel"] = "flash9"
    with pytest.raises(FileFormatError, match="kernel='flash9' is not allowed; allowed: flash2, flash3"):
        Measurements.from_json(json.dumps(m))
    m = json.loads(_measurements().to_json())
    m["misaligned_gemm"] = [m["gemm"][0]]
    with pytest.raises(FileFormatError, match="misaligned_gemm has 1 samples; 2 are required"):
        Measurements.from_json(json.dumps(m))
    old = json.loads(_measurements().to_json())  # raw files from before 2026-11-22
    for a in old["attention"]:
        a.pop("kernel")
    del old["misaligned_gemm"]
    assert {a.kernel for a in Measurements.from_json(json.dumps(old)).attention} == {"flash2"}


# ---------------------------------------------------------------- compare: memory as measured

def test_memory_is_compared_as_the_measurement_counts_it():
    pred = {"memory_bytes": 100.0, "memory_parts_bytes": {"fragmentation_bytes": 4.0, "reserved_bytes": 10.0}}
    assert predicted_as_measured_bytes(pred, "cuda_max_memory_allocated") == 86.0
    assert predicted_as_measured_bytes(pred, "peak_rss_above_baseline") == 90.0
    assert predicted_as_measured_bytes(pred, None) == 100.0
    report = {"kind": "paraplan-run", "measured": {"step_time_s": 1.0, "peak_memory_bytes": 86.0,
                                                   "memory_kind": "cuda_max_memory_allocated"},
              "predicted": {"step_time_s": 1.0, **pred}}
    row = compare_reports([("r.json", report)], "memory")["rows"][0]
    assert row["predicted"] == 86.0 and row["error_pct"] == 0.0
    bad = {**report, "predicted": {**report["predicted"], "memory_parts_bytes": {"reserved_bytes": "x"}}}
    with pytest.raises(FileFormatError, match="memory_parts_bytes must map part names to numbers"):
        compare_reports([("r.json", bad)], "memory")


def test_run_attention_backend_names():
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend

    from paraplan.run import attention
    fused = {n for n in SDPBackend.__members__ if n not in ("ERROR", "OVERRIDEABLE")}
    assert {b.name for b in attention.BACKEND_KERNEL} == fused
    assert attention.BACKEND_KERNEL[SDPBackend.CUDNN_ATTENTION] is AttentionKernel.FLASH3
    # a CPU runs torch's own flash kernel, grouped-query attention included
    assert attention.run_kernel(8, 2, 64, 32, torch.device("cpu"), torch.float32) is AttentionKernel.FLASH2
    q = torch.zeros(1, 8, 64, 32)
    orig = torch._fused_sdp_choice
    try:
        torch._fused_sdp_choice = lambda *a, **k: int(SDPBackend.CUDNN_ATTENTION)
        assert attention.default_kernel(q, q, q) is AttentionKernel.FLASH3
        torch._fused_sdp_choice = lambda *a, **k: int(SDPBackend.MATH)
        assert attention.default_kernel(q, q, q) is AttentionKernel.UNFUSED
    finally:
        torch._fused_sdp_choice = orig


def test_torchtitan_without_fsdp_runs_under_autocast():
    from paraplan.export.megatron import SUPPORT as MEGATRON
    from paraplan.export.torchtitan import SUPPORT as TORCHTITAN
    from paraplan.plan.axes import ZeroStage
    ddp = make_plan(dp=8, zero=ZeroStage.NONE)
    assert TORCHTITAN.adapt(ddp).autocast and TORCHTITAN.adapt(make_plan()).autocast
    assert not TORCHTITAN.adapt(make_plan(dp=8, zero=ZeroStage.PARAMETERS)).autocast  # FSDP2's bf16 policy
    assert not TORCHTITAN.adapt(make_plan(tp=2, zero=ZeroStage.PARAMETERS)).autocast
    assert not MEGATRON.adapt(ddp).autocast


def test_autocast_casts_weights_and_accumulates_fp32_gradients_every_micro_batch():
    model = load_model("llama3-8b")
    wl = Workload(global_batch_size=4, seq_len=2048)
    kw = dict(micro_batch_size=1, fused_kernels=False)
    a = estimate(model, H100, wl, make_plan(**kw)).layer_detail
    b = estimate(model, H100, wl, make_plan(autocast=True, **kw)).layer_detail
    params, tensors, m = model.layer_params / model.num_layers, 7.0, 4
    assert params == pytest.approx(model.attn_params_per_layer + model.norm_params_per_layer
                                   + model.mlp_params_per_layer)
    cast = float(memory_bound_time_s(H100.gpu, 6.0 * params, tensors))
    add = float(memory_bound_time_s(H100.gpu, 12.0 * params, tensors))
    assert float(b["fwd"]["element-wise"] - a["fwd"]["element-wise"]) == pytest.approx(cast, rel=1e-9)
    assert float(b["bwd"]["element-wise"] - a["bwd"]["element-wise"]) == pytest.approx(cast + add * (m - 1) / m,
                                                                                      rel=1e-9)


def test_loss_efficiency_reproduces_the_measured_cross_entropy():
    sample = LossSample(tokens=8192, vocab=32768, dtype="bfloat16", fwd_time_s=2.0e-3, bwd_time_s=3.0e-3)
    m = _measurements(loss=sample)
    prof = build_profile(m, name="t")
    gpu = cluster_from_text(prof.toml, "t").gpu
    eff = loss_efficiency(m, gpu.hbm_bw_bytes_per_s)
    assert gpu.loss_efficiency == pytest.approx(eff, abs=1e-4)
    fwd_b, bwd_b = loss_bytes_per_logit(Precision.BF16)
    priced = float(memory_bound_time_s(gpu, (fwd_b + bwd_b) * 8192 * 32768, 7, gpu.loss_bw_efficiency))
    assert priced == pytest.approx(5.0e-3, rel=1e-3)
    assert Measurements.from_json(m.to_json()).loss == sample
    assert cluster_from_text(build_profile(_measurements(), name="t").toml, "t").gpu.loss_efficiency is None


def test_gelu_mlp_has_no_extra_cast_under_autocast():
    model = load_model("gpt3-175b")
    rc = make_plan().recompute_code
    eager, _, _ = mem.layer_activation_bytes(model, make_plan(fused_kernels=False), 1, recompute_code=rc)
    cast, _, _ = mem.layer_activation_bytes(model, make_plan(fused_kernels=False, autocast=True), 1, recompute_code=rc)
    assert cast - eager == pytest.approx(8.0 * model.hidden_size)  # fp32 norm inputs + wk, wv casts; w1 alone
    # nothing is cast at 32 bits
    e32, _, _ = mem.layer_activation_bytes(model, make_plan(fused_kernels=False), 1, recompute_code=rc,
                                           precision=Precision.FP32)
    c32, _, _ = mem.layer_activation_bytes(model, make_plan(fused_kernels=False, autocast=True), 1, recompute_code=rc,
                                           precision=Precision.FP32)
    assert c32 == e32


def test_torchtitan_search_and_estimate_agree_on_autocast():
    from paraplan.export.torchtitan import SUPPORT as TORCHTITAN
    from paraplan.plan.space import enumerate_space
    model, cluster = load_model("llama3-8b"), load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=64, seq_len=2048)
    seen = set()
    for batch, _ in enumerate_space(model, cluster, wl, TORCHTITAN.search_limits()):
        for i in range(len(batch.tp)):
            plan = batch.plan(i)
            assert plan.autocast == TORCHTITAN.adapt(plan).autocast, plan.describe()
            seen.add(plan.autocast)
    assert seen == {True, False}


def test_reports_from_before_the_rename_still_predict():
    result = _compare("runs_a/run*.json", "memory")  # their config says fused_projections
    assert len(result["rows"]) == 6


def test_the_run_report_keeps_the_workers_config(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from paraplan.cli import main
    from paraplan.run import cli as run_cli
    from paraplan.run.config import RunConfig
    from paraplan.run.report import build_report, write_report

    def fake_launch(cmd, stdout):  # what the worker does: record the kernel and autocast it found
        cfg = RunConfig.from_json(Path(cmd[-1]).read_text())
        cfg = replace(cfg, plan=replace(cfg.plan, attention=AttentionKernel.FLASH3, autocast=True))
        steps = [{"step_time_s": 0.1, "loss": 1.0, "grad_norm": 1.0}] * (cfg.warmup_steps + cfg.steps)
        rec = {"rank": 0, "pp_rank": 0, "dp_rank": 0, "tp_rank": 0, "has_last_stage": True, "steps": steps,
               "peak_memory_bytes": 1e9, "memory_kind": "cuda_max_memory_allocated", "device_name": "cpu",
               "compute_dtype": "bfloat16"}
        write_report(cfg.output, build_report(cfg, [rec], device="cpu", backend="gloo", torch_version="x"))
        return 0
    monkeypatch.setattr(run_cli, "_launch", fake_launch)
    out = tmp_path / "r.json"
    assert main(["run", "--model", "llama3-8b", "--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                 "--vocab", "128", "--seq", "16", "--steps", "1", "--warmup", "0", "--device", "cpu",
                 "-o", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["config"]["plan"]["attention"] == "flash3" and r["config"]["plan"]["autocast"] is True
    assert r["config"]["output"] == str(out)


def test_a_tied_table_is_held_on_the_last_stage_too_under_pp():
    from paraplan.cost.layout import layout
    gpt = load_model("gpt3-175b")  # tied embeddings
    wl = Workload(global_batch_size=64, seq_len=2048)
    one, two = layout(gpt, wl, make_plan()), layout(gpt, wl, make_plan(pp=2))
    assert float(one.params_last_stage) == pytest.approx(gpt.num_params)  # one copy when one stage has both
    per_layer = float(two.dense_layer_params)
    assert float(two.params_last_stage) == pytest.approx(float(two.last_stage_layers) * per_layer + gpt.embedding_params
                                                         + gpt.hidden_size)


def test_autocast_cast_cache_under_full_recomputation_is_the_larger_peak():
    """The loss runs inside the autocast region: at the end of the forward every layer's cast
    is alive beside ~10 B per logit; the backward frees the re-run layers' casts while the
    loss holds 12. Only casts beyond 2 B per logit come off."""
    model = load_model("llama3-8b")
    wl = Workload(global_batch_size=4, seq_len=2048)
    kw = dict(micro_batch_size=1, fused_kernels=False, autocast=True)
    none = estimate(model, H100, wl, make_plan(**kw)).memory.weights_bytes
    full = estimate(model, H100, wl, make_plan(recompute=Recompute.FULL, **kw)).memory.weights_bytes
    # the loss's backward holds 12 B per logit where its forward held 10: the 2 B per logit
    # between them (2,048 × 128,256 logits) is what recomputation frees of the 16-bit casts;
    # the 31 re-run layers' casts (6.8 GB) are more, so the logits bound it
    assert none - full == pytest.approx(2.0 * 2048 * 128256)
    assert 31 * 2.0 * model.layer_params / model.num_layers > 2.0 * 2048 * 128256


def test_one_micro_batch_without_ddp_allocates_gradients_in_the_backward():
    """paraplan run on one GPU (autocast, no DDP buffers) with one micro-batch: at the loss's
    backward only the head's gradient exists; with more micro-batches all do."""
    model = replace(load_model("llama3-8b"), num_layers=4)  # as the recorded run: the loss's peak wins
    kw = dict(micro_batch_size=1, fused_kernels=False, autocast=True)
    one = estimate(model, H100, Workload(global_batch_size=1, seq_len=4096), make_plan(**kw)).memory
    two = estimate(model, H100, Workload(global_batch_size=2, seq_len=4096), make_plan(**kw)).memory
    assert one.gradients_bytes == pytest.approx(4.0 * (model.lm_head_params + model.hidden_size))
    assert two.gradients_bytes == pytest.approx(4.0 * model.num_params)
    assert one.activations_bytes == two.activations_bytes
    # 32 layers at 2,048 tokens: the end of the backward (every gradient, no activations) wins
    deep = estimate(load_model("llama3-8b"), H100, Workload(global_batch_size=1, seq_len=2048), make_plan(**kw)).memory
    assert deep.gradients_bytes == pytest.approx(4.0 * load_model("llama3-8b").num_params)
    assert deep.activations_bytes == 0.0 and deep.logits_bytes == 0.0
    # with DDP's buckets (torchtitan's ZeRO-0 over 8 GPUs) the gradients are there from the start
    eight = load_cluster("dgx-h100", num_gpus=8)
    ddp = estimate(model, eight, Workload(global_batch_size=8, seq_len=4096), make_plan(dp=8, **kw)).memory
    assert ddp.gradients_bytes == pytest.approx(4.0 * model.num_params)


def test_recorded_runs_of_one_and_eight_micro_batches():
    mem_result = _compare("runs_e/run*.json", "memory")
    assert max(abs(r["error_pct"]) for r in mem_result["rows"]) < 3.0
    time_result = _compare("runs_e/run*.json", "step_time", str(RUNS / "runs_d" / "h100.toml"))
    assert max(abs(r["error_pct"]) for r in time_result["rows"]) < 4.0


def test_run_summary_points_to_a_calibrated_profile_when_the_preset_is_fitted_at_scale():
    from paraplan.run.cli import _summary
    r = json.loads((RUNS / "runs_e" / "run10.json").read_text())
    r["predicted"]["sustained_compute_ratio"] = 0.75
    assert "note       dgx-h100 prices compute at 0.75" in _summary(r)
    r["predicted"]["sustained_compute_ratio"] = 1.0
    assert "note" not in _summary(r)
    del r["predicted"]["sustained_compute_ratio"]  # reports written before 2026-11-22
    assert "note" not in _summary(r)


def test_eager_sequence_parallelism_keeps_the_gathered_projection_inputs_whole():
    """DTensor SP (paraplan run, torchtitan) saves each projection's all-gathered input; only
    the norm inputs are sequence shards. calibration/cpu_sp_saved_tensors.log: 2 CPU ranks,
    hidden 256, fp32 -- 11,008 and 9,984 bytes per token per rank once the CPU's composite
    RMSNorm's own saved tensors are set aside, which is what these give."""
    spec = replace(load_model("llama3-8b"), num_layers=1, hidden_size=256, num_heads=8, num_kv_heads=2, head_dim=32,
                   ffn_hidden_size=704, vocab_size=512)
    per_token = {}
    for fused in (True, False):
        for sp in (False, True):
            p = make_plan(tp=2, sequence_parallel=sp, fused_kernels=fused)
            stored, _, _ = mem.layer_activation_bytes(spec, p, 96, recompute_code=p.recompute_code,
                                                      precision=Precision.FP32)
            per_token[fused, sp] = float(stored) / 96
    assert per_token[False, False] == 11008.0 and per_token[False, True] == 9984.0
    h = 256
    assert per_token[False, False] - per_token[False, True] == 2 * 4 * h / 2  # the two norm inputs only
    assert per_token[True, False] - per_token[True, True] == 4 * 4 * h / 2    # Megatron: the GEMM inputs too
