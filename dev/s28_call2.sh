#!/usr/bin/env bash
# session 28, call 2 (untracked; delete before ending): attention .v1/.v2 second round, then the
# GRPO step with / without the head from the rollout.
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
ROUNDS=3 PARTS="fwd parity" FWD_ARGS=--quick SDPA=0 timeout 300 bash dev/ab_attention.sh .base .v1 .v2
export LD_LIBRARY_PATH="$PWD/build-gpu/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
G="grpo --device cuda --model-shape qwen3-0.6b --steps 6 --sft-steps 2 --sft-lr 1e-3 --lr 2e-5"
for v in a b; do
  timeout 120 build-gpu/lockstep $G --metrics "$OUT/grpo_rollout_head_$v.jsonl" > "$OUT/grpo_rollout_head_$v.txt" 2>&1; echo "rollout head $v exit $?"; tail -12 "$OUT/grpo_rollout_head_$v.txt"
  timeout 120 build-gpu/lockstep $G --head-forward --metrics "$OUT/grpo_head_forward_$v.jsonl" > "$OUT/grpo_head_forward_$v.txt" 2>&1; echo "head forward $v exit $?"; tail -12 "$OUT/grpo_head_forward_$v.txt"
done
