#!/usr/bin/env bash
# One device call (session 31): run_ab_handoff.sh and run_ab_blocked.sh together, plus
# compute-sanitizer on main's test_gemm_bwd_plans --quick (its 2,100-token case: the one-slot
# TMA-y kernel). Main is carried as three binaries (.vm: bench_gemm_cuda, bench_gemm_bwd,
# test_gemm_bwd_plans of the 30e31fb pack, xz) instead of the whole pack, so all variants fit the
# carry limit:
#   device: run(command="bash dev/gemm_s30/run_ab_both.sh", carry=[".vm", ".v5", ".v6", ".v7", ".v8"])
# Predictions: see run_ab_handoff.sh (.v8) and run_ab_blocked.sh (.v5 .v6 .v7).
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
. dev/ab_common.sh
ab_unxz .vm .v5 .v6 .v7 .v8
nvidia-smi --query-gpu=name --format=csv,noheader
for v in v8:test_gemm_parity v8:test_gemm_bwd_plans v5:test_gemm_bwd_plans v7:test_gemm_bwd_plans; do
  d=${v%%:*} t=${v#*:}
  timeout 150 .$d/$t >"$OUT/${d}_$t.txt" 2>&1
  echo "$d $t rc=$? $(tail -1 "$OUT/${d}_$t.txt")"
  grep FAIL "$OUT/${d}_$t.txt" | head -3
done
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 99 .vm/test_gemm_bwd_plans --quick \
    >"$OUT/san_$tool.txt" 2>&1
  echo "main sanitize $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.txt" | tail -1)"
done
fw() { "$1" --quick 2>&1 | grep -E "^\| (qkv|o_proj|gate_up|down) " | head -80; }
bw() { "$1" 2>&1 | grep "| dW" | awk -F'|' '{printf "%s %s %s %s cu %s r %s\n",$3,$4,$7,$8,$10,$12}'; }
for r in 1 2; do
  echo "== fw main round $r"; fw .vm/bench_gemm_cuda
  echo "== fw v8 round $r"; fw .v8/bench_gemm_cuda
  for v in vm v5 v6 v7 v8; do echo "== bw $v round $r"; bw .$v/bench_gemm_bwd; done
done
ab_pack_logs
