"""Hostile input (issue 33): CSV dialects, files that never end, output that cannot be written,
numbers outside physics, SIGTERM, huge values in errors, kernel paths, a bare `paraplan`.

Cases that hung or filled the memory before their fix run in a subprocess with a time and
memory limit, so that a regression fails the test instead of stopping the suite."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap

import pytest

from paraplan.errors import FileFormatError, ParaplanError, SpecError
from paraplan.outfile import check_output
from paraplan.specs.catalog import CATALOG_DIR, load_cluster
from paraplan.specs.files import MAX_INPUT_BYTES
from support import (GPU_ROW, INFERENCE_HEADER, TRAINING_HEADER, TRAINING_ROW, assert_user_error, run, write,
                     write_csv)

SMALL = ["--model", "mpt-125m", "--gpus", "8", "--batch", "8", "--seq", "1024"]
GPU_TOML = (CATALOG_DIR / "gpus" / "h100-sxm-80gb.toml").read_text()
CLUSTER_TOML = (CATALOG_DIR / "clusters" / "dgx-h100.toml").read_text()


def _limits():  # a regression must fail, not take the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))


def _paraplan(*argv, stdout=subprocess.PIPE, env=None, timeout=120, cwd=None):
    """(exit code, stdout, stderr) of `python -m paraplan ARGV` in a child process."""
    p = subprocess.run([sys.executable, "-m", "paraplan", *map(str, argv)], stdout=stdout, stderr=subprocess.PIPE,
                       text=True, env={**os.environ, **(env or {})}, timeout=timeout, preexec_fn=_limits, cwd=cwd)
    return p.returncode, p.stdout or "", p.stderr


def _one_line_error(code, err, exit_code=2) -> str:
    assert code == exit_code, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ---------------------------------------------------------------- 1. CSV dialects

@pytest.mark.parametrize("newline,bom", [("\r", False), ("\r\n", False), ("\r", True), ("\r\n", True)])
def test_validate_reads_cr_crlf_and_bom_files(capsys, tmp_path, newline, bom):
    lf = write_csv(tmp_path, TRAINING_HEADER, [TRAINING_ROW]).read_text()
    path = tmp_path / "dialect.csv"
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + lf.replace("\r\n", "\n").replace("\n", newline).encode())
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert code == 0, err
    (row,) = json.loads(out)["rows"]
    assert row["predicted"] is not None


def test_validate_reads_a_cr_inference_file(capsys, tmp_path):
    lf = write_csv(tmp_path, INFERENCE_HEADER, [GPU_ROW]).read_text()
    path = write(tmp_path, "inf.csv", "")
    path.write_bytes(lf.replace("\r\n", "\n").replace("\n", "\r").encode())
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert "Traceback" not in err and code in (0, 1)
    assert json.loads(out)["rows"][0]["id"] == "inf-x"


def test_a_short_cr_file_is_refused_in_one_line(capsys, tmp_path):
    path = tmp_path / "cr.csv"
    path.write_bytes(b"id,source,model\r1,2,3\r")
    line = assert_user_error(*run(capsys, "validate", str(path)))
    assert f"{path}:1: missing column(s)" in line


def test_embedding_tables_read_cr_and_bom(capsys, tmp_path):
    path = tmp_path / "t.csv"
    path.write_bytes(b"\xef\xbb\xbfname,num_rows,dim\rt0,1000,64\rt1,2000,32\r")
    code, out, err = run(capsys, "embeddings", "--tables", str(path), "--gpus", "2", "--json")
    assert code == 0, err
    assert json.loads(out)


# ---------------------------------------------------------------- 2. files that never end

def _fifo(tmp_path, name):
    path = tmp_path / name
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("argv", [
    lambda d: ["estimate", "--model", "/dev/zero"],
    lambda d: ["estimate", "--model", _fifo(d, "m.toml")],
    lambda d: ["estimate", "--cluster", _fifo(d, "c.toml")],
    lambda d: ["estimate", "--hardware", "/dev/zero"],
    lambda d: ["embeddings", "--tables", _fifo(d, "t.csv")],
    lambda d: ["embeddings", "--profile", _fifo(d, "p.toml")],
    lambda d: ["compare", _fifo(d, "r.json")],
    lambda d: ["calibrate", "--from-raw", "/dev/zero"],
])
def test_a_pipe_or_device_is_refused_before_it_is_read(tmp_path, argv):
    args = argv(tmp_path)
    code, out, err = _paraplan(*args, timeout=60)
    line = _one_line_error(code, err)
    assert "is not a regular file" in line and str(args[-1]) in line


def test_a_file_over_the_limit_is_refused_naming_the_limit(capsys, tmp_path):
    path = tmp_path / "big.toml"
    with path.open("wb") as fh:
        fh.truncate(MAX_INPUT_BYTES + 1)  # sparse: nothing written
    line = assert_user_error(*run(capsys, "estimate", "--model", str(path)))
    assert str(path) in line and "16 MiB" in line


# ---------------------------------------------------------------- 3. output that cannot be written

def test_a_full_disk_is_one_line_and_exit_74():
    with open("/dev/full", "w") as full:
        code, _, err = _paraplan("presets", stdout=full)
    line = _one_line_error(code, err, exit_code=74)
    assert line == "paraplan: error: writing the output failed: No space left on device"


def test_an_ascii_terminal_gets_replacement_characters():
    code, out, err = _paraplan("presets", env={"PYTHONIOENCODING": "ascii"})
    assert code == 0 and not err
    assert "top-k?f_e" in out  # the header's '×'


# ---------------------------------------------------------------- 4. numbers bounded by physics

def _gpu_cluster(tmp_path, old, new):
    assert old in GPU_TOML
    gpu = write(tmp_path, "g.toml", GPU_TOML.replace(old, new, 1))
    body = CLUSTER_TOML[CLUSTER_TOML.index("[nvlink]"):]
    cluster = write(tmp_path, "c.toml", f'name = "c"\ngpu = "g.toml"\ngpus_per_node = 8\n{body}')
    return gpu, cluster


@pytest.mark.parametrize("old,new,field", [
    ("hbm_gb = 80.0", "hbm_gb = 1e308", "hbm_gb"),
    ("bf16 = 989.0", "bf16 = 1e308", "peak_tflops.bf16"),
    ("tdp_watts = 700.0", "tdp_watts = 1e308", "tdp_watts"),
    ("memory_bw_efficiency = 0.8", "memory_bw_efficiency = 1e-300", "memory_bw_efficiency"),
    ("kernel_launch_overhead_us = 4.0", "kernel_launch_overhead_us = 1e300", "kernel_launch_overhead_us"),
    # (the fitted share's value moves with each refit: the rest of its line becomes a comment)
    ("sustained_compute_ratio = ", "sustained_compute_ratio = 1e-300 #", "sustained_compute_ratio"),
])
def test_gpu_numbers_outside_physics_are_refused(capsys, tmp_path, old, new, field):
    gpu, cluster = _gpu_cluster(tmp_path, old, new)
    line = assert_user_error(*run(capsys, "estimate", *SMALL, "--cluster", str(cluster)))
    number = GPU_TOML.splitlines().index(next(l for l in GPU_TOML.splitlines() if old in l)) + 1
    value = new.split("= ")[1].split()[0]
    assert f"{gpu}:{number}:" in line and f"'{field}'" in line and f"{float(value)!r}" in line
    assert "a number from" in line


@pytest.mark.parametrize("old,new,field", [
    ("usd_per_gpu_hour = ", "usd_per_gpu_hour = 1e308 #", "usd_per_gpu_hour"),
])
def test_cluster_numbers_outside_physics_are_refused(tmp_path, old, new, field):
    assert old in CLUSTER_TOML
    path = write(tmp_path, "c.toml", CLUSTER_TOML.replace(old, new, 1))
    with pytest.raises(FileFormatError) as e:
        load_cluster(str(path))
    assert f"{path}:" in str(e.value) and field in str(e.value) and "a number from" in str(e.value)


def test_an_efficiency_curve_point_near_zero_is_refused(tmp_path):
    text = GPU_TOML.replace("efficiency = [", "efficiency = [1e-300, ", 1)
    _, cluster = _gpu_cluster(tmp_path, "hbm_gb = 80.0", "hbm_gb = 80.0")
    (tmp_path / "g.toml").write_text(text.replace("flops = [", "flops = [1e7, ", 1))
    with pytest.raises(FileFormatError) as e:
        load_cluster(str(cluster))
    assert "efficiency" in str(e.value) and "1e-300" in str(e.value)


def test_json_output_is_strict_at_the_edges_of_the_ranges(capsys, tmp_path):
    # the slowest memory at the lowest efficiency, the most power: finite, strict JSON
    gpu, cluster = _gpu_cluster(tmp_path, "hbm_tb_per_s = 3.35", "hbm_tb_per_s = 0.000001")
    gpu.write_text(gpu.read_text().replace("memory_bw_efficiency = 0.8", "memory_bw_efficiency = 1e-4")
                   .replace("tdp_watts = 700.0", "tdp_watts = 1e5"))
    for argv in (["estimate", *SMALL], ["serve", "--model", "mpt-125m"]):
        code, out, err = run(capsys, *argv, "--cluster", str(cluster), "--json")
        assert code == 0, err
        json.loads(out, parse_constant=lambda c: pytest.fail(f"{argv[0]} printed {c}"))


def test_a_non_finite_result_is_an_error_not_nan():
    from paraplan.report.strict_json import json_text
    with pytest.raises(ParaplanError, match=r"step_time_s is nan"):
        json_text({"plan": {"step_time_s": float("nan")}})
    assert json_text({"x": [1.0, 2]}) == '{"x": [1.0, 2]}'


# ---------------------------------------------------------------- 5. SIGTERM

def test_sigterm_while_writing_is_one_line_exit_143_and_no_temporary(tmp_path):
    out = tmp_path / "trace.json"
    script = textwrap.dedent(f"""
        import os, signal, sys
        from paraplan import outfile
        from paraplan.cli import main
        write_all = outfile._write_all
        def stop_midway(fd, payload):
            write_all(fd, payload[:10])
            os.kill(os.getpid(), signal.SIGTERM)
            write_all(fd, payload[10:])
        outfile._write_all = stop_midway
        sys.exit(main(["trace", *{SMALL!r}, "-o", {str(out)!r}]))
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       preexec_fn=_limits)
    assert p.returncode == 143, p.stderr
    assert p.stderr.strip() == "paraplan: terminated"
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 6. huge values in errors

@pytest.mark.parametrize("flag", ["--model", "--cluster", "--gpus", "--precision"])
def test_a_huge_value_is_cut_in_the_error(capsys, flag):
    line = assert_user_error(*run(capsys, "estimate", flag, "A" * 100_000))
    assert len(line) < 1000 and "100,000 characters" in line


def test_spec_error_cuts_a_long_value():
    message = str(SpecError("estimate", "--x", "B" * 5000, "a number is required"))
    assert len(message) < 200 and "..." in message and "5,000 characters" in message
    assert str(SpecError("estimate", "--x", "short", "a number is required")) == \
        "estimate: --x='short' is not allowed; a number is required"


# ---------------------------------------------------------------- 7. kernel paths as output

@pytest.mark.parametrize("path", ["/proc/self/comm", "/proc/x.json", "/sys/x.json"])
def test_an_output_under_proc_or_sys_is_refused_up_front(path):
    with pytest.raises(SpecError, match="/proc or /sys"):
        check_output(path, "trace", "--output")


@pytest.mark.parametrize("path", ["/dev/stdout", "/proc/self/fd/1", "/dev/null"])
def test_descriptors_and_devices_stay_allowed(path):
    check_output(path, "trace", "--output")


# ---------------------------------------------------------------- 8. a bare paraplan, unknown commands

def test_bare_paraplan_prints_help(capsys):
    code, out, err = run(capsys)
    assert code == 0 and not err
    assert out.startswith("usage: paraplan") and "search" in out and "estimate" in out


def test_an_unknown_command_suggests_the_nearest(capsys):
    line = assert_user_error(*run(capsys, "serch"))
    assert "unknown command 'serch'" in line and "did you mean 'search'?" in line


def test_an_unknown_option_before_any_command_points_at_the_commands(capsys):
    line = assert_user_error(*run(capsys, "--foo"))
    assert "unrecognized arguments: --foo" in line and "estimate" in line
    assert "see `paraplan --help`" in line and "search --help" not in line
