"""torchtitan 0.3's form of an exported torchtitan job: a `config_registry` function plus
`--section.field` overrides (0.3 reads no TOML; torchtitan/config/manager.py ConfigManager).

The overrides come from the same values as the 0.2 TOML (export/torchtitan.py job_config).
Where a built-in registry function builds the model the plan prices, the line names it
(`--module llama3 --config llama3_8b`). Where none does, the export carries a small
config_registry module (`paraplan_torchtitan.py`, named by `--module`) that starts from a
built-in recipe and swaps the model spec, because what differs is Python in 0.3, not a flag:
- a flavor with no registry function (Qwen3 235B-A22B, DeepSeek-V2's 236B under deepseek_v3);
- a registry function whose converters disagree with the plan's precision: `llama3_405b`
  turns on Float8LinearConverter, which no override turns off, so a bf16 plan rebuilds the
  model spec without it;
- all-gather CP for a model whose default attention has no CP (gpt-oss: varlen): FlexAttention.
Ring context parallelism has no 0.3 form: its language models run CP on FlexAttention only,
which all-gathers K/V (distributed/context_parallel/api.py; models/common/config_utils.py
refuses SDPA, the path torch rotates by all-to-all). A ring-CP plan's 0.3 line is that
plan with the all-gather exchange, and says so (`ring_as_allgather`).
What 0.3 cannot say at all is a reason string: FP8 (its float8 converters are Python that
needs torchao, not written here), expert tensor parallelism (no such field), a model 0.3 has
no code for (Llama 4).
"""

from __future__ import annotations

from dataclasses import dataclass

MODULE = "paraplan_torchtitan"   # the config_registry module the export writes, when it writes one
FUNCTION = "paraplan_config"
# 0.3 models/<name>/config_registry.py: a function per module whose model spec has no
# converter, the recipe (data, optimizer, schedule, checkpoints) a written module starts from
BASES = {"llama3": "llama3_8b", "deepseek_v3": "deepseek_v3_671b", "qwen3": "qwen3_30b_a3b", "gpt_oss": "gpt_oss_20b"}
# registry functions that turn float8 converters on (llama3_405b: Float8LinearConverter)
FLOAT8_FUNCTIONS = {"llama3_405b"}
# the attention backend whose context parallelism 0.3 runs for language models (K/V all-gather)
CP_BACKEND = "flex"
# module names whose 0.2 and 0.3 names differ (0.3 pipeline_parallel.py: "norm", "lm_head")
FQN_RENAMES = {"output": "lm_head"}


@dataclass(frozen=True, kw_only=True)
class V03Launch:
    """torchtitan 0.3's arguments after `-m torchtitan.train`, and the registry module they
    name when no built-in one builds the plan's model (its source, and why)."""

    args: list[str]
    module_source: str = ""
    why: str = ""
    ring_as_allgather: bool = False  # the plan's ring CP, run by 0.3's K/V all-gather


def registry_module(module: str, flavor: str, backend: str | None) -> str:
    """Python source of a 0.3 config_registry module with one function, FUNCTION."""
    attn = f", attn_backend={backend!r}" if backend else ""
    return "\n".join([
        "from torchtitan.models.common.config_utils import decoder_vocab_size",
        f"from torchtitan.models.{module} import model_registry",
        f"from torchtitan.models.{module}.config_registry import {BASES[module]}", "", "",
        f"def {FUNCTION}():",
        f"    config = {BASES[module]}()  # torchtitan's recipe: data, optimizer, schedule, checkpoints",
        "    # the model paraplan priced, with no converter: training in the plan's bf16",
        f"    config.model_spec = model_registry({flavor!r}{attn})",
        "    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)",
        "    return config"]) + "\n"


def _reason(cfg: dict, tt_model: tuple[str, str, str] | None, module_name: str) -> str:
    """Why 0.3 cannot run this config at all ("" where it can)."""
    if tt_model is None:
        return f"model {module_name!r} has no torchtitan flavor"
    if tt_model[0] not in BASES:
        return f"torchtitan 0.3 has no {tt_model[0]} model"
    if "converters" in cfg["model"]:
        return "FP8: 0.3 builds its float8 converters in Python (model_registry(converters=[...]), torchao)"
    if cfg["parallelism"].get("expert_tensor_parallel_degree", 1) != 1:
        return "expert tensor parallelism (0.3 has no expert_tensor_parallel_degree)"
    return ""


def launch(cfg: dict, tt_model: tuple[str, str, str] | None, model_name: str) -> V03Launch | str:
    """The 0.3 launch of a 0.2 job config (sections as export/torchtitan.py job_config writes
    them), or why 0.3 cannot say it."""
    reason = _reason(cfg, tt_model, model_name)
    if reason:
        return reason
    assert tt_model is not None
    module, flavor, function = tt_model
    ring = cfg["parallelism"].get("context_parallel_rotate_method") == "alltoall"
    # CP on FlexAttention where the module's default attention has none (gpt-oss: varlen)
    backend = CP_BACKEND if cfg["parallelism"]["context_parallel_degree"] > 1 and module == "gpt_oss" else None
    whys = [why for why, applies in (
        (f"torchtitan 0.3 has no registry function for {module} {flavor}", not function),
        (f"{function} turns on Float8LinearConverter; the plan trains in bf16", function in FLOAT8_FUNCTIONS),
        (f"context parallelism on {backend} attention", backend is not None)) if applies]
    args = overrides(cfg)
    if not whys:
        return V03Launch(args=["--module", module, "--config", function, *args], ring_as_allgather=ring)
    return V03Launch(args=["--module", MODULE, "--config", FUNCTION, *args],
                     module_source=registry_module(module, flavor, backend), why="; ".join(whys),
                     ring_as_allgather=ring)


def overrides(cfg: dict) -> list[str]:
    """`--section.field value` overrides of the training, parallelism, compile and
    activation-checkpoint settings."""
    par = {k: v for k, v in cfg["parallelism"].items()
           if k not in ("expert_tensor_parallel_degree", "context_parallel_rotate_method")}
    async_tp = par.pop("enable_async_tensor_parallel")
    args: list[str] = []
    for section, values in (("training", cfg["training"]), ("parallelism", par)):
        for key, value in values.items():
            if key == "module_fqns_per_model_part":  # comma-joined stages, 0.3's module names
                args += [f"--{section}.{key}",
                         *(",".join(FQN_RENAMES.get(n, n) for n in part) for part in value)]
            else:
                args += [f"--{section}.{key}", str(value)]
    # 0.3 captures CUDA graphs by default: not under PP, nor with the all-to-all expert dispatch
    # ("CUDA graphs support only expert parallel token dispatcher configurations without CPU
    # synchronization", trainer.py)
    if par["pipeline_parallel_degree"] > 1 or par["expert_parallel_degree"] > 1:
        args.append("--training.disable_cuda_graphs")
    if cfg["compile"]["enable"]:
        # list[str] fields take one comma-separated value (config/manager.py list_str_rule)
        args += ["--compile.enable", "--compile.components", ",".join(cfg["compile"]["components"])]
    if async_tp:
        args.append("--compile.enable_async_tensor_parallel")
    args.append(f"activation-checkpoint:{cfg['activation_checkpoint']['mode']}")
    return args
