"""The labels sources publish in a training row (torchtitan's, NeMo's, Megatron-Bridge's) read
as what they mean, and a row that only a framework default completes is predicted."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from paraplan.errors import RowError
from paraplan.plan.axes import AttentionKernel, Recompute, Schedule, ZeroStage
from paraplan.specs.workload import Precision
from paraplan.validate.training import published_precision, row_cells, row_setup

from support import TRAINING_ROW

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"


@pytest.mark.parametrize("label,precision", [
    ("BF16 + Float8 linear (tensorwise)", Precision.FP8),
    ("BF16 + Float8 linear (float8 rowwise)", Precision.FP8),
    ("BF16 + MXFP8 linear (mxfp8_cublas)", Precision.FP8),
    ("FP8 (page caption: per-tensor FP8, current-step scaling)", Precision.FP8),
    ("FP8-MX", Precision.FP8), ("BF16", Precision.BF16), ("NVFP4", Precision.NVFP4),
    # AMP and Transformer Engine's FP8 formats and recipes as trainers publish them
    ("mixed precision bf16", Precision.BF16), ("amp_bf16", Precision.BF16), ("AMP fp16", Precision.FP16),
    ("FP8 hybrid", Precision.FP8), ("FP8 current scaling", Precision.FP8), ("fp8_e4m3", Precision.FP8),
    ("FP8 subchannel", Precision.FP8), ("BF16 + FP8", Precision.FP8), ("BF16/FP8", Precision.FP8),
])
def test_published_precision_labels(label, precision):
    assert published_precision(label) is precision


@pytest.mark.parametrize("label", ["BF16 + linear", "Float8 linear", "BF16 + int3 linear"])
def test_a_precision_label_that_names_no_precision_is_refused(label):
    with pytest.raises(Exception, match="allowed"):
        published_precision(label)


@pytest.mark.parametrize("zero,pp,stages", [
    ("FSDP2", "1", (ZeroStage.PARAMETERS,)),
    ("FSDP2", "8", (ZeroStage.GRADIENTS,)),          # torchtitan: reshard_after_forward = not pp_enabled
    ("fsdp (FSDP2 full shard)", "8", (ZeroStage.PARAMETERS,)),
    ("Megatron FSDP", "1", (ZeroStage.PARAMETERS,)),
    ("MaxText FSDP", "1", (ZeroStage.PARAMETERS,)),
    ("DDP + distributed optimizer", "1", (ZeroStage.OPTIMIZER,)),
    ("distributed optimizer (DDP)", "1", (ZeroStage.OPTIMIZER,)),
    ("DDP", "1", (ZeroStage.NONE,)),
    ("fsdp", "1", tuple(ZeroStage)),                # FSDP without its strategy: searched
    ("ZeRO-3", "1", (ZeroStage.PARAMETERS,)),        # DeepSpeed's stages as published
    ("ZeRO stage 2", "1", (ZeroStage.GRADIENTS,)),
    ("DeepSpeed ZeRO1", "1", (ZeroStage.OPTIMIZER,)),
    ("ZeRO-0", "1", (ZeroStage.NONE,)),
    ("ZeRO++ (ZeRO-3, hpZ)", "1", (ZeroStage.PARAMETERS,)),
    ("ZeRO-3 offload", "1", (ZeroStage.PARAMETERS,)),
    ("stage 3", "1", (ZeroStage.PARAMETERS,)),
    ("FSDP NO_SHARD", "1", (ZeroStage.NONE,)),          # torch's NO_SHARD is DDP
    ("none", "1", (ZeroStage.NONE,)),
    ("HYBRID_SHARD_ZERO2", "1", (ZeroStage.GRADIENTS,)),
    ("FSDP2 (reshard_after_forward=False)", "1", (ZeroStage.GRADIENTS,)),
    ("n/a", "1", tuple(ZeroStage)),                     # not stated: searched
])
def test_published_zero_labels(zero, pp, stages):
    assert row_cells({**TRAINING_ROW, "zero": zero, "pp": pp, "vp": ""}, "rows.csv", 2)["zero"] == stages


def test_an_unknown_zero_label_names_the_row_and_column():
    with pytest.raises(RowError, match=r"rows.csv:2: column 'zero': 'ZeRO-7'"):
        row_cells({**TRAINING_ROW, "zero": "ZeRO-7"}, "rows.csv", 2)


def test_recompute_label_with_a_note():
    # a note naming the per-op policy is torchtitan's per-op checkpointing; plain selective is
    # Korthikanti's attention core, except in a torchtitan row (torchtitan has no such policy)
    for label in ("selective (per-op SAC)", "selective (op-level SAC)", "selective (op)"):
        assert row_cells({**TRAINING_ROW, "recompute": label}, "rows.csv", 2)["recompute"] is Recompute.OP_SAC
    assert row_cells({**TRAINING_ROW, "recompute": "selective"}, "rows.csv", 2)["recompute"] is Recompute.SELECTIVE
    titan = {**TRAINING_ROW, "recompute": "selective", "framework": "torchtitan (FSDP)"}
    assert row_cells(titan, "rows.csv", 2)["recompute"] is Recompute.OP_SAC


TITAN = {**TRAINING_ROW, "model": "llama3.1-8b", "layers": "", "hidden": "", "ffn_hidden": "", "heads": "",
         "kv_heads": "", "vocab": "", "gpu": "H100", "num_gpus": "64", "seq_len": "8192", "global_batch": "",
         "micro_batch": "12", "tp": "8", "pp": "1", "vp": "", "dp": "8", "sp": "yes", "recompute": "full",
         "zero": "FSDP2", "precision": "BF16", "framework": "torchtitan (Async TP, torch.compile)", "notes": ""}


def test_torchtitan_row_without_global_batch_takes_its_default():
    # torchtitan's global_batch_size defaults to local batch × data-parallel degree
    setup = row_setup(TITAN, "rows.csv", 2)
    assert setup.workload.global_batch_size == 12 * 8
    lim = setup.limits
    assert lim.compiled and lim.fsdp2_copies and not lim.fused_kernels and lim.grad_reduce_fp32
    assert lim.tp_overlap == (True,) and lim.attention == (AttentionKernel.FLASH2,)
    vanilla = row_setup({**TITAN, "framework": "torchtitan (Vanilla TP)"}, "rows.csv", 2).limits
    assert vanilla.tp_overlap == (False,) and not vanilla.compiled


def test_other_frameworks_still_need_the_global_batch():
    with pytest.raises(Exception, match="global_batch"):
        row_setup({**TITAN, "framework": "NeMo 25.04"}, "rows.csv", 2)


def test_torchtitan_pipeline_row_takes_torchtitans_default_micro_batches():
    """A torchtitan pipeline row gives its local batch, not its micro-batches: torchtitan's
    default splits it into as many micro-batches as stages, one stage per rank under 1F1B and
    two under interleaved 1F1B."""
    row = {**TITAN, "tp": "8", "pp": "8", "dp": "8", "num_gpus": "512", "micro_batch": "32",
           "framework": "torchtitan (PP schedule 1F1B)"}
    setup = row_setup(row, "rows.csv", 2)
    assert setup.limits.schedules == (Schedule.ONE_F_ONE_B,)
    assert setup.fixed["micro_batch_size"] == 32 // 8 and setup.fixed["vp"] == 1
    assert setup.workload.global_batch_size == 32 * 8
    inter = row_setup({**row, "framework": "torchtitan (PP schedule Interleaved 1F1B)"}, "rows.csv", 2)
    assert inter.limits.schedules == (Schedule.INTERLEAVED_1F1B,)
    assert inter.fixed["micro_batch_size"] == 32 // 16 and inter.fixed["vp"] == 2
    # a local batch the stage count does not divide, or no named schedule: searched
    odd = row_setup({**row, "micro_batch": "12"}, "rows.csv", 2)
    assert "micro_batch_size" not in odd.fixed and "vp" not in odd.fixed
    unnamed = row_setup({**row, "framework": "torchtitan"}, "rows.csv", 2)
    assert "micro_batch_size" not in unnamed.fixed


def test_a_torchtitan_row_keeps_the_cp_exchange_it_states():
    """torchtitan runs both K/V rotations (context_parallel_rotate_method), all-gather by
    default: a row that names one is priced with it, a row that does not with the default."""
    from paraplan.plan.axes import CPCommType
    row = {**TITAN, "cp": "2", "dp": "4"}
    assert row_setup(row, "rows.csv", 2).limits.cp_comm_types == (CPCommType.ALL_GATHER,)
    stated = row_setup({**row, "cp_comm_type": "p2p"}, "rows.csv", 2).limits
    assert stated.cp_comm_types == (CPCommType.P2P,)
    # CP blank: searched, CP = 1 among the choices (it exchanges nothing, counted as the ring)
    blank = row_setup({**row, "cp": "", "global_batch": "96"}, "rows.csv", 2).limits
    assert CPCommType.P2P in blank.cp_comm_types and CPCommType.ALL_GATHER in blank.cp_comm_types


@pytest.mark.parametrize("name", ["training_dev.csv", "training_dev_more.csv", "training_dev_moe.csv"])
def test_every_published_training_label_is_read(name):
    """No cell of the published files is refused as unreadable (a row may still be skipped for
    a missing input or a GPU without a preset, with that reason)."""
    path = VALIDATION / name
    if not path.is_file():
        pytest.skip("published validation data not present")
    with path.open(encoding="utf-8") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            row_cells(row, name, line)


DEEPSPEED_ROW = {**TITAN, "tp": "1", "dp": "64", "sp": "", "recompute": "", "micro_batch": "2",
                 "global_batch": "128", "zero": "ZeRO-3", "framework": "DeepSpeed 0.16 + Hugging Face Transformers"}


def test_a_deepspeed_row_runs_eager_hugging_face_layers_under_deepspeeds_policy():
    lim = row_setup(DEEPSPEED_ROW, "rows.csv", 2).limits
    assert not lim.fused_kernels and not lim.compiled and not lim.fsdp2_copies and not lim.grad_reduce_fp32
    assert lim.sequence_parallel == (False,) and lim.tp_overlap == (False,) and lim.ep_overlap is False
    assert lim.attention == (AttentionKernel.FLASH2,)
    assert set(lim.recomputes) == {Recompute.NONE, Recompute.FULL}  # deepspeed.checkpointing: whole layers
    assert lim.zero_stages == (ZeroStage.PARAMETERS,) and not lim.allow_offload
    # a stated label is kept; an offload label lets the optimizer's shard go to the host
    stated = row_setup({**DEEPSPEED_ROW, "recompute": "selective", "zero": "ZeRO-3 offload"}, "rows.csv", 2).limits
    assert stated.recomputes == (Recompute.SELECTIVE,) and stated.allow_offload


def test_megatron_deepspeed_keeps_megatrons_fused_layers():
    lim = row_setup({**DEEPSPEED_ROW, "framework": "Megatron-DeepSpeed"}, "rows.csv", 2).limits
    assert lim.fused_kernels and lim.attention != (AttentionKernel.FLASH2,)


@pytest.mark.parametrize("label,torchtitan,recompute", [
    ("gradient checkpointing", False, Recompute.FULL),   # Hugging Face's: every layer
    ("activation checkpointing", False, Recompute.FULL), ("full AC", False, Recompute.FULL),
    ("full recompute", False, Recompute.FULL), ("no", False, Recompute.NONE),
    ("op-level SAC", False, Recompute.OP_SAC), ("selective op", True, Recompute.OP_SAC),
    ("selective layer", True, Recompute.FIRST_K), ("selective (layer)", True, Recompute.FIRST_K),
    ("selective", True, Recompute.OP_SAC), ("selective", False, Recompute.SELECTIVE),
])
def test_published_recompute_labels(label, torchtitan, recompute):
    from paraplan.validate.training import published_recompute
    assert published_recompute(label, torchtitan) is recompute


def test_torchtitans_layer_checkpointing_recomputes_every_nth_block():
    # selective_ac_option = "2" (torchtitan's default): every 2nd of Llama 3 8B's 32 blocks is
    # checkpointed whole -- 16 of them recomputed; "every 4 layers": 8
    from paraplan.validate.training import best_estimate, row_cluster
    row = {**TITAN, "tp": "1", "dp": "64", "sp": "", "micro_batch": "1", "framework": "torchtitan (FSDP)"}
    for label, layers in (("selective (layer)", 16), ("selective layer (every 4 layers)", 8)):
        r = {**row, "recompute": label}
        setup = row_setup(r, "rows.csv", 2)
        est, _ = best_estimate(r, setup, row_cluster(setup))
        assert est.plan.recompute is Recompute.FIRST_K and est.plan.recompute_num_layers == layers


def _grok_row(**cells):
    """train-held-pub-118 of training_dev_more.csv (Grok-1 on 128 GB200, NeMo 25.04), as published."""
    rows = {r["id"]: r for r in csv.DictReader((VALIDATION / "training_dev_more.csv").open())}
    return {**rows["train-held-pub-118"], **cells}


def test_moe_row_reads_its_expert_tp_dispatch_and_ep_overlap():
    """ETP as the notes state it ("ETP=4") is pinned; EP overlap only where the notes name it
    (Megatron-Core's default is off, and NeMo 25.04's Megatron-Core 0.12 had none); the dispatch
    is searched unless they name one."""
    setup = row_setup(_grok_row(), "rows.csv", 2)
    assert setup.fixed["etp"] == 4 and setup.limits.ep_overlap is False and setup.limits.hierarchical_a2a
    named = row_setup(_grok_row(notes="ETP=1; --overlap-moe-expert-parallel-comm; alltoall dispatcher"),
                      "rows.csv", 2)
    assert named.fixed["etp"] == 1 and named.limits.ep_overlap and not named.limits.hierarchical_a2a
    assert row_setup(_grok_row(notes="flex dispatcher (DeepEP)"), "rows.csv", 2).limits.hierarchical_a2a


def test_nemo_performance_recipes_drop_tokens_for_the_models_they_cover():
    """NeMo 2's performance recipes of Mixtral, Llama 4, DeepSeek-V3 and Qwen3 add
    MegatronTokenDropCallback (capacity factor 1.0, padded); NeMo has no Grok-1 recipe, and
    Megatron-Bridge's rows say where theirs drop tokens."""
    def factors(**cells):
        moe = {} if "model" not in cells else {"layers": "", "top_k": "", "moe_ffn_hidden": ""}
        return row_setup(_grok_row(**{**moe, **cells}), "rows.csv", 2).limits.capacity_factors

    assert factors() == (None,)  # Grok-1 in NeMo 25.04: no NeMo recipe says
    assert factors(model="Mixtral-8x7B") == (1.0,)
    assert factors(model="DeepSeek-V3", num_experts="256", notes="ETP=1") == (1.0,)
    assert factors(model="Mixtral-8x7B", framework="NeMo 23.11 (NeMo 1.0)") == (None,)  # before NeMo 2's recipes
    bridge = "Megatron-Bridge / Megatron-Core (NeMo 26.02)"
    assert factors(model="Qwen3_30B_a3B", num_experts="128", framework=bridge, notes="ETP=1") == (None,)
    assert factors(model="Qwen3_30B_a3B (tokendrop)", num_experts="128", framework=bridge, notes="ETP=1") == (1.0,)


def test_gradient_dtype_follows_the_engine_that_ran_the_row():
    """Megatron-LM's command line in BF16 accumulates and reduces gradients in fp32; NeMo 2's
    performance scripts turn that off for FP8 from the 25.04 containers and for every precision
    from 25.07; Megatron-Bridge's recipes always; Megatron-Core then keeps a 16-bit buffer."""
    def policy(**cells):
        limits = row_setup(_grok_row(**cells), "rows.csv", 2).limits
        return limits.grad_reduce_fp32, limits.grad_buffer_16bit

    assert policy() == (True, False)                      # NeMo 25.04, BF16: bf16_mixed's fp32 default
    assert policy(precision="FP8") == (False, True)       # NeMo 25.04, FP8 (nemo_toolkit 2.3.0)
    assert policy(framework="NeMo 25.07 (NeMo 2.0 / Megatron-Core)") == (False, True)
    assert policy(framework="NeMo 24.11 (dgxc v24.11.1)", precision="FP8") == (True, False)
    assert policy(framework="Megatron-Bridge / Megatron-Core (NeMo 26.02)") == (False, True)
    assert policy(framework="Megatron-LM (MCore + TE)") == (True, False)
    assert policy(framework="MosaicML Composer / llm-foundry") == (False, False)
