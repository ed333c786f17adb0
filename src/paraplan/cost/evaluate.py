"""Assemble per-micro-batch stage times, communication, memory and the step time of plans.

One code path for one plan (`estimate`) and for millions (`search`): plan fields may be
ints or numpy arrays. Notation as in flops.py / memory.py; T = b·s/c tokens per rank and
micro-batch, L_s = l/p layers per pipeline stage, m micro-batches per step, S = dp_shard·c
the ZeRO shard group (Megatron shards the optimizer over DP×CP), R = dp/dp_shard replicas.

Overlap model (docs/model.md, "What overlaps"):
  * TP collectives are exposed, unless TP overlap (TE userbuffers) hides them behind the
    layer's GEMMs; the first of t chunks is never hidden.
  * CP ring exchange of K/V overlaps the attention kernel of the previous ring step; the
    K/V all-gather and Ulysses all-to-alls are exposed.
  * ZeRO-3/FSDP gathers and reduce-scatters overlap the neighbouring layer as it runs
    (compute plus its exposed TP/CP; prefetch); the first gather of each pass is exposed.
  * DDP / ZeRO-1 gradient reduction overlaps the last micro-batch's backward (under ZB-H1
    its W pass only); its last bucket (one layer) is exposed (FSDP2 under pipeline
    schedules: all of it, after the last backward). ZeRO-1/2 parameter all-gather overlaps
    the next forward.
  * Overlapped communication slows concurrent compute by the GPU's `overlap_slowdown`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan.axes import V_SCHEDULES, AttentionKernel, CPCommType, RankOrder, Recompute, Schedule, ZeroStage
from ..sim.schedules import SPLIT_BACKWARD, fsdp2_gathers_per_step
from ..specs.hardware import ClusterSpec, GPUSpec
from ..specs.model import ModelSpec
from ..specs.workload import Optimizer, Precision, Workload
from . import memory as mem
from .breakdown import MemoryBreakdown, OverlappedComm, TimeBreakdown
from .comm import Collective, collective_time_s, p2p_time_s, pipeline_hops_s
from .flops import (CAUSAL_FRACTION, FLASH_BWD_OVER_FWD, flash2_padding, layer_forward_flops, lm_head_forward_flops,
                    mtp_forward_flops,
                    moe_down_proj_flops, moe_forward_flops)
from .low_precision import (LOW_PRECISIONS, attention_precision, bf16_end_layers, head_precision,
                            quantize_bytes_per_element)
from .moe import moe_activation_bytes, moe_layer_costs, moe_layers_on_stage
from .roofline import (attention_time_s, elementwise_time_s, gemm_time_s, memory_bound_time_s, rows_aligned,
                       up_projection_time_s)

# Adam step traffic per parameter (bytes) and launches, by implementation. Fused: read fp32
# param, m, v, grad (16 B), write param, m, v (12 B) and the 16-bit copy (2 B), in a few
# multi-tensor launches. torch.optim.AdamW unfused (torch/optim/adamw.py, _single_tensor /
# _multi_tensor paths, no weight decay): m.lerp_(g) r m,g w m 12; v.mul_ 8; v.addcmul_(g, g)
# 12; sqrt(v) 8; ÷ bias correction 8; + eps 8; p.addcdiv_(m, denom) r p,m,d w p 16 = 72 B in
# 7 passes (the 16-bit copy is made at the next all-gather or autocast, not here).
ADAM_STEP = {Optimizer.ADAM: (30.0, 4), Optimizer.ADAM_UNFUSED: (72.0, 7)}
LOSS_FWD_KERNELS, LOSS_BWD_KERNELS = 3, 4  # upcast, max/sum-exp, write; fill, scatter, log-softmax bwd, downcast
EW_FWD_KERNELS = 10  # a layer's forward element-wise launches (2 norms, RoPE, 2 residual adds, activation, ...)
EW_BWD_KERNELS = 14  # and backward's (each forward kernel's gradient, plus the residual-gradient adds)
# the exposed CP exchange as the breakdown names it, by CPCommType code
_CP_LABEL = {CPCommType.P2P.code: "CP ring send/recv", CPCommType.ALL_GATHER.code: "CP K/V all-gather",
             CPCommType.A2A.code: "CP all-to-all (Ulysses)"}


# vocab-parallel cross-entropy's all-reduces of one fp32 value per token: the logits' max,
# the target logit, the sum of exponentials (Megatron-Core 0.16.1 tensor_parallel/
# cross_entropy.py; torch 2.13's loss_parallel the same three)
VOCAB_PARALLEL_CE_ALL_REDUCES = 3


def fsdp2_gather_copy_s(gpu, gathered_bytes, shard):
    """What FSDP2's copies around one all-gather of `gathered_bytes` over `shard` ranks add to
    the step, at the element-wise rate (torch 2.13 torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py foreach_all_gather, _fsdp_param_group.py wait_for_unshard): the
    output out to the unsharded parameters on the compute stream (split_with_sizes_copy: read
    + write B; a one-rank group copies its shard straight in, the same bytes), and the shards
    into the flat input on a side stream (all_gather_copy_in: read + write B/S), which slows
    concurrent compute by overlap_slowdown of its time as communication does."""
    B, S = np.asarray(gathered_bytes, dtype=float), np.asarray(shard, dtype=float)
    side = np.where(S > 1, elementwise_time_s(gpu, 2.0 * B / np.maximum(S, 1.0), 1), 0.0)
    return elementwise_time_s(gpu, 2.0 * B, 1) + gpu.overlap_slowdown * side


def fsdp2_reduce_copy_s(gpu, reduced_bytes, shard):
    """... and around one gradient reduction over `shard` ranks (foreach_reduce): the gradients
    into the flat reduce-scatter input on the compute stream (chunk_cat: read + write B), the
    reduced shard being a view of the output; a one-rank group then copies the input to the
    output on the reduce-scatter stream (read + write B, at overlap_slowdown)."""
    B, S = np.asarray(reduced_bytes, dtype=float), np.asarray(shard, dtype=float)
    side = np.where(S > 1, 0.0, elementwise_time_s(gpu, 2.0 * B, 1))
    return elementwise_time_s(gpu, 2.0 * B, 1) + gpu.overlap_slowdown * side


def fsdp2_pp_gathers_per_pass(plan, m, z3, rows=None):
    """All-gathers per layer and pass (forward or backward) under FSDP2 in torch's pipeline
    schedules, on average over the step, for the plans of `plan` (a Plan or PlanBatch; only
    the `rows` of a batch where given, 0 elsewhere) with m micro-batches: at ZeRO-3 (`z3`) all
    of them, below it the ones beyond the step's first (which the per-step gather already
    prices). The count per step is sim/schedules.py fsdp2_gathers_per_step's, read from the
    schedule's task order (cost reads the schedules as data; sim never imports cost)."""
    shape = np.shape(m)
    m = np.atleast_1d(np.asarray(m, dtype=float))
    sched = np.broadcast_to(np.asarray(plan.schedule_code), shape).ravel()
    p = np.broadcast_to(_f(plan.pp), shape).ravel()
    v = np.broadcast_to(_f(plan.vp), shape).ravel()
    z3 = np.broadcast_to(np.asarray(z3, dtype=bool), shape).ravel()
    rows = np.ones(len(m), dtype=bool) if rows is None else np.broadcast_to(rows, shape).ravel()
    out = np.zeros(len(m))
    if rows.any():
        keys = np.stack([x[rows].astype(np.int64) for x in (sched, p, v, m, z3)], axis=1)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        counted = np.empty(len(uniq))
        for j, (code, pp, vp, mm, zz) in enumerate(uniq):
            n = fsdp2_gathers_per_step(Schedule.from_code(code), int(pp), int(mm), int(vp), bool(zz))
            counted[j] = (n - (0 if zz else vp)) / (2.0 * mm * vp)
        out[rows] = counted[inverse.ravel()]
    return out.reshape(shape) if shape else float(out[0])


def fsdp2_accumulate_s(gpu, params, tensors, reduce_bytes_per_param, param_bytes_per_param, m):
    """FSDP2's gradient accumulation across the m micro-batches of a step it does not reduce
    in between, per micro-batch, of `params` parameters in `tensors` tensors: the first
    backward's gradient cast to the reduce dtype where it differs (to_accumulated_grad_if_needed:
    read 16-bit, write the reduce dtype; else autograd leaves it in .grad), each later one added
    in (accumulate_unsharded_grad_if_needed: read both, write the sum), one kernel per parameter
    tensor (torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_param.py). Averaged over the
    m micro-batches."""
    m = np.asarray(m, dtype=float)
    params = np.asarray(params, dtype=float)
    rb, pb = np.asarray(reduce_bytes_per_param), np.asarray(param_bytes_per_param)
    first = np.where(rb != pb, elementwise_time_s(gpu, (pb + rb) * params, tensors), 0.0)
    later = elementwise_time_s(gpu, (pb + 2.0 * rb) * params, tensors)
    return (first + (m - 1.0) * later) / np.maximum(m, 1.0)


def autocast_weight_cast_s(gpu, params, tensors):
    """torch.autocast with fp32 parameters: each weight cast to 16 bits at its first use in a
    micro-batch's forward (read 4 B, write 2 B; the cache lives for one autocast region, and a
    recomputed forward casts again), one kernel per tensor: streaming at the copy rate (a
    weight's cast is one long contiguous pass, not a layer's mix of element-wise kernels)."""
    return memory_bound_time_s(gpu, 6.0 * np.asarray(params, dtype=float), tensors)


def autocast_grad_s(gpu, params, tensors, m, cast=True):
    """... and in the backward: the 16-bit weight gradient cast back to fp32 (read 2 B, write
    4 B; not for a weight autocast does not cast, the input embedding's) and, after the step's
    first micro-batch, added into the fp32 .grad (read 4 + 4 B, write 4 B); averaged over the
    m micro-batches, one kernel per tensor each."""
    m = np.asarray(m, dtype=float)
    params = np.asarray(params, dtype=float)
    add = memory_bound_time_s(gpu, 12.0 * params, tensors) * (m - 1.0) / np.maximum(m, 1.0)
    return (memory_bound_time_s(gpu, 6.0 * params, tensors) if cast else 0.0) + add


def tp_collectives_per_pass(sp, blocks):
    """TP collectives a layer issues per pass (forward, or backward) for `blocks` attention
    and MLP blocks: an all-gather and a reduce-scatter around each with sequence parallelism,
    one all-reduce without (Korthikanti et al. 2022 Sec. 4.2.2, Fig. 5)."""
    return np.where(sp, 2.0, 1.0) * blocks


def loss_bytes_per_logit(precision: Precision) -> tuple[float, float]:
    """Cross-entropy over the T×V/t logits, HBM bytes per logit element (forward, backward),
    as PyTorch autocast (and Megatron's vocab-parallel kernel) run it in fp32. Forward: upcast
    16-bit logits (read 2, write 4), log-softmax (two reads for max and sum-exp, one write:
    12). Backward: the NLL gradient fill (write 4), log-softmax backward (reads the gradient
    twice and the output once, writes one: 16), downcast to 16 bits (read 4, write 2). 32-bit
    logits skip both casts: 18 and 26 bytes at 16 bits, 12 and 20 at 32."""
    cast = 0.0 if precision.activation_bytes >= 4.0 else 6.0
    return 12.0 + cast, 20.0 + cast


def elementwise_bytes_per_token(model: ModelSpec, *, act_bytes: float, sp_div=1.0, t=1.0, w_dense=1.0):
    """A layer's forward element-wise bytes per token: norms r+w 4h, residual adds 6h,
    dropout 5h, RoPE on q and k 2(qd+kvd), activation 3f (gated) or 2f of a dense MLP;
    elements of `act_bytes` bytes. The h terms split over SP, the rest over TP."""
    h, f = model.hidden_size, model.ffn_hidden_size
    ew_h = (10.0 + (5.0 if model.dropout else 0.0)) * h / sp_div
    ew_t = (2.0 * (model.q_dim + model.kv_dim) + w_dense * (3.0 if model.gated_mlp else 2.0) * f) / t
    return act_bytes * (ew_h + ew_t)


def _f(x):
    return np.asarray(x, dtype=float)


@dataclass(frozen=True, kw_only=True)
class StageTimes:
    """Per micro-batch times of one pipeline stage (one model chunk = L_s/v layers × v)."""

    forward_s: object       # compute + exposed per-micro-batch comm, whole stage
    backward_s: object      # incl. recomputation and exposed comm
    weight_grad_s: object   # part of backward that is weight-gradient GEMMs (for ZB-H1)


@dataclass(frozen=True, kw_only=True)
class PlanCosts:
    """Everything the cost model knows about a plan (or a batch of plans)."""

    num_microbatches: object
    first: StageTimes
    middle: StageTimes
    last: StageTimes
    p2p_s: object                 # one activation hand-off between consecutive stages
    time: TimeBreakdown           # closed-form step (search); estimate() re-times the pipeline
    overlapped: OverlappedComm
    memory: MemoryBreakdown
    host_bytes: object            # host DRAM per GPU (offloaded optimizer), worst stage
    dp_step_s: object             # exposed DP comm, SP norm-gradient all-reduce and optimizer, after the pipeline
    critical_stage_s: object      # m × the slowest stage's per-micro-batch time (no bubble)
    step_detail: dict             # dp_step_s by part, in the order they run after the pipeline (for the trace)
    comm_detail: dict             # per-collective totals per step (exposed, seconds)
    hardware_flops_per_step: object
    layer_detail: dict            # per-layer op times (forward/backward; "wgrad": ZB-H1's W inside "bwd"), for the trace

    @property
    def step_time_s(self):
        return self.time.total


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What a plan makes of the model on one GPU: the sizes both the memory model and the
    time model read (floats or numpy arrays over a batch of plans)."""

    precision: Precision
    act_bytes: float        # bytes per activation element (16-bit unless fp32/tf32)
    fp32_params: object     # 32-bit parameter shards (the plan's knob, or a 32-bit workload)
    casts_gathered: object  # fp32 shards of a 16-bit workload: each gathered weight cast at use
    t: object
    p: object
    d: object
    c: object
    v: object
    m: object               # micro-batches per step
    T: object               # tokens per micro-batch on one CP rank
    sp: object
    sp_div: object          # TP when sequence parallel, else 1
    rc: object
    zc: object
    L_s: object             # layers of the critical stage
    L_first: object
    L_last: object
    only: object            # one pipeline stage
    slack: object           # chunk slots past the layers: the loss's first, then the embedding's
    vshape: object          # ZB-V, DualPipeV: two chunks per rank in a V (sim/schedules.py Placement.V_SHAPE)
    ends: object            # the first rank holds both the embedding and the head (one stage, or a V)
    w_moe: object           # share of the stage's layers that are MoE layers
    w_dense: object
    k_rc: object            # first-k: layers recomputed per stage
    rc_layers: object       # layers re-run whole per stage and micro-batch
    S: object               # ZeRO-3 shard group (dp_shard × CP)
    R: object               # HSDP replicas
    edp: object             # expert data-parallel group
    S_e: object             # the experts' ZeRO shard group: EDP within one HSDP replica, edp/R
    e_stride: object
    # rank distance between data-parallel replicas (plan.rank_order): t·c with the pipeline
    # outermost (Megatron's default), t·c·p with data parallelism outermost; CP×DP groups are
    # runs of c ranks t apart repeated dp_outer apart (dp_block = c; the whole group, one even
    # run, with the pipeline outermost)
    dp_outer: object
    dp_block: object
    pp_stride: object       # rank distance between consecutive pipeline stages
    dense_layer_params: object
    layer_params: object    # one layer's non-expert parameters on this TP rank
    expert_params: object   # one (average) layer's routed experts on this rank
    params_stage_first: object
    params_stage_last: object
    mtp_experts: object     # routed experts of the multi-token-prediction blocks on the head's rank
    # routed experts on the head's stage: its layers' and the MTP blocks', counted like the
    # other stages' (as a full stage's) at least; the busiest stage's experts
    expert_head: object
    params_stage: object
    expert_stage: object
    is_z3: object
    is_z2: object
    fsdp2: object           # data parallelism on FSDP2 fully_shard (plan.fsdp2_copies, over 2+ ranks)
    fsdp2_pp: object        # ... under torch's pipeline schedules: no-sync accumulation, one reduction per step
    autocast_casts: object  # weights cast by torch.autocast (plan.autocast, fp32 parameters without FSDP)
    gather_bytes: object    # bytes per parameter all-gathered
    reduce_bytes: object    # bytes per gradient reduced
    shard: object           # optimizer-state shard of the dense parameters
    shard_e: object         # and of the experts
    offload: object


def zbv_bubble_s(p, m, f, b, w, c):
    """Idle time of ZB-V's busiest rank beyond its work, in torch's order (sim/schedules.py
    _zero_bubble_v), with every chunk taking f forward, b input-gradient and w weight-gradient
    seconds and each send between ranks c. Derived, not published (Qi et al. 2024 Sec. 6 give
    only the zero bubble at f = b = w, c = 0, which this order leaves at q·f, its warm-up's
    offset): a fixed task order's makespan is its longest path, so the bubble is the largest
    of the paths' linear forms in (f, b, w, c). With q = p − 1:
    - m ≥ 2p − 1 (the V full; the bubble no longer depends on m): the fourteen forms below;
    - m ≤ p: the four of `_zbv_few`;
    - in between: the step interpolated linearly in m between those two ends (removing
      micro-batches from a fixed order only shortens it, so the step lies between them).
    The event simulator's critical paths take exactly these forms for sends up to 30% of the
    shortest pass; the interpolation stays within 7% of the step (tests/test_zbv.py).
    Vectorized."""
    p, m = np.asarray(p, dtype=float), np.asarray(m, dtype=float)
    q = p - 1.0
    f, b, w, c = (np.asarray(x, dtype=float) for x in (f, b, w, c))
    forms = (
        q * b + (5 * q - 2) * c,
        (2 * q - 1) * f - (q - 1) * b + (3 * q - 2) * c,
        b + (q - 1) * w + 3 * q * c,
        2 * q * (b - w) + (6 * q - 2) * c,
        2 * q * f - q * b - w + 3 * q * c,
        f + (q - 1) * w + (3 * q - 2) * c,
        2 * q * f - (2 * q + 1) * w + 4 * q * c,
        (2 * q - 1) * f + b - 2 * q * w + (4 * q - 2) * c,
        (q - 1) * f + b + (5 * q - 2) * c,
        q * f - w + 5 * q * c,
        2 * q * b - (2 * q + 1) * w + 6 * q * c,
        q * (f + b) - (2 * q + 1) * w + 6 * q * c,
        q * b - w + 5 * q * c,
        (q - 1) * f + (q + 1) * b - 2 * q * w + (6 * q - 2) * c,
    )
    full = np.maximum(np.maximum.reduce(np.broadcast_arrays(*forms)), 0.0)
    per_mb = 2.0 * (f + b + w)  # a rank's work per micro-batch: two chunks
    at_p = _zbv_few(q, p, f, b, w, c) + p * per_mb  # the step at m = p ...
    at_full = full + (2.0 * q + 1.0) * per_mb       # ... and at m = 2p − 1
    between = at_p + (m - p) / np.maximum(q, 1.0) * (at_full - at_p) - m * per_mb
    out = np.where(m <= p, _zbv_few(q, m, f, b, w, c), np.where(m >= 2.0 * q + 1.0, full, between))
    return np.where(q > 0, np.maximum(out, 0.0), 0.0)


def dualpipev_bubble_s(p, m, f, b, w, c):
    """Idle time of DualPipeV's busiest rank beyond its work, in torch's order (sim/schedules.py
    _dual_pipe_v; m ≥ 2p), each chunk taking f forward, b input-gradient and w weight-gradient
    seconds (a full backward b + w, a forward-backward pair f + b + w: the pair's overlap is
    priced into the passes, not here), each send between ranks c. With q = p − 1 and
    n = m − 2p, the largest of four forms, read off the simulator's critical paths like
    zbv_bubble_s's (derived):
        2q·f,  2q·f + q(b − w),  (q − 1)f + q(2b − w),  (q − 1)f + q·b,
    plus (5q − 2), (6q − 2), (8q − 2), (7q − 2) sends, each + 2(n − ⌊(n − 2 + p)/p⌋): the
    steady state's pairs wait on their neighbour's, so every send there lengthens the step,
    in p − 1 of every p micro-batches. At f = b = w and c = 0 that is 2q·f, DeepSeek-V3's
    (PP/2 − 1)(F&B + B − 3W) with F&B = F + B (DeepSeek-AI 2024, Table 2; PP = 2p chunks).
    Exact against the simulator for p ≤ 12 and sends up to 30% of the shortest pass
    (tests/test_dualpipev.py). Vectorized."""
    p, m = np.asarray(p, dtype=float), np.asarray(m, dtype=float)
    q = p - 1.0
    f, b, w, c = (np.asarray(x, dtype=float) for x in (f, b, w, c))
    n = np.maximum(m - 2.0 * p, 0.0)
    grow = 2.0 * (n - np.floor((n - 2.0 + p) / np.maximum(p, 1.0)))
    out = np.maximum.reduce(np.broadcast_arrays(
        2 * q * f + (5 * q - 2 + grow) * c,
        2 * q * f + q * (b - w) + (6 * q - 2 + grow) * c,
        (q - 1) * f + q * (2 * b - w) + (8 * q - 2 + grow) * c,
        (q - 1) * f + q * b + (7 * q - 2 + grow) * c))
    return np.where(q > 0, np.maximum(out, 0.0), 0.0)


def _zbv_few(q, m, f, b, w, c):
    """zbv_bubble_s for m ≤ p micro-batches (k = m − 1): a lone micro-batch's whole round trip
    2q(f + b) at m = 1, shortened as more fill the V."""
    k = m - 1.0
    return np.maximum.reduce(np.broadcast_arrays(
        (2 * q - 2 * k) * f + 2 * q * b + 4 * q * c,
        (2 * q + 1 - m) * (f + b + 2 * c),
        2 * q * f + (2 * q - 2 * k) * b - 2 * k * w + 4 * q * c,
        2 * q * f + (2 * q - 3 * k) * b - k * w + 2 * (2 * q + 1 - m) * c))


def end_chunk_slots(model: ModelSpec, per_chunk, slack):
    """(layers off the last virtual stage, off the first) where a split leaves `slack` slots
    past the layers in chunks of `per_chunk`: the last chunk gives one to the loss and one to
    each multi-token-prediction module (as many as it has layers), then the first one to the
    embedding. Megatron-Core --account-for-loss/embedding-in-pipeline-split; Llama 3 405B's 126
    layers in 16 × 8 chunks, Dubey et al. 2024 Sec. 3.3.2; Megatron-Bridge lays out
    DeepSeek-V3's 61 layers and its MTP module in 32 chunks as `Et|(tt|)*30mL`. Vectorized."""
    off_last = np.minimum(np.minimum(slack, 1.0 + model.mtp_layers), per_chunk)
    off_first = np.minimum(np.maximum(slack - off_last, 0.0), 1.0)
    return off_last, off_first


def layout(model: ModelSpec, workload: Workload, plan) -> Layout:
    prec = Precision(workload.precision)
    ab = prec.activation_bytes
    # a 32-bit workload has 32-bit parameters (no 16-bit copy, the master is the weight) and
    # reduces 32-bit gradients, whatever the plan's mixed-precision knobs say
    wide = ab >= 4.0
    t, p, d, c, v, b = (_f(plan.tp), _f(plan.pp), _f(plan.dp), _f(plan.cp), _f(plan.vp),
                        _f(plan.micro_batch_size))
    sp = np.asarray(plan.sequence_parallel, dtype=bool)
    rc = np.asarray(plan.recompute_code)
    zc = np.asarray(plan.zero_code)
    # layers on the critical stage: ceil(l / (p·v)) per chunk × v chunks (an uneven split's
    # spare slots: the loss's and the embedding's off the last and first stages, any more
    # off the middle ones, which are timed full: conservative)
    L_s = np.ceil(model.num_layers / (p * v)) * v
    # Chunk slots left over by ceil(l/(p·v)) go to the loss (and the multi-token-prediction
    # modules) and the embedding: end_chunk_slots. Further slack stays on the middle stages'
    # count (conservative).
    only = p == 1
    # ZB-V and DualPipeV place their two chunks per rank in a V: the first rank holds the first
    # and the last virtual stage, so the embedding, the head and both spare slots; the last
    # rank is a middle one
    vshape = np.isin(np.asarray(plan.schedule_code), [s.code for s in V_SCHEDULES]) & ~only
    ends = only | vshape
    slack = np.where(only, 0.0, p * v * np.ceil(model.num_layers / (p * v)) - model.num_layers)
    # MoE: per-layer quantities are averages over the critical stage's layers, a share
    # w_moe of which are MoE layers (moe.py) and w_dense have the dense MLP
    w_moe = moe_layers_on_stage(model, L_s) / L_s
    w_dense = 1.0 - w_moe
    k_rc = np.where(rc == Recompute.FIRST_K.code, _f(plan.recompute_num_layers), 0.0)
    dense_layer_params = (model.attn_params_per_layer + model.norm_params_per_layer
                          + w_dense * model.mlp_params_per_layer + w_moe * model.moe_dense_params_per_moe_layer)
    ep_etp = _f(plan.ep) * _f(plan.etp)
    # routed experts: this rank's shard, replicated over the expert data-parallel group EDP
    expert_params = w_moe * model.expert_params_per_moe_layer / ep_etp
    off_last, off_first = end_chunk_slots(model, L_s / v, slack)
    L_last = np.where(vshape, L_s, L_s - off_last)
    L_first = L_s - np.where(vshape, off_last + off_first, off_first)
    # multi-token prediction: the D modules sit with the head (DeepSeek-V3 report Sec. 2.2;
    # Megatron-Core builds them on the last pipeline stage), their routed experts sharded like
    # a layer's; their input embedding is the main one, which a separate last stage keeps a copy
    # of, as of a tied table
    mtp_dense = model.mtp_layers * model.mtp_dense_params_per_module
    mtp_experts = model.mtp_layers * model.mtp_expert_params_per_module / ep_etp
    params_stage_first = (L_first * dense_layer_params + model.embedding_params
                          + np.where(ends, model.lm_head_params + model.hidden_size + mtp_dense, 0.0)) / t
    # a tied table is on the last stage too when the stages differ: Megatron keeps a copy for
    # the output layer and all-reduces the two gradients (shared_embedding), paraplan run unties it
    params_stage_last = np.where(vshape, L_last * dense_layer_params,
                                 L_last * dense_layer_params + model.lm_head_params + model.hidden_size + mtp_dense
                                 + np.where(only | model.tied_embeddings | (model.mtp_layers > 0),
                                            model.embedding_params, 0.0)) / t
    S = _f(plan.dp_shard) * c
    edp = t * c * d / ep_etp
    dp_outermost = (np.asarray(plan.rank_order_code) == RankOrder.TP_CP_PP_DP.code) & (p > 1)
    dp_outer = np.where(dp_outermost, t * c * p, t * c)
    S_e = edp * _f(plan.dp_shard) / d  # the experts' shard group: EDP within one HSDP replica
    fp32_params = np.asarray(plan.fp32_params, dtype=bool) | wide
    grad_reduce_fp32 = np.asarray(plan.grad_reduce_fp32, dtype=bool) | wide
    sharded = zc >= ZeroStage.OPTIMIZER.code
    fsdp2 = np.asarray(plan.fsdp2_copies, dtype=bool) & (d * c > 1)
    # weights cast by torch.autocast: fp32 parameters without FSDP (whose policy casts them
    # itself), in a 16-bit workload (a 32-bit one and fp32 shards have nothing to cache)
    casts = np.asarray(plan.autocast, dtype=bool) & ~fp32_params & ~fsdp2
    return Layout(
        precision=prec, act_bytes=ab, fp32_params=fp32_params, casts_gathered=fp32_params & (not wide),
        t=t, p=p, d=d, c=c, v=v, m=np.floor(workload.global_batch_size / (d * b)), T=b * workload.seq_len / c,
        sp=sp, sp_div=np.where(sp, t, 1.0), rc=rc, zc=zc, L_s=L_s, L_first=L_first, L_last=L_last, only=only,
        slack=slack, vshape=vshape, ends=ends,
        w_moe=w_moe, w_dense=w_dense, k_rc=k_rc, rc_layers=np.where(rc == Recompute.FULL.code, L_s, k_rc),
        S=S, R=d / _f(plan.dp_shard), edp=edp, S_e=S_e,
        # expert groups re-slice the stage's ranks in order: EDP members ep·etp folded ranks
        # apart, dp_outer/(t·c) real ranks per folded one beyond a replica (with data
        # parallelism outermost EP×ETP = TP×CP, plan/space.py ep_rank_order: dp_outer apart)
        e_stride=ep_etp * dp_outer / (t * c), dp_outer=dp_outer, dp_block=np.where(dp_outermost, c, c * d),
        pp_stride=np.where(dp_outermost, t * c, t * c * d),
        dense_layer_params=dense_layer_params, layer_params=dense_layer_params / t, expert_params=expert_params,
        params_stage_first=params_stage_first, params_stage_last=params_stage_last, mtp_experts=mtp_experts,
        params_stage=np.maximum(params_stage_first, params_stage_last),
        expert_stage=L_s * expert_params,  # the same on every stage (0 for a dense model)
        expert_head=(np.maximum(L_s * expert_params, np.where(ends, L_first, L_last) * expert_params + mtp_experts)
                     if model.mtp_layers else L_s * expert_params),
        is_z3=zc == ZeroStage.PARAMETERS.code, is_z2=zc == ZeroStage.GRADIENTS.code,
        fsdp2=fsdp2, fsdp2_pp=fsdp2 & (p > 1), autocast_casts=casts,
        gather_bytes=np.where(fp32_params, mem.MASTER_BYTES, mem.WEIGHT_BYTES),
        reduce_bytes=np.where(grad_reduce_fp32, mem.GRAD_BYTES, mem.WEIGHT_BYTES),
        shard=np.where(sharded, S, 1.0), shard_e=np.where(sharded, S_e, 1.0),
        offload=np.asarray(plan.offload_optimizer, dtype=bool))


def plan_memory(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan):
    """(MemoryBreakdown, host bytes) of a plan or batch, without its time: what the search
    checks before it times only the plans that fit. evaluate() reports the same."""
    lay = layout(model, workload, plan)
    moe = moe_activation_bytes(model, workload, plan, lay.T, lay.t, lay.precision) if model.is_moe else (0.0, 0.0)
    return _memory(model, cluster, workload, plan, lay, moe)


def _memory(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, lay: Layout, moe_activations):
    """Memory on the worst pipeline stage; `moe_activations`: an MoE layer's stored bytes
    and the part of them its activation function's outputs are (moe.py)."""
    gpu = cluster.gpu
    s, h = workload.seq_len, model.hidden_size
    prec, ab, rc, zc, T, m, t, p = lay.precision, lay.act_bytes, lay.rc, lay.zc, lay.T, lay.m, lay.t, lay.p
    sp_div, L_s, L_first, L_last, only = lay.sp_div, lay.L_s, lay.L_first, lay.L_last, lay.only
    ends = lay.ends
    w_moe, w_dense, k_rc, S, S_e = lay.w_moe, lay.w_dense, lay.k_rc, lay.S, lay.S_e
    is_z3, offload, shard, shard_e = lay.is_z3, lay.offload, lay.shard, lay.shard_e
    expert_stage, dense_layer_params = lay.expert_stage, lay.dense_layer_params
    layer_params, expert_params, gather_bytes = lay.layer_params, lay.expert_params, lay.gather_bytes
    params_stage_first, params_stage_last = lay.params_stage_first, lay.params_stage_last
    logits_el = T * model.vocab_size / t
    moe_act, moe_act_fn_out = moe_activations
    stored, none_act, sel_act = mem.layer_activation_bytes(
        model, plan, s, recompute_code=rc, mlp_weight=w_dense, extra_bytes=w_moe * moe_act,
        modules_extra_saving=w_moe * moe_act_fn_out, precision=prec)
    # micro-batches in flight at each stage's peak, as the schedule simulator counts them
    # (SimResult.peak_inflight): the first stage, the second (the fullest middle one) and the last
    inflight = mem.inflight_microbatches(plan, m)
    inflight_mid = mem.inflight_microbatches(plan, m, 1.0)
    inflight_last = mem.inflight_microbatches(plan, m, p - 1.0)
    # a layer's input as kept: the residual stream, fp32 under autocast
    residual_bytes = mem.residual_bytes_per_element(ab, plan.autocast)
    per_layer_stored = np.where(rc == Recompute.FIRST_K.code,
                                (k_rc * residual_bytes * T * h / sp_div + (L_s - k_rc) * none_act) / L_s,
                                stored)
    logits = mem.logits_bytes_per_element(prec, plan.fused_kernels) * logits_el
    # a recomputed layer's working set: on the stage with the loss, only what exceeds the
    # logits, which the backward has freed before it re-runs the last layer
    recompute_working = np.where((rc == Recompute.FULL.code) | (rc == Recompute.FIRST_K.code), sel_act, 0.0)
    working_past_loss = np.maximum(recompute_working - logits, 0.0)
    acts_first = (inflight * L_first * per_layer_stored + np.where(ends, working_past_loss, recompute_working)
                  + inflight * residual_bytes * T * h / sp_div)
    # (under ZB-V the last rank holds no loss: its recomputed layer's working set is whole)
    acts_last = inflight_last * L_last * per_layer_stored + np.where(lay.vshape, recompute_working, working_past_loss)
    n_first, n_last = bf16_layers_on_end_stages(model, lay)
    if np.any(n_first + n_last):
        extra = bf16_layer_extra_bytes(model, workload, plan, lay, stored)
        acts_first = acts_first + inflight * n_first * extra
        acts_last = acts_last + inflight_last * n_last * extra
    # multi-token prediction, on the head's rank: per module its block's activations (priced as
    # the stage's average layer, recomputed under full, selective and module recomputation as
    # Megatron-Core's uniform method does, kept whole under first-k, whose block method leaves
    # it out) and what its projection keeps, the normed hidden state and next-token embedding
    # (2h, for M_k's weight gradient) and the two norms' inputs (2h)
    D = model.mtp_layers
    if D:
        mtp_acts = D * (np.where(rc == Recompute.FIRST_K.code, none_act, stored) + 4.0 * ab * T * h / sp_div)
        acts_first = acts_first + inflight * np.where(ends, mtp_acts, 0.0)
        acts_last = acts_last + inflight_last * np.where(lay.vshape, 0.0, mtp_acts)

    # weights are kept in the dtype they are gathered in. fp32 parameter shards (FSDP with
    # autocast, Composer "DEFAULT"; every 32-bit workload): the shard is the fp32 master copy,
    # so the optimizer keeps only the two moments: 16 bytes/param, not 18
    w_bytes = gather_bytes
    o_bytes = np.where(lay.fp32_params, mem.OPTIMIZER_BYTES - mem.MASTER_BYTES, mem.OPTIMIZER_BYTES)

    # FSDP2 under torch's pipeline schedules (lay.fsdp2_pp) keeps each backward's gathered
    # parameters and accumulates unsharded gradients in the reduce dtype until the step's
    # reduction: the stage's whole gathered weights and gradients, whatever the ZeRO stage says
    z3_sharded = is_z3 & ~lay.fsdp2_pp
    g_sharded = (zc >= ZeroStage.GRADIENTS.code) & ~lay.fsdp2_pp

    # under autocast the 16-bit weights are the cached casts (lay.autocast_casts), not of the
    # input embedding (F.embedding runs in fp32; a tied table is cast for the head on the
    # stage that has both). The cache lives as long as the autocast region, which holds the
    # loss: at the end of the forward every layer's cast is alive beside the logits (about
    # 10 B each: 16-bit, upcast, log-softmax); the backward then frees the casts of layers a
    # full or first-k recomputation re-runs (re-cast one at a time) while the loss's backward
    # holds 12 B per logit. Without PP the peak is the larger of the two: the casts of those
    # layers count only beyond 2 B per logit. paraplan run keeps one region for a pipelined
    # step (torch's schedule runs every micro-batch inside it): there they all stay.
    cast_cache = lay.autocast_casts
    uncast_first = uncast_last = 0.0  # (the search's batches never run under autocast)
    if np.any(cast_cache):
        table = model.embedding_params / t * np.where(model.tied_embeddings & only, 0.0, 1.0)
        recast = np.maximum(np.minimum(lay.rc_layers, L_first) - 1.0, 0.0) * dense_layer_params / t
        freed = np.where(only, np.minimum(recast, (mem.EAGER_LOSS_BYTES - mem.EAGER_LOSS_FWD_BYTES)
                                          / mem.WEIGHT_BYTES * logits_el), 0.0)
        uncast_first = np.where(cast_cache, table + freed, 0.0)
        uncast_last = np.where(cast_cache & only, table + freed, 0.0)

    def states(params, embedding=0.0, experts=expert_stage):
        w = w_bytes * ((params - embedding) / np.where(z3_sharded, S, 1.0)
                       + experts / np.where(z3_sharded, S_e, 1.0))
        g = np.where(lay.fsdp2_pp & (zc >= ZeroStage.GRADIENTS.code), lay.reduce_bytes, mem.GRAD_BYTES) * (
            params / np.where(g_sharded, S, 1.0) + experts / np.where(g_sharded, S_e, 1.0))
        o = np.where(offload, 0.0, o_bytes * (params / shard + experts / shard_e))
        # offloaded: the optimizer states and an fp32 copy of the gradient shard in host DRAM
        host = np.where(offload, (o_bytes + mem.GRAD_BYTES) * (params / shard + experts / shard_e), 0.0)
        return w, g, o, host

    w1, g1, o1, host1 = states(params_stage_first, uncast_first, np.where(ends, lay.expert_head, expert_stage))
    wl, gl, ol, hostl = states(params_stage_last, uncast_last, np.where(lay.vshape, expert_stage, lay.expert_head))
    # the second stage: all L_s layers and its own micro-batches in flight (as many as the
    # first's under GPipe, breadth-first and ZB-H1, fewer under 1F1B); it outgrows the first
    # when the embedding took one of the first stage's layer slots
    wm, gm, om, hostm = states(L_s * dense_layer_params / t)
    acts_mid = inflight_mid * L_s * per_layer_stored + recompute_working
    has_mid = p > 2
    host_bytes = np.maximum(np.maximum(host1, hostl), np.where(has_mid, hostm, 0.0))
    # the loss state: on the first rank where it holds the head (one stage, or ZB-V's V)
    if D:  # each MTP module's logits beside the head's
        logits = logits * (1.0 + D)
    lo1 = np.where(ends, mem.inflight_logits(plan, m) * logits, 0.0)
    # Gradients allocated by the backward itself (eager torch without DDP's or Megatron's
    # preallocated buffers: paraplan run and torchtitan on one GPU, under autocast), in a
    # step of one micro-batch: at the loss's backward only the head's gradient exists; by
    # the end of the backward all do and the activations are gone. The peak is the larger
    # (an H100 run of one micro-batch measured 35.9 GiB where the static sum said 40.4).
    lazy = lay.autocast_casts & (lay.d * lay.c == 1) & (m <= 1.0) & only
    # the last stage keeps each micro-batch's loss state until that micro-batch's backward:
    # several at once where the schedule runs every forward first (GPipe, breadth-first)
    lol = np.where(lay.vshape, 0.0, mem.inflight_logits(plan, m) * logits)
    if np.any(lazy):
        head_grad = mem.GRAD_BYTES * (model.output_weight_params / t + h)

        def peak(g, acts, lo):  # (the one stage seen as first and as last alike)
            at_end = g > acts + lo + head_grad
            return (np.where(lazy & ~at_end, head_grad, g), np.where(lazy & at_end, 0.0, acts),
                    np.where(lazy & at_end, 0.0, lo))
        g1, acts_first, lo1 = peak(g1, acts_first, lo1)
        gl, acts_last, lol = peak(gl, acts_last, lol)
    tot1 = w1 + g1 + o1 + acts_first + lo1
    totl = wl + gl + ol + acts_last + lol
    totm = np.where(has_mid, wm + gm + om + acts_mid, 0.0)
    worst = np.where((totm > tot1) & (totm > totl), 2, np.where(tot1 >= totl, 0, 1))
    buffers = np.where(is_z3, 2.0 * (layer_params + expert_params) * (gather_bytes + mem.WEIGHT_BYTES * lay.casts_gathered
                                                       + mem.GRAD_BYTES), 0.0)
    # FSDP2 under pipeline schedules: the gathered weights and the accumulated gradients are
    # the stage's own (counted above); in flight only one layer's gradient before it is added in
    buffers = np.where(lay.fsdp2_pp & (zc >= ZeroStage.GRADIENTS.code), (layer_params + expert_params) * gather_bytes,
                       buffers)
    pick = lambda a, b_, c_: np.where(worst == 0, a, np.where(worst == 1, b_, c_))  # noqa: E731
    weights, grads, opt = pick(w1, wl, wm), pick(g1, gl, gm), pick(o1, ol, om)
    acts, lg = pick(acts_first, acts_last, acts_mid), pick(lo1, lol, 0.0)
    alloc = weights + grads + opt + acts + lg + buffers
    memory = MemoryBreakdown(
        weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=opt, activations_bytes=acts,
        logits_bytes=lg, comm_buffers_bytes=buffers,
        fragmentation_bytes=gpu.allocator_fragmentation * alloc,
        reserved_bytes=np.full(np.shape(alloc), gpu.reserved_bytes) if np.ndim(alloc) else gpu.reserved_bytes,
    )
    return memory, host_bytes


# Of an eager layer's host time, the share spent issuing its forward: the backward issues about
# two kernels per forward kernel (autograd's input- and weight-gradient ops), so a third
HOST_FORWARD_SHARE = 1.0 / 3.0


def host_idle_s(n, gpu_s, host_s, slack_s):
    """(GPU idle time, slack after) of n like kernels-groups issued by a host that runs ahead of
    the GPU through a FIFO stream: each takes `host_s` to issue and `gpu_s` to run, and the
    GPU starts with `slack_s` of queued work. Issuing one: the GPU waits max(host − slack, 0),
    then slack' = max(slack − host, 0) + gpu. Closed form over the n (vectorized): GPU-bound
    groups wait at most at the first; host-bound ones drain the slack by host − gpu each,
    then every one waits host − gpu."""
    n, g, h, s0 = (np.asarray(x, dtype=float) for x in (n, gpu_s, host_s, slack_s))
    d = h - g
    # GPU-bound (g >= h): only the first may wait
    idle_gb = np.where(n > 0, np.maximum(h - s0, 0.0), 0.0)
    end_gb = np.where(n > 0, np.maximum(s0 - h, 0.0) + g + np.maximum(n - 1.0, 0.0) * (g - h), s0)
    # host-bound (g < h): k groups run from the slack before the first wait
    dd = np.where(d > 0, d, 1.0)
    k = np.where(s0 >= h, np.floor((s0 - h) / dd) + 1.0, 0.0)
    waits = k < n
    s_k = s0 - k * d
    idle_hb = np.where(waits, (h - s_k) + np.maximum(n - k - 1.0, 0.0) * d, 0.0)
    end_hb = np.where(waits, g, s0 - n * d)
    host_bound = d > 0
    return np.where(host_bound, idle_hb, idle_gb), np.where(host_bound, end_hb, end_gb)


def split_host_s(coef, layers):
    """Host time of one pass of torch.distributed.pipelining's split backward over a chunk of
    `layers` layers: c0 + c1·L + c2·L² for coef = (c0, c1, c2) (GPUSpec zb_input_host_s,
    zb_weight_host_s; calibrate/profile.py split_host_fit). Vectorized."""
    return coef[0] + coef[1] * layers + coef[2] * layers * layers


def eager_host_wait(gpu, plan, layers, layer_fwd_s, layer_bwd_s, extra_s, num_microbatches, recomputed=0.0,
                    layer_wgrad_s=0.0):
    """(forward, backward, W pass) time per micro-batch a stage's GPU waits for its host; the
    backward's includes the W pass's. Eager PyTorch issues each kernel from Python ahead of
    the GPU and spends gpu.eager_layer_host_s on one layer's forward and backward (paraplan
    calibrate: a layer at negligible size; a third of it in the forward); the stage's
    micro-batch is the queue [layers × forward][the head, the loss and the embedding:
    `extra_s`, next to no host time][layers × backward] (host_idle_s).
    A backward layer also re-issues its forward where it is recomputed whole: `recomputed`,
    the stage's share of layers that full or first-k recomputation re-runs.
    Under the schedules that split the backward (torch.distributed.pipelining's zb, zbv,
    dualpipev), where the profile measured the split (gpu.zb_input_host_s, zb_weight_host_s),
    the backward is [layers × B][one W pass per chunk of layers/v layers], each pass's host
    time split_host_s of the chunk's layers and W's GPU time `layer_wgrad_s` per layer.
    The first micro-batch starts on an idle GPU; the rest start with what the one before left
    queued (its state after one micro-batch stands for the steady state). Megatron's fused
    layers and compiled blocks issue far fewer kernels: not bound here. Vectorized."""
    host = gpu.eager_layer_host_s
    if host <= 0.0:
        return 0.0, 0.0, 0.0
    eager = ~np.asarray(plan.fused_kernels, dtype=bool) & ~mem.compiled_blocks(plan)
    hf = HOST_FORWARD_SHARE * host
    hr = hf * np.asarray(recomputed, dtype=float)
    hb = (1.0 - HOST_FORWARD_SHARE) * host + hr
    split = np.zeros(np.shape(eager), dtype=bool)
    if any(gpu.zb_input_host_s) or any(gpu.zb_weight_host_s):
        split = np.isin(np.asarray(plan.schedule_code), [s.code for s in SPLIT_BACKWARD])
    chunks = np.asarray(plan.vp, dtype=float)
    chunk_layers = np.maximum(np.asarray(layers, dtype=float) / chunks, 1.0)
    hb_split = split_host_s(gpu.zb_input_host_s, chunk_layers) / chunk_layers + hr
    hw_split = split_host_s(gpu.zb_weight_host_s, chunk_layers)
    wg = np.asarray(layer_wgrad_s, dtype=float)

    def one_microbatch(slack):
        idle_f, slack = host_idle_s(layers, layer_fwd_s, hf, slack)
        slack = slack + extra_s
        idle_b, after_b = host_idle_s(layers, layer_bwd_s, hb, slack)
        # split: B passes issue what is left without the weight-gradient GEMMs, then W passes
        idle_bs, after_bs = host_idle_s(layers, layer_bwd_s - wg, hb_split, slack)
        idle_w, after_w = host_idle_s(chunks, chunk_layers * wg, hw_split, after_bs)
        return (idle_f, np.where(split, idle_bs, idle_b), np.where(split, idle_w, 0.0),
                np.where(split, after_w, after_b))
    f1, b1, w1, after = one_microbatch(0.0)
    f2, b2, w2, _ = one_microbatch(after)
    m = np.maximum(np.asarray(num_microbatches, dtype=float), 1.0)
    avg = lambda first, rest: np.where(eager, (first + (m - 1.0) * rest) / m, 0.0)  # noqa: E731
    w = avg(w1, w2)
    return avg(f1, f2), avg(b1, b2) + w, w


def layer_gemms_s(gpu: GPUSpec, model: ModelSpec, T, t, prec: Precision, fused):
    """(QKV, MLP up, out-projection, MLP down) GEMM times of one layer's forward (vectorized).

    QKV as one GEMM of the projections' total width (MLA: its low-rank chain, same FLOPs),
    and a gated MLP's gate and up as one GEMM of 2f (Megatron-Core's fused linear layers);
    separate wq, wk, wv and w1, w3 where the engine keeps them apart (plan.fused_kernels:
    torchtitan's Llama, paraplan run), each GEMM at the efficiency of its own size."""
    h, f, qd, kvd = model.hidden_size, model.ffn_hidden_size, model.q_dim, model.kv_dim
    g_qkv = gemm_time_s(gpu, T, model.qkv_params_per_layer / h / t, h, prec)
    g_up = up_projection_time_s(gpu, T, f / t, h, prec, model.num_mlp_matrices - 1, fused)
    if not np.all(fused) and not model.is_mla:  # (MLA's low-rank chain either way)
        g_qkv = np.where(fused, g_qkv, gemm_time_s(gpu, T, qd / t, h, prec) + 2.0 * gemm_time_s(gpu, T, kvd / t, h, prec))
    g_out = gemm_time_s(gpu, T, h, qd / t, prec)
    g_down = gemm_time_s(gpu, T, h, f / t, prec)
    return g_qkv, g_up, g_out, g_down


def bf16_layers_on_end_stages(model: ModelSpec, lay: Layout):
    """Layers kept in BF16 (NVFP4's first and last, low_precision.bf16_end_layers) on the first
    and on the last stage (vectorized): the first rank of a V holds both, and one stage both."""
    n_start, n_end = bf16_end_layers(lay.precision, model.num_layers)
    if not n_start + n_end:
        return 0.0, 0.0
    first = n_start + np.where(lay.ends, n_end, 0.0)
    return first, np.where(lay.vshape, 0.0, np.where(lay.only, n_start, 0.0) + n_end)


def bf16_layer_extra_bytes(model: ModelSpec, workload: Workload, plan, lay: Layout, stored):
    """Activation bytes one layer kept in BF16 (NVFP4's first and last) saves beyond a layer of
    the workload's low precision, whose saved bytes are `stored`: 16-bit GEMM inputs (under
    first-k recomputation priced as kept: conservative)."""
    moe16 = (moe_activation_bytes(model, workload, plan, lay.T, lay.t, Precision.BF16) if model.is_moe
             else (0.0, 0.0))
    stored16 = mem.layer_activation_bytes(
        model, plan, workload.seq_len, recompute_code=lay.rc, mlp_weight=lay.w_dense, extra_bytes=lay.w_moe * moe16[0],
        modules_extra_saving=lay.w_moe * moe16[1], precision=Precision.BF16)[0]
    return stored16 - stored


def bf16_layer_extra_s(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, lay: Layout,
                       gemms_fwd, cast, mc):
    """(forward, backward) time one layer kept in BF16 takes beyond a layer of the workload's
    low precision (NVFP4's first and last layers, low_precision.bf16_end_layers): its GEMMs (and
    an MoE layer's experts) at the BF16 rate, its inputs not quantized; recomputed at that rate
    under full recomputation. `gemms_fwd`, `cast`, `mc`: the low-precision layer's."""
    gpu, bf16 = cluster.gpu, Precision.BF16
    g_qkv, g_up, g_out, g_down = layer_gemms_s(gpu, model, lay.T, lay.t, bf16,
                                               np.asarray(plan.fused_kernels, dtype=bool))
    gemms = g_qkv + g_out + lay.w_dense * (g_up + g_down) - gemms_fwd
    fwd, bwd = gemms - cast, 2.0 * (gemms - cast)
    if mc:
        mc16 = moe_layer_costs(model, cluster, workload, plan, lay.T, lay.t, bf16)
        fwd = fwd + lay.w_moe * (mc16.fwd_compute_s - mc.fwd_compute_s)
        bwd = bwd + lay.w_moe * (mc16.bwd_compute_s - mc.bwd_compute_s)
    return fwd, bwd + np.where(lay.rc == Recompute.FULL.code, fwd, 0.0)


def evaluate(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, *, memory=None) -> PlanCosts:
    """Time, memory and the rest for a plan or a batch; `memory`: its (MemoryBreakdown, host
    bytes) from plan_memory when the caller has them already (the search)."""
    gpu = cluster.gpu
    lay = layout(model, workload, plan)
    prec, ab = lay.precision, lay.act_bytes
    act_prec = attention_precision(prec)
    s = workload.seq_len
    h, f, V = model.hidden_size, model.ffn_hidden_size, model.vocab_size
    qd = model.q_dim
    t, p, d, c, v, m, T = lay.t, lay.p, lay.d, lay.c, lay.v, lay.m, lay.T
    sp, sp_div = lay.sp, lay.sp_div
    akc = np.asarray(plan.attention_code)
    flash = akc != AttentionKernel.UNFUSED.code
    rc, zc = lay.rc, lay.zc
    sc = np.asarray(plan.schedule_code)
    L_s, L_first, L_last, only = lay.L_s, lay.L_first, lay.L_last, lay.only
    w_moe, w_dense = lay.w_moe, lay.w_dense
    zeros = 0.0 * L_s
    mc = moe_layer_costs(model, cluster, workload, plan, T, t, prec) if model.is_moe else None
    moe_fwd, moe_bwd, moe_wgrad = (w_moe * mc.fwd_compute_s, w_moe * mc.bwd_compute_s, w_moe * mc.wgrad_s) \
        if mc else (zeros, zeros, zeros)
    a2a_fwd, a2a_bwd = (w_moe * mc.a2a_fwd_s, w_moe * mc.a2a_bwd_s) if mc else (zeros, zeros)
    a2a_fwd_exp, a2a_bwd_exp = (w_moe * mc.a2a_fwd_exposed_s, w_moe * mc.a2a_bwd_exposed_s) if mc else (zeros, zeros)
    has_shared = 1.0 if model.shared_expert_ffn_hidden_size else 0.0

    # ---------------- compute per layer, per micro-batch ----------------
    lf = layer_forward_flops(model, T, s, causal=True)
    # fused QKV and gate/up GEMMs, or separate ones (plan.fused_kernels; layer_gemms_s)
    fused = np.asarray(plan.fused_kernels, dtype=bool)
    # a layer's weight matrices as the eager engines keep them: wq, wk, wv, wo and the MLP's
    # (the tensors their per-tensor kernels -- casts, gradient adds -- run over)
    layer_matrices = 4.0 + model.num_mlp_matrices
    g_qkv, g_up, g_out, g_down = layer_gemms_s(gpu, model, T, t, prec, fused)
    gemms_fwd = g_qkv + g_out + w_dense * (g_up + g_down)
    # FlashAttention-2 runs a head of 80 or 112 in its 96- or 128-wide kernel (flops.py)
    attn_flops_flash = lf.attn_core / t * np.where(akc == AttentionKernel.FLASH2.code, flash2_padding(model), 1.0)
    attn_flash_fwd = attention_time_s(gpu, attn_flops_flash, act_prec, akc)
    # Unfused attention (2021–22 Megatron): batched GEMMs over the full s×s, then scale,
    # mask, softmax and dropout over the a·s score elements per token: four passes of the
    # activation width and a 1-byte dropout mask (9 bytes per element at 16 bits).
    attn_flops_full = attn_flops_flash / CAUSAL_FRACTION
    attn_unfused_fwd = (attn_flops_full / (gpu.peak(act_prec) * gpu.sustained_compute_ratio
                                           * gpu.gemm_efficiency.at(attn_flops_full))
                        + elementwise_time_s(gpu, T * model.num_heads / t * s * (4.0 * ab + 1.0), 4))
    attn_fwd = np.where(flash, attn_flash_fwd, attn_unfused_fwd)
    attn_bwd = np.where(flash, attention_time_s(gpu, attn_flops_flash * FLASH_BWD_OVER_FWD, act_prec, akc) - gpu.kernel_launch_overhead_s,
                        2.0 * attn_unfused_fwd)
    ew_bytes = T * elementwise_bytes_per_token(model, act_bytes=ab, sp_div=sp_div, t=t, w_dense=w_dense)
    # Transformer Engine casts each GEMM input to FP8 (read 2 B, write 1 B) or NVFP4
    # (low_precision.quantize_bytes_per_element): streaming kernels
    cast_bytes = (quantize_bytes_per_element(prec) * T * (2.0 * h / sp_div + qd / t + w_dense * f / t)
                  if prec in LOW_PRECISIONS else 0.0)
    cast = memory_bound_time_s(gpu, cast_bytes, 0)
    # an eager block under torch.compile (plan.compiled): inductor's fused element-wise kernels
    # take the GPU's measured compiled_elementwise_ratio of the eager ones' time
    ew_scale = np.where(mem.compiled_blocks(plan), gpu.compiled_elementwise_ratio, 1.0)
    ew_fwd = ew_scale * elementwise_time_s(gpu, ew_bytes, EW_FWD_KERNELS) + cast
    ew_bwd = ew_scale * elementwise_time_s(gpu, 2.0 * ew_bytes, EW_BWD_KERNELS) + 2.0 * cast
    # torch.autocast with fp32 parameters (plan.autocast): the weights cast every micro-batch,
    # their gradients cast back and accumulated in fp32 (on the H100 the profiler showed these
    # casts and adds at about a seventh of a Llama 3 8B-shaped step: calibration/h100_2026-11-22)
    autocast = lay.autocast_casts
    grad_casts = 0.0
    if np.any(autocast):
        # (paraplan run holds one autocast region over a pipelined step: each weight cast once a step)
        casts_per_mb = np.where(p > 1, 1.0 / np.maximum(m, 1.0), 1.0)
        ew_fwd = ew_fwd + np.where(autocast, casts_per_mb * autocast_weight_cast_s(gpu, lay.layer_params,
                                                                                   layer_matrices), 0.0)
        grad_casts = np.where(autocast, autocast_grad_s(gpu, lay.layer_params, layer_matrices, m), 0.0)
        ew_bwd = ew_bwd + grad_casts
    layer_fwd = gemms_fwd + attn_fwd + ew_fwd + moe_fwd
    layer_bwd = 2.0 * gemms_fwd + attn_bwd + ew_bwd + moe_bwd
    # the weight-gradient GEMMs = one forward's worth, and what lies on the weights' side of
    # them (autocast's gradient casts and fp32 accumulation: a split backward's W pass runs them)
    wgrad = gemms_fwd + moe_wgrad + grad_casts

    # ---------------- TP communication per layer ----------------
    act_bytes_full = ab * T * h  # one [T, h] activation, the TP buffer
    ag = collective_time_s(cluster, Collective.ALL_GATHER, act_bytes_full, t, 1)
    rs = collective_time_s(cluster, Collective.REDUCE_SCATTER, act_bytes_full, t, 1)
    ar = collective_time_s(cluster, Collective.ALL_REDUCE, act_bytes_full, t, 1)
    # one gather/reduce pair around attention and one around a dense MLP (or an MoE layer's
    # shared experts; its routed experts exchange tokens by all-to-all instead)
    n_blk = 1.0 + w_dense + w_moe * has_shared
    tp_fwd = np.where(sp, n_blk * (ag + rs), n_blk * ar)
    # without SP each separate column-parallel projection all-reduces its own input gradient
    # (DTensor ColwiseParallel with a replicated input): wq, wk, wv and w1, w3 where Megatron's
    # fused QKV and gate/up reduce once each (7 all-reduces per layer against 4, counted in
    # paraplan run with torch's CommDebugMode); with SP one reduce-scatter per block either way
    n_mlp_blk = w_dense + w_moe * has_shared
    extra_col = np.where(~fused & ~sp, np.where(model.is_mla, 0.0, 2.0) + n_mlp_blk * (model.num_mlp_matrices - 2.0),
                         0.0)
    tp_bwd = tp_fwd + extra_col * ar
    tpov = np.asarray(plan.tp_overlap, dtype=bool)
    tp_fwd_exp = np.where(tpov, np.maximum(tp_fwd - gemms_fwd, tp_fwd / t), tp_fwd)
    # Backward without TP overlap: Megatron runs the input-gradient reduction of each
    # column-parallel layer (QKV, MLP up) asynchronously beside its weight-gradient GEMM
    # (Narayanan et al. SC'21 `--async-tensor-model-parallel-allreduce`; Korthikanti et al. 2022
    # Sec. 4.2.2 for the SP reduce-scatter). With SP the all-gather of the output gradient
    # before each row-parallel layer stays exposed.
    sh_up = mc.shared_up_s if mc else zeros
    col_wgrad = ((1.0, g_qkv), (w_dense, g_up), (w_moe * has_shared, sh_up))
    async_ar = sum(wt * np.maximum(ar - w, 0.0) for wt, w in col_wgrad)
    async_rs = n_blk * ag + sum(wt * np.maximum(rs - w, 0.0) for wt, w in col_wgrad)
    tp_async = np.asarray(plan.tp_async_backward, dtype=bool)
    tp_bwd_exp = np.where(tpov, np.maximum(tp_bwd - 2.0 * gemms_fwd, tp_bwd / t),
                          np.where(tp_async, np.where(sp, async_rs, async_ar + extra_col * ar), tp_bwd))
    # the engine's host time at every TP collective (GPUSpec.tp_collective_overhead_s; 0 in
    # the presets): spent on the issuing host, hidden by nothing
    tp_host = np.where(t > 1, gpu.tp_collective_overhead_s, 0.0)
    tp_host_fwd = tp_collectives_per_pass(sp, n_blk) * tp_host
    tp_host_bwd = tp_host_fwd + extra_col * tp_host
    tp_fwd, tp_bwd = tp_fwd + tp_host_fwd, tp_bwd + tp_host_bwd
    tp_fwd_exp, tp_bwd_exp = tp_fwd_exp + tp_host_fwd, tp_bwd_exp + tp_host_bwd

    # ---------------- CP K/V exchange per layer (CP ranks sit t apart) ----------------
    # this rank's K and V: T tokens × (K + V width)/t (2k·d; MLA its up-projected K and V, a·d_qk + a·d_v)
    kv_bytes = ab * T * model.kv_pair_dim / t
    cpc = np.asarray(plan.cp_comm_type_code)
    # p2p ring (Liu et al. 2023; Megatron-Core's default): c−1 steps, each K/V chunk sent
    # under the previous step's attention kernel; backward passes K/V and returns dK/dV.
    # Every step waits for the ring's slowest hop: the network once the group leaves the node
    # (t·c GPUs > one node), the data-center tier once it leaves the island.
    span = t * c
    ring_stride = np.where(span > cluster.gpus_per_node, cluster.gpus_per_node, t)
    if cluster.gpus_per_island and cluster.dcn is not None:
        ring_stride = np.where(span > cluster.gpus_per_island, cluster.gpus_per_island, ring_stride)
    ring_fwd = (c - 1.0) * p2p_time_s(cluster, kv_bytes, ring_stride)
    ring_fwd_exp = np.maximum(ring_fwd - attn_fwd * (c - 1.0) / c, 0.0)
    ring_bwd_exp = np.maximum(2.0 * ring_fwd - attn_bwd * (c - 1.0) / c, 0.0)
    # all-gather (Llama 3, Dubey et al. 2024 Sec. 3.3.2: "the all-gather communication latency
    # is exposed in the critical path"): gather every rank's K/V before attention (Transformer
    # Engine's AttnFuncWithCPAndKVAllGather, Megatron --cp-comm-type allgather); backward
    # gathers again and reduce-scatters dK/dV. All exposed.
    kv_ag = collective_time_s(cluster, Collective.ALL_GATHER, c * kv_bytes, c, t)
    kv_rs = collective_time_s(cluster, Collective.REDUCE_SCATTER, c * kv_bytes, c, t)
    ag_fwd_exp = kv_ag
    ag_bwd_exp = kv_ag + kv_rs
    # all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023 Sec. 3): Q, K, V from sequence shards
    # to head shards before the kernel, the output back after it; backward the same volumes
    # in reverse. Nothing to hide behind: all exposed. One rank's buffer per all-to-all.
    a2a_qkv = collective_time_s(cluster, Collective.ALL_TO_ALL, ab * T * (qd + model.kv_pair_dim) / t, c, t)
    a2a_out = collective_time_s(cluster, Collective.ALL_TO_ALL, ab * T * qd / t, c, t)
    uly = a2a_qkv + a2a_out
    is_ag = cpc == CPCommType.ALL_GATHER.code
    is_a2a = cpc == CPCommType.A2A.code
    on = c > 1
    cp_fwd = np.where(on, np.where(is_ag, kv_ag, np.where(is_a2a, uly, ring_fwd)), 0.0)
    cp_bwd = np.where(on, np.where(is_ag, kv_ag + kv_rs, np.where(is_a2a, uly, 2.0 * ring_fwd)), 0.0)
    cp_fwd_exp = np.where(on, np.where(is_ag, ag_fwd_exp, np.where(is_a2a, uly, ring_fwd_exp)), 0.0)
    cp_bwd_exp = np.where(on, np.where(is_ag, ag_bwd_exp, np.where(is_a2a, uly, ring_bwd_exp)), 0.0)

    # ---------------- ZeRO-3 / FSDP per-layer traffic ----------------
    S, R, edp, S_e, e_stride = lay.S, lay.R, lay.edp, lay.S_e, lay.e_stride
    layer_params, expert_params = lay.layer_params, lay.expert_params
    is_z3, is_z2 = lay.is_z3, lay.is_z2
    gather_bytes, reduce_bytes = lay.gather_bytes, lay.reduce_bytes
    # the shard group: dp_shard·c ranks, runs of c when data parallelism is outermost
    s_runs = dict(block=np.minimum(lay.dp_block, S), outer_stride=lay.dp_outer)
    fsdp_ag = collective_time_s(cluster, Collective.ALL_GATHER, gather_bytes * layer_params, S, t, **s_runs)
    fsdp_rs = collective_time_s(cluster, Collective.REDUCE_SCATTER, reduce_bytes * layer_params, S, t, **s_runs)
    if mc:
        fsdp_ag = fsdp_ag + collective_time_s(cluster, Collective.ALL_GATHER, gather_bytes * expert_params, S_e, e_stride)
        fsdp_rs = fsdp_rs + collective_time_s(cluster, Collective.REDUCE_SCATTER, reduce_bytes * expert_params, S_e, e_stride)
    # fp32 shards: autocast casts each gathered weight to 16 bits at every use (read 4 B,
    # write 2 B per parameter), once per forward and again in a recomputed forward
    # (a 32-bit workload computes on the gathered weights as they are)
    cast = np.where(lay.casts_gathered & (zc == ZeroStage.PARAMETERS.code),
                    memory_bound_time_s(gpu, (mem.MASTER_BYTES + mem.WEIGHT_BYTES) * (layer_params + expert_params), 4), 0.0)
    layer_fwd = layer_fwd + cast
    # FSDP2 (plan.fsdp2_copies) copies around each of these collectives, streaming kernels
    # priced like the layer's element-wise ones (they write fresh buffers)
    # (not re-run by recomputation: the backward's own gather brings the weights). Host-issued
    # kernels on the layer's critical path: added after the overlap windows below, which
    # they neither widen nor shrink
    f2, f2_pp = lay.fsdp2, lay.fsdp2_pp
    any_f2 = bool(np.any(f2))  # (the search's batches are not on FSDP2 unless an engine says so)
    # per-layer gathers per pass: one at ZeRO-3; FSDP2 under torch's pipeline schedules keeps
    # what a backward gathered (about (m+1)/(2m) at ZeRO-3) and, at ZeRO-1/2, gathers again
    # only the chunks it evicted (ZeRO-1 runs on FSDP2 as ZeRO-2; ZeRO-0's one-rank shards
    # only copy, not counted)
    gathers = np.where(is_z3, 1.0, 0.0)
    regather = f2_pp & (zc >= ZeroStage.OPTIMIZER.code)
    if np.any(regather):
        gathers = np.where(regather, fsdp2_pp_gathers_per_pass(plan, m * np.ones_like(t), is_z3, rows=regather),
                           gathers)
    # per-micro-batch reduction (ZeRO-2/3), except FSDP2 under pipeline schedules: once per step
    mb_reduce = (is_z3 | is_z2) & ~f2_pp
    # gradients accumulated unsharded across micro-batches (ZeRO-0/1, and 2/3 under pipeline
    # schedules): the first cast to the reduce dtype, then one add per micro-batch
    accumulate = f2 & ~mb_reduce & (m > 1)

    def f2_accumulate(params, tensors):
        if not np.any(accumulate):
            return 0.0
        return np.where(accumulate, fsdp2_accumulate_s(gpu, params, tensors, reduce_bytes, gather_bytes, m), 0.0)
    f2_fwd = f2_bwd = 0.0
    if any_f2:
        f2_gather = (fsdp2_gather_copy_s(gpu, gather_bytes * layer_params, S)
                     + (fsdp2_gather_copy_s(gpu, gather_bytes * expert_params, S_e) if mc else 0.0))
        f2_reduce = (fsdp2_reduce_copy_s(gpu, reduce_bytes * layer_params, S)
                     + (fsdp2_reduce_copy_s(gpu, reduce_bytes * expert_params, S_e) if mc else 0.0))
        f2_fwd = np.where(f2, gathers * f2_gather, 0.0)
        # a layer's weights as the FSDP2 engines build them: wq, wk, wv, wo, the MLP's
        # matrices, the norms
        f2_acc = f2_accumulate(layer_params + expert_params, layer_matrices + model.norm_params_per_layer / h)
        f2_bwd = f2_fwd + np.where(f2 & mb_reduce, f2_reduce, 0.0) + f2_acc
    z3_fwd = gathers * fsdp_ag
    z3_bwd = gathers * fsdp_ag + np.where(mb_reduce, fsdp_rs, 0.0)

    # ---------------- recomputation per layer ----------------
    # Module recomputation (Megatron-Core --recompute-modules [core_attn] layernorm moe_act
    # mla_up_proj) re-runs the norms Megatron runs as separate modules (MLA's input norm, an
    # MoE layer's pre-MLP norm: read and write h each), the routed experts' activation
    # function, MLA's up-projections from the latents, and the attention core only when it
    # is unfused (a fused kernel stores no scores; Megatron warns core_attn is then useless).
    d_nope = model.head_dim - model.qk_rope_head_dim
    mla_up = (gemm_time_s(gpu, T, qd / t, model.q_lora_rank, prec) if model.q_lora_rank else zeros) + (
        gemm_time_s(gpu, T, model.num_heads * (d_nope + (model.v_head_dim or model.head_dim)) / t,
                    model.kv_lora_rank, prec) if model.is_mla else zeros)
    norms_recomputed = (1.0 if model.is_mla else 0.0) + w_moe
    modules_fwd = (np.where(flash, 0.0, attn_fwd) + mla_up + (w_moe * mc.act_fn_fwd_s if mc else zeros)
                   + elementwise_time_s(gpu, ab * T * 2.0 * h * norms_recomputed / sp_div, norms_recomputed))
    # Full and first-k re-run whole layers (forward plus its exposed TP and CP); selective
    # re-runs the attention core only. PyTorch's non-reentrant checkpoint stops once every
    # tensor the backward needs exists again: the block's last GEMM (the MLP down-projection,
    # whose input the activation function already produced) and its output reduction are not
    # re-run. The exposed TP/CP of recomputation is reported as TP/CP time, not recompute.
    early = np.asarray(plan.checkpoint_early_stop, dtype=bool)
    rc_layers = lay.rc_layers
    last_gemm = w_dense * g_down + (w_moe * mc.last_gemm_s if mc else zeros)
    rc_compute_stage = (rc_layers * (layer_fwd - np.where(early, last_gemm, 0.0))
                        + np.where(rc == Recompute.SELECTIVE.code, L_s * attn_fwd, 0.0)
                        + np.where(rc == Recompute.MODULES.code, L_s * modules_fwd, 0.0))
    rc_tp_stage = rc_layers * np.where(early, 0.5, 1.0) * tp_fwd_exp
    # the attention core recomputed alone still holds the CP exchange (Transformer Engine's
    # context-parallel attention does its K/V traffic inside the checkpointed kernel)
    rc_attn = np.where(rc == Recompute.SELECTIVE.code, 1.0,
                       np.where((rc == Recompute.MODULES.code) & ~flash, 1.0, 0.0))
    rc_cp_stage = (rc_layers + L_s * rc_attn) * cp_fwd_exp
    # the recomputed dispatch runs inside the backward pass, not under another micro-batch's
    # compute: it stays exposed even with EP overlap. Early stop skips the combine.
    rc_ep_stage = rc_layers * np.where(early, 0.5, 1.0) * a2a_fwd_exp
    rc_stage = rc_compute_stage + rc_tp_stage + rc_cp_stage + rc_ep_stage

    # ---------------- per-layer totals with overlap ----------------
    slow = gpu.overlap_slowdown
    fwd_comp = layer_fwd
    bwd_comp = layer_bwd
    # ZeRO traffic hides behind the whole layer as it runs (compute + its exposed TP/CP), so
    # faster compute can never expose more time than it saves.
    # EP overlap (Megatron-Core --overlap-moe-expert-parallel-comm, after DeepSeek-V3's
    # DualPipe, Sec. 3.2.1): a forward and a backward micro-batch run merged layer by layer,
    # each layer split into attention, dispatch, MLP and combine, and each all-to-all of one
    # runs under a compute block of the other: backward combine under forward attention,
    # forward dispatch under backward MLP, backward dispatch under forward MLP, forward
    # combine under backward attention. Each pair takes the longer of the two, so an
    # all-to-all hides only behind its partner, not behind the whole layer.
    epov = np.asarray(plan.ep_overlap, dtype=bool)
    if mc:
        # an attention block lasts its compute plus the communication its kernels left exposed
        # (the CP exchange, and its share of the TP collectives: one of the n_blk blocks that
        # gather and scatter): the partner all-to-all hides behind that whole block, so a faster
        # kernel that exposes more of those hides as much more of the all-to-all (never less
        # time in all)
        attn_f = g_qkv + g_out + attn_fwd + ew_fwd + cp_fwd_exp + tp_fwd_exp / n_blk
        attn_b = 2.0 * (g_qkv + g_out) + attn_bwd + ew_bwd + cp_bwd_exp + tp_bwd_exp / n_blk
        # dispatch = combine; the MoE blocks hold the shared experts, so the all-to-alls pair
        # whole (not net of the shared-expert overlap, which would count those GEMMs twice)
        half_f, half_b = 0.5 * mc.a2a_fwd_s, 0.5 * mc.a2a_bwd_s
        ov_fwd = np.maximum(half_f - mc.bwd_compute_s, 0.0) + np.maximum(half_f - attn_b, 0.0)
        ov_bwd = np.maximum(half_b - attn_f, 0.0) + np.maximum(half_b - mc.fwd_compute_s, 0.0)
        a2a_fwd_exp = np.where(epov, w_moe * ov_fwd, a2a_fwd_exp)
        a2a_bwd_exp = np.where(epov, w_moe * ov_bwd, a2a_bwd_exp)
    z3_fwd_exp = np.maximum(z3_fwd - (fwd_comp + tp_fwd_exp + cp_fwd_exp + a2a_fwd_exp), 0.0)
    z3_bwd_exp = np.maximum(z3_bwd - (bwd_comp + tp_bwd_exp + cp_bwd_exp + a2a_bwd_exp), 0.0)
    overlapped_per_layer_fwd = ((tp_fwd - tp_fwd_exp) + (cp_fwd - cp_fwd_exp) + (z3_fwd - z3_fwd_exp)
                                + (a2a_fwd - a2a_fwd_exp))
    overlapped_per_layer_bwd = ((tp_bwd - tp_bwd_exp) + (cp_bwd - cp_bwd_exp) + (z3_bwd - z3_bwd_exp)
                                + (a2a_bwd - a2a_bwd_exp))
    slow_fwd = slow * np.minimum(overlapped_per_layer_fwd, fwd_comp)
    slow_bwd = slow * np.minimum(overlapped_per_layer_bwd, bwd_comp)
    layer_fwd_total = fwd_comp + tp_fwd_exp + cp_fwd_exp + a2a_fwd_exp + z3_fwd_exp + slow_fwd + f2_fwd
    layer_bwd_total = bwd_comp + tp_bwd_exp + cp_bwd_exp + a2a_bwd_exp + z3_bwd_exp + slow_bwd + f2_bwd

    # ---------------- stage extras: embedding, LM head + loss ----------------
    emb_fwd = memory_bound_time_s(gpu, 2.0 * ab * T * h, 2)
    # vocab-parallel embedding: forward reduces over TP; under SP its reduce-scatter's
    # backward is an all-gather of the output gradient (without SP the all-reduce's is none)
    emb_tp = np.where(sp, rs, ar) + tp_host
    emb_tp_bwd = np.where(sp, ag + tp_host, 0.0)
    # the head's vocabulary as the engine has it: Megatron pads it to a multiple of 128·TP
    # (--make-vocab-size-divisible-by); an eager model keeps the tokenizer's, and a 16-bit
    # vocabulary of 50,257 misaligns every pass of the head (roofline.rows_aligned)
    lm_aligned = fused | rows_aligned(V / t, ab)
    lm_gemm = gemm_time_s(gpu, T, V / t, h, head_precision(prec), aligned=lm_aligned)
    logits_el = T * V / t
    loss_fwd_b, loss_bwd_b = loss_bytes_per_logit(prec)
    loss_fwd = memory_bound_time_s(gpu, logits_el * loss_fwd_b, LOSS_FWD_KERNELS, gpu.loss_bw_efficiency)
    ce_tp = VOCAB_PARALLEL_CE_ALL_REDUCES * (collective_time_s(cluster, Collective.ALL_REDUCE, mem.MASTER_BYTES * T, t, 1)
                                             + tp_host)
    # the column-parallel head gathers its sequence-parallel input; backward reduce-scatters
    # (SP) or all-reduces (no SP) the input gradient
    lm_fwd = lm_gemm + loss_fwd + np.where(sp, ag + tp_host, 0.0) + ce_tp
    # backward kernels: gradient fill, NLL scatter, log-softmax backward, downcast
    # (asynchronously beside the head's weight-gradient GEMM where the layers do so too)
    head_red = np.where(sp, rs, ar)
    head_red = np.where(tp_async, np.maximum(head_red - lm_gemm, 0.0), head_red)
    lm_bwd = (2.0 * lm_gemm + memory_bound_time_s(gpu, logits_el * loss_bwd_b, LOSS_BWD_KERNELS, gpu.loss_bw_efficiency)
              + head_red + tp_host)
    # multi-token prediction (DeepSeek-V3 report Sec. 2.2): after the head, per module the
    # next token's embedding, the projection M_k (T × 2h -> h/t, column-parallel), one block
    # priced as the stage's average layer (an MoE layer in an MoE model) and the shared head and
    # loss again (without the head's own gradient accumulation, counted once below)
    # (with the vocab-parallel embedding's collectives; the block recomputed as a layer of the
    # stage is under full, selective and module recomputation, not under first-k's block method)
    D = model.mtp_layers
    mtp_fwd = mtp_bwd = 0.0
    if D:
        mtp_proj = gemm_time_s(gpu, T, h / t, 2.0 * h, prec)
        mtp_rc = np.where(rc == Recompute.FIRST_K.code, 0.0, rc_stage / L_s)
        mtp_fwd = D * (emb_fwd + emb_tp + mtp_proj + layer_fwd_total + lm_fwd)
        mtp_bwd = D * (emb_fwd + emb_tp_bwd + 2.0 * mtp_proj + layer_bwd_total + mtp_rc + lm_bwd)
    # first FSDP gather of a pass cannot be prefetched
    z3_first = gathers * fsdp_ag

    # recomputation scales with the stage's layers, except first-k's fixed k per stage
    rc_share = lambda layers: np.where(rc == Recompute.FIRST_K.code, 1.0, layers / L_s)  # noqa: E731

    def host_wait(layers, extra_fwd, extra_bwd):
        # an eager engine's GPU waiting for its host, (forward, backward, W pass) per
        # micro-batch (gpu.eager_layer_host_s; 0 in the presets: nothing computed in the
        # search's batches)
        if gpu.eager_layer_host_s <= 0.0:
            return 0.0, 0.0, 0.0
        per_layer = 1.0 / np.maximum(layers, 1.0)
        return eager_host_wait(gpu, plan, layers, layer_fwd_total,
                               layer_bwd_total + rc_share(layers) * rc_stage * per_layer,
                               extra_fwd + extra_bwd, m,
                               recomputed=np.minimum(rc_share(layers) * rc_layers * per_layer, 1.0),
                               layer_wgrad_s=wgrad)

    def stage(layers, extra_fwd, extra_bwd, wait):
        fwd = layers * layer_fwd_total + extra_fwd + z3_first
        bwd = layers * layer_bwd_total + extra_bwd + rc_share(layers) * rc_stage + z3_first
        return StageTimes(forward_s=fwd + wait[0], backward_s=bwd + wait[1], weight_grad_s=layers * wgrad + wait[2])

    # the embedding's and the head's (with the final norm) gradient accumulation under FSDP2
    emb_acc = f2_accumulate(model.embedding_params / t, 1.0)
    head_acc = f2_accumulate(model.lm_head_params / t + h, 2.0)  # (the final norm is not split by TP)
    if np.any(autocast):
        # the head's weight is cast like the layers' (a tied head casts the embedding table);
        # the embedding's own gradient is fp32 already (F.embedding is not autocast): only
        # accumulated, and a tied table's gradients from both uses land in the one .grad
        tied = model.tied_embeddings
        head_params = model.output_weight_params / t
        lm_fwd = lm_fwd + np.where(autocast, casts_per_mb * autocast_weight_cast_s(gpu, head_params, 1.0), 0.0)
        # (a tied table on one stage gets two gradients, the head's and the embedding's: the
        # first micro-batch adds them into one sum too, so every micro-batch adds, 12 B per
        # parameter, where autocast_grad_s counts the m - 1 accumulations)
        both = np.where(only, memory_bound_time_s(gpu, 12.0 * head_params, 1.0) / np.maximum(m, 1.0),
                        0.0) if tied else 0.0
        head_acc = head_acc + np.where(autocast, autocast_grad_s(gpu, head_params, 1.0, m) + both, 0.0)
        emb_acc = emb_acc + np.where(autocast, autocast_grad_s(gpu, model.embedding_params / t, 1.0, m, cast=False),
                                     0.0)
    emb_bwd_total = emb_fwd + emb_tp_bwd + emb_acc
    lm_bwd = lm_bwd + head_acc
    if D:
        lm_fwd, lm_bwd = lm_fwd + mtp_fwd, lm_bwd + mtp_bwd
    # (layers, forward extra, backward extra) of the first, a middle and the last stage
    # (under ZB-V the first rank holds the embedding and the head, the last rank neither)
    ends, vshape = lay.ends, lay.vshape
    stage_parts = ((L_first, emb_fwd + emb_tp + np.where(ends, lm_fwd, 0.0), emb_bwd_total + np.where(ends, lm_bwd, 0.0)),
                   (L_s, 0.0, 0.0),
                   (L_last, np.where(vshape, 0.0, np.where(only, emb_fwd + emb_tp, 0.0) + lm_fwd),
                    np.where(vshape, 0.0, lm_bwd + np.where(only, emb_bwd_total, 0.0))))
    n_first, n_last = bf16_layers_on_end_stages(model, lay)
    if np.any(n_first + n_last):
        # NVFP4's BF16 first and last layers, on the stages that hold them
        extra_fwd, extra_bwd = bf16_layer_extra_s(model, cluster, workload, plan, lay, gemms_fwd, cast, mc)
        stage_parts = tuple((layers, fwd + n * extra_fwd, bwd + n * extra_bwd)
                            for (layers, fwd, bwd), n in zip(stage_parts, (n_first, 0.0, n_last)))
    stage_waits = [host_wait(*parts) for parts in stage_parts]
    first, middle, last = (stage(*parts, wait) for parts, wait in zip(stage_parts, stage_waits))
    # per layer, for the breakdown: the stage that waits most per layer (the last one's LM head
    # lets its host catch up; a middle stage has nothing to hide its host behind)
    host_wait_layer = tuple(np.maximum.reduce([np.asarray(w[i], dtype=float) / np.maximum(parts[0], 1.0)
                                               for parts, w in zip(stage_parts, stage_waits)]) for i in (0, 1, 2))

    # ---------------- pipeline (closed form; the event simulator re-times it) ----------------
    p2p_bytes = ab * T * h / sp_div
    # consecutive stages sit pp_stride ranks apart (t·c·d with the pipeline outermost, t·c with
    # data parallelism outermost), each a block of t·c ranks of its pipeline: only the sends
    # that leave a node cross the network, and those that leave an island the data-center tier
    # (comm.pipeline_hops_s). One hand-off costs the mean over the p·v − 1 hops of the virtual
    # pipeline: v·(p − 1) sends down it and v − 1 from the last rank back to the first
    # (the slowest of the d pipelines: t·c·p apart with data parallelism outermost, else
    # interleaved inside each stage)
    # (ZB-V's V goes down the ranks and back up: the hops of one loop, each twice; its turn
    # stays on the last rank)
    mean_hop, _, _ = pipeline_hops_s(cluster, p2p_bytes, p, lay.pp_stride, t * c, np.where(vshape, 1.0, v), d,
                                     np.where(lay.dp_outer > t * c, lay.dp_outer, 0.0))
    p2p = np.where(p > 1, mean_hop, 0.0)
    per_mb = [x.forward_s + x.backward_s for x in (first, middle, last)]
    # a middle stage exists from p = 3
    t_max = np.maximum(np.maximum(per_mb[0], np.where(p > 2, per_mb[1], 0.0)), per_mb[2])
    # the critical stage's wait for its host, reported apart from its compute
    wait_first, wait_middle, wait_last = (f + b for f, b, _ in stage_waits)
    crit_wait = np.where(t_max == per_mb[2], wait_last, np.where(t_max == per_mb[0], wait_first, wait_middle))
    t_avg = np.where(only, per_mb[0], (per_mb[0] + per_mb[2] + (p - 2.0) * per_mb[1]) / np.maximum(p, 1.0))
    # (p−1)/v of a micro-batch's time (SC'21 §2.2); a breadth-first loop with fewer
    # micro-batches than stages also waits p−m chunk slots in each of its v−1 later loops,
    # (v(p−m)+m−1)/v (docs/model.md, derived; the simulator reproduces it). Interleaved
    # 1F1B needs m a multiple of p and GPipe/1F1B have v = 1, so only looping BFS gains it.
    bubble_1f1b = ((p - 1.0) + np.maximum(p - m, 0.0) * (v - 1.0)) / v * t_avg
    # ZB-H1 (Qi et al. 2024 Sec. 3.1): (p−1)(T_F + T_B − T_W) with B and W split; with fewer
    # micro-batches than stages the simulated bubble grows by one W pass per micro-batch
    # short of p (derived, docs/model.md; tests/golden/test_bubble_closed_forms.py)
    wg_avg = middle.weight_grad_s  # (with an eager host's wait for its W passes, where measured)
    bubble_zb = np.maximum((p - 1.0) * (t_avg - 2.0 * wg_avg) + np.maximum(p - m, 0.0) * wg_avg, 0.0)
    # ZB-V: its step with every rank a plain one (the last rank of a V), zbv_bubble_s (derived
    # from the schedule's critical paths, docs/model.md), or the first rank's work with the
    # embedding and the head, whichever is longer: both bound the step from below (a longer
    # task never shortens a path), and the first rank's extra work fills some of the bubble.
    # Of the idle time left, a micro-batch's 2(p−1) sends through the V forward and 2(p−1)
    # back are PP communication.
    chunk_f, chunk_b, chunk_w = (last.forward_s / 2.0, (last.backward_s - last.weight_grad_s) / 2.0,
                                 last.weight_grad_s / 2.0)
    zbv_idle = np.maximum(zbv_bubble_s(p, m, chunk_f, chunk_b, chunk_w, p2p) - m * (t_max - per_mb[2]), 0.0)
    pp_zbv = np.minimum(4.0 * (p - 1.0) * p2p, zbv_idle)
    # DualPipeV (dualpipev_bubble_s) the same way; its sends are what they add to the idle time
    dual = sc == Schedule.DUAL_PIPE_V.code
    if np.any(dual):
        def dual_idle(c):
            return np.maximum(dualpipev_bubble_s(p, m, chunk_f, chunk_b, chunk_w, c) - m * (t_max - per_mb[2]), 0.0)
        idle = dual_idle(p2p)
        zbv_idle = np.where(dual, idle, zbv_idle)
        pp_zbv = np.where(dual, idle - dual_idle(0.0), pp_zbv)
    bubble_zbv = zbv_idle - pp_zbv
    bubble = np.where(sc == Schedule.ZERO_BUBBLE.code, bubble_zb, np.where(vshape, bubble_zbv, bubble_1f1b))
    bubble = np.where(only, 0.0, bubble)
    pp_exposed = np.where(only, 0.0, np.where(vshape, pp_zbv, 2.0 * (p * v - 1.0) * p2p))

    # ---------------- data-parallel gradient sync and optimizer ----------------
    # (the busiest stage's weights: the step waits for its reduction and optimizer step)
    expert_stage, params_stage = lay.expert_head, lay.params_stage
    grad_bytes = reduce_bytes * params_stage
    dp_group = d * c
    dp_runs = dict(block=lay.dp_block, outer_stride=lay.dp_outer)
    g_ar = collective_time_s(cluster, Collective.ALL_REDUCE, grad_bytes, dp_group, t, **dp_runs)
    g_rs = collective_time_s(cluster, Collective.REDUCE_SCATTER, grad_bytes, dp_group, t, **dp_runs)
    p_ag = collective_time_s(cluster, Collective.ALL_GATHER, gather_bytes * params_stage, dp_group, t, **dp_runs)
    replica_stride = lay.dp_outer * _f(plan.dp_shard)
    hsdp_ar = collective_time_s(cluster, Collective.ALL_REDUCE, grad_bytes / S, R, replica_stride)
    if mc:  # expert gradients sync over EDP (HSDP: their shards all-reduced over the replicas too)
        e_grad = reduce_bytes * expert_stage
        hsdp_ar = hsdp_ar + collective_time_s(cluster, Collective.ALL_REDUCE, e_grad / S_e, R, replica_stride)
        g_ar = g_ar + collective_time_s(cluster, Collective.ALL_REDUCE, e_grad, edp, e_stride)
        g_rs = g_rs + collective_time_s(cluster, Collective.REDUCE_SCATTER, e_grad, edp, e_stride)
        p_ag = p_ag + collective_time_s(cluster, Collective.ALL_GATHER, gather_bytes * expert_stage, edp, e_stride)
    # FSDP2 under torch's pipeline schedules reduces the accumulated gradients once per step,
    # after the stage's last backward (PipelineStage perform_reduce_grad, torch 2.13
    # distributed/pipelining/stage.py), one collective per FSDP unit (each layer, then the
    # stage root's embedding or head): an all-reduce over the replicas at ZeRO-0 (one-rank
    # shards), a reduce-scatter over the shard group above it (ZeRO-1 runs as ZeRO-2)
    pp_rs = 0.0
    if np.any(f2_pp):
        layer_grad_bytes = reduce_bytes * layer_params

        def per_unit(kind, group, e_group):
            runs = dict(block=np.minimum(lay.dp_block, group), outer_stride=lay.dp_outer)
            out = (L_s * collective_time_s(cluster, kind, layer_grad_bytes, group, t, **runs)
                   + collective_time_s(cluster, kind, grad_bytes - L_s * layer_grad_bytes, group, t, **runs))
            if mc:
                out = out + L_s * collective_time_s(cluster, kind, reduce_bytes * expert_params, e_group, e_stride)
            return out
        pp_rs = per_unit(Collective.REDUCE_SCATTER, S, S_e)
        g_ar = np.where(f2_pp, per_unit(Collective.ALL_REDUCE, dp_group, edp), g_ar)
        g_rs = np.where(f2_pp, pp_rs, g_rs)
    ovl = np.asarray(plan.dp_overlap, dtype=bool)
    # the reduction can start once the last micro-batch's weight gradients appear: under its
    # whole backward, but under ZB-H1 only under its W pass, which rank 0 runs after its B
    # (Qi et al. 2024 Sec. 3.1, Fig. 3; sim/schedules.py _zero_bubble_h1)
    # (ZB-V's first rank ends with the W pass of its first chunk: half its stage's)
    last_bwd = np.where(vshape, first.weight_grad_s / 2.0,
                        np.where(sc == Schedule.ZERO_BUBBLE.code, first.weight_grad_s, first.backward_s))
    last_fwd = first.forward_s
    last_bucket = 1.0 / np.maximum(L_s, 1.0)

    def hide(comm, window):
        exposed = np.maximum(comm - window, comm * last_bucket)
        return np.where(ovl, exposed, comm), np.where(ovl, comm - exposed, 0.0)

    # ... and waits for it: nothing to hide behind
    red_window = np.where(lay.fsdp2_pp, 0.0, last_bwd)
    z0_exp, z0_ovl = hide(g_ar, red_window)
    z1_rs_exp, z1_rs_ovl = hide(g_rs, red_window)
    z1_ag_exp, z1_ag_ovl = hide(p_ag, last_fwd)
    z3_hsdp_exp, z3_hsdp_ovl = hide(hsdp_ar, red_window)
    is_z1 = zc == ZeroStage.OPTIMIZER.code
    is_z0 = zc == ZeroStage.NONE.code
    dp_exposed = np.where(is_z0, z0_exp,
                 np.where(is_z1, z1_rs_exp + z1_ag_exp,
                 np.where(is_z2, z1_ag_exp, np.where(R > 1, z3_hsdp_exp, 0.0))))
    dp_overlapped_step = np.where(is_z0, z0_ovl,
                         np.where(is_z1, z1_rs_ovl + z1_ag_ovl,
                         np.where(is_z2, z1_ag_ovl, np.where(R > 1, z3_hsdp_ovl, 0.0))))
    # the hidden part still slows the backward it runs under (NCCL's SMs; a CPU's cores),
    # as for per-layer overlap above; counted as DP time
    dp_exposed = dp_exposed + slow * dp_overlapped_step
    # ZeRO-2/3 reduced per micro-batch elsewhere; under pipeline schedules once, here
    dp_exposed = dp_exposed + np.where(f2_pp & (zc >= ZeroStage.GRADIENTS.code), pp_rs, 0.0)
    # FSDP2 at ZeRO-0/1/2 gathers the parameters once per step (resharded after the
    # backward) and reduces the gradients once per step where it does not per micro-batch:
    # their copies
    if any_f2:
        step_gather = (fsdp2_gather_copy_s(gpu, gather_bytes * params_stage, lay.shard)
                       + (fsdp2_gather_copy_s(gpu, gather_bytes * expert_stage, lay.shard_e) if mc else 0.0))
        step_reduce = (fsdp2_reduce_copy_s(gpu, reduce_bytes * params_stage, lay.shard)
                       + (fsdp2_reduce_copy_s(gpu, reduce_bytes * expert_stage, lay.shard_e) if mc else 0.0))
        dp_exposed = dp_exposed + np.where(f2 & ~is_z3, step_gather, 0.0) + np.where(f2 & ~mb_reduce, step_reduce, 0.0)
    # nothing to reduce with one data-parallel rank, unless experts replicate over their EDP
    dp_exposed = np.where((dp_group > 1) | ((edp > 1) if mc else False), dp_exposed, 0.0)
    # per-micro-batch ZeRO-2/3 exposed traffic is already inside the stage times
    zero_mb_exposed = m * L_s * (z3_fwd_exp + z3_bwd_exp) + m * 2.0 * z3_first
    zero_mb_overlapped = m * L_s * ((z3_fwd - z3_fwd_exp) + (z3_bwd - z3_bwd_exp))

    opt_params = params_stage / lay.shard + expert_stage / lay.shard_e
    offload = lay.offload
    adam_bytes, adam_kernels = ADAM_STEP[workload.optimizer]
    # the measured optimizer efficiency is torch's AdamW (calibrate/bench.py): the unfused passes
    opt_eff = gpu.optimizer_bw_efficiency if workload.optimizer is Optimizer.ADAM_UNFUSED else None
    opt_gpu = memory_bound_time_s(gpu, adam_bytes * opt_params, adam_kernels, opt_eff)
    opt_host = (opt_params * (mem.GRAD_BYTES + mem.WEIGHT_BYTES) / gpu.host_link_bw_unidir_bytes_per_s
                + opt_params / gpu.host_adam_params_per_s)
    optimizer = np.where(offload, opt_host, opt_gpu)

    # sequence parallelism leaves each TP rank a partial gradient of the weights it keeps
    # replicated (norms, the MoE router): Megatron-Core all-reduces them over TP in one flat
    # buffer once per step (finalize_model_grads, _allreduce_layernorm_grads; paraplan run
    # without DP the same). FSDP2 reduces each such tensor on its own at every gradient
    # reduction (torch 2.13 _fsdp_param.py _get_grad_inner_tensor): per micro-batch under
    # ZeRO-2/3, per step below it or under pipeline schedules.
    sp_tensors = L_s * (model.norm_params_per_layer / model.hidden_size + w_moe) + 1.0  # w_moe: 0 when dense
    sp_params = L_s * (model.norm_params_per_layer + w_moe * model.hidden_size * model.num_experts) + model.hidden_size
    flat = collective_time_s(cluster, Collective.ALL_REDUCE, reduce_bytes * sp_params, t, 1) + tp_host
    one_each = sp_tensors * (collective_time_s(cluster, Collective.ALL_REDUCE, reduce_bytes * sp_params / sp_tensors, t, 1)
                             + tp_host)
    sp_norm = np.where(sp & (t > 1), np.where(f2, np.where(mb_reduce, m, 1.0) * one_each, flat), 0.0)

    # ---------------- time breakdown on the critical stage ----------------
    # (layers counted: the fullest stage's; where the critical stage holds the head and MTP
    # blocks, its layers and those blocks, whose exposed collectives are communication and
    # whose recomputation is recomputation, not compute)
    crit_layers, rc_crit = L_s, 1.0
    if D:
        head_crit = np.where(ends, t_max == per_mb[0], t_max == per_mb[2])
        L_head = np.where(ends, L_first, L_last)
        crit_layers = np.where(head_crit, L_head + D, L_s)
        rc_crit = np.where(head_crit & (rc != Recompute.FIRST_K.code), (L_head + D) / L_s, 1.0)
    crit_tp = crit_layers * (tp_fwd_exp + tp_bwd_exp) + rc_crit * rc_tp_stage
    crit_cp = crit_layers * (cp_fwd_exp + cp_bwd_exp) + rc_crit * rc_cp_stage
    crit_ep = crit_layers * (a2a_fwd_exp + a2a_bwd_exp) + rc_crit * rc_ep_stage
    compute_mb = (t_max - (crit_tp + crit_cp + crit_ep) - rc_crit * rc_compute_stage
                  - (crit_layers * (z3_fwd_exp + z3_bwd_exp) + 2.0 * z3_first) - crit_wait)
    time = TimeBreakdown(
        compute_s=m * compute_mb,
        host_wait_s=m * crit_wait,
        recompute_s=m * rc_crit * rc_compute_stage,
        tp_comm_s=m * crit_tp + sp_norm,
        cp_comm_s=m * crit_cp,
        ep_comm_s=m * crit_ep,
        pp_comm_s=pp_exposed,
        dp_comm_s=dp_exposed + zero_mb_exposed,
        bubble_s=bubble,
        optimizer_s=optimizer,
    )
    overlapped = OverlappedComm(
        tp_comm_s=m * L_s * ((tp_fwd - tp_fwd_exp) + (tp_bwd - tp_bwd_exp)),
        cp_comm_s=m * L_s * ((cp_fwd - cp_fwd_exp) + (cp_bwd - cp_bwd_exp)),
        ep_comm_s=m * L_s * ((a2a_fwd - a2a_fwd_exp) + (a2a_bwd - a2a_bwd_exp)),
        dp_comm_s=dp_overlapped_step + zero_mb_overlapped,
    )
    comm_detail = {
        "TP " + ("all-gather+reduce-scatter" if np.all(sp) else "all-reduce" if not np.any(sp) else "collectives"): time.tp_comm_s,
        # one exchange for the whole batch (an estimate): its own name
        _CP_LABEL.get(int(np.min(cpc)) if np.min(cpc) == np.max(cpc) else -1, "CP K/V exchange"): time.cp_comm_s,
        "EP all-to-all" + (" (hierarchical)" if np.all(np.asarray(plan.a2a_hierarchical)) and mc else ""): time.ep_comm_s,
        "PP send/recv": time.pp_comm_s,
        "DP/ZeRO collectives": time.dp_comm_s,
    }

    memory, host_bytes = memory if memory is not None else _memory(
        model, cluster, workload, plan, lay, (mc.activation_bytes, mc.act_fn_out_bytes) if mc else (0.0, 0.0))

    # hardware FLOPs per GPU per step (incl. recomputation), for HFU
    # per-rank FLOPs of an average layer: expert FLOPs split over the EP group like the tokens
    layer_flops = lf.total - (1.0 - w_dense) * lf.mlp + w_moe * moe_forward_flops(model, T)
    hw_layer = 3.0 * layer_flops / t
    # early stop: no down-projections (dense MLP; routed and shared experts of MoE layers)
    down_flops = w_dense * lf.mlp / model.num_mlp_matrices + w_moe * moe_down_proj_flops(model, T)
    rc_layer_flops = layer_flops - np.where(early, down_flops, 0.0)
    rc_sel = np.where(rc == Recompute.SELECTIVE.code, L_s * lf.attn_core / t, 0.0)
    rc_mod = np.where(rc == Recompute.MODULES.code,
                      L_s * (np.where(flash, 0.0, lf.attn_core) + 2.0 * T * model.mla_up_proj_params) / t, 0.0)
    # (the head, and each MTP block recomputed as a layer of its stage but under first-k, on one
    # stage of p: per GPU, a p-th)
    hw = m * (L_s * hw_layer + rc_layers * rc_layer_flops / t + rc_sel + rc_mod
              + 3.0 * lm_head_forward_flops(model, T) / t / p)
    if D:
        mtp_rc_hw = D * np.where(rc == Recompute.FIRST_K.code, 0.0,
                                 (rc_layers * rc_layer_flops / t + rc_sel + rc_mod) / L_s)
        hw = hw + m * (3.0 * mtp_forward_flops(model, T, s) / t + mtp_rc_hw) / p

    layer_detail = {
        "fwd": {"QKV GEMM": g_qkv, "attention": attn_fwd, "out-proj GEMM": g_out, "MLP up GEMM": w_dense * g_up,
                "MLP down GEMM": w_dense * g_down, "element-wise": ew_fwd, "TP collectives": tp_fwd_exp,
                "CP K/V exchange": cp_fwd_exp, "FSDP gather": z3_fwd_exp, "FSDP2 copies": f2_fwd,
                "waiting for the host (eager)": host_wait_layer[0]},
        "bwd": {"GEMMs (dgrad+wgrad)": 2.0 * gemms_fwd, "attention": attn_bwd, "element-wise": ew_bwd,
                "TP collectives": tp_bwd_exp, "CP K/V exchange": cp_bwd_exp, "FSDP gather/reduce": z3_bwd_exp,
                "FSDP2 copies, gradient accumulation": f2_bwd, "waiting for the host (eager)": host_wait_layer[1]},
    }
    if mc:
        # MoE layers, averaged over the stage's layers like every entry here; the experts at
        # λ = 1 and what the imbalance adds to them, so that the entries add up
        layer_detail["fwd"].update({"MoE experts at λ = 1 (grouped GEMMs)":
                                    w_moe * (mc.expert_gemm_fwd_s - mc.imbalance_fwd_s),
                                    "MoE load imbalance (in experts)": w_moe * mc.imbalance_fwd_s,
                                    "MoE router, permute, shared": moe_fwd - w_moe * mc.expert_gemm_fwd_s,
                                    "EP all-to-all": a2a_fwd_exp})
        layer_detail["bwd"].update({"MoE (experts, router, permute, shared)": moe_bwd, "EP all-to-all": a2a_bwd_exp})
    # the weight-gradient GEMMs inside each "bwd" entry: what ZB-H1 runs as its W pass
    layer_detail["wgrad"] = {"GEMMs (dgrad+wgrad)": gemms_fwd, "MoE (experts, router, permute, shared)": moe_wgrad,
                             "element-wise": grad_casts, "waiting for the host (eager)": host_wait_layer[2]}
    step_detail = {"DP/ZeRO collectives (exposed)": dp_exposed, "SP norm-gradient all-reduce": sp_norm,
                   "optimizer step": optimizer}
    return PlanCosts(num_microbatches=m, first=first, middle=middle, last=last, p2p_s=p2p, time=time,
                     host_bytes=host_bytes,
                     overlapped=overlapped, memory=memory, dp_step_s=sum(step_detail.values()),
                     critical_stage_s=m * t_max, step_detail=step_detail,
                     comm_detail=comm_detail, hardware_flops_per_step=hw, layer_detail=layer_detail)
