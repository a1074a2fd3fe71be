// Sweep-only small-M tiles (dev/gemm/, built with -DLOCKSTEP_DEV_GEMM=ON): alternatives to the
// shipped tiles and thread-block clusters, kept for bench_gemm_small_m --sweep (the target
// dev_bench_gemm_small_m) to re-tune the tables of src/cuda/gemm/plan.cc. No plan chooses them;
// each computes the same bits as every shipped tile (test_gemm_small_m's chains and tree).
#pragma once

#include <string>

#include "lockstep/tensor.h"

typedef struct CUstream_st* cudaStream_t;

namespace lockstep::dev {

int small_m_sweep_tile_count();
std::string small_m_sweep_tile_name(int i);
// Whether tile i reads its operands through TMA (it then declines TMA-incompatible ones).
bool small_m_sweep_tile_uses_tma(int i);
// y = x · wᵀ with one segment (S = 1) through sweep tile i; false if the tile declined the
// operands (TMA-incompatible, or a cluster shape the GPU cannot place). Arguments unchecked.
bool run_small_m_sweep_tile(int i, const TensorView& x, const TensorView& w, const TensorView& y,
                            cudaStream_t stream);

}  // namespace lockstep::dev
