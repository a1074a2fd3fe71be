"""lockstep vs Hugging Face transformers on a Qwen3 model with real Qwen3-0.6B dimensions.

Run on the GPU machine by scripts/hf_parity.sh (needs torch + transformers there and the
lockstep-score binary built here). Steps: build a Qwen3ForCausalLM with Qwen3-0.6B's config and
random weights (fixed seed), save it with save_pretrained (bf16 safetensors + config.json), score
random token sequences with lockstep (CPU, bit-exact contract) and with PyTorch in fp32 (weights
upcast from the same bf16 values) and in bf16, and compare the per-token log-probs and entropies.
Prints a table and writes hf_parity.json under $OUT.
"""
import json
import os
import subprocess
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

OUT = os.environ.get("OUT", "out")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCORE = os.path.join(ROOT, "build-gpu", "lockstep-score")
N_SEQ, SEQ_LEN, SEED = 4, 64, 0

os.makedirs(OUT, exist_ok=True)
model_dir = "/tmp/qwen3_0p6b_random"
cfg = Qwen3Config(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.05, rope_theta=1000000.0)
torch.manual_seed(SEED)
model = Qwen3ForCausalLM(cfg)
with torch.no_grad():  # non-trivial norm weights (HF initializes them to 1)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * torch.randn_like(p))
model = model.to(torch.bfloat16)
model.save_pretrained(model_dir, safe_serialization=True)
print("saved", model_dir, sorted(os.listdir(model_dir)), flush=True)

g = torch.Generator().manual_seed(SEED + 1)
tokens = torch.randint(0, cfg.vocab_size, (N_SEQ, SEQ_LEN), generator=g)
tok_path = os.path.join(OUT, "tokens.txt")
with open(tok_path, "w") as f:
    for row in tokens.tolist():
        f.write(" ".join(map(str, row)) + "\n")

t0 = time.time()
res = subprocess.run([SCORE, "--model", model_dir, "--tokens", tok_path, "--threads",
                      str(os.cpu_count())], capture_output=True, text=True)
print(res.stderr[-2000:], flush=True)
if res.returncode != 0:
    sys.exit("lockstep-score failed")
t_lockstep = time.time() - t0
ls_logp, ls_ent = [], []
for block in res.stdout.strip().split("\n\n"):
    rows = [list(map(float, line.split())) for line in block.strip().split("\n")]
    ls_logp.append([r[1] for r in rows])
    ls_ent.append([r[3] for r in rows])
ls_logp = torch.tensor(ls_logp, dtype=torch.float64)
ls_ent = torch.tensor(ls_ent, dtype=torch.float64)


def torch_scores(dtype):
    m = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda").to(dtype)
    m.eval()
    with torch.no_grad():
        logits = m(tokens.to("cuda")).logits.double()[:, :-1]
    lp = torch.log_softmax(logits, dim=-1)
    tgt = tokens[:, 1:].to("cuda")
    logp = lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1).cpu()
    ent = -(lp.exp() * lp).sum(-1).cpu()
    return logp, ent


fp32_logp, fp32_ent = torch_scores(torch.float32)
bf16_logp, bf16_ent = torch_scores(torch.bfloat16)


def stats(a, b):
    d = (a - b).abs()
    return {"max_abs": d.max().item(), "mean_abs": d.mean().item(),
            "rms_ref": b.pow(2).mean().sqrt().item()}


report = {
    "config": "Qwen3-0.6B dims (V=151936 H=1024 I=3072 L=28 Hq=16 Hkv=8 D=128, tied), random "
              "weights seed 0 (initializer_range 0.05, norm weights 1+0.2N), saved by "
              "transformers save_pretrained as bf16",
    "tokens": N_SEQ * (SEQ_LEN - 1),
    "lockstep_vs_torch_fp32_logp": stats(ls_logp, fp32_logp),
    "torch_bf16_vs_torch_fp32_logp": stats(bf16_logp, fp32_logp),
    "lockstep_vs_torch_fp32_entropy": stats(ls_ent, fp32_ent),
    "torch_bf16_vs_torch_fp32_entropy": stats(bf16_ent, fp32_ent),
    "lockstep_seconds_cpu": t_lockstep,
    "torch": torch.__version__,
}
import transformers  # noqa: E402

report["transformers"] = transformers.__version__
with open(os.path.join(OUT, "hf_parity.json"), "w") as f:
    json.dump(report, f, indent=1)
print(json.dumps(report, indent=1))
# Documented tolerance (docs/hf-parity.md): lockstep's bf16-storage forward may differ from the
# fp32 forward by no more than 2x what PyTorch's own bf16 forward does, plus 0.02.
tol = 2 * report["torch_bf16_vs_torch_fp32_logp"]["max_abs"] + 0.02
ok = report["lockstep_vs_torch_fp32_logp"]["max_abs"] <= tol
print(f"max |dlogp| lockstep vs fp32 = {report['lockstep_vs_torch_fp32_logp']['max_abs']:.4f}, "
      f"tolerance {tol:.4f}: {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
