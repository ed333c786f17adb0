"""What a run measures on each rank: step times, peak memory, loss and gradient norm.

Step time is wall-clock from the first forward to the end of the optimizer step (device
synchronized at both ends); the gradient norm, used only to check a run against a single
process, is computed outside it. Peak memory is `torch.cuda.max_memory_allocated` on a GPU,
and on a CPU the peak resident set size above the RSS the process had before it built its
model (torch, the process group and Python itself are not the run's memory).
"""

from __future__ import annotations

import resource
import time

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ..units import KIB
from .report import CPU_MEMORY_KIND, GPU_MEMORY_KIND


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now_s(device: torch.device) -> float:
    sync(device)
    return time.perf_counter()


def peak_rss_bytes() -> int:
    """High-water resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * KIB)


def peak_memory_bytes(device: torch.device, baseline_rss_bytes: int) -> tuple[int, str]:
    """(peak bytes, what was measured)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), GPU_MEMORY_KIND
    return peak_rss_bytes() - baseline_rss_bytes, CPU_MEMORY_KIND


def grad_norm(params: list[torch.nn.Parameter], pp_group) -> float:
    """L2 norm of all gradients of the model, whatever the sharding: DTensor norms reduce
    over their mesh; pipeline stages add their squares over the pipeline group."""
    sq = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is None:
            continue
        n = torch.linalg.vector_norm(p.grad.float())
        if isinstance(n, DTensor):
            n = n.full_tensor()
        sq += n.detach().to("cpu", torch.float64) ** 2
    if pp_group is not None:
        dev = next(iter(params)).device if params else torch.device("cpu")
        t = sq.to(dev) if dev.type == "cuda" else sq
        dist.all_reduce(t, group=pp_group)
        sq = t.cpu()
    return float(sq.sqrt())

