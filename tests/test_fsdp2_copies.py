"""FSDP2's copies around its collectives (Plan.fsdp2_copies): every gather copies the shards
into one buffer and out to the unsharded parameters, every gradient reduction copies the
gradients into one buffer (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
ZeRO-3 gathers and reduces per layer and micro-batch, so its copies grow with the
micro-batches; below ZeRO-3 FSDP2 gathers once per step (resharded after the backward) and
ZeRO-0/1 reduce once per step, so theirs do not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cost import memory as mem
from paraplan.cost.estimate import estimate
from paraplan.cost.roofline import elementwise_time_s
from paraplan.export.torchtitan import SUPPORT as TORCHTITAN
from paraplan.plan.axes import ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

MODEL = load_model("llama3-8b")
CLUSTER = load_cluster("dgx-h100", num_gpus=8)


def _extra_s(zero: ZeroStage, batch: int, dp: int = 8) -> float:
    wl = Workload(global_batch_size=batch, seq_len=4096)
    plan = make_plan(dp=dp, micro_batch_size=1, zero=zero)
    return (estimate(MODEL, CLUSTER, wl, replace(plan, fsdp2_copies=True)).step_time_s
            - estimate(MODEL, CLUSTER, wl, plan).step_time_s)


def test_zero3_copies_grow_with_the_micro_batches_and_zero0_copies_do_not():
    z3 = [_extra_s(ZeroStage.PARAMETERS, 8 * m) for m in (2, 4)]
    z0 = [_extra_s(ZeroStage.NONE, 8 * m) for m in (2, 4)]
    assert z3[0] > 0 and z3[1] == pytest.approx(2 * z3[0], rel=1e-6)
    assert z0[0] > 0 and z0[1] > z0[0]  # (the gradient accumulation, below)


def test_zero0_accumulates_gradients_between_its_reductions():
    # ZeRO-0/1 on FSDP2 reduce once per step; in between each micro-batch's gradient is cast
    # to the fp32 reduce dtype (the first) or added to the sum (read the sum and the bf16
    # gradient, write the sum), one kernel per weight tensor
    P, L = MODEL.num_params, MODEL.num_layers
    tensors = L * (4 + MODEL.num_mlp_matrices + MODEL.norm_params_per_layer / MODEL.hidden_size) + 3
    add = float(elementwise_time_s(CLUSTER.gpu, (mem.WEIGHT_BYTES + 2 * mem.GRAD_BYTES) * P, tensors))
    cast = float(elementwise_time_s(CLUSTER.gpu, (mem.WEIGHT_BYTES + mem.GRAD_BYTES) * P, tensors))
    extra = {}
    for m in (1, 2, 4):
        wl = Workload(global_batch_size=8 * m, seq_len=4096)
        plan = make_plan(dp=8, micro_batch_size=1, zero=ZeroStage.NONE, grad_reduce_fp32=True)
        extra[m] = (estimate(MODEL, CLUSTER, wl, replace(plan, fsdp2_copies=True)).time.compute_s
                    - estimate(MODEL, CLUSTER, wl, plan).time.compute_s)
    assert extra[1] == 0.0
    assert extra[2] == pytest.approx(cast + add, rel=1e-6)
    assert extra[4] == pytest.approx(cast + 3 * add, rel=1e-6)


def test_zero0_copies_are_one_gather_and_one_reduction_of_the_whole_model():
    # ZeRO-0 on FSDP2 (paraplan run) is HSDP with one-rank shards: FSDP2 copies each shard
    # straight into its parameter (bf16: read 2 B, write 2 B), and copies the gradients into
    # the reduce input and that to the output (fp32 here: read 4 B, write 4 B, twice)
    wl = Workload(global_batch_size=8, seq_len=4096)  # one micro-batch: nothing accumulated
    plan = make_plan(dp=8, micro_batch_size=1, zero=ZeroStage.NONE, grad_reduce_fp32=True)
    P = MODEL.num_params
    gpu = CLUSTER.gpu
    # (the reduce's second copy runs on FSDP2's reduce-scatter stream, beside compute)
    expected = (float(elementwise_time_s(gpu, 2.0 * mem.WEIGHT_BYTES * P, 1))
                + float(elementwise_time_s(gpu, 2.0 * mem.GRAD_BYTES * P, 1)) * (1.0 + gpu.overlap_slowdown))
    a = estimate(MODEL, CLUSTER, wl, plan)
    b = estimate(MODEL, CLUSTER, wl, replace(plan, fsdp2_copies=True))
    assert b.time.dp_comm_s - a.time.dp_comm_s == pytest.approx(expected, rel=1e-3)
    assert b.time.compute_s == a.time.compute_s


def test_no_copies_without_data_parallelism_nor_for_in_place_engines():
    wl = Workload(global_batch_size=8, seq_len=4096)
    one = make_plan(tp=8, micro_batch_size=1)
    assert (estimate(MODEL, CLUSTER, wl, replace(one, fsdp2_copies=True)).step_time_s
            == estimate(MODEL, CLUSTER, wl, one).step_time_s)
    assert make_plan().fsdp2_copies is False  # Megatron, DeepSpeed, FSDP1: in place
    # torchtitan shards on FSDP2, and replicates (ZeRO-0) on DDP, which copies nothing
    assert TORCHTITAN.adapt(make_plan(dp=8, zero=ZeroStage.PARAMETERS)).fsdp2_copies is True
    assert TORCHTITAN.adapt(make_plan(dp=8, zero=ZeroStage.NONE)).fsdp2_copies is False
    assert TORCHTITAN.search_limits().fsdp2_copies is True


def test_moe_expert_copies_gather_over_the_expert_data_parallel_group():
    # Mixtral on 8 GPUs, EP 8: each rank holds one expert whole (EDP = 1: FSDP2 copies it
    # once into the parameters); with EP 1 all eight are sharded over the 8 ranks, each
    # gathered and copied in and out
    model = load_model("mixtral-8x7b")
    wl = Workload(global_batch_size=16, seq_len=4096)
    copies = {}
    for ep in (1, 8):
        plan = make_plan(dp=8, ep=ep, micro_batch_size=1, zero=ZeroStage.PARAMETERS, fsdp2_copies=True)
        copies[ep] = float(estimate(model, CLUSTER, wl, plan).layer_detail["fwd"]["FSDP2 copies"])
    assert 0 < copies[8] < copies[1]


def test_zero3_copies_show_in_the_layer_breakdown():
    wl = Workload(global_batch_size=16, seq_len=4096)
    plan = make_plan(dp=8, micro_batch_size=1, zero=ZeroStage.PARAMETERS, fsdp2_copies=True)
    detail = estimate(MODEL, CLUSTER, wl, plan).layer_detail
    fwd = float(detail["fwd"]["FSDP2 copies"])
    bwd = float(detail["bwd"]["FSDP2 copies, gradient accumulation"])
    assert 0 < fwd < bwd  # the backward also copies the gradients in


def test_fsdp2_reduces_sp_norm_gradients_one_tensor_at_a_time_each_micro_batch_under_zero3():
    # Megatron: one flat all-reduce of the norm gradients per step; FSDP2: one per tensor at
    # every reduction (per micro-batch under ZeRO-3), so its extra TP time grows with m
    extra = {}
    for m in (2, 4):
        wl = Workload(global_batch_size=4 * m, seq_len=4096)
        plan = make_plan(tp=2, dp=4, sequence_parallel=True, micro_batch_size=1, zero=ZeroStage.PARAMETERS)
        a = estimate(MODEL, CLUSTER, wl, plan).time.tp_comm_s
        b = estimate(MODEL, CLUSTER, wl, replace(plan, fsdp2_copies=True)).time.tp_comm_s
        extra[m] = b - a
    assert 0 < extra[2] < extra[4]


def test_fsdp2_gradients_do_not_exist_yet_at_the_loss_peak_of_one_micro_batch():
    """torchtitan's optimizer sets FSDP2's gradients to None each step: in a step of one
    micro-batch the sharded gradients appear during the backward, as the activations go, so
    the peak holds one or the other, not both (Megatron's and DeepSpeed's ZeRO-3 keep a
    gradient buffer for the whole step). With two micro-batches the first one's gradients are
    held while the second runs forward."""
    def gib(fsdp2: bool, batch: int):
        plan = replace(make_plan(dp=8, micro_batch_size=1, zero=ZeroStage.PARAMETERS), fsdp2_copies=fsdp2)
        m = estimate(MODEL, CLUSTER, Workload(global_batch_size=batch, seq_len=4096), plan).memory
        return m.gradients_bytes + m.activations_bytes
    assert gib(True, 8) < gib(False, 8)
    assert gib(True, 16) == pytest.approx(gib(False, 16), rel=1e-9)
