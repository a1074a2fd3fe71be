#!/usr/bin/env bash
# Sets up (packages + build) and runs the CPU test suite with ctest. GPU tests are separate
# (scripts/gpu_check.sh, on an H200); they are never part of this run.
#   scripts/test.sh [--no-cuda] [ctest arguments...]
# --no-cuda (first argument) or LOCKSTEP_CUDA=OFF builds without the CUDA sources (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
setup_args=()
if [ "${1:-}" = --no-cuda ]; then
  setup_args+=(--no-cuda)
  shift
fi
bash scripts/setup.sh "${setup_args[@]}"
cd "${LOCKSTEP_BUILD_DIR:-build}"
ctest --output-on-failure -j"$(nproc 2>/dev/null || echo 2)" "$@"
