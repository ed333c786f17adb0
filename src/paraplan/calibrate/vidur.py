"""Efficiency curves from vidur's measured operator and NCCL times (shared/validation/
vidur_profiling; microsoft/vidur, MIT), compared with the GPU and cluster presets.

- GEMM: every profiled linear (attn_pre_proj = QKV, attn_post_proj, mlp_up_proj,
  mlp_down_proj) at every token count T and TP degree t has the shape T × n × k of
  specs/model.py; efficiency = 2·T·n·k / ((median time − τ) · dense BF16 peak), τ = 4 µs,
  median per half-decade of FLOPs (the presets' binning).
- NVLink: all-reduce inside one node, bus bandwidth 2(n−1)/n·B / time over the tier's
  unidirectional bandwidth, median per decade of bytes (it includes NCCL's launch latency,
  as the presets' curves do).
- Point-to-point: send_recv between two GPUs of one node, B / time over the same bandwidth.
No torch here.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from pathlib import Path

from ..errors import FileFormatError
from ..specs.catalog import load_cluster, load_gpu
from ..specs.curves import EfficiencyCurve

LAUNCH_S = 4e-6  # the presets' kernel_launch_overhead_us
GEMM_FILES = {"h100": ("compute_h100_meta-llama_Llama-2-70b-hf_mlp.csv", "compute_h100_meta-llama_Llama-2-7b-hf_mlp.csv"),
              "a100": ("compute_a100_meta-llama_Llama-2-70b-hf_mlp.csv",)}
PRESETS = {"h100": ("h100-sxm-80gb", "dgx-h100"), "a100": ("a100-sxm-80gb", "dgx-a100-80gb")}


def _rows(path: Path):
    try:
        with path.open(newline="") as fh:
            yield from csv.DictReader(fh)
    except OSError as e:
        raise FileFormatError(str(path), f"cannot read vidur profile ({e.strerror})") from None


def gemm_points(path: Path, peak_flops_per_s: float) -> list[tuple[float, float]]:
    """(FLOPs, efficiency) of every profiled linear layer."""
    out = []
    for r in _rows(path):
        T, t = int(r["num_tokens"]), int(r["num_tensor_parallel_workers"])
        h, f, a, kv = int(r["n_embd"]), int(r["n_expanded_embd"]), int(r["n_head"]), int(r["n_kv_head"])
        d, gated = h // a, r["use_gated_mlp"] == "True"
        shapes = {"attn_pre_proj": (T, (a + 2 * kv) * d // t, h), "attn_post_proj": (T, h, a * d // t),
                  "mlp_up_proj": (T, f * (2 if gated else 1) // t, h), "mlp_down_proj": (T, h, f // t)}
        for op, (m, n, k) in shapes.items():
            sec = float(r[f"time_stats.{op}.median"]) * 1e-3 - LAUNCH_S
            flops = 2.0 * m * n * k
            if sec > 0:
                out.append((flops, min(flops / sec / peak_flops_per_s, 1.0)))
    return out


def link_points(path: Path, op: str, bw_unidir_bytes_per_s: float) -> list[tuple[float, float]]:
    """(bytes, bus-bandwidth efficiency) of single-node all-reduce or send_recv samples."""
    out = []
    for r in _rows(path):
        n, per_node = int(r["num_workers"]), int(r["devices_per_node"])
        if n < 2 or per_node != n:  # inside one node (NVLink) only
            continue
        B, sec = int(r["size"]), float(r[f"time_stats.{op}.median"]) * 1e-3
        moved = 2 * (n - 1) / n * B if op == "all_reduce" else B
        out.append((B, moved / sec / bw_unidir_bytes_per_s))
    return out


def binned(points, per_decade: int, min_samples: int = 3) -> list[tuple[float, float]]:
    """Median y per 1/per_decade of a decade of x, over bins with at least min_samples points."""
    bins = defaultdict(list)
    for x, y in points:
        bins[round(per_decade * math.log10(x)) / per_decade].append(y)
    return [(10 ** k, statistics.median(v)) for k, v in sorted(bins.items()) if len(v) >= min_samples]


def _diff(preset_x, preset_y, derived) -> list[dict]:
    curve = EfficiencyCurve.from_pairs(derived)  # the presets' interpolation (log-x, clamped)
    return [{"size": x, "preset": y, "vidur": round(curve.at(x), 4), "diff": round(y - curve.at(x), 4)}
            for x, y in zip(preset_x, preset_y)]


def compare_with_presets(root: str) -> dict:
    """Derived curves per GPU and, beside each, the preset's curve at its own points."""
    rootp = Path(root)
    out = {}
    for gpu_key, files in GEMM_FILES.items():
        gpu_name, cluster_name = PRESETS[gpu_key]
        gpu, cluster = load_gpu(gpu_name), load_cluster(cluster_name)
        from ..specs.workload import Precision
        pts = [p for fn in files for p in gemm_points(rootp / fn, gpu.peak(Precision.BF16))]
        gemm = binned(pts, 2)
        bw = cluster.nvlink.bw_unidir_bytes_per_s
        ar = binned(link_points(rootp / f"network_{gpu_key}_dgx_all_reduce.csv", "all_reduce", bw), 1)
        p2p = binned(link_points(rootp / f"network_{gpu_key}_dgx_send_recv.csv", "send_recv", bw), 1)
        out[gpu_key] = {
            "gpu_preset": gpu_name, "cluster_preset": cluster_name, "gemm_samples": len(pts),
            "gemm": gemm, "nvlink_all_reduce": ar, "nvlink_send_recv": p2p,
            "gemm_vs_preset": _diff(gpu.gemm_efficiency.x, gpu.gemm_efficiency.y, gemm),
            "nvlink_vs_preset": _diff(cluster.nvlink.efficiency.x, cluster.nvlink.efficiency.y, ar),
            "send_recv_vs_nvlink_preset": _diff(cluster.nvlink.efficiency.x, cluster.nvlink.efficiency.y, p2p),
        }
    return out


def render_comparison(result: dict) -> str:
    lines = []
    for gpu_key, r in result.items():
        lines.append(f"{gpu_key}: {r['gemm_samples']} GEMM samples; preset {r['gpu_preset']} / {r['cluster_preset']}")
        for title, key in (("GEMM efficiency (FLOPs)", "gemm_vs_preset"),
                           ("NVLink all-reduce bus-bw efficiency (bytes)", "nvlink_vs_preset"),
                           ("NVLink send/recv vs the preset's NVLink curve (bytes)", "send_recv_vs_nvlink_preset")):
            rows = r[key]
            worst = max(rows, key=lambda d: abs(d["diff"]))
            lines.append(f"  {title}: max |preset - vidur| {abs(worst['diff']):.3f} at {worst['size']:.3g}")
            lines.append("    " + "  ".join(f"{d['size']:.2g}: {d['preset']:.3f}/{d['vidur']:.3f}" for d in rows))
    return "\n".join(lines)
