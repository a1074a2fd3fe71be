#!/usr/bin/env python3
"""The performance bars of the open GPU issues (11: the backward; 13: invariance at no cost), read
off one gpu_check run's logs.

Usage: python3 scripts/perf_bars.py LOGDIR [--bar NAME=VALUE ...]

LOGDIR is the `logs/` folder gpu_check.sh writes. Each bar is read from the log of the part that
measures it (`tests bench bwdbench audit` measure them all):
  attention_fwd_bwd  lockstep attention fwd+bwd >= 0.60x cuDNN SDPA        bench_attention_bwd.md
  logprob_head       log-prob head fwd+bwd faster than torch naive, <= 512 MiB extra
                                                                            bench_logprob_bwd.md
  gemm_dx, gemm_dw   dX / dW >= 0.85x cuBLAS at T >= 1024                    bench_gemm_bwd.md
  prefill_cudnn      attention prefill >= 0.80x cuDNN SDPA (kv_chunk 1024)  bench_attention.md
  prefill_flash      attention prefill >= 1.00x flash SDPA (kv_chunk 1024)  bench_attention.md
  gemm_s1            GEMM >= 0.95x cuBLAS at M >= 1024, S = 1               bench_gemm_cuda.md
  gemm_rowpar_s4     row-parallel GEMM (o_proj, down) >= 0.90x cuBLAS at S = 4, M >= 1024
                                                                            bench_gemm_cuda.md
  sampling_us        sampling choice stage <= 50 us (128 rows, top-p / top-k) bench_logprob.md
  train_audit        training forward at the audit contract >= 0.95x baseline  audit.txt
  rollout            rollout >= 1.00x baseline (every bench-engine configuration)  audit.txt
  decode_floor       decode step <= 1.50x its memory floor (every configuration)  audit.txt
`--bar NAME=VALUE` changes a threshold (e.g. --bar decode_floor=1.6). Prints one line per bar
(the worst figure of the run, where it was measured, MET / BELOW / NOT MEASURED), then `bars: N
met, M below, K not measured`. A report, not a test: it always exits 0 (speed is never a
pass/fail test, docs/perf.md), except 2 for an unreadable folder or a bad --bar. Every figure is
a ratio against a peer measured in the same run (the benchmarks print them), or a time.
"""
import argparse
import os
import re
import sys

BARS = {
    "attention_fwd_bwd": 0.60,
    "logprob_head": 512.0,
    "gemm_dx": 0.85,
    "gemm_dw": 0.85,
    "prefill_cudnn": 0.80,
    "prefill_flash": 1.00,
    "gemm_s1": 0.95,
    "gemm_rowpar_s4": 0.90,
    "sampling_us": 50.0,
    "train_audit": 0.95,
    "rollout": 1.00,
    "decode_floor": 1.50,
}


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def table_rows(text, header_start):
    """Rows (dicts by header cell) of the first markdown table whose header starts with
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


def worst_of(name, vals, ok, higher_is_better=True):
    """vals: (value, where); ok(value) -> bool. Reports the worst point (the lowest ratio, or
    the longest time) and the best."""
    if not vals:
        return (name, None, "")
    pick = (min, max) if higher_is_better else (max, min)
    worst, best = pick[0](vals)[0], pick[1](vals)[0]
    where = [w for v, w in vals if v == worst][0]
    f = (lambda x: "%.2fx" % x) if higher_is_better else (lambda x: "%.1f us" % x)
    return (name, ok(worst), "worst %s (%s), best %s, %d points" % (f(worst), where, f(best),
                                                                     len(vals)))


def attention_fwd_bwd(logdir, b):
    name = "attention fwd+bwd >= %.2fx cuDNN SDPA (B=4 S=4096 Hq=32 Hkv=8 D=128)" % b["attention_fwd_bwd"]
    text = read(os.path.join(logdir, "bench_attention_bwd.md")) or ""
    m = re.search(r"^SDPA cudnn\s+([0-9.]+)\s+([0-9.]+)\s+lockstep / SDPA throughput ([0-9.]+)x",
                  text, re.M)
    ours = re.search(r"^lockstep fwd\+bwd\s+([0-9.]+)", text, re.M)
    if not m:
        return [(name, None, "")]
    r = float(m.group(3))
    return [(name, r >= b["attention_fwd_bwd"], "%.2fx (%s ms vs cuDNN %s ms)" %
             (r, ours.group(1) if ours else "?", m.group(1)))]


def logprob_head(logdir, b):
    name = ("log-prob head fwd+bwd faster than torch naive with <= %.0f MiB extra (T=8192 H=4096 "
            "V=151936)" % b["logprob_head"])
    rows = table_rows(read(os.path.join(logdir, "bench_logprob_bwd.md")) or "", "| implementation |")
    ours = [r for r in rows if r.get("implementation", "").startswith("lockstep")]
    naive = [r for r in rows if r.get("implementation", "").startswith("torch naive")]
    if not ours or not naive:
        return [(name, None, "")]
    try:
        ms, mib = float(ours[0]["fwd+bwd ms"]), float(ours[0]["peak extra MiB"])
        ms_t = float(naive[0]["fwd+bwd ms"])
    except (KeyError, ValueError):
        return [(name, None, "")]
    out = [(name, ms < ms_t and mib <= b["logprob_head"],
            "%.2f ms vs torch naive %.2f ms (%.2fx its time), %.0f MiB extra" %
            (ms, ms_t, ms / ms_t, mib))]
    # The on-policy step's head: the backward from the rollout's lse, recomputing the forward's
    # outputs (one pass; needs that lse, so it is reported beside the two-pass figure, not for it).
    one = [r for r in rows if r.get("implementation", "").startswith("lockstep forward + backward "
                                                                     "in one pass")]
    if one:
        try:
            ms1, mib1 = float(one[0]["fwd+bwd ms"]), float(one[0]["peak extra MiB"])
            out.append((name.replace("fwd+bwd", "fwd+bwd in one pass from the rollout's lse"),
                        ms1 < ms_t and mib1 <= b["logprob_head"],
                        "%.2f ms vs torch naive %.2f ms (%.2fx its time), %.0f MiB extra" %
                        (ms1, ms_t, ms1 / ms_t, mib1)))
        except (KeyError, ValueError):
            pass
    return out


def gemm_bwd(logdir, b):
    out = []
    rows = table_rows(read(os.path.join(logdir, "bench_gemm_bwd.md")) or "", "| op | shape | T |")
    for op, key in (("dX", "gemm_dx"), ("dW", "gemm_dw")):
        vals = []
        for r in rows:
            try:
                # A forced path (e.g. dW "gathered (forced)") is a comparison, not the op's.
                if r["op"] == op and int(r["T"]) >= 1024 and "forced" not in r["out"]:
                    vals.append((float(r["ratio"]), "%s T=%s %s" % (r["shape"], r["T"], r["out"])))
            except (KeyError, ValueError):
                continue
        out.append(worst_of("GEMM %s >= %.2fx cuBLAS at T >= 1024" % (op, b[key]), vals,
                            lambda x, k=key: x >= b[k]))
    return out


def prefill(logdir, b):
    """bench_attention.md's prefill table (space-separated): seq batch T chunk ms TFLOP/s flash
    cuDNN x flash x cuDNN; the kv_chunk 1024 rows (the one-GPU contract)."""
    text = read(os.path.join(logdir, "bench_attention.md")) or ""
    cudnn, flash = [], []
    for line in text.splitlines():
        f = line.split()
        if len(f) == 10 and f[0].isdigit() and f[3] == "1024" and f[8].endswith("x"):
            where = "seq %s" % f[0]
            flash.append((float(f[8].rstrip("x")), where))
            cudnn.append((float(f[9].rstrip("x")), where))
    return [worst_of("attention prefill >= %.2fx cuDNN SDPA (kv_chunk 1024)" % b["prefill_cudnn"],
                     cudnn, lambda x: x >= b["prefill_cudnn"]),
            worst_of("attention prefill >= %.2fx flash SDPA (kv_chunk 1024)" % b["prefill_flash"],
                     flash, lambda x: x >= b["prefill_flash"])]


def gemm_fwd(logdir, b):
    rows = table_rows(read(os.path.join(logdir, "bench_gemm_cuda.md")) or "", "| shape | S | M |")
    s1, s4 = [], []
    for r in rows:
        try:
            ratio, where, m = float(r["ratio"]), "%s M=%s" % (r["shape"], r["M"]), int(r["M"])
        except (KeyError, ValueError):
            continue
        if m < 1024:
            continue
        if r.get("S") == "1":
            s1.append((ratio, where))
        elif r.get("S") == "4" and r["shape"] in ("o_proj", "down"):
            s4.append((ratio, where))
    return [worst_of("GEMM >= %.2fx cuBLAS at M >= 1024 (S = 1)" % b["gemm_s1"], s1,
                     lambda x: x >= b["gemm_s1"]),
            worst_of("row-parallel GEMM >= %.2fx cuBLAS at M >= 1024 (S = 4: o_proj, down)" %
                     b["gemm_rowpar_s4"], s4, lambda x: x >= b["gemm_rowpar_s4"])]


def sampling(logdir, b):
    name = "sampling choice stage <= %.0f us (128 rows x V=151936, top-p / top-k)" % b["sampling_us"]
    text = read(os.path.join(logdir, "bench_logprob.md")) or ""
    m = re.search(r"^sampling, (\d+) rows x V=(\d+)", text, re.M)
    if not m:
        return [(name, None, "")]
    vals = []
    for r in table_rows(text[m.start():], "| setting | temperature | choice stage us |"):
        s = r.get("setting", "")
        if "top-p" in s or "top-k" in s:
            try:
                vals.append((float(r["choice stage us"]), "%s, temperature %s" %
                             (s, r.get("temperature", "?"))))
            except (KeyError, ValueError):
                continue
    res = worst_of(name, vals, lambda x: x <= b["sampling_us"], higher_is_better=False)
    if m.group(1) != "128" or m.group(2) != "151936":
        res = (res[0], res[1], res[2] + " (measured on %s rows x V=%s)" % (m.group(1), m.group(2)))
    return [res]


def engine(logdir, b):
    """audit.txt's bench-engine sections: per configuration the speed line and the decode table."""
    text = read(os.path.join(logdir, "audit.txt"))
    names = ("training forward at the audit contract >= %.2fx baseline" % b["train_audit"],
             "rollout >= %.2fx baseline" % b["rollout"],
             "decode step <= %.2fx its memory floor (batch 128)" % b["decode_floor"])
    if text is None:
        return [(n, None, "") for n in names]
    train, roll, dec = [], [], []
    section, floor = None, None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"=== (bench_engine\S*):", line)
        if m:
            section, floor = m.group(1), None
        if line.startswith("backend") and "x floor" in line and i + 1 < len(lines):
            f = lines[i + 1].split()
            if f and f[0].startswith("invariant") and len(f) >= 5:
                floor = float(f[4])
        m = re.search(r"^(?:\[(\S+)\] )?.*rollout ([0-9.]+)x, training forward ([0-9.]+)x", line)
        if m and section:
            cfg = m.group(1)
            label = section + (" " + cfg if cfg else "")
            r, t = float(m.group(2)), float(m.group(3))
            roll.append((names[1] + " [%s]" % label, r >= b["rollout"], "rollout %.2fx" % r))
            if cfg in (None, "audit", "flags"):
                train.append((names[0] + " [%s]" % label, t >= b["train_audit"],
                              "training forward %.2fx" % t))
            if floor is not None:
                dec.append((names[2] + " [%s]" % label, floor <= b["decode_floor"],
                            "%.2fx its floor" % floor))
            floor = None
    return ((train or [(names[0], None, "")]) + (roll or [(names[1], None, "")]) +
            (dec or [(names[2], None, "")]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logdir")
    ap.add_argument("--bar", action="append", default=[], metavar="NAME=VALUE")
    a = ap.parse_args()
    b = dict(BARS)
    for kv in a.bar:
        k, _, v = kv.partition("=")
        try:
            if k not in b:
                raise ValueError
            b[k] = float(v)
        except ValueError:
            print("perf_bars: bad --bar %r (names: %s)" % (kv, ", ".join(BARS)), file=sys.stderr)
            return 2
    if not os.path.isdir(a.logdir):
        print("perf_bars: %s is not a folder" % a.logdir, file=sys.stderr)
        return 2
    bars = (attention_fwd_bwd(a.logdir, b) + logprob_head(a.logdir, b) + gemm_bwd(a.logdir, b) +
            prefill(a.logdir, b) + gemm_fwd(a.logdir, b) + sampling(a.logdir, b) +
            engine(a.logdir, b))
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
