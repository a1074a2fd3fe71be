#!/usr/bin/env bash
# Hardware counters of the kernels that hold the open performance bars, in ONE device call (a
# development aid: its output goes to docs/perf.md by hand). Needs the carried build
# (bash scripts/gpu_check.sh --build; carry build-gpu-pack) and ncu on the device machine.
#   device: run(command="bash dev/ncu_profile.sh [NAME ...]", carry=["build-gpu-pack"])
# NAME: prefill (attn_wg_prefill_kernel at seq 4096, kv_chunk 1024: bench_attention --quick), dkdv / dq (the attention
# backward's wgmma kernels, bench_attention_bwd --quick), dw (the first dW accumulate launch of
# bench_gemm_bwd: T = 1024, qkv), fwd (the first timed launch of the forward's 128x256 S = 1 tile
# in bench_gemm_cuda --quick: o_proj, M = 1024, 128 tiles: is it L2-bound? docs/perf.md, session
# 20), stash (the 128x256 stash kernel, S = 4, o_proj at M = 1024: docs/cuda-gemm.md "Stash"),
# fwdsrc (the 128x256 S = 1 kernel at gate_up M = 1024 with --set full: the stall reasons and the
# 25 SASS instructions with the most stall samples; not in the default list).
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
# srcprof NAME KERNEL_REGEX SKIP CMD...: --set full on one launch, the details page, and the 25
# SASS instructions with the most stall samples ($OUT/ncu_NAME_top.txt).
srcprof() {
  local name=$1 kern=$2 skip=$3
  shift 3
  timeout 300 "$NCU" --clock-control none --kernel-name-base mangled --kernel-name "regex:$kern" \
    --launch-skip "$skip" --launch-count 1 --set full --import-source no -o "$OUT/$name" -f \
    "$@" >"$OUT/ncu_${name}_run.txt" 2>&1
  "$NCU" -i "$OUT/$name.ncu-rep" --page details --print-details all >"$OUT/ncu_$name.txt" 2>&1
  "$NCU" -i "$OUT/$name.ncu-rep" --page source --print-source sass --csv \
    >"$OUT/ncu_${name}_sass.csv" 2>&1
      python3 - "$OUT/ncu_${name}_sass.csv" <<'PY' >"$OUT/ncu_${name}_top.txt" 2>&1
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head = next((i for i, r in enumerate(rows) if any("Source" == c or "Address" == c for c in r)), None)
if head is None:
    sys.exit("no SASS table in the source page")
cols = rows[head]
samp = [i for i, c in enumerate(cols) if "Sampling" in c and "All" in c] or \
       [i for i, c in enumerate(cols) if "Sampling" in c]
src = next(i for i, c in enumerate(cols) if c == "Source")
def val(r, i):
    try:
        return float(r[i].replace(",", ""))
    except (ValueError, IndexError):
        return 0.0
body = [r for r in rows[head + 1:] if len(r) == len(cols)]
total = sum(val(r, samp[0]) for r in body) or 1.0
print("columns:", [cols[i] for i in samp], "total samples", total)
for r in sorted(body, key=lambda r: -val(r, samp[0]))[:25]:
    print("%6.2f%%  %s" % (100 * val(r, samp[0]) / total, r[src][:110]))
PY
  echo "== $name: $(grep -E 'Duration|Stall|Issue Slots Busy|Eligible Warps|Tensor|Throughput' "$OUT/ncu_$name.txt" | head -24 | awk '{$1=$1; print}' | tr '\n' ';')"
  head -30 "$OUT/ncu_${name}_top.txt"
  rm -f "$OUT/$name.ncu-rep" "$OUT/ncu_${name}_sass.csv"
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
    # Where the forward GEMM's warps wait (session 22: 65 M instructions for gate_up at M = 1,024,
    # ~1,330 per k-tile per CTA, mostly barrier polling by count; which role polls?): the 128x256
    # S = 1 kernel on gate_up at M = 1,024 (bench_gemm_cuda --quick --only gate_up: its first
    # 128x256 launches), every section with their bodies (the stall reasons), then the SASS source
    # page (stall samples per instruction) reduced to the 25 instructions with the most samples.
    fwdsrc)
      srcprof fwdsrc 'Li128ELi256ELi1ELi4ELi0ENS1_17Sm90StoreEpilogueELb0ELb0ELb0E' 3 \
        $BIN/bench_gemm_cuda --quick --only gate_up ;;
    # The 64x256 ping-pong kernels at the dW and S = 1 bars' worst points (docs/perf.md session
    # 30): the TN accumulate one (five stages, scalar y) on qkv dW at T = 4,096 in place (its
    # first launches in bench_gemm_bwd: 2 warm-up, then timed), and the forward's on qkv at
    # M = 4,096, S = 1.
    dwpp) srcprof dwpp 'Li64ELi256ELi1ELi5ELi0ENS1_22Sm90AccumulateEpilogueELb1ELb1ELb1E' 2 \
      $BIN/bench_gemm_bwd --quick ;;
    # The TMA-y ping-pong kernel in place and in the blocked form on qkv dW at T = 1,024 (the
    # blocked one ran ~9% longer in ncu's durations, session 30: where?).
    dwy) srcprof dwy 'Sm90TmaYEpilogueINS1_22Sm90AccumulateEpilogueELi4E' 2 $BIN/bench_gemm_bwd ;;
    dwyb) srcprof dwyb 'Sm90TmaYEpilogueINS1_29Sm90BlockedAccumulateEpilogueELi4E' 2 \
      $BIN/bench_gemm_bwd ;;
    # The same at T = 4,096 (one y slot, five stages; bench_gemm_bwd --quick: qkv first): in place
    # 0.335 ms, blocked 0.407 (session 30).
    dwy4) srcprof dwy4 'Sm90TmaYEpilogueINS1_22Sm90AccumulateEpilogueELi1E' 2 \
      $BIN/bench_gemm_bwd --quick ;;
    dwyb4) srcprof dwyb4 'Sm90TmaYEpilogueINS1_29Sm90BlockedAccumulateEpilogueELi1E' 2 \
      $BIN/bench_gemm_bwd --quick ;;
    fwdpp) srcprof fwdpp 'Li64ELi256ELi1ELi5ELi0ENS1_17Sm90StoreEpilogueELb1E' 3 \
      $BIN/bench_gemm_cuda --only qkv --m 4096 ;;
    *) echo "unknown part $p" ;;
  esac
done
