"""The layers of each model chunk (virtual pipeline stage), as the cost model lays them out."""

from __future__ import annotations

from ..num import scalar
from ..plan.plan import Plan
from ..plan.space import PlanBatch
from ..sim.schedules import placement, stage_rank
from ..specs.model import ModelSpec
from ..specs.workload import Workload
from .layout import end_chunk_slots, layout


def chunk_layers(model: ModelSpec, workload: Workload, plan: Plan) -> tuple[range, ...]:
    """The layers of each virtual stage j (looped: rank j % p, chunk j // p; ZB-V's V: sim/
    schedules.py Placement), laid out as the cost model counts them (layout.layout):
    ceil(l/(p·v)) per chunk, fewer on the last chunk where slots are left for the loss and the
    multi-token-prediction modules, and on the first where another is left for the embedding
    (layout.end_chunk_slots). Spare slots beyond those two come off
    the middle ranks' chunks (the cost model times the middle stages full: conservative), last
    chunks first; with no middle rank, off the other chunks."""
    lay = layout(model, workload, PlanBatch.from_plans([plan]))
    p, v, l = plan.pp, plan.vp, model.num_layers
    L_s, slack = (int(round(scalar(x))) for x in (lay.stage_layers, lay.spare_chunk_slots))
    # the loss's (and the MTP modules') slots off the last virtual stage, the embedding's off
    # the first (under ZB-V both on the first rank)
    counts = [L_s // v] * (p * v)
    off_last, off_first = (int(x) for x in end_chunk_slots(model, L_s // v, slack))
    counts[-1] -= off_last
    counts[0] -= off_first
    spare = sum(counts) - l
    where = placement(plan.schedule)
    rank_of = [int(stage_rank(where, p, j)) for j in range(p * v)]
    inner = range(p * v - 2, 0, -1)
    for j in [j for j in inner if 0 < rank_of[j] < p - 1] + [j for j in inner if rank_of[j] in (0, p - 1)]:
        if spare <= 0:
            break
        counts[j] -= 1
        spare -= 1
    assert spare == 0 and min(counts) >= 0, (counts, l)
    starts = [sum(counts[:j]) for j in range(p * v)]
    return tuple(range(a, a + n) for a, n in zip(starts, counts))
