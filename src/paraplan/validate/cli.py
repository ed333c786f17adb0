"""`paraplan fit` and `paraplan validate --cv source`: fitting a GPU's physical knobs to
measured runs, and how well fitted knobs predict runs they were not fitted on."""

from __future__ import annotations

import shlex
import sys
import textwrap

import numpy as np

from ..errors import SpecError
from ..report.strict_json import json_text
from ..report.table import grid
from .fit import KNOBS, cross_validate_sources, fit_gpu, predict_at, prior_knobs, profile_toml, tabulate
from .rows import generation


def _progress(label: str):
    """A one-line progress counter on a terminal's stderr; nothing elsewhere."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        sys.stderr.write(f"\r{label}: {done}/{total} rows" + ("\n" if done >= total else ""))
        sys.stderr.flush()
    return show


def add_fit_parser(sub) -> None:
    f = sub.add_parser("fit", help="fit a GPU type's physical knobs (sustained compute share, FP8 and row-wise FP8 "
                                   "GEMM efficiency) to measured runs and write a hardware profile for --hardware")
    f.add_argument("files", nargs="+", metavar="RUNS.csv", help="measured training runs in the validation-file format")
    f.add_argument("--gpu", required=True, help="the GPU preset whose runs are fitted (e.g. h100, gb200); a "
                   "comma-separated list fits one set of knobs on all their runs (a family with few runs each), "
                   "and the profile is the first one's")
    f.add_argument("-o", "--output", default=None, help="write the fitted hardware profile (a cluster TOML) here")
    f.add_argument("--json", action="store_true")
    f.set_defaults(func=cmd_fit)


def cmd_fit(args) -> int:
    from ..outfile import check_output, write_output
    from ..specs.catalog import load_gpu
    from .training import GPU_CLUSTERS
    names = [n.strip() for n in args.gpu.split(",")]
    gpus = [load_gpu(n) for n in names if n] if all(names) else []
    if not gpus or len({g.name for g in gpus}) != len(gpus):
        raise SpecError("fit", "--gpu", args.gpu, "GPU presets, each named once, separated by commas")
    gpu = gpus[0]
    if gpu.name not in GPU_CLUSTERS:
        raise SpecError("fit", "--gpu", args.gpu, "a GPU with a reference cluster preset: " + ", ".join(GPU_CLUSTERS))
    if args.output:
        check_output(args.output, "fit", "--output")  # a bad path fails before the work
    result = fit_gpu(args.files, gpu, progress=_progress(f"fitting {gpu.name}"), pooled=tuple(gpus[1:]))
    command = ("paraplan fit " + " ".join(shlex.quote(a) for a in args.files)
               + f" --gpu {','.join(g.name for g in gpus)}")
    if args.output:
        write_output(args.output, profile_toml(result, GPU_CLUSTERS[gpu.name], command), "fit", "--output")
    summary = {"gpu": gpu.name, "pooled": [g.name for g in gpus[1:]], "runs": len(result.runs),
               "skipped": len(result.skipped),
               "knobs": {k.field: {"value": result.values[k.field], "preset": result.prior[k.field],
                                   "bounds": [k.low, k.high], "meaning": k.meaning} for k in KNOBS},
               "in_sample_mean_abs_pct_error": result.mean_abs_pct(result.in_sample),
               "cv_mean_abs_pct_error": result.mean_abs_pct(result.leave_one_out),
               "preset_mean_abs_pct_error": result.mean_abs_pct(
                   [predict_at(r, result.prior) for r in result.runs]),
               "rows": [{"id": r.id, "source": r.source, "measured": r.measured, "in_sample": p, "leave_one_out": q}
                        for r, p, q in zip(result.runs, result.in_sample, result.leave_one_out)],
               "output": args.output}
    if args.json:
        print(json_text(summary, indent=1))
        return 0
    print(grid(["knob", "fitted", "preset", "bounds", "meaning"],
               [[k.field, f"{result.values[k.field]:.2f}", f"{result.prior[k.field]:.2f}", f"{k.low}-{k.high}",
                 k.meaning] for k in KNOBS]))
    print(f"\n{len(result.runs)} runs on {', '.join(g.name for g in gpus)} ({len(result.skipped)} rows skipped: "
          "`paraplan validate` says why); "
          f"mean |error|: preset {summary['preset_mean_abs_pct_error']:.2f}%, fitted in sample "
          f"{summary['in_sample_mean_abs_pct_error']:.2f}%, leave-one-out {summary['cv_mean_abs_pct_error']:.2f}%")
    if args.output:
        print(f"wrote {args.output} (use it with --hardware {args.output})")
    return 0


def _mean_abs(pairs: list[tuple[float, float]]) -> float | None:
    return float(np.mean([abs(100.0 * (p - m) / m) for p, m in pairs])) if pairs else None


def cross_validation(files: list[str]) -> dict:
    """Every training row of `files` predicted by knobs fitted per GPU on all sources (in
    sample) and on every source but its own (out of source), summarized per GPU generation,
    for MoE and per source."""
    from ..specs.catalog import load_gpu
    runs, skipped = tabulate(files, progress=_progress("tabulating"))
    priors = {g: prior_knobs(load_gpu(g)) for g in {r.gpu for r in runs}}
    cv = cross_validate_sources(runs)
    rows = [{"id": r.id, "source": r.source, "gpu": r.gpu, "moe": r.moe, "measured": r.measured,
             "preset": predict_at(r, priors[r.gpu]), "in_sample": c["in_sample"], "out_of_source": c["out_of_source"]}
            for r, c in zip(runs, cv)]

    def group(select) -> dict:
        chosen = [row for row in rows if select(row)]
        return {"n": len(chosen),
                "preset_mean_abs_pct_error": _mean_abs([(x["preset"], x["measured"]) for x in chosen]),
                "in_sample_mean_abs_pct_error": _mean_abs([(x["in_sample"], x["measured"]) for x in chosen]),
                "cv_mean_abs_pct_error": _mean_abs([(x["out_of_source"], x["measured"]) for x in chosen])}
    generations = sorted({generation(r["gpu"]) for r in rows})
    return {"rows": rows, "skipped": skipped,
            "summary": {"all": group(lambda x: True), "moe": group(lambda x: x["moe"]),
                        "by_generation": {g: group(lambda x, g=g: generation(x["gpu"]) == g)
                                          for g in generations},
                        "by_source": {s: group(lambda x, s=s: x["source"] == s) for s in sorted({r["source"] for r in rows})},
                        "knobs_in_sample": {g: next(c["knobs_in_sample"] for r, c in zip(runs, cv) if r.gpu == g)
                                            for g in priors}}}


def render_cross_validation(result: dict) -> str:
    s = result["summary"]

    def pct(x):
        return "-" if x is None else f"{x:.1f}%"

    def line(name, g):
        return [name, str(g["n"]), pct(g["preset_mean_abs_pct_error"]), pct(g["in_sample_mean_abs_pct_error"]),
                pct(g["cv_mean_abs_pct_error"])]
    table = [line("all training rows", s["all"]), line("MoE", s["moe"])]
    table += [line(g, v) for g, v in s["by_generation"].items()]
    table += [line("source: " + k[:60], v) for k, v in s["by_source"].items()]
    knobs = "; ".join(f"{g}: " + ", ".join(f"{k} {v:.2f}" for k, v in vals.items())
                      for g, vals in sorted(s["knobs_in_sample"].items()))
    return "\n".join([grid(["rows", "n", "presets", "fitted (in sample)", "out of source"], table, align="lrrrr"),
                      "", textwrap.fill("knobs fitted on every source: " + knobs, 100),
                      f"{len(result['rows'])} rows predicted, {len(result['skipped'])} skipped (validate says why)"])
