"""Reading user files with errors that name the file (one place for TOML and JSON)."""

from __future__ import annotations

import codecs
import json
import os
import re
import stat
import sys
import tomllib
from pathlib import Path

from ..errors import FileFormatError

# Counts (layers, widths, heads, experts, GPUs) above int32 are not a model or cluster anyone
# built, and the planner's integer arithmetic is not meant for them (every file reader uses it).
MAX_COUNT = 2**31 - 1


# The largest file paraplan reads (a model, cluster, hardware, tables or profile file, a
# measurements CSV, a run report): the largest real one is some hundred KB, and a larger
# limit only lets a mistaken path (/dev/zero, a dataset, a log) fill the memory first.
MAX_INPUT_BYTES = 16 * 2**20
MAX_INPUT_TEXT = "16 MiB"


def read_text(path: Path, shown: str) -> str:
    """The UTF-8 text of a regular file of at most MAX_INPUT_BYTES (a leading byte-order mark
    dropped, as Windows editors write one), or a one-line FileFormatError naming it (and the
    line of the first byte that is not UTF-8). A pipe or a device is refused before it is
    opened: one may never end (/dev/zero) or never start (a FIFO nobody writes)."""
    if not str(shown):  # Path("") is the working directory
        raise FileFormatError(shown, "no such file")
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(st.st_mode):
            raise FileFormatError(shown, "is not a regular file (a pipe or a device); a file is required")
        if st.st_size > MAX_INPUT_BYTES:
            raise FileFormatError(shown, f"is {st.st_size:,} bytes; at most {MAX_INPUT_TEXT} "
                                         f"({MAX_INPUT_BYTES:,} bytes) is read")
        with open(path, "rb") as fh:
            data = fh.read(MAX_INPUT_BYTES + 1)  # a file that grows meanwhile stops here
    except FileNotFoundError:
        raise FileFormatError(shown, "no such file") from None
    except IsADirectoryError:
        raise FileFormatError(shown, "is a directory, not a file") from None
    except OSError as e:
        raise FileFormatError(shown, f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise FileFormatError(shown, f"is over {MAX_INPUT_TEXT} ({MAX_INPUT_BYTES:,} bytes), the most that is read")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise FileFormatError(shown, f"byte 0x{data[e.start]:02x} is not UTF-8 text; save the file as UTF-8",
                              line) from None


# What the parsers raise beyond their own decode errors: RecursionError for arrays or tables
# nested thousands deep, ValueError for an integer past Python's 4300-digit conversion limit.
_TOO_DEEP = "nested too deeply"


def _too_large(e: ValueError) -> str:
    if "digits" in str(e):
        return f"an integer has more than {sys.get_int_max_str_digits()} digits"
    return str(e)


def parse_toml(text: str, shown: str) -> dict:
    """The TOML document in `text`, or a one-line FileFormatError naming `shown` (and the line)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r"\(at line (\d+), column \d+\)", msg)
        line = int(m.group(1)) if m else getattr(e, "lineno", None)
        detail = re.sub(r"\s*\(at line \d+, column \d+\)", "", msg) or "invalid TOML"
        raise FileFormatError(shown, f"invalid TOML: {detail}", line) from None
    except RecursionError:
        raise FileFormatError(shown, f"invalid TOML: {_TOO_DEEP}") from None
    except ValueError as e:
        raise FileFormatError(shown, f"invalid TOML: {_too_large(e)}") from None


def read_toml(path: Path, shown: str) -> tuple[dict, str]:
    """(the parsed TOML, its text) of the file; a one-line FileFormatError naming it."""
    text = read_text(path, shown)
    return parse_toml(text, shown), text


class _DuplicateKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise _DuplicateKey(k)
        seen[k] = v
    return seen


def parse_json(text: str, shown: str):
    """The JSON value in `text`, or a one-line FileFormatError naming `shown` (and the line)."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as e:
        # json's last-wins would drop the first value without a word; TOML refuses this too
        m = re.search(r'"%s"\s*:' % re.escape(json.dumps(e.key)[1:-1]), text)
        first = m.end() if m else 0
        m2 = re.search(r'"%s"\s*:' % re.escape(json.dumps(e.key)[1:-1]), text[first:])
        line = text[:first + m2.start()].count("\n") + 1 if m and m2 else None
        raise FileFormatError(shown, f"invalid JSON: key {e.key!r} appears twice in one object; "
                              "each key may appear once", line) from None
    except json.JSONDecodeError as e:
        raise FileFormatError(shown, f"invalid JSON: {e.msg} (column {e.colno})", e.lineno) from None
    except RecursionError:
        raise FileFormatError(shown, f"invalid JSON: {_TOO_DEEP}") from None
    except ValueError as e:
        raise FileFormatError(shown, f"invalid JSON: {_too_large(e)}") from None


def without_note(text: str) -> str:
    """A cell or a name with a trailing note in parentheses dropped ("FP8 (implied; see
    notes)" -> "FP8", "Qwen3_30B_a3B (tokendrop)" -> "Qwen3_30B_a3B"), stripped."""
    return re.sub(r"\s*\(.*\)\s*$", "", str(text).strip())
