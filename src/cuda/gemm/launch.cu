// Launchers of the tensor-core GEMM: cuda::gemm_bf16_nt, gemm_bf16_nt_partial, gemm_tree_combine,
// gemm_launch_plan, and the internal entries that run a given plan (internal.h). Every argument is
// checked before a launch by the contract's checks (contract/checks.h, the same as the cpu
// functions', with Device::kCUDA); the plan comes from plan_gemm (plan.h: sizes, segments and
// operand alignment only, never the data or the device), and every plan computes each output with
// the same chain (§G.3) and tree (§G.4), so the choice is a speed choice: the bits are the CPU's.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "contract/checks.h"
#include "cuda/gemm/internal.h"
#include "cuda/gemm/mainloop_mma_sync.cuh"
#include "cuda/gemm/sm90_launch.cuh"
#include "cuda/gemm/tree_combine.cuh"
#include "lockstep/cuda/gemm.h"
#include "lockstep/error.h"

namespace lockstep::cuda {

namespace {

using detail::GemmParams;

constexpr const char* kOp = "cuda::gemm_bf16_nt";
constexpr const char* kOpPartial = "cuda::gemm_bf16_nt_partial";
constexpr const char* kOpCombine = "cuda::gemm_tree_combine";
constexpr const char* kOpNN = "cuda::gemm_bf16_nn";

// Upper bound of the fp32 workspace of a multi-segment wgmma launch (rows are processed in chunks).
constexpr int64_t kWorkspaceBytes = int64_t(1) << 30;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// One launch's operands: y = tree over nseg segments of length seg_len of the chains over
// x[:, 0..K) · w[:, 0..K) (zero beyond K), + bias, rounded once (the kernels' GemmParams; bias
// and y as given). w_mn: w is stored [K, N] (the nn layout), else [N, K].
GemmParams core_params(const TensorView& x, const TensorView& w, const TensorView* bias, int nseg,
                       int64_t seg_len, const TensorView& y, bool w_mn = false) {
  GemmParams p{};
  p.x = static_cast<const uint16_t*>(x.data);
  p.w = static_cast<const uint16_t*>(w.data);
  p.bias = bias ? bias->data : nullptr;
  p.y = y.data;
  p.M = x.shape[0];
  p.N = w.shape[w_mn ? 1 : 0];
  p.K = x.shape[1];
  p.ldx = x.stride[0];
  p.ldw = w.stride[0];
  p.ldy = y.stride[0];
  p.bias_stride = bias ? bias->stride[0] : 0;
  p.seg_len = seg_len;
  p.segments = nseg;
  p.bias_f32 = (bias && bias->dtype == DType::kF32) ? 1 : 0;
  p.y_f32 = y.dtype == DType::kF32 ? 1 : 0;
  p.x_vec = (aligned16(p.x) && (p.M <= 1 || p.ldx % 8 == 0)) ? 1 : 0;
  p.w_vec = (aligned16(p.w) && (p.N <= 1 || p.ldw % 8 == 0)) ? 1 : 0;
  p.w_mn = w_mn ? 1 : 0;
  return p;
}

// TMA needs 16-byte aligned bases and row strides (and a row stride that covers the row, under
// 2^39 bytes): a matrix of `rows` rows of `cols` elements of elem_bytes bytes (bf16 unless
// given), rows ld apart.
bool tma_matrix_ok(const void* p, int64_t rows, int64_t cols, int64_t ld, int elem_bytes = 2) {
  return aligned16(p) && (rows <= 1 || (ld % (16 / elem_bytes) == 0 && ld >= cols &&
                                        ld < (int64_t(1) << 39) / elem_bytes));
}
bool tma_compatible(const void* x, int64_t M, int64_t ldx, const void* w, int64_t N, int64_t ldw,
                    int64_t K) {
  return K >= 1 && K < (int64_t(1) << 31) && M < (int64_t(1) << 31) && N < (int64_t(1) << 31) &&
         tma_matrix_ok(x, M, K, ldx) && tma_matrix_ok(w, N, K, ldw);
}
// Any layout (x stored [K, M] when x_mn, w stored [K, N] when w_mn).
bool tma_compatible(const GemmParams& c) {
  const bool sizes =
      c.K >= 1 && c.K < (int64_t(1) << 31) && c.M < (int64_t(1) << 31) && c.N < (int64_t(1) << 31);
  const bool x_ok =
      c.x_mn ? tma_matrix_ok(c.x, c.K, c.M, c.ldx) : tma_matrix_ok(c.x, c.M, c.K, c.ldx);
  const bool w_ok =
      c.w_mn ? tma_matrix_ok(c.w, c.K, c.N, c.ldw) : tma_matrix_ok(c.w, c.N, c.K, c.ldw);
  return sizes && x_ok && w_ok;
}

GemmLayout layout_of(const GemmParams& c) {
  return c.w_mn ? (c.x_mn ? GemmLayout::kTN : GemmLayout::kNN) : GemmLayout::kNT;
}

GemmProblem problem_of(const GemmParams& c, bool partial) {
  return {c.M, c.N, c.K, c.segments, c.seg_len, layout_of(c), tma_compatible(c), partial};
}

// ---- mma.sync (mainloop_mma_sync.cuh).
template <int BM, int BN, int NS>
void launch_mma(const GemmParams& p, cudaStream_t stream) {
  constexpr int kSmem = detail::gemm_smem_bytes<BM, BN, NS>();
  detail::allow_dynamic_smem<detail::gemm_bf16_nt_kernel<BM, BN, NS>>(kOp, kSmem);
  LS_CHECK(p.M <= int64_t(65535) * BM, kOp, "x: M = ", p.M, " exceeds the grid limit");
  dim3 grid(unsigned((p.N + BN - 1) / BN), unsigned((p.M + BM - 1) / BM));
  detail::gemm_bf16_nt_kernel<BM, BN, NS><<<grid, detail::kGemmThreads, kSmem, stream>>>(p);
}

void run_mma(const GemmParams& p, const GemmPlan& plan, cudaStream_t s) {
  if (plan.tile.bm == 32) {
    launch_mma<32, 64, 8>(p, s);
  } else {
    launch_mma<128, 128, 4>(p, s);
  }
  detail::check_launch(kOp);
}

// ---- Hopper (mainloop_sm90.cuh): the instantiation of a wgmma plan; BT: w MN-major ("nn").
// A tile's kernel with `levels` tree levels (0: one segment; 1-3: the stash, S = 2, 4, 8).
template <int BM, int BN, int NS, bool PP, bool BT>
void launch_sm90_levels(int levels, const CUtensorMap& tx, const CUtensorMap& tw,
                        const detail::Sm90Params& p, cudaStream_t s) {
  using detail::launch_sm90_tile;
  using Store = detail::Sm90StoreEpilogue;
  if (levels == 0) {
    launch_sm90_tile<BM, BN, NS, 0, Store, PP, false, BT>(kOp, tx, tw, p, s);
  } else if (levels == 1) {
    launch_sm90_tile<BM, BN, NS, 1, Store, PP, false, BT>(kOp, tx, tw, p, s);
  } else if (levels == 2) {
    launch_sm90_tile<BM, BN, NS, 2, Store, PP, false, BT>(kOp, tx, tw, p, s);
  } else {
    launch_sm90_tile<BM, BN, NS, 3, Store, PP, false, BT>(kOp, tx, tw, p, s);
  }
}
template <bool BT>
void launch_sm90_plan(const GemmPlan& plan, const CUtensorMap& tx, const CUtensorMap& tw,
                      const detail::Sm90Params& p, cudaStream_t s) {
  using detail::launch_sm90_tile;
  using Store = detail::Sm90StoreEpilogue;
  const GemmTile& t = plan.tile;
  if (plan.ping_pong) {
    launch_sm90_levels<64, 256, 5, true, BT>(plan.tree_levels, tx, tw, p, s);
  } else if (plan.fold == GemmFold::kStash) {  // the 128x256 tile (S = 2, 4, 8)
    launch_sm90_levels<128, 256, 4, false, BT>(plan.tree_levels, tx, tw, p, s);
  } else if (plan.tree_levels == 1) {  // the register tree (S <= 2), or one segment pair
    launch_sm90_tile<128, 128, 6, 1, Store, false, false, BT>(kOp, tx, tw, p, s);
  } else if (plan.tree_levels == 2) {  // the 128x128 register tree at S = 4
    launch_sm90_tile<128, 128, 4, 2, Store, false, false, BT>(kOp, tx, tw, p, s);
  } else if (plan.tree_levels == 3) {
    launch_sm90_tile<64, 128, 8, 3, Store, false, false, BT>(kOp, tx, tw, p, s);
  } else if (t.bm == 128 && t.bn == 128) {
    launch_sm90_tile<128, 128, 6, 0, Store, false, false, BT>(kOp, tx, tw, p, s);
  } else if (t.bm == 64) {
    launch_sm90_tile<64, 128, 8, 0, Store, false, false, BT>(kOp, tx, tw, p, s);
  } else {
    launch_sm90_tile<128, 256, 4, 0, Store, false, false, BT>(kOp, tx, tw, p, s);
  }
}
void launch_sm90(const GemmParams& c, const GemmPlan& plan, const CUtensorMap& tx,
                 const CUtensorMap& tw, const detail::Sm90Params& p, cudaStream_t s) {
  if (c.w_mn) {
    launch_sm90_plan<true>(plan, tx, tw, p, s);
  } else {
    launch_sm90_plan<false>(plan, tx, tw, p, s);
  }
}

// A Hopper launch's final-mode parameters (ws_mode 0, no bias: the caller sets one): nseg segments
// of seg_len over `rows` rows into y (f32 or bf16, rows ldy apart), with the pair stores where
// y's base and row stride allow them.
detail::Sm90Params final_params(int64_t rows, int64_t N, int64_t seg_len, int nseg, void* y,
                                int64_t ldy, bool y_f32) {
  detail::Sm90Params p{};
  p.M = rows;
  p.N = N;
  p.seg_len = seg_len;
  p.nseg = nseg;
  p.ws_mode = 0;
  p.bias = nullptr;
  p.y = y;
  p.ldy = ldy;
  p.y_f32 = y_f32 ? 1 : 0;
  const uintptr_t pair_bytes = y_f32 ? 8 : 4;
  p.y_pair =
      (reinterpret_cast<uintptr_t>(y) % pair_bytes == 0 && (rows <= 1 || ldy % 2 == 0)) ? 1 : 0;
  p.y_vec =
      (!y_f32 && reinterpret_cast<uintptr_t>(y) % 16 == 0 && (rows <= 1 || ldy % 8 == 0)) ? 1 : 0;
  return p;
}

// Whether TMA can read and write f32 y [M, N] (rows ldy apart) in place.
bool y_tma_ok(const float* y, int64_t M, int64_t N, int64_t ldy) {
  return M < (int64_t(1) << 31) && N < (int64_t(1) << 31) && tma_matrix_ok(y, M, N, ldy, 4);
}

// The ping-pong accumulate launch with y through TMA: YS y slots per consumer warpgroup, NS
// pipeline stages (mainloop_sm90.cuh Sm90TmaYEpilogue).
template <typename Epi, int YS, int NS, bool AT>
void launch_tn_tma_y(const char* op, const GemmProblem& q, const CUtensorMap& tx,
                     const CUtensorMap& tw, const detail::sm90_blocked_maps_t<Epi>& bmaps,
                     const typename Epi::Params& p, float* y, int64_t ldy, cudaStream_t s) {
  using EpiY = detail::Sm90TmaYEpilogue<Epi, YS>;
  detail::sm90_blocked_maps_t<EpiY> ym{};
  if constexpr (detail::sm90_blocked<Epi>::value) ym = bmaps;
  const CUresult r = detail::encode_f32_tensor_map(&ym.y, y, q.M, q.N, ldy, 64);
  LS_CHECK(r == CUDA_SUCCESS, op, "cuTensorMapEncodeTiled failed (", int(r), ") for f32 y [", q.M,
           ", ", q.N, "] with row stride ", ldy);
  detail::launch_sm90_tile<64, 256, NS, 0, EpiY, true, AT, true>(op, tx, tw, p, s, ym);
}

// The TN layout's accumulate launch (dW), plain (Sm90AccumulateEpilogue) or blocked
// (Sm90BlockedAccumulateEpilogue: the caller set p's block table and the tail maps): `plan`
// (lockstep::Error unless legal for q) or plan_gemm(q), both operands MN-major, one segment of
// q.segment_len, each output's chain starting from f32 y's value (rows ldy apart) and stored back.
// Both forms pick the same tile for the same plan.
// AT = false: the NN accumulate launch (x K-major, its tensor map in boxes of the plan's bm rows:
// gemm_bf16_nn_accumulate), the same tiles.
template <typename Epi, bool AT = true>
void launch_tn_accumulate(const char* op, const GemmProblem& q, const GemmPlan* plan,
                          const CUtensorMap& tx, const CUtensorMap& tw,
                          const detail::sm90_blocked_maps_t<Epi>& bmaps, typename Epi::Params p,
                          float* y, int64_t ldy, cudaStream_t s) {
  using detail::launch_sm90_tile;
  LS_CHECK(!plan || gemm_plan_legal(q, *plan), op, "the plan '", plan ? plan->to_string() : "",
           "' cannot run the tn layout M = ", q.M, ", N = ", q.N, ", K = ", q.K);
  const GemmPlan pl = plan ? *plan : plan_gemm(q);
  static_cast<detail::Sm90Params&>(p) = final_params(q.M, q.N, q.segment_len, 1, y, ldy, true);
  const GemmTile& t = pl.tile;
  if (pl.ping_pong && y_tma_ok(y, q.M, q.N, ldy)) {
    // y through TMA (mainloop_sm90.cuh Sm90TmaYEpilogue): launches of at most kTnFourYSlotsMaxK
    // slots with four y slots per warpgroup and four stages, longer ones with one slot and five
    // stages. Same values in the same places as the scalar form below: the choice changes no bit.
    if (q.K <= kTnFourYSlotsMaxK) {
      launch_tn_tma_y<Epi, 4, 4, AT>(op, q, tx, tw, bmaps, p, y, ldy, s);
    } else {
      launch_tn_tma_y<Epi, 1, 5, AT>(op, q, tx, tw, bmaps, p, y, ldy, s);
    }
  } else if (pl.ping_pong) {
    launch_sm90_tile<64, 256, 5, 0, Epi, true, AT, true>(op, tx, tw, p, s, bmaps);
  } else if (t.bm == 128 && t.bn == 128) {
    launch_sm90_tile<128, 128, 6, 0, Epi, false, AT, true>(op, tx, tw, p, s, bmaps);
  } else if (t.bm == 64) {
    launch_sm90_tile<64, 128, 8, 0, Epi, false, AT, true>(op, tx, tw, p, s, bmaps);
  } else {
    launch_sm90_tile<128, 256, 4, 0, Epi, false, AT, true>(op, tx, tw, p, s, bmaps);
  }
}

CUtensorMap tensor_map(const uint16_t* p, int64_t rows, int64_t K, int64_t ld, int box_rows) {
  return detail::sm90_tensor_map(kOp, p, rows, K, ld, box_rows);
}
// The tensor map of w's k range [k0, k0 + kn) (kn >= 1): K-major w [N, K] in boxes of 64 k x
// box_rows rows, or (w_mn) MN-major w [K, N] in boxes of 64 columns x 64 k rows.
CUtensorMap w_tensor_map(const GemmParams& c, int64_t k0, int64_t kn, int box_rows) {
  if (c.w_mn) return tensor_map(c.w + k0 * c.ldw, kn, c.N, c.ldw, detail::kSm90BK);
  return tensor_map(c.w + k0, c.N, kn, c.ldw, box_rows);
}

void launch_combine(const detail::CombineParams& p, cudaStream_t s) {
  if (p.M == 0 || p.N == 0) return;
  dim3 grid(unsigned((p.N + detail::kCombineThreads - 1) / detail::kCombineThreads),
            unsigned(std::min<int64_t>(p.M, 65535)));
  detail::gemm_tree_combine_kernel<<<grid, detail::kCombineThreads, 0, s>>>(p);
  detail::check_launch(kOp);
}

// Row stride of the fp32 workspace planes: N rounded up to 4 (every plane starts 16-byte aligned,
// and the stride is even: the pair stores of the kernels' epilogue never cross a row).
int64_t ws_ld(const GemmParams& c) { return (c.N + 3) / 4 * 4; }

// Runs fn(ws, m, rows) over chunks of `rows` rows of y (multiples of bm, the last one shorter)
// with an fp32 workspace of planes planes of [rows, ws_ld], at most kWorkspaceBytes (at least one
// bm-row chunk); fn launches the chunk's GEMM jobs and then the tree kernel, whose parameters
// combine_params fills.
template <typename Fn>
void in_workspace_chunks(const GemmParams& c, int bm, int planes, cudaStream_t s, Fn&& fn) {
  const int64_t row_bytes = int64_t(planes) * ws_ld(c) * 4;
  int64_t chunk = std::max<int64_t>(bm, kWorkspaceBytes / row_bytes / bm * bm);
  chunk = std::min(chunk, (c.M + bm - 1) / bm * bm);
  float* ws = nullptr;
  const cudaError_t e =
      cudaMallocAsync(reinterpret_cast<void**>(&ws), size_t(chunk * row_bytes), s);
  LS_CHECK(e == cudaSuccess, kOp, "cudaMallocAsync of the ", chunk * row_bytes,
           "-byte workspace failed: ", cudaGetErrorString(e));
  try {
    for (int64_t m = 0; m < c.M; m += chunk) fn(ws, m, std::min(chunk, c.M - m));
  } catch (...) {
    cudaFreeAsync(ws, s);
    throw;
  }
  const cudaError_t f = cudaFreeAsync(ws, s);
  LS_CHECK(f == cudaSuccess, kOp, "cudaFreeAsync of the workspace failed: ", cudaGetErrorString(f));
}

// The tree kernel over n planes of `rows` rows starting at ws (ws_ld apart) into y rows [m, m +
// rows): bias once, one rounding.
detail::CombineParams combine_params(const GemmParams& c, float* ws, int n, int64_t m,
                                     int64_t rows) {
  const int64_t ld_ws = ws_ld(c);
  detail::CombineParams q{};
  q.n = n;
  for (int i = 0; i < n; ++i) {
    q.part[i] = ws + i * rows * ld_ws;
    q.ld[i] = ld_ws;
  }
  q.M = rows;
  q.N = c.N;
  q.bias = c.bias;
  q.bias_stride = c.bias_stride;
  q.bias_f32 = c.bias_f32;
  q.y = static_cast<char*>(c.y) + size_t(m * c.ldy) * (c.y_f32 ? 4 : 2);
  q.ldy = c.ldy;
  q.y_f32 = c.y_f32;
  return q;
}

// S = 4 / 8 as S/2 pairs of segments: pair i covers the k range [2i·Ls, (2i + 2)·Ls) of the
// padded K, i.e. the segments 2i and 2i + 1, whose G.4 subtree (s_2i + s_2i+1) the 128x128
// register-tree kernel computes exactly as it does for S = 2 (views of x and w starting at column
// 2i·Ls, TMA zero fill past K). Each pair's fp32 value goes to its own plane (final mode, f32
// output, no bias: the stored bits are the fp32 values, a NaN made canonical — it stays a NaN
// through the remaining adds and is stored canonical at the end anyway), then the tree kernel
// folds the S/2 planes with G.4's upper levels ((p0 + p1) for S = 4, (p0 + p1) + (p2 + p3) for
// S = 8), adds the bias once and rounds once. A pair entirely in K's padding (K <= 2i·Ls) is a
// chain over zero fill, +0: its plane is written as zero bytes.
void run_sm90_pairs(const GemmParams& c, const GemmPlan& plan, cudaStream_t s) {
  const GemmTile& t = plan.tile;
  const int npairs = c.segments / 2;
  LS_CHECK((c.segments == 4 || c.segments == 8) && c.seg_len % 16 == 0, kOp,
           "internal: ", c.segments, " segments of ", c.seg_len, " for the segment-pair path");
  const int64_t ld_ws = ws_ld(c);
  // Each pair's w view and its tensor map (the same for every row chunk); kq <= 0: no real k.
  int64_t kq[4];
  CUtensorMap tw[4];
  for (int i = 0; i < npairs; ++i) {
    const int64_t k0 = 2 * int64_t(i) * c.seg_len;
    kq[i] = std::min(c.K - k0, 2 * c.seg_len);
    if (kq[i] > 0) tw[i] = w_tensor_map(c, k0, kq[i], t.bn);
  }
  in_workspace_chunks(c, t.bm, npairs, s, [&](float* ws, int64_t m, int64_t rows) {
    for (int i = 0; i < npairs; ++i) {
      float* plane = ws + i * rows * ld_ws;
      if (kq[i] <= 0) {
        const cudaError_t z = cudaMemsetAsync(plane, 0, size_t(rows * ld_ws) * 4, s);
        LS_CHECK(z == cudaSuccess, kOp, "cudaMemsetAsync failed: ", cudaGetErrorString(z));
        continue;
      }
      // (Planes are 16-byte aligned and ld_ws is even: the pair stores apply.)
      const detail::Sm90Params p = final_params(rows, c.N, c.seg_len, 2, plane, ld_ws, true);
      const int64_t k0 = 2 * int64_t(i) * c.seg_len;
      const CUtensorMap tx = tensor_map(c.x + m * c.ldx + k0, rows, kq[i], c.ldx, t.bm);
      launch_sm90(c, plan, tx, tw[i], p, s);
    }
    launch_combine(combine_params(c, ws, npairs, m, rows), s);
  });
}

void run_sm90(const GemmParams& c, const GemmPlan& plan, cudaStream_t s) {
  if (plan.fold == GemmFold::kPairs) {
    run_sm90_pairs(c, plan, s);
    return;
  }
  const GemmTile& t = plan.tile;
  const CUtensorMap tw = w_tensor_map(c, 0, c.K, t.bn);
  if (plan.fold != GemmFold::kPlanes) {
    detail::Sm90Params p = final_params(c.M, c.N, c.seg_len, c.segments, c.y, c.ldy, c.y_f32 != 0);
    p.bias = c.bias;
    p.bias_stride = c.bias_stride;
    p.bias_f32 = c.bias_f32;
    const CUtensorMap tx = tensor_map(c.x, c.M, c.K, c.ldx, t.bm);
    if (plan.fold != GemmFold::kStash) {
      launch_sm90(c, plan, tx, tw, p, s);
      return;
    }
    // The stash: per CTA of the persistent grid (at most one per SM) and consumer warpgroup,
    // tree_levels levels of a 64 x 256 fp32 tile.
    const size_t bytes = size_t(detail::sm90_sm_count()) * 2 *
                         detail::sm90_stash_floats_per_wg(plan.tree_levels) * 4;
    const cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&p.stash), bytes, s);
    LS_CHECK(e == cudaSuccess, kOp, "cudaMallocAsync of the ", bytes,
             "-byte segment stash failed: ", cudaGetErrorString(e));
    try {
      launch_sm90(c, plan, tx, tw, p, s);
    } catch (...) {
      cudaFreeAsync(p.stash, s);
      throw;
    }
    const cudaError_t f = cudaFreeAsync(p.stash, s);
    LS_CHECK(f == cudaSuccess, kOp, "cudaFreeAsync of the stash failed: ", cudaGetErrorString(f));
    return;
  }
  // Several segments: per-segment fp32 planes, then the tree (+ bias, one rounding) per row chunk.
  detail::Sm90Params p{};
  p.N = c.N;
  p.seg_len = c.seg_len;
  p.nseg = c.segments;
  in_workspace_chunks(c, t.bm, c.segments, s, [&](float* ws, int64_t m, int64_t rows) {
    p.M = rows;
    p.ws_mode = 1;
    p.ws = ws;
    p.ld_ws = ws_ld(c);
    p.ws_plane = rows * p.ld_ws;
    const CUtensorMap tx = tensor_map(c.x + m * c.ldx, rows, c.K, c.ldx, t.bm);
    launch_sm90(c, plan, tx, tw, p, s);
    launch_combine(combine_params(c, ws, c.segments, m, rows), s);
  });
}

// Runs a legal plan (plan.h) for these operands.
void run_plan(const GemmParams& c, const GemmPlan& plan, cudaStream_t s) {
  switch (plan.mainloop) {
    case GemmMainloop::kSmallMRing:
    case GemmMainloop::kSmallMTma:
    case GemmMainloop::kSmallMWgmma:
      detail::run_small_m(c, plan, s);
      break;
    case GemmMainloop::kMmaSync:
      run_mma(c, plan, s);
      break;
    case GemmMainloop::kWgmma:
      run_sm90(c, plan, s);
      break;
  }
}

// Runs `plan` (checked legal) or, without one, plan_gemm's plan for checked operands c.
void run_checked(const char* op, const GemmParams& c, bool partial, const GemmPlan* plan,
                 void* stream) {
  const GemmProblem q = problem_of(c, partial);
  LS_CHECK(!plan || gemm_plan_legal(q, *plan), op, "the plan '", plan ? plan->to_string() : "",
           "' cannot run M = ", q.M, ", N = ", q.N, ", K = ", q.K, ", S = ", q.segments,
           q.tma_ok ? "" : " (operands not TMA-compatible)", q.partial ? " (partial)" : "");
  run_plan(c, plan ? *plan : plan_gemm(q), static_cast<cudaStream_t>(stream));
}

// The launch of cfg's K layout (w_mn: the nn layout, w [K, N]).
GemmParams gemm_params(const TensorView& x, const TensorView& w, const TensorView* bias,
                       const GemmConfig& cfg, const TensorView& y, bool w_mn = false) {
  const GemmKLayout kl = gemm_k_layout(cfg, x.shape[1]);
  return core_params(x, w, bias, kl.segments, kl.segment_len, y, w_mn);
}

// A TP rank's launch: its S / tp segments of the global layout's length, no bias, f32 out.
GemmParams partial_params(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                          int tp_size, const GemmConfig& cfg, const TensorView& y_partial,
                          bool w_mn = false) {
  const GemmKLayout kl = gemm_k_layout(cfg, k_total);
  return core_params(x_shard, w_shard, nullptr, cfg.segments / tp_size, kl.segment_len, y_partial,
                     w_mn);
}

void run_gemm(const TensorView& x, const TensorView& w, const TensorView* bias,
              const GemmConfig& cfg, const TensorView& y, const GemmPlan* plan, void* stream) {
  contract::check_gemm(kOp, Device::kCUDA, x, w, bias, cfg, y);
  if (x.shape[0] == 0 || w.shape[0] == 0) return;
  run_checked(kOp, gemm_params(x, w, bias, cfg, y), /*partial=*/false, plan, stream);
}

void run_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total, int tp_size,
                 int tp_rank, const GemmConfig& cfg, const TensorView& y_partial,
                 const GemmPlan* plan, void* stream) {
  contract::check_gemm_partial(kOpPartial, Device::kCUDA, x_shard, w_shard, k_total, tp_size,
                               tp_rank, cfg, y_partial);
  if (x_shard.size(0) == 0 || w_shard.size(0) == 0) return;
  run_checked(kOpPartial, partial_params(x_shard, w_shard, k_total, tp_size, cfg, y_partial),
              /*partial=*/true, plan, stream);
}

}  // namespace

namespace detail {

GemmProblem gemm_problem(const TensorView& x, const TensorView& w, const GemmConfig& cfg) {
  const TensorView y =
      TensorView::contiguous(nullptr, DType::kF32, {x.shape[0], w.shape[0]}, Device::kCUDA);
  return problem_of(gemm_params(x, w, nullptr, cfg, y), /*partial=*/false);
}

GemmProblem gemm_partial_problem(const TensorView& x_shard, const TensorView& w_shard,
                                 int64_t k_total, int tp_size, const GemmConfig& cfg) {
  const TensorView y = TensorView::contiguous(nullptr, DType::kF32,
                                              {x_shard.shape[0], w_shard.shape[0]}, Device::kCUDA);
  return problem_of(partial_params(x_shard, w_shard, k_total, tp_size, cfg, y), /*partial=*/true);
}

void gemm_bf16_nt_with_plan(const TensorView& x, const TensorView& w, const TensorView* bias,
                            const GemmConfig& cfg, const TensorView& y, const GemmPlan& plan,
                            void* stream) {
  run_gemm(x, w, bias, cfg, y, &plan, stream);
}

void gemm_bf16_nt_partial_with_plan(const TensorView& x_shard, const TensorView& w_shard,
                                    int64_t k_total, int tp_size, int tp_rank,
                                    const GemmConfig& cfg, const TensorView& y_partial,
                                    const GemmPlan& plan, void* stream) {
  run_partial(x_shard, w_shard, k_total, tp_size, tp_rank, cfg, y_partial, &plan, stream);
}

bool gemm_operands_tma_ok(const void* x, int64_t M, int64_t ldx, const void* w, int64_t N,
                          int64_t ldw, int64_t K) {
  return M >= 1 && N >= 1 && tma_compatible(x, M, ldx, w, N, ldw, K);
}

// The accumulate layouts' problem (one segment, b MN-major; a MN-major for tn, K-major for nn).
static GemmProblem accumulate_problem(const uint16_t* a, int64_t lda, const uint16_t* b,
                                      int64_t ldb, int64_t M, int64_t N, int64_t K, bool a_mn) {
  GemmParams c{};
  c.x = a;
  c.w = b;
  c.M = M;
  c.N = N;
  c.K = K;
  c.ldx = lda;
  c.ldw = ldb;
  c.seg_len = (K + 15) / 16 * 16;
  c.segments = 1;
  c.x_mn = a_mn ? 1 : 0;
  c.w_mn = 1;
  return problem_of(c, /*partial=*/false);
}

GemmProblem gemm_tn_problem(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                            int64_t M, int64_t N, int64_t K) {
  return accumulate_problem(a, lda, b, ldb, M, N, K, /*a_mn=*/true);
}

void gemm_bf16_tn_accumulate(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                             int64_t M, int64_t N, int64_t K, float* y, int64_t ldy,
                             const GemmPlan* plan, void* stream) {
  const char* op = "cuda::gemm_bf16_tn_accumulate";
  LS_CHECK(M >= 0 && N >= 0 && K >= 0 && lda >= M && ldb >= N && ldy >= N, op,
           "internal: bad sizes M = ", M, ", N = ", N, ", K = ", K);
  if (M == 0 || N == 0 || K == 0) return;  // no k-block: y unchanged
  const GemmProblem q = gemm_tn_problem(a, lda, b, ldb, M, N, K);
  LS_CHECK(q.tma_ok, op, "internal: operands not TMA-readable (lda = ", lda, ", ldb = ", ldb, ")");
  // Both operands MN-major: [K, M] and [K, N] in boxes of 64 columns x 64 k rows (zero past K).
  const CUtensorMap tx = tensor_map(a, K, M, lda, kSm90BK);
  const CUtensorMap tw = tensor_map(b, K, N, ldb, kSm90BK);
  launch_tn_accumulate<Sm90AccumulateEpilogue>(op, q, plan, tx, tw, {}, Sm90Params{}, y, ldy,
                                               static_cast<cudaStream_t>(stream));
}

void gemm_bf16_tn_accumulate_blocked(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                                     int64_t rows, const uint16_t* a_tail, int64_t lda_tail,
                                     const uint16_t* b_tail, int64_t ldb_tail, int64_t tail_rows,
                                     const int32_t* blocks, int64_t nblocks, int64_t M, int64_t N,
                                     float* y, int64_t ldy, const GemmPlan* plan, void* stream) {
  const char* op = "cuda::gemm_bf16_tn_accumulate_blocked";
  LS_CHECK(M >= 0 && N >= 0 && nblocks >= 0 && rows >= 1 && tail_rows >= 0 &&
               nblocks < (int64_t(1) << 26) && lda >= M && ldb >= N && ldy >= N,
           op, "internal: bad sizes M = ", M, ", N = ", N, ", blocks = ", nblocks);
  if (M == 0 || N == 0 || nblocks == 0) return;  // no k-block: y unchanged
  const GemmProblem q = gemm_tn_problem(a, lda, b, ldb, M, N, 16 * nblocks);
  const bool tails_ok = tail_rows == 0 || (tma_matrix_ok(a_tail, tail_rows, M, lda_tail) &&
                                           tma_matrix_ok(b_tail, tail_rows, N, ldb_tail));
  LS_CHECK(q.tma_ok && tma_matrix_ok(a, rows, M, lda) && tma_matrix_ok(b, rows, N, ldb) && tails_ok,
           op, "internal: operands not TMA-readable");
  // Boxes of 64 columns x 16 rows (one token block); the tail maps and the operands in 64-row
  // boxes (runs of four consecutive blocks) are a kernel parameter like the main maps
  // (mainloop_sm90.cuh Sm90BlockedMaps). No tails: the main maps stand in (never read).
  const CUtensorMap tx = tensor_map(a, rows, M, lda, 16);
  const CUtensorMap tw = tensor_map(b, rows, N, ldb, 16);
  Sm90BlockedMaps bmaps{tx, tw, tensor_map(a, rows, M, lda, kSm90BK),
                        tensor_map(b, rows, N, ldb, kSm90BK)};
  if (tail_rows > 0) {
    bmaps.tail_x = tensor_map(a_tail, tail_rows, M, lda_tail, 16);
    bmaps.tail_w = tensor_map(b_tail, tail_rows, N, ldb_tail, 16);
  }
  Sm90BlockedParams p{};
  p.blocks = blocks;
  launch_tn_accumulate<Sm90BlockedAccumulateEpilogue>(op, q, plan, tx, tw, bmaps, p, y, ldy,
                                                      static_cast<cudaStream_t>(stream));
}

GemmProblem gemm_nn_accumulate_problem(const uint16_t* a, int64_t lda, const uint16_t* b,
                                       int64_t ldb, int64_t M, int64_t N, int64_t K) {
  GemmProblem q = accumulate_problem(a, lda, b, ldb, M, N, K, /*a_mn=*/false);
  q.layout = GemmLayout::kTN;  // the tn layout's plans: one segment, the accumulate tiles
  return q;
}

void gemm_bf16_nn_accumulate(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb,
                             int64_t M, int64_t N, int64_t K, float* y, int64_t ldy,
                             const GemmPlan* plan, void* stream) {
  const char* op = "cuda::gemm_bf16_nn_accumulate";
  LS_CHECK(M >= 0 && N >= 0 && K >= 0 && lda >= K && ldb >= N && ldy >= N, op,
           "internal: bad sizes M = ", M, ", N = ", N, ", K = ", K);
  if (M == 0 || N == 0 || K == 0) return;  // no k-block: y unchanged
  const GemmProblem q = gemm_nn_accumulate_problem(a, lda, b, ldb, M, N, K);
  LS_CHECK(q.tma_ok, op, "internal: operands not TMA-readable (lda = ", lda, ", ldb = ", ldb, ")");
  LS_CHECK(!plan || gemm_plan_legal(q, *plan), op, "the plan '", plan ? plan->to_string() : "",
           "' cannot run the nn accumulate layout M = ", M, ", N = ", N, ", K = ", K);
  const GemmPlan pl = plan ? *plan : plan_gemm(q);
  // a K-major [M, K] in boxes of 64 k x the tile's rows; b MN-major [K, N] (zero past K).
  const CUtensorMap tx = tensor_map(a, M, K, lda, pl.ping_pong ? 64 : pl.tile.bm);
  const CUtensorMap tw = tensor_map(b, K, N, ldb, kSm90BK);
  launch_tn_accumulate<Sm90AccumulateEpilogue, false>(op, q, &pl, tx, tw, {}, Sm90Params{}, y, ldy,
                                                      static_cast<cudaStream_t>(stream));
}

GemmProblem gemm_nn_problem(const TensorView& x, const TensorView& w, const GemmConfig& cfg) {
  const TensorView y =
      TensorView::contiguous(nullptr, DType::kF32, {x.shape[0], w.shape[1]}, Device::kCUDA);
  return problem_of(gemm_params(x, w, nullptr, cfg, y, /*w_mn=*/true), /*partial=*/false);
}

GemmProblem gemm_nn_partial_problem(const TensorView& x_shard, const TensorView& w_shard,
                                    int64_t k_total, int tp_size, const GemmConfig& cfg) {
  const TensorView y = TensorView::contiguous(nullptr, DType::kF32,
                                              {x_shard.shape[0], w_shard.shape[1]}, Device::kCUDA);
  return problem_of(partial_params(x_shard, w_shard, k_total, tp_size, cfg, y, /*w_mn=*/true),
                    /*partial=*/true);
}

void gemm_bf16_nn(const TensorView& x, const TensorView& w, const GemmConfig& cfg,
                  const TensorView& y, const GemmPlan* plan, void* stream) {
  if (x.shape[0] == 0 || w.shape[1] == 0) return;
  run_checked(kOpNN, gemm_params(x, w, nullptr, cfg, y, /*w_mn=*/true), /*partial=*/false, plan,
              stream);
}

void gemm_bf16_nn_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                          int tp_size, const GemmConfig& cfg, const TensorView& y_partial,
                          const GemmPlan* plan, void* stream) {
  if (x_shard.shape[0] == 0 || w_shard.shape[1] == 0) return;
  run_checked(kOpNN,
              partial_params(x_shard, w_shard, k_total, tp_size, cfg, y_partial, /*w_mn=*/true),
              /*partial=*/true, plan, stream);
}

}  // namespace detail

void gemm_bf16_nt(const TensorView& x, const TensorView& w, const TensorView* bias,
                  const GemmConfig& cfg, const TensorView& y, void* stream) {
  run_gemm(x, w, bias, cfg, y, nullptr, stream);
}

void gemm_bf16_nt_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                          int tp_size, int tp_rank, const GemmConfig& cfg,
                          const TensorView& y_partial, void* stream) {
  run_partial(x_shard, w_shard, k_total, tp_size, tp_rank, cfg, y_partial, nullptr, stream);
}

void gemm_tree_combine(const std::vector<TensorView>& partials, const TensorView* bias,
                       const TensorView& y, void* stream) {
  const char* op = kOpCombine;
  const int t = int(partials.size());
  LS_CHECK(t >= 1 && t <= 8 && (t & (t - 1)) == 0, op,
           "the number of partials must be 1, 2, 4 or 8, got ", t);
  contract::check_gemm_combine(op, Device::kCUDA, partials, bias, y);
  const int64_t M = partials[0].size(0), N = partials[0].size(1);
  if (M == 0 || N == 0) return;

  detail::CombineParams q{};
  q.n = t;
  for (int i = 0; i < t; ++i) {
    q.part[i] = static_cast<const float*>(partials[size_t(i)].data);
    q.ld[i] = partials[size_t(i)].stride[0];
  }
  q.M = M;
  q.N = N;
  q.bias = bias ? bias->data : nullptr;
  q.bias_stride = bias ? bias->stride[0] : 0;
  q.bias_f32 = (bias && bias->dtype == DType::kF32) ? 1 : 0;
  q.y = y.data;
  q.ldy = y.stride[0];
  q.y_f32 = y.dtype == DType::kF32 ? 1 : 0;
  launch_combine(q, static_cast<cudaStream_t>(stream));
}

std::string gemm_launch_plan(int64_t M, int64_t N, int64_t K, const GemmConfig& cfg) {
  const GemmKLayout kl = gemm_k_layout(cfg, K);
  std::ostringstream os;
  os << "cuda::gemm_bf16_nt M=" << M << " N=" << N << " K=" << K << " segments=" << kl.segments
     << " (Kp=" << kl.padded << ", Ls=" << kl.segment_len << "): ";
  if (M == 0 || N == 0) {
    os << "nothing to launch";
    return os.str();
  }
  GemmProblem q{M, N, K, kl.segments, kl.segment_len, GemmLayout::kNT, /*tma_ok=*/K >= 1};
  os << plan_gemm(q).to_string();
  if (q.tma_ok) {
    q.tma_ok = false;
    os << "; operands with unaligned bases or row strides not a multiple of 8: "
       << plan_gemm(q).to_string();
  }
  return os.str();
}

}  // namespace lockstep::cuda
