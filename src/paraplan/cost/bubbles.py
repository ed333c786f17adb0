"""Pipeline bubbles in closed form: ZB-V's and DualPipeV's, derived from their task orders.

Legend: p pipeline ranks, m micro-batches per step, q = p − 1; f, b, w a chunk's forward,
input-gradient and weight-gradient seconds; c one send between ranks.
"""

from __future__ import annotations

import numpy as np

def zbv_bubble_s(p, m, f, b, w, c):
    """Idle time of ZB-V's busiest rank beyond its work, in torch's order (sim/schedules.py
    _zero_bubble_v), with every chunk taking f forward, b input-gradient and w weight-gradient
    seconds and each send between ranks c. Derived, not published (Qi et al. 2024 Sec. 6 give
    only the zero bubble at f = b = w, c = 0, which this order leaves at q·f, its warm-up's
    offset): a fixed task order's makespan is its longest path, so the bubble is the largest
    of the paths' linear forms in (f, b, w, c). With q = p − 1:
    - m ≥ 2p − 1 (the V full; the bubble no longer depends on m): the fourteen forms below;
    - m ≤ p: the four of `_zbv_few`;
    - in between: the step interpolated linearly in m between those two ends (removing
      micro-batches from a fixed order only shortens it, so the step lies between them).
    The event simulator's critical paths take exactly these forms for sends up to 30% of the
    shortest pass; the interpolation stays within 7% of the step (tests/test_zbv.py).
    Vectorized."""
    p, m = np.asarray(p, dtype=float), np.asarray(m, dtype=float)
    q = p - 1.0
    f, b, w, c = (np.asarray(x, dtype=float) for x in (f, b, w, c))
    forms = (
        q * b + (5 * q - 2) * c,
        (2 * q - 1) * f - (q - 1) * b + (3 * q - 2) * c,
        b + (q - 1) * w + 3 * q * c,
        2 * q * (b - w) + (6 * q - 2) * c,
        2 * q * f - q * b - w + 3 * q * c,
        f + (q - 1) * w + (3 * q - 2) * c,
        2 * q * f - (2 * q + 1) * w + 4 * q * c,
        (2 * q - 1) * f + b - 2 * q * w + (4 * q - 2) * c,
        (q - 1) * f + b + (5 * q - 2) * c,
        q * f - w + 5 * q * c,
        2 * q * b - (2 * q + 1) * w + 6 * q * c,
        q * (f + b) - (2 * q + 1) * w + 6 * q * c,
        q * b - w + 5 * q * c,
        (q - 1) * f + (q + 1) * b - 2 * q * w + (6 * q - 2) * c,
    )
    full = np.maximum(np.maximum.reduce(np.broadcast_arrays(*forms)), 0.0)
    per_mb = 2.0 * (f + b + w)  # a rank's work per micro-batch: two chunks
    at_p = _zbv_few(q, p, f, b, w, c) + p * per_mb  # the step at m = p ...
    at_full = full + (2.0 * q + 1.0) * per_mb       # ... and at m = 2p − 1
    between = at_p + (m - p) / np.maximum(q, 1.0) * (at_full - at_p) - m * per_mb
    out = np.where(m <= p, _zbv_few(q, m, f, b, w, c), np.where(m >= 2.0 * q + 1.0, full, between))
    return np.where(q > 0, np.maximum(out, 0.0), 0.0)


def dualpipev_bubble_s(p, m, f, b, w, c):
    """Idle time of DualPipeV's busiest rank beyond its work, in torch's order (sim/schedules.py
    _dual_pipe_v; m ≥ 2p), each chunk taking f forward, b input-gradient and w weight-gradient
    seconds (a full backward b + w, a forward-backward pair f + b + w: the pair's overlap is
    priced into the passes, not here), each send between ranks c. With q = p − 1 and
    n = m − 2p, the largest of four forms, read off the simulator's critical paths like
    zbv_bubble_s's (derived):
        2q·f,  2q·f + q(b − w),  (q − 1)f + q(2b − w),  (q − 1)f + q·b,
    plus (5q − 2), (6q − 2), (8q − 2), (7q − 2) sends, each + 2(n − ⌊(n − 2 + p)/p⌋): the
    steady state's pairs wait on their neighbour's, so every send there lengthens the step,
    in p − 1 of every p micro-batches. At f = b = w and c = 0 that is 2q·f, DeepSeek-V3's
    (PP/2 − 1)(F&B + B − 3W) with F&B = F + B (DeepSeek-AI 2024, Table 2; PP = 2p chunks).
    Exact against the simulator for p ≤ 12 and sends up to 30% of the shortest pass
    (tests/test_dualpipev.py). Vectorized."""
    p, m = np.asarray(p, dtype=float), np.asarray(m, dtype=float)
    q = p - 1.0
    f, b, w, c = (np.asarray(x, dtype=float) for x in (f, b, w, c))
    n = np.maximum(m - 2.0 * p, 0.0)
    grow = 2.0 * (n - np.floor((n - 2.0 + p) / np.maximum(p, 1.0)))
    out = np.maximum.reduce(np.broadcast_arrays(
        2 * q * f + (5 * q - 2 + grow) * c,
        2 * q * f + q * (b - w) + (6 * q - 2 + grow) * c,
        (q - 1) * f + q * (2 * b - w) + (8 * q - 2 + grow) * c,
        (q - 1) * f + q * b + (7 * q - 2 + grow) * c))
    return np.where(q > 0, np.maximum(out, 0.0), 0.0)


def _zbv_few(q, m, f, b, w, c):
    """zbv_bubble_s for m ≤ p micro-batches (k = m − 1): a lone micro-batch's whole round trip
    2q(f + b) at m = 1, shortened as more fill the V."""
    k = m - 1.0
    return np.maximum.reduce(np.broadcast_arrays(
        (2 * q - 2 * k) * f + 2 * q * b + 4 * q * c,
        (2 * q + 1 - m) * (f + b + 2 * c),
        2 * q * f + (2 * q - 2 * k) * b - 2 * k * w + 4 * q * c,
        2 * q * f + (2 * q - 3 * k) * b - k * w + 2 * (2 * q + 1 - m) * c))

