"""paraplan from Python: the commands as functions that take preset names or spec objects and
return the typed results the CLI prints (not text).

    >>> import paraplan
    >>> res = paraplan.search("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch_size=64, top=3)
    >>> best = res.ranked[0]
    >>> best.plan.tp * best.plan.pp * best.plan.dp * best.plan.cp
    8
    >>> best.fits and best.step_time_s > 0
    True
    >>> est = paraplan.estimate("llama3-8b", "dgx-h100", gpus=8, seq_len=4096, global_batch_size=64,
    ...                         tp=2, recompute="selective", zero=1)
    >>> est.plan.describe()
    'TP2 PP1 DP4 mb1 SP rc:selective zero1 attn:flash3'
    >>> est.step_time_s == paraplan.estimate("llama3-8b", gpus=8, seq_len=4096, global_batch_size=64,
    ...                                      plan=est.plan).step_time_s
    True
    >>> served = paraplan.serve("llama3-8b", gpus=8, rate_rps=4.0, num_requests=50)
    >>> served.ranked[0].plan.tp >= 1
    True

Every argument has the CLI's default: `search()` is `paraplan search`. A model is a preset
name, a model TOML, a Hugging Face config.json or a ModelSpec; a cluster a preset name, a
cluster TOML or a ClusterSpec (resized to `gpus` when given). Workload fields (specs/workload.py
Workload: seq_len, global_batch_size, precision, optimizer, token_budget, ...) are keyword
arguments, or `workload=` a Workload. A plan is keyword arguments (Plan's fields: tp, pp, dp,
schedule, recompute, zero, ...; enums may be given by name; recompute_ops="qkv,act", or a list of
op names, is a searched recomputation set and implies recompute="set") or `plan=` a Plan. `engine=`
("torchtitan", "megatron", "deepspeed") predicts with that engine's policy and, in a search,
ranks only the plans it runs. Mistakes raise paraplan.errors.ParaplanError (one line).
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from enum import Enum
from typing import Any

from .errors import SpecError

DEFAULT_MODEL = "llama3-70b"   # as the CLI (cli/args.py)
DEFAULT_CLUSTER = "dgx-h100"
DEFAULT_GPUS = 512
DEFAULT_SEQ = 8192
SEARCH_PINS = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "micro_batch_size")


def _model(model: Any):
    from .specs.catalog import load_model
    from .specs.model import ModelSpec
    return model if isinstance(model, ModelSpec) else load_model(model)


def _cluster(cluster: Any, gpus: int | None):
    from .specs.catalog import load_cluster
    from .specs.hardware import ClusterSpec
    if isinstance(cluster, ClusterSpec):
        return cluster if gpus is None or gpus == cluster.num_gpus else cluster.with_num_gpus(gpus)
    return load_cluster(os.fspath(cluster), num_gpus=gpus)


def _split(kwargs: dict, *groups: tuple[str, ...]) -> list[dict]:
    """`kwargs` split by the names of each group; a name in none is a one-line error."""
    out: list[dict] = [{} for _ in groups]
    for key, value in kwargs.items():
        i = next((i for i, names in enumerate(groups) if key in names), None)
        if i is None:
            allowed = ", ".join(sorted(n for names in groups for n in names))
            raise SpecError("api", key, value, f"an argument of this function is one of: {allowed}")
        out[i][key] = value
    return out


def _names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _workload(workload: Any, given: dict):
    """The Workload given, or one of the CLI's defaults with the fields given changed."""
    from .cli.args import default_batch
    from .specs.workload import Optimizer, Workload, parse_fp8_recipe, parse_precision
    if workload is not None:
        return replace(workload, **given) if given else workload
    kw = dict(given)
    kw.setdefault("seq_len", DEFAULT_SEQ)
    kw.setdefault("global_batch_size", default_batch(kw["seq_len"]))
    if isinstance(kw.get("precision"), str):
        kw["precision"] = parse_precision(kw["precision"], "precision")
    if isinstance(kw.get("optimizer"), str):
        kw["optimizer"] = Optimizer(kw["optimizer"])
    if isinstance(kw.get("fp8_recipe"), str):
        kw["fp8_recipe"] = parse_fp8_recipe(kw["fp8_recipe"])
    return Workload(**kw)


def _engine_rules(engine: Any, model, workload, no_compile: bool = False):
    """The search's view of `engine` (search/policy.py EngineRules), its rules checked; None for none."""
    if engine is None:
        return None
    from .export.registry import exporter
    from .search.policy import EngineRules
    from .specs.engine import Engine, check_model, check_optimizer
    engine = Engine(engine)
    check_optimizer(engine, workload)
    mod = exporter(engine)
    check_model(mod.SUPPORT, model)
    return EngineRules(mod.SUPPORT.without_compile() if no_compile else mod.SUPPORT, mod.check)


def search(model: Any = DEFAULT_MODEL, cluster: Any = DEFAULT_CLUSTER, *, gpus: int | None = DEFAULT_GPUS,
           workload: Any = None, engine: Any = None, no_compile: bool = False, top: int = 10, limits: Any = None,
           **kwargs: Any):
    """Rank every valid plan that fits (search/planner.py SearchResult, best first). Plan axes
    among SEARCH_PINS given as keywords are pinned; `limits` (plan/space.py SpaceLimits)
    bounds the rest."""
    from .plan.space import SpaceLimits
    from .search.planner import SearchResult
    from .search.policy import bounded_space, ranked_search
    from .specs.workload import Workload
    pins, given = _split(kwargs, SEARCH_PINS, _names(Workload))
    spec_model, spec_cluster = _model(model), _cluster(cluster, gpus)
    wl = _workload(workload, given)
    rules = _engine_rules(engine, spec_model, wl, no_compile)
    fixed, space = bounded_space(rules, pins, limits if limits is not None else SpaceLimits())
    res, ranked = ranked_search(spec_model, spec_cluster, wl, top, fixed=fixed, limits=space, engine=rules)
    return SearchResult(ranked=tuple(ranked[:top]), num_candidates=res.num_candidates, num_valid=res.num_valid,
                        num_fit=res.num_fit, elapsed_s=res.elapsed_s, rejected_examples=res.rejected_examples)


def search_mixed(model: Any, cluster: Any, *, workload: Any = None, top: int = 10, **kwargs: Any):
    """Rank pipelines over a mixed cluster (search/mixed.py MixedSearchResult, best first):
    `cluster` a mixed-cluster TOML ([[group]] tables) or a MixedCluster; workload fields as
    keywords. Each ranked MixedEstimate has its stages, hops and step (cost/mixed.py)."""
    from .search.mixed import search_mixed as search_plans
    from .specs.catalog import load_mixed_cluster
    from .specs.mixed import MixedCluster
    from .specs.workload import Workload
    (given,) = _split(kwargs, _names(Workload))
    mixed = cluster if isinstance(cluster, MixedCluster) else load_mixed_cluster(cluster)
    return search_plans(_model(model), mixed, _workload(workload, given), top_k=top)


def _plan(given: dict, cluster):
    """A Plan of keyword arguments, with the CLI's defaults: DP the GPUs left, sequence
    parallelism with TP, the fastest attention kernel the GPU runs, interleaving with VP > 1."""
    from .plan import axes
    from .plan.plan import Plan, make_plan
    kinds = {"schedule": axes.Schedule, "recompute": axes.Recompute, "zero": axes.ZeroStage,
             "attention": axes.AttentionKernel, "cp_comm_type": axes.CPCommType, "rank_order": axes.RankOrder,
             "grad_compression": axes.GradCompression}
    kw = {k: (kinds[k].parse(str(v), k) if k in kinds and not isinstance(v, Enum) else v) for k, v in given.items()}
    if "recompute_ops" in kw:  # a set of ops ("qkv,act", or names in a list) implies recompute="set"
        if not isinstance(kw["recompute_ops"], axes.RecomputeOps):
            kw["recompute_ops"] = axes.RecomputeOps.parse(kw["recompute_ops"], "recompute_ops")
        kw.setdefault("recompute", axes.Recompute.SET)
    switches = {f.name for f in fields(Plan) if isinstance(f.default, bool)}
    for k in switches & set(kw):
        if isinstance(kw[k], str) or kw[k] not in (True, False):
            raise SpecError("api", k, kw[k], "True or False")
    tp, pp, cp, vp = (kw.get(k, 1) for k in ("tp", "pp", "cp", "vp"))
    if "dp" not in kw:
        if cluster.num_gpus % (tp * pp * cp):
            raise SpecError("plan", "tp×pp×cp", tp * pp * cp, f"must divide the {cluster.num_gpus} GPUs")
        kw["dp"] = cluster.num_gpus // (tp * pp * cp)
    kw.setdefault("sequence_parallel", tp > 1)
    kw.setdefault("attention", cluster.gpu.attention_kernels[-1])
    kw.setdefault("schedule", axes.Schedule.INTERLEAVED_1F1B if vp > 1 else axes.Schedule.ONE_F_ONE_B)
    assert set(kw) <= set(_names(Plan))
    return make_plan(**kw)


def estimate(model: Any = DEFAULT_MODEL, cluster: Any = DEFAULT_CLUSTER, *, gpus: int | None = DEFAULT_GPUS,
             plan: Any = None, workload: Any = None, engine: Any = None, no_compile: bool = False, **kwargs: Any):
    """Predict one plan (cost/estimate.py Estimate): `plan`, or the Plan fields given, or,
    with neither, the fastest plan that fits (within the engine's bounds)."""
    from .cost.estimate import estimate as estimate_plan
    from .plan.plan import Plan
    from .search.planner import search as search_plans
    from .search.policy import best_exportable
    from .specs.workload import Workload
    plan_fields, given = _split(kwargs, _names(Plan), _names(Workload))
    if plan is not None and plan_fields:
        raise SpecError("api", "plan", plan.describe(), f"a Plan or its fields ({', '.join(plan_fields)}), not both")
    spec_model, spec_cluster = _model(model), _cluster(cluster, gpus)
    wl = _workload(workload, given)
    rules = _engine_rules(engine, spec_model, wl, no_compile)
    if plan is None and not plan_fields:
        if rules is None:
            return search_plans(spec_model, spec_cluster, wl, top_k=1).ranked[0]
        return best_exportable(spec_model, spec_cluster, wl, rules.support, rules.check)
    chosen = plan if plan is not None else _plan(plan_fields, spec_cluster)
    if rules is not None:
        chosen = rules.support.adapt(rules.support.with_plan_default_zero(chosen, "zero" in plan_fields or
                                                                          plan is not None))
        rules.check(chosen, spec_model, wl)
    return estimate_plan(spec_model, spec_cluster, wl, chosen)


def serve(model: Any = DEFAULT_MODEL, cluster: Any = DEFAULT_CLUSTER, *, gpus: int | None = 8,
          traffic: Any = None, limits: Any = None, tp: int | None = None, pp: int | None = None,
          **kwargs: Any):
    """Plan a serving deployment (inference/planner.py ServeResult, best first). Traffic
    fields (prompt_tokens, output_tokens, rate_rps, num_requests, ttft_target_s, tpot_target_s)
    are keywords with the CLI's defaults, or `traffic=` a Traffic; `limits` an EngineLimits."""
    from .inference.deploy import EngineLimits, Traffic
    from .inference.planner import candidate_plans, plan_serving
    (given,) = _split(kwargs, _names(Traffic))
    spec_model, spec_cluster = _model(model), _cluster(cluster, gpus)
    if traffic is None:
        traffic = Traffic(**{"prompt_tokens": 1024, "output_tokens": 256, "rate_rps": 8.0, "num_requests": 400,
                             "ttft_target_s": 1.0, "tpot_target_s": 0.05, **given})
    elif given:
        traffic = replace(traffic, **given)
    if limits is None:  # as the CLI: a whole prompt fits one iteration
        limits = EngineLimits(max_num_tokens=max(EngineLimits.max_num_tokens, traffic.prompt_tokens))
    plans = [p for p in candidate_plans(spec_model, spec_cluster, spec_cluster.num_gpus)
             if (tp is None or p.tp == tp) and (pp is None or p.pp == pp)]
    if not plans:
        raise SpecError("serve", "tp/pp", f"{tp}/{pp}", f"no deployment of {spec_cluster.num_gpus} GPUs has them")
    return plan_serving(spec_model, spec_cluster, traffic, limits, plans=plans, replica_pinned=bool(tp or pp))


def embeddings(tables: str = "criteo-1tb", cluster: Any = DEFAULT_CLUSTER, *, gpus: int | None = 64,
               batch_per_rank: int = 512, optimizer: str = "rowwise_adagrad", hot_rows: bool = False,
               dedup: bool = False, hbm_reserve_fraction: float = 0.15):
    """Shard embedding tables over the GPUs (embeddings/search.py result: its plan and cost)."""
    from .embeddings.search import plan_embeddings
    from .embeddings.tables import Optimizer, load_embedding_workload
    wl = load_embedding_workload(tables, batch_per_rank, Optimizer(optimizer))
    return plan_embeddings(wl, _cluster(cluster, gpus), hot_rows=hot_rows, dedup=dedup,
                           hbm_reserve_fraction=hbm_reserve_fraction)


def validate(*files: str | os.PathLike, hardware: str | None = None) -> dict:
    """Predict every row of published-measurement CSVs: {"rows": [...], "summary": {...}}, as
    `paraplan validate --json` prints it."""
    from .validate.inference import is_inference_file, validate_inference_file
    from .validate.rows import summarize
    from .validate.training import validate_file
    kw = {} if hardware is None else {"hardware": hardware}
    results = [validate_inference_file(os.fspath(f)) if is_inference_file(os.fspath(f))
               else validate_file(os.fspath(f), **kw) for f in files]
    if len(results) == 1:
        return results[0]
    rows = [r for res in results for r in res["rows"]]
    return {"rows": rows, "summary": summarize(rows)}
