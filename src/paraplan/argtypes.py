"""argparse value types shared by every subcommand: a bad value is one line, exit 2."""

from __future__ import annotations

import argparse
import math


def _parse(text: str, kind, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def non_empty(text: str) -> str:
    """A name or a path: '' (or blanks) is refused, not read as "not given"."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed; a preset name or a path is required "
                                         "(leave the flag out for the default)")
    return text


def _int(text: str) -> int:
    return _parse(text, int, "an integer")


def positive_int(text: str) -> int:
    v = _int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    return v


def non_negative_int(text: str) -> int:
    v = _int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must be >= 0")
    return v


def _float(text: str) -> float:
    return _parse(text, float, "a number")


def positive_float(text: str) -> float:
    v = _float(text)
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{v} must be a finite number > 0")
    return v


def non_negative_float(text: str) -> float:
    v = _float(text)
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{v} must be a finite number >= 0")
    return v
