"""Lines the training commands print beside their results: the header naming the model,
cluster and workload, notes on the sequence length, and advice for a plan that does not fit."""

from __future__ import annotations

from ..report.table import unchecked_note
from ..report.width import DEFAULT_WIDTH, wrap
from ..search.advice import memory_headroom, misfit_advice
from ..units import fmt_count
from .args import exporter_from_args, support_from_args


def seq_notes(model, wl) -> list[str]:
    """What the user may not know about the sequence length asked for (also under --json)."""
    if model.max_seq_len and wl.seq_len > model.max_seq_len:
        return [f"note: --seq {wl.seq_len:,} is longer than {model.name}'s max_seq_len of {model.max_seq_len:,}: "
                "predicted as asked; training at it needs the positions extended (e.g. RoPE scaling)"]
    return []


def header(model, cluster, wl, suffix: str = "", width: int = DEFAULT_WIDTH) -> str:
    """The model, cluster and workload in a line, and the notes on them, wrapped at `width`."""
    notes = [n for n in [unchecked_note([cluster.gpu])] + seq_notes(model, wl) if n]
    return "\n".join(wrap(line, width, indent=2) for line in [
        f"{model.name} ({fmt_count(model.num_params)} params) on {cluster.num_gpus} × {cluster.gpu.name} "
        f"({cluster.name}); batch {wl.global_batch_size} × {wl.seq_len} tokens, {wl.precision_label}{suffix}"] + notes)


def _engine_check(args, model, wl):
    """--engine's rules as a function that raises for a plan the engine cannot run (or None)."""
    mod = exporter_from_args(args, wl, model)
    return None if mod is None else (lambda p: mod.check(support_from_args(mod, args).adapt(p), model, wl))


def headroom_for(args, model, cluster, wl, est):
    """The memory a plan that fits leaves, and the single change (under --engine's rules) that
    frees most (search/advice.py); None for a plan that does not fit."""
    return memory_headroom(model, cluster, wl, est, _engine_check(args, model, wl)) if est.fits else None


def misfit_advice_for(args, model, cluster, wl, est):
    """('', []) for a plan that fits; else the line saying why not and which single change of
    its flags would fit (search/advice.py), under --engine's rules, with the changes."""
    if est.fits:
        return "", []
    return misfit_advice(model, cluster, wl, est, _engine_check(args, model, wl))
