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

}  // namespace lockstep::cuda::detail
