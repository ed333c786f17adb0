"""`paraplan serve`: plan a serving deployment (default: Llama 3 70B on 8 H100)."""

from __future__ import annotations

import argparse
import sys

from ..argtypes import percent_below_100, positive_float, positive_int
from ..search.whatif import DEFAULT_CHANGE
from ..report.legend import legend_block
from ..report.strict_json import json_text

DEFAULT_MODEL = "llama3-70b"
DEFAULT_CLUSTER = "dgx-h100"
DEFAULT_GPUS = 8
# Bounds past which a run takes minutes or prints 300-digit figures: 100,000 requests is 250
# times the default's; 1e9 requests/s is more than any fleet serves.
MAX_REQUESTS = 100_000
MAX_RATE_RPS = 1e9


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="plan a serving deployment (default: Llama 3 70B on 8 H100)",
                       epilog=legend_block(serving=True), formatter_class=argparse.RawDescriptionHelpFormatter)
    g = s.add_argument_group("model and hardware")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"preset, model TOML or HF config.json (default {DEFAULT_MODEL})")
    g.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"cluster preset or TOML (default {DEFAULT_CLUSTER})")
    g.add_argument("--gpus", type=positive_int, default=DEFAULT_GPUS, help=f"GPUs available (default {DEFAULT_GPUS})")
    t = s.add_argument_group("traffic")
    t.add_argument("--prompt", type=positive_int, default=1024, help="prompt tokens per request (default 1024)")
    t.add_argument("--output", type=positive_int, default=256, help="output tokens per request (default 256)")
    load = t.add_mutually_exclusive_group()
    load.add_argument("--rate", type=positive_float, default=8.0,
                      help=f"requests/s, Poisson (default 8, at most {MAX_RATE_RPS:g})")
    load.add_argument("--max-load", action="store_true", help="no rate: every request queued at once")
    t.add_argument("--requests", type=positive_int, default=400,
                   help=f"requests to simulate (default 400, at most {MAX_REQUESTS:,})")
    t.add_argument("--ttft-ms", type=positive_float, default=1000.0, help="p90 time-to-first-token target (default 1000)")
    t.add_argument("--tpot-ms", type=positive_float, default=50.0, help="mean time-per-output-token target (default 50)")
    p = s.add_argument_group("pin the deployment (others are searched)")
    p.add_argument("--tp", type=positive_int)
    p.add_argument("--pp", type=positive_int)
    p.add_argument("--ep", type=positive_int, help="MoE: experts split over ep of the tp GPUs")
    p.add_argument("--weights", help="bf16, fp16, fp8, int8 or int4")
    p.add_argument("--kv", help="KV-cache dtype: bf16, fp16, fp8, int8 or int4")
    p.add_argument("--kv-by-batch", action="store_true", help="shard the KV cache over the batch, not heads (Pope et al.)")
    p.add_argument("--expert-cache", type=positive_float, default=1.0,
                   help="MoE: share of experts kept in HBM, the rest in host memory (default 1)")
    p.add_argument("--expert-hit-rate", type=positive_float, default=None,
                   help="MoE: share of routed tokens whose expert is cached (default: --expert-cache)")
    from .deploy import EngineLimits
    e = s.add_argument_group("engine")
    e.add_argument("--max-batch", type=positive_int, default=2048, help="sequences per iteration (default 2048)")
    e.add_argument("--max-num-tokens", type=positive_int, default=None,
                   help=f"tokens per iteration (default {EngineLimits.max_num_tokens}, or more where the prompt "
                        "(without --chunked-prefill) or --max-batch (with it) needs more)")
    e.add_argument("--chunked-prefill", action="store_true", help="split prompts to fill every iteration (Sarathi)")
    e.add_argument("--sliding-window-kv", action="store_true",
                   help="the engine honours the model's sliding windows: a windowed layer attends to and keeps only "
                        "its last w tokens (vLLM's default; TensorRT-LLM with max_attention_window_size)")
    s.add_argument("--top", type=positive_int, default=10, help="plans to show (default 10)")
    s.add_argument("--whatif", type=percent_below_100, nargs="?", const=100.0 * DEFAULT_CHANGE, default=None,
                   metavar="PCT",
                   help="also re-estimate the best deployment with each hardware assumption (compute rate, "
                        "attention kernels, HBM and link bandwidth, launch overhead) PCT%% worse and better "
                        f"(default {100 * DEFAULT_CHANGE:g})")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_serve)


def _plans(args, model, cluster):
    from dataclasses import replace
    from .deploy import AttentionSharding, StoreDtype
    from .planner import candidate_plans
    from ..errors import SpecError
    if not model.is_moe:
        for flag, value, default in (("--ep", args.ep, None), ("--expert-cache", args.expert_cache, 1.0),
                                     ("--expert-hit-rate", args.expert_hit_rate, None)):
            if value not in (None, default):
                raise SpecError("serve", flag, value, f"applies to mixture-of-experts models only; {model.name} is dense")
    if args.sliding_window_kv and not (model.sliding_window and model.num_sliding_window_layers):
        raise SpecError("serve", "--sliding-window-kv", True,
                        f"applies to models with sliding-window layers only; {model.name} has none")
    plans = candidate_plans(model, cluster, cluster.num_gpus)
    w = StoreDtype.parse(args.weights, "weights") if args.weights is not None else None
    kv = StoreDtype.parse(args.kv, "kv") if args.kv is not None else None
    out = []
    for p in plans:
        if (args.tp and p.tp != args.tp) or (args.pp and p.pp != args.pp) or (args.ep and p.ep != args.ep):
            continue
        if w is not None:
            p = replace(p, weight_dtype=w)
        if kv is not None:
            p = replace(p, kv_dtype=kv)
        if args.kv_by_batch:
            p = replace(p, attention_sharding=AttentionSharding.BATCH)
        if args.expert_cache != 1.0 or args.expert_hit_rate is not None:
            p = replace(p, expert_cache_fraction=args.expert_cache, expert_hit_rate=args.expert_hit_rate)
        if p not in out:
            out.append(p)
    if not out:
        # name the pin that leaves nothing, with the values it can take given the other pins
        pins = {"tp": args.tp, "pp": args.pp, "ep": args.ep}
        # a value no plan has at all is the culprit before any pin it leaves without partners
        order = sorted((k for k, v in pins.items() if v),
                       key=lambda k: any(getattr(p, k) == pins[k] for p in plans))
        for key in order:
            value = pins[key]
            others = [p for p in plans if all(not v or getattr(p, k) == v for k, v in pins.items() if k != key)]
            allowed = sorted({getattr(p, key) for p in others})
            if value not in allowed:
                raise SpecError("serve", f"--{key}", value,
                                f"allowed with the other pins on {cluster.num_gpus} GPUs: "
                                + (", ".join(map(str, allowed)) or "none"))
        raise SpecError("serve", "--tp/--pp/--ep", f"{args.tp}/{args.pp}/{args.ep}",
                        f"tp must be a power of two <= {min(cluster.gpus_per_node, cluster.num_gpus)} and tp×pp <= --gpus")
    return out


def _ms(x: float) -> str:
    return f"{1e3 * x:.1f}"


def cmd_serve(args) -> int:
    from ..specs.catalog import load_cluster, load_model
    from .batching import has_tpot
    from .deploy import EngineLimits, Traffic
    from .planner import missed_targets_advice, plan_serving
    from ..errors import SpecError
    if args.requests > MAX_REQUESTS:
        raise SpecError("serve", "--requests", args.requests, f"at most {MAX_REQUESTS:,} requests are simulated")
    if not args.max_load and args.rate > MAX_RATE_RPS:
        raise SpecError("serve", "--rate", args.rate, f"at most {MAX_RATE_RPS:g} requests/s")
    model = load_model(args.model)
    cluster = load_cluster(args.cluster, num_gpus=args.gpus)
    traffic = Traffic(prompt_tokens=args.prompt, output_tokens=args.output,
                      rate_rps=None if args.max_load else args.rate, num_requests=args.requests,
                      ttft_target_s=args.ttft_ms / 1e3, tpot_target_s=args.tpot_ms / 1e3)
    # at least: a whole prompt without chunking (one iteration prefills it); with chunking,
    # vLLM's scheduler rule max_num_batched_tokens >= max_num_seqs (every running sequence gets
    # at least its decode token in an iteration)
    floor, why = ((args.max_batch, f"--max-batch ({args.max_batch}) with --chunked-prefill") if args.chunked_prefill
                  else (args.prompt, f"the prompt ({args.prompt} tokens) without --chunked-prefill: a whole prompt "
                                     "is prefilled in one iteration"))
    # unset: TensorRT-LLM's default, raised to that floor (as building the engine for it must)
    max_num_tokens = args.max_num_tokens or max(EngineLimits.max_num_tokens, floor)
    if max_num_tokens < floor:
        raise SpecError("serve", "--max-num-tokens", max_num_tokens, f"must be >= {why}")
    limits = EngineLimits(max_batch=args.max_batch, max_num_tokens=max_num_tokens,
                          chunked_prefill=args.chunked_prefill, sliding_window_kv=args.sliding_window_kv)
    plans = _plans(args, model, cluster)
    from ..cli.args import show_progress
    show = not args.json and sys.stderr.isatty()
    res = plan_serving(model, cluster, traffic, limits, plans=plans, progress=show_progress if show else None,
                       replica_pinned=bool(args.tp or args.pp))
    wi = None
    if args.whatif is not None:
        from .whatif import serve_what_if
        wi = serve_what_if(model, cluster, res.ranked[0], traffic, limits, args.whatif / 100.0)
    if args.json:
        from ..report.whatif import serve_whatif_dict
        print(json_text({**_json(res, args.top, traffic.ttft_target_s, traffic.tpot_target_s,
                                  has_tpot(traffic.output_tokens)),
                          "engine_limits": {"max_batch": limits.max_batch, "max_num_tokens": limits.max_num_tokens,
                                            "chunked_prefill": limits.chunked_prefill},
                          "missed_targets": missed_targets_advice(res, traffic, cluster) or None,
                          **({"whatif": serve_whatif_dict(wi, has_tpot(traffic.output_tokens))} if wi else {})},
                         indent=1))
        return 0
    _print_serving(args, model, cluster, traffic, limits, res, wi)
    return 0

def _print_serving(args, model, cluster, traffic, limits, res, wi) -> None:
    """The text output of `paraplan serve`: the ranked deployments, the best at the rate, the
    Pareto frontier."""
    from ..report.legend import terms_used
    from ..report.table import grid, with_plans
    from ..report.width import terminal_width, wrap
    from .batching import has_tpot
    from .planner import missed_targets_advice
    width = terminal_width()
    _print_header(args, model, cluster, traffic, limits, width)
    ranked = res.ranked[:args.top]
    print(_ranked_table(ranked, model, traffic, limits, width))
    print(wrap("max seqs: requests whose whole context fits the KV cache at once (capped by --max-batch). "
               "TTFT₁/TPOT₁: a lone request.\nreq/s in SLO: highest Poisson rate one replica serves within the "
               "targets.", width))
    _print_best(res.ranked[0], traffic, cluster, width)
    missed = missed_targets_advice(res, traffic, cluster)
    if missed:
        print("\n" + wrap(missed, width))
    print("\n" + wrap("latency–throughput Pareto frontier (TPOT of a lone request vs output tokens/s per GPU at "
                      "maximum load):", width))
    pareto = [e.plan.describe() for e in res.pareto]
    tpot = _tpot_cell(traffic)
    table = grid(["deployment", "TPOT₁ ms", "max out tok/s/GPU"],
                 [[d, tpot(e.tpot_floor_s), f"{e.max_tokens_per_s_per_gpu:,.0f}"] for d, e in zip(pareto, res.pareto)],
                 align="lrr", width=width, wrap_col=0)
    # the legend under it names only what the ranked table's did not
    print(with_plans(table, pareto, "", width, already=terms_used([e.plan.describe() for e in ranked])))
    if res.rejected:
        print("\n" + wrap(f"{len(res.rejected)} deployments do not fit, e.g. {res.rejected[0][1]}", width, indent=2))
    if wi:
        from ..report.whatif import serve_whatif_table
        print("\n" + serve_whatif_table(wi, has_tpot(traffic.output_tokens), width))


def _print_header(args, model, cluster, traffic, limits, width: int) -> None:
    """The model, hardware, traffic, targets and engine limits; the sliding-window note."""
    from ..report.width import wrap
    from ..units import fmt_count
    load = "maximum load" if traffic.rate_rps is None else f"{traffic.rate_rps:g} req/s (Poisson)"
    print(wrap(f"{model.name} ({fmt_count(model.num_params)} params) on up to {cluster.num_gpus} × {cluster.gpu.name}; "
               f"{traffic.prompt_tokens} prompt + {traffic.output_tokens} output tokens at {load}; targets: "
               f"p90 TTFT ≤ {args.ttft_ms:g} ms, mean TPOT ≤ {args.tpot_ms:g} ms; engine: {limits.max_batch:,} "
               f"sequences, {limits.max_num_tokens:,} tokens per iteration"
               f"{', chunked prefill' if limits.chunked_prefill else ''}", width, indent=2))
    if model.sliding_window and model.num_sliding_window_layers:
        print(wrap(f"{model.num_sliding_window_layers} of {model.num_layers} layers attend to a "
                   f"{model.sliding_window}-token "
                   + ("window, and the engine keeps only that in their KV cache (--sliding-window-kv)"
                      if args.sliding_window_kv else
                      "window; served as full attention, as TensorRT-LLM does by default (--sliding-window-kv: "
                      "the engine keeps only the window)"), width, indent=2))


def _tpot_cell(traffic):
    """The TPOT cell of a table: ms, or "-" where a request has no second token."""
    from .batching import has_tpot
    return lambda x: _ms(x) if has_tpot(traffic.output_tokens) else "-"


def _ranked_table(ranked, model, traffic, limits, width: int) -> str:
    """The ranked deployments, one row each (two-line headers), the legend under them."""
    from ..report.table import grid, with_plans
    from ..units import GIB, fmt_count
    from .planner import max_sequences
    tpot = _tpot_cell(traffic)
    plans = [e.plan.describe() for e in ranked]
    rows = [[d, str(e.plan.gpus_per_replica), f"{e.memory.weights_bytes / GIB:.1f}",
             fmt_count(e.memory.kv_capacity_tokens), str(max_sequences(model, e.memory, traffic, limits)),
             _ms(e.ttft_floor_s), tpot(e.tpot_floor_s), f"{e.max_tokens_per_s_per_gpu:,.0f}",
             f"{e.slo_rate_rps:.2f}" if e.slo_rate_rps else "misses",
             "-" if e.gpus_needed is None else str(e.gpus_needed), f"{e.usd_per_m_output_tokens:.2f}"]
            for d, e in zip(plans, ranked)]
    table = grid(["deployment\n(one replica)", "GPUs", "weights\nGiB/GPU", "KV\ntokens", "max\nseqs", "TTFT₁\nms",
                  "TPOT₁\nms", "max out\ntok/s/GPU", "req/s\nin SLO", "GPUs for\nrate", "$/M\nout tok"], rows,
                 align="lrrrrrrrrrr", width=width, wrap_col=0)
    return with_plans(table, plans, "", width)


def _print_best(best, traffic, cluster, width: int) -> None:
    """The best deployment's latencies and goodput at the offered rate (none at maximum load)."""
    from ..report.table import grid
    from ..report.width import wrap
    from .planner import EXTRA_REPLICAS, meets_targets
    if best.at_rate is not None:
        r = best.at_rate
        gpus = f"{best.gpus_needed} GPU" + ("s" if best.gpus_needed != 1 else "")
        print(f"\nbest: {best.replicas_needed} × [{best.plan.describe()}] = {gpus} at "
              f"{traffic.rate_rps:g} req/s:")
        def stats(name: str) -> list[str]:
            values = getattr(r, name)
            if name == "tpot_s" and not r.has_tpot:
                return ["-"] * 4
            return [_ms(r.percentile(name, q)) for q in (50, 90, 99)] + [_ms(values.mean())]
        print(grid(["", "p50", "p90", "p99", "mean"], [
            ["TTFT ms"] + stats("ttft_s"), ["TPOT ms"] + stats("tpot_s"), ["e2e ms"] + stats("e2e_s")], align="lrrrr"))
        reps = best.replicas_needed
        print(wrap(f"goodput (requests within both targets): "
                   f"{reps * r.goodput_rps(traffic.ttft_target_s, traffic.tpot_target_s):.2f} "
                   f"req/s of {reps * r.requests_per_s:.2f} req/s completed (requests / first arrival to last "
                   f"completion; offered {traffic.rate_rps:g} req/s)", width, indent=2))
        if not meets_targets(r, traffic):
            print(wrap(f"misses the targets even at {reps} replicas (the SLO rate's count and {EXTRA_REPLICAS} more): "
                       f"a faster deployment (--tp, --pp, weight dtype) or looser targets would help", width, indent=2))
        if best.gpus_needed and best.gpus_needed > cluster.num_gpus:
            print(f"needs {best.gpus_needed} GPUs, more than the {cluster.num_gpus} given")


def _json(res, top: int, tt: float | None, tp: float | None, has_tpot: bool = True) -> dict:
    """`has_tpot` false (one output token): no second token, TPOT fields null, as the table's "-"."""
    def one(e):
        d = {"plan": e.plan.describe(), "tp": e.plan.tp, "pp": e.plan.pp, "ep": e.plan.ep,
             "weight_dtype": e.plan.weight_dtype.value, "kv_dtype": e.plan.kv_dtype.value,
             "gpus_per_replica": e.plan.gpus_per_replica, "memory_bytes": e.memory.parts(),
             "kv_capacity_tokens": e.memory.kv_capacity_tokens, "host_bytes_per_gpu": e.memory.host_bytes,
             "max_concurrent_requests": e.max_concurrency, "ttft_floor_s": e.ttft_floor_s,
             "tpot_floor_s": e.tpot_floor_s if has_tpot else None, "max_output_tokens_per_s_per_gpu": e.max_tokens_per_s_per_gpu,
             "slo_rate_rps_per_replica": e.slo_rate_rps, "replicas_needed": e.replicas_needed,
             "gpus_needed": e.gpus_needed, "usd_per_m_output_tokens": e.usd_per_m_output_tokens}
        if e.at_rate is not None:
            r = e.at_rate
            d["at_rate"] = {f"{k}_p{q}_s": r.percentile(k + "_s", q) if (has_tpot or k != "tpot") else None
                            for k in ("ttft", "tpot", "e2e") for q in (50, 90, 99)}
            d["at_rate"]["goodput_rps_per_replica"] = r.goodput_rps(tt, tp)
        return d
    return {"ranked": [one(e) for e in res.ranked[:top]], "pareto": [one(e) for e in res.pareto],
            "rejected": [{"plan": p.describe(), "reason": why} for p, why in res.rejected]}
