"""Bad input to the commands that write files or read measurements and run reports: one
line on stderr, exit 2, no traceback, nothing half-written (and no device replaced).

Covers trace -o, export -o, calibrate -o/--raw/--from-raw/--name, embeddings
--export-torchrec, run -o and compare (--plot, reports whose fields have the wrong type).
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys

import pytest
from support import assert_user_error, run

from paraplan.calibrate.measurements import (AttentionSample, CollectiveSample, CopySample, GemmSample,
                                             Measurements)
from paraplan.specs.catalog import load_cluster

SMALL_PP = ["--model", "llama3-8b", "--gpus", "16", "--seq", "2048", "--batch", "16", "--tp", "2", "--pp", "4",
            "--mb", "1"]
SMALL_EXPORT = ["--format", "megatron", "--model", "llama3-8b", "--gpus", "16", "--batch", "64", "--seq", "4096",
                "--tp", "2", "--pp", "2"]
TINY_RUN = ["--model", "llama3-8b", "--layers", "4", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
            "--vocab", "256", "--seq", "32", "--batch", "4", "--steps", "2", "--warmup", "1", "--device", "cpu"]


def _measurements(ranks: int = 2) -> Measurements:
    """A small synthetic device (as tests/test_calibrate.py): GEMMs at 50 GFLOP/s, a 10 GB/s
    copy, all-reduces on an α-β link."""
    gemm = tuple(GemmSample(m=n, n=n, k=n, dtype="float32", time_s=2 * n ** 3 / 50e9 + 5e-6) for n in (64, 256, 1024))
    att = (AttentionSample(batch=1, heads=4, seq=256, head_dim=64, dtype="float32", fwd_time_s=1e-3, bwd_time_s=2.5e-3),)
    coll = tuple(CollectiveSample(op="all_reduce", world=ranks, num_bytes=b, time_s=2 * (40e-6 + b / 4e9))
                 for b in (4096, 1 << 20, 1 << 24)) if ranks > 1 else ()
    return Measurements(device_type="cpu", device_name="synthetic", ranks=ranks, threads_per_rank=1,
                        compute_dtype="float32", memory_bytes=8e9, reserved_bytes=3e8, launch_overhead_s=5e-6,
                        gemm=gemm, attention=att, copies=(CopySample(kind="device", num_bytes=1 << 26, time_s=0.0134),),
                        collectives=coll, backend="gloo" if ranks > 1 else "", torch_version="x")


def _raw(tmp_path, text: str | None = None, name: str = "raw.json") -> str:
    p = tmp_path / name
    p.write_text(_measurements().to_json() if text is None else text)
    return str(p)


def _report(tmp_path, name: str = "r.json", **fields) -> str:
    r = {"kind": "paraplan-run", "version": 1, "status": "ok", "command": "paraplan run",
         "model": {"name": "tiny"}, "plan": {"describe": "TP1 PP1 DP2 mb1 rc:none"}, "world_size": 2,
         "device": "cpu", "device_name": "cpu", "measured": {"step_time_s": 1.0, "peak_memory_bytes": 1 << 20},
         "predicted": {"step_time_s": 1.1, "memory_bytes": 2 << 20, "hardware": "cpu-profile"}, **fields}
    p = tmp_path / name
    p.write_text(json.dumps(r))
    return str(p)


def _files(tmp_path) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


# command -> (argv before the path, option named in the error, where)
WRITERS = {
    "trace": (lambda d: ["trace", *SMALL_PP, "-o"], "--output", "trace"),
    "export": (lambda d: ["export", *SMALL_EXPORT, "-o"], "--output", "export"),
    "calibrate-o": (lambda d: ["calibrate", "--from-raw", _raw(d), "-o"], "--output", "calibrate"),
    "calibrate-raw": (lambda d: ["calibrate", "--from-raw", _raw(d), "--raw"], "--raw", "calibrate"),
    "embeddings": (lambda d: ["embeddings", "--gpus", "8", "--export-torchrec"], "--export-torchrec", "embeddings"),
    "run": (lambda d: ["run", *TINY_RUN, "-o"], "--output", "run"),
    "compare": (lambda d: ["compare", _report(d), "--plot"], "--plot", "compare"),
}
BAD_PATHS = {
    "missing-dir": (lambda d: str(d / "nonexistent" / "dir" / "x.json"), "its directory must exist"),
    "a-directory": (lambda d: str(d / "outdir"), "a file path is required, not a directory"),
    "empty": (lambda d: "", "a file path is required"),
}


@pytest.mark.parametrize("bad", list(BAD_PATHS))
@pytest.mark.parametrize("command", list(WRITERS))
def test_a_bad_output_path_is_one_line_and_writes_nothing(capsys, tmp_path, command, bad):
    argv, option, where = WRITERS[command]
    make_path, allowed = BAD_PATHS[bad]
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outdir" / "keep.txt").write_text("kept")
    args = argv(tmp_path)
    path = make_path(tmp_path)
    before = _files(tmp_path)
    code, out, err = run(capsys, *args, path)
    line = assert_user_error(code, out, err)
    assert line == f"paraplan: error: {where}: {option}={path!r} is not allowed; {allowed}"
    assert not out
    assert _files(tmp_path) == before  # no PATH.tmp, no half-written file, the directory untouched


def _refuse_rename(monkeypatch):
    """Renaming a temporary over a device replaced /dev/full with a regular file as root:
    make any rename fail loudly instead (this also protects the machine from a regression)."""
    def refuse(src, dst, *a, **k):
        raise AssertionError(f"rename {src} -> {dst}")
    monkeypatch.setattr(os, "replace", refuse)
    monkeypatch.setattr(os, "rename", refuse)


def _write_to_device(capsys, tmp_path, monkeypatch, command, device):
    """Run a writing command with its output on `device`, renames refused."""
    argv, _, _ = WRITERS[command]
    _refuse_rename(monkeypatch)
    return run(capsys, *argv(tmp_path), device)


@pytest.mark.parametrize("command", [c for c in WRITERS if c != "run"])
def test_dev_null_is_written_in_place(capsys, tmp_path, monkeypatch, command):
    code, out, err = _write_to_device(capsys, tmp_path, monkeypatch, command, "/dev/null")
    assert code == 0, err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not any(p.endswith(".tmp") for p in os.listdir("/dev"))


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("command", [c for c in WRITERS if c != "run"])
def test_a_full_device_is_one_line_and_stays_a_device(capsys, tmp_path, monkeypatch, command):
    _, option, where = WRITERS[command]
    line = assert_user_error(*_write_to_device(capsys, tmp_path, monkeypatch, command, "/dev/full"))
    assert f"{where}: {option}='/dev/full'" in line and "No space left on device" in line
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert not any(p.endswith(".tmp") for p in os.listdir("/dev"))


def test_run_output_a_directory_is_not_removed(capsys, tmp_path):
    d = tmp_path / "results"
    d.mkdir()
    code, out, err = run(capsys, "run", *TINY_RUN, "-o", str(d))
    assert "--output" in assert_user_error(code, out, err)
    assert d.is_dir()


# ---------------------------------------------------------------- compare

def test_compare_plot_unknown_extension_lists_the_allowed_ones(capsys, tmp_path):
    path = str(tmp_path / "x.foo")
    code, out, err = run(capsys, "compare", _report(tmp_path), "--plot", path)
    line = assert_user_error(code, out, err)
    assert f"compare: --plot={path!r} is not allowed" in line and ".png" in line and ".pdf" in line
    assert not os.path.exists(path)


def test_compare_plot_without_extension_writes_the_path_it_prints(capsys, tmp_path):
    path = tmp_path / "scatter"
    code, out, err = run(capsys, "compare", _report(tmp_path), "--plot", str(path))
    assert code == 0, err
    assert f"wrote {path}" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert _files(tmp_path) == ["r.json", "scatter"]


def test_compare_plot_pdf(capsys, tmp_path):
    path = tmp_path / "scatter.pdf"
    code, out, err = run(capsys, "compare", _report(tmp_path), "--plot", str(path))
    assert code == 0, err
    assert path.read_bytes()[:5] == b"%PDF-"


@pytest.mark.parametrize("field,value", [("model", "tiny"), ("plan", "TP1 PP1"), ("model", ["tiny"]),
                                         ("plan", 3)])
def test_compare_report_field_of_the_wrong_type(capsys, tmp_path, field, value):
    path = _report(tmp_path, **{field: value})
    code, out, err = run(capsys, "compare", path)
    line = assert_user_error(code, out, err)
    assert path in line and field in line


# ---------------------------------------------------------------- calibrate --from-raw

def _mutated(edit) -> str:
    d = json.loads(_measurements().to_json())
    edit(d)
    return json.dumps(d)  # NaN and Infinity as Python's json writes them


def _set(path, value):
    def edit(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return edit


def _delete(path):
    def edit(d):
        *head, last = path
        for k in head:
            d = d[k]
        del d[last]
    return edit


BAD_RAW = {
    "top-level list": ("[]", "a JSON object"),
    "top-level number": ("3", "a JSON object"),
    "gemm time 0": (_mutated(_set(["gemm", 0, "time_s"], 0)), "gemm[0].time_s"),
    "gemm empty": (_mutated(_set(["gemm"], [])), "gemm"),
    "gemm not a list": (_mutated(_set(["gemm"], 3)), "gemm"),
    "gemm sample not an object": (_mutated(_set(["gemm", 1], 5)), "gemm[1]"),
    "copies empty": (_mutated(_set(["copies"], [])), "copies"),
    "no device copy": (_mutated(_set(["copies", 0, "kind"], "h2d")), "copies"),
    "m is text": (_mutated(_set(["gemm", 0, "m"], "x")), "gemm[0].m"),
    "m is a bool": (_mutated(_set(["gemm", 0, "m"], True)), "gemm[0].m"),
    "m is 2.5": (_mutated(_set(["gemm", 0, "m"], 2.5)), "gemm[0].m"),
    "nan time": (_mutated(_set(["gemm", 2, "time_s"], math.nan)), "gemm[2].time_s"),
    "infinite time": (_mutated(_set(["attention", 0, "bwd_time_s"], math.inf)), "attention[0].bwd_time_s"),
    "negative copy time": (_mutated(_set(["copies", 0, "time_s"], -1.0)), "copies[0].time_s"),
    "zero copy bytes": (_mutated(_set(["copies", 0, "num_bytes"], 0)), "copies[0].num_bytes"),
    "ranks text": (_mutated(_set(["ranks"], "two")), "ranks"),
    "ranks 0": (_mutated(_set(["ranks"], 0)), "ranks"),
    "negative memory": (_mutated(_set(["memory_bytes"], -8e9)), "memory_bytes"),
    "nan launch overhead": (_mutated(_set(["launch_overhead_s"], math.nan)), "launch_overhead_s"),
    "device name a number": (_mutated(_set(["device_name"], 5)), "device_name"),
    "missing field": (_mutated(_delete(["compute_dtype"])), "compute_dtype"),
    "missing sample field": (_mutated(_delete(["gemm", 0, "k"])), "gemm[0].k"),
    "unknown field": (_mutated(_set(["colour"], "blue")), "colour"),
    "no GEMM in the compute dtype": (_mutated(_set(["compute_dtype"], "bfloat16")), "gemm"),
    "overlap not an object": (_mutated(_set(["overlap"], 3)), "overlap"),
    "all-reduce at one size": (_mutated(lambda d: [c.update(num_bytes=4096) for c in d["collectives"]]), "collectives"),
    "collective world text": (_mutated(_set(["collectives", 0, "world"], "2")), "collectives[0].world"),
    "invalid JSON": ("{", "invalid JSON"),
}


@pytest.mark.parametrize("case", list(BAD_RAW))
def test_bad_raw_measurements_are_one_line_naming_the_field(capsys, tmp_path, case):
    text, field = BAD_RAW[case]
    raw = _raw(tmp_path, text)
    out = tmp_path / "prof.toml"
    code, stdout, err = run(capsys, "calibrate", "--from-raw", raw, "-o", str(out))
    line = assert_user_error(code, stdout, err)
    assert line.startswith(f"paraplan: error: {raw}") and field in line
    assert _files(tmp_path) == ["raw.json"]


def test_good_raw_measurements_still_load_and_round_trip(capsys, tmp_path):
    m = _measurements()
    assert Measurements.from_json(m.to_json()) == m
    out = tmp_path / "prof.toml"
    code, stdout, err = run(capsys, "calibrate", "--from-raw", _raw(tmp_path), "-o", str(out))
    assert code == 0, err
    assert load_cluster(str(out)).num_gpus == 2


@pytest.mark.parametrize("name", ['a"b', "back\\slash", "it's", "ünïcode name", "a # b = [c]"])
def test_profile_name_with_quotes_round_trips(capsys, tmp_path, name):
    out = tmp_path / "prof.toml"
    code, stdout, err = run(capsys, "calibrate", "--from-raw", _raw(tmp_path), "-o", str(out), "--name", name)
    assert code == 0, err
    assert load_cluster(str(out)).name == name


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "", "bell\x07"])
def test_profile_name_with_control_characters_is_refused(capsys, tmp_path, name):
    out = tmp_path / "prof.toml"
    code, stdout, err = run(capsys, "calibrate", "--from-raw", _raw(tmp_path), "-o", str(out), "--name", name)
    line = assert_user_error(code, stdout, err)
    assert f"calibrate: --name={name!r} is not allowed" in line
    assert not out.exists()


def test_measured_strings_and_the_command_line_cannot_break_the_profile(capsys, tmp_path, monkeypatch):
    m = json.loads(_measurements().to_json())
    m["device_name"] = 'Odd "GPU"\nname = "x"\\'
    m["torch_version"] = "2.13\n[gpu]"
    m["backend"] = "gl\"oo\r"
    raw = _raw(tmp_path, json.dumps(m))
    out = tmp_path / "prof.toml"
    odd_raw = tmp_path / "copy\nof raw.json"  # a legal file name, quoted into a comment line
    argv = ["calibrate", "--from-raw", raw, "-o", str(out), "--raw", str(odd_raw)]
    monkeypatch.setattr(sys, "argv", ["paraplan", *argv])
    code, stdout, err = run(capsys, *argv)
    assert code == 0, err
    c = load_cluster(str(out))
    assert c.gpu.name == m["device_name"]
    assert json.loads(odd_raw.read_text())["device_name"] == m["device_name"]


def test_a_bad_base_cluster_is_refused_before_measuring(capsys, tmp_path, monkeypatch):
    import paraplan.calibrate.measurements as meas
    monkeypatch.setattr(meas.Measurements, "from_json", None)  # must not get that far
    code, out, err = run(capsys, "calibrate", "--from-raw", _raw(tmp_path), "--base-cluster", "no-such-cluster")
    assert "no-such-cluster" in assert_user_error(code, out, err)


# ---------------------------------------------------------------- fuzzing: run checks before launching

@pytest.mark.parametrize("flags,flag", [
    (["--seed", "99999999999999999999"], "--seed"), (["--seed", "4294967296"], "--seed"),
    (["--vocab", "99999999999999999999"], "--vocab"), (["--seq", "99999999999999999999"], "--seq"),
    (["--batch", "99999999999999999999"], "--batch"), (["--mb", "99999999999999999999"], "--mb"),
    (["--layers", "99999999999"], "--layers"), (["--steps", "99999999999"], "--steps"),
    (["--warmup", "99999999999"], "--warmup"), (["--dp", "99999999999"], "--dp"),
    (["--dp", "2048"], "ranks (--tp × --pp × --dp)"),
    # no --batch: the default dp × mb × pp × 2 would pass the workload's bound
    (["--batch", None, "--dp", "1024", "--mb", "1048576"], "--mb"),
])
def test_run_bounds_its_flags_before_launching(capsys, tmp_path, monkeypatch, flags, flag):
    import paraplan.run.cli as run_cli

    def launched(*a, **k):
        raise AssertionError("torchrun started")
    monkeypatch.setattr(run_cli, "_launch", launched)
    argv = list(TINY_RUN)
    if flags[:2] == ["--batch", None]:
        i = argv.index("--batch")
        del argv[i:i + 2]
        flags = flags[2:]
    out = tmp_path / "r.json"
    line = assert_user_error(*run(capsys, "run", *argv, *flags, "-o", str(out)))
    assert flag in line
    assert not out.exists()


# ---------------------------------------------------------------- fuzzing: calibrate writes both files or none

def test_calibrate_full_disk_leaves_neither_raw_nor_profile(capsys, tmp_path, monkeypatch):
    import errno
    import paraplan.outfile as outfile
    raw = _raw(tmp_path)
    written = []
    real = outfile._write_all

    def second_fills_the_disk(fd, payload):
        written.append(len(payload))
        if len(written) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, payload)
    monkeypatch.setattr(outfile, "_write_all", second_fills_the_disk)
    code, out, err = run(capsys, "calibrate", "--from-raw", raw, "--raw", str(tmp_path / "raw_copy.json"),
                         "-o", str(tmp_path / "p.toml"))
    assert "No space left on device" in assert_user_error(code, out, err)
    assert _files(tmp_path) == ["raw.json"]


@pytest.mark.parametrize("outputs,option", [
    (lambda d, raw: ["--raw", str(d / "x.json"), "-o", str(d / "x.json")], "--raw"),
    (lambda d, raw: ["--raw", str(d / "x.json"), "-o", str(d / "." / "x.json")], "--raw"),
    (lambda d, raw: ["-o", raw], "--output"),
    (lambda d, raw: ["--raw", raw, "-o", str(d / "p.toml")], "--raw"),
])
def test_calibrate_outputs_must_differ_from_each_other_and_the_input(capsys, tmp_path, outputs, option):
    raw = _raw(tmp_path)
    before = (tmp_path / "raw.json").read_text()
    line = assert_user_error(*run(capsys, "calibrate", "--from-raw", raw, *outputs(tmp_path, raw)))
    assert f"{option}=" in line and "a file other than" in line
    assert _files(tmp_path) == ["raw.json"] and (tmp_path / "raw.json").read_text() == before


def test_calibrate_summary_keeps_a_device_name_on_one_line(capsys, tmp_path):
    m = json.loads(_measurements().to_json())
    m["device_name"] = "evil\nGEMM peak 1 GFLOP/s"
    code, out, err = run(capsys, "calibrate", "--from-raw", _raw(tmp_path, json.dumps(m)), "-o", str(tmp_path / "p.toml"))
    assert code == 0, err
    assert out.splitlines()[0].startswith("evil\\nGEMM peak 1 GFLOP/s: ")
    assert sum(line.startswith("GEMM peak") for line in out.splitlines()) == 1


# ---------------------------------------------------------------- fuzzing: compare --hardware is checked first

def test_compare_unknown_hardware_names_the_flag_not_the_report(capsys, tmp_path):
    report = _report(tmp_path)
    line = assert_user_error(*run(capsys, "compare", "--hardware", "dgx-h1000", report))
    assert "--hardware='dgx-h1000'" in line and "closest: dgx-h100" in line and report not in line
