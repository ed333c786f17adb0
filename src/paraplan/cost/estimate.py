"""One plan, fully: cost model + event simulation of the pipeline schedule -> Estimate."""

from __future__ import annotations

from dataclasses import dataclass, replace


from ..errors import ParaplanError
from ..num import scalar
from ..plan.axes import Schedule, ZeroStage
from ..plan.plan import Plan
from ..plan.space import PlanBatch, check_plan
from ..sim.engine import SimResult, StageCosts, simulate_schedules
from ..sim.idle import PipelineIdle, extrapolated_idle, pipeline_idle
from ..sim.schedules import SPLIT_BACKWARD
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from ..units import SECONDS_PER_HOUR
from .breakdown import MemoryBreakdown, OverlappedComm, TimeBreakdown
from .bubble_fill import BubbleFill, BubbleWork, PricedWork, fill_bubbles, priced_work
from .carbon import carbon_kg, facility_energy_j
from .evaluate import PlanCosts, evaluate
from .layout import layout
from .lifetimes import allocator_peaks
from .flops import model_flops_per_token
from .memory import OPTIMIZER_BYTES, WEIGHT_BYTES, fits
from .reliability import Reliability, reliability


class PlanRejectedError(ParaplanError):
    pass


@dataclass(frozen=True, kw_only=True)
class Budget:
    """Time, GPU-hours, dollars and energy to train the workload's token budget."""

    tokens: float
    steps: float
    time_s: float
    gpu_hours: float
    usd: float
    energy_j: float  # at the GPUs' TDP, or their power limit below it (an upper bound; excludes host, network and PUE)
    power_limited: bool = False  # energy_j is at a board power limit below the TDP (GPUSpec.power_limit_watts)
    facility_energy_j: float  # energy_j × the workload's PUE (cost/carbon.py)
    carbon_kg: float          # operational CO2e of facility_energy_j on the workload's grid
    wall_carbon_kg: float     # the same through interruptions (with_failures' GPU-hours)
    pue: float                   # what the two are priced at (the workload's)
    grid_kg_co2e_per_kwh: float
    # the same budget through interruptions and checkpoints (cost/reliability.py)
    with_failures: Reliability


@dataclass(frozen=True, kw_only=True)
class Estimate:
    plan: Plan
    num_gpus: int
    num_microbatches: int
    step_time_s: float
    time: TimeBreakdown
    overlapped: OverlappedComm
    memory: MemoryBreakdown
    fits: bool                 # on the GPU and, when the cluster states it, in host DRAM
    hbm_bytes: float
    host_bytes: float          # host DRAM per GPU the plan keeps (offloaded optimizer states)
    host_capacity_bytes: float  # the GPU's share of its host's DRAM (0: not stated)
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float  # model FLOPs (PaLM convention: 6N + full-s² attention, no recompute) / peak
    hfu: float  # hardware FLOPs executed (incl. recomputation, causal attention) / peak
    model_tflops_per_gpu: float
    budget: Budget
    comm_detail: dict
    layer_detail: dict
    step_detail: dict          # per-step work after the pipeline (DP/ZeRO, SP norm all-reduce, optimizer)
    sim: SimResult | None = None
    pipeline_note: str = ""    # why the pipeline was not simulated ("" when it was, or has one stage)
    idle: PipelineIdle | None = None       # each rank's idle time in the simulated step (None: not simulated)
    bubble_fill: BubbleFill | None = None  # the step with work in the bubbles (estimate(bubble_work=...))

    def time_parts(self) -> dict:
        """The step by part (seconds), as reports show it: bubble_work_s only where bubbles were filled."""
        parts = self.time.parts()
        if self.bubble_fill is None:
            del parts["bubble_work_s"]
        return parts

    def misfit(self, gpu_name: str) -> str:
        """Why the plan does not fit, in one clause ("" when it fits)."""
        from ..units import fmt_bytes
        if self.memory.total > self.hbm_bytes:
            return (f"needs {fmt_bytes(self.memory.total)} per GPU by paraplan's memory model, more than the "
                    f"{fmt_bytes(self.hbm_bytes)} of {gpu_name}")
        if not self.fits:
            return (f"keeps {fmt_bytes(self.host_bytes)} of offloaded optimizer state and activations per GPU in host DRAM, more "
                    f"than the GPU's {fmt_bytes(self.host_capacity_bytes)} share of its host's")
        return ""


def stage_costs(costs: PlanCosts, plan: Plan, split_backward: bool | None = None) -> StageCosts:
    """Per-rank, per-chunk times for the simulator (embedding on rank 0, LM head on the rank
    of the last virtual stage: the last rank, or rank 0 in ZB-V's V; layout.layout); the
    weight gradient split off as W where the plan's schedule splits it, or `split_backward` says."""
    p, v = plan.pp, plan.vp
    zb = plan.schedule in SPLIT_BACKWARD if split_backward is None else split_backward

    def row(st):
        f = scalar(st.forward_s) / v
        b = scalar(st.backward_s) / v
        w = scalar(st.weight_grad_s) / v if zb else 0.0
        return f, b - w, w

    rows = []
    for r in range(p):
        st = costs.first if r == 0 else costs.last if r == p - 1 else costs.middle
        rows.append(row(st))
    fwd = tuple(tuple(rows[r][0] for _ in range(v)) for r in range(p))
    bwd = tuple(tuple(rows[r][1] for _ in range(v)) for r in range(p))
    wgt = tuple(tuple(rows[r][2] for _ in range(v)) for r in range(p))
    return StageCosts(forward_s=fwd, backward_s=bwd, weight_s=wgt, p2p_s=scalar(costs.p2p_s))


# micro-batches per step up to which the pipeline is simulated whole (beyond: extrapolated)
SIM_MICROBATCHES = 256
# schedule tasks (one per chunk, micro-batch and pass) the simulator runs for one estimate at
# most: a 500-stage 1F1B pipeline of 500 micro-batches, 500k tasks, took 1.7 s and 0.3 GB
# (sim/engine.py's waves; 19 s one event at a time); past it the closed-form bubble stands
# (cost/bubbles.py)
SIM_TASKS_MAX = 400_000


def schedule_tasks(plan: Plan, num_microbatches: int) -> int:
    """Tasks the simulator runs for `num_microbatches` of a plan's schedule: a forward and a
    backward (and a W pass where the schedule splits it) per chunk and micro-batch."""
    passes = 3 if plan.schedule in SPLIT_BACKWARD else 2
    return plan.pp * plan.vp * num_microbatches * passes


def checkpoint_bytes_per_gpu(model: ModelSpec, workload: Workload, plan: Plan, mem: MemoryBreakdown) -> float:
    """Bytes of model states one GPU writes in a checkpoint: each tensor once over its
    replicas (DCP dedup, Megatron fully-parallel save). Dense weights replicate over DP×CP
    (ZeRO-3: over the HSDP replicas R), routed experts over their EDP group (ZeRO-3: R);
    optimizer shards over R (ZeRO-0: the whole DP×CP, or EDP for experts)."""
    lay = layout(model, workload, PlanBatch.from_plans([plan]))
    zero3, zero0 = plan.zero is ZeroStage.PARAMETERS, plan.zero is ZeroStage.NONE
    r, edp = scalar(lay.hsdp_replicas), scalar(lay.edp)
    dense, experts = scalar(lay.params_stage), scalar(lay.head_stage_expert_params)
    # this GPU's dense and expert parameters as its weights and optimizer hold them
    w_dense = dense / (scalar(lay.zero_shard_group) if zero3 else 1.0)
    w_exp = experts / (scalar(lay.expert_shard_group) if zero3 else 1.0)
    o_dense, o_exp = dense / scalar(lay.optimizer_shard), experts / scalar(lay.expert_optimizer_shard)
    w_rep_dense, w_rep_exp = (r, r) if zero3 else (plan.dp * plan.cp, edp)
    o_rep_dense, o_rep_exp = (plan.dp * plan.cp, edp) if zero0 else (r, r)

    def written(total, d, e, rep_d, rep_e):  # total bytes split as the parameters are
        return total * (d / rep_d + e / rep_e) / (d + e)
    # the weights, not the quantized copies Transformer Engine caches beside 16-bit ones (FP8,
    # NVFP4; the 16-bit embedding and head scaled alike: a few percent under)
    linear_bytes = scalar(lay.linear_weight_bytes_per_param)
    cached = linear_bytes > WEIGHT_BYTES and not scalar(lay.fp32_params)
    weights = mem.weights_bytes * (WEIGHT_BYTES / linear_bytes if cached else 1.0)
    return (written(weights, w_dense, w_exp, w_rep_dense, w_rep_exp)
            + written(mem.optimizer_bytes, o_dense, o_exp, o_rep_dense, o_rep_exp))


@dataclass(frozen=True)
class PipelineRuns:
    """The simulations that time a plan's pipeline: its stage costs at each micro-batch count
    (its m, or m1 and 2·m1 when the line through them is extended to m), or none and why."""

    counts: tuple[int, ...]
    costs: StageCosts | None = None
    schedule: Schedule = Schedule.ONE_F_ONE_B
    note: str = ""

    def wanted(self) -> list[tuple[Schedule, int, StageCosts]]:
        """(schedule, micro-batches, stage costs) of each run (simulate_schedules' input)."""
        return [(self.schedule, k, self.costs) for k in self.counts] if self.costs is not None else []


def pipeline_runs(plan: Plan, costs: PlanCosts, simulate_pipeline: bool = True) -> PipelineRuns:
    """What simulating the plan's pipeline takes (finish applies the runs' makespans)."""
    if not simulate_pipeline or plan.pp == 1:
        return PipelineRuns(counts=())
    m = int(scalar(costs.num_microbatches))
    m1 = max(2 * plan.pp, SIM_MICROBATCHES // 2 // plan.pp * plan.pp)
    tasks = schedule_tasks(plan, m if m <= 2 * m1 else 3 * m1)
    if tasks > SIM_TASKS_MAX:
        return PipelineRuns(counts=(), note=(
            f"pipeline not simulated: {plan.pp:,} stages × {m:,} micro-batches take {tasks:,} schedule "
            f"tasks, over the simulator's {SIM_TASKS_MAX:,}; the bubble is the closed form's"))
    # past 2·m1 every micro-batch costs the same, so past the warm-up each schedule repeats one
    # period per micro-batch: the makespan is linear in m. Simulate m1 and 2·m1 (multiples of
    # PP, as interleaving needs) and extend the line to m: exact once the steady state has set
    # in by m1 (tests/test_estimate_many_microbatches.py checks it against the full simulation)
    return PipelineRuns(counts=(m,) if m <= 2 * m1 else (m1, 2 * m1), costs=stage_costs(costs, plan),
                        schedule=plan.schedule)


def finish_all(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plans: list[Plan],
               costs: list[PlanCosts]) -> list[Estimate]:
    """finish for each plan, their pipelines simulated together (simulate_schedules: one pass
    per schedule shape for all the plans of that shape)."""
    runs = [pipeline_runs(plan, c) for plan, c in zip(plans, costs)]
    sims = iter(simulate_schedules([w for r in runs for w in r.wanted()]))
    return [_finished(model, cluster, workload, plan, c, r, tuple(next(sims) for _ in r.counts))
            for plan, c, r in zip(plans, costs, runs)]


def finish(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, costs: PlanCosts,
           *, simulate_pipeline: bool = True, work: PricedWork | None = None) -> Estimate:
    """Turn cost-model output for one plan into an Estimate (simulating the pipeline; with
    `work`, placed in the pipeline's bubbles: cost/bubble_fill.py)."""
    runs = pipeline_runs(plan, costs, simulate_pipeline)
    return _finished(model, cluster, workload, plan, costs, runs, tuple(simulate_schedules(runs.wanted())), work)


def _idle(runs: PipelineRuns, simulated: tuple[SimResult, ...], m: int, piece_s: float) -> PipelineIdle | None:
    """Each rank's idle time in the step at m micro-batches (the line through m1 and 2·m1
    extended to m, as the makespan), with the pieces of `piece_s` its gaps hold."""
    if not simulated:
        return None
    if len(simulated) == 1:
        return pipeline_idle(simulated[0], piece_s)
    (m1, m2), (a, b) = runs.counts, simulated
    return extrapolated_idle(pipeline_idle(a, piece_s), pipeline_idle(b, piece_s), m1, m2, m)


def _finished(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, costs: PlanCosts,
              runs: PipelineRuns, simulated: tuple[SimResult, ...], work: PricedWork | None = None) -> Estimate:
    """The Estimate of one plan whose pipeline `runs` were `simulated` (with `work` in its bubbles)."""
    m = int(scalar(costs.num_microbatches))
    time = costs.time.scalar(0)
    sim = simulated[0] if len(simulated) == 1 else None  # the whole step's timeline
    idle = _idle(runs, simulated, m, work.piece_s if work is not None else 0.0)
    if idle is not None:
        # the simulated makespan replaces the closed-form bubble and fill/drain p2p
        rest = idle.makespan_s - scalar(costs.critical_stage_s) - time.pp_comm_s
        time = replace(time, bubble_s=max(rest, 0.0))
    pipeline_note = runs.note
    step_detail = {k: scalar(v) for k, v in costs.step_detail.items()}
    filled = None
    if work is not None:
        filled, time = fill_bubbles(time, step_detail, idle, work, pipeline_note)
    step = float(time.total)
    mem = costs.memory.scalar(0)
    host = scalar(costs.host_bytes)
    n = plan.num_gpus
    tokens_per_step = workload.tokens_per_step
    tps = tokens_per_step / step
    gpu = cluster.gpu
    peak = gpu.peak(workload.precision)
    mfu = model_flops_per_token(model, workload.seq_len) * tps / (n * peak)
    hfu = scalar(costs.hardware_flops_per_step) / step / peak
    steps = workload.token_budget / tokens_per_step
    train_s = steps * step
    gpu_hours = train_s / SECONDS_PER_HOUR * n
    price = workload.usd_per_gpu_hour if workload.usd_per_gpu_hour is not None else cluster.usd_per_gpu_hour
    # an async checkpoint stalls each GPU while it copies its share of the model states to host:
    # replicated tensors are written once over their replicas (DCP dedup, Megatron fully-
    # parallel save); the storage must take a whole checkpoint (16-bit weights + fp32 master
    # and moments) between two of them
    checkpoint_s = checkpoint_bytes_per_gpu(model, workload, plan, mem) / gpu.host_link_bw_unidir_bytes_per_s
    ckpt_bytes = model.num_params * (WEIGHT_BYTES + OPTIMIZER_BYTES)
    failures = reliability(num_gpus=n, step_s=step, work_s=train_s, checkpoint_s=checkpoint_s,
                           interruptions_per_gpu_day=workload.interruptions_per_gpu_day,
                           restart_s=workload.restart_s, usd_per_gpu_hour=price,
                           min_interval_s=ckpt_bytes / workload.storage_bytes_per_s)
    budget = _budget(workload, gpu.draw_watts, power_limited=gpu.draw_watts < gpu.tdp_watts, steps=steps,
                     time_s=train_s, gpu_hours=gpu_hours, usd=gpu_hours * price, with_failures=failures)
    overl = costs.overlapped.scalar(0)
    comm = {k: scalar(v) for k, v in costs.comm_detail.items()}
    comm["DP/ZeRO collectives"] = time.dp_comm_s
    comm["PP send/recv"] = time.pp_comm_s
    detail = {ph: {k: scalar(v) for k, v in d.items()} for ph, d in costs.layer_detail.items()}
    return Estimate(plan=plan, num_gpus=n, num_microbatches=m, step_time_s=step, time=time, overlapped=overl,
                    memory=mem, fits=bool(fits(cluster, mem.total, host)), hbm_bytes=gpu.hbm_bytes,
                    host_bytes=host, host_capacity_bytes=cluster.host_memory_bytes_per_gpu,
                    tokens_per_s=tps, tokens_per_s_per_gpu=tps / n, mfu=mfu, hfu=hfu,
                    model_tflops_per_gpu=mfu * peak / 1e12, budget=budget, comm_detail=comm,
                    layer_detail=detail, step_detail=step_detail, sim=sim, pipeline_note=pipeline_note, idle=idle,
                    bubble_fill=filled)


def _budget(workload: Workload, draw_watts: float, *, gpu_hours: float, with_failures: Reliability, **rest) -> Budget:
    """The budget with its energy at the GPU's draw (its TDP, or its power limit below it) and
    that energy's carbon, failure-free and through interruptions (cost/carbon.py)."""
    energy_j = draw_watts * gpu_hours * SECONDS_PER_HOUR
    wall_energy_j = draw_watts * with_failures.wall_gpu_hours * SECONDS_PER_HOUR
    pue, intensity = workload.pue, workload.grid_kg_co2e_per_kwh
    return Budget(tokens=workload.token_budget, gpu_hours=gpu_hours, energy_j=energy_j,
                  facility_energy_j=facility_energy_j(energy_j, pue), carbon_kg=carbon_kg(energy_j, pue, intensity),
                  wall_carbon_kg=carbon_kg(wall_energy_j, pue, intensity), pue=pue, grid_kg_co2e_per_kwh=intensity,
                  with_failures=with_failures, **rest)


def with_replayed_allocator(model: ModelSpec, cluster: ClusterSpec, workload: Workload, est: Estimate) -> Estimate:
    """The estimate with its allocator fragmentation from the step's tensor lifetimes (the
    caching allocator replayed over the worst stage's step: cost/lifetimes.py) in place of the
    GPU's fixed share, which the search's vectorized screen keeps; `fits` again with it."""
    peaks = allocator_peaks(model, cluster, workload, est.plan, expandable=workload.expandable_segments)
    memory = replace(est.memory, fragmentation_bytes=peaks.fragmentation_bytes)
    return replace(est, memory=memory, fits=bool(fits(cluster, memory.total, est.host_bytes)))


def estimate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan,
             *, simulate_pipeline: bool = True, bubble_work: BubbleWork | None = None) -> Estimate:
    """Predict one plan; raises PlanRejectedError with the reason when it cannot run. With
    `bubble_work`, each rank's after-pipeline work and that extra work go into its bubbles
    (Estimate.bubble_fill; the step is the filled one)."""
    rej = check_plan(plan, model, cluster, workload)
    if rej is not None:
        raise PlanRejectedError(f"invalid plan ({plan.describe()}): {rej.reason}")
    costs = evaluate(model, cluster, workload, PlanBatch.from_plans([plan]))
    work = (None if bubble_work is None
            else priced_work(model, cluster, workload, plan, bubble_work, {k: scalar(v) for k, v in costs.step_detail.items()}))
    est = finish(model, cluster, workload, plan, costs, simulate_pipeline=simulate_pipeline, work=work)
    return with_replayed_allocator(model, cluster, workload, est)
