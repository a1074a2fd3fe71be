// The fused log-prob epilogue of the Hopper GEMM kernel (src/cuda/gemm/mainloop_sm90.cuh, the
// plain GEMM's main loop, one segment, 128x256 tiles): docs/contract.md §L.4-L.5 computed from the
// accumulators. Instead of storing the fp32 logits z[m, n] = x[m, :]·w[n, :] (one segment, the
// §G.3 chain), each 128x256 tile writes the §L.5 tile state (m, s, w) of y = z / tau for each of
// its rows, one vocab tile of 256 = the tile's columns: states[(m · n_tiles + tile0 + n0 / 256) ·
// 3 + {0, 1, 2}] (raw fp32, NaN payload unspecified, as the unfused tile-state kernel writes
// them); columns n >= N are padding (y = −inf). y_target[m] = y[m, col] for col = targets[row0 +
// m] − target_base when that target is not ignore_index and col ∈ [0, N) (else y_target[m] is left
// as it is). Launched by the fused producer of logprob.cu (docs/cuda-gemm.md "Fused log-prob
// epilogue").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/math.h"  // ls_expf
#include "cuda/gemm/mainloop_sm90.cuh"
#include "cuda/logprob.cuh"  // TileStateParams (fused_states_epilogue)

namespace lockstep::cuda::detail {

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

// The fused kernel's parameters: the plain ones (ws_mode == 0, nseg == 1) + the epilogue's.
// NOTE: a separate type, so the plain kernels keep their parameter block (and PTX) unchanged.
struct Sm90LpParams : Sm90Params {
  GemmLogprobEpilogue lp;
};

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
  // tau = 1: y = z ⊘ 1 = z bit for bit (z comes from the MMA: a NaN is already canonical), so the
  // divide is skipped, as the unfused tile-state kernel's kTemper = false does.
  const bool temper = tau != 1.0f;
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
          const float x = buf[(4 * ii + 2 * h + c) * 32 + lane];
          const float y = temper ? __fdiv_rn(x, tau) : x;
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

// The epilogue's parameters from a call's shared tile-state settings (logprob_states_shared):
// the launch's row m is targets row row0 + m, its column 0 the start of local vocab tile tile0.
inline GemmLogprobEpilogue fused_states_epilogue(const TileStateParams& tiles, int64_t row0,
                                                 int64_t tile0) {
  GemmLogprobEpilogue e{};
  e.tau = tiles.tau;
  e.states = tiles.states;
  e.n_tiles = tiles.n_tiles;
  e.tile0 = tile0;
  e.y_target = tiles.y_target;
  e.targets = tiles.targets.p;
  e.targets_stride = tiles.targets.stride;
  e.targets_i64 = tiles.targets.is64;
  e.row0 = row0;
  e.target_base = tiles.v_begin + tile0 * kLogprobFusedTile;
  e.ignore_index = tiles.ignore_index;
  return e;
}

// The epilogue as the Hopper kernel's Epi parameter.
struct LogprobEpilogue {
  using Params = Sm90LpParams;
  static constexpr bool kFused = true;
  __device__ __forceinline__ static void apply(const Params& p, float (&acc)[128], float* buf,
                                               int64_t wrow0, int64_t n0, int lane) {
    sm90_logprob_epilogue(p, acc, buf, wrow0, n0, lane);
  }
};

}  // namespace lockstep::cuda::detail
