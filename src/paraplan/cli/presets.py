"""`paraplan presets`: the model, GPU and cluster presets."""

from __future__ import annotations

from ..report.strict_json import json_text


def add_parser(sub) -> None:
    r = sub.add_parser("presets", help="list model, GPU and cluster presets")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_presets)


def cmd_presets(args) -> int:
    from ..report.table import grid
    from ..specs.catalog import list_clusters, list_gpus, list_models, load_cluster, load_gpu, load_model
    from ..units import GIGA, TERA, fmt_count
    from ..specs.workload import Precision
    models = [load_model(n) for n in list_models()]
    gpus = [load_gpu(n) for n in list_gpus()]
    clusters = [load_cluster(n) for n in list_clusters()]
    if args.json:
        print(json_text({"models": [m.name for m in models], "gpus": [g.name for g in gpus],
                          "clusters": [c.name for c in clusters]}, indent=1))
        return 0
    def ffn(m):  # MoE: routed experts E / top-k × expert width (+ shared), dense layers aside
        if not m.is_moe:
            return str(m.ffn_hidden_size)
        text = f"{m.num_experts}/{m.top_k}×{m.moe_ffn_hidden_size}"
        if m.shared_expert_ffn_hidden_size:
            text += f"+{m.shared_expert_ffn_hidden_size}"
        return text + (f" ({m.num_dense_mlp_layers} dense {m.ffn_hidden_size})" if m.num_dense_mlp_layers else "")
    print(grid(["model", "params", "active", "layers", "hidden", "heads/kv", "ffn (experts/top-k×f_e)", "vocab"],
               [[m.name, fmt_count(m.num_params), fmt_count(m.num_active_params) if m.is_moe else "",
                 str(m.num_layers) + (f"+{m.mtp_layers} MTP" if m.mtp_layers else ""), str(m.hidden_size),
                 f"{m.num_heads}/{m.num_kv_heads}" + (" MLA" if m.is_mla else ""),
                 ffn(m), str(m.vocab_size)] for m in models]))
    print()
    print(grid(["gpu", "bf16 TFLOP/s", "fp8 TFLOP/s", "nvfp4 TFLOP/s", "HBM GB", "HBM TB/s", "TDP W"],
               [[g.name, f"{g.peak_flops_per_s.get(Precision.BF16, 0) / TERA:.0f}",
                 f"{g.peak_flops_per_s.get(Precision.FP8, 0) / TERA:.0f}",
                 f"{g.peak_flops_per_s[Precision.NVFP4] / TERA:.0f}" if Precision.NVFP4 in g.peak_flops_per_s else "-",
                 f"{g.hbm_bytes / GIGA:.0f}",
                 f"{g.hbm_bw_bytes_per_s / TERA:.2f}", f"{g.tdp_watts:.0f}"] for g in gpus]))
    print()
    def islands(c):  # the tier above the scale-out network: island (pod) size, per-GPU rate
        if not (c.gpus_per_island and c.dcn is not None):
            return "-"
        return f"{c.gpus_per_island:,} @ {c.dcn.bw_unidir_bytes_per_s / GIGA:.2g}"
    print(grid(["cluster", "gpu", "gpus", "per node", "NVLink GB/s", "net GB/s/GPU", "island @ GB/s/GPU",
                "host GB (GPUs)", "$/GPU-h"],
               [[c.name, c.gpu.name, str(c.num_gpus), str(c.gpus_per_node), f"{c.nvlink.bw_unidir_bytes_per_s / GIGA:.0f}",
                 f"{c.scaleout.bw_unidir_bytes_per_s / GIGA:.0f}", islands(c),
                 f"{c.host_memory_bytes_per_host / GIGA:,.0f} ({c.host_gpus})" if c.host_memory_bytes_per_host else "-",
                 f"{c.usd_per_gpu_hour:.2f}"] for c in clusters]))
    return 0
