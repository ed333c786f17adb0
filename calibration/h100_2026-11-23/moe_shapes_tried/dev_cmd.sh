export PYTHONUNBUFFERED=1; L=$OUT/log.txt
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >>$L 2>&1 || echo install failed >>$L
timeout 200 paraplan calibrate --device cuda --name calibrated-h100-1r -o $OUT/h100.toml --raw $OUT/h100_raw.json >>$L 2>&1; echo calibrate rc=$? >>$L
python3 calibration/compare_moe.py calibration/h100_2026-11-23/moe.json $OUT/h100.toml >>$L 2>&1
python3 calibration/compare_moe_layer.py calibration/h100_2026-11-23/moe_layer/moe_layer.json $OUT/h100.toml >>$L 2>&1
D=calibration/h100_2026-11-23; E="calibration/h100_2026-11-22/runs_b/run*.json $D/calibrate/small*.json $D/compiled/c*.json $D/compiled_rc/c*.json"
paraplan compare $E --hardware $OUT/h100.toml >>$L 2>&1
grep -E "mean|runs:|rc=" $L
