"""paraplan command line: search, scale, estimate, trace, validate, embeddings, presets.

User mistakes print one line on stderr and exit 2; nothing is written on failure.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import math
import os
import signal
import sys
from dataclasses import replace

import numpy as np

from .argtypes import integer as _integer, number as _number
from .argtypes import non_negative_float as _non_negative_float
from .argtypes import positive_float as _positive_float
from .argtypes import non_empty as _non_empty
from .argtypes import positive_int as _positive_int
from .argtypes import number_within, percent_below_100 as _percent
from .argtypes import MAX_BATCH_TOKENS, MAX_DEGREE, count as _count, degree as _degree, int_up_to as _int_up_to
from .errors import ParaplanError, SpecError, Terminated, shorten_words, shown
from .specs.files import MAX_COUNT
from .specs.model import MAX_LAYERS, MAX_MTP_LAYERS
from .specs.workload import (ASSUMED_RESTART_S, LLAMA3_INTERRUPTIONS_PER_GPU_DAY, LLAMA3_STORAGE_BYTES_PER_S,
                             MAX_STORAGE_BYTES_PER_S, MAX_TOKEN_BUDGET, MAX_USD_PER_GPU_HOUR, MIN_STORAGE_BYTES_PER_S)
from .units import GIGA as _GIGA
from .report.strict_json import json_text

DEFAULT_MODEL = "llama3-70b"
DEFAULT_CLUSTER = "dgx-h100"
DEFAULT_GPUS = 512
DEFAULT_SEQ = 8192
DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024

MAX_TOP = 1000  # search --top


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        sys.stderr.write(f"paraplan: error: {shorten_words(message)} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def _add_specs(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model, cluster and workload")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"preset name, model TOML or HF config.json (default {DEFAULT_MODEL})")
    g.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"cluster preset or TOML (default {DEFAULT_CLUSTER})")
    g.add_argument("--hardware", default=None, type=_non_empty, help="a calibrated hardware profile TOML (overrides --cluster)")
    g.add_argument("--gpus", type=_degree, default=DEFAULT_GPUS, help=f"number of GPUs (default {DEFAULT_GPUS})")
    g.add_argument("--seq", type=_count, default=DEFAULT_SEQ, help=f"sequence length (default {DEFAULT_SEQ})")
    b = g.add_mutually_exclusive_group()
    b.add_argument("--batch", type=_count, help="global batch in sequences")
    b.add_argument("--batch-tokens", type=_int_up_to(MAX_BATCH_TOKENS),
                   help=f"global batch in tokens, a multiple of --seq (default: about {DEFAULT_BATCH_TOKENS} "
                        "tokens, in whole sequences, rounded so that powers of two up to an eighth of them "
                        "divide it)")
    g.add_argument("--precision", default="bf16", help="bf16, fp16, fp8, nvfp4 (Blackwell), tf32 or fp32 (default "
                   "bf16; tf32/fp32: 4-byte activations, weights and gradients)")
    g.add_argument("--optimizer", default="adam",
                   help="adam (one fused kernel: Megatron, DeepSpeed, torchtitan) or adam-unfused "
                        "(torch.optim.AdamW's default element-wise passes; paraplan run) (default adam)")
    g.add_argument("--tokens", type=number_within(0, MAX_TOKEN_BUDGET, "tokens", above=True), default=1e12,
                   help="token budget to train (default 1e12)")
    g.add_argument("--price", type=number_within(0, MAX_USD_PER_GPU_HOUR, "$ per GPU-hour", above=True), default=None,
                   help="$ per GPU-hour (default: the cluster's)")
    g.add_argument("--mtp-layers", type=_int_up_to(MAX_MTP_LAYERS, least=0), default=None,
                   help="multi-token-prediction modules trained after the last layer (default: the model's, "
                        "DeepSeek-V3's 1; 0 trains none)")
    g.add_argument("--moe-imbalance", type=_number, default=None,
                   help="MoE, dropless: busiest expert-parallel rank's routed tokens over the mean "
                        "(default 1.1, an assumption; 1.0 = perfectly balanced; at most EP and "
                        "experts/top-k, where a rank receives every token)")
    g.add_argument("--interruptions-per-gpu-day", type=_non_negative_float, default=LLAMA3_INTERRUPTIONS_PER_GPU_DAY,
                   help=f"job interruptions per GPU per day (default {LLAMA3_INTERRUPTIONS_PER_GPU_DAY:.2g}: Llama 3's "
                        "419 in 54 days on 16,384 H100; 0: no failures)")
    g.add_argument("--restart-min", type=_non_negative_float, default=ASSUMED_RESTART_S / 60.0,
                   help=f"minutes from an interruption to training again (default {ASSUMED_RESTART_S / 60.0:g}, "
                        "an assumption)")
    g.add_argument("--storage-gb-per-s", type=number_within(MIN_STORAGE_BYTES_PER_S / _GIGA,
                                                            MAX_STORAGE_BYTES_PER_S / _GIGA, "GB/s"),
                   default=LLAMA3_STORAGE_BYTES_PER_S / _GIGA,
                   help="checkpoint storage write bandwidth for the job "
                        f"(default {LLAMA3_STORAGE_BYTES_PER_S / _GIGA:g}: Llama 3's Tectonic)")
    g.add_argument("--json", action="store_true", help="print JSON instead of tables")


def _add_plan(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_argument_group("plan" if required else "pin plan axes (others are searched)")
    for name, hlp in (("tp", "tensor parallel"), ("pp", "pipeline parallel"), ("dp", "data parallel"),
                      ("cp", "context parallel"), ("ep", "expert parallel (MoE)"),
                      ("etp", "expert tensor parallel (MoE)"), ("vp", "virtual stages per pipeline rank"),
                      ("mb", "micro-batch size (sequences)")):
        g.add_argument(f"--{name}", type=_degree, default=None, help=hlp)
    if required:
        g.add_argument("--schedule", default=None, help="gpipe, 1f1b, interleaved, bfs, zb (ZB-H1), zbv (ZB-V, --vp 2), dualpipev (DualPipeV, --vp 2) (default 1f1b / interleaved if --vp>1)")
        g.add_argument("--recompute", default=None,
                       help="none, selective, full, first_k, modules (Megatron-Core --recompute-modules) (default none)")
        g.add_argument("--recompute-layers", type=_int_up_to(MAX_LAYERS), default=0, help="layers per stage for first_k")
        g.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None, help="sequence parallel (default on when TP>1)")
        g.add_argument("--zero", default=None, help="ZeRO stage 0-3 (3 = FSDP) (default 0; for torchtitan, "
                       "with data or context parallelism, its FSDP default: 3, or 2 with --pp > 1)")
        g.add_argument("--dp-shard", type=_degree, default=None, help="ZeRO-3 shard group (HSDP when < DP)")
        g.add_argument("--offload", action="store_true", help="offload optimizer states to host")
        g.add_argument("--no-dp-overlap", action="store_true", help="do not overlap DP communication")
        g.add_argument("--tp-overlap", action="store_true", help="overlap TP communication with GEMMs")
        g.add_argument("--attention", default=None,
                       help="unfused, flash2 or flash3 (default: the fastest the GPU runs)")
        g.add_argument("--cp-comm", default=None,
                       help="with --cp > 1: p2p (ring attention, default), allgather (Llama 3) or a2a (Ulysses)")
        g.add_argument("--rank-order", default=None,
                       help="tp-cp-dp-pp (pipeline outermost: Megatron's default, torchtitan, DeepSpeed) or "
                            "tp-cp-pp-dp (data parallelism outermost: Megatron --use-tp-pp-dp-mapping, Llama 3)")
        g.add_argument("--capacity-factor", type=_positive_float, default=None,
                       help="MoE: drop tokens beyond this capacity factor and pad to it (default: dropless)")
        g.add_argument("--a2a-hierarchical", action="store_true",
                       help="MoE: two-dimensional hierarchical all-to-all (intra-node, then across nodes)")
        g.add_argument("--ep-overlap", action="store_true",
                       help="MoE: run each micro-batch's all-to-alls under another micro-batch's compute")
    else:
        g.add_argument("--cp-comm", default=None,
                       help="context parallel K/V exchange to search: p2p, allgather or a2a (default: all three)")
        g.add_argument("--rank-order", default=None,
                       help="rank order to search: tp-cp-dp-pp (pipeline outermost) or tp-cp-pp-dp (data "
                            "parallelism outermost) (default: both)")
        g.add_argument("--schedule", default=None,
                       help="pipeline schedules to search, comma-separated: gpipe, 1f1b, interleaved, bfs, zb, zbv, dualpipev "
                            "(default: all; plans without a pipeline have none and stay in)")
        g.add_argument("--capacity-factor", type=_positive_float, default=None,
                       help="MoE: search token dropping at this capacity factor instead of dropless")


def _add_engine(p: argparse.ArgumentParser) -> None:
    from .export.common import Engine  # no torch there
    p.add_argument("--engine", default=None, choices=[e.value for e in Engine],
                   help="predict for this engine: its policy (gradient reduction dtype, checkpointing, TP "
                        "backward overlap, FSDP2 copies, fused or eager layers and loss, autocast without FSDP) and, "
                        "in search, only "
                        "the plans it can run (as paraplan export --format does)")
    p.add_argument("--no-compile", action="store_true",
                   help="with --engine torchtitan: price its blocks eager, not under torch.compile (and no async TP)")


def _add_whatif(p: argparse.ArgumentParser, what: str) -> None:
    from .search.whatif import DEFAULT_CHANGE
    p.add_argument("--whatif", type=_percent, nargs="?", const=100.0 * DEFAULT_CHANGE, default=None, metavar="PCT",
                   help=f"also show, for each hardware and workload assumption (compute rate, attention kernels, "
                        f"HBM, NVLink and network bandwidth, latency, overheads, MoE imbalance) made PCT%% worse and "
                        f"better (default {100 * DEFAULT_CHANGE:g}), {what}")


def _engine(args, workload, model):
    """The export module of --engine with its optimizer rule (and the model's, e.g. an MTP
    module the engine does not train) checked; None without the flag."""
    if getattr(args, "engine", None) is None:
        if getattr(args, "no_compile", False):
            raise SpecError("flag", "--no-compile", True, "needs --engine torchtitan (the engine that compiles)")
        return None
    from .export.common import Engine, check_model, check_optimizer, engine_module
    engine = Engine(args.engine)
    check_optimizer(engine, workload)
    mod = engine_module(engine)
    check_model(mod.SUPPORT, model)
    return mod


# parser attributes that pin a plan (estimate, trace, export): any of them given, the plan
# comes from the flags; none, it is the fastest plan that fits (within --engine's bounds)
PLAN_FLAGS = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "mb", "schedule", "recompute", "recompute_layers", "sp",
              "zero", "dp_shard", "offload", "no_dp_overlap", "tp_overlap", "attention", "capacity_factor",
              "a2a_hierarchical", "ep_overlap", "cp_comm", "rank_order")


def _plan_flags_given(args) -> bool:
    return any(getattr(args, k) is not None if k == "sp" else getattr(args, k) not in (None, False, 0)
               for k in PLAN_FLAGS)


def _chosen_plan(args, model, cluster, workload) -> tuple:
    """(plan, source): the plan of the flags ("flags"), or, with no plan flag at all, the
    fastest plan that fits as `paraplan search` ranks it, within --engine's bounds
    ("search"; export picks its plan the same way)."""
    if _plan_flags_given(args):
        return _engine_plan(args, model, cluster, workload), "flags"
    progress = _progress if (not args.json and sys.stderr.isatty()) else None
    mod = _engine(args, workload, model)
    if mod is None:
        from .search.planner import search
        return search(model, cluster, workload, top_k=1, progress=progress).ranked[0].plan, "search"
    from .export.common import best_exportable
    return best_exportable(model, cluster, workload, _support(mod, args), mod.check).plan, "search"


SEARCHED_PLAN_NOTE = ("no plan flags: the fastest plan that fits, as `paraplan search` ranks it (plan flags such as "
                      "--tp pick one)")


def _engine_plan(args, model, cluster, workload):
    """The plan of the flags, with --engine's policy knobs and checked against it."""
    plan = _plan_from_args(args, cluster)
    per = plan.dp * plan.micro_batch_size
    if args.batch is None and args.batch_tokens is None and workload.global_batch_size % per:
        # the default batch, not one the user gave: say so, and which flag sets it
        raise SpecError("plan", "--batch", workload.global_batch_size,
                        f"(the default, about {DEFAULT_BATCH_TOKENS:,} tokens of --seq {workload.seq_len}) is not a "
                        f"multiple of DP×micro-batch = {plan.dp}×{plan.micro_batch_size}; give --batch, a multiple "
                        f"of {per}")
    mod = _engine(args, workload, model)
    if mod is not None:
        plan = _support(mod, args).adapt(_engine_default_zero(args, plan, _support(mod, args)))
        mod.check(plan, model, workload)
    return plan


def _engine_default_zero(args, plan, support):
    """The plan of the flags with the engine's own ZeRO default where --zero was not given and
    the plan has data or context parallelism to shard over (EngineSupport.default_zero)."""
    if args.zero is not None or plan.dp * plan.cp == 1:
        return plan
    return replace(plan, zero=support.default_zero(plan))  # dp_shard is already dp (make_plan)


def _support(mod, args):
    """--engine's EngineSupport, with --no-compile applied (export/common.py engine_support)."""
    from .export.common import engine_support
    return engine_support(mod, getattr(args, "no_compile", False))


def _finite_flag(flag: str, value: float) -> float:
    """A flag's value in SI units; one past the float range is the flag's error."""
    if not math.isfinite(value):
        raise SpecError("workload", flag, value, "too large")
    return value


def _check_moe_imbalance(args, model) -> None:
    """--moe-imbalance is the busiest EP rank's routed tokens over the mean: a rank receives
    each token at most min(k, E/ep) times of the k·T/ep it gets on average, so the factor is
    at most min(EP, E/k) (cost/moe.py load_factor); EP where it is pinned, else E/k."""
    lam = args.moe_imbalance
    if lam is None:
        return
    if not model.is_moe:  # as --capacity-factor: a flag that would change nothing is refused
        raise SpecError("workload", "--moe-imbalance", lam,
                        f"applies to mixture-of-experts models only; {model.name} is dense")
    most = model.num_experts / model.top_k
    ep = getattr(args, "ep", None)
    if ep is not None and ep > 1:
        most = min(most, float(ep))
    if not 1.0 <= lam <= most:  # also false for nan
        pinned = f"EP = {ep} and " if ep is not None and ep > 1 else ""
        raise SpecError("workload", "--moe-imbalance", lam,
                        f"from 1.0 to {most:g} is allowed: the busiest rank's load over the mean is at most "
                        f"{pinned}experts/top-k = {model.num_experts}/{model.top_k} of {model.name} "
                        "(one rank receiving every token)")


def default_batch(seq: int) -> int:
    """Sequences of the default batch: about DEFAULT_BATCH_TOKENS, rounded to a multiple of an
    eighth of its leading power of two (within 1/16 of the tokens), so that data-parallel
    degrees up to that power divide it (4M/3000 = 1398.1 gives 1408 = 11 * 128, not 1398)."""
    n = DEFAULT_BATCH_TOKENS / seq
    if n < 1:
        return 1
    step = 2 ** max(int(math.log2(n)) - 3, 0)
    return max(step, round(n / step) * step)


def _specs(args, cluster_name: str | None = None):
    """The model, cluster (`cluster_name`, else --hardware or --cluster) and workload of the flags."""
    from .specs.catalog import load_cluster, load_model
    from .specs.workload import Optimizer, Workload, parse_precision
    try:
        optimizer = Optimizer(args.optimizer)
    except ValueError:
        raise SpecError("workload", "--optimizer", args.optimizer,
                        "allowed: " + ", ".join(o.value for o in Optimizer)) from None
    model = load_model(args.model)
    if args.mtp_layers is not None:
        model = replace(model, mtp_layers=args.mtp_layers)
    _check_moe_imbalance(args, model)
    if cluster_name is None and not args.hardware and "," in args.cluster and not os.path.exists(args.cluster):
        raise SpecError(args.command, "--cluster", args.cluster, "one cluster preset or TOML (a list of clusters "
                        "is for paraplan scale)")
    cluster = load_cluster(cluster_name or args.hardware or args.cluster, num_gpus=args.gpus)
    if args.batch:
        gbs = args.batch
    elif args.batch_tokens is None:
        gbs = default_batch(args.seq)
    else:
        tokens = args.batch_tokens
        if tokens % args.seq:
            raise SpecError("workload", "--batch-tokens", tokens, f"must be a multiple of --seq {args.seq} "
                            f"(or give --batch in sequences)")
        gbs = tokens // args.seq
        if gbs > MAX_COUNT:
            raise SpecError("workload", "--batch-tokens", tokens, f"at most {MAX_COUNT} sequences of --seq {args.seq}")
    wl = Workload(global_batch_size=gbs, seq_len=args.seq, precision=parse_precision(args.precision, "--precision"),
                  optimizer=optimizer, token_budget=args.tokens, usd_per_gpu_hour=args.price,
                  **({} if args.moe_imbalance is None else {"moe_imbalance": args.moe_imbalance}),
                  restart_s=_finite_flag("--restart-min", 60.0 * args.restart_min),
                  storage_bytes_per_s=_finite_flag("--storage-gb-per-s", _GIGA * args.storage_gb_per_s),
                  interruptions_per_gpu_day=args.interruptions_per_gpu_day)
    return model, cluster, wl


def _plan_from_args(args, cluster):
    from .plan.axes import V_SCHEDULES, AttentionKernel, CPCommType, RankOrder, Recompute, Schedule, ZeroStage
    from .plan.plan import make_plan
    tp, pp, cp, vp = args.tp or 1, args.pp or 1, args.cp or 1, args.vp or 1
    if args.dp is None:
        if cluster.num_gpus % (tp * pp * cp):
            raise SpecError("plan", "tp×pp×cp", tp * pp * cp, f"must divide the {cluster.num_gpus} GPUs")
        dp = cluster.num_gpus // (tp * pp * cp)
    else:
        dp = args.dp
    sched = Schedule.parse(args.schedule, "schedule") if args.schedule is not None else (
        Schedule.INTERLEAVED_1F1B if vp > 1 else Schedule.ONE_F_ONE_B)
    if args.schedule is not None and pp == 1:
        raise SpecError("plan", "--schedule", args.schedule, "applies to a pipeline only (--pp > 1); "
                        "one stage runs no pipeline schedule")
    if (sched in (Schedule.INTERLEAVED_1F1B, Schedule.BREADTH_FIRST) or sched in V_SCHEDULES) and vp == 1 and pp > 1:
        raise SpecError("plan", "--vp", vp, f"--schedule {sched} runs several chunks per pipeline rank: give "
                        + ("--vp 2" if sched in V_SCHEDULES else "--vp 2 or more"))
    recompute = Recompute.parse("none" if args.recompute is None else args.recompute, "recompute")
    if recompute is Recompute.FIRST_K and not args.recompute_layers:
        raise SpecError("plan", "--recompute-layers", 0, "--recompute first_k needs it: the layers of each "
                        "stage to recompute, at least 1")
    if args.recompute_layers and recompute is not Recompute.FIRST_K:
        raise SpecError("plan", "--recompute-layers", args.recompute_layers,
                        f"applies with --recompute first_k only (not {recompute.value})")
    zero = ZeroStage.parse("0" if args.zero is None else str(args.zero), "zero")
    sp = args.sp if args.sp is not None else tp > 1
    cp_comm = CPCommType.parse(args.cp_comm, "cp_comm_type") if args.cp_comm is not None else CPCommType.P2P
    order = RankOrder.parse(args.rank_order, "rank_order") if args.rank_order is not None else RankOrder.TP_CP_DP_PP
    return make_plan(tp=tp, pp=pp, dp=dp, cp=cp, cp_comm_type=cp_comm, rank_order=order, ep=args.ep or 1, etp=args.etp or 1,
                     capacity_factor=args.capacity_factor, a2a_hierarchical=args.a2a_hierarchical,
                     ep_overlap=args.ep_overlap, vp=vp, micro_batch_size=args.mb or 1, schedule=sched,
                     recompute=recompute,
                     recompute_num_layers=args.recompute_layers, sequence_parallel=sp, zero=zero,
                     dp_shard=args.dp_shard or 0, offload_optimizer=args.offload,
                     dp_overlap=not args.no_dp_overlap, tp_overlap=args.tp_overlap,
                     attention=AttentionKernel.parse(args.attention, "attention") if args.attention is not None
                     else cluster.gpu.attention_kernels[-1])


def _seq_notes(model, wl) -> list[str]:
    """What the user may not know about the sequence length asked for (also under --json)."""
    if model.max_seq_len and wl.seq_len > model.max_seq_len:
        return [f"note: --seq {wl.seq_len:,} is longer than {model.name}'s max_seq_len of {model.max_seq_len:,}: "
                "predicted as asked; training at it needs the positions extended (e.g. RoPE scaling)"]
    return []


def _header(model, cluster, wl, suffix: str = "") -> str:
    from .report.table import unchecked_note
    from .units import fmt_count
    notes = [n for n in [unchecked_note([cluster.gpu])] + _seq_notes(model, wl) if n]
    return "\n".join([f"{model.name} ({fmt_count(model.num_params)} params) on {cluster.num_gpus} × {cluster.gpu.name} "
                      f"({cluster.name}); batch {wl.global_batch_size} × {wl.seq_len} tokens, {wl.precision}{suffix}"]
                     + notes)


def _progress(done: int, total: int) -> None:
    width = 30
    frac = done / max(total, 1)
    sys.stderr.write(f"\rsearching [{'#' * int(width * frac):<{width}}] {100 * frac:5.1f}%")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def cmd_search(args) -> int:
    from .export.common import ENGINE_CANDIDATES
    from .report.jsonout import estimate_dict
    from .errors import NoPlanFitsError
    from .report.table import estimate_report, ranking_table, unchecked_gpus
    from .report.whatif import whatif_dict, whatif_table
    from .plan.space import SpaceLimits
    from .search.planner import PIN_FLAGS, search
    from .search.whatif import WHATIF_CANDIDATES, what_if
    from .units import fmt_bytes, fmt_time
    model, cluster, wl = _specs(args)
    user_pins, user_limits = _search_pins(args)
    mod = _engine(args, wl, model)
    fixed, limits = (user_pins, user_limits) if mod is None else _engine_space(_support(mod, args), user_pins,
                                                                                user_limits)
    show = (not args.json) and sys.stderr.isatty()

    def ranked_on(cl, w, top, progress=None, fixed=fixed, limits=limits):
        res = search(model, cl, w, limits=limits, fixed=fixed,
                     top_k=top if mod is None else max(top, ENGINE_CANDIDATES), progress=progress)
        return res, (res.ranked if mod is None else _expressible(mod, args, res.ranked, model, w))

    # the user's restrictions of the plan space beyond the pinned axes, which a search without
    # the pins lifts too (the capacity factor is kept: token dropping is a training choice)
    restrictions = [(f, v) for f, v in (("--schedule", args.schedule), ("--cp-comm", args.cp_comm),
                                        ("--rank-order", args.rank_order)) if v is not None]

    def without_pins(exc):
        """The nothing-fits error, saying whether the search without the user's pins fits."""
        pins = " ".join([f"{PIN_FLAGS[k]} {v}" for k, v in user_pins.items()] + [f"{f} {v}" for f, v in restrictions])
        kept = "; --capacity-factor kept" if args.capacity_factor is not None else ""
        lifted = f"without the pins ({pins}{kept})"
        if show:
            sys.stderr.write(f"nothing fits; searching again {lifted}\n")
        d = SpaceLimits()
        unrestricted = replace(user_limits, schedules=d.schedules, cp_comm_types=d.cp_comm_types,
                               rank_orders=d.rank_orders)
        fixed2, limits2 = ({}, unrestricted) if mod is None else _engine_space(_support(mod, args), {}, unrestricted)
        try:
            best = ranked_on(cluster, wl, 1, _progress if show else None, fixed2, limits2)[1][0]
        except NoPlanFitsError:
            return NoPlanFitsError(f"{exc}; {lifted} no plan fits either")
        fastest = (f"the fastest is {best.plan.describe()} ({fmt_bytes(best.memory.total)}, "
                   f"step {fmt_time(best.step_time_s)})")
        if exc.smallest is None:
            return NoPlanFitsError(f"{exc}; {lifted} plans fit: {fastest}")
        need, plan = exc.smallest
        return NoPlanFitsError(f"no plan with the pins ({pins}) fits in {fmt_bytes(cluster.gpu.hbm_bytes)} per GPU: "
                               f"the smallest needs {fmt_bytes(need)} ({plan.describe()}); {lifted} plans fit: "
                               f"{fastest}")

    def fastest_on(cl, w):  # --whatif: the whole space searched again on a changed cluster
        try:
            return ranked_on(cl, w, 1)[1][0]
        except NoPlanFitsError:
            return None

    try:
        res, pool = ranked_on(cluster, wl, args.top if args.whatif is None else max(args.top, WHATIF_CANDIDATES),
                              _progress if show else None)
    except NoPlanFitsError as exc:
        if not (user_pins or restrictions):
            raise
        raise without_pins(exc) from None
    ranked = pool[: args.top]
    wi = None if args.whatif is None else what_if(model, cluster, wl, pool[:WHATIF_CANDIDATES], args.whatif / 100.0,
                                                  search_again=fastest_on)
    if args.json:
        print(json_text({"model": model.name, "cluster": cluster.name, "num_gpus": cluster.num_gpus,
                          "engine": args.engine, "unchecked_gpus": unchecked_gpus([cluster.gpu]),
                          "notes": _seq_notes(model, wl),
                          "num_candidates": res.num_candidates, "num_valid": res.num_valid, "num_fit": res.num_fit,
                          "elapsed_s": res.elapsed_s, "ranked": [estimate_dict(e) for e in ranked],
                          **({"whatif": whatif_dict(wi)} if wi else {})}, indent=1))
        return 0
    print(_header(model, cluster, wl, f"; plans {args.engine} runs, predicted with its policy" if mod else ""))
    print(f"searched {res.num_candidates:,} candidate plans ({res.num_valid:,} valid, {res.num_fit:,} fit in memory) "
          f"in {res.elapsed_s:.1f} s\n")
    print(ranking_table(ranked))
    print("\nbest plan:\n")
    print(estimate_report(ranked[0]))
    if wi:
        print("\n" + whatif_table(wi, ranked))
    return 0


def _engine_space(support, fixed: dict, limits):
    """The search bounds of an engine (export/common.py EngineSupport) with the user's pins
    and choices inside them; a pin the engine cannot run is a one-line error."""
    from .export.common import unsupported
    for key, value in support.pinned.items():
        if key in fixed and fixed[key] != value:
            raise unsupported(support.engine, f"--{key}", fixed[key], f"{key}={value} only")
    for key, most in (("cp", support.limits.max_cp), ("vp", support.limits.max_vp), ("ep", support.limits.max_ep)):
        if most and fixed.get(key, 1) > most:  # a bound of 0 is none
            raise unsupported(support.engine, f"--{key}", fixed[key], f"{key} up to {most}")
    cp_comms = tuple(c for c in limits.cp_comm_types if c in support.limits.cp_comm_types)
    if not cp_comms:
        raise unsupported(support.engine, "--cp-comm", ",".join(map(str, limits.cp_comm_types)),
                          ", ".join(map(str, support.limits.cp_comm_types)))
    orders = tuple(o for o in limits.rank_orders if o in support.limits.rank_orders)
    if not orders:
        raise unsupported(support.engine, "--rank-order", ",".join(map(str, limits.rank_orders)),
                          ", ".join(map(str, support.limits.rank_orders)))
    schedules = tuple(s for s in limits.schedules if s in support.limits.schedules)
    if not schedules:
        raise unsupported(support.engine, "--schedule", ",".join(map(str, limits.schedules)),
                          ", ".join(map(str, support.limits.schedules)))
    return {**support.pinned, **fixed}, replace(support.search_limits(), capacity_factors=limits.capacity_factors,
                                                cp_comm_types=cp_comms, rank_orders=orders, schedules=schedules)


def _expressible(mod, args, ranked, model, wl):
    """The ranked plans the --engine's exporter accepts, in order (export/common.py)."""
    from .export.common import expressible
    return expressible(ranked, model, wl, _support(mod, args), mod.check)


def _search_pins(args):
    """The plan axes pinned by flags, and the search limits the flags set."""
    from .plan.axes import CPCommType, RankOrder, Schedule
    from .plan.space import SpaceLimits
    fixed = {k2: getattr(args, k1) for k1, k2 in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"),
                                                    ("ep", "ep"), ("etp", "etp"), ("vp", "vp"),
                                                    ("mb", "micro_batch_size"))
             if getattr(args, k1) is not None}
    cp_comms = (CPCommType.parse(args.cp_comm, "cp_comm_type"),) if args.cp_comm is not None else tuple(CPCommType)
    orders = (RankOrder.parse(args.rank_order, "rank_order"),) if args.rank_order is not None else tuple(RankOrder)
    schedules = (tuple(dict.fromkeys(Schedule.parse(x.strip(), "schedule") for x in args.schedule.split(",")))
                 if args.schedule is not None else tuple(Schedule))
    return fixed, SpaceLimits(capacity_factors=(args.capacity_factor,), cp_comm_types=cp_comms, rank_orders=orders,
                              schedules=schedules)


DEFAULT_SCALE_COUNTS = (256, 512, 1024, 2048, 4096, 8192, 16384)


def _cluster_names(text: str) -> list[str]:
    """scale --cluster: one preset or TOML, or several separated by commas (each once)."""
    names = [x.strip() for x in text.split(",")]
    if not all(names):
        raise SpecError("scale", "--cluster", text, "cluster presets or TOML files separated by commas "
                        "(e.g. dgx-h100,dgx-b200)")
    return list(dict.fromkeys(names))


def _gpu_counts(text: str) -> tuple[int, ...]:
    """--counts: GPU counts separated by commas, each a whole number >= 1."""
    try:
        counts = tuple(_integer(x) for x in text.split(","))
    except argparse.ArgumentTypeError:
        counts = ()
    if not counts or any(not 1 <= n <= MAX_DEGREE for n in counts):
        raise SpecError("scale", "--counts", text, f"GPU counts separated by commas, each a whole number from 1 to "
                        f"{MAX_DEGREE:,} (e.g. 1024,2048,4096)")
    return tuple(sorted(set(counts)))


def cmd_scale(args) -> int:
    from .export.common import ENGINE_CANDIDATES
    from .report.jsonout import estimate_dict
    from .report.table import scaling_table, unchecked_gpus, unchecked_note
    from .search.scaling import scale
    from .specs.catalog import load_cluster
    from .units import fmt_count
    counts = _gpu_counts(args.counts)
    if args.plot is not None:  # a path that cannot be written fails before the searches
        from .report.plots import plot_format
        plot_format(args.plot, "scale")
    names = _cluster_names(args.cluster)
    if args.hardware:
        if len(names) > 1:  # --hardware replaces --cluster: a list would be dropped silently
            raise SpecError("scale", "--hardware", args.hardware, "one profile in place of --cluster; to compare "
                            "it with clusters, list it in --cluster (e.g. --cluster dgx-h100,profile.toml)")
        names = [args.hardware]
    model, cluster, wl = _specs(args, names[0])
    clusters = [load_cluster(name, num_gpus=n) for name in names for n in counts]
    loaded = [c.name for c in clusters[::len(counts)]]
    if len(set(loaded)) < len(loaded):  # points are told apart by their cluster's name
        raise SpecError("scale", "--cluster", args.cluster, f"clusters with distinct names (these load as {', '.join(loaded)})")
    fixed, limits = _search_pins(args)
    mod = _engine(args, wl, model)
    if mod is not None:
        fixed, limits = _engine_space(_support(mod, args), fixed, limits)
    show = (not args.json) and sys.stderr.isatty()

    def progress(i, n, gpus):
        on = f" of {clusters[i].name}" if len(names) > 1 else ""
        sys.stderr.write(f"\rsearching {gpus:,} GPUs{on} ({i + 1} of {n})   ")
        sys.stderr.flush()

    try:
        result = scale(model, clusters, wl, limits=limits, fixed=fixed, progress=progress if show else None,
                       choose=None if mod is None else (lambda ranked: _expressible(mod, args, ranked, model, wl)),
                       choose_among=ENGINE_CANDIDATES)
    finally:
        if show:
            sys.stderr.write("\r" + " " * 40 + "\r")
    where = (f"{cluster.gpu.name} ({cluster.name})" if len(names) == 1
             else ", ".join(f"{c.gpu.name} ({c.name})" for c in clusters[::len(counts)]))
    title = (f"{model.name} on {where}; batch {wl.global_batch_size} × {wl.seq_len} "
             f"tokens, {wl.precision}" + (f"; plans {args.engine} runs" if mod is not None else ""))
    if args.plot is not None:
        from .report.plots import plot_scaling
        plot_scaling(result, args.plot, title)
    if args.json:
        print(json_text({"model": model.name, "cluster": cluster.name if len(names) == 1 else None,
                          "unchecked_gpus": unchecked_gpus([c.gpu for c in clusters]),
                          "global_batch_size": wl.global_batch_size,
                          "seq_len": wl.seq_len, "precision": str(wl.precision), "optimizer": str(wl.optimizer),
                          "token_budget": wl.token_budget, "interruptions_per_gpu_day": wl.interruptions_per_gpu_day,
                          "clusters": list(result.cluster_names),
                          "points": [
                              {"num_gpus": p.num_gpus, "cluster": p.cluster_name, "gpu": p.gpu_name,
                               "usd_per_gpu_hour": p.usd_per_gpu_hour,
                               "why_not": p.why_not or None, "scaling_efficiency": p.efficiency,
                               "num_candidates": p.num_candidates, "search_s": p.elapsed_s,
                               "best": estimate_dict(p.best) if p.best is not None else None} for p in result.points],
                          "fastest_num_gpus": result.fastest.num_gpus if result.fastest else None,
                          "fastest_cluster": result.fastest.cluster_name if result.fastest else None,
                          "cheapest_num_gpus": result.cheapest.num_gpus if result.cheapest else None,
                          "cheapest_cluster": result.cheapest.cluster_name if result.cheapest else None}, indent=1))
        return 0
    print(title + f"; {fmt_count(wl.token_budget)} tokens to train\n")
    print(scaling_table(result))
    note = unchecked_note([c.gpu for c in clusters])
    if note:
        print(note)
    if args.plot:
        print(f"wrote {args.plot}")
    return 0


def cmd_estimate(args) -> int:
    from .cost.estimate import estimate
    from .report.jsonout import estimate_dict
    from .report.table import estimate_report, unchecked_gpus
    from .report.whatif import whatif_dict, whatif_table
    from .search.whatif import what_if
    model, cluster, wl = _specs(args)
    plan, source = _chosen_plan(args, model, cluster, wl)
    est = estimate(model, cluster, wl, plan)
    wi = None if args.whatif is None else what_if(model, cluster, wl, [est], args.whatif / 100.0)
    advice, changes = _misfit_advice(args, model, cluster, wl, est)
    if args.json:
        fits_with = [{"flags": c.flags, "plan": c.plan.describe(), "memory_bytes": c.estimate.memory.total,
                      "step_time_s": c.estimate.step_time_s} for c in changes]
        print(json_text({**estimate_dict(est), "plan_source": source, "unchecked_gpus": unchecked_gpus([cluster.gpu]),
                          "notes": _seq_notes(model, wl),
                          **({"misfit": advice, "fits_with": fits_with} if advice else {}),
                          **({"whatif": whatif_dict(wi)} if wi else {})}, indent=1))
    else:
        print(_header(model, cluster, wl) + ("\n" + SEARCHED_PLAN_NOTE if source == "search" else "") + "\n")
        print(estimate_report(est))
        if advice:
            print("\n" + advice)
        if wi:
            print("\n" + whatif_table(wi))
    return 0


def _misfit_advice(args, model, cluster, wl, est):
    """('', []) for a plan that fits; else the line saying why not and which single change of
    its flags would fit (search/advice.py), under --engine's rules, with the changes."""
    if est.fits:
        return "", []
    from .search.advice import misfit_advice
    mod = _engine(args, wl, model)
    check = None if mod is None else (lambda p: mod.check(_support(mod, args).adapt(p), model, wl))
    return misfit_advice(model, cluster, wl, est, check)


TRACE_LAYER_EVENTS = 1_000_000  # about 200 MB of trace JSON: what Perfetto opens comfortably
TRACE_MAX_LAYER_EVENTS = 10 * TRACE_LAYER_EVENTS  # about 2 GB: the most --max-microbatches may ask for
# names of the per-layer operations that are communication (TP, CP, FSDP, EP collectives)
TRACE_COMM_MARKERS = ("TP", "CP", "FSDP", "EP", "all-to-all")


def cmd_trace(args) -> int:
    from .cost.estimate import chunk_layers, estimate, stage_costs
    from .cost.evaluate import evaluate
    from .outfile import check_not_input, check_output, write_output
    from .plan.axes import Schedule
    from .plan.space import PlanBatch
    from .report.timeline import chrome_trace
    from .sim.engine import simulate
    from .sim.schedules import SPLIT_BACKWARD, Phase, build_schedule, placement, virtual_stage
    if args.output != "-":  # a path that cannot be written fails before the simulation
        check_output(args.output, "trace", "--output")
        check_not_input(args.output, args, "trace", "--output")
    model, cluster, wl = _specs(args)
    most = max(1, TRACE_MAX_LAYER_EVENTS // (10 * model.num_layers))  # counted as the default cap below
    if args.max_microbatches is not None and args.max_microbatches > most:
        raise SpecError("trace", "--max-microbatches", args.max_microbatches,
                        f"at most {most:,} for {model.num_layers} layers (about 2 GB of trace JSON)")
    plan, source = _chosen_plan(args, model, cluster, wl)
    est = estimate(model, cluster, wl, plan)  # the full step (the pipeline simulated)
    m = est.num_microbatches
    # a trace of every micro-batch of a long step is gigabytes no viewer opens: show the
    # schedule on fewer (a multiple of PP, at least 2·PP) with the same per-micro-batch costs
    cap = args.max_microbatches or max(1, TRACE_LAYER_EVENTS // (10 * model.num_layers))
    shown = min(m, m if m <= cap else max(2 * plan.pp, cap // plan.pp * plan.pp))
    staged = plan if plan.pp > 1 else replace(plan, schedule=Schedule.ONE_F_ONE_B, vp=1)
    if plan.pp > 1 and shown == m and est.sim is not None:
        sim = est.sim
    else:  # one stage (the estimate simulates no pipeline) or fewer micro-batches: re-simulate
        costs = evaluate(model, cluster, wl, PlanBatch.from_plans([plan]))
        sim = simulate(build_schedule(staged.schedule, staged.pp, shown, staged.vp), stage_costs(costs, staged),
                       placement(staged.schedule))
    # each virtual stage's layers as the cost model lays them out (embedding and loss slots)
    layers = chunk_layers(model, wl, staged)
    labels = [", ".join((["embedding"] if j == 0 else []) + ([f"L{r[0]}-{r[-1]}"] if len(r) else [])
                        + ([f"MTP ×{model.mtp_layers}"] if j == len(layers) - 1 and model.mtp_layers else [])
                        + (["LM head + loss"] if j == len(layers) - 1 else [])) for j, r in enumerate(layers)]
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
            sys.stderr.write(f"paraplan: warning: the plan {_misfit_advice(args, model, cluster, wl, est)[0]}\n")
    else:
        write_output(args.output, text, "trace", "--output")
        advice, _ = _misfit_advice(args, model, cluster, wl, est)
        if not args.json:
            print(f"wrote {args.output}: {len(trace['traceEvents']):,} events, step {est.step_time_s:.3f} s "
                  "(open in https://ui.perfetto.dev or chrome://tracing)"
                  + (f"; {shown} of the step's {m} micro-batches shown (--max-microbatches)" if shown < m else "")
                  + (f"\nplan {plan.describe()}: {SEARCHED_PLAN_NOTE}" if source == "search" else ""))
            if advice:
                print(f"the plan {advice}")
        else:
            print(json_text({"output": args.output, "events": len(trace["traceEvents"]), "step_time_s": est.step_time_s,
                              "plan": plan.describe(), "plan_source": source,
                              "microbatches": m, "microbatches_shown": shown, **({"misfit": advice} if advice else {})}))
    return 0


def cmd_validate(args) -> int:
    from .validate.inference import is_inference_file, validate_inference_file
    from .validate.report import render_validation
    from .validate.rows import summarize
    from .validate.training import validate_file
    if args.cv:
        return _cross_validate(args)
    kw = {}
    if args.hardware:  # a bad profile is one line before any row is predicted
        from .specs.catalog import load_flag_cluster
        if any(is_inference_file(f) for f in args.files):
            raise SpecError("validate", "--hardware", args.hardware, "only training-measurement files take a profile")
        load_flag_cluster("validate", "--hardware", args.hardware)
        kw["hardware"] = args.hardware
    progress = _progress if (not args.json and sys.stderr.isatty()) else None
    results = [(validate_inference_file(f, progress=progress) if is_inference_file(f)
                else validate_file(f, progress=progress, **kw)) for f in args.files]
    rows = [r for res in results for r in res["rows"]]
    result = results[0] if len(results) == 1 else {"rows": rows, "summary": summarize(rows)}
    if args.json:
        print(json_text(result, indent=1))
    else:
        print(render_validation(result, verbose=args.verbose))
    summary = result["summary"]
    if summary["n_predicted"] == 0:  # a summary of nothing must not read as a pass: exit 1
        sys.stderr.write(f"paraplan: error: no row of {', '.join(args.files)} could be predicted "
                         f"({summary['n_skipped']} skipped: each row above says why)\n")
        return 1
    return 0


def _cross_validate(args) -> int:
    """validate --cv source: knobs fitted per GPU on every source but one, that one predicted."""
    from .validate.cli import cross_validation, render_cross_validation
    from .validate.inference import is_inference_file
    for f in args.files:
        if is_inference_file(f):
            raise SpecError("validate", "--cv", args.cv, f"applies to training files; {f} holds inference runs")
    if args.hardware:
        raise SpecError("validate", "--hardware", args.hardware, "not with --cv (which fits the presets' knobs)")
    result = cross_validation(args.files)
    print(json_text(result, indent=1) if args.json else render_cross_validation(result))
    return 0 if result["rows"] else 1


def cmd_presets(args) -> int:
    from .report.table import grid
    from .specs.catalog import list_clusters, list_gpus, list_models, load_cluster, load_gpu, load_model
    from .units import GIGA, TERA, fmt_count
    from .specs.workload import Precision
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


def _ranks_text(ranks, world: int) -> str:
    if len(ranks) == world and tuple(ranks) == tuple(range(world)):
        return "all"
    if len(ranks) > 2 and tuple(ranks) == tuple(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def cmd_embeddings(args) -> int:
    from .embeddings.cost import evaluate
    from .embeddings.search import plan_embeddings
    from .embeddings.tables import Optimizer, load_embedding_workload, load_profile
    from .export.torchrec import export_document
    from .report.table import grid
    from .specs.catalog import load_cluster
    from .units import fmt_bytes, fmt_count
    from .outfile import check_not_input, check_output, write_output
    if args.export_torchrec is not None:  # before planning
        check_output(args.export_torchrec, "embeddings", "--export-torchrec")
        check_not_input(args.export_torchrec, args, "embeddings", "--export-torchrec")
    if not 0 <= args.hbm_reserve < 1:
        raise SpecError("--hbm-reserve", "value", args.hbm_reserve, "a fraction in [0, 1) is required")
    try:
        optimizer = Optimizer(args.optimizer)
    except ValueError:
        raise SpecError("--optimizer", "value", args.optimizer, "allowed: " + ", ".join(o.value for o in Optimizer)) from None
    cluster = load_cluster(args.cluster, num_gpus=args.gpus)
    wl = load_embedding_workload(args.tables, args.batch_per_rank, optimizer)
    if args.profile:
        wl = wl.with_access(load_profile(args.profile))
    res = plan_embeddings(wl, cluster, hot_rows=args.hot_rows, dedup=args.dedup, hbm_reserve_fraction=args.hbm_reserve)
    plan, cost = res.plan, res.cost
    compare = None
    if args.compare_torchrec:
        from .export.torchrec import price_with_torchrec, torchrec_plan
        tr_plan, tr_rating = torchrec_plan(wl, cluster, plan.world_size)
        compare = {"paraplan": {"paraplan_step_s": cost.step_time_s,
                                "torchrec_max_rank_s": price_with_torchrec(plan, wl, cluster).max_rank_s},
                   "torchrec_default": {"paraplan_step_s": evaluate(tr_plan, wl, cluster, hbm_reserve_fraction=args.hbm_reserve).step_time_s,
                                        "torchrec_max_rank_s": tr_rating.max_rank_s}}
    exported = export_document(plan, wl)
    if args.export_torchrec is not None:
        write_output(args.export_torchrec, json_text(exported, indent=1) + "\n", "embeddings", "--export-torchrec")
    if args.json:
        print(json_text({
            "workload": wl.name, "cluster": cluster.name, "world_size": plan.world_size,
            "batch_size_per_rank": wl.batch_size_per_rank, "hot_rows": args.hot_rows, "dedup": args.dedup,
            "step_time_s": cost.step_time_s, "phases_s": cost.phase_s, "all_to_all_bytes": cost.a2a_bytes,
            "max_rank_hbm_bytes": float(cost.hbm_bytes.max()), "usable_hbm_bytes": cost.capacity_bytes,
            "max_host_bytes": float(cost.host_bytes_per_host.max()), "host_memory_bytes": cost.host_capacity_bytes,
            "plans_priced": res.candidates, "torchrec": exported, "compare_torchrec": compare}, indent=1))
        return 0
    print(f"{wl.name}: {len(wl.tables)} tables, {fmt_bytes(wl.total_weight_bytes)} of weights, batch {wl.batch_size_per_rank:,}/rank "
          f"on {plan.world_size} x {cluster.gpu.name} ({cluster.name}); optimizer {wl.optimizer.value}"
          + ("; hot-row replication" if args.hot_rows else "") + ("; in-batch dedup" if args.dedup else ""))
    print(f"step (embeddings only) {cost.step_time_s * 1e3:.3f} ms; all-to-all {fmt_bytes(cost.a2a_bytes)}/step; "
          f"fullest rank {fmt_bytes(float(cost.hbm_bytes.max()))} of {fmt_bytes(cost.capacity_bytes)} usable HBM; "
          + (f"host memory (UVM) {fmt_bytes(float(cost.host_bytes_per_host.max()))} per host"
             + (f" of {fmt_bytes(cost.host_capacity_bytes)}; " if cost.host_capacity_bytes > 0 else "; ")
             if float(cost.host_bytes_per_host.max()) > 0 else "")
          + f"{res.candidates} plans priced")
    print()
    total = cost.step_time_s
    print(grid(["phase (slowest rank)", "ms", "share"],
               [[k, f"{v * 1e3:.4f}", f"{100 * v / total:.1f}%"] for k, v in cost.phase_s.items() if v > 0]))
    print()
    tables = {t.name: t for t in wl.tables}
    print(grid(["table", "rows", "dim", "pool", "sharding", "kernel", "ranks", "hot rows", "lookup ms"],
               [[p.table, fmt_count(tables[p.table].num_rows), str(tables[p.table].dim), f"{tables[p.table].pooling_factor:g}",
                 p.sharding.value + (f" x{len(p.ranks)}" if p.sharding.value == "column_wise" else ""),
                 p.kernel.value + (f" ({100 * p.cache_ratio:.0f}% cached)" if p.cache_ratio else ""),
                 _ranks_text(p.ranks, plan.world_size), f"{100 * p.hot_row_fraction:g}%" if p.hot_row_fraction else "",
                 f"{cost.table_s[p.table] * 1e3:.4f}"] for p in plan.placements]))
    print()
    totals = cost.rank_total_s
    order = list(np.argsort(-totals, kind="stable"))
    shown = order[: args.ranks]
    comm = sum(cost.comm_s.values())
    print(grid(["rank", "shards", "HBM", "fwd ms", "bwd ms", "comm ms", "sum ms"],
               [[str(r), str(sum(r in p.ranks for p in plan.placements)), fmt_bytes(float(cost.hbm_bytes[r])),
                 f"{cost.fwd_lookup_s[r] * 1e3:.4f}", f"{cost.bwd_lookup_s[r] * 1e3:.4f}", f"{comm[r] * 1e3:.4f}",
                 f"{totals[r] * 1e3:.4f}"] for r in shown]))
    if len(order) > len(shown):
        print(f"({len(order) - len(shown)} less loaded ranks not shown; --ranks N shows more)")
    if compare:
        print()
        print(grid(["plan", "paraplan model: step ms", "TorchRec model: slowest rank ms"],
                   [[k, f"{v['paraplan_step_s'] * 1e3:.4f}", f"{v['torchrec_max_rank_s'] * 1e3:.4f}"] for k, v in compare.items()]))
    if args.export_torchrec:
        print(f"wrote {args.export_torchrec}: TorchRec ParameterConstraints per table (+ ranks)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="paraplan", description="Predict, search and rank parallel training plans.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    s = sub.add_parser("search", help="rank every valid plan that fits (default: Llama 3 70B on 64×8 H100)")
    _add_specs(s)
    _add_plan(s, required=False)
    _add_engine(s)
    # every plan shown is simulated (~10 ms each, more with deep pipelines): a bound keeps a
    # mistyped --top from running for hours
    s.add_argument("--top", type=_int_up_to(MAX_TOP), default=10,
                   help=f"plans to show (default 10; at most {MAX_TOP:,}: each shown plan is simulated)")
    _add_whatif(s, "the best plan's step time, and the fastest plan if it is worse")
    s.set_defaults(func=cmd_search)
    c = sub.add_parser("scale", help="the best plan at each GPU count of a sweep: throughput, scaling efficiency, "
                                     "time and cost to train the budget (fixed global batch); --cluster a,b "
                                     "sweeps several clusters and names the soonest and the cheapest across them")
    _add_specs(c)
    _add_plan(c, required=False)
    _add_engine(c)
    c.add_argument("--counts", default=",".join(map(str, DEFAULT_SCALE_COUNTS)),
                   help="GPU counts to search, comma-separated (default "
                        + ",".join(map(str, DEFAULT_SCALE_COUNTS)) + "; --gpus is ignored)")
    c.add_argument("--plot", default=None, help="also draw the sweep (PNG, or the format of the extension)")
    c.set_defaults(func=cmd_scale)
    e = sub.add_parser("estimate", help="predict one plan with a full breakdown")
    _add_specs(e)
    _add_plan(e, required=True)
    _add_engine(e)
    _add_whatif(e, "the plan's step time")
    e.set_defaults(func=cmd_estimate)
    t = sub.add_parser("trace", help="write the simulated step as a Chrome/Perfetto trace JSON")
    _add_specs(t)
    _add_plan(t, required=True)
    _add_engine(t)
    t.add_argument("-o", "--output", default="paraplan-trace.json", help="output file, or - for stdout")
    t.add_argument("--max-microbatches", type=_positive_int, default=None,
                   help="trace about this many micro-batches of the step (rounded down to a multiple of PP, "
                        f"at least 2·PP; default: as many as keep the trace near {TRACE_LAYER_EVENTS:,} layer "
                        "events); the step time stays the full step's")
    t.set_defaults(func=cmd_trace)
    v = sub.add_parser("validate", help="predict every row of published-measurements CSVs")
    v.add_argument("files", nargs="+", metavar="FILE")
    v.add_argument("--cv", choices=["source"], default=None,
                   help="source: fit each GPU's knobs on every source but one and predict that one, for every "
                        "source; report in-sample and out-of-source error (training files)")
    v.add_argument("--json", action="store_true")
    v.add_argument("--verbose", action="store_true", help="show the chosen values of blank knobs")
    v.add_argument("--hardware", default=None, type=_non_empty, help="predict every row on this profile TOML or cluster preset "
                                                     "(e.g. from paraplan calibrate) instead of the row's GPU")
    v.set_defaults(func=cmd_validate)
    m = sub.add_parser("embeddings", help="shard embedding tables (default: Criteo-1TB on 64 H100)")
    m.add_argument("--tables", default="criteo-1tb", help="criteo-1tb, dlrm-skewed or a CSV (name,num_rows,dim[,pooling_factor])")
    m.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"cluster preset or TOML (default {DEFAULT_CLUSTER})")
    m.add_argument("--gpus", type=_positive_int, default=64, help="number of GPUs (default 64)")
    m.add_argument("--batch-per-rank", type=_positive_int, default=512, help="samples per GPU (default 512)")
    m.add_argument("--optimizer", default="rowwise_adagrad", help="rowwise_adagrad or adam (default rowwise_adagrad)")
    m.add_argument("--profile", type=_non_empty, help="a locality profile TOML applied to every table (dlrm-2022 is built in)")
    m.add_argument("--hot-rows", action="store_true", help="replicate each table's hottest rows on every GPU (FlexShard)")
    m.add_argument("--dedup", action="store_true", help="deduplicate ids within the batch before the all-to-all (RecD)")
    m.add_argument("--hbm-reserve", type=_number, default=0.15, help="HBM share kept for the dense model (default 0.15)")
    m.add_argument("--ranks", type=_positive_int, default=16, help="ranks to show, slowest first (default 16)")
    m.add_argument("--export-torchrec", metavar="FILE", help="write the plan as TorchRec ParameterConstraints (JSON)")
    m.add_argument("--compare-torchrec", action="store_true", help="also run TorchRec's planner; price both plans with both models")
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_embeddings)
    from .validate.cli import add_fit_parser
    add_fit_parser(sub)
    from .inference.cli import add_parser as add_serve
    add_serve(sub)
    r = sub.add_parser("presets", help="list model, GPU and cluster presets")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_presets)
    from .export.cli import add_parser as add_export  # no torch at import
    add_export(sub)
    from .calibrate.cli import add_parser as add_calibrate  # torch only when benchmarks run
    add_calibrate(sub)
    from .run.cli import add_parser as add_run_and_compare  # no torch at import (run/cli.py)
    add_run_and_compare(sub)
    return p


def _version() -> str:
    """The installed distribution's version (package metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("paraplan")
    except PackageNotFoundError:
        from . import __version__
        return __version__


def _commands(parser: argparse.ArgumentParser) -> dict:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _parse(parser: argparse.ArgumentParser, argv: list[str], implied_search: bool = False):
    """parse_args, except that an option the subcommand does not take is the subcommand's
    error (`see paraplan serve --help`), not the top-level parser's; with `implied_search`
    (options before any command, which are search's), the top-level one, naming the commands."""
    args, extra = parser.parse_known_args(argv)
    if extra and implied_search:
        parser.error(f"unrecognized arguments: {' '.join(extra)}; options before any command are `paraplan "
                     f"search`'s, else write a command first: {', '.join(_commands(parser))}")
    if extra:
        sub = _commands(parser).get(getattr(args, "command", None) or "", parser)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


# Exit codes (documented in the README): 0 done; 1 validate predicted no row; 2 a user's
# mistake (one line on stderr); 74 the output could not be written (sysexits' EX_IOERR: a full
# disk, a closed terminal); 130 Ctrl-C; 143 SIGTERM (the shells' 128 + signal number).
EXIT_OUTPUT_FAILED = 74
# errors of writing stdout itself (a full disk, a vanished terminal), not of a file we read
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF, errno.ENXIO, errno.EROFS}


def _command_error(parser: argparse.ArgumentParser, first: str) -> str | None:
    """The one-line error for a first argument that is not a command, or None when it is one."""
    commands = list(_commands(parser))
    if first in commands or first.startswith("-"):  # options before any command are search's
        return None
    listed = ", ".join(commands)
    close = difflib.get_close_matches(first, commands, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown command {shown(first)}; {hint}commands: {listed}"


def _on_sigterm(signum, frame):
    raise Terminated  # a KeyboardInterrupt: temporary files are removed on the way out


def _quiet_stdout() -> None:
    """Point the process's stdout at /dev/null after it failed, so that the interpreter's last
    flush of what is still buffered does not print a second error."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):  # not a real descriptor (a test's capture)
        pass


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a character the terminal cannot show becomes '?'
        try:
            stream.reconfigure(errors="replace")
        except (AttributeError, ValueError, OSError):
            pass
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    previous = None
    try:
        if not argv:
            parser.print_help()
            sys.stdout.flush()
            return 0
        bad = _command_error(parser, argv[0])
        if bad:
            parser.error(bad)
        implied_search = argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")
        if implied_search:
            argv = ["search"] + argv  # options before any command are search's (the default command)
        args = _parse(parser, argv, implied_search)
        try:
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # not the main thread (an embedding program keeps its own handler)
            pass
        code = args.func(args)
        sys.stdout.flush()  # a full disk shows here, while it can still be said in one line
        return code
    except ParaplanError as exc:
        sys.stderr.write(f"paraplan: error: {exc}\n")
        return 2
    except BrokenPipeError:  # the reader stopped (`| head`): not an error
        _quiet_stdout()
        return 0
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        _quiet_stdout()
        sys.stderr.write(f"paraplan: error: writing the output failed: {exc.strerror or exc}\n")
        return EXIT_OUTPUT_FAILED
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line; files are written whole or not at all
        # on a terminal the progress bar may hold the line: start a fresh one
        sys.stderr.write(f"{chr(10) if sys.stderr.isatty() else ''}paraplan: "
                         f"{'terminated' if isinstance(exc, Terminated) else 'interrupted'}\n")
        return 143 if isinstance(exc, Terminated) else 130  # the shells' 128 + signal number
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    raise SystemExit(main())
