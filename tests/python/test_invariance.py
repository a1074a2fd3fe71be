"""Batch invariance through lockstep.torch, bitwise: a row (a sequence, for attention) computed
alone equals the same row inside a larger batch, forward and per-token gradients; the weight
gradient does not depend on how the sequences are packed (the token order is by step index)."""

import torch

import cases
import lockstep.torch as lt
from conftest import assert_bitwise, cu, randn

ROWS = (0, 7, 16)  # rows of a 17-row batch checked alone


def rows_alone_vs_batch(fn, inputs, gy, what):
    """fn(*row_inputs) -> y; inputs and gy have 17 rows; forward and input gradients of each row
    in ROWS computed alone equal the batch's."""
    batch = [t.detach().requires_grad_(t.is_floating_point()) for t in inputs]
    y = fn(*batch)
    y.backward(gy)
    for r in ROWS:
        alone = [t.detach()[r : r + 1].requires_grad_(t.is_floating_point()) for t in inputs]
        ya = fn(*alone)
        ya.backward(gy[r : r + 1])
        assert_bitwise(ya, y[r : r + 1], f"{what} y row {r}")
        for i, (a, b) in enumerate(zip(alone, batch)):
            if a.grad is not None and b.dim() > 0 and a.shape[0] == 1 and b.shape[0] == 17:
                assert_bitwise(a.grad, b.grad[r : r + 1], f"{what} d(input {i}) row {r}")


def test_linear_rows(gen):
    x, w = randn(gen, 17, 40), randn(gen, 24, 40, scale=0.2)
    gy = randn(gen, 17, 24)
    rows_alone_vs_batch(lambda x: lt.linear(x, w), [x], gy, "linear")


def test_rmsnorm_rows(gen):
    x, w = randn(gen, 17, 3, 16), randn(gen, 16)
    rows_alone_vs_batch(lambda x: lt.rmsnorm(x, w), [x], randn(gen, 17, 3, 16), "rmsnorm")


def test_rmsnorm_residual_rows(gen):
    x, r, w = randn(gen, 17, 40), randn(gen, 17, 40), randn(gen, 40)
    rows_alone_vs_batch(
        lambda x, r: lt.rmsnorm_residual(x, r, w)[0], [x, r], randn(gen, 17, 40), "rmsnorm_residual"
    )


def test_rope_rows(gen):
    x = randn(gen, 17, 2, 16)
    pos = torch.arange(17, dtype=torch.int64) * 3
    gy = randn(gen, 17, 2, 16)
    rows_alone_vs_batch(lambda x, p: lt.rope(x, p, 1e6, 64), [x, pos], gy, "rope")


def test_silu_mul_rows(gen):
    g, u = randn(gen, 17, 24), randn(gen, 17, 24)
    rows_alone_vs_batch(lt.silu_mul, [g, u], randn(gen, 17, 24), "silu_mul")


def test_logprob_rows(gen):
    h, w = randn(gen, 17, 32), randn(gen, 300, 32, scale=0.3)
    targets = torch.randint(0, 300, (17,), generator=gen)
    batch = lt.linear_logprob(h, w, targets)
    for r in ROWS:
        alone = lt.linear_logprob(h[r : r + 1], w, targets[r : r + 1])
        for name, a, b in zip(("logp", "lse", "entropy"), alone, batch):
            assert_bitwise(a, b[r : r + 1], f"linear_logprob {name} row {r}")
    # dh of a row depends only on that row (its own g_lp, g_ent).
    g_lp, g_ent = randn(gen, 17, dtype=torch.float32), randn(gen, 17, dtype=torch.float32)
    hb = h.clone().requires_grad_()
    logp, _, ent = lt.linear_logprob(hb, w, targets)
    torch.autograd.backward([logp, ent], [g_lp, g_ent])
    for r in ROWS:
        ha = h[r : r + 1].clone().requires_grad_()
        logp, _, ent = lt.linear_logprob(ha, w, targets[r : r + 1])
        torch.autograd.backward([logp, ent], [g_lp[r : r + 1], g_ent[r : r + 1]])
        assert_bitwise(ha.grad, hb.grad[r : r + 1], f"linear_logprob dh row {r}")


def test_sample_rows(gen):
    h, w = randn(gen, 17, 32), randn(gen, 300, 32, scale=0.3)
    req = torch.arange(17, dtype=torch.int64) + 1000
    pos = torch.arange(17, dtype=torch.int64)
    temp = torch.linspace(0.0, 1.5, 17)
    batch = lt.sample(h, w, req, pos, seed=2**64 - 3, temperature=temp, top_k=20, top_p=0.95)
    for r in ROWS:
        alone = lt.sample(
            h[r : r + 1],
            w,
            req[r : r + 1],
            pos[r : r + 1],
            seed=2**64 - 3,
            temperature=temp[r : r + 1],
            top_k=20,
            top_p=0.95,
        )
        for name, a, b in zip(("token_ids", "logp", "lse", "entropy"), alone, batch):
            assert_bitwise(a, b[r : r + 1], f"sample {name} row {r}")
    again = lt.sample(h, w, req, pos, seed=2**64 - 3, temperature=temp, top_k=20, top_p=0.95)
    for a, b in zip(again, batch):
        assert_bitwise(a, b, "sample rerun")


def test_sample_matches_logprob(gen):
    h, w = randn(gen, 9, 32), randn(gen, 300, 32, scale=0.3)
    ids, logp, lse, ent = lt.sample(
        h, w, torch.arange(9), torch.zeros(9, dtype=torch.int32), seed=11, temperature=0.8
    )
    want = lt.linear_logprob(h, w, ids, temperature=0.8)
    for name, a, b in zip(("logp", "lse", "entropy"), (logp, lse, ent), want):
        assert_bitwise(a, b, f"sample {name} vs linear_logprob")


def attention_rows(lens, gen_seed=3):
    g = torch.Generator().manual_seed(gen_seed)
    return [cases.attention(g, lens=(n,), rg=False) for n in lens]


def test_attention_sequence_alone_vs_packed():
    lens = (5, 1, 0, 70, 3)  # one sequence longer than a 64-key block
    seqs = attention_rows(lens)
    packed = {k: torch.cat([s[k] for s in seqs]).requires_grad_() for k in ("q", "k", "v")}
    out, lse = lt.attention_varlen(packed["q"], packed["k"], packed["v"], cu(*lens))
    g = torch.Generator().manual_seed(9)
    dout = randn(g, *out.shape)
    out.backward(dout)
    row = 0
    for n, s in zip(lens, seqs):
        alone = {k: s[k].clone().requires_grad_() for k in ("q", "k", "v")}
        oa, la = lt.attention_varlen(alone["q"], alone["k"], alone["v"], cu(n))
        oa.backward(dout[row : row + n])
        assert_bitwise(oa, out[row : row + n], f"attention out, sequence of {n}")
        assert_bitwise(la, lse[row : row + n], f"attention lse, sequence of {n}")
        for k in ("q", "k", "v"):
            assert_bitwise(alone[k].grad, packed[k].grad[row : row + n], f"attention d{k} ({n})")
        row += n


def test_weight_grads_independent_of_packing(gen):
    """Sequences A, B packed as A|B (step indices 0, 1) or B|A (step indices 1, 0): the same
    canonical order, so the same weight-gradient bits (B.1)."""
    la, lb = 5, 19
    xa, xb = randn(gen, la, 40), randn(gen, lb, 40)
    ga, gb = randn(gen, la, 24), randn(gen, lb, 24)
    w = randn(gen, 24, 40, scale=0.2)
    nw = randn(gen, 40)
    ids_a, ids_b = (torch.randint(0, 50, (n,), generator=gen) for n in (la, lb))
    table = randn(gen, 50, 40)

    def grads(x, gy, ids, lens, steps):
        order = dict(cu_seqlens=cu(*lens), step_indices=torch.tensor(steps, dtype=torch.int64))
        wl, wn, wt = (t.clone().requires_grad_() for t in (w, nw, table))
        y = lt.linear(x, wl, **order)
        n = lt.rmsnorm(x, wn, **order)
        e = lt.embedding(ids, wt, **order)
        torch.autograd.backward([y, n, e], [gy, x, x])
        return wl.grad, wn.grad, wt.grad

    ab = grads(
        torch.cat([xa, xb]), torch.cat([ga, gb]), torch.cat([ids_a, ids_b]), (la, lb), [0, 1]
    )
    ba = grads(
        torch.cat([xb, xa]), torch.cat([gb, ga]), torch.cat([ids_b, ids_a]), (lb, la), [1, 0]
    )
    for name, a, b in zip(("linear dw", "rmsnorm dweight", "embedding dtable"), ab, ba):
        assert_bitwise(a, b, name)


def test_row_strided_inputs_same_bits(gen):
    """Views with strided rows (the library takes any row stride, last dim contiguous), e.g. the
    halves of a fused gate|up buffer, give the bits of contiguous copies."""
    wide = randn(gen, 9, 64)
    x = wide[:, 8:48]  # [9, 40], row stride 64
    w = randn(gen, 24, 40, scale=0.2)
    assert not x.is_contiguous()
    assert_bitwise(lt.linear(x, w), lt.linear(x.contiguous(), w), "linear")
    nw = randn(gen, 40)
    assert_bitwise(lt.rmsnorm(x, nw), lt.rmsnorm(x.contiguous(), nw), "rmsnorm")
    gu = randn(gen, 9, 48)
    assert_bitwise(
        lt.silu_mul(gu[:, :24], gu[:, 24:]),
        lt.silu_mul(gu[:, :24].contiguous(), gu[:, 24:].contiguous()),
        "silu_mul",
    )
    qkv = randn(gen, 9, 4 * 16)  # fused q|k|v, Hq = 2, Hkv = 1
    q, k, v = (qkv[:, a:b].view(9, -1, 16) for a, b in ((0, 32), (32, 48), (48, 64)))
    seqs = cu(4, 5)
    strided = lt.attention_varlen(q, k, v, seqs)
    contiguous = lt.attention_varlen(q.contiguous(), k.contiguous(), v.contiguous(), seqs)
    for a, b, name in zip(strided, contiguous, ("out", "lse")):
        assert_bitwise(a, b, f"attention {name}")
    pos = torch.arange(9)
    assert_bitwise(lt.rope(q, pos, 1e6, 64), lt.rope(q.contiguous(), pos, 1e6, 64), "rope")


def test_sample_takes_inputs_that_require_grad(gen):
    h = randn(gen, 3, 32, requires_grad=True)
    w = randn(gen, 300, 32, scale=0.3, requires_grad=True)
    ids, logp, _, _ = lt.sample(h, w, torch.arange(3), torch.arange(3), seed=1)
    assert not logp.requires_grad
    assert_bitwise(
        ids, lt.sample(h.detach(), w.detach(), torch.arange(3), torch.arange(3), seed=1)[0]
    )
