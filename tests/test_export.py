"""`paraplan export`: every exported config parses and says what the plan says.

Each config is checked twice where possible:
* against the engine's documented schema (field and flag names written down below with
  their source), always;
* with the engine's own config code, which the README's test command installs (the
  `engines` extra and torchtitan 0.2.2 beside it; tests/engine_checks.py): torchtitan
  0.2.2's ConfigManager reads the TOML (`--job.config_file`, in a child process, since 0.2.2
  and 0.3 cannot share an environment), torchtitan 0.3's ConfigManager parses the override
  command line; Megatron-Core builds its TransformerConfig and DistributedDataParallelConfig
  from the script's arguments (as Megatron-LM's `core_transformer_config_from_args` does)
  and runs their validation; DeepSpeed's DeepSpeedConfig loads the JSON and checks the batch
  arithmetic.
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from dataclasses import replace
from types import SimpleNamespace

import pytest
from engine_checks import (SKIP_03, SKIP_022, SKIP_DS, installed, run_torchtitan_022, torchtitan_03_parse,
                           torchtitan_022_dir, torchtitan_version)
from support import run

from paraplan.cost.chunks import chunk_layers
from paraplan.errors import SpecError
from paraplan.export import deepspeed, megatron, torchtitan
from paraplan.specs.engine import Engine
from paraplan.plan.axes import AttentionKernel, CPCommType, Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

EXPORTERS = {Engine.TORCHTITAN: torchtitan, Engine.MEGATRON: megatron, Engine.DEEPSPEED: deepspeed}
MODEL = load_model("llama3-8b")  # 32 layers, 32/8 heads
CLUSTER = load_cluster("dgx-h100", num_gpus=16)
WL = Workload(global_batch_size=64, seq_len=4096)


def plan(**kw):
    base = dict(tp=1, pp=1, dp=16, micro_batch_size=1, attention=AttentionKernel.FLASH3)
    base.update(kw)
    return make_plan(**base)


# name -> (plan, engines that can express it)
PLANS = {
    "tp2-pp2-vp4-selective-zero1": (plan(tp=2, pp=2, dp=4, vp=4, schedule=Schedule.INTERLEAVED_1F1B,
                                         sequence_parallel=True, recompute=Recompute.SELECTIVE,
                                         zero=ZeroStage.OPTIMIZER), {Engine.MEGATRON}),
    "fsdp-full-recompute": (plan(micro_batch_size=2, zero=ZeroStage.PARAMETERS, recompute=Recompute.FULL),
                            {Engine.TORCHTITAN, Engine.MEGATRON, Engine.DEEPSPEED}),
    "hsdp-tp2-sp": (plan(tp=2, dp=8, zero=ZeroStage.PARAMETERS, dp_shard=4, sequence_parallel=True,
                         tp_overlap=True), {Engine.TORCHTITAN, Engine.MEGATRON}),
    "autotp-zero2-offload": (plan(tp=2, dp=8, zero=ZeroStage.GRADIENTS, offload_optimizer=True, micro_batch_size=4),
                             {Engine.DEEPSPEED}),
    "tp2-zero1-offload": (plan(tp=2, dp=8, sequence_parallel=True, zero=ZeroStage.OPTIMIZER, offload_optimizer=True),
                          {Engine.MEGATRON}),
    "pp4-1f1b-first-k": (plan(tp=4, pp=4, dp=1, sequence_parallel=True, recompute=Recompute.FIRST_K,
                              recompute_num_layers=4), {Engine.MEGATRON}),
    "pp2-gpipe-fsdp": (plan(pp=2, dp=8, micro_batch_size=2, schedule=Schedule.GPIPE, zero=ZeroStage.PARAMETERS),
                       {Engine.TORCHTITAN}),
    # torchtitan's DDP (ZeRO-0) replicates over a 1-D mesh only: "DDP has not supported > 1D
    # parallelism" (torchtitan 0.2.2 models/llama3/infra/parallelize.py)
    "pp2-gpipe-ddp": (plan(pp=2, dp=8, micro_batch_size=2, schedule=Schedule.GPIPE), set()),
    "tp2-ddp": (plan(tp=2, dp=8, sequence_parallel=True), {Engine.MEGATRON}),
    # torchtitan 0.2.2 trains TP or PP without FSDP (or CP) in fp32 (maybe_enable_amp)
    "tp8-pp2-dp1": (plan(tp=8, pp=2, dp=1, sequence_parallel=True, zero=ZeroStage.PARAMETERS), {Engine.MEGATRON}),
    "pp2-bfs-vp2-cp2": (plan(pp=2, dp=4, cp=2, vp=2, schedule=Schedule.BREADTH_FIRST, zero=ZeroStage.PARAMETERS,
                             cp_comm_type=CPCommType.ALL_GATHER), {Engine.TORCHTITAN}),
    # torchtitan shards over dp_shard × CP whenever CP > 1 (ParallelDims.fsdp_enabled): no ZeRO-0 with CP
    "tp2-cp4-ring": (plan(tp=2, cp=4, dp=2, sequence_parallel=True), {Engine.MEGATRON}),
    "tp2-cp4-ring-zero3": (plan(tp=2, cp=4, dp=2, sequence_parallel=True, zero=ZeroStage.PARAMETERS),
                           {Engine.TORCHTITAN, Engine.MEGATRON}),
    "tp2-cp2-allgather-zero2": (plan(tp=2, cp=2, dp=4, sequence_parallel=True, zero=ZeroStage.GRADIENTS,
                                     cp_comm_type=CPCommType.ALL_GATHER), {Engine.TORCHTITAN, Engine.MEGATRON}),
    # torch's multi-stage schedules need 2+ stages per rank (torchtitan pipeline_parallel.py)
    "pp2-bfs-vp1": (plan(pp=2, dp=8, schedule=Schedule.BREADTH_FIRST, zero=ZeroStage.PARAMETERS), set()),
    # torch's Schedule1F1B needs micro-batches >= stages: 64 / (4 × 8) = 2 < PP 4
    "pp4-1f1b-m2": (plan(pp=4, dp=4, micro_batch_size=8, zero=ZeroStage.PARAMETERS), {Engine.MEGATRON}),
    "cp2-ulysses": (plan(cp=2, dp=8, cp_comm_type=CPCommType.A2A), {Engine.MEGATRON}),
    "ddp-mb8": (plan(micro_batch_size=4), {Engine.TORCHTITAN, Engine.MEGATRON, Engine.DEEPSPEED}),
    # 32 layers in 2 × 17 chunks of 2 slots: the embedding and the loss take one each
    # (--account-for-embedding/loss-in-pipeline-split)
    "pp2-vp17-accounted": (plan(pp=2, dp=8, vp=17, schedule=Schedule.INTERLEAVED_1F1B, zero=ZeroStage.OPTIMIZER),
                           {Engine.MEGATRON}),
    # the same split on FSDP2, as torchtitan runs it (pipeline_parallel_first/last_stage_less_layers)
    "pp2-vp17-fsdp": (plan(pp=2, dp=8, vp=17, schedule=Schedule.INTERLEAVED_1F1B, zero=ZeroStage.GRADIENTS),
                      {Engine.TORCHTITAN, Engine.MEGATRON}),
    # 32 layers in 4 × 3 chunks of 3: four spare slots, a layout string (Megatron) or each
    # chunk's modules by name (torchtitan's module_fqns_per_model_part)
    "pp4-vp3-layout": (plan(tp=2, pp=4, dp=2, vp=3, schedule=Schedule.INTERLEAVED_1F1B, sequence_parallel=True,
                            zero=ZeroStage.OPTIMIZER), {Engine.MEGATRON}),
    "pp4-vp3-fsdp-layout": (plan(tp=2, pp=4, dp=2, vp=3, schedule=Schedule.INTERLEAVED_1F1B, sequence_parallel=True,
                                 zero=ZeroStage.GRADIENTS), {Engine.TORCHTITAN, Engine.MEGATRON}),
}
CASES = [(name, e) for name, (_, ok) in PLANS.items() for e in Engine if e in ok]
REFUSED = [(name, e) for name, (_, ok) in PLANS.items() for e in Engine if e not in ok]


def exported(name, engine):
    p, _ = PLANS[name]
    mod = EXPORTERS[engine]
    p = mod.SUPPORT.adapt(p)
    return p, mod.export(p, MODEL, CLUSTER, WL)


# --------------------------------------------------------------------- torchtitan
# torchtitan 0.2.2 torchtitan/config/job_config.py: sections and the fields exported here.
TORCHTITAN_SCHEMA = {
    "job": {"description"},
    "model": {"name", "flavor", "converters"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param",
                 "mixed_precision_reduce"},
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "enable_async_tensor_parallel", "pipeline_parallel_degree",
                    "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "context_parallel_degree", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "context_parallel_rotate_method", "module_fqns_per_model_part"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "compile": {"enable", "components"},
}


def check_torchtitan(p, cfg: dict, head: str = "output") -> None:
    """The parsed TOML sections say what the plan says (`head`: the output layer's module
    name, 0.2's "output", 0.3's "lm_head")."""
    par, tr, ac = cfg["parallelism"], cfg["training"], cfg["activation_checkpoint"]
    assert par["tensor_parallel_degree"] == p.tp and par["pipeline_parallel_degree"] == p.pp
    assert par["context_parallel_degree"] == p.cp and par["expert_parallel_degree"] == p.ep
    if p.cp > 1:  # torchtitan's default (and 0.3's only) rotation is the all-gather
        rotate = {CPCommType.P2P: "alltoall", CPCommType.ALL_GATHER: "allgather"}[p.cp_comm_type]
        assert par.get("context_parallel_rotate_method", "allgather") == rotate
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == p.dp
    if p.zero is ZeroStage.NONE:
        assert par["data_parallel_shard_degree"] == 1
    else:
        assert par["data_parallel_shard_degree"] == p.dp_shard
        assert par["fsdp_reshard_after_forward"] == ("always" if p.zero is ZeroStage.PARAMETERS else "never")
    per_dp = WL.global_batch_size // p.dp
    assert tr["global_batch_size"] == WL.global_batch_size and tr["seq_len"] == WL.seq_len
    if p.pp > 1:
        assert tr["local_batch_size"] == per_dp
        assert par["pipeline_parallel_microbatch_size"] == p.micro_batch_size
        parts = par.get("module_fqns_per_model_part")
        if parts:  # each virtual stage's modules by name: the embedding first, norm and head last
            assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", head]
            assert [n for part in parts for n in part if n.startswith("layers.")] == [
                f"layers.{i}" for i in range(MODEL.num_layers)]
            counts = [sum(n.startswith("layers.") for n in part) for part in parts]
        else:
            # torchtitan's split (generate_llm_fqn_per_model_part): PP×VP stages of equal slots, the
            # embedding's (first_stage_less_layers) and the loss's (last_...) taken off the ends
            per = par["pipeline_parallel_layers_per_stage"]
            first, last = (par["pipeline_parallel_first_stage_less_layers"],
                           par["pipeline_parallel_last_stage_less_layers"])
            assert per * p.pp * p.vp == MODEL.num_layers + first + last
            counts = [per] * (p.pp * p.vp)
            counts[0] -= first
            counts[-1] -= last
        assert counts == [len(r) for r in chunk_layers(MODEL, WL, p)]
        assert par["pipeline_parallel_schedule"] == torchtitan.SCHEDULES[p.schedule]
    else:
        assert tr["local_batch_size"] == p.micro_batch_size  # accumulation: per_dp / mb steps
    assert ac["mode"] == {Recompute.NONE: "none", Recompute.FULL: "full", Recompute.SELECTIVE: "selective"}[p.recompute]
    assert par["enable_async_tensor_parallel"] == p.tp_overlap
    assert tr["mixed_precision_reduce"] == "float32" and p.grad_reduce_fp32


@pytest.mark.parametrize("name", [n for n, e in CASES if e is Engine.TORCHTITAN])
def test_torchtitan_toml_matches_plan(name):
    p, res = exported(name, Engine.TORCHTITAN)
    cfg = tomllib.loads(res.text)
    for section, values in cfg.items():
        assert section in TORCHTITAN_SCHEMA and set(values) <= TORCHTITAN_SCHEMA[section], section
    check_torchtitan(p, cfg)


TT_CASES = [n for n, e in CASES if e is Engine.TORCHTITAN]


@pytest.fixture(scope="module")
def torchtitan_022_verdicts(tmp_path_factory):
    """torchtitan 0.2.2's ConfigManager on every exported TOML, and its ParallelDims building
    each mesh on a fake process group: one child process for all cases (engine_checks.py)."""
    if torchtitan_022_dir() is None:
        pytest.skip(SKIP_022)
    folder = tmp_path_factory.mktemp("tt022")
    jobs = []
    for name in TT_CASES:
        p, res = exported(name, Engine.TORCHTITAN)
        path = folder / f"{name}.toml"
        path.write_text(res.text)
        jobs.append({"toml": str(path), "mesh": None, "world": p.num_gpus})
    return dict(zip(TT_CASES, run_torchtitan_022(jobs)))


@pytest.mark.parametrize("name", TT_CASES)
def test_torchtitan_02_reads_the_toml(name, torchtitan_022_verdicts):
    p, _ = exported(name, Engine.TORCHTITAN)
    verdict = torchtitan_022_verdicts[name]
    assert verdict["error"] is None, verdict["error"]
    job = verdict["job"]
    par = job["parallelism"]
    cfg = {"parallelism": {f: par[f] for f in TORCHTITAN_SCHEMA["parallelism"]},
           "training": {f: job["training"][f] for f in TORCHTITAN_SCHEMA["training"]},
           "activation_checkpoint": {"mode": job["activation_checkpoint"]["mode"]}}
    # torchtitan reads the components paraplan priced: the loss compiled with the blocks
    assert job["compile"]["enable"] is p.compiled and p.compiled_loss is p.compiled
    if p.compiled:
        assert job["compile"]["components"] == ["model", "loss"]
    check_torchtitan(p, cfg)
    # the flavor torchtitan 0.2.2 builds is the model paraplan priced
    args = verdict["model_args"]
    assert (args["n_layers"], args["dim"], args["n_heads"]) == (MODEL.num_layers, MODEL.hidden_size, MODEL.num_heads)


@pytest.mark.skipif((torchtitan_version() or (0, 0)) < (0, 3), reason=SKIP_03)
@pytest.mark.parametrize("name", [n for n, e in CASES if e is Engine.TORCHTITAN])
def test_torchtitan_03_parses_the_overrides(name, tmp_path, monkeypatch):
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _get_pipeline_metadata
    p, res = exported(name, Engine.TORCHTITAN)
    args = torchtitan.cli_overrides_v03(torchtitan.job_config(p, MODEL, WL), MODEL)
    assert args is not None and shlex.join(args) in res.text
    job, rotate = torchtitan_03_parse(res.text, args, tmp_path, monkeypatch)
    assert rotate.endswith("ALL_GATHER")  # 0.3's only CP exchange: a ring plan's line says so
    if p.cp > 1 and p.cp_comm_type is CPCommType.P2P:
        assert "runs CP by K/V all-gather only" in res.text and "--cp-comm allgather, predicted step" in res.text
    assert (job.model_spec.name, job.model_spec.flavor) == torchtitan.MODELS[MODEL.name][:2]
    par = job.parallelism
    cfg = {"parallelism": {f: getattr(par, f) for f in TORCHTITAN_SCHEMA["parallelism"] if hasattr(par, f)},
           "training": {f: getattr(job.training, f) for f in TORCHTITAN_SCHEMA["training"]},
           "activation_checkpoint": {"mode": {FullAC.Config: "full", SelectiveAC.Config: "selective",
                                              type(None): "none"}[type(job.activation_checkpoint)]}}
    cfg["parallelism"]["enable_async_tensor_parallel"] = job.compile.enable_async_tensor_parallel
    assert job.compile.enable is p.compiled and p.compiled_loss is p.compiled
    if p.compiled:
        assert job.compile.components == ["model", "loss"]  # as priced
    check_torchtitan(replace(p, cp_comm_type=CPCommType.ALL_GATHER) if p.cp > 1 else p, cfg,  # 0.3's only CP
                     head="lm_head")
    dims = ParallelDims.from_config(par, p.num_gpus)  # torchtitan's own mesh validation
    if p.pp > 1:  # torchtitan's own stage split: the layers where the simulator put them
        parts = par.module_fqns_per_model_part  # given, torchtitan splits by it
        if parts is None:
            stages, layers, first, last = _get_pipeline_metadata(dims, par,
                                                                 SimpleNamespace(layers=[0] * MODEL.num_layers))
            assert stages == p.pp * p.vp
            parts = _generate_llm_fqn_per_model_part(stages, layers, first, last)
        assert len(parts) == p.pp * p.vp
        assert [sum(n.startswith("layers.") for n in part) for part in parts] == [len(r) for r in
                                                                                  chunk_layers(MODEL, WL, p)]


# --------------------------------------------------------------------- Megatron-LM
# Megatron-LM megatron/training/arguments.py (core_r0.16): the flags exported here and
# whether each takes a value.
# Transformer Engine 2.x attention/dot_product_attention/context_parallel.py (and
# Megatron-Core TransformerConfig.cp_comm_type's docstring): the CP exchanges it runs.
TE_CP_COMM_TYPES = {"p2p", "all_gather", "a2a", "a2a+p2p"}
MEGATRON_FLAGS = {
    "--num-layers": int, "--hidden-size": int, "--ffn-hidden-size": int, "--num-attention-heads": int,
    "--seq-length": int, "--max-position-embeddings": int, "--position-embedding-type": str,
    "--rotary-base": int, "--use-rope-scaling": bool, "--rope-scaling-factor": float, "--ckpt-format": str,
    "--normalization": str, "--disable-bias-linear": bool, "--attention-dropout": float, "--hidden-dropout": float,
    "--tokenizer-type": str, "--vocab-size": int, "--kv-channels": int, "--group-query-attention": bool,
    "--num-query-groups": int, "--swiglu": bool, "--untie-embeddings-and-output-weights": bool,
    "--multi-latent-attention": bool, "--kv-lora-rank": int, "--q-lora-rank": int, "--qk-head-dim": int,
    "--qk-pos-emb-head-dim": int, "--v-head-dim": int,
    "--num-experts": int, "--moe-router-topk": int, "--moe-ffn-hidden-size": int, "--moe-layer-freq": str,
    "--moe-token-dispatcher-type": str, "--moe-grouped-gemm": bool, "--moe-shared-expert-intermediate-size": int,
    "--moe-expert-capacity-factor": float, "--moe-pad-expert-input-to-capacity": bool,
    "--overlap-moe-expert-parallel-comm": bool, "--moe-shared-expert-overlap": bool,
    "--moe-permute-fusion": bool, "--moe-router-padding-for-quantization": bool,
    "--moe-flex-dispatcher-backend": str, "--moe-router-num-groups": int, "--moe-router-group-topk": int,
    "--tensor-model-parallel-size": int, "--pipeline-model-parallel-size": int, "--context-parallel-size": int,
    "--cp-comm-type": str, "--num-layers-per-virtual-pipeline-stage": int, "--sequence-parallel": bool,
    "--account-for-embedding-in-pipeline-split": bool, "--account-for-loss-in-pipeline-split": bool,
    "--pipeline-model-parallel-layout": str, "--mtp-num-layers": int,
    "--tp-comm-overlap": bool, "--expert-model-parallel-size": int, "--expert-tensor-parallel-size": int,
    "--micro-batch-size": int, "--global-batch-size": int,
    "--recompute-granularity": str, "--recompute-method": str, "--recompute-num-layers": int,
    "--recompute-modules": list,  # nargs="*"
    "--fp8-recipe": str,
    "--use-distributed-optimizer": bool, "--use-megatron-fsdp": bool, "--data-parallel-sharding-strategy": str,
    "--num-distributed-optimizer-instances": int, "--overlap-grad-reduce": bool, "--overlap-param-gather": bool,
    "--optimizer-cpu-offload": bool, "--optimizer-offload-fraction": float, "--use-precision-aware-optimizer": bool,
    "--accumulate-allreduce-grads-in-fp32": bool,
    "--bf16": bool, "--fp16": bool, "--fp8-format": str, "--attention-backend": str,
}


def megatron_args(text: str) -> dict:
    """The script's PARAPLAN_ARGS as {argparse dest: value} (Megatron-LM's flag -> dest rule)."""
    body = text.split("PARAPLAN_ARGS=(", 1)[1].split("\n)", 1)[0]
    tokens = shlex.split(body)
    out, i = {}, 0
    while i < len(tokens):
        flag = tokens[i]
        kind = MEGATRON_FLAGS[flag]  # KeyError: a flag Megatron-LM does not document
        if kind is bool:
            value, i = True, i + 1
        elif kind is list:
            j = i + 1
            while j < len(tokens) and not tokens[j].startswith("--"):
                j += 1
            value, i = tokens[i + 1:j], j
        else:
            value, i = kind(tokens[i + 1]), i + 2
        out[flag[2:].replace("-", "_")] = value
    return out


def megatron_stage_layers(a: dict, num_layers: int) -> list[int]:
    """Decoder layers per virtual stage (rank j % PP, chunk j // PP) as Megatron-LM reads the
    flags: its layout grammar ("E|(t|)*3,m|m||L": '|' splits stages, '(..)*r' and 'x*n'
    repeat, commas are cosmetic; PipelineParallelLayerLayout's docstring), or equal chunks
    of the layers plus one slot per account-for flag, the embedding's taken off the first
    chunk and the loss's off the last (validate_args, get_num_layers_to_build)."""
    pp = a["pipeline_model_parallel_size"]
    if "pipeline_model_parallel_layout" in a:
        text = a["pipeline_model_parallel_layout"].replace(",", "")
        text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
        text = re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
        stages = text.split("|")
        assert stages[0].startswith("E") and stages[-1].endswith("L") and len(stages) % pp == 0
        assert text.count("E") == text.count("L") == 1 and set(text) <= set("EtL|")
        return [x.count("t") for x in stages]
    emb, loss = (bool(a.get(f"account_for_{x}_in_pipeline_split")) for x in ("embedding", "loss"))
    slots = num_layers + emb + loss
    chunk = a.get("num_layers_per_virtual_pipeline_stage", slots // pp)
    assert slots % pp == 0 and (slots // pp) % chunk == 0
    counts = [chunk] * (slots // chunk)
    counts[0] -= emb
    counts[-1] -= loss
    return counts


def check_megatron(p, a: dict) -> None:
    assert a["tensor_model_parallel_size"] == p.tp and a["pipeline_model_parallel_size"] == p.pp
    assert a["context_parallel_size"] == p.cp
    # Transformer Engine's names (context_parallel.py raises "Unsupported communication type")
    assert a.get("cp_comm_type", "p2p") in TE_CP_COMM_TYPES
    assert a.get("cp_comm_type", "p2p") == {CPCommType.P2P: "p2p", CPCommType.ALL_GATHER: "all_gather",
                                            CPCommType.A2A: "a2a"}[p.cp_comm_type]
    assert a.get("sequence_parallel", False) == p.sequence_parallel
    assert a.get("tp_comm_overlap", False) == p.tp_overlap
    assert a["micro_batch_size"] == p.micro_batch_size and a["global_batch_size"] == WL.global_batch_size
    # the layers land on the virtual stages where the cost model and the simulator put them
    counts = megatron_stage_layers(a, MODEL.num_layers)
    assert len(counts) == p.pp * p.vp and sum(counts) == MODEL.num_layers
    assert counts == [len(r) for r in chunk_layers(MODEL, WL, p)]
    rc = (a.get("recompute_granularity"), a.get("recompute_method"), a.get("recompute_num_layers"))
    assert rc == {Recompute.NONE: (None, None, None), Recompute.SELECTIVE: ("selective", None, None),
                  Recompute.MODULES: ("selective", None, None), Recompute.FULL: ("full", "uniform", 1),
                  Recompute.FIRST_K: ("full", "block", p.recompute_num_layers // p.vp)}[p.recompute]
    assert "recompute_modules" not in a  # module recomputation: MoE/MLA models (test below)
    # Megatron-FSDP reduce-scatters only with the distributed optimizer (its DDP config)
    zero = {(False, None): ZeroStage.NONE, (True, None): ZeroStage.OPTIMIZER,
            (True, "optim_grads"): ZeroStage.GRADIENTS, (True, "optim_grads_params"): ZeroStage.PARAMETERS}
    assert zero[(a.get("use_distributed_optimizer", False), a.get("data_parallel_sharding_strategy"))] is p.zero
    assert p.dp // a.get("num_distributed_optimizer_instances", 1) == p.dp_shard
    assert a.get("overlap_grad_reduce", False) == p.dp_overlap
    assert a.get("optimizer_cpu_offload", False) == p.offload_optimizer
    # offloaded fp32 main parameters: the precision-aware path (else they stay on the GPU)
    assert a.get("use_precision_aware_optimizer", False) == p.offload_optimizer
    # Megatron derives DP from the world size the launcher starts
    nodes, per_node = (int(x.split("=")[1]) for x in a["_launch"])
    assert nodes * per_node // (p.tp * p.pp * p.cp) == p.dp


def parsed_megatron(res):
    a = megatron_args(res.text)
    a["_launch"] = [ln for ln in res.text.splitlines() if ln.startswith(("NNODES=", "GPUS_PER_NODE="))][::-1]
    return a


@pytest.mark.parametrize("name", [n for n, e in CASES if e is Engine.MEGATRON])
def test_megatron_arguments_match_plan(name):
    p, res = exported(name, Engine.MEGATRON)
    check_megatron(p, parsed_megatron(res))
    assert res.text.startswith("#!/usr/bin/env bash") and "pretrain_gpt.py" in res.text


@pytest.mark.skipif(not installed("megatron.core"), reason="megatron-core not installed")
@pytest.mark.parametrize("name", [n for n, e in CASES if e is Engine.MEGATRON] + ["moe"])
def test_megatron_core_accepts_the_arguments(name, monkeypatch):
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig
    if name == "moe":
        model, cluster = load_model("mixtral-8x7b"), CLUSTER
        p = megatron.SUPPORT.adapt(plan(tp=2, dp=8, ep=8, sequence_parallel=True, zero=ZeroStage.OPTIMIZER,
                                        capacity_factor=1.25, recompute=Recompute.MODULES))
        a = megatron_args(megatron.export(p, model, cluster, WL).text)
        assert a["expert_model_parallel_size"] == 8 and a["num_experts"] == model.num_experts
        assert a["moe_expert_capacity_factor"] == 1.25
        assert a["recompute_modules"] == ["layernorm", "moe_act"]  # fused attention: no core_attn
    else:
        model = MODEL
        p, res = exported(name, Engine.MEGATRON)
        a = megatron_args(res.text)
    # core_transformer_config_from_args: every TransformerConfig field that args has, plus renames
    kw = {k: a[k] for k in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                            "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                            )}
    kw.update(sequence_parallel=a.get("sequence_parallel", False), tp_comm_overlap=a.get("tp_comm_overlap", False),
              num_query_groups=a.get("num_query_groups"), gated_linear_unit=a.get("swiglu", False),
              bf16=a.get("bf16", False), fp16=a.get("fp16", False), add_bias_linear=not a.get("disable_bias_linear"),
              recompute_granularity=a.get("recompute_granularity"), recompute_method=a.get("recompute_method"),
              recompute_num_layers=a.get("recompute_num_layers"),
              attention_backend=AttnBackend[a["attention_backend"]],
              expert_model_parallel_size=a.get("expert_model_parallel_size", 1),
              expert_tensor_parallel_size=a.get("expert_tensor_parallel_size", 1))
    if "recompute_modules" in a:
        kw["recompute_modules"] = a["recompute_modules"]  # TransformerConfig checks the names
    import torch
    # validate_args: params_dtype from --bf16/--fp16; core_transformer_config_from_args: pipeline_dtype = params_dtype
    kw["params_dtype"] = kw["pipeline_dtype"] = torch.bfloat16 if a.get("bf16") else torch.float16
    # validate_args: the virtual stages from the layout string, or from the layers per virtual
    # stage counting a slot per account-for flag
    accounts = {f"account_for_{x}_in_pipeline_split": a.get(f"account_for_{x}_in_pipeline_split", False)
                for x in ("embedding", "loss")}
    kw.update(accounts)
    if "pipeline_model_parallel_layout" in a:
        kw["pipeline_model_parallel_layout"] = a["pipeline_model_parallel_layout"]
    elif "num_layers_per_virtual_pipeline_stage" in a:
        kw["virtual_pipeline_model_parallel_size"] = (a["num_layers"] + sum(accounts.values())) // (
            a["pipeline_model_parallel_size"] * a["num_layers_per_virtual_pipeline_stage"])
    if "num_experts" in a:
        kw.update(num_moe_experts=a["num_experts"], moe_router_topk=a["moe_router_topk"],
                  moe_ffn_hidden_size=a["moe_ffn_hidden_size"], moe_token_dispatcher_type=a["moe_token_dispatcher_type"],
                  moe_expert_capacity_factor=a.get("moe_expert_capacity_factor"),
                  moe_pad_expert_input_to_capacity=a.get("moe_pad_expert_input_to_capacity", False),
                  moe_grouped_gemm=a.get("moe_grouped_gemm", False))
    cfg = TransformerConfig(**kw)  # Megatron-Core's own validation (__post_init__)
    assert cfg.tensor_model_parallel_size == p.tp and cfg.pipeline_model_parallel_size == p.pp
    assert (cfg.virtual_pipeline_model_parallel_size or 1) == p.vp
    # Megatron-Core's own placement of the decoder layers, virtual stage by virtual stage,
    # is the cost model's
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    vps = cfg.virtual_pipeline_model_parallel_size
    built = [cfg.pipeline_model_parallel_layout.layout[j % p.pp][j // p.pp].count(LayerType.decoder)
             if cfg.pipeline_model_parallel_layout is not None
             else get_num_layers_to_build(cfg, vp_stage=j // p.pp if vps else None, pp_rank=j % p.pp)
             for j in range(p.pp * p.vp)]
    assert built == [len(r) for r in chunk_layers(model, WL, p)]
    ddp = DistributedDataParallelConfig(
        use_distributed_optimizer=a.get("use_distributed_optimizer", False),
        overlap_grad_reduce=a.get("overlap_grad_reduce", False), overlap_param_gather=a.get("overlap_param_gather", False),
        use_megatron_fsdp=a.get("use_megatron_fsdp", False),
        data_parallel_sharding_strategy=a.get("data_parallel_sharding_strategy", "no_shard"),
        num_distributed_optimizer_instances=a.get("num_distributed_optimizer_instances", 1),
        # validate_args: fp32 accumulation and reduction for bf16, or where the flag asks
        grad_reduce_in_fp32=a.get("bf16", False) or a.get("accumulate_allreduce_grads_in_fp32", False))
    assert ddp.overlap_grad_reduce == p.dp_overlap and ddp.grad_reduce_in_fp32 == p.grad_reduce_fp32
    # megatron/training/training.py builds the OptimizerConfig from the same arguments; its
    # precision-aware path asks for Transformer Engine >= 2.1 (a GPU install has it) after
    # asserting Adam and the distributed optimizer
    import megatron.core.optimizer.optimizer_config as occ
    from megatron.core.optimizer import OptimizerConfig
    monkeypatch.setattr(occ, "is_te_min_version", lambda *a, **k: True)
    OptimizerConfig(optimizer="adam", bf16=a.get("bf16", False), fp16=a.get("fp16", False),
                    use_distributed_optimizer=a.get("use_distributed_optimizer", False),
                    use_precision_aware_optimizer=a.get("use_precision_aware_optimizer", False),
                    optimizer_cpu_offload=a.get("optimizer_cpu_offload", False),
                    optimizer_offload_fraction=a.get("optimizer_offload_fraction", 0.0))


# --------------------------------------------------------------------- DeepSpeed
# DeepSpeed 0.19 docs (deepspeed.ai/docs/config-json) and deepspeed/runtime/config.py keys.
DEEPSPEED_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                  "gradient_clipping", "zero_optimization", "communication_data_type", "bf16", "fp16",
                  "tensor_parallel", "activation_checkpointing", "expert_parallel"}
DEEPSPEED_ZERO_KEYS = {"stage", "overlap_comm", "contiguous_gradients", "offload_optimizer"}


def check_deepspeed(p, cfg: dict) -> None:
    dp = p.num_gpus // p.tp  # DeepSpeed's data-parallel size under AutoTP
    assert dp == p.dp
    assert cfg["train_micro_batch_size_per_gpu"] == p.micro_batch_size
    assert WL.global_batch_size == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp
    # without an mpu DeepSpeedConfig counts all ranks as data parallel: no train_batch_size under AutoTP
    assert cfg.get("train_batch_size") == (WL.global_batch_size if p.tp == 1 else None)
    z = cfg["zero_optimization"]
    assert z["stage"] == int(str(p.zero)) and z["overlap_comm"] == p.dp_overlap
    assert ("offload_optimizer" in z) == p.offload_optimizer
    assert cfg.get("tensor_parallel", {"autotp_size": 1})["autotp_size"] == p.tp
    assert ("activation_checkpointing" in cfg) == (p.recompute is Recompute.FULL)


@pytest.mark.parametrize("name", [n for n, e in CASES if e is Engine.DEEPSPEED])
def test_deepspeed_json_matches_plan(name):
    p, res = exported(name, Engine.DEEPSPEED)
    cfg = json.loads(res.text)
    assert set(cfg) <= DEEPSPEED_KEYS and set(cfg["zero_optimization"]) <= DEEPSPEED_ZERO_KEYS
    check_deepspeed(p, cfg)
    assert res.launcher.startswith("deepspeed --num_nodes 2 --num_gpus 8 ")


@pytest.mark.skipif(not installed("deepspeed"), reason=SKIP_DS)
@pytest.mark.parametrize("name", [n for n, e in CASES if e is Engine.DEEPSPEED])
def test_deepspeed_config_loads(name, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import deepspeed.runtime.config as dsc
    p, res = exported(name, Engine.DEEPSPEED)
    # deepspeed.initialize() for the launcher line builds DeepSpeedConfig(config, mpu=None):
    # rank and world size come from the process group, every rank the launcher starts
    # (AutoTP makes its TP group later, in the engine)
    nodes, per_node = (int(x) for x in res.launcher.split()[2:5:2])
    monkeypatch.setattr(dsc.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(dsc.dist, "get_world_size", lambda *a, **k: nodes * per_node)
    c = dsc.DeepSpeedConfig(json.loads(res.text))
    assert c.world_size == p.num_gpus and c.train_micro_batch_size_per_gpu == p.micro_batch_size
    assert c.gradient_accumulation_steps == WL.global_batch_size // (p.dp * p.micro_batch_size)
    assert c.train_batch_size == WL.global_batch_size * p.tp  # its count: TP ranks as data parallel
    assert c.zero_optimization_stage == int(str(p.zero)) and c.bfloat16_config.enabled
    assert c.tensor_parallel_config.autotp_size == (p.tp if p.tp > 1 else 0)
    assert (c.zero_config.offload_optimizer is not None) == p.offload_optimizer
    with pytest.raises(AssertionError):  # the same check catches a wrong batch (the global batch under TP)
        dsc.DeepSpeedConfig(dict(json.loads(res.text), train_batch_size=WL.global_batch_size + p.dp * (p.tp == 1)))


# --------------------------------------------------------------------- refusals and CLI
@pytest.mark.parametrize("name,engine", REFUSED, ids=[f"{n}-{e}" for n, e in REFUSED])
def test_unsupported_plan_features_are_one_line_errors(name, engine):
    p, _ = PLANS[name]
    mod = EXPORTERS[engine]
    with pytest.raises(SpecError) as e:
        mod.export(mod.SUPPORT.adapt(p), MODEL, CLUSTER, WL)
    msg = str(e.value)
    assert "\n" not in msg and f"engine {engine}" in msg and f"{engine} allows" in msg


@pytest.mark.parametrize("engine", ["torchtitan", "megatron", "deepspeed"])
def test_unfused_adam_is_refused_since_every_config_steps_fused_adam(engine, capsys, tmp_path):
    from paraplan.cli import main
    out_file = tmp_path / "cfg"
    code = main(["export", "--format", engine, "--model", "llama3-8b", "--gpus", "16", "--batch", "64", "--seq", "4096",
                 "--tp", "2", "--optimizer", "adam-unfused", "-o", str(out_file)])
    err = capsys.readouterr().err
    assert code == 2 and "--optimizer='adam-unfused'" in err and len(err.strip().splitlines()) == 1
    assert not out_file.exists()


def test_cp_exchange_per_engine():
    """Megatron names the exchange itself (Transformer Engine's names); torchtitan 0.2 has ring
    (alltoall rotation) and all-gather but no Ulysses, and 0.3 the all-gather only (FlexAttention);
    DeepSpeed's JSON has no CP."""
    ring, _ = PLANS["tp2-cp4-ring-zero3"]
    cfg = torchtitan.job_config(torchtitan.SUPPORT.adapt(ring), MODEL, WL)
    assert cfg["parallelism"]["context_parallel_rotate_method"] == "alltoall"
    # 0.3 cannot rotate by all-to-all: its line runs the plan's CP by all-gather, and says so
    assert "--parallelism.context_parallel_degree" in torchtitan.cli_overrides_v03(cfg, MODEL)
    gather = replace(ring, cp_comm_type=CPCommType.ALL_GATHER)
    cfg = torchtitan.job_config(torchtitan.SUPPORT.adapt(gather), MODEL, WL)
    assert cfg["parallelism"]["context_parallel_rotate_method"] == "allgather"
    assert "--parallelism.context_parallel_degree" in torchtitan.cli_overrides_v03(cfg, MODEL)
    assert "context_parallel_rotate_method" not in torchtitan.job_config(
        torchtitan.SUPPORT.adapt(PLANS["ddp-mb8"][0]), MODEL, WL)["parallelism"]
    with pytest.raises(SpecError, match="cp_comm_type"):
        torchtitan.job_config(torchtitan.SUPPORT.adapt(replace(ring, cp_comm_type=CPCommType.A2A)), MODEL, WL)
    text = megatron.export(megatron.SUPPORT.adapt(PLANS["cp2-ulysses"][0]), MODEL, CLUSTER, WL).text
    assert "--cp-comm-type a2a" in text
    text = megatron.export(megatron.SUPPORT.adapt(gather), MODEL, CLUSTER, WL).text
    assert "--cp-comm-type all_gather" in text  # TE raises on "allgather"


def test_precision_limits():
    fp8 = replace(WL, precision=Precision.FP8)
    with pytest.raises(SpecError, match="precision"):
        deepspeed.export(PLANS["ddp-mb8"][0], MODEL, CLUSTER, fp8)
    with pytest.raises(SpecError, match="precision"):
        torchtitan.export(PLANS["ddp-mb8"][0], MODEL, CLUSTER, replace(WL, precision=Precision.FP16))
    a = megatron_args(megatron.export(PLANS["ddp-mb8"][0], MODEL, CLUSTER, fp8).text)
    assert a["bf16"] and a["fp8_format"] == "hybrid"


def test_first_k_with_virtual_stages_must_split_evenly():
    p = plan(tp=2, pp=2, dp=4, vp=2, schedule=Schedule.INTERLEAVED_1F1B, sequence_parallel=True,
             recompute=Recompute.FIRST_K, recompute_num_layers=3)
    with pytest.raises(SpecError, match="recompute_num_layers"):
        megatron.export(p, MODEL, CLUSTER, WL)
    a = megatron_args(megatron.export(replace(p, recompute_num_layers=4), MODEL, CLUSTER, WL).text)
    assert a["recompute_num_layers"] == 2 and a["recompute_method"] == "block"


SMALL = ["--model", "llama3-8b", "--gpus", "16", "--batch", "64", "--seq", "4096"]


def test_cli_flags_to_stdout_writes_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "export", "--format", "megatron", *SMALL, "--tp", "2", "--pp", "2", "--vp", "4",
                         "--recompute", "selective", "--zero", "1")
    assert code == 0 and list(tmp_path.iterdir()) == []
    a = megatron_args(out)
    assert (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"]) == (2, 2)
    assert a["num_layers_per_virtual_pipeline_stage"] == 4 and a["use_distributed_optimizer"]
    assert err.startswith("launch: bash megatron.sh")


def test_cli_output_file_and_json(capsys, tmp_path):
    out_file = tmp_path / "ds.json"
    code, out, err = run(capsys, "export", "--format", "deepspeed", *SMALL, "--zero", "3", "--mb", "2",
                         "-o", str(out_file), "--json")
    assert code == 0
    d = json.loads(out)
    cfg = json.loads(out_file.read_text())
    # the flags narrow DeepSpeed's search: its best ZeRO-3 plan with micro-batches of 2
    assert d["text"] == out_file.read_text() and d["plan_source"] == "search"
    assert {"zero3", "mb2"} <= set(d["plan"].split())
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["gradient_accumulation_steps"] == 2
    assert str(out_file) in d["launcher"]


@pytest.mark.parametrize("engine", list(Engine))
def test_cli_without_plan_flags_exports_the_best_plan_the_engine_runs(capsys, engine):
    code, out, err = run(capsys, "export", "--format", str(engine), *SMALL, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["plan_source"] == "search" and d["predicted_step_time_s"] > 0
    if engine is Engine.DEEPSPEED:
        cfg = json.loads(d["text"])
        dp = 16 // cfg.get("tensor_parallel", {"autotp_size": 1})["autotp_size"]
        assert cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp == 64
    elif engine is Engine.TORCHTITAN:
        assert tomllib.loads(d["text"])["training"]["seq_len"] == 4096
    else:
        assert megatron_args(d["text"])["global_batch_size"] == 64


def test_cli_unsupported_is_one_line_exit_2(capsys, tmp_path):
    out_file = tmp_path / "x.toml"
    code, out, err = run(capsys, "export", "--format", "torchtitan", *SMALL, "--zero", "1", "-o", str(out_file))
    assert code == 2 and out == "" and not out_file.exists()
    assert err.count("\n") == 1 and "zero='1'" in err and "torchtitan allows" in err
    # a plan given whole with SP: the exporter's rule; --sp narrowing the search: the engine's bound
    code, out, err = run(capsys, "export", "--format", "deepspeed", *SMALL, "--plan",
                         "TP2 PP1 DP8 mb1 SP rc:none zero1 attn:flash3")
    assert code == 2 and "sequence_parallel" in err and "--no-sp" in err
    code, out, err = run(capsys, "export", "--format", "deepspeed", *SMALL, "--tp", "2", "--sp")
    assert code == 2 and err.count("\n") == 1 and "--sp='on'" in err and "deepspeed allows off" in err


def test_cli_exports_a_plan_that_does_not_fit_with_a_warning(capsys, tmp_path):
    # the user's --plan is exported as asked, and stderr says the memory model disagrees
    out_file = tmp_path / "m.sh"
    big = ["--model", "llama3.1-405b", "--gpus", "8"]
    code, out, err = run(capsys, "export", "--format", "megatron", *big, "--plan", "TP8 PP1 DP1 mb1 SP rc:none zero0 "
                         "attn:flash3", "-o", str(out_file))
    assert code == 0 and out_file.exists()
    warning = [ln for ln in err.splitlines() if ln.startswith("paraplan: warning:")]
    assert len(warning) == 1 and "GiB per GPU" in warning[0] and "h100" in warning[0]
    # a plan that fits exports without one
    code, out, err = run(capsys, "export", "--format", "megatron", *SMALL, "--tp", "8")
    assert code == 0 and "warning" not in err
    # plan flags narrow the search: with none of its plans fitting, nothing is written
    code, out, err = run(capsys, "export", "--format", "megatron", *big, "--tp", "8", "-o", str(tmp_path / "n.sh"))
    assert code == 2 and err.count("\n") == 1 and "no plan fits" in err and not (tmp_path / "n.sh").exists()


@pytest.mark.parametrize("attention, precision, modules, recipe", [
    (AttentionKernel.FLASH3, Precision.FP8, ["layernorm", "moe_act", "mla_up_proj"], "tensorwise"),
    (AttentionKernel.UNFUSED, Precision.BF16, ["core_attn", "layernorm", "moe_act", "mla_up_proj"], None),
])
def test_megatron_module_recomputation_flags(attention, precision, modules, recipe):
    # DeepSeek-V3 (MoE + MLA): the modules Megatron-Core recomputes; under FP8 the current-
    # scaling recipe, since Megatron-Core refuses moe_act/layernorm recomputation with delayed
    model = load_model("deepseek-v3")
    wl = Workload(global_batch_size=1024, seq_len=4096, precision=precision)
    p = megatron.SUPPORT.adapt(plan(tp=8, pp=1, dp=128, ep=64, sequence_parallel=True,
                                    zero=ZeroStage.OPTIMIZER, recompute=Recompute.MODULES, attention=attention))
    a = megatron_args(megatron.export(p, model, load_cluster("dgx-h100", num_gpus=1024), wl).text)
    assert a["recompute_granularity"] == "selective" and a["recompute_modules"] == modules
    assert a.get("fp8_recipe") == recipe


@pytest.mark.parametrize("precision,capacity,padded", [(Precision.FP8, None, True), (Precision.BF16, None, False),
                                                        (Precision.FP8, 1.25, False)])
def test_megatron_moe_permutation_is_the_fused_one_paraplan_prices(precision, capacity, padded):
    """cost/moe.py prices Megatron's permutation at Transformer Engine's fused kernels and no
    FP8 padding copies: the export turns the fusion on (Megatron-Core's default is off), and
    for dropless FP8 the router's padding to the quantized GEMM's alignment."""
    model = load_model("mixtral-8x7b")
    p = megatron.SUPPORT.adapt(plan(tp=2, dp=8, ep=8, sequence_parallel=True, zero=ZeroStage.OPTIMIZER,
                                    capacity_factor=capacity))
    wl = replace(WL, precision=precision)
    a = megatron_args(megatron.export(p, model, CLUSTER, wl).text)
    assert a["moe_permute_fusion"] is True
    assert a.get("moe_router_padding_for_quantization", False) is padded
