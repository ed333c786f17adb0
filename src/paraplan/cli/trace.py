"""`paraplan trace`: the simulated step as a Chrome/Perfetto trace JSON."""

from __future__ import annotations

import sys
from dataclasses import replace

from ..argtypes import positive_int as _positive_int
from ..cost.chunks import chunk_layers
from ..errors import SpecError
from ..report.strict_json import json_text
from .args import add_plan_command, engine_rules_from_args, mixed_cluster_args, specs_from_args
from .choice import chosen_plan, searched_plan_note
from .progress import progress_from_args
from .notes import misfit_advice_for

TRACE_LAYER_EVENTS = 1_000_000  # about 200 MB of trace JSON: what Perfetto opens comfortably
TRACE_MAX_LAYER_EVENTS = 10 * TRACE_LAYER_EVENTS  # about 2 GB: the most --max-microbatches may ask for
TRACE_PROGRESS_EVENTS = 200_000  # layer events from which building and writing the trace takes seconds
# names of the per-layer operations that are communication (TP, CP, FSDP, EP collectives)
TRACE_COMM_MARKERS = ("TP", "CP", "FSDP", "EP", "all-to-all")


def add_parser(sub) -> None:
    t = add_plan_command(sub, "trace", "write the simulated step as a Chrome/Perfetto trace JSON", required=True)
    t.add_argument("-o", "--output", default="paraplan-trace.json", help="output file, or - for stdout")
    t.add_argument("--max-microbatches", type=_positive_int, default=None,
                   help="trace about this many micro-batches of the step (rounded down to a multiple of PP, "
                        f"at least 2·PP; default: as many as keep the trace near {TRACE_LAYER_EVENTS:,} layer "
                        "events); the step time stays the full step's")
    t.set_defaults(func=cmd_trace)


def _start_trace(args, plan, shown: int, num_layers: int, tasks: int, tasks_max: int) -> None:
    """Refuse, in one line, a trace whose fewest micro-batches (2·PP) are more schedule tasks
    than the simulator holds or more layer events than TRACE_MAX_LAYER_EVENTS; say a long one's
    phase on stderr (cli/progress.py)."""
    events = 10 * num_layers * shown
    if tasks <= tasks_max and events <= TRACE_MAX_LAYER_EVENTS:
        if events >= TRACE_PROGRESS_EVENTS:
            progress_from_args(args).line(f"tracing {shown:,} micro-batches, about {events:,} layer events")
        return
    what = (f"{tasks:,} schedule tasks, over the simulator's {tasks_max:,}" if tasks > tasks_max
            else f"about {events:,} layer events of {num_layers:,} layers, over {TRACE_MAX_LAYER_EVENTS:,} (2 GB)")
    raise SpecError("trace", "--pp", plan.pp, f"a trace of {plan.pp:,} stages shows at least {shown:,} micro-batches, "
                    f"{what}: trace fewer stages or layers (estimate prices this plan without a trace)")


def _chunk_labels(model, layers: list) -> list[str]:
    """Each virtual stage's track label: its layers, with the embedding, MTP and loss slots."""
    return [", ".join((["embedding"] if j == 0 else []) + ([f"L{r[0]}-{r[-1]}"] if len(r) else [])
                      + ([f"MTP ×{model.mtp_layers}"] if j == len(layers) - 1 and model.mtp_layers else [])
                      + (["LM head + loss"] if j == len(layers) - 1 else [])) for j, r in enumerate(layers)]


def cmd_trace(args) -> int:
    if mixed_cluster_args(args):
        from .mixed import cmd_trace_mixed
        return cmd_trace_mixed(args)
    return _trace_plan(args)


def _trace_plan(args) -> int:
    from ..cost.estimate import SIM_TASKS_MAX, estimate, schedule_tasks, stage_costs
    from ..cost.evaluate import evaluate
    from ..outfile import check_not_input, check_output, write_output
    from ..plan.axes import Schedule
    from ..plan.space import PlanBatch
    from ..report.timeline import chrome_trace
    from ..sim.engine import simulate
    from ..sim.schedules import SPLIT_BACKWARD, Phase, build_schedule, placement, virtual_stage
    if args.output != "-":  # a path that cannot be written fails before the simulation
        check_output(args.output, "trace", "--output")
        check_not_input(args.output, args, "trace", "--output")
    model, cluster, wl = specs_from_args(args)
    most = max(1, TRACE_MAX_LAYER_EVENTS // (10 * model.num_layers))  # counted as the default cap below
    if args.max_microbatches is not None and args.max_microbatches > most:
        raise SpecError("trace", "--max-microbatches", args.max_microbatches,
                        f"at most {most:,} for {model.num_layers} layers (about 2 GB of trace JSON)")
    plan, source = chosen_plan(args, model, cluster, wl, engine=engine_rules_from_args(args, wl, model),
                               flags_narrow=False)
    est = estimate(model, cluster, wl, plan)  # the full step (the pipeline simulated)
    m = est.num_microbatches
    # a trace of every micro-batch of a long step is gigabytes no viewer opens: show the
    # schedule on fewer (a multiple of PP, at least 2·PP) with the same per-micro-batch costs
    cap = args.max_microbatches or max(1, TRACE_LAYER_EVENTS // (10 * model.num_layers))
    shown = min(m, m if m <= cap else max(2 * plan.pp, cap // plan.pp * plan.pp))
    staged = plan if plan.pp > 1 else replace(plan, schedule=Schedule.ONE_F_ONE_B, vp=1)
    _start_trace(args, staged, shown, model.num_layers, schedule_tasks(staged, shown), SIM_TASKS_MAX)
    if plan.pp > 1 and shown == m and est.sim is not None:
        sim = est.sim
    else:  # one stage (the estimate simulates no pipeline) or fewer micro-batches: re-simulate
        costs = evaluate(model, cluster, wl, PlanBatch.from_plans([plan]))
        sim = simulate(build_schedule(staged.schedule, staged.pp, shown, staged.vp), stage_costs(costs, staged),
                       placement(staged.schedule))
    # each virtual stage's layers as the cost model lays them out (embedding and loss slots)
    layers = chunk_layers(model, wl, staged)
    labels = _chunk_labels(model, layers)
    fwd = est.layer_detail["fwd"]
    bwd = est.layer_detail["bwd"]
    # ZB-H1 and ZB-V split each backward: W runs the weight-gradient GEMMs, B the rest
    wgrad = est.layer_detail.get("wgrad", {}) if staged.schedule in SPLIT_BACKWARD else {}
    per_layer = {
        Phase.FORWARD: list(fwd.items()),
        Phase.BACKWARD: [(name.replace("dgrad+wgrad", "dgrad"), dur - wgrad.get(name, 0.0)) for name, dur in bwd.items()],
        Phase.WEIGHT: [(name.split(" (")[0] + " (wgrad)", dur) for name, dur in wgrad.items()],
    }

    def detail(rank, chunk, phase):
        span = layers[int(virtual_stage(placement(staged.schedule), staged.pp, rank, chunk))]
        # a backward runs the chunk's layers last to first
        order = span if phase is Phase.FORWARD else reversed(span)
        return [(f"{name} L{li}", dur, "comm" if any(x in name for x in TRACE_COMM_MARKERS) else "compute",
                 {"layer": li}) for li in order for name, dur in per_layer[phase] if dur > 0]

    # after the pipeline: the step's exposed DP/ZeRO traffic, SP norm all-reduce and optimizer
    after = [(name, dur, "optimizer" if "optimizer" in name else "comm", {})
             for name, dur in est.step_detail.items() if dur > 0]
    trace = chrome_trace(sim, task_detail=detail, layers=labels, after=after,
                         metadata={"plan": plan.describe(), "model": model.name, "cluster": cluster.name,
                                   "step_time_s": est.step_time_s, "microbatches": m, "microbatches_shown": shown})
    text = json_text(trace)
    if args.output == "-":
        print(text)
        if not est.fits:  # (stdout is the trace)
            sys.stderr.write(f"paraplan: warning: the plan {misfit_advice_for(args, model, cluster, wl, est)[0]}\n")
    else:
        write_output(args.output, text, "trace", "--output")
        advice, _ = misfit_advice_for(args, model, cluster, wl, est)
        if not args.json:
            print(f"wrote {args.output}: {len(trace['traceEvents']):,} events, step {est.step_time_s:.3f} s "
                  "(open in https://ui.perfetto.dev or chrome://tracing)"
                  + (f"; {shown} of the step's {m} micro-batches shown (--max-microbatches)" if shown < m else "")
                  + (f"\nplan {plan.describe()}: {searched_plan_note(args)}" if source == "search" else ""))
            if advice:
                print(f"the plan {advice}")
        else:
            print(json_text({"output": args.output, "events": len(trace["traceEvents"]), "step_time_s": est.step_time_s,
                              "plan": plan.describe(), "plan_source": source,
                              **({"plan_rank": args.rank or 1} if source == "search" else {}),
                              "microbatches": m, "microbatches_shown": shown, **({"misfit": advice} if advice else {})}))
    return 0
