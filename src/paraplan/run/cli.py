"""`paraplan run` and `paraplan compare` (no torch imported here: the launcher only starts
torchrun, whose workers import it).

    paraplan run --model llama3-8b --layers 4 --hidden 128 --heads 4 --vocab 512 --seq 128 \\
        --batch 8 --tp 2 --dp 2 --zero 3 -o run.json

checks the plan, starts `torchrun --standalone --nproc-per-node tp×pp×dp -m paraplan.run`
on this machine, and prints the measured and predicted step time from the report rank 0
wrote. On several nodes, start the workers with torchrun yourself and the same flags:
`torchrun --nnodes 2 --nproc-per-node 8 ... -m paraplan.run --tp 8 --dp 2 ...`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import TYPE_CHECKING

from ..argtypes import non_empty as _non_empty
from ..argtypes import count as _count
from ..argtypes import degree as _degree
from ..argtypes import int_up_to as _int_up_to
from ..argtypes import number
from ..errors import FileFormatError, ParaplanError, SpecError, Terminated
from ..specs.files import MAX_COUNT
from ..sim.schedules import SPLIT_BACKWARD
from ..specs.model import MAX_LAYERS
from .config import MAX_LOCAL_RANKS
from ..report.strict_json import json_text

if TYPE_CHECKING:
    from .config import RunConfig

DEFAULT_MODEL = "llama3-8b"
# Bounds checked before torchrun starts (with run/config.py MAX_LOCAL_RANKS): a seed past
# 2**32 overflows the generators' seeds (run/worker.py), and a measurement needs tens of
# steps, not millions.
MAX_STEPS = 10_000
MAX_SEED = 2**32 - 1


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model (scaled down with --layers/--hidden/...) and workload")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"preset, model TOML or HF config.json (default {DEFAULT_MODEL})")
    for name, hlp in (("layers", "number of layers"), ("hidden", "hidden size (ffn scales with it)"),
                      ("heads", "attention heads"), ("kv-heads", "key/value heads"), ("ffn", "ffn hidden size"),
                      ("vocab", "vocabulary size")):
        g.add_argument(f"--{name}", type=_int_up_to(MAX_LAYERS) if name == "layers" else _count, default=None,
                       help=f"{hlp} (default: the model's)")
    g.add_argument("--seq", type=_count, default=256, help="sequence length (default 256)")
    g.add_argument("--batch", type=_count, default=None,
                   help="global batch in sequences (default: dp × mb × max(pp, 1) × 2)")
    g.add_argument("--precision", default="bf16",
                   help="bf16 (default; GPU runs compute in bf16, CPU runs in fp32 and are predicted as fp32), "
                        "fp16, fp8 or nvfp4 (prediction only)")
    g = p.add_argument_group(f"plan (as in `paraplan estimate`; world size = tp × pp × dp, at most {MAX_LOCAL_RANKS})")
    for name, hlp in (("tp", "tensor parallel"), ("pp", "pipeline parallel"), ("dp", "data parallel (default 1)"),
                      ("vp", "virtual stages per pipeline rank"), ("mb", "micro-batch size (sequences)")):
        g.add_argument(f"--{name}", type=_degree, default=1, help=hlp)
    g.add_argument("--schedule", default=None, help="gpipe, 1f1b, interleaved, bfs, zb, zbv, dualpipev (default 1f1b / interleaved if --vp>1)")
    g.add_argument("--schedule-search", action="store_true",
                   help="run the order the schedule search finds (sim/repetend.py) at the in-flight activations per "
                        "rank of --schedule (gpipe, 1f1b or zb, --vp 1), on torch's pipeline runtime")
    g.add_argument("--recompute", default="none", help="none, selective, full, first_k, op-sac (torchtitan's "
                   "per-op policy; modules, Megatron-Core's module recomputation, is estimated, not run)")
    g.add_argument("--recompute-layers", type=_int_up_to(MAX_LAYERS), default=0, help="layers per stage for first_k")
    g.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None, help="sequence parallel (default on when TP>1)")
    g.add_argument("--zero", default="0", help="ZeRO stage 0-3 (3 = FSDP)")
    g.add_argument("--dp-shard", type=_degree, default=None, help="ZeRO-3 shard group (HSDP when < DP)")
    g.add_argument("--compile", action="store_true",
                   help="each transformer block under torch.compile, as torchtitan's --compile.enable "
                        "(a CPU run needs a C++ compiler)")
    g = p.add_argument_group("run")
    g.add_argument("--steps", type=_int_up_to(MAX_STEPS), default=10,
                   help=f"measured steps (default 10, at most {MAX_STEPS:,})")
    g.add_argument("--warmup", type=_int_up_to(MAX_STEPS, least=0), default=3,
                   help=f"warm-up steps, not measured (default 3, at most {MAX_STEPS:,})")
    g.add_argument("--seed", type=_int_up_to(MAX_SEED, least=0), default=0,
                   help=f"seed of the weights and the synthetic tokens (0 to {MAX_SEED})")
    g.add_argument("--lr", type=number, default=1e-3, help="AdamW learning rate (default 1e-3)")
    g.add_argument("--device", default="auto", help="auto (GPU if torch sees one), cpu or cuda")
    g.add_argument("--hardware", default=None, type=_non_empty,
                   help="cluster preset or calibrated profile TOML to predict with (default on a GPU: its preset)")
    g.add_argument("-o", "--output", default="paraplan-run.json", help="report file (default paraplan-run.json)")


def config_from_args(args) -> "RunConfig":
    from ..plan.axes import AttentionKernel, Recompute, Schedule, ZeroStage
    from ..plan.plan import make_plan
    from ..specs.catalog import load_model
    from ..specs.workload import Workload, parse_precision
    from .config import RUN_OPTIMIZER, Device, RunConfig, check_runnable, check_world_size, scale_model
    scaled = {k: v for k, v in (("layers", args.layers), ("hidden", args.hidden), ("heads", args.heads),
                                ("kv-heads", args.kv_heads), ("ffn", args.ffn), ("vocab", args.vocab)) if v is not None}
    model = scale_model(load_model(args.model), **{k.replace("-", "_"): v for k, v in scaled.items()})
    sched = Schedule.parse(args.schedule, "schedule") if args.schedule is not None else (
        Schedule.INTERLEAVED_1F1B if args.vp > 1 else Schedule.ONE_F_ONE_B)
    zero = ZeroStage.parse(str(args.zero), "zero")
    if args.dp_shard is not None and zero is not ZeroStage.PARAMETERS:
        raise SpecError("run", "--dp-shard", args.dp_shard, "needs --zero 3 (HSDP)")
    try:
        device = Device(args.device)
    except ValueError:
        raise SpecError("run", "--device", args.device, "allowed: " + ", ".join(d.value for d in Device)) from None
    # The plan knobs that describe what torch does here, so that the prediction is of this run:
    # non-reentrant checkpointing stops early; DTensor TP does not overlap its backward
    # reductions; FSDP2 reduces gradients in fp32 under its bf16 mixed-precision policy and
    # copies into and out of its collective buffers. The attention kernel is a placeholder:
    # each worker records the one torch picks for its shapes (run/attention.py).
    plan = make_plan(tp=args.tp, pp=args.pp, dp=args.dp, vp=args.vp, micro_batch_size=args.mb, schedule=sched,
                     recompute=Recompute.parse(args.recompute, "recompute"),
                     recompute_num_layers=args.recompute_layers,
                     sequence_parallel=args.sp if args.sp is not None else args.tp > 1,
                     zero=zero, dp_shard=args.dp_shard or 0, attention=AttentionKernel.FLASH2,
                     checkpoint_early_stop=True, tp_async_backward=False, grad_reduce_fp32=args.dp > 1,
                     fsdp2_copies=True, fused_kernels=False, compiled=args.compile,
                     loss_parallel=True)  # the loss under torch's loss_parallel over TP (worker.py)
    if plan.sequence_parallel and plan.tp == 1:
        raise SpecError("run", "--sp", True, "sequence parallelism needs --tp > 1")
    if plan.compiled and plan.tp > 1:
        # compiled blocks over this runner's DTensor layers fail in the backward (torch 2.13:
        # "'Tensor' object has no attribute '_local_tensor'" in a redistribute)
        raise SpecError("run", "--compile", True, "only with --tp 1 (compiled tensor-parallel blocks are not run "
                        "here; --pp, --dp and --zero compile)")
    if plan.compiled and plan.pp > 1 and plan.schedule in SPLIT_BACKWARD:
        # torch 2.13 _check_torch_compile_compatibility: no compiled stage modules under the
        # schedules that split the backward
        raise SpecError("run", "--compile", True, f"not with --schedule {plan.schedule} (torch runs its "
                        "zero-bubble schedules on eager stages only)")
    check_world_size(args.tp * args.pp * args.dp)  # before the batch below multiplies them
    gbs = args.batch or args.dp * args.mb * max(args.pp, 1) * 2
    if gbs > MAX_COUNT:
        raise SpecError("run", "--mb", args.mb, f"leaves a default --batch (dp × mb × pp × 2) of {gbs}, above "
                        f"{MAX_COUNT}; lower --mb or give --batch")
    wl = Workload(global_batch_size=gbs, seq_len=args.seq, precision=parse_precision(args.precision, "--precision"),
                  optimizer=RUN_OPTIMIZER)
    cfg = RunConfig(model=model, model_name=args.model, plan=plan, workload=wl, steps=args.steps,
                    warmup_steps=args.warmup, seed=args.seed, lr=args.lr, device=device, hardware=args.hardware,
                    output=args.output, scaled=scaled or None, schedule_search=args.schedule_search)
    if cfg.schedule_search:
        from .searched import check_searchable
        check_searchable(cfg.plan)
    check_runnable(cfg)
    if cfg.hardware:  # a bad profile or preset is the user's mistake: say so before starting
        from ..specs.catalog import load_flag_cluster
        load_flag_cluster("run", "--hardware", cfg.hardware, num_gpus=cfg.world_size)
    return cfg


def config_from_argv(argv: list[str]) -> "RunConfig":
    """The worker's configuration: `--config FILE` (from `paraplan run`) or the run flags."""
    from .config import RunConfig
    if len(argv) == 2 and argv[0] == "--config":
        try:
            with open(argv[1], encoding="utf-8") as fh:
                return RunConfig.from_json(fh.read(), argv[1])
        except OSError as e:
            raise FileFormatError(argv[1], f"cannot read: {e}") from None
    from ..cli.args import Parser
    p = Parser(prog="python -m paraplan.run")
    add_run_arguments(p)
    return config_from_args(p.parse_args(argv))


def _summary(report: dict) -> str:
    from ..units import fmt_bytes, fmt_time
    m, pr = report["measured"], report["predicted"]
    lines = [f"{report['model']['name']} on {report['world_size']} × {report['device_name']} "
             f"({report['backend']}, {report['compute_dtype']}); plan {report['plan']['describe']}",
             f"measured   step {fmt_time(m['step_time_s'])} (median of {m['steps']} after {m['warmup_steps']} warm-up), "
             f"{m['tokens_per_s']:,.0f} tokens/s, peak memory {fmt_bytes(m['peak_memory_bytes'])} ({m['memory_kind']})",
             f"loss       {' '.join(f'{x:.4f}' for x in m['losses'])}"]
    if pr:
        from .report_format import predicted_as_measured_bytes
        err = 100 * (pr["step_time_s"] - m["step_time_s"]) / m["step_time_s"]
        as_measured = predicted_as_measured_bytes(pr, m["memory_kind"])
        mem_err = 100 * (as_measured - m["peak_memory_bytes"]) / m["peak_memory_bytes"]
        lines.append(f"predicted  step {fmt_time(pr['step_time_s'])} ({err:+.1f}%), memory "
                     f"{fmt_bytes(pr['memory_bytes'])} on {pr['hardware']}, {fmt_bytes(as_measured)} of it "
                     f"counted as measured ({mem_err:+.1f}%)")
        if pr.get("sustained_compute_ratio", 1.0) < 1.0:  # a preset fitted to published runs at scale
            lines.append(f"note       {pr['hardware']} prices compute at {pr['sustained_compute_ratio']:g} of its GPU's "
                         "microbenchmark rate, as published runs at scale sustain it; to check this machine, predict "
                         "on its own profile: paraplan calibrate -o prof.toml, then --hardware prof.toml")
    else:
        lines.append(f"predicted  -- {report['prediction_note']}")
    return "\n".join(lines)


def _interrupt(signum, frame):
    raise Terminated


def _launch(cmd: list[str], stdout) -> int:
    """Run torchrun to completion; if this process is stopped (SIGTERM, Ctrl-C), stop it too
    rather than leave its workers running."""
    proc = subprocess.Popen(cmd, stdout=stdout)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()  # torchrun passes it on to its workers
        proc.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_run(args) -> int:
    from dataclasses import replace
    from ..outfile import check_not_input, check_output
    from .report import write_report
    cfg = config_from_args(args)
    check_output(cfg.output, "run", "--output")  # before any process starts
    check_not_input(cfg.output, args, "run", "--output")
    if importlib.util.find_spec("torch") is None:
        raise ParaplanError("paraplan run needs torch: pip install 'paraplan[run]' (pins torch==2.13.0)")
    with tempfile.TemporaryDirectory(prefix="paraplan-run-") as tmp:
        # rank 0 writes its report in here: a stale file at --output is never taken for this
        # run's, a failed run leaves --output as it was, and --output may be /dev/stdout
        report_path = os.path.join(tmp, "report.json")
        cfg_path = os.path.join(tmp, "config.json")
        with open(cfg_path, "w", encoding="utf-8") as fh:
            fh.write(replace(cfg, output=report_path).to_json())
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.world_size}",
               "-m", "paraplan.run", "--config", cfg_path]
        rc = _launch(cmd, stdout=sys.stderr if args.json else None)
        report = None
        if os.path.exists(report_path):
            with open(report_path, encoding="utf-8") as fh:
                report = json.load(fh)
    if report is not None and report.get("status") == "refused":
        raise ParaplanError(f"run: {report.get('reason')}")
    if report is None or report.get("status") != "ok":
        sys.stderr.write(f"paraplan: error: the run wrote no report (torchrun exited with {rc}; its output is above)\n")
        return 1
    # the workers saw the temporary path: the report says what the user ran, and keeps the
    # workers' config (the attention kernel and autocast as they found them)
    report = {**report, "command": cfg.command_line(),
              "config": {**(report.get("config") or json.loads(cfg.to_json())), "output": cfg.output}}
    write_report(cfg.output, report)
    if rc != 0:  # torch 2.13 + gloo: a rank can abort at exit after a correct, complete run
        sys.stderr.write(f"paraplan: warning: torchrun exited with {rc} after the run completed and wrote its report\n")
    print(json_text(report, indent=1) if args.json else _summary(report) + f"\nwrote {cfg.output}")
    return 0


def cmd_compare(args) -> int:
    from ..report.compare import compare_reports, load_reports, plot_comparison, render_comparison
    if args.hardware is not None:  # a bad profile or preset is the flag's error, before any report
        from ..specs.catalog import load_flag_cluster
        load_flag_cluster("compare", "--hardware", args.hardware)
    reports = load_reports(args.reports, hardware=args.hardware)
    result = compare_reports(reports, metric=args.metric)
    if args.plot is not None:  # --plot '' is a bad path, not "no plot"
        plot_comparison(result, args.plot)
    if args.json:
        print(json_text(result, indent=1))
    else:
        print(render_comparison(result))
        if args.plot:
            print(f"wrote {args.plot}")
    return 0


def add_parser(sub) -> None:
    """Register `run` and `compare` on the paraplan subcommand parser."""
    r = sub.add_parser("run", help="execute a plan with PyTorch distributed (torchrun) and measure it")
    add_run_arguments(r)
    r.add_argument("--json", action="store_true", help="print the report instead of a summary")
    r.set_defaults(func=cmd_run)
    c = sub.add_parser("compare", help="predicted vs measured over run reports: table, plot, errors, Kendall tau")
    c.add_argument("reports", nargs="+", help="report JSON files written by `paraplan run`")
    c.add_argument("--metric", default="step_time", choices=("step_time", "memory"),
                   help="step_time (default) or memory (peak per rank)")
    c.add_argument("--hardware", default=None, type=_non_empty,
                   help="predict every run again on this cluster preset or calibrated profile TOML")
    c.add_argument("--plot", default=None, metavar="PNG", help="write a predicted-vs-measured scatter plot (needs matplotlib)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_compare)
