// Hopper kernel of lockstep::cuda::gemm_bf16_nt (design: docs/cuda-gemm.md). wgmma m64nNk16
// (bf16 -> f32, A and B K-major in shared memory through 128B-swizzle descriptors) fed by TMA
// (cp.async.bulk.tensor, 128B swizzle, zero fill out of bounds) through an NS-stage mbarrier
// pipeline; warpgroup 0 produces (one thread issues the copies), warpgroups 1 and 2 consume.
// Persistent: CTA b runs jobs b, b + grid, ...; a job is one BM x BN tile of one K segment, or
// (LEVELS > 0) a whole tile with all its segments, or (ping-pong with LEVELS > 0) one segment of
// one of the CTA's tiles, which go in pairs (sm90_stash_job).
// Bits (docs/contract.md §G.3, §M.2): each output's segment is ONE wgmma chain, first k-block with
// scale-d = 0 (= c = +0), then every k-block of 16 of the segment in ascending k, in order on the
// same accumulator registers (accumulate mode: every k-block scale-d = 1 on y's value); k-blocks
// past the segment end are never issued, elements k >= K are
// TMA zero fill (exact no-ops). Segments are combined by the G.4 tree either in registers
// (LEVELS > 0, fold.cuh; 64 x 256 warpgroup tiles: through a stash in global memory) or, one job
// per segment, through workspace planes and the tree kernel (tree_combine.cuh, G.10); then bias
// once (fp32 RNE), one rounding, canonical NaN (epilogue.cuh).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; the encoder is fetched from the driver at run time)
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/gemm/epilogue.cuh"  // staging, sm90_store_rows
#include "cuda/gemm/fold.cuh"      // fold_segment (§G.4)
#include "cuda/gemm/params.cuh"    // Sm90Params
#include "cuda/gemm/plan.h"        // gemm_tree_upper_in_smem
#include "cuda/sm90_async.cuh"     // mbarriers, TMA loads
#include "cuda/sm90_wgmma.cuh"     // wgmma, descriptors, accumulator fences

namespace lockstep::cuda::detail {

constexpr int kSm90BK = 64;        // k per stage: one 128-byte (swizzle-width) row of bf16
constexpr int kSm90Threads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kSm90GroupM = 8;     // tile raster: 8 row tiles share a column sweep (L2 reuse)

// The register tree of the 128 x 128 tile with two levels (S = 4, plan.h
// gemm_tree_upper_in_smem): 64 accumulators and two pending levels of 64 left ptxas too few
// registers even at setmaxnreg's 232 (it spilled 148 bytes per thread around every segment's
// k-loop). Its upper level lives in shared memory instead (one 64 x 128 fp32 tile per consumer
// warpgroup, each thread's own words: no barrier), the lower one in registers.
//
// Dynamic shared memory of one CTA: NS stages of A (BM rows) + B (BN rows) x 128 bytes, the
// 2·NS mbarriers, the epilogue staging (epilogue.cuh), slack to align the stages to 1024 bytes
// (the 128B swizzle atom), and that upper level where gemm_tree_upper_in_smem.
// YSLOTS > 0 (the accumulate mode with y through TMA, Sm90TmaYEpilogue: YSLOTS y boxes in shared
// memory per consumer warpgroup): no staging; 1024 bytes of mbarriers, then each consumer
// warpgroup's y slots (1024-aligned: the 128B swizzle atom).
constexpr int kSm90YBox = 64 * 32 * 4;  // one y box: 64 rows x 32 f32 columns (128 bytes)
template <int BM, int BN, int NS, int LEVELS = 0, int YSLOTS = 0>
constexpr int sm90_smem_bytes() {
  if constexpr (YSLOTS > 0) return NS * (BM + BN) * 128 + 1024 + 2 * YSLOTS * kSm90YBox + 1024;
  return NS * (BM + BN) * 128 + 2 * NS * 8 + kSm90EpiBytes + 1024 +
         (gemm_tree_upper_in_smem(BM, BN, LEVELS) ? BM * BN * 4 : 0);
}

struct Sm90Job {
  int64_t m0, n0;
  int s;
};

// Job -> (tile, segment). Tiles are rastered in groups of kSm90GroupM row tiles: consecutive jobs
// sweep the columns of a few row tiles, so concurrent CTAs share x rows and w rows in L2.
template <int BM, int BN>
__device__ __forceinline__ Sm90Job sm90_job(int64_t job, int64_t num_m, int64_t num_n, int nseg) {
  const int64_t tile = job / nseg;
  const int s = int(job - tile * nseg);
  const int64_t per_group = int64_t(kSm90GroupM) * num_n;
  const int64_t g = tile / per_group;
  const int64_t first = g * kSm90GroupM;
  const int64_t gm = (num_m - first) < kSm90GroupM ? (num_m - first) : kSm90GroupM;
  const int64_t r = tile - g * per_group;
  return Sm90Job{(first + r % gm) * BM, (r / gm) * BN, s};
}

// The stash schedule (PP with LEVELS > 0): the CTA's tiles t_i = blockIdx.x + i·gridDim.x (n of
// them) are taken in pairs; a pair's 2·S jobs alternate between its two tiles segment by segment
// (tile 2p: warpgroup 0, tile 2p + 1: warpgroup 1), so that one warpgroup folds a finished segment
// while the other's segment keeps the tensor cores busy. A last tile without a partner runs its S
// segments one after the other. Job l of the CTA -> (i, segment).
struct Sm90StashJob {
  int64_t i;
  int sg;
};
__device__ __forceinline__ Sm90StashJob sm90_stash_job(int64_t l, int64_t n, int nseg) {
  const int64_t pair = l / (2 * nseg), r = l - pair * 2 * nseg;
  if (2 * pair + 1 < n) return Sm90StashJob{2 * pair + (r & 1), int(r >> 1)};
  return Sm90StashJob{2 * pair, int(r)};
}
// The stash of one consumer warpgroup: `levels` levels of a 64 x 256 fp32 tile; warpgroup w of
// CTA b owns the (2b + w)-th (the launcher allocates grid · 2 of them).
constexpr int64_t sm90_stash_floats_per_wg(int levels) { return int64_t(levels) * 64 * 256; }

// PP: the consumer warpgroup that runs job l of the CTA (alternate jobs, or with kTurns the tile
// of the job's pair: a lone last tile's segments are consecutive jobs of one warpgroup).
template <bool PP, int LEVELS>
__device__ __forceinline__ int sm90_job_owner(int64_t l, int64_t n_tiles, int nseg) {
  if constexpr (PP && LEVELS > 0) return int(sm90_stash_job(l, n_tiles, nseg).i & 1);
  return int(l & 1);
}

// One job of a CTA as both the producer and the consumers see it: the tile, its segments
// [sg0, sg1), and (PP) which consumer warpgroup runs it.
struct Sm90Turn {
  Sm90Job j;
  int sg0, sg1;
  int owner;  // PP: the consumer warpgroup of the job (0 or 1)
};
template <int BM, int BN, bool PP, int LEVELS>
__device__ __forceinline__ Sm90Turn sm90_turn(int64_t l, int64_t num_m, int64_t num_n, int nseg,
                                              int64_t n_local) {
  if constexpr (PP && LEVELS > 0) {
    const Sm90StashJob sj = sm90_stash_job(l, n_local, nseg);
    const Sm90Job j = sm90_job<BM, BN>(blockIdx.x + sj.i * gridDim.x, num_m, num_n, 1);
    return Sm90Turn{j, sj.sg, sj.sg + 1, int(sj.i & 1)};  // sm90_job_owner's rule
  } else {
    const int job_segs = LEVELS > 0 ? 1 : nseg;
    const Sm90Job j = sm90_job<BM, BN>(blockIdx.x + l * gridDim.x, num_m, num_n, job_segs);
    return Sm90Turn{j, LEVELS > 0 ? 0 : j.s, LEVELS > 0 ? nseg : j.s + 1,
                    sm90_job_owner<PP, LEVELS>(l, n_local, nseg)};
  }
}

// The stash fold (kStash: the ping-pong or the 128 x 256 tile, LEVELS > 0) after segment sg of
// nseg: fold_segment's tree (fold.cuh) with the pending left subtrees in global memory instead of
// registers (a 64 x BN warpgroup tile's accumulators fill the registers): level v of this warpgroup
// at stash + v·(64·BN), each thread's R values as R/4 float4 128 threads apart (coalesced, read
// back by the thread that wrote them). The same adds in the same order as fold_segment: left = the
// earlier subtree.
template <int R, int LEVELS>
__device__ __forceinline__ void sm90_stash_fold(float (&acc)[R], float* stash, int sg, int nseg,
                                                int wt) {
  static_assert(LEVELS >= 1 && LEVELS <= 3 && R % 32 == 0, "S <= 8, whole float4 groups");
  constexpr int64_t kLevel = int64_t(R) * 128;  // floats per level
#pragma unroll
  for (int v = 0; v < LEVELS; ++v) {
    if (((sg >> v) & 1) == 0) break;
    const float4* src = reinterpret_cast<const float4*>(stash + v * kLevel) + wt;
#pragma unroll
    for (int g = 0; g < R / 4; g += 8) {
      float4 l[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) l[u] = __ldcg(src + (g + u) * 128);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        float* a = acc + 4 * (g + u);
        a[0] = __fadd_rn(l[u].x, a[0]);
        a[1] = __fadd_rn(l[u].y, a[1]);
        a[2] = __fadd_rn(l[u].z, a[2]);
        a[3] = __fadd_rn(l[u].w, a[3]);
      }
    }
  }
  if (sg + 1 < nseg) {
    const int v = (sg & 1) == 0 ? 0 : (sg & 2) == 0 ? 1 : 2;  // sg's lowest 0 bit
    float4* dst = reinterpret_cast<float4*>(stash + v * kLevel) + wt;
#pragma unroll
    for (int q = 0; q < R / 4; ++q)
      __stcg(dst + q * 128,
             make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]));
  }
}

// The plain epilogue: the accumulators through this warp's staging rows to y (bias, one
// rounding) or to the segment's fp32 plane (epilogue.cuh). A fused epilogue (the log-prob one,
// src/cuda/logprob_epilogue.cuh) is a type with kFused = true, its Params (deriving from
// Sm90Params) and apply(p, acc, staging, first row of the warp, n0, lane).
struct Sm90StoreEpilogue {
  using Params = Sm90Params;
  static constexpr bool kFused = false;
};

// The accumulate mode of the TN layout (dW, docs/cuda-gemm.md "Backward"): the store epilogue
// into f32 y (final mode, one segment, no bias), and every job's chain starts from y's current
// value (loaded into the accumulator fragments, scale-d = 1 on every k-block) instead of +0.
struct Sm90AccumulateEpilogue : Sm90StoreEpilogue {
  static constexpr bool kAccumulate = true;
};

// Epi::kAccumulate, false for an epilogue type without it (the forward's, the fused ones).
template <typename Epi, typename = void>
struct sm90_accumulates : std::false_type {};
template <typename Epi>
struct sm90_accumulates<Epi, std::void_t<decltype(Epi::kAccumulate)>>
    : std::bool_constant<Epi::kAccumulate> {};

// The accumulate mode with y through TMA (the 64 x 256 ping-pong tile only; docs/cuda-gemm.md
// "Backward"): a consumer warpgroup reads its tile's y values as eight 64 x 32 f32 boxes that one
// of its threads loads by TMA into its Slots shared-memory slots (zero fill outside y, like
// sm90_load_acc's +0), and stores the k-loop's values back as eight boxes that the same thread
// writes by TMA stores from those slots (clipped to y; canonical NaN written into the slots), so
// neither the load nor the store holds the warpgroup's threads on global memory. The same values
// in the same places as the plain accumulate mode: the bits do not change. Needs y 16-byte
// aligned with a row stride that is a multiple of 4 (the launcher falls back otherwise). Slots
// (4 or 1, the two the launcher takes; eight boxes per job pass through each slot an even number
// of times) trades pipeline stages for boxes in flight: four slots leave room for four stages,
// one for five.
template <typename Base, int Slots>
struct Sm90TmaYEpilogue : Base {
  static_assert(Slots == 1 || Slots == 4, "y slots per warpgroup: 1 or 4");
  static constexpr int kYSlots = Slots;
};
// The y slots per consumer warpgroup of an epilogue: 0 unless it is a Sm90TmaYEpilogue.
template <typename Epi, typename = void>
struct sm90_y_slots : std::integral_constant<int, 0> {};
template <typename Epi>
struct sm90_y_slots<Epi, std::void_t<decltype(Epi::kYSlots)>>
    : std::integral_constant<int, Epi::kYSlots> {};
template <typename Epi>
using sm90_tma_y = std::bool_constant<(sm90_y_slots<Epi>::value > 0)>;

// The blocked accumulate mode (dW on token blocks read in place, docs/cuda-gemm.md "Backward"):
// the k axis is a list of 16-slot token blocks; block j's 16 rows start at row blocks[j] of the
// operands' tensor maps (tm_x, tm_w: [rows, M] / [rows, N] in boxes of 64 columns x 16 rows) when
// blocks[j] >= 0, else at row 16·(−blocks[j] − 1) of the tail maps bmaps.tail_x / tail_w (the
// same layout over a small buffer of the sequences' last, zero-padded blocks). A k-tile whose four
// blocks are consecutive rows (blocks[4t + b] = blocks[4t] + 16 b, the bulk of a long sequence)
// is one 64-row box per 64-column block from bmaps.run_x / run_w (the operands in 64-row boxes:
// the same bytes where the four 16-row boxes would have put them, 6 copies instead of 24 on the
// 128x256 tile). blocks holds (nkt + 1) · 4 entries (the host pads it with a valid entry: the
// producer reads one k-tile ahead and loads whole k-tiles).
struct Sm90BlockedParams : Sm90Params {
  const int32_t* blocks;
};
struct Sm90BlockedAccumulateEpilogue : Sm90AccumulateEpilogue {
  using Params = Sm90BlockedParams;
  static constexpr bool kBlocked = true;
};
template <typename Epi, typename = void>
struct sm90_blocked : std::false_type {};
template <typename Epi>
struct sm90_blocked<Epi, std::void_t<decltype(Epi::kBlocked)>> : std::bool_constant<Epi::kBlocked> {
};

// The blocked mode's other maps (tails, runs): a kernel parameter of their own, __grid_constant__
// like tm_x and tm_w, so that TMA reads them where the launch put them (no device copy per
// launch). Every other epilogue takes Sm90NoBlockedMaps. NOTE: not members of p, which would then
// have to be __grid_constant__ for every epilogue (that changed the code nvcc emits for the store
// epilogue of every GEMM); the parameter comes last (p's offsets stay) and Sm90NoBlockedMaps holds
// an unused int64_t (an empty, 1-byte-aligned last parameter made nvcc load p's first field byte
// by byte). With both, the other kernels' PTX is the same as without the parameter.
// The TMA-y mode's y map ([M, N] f32 in 64 x 32 boxes) rides in the same parameter.
struct Sm90BlockedMaps {
  CUtensorMap tail_x, tail_w;  // [tail rows, M] / [tail rows, N]; no tail rows: tm_x / tm_w
  CUtensorMap run_x, run_w;    // tm_x / tm_w's operands in boxes of 64 columns x 64 rows
  CUtensorMap y;               // Sm90TmaYEpilogue only
};
struct Sm90YMaps {
  CUtensorMap y;
};
struct Sm90NoBlockedMaps {
  int64_t unused;
};
template <typename Epi>
using sm90_blocked_maps_t =
    std::conditional_t<sm90_blocked<Epi>::value, Sm90BlockedMaps,
                       std::conditional_t<sm90_tma_y<Epi>::value, Sm90YMaps, Sm90NoBlockedMaps>>;

// The 4 block entries of k-tile kt (blocked mode).
template <typename P>
__device__ __forceinline__ int4 sm90_block_entries(const P& p, int kt) {
  return __ldg(reinterpret_cast<const int4*>(p.blocks) + kt);
}

// acc = y's values of this warp's fragment (acc[4i + 2h + c] is row row0 + lane/4 + 8h, column
// col0 + 8i + 2(lane%4) + c); outside [0, M) x [0, N): +0, never stored. NOTE: scalar loads; a
// version with 8-byte loads of the column pairs ran the accumulate kernels markedly slower on the
// H200 (docs/perf.md).
template <int R>
__device__ __forceinline__ void sm90_load_acc(const Sm90Params& p, float (&acc)[R], int64_t row0,
                                              int64_t col0, int lane) {
  const float* y = static_cast<const float*>(p.y);
#pragma unroll
  for (int i = 0; i < R / 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t row = row0 + (lane >> 2) + 8 * h;
        const int64_t col = col0 + 8 * i + 2 * (lane & 3) + c;
        acc[4 * i + 2 * h + c] = (row < p.M && col < p.N) ? y[row * p.ldy + col] : 0.0f;
      }
}

// The TMA-y mode (Sm90TmaYEpilogue): byte offset of (row r, column c) inside a 64 x 32 f32 box
// written by TMA with the 128B swizzle (box base 1024-aligned: the 16-byte chunk index XOR r % 8).
__device__ __forceinline__ uint32_t sm90_ybox_off(int r, int c) {
  return uint32_t(r) * 128u + ((uint32_t(c >> 2) ^ uint32_t(r & 7)) << 4) + uint32_t(c & 3) * 4u;
}
// This thread's column pair (ii, h) of box b (ii < 4, h < 2): its first accumulator (acc[4i + 2h],
// i = 4b + ii, and the next) and the pair's byte offset in the box.
struct Sm90YPair {
  int acc;
  uint32_t off;
};
__device__ __forceinline__ Sm90YPair sm90_ybox_pair(int b, int ii, int h, int warp, int lane) {
  const int r = warp * 16 + (lane >> 2) + 8 * h, c = 8 * ii + 2 * (lane & 3);
  return {4 * (4 * b + ii) + 2 * h, sm90_ybox_off(r, c)};
}

// acc = y's values of this warpgroup's 64 x 256 tile at (m0, n0) (acc[4i + 2h + c]: row
// 16·warp + lane/4 + 8h, column 8i + 2(lane%4) + c), +0 outside y (TMA zero fill): box b (columns
// 32b ..) through slot b % YS (ring + slot · kSm90YBox, mbarrier bar0 + 8 · slot: 8 / YS loads
// per slot and job, an even number, so box b completes the barrier's phase b / YS and every job
// starts on parity 0). Thread wt = 0 issues the copies, after the previous job's stores have read
// the slots; named barrier `bar` (this warpgroup's 128 threads) frees a slot for its next box.
template <int YS>
__device__ __forceinline__ void sm90_load_acc_tma(const CUtensorMap* ymap, float (&acc)[128],
                                                  uint32_t ring, uint32_t bar0, int bar, int64_t m0,
                                                  int64_t n0, int warp, int lane, int wt) {
  if (wt == 0) {
    bulk_wait_group_read<0>();
#pragma unroll
    for (int k = 0; k < YS; ++k) {
      mbar_arrive_expect_tx(bar0 + 8u * k, uint32_t(kSm90YBox));
      tma_load_2d(ring + uint32_t(k * kSm90YBox), ymap, int32_t(n0 + 32 * k), int32_t(m0),
                  bar0 + 8u * k);
    }
  }
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    const int k = b % YS;
    const uint32_t box = ring + uint32_t(k * kSm90YBox);
    mbar_wait(bar0 + 8u * k, uint32_t((b / YS) & 1));
#pragma unroll
    for (int ii = 0; ii < 4; ++ii)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const Sm90YPair q = sm90_ybox_pair(b, ii, h, warp, lane);
        asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                     : "=f"(acc[q.acc]), "=f"(acc[q.acc + 1])
                     : "r"(box + q.off)
                     : "memory");
      }
    if (b < 8 - YS) {
      // Every thread has read slot k (generic proxy) before the TMA overwrites it (async proxy).
      fence_proxy_async_shared();
      named_bar_sync(bar, 128);
      if (wt == 0) {
        mbar_arrive_expect_tx(bar0 + 8u * k, uint32_t(kSm90YBox));
        tma_load_2d(box, ymap, int32_t(n0 + 32 * (b + YS)), int32_t(m0), bar0 + 8u * k);
      }
    }
  }
}

// y's 64 x 256 tile at (m0, n0) = acc (canonical NaN), in 8 / YS rounds of YS boxes written into
// the slots and stored by TMA (thread wt = 0 commits each round as one bulk group; a round waits
// until the previous one has been read out of the slots). The warpgroup's threads return once
// their values are in shared memory: the last stores complete in the background (the next job's
// load waits for their reads, the kernel's end for their writes).
template <int YS>
__device__ __forceinline__ void sm90_store_acc_tma(const CUtensorMap* ymap, const float (&acc)[128],
                                                   uint32_t ring, int bar, int64_t m0, int64_t n0,
                                                   int warp, int lane, int wt) {
#pragma unroll
  for (int q = 0; q < 8 / YS; ++q) {
    if (q > 0 && wt == 0) bulk_wait_group_read<0>();
    named_bar_sync(bar, 128);  // the slots are free (the load's reads; the previous round's stores)
#pragma unroll
    for (int k = 0; k < YS; ++k) {
      const int b = YS * q + k;
      const uint32_t box = ring + uint32_t(k * kSm90YBox);
#pragma unroll
      for (int ii = 0; ii < 4; ++ii)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const Sm90YPair pr = sm90_ybox_pair(b, ii, h, warp, lane);
          asm volatile("st.shared.v2.b32 [%0], {%1, %2};\n" ::"r"(box + pr.off),
                       "r"(canonical_f32_bits(acc[pr.acc])),
                       "r"(canonical_f32_bits(acc[pr.acc + 1]))
                       : "memory");
        }
    }
    fence_proxy_async_shared();
    named_bar_sync(bar, 128);
    if (wt == 0) {
#pragma unroll
      for (int k = 0; k < YS; ++k)
        tma_store_2d(ymap, ring + uint32_t(k * kSm90YBox), int32_t(n0 + 32 * (YS * q + k)),
                     int32_t(m0));
      bulk_commit_group();
    }
  }
}

// BM x BN tile per job; WGN = consumer warpgroups along N (1: they split the rows, 64 each;
// 2: they split the columns, BM = 64); NS pipeline stages. LEVELS = 0: a job is one segment of a
// tile (one segment: final values; several: workspace planes). LEVELS > 0: a job is a whole tile,
// its segments (S <= 2^LEVELS) run one after the other, each folded into a register stack of
// pending left subtrees (binary-counter order, exactly the G.4 tree), then the final epilogue.
// Epi: the epilogue (Sm90StoreEpilogue: y or workspace planes; or a fused one, e.g. the log-prob
// epilogue of src/cuda/logprob_epilogue.cuh); the main loop is the same code.
// PP = true ("ping-pong", BM = 64, WGN = 1, LEVELS = 0, the store epilogue): the two consumer
// warpgroups take the CTA's jobs in turn, each a whole 64 x BN tile (wgmma m64nBNk16), so that one
// warpgroup's epilogue runs while the other's k-loop keeps the tensor cores busy. The producer is
// unchanged (it fills the ring with every job's k-tiles in job order); a warpgroup steps its ring
// position over the other's jobs, and starts a k-loop only after the other warpgroup has finished
// the previous job's (named barriers 1 and 2): every ring slot before its first one has then been
// waited on, so each mbarrier parity wait is on the right phase. The same chains in the same
// order as every other tile: the bits do not change. In accumulate mode a ping-pong warpgroup
// loads y's values before it waits for the other's k-loop (the load overlaps those MMAs).
// PP with LEVELS > 0 ("stash", S <= 2^LEVELS segments): a job is one segment of a tile; the tiles
// of a CTA go in pairs, one per warpgroup, whose segments alternate (sm90_stash_job), and after
// each of its segments a warpgroup folds it into the G.4 tree through its stash in global memory
// (sm90_stash_fold: a 64 x BN tile's accumulators leave no registers for a stack) while the other
// warpgroup's segment runs; after the tile's last segment, the final epilogue. The 128 x 256 tile
// with LEVELS > 0 folds through the same stash: a job is a whole tile, and both warpgroups fold
// after each segment (exposed; the producer keeps loading the next segment meanwhile).
// AT / BT ("nn", "tn" layouts: docs/cuda-gemm.md "Backward"): x / w is MN-major in memory — x
// stored [K, M] (rows = k), w stored [K, N] — and is read by TMA in boxes of 64 columns x 64 k
// rows (BM / 64 or BN / 64 boxes per stage, 8192 bytes apart), fed to wgmma with the transpose bit
// (sw128_mn_desc). The same products in the same k-block order: the bits do not change.
template <int BM, int BN, int WGN, int NS, int LEVELS, typename Epi = Sm90StoreEpilogue,
          bool PP = false, bool AT = false, bool BT = false>
__global__ void __launch_bounds__(kSm90Threads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tm_x,
                     const __grid_constant__ CUtensorMap tm_w, const typename Epi::Params p,
                     const __grid_constant__ sm90_blocked_maps_t<Epi> bmaps) {
  constexpr int WGM = PP ? 1 : 2 / WGN;
  constexpr int WN = BN / WGN;  // columns per consumer warpgroup (wgmma N)
  constexpr int R = WN / 2;     // f32 accumulators per thread
  constexpr int kABytes = BM * 128;
  constexpr int kStageBytes = (BM + BN) * 128;
  static_assert(BM == 64 * WGM && (WGN == 1 || WGN == 2), "tile shape");
  static_assert(!PP || (BM == 64 && WGN == 1 && !Epi::kFused), "ping-pong tile shape");
  // The stash (segments folded through p.stash): a 64 x 256 warpgroup tile's accumulators leave no
  // registers for a stack. PP: the segments are alternate turns; 128 x 256: a job is a whole tile,
  // both warpgroups fold after each segment (the producer keeps loading the next one).
  constexpr bool kStash = LEVELS > 0 && (PP || WN == 256);
  static_assert(!kStash || WN == 256, "the stash holds 64 x 256 warpgroup tiles");
  constexpr bool kTopSmem = gemm_tree_upper_in_smem(BM, BN, LEVELS);  // never PP (BM = 64)
  constexpr bool kTurns = PP && LEVELS > 0;  // jobs = segments of the CTA's tile pairs
  static_assert(!Epi::kFused || LEVELS == 0, "a fused epilogue takes one segment");
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0, "stages 1024-aligned");
  static_assert(!sm90_accumulates<Epi>::value || (LEVELS == 0 && !Epi::kFused),
                "accumulate: one segment per job");
  static_assert(!sm90_blocked<Epi>::value || (AT && BT && sm90_accumulates<Epi>::value),
                "blocked: MN-major operands in accumulate mode");
  constexpr int kYSlots = sm90_y_slots<Epi>::value;
  constexpr bool kTmaY = kYSlots > 0;
  static_assert(!kTmaY || (PP && BN == 256 && sm90_accumulates<Epi>::value),
                "TMA y: the 64 x 256 ping-pong tile in accumulate mode");

  extern __shared__ uint8_t sm90_smem[];
  const uint32_t raw = smem_u32(sm90_smem);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t bars = base + NS * kStageBytes;  // full[NS], then empty[NS]
  auto full_bar = [&](int s) { return bars + 8u * uint32_t(s); };
  auto empty_bar = [&](int s) { return bars + 8u * uint32_t(NS + s); };
  float* const epi =
      reinterpret_cast<float*>(sm90_smem + (base - raw) + NS * kStageBytes + 16 * NS);

  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < NS; ++s) {
      mbar_init(full_bar(s), 1);  // the producer's arrive.expect_tx (+ the copies' bytes)
      // lane 0 of each consumer warp that reads the stage: all 8, or one warpgroup's 4 (PP)
      mbar_init(empty_bar(s), PP ? 4 : 8);
    }
    if constexpr (kTmaY)
      for (int k = 0; k < 2 * kYSlots; ++k) mbar_init(bars + 16u * NS + 8u * k, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_w)) : "memory");
  }
  __syncthreads();

  const int64_t num_m = (p.M + BM - 1) / BM;
  const int64_t num_n = (p.N + BN - 1) / BN;
  const int job_segs = LEVELS > 0 ? 1 : p.nseg;  // segments told apart by the job index
  const int64_t njobs = num_m * num_n * job_segs;
  // This CTA's jobs: every gridDim.x-th job, or (kTurns) its tiles' segments (sm90_stash_job).
  const int64_t n_tiles = kTurns ? (num_m * num_n - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const int64_t n_local =
      kTurns ? n_tiles * p.nseg : (njobs - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const int nkt = int((p.seg_len + kSm90BK - 1) / kSm90BK);  // k-tiles per segment

  if (tid < 128) {
    // Producer warpgroup: registers go to the consumers; one thread issues every copy.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t l = 0; l < n_local; ++l) {
        const Sm90Turn tu = sm90_turn<BM, BN, PP, LEVELS>(l, num_m, num_n, p.nseg, n_tiles);
        const Sm90Job& j = tu.j;
        for (int sg = tu.sg0; sg < tu.sg1; ++sg) {
          const int64_t kseg = int64_t(sg) * p.seg_len;
          int4 cur = make_int4(0, 0, 0, 0);
          if constexpr (sm90_blocked<Epi>::value) cur = sm90_block_entries(p, 0);
          for (int kt = 0; kt < nkt; ++kt) {
            int4 nxt = cur;  // blocked: the next k-tile's entries, read before the wait
            if constexpr (sm90_blocked<Epi>::value) nxt = sm90_block_entries(p, kt + 1);
            mbar_wait(empty_bar(stage), phase ^ 1u);  // consumers released this stage
            mbar_arrive_expect_tx(full_bar(stage), uint32_t(kStageBytes));
            const int32_t k = int32_t(kseg + int64_t(kt) * kSm90BK);
            const uint32_t dst = base + uint32_t(stage) * kStageBytes;
            if constexpr (sm90_blocked<Epi>::value) {
              const int32_t e[4] = {cur.x, cur.y, cur.z, cur.w};
              if (e[0] >= 0 && e[1] == e[0] + 16 && e[2] == e[0] + 32 && e[3] == e[0] + 48) {
                // Four consecutive full blocks: one 64-row box per 64-column block.
#pragma unroll
                for (int i = 0; i < BM / 64; ++i)
                  tma_load_2d(dst + 8192u * i, &bmaps.run_x, int32_t(j.m0) + 64 * i, e[0],
                              full_bar(stage));
#pragma unroll
                for (int i = 0; i < BN / 64; ++i)
                  tma_load_2d(dst + kABytes + 8192u * i, &bmaps.run_w, int32_t(j.n0) + 64 * i, e[0],
                              full_bar(stage));
              } else {
                // Four 16-row blocks, each from its own row (in place or a tail), 2048 bytes
                // apart inside every 64-column box: the layout one 64-row box would have written.
#pragma unroll
                for (int b = 0; b < 4; ++b) {
                  const bool tail = e[b] < 0;
                  const int32_t row = tail ? 16 * (-e[b] - 1) : e[b];
                  const CUtensorMap* ma = tail ? &bmaps.tail_x : &tm_x;
                  const CUtensorMap* mb = tail ? &bmaps.tail_w : &tm_w;
#pragma unroll
                  for (int i = 0; i < BM / 64; ++i)
                    tma_load_2d(dst + 8192u * i + 2048u * b, ma, int32_t(j.m0) + 64 * i, row,
                                full_bar(stage));
#pragma unroll
                  for (int i = 0; i < BN / 64; ++i)
                    tma_load_2d(dst + kABytes + 8192u * i + 2048u * b, mb, int32_t(j.n0) + 64 * i,
                                row, full_bar(stage));
                }
              }
              cur = nxt;
            } else {
              if constexpr (AT) {
#pragma unroll
                for (int i = 0; i < BM / 64; ++i)
                  tma_load_2d(dst + 8192u * i, &tm_x, int32_t(j.m0) + 64 * i, k, full_bar(stage));
              } else {
                tma_load_2d(dst, &tm_x, k, int32_t(j.m0), full_bar(stage));
              }
              if constexpr (BT) {
#pragma unroll
                for (int i = 0; i < BN / 64; ++i)
                  tma_load_2d(dst + kABytes + 8192u * i, &tm_w, int32_t(j.n0) + 64 * i, k,
                              full_bar(stage));
              } else {
                tma_load_2d(dst + kABytes, &tm_w, k, int32_t(j.n0), full_bar(stage));
              }
            }
            if (++stage == NS) {
              stage = 0;
              phase ^= 1u;
            }
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    // consumer warpgroup 0 / 1 (PP: broadcast from lane 0 so that ptxas sees a warp-uniform value
    // in the branches on it; otherwise it serializes the wgmmas, C7520)
    const int cw = PP ? __shfl_sync(0xffffffffu, (tid - 128) >> 7, 0) : (tid - 128) >> 7;
    const int wt = tid & 127;  // thread in the warpgroup
    const int warp = wt >> 5, lane = wt & 31;
    const int row_off = (WGN == 1 && !PP) ? cw * 64 : 0;
    const int col_off = WGN == 2 ? cw * WN : 0;
    float acc[R];
    zero_all(acc);
    // Pending left subtrees of the tree (unused when LEVELS == 0).
    float stack[(LEVELS >= 1 && !kStash && !kTopSmem) ? LEVELS : 1][R];
    // kTopSmem: this thread's words of the tree's upper level (gemm_tree_upper_in_smem).
    float* const top = epi + kSm90EpiBytes / 4 + cw * 64 * WN + wt;

    // kTmaY: this warpgroup's y slots and their mbarriers (named barrier 3 + cw: its threads).
    const uint32_t yring = base + NS * kStageBytes + 1024u + uint32_t(cw * kYSlots * kSm90YBox);
    const uint32_t ybar0 = bars + 16u * NS + 8u * uint32_t(cw * kYSlots);
    int stage = 0;
    uint32_t phase = 0;
    // PP: a job belongs to one warpgroup (alternate jobs; kTurns: alternate segments of a tile
    // pair); the other warpgroup steps over its ring slots.
    for (int64_t l = 0; l < n_local; ++l) {
      const Sm90Turn tu = sm90_turn<BM, BN, PP, LEVELS>(l, num_m, num_n, p.nseg, n_tiles);
      if constexpr (PP) {
        if (tu.owner != cw) {  // the other warpgroup's job: step over its nkt ring slots
          const int s2 = stage + nkt % NS;
          phase ^= uint32_t((nkt / NS) & 1);
          stage = s2 >= NS ? s2 - NS : s2;
          if (s2 >= NS) phase ^= 1u;
          continue;
        }
      }
      const Sm90Job& j = tu.j;
      // kStash: warpgroup w's levels in this CTA's stash.
      auto stash_of = [&](int w) {
        return p.stash + (int64_t(blockIdx.x) * 2 + w) * sm90_stash_floats_per_wg(LEVELS);
      };
      auto owner = [&](int64_t i) { return sm90_job_owner<PP, LEVELS>(i, n_tiles, p.nseg); };
      if constexpr (PP) {
        // y's values while the other warpgroup computes
        if constexpr (kTmaY)
          sm90_load_acc_tma<kYSlots>(&bmaps.y, acc, yring, ybar0, 3 + cw, j.m0, j.n0, warp, lane,
                                     wt);
        else if constexpr (sm90_accumulates<Epi>::value)
          sm90_load_acc(p, acc, j.m0 + warp * 16, j.n0, lane);
        if (l > 0 && owner(l - 1) != cw)
          named_bar_sync(1 + cw, 256);  // the other's previous k-loop is done
      }
      for (int sg = tu.sg0; sg < tu.sg1; ++sg) {
        if constexpr (sm90_accumulates<Epi>::value && !PP)
          sm90_load_acc(p, acc, j.m0 + row_off + warp * 16, j.n0 + col_off, lane);
        int prev = 0;
        for (int kt = 0; kt < nkt; ++kt) {
          mbar_wait(full_bar(stage), phase);
          // k-blocks of this k-tile inside the segment (Ls is a multiple of 16, not of 64).
          const int64_t left = (p.seg_len - int64_t(kt) * kSm90BK) / 16;
          const int nkb = left >= 4 ? 4 : int(left);
          const uint32_t a = base + uint32_t(stage) * kStageBytes + uint32_t(row_off) * 128u;
          const uint32_t b =
              base + uint32_t(stage) * kStageBytes + kABytes + uint32_t(col_off) * 128u;
          // Every register a wgmma reads is written before wgmma.fence (else ptxas inserts a
          // warpgroup.arrive before each wgmma).
          uint64_t da[4], db[4];
#pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
            da[kb] = AT ? sw128_mn_desc(a + 2048u * kb) : sw128_desc(a + 32u * kb);
            db[kb] = BT ? sw128_mn_desc(b + 2048u * kb) : sw128_desc(b + 32u * kb);
            asm volatile("" : "+l"(da[kb]), "+l"(db[kb]));
          }
          int sd0 = kt > 0 ? 1 : 0, sd1 = 1;
          if constexpr (sm90_accumulates<Epi>::value)
            sd0 = 1;  // accumulate: the chain's c is y's value
          asm volatile("" : "+r"(sd0), "+r"(sd1));
          fence_acc(acc);
          // The chain: scale-d = 0 only on the segment's first k-block; k-blocks in ascending k.
          // NOTE: each branch has its own fence and commit: ptxas inserts a warpgroup.arrive before
          // a wgmma that follows a branch inside the fenced region.
          if (nkb == 4) {
            wgmma_fence();
            wgmma_k16<WN, AT, BT>(acc, da[0], db[0], sd0);
            wgmma_k16<WN, AT, BT>(acc, da[1], db[1], sd1);
            wgmma_k16<WN, AT, BT>(acc, da[2], db[2], sd1);
            wgmma_k16<WN, AT, BT>(acc, da[3], db[3], sd1);
            wgmma_commit();
          } else {  // the segment's last k-tile when Ls is not a multiple of 64 (rare)
            wgmma_fence();
            wgmma_k16<WN, AT, BT>(acc, da[0], db[0], sd0);
            if (nkb > 1) wgmma_k16<WN, AT, BT>(acc, da[1], db[1], sd1);
            if (nkb > 2) wgmma_k16<WN, AT, BT>(acc, da[2], db[2], sd1);
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
        wgmma_wait<0>();
        fence_acc(acc);
        if (lane == 0) mbar_arrive(empty_bar(prev));
        if constexpr (LEVELS > 0 && !kStash) {
          // acc = segment sg: into the tree (the next segment's chain starts with scale-d = 0,
          // so acc needs no reset).
          if constexpr (kTopSmem)
            fold_segment_top_smem<128>(acc, stack[0], top, sg, p.nseg);
          else
            fold_segment<false>(acc, stack, sg, p.nseg);
          fence_acc(acc);
        } else if constexpr (kStash && !PP) {
          sm90_stash_fold<R, LEVELS>(acc, stash_of(cw), sg, p.nseg, wt);
          fence_acc(acc);
        }
      }  // segments of this job
      if constexpr (PP) {
        // The next job, if it is the other warpgroup's, may start its k-loop.
        if (l + 1 < n_local && owner(l + 1) != cw) named_bar_arrive(1 + (cw ^ 1), 256);
      }
      if constexpr (kTurns) {
        // Segment tu.sg0 into the tree while the other warpgroup's segment runs; the epilogue
        // after the tile's last.
        sm90_stash_fold<R, LEVELS>(acc, stash_of(cw), tu.sg0, p.nseg, wt);
        fence_acc(acc);
        if (tu.sg0 + 1 < p.nseg) continue;
      }

      if constexpr (kTmaY) {
        sm90_store_acc_tma<kYSlots>(&bmaps.y, acc, yring, 3 + cw, j.m0, j.n0, warp, lane, wt);
        continue;
      }
      if constexpr (Epi::kFused) {
        Epi::apply(p, acc, epi + (cw * 4 + warp) * 16 * kSm90EpiLd, j.m0 + row_off + warp * 16,
                   j.n0, lane);
        continue;
      }
      // Epilogue, 32 columns at a time through this warp's staging rows (fragment: acc[4i + 2h + c]
      // is row 16·warp + lane/4 + 8h, column 8i + 2(lane%4) + c of the warpgroup's tile), then
      // row-contiguous stores. NOTE: only the register-to-shared copy is unrolled, the stores are
      // a rolled loop: the whole epilogue unrolled cost a large fixed time per tile
      // (instruction fetch; measured: docs/cuda-gemm.md "Things learned").
      float* stg = epi + (cw * 4 + warp) * 16 * kSm90EpiLd;
      const int64_t wrow0 = j.m0 + row_off + warp * 16;  // first row of this warp
      if constexpr (!sm90_accumulates<Epi>::value) {
        if (p.y_vec && !p.ws_mode && !p.bias) {  // bf16 values, no bias (epilogue.cuh)
          sm90_store_bf16(p, acc, stg, wrow0, j.n0 + col_off, lane);
          continue;
        }
      }
#pragma unroll
      for (int q = 0; q < WN / kSm90EpiCols; ++q) {
#pragma unroll
        for (int ii = 0; ii < kSm90EpiCols / 8; ++ii) {
          const int i = q * (kSm90EpiCols / 8) + ii;
          const int c = ii * 8 + (lane & 3) * 2;
          *reinterpret_cast<float2*>(stg + (lane >> 2) * kSm90EpiLd + c) =
              make_float2(acc[4 * i], acc[4 * i + 1]);
          *reinterpret_cast<float2*>(stg + ((lane >> 2) + 8) * kSm90EpiLd + c) =
              make_float2(acc[4 * i + 2], acc[4 * i + 3]);
        }
        __syncwarp();
        sm90_store_rows(p, j.s, stg, wrow0, j.n0 + col_off + q * kSm90EpiCols, lane);
        __syncwarp();
      }
    }
    if constexpr (kTmaY) {
      if (wt == 0) bulk_wait_group<0>();  // the last stores' writes are done
    }
  }
}

}  // namespace lockstep::cuda::detail
