#!/usr/bin/env bash
# Sets up (packages + build) and runs the main job. Until the engine lands (issue 3) the main job
# is `lockstep selfcheck`: the contract's invariances on every CPU op. Extra arguments go to it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2
exec ./build/lockstep selfcheck "$@"
