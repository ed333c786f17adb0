"""Efficiency curves as data: piecewise-linear in log10(x), clamped at the ends.

A curve answers "what fraction of the nominal peak is achieved at this size" (GEMM FLOPs,
collective message bytes). Points come from calibration (microbenchmarks or published
profiles such as vidur's), never from constants inside formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, kw_only=True)
class EfficiencyCurve:
    """Achieved fraction of peak vs size; `x` ascending, `y` in (0, 1]."""

    x: tuple[float, ...]
    y: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y) or not self.x:
            raise ValueError("efficiency curve needs as many x as y points, at least one")
        if any(b <= a for a, b in zip(self.x, self.x[1:])):
            raise ValueError(f"efficiency curve x must ascend: {self.x}")
        if any(not (0.0 < v <= 1.0) for v in self.y):
            raise ValueError(f"efficiency curve y must be in (0, 1]: {self.y}")

    def at(self, size):
        """Efficiency at `size` (scalar or numpy array)."""
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
