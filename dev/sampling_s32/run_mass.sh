#!/usr/bin/env bash
# Session 32's last call: the plain rows' masses kernel in fewer instructions (branch s32-mass,
# .vx = 98e3cc4's test_logprob_parity and bench_logprob) — parity, then its choice stage beside
# main's (.vb, 27217e2), two rounds, then ncu's time of the masses kernel.
#   device: run(command="bash dev/sampling_s32/run_mass.sh", carry=[".vb", ".vx"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
ab_start .vb .vx
timeout 60 .vx/test_logprob_parity >"$OUT/vx_parity.txt" 2>&1
echo "vx test_logprob_parity rc=$? $(tail -1 "$OUT/vx_parity.txt")"; grep FAIL "$OUT/vx_parity.txt" | head -5
sampler() {  # sampler DIR ROUND
  timeout 40 "$1/bench_logprob" --json "$OUT/lp_${1#.}_$2.json" >"$OUT/lp_${1#.}_$2.txt" 2>&1
  echo "== sampler $1 round $2 rc=$?"; awk '/^sampling, /{p=1} p' "$OUT/lp_${1#.}_$2.txt" | grep -E '^\| (greedy|plain|min-p|top)'
}
for r in 1 2; do sampler .vb $r; sampler .vx $r; done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu)
for v in .vb .vx; do
  timeout 40 "$NCU" --clock-control none --kernel-name regex:sample_plain_sums --launch-count 6 \
    --metrics gpu__time_duration.sum --csv --page raw "$v/bench_logprob" --reps 1 --sample-rows 1 \
    512 4096 151936 >"$OUT/ncu_sums_${v#.}.csv" 2>/dev/null
  python3 - "$OUT/ncu_sums_${v#.}.csv" "$v" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
if h is None:
    sys.exit(print(sys.argv[2], "no ncu rows"))
t = rows[h].index("gpu__time_duration.sum")
print(sys.argv[2], "sums kernel ns:", " ".join(r[t] for r in rows[h + 2:] if len(r) > t))
PY
done
ab_pack_logs
