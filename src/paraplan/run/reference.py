"""The single-process run a parallel run must reproduce: the same model, seed, data and
optimizer, the whole global batch in one forward and backward, no torch.distributed."""

from __future__ import annotations

import torch

from .config import RunConfig
from .model import build_model, loss_fn
from .worker import synthetic_batch


def single_process_run(cfg: RunConfig) -> tuple[list[float], list[float]]:
    """(loss, gradient norm) of every step (warm-up included), in fp32 on the CPU."""
    model = build_model(cfg.model, cfg.workload.seq_len, cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    losses, norms = [], []
    for step in range(cfg.warmup_steps + cfg.steps):
        inputs, labels = synthetic_batch(cfg, step)
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        norms.append(float(torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))))
        losses.append(float(loss.detach()))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return losses, norms
