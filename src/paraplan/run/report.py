"""The JSON report of one run: what was measured beside what paraplan predicts for the same
model, plan, workload and hardware (no torch here; `paraplan compare` reads these files).

Schema: run/report_format.py.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, replace

from ..errors import ParaplanError
from ..plan.plan import plan_fields
from ..specs.workload import Precision
from .config import RUN_OPTIMIZER, RunConfig, runs_under_autocast
from .report_format import (CPU_MEMORY_KIND, GPU_MEMORY_KIND, REPORT_KIND, REPORT_VERSION,
                            predicted_as_measured_bytes)
from ..report.strict_json import json_text

# a run is refused before it builds its model when the model's memory exceeds what the rank
# has by more than this (the memory model is within a few percent of measured runs:
# calibration/h100_2026-11-23): an out-of-memory crash deep in a worker says less
PREFLIGHT_MARGIN = 1.05


def preflight_bytes(cfg: RunConfig, device: str) -> float:
    """The model's peak memory per rank for this run, counted as the run measures it (live
    tensors on a GPU; on a CPU the allocator's slack too): any cluster will do, the memory
    model does not depend on the GPU's rates."""
    from ..cost.estimate import estimate
    from ..specs.catalog import load_cluster
    plan = replace(cfg.plan, autocast=runs_under_autocast(cfg.plan, device, cfg.workload.precision))
    est = estimate(cfg.model, load_cluster("dgx-h100", num_gpus=cfg.world_size), run_workload(cfg, device), plan)
    return predicted_as_measured_bytes({"memory_bytes": est.memory.total, "memory_parts_bytes": est.memory.parts()},
                                       CPU_MEMORY_KIND if device == "cpu" else GPU_MEMORY_KIND)


def run_workload(cfg: RunConfig, device: str):
    """The workload as the run computes it: a CPU run in fp32, keeping and gathering fp32
    parameters (no FSDP2 mixed-precision policy there): an fp32 workload (4-byte
    activations, weights and all-gathers, no master copy; cost/evaluate.py `layout`)."""
    return replace(cfg.workload, precision=Precision.FP32) if device == "cpu" else cfg.workload


def refused_report(reason: str) -> dict:
    """What a run refused before it started leaves for `paraplan run` to say."""
    return {"kind": REPORT_KIND, "version": REPORT_VERSION, "status": "refused", "reason": reason}


def preflight_refusal(need_bytes: float, have_bytes: float, where: str) -> str:
    """Why a run does not start ("" when it may): the model's bytes against the rank's."""
    from ..units import fmt_bytes
    if need_bytes <= PREFLIGHT_MARGIN * have_bytes:
        return ""
    return (f"the memory model predicts {fmt_bytes(need_bytes)} per rank for this run, more than the "
            f"{fmt_bytes(have_bytes)} {where}; lower --vocab, --hidden, --layers, --seq or --mb, add "
            "--recompute full, or spread the model over more ranks (--tp, --pp, --zero 3)")


def predict(cfg: RunConfig, device: str, device_name: str) -> tuple[dict | None, str]:
    """paraplan's estimate of this run on `cfg.hardware` (or, on a GPU, the cluster preset of
    its GPU); (None, why) when there is no hardware to predict for or the plan is rejected."""
    from ..cost.estimate import estimate
    from ..specs.catalog import list_clusters, load_cluster, load_gpu
    hardware = cfg.hardware
    if hardware is None and device == "cuda":
        try:
            gpu = load_gpu(device_name.removeprefix("NVIDIA ").strip())
        except ParaplanError:
            return None, f"no GPU preset matches {device_name!r}; pass --hardware (a calibrated profile)"
        hardware = next((c for c in list_clusters() if load_cluster(c).gpu.name == gpu.name), None)
        if hardware is None:
            return None, f"no cluster preset has a {gpu.name}; pass --hardware"
    if hardware is None:
        return None, "no hardware profile for this CPU; pass --hardware (a `paraplan calibrate` profile)"
    cpu = device == "cpu"
    workload = run_workload(cfg, device)
    try:
        cluster = load_cluster(hardware, num_gpus=cfg.world_size)
        if cpu and Precision.FP32 not in cluster.gpu.peak_flops_per_s:
            return None, (f"{hardware} has no fp32 rate (a CPU run computes in fp32); calibrate again with "
                          "`paraplan calibrate --device cpu`")
        est = estimate(cfg.model, cluster, workload, cfg.plan)
    except ParaplanError as exc:
        return None, f"no prediction: {exc}"
    return {"step_time_s": est.step_time_s, "tokens_per_s": est.tokens_per_s,
            "memory_bytes": est.memory.total, "memory_parts_bytes": est.memory.parts(), "fits": est.fits,
            "hardware": cluster.name, "time_breakdown_s": est.time_parts(),
            "sustained_compute_ratio": cluster.gpu.sustained_compute_ratio}, ""


def repredict(report: dict, hardware: str, shown: str) -> dict:
    """The report with its prediction made again on `hardware` (a preset or profile TOML)."""
    from ..errors import FileFormatError
    if not isinstance(report.get("config"), dict):
        raise FileFormatError(shown, "has no run config to predict again (written by an older paraplan run)")
    cfg = replace(RunConfig.from_json(json.dumps(report["config"]), shown), hardware=hardware)
    # reports written before the workload named the run's optimizer (2026-11-22) store "adam",
    # and before the plan said so, that its data parallelism copies as FSDP2 does and that its
    # model keeps wq, wk, wv, w1, w3 separate: every run's does
    # (and, before 2026-11-22, whether it ran under autocast)
    device = report.get("device", "cpu")
    cfg = replace(cfg, workload=replace(cfg.workload, optimizer=RUN_OPTIMIZER),
                  plan=replace(cfg.plan, fsdp2_copies=True, fused_kernels=False,
                               autocast=runs_under_autocast(cfg.plan, device, cfg.workload.precision)))
    prediction, note = predict(cfg, device, report.get("device_name", "cpu"))
    if prediction is None:
        raise FileFormatError(shown, note)
    return {**report, "predicted": prediction, "prediction_note": ""}


def _plan_dict(cfg: RunConfig) -> dict:
    d = plan_fields(cfg.plan)
    d["describe"] = cfg.plan.describe()
    return d


def build_report(cfg: RunConfig, records: list[dict], *, device: str, backend: str, torch_version: str) -> dict:
    """The report from every rank's record (worker.py): slowest rank per step, median over
    the measured steps; loss averaged over the data-parallel ranks of the last stage."""
    warm = cfg.warmup_steps
    per_step = [max(r["steps"][i]["step_time_s"] for r in records) for i in range(warm + cfg.steps)]
    step_time_s = statistics.median(per_step[warm:])
    loss_ranks = sorted((r for r in records if r["has_last_stage"] and r["tp_rank"] == 0), key=lambda r: r["dp_rank"])
    losses = [sum(r["steps"][i]["loss"] for r in loss_ranks) / len(loss_ranks) for i in range(warm + cfg.steps)]
    first = records[0]
    prediction, note = predict(cfg, device, first["device_name"])
    mem = [r["peak_memory_bytes"] for r in sorted(records, key=lambda r: r["rank"])]
    return {
        "kind": REPORT_KIND, "version": REPORT_VERSION, "status": "ok", "command": cfg.command_line(),
        "model": asdict(cfg.model), "plan": _plan_dict(cfg),
        "workload": {k: (str(v) if hasattr(v, "value") else v) for k, v in asdict(cfg.workload).items()},
        "world_size": cfg.world_size, "device": device, "device_name": first["device_name"], "backend": backend,
        "torch_version": torch_version, "compute_dtype": first["compute_dtype"],
        "measured": {
            "step_time_s": step_time_s, "step_times_s": per_step,
            "tokens_per_s": cfg.workload.tokens_per_step / step_time_s,
            "peak_memory_bytes": max(mem), "peak_memory_bytes_per_rank": mem, "memory_kind": first["memory_kind"],
            # torch's own counters on CUDA (None on a CPU): what validate's peak-memory rows compare
            **{key: largest_measured(records, key) for key in ("peak_allocated_bytes", "peak_reserved_bytes")},
            "losses": losses, "grad_norms": [first["steps"][i]["grad_norm"] for i in range(warm + cfg.steps)],
            "warmup_steps": warm, "steps": cfg.steps,
        },
        "predicted": prediction, "prediction_note": note,
        "config": json.loads(cfg.to_json()),  # what `paraplan compare --hardware` re-predicts
    }


def largest_measured(records: list[dict], key: str) -> int | None:
    """The largest of the ranks' `key`, or None where a rank did not measure it (a CPU)."""
    values = [r.get(key) for r in records]
    return None if any(v is None for v in values) else max(values)


def write_report(path: str, report: dict) -> None:
    """The report as JSON at `path` (`run -o`), whole or not at all (outfile.py)."""
    from ..outfile import write_output
    write_output(path, json_text(report, indent=1) + "\n", "run", "--output")
