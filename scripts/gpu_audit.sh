#!/usr/bin/env bash
# The engine on the GPU (run by `scripts/gpu_check.sh audit` on the device, build-gpu carried):
# invariant audits with --device cuda on the built-in default model and on random-weight
# Qwen3-0.6B- and Qwen3-8B-shaped models (weights generated on that machine from a fixed seed),
# the cross-device audit (GPU rollout vs CPU training), and the engine benchmark (invariant vs
# cuBLAS baseline, same schedule). Each step prints its report; the script fails if any audit
# reports a mismatch of the invariant engine or exits non-zero. GPU_AUDIT_LOGS: where the engine
# benchmark writes its per-step CSV (gpu_check.sh: its logs folder). GPU_AUDIT_STEPS=NAME[,...]:
# run only the steps named (e.g. bench_engine_qwen3_8b).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH="$PWD/build-gpu/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
L="$PWD/build-gpu/lockstep"
work=$(mktemp -d)
status=0
step() {  # step NAME cmd...
  local name=$1
  shift
  # GPU_AUDIT_STEPS=NAME[,NAME...]: only those steps.
  [ -z "${GPU_AUDIT_STEPS:-}" ] || [[ ",$GPU_AUDIT_STEPS," == *",$name,"* ]] || return 0
  echo "=== $name: lockstep ${*#$L }"
  local start=$(date +%s)
  (cd "$work" && "$@")
  local rc=$?
  echo "=== $name: exit $rc in $(($(date +%s) - start)) s"
  [ "$rc" -eq 0 ] || status=1
}
step audit_default_cuda "$L" audit --device cuda
step audit_default_cross "$L" audit --rollout-device cuda --train-device cpu --no-baseline
step audit_default_cuda_tp4_2 "$L" audit --device cuda --rollout-tp 4 --train-tp 2 --page-size 7 \
  --kv-splits 3 --chunk-budget 100 --prompts 32
step audit_qwen3_0.6b_cuda "$L" audit --device cuda --model-shape qwen3-0.6b --prompts 16 --group 4 \
  --max-new-tokens 32 --prompt-len 16:160
step audit_qwen3_0.6b_cross "$L" audit --rollout-device cuda --train-device cpu \
  --model-shape qwen3-0.6b --no-baseline --prompts 2 --group 2 --max-new-tokens 6 --prompt-len 12:24
step audit_qwen3_8b_cuda "$L" audit --device cuda --model-shape qwen3-8b --prompts 8 --group 4 \
  --max-new-tokens 24 --prompt-len 16:128
# One GPU as deployed: TP 1 on both sides, so one K segment (the S = 1 GEMM and the fused log-prob
# head) and the default 1024-key attention chunk.
S1="--rollout-tp 1 --train-tp 1 --segments 1 --kv-chunk 1024"
step audit_qwen3_8b_cuda_s1 "$L" audit --device cuda --model-shape qwen3-8b $S1 --prompts 8 \
  --group 4 --max-new-tokens 24 --prompt-len 16:128
# The engine benchmark's default: the long-prompt workload (256 sequences, prompts 128-1024, 256
# new tokens, 128 running) under both contracts (audit: S = 4, rollout TP 2; one GPU: S = 1, TP 1),
# each invariant vs the cuBLAS baseline, every engine step beside its memory floor.
step bench_engine_qwen3_8b "$L" bench-engine --device cuda --model-shape qwen3-8b \
  --steps-csv "${GPU_AUDIT_LOGS:-$work}/bench_engine_steps.csv"
rm -rf "$work"
exit $status
