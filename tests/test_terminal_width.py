"""Text output fits the terminal: 120 columns when COLUMNS is unset or stdout is not a
terminal, the terminal's width when wider; the plan shorthand is explained under each table
of plans and in --help (report/width.py, report/legend.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support import run

from paraplan.plan.axes import CPCommType, RankOrder, Recompute, Schedule, ZeroStage
from paraplan.plan.plan import make_plan
from paraplan.report.legend import TERMS, legend_line, split_shared, unexplained
from paraplan.report.table import grid
from paraplan.specs.hardware import AttentionKernel

# each command's default output, and some with typical arguments (the default scale sweep
# takes about 20 s, the rest seconds)
COMMANDS = [
    ("search",),
    ("scale",),
    ("estimate",),
    ("estimate", "--tp", "8", "--pp", "4", "--vp", "5", "--cp", "2", "--cp-comm", "allgather", "--recompute",
     "selective", "--zero", "1"),
    ("estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--tp", "2", "--ep", "4", "--a2a-hierarchical",
     "--ep-overlap", "--whatif"),  # MoE shorthand, a plan that does not fit, the what-if table
    ("serve",),
    ("serve", "--model", "mistral-7b", "--gpus", "2", "--whatif"),
    ("embeddings",),
]
_outputs: dict[tuple, str] = {}


def _output(capsys, monkeypatch, argv: tuple, columns: int = 120) -> str:
    """stdout of `paraplan ARGV` at COLUMNS (each command runs once per width)."""
    if (argv, columns) not in _outputs:
        monkeypatch.setenv("COLUMNS", str(columns))
        code, out, err = run(capsys, *argv)
        assert code == 0, err
        _outputs[argv, columns] = out
    return _outputs[argv, columns]


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_output_fits_120_columns(capsys, monkeypatch, argv):
    out = _output(capsys, monkeypatch, argv)
    assert _widest(out) <= 120, max(out.splitlines(), key=len)


def test_wider_terminal_is_used(capsys, monkeypatch):
    # embeddings' step line is 123 characters: wrapped at 120, whole at 200
    assert _widest(_output(capsys, monkeypatch, ("embeddings",), 200)) > 120


def test_legend_under_the_search_table(capsys, monkeypatch):
    lines = _output(capsys, monkeypatch, ("search",)).splitlines()
    top = lines.index(next(x for x in lines if x.startswith("#   plan")))
    shared = lines[top - 1]
    assert shared.startswith("every plan: ")
    # the shared tokens are printed once, above the table, not in its rows
    rows = lines[top + 2: top + 12]
    for token in shared.removeprefix("every plan: ").split():
        assert not any(f" {token} " in f" {row} " for row in rows)
    legend = " ".join(" ".join(lines[top + 12:top + 16]).split())
    assert legend.startswith("legend: ") and "tpov: TP comm overlapped with GEMMs" in legend
    assert "zbv: zero-bubble V" in legend and "rc: recomputation" in legend
    assert "dualpipev" not in legend  # only the shorthand the table uses


@pytest.mark.parametrize("command,token", [("search", "tpov"), ("scale", "zbv"), ("estimate", "attn"),
                                           ("serve", "kv")])
def test_legend_in_help(capsys, monkeypatch, command, token):
    monkeypatch.setenv("COLUMNS", "120")
    code, out, _ = run(capsys, command, "--help")
    assert code == 0 and "shorthand in the tables" in out
    assert any(line.split()[:1] == [token] for line in out.splitlines()), token
    assert _widest(out) <= 120


def _every_token_plan():
    return make_plan(tp=4, pp=4, dp=8, cp=2, cp_comm_type=CPCommType.ALL_GATHER, rank_order=RankOrder.TP_CP_PP_DP,
                     ep=4, etp=2, vp=2, micro_batch_size=2, schedule=Schedule.DUAL_PIPE_V,
                     recompute=Recompute.FIRST_K, recompute_num_layers=3, sequence_parallel=True,
                     zero=ZeroStage.PARAMETERS, dp_shard=4, offload_optimizer=True, tp_overlap=True,
                     capacity_factor=1.25, a2a_hierarchical=True, ep_overlap=True,
                     attention=AttentionKernel.FLASH3, fused_kernels=False, compiled=True)


def test_every_token_a_plan_prints_is_explained():
    plan = _every_token_plan()
    described = [replace(plan, schedule=s).describe() for s in Schedule]
    described += [replace(plan, cp_comm_type=c, recompute=r).describe() for c in CPCommType for r in Recompute]
    assert unexplained(described) == []
    from paraplan.inference.deploy import AttentionSharding, ServePlan, StoreDtype
    dep = ServePlan(tp=2, pp=2, ep=2, replicas=3, weight_dtype=StoreDtype.INT4, kv_dtype=StoreDtype.FP8,
                     attention_sharding=AttentionSharding.BATCH, expert_cache_fraction=0.5)
    assert unexplained([dep.describe()]) == []


def test_legend_line_names_only_what_is_used():
    line = legend_line(["TP8 PP1 DP64 mb1 SP rc:none zero1 tpov attn:flash3"], width=120)
    assert "tpov:" in line and "zero:" in line and "zbv:" not in line and "CP:" not in line
    assert _widest(line) <= 120
    assert len({t.label for t in TERMS}) == len(TERMS)  # one meaning per label


def test_shared_tokens_leave_what_differs():
    shared, rest = split_shared(["TP8 PP1 mb1 SP tpov", "TP4 PP2 mb1 SP zbv tpov"])
    assert shared == ["mb1", "SP", "tpov"] and rest == ["TP8 PP1", "TP4 PP2 zbv"]
    assert split_shared(["TP8 PP1 SP"]) == ([], ["TP8 PP1 SP"])  # one plan keeps its whole description


def test_grid_wraps_its_column_to_the_width():
    rows = [["1", "TP4 PP2 DP32 CP2/allgather VP2 mb2 zbv zero2", "8.19 s"], ["2", "TP8 PP1 DP64 mb1", "8.2 s"]]
    table = grid(["#", "plan", "step"], rows, align="llr", width=30, wrap_col=1)
    assert _widest(table) <= 30
    assert "CP2/allgather" in table and table.count("\n") > 4  # a word is never split; rows took two lines
