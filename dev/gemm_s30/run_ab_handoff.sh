#!/usr/bin/env bash
# One device call (next session): the ping-pong handoff right after a job's last k-tile is issued
# (0004-pp-handoff-after-last-issue.patch). Today the other warpgroup may start only after this
# one's wgmmas drained (wait_group 0) — and in the TMA-y kernels ptxas even placed the bar.arrive
# after the ~400 instructions that canonicalize the 128 accumulators for the store (SASS,
# docs/perf.md session 30); in the stash turns (S = 4 / 8) after each segment's drain too. Same chains: no bit changes. .v8 = main 91d1766 + 0004:
# test_gemm_parity, test_gemm_bwd_plans, bench_gemm_cuda, bench_gemm_bwd.
#   device: run(command="bash dev/gemm_s30/run_ab_handoff.sh", carry=["build-gpu-pack", ".v8"])
# Predicted: TN four-slot (T = 1,024) +5-10%, forward and TN ping-pong at 4,096 +1-3%, the
# ping-pong stash (S = 4 row-parallel: 16-k-tile segments, a drain per segment) +3-5%.
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
ab_start .v8  # (build-gpu-pack unpacked into build-gpu)
for t in test_gemm_parity test_gemm_bwd_plans; do
  timeout 150 .v8/$t >"$OUT/v8_$t.txt" 2>&1
  echo "v8 $t rc=$? $(tail -1 "$OUT/v8_$t.txt")"
  grep FAIL "$OUT/v8_$t.txt" | head -3
done
fw() { "$1" --quick 2>&1 | grep -E "^\| (qkv|o_proj|gate_up|down) " | head -80; }
bw() { "$1" 2>&1 | grep -v gathered | ab_dw_rows; }
for r in 1 2; do
  echo "== main round $r"; fw build-gpu/bench_gemm_cuda; bw build-gpu/bench_gemm_bwd
  echo "== v8 round $r"; fw .v8/bench_gemm_cuda; bw .v8/bench_gemm_bwd
done
