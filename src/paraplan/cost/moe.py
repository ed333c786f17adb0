"""Mixture-of-experts layer: router, token permutation, grouped expert GEMMs, all-to-all.

Notation (flops.py, plus): E routed experts, k top-k, f_e expert ffn size, f_sh shared
experts' ffn size, ep expert parallel, etp expert tensor parallel, T_r = T/t tokens a rank
routes per micro-batch (sequence parallel splits them over TP; Megatron-Core requires SP
for MoE with TP>1), λ the load factor of the busiest rank: the capacity factor when tokens
are dropped and padded to capacity (GShard, Lepikhin et al. 2021; Switch, Fedus et al.
2022), else the workload's max/mean load imbalance (dropless, MegaBlocks, Gale et al. 2023),
or, for a router as initialized (Workload.moe_routing_at_init), the busiest rank's load under
uniform random routing (random_routing_imbalance: m = E/ep experts a rank, z_n the expected
maximum of n standard normals).

Per MoE layer and micro-batch, on the busiest rank:
  router     GEMM T_r×h×E, softmax/top-k over T_r·E fp32 logits;
  permute    gather the rank's T_r·k token copies in expert order (read + write h elements
             each), unpermute scatters them back (an eager engine's scatter-add at the
             GPU's scatter_add_efficiency); the received copies sorted by local expert and
             unsorted again, one copy each way (Megatron-Core with more than one local
             expert, torchtitan under expert parallelism);
  dispatch   all-to-all of λ·T_r·k·h activation elements over the EP group (stride etp),
             combine the same back (Megatron-Core's alltoall dispatcher: one message per
             copy); or, deduplicated (plan.a2a_hierarchical: the flex dispatcher, DeepEP),
             each of the λ·T_r tokens once per node and GPU it needs, the distinct ones
             fewer than k (units_hit; fewer still under group-limited routing); with
             etp > 1 an all-gather / reduce-scatter of the received tokens inside the ETP
             group (Megatron-Core "parallel folding"); when dropless the per-expert token
             counts exchanged first, and (Megatron-Core's alltoall dispatcher) the copies'
             router probabilities in an all-to-all of their own;
  experts    E/ep local experts, each a GEMM of M_e = λ·etp·ep·T_r·k/E rows against
             h × n_mat·f_e/etp at the efficiency of that size, one launch each (Transformer
             Engine's GroupedLinear issues one cuBLAS GEMM per local expert);
  shared     a dense MLP of f_sh split over TP, like a dense layer's MLP.
Backward: 2× the forward GEMMs, the permutation and all-to-alls once more each.
The dispatch/combine all-to-all is exposed, except behind the shared experts' GEMMs
(Megatron-Core --moe-shared-expert-overlap; not in the eager engines), or, with EP overlap (plan.ep_overlap), behind
the other micro-batch's compute: Megatron-Core's --overlap-moe-expert-parallel-comm merges
the forward of one micro-batch with the backward of another so that each one's all-to-all
runs under the other's compute (DeepSeek-V3 report Sec. 3.2.1, DualPipe's overlap), each
all-to-all under one partner block (ep.py pairs them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..num import Num
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision, Workload
from .comm import Collective, collective_time_s, deduplicated_dispatch_s, group_span
from .low_precision import LOW_PRECISIONS, quantize_bytes_per_element
from .memory import saved_gemm_input_bytes
from .roofline import elementwise_time_s, gemm_time_s, memory_bound_time_s, up_projection_time_s

ROUTER_KERNELS = 6    # router GEMM, softmax, top-k, gather of the probabilities, aux loss, histogram
PERMUTE_KERNELS = 6   # index sort and the gather (permute); scatter-add and the weighting (unpermute)
SORT_KERNELS = 1      # one pass of the received copies into (or out of) local-expert order
COUNT_BYTES = 8.0     # one int64 token count per expert
PROB_BYTES = 2.0      # one router probability per routed copy, in the router's (bf16) dtype
SCORE_PRODUCT_BYTES = 4.0  # an eager engine's score product keeps its fp32 input (torchtitan)


def _f(x):
    return np.asarray(x, dtype=float)


def permutation_pass_bytes(rows, hidden, act_bytes):
    """HBM bytes of one pass of the token permutation over `rows` copies of `hidden` elements:
    each row read once and written once (the gather into expert order, or the scatter back)."""
    return 2.0 * act_bytes * _f(rows) * hidden


def shared_expert_overlap(model: ModelSpec, plan):
    """Whether the shared experts run beside the dispatch/combine all-to-all on Megatron-Core's
    side stream (--moe-shared-expert-overlap, which the Megatron export sets by this test): a
    model with shared experts, an all-to-all (EP > 1) of the alltoall dispatcher (Megatron-Core
    refuses it with the flex dispatcher, plan.a2a_hierarchical), no EP overlap (which pairs whole
    blocks itself), and Megatron's fused layers; the eager engines (plan.fused_kernels off:
    torchtitan, DeepSpeed) run them in line. Vectorized."""
    return (np.asarray(plan.fused_kernels, dtype=bool) & bool(model.shared_expert_ffn_hidden_size)
            & (_f(plan.ep) > 1) & ~np.asarray(plan.ep_overlap, dtype=bool)
            & ~np.asarray(plan.a2a_hierarchical, dtype=bool))


def moe_layers_on_stage(model: ModelSpec, layers_on_stage):
    """MoE layers on the critical pipeline stage: one past the dense leading layers, whose
    share of MoE layers is 1/interval, or all of them when one stage holds the model."""
    if not model.is_moe:
        return np.zeros_like(_f(layers_on_stage))
    return np.minimum(float(model.num_moe_layers), np.ceil(_f(layers_on_stage) / model.moe_layer_interval))


def load_factor(plan, imbalance: Num) -> Num:
    """λ: the busiest rank's routed tokens over the mean (capacity factor if dropping), given
    the dropless `imbalance` (routing_imbalance). A dropless rank that holds every expert
    (EP = 1) runs exactly its own T_r·k copies: 1. A rank receives each token at most
    min(k, E/ep) times, so the imbalance is at most EP (and E/k, which the CLI checks): a
    searched plan of a smaller EP takes min(λ, EP)."""
    cf = _f(plan.capacity_factor_value)
    ep = _f(plan.ep)
    return np.where(cf > 0.0, cf, np.where(ep > 1, np.minimum(_f(imbalance), ep), 1.0))


@lru_cache(maxsize=None)
def expected_max_standard_normal(n: int) -> float:
    """E[max of n independent standard normals]: ∫ x · n φ(x) Φ(x)^(n−1) dx (Tippett 1925; 0.5642
    for 2, 1.0294 for 4, 1.4236 for 8, 1.7660 for 16), by the trapezoid rule on ±12."""
    if n <= 1:
        return 0.0
    x = np.linspace(-12.0, 12.0, 24001)
    phi = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    y = x * n * phi * cdf ** (n - 1)
    return float(np.sum(0.5 * (y[1:] + y[:-1]) * np.diff(x)))  # the trapezoid rule (numpy 1.24 has no trapezoid)


def random_routing_imbalance(model: ModelSpec, ep: Num, routed_tokens: Num) -> Num:
    """λ of a router as initialized, each token's k experts drawn uniformly at random without
    replacement (i.i.d. synthetic tokens through random weights; no load balancing has had to
    act). A rank holding m = E/ep experts receives from each of the group's ep·T tokens a
    hypergeometric number of copies, mean k·m/E and variance k·(m/E)(1 − m/E)(E − k)/(E − 1);
    over the micro-batch its load is about normal, mean T·k and standard deviation σ. The ep
    loads sum to the group's copies, so they are correlated −1/(ep − 1): i.i.d. normals less
    their mean, whose largest sits z_ep·σ·√(ep/(ep − 1)) above the mean (z_n: Tippett's
    expected maximum; at ep = 2 exactly σ·√(2/π), a folded normal). `routed_tokens`: T, the
    tokens an expert-parallel position routes per micro-batch (its ETP group's together: the
    expert's rows are their union). Vectorized over ep and T."""
    E, k = float(model.num_experts), float(model.top_k)
    ep = np.maximum(_f(ep), 1.0)
    T = np.maximum(_f(routed_tokens), 1.0)
    share = 1.0 / ep  # m/E
    per_token_var = k * share * (1.0 - share) * (E - k) / max(E - 1.0, 1.0)
    sigma = np.sqrt(ep * T * per_token_var)
    degrees, at = np.unique(ep, return_inverse=True)  # a plan batch holds few distinct EP degrees
    z = np.array([expected_max_standard_normal(int(d)) for d in degrees])[at].reshape(np.shape(ep))
    sum_fixed = np.sqrt(ep / np.maximum(ep - 1.0, 1.0))
    return 1.0 + z * sum_fixed * sigma / (T * k)


def routing_imbalance(model: ModelSpec, workload: Workload, plan, tokens: Num, tp: Num) -> Num:
    """The dropless imbalance before load_factor's caps: the workload's stated one, or, for a
    router as initialized (Workload.moe_routing_at_init), random_routing_imbalance over the
    tokens an ETP group routes (etp ranks of T/t each, whose union the expert computes)."""
    if not workload.moe_routing_at_init:
        return workload.moe_imbalance
    return random_routing_imbalance(model, plan.ep, _f(plan.etp) * _f(tokens) / _f(tp))


def _routing(model: ModelSpec, workload: Workload, plan, tokens, tp):
    """(λ, T_r, copies, rows): the load factor, tokens a rank routes, the token copies it
    sends (mean), and the token rows through its expert shards (busiest rank)."""
    lam = load_factor(plan, routing_imbalance(model, workload, plan, tokens, tp))
    T_r = _f(tokens) / _f(tp)
    copies = T_r * model.top_k
    return lam, T_r, copies, lam * _f(plan.etp) * copies


def dropless(plan):
    """Whether the plan's MoE routing is dropless (no capacity factor: the busiest expert's rows
    are known only at run time), vectorized."""
    return np.asarray(plan.capacity_factor_value, dtype=float) <= 0.0


def _miss_share(pool, unit, k):
    """C(pool − unit, k) / C(pool, k): the chance that k distinct draws from `pool` items all
    miss a given `unit` of them (hypergeometric). Vectorized."""
    pool, unit = _f(pool), _f(unit)
    p = np.ones(np.broadcast(pool, unit).shape)
    for i in range(int(k)):
        p = p * np.clip((pool - unit - i) / np.maximum(pool - i, 1.0), 0.0, 1.0)
    return p


def units_hit(model: ModelSpec, units):
    """Expected distinct units (EP ranks, or nodes) holding a token's k routed experts, the E
    experts in `units` equal blocks (Megatron-Core gives EP rank r experts r·E/ep onward, and a
    node holds consecutive ranks), routing balanced (each expert equally likely). Without a
    group limit: U·(1 − C(E − E/U, k)/C(E, k)). Group-limited (G groups, M chosen; DeepSeek-V3
    report Sec. 2.1.2): a unit holding whole groups (U ≤ G) is hit when one of the token's M
    groups is its, U·(1 − C(G − G/U, M)/C(G, M)) -- each chosen group taken to hold one of the
    k (the "at most M nodes" of the report: M when a node is a group); a unit inside a group
    among the M·E/G experts of the chosen groups, spanning M·U/G units. Vectorized over U."""
    E, k = float(model.num_experts), model.top_k
    U = _f(units)
    if not model.group_limited:
        return U * (1.0 - _miss_share(E, E / U, k))
    G, M = float(model.expert_groups), model.group_top_k
    whole = U * (1.0 - _miss_share(G, G / np.minimum(U, G), M))
    pool = M * E / G
    inside = (M * U / G) * (1.0 - _miss_share(pool, E / U, k))
    return np.minimum(np.where(U <= G, whole, inside), np.minimum(U, float(k)))


def _dispatch_s(cluster: ClusterSpec, model: ModelSpec, row_bytes, ep, etp, deduplicated):
    """One dispatch (or combine) of a rank's tokens (`row_bytes`, each once) over the EP group
    (stride etp): Megatron-Core's alltoall dispatcher sends each of the k copies on its own, a
    flat NCCL all-to-all of k·row_bytes; where the plan says (plan.a2a_hierarchical: the flex
    dispatcher, DeepEP), each token once per node and GPU it needs (comm.py). Vectorized."""
    flat = collective_time_s(cluster, Collective.ALL_TO_ALL, _f(row_bytes) * model.top_k, ep, etp)
    if not np.any(deduplicated):
        return flat
    g, N, I = group_span(cluster, ep, etp)
    dedup = deduplicated_dispatch_s(cluster, row_bytes, units_hit(model, N * I), units_hit(model, ep), ep, etp)
    return np.where(deduplicated, dedup, flat)


def _permutation_s(gpu, plan, local, copies, act_rows, h, ab):
    """(the permutation's time per pass, of which the sort by local expert) of one MoE layer.

    The rank's own T_r·k copies (every rank routes as many) gathered in expert order and,
    after the combine, scattered back (Megatron-Core permute / unpermute; torchtitan's gather
    and scatter_add), each row read and written once (2 × ab bytes per element). Transformer
    Engine's fused permutation (Megatron) streams both at the copy rate; an eager engine's
    scatter is an index_add_ / scatter_add with atomics (torchtitan's combine, and its
    gather's gradient), at the GPU's measured scatter_add_efficiency
    (calibration/h100_2026-11-23/moe_layer). The received copies, act_rows on the busiest
    rank, sorted by local expert after the dispatch and unsorted before the combine:
    Megatron-Core where a rank holds more than one expert, at any EP (token_dispatcher.py dispatch_postprocess / combine_preprocess,
    sort_chunks_by_idxs), torchtitan under any expert parallelism (its dispatcher's
    _permute / _unpermute); a copy of each row each way. The
    backward runs the same passes the other way round. Vectorized."""
    fused_engine = np.asarray(plan.fused_kernels, dtype=bool)
    own_pass = permutation_pass_bytes(copies, h, ab)
    gather = memory_bound_time_s(gpu, own_pass, PERMUTE_KERNELS / 2)
    atomic = memory_bound_time_s(gpu, own_pass, PERMUTE_KERNELS / 2, gpu.scatter_bw_efficiency)
    sorts = np.where(np.where(fused_engine, local > 1.0, _f(plan.ep) > 1.0), 2.0, 0.0)
    sort = sorts * memory_bound_time_s(gpu, permutation_pass_bytes(act_rows, h, ab), SORT_KERNELS)
    return gather + np.where(fused_engine, gather, atomic) + sort, sort


@dataclass(frozen=True, kw_only=True)
class MoELayerCosts:
    """One MoE layer, one micro-batch, the busiest rank (seconds / bytes)."""

    fwd_compute_s: object      # router, permute, expert GEMMs and activation, shared experts
    bwd_compute_s: object
    wgrad_s: object            # weight-gradient GEMMs inside bwd_compute_s (ZB-H1)
    last_gemm_s: object        # the expert + shared down-projections (skipped by early stop)
    expert_gemm_fwd_s: object  # grouped expert GEMMs alone (for the breakdown)
    imbalance_fwd_s: object    # part of the forward expert time due to λ > 1
    shared_up_s: object        # shared experts' column-parallel GEMM (TP async backward, TP overlap)
    shared_down_s: object      # shared experts' row-parallel GEMM (TP overlap)
    a2a_fwd_s: object          # dispatch + combine (+ ETP gather/scatter), full time
    a2a_fwd_exposed_s: object
    a2a_bwd_s: object
    a2a_bwd_exposed_s: object
    activation_bytes: object   # stored for backward (no recomputation)
    act_fn_out_bytes: object   # of which the experts' activation-function outputs
    act_fn_fwd_s: object       # the experts' activation function (what moe_act re-runs)
    sort_s: object             # received copies sorted by local expert and back, one pass (in fwd and bwd)


def moe_layer_costs(model: ModelSpec, cluster: ClusterSpec, workload: Workload, plan, tokens, tp,
                    prec: Precision) -> MoELayerCosts:
    """Costs of one MoE layer for `tokens` tokens per rank before the TP/SP split."""
    gpu = cluster.gpu
    h, E, fe, fsh = model.hidden_size, model.num_experts, model.moe_ffn_hidden_size, model.shared_expert_ffn_hidden_size
    n_up = model.num_mlp_matrices - 1  # gate + up (gated) or up
    t = _f(tp)
    ep, etp = _f(plan.ep), _f(plan.etp)
    lam, T_r, copies, act_rows = _routing(model, workload, plan, tokens, tp)
    ab = prec.activation_bytes  # bytes per activation element

    router_gemm = gemm_time_s(gpu, T_r, E, h, Precision.BF16)
    router_ew = elementwise_time_s(gpu, 3.0 * 4.0 * T_r * E, ROUTER_KERNELS - 1)
    fused_engine = np.asarray(plan.fused_kernels, dtype=bool)
    local = E / ep
    permute, sort = _permutation_s(gpu, plan, local, copies, act_rows, h, ab)

    m_e = lam * etp * ep * copies / E
    # the gate and up projections as one GEMM of n_up·f, or apart (plan.fused_kernels off:
    # torchtitan's grouped experts and shared experts keep w1 and w3 apart), two GEMMs of f
    fused = plan.fused_kernels

    def up_gemm(rows, width):
        return up_projection_time_s(gpu, rows, width, h, prec, n_up, fused)
    g_up1 = up_gemm(m_e, fe / etp)
    g_down1 = gemm_time_s(gpu, m_e, h, fe / etp, prec)
    g_up = local * g_up1
    g_down = local * g_down1
    experts = g_up + g_down
    # the same grouped GEMMs at λ = 1: what balance would save
    m_1 = etp * ep * copies / E
    experts_1 = local * (up_gemm(m_1, fe / etp) + gemm_time_s(gpu, m_1, h, fe / etp, prec))
    act_ew = elementwise_time_s(gpu, ab * act_rows * (n_up + 1) * fe / etp, 1)

    if fsh:
        sh_up = up_gemm(_f(tokens), fsh / t)
        sh_down = gemm_time_s(gpu, _f(tokens), h, fsh / t, prec)
        sh_ew = elementwise_time_s(gpu, ab * _f(tokens) * (n_up + 1) * fsh / t, 1)
    else:
        sh_up = sh_down = sh_ew = 0.0
    # Transformer Engine casts each expert and shared-expert GEMM input to FP8 (read 2 B,
    # write 1 B) or NVFP4, as for dense layers (layer_compute.py; low_precision.py)
    quantized = quantize_bytes_per_element(prec) * (act_rows * (h + fe / etp) + _f(tokens) * fsh / t)
    cast = memory_bound_time_s(gpu, quantized, 0) if prec in LOW_PRECISIONS else 0.0

    fwd = router_gemm + router_ew + permute + experts + act_ew + sh_up + sh_down + sh_ew + cast
    gemms_bwd = 2.0 * (experts + sh_up + sh_down + router_gemm)
    bwd = gemms_bwd + permute + 2.0 * act_ew + 2.0 * sh_ew + router_ew + 2.0 * cast
    wgrad = experts + sh_up + sh_down + router_gemm

    # ---- all-to-all dispatch and combine over EP (stride etp), ETP gather/scatter ----
    a2a_bytes = ab * lam * copies * h
    hier = np.asarray(plan.a2a_hierarchical, dtype=bool)
    a2a = _dispatch_s(cluster, model, ab * lam * T_r * h, ep, etp, hier)
    etp_bytes = etp * a2a_bytes
    etp_comm = (collective_time_s(cluster, Collective.ALL_GATHER, etp_bytes, etp, 1)
                + collective_time_s(cluster, Collective.REDUCE_SCATTER, etp_bytes, etp, 1))
    # before the dispatch the ranks exchange their per-expert token counts (Megatron-Core's
    # preprocess all-gathers them over the EP×ETP group, torchtitan all-to-alls them), and
    # Megatron-Core sends each copy's router probability in an all-to-all of its own
    # (token_dispatch: global_probs), forward and backward: small, mostly latency
    counts = np.where(dropless(plan), collective_time_s(cluster, Collective.ALL_GATHER, COUNT_BYTES * E, ep * etp, 1), 0.0)
    # (the flex dispatcher carries the probabilities with the tokens)
    probs = np.where(fused_engine & ~hier, collective_time_s(cluster, Collective.ALL_TO_ALL, PROB_BYTES * lam * copies,
                                                              ep, etp), 0.0)
    a2a_bwd = 2.0 * a2a + etp_comm + probs
    a2a_fwd = a2a_bwd + counts
    shared = np.where(shared_expert_overlap(model, plan), sh_up + sh_down, 0.0)
    a2a_fwd_exp = np.maximum(a2a_fwd - shared, 0.0) if fsh else a2a_fwd
    a2a_bwd_exp = np.maximum(a2a_bwd - 2.0 * shared, 0.0) if fsh else a2a_bwd

    stored, act_out = moe_activation_bytes(model, workload, plan, tokens, tp, prec)
    return MoELayerCosts(
        act_fn_out_bytes=act_out, act_fn_fwd_s=act_ew, sort_s=sort,
        fwd_compute_s=fwd, bwd_compute_s=bwd, wgrad_s=wgrad, last_gemm_s=g_down + sh_down,
        expert_gemm_fwd_s=experts, imbalance_fwd_s=experts - experts_1, shared_up_s=sh_up, shared_down_s=sh_down,
        a2a_fwd_s=a2a_fwd, a2a_fwd_exposed_s=a2a_fwd_exp, a2a_bwd_s=a2a_bwd, a2a_bwd_exposed_s=a2a_bwd_exp,
        activation_bytes=stored)


def moe_activation_bytes(model: ModelSpec, workload: Workload, plan, tokens, tp, prec: Precision):
    """(stored bytes, of which the experts' activation-function outputs) of one MoE layer
    and micro-batch on the busiest rank: router probabilities (fp32), the experts' permuted
    input, activation input and output, and, in an eager engine, an fp32 copy of the rank's
    own T_r·k routed rows that its score product keeps for the backward (torchtitan weights
    them by the router scores in fp32, before the experts up to 0.2, after the combine in
    0.3: token_dispatcher.py `routed_output.to(torch.float32) * scores`); Megatron-Core
    applies the probabilities inside the experts' activation (experts.py,
    weighted_bias_swiglu_impl) and its combine (unpermute without probabilities, a scatter)
    keeps no expert output. Shared experts like a dense MLP of
    f_sh (the layer's input after its norm is counted with the dense terms, memory.py).
    GEMM inputs are saved quantized under FP8 and NVFP4 training."""
    h, E, fe = model.hidden_size, model.num_experts, model.moe_ffn_hidden_size
    fsh = model.shared_expert_ffn_hidden_size
    n_up = model.num_mlp_matrices - 1
    t, etp = _f(tp), _f(plan.etp)
    ab = prec.activation_bytes
    lam, T_r, copies, act_rows = _routing(model, workload, plan, tokens, tp)
    gi = saved_gemm_input_bytes(prec)
    weighted_input = np.where(np.asarray(plan.fused_kernels, dtype=bool), 0.0, SCORE_PRODUCT_BYTES * copies * h)
    routed = (4.0 * 2.0 * T_r * E
              + act_rows * (gi * h + (ab * n_up * fe + gi * fe) / etp)
              + weighted_input)
    shared_act = _f(tokens) * (ab * n_up * fsh + gi * fsh) / t
    return routed + shared_act, act_rows * gi * fe / etp
