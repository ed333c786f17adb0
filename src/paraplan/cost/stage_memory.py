"""Memory on the worst pipeline stage of a plan: model states, activations, logits, buffers.

Legend: T tokens per micro-batch on one CP rank, h hidden size, t tensor-parallel degree,
p pipeline stages, m micro-batches per step, L_s / L_first / L_last layers of the critical,
first and last stage, S / S_e the dense and expert ZeRO shard groups, D multi-token-prediction
modules.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..num import Num, scalar
from ..plan.axes import Recompute, ZeroStage
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from . import memory as mem
from .activation_offload import offloaded_layers
from .bf16_layers import bf16_layer_extra_bytes, bf16_layers_on_end_stages
from .breakdown import MemoryBreakdown
from .grad_compression import error_feedback_bytes
from .layout import Layout, layout
from .moe import moe_activation_bytes

# the stages of _StageStates.parts, in order: a pipeline's first, its last, its fullest middle one
FIRST_STAGE, LAST_STAGE, MIDDLE_STAGE = 0, 1, 2


@dataclass(frozen=True, kw_only=True)
class StageActivations:
    """Activation and loss-state bytes of the first, the (fullest) middle and the last stage."""

    first_bytes: Num
    middle_bytes: Num
    last_bytes: Num
    logits_bytes: Num       # one micro-batch's loss state (the head's logits, and each MTP module's)
    logits_elements: Num    # the head's T·V/t logits of one micro-batch
    recv_bytes: tuple       # torch pipelining's idle receive buffers: first, last, middle (pipelining_recv_buffers)
    host_bytes: tuple = (0.0, 0.0, 0.0)  # offloaded activations in host memory: first, middle, last stage


def _offload_split(plan, lay: Layout, layers, inflight, per_layer_bytes):
    """(bytes kept on the GPU, bytes in host memory) of a stage's offloaded layers
    (cost/activation_offload.py): each of the in-flight micro-batches' offloaded layers is on
    the host; on the GPU, a staging buffer of two layers (one where one layer is offloaded) --
    one layer's copy out in the forward, or in the backward the layer in use and the next one
    fetched ahead (Megatron-Core's double buffering). Subtracted from the stage's kept bytes."""
    off = offloaded_layers(plan, lay, layers)
    staging = np.minimum(off, 2.0) * per_layer_bytes
    return staging - inflight * off * per_layer_bytes, inflight * off * per_layer_bytes


def plan_memory(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, stage: int | None = None):
    """(MemoryBreakdown, host bytes) of a plan or batch, without its time: what the search
    checks before it times only the plans that fit. evaluate() reports the same. `stage`:
    the worst pipeline stage (None), or that one (FIRST_STAGE, LAST_STAGE, MIDDLE_STAGE)."""
    lay = layout(model, workload, plan)
    return stage_memory(model, cluster, workload, plan, lay, moe_stored_bytes(model, workload, plan, lay), stage)


def moe_stored_bytes(model: ModelSpec, workload: Workload, plan, lay: Layout) -> tuple:
    """An MoE layer's stored bytes and its activation function's outputs' share (moe.py)."""
    return (moe_activation_bytes(model, workload, plan, lay.tokens_per_microbatch, lay.tp, lay.precision)
            if model.is_moe else (0.0, 0.0))


@dataclass(frozen=True, kw_only=True)
class LayerBytes:
    """One micro-batch's bytes on a stage, per layer and at its ends, as the peak counts them."""

    stored: Num              # a layer's saved activations under the plan's policy
    stage_average: Num       # ... averaged over the stage's layers (first-k's k kept as their input)
    kept_whole: Num          # a layer's saved activations without recomputation
    recompute_working: Num   # what re-running a recomputed layer holds while it runs
    stage_input: Num         # the first stage's input (the embedding's output), kept for its backward
    logits_elements: Num     # the head's T·V/t logits
    head_inputs: Num         # the final norm's and the head GEMM's saved inputs, to the head's backward
    logits: Num              # the loss state at its backward (logits_bytes_per_element of the
                             # logits) and the head's inputs


def layer_bytes(model: ModelSpec, workload: Workload, plan, lay: Layout, moe_activations) -> LayerBytes:
    """One micro-batch's LayerBytes; `moe_activations`: an MoE layer's stored bytes and the
    part of them its activation function's outputs are (moe.py)."""
    h, T, t = model.hidden_size, lay.tokens_per_microbatch, lay.tp
    prec, ab, rc, sp_div, L_s, k_rc = (lay.precision, lay.act_bytes_per_element, lay.recompute_code, lay.sp_divisor,
                                       lay.stage_layers, lay.first_k_layers)
    moe_act, moe_act_fn_out = moe_activations
    stored, none_act, sel_act = mem.layer_activation_bytes(
        model, plan, workload.seq_len, recompute_code=rc, mlp_weight=lay.dense_layer_share,
        extra_bytes=lay.moe_layer_share * moe_act, modules_extra_saving=lay.moe_layer_share * moe_act_fn_out,
        precision=prec)
    # a layer's input as kept: the residual stream, fp32 under autocast
    residual_bytes = mem.residual_bytes_per_element(ab, plan.autocast)
    per_layer_stored = np.where(rc == Recompute.FIRST_K.code,
                                (k_rc * residual_bytes * T * h / sp_div + (L_s - k_rc) * none_act) / L_s,
                                stored)
    logits_elements = T * model.vocab_size / t
    # the final norm keeps its input, the head GEMM its (normed) input: the sequence shard under
    # Megatron's SP, whole under an eager engine's (DTensor gathers it: torchtitan's
    # ColwiseParallel(input_layouts=Shard(1)) on the output layer), as a layer's projections
    head_inputs = T * h * (residual_bytes / sp_div + ab * (1.0 / sp_div + mem.eager_sp_whole_share(plan)))
    logits = (mem.logits_bytes_per_element(prec, plan.fused_kernels, lay.compiled_loss, lay.loss_parallel)
              * logits_elements + head_inputs)
    # a recomputed layer's working set (per-op checkpointing and a searched set re-create what
    # one layer did not keep)
    working = np.where((rc == Recompute.FULL.code) | (rc == Recompute.FIRST_K.code), sel_act,
                       np.where((rc == Recompute.OP_SAC.code) | (rc == Recompute.SET.code),
                                np.maximum(none_act - stored, 0.0), 0.0))
    return LayerBytes(stored=stored, stage_average=per_layer_stored, kept_whole=none_act, recompute_working=working,
                      stage_input=residual_bytes * T * h / sp_div, logits_elements=logits_elements,
                      head_inputs=head_inputs, logits=logits)


def stage_activations(model: ModelSpec, workload: Workload, plan, lay: Layout, moe_activations) -> StageActivations:
    """Activations each stage holds at its peak; `moe_activations`: an MoE layer's stored
    bytes and the part of them its activation function's outputs are (moe.py)."""
    h, T, p, m = model.hidden_size, lay.tokens_per_microbatch, lay.pp, lay.num_microbatches
    ab, rc, sp_div, L_s = lay.act_bytes_per_element, lay.recompute_code, lay.sp_divisor, lay.stage_layers
    lb = layer_bytes(model, workload, plan, lay, moe_activations)
    stored, none_act, per_layer_stored, logits = lb.stored, lb.kept_whole, lb.stage_average, lb.logits
    # micro-batches in flight at each stage's peak, as the schedule simulator counts them
    # (SimResult.peak_inflight): the first stage, the second (the fullest middle one) and the last
    inflight = mem.inflight_microbatches(plan, m)
    inflight_mid = mem.inflight_microbatches(plan, m, 1.0)
    inflight_last = mem.inflight_microbatches(plan, m, p - 1.0)
    recv = pipelining_recv_buffers(plan, lay, lb.stage_input, inflight, inflight_mid, inflight_last)
    # a recomputed layer's working set: on the stage with the loss, only what exceeds the
    # logits, which the backward has freed before it re-runs the last layer
    recompute_working = lb.recompute_working
    working_past_loss = np.maximum(recompute_working - logits, 0.0)
    acts_first = (inflight * lay.first_stage_layers * per_layer_stored
                  + np.where(lay.first_holds_ends, working_past_loss, recompute_working)
                  + inflight * lb.stage_input)
    # (under ZB-V the last rank holds no loss: its recomputed layer's working set is whole)
    acts_last = (inflight_last * lay.last_stage_layers * per_layer_stored
                 + np.where(lay.v_shape, recompute_working, working_past_loss))
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
        acts_first = acts_first + inflight * np.where(lay.first_holds_ends, mtp_acts, 0.0)
        acts_last = acts_last + inflight_last * np.where(lay.v_shape, 0.0, mtp_acts)
        logits = logits * (1.0 + D)  # each MTP module's logits beside the head's
    acts_mid = inflight_mid * L_s * per_layer_stored + recompute_working
    if not np.any(plan.activation_offload_layers):
        return StageActivations(first_bytes=acts_first, middle_bytes=acts_mid, last_bytes=acts_last,
                                logits_bytes=logits, logits_elements=lb.logits_elements, recv_bytes=recv)
    # (an offloaded layer is kept whole before it goes: `stored`, first-k's too)
    splits = [_offload_split(plan, lay, layers, n, stored) for layers, n in
              ((lay.first_stage_layers, inflight), (L_s, inflight_mid), (lay.last_stage_layers, inflight_last))]
    return StageActivations(first_bytes=acts_first + splits[0][0], middle_bytes=acts_mid + splits[1][0],
                            last_bytes=acts_last + splits[2][0], logits_bytes=logits,
                            logits_elements=lb.logits_elements, recv_bytes=recv,
                            host_bytes=tuple(host for _, host in splits))


def _uncast_params(model: ModelSpec, lay: Layout):
    """(first stage's, last stage's) parameters autocast does not keep a 16-bit cast of.

    Under autocast the 16-bit weights are the cached casts (lay.autocast_casts), not of the
    input embedding (F.embedding runs in fp32; a tied table is cast for the head on the
    stage that has both). The cache lives as long as the autocast region, which holds the
    loss: at the end of the forward every layer's cast is alive beside the logits (about
    10 B each: 16-bit, upcast, log-softmax); the backward then frees the casts of layers a
    full or first-k recomputation re-runs (re-cast one at a time) while the loss's backward
    holds 12 B per logit. Without PP the peak is the larger of the two: the casts of those
    layers count only beyond 2 B per logit (a compiled loss's: 2 B of logits at the end of the
    forward, 4 B in its backward). paraplan run keeps one region for a pipelined
    step (torch's schedule runs every micro-batch inside it): there they all stay."""
    cast_cache, t, only = lay.autocast_casts, lay.tp, lay.single_stage
    if not np.any(cast_cache):
        return 0.0, 0.0  # (the search's batches never run under autocast)
    logits_el = lay.tokens_per_microbatch * model.vocab_size / t
    table = model.embedding_params / t * np.where(model.tied_embeddings & only, 0.0, 1.0)
    recast = np.maximum(np.minimum(lay.recomputed_layers, lay.first_stage_layers) - 1.0, 0.0) * lay.dense_layer_params / t
    fwd_loss, bwd_loss = mem.compiled_loss_bytes(lay.precision)
    loss_growth = np.where(lay.compiled_loss, bwd_loss - fwd_loss, mem.EAGER_LOSS_BYTES - mem.EAGER_LOSS_FWD_BYTES)
    freed = np.where(only, np.minimum(recast, loss_growth / mem.WEIGHT_BYTES * logits_el), 0.0)
    return np.where(cast_cache, table + freed, 0.0), np.where(cast_cache & only, table + freed, 0.0)


def _model_states(lay: Layout, params, embedding, experts, layers):
    """(weights, gradients, optimizer, host) bytes of a stage's `params` and `experts`, of which
    `embedding` parameters autocast keeps no cast of; `layers` transformer layers' weights
    (and the experts) are the linear layers' that a low-precision workload may keep quantized
    (Layout.linear_weight_bytes_per_param), the rest (embedding, head, MTP blocks) 16-bit."""
    zc, S, S_e = lay.zero_code, lay.zero_shard_group, lay.expert_shard_group
    # weights are kept in 16 bits, or as fp32 parameter shards (FSDP with autocast, Composer
    # "DEFAULT"; every 32-bit workload): the shard is the fp32 master copy, so the optimizer
    # keeps only the two moments: 16 bytes/param, not 18
    w_bytes = np.where(lay.fp32_params, mem.MASTER_BYTES, mem.WEIGHT_BYTES)
    o_bytes = np.where(lay.fp32_params, mem.OPTIMIZER_BYTES - mem.MASTER_BYTES, mem.OPTIMIZER_BYTES)
    # FSDP2 under torch's pipeline schedules (lay.fsdp2_pp) keeps each backward's gathered
    # parameters and accumulates unsharded gradients in the reduce dtype until the step's
    # reduction: the stage's whole gathered weights and gradients, whatever the ZeRO stage says
    z3_sharded = lay.zero3 & ~lay.fsdp2_pp
    g_sharded = (zc >= ZeroStage.GRADIENTS.code) & ~lay.fsdp2_pp
    shard, shard_e, offload = lay.optimizer_shard, lay.expert_optimizer_shard, lay.offload_optimizer
    linear, linear_bytes = layers * lay.layer_params, lay.linear_weight_bytes_per_param
    w = (w_bytes * (params - linear - embedding) + linear_bytes * linear) / np.where(z3_sharded, S, 1.0) \
        + linear_bytes * experts / np.where(z3_sharded, S_e, 1.0)
    g = np.where(lay.fsdp2_pp & (zc >= ZeroStage.GRADIENTS.code), lay.reduce_bytes_per_param, lay.grad_bytes_per_param) * (
        params / np.where(g_sharded, S, 1.0) + experts / np.where(g_sharded, S_e, 1.0))
    o = np.where(offload, 0.0, o_bytes * (params / shard + experts / shard_e))
    # offloaded: the optimizer states and an fp32 copy of the gradient shard in host DRAM
    host = np.where(offload, (o_bytes + mem.GRAD_BYTES) * (params / shard + experts / shard_e), 0.0)
    return w, g, o, host


def adama_layer_buckets(plan, lay: Layout):
    """Layers' gradients alive at once under Adam accumulation (AdamA, Zhang et al. 2023,
    Algorithm 1: each gradient is folded into m and v, then released, as the backward makes
    it): one layer's without data parallelism; with an overlapped DP reduction a second one,
    under its reduction while the next is made (DDP / Megatron buckets of about one layer);
    with a reduction not overlapped, the whole stage's, which waits for the end of the
    backward (inf: nothing saved)."""
    reduces = (lay.dp * lay.cp > 1) | (lay.edp > 1)
    overlapped = np.asarray(plan.dp_overlap, dtype=bool)
    return np.where(reduces, np.where(overlapped, 2.0, np.inf), 1.0)


def _adama_gradients(lay: Layout, g, params, experts, layers, buckets):
    """A stage's gradient bytes at the peak under Adam accumulation (fp32, GRAD_BYTES a
    parameter): `buckets` layers' gradients (adama_layer_buckets) and, whole, those of the
    parameters outside the stage's `layers` (embedding, head, final norm, MTP blocks): the
    head's is made at the start of the backward, beside the stored activations; the
    embedding's at its end (conservative there); a tied table's collects both, across the
    backward. Never more than the full gradients `g`; `g` where the knob is off."""
    ends = np.maximum(params - layers * lay.layer_params, 0.0) + np.maximum(experts - layers * lay.expert_params, 0.0)
    per_layer = lay.layer_params + lay.expert_params
    held = mem.GRAD_BYTES * (ends + np.where(np.isinf(buckets), 0.0, buckets) * per_layer)
    return np.where(lay.adam_accumulation & ~np.isinf(buckets), np.minimum(held, g), g)


def _adama_stage_gradients(plan, lay: Layout, g1, gl, gm):
    """(first, last, middle) stage's gradient bytes under Adam accumulation (_adama_gradients),
    of the same parameters and experts as their _model_states."""
    buckets = adama_layer_buckets(plan, lay)
    experts_first = np.where(lay.first_holds_ends, lay.head_stage_expert_params, lay.expert_params_stage)
    experts_last = np.where(lay.v_shape, lay.expert_params_stage, lay.head_stage_expert_params)
    return (_adama_gradients(lay, g1, lay.params_first_stage, experts_first, lay.first_stage_layers, buckets),
            _adama_gradients(lay, gl, lay.params_last_stage, experts_last, lay.last_stage_layers, buckets),
            _adama_gradients(lay, gm, lay.stage_layers * lay.layer_params, lay.expert_params_stage,
                             lay.stage_layers, buckets))


def _lazy_gradient_peak(model: ModelSpec, lay: Layout, g, acts, lo):
    """(gradients, activations, loss state) at the peak where the backward allocates the
    gradients itself (eager torch without DDP's or Megatron's preallocated buffers: paraplan
    run and torchtitan on one GPU, under autocast; FSDP2's sharded gradients, which
    torchtitan's optimizer sets to None every step, torch.optim zero_grad(set_to_none=True)),
    in a step of one micro-batch: at the loss's backward only the head's gradient exists; by
    the end of the backward all do and the activations are gone. The peak is the larger (an
    H100 run of one micro-batch measured 35.9 GiB where the static sum said 40.4). (The one
    stage seen as first and as last alike; FSDP2 under a pipeline accumulates over its
    micro-batches, so it keeps them.)"""
    lazy = (((lay.autocast_casts & (lay.dp * lay.cp == 1)) | (lay.fsdp2 & ~lay.fsdp2_pp))
            & (lay.num_microbatches <= 1.0) & lay.single_stage)
    if not np.any(lazy):
        return g, acts, lo
    head_grad = mem.GRAD_BYTES * (model.output_weight_params / lay.tp + model.hidden_size)
    at_end = g > acts + lo + head_grad
    return (np.where(lazy & ~at_end, head_grad, g), np.where(lazy & at_end, 0.0, acts),
            np.where(lazy & at_end, 0.0, lo))


@dataclass(frozen=True, kw_only=True)
class _StageStates:
    """Each stage's bytes by part ([first, last, middle]: weights, gradients, optimizer,
    activations, logits) and in all, the communication buffers beside the worst stage's
    and the host bytes of offload."""

    parts: tuple
    totals: tuple
    buffers: Num
    host_bytes: Num
    recv_bytes: tuple  # of which torch pipelining's receive buffers ([first, last, middle], in activations)

    @functools.cached_property
    def worst(self):
        """The stage with the most bytes (FIRST_STAGE, LAST_STAGE, MIDDLE_STAGE; the first on a
        tie with the last, either end on a tie with the middle): computed where a breakdown asks."""
        tot1, totl, totm = self.totals
        return np.where((totm > tot1) & (totm > totl), MIDDLE_STAGE, np.where(tot1 >= totl, FIRST_STAGE, LAST_STAGE))

    def worst_total(self):
        """The worst stage's bytes: the largest total (pick(*totals), to the bit)."""
        first, last, middle = self.totals
        return np.maximum(np.maximum(first, last), middle)

    def pick(self, first, last, middle):
        return np.where(self.worst == FIRST_STAGE, first, np.where(self.worst == LAST_STAGE, last, middle))


def pipelining_recv_buffers(plan, lay: Layout, stage_input_bytes, inflight_first, inflight_mid, inflight_last):
    """(first, last, middle) rank's receive buffers beyond its micro-batches in flight (the
    stage parts' order), under torch.distributed.pipelining (the eager engines' pipeline:
    torchtitan, paraplan run); each a stage input's `stage_input_bytes`.

    Every pipeline stage makes one buffer per micro-batch for the activations it receives
    (all but the global first stage) and one for the gradients it receives (all but the
    global last), once, and keeps them (stage.py _setup_forward_recv_info,
    _setup_backward_recv_info). A rank holds v stages: the first rank holds the global first
    (and, in a V, the global last too), the last rank the global last unless in a V. The
    in-flight micro-batches' inputs are counted with their layers: of a rank's activation
    buffers, its in-flight micro-batches (in whole stages' worth) per receiving stage are in
    use. Megatron receives into fresh tensors: none."""
    m, v = lay.num_microbatches, lay.vp
    torch_pp = ~np.asarray(plan.fused_kernels, dtype=bool) & (lay.pp > 1)
    v_shape = np.asarray(lay.v_shape, dtype=bool)

    def idle(acts_in, grads_in, inflight):
        return np.where(torch_pp, (np.maximum(m - inflight, 0.0) * acts_in + m * grads_in) * stage_input_bytes, 0.0)

    return (idle(v - 1.0, np.where(v_shape, v - 1.0, v), inflight_first),
            idle(v, np.where(v_shape, v, v - 1.0), inflight_last),
            idle(v, v, inflight_mid))


def _stage_states(model: ModelSpec, workload: Workload, plan, lay: Layout, moe_activations) -> _StageStates:
    """The three stages' memory by part and which is worst."""
    m, zc = lay.num_microbatches, lay.zero_code
    layer_params, expert_params, gather_bytes = lay.layer_params, lay.expert_params, lay.gather_bytes_per_param
    acts = stage_activations(model, workload, plan, lay, moe_activations)
    uncast_first, uncast_last = _uncast_params(model, lay)
    w1, g1, o1, host1 = _model_states(lay, lay.params_first_stage, uncast_first,
                                      np.where(lay.first_holds_ends, lay.head_stage_expert_params,
                                               lay.expert_params_stage), lay.first_stage_layers)
    wl, gl, ol, hostl = _model_states(lay, lay.params_last_stage, uncast_last,
                                      np.where(lay.v_shape, lay.expert_params_stage, lay.head_stage_expert_params),
                                      lay.last_stage_layers)
    # the second stage: all L_s layers and its own micro-batches in flight (as many as the
    # first's under GPipe, breadth-first and ZB-H1, fewer under 1F1B); it outgrows the first
    # when the embedding took one of the first stage's layer slots
    wm, gm, om, hostm = _model_states(lay, lay.stage_layers * lay.dense_layer_params / lay.tp, 0.0,
                                      lay.expert_params_stage, lay.stage_layers)
    if np.any(lay.powersgd_rank > 0.0):  # PowerSGD's error feedback: in the gradients line
        g1 = g1 + error_feedback_bytes(model, lay, lay.params_first_stage)
        gl = gl + error_feedback_bytes(model, lay, lay.params_last_stage)
        gm = gm + error_feedback_bytes(model, lay, lay.stage_layers * lay.dense_layer_params / lay.tp)
    if np.any(lay.adam_accumulation):
        g1, gl, gm = _adama_stage_gradients(plan, lay, g1, gl, gm)
    has_mid = lay.pp > 2
    act_host1, act_hostm, act_hostl = acts.host_bytes
    host_bytes = np.maximum(np.maximum(host1 + act_host1, hostl + act_hostl), np.where(has_mid, hostm + act_hostm, 0.0))
    # the loss state: on the first rank where it holds the head (one stage, or ZB-V's V);
    # the last stage keeps each micro-batch's loss state until that micro-batch's backward:
    # several at once where the schedule runs every forward first (GPipe, breadth-first)
    lo1 = np.where(lay.first_holds_ends, mem.inflight_logits(plan, m) * acts.logits_bytes, 0.0)
    lol = np.where(lay.v_shape, 0.0, mem.inflight_logits(plan, m) * acts.logits_bytes)
    # and where the pipeline keeps every micro-batch's head output to the step's end (torch
    # pipelining without return_outputs=False; Plan.pp_kept_output_bytes), all m of them at
    # the last loss backward, beside its loss state (whose logits the loss freed)
    kept = np.where(lay.pp > 1, m * np.asarray(plan.pp_kept_output_bytes, dtype=float) * acts.logits_elements, 0.0)
    lo1 = lo1 + np.where(lay.v_shape, kept, 0.0)
    lol = lol + np.where(lay.v_shape, 0.0, kept)
    recv_first, recv_last, recv_mid = acts.recv_bytes
    g1, acts_first, lo1 = _lazy_gradient_peak(model, lay, g1, acts.first_bytes + recv_first, lo1)
    gl, acts_last, lol = _lazy_gradient_peak(model, lay, gl, acts.last_bytes + recv_last, lol)
    tot1 = w1 + g1 + o1 + acts_first + lo1
    totl = wl + gl + ol + acts_last + lol
    totm = np.where(has_mid, wm + gm + om + acts.middle_bytes + recv_mid, 0.0)
    buffers = np.where(lay.zero3, 2.0 * (layer_params + expert_params)
                       * (gather_bytes + mem.WEIGHT_BYTES * lay.casts_gathered + mem.GRAD_BYTES), 0.0)
    # FSDP2 under pipeline schedules: the gathered weights and the accumulated gradients are
    # the stage's own (counted above); in flight only one layer's gradient before it is added in
    buffers = np.where(lay.fsdp2_pp & (zc >= ZeroStage.GRADIENTS.code), (layer_params + expert_params) * gather_bytes,
                       buffers)
    return _StageStates(parts=((w1, g1, o1, acts_first, lo1), (wl, gl, ol, acts_last, lol),
                               (wm, gm, om, acts.middle_bytes + recv_mid, 0.0)),
                        totals=(tot1, totl, totm), buffers=buffers, host_bytes=host_bytes,
                        recv_bytes=acts.recv_bytes)


def stage_memory_parts(model: ModelSpec, workload: Workload, plan, lay: Layout) -> tuple[dict, int]:
    """(what the worst stage allocates once and keeps by part: weights, gradients, optimizer,
    torch pipelining's idle receive buffers; which stage it is: FIRST_STAGE, LAST_STAGE or
    MIDDLE_STAGE, the fullest middle one) of one plan."""
    st = _stage_states(model, workload, plan, lay, moe_stored_bytes(model, workload, plan, lay))
    worst = int(scalar(st.worst))
    weights, grads, opt = st.parts[worst][:3]
    return {"weights": weights, "gradients": grads, "optimizer": opt,
            "pipelining receive buffers": st.recv_bytes[worst]}, worst


def stage_memory(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, lay: Layout, moe_activations,
                 stage: int | None = None):
    """(MemoryBreakdown on the worst pipeline stage, or on `stage`, host bytes);
    `moe_activations`: an MoE layer's stored bytes and the part of them its activation
    function's outputs are (moe.py)."""
    gpu = cluster.gpu
    st = _stage_states(model, workload, plan, lay, moe_activations)
    pick = st.pick if stage is None else (lambda *by_stage: by_stage[stage])
    weights, grads, opt, act, lg = (pick(*by_stage) for by_stage in zip(*st.parts))
    alloc = weights + grads + opt + act + lg + st.buffers
    memory = MemoryBreakdown(
        weights_bytes=weights, gradients_bytes=grads, optimizer_bytes=opt, activations_bytes=act,
        logits_bytes=lg, comm_buffers_bytes=st.buffers,
        fragmentation_bytes=gpu.allocator_fragmentation * alloc,
        reserved_bytes=np.full(np.shape(alloc), gpu.reserved_bytes) if np.ndim(alloc) else gpu.reserved_bytes,
    )
    return memory, st.host_bytes


def plan_memory_total(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan):
    """(plan_memory's total, host bytes), without the breakdown: what the search checks. The
    same sums in the same order as MemoryBreakdown.total, so the same bytes to the bit
    (tests/test_memory_first.py)."""
    gpu, lay = cluster.gpu, layout(model, workload, plan)
    st = _stage_states(model, workload, plan, lay, moe_stored_bytes(model, workload, plan, lay))
    alloc = st.worst_total() + st.buffers
    return alloc + gpu.allocator_fragmentation * alloc + gpu.reserved_bytes, st.host_bytes


def stage_bytes(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan) -> tuple[tuple, tuple]:
    """((first, last, middle) stage's bytes per GPU as plan_memory_total counts the worst one's:
    allocated with the communication buffers, the GPU's fragmentation share and its runtime
    reserve; the same stages' (weights, optimizer) bytes, what a checkpoint of each writes): a
    mixed pipeline prices each of its stages by its place (cost/mixed.py)."""
    gpu, lay = cluster.gpu, layout(model, workload, plan)
    st = _stage_states(model, workload, plan, lay, moe_stored_bytes(model, workload, plan, lay))
    totals = tuple((t + st.buffers) * (1.0 + gpu.allocator_fragmentation) + gpu.reserved_bytes for t in st.totals)
    return totals, tuple((parts[0], parts[2]) for parts in st.parts)
