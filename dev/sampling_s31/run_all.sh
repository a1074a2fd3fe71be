#!/usr/bin/env bash
# Session 31's one device call, most important first (a call cut at its limit still returns what
# it printed): the contract 0.6 sampler (test_logprob_parity: ids / logp / lse / entropy ==
# cpu::sample for every setting; then the choice stage, 128 rows x 151,936, main's Gumbel-max vs
# the mass choice, two rounds), then dev/gemm_s30/run_ab_both.sh's A/B (0004 handoff, then the
# blocked variants), then compute-sanitizer memcheck / racecheck (the new sampler kernels; the
# one-slot TMA-y dW kernel), then the torch sampler beside the new one. Binaries (stripped, xz,
# git-ignored): .vs = branch s31-cdf's test_logprob_parity and bench_logprob, .vsm = main's
# bench_logprob (30e31fb pack); the GEMM folders as in dev/gemm_s30/run_ab_both.sh.
# Predicted (docs/perf.md, session 31): plain / min-p 88 -> ~30-35 us, top-k / top-p within 10%.
#   device: run(command="bash dev/sampling_s31/run_all.sh",
#               carry=[".vm", ".v5", ".v6", ".v7", ".v8", ".vs", ".vsm"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
. dev/ab_common.sh
ab_unxz .vm .v5 .v6 .v7 .v8 .vs .vsm
nvidia-smi --query-gpu=name --format=csv,noheader
t() {  # t DIR TEST: one test program, its last line and failures
  timeout 200 ".$1/$2" >"$OUT/$1_$2.txt" 2>&1
  echo "$1 $2 rc=$? $(tail -1 "$OUT/$1_$2.txt")"
  grep FAIL "$OUT/$1_$2.txt" | head -5
}
ch() { awk '/^sampling, /{p=1} p' "$1"; }
fw() { "$1" --quick 2>&1 | grep -E "^\| (qkv|o_proj|gate_up|down) " | head -80; }
bw() { "$1" 2>&1 | grep "| dW" | awk -F'|' '{printf "%s %s %s %s cu %s r %s\n",$3,$4,$7,$8,$10,$12}'; }
san() {  # san DIR TEST TOOL
  timeout 240 compute-sanitizer --tool "$3" --error-exitcode 99 ".$1/$2" --quick >"$OUT/san_$1_$2_$3.txt" 2>&1
  echo "sanitize $1 $2 $3 rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/san_$1_$2_$3.txt" | tail -1)"
}
t vs test_logprob_parity
for r in 1 2; do
  timeout 120 .vsm/bench_logprob --json "$OUT/lp_main_$r.json" >"$OUT/lp_main_$r.txt" 2>&1
  echo "== sampler main round $r rc=$?"; ch "$OUT/lp_main_$r.txt"
  timeout 120 .vs/bench_logprob --json "$OUT/lp_vs_$r.json" >"$OUT/lp_vs_$r.txt" 2>&1
  echo "== sampler s31-cdf round $r rc=$?"; ch "$OUT/lp_vs_$r.txt"
done
t v8 test_gemm_parity
t v8 test_gemm_bwd_plans
for r in 1 2; do
  echo "== fw main round $r"; fw .vm/bench_gemm_cuda
  echo "== fw v8 round $r"; fw .v8/bench_gemm_cuda
  for v in vm v8; do echo "== bw $v round $r"; bw .$v/bench_gemm_bwd; done
done
t v5 test_gemm_bwd_plans
t v7 test_gemm_bwd_plans
for r in 1 2; do for v in vm v5 v6 v7; do echo "== bw $v round $r"; bw .$v/bench_gemm_bwd; done; done
san vs test_logprob_parity memcheck
san vs test_logprob_parity racecheck
san vm test_gemm_bwd_plans memcheck
san vm test_gemm_bwd_plans racecheck
PYTHONUNBUFFERED=1 timeout 120 python3 bench/cuda/sampling_torch.py --ours "$OUT/lp_vs_2.json" 2>&1 | tail -15
ab_pack_logs
