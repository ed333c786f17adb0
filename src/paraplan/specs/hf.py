"""Read a local Hugging Face `config.json` into a ModelSpec (decoder-only, dense or MoE).

Each family names its fields differently (GPT-2: n_layer, n_embd, n_head, n_inner; Falcon:
n_head_kv / multi_query). Defaults follow the transformers config classes: `LlamaConfig`
unties embeddings, `GPT2Config` and `FalconConfig` tie them, and the base
`PretrainedConfig` ties them, which is the fallback for families not listed here.

Mixture-of-experts families (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3 and Kimi K2, gpt-oss,
Llama 4) map their expert fields onto ModelSpec's; DeepSeek's multi-head latent attention
maps its ranks. Which layers are MoE must fit ModelSpec's layout (see `_moe_layout`); a config
that does not fit, or an MoE family not listed here, is refused with the field that says so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ..errors import FileFormatError, SpecError
from .files import MAX_COUNT, parse_json, read_text
from .model import MAX_LAYERS, ModelSpec, make_model


@dataclass(frozen=True)
class _Family:
    layers: tuple[str, ...]  # accepted key names, first match wins
    hidden: tuple[str, ...]
    heads: tuple[str, ...]
    ffn: tuple[str, ...]
    seq: tuple[str, ...]
    gated: bool | None  # None: from hidden_act
    tied_default: bool
    ffn_default_mult: int | None = None  # ffn = mult * hidden when the key is absent


_LLAMA_KEYS = dict(layers=("num_hidden_layers",), hidden=("hidden_size",), heads=("num_attention_heads",),
                   ffn=("intermediate_size",), seq=("max_position_embeddings",))
_GATED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "olmo2", "granite",
                   "phi3", "cohere", "stablelm", "internlm2", "exaone", "smollm3")
_TIED_BY_DEFAULT = ("gemma", "gemma2", "cohere")  # their config classes default to tied embeddings
_FAMILIES = {m: _Family(**_LLAMA_KEYS, gated=True, tied_default=m in _TIED_BY_DEFAULT)
             for m in _GATED_FAMILIES}
_FAMILIES.update({
    "gpt2": _Family(layers=("n_layer",), hidden=("n_embd",), heads=("n_head",), ffn=("n_inner",),
                    seq=("n_positions", "n_ctx"), gated=False, tied_default=True, ffn_default_mult=4),
    "gpt_neox": _Family(**_LLAMA_KEYS, gated=False, tied_default=False),
    "falcon": _Family(layers=("num_hidden_layers", "n_layer"), hidden=("hidden_size",),
                      heads=("num_attention_heads", "n_head"), ffn=("ffn_hidden_size",),
                      seq=("max_position_embeddings",), gated=False, tied_default=True, ffn_default_mult=4),
})
_FAMILIES["RefinedWeb"] = _FAMILIES["RefinedWebModel"] = _FAMILIES["falcon"]  # early Falcon configs
# MoE families: SwiGLU experts, untied by default (MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig,
# DeepseekV2Config, DeepseekV3Config, GptOssConfig, Llama4TextConfig). `ffn` is the dense MLP.
_DEEPSEEK = ("deepseek_v2", "deepseek_v3", "kimi_k2")  # Kimi K2 is the DeepSeek-V3 architecture
_MOE_FAMILIES = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss") + _DEEPSEEK
_FAMILIES.update({m: _Family(**_LLAMA_KEYS, gated=True, tied_default=False) for m in _MOE_FAMILIES})
# Llama 4: the dense layers' MLP is intermediate_size_mlp; intermediate_size is the experts'.
_FAMILIES["llama4_text"] = _Family(**{**_LLAMA_KEYS, "ffn": ("intermediate_size_mlp",)}, gated=True,
                                   tied_default=False)
_GENERIC = _Family(**_LLAMA_KEYS, gated=None, tied_default=True)
_GATED_ACTS = ("silu", "swiglu", "swish", "geglu", "reglu")
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# Config keys a ModelSpec field comes from (the first present), so that a value ModelSpec
# refuses (top_k above the expert count, kv heads that do not divide heads) points at its line.
_SOURCE_KEYS = {
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv"),
    "head_dim": ("head_dim",),
    "top_k": ("experts_per_token", "num_experts_per_tok"),
    "num_experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "mtp_layers": ("num_nextn_predict_layers",),
    "expert_groups": ("n_group",),
    "group_top_k": ("topk_group",),
}


def _line_of(text: str, key: str, start: int = 0) -> int | None:
    m = re.compile(rf'"{re.escape(key)}"\s*:').search(text, start)
    return text.count("\n", 0, m.start()) + 1 if m else None


@dataclass(frozen=True)
class _Config:
    """One JSON object of a config file (the file itself, or Llama 4's `text_config`), with
    the helpers that read its fields and fail naming the file, line and field."""

    data: dict
    shown: str  # file name as shown in errors
    text: str  # raw file text, to find line numbers
    start: int = 0  # offset of this object in `text` (a nested text_config)
    model_type: str = ""

    def fail(self, key: str, detail: str) -> NoReturn:
        raise FileFormatError(self.shown, detail, _line_of(self.text, key, self.start))

    def int_(self, keys: tuple[str, ...], required: bool = True, minimum: int = 1,
             maximum: int = MAX_COUNT) -> int | None:
        """The first of `keys` present and not null; an integer from `minimum` to `maximum`."""
        for key in keys:
            v = self.data.get(key)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v <= maximum:
                self.fail(key, f"field '{key}' = {v!r} is not allowed; an integer from {minimum} to {maximum} "
                               "is required")
            return v
        if required:
            kind = f"a {self.model_type!r} config" if self.model_type else "a config without model_type"
            raise FileFormatError(self.shown, f"field '{keys[0]}' missing ({kind} needs it)")
        return None

    def count(self, key: str) -> int:
        """A non-negative integer; absent or null reads as 0 (not used)."""
        return self.int_((key,), required=False, minimum=0) or 0

    def layer_list(self, key: str, num_layers: int) -> list[int] | None:
        """A list of layer indices in [0, num_layers), or None when absent."""
        v = self.data.get(key)
        if v is None:
            return None
        if not isinstance(v, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in v):
            self.fail(key, f"field '{key}' = {v!r} is not allowed; a list of layer indices in "
                           f"0..{num_layers - 1} is required")
        return v


def _moe_layout(is_moe: list[bool]) -> tuple[int, int] | None:
    """(num_dense_layers l_d, moe_layer_interval i) such that layer j is MoE exactly when
    j >= l_d and (j - l_d + 1) % i == 0 (the last layer of each group of i, as Llama 4's
    interleave_moe_layer_step and Qwen's decoder_sparse_step place them); None if none does."""
    if True not in is_moe:
        return None
    first = is_moe.index(True)
    for interval in range(1, first + 2):
        dense = first - interval + 1
        if all(m == (j >= dense and (j - dense + 1) % interval == 0) for j, m in enumerate(is_moe)):
            return dense, interval
    return None


def _layout_fields(c: _Config, is_moe: list[bool], key: str) -> dict:
    """num_dense_layers / moe_layer_interval for the MoE layers `is_moe`, or a failure naming
    `key`, the field that placed them."""
    layout = _moe_layout(is_moe)
    if layout is None:
        moe = [j for j, m in enumerate(is_moe) if m]
        if not moe:
            c.fail(key, f"field '{key}' = {c.data.get(key)!r} leaves no mixture-of-experts layer "
                        f"in {len(is_moe)} layers; an MoE config needs at least one")
        shown = ", ".join(map(str, moe[:8])) + (", ..." if len(moe) > 8 else "")
        c.fail(key, f"field '{key}' = {c.data.get(key)!r}: MoE layers [{shown}] cannot be expressed as "
                    f"leading dense layers, then one MoE layer every moe_layer_interval layers "
                    f"(the last of each group)")
    return {"num_dense_layers": layout[0], "moe_layer_interval": layout[1]}


def _expert_group_fields(c: _Config) -> dict:
    """Group-limited routing of a DeepSeek-family config: n_group groups, topk_group chosen per
    token (DeepSeek-V2 "group_limited_greedy", V3 "noaux_tc"; modeling_deepseek.py MoEGate).
    topk_method "greedy" routes over all experts whatever n_group says, as does n_group 1."""
    groups, chosen = c.count("n_group"), c.count("topk_group")
    if groups <= 1 or c.data.get("topk_method") == "greedy":
        return {}
    return {"expert_groups": groups, "group_top_k": chosen}


def _moe_mla_fields(c: _Config, family: str, num_layers: int) -> dict:
    """ModelSpec's mixture-of-experts and latent-attention fields of an MoE family's config."""
    layers = range(num_layers)
    if family in ("mixtral", "gpt_oss"):
        # Every layer MoE; intermediate_size is each expert's width. gpt-oss names top-k
        # experts_per_token (newer configs also num_experts_per_tok).
        return {"num_experts": c.int_(("num_local_experts",)),
                "top_k": c.int_(("experts_per_token", "num_experts_per_tok") if family == "gpt_oss"
                                else ("num_experts_per_tok",)),
                "moe_ffn_hidden_size": c.int_(("intermediate_size",))}
    if family in ("qwen2_moe", "qwen3_moe"):
        # transformers Qwen2MoeDecoderLayer: MoE unless in mlp_only_layers, and only every
        # decoder_sparse_step-th layer ((j + 1) % step == 0).
        step = c.int_(("decoder_sparse_step",), required=False) or 1
        mlp_only = c.layer_list("mlp_only_layers", num_layers) or []
        is_moe = [j not in mlp_only and (j + 1) % step == 0 for j in layers]
        return {"num_experts": c.int_(("num_experts",)), "top_k": c.int_(("num_experts_per_tok",)),
                "moe_ffn_hidden_size": c.int_(("moe_intermediate_size",)),
                "shared_expert_ffn_hidden_size": c.count("shared_expert_intermediate_size"),
                **_layout_fields(c, is_moe, "mlp_only_layers" if mlp_only else "decoder_sparse_step")}
    if family in _DEEPSEEK:
        # DeepseekV3DecoderLayer: MoE when j >= first_k_dense_replace and j % moe_layer_freq == 0.
        # n_shared_experts experts of moe_intermediate_size act as one of their total width.
        first_dense = c.count("first_k_dense_replace")
        freq = c.int_(("moe_layer_freq",), required=False) or 1
        is_moe = [j >= first_dense and j % freq == 0 for j in layers]
        moe_ffn = c.int_(("moe_intermediate_size",))
        nope, rope = c.int_(("qk_nope_head_dim",)), c.int_(("qk_rope_head_dim",))
        return {"num_experts": c.int_(("n_routed_experts",)), "top_k": c.int_(("num_experts_per_tok",)),
                "moe_ffn_hidden_size": moe_ffn,
                "shared_expert_ffn_hidden_size": c.count("n_shared_experts") * moe_ffn,
                **_layout_fields(c, is_moe, "moe_layer_freq" if freq > 1 else "first_k_dense_replace"),
                # DeepSeek-V2 report Sec. 2.1: q_lora_rank null = full-rank query projection.
                "q_lora_rank": c.count("q_lora_rank"), "kv_lora_rank": c.int_(("kv_lora_rank",)),
                "head_dim": nope + rope, "qk_rope_head_dim": rope, "v_head_dim": c.int_(("v_head_dim",)),
                **_expert_group_fields(c)}
    if family == "llama4_text":
        # Llama4TextConfig: moe_layers defaults to every interleave_moe_layer_step-th layer,
        # range(step - 1, l, step); each MoE layer adds one shared expert of intermediate_size.
        step = c.int_(("interleave_moe_layer_step",), required=False) or 1
        listed = c.layer_list("moe_layers", num_layers)
        moe = set(range(step - 1, num_layers, step) if listed is None else listed)
        moe_ffn = c.int_(("intermediate_size",))
        return {"num_experts": c.int_(("num_local_experts",)), "top_k": c.int_(("num_experts_per_tok",)),
                "moe_ffn_hidden_size": moe_ffn, "shared_expert_ffn_hidden_size": moe_ffn,
                **_layout_fields(c, [j in moe for j in layers],
                                 "moe_layers" if listed is not None else "interleave_moe_layer_step")}
    raise AssertionError(family)


def _sliding_window_fields(c: _Config, num_layers: int) -> dict:
    """sliding_window and how many layers use it: `layer_types` ("sliding_attention" per
    layer: GPT-OSS, Gemma 2/3, recent configs) when given; else Mistral's `sliding_window` on
    every layer; else Qwen2's `use_sliding_window` above `max_window_layers`. None: no field."""
    types = c.data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != num_layers or not all(isinstance(x, str) for x in types):
            c.fail("layer_types", f"field 'layer_types' is not allowed; a list of {num_layers} strings is required")
        n = sum(1 for x in types if x == "sliding_attention")
    elif c.model_type == "mistral":
        n = num_layers if c.data.get("sliding_window") is not None else 0
    elif c.model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and c.data.get("use_sliding_window") is True:
        n = num_layers - min(c.count("max_window_layers"), num_layers)
    else:
        n = 0
    if not n:
        return {}
    return {"sliding_window": c.int_(("sliding_window",)), "num_sliding_window_layers": n}


def _rope_fields(c: _Config) -> dict:
    """rope_theta, and Llama 3.1's frequency scaling (rope_scaling.rope_type "llama3"); other
    scalings (YaRN, linear, dynamic) are not modelled and left out."""
    out = {}
    theta = c.data.get("rope_theta")
    if theta is not None:
        if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not 0 < theta < float("inf"):
            c.fail("rope_theta", f"field 'rope_theta' = {theta!r} is not allowed; a positive number is required")
        out["rope_theta"] = float(theta)
    scaling = c.data.get("rope_scaling")
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor = scaling.get("factor")
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor < float("inf"):
            c.fail("rope_scaling", f"field 'rope_scaling.factor' = {factor!r} is not allowed; a positive number "
                                   "is required")
        out["rope_llama3_scaling_factor"] = float(factor)
    return out


def _language_config(path: Path) -> tuple[_Config, _Config, str]:
    """(the file's top-level config, the language model's config, its model_type): a Llama 4
    multimodal config holds the language model in `text_config`."""
    shown = str(path)
    text = read_text(path, shown)
    data = parse_json(text, shown)
    if not isinstance(data, dict):
        raise FileFormatError(shown, "a Hugging Face config.json must hold one JSON object")
    top = _Config(data, shown, text)
    model_type = data.get("model_type", "")
    if not isinstance(model_type, str):
        top.fail("model_type", f"field 'model_type' = {model_type!r} is not allowed; a string is required")
    start = 0
    if model_type == "llama4":  # multimodal: the language model is the nested text_config
        data = data.get("text_config")
        if not isinstance(data, dict):
            top.fail("text_config", f"field 'text_config' = {data!r} is not allowed; a 'llama4' config "
                                    f"needs the language model's config there")
        model_type = "llama4_text"
        m = re.search(r'"text_config"\s*:', text)
        start = m.end() if m else 0
    return top, _Config(data, shown, text, start, model_type), model_type


def _num_kv_heads(c: _Config, family, num_heads: int) -> int:
    if family is _FAMILIES["falcon"]:
        # Falcon: new_decoder_architecture -> num_kv_heads groups; else multi_query (default) -> 1.
        if c.data.get("new_decoder_architecture"):
            return c.int_(("num_kv_heads", "n_head_kv"), required=False) or num_heads
        if c.data.get("multi_query", True):
            return 1
        return num_heads
    return c.int_(("num_key_value_heads",), required=False) or num_heads


def model_from_hf_config(path: str | os.PathLike) -> ModelSpec:
    """ModelSpec from a Hugging Face config.json (or a model directory that holds one)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    shown = str(path)
    top, c, model_type = _language_config(path)
    text, data = c.text, c.data
    family = _FAMILIES.get(model_type, _GENERIC)
    moe = model_type in _MOE_FAMILIES or model_type == "llama4_text"
    if not moe:
        for key in _MOE_KEYS:
            if c.data.get(key):
                c.fail(key, f"field '{key}' = {c.data[key]!r}: mixture-of-experts configs of model_type "
                            f"{model_type!r} are not supported (supported: "
                            f"{', '.join(_MOE_FAMILIES)}, llama4)")

    num_layers = c.int_(family.layers, maximum=MAX_LAYERS)  # before any per-layer list is built
    hidden_size = c.int_(family.hidden)
    num_heads = c.int_(family.heads)
    ffn = c.int_(family.ffn, required=family.ffn_default_mult is None)
    if ffn is None:
        ffn = family.ffn_default_mult * hidden_size
    vocab_size = c.int_(("vocab_size",))
    num_kv_heads = _num_kv_heads(c, family, num_heads)

    gated = family.gated
    if gated is None:
        act = c.data.get("hidden_act", c.data.get("activation_function", ""))
        gated = isinstance(act, str) and act.lower() in _GATED_ACTS

    # Llama 4 may state tie_word_embeddings at the top level only.
    tied_at = c if "tie_word_embeddings" in c.data else top
    tied = tied_at.data.get("tie_word_embeddings", family.tied_default)
    if not isinstance(tied, bool):
        tied_at.fail("tie_word_embeddings", f"field 'tie_word_embeddings' = {tied!r} is not allowed; "
                                            f"true or false is required")

    extra = {"head_dim": c.int_(("head_dim",), required=False), **_sliding_window_fields(c, num_layers),
             # multi-token-prediction modules (DeepSeek-V3 report Sec. 2.2; also GLM-4.5, MiMo)
             "mtp_layers": c.count("num_nextn_predict_layers"), **_rope_fields(c)}
    if moe:
        # MLA configs may carry head_dim = qk_rope_head_dim (for RoPE); the MLA fields win.
        extra.update(_moe_mla_fields(c, model_type, num_layers))
        if model_type in _DEEPSEEK:
            num_kv_heads = num_heads  # MLA expands K and V per head from the shared latent

    name = data.get("_name_or_path")
    if name is not None and not isinstance(name, str):
        c.fail("_name_or_path", f"field '_name_or_path' = {name!r:.60} is not allowed; a string (the model's "
                                  "name or path) is required")
    name = name or (path.parent.name if path.name == "config.json" else path.stem)
    try:
        return make_model(
            name=str(name) or "hf-model", num_layers=num_layers, hidden_size=hidden_size,
            ffn_hidden_size=ffn, num_heads=num_heads, num_kv_heads=num_kv_heads, vocab_size=vocab_size,
            gated_mlp=gated, tied_embeddings=tied, max_seq_len=c.int_(family.seq, required=False) or 0,
            source=f"Hugging Face config {path}", **extra)
    except SpecError as e:
        key = next((k for k in _SOURCE_KEYS.get(e.field, ()) if k in c.data), None)
        raise FileFormatError(shown, f"{e} (field '{key}')" if key else str(e),
                              _line_of(text, key, c.start) if key else None) from None
