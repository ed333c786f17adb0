"""`Num`: a quantity of one plan (a float) or of a batch of plans (a numpy array).

The cost model's formulas take and return either, so that one formula serves `estimate`
(one plan) and `search` (millions of plans at once).
"""

from __future__ import annotations

import numpy as np

Num = float | np.ndarray


def as_float(x) -> np.ndarray:
    """`x` (a number, an array or a plan field) as a float array."""
    return np.asarray(x, dtype=float)
