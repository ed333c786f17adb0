"""Helpers shared by the test modules (pytest puts this directory on sys.path)."""

from __future__ import annotations


def write(tmp_path, name: str, text: str):
    """Write `text` to tmp_path/name and return the path."""
    p = tmp_path / name
    p.write_text(text)
    return p
