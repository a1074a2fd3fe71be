// Operand helpers shared by the forward attention kernels (attention.cuh) and the backward's
// (backward/attention.cuh): ldmatrix at a shared-memory pointer (plain and transposed), the
// 16-byte cp.async, the canonical-NaN fp32 store value, two bf16 (RNE) in one register and an
// 8-element bf16 load without alignment. Device inline functions only (no kernels), so any number
// of translation units may include it.
#pragma once

#include <cstdint>

#include "cuda/mma_sync.cuh"  // pack_bf16_rn
#include "lockstep/dtype.h"

namespace lockstep::cuda::attn_common {

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const uint16_t* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}
__device__ __forceinline__ float canon(float f) {
  return is_nan_f32(f) ? __uint_as_float(kCanonicalNanF32) : f;
}
// Two bf16 (RNE, canonical NaN) in one register: lo in the low half (the lower k index of an MMA
// fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  return uint32_t(f32_to_bf16(lo).bits) | (uint32_t(f32_to_bf16(hi).bits) << 16);
}
// pack_bf16_rn (mma_sync.cuh): the same bits as pack_bf16 for every input but NaN; callers take
// pack_bf16 when any of their values is NaN and the pattern is stored (an MMA operand needs no
// canonical NaN: §M makes any NaN input 0x7fffffff).
using detail::pack_bf16_rn;
__device__ __forceinline__ uint4 load8_scalar(const uint16_t* p) {
  uint4 v;
  v.x = uint32_t(p[0]) | (uint32_t(p[1]) << 16);
  v.y = uint32_t(p[2]) | (uint32_t(p[3]) << 16);
  v.z = uint32_t(p[4]) | (uint32_t(p[5]) << 16);
  v.w = uint32_t(p[6]) | (uint32_t(p[7]) << 16);
  return v;
}

}  // namespace lockstep::cuda::attn_common
