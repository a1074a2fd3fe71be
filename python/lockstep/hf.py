"""``lockstep.hf``: a Hugging Face ``Qwen3ForCausalLM`` running on lockstep's ops (issue 14).

API (stable; examples/grpo_hf.py is written against it)::

    import lockstep, lockstep.hf
    model = transformers.Qwen3ForCausalLM(cfg)            # or .from_pretrained(...)
    lockstep.hf.patch(model, contract=lockstep.Contract(), tp=1)   # in place; returns model

    # Packed varlen sequences: ids [T] (or [1, T]) with cu_seqlens [B+1] int32 on the host, or
    # HF's padding-free position_ids [1, T] (a sequence starts where position_ids == 0).
    logp, ent = lockstep.hf.logprobs(model, ids, targets, cu_seqlens=cu, temperature=1.0,
                                     ignore_index=-100, entropy=True, step_indices=None)
    loss = -(adv * logp).sum()        # logp, ent: [T] f32 with autograd; never a [T, V] buffer
    loss.backward()                   # param.grad: the contract backward's fp32 gradient

    out = model(input_ids=ids, position_ids=pos)   # CausalLMOutputWithPast, logits [1, T, V] f32

    # Accumulate mode (Megatron's main_grad): micro-batches continue ONE fp32 chain per weight.
    acc = lockstep.hf.GradAccumulator(model)   # p.main_grad = +0 (f32); p.grad stays None
    for mb in micro_batches:                   # in step order: step_indices ascending across
        logp, ent = lockstep.hf.logprobs(model, ..., step_indices=mb.step_indices)
        loss(logp, ent).backward()             # adds into p.main_grad (B.1); out of order: raises
    grads = acc.finish()                       # tied embeddings combined once (B.7); {name: f32}
    acc.reset()                                # +0 and a fresh order for the next step
    acc.remove()                               # back to plain autograd gradients

targets[t] is the token whose log-prob row t gives (usually ids[t + 1] inside a sequence and
``ignore_index`` (< 0) at each sequence's last row); an ignored row's logp is +0 with no
log-prob gradient; its entropy is still computed (and differentiated: mask it in the loss).
step_indices [B] (default 0 .. B-1): each packed sequence's place in the training step's
canonical order (B.1); weight gradients reduce over tokens in that order.

What is bitwise (tested in tests/python/test_hf.py):
  * ``logprobs`` == ``lockstep.Engine(state_dict, config=<the HF config>).score(...)`` ==
    the rollout's recorded log-probs (``Engine.generate``), for fp32 (master) or bf16 weights:
    an fp32 weight is rounded to bf16 once (RNE, Engine.update_weights' rounding) with a
    straight-through gradient. A token's bits do not depend on what else is packed with it.
  * the gradients of ``Σ g_lp·logp + g_ent·entropy`` == the C++ model backward
    (engine::Backprop, §B.10) bit for bit: fp32 parameters get its fp32 gradients exactly;
    bf16 parameters get them rounded once (RNE; a tied bf16 embedding's two parts, lm_head and
    embedding, are first combined in fp32 by the library's two-leaf tree, B.7; a tied fp32
    embedding's by autograd's fp32 add, the same bits but for a NaN's payload).
  * accumulate mode == the C++ backward over the same micro-batches in the same order ==
    one micro-batch holding them all.
What is not: the ``logits`` of ``model(...)`` are lockstep's GEMM (one K segment) of the final
hidden states and round_bf16(lm_head.weight), fp32, but log-softmax of them in torch is not the
contract's log-prob (use ``logprobs``), and gradients through ``logits`` are torch's. In plain
mode every backward call's dW starts from +0 and autograd adds calls' results with torch's fp32
add: not B.1's one chain (the accumulate mode is).

How: ``patch`` replaces ``model.forward`` and ``model.model.forward`` (the submodules' forwards
and hooks are not called; their parameters are used, so optimizers, state dicts and
``save_pretrained`` work unchanged). The forward is engine ``Model::forward_packed`` op by op
(src/engine/model.cc: fused q|k|v and gate|up GEMMs of one K segment (contract 0.3), per-head
q/k RMSNorm, the RoPE table of (head_dim, rope_theta, max_position_embeddings), varlen attention
in ``kv_chunk`` chunks, the residual add fused into the next RMSNorm, the final norm fused with
the last add, the §L head), as one custom op per decoder layer (``lockstep_hf::layer``), one for
the embedding and one for the final norm + head; each op's backward is
``engine::Backprop::backward``'s steps for that part by the ``_C`` backward ops (column-parallel
dX in B.2's TP = S shard form, combined over ``tp`` ranks by the tree). Between the ops the
residual stream and its gradient are fp32 tensors holding bf16 values, so autograd never rounds
a gradient the C++ backward keeps in fp32 (B.0). Memory: the ops keep the same bf16 activations
as the C++ ``SavedForward`` (per token and layer 2·(4H + 3·Hq·D + 3·Hkv·D + 3I) + 4·Hq bytes:
44 KiB for Qwen3-0.6B, 1.2 MiB over its 28 layers); the fp32 stream only adds 2 · 4H bytes per
token of transient tensors between two layers (not kept for the backward). fp32 weights are
rounded to bf16 on every op call (forward and backward): no bf16 copy is kept. A tied bf16
embedding is used as two fp32 copies (``lockstep_hf::tie``): the head keeps one for the
backward (4·V·H bytes while the graph lives).

Devices: the model's parameters on the CPU or on one CUDA device (``model.cuda()``); the ops then
run the library's CUDA kernels on that device, with the CPU's bits. input_ids / targets /
position_ids may be on either; cu_seqlens and step_indices are host tensors (a CUDA one is
copied). On CUDA the ops run on the legacy default stream: under another current torch stream
they raise lockstep.Error.
Accumulate mode runs eagerly (inside a torch.compile'd function its ops run uncompiled).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from lockstep import _C
from lockstep._C import Error
from lockstep.contract import Contract

__all__ = ["GradAccumulator", "logprobs", "patch", "packed_cu_seqlens", "hf_config_dict"]

# The weights of one decoder layer, in the order the layer ops take them.
_LAYER_WEIGHTS = (
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)
_IN, _Q, _K, _V, _QN, _KN, _O, _POST, _GATE, _UP, _DOWN = range(len(_LAYER_WEIGHTS))

# dims: the model's shape and contract as the ops' int list (custom op schemas take plain values).
_D_HQ, _D_HKV, _D_HD, _D_S, _D_KV, _D_VT, _D_VS, _D_TP, _D_MAXPOS = range(9)


# ---- small helpers (inside the ops: plain tensors, no autograd) --------------------------------


def _runs_on(arg: str):
    """An op body whose factory calls (torch.empty, torch.zeros, ...) make tensors on the device
    of its argument `arg`: the CPU, or a CUDA device whose legacy default stream (where the _C
    calls here run: they pass no stream) must be torch's current stream."""

    def wrap(fn):
        at = list(inspect.signature(fn).parameters).index(arg)

        @functools.wraps(fn)
        def body(*args, **kwargs):
            dev = (kwargs[arg] if arg in kwargs else args[at]).device
            if dev.type == "cuda" and torch.cuda.current_stream(dev).cuda_stream != 0:
                raise Error(
                    "lockstep.hf: the ops run on the legacy default CUDA stream; torch's "
                    f"current stream on {dev} is another one (leave the torch.cuda.stream block)"
                )
            with torch.device(dev):
                return fn(*args, **kwargs)

        return body

    return wrap



def _bf16(w: Tensor) -> Tensor:
    """A weight as the ops' bf16 operand: bf16 as is; f32 rounded once by the library's rounding
    (RNE, canonical NaN: Engine.update_weights' f32_to_bf16)."""
    w = w.detach()
    if w.dtype == torch.bfloat16:
        return w.contiguous()
    out = torch.empty(w.shape, dtype=torch.bfloat16)
    _C.round_bf16(w.contiguous(), out)
    return out


def _round(x: Tensor) -> Tensor:
    """round_bf16 of an f32 activation gradient: a tensor-core operand (B.0)."""
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    _C.round_bf16(x.contiguous(), out)
    return out


def _as_param_dtype(g: Tensor, dtype: torch.dtype) -> Tensor:
    """An fp32 weight gradient for a parameter of `dtype`: kept (f32) or rounded once (bf16)."""
    return g if dtype == torch.float32 else _round(g)


def _f32(x: Tensor) -> Tensor:
    """A bf16 activation as the f32 stream between the ops (exact: bf16 values in f32)."""
    return x.to(torch.float32)


def _gemm(x: Tensor, w: Tensor, segments: int, out_f32: bool = False) -> Tensor:
    y = torch.empty((x.shape[0], w.shape[0]), dtype=torch.float32 if out_f32 else torch.bfloat16)
    _C.gemm(x, w, None, y, segments)
    return y


def _k_range(segments: int, k: int, parts: int, rank: int) -> Tuple[int, int]:
    """gemm_tp_k_range (contract/gemm.h): the columns [begin, end) of rank `rank` of `parts`."""
    unit = 16 * segments
    padded = (k + unit - 1) // unit * unit
    per = padded // parts
    return min(k, rank * per), min(k, (rank + 1) * per)


def _row_parallel(x: Tensor, w: Tensor, segments: int, tp: int) -> Tensor:
    """o_proj / down_proj (engine Model::run's row_parallel): tp = 1 one GEMM of `segments` K
    segments; else each rank's fp32 partial over its K range, combined by the tree."""
    if tp == 1:
        return _gemm(x, w, segments)
    k = x.shape[1]
    parts = []
    for r in range(tp):
        k0, k1 = _k_range(segments, k, tp, r)
        p = torch.empty((x.shape[0], w.shape[0]), dtype=torch.float32)
        _C.gemm_partial(x[:, k0:k1], w[:, k0:k1], k, tp, r, segments, p)
        parts.append(p)
    y = torch.empty((x.shape[0], w.shape[0]), dtype=torch.bfloat16)
    _C.gemm_combine(parts, y)
    return y


def _column_dx(
    dy_b: Tensor, w_shards: List[Tensor], shard_cols: List[List[Tuple[int, int]]], tp: int, h: int
) -> Tensor:
    """The dX of a column-parallel layer (B.2, B.3; train.cc's column_dx): one dX chain per
    TP = S shard (its columns of dy against its fused weight rows), rank r of tp combines its
    S/tp shard results by the tree, then the ranks' results are combined."""
    t = dy_b.shape[0]
    s_count = len(w_shards)
    part = []
    for s in range(s_count):
        dys = torch.cat([dy_b[:, a:b] for a, b in shard_cols[s]], dim=1).contiguous()
        p = torch.empty((t, h), dtype=torch.float32)
        _C.gemm_dx(dys, w_shards[s], p, 1)
        part.append(p)
    per = s_count // tp
    ranks = []
    for r in range(tp):
        rr = torch.empty((t, h), dtype=torch.float32)
        _C.gemm_combine(part[r * per : (r + 1) * per], rr)
        ranks.append(rr)
    dx = torch.empty((t, h), dtype=torch.float32)
    _C.gemm_combine(ranks, dx)
    return dx


def _qkv_shards(wq: Tensor, wk: Tensor, wv: Tensor, dims: Sequence[int]):
    """Per TP = S shard s: the fused weight rows (q heads, k heads, v heads of the shard) and the
    matching columns of the fused q|k|v output (train.cc's qkv_shards_ / qkv_cols)."""
    hq, hkv, d, s_count = dims[_D_HQ], dims[_D_HKV], dims[_D_HD], dims[_D_S]
    shards, cols = [], []
    for s in range(s_count):
        q0, q1 = s * (hq // s_count) * d, (s + 1) * (hq // s_count) * d
        k0, k1 = s * (hkv // s_count) * d, (s + 1) * (hkv // s_count) * d
        shards.append(torch.cat([wq[q0:q1], wk[k0:k1], wv[k0:k1]]).contiguous())
        v0 = (hq + hkv) * d
        cols.append([(q0, q1), (hq * d + k0, hq * d + k1), (v0 + k0, v0 + k1)])
    return shards, cols


def _gu_shards(wg: Tensor, wu: Tensor, dims: Sequence[int]):
    """Per TP = S shard s: gate rows | up rows of its intermediate range (train.cc's gu_shards_)."""
    s_count = dims[_D_S]
    i = wg.shape[0]
    shards, cols = [], []
    for s in range(s_count):
        a, b = _k_range(s_count, i, s_count, s)
        shards.append(torch.cat([wg[a:b], wu[a:b]]).contiguous())
        cols.append([(a, b), (i + a, i + b)])
    return shards, cols


def _contract_of(dims: Sequence[int]) -> "_C.ContractConfig":
    return _C.ContractConfig(dims[_D_S], dims[_D_KV], dims[_D_VT], dims[_D_VS])


# ---- embedding op -------------------------------------------------------------------------------


@torch.library.custom_op("lockstep_hf::embed", mutates_args=())
@_runs_on("table")
def _embed(ids: Tensor, table: Tensor, cu_seqlens: Tensor, step_indices: Tensor) -> Tensor:
    """res [T, H] f32 (bf16 values): the rows of round_bf16(table)."""
    out = torch.empty((ids.shape[0], table.shape[1]), dtype=torch.bfloat16)
    _C.embedding(ids, _bf16(table), out)
    return _f32(out)


@_embed.register_fake
def _(ids, table, cu_seqlens, step_indices):
    return ids.new_empty((ids.shape[0], table.shape[1]), dtype=torch.float32)


@torch.library.custom_op("lockstep_hf::embed_backward", mutates_args=())
@_runs_on("g")
def _embed_backward(
    g: Tensor,
    ids: Tensor,
    dtable_in: Tensor,
    cu_seqlens: Tensor,
    step_indices: Tensor,
    dtype: torch.dtype,
) -> Tensor:
    """dtable_in + the g rows by id in the canonical token order (B.7), one f32 chain, returned
    as `dtype` (bf16: rounded once)."""
    dtable = dtable_in.clone()
    _C.embedding_backward(ids, g.contiguous(), dtable, cu_seqlens, step_indices)
    return _as_param_dtype(dtable, dtype)


@_embed_backward.register_fake
def _(g, ids, dtable_in, cu_seqlens, step_indices, dtype):
    return torch.empty_like(dtable_in, dtype=dtype)


# ---- decoder layer op ---------------------------------------------------------------------------


@torch.library.custom_op("lockstep_hf::layer", mutates_args=())
@_runs_on("res_prev")
def _layer(
    out_prev: Optional[Tensor],
    res_prev: Tensor,
    weights: List[Tensor],
    positions: Tensor,
    cu_seqlens: Tensor,
    step_indices: Tensor,
    dims: List[int],
    eps: float,
    theta: float,
) -> Tuple[(Tensor,) * 15]:
    """One Qwen3 decoder layer as engine Model::run computes it: returns [out, s2] (the down
    output and the stream after the attention residual add, f32 holding bf16 values) followed by
    the bf16 activations the backward reads (SavedForward::Layer)."""
    hq, hkv, d, segs, kv_chunk, tp, maxpos = (
        dims[_D_HQ],
        dims[_D_HKV],
        dims[_D_HD],
        dims[_D_S],
        dims[_D_KV],
        dims[_D_TP],
        dims[_D_MAXPOS],
    )
    w = [_bf16(x) for x in weights]
    t, h = res_prev.shape
    res = res_prev.to(torch.bfloat16)
    xn1 = torch.empty((t, h), dtype=torch.bfloat16)
    if out_prev is None:  # layer 0: the stream is the embedding, no add
        s1 = res
        _C.rmsnorm(s1, w[_IN], xn1, eps)
    else:
        s1 = torch.empty((t, h), dtype=torch.bfloat16)
        _C.rmsnorm_residual(out_prev.to(torch.bfloat16), res, w[_IN], s1, xn1, eps)
    # Fused q|k|v GEMM (the engine's layout; each output column is its own K reduction).
    qkv = _gemm(xn1, torch.cat([w[_Q], w[_K], w[_V]]), 1)  # column-parallel: one K segment
    # Copies (exact), never views: the op's outputs must not alias one another.
    q = qkv[:, : hq * d].clone(memory_format=torch.contiguous_format).view(t, hq, d)
    k = qkv[:, hq * d : (hq + hkv) * d].clone(memory_format=torch.contiguous_format).view(t, hkv, d)
    v = qkv[:, (hq + hkv) * d :].clone(memory_format=torch.contiguous_format).view(t, hkv, d)
    qn, kn = torch.empty_like(q), torch.empty_like(k)
    _C.rmsnorm(q, w[_QN], qn, eps)  # per head over D
    _C.rmsnorm(k, w[_KN], kn, eps)
    q_rope, k_rope = torch.empty_like(q), torch.empty_like(k)
    _C.rope(qn, positions, q_rope, theta, maxpos)
    _C.rope(kn, positions, k_rope, theta, maxpos)
    attn = torch.empty_like(q)
    lse = torch.empty((t, hq), dtype=torch.float32)
    _C.attention_varlen(q_rope, k_rope, v, cu_seqlens, attn, lse, kv_chunk, 0.0)
    attn2 = attn.view(t, hq * d)
    o = _row_parallel(attn2, w[_O], segs, tp)
    s2 = torch.empty((t, h), dtype=torch.bfloat16)
    xn2 = torch.empty((t, h), dtype=torch.bfloat16)
    _C.rmsnorm_residual(o, s1, w[_POST], s2, xn2, eps)
    gu = _gemm(xn2, torch.cat([w[_GATE], w[_UP]]), 1)  # column-parallel: one K segment
    i = w[_GATE].shape[0]
    act = torch.empty((t, i), dtype=torch.bfloat16)
    _C.silu_mul(gu[:, :i].contiguous(), gu[:, i:].contiguous(), act)
    down = _row_parallel(act, w[_DOWN], segs, tp)
    saved = [s1, xn1, q, k, v, q_rope, k_rope, attn2, lse, s2, xn2, gu, act]
    return tuple([_f32(down), _f32(s2)] + saved)


def _layer_saved_shapes(t: int, h: int, i: int, dims: Sequence[int]):
    hq, hkv, d = dims[_D_HQ], dims[_D_HKV], dims[_D_HD]
    bf = torch.bfloat16
    return [
        ((t, h), bf),  # s1
        ((t, h), bf),  # xn1
        ((t, hq, d), bf),  # q
        ((t, hkv, d), bf),  # k
        ((t, hkv, d), bf),  # v
        ((t, hq, d), bf),  # q_rope
        ((t, hkv, d), bf),  # k_rope
        ((t, hq * d), bf),  # attn
        ((t, hq), torch.float32),  # lse
        ((t, h), bf),  # s2
        ((t, h), bf),  # xn2
        ((t, 2 * i), bf),  # gate|up
        ((t, i), bf),  # act
    ]


@_layer.register_fake
def _(out_prev, res_prev, weights, positions, cu_seqlens, step_indices, dims, eps, theta):
    t, h = res_prev.shape
    i = weights[_GATE].shape[0]
    outs = [res_prev.new_empty((t, h)), res_prev.new_empty((t, h))]
    for shape, dtype in _layer_saved_shapes(t, h, i, dims):
        outs.append(res_prev.new_empty(shape, dtype=dtype))
    return tuple(outs)


@torch.library.custom_op("lockstep_hf::layer_backward", mutates_args=())
@_runs_on("g_out")
def _layer_backward(
    g_out: Tensor,
    g_s2: Tensor,
    saved: List[Tensor],
    weights: List[Tensor],
    grads_in: List[Tensor],
    positions: Tensor,
    cu_seqlens: Tensor,
    step_indices: Tensor,
    dims: List[int],
    eps: float,
    theta: float,
    param_dtypes: bool,
) -> List[Tensor]:
    """Backprop::backward's steps for one layer: returns [d] (the f32 gradient of the layer's
    input stream: out_prev and res_prev both) + the 11 weight gradients, each grads_in's f32 value
    continued by this micro-batch's chain (B.1); with param_dtypes in the weights' dtypes (a bf16
    weight's gradient rounded once), else f32."""
    hq, hkv, d, kv_chunk, tp, maxpos = (
        dims[_D_HQ],
        dims[_D_HKV],
        dims[_D_HD],
        dims[_D_KV],
        dims[_D_TP],
        dims[_D_MAXPOS],
    )
    s1, xn1, q, k, v, q_rope, k_rope, attn, lse, s2, xn2, gu, act = saved
    w = [_bf16(x) for x in weights]
    g = [x.clone() for x in grads_in]
    t, h = s1.shape
    i = w[_GATE].shape[0]
    cu, st = cu_seqlens, step_indices
    # MLP: down (row-parallel: one dX segment), SiLU-and-mul, gate|up (column-parallel).
    dy_down = _round(g_out)
    d_act = torch.empty((t, i), dtype=torch.float32)
    _C.gemm_dx(dy_down, w[_DOWN], d_act, 1)
    _C.gemm_dw(dy_down, act, g[_DOWN], cu, st)
    dgu = torch.empty((t, 2 * i), dtype=torch.float32)
    _C.silu_mul_backward(gu, d_act, dgu)
    dgu_b = _round(dgu)
    _C.gemm_dw(dgu_b[:, :i], xn2, g[_GATE], cu, st)
    _C.gemm_dw(dgu_b[:, i:], xn2, g[_UP], cu, st)
    gu_w, gu_cols = _gu_shards(w[_GATE], w[_UP], dims)
    d_xn2 = _column_dx(dgu_b, gu_w, gu_cols, tp, h)
    ds2 = torch.empty((t, h), dtype=torch.float32)
    _C.rmsnorm_residual_backward(
        s2, w[_POST], d_xn2, g_s2.contiguous(), ds2, g[_POST], cu, st, eps
    )
    # Attention: o_proj (row-parallel), attention, RoPE, q/k norms, q|k|v (column-parallel).
    dy_o = _round(ds2)
    d_attn = torch.empty((t, hq * d), dtype=torch.float32)
    _C.gemm_dx(dy_o, w[_O], d_attn, 1)
    _C.gemm_dw(dy_o, attn, g[_O], cu, st)
    dout = _round(d_attn).view(t, hq, d)
    dq = torch.empty((t, hq, d), dtype=torch.float32)
    dk = torch.empty((t, hkv, d), dtype=torch.float32)
    dv = torch.empty((t, hkv, d), dtype=torch.float32)
    _C.attention_backward_varlen(
        q_rope, k_rope, v, attn.view(t, hq, d), lse, dout, cu, dq, dk, dv, kv_chunk, 0.0
    )
    dq_r, dk_r = torch.empty_like(dq), torch.empty_like(dk)
    _C.rope_backward(dq, positions, dq_r, theta, maxpos)
    _C.rope_backward(dk, positions, dk_r, theta, maxpos)
    dq_raw, dk_raw = torch.empty_like(dq), torch.empty_like(dk)
    _C.rmsnorm_backward(q, w[_QN], dq_r, dq_raw, g[_QN], cu, st, eps)
    _C.rmsnorm_backward(k, w[_KN], dk_r, dk_raw, g[_KN], cu, st, eps)
    dqkv = torch.cat([dq_raw.view(t, -1), dk_raw.view(t, -1), dv.view(t, -1)], dim=1)
    dqkv_b = _round(dqkv)
    _C.gemm_dw(dqkv_b[:, : hq * d], xn1, g[_Q], cu, st)
    _C.gemm_dw(dqkv_b[:, hq * d : (hq + hkv) * d], xn1, g[_K], cu, st)
    _C.gemm_dw(dqkv_b[:, (hq + hkv) * d :], xn1, g[_V], cu, st)
    qkv_w, qkv_cols = _qkv_shards(w[_Q], w[_K], w[_V], dims)
    d_xn1 = _column_dx(dqkv_b, qkv_w, qkv_cols, tp, h)
    dd = torch.empty((t, h), dtype=torch.float32)
    _C.rmsnorm_residual_backward(s1, w[_IN], d_xn1, ds2, dd, g[_IN], cu, st, eps)
    return [dd] + _out_grads(g, weights, param_dtypes)


def _out_grads(g: List[Tensor], weights: Sequence[Tensor], param_dtypes: bool) -> List[Tensor]:
    if not param_dtypes:
        return g
    return [_as_param_dtype(x, w.dtype) for x, w in zip(g, weights)]


def _fake_grads(grads_in, weights, param_dtypes):
    if not param_dtypes:
        return [torch.empty_like(x) for x in grads_in]
    return [torch.empty_like(x, dtype=w.dtype) for x, w in zip(grads_in, weights)]


@_layer_backward.register_fake
def _(g_out, g_s2, saved, weights, grads_in, positions, cu_seqlens, step_indices, dims, eps, theta,
      param_dtypes):
    return [torch.empty_like(g_out)] + _fake_grads(grads_in, weights, param_dtypes)


# ---- final norm + log-prob head op --------------------------------------------------------------


@torch.library.custom_op("lockstep_hf::head", mutates_args=())
@_runs_on("res_last")
def _head(
    out_last: Tensor,
    res_last: Tensor,
    norm_w: Tensor,
    lm_w: Tensor,
    targets: Tensor,
    temperature: float,
    ignore_index: int,
    cu_seqlens: Tensor,
    step_indices: Tensor,
    dims: List[int],
    eps: float,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The final norm (with the last residual add) and the linear log-prob head (§L): (logp, lse,
    entropy) [T] f32, then the bf16 s_final and hidden the backward reads."""
    t, h = res_last.shape
    s_final = torch.empty((t, h), dtype=torch.bfloat16)
    hidden = torch.empty((t, h), dtype=torch.bfloat16)
    bf = torch.bfloat16
    _C.rmsnorm_residual(out_last.to(bf), res_last.to(bf), _bf16(norm_w), s_final, hidden, eps)
    logp, lse, ent = (torch.empty((t,), dtype=torch.float32) for _ in range(3))
    _C.linear_logprob(
        hidden, _bf16(lm_w), targets, logp, lse, ent, temperature, ignore_index, _contract_of(dims)
    )
    return logp, lse, ent, s_final, hidden


@_head.register_fake
def _(out_last, res_last, norm_w, lm_w, targets, temperature, ignore_index, cu_seqlens,
      step_indices, dims, eps):
    t, h = res_last.shape
    f = [res_last.new_empty((t,)) for _ in range(3)]
    bf = [res_last.new_empty((t, h), dtype=torch.bfloat16) for _ in range(2)]
    return (*f, *bf)


@torch.library.custom_op("lockstep_hf::head_backward", mutates_args=())
@_runs_on("s_final")
def _head_backward(
    g_lp: Tensor,
    g_ent: Optional[Tensor],
    s_final: Tensor,
    hidden: Tensor,
    norm_w: Tensor,
    lm_w: Tensor,
    targets: Tensor,
    lse: Tensor,
    entropy: Tensor,
    dnorm_in: Tensor,
    dlm_in: Tensor,
    cu_seqlens: Tensor,
    step_indices: Tensor,
    temperature: float,
    ignore_index: int,
    dims: List[int],
    eps: float,
    param_dtypes: bool,
) -> Tuple[Tensor, Tensor, Tensor]:
    """(d, dnorm, dlm): the head's backward (B.8) then the final norm's (B.4, no gradient for its
    residual_out), as Backprop::backward starts."""
    t, h = s_final.shape
    dlm = dlm_in.clone()
    dnorm = dnorm_in.clone()
    gh = torch.empty((t, h), dtype=torch.float32)
    _C.linear_logprob_backward(
        hidden,
        _bf16(lm_w),
        targets,
        lse,
        entropy,
        g_lp.contiguous(),
        None if g_ent is None else g_ent.contiguous(),
        gh,
        dlm,
        temperature,
        ignore_index,
        _contract_of(dims),
        cu_seqlens,
        step_indices,
    )
    zero = torch.zeros((t, h), dtype=torch.float32)
    dd = torch.empty((t, h), dtype=torch.float32)
    _C.rmsnorm_residual_backward(
        s_final, _bf16(norm_w), gh, zero, dd, dnorm, cu_seqlens, step_indices, eps
    )
    dnorm, dlm = _out_grads([dnorm, dlm], [norm_w, lm_w], param_dtypes)
    return dd, dnorm, dlm


@_head_backward.register_fake
def _(g_lp, g_ent, s_final, hidden, norm_w, lm_w, targets, lse, entropy, dnorm_in, dlm_in,
      cu_seqlens, step_indices, temperature, ignore_index, dims, eps, param_dtypes):
    dnorm, dlm = _fake_grads([dnorm_in, dlm_in], [norm_w, lm_w], param_dtypes)
    return torch.empty_like(s_final, dtype=torch.float32), dnorm, dlm


# ---- final norm alone (the ordinary forward's hidden states) ------------------------------------


@torch.library.custom_op("lockstep_hf::final_norm", mutates_args=())
@_runs_on("res_last")
def _final_norm(
    out_last: Tensor, res_last: Tensor, norm_w: Tensor, eps: float
) -> Tuple[Tensor, Tensor]:
    """(hidden f32 holding bf16 values, s_final bf16): the final norm with the last residual add,
    as the head computes it."""
    t, h = res_last.shape
    s_final = torch.empty((t, h), dtype=torch.bfloat16)
    hidden = torch.empty((t, h), dtype=torch.bfloat16)
    bf = torch.bfloat16
    _C.rmsnorm_residual(out_last.to(bf), res_last.to(bf), _bf16(norm_w), s_final, hidden, eps)
    return _f32(hidden), s_final


@_final_norm.register_fake
def _(out_last, res_last, norm_w, eps):
    return torch.empty_like(res_last), torch.empty_like(res_last, dtype=torch.bfloat16)


@torch.library.custom_op("lockstep_hf::final_norm_backward", mutates_args=())
@_runs_on("gh")
def _final_norm_backward(
    gh: Tensor, s_final: Tensor, norm_w: Tensor, eps: float
) -> Tuple[Tensor, Tensor]:
    """(d, dnorm in norm_w's dtype) from the f32 gradient of the hidden states."""
    t, h = s_final.shape
    dnorm = torch.zeros(norm_w.shape, dtype=torch.float32)
    zero = torch.zeros((t, h), dtype=torch.float32)
    dd = torch.empty((t, h), dtype=torch.float32)
    w = _bf16(norm_w)
    _C.rmsnorm_residual_backward(s_final, w, gh.contiguous(), zero, dd, dnorm, None, None, eps)
    return dd, _as_param_dtype(dnorm, norm_w.dtype)


@_final_norm_backward.register_fake
def _(gh, s_final, norm_w, eps):
    return torch.empty_like(gh), torch.empty_like(norm_w)


# ---- tied bf16 embedding: one gradient, rounded once (B.7) ---------------------------------------


@torch.library.custom_op("lockstep_hf::tie", mutates_args=())
@_runs_on("table")
def _tie(table: Tensor) -> Tuple[Tensor, Tensor]:
    """(for the embedding, for the lm_head): two f32 copies (exact) of a tied bf16 table, so that
    each use gets its own fp32 gradient and the backward combines them once (B.7), instead of
    autograd adding two bf16-rounded parts in bf16."""
    return table.to(torch.float32), table.to(torch.float32)


@_tie.register_fake
def _(table):
    f32 = torch.float32
    return torch.empty_like(table, dtype=f32), torch.empty_like(table, dtype=f32)


@torch.library.custom_op("lockstep_hf::tie_backward", mutates_args=())
@_runs_on("g_lm")
def _tie_backward(g_embed: Tensor, g_lm: Tensor, table: Tensor) -> Tensor:
    """dE = d_lm_head ⊕ d_embed (Gradients::finish: the two-leaf tree), in table's dtype (a bf16
    table's gradient rounded once)."""
    de = torch.empty(g_embed.shape, dtype=torch.float32)
    _C.gemm_combine([g_lm.contiguous(), g_embed.contiguous()], de)
    return _as_param_dtype(de, table.dtype)


@_tie_backward.register_fake
def _(g_embed, g_lm, table):
    return torch.empty_like(table)


# ---- autograd -----------------------------------------------------------------------------------
# Weight gradients: plain mode starts every backward call from +0 and returns them in the
# parameters' dtypes; accumulate mode (a GradAccumulator on the model) continues each
# parameter's fp32 main_grad chain in place and returns no gradient (p.grad stays None).


def _acc_of(p: Tensor) -> Optional[Tensor]:
    """The accumulation buffer of a parameter in accumulate mode, else None."""
    return getattr(p, "main_grad", None) if getattr(p, "_lockstep_acc", None) is not None else None


def _start(weights: Sequence[Tensor], accs: Sequence[Optional[Tensor]]) -> List[Tensor]:
    return [
        a if a is not None else torch.zeros(w.shape, dtype=torch.float32, device=w.device)
        for w, a in zip(weights, accs)
    ]


def _finish(grads: Sequence[Tensor], accs: Sequence[Optional[Tensor]]) -> List[Optional[Tensor]]:
    out = []
    for g, a in zip(grads, accs):
        if a is None:
            out.append(g)
        else:
            a.copy_(g)
            out.append(None)
    return out


def _zeros_f32(g: Optional[Tensor], like: Tensor) -> Tensor:
    if g is None:
        return torch.zeros(like.shape, dtype=torch.float32, device=like.device)
    return g.to(torch.float32).contiguous()


def _embed_setup(ctx, inputs, output):
    ids, table, cu_seqlens, step_indices = inputs
    ctx.save_for_backward(ids, cu_seqlens, step_indices)  # not the table: its shape and dtype
    ctx.table = (tuple(table.shape), table.dtype, table.device)
    ctx.acc = _acc_of(table)
    ctx.set_materialize_grads(False)


def _embed_bwd(ctx, g):
    ids, cu_seqlens, step_indices = ctx.saved_tensors
    shape, dtype, device = ctx.table
    if ctx.acc is not None:
        start, out_dtype = ctx.acc, torch.float32
    else:
        start, out_dtype = torch.zeros(shape, dtype=torch.float32, device=device), dtype
    if g is None:
        g = torch.zeros((ids.shape[0], shape[1]), dtype=torch.float32, device=device)
    dtable = torch.ops.lockstep_hf.embed_backward(
        g.to(torch.float32), ids, start, cu_seqlens, step_indices, out_dtype
    )
    return None, _finish([dtable], [ctx.acc])[0], None, None


_embed.register_autograd(_embed_bwd, setup_context=_embed_setup)


def _layer_setup(ctx, inputs, output):
    out_prev, res_prev, weights, positions, cu_seqlens, step_indices, dims, eps, theta = inputs
    saved = output[2:]
    ctx.save_for_backward(*saved, *weights, positions, cu_seqlens, step_indices)
    ctx.mark_non_differentiable(*saved)
    ctx.set_materialize_grads(False)  # no zeros for the saved activations' (absent) gradients
    ctx.n_w = len(weights)
    ctx.first = out_prev is None
    ctx.args = (list(dims), eps, theta)
    ctx.accs = [_acc_of(w) for w in weights]


def _layer_bwd(ctx, g_out, g_s2, *unused):
    tensors = ctx.saved_tensors
    saved = list(tensors[:13])
    weights = list(tensors[13 : 13 + ctx.n_w])
    positions, cu_seqlens, step_indices = tensors[13 + ctx.n_w :]
    dims, eps, theta = ctx.args
    s1 = saved[0]
    res = torch.ops.lockstep_hf.layer_backward(
        _zeros_f32(g_out, s1),
        _zeros_f32(g_s2, s1),
        saved,
        weights,
        _start(weights, ctx.accs),
        positions,
        cu_seqlens,
        step_indices,
        dims,
        eps,
        theta,
        all(a is None for a in ctx.accs),
    )
    dd = res[0]
    return (
        None if ctx.first else dd,
        dd,
        _finish(res[1:], ctx.accs),
        None,
        None,
        None,
        None,
        None,
        None,
    )


_layer.register_autograd(_layer_bwd, setup_context=_layer_setup)


def _head_setup(ctx, inputs, output):
    (out_last, res_last, norm_w, lm_w, targets, temperature, ignore_index, cu_seqlens,
     step_indices, dims, eps) = inputs
    _, lse, entropy, s_final, hidden = output
    ctx.save_for_backward(s_final, hidden, norm_w, lm_w, targets, lse, entropy, cu_seqlens,
                          step_indices)
    ctx.mark_non_differentiable(lse, s_final, hidden)
    ctx.set_materialize_grads(False)  # an unused entropy: no entropy gradient (g_ent None)
    ctx.args = (temperature, ignore_index, list(dims), eps)
    # A tied lm_head accumulates apart from the embedding (B.7): the accumulator's own buffer.
    tied_lm = getattr(lm_w, "_lockstep_tied_lm_grad", None)
    ctx.accs = [_acc_of(norm_w), tied_lm if tied_lm is not None else _acc_of(lm_w)]
    ctx.accumulator = getattr(norm_w, "_lockstep_acc", None)


def _head_bwd(ctx, g_lp, g_lse, g_ent, g_s, g_h):
    (s_final, hidden, norm_w, lm_w, targets, lse, entropy, cu_seqlens,
     step_indices) = ctx.saved_tensors
    temperature, ignore_index, dims, eps = ctx.args
    if ctx.accumulator is not None:
        # The first backward op of a micro-batch: the step order check (B.1) before any buffer
        # is touched.
        ctx.accumulator._accept(step_indices)
    start = _start([norm_w, lm_w], ctx.accs)
    dd, dnorm, dlm = torch.ops.lockstep_hf.head_backward(
        _zeros_f32(g_lp, lse),
        None if g_ent is None else g_ent.to(torch.float32).contiguous(),
        s_final,
        hidden,
        norm_w,
        lm_w,
        targets,
        lse,
        entropy,
        start[0],
        start[1],
        cu_seqlens,
        step_indices,
        temperature,
        ignore_index,
        dims,
        eps,
        all(a is None for a in ctx.accs),
    )
    dnorm, dlm = _finish([dnorm, dlm], ctx.accs)
    return dd, dd, dnorm, dlm, None, None, None, None, None, None, None


_head.register_autograd(_head_bwd, setup_context=_head_setup)


def _final_norm_setup(ctx, inputs, output):
    out_last, res_last, norm_w, eps = inputs
    ctx.save_for_backward(output[1], norm_w)
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.eps = eps


def _final_norm_bwd(ctx, gh, g_s):
    s_final, norm_w = ctx.saved_tensors
    if _acc_of(norm_w) is not None:
        raise Error(
            "lockstep.hf: accumulate mode differentiates lockstep.hf.logprobs only, not the "
            "logits of model(...)"
        )
    dd, dnorm = torch.ops.lockstep_hf.final_norm_backward(
        _zeros_f32(gh, s_final), s_final, norm_w, ctx.eps
    )
    return dd, dd, dnorm, None


_final_norm.register_autograd(_final_norm_bwd, setup_context=_final_norm_setup)


def _tie_setup(ctx, inputs, output):
    (table,) = inputs
    ctx.save_for_backward(table)
    ctx.set_materialize_grads(False)


def _tie_bwd(ctx, g_embed, g_lm):
    (table,) = ctx.saved_tensors
    dt = torch.ops.lockstep_hf.tie_backward(_zeros_f32(g_embed, table), _zeros_f32(g_lm, table),
                                            table)
    return dt


_tie.register_autograd(_tie_bwd, setup_context=_tie_setup)


# ---- the patched model --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Setup:
    """What patch() fixed for a model: the contract, tp and the config's numbers."""

    contract: Contract
    tp: int
    dims: Tuple[int, ...]
    eps: float
    theta: float
    vocab: int
    tied: bool


def _config_value(cfg: Any, name: str, default: Any = None) -> Any:
    return getattr(cfg, name, default)


def _rope_theta(cfg: Any) -> float:
    """rope_theta of a transformers 4 (rope_theta, rope_scaling) or 5 (rope_parameters) config;
    anything but plain RoPE is refused."""
    params = _config_value(cfg, "rope_parameters")
    scaling = _config_value(cfg, "rope_scaling")
    for what, rp in (("rope_parameters", params), ("rope_scaling", scaling)):
        if rp is None:
            continue
        if not isinstance(rp, dict):
            raise Error(f"lockstep.hf.patch: config.{what} must be a dict or None, got {rp!r}")
        kind = rp.get("rope_type", rp.get("type", "default"))
        if kind != "default":
            raise Error(
                f"lockstep.hf.patch: unsupported config.{what} rope_type {kind!r} (only "
                "'default': plain RoPE)"
            )
        extra = set(rp) - {"rope_type", "type", "rope_theta"}
        if rp.get("partial_rotary_factor", 1.0) != 1.0 or extra - {"partial_rotary_factor"}:
            raise Error(f"lockstep.hf.patch: unsupported config.{what} keys {sorted(extra)}")
    theta = _config_value(cfg, "rope_theta")
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    if theta is None:
        theta = 10000.0
    return float(theta)


def _check_config(cfg: Any, contract: Contract, tp: int) -> Tuple[Tuple[int, ...], float, float]:
    def refuse(what: str) -> None:
        raise Error(f"lockstep.hf.patch: unsupported config: {what}")

    if _config_value(cfg, "model_type", "qwen3") != "qwen3":
        refuse(f"model_type {cfg.model_type!r} (only dense 'qwen3')")
    if _config_value(cfg, "attention_bias", False):
        refuse("attention_bias=True (q/k/v/o projections with bias)")
    if _config_value(cfg, "mlp_bias", False):
        refuse("mlp_bias=True")
    if _config_value(cfg, "hidden_act", "silu") != "silu":
        refuse(f"hidden_act {cfg.hidden_act!r} (only 'silu')")
    if _config_value(cfg, "use_sliding_window", False):
        refuse("use_sliding_window=True (sliding-window attention)")
    for i, kind in enumerate(_config_value(cfg, "layer_types", None) or []):
        if kind != "full_attention":
            refuse(f"layer_types[{i}] = {kind!r} (only 'full_attention')")
    if _config_value(cfg, "quantization_config", None) is not None:
        refuse("quantization_config (quantized weights)")
    theta = _rope_theta(cfg)
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = _config_value(cfg, "head_dim", None) or cfg.hidden_size // hq
    s = contract.gemm_segments
    if cfg.num_hidden_layers < 1:
        refuse("num_hidden_layers must be >= 1")
    if d % 16 or not 16 <= d <= 512:
        refuse(f"head_dim {d} (the attention contract needs a multiple of 16 in [16, 512])")
    if hq % hkv:
        refuse(f"num_attention_heads {hq} is not a multiple of num_key_value_heads {hkv}")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp not in (1, 2, 4, 8):
        raise Error(f"lockstep.hf.patch: tp must be 1, 2, 4 or 8, got {tp!r}")
    if s % tp or contract.vocab_segments % tp:
        raise Error(
            f"lockstep.hf.patch: tp={tp} needs contract.gemm_segments ({s}) and "
            f"contract.vocab_segments ({contract.vocab_segments}) to be multiples of tp"
        )
    if hq % tp or hkv % tp:
        refuse(
            f"tp={tp}: num_attention_heads {hq} and num_key_value_heads {hkv} must be multiples "
            "of tp (heads split over ranks)"
        )
    if hq % s or hkv % s:
        refuse(
            f"contract.gemm_segments={s}: the backward's TP = S shards (B.2) need "
            f"num_attention_heads {hq} and num_key_value_heads {hkv} to be multiples of it"
        )
    if (hq * d) % (16 * s):
        refuse(f"Hq·D = {hq * d} must be a multiple of 16·gemm_segments = {16 * s} (o_proj)")
    maxpos = int(cfg.max_position_embeddings)
    dims = (hq, hkv, d, s, contract.kv_chunk, contract.vocab_tile, contract.vocab_segments, tp,
            maxpos)
    return dims, float(cfg.rms_norm_eps), theta


def _setup_of(model: Any) -> _Setup:
    st = getattr(model, "_lockstep", None)
    if not isinstance(st, _Setup):
        raise Error("lockstep.hf: the model is not patched: call lockstep.hf.patch(model) first")
    return st


def patch(model: Any, *, contract: Optional[Contract] = None, tp: int = 1) -> Any:
    """Makes a transformers ``Qwen3ForCausalLM`` run on lockstep's ops, in place; returns it.

    Checks the config (dense Qwen3: no attention bias, no sliding window, plain RoPE, head_dim a
    multiple of 16, heads divisible by tp and by contract.gemm_segments; clear lockstep.Error
    otherwise) and replaces ``model.forward`` and ``model.model.forward`` by lockstep's packed
    forward (the submodules' own forwards and hooks are not called; their parameters are used).
    ``contract`` (default ``lockstep.Contract()``) and ``tp`` must be the rollout engine's: tp
    fixes the tree the column-parallel dX follows (B.2) and how o_proj / down_proj are reduced
    (the bits of every output are the same for every tp <= gemm_segments).
    """
    try:
        from transformers import Qwen3ForCausalLM
    except ImportError as e:  # pragma: no cover - transformers is a test dependency
        raise ImportError("lockstep.hf needs transformers: pip install transformers") from e
    if not isinstance(model, Qwen3ForCausalLM):
        raise TypeError(
            "lockstep.hf.patch: expected a transformers Qwen3ForCausalLM, got "
            f"{type(model).__name__}"
        )
    if contract is None:
        contract = Contract()
    if not isinstance(contract, Contract):
        raise TypeError(f"lockstep.hf.patch: contract must be a lockstep.Contract, got {contract}")
    dims, eps, theta = _check_config(model.config, contract, tp)
    _check_weights(model)
    embed = model.model.embed_tokens.weight
    tied = model.lm_head.weight is embed
    if bool(_config_value(model.config, "tie_word_embeddings", False)) != tied:
        raise Error(
            f"lockstep.hf.patch: config.tie_word_embeddings is "
            f"{model.config.tie_word_embeddings} but lm_head.weight "
            f"{'is' if tied else 'is not'} model.embed_tokens.weight"
        )
    object.__setattr__(model, "_lockstep", _Setup(contract, tp, dims, eps, theta,
                                                   int(model.config.vocab_size), tied))
    object.__setattr__(model.model, "_lockstep_owner", model)
    model.forward = types.MethodType(_causal_lm_forward, model)
    model.model.forward = types.MethodType(_base_model_forward, model.model)
    return model


def hf_config_dict(model: Any) -> dict:
    """The model's config as a config.json dict (``lockstep.Engine(..., config=...)``)."""
    import json

    return json.loads(model.config.to_json_string())


# ---- inputs -------------------------------------------------------------------------------------


def _host_int_tensor(name: str, x: Any) -> Tensor:
    if not isinstance(x, Tensor):
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"lockstep.hf: {name} must be an integer tensor, got {x!r}") from None
    if x.device.type not in ("cpu", "cuda"):
        raise Error(f"lockstep.hf: {name} is on {x.device}: CPU or CUDA tensors only")
    x = x.detach().cpu()  # checked and planned on the host; the ops get device copies
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"lockstep.hf: {name} must be an integer tensor, got {x.dtype}")
    return x


def _flat_tokens(name: str, x: Any) -> Tensor:
    """[T] or [1, T] -> [T] int64."""
    x = _host_int_tensor(name, x)
    if x.dim() == 2 and x.shape[0] == 1:
        x = x[0]
    if x.dim() != 1:
        raise Error(
            f"lockstep.hf: {name} must have shape [T] or [1, T] (packed sequences), got "
            f"{list(x.shape)}"
        )
    return x.to(torch.int64).contiguous()


def packed_cu_seqlens(position_ids: Any) -> Tensor:
    """cu_seqlens [B+1] int32 of HF's padding-free position_ids [1, T] (or [T]): a sequence
    starts where position_ids == 0 and counts 0, 1, 2, ... (anything else raises)."""
    pos = _flat_tokens("position_ids", position_ids)
    t = pos.shape[0]
    if t == 0:
        return torch.zeros(1, dtype=torch.int32)
    starts = (pos == 0).nonzero().flatten()
    if pos[0] != 0:
        raise Error(f"lockstep.hf: position_ids must start at 0 (a sequence), got {int(pos[0])}")
    idx = torch.arange(t)
    seq_start = starts[torch.searchsorted(starts, idx, right=True) - 1]
    bad = (pos != idx - seq_start).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise Error(
            f"lockstep.hf: position_ids must count 0, 1, 2, ... inside each packed sequence; "
            f"position_ids[{i}] = {int(pos[i])}, expected {int(idx[i] - seq_start[i])}"
        )
    return torch.cat([starts, torch.tensor([t])]).to(torch.int32)


def _check_cu(cu: Any, t: int, maxpos: int) -> Tensor:
    if not isinstance(cu, Tensor):
        raise TypeError(f"lockstep.hf: cu_seqlens must be an int32 tensor [B+1], got {cu!r}")
    cu = cu.detach().cpu()  # read on the host (the ops plan from it)
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 1:
        raise Error(
            f"lockstep.hf: cu_seqlens must be int32 [B+1], got {cu.dtype} {list(cu.shape)}"
        )
    c = cu.tolist()
    if c[0] != 0 or c[-1] != t:
        raise Error(
            f"lockstep.hf: cu_seqlens must start at 0 and end at T = {t}, got {c[0]} .. {c[-1]}"
        )
    for b in range(len(c) - 1):
        if c[b + 1] < c[b]:
            raise Error(
                f"lockstep.hf: cu_seqlens must be non-decreasing: cu_seqlens[{b}] = {c[b]} > "
                f"cu_seqlens[{b + 1}] = {c[b + 1]}"
            )
        if c[b + 1] - c[b] > maxpos:
            raise Error(
                f"lockstep.hf: sequence {b} has {c[b + 1] - c[b]} tokens, more than "
                f"max_position_embeddings ({maxpos})"
            )
    return cu.contiguous()


def _packing(
    st: _Setup, input_ids: Any, cu_seqlens: Any, position_ids: Any, step_indices: Any
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """(ids [T] i64, positions [T] i32, cu_seqlens [B+1] i32, step_indices [B] i64), checked."""
    if input_ids is None:
        raise Error("lockstep.hf: input_ids is required (inputs_embeds is not supported)")
    ids = _flat_tokens("input_ids", input_ids)
    t = ids.shape[0]
    if t and (int(ids.min()) < 0 or int(ids.max()) >= st.vocab):
        i = int(((ids < 0) | (ids >= st.vocab)).nonzero()[0])
        raise Error(
            f"lockstep.hf: input_ids[{i}] = {int(ids[i])} is outside the vocabulary [0, {st.vocab})"
        )
    if cu_seqlens is None and position_ids is None:
        raise Error(
            "lockstep.hf: packed sequences need cu_seqlens (int32 [B+1]) or position_ids "
            "(HF's padding-free [1, T], 0 at each sequence start)"
        )
    if position_ids is not None:
        from_pos = packed_cu_seqlens(position_ids)
        if from_pos[-1] != t:
            raise Error(f"lockstep.hf: position_ids has {int(from_pos[-1])} entries for T = {t}")
        if cu_seqlens is not None and not torch.equal(
            _check_cu(cu_seqlens, t, st.dims[_D_MAXPOS]), from_pos
        ):
            raise Error("lockstep.hf: cu_seqlens and position_ids describe different packings")
        cu_seqlens = from_pos
    cu = _check_cu(cu_seqlens, t, st.dims[_D_MAXPOS])
    b = cu.shape[0] - 1
    c = cu.tolist()
    positions = torch.cat(
        [torch.arange(c[i + 1] - c[i], dtype=torch.int32) for i in range(b)]
        or [torch.zeros(0, dtype=torch.int32)]
    )
    if step_indices is None:
        steps = torch.arange(b, dtype=torch.int64)
    else:
        steps = _host_int_tensor("step_indices", step_indices).to(torch.int64).flatten()
        if steps.shape[0] != b:
            raise Error(
                f"lockstep.hf: step_indices has {steps.shape[0]} entries for {b} packed sequences"
            )
        if b and (int(steps.min()) < 0 or len(set(steps.tolist())) != b):
            raise Error(
                f"lockstep.hf: step_indices must be distinct and >= 0, got {steps.tolist()}"
            )
    return ids, positions, cu, steps.contiguous()


def _layer_weights(layer: Any) -> List[Tensor]:
    return [layer.get_parameter(n) for n in _LAYER_WEIGHTS]


def _check_weights(model: Any) -> torch.device:
    """Every parameter on one device (the CPU or one CUDA device) in f32 / bf16 (the model may
    have moved since patch); returns that device."""
    dev = model.model.embed_tokens.weight.device
    for name, p in model.named_parameters():
        if p.device != dev:
            raise Error(
                f"lockstep.hf: parameter {name} is on {p.device}, the embedding on {dev}: "
                "every parameter must be on one device"
            )
        if p.device.type not in ("cpu", "cuda"):
            raise Error(f"lockstep.hf: parameter {name} is on {p.device}: CPU or CUDA only")
        if p.dtype not in (torch.float32, torch.bfloat16):
            raise Error(f"lockstep.hf: parameter {name} is {p.dtype}; expected float32 or bfloat16")
    if dev.type == "cuda" and not _C.cuda_build:
        raise Error(
            "lockstep.hf: the model is on CUDA but lockstep._C is a CPU build "
            "(pip install . -C cmake.define.LOCKSTEP_CUDA=ON)"
        )
    return dev


def _stream(model: Any, st: _Setup, ids: Tensor, positions: Tensor, cu: Tensor, steps: Tensor):
    """(out, res, lm_w): the f32 stream (bf16 values) of the last layer into the final norm, and
    the lm_head weight the head uses."""
    dev = _check_weights(model)
    ids, positions = ids.to(dev), positions.to(dev)
    embed = model.model.embed_tokens.weight
    lm_w = model.lm_head.weight
    if st.tied and embed.dtype == torch.bfloat16 and _acc_of(embed) is None:
        embed, lm_w = _tie(embed)
    res = _embed(ids, embed, cu, steps)
    out = None
    for layer in model.model.layers:
        weights = _layer_weights(layer)
        outs = _layer(
            out, res, weights, positions, cu, steps, list(st.dims), st.eps, st.theta
        )
        out, res = outs[0], outs[1]
    return out, res, lm_w


def logprobs(
    model: Any,
    input_ids: Any,
    targets: Any,
    *,
    cu_seqlens: Optional[Tensor] = None,
    position_ids: Optional[Tensor] = None,
    temperature: float = 1.0,
    ignore_index: int = -100,
    entropy: bool = True,
    step_indices: Optional[Any] = None,
) -> Tuple[Tensor, Tensor]:
    """(logp [T] f32, entropy [T] f32) of softmax(h·Wᵀ / temperature) at each row's target, by
    the contract's linear log-prob head (§L: no [T, V] logits), with autograd (§B.10).

    input_ids [T] or [1, T]; packing by ``cu_seqlens`` (int32 [B+1], host) or ``position_ids``
    (HF padding-free, [1, T]); targets [T] or [1, T] in [0, V) or ``ignore_index`` (< 0: logp
    +0 with no gradient; the row's entropy is still computed, §L). ``entropy=False`` returns the
    entropy without a gradient (the backward then takes no entropy gradient: g_ent None).
    ``step_indices`` [B]: each sequence's step index (B.1; default 0 .. B-1; in accumulate mode
    the micro-batches' indices must ascend across backward calls). Bitwise equal to
    ``lockstep.Engine.score`` / the rollout's recorded values and, backward, to the C++ model
    backward (see the module docstring). Works under ``torch.compile`` (plain mode; the host-side
    checks of the packing break the graph).
    """
    st = _setup_of(model)
    ids, positions, cu, steps = _packing(st, input_ids, cu_seqlens, position_ids, step_indices)
    tg = _flat_tokens("targets", targets)
    t = ids.shape[0]
    if tg.shape[0] != t:
        raise Error(f"lockstep.hf: targets has {tg.shape[0]} entries for T = {t} tokens")
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"lockstep.hf: ignore_index must be an int, got {ignore_index!r}")
    if ignore_index >= 0:
        raise Error(f"lockstep.hf: ignore_index must be < 0 (§L), got {ignore_index}")
    bad = ((tg < 0) | (tg >= st.vocab)) & (tg != ignore_index)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise Error(
            f"lockstep.hf: targets[{i}] = {int(tg[i])} is outside the vocabulary [0, {st.vocab}) "
            f"and not ignore_index ({ignore_index})"
        )
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not (
        0.0 < float(temperature) < math.inf
    ):
        raise Error(f"lockstep.hf: temperature must be finite and > 0, got {temperature!r}")
    run = _logprobs_eager if _accumulating(model) else _logprobs_ops
    logp, ent = run(model, st, ids, positions, cu, steps, tg, float(temperature), ignore_index)
    return logp, (ent if entropy else ent.detach())


def _accumulating(model: Any) -> bool:
    return _acc_of(model.model.norm.weight) is not None


def _logprobs_ops(model, st, ids, positions, cu, steps, tg, temperature, ignore_index):
    out, res, lm_w = _stream(model, st, ids, positions, cu, steps)
    logp, _, ent, _, _ = _head(
        out, res, model.model.norm.weight, lm_w, tg.to(out.device), temperature, ignore_index,
        cu, steps,
        list(st.dims), st.eps,
    )
    return logp, ent


# NOTE: accumulate mode mutates the parameters' main_grad buffers from the backward formulas,
# which only eager autograd runs with the real parameters: inside a torch.compile'd function
# that part runs eagerly (a graph break), never traced into plain-mode gradients.
_logprobs_eager = torch.compiler.disable(_logprobs_ops)


def _base_model_forward(
    self: Any,
    input_ids: Any = None,
    attention_mask: Any = None,
    position_ids: Any = None,
    cache: Any = None,
    inputs_embeds: Any = None,
    use_cache: Any = None,
    *,
    cu_seqlens: Optional[Tensor] = None,
    **kwargs: Any,
):
    """Qwen3Model.forward on lockstep's ops: last_hidden_state [1, T, H] f32 (bf16 values), the
    final-normed hidden states of the packed sequences."""
    from transformers.modeling_outputs import BaseModelOutputWithPast

    hidden, _ = _hidden_states(
        self, input_ids, attention_mask, position_ids, cache, inputs_embeds, cu_seqlens, kwargs
    )
    return BaseModelOutputWithPast(last_hidden_state=hidden[None])


def _hidden_states(base, input_ids, attention_mask, position_ids, cache, inputs_embeds,
                   cu_seqlens, kwargs) -> Tensor:
    model = base._lockstep_owner
    st = _setup_of(model)
    if inputs_embeds is not None:
        raise Error("lockstep.hf: inputs_embeds is not supported (pass input_ids)")
    if cache is not None or kwargs.get("past_key_values") is not None:
        raise Error("lockstep.hf: a KV cache is not supported (packed training forward only)")
    if attention_mask is not None and not bool((torch.as_tensor(attention_mask) == 1).all()):
        raise Error(
            "lockstep.hf: attention_mask with padding is not supported: pack the sequences "
            "(cu_seqlens or position_ids) instead"
        )
    if _accumulating(model) and torch.is_grad_enabled():
        raise Error(
            "lockstep.hf: accumulate mode differentiates lockstep.hf.logprobs only: call "
            "model(...) under torch.no_grad() or GradAccumulator.remove() first"
        )
    ids, positions, cu, steps = _packing(st, input_ids, cu_seqlens, position_ids, None)
    out, res, lm_w = _stream(model, st, ids, positions, cu, steps)
    hidden, _ = _final_norm(out, res, model.model.norm.weight, st.eps)
    return hidden, lm_w


def _causal_lm_forward(
    self: Any,
    input_ids: Any = None,
    attention_mask: Any = None,
    position_ids: Any = None,
    cache: Any = None,
    inputs_embeds: Any = None,
    labels: Any = None,
    use_cache: Any = None,
    logits_to_keep: Union[int, Tensor] = 0,
    *,
    cu_seqlens: Optional[Tensor] = None,
    **kwargs: Any,
):
    """Qwen3ForCausalLM.forward on lockstep's ops: logits [1, T, V] f32 = lockstep's GEMM (one
    K segment) of the final hidden states and round_bf16(lm_head.weight). NOT the contract's
    log-prob: log-softmax of these in torch differs from lockstep.hf.logprobs (which is what the
    rollout records); gradients through them are torch's (rounded to bf16 at the GEMM)."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    import lockstep.torch as lt

    if labels is not None:
        raise Error(
            "lockstep.hf: labels are not supported by the patched forward: use "
            "lockstep.hf.logprobs(model, input_ids, targets, ...) (the contract's log-prob)"
        )
    hidden, w = _hidden_states(
        self.model, input_ids, attention_mask, position_ids, cache, inputs_embeds, cu_seqlens,
        kwargs,
    )
    if isinstance(logits_to_keep, int) and logits_to_keep > 0:
        hidden = hidden[-logits_to_keep:]
    elif isinstance(logits_to_keep, Tensor):
        hidden = hidden[logits_to_keep]
    logits = lt.linear(
        hidden.to(torch.bfloat16),
        w if w.dtype == torch.bfloat16 else w.to(torch.bfloat16),
        out_dtype=torch.float32,
    )
    return CausalLMOutputWithPast(logits=logits[None])


# ---- accumulate mode ----------------------------------------------------------------------------


class GradAccumulator:
    """Accumulate mode (like Megatron's ``main_grad``): every parameter gets ``p.main_grad``, an
    fp32 buffer (+0) that the backward of ``lockstep.hf.logprobs`` continues in place, one chain
    per weight across micro-batches in the canonical order (B.1), exactly as the C++
    ``engine::Gradients``; ``p.grad`` stays None. Micro-batches must come in step order: a
    backward whose smallest step index is not above every index accepted so far raises
    lockstep.Error before any buffer changes. A tied embedding's lm_head part accumulates apart;
    ``finish()`` combines them once (B.7, Gradients::finish). Runs eagerly, also inside a
    torch.compile'd function (a graph break).
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        st = _setup_of(model)
        self._params = dict(model.named_parameters())
        for name, p in self._params.items():
            if getattr(p, "_lockstep_acc", None) is not None:
                raise Error(f"lockstep.hf.GradAccumulator: parameter {name} already has one")
        for p in self._params.values():
            p.main_grad = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            p._lockstep_acc = self
        embed = model.model.embed_tokens.weight
        self._tied = (
            torch.zeros(embed.shape, dtype=torch.float32, device=embed.device) if st.tied else None
        )
        if st.tied:
            embed._lockstep_tied_lm_grad = self._tied
        self._last = -1
        self._finished = False

    def _accept(self, step_indices: Tensor) -> None:
        if self._finished:
            raise Error("lockstep.hf.GradAccumulator: finish() was called: reset() first")
        steps = step_indices.tolist()
        if not steps:
            return
        if min(steps) <= self._last:
            raise Error(
                f"lockstep.hf.GradAccumulator: a micro-batch with step indices {steps} after step "
                f"index {self._last}: micro-batches must come in the step's canonical order (B.1)"
            )
        self._last = max(steps)

    @property
    def last_step_index(self) -> int:
        return self._last

    def finish(self) -> Dict[str, Tensor]:
        """Combines a tied embedding's two parts (dE = d_lm_head ⊕ d_embed, once) and returns
        {HF name: p.main_grad} (f32)."""
        if self._finished:
            raise Error("lockstep.hf.GradAccumulator: already finished (reset() first)")
        self._finished = True
        if self._tied is not None:
            e = self.model.model.embed_tokens.weight.main_grad
            _C.gemm_combine([self._tied, e], e)
        return {name: p.main_grad for name, p in self._params.items()}

    def reset(self) -> None:
        """+0 in every buffer and a fresh step order (the next training step)."""
        for p in self._params.values():
            p.main_grad.zero_()
        if self._tied is not None:
            self._tied.zero_()
        self._last = -1
        self._finished = False

    def remove(self) -> None:
        """Leaves accumulate mode (the buffers are dropped)."""
        for p in self._params.values():
            for attr in ("main_grad", "_lockstep_acc", "_lockstep_tied_lm_grad"):
                if hasattr(p, attr):
                    delattr(p, attr)
