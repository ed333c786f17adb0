"""Terminal tables and JSON for plans over a mixed cluster (cost/mixed.py, search/mixed.py)."""

from __future__ import annotations

from dataclasses import asdict

from ..cost.carbon import carbon_kg, facility_energy_j
from ..cost.mixed import MixedEstimate
from ..sim.schedules import Phase
from ..units import GIB, MEGA, SECONDS_PER_HOUR, fmt_bytes, fmt_co2e_kg, fmt_count, fmt_energy_j, fmt_time, fmt_usd
from .table import failures_line, grid
from .timeline import chrome_trace


def budget(est: MixedEstimate, token_budget: float) -> tuple[float, float]:
    """(seconds, dollars) to train `token_budget` tokens at the plan's throughput and price."""
    seconds = token_budget / est.tokens_per_s
    return seconds, seconds / SECONDS_PER_HOUR * est.usd_per_hour


def energy(est: MixedEstimate, workload) -> tuple[float, float, float]:
    """(GPU energy at TDP, facility energy at the workload's PUE, kg CO2e on its grid) of the
    token budget (cost/carbon.py, Patterson et al. 2021)."""
    seconds, _ = budget(est, workload.token_budget)
    joules = est.power_watts * seconds
    return joules, facility_energy_j(joules, workload.pue), carbon_kg(joules, workload.pue,
                                                                      workload.grid_kg_co2e_per_kwh)


def ranking(ests: list[MixedEstimate], width: int) -> str:
    """One line per plan, best first."""
    rows = [[str(i + 1), f"{e.step_time_s:.3f}", fmt_count(e.tokens_per_s), f"{100 * e.mfu:.1f}%", str(e.num_gpus),
             fmt_usd(e.usd_per_hour), e.plan.describe()] for i, e in enumerate(ests)]
    return grid(["#", "step (s)", "tokens/s", "MFU", "GPUs", "$/hour", "plan"], rows, align="lrrrrrl", width=width,
                wrap_col=6)


def stages_table(est: MixedEstimate) -> str:
    """Each stage on its group, and each boundary's hand-off."""
    rows = []
    for i, s in enumerate(est.stages):
        rows.append([str(i), s.group, s.gpu, f"TP{s.tp}", str(s.layers), f"{1e3 * s.forward_s:.1f}",
                     f"{1e3 * s.backward_s:.1f}", f"{1e3 * s.after_pipeline_s:.1f}",
                     f"{s.memory_bytes / GIB:.1f} / {s.capacity_bytes / GIB:.1f}" + ("" if s.fits else " OVER")])
    table = grid(["stage", "group", "GPU", "TP", "layers", "fwd\n(ms/mb)", "bwd\n(ms/mb)", "after\npipeline (ms)",
                  "memory\n(GiB)"], rows, align="rllrrrrrr")
    hops = []
    for i, (r, t) in enumerate(zip(est.reshardings, est.hop_s)):
        if r is None:
            continue
        hops.append([f"{i} → {i + 1}", r.strategy, fmt_bytes(r.crossing_bytes), fmt_bytes(r.per_link_bytes),
                     fmt_bytes(r.local_bytes), f"{1e3 * t:.2f}"])
    if not hops:
        return table
    return table + "\n\nresharding (one micro-batch's activation; its gradient goes back the same way)\n" + grid(
        ["hop", "how", "crossing", "busiest NIC", "local gather", "ms"], hops, align="llrrrr")


def summary(est: MixedEstimate, workload) -> str:
    token_budget = workload.token_budget
    seconds, usd = budget(est, token_budget)
    joules, facility, co2 = energy(est, workload)
    return "\n".join([
        f"plan            {est.plan.describe()}",
        f"micro-batches   {est.num_microbatches} per step",
        f"step time       {fmt_time(est.step_time_s)}",
        f"throughput      {fmt_count(est.tokens_per_s)} tokens/s on {est.num_gpus} GPUs",
        f"MFU             {100 * est.mfu:.1f}% of the used GPUs' summed peak (6N + full-s² attention FLOPs)",
        f"token budget    {fmt_count(token_budget)} tokens: {fmt_time(seconds)}, {fmt_usd(usd)} "
        f"at {fmt_usd(est.usd_per_hour)}/hour, {fmt_count(est.num_gpus * seconds / SECONDS_PER_HOUR)} GPU-hours",
        f"energy, carbon  {fmt_energy_j(joules)} at TDP, {fmt_energy_j(facility)} at PUE {workload.pue:.2f}: "
        f"{fmt_co2e_kg(co2)} at {workload.grid_kg_co2e_per_kwh:.3g} kg/kWh (--pue, --grid-kg-per-kwh)",
        failures_line(est.with_failures),
    ])


def comparison(best: MixedEstimate, alone: list[tuple[str, object]], token_budget: float) -> str:
    """The best mixed plan beside the best plan on each group alone (an Estimate, or the
    reason none fits)."""
    seconds, usd = budget(best, token_budget)
    rows = [["all groups (mixed pipeline)", str(best.num_gpus), f"{best.step_time_s:.3f}", fmt_count(best.tokens_per_s),
             fmt_time(seconds), fmt_usd(usd), best.plan.describe()]]
    for name, est in alone:
        if isinstance(est, str):
            rows.append([f"{name} alone", "", "", "", "", "", est])
            continue
        rows.append([f"{name} alone", str(est.num_gpus), f"{est.step_time_s:.3f}", fmt_count(est.tokens_per_s),
                     fmt_time(est.budget.time_s), fmt_usd(est.budget.usd), est.plan.describe()])
    return grid(["where", "GPUs", "step (s)", "tokens/s", "budget time", "budget $", "plan"], rows, align="lrrrrrl")


def mixed_dict(est: MixedEstimate, workload) -> dict:
    """The plan as JSON: its step, its budget, each stage and each hop."""
    token_budget = workload.token_budget
    seconds, usd = budget(est, token_budget)
    joules, facility, co2 = energy(est, workload)
    return {"plan": est.plan.describe(), "cluster": est.cluster, "step_time_s": est.step_time_s,
            "tokens_per_s": est.tokens_per_s, "mfu": est.mfu, "num_gpus": est.num_gpus,
            "num_microbatches": est.num_microbatches, "usd_per_hour": est.usd_per_hour,
            "token_budget": {"tokens": token_budget, "time_s": seconds, "usd": usd,
                             "gpu_hours": est.num_gpus * seconds / SECONDS_PER_HOUR, "energy_j": joules,
                             "facility_energy_j": facility, "carbon_kg": co2,
                             "with_failures": asdict(est.with_failures)},
            "stages": [{"group": s.group, "gpu": s.gpu, "tp": s.tp, "layers": s.layers, "forward_s": s.forward_s,
                        "backward_s": s.backward_s, "after_pipeline_s": s.after_pipeline_s,
                        "memory_bytes": s.memory_bytes, "capacity_bytes": s.capacity_bytes, "fits": s.fits}
                       for s in est.stages],
            "hops": [{"after_stage": i, "send_s": t, **({} if r is None else {
                "resharding": r.strategy, "crossing_bytes": r.crossing_bytes, "per_link_bytes": r.per_link_bytes,
                "local_bytes": r.local_bytes})} for i, (r, t) in enumerate(zip(est.reshardings, est.hop_s))]}


SEND_TID, AFTER_TID = 3, 2  # trace threads: resharding sends, a rank's work after the pipeline


def mixed_trace(est: MixedEstimate, model_name: str) -> dict:
    """The simulated step as a Chrome/Perfetto trace (report/timeline.py): one process per
    stage, named by its group and layout, each task labelled with the stage's layers; on a
    third thread the resharding of every hop between groups or layouts (a forward's send
    after it ends, a backward's back); on the second, each rank's reduction and optimizer
    step after its last backward."""
    labels = [f"stage {i}: {s.group} {s.gpu} TP{s.tp}" for i, s in enumerate(est.stages)]
    first = [sum(s.layers for s in est.stages[:i]) for i in range(len(est.stages))]
    layers = [f"L{a}-{a + s.layers - 1}" for a, s in zip(first, est.stages)]
    trace = chrome_trace(est.sim, stage_labels=labels, layers=layers,
                         metadata={"plan": est.plan.describe(), "model": model_name, "cluster": est.cluster,
                                   "step_time_s": est.step_time_s, "microbatches": est.num_microbatches})
    events = trace["traceEvents"]
    for e in est.sim.events:
        hop = e.virtual_stage if e.phase is Phase.FORWARD else e.virtual_stage - 1
        if not 0 <= hop < len(est.reshardings) or est.reshardings[hop] is None:
            continue
        r = est.reshardings[hop]
        events.append({"name": f"reshard mb{e.microbatch} → stage {hop + 1 if e.phase is Phase.FORWARD else hop}",
                       "cat": "comm", "ph": "X", "pid": e.rank, "tid": SEND_TID, "ts": e.end_s * MEGA,
                       "dur": est.hop_s[hop] * MEGA, "args": {"strategy": r.strategy, "crossing_bytes": r.crossing_bytes,
                                                               "per_link_bytes": r.per_link_bytes}})
    for rank, (end_s, s) in enumerate(zip(est.rank_end_s, est.stages)):
        events.append({"name": "DP reduction + optimizer step", "cat": "optimizer", "ph": "X", "pid": rank,
                       "tid": AFTER_TID, "ts": end_s * MEGA, "dur": s.after_pipeline_s * MEGA, "args": {}})
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": SEND_TID, "args": {"name": "resharding"}})
        events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": AFTER_TID,
                       "args": {"name": "after the pipeline"}})
    return trace
