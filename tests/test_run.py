"""`paraplan run` on CPU/gloo with 2-8 ranks, checked against a single process; and
`paraplan compare`'s error math, Kendall tau, table and plot.

Every parallel run must reproduce the single-process run of the same seed and data
(reference.py: whole batch, one forward, no torch.distributed) step by step, in loss and in
gradient norm. Tolerance: relative 1e-5. The runs compute in fp32; TP, FSDP, micro-batching
and pipelining only reorder sums (row-parallel partial sums, reduce-scatters, gradient
accumulation), which moves a result by a few fp32 ulps (observed: <= 5e-7 relative over 3
steps, benchmarks/run_kinds.py). A real fault is orders above that: a dropped or doubled gradient contribution
changes the gradient norm by tens of percent and, after an AdamW step at lr 1e-3, the next
loss by ~1e-4 relative.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from paraplan.cli import main

# 4 layers, hidden 64: 0.2M parameters; 3 steps (1 warm-up): a 2-rank run takes ~15 s here.
TINY = ["--model", "llama3-8b", "--layers", "4", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
        "--vocab", "256", "--seq", "32", "--batch", "4", "--steps", "2", "--warmup", "1", "--device", "cpu"]
RTOL = 1e-5

PLANS = {
    "fsdp": (["--dp", "2", "--zero", "3", "--hardware", "dgx-h100"], 2, "TP1 PP1 DP2 mb1 rc:none zero3"),
    # two micro-batches per rank below ZeRO-3: parameters stay gathered across them; ZeRO-2
    # reduce-scatters each micro-batch's gradients, ZeRO-0 reduces once per step
    "zero2": (["--dp", "2", "--zero", "2"], 2, "TP1 PP1 DP2 mb1 rc:none zero2"),
    "ddp": (["--dp", "2"], 2, "TP1 PP1 DP2 mb1 rc:none"),
    "tp_sp": (["--tp", "2", "--recompute", "selective"], 2, "TP2 PP1 DP1 mb1 SP rc:selective"),
    "pp_1f1b": (["--pp", "2", "--mb", "1"], 2, "TP1 PP2 DP1 mb1 1f1b rc:none"),
    "pp_interleaved": (["--pp", "2", "--vp", "2", "--recompute", "full"], 2, "TP1 PP2 DP1 VP2 mb1 interleaved rc:full"),
    # ZB-V: rank 0 holds the first and the last chunk (the embedding and the head), in a V
    "pp_zbv": (["--pp", "2", "--vp", "2", "--schedule", "zbv"], 2, "TP1 PP2 DP1 VP2 mb1 zbv rc:none"),
    # DualPipeV: the same V, forward-backward pairs as one action (torch ScheduleDualPipeV)
    "pp_dualpipev": (["--pp", "2", "--vp", "2", "--schedule", "dualpipev"], 2, "TP1 PP2 DP1 VP2 mb1 dualpipev rc:none"),
    # the schedule search's order (sim/repetend.py) at 1F1B's in-flight activations, B and W
    # split, on torch's _PipelineScheduleRuntime from its action list (run/searched.py)
    "pp_searched": (["--pp", "4", "--schedule-search"], 4, "TP1 PP4 DP1 mb1 1f1b rc:none"),
    "pp_fsdp_tp": (["--pp", "2", "--dp", "2", "--tp", "2", "--zero", "3"], 8, "TP2 PP2 DP2 mb1 1f1b SP rc:none zero3"),
    # uneven splits as the cost model lays them out: 4 layers on 3 stages (1, 2, 1: the
    # embedding's and the head's slots), and in 2 × 3 chunks (0, 1, 1, 1, 1, 0: the first
    # chunk the embedding alone, the last the norm and head alone)
    "pp3_uneven": (["--pp", "3"], 3, "TP1 PP3 DP1 mb1 1f1b rc:none"),
    "pp2_vp3_uneven": (["--pp", "2", "--vp", "3"], 2, "TP1 PP2 DP1 VP3 mb1 interleaved rc:none"),
}


def _cfg(argv):
    from paraplan.run.cli import config_from_argv
    return config_from_argv(argv)


@pytest.fixture(scope="module")
def reference():
    """Single-process losses and gradient norms of the TINY configuration."""
    pytest.importorskip("torch")
    from paraplan.run.reference import single_process_run
    return single_process_run(_cfg(TINY))


@pytest.mark.parametrize("name", list(PLANS))
def test_parallel_run_matches_single_process(name, reference, tmp_path, capfd):
    flags, world, describe = PLANS[name]
    out = tmp_path / "run.json"
    rc = main(["run", *TINY, *flags, "-o", str(out)])
    captured = capfd.readouterr()
    assert rc == 0, captured.err[-3000:]
    report = json.loads(out.read_text())
    assert report["status"] == "ok" and report["world_size"] == world and report["backend"] == "gloo"
    assert report["plan"]["describe"].startswith(describe)
    m = report["measured"]
    ref_losses, ref_norms = reference
    assert len(m["losses"]) == len(ref_losses) == 3
    np.testing.assert_allclose(m["losses"], ref_losses, rtol=RTOL)
    np.testing.assert_allclose(m["grad_norms"], ref_norms, rtol=RTOL)
    assert len(m["step_times_s"]) == 3 and m["step_time_s"] > 0 and m["peak_memory_bytes"] > 0
    assert len(m["peak_memory_bytes_per_rank"]) == world
    # torch's CUDA counters are not measured on a CPU: said as null, never as a number
    assert m["peak_allocated_bytes"] is None and m["peak_reserved_bytes"] is None
    assert m["tokens_per_s"] == pytest.approx(4 * 32 / m["step_time_s"])
    # the summary printed names the measured and predicted step time
    assert "measured   step" in captured.out and "predicted" in captured.out
    # the recorded command reproduces the configuration
    assert _cfg(report["command"].split()[2:]) == _cfg([*TINY, *flags, "-o", str(out)])
    if "--hardware" in flags:
        from paraplan.cost.estimate import estimate
        from paraplan.specs.catalog import load_cluster
        cfg = _cfg([*TINY, *flags])
        from dataclasses import replace as _replace
        from paraplan.specs.workload import Precision
        plan = cfg.plan
        wl = _replace(cfg.workload, precision=Precision.FP32)  # a CPU run computes in fp32
        est = estimate(cfg.model, load_cluster("dgx-h100", num_gpus=world), wl, plan)
        assert report["predicted"]["step_time_s"] == pytest.approx(est.step_time_s)
        assert report["predicted"]["memory_bytes"] == pytest.approx(est.memory.total)
        assert report["predicted"]["hardware"] == "dgx-h100"
        # compare --hardware predicts the same run again on other hardware, from the report alone
        assert main(["compare", str(out), "--hardware", "dgx-a100-80gb", "--json"]) == 0
        row = json.loads(capfd.readouterr().out)["rows"][0]
        a100 = estimate(cfg.model, load_cluster("dgx-a100-80gb", num_gpus=world), wl, plan)
        assert row["hardware"] == "dgx-a100-80gb" and row["predicted"] == pytest.approx(a100.step_time_s)
        assert row["measured"] == m["step_time_s"] and a100.step_time_s != pytest.approx(est.step_time_s)
    else:
        assert report["predicted"] is None and "--hardware" in report["prediction_note"]


def test_reference_is_not_trivially_matched(reference):
    # The check above can fail: another seed gives other losses, far outside the tolerance.
    from paraplan.run.reference import single_process_run
    other, _ = single_process_run(_cfg([*TINY, "--seed", "1"]))
    assert np.max(np.abs(np.array(other) / np.array(reference[0]) - 1)) > 100 * RTOL


# ------------------------------------------------------------------------ configuration

def test_config_round_trips_through_json():
    from paraplan.run.config import RunConfig
    cfg = _cfg([*TINY, "--pp", "2", "--vp", "2", "--dp", "2", "--zero", "2", "--recompute", "first_k",
                "--recompute-layers", "1", "--schedule", "zb"])
    assert RunConfig.from_json(cfg.to_json()) == cfg
    assert cfg.world_size == 4 and cfg.local_batch_size == 2 and cfg.num_microbatches == 2
    assert cfg.plan.checkpoint_early_stop and not cfg.plan.tp_async_backward


def test_run_is_predicted_with_the_optimizer_the_worker_steps_with():
    # run/worker.py steps torch.optim.AdamW without fused=True: its prediction prices the
    # unfused element-wise passes, not Megatron's fused kernel
    from dataclasses import replace as _replace
    from paraplan.run.config import RunConfig
    from paraplan.run.report import predict, repredict
    from paraplan.specs.workload import Optimizer
    cfg = _cfg([*TINY, "--dp", "2"])
    assert cfg.workload.optimizer is Optimizer.ADAM_UNFUSED
    assert RunConfig.from_json(cfg.to_json()).workload.optimizer is Optimizer.ADAM_UNFUSED
    # a report written before the workload said so stores "adam": it is re-predicted unfused
    old = json.loads(cfg.to_json())
    old["workload"]["optimizer"] = "adam"
    again = repredict({"config": old, "device": "cpu", "device_name": "cpu"}, "dgx-h100", "old.json")["predicted"]
    now, _ = predict(_replace(cfg, hardware="dgx-h100"), "cpu", "cpu")
    assert again["time_breakdown_s"]["optimizer_s"] == pytest.approx(now["time_breakdown_s"]["optimizer_s"])


def test_scaled_model_keeps_ratios():
    from paraplan.run.config import scale_model
    from paraplan.specs.catalog import load_model
    base = load_model("llama3-8b")
    m = scale_model(base, layers=2, hidden=512, heads=8)
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim) == (2, 512, 8, 8, 64)
    assert m.ffn_hidden_size == round(base.ffn_hidden_size * 512 / base.hidden_size / 8) * 8
    assert scale_model(base) == base


@pytest.mark.parametrize("flags,needle", [
    (["--tp", "3"], "--tp=3"),                                   # 3 does not divide 4 heads
    (["--pp", "7"], "--pp×--vp=7"),                              # more chunks than 4 layers + 2
    (["--pp", "2", "--batch", "1"], "micro-batches=1"),          # fewer micro-batches than stages
    (["--vp", "2", "--pp", "2", "--schedule", "1f1b"], "--schedule='1f1b'"),
    (["--dp", "2", "--dp-shard", "2"], "--dp-shard=2"),           # HSDP needs ZeRO-3
    (["--hardware", "no-such-cluster"], "unknown cluster"),
    (["--device", "tpu"], "--device='tpu'"),
    (["--schedule", "dualpipe", "--pp", "2"], "schedule='dualpipe'"),
    (["--hidden", "66"], "--hidden=66"),
    (["--pp", "2", "--dp", "2", "--zero", "3", "--schedule", "zb"], "--zero 3"),  # wrong in torch 2.13
    (["--pp", "2", "--vp", "2", "--dp", "2", "--zero", "3", "--schedule", "zbv"], "--zero 3"),  # and this
    (["--pp", "2", "--vp", "2", "--schedule", "zbv", "--compile"], "--compile"),  # torch: eager stages only
    (["--pp", "2", "--schedule", "zbv"], "--vp=1"),                # ZB-V runs two chunks per rank
    (["--pp", "2", "--schedule", "dualpipev"], "--vp=1"),          # so does DualPipeV
    (["--pp", "2", "--vp", "2", "--schedule", "dualpipev", "--batch", "2"], "micro-batches=2"),  # m >= 2·pp
    (["--pp", "2", "--vp", "2", "--schedule", "dualpipev", "--compile"], "--compile"),
    (["--recompute", "modules"], "--recompute='modules'"),     # Megatron-Core's, not run here
    (["--recompute", "first_k", "--recompute-layers", "5"], "--recompute-layers=5"),  # 4 layers
    (["--recompute", "first_k"], "--recompute-layers=0"),
    (["--lr", "inf"], "--lr=inf"),
    (["--tp", "2", "--compile"], "--compile"),
    (["--schedule-search"], "--schedule-search=True"),                          # needs a pipeline
    (["--pp", "2", "--vp", "2", "--schedule-search"], "--schedule-search=True"),  # one chunk per rank
    (["--pp", "2", "--schedule-search", "--compile"], "--compile"),
])
def test_bad_run_input_is_one_line_exit_2_before_any_process(flags, needle, tmp_path, capfd):
    out = tmp_path / "r.json"
    assert main(["run", *TINY, *flags, "-o", str(out)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and err.startswith("paraplan: error:") and needle in err, err
    assert not out.exists()


def test_a_run_larger_than_the_host_is_refused_in_one_line_before_its_model_is_built(tmp_path, capfd):
    """A billion-row vocabulary (256 GB of embedding in fp32): the workers agree, before
    building the model, that the memory model's bytes exceed what the host has, and the run
    says so in one line (it used to die in torch's allocator with a traceback per rank)."""
    pytest.importorskip("torch")
    out = tmp_path / "r.json"
    argv = [a if a != "256" else "1000000000" for a in TINY]
    assert main(["run", *argv, "--steps", "1", "--warmup", "0", "-o", str(out)]) == 2
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("paraplan:")]
    assert len(lines) == 1 and "the memory model predicts" in lines[0] and "--vocab" in lines[0], err
    assert "Traceback" not in err
    assert not out.exists()


def test_a_refusal_under_torchrun_by_hand_is_said_by_the_worker_and_writes_nothing(tmp_path):
    """The multi-node path (torchrun ... -m paraplan.run FLAGS): no paraplan run to read a
    refusal from a report, so rank 0 says it on stderr and nothing lands at -o."""
    pytest.importorskip("torch")
    out = tmp_path / "w.json"
    argv = [a if a != "256" else "1000000000" for a in TINY]
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                        "-m", "paraplan.run", *argv, "--steps", "1", "--warmup", "0", "-o", str(out)],
                       capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("paraplan:")]
    assert p.returncode != 0 and len(lines) == 1 and "the memory model predicts" in lines[0], p.stderr
    assert not out.exists()


def test_preflight_refuses_only_beyond_the_margin():
    from paraplan.run.report import PREFLIGHT_MARGIN, preflight_bytes, preflight_refusal
    need = preflight_bytes(_cfg(TINY), "cpu")
    assert need > 0
    assert preflight_refusal(need, need / PREFLIGHT_MARGIN * 1.001, "here") == ""
    assert "per rank" in preflight_refusal(need, need / PREFLIGHT_MARGIN * 0.999, "here")


def test_run_without_torch_is_one_line_exit_2(monkeypatch, tmp_path, capfd):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["run", *TINY, "-o", str(tmp_path / "r.json")]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "pip install 'paraplan[run]'" in err


def test_worker_outside_torchrun_is_one_line_exit_2():
    pytest.importorskip("torch")
    p = subprocess.run([sys.executable, "-m", "paraplan.run", *TINY], capture_output=True, text=True,
                       env={k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "torchrun" in p.stderr


def test_cli_does_not_import_torch():
    code = ("import sys, paraplan.cli as c; p = c.build_parser(); p.parse_args(['run', '--tp', '2']); "
            "import paraplan.report.compare; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------ compare

def test_kendall_tau_on_known_inputs():
    from paraplan.report.compare import kendall_tau_b
    assert kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # by hand: pairs (1,2)+ (1,3)+ (2,3)- -> (2 - 1) / 3
    assert kendall_tau_b([1, 2, 3], [1, 3, 2]) == pytest.approx(1 / 3)
    # with ties (tau-b; scipy.stats.kendalltau's documented example gives -0.47140452079103173)
    assert kendall_tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0]) == pytest.approx(-0.47140452079103173)
    assert np.isnan(kendall_tau_b([1, 1, 1], [1, 2, 3]))


def _fake_report(tmp_path, name, measured_s, predicted_s, plan="TP1 PP1 DP2 mb1 rc:none"):
    r = {"kind": "paraplan-run", "version": 1, "status": "ok", "command": f"paraplan run -o {name}",
         "model": {"name": "tiny"}, "plan": {"describe": plan}, "world_size": 2, "device": "cpu",
         "device_name": "cpu", "measured": {"step_time_s": measured_s, "peak_memory_bytes": 1 << 20},
         "predicted": {"step_time_s": predicted_s, "memory_bytes": 2 << 20, "hardware": "cpu-profile"}}
    p = tmp_path / name
    p.write_text(json.dumps(r))
    return str(p)


def test_compare_error_math_and_ranking(tmp_path, capsys):
    from paraplan.report.compare import compare_reports, load_reports
    files = [_fake_report(tmp_path, "a.json", 1.0, 1.1), _fake_report(tmp_path, "b.json", 2.0, 1.5),
             _fake_report(tmp_path, "c.json", 4.0, 4.0)]
    res = compare_reports(load_reports(files))
    assert [r["error_pct"] for r in res["rows"]] == pytest.approx([10.0, -25.0, 0.0])
    assert res["summary"]["mean_abs_pct_error"] == pytest.approx(35 / 3)
    assert res["summary"]["max_abs_pct_error"] == pytest.approx(25.0)
    assert res["summary"]["kendall_tau"] == pytest.approx(1.0)  # same order despite the errors
    mem = compare_reports(load_reports(files), metric="memory")
    assert mem["summary"]["mean_abs_pct_error"] == pytest.approx(100.0)
    # a prediction that swaps two runs lowers tau to (2 - 1) / 3
    swapped = files[:2] + [_fake_report(tmp_path, "d.json", 4.0, 1.2)]
    assert compare_reports(load_reports(swapped))["summary"]["kendall_tau"] == pytest.approx(1 / 3)

    png = tmp_path / "cmp.png"
    assert main(["compare", *files, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "+10.0%" in out and "-25.0%" in out and "mean |error| 11.7%" in out and "Kendall tau (ranking) +1.000" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["compare", *files, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["max_abs_pct_error"] == pytest.approx(25.0)


@pytest.mark.parametrize("content,flags,needle", [
    (None, [], "no such file"),
    ("{not json", [], "invalid JSON"),
    ('{"kind": "something-else"}', [], "not a paraplan run report"),
    ('{"kind": "paraplan-run", "version": 99, "status": "ok", "world_size": 1, "measured": {"step_time_s": 1.0}}',
     [], "version = 99 is not allowed; this paraplan reads run reports of version 1"),
    ('{"kind": "paraplan-run", "version": 1, "status": "refused", "reason": "needs 90 GiB", "world_size": 1}', [],
     "status = 'refused': the run did not complete: needs 90 GiB"),
    ('{"kind": "paraplan-run", "version": 1, "status": "ok", "world_size": 0, "measured": {"step_time_s": 1.0}}',
     [], "world_size = 0 is not allowed; a positive integer"),
    ('{"kind": "paraplan-run", "version": 1, "status": "ok", "world_size": 1, "measured": {"step_time_s": 0}}', [], "measured.step_time_s"),
    ('{"kind": "paraplan-run", "version": 1, "status": "ok", "world_size": 1, "measured": {"step_time_s": 1.0}, "predicted": null, '
     '"prediction_note": "no hardware profile for this CPU"}', [], "has no prediction (no hardware profile"),
    ('{"kind": "paraplan-run", "version": 1, "status": "ok", "world_size": 1, "measured": {"step_time_s": 1.0}, "predicted": null}', ["--hardware", "dgx-h100"],
     "has no run config to predict again"),
    ('{"kind": "paraplan-run", "version": 1, "status": "ok", "world_size": 1, "measured": {"step_time_s": 1.0}, "config": {"plan": {}}}',
     ["--hardware", "dgx-h100"], "not a paraplan run config"),
])
def test_compare_bad_input_is_one_line_exit_2(content, flags, needle, tmp_path, capsys):
    path = tmp_path / "bad.json"
    if content is not None:
        path.write_text(content)
    assert main(["compare", str(path), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and needle in err, err


def test_cuda_without_a_gpu_is_refused_before_launch(tmp_path, capfd):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    out = tmp_path / "r.json"
    assert main(["run", *TINY, "--device", "cuda", "-o", str(out)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "--device='cuda'" in err and "no GPU" in err
    assert not out.exists()


def test_a_cpu_run_is_predicted_with_fp32_parameters():
    # no mixed-precision policy on a CPU: FSDP keeps and gathers fp32 weights (4 B, not 2)
    from dataclasses import replace as _replace
    from paraplan.run.report import predict
    cfg = _replace(_cfg([*TINY, "--dp", "2", "--zero", "3"]), hardware="dgx-h100")
    cpu, _ = predict(cfg, "cpu", "cpu")
    gpu, _ = predict(cfg, "cuda", "NVIDIA H100 80GB HBM3")
    assert cpu["memory_parts_bytes"]["weights_bytes"] == pytest.approx(2 * gpu["memory_parts_bytes"]["weights_bytes"])
    assert cpu["step_time_s"] > gpu["step_time_s"]  # twice the bytes gathered
