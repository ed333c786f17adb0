"""What a published training run's engine and recipe ran, where its row does not say: the MoE
dispatch and EP overlap its notes name, the gradients' dtype of its engine's recipes, whether it
dropped tokens, and how its router routed (each read from the engine's released code, cited
beside it). `validate/training.py` turns them into the row's search space and workload."""

from __future__ import annotations

import re

from ..cost.low_precision import LOW_PRECISIONS
from ..specs.model import ModelSpec
from ..specs.workload import Fp8Recipe, Precision

# EP overlap where a row names it (Megatron-Core --overlap-moe-expert-parallel-comm,
# Megatron-Bridge comm_overlap.overlap_moe_expert_parallel_comm / moe_a2a_overlap)
_EP_OVERLAP = re.compile(r"overlap[-_ ]moe[-_ ]expert[-_ ]parallel[-_ ]comm|moe[-_ ]a2a[-_ ]overlap|\b(ep|a2a|all-to-all)"
                         r"[- ]overlap", re.IGNORECASE)
# the dispatcher where a row names it: the alltoall dispatcher's flat all-to-all, or the flex
# dispatcher's deduplicating one (DeepEP, HybridEP)
_FLAT_DISPATCH = re.compile(r"\balltoall dispatcher|dispatcher[ :=]*alltoall", re.IGNORECASE)
_DEDUP_DISPATCH = re.compile(r"\bflex dispatcher|dispatcher[ :=]*flex|deepep|hybridep", re.IGNORECASE)


def moe_dispatch(row: dict) -> dict:
    """The MoE dispatch a row's run may have used (SpaceLimits fields): the flat or the
    deduplicating dispatch as its notes name it, else either (searched); EP overlap only where
    they name it. Megatron-Core's default is off (transformer_config.py,
    overlap_moe_expert_parallel_comm = False, 0.16.1), as in Megatron-Bridge's recipes
    (`# cfg.comm_overlap.overlap_moe_expert_parallel_comm = False`, 0.4.0) and in all but a few
    of its published performance recipes (perf_recipes/, 0.6.0: Qwen3-235B and Qwen3-30B on H100,
    DeepSeek-V3 MXFP8/NVFP4 on B200, GPT-OSS on GB200); the eager engines have none."""
    text = (row.get("framework") or "") + " " + (row.get("notes") or "")
    flat, dedup = bool(_FLAT_DISPATCH.search(text)), bool(_DEDUP_DISPATCH.search(text))
    return {"hierarchical_a2a": dedup or not flat, "ep_overlap": bool(_EP_OVERLAP.search(text))}


# The MoE models whose NeMo 2 performance recipes drop tokens: MegatronTokenDropCallback
# (capacity factor 1.0, expert inputs padded to capacity; it asserts the alltoall dispatcher) in
# the performance mode of NeMo's Mixtral recipes (nemo_toolkit 2.0.0 on, the 24.09 containers)
# and Llama 4 recipes (2.3.0 on), in scripts/performance/llm/pretrain_deepseek_v3.py
# (USE_TOKEN_DROP = True, 2.3.0 on) and pretrain_qwen3_*.py (2.4.0 on); NeMo has no Grok-1 recipe
NEMO_TOKEN_DROP_MODELS = ("mixtral-8x7b", "mixtral-8x22b", "llama4-maverick", "llama4-scout", "deepseek-v3",
                          "qwen3-235b-a22b", "qwen3-30b-a3b")
# a NeMo 2 container as rows name it ("NeMo 25.04.01 (dgxc v25.05.04)", "NeMo 25.02 (NeMo 2.0 /
# Megatron-Core)"); Megatron-Bridge's rows ("... (NeMo 26.02)") run its own recipes
_NEMO_CONTAINER = re.compile(r"^nemo (\d\d)\.(\d\d)")


def nemo2_container(row: dict) -> tuple[int, int] | None:
    """(year, month) of the NeMo 2 container a row names (24.09 on, nemo_toolkit 2.0.0 on), else None."""
    m = _NEMO_CONTAINER.match((row.get("framework") or "").strip().lower())
    version = (int(m[1]), int(m[2])) if m else None
    return version if version and version >= (24, 9) else None


def gradient_policy(row: dict, legacy: bool, precision: Precision | None) -> dict:
    """The gradients' dtype as the row's run kept and reduced them (SpaceLimits fields):
    - Megatron-LM's command line in BF16 accumulates and reduces in fp32 (validate_args sets
      accumulate_allreduce_grads_in_fp32 unless --grad-reduce-in-bf16; arguments.py, core_v0.16.1),
      as 2021–22 Megatron-LM did in FP16;
    - NeMo 2's performance scripts turn it off for FP8 from nemo_toolkit 2.3.0 (the 25.04
      containers; scripts/performance/utils.py set_primary_perf_configs) and for every precision
      from 2.4.0 (25.07; helpers.py set_precision_configs); before, MegatronMixedPrecision's
      default grad_reduce_in_fp32=True held;
    - Megatron-Bridge's performance recipes turn it off (perf_recipes/_common.py _perf_precision,
      0.6.2: "Always sets grad_reduce_in_fp32=False");
    and Megatron-Core then keeps a 16-bit gradient buffer (Plan.grad_buffer_16bit). Other rows
    keep the 16-bit reduction and fp32 gradients they were priced with. `precision`: the row's, parsed."""
    framework = (row.get("framework") or "").strip().lower()
    if "megatron-bridge" in framework:
        return {"grad_reduce_fp32": False, "grad_buffer_16bit": True}
    version = nemo2_container(row)
    if version:
        low = precision in LOW_PRECISIONS
        off = version >= (25, 7) or (version >= (25, 4) and low)
        return {"grad_reduce_fp32": not off, "grad_buffer_16bit": off}
    megatron_cli = framework.startswith("megatron-lm") or framework.startswith("megatron-core r")
    return {"grad_reduce_fp32": legacy or megatron_cli, "grad_buffer_16bit": False}


_MXFP8 = re.compile(r"mxfp8|fp8-mx|\bmx\b", re.IGNORECASE)
_CURRENT_SCALING = re.compile(r"current|\bcs\b|fp8-cs|" + _MXFP8.pattern, re.IGNORECASE)
_DELAYED_SCALING = re.compile(r"delayed|\bds\b|fp8-ds", re.IGNORECASE)


def fp8_scaling(row: dict, precision: Precision | None, recipe: Fp8Recipe) -> Fp8Recipe:
    """The scaling recipe of a per-tensor FP8 row as its engine ran it (Workload.fp8_recipe):
    what its precision label or notes say (current scaling, MXFP8: per-tensor as priced;
    delayed), else its engine's default: delayed scaling for Megatron-LM's command line
    (arguments.py --fp8-recipe, default 'delayed', core_v0.16.1) and NeMo's performance runs
    (nemo_toolkit 2.3.0 scripts/performance/utils.py: `if fp8_recipe is None: fp8_recipe = "ds"`;
    NeMo 1 had no other), current scaling for Megatron-Bridge's (its FP8 benchmarks are
    FP8-CS or MXFP8, perf_recipes/_common.py _perf_precision) and any other engine."""
    if precision is not Precision.FP8 or recipe is not Fp8Recipe.TENSORWISE:
        return recipe
    for text in (row.get("precision") or "", row.get("notes") or ""):  # the label first
        if _DELAYED_SCALING.search(text):
            return Fp8Recipe.DELAYED
        if _CURRENT_SCALING.search(text):
            return Fp8Recipe.TENSORWISE
    framework = (row.get("framework") or "").strip().lower()
    megatron_cli = framework.startswith("megatron-lm") or framework.startswith("megatron-core r")
    return Fp8Recipe.DELAYED if framework.startswith("nemo") or megatron_cli else Fp8Recipe.TENSORWISE


def parameter_policy(row: dict, precision: Precision | None) -> dict:
    """Whether the row's FP8 or NVFP4 run kept its weights quantized and gathered them so
    (SpaceLimits.low_precision_params; Megatron-Core --fp8-param-gather / fp4_param):
    - Megatron-Bridge's mixed-precision recipes set it for every FP8 recipe but sub-channel
      scaling and for NVFP4 (training/mixed_precision.py, 0.6.2: bf16_with_fp8_delayed_scaling,
      _current_scaling and _mxfp8_mixed set fp8_param_gather, bf16_with_nvfp4_mixed
      fp4_param_gather, each of which sets the parameter flag with it);
    - NeMo 2's FP8 precision plugins for per-tensor scaling set it and its MXFP8 one does not
      (nemo_toolkit 2.3.0 llm/recipes/precision/mixed_precision.py: bf16_with_fp8_mixed and
      bf16_with_fp8_current_scaling_mixed fp8_param_gather=True, bf16_with_mxfp8_mixed False);
      NeMo 1's performance runs (the 24.03 and 24.07 containers' tables) are taken to have set
      its `fp8_params` as well: an ASSUMPTION (their configurations are not in the sources),
      which their 340B and 175B runs fitting without recomputation agree with;
    - Megatron-LM's command line does not unless asked (--fp8-param-gather), nor do other rows."""
    if precision not in LOW_PRECISIONS:
        return {}
    framework = (row.get("framework") or "").strip().lower()
    label = (row.get("precision") or "").lower()
    sub_channel = re.search(r"sub-?channel|blockwise|block[ _-]?scaling|\bsc\b", label) is not None
    if "megatron-bridge" in framework:
        return {"low_precision_params": not sub_channel}
    if framework.startswith("nemo"):
        return {"low_precision_params": not sub_channel and not _MXFP8.search(label)}
    return {}


# a row that fine-tunes a trained model (its router is trained), and one that says it ran on
# synthetic tokens; "q-lora"/"kv-lora" (MLA's ranks) are not LoRA
_FINE_TUNING = re.compile(r"fine-?tun|\bsft\b|\bpeft\b|(?<![\w-])lora\b", re.IGNORECASE)
_SYNTHETIC_DATA = re.compile(r"\bmock\b|synthetic", re.IGNORECASE)


def routing_policy(row: dict) -> dict:
    """How the row's dropless MoE run routed (Workload fields). Uniform random routing, the
    router as initialized (Workload.moe_routing_at_init), where the run is known to have it:
    "force-balanced token distribution" (Megatron-Bridge's MoE benchmarks) is Megatron-Core's
    moe_router_force_load_balancing, which replaces every token's router logits with standard
    normal draws (0.16.1 transformer/moe/moe_utils.py RandomSTE: `logits.clone().normal_()`), so
    each token's top-k is uniformly random; and a run from random weights on i.i.d. synthetic
    tokens -- NeMo 2's performance scripts pretrain on MockDataModule (nemo_toolkit 2.3.0
    llm/gpt/data/mock.py: uniform random token ids), or the notes say mock or synthetic data.
    A run that fine-tunes has a trained router, and any other row keeps the stated imbalance."""
    text = " ".join(row.get(col) or "" for col in ("model", "source", "notes"))
    if "force-balanced" in text.lower():
        return {"moe_routing_at_init": True}
    if _FINE_TUNING.search(text):
        return {}
    at_init = nemo2_container(row) is not None or _SYNTHETIC_DATA.search(text) is not None
    return {"moe_routing_at_init": True} if at_init else {}


def token_drop(row: dict, model: ModelSpec) -> bool:
    """Whether the row's MoE run dropped tokens at capacity factor 1.0, padded: its model or
    notes say so (Megatron-Bridge's token-drop recipes), or it ran NeMo 2's performance recipe
    of a model that drops tokens (NEMO_TOKEN_DROP_MODELS, from 24.09 on)."""
    text = (row.get("model", "") + " " + row.get("notes", "")).lower()
    if "tokendrop" in text or "token-drop" in text or "token drop" in text:
        return True
    return nemo2_container(row) is not None and model.name in NEMO_TOKEN_DROP_MODELS
