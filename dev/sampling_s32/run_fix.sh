#!/usr/bin/env bash
# Session 32's third call: test_baseline_cuda of s32-cdf (.vb, the baseline's sampler judged
# against the CPU's Gumbel-max), s31-split with level 0's bins fixed (.vt2: parity, then its
# choice stage beside s32-cdf's, two rounds), racecheck of .vt2.
#   device: run(command="bash dev/sampling_s32/run_fix.sh", carry=[".vb", ".vt2"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
ab_start .vb .vt2
t() {  # t DIR TEST
  timeout 120 "$1/$2" >"$OUT/${1#.}_$2.txt" 2>&1
  echo "$1 $2 rc=$? $(tail -1 "$OUT/${1#.}_$2.txt")"
  grep FAIL "$OUT/${1#.}_$2.txt" | head -5
}
sampler() {  # sampler DIR ROUND
  timeout 100 "$1/bench_logprob" --json "$OUT/lp_${1#.}_$2.json" >"$OUT/lp_${1#.}_$2.txt" 2>&1
  echo "== sampler $1 round $2 rc=$?"; awk '/^sampling, /{p=1} p' "$OUT/lp_${1#.}_$2.txt" | grep '^|'
}
t .vb test_baseline_cuda
t .vt2 test_logprob_parity
for r in 1 2; do sampler .vb $r; sampler .vt2 $r; done
timeout 200 compute-sanitizer --tool racecheck --error-exitcode 99 .vt2/test_logprob_parity --quick \
  >"$OUT/san_vt2_racecheck.txt" 2>&1
echo "racecheck vt2 rc=$? $(grep 'RACECHECK SUMMARY' "$OUT/san_vt2_racecheck.txt")"
ab_pack_logs
