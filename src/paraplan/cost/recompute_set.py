"""Searched recomputation (Recompute.SET): what re-creating a set of a layer's saved tensors
costs in its backward, and the sets worth searching (fusion-aware checkpointing, He & Yu,
MLSys 2023: choose the recomputed operators knowing which fuse).

Legend: T tokens per micro-batch on one CP rank, t TP degree, h hidden size, f MLP hidden
size, qd, kvd the query and key/value widths, a bytes per activation element, w the share
of the stage's layers with a dense MLP (1: the set applies to dense models).

Each tensor of plan/axes.py RecomputeOp is re-created by re-running its producer from what
the layer keeps (a dropped input is itself re-created first: the set's producers all run):
  ln1, ln2  the norm:         an element-wise kernel, read a·h and write the output
  qkv       the QKV GEMM and RoPE (under SP, the all-gather of its input: a quarter of a
            layer's forward TP traffic, which runs AG, RS, AG, RS)
  scores, attn  the attention forward (once for both), and its CP exchange
  resid     the out-projection GEMM, its TP reduction (all-reduce: half the forward's
            traffic; reduce-scatter under SP: a quarter) and the residual add
  up        the up (and gate) GEMM (under SP, its input's all-gather)
  act       the activation function: one fused kernel (SwiGLU: read 2f, write f) or an eager
            engine's two (SiLU, then the product)
Fusion: an eager block under torch.compile (inductor) fuses a recomputed element-wise producer
into the kernel that consumes its output (a norm into the next GEMM's prologue, SwiGLU into the
down-projection's): it costs reading its inputs, no launch, no write (He & Yu Sec. 3); a
producer that is a GEMM, or an element-wise op of a fused engine's hand-written kernels
(Megatron / Transformer Engine re-run a module as its own kernel), costs its full time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..num import Num
from ..plan.axes import AttentionKernel, Recompute, RecomputeOp
from ..plan.plan import make_plan
from ..specs.hardware import ClusterSpec, GPUSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .cp import CPComm, cp_comm
from .layer_compute import LayerCompute, layer_compute
from .layout import Layout, layout
from .low_precision import recipe_cluster
from .memory import compiled_blocks, holds, recompute_op_bytes_per_token, residual_bytes_per_element
from .roofline import memory_bound_time_s
from .tp import TPComm, tp_comm

# the sets the search tries at a layout: at most this many points of the frontier
MAX_SEARCHED_SETS = 2


@dataclass(frozen=True, kw_only=True)
class OpCost:
    """What re-running one tensor's producer adds to a layer's backward per micro-batch (seconds)."""

    compute_s: Num
    tp_s: Num = 0.0
    cp_s: Num = 0.0


def _elementwise_s(gpu: GPUSpec, plan, read_bytes, write_bytes, kernels):
    """A recomputed element-wise producer: inside its consumer's compiled kernel it reads its
    inputs only (no launch, no write); else its own kernels at the engine's bandwidth share."""
    fused = np.asarray(plan.fused_kernels, dtype=bool)
    eff = np.where(fused, gpu.elementwise_bw_efficiency, gpu.eager_elementwise_bw_efficiency)
    in_consumer = memory_bound_time_s(gpu, read_bytes, 0, gpu.elementwise_bw_efficiency)
    own = memory_bound_time_s(gpu, read_bytes + write_bytes, kernels, eff)
    return np.where(compiled_blocks(plan), in_consumer, own)


def op_costs(gpu: GPUSpec, model: ModelSpec, plan, lay: Layout, lc: LayerCompute, tp: TPComm,
             cp: CPComm) -> dict[RecomputeOp, OpCost]:
    """Each RecomputeOp's producer re-run, per layer and micro-batch (the attention's once: see
    set_cost); vectorized over plans."""
    T, t, sp_div, a, w = (lay.tokens_per_microbatch, lay.tp, lay.sp_divisor, lay.act_bytes_per_element,
                          lay.dense_layer_share)
    h, f = model.hidden_size, model.ffn_hidden_size
    sp = np.asarray(lay.sequence_parallel, dtype=bool)
    eager = ~np.asarray(plan.fused_kernels, dtype=bool)
    resid_in = residual_bytes_per_element(a, plan.autocast)
    norm = _elementwise_s(gpu, plan, T * resid_in * h / sp_div, T * a * h / sp_div, 1)
    rope = np.where(compiled_blocks(plan), 0.0,  # (in the QKV GEMM's epilogue when compiled)
                    _elementwise_s(gpu, plan, T * a * (model.q_dim + model.kv_dim) / t,
                                   T * a * (model.q_dim + model.kv_dim) / t, 1))
    add = np.where(compiled_blocks(plan), 0.0,
                   _elementwise_s(gpu, plan, 2.0 * T * a * h / sp_div, T * a * h / sp_div, 1))
    gated = model.gated_mlp
    act_in, act_out = a * f * (2.0 if gated else 1.0) / t, a * f / t
    act = _elementwise_s(gpu, plan, T * (act_in + np.where(eager & gated, act_out, 0.0)),
                         T * act_out * np.where(eager & gated, 2.0, 1.0), np.where(eager & gated, 2, 1))
    gather = np.where(sp, 0.25, 0.0) * tp.forward_exposed_s  # (SP: the GEMM input's all-gather)
    attention = OpCost(compute_s=lc.attention_forward_s, cp_s=cp.forward_exposed_s)
    return {
        RecomputeOp.LN1: OpCost(compute_s=norm),
        RecomputeOp.QKV: OpCost(compute_s=lc.qkv_gemm_s + rope, tp_s=gather),
        RecomputeOp.SCORES: attention,
        RecomputeOp.ATTN: attention,
        RecomputeOp.RESID: OpCost(compute_s=lc.out_gemm_s + add, tp_s=np.where(sp, 0.25, 0.5) * tp.forward_exposed_s),
        RecomputeOp.LN2: OpCost(compute_s=norm),
        RecomputeOp.UP: OpCost(compute_s=w * lc.up_gemm_s, tp_s=w * gather),
        RecomputeOp.ACT: OpCost(compute_s=w * act),
    }


def set_cost(ops_code, costs: dict[RecomputeOp, OpCost]) -> OpCost:
    """The re-run of the sets `ops_code` (vectorized): each producer once (the attention kernel
    makes both its scores and its output)."""
    def runs(op):
        if op is RecomputeOp.SCORES:
            return holds(ops_code, op) & ~holds(ops_code, RecomputeOp.ATTN)
        return holds(ops_code, op)
    parts = [(runs(op), c) for op, c in costs.items()]
    return OpCost(compute_s=sum(np.where(r, c.compute_s, 0.0) for r, c in parts),
                  tp_s=sum(np.where(r, c.tp_s, 0.0) for r, c in parts),
                  cp_s=sum(np.where(r, c.cp_s, 0.0) for r, c in parts))


def saved_bytes_per_token(model: ModelSpec, plan, seq_len, ops_code, mlp_weight=1.0, precision=None):
    """Bytes per token one layer no longer keeps under the sets `ops_code` (vectorized)."""
    table = recompute_op_bytes_per_token(model, plan, seq_len, mlp_weight, precision)
    return sum(np.where(holds(ops_code, op), b, 0.0) for op, b in table.items())


def pareto_sets(saved_bytes: np.ndarray, seconds: np.ndarray, limit: int = MAX_SEARCHED_SETS) -> list[int]:
    """The codes (indices) on the frontier of bytes saved against seconds spent, without the
    empty set and ties (the smaller code stands for a tie): for each of `limit` memory targets,
    k/limit of the most any set saves (k = 1..limit), the fastest set saving that much."""
    order = np.lexsort((np.arange(len(seconds)), -saved_bytes, seconds))  # fastest first, then most saved
    frontier, best = [], 0.0
    for i in order:
        if saved_bytes[i] > best * (1.0 + 1e-9) and saved_bytes[i] > 0.0:
            frontier.append(int(i))
            best = saved_bytes[i]
    targets = best * np.arange(1, limit + 1) / limit
    return list(dict.fromkeys(next(i for i in frontier if saved_bytes[i] >= x * (1.0 - 1e-9)) for x in targets))


def frontier_codes(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan) -> tuple[int, ...]:
    """The sets the search tries for plans like `plan` (its TP, SP, kernels and precision; one
    sequence a micro-batch): the Pareto frontier of time against memory over every set."""
    codes = np.arange(1 << len(RecomputeOp))
    cluster = recipe_cluster(cluster, workload)  # (as evaluate prices the plans)
    base = replace(plan, recompute=Recompute.NONE, micro_batch_size=1, pp=1, cp=1, vp=1)
    lay = layout(model, workload, base)
    lc = layer_compute(cluster.gpu, model, workload, base, lay, None)
    tp = tp_comm(cluster, model, base, lay, lc, None)
    cp = cp_comm(cluster, model, base, lay, lc)
    cost = set_cost(codes, op_costs(cluster.gpu, model, base, lay, lc, tp, cp))
    saved = saved_bytes_per_token(model, base, workload.seq_len, codes, precision=lay.precision)
    return tuple(pareto_sets(np.broadcast_to(saved, codes.shape), cost.compute_s + cost.tp_s))


def searched_sets(model: ModelSpec, cluster: ClusterSpec, workload: Workload, limits):
    """SpaceLimits.recompute_sets for a search: f(tp, sp) -> the frontier's codes (cached)."""
    kernel = next(k for k in limits.attention if k in cluster.gpu.attention_kernels) \
        if any(k in cluster.gpu.attention_kernels for k in limits.attention) else AttentionKernel.FLASH2
    cache: dict = {}

    def sets(tp: int, sp: bool) -> tuple[int, ...]:
        key = (int(tp), bool(sp))
        if key not in cache:
            plan = make_plan(tp=key[0], sequence_parallel=key[1], attention=kernel,
                             fused_kernels=limits.fused_kernels, compiled=limits.compiled)
            cache[key] = frontier_codes(model, cluster, workload, plan)
        return cache[key]
    return sets


def with_searched_sets(model: ModelSpec, cluster: ClusterSpec, workload: Workload, limits):
    """`limits` (plan/space.py SpaceLimits) with Recompute.SET's sets to try, where it offers SET
    and has none given: the frontier at each layout (a dense, non-MLA model's: the rule)."""
    if (Recompute.SET not in limits.recomputes or limits.recompute_sets is not None
            or model.is_moe or model.is_mla):
        return limits
    return replace(limits, recompute_sets=searched_sets(model, cluster, workload, limits))
