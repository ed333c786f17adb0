"""`paraplan export --format torchtitan|megatron|deepspeed`: an engine config for one plan.

The plan is chosen by the rule search, estimate and trace share (cli/choice.py): the fastest
plan that fits among those the engine can run (the search is bounded by the engine's
schedules, recomputation policies, ZeRO stages, ...; see specs/engine.py), narrowed by the
plan flags given (`--pp 8`: the best PP8 plan the engine runs); `--rank N` the N-th of that
search; `--plan "TP8 PP1 ..."` exactly that plan.
The config goes to stdout (the launch line to stderr), or to the file given with -o.
"""

from __future__ import annotations

import json
import sys

from ..cli.args import add_plan, add_specs, specs_from_args
from ..cli.choice import chosen_plan
from ..cost.estimate import estimate
from ..outfile import check_not_input, check_output, write_output
from ..search.policy import EngineRules
from ..specs.engine import Engine, check_model, check_optimizer, refuse_model
from .registry import engine_support, exporter


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="write a torchtitan, Megatron-LM or DeepSpeed config for a plan")
    p.add_argument("--format", required=True, choices=[e.value for e in Engine], help="target engine")
    p.add_argument("--no-compile", action="store_true",
                   help="torchtitan: blocks eager, compile.enable = false (and no async TP)")
    p.add_argument("-o", "--output", default=None, help="write the config to this file (default: stdout)")
    add_specs(p)
    add_plan(p, required=True)
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    if args.output is not None:  # a path that cannot be written fails before the search
        check_output(args.output, "export", "--output")
        check_not_input(args.output, args, "export", "--output")
    engine = Engine(args.format)
    mod = exporter(engine)
    model, cluster, wl = specs_from_args(args)
    check_optimizer(engine, wl)  # the configs written here step the engine's fused Adam
    support = engine_support(engine, args.no_compile)
    refuse_model(support, model)  # a model the engine has no code for
    check_model(support, model)  # before a search the exporter would refuse plan by plan
    plan, source = chosen_plan(args, model, cluster, wl, engine=EngineRules(support, mod.check), flags_narrow=True)
    est = estimate(model, cluster, wl, plan)
    # the header and launch lines name the file -o writes (each engine has its default name)
    res = mod.export(plan, model, cluster, wl, est, **({"filename": args.output} if args.output else {}))
    if not est.fits:
        # the user's --plan: exported as asked (the memory model can be pessimistic), but said
        sys.stderr.write(f"paraplan: warning: {plan.describe()} {est.misfit(cluster.gpu.name)}\n")
    launcher = res.launcher
    if args.output:
        write_output(args.output, res.text, "export", "--output")
    if args.json:
        print(json.dumps({"format": str(engine), "plan": plan.describe(), "plan_source": source,
                          **({"plan_rank": args.rank or 1} if source == "search" else {}),
                          "predicted_step_time_s": est.step_time_s, "fits": est.fits,
                          "misfit": est.misfit(cluster.gpu.name) or None, "filename": args.output or res.filename,
                          "text": res.text, "launcher": launcher, "notes": list(res.notes)}, indent=1))
    elif args.output:
        print(f"wrote {args.output}: {engine} config for {plan.describe()} "
              f"(predicted step {est.step_time_s:.4g} s)")
        print(f"launch: {launcher}")
        for note in res.notes:
            print(f"note: {note}")
    else:
        sys.stdout.write(res.text)
        sys.stderr.write(f"launch: {launcher}\n")
    return 0
