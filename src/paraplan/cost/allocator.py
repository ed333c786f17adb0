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

import bisect
import math
from dataclasses import dataclass
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


def peak_bytes(memory: MemoryBreakdown, stat: MemoryStat):
    """What torch's `stat` counter reads at the step's peak, per the breakdown: the live
    tensors, plus for reserved the breakdown's fragmentation (the replayed allocator's, in an
    Estimate: cost/lifetimes.py)."""
    alloc = allocated_bytes(memory)
    return alloc if MemoryStat(stat) is MemoryStat.ALLOCATED else alloc + memory.fragmentation_bytes


# ---- the caching allocator replayed over a step's tensor lifetimes (cost/lifetimes.py) ----
#
# Fragmentation from lifetimes (MindSpore's memory-offset solver frames the same problem: where
# each tensor of known size and lifetime sits in one address range). The replay follows
# CUDACachingAllocator's large pool: a request takes the smallest cached free block it fits
# (get_free_block, best fit by size then address), split when what is left exceeds kSmallSize
# (should_split); a freed block merges with free neighbours of its segment (free_block,
# try_merge_blocks); a request no free block fits opens a new segment (alloc_block,
# get_allocation_size), or with expandable segments maps pages at the end of the one range,
# taking in a free block at its end (ExpandableSegment::map). Reserved never shrinks within a
# step (no empty_cache), except that a segment opening that would pass `capacity_bytes` first
# releases every wholly free segment, as torch does before it reports out of memory
# (release_cached_blocks).


@dataclass(frozen=True, kw_only=True)
class AllocatorPeaks:
    """Peak allocated and reserved bytes of a replayed step."""

    allocated_bytes: float
    reserved_bytes: float

    @property
    def fragmentation_bytes(self) -> float:
        """Reserved beyond allocated at their peaks: what the cached blocks cost."""
        return max(self.reserved_bytes - self.allocated_bytes, 0.0)


@dataclass(eq=False, slots=True)
class _Block:
    """A block of a segment, linked to its address neighbours."""

    segment: int
    offset: float
    size: float
    free: bool = True
    prev: "_Block | None" = None
    next: "_Block | None" = None

    def key(self) -> tuple:
        return (self.size, self.segment, self.offset)


class _Pool:
    """One stream's large pool: segments of linked blocks, and the free blocks sorted by
    (size, segment, address) for best fit."""

    def __init__(self, expandable: bool, capacity_bytes: float):
        self.expandable, self.capacity = expandable, capacity_bytes
        self.free_keys: list[tuple] = []
        self.free_blocks: dict[tuple, _Block] = {}
        self.tails: list[_Block] = []  # each segment's last block
        self.reserved = 0.0            # bytes of its segments (cudaMalloc'd or mapped)

    def malloc(self, request_bytes: float) -> _Block:
        size = max(math.ceil(request_bytes / MIN_BLOCK_BYTES), 1) * MIN_BLOCK_BYTES  # block_bytes, a scalar
        i = bisect.bisect_left(self.free_keys, (size, -1, -1.0))
        block = self.free_blocks[self.free_keys[i]] if i < len(self.free_keys) else self._grow(size)
        self._unlist(block)
        if block.size - size > SMALL_SIZE_BYTES:  # should_split: the rest stays cached
            rest = _Block(block.segment, block.offset + size, block.size - size, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            elif self.tails[block.segment] is block:
                self.tails[block.segment] = rest
            block.next, block.size = rest, size
            self._list(rest)
        block.free = False
        return block

    def release(self, block: _Block) -> None:
        block.free = True
        for other in (block.next, block.prev):
            if other is not None and other.free:
                self._unlist(other)
                block = self._merged(block, other)
        self._list(block)

    def _merged(self, block: _Block, other: _Block) -> _Block:
        """`block` and its free neighbour `other` as one block (the lower address keeps it)."""
        low, high = (block, other) if block.offset < other.offset else (other, block)
        low.size += high.size
        low.next = high.next
        if high.next is not None:
            high.next.prev = low
        if self.tails[high.segment] is high:
            self.tails[high.segment] = low
        return low

    def _list(self, block: _Block) -> None:
        key = block.key()
        bisect.insort(self.free_keys, key)
        self.free_blocks[key] = block

    def _unlist(self, block: _Block) -> None:
        key = block.key()
        if self.free_blocks.pop(key, None) is not None:
            del self.free_keys[bisect.bisect_left(self.free_keys, key)]

    def _grow(self, size: float) -> _Block:
        """A block of at least `size` past every free one: a new segment, or pages mapped at
        the end of the expandable range (with the free block at its end, if any)."""
        if self.expandable and self.tails:
            tail = self.tails[0]
            have = tail.size if tail.free else 0.0
            pages = math.ceil((size - have) / LARGE_BUFFER_BYTES) * LARGE_BUFFER_BYTES
            self.reserved += pages
            if tail.free:
                self._unlist(tail)
                tail.size += pages
                return tail
            block = _Block(0, tail.offset + tail.size, pages, prev=tail)
            tail.next = block
            self.tails[0] = block
            return block
        grown = float(_round_up(size, LARGE_BUFFER_BYTES) if self.expandable else segment_bytes(size))
        if self.reserved + grown > self.capacity:
            self._release_free_segments()
        block = _Block(len(self.tails), 0.0, grown)
        self.tails.append(block)
        self.reserved += grown
        return block

    def _release_free_segments(self) -> None:
        """cudaFree every segment that is one free block (release_cached_blocks)."""
        for tail in self.tails:
            if tail.free and tail.prev is None and tail.size > 0.0:
                self._unlist(tail)
                self.reserved -= tail.size
                tail.size = 0.0


def replay_step(events, *, expandable: bool, capacity_bytes: float = float("inf")) -> AllocatorPeaks:
    """Replay `events` — (key, bytes) to allocate a tensor, (key, None) to free it, with an
    optional third element naming the stream it is allocated on (0, the compute stream, if
    absent) — through the caching allocator's large pools, one per stream (a block cached
    for one stream never serves another: FSDP's all-gather and reduce-scatter streams keep
    their own); the peaks of allocated and reserved bytes over all of them."""
    pools: dict[int, _Pool] = {}
    live = dict[object, tuple[_Pool, _Block]]()
    allocated = reserved = peak_allocated = peak_reserved = 0.0
    for key, size, *stream in events:
        if size is None:
            pool, block = live.pop(key)
            allocated -= block.size
            pool.release(block)
        elif size > 0.0:
            pool = pools.setdefault(stream[0] if stream else 0, _Pool(expandable, capacity_bytes))
            before = pool.reserved
            block = pool.malloc(size)
            live[key] = pool, block
            allocated += block.size
            reserved += pool.reserved - before
            peak_allocated, peak_reserved = max(peak_allocated, allocated), max(peak_reserved, reserved)
    return AllocatorPeaks(allocated_bytes=peak_allocated, reserved_bytes=peak_reserved)
