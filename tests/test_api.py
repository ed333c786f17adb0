"""The Python API (paraplan/api.py): its docstring's example runs, it returns the typed
results the CLI prints, and `import paraplan` stays light."""

from __future__ import annotations

import doctest
import subprocess
import sys

import pytest

import paraplan
from paraplan import api
from paraplan.cost.estimate import Estimate
from paraplan.errors import ParaplanError
from paraplan.search.planner import SearchResult
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload


def test_the_docstring_example_runs():
    result = doctest.testmod(api, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 8 and result.failed == 0


def test_import_paraplan_loads_no_engine():
    code = ("import sys, paraplan; heavy = [m for m in sys.modules if m.startswith('paraplan.') or m == 'numpy']; "
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_search_is_the_package_and_the_function():
    import paraplan.search.planner  # noqa: F401  (the subpackage stays importable)
    res = paraplan.search("llama3-8b", gpus=8, seq_len=2048, global_batch_size=32, top=2, tp=2)
    assert isinstance(res, SearchResult) and len(res.ranked) == 2
    assert all(isinstance(e, Estimate) and e.plan.tp == 2 for e in res.ranked)


def test_spec_objects_and_names_give_the_same_estimate():
    by_name = paraplan.estimate("llama3-8b", "dgx-h100", gpus=16, seq_len=2048, global_batch_size=32, tp=4, pp=2)
    by_spec = paraplan.estimate(load_model("llama3-8b"), load_cluster("dgx-h100"), gpus=16,
                                workload=Workload(global_batch_size=32, seq_len=2048), plan=by_name.plan)
    assert by_name.step_time_s == by_spec.step_time_s and by_name.plan.dp == 2


def test_estimate_matches_the_cli(capsys):
    from paraplan.cli import main
    import json
    assert main(["estimate", "--model", "llama3-8b", "--gpus", "16", "--seq", "2048", "--batch", "32",
                 "--tp", "4", "--pp", "2", "--engine", "megatron", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    est = paraplan.estimate("llama3-8b", gpus=16, seq_len=2048, global_batch_size=32, tp=4, pp=2, engine="megatron")
    assert cli["step_time_s"] == est.step_time_s


def test_a_wrong_argument_is_a_one_line_error():
    with pytest.raises(ParaplanError, match="tpp"):
        paraplan.estimate("llama3-8b", gpus=8, tpp=2)
    with pytest.raises(ParaplanError, match="recompute"):
        paraplan.estimate("llama3-8b", gpus=8, recompute="sometimes")
