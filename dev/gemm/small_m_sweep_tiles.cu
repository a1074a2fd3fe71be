// The sweep-only small-M tiles (sweep_tiles.h), instantiated from the shipped kernels' templates
// (src/cuda/gemm/small_m_launch.cuh). Why each is not shipped: docs/cuda-gemm.md "Small M".
#include <cuda_runtime.h>

#include <iterator>

#include "cuda/gemm/small_m_launch.cuh"
#include "dev/gemm/sweep_tiles.h"
#include "lockstep/ops/gemm.h"

namespace lockstep::dev {
namespace {

using cuda::detail::SmallMKernel;

const SmallMKernel kSweepKernels[] = {
    // cp.async ring alternatives (the M <= 64 BN 32 / 48 tiles with 2 warps along M measured
    // slower than the shipped 4-warp ones)
    LS_SMALL_M_RING(64, 32, 2, 2, 128, 7),
    LS_SMALL_M_RING(64, 48, 2, 3, 128, 6),
    LS_SMALL_M_RING(64, 64, 2, 4, 128, 5),
    LS_SMALL_M_RING(8, 32, 1, 2, 256, 6),
    LS_SMALL_M_RING(8, 64, 1, 8, 128, 6),
    LS_SMALL_M_RING(32, 64, 2, 4, 128, 4),
    LS_SMALL_M_RING(8, 16, 1, 1, 256, 4),
    LS_SMALL_M_RING(64, 32, 2, 1, 128, 7),
    // Warp-specialized TMA ring: the M <= 64 BN 32 / 48 / 64 tiles the wgmma ones replaced; one
    // consumer warp with two chains, finer / coarser stages, a 2-CTA-per-SM ring, more warps along
    // M, 2 warps x 8 chains.
    LS_SMALL_M_TMA(2, 4, 2, 1, 2, 8, 1),
    LS_SMALL_M_TMA(2, 4, 3, 1, 2, 7, 1),
    LS_SMALL_M_TMA(2, 4, 2, 2, 2, 6, 1),
    LS_SMALL_M_TMA(1, 1, 1, 2, 4, 9, 1),
    LS_SMALL_M_TMA(1, 1, 2, 1, 1, 32, 1),
    LS_SMALL_M_TMA(1, 1, 2, 1, 8, 4, 1),
    LS_SMALL_M_TMA(1, 2, 1, 2, 4, 8, 1),
    LS_SMALL_M_TMA(1, 1, 3, 2, 2, 4, 1),
    LS_SMALL_M_TMA(1, 2, 4, 3, 2, 4, 1),
    LS_SMALL_M_TMA(4, 2, 2, 1, 2, 8, 1),
    LS_SMALL_M_TMA(1, 8, 2, 1, 2, 8, 1),
    LS_SMALL_M_TMA(4, 2, 2, 2, 2, 6, 1),
    LS_SMALL_M_TMA(2, 4, 1, 2, 2, 8, 1),
    // ... in clusters of 2 CTAs along N sharing x (TMA multicast): the shipped M <= 32 / 64 tiles
    LS_SMALL_M_TMA(2, 2, 1, 1, 4, 8, 2),
    LS_SMALL_M_TMA(2, 2, 2, 1, 2, 12, 2),
    LS_SMALL_M_TMA(2, 2, 3, 1, 2, 10, 2),
    LS_SMALL_M_TMA(2, 2, 2, 2, 2, 8, 2),
    LS_SMALL_M_TMA(2, 2, 3, 2, 2, 6, 2),
    LS_SMALL_M_TMA(2, 2, 4, 3, 1, 7, 2),
    LS_SMALL_M_TMA(2, 4, 1, 1, 2, 10, 2),
    LS_SMALL_M_TMA(2, 4, 2, 1, 2, 8, 2),
    LS_SMALL_M_TMA(2, 4, 3, 1, 2, 7, 2),
    LS_SMALL_M_TMA(2, 4, 2, 2, 2, 6, 2),
    LS_SMALL_M_TMA(2, 4, 3, 2, 1, 10, 2),
    LS_SMALL_M_TMA(2, 4, 6, 2, 1, 6, 2),
    // cluster alternatives: M <= 16 in pairs, M <= 64 in fours, 2 warps x 8 chains in pairs
    LS_SMALL_M_TMA(1, 2, 2, 1, 4, 8, 2),
    LS_SMALL_M_TMA(2, 4, 2, 1, 2, 8, 4),
    LS_SMALL_M_TMA(2, 4, 1, 2, 2, 8, 2),
    // wgmma: BN 32 with 128-k stages (the shipped one has 256-k stages)
    LS_SMALL_M_WGMMA(32, 2, 8),
};

}  // namespace

int small_m_sweep_tile_count() { return int(std::size(kSweepKernels)); }

std::string small_m_sweep_tile_name(int i) {
  const SmallMKernel& k = kSweepKernels[i];
  return std::string(cuda::gemm_mainloop_name(k.kind)) + " " + k.tile.to_string();
}

bool small_m_sweep_tile_uses_tma(int i) {
  return kSweepKernels[i].kind != cuda::GemmMainloop::kSmallMRing;
}

bool run_small_m_sweep_tile(int i, const TensorView& x, const TensorView& w, const TensorView& y,
                            cudaStream_t stream) {
  const GemmKLayout kl = gemm_k_layout(GemmConfig{1}, x.shape[1]);
  cuda::detail::GemmParams p{};
  p.x = static_cast<const uint16_t*>(x.data);
  p.w = static_cast<const uint16_t*>(w.data);
  p.y = y.data;
  p.M = x.shape[0];
  p.N = w.shape[0];
  p.K = x.shape[1];
  p.ldx = x.stride[0];
  p.ldw = w.stride[0];
  p.ldy = y.stride[0];
  p.seg_len = kl.segment_len;
  p.segments = 1;
  p.y_f32 = y.dtype == DType::kF32 ? 1 : 0;
  auto vec = [](const TensorView& t) {
    return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
           (t.shape[0] <= 1 || t.stride[0] % 8 == 0);
  };
  p.x_vec = vec(x) ? 1 : 0;
  p.w_vec = vec(w) ? 1 : 0;
  return kSweepKernels[i].fn(p, stream) && cudaGetLastError() == cudaSuccess;
}

}  // namespace lockstep::dev
