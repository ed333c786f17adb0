"""The plan space as columns: every candidate plan of a cluster in numpy arrays.

A PlanBatch has the same attribute names as Plan (tp, pp, ..., schedule_code, ...), so
the cost model reads both. Validity rules live once, vectorized, in `RULES`; the scalar
`check_plan` runs them on a one-plan batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace
from typing import Callable

import numpy as np

from ..errors import SpecError
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .axes import V_SCHEDULES, AttentionKernel, CPCommType, RankOrder, Recompute, Schedule, ZeroStage
from .placement import rank_orders_differ
from .plan import Plan, Rejected

_INT_FIELDS = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "micro_batch_size", "recompute_num_layers", "dp_shard",
               "schedule_code", "recompute_code", "zero_code", "attention_code", "cp_comm_type_code",
               "rank_order_code")
_BOOL_FIELDS = ("sequence_parallel", "offload_optimizer", "dp_overlap", "tp_overlap", "grad_reduce_fp32", "fp32_params",
                "checkpoint_early_stop", "tp_async_backward", "fsdp2_copies", "fused_kernels", "autocast", "compiled",
                "a2a_hierarchical", "ep_overlap")
_FLOAT_FIELDS = ("capacity_factor_value",)

_V_CODES = [s.code for s in V_SCHEDULES]
_MULTI_CHUNK_CODES = [Schedule.INTERLEAVED_1F1B.code, Schedule.BREADTH_FIRST.code] + _V_CODES


@dataclass(frozen=True, kw_only=True)
class PlanBatch:
    """Struct-of-arrays of plans (all arrays of equal length)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    cp_comm_type_code: np.ndarray
    rank_order_code: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    vp: np.ndarray
    micro_batch_size: np.ndarray
    schedule_code: np.ndarray
    recompute_code: np.ndarray
    recompute_num_layers: np.ndarray
    sequence_parallel: np.ndarray
    zero_code: np.ndarray
    dp_shard: np.ndarray
    offload_optimizer: np.ndarray
    dp_overlap: np.ndarray
    tp_overlap: np.ndarray
    attention_code: np.ndarray
    grad_reduce_fp32: np.ndarray
    fp32_params: np.ndarray
    checkpoint_early_stop: np.ndarray
    tp_async_backward: np.ndarray
    fsdp2_copies: np.ndarray
    fused_kernels: np.ndarray
    autocast: np.ndarray
    compiled: np.ndarray
    capacity_factor_value: np.ndarray  # 0.0: dropless
    a2a_hierarchical: np.ndarray
    ep_overlap: np.ndarray

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def take(self, index) -> "PlanBatch":
        return PlanBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def plan(self, i: int) -> Plan:
        return Plan(
            tp=int(self.tp[i]), pp=int(self.pp[i]), dp=int(self.dp[i]), cp=int(self.cp[i]),
            cp_comm_type=CPCommType.from_code(self.cp_comm_type_code[i]),
            rank_order=RankOrder.from_code(self.rank_order_code[i]),
            ep=int(self.ep[i]), etp=int(self.etp[i]), vp=int(self.vp[i]), micro_batch_size=int(self.micro_batch_size[i]),
            schedule=Schedule.from_code(self.schedule_code[i]),
            recompute=Recompute.from_code(self.recompute_code[i]),
            recompute_num_layers=int(self.recompute_num_layers[i]),
            sequence_parallel=bool(self.sequence_parallel[i]), zero=ZeroStage.from_code(self.zero_code[i]),
            dp_shard=int(self.dp_shard[i]), offload_optimizer=bool(self.offload_optimizer[i]),
            dp_overlap=bool(self.dp_overlap[i]), tp_overlap=bool(self.tp_overlap[i]),
            attention=AttentionKernel.from_code(self.attention_code[i]),
            grad_reduce_fp32=bool(self.grad_reduce_fp32[i]), fp32_params=bool(self.fp32_params[i]),
            checkpoint_early_stop=bool(self.checkpoint_early_stop[i]),
            tp_async_backward=bool(self.tp_async_backward[i]), fsdp2_copies=bool(self.fsdp2_copies[i]),
            fused_kernels=bool(self.fused_kernels[i]), autocast=bool(self.autocast[i]), compiled=bool(self.compiled[i]),
            capacity_factor=float(self.capacity_factor_value[i]) if self.capacity_factor_value[i] > 0 else None,
            a2a_hierarchical=bool(self.a2a_hierarchical[i]), ep_overlap=bool(self.ep_overlap[i]))

    @staticmethod
    def from_plans(plans: list[Plan]) -> "PlanBatch":
        cols = {name: np.array([getattr(p, name) for p in plans], dtype=np.int64) for name in _INT_FIELDS}
        cols.update({name: np.array([getattr(p, name) for p in plans], dtype=bool) for name in _BOOL_FIELDS})
        cols.update({name: np.array([getattr(p, name) for p in plans], dtype=float) for name in _FLOAT_FIELDS})
        return PlanBatch(**cols)

    @staticmethod
    def concat(batches: list["PlanBatch"]) -> "PlanBatch":
        return PlanBatch(**{f.name: np.concatenate([getattr(b, f.name) for b in batches])
                            for f in fields(PlanBatch)})


# ---------------------------------------------------------------- validity rules
def capacity_factor_ok(model: ModelSpec, cf):
    """A token-dropping capacity factor from 1 (each expert holds its even share, T·k/E) to
    E/k (it holds every token: a larger factor only pads)."""
    cf = np.asarray(cf, dtype=float)
    return (cf >= 1.0) & (cf <= model.num_experts / model.top_k)


def capacity_factor_rule(model: ModelSpec, cf) -> str:
    return (f"capacity factor {cf} must be from 1.0 (an expert holds its even share of the routed tokens) "
            f"to {model.num_experts / model.top_k:g} (E/top_k: every token), or dropless")


def _rules(model: ModelSpec, cluster: ClusterSpec, workload: Workload):
    """(name, mask-of-invalid function, reason function) triples; one place for every rule."""
    L, gbs, s = model.num_layers, workload.global_batch_size, workload.seq_len
    a, k, f = model.num_heads, model.num_kv_heads, model.ffn_hidden_size
    E, fe = model.num_experts, model.moe_ffn_hidden_size
    moe_rules = [
        ("ep_experts", lambda B: (E % B.ep != 0), lambda P: f"EP={P.ep} must divide the {E} routed experts"),
        ("ep_fold", lambda B: (B.tp * B.cp * B.dp) % (B.ep * B.etp) != 0,
         lambda P: f"EP×ETP = {P.ep}×{P.etp} must divide TP×CP×DP = {P.tp * P.cp * P.dp} "
                   "(expert layers re-slice the ranks of a pipeline stage)"),
        # HSDP: experts shard over the shard group's part of EDP, t·c·dp_shard/(ep·etp), and
        # replicate over the R = dp/dp_shard replicas (torchtitan ParallelDims: dp_shard·cp
        # divisible by ep; Megatron-Core --num-distributed-optimizer-instances)
        ("ep_hsdp", lambda B: (B.dp_shard != B.dp) & ((B.tp * B.cp * B.dp_shard) % (B.ep * B.etp) != 0),
         lambda P: f"under HSDP, EP×ETP = {P.ep}×{P.etp} must divide TP×CP×dp_shard = {P.tp * P.cp * P.dp_shard} "
                   "(experts shard within a replica)"),
        ("etp_ffn", lambda B: fe % B.etp != 0, lambda P: f"ETP={P.etp} must divide moe_ffn_hidden={fe}"),
        ("moe_sp", lambda B: (B.tp > 1) & ~B.sequence_parallel,
         lambda P: "an MoE model with TP>1 needs sequence parallelism (Megatron-Core)"),
        ("a2a_ep", lambda B: B.a2a_hierarchical & (B.ep == 1),
         lambda P: "a hierarchical all-to-all needs EP>1 (at EP=1 experts exchange no tokens)"),
        # the overlap runs one micro-batch's forward beside another's backward: Megatron-Core's
        # merged 1F1B pairs them without a pipeline or with interleaved stages, DualPipeV in its
        # steady-state actions; GPipe, breadth-first and the zero-bubble orders have no such pairs
        ("ep_overlap", lambda B: B.ep_overlap & ((B.ep == 1) | ((B.pp > 1) & ~(
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
        ("ep_overlap_recompute",
         lambda B: B.ep_overlap & ((B.recompute_code == Recompute.FULL.code) | (B.recompute_code == Recompute.FIRST_K.code)),
         lambda P: f"EP communication overlap cannot run with {P.recompute.value} recomputation "
                   "(Megatron-Core allows none, selective or module recomputation with it)"),
        # Megatron-Core builds the expert ranks in the same order ("tp-ep-pp-dp" when data
        # parallelism is outermost) and asserts that, unless the pipeline is last, attention and
        # MoE layers have the same data-parallel size: EDP = DP, so EP×ETP = TP×CP
        # (parallel_state.initialize_model_parallel, "When not using pp-last rank ordering ...")
        ("ep_rank_order", lambda B: (B.rank_order_code == RankOrder.TP_CP_PP_DP.code) & (B.pp > 1)
         & (B.ep * B.etp != B.tp * B.cp),
         lambda P: f"rank order {P.rank_order} with experts needs EP×ETP = TP×CP (= {P.tp * P.cp}), "
                   f"not {P.ep}×{P.etp}: Megatron-Core keeps EDP = DP unless the pipeline is outermost"),
        ("capacity", lambda B: (B.capacity_factor_value != 0.0) & ~capacity_factor_ok(model, B.capacity_factor_value),
         lambda P: capacity_factor_rule(model, P.capacity_factor)),
    ] if model.is_moe else [
        ("dense_ep", lambda B: (B.ep != 1) | (B.etp != 1) | (B.capacity_factor_value != 0.0) | B.a2a_hierarchical
         | B.ep_overlap,
         lambda P: f"{model.name} is dense: expert parallelism, capacity factor and all-to-all options need an MoE model"),
    ]
    return moe_rules + [
        ("gpus", lambda B: B.tp * B.pp * B.dp * B.cp != cluster.num_gpus,
         lambda P: f"TP×PP×DP×CP = {P.tp}×{P.pp}×{P.dp}×{P.cp} = {P.tp * P.pp * P.dp * P.cp} GPUs, "
                   f"but the cluster has {cluster.num_gpus}"),
        ("tp_heads", lambda B: model.tp_splits_heads_badly(B.tp), lambda P: model.tp_heads_rule(P.tp)),
        ("tp_ffn", lambda B: f % B.tp != 0, lambda P: f"TP={P.tp} must divide ffn_hidden={f}"),
        # Uneven splits are allowed: Megatron-Core places layers per stage freely
        # (--decoder-first/last-pipeline-num-layers, --pipeline-model-parallel-layout; NeMo
        # gives the embedding and loss stages fewer layers). The cost model times the fullest
        # stage, ceil(l/(p·v)) layers per chunk. The search proposes any PP up to l (and VP
        # dividing ceil(l/p), or chunks that count the two slots; `_balanced`); every engine
        # exported to writes such a split (export/megatron.py, export/torchtitan.py). The
        # embedding and the loss may take a chunk of their own (Megatron-Core
        # --account-for-embedding/loss-in-pipeline-split; Llama 3 405B ran 126 layers as 16×8
        # chunks with one layer fewer on the first and last stage, Dubey et al. 2024 Sec. 3.3.2).
        ("pp_layers", lambda B: B.pp * B.vp > L + 2,
         lambda P: f"PP×VP = {P.pp}×{P.vp} = {P.pp * P.vp} chunks must not exceed layers + 2 = {L + 2} "
                   "(every chunk holds a layer, the embedding or the loss)"),
        ("vp_schedule", lambda B: (B.vp > 1) & ~np.isin(B.schedule_code, _MULTI_CHUNK_CODES),
         lambda P: f"VP={P.vp} needs the interleaved, bfs, zbv or dualpipev schedule, not {P.schedule}"),
        ("zbv_chunks", lambda B: np.isin(B.schedule_code, _V_CODES) & ((B.vp != 2) | (B.pp == 1)),
         lambda P: f"the {P.schedule} schedule runs two chunks per rank in a V over PP>1 stages: "
                   + (f"VP must be 2, not {P.vp}" if P.vp != 2 else f"PP must be > 1, not {P.pp}")),
        ("dualpipev_m", lambda B: (B.schedule_code == Schedule.DUAL_PIPE_V.code)
         & (gbs // np.maximum(B.dp * B.micro_batch_size, 1) < 2 * B.pp),
         lambda P: f"DualPipeV needs at least 2×PP = {2 * P.pp} micro-batches per step, not "
                   f"{gbs // (P.dp * P.micro_batch_size)} (torch ScheduleDualPipeV); use "
                   + ("a smaller micro-batch, " if P.micro_batch_size > 1 else "")
                   + "less DP, a larger batch or zbv"),
        ("vp_pp", lambda B: (B.vp > 1) & (B.pp == 1), lambda P: "VP>1 needs PP>1"),
        ("zb_chunks", lambda B: (B.schedule_code == Schedule.ZERO_BUBBLE.code) & (B.vp > 1),
         lambda P: "the zero-bubble schedule (ZB-H1) runs one chunk per stage: VP must be 1"),
        ("batch", lambda B: gbs % (B.dp * B.micro_batch_size) != 0,
         lambda P: f"global batch {gbs} is not a multiple of DP×micro-batch = {P.dp}×{P.micro_batch_size}"),
        ("interleaved_m", lambda B: (B.schedule_code == Schedule.INTERLEAVED_1F1B.code) & (B.vp > 1)
         & ((gbs // np.maximum(B.dp * B.micro_batch_size, 1)) % B.pp != 0),
         lambda P: f"interleaved 1F1B needs micro-batches ({gbs // (P.dp * P.micro_batch_size)}) "
                   f"to be a multiple of PP={P.pp}"),
        ("cp_seq", lambda B: (B.cp > 1) & (s % (2 * B.cp) != 0),
         lambda P: f"CP={P.cp} needs seq_len={s} divisible by 2×CP (load-balanced causal chunks)"),
        ("cp_comm", lambda B: (B.cp == 1) & (B.cp_comm_type_code != CPCommType.P2P.code),
         lambda P: f"cp_comm_type={P.cp_comm_type} needs CP>1"),
        # Ulysses gives each CP rank whole heads: a TP rank's query and K/V heads split over CP
        ("cp_a2a_heads", lambda B: (B.cp_comm_type_code == CPCommType.A2A.code)
         & ((a % (B.tp * B.cp) != 0) | (k % (B.tp * B.cp) != 0)),
         lambda P: f"cp_comm_type=a2a (Ulysses) needs TP×CP = {P.tp * P.cp} to divide heads={a} and kv_heads={k}"),
        ("sp_tp", lambda B: B.sequence_parallel & (B.tp == 1), lambda P: "sequence parallelism needs TP>1"),
        # Megatron's SP scatters each CP rank's sequence over TP (_split_along_first_dim)
        # (cp_seq already makes s a multiple of CP)
        ("sp_seq", lambda B: B.sequence_parallel & ((s // np.maximum(B.cp, 1)) % np.maximum(B.tp, 1) != 0),
         lambda P: f"sequence parallelism needs TP={P.tp} to divide the {s // max(P.cp, 1)} tokens of a "
                   f"sequence on each CP rank (seq {s} / CP {P.cp})"),
        # offload moves a rank's optimizer shard to the host (DeepSpeed ZeRO-Offload, Megatron
        # --optimizer-cpu-offload with the distributed optimizer)
        ("offload_zero", lambda B: B.offload_optimizer & (B.zero_code == ZeroStage.NONE.code),
         lambda P: "optimizer offload needs ZeRO ≥ 1 (the engines offload a sharded optimizer)"),
        ("tpov_sp", lambda B: B.tp_overlap & ~B.sequence_parallel,
         lambda P: "TP communication overlap needs sequence parallelism"),
        # the modules Megatron-Core recomputes that Transformer Engine does not fuse away are
        # MoE and MLA modules: on a dense, non-MLA model it would only re-run a fused
        # attention core (selective does that) or nothing
        ("modules", lambda B: (B.recompute_code == Recompute.MODULES.code)
         & np.full(len(B.tp), not (model.is_moe or model.is_mla)),
         lambda P: f"recompute=modules applies to MoE or MLA models; {model.name} is neither (use selective)"),
        ("first_k", lambda B: (B.recompute_code == Recompute.FIRST_K.code)
         & ((B.recompute_num_layers < 1) | (B.recompute_num_layers >= L // np.maximum(B.pp, 1))),
         lambda P: f"recompute_num_layers={P.recompute_num_layers} must be in 1..{L // P.pp - 1} "
                   "(layers per stage − 1)"),
        ("dp_shard", lambda B: (B.dp_shard < 1) | (B.dp % np.maximum(B.dp_shard, 1) != 0),
         lambda P: f"dp_shard={P.dp_shard} must divide DP={P.dp}"),
        ("hsdp", lambda B: (B.dp_shard != B.dp) & (B.zero_code != ZeroStage.PARAMETERS.code),
         lambda P: "a shard group smaller than DP (HSDP) needs ZeRO-3"),
        ("attention", lambda B: ~np.isin(B.attention_code, [k.code for k in cluster.gpu.attention_kernels]),
         lambda P: f"attention kernel {P.attention} does not run on {cluster.gpu.name} (runs: "
                   + ", ".join(map(str, cluster.gpu.attention_kernels)) + ")"),
    ]


def invalid_mask(batch: PlanBatch, model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> np.ndarray:
    bad = np.zeros(len(batch), dtype=bool)
    for _, mask, _ in _rules(model, cluster, workload):
        bad |= mask(batch)
    return bad


def check_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> Rejected | None:
    """Rejected(reason) for the first rule the plan breaks, else None."""
    for name in ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "micro_batch_size"):
        if getattr(plan, name) < 1:
            return Rejected(f"{name}={getattr(plan, name)} must be >= 1")
    # in Python integers first: pinned degrees (each up to 2**20) multiply past int64, where
    # the vectorized rules would wrap around
    if plan.tp * plan.pp * plan.dp * plan.cp != cluster.num_gpus:
        return Rejected(next(reason for name, _, reason in _rules(model, cluster, workload) if name == "gpus")(plan))
    batch = PlanBatch.from_plans([plan])
    for _, mask, reason in _rules(model, cluster, workload):
        if bool(mask(batch)[0]):
            return Rejected(reason(plan))
    return None


# ---------------------------------------------------------------- enumeration
def _balanced(layers: int, chunks: int, mtp: int = 0) -> bool:
    """Equal chunks of layers, counting the embedding, the loss and each of `mtp` multi-token-
    prediction modules as a layer's slot where that evens them (Megatron-Core --account-for-
    embedding/loss-in-pipeline-split; Llama 3 405B: 126 layers in 16 × 8 chunks, Dubey et al.
    2024 Sec. 3.3.2; DeepSeek-V3's 61 layers and MTP module in 32, cost/evaluate.py
    end_chunk_slots)."""
    return any((layers + slack) % chunks == 0 for slack in range(3 + mtp))


@functools.lru_cache(maxsize=256)
def _divisors(n: int) -> tuple[int, ...]:
    """Divisors of n in increasing order (O(√n), once per n)."""
    small = [x for x in range(1, math.isqrt(n) + 1) if n % x == 0]
    return tuple(small + [n // x for x in reversed(small) if x * x != n])


@dataclass(frozen=True, kw_only=True)
class SpaceLimits:
    """Bounds on the enumerated axes (users can narrow them; defaults cover practice)."""

    max_tp: int = 0          # 0: the NVLink domain (gpus_per_node)
    max_micro_batch: int = 16
    max_cp: int = 32
    max_vp: int = 8
    schedules: tuple[Schedule, ...] = tuple(Schedule)
    recomputes: tuple[Recompute, ...] = tuple(Recompute)
    zero_stages: tuple[ZeroStage, ...] = tuple(ZeroStage)
    allow_offload: bool = True
    # attention kernels in order of preference: the first one the GPU runs is used
    attention: tuple[AttentionKernel, ...] = (AttentionKernel.FLASH3, AttentionKernel.FLASH2)
    grad_reduce_fp32: bool = False   # the framework's precision policy (see Plan)
    fp32_params: bool = False
    checkpoint_early_stop: bool = False
    tp_async_backward: bool = True
    fsdp2_copies: bool = False  # ZeRO >= 1 runs on FSDP2 (torchtitan: ZeRO-0 is DDP, no copies)
    fused_kernels: bool = True  # Megatron / TE's fused layer and loss (see Plan)
    compiled: bool = False      # eager blocks under torch.compile (see Plan)
    # the engine trains fp32 parameters under torch.autocast where it runs no FSDP (Plan.autocast;
    # torchtitan: DDP or one GPU): set per plan by without_fsdp_autocast
    autocast_without_fsdp: bool = False
    sequence_parallel: tuple[bool, ...] = (False, True)
    tp_overlap: tuple[bool, ...] = (False, True)
    # HSDP: also try ZeRO-3 shard groups smaller than DP (replicated across the rest)
    hybrid_shard: bool = True
    # MoE: token dispatch choices (None: dropless; a float: token dropping at that capacity
    # factor). Dropping tokens changes the model, so the default searches dropless only.
    capacity_factors: tuple[float | None, ...] = (None,)
    max_ep: int = 0          # 0: up to the number of experts
    # context parallelism: the K/V exchanges tried when CP>1 (plan/axes.py CPCommType)
    cp_comm_types: tuple[CPCommType, ...] = tuple(CPCommType)
    # rank orders tried (plan/axes.py RankOrder); an engine with a fixed mesh offers one
    rank_orders: tuple[RankOrder, ...] = tuple(RankOrder)
    # MoE: whether the two-dimensional all-to-all and the EP overlap may be tried (engines lack them)
    hierarchical_a2a: bool = True
    ep_overlap: bool = True
    # what an engine cannot build beyond these bounds (its device mesh, its pipeline
    # schedules): f(batch, model, workload) -> bool mask of the plans to drop, applied with
    # the validity rules (export/torchtitan.py `unbuildable`); None: nothing more
    engine_rule: Callable | None = None


def _expert_choices(model: ModelSpec, cluster: ClusterSpec, limits: SpaceLimits, fixed: dict,
                    tp: int, cp: int, dp: int) -> list[tuple[float, float, float, float, float]]:
    """(ep, etp, capacity factor (0: dropless), hierarchical all-to-all, EP overlap) for one
    rank layout."""
    if not model.is_moe:
        # a dense model has no expert axes: pinning one leaves no plan (search says which)
        dense_ok = (fixed.get("ep", 1) == 1 and fixed.get("etp", 1) == 1
                    and all(cf is None for cf in limits.capacity_factors))
        return [(1, 1, 0.0, 0, 0)] if dense_ok else []
    ranks = tp * cp * dp
    out = []
    for etp in sorted({1, tp}):
        if fixed.get("etp", etp) != etp:
            continue
        for ep in _divisors(ranks // etp) if ranks % etp == 0 else []:
            if (model.num_experts % ep or fixed.get("ep", ep) != ep
                    or (limits.max_ep and ep > limits.max_ep)):
                continue
            # the two all-to-all algorithms differ only when the EP group leaves the node
            spans_nodes = ep * etp > cluster.gpus_per_node
            for cf in limits.capacity_factors:
                for hier in ((0, 1) if spans_nodes and limits.hierarchical_a2a else (0,)):
                    for ov in ((0, 1) if ep > 1 and limits.ep_overlap else (0,)):
                        out.append((ep, etp, 0.0 if cf is None else float(cf), hier, ov))
    return out


@dataclass(frozen=True, eq=False)
class SpaceBlock:
    """The candidates of one (TP, CP, PP, DP) layout, not yet expanded: `rows` (one per
    schedule, recomputation, ZeRO, ... choice) × `experts` × micro-batch sizes. Cheap to
    hold; `materialize` builds the PlanBatch and drops the invalid plans."""

    rows: np.ndarray          # int64, one row per choice (column order: see materialize)
    experts: tuple            # (ep, etp, capacity factor, hierarchical a2a, EP overlap)
    micro_batches: tuple
    kernel_code: int
    limits: SpaceLimits

    @property
    def num_candidates(self) -> int:
        return len(self.rows) * len(self.experts) * len(self.micro_batches)

    def parts(self, max_candidates: int):
        """The block in slices of its rows of at most about `max_candidates` plans each."""
        per_row = len(self.experts) * len(self.micro_batches)
        step = max(1, max_candidates // per_row)
        for i in range(0, len(self.rows), step):
            yield replace(self, rows=self.rows[i:i + step])

    def materialize(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload):
        """(PlanBatch of the valid plans, number rejected)."""
        limits = self.limits
        arr = np.repeat(self.rows, len(self.experts), axis=0)
        ex = np.tile(np.array(self.experts, dtype=float), (len(self.rows), 1))
        nm = len(self.micro_batches)
        mb_col = np.tile(np.array(self.micro_batches, dtype=np.int64), len(arr))
        ex = np.repeat(ex, nm, axis=0)
        arr = np.repeat(arr, nm, axis=0)
        n = len(arr)
        batch = PlanBatch(
            tp=arr[:, 0], pp=arr[:, 1], dp=arr[:, 2], cp=arr[:, 3], cp_comm_type_code=arr[:, 13],
            rank_order_code=arr[:, 14], vp=arr[:, 4],
            micro_batch_size=mb_col,
            schedule_code=arr[:, 5], recompute_code=arr[:, 6], recompute_num_layers=arr[:, 7],
            sequence_parallel=arr[:, 8].astype(bool), zero_code=arr[:, 9], dp_shard=arr[:, 10],
            offload_optimizer=arr[:, 11].astype(bool), dp_overlap=np.ones(n, dtype=bool),
            tp_overlap=arr[:, 12].astype(bool), attention_code=np.full(n, self.kernel_code, dtype=np.int64),
            grad_reduce_fp32=np.full(n, limits.grad_reduce_fp32),
            fp32_params=np.full(n, limits.fp32_params),
            checkpoint_early_stop=np.full(n, limits.checkpoint_early_stop),
            tp_async_backward=np.full(n, limits.tp_async_backward),
            fsdp2_copies=np.full(n, limits.fsdp2_copies) & (arr[:, 9] != ZeroStage.NONE.code),
            fused_kernels=np.full(n, limits.fused_kernels), compiled=np.full(n, limits.compiled),
            autocast=without_fsdp_autocast(limits.autocast_without_fsdp, arr[:, 0], arr[:, 1], arr[:, 9],
                                           arr[:, 10], arr[:, 3]),
            ep=ex[:, 0].astype(np.int64), etp=ex[:, 1].astype(np.int64), capacity_factor_value=ex[:, 2],
            a2a_hierarchical=ex[:, 3].astype(bool), ep_overlap=ex[:, 4].astype(bool))
        bad = invalid_mask(batch, model, cluster, workload)
        if limits.engine_rule is not None:
            bad |= limits.engine_rule(batch, model, workload)
        return batch.take(~bad), int(bad.sum())


def fsdp_shards(zero_code, dp_shard, cp):
    """Whether torchtitan shards with FSDP2 (ParallelDims.fsdp_enabled: over dp_shard·cp, when
    ZeRO ≥ 1 gives a shard group of 2+ or CP > 1). Vectorized."""
    return (((np.asarray(zero_code) != ZeroStage.NONE.code) & (np.asarray(dp_shard) > 1))
            | (np.asarray(cp) > 1))


def without_fsdp_autocast(engine_does, tp, pp, zero_code, dp_shard, cp):
    """Plan.autocast for an engine that trains under torch.autocast without FSDP (torchtitan's
    maybe_enable_amp: FSDP's own mixed precision when it shards, autocast for DDP or one GPU,
    fp32 with TP or PP and no FSDP -- the torchtitan export refuses those, autocast off). Vectorized."""
    return (np.asarray(engine_does, dtype=bool) & (np.asarray(tp) == 1) & (np.asarray(pp) == 1)
            & ~fsdp_shards(zero_code, dp_shard, cp))


def enumerate_space(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                    limits: SpaceLimits = SpaceLimits(), fixed: dict | None = None):
    """Yield PlanBatch chunks covering every valid plan (plus the count of rejected ones).

    `fixed` pins axes (e.g. {"tp": 8}). Yields (batch_of_valid_plans, num_rejected).
    """
    for block in space_blocks(model, cluster, workload, limits, fixed):
        yield block.materialize(model, cluster, workload)


def space_blocks(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                 limits: SpaceLimits = SpaceLimits(), fixed: dict | None = None) -> list[SpaceBlock]:
    """The plan space as one SpaceBlock per (TP, CP, PP, DP) layout that has candidates."""
    fixed = dict(fixed or {})
    allowed_fixed = {"tp", "pp", "dp", "cp", "ep", "etp", "vp", "micro_batch_size"}
    for key in fixed:
        if key not in allowed_fixed:
            raise SpecError("search", key, fixed[key], "only these axes can be pinned: " + ", ".join(sorted(allowed_fixed)))
    N, L, gbs = cluster.num_gpus, model.num_layers, workload.global_batch_size
    max_tp = limits.max_tp or cluster.gpus_per_node
    runnable = [k for k in limits.attention if k in cluster.gpu.attention_kernels]
    if not runnable:
        raise SpecError("search", "attention", ",".join(map(str, limits.attention)),
                        f"{cluster.gpu.name} runs: " + ", ".join(map(str, cluster.gpu.attention_kernels)))
    kernel = runnable[0]
    outer = []
    for tp in _divisors(N):
        if tp > max_tp or fixed.get("tp", tp) != tp:
            continue
        for cp in _divisors(N // tp):
            if cp > limits.max_cp or fixed.get("cp", cp) != cp:
                continue
            for pp in _divisors(N // (tp * cp)):
                # any PP up to a layer per stage: the fullest stage holds ⌈l/PP⌉ layers, the
                # spare slots come off the others (DeepSeek-V3's 61 layers run on PP 16)
                if (pp > L + 2 and "pp" not in fixed) or fixed.get("pp", pp) != pp:
                    continue
                dp = N // (tp * cp * pp)
                if gbs % dp or fixed.get("dp", dp) != dp:
                    continue
                outer.append((tp, cp, pp, dp))
    blocks = []
    for tp, cp, pp, dp in outer:
        rows = []
        per_dp = gbs // dp
        mbs = [x for x in _divisors(per_dp) if x <= limits.max_micro_batch]
        if "micro_batch_size" in fixed:
            mbs = [x for x in mbs if x == fixed["micro_batch_size"]]
        if pp > 1:
            # every divisor of the fullest stage's ⌈l/PP⌉ layers (those split it evenly:
            # ⌈⌈l/PP⌉/v⌉·v = ⌈l/PP⌉; a divisor of ⌊l/PP⌋ alone would put more layers on it, 6 for
            # DeepSeek-V3's 61 at PP 16 × VP 3), and those whose chunks even out counting the
            # embedding, the loss and the MTP modules as a slot each
            even = _divisors(-(-L // pp))
            slots = [v for v in range(2, limits.max_vp + 1) if _balanced(L, pp * v, model.mtp_layers)]
            # (at most l + 2 chunks: the pp_layers rule)
            vps = sorted(x for x in set(even) | set(slots) if x <= limits.max_vp and pp * x <= L + 2)
        else:
            vps = [1]
        if "vp" in fixed:  # virtual stages need pipeline stages: vp > 1 pins out PP = 1
            vps = [fixed["vp"]] if pp > 1 else ([1] if fixed["vp"] == 1 else [])
        L_s = -(-L // pp)
        # (fewer than the layers of the emptiest stage: the first_k rule)
        ks = sorted({max(1, round(L_s * q)) for q in (0.25, 0.5, 0.75)} - {L_s}) if L_s > 1 else []
        ks = [k for k in ks if k < L // pp]
        shards = [dp]
        if limits.hybrid_shard:  # (a shard group of one rank, dp_shard·cp = 1, shards nothing)
            shards += [x for x in _divisors(dp) if x < dp and x * cp > 1
                       and x >= cluster.gpus_per_node // max(tp * cp, 1)][:3]
        # with one data-parallel rank ZeRO shards nothing: ZeRO-0 stands for all stages (a
        # dense model's; an MoE model's experts still shard over their EDP group), and ZeRO-1
        # only for optimizer offload (ZeRO-Offload on one GPU)
        zeros = limits.zero_stages
        collapsed = dp * cp == 1 and not model.is_moe and ZeroStage.NONE in zeros
        if collapsed:
            zeros = (ZeroStage.NONE,) + ((ZeroStage.OPTIMIZER,) if limits.allow_offload
                                         and ZeroStage.OPTIMIZER in limits.zero_stages else ())
        # CP = 1 exchanges nothing (counted as the ring); a search for another exchange only
        cpcs = ([x.code for x in limits.cp_comm_types] if cp > 1
                else [CPCommType.P2P.code] if CPCommType.P2P in limits.cp_comm_types else [])
        # the rank orders asked for, where they place some group differently (plan/placement.py);
        # where they do not, one plan stands for both, in the default order
        island = cluster.gpus_per_island if cluster.dcn is not None else 0
        differ = rank_orders_differ(tp, cp, pp, dp, shards, cluster.gpus_per_node, island, model.is_moe)
        orders = ([o.code for o in limits.rank_orders] if differ
                  else [RankOrder.TP_CP_DP_PP.code] if limits.rank_orders else [])
        for vp in vps:
            if pp == 1:
                scheds = [Schedule.ONE_F_ONE_B]
            elif vp == 1:
                scheds = [x for x in limits.schedules if x in (Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.ZERO_BUBBLE)]
            else:
                scheds = [x for x in limits.schedules if x in (Schedule.INTERLEAVED_1F1B, Schedule.BREADTH_FIRST)
                          or (x in V_SCHEDULES and vp == 2)]
            for sched in scheds:
                s_code = sched.code  # (an enum's code is a cached lookup, not free: hoisted)
                for rc in limits.recomputes:
                    rks = ks if rc is Recompute.FIRST_K else [0]
                    rc_code = rc.code
                    for rk in rks:
                        # an MoE model with TP needs SP (the moe_sp rule)
                        sps = (limits.sequence_parallel if tp > 1 else (False,))
                        if model.is_moe and tp > 1:
                            sps = tuple(x for x in sps if x)
                        for sp in sps:
                            for zero in zeros:
                                zshards = shards if zero is ZeroStage.PARAMETERS else [dp]
                                z_code = zero.code
                                offs = ((False, True) if limits.allow_offload
                                        and zero in (ZeroStage.OPTIMIZER, ZeroStage.GRADIENTS) else (False,))
                                offs = (True,) if collapsed and zero is not ZeroStage.NONE else offs
                                tpovs = limits.tp_overlap if sp else (False,)
                                rows.extend((tp, pp, dp, cp, vp, s_code, rc_code, rk, sp, z_code, shard, off, tpov,
                                             cpc, order)
                                            for shard in zshards for off in offs for tpov in tpovs
                                            for cpc in cpcs for order in orders)
        if not rows or not mbs:
            continue
        experts = _expert_choices(model, cluster, limits, fixed, tp, cp, dp)
        if not experts:
            continue
        rows = np.array(rows, dtype=np.int64)
        outermost_dp = rows[:, 14] == RankOrder.TP_CP_PP_DP.code
        # with data parallelism outermost, expert layers need EP×ETP = TP×CP (the ep_rank_order
        # rule): those rows take only such expert layouts, not the whole product
        outer_experts = tuple(x for x in experts if x[0] * x[1] == tp * cp) if model.is_moe else tuple(experts)
        # EP overlap pairs a forward with a backward: rows whose schedule has no such pairs, or
        # that recompute whole layers, take only the expert layouts without it (the ep_overlap
        # and ep_overlap_recompute rules), not the whole product
        pairs = ((pp == 1) | ((rows[:, 5] == Schedule.INTERLEAVED_1F1B.code) & (rows[:, 4] > 1))
                 | (rows[:, 5] == Schedule.DUAL_PIPE_V.code))
        pairs &= ~np.isin(rows[:, 6], [Recompute.FULL.code, Recompute.FIRST_K.code])
        if not any(x[4] for x in experts):  # no layout overlaps: one part, in enumeration order
            pairs = np.ones(len(rows), dtype=bool)
        for part, ex in ((~outermost_dp, tuple(experts)), (outermost_dp, outer_experts)):
            for sub, sub_ex in ((part & pairs, ex), (part & ~pairs, tuple(x for x in ex if not x[4]))):
                if sub.any() and sub_ex:
                    blocks.append(SpaceBlock(rows=rows[sub], experts=sub_ex, micro_batches=tuple(mbs),
                                             kernel_code=kernel.code, limits=limits))
    return blocks
