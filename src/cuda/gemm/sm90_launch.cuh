// Host helpers that launch the Hopper kernel (mainloop_sm90.cuh): tensor maps, the persistent
// grid, the once-per-instantiation shared-memory attribute (every GEMM kernel's). Used by the GEMM
// launchers (launch.cu, small_m_launch.cuh) and by the fused log-prob producer
// (src/cuda/logprob.cu), which brings its own epilogue.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/elementwise_common.cuh"  // check_launch
#include "cuda/gemm/mainloop_sm90.cuh"
#include "cuda/tensor_map.h"
#include "lockstep/error.h"

namespace lockstep::cuda::detail {

// Lets `kernel` (a GEMM kernel instantiation) use `bytes` of dynamic shared memory: once per
// process and kernel (the current device's; one-GPU processes for now).
template <auto kernel>
void allow_dynamic_smem(const char* op, int bytes) {
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  LS_CHECK(attr == cudaSuccess, op, "cudaFuncSetAttribute failed: ", cudaGetErrorString(attr));
}

// A bf16 [rows, K] tensor map with row stride ld and 64-k boxes of box_rows rows (tensor_map.h).
static_assert(kSm90BK == 64, "tensor maps are encoded with 64-k boxes");
inline CUtensorMap sm90_tensor_map(const char* op, const uint16_t* p, int64_t rows, int64_t K,
                                   int64_t ld, int box_rows) {
  LS_CHECK(tensor_map_encoder() != nullptr, op,
           "cuTensorMapEncodeTiled is not available from the driver");
  CUtensorMap map;
  const CUresult r = encode_bf16_tensor_map(&map, p, rows, K, ld, box_rows);
  LS_CHECK(r == CUDA_SUCCESS, op, "cuTensorMapEncodeTiled failed (", int(r), ") for [", rows, ", ",
           K, "] with row stride ", ld);
  return map;
}

// Multiprocessors of the current device: the persistent grid's size (which CTA runs a job
// changes no bit; the planner's cost model assumes 132).
inline int sm90_sm_count() {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
    n = 132;
  return n;
}

// AT / BT: x / w MN-major (their tensor maps are [K, M] / [K, N] with 64 x 64 boxes). bmaps: the
// blocked mode's tail maps (mainloop_sm90.cuh), nothing for every other epilogue.
template <int BM, int BN, int NS, int LEVELS, typename Epi = Sm90StoreEpilogue, bool PP = false,
          bool AT = false, bool BT = false>
void launch_sm90_tile(const char* op, const CUtensorMap& tx, const CUtensorMap& tw,
                      const typename Epi::Params& p, cudaStream_t s,
                      const sm90_blocked_maps_t<Epi>& bmaps = {}) {
  constexpr int WGN = (BM == 64 && !PP) ? 2 : 1;
  constexpr int kSmem = sm90_smem_bytes<BM, BN, NS, LEVELS, sm90_y_slots<Epi>::value>();
  allow_dynamic_smem<gemm_sm90_kernel<BM, BN, WGN, NS, LEVELS, Epi, PP, AT, BT>>(op, kSmem);
  LS_CHECK(LEVELS == 0 || p.nseg <= (1 << LEVELS), op, "internal: ", p.nseg,
           " segments for an in-CTA tree of ", LEVELS, " levels");
  const int64_t jobs = ((p.M + BM - 1) / BM) * ((p.N + BN - 1) / BN) * (LEVELS > 0 ? 1 : p.nseg);
  // Persistent grid: one CTA per multiprocessor at most.
  const unsigned grid = unsigned(std::min<int64_t>(jobs, sm90_sm_count()));
  gemm_sm90_kernel<BM, BN, WGN, NS, LEVELS, Epi, PP, AT, BT>
      <<<grid, kSm90Threads, kSmem, s>>>(tx, tw, p, bmaps);
  check_launch(op);
}

}  // namespace lockstep::cuda::detail
