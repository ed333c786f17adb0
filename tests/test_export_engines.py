"""What the engines build, beyond the schema of their configs (tests/test_export.py):
torchtitan's device mesh and pipeline schedules, and that `--engine torchtitan` searches
only plans it can build; its FP8 MoE converters; Megatron's fp16 gradient reduction; the
attention kernel torchtitan and DeepSpeed cannot name. Where torchtitan 0.2.x is installed
its ParallelDims builds each exported mesh on a fake process group.

Sources (torchtitan 0.2.2): distributed/parallel_dims.py (ETP = 1 or TP; efsdp =
dp_shard·cp·tp/(ep·etp); fsdp_enabled = dp_shard > 1 or cp > 1), distributed/
pipeline_parallel.py ("Multi-stage schedule requires at least 2 stages per rank"),
components/quantization/float8.py (Float8GroupedMMConverter: no PP, no CP); torch
distributed/pipelining/schedules.py Schedule1F1B (micro-batches >= stages).
"""

from __future__ import annotations

import json
from dataclasses import replace
import tomllib

import pytest
from engine_checks import (SKIP_022, SKIP_DS, deepspeed_accepts, installed, run_torchtitan_022, torchtitan_03_parse,
                           torchtitan_022_dir, torchtitan_version)

from paraplan.errors import SpecError
from paraplan.export import deepspeed, megatron, torchtitan
from paraplan.search.policy import best_exportable
from paraplan.plan.axes import AttentionKernel, Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.plan.space import PlanBatch, enumerate_space
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Fp8Recipe, Precision, Workload

LLAMA, MIXTRAL = load_model("llama3-8b"), load_model("mixtral-8x7b")
# torchtitan's DeepSeek-V3 trains no multi-token-prediction module: the model as --mtp-layers 0 gives it
DSV3 = replace(load_model("deepseek-v3"), mtp_layers=0)
WL = Workload(global_batch_size=64, seq_len=4096)
WL_MOE = Workload(global_batch_size=256, seq_len=4096)


def plan(**kw):
    base = dict(tp=1, pp=1, dp=16, micro_batch_size=1, attention=AttentionKernel.FLASH3)
    base.update(kw)
    return torchtitan.SUPPORT.adapt(make_plan(**base))


def mesh_of(cfg: dict) -> tuple[int, ...]:
    """(dp_replicate, dp_shard, cp, tp, pp, ep, etp) of an exported torchtitan config."""
    par = cfg["parallelism"]
    return tuple(par[k] for k in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                                  "context_parallel_degree", "tensor_parallel_degree", "pipeline_parallel_degree",
                                  "expert_parallel_degree", "expert_tensor_parallel_degree"))


def torchtitan_would_build(cfg: dict, workload: Workload) -> bool:
    """torchtitan 0.2.2's rules, read off the exported config (not off paraplan's plan)."""
    rep, shard, cp, tp, pp, ep, etp = mesh_of(cfg)
    par = cfg["parallelism"]
    ok = (ep == 1 or etp in (1, tp)) and (shard * cp * tp) % (ep * etp) == 0
    if cp > 1:  # FSDP2 over dp_shard·cp: the plan must have priced sharding (ZeRO-0 writes "default")
        ok &= par["fsdp_reshard_after_forward"] != "default"
    if pp > 1:
        m = cfg["training"]["local_batch_size"] // par["pipeline_parallel_microbatch_size"]
        stages_per_rank = (cfg["_layers"] // par["pipeline_parallel_layers_per_stage"]) // pp
        if par["pipeline_parallel_schedule"] in ("Interleaved1F1B", "LoopedBFS"):
            ok &= stages_per_rank >= 2
        if par["pipeline_parallel_schedule"] == "1F1B":
            ok &= m >= pp
    return ok


def mesh_job(cfg: dict, world: int) -> dict:
    """A job for torchtitan 0.2.2's ParallelDims.build_mesh (tests/torchtitan_022.py)."""
    return {"toml": None, "mesh": list(mesh_of(cfg)), "world": world}


# (model, plan, workload, field the refusal names, a neighbour plan torchtitan builds)
REFUSED = {
    "zero0-cp": (LLAMA, plan(cp=2, dp=8), WL, "zero", plan(cp=2, dp=8, zero=ZeroStage.GRADIENTS)),
    "bfs-vp1": (LLAMA, plan(pp=2, dp=8, schedule=Schedule.BREADTH_FIRST, zero=ZeroStage.PARAMETERS), WL, "vp",
                plan(pp=2, dp=8, vp=2, schedule=Schedule.BREADTH_FIRST, zero=ZeroStage.PARAMETERS)),
    "interleaved-vp1": (LLAMA, plan(pp=2, dp=8, schedule=Schedule.INTERLEAVED_1F1B, zero=ZeroStage.PARAMETERS), WL,
                        "vp", plan(pp=2, dp=8, vp=2, schedule=Schedule.INTERLEAVED_1F1B, zero=ZeroStage.PARAMETERS)),
    "1f1b-m<pp": (LLAMA, plan(pp=4, dp=4, micro_batch_size=8, zero=ZeroStage.PARAMETERS), WL, "micro-batches",
                  plan(pp=4, dp=4, micro_batch_size=4, zero=ZeroStage.PARAMETERS)),
    "ep-over-ddp": (MIXTRAL, plan(dp=64, ep=8), WL_MOE, "ep", plan(dp=64, ep=8, zero=ZeroStage.GRADIENTS)),
    "ep-over-replicas": (MIXTRAL, plan(dp=64, dp_shard=4, ep=8, zero=ZeroStage.PARAMETERS), WL_MOE, "ep",
                         plan(dp=64, dp_shard=8, ep=8, zero=ZeroStage.PARAMETERS)),
    "etp-not-1-or-tp": (MIXTRAL, plan(tp=4, dp=16, ep=4, etp=2, sequence_parallel=True, zero=ZeroStage.PARAMETERS),
                        WL_MOE, "etp",
                        plan(tp=4, dp=16, ep=4, etp=4, sequence_parallel=True, zero=ZeroStage.PARAMETERS)),
    "tp-experts-without-ep": (MIXTRAL, plan(tp=2, dp=32, sequence_parallel=True, zero=ZeroStage.PARAMETERS), WL_MOE,
                              "etp", plan(tp=2, dp=32, etp=2, sequence_parallel=True, zero=ZeroStage.PARAMETERS)),
    "unfused-attention": (LLAMA, plan(zero=ZeroStage.GRADIENTS, attention=AttentionKernel.UNFUSED), WL, "attention",
                          plan(zero=ZeroStage.GRADIENTS)),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_torchtitan_refuses_what_it_cannot_build_in_one_line(name):
    model, bad, wl, field, good = REFUSED[name]
    with pytest.raises(SpecError) as e:
        torchtitan.check(bad, model, wl)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"engine torchtitan: {field}=") and "torchtitan allows" in msg
    torchtitan.check(good, model, wl)  # the neighbour passes: the rule is that narrow
    cfg = dict(torchtitan.job_config(good, model, wl), _layers=model.num_layers)
    assert torchtitan_would_build(cfg, wl)


@pytest.mark.skipif(torchtitan_022_dir() is None, reason=SKIP_022)
@pytest.mark.parametrize("name", ["ep-over-ddp", "ep-over-replicas", "etp-not-1-or-tp"])
def test_torchtitan_builds_the_expert_mesh_it_accepts_and_not_the_refused_one(name):
    model, bad, wl, _, good = REFUSED[name]
    shard = 1 if bad.zero is ZeroStage.NONE else bad.dp_shard
    cfg = {"parallelism": {"data_parallel_replicate_degree": bad.dp // shard, "data_parallel_shard_degree": shard,
                           "context_parallel_degree": bad.cp, "tensor_parallel_degree": bad.tp,
                           "pipeline_parallel_degree": bad.pp, "expert_parallel_degree": bad.ep,
                           "expert_tensor_parallel_degree": bad.etp}}
    ok, refused = run_torchtitan_022([mesh_job(torchtitan.job_config(good, model, wl), good.num_gpus),
                                      mesh_job(cfg, bad.num_gpus)])
    assert ok["error"] is None and refused["error"] is not None


SEARCHES = {  # the cases the review found: an unbuildable EP mesh, ZeRO-0 with CP
    "mixtral-64": (MIXTRAL, 64, WL_MOE),
    "llama3-70b-64": (load_model("llama3-70b"), 64, WL_MOE),
}


@pytest.mark.parametrize("name", list(SEARCHES))
def test_export_without_plan_flags_picks_a_plan_torchtitan_builds(name):
    model, gpus, wl = SEARCHES[name]
    cluster = load_cluster("dgx-h100", num_gpus=gpus)
    est = best_exportable(model, cluster, wl, torchtitan.SUPPORT, torchtitan.check)
    cfg = dict(torchtitan.job_config(est.plan, model, wl), _layers=model.num_layers)
    assert torchtitan_would_build(cfg, wl), est.plan.describe()
    if torchtitan_022_dir() is not None:  # (checked without it too: torchtitan_would_build)
        assert run_torchtitan_022([mesh_job(cfg, gpus)])[0]["error"] is None


def test_the_engine_search_space_holds_only_plans_the_exporter_accepts():
    model, cluster = MIXTRAL, load_cluster("dgx-h100", num_gpus=32)
    limits = torchtitan.SUPPORT.search_limits()
    seen = 0
    for batch, _ in enumerate_space(model, cluster, WL_MOE, limits):
        for i in range(0, len(batch), max(1, len(batch) // 50)):
            torchtitan.check(batch.plan(i), model, WL_MOE)  # raises for a plan the search should not hold
            seen += 1
    assert seen > 100


def test_torchtitan_fp8_moe_converts_the_grouped_experts(tmp_path):
    wl = Workload(global_batch_size=1024, seq_len=4096, precision=Precision.FP8)
    p = plan(dp=256, ep=64, zero=ZeroStage.GRADIENTS)
    res = torchtitan.export(p, DSV3, load_cluster("dgx-h100", num_gpus=256), wl)
    cfg = tomllib.loads(res.text)
    assert cfg["model"]["converters"] == ["quantize.linear.float8", "quantize.grouped_mm.float8"]
    assert cfg["quantize"]["grouped_mm"]["float8"]["fqns"] == ["experts"]
    dense = tomllib.loads(torchtitan.export(plan(zero=ZeroStage.GRADIENTS), LLAMA,
                                            load_cluster("dgx-h100", num_gpus=16), wl).text)
    assert dense["model"]["converters"] == ["quantize.linear.float8"] and "quantize" not in dense
    with pytest.raises(SpecError, match="pp×cp"):  # Float8GroupedMMConverter asserts PP = CP = 1
        torchtitan.check(plan(pp=2, dp=128, ep=64, zero=ZeroStage.GRADIENTS), DSV3, wl)
    with pytest.raises(SpecError, match="--mtp-layers 0"):  # the preset's MTP module, which it would not train
        torchtitan.check(p, load_model("deepseek-v3"), wl)
    if torchtitan_022_dir() is not None:
        path = tmp_path / "tt.toml"
        path.write_text(res.text)
        verdict = run_torchtitan_022([{"toml": str(path), "mesh": None, "world": p.num_gpus}])[0]
        assert verdict["error"] is None, verdict["error"]
        assert verdict["job"]["quantize"]["grouped_mm"]["float8"]["fqns"] == ["experts"]
        assert "quantize.grouped_mm.float8" in verdict["job"]["model"]["converters"]


def test_rowwise_fp8_goes_to_torchtitan_by_recipe_name_and_megatron_refuses_it(tmp_path):
    """torchao's row-wise recipe: torchtitan names it (quantize.linear.float8.recipe_name, which
    its ConfigManager parses); Megatron-LM's --fp8-recipe has no row-wise choice: one line."""
    wl = Workload(global_batch_size=64, seq_len=4096, precision=Precision.FP8, fp8_recipe=Fp8Recipe.ROWWISE)
    p, cluster = plan(zero=ZeroStage.GRADIENTS), load_cluster("dgx-h100", num_gpus=16)
    res = torchtitan.export(p, LLAMA, cluster, wl)
    cfg = tomllib.loads(res.text)
    assert cfg["quantize"]["linear"]["float8"]["recipe_name"] == "rowwise"
    tensorwise = tomllib.loads(torchtitan.export(p, LLAMA, cluster, replace(wl, fp8_recipe=Fp8Recipe.TENSORWISE)).text)
    assert "quantize" not in tensorwise
    with pytest.raises(SpecError, match="fp8_recipe='rowwise'.*no row-wise"):
        megatron.check(make_plan(dp=16), LLAMA, wl)
    if torchtitan_022_dir() is not None:
        path = tmp_path / "tt.toml"
        path.write_text(res.text)
        verdict = run_torchtitan_022([{"toml": str(path), "mesh": None, "world": p.num_gpus}])[0]
        assert verdict["error"] is None, verdict["error"]
        assert verdict["job"]["quantize"]["linear"]["float8"]["recipe_name"] == "rowwise"


def test_megatron_reduces_fp16_gradients_in_fp32_as_the_plan_prices():
    p = megatron.SUPPORT.adapt(make_plan(tp=1, pp=1, dp=16, micro_batch_size=1, zero=ZeroStage.OPTIMIZER))
    assert p.grad_reduce_fp32
    cluster = load_cluster("dgx-h100", num_gpus=16)
    fp16 = megatron.export(p, LLAMA, cluster, Workload(global_batch_size=64, seq_len=4096,
                                                       precision=Precision.FP16)).text
    bf16 = megatron.export(p, LLAMA, cluster, WL).text
    # validate_args sets accumulate_allreduce_grads_in_fp32 for bf16 only
    assert "--accumulate-allreduce-grads-in-fp32" in fp16 and "--accumulate-allreduce-grads-in-fp32" not in bf16


def test_deepspeed_refuses_the_unfused_kernel_it_cannot_name():
    p = make_plan(tp=1, pp=1, dp=16, micro_batch_size=1, recompute=Recompute.NONE, attention=AttentionKernel.UNFUSED)
    with pytest.raises(SpecError, match="attention='unfused'"):
        deepspeed.check(p, LLAMA, WL)
    deepspeed.check(make_plan(tp=1, pp=1, dp=16, micro_batch_size=1), LLAMA, WL)


def test_torchtitan_refuses_an_moe_model_it_has_no_model_for(capsys):
    """Mixtral is no torchtitan model (its llama3 code is dense): one line, before a search."""
    from support import run
    with pytest.raises(SpecError, match="model='mixtral-8x7b'.*deepseek-v3"):
        torchtitan.export(plan(dp=64, ep=8, zero=ZeroStage.GRADIENTS), MIXTRAL, load_cluster("dgx-h100", num_gpus=64),
                          WL_MOE)
    code, out, err = run(capsys, "export", "--format", "torchtitan", "--model", "mixtral-8x7b", "--gpus", "64")
    assert code == 2 and out == "" and err.count("\n") == 1 and "torchtitan allows MoE models" in err


def test_deepspeed_says_why_it_cannot_run_an_moe_model_on_more_gpus_than_its_batch(capsys):
    """Its pins (PP = CP = 1) are the engine's, not the user's: the error names the engine."""
    from support import run
    code, out, err = run(capsys, "export", "--format", "deepspeed", "--model", "deepseek-v3", "--mtp-layers", "0",
                         "--gpus", "1024", "--batch", "512")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("paraplan: error: engine deepspeed:") and "--pp" not in err and "data-parallel only" in err


def test_deepspeed_search_names_its_own_pins_not_the_users(capsys):
    """`search --engine deepspeed` holds PP = CP = 1 as the engine's bound: a model with no plan
    there is refused naming the engine, not as a `--pp` the user never gave."""
    from support import run
    code, out, err = run(capsys, "search", "--engine", "deepspeed", "--model", "deepseek-v3", "--mtp-layers", "0",
                         "--gpus", "1024", "--batch", "512")
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("paraplan: error: engine deepspeed:") and "--pp" not in err


GPT_OSS = load_model("gpt-oss-20b")


@pytest.mark.parametrize("ep", [8, 4])
def test_deepspeed_exports_expert_parallelism_as_autoep(ep):
    """Mixtral with EP: AutoEP in the JSON (DeepSpeed 0.19.8 expert_parallel), not every expert
    on every GPU; DeepSpeed's own config, AutoEP and folding checks accept it."""
    p = deepspeed.SUPPORT.adapt(make_plan(tp=1, pp=1, dp=64, ep=ep, micro_batch_size=1, zero=ZeroStage.PARAMETERS,
                                          attention=AttentionKernel.FLASH3))
    res = deepspeed.export(p, MIXTRAL, load_cluster("dgx-h100", num_gpus=64), WL_MOE)
    cfg = json.loads(res.text)
    assert cfg["expert_parallel"] == {"enabled": True, "autoep_size": ep, "expert_tensor_parallel_size": 1,
                                      "preset_model": "mixtral"}
    assert any(f"{MIXTRAL.num_experts // ep} of the {MIXTRAL.num_experts} experts" in n for n in res.notes)
    if installed("deepspeed"):
        c = deepspeed_accepts(cfg, p.num_gpus, MIXTRAL.num_experts)
        assert c.expert_parallel_config.autoep_size == ep and c.zero_optimization_stage == 3
    ep1 = json.loads(deepspeed.export(replace(p, ep=1), MIXTRAL, load_cluster("dgx-h100", num_gpus=64), WL_MOE).text)
    assert "expert_parallel" not in ep1


@pytest.mark.parametrize("model, plan_kw, field", [
    (GPT_OSS, dict(ep=8), "ep"),                       # no AutoEP preset for gpt-oss
    (MIXTRAL, dict(ep=4, etp=2, tp=2, dp=32), "etp"),  # AutoEP 0.19.8: ETP = 1 only
    (MIXTRAL, dict(ep=8, capacity_factor=1.25), "capacity_factor"),  # AutoEP is dropless
])
def test_deepspeed_refuses_expert_layouts_autoep_lacks_in_one_line(model, plan_kw, field):
    kw = dict(tp=1, pp=1, dp=64, micro_batch_size=1, zero=ZeroStage.PARAMETERS, attention=AttentionKernel.FLASH3)
    kw.update(plan_kw)
    p = deepspeed.SUPPORT.adapt(make_plan(**kw))
    with pytest.raises(SpecError) as e:
        deepspeed.check(p, model, WL_MOE)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"engine deepspeed: {field}=")
    # the search inside DeepSpeed's bounds never holds such a plan (SpaceLimits.engine_rule)
    bad = PlanBatch.from_plans([p])
    assert bool(deepspeed.unbuildable(bad, model, WL_MOE)[0])


@pytest.mark.skipif(not installed("deepspeed"), reason=SKIP_DS)
def test_deepspeed_own_autoep_checks_can_fail():
    """The check the tests lean on refuses what DeepSpeed refuses (an EP width that does not
    divide the ranks, an unknown preset, more EP ranks than experts)."""
    p = deepspeed.SUPPORT.adapt(make_plan(tp=1, pp=1, dp=64, ep=8, micro_batch_size=1, zero=ZeroStage.PARAMETERS,
                                          attention=AttentionKernel.FLASH3))
    cfg = json.loads(deepspeed.export(p, MIXTRAL, load_cluster("dgx-h100", num_gpus=64), WL_MOE).text)
    for change, experts in (({"autoep_size": 24}, 8), ({"preset_model": "llama"}, 8), ({}, 4)):
        bad = dict(cfg, expert_parallel=dict(cfg["expert_parallel"], **change))
        with pytest.raises(ValueError):
            deepspeed_accepts(bad, 64, experts)


LLAMA405 = load_model("llama3.1-405b")


def test_torchtitan_405b_trains_in_the_plans_precision(tmp_path, monkeypatch):
    """torchtitan 0.3's llama3_405b turns on Float8LinearConverter, which no override turns off:
    a bf16 plan's 0.3 line names a registry module that builds the 405B spec without it (and
    runs the plan's ring CP by all-gather, saying so); an FP8 plan's TOML turns float8 on."""
    p = plan(tp=8, pp=16, vp=2, cp=2, dp=4, sequence_parallel=True, schedule=Schedule.INTERLEAVED_1F1B,
             zero=ZeroStage.GRADIENTS)
    cluster, wl = load_cluster("dgx-h100", num_gpus=1024), Workload(global_batch_size=2048, seq_len=8192)
    res = torchtitan.export(p, LLAMA405, cluster, wl, filename="runs/405b.toml")
    assert "llama3_405b turns on Float8LinearConverter; the plan trains in bf16" in res.text
    assert "runs CP by K/V all-gather only" in res.text
    assert res.launcher.endswith("--job.config_file runs/405b.toml") and res.launcher in res.text
    assert "converters" not in tomllib.loads(res.text)["model"]
    fp8 = tomllib.loads(torchtitan.export(p, LLAMA405, cluster, replace(wl, precision=Precision.FP8)).text)
    assert fp8["model"]["converters"] == ["quantize.linear.float8"]
    if (torchtitan_version() or (0, 0)) >= (0, 3):
        import inspect
        from torchtitan.models.llama3 import config_registry
        assert "Float8LinearConverter" in inspect.getsource(config_registry.llama3_405b)  # why a module is written
        args = torchtitan.cli_overrides_v03(torchtitan.job_config(p, LLAMA405, wl), LLAMA405)
        job, _ = torchtitan_03_parse(res.text, args, tmp_path, monkeypatch)
        assert job.model_spec.flavor == "405B" and "Float8" not in repr(job.model_spec.model)
        assert len(job.model_spec.model.layers) == LLAMA405.num_layers


@pytest.mark.parametrize("preset, name, flavor", [("deepseek-v3", "deepseek_v3", "671B"),
                                                  ("deepseek-v2", "deepseek_v3", "236B"),
                                                  ("qwen3-235b-a22b", "qwen3", "235B-A22B"),
                                                  ("gpt-oss-120b", "gpt_oss", "120b")])
def test_torchtitan_moe_models_go_out_under_torchtitan_names(preset, name, flavor):
    model = replace(load_model(preset), mtp_layers=0)
    p = plan(dp=64, ep=8, zero=ZeroStage.GRADIENTS)
    cfg = tomllib.loads(torchtitan.export(p, model, load_cluster("dgx-h100", num_gpus=64),
                                          Workload(global_batch_size=256, seq_len=4096)).text)
    assert cfg["model"] == {"name": name, "flavor": flavor}
