"""Validity rules of a plan, each declared once with the plan axes it reads.

A rule is a vectorized mask of invalid plans over any object with the plan's attribute names
(a PlanBatch, or the partial columns the plan space binds axis by axis), and a reason for one
Plan. The plan space (plan/space.py) applies a rule that `prunes` as soon as the axes it reads
are bound, dropping those plans before they are counted as candidates; the others are counted
and rejected when a block of candidates is built. `check_plan` runs them all, in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .axes import V_SCHEDULES, CPCommType, GradCompression, RankOrder, Recompute, Schedule, ZeroStage

V_CODES = [s.code for s in V_SCHEDULES]
MULTI_CHUNK_CODES = [Schedule.INTERLEAVED_1F1B.code, Schedule.BREADTH_FIRST.code] + V_CODES


@dataclass(frozen=True)
class Rule:
    """One validity rule: `invalid(batch)` masks the plans that break it, `reason(plan)` says
    why; `reads` names every plan attribute `invalid` reads (the plan space applies the rule
    once those are bound). A rule that `prunes` drops its plans before they are counted as
    candidates; one that does not is counted, and the search reports its rejections."""

    name: str
    reads: tuple[str, ...]
    prunes: bool
    invalid: Callable
    reason: Callable


def fullest_stage_layers(num_layers: int, pp):
    """⌈l/PP⌉: the layers of a pipeline's fullest stage (scalar or vectorized)."""
    return -(-num_layers // np.maximum(pp, 1))


def capacity_factor_ok(model: ModelSpec, cf):
    """A token-dropping capacity factor from 1 (each expert holds its even share, T·k/E) to
    E/k (it holds every token: a larger factor only pads)."""
    cf = np.asarray(cf, dtype=float)
    return (cf >= 1.0) & (cf <= model.num_experts / model.top_k)


def capacity_factor_rule(model: ModelSpec, cf) -> str:
    return (f"capacity factor {cf} must be from 1.0 (an expert holds its even share of the routed tokens) "
            f"to {model.num_experts / model.top_k:g} (E/top_k: every token), or dropless")


def rules(model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> list[Rule]:
    """Every validity rule of a plan, in the order their reasons are reported."""
    return (expert_rules(model) + layout_rules(model, cluster, workload) + feature_rules(model, cluster, workload)
            + grad_compression_rules(model))


def expert_rules(model: ModelSpec) -> list[Rule]:
    """The expert axes: an MoE model's, or none on a dense one."""
    E, fe = model.num_experts, model.moe_ffn_hidden_size
    return [
        Rule("ep_experts", ("ep",), True,
             lambda B: (E % B.ep != 0), lambda P: f"EP={P.ep} must divide the {E} routed experts"),
        Rule("ep_fold", ("tp", "cp", "dp", "ep", "etp"), True,
             lambda B: (B.tp * B.cp * B.dp) % (B.ep * B.etp) != 0,
         lambda P: f"EP×ETP = {P.ep}×{P.etp} must divide TP×CP×DP = {P.tp * P.cp * P.dp} "
                   "(expert layers re-slice the ranks of a pipeline stage)"),
        # HSDP: experts shard over the shard group's part of EDP, t·c·dp_shard/(ep·etp), and
        # replicate over the R = dp/dp_shard replicas (torchtitan ParallelDims: dp_shard·cp
        # divisible by ep; Megatron-Core --num-distributed-optimizer-instances)
        Rule("ep_hsdp", ("tp", "cp", "dp", "dp_shard", "ep", "etp"), False,
             lambda B: (B.dp_shard != B.dp) & ((B.tp * B.cp * B.dp_shard) % (B.ep * B.etp) != 0),
         lambda P: f"under HSDP, EP×ETP = {P.ep}×{P.etp} must divide TP×CP×dp_shard = {P.tp * P.cp * P.dp_shard} "
                   "(experts shard within a replica)"),
        Rule("etp_ffn", ("etp",), False,
             lambda B: fe % B.etp != 0, lambda P: f"ETP={P.etp} must divide moe_ffn_hidden={fe}"),
        Rule("moe_sp", ("tp", "sequence_parallel"), True,
             lambda B: (B.tp > 1) & ~B.sequence_parallel,
         lambda P: "an MoE model with TP>1 needs sequence parallelism (Megatron-Core)"),
        Rule("a2a_ep", ("a2a_hierarchical", "ep"), True,
             lambda B: B.a2a_hierarchical & (B.ep == 1),
         lambda P: "a deduplicated (hierarchical) dispatch needs EP>1 (at EP=1 experts exchange no tokens)"),
        # the flex dispatcher (DeepEP) refuses --moe-pad-expert-input-to-capacity (Megatron-Core
        # 0.16.1); priced over the EP group alone (it folds expert TP into its group)
        Rule("a2a_flex", ("a2a_hierarchical", "capacity_factor_value", "etp"), True,
             lambda B: B.a2a_hierarchical & ((B.capacity_factor_value != 0.0) | (B.etp > 1)),
         lambda P: "the deduplicating (DeepEP) dispatch runs dropless and at ETP=1 (Megatron-Core's flex "
                   f"dispatcher), not {'capacity factor ' + str(P.capacity_factor) if P.capacity_factor else f'ETP={P.etp}'}"),
        # the overlap runs one micro-batch's forward beside another's backward: Megatron-Core's
        # merged 1F1B pairs them without a pipeline or with interleaved stages, DualPipeV in its
        # steady-state actions; GPipe, breadth-first and the zero-bubble orders have no such pairs
        Rule("ep_overlap", ("ep_overlap", "ep", "pp", "schedule_code", "vp"), True,
             lambda B: B.ep_overlap & ((B.ep == 1) | ((B.pp > 1) & ~(
            ((B.schedule_code == Schedule.INTERLEAVED_1F1B.code) & (B.vp > 1))
            | (B.schedule_code == Schedule.DUAL_PIPE_V.code)))),
         lambda P: "EP communication overlap needs EP>1 and no pipeline, interleaved stages (VP>1) or the "
                   f"dualpipev schedule (it pairs one micro-batch's forward with another's backward), not "
                   f"{'EP=1' if P.ep == 1 else P.schedule}"),
        # Megatron-Core merges one micro-batch's forward with another's backward to overlap the
        # all-to-alls, which block (full, first-k) recomputation would re-enter: it asserts
        # "disable full recomputation" / "disable recomputation method" with
        # --overlap-moe-expert-parallel-comm (Megatron-Core 0.16.1
        # transformer/transformer_config.py; Megatron-Bridge 0.3.1 training/comm_overlap.py)
        Rule("ep_overlap_recompute", ("ep_overlap", "recompute_code"), True,
             lambda B: B.ep_overlap & ((B.recompute_code == Recompute.FULL.code) | (B.recompute_code == Recompute.FIRST_K.code)),
         lambda P: f"EP communication overlap cannot run with {P.recompute.value} recomputation "
                   "(Megatron-Core allows none, selective or module recomputation with it)"),
        # Megatron-Core builds the expert ranks in the same order ("tp-ep-pp-dp" when data
        # parallelism is outermost) and asserts that, unless the pipeline is last, attention and
        # MoE layers have the same data-parallel size: EDP = DP, so EP×ETP = TP×CP
        # (parallel_state.initialize_model_parallel, "When not using pp-last rank ordering ...")
        Rule("ep_rank_order", ("rank_order_code", "pp", "ep", "etp", "tp", "cp"), True,
             lambda B: (B.rank_order_code == RankOrder.TP_CP_PP_DP.code) & (B.pp > 1)
         & (B.ep * B.etp != B.tp * B.cp),
         lambda P: f"rank order {P.rank_order} with experts needs EP×ETP = TP×CP (= {P.tp * P.cp}), "
                   f"not {P.ep}×{P.etp}: Megatron-Core keeps EDP = DP unless the pipeline is outermost"),
        Rule("capacity", ("capacity_factor_value",), False,
             lambda B: (B.capacity_factor_value != 0.0) & ~capacity_factor_ok(model, B.capacity_factor_value),
         lambda P: capacity_factor_rule(model, P.capacity_factor)),
    ] if model.is_moe else [
        Rule("dense_ep", ("ep", "etp", "capacity_factor_value", "a2a_hierarchical", "ep_overlap"), True,
             lambda B: (B.ep != 1) | (B.etp != 1) | (B.capacity_factor_value != 0.0) | B.a2a_hierarchical
         | B.ep_overlap,
         lambda P: f"{model.name} is dense: expert parallelism, capacity factor and all-to-all options need an MoE model"),
    ]


def layout_rules(model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> list[Rule]:
    """The degrees, the pipeline's chunks and schedule, and the batch."""
    L, gbs = model.num_layers, workload.global_batch_size
    f = model.ffn_hidden_size
    return [
        Rule("gpus", ("tp", "pp", "dp", "cp"), False,
             lambda B: B.tp * B.pp * B.dp * B.cp != cluster.num_gpus,
         lambda P: f"TP×PP×DP×CP = {P.tp}×{P.pp}×{P.dp}×{P.cp} = {P.tp * P.pp * P.dp * P.cp} GPUs, "
                   f"but the cluster has {cluster.num_gpus}"),
        Rule("tp_heads", ("tp",), False,
             lambda B: model.tp_splits_heads_badly(B.tp), lambda P: model.tp_heads_rule(P.tp)),
        Rule("tp_ffn", ("tp",), False,
             lambda B: f % B.tp != 0, lambda P: f"TP={P.tp} must divide ffn_hidden={f}"),
        # Uneven splits are allowed: Megatron-Core places layers per stage freely
        # (--decoder-first/last-pipeline-num-layers, --pipeline-model-parallel-layout; NeMo
        # gives the embedding and loss stages fewer layers). The cost model times the fullest
        # stage, ceil(l/(p·v)) layers per chunk. The search proposes any PP up to l (and VP
        # dividing ceil(l/p), or chunks that count the two slots; `_balanced`); every engine
        # exported to writes such a split (export/megatron.py, export/torchtitan.py). The
        # embedding and the loss may take a chunk of their own (Megatron-Core
        # --account-for-embedding/loss-in-pipeline-split; Llama 3 405B ran 126 layers as 16×8
        # chunks with one layer fewer on the first and last stage, Dubey et al. 2024 Sec. 3.3.2).
        Rule("pp_layers", ("pp", "vp"), True,
             lambda B: B.pp * B.vp > L + 2,
         lambda P: f"PP×VP = {P.pp}×{P.vp} = {P.pp * P.vp} chunks must not exceed layers + 2 = {L + 2} "
                   "(every chunk holds a layer, the embedding or the loss)"),
        Rule("vp_schedule", ("vp", "schedule_code"), True,
             lambda B: (B.vp > 1) & ~np.isin(B.schedule_code, MULTI_CHUNK_CODES),
         lambda P: f"VP={P.vp} needs the interleaved, bfs, zbv or dualpipev schedule, not {P.schedule}"),
        Rule("zbv_chunks", ("schedule_code", "vp", "pp"), True,
             lambda B: np.isin(B.schedule_code, V_CODES) & ((B.vp != 2) | (B.pp == 1)),
         lambda P: f"the {P.schedule} schedule runs two chunks per rank in a V over PP>1 stages: "
                   + (f"VP must be 2, not {P.vp}" if P.vp != 2 else f"PP must be > 1, not {P.pp}")),
        Rule("dualpipev_m", ("schedule_code", "dp", "micro_batch_size", "pp"), False,
             lambda B: (B.schedule_code == Schedule.DUAL_PIPE_V.code)
         & (gbs // np.maximum(B.dp * B.micro_batch_size, 1) < 2 * B.pp),
         lambda P: f"DualPipeV needs at least 2×PP = {2 * P.pp} micro-batches per step, not "
                   f"{gbs // (P.dp * P.micro_batch_size)} (torch ScheduleDualPipeV); use "
                   + ("a smaller micro-batch, " if P.micro_batch_size > 1 else "")
                   + "less DP, a larger batch or zbv"),
        Rule("vp_pp", ("vp", "pp"), True,
             lambda B: (B.vp > 1) & (B.pp == 1), lambda P: "VP>1 needs PP>1"),
        Rule("zb_chunks", ("schedule_code", "vp"), True,
             lambda B: (B.schedule_code == Schedule.ZERO_BUBBLE.code) & (B.vp > 1),
         lambda P: "the zero-bubble schedule (ZB-H1) runs one chunk per stage: VP must be 1"),
        Rule("batch", ("dp", "micro_batch_size"), True,
             lambda B: gbs % (B.dp * B.micro_batch_size) != 0,
         lambda P: f"global batch {gbs} is not a multiple of DP×micro-batch = {P.dp}×{P.micro_batch_size}"),
        Rule("interleaved_m", ("schedule_code", "vp", "dp", "micro_batch_size", "pp"), False,
             lambda B: (B.schedule_code == Schedule.INTERLEAVED_1F1B.code) & (B.vp > 1)
         & ((gbs // np.maximum(B.dp * B.micro_batch_size, 1)) % B.pp != 0),
         lambda P: f"interleaved 1F1B needs micro-batches ({gbs // (P.dp * P.micro_batch_size)}) "
                   f"to be a multiple of PP={P.pp}"),
    ]


def feature_rules(model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> list[Rule]:
    """Context and sequence parallelism, offload, overlap, recomputation, sharding, kernels."""
    L, s = model.num_layers, workload.seq_len
    a, k = model.num_heads, model.num_kv_heads
    return [
        Rule("cp_seq", ("cp",), False,
             lambda B: (B.cp > 1) & (s % (2 * B.cp) != 0),
         lambda P: f"CP={P.cp} needs seq_len={s} divisible by 2×CP (load-balanced causal chunks)"),
        Rule("cp_comm", ("cp", "cp_comm_type_code"), True,
             lambda B: (B.cp == 1) & (B.cp_comm_type_code != CPCommType.P2P.code),
         lambda P: f"cp_comm_type={P.cp_comm_type} needs CP>1"),
        # Ulysses gives each CP rank whole heads: a TP rank's query and K/V heads split over CP
        Rule("cp_a2a_heads", ("cp_comm_type_code", "tp", "cp"), False,
             lambda B: (B.cp_comm_type_code == CPCommType.A2A.code)
         & ((a % (B.tp * B.cp) != 0) | (k % (B.tp * B.cp) != 0)),
         lambda P: f"cp_comm_type=a2a (Ulysses) needs TP×CP = {P.tp * P.cp} to divide heads={a} and kv_heads={k}"),
        Rule("sp_tp", ("sequence_parallel", "tp"), True,
             lambda B: B.sequence_parallel & (B.tp == 1), lambda P: "sequence parallelism needs TP>1"),
        # Megatron's SP scatters each CP rank's sequence over TP (_split_along_first_dim)
        # (cp_seq already makes s a multiple of CP)
        Rule("sp_seq", ("sequence_parallel", "cp", "tp"), False,
             lambda B: B.sequence_parallel & ((s // np.maximum(B.cp, 1)) % np.maximum(B.tp, 1) != 0),
         lambda P: f"sequence parallelism needs TP={P.tp} to divide the {s // max(P.cp, 1)} tokens of a "
                   f"sequence on each CP rank (seq {s} / CP {P.cp})"),
        # offload moves a rank's optimizer shard to the host (DeepSpeed ZeRO-Offload, Megatron
        # --optimizer-cpu-offload with the distributed optimizer)
        Rule("offload_zero", ("offload_optimizer", "zero_code"), True,
             lambda B: B.offload_optimizer & (B.zero_code == ZeroStage.NONE.code),
         lambda P: "optimizer offload needs ZeRO ≥ 1 (the engines offload a sharded optimizer)"),
        Rule("tpov_sp", ("tp_overlap", "sequence_parallel"), True,
             lambda B: B.tp_overlap & ~B.sequence_parallel,
         lambda P: "TP communication overlap needs sequence parallelism"),
        # the modules Megatron-Core recomputes that Transformer Engine does not fuse away are
        # MoE and MLA modules: on a dense, non-MLA model it would only re-run a fused
        # attention core (selective does that) or nothing
        Rule("modules", ("recompute_code",), False,
             lambda B: (B.recompute_code == Recompute.MODULES.code)
         & np.full(np.shape(B.recompute_code), not (model.is_moe or model.is_mla)),
         lambda P: f"recompute=modules applies to MoE or MLA models; {model.name} is neither (use selective)"),
        Rule("op_sac", ("recompute_code", "fused_kernels"), False,
             lambda B: (B.recompute_code == Recompute.OP_SAC.code) & B.fused_kernels,
         lambda P: "recompute=op-sac is torchtitan's per-op checkpointing, an eager engine's policy: "
                   "Megatron's fused layers recompute by module (use selective, modules or full)"),
        # a searched set names what each layer recomputes: empty is no recomputation, and it
        # prices a dense layer's tensors only (an MoE layer's experts or MLA's latents are not
        # in its table, cost/recompute_set.py)
        Rule("recompute_set", ("recompute_code", "recompute_ops_code"), True,
             lambda B: np.where(B.recompute_code == Recompute.SET.code,
                                (B.recompute_ops_code == 0) | (model.is_moe or model.is_mla),
                                B.recompute_ops_code != 0),
         lambda P: ("recompute_ops applies with recompute=set only" if P.recompute is not Recompute.SET
                    else "recompute=set needs at least one op (recompute_ops; none is recompute=none)"
                    if not P.recompute_ops else
                    f"recompute=set prices a dense, non-MLA layer; {model.name} is "
                    + ("an MoE" if model.is_moe else "an MLA") + " model (use modules, selective or full)")),
        Rule("first_k", ("recompute_code", "recompute_num_layers", "pp"), True,
             lambda B: (B.recompute_code == Recompute.FIRST_K.code)
         & ((B.recompute_num_layers < 1) | (B.recompute_num_layers >= L // np.maximum(B.pp, 1))),
         lambda P: f"recompute_num_layers={P.recompute_num_layers} must be in 1..{L // P.pp - 1} "
                   "(layers per stage − 1)"),
        # each layer of a stage is recomputed (first-k's k), offloaded (the next j) or kept; an
        # offloaded layer's host copy is what the policy keeps (under full recomputation the
        # layer's input: DeepSpeed's cpu_checkpointing); per-op checkpointing is an eager engine's
        Rule("activation_offload", ("activation_offload_layers", "recompute_code", "recompute_num_layers", "pp"), True,
             lambda B: (B.activation_offload_layers > 0)
         & ((B.recompute_code == Recompute.OP_SAC.code)
            | (B.activation_offload_layers + np.where(B.recompute_code == Recompute.FIRST_K.code,
                                                      B.recompute_num_layers, 0) > fullest_stage_layers(L, B.pp))),
         lambda P: f"activation offload of {P.activation_offload_layers} layers per stage needs a policy other than "
                   f"op-sac and at most the stage's {fullest_stage_layers(L, P.pp)} layers"
                   + (f" less the {P.recompute_num_layers} first-k recomputes" if P.recompute is Recompute.FIRST_K
                      else "")),
        Rule("dp_shard", ("dp_shard", "dp"), True,
             lambda B: (B.dp_shard < 1) | (B.dp % np.maximum(B.dp_shard, 1) != 0),
         lambda P: f"dp_shard={P.dp_shard} must divide DP={P.dp}"),
        Rule("hsdp", ("dp_shard", "dp", "zero_code"), True,
             lambda B: (B.dp_shard != B.dp) & (B.zero_code != ZeroStage.PARAMETERS.code),
         lambda P: "a shard group smaller than DP (HSDP) needs ZeRO-3"),
        Rule("attention", ("attention_code",), False,
             lambda B: ~np.isin(B.attention_code, [k.code for k in cluster.gpu.attention_kernels]),
         lambda P: f"attention kernel {P.attention} does not run on {cluster.gpu.name} (runs: "
                   + ", ".join(map(str, cluster.gpu.attention_kernels)) + ")"),
    ] + adam_accumulation_rules()


def adam_accumulation_rules() -> list[Rule]:
    """What Adam accumulation (AdamA, Plan.adam_accumulation) does not combine with: each
    micro-batch's whole reduced gradient is folded into states the rank keeps (all of them, or
    its ZeRO-1 shard) right after that micro-batch's backward."""
    return [
        Rule("adama_zero", ("adam_accumulation", "zero_code"), False,
             lambda B: B.adam_accumulation & (B.zero_code >= ZeroStage.GRADIENTS.code),
         lambda P: f"adam accumulation (--adama) needs ZeRO 0 or 1, not {P.zero}: at ZeRO-1 it already "
                   "reduce-scatters each micro-batch's gradients into the rank's state shard and keeps no "
                   "gradient shard (what ZeRO-2 adds); with ZeRO-3's sharded weights it is not modeled"),
        Rule("adama_offload", ("adam_accumulation", "offload_optimizer"), False,
             lambda B: B.adam_accumulation & B.offload_optimizer,
         lambda P: "adam accumulation (--adama) cannot run with --offload: the states it updates every "
                   "micro-batch would cross the host link every micro-batch"),
        Rule("adama_fsdp2", ("adam_accumulation", "fsdp2_copies", "zero_code"), False,
             lambda B: B.adam_accumulation & B.fsdp2_copies & (B.zero_code != ZeroStage.NONE.code),
         lambda P: "adam accumulation (--adama) cannot run on FSDP2 (fully_shard reduces and keeps sharded "
                   "gradients; it has no per-micro-batch hook into the optimizer's states)"),
        # its per-micro-batch reductions are priced uncompressed (compression is priced once a step)
        Rule("adama_compression", ("adam_accumulation", "grad_compression_code"), False,
             lambda B: B.adam_accumulation & (B.grad_compression_code != GradCompression.NONE.code),
         lambda P: f"adam accumulation (--adama) with --grad-compression {P.grad_compression} is not modelled "
                   "(it would compress a reduction per micro-batch)"),
    ]


def grad_compression_rules(model: ModelSpec) -> list[Rule]:
    """Where a compressed gradient reduction (Plan.grad_compression) runs, as the engines ship it."""
    int4, psgd = GradCompression.INT4.code, GradCompression.POWERSGD.code
    keys = ("grad_compression_code", "powersgd_rank", "zero_code", "dp", "dp_shard", "tp", "pp", "cp")
    return [
        Rule("gc_rank", keys[:2], False,
             lambda B: (B.grad_compression_code != psgd) & (B.powersgd_rank != 1),
         lambda P: f"powersgd_rank={P.powersgd_rank} applies with grad_compression=powersgd only"),
        Rule("gc_dp", keys[:1] + ("dp", "cp"), False,
             lambda B: (B.grad_compression_code != GradCompression.NONE.code) & (B.dp * B.cp == 1),
         lambda P: f"grad_compression={P.grad_compression} needs DP×CP > 1 (one replica reduces nothing)"),
        # paraplan prices the dense layers' matrices only (an expert's gradients reduce over EDP)
        Rule("gc_moe", keys[:1], False,
             lambda B: (B.grad_compression_code != GradCompression.NONE.code) & np.full(np.shape(B.grad_compression_code),
                                                                                        model.is_moe or model.is_mla),
         lambda P: f"grad_compression={P.grad_compression} is priced for dense models without MLA; {model.name} is not"),
        # DeepSpeed stage3.py: all_to_all_quant_reduce runs in ZeRO-3's reduce-scatter only, over
        # groups built from the whole world (groups._get_local_all_to_all_group): no TP, PP, CP, HSDP
        Rule("gc_int4", keys[:1] + keys[2:], False,
             lambda B: (B.grad_compression_code == int4)
         & ((B.zero_code != ZeroStage.PARAMETERS.code) | (B.dp_shard != B.dp) | (B.tp * B.pp * B.cp != 1)),
         lambda P: "grad_compression=int4 (ZeRO++ qgZ) needs ZeRO-3 over all ranks (no HSDP, TP, PP or CP): "
                   "DeepSpeed quantizes ZeRO-3's reduce-scatter over the whole world"),
        # torch's PowerSGD is a DDP comm hook (DistributedDataParallel.register_comm_hook): replicated
        # gradients, no ZeRO or FSDP sharding
        Rule("gc_powersgd", keys[:1] + ("zero_code",), False,
             lambda B: (B.grad_compression_code == psgd) & (B.zero_code != ZeroStage.NONE.code),
         lambda P: f"grad_compression=powersgd is a DDP comm hook: needs ZeRO 0 (not {P.zero})"),
    ]
