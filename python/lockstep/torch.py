"""lockstep's ops as PyTorch custom ops (namespace ``lockstep``), with autograd.

Every op is a ``torch.library.custom_op`` with a fake (meta) implementation, so ``torch.compile``
traces it, and the differentiable ones register an autograd formula whose backward is the
library's deterministic backward op (docs/contract.md §B), itself a custom op. Tensors reach the
library through DLPack (``lockstep._C``): no torch C++ ABI, any recent torch.

Shapes (2-d, packed varlen: no batch dimension): T tokens, H hidden, K/N GEMM sizes, V vocab,
Hq/Hkv heads, D head_dim, B sequences (``cu_seqlens`` [B+1] int32 on the host, 0 = cu[0] <= ...
<= cu[B] = T).

Gradients (§B.0): the library's gradients are fp32; autograd hands each input a gradient of the
input's dtype, so a bf16 input gets the fp32 gradient rounded once by the library's rounding (RNE,
canonical NaN), inside the backward op: torch.compile cannot fuse that rounding away. The
incoming gradient of a bf16 output is bf16. Where autograd sums the gradients of an input used
twice, the sum is torch's bf16 addition; under torch.compile set
``torch._inductor.config.emulate_precision_casts = True`` to keep eager's bits there. Weight
gradients are one chain over the token blocks in the canonical order of (``cu_seqlens``,
``step_indices``) (B.1; without ``cu_seqlens`` all rows are one sequence), from +0 on each
backward call.

The lse outputs of ``attention_varlen`` and ``linear_logprob`` are non-differentiable (the
contract's backward takes no lse gradient): they come back with ``requires_grad=False``.
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from lockstep import _C
from lockstep.contract import Contract

__all__ = [
    "attention_varlen",
    "embedding",
    "linear",
    "linear_logprob",
    "linear_logprob_given",
    "rmsnorm",
    "rmsnorm_residual",
    "rope",
    "sample",
    "silu_mul",
]

_DEFAULT_CONTRACT = Contract()


def _arg(t: Tensor) -> Tensor:
    """The tensor as the bindings take it (DLPack refuses tensors that require grad)."""
    return t.detach()


def _opt(t: Optional[Tensor]) -> Optional[Tensor]:
    return None if t is None else t.detach()


def _host(t: Optional[Tensor]) -> Optional[Tensor]:
    """A metadata tensor (cu_seqlens, step_indices, per-row sampling settings) on the host, where
    the library reads it to plan the op: a CUDA one is copied (one synchronizing copy)."""
    return None if t is None else t.detach().cpu()


# The last CUDA index tensors found in range: (weak reference, version counter, bound, ignore).
# The same tensor object at the same version holds the same values (in-place writes, also through
# a view, bump the version), so a model's positions, checked by its first layer's RoPE, are not
# synchronized on again by every other layer.
_RANGE_CHECKED: list = []


def _check_range(op: str, name: str, t: Tensor, bound: int, ignore: Optional[int] = None) -> None:
    """Ids / positions / targets of a CUDA call in [0, bound) (or == ignore): the CPU ops check
    them, the CUDA kernels cannot before the launch (they write NaN rows), so the torch layer
    checks here, at the cost of one synchronizing reduction (once per tensor and version), and
    raises lockstep.Error."""
    if not t.is_cuda or t.numel() == 0:
        return
    for ref, version, b, ig in _RANGE_CHECKED:
        if ref() is t and version == t._version and b == bound and ig == ignore:
            return
    bad = (t < 0) | (t >= bound)
    if ignore is not None:
        bad &= t != ignore
    if bool(bad.any()):
        first = int(bad.nonzero()[0, 0])
        raise _C.Error(
            f"{op}: argument '{name}' has {name}[{first}] = {int(t[first])} outside [0, {bound})"
        )
    _RANGE_CHECKED.insert(0, (weakref.ref(t), t._version, bound, ignore))
    del _RANGE_CHECKED[4:]


def _stream(t: Tensor) -> int:
    """torch's current CUDA stream for a CUDA tensor (the op runs on it), else 0."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _size(t: Tensor, dim: int) -> int:
    """t.shape[dim], or 0 where t lacks the dimension (the library then names the bad shape)."""
    return t.shape[dim] if -t.dim() <= dim < t.dim() else 0


def _grad(g: Optional[Tensor], like: Tensor) -> Tensor:
    """An incoming gradient as a contiguous fp32 tensor (zeros for None)."""
    if g is None:
        return torch.zeros(like.shape, dtype=torch.float32, device=like.device)
    return g.to(torch.float32).contiguous()


def _rounded(t: Tensor, dtype: torch.dtype) -> Tensor:
    """An fp32 result of the library as `dtype`: bf16 by the library's rounding (RNE, canonical
    NaN; B.0). Called inside the ops, so torch.compile cannot fuse the rounding away."""
    if dtype == torch.float32 or t.dtype != torch.float32:
        return t
    out = torch.empty(t.shape, dtype=dtype, device=t.device)
    _C.round_bf16(_arg(t).contiguous(), out, _stream(t))
    return out


def _contract_c(gemm_segments: int, kv_chunk: int, vocab_tile: int, vocab_segments: int):
    return _C.ContractConfig(gemm_segments, kv_chunk, vocab_tile, vocab_segments)


def _contract_args(contract: Optional[Contract]) -> Tuple[int, int, int, int]:
    c = _DEFAULT_CONTRACT if contract is None else contract
    if not isinstance(c, Contract):
        raise ValueError(f"contract must be a lockstep.Contract, got {type(c).__name__}")
    return c.gemm_segments, c.kv_chunk, c.vocab_tile, c.vocab_segments


def _rows_out(x: Tensor, n: int, dtype: torch.dtype) -> Tensor:
    return x.new_empty((_size(x, 0), n), dtype=dtype)


# ---- linear: the GEMM contract (§G); backward §B.3 ----------------------------------------------
# Backward-only arguments (dx_segments, the token order) are part of the forward op's schema so
# that setup_context can keep them.


@torch.library.custom_op("lockstep::linear", mutates_args=())
def _linear(
    x: Tensor,
    w: Tensor,
    bias: Optional[Tensor],
    segments: int,
    out_f32: bool,
    dx_segments: int,
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tensor:
    y = _rows_out(x, _size(w, 0), torch.float32 if out_f32 else torch.bfloat16)
    _C.gemm(_arg(x), _arg(w), _opt(bias), y, segments, _stream(x))
    return y


@_linear.register_fake
def _(x, w, bias, segments, out_f32, dx_segments, cu_seqlens, step_indices):
    return _rows_out(x, _size(w, 0), torch.float32 if out_f32 else torch.bfloat16)


@torch.library.custom_op("lockstep::linear_backward", mutates_args=())
def _linear_backward(
    gy: Tensor,
    x: Tensor,
    w: Tensor,
    dx_segments: int,
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """dy = round_bf16(gy) (B.0); dx [T, K] = dy·w (dx_segments N segments) in x's dtype; dw
    [N, K] = dyᵀ·x from +0, fp32 rounded once to w's dtype."""
    dy = _rounded(gy.contiguous(), torch.bfloat16)
    dx = x.new_empty(x.shape)
    dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    _C.gemm_dx(_arg(dy), _arg(w), dx, dx_segments, _stream(dy))
    _C.gemm_dw(_arg(dy), _arg(x), dw, _host(cu_seqlens), _host(step_indices), _stream(dy))
    return dx, _rounded(dw, w.dtype)


@_linear_backward.register_fake
def _(gy, x, w, dx_segments, cu_seqlens, step_indices):
    return x.new_empty(x.shape), w.new_empty(w.shape)


def _linear_setup(ctx, inputs, output):
    x, w, bias, _, _, dx_segments, cu_seqlens, step_indices = inputs
    ctx.save_for_backward(x, w, cu_seqlens, step_indices)
    ctx.bias_needs_grad = bias is not None and bias.requires_grad
    ctx.dx_segments = dx_segments


def _linear_bwd(ctx, gy):
    x, w, cu_seqlens, step_indices = ctx.saved_tensors
    if ctx.bias_needs_grad:
        raise RuntimeError("lockstep.linear: the contract has no bias gradient (§B.3)")
    dx, dw = torch.ops.lockstep.linear_backward(gy, x, w, ctx.dx_segments, cu_seqlens, step_indices)
    return dx, dw, None, None, None, None, None, None


_linear.register_autograd(_linear_bwd, setup_context=_linear_setup)


def linear(
    x: Tensor,
    w: Tensor,
    bias: Optional[Tensor] = None,
    *,
    contract: Optional[Contract] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    role: str = "row",
    dx_segments: int = 1,
    cu_seqlens: Optional[Tensor] = None,
    step_indices: Optional[Tensor] = None,
) -> Tensor:
    """y = x·wᵀ (+ bias) by the GEMM contract: K in the segments the layer's ``role`` takes.

    ``role`` (contract 0.3, §G.5): ``"row"`` — a row-parallel layer (o_proj, down_proj), K in
    ``contract.gemm_segments`` segments; ``"column"`` — a column-parallel layer (q|k|v, gate|up)
    or an lm_head, K in one segment whatever ``gemm_segments`` is.

    x [T, K], w [N, K] bf16; bias [N] bf16/f32 (no gradient); y [T, N] ``out_dtype`` (bf16 or
    f32). Backward (§B.3): dx = round_bf16(gy)·w over N in ``dx_segments`` equal segments (§G's
    K layout applied to N), dw in the token order of (``cu_seqlens``, ``step_indices``). A
    row-parallel layer (o_proj, down) uses 1 segment. A column-parallel layer uses the TP = S
    shards of B.2 as its segments: for one projection whose N/S is a multiple of 16 those are the
    equal cuts (``dx_segments`` = S); fused q|k|v or gate|up shards are not, and need the
    per-shard form (not in this module yet).
    """
    if out_dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"lockstep.linear: out_dtype must be bfloat16 or float32, got {out_dtype}")
    if role not in ("row", "column"):
        raise ValueError(f"lockstep.linear: role must be 'row' or 'column', got {role!r}")
    segments = _contract_args(contract)[0] if role == "row" else 1
    return _linear(
        x, w, bias, segments, out_dtype == torch.float32, dx_segments, cu_seqlens, step_indices
    )


# ---- RMSNorm (§E), with the fused residual add; backward §B.4 -----------------------------------


@torch.library.custom_op("lockstep::rmsnorm", mutates_args=())
def _rmsnorm(
    x: Tensor,
    weight: Tensor,
    eps: float,
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tensor:
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    _C.rmsnorm(_arg(x), _arg(weight), y, eps, _stream(x))
    return y


@_rmsnorm.register_fake
def _(x, weight, eps, cu_seqlens, step_indices):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("lockstep::rmsnorm_backward", mutates_args=())
def _rmsnorm_backward(
    gy: Tensor,
    s: Tensor,
    weight: Tensor,
    eps: float,
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """dx (s's shape and dtype) and dweight ([last dim], from +0, weight's dtype), each the fp32
    result rounded once."""
    dx = s.new_empty(s.shape, dtype=torch.float32)
    dweight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    _C.rmsnorm_backward(
        _arg(s),
        _arg(weight),
        _arg(gy),
        dx,
        dweight,
        _host(cu_seqlens),
        _host(step_indices),
        eps,
        _stream(s),
    )
    return _rounded(dx, s.dtype), _rounded(dweight, weight.dtype)


@_rmsnorm_backward.register_fake
def _(gy, s, weight, eps, cu_seqlens, step_indices):
    return s.new_empty(s.shape), weight.new_empty(weight.shape)


def _rmsnorm_setup(ctx, inputs, output):
    x, weight, eps, cu_seqlens, step_indices = inputs
    ctx.save_for_backward(x, weight, cu_seqlens, step_indices)
    ctx.eps = eps


def _rmsnorm_bwd(ctx, gy):
    x, weight, cu_seqlens, step_indices = ctx.saved_tensors
    dx, dweight = torch.ops.lockstep.rmsnorm_backward(
        _grad(gy, x), x, weight, ctx.eps, cu_seqlens, step_indices
    )
    return dx, dweight, None, None, None


_rmsnorm.register_autograd(_rmsnorm_bwd, setup_context=_rmsnorm_setup)


def rmsnorm(
    x: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    *,
    cu_seqlens: Optional[Tensor] = None,
    step_indices: Optional[Tensor] = None,
) -> Tensor:
    """y = rmsnorm(x)·weight over the last dimension (§E). x [T, H] or [T, heads, D] bf16,
    weight [last dim] bf16. ``eps`` is rounded to fp32 (the model config's rms_norm_eps)."""
    return _rmsnorm(x, weight, eps, cu_seqlens, step_indices)


@torch.library.custom_op("lockstep::rmsnorm_residual", mutates_args=())
def _rmsnorm_residual(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float,
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _C.rmsnorm_residual(_arg(x), _arg(residual), _arg(weight), residual_out, y, eps, _stream(x))
    return y, residual_out


@_rmsnorm_residual.register_fake
def _(x, residual, weight, eps, cu_seqlens, step_indices):
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        torch.empty_like(x, memory_format=torch.contiguous_format),
    )


@torch.library.custom_op("lockstep::rmsnorm_residual_backward", mutates_args=())
def _rmsnorm_residual_backward(
    gy: Tensor,
    gres: Tensor,
    s: Tensor,
    weight: Tensor,
    eps: float,
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """ds = gres + dnorm (s's shape and dtype: the gradient of x and of residual) and dweight
    (weight's dtype), each the fp32 result rounded once."""
    ds = s.new_empty(s.shape, dtype=torch.float32)
    dweight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    _C.rmsnorm_residual_backward(
        _arg(s),
        _arg(weight),
        _arg(gy),
        _arg(gres),
        ds,
        dweight,
        _host(cu_seqlens),
        _host(step_indices),
        eps,
        _stream(s),
    )
    return _rounded(ds, s.dtype), _rounded(dweight, weight.dtype)


@_rmsnorm_residual_backward.register_fake
def _(gy, gres, s, weight, eps, cu_seqlens, step_indices):
    return s.new_empty(s.shape), weight.new_empty(weight.shape)


def _rmsnorm_residual_setup(ctx, inputs, output):
    x, residual, weight, eps, cu_seqlens, step_indices = inputs
    ctx.save_for_backward(output[1], weight, cu_seqlens, step_indices)
    ctx.eps = eps


def _rmsnorm_residual_bwd(ctx, gy, gres):
    s, weight, cu_seqlens, step_indices = ctx.saved_tensors
    ds, dweight = torch.ops.lockstep.rmsnorm_residual_backward(
        _grad(gy, s), _grad(gres, s), s, weight, ctx.eps, cu_seqlens, step_indices
    )
    # x and residual are bf16 like s (the op's contract): both get ds.
    return ds, ds, dweight, None, None, None


_rmsnorm_residual.register_autograd(_rmsnorm_residual_bwd, setup_context=_rmsnorm_residual_setup)


def rmsnorm_residual(
    x: Tensor,
    residual: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    *,
    cu_seqlens: Optional[Tensor] = None,
    step_indices: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """(y, residual_out): residual_out = bf16(x + residual), y = rmsnorm(residual_out)·weight
    (the HF decoder layer's add then norm, §E). Backward §B.4: x and residual both get
    gres + dnorm."""
    return _rmsnorm_residual(x, residual, weight, eps, cu_seqlens, step_indices)


# ---- RoPE (§E); backward §B.5 -------------------------------------------------------------------


@torch.library.custom_op("lockstep::rope", mutates_args=())
def _rope(x: Tensor, positions: Tensor, theta: float, max_positions: int) -> Tensor:
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    _check_range("rope", "positions", positions, max_positions)
    _C.rope(_arg(x), _arg(positions), y, theta, max_positions, _stream(x))
    return y


@_rope.register_fake
def _(x, positions, theta, max_positions):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("lockstep::rope_backward", mutates_args=())
def _rope_backward(
    gy: Tensor, positions: Tensor, theta: float, max_positions: int, dtype: torch.dtype
) -> Tensor:
    """dx [T, heads, D] from gy [T, heads, D] f32: the fp32 result rounded once to `dtype`."""
    dx = torch.empty_like(gy, dtype=torch.float32, memory_format=torch.contiguous_format)
    _C.rope_backward(_arg(gy), _arg(positions), dx, theta, max_positions, _stream(gy))
    return _rounded(dx, dtype)


@_rope_backward.register_fake
def _(gy, positions, theta, max_positions, dtype):
    return torch.empty_like(gy, dtype=dtype, memory_format=torch.contiguous_format)


def _rope_setup(ctx, inputs, output):
    x, positions, theta, max_positions = inputs
    ctx.save_for_backward(positions)
    ctx.args = (theta, max_positions, x.dtype)


def _rope_bwd(ctx, gy):
    (positions,) = ctx.saved_tensors
    theta, max_positions, dtype = ctx.args
    dx = torch.ops.lockstep.rope_backward(_grad(gy, gy), positions, theta, max_positions, dtype)
    return dx, None, None, None


_rope.register_autograd(_rope_bwd, setup_context=_rope_setup)


def rope(x: Tensor, positions: Tensor, theta: float = 1e6, max_positions: int = 40960) -> Tensor:
    """y = rope(x) (HF rotate_half) at each token's position (§E). x [T, heads, D] bf16,
    positions [T] int32/int64 in [0, max_positions). The cos/sin table of (D, theta,
    max_positions) is built once per process."""
    return _rope(x, positions, theta, max_positions)


# ---- SiLU-and-mul (§E); backward §B.6 -----------------------------------------------------------


@torch.library.custom_op("lockstep::silu_mul", mutates_args=())
def _silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    out = torch.empty_like(gate, memory_format=torch.contiguous_format)
    _C.silu_mul(_arg(gate), _arg(up), out, _stream(gate))
    return out


@_silu_mul.register_fake
def _(gate, up):
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


@torch.library.custom_op("lockstep::silu_mul_backward", mutates_args=())
def _silu_mul_backward(ga: Tensor, gate_up: Tensor) -> Tensor:
    """dgu [T, 2I] (dgate columns, then dup columns; gate_up's dtype, the fp32 result rounded
    once) from gate_up [T, 2I] bf16 and ga [T, I] f32."""
    dgu = gate_up.new_empty(gate_up.shape, dtype=torch.float32)
    _C.silu_mul_backward(_arg(gate_up), _arg(ga), dgu, _stream(gate_up))
    return _rounded(dgu, gate_up.dtype)


@_silu_mul_backward.register_fake
def _(ga, gate_up):
    return gate_up.new_empty(gate_up.shape)


def _silu_mul_setup(ctx, inputs, output):
    gate, up = inputs
    ctx.save_for_backward(gate, up)


def _silu_mul_bwd(ctx, ga):
    gate, up = ctx.saved_tensors
    gate_up = torch.cat([gate, up], dim=-1)  # the forward's fused layout (§E.3), an exact copy
    dgu = torch.ops.lockstep.silu_mul_backward(_grad(ga, gate), gate_up)
    i = gate.shape[-1]
    return dgu[..., :i], dgu[..., i:]


_silu_mul.register_autograd(_silu_mul_bwd, setup_context=_silu_mul_setup)


def silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    """out = bf16(silu(gate)·up) (§E). gate, up [T, I] bf16."""
    return _silu_mul(gate, up)


# ---- Embedding (§E); backward §B.7 --------------------------------------------------------------


@torch.library.custom_op("lockstep::embedding", mutates_args=())
def _embedding(
    ids: Tensor, table: Tensor, cu_seqlens: Optional[Tensor], step_indices: Optional[Tensor]
) -> Tensor:
    out = _rows_out(ids, _size(table, 1), table.dtype)
    _check_range("embedding", "ids", ids, _size(table, 0))
    _C.embedding(_arg(ids), _arg(table), out, _stream(table))
    return out


@_embedding.register_fake
def _(ids, table, cu_seqlens, step_indices):
    return _rows_out(ids, _size(table, 1), table.dtype)


@torch.library.custom_op("lockstep::embedding_backward", mutates_args=())
def _embedding_backward(
    gh: Tensor,
    ids: Tensor,
    vocab: int,
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
    dtype: torch.dtype,
) -> Tensor:
    """dtable [vocab, H]: the gh rows added by id, tokens in canonical order, from +0 (fp32,
    rounded once to `dtype`)."""
    dtable = torch.zeros((vocab, _size(gh, 1)), dtype=torch.float32, device=gh.device)
    _C.embedding_backward(
        _arg(ids), _arg(gh), dtable, _host(cu_seqlens), _host(step_indices), _stream(gh)
    )
    return _rounded(dtable, dtype)


@_embedding_backward.register_fake
def _(gh, ids, vocab, cu_seqlens, step_indices, dtype):
    return gh.new_empty((vocab, _size(gh, 1)), dtype=dtype)


def _embedding_setup(ctx, inputs, output):
    ids, table, cu_seqlens, step_indices = inputs
    ctx.save_for_backward(ids, cu_seqlens, step_indices)
    ctx.table = (table.shape[0], table.dtype)


def _embedding_bwd(ctx, gh):
    ids, cu_seqlens, step_indices = ctx.saved_tensors
    vocab, dtype = ctx.table
    dtable = torch.ops.lockstep.embedding_backward(
        _grad(gh, gh), ids, vocab, cu_seqlens, step_indices, dtype
    )
    return None, dtable, None, None


_embedding.register_autograd(_embedding_bwd, setup_context=_embedding_setup)


def embedding(
    ids: Tensor,
    table: Tensor,
    *,
    cu_seqlens: Optional[Tensor] = None,
    step_indices: Optional[Tensor] = None,
) -> Tensor:
    """out[t] = table[ids[t]]. ids [T] int32/int64 in [0, V), table [V, H] bf16."""
    return _embedding(ids, table, cu_seqlens, step_indices)


# ---- Packed varlen causal attention (§A); backward §B.9 -----------------------------------------


@torch.library.custom_op("lockstep::attention_varlen", mutates_args=())
def _attention_varlen(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, kv_chunk: int, softmax_scale: float
) -> Tuple[Tensor, Tensor]:
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = q.new_empty((_size(q, 0), _size(q, 1)), dtype=torch.float32)
    _C.attention_varlen(
        _arg(q),
        _arg(k),
        _arg(v),
        _host(cu_seqlens),
        out,
        lse,
        kv_chunk,
        softmax_scale,
        _stream(q),
    )
    return out, lse


@_attention_varlen.register_fake
def _(q, k, v, cu_seqlens, kv_chunk, softmax_scale):
    return (
        torch.empty_like(q, memory_format=torch.contiguous_format),
        q.new_empty((_size(q, 0), _size(q, 1)), dtype=torch.float32),
    )


@torch.library.custom_op("lockstep::attention_varlen_backward", mutates_args=())
def _attention_varlen_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens: Tensor,
    kv_chunk: int,
    softmax_scale: float,
) -> Tuple[Tensor, Tensor, Tensor]:
    """dq [T, Hq, D], dk, dv [T, Hkv, D] (q's, k's, v's dtypes: the fp32 results rounded once)
    from dout [T, Hq, D] bf16 and the forward's lse."""
    dq = q.new_empty(q.shape, dtype=torch.float32)
    dk = k.new_empty(k.shape, dtype=torch.float32)
    dv = v.new_empty(v.shape, dtype=torch.float32)
    _C.attention_backward_varlen(
        _arg(q),
        _arg(k),
        _arg(v),
        _arg(out),
        _arg(lse),
        _arg(dout),
        _host(cu_seqlens),
        dq,
        dk,
        dv,
        kv_chunk,
        softmax_scale,
        _stream(q),
    )
    return _rounded(dq, q.dtype), _rounded(dk, k.dtype), _rounded(dv, v.dtype)


@_attention_varlen_backward.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens, kv_chunk, softmax_scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup(ctx, inputs, output):
    q, k, v, cu_seqlens, kv_chunk, softmax_scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
    ctx.mark_non_differentiable(lse)
    ctx.args = (kv_chunk, softmax_scale)


def _attention_bwd(ctx, gout, glse):
    q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = torch.ops.lockstep.attention_varlen_backward(
        _rounded(gout.contiguous(), torch.bfloat16), q, k, v, out, lse, cu_seqlens, *ctx.args
    )
    return dq, dk, dv, None, None, None


_attention_varlen.register_autograd(_attention_bwd, setup_context=_attention_setup)


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    *,
    contract: Optional[Contract] = None,
    softmax_scale: float = 0.0,
) -> Tuple[Tensor, Tensor]:
    """(out, lse): packed varlen causal GQA attention (§A). q [T, Hq, D], k, v [T, Hkv, D] bf16;
    cu_seqlens [B+1] int32 on the host; out [T, Hq, D] bf16, lse [T, Hq] f32 (natural log, no
    gradient). ``softmax_scale`` 0 means 1/sqrt(D); KV chunks of ``contract.kv_chunk`` keys."""
    kv_chunk = _contract_args(contract)[1]
    return _attention_varlen(q, k, v, cu_seqlens, kv_chunk, softmax_scale)


# ---- Linear log-prob (§L); backward §B.8 --------------------------------------------------------


@torch.library.custom_op("lockstep::linear_logprob", mutates_args=())
def _linear_logprob(
    h: Tensor,
    w: Tensor,
    targets: Tensor,
    temperature: float,
    ignore_index: int,
    contract: Sequence[int],
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tuple[Tensor, Tensor, Tensor]:
    t = _size(h, 0)
    logp, lse, entropy = (h.new_empty((t,), dtype=torch.float32) for _ in range(3))
    _check_range("linear_logprob", "targets", targets, _size(w, 0), ignore_index)
    _C.linear_logprob(
        _arg(h),
        _arg(w),
        _arg(targets),
        logp,
        lse,
        entropy,
        temperature,
        ignore_index,
        _contract_c(*contract),
        _stream(h),
    )
    return logp, lse, entropy


@_linear_logprob.register_fake
def _(h, w, targets, temperature, ignore_index, contract, cu_seqlens, step_indices):
    return tuple(h.new_empty((_size(h, 0),), dtype=torch.float32) for _ in range(3))


@torch.library.custom_op("lockstep::linear_logprob_backward", mutates_args=())
def _linear_logprob_backward(
    g_lp: Tensor,
    g_ent: Optional[Tensor],
    h: Tensor,
    w: Tensor,
    targets: Tensor,
    lse: Tensor,
    entropy: Tensor,
    temperature: float,
    ignore_index: int,
    contract: Sequence[int],
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """dh [T, H] and dw [V, H] (from +0), in h's and w's dtypes (the fp32 results rounded once),
    from g_lp [T] f32 and g_ent [T] f32 or None."""
    dh = h.new_empty(h.shape, dtype=torch.float32)
    dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    _C.linear_logprob_backward(
        _arg(h),
        _arg(w),
        _arg(targets),
        _arg(lse),
        _arg(entropy),
        _arg(g_lp),
        _opt(g_ent),
        dh,
        dw,
        temperature,
        ignore_index,
        _contract_c(*contract),
        _host(cu_seqlens),
        _host(step_indices),
        _stream(h),
    )
    return _rounded(dh, h.dtype), _rounded(dw, w.dtype)


@_linear_logprob_backward.register_fake
def _(
    g_lp,
    g_ent,
    h,
    w,
    targets,
    lse,
    entropy,
    temperature,
    ignore_index,
    contract,
    cu_seqlens,
    step_indices,
):
    return h.new_empty(h.shape), w.new_empty(w.shape)


def _linear_logprob_setup(ctx, inputs, output):
    h, w, targets, temperature, ignore_index, contract, cu_seqlens, step_indices = inputs
    _, lse, entropy = output
    ctx.save_for_backward(h, w, targets, lse, entropy, cu_seqlens, step_indices)
    ctx.mark_non_differentiable(lse)
    # An unused entropy gets g_ent = None (the op's "no entropy gradient"), not zeros.
    ctx.set_materialize_grads(False)
    ctx.args = (temperature, ignore_index, list(contract))


def _linear_logprob_bwd(ctx, g_lp, g_lse, g_ent):
    h, w, targets, lse, entropy, cu_seqlens, step_indices = ctx.saved_tensors
    temperature, ignore_index, contract = ctx.args
    g_ent = None if g_ent is None else _grad(g_ent, lse)
    dh, dw = torch.ops.lockstep.linear_logprob_backward(
        _grad(g_lp, lse),
        g_ent,
        h,
        w,
        targets,
        lse,
        entropy,
        temperature,
        ignore_index,
        contract,
        cu_seqlens,
        step_indices,
    )
    return dh, dw, None, None, None, None, None, None


_linear_logprob.register_autograd(_linear_logprob_bwd, setup_context=_linear_logprob_setup)


def linear_logprob(
    h: Tensor,
    w: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    ignore_index: int = -1,
    contract: Optional[Contract] = None,
    cu_seqlens: Optional[Tensor] = None,
    step_indices: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
    """(logp, lse, entropy) of softmax(h·wᵀ / temperature) at each target, without a [T, V]
    buffer (§L). h [T, H], w [V, H] bf16; targets [T] int32/int64 in [0, V) or ignore_index
    (logp +0). lse has no gradient; logp and entropy do (§B.8)."""
    return _linear_logprob(
        h,
        w,
        targets,
        temperature,
        ignore_index,
        list(_contract_args(contract)),
        cu_seqlens,
        step_indices,
    )


def _bits_differ(a: Tensor, b: Tensor) -> Tensor:
    """Per element: the fp32 bit patterns differ."""
    return a.to(torch.float32).contiguous().view(torch.int32) != b.contiguous().view(torch.int32)


@torch.library.custom_op("lockstep::linear_logprob_given_backward", mutates_args=())
def _linear_logprob_given_backward(
    g_lp: Tensor,
    g_ent: Optional[Tensor],
    h: Tensor,
    w: Tensor,
    targets: Tensor,
    logp: Tensor,
    lse: Tensor,
    entropy: Tensor,
    temperature: float,
    ignore_index: int,
    contract: Sequence[int],
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """dh, dw of linear_logprob_given: the backward from the given lse / entropy that also
    recomputes the forward's logp / lse / entropy (§B.8 "The forward from the backward"), then
    checks the given values against them bit for bit (RuntimeError if one differs where the
    gradients depend on it)."""
    lse32, ent32 = lse.to(torch.float32).contiguous(), entropy.to(torch.float32).contiguous()
    dh = h.new_empty(h.shape, dtype=torch.float32)
    dw = torch.zeros(w.shape, dtype=torch.float32, device=w.device)
    t = _size(h, 0)
    logp_r, lse_r, ent_r = (h.new_empty((t,), dtype=torch.float32) for _ in range(3))
    _C.linear_logprob_backward_recompute(
        _arg(h),
        _arg(w),
        _arg(targets),
        _arg(lse32),
        _arg(ent32),
        _arg(g_lp),
        _opt(g_ent),
        dh,
        dw,
        logp_r,
        lse_r,
        ent_r,
        temperature,
        ignore_index,
        _contract_c(*contract),
        _host(cu_seqlens),
        _host(step_indices),
        _stream(h),
    )
    # The given values must be the trainer's own bits wherever the gradients depend on them: rows
    # with a target (logp, lse, entropy), and rows with an ignored target but an entropy gradient
    # (lse, entropy). Anywhere else G is +0 for any finite lse (§B.8).
    has_target = targets.to(torch.int64) != ignore_index
    used = has_target if g_ent is None else has_target | (g_ent != 0)
    bad = (_bits_differ(logp, logp_r) & has_target) | (
        (_bits_differ(lse32, lse_r) | _bits_differ(ent32, ent_r)) & used
    )
    n = int(bad.sum().item())
    if n:
        first = int(bad.nonzero()[0].item())
        raise RuntimeError(
            f"lockstep.torch.linear_logprob_given: {n} of the given head values (logp / lse / "
            f"entropy) differ from the trainer's, first at row {first} (given lse "
            f"{float(lse32[first])!r}, recomputed {float(lse_r[first])!r}): the gradients were "
            "taken at a wrong lse and are not returned. The given values must come from the same "
            "weights, inputs and contract (e.g. the rollout's on an on-policy step); otherwise "
            "use linear_logprob."
        )
    return _rounded(dh, h.dtype), _rounded(dw, w.dtype)


@_linear_logprob_given_backward.register_fake
def _(
    g_lp,
    g_ent,
    h,
    w,
    targets,
    logp,
    lse,
    entropy,
    temperature,
    ignore_index,
    contract,
    cu_seqlens,
    step_indices,
):
    return h.new_empty(h.shape), w.new_empty(w.shape)


@torch.library.custom_op("lockstep::linear_logprob_given", mutates_args=())
def _linear_logprob_given(
    h: Tensor,
    w: Tensor,
    targets: Tensor,
    logp: Tensor,
    lse: Tensor,
    entropy: Tensor,
    temperature: float,
    ignore_index: int,
    contract: Sequence[int],
    cu_seqlens: Optional[Tensor],
    step_indices: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """The given (logp, entropy) as the op's differentiable outputs: nothing is computed."""
    return logp.to(torch.float32).clone(), entropy.to(torch.float32).clone()


@_linear_logprob_given.register_fake
def _(h, w, targets, logp, lse, entropy, temperature, ignore_index, contract, cu_seqlens,
      step_indices):
    return logp.new_empty(logp.shape, dtype=torch.float32), entropy.new_empty(
        entropy.shape, dtype=torch.float32)


def _linear_logprob_given_setup(ctx, inputs, output):
    h, w, targets, logp, lse, entropy, temperature, ignore_index, contract, cu, steps = inputs
    ctx.save_for_backward(h, w, targets, logp, lse, entropy, cu, steps)
    ctx.set_materialize_grads(False)
    ctx.args = (temperature, ignore_index, list(contract))


def _linear_logprob_given_bwd(ctx, g_lp, g_ent):
    h, w, targets, logp, lse, entropy, cu_seqlens, step_indices = ctx.saved_tensors
    temperature, ignore_index, contract = ctx.args
    dh, dw = torch.ops.lockstep.linear_logprob_given_backward(
        _grad(g_lp, lse),
        None if g_ent is None else _grad(g_ent, lse),
        h,
        w,
        targets,
        logp,
        lse,
        entropy,
        temperature,
        ignore_index,
        contract,
        cu_seqlens,
        step_indices,
    )
    return dh, dw, None, None, None, None, None, None, None, None, None


_linear_logprob_given.register_autograd(
    _linear_logprob_given_bwd, setup_context=_linear_logprob_given_setup)


def linear_logprob_given(
    h: Tensor,
    w: Tensor,
    targets: Tensor,
    logp: Tensor,
    lse: Tensor,
    entropy: Tensor,
    *,
    temperature: float = 1.0,
    ignore_index: int = -1,
    contract: Optional[Contract] = None,
    cu_seqlens: Optional[Tensor] = None,
    step_indices: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    """linear_logprob's (logp, entropy) when its outputs are known already — on an on-policy step,
    the rollout's logp / lse / entropy [T] f32 of the same weights, which under the contract are
    the trainer's bit for bit. The forward computes nothing; the backward (dh, dw) recomputes the
    forward's values from the logits it forms anyway (on the GPU one pass over the vocabulary,
    §B.8 "The forward from the backward") and raises RuntimeError if any given value that the
    gradients depend on differs from them, bit for bit. Rows whose target is ignore_index may
    carry any finite lse and entropy 0 when their entropy gradient is 0. Gradients flow to h and
    w, as linear_logprob's."""
    return _linear_logprob_given(
        h,
        w,
        targets,
        logp,
        lse,
        entropy,
        temperature,
        ignore_index,
        list(_contract_args(contract)),
        cu_seqlens,
        step_indices,
    )


# ---- Sampling (§S): no gradient -----------------------------------------------------------------


@torch.library.custom_op("lockstep::sample", mutates_args=())
def _sample(
    h: Tensor,
    w: Tensor,
    request_ids: Tensor,
    positions: Tensor,
    seed: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    contract: Sequence[int],
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    t = _size(h, 0)
    token_ids = h.new_empty((t,), dtype=torch.int64)
    logp, lse, entropy = (h.new_empty((t,), dtype=torch.float32) for _ in range(3))
    _C.sample(
        _arg(h),
        _arg(w),
        _host(seed),
        _host(temperature),
        _host(top_k),
        _host(top_p),
        _host(min_p),
        _arg(request_ids),
        _arg(positions),
        token_ids,
        logp,
        lse,
        entropy,
        _contract_c(*contract),
        _stream(h),
    )
    return token_ids, logp, lse, entropy


@_sample.register_fake
def _(h, w, request_ids, positions, seed, temperature, top_k, top_p, min_p, contract):
    t = _size(h, 0)
    return (h.new_empty((t,), dtype=torch.int64),) + tuple(
        h.new_empty((t,), dtype=torch.float32) for _ in range(3)
    )


def _per_row(value: Union[int, float, Tensor], rows: int, dtype: torch.dtype) -> Tensor:
    if isinstance(value, Tensor):
        return value
    return torch.full((rows,), value, dtype=dtype)


def sample(
    h: Tensor,
    w: Tensor,
    request_ids: Tensor,
    positions: Tensor,
    *,
    seed: Union[int, Tensor] = 0,
    temperature: Union[float, Tensor] = 1.0,
    top_k: Union[int, Tensor] = 0,
    top_p: Union[float, Tensor] = 1.0,
    min_p: Union[float, Tensor] = 0.0,
    contract: Optional[Contract] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(token_ids int64, logp, lse, entropy): one sample per row (§S: the filters, then the
    inverse CDF of exact integer masses at one Philox uniform per row). h [T, H], w [V, H] bf16;
    request_ids [T] int64 and positions [T] int32/int64 count the Philox uniform.
    Settings are scalars or per-row [T] host tensors (seed int64, the uint64 bit pattern;
    temperature float32, 0 = greedy; top_k int64; top_p, min_p float32). logp / lse / entropy are
    linear_logprob's values for the sampled ids (no gradient)."""
    rows = _size(h, 0)
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 2**63:
        seed -= 2**64  # the uint64 seed's bit pattern as an int64
    # No gradient flows through sampling: the inputs are taken detached.
    return _sample(
        h.detach(),
        w.detach(),
        request_ids,
        positions,
        _per_row(seed, rows, torch.int64),
        _per_row(temperature, rows, torch.float32),
        _per_row(top_k, rows, torch.int64),
        _per_row(top_p, rows, torch.float32),
        _per_row(min_p, rows, torch.float32),
        list(_contract_args(contract)),
    )
