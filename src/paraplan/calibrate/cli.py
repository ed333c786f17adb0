"""`paraplan calibrate`: microbenchmarks on this machine -> a hardware profile TOML for
`--hardware`; or, with `--vidur DIR`, efficiency curves from vidur's published profiles
compared with the GPU presets. torch is imported only when benchmarks run.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from ..argtypes import integer, non_empty
from ..report.strict_json import json_text


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="measure this machine (GEMM, attention, memory, collectives) "
                                                "and write a hardware profile for --hardware")
    p.add_argument("-o", "--output", default=None, help="write the profile TOML here (default: stdout)")
    p.add_argument("--ranks", type=integer, default=1, help="local ranks measured side by side, with collectives "
                                                        "between them (default 1: no collectives)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="default: cuda if torch sees one")
    p.add_argument("--quick", action="store_true", help="fewer shapes and shorter timings (seconds on a CPU)")
    p.add_argument("--name", default=None, help="profile name (default: calibrated-<device>-<ranks>r)")
    p.add_argument("--base-cluster", default="dgx-h100",
                   help="preset whose link tiers a one-rank profile copies (default dgx-h100)")
    p.add_argument("--raw", default=None, metavar="JSON", help="also write the raw measurements here")
    p.add_argument("--from-raw", default=None, metavar="JSON", help="build the profile from saved measurements "
                                                                    "(no benchmarks, no torch)")
    p.add_argument("--vidur", default=None, metavar="DIR", type=non_empty, help="derive curves from vidur profiling CSVs in DIR "
                                                                "and compare them with the GPU presets")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    from ..errors import SpecError
    from ..outfile import check_output, same_file, write_outputs
    # a flag the chosen mode never reads is refused, not silently ignored
    bench = (("--ranks", args.ranks, 1), ("--device", args.device, "auto"), ("--quick", args.quick, False))
    if args.vidur is not None:
        unread = bench + (("--output", args.output, None), ("--raw", args.raw, None),
                          ("--from-raw", args.from_raw, None), ("--name", args.name, None),
                          ("--base-cluster", args.base_cluster, "dgx-h100"))
        why = "with --vidur, which compares published profiles with the presets (no benchmark, no profile written)"
    else:
        unread = bench if args.from_raw is not None else ()
        why = "with --from-raw, which builds the profile from saved measurements (no benchmark runs)"
    for flag, value, default in unread:
        if value != default:
            raise SpecError("calibrate", flag, value, f"it has no effect {why}")
    if args.vidur is not None:
        from .vidur import compare_with_presets, render_comparison
        result = compare_with_presets(args.vidur)
        print(json_text(result, indent=1) if args.json else render_comparison(result))
        return 0
    from ..run.config import MAX_LOCAL_RANKS
    if not 1 <= args.ranks <= MAX_LOCAL_RANKS:  # local processes, as paraplan run launches them
        raise SpecError("calibrate", "ranks", args.ranks, f"a whole number from 1 to {MAX_LOCAL_RANKS} is required")
    # everything the user typed is checked before minutes of benchmarks
    if args.name is not None:
        check_name(args.name)
    for option, path in (("--output", args.output), ("--raw", args.raw)):
        if path is not None:
            check_output(path, "calibrate", option)
            if args.from_raw is not None and same_file(path, args.from_raw):
                raise SpecError("calibrate", option, path, "a file other than --from-raw is required "
                                "(it would overwrite the measurements it reads)")
    if args.output is not None and args.raw is not None and same_file(args.output, args.raw):
        raise SpecError("calibrate", "--raw", args.raw, "a file other than --output is required "
                        "(the profile and the measurements would overwrite each other)")
    from ..specs.catalog import load_cluster
    load_cluster(args.base_cluster)
    from .measurements import Measurements
    from .profile import build_profile
    from ..specs.files import read_text
    if args.from_raw is not None:
        m = Measurements.from_json(read_text(Path(args.from_raw), args.from_raw), args.from_raw)
    else:
        try:
            from .bench import measure
        except ImportError as e:
            raise SpecError("calibrate", "torch", "missing", f"benchmarks need torch ({e}); "
                            "pip install 'paraplan[run]', or pass --from-raw") from None
        m = measure(args.device, args.ranks, args.quick)
    name = args.name or f"calibrated-{m.device_type}-{m.ranks}r"
    command = "paraplan " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["calibrate"] else ""
    prof = build_profile(m, name=name, command=command, base_cluster=args.base_cluster)
    # both or neither: a full disk after the raw measurements must not leave them alone
    write_outputs([(path, data, option) for path, data, option in (
        (args.raw, m.to_json(), "--raw"), (args.output, prof.toml + "\n", "--output")) if path is not None],
        "calibrate")
    summary = _summary(name, m, prof, args.output)
    if args.json:
        print(json_text(summary, indent=1))
    elif args.output:
        print(render_summary(summary))
        print(f"wrote {args.output} (use it as --hardware {args.output})")
    else:
        print(prof.toml)
    return 0


def _summary(name: str, m, prof, output: str | None) -> dict:
    """What a calibration measured and fitted (--json; the table of render_summary)."""
    from .profile import misaligned_ratio
    return {"name": name, "device": m.device_name, "ranks": m.ranks, "threads_per_rank": m.threads_per_rank,
               "compute_dtype": m.compute_dtype, "peak_flops_per_s": prof.peak_flops_per_s,
               "gemm_efficiency": prof.gemm_curve, "attention_efficiency": prof.attention_curves,
               "memory_bw_bytes_per_s": prof.memory_bw_bytes_per_s, "launch_overhead_s": prof.launch_overhead_s,
               "elementwise_efficiency": prof.elementwise_efficiency,
               "compiled_elementwise_ratio": prof.compiled_elementwise_ratio,
               "scatter_add_efficiency": prof.scatter_add_efficiency,
               "layer_launch_overhead_s": prof.layer_launch_overhead_s,
               "eager_layer_host_s": prof.eager_layer_host_s,
               "optimizer_efficiency": prof.optimizer_efficiency,
               "loss_efficiency": prof.loss_efficiency,
               "link": None if prof.link is None else {"latency_s": prof.link.latency_s,
                                                       "bw_unidir_bytes_per_s": prof.link.bw_unidir_bytes_per_s,
                                                       "efficiency": prof.link.curve,
                                                       "op_efficiency": dict(prof.link.op_curves)},
               "overlap_slowdown": m.overlap.slowdown if m.overlap else None,
               "misaligned_gemm_efficiency_ratio": misaligned_ratio(m),
               "tp_collective_overhead_s": prof.tp_collective_overhead_s,
               "load_average": m.load_average, "cpu_count": m.cpu_count, "output": output}


def check_name(name: str) -> None:
    """A profile name is one printable line (it names the cluster in every table)."""
    from ..errors import SpecError
    if not name or not name.isprintable():  # str.isprintable: no control character, no lone surrogate
        raise SpecError("calibrate", "--name", name, "a non-empty name of printable characters is required "
                                                     "(no newline, tab or other control character)")


def render_summary(s: dict) -> str:
    from .profile import printable  # a device name from a raw file may hold a newline
    lines = [f"{printable(s['device'])}: {s['ranks']} rank(s) x {s['threads_per_rank']} thread(s), {s['compute_dtype']}; "
             f"load average {s['load_average']:.1f} on {s['cpu_count']} CPUs",
             f"GEMM peak        {s['peak_flops_per_s'] / 1e9:,.1f} GFLOP/s; efficiency by FLOPs: "
             + ", ".join(f"{x:.2g}:{y:.2f}" for x, y in s["gemm_efficiency"]),
             *(f"attention {k:<7}efficiency by FLOPs: " + ", ".join(f"{x:.2g}:{y:.2f}" for x, y in curve)
               for k, curve in s["attention_efficiency"].items()),
             f"memory copy      {s['memory_bw_bytes_per_s'] / 1e9:,.2f} GB/s; launch overhead "
             f"{s['launch_overhead_s'] * 1e6:.1f} us"
             + (f" ({s['layer_launch_overhead_s'] * 1e6:.1f} us per kernel inside a layer)"
                if s.get("layer_launch_overhead_s") is not None else "")
             + (f" ({s['eager_layer_host_s'] * 1e6:.0f} us of host time per eager layer forward + backward)"
                if s.get("eager_layer_host_s") is not None else "")
             + (f"; a layer's element-wise kernels at {s['elementwise_efficiency']:.3f} of it"
                if s.get("elementwise_efficiency") is not None else "")
             + (f" (compiled: {s['compiled_elementwise_ratio']:.2f} of the eager time)"
                if s.get("compiled_elementwise_ratio") is not None else "")
             + (f", the optimizer step at {s['optimizer_efficiency']:.3f}"
                if s.get("optimizer_efficiency") is not None else "")
             + (f", the cross-entropy at {s['loss_efficiency']:.3f}"
                if s.get("loss_efficiency") is not None else "")
             + (f", a scatter-add at {s['scatter_add_efficiency']:.3f}"
                if s.get("scatter_add_efficiency") is not None else "")]
    if s["link"]:
        lk = s["link"]
        lines.append(f"all-reduce link  {lk['bw_unidir_bytes_per_s'] / 1e9:,.2f} GB/s, {lk['latency_s'] * 1e6:.1f} us "
                     "per hop; efficiency by bytes: " + ", ".join(f"{x:.2g}:{y:.2f}" for x, y in lk["efficiency"]))
        for op, curve in (lk.get("op_efficiency") or {}).items():
            lines.append(f"{op.replace('_', '-'):<16} on that link: " + ", ".join(f"{x:.2g}:{y:.2f}" for x, y in curve))
    if s.get("overlap_slowdown") is not None:
        lines.append(f"overlap slowdown {s['overlap_slowdown']:.2f} (share of an overlapped all-reduce's time "
                     "that concurrent GEMMs lose)")
    if s.get("misaligned_gemm_efficiency_ratio") is not None:
        lines.append(f"misaligned GEMM  {s['misaligned_gemm_efficiency_ratio']:.2f} of the aligned one's rate "
                     "(rows not a multiple of 16 bytes: a vocabulary of 50,257)")
    if s.get("tp_collective_overhead_s") is not None:
        lines.append(f"TP collective    {s['tp_collective_overhead_s'] * 1e3:.2f} ms of host time each beyond its transfer "
                     "(a tensor-parallel layer at negligible size)")
    return "\n".join(lines)
