#!/usr/bin/env bash
# Hardware counters of the kernels that hold the open performance bars, in ONE device call (a
# development aid: its output goes to docs/perf.md by hand). Needs the carried build
# (bash scripts/gpu_check.sh --build; carry build-gpu-pack) and ncu on the device machine.
#   device: run(command="bash dev/ncu_profile.sh [NAME ...]", carry=["build-gpu-pack"])
# NAME: prefill (attn_wg_prefill_kernel at seq 4096, kv_chunk 1024: bench_attention --quick), dkdv / dq (the attention
# backward's wgmma kernels, bench_attention_bwd --quick), dw (the first dW accumulate launch of
# bench_gemm_bwd: T = 1024, qkv), fwd (the first timed launch of the forward's 128x256 S = 1 tile
# in bench_gemm_cuda --quick: o_proj, M = 1024, 128 tiles: is it L2-bound? docs/perf.md, session
# 20), stash (the 128x256 stash kernel, S = 4, o_proj at M = 1024: docs/cuda-gemm.md "Stash").
# Default: all.
# Writes $OUT/ncu_NAME.txt (details page) and a one-line summary per kernel on stdout. BIN: the
# folder of the benchmark binaries (default build-gpu, from the carried pack).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
# Unpack the carried build the way scripts/gpu_check.sh does (its first lines), without its parts.
bash scripts/gpu_check.sh none >/dev/null 2>&1
BIN=${BIN:-build-gpu}
export LD_LIBRARY_PATH="$PWD/build-gpu/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats
  --section InstructionStats)
prof() {  # prof NAME KERNEL_REGEX SKIP CMD...
  local name=$1 kern=$2 skip=$3
  shift 3
  timeout 300 "$NCU" --clock-control none --kernel-name-base "${NCU_NAME_BASE:-function}" --kernel-name "regex:$kern" --launch-skip "$skip" \
    --launch-count 1 "${sections[@]}" --print-summary none "$@" >"$OUT/ncu_$name.txt" 2>&1
  echo "== $name: $(grep -E 'Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Issue Slots Busy|Registers Per' \
    "$OUT/ncu_$name.txt" | awk '{$1=$1; print}' | tr '\n' ';')"
}
parts="${*:-prefill dkdv dq dw fwd stash}"
for p in $parts; do
  case $p in
    prefill) prof prefill attn_wg_prefill_kernel 10 $BIN/bench_attention --quick ;;
    dkdv) prof dkdv dkdv_wg_kernel 2 $BIN/bench_attention_bwd --quick ;;
    dq) prof dq dq_wg_kernel 2 $BIN/bench_attention_bwd --quick ;;
    dw) NCU_NAME_BASE=mangled prof dw 'Sm90AccumulateEpilogueELb1' 2 $BIN/bench_gemm_bwd ;;
    fwd) NCU_NAME_BASE=mangled prof fwd 'Li128ELi256ELi1ELi4ELi0ENS1_17Sm90StoreEpilogueELb0ELb0ELb0E' 3 \
      $BIN/bench_gemm_cuda --quick ;;
    # the 128x256 stash kernel (S = 4, 2 levels) on o_proj at M = 1024: bench_gemm_cuda --quick's
    # main table runs it first for qkv at M = 1024 (3 warm-up + 20 timed launches), then o_proj
    stash) NCU_NAME_BASE=mangled prof stash 'Li128ELi256ELi1ELi4ELi2ENS1_17Sm90StoreEpilogueELb0ELb0ELb0E' 26 \
      $BIN/bench_gemm_cuda --quick ;;
    *) echo "unknown part $p" ;;
  esac
done
