#!/usr/bin/env bash
# session 28, one call (untracked; delete before ending)
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
GPU_CHECK_BENCH=bench_logprob_bwd bash scripts/gpu_check.sh bwdbench
cp "$OUT/logs/bench_logprob_bwd.md" "$OUT/lpb.md" 2>/dev/null
GPU_CHECK_TESTS=test_logprob_parity,test_parity,test_train_cuda,test_grpo_cuda bash scripts/gpu_check.sh tests
grep -E "one-pass|failed \(test_parity" "$OUT/logs/test_parity.log" | tail -3
export LD_LIBRARY_PATH="$PWD/build-gpu/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
G="grpo --device cuda --model-shape qwen3-0.6b --steps 4 --sft-steps 1 --sft-lr 1e-3 --lr 2e-5"
timeout 80 build-gpu/lockstep $G --metrics "$OUT/grpo_rollout_head.jsonl" > "$OUT/grpo_rollout_head.txt" 2>&1; echo "rollout head exit $?"; tail -9 "$OUT/grpo_rollout_head.txt"
timeout 80 build-gpu/lockstep $G --head-forward --metrics "$OUT/grpo_head_forward.jsonl" > "$OUT/grpo_head_forward.txt" 2>&1; echo "head forward exit $?"; tail -9 "$OUT/grpo_head_forward.txt"
GPU_CHECK_TESTS=test_gemm_bwd_plans bash scripts/gpu_check.sh tests
