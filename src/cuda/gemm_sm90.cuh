// Hopper kernel of lockstep::cuda::gemm_bf16_nt (design: docs/cuda-gemm.md). wgmma m64nNk16
// (bf16 -> f32, A and B K-major in shared memory through 128B-swizzle descriptors) fed by TMA
// (cp.async.bulk.tensor, 128B swizzle, zero fill out of bounds) through an NS-stage mbarrier
// pipeline; warpgroup 0 produces (one thread issues the copies), warpgroups 1 and 2 consume.
// Persistent: CTA b runs jobs b, b + grid, ...; a job is one BM x BN tile of one K segment, or
// (LEVELS > 0) a whole tile with all its segments.
// Bits (docs/contract.md §G.3, §M.2): each output's segment is ONE wgmma chain, first k-block with
// scale-d = 0 (= c = +0), then every k-block of 16 of the segment in ascending k, in order on the
// same accumulator registers; k-blocks past the segment end are never issued, elements k >= K are
// TMA zero fill (exact no-ops). Segments are combined by the G.4 tree either in registers
// (LEVELS > 0) or, one job per segment, through workspace planes and gemm_tree_combine_kernel
// (G.10); then bias once (fp32 RNE), one rounding, canonical NaN.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; the encoder is fetched from the driver at run time)
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/math.h"            // ls_expf (the fused log-prob epilogue)
#include "cuda/gemm_bf16_nt.cuh"  // round_bf16_canonical, GemmLogprobEpilogue
#include "cuda/sm90_async.cuh"    // mbarriers, TMA loads
#include "cuda/sm90_wgmma.cuh"    // wgmma, descriptors, accumulator fences, tree_add

namespace lockstep::cuda::detail {

constexpr int kSm90BK = 64;        // k per stage: one 128-byte (swizzle-width) row of bf16
constexpr int kSm90Threads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kSm90GroupM = 8;     // tile raster: 8 row tiles share a column sweep (L2 reuse)

struct Sm90Params {
  int64_t M, N;     // rows of x in this launch, rows of w
  int64_t seg_len;  // Ls (multiple of 16)
  int nseg;         // segments computed by this launch
  int ws_mode;      // 1: each segment's fp32 value to ws plane s; 0: final values to y
  // final mode (ws_mode == 0, nseg == 1)
  const void* bias;  // nullptr, bf16 or f32
  int64_t bias_stride;
  int bias_f32;
  void* y;
  int64_t ldy;
  int y_f32;
  int y_pair;  // 1: two adjacent outputs (even column) may be stored as one aligned word
  // workspace mode
  float* ws;
  int64_t ld_ws;     // even
  int64_t ws_plane;  // elements per segment plane
};
// The parameters of the fused log-prob kernel (EPI == 1; ws_mode == 0, nseg == 1, 128x256 tiles).
// NOTE: a separate type, so the plain kernels keep their parameter block (and PTX) unchanged.
struct Sm90LpParams : Sm90Params {
  GemmLogprobEpilogue lp;
};

// Epilogue staging: per consumer warp, 16 rows x 32 fp32 columns, rows padded to 40 floats
// (fragment writes and row reads are then conflict-free: 2 wavefronts per 256 bytes).
constexpr int kSm90EpiCols = 32;
constexpr int kSm90EpiLd = 40;
constexpr int kSm90EpiBytes = 8 * 16 * kSm90EpiLd * 4;

// Dynamic shared memory of one CTA: NS stages of A (BM rows) + B (BN rows) x 128 bytes, the
// 2·NS mbarriers, the epilogue staging, and slack to align the stages to 1024 bytes (the 128B
// swizzle atom).
template <int BM, int BN, int NS>
constexpr int sm90_smem_bytes() {
  return NS * (BM + BN) * 128 + 2 * NS * 8 + kSm90EpiBytes + 1024;
}

// NOTE: a wait that has not completed after kSm90WaitLimitNs traps (the launch fails with an
// error) instead of hanging the process: every wait here lasts microseconds when the pipeline is
// sound, so this only turns a deadlock bug into an error.
constexpr uint64_t kSm90WaitLimitNs = 10000000000ull;
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = global_ns();
  while (!mbar_try_wait(bar, parity)) {
    if (global_ns() - t0 > kSm90WaitLimitNs) __trap();
  }
}

// Named barriers 1..15 (0 is __syncthreads): sync waits until `threads` threads have arrived or
// synced on it; arrive counts this thread without waiting.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
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

__device__ __forceinline__ float sm90_bias(const Sm90Params& p, int64_t n) {
  return p.bias_f32 ? static_cast<const float*>(p.bias)[n * p.bias_stride]
                    : __uint_as_float(
                          uint32_t(static_cast<const uint16_t*>(p.bias)[n * p.bias_stride]) << 16);
}

// Stores 16 staged rows x 32 columns of one warp: lane -> row (lane >> 4) + 2t, columns
// col0 + 2(lane & 15) + {0, 1}. Final mode: bias once (fp32 RNE), one rounding to bf16 (RNE) or
// f32, canonical NaN. Workspace mode: the fp32 segment value into plane s.
__device__ __forceinline__ void sm90_store_rows(const Sm90Params& p, int s, const float* stg,
                                                int64_t row0, int64_t col0, int lane) {
  const int lc = (lane & 15) * 2;
  const int64_t col = col0 + lc;
  if (col >= p.N) return;
  const bool has1 = col + 1 < p.N;
  if (p.ws_mode) {
    float* plane = p.ws + int64_t(s) * p.ws_plane;
#pragma unroll 1
    for (int t = 0; t < 8; ++t) {
      const int lr = 2 * t + (lane >> 4);
      const int64_t row = row0 + lr;
      if (row >= p.M) break;
      // ld_ws is even and covers N rounded up: the pair never crosses the row.
      *reinterpret_cast<float2*>(plane + row * p.ld_ws + col) =
          *reinterpret_cast<const float2*>(stg + lr * kSm90EpiLd + lc);
    }
    return;
  }
  float b0 = 0.0f, b1 = 0.0f;
  if (p.bias) {
    b0 = sm90_bias(p, col);
    if (has1) b1 = sm90_bias(p, col + 1);
  }
#pragma unroll 1
  for (int t = 0; t < 8; ++t) {
    const int lr = 2 * t + (lane >> 4);
    const int64_t row = row0 + lr;
    if (row >= p.M) break;
    const float2 v2 = *reinterpret_cast<const float2*>(stg + lr * kSm90EpiLd + lc);
    float v0 = v2.x, v1 = v2.y;
    if (p.bias) {
      v0 = __fadd_rn(v0, b0);
      v1 = __fadd_rn(v1, b1);
    }
    if (p.y_f32) {
      uint32_t* yr = static_cast<uint32_t*>(p.y) + row * p.ldy + col;
      if (has1 && p.y_pair) {
        *reinterpret_cast<uint2*>(yr) = make_uint2(canonical_f32_bits(v0), canonical_f32_bits(v1));
      } else {
        yr[0] = canonical_f32_bits(v0);
        if (has1) yr[1] = canonical_f32_bits(v1);
      }
    } else {
      uint16_t* yr = static_cast<uint16_t*>(p.y) + row * p.ldy + col;
      if (has1 && p.y_pair) {
        *reinterpret_cast<uint32_t*>(yr) =
            uint32_t(round_bf16_canonical(v0)) | (uint32_t(round_bf16_canonical(v1)) << 16);
      } else {
        yr[0] = round_bf16_canonical(v0);
        if (has1) yr[1] = round_bf16_canonical(v1);
      }
    }
  }
}

// ---- Fused log-prob epilogue (EPI == 1): docs/contract.md §L.4-L.5 from the accumulators.
// 128x256 tiles with WGN = 1: each consumer warpgroup owns 64 rows x all 256 columns (wgmma
// m64n256, 128 accumulators per thread) = one vocab tile of L = 256 for each of its rows. Thread
// (warp, lane) holds rows 16·warp + lane/4 + 8h (h = 0, 1) and, per row, the columns
// 8i + 2(lane%4) + c (i = 0..31, c = 0, 1) in acc[4i + 2h + c]: the contract lane of column 8i + l
// is l, so this thread owns contract lanes 2q and 2q + 1 (q = lane%4) of its two rows, all their
// entries, and walks them in ascending i, as §L.5's lane loop does.
//   - padding: columns >= N (only in the last tile) are y = −inf;
//   - m: the max of z over the row (fmaxf, any order: exact; NaN ignored, as the max rule does),
//     quad butterfly, then m = z_max / tau, zero rule. RN(z / tau) is monotone non-decreasing in
//     z for tau > 0 (and maps −inf to −inf), so max_j RN(z_j / tau) = RN(max_j z_j / tau): the
//     contract's m = max over y, with one divide per row instead of one per entry;
//   - s, w: per lane ascending, y = z / tau (IEEE divide, every entry), d = y − m, e = exp(d),
//     s += e, w += e·d, −inf entries add +0 (= skip: s and w are never −0); every step __f*_rn;
//   - lane tree: s_{2q} + s_{2q+1} in the thread, then xor 1 ((s0+s1)+(s2+s3), the same bits on
//     both partners: + is commutative), then xor 2: ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)).
// The entries are walked 32 columns (16 accumulators) at a time through this warp's staging rows
// (each thread re-reads only what it wrote: no barrier), so the loop over chunks stays rolled (a
// fully unrolled epilogue costs instruction-cache misses, see the plain epilogue's NOTE).
__device__ __forceinline__ void sm90_logprob_epilogue(const Sm90LpParams& p, float (&acc)[128],
                                                      float* buf, int64_t wrow0, int64_t n0,
                                                      int lane) {
  const float ninf = __uint_as_float(0xff800000u);
  const GemmLogprobEpilogue& e = p.lp;
  const float tau = e.tau;
  const int q = lane & 3;
  const int64_t left = p.N - n0;  // real columns of this tile (> 0)
  if (left < kLogprobFusedTile) {
#pragma unroll
    for (int i = 0; i < 32; ++i)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (8 * i + 2 * q + (k & 1) >= left) acc[4 * i + k] = ninf;
  }
  float m[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mz = ninf;
#pragma unroll
    for (int i = 0; i < 32; ++i) mz = fmaxf(mz, fmaxf(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]));
    mz = fmaxf(mz, __shfl_xor_sync(0xffffffffu, mz, 1));
    mz = fmaxf(mz, __shfl_xor_sync(0xffffffffu, mz, 2));
    m[h] = __fdiv_rn(mz, tau);
    if (m[h] == 0.0f) m[h] = 0.0f;  // zero rule
  }
  // The target's column in this tile when this thread holds it, else -1.
  int tk[2];
  int64_t row[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row[h] = wrow0 + (lane >> 2) + 8 * h;
    tk[h] = -1;
    if (e.y_target != nullptr && row[h] < p.M) {
      const int64_t ti = (e.row0 + row[h]) * e.targets_stride;
      const int64_t g = e.targets_i64 ? static_cast<const int64_t*>(e.targets)[ti]
                                      : int64_t(static_cast<const int32_t*>(e.targets)[ti]);
      if (g != e.ignore_index) {
        const int64_t col = g - e.target_base - n0;
        if (col >= 0 && col < kLogprobFusedTile && col < left && int((col >> 1) & 3) == q)
          tk[h] = int(col);
      }
    }
  }
  float s[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, w[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
  float yt[2] = {0.0f, 0.0f};
#pragma unroll 1
  for (int qc = 0; qc < 8; ++qc) {  // columns 32qc .. 32qc + 31 = acc[16qc .. 16qc + 15]
#pragma unroll
    for (int qq = 0; qq < 8; ++qq) {
      if (qq == qc) {
#pragma unroll
        for (int k = 0; k < 16; ++k) buf[k * 32 + lane] = acc[16 * qq + k];
      }
    }
#pragma unroll 1
    for (int ii = 0; ii < 4; ++ii) {  // i = 4qc + ii ascending
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float y = __fdiv_rn(buf[(4 * ii + 2 * h + c) * 32 + lane], tau);
          const float d = __fsub_rn(y, m[h]);
          const float ex = ls_expf(d);
          const bool skip = y == ninf;  // padding / masked: contributes nothing
          s[h][c] = __fadd_rn(s[h][c], skip ? 0.0f : ex);
          w[h][c] = __fadd_rn(w[h][c], skip ? 0.0f : __fmul_rn(ex, d));
          if (32 * qc + 8 * ii + 2 * q + c == tk[h]) yt[h] = y;
        }
      }
    }
  }
  const int64_t tile = e.tile0 + n0 / kLogprobFusedTile;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float S = __fadd_rn(s[h][0], s[h][1]);
    float W = __fadd_rn(w[h][0], w[h][1]);
    S = __fadd_rn(S, __shfl_xor_sync(0xffffffffu, S, 1));
    W = __fadd_rn(W, __shfl_xor_sync(0xffffffffu, W, 1));
    S = __fadd_rn(S, __shfl_xor_sync(0xffffffffu, S, 2));
    W = __fadd_rn(W, __shfl_xor_sync(0xffffffffu, W, 2));
    if (q == 0 && row[h] < p.M) {
      float* st = e.states + (row[h] * e.n_tiles + tile) * 3;
      st[0] = m[h];
      st[1] = S;
      st[2] = W;
    }
    if (tk[h] >= 0) e.y_target[row[h]] = yt[h];
  }
}

// BM x BN tile per job; WGN = consumer warpgroups along N (1: they split the rows, 64 each;
// 2: they split the columns, BM = 64); NS pipeline stages. LEVELS = 0: a job is one segment of a
// tile (one segment: final values; several: workspace planes). LEVELS > 0: a job is a whole tile,
// its segments (S <= 2^LEVELS) run one after the other, each folded into a register stack of
// pending left subtrees (binary-counter order, exactly the G.4 tree), then the final epilogue.
// EPI = 0: the GEMM's epilogue (y or workspace planes). EPI = 1: the fused log-prob epilogue
// (sm90_logprob_epilogue; 128x256, one segment) instead; the main loop is the same code.
// PP = true ("ping-pong", BM = 64, WGN = 1, LEVELS = 0, EPI = 0): the two consumer warpgroups take
// the CTA's jobs in turn, each a whole 64 x BN tile (wgmma m64nBNk16), so that one warpgroup's
// epilogue runs while the other's k-loop keeps the tensor cores busy. The producer is unchanged
// (it fills the ring with every job's k-tiles in job order); a warpgroup steps its ring position
// over the other's jobs, and starts a k-loop only after the other warpgroup has finished the
// previous job's (named barriers 1 and 2): every ring slot before its first one has then been
// waited on, so each mbarrier parity wait is on the right phase. The same chains in the same
// order as every other tile: the bits do not change.
template <int BM, int BN, int WGN, int NS, int LEVELS, int EPI = 0, bool PP = false>
__global__ void __launch_bounds__(kSm90Threads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap tm_x,
                     const __grid_constant__ CUtensorMap tm_w,
                     const std::conditional_t<EPI == 1, Sm90LpParams, Sm90Params> p) {
  constexpr int WGM = PP ? 1 : 2 / WGN;
  constexpr int WN = BN / WGN;  // columns per consumer warpgroup (wgmma N)
  constexpr int R = WN / 2;     // f32 accumulators per thread
  constexpr int kABytes = BM * 128;
  constexpr int kStageBytes = (BM + BN) * 128;
  static_assert(BM == 64 * WGM && (WGN == 1 || WGN == 2), "tile shape");
  static_assert(!PP || (BM == 64 && WGN == 1 && LEVELS == 0 && EPI == 0), "ping-pong tile shape");
  static_assert(EPI == 0 || (BM == 128 && BN == kLogprobFusedTile && WGN == 1 && LEVELS == 0),
                "the fused log-prob epilogue needs 128x256 tiles, one segment");
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0, "stages 1024-aligned");

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
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_x)) : "memory");
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&tm_w)) : "memory");
  }
  __syncthreads();

  const int64_t num_m = (p.M + BM - 1) / BM;
  const int64_t num_n = (p.N + BN - 1) / BN;
  const int job_segs = LEVELS > 0 ? 1 : p.nseg;  // segments told apart by the job index
  const int64_t njobs = num_m * num_n * job_segs;
  const int nkt = int((p.seg_len + kSm90BK - 1) / kSm90BK);  // k-tiles per segment

  if (tid < 128) {
    // Producer warpgroup: registers go to the consumers; one thread issues every copy.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (tid == 0) {
      int stage = 0;
      uint32_t phase = 0;
      for (int64_t job = blockIdx.x; job < njobs; job += gridDim.x) {
        const Sm90Job j = sm90_job<BM, BN>(job, num_m, num_n, job_segs);
        const int s_end = LEVELS > 0 ? p.nseg : j.s + 1;
        for (int sg = LEVELS > 0 ? 0 : j.s; sg < s_end; ++sg) {
          const int64_t kseg = int64_t(sg) * p.seg_len;
          for (int kt = 0; kt < nkt; ++kt) {
            mbar_wait(empty_bar(stage), phase ^ 1u);  // consumers released this stage
            mbar_arrive_expect_tx(full_bar(stage), uint32_t(kStageBytes));
            const int32_t k = int32_t(kseg + int64_t(kt) * kSm90BK);
            const uint32_t dst = base + uint32_t(stage) * kStageBytes;
            tma_load_2d(dst, &tm_x, k, int32_t(j.m0), full_bar(stage));
            tma_load_2d(dst + kABytes, &tm_w, k, int32_t(j.n0), full_bar(stage));
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
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.0f;
    // Pending left subtrees of the tree (levels 0..LEVELS-1; unused when LEVELS == 0).
    float st0[LEVELS >= 1 ? R : 1], st1[LEVELS >= 2 ? R : 1], st2[LEVELS >= 3 ? R : 1];

    int stage = 0;
    uint32_t phase = 0;
    int64_t local = 0;  // PP: this CTA's job count so far (even: warpgroup 0's, odd: 1's)
    for (int64_t job = blockIdx.x; job < njobs; job += gridDim.x, ++local) {
      if constexpr (PP) {
        if (int(local & 1) != cw) {  // the other warpgroup's job: step over its nkt ring slots
          const int s2 = stage + nkt % NS;
          phase ^= uint32_t((nkt / NS) & 1);
          stage = s2 >= NS ? s2 - NS : s2;
          if (s2 >= NS) phase ^= 1u;
          continue;
        }
        if (local > 0) named_bar_sync(1 + cw, 256);  // the other's previous k-loop is done
      }
      const Sm90Job j = sm90_job<BM, BN>(job, num_m, num_n, job_segs);
      const int s_end = LEVELS > 0 ? p.nseg : j.s + 1;
      for (int sg = LEVELS > 0 ? 0 : j.s; sg < s_end; ++sg) {
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
            da[kb] = sw128_desc(a + 32u * kb);
            db[kb] = sw128_desc(b + 32u * kb);
            asm volatile("" : "+l"(da[kb]), "+l"(db[kb]));
          }
          int sd0 = kt > 0 ? 1 : 0, sd1 = 1;
          asm volatile("" : "+r"(sd0), "+r"(sd1));
          fence_acc(acc);
          // The chain: scale-d = 0 only on the segment's first k-block; k-blocks in ascending k.
          // NOTE: each branch has its own fence and commit: ptxas inserts a warpgroup.arrive before
          // a wgmma that follows a branch inside the fenced region.
          if (nkb == 4) {
            wgmma_fence();
            wgmma_k16<WN>(acc, da[0], db[0], sd0);
            wgmma_k16<WN>(acc, da[1], db[1], sd1);
            wgmma_k16<WN>(acc, da[2], db[2], sd1);
            wgmma_k16<WN>(acc, da[3], db[3], sd1);
            wgmma_commit();
          } else {  // the segment's last k-tile when Ls is not a multiple of 64 (rare)
            wgmma_fence();
            wgmma_k16<WN>(acc, da[0], db[0], sd0);
            if (nkb > 1) wgmma_k16<WN>(acc, da[1], db[1], sd1);
            if (nkb > 2) wgmma_k16<WN>(acc, da[2], db[2], sd1);
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
        if constexpr (LEVELS > 0) {
          // acc = segment sg. Fold the completed left subtrees (one per trailing 1 bit of sg),
          // then park the result at its level unless it is the root; the next segment's chain
          // starts with scale-d = 0, so acc needs no reset.
          if (sg & 1) {
            tree_add(acc, st0);
            if constexpr (LEVELS >= 2) {
              if (sg & 2) {
                tree_add(acc, st1);
                if constexpr (LEVELS >= 3) {
                  if (sg & 4) tree_add(acc, st2);
                }
              }
            }
          }
          if (sg + 1 < p.nseg) {
            const int lvl = (sg & 1) == 0 ? 0 : (sg & 2) == 0 ? 1 : 2;
            if (lvl == 0) {
              copy_acc(st0, acc);
            } else if constexpr (LEVELS >= 2) {
              if (lvl == 1) {
                copy_acc(st1, acc);
              } else if constexpr (LEVELS >= 3) {
                copy_acc(st2, acc);
              }
            }
          }
          fence_acc(acc);
        }
      }  // segments of this job
      if constexpr (PP) {
        // The next job (the other warpgroup's) may start its k-loop.
        if (job + gridDim.x < njobs) named_bar_arrive(1 + (cw ^ 1), 256);
      }

      if constexpr (EPI == 1) {
        sm90_logprob_epilogue(p, acc, epi + (cw * 4 + warp) * 16 * kSm90EpiLd,
                              j.m0 + row_off + warp * 16, j.n0, lane);
        continue;
      }
      // Epilogue, 32 columns at a time through this warp's staging rows (fragment: acc[4i + 2h + c]
      // is row 16·warp + lane/4 + 8h, column 8i + 2(lane%4) + c of the warpgroup's tile), then
      // row-contiguous stores. NOTE: only the register-to-shared copy is unrolled, the stores are
      // a rolled loop: a first version with the whole epilogue unrolled (210 KB of SASS for
      // 128x256) cost ~35 us per tile on the H200 (docs/cuda-gemm.md).
      float* stg = epi + (cw * 4 + warp) * 16 * kSm90EpiLd;
      const int64_t wrow0 = j.m0 + row_off + warp * 16;  // first row of this warp
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
  }
}

// ---- The G.4 tree over per-segment (or per-rank) fp32 values, bias once, one rounding.
struct CombineParams {
  const float* part[8];  // n planes [M, N], rows ld[i] apart
  int64_t ld[8];
  int n;  // 1, 2, 4 or 8
  int64_t M, N;
  const void* bias;  // nullptr, bf16 or f32
  int64_t bias_stride;
  int bias_f32;
  void* y;  // bf16 (one RNE rounding) or f32; NaN stored canonical
  int64_t ldy;
  int y_f32;
};

constexpr int kCombineThreads = 256;

// Grid (⌈N/256⌉, rows): one output per thread and row; an in-place f32 combine (y aliasing
// part[i] exactly) is safe: each output is read and written by the same thread only.
__global__ void __launch_bounds__(kCombineThreads) gemm_tree_combine_kernel(const CombineParams p) {
  const int64_t n = int64_t(blockIdx.x) * kCombineThreads + threadIdx.x;
  if (n >= p.N) return;
  float b = 0.0f;
  if (p.bias) {
    b = p.bias_f32 ? static_cast<const float*>(p.bias)[n * p.bias_stride]
                   : __uint_as_float(
                         uint32_t(static_cast<const uint16_t*>(p.bias)[n * p.bias_stride]) << 16);
  }
  for (int64_t m = blockIdx.y; m < p.M; m += gridDim.y) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = i < p.n ? p.part[i][m * p.ld[i] + n] : 0.0f;
    float t;
    if (p.n == 1) {
      t = v[0];
    } else if (p.n == 2) {
      t = __fadd_rn(v[0], v[1]);
    } else if (p.n == 4) {
      t = __fadd_rn(__fadd_rn(v[0], v[1]), __fadd_rn(v[2], v[3]));
    } else {
      t = __fadd_rn(__fadd_rn(__fadd_rn(v[0], v[1]), __fadd_rn(v[2], v[3])),
                    __fadd_rn(__fadd_rn(v[4], v[5]), __fadd_rn(v[6], v[7])));
    }
    if (p.bias) t = __fadd_rn(t, b);
    if (p.y_f32) {
      static_cast<uint32_t*>(p.y)[m * p.ldy + n] = canonical_f32_bits(t);
    } else {
      static_cast<uint16_t*>(p.y)[m * p.ldy + n] = round_bf16_canonical(t);
    }
  }
}

}  // namespace lockstep::cuda::detail
