"""Strict JSON for --json output: RFC 8259 has no NaN or Infinity, and a strict parser
(jq, JavaScript, Go) refuses Python's `NaN`."""

from __future__ import annotations

import json
import math

from ..errors import ParaplanError


def _non_finite(value, where: str = "") -> tuple[str, float] | None:
    """(the key path, the number) of the first inf or nan in `value`, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (where or "the value", value)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for k, v in items:
        found = _non_finite(v, f"{where}.{k}" if where and isinstance(k, str) else f"{where}[{k!r}]" if where else str(k))
        if found:
            return found
    return None


def json_text(value, indent: int | None = None) -> str:
    """`value` as strict JSON (RFC 8259 has no NaN or Infinity); a non-finite number is a
    one-line error naming its key rather than output a strict parser refuses."""
    try:
        return json.dumps(value, indent=indent, allow_nan=False)
    except ValueError:
        found = _non_finite(value)
        if found is None:
            raise
        raise ParaplanError(f"the result's {found[0]} is {found[1]}, which JSON cannot hold: an input number is "
                            "outside what paraplan can price (see docs/model.md)") from None
