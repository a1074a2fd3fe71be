#!/usr/bin/env bash
# A/B of whole-engine variants in ONE device call (a development aid; results go to docs/perf.md
# by hand): each variant is a folder holding a stripped `lockstep` CLI built here (optionally
# `test_parity`), carried with the call; `lockstep bench-engine` on the 8B shape runs for each in
# turn, ROUNDS times (alternated, so clock drift hits all alike), and prints each run's decode
# step beside its memory floor, the rollout and training tokens/s and the log-prob mismatches
# (rollout vs training: 0 for the invariant engine). The carried pack
# (build-gpu-pack) supplies the runtime libraries; `build-gpu` names its own binaries as a variant.
#   device: run(command="bash dev/ab_engine.sh build-gpu .v1", carry=["build-gpu-pack", ".v1"])
# A binary may travel xz-compressed (NAME.xz), as in dev/ab_attention.sh.
# Env: ROUNDS (default 2); CONTRACT = one (default: --segments 1 --rollout-tp 1 --train-tp 1
# --kv-chunk 1024), audit (the flags' defaults) or both (bench-engine's two default
# configurations); ENGINE_ARGS (more bench-engine flags, e.g. --profile-ops); PARITY_FILTER
# (when set, each variant's test_parity --filter runs first).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/out}
mkdir -p "$OUT"
. dev/ab_common.sh
ab_setup_runtime
ab_unxz "$@"
for v in "$@"; do
  [ -x "$v/lockstep" ] || { echo "$v: no lockstep binary"; exit 2; }
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
if [ -n "${PARITY_FILTER:-}" ]; then
  for v in "$@"; do
    [ -x "$v/test_parity" ] || continue
    timeout 300 "$v/test_parity" --filter "$PARITY_FILTER" >"$OUT/parity_${v#.}.txt" 2>&1
    echo "parity ${v#.} (exit $?): $(tail -1 "$OUT/parity_${v#.}.txt")"
  done
fi
case ${CONTRACT:-one} in
  one) contract=(--segments 1 --rollout-tp 1 --train-tp 1 --kv-chunk 1024) ;;
  audit) contract=(--segments 4) ;;
  both) contract=() ;;
  *) echo "CONTRACT: one, audit or both"; exit 2 ;;
esac
work=$(mktemp -d)
for r in $(seq "${ROUNDS:-2}"); do
  for v in "$@"; do
    n=${v#.}
    log="$OUT/engine_${n//\//_}_$r.txt"
    (cd "$work" && timeout 280 "$ROOT/$v/lockstep" bench-engine --device cuda --model-shape qwen3-8b \
      "${contract[@]}" --no-baseline --quiet ${ENGINE_ARGS:-}) >"$log" 2>&1
    rc=$?
    echo "$n round $r (exit $rc): $(awk '/^invariant@cuda/ && NF == 8 {printf "decode %s ms/step, %sx floor; ", $3, $5}
      /^invariant@cuda/ && NF >= 12 {printf "rollout %s tok/s, train %s tok/s, log-prob mismatches %s of %s; ", $6, $9, $10, $12}' "$log")"
  done
done
rm -rf "$work"
ab_pack_logs
