"""Validate the serving model against published inference measurements.

Each row (../shared/validation/README.md, inference_dev.csv) names a model, GPU, TP/PP,
precision, a load (maximum load, a request rate "QPS=r" or "QPS=INF"), prompt and output
lengths, and one measured metric. Rows of one scenario share a single simulation.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from ..errors import RowError, SpecError
from ..specs.catalog import load_cluster
from ..specs.files import without_note
from ..units import MILLI
from .rows import MAX_COUNT, int_cell, read_rows, row_result, validate_rows, with_prediction
from .training import gpu_cluster_for, model_preset

REQUIRED_COLUMNS = ("id", "source", "model", "gpu", "num_gpus", "tp", "pp", "precision",
                    "batch_or_concurrency", "input_len", "output_len", "metric_id", "value")
KNOWN_COLUMNS = ("params_b", "ep", "metric", "notes")  # the others of ../shared/validation/inference_dev.csv
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
HEADER_BYTES = 1 << 16  # a header longer than this is no measurements file (read_rows says why)


def is_inference_file(path: str) -> bool:
    """An inference file has the serving columns (input_len, output_len); training has seq_len."""
    p = Path(path)
    try:
        if not p.is_file():
            return False
        with p.open("rb") as fh:
            first = fh.readline(HEADER_BYTES)
    except OSError:
        return False  # read_rows says why
    # a file that is not UTF-8 is refused by read_rows, with the line of the bad byte; a line
    # may end in CR (old Mac, some exporters), CRLF or LF
    header = re.split(rb"\r\n?|\n", first, maxsplit=1)[0]
    cols = next(csv.reader([header.decode("utf-8-sig", errors="replace")]), [])
    return "input_len" in cols and "output_len" in cols


def _cluster_for(row: dict, path: str, line: int) -> str:
    if row["gpu"].lower().startswith("tpu"):
        return "tpu-v4-pod"
    return gpu_cluster_for(row, path, line)


def _dtypes(precision: str, path: str, line: int):
    """(weights, KV cache) dtypes of a precision cell; an unknown one skips the row."""
    from ..inference.deploy import StoreDtype
    bf16, fp16, fp8, int8 = StoreDtype.BF16, StoreDtype.FP16, StoreDtype.FP8, StoreDtype.INT8
    # TensorRT-LLM's FP8 checkpoints quantize the KV cache to FP8 as well; Pope et al.'s
    # "int8 weights" keep a bf16 KV cache
    known = {"bf16": (bf16, bf16), "bf16 kv": (bf16, bf16), "fp16": (fp16, fp16), "fp8": (fp8, fp8),
             "int8": (int8, bf16), "int8 weights": (int8, bf16)}
    text = precision.strip()
    key = without_note(text).lower()  # "FP8 (implied)": a note may follow, as in training rows
    if key not in known:
        raise RowError(path, line, "precision", f"{text!r} is not allowed; allowed: "
                       + ", ".join(known) + " (a note in parentheses may follow)")
    return known[key]


def _load(text: str, path: str, line: int) -> tuple[str, float | None]:
    """('max', None) for maximum load, ('rate', r) for QPS=r, ('burst', None) for QPS=INF;
    ('unknown', None) for a static batch or a blank cell, which the serving simulation lacks;
    anything else skips the row."""
    t = text.strip().lower()
    if t.startswith("max load") or "infinite request rate" in t:
        return "max", None
    m = re.fullmatch(r"qps\s*=\s*(.*)", t)
    if m:
        if m.group(1) == "inf":
            return "burst", None
        try:
            rate = float(m.group(1))
        except ValueError:
            rate = float("nan")
        if not 0 < rate < float("inf"):
            raise RowError(path, line, "batch_or_concurrency", f"{text.strip()!r} is not allowed; a request "
                           "rate is QPS=r with r a positive number, or QPS=INF")
        return "rate", rate
    try:  # a static batch: a whole number of sequences (int_cell's rules)
        batch = float(t) if t else 1.0
    except ValueError:
        batch = 0.0
    if not (batch.is_integer() and 1 <= batch <= MAX_COUNT):  # also false for inf and nan
        raise RowError(path, line, "batch_or_concurrency", f"{text.strip()!r} is not allowed; max load, "
                       "QPS=r (r > 0), QPS=INF, a static batch (a whole number >= 1) or blank")
    return "unknown", None


_CACHE: dict = {}


def _scenario(row: dict, path: str, line: int):
    from ..inference.batching import simulate
    from ..inference.deploy import EngineLimits, ServePlan, Traffic
    from ..inference.planner import expert_parallel_choices
    from ..inference.step import IterationModel, serve_memory
    model = model_preset(row["model"])
    if model is None:
        raise SpecError("row", "model", row["model"], "no preset matches; add one to the catalog")
    tp = int_cell(row, "tp", path, line) or 1
    pp = int_cell(row, "pp", path, line) or 1
    gpus = int_cell(row, "num_gpus", path, line) or tp * pp
    isl = int_cell(row, "input_len", path, line)
    osl = int_cell(row, "output_len", path, line)
    kind, rate = _load(row["batch_or_concurrency"], path, line)
    if isl is None or osl is None or kind == "unknown":
        raise SpecError("row", "input_len/output_len/batch_or_concurrency",
                        f"{row['input_len']}/{row['output_len']}/{row['batch_or_concurrency']}",
                        "a serving row needs both lengths and a load (max load, QPS=r or QPS=INF)")
    if model.tp_splits_heads_badly(tp):  # a layout no engine runs (serve proposes none)
        raise SpecError("row", "tp", tp, model.tp_heads_rule(tp) + f" of {model.name}")
    if pp > model.num_layers:
        raise SpecError("row", "pp", pp, f"at most the {model.num_layers} layers of {model.name} (a stage holds one)")
    if gpus % (tp * pp):
        raise SpecError("row", "num_gpus", gpus, f"a multiple of tp×pp = {tp * pp} (whole replicas) is required")
    # the row's EP, else TensorRT-LLM's default (its Mapping splits each expert over the TP
    # ranks, moe_ep_size 1, unless told otherwise). Searching a blank EP for the most throughput
    # was tried (2026-11-30): the Mixtral and Llama 4 Maverick rows went 5-80 points too fast,
    # Qwen3-235B-A22B from -75% to -40%; all rows 11.16% -> 12.23%, not kept
    ep = int_cell(row, "ep", path, line) or 1
    if ep not in (choices := expert_parallel_choices(model, tp)):
        raise RowError(path, line, "ep", f"{ep} is not allowed; allowed for {model.name} at tp {tp}: "
                       + ", ".join(map(str, choices)) + " (EP divides tp and the expert count)")
    key = (model.name, row["gpu"], tp, pp, ep, gpus, row["precision"], kind, rate, isl, osl)
    if key in _CACHE:
        return _CACHE[key]
    cluster = load_cluster(_cluster_for(row, path, line), num_gpus=gpus)
    wd, kd = _dtypes(row["precision"], path, line)
    plan = ServePlan(tp=tp, pp=pp, ep=ep, replicas=max(1, gpus // (tp * pp)), weight_dtype=wd, kv_dtype=kd)
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
        if not res.has_tpot:  # one output token: no time between tokens to compare
            raise SpecError("row", "output_len", str(res.output_tokens // res.num_requests),
                            "a tpot_mean_ms row needs at least 2 output tokens")
        return float(res.tpot_s.mean()) / MILLI
    raise AssertionError(metric)


def predict_row(row: dict, path: str, line: int) -> dict:
    out = row_result(row, path, line, METRICS)
    # a malformed cell skips the row with its reason, before an unknown metric would
    for col in ("num_gpus", "tp", "pp", "input_len", "output_len"):
        int_cell(row, col, path, line)
    _load(row["batch_or_concurrency"], path, line)
    _dtypes(row["precision"], path, line)
    if out["skipped"]:
        return out
    metric = out["metric_id"]
    if row["gpu"].lower().startswith("tpu"):
        from ..inference.pope import predict_pope_row
        pred, plan_text = predict_pope_row(row, metric, path, line)
    else:
        plan, res = _scenario(row, path, line)
        pred, plan_text = _predict(metric, plan, res), plan.describe()
    return with_prediction(out, pred, plan_text)


def validate_inference_file(path: str, progress=None) -> dict:
    rows = read_rows(path, REQUIRED_COLUMNS, "an inference file", KNOWN_COLUMNS)
    _CACHE.clear()
    return validate_rows(rows, lambda row, line: predict_row(row, path, line), progress)
