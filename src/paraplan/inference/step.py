"""Time and memory of one serving iteration: a forward pass over a mixed batch.

Notation (Pope et al. 2022): l layers, h d_model, f d_ff, a heads, k kv heads, d head dim,
V vocab, t tensor-parallel GPUs, p pipeline stages, T tokens in the iteration (prompt
tokens being prefilled + one per decoding sequence).

An iteration of iteration-level batching (Orca, Yu et al. OSDI'22; vLLM; TensorRT-LLM
in-flight batching) runs every linear layer once over all T tokens: the weights are read
from HBM once per iteration, which is why decode is memory-bound until T reaches the GPU's
FLOP/byte ratio (Pope et al. Sec. 2.2). Attention is per sequence: prefill chunks do
2·c·(c/2 + past)·(a·d + a·d_v) FLOPs (causal; 4·c·(c/2 + past)·a·d without MLA), each
decoding sequence reads its whole KV cache.
Every kernel is a roofline (cost/roofline.py conventions): max(FLOPs / achieved FLOP/s,
bytes / achieved HBM bandwidth) + a launch overhead; tensor parallelism adds two
all-reduces of T·h activations per layer (Shoeybi et al. 2019), costed by cost/comm.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..cost.comm import Collective, collective_time_s, pipeline_hops_s
from ..cost.memory import ACT_BYTES  # activations and all-reduces in 16 bits (FP8 engines too)
from ..errors import SpecError
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision
from .deploy import AttentionSharding, EngineLimits, ServePlan

LOGIT_BYTES = 4.0   # fp32 logits for sampling
# Kernels per transformer layer in a fused serving engine besides its GEMMs (each GEMM's
# launch is in its own price, _gemm_s): 2 norms, rope/KV write, attention, activation, 2
# residual adds.
KERNELS_PER_LAYER = 7
# Element-wise traffic per layer: norms, residual adds, activation, rope — about eight
# reads or writes of the T×h activations (plus the T×f activation, counted apart).
ELEMENTWISE_PASSES = 8
# Launches of a fused MoE layer's routed experts: the grouped up (gate+up) and down GEMMs.
FUSED_MOE_GEMMS = 2


@dataclass(frozen=True, kw_only=True)
class ServeMemory:
    """Per-GPU memory of one replica's worst stage; the KV cache gets what is left."""

    weights_bytes: float
    workspace_bytes: float
    reserved_bytes: float
    kv_cache_bytes: float
    hbm_bytes: float
    kv_bytes_per_token: float      # per GPU, for one token of one sequence (all its layers)
    kv_capacity_tokens: int        # tokens of KV cache one replica holds
    host_bytes: float = 0.0        # expert weights kept in host memory (expert buffering), per GPU

    @property
    def fits(self) -> bool:
        return self.kv_capacity_tokens > 0

    def parts(self) -> dict[str, float]:
        return {"weights_bytes": self.weights_bytes, "workspace_bytes": self.workspace_bytes,
                "reserved_bytes": self.reserved_bytes, "kv_cache_bytes": self.kv_cache_bytes}


@dataclass(frozen=True)
class AttentionWindow:
    """How much of its context a sequence's layers attend to and keep in the KV cache.

    A sliding-window layer (Mistral, GPT-OSS) attends to, and keeps, only its last w tokens
    (Beltagy et al. 2020; the GPT-OSS model card): engines size its KV cache to the window
    (vLLM's hybrid KV-cache manager, TensorRT-LLM's per-layer attention window). Quantities
    here are in full-attention-layer equivalents: `share` of the layers count min(c, w)
    where a full layer counts c, so a model without windows gets its plain token counts.
    """

    window: int = 0      # tokens (0: every layer attends to the whole context)
    share: float = 0.0   # fraction of the layers that are windowed

    @classmethod
    def of(cls, model: ModelSpec, honoured: bool) -> AttentionWindow:
        """The model's windows; none where the engine runs every layer as full attention."""
        if not honoured or not model.sliding_window or not model.num_sliding_window_layers:
            return cls()
        return cls(model.sliding_window, model.num_sliding_window_layers / model.num_layers)

    def held(self, context: float) -> float:
        """KV tokens a sequence of `context` tokens keeps (full-layer equivalents)."""
        if not self.window:
            return float(context)
        return (1.0 - self.share) * context + self.share * min(context, self.window)

    def held_paged(self, context: int, page_tokens: int) -> float:
        """The same in whole KV pages per layer group: a window of w tokens that does not
        start on a page boundary spans up to ceil((w − 1)/page) + 1 pages."""
        def pages(n: float) -> float:
            return math.ceil(n / page_tokens) * page_tokens
        if not self.window:
            return pages(context)
        span = (math.ceil((self.window - 1) / page_tokens) + 1) * page_tokens
        return (1.0 - self.share) * pages(context) + self.share * min(pages(context), span)

    def prefill_pairs(self, done: int, chunk: int) -> float:
        """(query, key) pairs of prefilling `chunk` prompt tokens after `done`: c·(d + c/2)
        causal (continuous form), a windowed layer's query at position i seeing min(i, w) keys."""
        full = chunk * (done + chunk / 2.0)
        if not self.window:
            return full
        w = self.window
        below = min(max(w - done, 0), chunk)   # queries before the window fills
        windowed = below * (done + below / 2.0) + (chunk - below) * w
        return (1.0 - self.share) * full + self.share * windowed

    def max_context(self, held_tokens: float) -> float:
        """The longest context whose KV is `held_tokens` (the inverse of `held`)."""
        if not self.window or held_tokens <= self.window:
            return held_tokens
        # past the window only the full layers grow
        if self.share >= 1.0:
            return math.inf  # every layer windowed: the cache stops growing at w
        return self.window + (held_tokens - self.window) / (1.0 - self.share)


def kv_bytes_per_token_per_layer(model: ModelSpec, kv_bytes: float) -> float:
    """K and V of one token in one layer (all heads): 2·k·d elements (MLA: r_kv + d_r latent)."""
    if model.is_mla:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * kv_bytes
    return 2.0 * model.num_kv_heads * model.head_dim * kv_bytes


def body_params_per_layer(model: ModelSpec) -> float:
    """Parameters of one transformer layer on average (all but the embedding and LM head)."""
    return (model.num_params - model.embedding_params - model.lm_head_params) / model.num_layers


def attention_gemms(model: ModelSpec, t: int) -> list[tuple[float, float]]:
    """The attention projections of one layer as (n, k) GEMMs on one of t GPUs.

    MHA/GQA (Shoeybi et al. 2019): fused QKV (q_dim + 2·k·d)/t × h, output h × q_dim/t.
    MLA (DeepSeek-V2 Sec. 2.1.2, the shapes of ModelSpec.attn_params_per_layer): the
    down-projections W_DQ, W_DKV and W_KR run whole on every GPU (vLLM's replicated
    `fused_qkv_a_proj`, TensorRT-LLM's `fused_a`); W_UQ, W_UK/W_UV and the output split by
    heads. Decode's absorbed form multiplies by the same W_UK/W_UV, so it reads the same bytes.
    """
    h = model.hidden_size
    if not model.is_mla:
        return [((model.q_dim + model.kv_pair_dim) / t, h), (h, model.q_dim / t)]
    rq, rkv, dr = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
    d_nope, d_v = model.head_dim - dr, model.v_head_dim or model.head_dim
    if rq:
        gemms = [(rq + rkv + dr, h), (model.q_dim / t, rq)]
    else:  # full-rank query projection, split by heads
        gemms = [(rkv + dr, h), (model.q_dim / t, h)]
    return gemms + [(model.num_heads * (d_nope + d_v) / t, rkv), (h, model.v_dim / t)]


def replicated_params_per_layer(model: ModelSpec) -> float:
    """Weights every tensor-parallel GPU holds whole: MLA's down-projections (attention_gemms)."""
    if not model.is_mla:
        return 0.0
    return model.hidden_size * ((model.q_lora_rank or 0) + model.kv_lora_rank + model.qk_rope_head_dim)


def kv_share_per_gpu(model: ModelSpec, plan: ServePlan) -> float:
    """Fraction of a token's KV that one of the t GPUs stores.

    Sharded over heads, each GPU holds ceil(k/t) of the k kv heads (a head is replicated when
    t > k; MLA's latent is shared by all heads, so replicated); sharded over batch, a
    sequence's KV lives on one GPU: 1/t on average (Pope et al. Sec. 3.3).
    """
    t = plan.tp
    if plan.attention_sharding is AttentionSharding.BATCH:
        return 1.0 / t
    if model.is_mla:
        return 1.0
    return math.ceil(model.num_kv_heads / t) / model.num_kv_heads


def serve_memory(model: ModelSpec, cluster: ClusterSpec, plan: ServePlan, limits: EngineLimits) -> ServeMemory:
    gpu = cluster.gpu
    t, p = plan.tp, plan.pp
    wb = plan.weight_dtype.bytes_per_element
    layers_per_stage = math.ceil(model.num_layers / p)
    body = body_params_per_layer(model)
    ends = max(model.embedding_params + (model.lm_head_params if p == 1 else 0), model.lm_head_params)
    replicated = replicated_params_per_layer(model) * layers_per_stage * (1.0 - 1.0 / t)
    weights = ((body * layers_per_stage + ends) / t + replicated) * wb
    host = 0.0
    if model.is_moe and plan.expert_cache_fraction < 1.0:
        # expert buffering (Huang et al. 2023): every expert in host memory, a share c cached in HBM
        host = model.expert_params / model.num_layers * layers_per_stage / t * wb
        weights -= host * (1.0 - plan.expert_cache_fraction)
    # Activation workspace sized for max_num_tokens (the engine allocates it up front) and
    # fp32 logits for max_batch rows (TensorRT-LLM sizes both at engine build).
    f_local = (model.num_mlp_matrices - 1) * max(model.ffn_hidden_size, model.moe_ffn_hidden_size * max(model.top_k, 1)) / t
    tok = limits.max_num_tokens
    workspace = tok * (2 * model.hidden_size + (model.q_dim + model.kv_pair_dim) / t + f_local) * ACT_BYTES
    workspace += min(limits.max_batch, tok) * model.vocab_size / t * LOGIT_BYTES
    free = gpu.hbm_bytes - weights - workspace - gpu.reserved_bytes
    kv_cache = max(free, 0.0) * limits.kv_free_fraction
    per_token = kv_bytes_per_token_per_layer(model, plan.kv_dtype.bytes_per_element) * layers_per_stage \
        * kv_share_per_gpu(model, plan)
    capacity = int(kv_cache // per_token) if kv_cache > 0 else 0
    return ServeMemory(weights_bytes=weights, workspace_bytes=workspace, reserved_bytes=gpu.reserved_bytes,
                       kv_cache_bytes=kv_cache, hbm_bytes=gpu.hbm_bytes, kv_bytes_per_token=per_token,
                       kv_capacity_tokens=capacity, host_bytes=host)


def routed_experts(T: int, E: int, k: int, local_experts: float) -> tuple[float, float]:
    """(experts of `local_experts` that get a token, tokens each gets) when T tokens each pick
    k of E experts uniformly (dropless, "dynamic gating" of Huang et al. 2023).

    An expert gets none of the T tokens with probability (1 − k/E)^T; the T·k/E tokens an
    expert expects are shared by the active ones, so active × tokens = local_experts·T·k/E.
    """
    p_active = 1.0 - (1.0 - k / E) ** T
    if p_active <= 0.0:
        return 0.0, 0.0
    return local_experts * p_active, T * k / E / p_active


class IterationModel:
    """Time of one iteration of one replica, fast enough to call once per simulated step.

    Linear layers and communication depend only on the token count T (memoized); attention
    is linear in the prefill pair count and the decoded context, so the simulator passes sums.
    """

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, plan: ServePlan):
        if plan.tp > cluster.gpus_per_node:
            raise SpecError("deployment", "tp", plan.tp,
                            f"must be <= {cluster.gpus_per_node} GPUs of one {cluster.name} node (NVLink domain)")
        self.model, self.cluster, self.plan = model, cluster, plan
        gpu = cluster.gpu
        self.gpu = gpu
        self.layers_per_stage = math.ceil(model.num_layers / plan.pp)
        self.precision = plan.compute_precision
        self.wbytes = plan.weight_dtype.bytes_per_element
        self.kvbytes = plan.kv_dtype.bytes_per_element
        self.mem_bw = gpu.hbm_bw_bytes_per_s * gpu.memory_bw_efficiency
        self.ew_bw = gpu.hbm_bw_bytes_per_s * gpu.elementwise_bw_efficiency  # norms, RoPE, activation
        self.peak16 = gpu.peak(Precision.BF16)
        if self.precision is Precision.FP8:
            self.peak = gpu.peak(Precision.FP8)
            self.gemm_rate_scale = self.peak * gpu.fp8_gemm_efficiency_ratio * gpu.compute_share
            self.curve_flops_scale = self.peak16 / self.peak  # the curve is by BF16 FLOPs
        else:
            self.peak = gpu.peak(self.precision)
            self.gemm_rate_scale = self.peak * gpu.compute_share
            self.curve_flops_scale = 1.0
        self.attn_curve = gpu.attention_curve(gpu.attention_kernels[-1])
        t = plan.tp
        h = model.hidden_size
        # GEMMs of one layer as (n, k) of the T×k · k×n product on one GPU
        self.dense_gemms = attention_gemms(model, t)
        f = model.ffn_hidden_size
        mlp = [((model.num_mlp_matrices - 1) * f / t, h), (h, f / t)]
        self.mlp_gemms = mlp
        self.kv_read_per_token = kv_bytes_per_token_per_layer(model, self.kvbytes) * kv_share_per_gpu(model, plan)
        self.attn_heads_share = 1.0 / t  # a·d/t query width per GPU
        self._linear = lru_cache(maxsize=None)(self._linear_s)
        self.lm_head_s = lru_cache(maxsize=None)(self._lm_head_s)
        self._hop = lru_cache(maxsize=None)(self._hop_s)

    # ---- pieces -------------------------------------------------------------------------
    def _gemm_s(self, m: float, n: float, k: float, weight_bytes: float | None = None) -> float:
        """One GEMM kernel: its roofline time and its launch."""
        return self._gemm_work_s(m, n, k, weight_bytes) + self.gpu.kernel_launch_overhead_s

    def _gemm_work_s(self, m: float, n: float, k: float, weight_bytes: float | None = None) -> float:
        """A GEMM's roofline time without its launch (also one expert's share of a fused MoE kernel)."""
        flops = 2.0 * m * n * k
        # FP8: an FP8 GEMM finishes its FLOPs like a BF16 GEMM of peak16/peak8 as many
        # (cost/roofline.gemm_time_s)
        rate = self.gemm_rate_scale * self.gpu.gemm_efficiency.at(flops * self.curve_flops_scale)
        wbytes = n * k * self.wbytes if weight_bytes is None else weight_bytes
        moved = wbytes + (m * k + m * n) * ACT_BYTES
        return max(flops / rate, moved / self.mem_bw)

    def _moe_s(self, T: int) -> float:
        """Routed experts of one MoE layer over T tokens (each GPU: E/ep experts, 1/(t/ep) of each)."""
        m = self.model
        t, ep = self.plan.tp, self.plan.ep
        E, k, fe = m.num_experts, m.top_k, m.moe_ffn_hidden_size
        split = t // ep
        active, tokens_per_expert = routed_experts(T, E, k, E / ep)
        in_n, out_k = (m.num_mlp_matrices - 1) * fe / split, fe / split
        h = m.hidden_size
        s = 0.0
        if active > 0:
            # One fused kernel per projection runs every active local expert (TensorRT-LLM's
            # MoE plugin and CutlassFusedMoE, vLLM's fused_moe): FUSED_MOE_GEMMS launches per
            # layer, not one per expert; each expert's share keeps the efficiency of its own
            # GEMM size (docs/model.md, Serving: wave packing is not modelled).
            work = self._gemm_work_s(tokens_per_expert, in_n, h) + self._gemm_work_s(tokens_per_expert, h, out_k)
            s += active * work + FUSED_MOE_GEMMS * self.gpu.kernel_launch_overhead_s
            miss = 1.0 - self.plan.hit_rate
            if miss > 0:  # routed-to experts not in HBM come over the host link (Huang et al. 2023)
                expert_bytes = m.num_mlp_matrices * h * fe / split * self.wbytes
                s += active * miss * expert_bytes / self.gpu.host_link_bw_unidir_bytes_per_s
        if m.shared_expert_ffn_hidden_size:
            fs = m.shared_expert_ffn_hidden_size
            s += self._gemm_s(T, (m.num_mlp_matrices - 1) * fs / t, h) + self._gemm_s(T, h, fs / t)
        s += self._gemm_s(T, E, h)  # router
        # No all-to-all: ep divides t, and with attention split over the t GPUs every GPU
        # holds all T tokens; it runs its local experts on the tokens routed to them and the
        # layer's TP all-reduce sums the partial outputs (vLLM's expert_map, TensorRT-LLM's
        # MoE EP inside the TP group).
        return s

    def _linear_s(self, T: int) -> float:
        """Everything in one stage that depends only on T: GEMMs, element-wise, TP all-reduces."""
        m, gpu = self.model, self.gpu
        h = m.hidden_size
        per_layer = sum(self._gemm_s(T, n, k) for n, k in self.dense_gemms)
        per_layer += ELEMENTWISE_PASSES * T * h * ACT_BYTES / self.ew_bw
        per_layer += KERNELS_PER_LAYER * gpu.kernel_launch_overhead_s
        if self.plan.tp > 1:
            per_layer += 2 * float(collective_time_s(self.cluster, Collective.ALL_REDUCE, T * h * ACT_BYTES,
                                                     self.plan.tp, 1))
        dense_mlp = sum(self._gemm_s(T, n, k) for n, k in self.mlp_gemms)
        L = self.layers_per_stage
        if m.is_moe:
            moe_share = m.num_moe_layers / m.num_layers
            mlp = L * (moe_share * self._moe_s(T) + (1.0 - moe_share) * dense_mlp)
        else:
            mlp = L * dense_mlp
        return L * per_layer + mlp

    def attention_s(self, prefill_pairs: float, decode_ctx_tokens):
        """One stage's attention: prefill (query, key) pairs and tokens of KV read by decode
        (a number, or an array of them: one value per iteration)."""
        m = self.model
        L = self.layers_per_stage
        s = 0.0
        if prefill_pairs > 0:
            # 2 FLOPs per multiply-add for QKᵀ (width a·d) and for PV (width a·d_v; MLA's
            # d_v = 128 < d = 192): 4·pairs·a·d without MLA
            flops = 2.0 * prefill_pairs * (m.q_dim + m.v_dim) * self.attn_heads_share
            s += flops / (self.peak16 * self.attn_curve.at(flops) * self.gpu.compute_share)
        # (no test on decode_ctx_tokens: it may be an array of iterations, batching.py)
        s += decode_ctx_tokens * self.kv_read_per_token / self.mem_bw
        return L * s

    def _hop_s(self, tokens: int) -> tuple[float, float]:
        """Activations of `tokens` passed down the pipeline: (all p − 1 sends, the slowest one).
        Stage i holds GPUs [i·tp, (i+1)·tp); a send between stages on two nodes crosses the
        network, one between islands the data-center tier, the others stay on NVLink
        (cost/comm.py pipeline_hops_s)."""
        p, tp = self.plan.pp, self.plan.tp
        if p <= 1:
            return 0.0, 0.0
        num_bytes = tokens * self.model.hidden_size * ACT_BYTES
        _, total, slowest = pipeline_hops_s(self.cluster, num_bytes, p, tp, tp)
        return float(total), float(slowest)

    def _lm_head_s(self, rows: int) -> float:
        if rows <= 0:
            return 0.0
        m = self.model
        return self._gemm_s(rows, m.vocab_size / self.plan.tp, m.hidden_size)

    def time_s(self, prefill_tokens: int, prefill_pairs: float, decode_seqs: int, decode_ctx_tokens,
               logit_rows: int, *, prefill_chunks: int | None = None, largest_chunk: int | None = None):
        """Iteration time of one replica: every sequence advances one step (a prompt chunk or
        one decoded token). `prefill_chunks` prompts are being prefilled, the longest chunk
        `largest_chunk` tokens (default: all prefill tokens are one prompt's chunk). With an
        array of `decode_ctx_tokens` (iterations alike but for the KV they read), an array of
        times, each what the call with that one value returns.

        With p > 1 stages the batch runs as m ≤ p micro-batches of whole sequences (a chunk is
        not split; GPipe, Huang et al. 2019; vLLM/TensorRT-LLM pipeline parallelism), each
        slot sized by the largest micro-batch, Tm = max(longest chunk, ⌈T/m⌉) tokens. A cyclic
        pipeline turns once per max(round trip, m × bottleneck slot): the round trip is p stage
        times + the LM head + (p−1) activation hops, so a lone request gains nothing from PP
        (Pope et al. 2022); the bottleneck stage is the last (stage + its whole LM
        head) or a middle one (stage + its send).
        """
        T = prefill_tokens + decode_seqs
        if T <= 0:
            return 0.0
        p = self.plan.pp
        if p == 1:
            return (self._linear(T) + self.attention_s(prefill_pairs, decode_ctx_tokens)
                    + self.lm_head_s(logit_rows))
        if prefill_chunks is None:
            prefill_chunks = 1 if prefill_tokens > 0 else 0
        if largest_chunk is None:
            largest_chunk = prefill_tokens if prefill_chunks <= 1 else math.ceil(prefill_tokens / prefill_chunks)
        m = max(1, min(p, prefill_chunks + decode_seqs))
        Tm = min(T, max(largest_chunk, 1, math.ceil(T / m)))
        share = Tm / T   # of the attention work and the sampled rows, in the largest micro-batch
        stage = self._linear(Tm) + self.attention_s(prefill_pairs * share, decode_ctx_tokens * share)
        head = self.lm_head_s(-(-logit_rows * Tm // T))
        hops, slowest = self._hop(Tm)
        return np.maximum(p * stage + head + hops, m * (stage + max(head, slowest)))
