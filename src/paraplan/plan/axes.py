"""Closed sets of plan choices. Each enum has a stable integer `code` so the vectorized
cost model can work on numpy arrays of plans (see plan/space.py)."""

from __future__ import annotations

from ..enums import CodedEnum as _Coded
from ..specs.hardware import AttentionKernel  # noqa: F401  (re-exported: a plan axis)


class Schedule(_Coded):
    GPIPE = "gpipe"                    # Huang et al. 2019: all forwards, then all backwards
    ONE_F_ONE_B = "1f1b"               # PipeDream-Flush / Narayanan et al. SC'21
    INTERLEAVED_1F1B = "interleaved"   # Narayanan et al. SC'21, v virtual stages per rank
    BREADTH_FIRST = "bfs"              # Lamy-Poirier MLSys'23, looping stages, breadth-first
    ZERO_BUBBLE = "zb"                 # Qi et al. 2024, ZB-H1: backward split into B and W
    # Qi et al. 2024 Sec. 6 (ZB-V): two chunks per rank placed in a V (rank r holds stages r
    # and 2p-1-r), B and W split; torch ScheduleZBVZeroBubble, torchtitan "ZBVZeroBubble"
    ZERO_BUBBLE_V = "zbv"
    # DeepSeek-AI 2024 (DeepSeek-V3 report Sec. 3.2.1), DualPipeV: ZB-V's V with a forward of
    # one chunk and a full backward of the other run as one action in the steady state (the
    # pair DualPipe overlaps); torch ScheduleDualPipeV, torchtitan "DualPipeV"
    DUAL_PIPE_V = "dualpipev"


# Schedules that place exactly two chunks per rank in a V (rank r holds stages r and 2p-1-r)
V_SCHEDULES = frozenset({Schedule.ZERO_BUBBLE_V, Schedule.DUAL_PIPE_V})


class Recompute(_Coded):
    NONE = "none"
    SELECTIVE = "selective"  # Korthikanti et al.: recompute attention core (softmax, dropout)
    FULL = "full"            # keep only each layer's input; recompute the whole layer
    FIRST_K = "first_k"      # full recompute of the first k layers of each stage (Megatron block)
    # Megatron-Core selective module recomputation (--recompute-granularity selective
    # --recompute-modules core_attn layernorm moe_act mla_up_proj): the attention core, the
    # two norms' outputs, the routed experts' activation function and MLA's up-projections
    MODULES = "modules"
    # torchtitan's per-op selective checkpointing (activation_checkpoint.mode "selective",
    # selective_ac_option "op"; torchtitan distributed/activation_checkpoint.py _save_list):
    # each layer keeps its input and the outputs of every other matmul, the attention kernel
    # and the TP reduce-scatters, and re-runs the rest (norms, RoPE, activation, the other
    # matmuls) in its backward. An eager engine's policy (torchtitan, paraplan run).
    OP_SAC = "op-sac"
    # A searched set of the tensors each layer saves that it drops and re-creates in its
    # backward (Plan.recompute_ops; fusion-aware checkpointing, He & Yu, MLSys 2023): the
    # search tries the Pareto-optimal sets of time against memory (cost/recompute_set.py)
    SET = "set"


class RecomputeOp(_Coded):
    """A tensor one layer saves for its backward that Recompute.SET may drop and re-create
    from what it keeps (docs/model/memory.md, "Searched recomputation")."""

    LN1 = "ln1"        # the attention norm's output: the QKV projection's input
    QKV = "qkv"        # Q, K and V, after RoPE
    SCORES = "scores"  # the unfused attention's scores, softmax and dropout (none under FlashAttention)
    ATTN = "attn"      # the attention output (the out-projection's input)
    RESID = "resid"    # the residual after attention (the MLP norm's input), with the dropout masks
    LN2 = "ln2"        # the MLP norm's output: the up-projection's input
    UP = "up"          # the up (and gate) projection's output: the activation function's input
    ACT = "act"        # the activation function's output: the down-projection's input


class RecomputeOps(frozenset):
    """A set of RecomputeOp, held in a plan column as the bit mask of their codes."""

    def __new__(cls, ops=()):
        return super().__new__(cls, (RecomputeOp(op) for op in ops))

    @property
    def code(self) -> int:
        return sum(1 << op.code for op in self)

    @classmethod
    def from_code(cls, code: int) -> "RecomputeOps":
        return cls(op for op in RecomputeOp if int(code) >> op.code & 1)

    @classmethod
    def parse(cls, text, field: str) -> "RecomputeOps":
        """Comma-separated op names ("qkv,act"); a one-line SpecError for an unknown one."""
        if isinstance(text, (list, tuple, set, frozenset)):
            return cls(RecomputeOp.parse(str(x), field) for x in text)
        return cls(RecomputeOp.parse(x, field) for x in str(text).split(",") if x.strip())

    def __str__(self) -> str:
        return ",".join(op.value for op in sorted(self, key=lambda op: op.code))

    def __repr__(self) -> str:
        return f"RecomputeOps({str(self)!r})"


class CPCommType(_Coded):
    """How context-parallel ranks exchange keys and values (Megatron-Core --cp-comm-type)."""

    P2P = "p2p"              # ring attention (Liu et al. 2023): K/V chunks passed around a ring,
                             # each step under the previous step's attention kernel
    ALL_GATHER = "allgather"  # Llama 3 (Dubey et al. 2024 Sec. 3.3.2): all-gather K/V, then attend
    A2A = "a2a"              # DeepSpeed-Ulysses (Jacobs et al. 2023): all-to-all from sequence
                             # shards to head shards and back around the attention kernel


class RankOrder(_Coded):
    """How the parallel dimensions map onto global ranks, fastest-varying first: which
    groups share a node, and which dimension crosses the nodes, pods or islands furthest
    apart (cost/comm.py). Expert dimensions re-slice a stage's TP×CP×DP ranks in order."""

    # Megatron-Core's default order "tp-cp-ep-dp-pp" (parallel_state.initialize_model_parallel),
    # torchtitan's device mesh (pp, dp_replicate, dp_shard, cp, tp) and DeepSpeed's
    # PipeModelDataParallelTopology: the pipeline dimension is the outermost
    TP_CP_DP_PP = "tp-cp-dp-pp"
    # Megatron-LM --use-tp-pp-dp-mapping ("tp-cp-ep-pp-dp"); Llama 3 405B's [TP, CP, PP, DP]
    # (Dubey et al. 2024 Sec. 3.3.2): data parallelism outermost, a pipeline inside a pod
    TP_CP_PP_DP = "tp-cp-pp-dp"


class ZeroStage(_Coded):
    """Sharding over the data-parallel shard group (Rajbhandari et al. ZeRO)."""

    NONE = "0"     # plain DDP: replicated weights, grads, optimizer
    OPTIMIZER = "1"  # shard optimizer states (Megatron distributed optimizer)
    GRADIENTS = "2"  # + gradients
    PARAMETERS = "3"  # + parameters (FSDP FULL_SHARD); HSDP when dp_shard < dp


class GradCompression(_Coded):
    """The wire format of the data-parallel gradient reduction, as engines ship it (cost/grad_compression.py)."""

    NONE = "none"          # the 16-bit (or fp32, Plan.grad_reduce_fp32) reduction of the gradients
    # DeepSpeed ZeRO++ qgZ (Wang et al. 2023, "ZeRO++", Sec. 3.3; zero_optimization.zero_quantized_gradients,
    # deepspeed/runtime/comm/coalesced_collectives.py all_to_all_quant_reduce): ZeRO-3's reduce-scatter
    # as an int4 all-to-all inside the node, then one across the nodes; 1-D tensors as before
    INT4 = "int4"
    # PyTorch DDP's PowerSGD comm hook (Vogels et al. 2019, Alg. 1; torch/distributed/algorithms/
    # ddp_comm_hooks/powerSGD_hook.py): rank-r factors P, Q of each gradient matrix all-reduced,
    # error feedback; 1-D tensors all-reduced uncompressed
    POWERSGD = "powersgd"
