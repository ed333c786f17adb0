"""Decoder-only transformer model spec.

Notation (Narayanan et al. SC'21, Korthikanti et al. 2022): l layers, h hidden size,
f ffn hidden size, a attention heads, k kv heads (GQA groups), d head dim, V vocab.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SpecError


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    gated_mlp: bool = True
    tied_embeddings: bool = False
    max_seq_len: int = 0  # 0: not stated
    # Dropout after attention and MLP (GPT-3-era Megatron); stores a 1-byte mask per element
    # (Korthikanti et al. Sec. 4.1). Modern Llama-style pre-training runs without dropout.
    dropout: bool = False
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for f in ("num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads",
                  "head_dim", "vocab_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(where, f, v, "a positive integer is required")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(where, "num_kv_heads", self.num_kv_heads,
                            f"must divide num_heads={self.num_heads} (MHA: equal; GQA: a divisor; MQA: 1)")

    # ---- parameter counts (weights only; biases and norms are counted, see docs/model.md) ----
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def num_mlp_matrices(self) -> int:
        """SwiGLU has gate, up and down projections; a plain MLP has up and down."""
        return 3 if self.gated_mlp else 2

    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h

    @property
    def mlp_params_per_layer(self) -> int:
        return self.num_mlp_matrices * self.hidden_size * self.ffn_hidden_size

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size

    @property
    def params_per_layer(self) -> int:
        return self.attn_params_per_layer + self.mlp_params_per_layer + self.norm_params_per_layer

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total trainable parameters (embedding + layers + final norm + untied LM head)."""
        return (self.num_layers * self.params_per_layer + self.embedding_params
                + self.lm_head_params + self.hidden_size)

    @property
    def num_non_embedding_params(self) -> int:
        return self.num_layers * self.params_per_layer + self.hidden_size


def make_model(*, name: str, num_layers: int, hidden_size: int, num_heads: int,
               vocab_size: int, ffn_hidden_size: int | None = None,
               num_kv_heads: int | None = None, head_dim: int | None = None,
               gated_mlp: bool = True, tied_embeddings: bool = False,
               max_seq_len: int = 0, dropout: bool = False, source: str = "") -> ModelSpec:
    """Build a ModelSpec filling the conventional defaults (MHA, d = h/a, f = 4h)."""
    if ffn_hidden_size is None:
        ffn_hidden_size = 4 * hidden_size
    if num_kv_heads is None:
        num_kv_heads = num_heads
    if head_dim is None:
        if num_heads <= 0 or hidden_size % num_heads:
            raise SpecError(f"model {name!r}", "head_dim", None,
                            f"cannot derive from hidden_size={hidden_size}/num_heads={num_heads}; give it")
        head_dim = hidden_size // num_heads
    return ModelSpec(name=name, num_layers=num_layers, hidden_size=hidden_size,
                     ffn_hidden_size=ffn_hidden_size, num_heads=num_heads,
                     num_kv_heads=num_kv_heads, head_dim=head_dim, vocab_size=vocab_size,
                     gated_mlp=gated_mlp, tied_embeddings=tied_embeddings,
                     max_seq_len=max_seq_len, dropout=dropout, source=source)
