"""The plan space as columns: every candidate plan of a cluster in numpy arrays.

A PlanBatch has the same attribute names as Plan (tp, pp, ..., schedule_code, ...), so
the cost model reads both. The space is the product of its axes (each a domain: what the
space offers), filtered by the validity rules of plan/rules.py: the enumerator binds the axes
a layout at a time and applies each pruning rule as soon as the axes it reads are bound; the
scalar `check_plan` runs every rule on a one-plan batch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields, replace
from types import SimpleNamespace
from typing import Callable

import numpy as np

from ..errors import SpecError
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .axes import AttentionKernel, CPCommType, GradCompression, RankOrder, Recompute, Schedule, ZeroStage
from .placement import rank_orders_differ
from .plan import COLUMNS, Plan, Rejected
from .rules import Rule, capacity_factor_ok, capacity_factor_rule, fullest_stage_layers, rules  # noqa: F401  (re-exported)

@dataclass(frozen=True, kw_only=True)
class PlanBatch:
    """Struct-of-arrays of plans (all arrays of equal length): one column per Plan field, named
    and encoded as plan/plan.py `COLUMNS` says (the attributes are spelled out for the readers
    of the cost model; a test checks they are the columns)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    cp_comm_type_code: np.ndarray
    rank_order_code: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    vp: np.ndarray
    micro_batch_size: np.ndarray
    schedule_code: np.ndarray
    recompute_code: np.ndarray
    recompute_num_layers: np.ndarray
    recompute_ops_code: np.ndarray
    activation_offload_layers: np.ndarray
    sequence_parallel: np.ndarray
    zero_code: np.ndarray
    dp_shard: np.ndarray
    offload_optimizer: np.ndarray
    adam_accumulation: np.ndarray
    dp_overlap: np.ndarray
    grad_compression_code: np.ndarray
    powersgd_rank: np.ndarray
    tp_overlap: np.ndarray
    attention_code: np.ndarray
    grad_reduce_fp32: np.ndarray
    fp32_params: np.ndarray
    grad_buffer_16bit: np.ndarray
    low_precision_params: np.ndarray
    checkpoint_early_stop: np.ndarray
    tp_async_backward: np.ndarray
    fsdp2_copies: np.ndarray
    fused_kernels: np.ndarray
    eager_elementwise: np.ndarray
    autocast: np.ndarray
    compiled: np.ndarray
    compiled_loss: np.ndarray
    loss_parallel: np.ndarray
    pp_kept_output_bytes: np.ndarray
    op_sac_attention_kept: np.ndarray
    capacity_factor_value: np.ndarray  # 0.0: dropless
    a2a_hierarchical: np.ndarray
    ep_overlap: np.ndarray

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    def take(self, index) -> "PlanBatch":
        return PlanBatch(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def plan(self, i: int) -> Plan:
        return Plan(**{c.field: c.decode(getattr(self, c.name)[i]) for c in COLUMNS})

    @staticmethod
    def from_plans(plans: list[Plan]) -> "PlanBatch":
        return PlanBatch(**{c.name: np.array([c.encode(getattr(p, c.field)) for p in plans], dtype=c.dtype)
                            for c in COLUMNS})

    @staticmethod
    def concat(batches: list["PlanBatch"]) -> "PlanBatch":
        return PlanBatch(**{f.name: np.concatenate([getattr(b, f.name) for b in batches])
                            for f in fields(PlanBatch)})


def invalid_mask(batch: PlanBatch, model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                 counted_only: bool = False) -> np.ndarray:
    """Plans of `batch` that break a rule (`counted_only`: one of the rules that do not prune,
    for candidates the plan space built with the pruning rules already applied)."""
    bad = np.zeros(batch_shape(batch), dtype=bool)
    for rule in rules(model, cluster, workload):
        if not (counted_only and rule.prunes):
            broken = rule.invalid(batch)
            if np.any(broken):  # (a rule no plan breaks, often on a few constant columns, costs no pass over the grid)
                bad = bad | broken
    return bad


def batch_shape(batch: PlanBatch) -> tuple[int, ...]:
    """The shape of a batch's plans: (n,) for columns, the broadcast of the columns' shapes for
    a block's product (SpaceBlock.grid)."""
    return np.broadcast_shapes(*(np.shape(getattr(batch, f.name)) for f in fields(PlanBatch)))


# the degrees and sizes that must be at least 1 (their declared lower bound)
DEGREES = tuple(f.name for f in fields(Plan) if f.type == "int" and (f.metadata["bounds"] or (0,))[0] == 1)


def check_plan(plan: Plan, model: ModelSpec, cluster: ClusterSpec, workload: Workload) -> Rejected | None:
    """Rejected(reason) for the first rule the plan breaks, else None."""
    for name in DEGREES:
        if getattr(plan, name) < 1:
            return Rejected(f"{name}={getattr(plan, name)} must be >= 1")
    # in Python integers first: pinned degrees (each up to 2**20) multiply past int64, where
    # the vectorized rules would wrap around
    if plan.tp * plan.pp * plan.dp * plan.cp != cluster.num_gpus:
        return Rejected(next(r.reason for r in rules(model, cluster, workload) if r.name == "gpus")(plan))
    batch = PlanBatch.from_plans([plan])
    for rule in rules(model, cluster, workload):
        if bool(np.broadcast_to(rule.invalid(batch), (1,))[0]):
            return Rejected(rule.reason(plan))
    return None


# ---------------------------------------------------------------- enumeration
def _balanced(layers: int, chunks: int, mtp: int = 0) -> bool:
    """Equal chunks of layers, counting the embedding, the loss and each of `mtp` multi-token-
    prediction modules as a layer's slot where that evens them (Megatron-Core --account-for-
    embedding/loss-in-pipeline-split; Llama 3 405B: 126 layers in 16 × 8 chunks, Dubey et al.
    2024 Sec. 3.3.2; DeepSeek-V3's 61 layers and MTP module in 32, cost/evaluate.py
    end_chunk_slots)."""
    return any((layers + slack) % chunks == 0 for slack in range(3 + mtp))


@functools.lru_cache(maxsize=256)
def divisors(n: int) -> tuple[int, ...]:
    """Divisors of n in increasing order (O(√n), once per n)."""
    small = [x for x in range(1, math.isqrt(n) + 1) if n % x == 0]
    return tuple(small + [n // x for x in reversed(small) if x * x != n])


@dataclass(frozen=True, kw_only=True)
class SpaceLimits:
    """Bounds on the enumerated axes (users can narrow them; defaults cover practice)."""

    max_tp: int = 0          # 0: the NVLink domain (gpus_per_node)
    max_micro_batch: int = 16
    max_cp: int = 32
    max_vp: int = 8
    schedules: tuple[Schedule, ...] = tuple(Schedule)
    recomputes: tuple[Recompute, ...] = tuple(Recompute)
    # first-k recomputation: the shares of the fullest stage's layers it may recompute (a
    # torchtitan run checkpointing every N-th layer recomputes 1/N of them: validate pins it)
    first_k_shares: tuple[float, ...] = (0.25, 0.5, 0.75)
    # Recompute.SET's sets to try at a layout: f(tp, sequence_parallel) -> RecomputeOps codes
    # (the search fills it with cost/recompute_set.py's Pareto frontier); None: SET is not tried
    recompute_sets: Callable | None = None
    zero_stages: tuple[ZeroStage, ...] = tuple(ZeroStage)
    allow_offload: bool = True
    # activation offload (Plan.activation_offload_layers): tried or not; None: where the GPU
    # reaches host memory at NVLink-C2C rates (ClusterSpec.offload_bytes_per_s at least
    # C2C_CLASS_BYTES_PER_S), where a layer's copies can hide under its compute
    activation_offload: bool | None = None
    # attention kernels in order of preference: the first one the GPU runs is used
    attention: tuple[AttentionKernel, ...] = (AttentionKernel.FLASH3, AttentionKernel.FLASH2)
    grad_reduce_fp32: bool = False   # the framework's precision policy (see Plan)
    fp32_params: bool = False
    grad_buffer_16bit: bool = False  # Megatron-Core's 16-bit gradient buffer (see Plan)
    low_precision_params: bool = False  # FP8 / NVFP4 weights kept and gathered quantized (see Plan)
    checkpoint_early_stop: bool = False
    tp_async_backward: bool = True
    fsdp2_copies: bool = False  # ZeRO >= 1 runs on FSDP2 (torchtitan: ZeRO-0 is DDP, no copies)
    fused_kernels: bool = True  # Megatron / TE's fused layer and loss (see Plan)
    eager_elementwise: bool = False  # ... whose element-wise ops run eager (see Plan)
    compiled: bool = False      # eager blocks under torch.compile (see Plan)
    compiled_loss: bool = False  # an eager engine's loss under torch.compile (see Plan)
    loss_parallel: bool = False  # an eager engine's vocabulary-parallel loss, op by op (see Plan)
    pp_kept_output_bytes: float = 0.0  # the head outputs a pipeline keeps until the step ends (see Plan)
    op_sac_attention_kept: bool = True  # per-op checkpointing keeps the attention's output (see Plan)
    # the DP gradient reduction's wire format (Plan.grad_compression): pinned, never searched
    # (a compressed format changes the numerics); every plan of the search takes this one
    grad_compression: GradCompression = GradCompression.NONE
    powersgd_rank: int = 1
    # the engine trains fp32 parameters under torch.autocast where it runs no FSDP (Plan.autocast;
    # torchtitan: DDP or one GPU): set per plan by without_fsdp_autocast
    autocast_without_fsdp: bool = False
    sequence_parallel: tuple[bool, ...] = (False, True)
    tp_overlap: tuple[bool, ...] = (False, True)
    # HSDP: also try ZeRO-3 shard groups smaller than DP (replicated across the rest)
    hybrid_shard: bool = True
    # MoE: token dispatch choices (None: dropless; a float: token dropping at that capacity
    # factor). Dropping tokens changes the model, so the default searches dropless only.
    capacity_factors: tuple[float | None, ...] = (None,)
    max_ep: int = 0          # 0: up to the number of experts
    # context parallelism: the K/V exchanges tried when CP>1 (plan/axes.py CPCommType)
    cp_comm_types: tuple[CPCommType, ...] = tuple(CPCommType)
    # rank orders tried (plan/axes.py RankOrder); an engine with a fixed mesh offers one
    rank_orders: tuple[RankOrder, ...] = tuple(RankOrder)
    # MoE: whether the two-dimensional all-to-all and the EP overlap may be tried (engines lack them)
    hierarchical_a2a: bool = True
    ep_overlap: bool = True
    # what an engine cannot build beyond these bounds (its device mesh, its pipeline
    # schedules): f(batch, model, workload) -> bool mask of the plans to drop, applied with
    # the validity rules (export/torchtitan.py `unbuildable`); None: nothing more
    engine_rule: Callable | None = None


# Faster than any PCIe Gen5 x16 link one way (64 GB/s), slower than NVLink-C2C's 450 GB/s
# (GH200, GB200, GB300) and as fast as PCIe Gen6 x16's 128 (B300)
C2C_CLASS_BYTES_PER_S = 100e9
OFFLOADED_RECOMPUTES = (Recompute.NONE.code, Recompute.FULL.code)
LAYOUT_AXES = ("tp", "cp", "pp", "dp")
# the axes a SpaceBlock's rows bind, outermost first (their product, pruned, is the rows'
# order; the rank order outermost keeps the plans with data parallelism outermost after the rest)
ROW_AXES = ("rank_order_code", "vp", "schedule_code", "recompute_code", "recompute_num_layers",
            "activation_offload_layers", "sequence_parallel", "recompute_ops_code",
            "tp_overlap", "cp_comm_type_code", "zero_code", "dp_shard", "offload_optimizer")
EXPERT_AXES = ("etp", "ep", "capacity_factor_value", "a2a_hierarchical", "ep_overlap")
MICRO_BATCH_AXES = ("micro_batch_size",)
# the rows' innermost axes, how the model states are sharded: where every value of the other
# row axes takes the same ZeRO choices, the grid gives them an axis of their own (SpaceBlock.grid)
STATE_AXES = ("zero_code", "dp_shard", "offload_optimizer")
ZERO_AXIS = 2  # the ZeRO choices' axis of a block's grid (micro-batch sizes, expert layouts, ZeRO, rows)
_DTYPES = {c.name: c.dtype for c in COLUMNS}


@dataclass(frozen=True)
class Axis:
    """One enumerated plan axis: `domain(*values of reads)` gives the values it takes (in
    order) once the axes it `reads` are bound. A domain is what the space offers (bounds,
    pins, choices that differ); what is valid is the rules' business (plan/rules.py)."""

    name: str
    reads: tuple[str, ...]
    domain: Callable[..., tuple]


@dataclass(frozen=True)
class Stages:
    """The pruning rules by the stage at which the axes they read are all bound: with a
    layout's micro-batch sizes, among its rows (after the last axis a rule reads), among its
    expert layouts, and between rows and expert layouts."""

    micro_batch: tuple[Rule, ...]
    row: tuple[Rule, ...]
    expert: tuple[Rule, ...]
    cross: tuple[Rule, ...]

    @staticmethod
    def of(all_rules: list[Rule]) -> "Stages":
        out: dict[str, list[Rule]] = {"micro_batch": [], "row": [], "expert": [], "cross": []}
        layout = set(LAYOUT_AXES)
        for rule in (r for r in all_rules if r.prunes):
            reads = set(rule.reads)
            for stage, axes in (("micro_batch", MICRO_BATCH_AXES), ("row", ROW_AXES), ("expert", EXPERT_AXES),
                                ("cross", ROW_AXES + EXPERT_AXES)):
                if reads <= layout | set(axes):
                    out[stage].append(rule)
                    break
            else:
                raise AssertionError(f"rule {rule.name} prunes but reads axes the space does not enumerate: "
                                     f"{sorted(reads - layout - set(ROW_AXES + EXPERT_AXES + MICRO_BATCH_AXES))}")
        return Stages(**{k: tuple(v) for k, v in out.items()})


def distinct(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows of equal-length integer or boolean columns, as an array of shape
    (distinct, columns); the index of each row's among them), by one sort of a combined key."""
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for col in columns:
        values, codes = np.unique(col, return_inverse=True)
        key = key * len(values) + codes.ravel()
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return np.stack([col[first] for col in columns], axis=1), inverse.ravel()


def _states_per_row(rows: dict) -> int:
    """The Z of rows that are the product of the other row axes' values with Z ZeRO choices
    (STATE_AXES), each value taking the same Z in the same order; 1 where they are not."""
    n = len(rows["vp"])
    if not n:
        return 1
    _, index = distinct([rows[a] for a in STATE_AXES])
    k = int(index.max()) + 1
    if k == 1 or n % k:
        return 1
    for name, values in rows.items():
        table = np.asarray(values).reshape(n // k, k)
        same = table == (table[:1] if name in STATE_AXES else table[:, :1])
        if not same.all():
            return 1
    return k


def bind(cols: dict[str, np.ndarray], axis: Axis) -> dict[str, np.ndarray]:
    """The product of `cols` (equal-length columns) with `axis`: each row followed by every
    value the axis's domain gives it, rows in order (vectorized, domains asked once per
    distinct value of the axes it reads)."""
    n = len(next(iter(cols.values()))) if cols else 1
    dtype = _DTYPES[axis.name]
    if n == 0:
        return {**cols, axis.name: np.zeros(0, dtype=dtype)}
    if not axis.reads:
        values = np.array(axis.domain(), dtype=dtype)
        out = {k: np.repeat(v, len(values)) for k, v in cols.items()}
        out[axis.name] = np.tile(values, n)
        return out
    values, inverse = distinct([cols[r] for r in axis.reads])
    domains = [tuple(axis.domain(*(v.item() for v in key))) for key in values]
    lengths = np.array([len(d) for d in domains], dtype=np.int64)
    table = np.zeros((len(domains), max(1, int(lengths.max()))), dtype=dtype)
    for i, d in enumerate(domains):
        table[i, :len(d)] = d
    counts = lengths[inverse]
    src = np.repeat(np.arange(n), counts)
    pos = np.arange(len(src)) - np.repeat(np.cumsum(counts) - counts, counts)
    out = {k: v[src] for k, v in cols.items()}
    out[axis.name] = table[inverse[src], pos]
    return out


def prune(cols: dict[str, np.ndarray], layout: dict, pending: list[Rule]) -> dict[str, np.ndarray]:
    """`cols` without the rows that break a rule of `pending` whose axes are all bound (those
    rules leave `pending`)."""
    bound = set(cols) | set(layout)
    ready = [r for r in pending if set(r.reads) <= bound]
    if not ready or not cols:
        return cols
    n = len(next(iter(cols.values())))
    view = SimpleNamespace(**layout, **cols)
    bad = np.zeros(n, dtype=bool)
    for rule in ready:
        pending.remove(rule)
        bad |= np.broadcast_to(rule.invalid(view), (n,))
    return {k: v[~bad] for k, v in cols.items()} if bad.any() else cols


def product(axes, layout: dict, pending: list[Rule]) -> dict[str, np.ndarray]:
    """The axes' product in order, each rule of `pending` applied as soon as its axes are bound."""
    cols: dict[str, np.ndarray] = {}
    for axis in axes:
        cols = prune(bind(cols, axis), layout, pending)
    return cols


@dataclass(frozen=True, eq=False)
class SpaceBlock:
    """The candidates of one (TP, CP, PP, DP) layout that admit the same expert layouts, not
    yet expanded: `rows` (columns of ROW_AXES: one per schedule, recomputation, ZeRO, ...
    choice) × `experts` (columns of EXPERT_AXES) × micro-batch sizes. Cheap to hold;
    `materialize` builds the PlanBatch and drops the invalid plans."""

    layout: dict              # tp, cp, pp, dp
    rows: dict                # ROW_AXES -> array, one entry per row
    experts: dict             # EXPERT_AXES -> array, one entry per expert layout
    micro_batches: tuple
    kernel_code: int
    limits: SpaceLimits

    @property
    def num_rows(self) -> int:
        return len(self.rows["vp"])

    @property
    def num_candidates(self) -> int:
        return self.num_rows * len(self.experts["ep"]) * len(self.micro_batches)

    @functools.cached_property
    def states_per_row(self) -> int:
        """How many ZeRO choices (STATE_AXES) each value of the other row axes takes, where the
        rows are the product of the two in that order (the grid's second axis); else 1."""
        return _states_per_row(self.rows)

    def parts(self, max_candidates: int):
        """The block in slices of its rows of at most about `max_candidates` plans each (each
        slice whole values of the other row axes, with every ZeRO choice of each)."""
        per_row = len(self.experts["ep"]) * len(self.micro_batches)
        k = self.states_per_row
        step = max(1, max_candidates // (per_row * k)) * k
        for i in range(0, self.num_rows, step):
            yield replace(self, rows={name: v[i:i + step] for name, v in self.rows.items()})

    def grid(self) -> PlanBatch:
        """The block's candidates as a product of broadcastable columns, on axes (micro-batch
        sizes, expert layouts, ZeRO choices, rows): the micro-batch sizes shaped (M, 1, 1, 1),
        the expert axes (1, E, 1, 1), the ZeRO choices (STATE_AXES) (1, 1, Z, 1) where the rows
        are their product (else along the rows, Z = 1), the other row axes (1, 1, 1, R), the
        layout and the engine's constants (1, 1, 1, 1). The cost model's arithmetic is
        element-wise, so on a grid numpy computes each term once per value of the axes it reads
        (a GEMM per micro-batch size, an all-to-all per expert layout and micro-batch size, a
        layer's activations without the ZeRO choices) and only the sums at M×E×Z×R, with the
        same value each plan gets as a column. The rows, which most terms read, are the axis
        numpy runs innermost (a ufunc's inner loop over a short axis costs several times more
        per element). The enumeration order, rows outermost, is the grid's Fortran order
        (SpaceBlock.flat, grid_plans)."""
        limits = self.limits
        n_states = self.states_per_row
        n_rows, n_experts = self.num_rows // n_states, len(self.experts["ep"])
        cols = {}
        for name, values in self.rows.items():
            values = np.asarray(values).reshape(n_rows, n_states)
            cols[name] = (values[0].reshape(1, 1, n_states, 1) if name in STATE_AXES and n_states > 1
                          else values[:, 0].reshape(1, 1, 1, n_rows))
        cols.update({k: np.asarray(v).reshape(1, n_experts, 1, 1) for k, v in self.experts.items()})
        cols["micro_batch_size"] = np.array(self.micro_batches, dtype=np.int64).reshape(-1, 1, 1, 1)
        cols.update({k: np.full((1, 1, 1, 1), v, dtype=np.int64) for k, v in self.layout.items()})
        zero = cols["zero_code"]

        def const(value):
            return np.full((1, 1, 1, 1), value)
        return PlanBatch(
            **cols, dp_overlap=const(True), adam_accumulation=const(False),  # (not searched: cli/choice.py)
            attention_code=np.full((1, 1, 1, 1), self.kernel_code, dtype=np.int64),
            grad_reduce_fp32=const(limits.grad_reduce_fp32), fp32_params=const(limits.fp32_params),
            grad_buffer_16bit=const(limits.grad_buffer_16bit),
            low_precision_params=const(limits.low_precision_params),
            checkpoint_early_stop=const(limits.checkpoint_early_stop),
            tp_async_backward=const(limits.tp_async_backward),
            # (constants where the engine's policy is off: a term reading them stays off the ZeRO axis)
            fsdp2_copies=(zero != ZeroStage.NONE.code) if limits.fsdp2_copies else const(False),
            fused_kernels=const(limits.fused_kernels), eager_elementwise=const(limits.eager_elementwise),
            compiled=const(limits.compiled),
            compiled_loss=const(limits.compiled_loss), loss_parallel=const(limits.loss_parallel),
            pp_kept_output_bytes=const(limits.pp_kept_output_bytes),
            op_sac_attention_kept=const(limits.op_sac_attention_kept),
            grad_compression_code=np.full((1, 1, 1, 1), limits.grad_compression.code, dtype=np.int64),
            powersgd_rank=np.full((1, 1, 1, 1), limits.powersgd_rank, dtype=np.int64),
            autocast=(without_fsdp_autocast(True, cols["tp"], cols["pp"], zero, cols["dp_shard"], cols["cp"])
                      if limits.autocast_without_fsdp else const(False)))

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(micro-batch sizes, expert layouts, ZeRO choices, rows): the grid's shape."""
        k = self.states_per_row
        return len(self.micro_batches), len(self.experts["ep"]), k, self.num_rows // k

    def without_zero(self, grid: PlanBatch) -> PlanBatch | None:
        """`grid` (this block's, or a sub-grid of it) with ZeRO-0 in place of every ZeRO choice
        (nothing sharded, nothing offloaded): one value on the ZeRO axis, what a step floor
        under every choice is priced on (search/planner.py). None where the grid has no ZeRO
        axis, or where the engine's policy changes with the choice (FSDP2's copies, autocast
        without FSDP), or where the gradients go compressed (ZeRO-3's int4 reduction can beat
        ZeRO-0's 16-bit one): there the plan without ZeRO is another program, not a floor."""
        limits = self.limits
        if (self.states_per_row == 1 or limits.fsdp2_copies or limits.autocast_without_fsdp
                or limits.grad_compression is not GradCompression.NONE):  # (ZeRO-3's qgZ can beat ZeRO-0)
            return None
        values = {"zero_code": ZeroStage.NONE.code, "dp_shard": self.layout["dp"], "offload_optimizer": False}
        return replace(grid, **{k: np.full((1, 1, 1, 1), v, dtype=_DTYPES[k]) for k, v in values.items()})

    def flat(self, values) -> np.ndarray:
        """Values on the block's grid (or broadcastable to it), flattened in enumeration order."""
        return flatten(values, self.shape)

    def candidates(self) -> PlanBatch:
        """Every candidate of the block as columns: the grid, flattened in enumeration order."""
        return grid_plans(self.grid(), self.shape)

    def invalid(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload, grid: PlanBatch) -> np.ndarray:
        """Which candidates of the block's `grid` break a rule the enumeration did not apply
        (the rules that do not prune, and the engine's), flattened in enumeration order."""
        bad = invalid_mask(grid, model, cluster, workload, counted_only=True)
        if self.limits.engine_rule is not None:
            bad = bad | self.limits.engine_rule(grid, model, workload)
        return self.flat(bad)

    def materialize(self, model: ModelSpec, cluster: ClusterSpec, workload: Workload):
        """(PlanBatch of the valid plans, number rejected): the pruning rules hold already, the
        others (and the engine's) are applied here."""
        grid = self.grid()
        bad = self.invalid(model, cluster, workload, grid)
        return grid_plans(grid, self.shape, np.flatnonzero(~bad)), int(bad.sum())


def flatten(values, shape: tuple) -> np.ndarray:
    """Values on a grid of `shape` (SpaceBlock.grid, or broadcastable to it) in enumeration
    order: the grid's Fortran order, its last axis (the rows) outermost."""
    return np.broadcast_to(values, shape).ravel(order="F")


def grid_plans(grid: PlanBatch, shape: tuple, flat_index: np.ndarray | None = None) -> PlanBatch:
    """The plans of a grid of `shape` (SpaceBlock.grid) as columns: those at `flat_index`
    (positions in the enumeration order, SpaceBlock.flat), or every one."""
    # (the grid positions of `flat_index`, found once for every column; a column indexed on the
    # axes it varies along only, a constant one filled)
    at = None if flat_index is None else np.unravel_index(flat_index, shape, order="F")
    count = int(np.prod(shape)) if flat_index is None else len(flat_index)

    def column(name):
        values = np.asarray(getattr(grid, name))
        if values.size == 1:
            return np.full(count, values.reshape(-1)[0], dtype=values.dtype)
        if at is None:
            return flatten(values, shape)
        values = values.reshape((1,) * (len(shape) - values.ndim) + values.shape)
        return values[tuple(a if n > 1 else 0 for a, n in zip(at, values.shape))]
    return PlanBatch(**{f.name: column(f.name) for f in fields(PlanBatch)})


def fsdp_shards(zero_code, dp_shard, cp):
    """Whether torchtitan shards with FSDP2 (ParallelDims.fsdp_enabled: over dp_shard·cp, when
    ZeRO ≥ 1 gives a shard group of 2+ or CP > 1). Vectorized."""
    return (((np.asarray(zero_code) != ZeroStage.NONE.code) & (np.asarray(dp_shard) > 1))
            | (np.asarray(cp) > 1))


def without_fsdp_autocast(engine_does, tp, pp, zero_code, dp_shard, cp):
    """Plan.autocast for an engine that trains under torch.autocast without FSDP (torchtitan's
    maybe_enable_amp: FSDP's own mixed precision when it shards, autocast for DDP or one GPU,
    fp32 with TP or PP and no FSDP -- the torchtitan export refuses those, autocast off). Vectorized."""
    return (np.asarray(engine_does, dtype=bool) & (np.asarray(tp) == 1) & (np.asarray(pp) == 1)
            & ~fsdp_shards(zero_code, dp_shard, cp))


def enumerate_space(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                    limits: SpaceLimits = SpaceLimits(), fixed: dict | None = None):
    """Yield PlanBatch chunks covering every valid plan (plus the count of rejected ones).

    `fixed` pins axes (e.g. {"tp": 8}). Yields (batch_of_valid_plans, num_rejected).
    """
    for block in space_blocks(model, cluster, workload, limits, fixed):
        yield block.materialize(model, cluster, workload)


PINNABLE = ("tp", "pp", "dp", "cp", "ep", "etp", "vp", "micro_batch_size")


def layouts(model: ModelSpec, cluster: ClusterSpec, limits: SpaceLimits, fixed: dict) -> list[dict]:
    """The (TP, CP, PP, DP) layouts the space offers: TP within the NVLink domain (or max_tp),
    CP within max_cp, DP the rest of the GPUs, each as pinned."""
    N = cluster.num_gpus
    max_tp = limits.max_tp or cluster.gpus_per_node
    out = []
    for tp in divisors(N):
        if tp > max_tp or fixed.get("tp", tp) != tp:
            continue
        for cp in divisors(N // tp):
            if cp > limits.max_cp or fixed.get("cp", cp) != cp:
                continue
            for pp in divisors(N // (tp * cp)):
                dp = N // (tp * cp * pp)
                if fixed.get("pp", pp) == pp and fixed.get("dp", dp) == dp:
                    out.append({"tp": tp, "cp": cp, "pp": pp, "dp": dp})
    return out


def row_axes(model: ModelSpec, cluster: ClusterSpec, limits: SpaceLimits, fixed: dict, layout: dict) -> list[Axis]:
    """The axes of a layout's rows (ROW_AXES), with what the space offers on each."""
    tp, cp, pp, dp = (layout[k] for k in LAYOUT_AXES)
    L = model.num_layers
    # every divisor of the fullest stage's ⌈l/PP⌉ layers (those split it evenly:
    # ⌈⌈l/PP⌉/v⌉·v = ⌈l/PP⌉; a divisor of ⌊l/PP⌋ alone would put more layers on it, 6 for
    # DeepSeek-V3's 61 at PP 16 × VP 3), and those whose chunks even out counting the
    # embedding, the loss and the MTP modules as a slot each
    slots = [v for v in range(2, limits.max_vp + 1) if _balanced(L, pp * v, model.mtp_layers)]
    vps = (fixed["vp"],) if "vp" in fixed else tuple(
        sorted(x for x in set(divisors(-(-L // pp))) | set(slots) if x <= limits.max_vp))
    L_s = int(fullest_stage_layers(L, pp))
    ks = tuple(sorted({max(1, round(L_s * q)) for q in limits.first_k_shares} - {L_s})) if L_s > 1 else ()
    offload = (limits.activation_offload if limits.activation_offload is not None
               else cluster.offload_bytes_per_s >= C2C_CLASS_BYTES_PER_S)
    offloaded = tuple(sorted({max(1, round(L_s * q)) for q in (0.5, 1.0)})) if offload else ()
    shards = [dp]
    if limits.hybrid_shard:  # (a shard group of one rank, dp_shard·cp = 1, shards nothing)
        shards += [x for x in divisors(dp) if x < dp and x * cp > 1
                   and x >= cluster.gpus_per_node // max(tp * cp, 1)][:3]
    # with one data-parallel rank ZeRO shards nothing: ZeRO-0 stands for all stages (a
    # dense model's; an MoE model's experts still shard over their EDP group), and ZeRO-1
    # only for optimizer offload (ZeRO-Offload on one GPU)
    zeros = limits.zero_stages
    collapsed = dp * cp == 1 and not model.is_moe and ZeroStage.NONE in zeros
    if collapsed:
        zeros = (ZeroStage.NONE,) + ((ZeroStage.OPTIMIZER,) if limits.allow_offload
                                     and ZeroStage.OPTIMIZER in limits.zero_stages else ())
    # the rank orders asked for, where they place some group differently (plan/placement.py);
    # where they do not, one plan stands for both, in the default order
    island = cluster.gpus_per_island if cluster.dcn is not None else 0
    differ = rank_orders_differ(tp, cp, pp, dp, shards, cluster.gpus_per_node, island, model.is_moe)
    orders = (sorted(o.code for o in limits.rank_orders) if differ
              else [RankOrder.TP_CP_DP_PP.code] if limits.rank_orders else [])

    def schedules(vp: int) -> list[int]:
        # one stage runs 1F1B; one chunk per rank is no interleaving
        if pp == 1:
            return [Schedule.ONE_F_ONE_B.code]
        return [x.code for x in limits.schedules
                if vp > 1 or x not in (Schedule.INTERLEAVED_1F1B, Schedule.BREADTH_FIRST)]

    def offloads(zero: int) -> tuple[bool, ...]:
        if collapsed and zero != ZeroStage.NONE.code:
            return (True,)
        return ((False, True) if limits.allow_offload
                and zero in (ZeroStage.OPTIMIZER.code, ZeroStage.GRADIENTS.code) else (False,))

    return [
        Axis("rank_order_code", (), lambda: orders),
        Axis("vp", (), lambda: vps),
        Axis("schedule_code", ("vp",), schedules),
        # per-op checkpointing is an eager engine's policy (the op_sac rule)
        Axis("recompute_code", (), lambda: [x.code for x in limits.recomputes
                                            if not (limits.fused_kernels and x is Recompute.OP_SAC)
                                            and not (x is Recompute.SET and limits.recompute_sets is None)]),
        # first-k recomputation of a quarter, half or three quarters of the fullest stage
        Axis("recompute_num_layers", ("recompute_code",), lambda rc: ks if rc == Recompute.FIRST_K.code else (0,)),
        # activation offload of half or all of the fullest stage's layers, with no or full
        # recomputation (selective keeps what none does under FlashAttention; with module and
        # first-k recomputation, and other counts, it is priced where pinned: each value
        # multiplies the rows the search prices)
        Axis("activation_offload_layers", ("recompute_code",),
             lambda rc: (0,) + offloaded if rc in OFFLOADED_RECOMPUTES else (0,)),
        Axis("sequence_parallel", (), lambda: limits.sequence_parallel if tp > 1 else (False,)),
        # a searched recomputation's sets: the frontier of time against memory at this TP, with
        # sequence parallelism where TP > 1 (a plan short of memory shards its norms first; each
        # set multiplies the rows the search prices: docs/model/memory.md, "Searched recomputation")
        Axis("recompute_ops_code", ("recompute_code", "sequence_parallel"),
             lambda rc, sp: (0,) if rc != Recompute.SET.code else
             tuple(limits.recompute_sets(tp, sp)) if sp or tp == 1 else ()),
        # (a searched recomputation's rows overlap TP where they may: fewer rows to price)
        Axis("tp_overlap", ("sequence_parallel", "recompute_code"),
             lambda sp, rc: (False,) if not sp else (True,) if rc == Recompute.SET.code and True in limits.tp_overlap
             else limits.tp_overlap),
        # CP = 1 exchanges nothing (counted as the ring: the cp_comm rule)
        Axis("cp_comm_type_code", (), lambda: [x.code for x in limits.cp_comm_types]),
        Axis("zero_code", (), lambda: [z.code for z in zeros]),
        Axis("dp_shard", (), lambda: shards),
        Axis("offload_optimizer", ("zero_code",), offloads),
    ]


def expert_axes(cluster: ClusterSpec, limits: SpaceLimits, fixed: dict, layout: dict) -> list[Axis]:
    """The expert layouts the space offers a layout (EXPERT_AXES): ETP of 1 or TP, EP any
    divisor of the stage's ranks (within max_ep), the capacity factors asked for, and the two
    all-to-alls where they differ (the EP group leaves the node)."""
    tp = layout["tp"]
    ranks = tp * layout["cp"] * layout["dp"]
    return [
        Axis("etp", (), lambda: [x for x in sorted({1, tp}) if fixed.get("etp", x) == x]),
        Axis("ep", (), lambda: [x for x in divisors(ranks) if fixed.get("ep", x) == x
                                and not (limits.max_ep and x > limits.max_ep)]),
        Axis("capacity_factor_value", (), lambda: [0.0 if cf is None else float(cf) for cf in limits.capacity_factors]),
        # the deduplicating dispatch (DeepEP) at any EP > 1, ETP 1 (rules.py a2a_flex)
        Axis("a2a_hierarchical", ("ep", "etp"),
             lambda ep, etp: (False, True) if ep > 1 and etp == 1 and limits.hierarchical_a2a else (False,)),
        Axis("ep_overlap", (), lambda: (False, True) if limits.ep_overlap else (False,)),
    ]


def micro_batch_sizes(limits: SpaceLimits, fixed: dict) -> list[int]:
    return [x for x in range(1, limits.max_micro_batch + 1) if fixed.get("micro_batch_size", x) == x]


def admitted(rows: dict, experts: dict, layout: dict, cross: tuple[Rule, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Which expert layouts each row admits under the rules that read both: (a key per row,
    patterns of shape (keys, expert layouts, 2)); the pattern's [:, :, 0] under the rules that
    do not read ROW_AXES[0], [:, :, 1] under all of them. Each rule is asked once per distinct
    value of the row axes it reads."""
    n_rows, n_experts = len(rows["vp"]), len(experts["ep"])
    reads = [a for a in ROW_AXES if any(a in r.reads for r in cross)]
    if not reads:
        return np.zeros(n_rows, dtype=np.int64), np.ones((1, n_experts, 2), dtype=bool)
    values, inverse = distinct([rows[a] for a in reads])
    view = {a: np.repeat(values[:, i], n_experts).astype(rows[a].dtype) for i, a in enumerate(reads)}
    view.update({k: np.tile(v, len(values)) for k, v in experts.items()})
    ns = SimpleNamespace(**layout, **view)
    bad = np.zeros((2, len(values) * n_experts), dtype=bool)
    for rule in cross:
        mask = np.broadcast_to(rule.invalid(ns), bad.shape[1:])
        bad[1] |= mask
        if ROW_AXES[0] not in rule.reads:
            bad[0] |= mask
    ok = ~bad.reshape(2, len(values), n_experts).transpose(1, 2, 0)
    patterns, which = np.unique(ok, axis=0, return_inverse=True)
    return which.ravel()[inverse], patterns


def layout_blocks(model: ModelSpec, cluster: ClusterSpec, workload: Workload, limits: SpaceLimits, fixed: dict,
                  stages: Stages, layout: dict, kernel_code: int) -> list[SpaceBlock]:
    """One layout's candidates in blocks of rows that admit the same expert layouts. Rows go in
    their order within the value of the outermost row axis (the rank order) they hold, then the
    expert layouts that the rules not reading it admit (most first: a set before its subsets),
    then those all the rules admit."""
    mbs = product([Axis("micro_batch_size", (), lambda: micro_batch_sizes(limits, fixed))], layout,
                  list(stages.micro_batch))
    rows = product(row_axes(model, cluster, limits, fixed, layout), layout, list(stages.row))
    if not len(mbs["micro_batch_size"]) or not len(rows["vp"]):
        return []
    experts = product(expert_axes(cluster, limits, fixed, layout), layout, list(stages.expert))
    if not len(experts["ep"]):
        return []
    which, patterns = admitted(rows, experts, layout, stages.cross)
    micro_batches = tuple(int(x) for x in mbs["micro_batch_size"])
    outer = rows[ROW_AXES[0]]
    blocks = []
    for value in dict.fromkeys(outer.tolist()):
        keys = set(which[outer == value].tolist())
        for p in sorted(keys, key=lambda i: (tuple(patterns[i, :, 0]), tuple(patterns[i, :, 1])), reverse=True):
            sel = (outer == value) & (which == p)
            if patterns[p, :, 1].any():
                blocks.append(SpaceBlock(layout=layout, rows={k: v[sel] for k, v in rows.items()},
                                         experts={k: v[patterns[p, :, 1]] for k, v in experts.items()},
                                         micro_batches=micro_batches, kernel_code=kernel_code, limits=limits))
    return blocks


def space_blocks(model: ModelSpec, cluster: ClusterSpec, workload: Workload,
                 limits: SpaceLimits = SpaceLimits(), fixed: dict | None = None) -> list[SpaceBlock]:
    """The plan space in blocks of candidates, layout by layout: every axis's domain, each
    pruning rule applied as soon as the axes it reads are bound (plan/rules.py)."""
    fixed = dict(fixed or {})
    for key in fixed:
        if key not in PINNABLE:
            raise SpecError("search", key, fixed[key], "only these axes can be pinned: " + ", ".join(sorted(PINNABLE)))
    runnable = [k for k in limits.attention if k in cluster.gpu.attention_kernels]
    if not runnable:
        raise SpecError("search", "attention", ",".join(map(str, limits.attention)),
                        f"{cluster.gpu.name} runs: " + ", ".join(map(str, cluster.gpu.attention_kernels)))
    stages = Stages.of(rules(model, cluster, workload))
    return [block for layout in layouts(model, cluster, limits, fixed)
            for block in layout_blocks(model, cluster, workload, limits, fixed, stages, layout, runnable[0].code)]
