"""Reading user files with errors that name the file (one place for TOML and JSON)."""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import FileFormatError

# Counts (layers, widths, heads, experts, GPUs) above int32 are not a model or cluster anyone
# built, and the planner's integer arithmetic is not meant for them (every file reader uses it).
MAX_COUNT = 2**31 - 1


def read_text(path: Path, shown: str) -> str:
    """The file's UTF-8 text, or a one-line FileFormatError naming it."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileFormatError(shown, "no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FileFormatError(shown, f"cannot read: {e}") from None


def without_note(text: str) -> str:
    """A cell or a name with a trailing note in parentheses dropped ("FP8 (implied; see
    notes)" -> "FP8", "Qwen3_30B_a3B (tokendrop)" -> "Qwen3_30B_a3B"), stripped."""
    return re.sub(r"\s*\(.*\)\s*$", "", str(text).strip())
