"""torch.compile (inductor, fullgraph) of small functions built from lockstep ops gives the same
bits as eager, forward and gradients: the fake implementations trace, the ops run unchanged."""

import pytest
import torch

import lockstep.torch as lt
from conftest import assert_bitwise, cu, randn

I = 24


def mlp_block(x, nw, w_gu, w_down, res):
    y, s = lt.rmsnorm_residual(x, res, nw)
    gu = lt.linear(y, w_gu)
    a = lt.silu_mul(gu[:, :I], gu[:, I:])
    return lt.linear(a, w_down), s


def attention_head(xq, xk, xv, wq, wk, wv, w_lm, positions, cu_seqlens, targets):
    T = xq.shape[0]
    q = lt.rope(lt.linear(xq, wq).view(T, 2, 16), positions, 1e6, 128)
    k = lt.rope(lt.linear(xk, wk).view(T, 1, 16), positions, 1e6, 128)
    v = lt.linear(xv, wv).view(T, 1, 16)
    o, _ = lt.attention_varlen(q, k, v, cu_seqlens)
    logp, _, ent = lt.linear_logprob(o.view(T, 32), w_lm, targets, cu_seqlens=cu_seqlens)
    return logp.sum() + 0.01 * ent.sum()


def eager_and_compiled(fn, inputs, consts=(), grads=None):
    results = []
    for f in (fn, torch.compile(fn, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        outs = f(*leaves, *consts)
        outs = outs if isinstance(outs, tuple) else (outs,)
        torch.autograd.backward(outs, grads if grads is not None else None)
        results.append((outs, [t.grad for t in leaves]))
    return results


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_mlp_block_same_bits(gen):
    T, H = 9, 40
    inputs = [
        randn(gen, T, H),
        randn(gen, H),
        randn(gen, 2 * I, H, scale=0.2),
        randn(gen, H, I, scale=0.2),
        randn(gen, T, H),
    ]
    grads = [randn(gen, T, H), randn(gen, T, H)]
    (eo, eg), (co, cg) = eager_and_compiled(mlp_block, inputs, grads=grads)
    for i, (a, b) in enumerate(zip(eo, co)):
        assert_bitwise(b, a, f"output {i}")
    for i, (a, b) in enumerate(zip(eg, cg)):
        assert_bitwise(b, a, f"grad {i}")


def test_compiled_attention_logprob_same_bits(gen):
    # q, k and v each read their own leaf (copies of one x): were one x to feed the three
    # linears, autograd would sum their bf16 dx with torch's arithmetic, which inductor fuses
    # differently from eager in some torch versions (1-ulp differences under torch 2.11's
    # inductor even with emulate_precision_casts) — not lockstep's ops.
    lens = (3, 6)
    T = sum(lens)
    x = randn(gen, T, 32)
    inputs = [
        x,
        x.clone(),
        x.clone(),
        randn(gen, 32, 32, scale=0.2),
        randn(gen, 16, 32, scale=0.2),
        randn(gen, 16, 32, scale=0.2),
        randn(gen, 70, 32, scale=0.3),
    ]
    positions = torch.cat([torch.arange(n) for n in lens])
    consts = (positions, cu(*lens), torch.randint(0, 70, (T,), generator=gen))
    (eo, eg), (co, cg) = eager_and_compiled(attention_head, inputs, consts)
    assert_bitwise(co[0], eo[0], "loss")
    for i, (a, b) in enumerate(zip(eg, cg)):
        assert_bitwise(b, a, f"grad {i}")
