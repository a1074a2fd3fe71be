#!/usr/bin/env bash
# One device call (next session): where the blocked dW kernel's lag goes (docs/perf.md session 30,
# item 5). Binaries built here (stripped, xz, ignored folders), carried with build-gpu-pack (main):
#   .v5  main 91d1766 + 0001-blocked-table-in-shared-memory.patch: test_gemm_bwd_plans, bench_gemm_bwd
#   .v6  main 91d1766 + 0002-timing-one-box-k-tiles.patch (WRONG VALUES, timing only): bench_gemm_bwd
#   .v7  main 91d1766 + 0003-dw-gathers-in-one-launch.patch: test_gemm_bwd_plans, bench_gemm_bwd
#   device: run(command="bash dev/gemm_s30/run_ab_blocked.sh",
#               carry=["build-gpu-pack", ".v5", ".v6", ".v7"])   (~64 MB with the tree: the limit)
# If .v6's blocked rows match in place, the sequence-end k-tiles (four 16-row boxes) are the lag;
# if .v5's do, the table reads were. .v7: predicted blocked T = 1,024 ~5 µs faster per call (one
# gather launch of a few blocks instead of two of 1,056), the gathered (forced) rows likewise.
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
ab_start .v5 .v6 .v7  # (build-gpu-pack unpacked into build-gpu)
for v in v5 v7; do
  timeout 150 .$v/test_gemm_bwd_plans >"$OUT/${v}_plans.txt" 2>&1
  echo "$v test_gemm_bwd_plans rc=$? $(tail -1 "$OUT/${v}_plans.txt")"
  grep FAIL "$OUT/${v}_plans.txt" | head -5
done
f() { "$1" 2>&1 | ab_dw_rows; }
for r in 1 2; do
  for v in main v5 v6 v7; do
    b=build-gpu/bench_gemm_bwd; [ "$v" != main ] && b=.$v/bench_gemm_bwd
    echo "== $v round $r"; f "$b"
  done
done
