export PYTHONUNBUFFERED=1; L=$OUT/log.txt
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >>$L 2>&1 || echo install failed >>$L
timeout 240 paraplan calibrate --device cuda --name calibrated-h100-1r -o $OUT/h100.toml --raw $OUT/h100_raw.json >>$L 2>&1; echo calibrate rc=$? >>$L
i=0
for spec in "--layers 8 --hidden 1024 --heads 8 --kv-heads 8 --seq 1024 --mb 4 --batch 8" "--layers 6 --hidden 2048 --heads 16 --kv-heads 8 --seq 2048 --mb 1 --batch 4" "--layers 4 --hidden 1536 --heads 12 --kv-heads 12 --ffn 6144 --seq 512 --mb 16 --batch 32"; do
 i=$((i+1)); timeout 100 paraplan run --model llama3-8b $spec --steps 6 --warmup 2 --device cuda -o $OUT/small$i.json >>$L 2>&1; echo run$i rc=$? >>$L
done
for hw in calibration/h100_2026-11-22/runs_d/h100.toml $OUT/h100.toml; do for met in step_time memory; do
 echo "== compare $met on $hw" >>$L; paraplan compare calibration/h100_2026-11-22/runs_b/run*.json $OUT/small*.json --metric $met --hardware $hw >>$L 2>&1; done; done
tail -60 $L
