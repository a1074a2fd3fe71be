#!/usr/bin/env bash
# One call on the H200 (device tool): build the CUDA targets there, run every GPU test and probe,
# then the GPU benchmarks; logs under $OUT (or ./out when run by hand).
#   device run:  bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
log() { echo "[gpu_check] $*" | tee -a "$OUT/summary.txt"; }

log "date $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader \
  | tee -a "$OUT/summary.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=ON -DLOCKSTEP_TESTS=OFF \
  -DLOCKSTEP_BENCH=OFF -DLOCKSTEP_NATIVE=OFF >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build-gpu -j16 >"$OUT/build.log" 2>&1 || { grep -A5 error "$OUT/build.log" | head -60; exit 1; }
log "build ok"

pass=0
fail=0
for t in build-gpu/test_*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  if "$t" >"$OUT/$name.log" 2>&1; then
    pass=$((pass + 1)); log "PASS $name: $(tail -1 "$OUT/$name.log")"
  else
    fail=$((fail + 1)); log "FAIL $name (exit $?): $(tail -3 "$OUT/$name.log" | tr '\n' ' ')"
  fi
done
log "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
