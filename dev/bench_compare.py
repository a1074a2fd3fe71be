#!/usr/bin/env python3
"""Compares the GPU benchmark tables of two builds run alternately in one call
(dev/gpu_before_after.sh): for every markdown table row present in both, the lockstep time
columns (headers with 'lockstep' or 'ours' and a unit: us / ms) before and after, each the minimum
over the repetitions, and after / before. Rows are matched by their non-measurement cells.
With --median the statistic is the median over the repetitions instead (one lucky or unlucky run
moves the minimum: on the H200 a 2.2 ms GEMM spread 2195-2392 us over 8 runs of one build).
Usage: bench_compare.py LOGDIR REPS [--median]"""
import glob
import os
import re
import sys

MEASURE = re.compile(r"(\bus\b|\bms\b|TFLOP|GB/s|ratio|\bx\b|MiB|tok/s|%|tile|bits)", re.I)
TIME = re.compile(r"\b(us|ms)\b", re.I)
PEER = re.compile(r"(cuBLAS|SDPA|torch|cuDNN)", re.I)


def tables(path):
    out = []
    lines = open(path, errors="replace").read().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: "):
            head = [c.strip() for c in lines[i].strip().strip("|").split("|")]
            rows = []
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                rows.append([c.strip() for c in lines[j].strip().strip("|").split("|")])
                j += 1
            out.append((head, rows))
            i = j
        else:
            i += 1
    return out


def collect(logdir, side, reps, name, stat=min):
    seen = {}
    for r in range(1, reps + 1):
        p = os.path.join(logdir, f"{side}.{r}", name)
        if not os.path.exists(p):
            continue
        for ti, (head, rows) in enumerate(tables(p)):
            tcols = [k for k, h in enumerate(head) if TIME.search(h) and not PEER.search(h)]
            kcols = [k for k, h in enumerate(head) if not MEASURE.search(h)]
            for row in rows:
                if len(row) != len(head):
                    continue
                key = (ti, tuple(head[k] + "=" + row[k] for k in kcols))
                for k in tcols:
                    try:
                        v = float(row[k])
                    except ValueError:
                        continue
                    seen.setdefault(key + (head[k],), []).append(v)
    return {k: stat(v) for k, v in seen.items()}


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def main():
    logdir, reps = sys.argv[1], int(sys.argv[2])
    stat = median if "--median" in sys.argv[3:] else min
    names = sorted({os.path.basename(p) for p in glob.glob(os.path.join(logdir, "*.1", "*.md"))})
    worst = []
    for name in names:
        b = collect(logdir, "before", reps, name, stat)
        a = collect(logdir, "after", reps, name, stat)
        common = [k for k in b if k in a]
        print(f"\n### {name}: {len(common)} rows in both ({len(b)} before, {len(a)} after)\n")
        print("| row | column | before | after | after/before |")
        print("|---|---|---|---|---|")
        for k in common:
            ratio = a[k] / b[k] if b[k] > 0 else float("nan")
            worst.append((ratio, name, k))
            print(f"| {' '.join(k[1])} | {k[2]} | {b[k]:g} | {a[k]:g} | {ratio:.3f} |")
    if worst:
        within = sum(1 for r, _, _ in worst if 0.97 <= r <= 1.03)
        print(f"\n{within} of {len(worst)} rows within ±3% (after/before in [0.97, 1.03], "
              f"{'median' if stat is median else 'minimum'} of {reps} runs); "
              f"slowest after/before {max(worst)[0]:.3f} ({max(worst)[1]}: {' '.join(max(worst)[2][1])})")


if __name__ == "__main__":
    main()
