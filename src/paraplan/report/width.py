"""The width text output fits: 120 columns, or the terminal's where it is wider; and the
wrapping of prose lines to it (continuation lines indented under their label)."""

from __future__ import annotations

import shutil
import textwrap

DEFAULT_WIDTH = 120  # columns when COLUMNS is unset or stdout is not a terminal


def terminal_width() -> int:
    """The columns text output may use: COLUMNS or the terminal's, at least DEFAULT_WIDTH."""
    return max(DEFAULT_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def wrap(text: str, width: int, indent: int = 0) -> str:
    """Each line of `text` wrapped at `width`, continuation lines indented by `indent`
    (words and numbers are never split: a-b-c stays whole)."""
    return "\n".join(
        textwrap.fill(line, width, subsequent_indent=" " * indent, break_long_words=False, break_on_hyphens=False)
        if len(line) > width else line
        for line in text.split("\n"))


def labelled(label: str, text: str, width: int) -> str:
    """`label` + `text` wrapped, continuation lines starting under the text."""
    return wrap(label + text, width, indent=len(label))
