"""validate's summary: error statistics per group, and the GPU generations rows are grouped under."""

import math

from paraplan.validate.rows import error_stats, generation, summarize


def _row(source, gpu, moe, error_pct):
    return {"id": "r", "source": source, "model": "m", "metric_id": "iteration_time_s", "measured": 1.0,
            "predicted": 1.0 + error_pct / 100.0, "error_pct": error_pct, "skipped": None, "plan": "",
            "gpu": gpu, "moe": moe}


def test_error_stats_nearest_rank_p90():
    errs = [float(i) for i in range(1, 21)]  # 1..20: the 90th percentile by nearest rank is the 18th
    s = error_stats(errs)
    assert s["n"] == 20 and math.isclose(s["mean_abs_pct_error"], 10.5)
    assert s["p90_abs_pct_error"] == 18.0 and s["max_abs_pct_error"] == 20.0
    assert error_stats([]) == {"n": 0, "mean_abs_pct_error": None, "p90_abs_pct_error": None,
                               "max_abs_pct_error": None}


def test_generation_pools_one_die_and_keeps_unknown_presets_apart():
    assert generation("gb200") == generation("b200") != generation("gb300") == generation("b300")
    assert generation("h200-sxm-141gb") == generation("h100-sxm-80gb") != generation("a100-sxm-80gb")
    assert generation("some-new-gpu") == "some-new-gpu"  # not in the table: a group of its own


def test_summary_groups_by_generation_and_moe():
    rows = [_row("a", "h100-sxm-80gb", False, 5.0), _row("a", "h200-sxm-141gb", True, -15.0),
            _row("b", "gb200", True, 30.0), _row("b", "b200", False, -2.0)]
    rows.append({**_row("b", "gb200", True, 0.0), "predicted": None, "error_pct": None, "skipped": "no batch"})
    s = summarize(rows)
    assert list(s["by_generation"]) == ["B200/GB200", "H100/H200"]
    assert s["by_generation"]["H100/H200"]["n"] == 2 and s["by_generation"]["H100/H200"]["mean_abs_pct_error"] == 10.0
    assert s["by_generation"]["B200/GB200"]["max_abs_pct_error"] == 30.0  # the skipped row counts nowhere
    assert s["moe"]["n"] == 2 and s["moe"]["mean_abs_pct_error"] == 22.5 and s["moe"]["max_abs_pct_error"] == 30.0
    assert s["n"] == 5 and s["n_predicted"] == 4 and math.isclose(s["mean_abs_pct_error"], 13.0)


def test_summary_without_gpu_has_no_groups():
    """Inference rows say no GPU preset: no generation or MoE section."""
    rows = [{k: v for k, v in _row("a", None, None, 4.0).items() if k not in ("gpu", "moe")}]
    s = summarize(rows)
    assert "by_generation" not in s and "moe" not in s
