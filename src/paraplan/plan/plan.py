"""A parallel plan (frozen) and its validation. An invalid plan is a value: Rejected."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, Callable

import numpy as np

from ..enums import CodedEnum
from ..specs.workload import Workload
from .axes import AttentionKernel, CPCommType, GradCompression, RankOrder, Recompute, RecomputeOps, Schedule, ZeroStage


def axis(default, *, flag: str | None = None, unit: str = "", bounds: tuple | None = None, help: str = "",
         column: str | None = None):
    """A Plan field with its metadata, declared once: the CLI flag that sets it, its unit, its
    bounds (low, high; None: open), a help line, the PlanBatch column that holds it (by
    default the field's name, or `<name>_code` for an enum: see `Column`)."""
    return field(default=default, metadata={"flag": flag, "unit": unit, "bounds": bounds, "help": help,
                                            "column": column})


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A parallel plan: every field declared once, with its metadata (`axis`); PlanBatch holds
    the same fields as columns (`COLUMNS`)."""

    tp: int = axis(1, flag="--tp", unit="GPUs", bounds=(1, None), help="tensor-parallel degree")
    pp: int = axis(1, flag="--pp", unit="stages", bounds=(1, None), help="pipeline-parallel degree")
    dp: int = axis(1, flag="--dp", unit="replicas", bounds=(1, None), help="data-parallel degree")
    cp: int = axis(1, flag="--cp", unit="GPUs", bounds=(1, None), help="context-parallel degree")
    cp_comm_type: CPCommType = axis(CPCommType.P2P, flag="--cp-comm", help="with CP>1: how K/V cross the CP group")
    # Expert parallelism (MoE models; Megatron-Core "parallel folding"): the expert layers
    # re-slice the same TP×CP×DP ranks of a pipeline stage as ETP×EP×EDP, EDP = t·c·d/(ep·etp).
    ep: int = axis(1, flag="--ep", unit="GPUs", bounds=(1, None), help="expert-parallel degree")
    etp: int = axis(1, flag="--etp", unit="GPUs", bounds=(1, None), help="expert tensor-parallel degree")
    vp: int = axis(1, flag="--vp", unit="chunks", bounds=(1, None),
                   help="virtual pipeline stages (model chunks) per pipeline rank")
    # which dimension is outermost in rank space (plan/axes.py RankOrder): the pipeline
    # (Megatron's default) or data parallelism (Megatron --use-tp-pp-dp-mapping, Llama 3)
    rank_order: RankOrder = axis(RankOrder.TP_CP_DP_PP, flag="--rank-order")
    micro_batch_size: int = axis(1, flag="--mb", unit="sequences", bounds=(1, None))
    schedule: Schedule = axis(Schedule.ONE_F_ONE_B, flag="--schedule")
    recompute: Recompute = axis(Recompute.NONE, flag="--recompute")
    recompute_num_layers: int = axis(0, flag="--recompute-layers", unit="layers", bounds=(0, None),
                                     help="only for Recompute.FIRST_K: layers per stage recomputed")
    # Recompute.SET: the tensors each layer drops and re-creates in its backward (plan/axes.py
    # RecomputeOp; priced in cost/recompute_set.py); empty under every other policy
    recompute_ops: RecomputeOps = axis(RecomputeOps(), flag="--recompute-ops", column="recompute_ops_code",
                                       help="only for Recompute.SET: the tensors each layer recomputes")
    # Activation offload (μ-two, Purandare et al. MLSys 2023; Megatron-Core cpu_offloading): the
    # activations each of this many layers per stage saves for its backward are copied to host
    # memory as the forward goes on and back ahead of the backward, under the neighbouring
    # layers' compute (cost/activation_offload.py). Each layer of a stage is recomputed
    # (first-k's first k), offloaded (the next j) or kept; under full recomputation the kept
    # layer inputs go to the host (DeepSpeed's cpu_checkpointing). Not with per-op checkpointing.
    activation_offload_layers: int = axis(0, flag="--offload-activations", unit="layers", bounds=(0, None),
                                          help="layers per stage whose saved activations go to host memory")
    sequence_parallel: bool = axis(False, flag="--sp")
    zero: ZeroStage = axis(ZeroStage.NONE, flag="--zero")
    dp_shard: int = axis(0, flag="--dp-shard", unit="replicas", bounds=(0, None),
                         help="shard group size for ZeRO; equals dp unless HSDP (set by `make_plan`)")
    offload_optimizer: bool = axis(False, flag="--offload")
    # Adam accumulation (AdamA; Zhang et al. 2023, "AdamA: Adam Accumulation to Reduce Memory
    # Footprints of both Activations and Gradients for Large-scale DNN Training", Algorithm 1):
    # each micro-batch's gradients are folded into Adam's m and v as the backward makes them
    # (m += (1-β1)·g_i/N, v += (1-β2)·g_i²/N) and released, the weights updated once per step
    adam_accumulation: bool = axis(False, flag="--adama",
                                   help="fold each micro-batch's gradients into Adam's states (AdamA)")
    dp_overlap: bool = axis(True, flag="--no-dp-overlap")
    # The data-parallel gradient reduction's wire format (plan/axes.py GradCompression; priced in
    # cost/grad_compression.py): ZeRO++ qgZ's int4 (ZeRO-3) or DDP's PowerSGD hook at rank
    # powersgd_rank (torch's matrix_approximation_rank, default 1). Changes the numerics: never searched.
    grad_compression: GradCompression = axis(GradCompression.NONE, flag="--grad-compression",
                                             help="the DP gradient reduction's wire format")
    powersgd_rank: int = axis(1, flag="--powersgd-rank", unit="columns", bounds=(1, None),
                              help="with grad_compression=powersgd: the rank r of P and Q")
    tp_overlap: bool = axis(False, flag="--tp-overlap")
    # MoE token dispatch: dropless (None; MegaBlocks) or token dropping with each expert padded
    # to capacity_factor × its mean load (GShard / Switch); and the dispatch, a flat all-to-all
    # of every routed copy (Megatron-Core's alltoall dispatcher) or deduplicated, each token once
    # per node over the network and once per GPU over NVLink (DeepEP; the flex dispatcher).
    capacity_factor: float | None = axis(None, flag="--capacity-factor", bounds=(1.0, None),
                                         column="capacity_factor_value")
    a2a_hierarchical: bool = axis(False, flag="--a2a-hierarchical")
    # EP all-to-all of one micro-batch under the compute of another (Megatron-Core
    # --overlap-moe-expert-parallel-comm; needs PP=1 or interleaved stages)
    ep_overlap: bool = axis(False, flag="--ep-overlap")
    # Attention kernel: fused kernels (FlashAttention) never store the s×s scores; the
    # unfused path of 2021–22 Megatron did. FLASH3 needs a Hopper-or-later GPU.
    attention: AttentionKernel = axis(AttentionKernel.FLASH2, flag="--attention")
    # Mixed-precision policy of the framework (not searched; set to what you run):
    # reduce gradients in fp32 (2021 Megatron main_grad all-reduce) or in 16 bits (Megatron-Core
    # and FSDP defaults); ZeRO-3 shards hold fp32 parameters, gathered in fp32 and cast to 16
    # bits at every use by autocast (PyTorch FSDP with param_dtype=fp32, Composer "DEFAULT").
    grad_reduce_fp32: bool = axis(False)
    fp32_params: bool = axis(False)
    # Megatron-Core's DDP keeps its gradient buffer (main_grad) in the reduction's dtype
    # (distributed_data_parallel.py: grad_dtype = fp32 if grad_reduce_in_fp32 else the
    # parameters' dtype, 0.16.1): 2 bytes a parameter, not 4, where a run turns fp32 reduction
    # off (NeMo 2's and Megatron-Bridge's performance recipes; Megatron-LM --grad-reduce-in-bf16).
    # Its reduction is then 16-bit too (grad_reduce_fp32 False).
    grad_buffer_16bit: bool = axis(False)
    # Under FP8 or NVFP4 on Transformer Engine, the linear layers' weights kept in the GEMMs'
    # format, their 16-bit copy gone, and all-gathered in it (Megatron-Core --fp8-param-gather,
    # Megatron-Bridge fp4_param; cost/low_precision.py): else 16-bit weights beside the
    # quantized copies Transformer Engine caches for a step's micro-batches.
    low_precision_params: bool = axis(False, flag="--low-precision-params")
    # Activation checkpointing that stops recomputing once the backward has what it needs
    # (PyTorch non-reentrant `torch.utils.checkpoint`, used by FSDP stacks such as
    # llm-foundry and torchtitan) skips each block's last GEMM; Megatron's re-runs it all.
    checkpoint_early_stop: bool = axis(False)
    # Backward input-gradient reduction of column-parallel layers overlapped with their
    # weight-gradient GEMM (Megatron-LM since late 2021 and Megatron-Core; off in April 2021).
    tp_async_backward: bool = axis(True)
    # The data-parallel engine is FSDP2 (`fully_shard`: torchtitan, paraplan run): every gather
    # copies the shards into one buffer and out to the unsharded parameters, every gradient
    # reduction copies the gradients into one buffer (torch/distributed/fsdp/_fully_shard/
    # _fsdp_collectives.py foreach_all_gather, foreach_reduce). Megatron's contiguous buffers,
    # DeepSpeed's flat partitions and FSDP1's flat parameters communicate in place.
    fsdp2_copies: bool = axis(False)
    # The model as the engine builds it. Megatron-Core / Transformer Engine (True): Q, K and V
    # one column-parallel GEMM and the gated MLP's gate and up another, a fused SwiGLU that
    # keeps only its input, a fused cross-entropy keeping the logits and their fp32 softmax.
    # Eager PyTorch (False: torchtitan's Llama, Hugging Face models under DeepSpeed, paraplan
    # run): wq, wk, wv, w1, w3 apart (smaller GEMMs; without sequence parallelism each one's
    # input gradient is all-reduced on its own), SiLU's output kept beside its input for the
    # product's backward, and F.cross_entropy on upcast logits (cost/memory.py).
    fused_kernels: bool = axis(True)
    # An engine that fuses its projections and its loss but runs the layer's element-wise ops
    # (norms, activation, residual adds) one eager PyTorch kernel each: llm-foundry's MPT (torch
    # LayerNorm in low precision, nn.GELU, torch Linear with one Wqkv, flash-attn's fused
    # cross-entropy; llm-foundry 0.3.0 models/mpt/modeling_mpt.py, models/layers/ffn.py). Its
    # element-wise kernels stream at the GPU's eager efficiency, as an engine with fused_kernels
    # off runs them (cost/layer_compute.py).
    eager_elementwise: bool = axis(False)
    # fp32 parameters trained under torch.autocast, no FSDP mixed-precision policy (paraplan
    # run and torchtitan without data-parallel sharding): the residual stream stays fp32,
    # every linear layer casts its own input, and the 16-bit copy of each weight is cached
    # for the micro-batch -- all but the input embedding's (F.embedding is not autocast).
    autocast: bool = axis(False)
    # Each transformer block under torch.compile (inductor; torchtitan's --compile.enable, paraplan
    # run --compile), on an eager engine (fused_kernels off): the block's element-wise kernels
    # fused (priced at the GPU's compiled_elementwise_ratio of their eager time) and SiLU's
    # output no longer kept beside its input -- what one H100 measured, calibration/h100_2026-11-23.
    # GEMMs stay separate (wq, wk, wv, w1, w3); the loss is compiled_loss's.
    compiled: bool = axis(False)
    # The cross-entropy under torch.compile, on an eager engine: torchtitan compiles it with the
    # blocks from June 2025 (0.1.0's components/loss.py: `if job_config.training.compile`; from 0.2.0
    # compile.components, default ["model", "loss"]), December 2024's left it eager. Inductor
    # fuses the upcast, log-softmax and NLL: the backward keeps the 16-bit logits and writes a
    # 16-bit gradient (cost/memory.py), each pass one kernel over the logits (cost/stage_ends.py).
    compiled_loss: bool = axis(False)
    # An eager engine's loss over a vocabulary split by TP, computed op by op on the fp32
    # shard: torch's loss_parallel (torch/distributed/tensor/parallel/loss.py; torchtitan up to
    # 0.2, paraplan run) and torchtitan 0.3's _LossParallelCrossEntropy (components/loss.py)
    # keep fp32 log-probabilities and run an unfused backward (cost/memory.py, stage_ends.py).
    # Off: the engine gathers the logits or fuses the loss (Megatron, DeepSpeed's AutoTP).
    loss_parallel: bool = axis(False)
    # Bytes per logit of every micro-batch's head output the last pipeline stage keeps until
    # the step ends (0: none): torch.distributed.pipelining appends each output to the stage's
    # output_chunks for the schedule's merged return (stage.py forward_one_chunk, freed by
    # clear_runtime_states at the next step), unless step() is told return_outputs=False, as
    # torchtitan does from 0.2.1 (December 2025) and paraplan run does; 4 where the model
    # returned fp32 logits, 2 for 16-bit ones (cost/stage_memory.py, cost/lifetimes.py).
    pp_kept_output_bytes: float = axis(0.0)
    # Whether torchtitan's per-op checkpointing keeps the attention kernel's output (and its
    # log-sum-exp): its save list names SDPA's flash and memory-efficient kernels, and the
    # cuDNN one only from 0.2.1 (December 2025), while its SDPA prefers cuDNN on Blackwell from
    # 0.1.0 (June 2025) and on every NVIDIA GPU from 0.2.0 (October 2025; models/attention.py).
    # False: the attention is re-run in the backward (cost/memory.py, cost/recompute.py).
    op_sac_attention_kept: bool = axis(True)

    # numeric codes, so that the cost model reads Plan and PlanBatch alike
    @property
    def schedule_code(self) -> int:
        return self.schedule.code

    @property
    def recompute_code(self) -> int:
        return self.recompute.code

    @property
    def recompute_ops_code(self) -> int:
        return self.recompute_ops.code

    @property
    def zero_code(self) -> int:
        return self.zero.code

    @property
    def attention_code(self) -> int:
        return self.attention.code

    @property
    def cp_comm_type_code(self) -> int:
        return self.cp_comm_type.code

    @property
    def grad_compression_code(self) -> int:
        return self.grad_compression.code

    @property
    def rank_order_code(self) -> int:
        return self.rank_order.code

    @property
    def dp_outermost(self) -> bool:
        """Data parallelism outermost where that changes the layout (PP > 1 and DP > 1; with one
        stage or one replica the two orders are the same plan)."""
        return self.rank_order is RankOrder.TP_CP_PP_DP and self.pp > 1 and self.dp > 1

    @property
    def capacity_factor_value(self) -> float:
        """Capacity factor as the vectorized cost model reads it (0.0: dropless)."""
        return 0.0 if self.capacity_factor is None else float(self.capacity_factor)

    @property
    def num_gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def num_microbatches(self, workload: Workload) -> int:
        return workload.global_batch_size // (self.dp * self.micro_batch_size)

    def describe(self) -> str:
        parts = [f"TP{self.tp}", f"PP{self.pp}", f"DP{self.dp}"]
        if self.cp > 1:
            parts.append(f"CP{self.cp}" + ("" if self.cp_comm_type is CPCommType.P2P else f"/{self.cp_comm_type}"))
        if self.ep > 1:
            parts.append(f"EP{self.ep}")
        if self.etp > 1:
            parts.append(f"ETP{self.etp}")
        if self.vp > 1:
            parts.append(f"VP{self.vp}")
        if self.dp_outermost:
            parts.append(f"order:{self.rank_order}")
        parts.append(f"mb{self.micro_batch_size}")
        if self.pp > 1:
            parts.append(str(self.schedule))
        if self.sequence_parallel:
            parts.append("SP")
        rc = str(self.recompute)
        if self.recompute is Recompute.FIRST_K:
            rc = f"first{self.recompute_num_layers}"
        elif self.recompute is Recompute.SET:
            rc = f"set({self.recompute_ops})"
        parts.append(f"rc:{rc}")
        if self.activation_offload_layers:
            parts.append(f"aoff{self.activation_offload_layers}")
        if self.zero is not ZeroStage.NONE:
            z = f"zero{self.zero}"
            if self.dp_shard != self.dp:
                z += f"/hsdp{self.dp_shard}"
            parts.append(z)
        if self.offload_optimizer:
            parts.append("offload")
        if self.grad_compression is not GradCompression.NONE:
            rank = f"/r{self.powersgd_rank}" if self.powersgd_rank != 1 else ""
            parts.append(f"gc:{self.grad_compression}{rank}")
        if self.adam_accumulation:
            parts.append("adama")
        if self.tp_overlap:
            parts.append("tpov")
        if self.compiled and not self.fused_kernels:
            parts.append("compiled")
        if self.pp > 1 and self.pp_kept_output_bytes > 0.0:
            parts.append(f"kept:{self.pp_kept_output_bytes:g}B")
        if self.recompute is Recompute.OP_SAC and not self.op_sac_attention_kept:
            parts.append("rerun:attn")  # per-op checkpointing re-runs the attention too
        if self.capacity_factor is not None:
            parts.append(f"cf{self.capacity_factor:g}")
        if self.a2a_hierarchical:
            parts.append("a2a:2d")
        if self.ep_overlap:
            parts.append("epov")
        parts.append(f"attn:{self.attention}")
        return " ".join(parts)


@dataclass(frozen=True)
class Column:
    """How a Plan field is held in a PlanBatch column: its name there, its numpy dtype, and
    the codec between the field's value and the column's number (an enum by its `code`; no
    capacity factor, dropless, as 0.0)."""

    field: str
    name: str
    dtype: Any
    encode: Callable
    decode: Callable


def _column(f) -> Column:
    default = f.default
    if isinstance(default, RecomputeOps):
        return Column(f.name, f.metadata["column"], np.int64, lambda v: v.code, RecomputeOps.from_code)
    if isinstance(default, CodedEnum):
        enum = type(default)
        return Column(f.name, f.metadata["column"] or f"{f.name}_code", np.int64, lambda v: v.code, enum.from_code)
    if isinstance(default, bool):
        return Column(f.name, f.metadata["column"] or f.name, bool, bool, bool)
    if isinstance(default, int):
        return Column(f.name, f.metadata["column"] or f.name, np.int64, int, int)
    if isinstance(default, float):
        return Column(f.name, f.metadata["column"] or f.name, float, float, float)
    # an optional float (the capacity factor): None held as 0.0
    return Column(f.name, f.metadata["column"] or f.name, float, lambda v: 0.0 if v is None else float(v),
                  lambda x: float(x) if x > 0 else None)


COLUMNS: tuple[Column, ...] = tuple(_column(f) for f in fields(Plan))


def plan_fields(plan: Plan) -> dict:
    """The plan's fields by name for JSON (enums as their strings)."""
    values = {f.name: getattr(plan, f.name) for f in fields(plan)}
    return {k: str(v) if isinstance(v, (StrEnum, RecomputeOps)) else v for k, v in values.items()}


def make_plan(**kw) -> Plan:
    """Plan with dp_shard defaulting to dp (full sharding when ZeRO is on)."""
    p = Plan(**kw)
    if p.dp_shard == 0:
        p = replace(p, dp_shard=p.dp)
    return p


@dataclass(frozen=True)
class Rejected:
    """A plan that cannot run, and why."""

    reason: str
