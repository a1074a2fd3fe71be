// wgmma building blocks shared by the Hopper GEMM kernels (gemm/mainloop_sm90.cuh: the large-M
// tiles; gemm/mainloop_small_m_wgmma.cuh: the small-M wgmma tiles): the 128B-swizzle K-major
// shared-memory descriptor, wgmma.m64nNk16 bf16 -> f32 for N = 32 ... 256 (A and B from shared
// memory), the fence / commit / wait steps and an accumulator pin (the segment fold:
// gemm/fold.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace lockstep::cuda::detail {

// Shared-memory matrix descriptor of a K-major operand stored as TMA wrote it with 128B swizzle:
// rows of 128 bytes, 8-row groups 1024 bytes apart (SBO), swizzle mode 1 (128B) in bits 62-63.
// The k-block's 32-byte offset inside the row is added to the start address (the hardware applies
// the XOR pattern to the final address; stage bases are 1024-aligned, so base offset = 0).
__device__ __forceinline__ uint64_t sw128_desc(uint32_t addr) {
  uint64_t d = uint64_t((addr & 0x3FFFFu) >> 4);  // start address, bits 0-13
  d |= uint64_t(1) << 16;                         // LBO (unused for swizzled K-major)
  d |= uint64_t(1024 >> 4) << 32;                 // SBO, bits 32-45
  d |= uint64_t(1) << 62;                         // 128B swizzle
  return d;
}

// The same for an MN-major operand (the rows of the k-tile are k, 128 bytes = 64 M or N elements
// each, as TMA wrote a box of 64 columns x 64 rows with 128B swizzle): 8-row k groups 1024 bytes
// apart (SBO), 64-element M / N blocks 8192 bytes apart (LBO: the next box); one k-block of 16 is
// two k groups, its start address advances 2048 bytes per k-block.
__device__ __forceinline__ uint64_t sw128_mn_desc(uint32_t addr) {
  uint64_t d = uint64_t((addr & 0x3FFFFu) >> 4);  // start address, bits 0-13
  d |= uint64_t(8192 >> 4) << 16;                 // LBO, bits 16-29
  d |= uint64_t(1024 >> 4) << 32;                 // SBO, bits 32-45
  d |= uint64_t(1) << 62;                         // 128B swizzle
  return d;
}

// Both descriptors above have the same high word (SBO 1024, 128B swizzle); only the low word
// (start address >> 4, and the LBO) varies. A k-block's descriptor is its tile's low word plus the
// k-block's byte offset >> 4 (shared addresses stay below 2^18: the 14-bit start field never
// carries into the LBO), so a kernel that keeps tile low words needs one 32-bit add and the
// constant per operand instead of a 64-bit descriptor build.
constexpr uint32_t kSw128DescHi =  // SBO = 1024 bytes >> 4 (bits 32-45), 128B swizzle (bit 62)
    uint32_t(((uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62)) >> 32);
static_assert(kSw128DescHi == 0x40000040u, "sw128 descriptor high word");
__device__ __forceinline__ uint64_t sw128_desc_lo(uint32_t lo) {
  return (uint64_t(kSw128DescHi) << 32) | lo;
}
// The low words themselves (K-major and MN-major tiles at addr).
__device__ __forceinline__ uint32_t sw128_lo(uint32_t addr) { return uint32_t(sw128_desc(addr)); }
__device__ __forceinline__ uint32_t sw128_mn_lo(uint32_t addr) {
  return uint32_t(sw128_mn_desc(addr));
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins the accumulators at this point of the instruction stream (no read or write of them may
// move across a wgmma issue or wait).
template <int R>
__device__ __forceinline__ void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d = A·B + (scale_d ? d : +0) over one k-block of 16 (the contract's mma_kblock_bf16 per output):
// wgmma.m64nNk16 with R = N / 2 accumulators per thread (asm operands %0 .. %R-1), then desc_a,
// desc_b, scale_d. N = 32, 48: the small-M wgmma tiles; N = 64, 128, 256: the large-M tiles.
// TA / TB = 1: A / B is MN-major in shared memory (the instruction's transpose bits; bf16 allows
// them): the same products and the same k-block arithmetic, only the operand's layout differs.
// NOTE: inline asm takes one operand per register: the register list and the accumulator
// operands are spelled out once here (LS_WGMMA_R*, LS_WGMMA_D*), each instruction is one line.
#define LS_WGMMA_R16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define LS_WGMMA_R24 LS_WGMMA_R16 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define LS_WGMMA_R32 LS_WGMMA_R24 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define LS_WGMMA_R64                                                                        \
  LS_WGMMA_R32                                                                              \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
  "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define LS_WGMMA_R128                                                                          \
  LS_WGMMA_R64                                                                                 \
  ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, "    \
  "%81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, " \
  "%99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, "  \
  "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define LS_WGMMA_D8(i)                                                                \
  "+f"(d[8 * (i)]), "+f"(d[8 * (i) + 1]), "+f"(d[8 * (i) + 2]), "+f"(d[8 * (i) + 3]), \
      "+f"(d[8 * (i) + 4]), "+f"(d[8 * (i) + 5]), "+f"(d[8 * (i) + 6]), "+f"(d[8 * (i) + 7])
#define LS_WGMMA_D32(i) \
  LS_WGMMA_D8(4 * (i)), LS_WGMMA_D8(4 * (i) + 1), LS_WGMMA_D8(4 * (i) + 2), LS_WGMMA_D8(4 * (i) + 3)
// N, R, the register list, the operand numbers of desc_a, desc_b and scale_d, the accumulators.
#define LS_WGMMA(N, R, REGS, A, B, SD, TA, TB, ...)                                            \
  template <int kTA, int kTB>                                                                  \
  __device__ __forceinline__ void wgmma_m64k16(float(&d)[R], uint64_t desc_a, uint64_t desc_b, \
                                               int scale_d) {                                  \
    asm volatile(                                                                              \
        "{\n.reg .pred p;\n"                                                                   \
        "setp.ne.b32 p, %" #SD                                                                 \
        ", 0;\n"                                                                               \
        "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.bf16.bf16 {" REGS "}, %" #A ", %" #B   \
        ", p, 1, 1, %" #TA ", %" #TB ";\n}\n"                                                  \
        : __VA_ARGS__                                                                          \
        : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTA), "n"(kTB));                         \
  }
LS_WGMMA(32, 16, LS_WGMMA_R16, 16, 17, 18, 19, 20, LS_WGMMA_D8(0), LS_WGMMA_D8(1))
LS_WGMMA(48, 24, LS_WGMMA_R24, 24, 25, 26, 27, 28, LS_WGMMA_D8(0), LS_WGMMA_D8(1), LS_WGMMA_D8(2))
LS_WGMMA(64, 32, LS_WGMMA_R32, 32, 33, 34, 35, 36, LS_WGMMA_D32(0))
LS_WGMMA(128, 64, LS_WGMMA_R64, 64, 65, 66, 67, 68, LS_WGMMA_D32(0), LS_WGMMA_D32(1))
LS_WGMMA(256, 128, LS_WGMMA_R128, 128, 129, 130, 131, 132, LS_WGMMA_D32(0), LS_WGMMA_D32(1),
         LS_WGMMA_D32(2), LS_WGMMA_D32(3))
// d = A·B + (scale_d ? d : +0), m64n128k16, A (64 x 16 bf16) in registers — the m16n8k16 A
// fragment of each warp's 16 rows: a[0] rows lane/4, k 2(lane%4)+{0,1}; a[1] rows +8; a[2], a[3]
// the same at k + 8 — and B in shared memory (TB = 1: MN-major). The same k-block arithmetic as
// the shared-memory form (§M.2: registers as A were probed with m64n8k16).
template <int TB>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4],
                                                    uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" LS_WGMMA_R64
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : LS_WGMMA_D32(0), LS_WGMMA_D32(1)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TB));
}
#undef LS_WGMMA
#undef LS_WGMMA_D32
#undef LS_WGMMA_D8
#undef LS_WGMMA_R128
#undef LS_WGMMA_R64
#undef LS_WGMMA_R32
#undef LS_WGMMA_R24
#undef LS_WGMMA_R16

// The wgmma of N = WN (one overload per N above, told apart by the accumulator count); TA / TB:
// MN-major A / B.
template <int WN, int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_k16(float (&d)[WN / 2], uint64_t da, uint64_t db, int sd) {
  wgmma_m64k16<TA, TB>(d, da, db, sd);
}

}  // namespace lockstep::cuda::detail
