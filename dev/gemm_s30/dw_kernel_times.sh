#!/usr/bin/env bash
# Where the blocked dW form's extra time goes (docs/perf.md session 30): ncu's kernel durations
# for the first launches of bench_gemm_bwd (qkv, T = 1,024: dX, dW in place, blocked, gathered),
# summed per kernel name and call, beside the benchmark's per-call event times. If the blocked
# call's kernels add up to its in-place time, the gap is host work between the events.
#   device: run(command="bash dev/gemm_s30/dw_kernel_times.sh", carry=["build-gpu-pack"])
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
bash scripts/gpu_check.sh none >/dev/null 2>&1
export LD_LIBRARY_PATH="$PWD/build-gpu/rt${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
# bench_gemm_bwd's first shape is qkv; its first T is 1,024: dX f32, dX bf16, dW in place,
# blocked, gathered, 12 calls each (2 warm-up + 10), lockstep's then cuBLAS's. 400 launches cover
# them (lockstep's gathers and copies included).
timeout 400 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
  --launch-count 400 build-gpu/bench_gemm_bwd >"$OUT/dw_ncu.csv" 2>"$OUT/dw_ncu.err"
echo "ncu rc=$?"
python3 - "$OUT/dw_ncu.csv" <<'PY'
import csv, sys, re
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
hdr = rows[0]; rows = rows[1:]
ki, vi, ui = hdr.index("Kernel Name"), hdr.index("Metric Value"), hdr.index("Metric Unit")
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
# Consecutive runs of the same kernel name, with their count and mean duration (µs).
runs = []
for r in rows:
    name = re.sub(r"\(.*", "", r[ki]).replace("lockstep::cuda::", "").replace("detail::", "")[:170]
    us = float(r[vi].replace(",", "")) * scale[r[ui]]
    if runs and runs[-1][0] == name: runs[-1][1].append(us)
    else: runs.append([name, [us]])
for name, v in runs:
    print(f"{len(v):4d} x {sum(v)/len(v):9.2f} us  {name}")
PY
