"""The pipeline hand-off between two TP groups as published.

Narayanan et al. SC'21, Sec. 4.1 ("Scatter/gather communication optimization"): with tensor
parallelism t and the boundary activation replicated on every rank of a TP group, the naive
hand-off sends the whole b·s·h tensor over each of the t InfiniBand links between the two
stages; splitting it into t chunks on the sender, sending one chunk over each link and
all-gathering over NVLink on the receiver sends b·s·h / t per link. Zhuang et al. (MLSys 2023)
generalise this to any pair of layouts (cross-mesh resharding; cost/reshard.py). The
published figure reproduced here is that per-link volume, for the paper's GPT-3 175B
(h = 12,288, s = 2,048, b = 1, t = 8: Table 1's 175B row), and the gather that follows.
(Zhuang et al.'s own microbenchmark figures were not available offline: docs/model/mixed.md.)
"""

from __future__ import annotations


from paraplan.cost.reshard import BoundaryLayout, crossing_volumes, direct_volumes, reshard
from paraplan.specs.catalog import load_cluster

H, S, B, T = 12_288, 2_048, 1, 8
X = 2 * B * S * H  # fp16 bytes of the boundary activation


def test_scatter_gather_sends_bsh_over_t_per_link():
    replicated = BoundaryLayout(T, False)
    _, per_link, gather = crossing_volumes(replicated, replicated, X)
    assert per_link == X / T                     # Sec. 4.1: b·s·h / t per InfiniBand link
    assert gather == X * (T - 1) / T             # the all-gather over NVLink completes each receiver
    _, naive_link = direct_volumes(replicated, replicated, X)
    assert naive_link == X                       # without it: the whole tensor over every link


def test_the_cheaper_delivery_is_scatter_gather_on_a_dgx_a100():
    """Over Selene's 200 Gb/s HDR links with 300 GB/s of NVLink inside the node, the
    scatter/gather hand-off is the one paraplan prices, and it is faster than the naive one."""
    a100 = load_cluster("dgx-a100-80gb")
    r = reshard(a100.scaleout, a100, BoundaryLayout(T, False), BoundaryLayout(T, False), X)
    assert r.strategy == "send once + local all-gather" and r.per_link_bytes == X / T
    naive_s = a100.scaleout.latency_s + X / (a100.scaleout.bw_unidir_bytes_per_s * a100.scaleout.efficiency.at(X))
    assert r.seconds < naive_s / 2
