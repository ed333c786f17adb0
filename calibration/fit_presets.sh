#!/usr/bin/env bash
# The fitted knobs of the GPU presets (sustained_compute_ratio, fp8_gemm_efficiency_ratio,
# fp8_rowwise_gemm_efficiency_ratio):
# `paraplan fit` over every published training file, one GPU type at a time. A GPU with fewer
# than 5 runs (validate/fit.py MIN_RUNS) is fitted together with its architecture family, as
# `validate --cv source` does. Each run's JSON (knobs, errors, the rows used) goes to
# calibration/fit_presets/; the values are copied into src/paraplan/specs/catalog/gpus/*.toml
# by hand, each with a comment naming this script.
#
#   bash calibration/fit_presets.sh            (about 5 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
V=../shared/validation
FILES="$V/training_dev.csv $V/training_dev_more.csv $V/training_dev_moe.csv"
mkdir -p calibration/fit_presets
for gpus in a100-sxm-80gb h100-sxm-80gb h200-sxm-141gb,h100-sxm-80gb b200 gb200 gb300 b300,b200,gb200,gb300; do
  name="${gpus%%,*}"
  # shellcheck disable=SC2086
  paraplan fit $FILES --gpu "$gpus" --json > "calibration/fit_presets/$name.json"
  python - "$name" <<'EOF'
import json, sys
d = json.load(open(f"calibration/fit_presets/{sys.argv[1]}.json"))
knobs = ", ".join(f"{k} {v['value']:.2f} (preset {v['preset']:.2f})" for k, v in d["knobs"].items())
print(f"{d['gpu']:15s} pooled {d['pooled']} runs {d['runs']:3d}: {knobs}; mean |error| preset "
      f"{d['preset_mean_abs_pct_error']:.2f}%, fitted {d['in_sample_mean_abs_pct_error']:.2f}%, "
      f"leave-one-out {d['cv_mean_abs_pct_error']:.2f}%")
EOF
done
