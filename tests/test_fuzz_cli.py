"""Fuzzing the command line and the files it reads (issue 33, part 6).

hypothesis draws a command, flags and hostile values (zero, negative, huge, nan/inf, empty,
words, long digit strings) on top of a small problem, and malformed model, cluster, GPU,
table and measurement files (a line dropped, doubled or cut, a value replaced by a hostile
one). Every run must end as paraplan documents: exit 0 or 2 (`validate` may exit 1 when no
row is predicted), an error as one line starting `paraplan: error:`, no traceback, `--json`
output that a strict JSON parser reads, and no temporary file left beside an output. Each
example is bounded in time (an input that runs for long is itself a finding); the whole file
runs in well under two minutes.
"""

from __future__ import annotations

import json
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paraplan.specs.catalog import CATALOG_DIR
from support import TRAINING_HEADER, TRAINING_ROW, run

SMALL = ["--model", "mpt-125m", "--gpus", "8", "--batch", "8", "--seq", "1024"]
PER_EXAMPLE_S = 30  # an example that takes longer fails (the "runs for minutes")
HOSTILE = ("0", "-1", "1", "2", "3", "8", "3.5", "1e308", "-1e308", "1e-308", "nan", "inf", "-inf", "", " ", "abc",
           "1,2", "9" * 30, "é", "-5", "0x10", "1_000", "2**40")
FLAGS = {
    "estimate": ("--tp", "--pp", "--dp", "--cp", "--vp", "--mb", "--ep", "--zero", "--schedule", "--recompute",
                 "--recompute-layers", "--precision", "--tokens", "--price", "--gpus", "--seq", "--batch",
                 "--cluster", "--model", "--attention", "--cp-comm", "--dp-shard", "--optimizer"),
    "search": ("--tp", "--pp", "--cp", "--schedule", "--precision", "--gpus", "--seq", "--batch", "--top",
               "--cluster", "--engine", "--rank-order"),
    "serve": ("--gpus", "--prompt", "--output", "--ttft-ms", "--tpot-ms", "--weights", "--kv", "--tp", "--pp",
              "--max-batch", "--rate", "--requests"),
    "embeddings": ("--gpus", "--batch-per-rank", "--hbm-reserve", "--optimizer", "--ranks"),
    "export": ("--format", "--tp", "--pp", "--dp", "--mb", "--zero", "--precision"),
}
JSON_COMMANDS = ("estimate", "search", "serve", "embeddings")


class _TooSlow(Exception):
    pass


def _alarm(signum, frame):
    raise _TooSlow(f"one example ran for more than {PER_EXAMPLE_S} s")


def _run_bounded(capsys, argv):
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(PER_EXAMPLE_S)
    try:
        return run(capsys, *argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _strict_json(text: str):
    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    return json.loads(text, parse_constant=refuse)


def _check(argv, code, out, err, allowed=(0, 2)):
    shown = " ".join(map(repr, argv))
    assert code in allowed, f"exit {code} for {shown}: {err[-2000:]}"
    assert "Traceback" not in err and "Traceback" not in out, f"traceback for {shown}: {err[-2000:]}"
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("paraplan: error: "), f"for {shown}: {err[-2000:]}"
    if code == 0 and "--json" in argv:
        _strict_json(out)


def _no_temporaries(folder):
    left = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert not left, f"temporary files left behind: {left}"


@st.composite
def command_lines(draw):
    command = draw(st.sampled_from(sorted(FLAGS)))
    flags = draw(st.lists(st.sampled_from(FLAGS[command]), min_size=1, max_size=3, unique=True))
    argv = [command, *(SMALL if command in ("estimate", "search", "export") else [])]
    for flag in flags:
        argv += [flag, draw(st.sampled_from(HOSTILE))]
    if command in JSON_COMMANDS and draw(st.booleans()):
        argv.append("--json")
    return argv


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(argv=command_lines())
def test_hostile_flags_end_as_documented(capsys, tmp_path, argv):
    if argv[0] == "export":
        argv = [*argv, "-o", str(tmp_path / "out.cfg")]
    code, out, err = _run_bounded(capsys, argv)
    _check(argv, code, out, err)
    _no_temporaries(tmp_path)


def _mutations():
    return st.sampled_from(("drop", "double", "cut", "replace-value", "replace-key"))


def _mutate(text: str, how: str, index: int, value: str) -> str:
    """`text` with one line dropped, doubled, the text cut, or a value or key replaced (on a
    line that holds one: `key = value` in TOML, a cell in CSV)."""
    lines = text.splitlines()
    if how == "cut":
        return text[: index % max(len(text), 1)]
    if how in ("drop", "double"):
        i = index % max(len(lines), 1)
        lines[i:i + 1] = [] if how == "drop" else [lines[i], lines[i]]
        return "\n".join(lines) + "\n"
    separator = "=" if any("=" in line and not line.startswith("#") for line in lines) else ","
    holding = [i for i, line in enumerate(lines) if separator in line and not line.startswith("#")]
    i = holding[index % len(holding)]
    if separator == ",":
        cells = lines[i].split(",")
        cells[index % len(cells)] = value
        lines[i] = ",".join(cells)
    elif how == "replace-value":
        lines[i] = lines[i].split("=", 1)[0] + f"= {value}"
    else:
        lines[i] = f"{value} =" + lines[i].split("=", 1)[1]
    return "\n".join(lines) + "\n"


TOML_VALUES = ("0", "-1", "1e308", "-1e308", "nan", "inf", '"x"', "[]", "{}", "true", '""', "1e-300", "99999999999")
TRAINING_CSV = ",".join(TRAINING_HEADER) + "\n" + ",".join(
    f'"{TRAINING_ROW[k]}"' if "," in str(TRAINING_ROW[k]) else str(TRAINING_ROW[k]) for k in TRAINING_HEADER) + "\n"
FILES = {
    # kind: (file name, text, command line reading it)
    "model": ("model.toml", (CATALOG_DIR / "models" / "mpt-125m.toml"),
              ["estimate", "--gpus", "8", "--batch", "8", "--seq", "1024", "--tp", "1", "--dp", "8", "--model"]),
    "cluster": ("cluster.toml", (CATALOG_DIR / "clusters" / "dgx-h100.toml"),
                ["estimate", *SMALL, "--tp", "1", "--dp", "8", "--cluster"]),
    "gpu": ("gpu.toml", (CATALOG_DIR / "gpus" / "h100-sxm-80gb.toml"),
            ["estimate", *SMALL, "--tp", "1", "--dp", "8", "--hardware"]),
    "tables": ("tables.csv", (CATALOG_DIR / "embeddings" / "criteo-1tb.csv"), ["embeddings", "--gpus", "8", "--tables"]),
    "measurements": ("rows.csv", None, ["validate"]),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(kind=st.sampled_from(sorted(FILES)), how=_mutations(), index=st.integers(0, 10_000),
       value=st.sampled_from(TOML_VALUES + HOSTILE), as_json=st.booleans())
def test_malformed_files_end_as_documented(capsys, tmp_path, kind, how, index, value, as_json):
    name, source, argv = FILES[kind]
    text = TRAINING_CSV if source is None else source.read_text()
    path = tmp_path / name
    path.write_text(_mutate(text, how, index, value))
    argv = [*argv, str(path), *(["--json"] if as_json else [])]
    code, out, err = _run_bounded(capsys, argv)
    _check(argv, code, out, err, allowed=(0, 1, 2) if kind == "measurements" else (0, 2))
    _no_temporaries(tmp_path)


def test_the_mutations_change_the_file():
    """A fuzz test whose files stay valid would test nothing: each mutation changes the text."""
    text = (CATALOG_DIR / "models" / "mpt-125m.toml").read_text()
    assert text.count("=") > 3
    for how in ("drop", "double", "cut", "replace-value", "replace-key"):
        for index in (0, 3, 1000):
            assert _mutate(text, how, index, "nan") != text, (how, index)
    assert _mutate(TRAINING_CSV, "replace-value", 5, "nan") != TRAINING_CSV


@pytest.mark.parametrize("value", ["nan", "inf", "1e308"])
def test_a_hostile_gpu_number_is_refused_in_one_line(capsys, tmp_path, value):
    """The fuzzer's cheapest finding, kept as a plain test: a GPU's peak rate outside physics."""
    text = (CATALOG_DIR / "gpus" / "h100-sxm-80gb.toml").read_text()
    lines = [f"hbm_gb = {value}" if line.startswith("hbm_gb") else line for line in text.splitlines()]
    path = tmp_path / "gpu.toml"
    path.write_text("\n".join(lines) + "\n")
    argv = ["estimate", *SMALL, "--hardware", str(path), "--json"]
    code, out, err = _run_bounded(capsys, argv)
    assert code == 2
    _check(argv, code, out, err)
