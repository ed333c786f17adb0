export PYTHONUNBUFFERED=1; L=$OUT/log.txt
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >>$L 2>&1 || echo install failed >>$L
timeout 200 paraplan calibrate --device cuda --name calibrated-h100-1r -o $OUT/h100.toml --raw $OUT/h100_raw.json >>$L 2>&1; echo calibrate rc=$? >>$L
M="--model llama3-8b --steps 6 --warmup 2 --device cuda --compile"
timeout 80 paraplan run $M --layers 4 --seq 2048 --mb 2 --batch 8 -o $OUT/c1.json >>$L 2>&1; echo c1 rc=$? >>$L
timeout 80 paraplan run $M --layers 4 --seq 8192 --mb 1 --batch 4 -o $OUT/c4.json >>$L 2>&1; echo c4 rc=$? >>$L
timeout 80 paraplan run $M --layers 8 --hidden 2048 --heads 16 --kv-heads 8 --seq 1024 --mb 4 --batch 8 -o $OUT/c6.json >>$L 2>&1; echo c6 rc=$? >>$L
timeout 80 paraplan run $M --layers 8 --hidden 1024 --heads 8 --kv-heads 8 --seq 1024 --mb 4 --batch 8 -o $OUT/cs1.json >>$L 2>&1; echo cs1 rc=$? >>$L
R=calibration/h100_2026-11-22/runs_b; E="$R/run1.json $R/run4.json $R/run6.json calibration/h100_2026-11-23/calibrate/small1.json"
for met in step_time memory; do echo "== compare $met" >>$L; paraplan compare $E $OUT/c*.json --metric $met --hardware $OUT/h100.toml >>$L 2>&1; done
tail -45 $L
