"""Bad inputs raise lockstep.Error (a RuntimeError) with the library's message, or ValueError for
a bad Python-side setting; nothing crashes the interpreter."""

import ctypes

import numpy as np
import pytest
import torch

import lockstep
import lockstep.torch as lt
from conftest import cu, randn
from lockstep import _C


def test_error_is_a_runtime_error():
    assert issubclass(lockstep.Error, RuntimeError)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda g: lt.linear(randn(g, 4, 8, dtype=torch.float32), randn(g, 3, 8)),
            "gemm_bf16_nt: argument 'x' expected dtype bf16, got f32",
        ),
        (lambda g: lt.linear(randn(g, 4, 8), randn(g, 3, 9)), "gemm_bf16_nt"),
        (lambda g: lt.linear(randn(g, 4), randn(g, 3, 8)), "gemm_bf16_nt"),
        (lambda g: lt.linear(randn(g, 8, 4).t(), randn(g, 3, 8)), "stride 1 in its last dim"),
        (lambda g: lt.linear(randn(g, 1, 8).expand(4, 8), randn(g, 3, 8)), "positive strides"),
        (lambda g: lt.rmsnorm(randn(g, 4, 8), randn(g, 7)), "rmsnorm"),
        (lambda g: lt.rmsnorm(randn(g, 4, 8), randn(g, 8), eps=-1.0), "eps"),
        (lambda g: lt.rope(randn(g, 4, 2, 16), torch.tensor([0, 1, 2, 99]), 1e6, 64), "rope"),
        (
            lambda g: lt.rope(randn(g, 4, 2, 16), torch.arange(4, dtype=torch.float32), 1e6, 64),
            "positions",
        ),
        (lambda g: lt.silu_mul(randn(g, 4, 8), randn(g, 4, 9)), "silu_mul"),
        (lambda g: lt.embedding(torch.tensor([0, 50]), randn(g, 50, 8)), "embedding"),
        (
            lambda g: lt.attention_varlen(
                randn(g, 5, 2, 16), randn(g, 5, 2, 16), randn(g, 5, 2, 16), cu(2, 2)
            ),
            "cu_seqlens",
        ),
        (
            lambda g: lt.attention_varlen(
                randn(g, 5, 3, 16), randn(g, 5, 2, 16), randn(g, 5, 2, 16), cu(5)
            ),
            "attention",
        ),
        (
            lambda g: lt.attention_varlen(
                randn(g, 5, 2, 12), randn(g, 5, 2, 12), randn(g, 5, 2, 12), cu(5)
            ),
            "attention",
        ),
        (
            lambda g: lt.linear_logprob(randn(g, 3, 8), randn(g, 20, 8), torch.tensor([0, 1, 20])),
            "linear_logprob",
        ),
        (
            lambda g: lt.linear_logprob(
                randn(g, 3, 8), randn(g, 20, 8), torch.tensor([0, 1, 2]), temperature=0.0
            ),
            "temperature",
        ),
        (
            lambda g: lt.sample(
                randn(g, 2, 8), randn(g, 20, 8), torch.arange(2), torch.arange(2), top_p=0.0
            ),
            "top_p",
        ),
        (
            lambda g: lt.linear(randn(g, 4, 8), randn(g, 3, 8), cu_seqlens=cu(1, 2)),
            None,
        ),  # the forward ignores the token order; its backward checks it (below)
    ],
)
def test_bad_input_raises_library_message(call, message):
    g = torch.Generator().manual_seed(0)
    if message is None:
        call(g)
        return
    with pytest.raises(lockstep.Error, match=message):
        call(g)


def test_bad_token_order_raises_in_backward(gen):
    x, w = randn(gen, 4, 8, requires_grad=True), randn(gen, 3, 8, requires_grad=True)
    y = lt.linear(x, w, cu_seqlens=cu(1, 2))  # covers 3 of 4 rows
    with pytest.raises(lockstep.Error, match="gemm_bf16_dw"):
        y.backward(torch.ones_like(y))


def test_bad_contract_raises_value_error():
    with pytest.raises(lockstep.Error, match="gemm_segments"):
        lockstep.Contract(gemm_segments=3)
    with pytest.raises(ValueError, match="must be an int"):
        lockstep.Contract(kv_chunk=64.0)
    with pytest.raises(ValueError, match="out_dtype"):
        lt.linear(
            torch.zeros(2, 8, dtype=torch.bfloat16),
            torch.zeros(2, 8, dtype=torch.bfloat16),
            out_dtype=torch.float16,
        )


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", _DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


def fake_cuda_array(keep, rows, cols):
    """A DLPack capsule claiming a bf16 [rows, cols] CUDA array (nothing is ever read from it:
    placement is checked first). `keep` holds the ctypes objects alive."""
    shape = (ctypes.c_int64 * 2)(rows, cols)
    strides = (ctypes.c_int64 * 2)(cols, 1)
    t = _DLManagedTensor()
    t.dl_tensor = _DLTensor(0x1000, _DLDevice(2, 0), 2, _DLDataType(4, 16, 1), shape, strides, 0)
    keep += [shape, strides, t]
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = (
        ctypes.py_object,
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p],
    )
    return new(ctypes.addressof(t), b"dltensor", None)


@pytest.mark.skipif(_C.cuda_build, reason="a CUDA build runs CUDA tensors (test_cuda.py)")
def test_cuda_tensors_need_a_cuda_build():
    keep = []
    x, w = fake_cuda_array(keep, 4, 8), fake_cuda_array(keep, 3, 8)
    y = fake_cuda_array(keep, 4, 3)
    with pytest.raises(lockstep.Error, match="CUDA tensors need a CUDA build"):
        _C.gemm(x, w, None, y)


def test_mixed_devices_raise():
    keep = []
    x = fake_cuda_array(keep, 4, 8)
    w, y = np.zeros((3, 8), np.float32), np.zeros((4, 3), np.float32)
    with pytest.raises(lockstep.Error, match="different devices"):
        _C.gemm(x, w, None, y)


def test_unsupported_dtype_from_numpy():
    x = np.zeros((2, 8), dtype=np.float64)
    with pytest.raises(lockstep.Error, match="dtype float64"):
        _C.gemm(x, x, None, x)


def test_numpy_arrays_work_without_torch():
    # The bindings take any DLPack array: an embedding backward from numpy inputs.
    ids = np.array([1, 0, 1], dtype=np.int32)
    gh = np.arange(6, dtype=np.float32).reshape(3, 2)
    dtable = np.zeros((2, 2), dtype=np.float32)
    _C.embedding_backward(ids, gh, dtable)
    np.testing.assert_array_equal(dtable, [[2, 3], [4, 6]])


def test_wrong_argument_type_is_a_type_error():
    with pytest.raises(TypeError):
        _C.gemm([1, 2], None, None, None)


def test_round_bf16_is_the_library_rounding():
    src = torch.tensor([1.0, 1.00390625, 1.01171875, -0.0, float("inf"), 3e38, 1e-40])
    nan = torch.tensor([0x7FA00001, -1], dtype=torch.int32).view(torch.float32)  # NaN payloads
    src = torch.cat([src, nan])
    dst = torch.empty(src.shape, dtype=torch.bfloat16)
    _C.round_bf16(src, dst)
    got = dst.view(torch.int16).tolist()
    assert got[:7] == src[:7].bfloat16().view(torch.int16).tolist()  # RNE, as torch for non-NaN
    assert got[7:] == [0x7FC0, 0x7FC0]  # every NaN canonical (dtype.h)
    with pytest.raises(lockstep.Error, match="round_bf16"):
        _C.round_bf16(src, torch.empty(3, dtype=torch.bfloat16))


def test_import_lockstep_needs_no_torch():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None; import lockstep; "
        "print(lockstep.Contract(gemm_segments=4))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "gemm_segments=4" in out.stdout
