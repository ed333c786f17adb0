"""Microbenchmarks on the local device with torch: GEMMs across shapes, causal attention,
copies (device memory, host<->device), the launch overhead of a tiny kernel,
collectives across local ranks by message size (gloo on CPU, NCCL on GPUs), and how much
a collective in flight slows concurrent GEMMs.

With `ranks` > 1 the ranks are separate processes started together, as `paraplan run`
(torchrun) starts them: each computes with its share of the CPU threads while the others
do the same, so the compute numbers include that contention; then they run the
collectives. Timings are medians over repeats after a warm-up.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..specs.hardware import device_architecture
from .measurements import (AttentionSample, CollectiveSample, CopySample, ElementwiseSample, GemmSample,
                           HostLayerSample, LossSample, ScatterSample, SplitBackwardSample,
                           Measurements, OptimizerSample, OverlapSample, TP_LAYER_HEAD_DIM, TPLayerSample,
                           tp_layer_spec)

KIB, MIB = 1024, 1024 * 1024
# GEMM rounds: each shape timed for about this long per round, in at most this many calls
GEMM_ROUND_S, GEMM_ROUND_MAX_CALLS = 5e-3, 50


def _sizes(device: str, quick: bool) -> dict:
    """What to measure: CPU sizes stay small (seconds, not minutes, on a shared machine)."""
    if device == "cpu":
        squares = (64, 128, 256, 512, 1024) if quick else (64, 128, 256, 384, 512, 768, 1024, 1536, 2048)
        rects = ((2048, 256, 256), (512, 1024, 256), (256, 2048, 512)) if quick else (
            (2048, 256, 256), (512, 1024, 256), (256, 2048, 512), (1024, 2816, 256), (4096, 512, 512), (1024, 1024, 2048))
        att = [(1, 4, s, 64) for s in ((128, 256, 512) if quick else (128, 256, 512, 1024, 2048))]
        copies = (16 * MIB,) if quick else (4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
        coll = [4 * KIB * 4 ** i for i in range(6 if quick else 8)]  # 4 KiB .. 4 MiB (64 MiB)
    else:
        squares = (256, 512, 1024, 2048, 4096) if quick else (128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288)
        rects = ((8192, 1024, 1024), (4096, 4096, 1024), (16384, 8192, 4096)) if quick else (
            (8192, 1024, 1024), (4096, 4096, 1024), (16384, 8192, 4096), (2048, 28672, 4096), (8192, 4096, 14336),
            (32768, 8192, 8192), (65536, 8192, 8192))
        att = [(b, 32, s, 128) for b, s in ((4, 512), (2, 1024), (1, 2048), (1, 4096), (1, 8192))[: 3 if quick else 5]]
        copies = (64 * MIB, 512 * MIB) if quick else (16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB)
        coll = [4 * KIB * 4 ** i for i in range(8 if quick else 11)]
    # a layer's element-wise kernels: (tokens, hidden), past the caches on a CPU
    ew = ((512, 512) if quick else (1024, 1024)) if device == "cpu" else ((4096, 4096) if quick else (8192, 4096))
    # the optimizer step: (tensors, elements each), weight matrices of a small and a large model
    opt = (8, 1 << 20) if device == "cpu" else (8, 1 << 24)
    return {"gemm": [(n, n, n) for n in squares] + list(rects), "attention": att, "copies": copies,
            "collectives": coll, "overlap_bytes": 16 * MIB if device == "cpu" else 256 * MIB, "elementwise": ew,
            "optimizer": opt}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, device, *, warmup: int = 2, min_repeats: int = 3, min_time_s: float = 0.05,
                 calls: int = 1) -> float:
    """Median time of one call; each sample times `calls` calls issued back to back with one
    synchronization after them (_back_to_back_calls), as a training step queues its kernels."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < min_repeats or time.perf_counter() - start < min_time_s:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        times.append((time.perf_counter() - t0) / calls)
        if len(times) >= 200:
            break
    return statistics.median(times)


def _gpu_calls(fn, device) -> int:
    """Back-to-back calls per sample on a GPU; one on a CPU, which runs each call to its end
    anyway (and where every rank then makes the same number)."""
    return _back_to_back_calls(fn, device) if device.type == "cuda" else 1


def _back_to_back_calls(fn, device, round_s: float = GEMM_ROUND_S) -> int:
    """How many calls of `fn` to issue back to back per timed sample: about `round_s` of
    them, at most GEMM_ROUND_MAX_CALLS. A kernel timed alone would carry the host's
    synchronization round trip (about 15 us on an H100 host, more than a 2048^3 GEMM's
    fixed costs), which a training step, queueing kernels ahead of the GPU, does not pay."""
    fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return max(1, min(GEMM_ROUND_MAX_CALLS, int(round_s / max(time.perf_counter() - t0, 1e-7))))


def _launch_overhead_s(device) -> float:
    x = torch.zeros(1, device=device)
    n = 200

    def many():
        for _ in range(n):
            x.add_(1.0)
    return _median_time(many, device, min_repeats=5) / n


def _gemms(device, dtype, shapes, quick) -> list[GemmSample]:
    """Every shape once per round (about 5 ms of calls issued back to back, one
    synchronization after them: _back_to_back_calls), rounds until the time budget is spent
    (at least 5), and the median per shape over its rounds: a slow spell on a shared machine
    then touches every shape a little, not one shape wholly."""
    ops = []
    for m, n, k in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        fn = (lambda a=a, b=b: torch.matmul(a, b))
        ops.append(((m, n, k), fn, _back_to_back_calls(fn, device)))
    budget = (0.05 if quick else 0.2) * len(ops)
    times: list[list[float]] = [[] for _ in ops]
    start, rounds = time.perf_counter(), 0
    while rounds < 5 or (time.perf_counter() - start < budget and rounds < 200):
        for i, (_, fn, reps) in enumerate(ops):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            _sync(device)
            times[i].append((time.perf_counter() - t0) / reps)
        rounds += 1
    return [GemmSample(m=m, n=n, k=k, dtype=str(dtype).removeprefix("torch."), time_s=statistics.median(times[i]))
            for i, ((m, n, k), _, _) in enumerate(ops)]


def _attention(device, dtype, shapes, quick) -> list[AttentionSample]:
    """Each shape on every fused SDPA backend this device runs, under the kernel name the
    cost model prices it by (run/attention.py); a backend that refuses the device or shape
    is skipped."""
    from torch.nn.attention import sdpa_kernel

    from ..run.attention import CALIBRATED_BACKENDS
    out = []
    for b, h, s, d in shapes:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        grad = torch.randn(b, h, s, d, device=device, dtype=dtype)

        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwd_bwd():
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
        for kernel, backends in CALIBRATED_BACKENDS:
            for backend in backends:
                with sdpa_kernel(backend), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # torch warns of each backend it cannot use before it raises
                    try:
                        fwd_bwd()
                    except RuntimeError:  # "No available kernel": not on this device, dtype or shape
                        continue
                    t_f = _median_time(fwd, device, min_time_s=0.05 if quick else 0.2,
                                       calls=_back_to_back_calls(fwd, device))
                    t_fb = _median_time(fwd_bwd, device, min_time_s=0.05 if quick else 0.2,
                                        calls=_back_to_back_calls(fwd_bwd, device))
                out.append(AttentionSample(batch=b, heads=h, seq=s, head_dim=d,
                                           dtype=str(dtype).removeprefix("torch."), fwd_time_s=t_f,
                                           bwd_time_s=max(t_fb - t_f, t_f), kernel=kernel.value))
                break
    return out


def _scatter(device, dtype) -> ScatterSample:
    """index_add_ of token copies back onto their tokens (top-8 routing: each token hit 8
    times, in expert order), as an eager MoE combines its experts' outputs."""
    tokens, hidden, k = (512, 256, 8) if device.type == "cpu" else (4096, 2048, 8)
    gen = torch.Generator().manual_seed(0)
    idx = torch.arange(tokens).repeat_interleave(k)[torch.randperm(tokens * k, generator=gen)].to(device)
    src = torch.randn(tokens * k, hidden, device=device, dtype=dtype)
    out = torch.zeros(tokens, hidden, device=device, dtype=dtype)
    fn = (lambda: out.index_add_(0, idx, src))
    t = _median_time(fn, device, min_time_s=0.05, calls=_back_to_back_calls(fn, device))
    return ScatterSample(rows=tokens * k, tokens=tokens, hidden=hidden, dtype=str(dtype).removeprefix("torch."),
                         time_s=t)


def _loss(device, dtype) -> LossSample:
    """F.cross_entropy over upcast logits (run/model.py loss_fn), forward and backward."""
    tokens, vocab = (512, 2048) if device.type == "cpu" else (8192, 32768)
    logits = torch.randn(tokens, vocab, device=device, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,), device=device)

    def fwd():
        with torch.no_grad():
            F.cross_entropy(logits.float(), labels)

    def fwd_bwd():
        F.cross_entropy(logits.float(), labels).backward()
        logits.grad = None
    t_f = _median_time(fwd, device, min_time_s=0.1)
    t_fb = _median_time(fwd_bwd, device, min_time_s=0.1)
    return LossSample(tokens=tokens, vocab=vocab, dtype=str(dtype).removeprefix("torch."), fwd_time_s=t_f,
                      bwd_time_s=max(t_fb - t_f, t_f))


def _misaligned_gemm(device, dtype, quick) -> tuple[GemmSample, ...]:
    """An LM head's GEMM, tokens × hidden by hidden × vocabulary, with a vocabulary whose rows
    are a multiple of 16 bytes and with the 50,257 of GPT-2's tokenizer (not one)."""
    tokens, hidden = (256, 256) if device.type == "cpu" else (4096, 4096)
    out = []
    for vocab in (50264, 50257):
        a = torch.randn(tokens, hidden, device=device, dtype=dtype)
        b = torch.randn(hidden, vocab, device=device, dtype=dtype)
        t = _median_time(lambda: a @ b, device, min_time_s=0.05 if quick else 0.2)
        out.append(GemmSample(m=tokens, n=vocab, k=hidden, dtype=str(dtype).removeprefix("torch."), time_s=t))
    return tuple(out)


def _copies(device, sizes) -> list[CopySample]:
    out = []
    for nbytes in sizes:
        src = torch.empty(nbytes, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        out.append(CopySample(kind="device", num_bytes=nbytes, time_s=_median_time(lambda: dst.copy_(src), device)))
        if device.type == "cuda":
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            out.append(CopySample(kind="h2d", num_bytes=nbytes,
                                  time_s=_median_time(lambda: src.copy_(host, non_blocking=True), device)))
            out.append(CopySample(kind="d2h", num_bytes=nbytes,
                                  time_s=_median_time(lambda: host.copy_(src, non_blocking=True), device)))
    return out


def _elementwise(device, dtype, tokens: int, hidden: int) -> ElementwiseSample:
    """A Llama layer's forward element-wise kernels (the ones cost/evaluate.py counts), as
    eager PyTorch runs them: RMS norm, RoPE on q and k, residual add, RMS norm, SiLU(gate)·up,
    residual add. GQA with a quarter of the heads for K/V, the MLP 3.5× wide (Llama 3)."""
    d = 128
    heads, kv_heads, ffn = hidden // d, max(hidden // d // 4, 1), 7 * hidden // 2
    w = torch.ones(hidden, device=device, dtype=dtype)
    x, r = (torch.randn(tokens, hidden, device=device, dtype=dtype) for _ in range(2))
    q = torch.randn(tokens, heads, d, device=device, dtype=dtype)
    k = torch.randn(tokens, kv_heads, d, device=device, dtype=dtype)
    cos, sin = (torch.randn(tokens, 1, d, device=device, dtype=dtype) for _ in range(2))
    gate, up = (torch.randn(tokens, ffn, device=device, dtype=dtype) for _ in range(2))

    def rope(t):
        a, b = t.chunk(2, dim=-1)
        return t * cos + torch.cat((-b, a), dim=-1) * sin

    def layer():  # every result returned: a compiler would drop unused ones
        z = r + F.rms_norm(x, (hidden,), w)
        return rope(q), rope(k), F.silu(gate) * up, z + F.rms_norm(z, (hidden,), w)
    # back to back on a GPU (one synchronization per ~5 ms of calls); the same count on every rank
    t = _median_time(layer, device, min_repeats=9, min_time_s=0.0, calls=_gpu_calls(layer, device))
    return ElementwiseSample(tokens=tokens, hidden=hidden, ffn=ffn, q_dim=heads * d, kv_dim=kv_heads * d, head_dim=d,
                             time_s=t, compiled_time_s=_compiled_time_s(layer, device))


def _compiled_time_s(fn, device) -> float | None:
    """`fn` under torch.compile (inductor, as torchtitan compiles each block), on a GPU; None on
    a CPU (inductor there needs a C++ toolchain and minutes) or where compiling fails."""
    if device.type != "cuda":
        return None
    try:
        compiled = torch.compile(fn)
        compiled()  # compiles
        return _median_time(compiled, device, min_repeats=9, min_time_s=0.0, calls=_gpu_calls(compiled, device))
    except Exception:  # noqa: BLE001 - no compiler, an unsupported op: the profile leaves it out
        return None


def _optimizer(device, tensors: int, numel: int) -> OptimizerSample:
    """An AdamW step as `paraplan run` takes it (run/worker.py: no weight decay, torch's
    default implementation: one tensor at a time on a CPU, multi-tensor on a GPU)."""
    params = [torch.nn.Parameter(torch.randn(numel, device=device)) for _ in range(tensors)]
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)
    t = _median_time(opt.step, device, min_repeats=7, min_time_s=0.0)  # the same count on every rank
    return OptimizerSample(params=tensors * numel, tensors=tensors, time_s=t)


def _collectives(device, sizes, world: int, rank: int, rounds: int = 15) -> list[CollectiveSample]:
    """Every collective at every size once per round, `rounds` rounds, and the median per
    (collective, size): a burst of other work on a shared machine then lands on one sample of
    many sizes, not on every sample of one size (seven repeats in a row gave times 3-6x apart
    between calibrations for the same small message here). Every rank makes the same calls
    in the same order: a fixed count, not a time budget."""
    # (torch 2.13 names them *_single and deprecates the *_tensor names)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    calls = []  # (op, bytes, the call, time divisor)
    for nbytes in sizes:
        n = max(nbytes // 4, world)
        buf = torch.ones(n, dtype=torch.float32, device=device)
        # the tensor forms FSDP2 and DTensor call, each on a full buffer of the same bytes
        part = torch.ones(n // world, dtype=torch.float32, device=device)
        full = torch.empty(n // world * world, dtype=torch.float32, device=device)

        def ping(buf=buf):  # rank 0 <-> rank 1, one message each way; half the round trip
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
        calls += [("all_reduce", 4 * n, lambda buf=buf: dist.all_reduce(buf), 1.0),
                  ("all_gather", 4 * full.numel(), lambda full=full, part=part: gather(full, part), 1.0),
                  ("reduce_scatter", 4 * full.numel(), lambda full=full, part=part: scatter(part, full), 1.0),
                  ("send_recv", 4 * n, ping, 2.0)]
    for _, _, call, _ in calls:  # warm-up: buffers, connections
        call()
    times: dict[int, list[float]] = {i: [] for i in range(len(calls))}
    for _ in range(rounds):
        dist.barrier()
        for i, (_, _, call, div) in enumerate(calls):
            _sync(device)
            t0 = time.perf_counter()
            call()
            _sync(device)
            times[i].append((time.perf_counter() - t0) / div)
    dist.barrier()
    return [CollectiveSample(op=op, world=world, num_bytes=nbytes, time_s=statistics.median(times[i]))
            for i, (op, nbytes, _, _) in enumerate(calls)]


def _interleaved_medians(steps, device, rounds: int, before=None) -> list[float]:
    """Median time of each of `steps` (each call timed alone, synchronized), over `rounds`
    rounds that call them in turn, so that a slow spell touches each a little; `before`
    (e.g. a barrier) runs before each call."""
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for i, step in enumerate(steps):
            if before is not None:
                before()
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def _tp_layers(device, world: int, rounds: int = 9) -> TPLayerSample:
    """paraplan run's own transformer layers (run/model.py) at a size where their math is
    negligible, forward and backward of one micro-batch, 1 and 3 layers: tensor-parallel over
    every rank with sequence parallelism (run/tensor_parallel.py: DTensor) and, in turn, a
    replica on each rank with no communication. Rounds interleave the four, and every rank
    makes the same calls: the medians' per-layer differences are what tensor parallelism
    costs a layer beyond its transfers' size, as `paraplan run` executes it."""
    from torch.distributed.device_mesh import init_device_mesh

    from ..run.model import Transformer
    from ..run.tensor_parallel import apply_tensor_parallel
    batch, seq = 1, 8 * world
    hidden = 2 * world * TP_LAYER_HEAD_DIM  # 2·world heads, world K/V heads: TP over world divides both
    spec = tp_layer_spec(hidden, num_layers=3)
    mesh = init_device_mesh(device.type, (world,))
    cases = []
    for layers in (1, 3):
        for tp in (True, False):
            torch.manual_seed(0)
            model = Transformer(spec, seq, layer_ids=range(layers), first=False, last=False).to(device)
            if tp:
                apply_tensor_parallel(model, mesh, sequence_parallel=True)
            x = torch.randn(batch, seq // world if tp else seq, hidden, device=device, requires_grad=True)

            def step(model=model, x=x):
                model(x).sum().backward()
            step()
            cases.append(step)
    tp1, plain1, tp3, plain3 = _interleaved_medians(cases, device, rounds, before=dist.barrier)
    return TPLayerSample(world=world, tokens=batch * seq, hidden=hidden, bytes_per_element=4, tp_1_layer_s=tp1,
                         tp_3_layers_s=tp3, plain_1_layer_s=plain1, plain_3_layers_s=plain3)


def _host_layers(device, rounds: int = 9) -> HostLayerSample:
    """paraplan run's layer (run/model.py) at negligible size on a GPU, forward + backward of
    1 and of 3 layers under bf16 autocast (fp32 parameters, as a one-GPU run): each kernel
    takes the GPU a few microseconds, so the time is the host's -- Python, the dispatcher,
    autograd and autocast issuing the layer's kernels. Rounds interleave the two."""
    from ..run.model import Transformer
    batch, seq, hidden = 1, 16, 2 * TP_LAYER_HEAD_DIM
    spec = tp_layer_spec(hidden, num_layers=3)
    steps = []
    for layers in (1, 3):
        torch.manual_seed(0)
        model = Transformer(spec, seq, layer_ids=range(layers), first=False, last=False).to(device)
        x = torch.randn(batch, seq, hidden, device=device, requires_grad=True)

        def step(model=model, x=x):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                y = model(x)
            y.float().sum().backward()
        step()
        steps.append(step)
    one, three = _interleaved_medians(steps, device, rounds)
    return HostLayerSample(tokens=batch * seq, hidden=hidden, one_layer_s=one, three_layers_s=three)


# layer counts of the split-backward samples: its host time is quadratic in them (profile.py
# split_host_fit); 16 layers' W pass took 118 ms on an H100's host (calibration/h100_zb_split/split2)
SPLIT_BACKWARD_LAYERS = (1, 2, 4, 8, 16)


def _split_backward(device, rounds: int = 7) -> tuple[SplitBackwardSample, ...]:
    """torch.distributed.pipelining's split backward (the zero-bubble schedules' B and W
    passes: `stage_backward_input`, then `stage_backward_weight`) of 1 to 16 of paraplan
    run's layers at negligible size on a GPU, after an untimed forward under bf16 autocast
    (fp32 parameters), with the whole backward beside them: the times are the host's. W runs
    one autograd.grad per weight group, each walking the graph below it, so its time grows
    with the layers twice over. Rounds interleave the counts."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    from ..run.model import Transformer
    batch, seq, hidden = 1, 16, 2 * TP_LAYER_HEAD_DIM
    spec = tp_layer_spec(hidden, num_layers=max(SPLIT_BACKWARD_LAYERS))
    models = []
    for layers in SPLIT_BACKWARD_LAYERS:
        torch.manual_seed(0)
        models.append(Transformer(spec, seq, layer_ids=range(layers), first=False, last=False).to(device))
    x0 = torch.randn(batch, seq, hidden, device=device)
    dy = torch.randn(batch, seq, hidden, device=device)

    def forward(model):
        x = x0.detach().requires_grad_(True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return x, model(x)

    def timed(fn):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        return time.perf_counter() - t0, out

    times = [([], [], []) for _ in models]
    for r in range(rounds + 1):  # the first round warms up
        for model, (full, inp, wgt) in zip(models, times):
            params = list(model.parameters())
            x, y = forward(model)
            g = dy.to(y.dtype)
            t_full, _ = timed(lambda: torch.autograd.backward(y, g))
            x, y = forward(model)
            t_in, (_, groups) = timed(lambda: stage_backward_input([y], [g], [x], iter(params)))
            t_w, _ = timed(lambda: stage_backward_weight(iter(params), groups))
            for p in params:
                p.grad = None
            if r:
                full.append(t_full), inp.append(t_in), wgt.append(t_w)
    med = statistics.median
    return tuple(SplitBackwardSample(layers=n, backward_s=med(f), input_s=med(i), weight_s=med(w))
                 for n, (f, i, w) in zip(SPLIT_BACKWARD_LAYERS, times))


def _overlap(device, dtype, nbytes: int) -> OverlapSample:
    """How much a collective in flight slows compute: on a GPU NCCL takes some SMs; on a CPU
    gloo's threads take the cores the GEMMs run on. Every rank runs the same sequence."""
    reps = 11
    buf = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    comm = _median_time(lambda: dist.all_reduce(buf), device, min_repeats=reps, min_time_s=0.0)
    # GEMMs small enough that the loop's length is set finely: one 1024³ GEMM on a CPU core
    # outlasted the collective five times over, and its own jitter swamped the difference
    n = 256 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    one = _median_time(lambda: torch.matmul(a, a), device, min_repeats=reps, min_time_s=0.0)
    # the GEMM loop lasts about 1.5× the collective (rank 0's count, so all ranks agree)
    count = torch.tensor([max(1, round(1.5 * comm / one))], device=device)
    dist.broadcast(count, 0)
    k = int(count.item())

    def gemms():
        for _ in range(k):
            torch.matmul(a, a)

    def both():
        work = dist.all_reduce(buf, async_op=True)
        gemms()
        work.wait()
    compute = _median_time(gemms, device, min_repeats=reps, min_time_s=0.0)
    dist.barrier()
    together = _median_time(both, device, min_repeats=reps, min_time_s=0.0)
    dist.barrier()
    return OverlapSample(num_bytes=4.0 * buf.numel(), compute_s=compute, comm_s=comm, both_s=together)


def _memory(device, ranks: int) -> tuple[float, float]:
    """(usable bytes per rank, bytes taken before any tensor)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return float(total), float(total - free)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    rss = 0.0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                rss = float(line.split()[1]) * 1024
    return float(total) / ranks, rss


def _host_memory_bytes() -> float:
    """The machine's DRAM, or the container's memory limit (cgroup v2 memory.max) if lower."""
    total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    try:
        with open("/sys/fs/cgroup/memory.max") as fh:
            limit = fh.read().strip()
        if limit.isdigit():
            total = min(total, float(limit))
    except OSError:
        pass
    return total


def _device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"cpu ({os.cpu_count()} cores)"


def _architecture(device) -> str:
    """The device's GPUSpec.architecture, from its compute capability or ROCm gfx name."""
    if device.type != "cuda":
        return ""
    props = torch.cuda.get_device_properties(device)
    return device_architecture(torch.cuda.get_device_capability(device),
                               getattr(props, "gcnArchName", "") if torch.version.hip else "")


def measure_rank(device_type: str, rank: int, ranks: int, quick: bool) -> Measurements:
    """Every benchmark on this rank (the process group, if any, is already up)."""
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    threads = max(1, (os.cpu_count() or 1) // ranks) if device.type == "cpu" else torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(threads)
    memory, reserved = _memory(device, ranks)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    sizes = _sizes(device.type, quick)
    torch.manual_seed(rank)
    launch = _launch_overhead_s(device)
    gemm = _gemms(device, dtype, sizes["gemm"], quick)
    att = _attention(device, dtype, sizes["attention"], quick)
    misaligned = _misaligned_gemm(device, dtype, quick)
    copies = _copies(device, sizes["copies"])
    if ranks > 1:  # every rank at once, as in a run: they share the cores and the memory bus
        dist.barrier()
    elementwise = _elementwise(device, dtype, *sizes["elementwise"])
    if ranks > 1:
        dist.barrier()
    loss = _loss(device, dtype)
    scatter = _scatter(device, dtype)
    if ranks > 1:
        dist.barrier()
    optimizer = _optimizer(device, *sizes["optimizer"])
    coll, overlap, tp_layer = [], None, None
    if ranks > 1:
        dist.barrier()
        coll = _collectives(device, sizes["collectives"], ranks, rank)
        overlap = _overlap(device, dtype, sizes["overlap_bytes"])
        tp_layer = _tp_layers(device, ranks) if device.type == "cpu" else None
    host_layer = _host_layers(device) if device.type == "cuda" else None
    split = _split_backward(device) if device.type == "cuda" else ()
    return Measurements(device_type=device.type, device_name=_device_name(device), ranks=ranks, threads_per_rank=threads,
                        compute_dtype=str(dtype).removeprefix("torch."), memory_bytes=memory, reserved_bytes=reserved,
                        launch_overhead_s=launch, gemm=tuple(gemm), attention=tuple(att), copies=tuple(copies),
                        collectives=tuple(coll), backend=("nccl" if device.type == "cuda" else "gloo") if ranks > 1 else "",
                        torch_version=torch.__version__, architecture=_architecture(device),
                        load_average=os.getloadavg()[0], cpu_count=os.cpu_count() or 0,
                        overlap=overlap, host_memory_bytes=_host_memory_bytes(), elementwise=elementwise,
                        optimizer=optimizer, tp_layer=tp_layer, misaligned_gemm=misaligned, loss=loss,
                        host_layer=host_layer, scatter=scatter, split_backward=split,
                        device_count=torch.cuda.device_count() if device.type == "cuda" else 0)


def _worker(rank: int, device_type: str, ranks: int, quick: bool, store_path: str, out_path: str) -> None:
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=ranks)
    try:
        m = measure_rank(device_type, rank, ranks, quick)
        if rank == 0:
            Path(out_path).write_text(m.to_json())
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure(device_type: str = "auto", ranks: int = 1, quick: bool = False) -> Measurements:
    """Run the benchmarks on `ranks` local ranks of this machine's CPU or GPUs."""
    from ..errors import SpecError
    if device_type == "auto":
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda" and not torch.cuda.is_available():
        raise SpecError("calibrate", "device", "cuda", "torch sees no GPU here; allowed: cpu, auto")
    if ranks < 1:
        raise SpecError("calibrate", "--ranks", ranks, "a whole number >= 1 is required")
    if device_type == "cuda" and ranks > torch.cuda.device_count():
        raise SpecError("calibrate", "--ranks", ranks, f"at most the {torch.cuda.device_count()} GPUs torch sees")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if device_type == "cpu" and ranks > 4 * cores:
        raise SpecError("calibrate", "--ranks", ranks, f"at most {4 * cores} on this machine's {cores} usable CPU "
                                                       "cores (4 processes per core; past that they measure the "
                                                       "scheduler, not the device)")
    if ranks == 1:
        return measure_rank(device_type, 0, 1, quick)
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory(prefix="paraplan-calibrate-") as tmp:
        out = os.path.join(tmp, "rank0.json")
        mp.spawn(_worker, args=(device_type, ranks, quick, os.path.join(tmp, "store"), out), nprocs=ranks, join=True)
        return Measurements.from_json(Path(out).read_text())
