// The small-M tiles dispatch can choose (plan.cc's tables, M <= 64) and their launch: the
// 20 cp.async-ring tiles (any operand layout), 21 warp-specialized TMA-ring tiles and 3 wgmma
// tiles. Sweep-only tiles and clusters live in dev/gemm/. Every tile computes each output with
// the same chain and tree: the choice is speed only.
#include <cuda_runtime.h>

#include <iterator>

#include "cuda/gemm/internal.h"
#include "cuda/gemm/small_m_launch.cuh"

namespace lockstep::cuda::detail {
namespace {

const SmallMKernel kKernels[] = {
    // cp.async ring, M <= 8: A fragment rows 8..15 are zero (ldmatrix.x2 of x)
    LS_SMALL_M_RING(8, 16, 1, 2, 256, 6),
    LS_SMALL_M_RING(8, 32, 1, 4, 256, 6),
    LS_SMALL_M_RING(8, 48, 1, 6, 256, 6),
    LS_SMALL_M_RING(8, 96, 1, 12, 64, 6),
    LS_SMALL_M_RING(8, 192, 1, 12, 64, 7),
    // M <= 16
    LS_SMALL_M_RING(16, 16, 1, 2, 256, 6),
    LS_SMALL_M_RING(16, 32, 1, 4, 256, 6),
    LS_SMALL_M_RING(16, 48, 1, 6, 256, 5),
    LS_SMALL_M_RING(16, 96, 1, 12, 64, 6),
    LS_SMALL_M_RING(16, 192, 1, 12, 64, 7),
    // M <= 32
    LS_SMALL_M_RING(32, 16, 2, 2, 128, 6),
    LS_SMALL_M_RING(32, 32, 2, 4, 128, 7),
    LS_SMALL_M_RING(32, 48, 2, 6, 128, 6),
    LS_SMALL_M_RING(32, 96, 2, 6, 64, 6),
    LS_SMALL_M_RING(32, 192, 2, 6, 64, 6),
    // M <= 64
    LS_SMALL_M_RING(64, 16, 4, 1, 128, 6),
    LS_SMALL_M_RING(64, 32, 4, 2, 128, 7),
    LS_SMALL_M_RING(64, 48, 4, 3, 128, 6),
    LS_SMALL_M_RING(64, 96, 2, 6, 64, 4),
    LS_SMALL_M_RING(64, 192, 2, 6, 64, 5),
    // Warp-specialized TMA ring (WM, MB, WN, NA, KB64, NS): ~150-210 KB of ring, one CTA per SM.
    // M <= 8
    LS_SMALL_M_TMA(1, 1, 1, 1, 4, 12, 1),
    LS_SMALL_M_TMA(1, 1, 2, 1, 4, 9, 1),
    LS_SMALL_M_TMA(1, 1, 3, 1, 4, 7, 1),
    LS_SMALL_M_TMA(1, 1, 4, 1, 2, 11, 1),
    LS_SMALL_M_TMA(1, 1, 3, 2, 2, 7, 1),
    LS_SMALL_M_TMA(1, 1, 4, 3, 1, 8, 1),
    // M <= 16
    LS_SMALL_M_TMA(1, 2, 1, 1, 4, 10, 1),
    LS_SMALL_M_TMA(1, 2, 2, 1, 4, 8, 1),
    LS_SMALL_M_TMA(1, 2, 3, 1, 4, 6, 1),
    LS_SMALL_M_TMA(1, 2, 4, 1, 2, 10, 1),
    LS_SMALL_M_TMA(1, 2, 3, 2, 2, 7, 1),
    LS_SMALL_M_TMA(1, 2, 4, 3, 1, 8, 1),
    // M <= 32
    LS_SMALL_M_TMA(2, 2, 1, 1, 4, 8, 1),
    LS_SMALL_M_TMA(2, 2, 2, 1, 2, 12, 1),
    LS_SMALL_M_TMA(2, 2, 3, 1, 2, 10, 1),
    LS_SMALL_M_TMA(2, 2, 2, 2, 2, 8, 1),
    LS_SMALL_M_TMA(2, 2, 3, 2, 2, 6, 1),
    LS_SMALL_M_TMA(2, 2, 4, 3, 1, 7, 1),
    // M <= 64 (BN 32 / 48 / 64: the wgmma tiles below)
    LS_SMALL_M_TMA(2, 4, 1, 1, 2, 10, 1),
    LS_SMALL_M_TMA(2, 4, 3, 2, 1, 10, 1),
    LS_SMALL_M_TMA(2, 4, 6, 2, 1, 6, 1),
    // wgmma (BN, KB64, NS), M <= 64
    LS_SMALL_M_WGMMA(32, 4, 4),
    LS_SMALL_M_WGMMA(48, 2, 7),
    LS_SMALL_M_WGMMA(64, 2, 6),
};

const SmallMKernel* find_kernel(GemmMainloop kind, const GemmTile& t) {
  for (const SmallMKernel& k : kKernels)
    if (k.kind == kind && k.tile == t) return &k;
  return nullptr;
}

}  // namespace

void run_small_m(const GemmParams& p, const GemmPlan& plan, cudaStream_t stream) {
  const SmallMKernel* k = find_kernel(plan.mainloop, plan.tile);
  LS_CHECK(k != nullptr, kSmallMOp, "internal: no kernel compiled for the plan ", plan.to_string());
  LS_CHECK(k->fn(p, stream), kSmallMOp, "the driver refused the tensor maps of ", plan.to_string(),
           " for operands the plan takes as TMA-compatible");
  const cudaError_t e = cudaGetLastError();
  LS_CHECK(e == cudaSuccess, kSmallMOp, "launch failed (", plan.to_string(),
           "): ", cudaGetErrorString(e));
}

int small_m_kernels_missing() {
  int missing = 0;
  for (GemmMainloop kind :
       {GemmMainloop::kSmallMRing, GemmMainloop::kSmallMTma, GemmMainloop::kSmallMWgmma})
    for (const GemmTile& t : gemm_small_m_tiles(kind)) missing += find_kernel(kind, t) ? 0 : 1;
  return missing + int(std::size(kKernels)) -
         int(gemm_small_m_tiles(GemmMainloop::kSmallMRing).size() +
             gemm_small_m_tiles(GemmMainloop::kSmallMTma).size() +
             gemm_small_m_tiles(GemmMainloop::kSmallMWgmma).size());
}

}  // namespace lockstep::cuda::detail
