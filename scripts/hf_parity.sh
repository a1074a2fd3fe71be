#!/usr/bin/env bash
# lockstep vs transformers on Qwen3-0.6B dimensions with random weights (tools/hf_parity.py).
#   here:    bash scripts/gpu_check.sh --build     (builds build-gpu/lockstep-score too)
#   device:  run(command="bash scripts/hf_parity.sh", carry=["build-gpu"])
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
python3 tools/hf_parity.py 2>&1 | tee "${OUT:-out}/hf_parity.log"
