// Warp-specialized small-M (decode) GEMM kernel: one producer warp streams w and x through an
// NS-stage ring with TMA (cp.async.bulk.tensor, 128B swizzle, zero fill out of bounds, completion
// on mbarriers), WM x WN consumer warps only read fragments (ldmatrix) and run mma.sync chains; no
// __syncthreads in the main loop. Same contract, same bits as mainloop_small_m_ring.cuh
// (docs/contract.md §G, §M): the roles of the operands are swapped, y^T = w · x^T: A = 16 rows of w
// (n), B = 8 rows of x (m), so one m16n8k16 advances the chains of 16 outputs n x 8 rows m by one
// k-block. The MMA model is symmetric in a <-> b (§M.1: the same 16 exact products, the same c), so
// each output's segment is still ONE chain from +0 over its k-blocks of 16 in ascending order;
// segments are folded with the G.4 tree in registers (left = earlier subtree), then bias once, one
// rounding, canonical NaN. Rows >= M / >= N and columns >= K arrive as TMA zero fill (zero products
// are exact no-ops, G.2). Needs TMA-compatible operands (16-byte aligned bases, row strides a
// multiple of 8 elements, K >= 1): the launcher declines the others.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; the encoder is fetched from the driver at run time)
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/gemm/epilogue.cuh"            // load_bias, store_output
#include "cuda/gemm/fold.cuh"                // fold_segment (§G.4)
#include "cuda/gemm/mainloop_mma_sync.cuh"   // ldsm_x4, ldsm_x2 (+ mma_sync.cuh)
#include "cuda/gemm/params.cuh"              // TmaGemmParams
#include "cuda/gemm/small_m_tma_layout.cuh"  // Shape: geometry, tile sequence, lane addresses
#include "cuda/sm90_async.cuh"  // mbarriers (mbar_wait traps instead of hanging), TMA loads

namespace lockstep::cuda::detail::small_m_ws {

using Params = TmaGemmParams;

// ---- Thread-block clusters (CL > 1): x is multicast to the CL CTAs of a cluster, so a stage's
// slot may be refilled only when every CTA of the cluster released it.
// The same box into the same shared-memory offset of every CTA in cta_mask, completing on the
// mbarrier at the same offset in each of them.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map,
                                                      int32_t k, int32_t row, uint32_t bar,
                                                      uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(bar), "h"(cta_mask)
      : "memory");
}
// Arrive on the mbarrier at the same offset in CTA `cta` of the cluster. NOTE: the plain form
// CUTLASS's cluster pipelines use for the same purpose (releasing a stage that peers multicast
// into); the explicit .release.cluster form compiles to a MEMBAR.ALL.GPU per arrive.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 ra;\n"
      "mapa.shared::cluster.u32 ra, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
      "r"(cta)
      : "memory");
}
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_arrive() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// Grid (⌈N/BN⌉, ⌈M/BM⌉); CTA (bx, by) computes y[by·BM .., bx·BN ..]. Stage s of the ring sits
// at base + s·kStage (layout, tile sequence and lane addresses: Shape in
// small_m_tma_layout.cuh). Consumers read the fragments of the next k-block before the mma of
// the current one (across stage boundaries too), so the chains never wait for shared memory; a
// stage is released (mbarrier arrive, one per consumer warp) as soon as its last fragments have
// been read.
// CL > 1 (launched as clusters of CL CTAs along x, grid.x a multiple of CL): the CTAs of a
// cluster share m0 and x; CTA rank r loads rows [r·BM/CL, (r+1)·BM/CL) of each x box and
// multicasts them into the same place of every CTA of the cluster, each CTA loads its own w. A
// stage's full barrier expects the whole stage (its w boxes + all x slices) as before; its empty
// barrier counts the consumer warps of all CL CTAs (each consumer warp arrives on the empty
// barrier of every CTA of the cluster), since every producer writes into every CTA. A cluster
// barrier after the mbarrier initialization and one at the very end (no CTA leaves while a peer
// may still arrive on its barriers) complete the protocol.
template <int WM, int MB, int WN, int NA, int KB64, int NS, int CL = 1>
__global__ void __launch_bounds__(Shape<WM, MB, WN, NA, KB64, NS>::kThreads, 1)
    gemm_small_m_ws_kernel(const __grid_constant__ CUtensorMap tm_x,
                           const __grid_constant__ CUtensorMap tm_w, const Params p) {
  using Sh = Shape<WM, MB, WN, NA, KB64, NS>;
  constexpr int BM = Sh::BM, BN = Sh::BN, KB = Sh::KB;
  constexpr int kWBox = Sh::kWBox, kXBox = Sh::kXBox, kStage = Sh::kStage;
  constexpr int kConsumers = Sh::kConsumers;
  static_assert(CL == 1 || CL == 2 || CL == 4, "cluster size");
  static_assert(BM % (8 * CL) == 0, "x slices of whole 8-row (1024-byte) swizzle atoms");
  constexpr int kXSliceRows = BM / CL;

  extern __shared__ uint8_t ws_smem[];
  const uint32_t raw = smem_u32(ws_smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t bars = base + uint32_t(NS * kStage);  // full[NS], then empty[NS]
  auto full_bar = [&](int s) { return bars + 8u * uint32_t(s); };
  auto empty_bar = [&](int s) { return bars + 8u * uint32_t(NS + s); };

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  if (tid == 0) {
    for (int s = 0; s < NS; ++s) {
      mbar_init(full_bar(s), 1);                 // the producer's arrive.expect_tx (+ the bytes)
      mbar_init(empty_bar(s), kConsumers * CL);  // lane 0 of each consumer warp (of the cluster)
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_w)) : "memory");
  }
  // The last CTA-wide (cluster-wide) barrier before the end: the roles below never meet again.
  if constexpr (CL == 1) {
    __syncthreads();
  } else {
    cluster_arrive();
    cluster_wait();
  }
  const uint32_t crank = CL == 1 ? 0u : cluster_ctarank();

  const int64_t n0 = int64_t(blockIdx.x) * BN;
  const int64_t m0 = int64_t(blockIdx.y) * BM;
  const int seg_len = int(p.seg_len);
  const int nkt = Sh::nkt(seg_len);  // k-tiles per segment
  const int total = nkt * p.segments;

  if (warp == kConsumers) {
    // ---- Producer: one thread issues every copy.
    if (lane == 0) {
      int stage = 0;
      uint32_t phase = 0;
      int sg = 0, kt = 0;
      for (int t = 0; t < total; ++t) {
        const int nbox = Sh::tile_boxes(seg_len, kt);
        // Every consumer warp (of every CTA of the cluster) released this stage.
        mbar_wait(empty_bar(stage), phase ^ 1u);
        mbar_arrive_expect_tx(full_bar(stage), uint32_t(nbox * (kWBox + kXBox)));
        const uint32_t sb = base + uint32_t(stage * kStage);
        const int32_t k0 = Sh::tile_k0(seg_len, sg, kt);
        for (int b = 0; b < nbox; ++b) {
          tma_load_2d(sb + Sh::w_box(b), &tm_w, k0 + b * kBoxK, int32_t(n0), full_bar(stage));
          if constexpr (CL == 1) {
            tma_load_2d(sb + Sh::x_box(b), &tm_x, k0 + b * kBoxK, int32_t(m0), full_bar(stage));
          } else {
            tma_load_2d_multicast(sb + Sh::x_box(b) + crank * uint32_t(kXSliceRows * 128), &tm_x,
                                  k0 + b * kBoxK, int32_t(m0 + int64_t(crank) * kXSliceRows),
                                  full_bar(stage), uint16_t((1u << CL) - 1u));
          }
        }
        if (++stage == NS) {
          stage = 0;
          phase ^= 1u;
        }
        if (++kt == nkt) {
          kt = 0;
          ++sg;
        }
      }
    }
    if constexpr (CL > 1) {
      __syncwarp();
      cluster_arrive();
      cluster_wait();
    }
    return;
  }

  // ---- Consumer warp (wm, wn): w rows wn·NA·16 .. +NA·16, x rows wm·MB·8 .. +MB·8 of the tile.
  const int wm = warp / WN, wn = warp % WN;
  const uint32_t a_row = Sh::a_lane_row(lane, wn), a_sw = Sh::a_lane_sw(lane);
  const uint32_t b_row = Sh::b_lane_row(lane, wm), b_sw = Sh::b_lane_sw(lane);

  struct Frag {
    uint32_t a[NA][4];
    uint32_t b[MB][2];
  };
  // Fragments of k-block kb (0 <= kb < KB) of the stage at shared address sb.
  auto load_frag = [&](Frag& f, uint32_t sb, int kb) {
    const uint32_t aa = sb + Sh::a_addr(a_row, a_sw, kb);
    const uint32_t ba = sb + Sh::b_addr(b_row, b_sw, kb);
#pragma unroll
    for (int i = 0; i < NA; ++i) ldsm_x4(f.a[i], aa + uint32_t(i) * Sh::a_tile_step());
    if constexpr (MB == 1) {
      ldsm_x2(f.b[0][0], f.b[0][1], ba);
    } else {
#pragma unroll
      for (int q = 0; q < MB / 2; ++q) {
        uint32_t r[4];
        ldsm_x4(r, ba + uint32_t(q) * Sh::b_pair_step());
        f.b[2 * q][0] = r[0];
        f.b[2 * q][1] = r[1];
        f.b[2 * q + 1][0] = r[2];
        f.b[2 * q + 1][1] = r[3];
      }
    }
  };

  float acc[NA][MB][4];
  zero_all(acc);
  float stack[3][NA][MB][4];  // pending left subtrees (fold.cuh; S <= 8)

  Frag cur, nxt;
  zero_all(nxt.a);
  zero_all(nxt.b);

  int stage = 0;
  uint32_t phase = 0;
  mbar_wait(full_bar(0), 0);
  load_frag(cur, base, 0);
  int sg = 0, kt = 0;
  for (int t = 0; t < total; ++t) {
    const uint32_t sb = base + uint32_t(stage * kStage);
    const int nstage = stage + 1 == NS ? 0 : stage + 1;
    const uint32_t nphase = stage + 1 == NS ? (phase ^ 1u) : phase;
    const bool has_next = t + 1 < total;
    const int nkb = Sh::tile_kblocks(seg_len, kt);  // k-blocks of segment sg in this tile
    // One k-block: read the next k-block's fragments (on this tile's last k-block: release this
    // stage, wait for the next one), then advance every chain of the warp by the current one.
    auto step = [&](int kb, int n) {
      if (kb + 1 < n) {
        load_frag(nxt, sb, kb + 1);
      } else {
        __syncwarp();
        if constexpr (CL == 1) {
          if (lane == 0) mbar_arrive(empty_bar(stage));
        } else {
          if (lane < CL) mbar_arrive_cluster(empty_bar(stage), uint32_t(lane));
        }
        if (has_next) {
          mbar_wait(full_bar(nstage), nphase);
          load_frag(nxt, base + uint32_t(nstage * kStage), 0);
        }
      }
#pragma unroll
      for (int i = 0; i < NA; ++i)
#pragma unroll
        for (int j = 0; j < MB; ++j) mma_16816(acc[i][j], cur.a[i], cur.b[j][0], cur.b[j][1]);
      cur = nxt;
    };
    if (nkb == KB) {
#pragma unroll
      for (int kb = 0; kb < KB; ++kb) step(kb, KB);
    } else {
#pragma unroll 1
      for (int kb = 0; kb < nkb; ++kb) step(kb, nkb);
    }
    stage = nstage;
    phase = nphase;
    if (++kt == nkt) {
      // Segment sg finished: fold it into the tree (G.4: left operand = earlier subtree).
      if (p.segments > 1) fold_segment<true>(acc, stack, sg, p.segments);
      kt = 0;
      ++sg;
    }
  }

  if constexpr (CL > 1) cluster_arrive();  // this warp's last arrives on the peers are done

    // Epilogue: bias once, one rounding, canonical NaN (acc[i][j][2h + e]: Sh::out_n, Sh::out_m).
#pragma unroll
  for (int i = 0; i < NA; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + Sh::out_n(lane, wn, i, h);
      if (n >= p.N) continue;
      float b = 0.0f;
      if (p.bias) b = load_bias(p.bias, p.bias_stride, p.bias_f32, n);
#pragma unroll
      for (int j = 0; j < MB; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t m = m0 + Sh::out_m(lane, wm, j, e);
          if (m >= p.M) continue;
          float v = acc[i][j][h * 2 + e];
          if (p.bias) v = __fadd_rn(v, b);
          store_output(p.y, p.ldy, p.y_f32, m, n, v);
        }
      }
    }
  }
  if constexpr (CL > 1) cluster_wait();  // no peer arrives on this CTA's barriers any more
}

}  // namespace lockstep::cuda::detail::small_m_ws
