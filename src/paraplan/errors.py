"""User-facing errors: one line that names the field, the value and what is allowed."""

from __future__ import annotations

import difflib


class ParaplanError(Exception):
    """A user's mistake or an impossible request; the CLI prints it in one line, exits 2."""


class SpecError(ParaplanError):
    """A field of a model, cluster, workload or plan has a value that is not allowed."""

    def __init__(self, where: str, field: str, value: object, allowed: str):
        self.where, self.field, self.value, self.allowed = where, field, value, allowed
        super().__init__(f"{where}: {field}={value!r} is not allowed; {allowed}")


class UnknownPresetError(ParaplanError):
    def __init__(self, kind: str, name: str, known: list[str]):
        close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=3, cutoff=0.4)
        by_lower = {k.lower(): k for k in known}
        hint = ", ".join(by_lower[c] for c in close) if close else ", ".join(sorted(known)[:8]) + ", ..."
        super().__init__(f"unknown {kind} {name!r}; closest: {hint} (see `paraplan presets`)")


class FileFormatError(ParaplanError):
    def __init__(self, path: str, detail: str, line: int | None = None):
        loc = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{loc}: {detail}")


class NoPlanFitsError(ParaplanError):
    """Nothing fits: says why and what would help."""
