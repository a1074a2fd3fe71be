"""Small inputs for every lockstep.torch op: odd sizes (K not a multiple of 16, V not a multiple
of the vocab tile, empty and one-token sequences)."""

import torch

from conftest import cu, randn

C = [1, 1024, 256, 1]  # the default contract as the ops' int list


def linear(gen, T=5, K=40, N=24, rg=True):
    return dict(
        x=randn(gen, T, K, requires_grad=rg),
        w=randn(gen, N, K, scale=0.2, requires_grad=rg),
    )


def logprob(gen, T=6, H=32, V=300, rg=True):
    targets = torch.randint(0, V, (T,), generator=gen)
    targets[1] = -1  # ignored
    return dict(
        h=randn(gen, T, H, requires_grad=rg),
        w=randn(gen, V, H, scale=0.3, requires_grad=rg),
        targets=targets,
    )


def attention(gen, lens=(3, 0, 5, 1), Hq=4, Hkv=2, D=16, rg=True):
    T = sum(lens)
    return dict(
        q=randn(gen, T, Hq, D, requires_grad=rg),
        k=randn(gen, T, Hkv, D, requires_grad=rg),
        v=randn(gen, T, Hkv, D, requires_grad=rg),
        cu_seqlens=cu(*lens),
    )


def positions(lens):
    return torch.cat([torch.arange(n, dtype=torch.int32) for n in lens])


def op_cases(gen):
    """(name, op, args) for opcheck: every forward op (inputs requiring grad) and backward op."""
    ops = torch.ops.lockstep
    L = linear(gen)
    cases = [
        ("linear", ops.linear, (L["x"], L["w"], None, 1, False, 1, None, None)),
        ("linear_seg_f32", ops.linear, (L["x"], L["w"], None, 2, True, 2, cu(2, 3), None)),
    ]
    dy = randn(gen, 5, 24)
    cases.append(
        (
            "linear_backward",
            ops.linear_backward,
            (dy, L["x"].detach(), L["w"].detach(), 1, cu(2, 3), None),
        )
    )

    x = randn(gen, 7, 40, requires_grad=True)
    wn = (1 + randn(gen, 40, scale=0.1, dtype=torch.float32)).bfloat16().requires_grad_()
    cases.append(("rmsnorm", ops.rmsnorm, (x, wn, 1e-6, None, None)))
    xh = randn(gen, 7, 3, 16, requires_grad=True)
    wh = (1 + randn(gen, 16, scale=0.1, dtype=torch.float32)).bfloat16().requires_grad_()
    cases.append(("rmsnorm_heads", ops.rmsnorm, (xh, wh, 1e-6, cu(3, 4), None)))
    cases.append(
        (
            "rmsnorm_backward",
            ops.rmsnorm_backward,
            (randn(gen, 7, 40, dtype=torch.float32), x.detach(), wn.detach(), 1e-6, None, None),
        )
    )
    res = randn(gen, 7, 40, requires_grad=True)
    cases.append(("rmsnorm_residual", ops.rmsnorm_residual, (x, res, wn, 1e-6, cu(7), None)))
    cases.append(
        (
            "rmsnorm_residual_backward",
            ops.rmsnorm_residual_backward,
            (
                randn(gen, 7, 40, dtype=torch.float32),
                randn(gen, 7, 40, dtype=torch.float32),
                x.detach(),
                wn.detach(),
                1e-6,
                None,
                None,
            ),
        )
    )

    xr = randn(gen, 6, 3, 16, requires_grad=True)
    pos = positions((2, 4))
    cases.append(("rope", ops.rope, (xr, pos, 1e6, 64)))
    cases.append(
        (
            "rope_backward",
            ops.rope_backward,
            (randn(gen, 6, 3, 16, dtype=torch.float32), pos, 1e6, 64, torch.bfloat16),
        )
    )

    g, u = randn(gen, 5, 24, requires_grad=True), randn(gen, 5, 24, requires_grad=True)
    cases.append(("silu_mul", ops.silu_mul, (g, u)))
    cases.append(
        (
            "silu_mul_backward",
            ops.silu_mul_backward,
            (randn(gen, 5, 24, dtype=torch.float32), torch.cat([g, u], 1).detach()),
        )
    )

    ids = torch.tensor([3, 0, 49, 3, 7], dtype=torch.int64)
    table = randn(gen, 50, 24, requires_grad=True)
    cases.append(("embedding", ops.embedding, (ids, table, cu(2, 3), None)))
    cases.append(
        (
            "embedding_backward",
            ops.embedding_backward,
            (randn(gen, 5, 24, dtype=torch.float32), ids, 50, None, None, torch.bfloat16),
        )
    )

    A = attention(gen)
    cases.append(
        (
            "attention_varlen",
            ops.attention_varlen,
            (A["q"], A["k"], A["v"], A["cu_seqlens"], 1024, 0.0),
        )
    )
    out, lse = ops.attention_varlen(
        A["q"].detach(), A["k"].detach(), A["v"].detach(), A["cu_seqlens"], 1024, 0.0
    )
    cases.append(
        (
            "attention_varlen_backward",
            ops.attention_varlen_backward,
            (
                randn(gen, *out.shape),
                A["q"].detach(),
                A["k"].detach(),
                A["v"].detach(),
                out,
                lse,
                A["cu_seqlens"],
                1024,
                0.0,
            ),
        )
    )

    P = logprob(gen)
    cases.append(
        (
            "linear_logprob",
            ops.linear_logprob,
            (P["h"], P["w"], P["targets"], 1.0, -1, C, None, None),
        )
    )
    cases.append(
        (
            "linear_logprob_t07_seg",
            ops.linear_logprob,
            (P["h"], P["w"], P["targets"], 0.7, -1, [1, 1024, 64, 2], cu(2, 4), None),
        )
    )
    _, lse, ent = ops.linear_logprob(
        P["h"].detach(), P["w"].detach(), P["targets"], 1.0, -1, C, None, None
    )
    cases.append(
        (
            "linear_logprob_backward",
            ops.linear_logprob_backward,
            (
                randn(gen, 6, dtype=torch.float32),
                randn(gen, 6, dtype=torch.float32),
                P["h"].detach(),
                P["w"].detach(),
                P["targets"],
                lse,
                ent,
                1.0,
                -1,
                C,
                None,
                None,
            ),
        )
    )

    logp_f, lse_f, ent_f = ops.linear_logprob(P["h"], P["w"], P["targets"], 1.0, -1, C, None, None)
    logp_f, lse_f, ent_f = logp_f.detach(), lse_f.detach(), ent_f.detach()
    cases.append(
        (
            "linear_logprob_given",
            ops.linear_logprob_given,
            (P["h"], P["w"], P["targets"], logp_f, lse_f, ent_f, 1.0, -1, C, None, None),
        )
    )
    cases.append(
        (
            "linear_logprob_given_backward",
            ops.linear_logprob_given_backward,
            (
                randn(gen, 6, dtype=torch.float32),
                randn(gen, 6, dtype=torch.float32),
                P["h"].detach(),
                P["w"].detach(),
                P["targets"],
                logp_f,
                lse_f,
                ent_f,
                1.0,
                -1,
                C,
                None,
                None,
            ),
        )
    )

    S = logprob(gen, T=4, rg=False)
    T = 4
    cases.append(
        (
            "sample",
            ops.sample,
            (
                S["h"],
                S["w"],
                torch.arange(T, dtype=torch.int64) + 100,
                torch.arange(T, dtype=torch.int32),
                torch.full((T,), 7, dtype=torch.int64),
                torch.tensor([1.0, 0.0, 0.7, 1.3]),
                torch.tensor([0, 0, 5, 0]),
                torch.tensor([1.0, 1.0, 0.9, 0.8]),
                torch.tensor([0.0, 0.0, 0.0, 0.05]),
                C,
            ),
        )
    )
    return cases
