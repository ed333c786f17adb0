#!/usr/bin/env bash
# One-GPU check of the cost model on a real accelerator (run through the device tool):
#   1. calibrate: GEMM / attention / copy / element-wise microbenchmarks -> profile TOML
#   2. paraplan run: real training steps of scaled-down Llama 3 8B shapes (full hidden size,
#      few layers) with each recomputation policy and two sequence lengths
#   3. paraplan compare: measured vs predicted step time and peak memory, on the GPU's
#      preset and on the calibrated profile.
# Usage (through the device tool): bash calibration/gpu_check.sh
# Everything lands in $OUT (log.txt and bundle.tar, re-packed after every step so that a
# run stopped at its time limit still returns what it had).
set -u
OUT=${OUT:-/tmp/gpu_check}
W=$OUT/w
mkdir -p "$W"
LOG=$OUT/log.txt
log() { echo "== $*" | tee -a "$LOG"; }
pack() { tar -C "$OUT" -cf "$OUT/bundle.tar" w; }
step() {  # step NAME TIMEOUT_S CMD...
  local name=$1 t=$2; shift 2
  log "$name: $*"
  local t0=$SECONDS
  timeout "$t" "$@" >>"$LOG" 2>&1
  local rc=$?
  log "$name: rc=$rc in $((SECONDS - t0)) s"
  pack
  return $rc
}
export PYTHONUNBUFFERED=1
log "host"; { nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv; python3 -c 'import torch,sys; print(sys.version); print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'; } >>"$LOG" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation --no-index . >>"$LOG" 2>&1 || { log "install failed"; exit 1; }
step calibrate 240 paraplan calibrate --device cuda --name calibrated-h100-1r -o "$W/h100.toml" --raw "$W/h100_raw.json"

M="--steps 6 --warmup 2 --device cuda"
L8="--model llama3-8b --layers 4"
i=0
for spec in \
  "$L8 --seq 2048 --mb 2 --batch 8 --recompute none" \
  "$L8 --seq 2048 --mb 2 --batch 8 --recompute selective" \
  "$L8 --seq 2048 --mb 2 --batch 8 --recompute full" \
  "$L8 --seq 8192 --mb 1 --batch 4 --recompute none" \
  "$L8 --seq 4096 --mb 1 --batch 4 --recompute full" \
  "$L8 --seq 1024 --mb 4 --batch 8 --recompute none --hidden 2048 --heads 16 --kv-heads 8 --layers 8" \
  "--model llama3-70b --layers 2 --vocab 32000 --seq 4096 --mb 1 --batch 4 --recompute none" \
  "--model gpt3-175b --layers 4 --hidden 4096 --heads 32 --seq 2048 --mb 2 --batch 8 --recompute none" \
  "$L8 --seq 16384 --mb 1 --batch 2 --recompute full" ; do
  i=$((i + 1))
  step "run$i" 120 paraplan run $M $spec -o "$W/run$i.json"
done
for hw in "" "--hardware $W/h100.toml"; do
  for metric in step_time memory; do
    step "compare $metric ${hw:-(preset)}" 60 paraplan compare "$W"/run*.json --metric $metric $hw
  done
done
log done
