"""torchtitan's per-op selective checkpointing (Recompute.OP_SAC): what it keeps, what it costs,
where it is allowed, and paraplan run's implementation of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paraplan.cost.estimate import estimate
from paraplan.cost.memory import op_sac_bytes_per_token
from paraplan.plan.axes import Recompute, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import SpaceLimits, check_plan, enumerate_space
from paraplan.run.checkpointing import op_sac_saved_ops, op_sac_context
from paraplan.run.model import Block, rope_tables
from paraplan.specs.catalog import load_cluster
from paraplan.specs.model import ModelSpec
from paraplan.specs.workload import Workload

SMALL = ModelSpec(name="sac-test", num_layers=2, hidden_size=256, ffn_hidden_size=768, num_heads=8,
                  num_kv_heads=2, head_dim=32, vocab_size=1000)


class _Outputs(TorchDispatchMode):
    """Every op a forward runs, in order, with the bytes of its first output."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[object, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        first = out[0] if isinstance(out, (tuple, list)) else out
        nbytes = first.numel() * first.element_size() if isinstance(first, torch.Tensor) else 0
        self.ops.append((func, nbytes))
        return out


@pytest.mark.parametrize("gated", [True, False])
def test_op_sac_keeps_what_the_policy_saves_of_the_block_paraplan_runs(gated):
    """The bytes the model says a layer keeps per token equal the block's input plus the
    outputs the per-op policy marks to save, read off the ops the block really runs (the
    order of its matmuls, their shapes, the attention kernel) -- in fp32, as on a CPU."""
    spec = ModelSpec(**{**SMALL.__dict__, "gated_mlp": gated})
    block = Block(spec)
    b, s = 2, 64
    x = torch.randn(b, s, spec.hidden_size, requires_grad=True)
    cos, sin = rope_tables(spec.head_dim, s)
    rec = _Outputs()
    with rec:
        block(x, cos, sin)
    saved_ops, mm, count = op_sac_saved_ops(), torch.ops.aten.mm.default, 0
    kept = x.numel() * x.element_size()
    for func, nbytes in rec.ops:
        if func is mm:
            count += 1
        if func in saved_ops and not (func is mm and count % 2 == 0):
            kept += nbytes
    assert count == (7 if gated else 6)  # wq wk wv wo w1 (w3) w2
    plan = make_plan(fused_kernels=False, recompute=Recompute.OP_SAC)
    h, lse = spec.hidden_size, 4.0 * spec.num_heads
    per_token = op_sac_bytes_per_token(spec, plan, 1.0, 4.0)  # an fp32 layer input
    # the model counts 16-bit outputs and an fp32 log-sum-exp; on a CPU in fp32 every output is 4 B
    outputs_16bit = per_token - 4.0 * h - lse
    expected = b * s * (4.0 * h + 2.0 * outputs_16bit + lse)
    # the attention kernel's log-sum-exp is its second output (not recorded above)
    assert kept + b * s * lse == pytest.approx(expected, rel=1e-6)


RECORDED = Path(__file__).resolve().parents[1] / "calibration" / "cpu_compile_op_sac.json"


@pytest.mark.parametrize("compiled", [False, True])
def test_op_sac_keeps_what_a_block_kept_eager_and_compiled_on_a_cpu(compiled):
    """One block under the per-op policy on a CPU (calibration/cpu_compile_op_sac.py): eager it
    kept its input and the policy's outputs; compiled, the partitioner dropped the MLP
    down-projection's output, which only the residual add reads. The model's count, in fp32
    elements per token, is the recorded one."""
    rec = json.loads(RECORDED.read_text())
    spec = ModelSpec(name="cpu-block", num_layers=1, hidden_size=rec["hidden"], ffn_hidden_size=rec["ffn"],
                     num_heads=rec["heads"], num_kv_heads=rec["kv_heads"], head_dim=rec["hidden"] // rec["heads"],
                     vocab_size=512)
    plan = make_plan(fused_kernels=False, recompute=Recompute.OP_SAC, compiled=compiled)
    h, lse = spec.hidden_size, 4.0 * spec.num_heads
    per_token = op_sac_bytes_per_token(spec, plan, 1.0, 4.0)  # an fp32 layer input, 16-bit outputs
    elements = h + (per_token - 4.0 * h - lse) / 2.0 + lse / 4.0
    assert elements == pytest.approx(rec["compiled" if compiled else "eager"]["elements_per_token"], rel=1e-9)


def test_op_sac_without_the_attention_kept_reruns_it():
    """Where the save list does not name the attention kernel (torchtitan 0.1.0-0.2.0 with
    cuDNN's), a layer keeps neither its output nor its log-sum-exp and re-runs it."""
    cluster = load_cluster("dgx-b200", num_gpus=8)
    from paraplan.specs.catalog import load_model
    model, wl = load_model("llama3-8b"), Workload(global_batch_size=8, seq_len=8192)
    kept, rerun = (estimate(model, cluster, wl, make_plan(dp=8, micro_batch_size=1, recompute=Recompute.OP_SAC,
                                                          fused_kernels=False, zero=ZeroStage.PARAMETERS,
                                                          op_sac_attention_kept=k)) for k in (True, False))
    per_layer = 8192 * (2.0 * model.v_dim + 4.0 * model.num_heads)
    stored = kept.memory.activations_bytes - rerun.memory.activations_bytes
    assert stored == pytest.approx(model.num_layers * per_layer, rel=0.02)
    assert rerun.time.recompute_s > kept.time.recompute_s
    # the re-run attention counts as hardware FLOPs: more of them per step
    assert rerun.hfu * rerun.step_time_s > kept.hfu * kept.step_time_s


def test_op_sac_recomputes_the_same_gradients():
    torch.manual_seed(0)
    block = Block(SMALL)
    x = torch.randn(2, 32, SMALL.hidden_size, requires_grad=True)
    cos, sin = rope_tables(SMALL.head_dim, 32)
    block(x, cos, sin).square().sum().backward()
    plain = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    from torch.utils.checkpoint import checkpoint
    out = checkpoint(block, x, cos, sin, use_reentrant=False, context_fn=op_sac_context)
    out.square().sum().backward()
    for a, p in zip(plain, block.parameters()):
        torch.testing.assert_close(a, p.grad)


def test_op_sac_sits_between_selective_and_full():
    """Per-op checkpointing keeps far less than the attention-core policy (which keeps every
    GEMM input) and more than full recomputation; it re-runs a third of the matmuls."""
    cluster = load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=16, seq_len=8192)
    from paraplan.specs.catalog import load_model
    model = load_model("llama3-8b")
    est = {rc: estimate(model, cluster, wl, make_plan(dp=8, micro_batch_size=2, recompute=rc, fused_kernels=False,
                                                    zero=ZeroStage.PARAMETERS))
           for rc in (Recompute.NONE, Recompute.SELECTIVE, Recompute.OP_SAC, Recompute.FULL)}
    acts = {rc: e.memory.activations_bytes for rc, e in est.items()}
    assert acts[Recompute.FULL] < acts[Recompute.OP_SAC] < 0.5 * acts[Recompute.SELECTIVE]
    assert 0 < est[Recompute.OP_SAC].time.recompute_s < est[Recompute.FULL].time.recompute_s
    assert est[Recompute.OP_SAC].hfu > est[Recompute.NONE].hfu  # re-run matmuls count as hardware FLOPs


def test_op_sac_is_an_eager_engines_policy():
    cluster = load_cluster("dgx-h100", num_gpus=8)
    wl = Workload(global_batch_size=16, seq_len=2048)
    rej = check_plan(make_plan(dp=8, recompute=Recompute.OP_SAC), SMALL, cluster, wl)
    assert rej is not None and "eager engine" in rej.reason
    assert check_plan(make_plan(dp=8, recompute=Recompute.OP_SAC, fused_kernels=False), SMALL, cluster, wl) is None
    # the search offers it only to eager engines
    for fused in (True, False):
        codes = {int(c) for batch, _ in enumerate_space(SMALL, cluster, wl, SpaceLimits(fused_kernels=fused))
                 for c in batch.recompute_code}
        assert (Recompute.OP_SAC.code in codes) is (not fused)
