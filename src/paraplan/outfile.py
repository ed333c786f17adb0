"""Files the user names (`-o`, `--raw`, `--plot`, `--export-torchrec`): checked before any
work, then written whole or not at all.

A regular file (new or existing) is written to a temporary file in its own directory and
renamed over it, so that a failure leaves the old file, or nothing, and no temporary. A
special file (/dev/stdout, /dev/null, a pipe, a terminal) is written in place: renaming
over it would replace a device with a regular file. Every failure is one SpecError that
names the command, the option and the path.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
import sys

from .errors import SpecError

# Names of a process's own descriptors: /dev/stdout can lead to a regular file (the shell's
# redirection), which a rename would take away from under the shell.
_DESCRIPTOR_NAMES = ("/dev/stdin", "/dev/stdout", "/dev/stderr")
_DESCRIPTOR_DIRS = ("/dev/fd/", "/proc/")
# A process's descriptors under /proc (what /dev/stdout resolves to); anything else under the
# kernel's pseudo file systems (/proc/self/comm, /sys/...) is no file to write a result into.
_PROC_DESCRIPTOR = re.compile(r"^/proc/(self|thread-self|\d+)/fd/[^/]+$")
_KERNEL_DIRS = ("/proc", "/sys")


def _is_special(path: str, st: os.stat_result | None) -> bool:
    """True when `path` must be written in place (it exists and is not a plain file)."""
    if st is None:
        return False
    name = os.path.abspath(path)
    return not stat.S_ISREG(st.st_mode) or name in _DESCRIPTOR_NAMES or name.startswith(_DESCRIPTOR_DIRS)


def _stat(path: str, where: str, option: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:  # a parent is a file: "its directory must exist" below
        return None
    except OSError as e:  # a name too long, a symbolic-link loop, a parent we may not search
        raise SpecError(where, option, path, f"cannot use path: {e.strerror or e}") from None


def _is_kernel_file(path: str) -> bool:
    """True when `path` names (or leads by links to) something under /proc or /sys other than a
    process's descriptor: the kernel's settings and state, which a write would change or refuse."""
    name = os.path.abspath(path)
    if name in _DESCRIPTOR_NAMES or name.startswith("/dev/fd/") or _PROC_DESCRIPTOR.match(name):
        return False
    for candidate in (name, os.path.realpath(path)):
        if _PROC_DESCRIPTOR.match(candidate):
            return False
        if any(candidate == d or candidate.startswith(d + "/") for d in _KERNEL_DIRS):
            return True
    return False


def check_output(path: str, where: str, option: str) -> None:
    """Raise a one-line SpecError unless `path` can be written as a file; writes nothing."""
    def bad(allowed: str):
        return SpecError(where, option, path, allowed)
    if not path:
        raise bad("a file path is required")
    if "\0" in path:
        raise bad("a file path without NUL characters is required")
    if _is_kernel_file(path):
        raise bad("a path under /proc or /sys is the kernel's, not a file; name a regular file or /dev/stdout")
    st = _stat(path, where, option)
    if (st is not None and stat.S_ISDIR(st.st_mode)) or path.endswith(os.sep):
        raise bad("a file path is required, not a directory")
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        raise bad("it exists and is not a regular file, a character device or a pipe")
    if st is not None and not os.access(path, os.W_OK):
        raise bad("it is not writable")
    if _is_special(path, st):
        return
    directory = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(directory):
        raise bad("its directory must exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise bad("its directory must be writable")


# the flags whose values a command reads as files (a preset name matches no file and passes)
INPUT_FLAGS = ("model", "cluster", "hardware", "tables", "profile")


def check_not_input(path: str, args, where: str, option: str) -> None:
    """A one-line SpecError when `path` names a file the command reads (--model, --cluster,
    --hardware, --tables, --profile): writing it would replace the input with the output."""
    for name in INPUT_FLAGS:
        value = getattr(args, name, None)
        if isinstance(value, str) and os.path.isfile(value) and same_file(path, value):
            raise SpecError(where, option, path, f"is the --{name} file this command reads; name another file")


def same_file(a: str, b: str) -> bool:
    """Whether two paths name one regular file (the same path, a link to it, a hard link);
    devices and pipes (/dev/null, /dev/stdout) may be named twice."""
    if os.path.realpath(a) == os.path.realpath(b):
        try:
            return not _is_special(a, os.stat(a))
        except OSError:
            return True  # one file that does not exist yet
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return os.path.samestat(sa, sb) and not _is_special(a, sa)


def write_output(path: str, data: str | bytes, where: str, option: str) -> None:
    """Write `data` (str: UTF-8) to `path`: atomically for a regular file, in place for a
    special one; on any failure nothing is left half-written and a one-line SpecError says why."""
    write_outputs([(path, data, option)], where)


def write_outputs(files: list[tuple[str, str | bytes, str]], where: str) -> None:
    """Write each (path, data, option) of a command, all or none: every regular file goes to a
    temporary file beside it first, and only when all of them (and the special files) are
    written are they renamed over their paths, so a full disk leaves none of them."""
    for path, _, option in files:
        check_output(path, where, option)
    staged: list[str] = []  # temporary files not yet renamed
    try:
        renames, in_place = [], []
        for path, data, option in files:
            payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
            try:
                st = _stat(path, where, option)
                if _is_special(path, st):
                    in_place.append((path, payload, st, option))
                else:
                    target = os.path.realpath(path)
                    staged.append(_stage(target, payload, st))
                    renames.append((staged[-1], target, path, option))
            except OSError as e:
                raise SpecError(where, option, path, f"writing it failed: {e.strerror or e}") from None
        for path, payload, st, option in in_place:
            try:
                _write_in_place(path, payload, st)
            except OSError as e:
                raise SpecError(where, option, path, f"writing it failed: {e.strerror or e}") from None
        for tmp, target, path, option in renames:
            try:
                os.replace(tmp, target)
            except OSError as e:
                raise SpecError(where, option, path, f"writing it failed: {e.strerror or e}") from None
            staged.remove(tmp)
    finally:
        for tmp in staged:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _write_in_place(path: str, payload: bytes, st: os.stat_result) -> None:
    # our own stdout or stderr (/dev/stdout, or a file the shell redirected it to): write
    # through the descriptor, after what was printed, rather than reopen and truncate it
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            same = os.path.samestat(os.fstat(fd), st)
        except OSError:
            same = False
        if same:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
            _write_all(fd, payload)
            return
    with open(path, "wb", buffering=0) as fh:
        view = memoryview(payload)
        while view:
            view = view[fh.write(view):]


def _write_all(fd: int, payload: bytes) -> None:
    view = memoryview(payload)
    while view:
        view = view[os.write(fd, view):]


def _stage(target: str, payload: bytes, st: os.stat_result | None) -> str:
    """`payload` in a new temporary file beside `target` (renamed over it later); its path."""
    directory, base = os.path.split(target)
    while True:
        tmp = os.path.join(directory, f".{base}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as open()
            break
        except FileExistsError:
            continue
    try:
        try:
            if st is not None:  # an existing file keeps its permissions
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
            _write_all(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return tmp
