// Linear log-prob kernels, docs/contract.md §L, fed fp32 logits z from the GEMM contract:
//   tile states (§L.5): 8 lanes per tile, lane l owns entries l, l+8, ... (ascending), max by the
//     max rule + zero rule, s/w lane sums skipping −inf, lanes combined by the xor butterfly
//     1, 2, 4 (= ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)));
//   fold / tree / finish (§L.6, §L.7): one thread per token folds its tile states left to right
//     per segment, merges the segments in the balanced tree, and finishes (or writes the (m, s, w,
//     y_target) state of a vocab-parallel rank, §L.8); merge and finish are the contract's own
//     host+device functions (contract/logprob_formula.h), the ones the CPU spec calls;
//   combine (§L.8): the tree over the ranks' states in rank order.
// The logits producer (GEMM into a bounded [token block, vocab chunk] scratch) lives in the
// launcher; these kernels only see its fp32 output, so a fused GEMM + tile-state kernel can
// replace both without touching the fold.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "contract/logprob_formula.h"
#include "cuda/elementwise_common.cuh"
#include "lockstep/contract/logprob.h"  // kLogprobLanes

namespace lockstep::cuda::detail {

constexpr int kLpLanes = kLogprobLanes;
constexpr int kTileThreads = 256;  // 32 tiles per CTA
constexpr int kFoldThreads = 128;
constexpr int kLaneCache = 32;  // entries per lane kept in registers (vocab_tile <= 256)
constexpr int kFoldBatch = 8;   // tile states loaded together by the fold

using contract::lp_finish;
using contract::lp_max;
using contract::lp_merge;

struct LpState {
  float m, s, w;
};

__device__ __forceinline__ LpState lp_empty() { return LpState{neg_inf_f32(), 0.0f, 0.0f}; }

static __global__ void lp_fill_kernel(float* p, int64_t n, uint32_t bits) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    p[i] = __uint_as_float(bits);
}

struct TileStateParams {
  const float* z;  // [rows, ldz]: column c = local vocab entry tile0·L + c
  int64_t ldz;
  int64_t rows;
  int64_t tile0, ntiles;  // this chunk's tiles [tile0, tile0 + ntiles) (local tile index)
  int64_t L;              // vocab_tile (multiple of 8)
  int64_t valid;          // local entries [0, valid) exist; the rest is padding (−inf)
  float tau;              // y = z / tau (IEEE divide) when kTemper
  float* states;          // [rows, n_tiles] of (m, s, w)
  int64_t n_tiles;
  // Target logits (y_target == nullptr: none): row r's target is targets[row0 + r] (global id);
  // local entry e = id − v_begin.
  float* y_target;  // [rows]
  IndexRef targets;
  int64_t row0, v_begin, ignore_index;
  // > 1: each CTA's groups cover rows_per_cta rows of all ntiles tiles (ntiles · rows_per_cta <=
  // 32, grid (1, ceil(rows / rows_per_cta))), so that narrow logits blocks (the backward's: 4
  // tiles) keep every group busy; 0 or 1: the grid below.
  int64_t rows_per_cta;
};

// Grid (ceil(ntiles / 32), rows), 256 threads: thread group of 8 = one tile of one row (or
// rows_per_cta rows per CTA, above). Which group computes a state changes no bit.
// kCached (vocab_tile <= 256): a lane's <= 32 entries are loaded (and tempered: one IEEE divide
// each) once into registers, all loads in flight; entries j >= L are −inf and contribute nothing,
// so the arithmetic is exactly the loop over j < L. Otherwise the entries are re-read per pass.
template <bool kTemper, bool kCached>
static __global__ void __launch_bounds__(kTileThreads)
    lp_tile_states_kernel(const TileStateParams p) {
  const int lane = threadIdx.x & (kLpLanes - 1);
  const int grp = threadIdx.x / kLpLanes;
  int64_t ti, r;
  bool live;  // dead groups still run the shuffles (full warps)
  if (p.rows_per_cta > 1) {
    r = int64_t(blockIdx.y) * p.rows_per_cta + grp / p.ntiles;
    ti = grp % p.ntiles;
    live = grp < p.rows_per_cta * p.ntiles && r < p.rows;
  } else {
    ti = int64_t(blockIdx.x) * (kTileThreads / kLpLanes) + grp;
    r = blockIdx.y;
    live = ti < p.ntiles;
  }
  const int64_t tile = p.tile0 + ti;
  const int64_t e0 = tile * p.L;                 // local entry of the tile's j = 0
  const float* zr = p.z + r * p.ldz + ti * p.L;  // its logit
  auto y_at = [&](int64_t j) -> float {
    if (!live || e0 + j >= p.valid) return neg_inf_f32();
    const float z = zr[j];
    return kTemper ? __fdiv_rn(z, p.tau) : z;
  };

  float m = neg_inf_f32();
  float yc[kCached ? kLaneCache : 1];
  if constexpr (kCached) {
#pragma unroll
    for (int i = 0; i < kLaneCache; ++i) {
      const int64_t j = lane + i * kLpLanes;
      yc[i] = j < p.L ? y_at(j) : neg_inf_f32();
    }
#pragma unroll
    for (int i = 0; i < kLaneCache; ++i) m = lp_max(m, yc[i]);
  } else {
    for (int64_t j = lane; j < p.L; j += kLpLanes) m = lp_max(m, y_at(j));
  }
  // The max is exact: any combination order gives the same value up to the sign of a zero.
  m = lp_max(m, __shfl_xor_sync(0xffffffffu, m, 1));
  m = lp_max(m, __shfl_xor_sync(0xffffffffu, m, 2));
  m = lp_max(m, __shfl_xor_sync(0xffffffffu, m, 4));
  if (m == 0.0f) m = 0.0f;  // zero rule

  float s = 0.0f, w = 0.0f;
  auto add = [&](float y) {
    if (y == neg_inf_f32()) return;  // padding / masked: contributes nothing
    const float d = __fsub_rn(y, m);
    const float e = ls_expf(d);
    s = __fadd_rn(s, e);
    w = __fadd_rn(w, __fmul_rn(e, d));
  };
  if constexpr (kCached) {
#pragma unroll
    for (int i = 0; i < kLaneCache; ++i) add(yc[i]);  // j = lane + 8i ascending
  } else {
    for (int64_t j = lane; j < p.L; j += kLpLanes) add(y_at(j));
  }
  // Lane tree 1, 2, 4: lane 0 ends with ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)) (+ is commutative,
  // so the partner lanes hold the same bits).
#pragma unroll
  for (int o = 1; o < kLpLanes; o <<= 1) {
    s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, o));
    w = __fadd_rn(w, __shfl_xor_sync(0xffffffffu, w, o));
  }
  if (live && lane == 0) {
    float* st = p.states + (r * p.n_tiles + tile) * 3;
    st[0] = m;
    st[1] = s;
    st[2] = w;
    if (p.y_target) {
      const int64_t g = p.targets[p.row0 + r];
      if (g != p.ignore_index) {
        const int64_t e = g - p.v_begin;
        if (e >= e0 && e < e0 + p.L && e >= 0 && e < p.valid) p.y_target[r] = y_at(e - e0);
      }
    }
  }
}

enum FoldMode : int {
  kFoldOutputs = 0,   // logp, lse, entropy of token row0 + r (strided outputs)
  kFoldState = 1,     // (m, s, w, y_target) of a vocab-parallel rank, canonical NaN
  kFoldRowStats = 2,  // lse, entropy only (sampling)
};

struct FoldParams {
  const float* states;  // [rows, n_tiles] of (m, s, w)
  int64_t n_tiles, tps;
  int seg_count;
  int64_t rows, row0;
  int mode;
  const float* y_target;  // [rows]
  IndexRef targets;
  int64_t ignore_index;
  float* logp;
  float* lse;
  float* entropy;
  int64_t logp_s, lse_s, entropy_s;  // element strides
  float* state;                      // [T, 4], row stride state_ld
  int64_t state_ld;
};

static __global__ void __launch_bounds__(kFoldThreads) lp_fold_kernel(const FoldParams p) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= p.rows) return;
  const float* st = p.states + r * p.n_tiles * 3;
  LpState seg[8];
  for (int k = 0; k < p.seg_count; ++k) {
    LpState acc = lp_empty();
    // Left to right; kFoldBatch states are loaded at once so their latency overlaps.
    for (int64_t i0 = 0; i0 < p.tps; i0 += kFoldBatch) {
      LpState q[kFoldBatch];
#pragma unroll
      for (int u = 0; u < kFoldBatch; ++u) {
        if (i0 + u < p.tps) {
          const float* a = st + (k * p.tps + i0 + u) * 3;
          q[u] = LpState{a[0], a[1], a[2]};
        }
      }
#pragma unroll
      for (int u = 0; u < kFoldBatch; ++u)
        if (i0 + u < p.tps) acc = lp_merge(acc, q[u]);
    }
    seg[k] = acc;
  }
  for (int len = p.seg_count; len > 1; len >>= 1)
    for (int i = 0; i < len / 2; ++i) seg[i] = lp_merge(seg[2 * i], seg[2 * i + 1]);
  const LpState all = seg[0];
  const int64_t t = p.row0 + r;
  if (p.mode == kFoldState) {
    float* o = p.state + t * p.state_ld;
    o[0] = canonical(all.m);
    o[1] = canonical(all.s);
    o[2] = canonical(all.w);
    o[3] = canonical(p.y_target[r]);
    return;
  }
  float ent;
  const float l = lp_finish(all, &ent);
  p.lse[t * p.lse_s] = l;
  p.entropy[t * p.entropy_s] = ent;
  if (p.mode == kFoldOutputs) {
    const bool ignored = p.targets[t] == p.ignore_index;
    p.logp[t * p.logp_s] = ignored ? 0.0f : canonical(__fsub_rn(p.y_target[r], l));
  }
}

// Blocks of kFoldThreads threads for n rows (one thread each).
inline unsigned fold_blocks(int64_t n) { return unsigned((n + kFoldThreads - 1) / kFoldThreads); }

inline void launch_fold(const FoldParams& p, cudaStream_t stream, const char* op) {
  lp_fold_kernel<<<fold_blocks(p.rows), kFoldThreads, 0, stream>>>(p);
  check_launch(op);
}

// The settings every tile-state launch and the fold of one call share (linear_logprob's and the
// backward's recompute, §B.8): `states` [rows, n_tiles·3] and `y_target` [rows] are the call's
// buffers; z, rows, tile range and row0 are per launch, the fold's mode and outputs the caller's.
inline void logprob_states_shared(const LogprobVocabLayout& lay, int seg_count, int64_t valid,
                                  int64_t v_begin, const IndexRef& targets,
                                  const LogprobParams& params, float* states, float* y_target,
                                  TileStateParams& tiles, FoldParams& fold) {
  const int64_t n_tiles = lay.tiles_per_segment * seg_count;
  tiles.L = lay.tile;
  tiles.valid = valid;
  tiles.tau = params.temperature;
  tiles.states = states;
  tiles.n_tiles = n_tiles;
  tiles.y_target = y_target;
  tiles.targets = targets;
  tiles.v_begin = v_begin;
  tiles.ignore_index = params.ignore_index;
  fold.states = states;
  fold.n_tiles = n_tiles;
  fold.tps = lay.tiles_per_segment;
  fold.seg_count = seg_count;
  fold.y_target = y_target;
  fold.targets = targets;
  fold.ignore_index = params.ignore_index;
}

// The fold into logp / lse / entropy ([T] f32 views, any element stride).
inline FoldParams fold_to_outputs(const TensorView& logp, const TensorView& lse,
                                  const TensorView& entropy) {
  FoldParams f{};
  f.mode = kFoldOutputs;
  f.logp = logp.ptr<float>();
  f.lse = lse.ptr<float>();
  f.entropy = entropy.ptr<float>();
  f.logp_s = logp.stride[0];
  f.lse_s = lse.stride[0];
  f.entropy_s = entropy.stride[0];
  return f;
}

struct LpCombineParams {
  const float* states;  // [R, T, 4]: element (r, t, c) at r·sr + t·st + c
  int64_t sr, st;
  int R;
  int64_t T;
  int64_t rank_len;  // vocab rows per rank (V_pad / R)
  IndexRef targets;
  int64_t ignore_index;
  float* logp;
  float* lse;
  float* entropy;
  int64_t logp_s, lse_s, entropy_s;
};

static __global__ void __launch_bounds__(kFoldThreads) lp_combine_kernel(const LpCombineParams p) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.T) return;
  LpState st[8];
  for (int r = 0; r < p.R; ++r) {
    const float* q = p.states + r * p.sr + t * p.st;
    st[r] = LpState{q[0], q[1], q[2]};
  }
  for (int len = p.R; len > 1; len >>= 1)
    for (int i = 0; i < len / 2; ++i) st[i] = lp_merge(st[2 * i], st[2 * i + 1]);
  float ent;
  const float l = lp_finish(st[0], &ent);
  p.lse[t * p.lse_s] = l;
  p.entropy[t * p.entropy_s] = ent;
  const int64_t g = p.targets[t];
  float lp = 0.0f;
  if (g != p.ignore_index) {
    const int64_t owner = g < 0 ? p.R : g / p.rank_len;
    const float y =
        owner < p.R ? p.states[owner * p.sr + t * p.st + 3] : __uint_as_float(kCanonicalNanF32);
    lp = canonical(__fsub_rn(y, l));
  }
  p.logp[t * p.logp_s] = lp;
}

}  // namespace lockstep::cuda::detail
