"""Progress of long work on stderr, on a terminal or not: a line per phase ("searching
1.85M candidate plans...", once its first slice is priced; "simulating the best 64..."); on
a terminal, the search's bar too. A search of fewer than PROGRESS_MIN_PLANS candidates is done before a line
would help and says nothing (so a short command's stderr holds only its warnings and errors);
`--quiet` silences all of it. stdout is never written here: `--json` stays pure JSON.
"""

from __future__ import annotations

import argparse
import sys

from ..units import fmt_count

# about 1.3-1.4 s of search at the 705k-790k candidate plans/s benchmarks/README.md measures
# (bench_search.py, two cores): a shorter search needs no progress line
PROGRESS_MIN_PLANS = 1_000_000


def show_progress(done: int, total: int) -> None:
    """The search's bar on a terminal, redrawn in place per slice of the space."""
    width = 30
    frac = done / max(total, 1)
    sys.stderr.write(f"\rsearching [{'#' * int(width * frac):<{width}}] {100 * frac:5.1f}%")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


class Progress:
    """A search's `progress(done, total)` and `phase(name, count)` hooks (search/planner.py
    search), and `line(text)` for a command's own long phases."""

    def __init__(self, *, quiet: bool, bar: bool):
        self.quiet = quiet
        self.bar = bar and not quiet
        self.long = False  # the search under way has PROGRESS_MIN_PLANS candidates or more
        self.pending = ""  # its first line, written once a first slice is priced

    def __call__(self, done: int, total: int) -> None:
        # the search's line waits for its first slice: input that every plan trips on (a
        # precision the GPU lacks) is then its error alone on stderr
        if self.pending:
            self.line(self.pending)
            self.pending = ""
        if self.bar:
            show_progress(done, total)

    def phase(self, name: str, count: int) -> None:
        if name == "search":
            self.long = count >= PROGRESS_MIN_PLANS
            self.pending = f"searching {fmt_count(count)} candidate plans" if self.long else ""
        elif self.long:
            self.line(f"simulating the best {count:,}" if name == "simulate" else f"{name} {count:,}")

    def line(self, text: str) -> None:
        if not self.quiet:
            sys.stderr.write(f"{text}...\n")
            sys.stderr.flush()


def progress_from_args(args: argparse.Namespace) -> Progress:
    """The progress of a command: phase lines unless --quiet; the bar on a terminal without --json."""
    return Progress(quiet=getattr(args, "quiet", False), bar=not args.json and sys.stderr.isatty())


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr (a search of 1M+ candidate plans writes one per phase, "
                        "on a terminal or not; warnings and errors are still written)")
