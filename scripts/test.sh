#!/usr/bin/env bash
# Sets up (packages + build) and runs the CPU test suite with ctest. GPU tests are separate
# (scripts/gpu_check.sh, on an H200); they are never part of this run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd build
ctest --output-on-failure -j"$(nproc 2>/dev/null || echo 2)" "$@"
