"""A Llama-style decoder in plain torch.nn, built from a paraplan ModelSpec.

Pre-norm blocks (RMSNorm), grouped-query attention with rotary embeddings, a SwiGLU (or
plain GELU) MLP, untied or tied output head -- the shapes paraplan's cost model counts
(specs/model.py). Module names follow torchtitan's Llama (`tok_embeddings`, `layers.N.attention.wq`,
`feed_forward.w1`, ...) so that its tensor-parallel plan reads the same here (tensor_parallel.py).

Layers live in a ModuleDict keyed by their global index: a pipeline stage builds only the
layers it owns under the full model's names, and their weights come out the same.
"""

from __future__ import annotations

import zlib

import torch
import torch.nn.functional as F
from torch import nn

from ..specs.model import ModelSpec


def rope_tables(head_dim: int, seq_len: int, theta: float = 500000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (seq_len, head_dim), Llama's base theta."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.head_dim = spec.head_dim
        self.kv_repeat = spec.num_heads // spec.num_kv_heads
        self.wq = nn.Linear(spec.hidden_size, spec.num_heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, bias=False)
        self.wv = nn.Linear(spec.hidden_size, spec.num_kv_heads * spec.head_dim, bias=False)
        self.wo = nn.Linear(spec.num_heads * spec.head_dim, spec.hidden_size, bias=False)
        # Selective recomputation (Korthikanti et al. 2022 Sec. 4.2): keep the projections,
        # recompute the attention core (scores, softmax) in the backward.
        self.recompute_core = False

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_repeat > 1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds num_heads / tp of them
        q = self.wq(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q, k = _rotate(q, cos[:s], sin[:s]), _rotate(k, cos[:s], sin[:s])
        # keys and values keep their own heads: SDPA groups the queries over them (as
        # torchtitan's Llama calls it), with no repeated copy to store
        if self.recompute_core and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint
            out = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            out = self._core(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.gated = spec.gated_mlp
        self.w1 = nn.Linear(spec.hidden_size, spec.ffn_hidden_size, bias=False)
        self.w2 = nn.Linear(spec.ffn_hidden_size, spec.hidden_size, bias=False)
        self.w3 = nn.Linear(spec.hidden_size, spec.ffn_hidden_size, bias=False) if spec.gated_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.attention_norm = nn.RMSNorm(spec.hidden_size, eps=1e-5)
        self.attention = Attention(spec)
        self.ffn_norm = nn.RMSNorm(spec.hidden_size, eps=1e-5)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """The whole decoder, or one pipeline stage of it: some of the layers, the embedding
    only on the first stage, the final norm and head only on the last."""

    def __init__(self, spec: ModelSpec, seq_len: int, *, layer_ids: range | None = None,
                 first: bool = True, last: bool = True):
        super().__init__()
        layer_ids = range(spec.num_layers) if layer_ids is None else layer_ids
        self.tok_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size) if first else None
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in layer_ids})
        self.norm = nn.RMSNorm(spec.hidden_size, eps=1e-5) if last else None
        self.output = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False) if last else None
        if spec.tied_embeddings and first and last:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(spec.head_dim, seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def init_weights(self, spec: ModelSpec, seed: int) -> None:
        """Small-std normal init (GPT-2 / Megatron style; residual outputs scaled by depth).
        Each tensor draws from its own generator seeded by (seed, its name), so a stage
        holds exactly the weights of the same layers in the full model."""
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            scale = std / (2 * spec.num_layers) ** 0.5 if name.endswith(("wo.weight", "w2.weight")) else std
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * scale)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope_cos, self.rope_sin)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def build_model(spec: ModelSpec, seq_len: int, seed: int, *, stage: int = 0, num_stages: int = 1,
                layer_ids: range | None = None) -> Transformer:
    """One stage of the model (the whole model when num_stages is 1) holding `layer_ids`
    (default: an equal share), seeded random init, on the CPU: the same layers get the same
    weights whatever the plan."""
    if layer_ids is None:
        n = spec.num_layers // num_stages
        layer_ids = range(stage * n, (stage + 1) * n)
    model = Transformer(spec, seq_len, layer_ids=layer_ids, first=stage == 0, last=stage == num_stages - 1)
    model.init_weights(spec, seed)
    return model


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the tokens of the (micro-)batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))
