#!/usr/bin/env bash
# Session 31's one device call, most important first (a call cut at its limit still returns what
# it printed): the contract 0.6 sampler (test_logprob_parity: ids / logp / lse / entropy ==
# cpu::sample for every setting; then the choice stage, 128 rows x 151,936, main's Gumbel-max vs
# the mass choice, two rounds), then session 30's GEMM A/B (dev/gemm_s30: 0004 handoff, then the
# blocked variants 0001-0003), then compute-sanitizer memcheck / racecheck (the new sampler kernels; the
# one-slot TMA-y dW kernel), then the torch sampler beside the new one. Binaries (stripped, xz,
# git-ignored): .vs = branch s31-cdf's test_logprob_parity and bench_logprob, .vt = branch
# s31-split's (filtered rows' passes over 16 CTAs per row too), .vsm = main's bench_logprob
# (30e31fb pack); the GEMM folders: .vm = main's bench_gemm_cuda, bench_gemm_bwd and
# test_gemm_bwd_plans (the 30e31fb pack), .v5-.v8 as in dev/gemm_s30/README.md.
# Predicted (docs/perf.md, session 31): plain / min-p 88 -> ~30-35 us (both branches); top-k 50
# ~45-60 us, top-p 0.9 ~60-80 us at tau = 1 with s31-split (s31-cdf: within 10% of today).
#   device: run(command="bash dev/sampling_s31/run_all.sh",
#               carry=[".vm", ".v5", ".v6", ".v7", ".v8", ".vs", ".vt", ".vsm"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
ab_start .vt .vsm  # the others just before their first use (a short call spends less on it)
t() {  # t DIR TEST: one test program, its last line and failures
  timeout 200 ".$1/$2" >"$OUT/$1_$2.txt" 2>&1
  echo "$1 $2 rc=$? $(tail -1 "$OUT/$1_$2.txt")"
  grep FAIL "$OUT/$1_$2.txt" | head -5
}
ch() { awk '/^sampling, /{p=1} p' "$1"; }
fw() { "$1" --quick 2>&1 | grep -E "^\| (qkv|o_proj|gate_up|down) " | head -80; }
bw() { "$1" 2>&1 | ab_dw_rows; }
san() {  # san DIR TEST TOOL
  timeout 240 compute-sanitizer --tool "$3" --error-exitcode 99 ".$1/$2" --quick >"$OUT/san_$1_$2_$3.txt" 2>&1
  echo "sanitize $1 $2 $3 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$1_$2_$3.txt" | tail -1)"
}
sampler() {  # sampler VARIANT ROUND
  timeout 120 ".$1/bench_logprob" --json "$OUT/lp_$1_$2.json" >"$OUT/lp_$1_$2.txt" 2>&1
  echo "== sampler $1 round $2 rc=$?"; ch "$OUT/lp_$1_$2.txt"
}
# Ordered so that a call cut short keeps the decisions: the split sampler's parity and speed,
# the handoff's, a race check of the new kernels; then the rest.
t vt test_logprob_parity
sampler vsm 1; sampler vt 1
ab_unxz .vm .v8
t v8 test_gemm_parity
t v8 test_gemm_bwd_plans
echo "== fw main round 1"; fw .vm/bench_gemm_cuda
echo "== fw v8 round 1"; fw .v8/bench_gemm_cuda
for v in vm v8; do echo "== bw $v round 1"; bw .$v/bench_gemm_bwd; done
san vt test_logprob_parity racecheck
ab_unxz .vs
t vs test_logprob_parity
sampler vs 1; sampler vsm 2; sampler vs 2; sampler vt 2
echo "== fw main round 2"; fw .vm/bench_gemm_cuda
echo "== fw v8 round 2"; fw .v8/bench_gemm_cuda
for v in vm v8; do echo "== bw $v round 2"; bw .$v/bench_gemm_bwd; done
ab_unxz .v5 .v6 .v7
t v5 test_gemm_bwd_plans
t v7 test_gemm_bwd_plans
for r in 1 2; do for v in vm v5 v6 v7; do echo "== bw $v round $r"; bw .$v/bench_gemm_bwd; done; done
san vt test_logprob_parity memcheck
san vm test_gemm_bwd_plans memcheck
san vm test_gemm_bwd_plans racecheck
PYTHONUNBUFFERED=1 timeout 120 python3 bench/cuda/sampling_torch.py --ours "$OUT/lp_vt_2.json" 2>&1 | tail -15
ab_pack_logs
