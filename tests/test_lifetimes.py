"""Fragmentation from lifetimes (issue 34 item 5): the caching allocator replayed over a step's
tensors (cost/allocator.py replay_step, cost/lifetimes.py step_events)."""

from __future__ import annotations

import pytest

from paraplan import api
from paraplan.cost.allocator import LARGE_BUFFER_BYTES, replay_step
from paraplan.cost.lifetimes import loss_sequences, step_events
from paraplan.cost.memory import logits_bytes_per_element
from paraplan.plan.axes import Recompute, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import load_model
from paraplan.specs.workload import Precision, Workload
from paraplan.units import GIB

G = GIB


def _peak_live(events) -> float:
    live, peak = {}, 0.0
    for key, size in events:
        if size is None:
            live.pop(key)
        else:
            live[key] = size
        peak = max(peak, sum(live.values()))
    return peak


@pytest.mark.parametrize("kind, fused, compiled, parallel", [
    ("fused", True, False, False), ("compiled", False, True, False),
    ("parallel", False, False, True), ("eager", False, False, False)])
def test_each_loss_sequence_peaks_at_the_static_models_bytes_per_logit(kind, fused, compiled, parallel):
    fwd, bwd = loss_sequences(kind, 2.0)
    events = [(n, b) for n, b in fwd + bwd + [("grad", None)] if b != 0.0]
    assert _peak_live(events) == logits_bytes_per_element(Precision.BF16, fused, compiled, parallel)


def test_best_fit_splits_and_merges_within_a_segment():
    # expandable: one range; a freed 12 GiB hole takes an 8 GiB tensor, the next 8 GiB grows it
    ev = [("a", 8 * G), ("b", 4 * G), ("c", 8 * G), ("b", None), ("a", None), ("d", 8 * G), ("e", 8 * G)]
    peaks = replay_step(ev, expandable=True)
    assert peaks.allocated_bytes == 24 * G
    assert 28 * G <= peaks.reserved_bytes < 28 * G + LARGE_BUFFER_BYTES
    # without: a and b were separate segments, so their holes never merge: d reuses a's, e opens one
    assert replay_step(ev, expandable=False).reserved_bytes == 28 * G


def test_a_hole_a_request_fits_is_reused_without_growing():
    ev = [("a", 8 * G), ("b", 8 * G), ("a", None), ("c", 6 * G), ("d", 2 * G)]
    assert replay_step(ev, expandable=False).reserved_bytes == 16 * G


def test_a_block_cached_on_one_stream_never_serves_another():
    # FSDP's all-gather buffers live on their own stream: the compute stream's request opens
    # a segment of its own even though an all-gather block of the size is free
    ev = [("g", 4 * G, 1), ("g", None), ("x", 4 * G)]
    assert replay_step(ev, expandable=False).reserved_bytes == 8 * G
    assert replay_step([("g", 4 * G), ("g", None), ("x", 4 * G)], expandable=False).reserved_bytes == 4 * G


def test_segments_wholly_free_are_released_before_passing_the_capacity():
    ev = [("a", 8 * G), ("a", None), ("b", 10 * G)]
    assert replay_step(ev, expandable=False).reserved_bytes == 18 * G
    assert replay_step(ev, expandable=False, capacity_bytes=12 * G).reserved_bytes == 10 * G


def test_the_eager_loss_leaves_two_bytes_per_logit_of_holes():
    # forward: 16-bit logits, their fp32 upcast and log-softmax; the upcast and the logits go
    # (a 6 B hole); backward: NLL's gradient takes 4 B of it, log-softmax's input gradient (4 B)
    # fits no hole and grows the range: reserved 14 B per logit, allocated 12
    fwd, bwd = loss_sequences("eager", 2.0)
    n = 2 ** 30 / 2.0  # logits of one GiB in 16 bits
    peaks = replay_step([(k, None if b is None else b * n) for k, b in fwd + bwd], expandable=True)
    assert peaks.allocated_bytes == pytest.approx(12 * n)
    assert peaks.reserved_bytes == pytest.approx(14 * n, abs=2 * LARGE_BUFFER_BYTES)  # whole 20-MiB pages


def test_the_replay_covers_each_microbatch_layer_and_frees_what_it_makes():
    model = load_model("llama3-8b")
    wl = Workload(global_batch_size=16, seq_len=4096)
    plan = make_plan(tp=1, pp=4, dp=2, micro_batch_size=1, recompute=Recompute.FULL, zero=ZeroStage.OPTIMIZER)
    events = step_events(model, wl, plan)
    made = [e[0] for e in events if e[1] is not None]
    freed = [e[0] for e in events if e[1] is None]
    # every tensor but the persistent states is freed within the step
    assert set(made) - set(freed) == {"weights", "gradients", "optimizer"}
    # rank 0 of 1F1B with 8 micro-batches: 8 layers' saved inputs per micro-batch
    assert sum(1 for k in made if len(k) == 3 and k[1] == "saved") == 8 * 8


def test_estimate_prices_the_replayed_fragmentation_with_either_allocator():
    # torchtitan's eager loss at 16k tokens: the replay's holes are GiBs, not the 5% share
    kw = dict(gpus=8, seq_len=16384, global_batch_size=8, tp=1, dp=8, micro_batch_size=1, zero="3", recompute="full",
              fused_kernels=False)
    default = api.estimate("llama3-8b", "dgx-h100", **kw)
    expandable = api.estimate("llama3-8b", "dgx-h100", expandable_segments=True, **kw)
    logits = 16384 * 128256
    assert default.memory.fragmentation_bytes >= 2.0 * logits
    assert expandable.memory.fragmentation_bytes >= 2.0 * logits
    assert expandable.memory.total - expandable.memory.fragmentation_bytes == pytest.approx(
        default.memory.total - default.memory.fragmentation_bytes)
