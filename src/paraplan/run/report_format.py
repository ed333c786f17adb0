"""The format of a `paraplan run` report, which run/report.py writes and report/compare.py
reads: its kind and version, and what its measured memory counts.

Schema (SI units, keys carry them):
  {"kind": "paraplan-run", "version": 1, "status": "ok", "command": "paraplan run ...",
   "model": {...ModelSpec...}, "plan": {...Plan..., "describe"}, "workload": {...},
   "world_size", "device", "device_name", "backend", "torch_version", "compute_dtype",
   "measured": {"step_time_s" (median over measured steps of the slowest rank's time),
                "step_times_s", "tokens_per_s", "peak_memory_bytes" (max over ranks),
                "peak_memory_bytes_per_rank", "memory_kind", "losses", "grad_norms",
                "warmup_steps", "steps"},
   "predicted": {"step_time_s", "tokens_per_s", "memory_bytes", "memory_parts_bytes", "fits",
                 "hardware"} or null, "prediction_note": why it is null,
   "config": the RunConfig, so that the run can be predicted again on other hardware}
"""

from __future__ import annotations

# what run/report.py writes in every report, and the only version this paraplan reads
REPORT_KIND = "paraplan-run"
REPORT_VERSION = 1

# The parts of the predicted memory that a measured peak (measure.py, by its kind) leaves
# out: torch.cuda.max_memory_allocated counts live tensors only -- not the runtime (CUDA
# context, NCCL, workspaces: the GPU's reserved bytes) nor the caching allocator's slack
# (fragmentation); a CPU's peak RSS above the RSS before the model was built excludes the
# runtime but holds the allocator's slack.
GPU_MEMORY_KIND, CPU_MEMORY_KIND = "cuda_max_memory_allocated", "peak_rss_above_baseline"  # (measure.py)
MEMORY_KIND_EXCLUDES = {GPU_MEMORY_KIND: ("reserved_bytes", "fragmentation_bytes"),
                        CPU_MEMORY_KIND: ("reserved_bytes",)}


def predicted_as_measured_bytes(predicted: dict, memory_kind: str | None) -> float:
    """The predicted peak memory counted as a run of `memory_kind` measures it: the total
    less the parts that measurement leaves out (MEMORY_KIND_EXCLUDES). A TypeError when the
    parts are not numbers (a hand-edited report)."""
    parts = predicted.get("memory_parts_bytes")
    parts = parts if isinstance(parts, dict) else {}
    return predicted["memory_bytes"] - sum(parts.get(k, 0.0) for k in MEMORY_KIND_EXCLUDES.get(memory_kind or "", ()))
