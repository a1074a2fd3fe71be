#!/usr/bin/env bash
# Sets up (packages + build) and runs the main job: `lockstep audit` on the built-in default
# model (created on first use in the model cache: $XDG_CACHE_HOME/lockstep, else
# ~/.cache/lockstep, or --model-cache DIR) — rollout vs training log-probs compared bit for bit,
# lockstep's invariant kernels beside an ordinary non-invariant baseline. Extra arguments go to
# `lockstep audit` (see `build/lockstep audit --help`).
#   scripts/run.sh [--no-cuda] [audit arguments...]
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
exec "./${LOCKSTEP_BUILD_DIR:-build}/lockstep" audit "$@"
