"""One rank of `paraplan run`, started by torchrun: build, parallelize, train, measure.

Mesh (outermost first): pp × dp_replicate × dp_shard × tp, tp innermost so that tensor-
parallel ranks are neighbours (NVLink on a GPU node). Rank 0 gathers every rank's record
and writes the report (report.py); all ranks then meet at a barrier and leave the process
group before exiting, so that no rank tears the group down under another.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import replace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from ..cost.chunks import chunk_layers
from ..plan.axes import ZeroStage
from .attention import run_kernel
from .checkpointing import apply_checkpointing
from .config import Device, RunConfig, computes_in_bf16, runs_under_autocast
from .data_parallel import apply_fsdp
from .measure import grad_norm, now_s, peak_memory_bytes, peak_rss_bytes
from .model import build_model, loss_fn
from .pipeline import make_schedule, make_stage, stage_ids
from .searched import run_actions
from .tensor_parallel import apply_tensor_parallel, reduce_partial_grads


def _local(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of a loss, which loss_parallel returns as a replicated DTensor."""
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def pick_device(cfg: RunConfig, local_rank: int) -> torch.device:
    if cfg.device is Device.CUDA or (cfg.device is Device.AUTO and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def synthetic_batch(cfg: RunConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of one step: uniform random tokens from a generator seeded by
    (seed, step), so that every plan and the single-process reference see the same data."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 7919 * (step + 1))
    tokens = torch.randint(0, cfg.model.vocab_size, (cfg.workload.global_batch_size, cfg.workload.seq_len + 1),
                           generator=gen)
    return tokens[:, :-1], tokens[:, 1:]


class Runner:
    """The parallelized model of one rank and its step function."""

    def __init__(self, cfg: RunConfig, device: torch.device):
        p = cfg.plan
        self.cfg, self.device = cfg, device
        dp_shard = p.dp_shard if p.zero is not ZeroStage.NONE else 1
        dims = (p.pp, p.dp // dp_shard, dp_shard, p.tp)
        self.mesh = init_device_mesh(device.type, dims, mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"))
        self.pp_rank = self.mesh["pp"].get_local_rank()
        self.tp_rank = self.mesh["tp"].get_local_rank()
        self.dp_rank = self.mesh["dp_replicate"].get_local_rank() * dp_shard + self.mesh["dp_shard"].get_local_rank()
        gloo = dist.get_backend() == "gloo"
        bf16 = computes_in_bf16(device.type, cfg.workload.precision)
        self.compute_dtype = torch.bfloat16 if bf16 else torch.float32
        num_stages = p.pp * p.vp
        self.stage_ids = stage_ids(self.pp_rank, p.pp, p.vp, p.schedule)
        self.modules = []
        # each virtual stage's layers where the cost model and the simulator put them (an
        # uneven split: the embedding's and the head's chunks lighter, spare slots off the middle)
        layers = chunk_layers(cfg.model, cfg.workload, p)
        for sid in self.stage_ids:
            m = build_model(cfg.model, cfg.workload.seq_len, cfg.seed, stage=sid, num_stages=num_stages,
                            layer_ids=layers[sid]).to(device)
            if p.tp > 1:
                apply_tensor_parallel(m, self.mesh["tp"], sequence_parallel=p.sequence_parallel)
            apply_checkpointing(m, p.recompute, p.recompute_num_layers)
            if p.compiled:  # each block, after TP and checkpointing and before FSDP, as torchtitan does
                for block in m.layers.values():
                    block.compile()
            if p.dp > 1:
                apply_fsdp(m, self.mesh["dp_replicate", "dp_shard"], zero=p.zero,
                           param_dtype=self.compute_dtype if bf16 else None, gloo=gloo)
            self.modules.append(m)
        # FSDP casts parameters itself; without it a GPU run computes under autocast.
        self.autocast = runs_under_autocast(p, device.type, cfg.workload.precision)
        self.params = [q for m in self.modules for q in m.parameters()]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=0.0)
        self.schedule = None
        if p.pp > 1:
            stages = [make_stage(m, sid, num_stages, device, self.mesh["pp"].get_group())
                      for m, sid in zip(self.modules, self.stage_ids)]
            actions = run_actions(p, cfg.num_microbatches) if cfg.schedule_search else None
            self.schedule = make_schedule(p.schedule, stages, cfg.num_microbatches, loss_fn, actions)
        self.has_first = 0 in self.stage_ids
        self.has_last = num_stages - 1 in self.stage_ids

    def _autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.autocast)

    def _loss_context(self):
        """Cross-entropy on vocabulary-sharded logits under TP (tensor_parallel.py), forward and
        backward both inside it, as torchtitan's train context does."""
        if self.cfg.plan.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel
            return loss_parallel()
        return contextlib.nullcontext()

    def forward_backward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """Forward and backward of this rank's share of one step; the rank's mean loss, or
        None on ranks without the last pipeline stage."""
        if self.schedule is not None:
            losses: list[torch.Tensor] = []
            # return_outputs=False: the last stage keeps no micro-batch's output to the step's
            # end (torch's default does, for the merged return; Plan.pp_kept_output_bytes 0)
            with self._autocast(), self._loss_context():
                if self.has_first:
                    self.schedule.step(inputs, target=labels, losses=losses, return_outputs=False)
                else:
                    self.schedule.step(target=labels, losses=losses, return_outputs=False)
            return torch.stack([_local(x.detach()).float() for x in losses]).mean() if self.has_last else None
        (model,) = self.modules
        m = self.cfg.num_microbatches
        total = torch.zeros((), device=self.device)
        fsdp = self.cfg.plan.dp > 1
        for i, (x, y) in enumerate(zip(inputs.chunk(m), labels.chunk(m))):
            zero = self.cfg.plan.zero
            if fsdp and zero is not ZeroStage.PARAMETERS:
                # below ZeRO-3 the parameters stay gathered until the step's last backward
                # (gathered once per step); ZeRO-0/1 accumulate gradients locally and reduce
                # once per step, ZeRO-2 reduce-scatters every micro-batch into sharded
                # gradients; ZeRO-3 gathers and reduce-scatters every micro-batch (as the
                # cost model prices them)
                if zero is not ZeroStage.GRADIENTS:
                    model.set_requires_gradient_sync(i == m - 1)
                model.set_reshard_after_backward(i == m - 1)
            with self._loss_context():
                with self._autocast():
                    loss = loss_fn(model(x), y) / m
                loss.backward()
            total += _local(loss.detach()).float()
        return total

    def step(self, step: int) -> dict:
        inputs, labels = synthetic_batch(self.cfg, step)
        b = self.cfg.local_batch_size
        inputs = inputs[self.dp_rank * b:(self.dp_rank + 1) * b].to(self.device)
        labels = labels[self.dp_rank * b:(self.dp_rank + 1) * b].to(self.device)
        dist.barrier()
        t0 = now_s(self.device)
        loss = self.forward_backward(inputs, labels)
        if self.cfg.plan.tp > 1:
            reduce_partial_grads(self.params)
        t1 = now_s(self.device)
        norm = grad_norm(self.params, self.mesh["pp"].get_group() if self.cfg.plan.pp > 1 else None)
        t2 = now_s(self.device)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        t3 = now_s(self.device)
        return {"step_time_s": (t1 - t0) + (t3 - t2), "grad_norm": norm,
                "loss": float(loss) if loss is not None else None}


def run(cfg: RunConfig, *, from_cli: bool = True) -> int:
    """One worker's run. `from_cli`: started by `paraplan run` (`--config`), which reads a
    refusal from the report it waits for; started by hand with torchrun, the worker says it."""
    from .report import build_report, refused_report, write_report
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = pick_device(cfg, int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        refusal = _preflight(cfg, device)
        if refusal:
            if rank == 0 and from_cli:  # (into paraplan run's temporary directory)
                write_report(cfg.output, refused_report(refusal))
            elif rank == 0:  # torchrun by hand: nothing at -o, the reason on stderr
                sys.stderr.write(f"paraplan: error: run: {refusal}\n")
            dist.barrier()
            # paraplan run's workers exit cleanly and it says the refusal in one line
            return 0 if from_cli else 2
        baseline_rss = peak_rss_bytes()
        runner = Runner(cfg, device)
        # the attention kernel torch picks for these shapes and whether autocast runs, so
        # that the report predicts what ran
        kernel = run_kernel(cfg.model.num_heads // cfg.plan.tp, cfg.model.num_kv_heads // cfg.plan.tp,
                            cfg.workload.seq_len, cfg.model.head_dim, device, runner.compute_dtype)
        cfg = replace(cfg, plan=replace(cfg.plan, attention=kernel, autocast=runner.autocast))
        records = [runner.step(i) for i in range(cfg.warmup_steps + cfg.steps)]
        peak, kind = peak_memory_bytes(device, baseline_rss)
        mine = {"rank": rank, "pp_rank": runner.pp_rank, "dp_rank": runner.dp_rank, "tp_rank": runner.tp_rank,
                "has_last_stage": runner.has_last, "steps": records, "peak_memory_bytes": peak,
                "memory_kind": kind, **torch_peak_memory(device),
                "peak_rss_bytes": peak_rss_bytes(), "baseline_rss_bytes": baseline_rss,
                "compute_dtype": str(runner.compute_dtype).removeprefix("torch."),
                "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)
        if rank == 0:
            write_report(cfg.output, build_report(cfg, gathered, device=device.type, backend=dist.get_backend(),
                                                  torch_version=torch.__version__))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def torch_peak_memory(device: torch.device) -> dict:
    """torch's two peak counters since the process started: live tensors
    (max_memory_allocated) and the caching allocator's segments (max_memory_reserved, what
    torchtitan logs), which cost/allocator.py predicts; on a CPU neither is measured (None)."""
    if device.type != "cuda":
        return {"peak_allocated_bytes": None, "peak_reserved_bytes": None}
    return {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(device))}


def _available_bytes(device: torch.device) -> tuple[float, str]:
    """(bytes this rank may use, what they are): a GPU's free memory; on a CPU the host's
    available memory over the ranks on it (inf where the OS does not say)."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0]), f"free on {torch.cuda.get_device_name(device)}"
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
        return kib * 1024.0 / ranks, f"available per rank on this host ({ranks} rank(s))"
    except (OSError, StopIteration, ValueError):
        return float("inf"), ""


def _preflight(cfg: RunConfig, device: torch.device) -> str:
    """The refusal every rank agrees on ("" to run): the model's memory against the least any
    rank has, before a model larger than the device is built."""
    from ..errors import ParaplanError
    from .report import preflight_bytes, preflight_refusal
    have, where = _available_bytes(device)
    least = torch.tensor([have], dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    try:
        need = preflight_bytes(cfg, device.type)
    except ParaplanError:  # a plan the cost model does not price: the run itself decides
        return ""
    return preflight_refusal(need, float(least.item()), where)


def main(argv: list[str] | None = None) -> int:
    """Entry of a torchrun worker (RANK, WORLD_SIZE set): parse, check, run."""
    from ..errors import ParaplanError
    from .cli import config_from_argv
    try:
        cfg = config_from_argv(sys.argv[1:] if argv is None else argv)
        if int(os.environ["WORLD_SIZE"]) != cfg.world_size:
            from ..errors import SpecError
            raise SpecError("run", "WORLD_SIZE", int(os.environ["WORLD_SIZE"]),
                            f"must equal tp×pp×dp={cfg.world_size} of the plan")
    except ParaplanError as exc:
        sys.stderr.write(f"paraplan: error: {exc}\n")
        return 2
    args = sys.argv[1:] if argv is None else argv
    return run(cfg, from_cli=bool(args) and args[0] == "--config")
