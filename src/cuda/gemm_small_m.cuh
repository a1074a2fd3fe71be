// Small-M (decode) GEMM path of lockstep::cuda::gemm_bf16_nt: same contract, same bits (§G);
// tiled so that M <= 64 still streams w at HBM speed over every SM.
#pragma once

#include <cuda_runtime.h>

#include "lockstep/ops/gemm.h"
#include "lockstep/tensor.h"

namespace lockstep::cuda::detail {

// Arguments already checked by the launcher (gemm_bf16_nt). Returns false when this path does not
// handle the case (the caller then uses the general kernel: same bits).
bool gemm_bf16_nt_small_m(const TensorView& x, const TensorView& w, const TensorView* bias,
                          const GemmConfig& cfg, const TensorView& y, cudaStream_t stream);

}  // namespace lockstep::cuda::detail
