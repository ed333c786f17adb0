"""Bad input to `paraplan validate` and `paraplan embeddings`: one line naming the file, the
line, the field and the value, exit 2, no traceback and no partial output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraplan.embeddings.tables import load_embedding_workload, load_profile
from paraplan.errors import FileFormatError

from support import (GPU_ROW, INFERENCE_HEADER, TPU_ROW, TRAINING_HEADER, TRAINING_ROW, assert_user_error, run, write,
                     write_csv)

VALIDATION = Path(__file__).resolve().parents[2] / "shared" / "validation"

def _csv(tmp_path, header, row, name="rows.csv", **changes) -> Path:
    return write_csv(tmp_path, header, [{**row, **changes}], name)


def _validate_error(capsys, path: Path) -> str:
    """The one error line of `paraplan validate PATH --json`, which prints nothing else."""
    code, out, err = run(capsys, "validate", str(path), "--json")
    line = assert_user_error(code, out, err)
    assert not out
    return line


def _skip_reason(capsys, path: Path) -> str:
    """The reason `paraplan validate PATH --json` gives for skipping the file's one row (a
    malformed cell skips its row, not the file: exit 1 as nothing was predicted)."""
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert code == 1, err
    (row,) = json.loads(out)["rows"]
    assert row["predicted"] is None and row["skipped"]
    return row["skipped"]


# ---------------------------------------------------------------- validate: malformed cells

@pytest.mark.parametrize("column,value", [
    ("value", "0"), ("value", "-3"), ("value", "nan"), ("value", "inf"),
    ("micro_batch", "0"), ("dp", "0"), ("tp", "0"), ("num_gpus", "0"), ("global_batch", "-4"), ("layers", "0"),
    ("seq_len", "inf"), ("pp", "inf"), ("pp", "2.5"), ("seq_len", "nan"), ("vp", "-1"),
    ("gpus_per_node", "0"), ("zero", "7"), ("sp", "maybe"), ("seq_len", "1e300"),
    ("global_batch", str(2**62)),  # the planner never returns for such a batch
])
def test_training_malformed_cell_names_file_line_column_value(capsys, tmp_path, column, value):
    path = _csv(tmp_path, TRAINING_HEADER, TRAINING_ROW, **{column: value})
    line = _skip_reason(capsys, path)
    assert f"{path}:2:" in line and repr(column) in line and repr(value) in line
    assert "allowed" in line or "required" in line


@pytest.mark.parametrize("column,value", [
    ("value", "0"), ("value", "nan"), ("input_len", "inf"), ("input_len", "-5"), ("batch_or_concurrency", "0"),
    ("batch_or_concurrency", "2.5"), ("num_gpus", "0"), ("tp", "0"), ("output_len", "1.5"),
])
def test_tpu_inference_malformed_cell(capsys, tmp_path, column, value):
    path = _csv(tmp_path, INFERENCE_HEADER, TPU_ROW, **{column: value})
    line = _skip_reason(capsys, path)
    assert f"{path}:2:" in line and repr(column) in line and repr(value) in line


@pytest.mark.parametrize("column,value", [
    ("tp", "0"), ("num_gpus", "0"), ("pp", "inf"), ("input_len", "0"),
    ("batch_or_concurrency", "QPS=1.2.3"), ("batch_or_concurrency", "QPS=0"),
])
def test_gpu_inference_malformed_cell(capsys, tmp_path, column, value):
    path = _csv(tmp_path, INFERENCE_HEADER, GPU_ROW, **{column: value})
    line = _skip_reason(capsys, path)
    assert f"{path}:2:" in line and repr(column) in line and repr(value) in line


@pytest.mark.parametrize("header,row,bad", [(TRAINING_HEADER, TRAINING_ROW, {"zero": "ZeRO-7"}),
                                            (TRAINING_HEADER, TRAINING_ROW, {"precision": "int3"}),
                                            (INFERENCE_HEADER, GPU_ROW, {"precision": "int3"})])
def test_one_unreadable_row_does_not_refuse_the_file(capsys, tmp_path, header, row, bad):
    # a whole file refused for one row's value would lose every other row: the bad row is
    # skipped naming its line and column, the good one is still predicted
    path = write_csv(tmp_path, header, [{**row, **bad}, {**row, "id": "good"}])
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert code == 0, err
    first, second = json.loads(out)["rows"]
    (column,) = bad
    assert first["predicted"] is None and f"{path}:2:" in first["skipped"] and repr(column) in first["skipped"]
    assert second["skipped"] is None and second["predicted"] > 0


@pytest.mark.parametrize("header,row", [(TRAINING_HEADER, TRAINING_ROW), (INFERENCE_HEADER, TPU_ROW)])
def test_too_few_and_too_many_cells(capsys, tmp_path, header, row):
    good = ",".join(f'"{row[c]}"' for c in header)
    few = write(tmp_path, "few.csv", ",".join(header) + "\n" + good + "\na,b,c\n")
    line = _validate_error(capsys, few)
    assert f"{few}:3:" in line and "3 cells" in line and f"{len(header)}" in line
    many = write(tmp_path, "many.csv", ",".join(header) + "\n" + good + ",extra\n")
    line = _validate_error(capsys, many)
    assert f"{many}:2:" in line and f"{len(header) + 1} cells" in line


@pytest.mark.parametrize("header,row", [(TRAINING_HEADER, TRAINING_ROW), (INFERENCE_HEADER, TPU_ROW)])
def test_non_utf8_file_names_the_line(capsys, tmp_path, header, row):
    path = _csv(tmp_path, header, row, notes="café")
    path.write_bytes(path.read_bytes().replace("é".encode(), b"\xe9"))
    line = _validate_error(capsys, path)
    assert f"{path}:2:" in line and "UTF-8" in line and "0xe9" in line


def test_blank_lines_and_utf8_bom_are_fine(capsys, tmp_path):
    path = _csv(tmp_path, TRAINING_HEADER, TRAINING_ROW, metric_id="not_a_metric")
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes() + b"\r\n")
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert code == 1, err  # its one row skipped: nothing checked (cli.cmd_validate)
    (row,) = json.loads(out)["rows"]
    assert row["skipped"] == "unknown metric_id 'not_a_metric'"


# ---------------------------------------------------------------- validate: rows skipped with a reason

@pytest.mark.parametrize("header,row,column", [
    (TRAINING_HEADER, TRAINING_ROW, "seq_len"), (TRAINING_HEADER, TRAINING_ROW, "global_batch"),
    (TRAINING_HEADER, TRAINING_ROW, "num_gpus"), (INFERENCE_HEADER, TPU_ROW, "input_len"),
])
def test_blank_required_cell_skips_the_row_with_its_reason(capsys, tmp_path, header, row, column):
    path = _csv(tmp_path, header, row, **{column: ""})
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert code == 1, err  # its one row skipped: nothing checked (cli.cmd_validate)
    d = json.loads(out)
    (r,) = d["rows"]
    assert r["predicted"] is None and column in r["skipped"]
    assert d["summary"]["n_skipped"] == 1


@pytest.mark.parametrize("gpu", ["Z100", "H1000", "xH100"])
def test_unknown_gpu_skips_its_row_with_the_closest_names(capsys, tmp_path, gpu):
    # a GPU family counts only as a whole word ("H1000" is no H100); a GPU without a preset
    # lacks what a prediction needs: its row is skipped, naming line, column and the
    # closest presets (one such row must not refuse a file of published runs)
    path = _csv(tmp_path, TRAINING_HEADER, TRAINING_ROW, gpu=gpu)
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert code == 1, err  # its one row skipped: nothing checked (cli.cmd_validate)
    (r,) = json.loads(out)["rows"]
    assert r["predicted"] is None
    assert f"{path}:2" in r["skipped"] and "gpu=" in r["skipped"] and repr(gpu) in r["skipped"]
    assert "closest: H100" in r["skipped"]


@pytest.mark.parametrize("gpu,cluster", [("H100 80GB HBM3", "dgx-h100"), ("A100-SXM4-80GB", "dgx-a100-80gb"),
                                         ("a100 40gb", "dgx-a100-40gb"), ("H200", "dgx-h200"),
                                         ("dgx-h100", "dgx-h100")])
def test_gpu_names_and_aliases_pick_their_cluster(gpu, cluster):
    from paraplan.validate.training import gpu_cluster_for
    assert gpu_cluster_for({**TRAINING_ROW, "gpu": gpu}, "rows.csv", 2) == cluster


def test_gpus_not_a_multiple_of_the_replica_skips_the_row(capsys, tmp_path):
    path = _csv(tmp_path, INFERENCE_HEADER, GPU_ROW, num_gpus="4", tp="8")
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert code == 1, err  # its one row skipped: nothing checked (cli.cmd_validate)
    (r,) = json.loads(out)["rows"]
    assert "num_gpus" in r["skipped"] and "multiple" in r["skipped"]


# ---------------------------------------------------------------- embeddings: locality profile

PROFILE = """\
name = "p"
num_tables = 10
batch_size = 100
num_indices = 4000
num_unique_rows = 1000
bin_edges = [0, 1, 4]
index_share = [0.2, 0.3, 0.5]
"""


def test_the_profile_used_here_is_valid(tmp_path):
    prof = load_profile(str(write(tmp_path, "p.toml", PROFILE)))
    assert prof.unique_share == 0.25 and prof.ids_per_sample_per_table == 4.0


@pytest.mark.parametrize("old,new,field", [
    ("bin_edges = [0, 1, 4]", "bin_edges = 5", "bin_edges"),
    ("bin_edges = [0, 1, 4]", 'bin_edges = [0, "x", 4]', "bin_edges"),
    ("bin_edges = [0, 1, 4]", "bin_edges = [0, 4, 1]", "bin_edges"),
    ("bin_edges = [0, 1, 4]", "bin_edges = [0, 1, 1]", "bin_edges"),
    ("bin_edges = [0, 1, 4]", "bin_edges = [-1, 1, 4]", "bin_edges"),
    ("bin_edges = [0, 1, 4]", "bin_edges = [0, 1.5, 4]", "bin_edges"),
    ("index_share = [0.2, 0.3, 0.5]", 'index_share = [0.2, "x", 0.5]', "index_share"),
    ("index_share = [0.2, 0.3, 0.5]", "index_share = [-0.2, 0.7, 0.5]", "index_share"),
    ("index_share = [0.2, 0.3, 0.5]", "index_share = [0.2, 0.3, 0.3]", "index_share"),
    ("index_share = [0.2, 0.3, 0.5]", "index_share = [0.2, nan, 0.5]", "index_share"),
    ("index_share = [0.2, 0.3, 0.5]", "index_share = [0.2, 0.8]", "index_share"),
    ('num_indices = 4000', 'num_indices = "x"', "num_indices"),
    ('num_indices = 4000', 'num_indices = 0', "num_indices"),
    ('num_indices = 4000', 'num_indices = 4000.5', "num_indices"),
    ('num_unique_rows = 1000', 'num_unique_rows = 5000', "num_unique_rows"),
    ('num_unique_rows = 1000', 'num_unique_rows = -1', "num_unique_rows"),
    ('batch_size = 100', 'batch_size = 0', "batch_size"),
    ('num_tables = 10', 'num_tables = true', "num_tables"),
    ('name = "p"', 'name = 3', "name"),
    ('name = "p"', 'bin_edge = [0]', "bin_edge"),
])
def test_bad_profile_field_names_line_field_and_value(capsys, tmp_path, old, new, field):
    text = PROFILE.replace(old, new)
    assert text != PROFILE
    p = write(tmp_path, "p.toml", text)
    line = assert_user_error(*run(capsys, "embeddings", "--profile", str(p), "--gpus", "8"))
    n = text.splitlines().index(new.splitlines()[0]) + 1
    assert f"{p}:{n}:" in line and field in line


def test_empty_profile_lists_are_rejected(capsys, tmp_path):
    p = write(tmp_path, "p.toml", PROFILE.replace("[0, 1, 4]", "[]").replace("[0.2, 0.3, 0.5]", "[]"))
    line = assert_user_error(*run(capsys, "embeddings", "--profile", str(p), "--gpus", "8"))
    assert "bin_edges" in line and "non-empty" in line


def test_profile_batch_size_without_num_tables(tmp_path):
    p = write(tmp_path, "p.toml", PROFILE.replace("num_tables = 10\n", ""))
    with pytest.raises(FileFormatError, match="batch_size.*num_tables"):
        load_profile(str(p))


# ---------------------------------------------------------------- embeddings: tables CSV

@pytest.mark.parametrize("cells,field,value", [
    ("a,1000,16,nan,4", "pooling_factor", "nan"),
    ("a,1000,16,inf,4", "pooling_factor", "inf"),
    ("a,1000,16,1,nan", "weight_bytes", "nan"),
    ("a,1000,16,1,inf", "weight_bytes", "inf"),
    ("a,1e15,16,1,4", "num_rows", "1e15"),
    ("a,10000000000000000000,16,1,4", "num_rows", "10000000000000000000"),
    ("a,1000,16.5,1,4", "dim", "16.5"),
    (",1000,16,1,4", "name", ""),
])
def test_bad_tables_cell_names_line_field_and_value(capsys, tmp_path, cells, field, value):
    # the comment line counts: errors name the line of the file, not of the comment-free text
    p = write(tmp_path, "t.csv", "# comment\nname,num_rows,dim,pooling_factor,weight_bytes\nok,10,4\n" + cells + "\n")
    line = assert_user_error(*run(capsys, "embeddings", "--tables", str(p), "--gpus", "8"))
    assert f"{p}:4:" in line and f"{field}={value!r}" in line


@pytest.mark.parametrize("cells,count", [("a,1000", 2), ("a,1000,16,1,4,9", 6)])
def test_tables_row_with_wrong_cell_count(tmp_path, cells, count):
    p = write(tmp_path, "t.csv", "name,num_rows,dim,pooling_factor,weight_bytes\n" + cells + "\n")
    with pytest.raises(FileFormatError, match=rf"t\.csv:2: .*{count} cells.* 5"):
        load_embedding_workload(str(p))


def test_tables_csv_largest_int64_row_count_is_accepted(tmp_path):
    p = write(tmp_path, "t.csv", f"name,num_rows,dim\na,{2**63 - 1},16\n")
    (t,) = load_embedding_workload(str(p)).tables
    assert t.num_rows == 2**63 - 1


def test_published_files_still_parse_without_error():
    # every published row has all its cells and valid values (0 skipped is checked end to end)
    from paraplan.validate.rows import read_rows, row_result
    from paraplan.validate.training import REQUIRED_COLUMNS, row_setup
    path = str(VALIDATION / "training_dev.csv")
    if not Path(path).is_file():
        pytest.skip("published validation data not present")
    for line, row in read_rows(path, REQUIRED_COLUMNS, "a training file"):
        row_result(row, path, line, ("iteration_time_s",))
        row_setup(row, path, line)


# ---------------------------------------------------------------- validate: fuzzing

def test_a_column_named_twice_refuses_the_file(capsys, tmp_path):
    path = tmp_path / "rows.csv"
    header = TRAINING_HEADER + ["tp"]
    path.write_text(",".join(header) + "\n" + ",".join([TRAINING_ROW[c] for c in TRAINING_HEADER] + ["4"]) + "\n")
    line = _validate_error(capsys, path)
    assert f"{path}:1:" in line and "'tp'" in line and "2 times" in line


@pytest.mark.parametrize("column,value,rule", [("kv_heads", "3", "must divide"), ("hidden", "6145", "multiple of heads")])
def test_an_architecture_no_model_has_skips_its_row_naming_the_cell(capsys, tmp_path, column, value, rule):
    path = _csv(tmp_path, TRAINING_HEADER, TRAINING_ROW, **{column: value})
    code, out, err = run(capsys, "validate", str(path), "--json")
    assert code == 1, err  # its one row skipped: nothing checked (cli.cmd_validate)
    (r,) = json.loads(out)["rows"]
    assert r["predicted"] is None
    assert f"{path}:2" in r["skipped"] and f"{column}={value!r}" in r["skipped"] and rule in r["skipped"]


@pytest.mark.parametrize("make,says", [
    (lambda d: (d / "somedir").mkdir() or d / "somedir", "is a directory"),
    (lambda d: Path("/dev/null"), "is empty"),
    (lambda d: write(d, "empty.csv", ""), "is empty"),
    (lambda d: d / "missing.csv", "no such file"),
])
def test_validate_says_what_the_path_is(capsys, tmp_path, make, says):
    path = make(tmp_path)
    line = _validate_error(capsys, path)
    assert f"error: {path}: {says}" in line
