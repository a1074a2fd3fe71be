#!/usr/bin/env bash
# One device call for dev/attention_s29 (README.md). Binaries built here, xz-compressed, carried:
#   .base  main's bench_attention          .pp  main + 0001: test_parity, bench_attention
#   device: run(command="bash dev/attention_s29/run_ab.sh", carry=[".base", ".pp"])
# (with dev/gemm_s29/run_ab.sh in the same call: carry the union of both folder lists).
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
python3 -c "import lzma, shutil, glob, os
for f in glob.glob('.base/bench_attention.xz') + glob.glob('.pp/*.xz'):
    shutil.copyfileobj(lzma.open(f), open(f[:-3], 'wb')); os.chmod(f[:-3], 0o755)"
s() { echo "== $* ($(date -u +%T))"; }
s "test_parity attention (the real grid, then 3 CTAs: several tiles per CTA)"
timeout 150 .pp/test_parity --filter attention >"$OUT/pp_parity.txt" 2>&1
echo "rc=$? $(grep -E 'passed' "$OUT/pp_parity.txt" | tail -1)"
LOCKSTEP_DEV_PREFILL_GRID=3 timeout 150 .pp/test_parity --filter attention >"$OUT/pp_parity3.txt" 2>&1
echo "grid 3 rc=$? $(grep -E 'passed' "$OUT/pp_parity3.txt" | tail -1)"
s racecheck
LOCKSTEP_DEV_PREFILL_GRID=3 timeout 150 compute-sanitizer --tool racecheck .pp/test_parity --quick \
  --filter attention_prefill >"$OUT/pp_race.txt" 2>&1
echo "rc=$? $(grep -E 'SUMMARY' "$OUT/pp_race.txt" | tail -1)"
s "SDPA peers"
PYTHONUNBUFFERED=1 timeout 200 python3 bench/cuda/attention_sdpa.py --out "$OUT/sdpa.csv" >"$OUT/sdpa.txt" 2>&1
echo "rc=$?"
for r in 1 2; do
  for v in base pp; do
    s "bench_attention $v round $r"
    timeout 120 ".$v/bench_attention" --sdpa "$OUT/sdpa.csv" >"$OUT/attn_${v}_$r.txt" 2>&1
    echo "rc=$?"
    grep -A8 "^prefill (packed varlen" "$OUT/attn_${v}_$r.txt"
  done
done
s done
