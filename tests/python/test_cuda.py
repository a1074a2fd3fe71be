"""lockstep.torch on CUDA tensors: every op's outputs and every autograd gradient are the CPU
op's, bit for bit (the CUDA kernels implement the same contract), on torch's current stream, with
clear errors for what the CUDA path cannot take. Needs a CUDA build of lockstep._C and a GPU;
elsewhere these tests are skipped with the reason (pytest -rs shows it), and with
LOCKSTEP_REQUIRE_CUDA=1 (scripts/gpu_python.sh sets it) a missing GPU or a CPU build fails them
instead, so the GPU run cannot pass without running them."""

import os

import pytest
import torch

import cases
import lockstep
import lockstep.torch as lt
from conftest import assert_bitwise, cu, randn


def _why_not() -> str:
    if not lockstep.cuda_build:
        return "lockstep._C is a CPU build (pip install . -C cmake.define.LOCKSTEP_CUDA=ON)"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return ""


WHY_NOT = _why_not()


@pytest.fixture(autouse=True)
def _needs_cuda():
    if WHY_NOT:
        if os.environ.get("LOCKSTEP_REQUIRE_CUDA") == "1":
            pytest.fail(f"LOCKSTEP_REQUIRE_CUDA=1 but {WHY_NOT}")
        pytest.skip(WHY_NOT)


def _to(a, device):
    """A case argument on `device`: tensors moved (leaves keep requires_grad), the rest as is."""
    if not isinstance(a, torch.Tensor):
        return a
    t = a.detach().to(device)
    return t.requires_grad_() if a.requires_grad else t


def _outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


CASES = cases.op_cases(torch.Generator().manual_seed(7))
IDS = [c[0] for c in CASES]
# The forward ops with a differentiable input: their autograd gradients are compared too.
GRAD_CASES = [c for c in CASES if any(getattr(a, "requires_grad", False) for a in c[2])]


@pytest.mark.parametrize("name,op,args", CASES, ids=IDS)
def test_op_on_cuda_equals_cpu(name, op, args):
    want = _outputs(op(*[_to(a, "cpu") for a in args]))
    got = _outputs(op(*[_to(a, "cuda") for a in args]))
    torch.cuda.synchronize()
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == "cuda", f"{name} output {i} is on {g.device}"
        assert_bitwise(g.cpu(), w, f"{name} output {i} cuda vs cpu")


def _grads(op, args, device, seed=11):
    """The gradients of `op`'s inputs requiring grad, for seeded upstream gradients (made on the
    CPU, so both devices get the same ones)."""
    leaves = [_to(a, device) for a in args]
    outs = [o for o in _outputs(op(*leaves)) if o.requires_grad]
    gen = torch.Generator().manual_seed(seed)
    ups = [randn(gen, *o.shape, dtype=o.dtype).to(device) for o in outs]
    torch.autograd.backward(outs, ups)
    return [a.grad for a in leaves if isinstance(a, torch.Tensor) and a.requires_grad]


@pytest.mark.parametrize("name,op,args", GRAD_CASES, ids=[c[0] for c in GRAD_CASES])
def test_autograd_on_cuda_equals_cpu(name, op, args):
    want = _grads(op, args, "cpu")
    got = _grads(op, args, "cuda")
    again = _grads(op, args, "cuda")
    assert len(got) == len(want) > 0
    for i, (g, w, a) in enumerate(zip(got, want, again)):
        assert_bitwise(g.cpu(), w, f"{name} grad {i} cuda vs cpu")
        assert_bitwise(g, a, f"{name} grad {i} cuda run to run")


@pytest.mark.parametrize("name,op,args", CASES, ids=IDS)
def test_opcheck_on_cuda(name, op, args):
    torch.library.opcheck(op, tuple(_to(a, "cuda") for a in args))


def test_larger_shapes_on_cuda_equal_cpu():
    """Shapes that take several CUDA tiles and token blocks: a 2-segment GEMM with a bias-free
    fp32 output, its backward over 3 packed sequences, attention over sequences longer than one
    64-key block, and a vocab of several tiles."""
    gen = torch.Generator().manual_seed(3)
    lens = (130, 1, 257)
    order = cu(*lens)
    T = sum(lens)
    x = randn(gen, T, 256, requires_grad=True)
    w = randn(gen, 384, 256, scale=0.05, requires_grad=True)
    q = randn(gen, T, 8, 64, requires_grad=True)
    k, v = randn(gen, T, 2, 64, requires_grad=True), randn(gen, T, 2, 64, requires_grad=True)
    h = randn(gen, T, 256, requires_grad=True)
    lm = randn(gen, 1000, 256, scale=0.1, requires_grad=True)
    targets = torch.randint(0, 1000, (T,), generator=gen)
    leaves = [x, w, q, k, v, h, lm]
    ups = {
        "y": randn(gen, T, 384, dtype=torch.float32),
        "attn": randn(gen, T, 8, 64),
        "logp": randn(gen, T, dtype=torch.float32),
    }

    def run(device):
        ls = [_to(t, device) for t in leaves]
        xd, wd, qd, kd, vd, hd, lmd = ls
        y = lt.linear(
            xd, wd, contract=lockstep.Contract(gemm_segments=2), out_dtype=torch.float32,
            dx_segments=2, cu_seqlens=order,
        )
        attn, _ = lt.attention_varlen(qd, kd, vd, order)
        logp, _, _ = lt.linear_logprob(hd, lmd, targets.to(device), cu_seqlens=order)
        outs = [y, attn, logp]
        torch.autograd.backward(outs, [ups[n].to(device) for n in ("y", "attn", "logp")])
        return [o.detach() for o in outs] + [t.grad for t in ls]

    names = ["y", "attn", "logp", "dx", "dw", "dq", "dk", "dv", "dh", "dlm"]
    for n, g, c in zip(names, run("cuda"), run("cpu")):
        assert_bitwise(g.cpu(), c, f"{n} cuda vs cpu")


def test_side_stream_is_used():
    """An op called under a non-default torch stream runs on it (torch's current stream): the
    side stream first sleeps, then fills the GEMM's input; an op on any other stream would read
    the zeros still there."""
    gen = torch.Generator().manual_seed(4)
    x, w = randn(gen, 64, 128).cuda(), randn(gen, 96, 128).cuda()
    want = lt.linear(x.cpu(), w.cpu())
    xs = torch.zeros_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU cycles queued before the copy
        xs.copy_(x)
        y = lt.linear(xs, w)
    s.synchronize()
    assert_bitwise(y.cpu(), want, "linear on a side stream")


def _bf16(*shape, device="cuda"):
    return torch.zeros(*shape, dtype=torch.bfloat16, device=device)


def _ids(*values):
    return torch.tensor(values, device="cuda")


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: lt.embedding(_ids(0, 7), _bf16(5, 8)),
            r"argument 'ids' has ids\[1\] = 7 outside \[0, 5\)",
        ),
        (
            lambda: lt.rope(_bf16(2, 1, 8), _ids(0, 64), max_positions=64),
            r"positions\[1\] = 64 outside \[0, 64\)",
        ),
        (
            lambda: lt.linear_logprob(_bf16(2, 8), _bf16(10, 8), _ids(3, 10)),
            r"targets\[1\] = 10 outside \[0, 10\)",
        ),
        (lambda: lt.linear(_bf16(2, 8), _bf16(3, 8, device="cpu")), "different devices"),
        (
            lambda: lockstep._C.gemm_dw(
                _bf16(4, 3),
                _bf16(4, 8),
                torch.zeros(3, 8, device="cuda"),
                torch.tensor([0, 4], dtype=torch.int32, device="cuda"),
            ),
            "argument 'cu_seqlens' must be a CPU \\(host\\) tensor",
        ),
    ],
    ids=[
        "embedding_ids", "rope_positions", "logprob_targets", "mixed_devices", "device_cu_seqlens"
    ],
)
def test_cuda_bad_inputs_raise(call, message):
    with pytest.raises(lockstep.Error, match=message):
        call()
    torch.cuda.synchronize()  # the CUDA context is still good


def test_range_check_runs_again_after_an_in_place_write():
    """The range check of a CUDA index tensor is skipped only for the same tensor at the same
    version: a write in place (also through a view) is checked again."""
    x = _bf16(2, 1, 8)
    pos = _ids(0, 1)
    lt.rope(x, pos, max_positions=64)
    lt.rope(x, pos, max_positions=64)  # the same tensor and version: no second check needed
    pos[1:].fill_(64)  # through a view: the version counter is shared
    with pytest.raises(lockstep.Error, match=r"positions\[1\] = 64 outside \[0, 64\)"):
        lt.rope(x, pos, max_positions=64)
    pos = _ids(0, 1)
    lt.rope(x, pos, max_positions=64)
    with pytest.raises(lockstep.Error, match=r"positions\[1\] = 1 outside \[0, 1\)"):
        lt.rope(x, pos, max_positions=1)  # another bound: checked again


# ---- lockstep.hf on a CUDA model ----------------------------------------------------------------


def _hf_case(tied, dtype, device, accumulate=False):
    """Log-probs, entropies and parameter gradients of the patched test model on `device`, for
    fixed packed sequences and upstream gradients."""
    import lockstep.hf as lh
    from test_hf import make_model, packed, random_seqs

    model = make_model(tied, dtype).to(device)
    lh.patch(model)
    gen = torch.Generator().manual_seed(21)
    seqs = random_seqs(gen, [6, 70, 2, 13])
    ids, cu_, targets = packed(seqs)
    g_lp = randn(gen, ids.shape[0], dtype=torch.float32)
    g_ent = randn(gen, ids.shape[0], dtype=torch.float32, scale=0.1)
    acc = lh.GradAccumulator(model) if accumulate else None
    logp, ent = lh.logprobs(model, ids.to(device), targets.to(device), cu_seqlens=cu_)
    torch.autograd.backward([logp, ent], [g_lp.to(device), g_ent.to(device)])
    if acc is not None:
        grads = acc.finish()
    else:
        grads = {n: p.grad for n, p in model.named_parameters()}
    return model, seqs, logp.detach(), ent.detach(), grads


@pytest.mark.parametrize(
    "tied,dtype,accumulate",
    [
        (False, torch.float32, False),
        (True, torch.bfloat16, False),
        (True, torch.float32, True),
    ],
    ids=["untied-f32", "tied-bf16", "tied-f32-accumulate"],
)
def test_hf_on_cuda_equals_cpu(tied, dtype, accumulate):
    _, _, lp_c, en_c, g_c = _hf_case(tied, dtype, "cpu", accumulate)
    _, _, lp_g, en_g, g_g = _hf_case(tied, dtype, "cuda", accumulate)
    assert lp_g.device.type == "cuda"
    assert_bitwise(lp_g.cpu(), lp_c, "logp cuda vs cpu")
    assert_bitwise(en_g.cpu(), en_c, "entropy cuda vs cpu")
    assert sorted(g_g) == sorted(g_c)
    for name in g_c:
        assert g_g[name].device.type == "cuda", name
        assert_bitwise(g_g[name].cpu(), g_c[name], f"d{name} cuda vs cpu")


def test_hf_on_cuda_equals_cuda_engine():
    from test_hf import engine_of, per_seq

    model, seqs, logp, ent, _ = _hf_case(False, torch.float32, "cuda")
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    import lockstep.hf as lh

    engine = lockstep.Engine(sd, config=lh.hf_config_dict(model), device="cuda")
    scores = engine.score(seqs)
    for i, (s, lp, en) in enumerate(zip(scores, per_seq(logp, seqs), per_seq(ent, seqs))):
        assert_bitwise(lp[:-1].cpu(), torch.from_numpy(s.logp), f"seq {i} logp vs cuda engine")
        assert_bitwise(en[:-1].cpu(), torch.from_numpy(s.entropy), f"seq {i} entropy")


def test_hf_on_cuda_side_stream_raises():
    import lockstep.hf as lh
    from test_hf import make_model, packed

    model = lh.patch(make_model().cuda())
    ids, cu_, targets = packed([[1, 2, 3]])
    with torch.cuda.stream(torch.cuda.Stream()):
        with pytest.raises(lockstep.Error, match="legacy default CUDA stream"):
            lh.logprobs(model, ids.cuda(), targets.cuda(), cu_seqlens=cu_)


def test_silu_and_mul_binding_on_cuda_equals_cpu():
    gen = torch.Generator().manual_seed(8)
    gu = randn(gen, 7, 48)
    want = torch.empty(7, 24, dtype=torch.bfloat16)
    lockstep._C.silu_and_mul(gu, want)
    got = torch.empty(7, 24, dtype=torch.bfloat16, device="cuda")
    lockstep._C.silu_and_mul(gu.cuda(), got)
    torch.cuda.synchronize()
    assert_bitwise(got.cpu(), want, "silu_and_mul cuda vs cpu")
