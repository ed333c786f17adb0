"""Raw microbenchmark results (no torch here): what `calibrate/bench.py` measures and
`calibrate/profile.py` turns into a hardware profile. Times are medians over repeats, in
seconds; sizes in elements or bytes as named.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field

from ..errors import FileFormatError
from ..specs.files import parse_json
from ..specs.hardware import AttentionKernel


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
    """Causal fused attention (torch SDPA) of `batch` × `heads` × `seq` × `head_dim`, run by
    the SDPA backend that paraplan names `kernel` (an AttentionKernel value: flash2 for
    FlashAttention-2, flash3 for cuDNN's fused attention; run/attention.py)."""

    batch: int
    heads: int
    seq: int
    head_dim: int
    dtype: str
    fwd_time_s: float
    bwd_time_s: float
    kernel: str = AttentionKernel.FLASH2.value  # raw files written before 2026-11-22 measured torch's default only, named flash2

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

    op: str             # all_reduce | all_gather | reduce_scatter | send_recv
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
class ElementwiseSample:
    """One forward of a Llama layer's element-wise kernels over `tokens` tokens: two RMS
    norms and two residual adds of [tokens, hidden], RoPE on q and k ([tokens, q_dim] and
    [tokens, kv_dim]), and SiLU(gate)·up over [tokens, ffn], in the compute dtype; eager, and
    (on a GPU) the same function under torch.compile."""

    tokens: int
    hidden: int
    ffn: int
    q_dim: int
    kv_dim: int
    time_s: float
    head_dim: int = 128
    compiled_time_s: float | None = None  # under torch.compile (inductor); None: not measured


@dataclass(frozen=True, kw_only=True)
class OptimizerSample:
    """One step of the optimizer `paraplan run` uses (torch.optim.AdamW, no weight decay,
    torch's default implementation for the device) over `tensors` fp32 parameters of
    `params` elements in all, gradients set, every rank stepping at once."""

    params: int
    tensors: int
    time_s: float


@dataclass(frozen=True, kw_only=True)
class LossSample:
    """Cross-entropy as `paraplan run` and torchtitan compute it, F.cross_entropy on logits
    upcast to fp32 (`dtype` the logits'), over `tokens` × `vocab`: forward, and backward alone."""

    tokens: int
    vocab: int
    dtype: str
    fwd_time_s: float
    bwd_time_s: float


@dataclass(frozen=True, kw_only=True)
class ScatterSample:
    """`index_add_` of `rows` rows of `hidden` elements (`dtype`) into `tokens` rows, each row
    hit rows/tokens times: an eager MoE's combine (torchtitan's scatter_add, Megatron's
    unfused unpermute) and its permutation's backward."""

    rows: int
    tokens: int
    hidden: int
    dtype: str
    time_s: float


TP_LAYER_HEAD_DIM = 32  # the TP layer sample's heads: hidden / 32 query heads, half as many K/V heads


def tp_layer_spec(hidden: int, num_layers: int = 1):
    """The Llama-style layer the TP layer sample times (bench.py) and the profile prices
    (profile.py): hidden/32 heads of 32, half as many K/V heads, SwiGLU 4× wide."""
    from ..specs.model import ModelSpec
    heads = hidden // TP_LAYER_HEAD_DIM
    return ModelSpec(name="calibrate-tp-layer", num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=4 * hidden,
                     num_heads=heads, num_kv_heads=max(heads // 2, 1), head_dim=TP_LAYER_HEAD_DIM, vocab_size=1,
                     gated_mlp=True)


@dataclass(frozen=True, kw_only=True)
class SplitBackwardSample:
    """torch.distributed.pipelining's split backward of `layers` of `paraplan run`'s layers
    (tp_layer_spec) at negligible size on a GPU, as the zero-bubble schedules run it: after a
    forward under bf16 autocast (fp32 parameters), the input-gradient pass B
    (`stage_backward_input`) and then the weight-gradient pass W (`stage_backward_weight`),
    each timed alone; the time is the host's (calibrate/bench.py `_split_backward`)."""

    layers: int
    backward_s: float  # median of the whole backward (torch.autograd.backward), for reference
    input_s: float     # median B pass
    weight_s: float    # median W pass


@dataclass(frozen=True, kw_only=True)
class HostLayerSample:
    """`paraplan run`'s transformer layer (tp_layer_spec) at negligible size on a GPU,
    forward and backward of one micro-batch of `tokens` tokens under bf16 autocast with fp32
    parameters (as a one-GPU run computes), 1 and 3 layers: what eager PyTorch's host spends
    issuing one layer's kernels (calibrate/bench.py `_host_layers`)."""

    tokens: int
    hidden: int
    one_layer_s: float     # median fwd+bwd of 1 layer
    three_layers_s: float  # ... of 3 layers

    @property
    def layer_s(self) -> float:
        """One more layer (the difference removes what every call pays once)."""
        return max((self.three_layers_s - self.one_layer_s) / 2.0, 0.0)


@dataclass(frozen=True, kw_only=True)
class TPLayerSample:
    """One transformer layer of `paraplan run` (Llama-style, SwiGLU, GQA; forward and
    backward of one micro-batch of `tokens` tokens, fp32), per layer: tensor-parallel over
    `world` ranks with sequence parallelism (DTensor) and as a replica on one rank, at a
    size where the math takes next to nothing (calibrate/bench.py `_tp_layers`)."""

    world: int
    tokens: int
    hidden: int
    bytes_per_element: int
    tp_1_layer_s: float     # median fwd+bwd of 1 layer, tensor-parallel
    tp_3_layers_s: float    # ... of 3 layers
    plain_1_layer_s: float  # ... of 1 layer, one rank's replica
    plain_3_layers_s: float

    @property
    def tp_layer_s(self) -> float:
        """One more tensor-parallel layer (the difference removes what every call pays once)."""
        return (self.tp_3_layers_s - self.tp_1_layer_s) / 2.0

    @property
    def plain_layer_s(self) -> float:
        return (self.plain_3_layers_s - self.plain_1_layer_s) / 2.0


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
    architecture: str = ""         # GPUSpec.architecture of the device ("" not recorded, or a CPU)
    load_average: float = 0.0      # 1-minute load average when the benchmarks ended (os.getloadavg)
    cpu_count: int = 0
    overlap: OverlapSample | None = None  # compute slowed by a concurrent collective (2+ ranks)
    host_memory_bytes: float = 0.0  # the machine's DRAM, within the container's limit (0: not recorded)
    device_count: int = 0           # GPUs the machine has (0: not recorded; the ranks measured)
    elementwise: ElementwiseSample | None = None  # a layer's element-wise kernels (None: not measured)
    optimizer: OptimizerSample | None = None      # an AdamW step (None: not measured)
    tp_layer: TPLayerSample | None = None         # a TP layer's cost beyond its math (None: not measured)
    host_layer: HostLayerSample | None = None     # an eager layer's host time on a GPU (None: not measured)
    # the zero-bubble split backward's host time by layer count on a GPU (empty: not measured)
    split_backward: tuple[SplitBackwardSample, ...] = field(default=())
    scatter: ScatterSample | None = None          # a scatter-add of token rows (None: not measured)
    # the same GEMM with a row of a multiple of 16 bytes, then with one that is not (a
    # 50,257 vocabulary), for misaligned_gemm_efficiency_ratio (empty: not measured)
    misaligned_gemm: tuple[GemmSample, ...] = field(default=())
    loss: LossSample | None = None                # the cross-entropy's kernels (None: not measured)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str, source: str = "measurements") -> "Measurements":
        """The measurements in `text` (as `to_json` writes them), checked: a one-line
        FileFormatError naming `source` and the field for anything a profile cannot use."""
        d = parse_json(text, source)
        if not isinstance(d, dict):
            raise FileFormatError(source, f"must be a JSON object of `paraplan calibrate --raw` measurements, "
                                          f"not {_json_kind(d)}")
        m = _build(Measurements, d, "", source)
        _check_usable(m, source)
        return m


# --- reading a raw file back (`calibrate --from-raw`, and the ranks of `calibrate --ranks N`)

_SAMPLES = {"gemm": GemmSample, "attention": AttentionSample, "copies": CopySample, "collectives": CollectiveSample,
            "misaligned_gemm": GemmSample, "split_backward": SplitBackwardSample}
# the fused kernels a raw file may name (every AttentionKernel but unfused; calibrate measures
# those in run/attention.py CALIBRATED_BACKENDS)
ATTENTION_KERNELS = tuple(k.value for k in AttentionKernel if k is not AttentionKernel.UNFUSED)
_NESTED = {"overlap": OverlapSample, "elementwise": ElementwiseSample, "optimizer": OptimizerSample,
           "tp_layer": TPLayerSample, "loss": LossSample, "host_layer": HostLayerSample,
           "scatter": ScatterSample}
_MAY_BE_ZERO = frozenset({"reserved_bytes", "launch_overhead_s", "load_average", "cpu_count", "host_memory_bytes",
                          "device_count"})
_MAX_NUMBER = float(2 ** 53)  # sizes stay exact as floats and products of them finite


def _json_kind(x) -> str:
    if isinstance(x, bool):
        return "a boolean"
    if x is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(x), "a number")


def _number(source: str, shown: str, name: str, kind: str, raw):
    zero_ok = name in _MAY_BE_ZERO
    wanted = (f"{'a non-negative' if zero_ok else 'a positive'} {'integer' if kind == 'int' else 'number'} "
              "(finite, at most 2**53) is required")
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or (kind == "int" and not isinstance(raw, int)):
        raise FileFormatError(source, f"{shown}={raw!r} is not allowed; {wanted}")
    try:
        x = float(raw)
    except OverflowError:
        x = math.inf
    if not (math.isfinite(x) and (x >= 0 if zero_ok else x > 0) and x <= _MAX_NUMBER):
        raise FileFormatError(source, f"{shown}={raw!r} is not allowed; {wanted}")
    return raw


def _build(cls, d: dict, where: str, source: str):
    """`cls(**d)` with every field checked against its annotation (int, float, str, samples)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    at = f"{where}." if where else ""
    unknown = [k for k in d if k not in fields]
    if unknown:
        raise FileFormatError(source, f"{at}{unknown[0]} is not a field of {where or 'the measurements'}; "
                                      f"allowed: {', '.join(fields)}")
    for name, f in fields.items():
        if name not in d and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise FileFormatError(source, f"{at}{name} is missing")
    kwargs = {}
    for name, raw in d.items():
        shown, kind = at + name, fields[name].type  # annotations are strings here (postponed)
        if name in _SAMPLES:
            if not isinstance(raw, list):
                raise FileFormatError(source, f"{shown} must be a list of samples, not {_json_kind(raw)}")
            items = []
            for i, x in enumerate(raw):
                if not isinstance(x, dict):
                    raise FileFormatError(source, f"{shown}[{i}] must be an object, not {_json_kind(x)}")
                items.append(_build(_SAMPLES[name], x, f"{shown}[{i}]", source))
            kwargs[name] = tuple(items)
        elif name in _NESTED:
            if raw is not None and not isinstance(raw, dict):
                raise FileFormatError(source, f"{shown} must be an object or null, not {_json_kind(raw)}")
            kwargs[name] = None if raw is None else _build(_NESTED[name], raw, shown, source)
        elif kind == "str":
            if not isinstance(raw, str):
                raise FileFormatError(source, f"{shown} must be a string, not {_json_kind(raw)}")
            kwargs[name] = raw
        elif kind == "float | None" and raw is None:  # an optional measurement not taken
            kwargs[name] = None
        else:
            kind = kind.removesuffix(" | None")
            assert kind in ("int", "float"), (cls, name, kind)
            kwargs[name] = _number(source, shown, name, kind, raw)
    return cls(**kwargs)


def _check_usable(m: Measurements, source: str) -> None:
    """What calibrate/profile.py needs beyond well-typed fields."""
    if m.device_type not in ("cpu", "cuda"):
        raise FileFormatError(source, f"device_type={m.device_type!r} is not allowed; allowed: cpu, cuda")
    worlds = sorted({c.world for c in m.collectives})
    if worlds and worlds != [m.ranks]:
        raise FileFormatError(source, f"collectives were measured over {', '.join(map(str, worlds))} rank(s), "
                                      f"but ranks={m.ranks}; they must agree")
    if m.scatter is not None and m.scatter.dtype not in ("float32", "bfloat16", "float16"):
        raise FileFormatError(source, f"scatter.dtype={m.scatter.dtype!r} is not allowed; allowed: float32, "
                                      "bfloat16, float16")
    if not any(g.dtype == m.compute_dtype for g in m.gemm):
        raise FileFormatError(source, f"gemm has no sample in the compute dtype {m.compute_dtype!r} "
                                      f"({len(m.gemm)} samples); the GEMM peak needs at least one")
    if not any(c.kind == "device" for c in m.copies):
        raise FileFormatError(source, "copies has no device-to-device copy (kind \"device\"); "
                                      "the memory bandwidth needs at least one")
    if m.tp_layer is not None and m.tp_layer.world != m.ranks:
        raise FileFormatError(source, f"tp_layer was measured over {m.tp_layer.world} rank(s), but ranks={m.ranks}; "
                                      "they must agree")
    bad = next((a.kernel for a in m.attention if a.kernel not in ATTENTION_KERNELS), None)
    if bad is not None:
        raise FileFormatError(source, f"attention: kernel={bad!r} is not allowed; allowed: {', '.join(ATTENTION_KERNELS)}")
    if len(m.misaligned_gemm) not in (0, 2):
        raise FileFormatError(source, f"misaligned_gemm has {len(m.misaligned_gemm)} samples; 2 are required "
                                      "(the aligned GEMM, then the misaligned one), or none")
    e = m.elementwise
    if e is not None and (e.q_dim % e.head_dim or e.kv_dim % e.head_dim or e.q_dim % e.kv_dim):
        raise FileFormatError(source, f"elementwise: q_dim={e.q_dim} and kv_dim={e.kv_dim} must be multiples of "
                                      f"head_dim={e.head_dim}, kv_dim dividing q_dim")
    ar = [c for c in m.collectives if c.op == "all_reduce" and c.world > 1]
    if len({c.world for c in ar}) > 1:
        raise FileFormatError(source, "collectives: the all_reduce samples span several world sizes "
                                      f"({sorted({c.world for c in ar})}); one is required")
    if len(ar) > 1 and len({c.num_bytes for c in ar}) < 2:
        raise FileFormatError(source, "collectives: the all_reduce samples all have the same num_bytes; "
                                      "the link fit needs two different sizes")
