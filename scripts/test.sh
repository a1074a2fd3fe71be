#!/usr/bin/env bash
# Sets up (packages + build), runs the CPU test suite with ctest, then the Python package's tests
# (scripts/test_python.sh). GPU tests are separate
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
(cd "${LOCKSTEP_BUILD_DIR:-build}" && ctest --output-on-failure -j"$(nproc 2>/dev/null || echo 2)" "$@")
# The Python package (pip install .[torch,test] into a venv, then its pytest suite; the first run
# downloads torch from PyPI). LOCKSTEP_PYTHON_TESTS=OFF skips it (CI's sanitizer build does).
if [ "${LOCKSTEP_PYTHON_TESTS:-ON}" != OFF ]; then
  bash scripts/test_python.sh
fi
