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


def scalar(x, i: int = 0) -> float:
    """The i-th plan's value of `x` (a number, or a batch's array) as a float."""
    a = np.asarray(x, dtype=float)
    return float(a if a.ndim == 0 else a.reshape(-1)[i])
