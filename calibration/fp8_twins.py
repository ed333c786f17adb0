"""FP8 runs against their BF16 twins: the same source, GPU, model, GPU count, batch, sequence and
TP/PP/EP/CP layout, measured in both precisions. For each pair, how much faster paraplan
predicts the FP8 run relative to its twin than was measured (the FP8 row's signed error less
the BF16 row's, in throughput terms: + = the FP8 run predicted relatively faster). A pair
isolates what FP8 changes from everything the two runs share (the sustained share, the
engine, the network), so a systematic difference points at how FP8 is priced, or at what the
BF16 run pays that its twin does not.

    paraplan validate ../shared/validation/training_dev.csv ../shared/validation/training_dev_more.csv \
        ../shared/validation/training_dev_moe.csv --json > /tmp/training.json
    python calibration/fp8_twins.py /tmp/training.json ../shared/validation/training_dev.csv \
        ../shared/validation/training_dev_more.csv ../shared/validation/training_dev_moe.csv

Also prints the median signed error per (source, GPU, precision) of the dense rows, the
split the pairs point at (docs/model/validation.md, "Residual errors").

    python calibration/fp8_twins.py --fit h100-sxm-80gb,h200-sxm-141gb FILE.csv ...   (about 3 minutes)

fits the FP8 ratio to the pairs of those GPUs alone (the ratio whose predicted FP8/BF16 step
ratios come closest to the measured ones, at the sustained share `paraplan fit` picks) and
prints the mean |error| over every run of those GPUs at it and at the usual fit.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from collections import defaultdict

TWIN_KEY = ("gpu", "model", "num_gpus", "global_batch", "seq_len", "tp", "pp", "ep", "cp")


def precision_kind(cell: str) -> str | None:
    """'FP8' for an 8-bit run (FP8, MXFP8, Float8 linears), 'BF16' for a 16-bit one, else None."""
    text = cell.upper()
    if "FP8" in text or "FLOAT8" in text:
        return "FP8"
    return "BF16" if text.startswith("BF16") else None


def twin_key(row: dict) -> tuple:
    """What a run and its twin share: the publication (without commit and file), the engine
    and TWIN_KEY."""
    return (row["source"].split("@")[0].split(":")[0].strip(), row["framework"][:12]) + tuple(row[k] for k in TWIN_KEY)


def faster_pct(result: dict) -> float:
    """The row's signed error with + meaning the prediction is faster than measured."""
    return -result["error_pct"] if result["metric_id"].endswith("time_s") else result["error_pct"]


def main(validate_json: str, csv_paths: list[str]) -> None:
    rows = {r["id"]: r for path in csv_paths for r in csv.DictReader(open(path, newline=""))}
    results = [r for r in json.load(open(validate_json))["rows"] if not r["skipped"] and r["id"] in rows]
    twins: dict[tuple, dict] = defaultdict(dict)
    by_group: dict[tuple, list] = defaultdict(list)
    for res in results:
        row = rows[res["id"]]
        kind = precision_kind(row["precision"])
        if kind is None:
            continue
        twins[twin_key(row)][kind] = res
        if not row.get("num_experts"):
            by_group[(twin_key(row)[0], row["gpu"].split()[0], kind)].append(faster_pct(res))
    pairs = [(k, v["BF16"], v["FP8"]) for k, v in sorted(twins.items()) if len(v) == 2]
    print(f"{len(pairs)} FP8/BF16 twin pairs (FP8 row's error less the BF16 row's, + = FP8 predicted relatively faster)")
    by_gpu = defaultdict(list)
    for key, bf16, fp8 in pairs:
        diff = faster_pct(fp8) - faster_pct(bf16)
        by_gpu[key[2]].append(diff)
        print(f"  {key[2][:8]:8s} {key[3][:18]:18s} {key[4]:>5s} GPUs  BF16 {faster_pct(bf16):+6.1f}%  "
              f"FP8 {faster_pct(fp8):+6.1f}%  difference {diff:+6.1f}  ({fp8['plan']})")
    for gpu, diffs in sorted(by_gpu.items()):
        print(f"{gpu}: {len(diffs)} pairs, median difference {statistics.median(diffs):+.1f} points")
    print("\nmedian signed error of dense rows (+ = predicted faster), by source, GPU and precision")
    for (source, gpu, kind), errs in sorted(by_group.items()):
        print(f"  {source[:40]:40s} {gpu[:8]:8s} {kind:5s} n={len(errs):3d}  {statistics.median(errs):+6.1f}%")


def twin_pairs(runs, rows: dict) -> list[tuple[int, int]]:
    """(BF16 run index, FP8 run index) of each twin pair among `runs` (validate/fit.py Runs)."""
    twins: dict[tuple, dict] = defaultdict(dict)
    for i, run in enumerate(runs):
        row = rows[run.id]
        kind = precision_kind(row["precision"])
        if kind:
            twins[twin_key(row)][kind] = i
    return [(v["BF16"], v["FP8"]) for v in twins.values() if len(v) == 2]


def fit_to_pairs(gpus: str, csv_paths: list[str]) -> None:
    import numpy as np
    sys.path.insert(0, "src")
    from paraplan.validate.fit import FINE_STEP, KNOBS, fit_knobs, predict_at, tabulate
    share_knob, ratio_knob = (k.field for k in KNOBS)
    rows = {r["id"]: r for path in csv_paths for r in csv.DictReader(open(path, newline=""))}
    runs, _ = tabulate(csv_paths, tuple(gpus.split(",")))
    measured = np.array([r.measured for r in runs])
    usual = fit_knobs(runs, {k.field: k.high for k in KNOBS})
    ratios = np.round(np.arange(KNOBS[1].low, KNOBS[1].high + FINE_STEP / 2, FINE_STEP), 6)
    # every run's prediction at the usual share, for each FP8 ratio: (runs, ratios)
    pred = np.array([[predict_at(r, {**usual, ratio_knob: f}) for f in ratios] for r in runs])
    pairs = twin_pairs(runs, rows)

    def pair_error(j):  # mean |predicted FP8/BF16 ratio / measured one - 1|, percent
        return 100.0 * np.mean([abs(pred[f, j] / pred[b, j] / (measured[f] / measured[b]) - 1.0) for b, f in pairs])

    def mean_error(j):
        return float(np.mean(np.abs(100.0 * (pred[:, j] - measured) / measured)))
    at_pairs = int(np.argmin([pair_error(j) for j in range(len(ratios))]))
    j_usual = int(np.argmin(np.abs(ratios - usual[ratio_knob])))
    print(f"{gpus}: {len(runs)} runs, {len(pairs)} twin pairs; share {usual[share_knob]:.2f}")
    for label, j in (("usual fit", j_usual), ("fitted to the pairs", at_pairs)):
        print(f"  {label:20s} FP8 ratio {ratios[j]:.2f}: pairs' ratio error {pair_error(j):.2f}%, "
              f"mean |error| of every run {mean_error(j):.2f}%")
    # the share each publication's dense 16-bit runs alone would take (the split the pairs point at)
    by_source: dict[str, list] = defaultdict(list)
    for run in runs:
        if not run.moe and run.precision.value == "bf16":
            by_source[run.source].append(run)
    print("  the share each source's dense BF16 runs alone fit:")
    for source, group in sorted(by_source.items()):
        own = fit_knobs(group, usual)

        def error(values):
            return np.mean([abs(predict_at(r, values) - r.measured) / r.measured * 100.0 for r in group])
        print(f"    {source[:40]:40s} {len(group):3d} runs: {own[share_knob]:.2f} ({error(own):.1f}%; "
              f"{error(usual):.1f}% at {usual[share_knob]:.2f})")


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--fit":
        fit_to_pairs(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 3:
        main(sys.argv[1], sys.argv[2:])
    else:
        sys.exit(__doc__)
