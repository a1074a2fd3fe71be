// Helpers shared by the CUDA elementwise, log-prob and sampling kernels and their launchers:
// bf16 loads and the canonical-NaN bf16 store (the same bit formula as lockstep::f32_to_bf16,
// so host and device round identically), row addressing of [R, C] / [A, B, C] views with strided
// outer dimensions, 1-D index views of either dtype, and host-side argument and launch checks for
// device views (lockstep::Error naming the op and the argument; check_launch also serves the GEMM
// launchers, gemm/sm90_launch.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "lockstep/dtype.h"
#include "lockstep/error.h"
#include "lockstep/tensor.h"

namespace lockstep::cuda::detail {

constexpr uint16_t kNanBf16 = 0x7FC0;      // every stored bf16 NaN
constexpr uint16_t kNegZeroBf16 = 0x8000;  // -0.0: the IEEE additive identity

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t b) {
  return __uint_as_float(uint32_t(b) << 16);
}

// RNE fp32 -> bf16, any NaN -> 0x7FC0: lockstep::f32_to_bf16 (one formula for host and device).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float v) { return f32_to_bf16(v).bits; }

__device__ __forceinline__ float canonical(float v) {
  return v != v ? __uint_as_float(kCanonicalNanF32) : v;
}

// Rows of a 2-D [R, C] or 3-D [A, B, C] view (last dim contiguous): flattened row r lives at
// element offset (r / inner)·s0 + (r % inner)·s1. Element strides, not bytes.
struct RowMap {
  int64_t s0 = 0, s1 = 0, inner = 1;
  __device__ __forceinline__ int64_t offset(int64_t r) const {
    return inner == 1 ? r * s0 : (r / inner) * s0 + (r % inner) * s1;
  }
};

// 1-D integer view (i32 or i64, any stride) read on the device.
struct IndexRef {
  const void* p = nullptr;
  int64_t stride = 1;
  int is64 = 1;
  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return is64 ? static_cast<const int64_t*>(p)[i * stride]
                : int64_t(static_cast<const int32_t*>(p)[i * stride]);
  }
};

// ---- host side ---------------------------------------------------------------------------------

inline RowMap row_map(const TensorView& v) {
  RowMap m;
  if (v.ndim == 3) {
    m.inner = v.shape[1];
    m.s0 = v.stride[0];
    m.s1 = v.stride[1];
  } else {
    m.s0 = v.stride[0];
  }
  return m;
}

inline IndexRef index_ref(const TensorView& v) {
  IndexRef r;
  r.p = v.data;
  r.stride = v.stride[0];
  r.is64 = v.dtype == DType::kI64 ? 1 : 0;
  return r;
}

// The RoPE table on the device and the positions that index it (§E.2): token t's row is pos[t],
// P rows of D/2 fp32 values, cos / sin rows cs / ss elements apart. Every RoPE kernel (forward,
// backward, the fused q/k norm) reads its table through one of these.
struct RopeTableRef {
  IndexRef pos;      // [T]
  const float* cos;  // [P, D/2], row stride cs
  const float* sin;  // [P, D/2], row stride ss
  int64_t cs, ss, P;
};
inline RopeTableRef rope_table_ref(const TensorView& positions, const TensorView& cos,
                                   const TensorView& sin) {
  return RopeTableRef{index_ref(positions),
                      static_cast<const float*>(cos.data),
                      static_cast<const float*>(sin.data),
                      cos.stride[0],
                      sin.stride[0],
                      cos.shape[0]};
}

// One pair (i, i + D/2) of §E.2 from its fp32 inputs a = x_i, b = x_{i+D/2} and the table's c, s:
// y_i = round(a·c − b·s), y_{i+D/2} = round(b·c + a·s), each product, the difference and the sum
// one fp32 RNE op (no fma).
__device__ __forceinline__ uint16_t rope_first(float a, float b, float c, float s) {
  return f32_to_bf16_bits(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
}
__device__ __forceinline__ uint16_t rope_second(float a, float b, float c, float s) {
  return f32_to_bf16_bits(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}

// Every row of a bf16 view starts on a 16-byte boundary (8-element groups can be read as uint4).
inline bool rows_16b_aligned(const TensorView& v) {
  if (reinterpret_cast<uintptr_t>(v.data) % 16 != 0) return false;
  for (int d = 0; d + 1 < v.ndim; ++d)
    if (v.shape[d] > 1 && v.stride[d] % 8 != 0) return false;
  return true;
}

// dtype, shape (-1: any), device kCUDA, last dim contiguous.
inline void check_device_view(const char* op, const char* arg, const TensorView& t, DType dtype,
                              std::initializer_list<int64_t> shape) {
  check_tensor(op, arg, t, dtype, shape, Device::kCUDA);
  check_inner_contiguous(op, arg, t);
}

inline void check_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  LS_CHECK(e == cudaSuccess, op, "launch failed: ", cudaGetErrorString(e));
}

// Blocks for a grid-stride loop over n items (the grid never changes bits: every item is
// computed alone).
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > (int64_t(1) << 20) ? (int64_t(1) << 20) : b));
}

}  // namespace lockstep::cuda::detail
