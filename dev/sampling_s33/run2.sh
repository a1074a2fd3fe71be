#!/usr/bin/env bash
# Session 33, call 2 (carry build-gpu-pack .vm .vph .vp): the pass costs again with the read's depth
# of loads in flight (flushed and not); this tree's sampler (the bounds, the top-p mass
# pass descending): parity, its choice stage beside main's (.vm = fc151ec), row 0's phases in SM
# clocks (.vph = this tree's bench_logprob instrumented by phases.py), then memcheck and racecheck
# of test_logprob_parity.
#   device: run(command="bash dev/sampling_s33/run2.sh", carry=["build-gpu-pack", ".vm", ".vph", ".vp"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
ab_start .vm .vph
timeout 90 build-gpu/test_logprob_parity >"$OUT/new_parity.txt" 2>&1
echo "new test_logprob_parity rc=$? $(tail -1 "$OUT/new_parity.txt")"; grep FAIL "$OUT/new_parity.txt" | head -8
sampler() {  # sampler BINARY NAME ROUND
  timeout 40 "$1" --json "$OUT/lp_$2_$3.json" >"$OUT/lp_$2_$3.txt" 2>&1
  echo "== sampler $2 round $3 rc=$?"; awk '/^sampling, /{p=1} p' "$OUT/lp_$2_$3.txt" | grep -E '^\| (greedy|plain|min-p|top)'
}
timeout 60 .vph/bench_logprob --reps 3 --sample-rows 1 512 4096 151936 >"$OUT/phases.txt" 2>&1
echo "phases rc=$?"
python3 - "$OUT/phases.txt" <<'PY'
import re, sys, statistics
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"PHASES V=(\d+) k=(\d+) p=(\S+) minp=(\S+) tau=(\S+) (.*)", line)
    if not m or m.group(1) != "151936":
        continue
    f = dict(re.findall(r"(\w+) (-?\d+)", m.group(6)))
    rows.setdefault(m.groups()[1:5], []).append(f)
print("row 0's phases, median SM clocks (k, top_p, min_p, tau): argmax bound pass window keys choice exact_at")
for key, fs in sorted(rows.items()):
    med = {n: int(statistics.median(int(f[n]) for f in fs)) for n in fs[0]}
    print(key, len(fs), " ".join(f"{n}={med[n]}" for n in ["argmax", "bound", "pass", "window", "keys", "choice", "exact_at"]))
PY
sampler build-gpu/bench_logprob new 1
GPU_CHECK_TESTS=test_logprob_parity bash scripts/gpu_check.sh sanitize
sampler .vm/bench_logprob main 1
timeout 60 .vp/pass_costs 10 >"$OUT/pass_costs2.txt" 2>&1; cat "$OUT/pass_costs2.txt"
ab_pack_logs
