"""GRPO on a small Hugging Face Qwen3 from Python, with lockstep as the rollout engine.

A ``transformers.Qwen3ForCausalLM`` (random init, fp32 master weights) learns to reverse a short
word ("abcde=" -> "edcba"; ``--task add``: add two numbers, "7+8=" -> "15") with a character-level
tokenizer trained on the fly by the ``tokenizers`` library. Every step:

  1. rollout: ``lockstep.Engine`` (its own copy of the weights, rounded to bf16, rollout TP 2)
     samples G completions per prompt (a GRPO group; equal prompts share their KV pages) and
     records each token's fp32 log-prob;
  2. reward: a Python function (1 for the exact answer; partial credit per right character);
  3. training: the same HF model patched onto lockstep's ops (``lockstep.hf.patch``, TP 1)
     recomputes the log-probs (``lockstep.hf.logprobs``); the old-policy log-probs are the
     rollout's recorded ones, so on the step's first mini-batch the PPO ratio must be exactly 1:
     the two are compared bit for bit (``view(torch.int32)``) and any mismatch fails the run;
     the GRPO loss (group-normalized advantages, clipped ratio, token mean) is backpropagated
     through lockstep's deterministic backward and ``torch.optim.AdamW`` steps the fp32 weights;
  4. weight sync: ``engine.update_weights(model.state_dict(), version=step + 1)``.

Before GRPO, a short supervised warm-up (cross-entropy on the answers, the same patched model)
gives the random model a policy whose samples differ within a group; GRPO then raises the reward
from there. Run (after ``pip install .[torch]`` plus transformers, tokenizers, matplotlib):

    python examples/grpo_hf.py                      # defaults: 60 warm-up + 30 GRPO steps
    python examples/grpo_hf.py --plot grpo_hf.png --out ckpt/   # plot; save model + tokenizer
    python examples/grpo_hf.py --json               # one JSON object per step on stdout

The defaults take about 2 minutes on 2 CPU cores (`time`: real 2m12s, 2026-12-02, contract
0.3); the reward mean rises from 0.576 (first 5 steps) to 0.659 (last 5), the same numbers on
every run.
The exit status is 1 on any log-prob mismatch between rollout and trainer, 2 on bad flags.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from typing import List, Optional, Sequence, Tuple

import torch

import lockstep
import lockstep.hf

PAD, BOS, EOS = "[PAD]", "[BOS]", "[EOS]"


# ---- the task: add two numbers ------------------------------------------------------------------


LETTERS = "abcdefgh"


def make_problem(rng: random.Random, task: str, size: int) -> Tuple[str, str]:
    """(prompt, answer). add: ("a+b=", "sum") with a, b uniform in [0, size]; reverse:
    ("word=", "drow") with a word of 3 .. size letters of LETTERS."""
    if task == "add":
        a, b = rng.randint(0, size), rng.randint(0, size)
        return f"{a}+{b}=", str(a + b)
    word = "".join(rng.choice(LETTERS) for _ in range(rng.randint(3, size)))
    return f"{word}=", word[::-1]


def answer_len(task: str, size: int) -> int:
    return len(str(2 * size)) if task == "add" else size


def reward(completion: str, answer: str) -> float:
    """1.0 for the exact answer; else 0.9 x (characters right in place, aligned at the left) /
    (the longer of the two lengths): partial credit in [0, 0.9], where a wrong length costs."""
    if completion == answer:
        return 1.0
    right = sum(c == a for c, a in zip(completion, answer))
    return 0.9 * right / max(len(completion), len(answer), 1)


# ---- the tokenizer: trained on the fly ----------------------------------------------------------


def train_tokenizer(corpus: Sequence[str]):
    """A character-level WordLevel tokenizer learned from `corpus` by the tokenizers library
    (vocabulary: the special tokens, then every character seen), wrapped as a transformers
    PreTrainedTokenizerFast (save_pretrained)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token=PAD))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=[PAD, BOS, EOS]))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS
    )


def encode(tokenizer, text: str) -> List[int]:
    """Token ids of `text`, no special tokens added (the loop adds BOS and EOS itself)."""
    return tokenizer.encode(text, add_special_tokens=False)


def decode(tokenizer, ids) -> str:
    """A completion as text: its characters up to EOS; any other special token reads as '?'
    (a wrong character)."""
    chars = []
    for t in ids:
        t = int(t)
        if t == tokenizer.eos_token_id:
            break
        chars.append("?" if t in tokenizer.all_special_ids else tokenizer.convert_ids_to_tokens(t))
    return "".join(chars)


# ---- the model ----------------------------------------------------------------------------------


def make_model(tokenizer, seed: int):
    """A small Qwen3 (random init, fp32), tied embeddings like the small Qwen3 checkpoints.
    Heads: a multiple of the contract's gemm_segments (4; lockstep.hf.patch checks it)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=16,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen3ForCausalLM(cfg).to(torch.float32)


def trainer_logprobs(model, seqs: Sequence[List[int]], starts: Sequence[int]) -> Tuple:
    """The trainer's log-probs of each sequence's tokens from `starts[b]` on (its completion),
    packed into one varlen batch: (logp [n] f32 with autograd, entropy [n], group of each row
    [n]). THE one place the trainer's forward lives: lockstep.hf.logprobs on the patched model."""
    ids, targets, rows = [], [], []
    for b, (s, p) in enumerate(zip(seqs, starts)):
        ids += s
        # row t predicts token t + 1: rows p - 1 .. len - 2 give the tokens p .. len - 1
        targets += [-100] * (p - 1) + s[p:] + [-100]
        rows += [b] * len(s)
    cu = [0]
    for s in seqs:
        cu.append(cu[-1] + len(s))
    targets_t = torch.tensor(targets)
    logp, ent = lockstep.hf.logprobs(
        model,
        torch.tensor(ids),
        targets_t,
        cu_seqlens=torch.tensor(cu, dtype=torch.int32),
        entropy=False,
    )
    keep = targets_t >= 0
    return logp[keep], ent[keep], torch.tensor(rows)[keep]


# ---- the loop -----------------------------------------------------------------------------------


def warm_up(model, opt, tokenizer, rng, args, log) -> None:
    """Supervised cross-entropy on the answers (+ EOS), token mean."""
    for step in range(args.warmup_steps):
        t0 = time.perf_counter()
        seqs, starts = [], []
        for _ in range(args.warmup_batch):
            prompt, answer = make_problem(rng, args.task, args.size)
            p = [tokenizer.bos_token_id] + encode(tokenizer, prompt)
            seqs.append(p + encode(tokenizer, answer) + [tokenizer.eos_token_id])
            starts.append(len(p))
        logp, _, _ = trainer_logprobs(model, seqs, starts)
        loss = -logp.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
        if step % 20 == 0 or step == args.warmup_steps - 1:
            acc = float((logp.detach() > math.log(0.5)).float().mean())
            log(
                f"  warm-up {step:4d}  loss {float(loss.detach()):.4f}  tokens p>0.5 {acc:.3f}  "
                f"grad norm {float(gnorm):.3f}  {time.perf_counter() - t0:.2f} s"
            )


def bits_mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many fp32 values of a and b differ in their bits (never a tolerance)."""
    return int((a.contiguous().view(torch.int32) != b.contiguous().view(torch.int32)).sum())


def grpo_step(step, model, opt, engine, tokenizer, rng, args) -> dict:
    t0 = time.perf_counter()
    n, g = args.prompts, args.group_size
    problems = [make_problem(rng, args.task, args.size) for _ in range(n)]
    prompts = [[tokenizer.bos_token_id] + encode(tokenizer, p) for p, _ in problems]
    batch = [p for p in prompts for _ in range(g)]  # group i: rows i*g .. i*g + g - 1
    sampling = lockstep.Sampling(
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    # request ids key the sampling noise: unique over the whole run
    out = engine.generate(batch, sampling, request_ids=[step * n * g + i for i in range(n * g)])
    t_rollout = time.perf_counter() - t0

    rewards = []
    for i, c in enumerate(out):
        rewards.append(reward(decode(tokenizer, c.tokens), problems[i // g][1]))
    r = torch.tensor(rewards, dtype=torch.float32).view(n, g)
    adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).flatten()

    seqs = [p + [int(t) for t in c.tokens] for p, c in zip(batch, out)]
    starts = [len(p) for p in batch]
    old = [torch.from_numpy(c.logp.copy()) for c in out]  # the rollout's recorded log-probs

    # mini-batches of whole groups; an optimizer step each
    groups_per = math.ceil(n / args.mini_batches)
    mismatches = compared = 0
    first_ratio = (math.inf, -math.inf)
    later_ratio = (math.inf, -math.inf)
    losses, gnorms, clipped, tokens = [], [], 0, 0
    for m in range(args.mini_batches):
        lo, hi = m * groups_per * g, min(n, (m + 1) * groups_per) * g
        if lo >= hi:
            break
        logp, _, rows = trainer_logprobs(model, seqs[lo:hi], starts[lo:hi])
        old_lp = torch.cat(old[lo:hi])
        if m == 0:  # on-policy: the trainer's log-probs must be the rollout's, bit for bit
            mismatches += bits_mismatches(logp.detach(), old_lp)
            compared += old_lp.numel()
        ratio = torch.exp(logp - old_lp)
        a = adv[lo:hi][rows]
        lo_c, hi_c = 1.0 - args.clip, 1.0 + args.clip
        loss = -torch.min(ratio * a, ratio.clamp(lo_c, hi_c) * a).mean()  # token mean
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)))
        opt.step()
        rd = ratio.detach()
        mm = (float(rd.min()), float(rd.max()))
        if m == 0:
            first_ratio = mm
        else:
            later_ratio = (min(later_ratio[0], mm[0]), max(later_ratio[1], mm[1]))
        clipped += int(((rd < lo_c) | (rd > hi_c)).sum())
        tokens += rd.numel()
        losses.append(float(loss.detach()))

    version = engine.update_weights(model.state_dict(), version=step + 1)
    return {
        "step": step,
        "reward_mean": float(r.mean()),
        "reward_std": float(r.std()),
        "exact": float((r == 1.0).float().mean()),
        "mismatches": mismatches,
        "compared": compared,
        "ratio_min": first_ratio[0],
        "ratio_max": first_ratio[1],
        "later_ratio_min": later_ratio[0] if args.mini_batches > 1 else None,
        "later_ratio_max": later_ratio[1] if args.mini_batches > 1 else None,
        "clipfrac": clipped / max(tokens, 1),
        "loss": sum(losses) / len(losses),
        "grad_norm": max(gnorms),
        "weight_version": version,
        "rollout_s": t_rollout,
        "step_s": time.perf_counter() - t0,
    }


def plot(records: Sequence[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    ax1.plot(steps, [r["reward_mean"] for r in records], marker="o", label="reward (mean)")
    ax1.plot(steps, [r["exact"] for r in records], marker=".", label="exact answers")
    ax1.set_ylabel("reward")
    ax1.legend()
    ax1.set_title("GRPO on a HF Qwen3 (lockstep rollout, lockstep.hf trainer)")
    mism = [r["mismatches"] for r in records]
    ax2.plot(steps, mism, marker="o", color="tab:red", label=f"{sum(mism)} in all")
    ax2.set_ylim(bottom=-0.5, top=max([1] + mism) + 0.5)
    ax2.legend()
    ax2.set_ylabel("log-prob mismatches")
    ax2.set_xlabel("GRPO step")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ---- the command line ---------------------------------------------------------------------------


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {v}")
        return v

    return parse


def _float_in(low: float, high: float, what: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not low < v < high:
            raise argparse.ArgumentTypeError(f"must be in {what}, got {v}")
        return v

    return parse


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="GRPO on a small HF Qwen3 (addition task) with lockstep's rollout engine; "
        "rollout and trainer log-probs compared bit for bit.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--steps", type=_int_at_least(1), default=30, help="GRPO steps")
    p.add_argument("--group-size", type=_int_at_least(2), default=8,
                   help="G: samples per prompt (a GRPO group; >= 2 for a group baseline)")
    p.add_argument("--prompts", type=_int_at_least(1), default=16, help="prompts per GRPO step")
    p.add_argument("--mini-batches", type=_int_at_least(1), default=2,
                   help="optimizer steps per GRPO step (each over whole groups)")
    p.add_argument("--warmup-steps", type=_int_at_least(0), default=60,
                   help="supervised warm-up steps before GRPO")
    p.add_argument("--warmup-batch", type=_int_at_least(1), default=64)
    p.add_argument("--task", choices=("add", "reverse"), default="reverse",
                   help="add: 'a+b=' -> the sum; reverse: 'word=' -> the word reversed")
    p.add_argument("--size", type=_int_at_least(3), default=None,
                   help="add: operands in [0, size] (default 9); reverse: words of 3 .. size "
                   "letters (default 5)")
    p.add_argument("--temperature", type=_float_in(0.0, math.inf, "(0, inf)"), default=1.0)
    p.add_argument("--lr", type=_float_in(0.0, 1.0, "(0, 1)"), default=5e-4, help="GRPO's AdamW lr")
    p.add_argument("--warmup-lr", type=_float_in(0.0, 1.0, "(0, 1)"), default=3e-3)
    p.add_argument("--clip", type=_float_in(0.0, 1.0, "(0, 1)"), default=0.2,
                   help="PPO clip range: ratio in [1 - clip, 1 + clip]")
    p.add_argument("--max-grad-norm", type=_float_in(0.0, math.inf, "(0, inf)"), default=1.0)
    p.add_argument("--rollout-tp", type=int, choices=(1, 2, 4), default=2,
                   help="the rollout engine's (simulated) tensor parallelism; the trainer's is 1")
    p.add_argument("--seed", type=_int_at_least(0), default=1)
    p.add_argument("--plot", metavar="FILE.png", help="write reward and mismatches per step")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per step on stdout (the table goes to stderr)")
    p.add_argument("--out", metavar="DIR", help="save the model and tokenizer at the end")
    args = p.parse_args(argv)
    if args.size is None:
        args.size = 9 if args.task == "add" else 5
    if args.mini_batches > args.prompts:
        p.error(f"--mini-batches {args.mini_batches} exceeds --prompts {args.prompts}: "
                "each mini-batch holds whole groups")
    if args.plot is not None and not args.plot.lower().endswith(".png"):
        p.error(f"--plot {args.plot!r}: expected a .png file name")
    if args.plot is not None:
        parent = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(parent):
            p.error(f"--plot {args.plot!r}: directory {parent} does not exist")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    rng = random.Random(args.seed)
    table = sys.stderr if args.json else sys.stdout

    def log(line: str) -> None:
        print(line, file=table, flush=True)

    corpus = [p + a for p, a in (make_problem(rng, args.task, args.size) for _ in range(2000))]
    tokenizer = train_tokenizer(corpus)
    model = make_model(tokenizer, args.seed)
    contract = lockstep.Contract(gemm_segments=4, kv_chunk=64, vocab_tile=256, vocab_segments=4)
    lockstep.hf.patch(model, contract=contract, tp=1)
    opt = torch.optim.AdamW(
        model.parameters(), lr=args.warmup_lr, betas=(0.9, 0.99), weight_decay=0.0
    )
    c = model.config
    log("grpo_hf: GRPO on a HF Qwen3, lockstep's rollout engine; log-probs compared bit for bit")
    log(f"  model     Qwen3ForCausalLM: V={c.vocab_size} (tokenizer trained on the fly) "
        f"H={c.hidden_size} I={c.intermediate_size} L={c.num_hidden_layers} "
        f"Hq={c.num_attention_heads} Hkv={c.num_key_value_heads} D={c.head_dim} tied, "
        f"{sum(p.numel() for p in model.parameters())} fp32 parameters")
    what = (f"a+b= with a, b in [0, {args.size}]" if args.task == "add"
            else f"reverse words of 3..{args.size} letters of {LETTERS!r}")
    log(f"  task      {what}; {args.steps} steps x "
        f"{args.prompts} prompts x G={args.group_size}, {args.mini_batches} mini-batches; "
        f"temperature {args.temperature:g}, seed {args.seed}")
    log(f"  rollout   lockstep.Engine tp={args.rollout_tp}; trainer lockstep.hf (patched HF "
        f"model) tp=1; {contract}")
    log(f"  adamw     lr={args.lr:g} (warm-up {args.warmup_lr:g}, {args.warmup_steps} steps of "
        f"{args.warmup_batch}) clip=[1-{args.clip:g}, 1+{args.clip:g}] "
        f"max_grad_norm={args.max_grad_norm:g}; {lockstep.num_threads()} threads")

    warm_up(model, opt, tokenizer, rng, args, log)
    for group in opt.param_groups:
        group["lr"] = args.lr
    engine = lockstep.Engine(
        model.state_dict(),
        config=lockstep.hf.hf_config_dict(model),
        contract=contract,
        tp=args.rollout_tp,
    )
    args.max_new_tokens = answer_len(args.task, args.size) + 1  # the longest answer + EOS

    log("")
    log(" step  reward     std  exact  mismatch/compared  ratio min/max (1st mb)   "
        "later mbs min/max      loss   gnorm  step s")
    records = []
    for step in range(args.steps):
        rec = grpo_step(step, model, opt, engine, tokenizer, rng, args)
        records.append(rec)
        later = (f"{rec['later_ratio_min']:.4f}/{rec['later_ratio_max']:.4f}"
                 if rec["later_ratio_min"] is not None else "-")
        log(f" {step:4d}  {rec['reward_mean']:.4f}  {rec['reward_std']:.4f}  {rec['exact']:.3f}  "
            f"{rec['mismatches']:8d}/{rec['compared']:<8d}  "
            f"{rec['ratio_min']:.6f}/{rec['ratio_max']:.6f}  {later:>17}  "
            f"{rec['loss']:8.4f}  {rec['grad_norm']:6.3f}  {rec['step_s']:6.2f}")
        if args.json:
            print(json.dumps(rec), flush=True)

    total = sum(r["mismatches"] for r in records)
    log("")
    k = min(5, len(records))
    first = sum(r["reward_mean"] for r in records[:k]) / k
    last = sum(r["reward_mean"] for r in records[-k:]) / k
    log(f"reward mean over the first {k} steps {first:.3f}, over the last {k} {last:.3f}")
    if args.plot:
        plot(records, args.plot)
        log(f"wrote {args.plot}")
    if args.out:
        model.save_pretrained(args.out)
        tokenizer.save_pretrained(args.out)
        log(f"wrote {args.out} (model.save_pretrained + tokenizer)")
    log(f"total {time.perf_counter() - t_start:.1f} s")
    if total:
        log(f"FAIL: {total} log-prob mismatches between rollout and trainer")
        return 1
    log(f"PASS: 0 log-prob mismatches between rollout and trainer over {len(records)} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
