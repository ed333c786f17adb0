# Run from the repository root through the device tool: bash calibration/h100_zb_split/dev_cmd.sh
export PYTHONUNBUFFERED=1; L=$OUT/log.txt
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv; python3 -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda)'; } >$OUT/host.txt 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >>$L 2>&1 || echo install failed >>$L
(cd calibration && timeout 200 python3 gpu_zb_split.py) >>$L 2>&1; echo zb_split rc=$? >>$L
timeout 240 paraplan calibrate --device cuda --name calibrated-h100-1r -o $OUT/h100.toml --raw $OUT/h100_raw.json >>$L 2>&1; echo calibrate rc=$? >>$L
python3 calibration/compare_zb_split.py $OUT/zb_split.json $OUT/h100.toml calibration/h100_2026-11-23/scatter/h100.toml >$OUT/compare.txt 2>&1
D=calibration/h100_2026-11-23; E="calibration/h100_2026-11-22/runs_b/run*.json $D/calibrate/small*.json $D/compiled/c*.json $D/compiled_rc/c*.json"
for met in step_time memory; do echo "== compare $met" >>$L; paraplan compare $E --metric $met --hardware $OUT/h100.toml >>$L 2>&1; done
cat $OUT/compare.txt; tail -50 $L
