#!/usr/bin/env bash
# Sets up (packages + build) and runs the main job: `lockstep grpo` on the built-in default model
# (created on first use in the model cache: $XDG_CACHE_HOME/lockstep, else ~/.cache/lockstep) —
# on-policy GRPO whose every step compares the rollout's log-probs with the trainer's bit for bit
# (0 mismatches, PPO ratios exactly 1) — beside the same loop on ordinary non-invariant kernels
# (`lockstep grpo --baseline`, 3 steps: the mismatches and ratio spread of today's stacks). Writes
# $LOCKSTEP_OUT (default out/): grpo.jsonl and baseline.jsonl (one JSON object per step),
# baseline.txt (the baseline's output) and grpo.png (reward and mismatches per step, both runs).
# Extra arguments go to the lockstep run (`build/lockstep grpo --help`). The forward's audit stays
# a command of its own: `build/lockstep audit`.
#   scripts/run.sh [--no-cuda] [grpo arguments...]
# Builds only the `lockstep` command. Without a visible GPU (nvidia-smi) it builds no CUDA
# sources unless LOCKSTEP_CUDA=ON; --no-cuda (first argument) or LOCKSTEP_CUDA=OFF never does.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --no-cuda ]; then
  export LOCKSTEP_CUDA=OFF
  shift
elif [ -z "${LOCKSTEP_CUDA:-}" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "[run] no GPU visible: building without the CUDA sources (LOCKSTEP_CUDA=ON to build them)" >&2
  export LOCKSTEP_CUDA=OFF
fi
bash scripts/setup.sh --target lockstep_cli >&2
bin="./${LOCKSTEP_BUILD_DIR:-build}/lockstep"
out=${LOCKSTEP_OUT:-out}
mkdir -p "$out"
rm -f "$out/baseline.jsonl"
echo "[run] the baseline first: the same loop on ordinary kernels, 3 steps ($out/baseline.txt)" >&2
# Its exit status is non-zero by design (it has mismatches); only a missing metrics file fails.
"$bin" grpo --baseline --steps 3 --metrics "$out/baseline.jsonl" >"$out/baseline.txt" 2>&1 || true
if [ ! -s "$out/baseline.jsonl" ]; then
  tail -5 "$out/baseline.txt" >&2
  echo "[run] the baseline run failed (no $out/baseline.jsonl)" >&2
  exit 1
fi
grep -E '^(PASS|FAIL|BASELINE)' "$out/baseline.txt" | tail -1
echo
exec "$bin" grpo --metrics "$out/grpo.jsonl" --plot "$out/grpo.png" \
  --plot-with "$out/baseline.jsonl" "$@"
