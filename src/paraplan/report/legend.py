"""The plan shorthand the tables print (Plan.describe, Deployment.describe) and what each
token means: the one table that `--help` and the line under each table of plans read.

The meanings follow plan/axes.py, plan/plan.py and docs/model/*.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .width import wrap


@dataclass(frozen=True, kw_only=True)
class Term:
    label: str    # as the legend shows it
    pattern: str  # the tokens it explains (a full match)
    short: str    # the meaning in the line under a table
    meaning: str  # the meaning in --help
    training: bool = True   # a training plan's token (search, scale, estimate)
    serving: bool = False   # a serving deployment's token (serve)


def _t(label: str, short: str, meaning: str = "", pattern: str = "", serving: bool = False,
       training: bool = True) -> Term:
    return Term(label=label, pattern=pattern or re.escape(label), short=short, meaning=meaning or short,
                training=training, serving=serving)


TERMS = (
    _t("TP", "tensor parallel", "tensor-parallel degree (GPUs splitting each layer)", r"TP\d+", serving=True),
    _t("PP", "pipeline parallel", "pipeline-parallel degree (stages)", r"PP\d+", serving=True),
    _t("DP", "data parallel", "data-parallel degree (model replicas)", r"DP\d+"),
    _t("CP", "context parallel, ring", "context-parallel degree, K/V passed around a ring (ring attention)", r"CP\d+"),
    _t("CP/allgather", "context parallel, K/V all-gathered",
       "context parallel with K/V all-gathered, then attended (Llama 3)",
       r"CP\d+/allgather"),
    _t("CP/a2a", "context parallel, Ulysses all-to-all",
       "context parallel by all-to-all from sequence to heads (DeepSpeed-Ulysses)",
       r"CP\d+/a2a"),
    _t("EP", "expert parallel", "expert-parallel degree (MoE)", r"EP\d+", serving=True),
    _t("ETP", "expert TP", "expert tensor-parallel degree (MoE)", r"ETP\d+"),
    _t("VP", "virtual stages per rank", "virtual pipeline stages (model chunks) per pipeline rank", r"VP\d+"),
    _t("order:tp-cp-pp-dp", "DP outermost", "rank order with data parallelism outermost (Megatron "
       "--use-tp-pp-dp-mapping, Llama 3)", r"order:\S+"),
    _t("mb", "micro-batch (sequences)", "micro-batch size in sequences", r"mb\d+"),
    _t("gpipe", "GPipe", "GPipe schedule: all forwards, then all backwards"),
    _t("1f1b", "1F1B", "one-forward-one-backward pipeline schedule (PipeDream-Flush)"),
    _t("interleaved", "interleaved 1F1B", "interleaved 1F1B schedule over the VP chunks of each rank"),
    _t("bfs", "breadth-first", "breadth-first looping pipeline schedule"),
    _t("zb", "zero-bubble ZB-H1", "zero-bubble schedule ZB-H1: backward split into B and W passes"),
    _t("zbv", "zero-bubble V", "zero-bubble V schedule: two chunks per rank in a V, B and W split"),
    _t("dualpipev", "DualPipeV", "DeepSeek-V3's DualPipeV schedule: ZB-V with forward and backward paired"),
    _t("SP", "sequence parallel", "sequence parallel: norms and dropout split over the TP ranks"),
    _t("rc", "recomputation", "activation recomputation: none, selective (attention core), full, firstK (K layers "
       "of each stage), modules (Megatron-Core's), op-sac (torchtitan's per-op)", r"rc:\S+"),
    _t("zero", "ZeRO stage", "ZeRO stage: 1 optimizer states, 2 and gradients, 3 and weights (FSDP) sharded over "
       "DP", r"zero\d(/hsdp\d+)?"),
    _t("/hsdp", "HSDP shard group", "ZeRO-3 sharded over N of the DP ranks, replicated across the rest (HSDP)",
       r"zero\d/hsdp\d+"),
    _t("offload", "optimizer on host", "optimizer states (and their step) in host memory"),
    _t("aoff", "activations on host", "activation offload: the saved activations of N layers per stage copied to "
       "host memory and back, under compute", r"aoff\d+"),
    _t("gc", "compressed DP gradients", "DP gradient reduction's wire format: int4 (DeepSpeed ZeRO++ qgZ), "
       "powersgd (PyTorch DDP's PowerSGD hook; /rN its rank)", r"gc:[a-z0-9]+(/r\d+)?"),
    _t("adama", "Adam accumulation", "AdamA: each micro-batch's gradients folded into Adam's states and freed "
       "(a gradient buffer of about a layer; a state pass and a DP reduction per micro-batch)"),
    _t("tpov", "TP comm overlapped with GEMMs"),
    _t("compiled", "torch.compile", "an eager engine's layers under torch.compile"),
    _t("kept", "head outputs kept", "torch.distributed.pipelining keeps every micro-batch's head output on the "
       "last stage, N bytes per logit, to the step's end (torchtitan before 0.2.1; validate sets it by the row's date)",
       r"kept:[\d.]+B"),
    _t("rerun:attn", "attention re-run", "per-op checkpointing re-runs the attention in the backward: the engine's "
       "save list does not name the kernel it ran (torchtitan 0.1.0-0.2.0 with cuDNN's; validate sets it by the "
       "row's date and GPU)"),
    _t("cf", "capacity factor", "MoE capacity factor: tokens past it dropped, experts padded to it",
       r"cf[\d.e+-]+"),
    _t("a2a:2d", "deduplicated dispatch", "MoE dispatch once per node and GPU (DeepEP), not once per expert"),
    _t("epov", "EP all-to-all overlapped", "EP all-to-all overlapped with another micro-batch's compute"),
    _t("attn", "attention kernel", "attention kernel: unfused, flash2 (FlashAttention-2), flash3 "
       "(FlashAttention-3 / cuDNN)", r"attn:\S+"),
    _t("×N", "replicas", "replicas of the deployment", r"×\d+", serving=True, training=False),
    _t("w", "weight dtype", "weight dtype (bf16, fp16, fp8, int8, int4)", r"w:\S+", serving=True, training=False),
    _t("kv", "KV-cache dtype", "KV-cache dtype (bf16, fp16, fp8, int8, int4)", r"kv:\S+", serving=True, training=False),
    _t("kv-by-batch", "KV split over the batch", "KV cache split over the batch, not the heads (Pope et al.)",
       serving=True, training=False),
    _t("experts-in-HBM", "experts kept in HBM", "share of experts kept in HBM, the rest in host memory",
       r"experts-in-HBM:\S+", serving=True, training=False),
)


def terms_used(descriptions) -> list[Term]:
    """The terms that explain the tokens of these plan descriptions, in TERMS order."""
    tokens = {tok for d in descriptions for tok in d.split()}
    return [t for t in TERMS if any(re.fullmatch(t.pattern, tok) for tok in tokens)]


def unexplained(descriptions) -> list[str]:
    """Tokens of these descriptions that no term explains (a test keeps this empty)."""
    tokens = dict.fromkeys(tok for d in descriptions for tok in d.split())
    return [tok for tok in tokens if not any(re.fullmatch(t.pattern, tok) for t in TERMS)]


def legend_line(descriptions, width: int, already=()) -> str:
    """One line (wrapped at `width`) naming the shorthand these descriptions use, less the
    terms in `already` (explained above it); "" when none is left."""
    terms = [t for t in terms_used(descriptions) if t not in already]
    if not terms:
        return ""
    return _packed("legend: ", [f"{t.label}: {t.short}" for t in terms], width)


def _packed(label: str, entries: list[str], width: int) -> str:
    """`label` and the entries separated by "; ", wrapped at `width` between entries where
    one fits on a line (an entry longer than a line wraps inside it)."""
    indent = " " * len(label)
    lines, line = [], label
    for i, entry in enumerate(entries):
        text = entry + (";" if i < len(entries) - 1 else "")
        if line not in (label, indent) and len(line) + 1 + len(text) > width:
            lines.append(line)
            line = indent
        line += text if line in (label, indent) else " " + text
    return "\n".join(wrap(x, width, len(label)) for x in lines + [line])


def legend_block(serving: bool = False, width: int = 100) -> str:
    """The shorthand of a training plan (or a serving deployment) for a command's --help."""
    what = "deployment" if serving else "plan"
    terms = [t for t in TERMS if (t.serving if serving else t.training)]
    lines = [f"{what} shorthand in the tables (e.g. {_example(serving)}):"]
    lines += [wrap(f"  {t.label:<19}{t.meaning}", width, indent=21) for t in terms]
    return "\n".join(lines)


def _example(serving: bool) -> str:
    return ("TP2 PP1 ×3 w:fp8 kv:fp8" if serving
            else "TP4 PP2 DP32 CP2/allgather VP2 mb2 zbv SP rc:none zero2 tpov attn:flash3")


def split_shared(descriptions: list[str]) -> tuple[list[str], list[str]]:
    """(tokens every description has, each description without them); with fewer than two
    descriptions nothing is shared."""
    if len(descriptions) < 2:
        return [], list(descriptions)
    token_sets = [set(d.split()) for d in descriptions]
    shared = [tok for tok in descriptions[0].split() if all(tok in s for s in token_sets)]
    rest = [" ".join(tok for tok in d.split() if tok not in shared) for d in descriptions]
    if not all(rest):  # plans told apart by nothing shown: keep them whole
        return [], list(descriptions)
    return shared, rest
