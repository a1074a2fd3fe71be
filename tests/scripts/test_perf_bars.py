#!/usr/bin/env python3
"""ctest: scripts/perf_bars.py reads the issue's bars off a gpu_check run's logs correctly.

The fixture (tests/scripts/perf_bars_logs/) is an excerpt of the H200 run of 2026-11-30 00:23 UTC
(docs/gpu-validation.md): the worst points it must find are known (down M=64 0.80x launch
included, o_proj M=64 0.78x with w from HBM, log-prob 0.73x time / 213x less memory, rollout
0.79x and 0.93x). Exits non-zero with the reason on any difference.
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "perf_bars.py")
LOGS = os.path.join(HERE, "perf_bars_logs")

failures = []


def run(*args):
    r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def expect(cond, what, out=""):
    if not cond:
        failures.append(what + ("\n--- output:\n" + out if out else ""))


rc, out, _ = run(LOGS)
expect(rc == 0, "exit code 0 on a readable folder (a report, not a test)", out)
lines = out.splitlines()


def line_with(*parts):
    for line in lines:
        if all(p in line for p in parts):
            return line
    return None


expect(line_with("MET", "M >= 1024", "worst 0.86x (o_proj M=4096)") is not None,
       "M >= 1024: worst point o_proj M=4096 0.86x, S = 4 rows ignored", out)
expect(line_with("MET", "launch included", "worst 0.80x (down M=64)") is not None,
       "M <= 64 launch included: 0.80x at down M=64 meets 0.80", out)
expect(line_with("BELOW", "w from HBM", "worst 0.78x (o_proj M=64)") is not None,
       "w from HBM: o_proj M=64 public 13.7/17.6 = 0.78x is below 0.80", out)
expect(line_with("MET", "log-prob", "time 0.73x", "213x less") is not None,
       "log-prob: 0.73x time, memory from the MiB columns (213x), not the rounded ratio", out)
expect(line_with("MET", "[bench_engine_qwen3_8b]", "rollout 0.79x") is not None and
       line_with("MET", "[bench_engine_qwen3_8b_s1]", "rollout 0.93x") is not None,
       "one rollout bar per bench-engine section", out)
expect(lines and lines[-1] == "bars: 5 met, 1 below, 0 not measured", "summary line", out)

# Thresholds are arguments: a lower small-M bar turns the BELOW line into MET.
rc, out, _ = run(LOGS, "--bar-gemm-small", "0.75")
expect(out.splitlines()[-1:] == ["bars: 6 met, 0 below, 0 not measured"], "--bar-gemm-small", out)

# An empty folder: nothing measured, still exit 0; a missing folder: exit 2.
with tempfile.TemporaryDirectory() as empty:
    rc, out, _ = run(empty)
    expect(rc == 0 and out.splitlines()[-1:] == ["bars: 0 met, 0 below, 5 not measured"],
           "empty folder: every bar NOT MEASURED", out)
# bench-engine's two configurations in one section: one bar each, labelled with the configuration.
with tempfile.TemporaryDirectory() as two:
    with open(os.path.join(two, "audit.txt"), "w") as f:
        f.write("=== bench_engine_qwen3_8b: lockstep bench-engine --device cuda\n"
                "[audit] invariant speed relative to baseline (their time / its time): "
                "rollout 1.02x, training forward 0.94x\n"
                "[one-gpu] invariant speed relative to baseline (their time / its time): "
                "rollout 0.65x, training forward 0.98x\n")
    rc, out, _ = run(two)
    lines = out.splitlines()
    expect(line_with("MET", "[bench_engine_qwen3_8b audit]", "rollout 1.02x") is not None and
           line_with("BELOW", "[bench_engine_qwen3_8b one-gpu]", "rollout 0.65x") is not None,
           "one rollout bar per bench-engine configuration", out)
rc, _, err = run(os.path.join(LOGS, "no-such-folder"))
expect(rc == 2 and "not a folder" in err, "missing folder: exit 2 with a message", err)

if failures:
    print("test_perf_bars: %d failure(s)" % len(failures))
    for f in failures:
        print("FAIL", f)
    sys.exit(1)
print("test_perf_bars: all checks passed")
