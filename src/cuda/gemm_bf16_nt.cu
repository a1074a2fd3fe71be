// Launchers of the tensor-core GEMM: cuda::gemm_bf16_nt, gemm_bf16_nt_partial, gemm_tree_combine,
// gemm_launch_plan. Every argument is checked before a launch (lockstep::Error naming the op and
// the argument, as the cpu functions do); the kernel is chosen from sizes, strides and alignment
// only (never from the data or the device), and every kernel computes each output with the same
// chain (§G.3) and tree (§G.4), so the choice is a speed choice: the bits are the CPU's.
//   M <= 64 (gemm_bf16_nt only): the small-M kernel (gemm_small_m.cu) if it takes the case, else
//           the mma.sync kernel with 32x64 tiles;
//   operands TMA-compatible (16-byte aligned bases, row strides a multiple of 8 elements, K >= 1):
//           the Hopper kernel (gemm_sm90.cuh), tile 128x256, 128x128 or 64x128 by a cost model of
//           M, N and the segment count; several segments: the in-CTA register tree when its tiles
//           fill the machine, else per-segment fp32 workspace planes and the tree kernel;
//   otherwise: the mma.sync kernel (gemm_bf16_nt.cuh) with 128x128 tiles.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "cuda/gemm_bf16_nt.cuh"
#include "cuda/gemm_sm90.cuh"
#include "cuda/gemm_small_m.cuh"
#include "cuda/tensor_map.h"
#include "lockstep/cuda/gemm.h"
#include "lockstep/error.h"

namespace lockstep::cuda {

namespace detail {
namespace {
GemmPath g_force_path = GemmPath::kAuto;
GemmPath g_last_path = GemmPath::kAuto;
}  // namespace

void gemm_force_path_for_tests(GemmPath p) { g_force_path = p; }
GemmPath gemm_last_path_for_tests() { return g_last_path; }

const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kAuto:
      return "auto";
    case GemmPath::kSmallM:
      return "small-M kernel";
    case GemmPath::kMma32x64:
      return "mma.sync 32x64";
    case GemmPath::kMma128x128:
      return "mma.sync 128x128";
    case GemmPath::kWgmma128x256:
      return "wgmma+TMA 128x256";
    case GemmPath::kWgmma128x128:
      return "wgmma+TMA 128x128";
    case GemmPath::kWgmma64x128:
      return "wgmma+TMA 64x128";
    case GemmPath::kWgmma128x128Tree:
      return "wgmma+TMA 128x128 in-CTA tree";
    case GemmPath::kWgmma64x128Tree:
      return "wgmma+TMA 64x128 in-CTA tree";
    case GemmPath::kWgmma128x128Pairs:
      return "wgmma+TMA 128x128 tree per segment pair + tree kernel";
    case GemmPath::kWgmma64x256PingPong:
      return "wgmma+TMA 64x256 ping-pong";
  }
  return "?";
}
}  // namespace detail

namespace {

using detail::GemmPath;

constexpr const char* kOp = "cuda::gemm_bf16_nt";
constexpr const char* kOpPartial = "cuda::gemm_bf16_nt_partial";
constexpr const char* kOpCombine = "cuda::gemm_tree_combine";

// The cost model's multiprocessor count: a constant, so that the plan (which can be printed and
// audited) is a function of the sizes alone. The persistent grid itself uses the real count.
constexpr int64_t kPlanSMs = 132;
// Upper bound of the fp32 workspace of a multi-segment wgmma launch (rows are processed in chunks).
constexpr int64_t kWorkspaceBytes = int64_t(1) << 30;

// Byte range [lo, hi) touched by a view (empty views touch nothing).
struct Span {
  uintptr_t lo = 0, hi = 0;
};
Span span_of(const TensorView& t) {
  Span s;
  if (t.numel() == 0) return s;
  int64_t last = 0;
  for (int d = 0; d < t.ndim; ++d) last += (t.shape[d] - 1) * t.stride[d];
  s.lo = reinterpret_cast<uintptr_t>(t.data);
  s.hi = s.lo + uintptr_t((last + 1) * dtype_size(t.dtype));
  return s;
}
bool overlap(const Span& a, const Span& b) {
  return a.lo < a.hi && b.lo < b.hi && a.lo < b.hi && b.lo < a.hi;
}

void check_launch(const char* op) {
  const cudaError_t e = cudaGetLastError();
  LS_CHECK(e == cudaSuccess, op, "launch failed: ", cudaGetErrorString(e));
}

// ---- Tile choice (speed only).
struct Sm90Tile {
  GemmPath path;
  int bm, bn, stages;
  int levels;  // 0: one segment per job; > 0: segments looped in the CTA (S <= 2^levels)
};
constexpr Sm90Tile kSm90Tiles[] = {
    {GemmPath::kWgmma128x256, 128, 256, 4, 0},      {GemmPath::kWgmma128x128, 128, 128, 6, 0},
    {GemmPath::kWgmma64x128, 64, 128, 8, 0},        {GemmPath::kWgmma128x128Tree, 128, 128, 6, 1},
    {GemmPath::kWgmma64x128Tree, 64, 128, 8, 3},    {GemmPath::kWgmma128x128Pairs, 128, 128, 6, 1},
    {GemmPath::kWgmma64x256PingPong, 64, 256, 5, 0}};

const Sm90Tile& sm90_tile(GemmPath p) {
  for (const Sm90Tile& t : kSm90Tiles)
    if (t.path == p) return t;
  return kSm90Tiles[0];
}

bool is_wgmma(GemmPath p) {
  return p == GemmPath::kWgmma128x256 || p == GemmPath::kWgmma128x128 ||
         p == GemmPath::kWgmma64x128 || p == GemmPath::kWgmma128x128Tree ||
         p == GemmPath::kWgmma64x128Tree || p == GemmPath::kWgmma128x128Pairs ||
         p == GemmPath::kWgmma64x256PingPong;
}

// Estimated time ∝ waves x tile area x relative cost per output of the tile shape (bigger wgmma N
// reuses shared memory better); the cheapest wins, ties to the bigger tile. Several segments:
// the in-CTA tree (no workspace traffic) when its tiles alone fill the machine, else one job per
// segment and tile through the workspace (more parallelism for few rows). NOTE: the register
// stack limits the tree tiles: the consumers are compiled for 168 registers (65536 / 384 threads;
// setmaxnreg raises the budget at run time, not ptxas's allocation), so 128x128 (64 accumulators)
// holds one pending level (S = 2) and 64x128 (32) three (S <= 8); 128x128 with two levels spilled.
GemmPath choose_sm90(int64_t M, int64_t N, int nseg, int64_t seg_len) {
  if (nseg > 1) {
    const int64_t tiles128 = ((M + 127) / 128) * ((N + 127) / 128);
    const int64_t tiles64 = ((M + 63) / 64) * ((N + 127) / 128);
    if (nseg == 2 && tiles128 >= kPlanSMs) return GemmPath::kWgmma128x128Tree;
    // NOTE: S = 4 as two S = 2 register-tree launches (each pair of segments into an fp32 plane)
    // + the tree kernel pays only for long segments. H200, 2026-11-30 (bench_gemm_cuda, forced
    // paths): down (K = 12288, Ls = 3072) 785 vs 968 us (64x128 tree) at M = 4096, 200-219 vs 263
    // at M = 1024; with Ls = 1024 (K = 4096) it lost on qkv / o_proj (568 vs 533, 371 vs 344 us at
    // M = 4096) and gate_up at M = 1024 (562 vs 523), won gate_up at M = 4096 (2160 vs 2293). The
    // estimate before measuring (o_proj ~290 us) missed the epilogue: each 128x128 tile stores
    // 64 KiB of fp32 without overlapping the next tile's MMAs, twice as often per FLOP at K / 2.
    // S = 8 (four launches, four planes) lost on the K = 4096 shapes (o_proj 457 vs 366 us at
    // M = 4096) and won ~8% on down (904 vs 980 us; Ls = 1536): not chosen yet (next step).
    if (nseg == 4 && seg_len >= 2048 && tiles128 >= kPlanSMs) return GemmPath::kWgmma128x128Pairs;
    if (tiles64 >= kPlanSMs) return GemmPath::kWgmma64x128Tree;
  }
  constexpr double kRelCost[] = {1.0, 1.1, 1.35};
  GemmPath best = GemmPath::kWgmma128x256;
  double best_cost = 0;
  for (int i = 0; i < 3; ++i) {  // the workspace / one-segment tiles
    const Sm90Tile& t = kSm90Tiles[i];
    const int64_t jobs = ((M + t.bm - 1) / t.bm) * ((N + t.bn - 1) / t.bn) * nseg;
    const double cost = double((jobs + kPlanSMs - 1) / kPlanSMs) * t.bm * t.bn * kRelCost[i];
    if (i == 0 || cost < best_cost) {
      best = t.path;
      best_cost = cost;
    }
  }
  return best;
}

// The GEMM core shared by gemm_bf16_nt and gemm_bf16_nt_partial: y = tree over nseg segments of
// length seg_len of the chains over x[:, 0..K) · w[:, 0..K) (zero beyond K), + bias, rounded once.
struct Core {
  const uint16_t* x = nullptr;
  const uint16_t* w = nullptr;
  int64_t ldx = 0, ldw = 0;
  int64_t M = 0, N = 0, K = 0;
  int nseg = 1;
  int64_t seg_len = 0;
  const TensorView* bias = nullptr;
  void* y = nullptr;
  int64_t ldy = 0;
  bool y_f32 = false;
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// TMA needs 16-byte aligned bases and row strides (and a row stride that covers the row).
bool tma_compatible(const Core& c) {
  auto ok = [&](const void* p, int64_t rows, int64_t ld) {
    return aligned16(p) && (rows <= 1 || (ld % 8 == 0 && ld >= c.K && ld < (int64_t(1) << 38)));
  };
  return c.K >= 1 && c.K < (int64_t(1) << 31) && c.M < (int64_t(1) << 31) &&
         c.N < (int64_t(1) << 31) && ok(c.x, c.M, c.ldx) && ok(c.w, c.N, c.ldw);
}

// The path for these sizes: a pure function of (M, N, K, segments, TMA compatibility, small_m).
GemmPath plan_path(int64_t M, int64_t N, int nseg, int64_t seg_len, bool tma_ok,
                   bool small_m_candidate) {
  if (small_m_candidate && M <= 64) return GemmPath::kMma32x64;  // after the small-M kernel
  if (!tma_ok) return GemmPath::kMma128x128;
  return choose_sm90(M, N, nseg, seg_len);
}

template <int BM, int BN, int NS>
void launch_mma(const detail::GemmParams& p, cudaStream_t stream) {
  constexpr int kSmem = detail::gemm_smem_bytes<BM, BN, NS>();
  // Once per process and instantiation (the current device's; one-GPU processes for now).
  static const cudaError_t attr = cudaFuncSetAttribute(
      detail::gemm_bf16_nt_kernel<BM, BN, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  LS_CHECK(attr == cudaSuccess, kOp, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  LS_CHECK(p.M <= int64_t(65535) * BM, kOp, "x: M = ", p.M, " exceeds the grid limit");
  dim3 grid(unsigned((p.N + BN - 1) / BN), unsigned((p.M + BM - 1) / BM));
  detail::gemm_bf16_nt_kernel<BM, BN, NS><<<grid, detail::kGemmThreads, kSmem, stream>>>(p);
}

void run_mma(const Core& c, GemmPath path, cudaStream_t s) {
  detail::GemmParams p{};
  p.x = c.x;
  p.w = c.w;
  p.bias = c.bias ? c.bias->data : nullptr;
  p.y = c.y;
  p.M = c.M;
  p.N = c.N;
  p.K = c.K;
  p.ldx = c.ldx;
  p.ldw = c.ldw;
  p.ldy = c.ldy;
  p.bias_stride = c.bias ? c.bias->stride[0] : 0;
  p.seg_len = c.seg_len;
  p.segments = c.nseg;
  p.bias_f32 = (c.bias && c.bias->dtype == DType::kF32) ? 1 : 0;
  p.y_f32 = c.y_f32 ? 1 : 0;
  p.x_vec = (aligned16(c.x) && (c.M <= 1 || c.ldx % 8 == 0)) ? 1 : 0;
  p.w_vec = (aligned16(c.w) && (c.N <= 1 || c.ldw % 8 == 0)) ? 1 : 0;
  if (path == GemmPath::kMma32x64) {
    launch_mma<32, 64, 8>(p, s);
  } else {
    launch_mma<128, 128, 4>(p, s);
  }
  check_launch(kOp);
}

// ---- TMA descriptors (tensor_map.h; the box k is kSm90BK).
static_assert(detail::kSm90BK == 64, "tensor maps are encoded with 64-k boxes");
CUtensorMap make_tensor_map(const uint16_t* p, int64_t rows, int64_t K, int64_t ld, int box_rows) {
  LS_CHECK(detail::tensor_map_encoder() != nullptr, kOp,
           "cuTensorMapEncodeTiled is not available from the driver");
  CUtensorMap map;
  const CUresult r = detail::encode_bf16_tensor_map(&map, p, rows, K, ld, box_rows);
  LS_CHECK(r == CUDA_SUCCESS, kOp, "cuTensorMapEncodeTiled failed (", int(r), ") for [", rows, ", ",
           K, "] with row stride ", ld);
  return map;
}

int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
    n = int(kPlanSMs);
  return n;
}

template <int BM, int BN, int NS, int LEVELS, int EPI = 0, typename P = detail::Sm90Params,
          bool PP = false>
void launch_sm90_tile(const CUtensorMap& tx, const CUtensorMap& tw, const P& p, cudaStream_t s) {
  constexpr int WGN = (BM == 64 && !PP) ? 2 : 1;
  constexpr int kSmem = detail::sm90_smem_bytes<BM, BN, NS>();
  static const cudaError_t attr =
      cudaFuncSetAttribute(detail::gemm_sm90_kernel<BM, BN, WGN, NS, LEVELS, EPI, PP>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  LS_CHECK(attr == cudaSuccess, kOp, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  LS_CHECK(LEVELS == 0 || p.nseg <= (1 << LEVELS), kOp, "internal: ", p.nseg,
           " segments for an in-CTA tree of ", LEVELS, " levels");
  const int64_t jobs = ((p.M + BM - 1) / BM) * ((p.N + BN - 1) / BN) * (LEVELS > 0 ? 1 : p.nseg);
  // Persistent grid: one CTA per multiprocessor at most (which CTA runs a job changes no bit).
  const unsigned grid = unsigned(std::min<int64_t>(jobs, sm_count()));
  detail::gemm_sm90_kernel<BM, BN, WGN, NS, LEVELS, EPI, PP>
      <<<grid, detail::kSm90Threads, kSmem, s>>>(tx, tw, p);
  check_launch(kOp);
}

void launch_sm90(GemmPath path, const CUtensorMap& tx, const CUtensorMap& tw,
                 const detail::Sm90Params& p, cudaStream_t s) {
  switch (path) {
    case GemmPath::kWgmma128x128:
      launch_sm90_tile<128, 128, 6, 0>(tx, tw, p, s);
      break;
    case GemmPath::kWgmma64x128:
      launch_sm90_tile<64, 128, 8, 0>(tx, tw, p, s);
      break;
    case GemmPath::kWgmma128x128Tree:
    case GemmPath::kWgmma128x128Pairs:  // one pair of segments per launch
      launch_sm90_tile<128, 128, 6, 1>(tx, tw, p, s);
      break;
    case GemmPath::kWgmma64x128Tree:
      launch_sm90_tile<64, 128, 8, 3>(tx, tw, p, s);
      break;
    case GemmPath::kWgmma64x256PingPong:
      launch_sm90_tile<64, 256, 5, 0, 0, detail::Sm90Params, true>(tx, tw, p, s);
      break;
    default:
      launch_sm90_tile<128, 256, 4, 0>(tx, tw, p, s);
      break;
  }
}

void launch_combine(const detail::CombineParams& p, cudaStream_t s) {
  if (p.M == 0 || p.N == 0) return;
  dim3 grid(unsigned((p.N + detail::kCombineThreads - 1) / detail::kCombineThreads),
            unsigned(std::min<int64_t>(p.M, 65535)));
  detail::gemm_tree_combine_kernel<<<grid, detail::kCombineThreads, 0, s>>>(p);
  check_launch(kOp);
}

// Row stride of the fp32 workspace planes: N rounded up to 4 (every plane starts 16-byte aligned,
// and the stride is even: the pair stores of the kernels' epilogue never cross a row).
int64_t ws_ld(const Core& c) { return (c.N + 3) / 4 * 4; }

// Runs fn(ws, m, rows) over chunks of `rows` rows of y (multiples of bm, the last one shorter)
// with an fp32 workspace of planes planes of [rows, ws_ld], at most kWorkspaceBytes (at least one
// bm-row chunk); fn launches the chunk's GEMM jobs and then the tree kernel, whose parameters
// combine_params fills.
template <typename Fn>
void in_workspace_chunks(const Core& c, int bm, int planes, cudaStream_t s, Fn&& fn) {
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
detail::CombineParams combine_params(const Core& c, float* ws, int n, int64_t m, int64_t rows) {
  const int64_t ld_ws = ws_ld(c);
  detail::CombineParams q{};
  q.n = n;
  for (int i = 0; i < n; ++i) {
    q.part[i] = ws + i * rows * ld_ws;
    q.ld[i] = ld_ws;
  }
  q.M = rows;
  q.N = c.N;
  q.bias = c.bias ? c.bias->data : nullptr;
  q.bias_stride = c.bias ? c.bias->stride[0] : 0;
  q.bias_f32 = (c.bias && c.bias->dtype == DType::kF32) ? 1 : 0;
  q.y = static_cast<char*>(c.y) + size_t(m * c.ldy) * (c.y_f32 ? 4 : 2);
  q.ldy = c.ldy;
  q.y_f32 = c.y_f32 ? 1 : 0;
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
void run_sm90_pairs(const Core& c, cudaStream_t s) {
  const Sm90Tile& t = sm90_tile(GemmPath::kWgmma128x128Pairs);
  const int npairs = c.nseg / 2;
  LS_CHECK((c.nseg == 4 || c.nseg == 8) && c.seg_len % 16 == 0, kOp, "internal: ", c.nseg,
           " segments of ", c.seg_len, " for the segment-pair path");
  const int64_t ld_ws = ws_ld(c);
  // Each pair's w view and its tensor map (the same for every row chunk); kq <= 0: no real k.
  int64_t kq[4];
  CUtensorMap tw[4];
  for (int i = 0; i < npairs; ++i) {
    const int64_t k0 = 2 * int64_t(i) * c.seg_len;
    kq[i] = std::min(c.K - k0, 2 * c.seg_len);
    if (kq[i] > 0) tw[i] = make_tensor_map(c.w + k0, c.N, kq[i], c.ldw, t.bn);
  }
  in_workspace_chunks(c, t.bm, npairs, s, [&](float* ws, int64_t m, int64_t rows) {
    for (int i = 0; i < npairs; ++i) {
      float* plane = ws + i * rows * ld_ws;
      if (kq[i] <= 0) {
        const cudaError_t z = cudaMemsetAsync(plane, 0, size_t(rows * ld_ws) * 4, s);
        LS_CHECK(z == cudaSuccess, kOp, "cudaMemsetAsync failed: ", cudaGetErrorString(z));
        continue;
      }
      detail::Sm90Params p{};
      p.M = rows;
      p.N = c.N;
      p.seg_len = c.seg_len;
      p.nseg = 2;
      p.ws_mode = 0;
      p.bias = nullptr;
      p.y = plane;
      p.ldy = ld_ws;
      p.y_f32 = 1;
      p.y_pair = 1;  // planes are 16-byte aligned, ld_ws is even
      const int64_t k0 = 2 * int64_t(i) * c.seg_len;
      const CUtensorMap tx = make_tensor_map(c.x + m * c.ldx + k0, rows, kq[i], c.ldx, t.bm);
      launch_sm90(GemmPath::kWgmma128x128Pairs, tx, tw[i], p, s);
    }
    launch_combine(combine_params(c, ws, npairs, m, rows), s);
  });
}

void run_sm90(const Core& c, GemmPath path, cudaStream_t s) {
  if (path == GemmPath::kWgmma128x128Pairs) {
    run_sm90_pairs(c, s);
    return;
  }
  const Sm90Tile& t = sm90_tile(path);
  const CUtensorMap tw = make_tensor_map(c.w, c.N, c.K, c.ldw, t.bn);
  detail::Sm90Params p{};
  p.N = c.N;
  p.seg_len = c.seg_len;
  p.nseg = c.nseg;
  if (c.nseg == 1 || t.levels > 0) {
    p.M = c.M;
    p.ws_mode = 0;
    p.bias = c.bias ? c.bias->data : nullptr;
    p.bias_stride = c.bias ? c.bias->stride[0] : 0;
    p.bias_f32 = (c.bias && c.bias->dtype == DType::kF32) ? 1 : 0;
    p.y = c.y;
    p.ldy = c.ldy;
    p.y_f32 = c.y_f32 ? 1 : 0;
    const uintptr_t pair_bytes = c.y_f32 ? 8 : 4;
    p.y_pair = (reinterpret_cast<uintptr_t>(c.y) % pair_bytes == 0 && (c.M <= 1 || c.ldy % 2 == 0))
                   ? 1
                   : 0;
    const CUtensorMap tx = make_tensor_map(c.x, c.M, c.K, c.ldx, t.bm);
    launch_sm90(path, tx, tw, p, s);
    return;
  }
  // Several segments: per-segment fp32 planes, then the tree (+ bias, one rounding) per row chunk.
  in_workspace_chunks(c, t.bm, c.nseg, s, [&](float* ws, int64_t m, int64_t rows) {
    p.M = rows;
    p.ws_mode = 1;
    p.ws = ws;
    p.ld_ws = ws_ld(c);
    p.ws_plane = rows * p.ld_ws;
    const CUtensorMap tx = make_tensor_map(c.x + m * c.ldx, rows, c.K, c.ldx, t.bm);
    launch_sm90(path, tx, tw, p, s);
    launch_combine(combine_params(c, ws, c.nseg, m, rows), s);
  });
}

// Runs the core on the path the sizes choose (or the test hook forces; a forced wgmma path that
// the operands cannot take runs the 128x128 mma.sync kernel, as the automatic choice would).
void run_core(const Core& c, bool small_m_candidate, cudaStream_t s) {
  const bool tma_ok = tma_compatible(c);
  GemmPath path = plan_path(c.M, c.N, c.nseg, c.seg_len, tma_ok, small_m_candidate);
  const GemmPath forced = detail::g_force_path;
  if (forced != GemmPath::kAuto && forced != GemmPath::kSmallM) {
    path = forced;
    if (is_wgmma(path) && !tma_ok) path = GemmPath::kMma128x128;
    // The 128x128 register tree holds S <= 2; more segments take the 64x128 one. The pair path
    // is for S = 4 / 8; fewer segments take the 128x128 tree.
    if (path == GemmPath::kWgmma128x128Tree && c.nseg > 2) path = GemmPath::kWgmma64x128Tree;
    if (path == GemmPath::kWgmma128x128Pairs && c.nseg <= 2) path = GemmPath::kWgmma128x128Tree;
  }
  detail::g_last_path = path;
  switch (path) {
    case GemmPath::kMma32x64:
    case GemmPath::kMma128x128:
      run_mma(c, path, s);
      break;
    default:
      run_sm90(c, path, s);
      break;
  }
}

}  // namespace

namespace detail {

bool gemm_logprob_fused_ok(const void* x, int64_t M, int64_t ldx, const void* w, int64_t N,
                           int64_t ldw, int64_t K) {
  Core c;
  c.x = static_cast<const uint16_t*>(x);
  c.w = static_cast<const uint16_t*>(w);
  c.ldx = ldx;
  c.ldw = ldw;
  c.M = M;
  c.N = N;
  c.K = K;
  return M >= 1 && N >= 1 && tma_compatible(c);
}

// The 128x256 Hopper kernel (the plain GEMM's main loop, one segment) with the log-prob epilogue.
void gemm_bf16_nt_logprob_fused(const uint16_t* x, int64_t M, int64_t ldx, const uint16_t* w,
                                int64_t N, int64_t ldw, int64_t K, int64_t seg_len,
                                const GemmLogprobEpilogue& e, cudaStream_t stream) {
  constexpr const char* op = "cuda::linear_logprob (fused GEMM)";
  LS_CHECK(gemm_logprob_fused_ok(x, M, ldx, w, N, ldw, K), op,
           "internal: operands not TMA-compatible");
  LS_CHECK(seg_len >= K && seg_len % 16 == 0 && seg_len - K < 16, op,
           "internal: seg_len = ", seg_len, " is not K = ", K, " rounded up to 16");
  const Sm90Tile& t = sm90_tile(GemmPath::kWgmma128x256);
  static_assert(kLogprobFusedTile == 256, "the fused tile is the 128x256 one");
  Sm90LpParams p{};
  p.M = M;
  p.N = N;
  p.seg_len = seg_len;
  p.nseg = 1;
  p.ws_mode = 0;
  p.lp = e;
  const CUtensorMap tx = make_tensor_map(x, M, K, ldx, t.bm);
  const CUtensorMap tw = make_tensor_map(w, N, K, ldw, t.bn);
  launch_sm90_tile<128, 256, 4, 0, 1, Sm90LpParams>(tx, tw, p, stream);
}

}  // namespace detail

void gemm_bf16_nt(const TensorView& x, const TensorView& w, const TensorView* bias,
                  const GemmConfig& cfg, const TensorView& y, void* stream) {
  cfg.validate();
  check_tensor(kOp, "x", x, DType::kBF16, {-1, -1}, Device::kCUDA);
  check_inner_contiguous(kOp, "x", x);
  const int64_t M = x.shape[0], K = x.shape[1];
  check_tensor(kOp, "w", w, DType::kBF16, {-1, K}, Device::kCUDA);
  check_inner_contiguous(kOp, "w", w);
  const int64_t N = w.shape[0];
  if (bias)
    check_tensor_dtypes(kOp, "bias", *bias, {DType::kBF16, DType::kF32}, {N}, Device::kCUDA);
  check_tensor_dtypes(kOp, "y", y, {DType::kBF16, DType::kF32}, {M, N}, Device::kCUDA);
  check_inner_contiguous(kOp, "y", y);
  const Span sy = span_of(y);
  LS_CHECK(!overlap(sy, span_of(x)), kOp, "y must not overlap x");
  LS_CHECK(!overlap(sy, span_of(w)), kOp, "y must not overlap w");
  if (bias) LS_CHECK(!overlap(sy, span_of(*bias)), kOp, "y must not overlap bias");
  if (M == 0 || N == 0) return;

  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const GemmPath forced = detail::g_force_path;
  if (M <= 64 && (forced == GemmPath::kAuto || forced == GemmPath::kSmallM)) {
    if (detail::gemm_bf16_nt_small_m(x, w, bias, cfg, y, s)) {
      detail::g_last_path = GemmPath::kSmallM;
      check_launch(kOp);
      return;
    }
  }
  const GemmKLayout kl = gemm_k_layout(cfg, K);
  Core c;
  c.x = static_cast<const uint16_t*>(x.data);
  c.w = static_cast<const uint16_t*>(w.data);
  c.ldx = x.stride[0];
  c.ldw = w.stride[0];
  c.M = M;
  c.N = N;
  c.K = K;
  c.nseg = kl.segments;
  c.seg_len = kl.segment_len;
  c.bias = bias;
  c.y = y.data;
  c.ldy = y.stride[0];
  c.y_f32 = y.dtype == DType::kF32;
  run_core(c, /*small_m_candidate=*/true, s);
}

void gemm_bf16_nt_partial(const TensorView& x_shard, const TensorView& w_shard, int64_t k_total,
                          int tp_size, int tp_rank, const GemmConfig& cfg,
                          const TensorView& y_partial, void* stream) {
  const char* op = kOpPartial;
  LS_CHECK(cfg.segments == 1 || cfg.segments == 2 || cfg.segments == 4 || cfg.segments == 8, op,
           "cfg.segments must be 1, 2, 4 or 8, got ", cfg.segments);
  LS_CHECK(k_total >= 0, op, "k_total must be >= 0, got ", k_total);
  LS_CHECK(tp_size >= 1 && (tp_size & (tp_size - 1)) == 0 && tp_size <= cfg.segments, op,
           "tp_size must be a power of two <= segments (", cfg.segments, "), got ", tp_size);
  LS_CHECK(tp_rank >= 0 && tp_rank < tp_size, op, "tp_rank must be in [0, ", tp_size, "), got ",
           tp_rank);
  check_tensor(op, "x_shard", x_shard, DType::kBF16, {-1, -1}, Device::kCUDA);
  check_tensor(op, "w_shard", w_shard, DType::kBF16, {-1, -1}, Device::kCUDA);
  check_inner_contiguous(op, "x_shard", x_shard);
  check_inner_contiguous(op, "w_shard", w_shard);
  LS_CHECK(x_shard.size(1) == w_shard.size(1), op,
           "x_shard and w_shard must have the same K: x_shard is ", x_shard.shape_string(),
           ", w_shard is ", w_shard.shape_string());
  const GemmKRange r = gemm_tp_k_range(cfg, k_total, tp_size, tp_rank);
  LS_CHECK(x_shard.size(1) == r.end - r.begin, op, "rank ", tp_rank, " of ", tp_size,
           " owns K columns [", r.begin, ", ", r.end, ") of ", k_total, " (", r.end - r.begin,
           " columns), but x_shard is ", x_shard.shape_string());
  const int64_t M = x_shard.size(0), N = w_shard.size(0);
  check_tensor(op, "y_partial", y_partial, DType::kF32, {M, N}, Device::kCUDA);
  check_inner_contiguous(op, "y_partial", y_partial);
  const Span sy = span_of(y_partial);
  LS_CHECK(!overlap(sy, span_of(x_shard)) && !overlap(sy, span_of(w_shard)), op,
           "argument 'y_partial' must not overlap x_shard or w_shard");
  if (M == 0 || N == 0) return;

  const GemmKLayout kl = gemm_k_layout(cfg, k_total);
  Core c;
  c.x = static_cast<const uint16_t*>(x_shard.data);
  c.w = static_cast<const uint16_t*>(w_shard.data);
  c.ldx = x_shard.stride[0];
  c.ldw = w_shard.stride[0];
  c.M = M;
  c.N = N;
  c.K = x_shard.size(1);
  c.nseg = cfg.segments / tp_size;
  c.seg_len = kl.segment_len;
  c.y = y_partial.data;
  c.ldy = y_partial.stride[0];
  c.y_f32 = true;
  run_core(c, /*small_m_candidate=*/false, static_cast<cudaStream_t>(stream));
}

void gemm_tree_combine(const std::vector<TensorView>& partials, const TensorView* bias,
                       const TensorView& y, void* stream) {
  const char* op = kOpCombine;
  const int t = int(partials.size());
  LS_CHECK(t >= 1 && t <= 8 && (t & (t - 1)) == 0, op,
           "the number of partials must be 1, 2, 4 or 8, got ", t);
  check_tensor(op, "partials[0]", partials[0], DType::kF32, {-1, -1}, Device::kCUDA);
  const int64_t M = partials[0].size(0), N = partials[0].size(1);
  for (int i = 0; i < t; ++i) {
    const std::string name = "partials[" + std::to_string(i) + "]";
    check_tensor(op, name.c_str(), partials[size_t(i)], DType::kF32, {M, N}, Device::kCUDA);
    check_inner_contiguous(op, name.c_str(), partials[size_t(i)]);
  }
  if (bias) check_tensor_dtypes(op, "bias", *bias, {DType::kBF16, DType::kF32}, {N}, Device::kCUDA);
  check_tensor_dtypes(op, "y", y, {DType::kBF16, DType::kF32}, {M, N}, Device::kCUDA);
  check_inner_contiguous(op, "y", y);
  const Span sy = span_of(y);
  for (int i = 0; i < t; ++i) {
    const TensorView& pi = partials[size_t(i)];
    const bool same =
        pi.data == y.data && y.dtype == DType::kF32 && (M <= 1 || pi.stride[0] == y.stride[0]);
    LS_CHECK(same || !overlap(sy, span_of(pi)), op, "argument 'y' overlaps partials[", i,
             "] (only an exact alias of an f32 partial is allowed)");
  }
  LS_CHECK(!(bias && overlap(sy, span_of(*bias))), op, "argument 'y' must not overlap bias");
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
  if (M <= 64) {
    // sm_count 0 = 132 (the H200); the real launch uses the device's SM count.
    os << "small-M "
       << detail::small_m_variant(detail::small_m_dispatch_variant(M, N, K, kl.segments, 0))
              .to_string()
       << " (on 132 SMs) if it takes the case, else ";
  }
  const GemmPath path = plan_path(M, N, kl.segments, kl.segment_len, K >= 1, true);
  if (path == GemmPath::kMma32x64) {
    os << "mma.sync m16n8k16 32x64 tiles, 8 cp.async stages, grid " << (N + 63) / 64 << "x"
       << (M + 31) / 32;
  } else if (path == GemmPath::kMma128x128) {
    os << "mma.sync m16n8k16 128x128 tiles, 4 cp.async stages (K = 0)";
  } else {
    const Sm90Tile& t = sm90_tile(path);
    const int64_t tiles = ((M + t.bm - 1) / t.bm) * ((N + t.bn - 1) / t.bn);
    const bool split_n = t.bm == 64 && path != GemmPath::kWgmma64x256PingPong;
    os << "wgmma m64n" << (split_n ? t.bn / 2 : t.bn) << "k16 (SS, 128B swizzle) + TMA, tile "
       << t.bm << "x" << t.bn << "x" << detail::kSm90BK << ", " << t.stages
       << " stages, 1 producer + 2 consumer warpgroups, persistent over ";
    if (path == GemmPath::kWgmma128x128Pairs) {
      os << tiles << " tiles per launch, one launch per pair of segments (" << kl.segments / 2
         << ", register tree over the pair), fp32 plane per pair + tree kernel";
    } else if (t.levels > 0 || kl.segments == 1) {
      os << tiles << " tiles";
      if (kl.segments > 1)
        os << ", " << kl.segments << " segments per tile in the CTA + register tree";
    } else {
      os << tiles * kl.segments << " jobs (" << tiles << " tiles x " << kl.segments
         << " segments), fp32 per-segment workspace + tree kernel";
    }
    os << "; operands with unaligned bases or row strides not a multiple of 8: mma.sync 128x128";
  }
  return os.str();
}

}  // namespace lockstep::cuda
