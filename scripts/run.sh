#!/usr/bin/env bash
# Sets up (packages + build) and runs the main job: `lockstep audit` on the built-in default
# model (created on first use in the model cache: $XDG_CACHE_HOME/lockstep, else
# ~/.cache/lockstep, or --model-cache DIR) — rollout vs training log-probs compared bit for bit,
# lockstep's invariant kernels beside an ordinary non-invariant baseline. Extra arguments go to
# `lockstep audit` (see `build/lockstep audit --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
exec ./build/lockstep audit "$@"
