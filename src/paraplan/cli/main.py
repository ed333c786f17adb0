"""The `paraplan` command: the parser of every command, and `main`, which runs one and turns
a user's mistake into one line and exit code 2 (the codes are listed at EXIT_OUTPUT_FAILED)."""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import signal
import sys

from ..errors import ParaplanError, Terminated, shown
from .args import Parser
from .embeddings import add_parser as add_embeddings
from .estimate import add_parser as add_estimate
from .presets import add_parser as add_presets
from .scale import add_parser as add_scale
from .search import add_parser as add_search
from .trace import add_parser as add_trace
from .validate import add_parser as add_validate


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="paraplan", description="Predict, search and rank parallel training plans.")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    for add in (add_search, add_scale, add_estimate, add_trace, add_validate, add_embeddings):
        add(sub)
    from ..validate.cli import add_fit_parser
    add_fit_parser(sub)
    from ..inference.cli import add_parser as add_serve
    add_serve(sub)
    add_presets(sub)
    from ..export.cli import add_parser as add_export  # no torch at import
    add_export(sub)
    from ..calibrate.cli import add_parser as add_calibrate  # torch only when benchmarks run
    add_calibrate(sub)
    from ..run.cli import add_parser as add_run_and_compare  # no torch at import (run/cli.py)
    add_run_and_compare(sub)
    return p


def _version() -> str:
    """The installed distribution's version (package metadata), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("paraplan")
    except PackageNotFoundError:
        from .. import __version__
        return __version__


def _commands(parser: argparse.ArgumentParser) -> dict:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _parse(parser: argparse.ArgumentParser, argv: list[str], implied_search: bool = False):
    """parse_args, except that an option the subcommand does not take is the subcommand's
    error (`see paraplan serve --help`), not the top-level parser's; with `implied_search`
    (options before any command, which are search's), the top-level one, naming the commands."""
    args, extra = parser.parse_known_args(argv)
    if extra and implied_search:
        parser.error(f"unrecognized arguments: {' '.join(extra)}; options before any command are `paraplan "
                     f"search`'s, else write a command first: {', '.join(_commands(parser))}")
    if extra:
        sub = _commands(parser).get(getattr(args, "command", None) or "", parser)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


# Exit codes (documented in the README): 0 done; 1 validate predicted no row; 2 a user's
# mistake (one line on stderr); 74 the output could not be written (sysexits' EX_IOERR: a full
# disk, a closed terminal); 130 Ctrl-C; 143 SIGTERM (the shells' 128 + signal number).
EXIT_OUTPUT_FAILED = 74


# errors of writing stdout itself (a full disk, a vanished terminal), not of a file we read
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF, errno.ENXIO, errno.EROFS}


def _command_error(parser: argparse.ArgumentParser, first: str) -> str | None:
    """The one-line error for a first argument that is not a command, or None when it is one."""
    commands = list(_commands(parser))
    if first in commands or first.startswith("-"):  # options before any command are search's
        return None
    listed = ", ".join(commands)
    close = difflib.get_close_matches(first, commands, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown command {shown(first)}; {hint}commands: {listed}"


def _on_sigterm(signum, frame):
    raise Terminated  # a KeyboardInterrupt: temporary files are removed on the way out


def _quiet_stdout() -> None:
    """Point the process's stdout at /dev/null after it failed, so that the interpreter's last
    flush of what is still buffered does not print a second error."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):  # not a real descriptor (a test's capture)
        pass


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a character the terminal cannot show becomes '?'
        try:
            stream.reconfigure(errors="replace")
        except (AttributeError, ValueError, OSError):
            pass
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    previous = None
    try:
        if not argv:
            parser.print_help()
            sys.stdout.flush()
            return 0
        bad = _command_error(parser, argv[0])
        if bad:
            parser.error(bad)
        implied_search = argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")
        if implied_search:
            argv = ["search"] + argv  # options before any command are search's (the default command)
        args = _parse(parser, argv, implied_search)
        try:
            previous = signal.signal(signal.SIGTERM, _on_sigterm)
        except ValueError:  # not the main thread (an embedding program keeps its own handler)
            pass
        code = args.func(args)
        sys.stdout.flush()  # a full disk shows here, while it can still be said in one line
        return code
    except ParaplanError as exc:
        sys.stderr.write(f"paraplan: error: {exc}\n")
        return 2
    except BrokenPipeError:  # the reader stopped (`| head`): not an error
        _quiet_stdout()
        return 0
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        _quiet_stdout()
        sys.stderr.write(f"paraplan: error: writing the output failed: {exc.strerror or exc}\n")
        return EXIT_OUTPUT_FAILED
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line; files are written whole or not at all
        # on a terminal the progress bar may hold the line: start a fresh one
        sys.stderr.write(f"{chr(10) if sys.stderr.isatty() else ''}paraplan: "
                         f"{'terminated' if isinstance(exc, Terminated) else 'interrupted'}\n")
        return 143 if isinstance(exc, Terminated) else 130  # the shells' 128 + signal number
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
