"""The host time of torch's split backward (the zero-bubble schedules' B and W passes).

torch.distributed.pipelining runs a zero-bubble W pass as one autograd.grad per weight
group, each walking the graph below it: host time quadratic in the chunk's layers.
`paraplan calibrate` measures the B and W passes at negligible size (1-16 layers) and fits
c0 + c1·L + c2·L² (calibrate/profile.py split_host_fit); the cost model queues those passes
behind the GPU work (cost/evaluate.py eager_host_wait). The recorded H100 lease
(calibration/h100_zb_split/split2) checks it against stages of real size.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.calibrate.measurements import Measurements
from paraplan.calibrate.profile import build_profile, split_host_fit
from paraplan.cli import main
from paraplan.errors import FileFormatError
from paraplan.cost.evaluate import evaluate
from paraplan.cost.host import split_host_s
from paraplan.plan.axes import Schedule
from paraplan.plan.plan import make_plan
from paraplan.specs.catalog import cluster_from_text, load_cluster, load_model
from paraplan.specs.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
LEASE = ROOT / "calibration" / "h100_zb_split" / "split2"
PROFILE = LEASE / "h100.toml"
LAYERS = (1, 2, 4, 8, 16)


@settings(max_examples=60, deadline=None)
@given(*(st.one_of(st.just(0.0), st.floats(1e-7, top)) for top in (2e-3, 5e-3, 5e-4)))
def test_fit_recovers_any_non_negative_quadratic(c0, c1, c2):
    times = [c0 + c1 * n + c2 * n * n for n in LAYERS]
    if min(times) <= 0.0:
        return
    fit = split_host_fit(LAYERS, times)
    assert min(fit) >= 0.0
    for n, t in zip(LAYERS, times):
        assert split_host_s(fit, n) == pytest.approx(t, rel=1e-6)


def test_fit_keeps_every_coefficient_non_negative():
    """Times that fall off with the layers would need a negative slope: the fit keeps the
    best non-negative one instead."""
    fit = split_host_fit(LAYERS, [5e-3, 4e-3, 3e-3, 2.5e-3, 2e-3])
    assert min(fit) >= 0.0 and fit[0] > 0.0


def test_recorded_calibration_writes_the_fits_of_its_samples():
    raw = json.loads((LEASE / "h100_raw.json").read_text())
    m = Measurements.from_json(json.dumps(raw))
    assert [s.layers for s in m.split_backward] == list(LAYERS)
    gpu = cluster_from_text(build_profile(m, name="t").toml, "t").gpu
    layers = [s.layers for s in m.split_backward]
    for coef, attr in ((gpu.zb_input_host_s, "input_s"), (gpu.zb_weight_host_s, "weight_s")):
        times = [getattr(s, attr) for s in m.split_backward]
        assert coef == pytest.approx(split_host_fit(layers, times), rel=1e-3, abs=1e-9)
        for n, t in zip(layers, times):  # each sample within 10% of the fit
            assert split_host_s(coef, n) == pytest.approx(t, rel=0.10)
    # W's host time grows faster than the layers; B's about as fast
    w = [s.weight_s for s in m.split_backward]
    b = [s.input_s for s in m.split_backward]
    assert w[-1] / w[-2] > 2.5 and b[-1] / b[-2] < 2.3
    assert gpu.zb_weight_host_s[2] > 0.0


def test_split_samples_round_trip_through_the_raw_file():
    m = Measurements.from_json((LEASE / "h100_raw.json").read_text())
    assert Measurements.from_json(m.to_json()) == m
    bad = json.loads(m.to_json())
    bad["split_backward"][0]["weight_s"] = -1
    with pytest.raises(FileFormatError, match="split_backward\\[0\\].weight_s"):
        Measurements.from_json(json.dumps(bad), "raw.json")


def _compare_script():
    spec = importlib.util.spec_from_file_location("compare_zb_split", ROOT / "calibration" / "compare_zb_split.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _w_errors(profile: str) -> dict[str, list[float]]:
    """Predicted / measured − 1 of the recorded B and W passes (fp32 parameters under
    autocast, the setup the profile measured) on `profile`."""
    mod = _compare_script()
    rows = [r for r in json.loads((LEASE / "zb_split.json").read_text())["rows"] if not r["bf16_params"]]
    out = {"B": [], "W": []}
    for r in rows:
        _, _, b, w = mod.predicted(r, profile)
        out["B"].append(b / r["backward_input_s"] - 1.0)
        out["W"].append(w / r["backward_weight_s"] - 1.0)
    return out


def test_recorded_h100_w_passes_are_priced_with_their_host_time(tmp_path):
    """Six stages timed on the H100 (4 layers of Llama 3 8B's shape down to 16 of hidden 64),
    F, B and W issued back to back: with the W pass's measured host time the W passes come
    out within 25% (mean under 10%); priced as their GEMMs alone, the host-bound ones came
    out over 90% fast."""
    with_host = _w_errors(str(PROFILE))
    assert np.mean(np.abs(with_host["W"])) < 0.10 and max(map(abs, with_host["W"])) < 0.25
    assert np.mean(np.abs(with_host["B"])) < 0.12
    no_split = tmp_path / "no_split.toml"
    no_split.write_text("\n".join(line for line in PROFILE.read_text().splitlines() if not line.startswith("zb_")))
    without = _w_errors(str(no_split))
    assert min(without["W"]) < -0.9 and np.mean(np.abs(without["W"])) > 0.5


def _tiny():
    return replace(load_model("llama3-8b"), num_layers=16, hidden_size=64, num_heads=2, num_kv_heads=1, head_dim=32,
                   ffn_hidden_size=256, vocab_size=512)


def test_a_host_bound_w_pass_takes_its_host_time():
    """At negligible size the GPU waits for the host throughout: a ZB-V rank's two W passes
    of 4 layers each take what the host needs to issue them, 2 · split_host_s(c, 4)."""
    cluster = load_cluster(str(PROFILE), num_gpus=2)
    plan = make_plan(pp=2, vp=2, schedule=Schedule.ZERO_BUBBLE_V, fused_kernels=False, micro_batch_size=1)
    costs = evaluate(_tiny(), cluster, Workload(global_batch_size=8, seq_len=16), plan)
    w = float(np.ravel(costs.middle.weight_grad_s)[0])
    expected = 2.0 * split_host_s(cluster.gpu.zb_weight_host_s, 4)
    assert w == pytest.approx(expected, rel=0.05)


def test_more_layers_per_chunk_cost_more_host_time_per_layer():
    """W's walk is quadratic: a rank's 16 layers as one chunk (ZB-H1) wait longer for their W
    pass than as two chunks of 8 (ZB-V), host-bound both."""
    cluster = load_cluster(str(PROFILE), num_gpus=2)
    wl = Workload(global_batch_size=8, seq_len=16)
    spec = replace(_tiny(), num_layers=32)
    w = {s: float(np.ravel(evaluate(spec, cluster, wl, make_plan(pp=2, vp=v, schedule=s, fused_kernels=False))
                           .middle.weight_grad_s)[0])
         for s, v in ((Schedule.ZERO_BUBBLE, 1), (Schedule.ZERO_BUBBLE_V, 2))}
    c = cluster.gpu.zb_weight_host_s
    assert w[Schedule.ZERO_BUBBLE] == pytest.approx(split_host_s(c, 16), rel=0.05)
    assert w[Schedule.ZERO_BUBBLE_V] == pytest.approx(2.0 * split_host_s(c, 8), rel=0.05)
    assert w[Schedule.ZERO_BUBBLE] > 1.3 * w[Schedule.ZERO_BUBBLE_V]  # (the recorded fit: 114 vs 84 ms)


def test_other_schedules_compiled_blocks_and_presets_are_left_alone(tmp_path):
    cluster = load_cluster(str(PROFILE), num_gpus=4)
    no_split = tmp_path / "no_split.toml"
    no_split.write_text("\n".join(line for line in PROFILE.read_text().splitlines() if not line.startswith("zb_")))
    plain = load_cluster(str(no_split), num_gpus=4)
    wl = Workload(global_batch_size=16, seq_len=64)
    spec = _tiny()
    for kw in ({"schedule": Schedule.ONE_F_ONE_B}, {"schedule": Schedule.INTERLEAVED_1F1B, "vp": 2},
               {"schedule": Schedule.ZERO_BUBBLE_V, "vp": 2, "fused_kernels": True}):
        plan = make_plan(pp=4, **{"fused_kernels": False, **kw})
        a, b = (evaluate(spec, c, wl, plan).critical_stage_s for c in (cluster, plain))
        assert float(np.ravel(a)[0]) == pytest.approx(float(np.ravel(b)[0]), rel=1e-12), kw
    assert load_cluster("dgx-h100", num_gpus=8).gpu.zb_weight_host_s == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("value", ["[1.0, 2.0]", "[1.0, -2.0, 3.0]", "3.0", '["a", 1, 2]'])
def test_bad_split_host_field_is_one_line(tmp_path, capsys, value):
    text = PROFILE.read_text()
    line = next(x for x in text.splitlines() if x.startswith("zb_weight_host_us"))
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(line, f"zb_weight_host_us = {value}"))
    assert main(["estimate", "--hardware", str(bad), "--gpus", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "zb_weight_host_us" in err and "a list of 3 numbers >= 0" in err


def test_whatif_moves_the_split_passes_with_the_host():
    """--whatif's "eager host time" is one host: a slower one issues the split passes slower too."""
    from paraplan.search.whatif import Assumption, scaled_cluster
    cluster = load_cluster(str(PROFILE), num_gpus=2)
    worse = scaled_cluster(Assumption.HOST, cluster, 0.2, worse=True)
    assert worse.gpu.zb_weight_host_s == pytest.approx(tuple(1.2 * c for c in cluster.gpu.zb_weight_host_s))
    assert worse.gpu.zb_input_host_s == pytest.approx(tuple(1.2 * c for c in cluster.gpu.zb_input_host_s))
    plan = make_plan(pp=2, vp=2, schedule=Schedule.ZERO_BUBBLE_V, fused_kernels=False)
    wl = Workload(global_batch_size=8, seq_len=16)
    w = [float(np.ravel(evaluate(_tiny(), c, wl, plan).middle.weight_grad_s)[0]) for c in (cluster, worse)]
    assert w[1] == pytest.approx(1.2 * w[0], rel=0.05)
