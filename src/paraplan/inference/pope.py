"""Static-batch inference on a chip slice in Pope et al.'s layouts (prefill, decode, KV fit).

Pope et al. 2022 time one forward pass of B sequences as, per layer: the matmuls (2·N/l
FLOPs per token over n chips at the GEMM's achieved efficiency), or the weights and KV
cache streamed from HBM if that takes longer (decode), plus the layout's communication
(layouts.py) at the interconnect's bandwidth. MFU counts 2·N FLOPs per token (N the
parameters, as Pope et al. and PaLM do for inference).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from dataclasses import dataclass

from ..cost.memory import ACT_BYTES
from ..errors import ParaplanError, SpecError
from ..specs.catalog import load_cluster, load_model
from ..specs.files import without_note
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Precision
from .deploy import AttentionSharding, Layout, ServePlan, StoreDtype
from .layouts import comm_bytes_per_layer, ws2d_best_x
from .step import AttentionWindow, body_params_per_layer, kv_bytes_per_token_per_layer, kv_share_per_gpu

# Pope et al. Table 1 reserves 30% of HBM for the KV cache (the rest: weights, activations).
POPE_KV_HBM_FRACTION = 0.3


@dataclass(frozen=True, kw_only=True)
class StaticPass:
    time_s: float
    compute_s: float
    memory_s: float
    comm_s: float
    mfu: float


def forward_pass(model: ModelSpec, cluster: ClusterSpec, *, n: int, layout: Layout, plan: ServePlan,
                 batch: int, tokens_per_seq: int, context: int) -> StaticPass:
    """One forward pass of `batch` sequences × `tokens_per_seq` new tokens (each attending to
    `context` earlier tokens) on n chips."""
    gpu = cluster.gpu
    L = model.num_layers
    tokens = batch * tokens_per_seq
    N = model.num_params - model.embedding_params  # matmul parameters (tied head counted once)
    flops_layer = 2.0 * (N / L) * tokens / n
    # causal attention over the new tokens plus the cached context (the model as published:
    # a windowed layer's query sees at most w keys and its cache holds at most w tokens)
    flops_layer += 4.0 * batch * AttentionWindow.of(model, honoured=True).prefill_pairs(context, tokens_per_seq) * model.q_dim / n
    eff = gpu.gemm_efficiency.at(flops_layer)
    compute = flops_layer / (gpu.peak(Precision.BF16) * eff)
    wbytes = plan.weight_dtype.bytes_per_element
    layer_w = body_params_per_layer(model) * wbytes
    if layout is Layout.WG_XYZ:
        weights_read = layer_w  # the gathered copy is read whole on every chip
    else:
        weights_read = layer_w / n
    kv = batch * AttentionWindow.of(model, honoured=True).held(context + tokens_per_seq) * kv_bytes_per_token_per_layer(model, plan.kv_dtype.bytes_per_element) \
        * kv_share_per_gpu(model, plan)
    memory = (weights_read + kv) / (gpu.hbm_bw_bytes_per_s * gpu.memory_bw_efficiency)
    comm_bytes = comm_bytes_per_layer(layout, tokens=tokens, d_model=model.hidden_size, d_ff=model.ffn_hidden_size,
                                      n=n, act_bytes=ACT_BYTES, layer_weight_bytes=layer_w)
    comm = _comm_time_s(cluster, layout, comm_bytes, model, n)
    per_layer = max(compute, memory) + comm
    total = L * per_layer
    mfu = 2.0 * N * tokens / (total * n * gpu.peak(Precision.BF16))
    return StaticPass(time_s=total, compute_s=L * compute, memory_s=L * memory, comm_s=L * comm, mfu=mfu)


def _comm_time_s(cluster: ClusterSpec, layout: Layout, num_bytes: float, model: ModelSpec, n: int) -> float:
    """Ring collectives along the layout's mesh axes: 1D and weight-gathered span all n chips;
    2D runs its all-gathers and reduce-scatters along the X and YZ axes (X = √(n·E/F)), so a
    collective pays (X − 1) + (YZ − 1) hop latencies, not n − 1."""
    if n <= 1 or num_bytes <= 0:
        return 0.0
    ici = cluster.nvlink
    if layout is Layout.WS_2D:
        x = max(1.0, round(ws2d_best_x(model.hidden_size, model.ffn_hidden_size, n)))
        hops = 2.0 * ((x - 1.0) + (n / x - 1.0))   # all-gather and reduce-scatter on both axes
    elif layout is Layout.WS_1D:
        hops = 2.0 * (n - 1.0)
    else:
        hops = n - 1.0
    return hops * ici.latency_s + num_bytes / (ici.bw_unidir_bytes_per_s * ici.efficiency.at(num_bytes))


def _variant(model: ModelSpec, notes: str) -> tuple[ModelSpec, AttentionSharding]:
    """Pope Table 1's attention variants of PaLM 540B, from the row's notes."""
    text = notes.lower()
    m = re.search(r"d_head\s*=\s*(\d+)", text)
    head_dim = int(m.group(1)) if m else model.head_dim
    sharding = AttentionSharding.BATCH if "over batch" in text else AttentionSharding.HEADS
    kv_heads = model.num_heads if "multihead" in text else model.num_kv_heads
    return replace(model, head_dim=head_dim, num_kv_heads=kv_heads), sharding


def _layout(notes: str) -> Layout:
    t = notes.lower()
    if "weight-gathered" in t:
        return Layout.WG_XYZ
    if "2d weight-stationary" in t:
        return Layout.WS_2D
    return Layout.WS_1D


def max_context_tokens(model: ModelSpec, cluster: ClusterSpec, plan: ServePlan, batch: int,
                       kv_fraction: float = POPE_KV_HBM_FRACTION) -> int:
    """Longest context whose KV cache for `batch` sequences fits in kv_fraction of each chip's HBM."""
    per_token = kv_bytes_per_token_per_layer(model, plan.kv_dtype.bytes_per_element) * model.num_layers \
        * kv_share_per_gpu(model, plan)
    window = AttentionWindow.of(model, honoured=True)
    longest = window.max_context(cluster.gpu.hbm_bytes * kv_fraction / per_token / batch)
    if math.isinf(longest):
        raise ParaplanError(f"every layer of {model.name} attends to a {window.window}-token window: its KV cache "
                            "stops growing there, so memory sets no longest context")
    return int(longest)


def predict_pope_row(row: dict, metric: str, path: str, line: int) -> tuple[float, str]:
    """One measurements row (../shared/validation inference_dev.csv) of Pope et al.'s static batches."""
    from ..validate.rows import int_cell, required_int  # the CSV cell rules live with the reader
    base = load_model(without_note(row["model"]))
    model, sharding = _variant(base, row.get("notes", ""))
    n = required_int(row, "num_gpus", path, line, "a static-batch row")
    cluster = load_cluster("tpu-v4-pod", num_gpus=n)
    wd = StoreDtype.INT8 if "int8" in row["precision"].lower() else StoreDtype.BF16
    # the KV cache and weights spread over all n chips of the slice (plan.tp = n)
    plan = ServePlan(tp=n, weight_dtype=wd, kv_dtype=StoreDtype.BF16, attention_sharding=sharding)
    try:
        float(row["batch_or_concurrency"])
    except ValueError:  # a load (QPS=r, max load), not a batch
        raise SpecError("row", "batch_or_concurrency", row["batch_or_concurrency"], "an integer batch") from None
    batch = int_cell(row, "batch_or_concurrency", path, line)  # a number: a whole one >= 1
    layout = _layout(row.get("notes", ""))
    text = f"{n} chips {layout.value} kv:{sharding.value} w:{wd.value} batch {batch}"
    if metric == "max_context_tokens":
        return float(max_context_tokens(model, cluster, plan, batch)), text
    isl = required_int(row, "input_len", path, line, f"a {metric} row")
    if metric.startswith("prefill"):
        p = forward_pass(model, cluster, n=n, layout=layout, plan=plan, batch=batch, tokens_per_seq=isl, context=0)
        return (p.time_s if metric == "prefill_latency_s" else 100.0 * p.mfu), text
    osl = required_int(row, "output_len", path, line, f"a {metric} row")
    steps = [forward_pass(model, cluster, n=n, layout=layout, plan=plan, batch=batch, tokens_per_seq=1,
                          context=isl + i) for i in range(osl)]
    total = sum(s.time_s for s in steps)
    if metric == "decode_latency_s":
        return total, text
    N = model.num_params - model.embedding_params
    return 100.0 * 2.0 * N * batch * osl / (total * n * cluster.gpu.peak(Precision.BF16)), text
