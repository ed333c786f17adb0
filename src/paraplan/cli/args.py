"""The flags the training commands share and what they make: the model, cluster and
workload (`specs_from_args`), the plan of the flags (`plan_from_args`; cli/choice.py chooses
among it, --plan and the search), the engine (`exporter_from_args`), the search pins
(`search_pins`); the parser that says a user's mistake in one line and exits 2 (`Parser`).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import replace

from ..argtypes import count as _count, degree as _degree, int_up_to as _int_up_to
from ..argtypes import non_empty as _non_empty
from ..argtypes import non_negative_float as _non_negative_float
from ..argtypes import number as _number
from ..argtypes import number_within, percent_below_100 as _percent
from ..argtypes import positive_float as _positive_float
from ..argtypes import MAX_BATCH_TOKENS
from ..errors import SpecError, shorten_words
from ..export.common import Exporter
from ..export.registry import exporter
from ..plan.plan import Plan
from ..plan.space import SpaceLimits
from ..search.policy import EngineRules
from ..specs.engine import Engine, EngineSupport, check_model, check_optimizer
from ..specs.files import MAX_COUNT
from ..specs.hardware import ClusterSpec
from ..specs.model import MAX_LAYERS, MAX_MTP_LAYERS, ModelSpec
from ..specs.workload import (ASSUMED_RESTART_S, LLAMA3_INTERRUPTIONS_PER_GPU_DAY, LLAMA3_STORAGE_BYTES_PER_S,
                              MAX_KG_CO2E_PER_KWH, MAX_PUE, MAX_STORAGE_BYTES_PER_S, MAX_TOKEN_BUDGET,
                              MAX_USD_PER_GPU_HOUR, MIN_STORAGE_BYTES_PER_S, PATTERSON_GPT3_KG_CO2E_PER_KWH,
                              PATTERSON_GPT3_PUE, Workload)
from ..units import GIGA as _GIGA
from .progress import add_quiet, show_progress  # noqa: F401 (show_progress: validate, serve)

DEFAULT_MODEL = "llama3-70b"
DEFAULT_CLUSTER = "dgx-h100"
DEFAULT_GPUS = 512
DEFAULT_SEQ = 8192
DEFAULT_BATCH_TOKENS = 4 * 1024 * 1024
MAX_RANK = 1000  # search --top and --rank: each plan up to it is simulated


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        sys.stderr.write(f"paraplan: error: {shorten_words(message)} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def add_specs(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model, cluster and workload")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"preset name, model TOML or HF config.json (default {DEFAULT_MODEL})")
    g.add_argument("--cluster", default=DEFAULT_CLUSTER, help=f"cluster preset or TOML (default {DEFAULT_CLUSTER})")
    g.add_argument("--hardware", default=None, type=_non_empty, help="a calibrated hardware profile TOML (overrides --cluster)")
    g.add_argument("--gpus", type=_degree, default=DEFAULT_GPUS, help=f"number of GPUs (default {DEFAULT_GPUS})")
    g.add_argument("--power-limit", type=number_within(1.0, 1e5, "W"), default=None, metavar="WATTS",
                   help="each GPU's board power limit (nvidia-smi -pl), below its TDP: compute at the clock the "
                        "limit leaves, (limit/TDP)^(1/3) (CMOS power ~ f^3), energy at the limit (default: the TDP)")
    g.add_argument("--seq", type=_count, default=DEFAULT_SEQ, help=f"sequence length (default {DEFAULT_SEQ})")
    b = g.add_mutually_exclusive_group()
    b.add_argument("--batch", type=_count, help="global batch in sequences")
    b.add_argument("--batch-tokens", type=_int_up_to(MAX_BATCH_TOKENS),
                   help=f"global batch in tokens, a multiple of --seq (default: about {DEFAULT_BATCH_TOKENS} "
                        "tokens, in whole sequences, rounded so that powers of two up to an eighth of them "
                        "divide it)")
    g.add_argument("--precision", default="bf16", help="bf16, fp16, fp8, nvfp4 (Blackwell), tf32 or fp32 (default "
                   "bf16; tf32/fp32: 4-byte activations, weights and gradients)")
    g.add_argument("--fp8-recipe", default="tensorwise",
                   help="with --precision fp8: tensorwise (a scale per tensor from its current amax: Transformer "
                        "Engine's current scaling, torchao's default), delayed (Transformer Engine's amax history, "
                        "Megatron-LM's default: an amax all-reduce over each stage's ranks after every chunk's "
                        "forward and backward) or rowwise (torchao's row-wise scales: each operand quantized along "
                        "each GEMM's axis, its GEMMs at the GPU's fp8_rowwise_gemm_efficiency_ratio) "
                        "(default tensorwise)")
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
    g.add_argument("--moe-imbalance", type=_imbalance, default=None,
                   help="MoE, dropless: busiest expert-parallel rank's routed tokens over the mean "
                        "(default 1.1, an assumption; 1.0 = perfectly balanced; at most EP and "
                        "experts/top-k, where a rank receives every token); 'init': the router as "
                        "initialized, as in a benchmark from random weights (uniform random routing)")
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
    g.add_argument("--pue", type=number_within(1.0, MAX_PUE, "(facility power over IT power)"),
                   default=PATTERSON_GPT3_PUE,
                   help=f"the data center's power usage effectiveness, for energy and carbon (default "
                        f"{PATTERSON_GPT3_PUE:g}: GPT-3's, Patterson et al. 2021)")
    g.add_argument("--grid-kg-per-kwh", type=number_within(0.0, MAX_KG_CO2E_PER_KWH, "kg CO2e per kWh"),
                   default=PATTERSON_GPT3_KG_CO2E_PER_KWH,
                   help=f"the grid's carbon intensity, kg CO2e per kWh (default {PATTERSON_GPT3_KG_CO2E_PER_KWH:g}: "
                        "the grid GPT-3 trained on, Patterson et al. 2021; your grid operator publishes yours)")
    g.add_argument("--expandable-segments", action="store_true",
                   help="price the allocator's fragmentation as PyTorch's expandable segments "
                        "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, as torchtitan sets it)")
    g.add_argument("--json", action="store_true", help="print JSON instead of tables")


def add_plan(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_argument_group("plan" if required else "pin plan axes (others are searched)")
    for name, hlp in (("tp", "tensor parallel"), ("pp", "pipeline parallel"), ("dp", "data parallel"),
                      ("cp", "context parallel"), ("ep", "expert parallel (MoE)"),
                      ("etp", "expert tensor parallel (MoE)"), ("vp", "virtual stages per pipeline rank"),
                      ("mb", "micro-batch size (sequences)")):
        g.add_argument(f"--{name}", type=_degree, default=None, help=hlp)
    if required:
        g.add_argument("--schedule", default=None, help="gpipe, 1f1b, interleaved, bfs, zb (ZB-H1), zbv (ZB-V, --vp 2), dualpipev (DualPipeV, --vp 2) (default 1f1b / interleaved if --vp>1)")
        g.add_argument("--recompute", default=None,
                       help="none, selective, full, first_k, modules (Megatron-Core --recompute-modules), op-sac (torchtitan per-op SAC; eager engines) (default none)")
        g.add_argument("--recompute-layers", type=_int_up_to(MAX_LAYERS), default=0, help="layers per stage for first_k")
        g.add_argument("--recompute-ops", default=None, metavar="OPS",
                       help="recompute=set (implied): the tensors each layer drops and re-creates, comma-separated: "
                            "ln1, qkv, scores, attn, resid, ln2, up, act (docs/model/memory.md, Searched recomputation)")
        g.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None, help="sequence parallel (default on when TP>1)")
        g.add_argument("--zero", default=None, help="ZeRO stage 0-3 (3 = FSDP) (default 0; for torchtitan, "
                       "with data or context parallelism, its FSDP default: 3, or 2 with --pp > 1)")
        g.add_argument("--dp-shard", type=_degree, default=None, help="ZeRO-3 shard group (HSDP when < DP)")
        g.add_argument("--offload", action="store_true", help="offload optimizer states to host")
        g.add_argument("--offload-activations", type=_int_up_to(MAX_LAYERS), default=0, metavar="LAYERS",
                       help="layers per pipeline stage whose saved activations are copied to host memory and back, "
                            "under compute (first_k's layers excepted; not with op-sac; default 0)")
        g.add_argument("--adama", action="store_true",
                       help="Adam accumulation (AdamA): fold each micro-batch's gradients into Adam's states and "
                            "free them (no full gradient buffer; m state passes and m DP reductions a step)")
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
                       help="MoE: deduplicated dispatch, each token once per node over the network, then "
                            "over NVLink to its experts' GPUs (DeepEP; Megatron-Core's flex dispatcher)")
        g.add_argument("--ep-overlap", action="store_true",
                       help="MoE: run each micro-batch's all-to-alls under another micro-batch's compute")
        g.add_argument("--plan", default=None,
                       help="the whole plan as `paraplan search` prints it, quoted (e.g. 'TP8 PP1 DP64 mb1 SP "
                            "rc:none zero1 tpov attn:flash3'), instead of the flags above")
        g.add_argument("--rank", type=_int_up_to(MAX_RANK), default=None, metavar="N",
                       help="the N-th plan of the search as `paraplan search` ranks it (1 = its first row), the "
                            "search narrowed by the plan flags given (docs/tutorial.md, Choosing the plan)")
        g.add_argument("--stages", default=None, metavar="GROUP:TP:LAYERS,...",
                       help="with a mixed cluster (--cluster with [[group]] tables): the pipeline's stages in "
                            "order, e.g. h100:8:57,a100:8:23, with --dp (and --mb, --recompute, --zero 0|1, "
                            "--schedule 1f1b|gpipe, --sp); without it, the search's --rank N plan")
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
    _add_grad_compression(g)
    add_quiet(p)


def _add_grad_compression(g) -> None:
    """The DP gradient reduction's wire format: a plan's, or every plan's of a search (never searched)."""
    g.add_argument("--grad-compression", default=None,
                   help="DP gradient reduction: none (default), int4 (DeepSpeed ZeRO++ qgZ, ZeRO-3 across nodes) or "
                        "powersgd (PyTorch DDP's PowerSGD hook, ZeRO 0); changes the numerics, never searched")
    g.add_argument("--powersgd-rank", type=_degree, default=None, metavar="R",
                   help="with --grad-compression powersgd: the rank of P and Q (default 1, torch's)")
    g.add_argument("--low-precision-params", action="store_true",
                   help="with --precision fp8 or nvfp4: weights kept and all-gathered in the GEMMs' format, no "
                        "16-bit copy (Megatron-Core --fp8-param-gather, Megatron-Bridge fp4_param)")


def add_plan_command(sub, name: str, help_text: str, *, required: bool) -> argparse.ArgumentParser:
    """A training command's parser: the model, cluster and workload flags, the plan flags (the
    plan itself, or pins on a search), --engine, and the plan shorthand's legend in --help."""
    from ..report.legend import legend_block
    p = sub.add_parser(name, help=help_text, epilog=legend_block(), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_specs(p)
    add_plan(p, required=required)
    add_engine(p)
    return p


def add_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", default=None, choices=[e.value for e in Engine],
                   help="predict for this engine: its policy (gradient reduction dtype, checkpointing, TP "
                        "backward overlap, FSDP2 copies, fused or eager layers and loss, autocast without FSDP) and, "
                        "in search, only "
                        "the plans it can run (as paraplan export --format does)")
    p.add_argument("--no-compile", action="store_true",
                   help="with --engine torchtitan: price its blocks eager, not under torch.compile (and no async TP)")


def add_whatif(p: argparse.ArgumentParser, what: str) -> None:
    from ..search.whatif import DEFAULT_CHANGE
    p.add_argument("--whatif", type=_percent, nargs="?", const=100.0 * DEFAULT_CHANGE, default=None, metavar="PCT",
                   help=f"also show, for each hardware and workload assumption (compute rate, attention kernels, "
                        f"HBM, NVLink and network bandwidth, latency, overheads, MoE imbalance) made PCT%% worse and "
                        f"better (default {100 * DEFAULT_CHANGE:g}), {what}")


def exporter_from_args(args: argparse.Namespace, workload: Workload, model: ModelSpec) -> Exporter | None:
    """The exporter of --engine (export/registry.py) with its optimizer rule (and the
    model's, e.g. an MTP module the engine does not train) checked; None without the flag."""
    if getattr(args, "engine", None) is None:
        if getattr(args, "no_compile", False):
            raise SpecError("flag", "--no-compile", True, "needs --engine torchtitan (the engine that compiles)")
        return None
    engine = Engine(args.engine)
    check_optimizer(engine, workload)
    mod = exporter(engine)
    check_model(mod.SUPPORT, model)
    return mod


def engine_rules_from_args(args: argparse.Namespace, workload: Workload, model: ModelSpec) -> EngineRules | None:
    """--engine as a search sees it (its bounds, policy and exporter check); None without it."""
    mod = exporter_from_args(args, workload, model)
    return None if mod is None else EngineRules(support_from_args(mod, args), mod.check)


# parser attributes of one plan (estimate, trace, export): how they choose it, as written or
# narrowing a search, is cli/choice.py's rule
PLAN_FLAGS = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "mb", "schedule", "recompute", "recompute_layers",
              "recompute_ops", "sp",
              "zero", "dp_shard", "offload", "offload_activations", "adama", "no_dp_overlap", "tp_overlap",
              "attention", "capacity_factor", "a2a_hierarchical", "ep_overlap", "cp_comm", "rank_order",
              "grad_compression", "powersgd_rank")


# Plan.describe's tokens, each read back into the plan flags it stands for
_PLAN_TOKENS = (
    (r"TP(\d+)", lambda m: {"tp": int(m[1])}), (r"PP(\d+)", lambda m: {"pp": int(m[1])}),
    (r"DP(\d+)", lambda m: {"dp": int(m[1])}),
    (r"CP(\d+)(?:/([a-z0-9]+))?", lambda m: {"cp": int(m[1]), "cp_comm": m[2] or "p2p"}),
    (r"EP(\d+)", lambda m: {"ep": int(m[1])}), (r"ETP(\d+)", lambda m: {"etp": int(m[1])}),
    (r"VP(\d+)", lambda m: {"vp": int(m[1])}), (r"order:([a-z-]+)", lambda m: {"rank_order": m[1]}),
    (r"mb(\d+)", lambda m: {"mb": int(m[1])}), (r"SP", lambda m: {"sp": True}),
    (r"(gpipe|1f1b|interleaved|bfs|zb|zbv|dualpipev)", lambda m: {"schedule": m[1]}),
    (r"rc:first(\d+)", lambda m: {"recompute": "first_k", "recompute_layers": int(m[1])}),
    (r"rc:set\(([a-z0-9,]*)\)", lambda m: {"recompute": "set", "recompute_ops": m[1]}),
    (r"rc:([a-z_-]+)", lambda m: {"recompute": m[1]}),
    (r"zero(\d)(?:/hsdp(\d+))?", lambda m: {"zero": m[1], "dp_shard": int(m[2]) if m[2] else None}),
    (r"offload", lambda m: {"offload": True}), (r"aoff(\d+)", lambda m: {"offload_activations": int(m[1])}),
    (r"adama", lambda m: {"adama": True}), (r"tpov", lambda m: {"tp_overlap": True}),
    (r"gc:([a-z0-9]+)(?:/r(\d+))?",
     lambda m: {"grad_compression": m[1], "powersgd_rank": int(m[2]) if m[2] else None}),
    (r"compiled", lambda m: {}),  # the engine's policy (--engine torchtitan compiles its blocks)
    (r"kept:[0-9.]+B", lambda m: {}),  # the engine version's (torch pipelining's kept head outputs)
    (r"rerun:attn", lambda m: {}),  # the engine version's (a save list without its attention kernel)
    (r"cf([0-9.eE+-]+)", lambda m: {"capacity_factor": float(m[1])}),
    (r"a2a:2d", lambda m: {"a2a_hierarchical": True}), (r"epov", lambda m: {"ep_overlap": True}),
    (r"attn:([a-z0-9]+)", lambda m: {"attention": m[1]}),
)


def apply_plan_string(args: argparse.Namespace) -> None:
    """--plan "TP8 PP4 ...": set every plan flag from a plan as `search` prints it (its
    shorthand, Plan.describe), the flags it does not name to their defaults (no SP, ZeRO 0),
    so that the plan of the flags is that plan. With other plan flags too, or a token it
    does not read, a one-line SpecError."""
    text = getattr(args, "plan", None)
    if not text:
        return
    if plan_flags_given(args):
        raise SpecError("plan", "--plan", text, "a plan string or plan flags (--tp, --pp, ...), not both")
    values: dict = {"sp": False}
    for token in text.split():
        found = next(((pattern, read) for pattern, read in _PLAN_TOKENS if re.fullmatch(pattern, token)), None)
        if found is None:
            raise SpecError("plan", "--plan", token, "a plan as `paraplan search` prints it, e.g. "
                            "'TP4 PP2 DP64 VP2 mb1 zbv SP rc:none zero2 tpov attn:flash3' (legend: --help)")
        values.update(found[1](re.fullmatch(found[0], token)))
    for key, value in values.items():
        setattr(args, key, value)


def plan_flags_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, k) is not None if k == "sp" else getattr(args, k) not in (None, False, 0)
               for k in PLAN_FLAGS)


def engine_default_zero(args: argparse.Namespace, plan: Plan, support: EngineSupport) -> Plan:
    """The plan of the flags with the engine's own ZeRO default where --zero was not given and
    the plan has data or context parallelism to shard over (EngineSupport.default_zero)."""
    return support.with_plan_default_zero(plan, args.zero is not None)


def support_from_args(mod: Exporter, args: argparse.Namespace) -> EngineSupport:
    """--engine's EngineSupport, with --no-compile applied (EngineSupport.without_compile)."""
    return mod.SUPPORT.without_compile() if getattr(args, "no_compile", False) else mod.SUPPORT


def finite_flag(flag: str, value: float) -> float:
    """A flag's value in SI units; one past the float range is the flag's error."""
    if not math.isfinite(value):
        raise SpecError("workload", flag, value, "too large")
    return value


MOE_IMBALANCE_AT_INIT = "init"  # --moe-imbalance: the router as initialized (Workload.moe_routing_at_init)


def _imbalance(text: str) -> float | str:
    """--moe-imbalance: a number (check_moe_imbalance checks its range) or 'init'."""
    if text.strip().lower() == MOE_IMBALANCE_AT_INIT:
        return MOE_IMBALANCE_AT_INIT
    try:
        return _number(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; allowed: a number from 1.0, or "
                                         f"{MOE_IMBALANCE_AT_INIT!r} (the router as initialized)") from None


def check_moe_imbalance(args: argparse.Namespace, model: ModelSpec) -> None:
    """--moe-imbalance is the busiest EP rank's routed tokens over the mean: a rank receives
    each token at most min(k, E/ep) times of the k·T/ep it gets on average, so the factor is
    at most min(EP, E/k) (cost/moe.py load_factor); EP where it is pinned, else E/k. 'init'
    (the router as initialized) has its own (cost/moe.py random_routing_imbalance)."""
    lam = args.moe_imbalance
    if lam is None:
        return
    if not model.is_moe:  # as --capacity-factor: a flag that would change nothing is refused
        raise SpecError("workload", "--moe-imbalance", lam,
                        f"applies to mixture-of-experts models only; {model.name} is dense")
    if lam == MOE_IMBALANCE_AT_INIT:
        return
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


def _routing_fields(imbalance: float | str | None) -> dict:
    """The Workload fields --moe-imbalance sets: none (the default), the router as initialized, or a factor."""
    if imbalance is None:
        return {}
    return {"moe_routing_at_init": True} if imbalance == MOE_IMBALANCE_AT_INIT else {"moe_imbalance": imbalance}


def default_batch(seq: int) -> int:
    """Sequences of the default batch: about DEFAULT_BATCH_TOKENS, rounded to a multiple of an
    eighth of its leading power of two (within 1/16 of the tokens), so that data-parallel
    degrees up to that power divide it (4M/3000 = 1398.1 gives 1408 = 11 * 128, not 1398)."""
    n = DEFAULT_BATCH_TOKENS / seq
    if n < 1:
        return 1
    step = 2 ** max(int(math.log2(n)) - 3, 0)
    return max(step, round(n / step) * step)


def specs_from_args(args: argparse.Namespace,
                    cluster_name: str | None = None) -> tuple[ModelSpec, ClusterSpec, Workload]:
    """The model, cluster (`cluster_name`, else --hardware or --cluster) and workload of the flags."""
    from ..specs.catalog import load_cluster
    model = model_from_args(args)
    if cluster_name is None and not args.hardware and "," in args.cluster and not os.path.exists(args.cluster):
        raise SpecError(args.command, "--cluster", args.cluster, "one cluster preset or TOML (a list of clusters "
                        "is for paraplan scale)")
    cluster = load_cluster(cluster_name or args.hardware or args.cluster, num_gpus=args.gpus)
    return model, cluster.with_power_limit(args.power_limit), workload_from_args(args)


def mixed_cluster_args(args: argparse.Namespace) -> bool:
    """Whether --cluster names a mixed cluster (a TOML with [[group]] tables; specs/mixed.py);
    --stages, which only such a cluster takes, otherwise a one-line error."""
    from ..specs.catalog import is_mixed_cluster_file
    mixed = not args.hardware and is_mixed_cluster_file(args.cluster)
    if mixed and args.power_limit is not None:
        raise SpecError(args.command, "--power-limit", args.power_limit, "one cluster's GPUs; in a mixed cluster "
                        "set power_limit_watts in each group's GPU TOML")
    if not mixed and getattr(args, "stages", None):
        raise SpecError(args.command, "--stages", args.stages, "only with a mixed cluster (--cluster with [[group]] "
                        "tables); for one cluster give --tp/--pp/--dp")
    return mixed


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """The model of --model (with --mtp-layers), its --moe-imbalance checked."""
    from ..specs.catalog import load_model
    model = load_model(args.model)
    if args.mtp_layers is not None:
        model = replace(model, mtp_layers=args.mtp_layers)
    check_moe_imbalance(args, model)
    return model


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload of the flags: batch, sequence, precision, optimizer, budget and costs."""
    from ..specs.workload import Optimizer, parse_fp8_recipe, parse_precision
    try:
        optimizer = Optimizer(args.optimizer)
    except ValueError:
        raise SpecError("workload", "--optimizer", args.optimizer,
                        "allowed: " + ", ".join(o.value for o in Optimizer)) from None
    recipe = parse_fp8_recipe(args.fp8_recipe, "--fp8-recipe")
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
    return Workload(global_batch_size=gbs, seq_len=args.seq, precision=parse_precision(args.precision, "--precision"),
                    fp8_recipe=recipe, optimizer=optimizer, token_budget=args.tokens, usd_per_gpu_hour=args.price,
                    **_routing_fields(args.moe_imbalance),
                    restart_s=finite_flag("--restart-min", 60.0 * args.restart_min),
                    storage_bytes_per_s=finite_flag("--storage-gb-per-s", _GIGA * args.storage_gb_per_s),
                    interruptions_per_gpu_day=args.interruptions_per_gpu_day,
                    pue=args.pue, grid_kg_co2e_per_kwh=args.grid_kg_per_kwh,
                    expandable_segments=args.expandable_segments)


def plan_from_args(args: argparse.Namespace, cluster: ClusterSpec) -> Plan:
    from ..plan.axes import V_SCHEDULES, AttentionKernel, CPCommType, RankOrder, Recompute, Schedule, ZeroStage
    from ..plan.plan import make_plan
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
    recompute, recompute_ops = recompute_from_args(args)
    if recompute is Recompute.FIRST_K and not args.recompute_layers:
        raise SpecError("plan", "--recompute-layers", 0, "--recompute first_k needs it: the layers of each "
                        "stage to recompute, at least 1")
    check_recompute_layers(args)
    zero = ZeroStage.parse("0" if args.zero is None else str(args.zero), "zero")
    sp = args.sp if args.sp is not None else tp > 1
    cp_comm = CPCommType.parse(args.cp_comm, "cp_comm_type") if args.cp_comm is not None else CPCommType.P2P
    order = RankOrder.parse(args.rank_order, "rank_order") if args.rank_order is not None else RankOrder.TP_CP_DP_PP
    gc, gc_rank = grad_compression_from_args(args)
    return make_plan(tp=tp, pp=pp, dp=dp, cp=cp, cp_comm_type=cp_comm, rank_order=order, ep=args.ep or 1, etp=args.etp or 1,
                     grad_compression=gc, powersgd_rank=gc_rank,
                     capacity_factor=args.capacity_factor, a2a_hierarchical=args.a2a_hierarchical,
                     ep_overlap=args.ep_overlap, vp=vp, micro_batch_size=args.mb or 1, schedule=sched,
                     recompute=recompute, recompute_ops=recompute_ops,
                     recompute_num_layers=args.recompute_layers, activation_offload_layers=args.offload_activations,
                     sequence_parallel=sp, zero=zero,
                     dp_shard=args.dp_shard or 0, offload_optimizer=args.offload,
                     adam_accumulation=args.adama,
                     dp_overlap=not args.no_dp_overlap, tp_overlap=args.tp_overlap,
                     low_precision_params=low_precision_params_from_args(args),
                     attention=AttentionKernel.parse(args.attention, "attention") if args.attention is not None
                     else cluster.gpu.attention_kernels[-1])


def low_precision_params_from_args(args: argparse.Namespace) -> bool:
    """--low-precision-params, refused (one line) where the precision has no quantized weights."""
    from ..cost.low_precision import LOW_PRECISIONS
    from ..specs.workload import parse_precision
    if args.low_precision_params and parse_precision(args.precision, "--precision") not in LOW_PRECISIONS:
        raise SpecError("plan", "--low-precision-params", True,
                        f"applies with --precision fp8 or nvfp4 (not {args.precision}): only their weights are "
                        "quantized")
    return args.low_precision_params


def grad_compression_from_args(args: argparse.Namespace):
    """(--grad-compression, --powersgd-rank) as plan values; a rank without PowerSGD is a one-line error."""
    from ..plan.axes import GradCompression
    gc = (GradCompression.parse(args.grad_compression, "grad_compression") if args.grad_compression is not None
          else GradCompression.NONE)
    if args.powersgd_rank is not None and gc is not GradCompression.POWERSGD:
        raise SpecError("plan", "--powersgd-rank", args.powersgd_rank, "applies with --grad-compression powersgd only")
    return gc, args.powersgd_rank or 1


def recompute_from_args(args: argparse.Namespace):
    """(--recompute, --recompute-ops) as plan values: a set of ops implies recompute=set, which
    needs one; one-line errors otherwise."""
    from ..plan.axes import Recompute, RecomputeOp, RecomputeOps
    given = getattr(args, "recompute_ops", None)
    recompute = Recompute.parse(args.recompute if args.recompute is not None
                                else "set" if given is not None else "none", "recompute")
    ops = RecomputeOps.parse(given, "--recompute-ops") if given is not None else RecomputeOps()
    allowed = ", ".join(op.value for op in RecomputeOp) + " (comma-separated)"
    if recompute is Recompute.SET and not ops:
        raise SpecError("plan", "--recompute-ops", given or "", f"--recompute set needs the ops to recompute: {allowed}")
    if ops and recompute is not Recompute.SET:
        raise SpecError("plan", "--recompute-ops", given, f"applies with --recompute set only (not {recompute.value})")
    return recompute, ops


def check_recompute_layers(args: argparse.Namespace) -> None:
    """--recompute-layers counts first_k's layers: with another policy it would change nothing."""
    from ..plan.axes import Recompute
    recompute = Recompute.parse("none" if args.recompute is None else args.recompute, "recompute")
    if args.recompute_layers and recompute is not Recompute.FIRST_K:
        raise SpecError("plan", "--recompute-layers", args.recompute_layers,
                        f"applies with --recompute first_k only (not {recompute.value})")


def search_pins(args: argparse.Namespace) -> tuple[dict, SpaceLimits]:
    """The plan axes pinned by flags, and the search limits the flags set."""
    from ..plan.axes import CPCommType, RankOrder, Schedule
    fixed = {k2: getattr(args, k1) for k1, k2 in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"),
                                                    ("ep", "ep"), ("etp", "etp"), ("vp", "vp"),
                                                    ("mb", "micro_batch_size"))
             if getattr(args, k1) is not None}
    cp_comms = (CPCommType.parse(args.cp_comm, "cp_comm_type"),) if args.cp_comm is not None else tuple(CPCommType)
    orders = (RankOrder.parse(args.rank_order, "rank_order"),) if args.rank_order is not None else tuple(RankOrder)
    schedules = (tuple(dict.fromkeys(Schedule.parse(x.strip(), "schedule") for x in args.schedule.split(",")))
                 if args.schedule is not None else tuple(Schedule))
    gc, gc_rank = grad_compression_from_args(args)
    return fixed, SpaceLimits(capacity_factors=(args.capacity_factor,), cp_comm_types=cp_comms, rank_orders=orders,
                              schedules=schedules, grad_compression=gc, powersgd_rank=gc_rank,
                              low_precision_params=low_precision_params_from_args(args))
