// The GEMM kernel: one CTA computes a BM x BN tile of y with 8 warps (2 along M x 4 along N), each
// warp (BM/2) x (BN/4) outputs in mma.sync.m16n8k16 fragments. K is walked segment by segment
// (docs/contract.md §G.2), each segment in k-tiles of 64 ascending; every output's segment value is
// ONE accumulator chain from +0 over the segment's k-blocks of 16 in ascending order (§G.3, §M).
// Segment values are combined with the balanced tree of §G.4 through a per-thread stack
// (binary-counter order: left operand = the earlier subtree), then bias once, then one rounding.
// Global -> shared through an NS-stage cp.async pipeline (plain stores for edge/unaligned
// chunks, zero-filled) -> ldmatrix -> mma.sync. The ldmatrix / cp.async steps, the chunk loads and
// the fragment epilogue are shared with the small-M mma.sync kernels (mainloop_small_m_*.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/epilogue.cuh"  // load_bias, store_output
#include "cuda/gemm/fold.cuh"      // fold_segment (§G.4)
#include "cuda/gemm/params.cuh"    // GemmParams
#include "cuda/mma_sync.cuh"       // mma_16816, cp.async group steps

namespace lockstep::cuda::detail {

constexpr int kGemmThreads = 256;      // 8 warps
constexpr int kGemmBK = 64;            // k per tile (four k-blocks of 16)
constexpr int kGemmLds = 72;           // shared row stride in bf16 (144 B: ldmatrix conflict-free)
constexpr int kGemmCpr = kGemmBK / 8;  // 16-byte chunks per row of a tile

// ldmatrix / cp.async / shared stores at shared-memory byte addresses (every mma.sync main loop).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t& r0, uint32_t& r1, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void st_shared16(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w));
}
__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// NOTE: the pointer form converts dst after the caller computed src (the order whose SASS the
// mma.sync kernels were checked with).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  cp_async16(shared_addr(dst), src);
}

// Elements [k0, k0+8) of row p (k0 < klim), zero at k >= klim: the slow path for K tails and
// unaligned rows.
__device__ __forceinline__ uint4 load_chunk_slow(const uint16_t* p, int64_t k0, int64_t klim) {
  uint16_t e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = (k0 + i < klim) ? p[i] : uint16_t(0);
  return make_uint4(
      uint32_t(e[0]) | (uint32_t(e[1]) << 16), uint32_t(e[2]) | (uint32_t(e[3]) << 16),
      uint32_t(e[4]) | (uint32_t(e[5]) << 16), uint32_t(e[6]) | (uint32_t(e[7]) << 16));
}

// One 8-element chunk of a row (k in [k0, k0+8)), zero outside [0, klim) and for rows >= rows.
__device__ __forceinline__ uint4 load_chunk(const uint16_t* base, int64_t ld, int64_t row,
                                            int64_t rows, int64_t k0, int64_t klim, bool vec) {
  if (row >= rows || k0 >= klim) return make_uint4(0u, 0u, 0u, 0u);
  const uint16_t* p = base + row * ld + k0;
  if (vec && k0 + 8 <= klim) return *reinterpret_cast<const uint4*>(p);
  return load_chunk_slow(p, k0, klim);
}

// The epilogue of mma.sync m16n8 accumulator fragments: acc[i][j][c] is row row_of(i) + lane/4 +
// 8(c/2), column col_of(j) + 2(lane%4) + c%2 (the first row of m16 tile i, the first column of n8
// tile j; HALF: only rows 0..7 of the m16 tile exist, c < 2); outputs outside [0, M) x [0, N) are
// skipped. Bias once, one rounding, canonical NaN.
template <bool HALF, int MT, int NT, typename RowOf, typename ColOf>
__device__ __forceinline__ void store_mma_frags(const GemmParams& p, const float (&acc)[MT][NT][4],
                                                RowOf row_of, ColOf col_of, int lane) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (HALF && c >= 2) continue;
        const int64_t m = row_of(i) + g + (c >> 1) * 8;
        const int64_t n = col_of(j) + tq * 2 + (c & 1);
        if (m < p.M && n < p.N) {
          float v = acc[i][j][c];
          if (p.bias) v = __fadd_rn(v, load_bias(p.bias, p.bias_stride, p.bias_f32, n));
          store_output(p.y, p.ldy, p.y_f32, m, n, v);
        }
      }
    }
  }
}

// The same chunk into shared memory: cp.async when whole and aligned, else a plain store.
__device__ __forceinline__ void chunk_to_smem(uint16_t* dst, const uint16_t* base, int64_t ld,
                                              int64_t row, int64_t rows, int64_t k0, int64_t klim,
                                              bool vec) {
  if (vec && row < rows && k0 + 8 <= klim) {
    cp_async16(dst, base + row * ld + k0);
  } else {
    *reinterpret_cast<uint4*>(dst) = load_chunk(base, ld, row, rows, k0, klim, vec);
  }
}

// Dynamic shared memory of one CTA: NS stages of (BM + BN) rows of kGemmLds bf16.
template <int BM, int BN, int NS>
constexpr int gemm_smem_bytes() {
  return NS * (BM + BN) * kGemmLds * 2;
}

template <int BM, int BN, int NS>
__global__ void __launch_bounds__(kGemmThreads) gemm_bf16_nt_kernel(const GemmParams p) {
  constexpr int MT = BM / 32;  // m16 tiles per warp (2 warps along M)
  constexpr int NT = BN / 32;  // n8 tiles per warp (4 warps along N)
  static_assert(MT >= 1 && NT >= 2 && NT % 2 == 0 && NS >= 2, "tile shape");
  constexpr int kChunksA = BM * kGemmCpr;
  constexpr int kChunksB = BN * kGemmCpr;
  constexpr int kPerThrA = (kChunksA + kGemmThreads - 1) / kGemmThreads;
  constexpr int kPerThrB = (kChunksB + kGemmThreads - 1) / kGemmThreads;
  constexpr int kStage = (BM + BN) * kGemmLds;  // bf16 elements per stage

  extern __shared__ __align__(16) uint16_t smem[];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp >> 2;  // 0..1
  const int wn = warp & 3;   // 0..3
  const int64_t m0 = int64_t(blockIdx.y) * BM;
  const int64_t n0 = int64_t(blockIdx.x) * BN;

  const int64_t tiles_per_seg = (p.seg_len + kGemmBK - 1) / kGemmBK;
  const int64_t total_tiles = tiles_per_seg * p.segments;

  float acc[MT][NT][4];
  zero_all(acc);
  float stack[3][MT][NT][4];  // pending left subtrees (fold.cuh; S <= 8)

  // Issues the loads of k-tile t into stage t % NS (cp.async, or plain stores at the edges).
  auto load_tile = [&](int64_t t) {
    const int64_t sg = t / tiles_per_seg;
    const int64_t k0 = sg * p.seg_len + (t - sg * tiles_per_seg) * kGemmBK;
    uint16_t* sa = smem + int(t % NS) * kStage;
    uint16_t* sb = sa + BM * kGemmLds;
#pragma unroll
    for (int i = 0; i < kPerThrA; ++i) {
      const int idx = tid + i * kGemmThreads;
      if (kChunksA % kGemmThreads == 0 || idx < kChunksA)
        chunk_to_smem(&sa[(idx / kGemmCpr) * kGemmLds + (idx % kGemmCpr) * 8], p.x, p.ldx,
                      m0 + idx / kGemmCpr, p.M, k0 + (idx % kGemmCpr) * 8, p.K, p.x_vec);
    }
#pragma unroll
    for (int i = 0; i < kPerThrB; ++i) {
      const int idx = tid + i * kGemmThreads;
      if (kChunksB % kGemmThreads == 0 || idx < kChunksB)
        chunk_to_smem(&sb[(idx / kGemmCpr) * kGemmLds + (idx % kGemmCpr) * 8], p.w, p.ldw,
                      n0 + idx / kGemmCpr, p.N, k0 + (idx % kGemmCpr) * 8, p.K, p.w_vec);
    }
  };

  // Prologue: NS-1 tiles in flight (one commit group per tile, empty groups past the end).
#pragma unroll
  for (int st = 0; st < NS - 1; ++st) {
    if (st < total_tiles) load_tile(st);
    cp_async_commit();
  }

  for (int64_t t = 0; t < total_tiles; ++t) {
    cp_async_wait<NS - 2>();  // tile t has landed (this thread's part) ...
    __syncthreads();          // ... everyone's, and stage (t-1) % NS is no longer read
    if (t + NS - 1 < total_tiles) load_tile(t + NS - 1);
    cp_async_commit();
    const uint16_t* sa = smem + int(t % NS) * kStage;
    const uint16_t* sb = sa + BM * kGemmLds;

    const int64_t s = t / tiles_per_seg;
    const int64_t kin = (t - s * tiles_per_seg) * kGemmBK;  // offset inside the segment
    // k-blocks of this tile that belong to segment s (the segment length is a multiple of 16).
    const int64_t left = (p.seg_len - kin) / 16;
    const int nkb = left >= kGemmBK / 16 ? kGemmBK / 16 : int(left);

#pragma unroll
    for (int kb = 0; kb < kGemmBK / 16; ++kb) {
      if (kb < nkb) {
        uint32_t af[MT][4];
        uint32_t bfr[NT][2];
        const int j = lane >> 3, r = lane & 7;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const int row = wm * (BM / 2) + i * 16 + r + (j & 1) * 8;
          ldsm_x4(af[i], shared_addr(&sa[row * kGemmLds + kb * 16 + (j >> 1) * 8]));
        }
#pragma unroll
        for (int q = 0; q < NT / 2; ++q) {
          const int row = wn * (BN / 4) + q * 16 + r + (j >> 1) * 8;
          uint32_t b4[4];
          ldsm_x4(b4, shared_addr(&sb[row * kGemmLds + kb * 16 + (j & 1) * 8]));
          bfr[2 * q][0] = b4[0];
          bfr[2 * q][1] = b4[1];
          bfr[2 * q + 1][0] = b4[2];
          bfr[2 * q + 1][1] = b4[3];
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int jn = 0; jn < NT; ++jn) mma_16816(acc[i][jn], af[i], bfr[jn][0], bfr[jn][1]);
      }
    }

    // Segment finished: fold it into the tree (G.4), restart the chain from +0.
    if (kin + kGemmBK >= p.seg_len && p.segments > 1) fold_segment<true>(acc, stack, s, p.segments);
  }
  cp_async_wait<0>();  // no copy may outlive the CTA (only empty groups remain here)

  // Epilogue: bias once, one rounding, canonical NaN.
  store_mma_frags<false>(
      p, acc, [&](int i) { return m0 + wm * (BM / 2) + i * 16; },
      [&](int j) { return n0 + wn * (BN / 4) + j * 8; }, lane);
}

}  // namespace lockstep::cuda::detail
