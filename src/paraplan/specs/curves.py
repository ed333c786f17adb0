"""Efficiency curves as data: piecewise-linear in log10(x), clamped at the ends.

A curve answers "what fraction of the nominal peak is achieved at this size" (GEMM FLOPs,
collective message bytes). Points come from calibration (microbenchmarks or published
profiles such as vidur's), never from constants inside formulas.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, kw_only=True)
class EfficiencyCurve:
    """Achieved fraction of peak vs size; `x` ascending, `y` in (0, 1]."""

    x: tuple[float, ...]
    y: tuple[float, ...]
    _log_x: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y) or not self.x:
            raise ValueError("efficiency curve needs as many x as y points, at least one")
        if any(not (0.0 < v < math.inf) for v in self.x):
            raise ValueError(f"efficiency curve sizes must be finite and > 0: {self.x}")
        if any(b <= a for a, b in zip(self.x, self.x[1:])):
            raise ValueError(f"efficiency curve x must ascend: {self.x}")
        if any(not (0.0 < v <= 1.0) for v in self.y):
            raise ValueError(f"efficiency curve y must be in (0, 1]: {self.y}")
        object.__setattr__(self, "_log_x", tuple(math.log10(v) for v in self.x))

    def at(self, size):
        """Efficiency at `size` (scalar or numpy array)."""
        if isinstance(size, (int, float)):  # scalar fast path (serving simulation calls it per step)
            lx = math.log10(max(float(size), 1.0))
            xs, ys = self._log_x, self.y
            i = bisect.bisect_right(xs, lx)
            if i == 0:
                return ys[0]
            if i == len(xs):
                return ys[-1]
            w = (lx - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + w * (ys[i] - ys[i - 1])
        lx = np.log10(np.maximum(np.asarray(size, dtype=float), 1.0))
        out = np.interp(lx, np.log10(np.asarray(self.x)), np.asarray(self.y))
        return float(out) if np.ndim(out) == 0 else out

    @staticmethod
    def constant(value: float) -> "EfficiencyCurve":
        return EfficiencyCurve(x=(1.0,), y=(value,))

    @staticmethod
    def from_pairs(pairs) -> "EfficiencyCurve":
        pairs = sorted((float(a), float(b)) for a, b in pairs)
        return EfficiencyCurve(x=tuple(p[0] for p in pairs), y=tuple(p[1] for p in pairs))
