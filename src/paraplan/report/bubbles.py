"""Bubble filling as `paraplan estimate --fill-bubbles` prints it (cost/bubble_fill.py): the
step with and without the work, and where each pipeline rank idles and what went there."""

from __future__ import annotations

from dataclasses import asdict

from ..cost.bubble_fill import BubbleFill
from ..units import fmt_time
from .table import grid
from .width import DEFAULT_WIDTH, wrap

BUBBLE_RANKS_SHOWN = 8  # ranks in the text table; a longer pipeline shows its first and last four


def bubble_fill_text(fill: BubbleFill, width: int = DEFAULT_WIDTH) -> str:
    """The steps with and without the work, and a table of the ranks' idle time and work."""
    own = "each rank's DP traffic and optimizer step from its own last task on"
    if fill.pieces:
        head = (f"bubble filling (PipeFisher): step {fmt_time(fill.plain_step_s)} without the extra work, "
                f"{fmt_time(fill.unfilled_step_s)} with it after the pipeline, {fmt_time(fill.filled_step_s)} with it "
                f"in the bubbles and {own}; the extra work {fmt_time(fill.extra_s)} per GPU, in {fill.pieces} "
                f"pieces of {fmt_time(fill.piece_s)} that a gap takes whole")
    else:
        head = (f"bubble filling (PipeFisher): step {fmt_time(fill.plain_step_s)} with every rank's DP traffic and "
                f"optimizer step after the pipeline, {fmt_time(fill.filled_step_s)} with {own}")
    lines = [wrap(head, width)] + ([wrap("note: " + fill.note, width)] if fill.note else [])
    if not fill.ranks or fill.idle is None:
        return "\n".join(lines)
    rows = []
    p = len(fill.ranks)
    shown = range(p) if p <= BUBBLE_RANKS_SHOWN else [*range(4), *range(p - 4, p)]
    for r in shown:
        if p > BUBBLE_RANKS_SHOWN and r == p - 4:
            rows.append([f"({p - 8} more)", "", "", "", "", "", ""])
        idle, work = fill.idle.ranks[r], fill.ranks[r]
        rows.append([str(r), fmt_time(idle.warmup_s), fmt_time(idle.gaps_s), fmt_time(idle.cooldown_s),
                     fmt_time(work.after_s), fmt_time(work.in_gaps_s), fmt_time(work.exposed_s)
                     + (" *" if r == fill.binding_rank else "")])
    table = grid(["rank", "idle before", "between", "after", "own work", "extra in gaps", "exposed"], rows)
    key = ("(idle before its first task, between its tasks, after its last; own work: its DP traffic, SP "
           "norm all-reduce and optimizer step; exposed: what its idle after and before its next step's first "
           "task leave of that and of the extra work; * sets the step)")
    return "\n".join(lines) + "\n\n" + table + "\n" + wrap(key, width)


def bubble_fill_dict(fill: BubbleFill) -> dict:
    """The bubble filling for --json: the steps, and per rank its idle time and work (seconds)."""
    ranks = [{"rank": r, **({} if fill.idle is None else asdict(fill.idle.ranks[r])), **asdict(w)}
             for r, w in enumerate(fill.ranks)]
    return {"plain_step_s": fill.plain_step_s, "unfilled_step_s": fill.unfilled_step_s,
            "filled_step_s": fill.filled_step_s, "extra_s": fill.extra_s, "piece_s": fill.piece_s,
            "pieces": fill.pieces, "binding_rank": fill.binding_rank, "note": fill.note, "ranks": ranks}
