#!/usr/bin/env python3
"""ctest: scripts/perf_bars.py reads the open issues' bars off a gpu_check run's logs correctly.

The fixture (tests/scripts/perf_bars_logs/) holds excerpts of real runs: audit.txt,
bench_attention.md, bench_attention_bwd.md and bench_gemm_bwd.md of the H100 run of 2026-12-06
05:27-05:33 UTC, bench_gemm_cuda.md and the head of bench_logprob.md of the H200 run of 2026-11-30
00:23 UTC (docs/gpu-validation.md); the sampling table of bench_logprob.md and bench_logprob_bwd.md
are written in the benchmarks' formats with the figures docs/perf.md reports for 2026-12-04 and
2026-12-02 (their raw logs were not kept). The worst points the script must find are known.
Exits non-zero with the reason on any difference.
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


expect(line_with("MET", "attention fwd+bwd", "0.65x (5.984 ms vs cuDNN 3.890 ms)") is not None,
       "attention fwd+bwd: 0.65x cuDNN", out)
expect(line_with("BELOW", "log-prob head", "85.47 ms vs torch naive 55.34 ms", "420 MiB") is
       not None, "log-prob head: slower than torch naive, memory within the budget", out)
expect(line_with("MET", "GEMM dX", "worst 0.88x (down T=16384 bf16)", "24 points") is not None,
       "dX: worst down T=16384 bf16", out)
expect(line_with("BELOW", "GEMM dW", "worst 0.46x (down T=1024 f32 +=, blocked)") is not None,
       "dW: the blocked form counts", out)
expect(line_with("BELOW", "prefill", "cuDNN", "worst 0.45x (seq 1024)", "3 points") is not None,
       "prefill vs cuDNN: kv_chunk 1024 rows only", out)
expect(line_with("BELOW", "prefill", "flash", "worst 0.79x (seq 1024)", "best 1.00x") is not None,
       "prefill vs flash", out)
expect(line_with("BELOW", "(S = 1)", "worst 0.86x (o_proj M=4096)", "4 points") is not None,
       "S = 1 GEMM: M >= 1024 only", out)
expect(line_with("BELOW", "row-parallel", "worst 0.53x (o_proj M=4096)", "2 points") is not None,
       "row-parallel S = 4", out)
expect(line_with("BELOW", "sampling", "worst 209.4 us (top-p 0.9, temperature 1)", "best 113.8 us",
                 "6 points") is not None, "sampling: top-p / top-k rows only, the longest", out)
expect(line_with("BELOW", "training forward at the audit contract", "[bench_engine_qwen3_8b audit]",
                 "0.90x") is not None and line_with("training forward", "one-gpu") is None,
       "training forward: the audit configuration only", out)
expect(line_with("MET", "rollout", "audit]", "1.34x") is not None and
       line_with("MET", "rollout", "one-gpu]", "1.79x") is not None, "rollout: both configurations",
       out)
expect(line_with("BELOW", "decode step", "audit]", "2.42x its floor") is not None and
       line_with("BELOW", "decode step", "one-gpu]", "1.64x its floor") is not None,
       "decode step: each configuration's invariant row", out)
expect(lines and lines[-1] == "bars: 4 met, 10 below, 0 not measured", "summary line", out)

# Thresholds are arguments: a looser decode bar turns the one-GPU line into MET; a bad one: exit 2.
rc, out, _ = run(LOGS, "--bar", "decode_floor=1.7")
expect(out.splitlines()[-1:] == ["bars: 5 met, 9 below, 0 not measured"], "--bar decode_floor", out)
rc, _, err = run(LOGS, "--bar", "no_such_bar=1")
expect(rc == 2 and "bad --bar" in err, "unknown --bar name: exit 2", err)

# An empty folder: nothing measured, still exit 0; a missing folder: exit 2.
with tempfile.TemporaryDirectory() as empty:
    rc, out, _ = run(empty)
    expect(rc == 0 and out.splitlines()[-1:] == ["bars: 0 met, 0 below, 12 not measured"],
           "empty folder: every bar NOT MEASURED", out)
# An engine log without configuration labels (older bench-engine): the training bar applies.
with tempfile.TemporaryDirectory() as old:
    with open(os.path.join(old, "audit.txt"), "w") as f:
        f.write("=== bench_engine_qwen3_8b: lockstep bench-engine --device cuda\n"
                "invariant@cuda speed relative to baseline@cuda (their time / its time): "
                "rollout 0.79x, training forward 0.96x\n")
    rc, out, _ = run(old)
    lines = out.splitlines()
    expect(line_with("MET", "training forward", "[bench_engine_qwen3_8b]", "0.96x") is not None and
           line_with("BELOW", "rollout", "0.79x") is not None and
           line_with("NOT MEASURED", "decode step") is not None,
           "unlabelled configuration: training and rollout bars, no decode table", out)
# The one-pass head (bench_logprob_bwd's --ours row 2, the figures of docs/perf.md session 28, H100):
# reported beside the two-pass bar, each against torch naive.
with tempfile.TemporaryDirectory() as one:
    with open(os.path.join(one, "bench_logprob_bwd.md"), "w") as f:
        f.write("| implementation | fwd+bwd ms | TFLOP/s (4 GEMMs) | peak extra MiB | dh, dW "
                "identical run to run |\n|---|---|---|---|---|\n"
                "| lockstep forward + backward (vocab_segments=1) | 71.65 | 569.4 | 480.0 | yes |\n"
                "| lockstep forward + backward in one pass from the rollout's lse (the forward's "
                "outputs recomputed by the backward) | 56.74 | 719.0 | 480.0 | yes |\n"
                "| torch naive: h@W.T -> float -> log_softmax -> gather, autograd | 61.96 | 658.4 | "
                "14233.6 | yes |\n")
    rc, out, _ = run(one)
    lines = out.splitlines()
    expect(line_with("BELOW", "log-prob head fwd+bwd faster", "71.65 ms vs torch naive 61.96 ms")
           is not None and
           line_with("MET", "in one pass from the rollout's lse", "56.74 ms vs torch naive 61.96 ms",
                     "480 MiB") is not None,
           "log-prob head: the two-pass bar below, the one pass met, each on its own line", out)
rc, _, err = run(os.path.join(LOGS, "no-such-folder"))
expect(rc == 2 and "not a folder" in err, "missing folder: exit 2 with a message", err)

if failures:
    print("test_perf_bars: %d failure(s)" % len(failures))
    for f in failures:
        print("FAIL", f)
    sys.exit(1)
print("test_perf_bars: all checks passed")
