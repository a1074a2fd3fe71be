// The GEMM kernel: one CTA computes a BM x BN tile of y with 8 warps (2 along M x 4 along N), each
// warp (BM/2) x (BN/4) outputs in mma.sync.m16n8k16 fragments. K is walked segment by segment
// (docs/contract.md §G.2), each segment in k-tiles of 64 ascending; every output's segment value is
// ONE accumulator chain from +0 over the segment's k-blocks of 16 in ascending order (§G.3, §M).
// Segment values are combined with the balanced tree of §G.4 through a per-thread stack
// (binary-counter order: left operand = the earlier subtree), then bias once, then one rounding.
// Global -> shared through an NS-stage cp.async pipeline (plain stores for edge/unaligned
// chunks, zero-filled) -> ldmatrix -> mma.sync.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/mma_sync.cuh"  // mma_16816, cp.async group steps, round_bf16_canonical

namespace lockstep::cuda::detail {

constexpr int kGemmThreads = 256;      // 8 warps
constexpr int kGemmBK = 64;            // k per tile (four k-blocks of 16)
constexpr int kGemmLds = 72;           // shared row stride in bf16 (144 B: ldmatrix conflict-free)
constexpr int kGemmCpr = kGemmBK / 8;  // 16-byte chunks per row of a tile

// Which kernel ran (tests force each one through the hook below; the library itself chooses from
// sizes, strides and alignment only: src/cuda/gemm_bf16_nt.cu).
enum class GemmPath : int {
  kAuto = 0,      // the launcher's choice
  kSmallM,        // gemm_small_m.cu (M <= 64, when it takes the case)
  kMma32x64,      // this file, 32x64 tiles
  kMma128x128,    // this file, 128x128 tiles
  kWgmma128x256,  // gemm_sm90.cuh; several segments: fp32 workspace + tree kernel
  kWgmma128x128,
  kWgmma64x128,
  kWgmma128x128Tree,  // gemm_sm90.cuh, segments looped in the CTA, register tree (S <= 2)
  kWgmma64x128Tree,   // same, S <= 8
  // S = 4 or 8: the 128x128 in-CTA tree over each pair of segments (S/2 launches, each writing
  // one fp32 plane), then the tree kernel over the S/2 planes (G.4's upper levels), bias, rounding
  kWgmma128x128Pairs,
  // 64x256 tiles, the two consumer warpgroups on alternate tiles (one's epilogue overlaps the
  // other's k-loop); several segments: fp32 workspace + tree kernel. Forced only (not measured yet)
  kWgmma64x256PingPong,
};
// Test hook (process-wide, not thread-safe): run `p` for every following call where the operands
// allow it (a wgmma path needs TMA-compatible operands, else the 128x128 mma.sync kernel runs);
// kAuto restores the normal choice. gemm_last_path_for_tests() says what the last call ran.
void gemm_force_path_for_tests(GemmPath p);
GemmPath gemm_last_path_for_tests();
const char* gemm_path_name(GemmPath p);

// ---- Internal entry point: the Hopper kernel with the fused log-prob epilogue (used by
// src/cuda/logprob.cu; docs/cuda-gemm.md "Fused log-prob epilogue"). Instead of storing the fp32
// logits z[m, n] = x[m, :]·w[n, :] (one segment, the §G.3 chain), each 128x256 tile writes the
// docs/contract.md §L.5 tile state (m, s, w) of y = z / tau for each of its rows, one vocab tile
// of 256 = the tile's columns: states[(m · n_tiles + tile0 + n0 / 256) · 3 + {0, 1, 2}] (raw
// fp32, NaN payload unspecified, as the unfused tile-state kernel writes them); columns n >= N
// are padding (y = −inf). y_target[m] = y[m, col] for col = targets[row0 + m] − target_base when
// that target is not ignore_index and col ∈ [0, N) (else y_target[m] is left as it is).
struct GemmLogprobEpilogue {  // trivial (no member initializers): a kernel parameter's member
  float tau;
  float* states;  // [M, n_tiles] of (m, s, w)
  int64_t n_tiles;
  int64_t tile0;    // vocab tile of column 0 (a multiple of 256 columns per tile)
  float* y_target;  // [M]
  const void* targets;
  int64_t targets_stride;
  int targets_i64;
  int64_t row0;         // targets index of row 0
  int64_t target_base;  // global vocab id of column 0
  int64_t ignore_index;
};
constexpr int kLogprobFusedTile = 256;  // the vocab tile the fused epilogue computes

// The fused kernel takes x [M, K] (rows ldx apart) and w [N, K] (rows ldw apart) iff they are
// TMA-compatible (16-byte aligned bases, row strides a multiple of 8 covering K, K >= 1, sizes
// below 2^31): a function of pointers' alignment, strides and sizes only.
bool gemm_logprob_fused_ok(const void* x, int64_t M, int64_t ldx, const void* w, int64_t N,
                           int64_t ldw, int64_t K);
// One segment of length seg_len (K rounded up to 16: gemm_segments == 1). Requires
// gemm_logprob_fused_ok; M, N >= 1. Asynchronous on `stream`; throws lockstep::Error on a failed
// launch.
void gemm_bf16_nt_logprob_fused(const uint16_t* x, int64_t M, int64_t ldx, const uint16_t* w,
                                int64_t N, int64_t ldw, int64_t K, int64_t seg_len,
                                const GemmLogprobEpilogue& e, cudaStream_t stream);

struct GemmParams {
  const uint16_t* x;
  const uint16_t* w;
  const void* bias;  // nullptr, bf16 or f32
  void* y;
  int64_t M, N, K;
  int64_t ldx, ldw, ldy, bias_stride;  // elements
  int64_t seg_len;                     // Ls (multiple of 16)
  int segments;                        // S
  int bias_f32;                        // 1: bias is f32, 0: bf16
  int y_f32;                           // 1: y is f32, 0: bf16
  int x_vec, w_vec;                    // 16-byte loads allowed (base and row stride aligned)
};

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const uint16_t* p) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src));
}

// One 8-element chunk of a row (k in [k0, k0+8)), zero outside [0, klim) and for rows >= rows.
__device__ __forceinline__ uint4 load_chunk(const uint16_t* base, int64_t ld, int64_t row,
                                            int64_t rows, int64_t k0, int64_t klim, bool vec) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (row >= rows || k0 >= klim) return v;
  const uint16_t* p = base + row * ld + k0;
  if (vec && k0 + 8 <= klim) return *reinterpret_cast<const uint4*>(p);
  uint16_t e[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = (k0 + i < klim) ? p[i] : uint16_t(0);
  v.x = uint32_t(e[0]) | (uint32_t(e[1]) << 16);
  v.y = uint32_t(e[2]) | (uint32_t(e[3]) << 16);
  v.z = uint32_t(e[4]) | (uint32_t(e[5]) << 16);
  v.w = uint32_t(e[6]) | (uint32_t(e[7]) << 16);
  return v;
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
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
  // Pending left subtrees of the segment tree (levels 0..2; S <= 8), per thread.
  float stack[3][MT][NT][4];

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
          ldsm_x4(af[i], &sa[row * kGemmLds + kb * 16 + (j >> 1) * 8]);
        }
#pragma unroll
        for (int q = 0; q < NT / 2; ++q) {
          const int row = wn * (BN / 4) + q * 16 + r + (j >> 1) * 8;
          uint32_t b4[4];
          ldsm_x4(b4, &sb[row * kGemmLds + kb * 16 + (j & 1) * 8]);
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
    if (kin + kGemmBK >= p.seg_len && p.segments > 1) {
      int lvl = 0;
      for (; (s >> lvl) & 1; ++lvl) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int jn = 0; jn < NT; ++jn)
#pragma unroll
            for (int c = 0; c < 4; ++c)
              acc[i][jn][c] = __fadd_rn(stack[lvl][i][jn][c], acc[i][jn][c]);
      }
      if (s + 1 < p.segments) {
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int jn = 0; jn < NT; ++jn)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              stack[lvl][i][jn][c] = acc[i][jn][c];
              acc[i][jn][c] = 0.0f;
            }
      }
    }
  }
  cp_async_wait<0>();  // no copy may outlive the CTA (only empty groups remain here)

  // Epilogue: bias once, one rounding, canonical NaN.
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int i = 0; i < MT; ++i) {
#pragma unroll
    for (int jn = 0; jn < NT; ++jn) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t m = m0 + wm * (BM / 2) + i * 16 + g + (c >> 1) * 8;
        const int64_t n = n0 + wn * (BN / 4) + jn * 8 + tq * 2 + (c & 1);
        if (m < p.M && n < p.N) {
          float v = acc[i][jn][c];
          if (p.bias) {
            const float b =
                p.bias_f32
                    ? static_cast<const float*>(p.bias)[n * p.bias_stride]
                    : __uint_as_float(
                          uint32_t(static_cast<const uint16_t*>(p.bias)[n * p.bias_stride]) << 16);
            v = __fadd_rn(v, b);
          }
          if (p.y_f32) {
            static_cast<uint32_t*>(p.y)[m * p.ldy + n] = canonical_f32_bits(v);
          } else {
            static_cast<uint16_t*>(p.y)[m * p.ldy + n] = round_bf16_canonical(v);
          }
        }
      }
    }
  }
}

}  // namespace lockstep::cuda::detail
