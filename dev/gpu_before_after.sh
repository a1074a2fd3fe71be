#!/usr/bin/env bash
# Before/after benchmark comparison in ONE device call (issue 10's "benchmarks within ±3% of the
# same-run numbers before the move"): the GPU benchmarks of two builds run alternately, each REPS
# times, on the same machine in the same call; dev/bench_compare.py then prints, per benchmark
# row, the lockstep time before and after (the minimum over the repetitions) and their ratio.
#   here:   the "before" binaries packed as build-gpu-before/before.tgz (bench_* and lockstep of
#           the old commit), the "after" build as usual (bash scripts/gpu_check.sh --build)
#   device: bash dev/gpu_before_after.sh [REPS] [engine]   carry build-gpu-pack build-gpu-before
# `engine` adds the 8B bench-engine (one-GPU contract) of both builds. Logs under $OUT/ab/.
set -uo pipefail
cd "$(dirname "$0")/.."
reps=${1:-2}
OUT=${OUT:-$PWD/out}
L="$OUT/ab"
mkdir -p "$L"
if [ -f build-gpu-pack/gpu.tgz ] && [ ! -x build-gpu/bench_gemm_cuda ]; then
  mkdir -p build-gpu && tar -C build-gpu -xzf build-gpu-pack/gpu.tgz
fi
mkdir -p build-gpu-before/bin && tar -C build-gpu-before/bin -xzf build-gpu-before/before.tgz
export LD_LIBRARY_PATH="$PWD/build-gpu/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "[ab] before: $(cat build-gpu-before/bin/BUILT_FROM)  after: $(cat build-gpu/BUILT_FROM 2>/dev/null)"
# AB_BENCH=NAME[,NAME...] limits the benchmarks. The order alternates (odd reps before first,
# even reps after first) so that neither side always runs on a GPU the other just heated; the SM
# clock, power and temperature are logged before every benchmark (clocks.log).
benches=${AB_BENCH:-bench_gemm_cuda,bench_gemm_small_m,bench_attention,bench_logprob}
for r in $(seq 1 "$reps"); do
  order="before after"; [ $((r % 2)) -eq 0 ] && order="after before"
  for side in $order; do
    d=build-gpu; [ "$side" = before ] && d=build-gpu-before/bin
    mkdir -p "$L/$side.$r"
    for b in ${benches//,/ }; do
      echo "$side.$r $b $(nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu \
        --format=csv,noheader 2>/dev/null)" >>"$L/clocks.log"
      "$d/$b" >"$L/$side.$r/$b.md" 2>&1
    done
    echo "[ab] $side rep $r done ($(date -u +%T))"
  done
done
if [ "${2:-}" = engine ]; then
  S1="--rollout-tp 1 --train-tp 1 --segments 1 --kv-chunk 1024"
  for side in before after; do
    d=build-gpu; [ "$side" = before ] && d=build-gpu-before/bin
    (cd "$(mktemp -d)" && "$OLDPWD/$d/lockstep" bench-engine --device cuda --model-shape qwen3-8b $S1 \
      --prompts 16 --group 8 --max-new-tokens 64 --prompt-len 16:128) >"$L/engine.$side.txt" 2>&1
    echo "[ab] engine $side: $(grep -iE 'tok/s' "$L/engine.$side.txt" | tr -s ' ' | head -4 | tr '\n' ';')"
  done
fi
python3 dev/bench_compare.py "$L" "$reps" | tee "$L/compare.md"
(cd "$OUT" && tar czf ab.tar.gz ab && rm -rf ab)
