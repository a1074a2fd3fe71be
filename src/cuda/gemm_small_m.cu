// Launcher of the small-M GEMM kernels (gemm_small_m.cuh: cp.async ring; gemm_small_m_ws.cuh:
// warp-specialized TMA ring), called by cuda::gemm_bf16_nt for M <= 64 with arguments already
// checked. Picks a tile from (M, N, K, S) only (the bits never depend on it: every tile computes
// each output with the same chain and tree), launches on the caller's stream, checks the launch.
#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>

#include "cuda/gemm_small_m.cuh"
#include "cuda/gemm_small_m_wg.cuh"
#include "cuda/gemm_small_m_ws.cuh"
#include "cuda/tensor_map.h"
#include "lockstep/error.h"

namespace lockstep::cuda::detail {
namespace {

constexpr const char* kOp = "cuda::gemm_bf16_nt (small M)";

std::atomic<int64_t> g_launches{0};

// Launches one variant; false (nothing launched) if it cannot take these operands.
using LaunchFn = bool (*)(const small_m::Params&, cudaStream_t);

template <int BM, int BN, int WM, int WN, int BK, int NS>
bool launch(const small_m::Params& p, cudaStream_t stream) {
  constexpr int kSmem = small_m::smem_bytes<BM, BN, BK, NS>();
  auto* kernel = small_m::gemm_small_m_kernel<BM, BN, WM, WN, BK, NS>;
  // Once per process and instantiation (the current device's; one-GPU processes for now).
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  LS_CHECK(attr == cudaSuccess, kOp, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  const dim3 grid(unsigned((p.N + BN - 1) / BN), unsigned((p.M + BM - 1) / BM));
  kernel<<<grid, 32 * WM * WN, kSmem, stream>>>(p);
  return true;
}

// ---- TMA descriptors (kinds 1, 2; tensor_map.h). False if the driver refuses (the variant then
// declines the case).
static_assert(small_m_ws::kBoxK == 64, "tensor maps are encoded with 64-k boxes");
bool make_tensor_map(CUtensorMap* map, const uint16_t* p, int64_t rows, int64_t K, int64_t ld,
                     int box_rows) {
  return encode_bf16_tensor_map(map, p, rows, K, ld, box_rows) == CUDA_SUCCESS;
}

// The kernel parameters of the TMA kinds (1, 2): the operands travel as tensor maps.
small_m_ws::Params tma_params(const small_m::Params& p) {
  small_m_ws::Params q{};
  q.M = p.M;
  q.N = p.N;
  q.seg_len = p.seg_len;
  q.segments = p.segments;
  q.bias = p.bias;
  q.bias_stride = p.bias_stride;
  q.bias_f32 = p.bias_f32;
  q.y = p.y;
  q.ldy = p.ldy;
  q.y_f32 = p.y_f32;
  return q;
}

// CL > 1: clusters of CL CTAs along N share x through TMA multicast (grid.x rounded up to a
// multiple of CL; the extra CTAs read zero-filled w and store nothing). A launch error (e.g. a
// cluster shape the GPU cannot place) is cleared and reported as a decline: the caller falls back.
template <int WM, int MB, int WN, int NA, int KB64, int NS, int CL = 1>
bool launch_ws(const small_m::Params& p, cudaStream_t stream) {
  using Sh = small_m_ws::Shape<WM, MB, WN, NA, KB64, NS>;
  // TMA: 16-byte aligned bases, row strides a multiple of 16 bytes; K >= 1 (tensor dims >= 1).
  if (!p.x_vec || !p.w_vec || p.K < 1) return false;
  CUtensorMap tx, tw;
  if (!make_tensor_map(&tx, p.x, p.M, p.K, p.ldx, Sh::BM / CL) ||
      !make_tensor_map(&tw, p.w, p.N, p.K, p.ldw, Sh::BN))
    return false;
  auto* kernel = small_m_ws::gemm_small_m_ws_kernel<WM, MB, WN, NA, KB64, NS, CL>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Sh::kSmem);
  LS_CHECK(attr == cudaSuccess, kOp, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  small_m_ws::Params q = tma_params(p);
  const int64_t tiles_n = (p.N + Sh::BN - 1) / Sh::BN;
  const dim3 grid(unsigned((tiles_n + CL - 1) / CL * CL), unsigned((p.M + Sh::BM - 1) / Sh::BM));
  cudaError_t e;
  if constexpr (CL == 1) {
    kernel<<<grid, Sh::kThreads, Sh::kSmem, stream>>>(tx, tw, q);
    e = cudaPeekAtLastError();
  } else {
    cudaLaunchConfig_t lc{};
    lc.gridDim = grid;
    lc.blockDim = dim3(Sh::kThreads);
    lc.dynamicSmemBytes = Sh::kSmem;
    lc.stream = stream;
    cudaLaunchAttribute la[1];
    la[0].id = cudaLaunchAttributeClusterDimension;
    la[0].val.clusterDim.x = CL;
    la[0].val.clusterDim.y = 1;
    la[0].val.clusterDim.z = 1;
    lc.attrs = la;
    lc.numAttrs = 1;
    void* args[] = {&tx, &tw, &q};
    e = cudaLaunchKernelExC(&lc, reinterpret_cast<const void*>(kernel), args);
    if (e == cudaSuccess) e = cudaPeekAtLastError();
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // a launch error is not sticky: clear it, decline
    return false;
  }
  return true;
}

// Kind 2: the wgmma tiles (gemm_small_m_wg.cuh), one CTA per BN rows of w and 64 rows of x.
template <int BN, int KB64, int NS>
bool launch_wg(const small_m::Params& p, cudaStream_t stream) {
  using Sh = small_m_wg::Shape<BN, KB64, NS>;
  if (!p.x_vec || !p.w_vec || p.K < 1 || p.segments > 8) return false;
  CUtensorMap tx, tw;
  if (!make_tensor_map(&tx, p.x, p.M, p.K, p.ldx, Sh::BM) ||
      !make_tensor_map(&tw, p.w, p.N, p.K, p.ldw, BN))
    return false;
  auto* kernel = small_m_wg::gemm_small_m_wg_kernel<BN, KB64, NS>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Sh::kSmem);
  LS_CHECK(attr == cudaSuccess, kOp, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
  small_m_ws::Params q = tma_params(p);
  const dim3 grid(unsigned((p.N + BN - 1) / BN), unsigned((p.M + Sh::BM - 1) / Sh::BM));
  kernel<<<grid, Sh::kThreads, Sh::kSmem, stream>>>(tx, tw, q);
  return true;
}

struct Variant {
  SmallMTile tile;
  LaunchFn fn;
};

#define LS_SMALL_M_VARIANT(BM, BN, WM, WN, BK, NS) \
  Variant { SmallMTile{BM, BN, WM, WN, BK, NS}, &launch<BM, BN, WM, WN, BK, NS> }
// Kind 1: WM x WN consumer warps, each MB m8 tiles (x) x NA n16 tiles (w); KB64 boxes of 64 k per
// stage; NS stages.
#define LS_SMALL_M_WS(WM, MB, WN, NA, KB64, NS)                              \
  Variant {                                                                  \
    SmallMTile{WM * MB * 8, WN * NA * 16, WM, WN, 64 * KB64, NS, 1, MB, NA}, \
        &launch_ws<WM, MB, WN, NA, KB64, NS>                                 \
  }
// Kind 2: BN rows of w (the wgmma N) x 64 rows of x, KB64 boxes of 64 k per stage, NS stages.
#define LS_SMALL_M_WG(BN, KB64, NS) \
  Variant { SmallMTile{64, BN, 1, 1, 64 * KB64, NS, 2}, &launch_wg<BN, KB64, NS> }
// ... in clusters of CL CTAs along N sharing x (TMA multicast).
#define LS_SMALL_M_WS_CL(WM, MB, WN, NA, KB64, NS, CL)                           \
  Variant {                                                                      \
    SmallMTile{WM * MB * 8, WN * NA * 16, WM, WN, 64 * KB64, NS, 1, MB, NA, CL}, \
        &launch_ws<WM, MB, WN, NA, KB64, NS, CL>                                 \
  }

// NOTE: the compiled tiles. Any of them gives the same bits for any M <= 64 (M > bm runs
// ceil(M/bm) CTA rows). Variants 0-19 are the default candidates: for each M class (bm) one tile
// per BN in {16, 32, 48, 96, 192} (small_m_default_variant picks BN from N and the SM count);
// the others are alternatives kept for the benchmark's sweep.
const Variant kVariants[] = {
    // M <= 8: A fragment rows 8..15 are zero (ldmatrix.x2 of x); one n8 chain per warp.
    LS_SMALL_M_VARIANT(8, 16, 1, 2, 256, 6),   // 0
    LS_SMALL_M_VARIANT(8, 32, 1, 4, 256, 6),   // 1
    LS_SMALL_M_VARIANT(8, 48, 1, 6, 256, 6),   // 2
    LS_SMALL_M_VARIANT(8, 96, 1, 12, 64, 6),   // 3
    LS_SMALL_M_VARIANT(8, 192, 1, 12, 64, 7),  // 4
    // M <= 16
    LS_SMALL_M_VARIANT(16, 16, 1, 2, 256, 6),   // 5
    LS_SMALL_M_VARIANT(16, 32, 1, 4, 256, 6),   // 6
    LS_SMALL_M_VARIANT(16, 48, 1, 6, 256, 5),   // 7
    LS_SMALL_M_VARIANT(16, 96, 1, 12, 64, 6),   // 8
    LS_SMALL_M_VARIANT(16, 192, 1, 12, 64, 7),  // 9
    // M <= 32
    LS_SMALL_M_VARIANT(32, 16, 2, 2, 128, 6),  // 10
    LS_SMALL_M_VARIANT(32, 32, 2, 4, 128, 7),  // 11
    LS_SMALL_M_VARIANT(32, 48, 2, 6, 128, 6),  // 12
    LS_SMALL_M_VARIANT(32, 96, 2, 6, 64, 6),   // 13
    LS_SMALL_M_VARIANT(32, 192, 2, 6, 64, 6),  // 14
    // M <= 64
    LS_SMALL_M_VARIANT(64, 16, 4, 1, 128, 6),  // 15
    LS_SMALL_M_VARIANT(64, 32, 2, 2, 128, 7),  // 16
    LS_SMALL_M_VARIANT(64, 48, 2, 3, 128, 6),  // 17
    LS_SMALL_M_VARIANT(64, 96, 2, 6, 64, 4),   // 18
    LS_SMALL_M_VARIANT(64, 192, 2, 6, 64, 5),  // 19
    // Alternatives (sweep only).
    LS_SMALL_M_VARIANT(64, 32, 4, 2, 128, 7),  // 20
    LS_SMALL_M_VARIANT(64, 64, 2, 4, 128, 5),  // 21
    LS_SMALL_M_VARIANT(64, 48, 4, 3, 128, 6),  // 22
    LS_SMALL_M_VARIANT(8, 32, 1, 2, 256, 6),   // 23
    LS_SMALL_M_VARIANT(8, 64, 1, 8, 128, 6),   // 24
    LS_SMALL_M_VARIANT(32, 64, 2, 4, 128, 4),  // 25
    LS_SMALL_M_VARIANT(8, 16, 1, 1, 256, 4),   // 26
    LS_SMALL_M_VARIANT(64, 32, 2, 1, 128, 7),  // 27
    // ---- Kind 1 (warp-specialized TMA ring, gemm_small_m_ws.cuh). Variants 28-51 are the
    // candidates: for each M class one tile per BN in {16, 32, 48, 64, 96, 192}
    // (small_m_candidate_variant picks BN); ~150-210 KB of ring per CTA (one CTA per SM).
    // M <= 8 (WM, MB) = (1, 1): x fragments from one m8 tile.
    LS_SMALL_M_WS(1, 1, 1, 1, 4, 12),  // 28: bn 16
    LS_SMALL_M_WS(1, 1, 2, 1, 4, 9),   // 29: bn 32
    LS_SMALL_M_WS(1, 1, 3, 1, 4, 7),   // 30: bn 48
    LS_SMALL_M_WS(1, 1, 4, 1, 2, 11),  // 31: bn 64
    LS_SMALL_M_WS(1, 1, 3, 2, 2, 7),   // 32: bn 96
    LS_SMALL_M_WS(1, 1, 4, 3, 1, 8),   // 33: bn 192
    // M <= 16: (1, 2)
    LS_SMALL_M_WS(1, 2, 1, 1, 4, 10),  // 34: bn 16
    LS_SMALL_M_WS(1, 2, 2, 1, 4, 8),   // 35: bn 32
    LS_SMALL_M_WS(1, 2, 3, 1, 4, 6),   // 36: bn 48
    LS_SMALL_M_WS(1, 2, 4, 1, 2, 10),  // 37: bn 64
    LS_SMALL_M_WS(1, 2, 3, 2, 2, 7),   // 38: bn 96
    LS_SMALL_M_WS(1, 2, 4, 3, 1, 8),   // 39: bn 192
    // M <= 32: (2, 2)
    LS_SMALL_M_WS(2, 2, 1, 1, 4, 8),   // 40: bn 16
    LS_SMALL_M_WS(2, 2, 2, 1, 2, 12),  // 41: bn 32
    LS_SMALL_M_WS(2, 2, 3, 1, 2, 10),  // 42: bn 48
    LS_SMALL_M_WS(2, 2, 2, 2, 2, 8),   // 43: bn 64
    LS_SMALL_M_WS(2, 2, 3, 2, 2, 6),   // 44: bn 96
    LS_SMALL_M_WS(2, 2, 4, 3, 1, 7),   // 45: bn 192
    // M <= 64: (2, 4)
    LS_SMALL_M_WS(2, 4, 1, 1, 2, 10),  // 46: bn 16
    LS_SMALL_M_WS(2, 4, 2, 1, 2, 8),   // 47: bn 32
    LS_SMALL_M_WS(2, 4, 3, 1, 2, 7),   // 48: bn 48
    LS_SMALL_M_WS(2, 4, 2, 2, 2, 6),   // 49: bn 64
    LS_SMALL_M_WS(2, 4, 3, 2, 1, 10),  // 50: bn 96
    LS_SMALL_M_WS(2, 4, 6, 2, 1, 6),   // 51: bn 192
    // Kind 1 alternatives (sweep only): one consumer warp with two chains, finer / coarser stages,
    // a 2-CTA-per-SM ring, more warps along M.
    LS_SMALL_M_WS(1, 1, 1, 2, 4, 9),   // 52: bn 32, 1 consumer warp
    LS_SMALL_M_WS(1, 1, 2, 1, 1, 32),  // 53: bn 32, 64-k stages
    LS_SMALL_M_WS(1, 1, 2, 1, 8, 4),   // 54: bn 32, 512-k stages
    LS_SMALL_M_WS(1, 2, 1, 2, 4, 8),   // 55: bn 32, M <= 16, 1 consumer warp
    LS_SMALL_M_WS(1, 1, 3, 2, 2, 4),   // 56: bn 96, ~105 KB (2 CTAs per SM)
    LS_SMALL_M_WS(1, 2, 4, 3, 2, 4),   // 57: bn 192, M <= 16, 128-k stages
    LS_SMALL_M_WS(4, 2, 2, 1, 2, 8),   // 58: bn 32, M <= 64, 8 consumer warps
    LS_SMALL_M_WS(1, 8, 2, 1, 2, 8),   // 59: bn 32, M <= 64, 2 consumer warps x 8 chains
    LS_SMALL_M_WS(4, 2, 2, 2, 2, 6),   // 60: bn 64, M <= 64, 8 consumer warps
    // Kind 1 in clusters of 2 CTAs along N sharing x (multicast): the x bytes each SM pulls
    // from L2 halve. Variants 61-72: the same tiles as 40-51 (sweep only: measured slower, see
    // kCandidateClusters).
    // M <= 32: (2, 2)
    LS_SMALL_M_WS_CL(2, 2, 1, 1, 4, 8, 2),   // 61: bn 16
    LS_SMALL_M_WS_CL(2, 2, 2, 1, 2, 12, 2),  // 62: bn 32
    LS_SMALL_M_WS_CL(2, 2, 3, 1, 2, 10, 2),  // 63: bn 48
    LS_SMALL_M_WS_CL(2, 2, 2, 2, 2, 8, 2),   // 64: bn 64
    LS_SMALL_M_WS_CL(2, 2, 3, 2, 2, 6, 2),   // 65: bn 96
    LS_SMALL_M_WS_CL(2, 2, 4, 3, 1, 7, 2),   // 66: bn 192
    // M <= 64: (2, 4)
    LS_SMALL_M_WS_CL(2, 4, 1, 1, 2, 10, 2),  // 67: bn 16
    LS_SMALL_M_WS_CL(2, 4, 2, 1, 2, 8, 2),   // 68: bn 32
    LS_SMALL_M_WS_CL(2, 4, 3, 1, 2, 7, 2),   // 69: bn 48
    LS_SMALL_M_WS_CL(2, 4, 2, 2, 2, 6, 2),   // 70: bn 64
    LS_SMALL_M_WS_CL(2, 4, 3, 2, 1, 10, 2),  // 71: bn 96
    LS_SMALL_M_WS_CL(2, 4, 6, 2, 1, 6, 2),   // 72: bn 192
    // Cluster alternatives (sweep only): M <= 16 in pairs, M <= 64 in fours.
    LS_SMALL_M_WS_CL(1, 2, 2, 1, 4, 8, 2),  // 73: bn 32, M <= 16
    LS_SMALL_M_WS_CL(2, 4, 2, 1, 2, 8, 4),  // 74: bn 32, M <= 64, 4 CTAs per cluster
    // M <= 64, bn 32 with 2 consumer warps x 8 chains (w fragments read once per warp row, x
    // once: 7 instead of 9 bytes of shared-memory traffic per byte of w), in pairs and alone.
    LS_SMALL_M_WS_CL(2, 4, 1, 2, 2, 8, 2),  // 75
    LS_SMALL_M_WS(2, 4, 1, 2, 2, 8),        // 76
    // Kind 2 (wgmma, gemm_small_m_wg.cuh). x is the 64-row A operand, BN rows of w the B operand,
    // both read from shared memory by the tensor cores: ~3 KiB of shared-memory reads per k-block
    // at BN = 32 instead of 6 KiB (kind 1, v47). 78-80 are the M > 32 candidates (kCandidateWgmma).
    LS_SMALL_M_WG(32, 2, 8),  // 77: N = 4096 at 132 SMs (128 CTAs)
    LS_SMALL_M_WG(32, 4, 4),  // 78: 256-k stages
    LS_SMALL_M_WG(48, 2, 7),  // 79: N = 6144 (qkv): 128 CTAs
    LS_SMALL_M_WG(64, 2, 6),  // 80
};
#undef LS_SMALL_M_VARIANT
#undef LS_SMALL_M_WS
#undef LS_SMALL_M_WS_CL
#undef LS_SMALL_M_WG

// NOTE: gemm_bf16_nt_small_m tries small_m_candidate_variant (the TMA tiles: kind 1, and kind 2
// where kCandidateWgmma says) first for M <= kSmallMCandidateUpToM (0: never, 16: decode batches
// up to 16, 64: always); operands TMA cannot read still take the default tile. On the H200
// (2026-11-29/30, docs/cuda-gemm.md) the kind 1 tiles ran 0.94-1.06x cuBLAS at M <= 16 and
// 0.78-0.99x at M = 32/64 (single-CTA tiles), vs 0.35-0.86x for the default tiles, with identical
// bits (every variant passes test_gemm_small_m's parity checks).
constexpr int64_t kSmallMCandidateUpToM = 64;
// Whether the candidates for M > 16 are the cluster tiles (61-72) or the single-CTA ones (40-51).
// NOTE: off since the sweep of 2026-11-30 (H200, bench_gemm_small_m --sweep, w from HBM): the
// single-CTA tiles were faster at M = 32/64 on o_proj (15.1 vs 17.8 us, 16.8 vs 19.1), down (35.2
// vs 39.4, 38.5 vs 42.2) and qkv (18.5 vs 19.6, 20.9 vs 22.2), within 1% on gate_up; clusters of 4
// and 8 CTAs (tried the same day) ran ~2x slower: 32 clusters of 4 do not fit in one wave.
constexpr bool kCandidateClusters = false;
// Whether the M > 32 candidates with BN 32 / 48 / 64 are the wgmma tiles (kind 2: v78, v79, v80)
// instead of kind 1's (v47, v48, v49), for every S the contract allows (1-8, like kind 1).
// NOTE: on since the sweep of 2026-11-30 01:49 UTC (H200, w from HBM, M = 64, 9f53156,
// bench_gemm_small_m --sweep): v78 vs v47 16.4 vs 16.5 us on o_proj (cuBLAS 14.0) and 34.9 vs 38.7
// on down (31.9); v79 vs v48 20.3 vs 20.9 on qkv (17.8). At M = 32 kind 2 (always 64 rows of x) was
// slower than kind 1's M <= 32 tiles (o_proj 19.0 vs 14.9 us), so it replaces the M <= 64 class
// only. Same bits (parity, every variant, 26,024 checks in that run).
constexpr bool kCandidateWgmma = true;

constexpr int kNumVariants = int(sizeof(kVariants) / sizeof(kVariants[0]));

// Multiprocessors of the current device (tile choice only).
int sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 0;
  return n;
}

small_m::Params make_params(const TensorView& x, const TensorView& w, const TensorView* bias,
                            const GemmConfig& cfg, const TensorView& y) {
  const GemmKLayout kl = gemm_k_layout(cfg, x.shape[1]);
  small_m::Params p{};
  p.x = static_cast<const uint16_t*>(x.data);
  p.w = static_cast<const uint16_t*>(w.data);
  p.bias = bias ? bias->data : nullptr;
  p.y = y.data;
  p.M = x.shape[0];
  p.N = w.shape[0];
  p.K = x.shape[1];
  p.ldx = x.stride[0];
  p.ldw = w.stride[0];
  p.ldy = y.stride[0];
  p.bias_stride = bias ? bias->stride[0] : 0;
  p.seg_len = kl.segment_len;
  p.segments = kl.segments;
  p.bias_f32 = (bias && bias->dtype == DType::kF32) ? 1 : 0;
  p.y_f32 = y.dtype == DType::kF32 ? 1 : 0;
  auto vec_ok = [](const TensorView& t) {
    return (reinterpret_cast<uintptr_t>(t.data) % 16 == 0) &&
           (t.shape[0] <= 1 || t.stride[0] % 8 == 0);
  };
  p.x_vec = vec_ok(x) ? 1 : 0;
  p.w_vec = vec_ok(w) ? 1 : 0;
  return p;
}

bool run_variant(const TensorView& x, const TensorView& w, const TensorView* bias,
                 const GemmConfig& cfg, const TensorView& y, cudaStream_t stream, int v) {
  const int64_t M = x.shape[0], N = w.shape[0];
  if (v < 0 || v >= kNumVariants || M > 64) return false;
  if (M == 0 || N == 0) return true;
  const SmallMTile& t = kVariants[v].tile;
  // The kernels count k in int (segment length, tile offsets, TMA coordinates), n tiles in grid.x
  // and w rows in int32 TMA coordinates.
  if (x.shape[1] >= (int64_t(1) << 30) || (N + t.bn - 1) / t.bn > int64_t(0x7fffffff) ||
      N >= (int64_t(1) << 31))
    return false;
  if (!kVariants[v].fn(make_params(x, w, bias, cfg, y), stream)) return false;
  const cudaError_t e = cudaGetLastError();
  LS_CHECK(e == cudaSuccess, kOp, "launch failed (", t.to_string(), "): ", cudaGetErrorString(e));
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

std::string SmallMTile::to_string() const {
  char buf[128];
  if (kind == 2) {
    std::snprintf(buf, sizeof buf, "small-m-wgmma bm=%d bn=%d warpgroups=1+1 bk=%d stages=%d", bm,
                  bn, bk, stages);
  } else if (kind == 1) {
    char cluster_text[24] = "";
    if (cluster > 1) std::snprintf(cluster_text, sizeof cluster_text, " cluster=%d", cluster);
    std::snprintf(buf, sizeof buf,
                  "small-m-ws bm=%d bn=%d warps=%dx%d+1 chains=%dx%d bk=%d stages=%d%s", bm, bn, wm,
                  wn, na, mb, bk, stages, cluster_text);
  } else {
    std::snprintf(buf, sizeof buf, "small-m bm=%d bn=%d warps=%dx%d bk=%d stages=%d", bm, bn, wm,
                  wn, bk, stages);
  }
  return buf;
}

int small_m_default_variant(int64_t M, int64_t N, int64_t K, int segments, int sm_count) {
  (void)K;
  (void)segments;
  // Candidates of the M class, largest BN first: {192, 96, 48, 32, 16}.
  // NOTE: for M > 32 the BN 32 / 48 tiles with 4 warps along M (variants 20, 22) measured faster
  // than 2 x 2 / 2 x 3 (16, 17) on the H200 (sweep of 2026-11-29: 93.7 vs 112.9 us on down,
  // 35.1 vs 41.8 on o_proj, 40.2 vs 41.1 on qkv at M = 64).
  static const int kByClass[4][5] = {
      {4, 3, 2, 1, 0}, {9, 8, 7, 6, 5}, {14, 13, 12, 11, 10}, {19, 18, 22, 20, 15}};
  const int cls = M <= 8 ? 0 : M <= 16 ? 1 : M <= 32 ? 2 : 3;
  // NOTE: w rows the busiest SM streams, ceil(CTAs / SMs) * BN, is what the time follows (the
  // GEMM is bound by reading w); the smallest wins, ties go to the larger BN (fewer CTAs, fewer
  // re-reads of x). Depends on N and the SM count only; the bits depend on neither.
  const int64_t sms = sm_count > 0 ? sm_count : 132;
  int best = kByClass[cls][0];
  int64_t best_cost = -1;
  for (int v : kByClass[cls]) {
    const int64_t bn = kVariants[v].tile.bn;
    const int64_t cost = ((N + bn - 1) / bn + sms - 1) / sms * bn;
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = v;
    }
  }
  return best;
}

int small_m_candidate_variant(int64_t M, int64_t N, int64_t K, int segments, int sm_count) {
  (void)K;
  (void)segments;
  // Kind 1 candidates of the M class, BN = 16, 32, 48, 64, 96, 192; for M > 16 the cluster
  // tiles (pairs of CTAs sharing x) when kCandidateClusters is on (off: measured slower); for
  // M > 32 the chosen BN's wgmma tile where there is one (kCandidateWgmma).
  static const int kByClass[4][6] = {{28, 29, 30, 31, 32, 33},
                                     {34, 35, 36, 37, 38, 39},
                                     {40, 41, 42, 43, 44, 45},
                                     {46, 47, 48, 49, 50, 51}};
  static const int kByClassCluster[2][6] = {{61, 62, 63, 64, 65, 66}, {67, 68, 69, 70, 71, 72}};
  const int cls = M <= 8 ? 0 : M <= 16 ? 1 : M <= 32 ? 2 : 3;
  const int* row = (kCandidateClusters && cls >= 2) ? kByClassCluster[cls - 2] : kByClass[cls];
  // NOTE: one CTA per SM (150-210 KB of ring each); the busiest SM streams waves · BN rows of w
  // (HBM) and waves · M rows of x (L2, shared by all CTAs, counted at half weight); the smallest
  // cost wins, ties go to the larger BN (fewer CTAs re-reading x). For the Qwen3-8B shapes on 132
  // SMs: N = 4096 -> BN 32, 6144 -> 48, 24576 -> 192 (128 CTAs each). Depends on M, N and the SM
  // count only; the bits depend on none of them.
  const int64_t sms = sm_count > 0 ? sm_count : 132;
  const int64_t mrows = M < 1 ? 1 : M;
  int best = 0;  // column of row
  int64_t best_cost = -1;
  for (int c = 0; c < 6; ++c) {
    const int v = row[c];
    const int64_t bn = kVariants[v].tile.bn, cl = kVariants[v].tile.cluster;
    const int64_t ctas = ((N + bn - 1) / bn + cl - 1) / cl * cl;
    const int64_t waves = (ctas + sms - 1) / sms;
    const int64_t cost = waves * (2 * bn + mrows);
    if (best_cost < 0 || cost <= best_cost) {
      best_cost = cost;
      best = c;
    }
  }
  // The wgmma tile of the same BN (kind 2: 64 rows of x), where there is one.
  static const int kWgmmaByColumn[6] = {-1, 78, 79, 80, -1, -1};
  if (kCandidateWgmma && cls == 3 && kWgmmaByColumn[best] >= 0) return kWgmmaByColumn[best];
  return row[best];
}

int small_m_dispatch_variant(int64_t M, int64_t N, int64_t K, int segments, int sm_count) {
  return M <= kSmallMCandidateUpToM ? small_m_candidate_variant(M, N, K, segments, sm_count)
                                    : small_m_default_variant(M, N, K, segments, sm_count);
}

int small_m_variant_count() { return kNumVariants; }

SmallMTile small_m_variant(int v) {
  return (v >= 0 && v < kNumVariants) ? kVariants[v].tile : SmallMTile{};
}

bool gemm_bf16_nt_small_m_variant(const TensorView& x, const TensorView& w, const TensorView* bias,
                                  const GemmConfig& cfg, const TensorView& y, cudaStream_t stream,
                                  int variant) {
  return run_variant(x, w, bias, cfg, y, stream, variant);
}

bool gemm_bf16_nt_small_m(const TensorView& x, const TensorView& w, const TensorView* bias,
                          const GemmConfig& cfg, const TensorView& y, cudaStream_t stream) {
  const int64_t M = x.shape[0], N = w.shape[0], K = x.shape[1];
  if (M > 64) return false;
  const int sms = sm_count();
  const int v = small_m_dispatch_variant(M, N, K, cfg.segments, sms);
  if (run_variant(x, w, bias, cfg, y, stream, v)) return true;
  // A kind 1 tile declines operands TMA cannot read: the default tile takes every layout.
  const int d = small_m_default_variant(M, N, K, cfg.segments, sms);
  return d != v && run_variant(x, w, bias, cfg, y, stream, d);
}

int64_t small_m_launch_count() { return g_launches.load(std::memory_order_relaxed); }

}  // namespace lockstep::cuda::detail
