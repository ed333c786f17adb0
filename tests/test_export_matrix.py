"""Every export fed to the engine's own config code, over a matrix of models (dense MHA, GQA,
MoE with MTP, MLA, and an MoE under its torchtitan name) × plans (the best plan the engine
runs, and plans with PP/VP/CP/EP/FSDP/recompute/offload): a test fails if the engine
rejects the exported config.

- torchtitan 0.2.2: ConfigManager reads the TOML, get_train_spec(name).model_args[flavor]
  is the model paraplan priced, ParallelDims builds the mesh on a fake process group (one
  child process for the whole matrix: tests/torchtitan_022.py);
- torchtitan 0.3: ConfigManager parses the header's command line (with the config_registry
  module the header carries, where it carries one), ParallelDims.from_config validates it;
- DeepSpeed 0.19.8: DeepSpeedConfig and AutoEP's checks (tests/engine_checks.py).
Megatron-LM's row (parse_args + validate_args + core_transformer_config_from_args over the
same kinds of models and plans, and the best plans) is tests/test_megatron_args.py.

An engine that trains no multi-token-prediction module (torchtitan, DeepSpeed) gets
DeepSeek-V3 as `--mtp-layers 0` gives it, and refuses the preset with MTP in one line.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from engine_checks import (SKIP_03, SKIP_022, SKIP_DS, deepspeed_accepts, installed, run_torchtitan_022,
                           torchtitan_03_parse, torchtitan_022_dir, torchtitan_version)

from paraplan.errors import SpecError
from paraplan.export import deepspeed, torchtitan
from paraplan.plan.axes import AttentionKernel, CPCommType, Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.search.policy import best_exportable
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

# name -> (preset, GPUs, global batch); sequence 4096
# (llama2-7b: a dense MHA model torchtitan has no flavor for, exported with a note to register one)
SETUPS = {"dense": ("llama2-7b", 16, 64), "gqa": ("llama3-8b", 16, 64), "moe-mtp": ("deepseek-v3", 256, 1024),
          "mla": ("deepseek-v2", 128, 512), "moe-gqa": ("qwen3-30b-a3b", 32, 256)}
EP = 8  # the expert-parallel degree of the MoE plans

# plan kind -> plan fields for G GPUs (EP added for an MoE model)
TORCHTITAN_KINDS = {
    "fsdp-full": lambda g: dict(dp=g, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL),
    "pp2-vp2": lambda g: dict(pp=2, vp=2, dp=g // 2, schedule=Schedule.INTERLEAVED_1F1B, zero=ZeroStage.GRADIENTS),
    "cp2-allgather": lambda g: dict(cp=2, dp=g // 2, zero=ZeroStage.PARAMETERS, cp_comm_type=CPCommType.ALL_GATHER),
    "cp2-ring": lambda g: dict(cp=2, dp=g // 2, zero=ZeroStage.PARAMETERS, cp_comm_type=CPCommType.P2P),
    "op-sac": lambda g: dict(dp=g, zero=ZeroStage.GRADIENTS, recompute=Recompute.OP_SAC),
    "tp2-sp": lambda g: dict(tp=2, dp=g // 2, sequence_parallel=True, zero=ZeroStage.PARAMETERS),
}
DEEPSPEED_KINDS = {
    "zero3-full": lambda g: dict(dp=g, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL),
    "zero2-offload": lambda g: dict(dp=g, zero=ZeroStage.GRADIENTS, offload_optimizer=True),
    "zero1": lambda g: dict(dp=g, zero=ZeroStage.OPTIMIZER),
    "autotp2": lambda g: dict(tp=2, dp=g // 2, zero=ZeroStage.OPTIMIZER),  # dense only (AutoTP has no SP)
}


def setup(name: str):
    """(model as the engines without MTP train it, cluster, workload) of a matrix row."""
    preset, gpus, batch = SETUPS[name]
    return (replace(load_model(preset), mtp_layers=0), load_cluster("dgx-h100", num_gpus=gpus),
            Workload(global_batch_size=batch, seq_len=4096))


def hand_plan(mod, kinds: dict, kind: str, model, gpus: int):
    kw = dict(tp=1, pp=1, micro_batch_size=1, attention=AttentionKernel.FLASH3) | kinds[kind](gpus)
    if model.is_moe:
        kw["ep"] = EP
    return mod.SUPPORT.adapt(make_plan(**kw))


def cases(mod, kinds: dict) -> list[tuple[str, str]]:
    rows = [(s, "best") for s in SETUPS]
    for s, (preset, _, _) in SETUPS.items():
        moe = load_model(preset).is_moe
        rows += [(s, k) for k in kinds if not (moe and k == "autotp2")]
    return rows


TT_CASES = cases(torchtitan, TORCHTITAN_KINDS)
DS_CASES = cases(deepspeed, DEEPSPEED_KINDS)


def exported(mod, kinds: dict, name: str, kind: str):
    model, cluster, wl = setup(name)
    if kind == "best":
        est = best_exportable(model, cluster, wl, mod.SUPPORT, mod.check)
        return est.plan, model, cluster, wl, mod.export(est.plan, model, cluster, wl, est)
    p = hand_plan(mod, kinds, kind, model, cluster.num_gpus)
    return p, model, cluster, wl, mod.export(p, model, cluster, wl)


@pytest.fixture(scope="module")
def torchtitan_exports():
    """Every torchtitan row exported once (the best plans searched once)."""
    return {case: exported(torchtitan, TORCHTITAN_KINDS, *case) for case in TT_CASES}


@pytest.fixture(scope="module")
def torchtitan_022_verdicts(torchtitan_exports, tmp_path_factory):
    if torchtitan_022_dir() is None:
        pytest.skip(SKIP_022)
    folder = tmp_path_factory.mktemp("matrix022")
    jobs = []
    for (name, kind), (p, *_, res) in torchtitan_exports.items():
        path = folder / f"{name}-{kind}.toml"
        path.write_text(res.text)
        cfg = json.loads(json.dumps(torchtitan.job_config(p, *setup(name)[::2])))
        mesh = [cfg["parallelism"][k] for k in (
            "data_parallel_replicate_degree", "data_parallel_shard_degree", "context_parallel_degree",
            "tensor_parallel_degree", "pipeline_parallel_degree", "expert_parallel_degree",
            "expert_tensor_parallel_degree")]
        jobs.append({"toml": str(path), "mesh": mesh, "world": p.num_gpus})
    return dict(zip(torchtitan_exports, run_torchtitan_022(jobs)))


@pytest.mark.parametrize("case", TT_CASES, ids=[f"{n}-{k}" for n, k in TT_CASES])
def test_torchtitan_022_accepts_the_toml(case, torchtitan_exports, torchtitan_022_verdicts):
    p, model, *_, res = torchtitan_exports[case]
    verdict = torchtitan_022_verdicts[case]
    if model.name not in torchtitan.MODELS:
        # a dense model torchtitan has no flavor for: the TOML names it, the header says to
        # register it, and torchtitan refuses exactly the missing flavor (the mesh it builds)
        assert "has no torchtitan flavor: register one" in res.text
        assert verdict["error"] == f"KeyError: '{model.name}'" and "mesh_error" not in verdict
        return
    assert verdict["error"] is None, verdict["error"]
    par, args = verdict["job"]["parallelism"], verdict["model_args"]
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"],
            par["expert_parallel_degree"]) == (p.tp, p.pp, p.cp, p.ep)
    # the flavor torchtitan builds is the model paraplan priced
    assert (args["n_layers"], args["dim"], args["n_heads"], args["vocab_size"]) == (
        model.num_layers, model.hidden_size, model.num_heads, model.vocab_size)
    if model.is_moe:
        moe = args.get("moe_args") or {}
        experts = moe.get("num_experts", args.get("n_routed_experts")) if isinstance(moe, dict) else None
        assert experts in (None, model.num_experts)  # (some flavors keep it in a nested config)


@pytest.mark.skipif((torchtitan_version() or (0, 0)) < (0, 3), reason=SKIP_03)
@pytest.mark.parametrize("case", TT_CASES, ids=[f"{n}-{k}" for n, k in TT_CASES])
def test_torchtitan_03_accepts_the_command_line(case, torchtitan_exports, tmp_path, monkeypatch):
    from torchtitan.distributed import ParallelDims
    p, model, _, wl, res = torchtitan_exports[case]
    args = torchtitan.cli_overrides_v03(torchtitan.job_config(p, model, wl), model)
    if args is None:  # what 0.3 cannot say is said in the header, never silently dropped
        assert "(not expressible in 0.3:" in res.text
        assert model.name not in torchtitan.MODELS or torchtitan.MODELS[model.name][0] == "llama4"
        return
    job, _ = torchtitan_03_parse(res.text, args, tmp_path, monkeypatch)
    assert (job.model_spec.name, job.model_spec.flavor) == torchtitan.MODELS[model.name][:2]
    assert "Float8" not in repr(job.model_spec.model)  # bf16 plans train in bf16
    par = job.parallelism
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree, par.context_parallel_degree,
            par.expert_parallel_degree) == (p.tp, p.pp, p.cp, p.ep)
    ParallelDims.from_config(par, p.num_gpus)  # torchtitan 0.3's own mesh validation


@pytest.fixture(scope="module")
def deepspeed_exports():
    return {case: exported(deepspeed, DEEPSPEED_KINDS, *case) for case in DS_CASES}


@pytest.mark.skipif(not installed("deepspeed"), reason=SKIP_DS)
@pytest.mark.parametrize("case", DS_CASES, ids=[f"{n}-{k}" for n, k in DS_CASES])
def test_deepspeed_accepts_the_json(case, deepspeed_exports):
    p, model, _, wl, res = deepspeed_exports[case]
    cfg = json.loads(res.text)
    c = deepspeed_accepts(cfg, p.num_gpus, model.num_experts)
    assert c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * p.dp == wl.global_batch_size
    assert c.zero_optimization_stage == int(str(p.zero))
    assert (c.zero_config.offload_optimizer is not None) == p.offload_optimizer
    # an MoE plan with EP spreads its experts by AutoEP, never every expert on every rank
    assert c.expert_parallel_config.enabled == (p.ep > 1) and c.expert_parallel_config.autoep_size == p.ep


@pytest.mark.parametrize("mod", [torchtitan, deepspeed])
def test_engines_without_mtp_refuse_the_mtp_preset_in_one_line(mod):
    model, wl = load_model("deepseek-v3"), Workload(global_batch_size=1024, seq_len=4096)
    with pytest.raises(SpecError) as e:
        mod.check(hand_plan(mod, {"x": lambda g: dict(dp=g, zero=ZeroStage.PARAMETERS)}, "x", model, 256), model, wl)
    assert "\n" not in str(e.value) and "--mtp-layers 0" in str(e.value)
