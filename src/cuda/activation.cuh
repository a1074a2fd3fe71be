// SiLU-and-mul kernel, docs/contract.md §E.3: per element e = ls_expf(−g), d = 1 + e, s = g / d,
// out = round(s·u), each step one fp32 RNE op (IEEE divide, no fma), the project's exp.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/math.h"
#include "cuda/elementwise_common.cuh"

namespace lockstep::cuda::detail {

struct SiluMulParams {
  const uint16_t* gate;  // [T, I], row stride lg
  const uint16_t* up;    // [T, I], row stride lu
  uint16_t* out;         // [T, I], row stride lo
  int64_t lg, lu, lo, T, I;
};

// NOTE: out may be the same view as gate or up: each element is read, then written, by one thread.
static __global__ void silu_mul_kernel(const SiluMulParams p) {
  const int64_t n = p.T * p.I;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / p.I, i = idx - t * p.I;
    const float g = bf16_bits_to_f32(p.gate[t * p.lg + i]);
    const float u = bf16_bits_to_f32(p.up[t * p.lu + i]);
    const float e = ls_expf(-g);
    const float d = __fadd_rn(1.0f, e);
    const float s = __fdiv_rn(g, d);
    p.out[t * p.lo + i] = f32_to_bf16_bits(__fmul_rn(s, u));
  }
}

// The same per element, 8 consecutive columns per thread with 16-byte loads and stores (rows
// 16-byte aligned, I a multiple of 8): grid (column groups / 256, T), no 64-bit index division.
__device__ __forceinline__ float silu_mul1(uint16_t gb, uint16_t ub) {
  const float g = bf16_bits_to_f32(gb);
  const float e = ls_expf(-g);
  const float d = __fadd_rn(1.0f, e);
  return __fmul_rn(__fdiv_rn(g, d), bf16_bits_to_f32(ub));
}
static __global__ void __launch_bounds__(256) silu_mul_vec_kernel(const SiluMulParams p) {
  const int64_t t = blockIdx.y;
  const int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 8;
  if (c >= p.I) return;
  const uint4 gv = *reinterpret_cast<const uint4*>(p.gate + t * p.lg + c);
  const uint4 uv = *reinterpret_cast<const uint4*>(p.up + t * p.lu + c);
  const uint32_t g[4] = {gv.x, gv.y, gv.z, gv.w}, u[4] = {uv.x, uv.y, uv.z, uv.w};
  uint32_t o[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo =
        f32_to_bf16_bits(silu_mul1(uint16_t(g[i] & 0xffffu), uint16_t(u[i] & 0xffffu)));
    const uint32_t hi = f32_to_bf16_bits(silu_mul1(uint16_t(g[i] >> 16), uint16_t(u[i] >> 16)));
    o[i] = lo | (hi << 16);
  }
  *reinterpret_cast<uint4*>(p.out + t * p.lo + c) = make_uint4(o[0], o[1], o[2], o[3]);
}

}  // namespace lockstep::cuda::detail
