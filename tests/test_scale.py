"""`paraplan scale`: the best plan at each GPU count of a sweep, and the search property it
leans on (an unpinned search is never slower than a pinned one)."""

from __future__ import annotations

import json
import math

import pytest
from support import assert_user_error, closed_form_step_s, run

from paraplan.cost.estimate import estimate
from paraplan.plan.axes import Schedule
from paraplan.plan.plan import make_plan
from paraplan.search.planner import search
from paraplan.search.scaling import scale
from paraplan.specs.catalog import load_cluster, load_model
from paraplan.specs.workload import Workload

SMALL = ["--model", "llama3-8b", "--seq", "4096", "--batch", "64", "--tokens", "1e11"]


def test_scale_json_points_are_each_counts_own_search(capsys):
    code, out, err = run(capsys, "scale", *SMALL, "--counts", "32,8,16", "--json")
    assert code == 0, err
    d = json.loads(out)
    pts = d["points"]
    assert [p["num_gpus"] for p in pts] == [8, 16, 32]  # sorted, each once
    for p in pts:
        assert p["why_not"] is None and p["best"]["num_gpus"] == p["num_gpus"]
        # the same plan searched directly: scale adds nothing of its own to a point
        code, out1, _ = run(capsys, "search", *SMALL, "--gpus", str(p["num_gpus"]), "--top", "1", "--json")
        direct = json.loads(out1)["ranked"][0]
        assert math.isclose(direct["step_time_s"], p["best"]["step_time_s"], rel_tol=1e-12)
    assert pts[0]["scaling_efficiency"] == 1.0
    base = pts[0]["best"]["tokens_per_s_per_gpu"]
    for p in pts:
        assert math.isclose(p["scaling_efficiency"], p["best"]["tokens_per_s_per_gpu"] / base, rel_tol=1e-12)
    walls = {p["num_gpus"]: p["best"]["budget"]["with_failures"]["wall_time_s"] for p in pts}
    gpuh = {p["num_gpus"]: p["best"]["budget"]["with_failures"]["wall_gpu_hours"] for p in pts}
    assert d["fastest_num_gpus"] == min(walls, key=walls.get)
    assert d["cheapest_num_gpus"] == min(gpuh, key=gpuh.get)


def test_scale_table_names_soonest_and_cheapest(capsys):
    code, out, err = run(capsys, "scale", *SMALL, "--counts", "8,32")
    assert code == 0, err
    # (a plan column every row shares moves to an "every plan:" line; headers take two lines)
    assert ("best plan" in out or "every plan:" in out) and "time to" in out and "train" in out
    assert ("soonest:" in out and "cheapest:" in out) or "both soonest and for the fewest GPU-hours" in out


def test_a_count_without_a_plan_is_a_row_with_its_reason():
    # 70B on one H100 cannot fit; 64 GPUs can
    model, wl = load_model("llama3-70b"), Workload(global_batch_size=64, seq_len=4096)
    res = scale(model, [load_cluster("dgx-h100", num_gpus=n) for n in (1, 64)], wl)
    one, many = res.points
    assert one.best is None and "fits" in one.why_not and one.efficiency is None
    assert many.best is not None and many.efficiency == 1.0  # the first count with a plan is the base
    assert res.fastest is many and res.cheapest is many


def test_pins_no_count_allows_are_one_line_errors(capsys):
    code, out, err = run(capsys, "scale", *SMALL, "--counts", "8,16", "--tp", "16")
    assert_user_error(code, out, err)
    assert "--tp=16" in err


@pytest.mark.parametrize("counts", ["", "8,x", "0", "8,-16", "1.5"])
def test_bad_counts_are_one_line_errors(capsys, counts):
    code, out, err = run(capsys, "scale", *SMALL, "--counts", counts)
    assert_user_error(code, out, err)
    assert "--counts" in err and len(err.strip().splitlines()) == 1


def test_scale_plot_path_is_checked_before_searching(capsys, tmp_path):
    code, out, err = run(capsys, "scale", *SMALL, "--counts", "8", "--plot", str(tmp_path / "x.bad"))
    assert_user_error(code, out, err)
    assert ".png" in err
    assert not list(tmp_path.iterdir())


def test_scale_plot_writes_an_image(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "scale.png"
    code, out, err = run(capsys, "scale", *SMALL, "--counts", "8,16", "--plot", str(path))
    assert code == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"wrote {path}" in out


def test_unpinned_search_is_never_slower_than_a_pinned_one():
    # Llama 3 70B, 512 sequences on 8,192 H100: the closed form once promised breadth-first
    # plans with one micro-batch per PP2 pipeline a 10% bubble (46% simulated), and 64 of them
    # filled the simulated set ahead of the better PP=1 plans
    model, wl = load_model("llama3-70b"), Workload(global_batch_size=512, seq_len=8192)
    cluster = load_cluster("dgx-h100", num_gpus=8192)
    free = search(model, cluster, wl, top_k=1).ranked[0]
    for pins in ({"pp": 1}, {"pp": 2}):
        pinned = search(model, cluster, wl, fixed=pins, top_k=1).ranked[0]
        assert free.step_time_s <= pinned.step_time_s * (1 + 1e-9), (pins, free.plan.describe(), pinned.plan.describe())


@pytest.mark.parametrize("p,m,v", [(2, 1, 4), (2, 1, 8), (4, 2, 2), (8, 1, 4), (8, 4, 2), (4, 4, 2), (4, 8, 2)])
def test_closed_form_step_tracks_the_simulated_breadth_first_step(p, m, v):
    # the search ranks by the closed form and simulates only its best: with fewer
    # micro-batches than stages a breadth-first loop waits p−m chunk slots in each later
    # loop, which the closed form must count ((2, 1, 8) was 0.29 s closed vs 0.43 s simulated)
    model = load_model("llama3-8b")
    cluster = load_cluster("dgx-h100", num_gpus=8 * p)
    wl = Workload(global_batch_size=8 * m, seq_len=2048)
    plan = make_plan(tp=8, pp=p, dp=1, vp=v, micro_batch_size=8, schedule=Schedule.BREADTH_FIRST)
    simulated = estimate(model, cluster, wl, plan)
    closed = closed_form_step_s(model, cluster, wl, plan)
    assert simulated.time.bubble_s > 0
    assert math.isclose(closed, simulated.step_time_s, rel_tol=0.10), (closed, simulated.step_time_s)


def test_no_count_with_a_plan_is_a_one_line_error(capsys):
    code, out, err = run(capsys, "scale", "--model", "llama3-70b", "--counts", "1,2", "--batch", "64", "--seq", "4096")
    assert_user_error(code, out, err)
    assert "no plan at any of 1, 2 GPUs" in err and len(err.strip().splitlines()) == 1


def test_a_count_without_a_plan_is_a_short_row_and_a_note(capsys):
    code, out, err = run(capsys, "scale", "--model", "llama3-70b", "--counts", "1,64", "--batch", "64", "--seq", "4096",
                         "--tokens", "1e11")
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("1 "))
    assert "no plan (note 1)" in row and len(row) < 200
    assert any(line.startswith("note 1: 1 GPUs: no plan fits") for line in out.splitlines())


def test_the_scaling_plot_stacks_every_part_of_the_step_once():
    """Each bar of `paraplan scale --plot` is the best plan's step: the groups cover every
    TimeBreakdown field once (the GPU waiting for its host was left out when it was added)."""
    from dataclasses import fields

    from paraplan.cost.breakdown import TimeBreakdown
    from paraplan.report.plots import STEP_PART_GROUPS
    grouped = [f for group in STEP_PART_GROUPS.values() for f in group]
    assert sorted(grouped) == sorted(f.name for f in fields(TimeBreakdown))


def test_scale_sweeps_several_clusters_and_picks_across_them(capsys):
    code, out, err = run(capsys, "scale", *SMALL, "--counts", "16,8", "--cluster", "dgx-h100,dgx-a100-80gb", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["clusters"] == ["dgx-h100", "dgx-a100-80gb"]
    pts = d["points"]
    assert [(p["cluster"], p["num_gpus"]) for p in pts] == [("dgx-h100", 8), ("dgx-h100", 16),
                                                             ("dgx-a100-80gb", 8), ("dgx-a100-80gb", 16)]
    for p in pts:  # each point is that cluster's own search
        code, out1, _ = run(capsys, "search", *SMALL, "--cluster", p["cluster"], "--gpus", str(p["num_gpus"]),
                            "--top", "1", "--json")
        assert math.isclose(json.loads(out1)["ranked"][0]["step_time_s"], p["best"]["step_time_s"], rel_tol=1e-12)
    # scaling is against the same cluster's smallest count
    assert pts[0]["scaling_efficiency"] == 1.0 and pts[2]["scaling_efficiency"] == 1.0
    assert math.isclose(pts[3]["scaling_efficiency"],
                        pts[3]["best"]["tokens_per_s_per_gpu"] / pts[2]["best"]["tokens_per_s_per_gpu"], rel_tol=1e-12)
    # the soonest by wall time and the cheapest by dollars, across both clusters (their prices differ)
    wall = {(p["cluster"], p["num_gpus"]): p["best"]["budget"]["with_failures"]["wall_time_s"] for p in pts}
    usd = {(p["cluster"], p["num_gpus"]): p["best"]["budget"]["with_failures"]["wall_usd"] for p in pts}
    assert (d["fastest_cluster"], d["fastest_num_gpus"]) == min(wall, key=wall.get)
    assert (d["cheapest_cluster"], d["cheapest_num_gpus"]) == min(usd, key=usd.get)
    code, out, err = run(capsys, "scale", *SMALL, "--counts", "8", "--cluster", "dgx-h100,dgx-a100-80gb")
    lines = out.splitlines()
    header = lines[: next(i for i, x in enumerate(lines) if x.startswith("---"))]
    assert code == 0 and any(x.startswith("cluster") for x in header) and "dgx-a100-80gb" in out


@pytest.mark.parametrize("clusters, says", [("dgx-h100,,dgx-b200", "separated by commas"),
                                            ("dgx-h100,dgx-h1OO", "dgx-h100"),
                                            ("dgx-h100,DGX H100", "distinct names")])
def test_bad_cluster_lists_are_one_line_errors(capsys, clusters, says):
    line = assert_user_error(*run(capsys, "scale", *SMALL, "--counts", "8", "--cluster", clusters))
    assert says in line


def test_a_gpu_no_measured_run_checks_is_named(capsys):
    code, out, _ = run(capsys, "estimate", *SMALL, "--gpus", "8", "--dp", "8", "--cluster", "mi300x-8")
    assert code == 0 and "no measured training run checks mi300x" in out.splitlines()[1]
    # the B200's knobs are fitted to NeMo's published B200 runs (calibration/fit_presets.sh)
    for cluster in ("dgx-h100", "dgx-b200"):
        code, out, _ = run(capsys, "estimate", *SMALL, "--gpus", "8", "--dp", "8", "--cluster", cluster)
        assert code == 0 and "no measured training run checks" not in out
    code, out, _ = run(capsys, "scale", *SMALL, "--counts", "8", "--cluster", "dgx-h100,l40s-pcie-8,mi300x-8")
    assert code == 0 and "no measured training run checks l40s, mi300x" in out

    code, out, _ = run(capsys, "scale", *SMALL, "--counts", "8", "--cluster", "dgx-h100,mi300x-8", "--json")
    assert code == 0 and json.loads(out)["unchecked_gpus"] == ["mi300x"] and json.loads(out)["cluster"] is None


def test_several_clusters_say_what_each_gpu_hour_cost(capsys):
    code, out, _ = run(capsys, "scale", *SMALL, "--counts", "8", "--cluster", "dgx-h100,dgx-a100-80gb")
    assert code == 0 and "$/GPU-hour: dgx-h100 $2.99, dgx-a100-80gb $1.79" in out
    code, out, _ = run(capsys, "scale", *SMALL, "--counts", "8", "--cluster", "dgx-h100,dgx-a100-80gb", "--price", "2")
    assert code == 0 and "$/GPU-hour: dgx-h100 $2.00, dgx-a100-80gb $2.00 (--price)" in out
    line = assert_user_error(*run(capsys, "scale", *SMALL, "--counts", "8", "--cluster", "dgx-h100,dgx-b200",
                                  "--hardware", "dgx-h200"))
    assert "--hardware" in line and "--cluster" in line


@pytest.mark.parametrize("command", [["search"], ["estimate", "--tp", "8", "--dp", "64"]])
def test_a_cluster_list_outside_scale_says_where_lists_belong(capsys, command):
    line = assert_user_error(*run(capsys, *command, "--cluster", "dgx-h100,dgx-b200"))
    assert "paraplan scale" in line


def test_pins_no_cluster_allows_name_every_cluster(capsys):
    line = assert_user_error(*run(capsys, "scale", *SMALL, "--counts", "8,16", "--cluster", "dgx-h100,dgx-b200",
                                  "--tp", "16"))
    assert "--tp" in line and "dgx-h100, dgx-b200" in line
