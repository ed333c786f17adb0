"""paraplan.outfile: a file the user named is checked before any work and written whole or
not at all; special files (a pipe, /dev/stdout) are written in place, never replaced."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from paraplan import outfile
from paraplan.errors import SpecError
from paraplan.outfile import check_output, write_output


def _only(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize("make,allowed", [
    (lambda d: "", "a file path is required"),
    (lambda d: str(d / "missing" / "x.json"), "its directory must exist"),
    (lambda d: str(d), "a file path is required, not a directory"),
    (lambda d: str(d / "sub") + os.sep, "a file path is required, not a directory"),
    (lambda d: str(d / "f.json" / "x.json"), "its directory must exist"),
])
def test_bad_paths_are_refused_before_writing(tmp_path, make, allowed):
    (tmp_path / "sub").mkdir()
    (tmp_path / "f.json").write_text("old")
    path = make(tmp_path)
    before = _only(tmp_path)
    with pytest.raises(SpecError) as e:
        check_output(path, "trace", "--output")
    msg = str(e.value)
    assert msg == f"trace: --output={path!r} is not allowed; {allowed}"
    with pytest.raises(SpecError):
        write_output(path, "data", "trace", "--output")
    assert _only(tmp_path) == before and (tmp_path / "f.json").read_text() == "old"


def test_a_socket_is_refused(tmp_path):
    import socket
    path = str(tmp_path / "s.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(path)
        with pytest.raises(SpecError, match="regular file, a character device or a pipe"):
            write_output(path, "x", "export", "--output")
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_new_and_existing_files_are_written_whole(tmp_path):
    path = tmp_path / "out.json"
    write_output(str(path), "first", "trace", "--output")
    assert path.read_text() == "first"
    os.chmod(path, 0o640)
    write_output(str(path), b"\x00second", "trace", "--output")
    assert path.read_bytes() == b"\x00second"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640  # an existing file keeps its mode
    assert _only(tmp_path) == ["out.json"]


def test_a_symlink_stays_a_symlink(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_output(str(link), "new", "run", "--output")
    assert link.is_symlink() and target.read_text() == "new"
    assert _only(tmp_path) == ["link.json", "real.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("old")

    def no_space(*a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(outfile.os, "replace", no_space)
    with pytest.raises(SpecError) as e:
        write_output(str(path), "new", "calibrate", "--raw")
    assert str(e.value) == (f"calibrate: --raw={str(path)!r} is not allowed; "
                            "writing it failed: No space left on device")
    assert path.read_text() == "old" and _only(tmp_path) == ["out.json"]


def test_an_interrupted_write_leaves_no_temporary(tmp_path, monkeypatch):
    def interrupted(fd):
        raise KeyboardInterrupt
    monkeypatch.setattr(outfile.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_output(str(tmp_path / "new.json"), "x", "trace", "--output")
    assert _only(tmp_path) == []


def test_a_pipe_is_written_in_place_not_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_output(str(fifo), "through the pipe", "export", "--output")
    reader.join(timeout=10)
    assert got == [b"through the pipe"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _only(tmp_path) == ["pipe"]


def _never_rename(monkeypatch):
    """A device must never be renamed over (a regression must not replace /dev/null)."""
    def refuse(*a, **k):
        raise AssertionError("rename over a special file")
    monkeypatch.setattr(outfile.os, "replace", refuse)
    monkeypatch.setattr(outfile.os, "rename", refuse)


def test_dev_null_is_written_in_place(monkeypatch):
    _never_rename(monkeypatch)
    write_output("/dev/null", "nothing", "trace", "--output")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_device_is_one_error_and_stays_a_device(monkeypatch):
    _never_rename(monkeypatch)
    with pytest.raises(SpecError, match="writing it failed: No space left on device"):
        write_output("/dev/full", "x" * 100_000, "trace", "--output")
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
