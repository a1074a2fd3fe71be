#!/usr/bin/env bash
# One device call (docs/perf.md session 30): the blocked dW producer reads k-tile 0's table
# entries once per kernel instead of at every job's start (0005-blocked-first-entries-once.patch;
# measured within noise, not landed). .v3 = main 30e31fb + that patch
# (test_gemm_bwd_plans, bench_gemm_bwd), carried with build-gpu-pack (main):
#   device: run(command="bash dev/gemm_s30/run_ab_first.sh", carry=["build-gpu-pack", ".v3"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
. dev/ab_common.sh
ab_setup_runtime  # unpacks build-gpu-pack into build-gpu
ab_unxz .v3
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 .v3/test_gemm_bwd_plans >"$OUT/v3_plans.txt" 2>&1
echo "v3 test_gemm_bwd_plans rc=$? $(tail -1 "$OUT/v3_plans.txt")"
f() { "$1" --quick 2>&1 | grep "| dW" | grep -v gathered | awk -F'|' '{printf "%s %s %s %s cu %s r %s\n",$3,$4,$7,$8,$10,$12}'; }
for r in 1 2; do
  echo "== main $r"; f build-gpu/bench_gemm_bwd
  echo "== v3 $r"; f .v3/bench_gemm_bwd
done
