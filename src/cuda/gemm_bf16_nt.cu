// Launcher of the tensor-core GEMM (kernel: gemm_bf16_nt.cuh). Checks every argument before the
// launch (lockstep::Error naming the argument, as cpu::gemm_bf16_nt does), picks a tile shape from
// M alone (bits never depend on it: every tile computes each output with the same chain), launches
// on the caller's stream and checks cudaGetLastError.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm_bf16_nt.cuh"
#include "lockstep/cuda/gemm.h"
#include "lockstep/error.h"

namespace lockstep::cuda {
namespace {

constexpr const char* kOp = "cuda::gemm_bf16_nt";

// Byte range [lo, hi) touched by a view (empty views touch nothing).
struct Span {
  uintptr_t lo = 0, hi = 0;
};
Span span_of(const TensorView& t) {
  Span s;
  if (t.numel() == 0) return s;
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.stride[d];
  s.lo = reinterpret_cast<uintptr_t>(t.data);
  s.hi = s.lo + uintptr_t((last + 1) * dtype_size(t.dtype));
  return s;
}
bool overlap(const Span& a, const Span& b) {
  return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

template <int BM, int BN, int NS>
void launch(const detail::GemmParams& p, cudaStream_t stream) {
  constexpr int kSmem = detail::gemm_smem_bytes<BM, BN, NS>();
  // Once per process and instantiation (the current device's; one-GPU processes for now).
  static const cudaError_t attr = cudaFuncSetAttribute(
      detail::gemm_bf16_nt_kernel<BM, BN, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  LS_CHECK(attr == cudaSuccess, kOp, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  dim3 grid(unsigned((p.N + BN - 1) / BN), unsigned((p.M + BM - 1) / BM));
  detail::gemm_bf16_nt_kernel<BM, BN, NS><<<grid, detail::kGemmThreads, kSmem, stream>>>(p);
}

}  // namespace

void gemm_bf16_nt(const TensorView& x, const TensorView& w, const TensorView* bias,
                  const GemmConfig& cfg, const TensorView& y, void* stream) {
  cfg.validate();
  check_tensor(kOp, "x", x, DType::kBF16, {-1, -1}, Device::kCUDA);
  check_inner_contiguous(kOp, "x", x);
  const int64_t M = x.shape[0], K = x.shape[1];
  check_tensor(kOp, "w", w, DType::kBF16, {-1, K}, Device::kCUDA);
  check_inner_contiguous(kOp, "w", w);
  const int64_t N = w.shape[0];
  if (bias)
    check_tensor_dtypes(kOp, "bias", *bias, {DType::kBF16, DType::kF32}, {N}, Device::kCUDA);
  check_tensor_dtypes(kOp, "y", y, {DType::kBF16, DType::kF32}, {M, N}, Device::kCUDA);
  check_inner_contiguous(kOp, "y", y);
  const Span sy = span_of(y);
  LS_CHECK(!overlap(sy, span_of(x)), kOp, "y must not overlap x");
  LS_CHECK(!overlap(sy, span_of(w)), kOp, "y must not overlap w");
  if (bias) LS_CHECK(!overlap(sy, span_of(*bias)), kOp, "y must not overlap bias");
  LS_CHECK(M <= int64_t(65535) * 128, kOp, "x: M = ", M, " exceeds the grid limit");
  if (M == 0 || N == 0) return;

  const GemmKLayout kl = gemm_k_layout(cfg, K);
  detail::GemmParams p{};
  p.x = static_cast<const uint16_t*>(x.data);
  p.w = static_cast<const uint16_t*>(w.data);
  p.bias = bias ? bias->data : nullptr;
  p.y = y.data;
  p.M = M;
  p.N = N;
  p.K = K;
  p.ldx = x.stride[0];
  p.ldw = w.stride[0];
  p.ldy = y.stride[0];
  p.bias_stride = bias ? bias->stride[0] : 0;
  p.seg_len = kl.segment_len;
  p.segments = kl.segments;
  p.bias_f32 = (bias && bias->dtype == DType::kF32) ? 1 : 0;
  p.y_f32 = y.dtype == DType::kF32 ? 1 : 0;
  auto vec_ok = [](const TensorView& t) {
    return (reinterpret_cast<uintptr_t>(t.data) % 16 == 0) &&
           (t.shape[0] <= 1 || t.stride[0] % 8 == 0);
  };
  p.x_vec = vec_ok(x) ? 1 : 0;
  p.w_vec = vec_ok(w) ? 1 : 0;

  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (M <= 64) {
    launch<32, 64, 8>(p, s);  // decode: more k-tiles in flight per CTA
  } else {
    launch<128, 128, 4>(p, s);
  }
  const cudaError_t e = cudaGetLastError();
  LS_CHECK(e == cudaSuccess, kOp, "launch failed: ", cudaGetErrorString(e));
}

}  // namespace lockstep::cuda
