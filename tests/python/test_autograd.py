"""Autograd through lockstep.torch: the gradients are the library's backward ops bit for bit
(called directly through lockstep._C), identical run to run and for any thread count."""

import pytest
import torch

import cases
import lockstep
import lockstep.torch as lt
from conftest import assert_bitwise, cu, randn
from lockstep import _C

EPS = 1e-6


def f32(t):
    return t.detach().to(torch.float32).contiguous()


# Each case: (inputs, forward(inputs) -> outputs to backprop, expected(inputs, grads) -> the
# expected gradient of each input requiring grad, from the _C backward ops).


def linear_case(gen):
    d = cases.linear(gen, T=9)
    order = cu(4, 5)

    def forward(d):
        return [lt.linear(d["x"], d["w"], dx_segments=2, cu_seqlens=order)]

    def expected(d, g):
        (gy,) = g
        dx = torch.empty(d["x"].shape, dtype=torch.bfloat16)
        dw = torch.zeros(d["w"].shape)
        _C.gemm_dx(gy, d["w"].detach(), dx, 2)
        _C.gemm_dw(gy, d["x"].detach(), dw, order)
        return {"x": dx, "w": dw.bfloat16()}

    return d, forward, expected


def rmsnorm_case(gen):
    d = {"x": randn(gen, 6, 3, 16, requires_grad=True), "w": randn(gen, 16, requires_grad=True)}
    order = cu(2, 4)

    def forward(d):
        return [lt.rmsnorm(d["x"], d["w"], EPS, cu_seqlens=order)]

    def expected(d, g):
        dx = torch.empty(d["x"].shape)
        dw = torch.zeros(16)
        _C.rmsnorm_backward(d["x"].detach(), d["w"].detach(), f32(g[0]), dx, dw, order, None, EPS)
        return {"x": dx.bfloat16(), "w": dw.bfloat16()}

    return d, forward, expected


def rmsnorm_residual_case(gen):
    d = {
        "x": randn(gen, 7, 40, requires_grad=True),
        "r": randn(gen, 7, 40, requires_grad=True),
        "w": randn(gen, 40, requires_grad=True),
    }

    def forward(d):
        return list(lt.rmsnorm_residual(d["x"], d["r"], d["w"], EPS))

    def expected(d, g):
        y, s = lt.rmsnorm_residual(d["x"].detach(), d["r"].detach(), d["w"].detach(), EPS)
        ds = torch.empty(s.shape)
        dw = torch.zeros(40)
        _C.rmsnorm_residual_backward(
            s, d["w"].detach(), f32(g[0]), f32(g[1]), ds, dw, None, None, EPS
        )
        return {"x": ds.bfloat16(), "r": ds.bfloat16(), "w": dw.bfloat16()}

    return d, forward, expected


def rope_case(gen):
    d = {"x": randn(gen, 6, 3, 16, requires_grad=True)}
    pos = cases.positions((2, 4))

    def forward(d):
        return [lt.rope(d["x"], pos, 1e6, 64)]

    def expected(d, g):
        dx = torch.empty(d["x"].shape)
        _C.rope_backward(f32(g[0]), pos, dx, 1e6, 64)
        return {"x": dx.bfloat16()}

    return d, forward, expected


def silu_mul_case(gen):
    d = {"g": randn(gen, 5, 24, requires_grad=True), "u": randn(gen, 5, 24, requires_grad=True)}

    def forward(d):
        return [lt.silu_mul(d["g"], d["u"])]

    def expected(d, g):
        dgu = torch.empty(5, 48)
        _C.silu_mul_backward(torch.cat([d["g"], d["u"]], 1).detach(), f32(g[0]), dgu)
        return {"g": dgu[:, :24].bfloat16(), "u": dgu[:, 24:].bfloat16()}

    return d, forward, expected


def embedding_case(gen):
    d = {"table": randn(gen, 50, 24, requires_grad=True)}
    ids = torch.tensor([3, 0, 49, 3, 7, 3], dtype=torch.int32)
    order = cu(4, 2)

    def forward(d):
        return [lt.embedding(ids, d["table"], cu_seqlens=order)]

    def expected(d, g):
        dt = torch.zeros(50, 24)
        _C.embedding_backward(ids, f32(g[0]), dt, order)
        return {"table": dt.bfloat16()}

    return d, forward, expected


def attention_case(gen):
    d = cases.attention(gen)
    d = {k: d[k] for k in ("q", "k", "v")}
    seqs = cu(3, 0, 5, 1)

    def forward(d):
        return [lt.attention_varlen(d["q"], d["k"], d["v"], seqs)[0]]

    def expected(d, g):
        q, k, v = (d[n].detach() for n in ("q", "k", "v"))
        out, lse = lt.attention_varlen(q, k, v, seqs)
        dq, dk, dv = torch.empty(q.shape), torch.empty(k.shape), torch.empty(v.shape)
        _C.attention_backward_varlen(q, k, v, out, lse, g[0], seqs, dq, dk, dv)
        return {"q": dq.bfloat16(), "k": dk.bfloat16(), "v": dv.bfloat16()}

    return d, forward, expected


def logprob_case(gen):
    d = cases.logprob(gen)
    targets = d.pop("targets")
    contract = lockstep.Contract(vocab_tile=64, vocab_segments=2)
    order = cu(2, 4)

    def forward(d):
        logp, _, ent = lt.linear_logprob(
            d["h"], d["w"], targets, temperature=0.7, contract=contract, cu_seqlens=order
        )
        return [logp, ent]

    def expected(d, g):
        h, w = d["h"].detach(), d["w"].detach()
        _, lse, ent = lt.linear_logprob(h, w, targets, temperature=0.7, contract=contract)
        dh, dw = torch.empty(h.shape), torch.zeros(w.shape)
        _C.linear_logprob_backward(
            h, w, targets, lse, ent, g[0], g[1], dh, dw, 0.7, -1, contract.to_c(), order
        )
        return {"h": dh.bfloat16(), "w": dw.bfloat16()}

    return d, forward, expected


CASES = {
    "linear": linear_case,
    "rmsnorm": rmsnorm_case,
    "rmsnorm_residual": rmsnorm_residual_case,
    "rope": rope_case,
    "silu_mul": silu_mul_case,
    "embedding": embedding_case,
    "attention_varlen": attention_case,
    "linear_logprob": logprob_case,
}


def run(make, seed=5):
    """Inputs, upstream gradients and the autograd gradients of one case."""
    gen = torch.Generator().manual_seed(seed)
    d, forward, expected = make(gen)
    outs = forward(d)
    grads = [randn(gen, *o.shape, dtype=o.dtype) for o in outs]
    torch.autograd.backward(outs, grads)
    return d, grads, expected, {k: v.grad for k, v in d.items()}


@pytest.mark.parametrize("name", CASES)
def test_grad_equals_backward_binding(name):
    d, grads, expected, got = run(CASES[name])
    want = expected(d, grads)
    assert set(want) == set(got)
    for k in want:
        assert_bitwise(got[k], want[k], f"{name} d{k}")


@pytest.mark.parametrize("name", CASES)
def test_grad_run_to_run_and_threads(name):
    _, _, _, first = run(CASES[name])
    threads = lockstep.num_threads()
    try:
        lockstep.set_num_threads(1)
        _, _, _, single = run(CASES[name])
    finally:
        lockstep.set_num_threads(threads)
    _, _, _, again = run(CASES[name])
    for k in first:
        assert_bitwise(first[k], again[k], f"{name} d{k} rerun")
        assert_bitwise(first[k], single[k], f"{name} d{k} 1 thread")


def test_linear_forward_equals_binding(gen):
    d = cases.linear(gen, rg=False)
    y = torch.empty(5, 24)
    _C.gemm(d["x"], d["w"], None, y, 2)
    assert_bitwise(
        lt.linear(
            d["x"], d["w"], contract=lockstep.Contract(gemm_segments=2), out_dtype=torch.float32
        ),
        y,
    )


def test_linear_role_column_uses_one_segment(gen):
    d = cases.linear(gen, rg=False)
    four = lockstep.Contract(gemm_segments=4)
    column = lt.linear(d["x"], d["w"], contract=four, role="column", out_dtype=torch.float32)
    one = torch.empty(5, 24)
    _C.gemm(d["x"], d["w"], None, one, 1)
    assert_bitwise(column, one)
    row = lt.linear(d["x"], d["w"], contract=four, out_dtype=torch.float32)
    assert not torch.equal(row, column), "S = 4 and S = 1 agree here: the check is blind"
    with pytest.raises(ValueError, match="role must be"):
        lt.linear(d["x"], d["w"], role="vocab")


def test_lse_has_no_gradient(gen):
    a = cases.attention(gen)
    _, lse = lt.attention_varlen(a["q"], a["k"], a["v"], a["cu_seqlens"])
    assert not lse.requires_grad
    p = cases.logprob(gen)
    logp, lse, ent = lt.linear_logprob(p["h"], p["w"], p["targets"])
    assert logp.requires_grad and ent.requires_grad and not lse.requires_grad


def test_linear_bias_has_no_gradient(gen):
    d = cases.linear(gen)
    bias = randn(gen, 24, requires_grad=True)
    y = lt.linear(d["x"], d["w"], bias)
    with pytest.raises(RuntimeError, match="no bias gradient"):
        y.float().sum().backward()


def test_logprob_without_entropy_gradient(gen):
    """logp alone: the backward gets g_ent = None, as the C++ call without an entropy gradient."""
    p = cases.logprob(gen)
    h, w = p["h"], p["w"]
    logp, lse, ent = lt.linear_logprob(h, w, p["targets"])
    g = randn(gen, *logp.shape, dtype=torch.float32)
    logp.backward(g)
    dh, dw = torch.empty(h.shape), torch.zeros(w.shape)
    _C.linear_logprob_backward(
        h.detach(), w.detach(), p["targets"], lse, ent.detach(), g, None, dh, dw
    )
    assert_bitwise(h.grad, dh.bfloat16(), "dh")
    assert_bitwise(w.grad, dw.bfloat16(), "dw")


@pytest.mark.parametrize("name", CASES)
def test_broadcast_upstream_gradients(name):
    """out.sum().backward() hands the ops expanded (stride 0) gradients: they are made contiguous
    before they reach the library, with the same bits as a contiguous ones tensor."""
    gen = torch.Generator().manual_seed(5)
    d, forward, _ = CASES[name](gen)
    outs = forward(d)
    sum(o.sum() for o in outs).backward()
    got = {k: v.grad for k, v in d.items()}
    gen = torch.Generator().manual_seed(5)
    d, forward, _ = CASES[name](gen)
    outs = forward(d)
    torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    for k, v in d.items():
        assert_bitwise(got[k], v.grad, f"{name} d{k}")


def test_nan_is_canonical_through_autograd(gen):
    """A NaN with a payload in x gives the canonical NaN (0x7FC0) in y and in the gradients, as the
    library stores every NaN (dtype.h)."""
    x = randn(gen, 3, 16)
    x.view(torch.int16)[1, 2] = 0x7F81  # a signalling-payload NaN
    x.requires_grad_()
    w = randn(gen, 4, 16, requires_grad=True)
    y = lt.linear(x, w)
    y.backward(torch.ones_like(y))
    assert set(y[1].view(torch.int16).tolist()) == {0x7FC0}
    assert set(w.grad[:, 2].view(torch.int16).tolist()) == {0x7FC0}
    assert not torch.isnan(y[0]).any() and not torch.isnan(x.grad).any()


def _given_setup(gen):
    """A log-prob case and its forward outputs (the 'rollout's'), no gradient."""
    p = cases.logprob(gen)
    with torch.no_grad():
        logp, lse, ent = lt.linear_logprob(p["h"], p["w"], p["targets"])
    return p, logp, lse, ent


def test_logprob_given_has_the_gradients_of_linear_logprob(gen):
    """linear_logprob_given with the forward's own outputs: the same (logp, entropy) bits and the
    same dh, dw as linear_logprob's autograd, with and without an entropy gradient; the ignored
    row may carry any finite lse and entropy 0 when its entropy gradient is 0."""
    p, logp, lse, ent = _given_setup(gen)
    g = randn(gen, *logp.shape, dtype=torch.float32)
    g_e = randn(gen, *logp.shape, dtype=torch.float32)
    for with_ent in (True, False):
        h0, w0 = p["h"].detach().clone().requires_grad_(), p["w"].detach().clone().requires_grad_()
        lp0, _, e0 = lt.linear_logprob(h0, w0, p["targets"])
        h1, w1 = p["h"].detach().clone().requires_grad_(), p["w"].detach().clone().requires_grad_()
        lse_g, ent_g = lse.clone(), ent.clone()
        if not with_ent:  # the ignored row (targets[1] = -1): any finite lse, entropy 0
            lse_g[1], ent_g[1] = 1e30, 0.0
        lp1, e1 = lt.linear_logprob_given(h1, w1, p["targets"], logp, lse_g, ent_g)
        assert_bitwise(lp1, logp, "logp passes through")
        assert_bitwise(e1, ent_g, "entropy passes through")
        if with_ent:
            torch.autograd.backward([lp0, e0], [g, g_e])
            torch.autograd.backward([lp1, e1], [g, g_e])
        else:
            lp0.backward(g)
            lp1.backward(g)
        assert_bitwise(h1.grad, h0.grad, f"dh (entropy gradient: {with_ent})")
        assert_bitwise(w1.grad, w0.grad, f"dw (entropy gradient: {with_ent})")


@pytest.mark.parametrize("what", ["logp", "lse", "entropy", "ignored row with entropy gradient"])
def test_logprob_given_wrong_value_raises(gen, what):
    """One given bit that differs from the trainer's, where the gradients depend on it: the
    backward raises and returns no gradient."""
    p, logp, lse, ent = _given_setup(gen)
    logp, lse, ent = logp.clone(), lse.clone(), ent.clone()
    row = 1 if what.startswith("ignored") else 0
    t = {"logp": logp, "lse": lse, "entropy": ent}.get(what, lse)
    t.view(torch.int32)[row] ^= 1
    h, w = p["h"].detach().clone().requires_grad_(), p["w"].detach().clone().requires_grad_()
    lp, e = lt.linear_logprob_given(h, w, p["targets"], logp, lse, ent)
    with pytest.raises(RuntimeError, match=f"differ from the trainer's, first at row {row}"):
        torch.autograd.backward([lp, e], [torch.ones_like(lp), torch.ones_like(e)])
    assert h.grad is None and w.grad is None
