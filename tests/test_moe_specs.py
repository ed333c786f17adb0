"""Mixture-of-experts and latent-attention specs: catalog fields, presets, Hugging Face import."""

from __future__ import annotations

import csv
import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paraplan.errors import FileFormatError, SpecError
from paraplan.specs.catalog import load_model
from paraplan.specs.hf import _moe_layout, model_from_hf_config
from paraplan.specs.model import make_model
from support import assert_bad_field_names_line, write

MOE_CSV = Path(__file__).resolve().parents[1] / ".." / "shared" / "validation" / "training_dev_moe.csv"

# ---- catalog TOML fields ---------------------------------------------------------------

MOE_TOML = """\
name = "tiny-moe"
num_layers = 6
hidden_size = 256
ffn_hidden_size = 1024
num_heads = 8
num_kv_heads = 8
head_dim = 48
vocab_size = 1000
gated_mlp = true
tied_embeddings = false
num_experts = 16
top_k = 2
moe_ffn_hidden_size = 128
shared_expert_ffn_hidden_size = 256
num_dense_layers = 2
moe_layer_interval = 2
q_lora_rank = 0
kv_lora_rank = 64
qk_rope_head_dim = 16
v_head_dim = 32
"""


def test_toml_moe_mla_fields_load(tmp_path):
    m = load_model(str(write(tmp_path, "tiny-moe.toml", MOE_TOML)))
    assert (m.num_experts, m.top_k, m.moe_ffn_hidden_size, m.shared_expert_ffn_hidden_size) == (16, 2, 128, 256)
    assert (m.num_dense_layers, m.moe_layer_interval, m.num_moe_layers) == (2, 2, 2)
    assert (m.q_lora_rank, m.kv_lora_rank, m.qk_rope_head_dim, m.v_head_dim) == (0, 64, 16, 32)
    assert m.is_moe and m.is_mla


def test_toml_moe_fields_default_to_dense(tmp_path):
    text = "\n".join(line for line in MOE_TOML.splitlines()[:10]) + "\n"
    m = load_model(str(write(tmp_path, "dense.toml", text)))
    assert not m.is_moe and not m.is_mla and m.moe_layer_interval == 1


@pytest.mark.parametrize("old,new,field", [
    ("num_experts = 16", "num_experts = -1", "num_experts"),
    ("top_k = 2", 'top_k = "2"', "top_k"),
    ("q_lora_rank = 0", "q_lora_rank = true", "q_lora_rank"),
    ("moe_layer_interval = 2", "moe_layer_interval = 0", "moe_layer_interval"),  # 0 is no interval
    ("top_k = 2", "top_k = 17", "top_k"),  # ModelSpec: must be in 1..num_experts
    ("num_dense_layers = 2", "num_dense_layers = 6", "num_dense_layers"),  # no MoE layer left
    ("qk_rope_head_dim = 16", "qk_rope_head_dim = 48", "qk_rope_head_dim"),  # must be below head_dim
])
def test_toml_bad_moe_value_names_file_line_field(tmp_path, old, new, field):
    assert_bad_field_names_line(tmp_path, MOE_TOML, old, new, field, load_model)


# ---- presets and the validation names --------------------------------------------------

@pytest.mark.parametrize("alias,canonical", [
    ("Qwen3_30B_a3B", "qwen3-30b-a3b"), ("Qwen3_30B_a3B (tokendrop)", "qwen3-30b-a3b"),
    ("Qwen3_235B_a22B", "qwen3-235b-a22b"), ("Qwen3_235B_a22B (tokendrop)", "qwen3-235b-a22b"),
    ("GPT OSS 120B", "gpt-oss-120b"), ("openai/gpt-oss-120b", "gpt-oss-120b"),
    ("DeepSeekV3", "deepseek-v3"), ("DeepSeekV3 (dropless)", "deepseek-v3"),
    ("deepseek-ai/DeepSeek-V3", "deepseek-v3"), ("Mixtral 8x7B", "mixtral-8x7b"),
    ("mistralai/Mixtral-8x22B-v0.1", "mixtral-8x22b"), ("meta-llama/Llama-4-Maverick-17B-128E", "llama4-maverick"),
    ("Llama 4 Scout", "llama4-scout"), ("moonshotai/Kimi-K2-Instruct", "kimi-k2"), ("Grok-1", "grok-1"),
])
def test_moe_aliases_resolve(alias, canonical):
    assert load_model(alias).name == canonical


def test_every_moe_csv_model_resolves_with_its_shapes():
    if not MOE_CSV.exists():
        pytest.skip(f"{MOE_CSV} not present")
    with MOE_CSV.open(newline="") as f:
        rows = list(csv.DictReader(f))
    columns = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads",
               "kv_heads": "num_kv_heads", "vocab": "vocab_size", "num_experts": "num_experts",
               "top_k": "top_k", "moe_ffn_hidden": "moe_ffn_hidden_size"}
    for row in rows:
        m = load_model(row["model"])
        for col, attr in columns.items():
            if row[col]:
                assert getattr(m, attr) == int(row[col]), (row["id"], row["model"], col)
        # The csv's ffn_hidden is the dense MLP where the model has dense layers (DeepSeek-V3),
        # else the experts' width (Qwen3: "ffn_hidden column = moe_ffn").
        ffn = m.ffn_hidden_size if m.num_dense_mlp_layers else m.moe_ffn_hidden_size
        assert ffn == int(row["ffn_hidden"]), (row["id"], row["model"])
        assert m.num_params == pytest.approx(float(row["params_b"]) * 1e9, rel=0.05), row["id"]
    assert len(rows) >= 6  # the current rows; superseded ones are in training_dev_moe_superseded.csv


# ---- Hugging Face config.json, one per family ------------------------------------------

_QWEN3_MOE = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_act="silu",
                  decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, num_experts_per_tok=8,
                  num_experts=128, head_dim=128, num_key_value_heads=4, vocab_size=151936,
                  max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=False)
_DEEPSEEK_V3 = dict(architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3", hidden_act="silu",
                    hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                    n_shared_experts=1, n_routed_experts=256, num_experts_per_tok=8, first_k_dense_replace=3,
                    moe_layer_freq=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                    qk_rope_head_dim=64, v_head_dim=128, vocab_size=129280, max_position_embeddings=163840,
                    num_nextn_predict_layers=1, tie_word_embeddings=False, n_group=8, topk_group=4,
                    topk_method="noaux_tc")
_GPT_OSS = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", hidden_size=2880,
                intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8,
                num_local_experts=128, experts_per_token=4, num_experts_per_tok=4, vocab_size=201088,
                max_position_embeddings=131072, sliding_window=128, swiglu_limit=7.0,
                tie_word_embeddings=False)
_LLAMA4_TEXT = dict(model_type="llama4_text", hidden_act="silu", hidden_size=5120, intermediate_size=8192,
                    intermediate_size_mlp=16384, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                    num_hidden_layers=48, vocab_size=202048, num_experts_per_tok=1)
# A vision_config first, so that line numbers must come from text_config.
_LLAMA4_VISION = dict(model_type="llama4_vision_model", hidden_size=1408, num_hidden_layers=34,
                      intermediate_size=5632, num_attention_heads=16)

HF_CONFIGS = {
    "mixtral-8x22b": dict(architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_act="silu",
                          hidden_size=6144, intermediate_size=16384, num_hidden_layers=56,
                          num_attention_heads=48, num_key_value_heads=8, num_local_experts=8,
                          num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=65536,
                          rope_theta=1000000.0, tie_word_embeddings=False),
    "qwen3-30b-a3b": dict(_QWEN3_MOE, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_hidden_layers=48, num_attention_heads=32),
    "qwen3-235b-a22b": dict(_QWEN3_MOE, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
                            num_hidden_layers=94, num_attention_heads=64),
    # (DeepSeek-V2's config has no multi-token-prediction module: no num_nextn_predict_layers)
    "deepseek-v2": dict({k: v for k, v in _DEEPSEEK_V3.items() if k != "num_nextn_predict_layers"},
                        architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                        hidden_size=5120, intermediate_size=12288, moe_intermediate_size=1536,
                        num_hidden_layers=60, n_shared_experts=2, n_routed_experts=160, num_experts_per_tok=6,
                        first_k_dense_replace=1, vocab_size=102400, topk_method="group_limited_greedy",
                        topk_group=3),
    # Newer transformers write head_dim = qk_rope_head_dim into DeepSeek-V3 configs; MLA fields win.
    "deepseek-v3": dict(_DEEPSEEK_V3, head_dim=64),
    "kimi-k2": dict(_DEEPSEEK_V3, model_type="kimi_k2", num_attention_heads=64, num_key_value_heads=64,
                    n_routed_experts=384, first_k_dense_replace=1, vocab_size=163840,
                    max_position_embeddings=131072, num_nextn_predict_layers=0, n_group=1, topk_group=1),
    # the published configs alternate banded and full attention, starting banded
    "gpt-oss-120b": dict(_GPT_OSS, num_hidden_layers=36, layer_types=["sliding_attention", "full_attention"] * 18),
    "gpt-oss-20b": dict(_GPT_OSS, num_hidden_layers=24, num_local_experts=32,
                        layer_types=["sliding_attention", "full_attention"] * 12),
    "llama4-maverick": dict(architectures=["Llama4ForConditionalGeneration"], model_type="llama4",
                            vision_config=_LLAMA4_VISION, tie_word_embeddings=False,
                            text_config=dict(_LLAMA4_TEXT, num_local_experts=128, interleave_moe_layer_step=2,
                                             max_position_embeddings=1048576)),
    "llama4-scout": dict(architectures=["Llama4ForConditionalGeneration"], model_type="llama4",
                         vision_config=_LLAMA4_VISION, tie_word_embeddings=False,
                         text_config=dict(_LLAMA4_TEXT, num_local_experts=16, interleave_moe_layer_step=1,
                                          max_position_embeddings=10485760)),
}


def _config(tmp_path, cfg: dict, name: str = "config.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(cfg, indent=1))
    return p


@pytest.mark.parametrize("preset", sorted(HF_CONFIGS))
def test_hf_moe_config_matches_preset(tmp_path, preset):
    m = model_from_hf_config(_config(tmp_path, HF_CONFIGS[preset]))
    p = load_model(preset)
    assert dataclasses.replace(m, name=p.name) == p  # every field, not only the counts
    assert m.num_params == p.num_params and m.num_active_params == p.num_active_params


def test_hf_mixtral_8x7b_fixture_matches_preset():
    m = model_from_hf_config(Path(__file__).resolve().parent / "data" / "hf" / "mixtral-8x7b")
    assert dataclasses.replace(m, name="mixtral-8x7b") == load_model("mixtral-8x7b")


def test_hf_llama4_text_only_config(tmp_path):
    # A bare Llama4TextConfig (model_type llama4_text) imports like the nested one.
    cfg = dict(_LLAMA4_TEXT, num_local_experts=16, max_position_embeddings=10485760)
    m = model_from_hf_config(_config(tmp_path, cfg))
    assert m.num_params == load_model("llama4-scout").num_params and m.moe_layer_interval == 1


def test_hf_qwen2_moe_shared_expert(tmp_path):
    # Qwen/Qwen1.5-MoE-A2.7B config.json; Qwen blog 'Qwen1.5-MoE' (2024-03-28): 14.3B parameters
    # in total, 2.7B activated (q/k/v biases, 6K per layer, not counted).
    cfg = dict(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", hidden_size=2048,
               intermediate_size=5632, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
               num_experts=60, num_experts_per_tok=4, num_hidden_layers=24, num_attention_heads=16,
               num_key_value_heads=16, decoder_sparse_step=1, vocab_size=151936, max_position_embeddings=8192,
               tie_word_embeddings=False)
    m = model_from_hf_config(_config(tmp_path, cfg))
    assert (m.num_experts, m.top_k, m.moe_ffn_hidden_size, m.shared_expert_ffn_hidden_size) == (60, 4, 1408, 5632)
    assert m.num_params == pytest.approx(14.3e9, rel=0.01)
    assert m.num_active_params == pytest.approx(2.7e9, rel=0.01)


def test_hf_deepseek_v2_lite_full_rank_query(tmp_path):
    # deepseek-ai/DeepSeek-V2-Lite config.json (q_lora_rank null: full-rank queries); DeepSeek-V2
    # report (arXiv 2405.04434) Appendix B: 15.7B total, 2.4B activated, the latter without the
    # input embedding (with it: 2.66B).
    cfg = dict(_DEEPSEEK_V3, model_type="deepseek_v2", hidden_size=2048, intermediate_size=10944,
               moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
               n_shared_experts=2, n_routed_experts=64, num_experts_per_tok=6, first_k_dense_replace=1,
               q_lora_rank=None, vocab_size=102400)
    m = model_from_hf_config(_config(tmp_path, cfg))
    assert (m.q_lora_rank, m.kv_lora_rank, m.head_dim, m.v_head_dim) == (0, 512, 192, 128)
    assert m.shared_expert_ffn_hidden_size == 2 * 1408 and m.num_kv_heads == 16
    assert m.num_params == pytest.approx(15.7e9, rel=0.01)
    assert m.num_active_params - m.embedding_params == pytest.approx(2.4e9, rel=0.03)


# ---- which layers are MoE --------------------------------------------------------------

@pytest.mark.parametrize("changes,dense,interval", [
    (dict(mlp_only_layers=[0, 1]), 2, 1),               # leading dense layers
    (dict(decoder_sparse_step=2), 0, 2),                # layers 1, 3, 5, ...
    (dict(decoder_sparse_step=2, mlp_only_layers=[1]), 2, 2),  # 3, 5, 7, ...
])
def test_hf_qwen_layer_placement(tmp_path, changes, dense, interval):
    cfg = dict(HF_CONFIGS["qwen3-30b-a3b"], num_hidden_layers=8, **changes)
    m = model_from_hf_config(_config(tmp_path, cfg))
    assert (m.num_dense_layers, m.moe_layer_interval) == (dense, interval)


def test_hf_deepseek_moe_layer_freq(tmp_path):
    # j >= first_k_dense_replace and j % moe_layer_freq == 0: with 1 and 2, layers 2, 4, 6.
    cfg = dict(_DEEPSEEK_V3, num_hidden_layers=7, first_k_dense_replace=1, moe_layer_freq=2)
    m = model_from_hf_config(_config(tmp_path, cfg))
    assert (m.num_dense_layers, m.moe_layer_interval, m.num_moe_layers) == (1, 2, 3)


def test_hf_llama4_moe_layers_list(tmp_path):
    cfg = dict(HF_CONFIGS["llama4-maverick"])
    cfg["text_config"] = dict(cfg["text_config"], num_hidden_layers=8, moe_layers=[3, 7])
    m = model_from_hf_config(_config(tmp_path, cfg))
    assert (m.num_dense_layers, m.moe_layer_interval, m.num_moe_layers) == (0, 4, 2)


@given(num_layers=st.integers(1, 64), dense=st.integers(0, 63), interval=st.integers(1, 8))
def test_moe_layout_round_trips(num_layers, dense, interval):
    """Any ModelSpec layout read back from its per-layer flags gives the same MoE layer count."""
    flags = [j >= dense and (j - dense + 1) % interval == 0 for j in range(num_layers)]
    layout = _moe_layout(flags)
    if not any(flags):
        assert layout is None
        return
    m = make_model(name="x", num_layers=num_layers, hidden_size=64, num_heads=4, vocab_size=10, num_experts=4,
                   top_k=1, moe_ffn_hidden_size=16, num_dense_layers=layout[0], moe_layer_interval=layout[1])
    assert m.num_moe_layers == sum(flags)
    assert [j >= layout[0] and (j - layout[0] + 1) % layout[1] == 0 for j in range(num_layers)] == flags


# ---- bad configs: one line naming file, line and field ---------------------------------

def _line(path: Path, key: str, after: str = "") -> int:
    text = path.read_text()
    start = text.index(f'"{after}"') if after else 0
    return text.count("\n", 0, text.index(f'"{key}"', start)) + 1


@pytest.mark.parametrize("preset,changes,field", [
    ("mixtral-8x22b", dict(num_local_experts="8"), "num_local_experts"),
    ("mixtral-8x22b", dict(num_experts_per_tok=9), "num_experts_per_tok"),  # above 8 experts
    ("qwen3-30b-a3b", dict(num_experts=0), "num_experts"),
    ("qwen3-30b-a3b", dict(mlp_only_layers=[5]), "mlp_only_layers"),  # a dense layer mid-way
    ("qwen3-30b-a3b", dict(mlp_only_layers=[0, 48]), "mlp_only_layers"),  # no layer 48
    ("qwen3-30b-a3b", dict(decoder_sparse_step=49), "decoder_sparse_step"),  # no MoE layer at all
    ("deepseek-v3", dict(moe_layer_freq=2, first_k_dense_replace=0), "moe_layer_freq"),  # 0, 2, 4...
    ("deepseek-v3", dict(first_k_dense_replace=-1), "first_k_dense_replace"),
    ("deepseek-v3", dict(kv_lora_rank=0), "kv_lora_rank"),
    ("deepseek-v3", dict(n_group=7), "n_group"),       # does not divide 256 experts
    ("deepseek-v3", dict(topk_group=9), "topk_group"),  # more groups chosen than there are
    ("deepseek-v3", dict(topk_group=0), "topk_group"),  # a group limit choosing no group
    ("gpt-oss-120b", dict(experts_per_token=0), "experts_per_token"),
])
def test_hf_bad_moe_field(tmp_path, preset, changes, field):
    p = _config(tmp_path, dict(HF_CONFIGS[preset], **changes))
    with pytest.raises(FileFormatError) as e:
        model_from_hf_config(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:{_line(p, field)}:") and f"'{field}'" in msg and "\n" not in msg


def test_hf_missing_moe_field(tmp_path):
    cfg = dict(HF_CONFIGS["deepseek-v3"])
    del cfg["qk_rope_head_dim"]
    with pytest.raises(FileFormatError, match="field 'qk_rope_head_dim' missing \\(a 'deepseek_v3' config"):
        model_from_hf_config(_config(tmp_path, cfg))


def test_hf_llama4_errors_point_into_text_config(tmp_path):
    cfg = dict(HF_CONFIGS["llama4-maverick"])
    cfg["text_config"] = dict(cfg["text_config"], num_hidden_layers=0)  # vision_config has one too
    p = _config(tmp_path, cfg)
    with pytest.raises(FileFormatError) as e:
        model_from_hf_config(p)
    assert str(e.value).startswith(f"{p}:{_line(p, 'num_hidden_layers', after='text_config')}:")
    with pytest.raises(FileFormatError, match="'text_config'"):
        model_from_hf_config(_config(tmp_path, dict(model_type="llama4", vision_config={}), "nt.json"))


def test_hf_unsupported_moe_family(tmp_path):
    # OLMoE (allenai/OLMoE-1B-7B-0924) is not mapped: refused, naming the field and what is supported.
    cfg = dict(model_type="olmoe", hidden_size=2048, intermediate_size=1024, num_hidden_layers=16,
               num_attention_heads=16, num_experts=64, num_experts_per_tok=8, vocab_size=50304)
    p = _config(tmp_path, cfg)
    with pytest.raises(FileFormatError) as e:
        model_from_hf_config(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:{_line(p, 'num_experts')}:") and "not supported" in msg and "mixtral" in msg


# ---- sliding-window attention ---------------------------------------------------------

def test_windowed_attention_span_counts_the_keys_each_query_sees():
    from paraplan.cost.flops import causal_attention_span
    # brute force: the query at position i (1-based) attends to min(i, w) keys; a full causal
    # layer to i. GPT-OSS at 4k: half its layers on a 128-token band.
    m = load_model("gpt-oss-120b")
    s, w = 4096, m.sliding_window
    windowed = sum(min(i, w) for i in range(1, s + 1)) / sum(range(1, s + 1))
    expected = (m.num_layers - m.num_sliding_window_layers + m.num_sliding_window_layers * windowed) / m.num_layers
    assert causal_attention_span(m, s) == pytest.approx(expected, rel=1e-3)
    assert causal_attention_span(m, w) == 1.0  # a sequence inside the band sees everything
    # Mistral's 4,096-token window is never reached at 4k, only beyond
    mistral = load_model("mistral-7b")
    assert causal_attention_span(mistral, 4096) == 1.0 and causal_attention_span(mistral, 32768) < 0.25


def test_windowed_layers_cut_attention_flops_and_time_only():
    from paraplan.cost.flops import layer_forward_flops
    m = load_model("gpt-oss-120b")
    full = replace(m, sliding_window=0, num_sliding_window_layers=0)
    a, b = layer_forward_flops(m, 4096, 4096), layer_forward_flops(full, 4096, 4096)
    assert a.attn_core < 0.6 * b.attn_core and a.linear == b.linear


def test_hf_sliding_window_fields(tmp_path):
    mistral = dict(architectures=["MistralForCausalLM"], model_type="mistral", hidden_act="silu", hidden_size=4096,
                   intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                   vocab_size=32000, max_position_embeddings=32768, sliding_window=4096, tie_word_embeddings=False)
    m = model_from_hf_config(_config(tmp_path, mistral))
    assert (m.sliding_window, m.num_sliding_window_layers) == (4096, 32)
    m = model_from_hf_config(_config(tmp_path, dict(mistral, sliding_window=None)))
    assert (m.sliding_window, m.num_sliding_window_layers) == (0, 0)
    # Qwen configs carry sliding_window even when use_sliding_window is false
    qwen = dict(_QWEN3_MOE, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                num_hidden_layers=48, num_attention_heads=32, sliding_window=32768, use_sliding_window=False,
                max_window_layers=28)
    assert model_from_hf_config(_config(tmp_path, qwen)).num_sliding_window_layers == 0
    assert model_from_hf_config(_config(tmp_path, dict(qwen, use_sliding_window=True))).num_sliding_window_layers == 20
    with pytest.raises(FileFormatError, match="layer_types"):
        model_from_hf_config(_config(tmp_path, dict(HF_CONFIGS["gpt-oss-20b"], layer_types=["sliding_attention"])))


def test_sliding_window_needs_its_layer_count():
    m = load_model("gpt-oss-20b")
    with pytest.raises(SpecError, match="sliding_window"):
        replace(m, num_sliding_window_layers=0)
    with pytest.raises(SpecError, match="num_sliding_window_layers"):
        replace(m, num_sliding_window_layers=25)


def test_group_limited_routing_is_checked_in_one_line():
    v3 = load_model("deepseek-v3")
    for changes, field, allowed in ((dict(expert_groups=0), "expert_groups", "given together"),
                                    (dict(expert_groups=6), "expert_groups", "must divide num_experts=256"),
                                    (dict(group_top_k=9), "group_top_k", "1..expert_groups=8"),
                                    (dict(expert_groups=128, group_top_k=2), "group_top_k", "at least 4")):
        with pytest.raises(SpecError, match=allowed) as e:
            replace(v3, **changes)
        assert e.value.field == field and "\n" not in str(e.value)
    assert not replace(v3, expert_groups=1, group_top_k=1).group_limited  # Kimi K2's n_group 1: no limit


def test_kv_width_counts_mlas_narrower_value_heads():
    # DeepSeek-V3: 128 heads, K of 192 (128 nope + 64 rope), V of 128 (DeepSeek-V2 Sec. 2.1)
    ds = load_model("deepseek-v3")
    assert ds.kv_pair_dim == 128 * (192 + 128)
    # GQA: K and V alike, 2·k·d
    llama = load_model("llama3-8b")
    assert llama.kv_pair_dim == 2 * 8 * 128
