#!/usr/bin/env bash
# One device call for dev/gemm_s29 (README.md): the binaries are built here into ignored folders
# (xz-compressed), from the sources named below, and carried:
#   .base  main's bench_gemm_bwd, bench_logprob_bwd (a build with neither patch)
#   .tmay  main + 0001: test_gemm_bwd_plans, bench_gemm_bwd, bench_logprob_bwd
#   .pf    main + 0002: bench_gemm_bwd
#   device: run(command="bash dev/gemm_s29/run_ab.sh", carry=[".base", ".tmay", ".pf", ".whl"])
# Correctness first (the scale cases, the log-prob self-checks), then the A/B (two rounds).
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
python3 -c "import lzma, shutil, glob, os
for f in glob.glob('.base/*.xz') + glob.glob('.tmay/*.xz') + glob.glob('.pf/*.xz'):
    shutil.copyfileobj(lzma.open(f), open(f[:-3], 'wb')); os.chmod(f[:-3], 0o755)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
s() { echo "== $* ($(date -u +%T))"; }
s test_gemm_bwd_plans
timeout 200 .tmay/test_gemm_bwd_plans >"$OUT/tmay_plans.txt" 2>&1
echo "rc=$? $(tail -1 "$OUT/tmay_plans.txt")"
grep -E "FAIL|scale" "$OUT/tmay_plans.txt" | head -20
s bench_logprob_bwd
timeout 120 .tmay/bench_logprob_bwd >"$OUT/tmay_lpb.txt" 2>&1
echo "rc=$?"
grep -E "DIFFERS|identical|^\| lockstep" "$OUT/tmay_lpb.txt" | head -20
timeout 120 .base/bench_logprob_bwd >"$OUT/base_lpb.txt" 2>&1
echo "base rc=$?"
grep -E "^\| lockstep" "$OUT/base_lpb.txt" | head -8
for r in 1 2; do
  s "ab round $r"
  for v in base tmay pf; do
    timeout 120 ".$v/bench_gemm_bwd" >"$OUT/bwd_${v}_$r.txt" 2>&1
    echo "$v rc=$?"
  done
done
python3 - "$OUT" <<'PY'
import sys
def load(f):
    d = {}
    for l in open(f):
        c = [x.strip() for x in l.split('|')]
        if len(c) > 10 and c[1] == 'dW' and 'forced' not in c[6]:
            d[(c[2], c[3], c[6])] = (float(c[7]), float(c[11]))
    return d
o = sys.argv[1]
runs = {v: [load(f"{o}/bwd_{v}_{r}.txt") for r in (1, 2)] for v in ("base", "tmay", "pf")}
print("dW shape T path | base | tmay | pf   (ms (ratio to cuBLAS), rounds 1 / 2)")
for k in runs["base"][0]:
    row = [f"{' '.join(k)}"]
    for v in ("base", "tmay", "pf"):
        row.append(" / ".join(f"{d[k][0]:.3f} ({d[k][1]:.2f})" for d in runs[v] if k in d))
    print(" | ".join(row))
PY
s done
