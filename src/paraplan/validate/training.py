"""Validate the training model against published measurements (../shared/validation).

Each CSV row states a model, a cluster, a workload, the parallel knobs its authors used
(blank = not stated) and one measured metric. paraplan predicts the row by searching the
blank knobs for its best plan given the stated ones, then converts the prediction to the
row's metric with the row's own FLOP convention (read from its `notes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..cost.allocator import MemoryStat
from ..cost.flops import megatron_flops_per_iteration, model_flops_per_token
from ..cost.stage_memory import LAST_STAGE, plan_memory
from ..export.deepspeed import SUPPORT as DEEPSPEED
from ..export.torchtitan import SUPPORT as TORCHTITAN
from ..errors import NoPlanFitsError, ParaplanError, RowError, SpecError, UnknownPresetError
from ..plan.axes import AttentionKernel, CPCommType, RankOrder, Recompute, Schedule, ZeroStage
from ..plan.space import SpaceLimits
from ..search.planner import search
from ..specs.catalog import load_cluster, load_model, preset_name
from ..specs.files import without_note
from ..specs.hardware import NVIDIA_ARCHITECTURES, ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Fp8Recipe, Precision, Workload, parse_precision
from ..units import GIB, TERA
from .memory import (METRIC as PEAK_METRIC, check_complete, expandable_segments, logs_last_rank, memory_stat,
                     predicted_peak)
from .recipes import fp8_scaling, gradient_policy, moe_dispatch, parameter_policy, routing_policy, token_drop
from .rows import int_cell, read_rows, row_result, validate_rows, with_prediction

REQUIRED_COLUMNS = ("id", "source", "model", "seq_len", "gpu", "num_gpus", "precision", "global_batch",
                    "metric_id", "value")
# every other column a training file may have that paraplan reads or carries (the shared
# files' headers, ../shared/validation/README.md; the model-shape aliases are SHAPE_COLUMNS)
KNOWN_COLUMNS = ("params_b", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "gated_mlp",
                 "num_experts", "top_k", "moe_ffn_hidden", "gpus_per_node", "micro_batch", "tp", "pp", "vp", "cp",
                 "ep", "dp", "sp", "recompute", "zero", "framework", "metric_text", "notes", "cp_comm_type",
                 "rank_order", "cluster")
METRICS = ("iteration_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu_pct", "samples_per_s",
           "activation_memory_gib", "weights_grads_optimizer_memory_gib", "total_memory_gib", PEAK_METRIC)


@dataclass(frozen=True, kw_only=True)
class RowSetup:
    model: ModelSpec
    cluster_name: str
    num_gpus: int
    workload: Workload
    fixed: dict
    limits: SpaceLimits
    power_limit_watts: float | None = None  # the board power limit the row's GPU cell states


def _power_limit_watts(row: dict) -> float | None:
    """The board power limit the row's GPU cell states ("H100 (96GB HBM2e, 500W)": Meta's Grand
    Teton H100 at a 500 W limit), else None (the GPU at its TDP)."""
    m = re.search(r"(\d+(?:\.\d+)?)\s*W\b", row.get("gpu") or "")
    return float(m.group(1)) if m else None


def _is_legacy_megatron(row: dict) -> bool:
    """Megatron-LM as published in 2021–22 (Narayanan et al., Korthikanti et al.): GPT with
    dropout 0.1 and unfused softmax attention (no FlashAttention)."""
    return row.get("framework", "").strip() == "Megatron-LM"



def _megatron_default_dropout(row: dict) -> bool:
    """A Megatron-LM run (not NeMo or Megatron-Bridge, whose recipes set their own) keeps
    Megatron-Core's default dropout, hidden_dropout = attention_dropout = 0.1
    (megatron/core/transformer/transformer_config.py, 0.16.1), unless its notes set it: a
    stated rate ("--hidden-dropout 0"), or "no dropout"."""
    framework = (row.get("framework") or "").strip().lower()
    if not framework.startswith("megatron-lm"):
        return False
    notes = (row.get("notes") or "").lower()
    if re.search(r"\b(no|without)\s+dropout\b|\bdropout\s*[=:]?\s*(disabled|off|none)\b", notes):
        return False
    rates = re.findall(r"dropout\s*[=:]?\s*(\d*\.?\d+)", notes)
    return any(float(r) > 0.0 for r in rates) if rates else True


def _is_composer(row: dict) -> bool:
    """MosaicML llm-foundry / Composer: PyTorch FSDP with non-reentrant activation checkpointing."""
    fw = row.get("framework", "").lower()
    return "mosaic" in fw or "foundry" in fw or "composer" in fw


def _attention_kernels(row: dict) -> tuple[AttentionKernel, ...]:
    """The attention kernel the row's framework runs (preference order; the GPU decides).

    2021–22 Megatron-LM: unfused softmax attention. llm-foundry (2023 benchmarks):
    FlashAttention-2 / Triton. torchtitan: PyTorch SDPA, whose flash backend is
    FlashAttention-2. Megatron-Core, NeMo, Megatron-Bridge: Transformer Engine's cuDNN fused
    attention (FlashAttention-3-class on Hopper), FlashAttention-2 elsewhere.
    """
    if _is_legacy_megatron(row):
        return (AttentionKernel.UNFUSED,)
    if _is_composer(row) or _is_torchtitan(row) or _is_eager_deepspeed(row):
        return (AttentionKernel.FLASH2,)
    return (AttentionKernel.FLASH3, AttentionKernel.FLASH2)


# The cluster preset a row's GPU is predicted on (its GPU preset's canonical name -> cluster).
GPU_CLUSTERS = {"a100-sxm-80gb": "dgx-a100-80gb", "a100-sxm-40gb": "dgx-a100-40gb", "h100-sxm-80gb": "dgx-h100",
                "h200-sxm-141gb": "dgx-h200", "b200": "dgx-b200", "gb200": "gb200-nvl72", "mi300x": "mi300x-8",
                "tpu-v4": "tpu-v4-pod", "b300": "dgx-b300", "gb300": "gb300-nvl72", "gh200-96gb": "gh200-quad",
                "l40s": "l40s-pcie-8"}


# GPU families named inside a longer GPU cell ("NVIDIA H100 SXM5 80GB"), as whole words
# ("H1000" is none of them); the A100's memory size picks its preset
_GPU_FAMILIES = (("gb300", "gb300"), ("gb200", "gb200"), ("b300", "b300"), ("b200", "b200"), ("gh200", "gh200-96gb"),
                 ("h200", "h200-sxm-141gb"), ("h100", "h100-sxm-80gb"), ("a100", "a100-sxm-80gb"), ("mi300x", "mi300x"),
                 ("l40s", "l40s"))


def gpu_cluster_for(row: dict, path: str, line: int) -> str:
    """The cluster preset of the row's GPU: a GPU preset or alias, a GPU family named as a
    whole word in the cell, or a cluster preset. A GPU paraplan has no preset for skips the
    row (it lacks what a prediction needs), naming the line, the column and the closest presets."""
    text = without_note(row.get("gpu") or "")
    if not text:
        raise SpecError("row", "gpu", "", "a row needs it (a GPU preset name or alias)")
    try:
        gpu = preset_name("gpu", text)
    except UnknownPresetError as exc:
        words = re.findall(r"[a-z0-9]+", text.lower())
        gpu = next((preset for family, preset in _GPU_FAMILIES if family in words), None)
        if gpu is None:
            try:
                return preset_name("cluster", text)
            except UnknownPresetError:
                raise SpecError(f"{path}:{line}", "gpu", text, f"a GPU with a preset; {exc}") from None
        if gpu == "a100-sxm-80gb" and "40" in text and "80" not in text:
            gpu = "a100-sxm-40gb"
    src = (row.get("source", "") + " " + row.get("notes", "")).lower()
    if gpu == "a100-sxm-80gb" and ("1600 gbps" in src or "roce" in src):
        return "a100-roce-1600"
    if gpu not in GPU_CLUSTERS:
        raise SpecError(f"{path}:{line}", "gpu", text, f"a GPU with a cluster preset ({', '.join(GPU_CLUSTERS)})")
    return GPU_CLUSTERS[gpu]


def _is_torchtitan(row: dict) -> bool:
    return "torchtitan" in (row.get("framework") or "").lower()


def _is_eager_deepspeed(row: dict) -> bool:
    """DeepSpeed running a PyTorch model as written (Hugging Face and the like): eager
    layers. Megatron-DeepSpeed runs Megatron's fused layers, as a Megatron row does."""
    framework = (row.get("framework") or "").lower()
    return "deepspeed" in framework and "megatron" not in framework


def _pytorch_fsdp_whole_group(row: dict) -> bool:
    """PyTorch FSDP FULL_SHARD / SHARD_GRAD_OP, and FSDP2 as torchtitan runs it
    (data_parallel_shard_degree -1: every data-parallel rank), shard over the whole DP group
    (no HSDP) unless the row says hybrid sharding."""
    z = _label(row.get("zero"))
    if "hybrid" in z or "hsdp" in z:
        return False
    return "full_shard" in z or "full shard" in z or "shard_grad_op" in z or "fsdp2" in z


ZERO_ALLOWED = ("0, 1, 2, 3, fsdp, FSDP2, HSDP, PyTorch FSDP FULL_SHARD / SHARD_GRAD_OP / HYBRID_SHARD, "
                "NO_SHARD, Megatron FSDP, MaxText FSDP, distributed optimizer, DDP, none, DeepSpeed ZeRO-0…3 "
                "(\"ZeRO stage 3\", \"ZeRO-3 offload\"), or blank or n/a (not stated)")
# DeepSpeed's stages as published: "ZeRO-3", "ZeRO stage 2", "ZeRO3", "stage 3" (after _label)
_DEEPSPEED_STAGE = re.compile(r"\b(?:zero\s*(?:stage\s*)?|stage\s*)([0-3])\b")


def _label(text: str | None) -> str:
    """A published label folded for matching: lower case, '-' and '_' as spaces."""
    return re.sub(r"[-_]+", " ", (text or "").strip().lower())


def _zero(row: dict, path: str, line: int, pp: int | None) -> tuple[ZeroStage, ...]:
    """The sharding the row's `zero` label names, as each framework publishes it."""
    z = _label(row.get("zero"))
    if not z or z in ("fsdp", "n/a", "?"):  # not stated, or FSDP without its sharding strategy: searched
        return tuple(ZeroStage)
    if "no shard" in z or z in ("none", "no"):
        # FSDP's NO_SHARD is DDP (torch ShardingStrategy.NO_SHARD); none: nothing sharded
        return (ZeroStage.NONE,)
    if "reshard after forward" in z and re.search(r"false|off|no\b", z):
        # FSDP2 that keeps the gathered parameters after the forward: ZeRO-2
        return (ZeroStage.GRADIENTS,)
    stage = _DEEPSPEED_STAGE.search(z)
    if stage:  # DeepSpeed ZeRO stage n (deepspeed/runtime/zero/config.py ZeroStageEnum 0..3)
        return (ZeroStage(stage.group(1)),)
    if "shard grad op" in z or z == "2":
        return (ZeroStage.GRADIENTS,)
    if "fsdp2" in z and "full shard" not in z and (pp or 1) > 1:
        # torchtitan's FSDP2 keeps parameters gathered across a pipeline's micro-batches
        # (reshard_after_forward = not pp_enabled): ZeRO-2
        return (ZeroStage.GRADIENTS,)
    if any(k in z for k in ("full shard", "hybrid shard", "fsdp", "hsdp")) or z == "3":
        # FSDP2, HSDP, Megatron FSDP (optim_grads_params), MaxText FSDP: parameters sharded
        return (ZeroStage.PARAMETERS,)
    if "distributed optimizer" in z or z == "1":
        return (ZeroStage.OPTIMIZER,)
    if z in ("0", "ddp"):
        return (ZeroStage.NONE,)
    raise RowError(path, line, "zero", f"{row['zero'].strip()!r} is not allowed; allowed: {ZERO_ALLOWED}")


def _yes_no(row: dict, key: str, path: str, line: int) -> bool | None:
    """A yes/no column (blank: None, not stated); a note may follow ("yes (torchtitan TP plan)")."""
    text = without_note(row.get(key) or "")
    if not text:
        return None
    if text.lower() not in ("yes", "no"):
        raise RowError(path, line, key, f"{text!r} is not allowed; yes, no or blank (not stated)")
    return text.lower() == "yes"


def model_preset(name: str) -> ModelSpec | None:
    """The named preset; a parenthesized variant ("Qwen3_30B_a3B (tokendrop)") is the model."""
    for candidate in (name, without_note(name)):
        try:
            return load_model(candidate)
        except ParaplanError:
            continue
    return None


def _enum_cell(row: dict, column: str, enum, blank: str, path: str, line: int):
    """An optional column naming a member of `enum` (blank: None, which means `blank`); any
    other value is a RowError naming the file, line, column and what is allowed."""
    text = (row.get(column) or "").strip()
    if not text:
        return None
    try:
        return enum.parse(text, column)
    except SpecError:
        raise RowError(path, line, column, f"{text!r} is not allowed; allowed: "
                       + ", ".join(k.value for k in enum) + f" or blank ({blank})") from None


def published_precision(text: str) -> Precision:
    """A precision as sources publish it: a name or alias (parse_precision), or torchtitan's
    and torchao's "BF16 + Float8 linear (tensorwise)" / "BF16 + MXFP8 linear (...)": the linear
    layers' GEMMs in the low precision, everything else in BF16 -- what paraplan's fp8 prices
    (16-bit activations, FP8 GEMM inputs)."""
    m = re.fullmatch(r"(?:bf16|fp16)\s*\+\s*(\S+)\s+linear", without_note(text), re.IGNORECASE)
    if m:
        low = m.group(1).lower()
        return parse_precision("fp8" if low == "float8" else low)
    label = without_note(text).strip().lower()
    for pattern, name in _PRECISION_LABELS:
        if re.fullmatch(pattern, label):
            return parse_precision(name)
    return parse_precision(text)


# precision labels beyond the names parse_precision reads, as trainers publish them (the whole
# label): AMP / "mixed precision" in 16 bits; Transformer Engine's FP8 formats and recipes
# (hybrid: E4M3 forward, E5M2 gradients; current, delayed, sub-channel or block scaling) and
# "BF16 + FP8" / "BF16/FP8": FP8 GEMMs, the rest 16-bit -- what paraplan's fp8 prices
_PRECISION_LABELS = (
    (r"(mixed[- ]precision[ _-]?|amp[ _-]?)(bf16|bfloat16)", "bf16"),
    (r"(mixed[- ]precision[ _-]?|amp[ _-]?)(fp16|float16)", "fp16"),
    (r"fp8[ _-]?(hybrid|e4m3|e5m2|current[ _-]?scaling|delayed[ _-]?scaling|sub-?channel|blockwise|block[ _-]?scaling"
     r"|cs|ds|sc)", "fp8"),
    (r"(bf16|fp16)\s*[+/]\s*fp8", "fp8"),
)


def published_fp8_recipe(text: str, precision: Precision) -> Fp8Recipe:
    """An FP8 run's scaling recipe as torchtitan and torchao publish it: "rowwise" (also
    "rowwise_with_gw_hp", whose weight-gradient GEMM stays BF16: priced as row-wise, and no
    published throughput row uses it) in the label or its note, else per-tensor."""
    if precision is Precision.FP8 and re.search(r"\browwise", text, re.IGNORECASE):
        return Fp8Recipe.ROWWISE
    return Fp8Recipe.TENSORWISE


# recomputation labels beyond Recompute's names, as trainers publish them (the whole label)
_RECOMPUTE_LABELS = (
    # Hugging Face's gradient checkpointing and "activation checkpointing" in general: every layer
    (r"(full\s+)?(activation|gradient)\s+checkpointing|full\s+(ac|recompute|recomputation)|ac", Recompute.FULL),
    (r"no|off|disabled", Recompute.NONE),
    (r"(selective\s+)?(op[- ]level|per[- ]op)(\s+sac)?|selective\s+op", Recompute.OP_SAC),
)
# torchtitan's selective_ac_option default: checkpoint every 2nd block (config/job_config.py, 0.2.2)
TORCHTITAN_LAYER_AC_EVERY = 2


def _torchtitan_layer_ac(text: str) -> bool:
    """torchtitan's layer-level selective checkpointing ("selective layer", "selective (layer)",
    "layer SAC"): every N-th transformer block checkpointed whole."""
    t = text.lower()
    return re.search(r"\blayer\b", t) is not None and ("selective" in t or "sac" in t)


def layer_ac_share(text: str) -> float:
    """The share of a stage's layers torchtitan's layer-level checkpointing recomputes: 1/N for
    every N-th block, N as the label states it ("every 3 layers", "ac_freq 3", "option 3"), else
    torchtitan's default selective_ac_option = "2"."""
    m = re.search(r"every\s+(\d+)|ac_freq\D{0,3}(\d+)|option\D{0,3}(\d+)", text.lower())
    every = int(next(g for g in m.groups() if g)) if m else TORCHTITAN_LAYER_AC_EVERY
    return 1.0 / max(every, 1)


def published_recompute(text: str, torchtitan: bool) -> Recompute:
    """A recomputation as sources publish it: a name (Recompute.parse) or a label trainers use
    (_RECOMPUTE_LABELS: "gradient checkpointing" is every layer), with a note that may follow.
    torchtitan's "selective" is its per-op checkpointing ("selective (per-op SAC)", "(op-level
    SAC)", "(op)"; its llama3 configs set selective_ac_option = "op"): OP_SAC, as is any
    "selective" whose note names the per-op policy; its layer-level one ("selective layer")
    checkpoints every N-th block whole: first-k recomputation of 1/N of a stage's layers
    (layer_ac_share)."""
    if torchtitan and _torchtitan_layer_ac(text):
        return Recompute.FIRST_K
    label = without_note(text).strip().lower()
    for pattern, rc in _RECOMPUTE_LABELS:
        if re.fullmatch(pattern, label):
            return rc
    rc = Recompute.parse(without_note(text), "recompute")
    per_op = re.search(r"\(\s*op\b|per-op|op-level", text, re.IGNORECASE) is not None
    return Recompute.OP_SAC if rc is Recompute.SELECTIVE and (torchtitan or per_op) else rc


COUNT_COLUMNS = ("layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "top_k", "moe_ffn_hidden", "seq_len",
                 "num_gpus", "gpus_per_node", "global_batch", "micro_batch", "tp", "pp", "vp", "cp", "ep", "dp")


def row_cells(row: dict, path: str, line: int) -> dict:
    """Every typed cell of a training row (blank: None); a malformed one is a RowError naming
    the file, line, column and value, which skips the row."""
    cells = {k: int_cell(row, k, path, line) for k in COUNT_COLUMNS}
    cells["num_experts"] = int_cell(row, "num_experts", path, line, minimum=0)  # 0: dense
    cells["gated_mlp"] = _yes_no(row, "gated_mlp", path, line)
    cells["sp"] = _yes_no(row, "sp", path, line)
    cells["zero"] = _zero(row, path, line, cells["pp"])
    cells["cp_comm_type"] = _enum_cell(row, "cp_comm_type", CPCommType, "ring, p2p", path, line)
    cells["rank_order"] = _enum_cell(row, "rank_order", RankOrder, "tp-cp-dp-pp", path, line)
    prec = (row.get("precision") or "").strip()
    try:
        cells["precision"] = published_precision(prec) if prec else None  # blank: the row is skipped (row_setup)
    except SpecError as e:
        raise RowError(path, line, "precision", f"{prec!r} is not allowed; {e.allowed}") from None
    cells["fp8_recipe"] = published_fp8_recipe(prec, cells["precision"])
    rc = (row.get("recompute") or "").strip()
    try:
        cells["recompute"] = published_recompute(rc, _is_torchtitan(row)) if rc else None
    except SpecError as e:
        raise RowError(path, line, "recompute", f"{rc!r} is not allowed; {e.allowed} or blank (not stated)") from None
    if (cells["vp"] or 1) > 1 and cells["pp"] == 1:
        raise RowError(path, line, "vp", f"{row['vp'].strip()!r} is not allowed with pp 1; "
                       "virtual stages need pp > 1 (or pp blank: searched)")
    return cells


# ModelSpec field -> the training column it comes from
SHAPE_COLUMNS = {"num_layers": "layers", "hidden_size": "hidden", "ffn_hidden_size": "ffn_hidden",
                  "num_heads": "heads", "num_kv_heads": "kv_heads", "vocab_size": "vocab"}


# ModelSpec field -> the MoE training column that must agree with the preset (ffn_hidden and
# kv_heads are left out: MoE rows give the expert ffn there, and MLA models no KV heads)
_MOE_PRESET_COLUMNS = {"num_layers": "layers", "hidden_size": "hidden", "num_heads": "heads",
                       "vocab_size": "vocab", "num_experts": "num_experts", "top_k": "top_k",
                       "moe_ffn_hidden_size": "moe_ffn_hidden"}


def _moe_row_disagreements(cells: dict, model: ModelSpec) -> list[tuple[str, int]]:
    """(column, the preset's value) for every given MoE-row cell the preset contradicts."""
    return [(col, getattr(model, f)) for f, col in _MOE_PRESET_COLUMNS.items()
            if cells[col] is not None and cells[col] != getattr(model, f)]


def _row_model(row: dict, c: dict, path: str, line: int) -> ModelSpec:
    """The row's model: its architecture columns, or the preset of its name (MoE rows always)."""
    name = row["model"].strip()
    shape = {col: c[col] for col in SHAPE_COLUMNS.values()}
    preset = model_preset(name)
    moe_row = (c["num_experts"] or 0) > 0
    if moe_row and preset is None:
        raise RowError(path, line, "model", f"{name!r}: an MoE row needs a preset with the model's published "
                       "configuration (shared experts, dense layers)")
    if not moe_row:
        for col in ("top_k", "moe_ffn_hidden"):
            if c[col] is not None:  # would be ignored: the row is predicted as a dense model
                raise SpecError(f"{path}:{line}", col, row[col].strip(),
                                "blank on a dense row (num_experts blank or 0); an MoE row gives num_experts")
    if moe_row or any(v is None for v in shape.values()):
        if preset is None:
            raise RowError(path, line, "model", f"{name!r}: architecture columns blank and no preset")
        model = preset
        if moe_row:  # predicted on the preset: a column that says otherwise would be ignored
            for col, value in _moe_row_disagreements(c, model):
                raise SpecError(f"{path}:{line}", col, row[col].strip(),
                                f"{value} as in preset {model.name!r}, on which an MoE row is predicted "
                                "(or blank)")
    else:
        # a row whose architecture no model can have is skipped with the line and column (not
        # predicted on a guessed shape; one bad row does not refuse the file)
        if shape["hidden"] % shape["heads"]:
            raise SpecError(f"{path}:{line}", "hidden", row["hidden"].strip(),
                            f"a multiple of heads={shape['heads']} (head dim = hidden / heads)")
        try:
            model = ModelSpec(name=name, **{f: shape[col] for f, col in SHAPE_COLUMNS.items()},
                              head_dim=shape["hidden"] // shape["heads"], gated_mlp=bool(c["gated_mlp"]),
                              tied_embeddings=preset.tied_embeddings if preset else False, source=row["source"])
        except SpecError as e:  # the row states an architecture no model has: skipped, naming the cell
            col = SHAPE_COLUMNS.get(e.field, e.field)
            raise SpecError(f"{path}:{line}", col, (row.get(col) or "").strip(), e.allowed) from None
    return model


def _row_fixed(row: dict, c: dict, titan: bool, gbs: int) -> tuple[dict, int]:
    """The plan axes the row pins, and the global batch rounded up to whole micro-batches."""
    fixed = {}
    for col, key in (("tp", "tp"), ("pp", "pp"), ("cp", "cp"), ("dp", "dp"), ("ep", "ep"),
                     ("micro_batch", "micro_batch_size")):
        if c[col] is not None:
            fixed[key] = c[col]
    etp = re.search(r"\bETP\s*=\s*(\d+)", row.get("notes") or "")  # expert TP, as the notes state it
    if etp and (c["num_experts"] or 0) > 0:
        fixed["etp"] = int(etp.group(1))
    if titan and (c["pp"] or 1) > 1:
        fixed.pop("micro_batch_size", None)  # the local batch, split into pipeline micro-batches:
        fixed.update(_torchtitan_pipeline_default(row, c))
    if "micro_batch_size" in fixed and "dp" in fixed:
        # llm-foundry: "micro-batches need not divide GBS"; the last one is partial. Throughput
        # per token is that of full micro-batches, so round the batch up to whole ones.
        per = fixed["micro_batch_size"] * fixed["dp"]
        if per > gbs:  # not even one micro-batch per data-parallel rank: no run was that
            raise SpecError("row", "micro_batch", fixed["micro_batch_size"],
                            f"micro_batch × dp = {per} exceeds global_batch {gbs} (each data-parallel rank "
                            "runs at least one micro-batch)")
        gbs = -(-gbs // per) * per
    return fixed, gbs


def _torchtitan_pipeline_default(row: dict, c: dict) -> dict:
    """A torchtitan pipeline row's micro-batch size and model chunks per rank, which its tables
    do not give: torchtitan's defaults. Two stages per rank under a multi-stage (interleaved)
    schedule, one under a single-stage one (torchtitan 0.2.2 distributed/pipeline_parallel.py,
    "For multi-stage schedules, default is 2 virtual stages per rank"); as many micro-batches as
    stages in all, pp × stages per rank (torchtitan of Dec 2024, the commit the published rows
    name: experimental.pipeline_parallel_microbatches unset; later versions default to
    micro-batches of one sequence, pipeline_parallel_microbatch_size = 1). A row that states
    vp keeps it; a local batch the count does not divide leaves both searched."""
    schedules = _published_schedules(row)
    if len(schedules) != 1 or not c["micro_batch"]:
        return {}
    stages = c["vp"] or (2 if schedules[0] is Schedule.INTERLEAVED_1F1B else 1)
    count = c["pp"] * stages
    if c["micro_batch"] % count:
        return {}
    return {"micro_batch_size": c["micro_batch"] // count, "vp": stages}


def _cp_exchanges(c: dict, titan: bool) -> tuple[CPCommType, ...]:
    """How the row's CP ranks exchange K/V: its optional cp_comm_type column; else the engine's
    default: torchtitan's all-gather (job_config context_parallel_rotate_method = "allgather";
    torch's _ContextParallelOptions.rotate_method ALL_GATHER), with CP blank either that or
    none (a CP = 1 plan exchanges nothing and carries the ring's code); otherwise Megatron-Core's
    ring (p2p), which every Megatron/NeMo CP run in ../shared/validation used."""
    if c["cp_comm_type"] is not None:
        return (c["cp_comm_type"],)
    if not titan:
        return (CPCommType.P2P,)
    return (CPCommType.ALL_GATHER,) if c["cp"] is not None and c["cp"] > 1 else (CPCommType.P2P, CPCommType.ALL_GATHER)


def _row_limits(row: dict, model: ModelSpec, c: dict, fixed: dict, legacy: bool, titan: bool,
                architecture: str) -> SpaceLimits:
    """The search space the row's engine and labels allow (its engine's policy as that
    version ran on the row's GPU `architecture`, GPUSpec.architecture)."""
    # no published row recomputes a searched set of ops (Recompute.SET): only where it says so
    recomputes = ((c["recompute"],) if c["recompute"] is not None
                  else tuple(r for r in Recompute if r is not Recompute.SET))
    if "megatron-bridge" not in (row.get("framework") or "").lower():
        # module recomputation (--recompute-modules) came with Megatron-Core 0.12 (2025):
        # the NeMo 24.x, Megatron-LM and llm-foundry runs could not have used it
        recomputes = tuple(r for r in recomputes if r is not Recompute.MODULES) or recomputes
    sps = (False, True) if c["sp"] is None else (c["sp"],)
    cp_comms = _cp_exchanges(c, titan)
    # the rank order: the row's optional rank_order column, else the pipeline outermost, as
    # Megatron-LM (without --use-tp-pp-dp-mapping), NeMo and FSDP stacks lay ranks out
    orders = (c["rank_order"] or RankOrder.TP_CP_DP_PP,)
    schedules = _published_schedules(row)  # PP=1 rows ignore it
    # optimizer states stay on the GPU unless the row's sharding label says offload (DeepSpeed's
    # "ZeRO-3 offload", ZeRO-Offload: then searched, the optimizer's shard on the host or not,
    # the label not saying which states); activation offload is
    # a blank knob like recomputation: searched where the search would try it, a host reached
    # at NVLink-C2C rates (GB200/GB300: NeMo's Grace recipes name offload in config files this
    # repository does not hold, so it is not read from the row), not over PCIe
    # a torchtitan run checkpointing every N-th block recomputes 1/N of a stage's layers
    shares = ((layer_ac_share(row.get("recompute") or ""),) if c["recompute"] is Recompute.FIRST_K
              and titan else SpaceLimits().first_k_shares)
    limits = SpaceLimits(schedules=schedules, recomputes=recomputes, zero_stages=c["zero"], first_k_shares=shares,
                         allow_offload="offload" in _label(row.get("zero")),
                         activation_offload=None,
                         attention=_attention_kernels(row), sequence_parallel=sps,
                         # precision policy as the row's engine ran it: the gradients' dtype
                         # (gradient_policy); Composer FSDP "DEFAULT" keeps fp32 parameter shards
                         # (gathered in fp32, cast by autocast) and reduces in 16 bits
                         fp32_params="mp mode default" in (row.get("zero") or "").lower(),
                         checkpoint_early_stop=_is_composer(row), eager_elementwise=_is_composer(row),
                         # Megatron-LM before its async TP all-reduce (Narayanan et al.'s April
                         # 2021 runs) waited for every backward TP reduction
                         tp_async_backward="april2021" not in (row.get("source") or "").lower(),
                         tp_overlap=(False,) if legacy else (False, True),
                         max_micro_batch=max(64, fixed.get("micro_batch_size", 0)),
                         hybrid_shard=not _pytorch_fsdp_whole_group(row),
                         # token-drop recipes: capacity factor 1.0, padded
                         capacity_factors=(1.0,) if token_drop(row, model) else (None,), cp_comm_types=cp_comms,
                         rank_orders=orders, **moe_dispatch(row), **gradient_policy(row, legacy, c["precision"]),
                         **parameter_policy(row, c["precision"]))
    if titan:
        limits = torchtitan_limits(row, limits, architecture)
    elif _is_eager_deepspeed(row):
        limits = deepspeed_limits(row, limits)
    return limits


def row_setup(row: dict, path: str, line: int, hardware: str | None = None) -> RowSetup:
    """The row's model, cluster (`hardware`, a profile or preset, replaces the row's GPU),
    workload and search space."""
    c = row_cells(row, path, line)
    model = _row_model(row, c, path, line)
    legacy = _is_legacy_megatron(row)
    model = replace(model, dropout=legacy or _megatron_default_dropout(row))
    titan = _is_torchtitan(row)
    if titan:
        c["global_batch"] = _torchtitan_global_batch(c)
    for col in ("global_batch", "seq_len", "num_gpus"):
        if c[col] is None:  # lacks what a prediction needs: skipped with the reason
            raise SpecError("row", col, "", "a training row needs it (a whole number >= 1)")
    fixed, gbs = _row_fixed(row, c, titan, c["global_batch"])
    seq = c["seq_len"]
    if c["precision"] is None:
        raise SpecError("row", "precision", "", "a training row needs it (bf16, fp16, fp8, ...)")
    wl = Workload(global_batch_size=gbs, seq_len=seq, precision=c["precision"],
                  fp8_recipe=fp8_scaling(row, c["precision"], c["fp8_recipe"]),
                  expandable_segments=expandable_segments(row), **routing_policy(row))
    if c["vp"] is not None and (c["pp"] is None or c["pp"] > 1):
        fixed["vp"] = c["vp"]  # with pp blank the search then tries only pp > 1 (VP>1 needs PP>1)
    # the row's optional cluster column names the system it ran on (a preset or TOML: its
    # network tiers), else the row's GPU picks its vendor's reference cluster
    named = without_note(row.get("cluster") or "")
    cluster_name = hardware or named or gpu_cluster_for(row, path, line)
    # the GPU's architecture picks what some engine versions ran (torchtitan's attention kernel)
    limits = _row_limits(row, model, c, fixed, legacy, titan, load_cluster(cluster_name).gpu.architecture)
    return RowSetup(model=model, cluster_name=cluster_name, num_gpus=c["num_gpus"],
                    workload=wl, fixed=fixed, limits=limits, power_limit_watts=_power_limit_watts(row))


def _torchtitan_global_batch(cells: dict) -> int | None:
    """A torchtitan row's global batch: as stated, else torchtitan's default (its
    training.global_batch_size = -1: local_batch_size × the data-parallel degree, no gradient
    accumulation; its tables give the local batch)."""
    if cells["global_batch"] is None and cells["micro_batch"] and cells["dp"]:
        return cells["micro_batch"] * cells["dp"]
    return cells["global_batch"]


def _published_schedules(row: dict) -> tuple[Schedule, ...]:
    """The pipeline schedule the row names ("PP schedule Interleaved 1F1B", "4D, 1F1B" in its
    framework or notes), else those Megatron-LM, NeMo, llm-foundry and torchtitan run."""
    text = _label((row.get("framework") or "") + " " + (row.get("notes") or ""))
    if "interleaved 1f1b" in text or "interleaved1f1b" in text:
        return (Schedule.INTERLEAVED_1F1B,)
    if re.search(r"\b1f1b\b", text):
        return (Schedule.ONE_F_ONE_B,)
    return (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B)


# The first torchtitan release that compiles the loss with the blocks: 0.1.0, 2025-06-18
# (components/loss.py, `if job_config.training.compile: loss_fn = torch.compile(loss_fn)`).
# The December 2024 version of torchtitan's published tables left it eager, as did the
# checkouts still versioned 0.0.2 in early 2025 (their rows' peak memory, docs/model/memory.md).
# Where the exact commit fell between is not checkable here: torchtitan's main branch from June
# 2025 on (the month 0.1.0 was cut from it; its runs of 2025-06-14 included) is taken to
# compile it.
TORCHTITAN_LOSS_COMPILED_SINCE = (2025, 6)
# torchtitan's pipeline keeps every micro-batch's head output on the last stage to the step's
# end (torch.distributed.pipelining's output_chunks) until 0.2.1, whose train.py passes
# step(..., return_outputs=False) (0.2.0's, October 2025, does not; 0.2.1's wheel is of
# 2025-12-26): runs before December 2025 keep them. Its model returned them upcast to fp32
# (`self.output(h).float()`) until the cast moved into the loss, which 0.1.0's
# components/loss.py does (its model returns the 16-bit logits): fp32 before June 2025.
TORCHTITAN_PP_OUTPUTS_DROPPED_SINCE = (2025, 12)
# torchtitan's SDPA tries cuDNN's attention first on Blackwell from 0.1.0 (2025-06-18:
# models/attention.py, `if has_cuda_capability(10, 0): cls.backends.insert(0, CUDNN_ATTENTION)`)
# and on every NVIDIA GPU in 0.2.0 (2025-10-18: sdpa_backends = [CUDNN_ATTENTION, FLASH, ...]),
# while its per-op checkpointing's save list names the flash and memory-efficient kernels only,
# until 0.2.1 (2025-12-26) adds _scaled_dot_product_cudnn_attention (models/llama3/infra/
# parallelize.py, each wheel read): between, such a run re-runs the attention in the backward.
TORCHTITAN_CUDNN_ATTENTION_BLACKWELL_SINCE = (2025, 6)
TORCHTITAN_CUDNN_ATTENTION_NVIDIA_SINCE = (2025, 10)
TORCHTITAN_CUDNN_ATTENTION_SAVED_SINCE = (2025, 12)
_MONTHS = ("jan(?:uary)?", "feb(?:ruary)?", "mar(?:ch)?", "apr(?:il)?", "may", "june?", "july?", "aug(?:ust)?",
           "sep(?:t(?:ember)?)?", "oct(?:ober)?", "nov(?:ember)?", "dec(?:ember)?")


def _run_month(text: str) -> tuple[int, int] | None:
    """The latest (year, month) a row's notes date its run or software by: an ISO date, a
    nightly's devYYYYMMDD, or "Dec 2024"; None if they give none."""
    found = [(int(y), int(m)) for y, m in re.findall(r"\b(20\d\d)-(\d\d)-\d\d\b", text)]
    found += [(int(y), int(m)) for y, m in re.findall(r"dev(20\d\d)(\d\d)\d\d", text)]
    for month, pattern in enumerate(_MONTHS, start=1):
        found += [(int(y), month) for y in re.findall(rf"\b(?:{pattern})\.?\s+(20\d\d)\b", text, flags=re.I)]
    return max(found) if found else None


def _torchtitan_compiles_loss(row: dict) -> bool:
    """Whether the row's torchtitan compiled its loss with the blocks: a run dated June 2025 or
    later (TORCHTITAN_LOSS_COMPILED_SINCE), not on a 0.0.x version, or not dated (today's)."""
    notes = row.get("notes") or ""
    if re.search(r"torchtitan\s*(?:==|v)?\s*0\.0\.", notes, flags=re.I):
        return False
    month = _run_month(notes)
    return month is None or month >= TORCHTITAN_LOSS_COMPILED_SINCE


def _torchtitan_kept_output_bytes(row: dict) -> float:
    """Bytes per logit of the head outputs the row's torchtitan pipeline kept to the step's end
    (Plan.pp_kept_output_bytes): 4 before June 2025, 2 until December 2025, 0 since (and for
    an undated row, today's torchtitan)."""
    month = _run_month(row.get("notes") or "")
    if month is None or month >= TORCHTITAN_PP_OUTPUTS_DROPPED_SINCE:
        return 0.0
    return 4.0 if month < TORCHTITAN_LOSS_COMPILED_SINCE else 2.0


def _torchtitan_keeps_attention(row: dict, architecture: str) -> bool:
    """Whether the row's torchtitan per-op checkpointing kept the attention's output: not where
    its SDPA ran cuDNN's kernel, which its save list did not name yet (the
    TORCHTITAN_CUDNN_ATTENTION_* months; an undated row runs today's torchtitan, which keeps it)."""
    month = _run_month(row.get("notes") or "")
    if month is None or month >= TORCHTITAN_CUDNN_ATTENTION_SAVED_SINCE or architecture not in NVIDIA_ARCHITECTURES:
        return True
    since = (TORCHTITAN_CUDNN_ATTENTION_BLACKWELL_SINCE if architecture == "Blackwell"
             else TORCHTITAN_CUDNN_ATTENTION_NVIDIA_SINCE)
    return month < since


def deepspeed_limits(row: dict, limits: SpaceLimits) -> SpaceLimits:
    """An eager DeepSpeed row's plan space under DeepSpeed's policy (export/deepspeed.py
    SUPPORT: Hugging Face layers unfused, 16-bit gradient reduction, AutoTP without sequence
    parallelism or TP overlap, AutoEP's flat all-to-all not overlapped, whole-layer
    checkpointing): what the row states beyond it (pipeline stages of a PipelineModule, a
    recomputation label) is kept, as the row ran it."""
    engine = DEEPSPEED.limits
    stated = _label(row.get("recompute"))
    return replace(DEEPSPEED.with_policy(limits), sequence_parallel=(False,), tp_overlap=(False,),
                   hierarchical_a2a=engine.hierarchical_a2a, ep_overlap=engine.ep_overlap,
                   recomputes=limits.recomputes if stated else engine.recomputes)


def torchtitan_limits(row: dict, limits: SpaceLimits, architecture: str) -> SpaceLimits:
    """A torchtitan row's plan space under torchtitan's own policy (export/torchtitan.py
    SUPPORT: FSDP2 with fp32 gradient reduction, unfused layers, DTensor TP), compiled where
    the framework cell says torch.compile (the loss too from torchtitan 0.1.0 on), with async TP
    only where it says so, and per-op checkpointing keeping the attention as its version did
    on the row's GPU `architecture` (GPUSpec.architecture)."""
    framework = _label(row.get("framework"))
    engine = TORCHTITAN.limits
    compiled = "compile" in framework
    return replace(TORCHTITAN.with_policy(limits), compiled=compiled,
                   compiled_loss=compiled and _torchtitan_compiles_loss(row), engine_rule=engine.engine_rule,
                   pp_kept_output_bytes=_torchtitan_kept_output_bytes(row),
                   op_sac_attention_kept=_torchtitan_keeps_attention(row, architecture),
                   tp_overlap=(True,) if "async tp" in framework or "asynctp" in framework else (False,),
                   hierarchical_a2a=engine.hierarchical_a2a,
                   ep_overlap=engine.ep_overlap)


def predicted_metric(metric: str, row: dict, setup: RowSetup, est) -> float:
    """Convert an Estimate to the row's metric with the source's FLOP convention."""
    model, wl, n = setup.model, setup.workload, setup.num_gpus
    notes = (row.get("notes") or "").lower()
    if metric == "iteration_time_s":
        return est.step_time_s
    if metric == "tokens_per_s_per_gpu":
        return est.tokens_per_s_per_gpu
    if metric == "samples_per_s":
        return est.tokens_per_s / wl.seq_len
    if metric in ("model_tflops_per_gpu", "mfu_pct"):
        if "96*b*s*l*h^2" in notes:  # Narayanan et al. Eq. (3), counts recomputation
            flops = megatron_flops_per_iteration(model, wl.global_batch_size, wl.seq_len) / est.step_time_s / n
        else:  # Megatron-Core / NeMo num_floating_point_operations: 6N + full-s² attention
            flops = model_flops_per_token(model, wl.seq_len) * est.tokens_per_s_per_gpu
        if metric == "mfu_pct":
            return 100.0 * flops / load_cluster(setup.cluster_name).gpu.peak(wl.precision)
        return flops / TERA
    if metric == "activation_memory_gib":
        return est.memory.activations_bytes / GIB
    if metric == "weights_grads_optimizer_memory_gib":
        return est.memory.model_states_bytes / GIB
    if metric == "total_memory_gib":
        return est.memory.total / GIB
    if metric == PEAK_METRIC:  # the counter the row's source reports (validate/memory.py)
        return predicted_peak(row, logged_memory(row, setup, est))["predicted"]
    raise AssertionError(metric)


def logged_memory(row: dict, setup: RowSetup, est):
    """The memory breakdown of the rank whose peak the row's source reports: the worst stage,
    or, where it logs the last rank's allocated peak (Megatron-LM), the last stage's. A
    reserved peak keeps the worst stage's replayed allocator (no source logs one rank's)."""
    if est.plan.pp == 1 or not logs_last_rank(row) or memory_stat(row) is not MemoryStat.ALLOCATED:
        return est.memory
    return plan_memory(setup.model, row_cluster(setup), setup.workload, est.plan, stage=LAST_STAGE)[0]


def best_estimate(row: dict, setup: RowSetup, cluster: ClusterSpec):
    """(the Estimate of the plan chosen for the row's blank knobs on `cluster`, a note)."""
    memory_metric = row["metric_id"].strip().endswith("_gib")
    kw = dict(limits=setup.limits, fixed=setup.fixed, top_k=1, resimulate=4)
    note = None
    try:
        res = search(setup.model, cluster, setup.workload, require_fit=not memory_metric, **kw)
    except NoPlanFitsError as exc:
        # The published run did fit: predict its speed anyway and say that our memory model
        # disagrees (a finding about the memory model, not a reason to skip the row).
        res = search(setup.model, cluster, setup.workload, require_fit=False, **kw)
        note = f"paraplan's memory model says this does not fit ({exc})"
    return res.ranked[0], note


def predict_on(row: dict, setup: RowSetup, cluster: ClusterSpec) -> tuple[float, str, str | None]:
    """(the row's metric predicted on `cluster`, the plan chosen for its blank knobs, a note)."""
    est, note = best_estimate(row, setup, cluster)
    return predicted_metric(row["metric_id"].strip(), row, setup, est), est.plan.describe(), note


def row_cluster(setup: RowSetup) -> ClusterSpec:
    """The cluster a row is predicted on (its GPU's reference cluster, or --hardware), at the
    power limit its GPU cell states."""
    return load_cluster(setup.cluster_name, num_gpus=setup.num_gpus).with_power_limit(setup.power_limit_watts)


def predict_row(row: dict, path: str, line: int, hardware: str | None = None) -> dict:
    """One row's prediction; `hardware` (a profile TOML or cluster preset) replaces the
    cluster chosen from the row's GPU (e.g. a `paraplan calibrate` profile)."""
    out = row_result(row, path, line, METRICS)
    peak = out["metric_id"] == PEAK_METRIC
    if peak:  # a row whose configuration is not public is skipped with its tag, whatever its cells
        check_complete(row, path, line)
    row_cells(row, path, line)  # a malformed cell skips the row with its reason, before an unknown metric would
    if out["skipped"]:
        return out
    setup = row_setup(row, path, line, hardware)
    cluster = row_cluster(setup)
    out.update(gpu=cluster.gpu.name, moe=setup.model.is_moe)  # what the summary groups by
    if not peak:
        pred, plan, note = predict_on(row, setup, cluster)
        return with_prediction(out, pred, plan, note)
    est, note = best_estimate(row, setup, cluster)
    details = predicted_peak(row, logged_memory(row, setup, est))
    out = with_prediction(out, details.pop("predicted"), est.plan.describe(), note)
    out.update(details)
    return out


def read_training_rows(path: str) -> list[tuple[int, dict]]:
    """(line, row) of every row of a training-measurements file (see rows.read_rows)."""
    return read_rows(path, REQUIRED_COLUMNS, "a training file", KNOWN_COLUMNS + tuple(SHAPE_COLUMNS))


def validate_file(path: str, progress=None, hardware: str | None = None) -> dict:
    rows = read_training_rows(path)
    return validate_rows(rows, lambda row, line: predict_row(row, path, line, hardware), progress)
