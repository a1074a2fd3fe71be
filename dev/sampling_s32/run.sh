#!/usr/bin/env bash
# Session 32's second call: land contract 0.6's sampler (branch s32-cdf = main + s31-cdf: the
# choice by exact masses, plain rows over 16 CTAs) on the tests that sample and the audits, its
# sanitizers; then the per-kernel times of s31-split's filtered path (.vt, session 31's build),
# which ran 5-7x slower than the one-CTA form in the first call (docs/perf.md, session 32); then
# session 30's 0004 handoff (.v8b: its two benchmarks) beside the pack's, whose first-call
# figures were lost (printed, not saved).
#   device: run(command="bash dev/sampling_s32/run.sh", carry=["build-gpu-pack", ".vt", ".v8b"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
GPU_CHECK_TESTS=test_logprob_parity,test_parity,test_baseline_cuda,test_grpo_cuda,test_smoke \
  bash scripts/gpu_check.sh tests audit
GPU_CHECK_TESTS=test_logprob_parity bash scripts/gpu_check.sh sanitize
ab_start .vt .v8b
# The landed sampler's choice stage (the pack's bench_logprob; the torch sampler beside it).
timeout 100 build-gpu/bench_logprob --json "$OUT/lp_cdf.json" >"$OUT/lp_cdf.txt" 2>&1
echo "bench_logprob rc=$?"; awk '/^sampling, /{p=1} p' "$OUT/lp_cdf.txt"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
# Every launch of the choice stage's kernels (greedy, plain, min-p, top-k 50, top-p 0.9, ... at
# tau = 1 first), one metric each: the kernel, its grid, its time.
timeout 150 "$NCU" --clock-control none --kernel-name "regex:sample_(hist|pass2|choose|plain)" \
  --launch-count 140 --metrics gpu__time_duration.sum,launch__grid_size --csv --page raw \
  .vt/bench_logprob --reps 1 --sample-rows 1 512 4096 151936 >"$OUT/ncu_split.csv" 2>"$OUT/ncu_split.err"
echo "ncu rc=$? lines=$(wc -l <"$OUT/ncu_split.csv")"
python3 - "$OUT/ncu_split.csv" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if hdr is None:
    print("no csv header"); sys.exit(0)
h = rows[hdr]
k, g, t = h.index("Kernel Name"), h.index("launch__grid_size"), h.index("gpu__time_duration.sum")
for r in rows[hdr + 2:]:
    if len(r) > t:
        print(r[k][:40], r[g], r[t])
PY
fw() { timeout 100 "$1" --quick >"$OUT/fw_$2_$3.txt" 2>&1; echo "== fw $2 round $3"; grep -E "^\| (qkv|o_proj|gate_up|down) " "$OUT/fw_$2_$3.txt" | head -60; }
bw() { timeout 100 "$1" >"$OUT/bw_$2_$3.txt" 2>&1; echo "== bw $2 round $3"; ab_dw_rows <"$OUT/bw_$2_$3.txt"; }
for r in 1 2; do
  fw build-gpu/bench_gemm_cuda main $r; fw .v8b/bench_gemm_cuda v8 $r
  bw build-gpu/bench_gemm_bwd main $r; bw .v8b/bench_gemm_bwd v8 $r
done
ab_pack_logs
