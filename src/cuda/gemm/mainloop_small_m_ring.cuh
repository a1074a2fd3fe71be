// Small-M (decode, M <= 64) path of lockstep::cuda::gemm_bf16_nt: same contract, same bits
// (docs/contract.md §G, §M). At these M the GEMM is bound by streaming w once, and with S = 1 the
// only parallelism is over N (and M). Three main loops (tiles: plan.cc, launch_small_m.cu):
// - the cp.async ring (this file): the CTA tile is BN = 16..192 rows of w by all of M (bm = 8, 16,
//   32, 64), BN chosen so that the busiest SM streams the fewest w rows (one wave of ~128 CTAs on
//   the Qwen3-8B shapes), and each CTA keeps NS k-tiles of w and x in flight (cp.async ring filled
//   by the same warps that compute). Reduction order: every output's segment is ONE
//   mma.sync.m16n8k16 chain from +0 over the segment's k-blocks of 16 in ascending order (x = A
//   operand rows, w = B operand columns); a CTA walks the S segments in order and folds them with
//   the G.4 tree, then bias once, one rounding.
// - the TMA ring (mainloop_small_m_tma.cuh): warp-specialized, one producer warp streams w and x
//   with TMA into a deep mbarrier ring, consumer warps run the chains with the operand roles
//   swapped (A = w, B = x: the MMA model is symmetric); TMA-compatible operands only.
// - wgmma (mainloop_small_m_wgmma.cuh): the same ring feeding one consumer warpgroup's wgmma
//   chains (x = the 64-row A operand, w = B); the M > 32 candidates for BN 32/48/64.
// The tile choice (plan.cc) depends on the sizes only and never changes bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "cuda/gemm/epilogue.cuh"           // load_bias, store_output
#include "cuda/gemm/fold.cuh"               // fold_segment (§G.4)
#include "cuda/gemm/mainloop_mma_sync.cuh"  // ldmatrix, cp.async, store_mma_frags
#include "cuda/gemm/params.cuh"             // GemmParams
#include "cuda/mma_sync.cuh"                // mma_16816, cp.async group steps

namespace lockstep::cuda::detail {

// ---- The kernel.

namespace small_m {

using Params = GemmParams;

constexpr int kPad = 8;  // bf16 per smem row beyond BK: row pitch = 16 mod 128 bytes, so the
                         // 8 rows of one ldmatrix phase hit 8 distinct 16-byte bank groups

template <int BM, int BN, int BK, int NS>
constexpr int smem_bytes() {
  return NS * (BM + BN) * (BK + kPad) * 2;
}

// One CTA: a BM x BN tile of y (rows m0.., columns n0..), WM x WN warps; warp (wm, wn) owns
// MT m16 tiles (BM = 8: one half tile, rows 8..15 of the fragment are zero) x NT n8 tiles.
// Per k-tile t (BK of one segment): wait for stage t, barrier, issue the copies of tile t+NS-1,
// then every warp runs its MT·NT independent chains over the tile's k-blocks.
template <int BM, int BN, int WM, int WN, int BK, int NS>
__global__ void __launch_bounds__(32 * WM * WN) gemm_small_m_kernel(const Params p) {
  constexpr int kThreads = 32 * WM * WN;
  constexpr int kHalf = BM == 8;                  // A fragment rows 8..15 are zero
  constexpr int MT = kHalf ? 1 : BM / (16 * WM);  // m16 tiles per warp
  constexpr int NT = BN / (8 * WN);               // n8 tiles per warp
  constexpr int kLds = BK + kPad;                 // smem row pitch (bf16)
  constexpr int kCpr = BK / 8;                    // 16-byte chunks per row and stage
  constexpr int kRowStep = kThreads / kCpr;       // rows between one thread's chunks
  constexpr int kStage = (BM + BN) * kLds;        // bf16 per stage
  constexpr int kKb = BK / 16;                    // k-blocks per tile
  // Fragment registers per k-block; read up to ~64 (48 with > 256 threads) registers ahead.
  constexpr int kFragRegs = MT * (kHalf ? 2 : 4) + NT * 2;
  constexpr int kPdRaw = (kThreads > 256 ? 48 : 64) / kFragRegs;
  constexpr int kPd = kPdRaw < 1 ? 1 : (kPdRaw > kKb - 1 ? kKb - 1 : kPdRaw);
  static_assert(!kHalf || WM == 1, "BM = 8 has one warp row");
  static_assert(kHalf || BM % (16 * WM) == 0, "BM");
  static_assert(NT >= 1 && BN % (8 * WN) == 0, "BN");
  static_assert(kThreads % kCpr == 0 && kRowStep >= 1, "loader mapping");
  static_assert(NS >= 2, "stages");

  extern __shared__ __align__(16) uint16_t smem[];
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp / WN;
  const int wn = warp % WN;
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  const int64_t m0 = int64_t(blockIdx.y) * BM;
  const int rows_x = p.M - m0 < BM ? int(p.M - m0) : BM;  // rows of x / w this CTA really has
  const int rows_w = p.N - n0 < BN ? int(p.N - n0) : BN;

  // Rows past M / N are zero in every stage, written once (the copies below skip them).
  for (int i = tid; i < NS * (BM + BN); i += kThreads) {
    const int r = i % (BM + BN);
    if ((r < BM && r >= rows_x) || (r >= BM && r - BM >= rows_w)) {
      const uint32_t row = smem_base + uint32_t(((i / (BM + BN)) * kStage + r * kLds) * 2);
      for (int c = 0; c < kLds / 8; ++c) st_shared16(row + c * 16, make_uint4(0, 0, 0, 0));
    }
  }

  // Loader: this thread copies chunk column `col` of rows r0, r0 + kRowStep, ... The k-tile
  // sequence is (segment, offset in segment) ascending, tracked by counters (no divisions).
  const int col = tid % kCpr;
  const int r0 = tid / kCpr;
  const int seg_len = int(p.seg_len);
  const int tiles_per_seg = (seg_len + BK - 1) / BK;
  const int total_tiles = tiles_per_seg * p.segments;

  auto load_rows = [&](const uint16_t* base, int64_t ld, int nrows, int limit, uint32_t sdst,
                       int64_t k, bool vec) {
    // k: first element of this thread's chunk; rows [0, limit) exist (the others stay zero).
    const bool whole = vec && k + 8 <= p.K;
    const uint16_t* src = base + int64_t(r0) * ld + k;
    uint32_t dst = sdst + uint32_t((r0 * kLds + col * 8) * 2);
#pragma unroll
    for (int r = r0; r < nrows; r += kRowStep) {
      if (r < limit) {
        if (whole) {
          cp_async16(dst, src);
        } else {
          st_shared16(dst, k < p.K ? load_chunk_slow(src, k, p.K) : make_uint4(0, 0, 0, 0));
        }
      }
      src += kRowStep * ld;
      dst += uint32_t(kRowStep * kLds * 2);
    }
  };
  const uint16_t* xb = p.x + m0 * p.ldx;
  const uint16_t* wb = p.w + n0 * p.ldw;
  int l_seg = 0, l_kin = 0, l_stage = 0;  // next tile to load
  auto load_next = [&]() {
    const int64_t k = int64_t(l_seg) * seg_len + l_kin + col * 8;
    const uint32_t sa = smem_base + uint32_t(l_stage * kStage * 2);
    load_rows(xb, p.ldx, BM, rows_x, sa, k, p.x_vec);
    load_rows(wb, p.ldw, BN, rows_w, sa + uint32_t(BM * kLds * 2), k, p.w_vec);
    l_kin += BK;
    if (l_kin >= seg_len) {
      l_kin = 0;
      ++l_seg;
    }
    l_stage = l_stage + 1 == NS ? 0 : l_stage + 1;
  };

  float acc[MT][NT][4];
  zero_all(acc);
  float stack[3][MT][NT][4];  // pending left subtrees (fold.cuh; S <= 8)

#pragma unroll
  for (int st = 0; st < NS - 1; ++st) {
    if (st < total_tiles) load_next();
    cp_async_commit();
  }

  // ldmatrix addresses (bytes, stage 0, k-block 0) of this lane.
  const int j8 = lane >> 3, r8 = lane & 7;
  uint32_t a_addr[MT], b_addr[(NT + 1) / 2];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int row = kHalf ? r8 : wm * (BM / WM) + i * 16 + r8 + (j8 & 1) * 8;
    const int kof = kHalf ? (j8 & 1) * 8 : (j8 >> 1) * 8;
    a_addr[i] = smem_base + uint32_t((row * kLds + kof) * 2);
  }
#pragma unroll
  for (int q = 0; q < (NT + 1) / 2; ++q) {
    // x4: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15);
    // x2 (odd NT, last n8 tile): the first two (lanes 16-31 give no address).
    const int row = BM + wn * (BN / WN) + q * 16 + r8 + (j8 >> 1) * 8;
    b_addr[q] = smem_base + uint32_t((row * kLds + (j8 & 1) * 8) * 2);
  }

  struct Frag {
    uint32_t a[MT][4];
    uint32_t b[NT][2];
  };
  auto load_frag = [&](Frag& f, uint32_t stage_off, int kb) {
    const uint32_t ko = stage_off + uint32_t(kb * 32);
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (kHalf) {
        ldsm_x2(f.a[i][0], f.a[i][2], a_addr[i] + ko);
        f.a[i][1] = 0u;
        f.a[i][3] = 0u;
      } else {
        ldsm_x4(f.a[i], a_addr[i] + ko);
      }
    }
#pragma unroll
    for (int q = 0; q < NT / 2; ++q) {
      uint32_t b4[4];
      ldsm_x4(b4, b_addr[q] + ko);
      f.b[2 * q][0] = b4[0];
      f.b[2 * q][1] = b4[1];
      f.b[2 * q + 1][0] = b4[2];
      f.b[2 * q + 1][1] = b4[3];
    }
    if (NT % 2) ldsm_x2(f.b[NT - 1][0], f.b[NT - 1][1], b_addr[NT / 2] + ko);
  };

  // The k-blocks of one tile in ascending order, fragments read kPd blocks ahead of their
  // mma (kFull: all kKb blocks belong to the segment, no per-block test).
  auto mma_tile = [&](uint32_t so, int nkb, auto full) {
    constexpr bool kFull = decltype(full)::value;
    Frag f[kPd + 1];
#pragma unroll
    for (int kb = 0; kb < kPd; ++kb) load_frag(f[kb], so, kb);
#pragma unroll
    for (int kb = 0; kb < kKb; ++kb) {
      if (kb + kPd < kKb) load_frag(f[(kb + kPd) % (kPd + 1)], so, kb + kPd);
      if (kFull || kb < nkb) {
        const Frag& c = f[kb % (kPd + 1)];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int j = 0; j < NT; ++j) mma_16816(acc[i][j], c.a[i], c.b[j][0], c.b[j][1]);
      }
    }
  };

  int c_seg = 0, c_kin = 0, c_stage = 0;  // tile being multiplied
  for (int t = 0; t < total_tiles; ++t) {
    cp_async_wait<NS - 2>();  // tile t has landed (this thread's copies) ...
    __syncthreads();          // ... everyone's, and stage (t-1) % NS is no longer read
    if (t + NS - 1 < total_tiles) load_next();
    cp_async_commit();

    const uint32_t so = uint32_t(c_stage * kStage * 2);
    const int left = (seg_len - c_kin) / 16;  // k-blocks of segment c_seg from here on
    if (left >= kKb) {
      mma_tile(so, kKb, std::true_type{});
    } else {
      mma_tile(so, left, std::false_type{});
    }

    c_kin += BK;
    c_stage = c_stage + 1 == NS ? 0 : c_stage + 1;
    if (c_kin >= seg_len) {
      // Segment finished: fold it into the tree (G.4: left operand = earlier subtree), restart.
      if (p.segments > 1) fold_segment<true>(acc, stack, c_seg, p.segments);
      c_kin = 0;
      ++c_seg;
    }
  }
  cp_async_wait<0>();  // no copy may outlive the CTA (only empty groups remain here)

  // Epilogue: bias once, one rounding, canonical NaN. Fragment rows >= 8 of a half tile are
  // padding (never stored).
  store_mma_frags<kHalf>(
      p, acc, [&](int i) { return m0 + (kHalf ? 0 : wm * (BM / WM) + i * 16); },
      [&](int j) { return n0 + wn * (BN / WN) + j * 8; }, lane);
}

}  // namespace small_m
}  // namespace lockstep::cuda::detail
