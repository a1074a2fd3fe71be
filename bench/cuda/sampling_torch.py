#!/usr/bin/env python3
"""PyTorch peer of the sampling choice stage timed by bench/cuda/bench_logprob.cu: the common torch
sampler (vLLM / HF style: temperature, top-k by torch.topk, top-p by a full sort + softmax + cumsum,
min-p against the max probability, then Gumbel-max by probs / Exponential noise) on R x V fp32
logits (default 128 x 151936) given in memory, logits = h @ W.T with h uniform in [-1, 1] and W in
[-1/16, 1/16] (bf16, H = 4096: bench_logprob's law). Time: median of --reps calls (CUDA events),
the filters and the choice only. With --ours FILE (bench_logprob's --json output) it prints
lockstep's choice stage next to it:
    ./build-gpu/bench_logprob --json /tmp/lp.json &&
        python3 bench/cuda/sampling_torch.py --ours /tmp/lp.json
"""
import argparse
import json

import torch
from logprob_torch import bench, inputs  # timing (median ms, peak memory); h, W


def sample(logits, temperature, top_k, top_p, min_p):
    """One token per row; logits [R, V] fp32 (not modified)."""
    if temperature == 0.0:
        return logits.argmax(-1)
    x = logits / temperature
    if top_k > 0:
        kth = torch.topk(x, top_k, dim=-1).values[:, -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        srt, idx = torch.sort(x, dim=-1, descending=True)
        probs = srt.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keeps the first entry past the threshold
        srt = srt.masked_fill(drop, float("-inf"))
        x = torch.empty_like(x).scatter_(-1, idx, srt)
    probs = x.softmax(-1)
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.amax(-1, keepdim=True), 0.0)
    q = torch.empty_like(probs).exponential_()
    return (probs / q).argmax(-1)


SETTINGS = [  # name, temperature (1: the run's tau), top_k, top_p, min_p: bench_logprob's list
    ("greedy", 0.0, 0, 1.0, 0.0),
    ("plain", 1.0, 0, 1.0, 0.0),
    ("min-p 0.1", 1.0, 0, 1.0, 0.1),
    ("top-k 50", 1.0, 50, 1.0, 0.0),
    ("top-p 0.9", 1.0, 0, 0.9, 0.0),
    ("top-p 0.5", 1.0, 0, 0.5, 0.0),
    ("top-k 50 + top-p 0.9", 1.0, 50, 0.9, 0.0),
    ("top-k 50 + top-p 0.9 + min-p 0.05", 1.0, 50, 0.9, 0.05),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--R", type=int, default=128)
    ap.add_argument("--H", type=int, default=4096)
    ap.add_argument("--V", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ours", default="")
    a = ap.parse_args()
    h, W = inputs(a.R, a.H, a.V)
    logits = (h @ W.T).float()
    del h, W
    ours = {}
    if a.ours:
        with open(a.ours) as f:
            o = json.load(f)
        if (o.get("choice_rows"), o["H"], o["V"]) == (a.R, a.H, a.V):
            ours = {(c["name"], c["temperature"]): c for c in o["choice"]}
        else:
            print("(--ours is for another shape; not merged)")
    print(f"\nGPU {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"R={a.R} x V={a.V} fp32 logits (H={a.H}); filters + choice only")
    print("\n| setting | temperature | torch sampler us | lockstep choice stage us "
          "| torch / lockstep |")
    print("|---|---|---|---|---|")
    for tau in (1.0, 0.25):
        for name, temp, k, p, m in SETTINGS:
            if temp == 0.0 and tau != 1.0:
                continue
            t = 0.0 if temp == 0.0 else tau
            us = 1e3 * bench(lambda: sample(logits, t, k, p, m), a.reps)[0]
            mine = ours.get((name, t))
            cell = f"{mine['choice_us']:.1f}" if mine else ""
            ratio = f"{us / mine['choice_us']:.1f}" if mine else ""
            print(f"| {name} | {t:g} | {us:.1f} | {cell} | {ratio} |")


if __name__ == "__main__":
    main()
