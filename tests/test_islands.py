"""Groups and pipelines that leave an island (a pod) cross the data-center tier
(cost/comm.py): the all-to-alls send the share bound for other islands over it, and a
pipeline hop between islands shares the island's uplinks with the rest of its stage only."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.cost.comm import Collective, collective_time_s, deduplicated_dispatch_s, pipeline_hops_s
from paraplan.specs.catalog import load_cluster

ISLANDS = load_cluster("h100-pathways-islands", num_gpus=4096)   # islands of 1,024
FLAT = replace(ISLANDS, gpus_per_island=0, dcn=None)
SMALL = replace(ISLANDS, gpus_per_island=64)                      # islands of 64


def _flat(cluster, n):
    return collective_time_s(cluster, Collective.ALL_TO_ALL, 64e6, n, 1)


def _deduplicated(cluster, n):
    """A top-8 dispatch of 80 MB of tokens reaching 4 of the 16 nodes and 6 of the 128 GPUs:
    its network part, not the NVLink forwarding, sets the time at this size."""
    return deduplicated_dispatch_s(cluster, 80e6, 4.0, 6.0, n, 1)


@pytest.mark.parametrize("dispatch", [_flat, _deduplicated])
def test_an_all_to_all_across_islands_pays_the_data_center_tier(dispatch):
    inside = dispatch(ISLANDS, 128)
    assert float(inside) == pytest.approx(float(dispatch(FLAT, 128)))
    # two islands of 64: half of each GPU's buffer crosses at 12.5 GB/s instead of 50
    across = float(dispatch(SMALL, 128))
    assert across > 1.5 * float(inside)
    # a slower data-center tier slows it further; a faster scale-out network alone does not
    slow_dcn = replace(SMALL, dcn=replace(SMALL.dcn, bw_unidir_bytes_per_s=SMALL.dcn.bw_unidir_bytes_per_s / 2))
    assert float(dispatch(slow_dcn, 128)) > 1.5 * across


def test_a_pipeline_hop_between_islands_shares_the_uplinks_with_its_stage():
    """The tier's per-GPU rate holds when every GPU of an island crosses; a hop sends from one
    stage's ranks: 64 stages 8 ranks apart (one node each) cross an island of 64 once per 8 hops,
    each at the scale-out rate (8 senders share 64 GPUs' uplinks); stages an island apart send
    from every GPU at the tier's own rate."""
    B = 32e6
    _, total, slowest = pipeline_hops_s(SMALL, B, 64, 8, 8)
    _, total_flat, slowest_flat = pipeline_hops_s(FLAT, B, 64, 8, 8)
    eff = SMALL.dcn.efficiency.at(B) / SMALL.scaleout.efficiency.at(B)
    # 7 island crossings, each at the scale-out rate but the tier's latency and efficiency curve
    assert slowest > slowest_flat
    assert slowest - SMALL.dcn.latency_s == pytest.approx((slowest_flat - SMALL.scaleout.latency_s) / eff)
    assert total - total_flat == pytest.approx(7 * (slowest - slowest_flat))
    _, _, far = pipeline_hops_s(SMALL, B, 4, 64, 8)   # stride = island: all its GPUs send at once
    rate = SMALL.dcn.bw_unidir_bytes_per_s * SMALL.dcn.efficiency.at(B)
    assert far == pytest.approx(SMALL.dcn.latency_s + B / rate)
