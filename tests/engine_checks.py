"""Where the engines' own config code is, for the tests that feed it paraplan's exports.

The README's test command installs the `engines` extra (torchtitan 0.3.0, DeepSpeed 0.19.8)
and torchtitan 0.2.2's wheel beside it in `<venv>/torchtitan-0.2.2` (the two torchtitan
releases cannot share one environment; tests/torchtitan_022.py runs 0.2.2 in a child
process with that folder first on its path). Megatron-LM's front end is read from
../shared/engines (tests/test_megatron_args.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
INSTALL = ("python -m pip install -e '.[test,run,plot,megatron,engines]' && "
           "python -m pip install --no-deps --target .venv/torchtitan-0.2.2 torchtitan==0.2.2")


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def torchtitan_version() -> tuple[int, int] | None:
    """(major, minor) of the torchtitan installed in this environment (the `engines` extra)."""
    if not installed("torchtitan"):
        return None
    return tuple(int(x) for x in version("torchtitan").split(".")[:2])  # type: ignore[return-value]


def torchtitan_022_dir() -> Path | None:
    """The folder holding torchtitan 0.2.2 (PARAPLAN_TORCHTITAN_022, else <venv>/torchtitan-0.2.2)."""
    path = Path(os.environ.get("PARAPLAN_TORCHTITAN_022", Path(sys.prefix) / "torchtitan-0.2.2"))
    return path if (path / "torchtitan" / "config").is_dir() else None


SKIP_022 = (f"torchtitan 0.2.2 not at {Path(sys.prefix) / 'torchtitan-0.2.2'} (it cannot share an environment "
            f"with 0.3.0; the README's test command puts it there: {INSTALL})")
SKIP_03 = f"torchtitan 0.3 not installed (the `engines` extra: {INSTALL})"
SKIP_DS = f"deepspeed not installed (the `engines` extra: {INSTALL})"


_CHILD: list[subprocess.Popen] = []  # torchtitan 0.2.2's process, started once per test session


def _torchtitan_022_child(root: Path) -> subprocess.Popen:
    if not _CHILD or _CHILD[0].poll() is not None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
        _CHILD[:] = [subprocess.Popen([sys.executable, str(HERE / "torchtitan_022.py")], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env)]
    return _CHILD[0]


def run_torchtitan_022(jobs: list[dict]) -> list[dict]:
    """torchtitan 0.2.2's verdict on each job (tests/torchtitan_022.py), in its own process."""
    root = torchtitan_022_dir()
    assert root is not None, SKIP_022
    child = _torchtitan_022_child(root)
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(json.dumps(jobs) + "\n")
    child.stdin.flush()
    line = child.stdout.readline()
    assert line, "torchtitan 0.2.2's process ended (its stderr is above)"
    out = json.loads(line)
    assert Path(out["torchtitan"]).is_relative_to(root), out["torchtitan"]  # 0.2.2, not the installed 0.3
    return out["results"]


def deepspeed_accepts(cfg: dict, world: int, num_experts: int = 0):
    """DeepSpeed 0.19.8's own checks of a JSON config, as `deepspeed.initialize()` on `world`
    ranks (no mpu) runs them: DeepSpeedConfig (the batch arithmetic, every section's schema),
    then, with expert_parallel, AutoEP's config and folding checks
    (DeepSpeedEngine._configure_expert_parallel) and its post-detection check against the
    model's experts. Returns the DeepSpeedConfig; raises what DeepSpeed raises."""
    from types import SimpleNamespace
    from unittest import mock

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.runtime.config as dsc
    from deepspeed.module_inject.auto_ep_config import validate_autoep_config, validate_autoep_post_detection
    from deepspeed.module_inject.auto_ep_folding import build_folding_spec, validate_folding_global
    with mock.patch.object(dsc.dist, "get_rank", lambda *a, **k: 0), \
            mock.patch.object(dsc.dist, "get_world_size", lambda *a, **k: world):
        c = dsc.DeepSpeedConfig(json.loads(json.dumps(cfg)))
    ep = c.expert_parallel_config
    if ep.enabled:
        tp = max(c.tensor_parallel_config.autotp_size, 1)
        validate_autoep_config(ep, world, 1, tp, 1)
        spec = build_folding_spec(world_size=world, pp_size=1, tp_size=tp, ep_size=ep.autoep_size,
                                  etp_size=ep.expert_tensor_parallel_size, mp_mode="tp" if tp > 1 else "sp")
        validate_folding_global(spec, zero_stage=c.zero_optimization_stage, sp_size=1,
                                autoep_enabled=True, ep_preset=ep.preset_model,
                                zero_offload_optimizer=c.zero_config.offload_optimizer is not None)
        layer = SimpleNamespace(moe_module_name="mlp", num_experts=num_experts, score_apply="post",
                                num_expert_groups=None, num_limited_groups=None)
        validate_autoep_post_detection(ep, [layer])
    return c


MODULE_START, MODULE_END = "# --- paraplan_torchtitan.py ---", "# --- end ---"


def registry_module_source(text: str) -> str | None:
    """The torchtitan 0.3 config_registry module an exported TOML's header carries, if any."""
    if MODULE_START not in text:
        return None
    block = text.split(MODULE_START, 1)[1].split(MODULE_END, 1)[0]
    return "\n".join(line[2:] for line in block.strip("\n").splitlines()) + "\n"


def torchtitan_03_parse(text: str, args: list[str], folder: Path, monkeypatch):
    """torchtitan 0.3's ConfigManager on the header's command line, with the registry module
    the header carries saved on sys.path (as the header tells the user); returns (the parsed
    Trainer.Config, the CP rotation torch was left with), the rotation reset after."""
    from torch.distributed.tensor.experimental import _attention as cp_attention
    from torchtitan.config.manager import ConfigManager
    source = registry_module_source(text)
    if source is not None:
        (folder / "paraplan_torchtitan.py").write_text(source)
        monkeypatch.syspath_prepend(str(folder))
        monkeypatch.delitem(sys.modules, "paraplan_torchtitan", raising=False)
    try:
        job = ConfigManager().parse_args(list(args))
        rotate = str(cp_attention._cp_options.rotate_method)
    finally:
        cp_attention.set_rotate_method("allgather")  # torch's default, for the tests after
    return job, rotate
