// mma.sync-era building blocks shared by the CUDA kernels (the mma.sync GEMM, the small-M tiles,
// attention): one m16n8k16 k-block, cp.async group steps, and the contract's bf16 rounding with
// the canonical NaN. One copy for the GEMM kernels (src/cuda/gemm/) and attention.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep::cuda::detail {

// d = a·b + d: one k-block of 16 (the contract's mma_kblock_bf16, §M).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// fp32 -> bf16, round to nearest even, every NaN -> the canonical 0x7FC0 (contract §2).
__device__ __forceinline__ uint16_t round_bf16_canonical(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7FC0;
  u += 0x7fffu + ((u >> 16) & 1u);  // RNE (inf stays inf; finite overflow rounds to inf)
  return uint16_t(u >> 16);
}

// Two values rounded to bf16 in one register, lo in the low half (the lower k index of an MMA
// fragment, the lower column of an output pair) by the hardware's cvt.rn: the bits of
// round_bf16_canonical for every input but NaN (bf16 is fp32's upper half, so cvt's RNE and the
// integer RNE agree, subnormals and overflow to inf included); a NaN comes out as cvt's 0x7FFF.
__device__ __forceinline__ uint32_t pack_bf16_rn(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
// pack_bf16_rn with every NaN made the canonical 0x7FC0: round_bf16_canonical's bits on each half.
__device__ __forceinline__ uint32_t pack_bf16_rn_canonical(float lo, float hi) {
  uint32_t d = pack_bf16_rn(lo, hi);
  if (lo != lo) d = (d & 0xffff0000u) | 0x7FC0u;
  if (hi != hi) d = (d & 0x0000ffffu) | 0x7FC00000u;
  return d;
}

// fp32 bits with every NaN as the canonical 0x7FC00000 (contract §2).
__device__ __forceinline__ uint32_t canonical_f32_bits(float v) {
  const uint32_t u = __float_as_uint(v);
  return ((u & 0x7fffffffu) > 0x7f800000u) ? 0x7FC00000u : u;
}

}  // namespace lockstep::cuda::detail
