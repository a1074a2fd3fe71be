#!/usr/bin/env python3
"""The model-backward peer of bench_train: transformers' Qwen3 (SDPA attention, bf16 weights,
cuBLAS GEMMs, ordinary reductions) on the same shape — random weights, `batch` sequences of `seq`
tokens, loss = sum over tokens of g * log p(target) (g random, the upstream gradient bench_train
feeds lockstep's backward) — timing the forward and the forward + backward (mean of `iters` after
a warm-up, synchronized), and whether two backward runs give identical gradients. With --ours
(bench_train --json) it prints both side by side: lockstep's backward vs torch's
(forward + backward minus forward).

  ./bench_train --json /tmp/train.json && python3 bench/cuda/train_torch.py --ours /tmp/train.json
"""
import argparse
import json
import sys
import time

try:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
except ImportError as e:  # the peer is optional: say so, do not fail the check
    print(f"train_torch: not installed ({e})")
    sys.exit(0)

SHAPES = {
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     tie_word_embeddings=False),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       tie_word_embeddings=True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="bench_train --json output (its shape is used)")
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--iters", type=int, default=3)
    a = ap.parse_args()
    ours = None
    if a.ours:
        with open(a.ours) as f:
            ours = json.load(f)
        a.shape, a.layers, a.seq, a.batch = ours["shape"], ours["layers"], ours["seq"], ours["batch"]
    cfg = Qwen3Config(num_hidden_layers=a.layers, max_position_embeddings=max(a.seq, 128),
                      rope_theta=1e6, rms_norm_eps=1e-6, attn_implementation="sdpa",
                      **SHAPES[a.shape])
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
    model.train()
    T = a.seq * a.batch
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device="cuda")
    tgt = torch.roll(ids, -1, dims=1)
    g = torch.randn(a.batch, a.seq, device="cuda") / T
    g[:, -1] = 0

    def forward():
        logits = model(input_ids=ids).logits.float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        return (lp * g).sum()

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        t = 0.0
        for _ in range(a.iters):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            t += time.perf_counter() - t0
        return t / a.iters * 1e3

    with torch.no_grad():
        fwd = timed(forward)
    grads = []

    def fwd_bwd():
        model.zero_grad(set_to_none=True)
        forward().backward()
        grads.append([p.grad.detach().clone() for p in
                      (model.lm_head.weight, model.model.layers[0].self_attn.q_proj.weight)])
        if len(grads) > 2:
            grads.pop(1)

    both = timed(fwd_bwd)
    same = all(torch.equal(x, y) for x, y in zip(grads[0], grads[-1]))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; transformers Qwen3, SDPA, "
          f"{a.shape} dims, {a.layers} layers, {a.batch} x {a.seq} tokens")
    print("| step | ms | tokens/s |\n| --- | --- | --- |")
    print(f"| torch forward (no grad) | {fwd:.2f} | {T / fwd * 1e3:.0f} |")
    print(f"| torch forward + backward | {both:.2f} | {T / both * 1e3:.0f} |")
    print(f"| torch backward (difference) | {both - fwd:.2f} | {T / (both - fwd) * 1e3:.0f} |")
    print(f"torch gradients identical run to run (lm_head, layer 0 q_proj): {'yes' if same else 'NO'}")
    if ours:
        b = ours["backward_ms"]
        print(f"| lockstep backward | {b:.2f} | {T / b * 1e3:.0f} |")
        print(f"lockstep / torch backward throughput: {(both - fwd) / b:.2f}x (lockstep's forward "
              f"{ours['forward_ms']:.2f} ms stops at the final norm; torch's includes the lm_head "
              f"logits and the loss, so the forwards are not compared)")


if __name__ == "__main__":
    main()
