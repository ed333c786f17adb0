"""Workload: batch, sequence length, precision, optimizer, token budget and prices."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from ..errors import SpecError
from .files import MAX_COUNT, without_note


class Precision(StrEnum):
    """What the GEMMs compute in; activations are 16-bit under BF16, FP16, FP8 and NVFP4 (FP8
    and NVFP4 training quantize GEMM inputs and keep 16-bit activations; NVFP4 keeps its first
    and last layers and the attention core in BF16: cost/low_precision.py) and 32-bit under
    TF32 (fp32 storage, TF32 tensor-core math) and FP32 (no tensor cores: what a CPU computes)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    TF32 = "tf32"
    FP32 = "fp32"
    NVFP4 = "nvfp4"  # 4-bit E2M1 in blocks of 16 with E4M3 scales (arXiv 2509.25149); Blackwell

    @property
    def activation_bytes(self) -> float:
        """Bytes per activation element in memory and on the wire."""
        return 4.0 if self in (Precision.TF32, Precision.FP32) else 2.0


class Fp8Recipe(StrEnum):
    """How an FP8 run scales its GEMM inputs. Per-tensor from each tensor's current amax
    (Transformer Engine's current scaling, torchao's "tensorwise"; MXFP8's 1×32 blocks are
    priced so too); per-tensor from an amax history (Transformer Engine's delayed scaling,
    Megatron-LM's and NeMo's default `--fp8-recipe delayed`): the same GEMMs and casts, and at
    the end of every forward and backward pass of a model chunk an all-reduce of the chunk's
    amaxes over its pipeline stage's ranks (cost/amax.py amax_reduction_s); or
    torchao's "rowwise" (`Float8LinearConfig.from_recipe_name("rowwise")`: axiswise scales on
    all three GEMMs' operands, torchao/float8/config.py). A row-wise operand is quantized along
    the GEMM's reduction axis, so a tensor two GEMMs read along different axes is quantized
    twice, and its GEMM is a different kernel (cost/low_precision.py)."""

    TENSORWISE = "tensorwise"
    DELAYED = "delayed"
    ROWWISE = "rowwise"


class Optimizer(StrEnum):
    """Mixed-precision Adam (fp32 master weights + 2 moments, Rajbhandari et al.) by how its
    step runs: one fused multi-tensor kernel (Apex/Transformer Engine FusedAdam in Megatron
    and DeepSpeed, torch's fused=True in torchtitan), or torch.optim.AdamW's default
    element-wise passes (foreach on GPUs, one tensor at a time on a CPU), which
    `paraplan run` steps with. Memory is the same; the step's traffic is not."""

    ADAM = "adam"
    ADAM_UNFUSED = "adam-unfused"


LLAMA3_INTERRUPTIONS_PER_GPU_DAY = 419 / (54 * 16384)
ASSUMED_RESTART_S = 600.0  # ASSUMPTION (see Workload.restart_s)
LLAMA3_STORAGE_BYTES_PER_S = 2e12  # Dubey et al. 2024 Sec. 3.3.1 (see Workload.storage_bytes_per_s)
# Physical bounds on the user's workload numbers: beyond them a report prints NaN, $inf or
# 300-digit figures. 1 MB/s is slower than any disk, 1 PB/s 500 times Llama 3's Tectonic; 1e18
# tokens is about 64,000 times Llama 3's 15.6T; $1M per GPU-hour is no rental price.
MIN_STORAGE_BYTES_PER_S, MAX_STORAGE_BYTES_PER_S = 1e6, 1e15
MAX_TOKEN_BUDGET = 1e18
MAX_USD_PER_GPU_HOUR = 1e6
# A PUE is facility power over IT power, so at least 1. The upper bounds (PUE 3, 2 kg CO2e per
# kWh) are guards against a mistyped unit, not measurements: no figure here comes from them.
MAX_PUE = 3.0
# Patterson et al. 2021 ("Carbon Emissions and Large Neural Network Training", arXiv
# 2104.10350) Table 4, GPT-3's row: the PUE of the Microsoft data center it trained in and the
# carbon intensity of its grid. The defaults; set your own.
PATTERSON_GPT3_PUE = 1.10
PATTERSON_GPT3_KG_CO2E_PER_KWH = 0.429
MAX_KG_CO2E_PER_KWH = 2.0


@dataclass(frozen=True, kw_only=True)
class Workload:
    global_batch_size: int  # sequences per optimizer step
    seq_len: int
    precision: Precision = Precision.BF16
    fp8_recipe: Fp8Recipe = Fp8Recipe.TENSORWISE  # FP8 only
    optimizer: Optimizer = Optimizer.ADAM
    token_budget: float = 1e12  # tokens to train for (time / cost report)
    usd_per_gpu_hour: float | None = None  # None: the cluster's price
    # MoE, dropless: routed tokens on the busiest expert-parallel rank over the mean. 1.1 is an
    # assumption (a router trained with a load-balancing loss), not a measurement: set it from
    # your router's statistics.
    moe_imbalance: float = 1.1
    # MoE, dropless: each token's experts uniformly at random -- a router as initialized (a
    # benchmark from random weights on synthetic data), or Megatron-Core's force load balancing
    # (random logits) -- the busiest rank's load from their order statistics (cost/moe.py
    # random_routing_imbalance); moe_imbalance is then not read
    moe_routing_at_init: bool = False
    # Interruptions (hardware faults, hangs) per GPU per day: Llama 3 405B pre-training saw 419
    # unexpected interruptions in a 54-day snapshot on 16,384 H100 (Dubey et al. 2024, Sec.
    # 3.3.4, Table 5): 419 / (54 × 16,384). Set your fleet's rate; 0 disables the estimate.
    interruptions_per_gpu_day: float = LLAMA3_INTERRUPTIONS_PER_GPU_DAY
    # Seconds from an interruption to training again (detect, reschedule, re-initialize the
    # process groups, load the checkpoint). 600 s is an ASSUMPTION, not a measurement.
    restart_s: float = ASSUMED_RESTART_S
    # Sustained write bandwidth of the checkpoint storage to the job: a checkpoint cannot be
    # taken faster than it is written. 2 TB/s is Llama 3's Tectonic fabric ("a sustainable
    # throughput of 2 TB/s", Dubey et al. 2024, Sec. 3.3.1).
    storage_bytes_per_s: float = LLAMA3_STORAGE_BYTES_PER_S
    # The facility's power usage effectiveness and its grid's carbon intensity, for the
    # energy and carbon of the budget (cost/carbon.py; defaults: Patterson et al. 2021 Table
    # 4, GPT-3's data center and grid)
    pue: float = PATTERSON_GPT3_PUE
    grid_kg_co2e_per_kwh: float = PATTERSON_GPT3_KG_CO2E_PER_KWH
    # PyTorch's caching allocator with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (as
    # torchtitan's launcher sets it): the allocator replay that prices fragmentation grows one
    # range instead of opening segments (cost/allocator.py replay_step)
    expandable_segments: bool = False

    def __post_init__(self) -> None:
        # at most MAX_COUNT each: their product (tokens per step) stays within int64
        if not 1 <= self.global_batch_size <= MAX_COUNT:
            raise SpecError("workload", "global_batch_size", self.global_batch_size,
                            f"must be from 1 to {MAX_COUNT} sequences")
        if not 1 <= self.seq_len <= MAX_COUNT:
            raise SpecError("workload", "seq_len", self.seq_len, f"must be from 1 to {MAX_COUNT} tokens")
        if self.fp8_recipe is not Fp8Recipe.TENSORWISE and self.precision is not Precision.FP8:
            raise SpecError("workload", "fp8_recipe", str(self.fp8_recipe),
                            f"a scaling recipe of FP8 training; this workload's precision is {self.precision} "
                            "(--precision fp8, or leave --fp8-recipe at tensorwise)")
        if isinstance(self.moe_imbalance, bool) or not isinstance(self.moe_imbalance, (int, float)) \
                or not 1.0 <= self.moe_imbalance < math.inf:
            raise SpecError("workload", "moe_imbalance", self.moe_imbalance,
                            "must be a finite number >= 1.0 (busiest expert-parallel rank's load over the mean; "
                            "moe_routing_at_init=True for a router as initialized)")
        if not isinstance(self.moe_routing_at_init, bool):
            raise SpecError("workload", "moe_routing_at_init", self.moe_routing_at_init, "True or False")
        if not 0 < self.token_budget <= MAX_TOKEN_BUDGET:
            raise SpecError("workload", "token_budget", self.token_budget,
                            f"must be a number > 0 and <= {MAX_TOKEN_BUDGET:g} tokens (--tokens)")
        if not 0 <= self.interruptions_per_gpu_day < math.inf:
            raise SpecError("workload", "interruptions_per_gpu_day", self.interruptions_per_gpu_day,
                            "must be a finite number >= 0 (0: no interruptions)")
        if not MIN_STORAGE_BYTES_PER_S <= self.storage_bytes_per_s <= MAX_STORAGE_BYTES_PER_S:
            raise SpecError("workload", "storage_bytes_per_s", self.storage_bytes_per_s,
                            f"must be from {MIN_STORAGE_BYTES_PER_S:g} to {MAX_STORAGE_BYTES_PER_S:g} bytes/s "
                            "(1 MB/s to 1 PB/s: --storage-gb-per-s 0.001 to 1e6)")
        if not 0 <= self.restart_s < math.inf:
            raise SpecError("workload", "restart_s", self.restart_s, "must be a finite number >= 0 seconds")
        if self.usd_per_gpu_hour is not None and not 0 <= self.usd_per_gpu_hour <= MAX_USD_PER_GPU_HOUR:
            raise SpecError("workload", "usd_per_gpu_hour", self.usd_per_gpu_hour,
                            f"must be a number >= 0 and <= {MAX_USD_PER_GPU_HOUR:g} $ per GPU-hour (--price)")

        if not 1.0 <= self.pue <= MAX_PUE:
            raise SpecError("workload", "pue", self.pue, f"must be a number from 1 to {MAX_PUE:g} (--pue)")
        if not 0.0 <= self.grid_kg_co2e_per_kwh <= MAX_KG_CO2E_PER_KWH:
            raise SpecError("workload", "grid_kg_co2e_per_kwh", self.grid_kg_co2e_per_kwh,
                            f"must be a number from 0 to {MAX_KG_CO2E_PER_KWH:g} kg CO2e per kWh (--grid-kg-per-kwh)")

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def fp8_rowwise(self) -> bool:
        """FP8 training with row-wise scales (cost/low_precision.py prices it)."""
        return self.precision is Precision.FP8 and self.fp8_recipe is Fp8Recipe.ROWWISE

    @property
    def fp8_delayed(self) -> bool:
        """FP8 training with delayed scaling (its amax all-reduces: cost/amax.py)."""
        return self.precision is Precision.FP8 and self.fp8_recipe is Fp8Recipe.DELAYED

    @property
    def precision_label(self) -> str:
        """The precision as reports print it: "fp8 (rowwise)", "fp8 (delayed)" under those recipes."""
        return (f"{self.precision} ({self.fp8_recipe})" if self.fp8_rowwise or self.fp8_delayed
                else str(self.precision))


# Other spellings in published measurements and the engines' own flags: Megatron-Bridge's FP8
# recipes (current scaling, delayed scaling, MXFP8; the cost model has one FP8), Lightning's
# "bf16-mixed", torch dtype names.
_PRECISION_ALIASES = {"fp8-cs": Precision.FP8, "fp8-ds": Precision.FP8, "fp8-mx": Precision.FP8,
                      "mxfp8": Precision.FP8, "bf16-mixed": Precision.BF16, "bfloat16": Precision.BF16,
                      "fp16-mixed": Precision.FP16, "float16": Precision.FP16, "float32": Precision.FP32}


def parse_precision(text: str, field: str = "precision") -> Precision:
    """One of the precisions by name (any case), or an alias; a note in parentheses after it
    ("BF16 (AMP)", "FP8 (implied; see notes)") is allowed. Nothing else: "xbf16y" is no bf16."""
    t = without_note(text).lower()
    if t in _PRECISION_ALIASES:
        return _PRECISION_ALIASES[t]
    try:
        return Precision(t)
    except ValueError:
        raise SpecError("workload", field, text,
                        "allowed: " + ", ".join(Precision) + " (or " + ", ".join(_PRECISION_ALIASES)
                        + "; a note in parentheses may follow)") from None


def parse_fp8_recipe(text: str, field: str = "fp8_recipe") -> Fp8Recipe:
    """An FP8 scaling recipe by name (any case), else a one-line SpecError naming the allowed."""
    try:
        return Fp8Recipe(str(text).strip().lower())
    except ValueError:
        raise SpecError("workload", field, text, "allowed: " + ", ".join(Fp8Recipe)) from None
