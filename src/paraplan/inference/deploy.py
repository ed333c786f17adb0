"""A serving deployment (frozen), the traffic it serves, and the engine's batching limits.

A deployment is `replicas` copies of one model instance; an instance spans tp × pp GPUs
(experts, if any, over ep of those tp GPUs). Weights and the KV cache each have a storage
dtype; weight-only quantization (int8, int4) keeps 16-bit activations and compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from ..errors import SpecError
from ..specs.workload import Precision


class StoreDtype(StrEnum):
    """Storage dtype of weights or KV cache."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"

    @property
    def bytes_per_element(self) -> float:
        return {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}[self.value]

    @classmethod
    def parse(cls, text: str, field: str) -> "StoreDtype":
        t = str(text).strip().lower()
        for d in cls:
            if d.value == t:
                return d
        raise SpecError("deployment", field, text, "allowed: " + ", ".join(d.value for d in cls))


class AttentionSharding(StrEnum):
    """Where the KV cache lives across the tp GPUs (Pope et al. 2022, Sec. 3.3, Fig. 4)."""

    HEADS = "heads"  # Megatron: KV heads split over tp; a head is replicated when tp > kv heads
    BATCH = "batch"  # each GPU holds the whole KV cache of b/tp sequences (multiquery-friendly)


class Layout(StrEnum):
    """FFN weight layouts of Pope et al. 2022, Sec. 3.2 (communication in layouts.py)."""

    WS_1D = "ws1d"   # 1D weight-stationary (Megatron TP): weights split on d_ff
    WS_2D = "ws2d"   # 2D weight-stationary: weights split on d_model and d_ff
    WG_XYZ = "wgxyz"  # weight-gathered over all chips: weights all-gathered per layer


@dataclass(frozen=True, kw_only=True)
class ServePlan:
    tp: int = 1
    pp: int = 1
    ep: int = 1          # MoE: experts split over ep of the tp GPUs (the rest of tp splits each expert)
    replicas: int = 1
    weight_dtype: StoreDtype = StoreDtype.BF16
    kv_dtype: StoreDtype = StoreDtype.BF16
    attention_sharding: AttentionSharding = AttentionSharding.HEADS
    # MoE expert buffering (Huang et al. 2023, "Towards MoE Deployment", Sec. 5): keep this
    # share of each GPU's experts in HBM, the rest in host memory, fetched when routed to.
    # A token finds its expert cached with probability expert_hit_rate (None: the cached
    # share itself, as under uniform routing; skewed routers hit more).
    expert_cache_fraction: float = 1.0
    expert_hit_rate: float | None = None

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "ep", "replicas"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError("deployment", f, v, "a positive integer is required")
        if not 0.0 < self.expert_cache_fraction <= 1.0:
            raise SpecError("deployment", "expert_cache_fraction", self.expert_cache_fraction, "must be in (0, 1]")
        if self.expert_hit_rate is not None and not self.expert_cache_fraction <= self.expert_hit_rate <= 1.0:
            raise SpecError("deployment", "expert_hit_rate", self.expert_hit_rate,
                            f"must be in [expert_cache_fraction={self.expert_cache_fraction}, 1]")
        if self.tp % self.ep:
            raise SpecError("deployment", "ep", self.ep, f"must divide tp={self.tp} (experts are split over the tp GPUs)")

    @property
    def hit_rate(self) -> float:
        return self.expert_cache_fraction if self.expert_hit_rate is None else self.expert_hit_rate

    @property
    def gpus_per_replica(self) -> int:
        return self.tp * self.pp

    @property
    def num_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    @property
    def compute_precision(self) -> Precision:
        """FP8 weights run FP8 GEMMs; int8/int4 are weight-only (dequantized to 16 bits)."""
        return Precision.FP8 if self.weight_dtype is StoreDtype.FP8 else (
            Precision.FP16 if self.weight_dtype is StoreDtype.FP16 else Precision.BF16)

    def describe(self) -> str:
        s = f"TP{self.tp} PP{self.pp}"
        if self.ep > 1:
            s += f" EP{self.ep}"
        if self.replicas > 1:
            s += f" ×{self.replicas}"
        s += f" w:{self.weight_dtype} kv:{self.kv_dtype}"
        if self.attention_sharding is AttentionSharding.BATCH:
            s += " kv-by-batch"
        if self.expert_cache_fraction < 1.0:
            s += f" experts-in-HBM:{self.expert_cache_fraction:.0%}"
        return s


@dataclass(frozen=True, kw_only=True)
class EngineLimits:
    """Iteration-level batching knobs of the serving engine (Orca / vLLM / TensorRT-LLM).

    Defaults are TensorRT-LLM's `trtllm-build` defaults (max_batch_size 2048, max_num_tokens
    8192) and its `kv_cache_free_gpu_mem_fraction` 0.9 (TensorRT-LLM docs, "Useful build-time
    flags" / "KV cache"): the engines behind the published measurements in validation.
    """

    max_batch: int = 2048         # sequences in one iteration
    max_num_tokens: int = 8192    # tokens (prefill + decode) in one iteration
    kv_free_fraction: float = 0.9  # of the HBM left after weights and workspace
    chunked_prefill: bool = False  # Sarathi: split prompts to fill max_num_tokens every iteration
    # Whether the engine honours the model's sliding windows: a windowed layer attends to and
    # keeps only its last w tokens. vLLM's hybrid KV-cache manager does (v0.10+); TensorRT-LLM
    # does when max_attention_window_size is set, not by default — its published Mistral 7B
    # throughput at 20,000-token prompts matches full attention (docs/model.md, Serving).
    sliding_window_kv: bool = False

    def __post_init__(self) -> None:
        for f in ("max_batch", "max_num_tokens"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise SpecError("engine", f, v, "a positive integer is required")
        if not 0.0 < self.kv_free_fraction <= 1.0:
            raise SpecError("engine", "kv_free_fraction", self.kv_free_fraction, "must be in (0, 1]")


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """Requests: fixed prompt and output lengths, arriving at `rate_rps` (Poisson), or all at
    once (`rate_rps` None: maximum load) or as a closed loop of `concurrency` users."""

    prompt_tokens: int
    output_tokens: int
    rate_rps: float | None = None
    concurrency: int | None = None
    num_requests: int = 500
    ttft_target_s: float | None = None
    tpot_target_s: float | None = None

    def __post_init__(self) -> None:
        for f in ("prompt_tokens", "output_tokens", "num_requests"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError("traffic", f, v, "a positive integer is required")
        if self.rate_rps is not None and not self.rate_rps > 0:
            raise SpecError("traffic", "rate_rps", self.rate_rps, "must be > 0 requests/s (omit for maximum load)")
        if self.concurrency is not None and self.concurrency < 1:
            raise SpecError("traffic", "concurrency", self.concurrency, "must be >= 1")
        if self.rate_rps is not None and self.concurrency is not None:
            raise SpecError("traffic", "concurrency", self.concurrency, "give a request rate or a concurrency, not both")
        for f in ("ttft_target_s", "tpot_target_s"):
            v = getattr(self, f)
            if v is not None and not v > 0:
                raise SpecError("traffic", f, v, "must be > 0 seconds")

    @property
    def context_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens
