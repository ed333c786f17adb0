"""Measurements -> a hardware profile: a cluster TOML (with its GPU inline) that `search`,
`estimate`, `validate` and `run` read through `--hardware profile.toml` (no torch here).

How each number is derived (docs/model.md, "Calibration"):
- GEMM peak = the fastest measured GEMM rate, flops / (time − τ); the efficiency curve is the
  median of rate/peak per quarter-decade of GEMM FLOPs (as calibration/vidur_curves.py does
  for vidur's profiles); τ = the measured launch overhead of one tiny kernel.
- Attention: forward F/((t − τ)·peak) and backward 2.5F/((t − τ)·peak) (FlashAttention-2's
  backward FLOPs, cost/flops.py) at their FLOPs, binned the same way, one curve per SDPA
  backend measured, under the kernel name the cost model gives it (run/attention.py: on a
  GPU FlashAttention-2 -> `flash2`, cuDNN's fused attention -> `flash3`; a CPU's -> `flash2`).
- Memory bandwidth: the device-to-device copy of the largest size measured, 2·bytes/time
  (read + write), with memory_bw_efficiency 1 (the number is already achieved, not a
  datasheet peak). The largest copy streams from DRAM/HBM past the caches, as a training
  step's activations and optimizer states do; a small copy that stays in a CPU's cache
  runs about three times faster and would price every element-wise kernel too low.
- Optimizer: torch's AdamW step (as `paraplan run` takes it) over fp32 parameters past the
  caches, every rank at once; optimizer_efficiency = 72·params / ((t − launches·τ)·bw), the
  share of the copy bandwidth that makes the model's Adam traffic (cost/evaluate.py
  ADAM_STEP) take the measured time. On a shared CPU the ranks' steps contend for the
  memory bus as they do in a data-parallel run.
- Overlap slowdown: a GEMM loop alone (t_c), an all-reduce alone (t_m ≤ t_c) and both at
  once (t_b): overlap_slowdown = (t_b − t_c)/t_m, the cost model's share of an overlapped
  collective's time that still lands on the step (cost/evaluate.py); near 0 on a GPU
  where NCCL takes a few SMs, near 1 on a CPU where gloo takes the cores the GEMMs use.
- In-layer launch overhead (CPU, 2+ ranks): the replica layer below, (one more layer − the
  model's price of its math at τ = 0) / the kernels the model counts in it, at least τ.
- TP collective overhead: paraplan run's layer at negligible size, 1 and 3 layers, TP over
  every rank (DTensor, SP) and as a replica on each: (TP layer − replica layer − the model's
  price of the layer's 8 collectives on the fitted link) / 8, a layer being (t₃ − t₁)/2.
- Links: a Hockney (α-β) least-squares fit of the all-reduce times, t = a + b·B, gives the
  per-hop latency α = a/(2(n−1)) and bandwidth bw = 2(n−1)/n / b; the efficiency curve then
  makes the model's ring all-reduce reproduce each measured time exactly:
  η(B) = 2(n−1)/n·B / (bw·(t − a)). One machine has one tier: the scale-out tier repeats it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from .. import units
from ..errors import SpecError
from ..specs.catalog import cluster_from_text, load_cluster
from ..specs.hardware import AttentionKernel, ClusterSpec
from ..specs.workload import Precision
from .measurements import Measurements, tp_layer_spec

FLASH_BWD_OVER_FWD = 2.5   # FlashAttention-2 backward FLOPs over forward (Dao 2023 Sec. 3.1; cost/flops.py)
MIN_EFFICIENCY = 1e-3      # curve floor: EfficiencyCurve needs y > 0
BINS_PER_DECADE = 4


@dataclass(frozen=True, kw_only=True)
class LinkFit:
    latency_s: float
    bw_unidir_bytes_per_s: float
    curve: tuple[tuple[float, float], ...]  # (message bytes, efficiency), of the all-reduce
    # all-gather / reduce-scatter measured apart: their own (bytes, efficiency) on this link
    op_curves: tuple[tuple[str, tuple[tuple[float, float], ...]], ...] = ()


@dataclass(frozen=True, kw_only=True)
class Profile:
    """The fitted numbers, in SI units, and the TOML text that carries them."""

    peak_flops_per_s: float
    gemm_curve: tuple[tuple[float, float], ...]
    attention_curves: dict[str, tuple[tuple[float, float], ...]]  # AttentionKernel value -> curve
    memory_bw_bytes_per_s: float
    host_link_bytes_per_s: float
    launch_overhead_s: float
    link: LinkFit | None
    toml: str
    elementwise_efficiency: float | None = None
    compiled_elementwise_ratio: float | None = None
    optimizer_efficiency: float | None = None
    loss_efficiency: float | None = None
    scatter_add_efficiency: float | None = None
    tp_collective_overhead_s: float | None = None
    layer_launch_overhead_s: float | None = None  # per kernel inside a layer (CPU, 2+ ranks)
    eager_layer_host_s: float | None = None       # an eager layer's host time (GPU)


def _binned(points) -> tuple[tuple[float, float], ...]:
    """Median efficiency per 1/BINS_PER_DECADE decade of size, clamped into (0, 1]."""
    bins = defaultdict(list)
    for x, y in points:
        bins[round(BINS_PER_DECADE * math.log10(x)) / BINS_PER_DECADE].append(y)
    return tuple((10 ** k, min(max(statistics.median(v), MIN_EFFICIENCY), 1.0)) for k, v in sorted(bins.items()))


def fit_compute(m: Measurements) -> tuple[float, tuple, dict]:
    """(peak FLOP/s, GEMM curve, {attention kernel: curve}) from the compute-dtype samples;
    without flash2 samples, flash2 takes the GEMM curve (the profile says so)."""
    tau = m.launch_overhead_s
    gemms = [g for g in m.gemm if g.dtype == m.compute_dtype]
    if not gemms:
        raise ValueError(f"no GEMM measured in the compute dtype {m.compute_dtype}")
    # τ is removed from each time, but never more than half of it: a tiny GEMM can take about
    # one launch on a busy machine, and its rate must not explode
    rates = [(g.flops, g.flops / max(g.time_s - tau, g.time_s / 2)) for g in gemms]
    peak = max(r for _, r in rates)
    gemm_curve = _binned((f, r / peak) for f, r in rates)
    att: dict[str, list] = {}
    for a in m.attention:
        if a.dtype != m.compute_dtype:
            continue
        f, fb = a.fwd_flops, FLASH_BWD_OVER_FWD * a.fwd_flops
        att.setdefault(a.kernel, []).extend(
            [(f, f / max(a.fwd_time_s - tau, a.fwd_time_s / 2) / peak),
             (fb, fb / max(a.bwd_time_s - tau, a.bwd_time_s / 2) / peak)])
    curves = {k: _binned(v) for k, v in sorted(att.items())}
    curves.setdefault(AttentionKernel.FLASH2.value, gemm_curve)  # a GPU spec always has it (catalog): the GEMM curve if unmeasured
    return peak, gemm_curve, dict(sorted(curves.items()))


def misaligned_ratio(m: Measurements) -> float | None:
    """The misaligned GEMM's rate over the aligned one's (m.misaligned_gemm), at most 1;
    None when not measured."""
    if not m.misaligned_gemm:
        return None
    aligned, misaligned = m.misaligned_gemm
    return min((misaligned.flops / misaligned.time_s) / (aligned.flops / aligned.time_s), 1.0)


def fit_link(m: Measurements) -> LinkFit | None:
    """α-β fit of the all-reduce samples (None when fewer than two ranks were measured)."""
    ar = sorted((c for c in m.collectives if c.op == "all_reduce" and c.world > 1), key=lambda c: c.num_bytes)
    if len(ar) < 2:
        return None
    n = ar[0].world
    xs, ys = [c.num_bytes for c in ar], [c.time_s for c in ar]
    if len(set(xs)) < 2:
        raise ValueError("the all-reduce samples need two different sizes to fit a link")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    b = max(b, 1e-15)
    bw = 2.0 * (n - 1) / n / b
    # latency: the least-squares intercept, lowered where a sample would need an efficiency
    # above 1 to be reproduced (t − a >= moved/bw), kept above 5% of the fastest call
    room = min(y - 2.0 * (n - 1) / n * x / bw for x, y in zip(xs, ys))
    a = max(min(my - b * mx, room), min(ys) * 0.05)
    curve = tuple((x, min(max(2.0 * (n - 1) / n * x / (bw * (y - a)), MIN_EFFICIENCY), 1.0)) for x, y in zip(xs, ys))
    hop = a / (2.0 * (n - 1))
    # all-gather and reduce-scatter on the same α and bandwidth: one ring phase, (n−1)/n·B,
    # the efficiency that reproduces each measured time (cost/comm.py `_step`)
    ops = []
    for op in ("all_gather", "reduce_scatter"):
        samples = [c for c in m.collectives if c.op == op and c.world == n and c.num_bytes > 0]
        if len({c.num_bytes for c in samples}) >= 2:
            ops.append((op, _median_by_size(
                (c.num_bytes, min(max((n - 1) / n * c.num_bytes / (bw * max(c.time_s - hop * (n - 1), 1e-12)),
                                      MIN_EFFICIENCY), 1.0)) for c in samples)))
    return LinkFit(latency_s=hop, bw_unidir_bytes_per_s=bw, curve=_median_by_size(curve), op_curves=tuple(ops))


def _median_by_size(points) -> tuple[tuple[float, float], ...]:
    """(size, value) points with one median value per size, ascending."""
    merged: dict = {}
    for x, e in points:
        merged.setdefault(x, []).append(e)
    return tuple((x, statistics.median(v)) for x, v in sorted(merged.items()))


# TOML basic-string escapes (toml.io v1.0.0, "String"); other control characters as \uXXXX
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_str(text: str) -> str:
    """`text` as a TOML basic string that reads back as `text` (a lone surrogate, which TOML
    cannot hold, becomes U+FFFD)."""
    out = []
    for c in text:
        o = ord(c)
        if c in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[c])
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        elif 0xD800 <= o <= 0xDFFF:
            out.append("\ufffd")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def printable(text: str) -> str:
    """`text` for one line (a `# ...` comment, the summary): a newline in a device name or a
    command-line argument must not end it (control characters and lone surrogates shown as
    escapes)."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)



def _finite(field: str, x: float) -> float:
    if not (math.isfinite(x) and x > 0):
        raise SpecError("calibrate", field, x, "the measurements must give a positive finite value "
                                               "(times too short or sizes too large?)")
    return x


def _num(x: float) -> str:
    return f"{x:.6g}" if "e" in f"{x:.6g}" or "." in f"{x:.6g}" else f"{x:.6g}.0"


def _arr(xs) -> str:
    return "[" + ", ".join(_num(x) for x in xs) + "]"


def _tier_toml(name: str, link: LinkFit, note: str) -> list[str]:
    lines = [f"[{name}]", f"# {note}", f"gb_per_s = {_num(link.bw_unidir_bytes_per_s / units.GIGA)}",
             f"latency_us = {_num(link.latency_s * 1e6)}",
             f"efficiency_bytes = {_arr(x for x, _ in link.curve)}",
             f"efficiency = {_arr(round(y, 4) for _, y in link.curve)}", ""]
    for op, curve in link.op_curves:
        lines += [f"[{name}.{op}]", f"# {op.replace('_', '-')} measured on its own, same bandwidth and latency",
                  f"efficiency_bytes = {_arr(x for x, _ in curve)}",
                  f"efficiency = {_arr(max(round(y, 4), MIN_EFFICIENCY) for _, y in curve)}", ""]
    return lines


def _base_tier_toml(name: str, base: ClusterSpec) -> list[str]:
    t = getattr(base, name)
    return [f"[{name}]", f"# not measured (one device here): copied from the {base.name} preset",
            f"gb_per_s = {_num(t.bw_unidir_bytes_per_s / units.GIGA)}", f"latency_us = {_num(t.latency_s * 1e6)}",
            f"efficiency_bytes = {_arr(t.efficiency.x)}", f"efficiency = {_arr(t.efficiency.y)}", ""]


# the torch dtype a calibration computed in, as the workload precision that computes in it
_DTYPE_PRECISION = {"float32": Precision.FP32, "bfloat16": Precision.BF16, "float16": Precision.FP16}


def compute_precision(m: Measurements) -> Precision:
    """The precision whose workloads compute in the measured dtype (fp32 on a CPU)."""
    return _DTYPE_PRECISION.get(m.compute_dtype, Precision.BF16)


def elementwise_efficiency(m: Measurements, mem_bw: float) -> float | None:
    """The share of the copy bandwidth a layer's element-wise kernels reach on the bytes the
    cost model counts for them (cost/evaluate.py), so that the model reproduces the measured
    time: bytes / ((t − launches·τ) · bandwidth), within [MIN_EFFICIENCY, 1]."""
    e = m.elementwise
    if e is None:
        return None
    from ..cost.evaluate import EW_FWD_KERNELS, elementwise_bytes_per_token
    from ..specs.model import ModelSpec
    layer = ModelSpec(name="calibrate-layer", num_layers=1, hidden_size=e.hidden, ffn_hidden_size=e.ffn,
                      num_heads=e.q_dim // e.head_dim, num_kv_heads=e.kv_dim // e.head_dim, head_dim=e.head_dim,
                      vocab_size=1, gated_mlp=True)
    counted = e.tokens * elementwise_bytes_per_token(layer, act_bytes=compute_precision(m).activation_bytes)
    return _streaming_share(counted, e.time_s, EW_FWD_KERNELS, m.launch_overhead_s, mem_bw)


def compiled_elementwise_ratio(m: Measurements) -> float | None:
    """The layer's element-wise kernels under torch.compile over the same eager: their time
    ratio, within [MIN_EFFICIENCY, 1] (GPU only; None when not measured)."""
    e = m.elementwise
    if e is None or e.compiled_time_s is None:
        return None
    return min(max(e.compiled_time_s / e.time_s, MIN_EFFICIENCY), 1.0)


def _streaming_share(counted_bytes: float, time_s: float, launches: int, launch_s: float, mem_bw: float) -> float:
    """bytes / ((t − launches·τ)·bandwidth) within [MIN_EFFICIENCY, 1]: the efficiency with
    which the model's memory_bound_time_s reproduces a measured time."""
    busy = time_s - launches * launch_s
    if busy <= 0.0:  # the launches alone take the time: the bytes cost nothing more
        return 1.0
    return min(max(float(counted_bytes / (busy * mem_bw)), MIN_EFFICIENCY), 1.0)


def optimizer_efficiency(m: Measurements, mem_bw: float) -> float | None:
    """The share of the copy bandwidth the optimizer step reaches on the bytes the cost
    model counts for torch's AdamW (cost/evaluate.py ADAM_STEP, 72 B per parameter), so that
    the model reproduces the measured step: bytes / ((t − launches·τ) · bandwidth), within
    [MIN_EFFICIENCY, 1]. Launches: each of the passes once per tensor on a CPU (torch's
    one-tensor-at-a-time path), once per pass on a GPU (its multi-tensor path)."""
    o = m.optimizer
    if o is None:
        return None
    from ..cost.evaluate import ADAM_STEP
    from ..specs.workload import Optimizer
    step_bytes, passes = ADAM_STEP[Optimizer.ADAM_UNFUSED]
    launches = passes * (o.tensors if m.device_type == "cpu" else 1)
    return _streaming_share(step_bytes * o.params, o.time_s, launches, m.launch_overhead_s, mem_bw)


def loss_efficiency(m: Measurements, mem_bw: float) -> float | None:
    """The share of the copy bandwidth the cross-entropy reaches on the bytes the cost model
    counts for it (cost/evaluate.py loss_bytes_per_logit, 3 kernels forward and 4 backward),
    so that the model reproduces the measured forward + backward; None when not measured."""
    s = m.loss
    if s is None:
        return None
    from ..cost.evaluate import LOSS_BWD_KERNELS, LOSS_FWD_KERNELS, loss_bytes_per_logit
    fwd_b, bwd_b = loss_bytes_per_logit(compute_precision(m))
    return _streaming_share((fwd_b + bwd_b) * s.tokens * s.vocab, s.fwd_time_s + s.bwd_time_s,
                            LOSS_FWD_KERNELS + LOSS_BWD_KERNELS, m.launch_overhead_s, mem_bw)


def scatter_add_efficiency(m: Measurements, mem_bw: float) -> float | None:
    """The share of the copy bandwidth a scatter-add of token rows reaches on the bytes the
    cost model counts for it (cost/moe.py: read and write each row, 2 × its bytes), so that
    the model reproduces the measured time; None when not measured."""
    s = m.scatter
    if s is None:
        return None
    from ..cost.moe import PERMUTE_KERNELS, permutation_pass_bytes
    counted = permutation_pass_bytes(s.rows, s.hidden, _DTYPE_PRECISION[s.dtype].activation_bytes)
    return _streaming_share(float(counted), s.time_s, PERMUTE_KERNELS // 2, m.launch_overhead_s, mem_bw)


def split_host_fit(layers, times_s) -> tuple[float, float, float]:
    """(c0, c1, c2) with c0 + c1·L + c2·L² closest to the times in relative terms (least
    squares of (fit − t)/t, so that 1 layer counts as much as 16) and every coefficient >= 0:
    the host time of a split-backward pass over L layers (GPUSpec zb_input_host_s /
    zb_weight_host_s, priced by cost/evaluate.py split_host_s). Each subset of the three
    terms is fitted and the best non-negative fit kept (seven subsets)."""
    import itertools

    import numpy as np
    L, y = np.asarray(layers, dtype=float), np.asarray(times_s, dtype=float)
    cols = np.stack([np.ones_like(L), L, L * L], axis=1) / y[:, None]
    ones = np.ones_like(y)
    best, best_err = (0.0, 0.0, 0.0), float(len(y))
    for k in (1, 2, 3):
        for keep in itertools.combinations(range(3), k):
            sol, *_ = np.linalg.lstsq(cols[:, keep], ones, rcond=None)
            if np.any(sol < 0):
                continue
            err = float(np.sum((cols[:, keep] @ sol - ones) ** 2))
            if err < best_err:
                coef = [0.0, 0.0, 0.0]
                for i, c in zip(keep, sol):
                    coef[i] = float(c)
                best, best_err = tuple(coef), err
    return best


def tp_collective_overhead_s(m: Measurements, cluster: ClusterSpec) -> float | None:
    """Host time per tensor-parallel collective beyond what the model prices for it: one
    more TP layer's time, less one more replica layer's (the eager dispatch of the math both
    run), less the model's price of the layer's collectives at that size on `cluster` (the
    fitted link), over their count: an all-gather and a reduce-scatter around attention and
    around the MLP, forward and backward (cost/evaluate.py tp_collectives_per_pass). None when
    not measured; 0 when the priced collectives already take the time."""
    s = m.tp_layer
    if s is None:
        return None
    from ..cost.comm import Collective, collective_time_s
    from ..cost.evaluate import tp_collectives_per_pass
    count = 2.0 * float(tp_collectives_per_pass(True, 2.0))  # forward and backward
    buffer = s.tokens * s.hidden * s.bytes_per_element
    priced = count / 2.0 * sum(float(collective_time_s(cluster, kind, buffer, s.world, 1))
                               for kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER))
    return max(s.tp_layer_s - s.plain_layer_s - priced, 0.0) / count


def layer_launch_overhead_s(m: Measurements, cluster: ClusterSpec) -> tuple[float, float, float] | None:
    """The host time per kernel of eager PyTorch inside a training layer (dispatch, autograd,
    module calls), from paraplan run's replica layer at negligible size: (one more layer's
    forward + backward − the model's price of that layer's math) / the kernels the model
    counts in it, and never below the bare one-element add's τ. The model's layer price and
    kernel count come from cost/evaluate.py itself, at τ = 0 and τ = 1 ms. Returns (τ, the
    layer's math as priced, kernels counted); None when not measured (a GPU, or one rank)."""
    s = m.tp_layer
    if s is None:
        return None
    from dataclasses import replace

    from ..cost.evaluate import evaluate
    from ..plan.plan import make_plan
    from ..specs.workload import Workload
    spec = tp_layer_spec(s.hidden)
    wl = Workload(global_batch_size=1, seq_len=s.tokens, precision=compute_precision(m))

    def layer_s(tau: float) -> float:
        c = replace(cluster, gpu=replace(cluster.gpu, kernel_launch_overhead_s=tau))
        detail = evaluate(spec, c, wl, make_plan(fused_kernels=False)).layer_detail
        return sum(float(v) for part in ("fwd", "bwd") for v in detail[part].values())
    math_s = layer_s(0.0)
    kernels = (layer_s(1e-3) - math_s) / 1e-3
    return max((s.plain_layer_s - math_s) / kernels, m.launch_overhead_s), math_s, kernels


def _split_toml(m: Measurements) -> list[str]:
    """The zero-bubble split backward's host-time fits, with the samples they come from."""
    if not m.split_backward:
        return []
    layers = [s.layers for s in m.split_backward]
    lines = ["# torch.distributed.pipelining's split backward at negligible size (paraplan run's layers, bf16 autocast): "
             "host time of a pass over L layers = c0 + c1*L + c2*L^2 us, fitted to L = "
             + ", ".join(map(str, layers))]
    for key, attr, what in (("zb_input_host_us", "input_s", "B (stage_backward_input)"),
                            ("zb_weight_host_us", "weight_s", "W (stage_backward_weight)")):
        times = [getattr(s, attr) for s in m.split_backward]
        coef = split_host_fit(layers, times)
        lines += [f"# {what}: " + ", ".join(f"{t * 1e3:.2f}" for t in times) + " ms (whole backward: "
                  + ", ".join(f"{s.backward_s * 1e3:.2f}" for s in m.split_backward) + " ms)",
                  f"{key} = {_arr(round(c * 1e6, 3) for c in coef)}"]
    return lines


@dataclass(frozen=True)
class _Fitted:
    """What build_profile derives from the measurements, before it writes them."""

    peak_flops_per_s: float
    gemm_curve: list
    att_curves: dict
    largest: object        # the largest device-to-device copy
    memory_bw_bytes_per_s: float
    ew_eff: float | None
    ew_compiled: float | None
    opt_eff: float | None
    loss_eff: float | None
    scatter_eff: float | None
    host_layer_s: float | None
    host_link_bytes_per_s: float
    link: object
    base: object           # the cluster whose tiers stand in when no link was measured
    ranks: int
    cpu: bool


def _fitted(m: Measurements, base_cluster: str) -> _Fitted:
    """Peak, curves, bandwidths and efficiencies from the measurements."""
    peak, gemm_curve, att_curves = fit_compute(m)
    _finite("peak_flops_per_s", peak)
    device = [c for c in m.copies if c.kind == "device"]
    if not device:
        raise ValueError("no device-to-device copy measured")
    largest = max(device, key=lambda c: c.num_bytes)
    mem_bw = _finite("memory_bw_bytes_per_s", 2.0 * largest.num_bytes / largest.time_s)
    ew_eff = elementwise_efficiency(m, mem_bw)
    ew_compiled = compiled_elementwise_ratio(m)
    opt_eff = optimizer_efficiency(m, mem_bw)
    loss_eff = loss_efficiency(m, mem_bw)
    scatter_eff = scatter_add_efficiency(m, mem_bw)
    host_layer = m.host_layer.layer_s if m.host_layer is not None else None
    host = [c for c in m.copies if c.kind in ("h2d", "d2h")]
    host_bw = _finite("host_link_bytes_per_s", max((c.num_bytes / c.time_s for c in host), default=mem_bw / 2.0))
    link = fit_link(m)
    base = None if link is not None else load_cluster(base_cluster)
    ranks = m.ranks if link is not None else (base.gpus_per_node if base else 1)
    cpu = m.device_type == "cpu"
    return _Fitted(peak_flops_per_s=peak, gemm_curve=gemm_curve, att_curves=att_curves, largest=largest, memory_bw_bytes_per_s=mem_bw, ew_eff=ew_eff, ew_compiled=ew_compiled, opt_eff=opt_eff, loss_eff=loss_eff, scatter_eff=scatter_eff, host_layer_s=host_layer, host_link_bytes_per_s=host_bw, link=link, base=base, ranks=ranks, cpu=cpu)


def _header_lines(m: Measurements, command: str) -> list[str]:
    """The profile's opening comments: the machine, the command, the load it was measured under."""
    return [
        printable(f"# paraplan hardware profile: {m.device_name} ({m.device_type}), {m.ranks} rank(s) x "
                 f"{m.threads_per_rank} thread(s), torch {m.torch_version}, {m.backend or 'no'} collectives"),
        printable(f"# written by: {command}") if command else "# written by paraplan calibrate",
        "# Every number below is measured on this machine except where a comment says otherwise.",
        f"# load average {m.load_average:.1f} on {m.cpu_count} CPUs when measured: other jobs slow a shared machine"
        if m.cpu_count else "# load average not recorded"]


def _profile_lines(m: Measurements, f: _Fitted, name: str, command: str) -> list[str]:
    """The profile's TOML, line by line, each measured number with a comment saying how."""
    (peak, gemm_curve, largest, mem_bw, ew_eff, ew_compiled, opt_eff, loss_eff, scatter_eff, host_layer, host_bw,
     ranks, cpu) = (f.peak_flops_per_s, f.gemm_curve, f.largest, f.memory_bw_bytes_per_s, f.ew_eff, f.ew_compiled, f.opt_eff, f.loss_eff,
                    f.scatter_eff, f.host_layer_s, f.host_link_bytes_per_s, f.ranks, f.cpu)
    lines = [
        *_header_lines(m, command),
        f"name = {_toml_str(name)}", f"num_gpus = {ranks}", f"gpus_per_node = {ranks}",
        # a GPU machine's DRAM holds offloaded optimizer states; on a CPU it is the device memory
        *([f"# the measured GPUs' share of this machine's DRAM ({m.ranks} of {max(m.device_count, m.ranks)} GPUs; "
           "for offloaded optimizer states, UVM tables, buffered experts)",
           f"host_memory_gb_per_host = "
           f"{_num(m.host_memory_bytes * m.ranks / max(m.device_count, m.ranks) / units.GIGA)}"]
          if not cpu and m.host_memory_bytes > 0 else []), "",
        "[gpu]", f"name = {_toml_str(m.device_name)}",
        *([f"architecture = {_toml_str(m.architecture)}"] if m.architecture else []),
        f'source = "paraplan calibrate: {len(m.gemm)} GEMMs, {len(m.attention)} attention calls, '
        f'{len(m.copies)} copies, {len(m.collectives)} collectives"',
        f"# per rank: {'host memory / ranks' if cpu else 'device memory'}; reserved = the runtime before any tensor",
        f"hbm_gb = {_num(m.memory_bytes / units.GIGA)}", f"reserved_gb = {_num(m.reserved_bytes / units.GIGA)}",
        f"# largest device-to-device copy ({largest.num_bytes / units.MIB:.0f} MiB, past the caches), "
        "2 x bytes / time (achieved, hence memory_bw_efficiency = 1)",
        f"hbm_tb_per_s = {_num(mem_bw / units.TERA)}", "memory_bw_efficiency = 1.0",
        *([f"# a layer's element-wise kernels ({m.elementwise.tokens} tokens, hidden {m.elementwise.hidden}, "
           f"{m.compute_dtype}): {m.elementwise.time_s * 1e3:.2f} ms for the bytes the cost model counts",
           f"elementwise_efficiency = {_num(round(ew_eff, 4))}"] if ew_eff is not None else []),
        *([f"# the same kernels under torch.compile (inductor): {m.elementwise.compiled_time_s * 1e3:.2f} ms",
           f"compiled_elementwise_ratio = {_num(round(ew_compiled, 4))}"] if ew_compiled is not None else []),
        *([f"# an AdamW step over {m.optimizer.tensors} x {m.optimizer.params // m.optimizer.tensors:,} fp32 parameters, "
           f"every rank at once: {m.optimizer.time_s * 1e3:.2f} ms for the bytes the cost model counts",
           f"optimizer_efficiency = {_num(round(opt_eff, 4))}"] if opt_eff is not None else []),
        *([f"# cross-entropy over {m.loss.tokens} x {m.loss.vocab} upcast {m.loss.dtype} logits: "
           f"{(m.loss.fwd_time_s + m.loss.bwd_time_s) * 1e3:.2f} ms forward + backward for the bytes the cost model counts",
           f"loss_efficiency = {_num(round(loss_eff, 4))}"] if loss_eff is not None else []),
        *([f"# index_add_ of {m.scatter.rows:,} {m.scatter.dtype} rows of {m.scatter.hidden} onto {m.scatter.tokens:,} "
           f"(an eager MoE's combine): {m.scatter.time_s * 1e3:.3f} ms for the bytes the cost model counts",
           f"scatter_add_efficiency = {_num(round(scatter_eff, 4))}"] if scatter_eff is not None else []),
        f"host_link_gb_per_s = {_num(host_bw / units.GIGA)}",
        f"kernel_launch_overhead_us = {_num(m.launch_overhead_s * 1e6)}",
        *([f"# paraplan run's layer at negligible size ({m.host_layer.tokens} tokens, hidden {m.host_layer.hidden}, "
           f"bf16 autocast, fp32 parameters): one more layer's forward + backward took {host_layer * 1e6:.0f} us, "
           "the host's time issuing its kernels; a layer whose GPU work is shorter waits for it",
           f"eager_layer_host_us = {_num(host_layer * 1e6)}"] if host_layer is not None else []),
        *_split_toml(m),
        "sustained_compute_ratio = 1.0",
        *([f"# {m.misaligned_gemm[1].m}x{m.misaligned_gemm[1].k}x{m.misaligned_gemm[1].n} against "
           f"x{m.misaligned_gemm[0].n}: a row not a multiple of 16 bytes",
           f"misaligned_gemm_efficiency_ratio = {_num(round(misaligned_ratio(m), 4))}"] if m.misaligned_gemm else []),
        *([f"# GEMMs alone {m.overlap.compute_s * 1e3:.1f} ms, all-reduce of {m.overlap.num_bytes / units.MIB:.0f} MiB "
           f"alone {m.overlap.comm_s * 1e3:.1f} ms, both at once {m.overlap.both_s * 1e3:.1f} ms",
           f"overlap_slowdown = {_num(round(m.overlap.slowdown, 4))}"] if m.overlap else []),
        "# not measured: energy figures from this profile mean nothing",
        f"tdp_watts = {100.0 if cpu else 700.0}", "",
        "[gpu.peak_tflops]",
        printable(f"# fastest {m.compute_dtype} GEMM measured") + (
            "; a 16-bit workload computes in fp32 on a CPU (paraplan run), so bf16/fp16 carry the fp32 rate"
            if cpu else ""),
        f"bf16 = {_num(peak / units.TERA)}", f"fp16 = {_num(peak / units.TERA)}",
        *([f"fp32 = {_num(peak / units.TERA)}"] if compute_precision(m) is Precision.FP32 else []), "",
        "[gpu.gemm_efficiency]", "# median achieved / peak per quarter-decade of GEMM FLOPs",
        f"flops = {_arr(x for x, _ in gemm_curve)}", f"efficiency = {_arr(round(y, 4) for _, y in gemm_curve)}", "",
    ]
    measured = {a.kernel for a in m.attention if a.dtype == m.compute_dtype}
    for kernel, curve in f.att_curves.items():
        lines += [f"[gpu.attention_efficiency.{kernel}]",
                  f"# torch scaled_dot_product_attention on the backend paraplan names {kernel} (run/attention.py), "
                  "causal, forward and backward (2.5x forward FLOPs)" if kernel in measured else
                  f"# not measured (no {kernel} backend ran here): the GEMM curve",
                  f"flops = {_arr(x for x, _ in curve)}", f"efficiency = {_arr(round(y, 4) for _, y in curve)}", ""]
    if f.link is not None:
        note = printable(f"{m.backend} all-reduce over {m.ranks} local ranks: alpha-beta fit, curve reproduces each time")
        lines += _tier_toml("nvlink", f.link, note)
        lines += _tier_toml("scaleout", f.link, "one machine measured: the same local transport")
    else:
        lines += _base_tier_toml("nvlink", f.base) + _base_tier_toml("scaleout", f.base)
    return lines


def build_profile(m: Measurements, *, name: str, command: str = "", base_cluster: str = "dgx-h100") -> Profile:
    """The profile of the measured device; link tiers from the collectives when 2+ ranks
    were measured, else from `base_cluster` (said so in the file)."""
    f = _fitted(m, base_cluster)
    lines = _profile_lines(m, f, name, command)
    link = f.link
    measured_cluster = cluster_from_text("\n".join(lines), name)
    in_layer = layer_launch_overhead_s(m, measured_cluster)
    if in_layer is not None:
        s, (tau_layer, math_s, kernels) = m.tp_layer, in_layer
        at = lines.index(f"kernel_launch_overhead_us = {_num(m.launch_overhead_s * 1e6)}")
        lines[at:at + 1] = [f"# per kernel inside a training layer: paraplan run's layer at negligible size ({s.tokens} tokens, "
                            f"hidden {s.hidden}) took {s.plain_layer_s * 1e3:.2f} ms forward + backward, its math priced at "
                            f"{math_s * 1e3:.2f} ms, over the {kernels:.0f} kernels the model counts (a bare one-element add "
                            f"takes {m.launch_overhead_s * 1e6:.1f} us)",
                            f"kernel_launch_overhead_us = {_num(tau_layer * 1e6)}"]
    tp_host = tp_collective_overhead_s(m, measured_cluster) if link is not None else None
    if tp_host:
        s = m.tp_layer
        at = lines.index("sustained_compute_ratio = 1.0")
        lines[at:at] = [f"# one tensor-parallel layer (SP, DTensor, {s.tokens} tokens, hidden {s.hidden}) over {s.world} ranks: "
                        f"{s.tp_layer_s * 1e3:.2f} ms, its replica on one rank {s.plain_layer_s * 1e3:.2f} ms; "
                        "the rest beyond the priced transfers, per collective",
                        f"tp_collective_overhead_us = {_num(tp_host * 1e6)}"]
    return Profile(peak_flops_per_s=f.peak_flops_per_s, gemm_curve=f.gemm_curve, attention_curves=f.att_curves,
                   memory_bw_bytes_per_s=f.memory_bw_bytes_per_s, host_link_bytes_per_s=f.host_link_bytes_per_s,
                   launch_overhead_s=m.launch_overhead_s, link=link, toml="\n".join(lines),
                   elementwise_efficiency=f.ew_eff, compiled_elementwise_ratio=f.ew_compiled,
                   optimizer_efficiency=f.opt_eff, loss_efficiency=f.loss_eff, scatter_add_efficiency=f.scatter_eff,
                   tp_collective_overhead_s=tp_host,
                   layer_launch_overhead_s=in_layer[0] if in_layer is not None else None,
                   eager_layer_host_s=f.host_layer_s)
