#!/usr/bin/env python3
"""PyTorch peer of bench/cuda/bench_attention.cu: torch.nn.functional.scaled_dot_product_attention
(bf16) on the same Qwen3-8B attention shapes (Hq = 32, Hkv = 8, D = 128): causal prefill at
seq 1024 / 4096 / 8192 with batch = 16384 / seq (the flash and the cuDNN backends), and decode
(flash backend) (one query per
sequence, not causal) at batch 1 / 32 / 128 x context 1k / 4k / 16k over contiguous K/V. GQA via
enable_gqa=True when the flash backend accepts it, else K/V expanded to Hq heads (the FLOP count is
the same; the expanded decode reads 4x the bytes, so its time is reported but not comparable).
Time: mean of --reps calls between CUDA events after warm-up. Writes KEY,ms lines to --out, which
bench_attention reads with --sdpa:
    python3 bench/cuda/attention_sdpa.py --out /tmp/sdpa.csv && ./bench_attention --sdpa /tmp/sdpa.csv
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

HQ, HKV, D = 32, 8, 128


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


def sdpa(q, k, v, causal, backend=SDPBackend.FLASH_ATTENTION):
    """One SDPA backend (flash unless told), GQA natively if possible, else with expanded K/V.
    Returns (fn, mode); raises RuntimeError when the backend cannot run the shape."""
    with sdpa_kernel(backend):
        try:
            F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
            torch.cuda.synchronize()

            def fn():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

            return fn, "gqa"
        except RuntimeError:
            pass
    ke = k.repeat_interleave(HQ // HKV, dim=1)
    ve = v.repeat_interleave(HQ // HKV, dim=1)

    def fn2():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, ke, ve, is_causal=causal)

    fn2()
    torch.cuda.synchronize()
    return fn2, "expanded"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sdpa.csv")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-decode", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    lines = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("prefill (causal)  backend  seq  batch       ms   TFLOP/s  mode")
    for L in (1024, 4096, 8192):
        B = 16384 // L
        q = torch.randn(B, HQ, L, D, device=dev, dtype=torch.bfloat16)
        k = torch.randn(B, HKV, L, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn(B, HKV, L, D, device=dev, dtype=torch.bfloat16)
        flops = 4.0 * B * L * (L + 1) / 2.0 * D * HQ
        for name, backend, key in (("flash", SDPBackend.FLASH_ATTENTION, f"prefill_{L}"),
                                   ("cudnn", SDPBackend.CUDNN_ATTENTION, f"prefill_cudnn_{L}")):
            try:
                fn, mode = sdpa(q, k, v, True, backend)
            except RuntimeError as e:
                print(f"prefill {name} {L}: {e}")
                continue
            ms = timed(fn, a.reps)
            print(f"{'':17s} {name:7s} {L:5d} {B:6d} {ms:8.3f} {flops / ms / 1e9:9.1f}  {mode}")
            lines.append(f"{key},{ms}")
        del q, k, v
    if not a.no_decode:
        print("decode                  batch    ctx       us      GB/s  mode")
        for batch in (1, 32, 128):
            for ctx in (1024, 4096, 16384):
                try:
                    q = torch.randn(batch, HQ, 1, D, device=dev, dtype=torch.bfloat16)
                    k = torch.randn(batch, HKV, ctx, D, device=dev, dtype=torch.bfloat16)
                    v = torch.randn(batch, HKV, ctx, D, device=dev, dtype=torch.bfloat16)
                    fn, mode = sdpa(q, k, v, False)
                    ms = timed(fn, a.reps)
                    byts = batch * ctx * HKV * D * 2 * 2
                    print(f"{'':22s} {batch:6d} {ctx:6d} {ms * 1e3:8.1f} {byts / ms / 1e6:9.0f}  {mode}")
                    lines.append(f"decode_{batch}_{ctx},{ms}")
                    del q, k, v
                    torch.cuda.empty_cache()
                except RuntimeError as e:
                    print(f"decode {batch} {ctx}: {e}")
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
