"""Validate the serving model against published inference measurements.

Each row (../shared/validation/README.md, inference_dev.csv) names a model, GPU, TP/PP,
precision, a load (maximum load, a request rate "QPS=r" or "QPS=INF"), prompt and output
lengths, and one measured metric. Rows of one scenario share a single simulation.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from ..errors import FileFormatError, ParaplanError, SpecError
from ..specs.catalog import load_cluster
from ..units import MILLI
from .training import _preset, source_group, summarize

REQUIRED_COLUMNS = ("id", "source", "model", "gpu", "num_gpus", "tp", "pp", "precision",
                    "batch_or_concurrency", "input_len", "output_len", "metric_id", "value")
METRICS = ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "total_tokens_per_s", "requests_per_s",
           "ttft_mean_ms", "ttft_ms", "tpot_mean_ms", "prefill_latency_s", "decode_latency_s",
           "prefill_mfu_pct", "decode_mfu_pct", "max_context_tokens")

# trtllm-bench's synthetic datasets: requests per ISL/OSL pair, as we recall the
# perf-overview.md "Preparing a Dataset" table (the validation file does not carry them;
# verify against the source). Other pairs: DEFAULT_MAX_LOAD_REQUESTS. Sensitivity: 1,000
# instead of 30,000 requests lowers the simulated 128/128 throughput by 6% (ramp and tail).
MAX_LOAD_REQUESTS = {(128, 128): 30000, (128, 2048): 3000, (128, 4096): 1500, (1000, 2000): 1500,
                     (2048, 128): 3000, (2048, 2048): 1500, (5000, 500): 1500, (1000, 1000): 3000,
                     (500, 2000): 3000, (20000, 2000): 1000}
DEFAULT_MAX_LOAD_REQUESTS = 1000
ONLINE_REQUESTS = 500  # the online-serving block's notes: 500 requests per measurement


def is_inference_file(path: str) -> bool:
    """An inference file has the serving columns (input_len, output_len); training has seq_len."""
    p = Path(path)
    if not p.is_file():
        return False
    with p.open(newline="") as fh:
        cols = next(csv.reader(fh), [])
    return "input_len" in cols and "output_len" in cols


def _cluster_for(gpu: str) -> str:
    g = gpu.lower()
    if "a100" in g:
        return "dgx-a100-40gb" if "40" in g else "dgx-a100-80gb"
    if "h100" in g:
        return "dgx-h100"
    if "h200" in g:
        return "dgx-h200"
    if "b200" in g:
        return "dgx-b200"
    if "tpu" in g and "v4" in g:
        return "tpu-v4-pod"
    return gpu


def _dtypes(precision: str):
    from ..inference.deploy import StoreDtype
    p = precision.lower()
    if "fp8" in p:
        # TensorRT-LLM's FP8 checkpoints quantize the KV cache to FP8 as well
        return StoreDtype.FP8, StoreDtype.FP8
    if "int8" in p:
        return StoreDtype.INT8, StoreDtype.BF16
    if "fp16" in p:
        return StoreDtype.FP16, StoreDtype.FP16
    return StoreDtype.BF16, StoreDtype.BF16


def _int(row: dict, key: str, path: str, line: int) -> int | None:
    v = (row.get(key) or "").strip()
    if not v:
        return None
    try:
        return int(float(v))
    except ValueError:
        raise FileFormatError(path, f"column {key!r}: {v!r} is not a number", line) from None


def _load(text: str) -> tuple[str, float | None]:
    """('max', None) for maximum load, ('rate', r) for QPS=r, ('burst', None) for QPS=INF."""
    t = text.strip().lower()
    if t.startswith("max load") or "infinite request rate" in t:
        return "max", None
    m = re.fullmatch(r"qps\s*=\s*(inf|[0-9.]+)", t)
    if m:
        return ("burst", None) if m.group(1) == "inf" else ("rate", float(m.group(1)))
    return "unknown", None


_CACHE: dict = {}


def _scenario(row: dict, path: str, line: int):
    from ..inference.batching import simulate
    from ..inference.deploy import EngineLimits, ServePlan, Traffic
    from ..inference.step import IterationModel, serve_memory
    model = _preset(row["model"])
    if model is None:
        raise SpecError("row", "model", row["model"], "no preset matches; add one to the catalog")
    tp = _int(row, "tp", path, line) or 1
    pp = _int(row, "pp", path, line) or 1
    gpus = _int(row, "num_gpus", path, line) or tp * pp
    isl = _int(row, "input_len", path, line)
    osl = _int(row, "output_len", path, line)
    kind, rate = _load(row["batch_or_concurrency"])
    if isl is None or osl is None or kind == "unknown":
        raise SpecError("row", "input_len/output_len/batch_or_concurrency",
                        f"{row['input_len']}/{row['output_len']}/{row['batch_or_concurrency']}",
                        "a serving row needs both lengths and a load (max load, QPS=r or QPS=INF)")
    key = (model.name, row["gpu"], tp, pp, gpus, row["precision"], kind, rate, isl, osl)
    if key in _CACHE:
        return _CACHE[key]
    cluster = load_cluster(_cluster_for(row["gpu"]), num_gpus=gpus)
    wd, kd = _dtypes(row["precision"])
    plan = ServePlan(tp=tp, pp=pp, replicas=max(1, gpus // (tp * pp)), weight_dtype=wd, kv_dtype=kd)
    limits = EngineLimits()
    mem = serve_memory(model, cluster, plan, limits)
    step = IterationModel(model, cluster, plan)
    n = ONLINE_REQUESTS if kind != "max" else MAX_LOAD_REQUESTS.get((isl, osl), DEFAULT_MAX_LOAD_REQUESTS)
    # a replica sees 1/replicas of the requests and of the rate
    n_rep = max(1, n // plan.replicas)
    traffic = Traffic(prompt_tokens=isl, output_tokens=osl, num_requests=n_rep,
                      rate_rps=None if rate is None else rate / plan.replicas)
    res = simulate(step, traffic, limits, mem.kv_capacity_tokens)
    _CACHE[key] = (plan, res)
    return plan, res


def _predict(metric: str, plan, res) -> float:
    reps = plan.replicas
    if metric == "output_tokens_per_s":
        return res.output_tokens_per_s * reps
    if metric == "output_tokens_per_s_per_gpu":
        return res.output_tokens_per_s / plan.gpus_per_replica
    if metric == "total_tokens_per_s":
        return res.total_tokens_per_s * reps
    if metric == "requests_per_s":
        return res.requests_per_s * reps
    if metric in ("ttft_mean_ms", "ttft_ms"):
        return float(res.ttft_s.mean()) / MILLI
    if metric == "tpot_mean_ms":
        return float(res.tpot_s.mean()) / MILLI
    raise AssertionError(metric)


def predict_row(row: dict, path: str, line: int) -> dict:
    metric = row["metric_id"].strip()
    try:
        measured = float(row["value"])
    except ValueError:
        raise FileFormatError(path, f"column 'value': {row['value']!r} is not a number", line) from None
    out = {"id": row["id"], "source": row["source"], "model": row["model"], "metric_id": metric,
           "measured": measured, "predicted": None, "error_pct": None, "skipped": None, "plan": None}
    if metric not in METRICS:
        out["skipped"] = f"unknown metric_id {metric!r}"
        return out
    if row["gpu"].lower().startswith("tpu"):
        from ..inference.pope import predict_pope_row
        pred, plan_text = predict_pope_row(row, metric, path, line)
    else:
        plan, res = _scenario(row, path, line)
        pred, plan_text = _predict(metric, plan, res), plan.describe()
    out.update(predicted=pred, error_pct=100.0 * (pred - measured) / measured, plan=plan_text)
    return out


def validate_inference_file(path: str, progress=None) -> dict:
    p = Path(path)
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise FileFormatError(path, f"missing column(s) {', '.join(missing)}; an inference file needs "
                                  f"{', '.join(REQUIRED_COLUMNS)}", 1)
        rows = [(reader.line_num, r) for r in reader]
    out = []
    _CACHE.clear()
    for i, (line, row) in enumerate(rows):
        try:
            out.append(predict_row(row, path, line))
        except ParaplanError as exc:
            if isinstance(exc, FileFormatError):
                raise
            out.append({"id": row.get("id"), "source": row.get("source"), "model": row.get("model"),
                        "metric_id": row.get("metric_id"), "measured": float(row.get("value") or "nan"),
                        "predicted": None, "error_pct": None, "skipped": str(exc), "plan": None})
        if progress:
            progress(i + 1, len(rows))
    return {"rows": out, "summary": summarize(out)}

