#!/usr/bin/env python3
"""Peers of bench/cuda/bench_logprob_bwd.cu: linear cross-entropy forward + backward (dh and dW) at
T x H x V (default 8192 x 4096 x 151936, bf16 h and W, mean over tokens) by
  - torch naive: logits = h @ W.T -> float -> log_softmax -> gather -> mean, autograd backward;
  - torch.nn.functional.linear_cross_entropy (chunked; torch versions that have it);
  - Liger-Kernel's LigerFusedLinearCrossEntropyLoss;
  - cut-cross-entropy's linear_cross_entropy.
Per peer: median ms of --reps forward + backward calls (CUDA events), peak memory beyond what was
allocated before the call (torch.cuda.max_memory_allocated; inputs and the grads' own buffers
excluded, see the note), and whether dh and dW are bitwise identical over two runs on the same
inputs. A peer that is not installed prints "not installed" and is skipped (exit status 0).
With --ours FILE (bench_logprob_bwd's --json output) lockstep's row is printed first:
    ./build-gpu/bench_logprob_bwd --json /tmp/lpb.json && \\
        python3 bench/cuda/logprob_bwd_peers.py --ours /tmp/lpb.json
Note: the peers keep dW in bf16 (W's dtype) where lockstep keeps an fp32 dW; lockstep's "extra"
counts dh ([T, H] f32) and its scratch beyond the fp32 dW; the peers' count everything beyond the
inputs and the gradient buffers' own size (h.grad, W.grad are allocated before the timed calls).
"""
import argparse
import json
import math


def bits(torch, x):
    """The tensor's bit patterns (bitwise comparison, NaN == NaN of the same payload)."""
    return x.view(torch.int16 if x.element_size() == 2 else torch.int32)


def bench(torch, fn, reps):
    """fn() runs forward + backward and returns (dh, dW). Median ms, peak MiB, identical?"""
    dh0, dw0 = fn()
    torch.cuda.synchronize()
    dh0, dw0 = dh0.clone(), dw0.clone()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        dh, dw = fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    peak = torch.cuda.max_memory_allocated() - base
    same = torch.equal(bits(torch, dh), bits(torch, dh0)) and torch.equal(
        bits(torch, dw), bits(torch, dw0))
    times.sort()
    return times[len(times) // 2], peak / 2**20, same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--ours", default="")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch: not installed")
        return 0
    if not torch.cuda.is_available():
        print("torch: no CUDA device")
        return 0
    torch.manual_seed(0)
    dev = "cuda"
    h = ((torch.rand(a.T, a.H, device=dev) * 2 - 1)).to(torch.bfloat16).requires_grad_(True)
    W = ((torch.rand(a.V, a.H, device=dev) * 2 - 1) * 0.0625).to(torch.bfloat16).requires_grad_(True)
    t = torch.randint(0, a.V, (a.T,), device=dev)
    # The gradient buffers exist before the timed calls (their size is not "extra").
    h.grad = torch.zeros_like(h)
    W.grad = torch.zeros_like(W)

    def run(loss_fn):
        def fn():
            h.grad.zero_()
            W.grad.zero_()
            loss = loss_fn()
            loss.backward()
            return h.grad, W.grad
        return fn

    def naive():
        logits = h @ W.T
        return -logits.float().log_softmax(-1).gather(-1, t[:, None]).squeeze(-1).mean()

    peers = [("torch naive: h@W.T -> float -> log_softmax -> gather, autograd", naive)]

    lce = getattr(torch.nn.functional, "linear_cross_entropy", None)
    if lce is not None:
        peers.append(("torch.nn.functional.linear_cross_entropy", lambda: lce(h, W, t)))
    else:
        print("torch.nn.functional.linear_cross_entropy: not installed (this torch lacks it)")

    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
        liger = LigerFusedLinearCrossEntropyLoss()
        peers.append(("Liger LigerFusedLinearCrossEntropyLoss", lambda: liger(W, h, t)))
    except ImportError:
        print("liger-kernel: not installed")

    try:
        from cut_cross_entropy import linear_cross_entropy
        peers.append(("cut-cross-entropy linear_cross_entropy",
                      lambda: linear_cross_entropy(h, W, t)))
    except ImportError:
        print("cut-cross-entropy: not installed")

    flop = 2.0 * a.T * a.H * a.V
    rows = []
    for name, loss_fn in peers:
        try:
            ms, mib, same = bench(torch, run(loss_fn), a.reps)
        except Exception as e:  # an installed peer that fails at this shape (e.g. out of memory)
            print(f"{name}: failed: {type(e).__name__}: {str(e)[:200]}")
            torch.cuda.empty_cache()
            continue
        rows.append((name, ms, 4 * flop / ms * 1e-9, mib, "yes" if same else "NO"))
        torch.cuda.empty_cache()
    print(f"\nGPU {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"T={a.T} H={a.H} V={a.V} bf16 (log V = {math.log(a.V):.4f})")
    if a.ours:
        with open(a.ours) as f:
            o = json.load(f)
        if (o["T"], o["H"], o["V"]) == (a.T, a.H, a.V):
            rows.insert(0, (f"lockstep forward + backward (vocab_segments={o['vocab_segments']})",
                            o["ms"], 4 * flop / o["ms"] * 1e-9, o["extra_mib"],
                            "yes" if o["rerun_identical"] else "NO"))
            if "one_pass_ms" in o:
                # The backward from a given lse (the rollout's, on an on-policy step) that also
                # returns the forward's logp / lse / entropy.
                rows.insert(1, ("lockstep forward + backward in one pass from the rollout's lse "
                                "(the forward's outputs recomputed by the backward)",
                                o["one_pass_ms"], 4 * flop / o["one_pass_ms"] * 1e-9,
                                o["one_pass_extra_mib"],
                                "yes" if o["one_pass_identical"] else "NO"))
        else:
            print("(--ours is for another shape; not merged)")
    print("\n| implementation | fwd+bwd ms | TFLOP/s (4 GEMMs) | peak extra MiB | dh, dW identical "
          "run to run |")
    print("|---|---|---|---|---|")
    for name, ms, tf, mib, same in rows:
        print(f"| {name} | {ms:.2f} | {tf:.1f} | {mib:.1f} | {same} |")
    if a.ours and (o["T"], o["H"], o["V"]) == (a.T, a.H, a.V) and "path" in o:
        # lockstep's parts (bench_logprob_bwd's --json), so that this table alone tells them.
        print(f"\nlockstep: forward {o['fwd_ms']:.2f} ms, backward {o['bwd_ms']:.2f} ms "
              f"(dh path: {o['path']}); one pass {o['one_pass_ms']:.2f} ms ({o['one_pass_path']})"
              + (f", one pass with the G kernel {o['one_pass_dx_ms']:.2f} ms"
                 if o.get("one_pass_dx_ms", 0) > 0 else ""))
        for name, ms in o.get("other_paths", {}).items():
            print(f"lockstep backward alone, dh path {name}: {ms:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
