"""What one `paraplan run` executes: model (optionally scaled down), plan, workload, steps.

A frozen RunConfig travels from the launcher to every torchrun worker as JSON. Everything a
plan needs from torch is checked here first, without torch, so bad input is one line
(exit 2) before any process starts.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum

from ..errors import FileFormatError, SpecError
from ..plan.axes import V_SCHEDULES, GradCompression, RankOrder, Recompute, RecomputeOps, Schedule, ZeroStage
from ..plan.plan import Plan, plan_fields
from ..sim.schedules import SPLIT_BACKWARD
from ..specs.model import ModelSpec
from ..specs.workload import Optimizer, Precision, Workload

# Schedules torch.distributed.pipelining runs for each paraplan schedule (pipeline.py).
MULTI_STAGE_SCHEDULES = (Schedule.INTERLEAVED_1F1B, Schedule.BREADTH_FIRST, Schedule.ZERO_BUBBLE,
                         Schedule.ZERO_BUBBLE_V, Schedule.DUAL_PIPE_V)


# torchrun --standalone starts every rank on this machine: more processes than this is no
# machine's (1024 is 128 per GPU of an 8-GPU node, or several per core of the largest CPUs)
MAX_LOCAL_RANKS = 1024

# run/worker.py steps torch.optim.AdamW without fused=True: every run is predicted with it
RUN_OPTIMIZER = Optimizer.ADAM_UNFUSED


def computes_in_bf16(device_type: str, precision) -> bool:
    """Whether a run computes in bf16: on a GPU for a bf16 workload (fp8 and nvfp4 are
    predicted as such, run in bf16); a CPU run computes in fp32."""
    return device_type == "cuda" and str(precision) in ("bf16", "fp8", "nvfp4")


def runs_under_autocast(plan, device_type: str, precision) -> bool:
    """Whether a run computes under torch.autocast: in bf16 without data parallelism (FSDP2's
    mixed-precision policy casts otherwise), as torchtitan does (worker.py; Plan.autocast)."""
    return computes_in_bf16(device_type, precision) and plan.dp == 1


class Device(StrEnum):
    AUTO = "auto"  # cuda when torch sees a GPU, else cpu
    CPU = "cpu"
    CUDA = "cuda"


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    model: ModelSpec
    model_name: str  # as given on the command line (preset, TOML or config.json)
    plan: Plan
    workload: Workload
    steps: int = 10  # measured steps, after the warm-up
    warmup_steps: int = 3
    seed: int = 0
    lr: float = 1e-3
    device: Device = Device.AUTO
    hardware: str | None = None  # cluster preset or calibrated profile TOML for the prediction
    output: str = "paraplan-run.json"
    scaled: dict | None = None  # the --layers/--hidden/... overrides, for the command line
    # run the order the schedule search finds at the schedule's in-flight activations (run/searched.py)
    schedule_search: bool = False

    @property
    def world_size(self) -> int:
        return self.plan.tp * self.plan.pp * self.plan.dp

    @property
    def local_batch_size(self) -> int:
        """Sequences per data-parallel rank per step."""
        return self.workload.global_batch_size // self.plan.dp

    @property
    def num_microbatches(self) -> int:
        return self.local_batch_size // self.plan.micro_batch_size

    def to_json(self) -> str:
        d = asdict(self)
        d["plan"] = plan_fields(self.plan)
        d["workload"] = {k: (str(v) if isinstance(v, StrEnum) else v) for k, v in d["workload"].items()}
        d["device"] = str(self.device)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str, shown: str = "run config") -> "RunConfig":
        try:
            d = json.loads(text)
            plan = d["plan"]
            if "fused_projections" in plan:  # the knob's name in reports before 2026-11-22
                plan["fused_kernels"] = plan.pop("fused_projections")
            for f in fields(Plan):  # every enum-valued plan field back from its string
                if isinstance(f.default, StrEnum) and f.name in plan:
                    plan[f.name] = type(f.default)(plan[f.name])
                elif isinstance(f.default, RecomputeOps) and f.name in plan:  # ("qkv,act")
                    plan[f.name] = RecomputeOps.parse(plan[f.name], f.name)
            wl = d["workload"]
            for f in fields(Workload):  # every enum-valued workload field back from its string
                if isinstance(f.default, StrEnum) and f.name in wl:
                    wl[f.name] = type(f.default)(wl[f.name])
            return cls(**{**d, "model": ModelSpec(**d["model"]), "plan": Plan(**plan),
                          "workload": Workload(**wl), "device": Device(d["device"])})
        except (KeyError, TypeError, ValueError) as e:
            raise FileFormatError(shown, f"not a paraplan run config: {e}") from None

    def command_line(self) -> str:
        """The `paraplan run` command that reproduces this configuration."""
        p, wl = self.plan, self.workload
        args = ["paraplan run", f"--model {self.model_name}"]
        args += [f"--{k} {v}" for k, v in (self.scaled or {}).items()]
        args += [f"--seq {wl.seq_len}", f"--batch {wl.global_batch_size}"]
        args += [f"--{k} {v}" for k, v in (("tp", p.tp), ("pp", p.pp), ("dp", p.dp), ("vp", p.vp),
                                            ("mb", p.micro_batch_size)) if v != 1]
        if p.pp > 1:
            args.append(f"--schedule {p.schedule}")
        if self.schedule_search:
            args.append("--schedule-search")
        if p.recompute is not Recompute.NONE:
            args.append(f"--recompute {p.recompute}")
            if p.recompute is Recompute.FIRST_K:
                args.append(f"--recompute-layers {p.recompute_num_layers}")
        if p.tp > 1 and not p.sequence_parallel:
            args.append("--no-sp")
        if p.zero is not ZeroStage.NONE:
            args.append(f"--zero {p.zero}")
            if p.dp_shard != p.dp:
                args.append(f"--dp-shard {p.dp_shard}")
        if p.compiled:
            args.append("--compile")
        if wl.precision is not Precision.BF16:
            args.append(f"--precision {wl.precision}")
        args += [f"--steps {self.steps}", f"--warmup {self.warmup_steps}"]
        if self.seed:
            args.append(f"--seed {self.seed}")
        if self.device is not Device.AUTO:
            args.append(f"--device {self.device}")
        if self.hardware:
            args.append(f"--hardware {self.hardware}")
        args.append(f"-o {self.output}")
        return " ".join(args)


def scale_model(spec: ModelSpec, *, layers: int | None = None, hidden: int | None = None,
                heads: int | None = None, kv_heads: int | None = None, ffn: int | None = None,
                vocab: int | None = None) -> ModelSpec:
    """The spec with some sizes replaced, for machines too small for the real model.

    A new hidden size keeps the ffn/hidden ratio unless `ffn` is given (rounded to a multiple
    of 8); heads stay unless given, and the head dim becomes hidden / heads.
    """
    if spec.is_moe or spec.is_mla:
        raise SpecError(f"model {spec.name!r}", "architecture", "MoE/MLA",
                        "paraplan run builds dense decoders with standard attention only")
    if spec.mtp_layers:
        raise SpecError(f"model {spec.name!r}", "mtp_layers", spec.mtp_layers,
                        "0: paraplan run builds no multi-token-prediction module (--mtp-layers 0)")
    h = hidden or spec.hidden_size
    a = heads or spec.num_heads
    k = kv_heads or min(spec.num_kv_heads, a)
    if h % a:
        raise SpecError("run", "--hidden", h, f"must be a multiple of the number of heads ({a})")
    if a % k:
        raise SpecError("run", "--kv-heads", k, f"must divide the number of heads ({a})")
    f = ffn or (spec.ffn_hidden_size if hidden is None else max(8, round(spec.ffn_hidden_size * h / spec.hidden_size / 8) * 8))
    name = spec.name if not any(v is not None for v in (layers, hidden, heads, kv_heads, ffn, vocab)) else f"{spec.name}-scaled"
    return replace(spec, name=name, num_layers=layers or spec.num_layers, hidden_size=h, num_heads=a,
                   num_kv_heads=k, head_dim=h // a if (hidden or heads) else spec.head_dim,
                   ffn_hidden_size=f, vocab_size=vocab or spec.vocab_size)


def check_world_size(ranks: int) -> None:
    """SpecError for more ranks than torchrun --standalone starts on one machine."""
    if ranks > MAX_LOCAL_RANKS:
        raise SpecError("run", "ranks (--tp × --pp × --dp)", ranks,
                        f"at most {MAX_LOCAL_RANKS} (torchrun starts every rank on this machine)")


def _check_estimated_only(p: Plan) -> None:
    """SpecError for the memory and communication techniques paraplan prices but does not run."""
    if p.offload_optimizer:
        raise SpecError("run", "--offload", True, "optimizer offload is not run (estimate it instead)")
    if p.activation_offload_layers:
        raise SpecError("run", "--offload-activations", p.activation_offload_layers,
                        "activation offload is not run (estimate it instead)")
    if p.grad_compression is not GradCompression.NONE:
        raise SpecError("run", "--grad-compression", str(p.grad_compression),
                        "none (the runner reduces gradients uncompressed; estimate it instead)")
    if p.adam_accumulation:
        raise SpecError("run", "--adama", True, "Adam accumulation (AdamA) is not run (estimate it instead)")


def check_runnable(cfg: RunConfig) -> None:
    """SpecError for a plan this runner (torch's parallel APIs) cannot execute."""
    p, m, wl = cfg.plan, cfg.model, cfg.workload
    check_world_size(cfg.world_size)
    if p.cp > 1 or p.ep > 1 or p.etp > 1:
        raise SpecError("run", "cp/ep/etp", (p.cp, p.ep, p.etp), "paraplan run executes TP, PP, DP/FSDP only (1)")
    _check_estimated_only(p)
    if p.dp_outermost:
        raise SpecError("run", "rank_order", str(p.rank_order),
                        f"{RankOrder.TP_CP_DP_PP} (the runner's device mesh puts the pipeline outermost)")
    if p.recompute in (Recompute.MODULES, Recompute.SET):
        raise SpecError("run", "--recompute", str(p.recompute),
                        "none, selective, full, first_k or op-sac (module recomputation and a searched set of ops "
                        "are priced, not run: estimate them instead)")
    if p.tp > 1:
        for name, v in (("num_heads", m.num_heads), ("num_kv_heads", m.num_kv_heads),
                        ("ffn_hidden_size", m.ffn_hidden_size), ("vocab_size", m.vocab_size)):
            if v % p.tp:
                raise SpecError("run", "--tp", p.tp, f"must divide the model's {name}={v}")
        if p.sequence_parallel and wl.seq_len % p.tp:
            raise SpecError("run", "--tp", p.tp, f"must divide --seq {wl.seq_len} with sequence parallelism")
    if m.tied_embeddings and (p.tp > 1 or p.pp > 1):
        raise SpecError("run", "tied_embeddings", True, "tied embeddings run with --tp 1 --pp 1 only")
    if p.vp > 1 and p.pp == 1:  # the plan rule (plan/space.py "VP>1 needs PP>1")
        raise SpecError("run", "--vp", p.vp, "needs --pp > 1 (virtual stages split a pipeline rank's layers)")
    if p.pp > 1 and p.schedule in V_SCHEDULES and p.vp != 2:
        raise SpecError("run", "--vp", p.vp, f"2 with --schedule {p.schedule} (two chunks per rank, in a V)")
    chunks = p.pp * p.vp
    if chunks > m.num_layers + 2:  # (an uneven split runs as the cost model lays it out: chunk_layers)
        raise SpecError("run", "--pp×--vp", chunks, f"at most the {m.num_layers} layers + 2 (the embedding and the "
                        "head may hold a chunk of their own; --layers scales the layers)")
    if wl.global_batch_size % (p.dp * p.micro_batch_size):
        raise SpecError("run", "--batch", wl.global_batch_size,
                        f"must be a multiple of dp×mb={p.dp * p.micro_batch_size}")
    if p.vp > 1 and p.schedule not in MULTI_STAGE_SCHEDULES:
        raise SpecError("run", "--schedule", str(p.schedule),
                        "with --vp > 1 allowed: " + ", ".join(map(str, MULTI_STAGE_SCHEDULES)))
    if p.pp > 1:
        n = cfg.num_microbatches
        if n < p.pp:
            raise SpecError("run", "micro-batches", n, f"need at least --pp={p.pp} per step (raise --batch or lower --mb)")
        if p.schedule is Schedule.DUAL_PIPE_V and n < 2 * p.pp:
            raise SpecError("run", "micro-batches", n, f"need at least 2×--pp={2 * p.pp} per step for dualpipev "
                            "(raise --batch or lower --mb)")
        # (the V orders take any count: torch builds ZB-V's for 2·pp − 1 and drops the missing)
        if p.schedule in MULTI_STAGE_SCHEDULES and p.schedule not in V_SCHEDULES and n % p.pp:
            raise SpecError("run", "micro-batches", n, f"must be a multiple of --pp={p.pp} for {p.schedule}")
    if p.schedule in SPLIT_BACKWARD and p.pp > 1 and p.dp > 1 and p.zero is ZeroStage.PARAMETERS:
        # Seen on torch 2.13 (benchmarks/run_kinds.py): gradient norm 30% (zb) and 31% (zbv) off
        # the single process, while ZeRO-0/1/2 match; presumably FSDP2's resharding after the
        # input-gradient backward drops the deferred weight gradients.
        raise SpecError("run", "--schedule", str(p.schedule), "loses weight gradients with --zero 3 (FSDP2 "
                        "resharding) in torch 2.13; use --zero 0, 1 or 2 or another schedule")
    if p.zero is not ZeroStage.NONE and p.dp % p.dp_shard:
        raise SpecError("run", "--dp-shard", p.dp_shard, f"must divide --dp {p.dp}")
    for name in ("steps", "warmup_steps"):
        if getattr(cfg, name) < (1 if name == "steps" else 0):
            raise SpecError("run", name, getattr(cfg, name), "steps >= 1, warm-up >= 0")
    if not 0 < cfg.lr < math.inf:
        raise SpecError("run", "--lr", cfg.lr, "must be a finite number > 0")
    if p.recompute is Recompute.FIRST_K and not 1 <= p.recompute_num_layers <= m.num_layers // p.pp:
        raise SpecError("run", "--recompute-layers", p.recompute_num_layers,
                        f"first_k needs 1..{m.num_layers // p.pp} (the layers of one pipeline stage)")
    if cfg.device is Device.CUDA:
        try:
            import torch
        except ImportError:
            return  # the launcher says torch is missing
        if not torch.cuda.is_available():
            raise SpecError("run", "--device", "cuda", "torch sees no GPU here; allowed: cpu, auto")
        if torch.cuda.device_count() < cfg.world_size:  # torchrun starts every rank on this machine
            raise SpecError("run", "ranks", cfg.world_size,
                            f"at most the {torch.cuda.device_count()} GPUs torch sees on this machine")
