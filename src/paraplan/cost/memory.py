"""Memory per GPU: model states (Rajbhandari et al., ZeRO) and activations (Korthikanti
et al. 2022, Table 2), generalized to GQA, gated MLPs and FlashAttention.

Notation: s sequence, b micro-batch, h hidden, f ffn hidden, a heads, d head dim,
k·d kv width, t TP, c CP, p PP, v virtual stages, L_s = l/p layers per stage.

Activations of one layer per token (16-bit, bytes), Korthikanti Sec. 4.1 term by term:
  replicated across TP unless SP:  4h (two norm inputs) + 2h (QKV input) + 2h (MLP input)
                                   + 2h (two dropout masks, 1 byte each, if dropout)
  split by TP:  2(a·d + 2k·d) (Q, K, V) + 2a·d (attention output = out-proj input)
                + 2f·(2 if gated else 1) (activation input) + 2f (activation output)
  scores (no FlashAttention, no selective recompute): 5·a·s with dropout (softmax output,
          dropout mask and output), 2·a·s without (the softmax output), split by TP.
For MHA, f = 4h, dropout this is 34 + 5as/h per s·b·h: Korthikanti Eq. (2).
Selective recomputation drops the scores; full recomputation keeps only the layer input
2h (split by TP with SP).
FP8 (Transformer Engine): a linear layer saves its input already cast to FP8 for the
weight-gradient GEMM, 1 byte instead of 2, where that input is not kept in 16 bits by
another op anyway: the QKV and MLP inputs (norm outputs) and the down-projection input; the
attention output stays 16-bit (FlashAttention keeps it). NVFP4 saves the column-wise FP4 copy
(0.5625 bytes) in the same places; its BF16 first and last layers save 16 bits (bf16_layers.py).
An eager PyTorch layer (plan.fused_kernels off: torchtitan, Hugging Face, paraplan run) also
keeps SiLU's output (+2f, gated MLPs) and its loss holds 12 bytes per logit; under
torch.autocast (plan.autocast) the two norm inputs are fp32 (+4h) and each separate linear
saves its own cast of its input (+6h). Measured on an H100 (docs/model.md, "Eager layers and
autocast"; calibration/h100_2026-11-22).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plan.axes import AttentionKernel, Recompute, RecomputeOp, Schedule
from ..specs.model import ModelSpec
from ..specs.workload import Precision
from .low_precision import LOW_PRECISIONS, gemm_operand_bytes

# Mixed-precision Adam bytes per parameter (Rajbhandari et al. 2020, Sec. 3.1): 2 (16-bit
# weights) + 12 (fp32 master weights, momentum, variance). Gradients are accumulated in
# fp32 (Megatron main_grad; FSDP's default reduce dtype): 4 bytes.
WEIGHT_BYTES = 2.0
ACT_BYTES = 2.0  # 16-bit activations on the wire and in HBM (Precision.activation_bytes: 4 under fp32/tf32)
MASTER_BYTES = 4.0  # one fp32 copy (the master weights; FSDP fp32 shards)
OPTIMIZER_BYTES = 12.0
GRAD_BYTES = 4.0


# Eager cross-entropy, F.cross_entropy(logits.float(), ...) (torchtitan components/loss.py,
# paraplan run): the backward of log-softmax holds its fp32 output, the incoming gradient and
# the input gradient at once, 12 bytes per logit whatever the logits' dtype. Measured on an
# H100: 14.0 bytes per logit with the 16-bit logits also held (calibration/h100_2026-11-22,
# gpu_probe.json; the run drops them after the upcast).
EAGER_LOSS_BYTES = 12.0
# ... and its forward peak: the 16-bit logits, their fp32 upcast and the log-softmax output
# at once (2 + 4 + 4 bytes per logit)
EAGER_LOSS_FWD_BYTES = 10.0
# The eager loss over a vocabulary split by TP, op by op (Plan.loss_parallel): torch's
# loss_parallel (torch/distributed/tensor/parallel/loss.py: _log_softmax,
# _nll_loss_and_log_softmax_backward; torchtitan up to 0.2, paraplan run) and torchtitan 0.3's
# _LossParallelCrossEntropy (components/loss.py) compute log-softmax and NLL as separate ops
# on the fp32 shard and save the log-probabilities. Its
# backward holds the saved log-softmax output, the zero-filled target gradient, exp of the
# output and their sum at once, 4 x 4 bytes per logit (its forward 14: the 16-bit logits,
# their upcast, the shifted logits and their exponentials; the growth is eager's 2 bytes).
EAGER_LOSS_PARALLEL_BYTES = 16.0
# Compiled cross-entropy (torchtitan's loss under torch.compile, Plan.compiled_loss): inductor
# fuses the upcast, log-softmax and NLL, so no fp32 copy is kept; the backward holds the
# 16-bit logits it saved and writes their 16-bit gradient (2 + 2 bytes per logit), the
# forward the logits alone. Checked against torchtitan's peak reserved memory of 2025 runs,
# docs/model/memory.md.
def compiled_loss_bytes(precision) -> tuple[float, float]:
    """(forward, backward) bytes per logit a compiled cross-entropy holds."""
    return _width(precision), 2.0 * _width(precision)


AUTOCAST_RESIDUAL_BYTES = 4.0  # the residual stream under torch.autocast stays fp32


def compiled_blocks(plan):
    """Whether the plan's transformer blocks run under torch.compile: an eager engine's
    (plan.fused_kernels off) with plan.compiled. Vectorized."""
    return np.asarray(plan.compiled, dtype=bool) & ~np.asarray(plan.fused_kernels, dtype=bool)


def residual_bytes_per_element(act_bytes, autocast):
    """Bytes per element of the residual stream (a layer's input as kept): the activation
    width, and fp32 at least under torch.autocast (plan.autocast). Vectorized over both."""
    return np.where(np.asarray(autocast, dtype=bool), np.maximum(act_bytes, AUTOCAST_RESIDUAL_BYTES), act_bytes)


def logits_bytes_per_element(precision, fused=True, compiled=False, parallel=False):
    """Cross-entropy over V/t logits per token. Fused (Megatron's vocab-parallel kernel):
    the logits in the activation dtype plus the fp32 softmax (6 bytes with 16-bit logits, 8
    with 32-bit); eager: EAGER_LOSS_BYTES, EAGER_LOSS_PARALLEL_BYTES op by op over TP
    (`parallel`, the Layout's loss_parallel); eager under torch.compile (`compiled`, the
    Layout's compiled_loss): compiled_loss_bytes. Vectorized."""
    eager_bytes = np.where(np.asarray(parallel, dtype=bool), EAGER_LOSS_PARALLEL_BYTES, EAGER_LOSS_BYTES)
    eager = np.where(np.asarray(compiled, dtype=bool), compiled_loss_bytes(precision)[1], eager_bytes)
    return np.where(np.asarray(fused, dtype=bool), _width(precision) + 4.0, eager)


def _width(precision) -> float:
    return Precision(precision).activation_bytes if precision is not None else ACT_BYTES


@dataclass(frozen=True, kw_only=True)
class ActivationTerms:
    """Bytes per token of one layer, by how TP/SP split them."""

    replicated: float  # divided by t only with sequence parallelism
    split: float       # always divided by t
    scores: float      # 5·a·s (2·a·s without dropout), present without FlashAttention and without selective
    layer_input: float  # 2h, what full recomputation keeps
    # what module recomputation (Recompute.MODULES) drops from `replicated` and `split`:
    # the two norms' outputs (the QKV and MLP inputs), and with MLA the up-projected Q, K, V
    # less the latents kept in their place
    modules_replicated: float = 0.0
    modules_split: float = 0.0
    # an eager layer (plan.fused_kernels off) beyond the fused one: SiLU's output, kept for
    # the product's backward beside SiLU's input (split by TP)
    eager_split: float = 0.0
    # under torch.autocast (plan.autocast): the two norm inputs in fp32 rather than 16 bits,
    # and the casts each linear layer makes of its input -- with separate projections, two
    # more of the QKV input and one more of a gated MLP's input (replicated unless SP)
    autocast_replicated: float = 0.0
    autocast_casts: float = 0.0
    # the QKV and dense-MLP inputs, part of `replicated`: under eager sequence parallelism
    # (DTensor's PrepareModuleInput) each projection saves its all-gathered input, whole,
    # where Megatron saves the sequence shard and gathers it again in the backward
    gemm_inputs: float = 0.0


def saved_gemm_input_bytes(precision) -> float:
    """Bytes per element of a GEMM input saved for backward (FP8: the cast copy, 1 byte;
    NVFP4: the column-wise copy the weight-gradient GEMM reads, 0.5625 bytes)."""
    return gemm_operand_bytes(precision) if precision in LOW_PRECISIONS else _width(precision)


def activation_terms(model: ModelSpec, seq_len, mlp_weight=1.0, precision=None) -> ActivationTerms:
    """`mlp_weight`: share of the layers with a dense MLP (MoE layers add their own, moe.py)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    w = np.asarray(mlp_weight, dtype=float)
    gi = saved_gemm_input_bytes(precision)
    a = _width(precision)  # bytes per activation element (Korthikanti et al. count 2)
    # norm inputs 2·2h; QKV input; MLP input (an MoE layer's router/expert input is moe.py's);
    # dropout masks 1 byte per element; MLA (DeepSeek-V2 Sec. 2.1): the pre-norm latents c_Q,
    # c_KV and the shared RoPE key, and the normed latents the up-projections read
    mla = (a * model.mla_latent_width + gi * (model.q_lora_rank + model.kv_lora_rank)) if model.is_mla else 0.0
    replicated = (2.0 * a * h + gi * h + w * gi * h + (1.0 - w) * a * h + (2.0 * h if model.dropout else 0.0)
                  + mla)
    act_in = a * f * (2 if model.gated_mlp else 1)
    split = (a * (model.q_dim + model.kv_pair_dim) + a * model.v_dim
             + w * (act_in + gi * f))
    # unfused attention (Korthikanti et al. Sec. 4.1): the softmax output (a bytes per score),
    # and with attention dropout its mask (1 byte) and output (a bytes): 5·a·s at 16 bits.
    # Without dropout the attention-over-values GEMM saves the softmax output itself, 2·a·s
    # at 16 bits (the pre-softmax scores are not kept: the fused scale-mask-softmax saves its
    # output)
    per_score = (2.0 * a + 1.0) if model.dropout else a
    scores = per_score * model.num_heads * np.asarray(seq_len, dtype=float)
    # module recomputation drops the outputs of the norms Megatron-Core runs as separate
    # modules: MLA's input norm and an MoE layer's pre-MLP norm. Transformer Engine fuses the
    # other norms into the next linear layer (LayerNormLinear / LayerNormMLP), and a fused
    # norm is not recomputed (Megatron-Core transformer_layer.py, gpt_layer_specs.py).
    norm_outputs = (gi * h if model.is_mla else 0.0) + (1.0 - w) * a * h
    mla_qkv = a * (model.q_dim + model.kv_pair_dim) if model.is_mla else 0.0
    return ActivationTerms(replicated=replicated, split=split, scores=scores, layer_input=a * h,
                           modules_replicated=norm_outputs, modules_split=mla_qkv,
                           eager_split=w * a * f if model.gated_mlp else 0.0,
                           autocast_replicated=2.0 * float(residual_bytes_per_element(a, True) - a) * h,
                           # one cast per input projection beyond the first: wk, wv (MLA's
                           # kv_a beside q_a: one) and a gated MLP's w3 (none for GELU's w1);
                           # none at 32 bits (nothing to cast)
                           autocast_casts=((2.0 if not model.is_mla else 1.0) + w * (model.num_mlp_matrices - 2)) * a * h
                           if a < AUTOCAST_RESIDUAL_BYTES else 0.0,
                           gemm_inputs=gi * h + w * gi * h)


# torchtitan's per-op checkpointing (distributed/activation_checkpoint.py): the ops whose
# outputs it saves are matmuls (every other one, counted in the order a layer runs them), the
# attention kernel, the TP reduce-scatters and max; everything else is re-run in the backward
OP_SAC_LSE_BYTES = 4.0  # the attention kernel's saved log-sum-exp, fp32 per head and token
ATTENTION_MATMULS = 4   # wq, wk, wv, wo: a layer's matmuls before its MLP's


def op_sac_keeps_matmul(index: int) -> bool:
    """Whether the per-op policy keeps a layer's matmul at 0-based `index` in the order the
    layer runs them: the 1st, 3rd, 5th, ... (its counter restarts in every layer's checkpoint)."""
    return index % 2 == 0


def op_sac_matmuls(model: ModelSpec, t, kept: bool):
    """(the attention's, a dense MLP's) matmuls torchtitan's per-op checkpointing keeps the
    outputs of (`kept`) or re-runs, as (output width, inner width) per token, each split over
    TP as it runs (a row-parallel output, a partial sum before its reduce-scatter, whole). A
    layer runs [wq, wk, wv, wo] then [w1, (w3), w2]; the policy keeps the 1st, 3rd, 5th, ...
    (its counter restarts in every layer's checkpoint), so an MoE layer, whose routed experts
    are no such matmuls, keeps the attention's alike."""
    h, f = model.hidden_size, model.ffn_hidden_size
    attn = [(model.q_dim / t, h), (model.kv_dim / t, h), ((model.kv_pair_dim - model.kv_dim) / t, h),
            (h, model.v_dim / t)]
    mlp = [(f / t, h)] * (model.num_mlp_matrices - 1) + [(h, f / t)]
    return ([m for i, m in enumerate(attn) if op_sac_keeps_matmul(i) is kept],
            [m for i, m in enumerate(mlp, start=ATTENTION_MATMULS) if op_sac_keeps_matmul(i) is kept])


def op_sac_bytes_per_token(model: ModelSpec, plan, mlp_weight, residual_bytes):
    """Bytes one layer keeps per token of the micro-batch under torchtitan's per-op
    checkpointing (Recompute.OP_SAC), on one TP rank: the layer's input (the checkpoint's,
    sequence-split under SP), the kept matmuls' outputs (op_sac_matmuls), the attention output
    with its log-sum-exp (where the save list names the kernel: Plan.op_sac_attention_kept),
    and under SP the two reduce-scatters' outputs. Under torch.compile (compiled_blocks) the
    partitioner saves only what the backward reads: the MLP's down-projection output and its
    reduce-scatter's feed the residual add alone and are not kept (one block on a CPU,
    calibration/cpu_compile_op_sac.json). An MoE layer's routed experts are priced as before
    (moe.py). 16-bit outputs. Vectorized."""
    h = model.hidden_size
    t = np.asarray(plan.tp, dtype=float)
    sp = np.asarray(plan.sequence_parallel, dtype=bool)
    sp_div = np.where(sp, t, 1.0)
    attn, mlp = op_sac_matmuls(model, t, kept=True)
    w = np.asarray(mlp_weight, dtype=float)
    # the down-projection, the layer's last matmul, where the policy keeps it; compiled, not (above)
    down_out = w * mlp[-1][0] if op_sac_keeps_matmul(ATTENTION_MATMULS + model.num_mlp_matrices - 1) else 0.0
    compiled = compiled_blocks(plan)
    outputs = sum(out for out, _ in attn) + w * sum(out for out, _ in mlp) - np.where(compiled, down_out, 0.0)
    a = WEIGHT_BYTES
    scatters = np.where(compiled, 1.0, 2.0)
    attention = np.where(np.asarray(plan.op_sac_attention_kept, dtype=bool),
                         a * model.v_dim / t + OP_SAC_LSE_BYTES * model.num_heads / t, 0.0)
    return (np.asarray(residual_bytes, dtype=float) * h / sp_div + a * outputs + attention
            + np.where(sp & (t > 1), scatters * a * h / t, 0.0))


def eager_sp_whole_share(plan):
    """What a projection's saved input holds beyond its sequence shard (1/SP divisor): under an
    eager engine's SP (DTensor) it saves the all-gathered input whole, 1 − 1/sp; Megatron
    saves the shard and gathers it again in the backward, 0. Vectorized."""
    sp_div = np.where(np.asarray(plan.sequence_parallel), np.asarray(plan.tp, dtype=float), 1.0)
    return np.where(~np.asarray(plan.fused_kernels, dtype=bool), 1.0 - 1.0 / sp_div, 0.0)


def _layer_flags(plan):
    """(t, SP divisor, eager, autocast, eager SP's whole-input share, SiLU output kept) of plans."""
    t = np.asarray(plan.tp, dtype=float)
    sp_div = np.where(np.asarray(plan.sequence_parallel), t, 1.0)
    eager = ~np.asarray(plan.fused_kernels, dtype=bool)
    # eager SP keeps the projections' gathered inputs (and autocast's casts of them) whole
    whole = eager_sp_whole_share(plan)
    # SiLU's output beside its input: eager only; a compiled block keeps what a fused one does
    # (one H100: 20.27 -> 16.77 elements per token per hidden unit at Llama 3 8B's block, exactly
    # 2f/h bytes less; calibration/h100_2026-11-23)
    return t, sp_div, eager, np.asarray(plan.autocast, dtype=bool), whole, eager & ~compiled_blocks(plan)


def holds(ops_code, op: RecomputeOp):
    """Whether the sets of `ops_code` (RecomputeOps codes; vectorized) hold `op`."""
    return (np.asarray(ops_code, dtype=np.int64) >> op.code) & 1 == 1


def recompute_op_bytes_per_token(model: ModelSpec, plan, seq_len, mlp_weight=1.0, precision=None) -> dict:
    """What each tensor of plan/axes.py RecomputeOp holds per token on one rank, the terms of
    `activation_terms` as layer_activation_bytes splits them (vectorized): together they are all
    a layer keeps without recomputation less its input, what full recomputation keeps
    (docs/model/memory.md, "Searched recomputation"). A dense, non-MLA layer's."""
    return _op_bytes(model, plan, activation_terms(model, seq_len, mlp_weight, precision), _layer_flags(plan),
                     mlp_weight, precision)


def _op_bytes(model: ModelSpec, plan, terms: ActivationTerms, flags: tuple, mlp_weight, precision) -> dict:
    t, sp_div, eager, autocast, whole, silu_out = flags
    h, f, w = model.hidden_size, model.ffn_hidden_size, np.asarray(mlp_weight, dtype=float)
    a, gi = _width(precision), saved_gemm_input_bytes(precision)
    casts = np.where(autocast & eager, 1.0, 0.0)
    casts_qkv = 2.0 * a * h if a < AUTOCAST_RESIDUAL_BYTES else 0.0  # (wk's and wv's casts of the QKV input)
    casts_mlp = terms.autocast_casts - casts_qkv

    def norm_output(gemm_input, replicated_extra=0.0):
        return (gemm_input + replicated_extra) / sp_div + whole * gemm_input

    return {
        RecomputeOp.LN1: norm_output(gi * h + casts * casts_qkv),
        RecomputeOp.QKV: a * (model.q_dim + model.kv_pair_dim) / t,
        RecomputeOp.SCORES: np.where(np.asarray(plan.attention_code) == AttentionKernel.UNFUSED.code,
                                     terms.scores / t, 0.0),
        RecomputeOp.ATTN: a * model.v_dim / t,
        # the second norm's input (fp32 under autocast: half of autocast_replicated) and the masks
        RecomputeOp.RESID: (a * h + (2.0 * h if model.dropout else 0.0)
                            + np.where(autocast, terms.autocast_replicated / 2.0, 0.0)) / sp_div,
        RecomputeOp.LN2: norm_output(w * gi * h + casts * casts_mlp, (1.0 - w) * a * h),
        RecomputeOp.UP: w * a * f * (2 if model.gated_mlp else 1) / t,
        RecomputeOp.ACT: (w * gi * f + np.where(silu_out, terms.eager_split, 0.0)) / t,
    }


def layer_activation_bytes(model: ModelSpec, plan, seq_len, *, recompute_code, mlp_weight=1.0, extra_bytes=0.0,
                           modules_extra_saving=0.0, precision=None):
    """Stored activation bytes of one layer for one micro-batch (vectorized over plans).

    `extra_bytes`: per layer and micro-batch, kept unless the layer is fully recomputed
    (the routed-expert activations of MoE layers, averaged over the stage), less
    `modules_extra_saving` under module recomputation (their activation-function outputs)."""
    terms = activation_terms(model, seq_len, mlp_weight, precision)
    tokens = np.asarray(plan.micro_batch_size, dtype=float) * seq_len / np.asarray(plan.cp)
    flags = _layer_flags(plan)
    t, sp_div, eager, autocast, whole, silu_out = flags
    base = (terms.replicated / sp_div + terms.split / t + np.where(silu_out, terms.eager_split / t, 0.0)
            + np.where(autocast, (terms.autocast_replicated + np.where(eager, terms.autocast_casts, 0.0)) / sp_div,
                       0.0)
            + whole * (terms.gemm_inputs + np.where(autocast & eager, terms.autocast_casts, 0.0)))
    unfused = np.asarray(plan.attention_code) == AttentionKernel.UNFUSED.code
    scores = np.where(unfused, terms.scores / t, 0.0)
    none = tokens * (base + scores) + extra_bytes
    selective = tokens * base + extra_bytes
    modules = (tokens * (base - terms.modules_replicated / sp_div - terms.modules_split / t)
               + extra_bytes - modules_extra_saving)
    residual = residual_bytes_per_element(_width(precision), autocast)
    full = tokens * (residual * model.hidden_size) / sp_div
    op_sac = tokens * op_sac_bytes_per_token(model, plan, mlp_weight, residual) + extra_bytes
    rc = np.asarray(recompute_code)
    if np.any(rc == Recompute.SET.code):  # (a searched set drops its tensors of what none keeps)
        ops = np.asarray(plan.recompute_ops_code)
        dropped = sum(np.where(holds(ops, op), b, 0.0) for op, b in
                      _op_bytes(model, plan, terms, flags, mlp_weight, precision).items())
        op_sac = np.where(rc == Recompute.SET.code, none - tokens * dropped, op_sac)
    stored = np.where(rc == Recompute.FULL.code, full,
                      np.where(rc == Recompute.SELECTIVE.code, selective,
                               np.where(rc == Recompute.MODULES.code, modules,
                                        np.where((rc == Recompute.OP_SAC.code) | (rc == Recompute.SET.code),
                                                 op_sac, none))))
    return stored, none, selective


def inflight_microbatches(plan, num_microbatches, rank=0):
    """Micro-batches whose activations pipeline rank `rank` holds at its peak (in whole-stage
    units; `rank` may be an array, e.g. pp - 1 for the last stage), as the event simulator
    measures them (sim/engine.py, SimResult.peak_inflight; tests/test_pipeline_schedule_costs.py):

    1F1B: p − r (Narayanan et al. SC'21 Sec. 2.2.1); ZB-H1: p on every rank, the W passes
    holding what rank 0 frees in 1F1B (Qi et al. 2024 Sec. 3.1); interleaved 1F1B: a warm-up
    of 2(p−r−1) + (v−1)p + 1 chunks of 1/v stage each, p·(1 + (p−1)/(p·v)) on rank 0
    (Korthikanti et al. Sec. 4.2.3), every micro-batch on a rank whose warm-up covers all
    m·v chunk-forwards (Megatron-Core 0.16.1 pipeline_parallel/schedules.py
    get_pp_rank_microbatches; torch.distributed.pipelining's Interleaved1F1B caps the same
    count: per rank, so at m = p rank 0 runs every forward first and the last rank does not);
    ZB-V: (m + r + 1)/2 up to p, two half-stage chunks per micro-batch in its
    V (torch's order; p on every rank once m ≥ 2p − 1, 1F1B's peak, as Qi et al. 2024 Sec. 6
    design it); DualPipeV: p + 1/2 on every rank, 2p + 1 half-stage chunks (DeepSeek-AI 2024
    Table 2: PP + 1 chunks; the pair holds the forward's and the backward's at once; m ≥ 2p);
    GPipe and breadth-first: m. Never more than m; p = 1: one.
    """
    p = np.asarray(plan.pp, dtype=float)
    v = np.asarray(plan.vp, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    r = np.asarray(rank, dtype=float)
    sc = np.asarray(plan.schedule_code)
    one_f_one_b = np.minimum(p - r, m)
    interleaved = np.minimum(m, (2.0 * (p - r - 1.0) + (v - 1.0) * p + 1.0) / v)
    out = np.where((sc == Schedule.INTERLEAVED_1F1B.code) & (v > 1), interleaved, one_f_one_b)
    out = np.where(sc == Schedule.ZERO_BUBBLE.code, np.minimum(p, m), out)
    out = np.where(sc == Schedule.ZERO_BUBBLE_V.code, np.minimum(np.minimum(p, m), (m + r + 1.0) / 2.0), out)
    out = np.where(sc == Schedule.DUAL_PIPE_V.code, np.minimum(p + 0.5, m), out)
    out = np.where(_forwards_first(plan, m, r), m, out)
    return np.where(p > 1, out, 1.0)


def _forwards_first(plan, m, rank):
    """Whether pipeline rank `rank` runs every forward before any backward: under GPipe and
    breadth-first, and under interleaved 1F1B where its warm-up, 2(p−r−1) + (v−1)p
    chunk-forwards, covers all m·v of them (Megatron-Core's are_all_microbatches_in_warmup)."""
    sc = np.asarray(plan.schedule_code)
    p, v = np.asarray(plan.pp, dtype=float), np.asarray(plan.vp, dtype=float)
    warmup = 2.0 * (p - np.asarray(rank, dtype=float) - 1.0) + (v - 1.0) * p
    return ((sc == Schedule.GPIPE.code) | (sc == Schedule.BREADTH_FIRST.code)
            | ((sc == Schedule.INTERLEAVED_1F1B.code) & (v > 1) & (warmup >= m * v)))


def inflight_logits(plan, num_microbatches):
    """Micro-batches whose loss state (logits and softmax) the last stage holds at once: the
    forwards its last model chunk has run and not yet back-propagated. GPipe and breadth-first
    run every forward first (m), and so does interleaved 1F1B where the last rank's warm-up,
    (v−1)p chunk-forwards, covers all m·v; 1F1B, ZB-H1, ZB-V and interleaved 1F1B otherwise
    start each last-chunk backward right after its forward (one). Read off the schedules'
    task order (sim/schedules.py; tests/test_pipeline_schedule_costs.py)."""
    p = np.asarray(plan.pp, dtype=float)
    m = np.asarray(num_microbatches, dtype=float)
    return np.where((p > 1) & _forwards_first(plan, m, p - 1.0), m, np.minimum(m, 1.0))


def fits(cluster, device_bytes, host_bytes):
    """Whether a plan fits: its worst stage in the GPU's usable memory and what it keeps in
    host DRAM (offloaded optimizer states) in the GPU's share of its host's memory, when
    the cluster states it. Vectorized."""
    return (np.asarray(device_bytes) <= cluster.gpu.hbm_bytes) & cluster.host_memory_holds(np.asarray(host_bytes))
