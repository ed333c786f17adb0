"""The serving simulation times a run of decode-only iterations at once (batching.py); the
result must be what iterating one by one gives, bit for bit, whatever the load, batching
policy, pipeline or sliding window."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from paraplan.inference.batching import simulate
from paraplan.inference.deploy import EngineLimits, ServePlan, StoreDtype, Traffic
from paraplan.inference.step import IterationModel
from paraplan.specs.catalog import load_cluster, load_model

CASES = [("llama3-8b", 1, 1, False), ("llama3-70b", 4, 2, False), ("gpt-oss-120b", 2, 1, True)]
LOADS = [{}, {"rate_rps": 2.0}, {"rate_rps": 40.0}, {"concurrency": 8}]


@pytest.mark.parametrize("name,tp,pp,window", CASES)
def test_decode_runs_equal_iterating_one_by_one(name, tp, pp, window):
    model = load_model(name)
    cluster = load_cluster("dgx-h100", num_gpus=tp * pp)
    plan = ServePlan(tp=tp, pp=pp, replicas=1, weight_dtype=StoreDtype.BF16, kv_dtype=StoreDtype.BF16)
    step = IterationModel(model, cluster, plan)
    compared = 0
    for chunked, (isl, osl), load, max_batch in itertools.product(
            (False, True), [(128, 300), (2048, 64), (32, 300), (500, 1)], LOADS, (256, 16)):
        limits = EngineLimits(chunked_prefill=chunked, max_batch=max_batch, max_num_tokens=max(8192, isl),
                              sliding_window_kv=window)
        traffic = Traffic(prompt_tokens=isl, output_tokens=osl, num_requests=60, **load)
        fast = simulate(step, traffic, limits, 40_000)
        slow = simulate(step, traffic, limits, 40_000, decode_runs=False)
        for f in ("ttft_s", "tpot_s", "e2e_s"):
            assert np.array_equal(getattr(fast, f), getattr(slow, f)), (isl, osl, load, f)
        assert (fast.num_iterations, fast.max_concurrency, fast.makespan_s) == \
            (slow.num_iterations, slow.max_concurrency, slow.makespan_s)
        compared += 1
    assert compared == 64
