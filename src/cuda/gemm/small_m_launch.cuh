// Host launchers of the small-M kernels (M <= 64), one template per main loop, and the entry type
// of a table of compiled tiles: launch_small_m.cu holds the tiles dispatch can choose,
// dev/gemm/small_m_sweep_tiles.cu the sweep-only ones. Arguments are checked by the caller; a
// launcher returns false (nothing launched) if its kernel cannot take the operands.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/gemm/mainloop_small_m_ring.cuh"
#include "cuda/gemm/mainloop_small_m_tma.cuh"
#include "cuda/gemm/mainloop_small_m_wgmma.cuh"
#include "cuda/gemm/plan.h"
#include "cuda/gemm/sm90_launch.cuh"  // allow_dynamic_smem
#include "cuda/tensor_map.h"
#include "lockstep/error.h"

namespace lockstep::cuda::detail {

inline constexpr const char* kSmallMOp = "cuda::gemm_bf16_nt (small M)";

using SmallMLaunchFn = bool (*)(const GemmParams&, cudaStream_t);

// A compiled small-M tile: its main loop, its parameters, its launcher.
struct SmallMKernel {
  GemmMainloop kind;
  GemmTile tile;
  SmallMLaunchFn fn;
};

// ---- cp.async ring (mainloop_small_m_ring.cuh): every layout.
template <int BM, int BN, int WM, int WN, int BK, int NS>
bool launch_small_m_ring(const GemmParams& p, cudaStream_t stream) {
  constexpr int kSmem = small_m::smem_bytes<BM, BN, BK, NS>();
  constexpr auto kernel = small_m::gemm_small_m_kernel<BM, BN, WM, WN, BK, NS>;
  allow_dynamic_smem<kernel>(kSmallMOp, kSmem);
  const dim3 grid(unsigned((p.N + BN - 1) / BN), unsigned((p.M + BM - 1) / BM));
  kernel<<<grid, 32 * WM * WN, kSmem, stream>>>(p);
  return true;
}

// ---- TMA operands (kinds ws, wgmma): tensor maps of x and w with 64-k boxes; false if the
// operands are not TMA-compatible or the driver refuses.
static_assert(small_m_ws::kBoxK == 64, "tensor maps are encoded with 64-k boxes");
inline bool small_m_tensor_maps(const GemmParams& p, int x_box_rows, int w_box_rows,
                                CUtensorMap* tx, CUtensorMap* tw) {
  return p.x_vec && p.w_vec && p.K >= 1 &&
         encode_bf16_tensor_map(tx, p.x, p.M, p.K, p.ldx, x_box_rows) == CUDA_SUCCESS &&
         encode_bf16_tensor_map(tw, p.w, p.N, p.K, p.ldw, w_box_rows) == CUDA_SUCCESS;
}

// The same problem for the TMA kernels (TmaGemmParams's fields in order: sizes, segments, bias, y).
inline TmaGemmParams small_m_tma_params(const GemmParams& p) {
  return {p.M, p.N, p.seg_len, p.segments, p.bias, p.bias_stride, p.bias_f32, p.y, p.ldy, p.y_f32};
}

// ---- Warp-specialized TMA ring (mainloop_small_m_tma.cuh): WM x WN consumer warps, each MB m8
// tiles (x) x NA n16 tiles (w); KB64 boxes of 64 k per stage; NS stages. CL > 1: clusters of CL
// CTAs along N share x through TMA multicast (grid.x rounded up to a multiple of CL; the extra
// CTAs read zero-filled w and store nothing; dev/gemm only). A launch error (e.g. a cluster shape
// the GPU cannot place) is cleared and reported as a decline.
template <int WM, int MB, int WN, int NA, int KB64, int NS, int CL = 1>
bool launch_small_m_tma(const GemmParams& p, cudaStream_t stream) {
  using Sh = small_m_ws::Shape<WM, MB, WN, NA, KB64, NS>;
  CUtensorMap tx, tw;
  if (!small_m_tensor_maps(p, Sh::BM / CL, Sh::BN, &tx, &tw)) return false;
  constexpr auto kernel = small_m_ws::gemm_small_m_ws_kernel<WM, MB, WN, NA, KB64, NS, CL>;
  allow_dynamic_smem<kernel>(kSmallMOp, Sh::kSmem);
  TmaGemmParams q = small_m_tma_params(p);
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

// ---- wgmma (mainloop_small_m_wgmma.cuh): BN rows of w (the wgmma N) x 64 rows of x, KB64 boxes
// of 64 k per stage, NS stages.
template <int BN, int KB64, int NS>
bool launch_small_m_wgmma(const GemmParams& p, cudaStream_t stream) {
  using Sh = small_m_wg::Shape<BN, KB64, NS>;
  CUtensorMap tx, tw;
  if (p.segments > 8 || !small_m_tensor_maps(p, Sh::BM, BN, &tx, &tw)) return false;
  constexpr auto kernel = small_m_wg::gemm_small_m_wg_kernel<BN, KB64, NS>;
  allow_dynamic_smem<kernel>(kSmallMOp, Sh::kSmem);
  TmaGemmParams q = small_m_tma_params(p);
  const dim3 grid(unsigned((p.N + BN - 1) / BN), unsigned((p.M + Sh::BM - 1) / Sh::BM));
  kernel<<<grid, Sh::kThreads, Sh::kSmem, stream>>>(tx, tw, q);
  return true;
}

}  // namespace lockstep::cuda::detail

// Table entries named by the kernels' parameters (the tile recorded is the one the kernel runs).
#define LS_SMALL_M_RING(BM, BN, WM, WN, BK, NS)                                \
  ::lockstep::cuda::detail::SmallMKernel {                                     \
    ::lockstep::cuda::GemmMainloop::kSmallMRing,                               \
        ::lockstep::cuda::GemmTile{BM, BN, BK, NS, WM, WN, 0, 0, 1},           \
        &::lockstep::cuda::detail::launch_small_m_ring<BM, BN, WM, WN, BK, NS> \
  }
#define LS_SMALL_M_TMA(WM, MB, WN, NA, KB64, NS, CL)                                              \
  ::lockstep::cuda::detail::SmallMKernel {                                                        \
    ::lockstep::cuda::GemmMainloop::kSmallMTma,                                                   \
        ::lockstep::cuda::GemmTile{WM * MB * 8, WN * NA * 16, 64 * KB64, NS, WM, WN, MB, NA, CL}, \
        &::lockstep::cuda::detail::launch_small_m_tma<WM, MB, WN, NA, KB64, NS, CL>               \
  }
#define LS_SMALL_M_WGMMA(BN, KB64, NS)                                    \
  ::lockstep::cuda::detail::SmallMKernel {                                \
    ::lockstep::cuda::GemmMainloop::kSmallMWgmma,                         \
        ::lockstep::cuda::GemmTile{64, BN, 64 * KB64, NS, 0, 0, 0, 0, 1}, \
        &::lockstep::cuda::detail::launch_small_m_wgmma<BN, KB64, NS>     \
  }
