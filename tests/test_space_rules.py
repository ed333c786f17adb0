"""The plan space equals the product of its axes filtered by the validity rules (issue 32).

The enumerator (plan/space.py) applies each pruning rule as soon as the axes it reads are
bound; here the same axes are multiplied out whole, layout by layout, and filtered by every
rule at the end. The valid plans must be the same, and the candidates the search counts must
be the product less exactly the plans a pruning rule drops. Exhaustive over small clusters,
dense (MHA, GQA) and MoE models.
"""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

import numpy as np
import pytest

from paraplan.plan.axes import CPCommType, Recompute, Schedule
from paraplan.plan.space import (PlanBatch, SpaceBlock, SpaceLimits, expert_axes, invalid_mask, layouts,
                                 micro_batch_sizes, product, row_axes, rules, space_blocks)
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Precision, Workload

NAMES = [f.name for f in fields(PlanBatch)]
# narrower than the defaults, so that the whole product stays small
SMALL = dict(max_vp=4, max_micro_batch=4, recomputes=(Recompute.NONE, Recompute.FULL, Recompute.FIRST_K,
                                                      Recompute.MODULES))
CASES = [
    # (model, cluster, GPUs, seq, global batch, limits, pins)
    ("mpt-350m", "dgx-h100", 16, 2048, 16, SpaceLimits(**SMALL), {}),                       # dense, MHA
    ("llama3-8b", "dgx-h100", 16, 4096, 8, SpaceLimits(**SMALL), {}),                       # dense, GQA
    ("llama3-8b", "h100-pathways-islands", 32, 4096, 32, SpaceLimits(**SMALL), {"tp": 2}),  # islands, a pin
    ("llama3-8b", "dgx-h100", 8, 4096, 8,
     SpaceLimits(**SMALL, sequence_parallel=(True,), tp_overlap=(False,),
                 cp_comm_types=(CPCommType.ALL_GATHER,)), {}),                                 # an engine's bounds
    ("mixtral-8x7b", "dgx-h100", 16, 4096, 16, SpaceLimits(**SMALL, capacity_factors=(None, 1.25)), {}),  # MoE
    ("qwen3-30b-a3b", "dgx-h100", 16, 4096, 16,
     SpaceLimits(**SMALL, schedules=(Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B, Schedule.DUAL_PIPE_V)),
     {"micro_batch_size": 1}),                                                                 # MoE, GQA
]


def _case(model, cluster, n, seq, batch):
    return (load_model(model), load_cluster(cluster, num_gpus=n),
            Workload(global_batch_size=batch, seq_len=seq, precision=Precision("bf16")))


def _rows(batch: PlanBatch) -> np.ndarray:
    """The plans as rows of numbers, sorted (a multiset that compares with ==)."""
    a = np.stack([np.asarray(getattr(batch, n), dtype=float) for n in NAMES], axis=1)
    return a[np.lexsort(a.T[::-1])] if len(a) else a


def _whole_product(model, cluster, workload, limits, fixed, layout) -> PlanBatch:
    """Every plan of one layout: the axes' domains multiplied out, no rule applied."""
    rows = product(row_axes(model, cluster, limits, fixed, layout), layout, [])
    experts = product(expert_axes(cluster, limits, fixed, layout), layout, [])
    block = SpaceBlock(layout=layout, rows=rows, experts=experts,
                       micro_batches=tuple(micro_batch_sizes(limits, fixed)), kernel_code=2, limits=limits)
    return block.candidates()


@pytest.mark.parametrize("model_name,cluster_name,n,seq,batch,limits,fixed", CASES)
def test_enumeration_is_the_product_filtered_by_the_rules(model_name, cluster_name, n, seq, batch, limits, fixed):
    model, cluster, workload = _case(model_name, cluster_name, n, seq, batch)
    blocks = space_blocks(model, cluster, workload, limits, fixed)
    kernel = blocks[0].kernel_code
    all_rules = rules(model, cluster, workload)
    pruning = [r for r in all_rules if r.prunes]
    total_valid = 0
    for layout in layouts(model, cluster, limits, fixed):
        ours = [b for b in blocks if b.layout == layout]
        whole = _whole_product(model, cluster, workload, limits, fixed, layout)
        whole = PlanBatch(**{**{f: getattr(whole, f) for f in NAMES},
                             "attention_code": np.full(len(whole), kernel, dtype=np.int64)})
        pruned = np.zeros(len(whole), dtype=bool)
        for rule in pruning:
            pruned |= rule.invalid(whole)
        candidates = [b.candidates() for b in ours]
        counted = PlanBatch.concat(candidates) if candidates else whole.take(np.zeros(0, dtype=np.int64))
        # the candidates counted: the product less what the pruning rules drop, each plan once
        assert np.array_equal(_rows(counted), _rows(whole.take(~pruned))), layout
        valid = [b.materialize(model, cluster, workload)[0] for b in ours]
        got = _rows(PlanBatch.concat(valid)) if valid else np.zeros((0, len(NAMES)))
        want = _rows(whole.take(~invalid_mask(whole, model, cluster, workload)))
        assert np.array_equal(got, want), layout
        total_valid += len(want)
    assert total_valid > 0  # (a case that cannot fail is no test)


@pytest.mark.parametrize("model_name,cluster_name,n,seq,batch,limits,fixed", CASES[:1] + CASES[4:5])
def test_each_rule_reads_only_the_axes_it_names(model_name, cluster_name, n, seq, batch, limits, fixed):
    """A rule evaluated on just the axes it declares gives the mask it gives on whole plans (an
    undeclared axis would raise: the enumerator could apply it before that axis is bound)."""
    model, cluster, workload = _case(model_name, cluster_name, n, seq, batch)
    layout = layouts(model, cluster, limits, fixed)[-1]
    whole = _whole_product(model, cluster, workload, limits, fixed, layout)
    for rule in rules(model, cluster, workload):
        view = SimpleNamespace(**{a: getattr(whole, a) for a in rule.reads})
        assert np.array_equal(np.broadcast_to(rule.invalid(view), (len(whole),)), rule.invalid(whole)), rule.name


def test_the_pruning_rules_do_prune():
    """Where a pruning rule holds back plans, the search never counts them: a layout of the
    MoE case whose product holds plans each pruning stage drops."""
    model, cluster, workload = _case("mixtral-8x7b", "dgx-h100", 16, 4096, 16)
    limits = SpaceLimits(**SMALL)
    counted = sum(b.num_candidates for b in space_blocks(model, cluster, workload, limits))
    whole = sum(len(_whole_product(model, cluster, workload, limits, {}, layout))
                for layout in layouts(model, cluster, limits, {}))
    assert 0 < counted < whole
