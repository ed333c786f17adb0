"""PyTorch's CUDA caching allocator: what `torch.cuda.max_memory_allocated` and
`torch.cuda.max_memory_reserved` report for a step whose live tensors the cost model counts.

Source: pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp (constants kMinBlockSize,
kSmallSize, kSmallBuffer, kMinLargeAlloc, kLargeBuffer, kRoundLarge; round_size,
get_allocation_size; ExpandableSegment) and the "CUDA memory management" notes of the torch
docs (expandable_segments).

- Allocated: every tensor is a block of a multiple of 512 B (round_size). Peak allocated is
  the largest sum of live blocks: the cost model's tensors (MemoryBreakdown without its
  fragmentation and runtime parts); the 512-B rounding is below a part in 10^4 of a training
  step's tensors, so the sum is taken as is.
- Reserved: blocks are carved from segments obtained with cudaMalloc. A request of at most
  1 MiB comes from a 2-MiB small-pool segment; up to 10 MiB from a 20-MiB segment; larger ones
  get their own segment rounded up to 2 MiB (get_allocation_size). A freed block stays cached
  in its segment for later requests of the same stream; a request no cached block fits opens a
  new segment, so reserved exceeds allocated by the cached blocks too small or on the wrong
  stream: fragmentation. With expandable segments (PYTORCH_CUDA_ALLOC_CONF=
  expandable_segments:True) each stream's pool is one virtual range that maps physical pages
  of 20 MiB (2 MiB in the small pool) at its end as it grows, so a request no free block fits
  extends the range instead of opening a segment, and reserved is allocated rounded up to
  whole pages.
- Neither counts the CUDA context, NCCL's own buffers (cudaMalloc'd by NCCL, not by torch) or
  cuDNN/cuBLAS handles outside the allocator: GPUSpec.reserved_bytes, which nvidia-smi and an
  out-of-memory error see but torch's counters do not.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from ..units import MIB
from .breakdown import MemoryBreakdown

MIN_BLOCK_BYTES = 512             # kMinBlockSize: every allocation a multiple of this
SMALL_SIZE_BYTES = 1 * MIB        # kSmallSize: the largest request served by the small pool
SMALL_BUFFER_BYTES = 2 * MIB      # kSmallBuffer: a small-pool segment (and expandable page)
MIN_LARGE_ALLOC_BYTES = 10 * MIB  # kMinLargeAlloc: below it a large request gets a 20-MiB segment
LARGE_BUFFER_BYTES = 20 * MIB     # kLargeBuffer: that segment (and a large-pool expandable page)
ROUND_LARGE_BYTES = 2 * MIB       # kRoundLarge: larger requests round up to a multiple of this


class MemoryStat(StrEnum):
    """Which of torch's peak counters a measurement reports."""

    ALLOCATED = "allocated"  # torch.cuda.max_memory_allocated: live tensors' blocks
    RESERVED = "reserved"    # torch.cuda.max_memory_reserved: the allocator's segments


def _round_up(x, multiple: float):
    return np.ceil(np.asarray(x, dtype=float) / multiple) * multiple


def block_bytes(request_bytes):
    """The block a tensor of `request_bytes` occupies (round_size: a multiple of 512 B, at
    least 512 B). Vectorized."""
    return np.maximum(_round_up(request_bytes, MIN_BLOCK_BYTES), MIN_BLOCK_BYTES)


def segment_bytes(request_bytes, expandable: bool = False):
    """The memory cudaMalloc'd when no cached block fits a request (get_allocation_size): a
    2-MiB segment for at most 1 MiB, 20 MiB below 10 MiB, else the block rounded up to 2 MiB.
    With expandable segments the pool grows by whole pages of 2 MiB (small) or 20 MiB (large)
    instead. Vectorized."""
    size = block_bytes(request_bytes)
    small = size <= SMALL_SIZE_BYTES
    if expandable:
        return np.where(small, _round_up(size, SMALL_BUFFER_BYTES), _round_up(size, LARGE_BUFFER_BYTES))
    return np.where(small, SMALL_BUFFER_BYTES,
                    np.where(size < MIN_LARGE_ALLOC_BYTES, LARGE_BUFFER_BYTES, _round_up(size, ROUND_LARGE_BYTES)))


def allocated_bytes(memory: MemoryBreakdown):
    """Peak allocated: the tensors the cost model holds alive at the stage's worst moment
    (its breakdown without the allocator's fragmentation and the runtime outside torch)."""
    return memory.total - memory.fragmentation_bytes - memory.reserved_bytes


def reserved_bytes(allocated, *, fragmentation_share, expandable: bool, streams: int = 1):
    """Peak reserved for a peak of `allocated` bytes. Without expandable segments the cached
    blocks no request fits add `fragmentation_share` of allocated (GPUSpec.allocator_fragmentation);
    with them the pools' virtual ranges round up to whole 20-MiB pages (one partly used page per
    stream's large pool and one 2-MiB page in its small pool). Vectorized."""
    allocated = np.asarray(allocated, dtype=float)
    if expandable:
        return allocated + streams * (LARGE_BUFFER_BYTES + SMALL_BUFFER_BYTES)
    return allocated * (1.0 + fragmentation_share)


def peak_bytes(memory: MemoryBreakdown, stat: MemoryStat, *, fragmentation_share: float, expandable: bool):
    """What torch's `stat` counter reads at the step's peak, per the breakdown."""
    alloc = allocated_bytes(memory)
    if MemoryStat(stat) is MemoryStat.ALLOCATED:
        return alloc
    return reserved_bytes(alloc, fragmentation_share=fragmentation_share, expandable=expandable)
