"""Peak memory per GPU (`metric_id = peak_memory_gib`) against measured runs
(../shared/validation/memory_dev.csv).

A row's `notes` say which of torch's counters the source reports: torchtitan and torchao log
`torch.cuda.max_memory_reserved` (torchtitan metrics.py, "memory: ... GiB"), Megatron-LM
`torch.cuda.memory_stats()['allocated_bytes.all.peak']` (training.py, mem-max-allocated-bytes).
The prediction is the cost model's live tensors at the step's worst moment (peak allocated),
and for reserved rows the caching allocator's segments around them: the allocator replayed
over the step's tensor lifetimes, with or without expandable segments as the row ran
(cost/lifetimes.py, cost/allocator.py replay_step).

Tags in `notes`: `[CONFIG-INCOMPLETE…]` a needed input is not public, so the row is skipped
with the tag as its reason; `[OOM-RUN]` the run ran out of memory, so the value is a lower
bound: such a row is reported as at or above it, and left out of the mean and max error.
Nothing is fitted to these rows: the allocator's constants and rules are torch's.
"""

from __future__ import annotations

import re

from ..cost.allocator import MemoryStat, allocated_bytes, peak_bytes
from ..errors import RowError, SpecError
from ..units import GIB

METRIC = "peak_memory_gib"
INCOMPLETE_TAG = "[CONFIG-INCOMPLETE"
OOM_TAG = "[OOM-RUN]"


def _text(row: dict) -> str:
    return (row.get("notes") or "").lower()


def incomplete_reason(row: dict) -> str | None:
    """The row's [CONFIG-INCOMPLETE…] tag (a needed input is not public), or None."""
    m = re.search(r"\[CONFIG-INCOMPLETE[^\]]*\]", row.get("notes") or "")
    return m.group(0) if m else None


def check_complete(row: dict, path: str, line: int) -> None:
    """Skip (a RowError: validate's skip path) a row tagged [CONFIG-INCOMPLETE…]."""
    tag = incomplete_reason(row)
    if tag:
        raise RowError(path, line, "notes", f"tagged {tag}: an input the prediction needs is not public")


def is_lower_bound(row: dict) -> bool:
    """A run that ran out of memory: its value is what it had reached, a lower bound."""
    return OOM_TAG.lower() in _text(row)


def memory_stat(row: dict) -> MemoryStat:
    """The counter the row's source reports, from its notes, else its framework's default
    (torchtitan: max reserved; Megatron-LM: peak allocated)."""
    notes = _text(row)
    if re.search(r"peak allocated|max_memory_allocated|allocated_bytes", notes):
        return MemoryStat.ALLOCATED
    if re.search(r"max reserved|max_reserved|peak reserved|max_memory_reserved", notes):
        return MemoryStat.RESERVED
    framework = (row.get("framework") or "").lower()
    if "torchtitan" in framework:
        return MemoryStat.RESERVED
    if "megatron" in framework:
        return MemoryStat.ALLOCATED
    raise SpecError("row", "notes", "", "notes that say whether the peak is torch's reserved or allocated memory")


def logs_last_rank(row: dict) -> bool:
    """Whether the source reports the last global rank's peak, not the largest over ranks:
    Megatron-LM logs it on the TensorBoard writer, the last rank (training.py), which holds a
    pipeline's last stage; torchtitan's tables give the largest over the ranks."""
    return bool(re.search(r"last global rank|logged rank\s*=\s*last", _text(row)))


def expandable_segments(row: dict) -> bool:
    """Whether the run's allocator used expandable segments: as the notes say, else
    torchtitan's launcher's setting (run_train.sh, formerly run_llama_train.sh, exports
    PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"); other frameworks: torch's default, off."""
    notes = _text(row)
    if "expandable_segments:false" in notes.replace(" ", ""):
        return False
    if "expandable_segments" in notes or "expandable segments" in notes:
        return True
    return "torchtitan" in (row.get("framework") or "").lower()


def predicted_peak(row: dict, memory) -> dict:
    """The row's predicted peak (GiB) with what it is made of: the counter, the allocated
    peak, the reserved one (the allocator replayed with the row's segments: the estimate's
    fragmentation), and whether the measurement is a lower bound."""
    stat = memory_stat(row)
    reserved = peak_bytes(memory, MemoryStat.RESERVED)
    return {"memory_stat": str(stat), "expandable_segments": expandable_segments(row),
            "allocated_gib": float(allocated_bytes(memory)) / GIB, "reserved_gib": float(reserved) / GIB,
            "lower_bound": is_lower_bound(row), "predicted": float(peak_bytes(memory, stat)) / GIB}


def _errors(rows: list[dict]) -> dict:
    errs = [abs(r["error_pct"]) for r in rows]
    return {"n": len(rows), "mean_abs_pct_error": sum(errs) / len(errs) if errs else None,
            "max_abs_pct_error": max(errs) if errs else None}


def memory_summary(rows: list[dict], group) -> dict | None:
    """The peak-memory section of a validation summary (None without peak-memory rows):
    errors on the predicted rows that are not lower bounds, by counter and by source (`group`
    maps a row's source to its publication), and the [OOM-RUN] rows at or above their value."""
    mine = [r for r in rows if r.get("metric_id") == METRIC]
    if not mine:
        return None
    done = [r for r in mine if r["skipped"] is None]
    exact = [r for r in done if not r.get("lower_bound")]
    bounds = [r for r in done if r.get("lower_bound")]
    by_source: dict = {}
    for r in exact:
        by_source.setdefault(group(r["source"]), []).append(r)
    return {**_errors(exact), "n_rows": len(mine), "n_skipped": len(mine) - len(done),
            "by_stat": {s: _errors([r for r in exact if r.get("memory_stat") == s]) for s in MemoryStat},
            "lower_bounds": {"n": len(bounds),
                             "at_or_above": [r["id"] for r in bounds if r["predicted"] >= r["measured"]],
                             "below": [r["id"] for r in bounds if r["predicted"] < r["measured"]]},
            "by_source": {k: _errors(v) for k, v in by_source.items()},
            # no parameter is fitted to the rows: in sample and out of source are the same
            "fitted": []}
