"""The type checker over the engine's core: mypy on specs, plan, cost and sim (and the `Num`
alias they share) must report no error. Its settings are pyproject.toml's [tool.mypy]."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("paraplan/specs", "paraplan/plan", "paraplan/cost", "paraplan/sim", "paraplan/num.py")


def test_mypy_passes_on_specs_plan_cost_and_sim(monkeypatch):
    api = pytest.importorskip("mypy.api", reason="mypy is in the `test` extra")
    monkeypatch.chdir(ROOT / "src")
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-incremental",
                                *CHECKED])
    assert status == 0, out + err
    assert "no issues found" in out
