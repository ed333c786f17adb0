"""StrEnum base with a stable integer `code`, so the vectorized cost model can hold enum
choices in numpy arrays (plan/space.py)."""

from __future__ import annotations

from enum import StrEnum
from functools import cache


@cache
def _members(cls) -> tuple:
    """An enum's members in definition order (cached: the plan-space loops ask millions of times)."""
    return tuple(cls)


@cache
def _code(cls, name: str) -> int:
    # keyed by (class, name): StrEnum members of different enums with equal values compare equal
    return [m.name for m in _members(cls)].index(name)


class CodedEnum(StrEnum):
    @property
    def code(self) -> int:
        return _code(type(self), self.name)

    @classmethod
    def from_code(cls, code: int):
        return _members(cls)[int(code)]

    @classmethod
    def parse(cls, text: str, field: str):
        """The member named by `text`, case-insensitive, '-' and '_' alike ("first-k" is first_k,
        "tp_cp_pp_dp" is tp-cp-pp-dp); else a one-line SpecError naming what is allowed."""
        from .errors import SpecError
        key = str(text).strip().lower()
        for m in _members(cls):
            if m.value.replace("-", "_") == key.replace("-", "_"):
                return m
        raise SpecError("plan", field, text, "allowed: " + ", ".join(m.value for m in cls))
