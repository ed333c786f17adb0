"""Helpers shared by the test modules (pytest puts this directory on sys.path)."""

from __future__ import annotations

import pytest

from paraplan.cli import main
from paraplan.errors import FileFormatError


def write(tmp_path, name: str, text: str):
    """Write `text` to tmp_path/name and return the path."""
    p = tmp_path / name
    p.write_text(text)
    return p


def assert_bad_field_names_line(tmp_path, toml_text: str, old: str, new: str, field: str, load) -> None:
    """Replacing `old` by `new` in a TOML makes `load` fail naming the file, line and field, in one line."""
    p = write(tmp_path, "x.toml", toml_text.replace(old, new))
    with pytest.raises(FileFormatError) as e:
        load(str(p))
    line = toml_text.splitlines().index(old) + 1
    assert f"{p}:{line}:" in str(e.value) and field in str(e.value)
    assert "\n" not in str(e.value)


def run(capsys, *argv):
    """(exit code, stdout, stderr) of `paraplan ARGV`, argparse's SystemExit included."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code, out, err):
    assert code == 2
    assert "Traceback" not in err and "Traceback" not in out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("paraplan: error: ")
    return lines[0]
