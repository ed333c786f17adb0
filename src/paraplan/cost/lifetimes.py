"""A step's tensors on one pipeline rank, in the order they are made and freed: the input of the
caching-allocator replay (cost/allocator.py replay_step) that prices fragmentation from
lifetimes instead of a fixed share.

The rank is the plan's worst stage (stage_memory: the first, the last or the fullest middle
one). Its tasks come in the schedule's order (sim/schedules.py build_schedule), each model
chunk's layers as the cost model lays them out (chunks.chunk_layers). Sizes are the static
model's (stage_memory.LayerBytes, the worst stage's model states), so the replay's allocated
peak is the breakdown's up to the tensors it leaves out (autocast's casts); what the replay
adds is where each tensor sits:

  before the step  weights, gradients and optimizer states (allocated once, never freed),
                   and torch pipelining's receive buffers beyond the micro-batches in flight;
  forward (F)      the stage input on virtual stage 0; per layer the gathered weights under
                   ZeRO-3 (the next layer's prefetched before this one's are freed: two
                   alive), the layer's saved activations (layer_tensors), and under
                   recomputation what the layer does not keep, made and freed; on the chunk
                   with the head, the final norm's and the head's saved inputs, the loss's
                   forward tensors (loss_sequences) and, where the
                   pipeline keeps them (Plan.pp_kept_output_bytes), the head's output to the
                   step's end;
  backward (B)     the loss's backward tensors, then per layer in reverse the gathered
                   weights and the unsharded gradient under ZeRO-3, what recomputation
                   re-creates, a residual-sized gradient per tensor, and the saved tensors
                   freed (under a split backward the weight pass W frees them).

ZeRO-3's buffers are allocated on their own stream (COMM_STREAM), as FSDP's all-gather and
reduce-scatter streams allocate them. The loss sequences are the eager and fused
cross-entropies of docs/model/memory.md, tensor by tensor, in bytes per logit; their largest
live sum is logits_bytes_per_element exactly (tests/test_lifetimes.py).
"""
from __future__ import annotations

import functools

from ..num import scalar
from ..plan.axes import Recompute, Schedule
from ..plan.plan import Plan
from ..plan.space import PlanBatch
from ..sim.schedules import Phase, build_schedule, placement, virtual_stage
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from . import memory as mem
from .allocator import AllocatorPeaks, replay_step
from .chunks import chunk_layers
from .layout import layout
from .stage_memory import FIRST_STAGE, LAST_STAGE, MIDDLE_STAGE, moe_stored_bytes, layer_bytes, stage_memory_parts

# micro-batches replayed at most: past the warm-up every schedule but GPipe and breadth-first
# repeats one period per micro-batch, so twice the stages (or this many) reach its peak
REPLAY_MICROBATCHES = 64

# The loss's tensors, (name, bytes per logit) allocated or (name, None) freed, forward then
# backward, per loss kind (docs/model/memory.md: eager torch F.cross_entropy(logits.float())
# after torchtitan's `del pred`; op by op over a TP-split vocabulary (loss_parallel); compiled;
# Megatron's fused vocab-parallel kernel). w: the activation width.
def loss_sequences(kind: str, w: float) -> tuple[list, list]:
    """(forward, backward) events of one micro-batch's loss, in bytes per logit."""
    up = 4.0 if w < 4.0 else 0.0  # the fp32 upcast of 16-bit logits
    if kind == "fused":
        return [("logits", w), ("softmax", 4.0)], [("logits", None), ("grad", w), ("softmax", None)]
    if kind == "compiled":
        return [("logits", w)], [("grad", w), ("logits", None)]
    if kind == "parallel":
        fwd = [("logits", w), ("upcast", up), ("logsoftmax", 4.0), ("stats", 4.0),
               ("upcast", None), ("stats", None), ("logits", None)]
        bwd = [("target_grad", 4.0), ("exp", 4.0), ("grad_fp32", 4.0), ("target_grad", None), ("exp", None),
               ("logsoftmax", None), ("grad", w), ("grad_fp32", None)]
        return fwd, bwd
    fwd = [("logits", w), ("upcast", up), ("logsoftmax", 4.0), ("upcast", None), ("logits", None)]
    bwd = [("nll_grad", 4.0), ("grad_fp32", 4.0), ("nll_grad", None), ("logsoftmax", None), ("grad", w),
           ("grad_fp32", None)]
    return fwd, bwd


def loss_kind(plan: Plan, lay) -> str:
    """Which cross-entropy the plan's engine runs (memory.logits_bytes_per_element's cases)."""
    if plan.fused_kernels:
        return "fused"
    if scalar(lay.compiled_loss):
        return "compiled"
    return "parallel" if scalar(lay.loss_parallel) else "eager"


def _replayed_microbatches(plan: Plan, m: int) -> int:
    """Micro-batches to replay: all of them where every forward runs first (GPipe,
    breadth-first) up to REPLAY_MICROBATCHES, else enough for the steady state (a multiple of
    the stages where the schedule needs one)."""
    p = plan.pp
    if plan.schedule in (Schedule.GPIPE, Schedule.BREADTH_FIRST):
        cap = REPLAY_MICROBATCHES
    else:
        cap = max(4 * p if plan.schedule is Schedule.DUAL_PIPE_V else 2 * p, 2)
    if m <= cap:
        return m
    return cap // p * p if plan.schedule is Schedule.INTERLEAVED_1F1B else cap


def layer_tensors(model: ModelSpec, tp: float, sp_divisor: float) -> tuple[tuple[str, float], ...]:
    """A layer's saved tensors, in elements per token: its input (the residual stream, whole or
    split by sequence parallelism), and the rest as one block -- the norms' outputs and the
    second norm's input (3h), Q/K/V and the attention output, the MLP's up-projection and
    activation outputs (split by TP; Korthikanti et al. 2022 Sec. 4.1's terms). The replay
    scales them to the static model's bytes for the plan's policy, so only their proportions
    matter. (Each of the rest's tensors apart took 5x the replay time and moved no measured
    row by more than 0.6 points.)"""
    h, q, kv = model.hidden_size, model.q_dim, 2.0 * model.num_kv_heads * model.head_dim
    f, n_up = model.moe_ffn_hidden_size if model.is_moe else model.ffn_hidden_size, model.num_mlp_matrices - 1
    return (("input", h / sp_divisor), ("inner", 3.0 * h / sp_divisor + (2.0 * q + kv + (n_up + 1.0) * f) / tp))


def _scaled(tensors, total_bytes: float) -> list[tuple[str, float]]:
    """The tensors' sizes scaled to sum to `total_bytes`."""
    elements = sum(e for _, e in tensors)
    return [(name, total_bytes * e / elements) for name, e in tensors] if elements and total_bytes else []


def _forward_layer(key, saved: list, transient: list) -> list:
    """A layer's forward: its saved tensors made in order; under recomputation what it does
    not keep (`transient`) made and freed."""
    return ([((key, "saved", n), b) for n, b in saved] + [((key, "tmp", n), b) for n, b in transient]
            + [((key, "tmp", n), None) for n, _ in transient])


def _backward_layer(key, saved: list, recreated: list, free_saved: bool, grad_bytes: float) -> list:
    """A layer's backward: what recomputation re-creates, then down the layer a gradient of the
    residual stream's size (`grad_bytes`) per tensor made and the one before it freed, each
    saved or re-created tensor freed once its gradient exists (unless the W pass frees it)."""
    events = [((key, "re", n), b) for n, b in recreated]
    order = [((key, "re", n), b) for n, b in recreated] or [((key, "saved", n), b) for n, b in saved]
    before = None
    for tensor_key, _ in reversed(order):
        grad = (tensor_key, "grad")
        events.append((grad, grad_bytes))
        if before is not None:
            events.append((before, None))
        if free_saved or tensor_key[1] == "re":
            events.append((tensor_key, None))
        before = grad
    if before is not None:
        events.append((before, None))
    if recreated and free_saved:
        events += [((key, "saved", n), None) for n, _ in saved]
    return events


COMM_STREAM = 1  # ZeRO-3's all-gather and reduce-scatter buffers: allocated on their own stream


def _gathered(gather_bytes: float, key, order, at: int) -> list:
    """ZeRO-3's gathered weights of layer order[at]: the next layer's prefetched, then this
    one's freed, on the all-gather stream (FSDP's, whose blocks the compute stream's requests
    never reuse)."""
    if not gather_bytes:
        return []
    events = [(("gather", key, order[0]), gather_bytes, COMM_STREAM)] if at == 0 else []
    if at + 1 < len(order):
        events.append((("gather", key, order[at + 1]), gather_bytes, COMM_STREAM))
    events.append((("gather", key, order[at]), None))
    return events


def step_events(model: ModelSpec, workload: Workload, plan: Plan) -> list:
    """The worst stage's tensor events for one step: (key, bytes) allocates, (key, None) frees."""
    batch = PlanBatch.from_plans([plan])
    lay = layout(model, workload, batch)
    lb = layer_bytes(model, workload, batch, lay, moe_stored_bytes(model, workload, batch, lay))
    parts, worst = stage_memory_parts(model, workload, batch, lay)
    p, v = plan.pp, plan.vp
    rank = {FIRST_STAGE: 0, LAST_STAGE: p - 1, MIDDLE_STAGE: min(1, p - 1)}[worst]
    m_step = int(round(scalar(lay.num_microbatches)))
    m = _replayed_microbatches(plan, m_step)
    layers = chunk_layers(model, workload, plan)
    where, head_stage = placement(plan.schedule), p * v - 1
    tasks = build_schedule(plan.schedule, p, m, v)[rank]
    loss_fwd, loss_bwd = loss_sequences(loss_kind(plan, lay), lay.act_bytes_per_element)
    logits_el, stage_in = scalar(lb.logits_elements), scalar(lb.stage_input)
    shapes = layer_tensors(model, scalar(lay.tp), scalar(lay.sp_divisor))
    kept, whole = _scaled(shapes, scalar(lb.stored)), _scaled(shapes, scalar(lb.kept_whole))
    working = _scaled(shapes[1:], scalar(lb.recompute_working))
    grad_bytes = scalar(lb.stage_input) * lay.act_bytes_per_element / scalar(mem.residual_bytes_per_element(
        lay.act_bytes_per_element, plan.autocast))
    layer_input = [("input", scalar(lb.stage_input))]
    rc = plan.recompute
    first_k = int(round(scalar(lay.first_k_layers))) if rc is Recompute.FIRST_K else 0
    rank_layers = [i for t in tasks if t.phase is Phase.FORWARD and t.microbatch == 0
                   for i in layers[int(virtual_stage(where, p, rank, t.chunk))]]

    def policy(i: int) -> tuple[list, list]:
        """(saved, re-created in the backward) of layer i."""
        if rc is Recompute.FULL or (rc is Recompute.FIRST_K and i in rank_layers[:first_k]):
            return layer_input, working
        if rc is Recompute.FIRST_K:
            return whole, []
        return kept, (working if rc in (Recompute.OP_SAC, Recompute.SET) else [])

    gather = scalar(lay.zero3 & ~lay.fsdp2_pp) * scalar(
        (lay.layer_params + lay.expert_params) * (lay.gather_bytes_per_param + mem.WEIGHT_BYTES * lay.casts_gathered))
    ugrad = gather and scalar((lay.layer_params + lay.expert_params) * mem.GRAD_BYTES)
    deferred = {(t.microbatch, t.chunk) for t in tasks if t.phase is Phase.WEIGHT}
    # (with torch pipelining's idle receive buffers: the replayed in-flight inputs are counted
    # with their layers)
    events: list[tuple] = [(name, scalar(b)) for name, b in parts.items()]
    # a pipeline that keeps every micro-batch's head output to the step's end (Plan.
    # pp_kept_output_bytes): the replayed micro-batches are the step's last, so the earlier
    # ones' outputs are already kept
    kept_output = plan.pp_kept_output_bytes * logits_el if p > 1 else 0.0
    holds_head = any(int(virtual_stage(where, p, rank, c)) == head_stage for c in range(v))
    if kept_output and holds_head:
        events.append(("kept outputs before the replayed micro-batches", (m_step - m) * kept_output))
    for task in tasks:
        stage = int(virtual_stage(where, p, rank, task.chunk))
        key, chunk = (task.microbatch, task.chunk), layers[stage]
        if task.phase is Phase.FORWARD:
            events += [(("input", key), stage_in)] if stage == 0 else []
            for at, i in enumerate(chunk):
                saved, recreated = policy(i)
                events += _gathered(gather, key, chunk, at)
                events += _forward_layer((key, i), saved, recreated)
            if stage == head_stage:
                events += [(("head inputs", key), scalar(lb.head_inputs))]
                events += [(("loss", key, n), None if b is None else b * logits_el) for n, b in loss_fwd]
                events += [(("kept output", key), kept_output)] if kept_output else []
        elif task.phase is Phase.BACKWARD:
            if stage == head_stage:  # the logits' gradient lives until the head's backward is done
                events += [(("loss", key, n), None if b is None else b * logits_el) for n, b in loss_bwd]
                events += [(("loss", key, "grad"), None), (("head inputs", key), None)]
            for at, i in enumerate(chunk[::-1]):
                saved, recreated = policy(i)
                events += _gathered(gather, ("b",) + key, chunk[::-1], at)
                events += [(("ugrad", key, i), ugrad, COMM_STREAM)] if ugrad else []
                events += _backward_layer((key, i), saved, recreated, key not in deferred, grad_bytes)
                events += [(("ugrad", key, i), None)] if ugrad else []
            events += [(("input", key), None)] if stage == 0 else []
        else:  # the weight pass frees what the split backward kept for it
            events += [(((key, i), "saved", n), None) for i in chunk for n, _ in policy(i)[0]]
    return _balanced(events)


def _balanced(events: list) -> list:
    """The events with every free matched to a live tensor (a loss tensor of zero bytes, e.g.
    no upcast of 32-bit logits, is never allocated, so its free is dropped)."""
    live, out = set(), []
    for event in events:
        key, size = event[0], event[1]
        if size is None:
            if key in live:
                live.discard(key)
                out.append(event)
        elif size > 0.0:
            live.add(key)
            out.append(event)
    return out


def allocator_peaks(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan: Plan, *,
                    expandable: bool) -> AllocatorPeaks:
    """The caching allocator's peak allocated and reserved bytes over one step of the plan's
    worst stage (replay_step over step_events), the GPU's memory as the capacity."""
    return _replay(tuple(step_events(model, workload, plan)), expandable,
                   cluster.gpu.hbm_bytes - cluster.gpu.reserved_bytes)


@functools.lru_cache(maxsize=256)
def _replay(events: tuple, expandable: bool, capacity_bytes: float) -> AllocatorPeaks:
    """replay_step, once per distinct step: the plans a search shows often differ only in
    knobs that move no tensor (overlap, kernels, rank order)."""
    return replay_step(events, expandable=expandable, capacity_bytes=capacity_bytes)

