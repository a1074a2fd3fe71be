#!/usr/bin/env bash
# The sampler's next call(s) (session 33 ran out of device time before them). Parts (default all;
# each fits one call):
#   parity:   test_logprob_parity of main and of every variant (0001-desc: top-p's mass pass
#             descending; 0002-deep: compare passes with 8 loads in flight per lane; 0003-fuse: a
#             plain row chosen by its last sums CTA; session 34's dev/sampling_s34/0004-list: a
#             top-k row chosen from its list, argmax index only when needed; 0005-bounds: the bin
#             mass bounds by products of one exp; 0006-small: 0004 + a top-k list of <= 128 keys
#             ranked one key per thread, no digit rounds; 0007-smalldeep: 0006 + 0002; 0004 alone
#             (.v33list) waits for a later call: 8 carry paths at most);
#   sanitize: racecheck of main (the filtered-row bounds) and of small, memcheck of fuse;
#   check:    both;
#   perf:     row 0's phases in SM clocks (.v33phases), the choice stage of main and every
#             variant, two rounds, and pass_costs' load-depth rows (flushed and not).
# Build here first:
#   bash scripts/gpu_check.sh --build && bash dev/sampling_s33/build_variants.sh &&
#   bash dev/sampling_s33/build_variants.sh dev/sampling_s34/0004-list.patch dev/sampling_s34/0005-bounds.patch \
#     dev/sampling_s34/0006-small.patch dev/sampling_s34/0007-smalldeep.patch && cp .v33pass/pass_costs .v33phases/
#   device: run(command="bash dev/sampling_s33/run_next.sh [parity|sanitize|check|perf]",
#               carry=[".v33main", ".v33desc", ".v33deep", ".v33fuse", ".v33bounds", ".v33small",
#                      ".v33smalldeep", ".v33phases"]; pass_costs copied into .v33phases: 8 carry paths at most)
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/out}
. dev/ab_common.sh
parts=${1:-check perf}  # check = parity + sanitize
ab_start .v33main .v33desc .v33deep .v33fuse .v33bounds .v33small .v33smalldeep .v33phases
variants=${VARIANTS:-"main desc deep fuse bounds small smalldeep"}
sanitize() {  # sanitize TOOL VARIANT
  timeout 150 compute-sanitizer --tool "$1" --error-exitcode 99 ".v33$2/test_logprob_parity" --quick \
    >"$OUT/$1_$2.txt" 2>&1
  echo "$2 $1 rc=$? $(grep -E 'SUMMARY|passed' "$OUT/$1_$2.txt" | tail -2 | tr '\n' ' ')"
}
sampler() {  # sampler NAME ROUND
  timeout 40 ".v33$1/bench_logprob" --json "$OUT/lp_$1_$2.json" >"$OUT/lp_$1_$2.txt" 2>&1
  echo "== sampler $1 round $2 rc=$?"; awk '/^sampling, /{p=1} p' "$OUT/lp_$1_$2.txt" | grep -E '^\| (greedy|plain|min-p|top)'
}
if [[ " $parts " == *" check "* || " $parts " == *" parity "* ]]; then
  for v in $variants; do
    timeout 90 ".v33$v/test_logprob_parity" >"$OUT/parity_$v.txt" 2>&1
    echo "$v test_logprob_parity rc=$? $(tail -1 "$OUT/parity_$v.txt")"; grep FAIL "$OUT/parity_$v.txt" | head -5
  done
fi
if [[ " $parts " == *" perf "* ]]; then
  if [ "${EXTRA:-1}" = 1 ]; then  # EXTRA=0: the choice stages only
  timeout 60 .v33phases/bench_logprob --reps 3 --sample-rows 1 512 4096 151936 >"$OUT/phases.txt" 2>&1
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
  fi
  for r in $(seq 1 "${ROUNDS:-2}"); do for v in $variants; do sampler $v $r; done; done
  if [ "${EXTRA:-1}" = 1 ]; then
    timeout 60 .v33phases/pass_costs 10 >"$OUT/pass_costs.txt" 2>&1; cat "$OUT/pass_costs.txt"
  fi
fi
if [[ " $parts " == *" check "* || " $parts " == *" sanitize "* ]]; then
  sanitize racecheck main
  sanitize racecheck small
  sanitize memcheck fuse
fi
ab_pack_logs
