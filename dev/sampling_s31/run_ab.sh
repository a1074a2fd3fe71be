#!/usr/bin/env bash
# One device call: contract 0.6's sampler (the mass choice, §S.7) on the GPU. Binaries built here
# (stripped, xz, ignored folders):
#   .vs   branch s31-cdf: test_logprob_parity, bench_logprob
#   .vsm  main (30e31fb pack, contract 0.5's Gumbel-max): bench_logprob
#   device: run(command="bash dev/sampling_s31/run_ab.sh", carry=[".vs", ".vsm"])
# Parity first (ids / logp / lse / entropy == cpu::sample, every setting), then the choice stage
# (128 rows x 151,936) old vs new, two rounds, beside the torch sampler, then compute-sanitizer
# memcheck / racecheck of test_logprob_parity --quick (the new kernel's shared-memory atomics and
# the segment scan).
# Predicted (docs/perf.md, session 31): plain 88 -> ~35 us (58 -> ~25 instructions per entry),
# top-k 50 110 -> ~40 us, top-p 0.9 209 -> ~110 us at tau = 1 (pass 1's histogram is unchanged).
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
. dev/ab_common.sh
ab_unxz .vs .vsm
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 .vs/test_logprob_parity >"$OUT/vs_parity.txt" 2>&1
echo "vs test_logprob_parity rc=$? $(tail -1 "$OUT/vs_parity.txt")"
grep -E "FAIL" "$OUT/vs_parity.txt" | head -8
ch() { awk '/^sampling, /{p=1} p' "$1"; }
for r in 1 2; do
  timeout 120 .vsm/bench_logprob --json "$OUT/lp_main_$r.json" >"$OUT/lp_main_$r.txt" 2>&1
  echo "== main round $r rc=$?"; ch "$OUT/lp_main_$r.txt"
  timeout 120 .vs/bench_logprob --json "$OUT/lp_vs_$r.json" >"$OUT/lp_vs_$r.txt" 2>&1
  echo "== s31-cdf round $r rc=$?"; ch "$OUT/lp_vs_$r.txt"
done
PYTHONUNBUFFERED=1 timeout 120 python3 bench/cuda/sampling_torch.py --ours "$OUT/lp_vs_2.json" 2>&1 | tail -15
for tool in memcheck racecheck; do
  timeout 240 compute-sanitizer --tool $tool --error-exitcode 99 .vs/test_logprob_parity --quick \
    >"$OUT/san_$tool.txt" 2>&1
  echo "s31-cdf sanitize $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$tool.txt" | tail -1)"
done
ab_pack_logs
