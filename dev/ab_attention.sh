#!/usr/bin/env bash
# A/B of attention kernel variants in ONE device call (a development aid; results go to
# docs/perf.md by hand). Each variant is a folder of stripped binaries built here (bench_attention,
# bench_attention_bwd, optionally test_parity), carried with the call; the peers' times (cuDNN and
# flash SDPA) are measured once, then every variant's benchmarks run in turn, ROUNDS times
# (alternated, so clock drift hits all alike), then each variant's test_parity --filter attention.
#   device: run(command="bash dev/ab_attention.sh .base .v1 .v2", carry=[".base", ".v1", ".v2",
#           "build-gpu-pack"])
# A binary may travel xz-compressed (NAME.xz, `xz -9`: test_parity shrinks 11 MB -> 3.4 MB, so
# several variants' tests fit the carry limit); it is decompressed first (Python's lzma: the GPU
# machine may have no xz program).
# Env: ROUNDS (default 2), PARTS ("fwd bwd parity", default all), FWD_ARGS (e.g. --quick),
# SDPA=0 (skip the peers: variants against each other only), PARITY_FILTER (test_parity's
# --filter, default attention). Prints prefill TFLOP/s and decode µs (batch x context) per run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
. dev/ab_common.sh
ab_setup_runtime
ab_unxz "$@"
ROUNDS=${ROUNDS:-2}
PARTS=${PARTS:-fwd bwd parity}
has() { [[ " $PARTS " == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if has fwd && [ "${SDPA:-1}" != 0 ]; then
  timeout 120 python3 bench/cuda/attention_sdpa.py --out "$OUT/sdpa.csv" >"$OUT/sdpa.log" 2>&1 ||
    echo "attention_sdpa.py failed: $(tail -2 "$OUT/sdpa.log")"
fi
if has bwd && [ "${SDPA:-1}" != 0 ]; then
  timeout 120 python3 bench/cuda/attention_bwd_sdpa.py --out "$OUT/sdpa_bwd.csv" >"$OUT/sdpa_bwd.log" 2>&1 ||
    echo "attention_bwd_sdpa.py failed: $(tail -2 "$OUT/sdpa_bwd.log")"
fi
for r in $(seq "$ROUNDS"); do
  for v in "$@"; do
    n=${v#.}
    if has fwd; then
      timeout 150 "$v/bench_attention" ${FWD_ARGS:-} --sdpa "$OUT/sdpa.csv" >"$OUT/fwd_${n}_$r.txt" 2>&1 || echo "$v bench_attention failed"
      echo "fwd $n round $r: $(awk '$1 ~ /^[0-9]+$/ && NF >= 10 {printf "seq %s chunk %s: %s TF/s (%s cuDNN)  ", $1, $4, $6, $10}' "$OUT/fwd_${n}_$r.txt")"
      echo "decode $n round $r: $(awk '/^decode \(paged/ {d = 1} d && $1 ~ /^[0-9]+$/ {printf "%sx%s %s us; ", $1, $2, $3}' "$OUT/fwd_${n}_$r.txt")"
    fi
    if has bwd; then
      timeout 150 "$v/bench_attention_bwd" --sdpa "$OUT/sdpa_bwd.csv" >"$OUT/bwd_${n}_$r.txt" 2>&1 || echo "$v bench_attention_bwd failed"
      echo "bwd $n round $r: $(grep -iE 'lockstep|sdpa' "$OUT/bwd_${n}_$r.txt" | tr -s ' ' | tr '\n' ';')"
    fi
  done
done
if has parity; then
  for v in "$@"; do
    [ -x "$v/test_parity" ] || continue
    timeout 300 "$v/test_parity" --filter "${PARITY_FILTER:-attention}" >"$OUT/parity_${v#.}.txt" 2>&1
    echo "parity ${v#.} (exit $?): $(tail -2 "$OUT/parity_${v#.}.txt" | tr '\n' ' ')"
  done
fi
ab_pack_logs
