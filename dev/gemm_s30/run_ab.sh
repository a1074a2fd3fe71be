#!/usr/bin/env bash
# One device call for dev/gemm_s30 (docs/perf.md session 30): the one-y-slot, five-stage TMA-y
# ping-pong kernel for TN launches over kTnFourYSlotsMaxK slots. Binaries built here (stripped,
# xz) into ignored folders and carried with build-gpu-pack (main, the baseline):
#   .v1  the change: test_gemm_bwd_plans, bench_gemm_bwd, bench_logprob_bwd, test_parity
#   .v2  the change with kTnPingPongMaxK = 16384 (ping-pong at every T of the bench): bench_gemm_bwd
#   device: run(command="bash dev/gemm_s30/run_ab.sh", carry=["build-gpu-pack", ".v1", ".v2"])
# Correctness first (the parity tests, the log-prob paths), then the A/B, two rounds.
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
ab_start .v1 .v2  # (build-gpu-pack unpacked into build-gpu)
echo "main: $(cat build-gpu/BUILT_FROM 2>/dev/null)"
s() { echo "== $* ($(date -u +%T))"; }
s test_gemm_bwd_plans
timeout 200 .v1/test_gemm_bwd_plans >"$OUT/v1_plans.txt" 2>&1
echo "rc=$? $(tail -1 "$OUT/v1_plans.txt")"
grep -E "FAIL|scale" "$OUT/v1_plans.txt" | head -20
s test_parity
timeout 200 .v1/test_parity >"$OUT/v1_parity.txt" 2>&1
echo "rc=$? $(tail -1 "$OUT/v1_parity.txt")"
s bench_logprob_bwd
timeout 200 bash -c ".v1/bench_logprob_bwd --self-check-only && .v1/bench_logprob_bwd" >"$OUT/v1_lpb.txt" 2>&1
echo "rc=$?"
grep -E "DIFFERS|^rerun|^other path|^\| lockstep" "$OUT/v1_lpb.txt" | cut -c1-160 | head -20
for r in 1 2; do
  s "ab round $r"
  timeout 150 build-gpu/bench_gemm_bwd >"$OUT/bwd_main_$r.txt" 2>&1; echo "main rc=$?"
  for v in v1 v2; do
    timeout 150 ".$v/bench_gemm_bwd" >"$OUT/bwd_${v}_$r.txt" 2>&1; echo "$v rc=$?"
  done
done
python3 - "$OUT" <<'PY'
import sys
def load(f):
    d = {}
    for l in open(f):
        c = [x.strip() for x in l.split('|')]
        if len(c) > 10 and c[1] == 'dW' and 'forced' not in c[6]:
            d[(c[2], c[3], c[6].replace('f32 +=, ', ''))] = (float(c[7]), float(c[11]))
    return d
def forced(f):
    rows, on = [], False
    for l in open(f):
        if l.startswith('TN (dW) plans forced'): on = True
        elif on and l.startswith('| ') and not l.startswith('| shape'): rows.append(l.strip())
    return rows
o = sys.argv[1]
vs = ("main", "v1", "v2")
runs = {v: [load(f"{o}/bwd_{v}_{r}.txt") for r in (1, 2)] for v in vs}
print("dW shape T form | main | v1 | v2   (ms (ratio to cuBLAS), rounds 1 / 2)")
for k in runs["main"][0]:
    row = [' '.join(k)]
    for v in vs:
        row.append(" / ".join(f"{d[k][0]:.3f} ({d[k][1]:.2f})" for d in runs[v] if k in d))
    print(" | ".join(row))
for v in ("main", "v1"):
    print(f"forced TN plans, {v}, round 1 (TFLOP/s: 128x256, 128x128, 64x128, ping-pong)")
    print("\n".join(forced(f"{o}/bwd_{v}_1.txt")))
PY
s done
