#!/usr/bin/env python3
"""The performance bars of the open GPU issue, read off one gpu_check run's logs.

Usage: python3 scripts/perf_bars.py LOGDIR [--bar-gemm-large 0.6] [--bar-gemm-small 0.8]
                                           [--bar-rollout 0.7]

LOGDIR is the `logs/` folder gpu_check.sh writes (bench_gemm_cuda.md, bench_gemm_small_m.md,
bench_logprob.md, audit.txt). Prints one line per bar: the worst figure of the run, where it was
measured and MET / BELOW, then `bars: N met, M below, K not measured`. A report, not a test: it
always exits 0 (speed is never a pass/fail test, docs/perf.md), except 2 for an unreadable folder.
Every figure is a ratio against a peer measured in the same run (the benchmarks print them).
"""
import argparse
import os
import re
import sys


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def table_rows(text, header_start):
    """Rows (lists of stripped cells) of the first markdown table whose header starts with
    header_start."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(header_start):
            head = [c.strip() for c in line.strip().strip("|").split("|")]
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                rows.append(dict(zip(head, [c.strip() for c in row.strip().strip("|").split("|")])))
            return rows
    return []


def gemm_bars(logdir, bar_large, bar_small):
    """GEMM vs cuBLAS: M >= 1024 and M <= 64 (S = 1), public entry point, launch included."""
    text = read(os.path.join(logdir, "bench_gemm_cuda.md"))
    if text is None:
        return [("GEMM >= %.2fx cuBLAS at M >= 1024 (S = 1)" % bar_large, None, ""),
                ("GEMM >= %.2fx cuBLAS at M <= 64 (S = 1, launch included)" % bar_small, None, "")]
    rows = [r for r in table_rows(text, "| shape | S | M |") if r.get("S") == "1"]
    large = [(float(r["ratio"]), "%s M=%s" % (r["shape"], r["M"])) for r in rows
             if int(r["M"]) >= 1024]
    small = [(float(r["ratio"]), "%s M=%s" % (r["shape"], r["M"])) for r in rows
             if int(r["M"]) <= 64]
    out = []
    for name, vals, bar in (("GEMM >= %.2fx cuBLAS at M >= 1024 (S = 1)" % bar_large, large,
                             bar_large),
                            ("GEMM >= %.2fx cuBLAS at M <= 64 (S = 1, launch included)" % bar_small,
                             small, bar_small)):
        if not vals:
            out.append((name, None, ""))
            continue
        worst = min(vals)
        out.append((name, worst[0] >= bar, "worst %.2fx (%s), best %.2fx, %d points" %
                    (worst[0], worst[1], max(vals)[0], len(vals))))
    return out


def small_m_bar(logdir, bar_small):
    """Small M with w streamed from HBM: public path time vs cuBLAS time (same run)."""
    name = "GEMM >= %.2fx cuBLAS at M <= 64, w from HBM (public path)" % bar_small
    text = read(os.path.join(logdir, "bench_gemm_small_m.md"))
    if text is None:
        return [(name, None, "")]
    rows = table_rows(text, "| shape (N,K) | M |")
    vals = []
    for r in rows:
        try:
            vals.append((float(r["cuBLAS us"]) / float(r["public us"]),
                         "%s M=%s" % (r["shape (N,K)"], r["M"])))
        except (KeyError, ValueError, ZeroDivisionError):
            continue
    if not vals:
        return [(name, None, "")]
    worst = min(vals)
    return [(name, worst[0] >= bar_small, "worst %.2fx (%s), best %.2fx, %d points" %
             (worst[0], worst[1], max(vals)[0], len(vals)))]


def logprob_bar(logdir):
    name = "linear log-prob faster than PyTorch with >= 10x less memory (T=8192 H=4096 V=151936)"
    text = read(os.path.join(logdir, "bench_logprob.md"))
    m = text and re.search(r"time ratio: ([0-9.]+).*memory ratio ([0-9.]+)", text)
    if not m:
        return [(name, None, "")]
    t, mem = float(m.group(1)), float(m.group(2))
    # The memory ratio is printed rounded: take the MiB figures of the table when present.
    ours = re.search(r"^\| lockstep cuda::linear_logprob[^|]*\|[^|]*\|[^|]*\| *([0-9.]+) *\|", text,
                     re.M)
    torch = re.search(r"^\| torch: h@W\.T[^|]*\|[^|]*\|[^|]*\| *([0-9.]+) *\|", text, re.M)
    if ours and torch and float(torch.group(1)) > 0:
        mem = float(ours.group(1)) / float(torch.group(1))
    return [(name, t < 1.0 and mem <= 0.1,
             "time %.2fx PyTorch's, memory %.4fx (%.0fx less)" % (t, mem, 1.0 / mem if mem else 0))]


def engine_bars(logdir, bar_rollout):
    """Every bench-engine section of audit.txt: invariant vs baseline rollout tokens/s."""
    name = "invariant rollout >= %.2fx baseline tokens/s (bench-engine)" % bar_rollout
    text = read(os.path.join(logdir, "audit.txt"))
    if text is None:
        return [(name, None, "")]
    out = []
    section = None
    for line in text.splitlines():
        m = re.match(r"=== (bench_engine\S*):", line)
        if m:
            section = m.group(1)
        # "[config] invariant speed relative to ...": one line per configuration of the call.
        m = re.search(r"^(?:\[(\S+)\] )?.*rollout ([0-9.]+)x, training forward ([0-9.]+)x", line)
        if m and section:
            label = section + (" " + m.group(1) if m.group(1) else "")
            r, t = float(m.group(2)), float(m.group(3))
            out.append(("%s [%s]" % (name, label), r >= bar_rollout,
                        "rollout %.2fx, training forward %.2fx" % (r, t)))
    return out or [(name, None, "")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logdir")
    ap.add_argument("--bar-gemm-large", type=float, default=0.6)
    ap.add_argument("--bar-gemm-small", type=float, default=0.8)
    ap.add_argument("--bar-rollout", type=float, default=0.7)
    a = ap.parse_args()
    if not os.path.isdir(a.logdir):
        print("perf_bars: %s is not a folder" % a.logdir, file=sys.stderr)
        return 2
    bars = (gemm_bars(a.logdir, a.bar_gemm_large, a.bar_gemm_small) +
            small_m_bar(a.logdir, a.bar_gemm_small) + logprob_bar(a.logdir) +
            engine_bars(a.logdir, a.bar_rollout))
    met = below = missing = 0
    for name, ok, detail in bars:
        if ok is None:
            missing += 1
            print("NOT MEASURED  %s" % name)
        elif ok:
            met += 1
            print("MET           %s: %s" % (name, detail))
        else:
            below += 1
            print("BELOW         %s: %s" % (name, detail))
    print("bars: %d met, %d below, %d not measured" % (met, below, missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
