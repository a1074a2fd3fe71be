// wgmma small-M (decode) GEMM kernel (tiles: plan.cc, launch_small_m.cu):
// one producer thread streams x and w with TMA (128B swizzle, zero fill) through an NS-stage
// mbarrier ring; one consumer warpgroup runs wgmma.m64nBNk16 with x as the 64-row A operand (all
// of M <= 64; rows >= M are TMA zero fill) and BN = 32..64 rows of w as the B operand, both read
// by the tensor cores straight from shared memory (no ldmatrix, no register copies: half the
// shared-memory reads of the TMA-ring tiles at M = 64).
// Bits (docs/contract.md §G.3, §M.2): each output's segment is ONE wgmma chain on its accumulator
// registers, the segment's first k-block with scale-d = 0 (= c = +0), then every k-block of 16 of
// the segment in ascending k; k-blocks past the segment end are never issued, elements k >= K are
// zero fill (exact no-ops). Segments fold with the G.4 tree in registers (S <= 8), then bias once,
// one rounding, canonical NaN — the same bits as every other small-M tile.
// The planner takes these tiles for M > 32 and BN 32 / 48 / 64 (measured: docs/cuda-gemm.md).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only)
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/epilogue.cuh"              // load_bias, store_output
#include "cuda/gemm/fold.cuh"                  // fold_segment (§G.4)
#include "cuda/gemm/mainloop_small_m_tma.cuh"  // Params
#include "cuda/sm90_async.cuh"                 // mbarriers, TMA loads
#include "cuda/sm90_wgmma.cuh"                 // wgmma_k16, sw128_desc, fences, fence_acc

namespace lockstep::cuda::detail::small_m_wg {

using small_m_ws::Params;

// Geometry of one instantiation: BN rows of w per CTA (the wgmma N), KB64 boxes of 64 k per stage,
// NS stages. Stage layout (bytes from the stage base, every box 1024-aligned): KB64 x boxes of
// 64 rows x 128 bytes, then KB64 w boxes of BN rows x 128 bytes, as TMA writes them (128B swizzle).
template <int BN, int KB64, int NS>
struct Shape {
  static constexpr int BM = 64;
  static constexpr int kThreads = 256;  // producer warpgroup (one thread issues) + consumers
  static constexpr int BK = KB64 * 64;
  static constexpr int KB = BK / 16;  // k-blocks per stage
  static constexpr int kXBox = BM * 128;
  static constexpr int kWBox = BN * 128;
  static constexpr int kStage = KB64 * (kXBox + kWBox);
  static constexpr int kSmem = NS * kStage + 2 * NS * 8 + 1024;
  static_assert(BN == 32 || BN == 48 || BN == 64, "wgmma N of the small-M tiles");
  static_assert(kWBox % 1024 == 0 && kXBox % 1024 == 0, "boxes 1024-aligned (128B swizzle atom)");
  static_assert(NS >= 2 && kSmem <= 232448, "stages / shared memory per block");

  __host__ __device__ static uint32_t x_box(int b) { return uint32_t(b * kXBox); }
  __host__ __device__ static uint32_t w_box(int b) { return uint32_t(KB64 * kXBox + b * kWBox); }
  // Tile sequence: segments in order, each nkt(Ls) k-tiles; tile kt of segment sg covers
  // k in [sg·Ls + kt·BK, +BK), of which the first tile_kblocks k-blocks belong to the segment.
  __host__ __device__ static int nkt(int seg_len) { return (seg_len + BK - 1) / BK; }
  __host__ __device__ static int tile_kblocks(int seg_len, int kt) {
    const int left = (seg_len - kt * BK) / 16;
    return left < KB ? left : KB;
  }
};

// Grid (⌈N/BN⌉, ⌈M/64⌉); CTA (bx, by) computes y[by·64 .., bx·BN ..]. Threads 0-127: the
// producer warpgroup (thread 0 issues every copy); threads 128-255: the consumer warpgroup.
// NOTE: the shape of the code follows mainloop_sm90.cuh where ptxas is sensitive: the roles split
// at a warpgroup boundary with if/else (no early return), `setmaxnreg` in both roles, segments and
// k-tiles as nested loops with the segment's final wait outside the k-tile loop, each wgmma branch
// with its own fence and commit. Without the `setmaxnreg` pair ptxas serialized every wgmma
// (C7518/C7520: a wait after each HGMMA) even in this shape (checked in the SASS); the
// other choices were not tried one at a time.
template <int BN, int KB64, int NS>
__global__ void __launch_bounds__(256, 1)
    gemm_small_m_wg_kernel(const __grid_constant__ CUtensorMap tm_x,
                           const __grid_constant__ CUtensorMap tm_w, const Params p) {
  using Sh = Shape<BN, KB64, NS>;
  constexpr int KB = Sh::KB, R = BN / 2;
  extern __shared__ uint8_t wg_smem[];
  const uint32_t raw = smem_u32(wg_smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t bars = base + uint32_t(NS * Sh::kStage);  // full[NS], then empty[NS]
  auto full_bar = [&](int s) { return bars + 8u * uint32_t(s); };
  auto empty_bar = [&](int s) { return bars + 8u * uint32_t(NS + s); };

  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < NS; ++s) {
      mbar_init(full_bar(s), 1);   // the producer's arrive.expect_tx (+ the bytes)
      mbar_init(empty_bar(s), 4);  // lane 0 of each consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_w)) : "memory");
  }
  __syncthreads();  // the roles below never meet again

  const int64_t n0 = int64_t(blockIdx.x) * BN;
  const int64_t m0 = int64_t(blockIdx.y) * Sh::BM;
  const int seg_len = int(p.seg_len);
  const int nkt = Sh::nkt(seg_len);

  if (tid < 128) {
    // ---- Producer (only the boxes holding segment k-blocks are loaded). Registers go to the
    // consumers.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int sg = 0; sg < p.segments; ++sg) {
        for (int kt = 0; kt < nkt; ++kt) {
          const int nbox = (Sh::tile_kblocks(seg_len, kt) + 3) / 4;
          mbar_wait(empty_bar(stage), phase ^ 1u);
          mbar_arrive_expect_tx(full_bar(stage), uint32_t(nbox * (Sh::kXBox + Sh::kWBox)));
          const uint32_t sb = base + uint32_t(stage * Sh::kStage);
          const int32_t k0 = int32_t(sg * seg_len + kt * Sh::BK);
          for (int b = 0; b < nbox; ++b) {
            tma_load_2d(sb + Sh::x_box(b), &tm_x, k0 + b * 64, int32_t(m0), full_bar(stage));
            tma_load_2d(sb + Sh::w_box(b), &tm_w, k0 + b * 64, int32_t(n0), full_bar(stage));
          }
          if (++stage == NS) {
            stage = 0;
            phase ^= 1u;
          }
        }
      }
    }
  } else {
    // ---- Consumer warpgroup.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    const int wt = tid & 127;
    const int warp = wt >> 5, lane = wt & 31;
    float acc[R];
    zero_all(acc);
    // Pending left subtrees of the G.4 tree (fold.cuh; S <= 8).
    float stack[3][R];

    int stage = 0;
    uint32_t phase = 0;
    for (int sg = 0; sg < p.segments; ++sg) {
      int prev = 0;
      for (int kt = 0; kt < nkt; ++kt) {
        mbar_wait(full_bar(stage), phase);
        const uint32_t sb = base + uint32_t(stage * Sh::kStage);
        const int nkb = Sh::tile_kblocks(seg_len, kt);
        // Every register a wgmma reads is written before wgmma.fence. k-block kb of the stage:
        // box kb / 4, 32 bytes per k-block inside the 128-byte swizzled row.
        uint64_t da[KB], db[KB];
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) {
          da[kb] = sw128_desc(sb + Sh::x_box(kb >> 2) + 32u * uint32_t(kb & 3));
          db[kb] = sw128_desc(sb + Sh::w_box(kb >> 2) + 32u * uint32_t(kb & 3));
          asm volatile("" : "+l"(da[kb]), "+l"(db[kb]));
        }
        // The chain: scale-d = 0 only on the segment's first k-block; k-blocks in ascending k.
        int sd0 = kt > 0 ? 1 : 0, sd1 = 1;
        asm volatile("" : "+r"(sd0), "+r"(sd1));
        fence_acc(acc);
        if (nkb == KB) {
          wgmma_fence();
          wgmma_k16<BN>(acc, da[0], db[0], sd0);
#pragma unroll
          for (int kb = 1; kb < KB; ++kb) wgmma_k16<BN>(acc, da[kb], db[kb], sd1);
          wgmma_commit();
        } else {  // the segment's last k-tile when Ls is not a multiple of BK (rare)
          wgmma_fence();
          wgmma_k16<BN>(acc, da[0], db[0], sd0);
#pragma unroll
          for (int kb = 1; kb < KB - 1; ++kb)
            if (kb < nkb) wgmma_k16<BN>(acc, da[kb], db[kb], sd1);
          wgmma_commit();
        }
        fence_acc(acc);
        if (kt > 0) {
          wgmma_wait<1>();  // the previous k-tile's wgmmas are done: release its stage
          fence_acc(acc);
          if (lane == 0) mbar_arrive(empty_bar(prev));
        }
        prev = stage;
        if (++stage == NS) {
          stage = 0;
          phase ^= 1u;
        }
      }
      // Segment sg done: its chain completes, its last stage is released.
      wgmma_wait<0>();
      fence_acc(acc);
      if (lane == 0) mbar_arrive(empty_bar(prev));
      if (p.segments > 1) {
        // The next segment's chain starts with scale-d = 0, so acc needs no reset.
        fold_segment<false>(acc, stack, sg, p.segments);
        fence_acc(acc);
      }
    }

    // Epilogue: acc[4i + 2h + c] is row 16·warp + lane/4 + 8h (m), column 8i + 2(lane%4) + c (n)
    // of the tile; bias once, one rounding, canonical NaN.
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t n = n0 + 8 * i + 2 * (lane & 3) + c;
        if (n >= p.N) continue;
        float b = 0.0f;
        if (p.bias) b = load_bias(p.bias, p.bias_stride, p.bias_f32, n);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t m = m0 + 16 * warp + (lane >> 2) + 8 * h;
          if (m >= p.M) continue;
          float v = acc[4 * i + 2 * h + c];
          if (p.bias) v = __fadd_rn(v, b);
          store_output(p.y, p.ldy, p.y_f32, m, n, v);
        }
      }
    }
  }
}

}  // namespace lockstep::cuda::detail::small_m_wg
