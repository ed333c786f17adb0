"""Decoder-only transformer model spec, dense or mixture-of-experts.

Notation (Narayanan et al. SC'21, Korthikanti et al. 2022): l layers, h hidden size,
f ffn hidden size, a attention heads, k kv heads (GQA groups), d head dim, V vocab.
Mixture of experts (Fedus et al. 2022; DeepSeek-V3 report Sec. 2): E routed experts of ffn
size f_e, top-k routing, shared experts of total ffn size f_sh, the first l_d layers dense,
then one MoE layer every `moe_layer_interval` layers (Llama 4 interleaves: 2).
Multi-token prediction (DeepSeek-V3 report Sec. 2.2): D modules after the last layer, each an
RMS-normed concatenation of the previous depth's hidden state and the next token's embedding
projected 2h -> h, one transformer block (MoE in an MoE model) and the shared output head.
Multi-head latent attention (DeepSeek-V2 report Sec. 2.1): queries through a rank-r_q
bottleneck, keys and values through a shared rank-r_kv latent plus a d_r-wide RoPE key;
head_dim is the query/key width (d_nope + d_r), v_head_dim the value width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SpecError

# The most layers a model may have: 80 times the 126 of Llama 3 405B. The engine keeps
# per-layer lists (the MoE layout, a trace's events), which a count in the billions would
# never finish building.
MAX_LAYERS = 10_000
MAX_MTP_LAYERS = 16  # multi-token-prediction depth; DeepSeek-V3 trains D = 1


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
    # ---- mixture of experts (all 0: dense) ----
    num_experts: int = 0            # routed experts E
    top_k: int = 0                  # experts per token k
    moe_ffn_hidden_size: int = 0    # f_e, each routed expert's ffn size
    shared_expert_ffn_hidden_size: int = 0  # f_sh, all shared experts together (0: none)
    num_dense_layers: int = 0       # l_d leading layers with the dense MLP of ffn_hidden_size
    moe_layer_interval: int = 1     # after them, every i-th layer is MoE (the others dense)
    # group-limited routing (DeepSeek-V2 report Sec. 2.2.3, device-limited; DeepSeek-V3 report
    # Sec. 2.1.2, node-limited: config.json n_group / topk_group): the E experts in G equal
    # groups, each token routed among the experts of its best M groups (0, or 1 and 1: no limit)
    expert_groups: int = 0          # G
    group_top_k: int = 0            # M
    # ---- multi-head latent attention (kv_lora_rank 0: standard MHA/GQA) ----
    q_lora_rank: int = 0            # r_q (0: full-rank query projection)
    kv_lora_rank: int = 0           # r_kv
    qk_rope_head_dim: int = 0       # d_r, part of head_dim
    v_head_dim: int = 0             # value width per head (0: head_dim)
    # ---- multi-token prediction (0: none) ----
    mtp_layers: int = 0             # D, DeepSeek-V3's num_nextn_predict_layers (1)
    # ---- sliding-window (banded) attention (0: every layer attends to the whole prefix) ----
    sliding_window: int = 0         # w: a windowed layer's query attends to the last w tokens
    num_sliding_window_layers: int = 0  # how many layers use it (GPT-OSS: every other one)
    # ---- rotary position embedding (Su et al. 2021); no cost depends on them, the exports do ----
    rope_theta: float = 0.0         # base of the rotary frequencies, config.json's rope_theta (0: not
                                    # stated; the engines then use 10,000)
    # Llama 3.1's frequency scaling (config.json rope_scaling, rope_type "llama3": this factor, low/high
    # frequency factors 1 and 4, 8,192 original positions, the values Megatron-LM's --use-rope-scaling
    # fixes); 0: none
    rope_llama3_scaling_factor: float = 0.0
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for f in ("num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads",
                  "head_dim", "vocab_size"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(where, f, v, "a positive integer is required")
        if self.num_layers > MAX_LAYERS:
            raise SpecError(where, "num_layers", self.num_layers, f"at most {MAX_LAYERS:,} layers are allowed")
        if self.num_heads % self.num_kv_heads:
            raise SpecError(where, "num_kv_heads", self.num_kv_heads,
                            f"must divide num_heads={self.num_heads} (MHA: equal; GQA: a divisor; MQA: 1)")
        for f in ("num_experts", "top_k", "moe_ffn_hidden_size", "shared_expert_ffn_hidden_size",
                  "num_dense_layers", "expert_groups", "group_top_k", "q_lora_rank", "kv_lora_rank",
                  "qk_rope_head_dim", "v_head_dim",
                  "sliding_window", "num_sliding_window_layers", "mtp_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise SpecError(where, f, v, "a non-negative integer is required (0: not used)")
        for f in ("rope_theta", "rope_llama3_scaling_factor"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < float("inf"):
                raise SpecError(where, f, v, "a non-negative number is required (0: not stated)")
        if self.mtp_layers > MAX_MTP_LAYERS:
            raise SpecError(where, "mtp_layers", self.mtp_layers,
                            f"at most {MAX_MTP_LAYERS} multi-token-prediction modules (DeepSeek-V3 trains 1)")
        if self.num_sliding_window_layers > self.num_layers:
            raise SpecError(where, "num_sliding_window_layers", self.num_sliding_window_layers,
                            f"at most num_layers={self.num_layers}")
        if bool(self.sliding_window) != bool(self.num_sliding_window_layers):
            raise SpecError(where, "sliding_window", self.sliding_window,
                            "sliding_window and num_sliding_window_layers are given together (both 0: none)")
        if not isinstance(self.moe_layer_interval, int) or self.moe_layer_interval < 1:
            raise SpecError(where, "moe_layer_interval", self.moe_layer_interval, "a positive integer is required")
        if self.num_experts:
            moe = f"num_experts={self.num_experts} makes this a mixture-of-experts model"
            if self.top_k == 0:  # unset: say what is missing, not that 0 is wrong
                raise SpecError(where, "top_k", 0, f"{moe}: give top_k, the experts per token, in "
                                f"1..{self.num_experts} (or num_experts = 0 for a dense model)")
            if not 1 <= self.top_k <= self.num_experts:
                raise SpecError(where, "top_k", self.top_k, f"must be in 1..num_experts={self.num_experts}")
            if self.moe_ffn_hidden_size <= 0:
                raise SpecError(where, "moe_ffn_hidden_size", self.moe_ffn_hidden_size,
                                f"{moe}: give moe_ffn_hidden_size, each expert's FFN width, a positive integer")
            if self.num_dense_layers >= self.num_layers:
                raise SpecError(where, "num_dense_layers", self.num_dense_layers,
                                f"must be below num_layers={self.num_layers} (some layers must be MoE)")
            if self.num_moe_layers < 1:
                raise SpecError(where, "moe_layer_interval", self.moe_layer_interval,
                                f"leaves no MoE layer among the {self.num_layers - self.num_dense_layers} layers "
                                f"after the {self.num_dense_layers} dense ones")
            self._check_expert_groups(where)
        elif self.top_k or self.moe_ffn_hidden_size or self.shared_expert_ffn_hidden_size or self.expert_groups:
            raise SpecError(where, "num_experts", 0,
                            "top_k / moe_ffn_hidden_size / shared experts / expert_groups need num_experts > 0")
        if self.kv_lora_rank and self.qk_rope_head_dim >= self.head_dim:
            raise SpecError(where, "qk_rope_head_dim", self.qk_rope_head_dim,
                            f"must be below head_dim={self.head_dim} (head_dim = nope + rope widths)")

    def _check_expert_groups(self, where: str) -> None:
        """Group-limited routing: G divides E, 1 <= M <= G, and M groups hold the top-k experts."""
        G, M = self.expert_groups, self.group_top_k
        if bool(G) != bool(M):
            raise SpecError(where, "group_top_k" if G else "expert_groups", M if G else G,
                            "expert_groups and group_top_k are given together (both 0: no group limit)")
        if not G:
            return
        if self.num_experts % G:
            raise SpecError(where, "expert_groups", G, f"must divide num_experts={self.num_experts}")
        if not 1 <= M <= G:
            raise SpecError(where, "group_top_k", M, f"must be in 1..expert_groups={G}")
        if M * (self.num_experts // G) < self.top_k:
            raise SpecError(where, "group_top_k", M, f"{M} groups of {self.num_experts // G} experts cannot hold "
                            f"top_k={self.top_k}: at least {-(-self.top_k // (self.num_experts // G))}")

    @property
    def group_limited(self) -> bool:
        """Whether routing is limited to some of the expert groups (G > 1)."""
        return self.expert_groups > 1

    # ---- parameter counts (weights only; biases and norms are counted, see docs/model.md) ----
    def tp_splits_heads_badly(self, tp):
        """Whether tensor parallelism of `tp` (an int or an array) cannot split the heads: it
        must divide the query heads, and divide the KV heads or be a multiple of them (each KV
        head then replicated on tp/kv_heads ranks: Megatron-Core, vLLM)."""
        a, k = self.num_heads, self.num_kv_heads
        return (a % tp != 0) | ((k % tp != 0) & (tp % k != 0))

    def tp_heads_rule(self, tp: int) -> str:
        """Why `tp` cannot split the heads (for a `tp` that tp_splits_heads_badly)."""
        if self.num_heads % tp:
            return f"TP={tp} must divide heads={self.num_heads}"
        return f"TP={tp} must divide kv_heads={self.num_kv_heads} or be a multiple of it (KV heads are then replicated)"

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def q_dim(self) -> int:
        """Query (and key) width a·d."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of one of K or V as the attention kernel reads it (MLA: expanded per head)."""
        return (self.num_heads if self.is_mla else self.num_kv_heads) * self.head_dim

    @property
    def kv_pair_dim(self) -> int:
        """Width of K and V together as the attention kernel reads them: 2·k·d, or for MLA
        a·d_qk + a·d_v (its value heads are narrower than its query/key heads)."""
        heads = self.num_heads if self.is_mla else self.num_kv_heads
        return self.kv_dim + heads * (self.v_head_dim or self.head_dim)

    @property
    def v_dim(self) -> int:
        """Value / attention-output width a·d_v (d_v = head_dim unless MLA sets it)."""
        return self.num_heads * (self.v_head_dim or self.head_dim)

    @property
    def num_moe_layers(self) -> int:
        if not self.is_moe:
            return 0
        return (self.num_layers - self.num_dense_layers) // self.moe_layer_interval

    @property
    def num_dense_mlp_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def num_mlp_matrices(self) -> int:
        """SwiGLU has gate, up and down projections; a plain MLP has up and down."""
        return 3 if self.gated_mlp else 2

    @property
    def attn_params_per_layer(self) -> int:
        h, a = self.hidden_size, self.num_heads
        if not self.is_mla:
            return h * (self.q_dim + 2 * self.num_kv_heads * self.head_dim) + self.q_dim * h
        # DeepSeek-V2 Sec. 2.1.2: W_DQ, W_UQ (with its RMSNorm), W_DKV + W_KR, kv RMSNorm,
        # W_UK and W_UV, output projection
        d_nope = self.head_dim - self.qk_rope_head_dim
        rq = self.q_lora_rank
        q = (h * rq + rq + rq * self.q_dim) if rq else h * self.q_dim
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_up = self.kv_lora_rank * a * (d_nope + (self.v_head_dim or self.head_dim))
        return q + kv + kv_up + self.v_dim * h

    @property
    def mla_up_proj_params(self) -> int:
        """MLA's up-projections W_UQ, W_UK, W_UV (0 without MLA): what Megatron-Core's
        `mla_up_proj` recomputation re-runs from the latents."""
        if not self.is_mla:
            return 0
        d_nope = self.head_dim - self.qk_rope_head_dim
        q_up = self.q_lora_rank * self.q_dim
        return q_up + self.kv_lora_rank * self.num_heads * (d_nope + (self.v_head_dim or self.head_dim))

    @property
    def mla_latent_width(self) -> int:
        """Per-token latents MLA keeps when it recomputes the up-projections: c_Q (r_q, or
        the full query without a query LoRA), c_KV (r_kv) and the shared RoPE key (d_r)."""
        if not self.is_mla:
            return 0
        return (self.q_lora_rank or self.q_dim) + self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def qkv_params_per_layer(self) -> int:
        """Projections into the attention kernel's Q, K, V (everything but the output GEMM)."""
        return self.attn_params_per_layer - self.v_dim * self.hidden_size

    @property
    def mlp_params_per_layer(self) -> int:
        """The dense MLP (every layer of a dense model; the dense layers of an MoE model)."""
        return self.num_mlp_matrices * self.hidden_size * self.ffn_hidden_size

    @property
    def expert_params_per_moe_layer(self) -> int:
        """Routed experts of one MoE layer (sharded over expert parallelism)."""
        return self.num_experts * self.num_mlp_matrices * self.hidden_size * self.moe_ffn_hidden_size

    @property
    def moe_dense_params_per_moe_layer(self) -> int:
        """Router and shared experts of one MoE layer (replicated like dense weights)."""
        return (self.hidden_size * self.num_experts
                + self.num_mlp_matrices * self.hidden_size * self.shared_expert_ffn_hidden_size)

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size

    @property
    def mtp_dense_params_per_module(self) -> int:
        """One multi-token-prediction module's weights outside the routed experts (DeepSeek-V3
        report Sec. 2.2, Fig. 3): the two RMSNorms of its inputs (2h), the projection M_k
        (2h·h), its transformer block's attention, norms and MLP (router and shared experts in
        an MoE model) and the shared head's final norm (h). The embedding and the output head
        are the main model's, shared."""
        h = self.hidden_size
        mlp = self.moe_dense_params_per_moe_layer if self.is_moe else self.mlp_params_per_layer
        return 2 * h + 2 * h * h + self.attn_params_per_layer + self.norm_params_per_layer + mlp + h

    @property
    def mtp_expert_params_per_module(self) -> int:
        """The routed experts of one module's block (0 for a dense model): its block is an MoE
        layer, as DeepSeek-V3's layer 61 is (past first_k_dense_replace)."""
        return self.expert_params_per_moe_layer if self.is_moe else 0

    @property
    def mtp_params(self) -> int:
        """All multi-token-prediction weights, outside `num_params` (DeepSeek-V3's 671B leave
        out its 14B MTP module, which Hugging Face stores with its own copies of the shared
        embedding and head)."""
        return self.mtp_layers * (self.mtp_dense_params_per_module + self.mtp_expert_params_per_module)

    @property
    def expert_params(self) -> int:
        """All routed-expert weights of the model."""
        return self.num_moe_layers * self.expert_params_per_moe_layer

    @property
    def layer_params(self) -> int:
        """All transformer-layer weights (dense, MoE, attention, norms)."""
        return (self.num_layers * (self.attn_params_per_layer + self.norm_params_per_layer)
                + self.num_dense_mlp_layers * self.mlp_params_per_layer
                + self.num_moe_layers * (self.expert_params_per_moe_layer + self.moe_dense_params_per_moe_layer))

    @property
    def params_per_layer(self) -> int:
        """Average weights of one layer (exact for a dense model)."""
        return self.layer_params // self.num_layers

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab_size * self.hidden_size

    @property
    def output_weight_params(self) -> int:
        """The output layer's weight, its own or the tied embedding table (V·h either way)."""
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Total trainable parameters (embedding + layers + final norm + untied LM head)."""
        return self.layer_params + self.embedding_params + self.lm_head_params + self.hidden_size

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: all but the routed experts it is not sent to."""
        inactive = self.num_moe_layers * (self.num_experts - self.top_k) * (
            self.num_mlp_matrices * self.hidden_size * self.moe_ffn_hidden_size)
        return self.num_params - inactive

    @property
    def num_non_embedding_params(self) -> int:
        return self.layer_params + self.hidden_size


def make_model(*, name: str, num_layers: int, hidden_size: int, num_heads: int,
               vocab_size: int, ffn_hidden_size: int | None = None,
               num_kv_heads: int | None = None, head_dim: int | None = None,
               gated_mlp: bool = True, tied_embeddings: bool = False,
               max_seq_len: int = 0, dropout: bool = False, source: str = "", **moe_mla) -> ModelSpec:
    """Build a ModelSpec filling the conventional defaults (MHA, d = h/a, f = 4h).

    `moe_mla`: the mixture-of-experts and latent-attention fields of ModelSpec, by name.
    """
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
                     max_seq_len=max_seq_len, dropout=dropout, source=source, **moe_mla)
