"""A small TOML writer for flat sections of scalars and string lists (the stdlib reads
TOML but does not write it; the core takes no dependency for this)."""

from __future__ import annotations

import json


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def toml_text(sections: dict) -> str:
    """`{section: {key: value}}` as TOML, sections in the given order."""
    out = []
    for name, values in sections.items():
        out.append(f"[{name}]")
        out.extend(f"{k} = {_value(v)}" for k, v in values.items())
        out.append("")
    return "\n".join(out)
