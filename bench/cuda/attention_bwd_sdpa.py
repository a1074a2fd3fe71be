#!/usr/bin/env python3
"""PyTorch peer of bench/cuda/bench_attention_bwd.cu: torch.nn.functional.scaled_dot_product_attention
forward + backward (bf16, causal) on the same training shape (B = 4, S = 4096, Hq = 32, Hkv = 8,
D = 128), with the cuDNN and the flash backends. GQA via enable_gqa=True when the backend accepts
it, else K/V expanded to Hq heads outside the timed region (gradients then flow to the expanded
K/V: the group sum of dk/dv is not timed; the FLOP count is the same). FLOPs: the forward's causal
2·2·B·S·(S+1)/2·D·Hq, the backward counted as 2.5x the forward (as the issue does). Time: mean of
--reps forward + backward calls between CUDA events after warm-up. Also reports whether dq / dk /
dv are bitwise identical between two runs on the same inputs. Writes KEY,ms lines to --out, which
bench_attention_bwd reads with --sdpa:
    python3 bench/cuda/attention_bwd_sdpa.py --out /tmp/sdpa_bwd.csv
    ./build-gpu/bench_attention_bwd --sdpa /tmp/sdpa_bwd.csv
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

B, S, HQ, HKV, D = 4, 4096, 32, 8, 128
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def timed(fn, reps):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps


def make_step(backend, q, k, v, dout):
    """A forward + backward closure for one backend (GQA natively if possible). Returns
    (fn, leaves, mode) or raises RuntimeError when the backend cannot run the shape."""

    def attempt(qq, kk, vv, gqa):
        def fn():
            for t in (qq, kk, vv):
                t.grad = None
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, enable_gqa=gqa)
            o.backward(dout)

        fn()
        torch.cuda.synchronize()
        return fn

    try:
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        return attempt(*leaves, True), leaves, "gqa"
    except RuntimeError:
        pass
    ke = k.repeat_interleave(HQ // HKV, dim=1)
    ve = v.repeat_interleave(HQ // HKV, dim=1)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, ke, ve)]
    return attempt(*leaves, False), leaves, "expanded"


def grads_bits(leaves):
    return [t.grad.detach().clone().view(torch.int16) for t in leaves]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sdpa_bwd.csv")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"SDPA forward + backward, causal, B={B} S={S} Hq={HQ} Hkv={HKV} D={D} bf16")
    q = torch.randn(B, HQ, S, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, HKV, S, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, HKV, S, D, device=dev, dtype=torch.bfloat16)
    dout = torch.randn(B, HQ, S, D, device=dev, dtype=torch.bfloat16)
    flops = 3.5 * 4.0 * B * S * (S + 1) / 2.0 * D * HQ
    print(f"{'backend':8s} {'ms':>9s} {'TFLOP/s':>9s}  {'mode':9s} dq/dk/dv identical run to run")
    lines = []
    for name, backend in BACKENDS.items():
        try:
            fn, leaves, mode = make_step(backend, q, k, v, dout)
        except RuntimeError as e:
            print(f"{name:8s} not available: {str(e).splitlines()[0]}")
            continue
        fn()
        torch.cuda.synchronize()
        first = grads_bits(leaves)
        fn()
        torch.cuda.synchronize()
        same = all(torch.equal(x, y) for x, y in zip(first, grads_bits(leaves)))
        ms = timed(fn, a.reps)
        print(f"{name:8s} {ms:9.3f} {flops / ms / 1e9:9.1f}  {mode:9s} {'yes' if same else 'NO'}")
        lines.append(f"fwdbwd_{name},{ms}")
        del leaves
        torch.cuda.empty_cache()
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
