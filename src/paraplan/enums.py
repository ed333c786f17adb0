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
        from .errors import SpecError
        try:
            return cls(str(text).strip().lower().replace("-", "_"))
        except ValueError:
            raise SpecError("plan", field, text, "allowed: " + ", ".join(m.value for m in cls)) from None
