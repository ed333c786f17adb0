"""User-facing errors: one line that names the field, the value and what is allowed."""

from __future__ import annotations

import difflib
import re

MAX_SHOWN_CHARS = 80  # a value longer than this is cut in an error line, which says how long it was
MAX_SHOWN_PATH_CHARS = 4096  # PATH_MAX: a path the system could open is shown whole


def shown(value: object) -> str:
    """repr(value) for an error line: at most about MAX_SHOWN_CHARS characters, a longer one cut
    with "..." and its length (a 100 KB argument must not become a 100 KB error line)."""
    text = value if isinstance(value, str) else None
    # a path is the user's handle on a file: whole up to what the system could open
    limit = MAX_SHOWN_PATH_CHARS if text is not None and "/" in text else MAX_SHOWN_CHARS
    r = repr(value)
    if len(r) <= limit:
        return r
    size = f"{len(text):,} characters" if text is not None else f"{len(r):,} characters as written"
    return f"{r[:limit - 3]}... ({size})"


def shorten_words(message: str) -> str:
    """`message` with each run of more than MAX_SHOWN_CHARS non-blank characters (a value that
    argparse quotes in its own message) cut as `shown` cuts a value."""
    def cut(m: re.Match) -> str:
        word = m.group()
        body = word.rstrip(",;:)")
        if len(body) > 1 and body[0] in "'\"" and body[-1] == body[0]:  # argparse's repr of a value
            return shown(body[1:-1]) + word[len(body):]
        if "/" in word and len(word) <= MAX_SHOWN_PATH_CHARS:  # a path, shown whole as `shown` does
            return word
        return f"{word[:MAX_SHOWN_CHARS - 3]}... ({len(word):,} characters)"
    return re.sub(r"\S{%d,}" % (MAX_SHOWN_CHARS + 1), cut, message)


def shown_path(path: object) -> str:
    """A file path for an error line: whole up to PATH_MAX (the user's handle on the file),
    a longer one cut as `shown` cuts a value."""
    text = str(path)
    return text if len(text) <= MAX_SHOWN_PATH_CHARS else shown(text)


class ParaplanError(Exception):
    """A user's mistake or an impossible request; the CLI prints it in one line, exits 2."""

    def __reduce__(self):
        """Pickled as its class, line and fields, whatever its constructor takes (a search's
        worker process sends its errors back to the search)."""
        return _rebuilt, (type(self), self.args), self.__dict__


def _rebuilt(cls: type, args: tuple) -> ParaplanError:
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    return err


class SpecError(ParaplanError):
    """A field of a model, cluster, workload or plan has a value that is not allowed."""

    def __init__(self, where: str, field: str, value: object, allowed: str):
        self.where, self.field, self.value, self.allowed = where, field, value, allowed
        super().__init__(f"{where}: {field}={shown(value)} is not allowed; {allowed}")


class UnknownPresetError(ParaplanError):
    """An unknown preset name, with the known names that look like it (names containing it
    first, then difflib's close matches); none when nothing is close, rather than arbitrary ones."""

    CLOSE = 0.6  # difflib ratio: "h1000" ~ "h100" (0.89), "Z100" ~ "H100" (0.75); "foo" matches nothing
    SHOWN = 5

    def __init__(self, kind: str, name: str, known: list[str]):
        by_lower: dict[str, str] = {}
        for k in known:
            by_lower.setdefault(k.lower(), k)
        query = name.lower().strip()
        holding = [k for k in by_lower if query and len(query) >= 3 and query in k]
        close = difflib.get_close_matches(query, list(by_lower), n=self.SHOWN, cutoff=self.CLOSE)
        picked = list(dict.fromkeys(holding + close))[: self.SHOWN]
        hint = (f"closest: {', '.join(by_lower[c] for c in picked)}" if picked
                else "no preset name is close to it")
        super().__init__(f"unknown {kind} {shown(name)}; {hint} (see `paraplan presets`)")


class FileFormatError(ParaplanError):
    def __init__(self, path: str, detail: str, line: int | None = None):
        where = shown_path(path) or "'' (an empty path)"
        loc = f"{where}:{line}" if line is not None else where
        super().__init__(f"{loc}: {detail}")


class RowError(ParaplanError):
    """One row of a measurements file has a cell paraplan cannot read (a count that is not a
    whole number, a label it does not know): that row is skipped with this reason, naming the
    file, line, column and value, and every other row is still predicted. A file that is not
    a CSV of the documented columns is a FileFormatError instead."""

    def __init__(self, path: str, line: int, column: str, detail: str):
        self.column = column
        super().__init__(f"{shown_path(path)}:{line}: column {column!r}: {detail}")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where a command stops what it started (paraplan run's torchrun); the CLI
    exits 143 (128 + SIGTERM) for it, 130 for Ctrl-C."""


class NoPlanFitsError(ParaplanError):
    """Nothing fits: says why and what would help. `smallest`: (bytes, plan) of the valid plan
    that needs the least memory, where the search found one."""

    def __init__(self, message: str, smallest: tuple | None = None):
        super().__init__(message)
        self.smallest = smallest
