"""Probe of the CUDA build's Python bindings (a segfault in _C.round_bf16 on the H200, 2026-12-02):
each call is printed before it runs, so the last line before a crash names it."""
import sys

import torch

from lockstep import _C


def step(name, fn):
    print("probe:", name, flush=True)
    fn()
    print("probe: ok", name, flush=True)


print("probe: torch", torch.__version__, flush=True)
src = torch.arange(8, dtype=torch.float32) / 3
dst = torch.empty(8, dtype=torch.bfloat16)
step("round_bf16 8 elements, stream 0", lambda: _C.round_bf16(src, dst, 0))
step("round_bf16 8 elements, default stream", lambda: _C.round_bf16(src, dst))
step("gemm 4x32x8", lambda: _C.gemm(torch.ones(4, 32, dtype=torch.bfloat16),
                                    torch.ones(8, 32, dtype=torch.bfloat16), None,
                                    torch.empty(4, 8), 1, 0))
step("gemm_dx", lambda: _C.gemm_dx(torch.ones(4, 8, dtype=torch.bfloat16),
                                   torch.ones(8, 32, dtype=torch.bfloat16), torch.empty(4, 32), 1, 0))
if _C.cuda_build and torch.cuda.is_available():
    cs, cd = src.cuda(), torch.empty(8, dtype=torch.bfloat16, device="cuda")
    step("round_bf16 on CUDA", lambda: _C.round_bf16(cs, cd, 0))
    torch.cuda.synchronize()
    print("probe: cuda dst", cd.float().tolist(), flush=True)
print("probe: dst", dst.float().tolist(), "want", src.to(torch.bfloat16).float().tolist())
sys.exit(0)
