"""Every exported Megatron-LM launch script passes Megatron-LM's own checks: the script runs
under bash with torchrun stubbed out, and the arguments and environment it would hand
pretrain_gpt.py go through Megatron-LM's `parse_args`, `validate_args` and
`core_transformer_config_from_args` (the checks pretrain_gpt.py applies before training),
at tag core_v0.16.1.

Megatron-LM's training front end is not on PyPI: it is read from
../shared/engines/megatron-lm_core_v0.16.1 (its README says what to install beside it, the
`megatron` extra, and how to answer the device queries on a CPU: an H100, compute
capability 9.0). The test skips only where that folder is absent.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.export import megatron
from paraplan.search.policy import best_exportable
from paraplan.plan.axes import AttentionKernel, CPCommType, Recompute, RecomputeOps, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Fp8Recipe, Precision, Workload

FRONT_END = Path(__file__).resolve().parents[2] / "shared" / "engines" / "megatron-lm_core_v0.16.1"

LLAMA = load_model("llama3-8b")           # dense, GQA 32/8
LLAMA2 = load_model("llama2-7b")          # dense, MHA
MIXTRAL = load_model("mixtral-8x7b")      # MoE, GQA
DSV3 = load_model("deepseek-v3")          # MoE with MTP, MLA
DSV2 = load_model("deepseek-v2")          # MoE, MLA, no MTP
WL = Workload(global_batch_size=64, seq_len=4096)
WL_MOE = Workload(global_batch_size=1024, seq_len=4096)


def plan(**kw):
    base = dict(tp=1, pp=1, dp=16, micro_batch_size=1, attention=AttentionKernel.FLASH3)
    base.update(kw)
    return megatron.SUPPORT.adapt(make_plan(**base))


# name -> (model, plan, workload, GPUs)
CASES = {
    "dense-tp2-pp2-vp4-selective-zero1": (LLAMA, plan(tp=2, pp=2, dp=4, vp=4, schedule=Schedule.INTERLEAVED_1F1B,
                                                      sequence_parallel=True, recompute=Recompute.SELECTIVE,
                                                      zero=ZeroStage.OPTIMIZER), WL, 16),
    "dense-fsdp-full-recompute": (LLAMA, plan(micro_batch_size=2, zero=ZeroStage.PARAMETERS,
                                              recompute=Recompute.FULL, dp_overlap=True), WL, 16),
    "dense-hsdp-tp2-zero2": (LLAMA, plan(tp=2, dp=8, zero=ZeroStage.GRADIENTS, dp_shard=4, sequence_parallel=True),
                             WL, 16),
    "dense-tp2-zero1-offload": (LLAMA, plan(tp=2, dp=8, sequence_parallel=True, zero=ZeroStage.OPTIMIZER,
                                            offload_optimizer=True), WL, 16),
    "dense-pp4-first-k": (LLAMA, plan(tp=4, pp=4, dp=1, sequence_parallel=True, recompute=Recompute.FIRST_K,
                                      recompute_num_layers=4), WL, 16),
    "dense-pp4-vp3-layout": (LLAMA, plan(tp=2, pp=4, dp=2, vp=3, schedule=Schedule.INTERLEAVED_1F1B,
                                         sequence_parallel=True, zero=ZeroStage.OPTIMIZER), WL, 16),
    "dense-cp4-ring": (LLAMA, plan(tp=2, cp=4, dp=2, sequence_parallel=True), WL, 16),
    "dense-cp2-allgather-fsdp": (LLAMA, plan(tp=2, cp=2, dp=4, sequence_parallel=True, zero=ZeroStage.GRADIENTS,
                                             cp_comm_type=CPCommType.ALL_GATHER), WL, 16),
    "dense-cp2-ulysses": (LLAMA, plan(cp=2, dp=8, cp_comm_type=CPCommType.A2A), WL, 16),
    "dense-fp8": (LLAMA, plan(tp=2, dp=8, sequence_parallel=True, zero=ZeroStage.OPTIMIZER),
                  replace(WL, precision=Precision.FP8), 16),
    # FP8 weights gathered in FP8 (--fp8-param-gather): the distributed optimizer, and with its
    # CPU offload the delayed recipe (validate_args)
    "dense-fp8-param-gather": (LLAMA, plan(tp=2, dp=8, sequence_parallel=True, zero=ZeroStage.OPTIMIZER,
                                           low_precision_params=True), replace(WL, precision=Precision.FP8), 16),
    "dense-fp8-param-gather-offload": (LLAMA, plan(dp=16, zero=ZeroStage.OPTIMIZER, offload_optimizer=True,
                                                   low_precision_params=True),
                                       replace(WL, precision=Precision.FP8, fp8_recipe=Fp8Recipe.DELAYED), 16),
    "dense-fp16": (LLAMA, plan(zero=ZeroStage.OPTIMIZER), replace(WL, precision=Precision.FP16), 16),
    "dense-activation-offload": (LLAMA, plan(zero=ZeroStage.OPTIMIZER, activation_offload_layers=16), WL, 16),
    # a searched set of ops that --recompute-modules expresses: the dense MLP module
    "dense-tp2-set-mlp": (LLAMA, plan(tp=2, dp=8, sequence_parallel=True, zero=ZeroStage.OPTIMIZER,
                                      recompute=Recompute.SET, recompute_ops=RecomputeOps.parse("ln2,up,act", "t")),
                          WL, 16),
    "mha-tp4-ddp": (LLAMA2, plan(tp=4, dp=4, sequence_parallel=True), WL, 16),
    "moe-ep8-modules": (MIXTRAL, plan(tp=2, dp=8, ep=8, sequence_parallel=True, zero=ZeroStage.OPTIMIZER,
                                      capacity_factor=1.25, recompute=Recompute.MODULES), WL, 16),
    "moe-ep8-overlap-vp": (MIXTRAL, plan(pp=2, vp=2, dp=8, ep=8, schedule=Schedule.INTERLEAVED_1F1B,
                                         zero=ZeroStage.OPTIMIZER, ep_overlap=True), WL, 16),
    "mla-moe-tp2-ep8-fsdp": (DSV2, plan(tp=2, pp=4, dp=32, ep=8, sequence_parallel=True, zero=ZeroStage.PARAMETERS),
                             WL_MOE, 256),
    "mtp-ep64-pp8-vp": (DSV3, plan(pp=8, vp=2, dp=128, ep=64, schedule=Schedule.INTERLEAVED_1F1B,
                                   zero=ZeroStage.OPTIMIZER, recompute=Recompute.MODULES, ep_overlap=True),
                        WL_MOE, 1024),
    # the deduplicating dispatch (DeepEP, the flex dispatcher) and DeepSeek's node-limited routing
    "mtp-ep64-deepep-groups": (DSV3, plan(pp=8, vp=2, dp=128, ep=64, schedule=Schedule.INTERLEAVED_1F1B,
                                          zero=ZeroStage.OPTIMIZER, a2a_hierarchical=True), WL_MOE, 1024),
    "mtp-tp8-ep64-fp8-modules": (DSV3, plan(tp=8, pp=1, dp=128, ep=64, sequence_parallel=True,
                                            zero=ZeroStage.OPTIMIZER, recompute=Recompute.MODULES),
                                 replace(WL_MOE, precision=Precision.FP8), 1024),
}
# the best plan Megatron runs (the one `export` writes without plan flags)
BEST = {
    "llama2-7b-16": (LLAMA2, WL, 16),  # dense, MHA
    "llama3-8b-16": (LLAMA, WL, 16),
    "mixtral-8x7b-64": (MIXTRAL, Workload(global_batch_size=256, seq_len=4096), 64),
    "llama3.1-405b-1024": (load_model("llama3.1-405b"), Workload(global_batch_size=2048, seq_len=8192), 1024),
    "deepseek-v3-1024": (DSV3, Workload(global_batch_size=4096, seq_len=4096), 1024),
}


@pytest.fixture
def front_end(monkeypatch):
    """Megatron-LM's argument module, its device queries answered as an H100 would."""
    if not FRONT_END.is_dir():
        pytest.skip(f"Megatron-LM's training front end is not at {FRONT_END} (../shared/engines)")
    monkeypatch.syspath_prepend(str(FRONT_END))
    import packaging.version
    import torch
    import megatron.core.models.common.embeddings.rope_utils as rope
    import megatron.core.utils as mcu
    import megatron.training.arguments as mla
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    monkeypatch.setattr(mla, "get_device_arch_version", lambda: 9)
    # Transformer Engine does not install on a CPU machine; FP8 plans ask its version
    monkeypatch.setattr(mcu, "_te_version", packaging.version.Version("2.8.0"))
    # and its fused RoPE kernel, which Megatron-LM applies by default (--no-rope-fusion turns it off)
    monkeypatch.setattr(rope, "fused_apply_rotary_pos_emb", lambda *a, **k: None)
    # and its fused MoE permutation kernels (--moe-permute-fusion, which the export sets)
    import megatron.core.transformer.moe.moe_utils as moe_utils
    for kernel in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                   "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
        monkeypatch.setattr(moe_utils, kernel, lambda *a, **k: None, raising=False)
    return mla


def launched(text: str, tmp_path) -> tuple[list[str], dict, list[str]]:
    """(torchrun's arguments before pretrain_gpt.py, the environment, pretrain_gpt.py's
    arguments) of a launch script, run by bash with torchrun replaced by a recorder."""
    script = tmp_path / "megatron.sh"
    script.write_text(text)
    env_out, args_out = tmp_path / "env", tmp_path / "args"
    recorder = f'torchrun() {{ env -0 > {env_out}; printf "%s\\0" "$@" > {args_out}; }}'
    clean = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    subprocess.run(["bash", "-c", f"{recorder}; export -f torchrun; bash {script}"], check=True, env=clean)
    env = dict(x.split("=", 1) for x in env_out.read_text().split("\0") if "=" in x)
    argv = args_out.read_text().split("\0")[:-1]
    i = argv.index("pretrain_gpt.py")
    return argv[:i], env, argv[i + 1:]


def megatron_checks(mla, text: str, tmp_path, monkeypatch):
    """Megatron-LM's args and TransformerConfig for the script, as pretrain_gpt.py builds them."""
    launcher, env, argv = launched(text, tmp_path)
    value = lambda flag: int(launcher[launcher.index(flag) + 1])  # noqa: E731
    world = value("--nproc-per-node") * value("--nnodes")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", "0")
    for k in ("CUDA_DEVICE_MAX_CONNECTIONS",):
        if k in env:
            monkeypatch.setenv(k, env[k])
        else:
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *argv])
    args = mla.parse_args()
    mla.validate_args(args, {"tokenizer_type": "GPT2BPETokenizer"})
    return args, mla.core_transformer_config_from_args(args)


def check_plan(args, cfg, p, model, workload) -> None:
    """What Megatron-LM read is what the plan says."""
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size) == (
        p.tp, p.pp, p.cp)
    assert args.data_parallel_size == p.dp and (cfg.virtual_pipeline_model_parallel_size or 1) == p.vp
    assert args.expert_model_parallel_size == p.ep
    assert args.micro_batch_size == p.micro_batch_size and args.global_batch_size == workload.global_batch_size
    assert args.num_layers == model.num_layers and (args.mtp_num_layers or 0) == model.mtp_layers
    assert cfg.num_moe_experts == (model.num_experts or None)
    assert cfg.multi_latent_attention == model.is_mla
    # the model's own RoPE (Megatron's default base is 10,000), and what the script is
    assert args.rotary_base == (model.rope_theta or 10_000)
    assert args.use_rope_scaling == bool(model.rope_llama3_scaling_factor)
    if args.use_rope_scaling:
        assert args.rope_scaling_factor == model.rope_llama3_scaling_factor
    assert args.mock_data
    # FP8 weights kept and gathered in FP8 where the plan says so
    assert args.fp8_param_gather == (p.low_precision_params and workload.precision is Precision.FP8)
    if workload.precision is Precision.FP8:  # the scaling recipe priced
        assert args.fp8_recipe == str(workload.fp8_recipe)
    # the dispatch paraplan priced, and the model's group-limited routing
    assert cfg.moe_token_dispatcher_type == (("flex" if p.a2a_hierarchical else "alltoall") if model.is_moe
                                             else cfg.moe_token_dispatcher_type)
    if p.a2a_hierarchical:
        assert cfg.moe_flex_dispatcher_backend == "deepep" and not cfg.moe_shared_expert_overlap
    assert (cfg.moe_router_num_groups or 0, cfg.moe_router_group_topk or 0) == (
        (model.expert_groups, model.group_top_k) if model.group_limited else (0, 0))
    if p.recompute is Recompute.SET:
        assert cfg.recompute_granularity == "selective" and sorted(cfg.recompute_modules) == ["mlp"]


def exported_and_checked(front_end, p, model, cluster, wl, tmp_path, monkeypatch, est=None) -> None:
    res = megatron.export(p, model, cluster, wl, est)
    assert "# A throughput benchmark: mock data" in res.text
    args, cfg = megatron_checks(front_end, res.text, tmp_path, monkeypatch)
    check_plan(args, cfg, p, model, wl)


@pytest.mark.parametrize("name", list(CASES))
def test_megatron_lm_accepts_the_exported_script(name, front_end, tmp_path, monkeypatch):
    model, p, wl, gpus = CASES[name]
    exported_and_checked(front_end, p, model, load_cluster("dgx-h100", num_gpus=gpus), wl, tmp_path, monkeypatch)


@pytest.mark.parametrize("name", list(BEST))
def test_megatron_lm_accepts_the_best_plan(name, front_end, tmp_path, monkeypatch):
    model, wl, gpus = BEST[name]
    cluster = load_cluster("dgx-h100", num_gpus=gpus)
    est = best_exportable(model, cluster, wl, megatron.SUPPORT, megatron.check)
    exported_and_checked(front_end, est.plan, model, cluster, wl, tmp_path, monkeypatch, est)


def test_megatron_lm_refuses_a_missing_environment(front_end, tmp_path, monkeypatch):
    """The check can fail: without the script's CUDA_DEVICE_MAX_CONNECTIONS line, TP is refused;
    with its unset line removed and the variable inherited as 1, Megatron-FSDP is."""
    model, p, wl, gpus = CASES["dense-cp4-ring"]
    text = megatron.export(p, model, load_cluster("dgx-h100", num_gpus=gpus), wl).text
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    with pytest.raises(AssertionError, match="CUDA_DEVICE_MAX_CONNECTIONS"):
        megatron_checks(front_end, text.replace("export CUDA_DEVICE_MAX_CONNECTIONS=1", ""), tmp_path, monkeypatch)
    model, p, wl, gpus = CASES["dense-hsdp-tp2-zero2"]
    text = megatron.export(p, model, load_cluster("dgx-h100", num_gpus=gpus), wl).text
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in text
    with pytest.raises(AssertionError, match="CUDA_DEVICE_MAX_CONNECTIONS"):
        megatron_checks(front_end, text.replace("unset CUDA_DEVICE_MAX_CONNECTIONS",
                                                "export CUDA_DEVICE_MAX_CONNECTIONS=1"), tmp_path, monkeypatch)


def test_ep_overlap_with_mtp_needs_a_pipeline_in_the_search_and_the_exporter():
    """Megatron-Core: "Pipeline model parallel size must be larger than 1 when enabling
    overlap_moe_expert_parallel_comm with MTP layer": the exporter refuses it in one line and
    the search never holds it (SUPPORT's engine_rule)."""
    from paraplan.errors import SpecError
    from paraplan.plan.space import enumerate_space
    wl = Workload(global_batch_size=256, seq_len=4096)
    p = plan(dp=64, ep=64, zero=ZeroStage.OPTIMIZER, ep_overlap=True)
    with pytest.raises(SpecError, match="ep_overlap") as e:
        megatron.check(p, DSV3, wl)
    assert "\n" not in str(e.value)
    megatron.check(p, replace(DSV3, mtp_layers=0), wl)  # without MTP the overlap runs at PP1
    cluster = load_cluster("dgx-h100", num_gpus=64)
    seen = {True: 0, False: 0}
    for model in (DSV3, replace(DSV3, mtp_layers=0)):
        for batch, _ in enumerate_space(model, cluster, wl, megatron.SUPPORT.search_limits()):
            seen[bool(model.mtp_layers)] += int((batch.ep_overlap & (batch.pp == 1)).sum())
    assert seen[True] == 0 and seen[False] > 0
