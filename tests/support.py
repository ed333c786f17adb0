"""Helpers shared by the test modules (pytest puts this directory on sys.path)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from paraplan.cli import main
from paraplan.errors import FileFormatError


def write(tmp_path, name: str, text: str):
    """Write `text` to tmp_path/name and return the path."""
    p = tmp_path / name
    p.write_text(text)
    return p


def assert_bad_field_names_line(tmp_path, toml_text: str, old: str, new: str, field: str, load) -> None:
    """Replacing `old` by `new` in a TOML makes `load` fail naming the file, line and field, in one line."""
    p = write(tmp_path, "x.toml", toml_text.replace(old, new))
    with pytest.raises(FileFormatError) as e:
        load(str(p))
    line = toml_text.splitlines().index(old) + 1
    assert f"{p}:{line}:" in str(e.value) and field in str(e.value)
    assert "\n" not in str(e.value)


def search_setup(model: str, cluster: str, gpus: int, seq: int, batch: int, precision: str, engine: str | None):
    """(model, cluster, workload, limits) of a search case: presets, and the engine's bounds
    and policy where one is named."""
    from paraplan.export.registry import exporter
    from paraplan.plan.space import SpaceLimits
    from paraplan.specs.catalog import load_cluster, load_model
    from paraplan.specs.workload import Precision, Workload
    limits = exporter(engine).SUPPORT.search_limits() if engine else SpaceLimits()
    return (load_model(model), load_cluster(cluster, num_gpus=gpus),
            Workload(global_batch_size=batch, seq_len=seq, precision=Precision(precision)), limits)


def spread_blocks(model, cluster, workload, limits, count: int = 12) -> list:
    """About `count` of the space's non-empty blocks, spread across it."""
    from paraplan.plan.space import space_blocks
    blocks = [b for b in space_blocks(model, cluster, workload, limits) if b.num_candidates]
    return blocks[::max(1, len(blocks) // count)]


def closed_form_step_s(model, cluster, workload, plan) -> float:
    """The search's closed-form step time of one plan (cost/evaluate.py, no event simulation)."""
    from paraplan.cost.evaluate import evaluate
    from paraplan.plan.space import PlanBatch
    return float(evaluate(model, cluster, workload, PlanBatch.from_plans([plan])).time.scalar(0).total)


def run(capsys, *argv):
    """(exit code, stdout, stderr) of `paraplan ARGV`, argparse's SystemExit included."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code, out, err):
    assert code == 2
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("paraplan: error: ")
    return lines[0]


# One row of each published-measurements format (../shared/validation/README.md), for tests
# that change a cell and validate the file.
TRAINING_HEADER = ("id,source,model,params_b,layers,hidden,ffn_hidden,heads,kv_heads,vocab,gated_mlp,num_experts,"
                   "top_k,moe_ffn_hidden,seq_len,gpu,num_gpus,gpus_per_node,precision,global_batch,micro_batch,tp,pp,"
                   "vp,cp,ep,dp,sp,recompute,zero,framework,metric_id,value,metric_text,notes").split(",")
# train-dev-001 of training_dev.csv (Korthikanti et al. 2022 Table 5)
TRAINING_ROW = dict(zip(TRAINING_HEADER, (
    "train-dev-001", "Korthikanti et al. 2022 (arXiv 2205.05198) Table 5", "Megatron 22B", "22", "48", "6144",
    "24576", "64", "64", "51200", "no", "", "", "", "2048", "A100 80GB", "8", "8", "fp16", "4", "4", "8", "1", "1",
    "1", "1", "1", "no", "full", "0", "Megatron-LM", "iteration_time_s", "1.42", "iteration time (s)", "Selene")))

INFERENCE_HEADER = ("id,source,model,params_b,gpu,num_gpus,tp,pp,ep,precision,batch_or_concurrency,input_len,"
                    "output_len,metric,metric_id,value,notes").split(",")
# inf-dev-0001 of inference_dev.csv (Pope et al. 2022 Table 2, static batch on TPU v4)
TPU_ROW = dict(zip(INFERENCE_HEADER, (
    "inf-dev-0001", "Pope et al. 2022 Table 2", "PaLM 540B", "540", "TPU v4", "64", "64", "1", "", "int8 weights",
    "1", "2048", "", "prefill MFU (%)", "prefill_mfu_pct", "43",
    "2D weight-stationary FFN; attention sharded over heads")))
# an online-serving row on a GPU (request rate QPS=2)
GPU_ROW = dict(zip(INFERENCE_HEADER, (
    "inf-x", "vLLM benchmark", "LLaMA 3.1 8B", "8", "H100 80GB HBM3", "1", "1", "1", "", "BF16",
    "QPS=2", "512", "256", "mean TTFT", "ttft_mean_ms", "60", "online serving")))


def write_csv(tmp_path, header, rows, name="rows.csv") -> Path:
    """`rows` (dicts) under `header` as tmp_path/name; the path."""
    p = tmp_path / name
    with p.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, header)
        w.writeheader()
        w.writerows(rows)
    return p


def assert_torchtitan_runs_schedule_eager_only(tmp_path, capsys, schedule: str, torch_name: str) -> None:
    """torchtitan runs `schedule` (torch's `torch_name`) on eager stages only, torch refusing
    compiled ones: a search narrowed to it finds no plan torchtitan builds and says which plan
    breaks the rule, that plan given whole names it, `--no-compile` exports it, and Megatron
    refuses the schedule."""
    flags = ["--model", "llama3-8b", "--gpus", "16", "--seq", "4096", "--batch", "32", "--tp", "2", "--pp", "4",
             "--vp", "2", "--schedule", schedule, "--dp", "2", "--zero", "2"]
    assert main(["export", "--format", "torchtitan", *flags]) == 2
    err = capsys.readouterr().err
    assert "the engine can build" in err and "export --plan '" in err
    plan = err.split("export --plan '")[1].split("'")[0]
    assert schedule in plan.split() and "compiled" in plan.split()
    assert main(["export", "--format", "torchtitan", *flags[:8], "--plan", plan]) == 2
    assert torch_name in capsys.readouterr().err
    out = tmp_path / "job.toml"
    assert main(["export", "--format", "torchtitan", "--no-compile", *flags, "-o", str(out)]) == 0
    assert f'pipeline_parallel_schedule = "{torch_name}"' in out.read_text()
    capsys.readouterr()
    assert main(["export", "--format", "megatron", *flags]) == 2
    assert f"schedule='{schedule}' is not allowed" in capsys.readouterr().err
