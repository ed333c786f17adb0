"""Read a local Hugging Face `config.json` into a ModelSpec (dense decoder-only models).

Each family names its fields differently (GPT-2: n_layer, n_embd, n_head, n_inner; Falcon:
n_head_kv / multi_query). Defaults follow the transformers config classes: `LlamaConfig`
unties embeddings, `GPT2Config` and `FalconConfig` tie them, and the base
`PretrainedConfig` ties them, which is the fallback for families not listed here.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ..errors import FileFormatError, SpecError
from .files import read_text
from .model import ModelSpec, make_model


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
_GENERIC = _Family(**_LLAMA_KEYS, gated=None, tied_default=True)
_GATED_ACTS = ("silu", "swiglu", "swish", "geglu", "reglu")
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def _line_of(text: str, key: str) -> int | None:
    m = re.search(rf'"{re.escape(key)}"\s*:', text)
    return text.count("\n", 0, m.start()) + 1 if m else None


def model_from_hf_config(path: str | os.PathLike) -> ModelSpec:
    """ModelSpec from a Hugging Face config.json (or a model directory that holds one)."""
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    shown = str(path)
    text = read_text(path, shown)
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise FileFormatError(shown, f"invalid JSON: {e.msg} (column {e.colno})", e.lineno) from None
    if not isinstance(cfg, dict):
        raise FileFormatError(shown, "a Hugging Face config.json must hold one JSON object")

    def fail(key: str, detail: str) -> NoReturn:
        raise FileFormatError(shown, detail, _line_of(text, key))

    for key in _MOE_KEYS:
        if cfg.get(key):
            fail(key, f"field '{key}' = {cfg[key]!r}: mixture-of-experts configs are not supported "
                      f"by the dense ModelSpec")

    model_type = cfg.get("model_type", "")
    if not isinstance(model_type, str):
        fail("model_type", f"field 'model_type' = {model_type!r} is not allowed; a string is required")
    family = _FAMILIES.get(model_type, _GENERIC)

    def get_int(keys: tuple[str, ...], required: bool = True) -> int | None:
        for key in keys:
            v = cfg.get(key)
            if v is None:
                continue
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                fail(key, f"field '{key}' = {v!r} is not allowed; a positive integer is required")
            return v
        if required:
            kind = f"a {model_type!r} config" if model_type else "a config without model_type"
            raise FileFormatError(shown, f"field '{keys[0]}' missing ({kind} needs it)")
        return None

    num_layers = get_int(family.layers)
    hidden_size = get_int(family.hidden)
    num_heads = get_int(family.heads)
    ffn = get_int(family.ffn, required=family.ffn_default_mult is None)
    if ffn is None:
        ffn = family.ffn_default_mult * hidden_size
    vocab_size = get_int(("vocab_size",))

    if family is _FAMILIES["falcon"]:
        # Falcon: new_decoder_architecture -> num_kv_heads groups; else multi_query (default) -> 1.
        if cfg.get("new_decoder_architecture"):
            num_kv_heads = get_int(("num_kv_heads", "n_head_kv"), required=False) or num_heads
        elif cfg.get("multi_query", True):
            num_kv_heads = 1
        else:
            num_kv_heads = num_heads
    else:
        num_kv_heads = get_int(("num_key_value_heads",), required=False) or num_heads

    gated = family.gated
    if gated is None:
        act = cfg.get("hidden_act", cfg.get("activation_function", ""))
        gated = isinstance(act, str) and act.lower() in _GATED_ACTS

    tied = cfg.get("tie_word_embeddings", family.tied_default)
    if not isinstance(tied, bool):
        fail("tie_word_embeddings", f"field 'tie_word_embeddings' = {tied!r} is not allowed; "
                                    f"true or false is required")

    name = cfg.get("_name_or_path") or (path.parent.name if path.name == "config.json" else path.stem)
    try:
        return make_model(
            name=str(name) or "hf-model", num_layers=num_layers, hidden_size=hidden_size,
            ffn_hidden_size=ffn, num_heads=num_heads, num_kv_heads=num_kv_heads,
            head_dim=get_int(("head_dim",), required=False), vocab_size=vocab_size,
            gated_mlp=gated, tied_embeddings=tied, max_seq_len=get_int(family.seq, required=False) or 0,
            source=f"Hugging Face config {path}")
    except SpecError as e:
        raise FileFormatError(shown, str(e)) from None
