#!/usr/bin/env bash
# Session 33, call 1 (carry build-gpu-pack .vp .vm): the pass-cost table (pass_costs.cu, prebuilt in
# .vp); the filtered rows' bounds (this tree's pack): parity, then its choice stage beside main's
# (.vm = fc151ec's bench_logprob, test_logprob_parity), two rounds; then every GPU test and audit
# on this tree's pack (98e3cc4's ls_expf refactor had run only the sampler's parity on the GPU).
#   device: run(command="bash dev/sampling_s33/run1.sh", carry=["build-gpu-pack", ".vp", ".vm"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
. dev/ab_common.sh
ab_start .vm
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
timeout 60 .vp/pass_costs 15 >"$OUT/pass_costs.txt" 2>&1
cat "$OUT/pass_costs.txt"
timeout 90 build-gpu/test_logprob_parity >"$OUT/new_parity.txt" 2>&1
echo "new test_logprob_parity rc=$? $(tail -1 "$OUT/new_parity.txt")"; grep FAIL "$OUT/new_parity.txt" | head -8
sampler() {  # sampler BINARY NAME ROUND
  timeout 40 "$1" --json "$OUT/lp_$2_$3.json" >"$OUT/lp_$2_$3.txt" 2>&1
  echo "== sampler $2 round $3 rc=$?"; awk '/^sampling, /{p=1} p' "$OUT/lp_$2_$3.txt" | grep -E '^\| (greedy|plain|min-p|top)'
}
for r in 1 2; do sampler .vm/bench_logprob main $r; sampler build-gpu/bench_logprob new $r; done
ab_pack_logs
bash scripts/gpu_check.sh tests audit
