"""Shared helpers of the Python tests: seeded bf16 data and the bitwise comparison."""

import pytest
import torch

import lockstep.torch  # noqa: F401  (registers the torch.ops.lockstep ops)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit pattern of a tensor as an integer tensor (memcmp-style comparisons)."""
    views = {
        torch.bfloat16: torch.int16,
        torch.float16: torch.int16,
        torch.float32: torch.int32,
        torch.float64: torch.int64,
    }
    return t.detach().contiguous().view(views[t.dtype]) if t.dtype in views else t.detach()


def assert_bitwise(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    """a and b hold the same bits; on failure names the first differing index and both values."""
    assert a.dtype == b.dtype, f"{what}: dtype {a.dtype} vs {b.dtype}"
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
    ba, bb = bits(a), bits(b)
    if not torch.equal(ba, bb):
        diff = (ba != bb).nonzero()[0].tolist()
        i = tuple(diff)
        raise AssertionError(
            f"{what}: first difference at {i}: {a[i].item()!r} (bits {int(ba[i])}) vs "
            f"{b[i].item()!r} (bits {int(bb[i])}), {int((ba != bb).sum())} elements differ"
        )


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def randn(gen, *shape, scale=1.0, dtype=torch.bfloat16, requires_grad=False):
    t = (torch.randn(*shape, generator=gen) * scale).to(dtype)
    return t.requires_grad_(requires_grad)


def cu(*lens):
    """cu_seqlens [B+1] int32 of sequence lengths."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)
