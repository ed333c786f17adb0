"""An eager engine's GPU waiting for its host: the host issues each kernel from Python ahead
of the GPU through a FIFO stream, and a GPU that drains the queue idles.

Legend: n kernel groups, g a group's GPU time, h its host time, s0 the GPU's queued work at
the start, d = h − g, k groups run from the slack before the first wait.
"""

from __future__ import annotations

import numpy as np

from ..sim.schedules import SPLIT_BACKWARD
from . import memory as mem

# Of an eager layer's host time, the share spent issuing its forward: the backward issues about
# two kernels per forward kernel (autograd's input- and weight-gradient ops), so a third
HOST_FORWARD_SHARE = 1.0 / 3.0


def host_idle_s(n, gpu_s, host_s, slack_s):
    """(GPU idle time, slack after) of n like kernels-groups issued by a host that runs ahead of
    the GPU through a FIFO stream: each takes `host_s` to issue and `gpu_s` to run, and the
    GPU starts with `slack_s` of queued work. Issuing one: the GPU waits max(host − slack, 0),
    then slack' = max(slack − host, 0) + gpu. Closed form over the n (vectorized): GPU-bound
    groups wait at most at the first; host-bound ones drain the slack by host − gpu each,
    then every one waits host − gpu."""
    n, g, h, s0 = (np.asarray(x, dtype=float) for x in (n, gpu_s, host_s, slack_s))
    d = h - g
    # GPU-bound (g >= h): only the first may wait
    idle_gb = np.where(n > 0, np.maximum(h - s0, 0.0), 0.0)
    end_gb = np.where(n > 0, np.maximum(s0 - h, 0.0) + g + np.maximum(n - 1.0, 0.0) * (g - h), s0)
    # host-bound (g < h): k groups run from the slack before the first wait
    dd = np.where(d > 0, d, 1.0)
    k = np.where(s0 >= h, np.floor((s0 - h) / dd) + 1.0, 0.0)
    waits = k < n
    s_k = s0 - k * d
    idle_hb = np.where(waits, (h - s_k) + np.maximum(n - k - 1.0, 0.0) * d, 0.0)
    end_hb = np.where(waits, g, s0 - n * d)
    host_bound = d > 0
    return np.where(host_bound, idle_hb, idle_gb), np.where(host_bound, end_hb, end_gb)


def split_host_s(coef, layers):
    """Host time of one pass of torch.distributed.pipelining's split backward over a chunk of
    `layers` layers: c0 + c1·L + c2·L² for coef = (c0, c1, c2) (GPUSpec zb_input_host_s,
    zb_weight_host_s; calibrate/profile.py split_host_fit). Vectorized."""
    return coef[0] + coef[1] * layers + coef[2] * layers * layers


def eager_host_wait(gpu, plan, layers, layer_fwd_s, layer_bwd_s, extra_s, num_microbatches, recomputed=0.0,
                    layer_wgrad_s=0.0):
    """(forward, backward, W pass) time per micro-batch a stage's GPU waits for its host; the
    backward's includes the W pass's. Eager PyTorch issues each kernel from Python ahead of
    the GPU and spends gpu.eager_layer_host_s on one layer's forward and backward (paraplan
    calibrate: a layer at negligible size; a third of it in the forward); the stage's
    micro-batch is the queue [layers × forward][the head, the loss and the embedding:
    `extra_s`, next to no host time][layers × backward] (host_idle_s).
    A backward layer also re-issues its forward where it is recomputed whole: `recomputed`,
    the stage's share of layers that full or first-k recomputation re-runs.
    Under the schedules that split the backward (torch.distributed.pipelining's zb, zbv,
    dualpipev), where the profile measured the split (gpu.zb_input_host_s, zb_weight_host_s),
    the backward is [layers × B][one W pass per chunk of layers/v layers], each pass's host
    time split_host_s of the chunk's layers and W's GPU time `layer_wgrad_s` per layer.
    The first micro-batch starts on an idle GPU; the rest start with what the one before left
    queued (its state after one micro-batch stands for the steady state). Megatron's fused
    layers and compiled blocks issue far fewer kernels: not bound here. Vectorized."""
    host = gpu.eager_layer_host_s
    if host <= 0.0:
        return 0.0, 0.0, 0.0
    eager = ~np.asarray(plan.fused_kernels, dtype=bool) & ~mem.compiled_blocks(plan)
    hf = HOST_FORWARD_SHARE * host
    hr = hf * np.asarray(recomputed, dtype=float)
    hb = (1.0 - HOST_FORWARD_SHARE) * host + hr
    split = np.zeros(np.shape(eager), dtype=bool)
    if any(gpu.zb_input_host_s) or any(gpu.zb_weight_host_s):
        split = np.isin(np.asarray(plan.schedule_code), [s.code for s in SPLIT_BACKWARD])
    chunks = np.asarray(plan.vp, dtype=float)
    chunk_layers = np.maximum(np.asarray(layers, dtype=float) / chunks, 1.0)
    hb_split = split_host_s(gpu.zb_input_host_s, chunk_layers) / chunk_layers + hr
    hw_split = split_host_s(gpu.zb_weight_host_s, chunk_layers)
    wg = np.asarray(layer_wgrad_s, dtype=float)

    def one_microbatch(slack):
        idle_f, slack = host_idle_s(layers, layer_fwd_s, hf, slack)
        slack = slack + extra_s
        idle_b, after_b = host_idle_s(layers, layer_bwd_s, hb, slack)
        # split: B passes issue what is left without the weight-gradient GEMMs, then W passes
        idle_bs, after_bs = host_idle_s(layers, layer_bwd_s - wg, hb_split, slack)
        idle_w, after_w = host_idle_s(chunks, chunk_layers * wg, hw_split, after_bs)
        return (idle_f, np.where(split, idle_bs, idle_b), np.where(split, idle_w, 0.0),
                np.where(split, after_w, after_b))
    f1, b1, w1, after = one_microbatch(0.0)
    f2, b2, w2, _ = one_microbatch(after)
    m = np.maximum(np.asarray(num_microbatches, dtype=float), 1.0)
    avg = lambda first, rest: np.where(eager, (first + (m - 1.0) * rest) / m, 0.0)  # noqa: E731
    w = avg(w1, w2)
    return avg(f1, f2), avg(b1, b2) + w, w

