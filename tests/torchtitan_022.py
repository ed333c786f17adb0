"""torchtitan 0.2.2's own checks of exported TOML job configs, run in a child process.

torchtitan 0.2.2 (the last release that reads TOML) cannot be installed beside 0.3.0 (the
`engines` extra): the README's test command puts its wheel, without dependencies (0.3's
cover them), in `<venv>/torchtitan-0.2.2` (`pip install --no-deps --target`), and this
script runs with that folder first on sys.path. Input: a line per request on stdin, a JSON
list of jobs `{"toml": path | null, "mesh": [rep, shard, cp, tp, pp, ep, etp] | null, "world": N}`;
output: a line per request on stdout, per job `{"error": str | null, "job": {...}, "model_args": {...}}` (and
"mesh_error" where the mesh failed, the TOML parsed or not), where
"job" is the JobConfig ConfigManager parsed, "model_args" the flavor torchtitan builds
(get_train_spec(name).model_args[flavor]), and a mesh is built by ParallelDims.build_mesh
on a fake process group of `world` ranks.
"""

from __future__ import annotations

import dataclasses
import json
import sys


def parse(path: str) -> tuple[dict, dict]:
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec
    job = ConfigManager().parse_args(["--job.config_file", path])
    spec = get_train_spec(job.model.name)  # KeyError: a model name torchtitan lacks
    args = spec.model_args[job.model.flavor]  # KeyError: a flavor it lacks
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
    return json.loads(json.dumps(dataclasses.asdict(job), default=str)), json.loads(json.dumps(fields, default=str))


def build_mesh(mesh: list[int], world: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.distributed import ParallelDims
    rep, shard, cp, tp, pp, ep, etp = mesh
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        ParallelDims(dp_replicate=rep, dp_shard=shard, cp=cp, tp=tp, pp=pp, ep=ep, etp=etp,
                     world_size=world).build_mesh()
    finally:
        dist.destroy_process_group()


def verdict(job: dict) -> dict:
    res: dict = {"error": None, "job": None, "model_args": None}
    try:
        if job.get("toml"):
            res["job"], res["model_args"] = parse(job["toml"])
    except (AssertionError, ValueError, RuntimeError, KeyError, SystemExit) as e:
        res["error"] = f"{type(e).__name__}: {e}"
    try:
        if job.get("mesh"):
            build_mesh(job["mesh"], job["world"])
    except (AssertionError, ValueError, RuntimeError, KeyError, SystemExit) as e:
        res["error"] = res["error"] or f"{type(e).__name__}: {e}"
        res["mesh_error"] = f"{type(e).__name__}: {e}"
    return res


def main() -> int:
    """One request per stdin line (a JSON list of jobs), one JSON answer per stdout line, until
    stdin closes: a test session starts this once and pays torchtitan's import once."""
    import torchtitan
    for line in sys.stdin:
        out = {"torchtitan": torchtitan.__file__, "results": [verdict(job) for job in json.loads(line)]}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
