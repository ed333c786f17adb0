"""Raw microbenchmark results (no torch here): what `calibrate/bench.py` measures and
`calibrate/profile.py` turns into a hardware profile. Times are medians over repeats, in
seconds; sizes in elements or bytes as named.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True, kw_only=True)
class GemmSample:
    m: int
    n: int
    k: int
    dtype: str          # torch dtype name measured ("float32", "bfloat16", ...)
    time_s: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True, kw_only=True)
class AttentionSample:
    """Causal fused attention (torch SDPA) of `batch` × `heads` × `seq` × `head_dim`."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    dtype: str
    fwd_time_s: float
    bwd_time_s: float

    @property
    def fwd_flops(self) -> float:
        # QKᵀ and AV, 2·2·s²·d per head, half of it under the causal mask (as cost/flops.py)
        return 4.0 * self.batch * self.heads * self.seq * self.seq * self.head_dim * 0.5


@dataclass(frozen=True, kw_only=True)
class CopySample:
    """A copy of `num_bytes`: `device` (device memory to device memory), `h2d`, `d2h`."""

    kind: str
    num_bytes: float
    time_s: float


@dataclass(frozen=True, kw_only=True)
class CollectiveSample:
    """One collective over `world` local ranks; `num_bytes` is the full buffer (all-reduce
    input, all-gather output) or the message (send/recv)."""

    op: str             # all_reduce | all_gather | send_recv
    world: int
    num_bytes: float
    time_s: float


@dataclass(frozen=True, kw_only=True)
class OverlapSample:
    """A GEMM loop alone, an all-reduce of `num_bytes` alone, and the two at once (the
    all-reduce issued asynchronously, then the GEMMs, then the wait), on every rank."""

    num_bytes: float
    compute_s: float
    comm_s: float
    both_s: float

    @property
    def slowdown(self) -> float:
        """The cost model's overlap_slowdown (cost/evaluate.py): a collective hidden behind
        compute adds slowdown × its time, so both = compute + slowdown × comm when comm ≤
        compute; clamped into [0, 0.99] (1 would mean no overlap at all)."""
        hidden = min(self.comm_s, self.compute_s)
        return min(max((self.both_s - max(self.compute_s, self.comm_s)) / hidden, 0.0), 0.99) if hidden > 0 else 0.0


@dataclass(frozen=True, kw_only=True)
class Measurements:
    device_type: str               # cpu | cuda
    device_name: str
    ranks: int                     # processes measured side by side (one per device)
    threads_per_rank: int          # CPU threads each rank computed with
    compute_dtype: str             # what a bf16 workload computes in here (paraplan run: fp32 on CPU)
    memory_bytes: float            # usable by one rank (GPU memory; host memory / ranks on CPU)
    reserved_bytes: float          # taken before any tensor (CUDA context, torch runtime)
    launch_overhead_s: float       # one tiny kernel (dispatch + launch)
    gemm: tuple[GemmSample, ...]
    attention: tuple[AttentionSample, ...]
    copies: tuple[CopySample, ...]
    collectives: tuple[CollectiveSample, ...] = field(default=())
    backend: str = ""              # gloo | nccl
    torch_version: str = ""
    load_average: float = 0.0      # 1-minute load average when the benchmarks ended (os.getloadavg)
    cpu_count: int = 0
    overlap: OverlapSample | None = None  # compute slowed by a concurrent collective (2+ ranks)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> "Measurements":
        d = json.loads(text)
        kinds = {"gemm": GemmSample, "attention": AttentionSample, "copies": CopySample,
                 "collectives": CollectiveSample}
        for key, cls in kinds.items():
            d[key] = tuple(cls(**x) for x in d.get(key, ()))
        if d.get("overlap"):
            d["overlap"] = OverlapSample(**d["overlap"])
        return Measurements(**d)
