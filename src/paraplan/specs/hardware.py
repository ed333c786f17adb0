"""Hardware specs: GPU, node (NVLink domain), scale-out network and optional islands.

Bandwidths are per GPU and unidirectional (`_unidir_`) unless a name says otherwise;
datasheet numbers carry their source in the catalog TOML files.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any

from ..enums import CodedEnum
from ..errors import SpecError
from .curves import EfficiencyCurve
from .workload import Precision


class AttentionKernel(CodedEnum):
    """Which attention implementation runs: it sets speed (per-GPU curves) and memory."""

    UNFUSED = "unfused"  # batched GEMMs + softmax; stores the s×s scores (Megatron 2021–22)
    FLASH2 = "flash2"    # FlashAttention-2 (Dao 2023) and its Triton/CK ports
    FLASH3 = "flash3"    # FlashAttention-3 / cuDNN fused attention (Shah et al. 2024), Hopper+


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    name: str
    peak_flops_per_s: dict  # Precision -> dense FLOP/s (no sparsity)
    hbm_bytes: float
    hbm_bw_bytes_per_s: float
    tdp_watts: float
    host_link_bw_unidir_bytes_per_s: float  # PCIe / C2C to host memory, for offload
    # Achieved efficiency, as data (calibrated): fraction of peak vs GEMM FLOPs.
    gemm_efficiency: EfficiencyCurve
    # Fused-attention fraction of the 16-bit peak vs FLOPs of one call, per kernel the GPU
    # runs (AttentionKernel -> curve; FLASH2 always present). UNFUSED uses the GEMM curve.
    attention_efficiency: dict
    # Achieved FP8 GEMM efficiency relative to the BF16 one at the same shape.
    fp8_gemm_efficiency_ratio: float = 0.75
    # Under torchao's row-wise FP8 recipe (Workload.fp8_recipe; a scale per row of each
    # operand), its GEMM's efficiency relative to the per-tensor FP8 GEMM's of the same shape:
    # torch._scaled_mm runs row-wise scales in a CUTLASS kernel, per-tensor ones in cuBLAS.
    # 1.0 where no row-wise run has fitted it (paraplan fit).
    fp8_rowwise_gemm_efficiency_ratio: float = 1.0
    # A GEMM whose operand rows are not a multiple of 16 bytes (a 16-bit vocabulary of 50,257)
    # misses the aligned tensor-core kernels: cuBLAS falls back to an "align1" kernel. Its
    # efficiency relative to the aligned GEMM of the same shape; 1.0 where not measured.
    misaligned_gemm_efficiency_ratio: float = 1.0
    # Fraction of HBM bandwidth reached by streaming kernels (copies, casts, the optimizer).
    memory_bw_efficiency: float = 0.8
    # The same for a layer's element-wise kernels (norms, RoPE, activation, residual, softmax
    # and loss), on the bytes the cost model counts; None: memory_bw_efficiency. A GPU streams
    # them at about the copy rate; a CPU core computes exp/rsqrt far slower than it copies
    # (paraplan calibrate measures a layer's mix).
    elementwise_efficiency: float | None = None
    # The same for the element-wise mix as eager PyTorch runs it, one kernel per op (F.rms_norm,
    # RoPE's mul/cat, SiLU·up, residual adds: paraplan calibrate's measurement), on engines
    # without fused layer kernels (Plan.fused_kernels False: torchtitan, Hugging Face models,
    # paraplan run); None: elementwise_efficiency. Transformer Engine's fused kernels stream
    # near the copy rate; eager ops re-read their inputs and upcast.
    eager_elementwise_efficiency: float | None = None
    # The same for torch.optim.AdamW's unfused passes over parameters, gradients and states, on
    # the bytes the cost model counts (cost/optimizer.py ADAM_STEP, `adam-unfused`; the fused
    # kernel keeps memory_bw_efficiency); None: memory_bw_efficiency. paraplan calibrate
    # measures it with every rank stepping at once, as a run's ranks do.
    optimizer_efficiency: float | None = None
    # The same for the cross-entropy's kernels (upcast, log-softmax, its backward) over the
    # T×V/t logits: long streaming passes, near the copy rate on a GPU, with exp and log
    # costing more than the memory on a CPU; None: elementwise_efficiency. paraplan
    # calibrate measures it (F.cross_entropy on upcast logits).
    loss_efficiency: float | None = None
    # A scatter-add of token rows (index_add_ / scatter_add with atomics: an eager MoE's
    # combine and its permutation's backward) as a share of the copy bandwidth, on the bytes
    # cost/moe.py counts (read and write each row); None: memory_bw_efficiency. paraplan
    # calibrate measures it.
    scatter_add_efficiency: float | None = None
    kernel_launch_overhead_s: float = 4e-6
    # A layer's element-wise kernels under torch.compile (inductor fuses the norms, RoPE,
    # SiLU·up and residual adds into fewer kernels) over the same kernels eager: the time
    # ratio, measured by paraplan calibrate on a GPU (calibrate/bench.py _elementwise); 1: not
    # measured, priced as eager.
    compiled_elementwise_ratio: float = 1.0
    # Host time each tensor-parallel collective costs beyond its transfer, in the engine that
    # runs it: an eager DTensor engine (paraplan run, torchtitan) dispatches a redistribute and
    # waits on its rank-to-rank handshake at every one; on a CPU device nothing hides it.
    # paraplan calibrate measures it from a TP layer at negligible size (calibrate/profile.py);
    # 0 for the presets, whose engines (Megatron-Core) issue NCCL calls from a host that runs
    # ahead of the GPU.
    tp_collective_overhead_s: float = 0.0
    # Host time eager PyTorch spends issuing one transformer layer's forward + backward
    # kernels (Python, dispatcher, autograd, autocast): the host runs ahead of the GPU, so a
    # layer whose GPU work takes less waits for its host (cost/host.py eager_host_wait).
    # paraplan calibrate measures it on a GPU (paraplan run's layer at negligible size); 0 in
    # the presets (host unknown: not modelled), and for fused or compiled layers.
    eager_layer_host_s: float = 0.0
    # Host time Megatron-Core spends issuing one MoE layer's forward between two dispatch
    # synchronizations: its dropless all-to-all dispatcher copies the token counts to the
    # host and blocks on them before each layer's EP all-to-all (token_dispatcher.py,
    # cuda_sync_point "before_ep_alltoall"), so the GPU drains its queue at every MoE layer
    # and a layer whose GPU work is shorter waits for its host (cost/stages.py). 0: not modelled.
    moe_dispatch_host_s: float = 0.0
    # Host time of torch.distributed.pipelining's split backward, the zero-bubble schedules'
    # B pass (stage_backward_input) and W pass (stage_backward_weight), over a chunk of L
    # layers: c0 + c1·L + c2·L² seconds for (c0, c1, c2). W's is quadratic: it runs one
    # autograd.grad per weight group, each walking the graph of the layers below it.
    # paraplan calibrate measures both on a GPU; (0, 0, 0) in the presets (not modelled).
    zb_input_host_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    zb_weight_host_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # End-to-end fraction of microbenchmark compute throughput sustained in training: clock
    # under the power cap over hours of dense load, SM/L2 contention with concurrent kernels.
    # Isolated microbenchmarks (vidur's) run at boost clock. Fitted per GPU type against the
    # published runs (calibration/fit_validation.py), never per run.
    sustained_compute_ratio: float = 1.0
    # A board power limit below TDP (nvidia-smi -pl; Meta's Grand Teton H100 at 500 W): the
    # clock falls with it (power_clock_share). None: the GPU runs at its TDP.
    power_limit_watts: float | None = None
    # Memory the framework cannot use for tensors: CUDA context, cuBLAS/NCCL workspaces.
    reserved_bytes: float = 2.0e9
    # The caching allocator's slack as a share of allocated bytes, for the vectorized memory
    # screen only (cost/stage_memory.py): an estimate replays the allocator over the step's
    # tensor lifetimes instead (cost/lifetimes.py); the search screens first with none and
    # falls back to this share where no plan it keeps fits once replayed (search/planner.py).
    allocator_fragmentation: float = 0.05
    # Compute slowdown while a collective runs concurrently (SMs and HBM shared with NCCL).
    overlap_slowdown: float = 0.05
    # Host CPU Adam throughput per GPU (parameters/s), for optimizer offload (ZeRO-Offload).
    host_adam_params_per_s: float = 2.0e9
    # The measured runs that check these parameters ("" for none: the GPU's speed is then an
    # assumption, e.g. another GPU's GEMM curve, and reports say so).
    checked_against: str = field(default="", compare=False)
    source: str = field(default="", compare=False)
    # The chip's architecture family (GPU_ARCHITECTURES; "" unknown): what software picks its
    # kernels by (compute capability, ROCm or CUDA) and what a fit pools GPUs of one die by
    architecture: str = field(default="", compare=False)

    @property
    def power_clock_share(self) -> float:
        """The clock (and so the tensor-core rate) a power limit leaves, relative to the TDP's.
        A GPU training dense GEMMs draws its TDP already, its clock set by the power it may draw
        (sustained_compute_ratio holds that clock); CMOS dynamic power is C·V²·f and DVFS lowers
        the voltage with the clock, so power goes as f³ (Hennessy & Patterson, Computer
        Architecture 6th ed., Sec. 1.5) and the clock as the cube root of the limit over the
        TDP. An assumption beyond that: no row measures one GPU at two limits. HBM bandwidth
        is not scaled (its clock is not the cores')."""
        if self.power_limit_watts is None or self.power_limit_watts >= self.tdp_watts:
            return 1.0
        return (self.power_limit_watts / self.tdp_watts) ** (1.0 / 3.0)

    @property
    def compute_share(self) -> float:
        """The share of the microbenchmarked tensor-core rate a training step sustains: the fitted
        sustained_compute_ratio at the power limit's clock."""
        return self.sustained_compute_ratio * self.power_clock_share

    @property
    def draw_watts(self) -> float:
        """What one GPU draws under dense training: its TDP, or its power limit below it."""
        return self.tdp_watts if self.power_limit_watts is None else min(self.tdp_watts, self.power_limit_watts)

    @property
    def scatter_bw_efficiency(self) -> float:
        return self.memory_bw_efficiency if self.scatter_add_efficiency is None else self.scatter_add_efficiency

    @property
    def loss_bw_efficiency(self) -> float:
        return self.elementwise_bw_efficiency if self.loss_efficiency is None else self.loss_efficiency

    @property
    def elementwise_bw_efficiency(self) -> float:
        return self.memory_bw_efficiency if self.elementwise_efficiency is None else self.elementwise_efficiency

    @property
    def eager_elementwise_bw_efficiency(self) -> float:
        return self.elementwise_bw_efficiency if self.eager_elementwise_efficiency is None \
            else self.eager_elementwise_efficiency

    @property
    def optimizer_bw_efficiency(self) -> float:
        return self.memory_bw_efficiency if self.optimizer_efficiency is None else self.optimizer_efficiency

    @property
    def attention_kernels(self) -> tuple[AttentionKernel, ...]:
        """Kernels this GPU runs, slowest first (enum order): the last is the default."""
        return (AttentionKernel.UNFUSED,) + tuple(k for k in AttentionKernel if k in self.attention_efficiency)

    def _lookup(self, table: dict, key, field_name: str, what: str, allowed) -> Any:
        if key in table:
            return table[key]
        raise SpecError(f"gpu {self.name!r}", field_name, str(key),
                        f"this GPU has no {key} {what}; allowed: " + ", ".join(map(str, allowed)))

    def attention_curve(self, kernel: AttentionKernel) -> EfficiencyCurve:
        return self._lookup(self.attention_efficiency, AttentionKernel(kernel), "attention", "kernel",
                            self.attention_kernels)

    def peak(self, precision: Precision) -> float:
        return self._lookup(self.peak_flops_per_s, Precision(precision), "precision", "tensor-core peak",
                            self.peak_flops_per_s)


@dataclass(frozen=True, kw_only=True)
class LinkTier:
    """One tier of interconnect as seen by one GPU."""

    name: str
    bw_unidir_bytes_per_s: float  # per GPU, one direction
    latency_s: float
    # NCCL bus-bandwidth efficiency vs message bytes (fraction of bw_unidir achieved), as the
    # all-reduce measures it.
    efficiency: EfficiencyCurve
    # the same for one collective where it was measured apart ("all_gather", "reduce_scatter"):
    # gloo's reduce-scatter, for one, runs well below its all-reduce (paraplan calibrate)
    op_efficiency: tuple[tuple[str, EfficiencyCurve], ...] = ()

    def curve(self, op: str = "") -> EfficiencyCurve:
        """The efficiency curve of collective `op` (the all-reduce's unless measured apart)."""
        for name, c in self.op_efficiency:
            if name == op:
                return c
        return self.efficiency


# GPUSpec.architecture's values: NVIDIA's by compute capability (Ampere 8.0, Ada 8.9, Hopper 9.0,
# Blackwell 10.x), AMD's CDNA 3 (ROCm), Google's TPU v4
NVIDIA_ARCHITECTURES = ("Ampere", "Ada", "Hopper", "Blackwell")
GPU_ARCHITECTURES = NVIDIA_ARCHITECTURES + ("CDNA3", "TPUv4")


def device_architecture(capability: tuple[int, int] | None, rocm_arch: str = "") -> str:
    """GPUSpec.architecture of a device from what torch reports: an NVIDIA compute capability
    (8.x Ampere but 8.9 Ada, 9.x Hopper, 10.x Blackwell), an AMD gfx name (gfx942: CDNA 3); ""
    for anything else (a CPU, consumer Blackwell's 12.x)."""
    if rocm_arch:
        return "CDNA3" if rocm_arch.split(":")[0] == "gfx942" else ""
    if capability is None:
        return ""
    major, minor = capability
    return {8: "Ada" if minor == 9 else "Ampere", 9: "Hopper", 10: "Blackwell"}.get(major, "")

MAX_GPUS = 100_000_000  # a hundred times the largest clusters announced; bounds the search


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    name: str
    gpu: GPUSpec
    num_gpus: int
    gpus_per_node: int  # NVLink domain (8 for DGX, 72 for GB200 NVL72)
    nvlink: LinkTier
    scaleout: LinkTier
    gpus_per_island: int = 0  # 0: one island (no data-center tier)
    dcn: LinkTier | None = None
    usd_per_gpu_hour: float = 2.0
    # host DRAM of one host (CPU memory domain): where offloaded optimizer states, UVM embedding
    # rows and buffered experts live. 0: not stated (not checked). A host serves gpus_per_host
    # GPUs (0: the node's, as in a DGX; GB200: one Grace per two GPUs).
    host_memory_bytes_per_host: float = 0.0
    gpus_per_host: int = 0
    # that DRAM's bandwidth (bytes/s, reads and writes together), shared by the host's GPUs
    # when they offload at once. 0: not stated (offload then runs at the host link's rate).
    host_memory_bw_bytes_per_s_per_host: float = 0.0
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"cluster {self.name!r}"
        if self.num_gpus <= 0:
            raise SpecError(where, "num_gpus", self.num_gpus, "a positive integer is required")
        if self.num_gpus > MAX_GPUS:  # the plan space enumerates divisors of the count
            raise SpecError(where, "num_gpus", self.num_gpus, f"at most {MAX_GPUS:,} GPUs")
        if self.gpus_per_node <= 0:
            raise SpecError(where, "gpus_per_node", self.gpus_per_node, "a positive integer is required")
        if not 0 <= self.host_memory_bytes_per_host < math.inf:
            raise SpecError(where, "host_memory_bytes_per_host", self.host_memory_bytes_per_host,
                            "a finite number >= 0 is required (0: not stated)")
        if not 0 <= self.host_memory_bw_bytes_per_s_per_host < math.inf:
            raise SpecError(where, "host_memory_bw_bytes_per_s_per_host", self.host_memory_bw_bytes_per_s_per_host,
                            "a finite number >= 0 is required (0: not stated)")
        if self.gpus_per_host < 0 or (self.gpus_per_host and self.gpus_per_node % self.gpus_per_host):
            raise SpecError(where, "gpus_per_host", self.gpus_per_host,
                            f"must divide gpus_per_node={self.gpus_per_node} (0: one host per node)")
        if self.gpus_per_island and (self.gpus_per_island % self.gpus_per_node or self.dcn is None):
            raise SpecError(where, "gpus_per_island", self.gpus_per_island,
                            "must be a multiple of gpus_per_node and come with a [dcn] tier")

    @property
    def host_gpus(self) -> int:
        """GPUs sharing one host's DRAM."""
        return self.gpus_per_host or self.gpus_per_node

    @property
    def host_memory_bytes_per_gpu(self) -> float:
        """A GPU's share of its host's DRAM (0: not stated)."""
        return self.host_memory_bytes_per_host / self.host_gpus

    @property
    def offload_bytes_per_s(self) -> float:
        """One GPU's rate to and from host memory while every GPU of its host offloads: its
        host link one way, or its share of the host's DRAM bandwidth where that is less."""
        link = self.gpu.host_link_bw_unidir_bytes_per_s
        dram = self.host_memory_bw_bytes_per_s_per_host / self.host_gpus
        return min(link, dram) if dram > 0 else link

    def host_memory_holds(self, bytes_per_gpu):
        """Whether `bytes_per_gpu` (scalar or array) fit in a GPU's share of its host's DRAM;
        always where the cluster does not state it."""
        cap = self.host_memory_bytes_per_gpu
        return True if cap <= 0 else bytes_per_gpu <= cap

    @property
    def tiers(self) -> tuple[LinkTier, ...]:
        return (self.nvlink, self.scaleout) + ((self.dcn,) if self.dcn is not None else ())

    def with_num_gpus(self, num_gpus: int) -> "ClusterSpec":
        from dataclasses import replace
        return replace(self, num_gpus=num_gpus)

    def with_power_limit(self, watts: float | None) -> "ClusterSpec":
        """The cluster with every GPU's board power limited to `watts` (GPUSpec.power_limit_watts);
        None: as it is."""
        from dataclasses import replace
        return self if watts is None else replace(self, gpu=replace(self.gpu, power_limit_watts=float(watts)))
