#!/usr/bin/env python3
"""PyTorch peer of bench/cuda/bench_logprob.cu: linear log-prob at T x H x V (default 8192 x 4096 x
151936, bf16) the usual way, `logits = h @ W.T; logp = logits.float().log_softmax(-1).gather(-1, t)`,
and a variant that also returns lse and entropy. Time: median of --reps calls (CUDA events); memory:
torch.cuda.max_memory_allocated() beyond what was allocated before the call (inputs excluded).
With --ours FILE (bench_logprob's --json output) it prints both in one table:
    ./build-gpu-lp/bench_logprob --json /tmp/lp.json && python3 bench/cuda/logprob_torch.py --ours /tmp/lp.json
"""
import argparse
import json
import math

import torch


def bench(fn, reps):
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        out = fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
        del out
    peak = torch.cuda.max_memory_allocated() - base
    times.sort()
    return times[len(times) // 2], peak / 2**20


def inputs(T, H, V, dev="cuda"):
    """h [T, H] uniform in [-1, 1] and W [V, H] in [-1/16, 1/16], bf16 (bench_logprob's law)."""
    torch.manual_seed(0)
    h = (torch.rand(T, H, device=dev) * 2 - 1).to(torch.bfloat16)
    W = ((torch.rand(V, H, device=dev) * 2 - 1) * 0.0625).to(torch.bfloat16)
    return h, W


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ours", default="")
    a = ap.parse_args()
    dev = "cuda"
    h, W = inputs(a.T, a.H, a.V, dev)
    t = torch.randint(0, a.V, (a.T,), device=dev)

    def logp_only():
        logits = h @ W.T
        return logits.float().log_softmax(-1).gather(-1, t[:, None]).squeeze(-1)

    def logp_lse_entropy():
        logits = (h @ W.T).float()
        lse = logits.logsumexp(-1)
        logp = logits.gather(-1, t[:, None]).squeeze(-1) - lse
        p = (logits - lse[:, None]).exp()
        ent = lse - (p * logits).sum(-1)
        return logp, lse, ent

    def gemm_only():
        return h @ W.T

    flop = 2.0 * a.T * a.H * a.V
    rows = []
    for name, fn in [("torch: logits GEMM alone (bf16 out)", gemm_only),
                     ("torch: h@W.T -> float -> log_softmax -> gather", logp_only),
                     ("torch: + lse + entropy", logp_lse_entropy)]:
        ms, mib = bench(fn, a.reps)
        rows.append((name, ms, flop / ms * 1e-9, mib))
    print(f"\nGPU {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"T={a.T} H={a.H} V={a.V} bf16 (log V = {math.log(a.V):.4f})")
    if a.ours:
        with open(a.ours) as f:
            o = json.load(f)
        if (o["T"], o["H"], o["V"]) == (a.T, a.H, a.V):
            rows.insert(0, ("lockstep cuda::linear_logprob (logp, lse, entropy)", o["ms"],
                            flop / o["ms"] * 1e-9, o["peak_scratch_mib"]))
            rows.insert(1, ("lockstep: logits GEMM alone (fp32 out)", o["gemm_ms"],
                            flop / o["gemm_ms"] * 1e-9, float("nan")))
        else:
            print("(--ours is for another shape; not merged)")
    print("\n| implementation | ms | TFLOP/s | memory beyond inputs (MiB) |")
    print("|---|---|---|---|")
    for name, ms, tf, mib in rows:
        mem = "" if mib != mib else f"{mib:.1f}"
        print(f"| {name} | {ms:.2f} | {tf:.1f} | {mem} |")
    if a.ours and rows[0][0].startswith("lockstep"):
        ours, torch_ms = rows[0][1], rows[3][1]
        print(f"\nlockstep / torch (log_softmax path) time ratio: {ours / torch_ms:.2f} "
              f"({'slower' if ours > torch_ms else 'faster'}); memory ratio "
              f"{rows[0][3] / rows[3][3]:.3f}")


if __name__ == "__main__":
    main()
