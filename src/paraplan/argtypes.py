"""argparse value types shared by every subcommand: a bad value is one line, exit 2."""

from __future__ import annotations

import argparse
import math

from .specs.files import MAX_COUNT


def _parse(text: str, kind, what: str):
    if "_" in text:  # Python's int() and float() read 2_0 as 20: a typo, not a number
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
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


def integer(text: str) -> int:
    """Any integer (the command checks its range); 2_0 refused."""
    return _parse(text, int, "an integer")


def positive_int(text: str) -> int:
    v = integer(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be >= 1")
    return v


# Upper bounds of the integer plan and workload flags, so that no product the plan space
# forms (TP×CP×DP, DP×micro-batch, PP×VP, global batch × sequence) leaves int64 and no
# divisor loop runs for hours. A parallel degree, a micro-batch or a GPU count up to 2**20
# (1,048,576: several times the largest clusters built); a global batch or a sequence up to
# 2**31 - 1, the most a model or cluster file may count (specs/files.py MAX_COUNT).
MAX_DEGREE = 2**20
MAX_BATCH_TOKENS = 2**40  # --batch-tokens: a trillion tokens per step (Llama 3 405B took 16M)


def int_up_to(most: int, least: int = 1):
    """An argparse type: a whole number from `least` (1 or 0) to `most`."""
    def parse(text: str) -> int:
        v = positive_int(text) if least == 1 else non_negative_int(text)
        if v > most:
            raise argparse.ArgumentTypeError(f"{v} is not allowed; allowed: {least} to {most:,}")
        return v
    parse.__name__ = f"int_up_to_{most}"
    return parse


degree = int_up_to(MAX_DEGREE)  # a parallel degree, a micro-batch, a GPU count
count = int_up_to(MAX_COUNT)  # a global batch, a sequence length


def non_negative_int(text: str) -> int:
    v = integer(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} must be >= 0")
    return v


def number(text: str) -> float:
    """Any number (the command checks its range); 2_0 refused."""
    return _parse(text, float, "a number")


def positive_float(text: str) -> float:
    v = number(text)
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{v} must be a finite number > 0")
    return v


def non_negative_float(text: str) -> float:
    v = number(text)
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{v} must be a finite number >= 0")
    return v


def number_within(least: float, most: float, unit: str, *, above: bool = False):
    """An argparse type: a number from `least` (above it with `above`) to `most`, in the
    flag's own unit (the Workload checks the same bounds in its fields' units)."""
    def parse(text: str) -> float:
        v = number(text)
        if not ((v > least if above else v >= least) and v <= most):
            low = f"above {least:g}" if above else f"{least:g}"
            raise argparse.ArgumentTypeError(f"{v:g} is not allowed; allowed: {low} to {most:g} {unit}")
        return v
    parse.__name__ = f"number_within_{least:g}_{most:g}"
    return parse


def percent_below_100(text: str) -> float:
    """A percentage above 0 and below 100 (--whatif: how far each assumption moves)."""
    v = number(text)
    if not 0 < v < 100:
        raise argparse.ArgumentTypeError(f"{v:g} must be a percentage above 0 and below 100")
    return v
