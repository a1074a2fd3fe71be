// Device helpers shared by the baseline kernels (src/cuda/baseline_*.cu): error checks, index
// reads, bf16 packing, warp / block reductions. Baseline code only (ordinary arithmetic; the
// invariant kernels never include this).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "baseline/cuda/kernels.h"
#include "lockstep/dtype.h"
#include "lockstep/error.h"

// Throws lockstep::Error when a CUDA runtime call fails.
#define LS_BASE_CUDA(op, expr)                                                  \
  do {                                                                          \
    const cudaError_t e_ = (expr);                                              \
    LS_CHECK(e_ == cudaSuccess, op, #expr " failed: ", cudaGetErrorString(e_)); \
  } while (0)

// After a kernel launch: the launch error, if any.
#define LS_BASE_LAUNCHED(op)                                                           \
  do {                                                                                 \
    const cudaError_t e_ = cudaGetLastError();                                         \
    LS_CHECK(e_ == cudaSuccess, op, "kernel launch failed: ", cudaGetErrorString(e_)); \
  } while (0)

namespace lockstep::cuda::baseline {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

__device__ __forceinline__ int64_t read_index(const Index& ix, int64_t i) {
  return ix.i64 ? static_cast<const int64_t*>(ix.p)[i * ix.stride]
                : int64_t(static_cast<const int32_t*>(ix.p)[i * ix.stride]);
}

template <typename T>
__device__ __forceinline__ T* row_ptr(const Rows& r, int64_t row) {
  return static_cast<T*>(r.p) + (row / r.inner) * r.s0 + (row % r.inner) * r.s1;
}

__device__ __forceinline__ float neg_inf() { return -__int_as_float(0x7f800000); }

__device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

// fp32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN).
__device__ __forceinline__ uint16_t to_bf(float f) { return f32_to_bf16(f).bits; }

__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  return uint32_t(to_bf(lo)) | (uint32_t(to_bf(hi)) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction by `warp` (warp_sum, warp_max; blockDim.x a multiple of 32, <= 1024),
// `empty` for the missing warps' lanes; every thread gets the result. `red` is 32 floats of
// shared memory; the call begins and ends with a barrier-safe pattern.
__device__ __forceinline__ float block_reduce(float v, float* red, float empty,
                                              float (*warp)(float)) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp(v);
  __syncthreads();
  if (lane == 0) red[wid] = v;
  __syncthreads();
  float r = lane < nw ? red[lane] : empty;
  return warp(r);
}

__device__ __forceinline__ float block_sum(float v, float* red) {
  return block_reduce(v, red, 0.0f, warp_sum);
}

__device__ __forceinline__ float block_max(float v, float* red) {
  return block_reduce(v, red, neg_inf(), warp_max);
}

// Blocks of `threads` for n items, clamped to [1, max_blocks] (grid-stride kernels take any).
inline unsigned grid_1d(int64_t n, int threads, int64_t max_blocks = 0x7fffffff) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
}

}  // namespace lockstep::cuda::baseline
