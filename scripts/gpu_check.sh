#!/usr/bin/env bash
# The GPU check, in ONE device call. Build here first (the GPU machine has no Debian -dev
# packages), then carry the build:
#   here:    bash scripts/gpu_check.sh --build          (configures + builds ./build-gpu, sm_90a)
#   device:  run(command="bash scripts/gpu_check.sh", carry=["build-gpu"])
# On the device it runs every GPU test (build-gpu/test_*: each exits non-zero on any mismatch)
# and the MMA probe (quick mode), writing logs under $OUT (./out by hand): summary.txt and
# logs.tar.gz.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--build" ]; then
  set -e
  # NOTE: no -march=native: the binaries run on the GPU host's CPU.
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=ON -DLOCKSTEP_TESTS=OFF \
    -DLOCKSTEP_BENCH=OFF -DLOCKSTEP_NATIVE=OFF >/dev/null
  if ! cmake --build build-gpu -j"$(nproc)" >build-gpu.log 2>&1; then
    grep -E -A3 'error' build-gpu.log | head -40
    echo "[gpu_check] build failed (build-gpu.log)"
    exit 1
  fi
  echo "[gpu_check] built: $(cd build-gpu && ls test_* probe_* 2>/dev/null | tr '\n' ' ')"
  exit 0
fi

OUT=${OUT:-$PWD/out}
mkdir -p "$OUT/logs"
log() { echo "[gpu_check] $*" | tee -a "$OUT/summary.txt"; }
log "date $(date -u +%FT%TZ), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
log "gpu $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
[ -d build-gpu ] || { log "no build-gpu/: run 'bash scripts/gpu_check.sh --build' here and carry it"; exit 1; }

pass=0
fail=0
for t in build-gpu/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  start=$(date +%s)
  if "$t" >"$OUT/logs/$name.log" 2>&1; then
    pass=$((pass + 1))
    log "PASS $name ($(($(date +%s) - start)) s): $(grep -E 'mismatch|passed' "$OUT/logs/$name.log" | tail -1)"
  else
    rc=$?
    fail=$((fail + 1))
    log "FAIL $name (exit $rc): $(tail -3 "$OUT/logs/$name.log" | tr '\n' ' ')"
  fi
done

# The MMA probe: mma.sync + wgmma vs the CPU model on fresh random data (new seed each run) and
# edge cases.
seed=$(date +%s)
if bash scripts/probe_mma.sh "$OUT/logs/probe" --seed "$seed" --quick >"$OUT/logs/probe_mma.out" 2>&1 &&
  ! grep -qE 'differ from the model|probe failed' "$OUT/logs/probe_mma.out"; then
  pass=$((pass + 1))
  log "PASS probe_mma (seed $seed): $(awk '$4 ~ /^[0-9]+$/ && $5 ~ /^[0-9]+$/ {o += $4; m += $5}
    END {print o " outputs of 5 instructions, " m " mismatches vs the CPU model"}' "$OUT/logs/probe_mma.out")"
else
  fail=$((fail + 1))
  log "FAIL probe_mma: $(tail -3 "$OUT/logs/probe_mma.out" | tr '\n' ' ')"
fi

(cd "$OUT" && tar czf logs.tar.gz logs && rm -rf logs)
log "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
