#!/usr/bin/env bash
# One device call (docs/perf.md session 30): the blocked dW producer reads k-tile 0's table
# entries once per kernel instead of at every job's start (0005-blocked-first-entries-once.patch;
# measured within noise, not landed). .v3 = main 30e31fb + that patch
# (test_gemm_bwd_plans, bench_gemm_bwd), carried with build-gpu-pack (main):
#   device: run(command="bash dev/gemm_s30/run_ab_first.sh", carry=["build-gpu-pack", ".v3"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
ab_start .v3  # (build-gpu-pack unpacked into build-gpu)
timeout 120 .v3/test_gemm_bwd_plans >"$OUT/v3_plans.txt" 2>&1
echo "v3 test_gemm_bwd_plans rc=$? $(tail -1 "$OUT/v3_plans.txt")"
f() { "$1" --quick 2>&1 | grep -v gathered | ab_dw_rows; }
for r in 1 2; do
  echo "== main $r"; f build-gpu/bench_gemm_bwd
  echo "== v3 $r"; f .v3/bench_gemm_bwd
done
