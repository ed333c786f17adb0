"""Plan a serving deployment: enumerate layouts and precisions, simulate, rank, Pareto.

For each deployment (tp, pp, ep, weight and KV dtypes) of one replica:
- memory: weights, workspace, KV capacity (step.serve_memory); a plan whose KV cache cannot
  hold one request is rejected with that reason;
- latency floor: TTFT and TPOT of a lone request (batch 1);
- maximum-load throughput per GPU (batching.simulate with every request queued at once);
- the highest request rate one replica sustains within the latency targets (bisection on
  the simulated p90 TTFT and mean TPOT), hence replicas and GPUs the traffic needs, and
  $ per million output tokens.
The Pareto frontier is over (TPOT at low load, throughput per GPU at maximum load).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..errors import NoPlanFitsError, ParaplanError
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision
from ..units import SECONDS_PER_HOUR, fmt_bytes
from .batching import ServingResult, has_tpot, simulate
from .deploy import EngineLimits, ServePlan, StoreDtype, Traffic
from .step import AttentionWindow, IterationModel, ServeMemory, serve_memory

SLO_PERCENTILE = 90     # TTFT target is checked at this percentile; TPOT at the mean
PROBE_REQUESTS = 200    # requests per probe simulation in the rate bisection
BISECTION_STEPS = 7
EXTRA_REPLICAS = 3       # replicas added beyond the bisected rate's count while the traffic misses its targets


@dataclass(frozen=True, kw_only=True)
class ServeEstimate:
    plan: ServePlan
    memory: ServeMemory
    ttft_floor_s: float             # a lone request
    tpot_floor_s: float
    max_tokens_per_s_per_gpu: float  # output tokens at maximum load
    max_concurrency: int
    slo_rate_rps: float             # per replica, within the targets (0: none)
    replicas_needed: int | None     # for the traffic's rate (None: no rate given, or unreachable)
    usd_per_m_output_tokens: float
    at_rate: ServingResult | None   # the traffic simulated on the replicas it needs

    @property
    def gpus_needed(self) -> int | None:
        return None if self.replicas_needed is None else self.replicas_needed * self.plan.gpus_per_replica


@dataclass(frozen=True, kw_only=True)
class ServeResult:
    ranked: tuple[ServeEstimate, ...]
    rejected: tuple[tuple[ServePlan, str], ...]
    pareto: tuple[ServeEstimate, ...]


class DeploymentRejected(ParaplanError):
    """Why one deployment cannot serve the traffic. `nearness` orders the rejections (the
    largest came closest to fitting: it is the one a NoPlanFitsError names) and `advice`
    says what would make it fit."""

    def __init__(self, reason: str, nearness: tuple, advice: str | None, room: tuple | None = None):
        super().__init__(reason)
        # room: (plan, memory) where the weights leave no room for a request; the advice is
        # then written once the candidates are known (plan_serving, _room_advice)
        self.nearness, self.advice, self.room = nearness, advice, room


GENERAL_ADVICE = ("try more GPUs per replica (a node with more GPUs), int4/fp8 weights, an fp8 KV cache or "
                  "shorter requests (--prompt, --output)")


def _room_advice(plan: ServePlan, mem: ServeMemory, replica_pinned: bool, num_gpus: int) -> str:
    """What would make room for a request beside `plan`'s weights, leaving out what the plan
    already does (its weights already int4, its KV cache already 8-bit); `replica_pinned`:
    the user's --tp/--pp set the replica's size (else more GPUs, --gpus, is the lever)."""
    usable = mem.hbm_bytes - mem.workspace_bytes - mem.reserved_bytes
    weights = mem.weights_bytes * plan.gpus_per_replica  # the worst stage's share on every GPU: an upper bound
    more = "more GPUs per replica (--tp, --pp" if replica_pinned else "more GPUs (--gpus"
    # candidate replicas are TP × PP in powers of two (candidate_plans): say so where --gpus is not one
    powers = "" if replica_pinned or num_gpus & (num_gpus - 1) == 0 else "; a replica takes a power of two"
    ways = [f"{more}: in {plan.weight_dtype} its weights alone fill about {math.ceil(weights / usable)} of these "
            f"GPUs{powers})" if usable > 0 else f"{more})"]
    if plan.weight_dtype.bytes_per_element > StoreDtype.INT4.bytes_per_element:
        ways.append("int4 weights" if plan.weight_dtype.bytes_per_element == 1 else "fp8/int8 or int4 weights")
    if plan.kv_dtype.bytes_per_element > 1:
        ways.append("an 8-bit KV cache")
    ways.append("shorter requests (--prompt, --output)")
    return "try " + ", ".join(ways[:-1]) + " or " + ways[-1]


def _kv_rejection(plan: ServePlan, mem: ServeMemory, need: float, traffic: Traffic,
                  limits: EngineLimits) -> DeploymentRejected:
    """The KV cache holds less than one request: say whether the engine's workspace (sized by
    --max-num-tokens and --max-batch) is what leaves it too small, or the weights are."""
    reason = f"{plan.describe()}: the KV cache holds {mem.kv_capacity_tokens} tokens, one request needs {math.ceil(need)}"
    without_workspace = max(mem.hbm_bytes - mem.weights_bytes - mem.reserved_bytes, 0.0) * limits.kv_free_fraction
    room = mem.hbm_bytes - mem.weights_bytes - mem.workspace_bytes - mem.reserved_bytes  # < 0: over the HBM
    nearness = (mem.kv_capacity_tokens / need, room, plan.gpus_per_replica)
    if without_workspace // mem.kv_bytes_per_token >= need:  # the workspace alone leaves no room
        reason += (f" (the engine's activation workspace for --max-num-tokens {limits.max_num_tokens:,} and "
                   f"--max-batch {limits.max_batch:,} takes {fmt_bytes(mem.workspace_bytes)} of each GPU's "
                   f"{fmt_bytes(mem.hbm_bytes)})")
        advice = "lower --max-num-tokens (the tokens one iteration runs) or --max-batch" + (
            " (with --chunked-prefill, --max-num-tokens may be below --prompt)" if not limits.chunked_prefill
            and limits.max_num_tokens >= traffic.prompt_tokens else "")
    else:
        reason += f" (the weights take {fmt_bytes(mem.weights_bytes)} of each GPU's {fmt_bytes(mem.hbm_bytes)})"
        return DeploymentRejected(reason, nearness, None, room=(plan, mem))
    return DeploymentRejected(reason, nearness, advice)


def expert_parallel_choices(model: ModelSpec, tp: int) -> list[int]:
    """The EP degrees a replica of `tp` GPUs can split an MoE model's experts over (dividing tp
    and the expert count); [1] for a dense model."""
    return [e for e in range(1, tp + 1) if tp % e == 0 and model.is_moe and model.num_experts % e == 0] or [1]


def candidate_plans(model: ModelSpec, cluster: ClusterSpec, max_gpus: int) -> list[ServePlan]:
    has_fp8 = Precision.FP8 in cluster.gpu.peak_flops_per_s
    # FP8 where the GPU has FP8 tensor cores (weights and KV), else int8 weight-only; int4
    # weight-only (AWQ/GPTQ-style) everywhere; 8-bit KV next to every quantized weight choice.
    weights = [StoreDtype.BF16, StoreDtype.FP8 if has_fp8 else StoreDtype.INT8, StoreDtype.INT4]
    kv8 = StoreDtype.FP8 if has_fp8 else StoreDtype.INT8
    out = []
    tp = 1
    while tp <= min(cluster.gpus_per_node, max_gpus):
        if model.tp_splits_heads_badly(tp):  # vLLM and TensorRT-LLM refuse it too
            tp *= 2
            continue
        pp = 1
        while tp * pp <= max_gpus and pp <= model.num_layers:
            for ep in expert_parallel_choices(model, tp):
                for w in weights:
                    for kv in ((StoreDtype.BF16, kv8) if w is StoreDtype.BF16 else (kv8,)):
                        out.append(ServePlan(tp=tp, pp=pp, ep=ep, weight_dtype=w, kv_dtype=kv))
            pp *= 2
        tp *= 2
    return out


def meets_targets(res: ServingResult, traffic: Traffic) -> bool:
    """Whether a simulation's requests meet the traffic's targets (p90 TTFT, mean TPOT)."""
    if traffic.ttft_target_s is not None and res.percentile("ttft_s", SLO_PERCENTILE) > traffic.ttft_target_s:
        return False
    if traffic.tpot_target_s is not None and res.has_tpot and res.tpot_s.mean() > traffic.tpot_target_s:
        return False
    return True


def _slo_rate(step, traffic: Traffic, limits: EngineLimits, capacity: int, max_rps: float) -> float:
    """Highest Poisson rate one replica serves within the targets (bisection, geometric)."""
    probe = replace(traffic, num_requests=PROBE_REQUESTS, concurrency=None)
    lo, hi = 0.0, max_rps * 1.2
    if not meets_targets(simulate(step, replace(probe, rate_rps=max_rps * 0.02), limits, capacity), traffic):
        return 0.0
    lo = max_rps * 0.02
    for _ in range(BISECTION_STEPS):
        mid = math.sqrt(lo * hi)
        if meets_targets(simulate(step, replace(probe, rate_rps=mid), limits, capacity), traffic):
            lo = mid
        else:
            hi = mid
    return lo


def _replicas_meeting(step, traffic: Traffic, limits: EngineLimits, capacity: int, replicas: int):
    """(replicas, their simulation at the traffic's rate): from `replicas` (the rate over one
    replica's SLO rate), one more at a time, up to EXTRA_REPLICAS more, until the whole traffic
    (its requests split over the replicas) meets the targets. The SLO rate is bisected on
    PROBE_REQUESTS requests; a replica run near it for the traffic's longer queue can miss, and
    the deployment named must be the one its own simulation shows within the targets."""
    for extra in range(EXTRA_REPLICAS + 1):
        n = replicas + extra
        at_rate = simulate(step, replace(traffic, rate_rps=traffic.rate_rps / n,
                                         num_requests=max(1, traffic.num_requests // n)), limits, capacity)
        if meets_targets(at_rate, traffic):
            break
    return n, at_rate


def request_kv_tokens(model: ModelSpec, traffic: Traffic, limits: EngineLimits) -> float:
    """KV tokens one request keeps at its longest (full-layer equivalents)."""
    return AttentionWindow.of(model, limits.sliding_window_kv).held(traffic.context_tokens)


def max_sequences(model: ModelSpec, mem: ServeMemory, traffic: Traffic, limits: EngineLimits) -> int:
    """Sequences one replica's KV cache holds at once (at least 1), at most the engine's batch."""
    return max(1, min(limits.max_batch, int(mem.kv_capacity_tokens // request_kv_tokens(model, traffic, limits))))


def estimate_plan(model: ModelSpec, cluster: ClusterSpec, plan: ServePlan, traffic: Traffic,
                  limits: EngineLimits) -> ServeEstimate:
    mem = serve_memory(model, cluster, plan, limits)
    if not cluster.host_memory_holds(mem.host_bytes):
        raise DeploymentRejected(
            f"{plan.describe()}: the experts held in host memory need {fmt_bytes(mem.host_bytes)} per GPU, more than "
            f"its {fmt_bytes(cluster.host_memory_bytes_per_gpu)} share of its host's DRAM",
            (-1.0,), "raise --expert-cache (more experts in HBM) or use more GPUs per replica")
    need = request_kv_tokens(model, traffic, limits)
    if mem.kv_capacity_tokens < need:
        raise _kv_rejection(plan, mem, need, traffic, limits)
    step = IterationModel(model, cluster, plan)
    alone = simulate(step, replace(traffic, rate_rps=None, concurrency=None, num_requests=1), limits,
                     mem.kv_capacity_tokens)
    conc = max_sequences(model, mem, traffic, limits)
    full = simulate(step, replace(traffic, rate_rps=None, concurrency=None, num_requests=max(2 * conc, 64)),
                    limits, mem.kv_capacity_tokens)
    per_gpu = full.output_tokens_per_s / plan.gpus_per_replica
    rate = _slo_rate(step, traffic, limits, mem.kv_capacity_tokens, full.requests_per_s) \
        if (traffic.ttft_target_s or traffic.tpot_target_s) else full.requests_per_s
    replicas = None
    at_rate = None
    if traffic.rate_rps is not None and rate > 0:
        replicas, at_rate = _replicas_meeting(step, traffic, limits, mem.kv_capacity_tokens,
                                              math.ceil(traffic.rate_rps / rate))
    usd = cluster.usd_per_gpu_hour * plan.gpus_per_replica / SECONDS_PER_HOUR
    tokens_per_s = (rate if rate > 0 else full.requests_per_s) * traffic.output_tokens
    return ServeEstimate(plan=plan, memory=mem, ttft_floor_s=float(alone.ttft_s[0]),
                         tpot_floor_s=float(alone.tpot_s[0]) if alone.has_tpot else 0.0,
                         max_tokens_per_s_per_gpu=per_gpu, max_concurrency=full.max_concurrency,
                         slo_rate_rps=rate, replicas_needed=replicas,
                         usd_per_m_output_tokens=usd / tokens_per_s * 1e6, at_rate=at_rate)


def pareto(estimates) -> tuple[ServeEstimate, ...]:
    """Plans no other plan beats on both TPOT floor (lower) and max throughput per GPU (higher)."""
    pts = sorted(estimates, key=lambda e: (e.tpot_floor_s, -e.max_tokens_per_s_per_gpu))
    out, best = [], -1.0
    for e in pts:
        if e.max_tokens_per_s_per_gpu > best:
            out.append(e)
            best = e.max_tokens_per_s_per_gpu
    return tuple(out)


def plan_serving(model: ModelSpec, cluster: ClusterSpec, traffic: Traffic, limits: EngineLimits = EngineLimits(),
                 plans: list[ServePlan] | None = None, progress=None, replica_pinned: bool = False) -> ServeResult:
    """Estimate every candidate; rank by GPUs the rate needs, then $ per million output tokens.
    `replica_pinned`: the user's --tp/--pp chose the replicas' size (what nothing-fits advice names)."""
    plans = plans if plans is not None else candidate_plans(model, cluster, cluster.num_gpus)
    done, rejected, nearest = [], [], None
    for i, plan in enumerate(plans):
        try:
            done.append(estimate_plan(model, cluster, plan, traffic, limits))
        except ParaplanError as exc:
            rejected.append((plan, str(exc)))
            if isinstance(exc, DeploymentRejected) and (nearest is None or exc.nearness > nearest.nearness):
                nearest = exc
        if progress:
            progress(i + 1, len(plans))
    if not done:
        # the candidate that came closest says what rules them out (the first one tried,
        # one GPU, would blame its own size when a flag is what leaves no room)
        if nearest is not None:
            why = f"the nearest of {len(rejected)} candidates: {nearest}"
            advice = nearest.advice if nearest.room is None else _room_advice(*nearest.room, replica_pinned, cluster.num_gpus)
        else:
            why, advice = rejected[0][1] if rejected else "no candidate plans", GENERAL_ADVICE
        raise NoPlanFitsError(f"no serving plan fits {model.name} on {cluster.gpu.name} ({why}); {advice}")
    meeting = [e for e in done if e.slo_rate_rps > 0]
    # fewest GPUs for the traffic's rate first (the cheapest deployment), then $ per token
    ranked = sorted(meeting, key=lambda e: (e.gpus_needed or math.inf, e.usd_per_m_output_tokens)) + \
        sorted([e for e in done if e.slo_rate_rps <= 0], key=lambda e: e.tpot_floor_s)
    return ServeResult(ranked=tuple(ranked), rejected=tuple(rejected), pareto=pareto(done))


def missed_targets_advice(res: ServeResult, traffic: Traffic, cluster: ClusterSpec) -> str:
    """Why no deployment meets the latency targets at any rate, and what would ("" when one does)."""
    if not res.ranked or res.ranked[0].slo_rate_rps > 0:
        return ""
    why = []
    fastest_ttft = min(res.ranked, key=lambda e: e.ttft_floor_s)
    fastest_tpot = min(res.ranked, key=lambda e: e.tpot_floor_s)
    ttft_missed = traffic.ttft_target_s is not None and fastest_ttft.ttft_floor_s > traffic.ttft_target_s
    if ttft_missed:
        why.append(f"a lone request's TTFT is at best {fastest_ttft.ttft_floor_s * 1e3:.1f} ms "
                   f"({fastest_ttft.plan.describe()}), above the {traffic.ttft_target_s * 1e3:g} ms target")
    if (traffic.tpot_target_s is not None and has_tpot(traffic.output_tokens)
            and fastest_tpot.tpot_floor_s > traffic.tpot_target_s):
        whose = "its" if why else "a lone request's"
        why.append(f"{whose} TPOT at best {fastest_tpot.tpot_floor_s * 1e3:.1f} ms ({fastest_tpot.plan.describe()}), "
                   f"above the {traffic.tpot_target_s * 1e3:g} ms target")
    if not why:
        why.append(f"a lone request meets them, but none does at {PROBE_REQUESTS} requests even at a low rate")
    helps = ["looser targets (--ttft-ms, --tpot-ms)"]
    if ttft_missed:
        helps.append("a shorter --prompt")
    if cluster.num_gpus < cluster.gpus_per_node:
        helps.append(f"more GPUs per replica (--gpus up to {cluster.gpus_per_node}: wider tensor parallelism)")
    helps.append("a faster GPU (--cluster)")
    return ("no deployment meets the targets at any rate: " + "; ".join(why) + ". What would help: "
            + ", ".join(helps[:-1]) + " or " + helps[-1])

