"""Golden: parameter counts of the model presets reproduce published totals (within 1%).

ModelSpec counts weights and norm scales but not biases or learned position tables, so
models with those (GPT-3, Megatron GPT) land a little below their published totals.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from paraplan.specs.catalog import load_model
from paraplan.specs.hf import model_from_hf_config

# (preset, published total parameters, source of the published number)
PUBLISHED = [
    ("llama2-7b", 6.74e9, "meta-llama/Llama-2-7b-hf model page: 6.74B params (6,738,415,616 in safetensors)"),
    ("llama2-70b", 68.98e9, "meta-llama/Llama-2-70b-hf model page: 69B params (68,976,648,192)"),
    ("llama3-8b", 8.03e9, "meta-llama/Meta-Llama-3-8B model page: 8.03B params"),
    ("llama3-70b", 70.6e9, "meta-llama/Meta-Llama-3-70B model page: 70.6B params"),
    ("llama3.1-405b", 405.9e9, "meta-llama/Llama-3.1-405B model page: 406B params (405,853,388,800)"),
    ("gpt3-175b", 175.0e9, "Brown et al. 2020 (arXiv 2005.14165) Table 2.1: n_params 175.0B"),
    ("mistral-7b", 7.24e9, "mistralai/Mistral-7B-v0.1 model page: 7.24B params"),
    ("nemotron4-340b", 341.0e9, "Nemotron-4 340B Technical Report (arXiv 2406.11704) Sec. 2: "
                                "9.4B embedding + 331.6B non-embedding parameters"),
    ("palm-540b", 540.35e9, "Chowdhery et al. 2022 (arXiv 2204.02311) Table 1: 540.35B"),
    # Narayanan et al. SC'21 (arXiv 2104.04473) Table 1 (smaller rows are printed to 2
    # significant digits, too coarse for a 1% check).
    ("megatron-gpt-7.5b", 7.5e9, "Narayanan et al. SC'21 Table 1: 7.5B"),
    ("megatron-gpt-18b", 18.4e9, "Narayanan et al. SC'21 Table 1: 18.4B"),
    ("megatron-gpt-39b", 39.1e9, "Narayanan et al. SC'21 Table 1: 39.1B"),
    ("megatron-gpt-76b", 76.1e9, "Narayanan et al. SC'21 Table 1: 76.1B"),
    ("megatron-gpt-145b", 145.6e9, "Narayanan et al. SC'21 Table 1: 145.6B"),
    ("megatron-gpt-310b", 310.1e9, "Narayanan et al. SC'21 Table 1: 310.1B"),
    ("mt-nlg-530b", 529.6e9, "Narayanan et al. SC'21 Table 1: 529.6B"),
    ("megatron-gpt-1t", 1008.0e9, "Narayanan et al. SC'21 Table 1: 1008.0B"),
]


@pytest.mark.parametrize("name,published,source", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_param_count_matches_published(name, published, source):
    assert load_model(name).num_params == pytest.approx(published, rel=0.01), source


def test_llama2_7b_exact():
    # meta-llama/Llama-2-7b-hf safetensors hold 6,738,415,616 parameters: no biases, so exact.
    assert load_model("llama2-7b").num_params == 6_738_415_616


def test_mistral_7b_exact():
    # mistralai/Mistral-7B-v0.1 safetensors hold 7,241,732,096 parameters.
    assert load_model("mistral-7b").num_params == 7_241_732_096


def test_nemotron4_340b_split():
    # Nemotron-4 340B Technical Report (arXiv 2406.11704): 9.4B embedding (untied input and
    # output embeddings) and 331.6B non-embedding parameters.
    m = load_model("nemotron4-340b")
    assert m.embedding_params + m.lm_head_params == pytest.approx(9.4e9, rel=0.01)
    assert m.num_non_embedding_params == pytest.approx(331.6e9, rel=0.01)


def test_mpt_7b_llm_foundry():
    # mosaicml/llm-foundry scripts/train/benchmarking/README.md, MPT-7B at seq 2048:
    # NumParams 6,658,859,008 = weights (tied) + biases (11h per layer + h) + 2048 x h positions.
    m = load_model("mpt-7b")
    assert m.num_params + (11 * m.num_layers + 1) * m.hidden_size + 2048 * m.hidden_size == 6_658_859_008


def test_qwen2_0_5b_from_hf_config():
    # Qwen/Qwen2-0.5B model page: 494M params (494,032,768 incl. 27,648 q/k/v biases).
    m = model_from_hf_config(Path(__file__).resolve().parents[1] / "data" / "hf" / "qwen2-0.5b")
    assert m.num_params + 24 * (896 + 2 * 128) == 494_032_768
