#!/usr/bin/env bash
# Session 33, last call (little device time left; carry .vq .vph): racecheck of this tree's
# test_logprob_parity (.vq, --quick: the sampler's bounds paths included), then row 0's phases
# (.vph, phases.py's instrumented bench_logprob).
#   device: run(command="bash dev/sampling_s33/run3.sh", carry=[".vq", ".vph"])
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
mkdir -p "$OUT"
ab_unxz .vq .vph
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 75 compute-sanitizer --tool racecheck --error-exitcode 99 .vq/test_logprob_parity --quick \
  >"$OUT/racecheck.txt" 2>&1
echo "racecheck rc=$? $(grep -E 'RACECHECK SUMMARY|passed' "$OUT/racecheck.txt" | tail -2 | tr '\n' ' ')"
timeout 40 .vph/bench_logprob --reps 3 --sample-rows 1 512 4096 151936 >"$OUT/phases.txt" 2>&1
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
awk '/^sampling, /{p=1} p' "$OUT/phases.txt" | grep -E '^\| (greedy|plain|min-p|top)' | head -20
