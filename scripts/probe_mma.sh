#!/usr/bin/env bash
# Probes the H200's bf16 tensor-core arithmetic (mma.sync, wgmma) against the CPU MMA model
# (src/core/mma_model.cc) and records golden data. See docs/probes.md.
# Usage: scripts/probe_mma.sh [OUTDIR [--seed N] [--quick]]
#   OUTDIR defaults to $OUT (set by the device tool), else out/probe_mma.
# Builds the probe with nvcc directly from tools/probes/probe_mma.cu + src/core/mma_model.cc only
# (a half-edited file elsewhere in the tree cannot stop it), runs it and leaves in OUTDIR:
#   probe_mma.log       environment + the probe's summary table (mismatches vs the model)
#   sass_summary.txt    tensor-core instructions in the probe's SASS (HMMA / HGMMA)
#   <instr>.tar.gz      one per instruction: <instr>.bin, all recorded tiles, one section per
#                       category, and <instr>_mism.bin, random-data tiles that mismatched the
#                       model (if any); golden format (tests/golden/README.md)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=${1:-${OUT:-$ROOT/out/probe_mma}}
shift || true
mkdir -p "$OUTDIR"
BUILD=${PROBE_BUILD:-/tmp/probe_mma_build}
mkdir -p "$BUILD"
LOG="$OUTDIR/probe_mma.log"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  (cd "$ROOT" && sha256sum tools/probes/probe_mma.cu src/core/mma_model.cc src/core/mma_model.h)
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
  nvcc --version | tail -2
} | tee "$LOG"
nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -fmad=false --expt-relaxed-constexpr \
  -Xcompiler=-ffp-contract=off -I"$ROOT/include" -I"$ROOT/src" \
  "$ROOT/tools/probes/probe_mma.cu" "$ROOT/src/core/mma_model.cc" -o "$BUILD/probe_mma"
if command -v cuobjdump >/dev/null; then
  cuobjdump --dump-sass "$BUILD/probe_mma" | grep -oE '\b(HGMMA|HMMA|WARPGROUP)[A-Za-z0-9._]*' \
    | sort | uniq -c >"$OUTDIR/sass_summary.txt" || true
fi
DATA="$BUILD/data"
rm -rf "$DATA"
mkdir -p "$DATA"
PROBE="$BUILD/probe_mma"
# wgmma descriptor: find the reading of LBO/SBO that gives exact results (own process each).
SWAP=-1
for s in 0 1; do
  if "$PROBE" "$DATA" --instr 2 --swap $s --layout-only "$@" 2>&1 | tee -a "$LOG"; then
    SWAP=$s
    break
  fi
done
if [ "$SWAP" -lt 0 ] && command -v compute-sanitizer >/dev/null; then
  echo "== wgmma layout check failed for both descriptor readings; memcheck:" | tee -a "$LOG"
  compute-sanitizer --tool memcheck "$PROBE" "$DATA" --instr 2 --swap 0 --layout-only --quick \
    2>&1 | head -60 | tee -a "$LOG" || true
fi
echo "== descriptor reading: swap=$SWAP" | tee -a "$LOG"
for i in 1 2 3 4 5 6 7 8; do
  if [ "$i" -gt 1 ] && [ "$SWAP" -lt 0 ]; then continue; fi
  set +e
  "$PROBE" "$DATA" --instr $i --swap $((SWAP < 0 ? 0 : SWAP)) "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -eq 1 ]; then
    echo "== instruction $i: GPU outputs differ from the model (see the table)" | tee -a "$LOG"
  elif [ "$rc" -ne 0 ]; then
    echo "== instruction $i: probe failed (exit $rc)" | tee -a "$LOG"
    if command -v compute-sanitizer >/dev/null; then
      compute-sanitizer --tool memcheck "$PROBE" "$DATA/memcheck" --instr $i \
        --swap $((SWAP < 0 ? 0 : SWAP)) --layout-only 2>&1 | head -40 | tee -a "$LOG" || true
    fi
  fi
done
# One archive per instruction (the device tool returns at most 8 files).
for f in "$DATA"/*.bin; do
  case "$f" in *_mism.bin) continue ;; esac
  name=$(basename "$f" .bin)
  (cd "$DATA" && tar czf "$OUTDIR/$name.tar.gz" "$name".bin $(ls "$name"_mism.bin 2>/dev/null))
done
ls -la "$OUTDIR"
